//! `hvstats run --image … --json` on guests with exactly known counts, and on a faulting guest.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use common::kvm_available;

use std::process::Command;

use hvstats_guest::program::LoopCount;
use hvstats_guest::{Mode, Program, Workload, layout};
use serde_json::Value;

fn run_image(bytes: &[u8], name: &str, extra: &[&str]) -> (Option<i32>, Value, String) {
    let path = std::env::temp_dir().join(format!("hvstats-run-{}-{name}.bin", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .arg("run")
        .arg("--image")
        .arg(&path)
        .args(extra)
        .arg("--json")
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let json = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"));
    (out.status.code(), json, String::from_utf8_lossy(&out.stderr).to_string())
}

#[test]
fn json_reports_exact_counts_per_vp_in_the_issue_shape() {
    if !kvm_available("json_reports_exact_counts_per_vp_in_the_issue_shape") {
        return;
    }
    let w = Workload {
        cpuid: LoopCount::per_vp(200, 100),
        out: LoopCount::per_vp(50, 10),
        in_: LoopCount::per_vp(40, 0),
        rdmsr: LoopCount::per_vp(30, 5),
        hlt: LoopCount::per_vp(5, 1),
        eoi: LoopCount::per_vp(20, 0),
        self_ipi: LoopCount::per_vp(10, 2),
        serial: b"hi".to_vec(),
        exit_status: 9,
        ..Workload::default()
    };
    let image = w.build(Mode::Long, layout::DEFAULT_LOAD_GPA).unwrap();
    let (code, json, stderr) = run_image(&image.bytes, "counts", &["--vps", "2", "--mode", "long"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(json["partition"]["counters"][common::total("Virtual processors")], 2);
    assert!(json["partition"]["counters"][common::total("GPA pages")].as_u64().unwrap() >= 512);
    let vps = json["vps"].as_array().unwrap();
    assert_eq!(vps.len(), 2);
    for (i, vp) in vps.iter().enumerate() {
        let e = w.expected(i as u32);
        assert_eq!(vp["index"], i);
        assert_eq!(vp["exit_status"], 9);
        assert_eq!(vp["serial"], "hi");
        assert!(vp["runtime"]["TotalRuntime100ns"].as_u64().unwrap() > 0);
        assert!(vp["runtime"]["HypervisorRuntime100ns"].is_u64());
        let ic = &vp["intercepts"];
        for name in [
            "PageInvalidations",
            "ControlRegisterAccesses",
            "IoInstructions",
            "HaltInstructions",
            "CpuidInstructions",
            "MsrAccesses",
            "OtherIntercepts",
            "PendingInterrupts",
            "EmulatedInstructions",
            "DebugRegisterAccesses",
            "PageFaultIntercepts",
        ] {
            assert!(ic[name]["Count"].is_u64() && ic[name]["Time100ns"].is_u64(), "{name}");
        }
        assert_eq!(ic["CpuidInstructions"]["Count"], e.cpuid);
        assert_eq!(ic["IoInstructions"]["Count"], e.io);
        assert_eq!(ic["MsrAccesses"]["Count"], e.msr);
        assert_eq!(ic["HaltInstructions"]["Count"], e.hlt);
        assert!(vp["events"]["InterruptCount"].as_u64().unwrap() >= e.interrupts);
        assert!(vp["events"]["PageFaultCount"].is_u64() && vp["events"]["ExceptionCount"].is_u64());
        assert_eq!(vp["apic"]["MmioAccessCount"], e.apic_mmio);
        assert_eq!(vp["apic"]["EoiAccessCount"], e.eoi);
        assert_eq!(vp["apic"]["TprAccessCount"], 0);
        assert_eq!(vp["apic"]["SentIpiCount"], e.ipis);
        assert_eq!(vp["apic"]["SelfIpiCount"], e.self_ipis);
        let counters = vp["counters"].as_object().unwrap();
        assert_eq!(counters.len(), hvstats_abi::catalog::counters_of(hvstats_abi::ObjectKind::Vp).count());
        assert_eq!(counters["cpuid_instructions_total"], e.cpuid);
        assert_eq!(counters["io_intercept_messages_total"], e.io_exits);
        assert_eq!(counters["apic_self_ipis_sent_total"], e.self_ipis);
        // Every exit of the VP, whatever its reason: at least its port I/O exits to userspace.
        assert!(counters["exits_total"].as_u64().unwrap() >= e.io_exits, "{counters:?}");
        // What KVM cannot maintain is unknown, not a 0.
        assert!(counters["mwait_instructions_total"].is_null());
    }
}

#[test]
fn a_faulting_guest_is_reported_with_rip_and_exit_status_3() {
    if !kvm_available("a_faulting_guest_is_reported_with_rip_and_exit_status_3") {
        return;
    }
    let mut p = Program::new(Mode::Protected, layout::DEFAULT_LOAD_GPA).unwrap();
    p.asm().ud2().unwrap();
    let image = p.finish().unwrap();
    let (code, json, stderr) = run_image(&image.bytes, "fault", &["--mode", "protected", "--timeout", "20"]);
    assert_eq!(code, Some(3), "{stderr}");
    let fault = &json["vps"][0]["fault"];
    assert!(fault["reason"].as_str().unwrap().contains("KVM_EXIT"), "{fault}");
    assert!(fault["rip"].is_u64());
    assert!(json["vps"][0]["exit_status"].is_null());
    assert!(stderr.contains("faulted at RIP"), "{stderr}");
}

/// A guest that spins forever: `run` stops it at `--timeout`, which is no fault.
#[test]
fn a_guest_still_running_at_the_timeout_is_reported_as_timed_out_not_as_a_fault() {
    if !kvm_available("a_guest_still_running_at_the_timeout_is_reported_as_timed_out_not_as_a_fault") {
        return;
    }
    let mut p = Program::new(Mode::Protected, layout::DEFAULT_LOAD_GPA).unwrap();
    let mut spin = p.asm().create_label();
    p.asm().set_label(&mut spin).unwrap();
    p.asm().jmp(spin).unwrap();
    let image = p.finish().unwrap();
    let (code, json, stderr) = run_image(&image.bytes, "spin", &["--mode", "protected", "--timeout", "1"]);
    assert_eq!(code, Some(3), "a VP that did not stop in time is status 3: {stderr}");
    let vp = &json["vps"][0];
    assert!(vp["fault"].is_null(), "{vp}");
    assert_eq!(vp["stopped"]["kind"], "timeout", "{vp}");
    assert!(!stderr.contains("faulted"), "{stderr}");
    assert!(stderr.contains("did not stop within --timeout 1 s"), "{stderr}");
}

fn runtime_dir(name: &str) -> common::TempDir {
    let dir = common::TempDir::new(name);
    std::fs::create_dir_all(dir.path()).unwrap();
    dir
}

#[test]
fn the_demo_runs_for_its_duration_repeating_its_traffic_and_exits_0() {
    if !kvm_available("the_demo_runs_for_its_duration_repeating_its_traffic_and_exits_0") {
        return;
    }
    let dir = runtime_dir("run-duration");
    let started = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["run", "--json", "--duration", "2", "--runtime-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(took >= std::time::Duration::from_secs(2), "stopped after {took:?}");
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let elapsed = json["elapsed_seconds"].as_f64().unwrap();
    assert!((2.0..took.as_secs_f64()).contains(&elapsed), "ran {elapsed} s of {took:?}");
    let vps = json["vps"].as_array().unwrap();
    assert_eq!(vps.len(), 4);
    for (i, vp) in vps.iter().enumerate() {
        assert!(vp["fault"].is_null(), "{vp}");
        assert_eq!(vp["stopped"]["kind"], "timeout", "{vp}");
        // One pass of the demo is 2000 + 500 i CPUIDs: the traffic repeated.
        let cpuid = vp["counters"][common::total("CPUID instructions/sec")].as_u64().unwrap();
        assert!(cpuid > 2000 + 500 * i as u64, "VP {i}: {cpuid} CPUIDs, one pass or less");
    }
}

#[test]
fn the_demo_runs_forever_until_ctrl_c_while_another_shell_watches_it() {
    if !kvm_available("the_demo_runs_forever_until_ctrl_c_while_another_shell_watches_it") {
        return;
    }
    let dir = runtime_dir("run-forever");
    let child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["run", "--forever", "--vps", "1", "--runtime-dir"])
        .arg(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let cpuids = || -> Option<u64> {
        let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
            .args(["snapshot", "--json", "--runtime-dir"])
            .arg(dir.path())
            .output()
            .unwrap();
        let snap: Value = serde_json::from_slice(&out.stdout).ok()?;
        snap["instances"][0]["partitions"][0]["vps"][0]["counters"][common::total("CPUID instructions/sec")]
            .as_u64()
    };
    // Another shell sees the counts grow past several passes of the demo, for as long as it runs.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut seen = 0;
    while seen <= 3 * 2000 {
        assert!(std::time::Instant::now() < deadline, "the running demo's CPUIDs stayed at {seen}");
        std::thread::sleep(std::time::Duration::from_millis(200));
        seen = cpuids().unwrap_or(0);
    }
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "Ctrl-C is how --forever ends: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("VP 0 — stopped before it exited (stop requested)"), "{stdout}");
    assert!(!stdout.contains("FAULT"), "{stdout}");
}

/// A user who is not root and not in the `kvm` group is told how to get a runtime directory of
/// their own and access to /dev/kvm, not to chown root's directory.
#[test]
fn a_non_root_run_says_how_to_get_a_runtime_directory_and_kvm_access() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !std::path::Path::new("/usr/bin/setpriv").exists() || !root {
        eprintln!("needs root and setpriv to run as nobody: skipped");
        return;
    }
    let dir = runtime_dir("run-nonroot");
    let out = Command::new("/usr/bin/setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", env!("CARGO_BIN_EXE_hvstats")])
        .args(["run", "--runtime-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("chown"), "{stderr}");
    assert!(stderr.contains("use a runtime directory of your own"), "{stderr}");
    if std::path::Path::new("/dev/kvm").exists() {
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("cannot open /dev/kvm (its group is `kvm`"), "{stderr}");
    }
}

/// A partition of `run` is its `--name` in every series and in `vm_info`, which alone carries
/// the pids; it counts every exit of its VPs; a second run of the same name makes the same
/// series again (no pid in a label, so Prometheus sees one series across runs).
#[test]
fn run_name_labels_its_series_without_a_pid_and_counts_every_exit() {
    if !kvm_available("run_name_labels_its_series_without_a_pid_and_counts_every_exit") {
        return;
    }
    let tmp = common::TempDir::new("run-name");
    let mut series_of_runs = Vec::new();
    for _ in 0..2 {
        let child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
            .args(["run", "--name", "web-7", "--vps", "1", "--forever", "--runtime-dir"])
            .arg(tmp.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id().to_string();
        let _run = common::KilledOnDrop(child);
        // Until the partition has run a while: its exits show.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let text = loop {
            let text = common::scrape(tmp.path());
            let exits = text.lines().find(|l| l.starts_with("hvstats_vp_exits_total{vm=\"web-7\",vp=\"0\"}"));
            if exits.and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok()).is_some_and(|n| n > 0) {
                break text;
            }
            assert!(std::time::Instant::now() < deadline, "no exits counted:\n{text}");
            std::thread::sleep(std::time::Duration::from_millis(200));
        };
        let info = text.lines().find(|l| l.starts_with("hvstats_vm_info{")).unwrap();
        assert!(
            info.contains("vm=\"web-7\"") && info.contains(&format!("publisher_pid=\"{pid}\"")),
            "{info}"
        );
        let series: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with("hvstats_vp_") || l.starts_with("hvstats_partition_"))
            .map(|l| l.rsplit_once(' ').unwrap().0.to_owned())
            .collect();
        // A label whose value is the pid (not the pid's digits inside another value: a bucket
        // bound such as le="0.067108864" holds "671").
        let as_label = format!("=\"{pid}\"");
        for s in &series {
            assert!(!s.contains(&as_label), "a pid in a series' labels: {s}");
        }
        series_of_runs.push(series);
    }
    assert_eq!(series_of_runs[0], series_of_runs[1], "the second run made other series");
}
