//! A root tool in another process attaches to a running partition and sees its counters grow:
//! `hvstats snapshot` maps the published pages, with no request to the process running the guest.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use common::kvm_available;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hvstats::{Hypervisor, InstanceConfig};
use hvstats_abi::catalog::vp;
use hvstats_guest::{Mode, Program, layout};
use hvstats_kvm::{HandlerError, Handlers, Partition, PartitionConfig, PortAction, PortHandler, VpContext};
use iced_x86::code_asm::*;
use serde_json::Value;

/// The guest polls this port between batches of CPUIDs; it reads 1 once the test says stop.
const STOP_PORT: u16 = 0xE2;

struct StopPort(Arc<AtomicBool>);

impl PortHandler for StopPort {
    fn write(&self, _: &mut VpContext<'_>, _: u16, _: &[u8]) -> Result<PortAction, HandlerError> {
        Ok(PortAction::Continue)
    }
    fn read(&self, _: &mut VpContext<'_>, _: u16, data: &mut [u8]) -> Result<(), HandlerError> {
        data.fill(0);
        data[0] = u8::from(self.0.load(Ordering::SeqCst));
        Ok(())
    }
}

/// CPUIDs in batches of 1000 until the stop port reads nonzero, then exit 0.
fn cpuid_until_stopped() -> hvstats_guest::GuestImage {
    let mut p = Program::new(Mode::Long, layout::DEFAULT_LOAD_GPA).unwrap();
    let a = p.asm();
    let mut top = a.create_label();
    let mut inner = a.create_label();
    a.set_label(&mut top).unwrap();
    a.mov(r12d, 1000u32).unwrap();
    a.set_label(&mut inner).unwrap();
    a.xor(eax, eax).unwrap();
    a.cpuid().unwrap();
    a.dec(r12d).unwrap();
    a.jnz(inner).unwrap();
    a.mov(dx, STOP_PORT as u32).unwrap();
    a.in_(al, dx).unwrap();
    a.test(al, al).unwrap();
    a.jz(top).unwrap();
    p.exit(0).unwrap();
    p.finish().unwrap()
}

fn snapshot(dir: &Path) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .arg("snapshot")
        .arg("--json")
        .arg("--runtime-dir")
        .arg(dir)
        .output()
        .unwrap();
    // 4: nothing publishes any more, an empty reading.
    assert!(out.status.success() || out.status.code() == Some(4), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn cpuids_seen(snap: &Value, partition_id: u64) -> Option<u64> {
    let name = vp::CPUID_INSTRUCTIONS.counter().unwrap().name;
    snap["instances"].as_array()?.iter().find_map(|i| {
        let p = i["partitions"].as_array()?.iter().find(|p| p["id"].as_u64() == Some(partition_id))?;
        p["vps"][0]["counters"][common::total(name)].as_u64()
    })
}

#[test]
fn a_second_process_sees_a_running_guests_counters_grow() {
    if !kvm_available("a_second_process_sees_a_running_guests_counters_grow") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("hvstats-attach-running-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let hv = Hypervisor::with_config(InstanceConfig {
        runtime_dir: Some(PathBuf::from(&dir)),
        ..Default::default()
    })
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut handlers = Handlers::builtin();
    handlers.add_port(STOP_PORT, Arc::new(StopPort(stop.clone())));
    let config = PartitionConfig { timeout: Duration::from_secs(120), ..Default::default() };
    let partition = Partition::new(&hv, config, handlers).unwrap();
    let id = partition.stats().id();
    let image = cpuid_until_stopped();
    partition.load(image.load_gpa, &image.bytes).unwrap();

    let report = std::thread::scope(|s| {
        let runner = s.spawn(|| partition.run(image.entry));
        // Wait until the collector has merged some CPUIDs into the page, then look again.
        let deadline = Instant::now() + Duration::from_secs(60);
        let first = loop {
            if let Some(n) = cpuids_seen(&snapshot(&dir), id).filter(|&n| n > 0) {
                break n;
            }
            assert!(Instant::now() < deadline, "no CPUIDs seen by the attached reader");
            std::thread::sleep(Duration::from_millis(50));
        };
        let second = loop {
            let n = cpuids_seen(&snapshot(&dir), id).expect("partition still published");
            if n > first {
                break n;
            }
            assert!(Instant::now() < deadline, "the attached reader's count stayed at {first}");
            std::thread::sleep(Duration::from_millis(50));
        };
        // Over an interval, the same reader shows perfmon's presentation: a rate for the
        // running guest's CPUIDs, the VP count as it is, and no average for a cost nobody keeps.
        // The run loop merges a batch at a time; on a loaded host a batch can take longer than
        // an interval, so the interval doubles until one holds a merge.
        let mut seconds = 0.3;
        let (vp0, part) = loop {
            let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
                .args(["snapshot", "--json", "--interval", &seconds.to_string(), "--runtime-dir"])
                .arg(&dir)
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let snap: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert!(snap["interval_seconds"].as_f64().unwrap() >= seconds);
            let instance = &snap["instances"].as_array().unwrap()[0];
            let part =
                instance["partitions"].as_array().unwrap().iter().find(|p| p["id"] == id).unwrap().clone();
            let vp0 = part["vps"][0]["interval"].clone();
            let rate = vp0["cpuid_instructions_per_second"].as_f64().unwrap();
            if rate > 0.0 || seconds > 20.0 {
                break (vp0, part);
            }
            seconds *= 2.0;
        };
        assert!(vp0["cpuid_instructions_per_second"].as_f64().unwrap() > 0.0, "{vp0}");
        assert!(vp0["cpuid_instructions_time_per_event_ns"].is_null(), "{vp0}");
        assert_eq!(part["interval"][common::presented("Virtual processors")].as_f64(), Some(1.0));
        stop.store(true, Ordering::SeqCst);
        let report = runner.join().unwrap().unwrap();
        assert!(second > first);
        report
    });
    assert_eq!(report.vps[0].exit_status, Some(0), "{:?}", report.vps[0].fault);
    // The final count the reader sees is the count the VP page holds.
    let last = cpuids_seen(&snapshot(&dir), id).unwrap();
    assert_eq!(last, partition.stats().vp_page(0).unwrap().get(vp::CPUID_INSTRUCTIONS));
    assert_eq!(last % 1000, 0, "whole batches of 1000 CPUIDs: {last}");
    drop(partition);
    drop(hv);
    assert_eq!(snapshot(&dir)["instances"].as_array().map(Vec::len), Some(0));
    let _ = std::fs::remove_dir_all(&dir);
}
