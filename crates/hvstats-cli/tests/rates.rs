//! Rates are true at every interval: a reader divides a count's change by the time between the two
//! refreshes of its publisher that it read (each VP page dates its counts), never by its own
//! clock. Over an observed QEMU guest whose observer refreshes once a second and whose traffic is
//! steady (SeaBIOS with no disk, halting on a timer), `top`, `snapshot --interval` and `record`
//! at 0.5 s, 1 s and 1.1 s show each rate within a band of the long-run average, or say that both
//! readings hold the same refresh (no rate, never a 0 and never about twice the rate).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{QemuGuest, Running, TempDir, presented, total};
use serde_json::Value;

/// The counters checked: the guest's port accesses (tracepoints), its halts and every exit
/// (KVM's statistics over QMP); `top` shows the first two.
const COUNTED: [&str; 3] = ["IO instructions/sec", "HLT instructions/sec", "Exits/sec"];

/// How far a rate may be from the long-run average: an idle guest's timer is steady, and a
/// doubled or zero rate is far outside.
const BAND: f64 = 0.35;

fn hvstats(dir: &Path, args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(args)
        .arg("--runtime-dir")
        .arg(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn json_of(dir: &Path, args: &[&str]) -> Value {
    serde_json::from_slice(&hvstats(dir, args).stdout).unwrap()
}

/// The VP's counters in a `snapshot --json` document (`None` before the VM is published).
fn vp_of(doc: &Value) -> Option<&Value> {
    doc["instances"]
        .as_array()?
        .iter()
        .flat_map(|i| i["partitions"].as_array().into_iter().flatten())
        .find_map(|p| (p["name"] == "rates-vm").then(|| p["vps"].get(0)).flatten())
}

/// The VP's totals of [`COUNTED`] and its publication time in ns, now.
fn totals(dir: &Path) -> Option<([u64; 3], u64)> {
    let doc = json_of(dir, &["snapshot", "--json"]);
    let counters = &vp_of(&doc)?["counters"];
    let published = counters["published_ns"].as_u64().filter(|&t| t != 0)?;
    let mut values = [0; 3];
    for (v, name) in values.iter_mut().zip(COUNTED) {
        *v = counters[total(name)].as_u64()?;
    }
    Some((values, published))
}

/// What one surface showed for one counter over one interval.
#[derive(Debug)]
enum Shown {
    /// A rate.
    Rate(f64),
    /// No rate, the two readings holding the same refresh.
    SamePublication,
}

/// Checks every value shown against `truth`, the long-run rates of [`COUNTED`].
fn check(surface: &str, interval: f64, shown: &[[Option<Shown>; 3]], truth: [f64; 3]) {
    let rates = shown.iter().flatten().filter(|s| matches!(s, Some(Shown::Rate(_)))).count();
    assert!(rates > 0, "{surface} at {interval} s showed no rate at all: {shown:?}");
    for sample in shown {
        for ((value, name), truth) in sample.iter().zip(COUNTED).zip(truth) {
            match value {
                Some(Shown::Rate(r)) => assert!(
                    (r - truth).abs() <= BAND * truth,
                    "{surface} at {interval} s: {name} {r:.1}/s, the long-run rate is {truth:.1}/s: {shown:?}"
                ),
                Some(Shown::SamePublication) => {}
                None => panic!("{surface} at {interval} s: {name} neither a rate nor the same publication"),
            }
        }
    }
}

/// A presented rate and the flag beside it: a rate, or null with `same_publication`.
fn shown_in(rate: &Value, publication: &Value) -> Option<Shown> {
    match (rate.as_f64(), publication["same_publication"].as_bool()) {
        (Some(r), Some(false)) => Some(Shown::Rate(r)),
        (None, Some(true)) => Some(Shown::SamePublication),
        _ => None,
    }
}

fn top_samples(dir: &Path, interval: &str, n: usize) -> Vec<[Option<Shown>; 3]> {
    (0..n)
        .map(|_| {
            let doc = json_of(dir, &["top", "--once", "--json", "--interval", interval]);
            let vp =
                doc["partitions"].as_array().unwrap().iter().find(|p| p["vm"] == "rates-vm").unwrap()["vps"]
                    [0]
                .clone();
            assert_eq!(vp["publication"]["dated_by"], "page", "{vp}");
            // `top` has no column of every exit: that one is checked by the other surfaces.
            [
                shown_in(&vp["presented"][presented(COUNTED[0])], &vp["publication"]),
                shown_in(&vp["presented"][presented(COUNTED[1])], &vp["publication"]),
                Some(Shown::SamePublication),
            ]
        })
        .collect()
}

fn snapshot_samples(dir: &Path, interval: &str, n: usize) -> Vec<[Option<Shown>; 3]> {
    (0..n)
        .map(|_| {
            let doc = json_of(dir, &["snapshot", "--json", "--interval", interval]);
            let vp = vp_of(&doc).unwrap();
            assert_eq!(vp["publication"]["dated_by"], "page", "{vp}");
            COUNTED.map(|name| shown_in(&vp["interval"][presented(name)], &vp["publication"]))
        })
        .collect()
}

/// The rates between consecutive samples of a recording, as `plot` takes them: over the VP's
/// publication times, the same publication twice giving none; then `report`'s rates over it.
fn record_samples(dir: &Path, interval: &str, n: usize) -> Vec<[Option<Shown>; 3]> {
    let file = dir.join(format!("rates-{interval}.ndjson"));
    let duration = format!("{}", interval.parse::<f64>().unwrap() * (n as f64 - 0.5));
    let path = file.to_str().unwrap();
    hvstats(dir, &["record", "--quiet", "--interval", interval, "--duration", &duration, "-o", path]);
    let text = std::fs::read_to_string(&file).unwrap();
    let mut lines = text.lines().map(|l| serde_json::from_str::<Value>(l).unwrap());
    let header = lines.next().unwrap();
    let names: Vec<&str> =
        header["catalog"]["vp"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    let at = |name: &str| names.iter().position(|n| *n == name).unwrap();
    let samples: Vec<Vec<u64>> = lines
        .filter_map(|s| {
            let p = s["partitions"].as_array()?.iter().find(|p| p["vm"] == "rates-vm")?.clone();
            let values = p["vps"][0]["values"].as_array()?.clone();
            Some(values.iter().map(|v| v.as_u64().unwrap_or(0)).collect())
        })
        .collect();
    assert!(samples.len() >= n - 1, "{} samples of the VM: {text}", samples.len());
    // `report` over the whole recording, dated by the same times.
    let out = Command::new(env!("CARGO_BIN_EXE_hvstats")).args(["report", "--json", path]).output().unwrap();
    assert!(out.status.success(), "report: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let vp = report["vps"].as_array().unwrap().iter().find(|v| v["vm"] == "rates-vm").unwrap();
    assert_eq!(vp["publication"]["dated_by"], "page", "{vp}");
    let whole = COUNTED.map(|name| shown_in(&vp["rates_per_second"][presented(name)], &vp["publication"]));
    samples
        .windows(2)
        .map(|w| {
            let seconds = (w[1][at("Published")] as f64 - w[0][at("Published")] as f64) / 1e9;
            COUNTED.map(|name| {
                let delta = w[1][at(name)] as f64 - w[0][at(name)] as f64;
                Some(match seconds > 0.0 {
                    true => Shown::Rate(delta / seconds),
                    // The same publication holds the same counts.
                    false if delta == 0.0 => Shown::SamePublication,
                    false => return None,
                })
            })
        })
        .chain([whole])
        .collect()
}

/// The VP's totals once its firmware has given up booting and halts on its timer: two windows of
/// two seconds in a row in which every counted counter moved (the boot menu's wait and the boot
/// attempts before it come in bursts and pauses).
fn settled(dir: &Path, mut then: ([u64; 3], u64)) -> ([u64; 3], u64) {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut steady = 0;
    while steady < 2 {
        assert!(
            Instant::now() < deadline,
            "the guest never settled: {then:?}: {}",
            json_of(dir, &["snapshot", "--json"])
        );
        std::thread::sleep(Duration::from_secs(2));
        let now = totals(dir).unwrap();
        let moved = now.1 > then.1 && (0..3).all(|i| now.0[i] > then.0[i]);
        steady = if moved { steady + 1 } else { 0 };
        then = now;
    }
    then
}

#[test]
fn rates_of_an_observed_vm_are_true_at_its_observers_period_and_around_it() {
    let test = "rates_of_an_observed_vm_are_true_at_its_observers_period_and_around_it";
    if !common::kvm_available(test) {
        return;
    }
    let tmp = TempDir::new("rates");
    let guest = QemuGuest::start(tmp.path(), "rates-vm");
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let observer = Running::start(&["observe", "--interval", "1", "--pid", &guest.pid().to_string()], &run);
    observer.wait_line(&format!("attach pid {}", guest.pid()));
    let dir = run.as_path();
    // The guest's firmware settles into its halt loop; the observer has published twice.
    let deadline = Instant::now() + Duration::from_secs(60);
    let first = loop {
        if let Some(first) = totals(dir) {
            break first;
        }
        assert!(Instant::now() < deadline, "the observer never published the VM");
        std::thread::sleep(Duration::from_millis(200));
    };
    let start = settled(dir, first);

    let mut shown = Vec::new();
    for interval in ["0.5", "1", "1.1"] {
        shown.push(("top", interval, top_samples(dir, interval, 4)));
        shown.push(("snapshot --interval", interval, snapshot_samples(dir, interval, 4)));
        shown.push(("record", interval, record_samples(dir, interval, 5)));
    }

    // The truth: the long-run rates, from the counts and their publication times themselves.
    let end = totals(dir).unwrap();
    let seconds = (end.1 - start.1) as f64 / 1e9;
    let truth = [0, 1, 2].map(|i| (end.0[i] - start.0[i]) as f64 / seconds);
    assert!(truth.iter().all(|&t| t > 1.0), "steady traffic over {seconds:.1} s: {truth:?}");
    for (surface, interval, samples) in &shown {
        check(surface, interval.parse().unwrap(), samples, truth);
    }
    // At half the observer's period, some pairs of readings hold one refresh, and say so.
    let same = |s: &[[Option<Shown>; 3]]| s.iter().any(|v| matches!(v[0], Some(Shown::SamePublication)));
    let at_half: Vec<_> = shown.iter().filter(|(s, i, _)| *i == "0.5" && *s != "record").collect();
    assert!(at_half.iter().any(|(_, _, s)| same(s)), "{at_half:?}");
}
