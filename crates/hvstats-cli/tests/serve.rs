//! `hvstats serve` run as a separate process exports the counters of instances this test
//! publishes; Debian's `promtool` checks the exposition and a real Prometheus on loopback scrapes
//! two exporters (two hosts) and answers exact totals.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use common::{TempDir, publish_partition as published, write_1_0_vp_page};

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hvstats::Hypervisor;
use hvstats_abi::catalog::vp;
use serde_json::Value;

/// A child process killed and reaped on drop.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `hvstats serve` on a free loopback port; returns it and its address.
fn serve(dir: &Path, extra: &[&str]) -> (Running, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["serve", "--listen", "127.0.0.1:0", "--runtime-dir"])
        .arg(dir)
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("serving http://").and_then(|s| s.strip_suffix("/metrics"));
    let addr = addr.unwrap_or_else(|| panic!("unexpected first line {line:?}")).parse().unwrap();
    (Running(child), addr)
}

/// `GET path` over HTTP/1.0: (status, headers, body).
fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    get_accepting(addr, path, "*/*")
}

/// `GET path` as Prometheus asks: OpenMetrics first.
fn get_openmetrics(addr: SocketAddr, path: &str) -> (u16, String, String) {
    get_accepting(addr, path, "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5")
}

fn get_accepting(addr: SocketAddr, path: &str, accept: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: {accept}\r\n\r\n").unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head.to_owned(), body.to_owned())
}

fn instance_name(hv: &Hypervisor) -> String {
    hv.published_name().unwrap().to_string()
}

/// The value of the one sample line starting with `series` (name and labels, exactly).
fn sample(text: &str, series: &str) -> Option<String> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ').map(str::to_owned))
}

#[test]
fn metrics_export_exact_counts_in_base_units_with_labels() {
    let tmp = TempDir::new("serve-metrics");
    let (hv, part) = published(tmp.path(), 2);
    let vp1 = part.vp_page(1).unwrap();
    vp1.set(vp::CPUID_INSTRUCTIONS, 4242);
    vp1.set(vp::IO_INSTRUCTIONS, 10);
    vp1.set(vp::IO_INSTRUCTIONS_COST, 25_000_000); // 2.5 s in 100 ns
    vp1.set(vp::HYPERCALLS, 7);
    vp1.set(vp::EMULATED_INSTRUCTIONS, 3);
    part.set_ram_pages(100);
    let (_serve, addr) = serve(tmp.path(), &[]);

    let (status, head, text) = get_openmetrics(addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    assert!(head.contains("application/openmetrics-text; version=1.0.0"), "{head}");
    assert!(text.ends_with("# EOF\n"));
    let i = instance_name(&hv);
    let p = part.id();
    let vp_labels = |vp: u32| format!("instance=\"{i}\",vm=\"{i}:{p}\",partition=\"{p}\",vp=\"{vp}\"");
    let cpuid = format!("hvstats_vp_intercepts_total{{{},intercept=\"cpuid\"}}", vp_labels(1));
    assert_eq!(sample(&text, &cpuid).as_deref(), Some("4242"), "{text}");
    let io_time = format!("hvstats_vp_intercept_seconds_total{{{},intercept=\"io\"}}", vp_labels(1));
    assert_eq!(sample(&text, &io_time).as_deref(), Some("2.5"));
    // CPUID exits are handled inside KVM, which records no time for them: no series.
    let cpuid_time = format!("hvstats_vp_intercept_seconds_total{{{},intercept=\"cpuid\"}}", vp_labels(1));
    assert_eq!(sample(&text, &cpuid_time), None);
    let hypercalls = format!("hvstats_vp_hypercalls_total{{{}}}", vp_labels(1));
    assert_eq!(sample(&text, &hypercalls).as_deref(), Some("7"));
    let vp0 = format!("hvstats_vp_hypercalls_total{{{}}}", vp_labels(0));
    assert_eq!(sample(&text, &vp0).as_deref(), Some("0"));
    let gpa = format!("hvstats_partition_gpa_bytes{{instance=\"{i}\",vm=\"{i}:{p}\",partition=\"{p}\"}}");
    assert_eq!(sample(&text, &gpa).as_deref(), Some(&*(100 * 4096).to_string()));
    assert!(text.contains(
        "# TYPE hvstats_vp_intercept_seconds counter\n# UNIT hvstats_vp_intercept_seconds seconds"
    ));
    assert!(text.contains(&format!(
        "# HELP hvstats_vp_hypercalls {}",
        vp::HYPERCALLS.counter().unwrap().description
    )));
    // Counted but not timed: a count series, no seconds series. Not maintained: no series at all.
    let emulated = format!("hvstats_vp_intercepts_total{{{},intercept=\"emulated\"}}", vp_labels(1));
    assert_eq!(sample(&text, &emulated).as_deref(), Some("3"));
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("hvstats_vp_intercept_seconds_total") && l.contains("\"emulated\""))
    );
    assert!(!text.contains("debug_register"), "not maintained, yet exported");
    assert!(!text.contains("synthetic_interrupts"));

    // A new value shows in the next scrape: nothing is cached. Without OpenMetrics in Accept,
    // the classic format: HELP and TYPE name the `_total` samples, no UNIT, no EOF.
    vp1.add(vp::HYPERCALLS, 5);
    let (_, head, classic) = get(addr, "/metrics");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    assert_eq!(sample(&classic, &hypercalls).as_deref(), Some("12"));
    assert!(classic.contains("# TYPE hvstats_vp_hypercalls_total counter\n"), "{classic}");
    assert!(!classic.contains("# UNIT") && !classic.contains("# EOF"));

    let (status, _, body) = get(addr, "/api/v1/snapshot");
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    let cpuid_name = vp::CPUID_INSTRUCTIONS.counter().unwrap().name;
    assert_eq!(v["instances"][0]["partitions"][0]["vps"][1]["counters"][cpuid_name], 4242);
    let (status, _, body) = get(addr, "/healthz?verbose");
    assert_eq!((status, body.as_str()), (200, "ok: 1 instances, 2 VPs\n"));
    assert_eq!(get(addr, "/nothing").0, 404);
}

#[test]
fn histograms_are_prometheus_histograms_in_seconds_and_cpu_wait_is_a_counter() {
    let tmp = TempDir::new("serve-histograms");
    let (hv, part) = published(tmp.path(), 2);
    let vp1 = part.vp_page(1).unwrap();
    // A known distribution: 3 exits in [512, 1024) ns, 1 in [16384, 32768) ns, 1 past 2^30 ns.
    let times = [700u64, 800, 1000, 20_000, 5_000_000_000];
    for ns in times {
        vp1.record_time(vp::IO_TIME_HISTOGRAM, ns);
    }
    vp1.set(vp::DISPATCHES, 40);
    vp1.set(vp::CPU_WAIT_TIME_PER_DISPATCH, 1_500_000_000); // 1.5 s of waiting, in ns
    let (_serve, addr) = serve(tmp.path(), &[]);
    let (status, _, text) = get_openmetrics(addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    let i = instance_name(&hv);
    let p = part.id();
    let labels = |vp: u32| format!("instance=\"{i}\",vm=\"{i}:{p}\",partition=\"{p}\",vp=\"{vp}\"");
    let name = "hvstats_vp_io_intercept_duration_seconds";
    assert!(text.contains(&format!("# TYPE {name} histogram\n")), "{text}");
    assert!(text.contains(&format!("# UNIT {name} seconds\n")), "{text}");
    let sum: f64 = sample(&text, &format!("{name}_sum{{{}}}", labels(1))).unwrap().parse().unwrap();
    assert!((sum - times.iter().sum::<u64>() as f64 / 1e9).abs() < 1e-9, "{sum}");
    assert_eq!(sample(&text, &format!("{name}_count{{{}}}", labels(1))).as_deref(), Some("5"));
    assert_eq!(sample(&text, &format!("{name}_count{{{}}}", labels(0))).as_deref(), Some("0"));
    // Buckets: cumulative, `le` the bucket's upper bound 2^i ns in seconds, the last one +Inf.
    let prefix = format!("{name}_bucket{{le=\"");
    let suffix = format!("\",{}}}", labels(1));
    let buckets: Vec<(f64, u64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|l| {
            let (le, rest) = l.split_once(&suffix)?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap() };
            Some((le, rest.trim().parse().unwrap()))
        })
        .collect();
    assert_eq!(buckets.len(), hvstats_abi::histogram::BUCKETS, "{text}");
    for (n, &(le, cumulative)) in buckets.iter().enumerate() {
        let expected = times.iter().filter(|&&ns| (ns as f64) / 1e9 <= le).count() as u64;
        assert_eq!(cumulative, expected, "le={le}");
        if n + 1 < buckets.len() {
            assert!((le - (1u64 << n) as f64 / 1e9).abs() < 1e-15, "bucket {n}: le={le}");
        }
    }
    assert_eq!(buckets[10], (1024e-9, 3));
    assert_eq!(buckets.last().unwrap(), &(f64::INFINITY, 5));
    // CPU wait is a counter in seconds, dispatches a counter.
    let lines: Vec<&str> =
        text.lines().filter(|l| l.starts_with("hvstats_vp_") && l.contains(&labels(1))).collect();
    assert!(
        lines.contains(&&*format!("hvstats_vp_cpu_wait_seconds_total{{{}}} 1.5", labels(1))),
        "{lines:?}"
    );
    assert!(lines.contains(&&*format!("hvstats_vp_dispatches_total{{{}}} 40", labels(1))), "{lines:?}");
    assert!(text.contains("# TYPE hvstats_vp_cpu_wait_seconds counter\n"), "{text}");
}

#[test]
fn past_the_vp_cap_a_partition_exports_the_sum_of_its_vps() {
    let tmp = TempDir::new("serve-cap");
    let (hv, small) = published(tmp.path(), 1);
    let big = hv.create_partition(3).unwrap();
    small.vp_page(0).unwrap().set(vp::HYPERCALLS, 1);
    for (i, n) in [10, 20, 30].into_iter().enumerate() {
        big.vp_page(i as u32).unwrap().set(vp::HYPERCALLS, n);
    }
    let (_serve, addr) = serve(tmp.path(), &["--max-vps", "2"]);
    let text = get(addr, "/metrics").2;
    let i = instance_name(&hv);
    let series = |p: u64, vp: &str| {
        format!(
            "hvstats_vp_hypercalls_total{{instance=\"{i}\",vm=\"{i}:{p}\",partition=\"{p}\",vp=\"{vp}\"}}"
        )
    };
    assert_eq!(sample(&text, &series(small.id(), "0")).as_deref(), Some("1"));
    assert_eq!(sample(&text, &series(big.id(), "all")).as_deref(), Some("60"), "{text}");
    assert_eq!(sample(&text, &series(big.id(), "0")), None);
}

#[test]
fn observe_all_embeds_an_observer_instance_beside_the_others() {
    let tmp = TempDir::new("serve-observe");
    let (_hv, _) = published(tmp.path(), 1);
    let (_serve, addr) = serve(tmp.path(), &["--observe-all", "--observe-interval", "0.2"]);
    // The observer publishes its own instance (with a partition per KVM VM of other processes;
    // this host runs none), which the exporter reads like any other.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, _, body) = get(addr, "/healthz");
        if (status, body.as_str()) == (200, "ok: 2 instances, 1 VPs\n") {
            break;
        }
        assert!(Instant::now() < deadline, "{status} {body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, _, body) = get(addr, "/api/v1/snapshot");
    let v: Value = serde_json::from_str(&body).unwrap();
    let kinds: Vec<&str> =
        v["instances"].as_array().unwrap().iter().filter_map(|i| i["kind"].as_str()).collect();
    assert!(kinds.contains(&"observer"), "{body}");
}

#[test]
fn a_named_partition_is_its_vm_label() {
    let tmp = TempDir::new("serve-named");
    let (hv, _) = published(tmp.path(), 1);
    let web = hv.create_partition_named(2, "web-1").unwrap();
    web.vp_page(1).unwrap().set(vp::HYPERCALLS, 31);
    let (_serve, addr) = serve(tmp.path(), &[]);
    let text = get(addr, "/metrics").2;
    let i = instance_name(&hv);
    let series = format!(
        "hvstats_vp_hypercalls_total{{instance=\"{i}\",vm=\"web-1\",partition=\"{}\",vp=\"1\"}}",
        web.id()
    );
    assert_eq!(sample(&text, &series).as_deref(), Some("31"), "{text}");
}

#[test]
fn an_empty_runtime_directory_serves_an_empty_exposition_and_a_missing_one_is_an_error() {
    let tmp = TempDir::new("serve-empty");
    let (_serve, addr) = serve(tmp.path(), &[]);
    let (status, _, text) = get_openmetrics(addr, "/metrics");
    assert_eq!((status, text.as_str()), (200, "# EOF\n"));
    let (status, _, text) = get(addr, "/metrics");
    assert_eq!((status, text.as_str()), (200, ""));
    let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["serve", "--listen", "127.0.0.1:0", "--runtime-dir"])
        .arg(tmp.path().join("missing"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
}

/// The path of a Prometheus tool, or `None` (skipped, unless CI requires it).
fn prometheus_tool(name: &str, test: &str) -> Option<&'static str> {
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

#[test]
fn promtool_accepts_the_exposition() {
    let Some(promtool) = prometheus_tool("promtool", "promtool_accepts_the_exposition") else { return };
    let tmp = TempDir::new("serve-promtool");
    let (_hv, part) = published(tmp.path(), 2);
    part.vp_page(0).unwrap().set(vp::IO_INSTRUCTIONS, 11);
    for ns in [700, 900, 20_000, 5_000_000_000] {
        part.vp_page(1).unwrap().record_time(vp::IO_TIME_HISTOGRAM, ns);
    }
    let (_serve, addr) = serve(tmp.path(), &[]);
    let text = get(addr, "/metrics").2;
    assert!(text.contains("hvstats_vp_io_intercept_duration_seconds_bucket{"), "{text}");
    let mut check = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    check.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = check.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool: {said}\n{text}");
    assert!(said.trim().is_empty(), "promtool has remarks: {said}");
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Asks Prometheus `query` until it answers one sample equal to `expected` (or 60 s pass).
fn query_until(prometheus: SocketAddr, query: &str, expected: &str) -> String {
    let encoded: String = query
        .bytes()
        .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    while Instant::now() < deadline {
        // Until Prometheus listens, connecting fails.
        if TcpStream::connect(prometheus).is_ok() {
            let (status, _, body) = get(prometheus, &format!("/api/v1/query?query={encoded}"));
            if status == 200 {
                let v: Value = serde_json::from_str(&body).unwrap();
                let result = v["data"]["result"].as_array().cloned().unwrap_or_default();
                if result.len() == 1 && result[0]["value"][1].as_str() == Some(expected) {
                    return body;
                }
            }
            last = format!("{status} {body}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!("Prometheus never answered {expected} to {query}; last answer: {last}");
}

#[test]
fn prometheus_scrapes_two_hosts_and_sums_their_exact_totals() {
    let test = "prometheus_scrapes_two_hosts_and_sums_their_exact_totals";
    let Some(prometheus) = prometheus_tool("prometheus", test) else { return };
    // Two runtime directories, two exporters: two hosts as Prometheus sees them.
    let (host_a, host_b) = (TempDir::new("serve-host-a"), TempDir::new("serve-host-b"));
    let (_hv_a, part_a) = published(host_a.path(), 2);
    let (_hv_b, part_b) = published(host_b.path(), 1);
    part_a.vp_page(0).unwrap().set(vp::CPUID_INSTRUCTIONS, 1000);
    part_a.vp_page(1).unwrap().set(vp::CPUID_INSTRUCTIONS, 234);
    part_a.vp_page(1).unwrap().set(vp::MSR_ACCESSES, 2);
    part_a.vp_page(1).unwrap().set(vp::MSR_ACCESSES_COST, 12_340); // 1.234 ms
    part_b.vp_page(0).unwrap().set(vp::CPUID_INSTRUCTIONS, 5);
    part_b.vp_page(0).unwrap().set(vp::IO_INSTRUCTIONS, 77);
    let (_serve_a, addr_a) = serve(host_a.path(), &[]);
    let (_serve_b, addr_b) = serve(host_b.path(), &[]);

    let work = TempDir::new("serve-prometheus");
    let config = work.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: hvstats\n    static_configs:\n      \
             - targets: ['{addr_a}', '{addr_b}']\n"
        ),
    )
    .unwrap();
    let web = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let _prometheus = Running(
        Command::new(prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", work.path().join("data").display()))
            .arg(format!("--web.listen-address={web}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    query_until(web, "sum(hvstats_vp_intercepts_total{intercept=\"cpuid\"})", "1239");
    query_until(web, &format!("sum(hvstats_vp_intercepts_total{{instance=\"{addr_b}\"}})"), "82");
    query_until(web, "sum by (intercept) (hvstats_vp_intercepts_total{intercept=\"io\"})", "77");
    query_until(web, "sum(hvstats_vp_intercept_seconds_total{intercept=\"msr\"})", "0.001234");
    // The average cost of an MSR access, as the README's query computes it (rates of two equal
    // constants are zero, so here from the totals): 1.234 ms / 2 accesses.
    query_until(
        web,
        "sum(hvstats_vp_intercept_seconds_total{intercept=\"msr\"}) / sum(hvstats_vp_intercepts_total{intercept=\"msr\"})",
        "0.000617",
    );
    query_until(web, "count(up == 1)", "2");
}

#[test]
fn a_vp_page_of_1_0_exports_its_counters_and_no_series_for_the_1_1_ones() {
    let tmp = TempDir::new("serve-1_0");
    let (hv, part) = published(tmp.path(), 2);
    write_1_0_vp_page(&hv, &part, 0, &[(vp::CPUID_INSTRUCTIONS, 12)]);
    part.vp_page(1).unwrap().set(vp::DISPATCHES, 40);
    let (_serve, addr) = serve(tmp.path(), &[]);
    let (status, _, text) = get_openmetrics(addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    let i = instance_name(&hv);
    let p = part.id();
    let labels = |vp: u32| format!("instance=\"{i}\",vm=\"{i}:{p}\",partition=\"{p}\",vp=\"{vp}\"");
    let cpuid = format!("hvstats_vp_intercepts_total{{{},intercept=\"cpuid\"}}", labels(0));
    assert_eq!(sample(&text, &cpuid).as_deref(), Some("12"), "{text}");
    // The 1.1 counters (and hvstats' own group) the 1.0 page does not carry: no series, not 0.
    let vp0: Vec<&str> = text.lines().filter(|l| l.contains(&labels(0))).collect();
    for family in [
        "hvstats_vp_dispatches_total",
        "hvstats_vp_cpu_wait_seconds_total",
        "hvstats_vp_io_intercept_duration",
    ] {
        assert!(!vp0.iter().any(|l| l.starts_with(family)), "{family} for VP 0: {vp0:?}");
    }
    let dispatches = format!("hvstats_vp_dispatches_total{{{}}}", labels(1));
    assert_eq!(sample(&text, &dispatches).as_deref(), Some("40"), "{text}");
}
