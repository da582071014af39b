//! Which rows a run measures, what each keeps of its rounds, and what a progress display is told,
//! on the quickest rows (no guest, no tracepoint).

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Mutex;

use hvstats_bench::{
    Options, Plan, Progress, Row, Silent, chart, default_scrape, fleet, observe_scale, restart, scrape,
    shutdown, thread_reads,
};
use hvstats_testkit::kvm_available;

/// A progress display that writes down what it is told.
#[derive(Default)]
struct Recorded(Mutex<Vec<String>>);

impl Progress for Recorded {
    fn group(&self, rows: &[&str], rounds: u32) {
        self.0.lock().unwrap().push(format!("{} x{rounds}", rows.join("+")));
    }

    fn round(&self) {
        self.0.lock().unwrap().push(".".into());
    }
}

/// Taken by the tests that start a thousand threads in this process or a fleet of VMs, and by the
/// one whose observers observe this process (they would count every one of those threads at
/// attach, or wait behind the fleet's observer).
static THIS_PROCESS: Mutex<()> = Mutex::new(());

fn fact(row: &Row, name: &str) -> f64 {
    let Row::Measured { facts, .. } = row else { panic!("{row:?}") };
    facts.iter().find(|(n, _)| *n == name).map(|(_, v)| *v).unwrap_or_else(|| panic!("no {name} in {row:?}"))
}

#[test]
fn a_run_measures_only_the_rows_asked_for_every_round_of_both_sides_told_as_it_goes() {
    let options = Options {
        rounds: Some(4),
        only: vec!["vp-read-consistent-vs-plain".into(), "read-vp-vs-pread-page".into()],
        ..Options::default()
    };
    let progress = Recorded::default();
    let rows = hvstats_bench::run(&options, &progress).unwrap();
    let names: Vec<&str> = rows.iter().map(Row::name).collect();
    assert_eq!(names, ["read-vp-vs-pread-page", "vp-read-consistent-vs-plain"], "{rows:?}");
    for row in &rows {
        let Row::Measured { rounds, unit, .. } = row else { panic!("{row:?}") };
        assert_eq!((rounds.ours.len(), rounds.baseline.len()), (4, 4), "{row:?}");
        assert!(rounds.ours.iter().chain(&rounds.baseline).all(|v| *v > 0.0), "{row:?}");
        assert_eq!(*unit, "ns/read");
        let (ours, baseline) = (row.ours().unwrap(), row.baseline().unwrap());
        assert!(ours.min <= ours.median && ours.median <= ours.max, "{ours:?}");
        assert_eq!(row.ratio(), Some(ours.median / baseline.median));
        assert_eq!(row.interval().unwrap().blocks, 2);
    }
    // Each comparison is announced, then each of its rounds; the stats-fd read is measured with
    // the pread one when this host has KVM, and announced then.
    let told = progress.0.into_inner().unwrap();
    let tail: Vec<&str> =
        told.iter().map(String::as_str).skip_while(|t| !t.starts_with("read-vp-vs-pread-page")).collect();
    assert_eq!(
        tail,
        [
            "read-vp-vs-pread-page x4",
            ".",
            ".",
            ".",
            ".",
            "vp-read-consistent-vs-plain x4",
            ".",
            ".",
            ".",
            "."
        ]
    );
}

#[test]
fn the_scrape_rows_encode_one_reading_every_round_and_say_its_series_and_bytes() {
    let rows = scrape::rows_for(3, 2, &Plan::quiet(2)).unwrap();
    let names: Vec<&str> = rows.iter().map(Row::name).collect();
    assert_eq!(names, scrape::ROWS);
    // The same reading and cap the row encoded, encoded again: the facts are its size.
    let reading =
        std::sync::Arc::new(hvstats_present::live::Reading::of(vec![hvstats_testkit::synthetic_instance(
            3, 2,
        )]));
    let text = scrape::metrics(&reading, usize::MAX).unwrap();
    assert_eq!(fact(&rows[0], "series"), scrape::series(&text) as f64);
    assert_eq!(fact(&rows[0], "bytes"), text.len() as f64);
    assert_eq!(fact(&rows[0], "json_bytes"), scrape::snapshot_body(&reading).len() as f64);
    assert!(text.contains("hvstats_vp_hypercalls_total{vm=\"partition-3\",vp=\"1\"}"), "{text}");
    for row in &rows {
        let Row::Measured { rounds, .. } = row else { panic!("{row:?}") };
        assert_eq!(rounds.ours.len(), 2);
    }
}

#[test]
fn the_fleet_rows_read_a_published_fleet_and_the_library_encodes_the_same_series() {
    let rows = fleet::fleet_rows(&Plan::quiet(2), 3, 2).unwrap();
    let names: Vec<&str> = rows.iter().map(Row::name).collect();
    assert_eq!(names, fleet::ROWS);
    // Every VP's counters and histograms, and more: the VMs', the host's.
    let series = fact(&rows[0], "series");
    assert!(series > 6.0 * 100.0, "{series} series for 6 VPs");
    assert_eq!(fact(&rows[1], "series"), series, "the same exposition");
    assert!(fact(&rows[0], "library_bytes") > 0.0);
    assert_eq!(fact(&rows[2], "vps"), 6.0);
    assert_eq!(fact(&rows[2], "bytes_per_vp") * 6.0, fact(&rows[2], "bytes"));
    for row in &rows {
        let Row::Measured { rounds, .. } = row else { panic!("{row:?}") };
        assert_eq!((rounds.ours.len(), rounds.baseline.len()), (2, 2));
        assert!(rounds.ours.iter().chain(&rounds.baseline).all(|v| *v > 0.0), "{row:?}");
    }
}

#[test]
fn the_sigterm_rows_time_both_observers_and_serve_alone_with_a_vm_attached_every_round() {
    if !kvm_available("the_sigterm_rows_time_both_observers_and_serve_alone_with_a_vm_attached_every_round") {
        return;
    }
    // The rows run the built `hvstats`: `cargo test --workspace` builds it, `-p hvstats-bench`
    // alone may not.
    if let Err(why) = shutdown::hvstats_binary() {
        assert!(std::env::var("HVSTATS_REQUIRE_KVM").as_deref() != Ok("1"), "{why}");
        eprintln!("the sigterm rows {why}: skipped");
        return;
    }
    let _alone = THIS_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    let options = Options { rounds: Some(2), only: vec!["sigterm-to-exit-".into()], ..Options::default() };
    let rows = hvstats_bench::run(&options, &Silent).unwrap();
    let names: Vec<&str> = rows.iter().map(Row::name).collect();
    assert_eq!(names, shutdown::ROWS, "{rows:?}");
    for row in &rows {
        let Row::Measured { rounds, unit, goal, .. } = row else { panic!("{row:?}") };
        assert_eq!((rounds.ours.len(), rounds.baseline.len()), (2, 2), "{row:?}");
        assert!(rounds.ours.iter().chain(&rounds.baseline).all(|s| *s > 0.0), "{row:?}");
        assert_eq!((*unit, *goal), ("s", None));
        assert!(row.ratio().is_some_and(|r| r > 0.0), "{row:?}");
        assert_eq!(row.interval().unwrap().blocks, 1);
    }
    // One baseline for both: serve alone, signalled once each round.
    let Row::Measured { rounds: observe, .. } = &rows[0] else { unreachable!() };
    let Row::Measured { rounds: serve, .. } = &rows[1] else { unreachable!() };
    assert_eq!(observe.baseline, serve.baseline);
}

fn rounds_of(row: &Row) -> &hvstats_bench::row::Rounds {
    let Row::Measured { rounds, .. } = row else { panic!("{row:?}") };
    rounds
}

#[test]
fn the_scale_row_observes_every_vm_of_the_minimal_vmm_and_says_its_cost_per_vm_and_thread() {
    if !kvm_available(
        "the_scale_row_observes_every_vm_of_the_minimal_vmm_and_says_its_cost_per_vm_and_thread",
    ) {
        return;
    }
    if let Err(why) = shutdown::hvstats_binary() {
        assert!(std::env::var("HVSTATS_REQUIRE_KVM").as_deref() != Ok("1"), "{why}");
        eprintln!("the scale rows {why}: skipped");
        return;
    }
    let _alone = THIS_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    let options = Options { rounds: Some(2), only: vec!["observe-scale-64".into()], ..Options::default() };
    let rows = hvstats_bench::run(&options, &Silent).unwrap();
    assert_eq!(rows.iter().map(Row::name).collect::<Vec<_>>(), ["observe-scale-64"], "{rows:?}");
    let row = &rows[0];
    let rounds = rounds_of(row);
    assert_eq!((rounds.ours.len(), rounds.baseline.len()), (2, 2), "{row:?}");
    assert!(rounds.ours.iter().all(|s| *s > 0.0) && rounds.baseline == [1.0, 1.0], "{row:?}");
    // Every VM of the fleet is observed, with its 4 vCPU threads, and its statistics descriptors
    // (the VM's and each vCPU's) are copied into the observer, as from a QEMU 8.1.
    assert_eq!((fact(row, "vms"), fact(row, "vms_asked"), fact(row, "vms_not_observed")), (64.0, 64.0, 0.0));
    assert_eq!(fact(row, "vcpu_threads"), 64.0 * observe_scale::VCPUS_EACH as f64);
    assert_eq!(fact(row, "kvm_stats_descriptors"), 64.0 * 5.0, "{row:?}");
    assert!(fact(row, "descriptors") > fact(row, "kvm_stats_descriptors"));
    let per_refresh_us = row.ours().unwrap().median * 1e6;
    assert!((fact(row, "us_per_vm") * 64.0 - per_refresh_us).abs() < 1e-6 * per_refresh_us);
    assert!((fact(row, "us_per_vcpu_thread") * 256.0 - per_refresh_us).abs() < 1e-6 * per_refresh_us);
    assert!(fact(row, "rss_mib") > 1.0 && fact(row, "vmm_rss_kib") > 100.0, "{row:?}");
    assert_eq!(fact(row, "us_per_vm_over_smallest_row"), 1.0);
    // The chart draws the row's point.
    let svg = chart::scale_svg(&rows).unwrap().unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("per vCPU thread"), "{svg}");
}

#[test]
fn the_big_default_scrape_row_gzips_and_says_both_sizes() {
    let row = default_scrape::gzip_row(&Plan::quiet(2), 3, 2).unwrap();
    assert_eq!(row.name(), default_scrape::FLEET_ROW);
    let rounds = rounds_of(&row);
    assert!(rounds.ours.iter().chain(&rounds.baseline).all(|ms| *ms > 0.0), "{row:?}");
    assert_eq!(fact(&row, "vps"), 6.0);
    assert!(fact(&row, "bytes") > fact(&row, "gzip_bytes") && fact(&row, "gzip_bytes") > 0.0, "{row:?}");
    assert!(fact(&row, "series") > 6.0, "{row:?}");
}

#[test]
fn the_restart_row_adopts_and_claims_every_kept_row_each_round() {
    let _alone = THIS_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    let name = restart::row_name();
    let row = restart::restart_row(&Plan::quiet(2), name.clone().leak());
    let rows = fact(&row, "rows");
    assert_eq!(name, format!("restart-adopt-{rows}-kept-rows-vs-1s"));
    assert_eq!(rows, restart::KEPT_ROWS as f64);
    let rounds = rounds_of(&row);
    assert_eq!(rounds.ours.len(), 2);
    assert!(rounds.ours.iter().all(|s| *s > 0.0) && fact(&row, "fresh_engine_s") > 0.0, "{row:?}");
}

#[test]
fn the_thread_reads_row_reads_every_source_of_each_thread() {
    let _alone = THIS_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    let row = thread_reads::thread_reads_row(&Plan::quiet(2));
    assert_eq!(row.name(), thread_reads::ROW);
    assert_eq!(fact(&row, "threads"), thread_reads::THREADS as f64);
    // One source reads its schedstat (run time, wait, dispatches) and its stat (guest time,
    // faults), each once a refresh.
    assert_eq!(fact(&row, "sources_per_thread"), 1.0);
    let rounds = rounds_of(&row);
    assert!(rounds.ours.iter().chain(&rounds.baseline).all(|ns| *ns > 0.0), "{row:?}");
    assert!((fact(&row, "us_per_vm_of_4") - row.ours().unwrap().median * 4.0 / 1e3).abs() < 1e-9);
}
