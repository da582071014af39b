//! `hvstats run` with enlightened guests: `--no-access-stats` and `--max-stats-pages` change what
//! a guest's HvMapStatsPage gets, and the hardware counters are reported, or why not.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use common::kvm_available;

use std::path::PathBuf;
use std::process::Command;

use hvstats_abi::hypercall::{HV_PARTITION_ID_SELF, HypercallCode, MapStatsPageInput};
use hvstats_abi::{HvStatus, StatsAreaType, StatsObjectIdentity, StatsObjectType};
use hvstats_guest::hyperv::{HypercallLayout, ProbeCall, hypercall_probe};
use hvstats_guest::layout;
use serde_json::Value;
use zerocopy::IntoBytes;

const LAYOUT: HypercallLayout = HypercallLayout { hypercall_page: 0x10_0000, io_pages: 0x10_2000 };

fn map(kind: StatsObjectType, identity: StatsObjectIdentity, page: u64, expect: HvStatus) -> ProbeCall {
    let input = MapStatsPageInput { stats_type: kind, padding: 0, identity, target_gpa_page: page };
    ProbeCall::new(HypercallCode::MAP_STATS_PAGE.0 as u64, input.as_bytes(), expect.0)
}

/// Writes a probe image, runs it with `flags`, and returns the JSON report.
fn run_probe(name: &str, calls: &[ProbeCall], flags: &[&str]) -> Value {
    let dir = std::env::temp_dir().join(format!("hvstats-run-hyperv-{name}-{}", std::process::id()));
    // The runtime directory must exist: `run` never creates one it was pointed at.
    std::fs::create_dir_all(dir.join("rt")).unwrap();
    let image: PathBuf = dir.join("probe.bin");
    std::fs::write(&image, hypercall_probe(LAYOUT, calls, layout::DEFAULT_LOAD_GPA).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["run", "--json", "--memory", "4M", "--runtime-dir"])
        .arg(dir.join("rt"))
        .arg("--image")
        .arg(&image)
        .args(flags)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn vp0_self() -> StatsObjectIdentity {
    StatsObjectIdentity::vp(HV_PARTITION_ID_SELF, 0, StatsAreaType::SELF)
}

#[test]
fn no_access_stats_denies_the_guest() {
    if !kvm_available("no_access_stats_denies_the_guest") {
        return;
    }
    let calls = [map(StatsObjectType::VP, vp0_self(), 0x140, HvStatus::ACCESS_DENIED)];
    let report = run_probe("denied", &calls, &["--no-access-stats"]);
    let vp = &report["vps"][0];
    assert_eq!(vp["exit_status"], 0, "serial: {}", vp["serial"]);
    assert_eq!(vp["counters"][common::total("Hypercalls/sec")], 1);
    assert_eq!(vp["counters"][common::total("GPA space hypercalls/sec")], 1);
}

#[test]
fn max_stats_pages_is_the_guests_quota() {
    if !kvm_available("max_stats_pages_is_the_guests_quota") {
        return;
    }
    let own = StatsObjectIdentity::partition(HV_PARTITION_ID_SELF, StatsAreaType::SELF);
    let calls = [
        map(StatsObjectType::VP, vp0_self(), 0x140, HvStatus::SUCCESS),
        map(StatsObjectType::PARTITION, own, 0x141, HvStatus::INSUFFICIENT_MEMORY),
    ];
    let report = run_probe("quota", &calls, &["--max-stats-pages", "1"]);
    let vp = &report["vps"][0];
    assert_eq!(vp["exit_status"], 0, "serial: {}", vp["serial"]);
    // The map that succeeded changed the GPA space once, beyond the RAM set-up.
    assert_eq!(report["partition"]["counters"][common::total("GPA space modifications/sec")], 2);
    // With the default quota the second map succeeds.
    let calls = [
        map(StatsObjectType::VP, vp0_self(), 0x140, HvStatus::SUCCESS),
        map(StatsObjectType::PARTITION, own, 0x141, HvStatus::SUCCESS),
    ];
    assert_eq!(run_probe("default-quota", &calls, &[])["vps"][0]["exit_status"], 0);
}

#[test]
fn hardware_counters_are_counts_or_a_reason_never_zeros() {
    if !kvm_available("hardware_counters_are_counts_or_a_reason_never_zeros") {
        return;
    }
    let report = run_probe("hardware", &[], &[]);
    let hw = &report["vps"][0]["hardware"];
    match hw.get("unavailable") {
        Some(why) => assert!(!why.as_str().unwrap().is_empty()),
        None => assert!(hw["instructions"].as_u64().unwrap() > 0, "{hw}"),
    }
    let pmu_absent = !std::path::Path::new("/sys/bus/event_source/devices/cpu").exists()
        && !std::path::Path::new("/sys/bus/event_source/devices/cpu_core").exists();
    if pmu_absent && std::env::var_os("HVSTATS_PMU").is_none() {
        assert!(hw["unavailable"].as_str().unwrap().starts_with("no PMU"), "{hw}");
    }
}
