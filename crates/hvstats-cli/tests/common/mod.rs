//! Set-up shared by the command's integration tests.

#![allow(dead_code)]

use std::path::Path;

#[allow(unused_imports, reason = "not every test file uses each of them")]
pub use hvstats_testkit::{TempDir, kvm_available};

/// A process's private resident memory (its heap: not the pages it maps), in KiB.
pub fn rss_anon_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// An instance this test process publishes under `dir` (logical processor 0 only), with the rest
/// of its configuration from `config`.
pub fn publish_with(dir: &Path, config: hvstats::InstanceConfig) -> std::sync::Arc<hvstats::Hypervisor> {
    hvstats::Hypervisor::with_config(hvstats::InstanceConfig {
        runtime_dir: Some(dir.to_path_buf()),
        logical_processors: Some(vec![0]),
        ..config
    })
    .unwrap()
}

/// An instance this test process publishes under `dir` (logical processor 0 only).
pub fn publish(dir: &Path) -> std::sync::Arc<hvstats::Hypervisor> {
    publish_with(dir, hvstats::InstanceConfig::default())
}

/// An instance published under `dir` (as [`publish`]) holding one partition of `vps` VPs.
pub fn publish_partition(
    dir: &Path,
    vps: u32,
) -> (std::sync::Arc<hvstats::Hypervisor>, std::sync::Arc<hvstats::PartitionStats>) {
    let hv = publish(dir);
    let part = hv.create_partition(vps).unwrap();
    (hv, part)
}

/// A KVM VM with one vCPU held by this test process (what a VMM holds), closed on drop.
pub fn hold_a_vm() -> hvstats_kvm::sources::kvm_stats::IdleVcpu {
    hvstats_kvm::sources::kvm_stats::IdleVcpu::new().expect("a VM with one vCPU")
}

/// Overwrites VP `n`'s page in `hv`'s arena with the page an older hypervisor writes: both TLFS
/// groups at 1.0 (the release group's 63 counters of seed 001, none appended), no hvstats group,
/// `values` at their places.
pub fn write_1_0_vp_page(
    hv: &hvstats::Hypervisor,
    part: &hvstats::PartitionStats,
    n: u32,
    values: &[(hvstats_abi::CounterId, u64)],
) {
    use hvstats_abi::group::GroupVersion;
    use hvstats_abi::{GroupKind, PageLayout};
    use std::os::unix::fs::FileExt;
    let v1_0 = [(GroupKind::Architectural, GroupVersion::V1_0), (GroupKind::Release, GroupVersion::V1_0)];
    let layout = PageLayout::written_at(hvstats_abi::ObjectKind::Vp, &v1_0);
    let mut page = layout.page();
    for &(id, v) in values {
        page.data[layout.slot_of(id).unwrap()] = v;
    }
    let arena = std::fs::OpenOptions::new().write(true).open(hv.published_path().unwrap()).unwrap();
    let bytes: Vec<u8> = page.data.iter().flat_map(|w| w.to_le_bytes()).collect();
    arena.write_all_at(&bytes, part.vp_page(n).unwrap().file_offset()).unwrap();
}

/// `hvstats snapshot --json` over `runtime`, which must succeed.
pub fn snapshot_json(runtime: &Path) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["snapshot", "--json", "--runtime-dir"])
        .arg(runtime)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The address `hvstats serve` (started with its standard output piped) listens on: its first
/// line, "serving http://ADDR/metrics".
pub fn serving_addr(child: &mut std::process::Child) -> std::net::SocketAddr {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("serving http://").and_then(|s| s.strip_suffix("/metrics"));
    addr.unwrap_or_else(|| panic!("unexpected first line {line:?}")).parse().unwrap()
}

/// The whole reply (head and body) to `GET path` over HTTP/1.0, read until `serve` closes.
pub fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
}

/// One `GET /metrics` from a `hvstats serve` started over `runtime` for it (and stopped after).
pub fn scrape(runtime: &Path) -> String {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["serve", "--listen", "127.0.0.1:0", "--runtime-dir"])
        .arg(runtime)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let addr = serving_addr(&mut child);
    let _serve = KilledOnDrop(child);
    http_get(addr, "/metrics")
}

/// A child process killed and reaped when dropped (a failed assertion included).
pub struct KilledOnDrop(pub std::process::Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a plain HTTP/1.0 `GET /metrics` to `addr` gets before the server closes (or 10 s pass):
/// for a TLS port, no HTTP answer.
pub fn http_get_raw(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let _ = stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n");
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    String::from_utf8_lossy(&reply).into_owned()
}

/// The path of a Prometheus tool (`prometheus` or `promtool`, Debian's package `prometheus`), or
/// `None`: skipped, unless `HVSTATS_REQUIRE_PROMETHEUS=1` (CI installs it), where it fails.
pub fn prometheus_tool(name: &str, test: &str) -> Option<&'static str> {
    let path: &'static str = match name {
        "promtool" => "/usr/bin/promtool",
        _ => "/usr/bin/prometheus",
    };
    if Path::new(path).exists() {
        return Some(path);
    }
    let msg = format!("{test}: {path} is missing (Debian package prometheus)");
    assert!(std::env::var("HVSTATS_REQUIRE_PROMETHEUS").as_deref() != Ok("1"), "{msg}");
    eprintln!("{msg}: skipped");
    None
}

/// A loopback port nobody listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `s` percent-encoded for a URL's query string.
pub fn url_encoded(s: &str) -> String {
    s.bytes()
        .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

/// The JSON key of the catalog counter named `name` (of any kind: a name several kinds share has
/// one key) when the value is a total, as snapshots, `run --json` and `dump --json` give it.
pub fn total(name: &str) -> String {
    json_key(name, hvstats_present::json_keys::Held::Total)
}

/// As [`total`], for a delta over an interval (`top --once --json`, `report --json`).
pub fn delta(name: &str) -> String {
    json_key(name, hvstats_present::json_keys::Held::Delta)
}

/// As [`total`], for a value presented over an interval (a rate, a percentage, an average).
pub fn presented(name: &str) -> String {
    json_key(name, hvstats_present::json_keys::Held::Presented)
}

fn json_key(name: &str, held: hvstats_present::json_keys::Held) -> String {
    let counter =
        hvstats_abi::CATALOG.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no counter {name:?}"));
    hvstats_present::json_keys::key(counter, held)
}
