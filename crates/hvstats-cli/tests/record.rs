//! `hvstats record` of instances this test publishes, then `report` (exact totals) and `plot`
//! (PNG and SVG) of the recording; Ctrl-C ends a recording with a valid file.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use common::{TempDir, rss_anon_kib, write_1_0_vp_page};

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use hvstats::{Hypervisor, InstanceConfig};
use hvstats_abi::catalog::vp;
use serde_json::Value;

fn hvstats(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hvstats")).args(args).output().unwrap()
}

fn name(id: hvstats_abi::CounterId) -> &'static str {
    id.counter().unwrap().name
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Records 1.5 s of a 2-VP partition that makes 600 I/O exits (4.2 µs each) and 9 hypercalls on
/// VP 1 between the first and last sample (and, with `waits`, 30 dispatches that waited 60 µs in
/// all while it ran 420 µs); its IO time histogram records 98 times of 700 ns and 2 of 3 ms in that span (and 5 of
/// 90 ms, and one MSR access, before it); returns the recording's path and the VM name.
fn record_known_guest(tmp: &TempDir, waits: bool) -> (std::path::PathBuf, String) {
    let hv = Hypervisor::with_config(InstanceConfig {
        runtime_dir: Some(tmp.path().join("run")),
        logical_processors: Some(vec![0]),
        ..Default::default()
    })
    .unwrap();
    let part = hv.create_partition(2).unwrap();
    let page = part.vp_page(1).unwrap();
    page.set(vp::IO_INSTRUCTIONS, 1000);
    page.set(vp::IO_INSTRUCTIONS_COST, 5000);
    for _ in 0..5 {
        page.record_time(vp::IO_TIME_HISTOGRAM, 90_000_000);
    }
    page.record_time(vp::MSR_TIME_HISTOGRAM, 1_000);
    let file = tmp.path().join("rec.ndjson");
    let child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["record", "--interval", "0.25", "--duration", "1.5", "--runtime-dir"])
        .arg(tmp.path().join("run"))
        .arg("-o")
        .arg(&file)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once the first sample is on file, spread the traffic over the recording, before its last.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::fs::read_to_string(&file).map_or(0, |t| t.lines().count()) < 2 {
        assert!(std::time::Instant::now() < deadline, "no first sample");
        std::thread::sleep(Duration::from_millis(10));
    }
    for (fast, slow) in [(33, 0), (33, 0), (32, 2)] {
        std::thread::sleep(Duration::from_millis(300));
        for ns in std::iter::repeat_n(700, fast).chain(std::iter::repeat_n(3_000_000, slow)) {
            page.record_time(vp::IO_TIME_HISTOGRAM, ns);
        }
        page.add(vp::IO_INSTRUCTIONS, 200);
        page.add(vp::IO_INSTRUCTIONS_COST, 200 * 42);
        page.add(vp::HYPERCALLS, 3);
        if waits {
            // 20 µs of waiting for each 140 µs of running: 12.5 % of the runnable time.
            page.add(vp::DISPATCHES, 10);
            page.add(vp::CPU_WAIT_TIME_PER_DISPATCH, 10 * 2_000);
            page.add(vp::TOTAL_RUN_TIME, 1_400);
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let vm = format!("{}:{}", hv.published_name().unwrap(), part.id());
    (file, vm)
}

#[test]
fn record_then_report_gives_exact_totals_deltas_rates_and_costs() {
    let tmp = TempDir::new("record-report");
    let (file, vm) = record_known_guest(&tmp, true);

    let text = std::fs::read_to_string(&file).unwrap();
    let header: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(header["format"], "hvstats-recording");
    assert_eq!(header["catalog"]["groups"], "1.0");
    assert_eq!(
        header["catalog"]["vp"].as_array().unwrap().len(),
        hvstats_abi::catalog::counters_of(hvstats_abi::ObjectKind::Vp).count()
    );
    assert_eq!(header["catalog"]["vp"][2]["name"], name(vp::HYPERCALLS));
    assert_eq!(text.lines().count(), 1 + 7, "1.5 s every 0.25 s: 7 samples\n{text}");

    let out = hvstats(&["report", "--json", path(&file)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["samples"], 7);
    let vps = v["vps"].as_array().unwrap();
    assert_eq!(vps.len(), 2);
    let vp1 = vps.iter().find(|r| r["vp"] == 1).unwrap();
    assert_eq!(vp1["vm"], vm.as_str());
    assert_eq!(vp1["cumulative"][common::total(name(vp::IO_INSTRUCTIONS))], 1600);
    assert_eq!(vp1["cumulative"][common::total(name(vp::IO_INSTRUCTIONS_COST))], 5000 + 600 * 42);
    assert_eq!(vp1["cumulative"][common::total(name(vp::HYPERCALLS))], 9);
    assert_eq!(vp1["deltas"][common::delta(name(vp::IO_INSTRUCTIONS))], 600);
    assert_eq!(vp1["deltas"][common::delta(name(vp::HYPERCALLS))], 9);
    let seconds = vp1["seconds"].as_f64().unwrap();
    assert!((1.4..2.5).contains(&seconds), "{seconds}");
    let rate = vp1["rates_per_second"][common::presented(name(vp::IO_INSTRUCTIONS))].as_f64().unwrap();
    assert!((rate * seconds - 600.0).abs() < 1e-6, "{rate}");
    // 600 exits over 600 × 42 × 100 ns: 4,200 ns each.
    let cost = vp1["average_cost_ns"][common::presented(name(vp::IO_INSTRUCTIONS_COST))].as_f64().unwrap();
    assert!((cost - 4200.0).abs() < 1e-9, "{cost}");
    // 30 dispatches that waited 60 µs in all: 2,000 ns each.
    assert_eq!(vp1["cpu_wait"]["per_dispatch_ns"].as_f64().unwrap(), 2000.0);
    let waiting = vp1["cpu_wait"]["percent_of_time"].as_f64().unwrap();
    assert!((waiting * seconds - 60_000.0 / 1e9 * 100.0).abs() < 1e-12, "{waiting}");
    // Not maintained: null, not 0.
    assert_eq!(vp1["cumulative"][common::total(name(vp::DEBUG_REGISTER_ACCESSES))], Value::Null);
    assert!(vp1["deltas"].get(name(vp::DEBUG_REGISTER_ACCESSES)).is_none());
    assert_eq!(vp1["cpu_wait"]["dispatches"], 30);
    assert_eq!(vp1["cpu_wait"]["wait_ns"], 60_000);
    // Of the 480 µs it wanted a CPU (ran or waited), it waited 60: the share the mixin's
    // CPU-wait rule reads (vm:hvstats_cpu_wait:ratio1m).
    assert_eq!(vp1["cpu_wait"]["run_ns"], 420_000);
    assert_eq!(vp1["cpu_wait"]["percent_of_runnable"].as_f64().unwrap(), 12.5);
    // The IO time distribution over the recording: 98 in [512, 1024) ns, 2 in [2, 4) ms; the
    // 90 ms times and the MSR access came before the first sample.
    assert_eq!(v["format_version"], 2);
    assert_eq!(v["note"], Value::Null);
    let io = &vp1["histograms"][name(vp::IO_TIME_HISTOGRAM)];
    assert_eq!(io["count"], 100, "{vp1}");
    assert_eq!(io["sum_ns"], 98 * 700 + 2 * 3_000_000);
    assert_eq!(io["p50_ns"], 1023);
    assert_eq!(io["p99_ns"], 4_194_303);
    let msr = &vp1["histograms"][name(vp::MSR_TIME_HISTOGRAM)];
    assert_eq!((&msr["count"], &msr["p50_ns"]), (&Value::from(0), &Value::Null));
    let vp0 = vps.iter().find(|r| r["vp"] == 0).unwrap();
    assert_eq!(vp0["deltas"][common::delta(name(vp::IO_INSTRUCTIONS))], 0);
    assert_eq!(vp0["histograms"][name(vp::IO_TIME_HISTOGRAM)]["count"], 0);
    // Bounded: 2 VPs with 8 histograms each stay within a few kilobytes a sample.
    let per_sample = v["bytes_per_sample"].as_u64().unwrap();
    assert_eq!(per_sample, std::fs::metadata(&file).unwrap().len() / 7);
    assert!(per_sample < 4096, "{per_sample} bytes per sample");

    let out = hvstats(&["report", path(&file)]);
    let text = String::from_utf8(out.stdout).unwrap();
    let row = text.lines().find(|l| l.trim_start().starts_with(name(vp::IO_INSTRUCTIONS))).unwrap();
    assert!(row.contains(" 1600 ") && row.contains(" 600 "), "{row}");
    // A histogram is a row of the histogram section only (not its bare sum among the counters),
    // its numbers right-aligned under their headers.
    let rows: Vec<&str> =
        text.lines().filter(|l| l.trim_start().starts_with(name(vp::IO_TIME_HISTOGRAM))).collect();
    assert_eq!(rows.len(), 1, "{text}");
    // Its p50 and p99 bounds (1,023 ns and 4,194,303 ns) in adapted units.
    let io = format!("  {:<40} {:>20} {:>16} {:>16}", name(vp::IO_TIME_HISTOGRAM), 100, "1.0µs", "4.2ms");
    assert_eq!(rows[0], io, "{text}");
    assert!(text.contains("CPU wait: 2.0µs per dispatch, 12.50 % of runnable time (run + wait), "), "{text}");
    // Times in adapted units (4,200 ns per exit), and no row of the page's bookkeeping.
    let cost = text.lines().find(|l| l.trim_start().starts_with(name(vp::IO_INSTRUCTIONS_COST))).unwrap();
    assert!(cost.ends_with(" 4.2µs"), "{cost}");
    assert!(!text.contains(" ns"), "{text}");
    assert!(!text.lines().any(|l| l.trim_start().starts_with(name(vp::SEQUENCE))), "{text}");

    // The same recording as version 1 wrote it (no histograms) still reads, and says so; a
    // version this build does not know is refused.
    let mut lines: Vec<Value> =
        std::fs::read_to_string(&file).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    lines[0]["version"] = 1.into();
    lines[0]["catalog"].as_object_mut().unwrap().remove("vp_histograms");
    for sample in &mut lines[1..] {
        for p in sample["partitions"].as_array_mut().unwrap() {
            for vp in p["vps"].as_array_mut().unwrap() {
                vp.as_object_mut().unwrap().remove("histograms").unwrap();
            }
        }
    }
    let write = |lines: &[Value]| {
        let old = file.with_extension("old.ndjson");
        std::fs::write(&old, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
        old
    };
    let old = write(&lines);
    let out = hvstats(&["report", "--json", path(&old)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["note"].as_str().unwrap().contains("version 1 has no histograms"), "{v}");
    let vp1 = v["vps"].as_array().unwrap().iter().find(|r| r["vp"] == 1).unwrap();
    assert_eq!(vp1["deltas"][common::delta(name(vp::IO_INSTRUCTIONS))], 600);
    assert_eq!(vp1["histograms"], Value::Null);
    let text = String::from_utf8(hvstats(&["report", path(&old)]).stdout).unwrap();
    assert!(text.lines().nth(1).unwrap().starts_with("note: recording format version 1 has no histograms"));
    lines[0]["version"] = 3.into();
    let out = hvstats(&["report", path(&write(&lines))]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("recording format version 3 (written by a newer hvstats"), "{err}");
}

#[test]
fn plot_draws_png_and_svg_with_axes_units_and_a_legend() {
    let tmp = TempDir::new("record-plot");
    let (file, vm) = record_known_guest(&tmp, false);
    let png = tmp.path().join("chart.png");
    let out = hvstats(&["plot", path(&file), "-o", path(&png)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    // The default counters are the busiest rates: I/O exits, then hypercalls; 1000 × 360 each.
    let (w, h) = (
        u32::from_be_bytes(bytes[16..20].try_into().unwrap()),
        u32::from_be_bytes(bytes[20..24].try_into().unwrap()),
    );
    assert_eq!((w, h), (1000, 720));
    if let Ok(dir) = std::env::var("HVSTATS_KEEP_CHART") {
        std::fs::copy(&png, Path::new(&dir).join("chart.png")).unwrap();
    }

    let svg = tmp.path().join("chart.svg");
    let out = hvstats(&["plot", path(&file), "-o", path(&svg), "--counter", name(vp::IO_INSTRUCTIONS_COST)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"), "{}", &text[..100]);
    assert!(text.contains(name(vp::IO_INSTRUCTIONS_COST)));
    assert!(text.contains("µs per event"));
    assert!(text.contains("time since the start of the recording (s)"));
    assert!(text.contains(&format!("{vm} VP 1")), "the legend names the VP");
    // VP 0 made no I/O exits: no average cost to draw, no line.
    assert!(!text.contains(&format!("{vm} VP 0")));

    let bad = hvstats(&["plot", path(&file), "-o", path(&tmp.path().join("chart.gif"))]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains(".png or .svg"));
    let bad = hvstats(&["plot", path(&file), "-o", path(&svg), "--counter", "No such counter/sec"]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("is not a VP counter"));
}

/// `plot --counter` takes the names `report` and `snapshot` print (`HLT time halted`,
/// `Hypercalls (total)`) as well as the catalog's, and answers a near miss with the closest.
#[test]
fn plot_takes_the_names_report_prints_and_suggests_the_closest() {
    let tmp = TempDir::new("record-plot-labels");
    let (file, _) = record_known_guest(&tmp, false);
    let svg = tmp.path().join("chart.svg");
    for label in ["HLT time halted", "hlt time halted", "Hypercalls (total)"] {
        let out = hvstats(&["plot", path(&file), "-o", path(&svg), "--force", "--counter", label]);
        assert!(out.status.success(), "{label}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    }
    let near = hvstats(&["plot", path(&file), "-o", path(&svg), "--counter", "HLT time halt"]);
    assert_eq!(near.status.code(), Some(2));
    let err = String::from_utf8_lossy(&near.stderr);
    assert!(err.contains("is not a VP counter") && err.contains("did you mean \"HLT time halted\""), "{err}");
}

#[test]
fn ctrl_c_ends_a_recording_with_a_valid_file() {
    let tmp = TempDir::new("record-ctrlc");
    let hv = Hypervisor::new_published(tmp.path()).unwrap();
    let part = hv.create_partition(1).unwrap();
    part.vp_page(0).unwrap().set(vp::HYPERCALLS, 77);
    let file = tmp.path().join("rec.ndjson");
    let child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["record", "--interval", "0.1", "--runtime-dir", path(tmp.path()), "-o", path(&file)])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Two samples on file (after its header line), then the signal.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(&file).map_or(0, |t| t.lines().count()) < 3 {
        assert!(std::time::Instant::now() < deadline, "no second sample");
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = hvstats(&["report", "--json", path(&file)]);
    assert!(report.status.success(), "{}", String::from_utf8_lossy(&report.stderr));
    let v: Value = serde_json::from_slice(&report.stdout).unwrap();
    assert!(v["samples"].as_u64().unwrap() >= 2, "{v}");
    assert_eq!(v["vps"][0]["cumulative"][common::total(name(vp::HYPERCALLS))], 77);
}

#[test]
fn report_refuses_what_is_not_a_recording_and_tolerates_a_cut_last_line() {
    let tmp = TempDir::new("record-bad");
    let not = tmp.path().join("not.ndjson");
    std::fs::write(&not, "{\"hello\": 1}\n").unwrap();
    let out = hvstats(&["report", path(&not)]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 1 is not a recording header"));
    let empty = tmp.path().join("empty.ndjson");
    std::fs::write(&empty, "").unwrap();
    assert!(String::from_utf8_lossy(&hvstats(&["report", path(&empty)]).stderr).contains("empty"));
    let out = hvstats(&["report", path(tmp.path())]);
    assert!(!out.status.success());

    let (file, _) = {
        let hv = Hypervisor::new_published(&tmp.path().join("run")).unwrap();
        let part = hv.create_partition(1).unwrap();
        part.vp_page(0).unwrap().set(vp::HYPERCALLS, 5);
        let file = tmp.path().join("rec.ndjson");
        let out = hvstats(
            &["record", "-q", "--interval", "0.1", "--duration", "0.2", "--runtime-dir"]
                .iter()
                .copied()
                .chain([path(&tmp.path().join("run")), "-o", path(&file)])
                .collect::<Vec<_>>(),
        );
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (file, hv)
    };
    // A recorder killed mid-line leaves half a sample: the whole ones still count.
    let mut text = std::fs::read_to_string(&file).unwrap();
    let samples = text.lines().count() - 1;
    text.push_str("{\"t\": 9.0, \"partitions\": [");
    std::fs::write(&file, &text).unwrap();
    let out = hvstats(&["report", "--json", path(&file)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["samples"], samples);
    // And it says where the recording ends.
    assert_eq!(v["ended"]["cut_line"], samples + 2);
    assert_eq!(v["ended"]["cut_bytes"], "{\"t\": 9.0, \"partitions\": [".len());
    let text_report = String::from_utf8_lossy(&hvstats(&["report", path(&file)]).stdout).into_owned();
    assert!(text_report.contains(&format!("its last whole line, sample {samples} at t = ")), "{text_report}");
    // The same damage in the middle is an error naming the line.
    text.push_str("\n{}\n");
    std::fs::write(&file, &text).unwrap();
    let out = hvstats(&["report", path(&file)]);
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("line {} is not a sample", samples + 2)));
}

#[test]
fn report_reads_a_long_recording_in_the_memory_of_a_sample_not_of_the_file() {
    let tmp = TempDir::new("record-long");
    let (file, vm) = record_known_guest(&tmp, true);
    // The recording's last sample again and again, a second apart, then 200 more I/O exits:
    // 40,000 samples, a file of tens of MB.
    let text = std::fs::read_to_string(&file).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    let mut sample: Value = serde_json::from_str(lines.last().unwrap()).unwrap();
    let mut long = String::from(header);
    long.push('\n');
    let samples = 40_000;
    for i in 0..samples {
        sample["t"] = serde_json::json!(f64::from(i));
        if i == samples - 1 {
            let values = &mut sample["partitions"][0]["vps"][1]["values"];
            let at = |n: &str| {
                let header: Value = serde_json::from_str(header).unwrap();
                header["catalog"]["vp"].as_array().unwrap().iter().position(|c| c["name"] == n).unwrap()
            };
            let io = at(name(vp::IO_INSTRUCTIONS));
            values[io] = serde_json::json!(values[io].as_u64().unwrap() + 200);
        }
        long.push_str(&serde_json::to_string(&sample).unwrap());
        long.push('\n');
    }
    let long_file = tmp.path().join("long.ndjson");
    std::fs::write(&long_file, &long).unwrap();
    let size_kib = long.len() as u64 / 1024;
    assert!(size_kib > 20 * 1024, "{size_kib} KiB");

    let mut child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["report", "--json", path(&long_file)])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap());
    let mut peak = 0;
    while child.try_wait().unwrap().is_none() {
        peak = peak.max(rss_anon_kib(pid).unwrap_or(0));
        std::thread::sleep(Duration::from_millis(2));
    }
    let report: Value = serde_json::from_str(&reader.join().unwrap()).unwrap();
    assert_eq!(report["samples"], samples);
    let vp1 = report["vps"].as_array().unwrap().iter().find(|v| v["vm"] == vm && v["vp"] == 1).unwrap();
    assert_eq!(vp1["samples"], samples);
    assert_eq!(vp1["deltas"][common::delta(name(vp::IO_INSTRUCTIONS))], 200, "{vp1}");
    assert!(peak > 0);
    assert!(peak < size_kib / 8, "report of a {size_kib} KiB recording held {peak} KiB of heap");

    // plot reads it twice, one sample at a time, keeping only the points it draws.
    let png = tmp.path().join("long.png");
    let mut child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["plot", path(&long_file), "-o", path(&png), "--counter", name(vp::IO_INSTRUCTIONS)])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut peak = 0;
    while child.try_wait().unwrap().is_none() {
        peak = peak.max(rss_anon_kib(pid).unwrap_or(0));
        std::thread::sleep(Duration::from_millis(2));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(&std::fs::read(&png).unwrap()[..8], b"\x89PNG\r\n\x1a\n");
    // The points of the lines drawn (2 VPs × 40,000 samples) and the image, not the file.
    assert!(peak < size_kib / 3, "plot of a {size_kib} KiB recording held {peak} KiB of heap");
}

/// An instance that cannot be believed (a copy of a live arena owned by another user than its
/// holder): `record` says so once, records what it can, and exits 1, as `snapshot` does.
#[test]
fn a_recording_that_could_not_read_something_says_so_and_exits_1() {
    let tmp = TempDir::new("record-problems");
    let hv = common::publish(tmp.path());
    let _part = hv.create_partition(1).unwrap();
    let copy = hvstats::publish::instances_dir(tmp.path()).join("99-99-99.arena");
    std::fs::copy(hv.published_path().unwrap(), &copy).unwrap();
    let held = std::fs::File::open(&copy).unwrap();
    hvstats::publish::lock(std::os::fd::AsFd::as_fd(&held)).unwrap();
    std::os::unix::fs::chown(&copy, Some(65534), Some(65534)).unwrap();
    let rec = tmp.path().join("rec.ndjson");
    let out = hvstats(&[
        "record",
        "-q",
        "--interval",
        "0.2",
        "--duration",
        "0.5",
        "--runtime-dir",
        path(tmp.path()),
        "-o",
        path(&rec),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.matches("99-99-99.arena").count(), 1, "said once: {stderr}");
    // What could be read is recorded.
    let text = std::fs::read_to_string(&rec).unwrap();
    assert!(text.lines().count() >= 3, "{text}");
}

#[test]
fn report_shows_what_a_1_0_page_or_an_older_recording_does_not_carry_as_unknown() {
    let tmp = TempDir::new("record-1_0");
    let hv = Hypervisor::new_published(&tmp.path().join("run")).unwrap();
    let part = hv.create_partition(2).unwrap();
    write_1_0_vp_page(&hv, &part, 0, &[(vp::HYPERCALLS, 41)]);
    part.vp_page(1).unwrap().set(vp::DISPATCHES, 7);
    let file = tmp.path().join("rec.ndjson");
    let out = hvstats(
        &["record", "-q", "--interval", "0.1", "--duration", "0.3", "--runtime-dir"]
            .iter()
            .copied()
            .chain([path(&tmp.path().join("run")), "-o", path(&file)])
            .collect::<Vec<_>>(),
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = |file: &Path| {
        let out = hvstats(&["report", "--json", path(file)]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let vp = |n: u32| v["vps"].as_array().unwrap().iter().find(|r| r["vp"] == n).unwrap().clone();
        (vp(0), vp(1))
    };
    // The 1.0 page's VP: its counters, and the 1.1 ones unknown.
    let (old, new) = report(&file);
    assert_eq!(old["cumulative"][common::total(name(vp::HYPERCALLS))], 41, "{old}");
    assert!(old["cumulative"][common::total(name(vp::DISPATCHES))].is_null(), "{old}");
    assert!(old["cpu_wait"]["dispatches"].is_null(), "{old}");
    assert_eq!(new["cumulative"][common::total(name(vp::DISPATCHES))], 7, "{new}");

    // The same recording as an hvstats before release 1.1 wrote it: its header does not list the
    // appended counters, nor its samples their values. They are unknown, the rest reads.
    let appended = [name(vp::DISPATCHES), name(vp::CPU_WAIT_TIME_PER_DISPATCH)];
    let mut lines: Vec<Value> =
        std::fs::read_to_string(&file).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let listed = lines[0]["catalog"]["vp"].as_array().unwrap().clone();
    let keep: Vec<bool> = listed.iter().map(|c| !appended.contains(&c["name"].as_str().unwrap())).collect();
    lines[0]["catalog"]["vp"] = listed.into_iter().zip(&keep).filter(|(_, k)| **k).map(|(c, _)| c).collect();
    for sample in &mut lines[1..] {
        for p in sample["partitions"].as_array_mut().unwrap() {
            for vp in p["vps"].as_array_mut().unwrap() {
                let values = vp["values"].as_array().unwrap().clone();
                vp["values"] = values.into_iter().zip(&keep).filter(|(_, k)| **k).map(|(v, _)| v).collect();
            }
        }
    }
    let older = file.with_extension("older.ndjson");
    std::fs::write(&older, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let (old, new) = report(&older);
    assert_eq!(old["cumulative"][common::total(name(vp::HYPERCALLS))], 41, "{old}");
    for n in appended {
        assert!(new["cumulative"].as_object().unwrap().contains_key(&common::total(n)), "{n} listed: {new}");
        assert!(new["cumulative"][common::total(n)].is_null(), "{n}: {new}");
    }
}

/// A recording of `partitions` partitions of `vps` VPs each, `samples` samples a second apart, made
/// from a real one-VP recording: its header, and its VP repeated with I/O exits growing by
/// `io_step` per sample on every VP. Partition `p` is VM `vm-<p % names>` of instance `inst-<p>`.
fn wide_recording(
    tmp: &TempDir,
    partitions: u32,
    vps: u32,
    samples: u32,
    names: u32,
    io_step: u64,
) -> std::path::PathBuf {
    let run = tmp.path().join("wide-run");
    std::fs::create_dir_all(&run).unwrap();
    let hv = Hypervisor::new_published(&run).unwrap();
    let part = hv.create_partition(1).unwrap();
    part.vp_page(0).unwrap().set(vp::IO_INSTRUCTIONS, 1_000_000);
    let seed = tmp.path().join("seed.ndjson");
    let _ = std::fs::remove_file(&seed);
    let out = hvstats(&["record", "-q", "--duration", "0.1", "--runtime-dir", path(&run), "-o", path(&seed)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&seed).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap().to_owned();
    let sample: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    let head: Value = serde_json::from_str(&header).unwrap();
    let io = head["catalog"]["vp"]
        .as_array()
        .unwrap()
        .iter()
        .position(|c| c["name"] == name(vp::IO_INSTRUCTIONS))
        .unwrap();
    let mut vp_json = sample["partitions"][0]["vps"][0].clone();
    let file = tmp.path().join("wide.ndjson");
    let mut w = std::io::BufWriter::new(std::fs::File::create(&file).unwrap());
    use std::io::Write;
    writeln!(w, "{header}").unwrap();
    for s in 0..samples {
        vp_json["values"][io] = (1_000_000 + io_step * u64::from(s)).into();
        write!(w, "{{\"t\":{s}.0,\"partitions\":[").unwrap();
        for p in 0..partitions {
            let sep = if p == 0 { "" } else { "," };
            write!(
                w,
                "{sep}{{\"vm\":\"vm-{}\",\"instance\":\"inst-{p}\",\"partition\":1,\"active\":true,\"vps\":[",
                p % names
            )
            .unwrap();
            for i in 0..vps {
                vp_json["vp"] = i.into();
                let sep = if i == 0 { "" } else { "," };
                write!(w, "{sep}{vp_json}").unwrap();
            }
            write!(w, "]}}").unwrap();
        }
        writeln!(w, "]}}").unwrap();
    }
    w.flush().unwrap();
    file
}

/// Runs hvstats with `args` under `/usr/bin/time`, its standard output drained; returns its
/// output (standard error without time's line) and its peak resident memory in KiB. (`time` forks
/// hvstats from a small process: a child of this test would inherit the test's own peak.)
fn peak_kib(args: &[&str]) -> (Output, u64) {
    let started = std::time::Instant::now();
    let mut out = Command::new("/usr/bin/time")
        .args(["-f", "peak-kib %M"])
        .arg(env!("CARGO_BIN_EXE_hvstats"))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let (rest, peak) = stderr.trim_end().rsplit_once("peak-kib ").unwrap_or_else(|| panic!("{stderr}"));
    let peak = peak.parse().unwrap();
    out.stderr = rest.as_bytes().to_vec();
    println!("{:?}: {peak} KiB peak, {:.1} s", args.first(), started.elapsed().as_secs_f64());
    (out, peak)
}

/// Peak memory of `report --json`, `report` and `plot` over a recording of `partitions` × 100 VPs
/// (3 samples), in KiB.
fn peaks_over(tmp: &TempDir, partitions: u32) -> [u64; 3] {
    let file = wide_recording(tmp, partitions, 100, 3, partitions, 500);
    let vps = partitions as usize * 100;
    let size_kib = std::fs::metadata(&file).unwrap().len() / 1024;
    println!("recording: {size_kib} KiB, {vps} VPs, 3 samples");
    let (out, report) = peak_kib(&["report", "--json", path(&file)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Every VP, each with its 1000 I/O exits (counted in the text: parsing every report here
    // would cost this test more than the command).
    let json = String::from_utf8(out.stdout).unwrap();
    assert_eq!(json.matches("\"instance\": \"inst-").count(), vps);
    let io = format!("\"{}\": 1000", common::delta(name(vp::IO_INSTRUCTIONS)));
    assert_eq!(json.matches(&io).count(), vps, "{}", &json[..4000]);
    drop(json);
    let (out, text) = peak_kib(&["report", path(&file)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let first = format!("3 samples over 2.00 s, {vps} VPs\n");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with(&first));
    let png = tmp.path().join("wide.png");
    let (out, plot) = peak_kib(&["plot", path(&file), "-o", path(&png), "--force"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::remove_file(&file).unwrap();
    [report, text, plot]
}

#[test]
fn report_and_plot_hold_a_few_hundred_bytes_per_vp_not_kilobytes() {
    // Whatever the recording's width, what report and plot keep per VP is a few compact readings
    // and a few numbers: measured as the growth of the peak from 100 VPs to 20,000. (A sample
    // parsed whole and two per VP kept whole cost about 40 KB a VP: 4 GB for 100,000.)
    let tmp = TempDir::new("record-wide");
    let small = peaks_over(&tmp, 1);
    let wide = peaks_over(&tmp, 200);
    for ((what, small), wide) in ["report --json", "report", "plot"].iter().zip(small).zip(wide) {
        let per_vp = (wide.saturating_sub(small) * 1024) / (20_000 - 100);
        println!("{what}: {small} KiB at 100 VPs, {wide} KiB at 20,000: {per_vp} bytes per VP");
        // The line itself (about 700 bytes a VP here) and a packed reading or two.
        assert!(per_vp < 1_500, "{what} holds {per_vp} bytes per VP");
    }
}

#[test]
fn a_line_longer_than_a_recording_line_may_be_is_refused_by_its_number() {
    let tmp = TempDir::new("record-longline");
    let file = wide_recording(&tmp, 1, 1, 2, 1, 1);
    let mut text = std::fs::read(&file).unwrap();
    // 129 MiB of digits on line 4, without a newline until the end.
    text.extend(std::iter::repeat_n(b'7', 129 << 20));
    text.push(b'\n');
    std::fs::write(&file, &text).unwrap();
    drop(text);
    let (out, kib) = peak_kib(&["report", path(&file)]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 4 is longer than 134217728 bytes"), "{err}");
    assert!(kib < 200 * 1024, "{kib} KiB");
}

#[test]
fn two_vms_that_share_a_name_are_two_rows_named_alike() {
    let tmp = TempDir::new("record-dup");
    let file = wide_recording(&tmp, 2, 1, 3, 1, 100);
    let out = hvstats(&["report", "--json", path(&file)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let vps = v["vps"].as_array().unwrap();
    assert_eq!(vps.len(), 2, "{v}");
    for (r, instance) in vps.iter().zip(["inst-0", "inst-1"]) {
        assert_eq!((&r["vm"], &r["instance"], &r["samples"]), (&"vm-0".into(), &instance.into(), &3.into()));
        assert_eq!(r["deltas"][common::delta(name(vp::IO_INSTRUCTIONS))], 200);
    }
    let text = String::from_utf8(hvstats(&["report", path(&file)]).stdout).unwrap();
    assert!(text.contains("vm-0 VP 0 (instance inst-0, partition 1;"), "{text}");
    assert!(text.contains("vm-0 VP 0 (instance inst-1, partition 1;"), "{text}");
    let svg = tmp.path().join("dup.svg");
    let out = hvstats(&["plot", path(&file), "-o", path(&svg), "--counter", name(vp::IO_INSTRUCTIONS)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.contains("vm-0 VP 0 [inst-0:1]") && chart.contains("vm-0 VP 0 [inst-1:1]"), "two lines");
}

#[test]
fn a_recording_in_which_nothing_moved_is_charted_flat() {
    let tmp = TempDir::new("record-idle");
    let file = wide_recording(&tmp, 1, 2, 4, 1, 0);
    let svg = tmp.path().join("idle.svg");
    let out = hvstats(&["plot", path(&file), "-o", path(&svg)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let chart = std::fs::read_to_string(&svg).unwrap();
    // The first three maintained rates of the catalog, each flat at zero with both VPs.
    assert_eq!(chart.matches("(no activity)").count(), 3, "{chart}");
    assert!(chart.contains("vm-0 VP 0") && chart.contains("vm-0 VP 1"));
}

#[test]
fn names_with_newlines_and_escape_codes_reach_the_report_escaped() {
    let tmp = TempDir::new("record-names");
    let file = wide_recording(&tmp, 1, 1, 2, 1, 7);
    let text =
        std::fs::read_to_string(&file).unwrap().replace("\"vm-0\"", "\"evil\\nVP 9 forged\\u001b[2J\"");
    std::fs::write(&file, text).unwrap();
    let out = hvstats(&["report", path(&file)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains('\x1b') && !text.contains("\nVP 9 forged"), "{text:?}");
    assert!(text.contains(r"evil\nVP 9 forged\u{1b}[2J VP 0 (instance inst-0"), "{text}");
    // JSON keeps the name as it is (its encoder escapes it).
    let v: Value = serde_json::from_slice(&hvstats(&["report", "--json", path(&file)]).stdout).unwrap();
    assert_eq!(v["vps"][0]["vm"], "evil\nVP 9 forged\u{1b}[2J");
}

/// A catalog entry of a made-up header: a cost whose paired count the header does not list.
const COST_ENTRY: &str =
    r#"{"name":"IO instructions cost","unit":"100ns","presentation":"cost","maintained":true}"#;
/// A histogram entry of a made-up header.
const HISTOGRAM_ENTRY: &str = r#"{"name":"x","bucketing":"log2-ns","buckets":32}"#;

/// A recording header listing `counters` VP counters and `histograms` VP histograms.
fn hostile_header(counters: usize, histograms: usize) -> String {
    format!(
        "{{\"format\":\"hvstats-recording\",\"version\":2,\"interval_seconds\":1.0,\"started_unix_ms\":0,\
         \"catalog\":{{\"hvstats\":\"x\",\"groups\":\"1.0\",\"partition\":[],\"vp\":[{}],\"vp_histograms\":[{}]}}}}\n",
        vec![COST_ENTRY; counters].join(","),
        vec![HISTOGRAM_ENTRY; histograms].join(",")
    )
}

/// Runs `hvstats args` with at most `seconds` of CPU (the kernel ends it past them).
fn within_cpu_seconds(args: &[&str], seconds: u64) -> Output {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(env!("CARGO_BIN_EXE_hvstats"));
    command.args(args).stdout(Stdio::null());
    // SAFETY: setrlimit is async-signal-safe and touches nothing of the parent's.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit { rlim_cur: seconds, rlim_max: seconds + 1 };
            if libc::setrlimit(libc::RLIMIT_CPU, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.output().unwrap()
}

#[test]
fn a_hostile_100_mb_recording_is_reported_or_refused_within_10_s_of_cpu() {
    use std::io::Write;
    const SIZE: usize = 100_000_000;
    let tmp = TempDir::new("record-hostile");
    // A header of 100 MB: 1.2 million costs whose count it does not list (each looked up in all
    // the others, once quadratic), refused before it is parsed.
    let bomb = tmp.path().join("bomb.ndjson");
    let header = hostile_header(SIZE / (COST_ENTRY.len() + 1), 0);
    std::fs::write(&bomb, format!("{header}{{\"t\":0,\"partitions\":[]}}\n")).unwrap();
    drop(header);
    let out = within_cpu_seconds(&["report", path(&bomb)], 10);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 1 is longer than 1048576 bytes: not a recording header"), "{err}");

    // The largest header accepted, half counters, half histograms (each counter once checked
    // against every histogram, per VP), then 99 MB of VPs carrying all of them.
    let (counters, histograms) = (6000, 10_900);
    let header = hostile_header(counters, histograms);
    assert!(header.len() <= 1 << 20, "{}", header.len());
    let wide = tmp.path().join("wide.ndjson");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&wide).unwrap());
    file.write_all(header.as_bytes()).unwrap();
    let one_vp = format!(
        "\"values\":[{}],\"histograms\":[{}]}}",
        vec!["1"; counters].join(","),
        vec!["null"; histograms].join(",")
    );
    let (mut written, mut t) = (header.len(), 0);
    while written < SIZE {
        let vps: Vec<String> = (0..20).map(|n| format!("{{\"vp\":{n},{one_vp}")).collect();
        let line = format!(
            "{{\"t\":{t},\"partitions\":[{{\"vm\":\"a\",\"instance\":\"1-2-0\",\"partition\":1,\"active\":true,\
             \"vps\":[{}]}}]}}\n",
            vps.join(",")
        );
        file.write_all(line.as_bytes()).unwrap();
        written += line.len();
        t += 1;
    }
    drop(file);
    for args in [&["report", path(&wide)][..], &["report", "--json", path(&wide)]] {
        let out = within_cpu_seconds(args, 10);
        assert!(out.status.success(), "{args:?}: {out:?}");
    }
}

/// Mounts a tmpfs of `bytes` at `dir`, unmounted on drop; `None` where this process may not mount.
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(dir: &Path, bytes: usize) -> Option<Self> {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes},mode=0700"), "tmpfs"])
            .arg(dir)
            .output()
            .ok()?;
        out.status.success().then(|| Self(dir.to_owned()))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_recording_into_a_full_disk_keeps_whole_samples_and_report_says_where_it_ended() {
    let tmp = TempDir::new("record-full");
    let Some(disk) = SmallDisk::mount(&tmp.path().join("disk"), 64 << 10) else {
        // Mounting needs root (CI's tests run as root, as KVM's do).
        assert!(std::env::var("HVSTATS_REQUIRE_KVM").as_deref() != Ok("1"), "cannot mount a tmpfs");
        eprintln!("a_recording_into_a_full_disk_keeps_whole_samples: cannot mount a tmpfs: skipped");
        return;
    };
    let run = tmp.path().join("run");
    let (_hv, part) = common::publish_partition(&run, 4);
    part.vp_page(0).unwrap().set(vp::HYPERCALLS, 5);
    let file = disk.0.join("rec.ndjson");
    // Far more samples than 64 KiB holds (each some 3 KB of 4 VPs).
    let out = hvstats(&[
        "record",
        "-q",
        "--interval",
        "0.1",
        "--duration",
        "600",
        "--runtime-dir",
        path(&run),
        "-o",
        path(&file),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    let text = std::fs::read_to_string(&file).unwrap();
    // Whole lines only: every one ends, and every one parses.
    assert!(text.ends_with('\n'), "the last line is cut");
    let samples = text.lines().count() - 1;
    assert!(samples >= 2, "{samples} samples");
    for line in text.lines() {
        serde_json::from_str::<Value>(line).unwrap();
    }
    assert!(
        stderr.contains(&format!("the recording ends after {samples} whole samples ({} bytes)", text.len())),
        "{stderr}"
    );
    let out = hvstats(&["report", "--json", path(&file)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["samples"], samples);
    assert_eq!(v["ended"]["cut_line"], Value::Null);
    assert!(v["ended"]["last_sample_seconds"].as_f64().unwrap() > 0.0, "{}", v["ended"]);
}
