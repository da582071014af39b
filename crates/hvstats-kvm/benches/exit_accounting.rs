//! The userspace exit round trip with exact accounting on and off, and the accounting work
//! alone. Goal: accounting costs at most 2% of the round trip.
//!
//! `cargo bench -p hvstats-kvm --bench exit_accounting`

// Bench set-up: a failed step is the run's failure, reported by the panic; criterion_group!
// defines an undocumented public function.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use hvstats::Hypervisor;
use hvstats_kvm::exit_cost;

mod support;

fn round_trip(c: &mut Criterion) {
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
                let per_exit = support::round_trip(&hv, exits, accounting);
                per_exit * iters as u32
            })
        });
    }
    group.finish();
    c.bench_function("accounting_work_per_exit", |b| {
        b.iter_custom(|iters| exit_cost::accounting_alone(iters.min(u32::MAX as u64) as u32) * iters as u32)
    });
}

criterion_group!(benches, round_trip);
criterion_main!(benches);
