//! `hvstats serve` run as a separate process exports the counters of instances this test
//! publishes; Debian's `promtool` checks the exposition and a real Prometheus on loopback scrapes
//! two exporters (two hosts) and answers exact totals.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use common::{
    KilledOnDrop, TempDir, prometheus_tool, publish_partition as published, start_prometheus,
    write_1_0_vp_page,
};

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hvstats::Hypervisor;
use hvstats_abi::catalog::vp;
use serde_json::Value;

/// Starts `hvstats serve` on a free loopback port; returns it and its address.
fn serve(dir: &Path, extra: &[&str]) -> (KilledOnDrop, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(common::EVERY_COLLECTOR)
        .arg("--runtime-dir")
        .arg(dir)
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let addr = common::serving_addr(&mut child);
    (KilledOnDrop(child), addr)
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
    let (_serve, addr) = serve(tmp.path(), &["--snapshot-api"]);

    let (status, head, text) = get_openmetrics(addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    assert!(head.contains("application/openmetrics-text; version=1.0.0"), "{head}");
    assert!(text.ends_with("# EOF\n"));
    let i = instance_name(&hv);
    let p = part.id();
    let vp_labels = |vp: u32| format!("vm=\"partition-{p}\",vp=\"{vp}\"");
    let cpuid = format!("hvstats_vp_intercepts_total{{{},intercept=\"cpuid\"}}", vp_labels(1));
    assert_eq!(common::sample(&text, &cpuid).as_deref(), Some("4242"), "{text}");
    let io_time = format!("hvstats_vp_intercept_seconds_total{{{},intercept=\"io\"}}", vp_labels(1));
    assert_eq!(common::sample(&text, &io_time).as_deref(), Some("2.5"));
    // CPUID exits are handled inside KVM, which records no time for them: no series.
    let cpuid_time = format!("hvstats_vp_intercept_seconds_total{{{},intercept=\"cpuid\"}}", vp_labels(1));
    assert_eq!(common::sample(&text, &cpuid_time), None);
    let hypercalls = format!("hvstats_vp_hypercalls_total{{{}}}", vp_labels(1));
    assert_eq!(common::sample(&text, &hypercalls).as_deref(), Some("7"));
    let vp0 = format!("hvstats_vp_hypercalls_total{{{}}}", vp_labels(0));
    assert_eq!(common::sample(&text, &vp0).as_deref(), Some("0"));
    let gpa = format!("hvstats_partition_gpa_bytes{{vm=\"partition-{p}\"}}");
    assert_eq!(common::sample(&text, &gpa).as_deref(), Some(&*(100 * 4096).to_string()));
    assert!(text.contains(
        "# TYPE hvstats_vp_intercept_seconds counter\n# UNIT hvstats_vp_intercept_seconds seconds"
    ));
    assert!(text.contains(&format!(
        "# HELP hvstats_vp_hypercalls {}",
        vp::HYPERCALLS.counter().unwrap().description
    )));
    // Counted but not timed: a count series, no seconds series. Not maintained: no series at all.
    let emulated = format!("hvstats_vp_intercepts_total{{{},intercept=\"emulated\"}}", vp_labels(1));
    assert_eq!(common::sample(&text, &emulated).as_deref(), Some("3"));
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("hvstats_vp_intercept_seconds_total") && l.contains("\"emulated\""))
    );
    assert!(!text.contains("debug_register"), "not maintained, yet exported");
    assert!(!text.contains("synthetic_interrupts"));
    // The reader's bookkeeping is no metric; help texts speak the exported unit.
    assert!(!text.contains("hvstats_vp_sequence"), "{text}");
    let help = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("# HELP {name} ")))
            .unwrap_or_else(|| panic!("{name}"))
    };
    for seconds in
        ["hvstats_vp_hypercalls_seconds", "hvstats_vp_total_run_seconds", "hvstats_vp_intercept_seconds"]
    {
        let help = help(seconds);
        assert!(
            help.contains("(in seconds)") && !help.contains("100ns") && !help.contains("nanoseconds"),
            "{help}"
        );
    }
    let gpa_help = help("hvstats_partition_gpa_bytes");
    assert!(gpa_help.contains("bytes") && !gpa_help.contains("number of pages"), "{gpa_help}");

    // A new value shows in the next scrape: nothing is cached. Without OpenMetrics in Accept,
    // the classic format: HELP and TYPE name the `_total` samples, no UNIT, no EOF.
    vp1.add(vp::HYPERCALLS, 5);
    let (_, head, classic) = get(addr, "/metrics");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    assert_eq!(common::sample(&classic, &hypercalls).as_deref(), Some("12"));
    assert!(classic.contains("# TYPE hvstats_vp_hypercalls_total counter\n"), "{classic}");
    assert!(!classic.contains("# UNIT") && !classic.contains("# EOF"));

    let (status, _, body) = get(addr, "/api/v1/snapshot");
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    let cpuid_name = vp::CPUID_INSTRUCTIONS.counter().unwrap().name;
    assert_eq!(v["instances"][0]["partitions"][0]["vps"][1]["counters"][common::total(cpuid_name)], 4242);
    let (status, _, body) = get(addr, "/healthz?verbose");
    assert_eq!((status, body.as_str()), (200, "ok: 1 instances, 2 VPs\n"));
    assert_eq!(get(addr, "/nothing").0, 404);

    // The exporter's own series: it is up, and so are the instance and its VM.
    assert_exporter_series(&text, "0");
    assert_eq!(
        common::sample(&text, &format!("hvstats_instance_up{{publisher=\"{i}\"}}")).as_deref(),
        Some("1")
    );
    let vm_up = format!("hvstats_vm_up{{vm=\"partition-{p}\"}}");
    assert_eq!(common::sample(&text, &vm_up).as_deref(), Some("1"), "{text}");
    // HEAD: the headers of GET, no body; other methods: 405.
    let reply = exchange(addr, b"HEAD /metrics HTTP/1.0\r\n\r\n", Duration::from_secs(5));
    let (head, body) = reply.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.0 200") && head.contains("content-length: "), "{head}");
    assert_eq!(body, "");
    let reply = exchange(addr, b"DELETE /metrics HTTP/1.0\r\n\r\n", Duration::from_secs(5));
    assert!(reply.starts_with("HTTP/1.0 405"), "{reply}");
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
    // As the observer declares them for a VM without KVM's statistics: no series, not zeros.
    part.set_unavailable(&[vp::HALT_POLL_SUCCESS_HISTOGRAM, vp::HALT_POLL_FAIL_HISTOGRAM]);
    let (_serve, addr) = serve(tmp.path(), &[]);
    let (status, _, text) = get_openmetrics(addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    let _i = instance_name(&hv);
    let p = part.id();
    let labels = |vp: u32| format!("vm=\"partition-{p}\",vp=\"{vp}\"");
    let name = "hvstats_vp_io_intercept_duration_seconds";
    assert!(text.contains(&format!("# TYPE {name} histogram\n")), "{text}");
    assert!(text.contains(&format!("# UNIT {name} seconds\n")), "{text}");
    assert!(text.contains("hvstats_vp_halt_wait_duration_seconds_count{"), "{text}");
    assert!(!text.contains("hvstats_vp_halt_poll_success_duration_seconds_count{"), "{text}");
    assert!(!text.contains("hvstats_vp_halt_poll_fail_duration_seconds_count{"), "{text}");
    let sum: f64 = common::sample(&text, &format!("{name}_sum{{{}}}", labels(1))).unwrap().parse().unwrap();
    assert!((sum - times.iter().sum::<u64>() as f64 / 1e9).abs() < 1e-9, "{sum}");
    assert_eq!(common::sample(&text, &format!("{name}_count{{{}}}", labels(1))).as_deref(), Some("5"));
    assert_eq!(common::sample(&text, &format!("{name}_count{{{}}}", labels(0))).as_deref(), Some("0"));
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
    let _i = instance_name(&hv);
    let series =
        |p: u64, vp: &str| format!("hvstats_vp_hypercalls_total{{vm=\"partition-{p}\",vp=\"{vp}\"}}");
    assert_eq!(common::sample(&text, &series(small.id(), "0")).as_deref(), Some("1"));
    assert_eq!(common::sample(&text, &series(big.id(), "all")).as_deref(), Some("60"), "{text}");
    assert_eq!(common::sample(&text, &series(big.id(), "0")), None);
}

#[test]
fn observe_all_embeds_an_observer_instance_beside_the_others() {
    let tmp = TempDir::new("serve-observe");
    let (_hv, _) = published(tmp.path(), 1);
    // Only this test's process (it holds no VM): other tests' VMMs on the host are theirs.
    let me = std::process::id().to_string();
    let (_serve, addr) =
        serve(tmp.path(), &["--observe-all", "--observe-interval", "0.2", "--snapshot-api", "--vm", &me]);
    // The observer publishes its own instance (with a partition per KVM VM of other processes;
    // the filter takes none), which the exporter reads like any other.
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
fn a_named_vm_keeps_its_series_across_a_restart_of_its_publisher() {
    let tmp = TempDir::new("serve-named");
    let (_serve, addr) = serve(tmp.path(), &[]);
    let series = "hvstats_vp_hypercalls_total{vm=\"web-1\",vp=\"1\"}";
    let mut publishers = Vec::new();
    for run in 0..2 {
        // The same VM, its publisher started again: a new instance, maybe a new partition id.
        let (hv, _) = published(tmp.path(), 1);
        let web = hv.create_partition_named(2, "web-1").unwrap();
        web.vp_page(1).unwrap().set(vp::HYPERCALLS, 31 + run);
        let text = get(addr, "/metrics").2;
        assert_eq!(common::sample(&text, series).as_deref(), Some(&*(31 + run).to_string()), "{text}");
        // What changed is on the VM's info series alone.
        let i = instance_name(&hv);
        let info = text.lines().find(|l| l.starts_with("hvstats_vm_info{vm=\"web-1\"")).unwrap();
        assert!(
            info.contains(&format!("publisher=\"{i}\""))
                && info.contains(&format!("partition=\"{}\"", web.id())),
            "{info}"
        );
        assert!(!text.contains("instance=\""), "an instance label would fight Prometheus' own: {text}");
        publishers.push(i);
        drop((web, hv));
    }
    assert_ne!(publishers[0], publishers[1]);
    // Two VMs of one name at once: told apart by `#2` (no pid in a label), each with its values.
    let (hv_a, _) = published(tmp.path(), 1);
    let (hv_b, _) = published(tmp.path(), 1);
    let a = hv_a.create_partition_named(1, "dup").unwrap();
    let b = hv_b.create_partition_named(1, "dup").unwrap();
    a.vp_page(0).unwrap().set(vp::HYPERCALLS, 5);
    b.vp_page(0).unwrap().set(vp::HYPERCALLS, 6);
    let text = get(addr, "/metrics").2;
    let mut values: Vec<String> = ["dup", "dup#2"]
        .iter()
        .map(|vm| {
            common::sample(&text, &format!("hvstats_vp_hypercalls_total{{vm=\"{vm}\",vp=\"0\"}}")).unwrap()
        })
        .collect();
    values.sort();
    assert_eq!(values, ["5", "6"], "{text}");
    for (hv, part) in [(&hv_a, &a), (&hv_b, &b)] {
        let info = format!(
            "publisher=\"{}\",publisher_pid=\"{}\",publisher_kind=\"\",partition=\"{}\"",
            instance_name(hv),
            std::process::id(),
            part.id()
        );
        assert!(text.contains(&info), "the info series names each: {text}");
    }
}

/// The exporter's own series every scrape carries, whatever it could read.
fn assert_exporter_series(text: &str, read_errors: &str) {
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        common::sample(text, &format!("hvstats_build_info{{version=\"{version}\"}}")).as_deref(),
        Some("1"),
        "{text}"
    );
    assert_eq!(common::sample(text, "hvstats_read_errors").as_deref(), Some(read_errors), "{text}");
    let took: f64 = common::sample(text, "hvstats_scrape_duration_seconds").unwrap().parse().unwrap();
    assert!(took > 0.0 && took < 10.0, "{took}");
}

#[test]
fn an_empty_runtime_directory_serves_the_exporter_alone_and_a_missing_one_is_an_error() {
    let tmp = TempDir::new("serve-empty");
    let (_serve, addr) = serve(tmp.path(), &[]);
    let (status, _, text) = get_openmetrics(addr, "/metrics");
    assert_eq!(status, 200);
    assert_exporter_series(&text, "0");
    assert!(!text.contains("_up{"), "{text}");
    assert_eq!(get(addr, "/healthz").0, 200);
    let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(common::EVERY_COLLECTOR)
        .arg("--runtime-dir")
        .arg(tmp.path().join("missing"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
}

#[test]
fn a_runtime_directory_refused_is_a_metric_and_unhealthy_not_an_empty_reply() {
    let parent = TempDir::new("serve-dir-gone");
    let dir = parent.path().join("run");
    std::fs::create_dir(&dir).unwrap();
    let (_serve, addr) = serve(&dir, &["--snapshot-api"]);
    assert_eq!(get(addr, "/healthz").0, 200);
    // Made writable by others after the start: its checks refuse it from then on.
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let (status, _, text) = get_openmetrics(addr, "/metrics");
    assert_eq!(status, 200);
    assert_exporter_series(&text, "1");
    let (status, _, body) = get(addr, "/healthz");
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("unhealthy: nothing could be read"), "{body}");
    assert!(body.contains(&format!("problem: cannot read {}", dir.display())), "{body}");
    assert_eq!(get(addr, "/api/v1/snapshot").0, 503);
}

#[test]
fn a_user_who_may_read_no_instance_gets_an_unhealthy_exporter_and_down_instances() {
    let setpriv = "/usr/bin/setpriv";
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    if !root || !Path::new(setpriv).exists() {
        eprintln!("skipped: needs root and {setpriv} to serve as another user");
        return;
    }
    let tmp = TempDir::new("serve-nobody");
    std::fs::set_permissions(tmp.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (hv, _part) = published(tmp.path(), 1);
    let i = instance_name(&hv);
    // `serve` as nobody: the instance's files are root's, mode 0600.
    let mut child = Command::new(setpriv)
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_hvstats"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(common::EVERY_COLLECTOR)
        .arg("--runtime-dir")
        .arg(tmp.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = common::serving_addr(&mut child);
    let _server = KilledOnDrop(child);
    let (status, _, text) = get_openmetrics(addr, "/metrics");
    assert_eq!(status, 200);
    assert_exporter_series(&text, "1");
    assert_eq!(
        common::sample(&text, &format!("hvstats_instance_up{{publisher=\"{i}\"}}")).as_deref(),
        Some("0"),
        "{text}"
    );
    let (status, _, body) = get(addr, "/healthz");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("Permission denied"), "{body}");
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

/// Asks Prometheus `query` until it answers one sample equal to `expected` (or 60 s pass).
fn query_until(prometheus: SocketAddr, query: &str, expected: &str) -> String {
    let encoded = common::url_encoded(query);
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
    let config = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: hvstats\n    static_configs:\n      \
         - targets: ['{addr_a}', '{addr_b}']\n"
    );
    let (_prometheus, web) = start_prometheus(prometheus, &config, work.path());
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
    // The exporter's own series, and the VM info series joined on the VM's name, as the guide's
    // query does it.
    query_until(web, "count(hvstats_build_info == 1)", "2");
    query_until(web, "sum(hvstats_read_errors)", "0");
    query_until(
        web,
        "sum(hvstats_vp_intercepts_total{intercept=\"cpuid\"} * on (instance, vm) group_left hvstats_vm_info)",
        "1239",
    );
}

// Hostile clients. The exporter listens to peers it does not control: each test below is one
// attack, made with real sockets against the real server, and checks that the server stays
// alive, answers others in time, and holds no more than its limits let a client make it hold.

/// `hvstats serve` started by a shell that first sets `ulimit -n nofile`; its standard error is
/// kept in `stderr`.
fn serve_limited(dir: &Path, extra: &[&str], nofile: u32, stderr: &Path) -> (KilledOnDrop, SocketAddr) {
    // Every collector: the replies are as large as a host's can be.
    let mut script = format!(
        "ulimit -n {nofile} && exec \"$0\" serve --listen 127.0.0.1:0 {} --runtime-dir \"$1\"",
        common::EVERY_COLLECTOR.join(" ")
    );
    for (n, _) in extra.iter().enumerate() {
        script.push_str(&format!(" \"${}\"", n + 2));
    }
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_hvstats"))
        .arg(dir)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(stderr).unwrap())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("serving http://").and_then(|s| s.strip_suffix("/metrics"));
    let addr = addr.unwrap_or_else(|| panic!("unexpected first line {line:?}")).parse().unwrap();
    (KilledOnDrop(child), addr)
}

impl KilledOnDrop {
    fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Panics when the server has exited.
    fn assert_alive(&mut self) {
        assert_eq!(self.0.try_wait().unwrap(), None, "the server exited");
    }

    /// The sockets the server holds open (the listener included).
    fn sockets(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|target| target.to_string_lossy().starts_with("socket:"))
            .count()
    }

    fn descriptors(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid())).unwrap().count()
    }

    /// Waits (up to `within`) until the server used no CPU for half a second.
    fn cpu_settles(&self, within: Duration) {
        let ticks = || {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
            // After the command's closing parenthesis, field 3 (the state) comes first: utime and
            // stime (fields 14 and 15) are the 12th and 13th.
            let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
            fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
        };
        let deadline = Instant::now() + within;
        let mut last = ticks();
        loop {
            std::thread::sleep(Duration::from_millis(500));
            let now = ticks();
            if now == last || Instant::now() > deadline {
                return;
            }
            last = now;
        }
    }

    fn threads(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/task", self.pid())).unwrap().count()
    }

    /// Waits up to `within` for the server to hold at least `sockets` sockets.
    fn sockets_settle_at(&self, sockets: usize, within: Duration) {
        let deadline = Instant::now() + within;
        while self.sockets() < sockets && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits up to `within` for the server to hold at most `sockets` sockets; returns how many
    /// it holds.
    fn sockets_settle(&self, sockets: usize, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        loop {
            let now = self.sockets();
            if now <= sockets || Instant::now() > deadline {
                return now;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A scrape of `/metrics` that must succeed within `deadline`; returns the body's length.
fn scrape_within(addr: SocketAddr, deadline: Duration) -> usize {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(deadline)).unwrap();
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut reply = Vec::new();
    let read = stream.read_to_end(&mut reply);
    let took = started.elapsed();
    assert!(read.is_ok() && took < deadline, "the scrape took {took:?}: {read:?}");
    let text = String::from_utf8_lossy(&reply);
    assert!(
        text.starts_with("HTTP/1.1 200") || text.starts_with("HTTP/1.0 200"),
        "{}",
        &text[..text.len().min(300)]
    );
    reply.len()
}

/// Sends `request` on a new connection and reads until the server closes it (within `within`);
/// returns what it answered.
fn exchange(addr: SocketAddr, request: &[u8], within: Duration) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(within)).unwrap();
    // The server may close before it has read everything: a reset is an answer too.
    let _ = stream.write_all(request);
    let mut reply = Vec::new();
    match stream.read_to_end(&mut reply) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the server kept the connection open past {within:?}: {e}"),
    }
    String::from_utf8_lossy(&reply).into_owned()
}

#[test]
fn a_huge_declared_body_is_never_allocated() {
    let tmp = TempDir::new("serve-huge-body");
    let _published = published(tmp.path(), 1);
    let (mut server, addr) = serve(tmp.path(), &[]);
    scrape_within(addr, Duration::from_secs(5));
    let before = common::rss_anon_kib(server.pid()).unwrap();
    let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000000\r\n\r\n";
    let reply = exchange(addr, request, Duration::from_secs(5));
    assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
    // A POST with the same claim: refused by method, its body unread.
    let request = b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000000\r\n\r\nabc";
    let reply = exchange(addr, request, Duration::from_secs(5));
    assert!(reply.starts_with("HTTP/1.1 405"), "{reply}");
    server.assert_alive();
    scrape_within(addr, Duration::from_secs(5));
    let after = common::rss_anon_kib(server.pid()).unwrap();
    assert!(after < before + 16 * 1024, "heap grew from {before} KiB to {after} KiB");
}

#[test]
fn a_client_that_never_sends_its_declared_body_delays_no_other_scrape() {
    let tmp = TempDir::new("serve-slow-body");
    let _published = published(tmp.path(), 2);
    let (mut server, addr) = serve(tmp.path(), &[]);
    // Several of them, each holding its connection with a body it will never send.
    let mut slow = Vec::new();
    for _ in 0..4 {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n0123").unwrap();
        slow.push(stream);
    }
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..5 {
        scrape_within(addr, Duration::from_secs(2));
    }
    server.assert_alive();
}

/// Caps what the kernel buffers for `stream` (and stops it growing the window on loopback).
fn small_receive_buffer(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let size: libc::c_int = 16 * 1024;
    // SAFETY: the fd is our open socket; the option value is a c_int of the length we pass.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
}

#[test]
fn a_client_that_never_reads_a_large_reply_delays_no_other_scrape_and_is_dropped() {
    let tmp = TempDir::new("serve-no-reader");
    // 256 VPs: a /metrics larger than the server's send buffer (at most 4 MiB, net.ipv4.tcp_wmem)
    // and the stalled clients' receive buffers (16 KiB, set below) can hold.
    let _published = published(tmp.path(), 256);
    let (mut server, addr) = serve(tmp.path(), &[]);
    let size = scrape_within(addr, Duration::from_secs(10));
    assert!(size > 6 << 20, "/metrics is only {size} bytes: too small to fill the socket buffers");
    let idle = server.sockets();
    let mut stalled = Vec::new();
    for _ in 0..3 {
        let mut stream = TcpStream::connect(addr).unwrap();
        small_receive_buffer(&stream);
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        stalled.push(stream);
    }
    // Their replies are read and encoded (one scrape's work each, seconds on a loaded machine),
    // then stall in the write: wait until the server stops using the CPU.
    server.cpu_settles(Duration::from_secs(20));
    assert_eq!(server.sockets(), idle + 3, "the stalled replies are being written");
    scrape_within(addr, Duration::from_secs(5));
    // A reply that makes no progress for the write timeout (10 s) closes its connection.
    let left = server.sockets_settle(idle, Duration::from_secs(14));
    assert_eq!(left, idle, "connections of clients that never read are still open");
    server.assert_alive();
    drop(stalled);
}

#[test]
fn http2_and_junk_leak_no_thread_and_no_descriptor() {
    let tmp = TempDir::new("serve-junk");
    let _published = published(tmp.path(), 1);
    let (mut server, addr) = serve(tmp.path(), &[]);
    scrape_within(addr, Duration::from_secs(5));
    let (threads, descriptors) = (server.threads(), server.descriptors());
    let attacks: [&[u8]; 5] = [
        b"GET /metrics HTTP/2.0\r\nHost: x\r\n\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
        b"GET /metrics\r\n\r\n",
        b"\x00\x01\x02\x03\r\n\r\n",
    ];
    for round in 0..60 {
        for attack in attacks {
            let reply = exchange(addr, attack, Duration::from_secs(5));
            assert!(
                reply.is_empty() || reply.starts_with("HTTP/1.1 4") || reply.starts_with("HTTP/1.1 5"),
                "round {round}: {reply}"
            );
        }
    }
    // 300 requests later: the connections are gone, and so are their descriptors.
    server.sockets_settle(1, Duration::from_secs(2));
    assert!(
        server.descriptors() <= descriptors,
        "{} descriptors, {descriptors} before",
        server.descriptors()
    );
    assert!(server.threads() <= threads.max(4), "{} threads, {threads} before", server.threads());
    server.assert_alive();
    scrape_within(addr, Duration::from_secs(5));
}

#[test]
fn above_the_connection_cap_scrapes_get_through_and_the_silent_are_closed_as_their_grace_ends_logged_once() {
    let tmp = TempDir::new("serve-cap-connections");
    let _published = published(tmp.path(), 1);
    let log = tmp.path().join("serve.log");
    let (mut server, addr) = serve_limited(tmp.path(), &["--max-connections", "8"], 1024, &log);
    // The cap held by others: four asked once and keep their connections alive (as a client
    // asking every 8 s does), four drip a request head that never ends.
    let mut hostile = Vec::new();
    for n in 0..8 {
        let mut stream = TcpStream::connect(addr).unwrap();
        let head: &[u8] = if n % 2 == 0 { b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" } else { b"GET /heal" };
        stream.write_all(head).unwrap();
        hostile.push(stream);
    }
    server.sockets_settle_at(9, Duration::from_secs(5));
    // Four more above the cap that send nothing: taken in, not left in the listen backlog.
    let silent: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(addr).unwrap()).collect();
    server.sockets_settle_at(13, Duration::from_secs(5));
    // Scrapes get through meanwhile, none refused.
    for _ in 0..6 {
        scrape_within(addr, Duration::from_secs(10));
    }
    // The silent ones are closed by the cap (at once, a reset), not by the 3 s deadline on a first
    // request head (a close): the cap closes them as their 1 s grace ends.
    for mut s in &silent {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 4096];
        let read = s.read(&mut buf).map_err(|e| e.kind());
        assert_eq!(read, Err(std::io::ErrorKind::ConnectionReset), "a silent connection above the cap");
    }
    server.assert_alive();
    let said = std::fs::read_to_string(&log).unwrap();
    assert_eq!(said.matches("closing the idlest").count(), 1, "{said}");
    drop(hostile);
}

#[test]
fn a_long_request_line_without_an_end_is_refused_before_it_is_buffered() {
    let tmp = TempDir::new("serve-long-line");
    let _published = published(tmp.path(), 1);
    let (mut server, addr) = serve(tmp.path(), &[]);
    scrape_within(addr, Duration::from_secs(5));
    let before = common::rss_anon_kib(server.pid()).unwrap();
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    stream.write_all(b"GET /").unwrap();
    let chunk = vec![b'a'; 1 << 20];
    let mut sent = 0usize;
    while sent < 400 << 20 {
        match stream.write(&chunk) {
            Ok(n) => sent += n,
            Err(_) => break,
        }
    }
    assert!(sent < 64 << 20, "the server took {sent} bytes of one request line");
    let after = common::rss_anon_kib(server.pid()).unwrap();
    assert!(after < before + 16 * 1024, "heap grew from {before} KiB to {after} KiB");
    server.assert_alive();
    scrape_within(addr, Duration::from_secs(5));
}

#[test]
fn running_out_of_descriptors_is_logged_and_survived() {
    let tmp = TempDir::new("serve-emfile");
    let _published = published(tmp.path(), 1);
    let log = tmp.path().join("serve.log");
    let (mut server, addr) = serve_limited(tmp.path(), &[], 40, &log);
    scrape_within(addr, Duration::from_secs(5));
    // More connections than descriptors: accept fails with EMFILE until some close.
    let held: Vec<TcpStream> = (0..60).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(&log).unwrap().contains("cannot accept a connection") {
        assert!(
            Instant::now() < deadline,
            "no accept failure logged: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server.assert_alive();
    drop(held);
    // Within the longest backoff (1 s) and the backlog's drain, scrapes succeed again.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stream = TcpStream::connect(addr).unwrap();
        drop(stream);
        if let Ok(reply) = std::panic::catch_unwind(|| scrape_within(addr, Duration::from_secs(2))) {
            assert!(reply > 0);
            break;
        }
        assert!(Instant::now() < deadline, "no scrape succeeded after the descriptors were freed");
    }
    server.assert_alive();
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("Too many open files"), "{said}");
}

#[test]
fn sigterm_and_sigint_stop_serve_within_a_second_and_remove_the_observer_instance() {
    for signal in ["TERM", "INT"] {
        let tmp = TempDir::new("serve-signal");
        let me = std::process::id().to_string();
        let (mut server, addr) =
            serve(tmp.path(), &["--observe-all", "--observe-interval", "0.2", "--vm", &me]);
        // The observer's instance appears; an idle client holds a connection.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_dir(tmp.path()).unwrap().count() == 0 {
            assert!(Instant::now() < deadline, "the observer published nothing");
            std::thread::sleep(Duration::from_millis(50));
        }
        let _idle = TcpStream::connect(addr).unwrap();
        scrape_within(addr, Duration::from_secs(5));
        let asked = Instant::now();
        let status =
            Command::new("kill").arg(format!("-{signal}")).arg(server.pid().to_string()).status().unwrap();
        assert!(status.success());
        let exit = loop {
            if let Some(exit) = server.0.try_wait().unwrap() {
                break exit;
            }
            assert!(asked.elapsed() < Duration::from_secs(1), "SIG{signal}: still running after 1 s");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(exit.success(), "SIG{signal}: {exit:?}");
        let instances = tmp.path().join("instances");
        let left: Vec<_> = std::fs::read_dir(instances).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(left.is_empty(), "SIG{signal}: the observer's instance is left behind: {left:?}");
    }
}

/// Two publishers on one host have the same logical processors: each LP's series comes once,
/// without a publisher label, so a sum over the host counts each CPU once.
#[test]
fn logical_processors_are_exported_once_per_host_not_once_per_publisher() {
    let tmp = TempDir::new("serve-lps-once");
    let a = common::publish(tmp.path());
    let b = common::publish(tmp.path());
    let (_serve, addr) = serve(tmp.path(), &[]);
    let (status, _, text) = get(addr, "/metrics");
    assert_eq!(status, 200);
    let lp_lines: Vec<&str> =
        text.lines().filter(|l| l.starts_with("hvstats_lp_") && !l.starts_with('#')).collect();
    assert!(!lp_lines.is_empty(), "{text}");
    assert!(lp_lines.iter().all(|l| !l.contains("publisher=")), "{lp_lines:#?}");
    // Each LP series once: no two lines with the same name and labels.
    let mut series: Vec<&str> = lp_lines.iter().map(|l| l.rsplit_once(' ').unwrap().0).collect();
    let all = series.len();
    series.sort_unstable();
    series.dedup();
    assert_eq!(series.len(), all, "{lp_lines:#?}");
    // The hypervisor objects stay per publisher: each has its own partitions and VPs.
    for hv in [&a, &b] {
        let name = instance_name(hv);
        assert!(text.lines().any(|l| l.starts_with("hvstats_hypervisor_") && l.contains(&name)), "{text}");
    }
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
    let _i = instance_name(&hv);
    let p = part.id();
    let labels = |vp: u32| format!("vm=\"partition-{p}\",vp=\"{vp}\"");
    let cpuid = format!("hvstats_vp_intercepts_total{{{},intercept=\"cpuid\"}}", labels(0));
    assert_eq!(common::sample(&text, &cpuid).as_deref(), Some("12"), "{text}");
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
    assert_eq!(common::sample(&text, &dispatches).as_deref(), Some("40"), "{text}");
}

/// Reads one HTTP/1.1 response (head and `Content-Length` body) from `reader`; its status.
fn read_response(reader: &mut BufReader<TcpStream>) -> Option<u16> {
    let mut status = None;
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if status.is_none() {
            status = line.split_whitespace().nth(1)?.parse().ok();
        } else if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().ok()?;
        }
    }
    std::io::copy(&mut reader.by_ref().take(length as u64), &mut std::io::sink()).ok()?;
    status
}

/// `GET path` on a new connection that must be answered within `deadline` (a hang guard):
/// its status and body.
fn answered_within(addr: SocketAddr, path: &str, deadline: Duration) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(deadline)).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut reply = Vec::new();
    let read = stream.read_to_end(&mut reply);
    assert!(read.is_ok(), "{path} was not answered within {deadline:?}: {read:?}");
    let text = String::from_utf8_lossy(&reply).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0), body.to_owned())
}

/// The attack of 64 keep-alive connections pipelining snapshots of a host publishing 16,384 VPs:
/// the snapshot is capped (and says so), `/metrics` and `/healthz` answer during the attack and
/// right after it, the server's memory stays bounded, and SIGTERM still stops it within a second.
#[test]
fn pipelined_snapshots_on_every_connection_stop_no_scrape_and_hold_bounded_memory() {
    let tmp = TempDir::new("serve-snapshot-attack");
    let hv = common::publish(tmp.path());
    let partitions: Vec<_> = (0..64).map(|_| hv.create_partition(256).unwrap()).collect();
    let (mut server, addr) = serve(tmp.path(), &["--snapshot-api", "--max-vps", "512"]);
    let (status, body) = answered_within(addr, "/api/v1/snapshot", Duration::from_secs(60));
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((v["max_vps"].as_u64(), v["vps_left_out"].as_u64()), (Some(512), Some(16_384 - 512)));
    let shown: usize = v["instances"][0]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["vps"].as_array().unwrap().len())
        .sum();
    assert_eq!(shown, 512);

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let attackers: Vec<_> = (0..64)
        .map(|_| {
            let (stop, answered) = (stop.clone(), answered.clone());
            std::thread::spawn(move || {
                let Ok(stream) = TcpStream::connect(addr) else { return };
                let mut writer = stream.try_clone().unwrap();
                let mut reader = BufReader::new(stream);
                let request = b"GET /api/v1/snapshot HTTP/1.1\r\nHost: x\r\n\r\n";
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Four pipelined at a time, then their answers.
                    if writer.write_all(&request.repeat(4)).is_err() {
                        return;
                    }
                    for _ in 0..4 {
                        if read_response(&mut reader).is_none() {
                            return;
                        }
                        answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    // During the attack: the scrapes and health checks are answered (a hang guard, not a timing).
    let started = Instant::now();
    while answered.load(std::sync::atomic::Ordering::Relaxed) < 64
        && started.elapsed() < Duration::from_secs(120)
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    for _ in 0..2 {
        assert_eq!(answered_within(addr, "/healthz", Duration::from_secs(30)).0, 200);
        let (status, text) = answered_within(addr, "/metrics", Duration::from_secs(30));
        assert_eq!(status, 200);
        assert!(text.contains("hvstats_vp_hypercalls_total{"), "{}", &text[..text.len().min(300)]);
    }
    let peak = peak_rss_kib(server.pid());
    eprintln!("serve peak resident memory under the attack: {peak} KiB");
    // SIGTERM under that load: stopped within a second, as SECURITY.md says.
    let asked = Instant::now();
    assert!(Command::new("kill").arg("-TERM").arg(server.pid().to_string()).status().unwrap().success());
    let exit = loop {
        if let Some(exit) = server.0.try_wait().unwrap() {
            break exit;
        }
        assert!(asked.elapsed() < Duration::from_secs(1), "still running 1 s after SIGTERM under load");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "{exit:?}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for a in attackers {
        let _ = a.join();
    }
    assert!(answered.load(std::sync::atomic::Ordering::Relaxed) >= 64, "the attackers got no answers");
    assert!(peak < 256 * 1024, "serve grew to {peak} KiB under the attack");
    drop(partitions);
}

/// The peak resident memory of process `pid` so far (VmHWM), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// After the attack ends, health is answered at once (no queue of readings left behind).
#[test]
fn health_is_answered_right_after_an_attack_of_pipelined_requests_ends() {
    let tmp = TempDir::new("serve-after-attack");
    let hv = common::publish(tmp.path());
    let _partitions: Vec<_> = (0..16).map(|_| hv.create_partition(256).unwrap()).collect();
    let (mut server, addr) = serve(tmp.path(), &["--snapshot-api", "--max-vps", "256"]);
    // 64 connections each pipelining 16 requests, then gone without reading the answers.
    for _ in 0..64 {
        let mut stream = TcpStream::connect(addr).unwrap();
        let _ = stream.write_all(&b"GET /api/v1/snapshot HTTP/1.1\r\nHost: x\r\n\r\n".repeat(16));
    }
    let (status, body) = answered_within(addr, "/healthz", Duration::from_secs(30));
    assert_eq!((status, body.as_str()), (200, "ok: 1 instances, 4096 VPs\n"));
    server.assert_alive();
}

/// A client that asks for `/metrics` and then reads its reply slowly (never stalled, so no write
/// timeout ends it): holds its reply for as long as it likes, unless the server's
/// budget of reply bytes closes it. Returns (bytes of the reply, bytes received, closed early).
fn trickling_reader(
    addr: SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (std::thread::JoinHandle<(usize, usize, bool)>, std::sync::mpsc::Receiver<()>) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let (headed, head_arrived) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        stream.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let (mut received, mut head, mut length) = (0usize, Vec::new(), None::<usize>);
        // At most 64 KiB a turn, a turn each 100 ms: fast enough that no write waits 10 s even on
        // a loaded machine, slow enough to hold the reply through the next two readings.
        let mut buf = vec![0u8; 64 << 10];
        let mut turn = 0usize;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            match stream.read(&mut buf) {
                Ok(0) => return (length.unwrap_or(0), received, length.is_some_and(|l| received < l)),
                Ok(n) if length.is_none() => {
                    head.extend_from_slice(&buf[..n]);
                    if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                        let text = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
                        let l =
                            text.lines().find_map(|l| l.strip_prefix("content-length:")?.trim().parse().ok());
                        length = l;
                        received = head.len() - end - 4;
                        let _ = headed.send(());
                    }
                }
                Ok(n) => {
                    received += n;
                    turn += n;
                    // The rest of this turn's 64 KiB, if it is there already.
                    if turn < 64 << 10 {
                        continue;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return (length.unwrap_or(0), received, true);
                }
                Err(_) => {}
            }
            turn = 0;
            std::thread::sleep(Duration::from_millis(100));
        }
        (length.unwrap_or(0), received, false)
    });
    (thread, head_arrived)
}

/// Replies held by clients that read them slowly are bounded: past `--max-reply-bytes` of replies
/// in flight, the connection that has held its reply longest is closed, and the others go on.
#[test]
fn replies_held_by_slow_readers_stay_within_the_budget_by_closing_the_longest_held() {
    let tmp = TempDir::new("serve-reply-budget");
    let hv = common::publish(tmp.path());
    let _partitions: Vec<_> = (0..12).map(|_| hv.create_partition(100).unwrap()).collect();
    let log = tmp.path().join("serve.log");
    let budget = (48 << 20).to_string();
    let (mut server, addr) = serve_limited(tmp.path(), &["--max-reply-bytes", &budget], 1024, &log);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Three of them, one after the other: three readings, three replies of 1,200 VPs each.
    let mut readers = Vec::new();
    for n in 0..3 {
        let (reader, head_arrived) = trickling_reader(addr, stop.clone());
        // Its reply begins before the next one asks (a hang guard, not a timing).
        assert!(head_arrived.recv_timeout(Duration::from_secs(120)).is_ok(), "reply {n} never began");
        readers.push(reader);
    }
    // The first reply was closed while the third was made: its reader sees the end soon.
    std::thread::sleep(Duration::from_secs(1));
    let health = answered_within(addr, "/healthz", Duration::from_secs(30));
    assert_eq!(health.0, 200, "{health:?} {}", std::fs::read_to_string(&log).unwrap());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let results: Vec<(usize, usize, bool)> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let reply = results[0].0;
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        reply > 24 << 20 && reply < 48 << 20,
        "a reply of {reply} bytes does not test the budget: {results:?} {said}"
    );
    assert!(results[0].2, "the longest-held reply was not closed: {results:?} {said}");
    assert!(!results[2].2, "the newest reply was closed: {results:?}");
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains(&format!("replies in flight passed {budget} bytes")), "{said}");
    server.assert_alive();
}
