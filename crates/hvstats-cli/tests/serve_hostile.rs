//! `hvstats serve` against peers that try to turn it against others: a signal that would end it
//! without its cleanup, a flood of wrong passwords in front of a new scraper, clients that
//! reconnect as fast as the connection cap evicts them, and an observer killed and cleaned away
//! before the exporter restarts. Each test runs the real binary over real sockets.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;
use common::{KilledOnDrop, Running, TempDir, hold_a_vm, kvm_available, publish_partition};

fn entries(dir: &Path) -> Vec<String> {
    match std::fs::read_dir(dir) {
        Ok(d) => d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn sighup_sigterm_and_sigint_end_serve_and_serve_observe_all_with_0_and_remove_what_they_made() {
    if !kvm_available(
        "sighup_sigterm_and_sigint_end_serve_and_serve_observe_all_with_0_and_remove_what_they_made",
    ) {
        return;
    }
    // This test's process holds a VM: `--observe-all --vm <it>` attaches it and claims it.
    let _vm = hold_a_vm();
    let me = std::process::id().to_string();
    for (signal, name) in [(libc::SIGHUP, "SIGHUP"), (libc::SIGTERM, "SIGTERM"), (libc::SIGINT, "SIGINT")] {
        let tmp = TempDir::new("serve-signals");
        let socket = tmp.path().join("serve.sock");
        let mut serve = Running::start(&["serve"], tmp.path());
        serve.wait_line("serving unix:");
        assert!(socket.exists());
        let status = serve.end_with(signal);
        assert_eq!(status.code(), Some(0), "serve, {name}: {status}");
        assert!(!socket.exists(), "serve, {name}: the socket is left behind");
        serve.wait_line(&format!("{name}: stopping"));

        let mut serve =
            Running::start(&["serve", "--observe-all", "--observe-interval", "0.1", "--vm", &me], tmp.path());
        serve.wait_line(&format!("attach pid {me}"));
        assert!(socket.exists());
        assert!(!entries(&tmp.path().join("instances")).is_empty());
        assert!(!entries(&tmp.path().join("observed")).is_empty(), "no claim made");
        let status = serve.end_with(signal);
        assert_eq!(status.code(), Some(0), "serve --observe-all, {name}: {status}");
        assert!(!socket.exists(), "serve --observe-all, {name}: the socket is left behind");
        assert_eq!(
            entries(&tmp.path().join("instances")),
            Vec::<String>::new(),
            "{name}: instance files left"
        );
        assert_eq!(entries(&tmp.path().join("observed")), Vec::<String>::new(), "{name}: a claim is left");
    }
}

/// Starts `hvstats serve` on a free loopback port; returns it and its address.
fn serve(dir: &Path, extra: &[&str]) -> (KilledOnDrop, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["serve", "--listen", "127.0.0.1:0", "--runtime-dir"])
        .arg(dir)
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let read =
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line);
    let child = KilledOnDrop(child);
    read.unwrap();
    let addr = line.trim().strip_prefix("serving ").and_then(|s| s.split_once("://")).map(|(_, s)| s);
    let addr = addr.and_then(|s| s.strip_suffix("/metrics")).unwrap_or_else(|| panic!("{line:?}"));
    (child, addr.parse().unwrap())
}

/// A TCP connection to `addr` from the loopback address `source` (all of 127.0.0.0/8 is this
/// host: clients on other addresses are other sources to the server). The local port is chosen
/// at `connect`, as for a client that binds nothing: one of thousands of connections a minute
/// shares its port with connections to other addresses, and takes over one of its own that
/// waits out TIME_WAIT, instead of running out of ports.
fn connect_from(source: [u8; 4], addr: SocketAddr) -> std::io::Result<TcpStream> {
    use rustix::net::{AddressFamily, SocketType};
    use std::os::fd::AsRawFd;
    let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None)?;
    let on: libc::c_int = 1;
    // SAFETY: `fd` is an open socket; the option's value is a c_int of the size given.
    let set = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&raw const on).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if set != 0 {
        return Err(std::io::Error::last_os_error());
    }
    rustix::net::bind(&fd, &std::net::SocketAddrV4::new(source.into(), 0))?;
    rustix::net::connect(&fd, &addr)?;
    Ok(TcpStream::from(fd))
}

fn basic(user: &str, password: &str) -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
}

/// `GET /metrics` with `authorization` from `source`, read until the server closes, waiting at
/// most `timeout` for each read (a scraper's timeout): the reply, or why there is none. `sent`
/// counts the requests sent.
fn get_metrics(
    source: [u8; 4],
    addr: SocketAddr,
    authorization: &str,
    timeout: Duration,
    sent: &AtomicU64,
) -> Result<String, String> {
    let mut stream = connect_from(source, addr).map_err(|e| format!("connect: {e}"))?;
    stream.set_read_timeout(Some(timeout)).unwrap();
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\nAuthorization: {authorization}\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    sent.fetch_add(1, Ordering::Relaxed);
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).map_err(|e| format!("read: {e}"))?;
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

#[test]
fn wrong_passwords_on_63_connections_do_not_keep_new_scrapers_out() {
    let tmp = TempDir::new("serve-bcrypt-flood");
    let (_hv, part) = publish_partition(tmp.path(), 1);
    part.vp_page(0).unwrap().set(hvstats_abi::catalog::vp::HYPERCALLS, 7);
    // Three scrapers, each with credentials the exporter has never seen, at bcrypt cost 10.
    let scrapers: Vec<(String, String)> =
        (0..3).map(|i| (format!("scraper{i}"), format!("pw-{i}"))).collect();
    let mut config = String::from("basic_auth_users:\n");
    for (user, password) in &scrapers {
        config.push_str(&format!("  {user}: {}\n", bcrypt::hash(password, 10).unwrap()));
    }
    let web = tmp.path().join("web.yml");
    std::fs::write(&web, config).unwrap();
    let (_server, addr) = serve(tmp.path(), &["--web.config.file", web.to_str().unwrap()]);

    // 63 connections at a time from 127.0.0.2, each asking with a wrong password of its own and
    // asking again as soon as it is answered (after a pause when refused without a check).
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, unauthorized, busy) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let attackers: Vec<_> = (0..63)
        .map(|n| {
            let (stop, sent, unauthorized, busy) =
                (Arc::clone(&stop), Arc::clone(&sent), Arc::clone(&unauthorized), Arc::clone(&busy));
            std::thread::spawn(move || {
                for round in 0..10_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let wrong = basic("scraper0", &format!("wrong-{n}-{round}"));
                    match get_metrics([127, 0, 0, 2], addr, &wrong, Duration::from_secs(30), &sent) {
                        Ok(r) if r.starts_with("HTTP/1.0 401") => {
                            unauthorized.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(r) if r.starts_with("HTTP/1.0 429") => {
                            busy.fetch_add(1, Ordering::Relaxed);
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        // Anything else (a timeout, a close) is the attacker's own loss.
                        _ => std::thread::sleep(Duration::from_millis(50)),
                    }
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while sent.load(Ordering::Relaxed) < 63 {
        assert!(Instant::now() < deadline, "the attackers did not get going");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Each new scraper, from 127.0.0.1, with Prometheus's default scrape timeout.
    let results: Vec<Result<String, String>> = scrapers
        .iter()
        .map(|(user, password)| {
            get_metrics(
                [127, 0, 0, 1],
                addr,
                &basic(user, password),
                Duration::from_secs(10),
                &AtomicU64::new(0),
            )
        })
        .collect();
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        a.join().unwrap();
    }
    let ok = results.iter().filter(|r| r.as_ref().is_ok_and(|r| r.starts_with("HTTP/1.0 200"))).count();
    eprintln!(
        "new scrapers admitted: {ok} of {}; attack: {} requests, {} refused after a check (401), {} refused at once (429)",
        results.len(),
        sent.load(Ordering::Relaxed),
        unauthorized.load(Ordering::Relaxed),
        busy.load(Ordering::Relaxed),
    );
    for (r, (user, _)) in results.iter().zip(&scrapers) {
        let r = r.as_ref().unwrap_or_else(|e| panic!("{user}: no reply within its timeout: {e}"));
        assert!(r.starts_with("HTTP/1.0 200") && r.contains("hvstats_vp_hypercalls_total{"), "{user}: {r}");
    }
    // The attack was refused, not admitted: its comparisons ran and said no.
    assert!(unauthorized.load(Ordering::Relaxed) > 0);
}

/// Whether `hvstats serve` starts with the web configuration `config`: `Ok(())`, or its error.
fn serve_accepts(dir: &Path, config: &Path) -> Result<(), String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["serve", "--listen", "127.0.0.1:0", "--runtime-dir"])
        .arg(dir)
        .arg("--web.config.file")
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let _ =
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut first);
    if first.starts_with("serving ") {
        let _ = KilledOnDrop(child);
        return Ok(());
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{first}");
    Err(String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_web_configuration_promtool_refuses_is_refused_and_rate_limit_with_it() {
    let test = "a_web_configuration_promtool_refuses_is_refused_and_rate_limit_with_it";
    let Some(promtool) = common::prometheus_tool("promtool", test) else { return };
    let tmp = TempDir::new("serve-web-promtool");
    let (cert, key) = hvstats_testkit::self_signed_localhost();
    std::fs::write(tmp.path().join("cert.pem"), &cert).unwrap();
    std::fs::write(tmp.path().join("key.pem"), &key).unwrap();
    let other = rcgen::KeyPair::generate().unwrap();
    std::fs::write(tmp.path().join("other-key.pem"), other.serialize_pem()).unwrap();
    let indented = |pem: &str| pem.lines().map(|l| format!("    {l}\n")).collect::<String>();
    let hash = bcrypt::hash("s3cret", 4).unwrap();
    let files = "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n";
    let refused = [
        // A limit of every client's requests at once (one client would use up everyone's).
        ("rate_limit", "rate_limit:\n  interval: 1s\n  burst: 5\n".to_owned(), "rate_limit"),
        ("rate_limit off", "rate_limit:\n  interval: 0s\n".to_owned(), "rate_limit"),
        ("empty rate_limit", "rate_limit: {}\n".to_owned(), "rate_limit"),
        // Certificates and keys inline, which this promtool's toolkit does not know.
        (
            "inline certificate and key",
            format!("tls_server_config:\n  cert: |\n{}  key: |\n{}", indented(&cert), indented(&key)),
            "use cert_file",
        ),
        (
            "inline key",
            format!("tls_server_config:\n  cert_file: cert.pem\n  key: |\n{}", indented(&key)),
            "use key_file",
        ),
        (
            "inline client CA",
            format!(
                "{files}  client_auth_type: RequireAndVerifyClientCert\n  client_ca: |\n{}",
                indented(&cert)
            ),
            "use client_ca_file",
        ),
        ("client_allowed_sans", format!("{files}  client_allowed_sans: [a]\n"), "client_allowed_sans"),
        (
            "a key that is not the certificate's",
            "tls_server_config:\n  cert_file: cert.pem\n  key_file: other-key.pem\n".to_owned(),
            "X509KeyPair",
        ),
        (
            "a missing file",
            "tls_server_config:\n  cert_file: nowhere.pem\n  key_file: key.pem\n".to_owned(),
            "nowhere.pem",
        ),
        ("no certificate", "tls_server_config:\n  key_file: key.pem\n".to_owned(), "cert_file"),
        ("an unknown client_auth_type", format!("{files}  client_auth_type: Bogus\n"), "Bogus"),
        ("an unknown TLS version", format!("{files}  min_version: TLS14\n"), "TLS14"),
        ("an unknown curve", format!("{files}  curve_preferences: [Foo]\n"), "Foo"),
        ("an unknown cipher suite", format!("{files}  cipher_suites: [Foo]\n"), "Foo"),
        (
            "a client CA without a policy",
            format!("{files}  client_ca_file: cert.pem\n"),
            "Client Auth Policy",
        ),
        (
            "a header that cannot be set",
            "http_server_config:\n  headers:\n    X-Foo: bar\n".to_owned(),
            "X-Foo",
        ),
        (
            "a header value not allowed",
            "http_server_config:\n  headers:\n    X-Frame-Options: DENY\n".to_owned(),
            "X-Frame-Options",
        ),
        (
            "a password that is not a bcrypt hash",
            "basic_auth_users:\n  alice: plaintext\n".to_owned(),
            "bcrypt",
        ),
        ("a user given twice", format!("basic_auth_users:\n  a: {hash}\n  a: {hash}\n"), "duplicate"),
        ("not a map", "- a\n".to_owned(), "web configuration"),
    ];
    let config = tmp.path().join("web.yml");
    for (what, yaml, said) in &refused {
        std::fs::write(&config, yaml).unwrap();
        let checked = Command::new(promtool).args(["check", "web-config"]).arg(&config).output().unwrap();
        assert!(!checked.status.success(), "{what}: promtool accepts it, so this case proves nothing");
        let err = serve_accepts(tmp.path(), &config).expect_err(what);
        assert!(err.contains(said), "{what}: {err}");
    }
    // What promtool accepts, hvstats serves.
    let accepted = format!(
        "{files}  min_version: TLS12\nhttp_server_config:\n  http2: false\n  headers:\n    \
         X-Content-Type-Options: nosniff\nbasic_auth_users:\n  prometheus: {hash}\n"
    );
    std::fs::write(&config, accepted).unwrap();
    let checked = Command::new(promtool).args(["check", "web-config"]).arg(&config).output().unwrap();
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stderr));
    serve_accepts(tmp.path(), &config).unwrap();
}

/// A scraper's connection across a network: each write (a TLS flight, a part of a request)
/// leaves 100 ms after the one before.
struct Distant(TcpStream);

impl Read for Distant {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Distant {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::thread::sleep(Duration::from_millis(100));
        self.0.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// `GET path` on a new connection from 127.0.0.1 with the latency of a network ([`Distant`]),
/// over TLS trusting `cert_pem` when given: the whole reply, or why there is none within
/// Prometheus's default scrape timeout (10 s).
fn scrape(addr: SocketAddr, path: &str, cert_pem: Option<&str>) -> Result<String, String> {
    let tcp = connect_from([127, 0, 0, 1], addr).map_err(|e| format!("connect: {e}"))?;
    let dbg_port = tcp.local_addr().unwrap().port();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let tcp = Distant(tcp);
    let request = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n");
    let mut reply = Vec::new();
    let read = match cert_pem {
        None => {
            let mut tcp = tcp;
            // The request line, then the headers.
            let (line, headers) = request.split_at(request.find('\n').unwrap() + 1);
            for part in [line, headers] {
                tcp.write_all(part.as_bytes()).map_err(|e| format!("write: {e}"))?;
            }
            tcp.read_to_end(&mut reply).map(|_| ())
        }
        Some(cert_pem) => {
            let mut tls = hvstats_testkit::tls_client(cert_pem, tcp);
            tls.write_all(request.as_bytes()).map_err(|e| format!("TLS: {e}"))?;
            match tls.read_to_end(&mut reply) {
                // A close without TLS's own goodbye, after the whole reply.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !reply.is_empty() => Ok(()),
                other => other.map(|_| ()),
            }
        }
    };
    read.map_err(|e| format!("read: {e} after {} bytes (port {dbg_port})", reply.len()))?;
    let reply = String::from_utf8_lossy(&reply).into_owned();
    match reply.starts_with("HTTP/1.0 200") {
        true => Ok(reply),
        false => Err(reply.chars().take(200).collect()),
    }
}

/// `attackers` clients from `source`, each doing `attack` on a new connection again and again
/// (at most 2,000 times) until `stop`; returns their threads and the number of connections made.
fn attack(
    attackers: usize,
    source: [u8; 4],
    addr: SocketAddr,
    stop: &Arc<AtomicBool>,
    attack: impl Fn(usize, TcpStream) + Send + Sync + 'static,
) -> (Vec<std::thread::JoinHandle<()>>, Arc<AtomicU64>) {
    let attack = Arc::new(attack);
    let made = Arc::new(AtomicU64::new(0));
    let threads = (0..attackers)
        .map(|n| {
            let (stop, made, attack) = (Arc::clone(stop), Arc::clone(&made), Arc::clone(&attack));
            std::thread::Builder::new()
                .stack_size(64 << 10)
                .spawn(move || {
                    for _ in 0..2_000 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        match connect_from(source, addr) {
                            Ok(s) => {
                                made.fetch_add(1, Ordering::Relaxed);
                                attack(n, s);
                            }
                            Err(_) => std::thread::sleep(Duration::from_millis(20)),
                        }
                    }
                })
                .unwrap()
        })
        .collect();
    (threads, made)
}

/// Holds `s` until the server closes it (or 10 s pass).
fn hold_until_closed(mut s: TcpStream) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 4096];
    while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
}

/// Runs `scrapes` scrapes of each path in turn while an attack runs; the failures.
fn scrapes_during(
    addr: SocketAddr,
    made: &AtomicU64,
    paths: &[&str],
    scrapes: usize,
    cert: Option<&str>,
) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while made.load(Ordering::Relaxed) < 400 {
        assert!(Instant::now() < deadline, "the attackers did not get going");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut failed = Vec::new();
    for n in 0..scrapes {
        for path in paths {
            if let Err(e) = scrape(addr, path, cert) {
                failed.push(format!("scrape {n} of {path}: {e}"));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    failed
}

/// Attackers from `source` hold the connection cap (64) and reconnect as soon as they are
/// closed, while a scraper from 127.0.0.1, 100 ms away, scrapes on fresh connections: over TLS
/// against clients that send nothing or half a ClientHello, and over plain HTTP against clients
/// churning connections. The failed scrapes over TLS and plain HTTP, and the attacking
/// connections made in each.
fn churn_against_a_scraper(source: [u8; 4], tag: &str) -> (Vec<String>, u64, Vec<String>, u64) {
    // One attack of 200 clients at a time: two would be an attack twice the size on this host.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let tmp = TempDir::new(tag);
    let (_hv, part) = publish_partition(tmp.path(), 1);
    part.vp_page(0).unwrap().set(hvstats_abi::catalog::vp::HYPERCALLS, 7);

    // TLS: 200 clients that send nothing or half a ClientHello and reconnect once closed.
    let (cert, key) = hvstats_testkit::self_signed_localhost();
    std::fs::write(tmp.path().join("cert.pem"), &cert).unwrap();
    std::fs::write(tmp.path().join("key.pem"), key).unwrap();
    let web = tmp.path().join("web.yml");
    std::fs::write(&web, "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n").unwrap();
    let (_server, addr) = serve(tmp.path(), &["--web.config.file", web.to_str().unwrap()]);
    let stop = Arc::new(AtomicBool::new(false));
    let (attackers, made) = attack(200, source, addr, &stop, |n, mut s| {
        if n % 2 == 0 {
            // A handshake record announcing 512 bytes, of which 6 come.
            let _ = s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03]);
        }
        hold_until_closed(s);
    });
    let tls_failed = scrapes_during(addr, &made, &["/metrics"], 20, Some(&cert));
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        a.join().unwrap();
    }
    let tls_attack = made.load(Ordering::Relaxed);
    drop(_server);

    // Plain HTTP: 200 clients churning, each connecting, sending part of a head or nothing,
    // and closing after a moment, again and again.
    let (_server, addr) = serve(tmp.path(), &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let (attackers, made) = attack(200, source, addr, &stop, |n, mut s| {
        if n % 2 == 0 {
            let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n");
        }
        std::thread::sleep(Duration::from_millis(5 + (n as u64 % 20)));
        drop(s);
    });
    let plain_failed = scrapes_during(addr, &made, &["/healthz", "/metrics"], 20, None);
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        a.join().unwrap();
    }
    let plain_attack = made.load(Ordering::Relaxed);
    eprintln!(
        "attackers from {source:?}: TLS: {} of 20 scrapes failed during {tls_attack} attacking connections; \
         plain: {} of 40 failed during {plain_attack} churning connections",
        tls_failed.len(),
        plain_failed.len(),
    );
    (tls_failed, tls_attack, plain_failed, plain_attack)
}

#[test]
fn clients_that_reconnect_as_fast_as_the_cap_closes_them_push_no_scraper_out() {
    let (tls_failed, _, plain_failed, _) = churn_against_a_scraper([127, 0, 0, 2], "serve-cap-churn");
    assert_eq!(tls_failed, Vec::<String>::new(), "TLS scrapes pushed out");
    assert_eq!(plain_failed, Vec::<String>::new(), "plain scrapes pushed out");
}

/// As above, with the attackers on the scraper's own address (127.0.0.1): no address tells them
/// apart, only what each connection holds and has done.
#[test]
fn clients_on_the_scrapers_own_address_that_reconnect_as_fast_as_the_cap_closes_them_push_no_scraper_out() {
    let (tls_failed, _, plain_failed, _) = churn_against_a_scraper([127, 0, 0, 1], "serve-cap-churn-same");
    assert_eq!(tls_failed, Vec::<String>::new(), "TLS scrapes pushed out");
    assert_eq!(plain_failed, Vec::<String>::new(), "plain scrapes pushed out");
}

/// A client that sends half a request head, then one more byte every 200 ms and never the end
/// of it, is closed by the deadline on a new connection's first head (3 s, however it drips),
/// with no reply; a full request on another connection meanwhile is answered.
#[test]
fn a_connection_dripping_half_a_request_head_is_closed_by_the_head_deadline_while_another_is_answered() {
    let tmp = TempDir::new("serve-head-deadline");
    let (_hv, part) = publish_partition(tmp.path(), 1);
    part.vp_page(0).unwrap().set(hvstats_abi::catalog::vp::HYPERCALLS, 7);
    let (_server, addr) = serve(tmp.path(), &[]);
    let mut half = TcpStream::connect(addr).unwrap();
    half.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nX-Drip: ").unwrap();
    // Another connection meanwhile: answered in full.
    let full = scrape(addr, "/metrics", None).unwrap();
    assert!(full.contains("hvstats_vp_hypercalls_total"), "{full}");
    // The half head drips until the server closes the connection, for 30 s at most.
    half.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let (mut reply, mut buf, mut dripped) = (Vec::new(), [0u8; 4096], 0u64);
    let deadline = Instant::now() + Duration::from_secs(30);
    let closed = loop {
        assert!(Instant::now() < deadline, "still open after 30 s and {dripped} bytes dripped");
        match half.read(&mut buf) {
            Ok(0) => break "end of stream".to_owned(),
            Ok(n) => reply.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => break format!("read: {e}"),
        }
        match half.write_all(b"a") {
            Ok(()) => dripped += 1,
            Err(e) => break format!("write: {e}"),
        }
    };
    eprintln!("half a head, then {dripped} bytes dripped: closed ({closed})");
    assert!(
        closed == "end of stream" || closed.contains("reset") || closed.contains("Broken pipe"),
        "{closed}"
    );
    assert_eq!(String::from_utf8_lossy(&reply), "", "no reply to half a head");
    // The server goes on: a new connection is answered.
    assert!(scrape(addr, "/healthz", None).is_ok());
}

/// The value of the sample of `name` without labels (`name 0`, or `name{} 0` as the encoder
/// writes it; Prometheus reads both alike).
fn unlabelled(text: &str, name: &str) -> Option<String> {
    common::sample(text, name).or_else(|| common::sample(text, &format!("{name}{{}}")))
}

/// The instance name an observer's log line "publishing observed VMs as instance NAME" gives.
fn published_as(observer: &Running) -> String {
    let line = observer.wait_line("publishing observed VMs as instance ");
    line.split("as instance ").nth(1).unwrap().split(' ').next().unwrap().to_owned()
}

#[test]
fn an_observer_killed_and_cleaned_away_is_still_reported_down_by_a_restarted_exporter() {
    let tmp = TempDir::new("serve-observer-gone");
    // An observer waiting for a QEMU on a socket that has none: up, observing nothing (the
    // socket file is there, its listener gone; a path with nothing there fails at once).
    let nowhere = tmp.path().join("nobody.sock");
    drop(std::os::unix::net::UnixListener::bind(&nowhere).unwrap());
    let observer =
        || Running::start(&["observe", "--qmp", nowhere.to_str().unwrap(), "--interval", "0.1"], tmp.path());
    let up = |name: &str| format!("hvstats_observer_up{{publisher=\"{name}\"}}");
    let mut first = observer();
    let name = published_as(&first);
    let serve = Running::start(&["serve", "--listen", "127.0.0.1:0"], tmp.path());
    serve.metrics_until(Duration::from_secs(20), |m| common::sample(m, &up(&name)).as_deref() == Some("1"));
    // Killed outright; an admin's snapshot cleans its dead instance away; the exporter restarts.
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let snapshot = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["snapshot", "--runtime-dir"])
        .arg(tmp.path())
        .stdout(Stdio::null())
        .status()
        .unwrap();
    // 0, or 4 once the dead instance was the only one: nothing publishes there any more.
    assert!(matches!(snapshot.code(), Some(0 | 4)), "{snapshot}");
    let left = entries(&tmp.path().join("instances"));
    assert!(!left.iter().any(|f| f.starts_with(&name)), "the dead instance was not cleaned: {left:?}");
    drop(serve);
    let serve = Running::start(&["serve", "--listen", "127.0.0.1:0"], tmp.path());
    let m = serve.get("/metrics");
    assert_eq!(common::sample(&m, &up(&name)).as_deref(), Some("0"), "{m}");
    // Another observer publishes: it alone is reported, up.
    let mut second = observer();
    let name2 = published_as(&second);
    let m = serve
        .metrics_until(Duration::from_secs(20), |m| common::sample(m, &up(&name2)).as_deref() == Some("1"));
    assert_eq!(common::sample(&m, &up(&name)), None, "{m}");
    // Stopped cleanly, it takes its mark away: an exporter not told to expect an observer
    // reports none; one told to (as the packaged service is) reports one down.
    assert_eq!(second.terminate().code(), Some(0));
    drop(serve);
    let serve = Running::start(&["serve", "--listen", "127.0.0.1:0"], tmp.path());
    let m = serve.get("/metrics");
    assert!(!m.contains("hvstats_observer_up"), "{m}");
    drop(serve);
    let serve = Running::start(&["serve", "--listen", "127.0.0.1:0", "--expect-observer"], tmp.path());
    let m = serve.get("/metrics");
    assert_eq!(unlabelled(&m, "hvstats_observer_up").as_deref(), Some("0"), "{m}");
    // A mark planted by another user is not believed, and counted a read error; the observer
    // is still expected.
    std::fs::write(tmp.path().join("observer"), "1-2-3\n").unwrap();
    std::os::unix::fs::chown(tmp.path().join("observer"), Some(65534), Some(65534)).unwrap();
    let m = serve.get("/metrics");
    assert_eq!(common::sample(&m, &up("1-2-3")), None, "{m}");
    assert_eq!(unlabelled(&m, "hvstats_observer_up").as_deref(), Some("0"), "{m}");
    assert_eq!(common::sample(&m, "hvstats_read_errors").as_deref(), Some("1"), "{m}");
}
