//! Exit-cost histograms and CPU wait through real runs under KVM: port I/O handled by a handler
//! of known duration lands in the right buckets, and VPs made to compete for one CPU with a busy
//! host thread show CPU wait in their pages.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{counts, kvm_available};
use hvstats::Hypervisor;
use hvstats_abi::catalog::vp;
use hvstats_abi::histogram::bucket_of;
use hvstats_abi::page::PageView;
use hvstats_abi::{ObjectKind, boot};
use hvstats_guest::workload::Workload;
use hvstats_guest::{Mode, layout};
use hvstats_kvm::enlightenment::HyperV;
use hvstats_kvm::handlers::{HandlerError, PortAction, PortHandler, VpContext};
use hvstats_kvm::{Handlers, Partition, PartitionConfig, RunReport};
use zerocopy::IntoBytes;

/// How long a write to the slow port takes to handle.
const SLOW: Duration = Duration::from_micros(1200);

/// The sink port made slow for writes (a handler that spins [`SLOW`]), fast for reads.
struct SlowWrites;

impl PortHandler for SlowWrites {
    fn write(&self, _: &mut VpContext<'_>, _: u16, _: &[u8]) -> Result<PortAction, HandlerError> {
        let start = Instant::now();
        while start.elapsed() < SLOW {
            std::hint::spin_loop();
        }
        Ok(PortAction::Continue)
    }
    fn read(&self, _: &mut VpContext<'_>, _: u16, data: &mut [u8]) -> Result<(), HandlerError> {
        data.fill(0);
        Ok(())
    }
}

fn run_partition(w: &Workload, vps: u32, handlers: Handlers) -> (Partition, RunReport) {
    let image = w.build(Mode::Long, layout::DEFAULT_LOAD_GPA).expect("build");
    let hv = Hypervisor::new().expect("hypervisor");
    // However slowly a busy host runs them, the VPs run to their end: the timeout only guards
    // against a hang.
    let mut config =
        PartitionConfig { vp_count: vps, timeout: Duration::from_secs(600), ..Default::default() };
    let mut handlers = handlers;
    HyperV::new(hv.clone(), true).install(&mut config, &mut handlers);
    let partition = Partition::new(&hv, config, handlers).expect("partition");
    partition.load(image.load_gpa, &image.bytes).expect("load");
    let report = partition.run(image.entry).expect("run");
    for v in &report.vps {
        assert!(v.fault.is_none(), "VP {} faulted: {:?}", v.index, v.fault);
        assert_eq!(v.exit_status, Some(w.exit_status), "VP {}", v.index);
    }
    (partition, report)
}

#[test]
fn port_io_of_known_cost_lands_in_the_right_buckets() {
    let w = Workload { out: counts(20, 0), in_: counts(30, 0), exit_status: 3, ..Workload::default() };
    assert!(w.build(Mode::Long, layout::DEFAULT_LOAD_GPA).is_ok());
    if !kvm_available("port_io_of_known_cost_lands_in_the_right_buckets") {
        return;
    }
    let mut handlers = Handlers::builtin();
    handlers.add_port(boot::SINK_PORT, Arc::new(SlowWrites));
    let (partition, _) = run_partition(&w, 1, handlers);
    let page = partition.stats().vp_page(0).expect("VP 0 page");
    let copy = page.consistent_snapshot().into_value();
    let view = PageView::read(copy.as_bytes(), ObjectKind::Vp).unwrap();
    let io = view.histogram(vp::IO_TIME_HISTOGRAM).unwrap();
    // Every port I/O exit handled in userspace is in the histogram: 20 writes, 30 reads and the
    // exit-port write.
    assert_eq!(io.count(), view.get(vp::IO_INTERCEPT_MESSAGES), "{io:?}");
    let slow_floor = bucket_of(SLOW.as_nanos() as u64) - 1;
    let slow: u64 = io.buckets[slow_floor..].iter().sum();
    // Every slow write is there; a fast exit the host preempted may join them, but not the bulk
    // of them (the median is fast).
    assert!(slow >= 20, "the 20 slow writes take a millisecond each: {io:?}");
    assert!(io.sum_ns >= 20 * SLOW.as_nanos() as u64 * 9 / 10, "{io:?}");
    assert_eq!(io.quantile_bucket(0.5).map(|b| b < slow_floor), Some(true), "{io:?}");
    // The cost counter averages the same times.
    let cost_ns = view.get(vp::IO_INSTRUCTIONS_COST) * 100;
    assert!(cost_ns.abs_diff(io.sum_ns) <= 100 * (io.count() + 1), "{cost_ns} vs {io:?}");
}

/// Pins the calling thread (and the threads it starts from now on) to `cpu`.
fn pin_to(cpu: usize) {
    // SAFETY: cpu_set_t is plain data.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is the calling thread; the set is initialised.
    assert_eq!(unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) }, 0);
}

/// The calling thread's current CPU.
fn current_cpu() -> usize {
    // SAFETY: sched_getcpu has no arguments.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).expect("sched_getcpu")
}

#[test]
fn vps_competing_for_one_cpu_with_a_busy_host_thread_show_cpu_wait() {
    // Busy VPs: CPUID is handled in the kernel, so each VP thread stays runnable throughout, for
    // far longer than a scheduler's time slice.
    let w = Workload { cpuid: counts(200_000, 0), exit_status: 4, ..Workload::default() };
    assert!(w.build(Mode::Long, layout::DEFAULT_LOAD_GPA).is_ok());
    if !kvm_available("vps_competing_for_one_cpu_with_a_busy_host_thread_show_cpu_wait") {
        return;
    }
    let cpu = current_cpu();
    let stop = Arc::new(AtomicBool::new(false));
    let host = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            pin_to(cpu);
            while !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
    };
    // The VP threads start from this thread and inherit its affinity.
    pin_to(cpu);
    let started = Instant::now();
    let (partition, _) = run_partition(&w, 2, Handlers::builtin());
    let elapsed_ns = started.elapsed().as_nanos() as u64;
    stop.store(true, Ordering::Relaxed);
    host.join().unwrap();
    for index in 0..2 {
        let page = partition.stats().vp_page(index).expect("VP page");
        let wait_ns = page.get(vp::CPU_WAIT_TIME_PER_DISPATCH);
        let dispatches = page.get(vp::DISPATCHES);
        assert!(wait_ns > 0, "VP {index}: three busy threads on one CPU, yet no wait");
        assert!(dispatches >= 2, "VP {index}: {dispatches} dispatches");
        // Running and waiting are disjoint parts of the thread's life, which the run contains.
        let run_ns = page.get(vp::TOTAL_RUN_TIME) * 100;
        assert!(
            run_ns + wait_ns <= elapsed_ns,
            "VP {index}: run {run_ns} + wait {wait_ns} > {elapsed_ns} ns"
        );
    }
}
