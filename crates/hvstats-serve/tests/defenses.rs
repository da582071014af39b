//! The server's defenses, tested as a library: a [`Server`] on a loopback port in this process,
//! exporting an instance this process publishes, against real TCP clients — a head that never
//! ends, heads and declared bodies over the limits, more connections than the cap, wrong
//! credentials, gzip by `Accept-Encoding`, TLS with a generated certificate.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use hvstats_present::collectors::Selection;
use hvstats_present::exposition::DEFAULT_MAX_VPS;
use hvstats_present::live::Live;
use hvstats_serve::{Config, Exporter, Limits, Listener, Server, Stop, Web};
use hvstats_testkit::TempDir;

/// The bound on every wait of these tests: generous, never a measure of speed.
const PATIENCE: Duration = Duration::from_secs(30);

/// A server running on its own thread, over an instance of one partition of two VPs (VP 0's
/// hypercalls at 7); stopped and joined on drop.
struct Running {
    addr: SocketAddr,
    stop: Stop,
    thread: Option<std::thread::JoinHandle<()>>,
    dir: TempDir,
    _published: (Arc<hvstats::Hypervisor>, Arc<hvstats::PartitionStats>),
}

impl Running {
    /// A server on a free loopback port with `limits`, and the web configuration `web_yml` (with
    /// the files `files` beside it) when given.
    fn start(tag: &str, limits: Limits, web_yml: Option<&str>, files: &[(&str, &str)]) -> Self {
        let dir = TempDir::new(tag);
        let hv = hvstats::Hypervisor::with_config(hvstats::InstanceConfig {
            runtime_dir: Some(dir.path().to_owned()),
            logical_processors: Some(vec![0]),
            ..Default::default()
        })
        .unwrap();
        let part = hv.create_partition(2).unwrap();
        part.vp_page(0).unwrap().set(hvstats_abi::catalog::vp::HYPERCALLS, 7);
        let web = web_yml.map(|yml| web_config(dir.path(), yml, files));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let exporter = Exporter {
            live: Live::new(Some(dir.path().to_owned())),
            max_vps: DEFAULT_MAX_VPS,
            snapshot_api: false,
            collectors: Selection::defaults(),
        };
        let server = Server::new(Listener::Tcp(listener), Config { limits, web }, exporter).unwrap();
        let stop = server.stop_handle();
        let thread = std::thread::spawn(move || server.run());
        Self { addr, stop, thread: Some(thread), dir, _published: (hv, part) }
    }

    fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(self.addr).unwrap();
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        stream
    }

    /// Sends `request` on a new connection and reads until the server closes it: what it
    /// answered (a reset after the answer, or instead of one, ends it too).
    fn exchange(&self, request: &[u8]) -> Vec<u8> {
        let mut stream = self.connect();
        // The server may close before it has read everything: what it answered is the answer.
        let _ = stream.write_all(request);
        read_until_closed(&mut stream)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Writes `yml` and `files` into `dir` and loads `yml` as the web configuration.
fn web_config(dir: &Path, yml: &str, files: &[(&str, &str)]) -> Web {
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    std::fs::write(dir.join("web.yml"), yml).unwrap();
    Web::load(&dir.join("web.yml")).unwrap()
}

/// Everything `stream` receives until the server closes it (or resets it); fails when the server
/// keeps it open past [`PATIENCE`].
fn read_until_closed(stream: &mut impl Read) -> Vec<u8> {
    let mut reply = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return reply,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::UnexpectedEof) => {
                return reply;
            }
            Err(e) => panic!("the server kept the connection open past {PATIENCE:?}: {e}"),
        }
    }
}

/// A response split into its head (text) and body.
fn split(reply: &[u8]) -> (String, &[u8]) {
    let at = reply.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(reply.len());
    let body = reply.get(at + 4..).unwrap_or_default();
    (String::from_utf8_lossy(&reply[..at]).into_owned(), body)
}

fn status(reply: &[u8]) -> String {
    let (head, _) = split(reply);
    head.lines().next().unwrap_or_default().to_owned()
}

/// The value of header `name` in `reply`'s head.
fn header(reply: &[u8], name: &str) -> Option<String> {
    let (head, _) = split(reply);
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
    })
}

/// Limits whose deadlines are out of the way of a test that measures something else.
fn patient() -> Limits {
    Limits { header_read_timeout: PATIENCE * 2, first_request_timeout: PATIENCE * 2, ..Limits::default() }
}

#[test]
fn a_client_whose_head_never_ends_holds_up_no_other_and_is_closed_at_its_deadline() {
    let limits = Limits { first_request_timeout: Duration::from_secs(2), ..Limits::default() };
    let server = Running::start("serve-lib-slow-head", limits, None, &[]);
    let mut slow = server.connect();
    slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Never: ends").unwrap();
    let reply = server.exchange(b"GET /metrics HTTP/1.0\r\n\r\n");
    assert_eq!(status(&reply), "HTTP/1.0 200 OK");
    let (_, body) = split(&reply);
    let body = String::from_utf8_lossy(body);
    assert!(body.contains("hvstats_vp_hypercalls_total{") && body.contains("} 7"), "{body}");
    // The slow client is closed by the server, its head never answered.
    let answered = read_until_closed(&mut slow);
    let answered = String::from_utf8_lossy(&answered);
    assert!(!answered.contains(" 200 "), "{answered}");
}

#[test]
fn a_request_line_or_head_over_the_limit_is_refused_with_431() {
    let limits = Limits { max_head_bytes: 8192, ..patient() };
    let server = Running::start("serve-lib-long-head", limits, None, &[]);
    let long_line = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(20_000));
    assert_eq!(
        status(&server.exchange(long_line.as_bytes())),
        "HTTP/1.1 431 Request Header Fields Too Large"
    );
    let long_header = format!("GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "b".repeat(20_000));
    assert_eq!(
        status(&server.exchange(long_header.as_bytes())),
        "HTTP/1.1 431 Request Header Fields Too Large"
    );
    let many: String = (0..100).map(|n| format!("X-{n}: {n}\r\n")).collect();
    let many_headers = format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{many}\r\n");
    assert_eq!(
        status(&server.exchange(many_headers.as_bytes())),
        "HTTP/1.1 431 Request Header Fields Too Large"
    );
    // Within the limits, the same server answers.
    assert_eq!(status(&server.exchange(b"GET / HTTP/1.0\r\n\r\n")), "HTTP/1.0 200 OK");
}

#[test]
fn a_declared_body_beyond_any_limit_is_never_read_and_its_connection_not_kept() {
    let server = Running::start("serve-lib-huge-body", patient(), None, &[]);
    // A GET declaring 100 GB: answered, then closed (not kept for a next request on the body).
    let reply = server.exchange(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000000\r\n\r\nabc");
    assert_eq!(status(&reply), "HTTP/1.1 200 OK");
    // A POST declaring as much: refused by method, its body unread.
    let reply = server.exchange(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000000\r\n\r\n");
    assert_eq!(status(&reply), "HTTP/1.1 405 Method Not Allowed");
    // A length that is no number: refused by the parser.
    let reply = server.exchange(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1e99\r\n\r\n");
    assert_eq!(status(&reply), "HTTP/1.1 400 Bad Request");
}

#[test]
fn above_the_cap_silent_connections_are_closed_and_a_scraper_is_served() {
    // A cap of 2: 10 connections at once at most (the cap and four times it), each silent one
    // closed once its grace (a second) is over while the cap is passed.
    let limits = Limits { max_connections: 2, ..patient() };
    let server = Running::start("serve-lib-cap", limits, None, &[]);
    let silent: Vec<TcpStream> = (0..10).map(|_| server.connect()).collect();
    let reply = server.exchange(b"GET /metrics HTTP/1.0\r\n\r\n");
    assert_eq!(status(&reply), "HTTP/1.0 200 OK");
    // Every silent connection but those within the cap was closed by the server (none of them
    // sent anything, and their own deadline is a minute away).
    let closed = silent
        .iter()
        .filter(|s| {
            s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
            let mut byte = [0u8; 1];
            match (&mut &**s).read(&mut byte) {
                Ok(0) => true,
                Err(e) => e.kind() == ErrorKind::ConnectionReset,
                Ok(_) => false,
            }
        })
        .count();
    assert!(closed >= 8, "{closed} of 10 silent connections closed, the cap is 2");
}

#[test]
fn basic_authentication_refuses_no_or_wrong_credentials_and_admits_the_right_ones() {
    let hash = bcrypt::hash("s3cret", 4).unwrap();
    let yml = format!("basic_auth_users:\n  scraper: {hash}\n");
    let server = Running::start("serve-lib-auth", patient(), Some(&yml), &[]);
    let basic = |user_password: &str| {
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(user_password))
    };
    let get = |authorization: Option<String>| {
        let authorization = authorization.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
        server.exchange(format!("GET /metrics HTTP/1.0\r\n{authorization}\r\n").as_bytes())
    };
    let none = get(None);
    assert_eq!(status(&none), "HTTP/1.0 401 Unauthorized");
    assert_eq!(header(&none, "WWW-Authenticate").as_deref(), Some("Basic"));
    assert_eq!(status(&get(Some(basic("scraper:wrong")))), "HTTP/1.0 401 Unauthorized");
    assert_eq!(status(&get(Some(basic("intruder:s3cret")))), "HTTP/1.0 401 Unauthorized");
    let admitted = get(Some(basic("scraper:s3cret")));
    assert_eq!(status(&admitted), "HTTP/1.0 200 OK");
    assert!(String::from_utf8_lossy(split(&admitted).1).contains("hvstats_vp_hypercalls_total{"));
}

#[test]
fn gzip_is_sent_when_accept_encoding_asks_for_it_and_only_then() {
    let server = Running::start("serve-lib-gzip", patient(), None, &[]);
    let plain = server.exchange(b"GET /metrics HTTP/1.0\r\n\r\n");
    assert_eq!(header(&plain, "Content-Encoding"), None);
    let gzipped = server.exchange(b"GET /metrics HTTP/1.0\r\nAccept-Encoding: br, gzip;q=0.8\r\n\r\n");
    assert_eq!(status(&gzipped), "HTTP/1.0 200 OK");
    assert_eq!(header(&gzipped, "Content-Encoding").as_deref(), Some("gzip"));
    assert_eq!(header(&gzipped, "Vary").as_deref(), Some("Accept, Accept-Encoding"));
    let mut text = String::new();
    flate2::read::GzDecoder::new(split(&gzipped).1).read_to_string(&mut text).unwrap();
    let hypercalls = |body: &str| -> Vec<String> {
        body.lines().filter(|l| l.starts_with("hvstats_vp_hypercalls_total{")).map(str::to_owned).collect()
    };
    let expected = hypercalls(&String::from_utf8_lossy(split(&plain).1));
    assert_eq!(expected.len(), 2, "{expected:?}");
    assert_eq!(hypercalls(&text), expected);
    // Refused by name, gzip is not sent.
    let refused = server.exchange(b"GET /metrics HTTP/1.0\r\nAccept-Encoding: gzip;q=0, *\r\n\r\n");
    assert_eq!(header(&refused, "Content-Encoding"), None);
}

#[test]
fn tls_with_a_generated_certificate_serves_https_and_no_plain_http() {
    let (cert, key_pem) = hvstats_testkit::self_signed_localhost();
    let yml = "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n";
    let files = [("cert.pem", cert.as_str()), ("key.pem", key_pem.as_str())];
    let server = Running::start("serve-lib-tls", patient(), Some(yml), &files);
    assert!(server.dir.path().join("cert.pem").exists());
    let mut tls = hvstats_testkit::tls_client(&cert, server.connect());
    tls.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let reply = read_until_closed(&mut tls);
    assert_eq!(status(&reply), "HTTP/1.0 200 OK");
    assert!(String::from_utf8_lossy(split(&reply).1).contains("hvstats_vp_hypercalls_total{"));
    assert!(tls.conn.negotiated_cipher_suite().is_some());
    // Plain HTTP on the TLS port gets no HTTP answer, and is closed.
    let plain = server.exchange(b"GET /metrics HTTP/1.0\r\n\r\n");
    assert!(!String::from_utf8_lossy(&plain).contains("HTTP/1.0 200"), "{plain:?}");
}
