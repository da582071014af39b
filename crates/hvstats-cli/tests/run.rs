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
    assert_eq!(json["partition"]["counters"]["Virtual processors"], 2);
    assert!(json["partition"]["counters"]["GPA pages"].as_u64().unwrap() >= 512);
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
        assert_eq!(counters["CPUID instructions/sec"], e.cpuid);
        assert_eq!(counters["IO intercept messages/sec"], e.io_exits);
        assert_eq!(counters["APIC self IPIs sent/sec"], e.self_ipis);
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
