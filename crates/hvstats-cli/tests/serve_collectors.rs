//! `serve`'s collectors, formats and compression: what a default scrape carries (the mixin's
//! series, at most 20 per VP, no buckets), the flags and scrape parameters that change it, gzip
//! when the scraper accepts it, the protobuf format with native histograms, and a real
//! Prometheus with native histograms on reading them.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{TempDir, serve};
use hvstats_abi::catalog::vp;
use hvstats_abi::histogram::Log2Histogram;
use serde_json::Value;

/// A reply: status, headers (lower-case names), body bytes.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap()
    }
}

/// `GET path` with `headers`, over HTTP/1.0 (the body ends with the connection).
fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).unwrap();
    let end = reply.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&reply[..end]).into_owned();
    let mut lines = head.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Reply { status, headers, body: reply[end + 4..].to_vec() }
}

/// The sample lines of a text exposition.
fn samples(text: &str) -> Vec<&str> {
    text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')).collect()
}

/// The series of `text` of VP `vp` (label `vp="N"`).
fn of_vp(text: &str, vp: u32) -> usize {
    samples(text).iter().filter(|l| l.contains(&format!("vp=\"{vp}\""))).count()
}

/// The histogram rows of a VP page.
fn histogram_rows() -> Vec<&'static hvstats_abi::Counter> {
    hvstats_abi::CATALOG
        .iter()
        .filter(|c| {
            c.id.kind == hvstats_abi::ObjectKind::Vp && c.presentation == hvstats_abi::Presentation::Histogram
        })
        .collect()
}

/// One partition of 4 VPs published under `dir`, every VP with counts and times in every
/// histogram (`times`, in ns).
fn four_vps(
    dir: &Path,
    times: &[u64],
) -> (std::sync::Arc<hvstats::Hypervisor>, std::sync::Arc<hvstats::PartitionStats>) {
    let (hv, part) = common::publish_partition(dir, 4);
    for n in 0..4 {
        let page = part.vp_page(n).unwrap();
        page.set(vp::HYPERCALLS, 10 + u64::from(n));
        page.set(vp::EXITS, 100);
        for c in histogram_rows() {
            for &ns in times {
                page.record_time(c.id, ns);
            }
        }
    }
    (hv, part)
}

#[test]
fn a_default_scrape_carries_at_most_20_series_per_vp_and_no_buckets_and_flags_bring_the_rest() {
    let tmp = TempDir::new("collectors-default");
    let (_hv, _part) = four_vps(tmp.path(), &[900, 1_500, 70_000]);
    let (_default, addr) = serve(tmp.path(), &[]);
    let text = get(addr, "/metrics", &[]).text();
    let per_vp: Vec<usize> = (0..4).map(|n| of_vp(&text, n)).collect();
    eprintln!("default: {per_vp:?} series per VP, {} in all, {} bytes", samples(&text).len(), text.len());
    assert!(per_vp.iter().all(|&n| (10..=20).contains(&n)), "{per_vp:?}\n{text}");
    assert!(!text.contains("_bucket{"), "{text}");
    assert!(text.contains("\nhvstats_vp_hypercalls_total{vm=\""), "{text}");
    assert!(!text.contains("hvstats_lp_") && !text.contains("hvstats_hypervisor_"), "{text}");

    // --collector.histograms brings every VP's buckets back.
    let (_hist, hist_addr) = serve(tmp.path(), &["--collector.histograms"]);
    let hist = get(hist_addr, "/metrics", &[]).text();
    let buckets = samples(&hist).iter().filter(|l| l.contains("_bucket{")).count();
    assert_eq!(buckets, 4 * histogram_rows().len() * hvstats_abi::histogram::BUCKETS, "{hist}");

    // collect[] narrows a scrape, exclude[] leaves collectors out; names are checked.
    let narrow = get(addr, "/metrics?collect%5B%5D=vp", &[]).text();
    assert!(narrow.contains("hvstats_vp_exits_total{") && !narrow.contains("hvstats_build_info"), "{narrow}");
    assert!(!narrow.contains("hvstats_vm_up"), "{narrow}");
    let excluded = get(addr, "/metrics?exclude[]=vp&exclude[]=vm", &[]).text();
    assert!(!excluded.contains("hvstats_vp_") && excluded.contains("hvstats_build_info"), "{excluded}");
    let unknown = get(addr, "/metrics?collect[]=vp-detial", &[]);
    assert_eq!(unknown.status, 400);
    assert!(
        unknown.text().contains("unknown collector \"vp-detial\"") && unknown.text().contains("vp-detail")
    );
    let disabled = get(addr, "/metrics?collect[]=histograms", &[]);
    assert_eq!(disabled.status, 400);
    assert!(disabled.text().contains("--collector.histograms"), "{}", disabled.text());
    let many = format!("/metrics?{}", vec!["exclude[]=lp"; 40].join("&"));
    assert_eq!(get(addr, &many, &[]).status, 400);

    // --collector.disable-defaults with one collector; --no-collector.X.
    let (_only, only_addr) = serve(tmp.path(), &["--collector.disable-defaults", "--collector.exporter"]);
    let only = get(only_addr, "/metrics", &[]).text();
    assert!(only.contains("hvstats_build_info") && !only.contains("hvstats_vp_"), "{only}");
    let (_no, no_addr) = serve(tmp.path(), &["--no-collector.vp"]);
    let no = get(no_addr, "/metrics", &[]).text();
    assert!(!no.contains("hvstats_vp_") && no.contains("hvstats_vm_up"), "{no}");
}

#[test]
fn an_unknown_collector_flag_is_a_usage_error_listing_the_collectors() {
    let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["serve", "--collector.histogram"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("--collector.histogram"), "{said}");
    assert!(said.contains("collectors: vp, vp-detail, vm, histograms, histograms-vm, lp"), "{said}");
}

#[test]
fn gzip_is_served_to_a_scraper_that_accepts_it_and_not_to_one_that_refuses_it() {
    let tmp = TempDir::new("collectors-gzip");
    let (_hv, _part) = four_vps(tmp.path(), &[900]);
    let (_serve, addr) = serve(tmp.path(), &["--collector.vp-detail"]);
    let plain = get(addr, "/metrics", &[]);
    assert_eq!(plain.header("content-encoding"), None);
    let zipped =
        get(addr, "/metrics", &[("Accept-Encoding", "gzip"), ("Accept", "application/openmetrics-text")]);
    assert_eq!(zipped.status, 200);
    assert_eq!(zipped.header("content-encoding"), Some("gzip"));
    assert!(zipped.header("vary").is_some_and(|v| v.contains("Accept-Encoding")), "{:?}", zipped.headers);
    let mut text = String::new();
    flate2::read::GzDecoder::new(zipped.body.as_slice()).read_to_string(&mut text).unwrap();
    assert!(text.ends_with("# EOF\n"));
    // The same series (two readings apart: the exporter's scrape time differs).
    let names = |t: &str| -> BTreeSet<String> {
        samples(t).iter().map(|l| l.rsplit_once(' ').unwrap().0.to_owned()).collect()
    };
    let plain_text = plain.text();
    assert_eq!(names(&text), names(&plain_text));
    assert!(zipped.body.len() * 4 < text.len(), "{} gzipped of {}", zipped.body.len(), text.len());
    let refused = get(addr, "/metrics", &[("Accept-Encoding", "gzip;q=0, identity")]);
    assert_eq!(refused.header("content-encoding"), None);
    assert!(refused.text().contains("hvstats_vp_exits_total{"));
}

#[test]
fn a_scraper_negotiating_protobuf_gets_native_histograms() {
    let tmp = TempDir::new("collectors-protobuf");
    let (_hv, _part) = four_vps(tmp.path(), &[0, 900, 1_500, 70_000]);
    let (_serve, addr) = serve(tmp.path(), &["--collector.histograms"]);
    let accept = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,\
                  text/plain;version=0.0.4;q=0.3";
    let reply = get(addr, "/metrics", &[("Accept", accept)]);
    assert_eq!(reply.status, 200);
    assert!(
        reply.header("content-type").unwrap().starts_with("application/vnd.google.protobuf"),
        "{:?}",
        reply.headers
    );
    let families = hvstats_present::protobuf::decode(&reply.body).unwrap();
    let family = |name: &str| families.iter().find(|f| f.name.as_deref() == Some(name)).unwrap();
    let hypercalls = family("hvstats_vp_hypercalls_total");
    let values: Vec<f64> = hypercalls.metric.iter().filter_map(|m| m.counter.as_ref()?.value).collect();
    assert_eq!(values, [10.0, 11.0, 12.0, 13.0]);
    let h = family("hvstats_vp_hypercall_duration_seconds");
    let native = h.metric[0].histogram.as_ref().unwrap();
    assert_eq!((native.schema, native.sample_count, native.zero_count), (Some(0), Some(4), Some(1)));
    assert_eq!(native.sample_sum, Some(72_400.0 / 1e9));
    assert!(!families.iter().any(|f| f.name.as_deref().is_some_and(|n| n.ends_with("_bucket"))));
}

/// Prometheus' answer to an instant `query`: the value of its one series, or why not.
fn query(prometheus: SocketAddr, q: &str) -> Result<f64, String> {
    if std::net::TcpStream::connect(prometheus).is_err() {
        return Err("not listening yet".into());
    }
    let reply = common::http_get(prometheus, &format!("/api/v1/query?query={}", common::url_encoded(q)));
    let body = reply.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let v: Value = serde_json::from_str(body).map_err(|e| format!("{e}: {reply}"))?;
    let result = v["data"]["result"].as_array().ok_or(format!("{v}"))?;
    match result.as_slice() {
        [one] => one["value"][1].as_str().and_then(|s| s.parse().ok()).ok_or(format!("{v}")),
        _ => Err(format!("{} series: {v}", result.len())),
    }
}

#[test]
fn prometheus_with_native_histograms_reads_hvstats_histograms_as_native_ones() {
    let test = "prometheus_with_native_histograms_reads_hvstats_histograms_as_native_ones";
    let Some(prometheus) = common::prometheus_tool("prometheus", test) else { return };
    let (tmp, work) = (TempDir::new("native-runtime"), TempDir::new("native-work"));
    // Two times in bucket 11 ([1024, 2048) ns), one in bucket 17, one of 0 ns: cumulative counts
    // 1, 3 and 4, so quantiles 0.75 and 1 end a bucket.
    let times = [0, 1_024, 1_500, 70_000];
    let (_hv, _part) = four_vps(tmp.path(), &times);
    let (_serve, addr) = serve(tmp.path(), &["--collector.histograms"]);
    let config = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: hvstats\n    static_configs:\n      - targets: ['{addr}']\n"
    );
    let (_prometheus, web) = common::start_prometheus_with(
        prometheus,
        &config,
        work.path(),
        &["--enable-feature=native-histograms"],
    );
    let mut page = Log2Histogram::default();
    for ns in times {
        page.record(ns);
    }
    let series = "hvstats_vp_hypercall_duration_seconds{vp=\"2\"}";
    let deadline = Instant::now() + Duration::from_secs(120);
    let until = |q: &str| loop {
        match query(web, q) {
            Ok(v) => return v,
            Err(e) if Instant::now() > deadline => panic!("{q}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(300)),
        }
    };
    assert_eq!(until(&format!("histogram_count({series})")), page.count() as f64);
    assert_eq!(until(&format!("histogram_sum({series})")), page.sum_ns as f64 / 1e9);
    // A quantile whose rank ends a bucket is that bucket's upper bound, interpolated or not: the
    // page's quantile bucket `i` is native bucket i - 30, whose upper bound is 2^(i-30) s.
    for q in [0.75, 1.0] {
        let bucket = page.quantile_bucket(q).unwrap() as i32;
        let expected = 2f64.powi(bucket - hvstats_present::protobuf::INDEX_SHIFT);
        assert_eq!(until(&format!("histogram_quantile({q}, {series})")), expected, "q={q}");
    }
    // No classic buckets were ingested: the histogram is native.
    let classic = query(web, "count(hvstats_vp_hypercall_duration_seconds_bucket)");
    assert!(classic.is_err(), "{classic:?}");
}

/// A host tree's cpuidle states of CPU 0 under `root` (as `/sys/devices/system/cpu`): each
/// (name, usage, time in µs).
fn cpuidle_tree(root: &Path, states: &[(&str, u64, u64)]) {
    for (n, (name, usage, time)) in states.iter().enumerate() {
        let dir = root.join(format!("cpu0/cpuidle/state{n}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("name"), format!("{name}\n")).unwrap();
        std::fs::write(dir.join("usage"), format!("{usage}\n")).unwrap();
        std::fs::write(dir.join("time"), format!("{time}\n")).unwrap();
    }
}

#[test]
fn no_lp_c_state_series_appears_on_a_host_that_lacks_the_state() {
    let (tmp, haltpoll, acpi) =
        (TempDir::new("lp-cstates"), TempDir::new("lp-haltpoll"), TempDir::new("lp-acpi"));
    let hv = common::publish(tmp.path());
    let sample = |tree: &Path| hvstats::lp::LpSample {
        global_time_100ns: 10_000_000,
        times: Some(hvstats::lp::CpuTimes { cpu: 0, user: 50, ..Default::default() }),
        ticks_per_second: 100,
        interrupts: Some(hvstats::lp::CpuInterrupts { local_timer: 7, ..Default::default() }),
        idle: hvstats::lp::read_idle_states(tree, 0),
    };
    // A guest's haltpoll driver: POLL and "haltpoll idle", no C-state.
    cpuidle_tree(haltpoll.path(), &[("POLL", 5, 70), ("haltpoll idle", 9, 110)]);
    hv.refresh_lps_with(&[sample(haltpoll.path())]);
    let (_serve, addr) = serve(tmp.path(), &["--collector.lp"]);
    let text = get(addr, "/metrics", &[]).text();
    assert!(text.contains("\nhvstats_lp_processor_halts_total{lp=\"0\",cpu=\"0\"} 14\n"), "{text}");
    assert!(text.contains("\nhvstats_lp_timer_interrupts_total{lp=\"0\",cpu=\"0\"} 7\n"), "{text}");
    for state in ["c1", "c2", "c3"] {
        assert!(
            !text.contains(&format!("hvstats_lp_{state}_")),
            "{state} series on a haltpoll host:\n{text}"
        );
    }
    // snapshot --json shows them null, and the halts measured.
    let json = common::snapshot_json(tmp.path()).to_string();
    for name in ["% C1 time", "C1 transitions/sec", "C3 transitions/sec"] {
        let key = common::total(name);
        assert!(json.contains(&format!("\"{key}\":null")), "{key}: {json}");
    }
    assert!(json.contains(&format!("\"{}\":14", common::total("Processor halts/sec"))), "{json}");

    // An ACPI host with C1 and C2 (no C3): those two are there, with their values.
    cpuidle_tree(acpi.path(), &[("POLL", 1, 1), ("C1", 4, 30), ("C2", 6, 500)]);
    hv.refresh_lps_with(&[sample(acpi.path())]);
    let text = get(addr, "/metrics", &[]).text();
    assert!(text.contains("\nhvstats_lp_c1_transitions_total{lp=\"0\",cpu=\"0\"} 4\n"), "{text}");
    assert!(text.contains("\nhvstats_lp_c2_transitions_total{lp=\"0\",cpu=\"0\"} 6\n"), "{text}");
    assert!(!text.contains("hvstats_lp_c3_"), "{text}");
}
