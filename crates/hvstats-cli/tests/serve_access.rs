//! Who may read what `hvstats serve` exports: by default a Unix socket only the runtime
//! directory's owner (or a named group) may connect to; on TCP, the exporter toolkit's web
//! configuration (TLS, bcrypt basic authentication), checked by a real TLS client.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use common::{KilledOnDrop, TempDir, publish_partition};

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Starts `hvstats serve` with `args`; returns it and what its first line says it serves.
fn serve(runtime: &Path, args: &[&str]) -> (KilledOnDrop, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["serve", "--runtime-dir"])
        .arg(runtime)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let serving = line.trim().strip_prefix("serving ").unwrap_or_else(|| panic!("{line:?}")).to_owned();
    (KilledOnDrop(child), serving)
}

fn root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Whether a process running as uid and gid 65534 (nobody) can connect to the Unix socket
/// `path`: `Ok(())`, or the errno of its `connect`.
fn nobody_connects(path: &Path) -> Result<(), i32> {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: an all-zero sockaddr_un is a valid (empty) address, filled in below.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(c.as_bytes_with_nul()) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: the child only calls async-signal-safe functions (setgroups, setgid, setuid,
    // socket, connect, _exit) on memory prepared before the fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: see above; the child never returns.
        unsafe {
            let errno = || *libc::__errno_location();
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(65534) != 0
                || libc::setuid(65534) != 0
            {
                libc::_exit(100);
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            let rc = libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), len);
            libc::_exit(if rc == 0 { 0 } else { errno() });
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status));
    match libc::WEXITSTATUS(status) {
        0 => Ok(()),
        e => Err(e),
    }
}

/// `GET target` over the Unix socket `path`.
fn get_unix(path: &Path, target: &str) -> String {
    let mut stream = std::os::unix::net::UnixStream::connect(path).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(stream, "GET {target} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
}

#[test]
fn by_default_serve_listens_on_a_socket_only_the_owner_or_a_named_group_may_connect_to() {
    let tmp = TempDir::new("serve-unix");
    let (_hv, part) = publish_partition(tmp.path(), 1);
    part.vp_page(0).unwrap().set(hvstats_abi::catalog::vp::HYPERCALLS, 7);
    let (server, serving) = serve(tmp.path(), &[]);
    let socket = tmp.path().join("serve.sock");
    assert_eq!(serving, format!("unix:{} /metrics", socket.display()));
    let meta = std::fs::symlink_metadata(&socket).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "the socket is not its owner's alone");
    let reply = get_unix(&socket, "/metrics");
    assert!(reply.starts_with("HTTP/1.0 200"), "{reply}");
    assert!(reply.contains("hvstats_vp_hypercalls_total{"), "{reply}");
    // The snapshot API is off unless asked for, and says how to turn it on.
    let reply = get_unix(&socket, "/api/v1/snapshot");
    assert!(reply.starts_with("HTTP/1.0 404") && reply.contains("--snapshot-api"), "{reply}");
    if !root() {
        println!("skipped the other users' part: needs root");
        return;
    }
    assert_eq!(nobody_connects(&socket), Err(libc::EACCES), "nobody connected to the owner's socket");
    let mut server = server;
    assert!(Command::new("kill").arg("-TERM").arg(server.0.id().to_string()).status().unwrap().success());
    assert!(server.0.wait().unwrap().success());
    assert!(!socket.exists(), "the socket outlived serve");
    // A named group's members may connect; the socket is 0660 and theirs.
    let (_server, _) = serve(tmp.path(), &["--socket-group", "65534"]);
    let meta = std::fs::symlink_metadata(&socket).unwrap();
    assert_eq!((meta.permissions().mode() & 0o777, meta.gid()), (0o660, 65534));
    assert_eq!(nobody_connects(&socket), Ok(()));
}

/// `GET /metrics` over TLS to `addr`, trusting `cert_pem`, with `authorization` if given: the
/// whole reply, or the TLS error.
fn get_tls(addr: &str, cert_pem: &str, authorization: Option<&str>) -> Result<String, std::io::Error> {
    let tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut tls = hvstats_testkit::tls_client(cert_pem, tcp);
    let auth = authorization.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
    write!(tls, "GET /metrics HTTP/1.0\r\nHost: localhost\r\n{auth}\r\n")?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match tls.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
            // A close without TLS's own goodbye, after the whole reply.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !reply.is_empty() => break,
            Err(e) => return Err(e),
        }
    }
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

#[test]
fn on_tcp_the_web_configuration_file_asks_for_tls_and_bcrypt_basic_authentication() {
    use base64::Engine;
    let tmp = TempDir::new("serve-web-config");
    let (_hv, part) = publish_partition(tmp.path(), 1);
    part.vp_page(0).unwrap().set(hvstats_abi::catalog::vp::HYPERCALLS, 7);
    let (cert, key) = hvstats_testkit::self_signed_localhost();
    std::fs::write(tmp.path().join("cert.pem"), &cert).unwrap();
    std::fs::write(tmp.path().join("key.pem"), &key).unwrap();
    let hash = bcrypt::hash("s3cret", 4).unwrap();
    // The toolkit's schema, files relative to the configuration's directory.
    let config = tmp.path().join("web.yml");
    std::fs::write(
        &config,
        format!(
            "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n  min_version: TLS12\n\
             http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n\
             basic_auth_users:\n  prometheus: {hash}\n"
        ),
    )
    .unwrap();
    if Path::new("/usr/bin/promtool").exists() {
        let out =
            Command::new("/usr/bin/promtool").args(["check", "web-config"]).arg(&config).output().unwrap();
        assert!(out.status.success(), "promtool refuses the file: {}", String::from_utf8_lossy(&out.stderr));
    }
    let (_server, serving) =
        serve(tmp.path(), &["--listen", "127.0.0.1:0", "--web.config.file", config.to_str().unwrap()]);
    let addr = serving.strip_prefix("https://").and_then(|s| s.strip_suffix("/metrics")).unwrap().to_owned();
    let basic = |user: &str, password: &str| {
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
    };
    let refused = get_tls(&addr, &cert, None).unwrap();
    assert!(refused.starts_with("HTTP/1.0 401") && refused.contains("www-authenticate: Basic"), "{refused}");
    assert!(!refused.contains("hvstats_vp"), "{refused}");
    for wrong in [basic("prometheus", "guess"), basic("root", "s3cret"), "Bearer s3cret".to_owned()] {
        let reply = get_tls(&addr, &cert, Some(&wrong)).unwrap();
        assert!(reply.starts_with("HTTP/1.0 401"), "{wrong}: {reply}");
    }
    let reply = get_tls(&addr, &cert, Some(&basic("prometheus", "s3cret"))).unwrap();
    assert!(reply.starts_with("HTTP/1.0 200"), "{reply}");
    assert!(reply.contains("x-content-type-options: nosniff"), "{reply}");
    assert!(reply.contains("hvstats_vp_hypercalls_total{"), "{reply}");
    // Plain HTTP to the TLS port gets no answer.
    let plain = common::http_get_raw(&addr);
    assert!(!plain.contains("hvstats_vp"), "{plain}");

    // What the toolkit would do and hvstats cannot is refused at start, never ignored.
    for (yaml, said) in [
        ("tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n  min_version: TLS10\n", "TLS10"),
        (
            "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n  client_auth_type: RequireAnyClientCert\n",
            "RequireAnyClientCert",
        ),
        ("basic_auth_users:\n  alice: plaintext\n", "not a bcrypt hash"),
        ("unknown_field: 1\n", "unknown field"),
    ] {
        std::fs::write(&config, yaml).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
            .args(["serve", "--listen", "127.0.0.1:0", "--runtime-dir"])
            .arg(tmp.path())
            .arg("--web.config.file")
            .arg(&config)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{yaml}: {err}");
        assert!(err.contains(said), "{yaml}: {err}");
    }
}

/// `--listen :PORT` (node_exporter's form) and `--listen [::]:PORT` are every address: IPv4 and
/// IPv6 loopback both get the metrics; a bad port is a usage error that names the forms.
#[test]
fn a_listen_address_of_just_a_port_is_every_address_ipv4_included() {
    let tmp = TempDir::new("serve-any");
    for listen in [":0", "[::]:0"] {
        let (_serve, shown) = serve(tmp.path(), &["--listen", listen]);
        let port: u16 = shown.rsplit(':').next().unwrap().split('/').next().unwrap().parse().unwrap();
        for addr in [format!("127.0.0.1:{port}"), format!("[::1]:{port}")] {
            let reply = common::http_get(addr.parse().unwrap(), "/metrics");
            assert!(
                reply.starts_with("HTTP/1.0 200") && reply.contains("hvstats_build_info"),
                "{listen} {addr}: {reply}"
            );
        }
    }
    let out =
        Command::new(env!("CARGO_BIN_EXE_hvstats")).args(["serve", "--listen", ":99999"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains(":PORT for every address"));
}
