//! Every wire and memory structure of the stats ABI against the numbers of the seeds and the
//! reference: sizes, field offsets and constants.

use core::mem::{offset_of, size_of};

use hvstats_abi::group::{GroupHeader, GroupType, GroupVersion, MAX_COUNTERS_PER_GROUP, PAGE_SIZE};
use hvstats_abi::hal::{
    GroupAffinity, NtStatus, PhysicalCounterResourceDescriptor, PhysicalCounterResourceList,
    PhysicalCounterResourceListHeader, RESOURCE_LIST_DESCRIPTORS_OFFSET, ResourceType,
};
use hvstats_abi::hypercall::{
    GetPartitionIdOutput, HypercallCode, HypercallInput, HypercallOutput, MapStatsPageInput,
    PartitionPrivileges, UnmapStatsPageInput,
};
use hvstats_abi::object::{
    IDENTITY_AREA_OFFSET, ObjectKind, StatsAreaType, StatsObjectIdentity, StatsObjectType,
};
use hvstats_abi::page::StatsPage;
use hvstats_abi::status::HvStatus;
use hvstats_abi::whv::{
    ApicCounters, CounterSet, EventCounters, HResult, InterceptCounter, InterceptCounters, RuntimeCounters,
};
use hvstats_abi::{CATALOG, GroupKind};
use zerocopy::{FromBytes, IntoBytes};

#[test]
fn object_types_have_the_tlfs_values() {
    assert_eq!(StatsObjectType::HYPERVISOR.0, 0x0000_0001);
    assert_eq!(StatsObjectType::LOGICAL_PROCESSOR.0, 0x0000_0002);
    assert_eq!(StatsObjectType::PARTITION.0, 0x0001_0001);
    assert_eq!(StatsObjectType::VP.0, 0x0001_0002);
    assert_eq!(size_of::<StatsObjectType>(), 4);
    for kind in ObjectKind::ALL {
        assert_eq!(kind.object_type().kind(), Some(kind));
        assert_eq!(ObjectKind::from_short_name(kind.short_name()), Some(kind));
    }
    assert_eq!(StatsObjectType(3).kind(), None);
    assert_eq!(StatsObjectType(0x0001_0003).kind(), None);
    assert!(ObjectKind::Hypervisor.is_global() && ObjectKind::LogicalProcessor.is_global());
    assert!(!ObjectKind::Partition.is_global() && !ObjectKind::Vp.is_global());
}

#[test]
fn stats_area_types_have_the_tlfs_values() {
    assert_eq!(StatsAreaType::SELF.0, 0);
    assert_eq!(StatsAreaType::PARENT.0, 1);
    assert_eq!(StatsAreaType::INTERNAL.0, 2);
}

#[test]
fn object_identity_fields_sit_at_their_offsets() {
    assert_eq!(size_of::<StatsObjectIdentity>(), 16);
    assert_eq!(IDENTITY_AREA_OFFSET, 15);

    let hv = StatsObjectIdentity::hypervisor(StatsAreaType::PARENT);
    let mut want = [0u8; 16];
    want[15] = 1;
    assert_eq!(hv.as_bytes(), &want);

    // LP index u32 @0.
    let lp = StatsObjectIdentity::logical_processor(0x0403_0201, StatsAreaType::SELF);
    assert_eq!(&lp.as_bytes()[0..4], &[1, 2, 3, 4]);
    assert!(lp.as_bytes()[4..16].iter().all(|&b| b == 0));
    assert_eq!(lp.lp_index(), 0x0403_0201);

    // Partition id u64 @0, area u8 @15.
    let pt = StatsObjectIdentity::partition(0x0807_0605_0403_0201, StatsAreaType::INTERNAL);
    assert_eq!(&pt.as_bytes()[0..8], &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert!(pt.as_bytes()[8..15].iter().all(|&b| b == 0));
    assert_eq!(pt.as_bytes()[15], 2);
    assert_eq!(pt.partition_id(), 0x0807_0605_0403_0201);
    assert_eq!(pt.area(), StatsAreaType::INTERNAL);

    // VP index u32 @8.
    let vp = StatsObjectIdentity::vp(7, 0x0C0B_0A09, StatsAreaType::PARENT);
    assert_eq!(&vp.as_bytes()[0..8], &7u64.to_le_bytes());
    assert_eq!(&vp.as_bytes()[8..12], &[9, 10, 11, 12]);
    assert_eq!(&vp.as_bytes()[12..15], &[0, 0, 0]);
    assert_eq!(vp.as_bytes()[15], 1);
    assert_eq!((vp.partition_id(), vp.vp_index(), vp.area()), (7, 0x0C0B_0A09, StatsAreaType::PARENT));
}

#[test]
fn object_identity_reserved_bytes_are_checked_per_kind() {
    let vp = StatsObjectIdentity::vp(1, 2, StatsAreaType::SELF);
    assert!(vp.reserved_clear(ObjectKind::Vp));
    assert!(!vp.reserved_clear(ObjectKind::Partition), "VP index lies in the partition's reserved bytes");
    let mut bytes = [0u8; 16];
    for at in 0..15 {
        bytes[at] = 0xFF;
        let id = StatsObjectIdentity::read_from_bytes(&bytes).unwrap();
        assert!(!id.reserved_clear(ObjectKind::Hypervisor), "byte {at}");
        assert_eq!(id.reserved_clear(ObjectKind::LogicalProcessor), at < 4, "byte {at}");
        assert_eq!(id.reserved_clear(ObjectKind::Partition), at < 8, "byte {at}");
        assert_eq!(id.reserved_clear(ObjectKind::Vp), at < 12, "byte {at}");
        bytes[at] = 0;
    }
    // The area byte is not reserved.
    bytes[15] = 0xFF;
    let id = StatsObjectIdentity::read_from_bytes(&bytes).unwrap();
    assert!(ObjectKind::ALL.iter().all(|&k| id.reserved_clear(k)));
}

#[test]
fn group_header_fields_sit_at_their_offsets() {
    assert_eq!(size_of::<GroupHeader>(), 8);
    assert_eq!(offset_of!(GroupHeader, group_type), 0);
    assert_eq!(offset_of!(GroupHeader, minor), 2);
    assert_eq!(offset_of!(GroupHeader, major), 4);
    assert_eq!(offset_of!(GroupHeader, length), 6);

    let h = GroupHeader::new(GroupType(0x0102), GroupVersion { major: 0x0506, minor: 0x0304 }, 0x0708);
    assert_eq!(h.as_bytes(), &[0x02, 0x01, 0x04, 0x03, 0x06, 0x05, 0x08, 0x07]);
    assert_eq!(GroupHeader::read_from_bytes(h.as_bytes()).unwrap(), h);
}

#[test]
fn group_version_0x00010000_is_major_1_minor_0() {
    let v = GroupVersion::from_u32(0x0001_0000);
    assert_eq!((v.major, v.minor), (1, 0));
    assert_eq!(v, GroupVersion::V1_0);
    assert_eq!(v.as_u32(), 0x0001_0000);
    assert_eq!(GroupVersion::from_u32(0x0003_0002), GroupVersion { major: 3, minor: 2 });
    // On the page, Minor @2 and Major @4 read together as a little-endian u32 give the version.
    let h = GroupHeader::new(GroupType::ARCHITECTURAL, GroupVersion::V1_0, 16);
    let b = h.as_bytes();
    assert_eq!(u32::from_le_bytes([b[2], b[3], b[4], b[5]]), 0x0001_0000);
    assert_eq!(GroupVersion::ZERO.as_u32(), 0);
}

#[test]
fn group_version_rule_of_seed_004() {
    let reader = GroupVersion { major: 1, minor: 2 };
    assert!(reader.accepts(GroupVersion { major: 1, minor: 2 }));
    assert!(reader.accepts(GroupVersion { major: 1, minor: 3 }));
    assert!(reader.accepts(GroupVersion { major: 1, minor: u16::MAX }));
    assert!(!reader.accepts(GroupVersion { major: 1, minor: 1 }));
    assert!(!reader.accepts(GroupVersion { major: 2, minor: 2 }));
    assert!(!reader.accepts(GroupVersion { major: 0, minor: 9 }));
}

#[test]
fn group_ids_and_versions_of_seed_004() {
    assert_eq!(GroupType::END_OF_LIST.0, 0);
    assert_eq!(GroupType::END_OF_PAGE.0, 1);
    assert_eq!(GroupType::ARCHITECTURAL.0, 2);
    assert_eq!(GroupType::RELEASE.0, 3);
    assert_eq!(GroupType::INTERNAL.0, 14);
    assert_eq!(GroupType::HYPERCALL_BASED.0, 15);
    assert_eq!(GroupKind::Architectural.group_type(), GroupType(2));
    assert_eq!(GroupKind::Release.group_type(), GroupType(3));
    for g in GroupKind::ALL {
        assert_eq!(GroupKind::from_group_type(g.group_type()), Some(g));
        for kind in ObjectKind::ALL {
            // Seed 004: the VP page's release group has had counters appended twice (1.1: CPU
            // wait, 1.2: nested page faults), hvstats' own group of the VP page four times (1.1:
            // the host's page faults; 1.2: every exit; 1.3: failed hypercalls; 1.4: the time of
            // the counts' publication), and that of the
            // partition page four times (1.1: the VM's run state; 1.2: sources 7 to 15 of an
            // observed VM; 1.3: from when its counters count; 1.4: from when the counts kept
            // across observers count), and that of the hypervisor page once (1.1: the VMs an
            // observer refuses, by reason).
            let expected = match (kind, g) {
                (ObjectKind::Vp, GroupKind::Release) => 0x0001_0002,
                (ObjectKind::Vp, GroupKind::Hvstats) => 0x0001_0004,
                (ObjectKind::Partition, GroupKind::Hvstats) => 0x0001_0004,
                (ObjectKind::Hypervisor, GroupKind::Hvstats) => 0x0001_0001,
                _ => 0x0001_0000,
            };
            assert_eq!(g.version(kind).as_u32(), expected, "{kind:?} {g:?}");
        }
    }
    assert_eq!(GroupKind::Hvstats.group_type(), GroupType::HVSTATS);
    for t in [0u16, 1, 14, 15, 4, 7, 0xFFFF] {
        assert_eq!(GroupKind::from_group_type(GroupType(t)), None);
    }
    assert_eq!(GroupHeader::END_OF_LIST.as_bytes(), &[0u8; 8]);
    assert_eq!(MAX_COUNTERS_PER_GROUP, 510);
    assert_eq!(PAGE_SIZE, 4096);
    assert_eq!(size_of::<StatsPage>(), 4096);
}

#[test]
fn every_catalog_counter_lies_inside_its_page_and_after_its_group_header() {
    for c in CATALOG {
        let offset = c.id.offset();
        assert_eq!(offset % 8, 0);
        assert!(offset + 8 <= PAGE_SIZE, "{}", c.name);
        assert_eq!(c.id.slot(), offset / 8);
        assert!(c.id.index >= 1 && c.id.index as usize <= MAX_COUNTERS_PER_GROUP);
    }
}

#[test]
fn hypercall_codes_of_seed_003_and_the_reference() {
    assert_eq!(HypercallCode::MAP_STATS_PAGE.0, 0x006C);
    assert_eq!(HypercallCode::UNMAP_STATS_PAGE.0, 0x006D);
    assert_eq!(HypercallCode::MAP_STATS_PAGE2.0, 0x0131);
    assert_eq!(HypercallCode::GET_PARTITION_ID.0, 0x0046);
    assert_eq!(HypercallCode::NOTIFY_LONG_SPIN_WAIT.0, 0x0008);
    assert_eq!(HypercallCode::MAP_STATS_PAGE.name(), Some("HvCallMapStatsPage"));
    assert_eq!(HypercallCode(0x7FFF).name(), None);
    // The seed 001 class each is counted under; unknown codes are "other".
    use hvstats_abi::hypercall::HypercallClass;
    assert_eq!(HypercallCode::MAP_STATS_PAGE.class(), HypercallClass::GpaSpace);
    assert_eq!(HypercallCode::UNMAP_STATS_PAGE.class(), HypercallClass::GpaSpace);
    assert_eq!(HypercallCode::MAP_STATS_PAGE2.class(), HypercallClass::GpaSpace);
    assert_eq!(HypercallCode::NOTIFY_LONG_SPIN_WAIT.class(), HypercallClass::LongSpinWait);
    assert_eq!(HypercallCode::GET_PARTITION_ID.class(), HypercallClass::Other);
    assert_eq!(HypercallCode(0x7FFF).class(), HypercallClass::Other);
}

#[test]
fn map_and_unmap_input_blocks_sit_at_their_offsets() {
    assert_eq!(size_of::<MapStatsPageInput>(), 32);
    assert_eq!(offset_of!(MapStatsPageInput, stats_type), 0);
    assert_eq!(offset_of!(MapStatsPageInput, padding), 4);
    assert_eq!(offset_of!(MapStatsPageInput, identity), 8);
    assert_eq!(offset_of!(MapStatsPageInput, target_gpa_page), 24);

    assert_eq!(size_of::<UnmapStatsPageInput>(), 24);
    assert_eq!(offset_of!(UnmapStatsPageInput, stats_type), 0);
    assert_eq!(offset_of!(UnmapStatsPageInput, padding), 4);
    assert_eq!(offset_of!(UnmapStatsPageInput, identity), 8);

    assert_eq!(size_of::<GetPartitionIdOutput>(), 8);

    // Decoding the bytes a guest writes.
    let mut bytes = [0u8; 32];
    bytes[0..4].copy_from_slice(&0x0001_0002u32.to_le_bytes());
    bytes[8..16].copy_from_slice(&5u64.to_le_bytes());
    bytes[16..20].copy_from_slice(&3u32.to_le_bytes());
    bytes[23] = 1;
    bytes[24..32].copy_from_slice(&0xABCDu64.to_le_bytes());
    let input = MapStatsPageInput::read_from_bytes(&bytes).unwrap();
    assert_eq!(input.stats_type, StatsObjectType::VP);
    assert_eq!(input.identity, StatsObjectIdentity::vp(5, 3, StatsAreaType::PARENT));
    assert_eq!(input.target_gpa_page, 0xABCD);
    let unmap = UnmapStatsPageInput::read_from_bytes(&bytes[..24]).unwrap();
    assert_eq!((unmap.stats_type, unmap.identity), (input.stats_type, input.identity));
}

#[test]
fn hypercall_input_value_fields() {
    // code 0x1234, fast, var header 0x2AB, rep count 0xCDE, rep start 0x9F1.
    let raw: u64 = 0x1234 | (1 << 16) | (0x2AB << 17) | (0xCDE << 32) | (0x9F1 << 48);
    let v = HypercallInput(raw);
    assert_eq!(v.code(), HypercallCode(0x1234));
    assert!(v.fast());
    assert_eq!(v.variable_header_size(), 0x2AB);
    assert_eq!(v.rep_count(), 0xCDE);
    assert_eq!(v.rep_start(), 0x9F1);
    assert_eq!(v.reserved(), 0);

    // Each field alone, at its bit range.
    assert_eq!(HypercallInput(0xFFFF).code(), HypercallCode(0xFFFF));
    assert!(!HypercallInput(0xFFFF).fast());
    assert_eq!(HypercallInput(0x3FF << 17).variable_header_size(), 0x3FF);
    assert_eq!(HypercallInput(0xFFF << 32).rep_count(), 0xFFF);
    assert_eq!(HypercallInput(0xFFF << 48).rep_start(), 0xFFF);

    // Reserved: 31:27, 47:44, 63:60, and nothing else.
    assert_eq!(HypercallInput::RESERVED_MASK, 0xF000_F000_F800_0000);
    let all_fields: u64 = 0xFFFF | (1 << 16) | (0x3FF << 17) | (0xFFF << 32) | (0xFFF << 48);
    assert_eq!(all_fields | HypercallInput::RESERVED_MASK, u64::MAX);
    assert_eq!(all_fields & HypercallInput::RESERVED_MASK, 0);
    for bit in 0..64 {
        let reserved = (27..=31).contains(&bit) || (44..=47).contains(&bit) || bit >= 60;
        assert_eq!(HypercallInput(1 << bit).reserved() != 0, reserved, "bit {bit}");
    }

    // The builders set exactly those bits.
    let built = HypercallInput::simple(HypercallCode(0x1234))
        .with_fast(true)
        .with_variable_header_size(0x2AB)
        .with_rep_count(0xCDE)
        .with_rep_start(0x9F1);
    assert_eq!(built, v);
    assert_eq!(built.with_fast(false).0, raw & !(1 << 16));
}

#[test]
fn hypercall_result_value_fields() {
    let out = HypercallOutput::new(HvStatus::ACCESS_DENIED, 0xABC);
    assert_eq!(out.0, 0x0000_0ABC_0000_0006);
    assert_eq!(out.status(), HvStatus::ACCESS_DENIED);
    assert_eq!(out.reps_completed(), 0xABC);
    let noisy = HypercallOutput(u64::MAX);
    assert_eq!(noisy.status(), HvStatus(0xFFFF));
    assert_eq!(noisy.reps_completed(), 0xFFF);
}

#[test]
fn partition_privilege_bits() {
    assert_eq!(PartitionPrivileges::ACCESS_STATS_REG, 1 << 8);
    assert_eq!(PartitionPrivileges::ACCESS_STATS, 1 << 40);
    assert!(PartitionPrivileges(1 << 40).access_stats());
    assert!(!PartitionPrivileges(1 << 8).access_stats());
    assert_eq!(PartitionPrivileges::ACCESS_PARTITION_ID, 1 << 33);
    assert!(PartitionPrivileges(1 << 33).access_partition_id());
}

#[test]
fn synthetic_msrs_and_the_interface_signature() {
    use hvstats_abi::hypercall::{INTERFACE_SIGNATURE, MSR_GUEST_OS_ID, MSR_HYPERCALL, MSR_VP_INDEX};
    assert_eq!(MSR_GUEST_OS_ID, 0x4000_0000);
    assert_eq!(MSR_HYPERCALL, 0x4000_0001);
    assert_eq!(MSR_VP_INDEX, 0x4000_0002);
    assert_eq!(INTERFACE_SIGNATURE, 0x3123_7648);
}

#[test]
fn hv_status_values_of_reference_1_6() {
    let table: &[(HvStatus, u16, &str)] = &[
        (HvStatus::SUCCESS, 0x0, "HV_STATUS_SUCCESS"),
        (HvStatus::INVALID_HYPERCALL_CODE, 0x2, "HV_STATUS_INVALID_HYPERCALL_CODE"),
        (HvStatus::INVALID_HYPERCALL_INPUT, 0x3, "HV_STATUS_INVALID_HYPERCALL_INPUT"),
        (HvStatus::INVALID_ALIGNMENT, 0x4, "HV_STATUS_INVALID_ALIGNMENT"),
        (HvStatus::INVALID_PARAMETER, 0x5, "HV_STATUS_INVALID_PARAMETER"),
        (HvStatus::ACCESS_DENIED, 0x6, "HV_STATUS_ACCESS_DENIED"),
        (HvStatus::INVALID_PARTITION_STATE, 0x7, "HV_STATUS_INVALID_PARTITION_STATE"),
        (HvStatus::OPERATION_DENIED, 0x8, "HV_STATUS_OPERATION_DENIED"),
        (HvStatus::UNKNOWN_PROPERTY, 0x9, "HV_STATUS_UNKNOWN_PROPERTY"),
        (HvStatus::PROPERTY_VALUE_OUT_OF_RANGE, 0xA, "HV_STATUS_PROPERTY_VALUE_OUT_OF_RANGE"),
        (HvStatus::INSUFFICIENT_MEMORY, 0xB, "HV_STATUS_INSUFFICIENT_MEMORY"),
        (HvStatus::PARTITION_TOO_DEEP, 0xC, "HV_STATUS_PARTITION_TOO_DEEP"),
        (HvStatus::INVALID_PARTITION_ID, 0xD, "HV_STATUS_INVALID_PARTITION_ID"),
        (HvStatus::INVALID_VP_INDEX, 0xE, "HV_STATUS_INVALID_VP_INDEX"),
        (HvStatus::NOT_FOUND, 0x10, "HV_STATUS_NOT_FOUND"),
        (HvStatus::INSUFFICIENT_BUFFERS, 0x13, "HV_STATUS_INSUFFICIENT_BUFFERS"),
        (HvStatus::OBJECT_IN_USE, 0x19, "HV_STATUS_OBJECT_IN_USE"),
        (HvStatus::NO_RESOURCES, 0x1D, "HV_STATUS_NO_RESOURCES"),
        (HvStatus::INSUFFICIENT_BUFFER, 0x33, "HV_STATUS_INSUFFICIENT_BUFFER"),
        (HvStatus::INVALID_LP_INDEX, 0x41, "HV_STATUS_INVALID_LP_INDEX"),
    ];
    assert_eq!(HvStatus::KNOWN.len(), table.len());
    for (&(status, value, name), &known) in table.iter().zip(HvStatus::KNOWN) {
        assert_eq!(status.0, value, "{name}");
        assert_eq!(known, status, "KNOWN is in numeric order");
        assert_eq!(status.name(), Some(name));
        assert!(status.message().is_some_and(|m| !m.is_empty()));
    }
    assert!(HvStatus::SUCCESS.is_success() && !HvStatus::ACCESS_DENIED.is_success());
    assert_eq!(HvStatus(0x1234).name(), None);
    assert_eq!(format!("{}", HvStatus(0x1234)), "unknown HV_STATUS 0x1234");
    assert_eq!(format!("{:?}", HvStatus::INVALID_VP_INDEX), "HV_STATUS_INVALID_VP_INDEX");
}

#[test]
fn whv_counter_sets_of_seed_000() {
    assert_eq!(CounterSet::RUNTIME.0, 0);
    assert_eq!(CounterSet::INTERCEPTS.0, 1);
    assert_eq!(CounterSet::EVENTS.0, 2);
    assert_eq!(CounterSet::APIC.0, 3);
    assert_eq!(CounterSet::RUNTIME.size(), Some(16));
    assert_eq!(CounterSet::INTERCEPTS.size(), Some(176));
    assert_eq!(CounterSet::EVENTS.size(), Some(24));
    assert_eq!(CounterSet::APIC.size(), Some(40));
    assert_eq!(CounterSet(4).size(), None);

    assert_eq!(size_of::<RuntimeCounters>(), 16);
    assert_eq!(offset_of!(RuntimeCounters, total_runtime_100ns), 0);
    assert_eq!(offset_of!(RuntimeCounters, hypervisor_runtime_100ns), 8);

    assert_eq!(size_of::<InterceptCounter>(), 16);
    assert_eq!(offset_of!(InterceptCounter, count), 0);
    assert_eq!(offset_of!(InterceptCounter, time_100ns), 8);

    assert_eq!(size_of::<InterceptCounters>(), 176);
    assert_eq!(offset_of!(InterceptCounters, page_invalidations), 0);
    assert_eq!(offset_of!(InterceptCounters, control_register_accesses), 16);
    assert_eq!(offset_of!(InterceptCounters, io_instructions), 32);
    assert_eq!(offset_of!(InterceptCounters, halt_instructions), 48);
    assert_eq!(offset_of!(InterceptCounters, cpuid_instructions), 64);
    assert_eq!(offset_of!(InterceptCounters, msr_accesses), 80);
    assert_eq!(offset_of!(InterceptCounters, other_intercepts), 96);
    assert_eq!(offset_of!(InterceptCounters, pending_interrupts), 112);
    assert_eq!(offset_of!(InterceptCounters, emulated_instructions), 128);
    assert_eq!(offset_of!(InterceptCounters, debug_register_accesses), 144);
    assert_eq!(offset_of!(InterceptCounters, page_fault_intercepts), 160);

    assert_eq!(size_of::<EventCounters>(), 24);
    assert_eq!(offset_of!(EventCounters, page_fault_count), 0);
    assert_eq!(offset_of!(EventCounters, exception_count), 8);
    assert_eq!(offset_of!(EventCounters, interrupt_count), 16);

    assert_eq!(size_of::<ApicCounters>(), 40);
    assert_eq!(offset_of!(ApicCounters, mmio_access_count), 0);
    assert_eq!(offset_of!(ApicCounters, eoi_access_count), 8);
    assert_eq!(offset_of!(ApicCounters, tpr_access_count), 16);
    assert_eq!(offset_of!(ApicCounters, sent_ipi_count), 24);
    assert_eq!(offset_of!(ApicCounters, self_ipi_count), 32);

    assert_eq!(HResult::S_OK.0, 0);
    assert_eq!(HResult::WHV_E_INSUFFICIENT_BUFFER.0, 0x8037_0301);
    assert_eq!(HResult::WHV_E_UNKNOWN_PROPERTY.0, 0x8037_0302);
}

#[test]
fn hal_structures_of_seed_002() {
    assert_eq!(size_of::<GroupAffinity>(), 16);
    assert_eq!(offset_of!(GroupAffinity, mask), 0);
    assert_eq!(offset_of!(GroupAffinity, group), 8);
    assert_eq!(offset_of!(GroupAffinity, reserved), 10);

    assert_eq!(size_of::<PhysicalCounterResourceDescriptor>(), 24);
    assert_eq!(offset_of!(PhysicalCounterResourceDescriptor, resource_type), 0);
    assert_eq!(offset_of!(PhysicalCounterResourceDescriptor, flags), 4);
    assert_eq!(offset_of!(PhysicalCounterResourceDescriptor, u), 8);
    assert_eq!(size_of::<ResourceType>(), 4);

    assert_eq!(RESOURCE_LIST_DESCRIPTORS_OFFSET, 8);
    assert_eq!(size_of::<PhysicalCounterResourceListHeader>(), 8);
    assert_eq!(offset_of!(PhysicalCounterResourceListHeader, count), 0);

    assert_eq!(ResourceType::SINGLE.0, 0);
    assert_eq!(ResourceType::RANGE.0, 1);
    assert_eq!(ResourceType::EXTENDED_COUNTER_CONFIGURATION.0, 2);
    assert_eq!(ResourceType::OVERFLOW.0, 3);
    assert_eq!(ResourceType::EVENT_BUFFER.0, 4);
    assert_eq!(ResourceType::IDENTIFICATION_TAG.0, 5);

    assert_eq!(NtStatus::SUCCESS.0, 0);
    assert_eq!(NtStatus::INSUFFICIENT_RESOURCES.0, 0xC000_009A);
    assert_eq!(NtStatus::INVALID_PARAMETER.0, 0xC000_000D);
    assert_eq!(NtStatus::NOT_SUPPORTED.0, 0xC000_00BB);
    assert_eq!(NtStatus::NOT_SUPPORTED.name(), Some("STATUS_NOT_SUPPORTED"));
    assert_eq!(NtStatus(1).name(), None);
}

#[test]
fn hal_descriptor_union_members_sit_at_their_offsets() {
    let single = PhysicalCounterResourceDescriptor::single(0x0403_0201);
    assert_eq!(&single.as_bytes()[0..12], &[0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4]);
    assert_eq!(single.counter_index(), 0x0403_0201);

    let range = PhysicalCounterResourceDescriptor::range(2, 5);
    assert_eq!(&range.as_bytes()[0..4], &1u32.to_le_bytes());
    assert_eq!(&range.as_bytes()[8..16], &[2, 0, 0, 0, 5, 0, 0, 0]);
    assert_eq!(range.range_bounds(), (2, 5));

    let overflow = PhysicalCounterResourceDescriptor::overflow(0x1122_3344_5566_7788);
    assert_eq!(&overflow.as_bytes()[8..16], &0x1122_3344_5566_7788u64.to_le_bytes());

    let eb = PhysicalCounterResourceDescriptor::event_buffer(0xAA, 0x10, 0x20);
    assert_eq!(&eb.as_bytes()[0..4], &4u32.to_le_bytes());
    assert_eq!(&eb.as_bytes()[8..16], &0xAAu64.to_le_bytes());
    assert_eq!(&eb.as_bytes()[16..20], &0x10u32.to_le_bytes());
    assert_eq!(&eb.as_bytes()[20..24], &0x20u32.to_le_bytes());

    let tag = PhysicalCounterResourceDescriptor::identification_tag(9);
    assert_eq!(&tag.as_bytes()[0..4], &5u32.to_le_bytes());
    assert_eq!(tag.tag(), 9);
}

#[test]
fn hal_resource_list_decodes_count_and_descriptors_at_8() {
    let descriptors =
        [PhysicalCounterResourceDescriptor::single(3), PhysicalCounterResourceDescriptor::range(4, 6)];
    // Build the in-memory list in an 8-aligned buffer: Count @0, descriptors @8.
    let mut words = [0u64; 1 + 2 * 3];
    let bytes = words.as_mut_bytes();
    bytes[0..4].copy_from_slice(&2u32.to_le_bytes());
    bytes[8..32].copy_from_slice(descriptors[0].as_bytes());
    bytes[32..56].copy_from_slice(descriptors[1].as_bytes());
    let list = PhysicalCounterResourceList::from_bytes(words.as_bytes()).unwrap();
    assert_eq!(list.count, 2);
    assert_eq!(list.descriptors, &descriptors);
    assert_eq!(PhysicalCounterResourceList::new(&descriptors), list);

    // A count larger than the bytes supplied is refused, not read past the end.
    let mut short = words;
    short.as_mut_bytes()[0..4].copy_from_slice(&3u32.to_le_bytes());
    assert_eq!(PhysicalCounterResourceList::from_bytes(short.as_bytes()), None);
    let mut huge = words;
    huge.as_mut_bytes()[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(PhysicalCounterResourceList::from_bytes(huge.as_bytes()), None);
    assert_eq!(PhysicalCounterResourceList::from_bytes(&[0u8; 4]), None);
}
