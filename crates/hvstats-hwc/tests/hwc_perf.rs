//! A VP gets hardware counters only under an allocation that covers it, and where that is
//! impossible the answer says why; it is never a pair of zeros.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod hwc_support;

use std::path::Path;

use hvstats_abi::hal::{GroupAffinity, PhysicalCounterResourceDescriptor as D, PhysicalCounterResourceList};
use hvstats_hwc::{Allocator, CounterSetHandle, PmuError, PmuShape, Unavailable, VpHardwareCounters};
use hwc_support::{TempRuntime, allocator};

fn kernel_has_a_pmu() -> bool {
    ["cpu", "cpu_core", "cpu_atom"]
        .iter()
        .any(|n| Path::new("/sys/bus/event_source/devices").join(n).is_dir())
}

#[test]
fn on_this_machine_the_discovered_pmu_decides() {
    let rt = TempRuntime::new("hwc-perf-discovered");
    let a = Allocator::open(rt.path(), PmuShape::discover()).unwrap();
    let h = a.allocate(None, None).unwrap();
    match VpHardwareCounters::open(&a, h, 0) {
        Err(Unavailable::NoPmu(reason)) => {
            assert!(!kernel_has_a_pmu(), "the kernel has a PMU, yet: {reason}");
            assert!(matches!(reason, PmuError::NoKernelPmu { .. }), "{reason:?}");
            eprintln!("unavailable: no PMU: {reason}");
        }
        Ok(mut c) => {
            assert!(kernel_has_a_pmu());
            c.read().unwrap();
        }
        // A PMU that perf will not count guests on (exclude_host) is also an honest answer.
        Err(e @ Unavailable::Perf { .. }) => assert!(kernel_has_a_pmu(), "{e}"),
        Err(other) => panic!("unexpected: {other}"),
    }
}

#[test]
fn counters_need_an_allocation_that_covers_the_thread() {
    let rt = TempRuntime::new("hwc-perf-configured");
    let a = allocator(&rt);
    // A handle nobody holds.
    let bogus = CounterSetHandle::from_raw(77);
    assert!(
        matches!(VpHardwareCounters::open(&a, bogus, 0), Err(Unavailable::NotAllocated(h)) if h == bogus)
    );

    // CPU 127 only: this thread may run on CPU 0, which it does not cover.
    let d = [D::range(0, 1)];
    let list = PhysicalCounterResourceList::new(&d);
    let narrow = a.allocate(Some(&[GroupAffinity::new(1, 1 << 63)]), Some(&list)).unwrap();
    match VpHardwareCounters::open(&a, narrow, 0) {
        Err(e @ Unavailable::NotCovered { .. }) => assert!(e.to_string().contains("127"), "{e}"),
        other => panic!("expected NotCovered, got {other:?}"),
    }

    // One counter on every processor is not enough for cycles and instructions.
    let d = [D::single(5)];
    let one = a.allocate(None, Some(&PhysicalCounterResourceList::new(&d))).unwrap();
    assert!(matches!(VpHardwareCounters::open(&a, one, 0), Err(Unavailable::TooFewCounters(h)) if h == one));

    // Two counters on every processor: the allocation allows it; perf decides.
    let d = [D::range(2, 3)];
    let two = a.allocate(None, Some(&PhysicalCounterResourceList::new(&d))).unwrap();
    match VpHardwareCounters::open(&a, two, 0) {
        Ok(c) => {
            assert!(kernel_has_a_pmu());
            assert_eq!(c.handle(), two);
        }
        Err(Unavailable::Perf { event, source }) => {
            assert_eq!(event, "cycles");
            if !kernel_has_a_pmu() {
                // Without a hardware PMU the kernel has no such event.
                assert_eq!(source.raw_os_error(), Some(libc::ENOENT), "{source}");
            }
        }
        Err(other) => panic!("unexpected: {other}"),
    }
}
