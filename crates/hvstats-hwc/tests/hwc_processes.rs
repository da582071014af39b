//! The table shared between processes: a holder killed with SIGKILL releases what it held, an
//! allocation made "until freed" outlives its process, and concurrent allocation from several
//! processes never hands out the same resource twice.
//!
//! The other processes are this test binary, started on its ignored `worker` test with
//! `HWC_WORKER` naming the role.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod hwc_support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use hvstats_abi::hal::{
    GroupAffinity, NtStatus, PhysicalCounterResourceDescriptor as D, PhysicalCounterResourceList,
};
use hvstats_hwc::{Allocator, CpuSet, Lifetime, PmuShape, ResourceSet};
use hwc_support::{Model, TempRuntime, allocator, keys};

const ROLE: &str = "HWC_WORKER";
const DIR: &str = "HWC_WORKER_DIR";
const AUDIT: &str = "HWC_WORKER_AUDIT";
const ROUNDS: &str = "HWC_WORKER_ROUNDS";
const TOGETHER: &str = "HWC_WORKERS_TOGETHER";

/// The stress PMU: 2 general-purpose + 1 fixed counter on each of 4 processors, so requests collide.
fn small_pmu() -> PmuShape {
    PmuShape::uniform(4, 2, 1).unwrap()
}

fn spawn(role: &str, rt: &TempRuntime, extra: &[(&str, String)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--ignored", "--exact", "worker", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(DIR, rt.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// What follows `prefix` on the first line of the worker's output that has it (the test harness
/// may print its own words before it on the same line).
fn read_line(child: &mut Child, prefix: &str) -> String {
    let out = child.stdout.as_mut().unwrap();
    let mut reader = BufReader::new(out);
    let mut line = String::new();
    loop {
        line.clear();
        assert_ne!(reader.read_line(&mut line).unwrap(), 0, "worker ended before printing {prefix:?}");
        if let Some(at) = line.find(prefix) {
            return line[at + prefix.len()..].trim().to_owned();
        }
    }
}

/// Not a test: the body of the worker processes the tests below start.
#[test]
#[ignore = "runs only as a worker process of the tests in this file"]
fn worker() {
    let role = std::env::var(ROLE).expect("started by a test of this file");
    let dir = std::path::PathBuf::from(std::env::var(DIR).unwrap());
    match role.as_str() {
        "hold" | "persist" => {
            let a = Allocator::open(&dir, hwc_support::pmu_6_3_128()).unwrap();
            let lifetime = if role == "hold" { Lifetime::Process } else { Lifetime::UntilFreed };
            let d = [D::range(0, 8), D::overflow(1)];
            let h = a.try_allocate(None, Some(&PhysicalCounterResourceList::new(&d)), lifetime).unwrap();
            println!("hwc-handle {h}");
            if role == "hold" {
                // Until killed; bounded so that a test that fails before killing leaves nothing behind.
                std::thread::sleep(std::time::Duration::from_secs(120));
                panic!("the holder was not killed within 120 s");
            }
        }
        "stress" => {
            let a = Allocator::open(&dir, small_pmu()).unwrap().with_audit_log(std::env::var(AUDIT).unwrap());
            let rounds: u32 = std::env::var(ROUNDS).unwrap().parse().unwrap();
            // Start together, however long each process took to start: the workload must contend.
            let together: usize = std::env::var(TOGETHER).unwrap().parse().unwrap();
            std::fs::write(dir.join(format!("ready-{}", std::process::id())), "").unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
            while std::fs::read_dir(&dir)
                .unwrap()
                .filter(|e| e.as_ref().is_ok_and(|e| e.file_name().to_string_lossy().starts_with("ready-")))
                .count()
                < together
            {
                assert!(std::time::Instant::now() < deadline, "the other workers did not start within 120 s");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            let mut rng = u64::from(std::process::id()) | 1;
            let mut next = move || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let (mut grants, mut refusals) = (0, 0);
            let mut held = Vec::new();
            for _ in 0..rounds {
                let mask = next() % 15 + 1;
                let affinity = [GroupAffinity::new(0, mask)];
                let d = match next() % 6 {
                    0 => vec![D::single((next() % 3) as u32)],
                    1 => vec![D::range(0, 1)],
                    2 => vec![D::single(2), D::overflow(1)],
                    3 => vec![D::event_buffer(1, 0, 8), D::identification_tag((next() % 2) as u32)],
                    4 => vec![D::identification_tag((next() % 2) as u32)],
                    _ => vec![],
                };
                let list = (!d.is_empty()).then(|| PhysicalCounterResourceList::new(&d));
                match a.allocate(Some(&affinity), list.as_ref()) {
                    Ok(h) => {
                        grants += 1;
                        held.push(h);
                    }
                    Err(s) => {
                        assert_eq!(s, NtStatus::INSUFFICIENT_RESOURCES);
                        refusals += 1;
                    }
                }
                // Hold up to two allocations at a time, freeing the oldest.
                if held.len() > 1 || (next() % 2 == 0 && !held.is_empty()) {
                    assert_eq!(a.free(held.remove(0)), NtStatus::SUCCESS);
                }
            }
            for h in held {
                assert_eq!(a.free(h), NtStatus::SUCCESS);
            }
            println!("hwc-grants {grants} refusals {refusals}");
        }
        other => panic!("unknown worker role {other}"),
    }
}

#[test]
fn a_holder_killed_with_sigkill_releases_what_it_held() {
    let rt = TempRuntime::new("hwc-sigkill");
    let a = allocator(&rt);
    let mut child = spawn("hold", &rt, &[]);
    let handle: u64 = read_line(&mut child, "hwc-handle").parse().unwrap();
    let all = a.allocations().unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].handle.raw(), handle);
    assert_eq!(all[0].holder.pid, child.id());
    assert!(!all[0].holder.persistent);
    let d = [D::single(3)];
    let list = PhysicalCounterResourceList::new(&d);
    assert_eq!(
        a.allocate(Some(&[GroupAffinity::new(1, 1)]), Some(&list)),
        Err(NtStatus::INSUFFICIENT_RESOURCES)
    );

    // Child::kill sends SIGKILL.
    child.kill().unwrap();
    child.wait().unwrap();
    let h = a
        .allocate(Some(&[GroupAffinity::new(1, 1)]), Some(&list))
        .expect("the dead holder's counters are free");
    assert!(h.raw() > handle);
    assert_eq!(a.allocations().unwrap().len(), 1, "the dead holder's record is gone");
    assert_eq!(a.free(hvstats_hwc::CounterSetHandle::from_raw(handle)), NtStatus::INVALID_PARAMETER);
}

#[test]
fn an_allocation_until_freed_outlives_its_process() {
    let rt = TempRuntime::new("hwc-persist");
    let a = allocator(&rt);
    let mut child = spawn("persist", &rt, &[]);
    let handle: u64 = read_line(&mut child, "hwc-handle").parse().unwrap();
    assert!(child.wait().unwrap().success());
    let all = a.allocations().unwrap();
    assert_eq!(all.len(), 1);
    assert!(all[0].holder.persistent);
    assert_eq!(a.allocate(None, None), Err(NtStatus::INSUFFICIENT_RESOURCES));
    assert_eq!(a.free(hvstats_hwc::CounterSetHandle::from_raw(handle)), NtStatus::SUCCESS);
    assert!(a.allocate(None, None).is_ok());
}

#[derive(serde::Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Audit {
    Grant { seq: u64, handle: u64, pid: u32, cpus: CpuSet, resources: ResourceSet },
    Release { seq: u64, handle: u64 },
}

#[test]
fn concurrent_processes_never_hold_the_same_resource_twice() {
    const WORKERS: usize = 4;
    const ROUNDS_EACH: u32 = 200;
    let rt = TempRuntime::new("hwc-stress");
    let audit = rt.path().join("audit.jsonl");
    let extra = [
        (AUDIT, audit.display().to_string()),
        (ROUNDS, ROUNDS_EACH.to_string()),
        (TOGETHER, WORKERS.to_string()),
    ];
    let mut children: Vec<Child> = (0..WORKERS).map(|_| spawn("stress", &rt, &extra)).collect();
    let mut reported_grants = 0u64;
    for child in &mut children {
        let summary = read_line(child, "hwc-grants");
        reported_grants += summary.split_whitespace().next().unwrap().parse::<u64>().unwrap();
        assert!(child.wait().unwrap().success());
    }

    // Replay the log, written under the table lock in the order the table changed.
    let text = std::fs::read_to_string(&audit).unwrap();
    let mut model = Model::default();
    let (mut grants, mut releases, mut last_seq) = (0u64, 0u64, 0u64);
    let mut handles = std::collections::HashSet::new();
    // Which process holds each live handle, and the most processes holding at one moment.
    let mut holders = std::collections::HashMap::new();
    let mut most_processes_at_once = 0;
    for line in text.lines() {
        let entry: Audit = serde_json::from_str(line).unwrap();
        let seq = match entry {
            Audit::Grant { seq, handle, pid, cpus, resources } => {
                grants += 1;
                assert!(handles.insert(handle), "handle {handle} granted twice");
                let cpus: Vec<u32> = cpus.iter().collect();
                model.grant(handle, &cpus, &keys(&resources)).unwrap();
                holders.insert(handle, pid);
                let pids: std::collections::HashSet<u32> = holders.values().copied().collect();
                most_processes_at_once = most_processes_at_once.max(pids.len());
                seq
            }
            Audit::Release { seq, handle } => {
                releases += 1;
                assert!(model.release(handle), "handle {handle} released but not held");
                holders.remove(&handle);
                seq
            }
        };
        assert_eq!(seq, last_seq + 1, "the log has every change, in order");
        last_seq = seq;
    }
    assert_eq!(grants, reported_grants);
    assert_eq!(releases, grants);
    assert!(model.handles().is_empty());
    assert!(allocator(&rt).allocations().unwrap().is_empty());
    eprintln!(
        "{WORKERS} processes x {ROUNDS_EACH} requests: {grants} grants, {} refusals, up to {most_processes_at_once} processes holding at once",
        WORKERS as u64 * u64::from(ROUNDS_EACH) - grants
    );
    // The workload must actually contend, across processes, or the check proves nothing.
    assert!(most_processes_at_once >= 2, "the workers never held allocations at the same time");
    assert!(grants > 100 && grants < u64::from(ROUNDS_EACH) * WORKERS as u64, "{grants} grants");
}

#[test]
fn concurrent_threads_never_hold_the_same_resource_twice() {
    const THREADS: u64 = 6;
    const ROUNDS_EACH: u64 = 100;
    let rt = TempRuntime::new("hwc-threads");
    let audit = rt.path().join("audit.jsonl");
    let a = Allocator::open(rt.path(), small_pmu()).unwrap().with_audit_log(&audit);
    let granted: u64 = std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let a = a.clone();
                s.spawn(move || {
                    let mut grants = 0;
                    for i in 0..ROUNDS_EACH {
                        let cpu = (t + i) % 4;
                        let d = [D::single(((t * 7 + i) % 3) as u32), D::identification_tag((i % 2) as u32)];
                        let list = PhysicalCounterResourceList::new(&d);
                        let affinity = [GroupAffinity::new(0, 1 << cpu | 1 << ((cpu + 1) % 4))];
                        if let Ok(h) = a.allocate(Some(&affinity), Some(&list)) {
                            grants += 1;
                            std::thread::yield_now();
                            assert_eq!(a.free(h), NtStatus::SUCCESS);
                        }
                    }
                    grants
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    let mut model = Model::default();
    let mut grants = 0;
    for line in std::fs::read_to_string(&audit).unwrap().lines() {
        match serde_json::from_str::<Audit>(line).unwrap() {
            Audit::Grant { handle, cpus, resources, .. } => {
                grants += 1;
                model.grant(handle, &cpus.iter().collect::<Vec<_>>(), &keys(&resources)).unwrap();
            }
            Audit::Release { handle, .. } => assert!(model.release(handle)),
        }
    }
    assert_eq!(grants, granted);
    assert!(model.handles().is_empty());
    assert!(granted > 0);
}
