//! `HalAllocateHardwareCounters` requests, checked on arbitrary arguments and sequences.
//!
//! This function is the body of the `hal_request` fuzz target and of the workspace test that runs
//! it on random byte strings. The bytes give a PMU shape (or none), then a sequence of allocations
//! (arbitrary processor groups and masks, resource lists decoded from raw bytes or built from
//! near-valid descriptors, exclusive requests) and frees against one allocation table. Whatever
//! they are, nothing may panic, and:
//! - a validated request names only processors that exist, exactly those of its masks, and only
//!   counter indices every one of them has; without a PMU it asks for no hardware;
//! - no two allocations in the table hold conflicting resources on a shared processor;
//! - a refusal for a conflict names an allocation that is in the table and really conflicts;
//! - freeing a granted handle succeeds once, and a second time is `STATUS_INVALID_PARAMETER`.

use std::path::Path;

use hvstats_abi::hal::{
    GroupAffinity, NtStatus, PhysicalCounterResourceDescriptor as Descriptor, PhysicalCounterResourceList,
    ResourceType,
};
use hvstats_hwc::{Allocator, CpuSet, HwcError, Lifetime, PmuShape, Refusal, Request};

use crate::bytes::Bytes;

fn shape(b: &mut Bytes<'_>) -> PmuShape {
    let processors = u32::from(b.u8() % 140) + 1;
    match b.u8() % 4 {
        0 => PmuShape::absent(processors, "none in this run").expect("a valid processor count"),
        _ => PmuShape::uniform(processors, u32::from(b.u8() % 9), u32::from(b.u8() % 5))
            .unwrap_or_else(|_| PmuShape::uniform(processors, 4, 0).expect("a valid shape")),
    }
}

fn descriptor(b: &mut Bytes<'_>) -> Descriptor {
    let small = |b: &mut Bytes<'_>| u32::from(b.u8() % 16);
    match b.u8() % 9 {
        0 => Descriptor::single(small(b)),
        1 => Descriptor::range(small(b), small(b)),
        2 => Descriptor::overflow(b.u64()),
        3 => Descriptor::event_buffer(b.u64(), b.u32(), b.u32()),
        4 => Descriptor::identification_tag(u32::from(b.u8() % 4)),
        5 => Descriptor { resource_type: ResourceType(b.u32() % 8), flags: 0, u: [small(b), small(b), 0, 0] },
        _ => Descriptor {
            resource_type: ResourceType(b.u32()),
            flags: b.u32() % 2,
            u: [b.u32(), b.u32(), b.u32(), b.u32()],
        },
    }
}

fn affinity(b: &mut Bytes<'_>) -> Option<Vec<GroupAffinity>> {
    match b.u8() % 4 {
        0 => None,
        n => Some(
            (0..n - 1)
                .map(|_| {
                    let group = u16::from(b.u8() % 4);
                    let mask = if b.u8().is_multiple_of(2) { u64::from(b.u8()) } else { b.u64() };
                    let mut g = GroupAffinity::new(group, mask);
                    if b.u8().is_multiple_of(32) {
                        g.reserved[0] = 1;
                    }
                    g
                })
                .collect(),
        ),
    }
}

/// Checks what `Request::validate` made of the arguments.
fn check_request(request: &Request, affinity: Option<&[GroupAffinity]>, pmu: &PmuShape) {
    assert!(!request.cpus.is_empty(), "a request on no processor was accepted");
    assert!(request.cpus.iter().all(|c| c < pmu.processors()), "a processor that does not exist");
    if let Some(groups) = affinity {
        let named: CpuSet = groups
            .iter()
            .flat_map(|g| {
                (0..64u32)
                    .filter(move |bit| g.mask & (1 << bit) != 0)
                    .map(move |bit| u32::from(g.group) * 64 + bit)
            })
            .collect();
        assert_eq!(request.cpus, named, "the processors are not those of the masks");
    }
    if !pmu.is_present() {
        assert!(!request.resources.needs_hardware(), "hardware granted without a PMU");
    }
    for cpu in request.cpus.iter() {
        let total = pmu.counters(cpu).map_or(0, |c| c.total());
        for i in request.resources.counter_indices() {
            assert!(i < total, "counter {i} does not exist on CPU {cpu}");
        }
    }
}

/// Runs the allocations `data` describes against a table under `runtime_dir` (which it empties
/// first) and checks the contract (module documentation). Returns how many were granted.
pub fn check(data: &[u8], runtime_dir: &Path) -> usize {
    let _ = std::fs::remove_file(runtime_dir.join("hwc").join("table.json"));
    let mut b = Bytes(data);
    let pmu = shape(&mut b);
    let allocator = Allocator::open(runtime_dir, pmu.clone()).expect("the table directory");
    let mut granted = Vec::new();
    let mut grants = 0;
    for _ in 0..12 {
        if b.is_empty() {
            break;
        }
        if b.u8() % 5 == 0 && !granted.is_empty() {
            let handle = granted.swap_remove(usize::from(b.u8()) % granted.len());
            assert_eq!(allocator.free(handle), NtStatus::SUCCESS);
            assert_eq!(allocator.free(handle), NtStatus::INVALID_PARAMETER);
            continue;
        }
        let groups = affinity(&mut b);
        let count = usize::from(b.u8() % 5);
        let descriptors: Vec<Descriptor> = (0..count).map(|_| descriptor(&mut b)).collect();
        let mut list = PhysicalCounterResourceList::new(&descriptors);
        match b.u8() % 8 {
            0 => list.count = list.count.wrapping_add(1),
            1 => list.count = 0,
            _ => {}
        }
        // The in-memory form of the list round-trips through its decoder.
        let mut raw = vec![0u32; 2 + descriptors.len() * 6];
        let bytes: &mut [u8] = zerocopy::IntoBytes::as_mut_bytes(raw.as_mut_slice());
        bytes[..4].copy_from_slice(&list.count.to_le_bytes());
        bytes[8..].copy_from_slice(zerocopy::IntoBytes::as_bytes(descriptors.as_slice()));
        if let Some(decoded) = PhysicalCounterResourceList::from_bytes(bytes) {
            assert_eq!(decoded.descriptors.len() as u32, decoded.count);
            assert!(decoded.count as usize <= descriptors.len());
        }
        let exclusive = count == 0 && b.u8() % 2 == 0;
        let resources = (!exclusive).then_some(&list);
        if let Ok(request) = Request::validate(groups.as_deref(), resources, &pmu) {
            check_request(&request, groups.as_deref(), &pmu);
        }
        match allocator.try_allocate(groups.as_deref(), resources, Lifetime::Process) {
            Ok(handle) => {
                grants += 1;
                granted.push(handle);
            }
            Err(HwcError::Refused(Refusal::Held { handle, cpus, .. })) => {
                let held =
                    allocator.allocation(handle).expect("the table").expect("the holder named is held");
                let request = Request::validate(groups.as_deref(), resources, &pmu).expect("a valid request");
                assert!(
                    held.resources.conflicts_with(&request.resources) && held.cpus.intersects(&request.cpus)
                );
                assert!(cpus.iter().all(|c| held.cpus.contains(c) && request.cpus.contains(c)));
            }
            Err(HwcError::Refused(Refusal::NoPmu { .. })) => assert!(!pmu.is_present()),
            Err(HwcError::Status(s)) => {
                assert!(s == NtStatus::INVALID_PARAMETER || s == NtStatus::NOT_SUPPORTED, "{s}")
            }
            Err(HwcError::Table(e)) => panic!("the table failed: {e}"),
        }
        let all = allocator.allocations().expect("the table");
        for (i, a) in all.iter().enumerate() {
            for other in &all[i + 1..] {
                assert!(
                    !(a.cpus.intersects(&other.cpus) && a.resources.conflicts_with(&other.resources)),
                    "handles {} and {} conflict",
                    a.handle,
                    other.handle
                );
            }
        }
    }
    for handle in granted {
        assert_eq!(allocator.free(handle), NtStatus::SUCCESS);
    }
    grants
}
