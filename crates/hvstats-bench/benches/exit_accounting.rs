//! The userspace exit round trip with exact accounting on and off, and the accounting work
//! alone. Goal: accounting costs at most 2% of the round trip.
//!
//! Without KVM: the accounting work per exit (count, cost and histogram), a histogram record
//! alone, and a plain copy of a VP page next to a consistent one (the reader's side of the
//! sequence counter).
//!
//! `cargo bench -p hvstats-bench --bench exit_accounting`

// Bench set-up: a failed step is the run's failure, reported by the panic; criterion_group!
// defines an undocumented public function.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use hvstats::Hypervisor;
use hvstats_bench::exit_cost;
use hvstats_bench::guest::exit_round_trip;

fn round_trip(c: &mut Criterion) {
    // The work alone needs no guest.
    c.bench_function("accounting_work_per_exit", |b| {
        b.iter_custom(|iters| exit_cost::accounting_alone(iters.min(u32::MAX as u64) as u32) * iters as u32)
    });
    if std::fs::metadata("/dev/kvm").is_err() {
        eprintln!("exit_accounting: /dev/kvm is not available; nothing to measure");
        return;
    }
    let hv = Hypervisor::new().expect("hypervisor");
    let mut group = c.benchmark_group("userspace_exit_round_trip");
    group.sample_size(10).measurement_time(Duration::from_secs(10));
    for (name, accounting) in [("accounting_on", true), ("accounting_off", false)] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                // One guest run of `iters` exits (at least enough to hide the thread start).
                let exits = iters.clamp(2000, 200_000) as u32;
                let per_exit = exit_round_trip(&hv, exits, accounting).expect("bench guest");
                per_exit * iters as u32
            })
        });
    }
    group.finish();
}

fn page_side(c: &mut Criterion) {
    use hvstats::SharedPage;
    use hvstats_abi::ObjectKind;
    use hvstats_abi::catalog::vp;
    let page = SharedPage::anonymous(ObjectKind::Vp).expect("page");
    let mut ns = 0u64;
    c.bench_function("histogram_record", |b| {
        b.iter(|| {
            ns = ns.wrapping_add(997) & 0xF_FFFF;
            page.record_time(vp::IO_TIME_HISTOGRAM, std::hint::black_box(ns));
        })
    });
    let reader = page.map_read_only().expect("read-only mapping");
    let mut group = c.benchmark_group("vp_page_copy");
    group.bench_function("plain", |b| b.iter(|| std::hint::black_box(reader.snapshot())));
    group.bench_function("consistent", |b| {
        b.iter(|| std::hint::black_box(reader.consistent_snapshot(ObjectKind::Vp)))
    });
    group.finish();
    c.bench_function("merge_window", |b| b.iter(|| drop(std::hint::black_box(page.begin_merge()))));
}

criterion_group!(benches, round_trip, page_side);
criterion_main!(benches);
