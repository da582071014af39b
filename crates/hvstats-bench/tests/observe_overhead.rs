//! The rows of what observing costs, measured for real: the guest exit rate of a QEMU with KVM
//! observed and not, and a thread's counted `getppid` calls with the observer's counters and
//! without. The first needs /dev/kvm (a host without it prints "skipped";
//! `HVSTATS_REQUIRE_KVM=1` makes that a failure), the second the `syscalls` tracepoints.

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use hvstats_bench::{Plan, overhead};
use hvstats_observe::thread_counters::{EventList, EventSpec};
use hvstats_testkit::kvm_available;

#[test]
fn the_overhead_row_compares_the_guest_exit_rate_observed_and_not() {
    if !kvm_available("the_overhead_row_compares_the_guest_exit_rate_observed_and_not") {
        return;
    }
    let rates = overhead::guest_exit_rate_on_vs_off(
        &Plan::quiet(2),
        Duration::from_secs(1),
        Duration::from_millis(200),
    )
    .unwrap();
    // Observed, unobserved, and programs attached with nothing counted: two rounds each.
    assert_eq!((rates.observed.len(), rates.unobserved.len(), rates.attached.len()), (2, 2, 2));
    assert!(
        rates.observed.iter().chain(&rates.unobserved).chain(&rates.attached).all(|r| *r > 0.0),
        "{rates:?}"
    );
}

#[test]
fn the_counting_cost_row_counts_every_call_it_times() {
    let events = EventList::new(vec![EventSpec::tracepoint("syscalls", "sys_enter_getppid")]);
    if let Some(why) = events.unavailable(0) {
        eprintln!("syscalls:sys_enter_getppid is unavailable ({why}): skipped");
        return;
    }
    // The measurement refuses to give a rate unless the counted thread's count is exact.
    let rates = overhead::counted_event_rate_on_vs_off(&Plan::quiet(1), 5_000).unwrap();
    assert_eq!((rates.observed.len(), rates.unobserved.len()), (1, 1));
    assert!(rates.ratio().is_some_and(|r| r > 0.0), "{rates:?}");
}
