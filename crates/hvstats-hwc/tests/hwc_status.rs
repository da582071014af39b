//! Every status of seed 002's allocate and free, on a configured PMU (6 GP + 3 fixed on each of
//! 128 processors) and on a machine without a PMU.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod hwc_support;

use hvstats_abi::hal::{
    GroupAffinity, NtStatus, PhysicalCounterResourceDescriptor as D, PhysicalCounterResourceList,
    ResourceType,
};
use hvstats_hwc::{Allocator, CounterSetHandle, HwcError, PmuShape, TableError};
use hwc_support::{TempRuntime, allocator};

const INVALID: NtStatus = NtStatus::INVALID_PARAMETER;
const BUSY: NtStatus = NtStatus::INSUFFICIENT_RESOURCES;

fn alloc(
    a: &Allocator,
    affinity: Option<&[GroupAffinity]>,
    d: Option<&[D]>,
) -> Result<CounterSetHandle, NtStatus> {
    let list = d.map(PhysicalCounterResourceList::new);
    a.allocate(affinity, list.as_ref())
}

fn on(group: u16, mask: u64) -> [GroupAffinity; 1] {
    [GroupAffinity::new(group, mask)]
}

fn held(a: &Allocator) -> usize {
    a.allocations().unwrap().len()
}

#[test]
fn exclusive_use_of_every_processor_blocks_everything_until_freed() {
    let rt = TempRuntime::new("hwc-exclusive");
    let a = allocator(&rt);
    let h = alloc(&a, None, None).unwrap();
    assert_ne!(h.raw(), 0);
    let all = a.allocations().unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].cpus.to_string(), "0-127");
    assert!(all[0].resources.exclusive);
    assert_eq!(all[0].holder.pid, std::process::id());

    assert_eq!(alloc(&a, None, None), Err(BUSY));
    assert_eq!(alloc(&a, Some(&on(1, 1 << 63)), Some(&[D::single(0)])), Err(BUSY));
    assert_eq!(alloc(&a, Some(&on(0, 1)), Some(&[D::identification_tag(1)])), Err(BUSY));
    assert_eq!(held(&a), 1, "a refused request leaves no allocation behind");

    assert_eq!(a.free(h), NtStatus::SUCCESS);
    assert_eq!(a.free(h), INVALID, "freeing twice");
    let h2 = alloc(&a, Some(&on(1, 1 << 63)), Some(&[D::single(0)])).unwrap();
    assert!(h2.raw() > h.raw(), "handles are not reused");
}

#[test]
fn exclusive_use_of_some_processors_conflicts_only_there() {
    let rt = TempRuntime::new("hwc-exclusive-some");
    let a = allocator(&rt);
    let h = alloc(&a, Some(&on(0, u64::MAX)), None).unwrap();
    assert_eq!(alloc(&a, Some(&on(0, 1 << 63)), Some(&[D::range(0, 8)])), Err(BUSY));
    let other = alloc(&a, Some(&on(1, 1)), Some(&[D::range(0, 8)])).unwrap();
    // Exclusive use where anything is held fails too.
    assert_eq!(alloc(&a, Some(&[GroupAffinity::new(1, 0b11)]), None), Err(BUSY));
    assert_eq!(alloc(&a, Some(&on(1, 0b10)), None).map(|_| ()), Ok(()));
    assert_eq!(a.free(h), NtStatus::SUCCESS);
    assert_eq!(a.free(other), NtStatus::SUCCESS);
}

#[test]
fn processors_that_this_host_lacks_exist_when_the_configuration_says_so() {
    let rt = TempRuntime::new("hwc-big");
    let a = allocator(&rt);
    let h = alloc(&a, Some(&on(1, 1 << 63)), Some(&[D::single(8)])).unwrap();
    assert_eq!(a.allocation(h).unwrap().unwrap().cpus.to_string(), "127");
}

#[test]
fn bad_affinities_are_invalid_parameters() {
    let rt = TempRuntime::new("hwc-affinity");
    let a = allocator(&rt);
    let c = [D::single(0)];
    // A group count without affinities.
    assert_eq!(alloc(&a, Some(&[]), Some(&c)), Err(INVALID));
    assert_eq!(alloc(&a, Some(&[]), None), Err(INVALID));
    // Group 2 would be CPUs 128..191: past the 128 processors.
    assert_eq!(alloc(&a, Some(&on(2, 1)), Some(&c)), Err(INVALID));
    assert_eq!(alloc(&a, Some(&on(u16::MAX, 1)), None), Err(INVALID));
    // A mask naming no processors.
    assert_eq!(alloc(&a, Some(&on(0, 0)), Some(&c)), Err(INVALID));
    // Reserved words.
    let g = GroupAffinity { reserved: [0, 1, 0], ..GroupAffinity::new(0, 1) };
    assert_eq!(alloc(&a, Some(&[g]), Some(&c)), Err(INVALID));
    // One good and one bad group: the whole request fails.
    assert_eq!(alloc(&a, Some(&[GroupAffinity::new(0, 1), GroupAffinity::new(3, 1)]), None), Err(INVALID));
    assert_eq!(held(&a), 0);

    // A mask naming processors past the end of a partial group.
    let b = TempRuntime::new("hwc-affinity-100");
    let a = Allocator::open(b.path(), PmuShape::uniform(100, 6, 3).unwrap()).unwrap();
    assert_eq!(alloc(&a, Some(&on(1, 1 << 35)), Some(&c)).map(|_| ()), Ok(()));
    assert_eq!(alloc(&a, Some(&on(1, 1 << 36)), Some(&c)), Err(INVALID));
}

#[test]
fn bad_resource_lists_are_invalid_parameters() {
    let rt = TempRuntime::new("hwc-lists");
    let a = allocator(&rt);
    // Counter 9 is past 6 GP + 3 fixed; 8 is the last fixed counter.
    assert_eq!(alloc(&a, None, Some(&[D::single(9)])), Err(INVALID));
    assert_eq!(alloc(&a, None, Some(&[D::single(u32::MAX)])), Err(INVALID));
    assert_eq!(alloc(&a, None, Some(&[D::range(5, 9)])), Err(INVALID));
    // An inverted range.
    assert_eq!(alloc(&a, None, Some(&[D::range(3, 2)])), Err(INVALID));
    // An empty list.
    assert_eq!(
        a.allocate(None, Some(&PhysicalCounterResourceList { count: 0, descriptors: &[] })),
        Err(INVALID)
    );
    assert_eq!(alloc(&a, None, Some(&[])), Err(INVALID));
    // A count that disagrees with the descriptors.
    let d = [D::single(0)];
    assert_eq!(
        a.allocate(None, Some(&PhysicalCounterResourceList { count: 2, descriptors: &d })),
        Err(INVALID)
    );
    assert_eq!(
        a.allocate(None, Some(&PhysicalCounterResourceList { count: 0, descriptors: &d })),
        Err(INVALID)
    );
    // Nonzero Flags.
    assert_eq!(alloc(&a, None, Some(&[D { flags: 1, ..D::single(0) }])), Err(INVALID));
    assert_eq!(alloc(&a, None, Some(&[D { flags: 1, ..D::identification_tag(4) }])), Err(INVALID));
    // Nonzero words of the union that the type does not use.
    assert_eq!(alloc(&a, None, Some(&[D { u: [0, 1, 0, 0], ..D::single(0) }])), Err(INVALID));
    assert_eq!(alloc(&a, None, Some(&[D { u: [0, 1, 0, 7], ..D::range(0, 1) }])), Err(INVALID));
    assert_eq!(alloc(&a, None, Some(&[D { u: [1, 2, 3, 0], ..D::overflow(0) }])), Err(INVALID));
    assert_eq!(alloc(&a, None, Some(&[D { u: [1, 0, 0, 1], ..D::identification_tag(1) }])), Err(INVALID));
    // Unknown types, including ResourceTypeMax itself.
    for t in [ResourceType::MAX.0, 7, u32::MAX] {
        assert_eq!(
            alloc(&a, None, Some(&[D { resource_type: ResourceType(t), ..D::default() }])),
            Err(INVALID)
        );
    }
    // One bad descriptor among good ones.
    assert_eq!(alloc(&a, None, Some(&[D::single(0), D::range(1, 2), D::single(12)])), Err(INVALID));
    assert_eq!(held(&a), 0);
}

#[test]
fn extended_counter_configuration_is_not_supported() {
    let rt = TempRuntime::new("hwc-extended");
    let a = allocator(&rt);
    let ext = D { resource_type: ResourceType::EXTENDED_COUNTER_CONFIGURATION, ..D::default() };
    assert_eq!(alloc(&a, None, Some(&[ext])), Err(NtStatus::NOT_SUPPORTED));
    assert_eq!(alloc(&a, Some(&on(0, 1)), Some(&[D::single(0), ext])), Err(NtStatus::NOT_SUPPORTED));
    assert_eq!(held(&a), 0);
}

#[test]
fn counters_ranges_overflow_event_buffer_and_tags_conflict_per_processor() {
    let rt = TempRuntime::new("hwc-conflicts");
    let a = allocator(&rt);
    let cpu0 = on(0, 1);
    let cpu1 = on(0, 2);
    let both = on(0, 3);
    let r = alloc(&a, Some(&cpu0), Some(&[D::range(0, 2), D::overflow(0xdead)])).unwrap();
    // Counters: any overlap on a shared processor conflicts.
    assert_eq!(alloc(&a, Some(&both), Some(&[D::single(2)])), Err(BUSY));
    assert_eq!(alloc(&a, Some(&cpu0), Some(&[D::range(1, 5)])), Err(BUSY));
    let c3 = alloc(&a, Some(&both), Some(&[D::range(3, 5)])).unwrap();
    let c0 = alloc(&a, Some(&cpu1), Some(&[D::range(0, 2)])).unwrap();
    // Overflow: one holder per processor.
    assert_eq!(alloc(&a, Some(&both), Some(&[D::overflow(1)])), Err(BUSY));
    let o1 = alloc(&a, Some(&cpu1), Some(&[D::overflow(1)])).unwrap();
    // Event buffer: one holder per processor, independent of the overflow interrupt.
    let e0 = alloc(&a, Some(&cpu0), Some(&[D::event_buffer(1, 0, 64)])).unwrap();
    assert_eq!(alloc(&a, Some(&cpu0), Some(&[D::event_buffer(2, 0, 8)])), Err(BUSY));
    // Tags: the same tag on the same processor conflicts; another tag or processor does not.
    let t7 = alloc(&a, Some(&cpu0), Some(&[D::identification_tag(7)])).unwrap();
    assert_eq!(alloc(&a, Some(&both), Some(&[D::identification_tag(7)])), Err(BUSY));
    let t8 = alloc(&a, Some(&cpu0), Some(&[D::identification_tag(8)])).unwrap();
    let t7b = alloc(&a, Some(&cpu1), Some(&[D::identification_tag(7)])).unwrap();
    // Counters 6-8 are the fixed ones and still free on both.
    let fixed = alloc(&a, Some(&both), Some(&[D::range(6, 8)])).unwrap();
    assert_eq!(alloc(&a, Some(&both), Some(&[D::single(6)])), Err(BUSY));
    let handles = [r, c3, c0, o1, e0, t7, t8, t7b, fixed];
    assert_eq!(held(&a), handles.len());
    for h in handles {
        assert_eq!(a.free(h), NtStatus::SUCCESS);
    }
    assert_eq!(held(&a), 0);
    assert_eq!(alloc(&a, Some(&both), None).map(|_| ()), Ok(()));
}

#[test]
fn freeing_an_unknown_handle_is_an_invalid_parameter() {
    let rt = TempRuntime::new("hwc-free");
    let a = allocator(&rt);
    assert_eq!(a.free(CounterSetHandle::from_raw(0)), INVALID);
    assert_eq!(a.free(CounterSetHandle::from_raw(42)), INVALID);
    let h = alloc(&a, None, Some(&[D::single(1)])).unwrap();
    assert_eq!(a.free(CounterSetHandle::from_raw(h.raw() + 1)), INVALID);
    assert_eq!(a.free(h), NtStatus::SUCCESS);
    assert_eq!(a.free(h), INVALID);
}

#[test]
fn without_a_pmu_counters_are_insufficient_and_exclusive_use_succeeds() {
    let rt = TempRuntime::new("hwc-nopmu");
    let a = Allocator::open(rt.path(), PmuShape::absent(128, "test machine without a PMU").unwrap()).unwrap();
    assert_eq!(alloc(&a, None, Some(&[D::single(0)])), Err(BUSY));
    // Indices are not checked against a PMU that does not exist.
    assert_eq!(alloc(&a, None, Some(&[D::range(0, 1000)])), Err(BUSY));
    assert_eq!(alloc(&a, Some(&on(0, 1)), Some(&[D::overflow(0)])), Err(BUSY));
    assert_eq!(alloc(&a, Some(&on(0, 1)), Some(&[D::event_buffer(0, 0, 0)])), Err(BUSY));
    assert_eq!(alloc(&a, Some(&on(0, 1)), Some(&[D::identification_tag(1), D::single(0)])), Err(BUSY));
    // Bad input is still bad input.
    assert_eq!(alloc(&a, Some(&on(2, 1)), Some(&[D::single(0)])), Err(INVALID));
    assert_eq!(alloc(&a, None, Some(&[D::range(2, 1)])), Err(INVALID));
    let ext = D { resource_type: ResourceType::EXTENDED_COUNTER_CONFIGURATION, ..D::default() };
    assert_eq!(alloc(&a, None, Some(&[ext])), Err(NtStatus::NOT_SUPPORTED));
    assert_eq!(held(&a), 0);
    // Tags need no hardware and are still arbitrated.
    let tag = alloc(&a, Some(&on(0, 1)), Some(&[D::identification_tag(1)])).unwrap();
    assert_eq!(alloc(&a, Some(&on(0, 1)), None), Err(BUSY));
    assert_eq!(a.free(tag), NtStatus::SUCCESS);
    let h = alloc(&a, None, None).unwrap();
    assert_eq!(a.free(h), NtStatus::SUCCESS);
}

#[test]
fn this_machine_answers_by_its_discovered_pmu() {
    let rt = TempRuntime::new("hwc-discovered");
    let pmu = PmuShape::discover();
    let present = pmu.is_present();
    let a = Allocator::open(rt.path(), pmu).unwrap();
    let h = alloc(&a, None, None).unwrap();
    assert_eq!(a.free(h), NtStatus::SUCCESS);
    let counter = alloc(&a, None, Some(&[D::single(0)]));
    if present {
        eprintln!("this machine has a PMU: counter 0 gives {counter:?}");
        assert!(counter.is_ok());
    } else {
        assert_eq!(counter, Err(BUSY));
    }
}

#[test]
fn a_corrupt_or_truncated_table_is_a_clear_error_and_is_left_alone() {
    let rt = TempRuntime::new("hwc-corrupt");
    let a = allocator(&rt);
    let h = alloc(&a, None, Some(&[D::single(0)])).unwrap();
    let path = a.table_path();
    let good = std::fs::read(&path).unwrap();
    for bad in [&good[..good.len() / 2], b"", b"{\"version\":1}", b"\xff\xfe\x00garbage"] {
        std::fs::write(&path, bad).unwrap();
        match a.try_allocate(None, None, hvstats_hwc::Lifetime::Process) {
            Err(HwcError::Table(e @ TableError::Corrupt { .. })) => {
                let msg = e.to_string();
                assert!(msg.contains("corrupt") && msg.contains("table.json"), "{msg}");
            }
            other => panic!("expected a corrupt table error, got {other:?}"),
        }
        assert_eq!(alloc(&a, None, None), Err(BUSY));
        assert_eq!(a.free(h), BUSY);
        assert!(matches!(a.allocations(), Err(TableError::Corrupt { .. })));
        assert_eq!(std::fs::read(&path).unwrap(), bad, "the table is not reset behind the operator's back");
    }
    std::fs::write(&path, &good).unwrap();
    assert_eq!(a.free(h), NtStatus::SUCCESS);
}

#[test]
fn a_missing_table_is_an_empty_one_and_handles_restart_only_then() {
    let rt = TempRuntime::new("hwc-missing");
    let a = allocator(&rt);
    assert_eq!(held(&a), 0);
    let h1 = alloc(&a, None, Some(&[D::single(0)])).unwrap();
    let h2 = alloc(&a, None, Some(&[D::single(1)])).unwrap();
    assert_eq!((h1.raw(), h2.raw()), (1, 2));
    // A second allocator on the same directory (as another process would) sees the same table.
    let b = allocator(&rt);
    assert_eq!(b.allocations().unwrap().iter().map(|x| x.handle).collect::<Vec<_>>(), vec![h1, h2]);
    assert_eq!(b.free(h1), NtStatus::SUCCESS);
    assert_eq!(alloc(&b, None, Some(&[D::single(0)])).unwrap().raw(), 3);
}

#[test]
fn a_lock_held_too_long_is_an_error_not_a_hang() {
    use std::os::fd::AsRawFd;
    let rt = TempRuntime::new("hwc-lock");
    let a = allocator(&rt).with_lock_timeout(std::time::Duration::from_millis(200));
    let h = alloc(&a, None, Some(&[D::single(0)])).unwrap();
    // Another holder of the lock (a separate open file description, as another process has).
    let other = std::fs::File::open(rt.path().join("hwc/lock")).unwrap();
    // SAFETY: flock on a descriptor this test owns.
    assert_eq!(unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX) }, 0);
    let start = std::time::Instant::now();
    match a.try_allocate(None, None, hvstats_hwc::Lifetime::Process) {
        Err(HwcError::Table(e @ TableError::Io { .. })) => {
            // The timeout is the cause, said once in the chain a command prints.
            let chain = hvstats_host::error_chain::error_chain(&e);
            assert!(
                chain.contains("more than 0.2 s") && chain.matches("more than 0.2 s").count() == 1,
                "{chain}"
            )
        }
        other => panic!("expected a lock timeout, got {other:?}"),
    }
    assert!(start.elapsed() >= std::time::Duration::from_millis(200));
    assert_eq!(a.free(h), BUSY);
    drop(other);
    assert_eq!(a.free(h), NtStatus::SUCCESS);
}

#[test]
fn processes_that_disagree_about_the_pmu_do_not_share_a_table() {
    let rt = TempRuntime::new("hwc-shape");
    let a = allocator(&rt);
    let h = alloc(&a, Some(&on(1, 1)), Some(&[D::single(0)])).unwrap();
    let b = Allocator::open(rt.path(), PmuShape::absent(2, "another view").unwrap()).unwrap();
    match b.try_allocate(None, None, hvstats_hwc::Lifetime::Process) {
        Err(HwcError::Table(e @ TableError::ShapeMismatch { .. })) => {
            let msg = e.to_string();
            assert!(msg.contains("128 processors") && msg.contains("no PMU on 2 processors"), "{msg}");
        }
        other => panic!("expected a shape mismatch, got {other:?}"),
    }
    assert_eq!(alloc(&b, None, None), Err(BUSY));
    // Listing and freeing do not depend on the shape; once the table is empty, it may change.
    assert_eq!(b.allocations().unwrap().len(), 1);
    assert_eq!(b.free(h), NtStatus::SUCCESS);
    let h = alloc(&b, None, None).unwrap();
    assert!(matches!(
        a.try_allocate(None, None, hvstats_hwc::Lifetime::Process),
        Err(HwcError::Table(TableError::ShapeMismatch { .. }))
    ));
    assert_eq!(a.free(h), NtStatus::SUCCESS);
}
