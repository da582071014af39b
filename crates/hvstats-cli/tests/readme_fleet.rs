//! The README's "Monitoring a fleet" section, followed as written: its blocks are taken from
//! README.md and run, with only the places changed (a temporary directory for /etc/hvstats and
//! /etc/prometheus, the repository's rule files for /usr/share/hvstats, `localhost` for the VM
//! host's name, a free port for 9966 on a machine other tests share). `hvstats serve` runs as the
//! package's unit runs it (its `ExecStart=` with `$HVSTATS_SERVE_ARGS`), first with the package's
//! /etc/default/hvstats, then with the README's; a real Prometheus scrapes it with the README's
//! configuration and its recording rules have values.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{KilledOnDrop, TempDir, url_encoded};
use serde_json::Value;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

/// The fenced blocks of the README's section `heading`, each without its fences.
fn blocks(heading: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(repo("README.md")).unwrap();
    let start = readme.find(&format!("\n## {heading}\n")).unwrap_or_else(|| panic!("no section {heading}"));
    let section = &readme[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    let mut out = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if line.starts_with("```") {
            let body: Vec<&str> = lines.by_ref().take_while(|l| !l.starts_with("```")).collect();
            out.push(body.join("\n") + "\n");
        }
    }
    out
}

/// The block whose first line starts with `first`.
fn block<'a>(blocks: &'a [String], first: &str) -> &'a str {
    blocks.iter().find(|b| b.starts_with(first)).unwrap_or_else(|| panic!("no block starting {first:?}"))
}

/// The arguments `$VAR` gives in a default file's text, split at spaces as systemd splits them.
fn var_args(text: &str, var: &str) -> Vec<String> {
    let line = text.lines().find_map(|l| l.strip_prefix(&format!("{var}="))).unwrap();
    line.trim_matches('"').split_whitespace().map(str::to_owned).collect()
}

/// `hvstats serve` as the package's unit starts it, `$HVSTATS_SERVE_ARGS` from `default_file`,
/// 9966 made `port`, publishing from `runtime`.
fn serve_as_the_unit(default_file: &str, port: u16, runtime: &Path) -> KilledOnDrop {
    let unit = std::fs::read_to_string(repo("packaging/systemd/hvstats-serve.service")).unwrap();
    let exec = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).unwrap();
    assert!(unit.contains("EnvironmentFile=-/etc/default/hvstats"), "{unit}");
    let mut args = Vec::new();
    for word in exec.split_whitespace().skip(1) {
        match word {
            "$HVSTATS_SERVE_ARGS" => args.extend(var_args(default_file, "HVSTATS_SERVE_ARGS")),
            w => args.push(w.to_owned()),
        }
    }
    // The port only: a path of the test's (with its pid in it) may hold the digits too.
    let args: Vec<String> = args.iter().map(|a| a.replace(":9966", &format!(":{port}"))).collect();
    let child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(&args)
        .arg("--runtime-dir")
        .arg(runtime)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut serve = KilledOnDrop(child);
    let t = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(status) = serve.0.try_wait().unwrap() {
            let stderr = std::io::read_to_string(serve.0.stderr.take().unwrap()).unwrap_or_default();
            panic!("serve {args:?} ended ({status}) before listening on {port}: {stderr}");
        }
        assert!(t.elapsed() < Duration::from_secs(30), "serve {args:?} is not listening on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    serve
}

/// Runs a shell block of the README; it must succeed.
fn sh(script: &str) {
    let out = Command::new("sh").args(["-ec", script]).output().unwrap();
    assert!(out.status.success(), "{script}\n{}", String::from_utf8_lossy(&out.stderr));
}

/// One instant query against Prometheus's API: its result, or why not.
fn query(web: SocketAddr, q: &str) -> Result<Vec<Value>, String> {
    use std::io::{Read, Write};
    // Prometheus listens once it has started: until then, a refusal is a "not yet".
    let mut stream = TcpStream::connect(web).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
    write!(stream, "GET /api/v1/query?query={} HTTP/1.0\r\nHost: {web}\r\n\r\n", url_encoded(q))
        .map_err(|e| e.to_string())?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).map_err(|e| e.to_string())?;
    let body = reply.split_once("\r\n\r\n").map(|(_, b)| b).ok_or("no body")?;
    let v: Value = serde_json::from_str(body).map_err(|e| format!("{e}: {body}"))?;
    v["data"]["result"].as_array().cloned().ok_or_else(|| body.to_owned())
}

#[test]
fn the_readmes_fleet_section_followed_literally_gives_a_prometheus_with_data() {
    let test = "the_readmes_fleet_section_followed_literally_gives_a_prometheus_with_data";
    let Some(prometheus) = common::prometheus_tool("prometheus", test) else { return };
    if Command::new("openssl").arg("version").output().is_err() {
        assert!(std::env::var("CI").is_err(), "openssl is missing");
        eprintln!("{test}: openssl is missing: skipped");
        return;
    }
    let tmp = TempDir::new("readme-fleet");
    let runtime = tmp.path().join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (dir, stop) = (runtime.clone(), stop.clone());
        std::thread::spawn(move || hvstats_testkit::synthetic_load(&dir, 600.0, &stop))
    };
    let port = common::free_port();

    // The package as installed: HTTP on 127.0.0.1:9966 only.
    let packaged = std::fs::read_to_string(repo("packaging/default/hvstats")).unwrap();
    {
        let _serve = serve_as_the_unit(&packaged, port, &runtime);
        let reply = common::http_get(SocketAddr::from(([127, 0, 0, 1], port)), "/metrics");
        assert!(reply.starts_with("HTTP/1.0 200") && reply.contains("hvstats_build_info"), "{reply}");
        assert!(TcpStream::connect(("::1", port)).is_err(), "the package's default is IPv4 loopback only");
    }

    // The README's edits on the VM host, its blocks run as written in a directory of the test's.
    let blocks = blocks("Monitoring a fleet");
    let etc = tmp.path().join("etc");
    let local = |text: &str| {
        text.replace("/etc/hvstats/", &format!("{}/hvstats/", etc.display()))
            .replace("/etc/hvstats\n", &format!("{}/hvstats\n", etc.display()))
            .replace("/etc/prometheus/", &format!("{}/prometheus/", etc.display()))
            .replace(
                "/usr/share/hvstats/prometheus/",
                &format!("{}/", repo("packaging/prometheus").display()),
            )
            .replace("$(hostname -f)", "localhost")
            .replace("'host-a:9966', 'host-b:9966'", &format!("'localhost:{port}'"))
            .replace("host-a.crt host-b.crt", &format!("{}/hvstats/tls.crt", etc.display()))
    };
    let default_file = block(&blocks, "# /etc/default/hvstats on each VM host");
    sh(&local(block(&blocks, "# on each VM host:")));
    std::fs::write(etc.join("hvstats/web.yml"), local(block(&blocks, "# /etc/hvstats/web.yml"))).unwrap();
    let _serve = serve_as_the_unit(&local(default_file), port, &runtime);
    // ":9966" is every address: IPv4 and IPv6 loopback both answer.
    TcpStream::connect(("::1", port)).unwrap();
    // And it asks for TLS: plain HTTP gets no HTTP answer.
    let plain = common::http_get_raw(&format!("127.0.0.1:{port}"));
    assert!(!plain.starts_with("HTTP/"), "{plain}");

    // The Prometheus host: its files, then Prometheus with the README's configuration.
    std::fs::create_dir_all(etc.join("prometheus")).unwrap();
    sh(&local(block(&blocks, "# on the Prometheus host:")));
    let config = local(block(&blocks, "# /etc/prometheus/prometheus.yml"));
    assert!(config.contains("scrape_interval: 15s"), "{config}");
    let work = tmp.path().join("prometheus");
    std::fs::create_dir_all(&work).unwrap();
    let (_prometheus, web) = common::start_prometheus(prometheus, &config, &work);

    // Scraped over TLS with the password, and the recording rules' [1m] windows have values.
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut last: String;
    for q in [
        "up{job=\"hvstats\"} == 1",
        "hvstats_build_info{job=\"hvstats\"}",
        "vm:hvstats_exits:rate1m{vm=\"db-1\"} > 0",
    ] {
        loop {
            match query(web, q) {
                Ok(r) if !r.is_empty() => break,
                Ok(r) => last = format!("{q}: {r:?}"),
                Err(e) => last = format!("{q}: {e}"),
            }
            assert!(Instant::now() < deadline, "not reached in four minutes: {last}");
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap().unwrap();
}
