//! What bringing a VP page up to date costs: the merge of a VP's kernel sources on its own
//! thread (what the VP thread does before every hypercall), and the hypercall round trip it sits
//! on, next to a plain userspace exit round trip (an OUT to the sink port) for comparison.
//!
//! `cargo bench -p hvstats-bench --bench refresh`

// Bench set-up: a failed step is the run's failure, reported by the panic; criterion_group!
// defines an undocumented public function.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::os::fd::AsRawFd;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use hvstats::{Hypervisor, SharedPage};
use hvstats_abi::ObjectKind;
use hvstats_bench::guest::{exit_round_trip, hypercall_round_trip};
use hvstats_kvm::accounting::VpSources;
use hvstats_sources::counter_source::VpThread;
use hvstats_sources::kvm_stats::{KvmStats, Stat};
use hvstats_sources::perf_sw::Migrations;
use hvstats_sources::thread_time::{ThreadClock, gettid};
use hvstats_sources::tracepoint::VpTracepoints;
use hvstats_testkit::IdleVcpu;

fn refresh(c: &mut Criterion) {
    if std::fs::metadata("/dev/kvm").is_err() {
        eprintln!("refresh: /dev/kvm is not available; nothing to measure");
        return;
    }
    // The sources of a vCPU opened for this thread, as the VP thread opens them for itself.
    let vcpu = IdleVcpu::new().expect("an idle vCPU");
    let thread = VpThread { tid: gettid(), vcpu_fd: vcpu.fd().as_raw_fd(), user: Default::default() };
    let mut sources = VpSources::open(&thread, 0);
    let page = SharedPage::anonymous(ObjectKind::Vp).expect("page");
    let mut group = c.benchmark_group("vp_refresh");
    // Everything (what the collector and the WHv API do), and what the VP thread does at a
    // hypercall (on its own thread: the intercept counters only).
    group.bench_function("merge_all_sources", |b| b.iter(|| sources.merge(&page)));
    group.bench_function("refresh_on_vp_thread", |b| b.iter(|| sources.merge_exits(&page)));
    group.finish();

    // Where the time goes: each source read on its own.
    let tid = gettid();
    let mut tracepoints = VpTracepoints::open(tid);
    let stats = KvmStats::open(vcpu.fd().as_raw_fd()).expect("KVM stats fd");
    let migrations = Migrations::open(tid).expect("cpu-migrations");
    let mut group = c.benchmark_group("vp_refresh_parts");
    group.bench_function("tracepoints_all", |b| b.iter(|| tracepoints.read_all()));
    let (halt, irq, wait) = (stats.stat("halt_exits"), stats.stat("irq_exits"), stats.stat("halt_wait_ns"));
    let mut data = vec![0u64; stats.data_words()];
    group.bench_function("kvm_stats_read_and_lookups", |b| {
        b.iter(|| {
            stats.read_into(&mut data).expect("pread");
            let v = |s: Option<Stat>| s.map(|s| s.raw(&data));
            (v(halt), v(irq), wait.map(|s| s.nanoseconds(&data)))
        })
    });
    group.bench_function("migrations", |b| b.iter(|| migrations.read()));
    let clock = ThreadClock::open(tid).expect("thread clock");
    group.bench_function("thread_times", |b| b.iter(|| clock.read()));
    group.finish();

    let hv = Hypervisor::new().expect("hypervisor");
    let mut group = c.benchmark_group("round_trip");
    group.sample_size(10).measurement_time(Duration::from_secs(10));
    group.bench_function("hypercall_notify_long_spin_wait", |b| {
        b.iter_custom(|iters| {
            let n = iters.clamp(500, 50_000) as u32;
            hypercall_round_trip(&hv, n).expect("hypercall bench guest") * iters as u32
        })
    });
    group.bench_function("userspace_out", |b| {
        b.iter_custom(|iters| {
            let n = iters.clamp(2000, 200_000) as u32;
            exit_round_trip(&hv, n, true).expect("bench guest") * iters as u32
        })
    });
    group.finish();
}

criterion_group!(benches, refresh);
criterion_main!(benches);
