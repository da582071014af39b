//! `hvstats snapshot` run as a separate process reads the counters of an instance this test
//! publishes, through the published pages.

mod common;

use common::TempDir;

use std::path::Path;
use std::process::Command;

use hvstats::{Hypervisor, InstanceConfig};
use hvstats_abi::ObjectKind;
use hvstats_abi::catalog::{counters_of, hypervisor, partition, vp};
use serde_json::Value;

fn snapshot(dir: &Path, json: bool) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hvstats"));
    cmd.arg("snapshot").arg("--runtime-dir").arg(dir);
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().unwrap();
    (out.status.success(), String::from_utf8(out.stdout).unwrap())
}

fn name(c: hvstats_abi::CounterId) -> &'static str {
    c.counter().unwrap().name
}

#[test]
fn snapshot_json_shows_the_counters_of_a_published_instance() {
    let tmp = TempDir::new("json");
    let hv = Hypervisor::with_config(InstanceConfig {
        runtime_dir: Some(tmp.path().to_path_buf()),
        logical_processors: Some(vec![0]),
        ..Default::default()
    })
    .unwrap();
    let part = hv.create_partition(2).unwrap();
    part.set_ram_pages(100);
    part.vp_page(1).unwrap().set(vp::CPUID_INSTRUCTIONS, 4242);
    part.page().set(partition::GPA_SPACE_MODIFICATIONS, 3);

    let (ok, stdout) = snapshot(tmp.path(), true);
    assert!(ok);
    let v: Value = serde_json::from_str(&stdout).unwrap();
    let instances = v["instances"].as_array().unwrap();
    assert_eq!(instances.len(), 1);
    let i = &instances[0];
    assert_eq!(i["pid"], std::process::id());
    assert_eq!(i["hypervisor"]["counters"][name(hypervisor::PARTITIONS)], 1);
    assert_eq!(i["hypervisor"]["counters"][name(hypervisor::VIRTUAL_PROCESSORS)], 2);
    assert_eq!(i["hypervisor"]["counters"][name(hypervisor::TOTAL_PAGES)], 1 + 1 + 3 + 100);
    assert_eq!(i["lps"].as_array().unwrap().len(), 1);
    assert_eq!(i["lps"][0]["index"], 0);
    let p = &i["partitions"][0];
    assert_eq!(p["id"], part.id());
    assert_eq!(p["counters"][name(partition::GPA_PAGES)], 100);
    assert_eq!(p["counters"][name(partition::GPA_SPACE_MODIFICATIONS)], 3);
    assert_eq!(p["counters"].as_object().unwrap().len(), 8);
    assert_eq!(p["vps"].as_array().unwrap().len(), 2);
    assert_eq!(p["vps"][1]["index"], 1);
    assert_eq!(p["vps"][1]["counters"][name(vp::CPUID_INSTRUCTIONS)], 4242);
    assert_eq!(p["vps"][0]["counters"][name(vp::CPUID_INSTRUCTIONS)], 0);
    // Every VP row of the catalog: seed 001's 65, release 1.1's CPU wait and dispatches, and
    // hvstats' own sequence counter and histograms (by their sums).
    assert_eq!(p["vps"][0]["counters"].as_object().unwrap().len(), counters_of(ObjectKind::Vp).count());
    assert_eq!(counters_of(ObjectKind::Vp).count(), 65 + 2 + 9);
    assert_eq!(p["vps"][0]["counters"][name(vp::CPU_WAIT_TIME_PER_DISPATCH)], 0);

    // A second snapshot sees the writer's new value.
    part.vp_page(1).unwrap().add(vp::CPUID_INSTRUCTIONS, 8);
    let (_, stdout) = snapshot(tmp.path(), true);
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["instances"][0]["partitions"][0]["vps"][1]["counters"][name(vp::CPUID_INSTRUCTIONS)], 4250);

    let (ok, table) = snapshot(tmp.path(), false);
    assert!(ok);
    assert!(table.contains("Hyper-V Hypervisor Virtual Processor"), "{table}");
    let row = table.lines().find(|l| l.trim_start().starts_with(name(vp::CPUID_INSTRUCTIONS))).unwrap();
    assert!(row.contains(" 4250"), "{row}");
}

#[test]
fn snapshot_with_no_live_instance_says_so_and_succeeds() {
    let tmp = TempDir::new("none");
    let (ok, stdout) = snapshot(tmp.path(), true);
    assert!(ok);
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["instances"].as_array().unwrap().len(), 0);
    let (ok, stdout) = snapshot(tmp.path(), false);
    assert!(ok);
    assert!(stdout.starts_with("no live hvstats instance"), "{stdout}");
}

fn euid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

#[test]
fn snapshot_by_a_non_root_user_reports_global_pages_unreadable_not_zero() {
    let tmp = TempDir::new("nonroot");
    // Partition and VP pages are the owner's unless a group is named: name nobody's group.
    let hv = Hypervisor::with_config(InstanceConfig {
        runtime_dir: Some(tmp.path().to_path_buf()),
        logical_processors: Some(vec![0]),
        page_access: hvstats::PageAccess { group: Some(65534) },
        ..Default::default()
    })
    .unwrap();
    let part = hv.create_partition(1).unwrap();
    part.vp_page(0).unwrap().set(vp::HYPERCALLS, 9);
    let mut cmd = if euid() == 0 {
        // As root every file is readable: drop to nobody to see what other users see.
        if !Path::new("/usr/bin/setpriv").exists() {
            eprintln!("setpriv is missing: cannot run the snapshot as a non-root user; skipping");
            return;
        }
        let mut cmd = Command::new("/usr/bin/setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", env!("CARGO_BIN_EXE_hvstats")]);
        cmd
    } else {
        Command::new(env!("CARGO_BIN_EXE_hvstats"))
    };
    let out = cmd.args(["snapshot", "--json", "--runtime-dir"]).arg(tmp.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let i = &v["instances"][0];
    assert_eq!(i["hypervisor"]["permission_denied"], true, "{i}");
    assert!(i["hypervisor"].get("counters").is_none());
    // Which LPs exist is itself in the owner-only global file: none is listed, none reads 0.
    assert_eq!(i["lps"].as_array().map(Vec::len), Some(0), "{i}");
    assert_eq!(i["partitions"][0]["vps"][0]["counters"][name(vp::HYPERCALLS)], 9);
}
