//! A real QEMU/KVM VM's vCPU threads read by the kernel's task iterator (source `thread-iter`):
//! their run time, dispatches and migrations on the VP pages are what the kernel keeps of each
//! thread from its start, bracketed by `/proc`'s readings of the same thread just before and just
//! after the observer's refresh, and the migrations hold no perf counter (no `thread-clock`
//! source). Needs root; without the iterator it says "skipped", and fails under
//! `HVSTATS_REQUIRE_KVM=1`.

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod observe_support;

use std::time::{Duration, Instant};

use hvstats::Hypervisor;
use hvstats_abi::catalog::vp;
use hvstats_host::sched::{SchedStat, SchedStatFile, path_under};
use hvstats_observe::{ObserveOptions, Observer, Procfs, Targets};
use hvstats_testkit::wait_for_kvm_vcpus;
use observe_support::{Qemu, TempDir, kvm_available};

/// A vCPU thread's schedstat and migrations, as `/proc` shows them.
fn from_proc(pid: i32, tid: i32) -> (SchedStat, Option<u64>) {
    let sched = SchedStatFile::open_path(&path_under(std::path::Path::new("/proc"), pid, tid)).unwrap();
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/sched")).ok();
    let migrations = text.and_then(|t| {
        let line = t.lines().find(|l| l.starts_with("se.nr_migrations"))?.to_owned();
        line.split(':').nth(1)?.trim().parse().ok()
    });
    (sched.read().unwrap(), migrations)
}

#[test]
fn a_kvm_vms_vcpu_threads_are_read_by_the_task_iterator_from_their_start() {
    let test = "a_kvm_vms_vcpu_threads_are_read_by_the_task_iterator_from_their_start";
    if !kvm_available(test) {
        return;
    }
    if !observe_support::task_iterator_available(test) {
        return;
    }
    let tmp = TempDir::new("kvm-thread-iter");
    let Some(qemu) = Qemu::start(tmp.path(), "ctl", "kvm", &["-smp", "2"]) else { return };
    let pid = qemu.pid();
    wait_for_kvm_vcpus(pid, 2, Duration::from_secs(10));
    qemu.connect().cont().unwrap();
    let hv = Hypervisor::new().unwrap();
    let mut observer =
        Observer::new(hv.clone(), Procfs::host(), Targets::Pids(vec![pid]), ObserveOptions::default());
    let t = Instant::now();
    while !observer.vms().next().is_some_and(|v| v.vcpu_threads().iter().all(Option::is_some)) {
        assert!(t.elapsed() < Duration::from_secs(60), "the vCPU threads are known within a minute");
        observer.tick();
        std::thread::sleep(Duration::from_millis(50));
    }
    let vm = observer.vms().next().unwrap();
    for counter in
        [vp::TOTAL_RUN_TIME, vp::DISPATCHES, vp::CPU_WAIT_TIME_PER_DISPATCH, vp::LOGICAL_PROCESSOR_MIGRATIONS]
    {
        assert_eq!(vm.source_of(counter), Some("thread-iter"), "{counter:?}");
    }
    let names: Vec<&str> = vm.sources().iter().map(|s| s.name()).collect();
    assert!(!names.contains(&"thread-clock") && !names.contains(&"thread"), "{names:?}");
    let threads: Vec<i32> = vm.vcpu_threads().into_iter().flatten().collect();
    let part = hv.partitions()[0].clone();
    for _ in 0..3 {
        let before: Vec<_> = threads.iter().map(|&tid| from_proc(pid, tid)).collect();
        observer.tick();
        let after: Vec<_> = threads.iter().map(|&tid| from_proc(pid, tid)).collect();
        for (index, ((b, bm), (a, am))) in before.iter().zip(&after).enumerate() {
            let page = part.vp_page(index as u32).unwrap();
            let run = page.get(vp::TOTAL_RUN_TIME);
            assert!((b.run_ns / 100..=a.run_ns / 100).contains(&run), "VP {index}: {run} in {b:?}..{a:?}");
            let dispatches = page.get(vp::DISPATCHES);
            assert!((b.dispatches..=a.dispatches).contains(&dispatches), "VP {index}: {dispatches}");
            if let (Some(bm), Some(am)) = (bm, am) {
                let migrations = page.get(vp::LOGICAL_PROCESSOR_MIGRATIONS);
                assert!((*bm..=*am).contains(&migrations), "VP {index}: {migrations} in {bm}..{am}");
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
