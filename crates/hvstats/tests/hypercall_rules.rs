//! The stats hypercalls through `dispatch`, with guest RAM and the overlay hook faked: one test
//! per status of the rule list, the order of the rules, and what a map and an unmap change.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

use std::sync::Arc;

use hvstats::hypercall::{
    CallerContext, GuestMemory, NotRam, OverlayError, ROOT_PARTITION_ID, StatsOverlays, dispatch,
};
use hvstats::rules::{StatsArea, StatsObject};
use hvstats::{Hypervisor, InstanceConfig, MappedPage, PartitionStats, SharedPage};
use hvstats_abi::catalog::{partition, vp};
use hvstats_abi::hypercall::{
    HV_PARTITION_ID_SELF, HV_VP_INDEX_SELF, HypercallCode, HypercallInput, MapStatsPageInput,
    PartitionPrivileges, UnmapStatsPageInput,
};
use hvstats_abi::object::IDENTITY_AREA_OFFSET;
use hvstats_abi::page::PageView;
use hvstats_abi::{HvStatus, ObjectKind, StatsAreaType, StatsObjectIdentity, StatsObjectType};
use zerocopy::IntoBytes;

const PAGE: u64 = 4096;
/// Guest RAM: GPA pages 0..16.
const RAM_PAGES: u64 = 16;
/// The guest's GPA space: pages 0..32 (RAM, then a hole where overlays may go).
const GPA_SPACE_PAGES: u64 = 32;
/// Where the tests put input blocks.
const INPUT_GPA: u64 = 0x1000;
const OUTPUT_GPA: u64 = 0x2000;

struct Ram(Vec<u8>);

impl GuestMemory for Ram {
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), NotRam> {
        let start = usize::try_from(gpa).map_err(|_| NotRam { gpa })?;
        let src = self.0.get(start..start + buf.len()).ok_or(NotRam { gpa })?;
        buf.copy_from_slice(src);
        Ok(())
    }

    fn write(&mut self, gpa: u64, data: &[u8]) -> Result<(), NotRam> {
        let start = usize::try_from(gpa).map_err(|_| NotRam { gpa })?;
        self.0.get_mut(start..start + data.len()).ok_or(NotRam { gpa })?.copy_from_slice(data);
        Ok(())
    }

    fn is_ram(&self, gpa: u64) -> bool {
        gpa < self.0.len() as u64
    }
}

/// Records the overlays installed, each with a read-only mapping of the page it was given.
#[derive(Default)]
struct Overlays {
    mapped: Vec<(u64, usize, MappedPage)>,
    map_calls: usize,
    unmap_calls: usize,
    fail: bool,
}

impl StatsOverlays for Overlays {
    fn map_overlay(&mut self, gpa_page: u64, page: &SharedPage) -> Result<(), OverlayError> {
        self.map_calls += 1;
        if self.fail {
            return Err(OverlayError { gpa_page, source: std::io::Error::other("no slot") });
        }
        let mapped = page.map_read_only().map_err(|source| OverlayError { gpa_page, source })?;
        self.mapped.push((gpa_page, page.host_address() as usize, mapped));
        Ok(())
    }

    fn unmap_overlay(&mut self, gpa_page: u64) -> Result<(), OverlayError> {
        self.unmap_calls += 1;
        let at =
            self.mapped.iter().position(|(g, ..)| *g == gpa_page).expect("unmap of an overlay never mapped");
        self.mapped.remove(at);
        Ok(())
    }
}

struct World {
    hv: Arc<Hypervisor>,
    guest: Arc<PartitionStats>,
    other: Arc<PartitionStats>,
    ram: Ram,
    overlays: Overlays,
    privileges: PartitionPrivileges,
    vp_index: u32,
}

impl World {
    fn new() -> Self {
        let hv = Hypervisor::with_config(InstanceConfig {
            logical_processors: Some(vec![0, 1]),
            ..Default::default()
        })
        .unwrap();
        let guest = hv.create_partition(2).unwrap();
        guest.set_ram_pages(RAM_PAGES);
        let other = hv.create_partition(1).unwrap();
        Self {
            hv,
            guest,
            other,
            ram: Ram(vec![0; (RAM_PAGES * PAGE) as usize]),
            overlays: Overlays::default(),
            privileges: PartitionPrivileges(
                PartitionPrivileges::ACCESS_STATS | PartitionPrivileges::ACCESS_PARTITION_ID,
            ),
            vp_index: 1,
        }
    }

    fn call(&mut self, input: HypercallInput, input_gpa: u64, output_gpa: u64) -> HvStatus {
        let ctx =
            CallerContext::guest(&self.hv, self.guest.id(), self.vp_index, self.privileges, GPA_SPACE_PAGES);
        let out = dispatch(&ctx, input, input_gpa, output_gpa, &mut self.ram, &mut self.overlays);
        assert_eq!(out.reps_completed(), 0);
        out.status()
    }

    fn root_call(&mut self, input: HypercallInput, input_gpa: u64, output_gpa: u64) -> HvStatus {
        let ctx = CallerContext::root(&self.hv);
        dispatch(&ctx, input, input_gpa, output_gpa, &mut self.ram, &mut self.overlays).status()
    }

    fn put(&mut self, gpa: u64, bytes: &[u8]) {
        self.ram.write(gpa, bytes).unwrap();
    }

    fn map(&mut self, block: MapStatsPageInput) -> HvStatus {
        self.put(INPUT_GPA, block.as_bytes());
        self.call(HypercallInput::simple(HypercallCode::MAP_STATS_PAGE), INPUT_GPA, 0)
    }

    fn unmap(&mut self, stats_type: StatsObjectType, identity: StatsObjectIdentity) -> HvStatus {
        let block = UnmapStatsPageInput { stats_type, padding: 0, identity };
        self.put(INPUT_GPA, block.as_bytes());
        self.call(HypercallInput::simple(HypercallCode::UNMAP_STATS_PAGE), INPUT_GPA, 0)
    }

    fn own_vp(&self, vp_index: u32, gpa_page: u64) -> MapStatsPageInput {
        map_block(
            StatsObjectType::VP,
            StatsObjectIdentity::vp(self.guest.id(), vp_index, StatsAreaType::SELF),
            gpa_page,
        )
    }
}

fn map_block(stats_type: StatsObjectType, identity: StatsObjectIdentity, gpa_page: u64) -> MapStatsPageInput {
    MapStatsPageInput { stats_type, padding: 0, identity, target_gpa_page: gpa_page }
}

fn map_input() -> HypercallInput {
    HypercallInput::simple(HypercallCode::MAP_STATS_PAGE)
}

// ---- What a map and an unmap do ----

#[test]
fn map_installs_the_objects_own_page_at_the_target_gpa_and_the_guest_reads_its_counters() {
    let mut w = World::new();
    let vp1 = w.guest.vp_page(1).unwrap().host_address() as usize;
    w.guest.vp_page(1).unwrap().set(vp::CPUID_INSTRUCTIONS, 1234);
    assert_eq!(w.map(w.own_vp(1, 5)), HvStatus::SUCCESS);
    assert_eq!(w.overlays.mapped.len(), 1);
    let (gpa_page, page_address, mapped) = &w.overlays.mapped[0];
    assert_eq!(*gpa_page, 5);
    assert_eq!(*page_address, vp1, "the overlay must be VP 1's own page, not a copy");
    let view_bytes = mapped.snapshot();
    assert_eq!(
        PageView::read(view_bytes.as_bytes(), ObjectKind::Vp).unwrap().get(vp::CPUID_INSTRUCTIONS),
        1234
    );
    // Later updates show through the same page.
    w.guest.vp_page(1).unwrap().add(vp::CPUID_INSTRUCTIONS, 1);
    let later = w.overlays.mapped[0].2.snapshot();
    assert_eq!(PageView::read(later.as_bytes(), ObjectKind::Vp).unwrap().get(vp::CPUID_INSTRUCTIONS), 1235);
    assert!(w.guest.record_overlay_write(5 * PAGE + 8));
    assert!(!w.guest.record_overlay_write(6 * PAGE));
    assert_eq!(w.guest.overlay_writes(), 1);
    assert_eq!(
        w.guest.overlay_at(5 * PAGE).map(|k| (k.object, k.area)),
        Some((StatsObject::Vp(w.guest.id(), 1), StatsArea::OwnView))
    );
}

#[test]
fn map2_takes_the_same_input_as_map() {
    let mut w = World::new();
    let block = map_block(
        StatsObjectType::PARTITION,
        StatsObjectIdentity::partition(w.guest.id(), StatsAreaType::SELF),
        3,
    );
    w.put(INPUT_GPA, block.as_bytes());
    let status = w.call(HypercallInput::simple(HypercallCode::MAP_STATS_PAGE2), INPUT_GPA, 0);
    assert_eq!(status, HvStatus::SUCCESS);
    assert_eq!(w.overlays.mapped[0].0, 3);
    assert_eq!(w.overlays.mapped[0].1, w.guest.page().host_address() as usize);
}

#[test]
fn unmap_removes_the_overlay_and_each_change_is_a_gpa_space_modification() {
    let mut w = World::new();
    assert_eq!(w.map(w.own_vp(0, 20)), HvStatus::SUCCESS);
    // Page 20 lies outside RAM (pages 0..16) but inside the GPA space: one more GPA page.
    assert_eq!(w.guest.page().get(partition::GPA_PAGES), RAM_PAGES + 1);
    assert_eq!(w.guest.page().get(partition::GPA_SPACE_MODIFICATIONS), 1);
    assert_eq!(w.map(w.own_vp(1, 7)), HvStatus::SUCCESS);
    // Over RAM: the page count does not change.
    assert_eq!(w.guest.page().get(partition::GPA_PAGES), RAM_PAGES + 1);
    let id = StatsObjectIdentity::vp(w.guest.id(), 0, StatsAreaType::SELF);
    assert_eq!(w.unmap(StatsObjectType::VP, id), HvStatus::SUCCESS);
    assert_eq!(w.overlays.unmap_calls, 1);
    assert_eq!(w.overlays.mapped.iter().map(|m| m.0).collect::<Vec<_>>(), vec![7]);
    assert_eq!(w.guest.page().get(partition::GPA_PAGES), RAM_PAGES);
    assert_eq!(w.guest.page().get(partition::GPA_SPACE_MODIFICATIONS), 3);
    assert_eq!(w.guest.overlay_at(20 * PAGE), None);
    // Mapped again after the unmap: allowed.
    assert_eq!(w.map(w.own_vp(0, 21)), HvStatus::SUCCESS);
}

#[test]
fn map_beyond_the_gpa_space_succeeds_but_installs_nothing_and_can_be_unmapped() {
    let mut w = World::new();
    assert_eq!(w.map(w.own_vp(0, GPA_SPACE_PAGES)), HvStatus::SUCCESS);
    assert_eq!(w.map(w.own_vp(1, u64::MAX)), HvStatus::SUCCESS);
    assert_eq!(w.overlays.map_calls, 0);
    assert_eq!(w.guest.page().get(partition::GPA_PAGES), RAM_PAGES);
    assert_eq!(w.guest.overlay_at(GPA_SPACE_PAGES * PAGE), None);
    assert_eq!(w.guest.gpa_space().mappings().len(), 2);
    let id = StatsObjectIdentity::vp(w.guest.id(), 0, StatsAreaType::SELF);
    assert_eq!(w.unmap(StatsObjectType::VP, id), HvStatus::SUCCESS);
    assert_eq!(w.overlays.unmap_calls, 0);
}

#[test]
fn self_ids_name_the_calling_partition_and_vp() {
    let mut w = World::new();
    w.vp_index = 1;
    let block = map_block(
        StatsObjectType::VP,
        StatsObjectIdentity::vp(HV_PARTITION_ID_SELF, HV_VP_INDEX_SELF, StatsAreaType::SELF),
        4,
    );
    assert_eq!(w.map(block), HvStatus::SUCCESS);
    assert_eq!(w.overlays.mapped[0].1, w.guest.vp_page(1).unwrap().host_address() as usize);
    // The same object by its explicit ids is already mapped.
    assert_eq!(w.map(w.own_vp(1, 9)), HvStatus::OPERATION_DENIED);
    let part = map_block(
        StatsObjectType::PARTITION,
        StatsObjectIdentity::partition(HV_PARTITION_ID_SELF, StatsAreaType::SELF),
        6,
    );
    assert_eq!(w.map(part), HvStatus::SUCCESS);
    assert_eq!(w.overlays.mapped[1].1, w.guest.page().host_address() as usize);
}

#[test]
fn get_partition_id_writes_the_callers_id_at_the_output_gpa() {
    let mut w = World::new();
    let input = HypercallInput::simple(HypercallCode::GET_PARTITION_ID);
    assert_eq!(w.call(input, 0, OUTPUT_GPA), HvStatus::SUCCESS);
    let mut out = [0u8; 8];
    w.ram.read(OUTPUT_GPA, &mut out).unwrap();
    assert_eq!(u64::from_le_bytes(out), w.guest.id());
    assert_eq!(w.root_call(input, 0, OUTPUT_GPA + 8), HvStatus::SUCCESS);
    w.ram.read(OUTPUT_GPA + 8, &mut out).unwrap();
    assert_eq!(u64::from_le_bytes(out), ROOT_PARTITION_ID);
    // The output GPA must be RAM and aligned.
    assert_eq!(w.call(input, 0, RAM_PAGES * PAGE), HvStatus::INVALID_PARAMETER);
    assert_eq!(w.call(input, 0, OUTPUT_GPA + 4), HvStatus::INVALID_ALIGNMENT);
}

#[test]
fn an_output_block_under_a_stats_overlay_is_access_denied_and_nothing_is_written() {
    let mut w = World::new();
    // VP 1's page over RAM page 2, where the output block would go.
    assert_eq!(w.map(w.own_vp(1, OUTPUT_GPA / PAGE)), HvStatus::SUCCESS);
    w.put(OUTPUT_GPA + 16, &[0xAA; 8]);
    let input = HypercallInput::simple(HypercallCode::GET_PARTITION_ID);
    assert_eq!(w.call(input, 0, OUTPUT_GPA + 16), HvStatus::ACCESS_DENIED);
    let mut hidden = [0u8; 8];
    w.ram.read(OUTPUT_GPA + 16, &mut hidden).unwrap();
    assert_eq!(hidden, [0xAA; 8], "the RAM beneath the overlay is untouched");
    // The page next to it is RAM the guest sees: the output lands there.
    assert_eq!(w.call(input, 0, OUTPUT_GPA + PAGE), HvStatus::SUCCESS);
    // Once unmapped, the page is writable RAM again.
    assert_eq!(
        w.unmap(StatsObjectType::VP, StatsObjectIdentity::vp(w.guest.id(), 1, StatsAreaType::SELF)),
        HvStatus::SUCCESS
    );
    assert_eq!(w.call(input, 0, OUTPUT_GPA + 16), HvStatus::SUCCESS);
    w.ram.read(OUTPUT_GPA + 16, &mut hidden).unwrap();
    assert_eq!(u64::from_le_bytes(hidden), w.guest.id());
}

#[test]
fn notify_long_spin_wait_succeeds_in_memory_and_fast_form() {
    let mut w = World::new();
    let input = HypercallInput::simple(HypercallCode::NOTIFY_LONG_SPIN_WAIT);
    assert_eq!(w.call(input, INPUT_GPA, 0), HvStatus::SUCCESS);
    assert_eq!(w.call(input.with_fast(true), 1000, 0), HvStatus::SUCCESS);
    assert_eq!(w.guest.page().get(partition::GPA_SPACE_MODIFICATIONS), 0);
}

#[test]
fn the_root_maps_global_pages_and_the_parent_view_of_any_partition() {
    let mut w = World::new();
    let other = w.other.id();
    for (i, (t, id)) in [
        (StatsObjectType::HYPERVISOR, StatsObjectIdentity::hypervisor(StatsAreaType::SELF)),
        (StatsObjectType::LOGICAL_PROCESSOR, StatsObjectIdentity::logical_processor(1, StatsAreaType::SELF)),
        (StatsObjectType::VP, StatsObjectIdentity::vp(other, 0, StatsAreaType::PARENT)),
        (StatsObjectType::VP, StatsObjectIdentity::vp(other, 0, StatsAreaType::SELF)),
    ]
    .into_iter()
    .enumerate()
    {
        w.put(INPUT_GPA, map_block(t, id, 100 + i as u64).as_bytes());
        assert_eq!(w.root_call(map_input(), INPUT_GPA, 0), HvStatus::SUCCESS, "root map {i}");
    }
    assert_eq!(w.overlays.mapped[0].1, w.hv.page().host_address() as usize);
    assert_eq!(w.overlays.mapped[1].1, w.hv.logical_processors()[1].page().host_address() as usize);
    assert_eq!(w.hv.root_gpa_space().mappings().len(), 4);
    // Root mappings are the root's, not the guest partition's.
    assert!(w.guest.gpa_space().mappings().is_empty());
}

#[test]
fn a_failing_overlay_hook_is_insufficient_memory_and_records_nothing() {
    let mut w = World::new();
    w.overlays.fail = true;
    assert_eq!(w.map(w.own_vp(0, 5)), HvStatus::INSUFFICIENT_MEMORY);
    assert!(w.guest.gpa_space().mappings().is_empty());
    assert_eq!(w.guest.page().get(partition::GPA_SPACE_MODIFICATIONS), 0);
}

#[test]
fn two_objects_cannot_share_one_visible_gpa_page() {
    let mut w = World::new();
    assert_eq!(w.map(w.own_vp(0, 5)), HvStatus::SUCCESS);
    assert_eq!(w.map(w.own_vp(1, 5)), HvStatus::INVALID_PARAMETER);
}

// ---- One test per status of the rule list ----

#[test]
fn rule1_misaligned_or_page_crossing_input_is_invalid_alignment() {
    let mut w = World::new();
    let block = w.own_vp(0, 5);
    w.put(INPUT_GPA + 4, block.as_bytes());
    assert_eq!(w.call(map_input(), INPUT_GPA + 4, 0), HvStatus::INVALID_ALIGNMENT);
    // 8-aligned, but the 32-byte block runs into the next page.
    assert_eq!(w.call(map_input(), 2 * PAGE - 16, 0), HvStatus::INVALID_ALIGNMENT);
    let unmap = HypercallInput::simple(HypercallCode::UNMAP_STATS_PAGE);
    assert_eq!(w.call(unmap, 2 * PAGE - 16, 0), HvStatus::INVALID_ALIGNMENT);
    assert_eq!(w.call(unmap, 2 * PAGE - 24, 0), HvStatus::INVALID_PARAMETER, "fits; not mapped");
}

#[test]
fn rule2_malformed_input_values_are_invalid_hypercall_input() {
    let mut w = World::new();
    let block = w.own_vp(0, 5);
    w.put(INPUT_GPA, block.as_bytes());
    let base = map_input();
    for (what, input) in [
        ("reserved bit 27", HypercallInput(base.0 | 1 << 27)),
        ("reserved bit 44", HypercallInput(base.0 | 1 << 44)),
        ("reserved bit 63", HypercallInput(base.0 | 1 << 63)),
        ("rep count", base.with_rep_count(1)),
        ("rep start", base.with_rep_start(1)),
        ("fast", base.with_fast(true)),
        ("variable header", base.with_variable_header_size(1)),
    ] {
        assert_eq!(w.call(input, INPUT_GPA, 0), HvStatus::INVALID_HYPERCALL_INPUT, "{what}");
    }
    assert!(w.overlays.mapped.is_empty());
}

#[test]
fn rule3_unknown_call_code_is_invalid_hypercall_code() {
    let mut w = World::new();
    for code in [0x0000, 0x0999, 0xFFFF, HypercallCode::MAP_GPA_PAGES.0] {
        let input = HypercallInput::simple(HypercallCode(code));
        assert_eq!(w.call(input, INPUT_GPA, 0), HvStatus::INVALID_HYPERCALL_CODE, "{code:#x}");
    }
}

#[test]
fn rule4_malformed_requests_are_invalid_parameter() {
    let mut w = World::new();
    let good = w.own_vp(0, 5);
    let mut padding = good;
    padding.padding = 1;
    let mut reserved = good;
    reserved.identity.bytes[13] = 1;
    let mut unknown_type = good;
    unknown_type.stats_type = StatsObjectType(0x0001_0003);
    let mut internal = good;
    internal.identity.bytes[IDENTITY_AREA_OFFSET] = StatsAreaType::INTERNAL.0;
    let mut unknown_area = good;
    unknown_area.identity.bytes[IDENTITY_AREA_OFFSET] = 9;
    let mut partition_with_vp = map_block(
        StatsObjectType::PARTITION,
        StatsObjectIdentity::partition(w.guest.id(), StatsAreaType::SELF),
        5,
    );
    partition_with_vp.identity.bytes[8] = 1;
    for (what, block) in [
        ("padding", padding),
        ("reserved identity byte", reserved),
        ("unknown stats type", unknown_type),
        ("area INTERNAL", internal),
        ("unknown area", unknown_area),
        ("VP index in a partition identity", partition_with_vp),
    ] {
        assert_eq!(w.map(block), HvStatus::INVALID_PARAMETER, "{what}");
    }
    // An input block outside RAM.
    assert_eq!(w.call(map_input(), RAM_PAGES * PAGE, 0), HvStatus::INVALID_PARAMETER);
    assert!(w.overlays.mapped.is_empty());
}

#[test]
fn rule5_no_access_stats_is_access_denied() {
    let mut w = World::new();
    w.privileges =
        PartitionPrivileges(PartitionPrivileges::ACCESS_STATS_REG | PartitionPrivileges::ACCESS_PARTITION_ID);
    assert_eq!(w.map(w.own_vp(0, 5)), HvStatus::ACCESS_DENIED);
    let id = StatsObjectIdentity::vp(w.guest.id(), 0, StatsAreaType::SELF);
    assert_eq!(w.unmap(StatsObjectType::VP, id), HvStatus::ACCESS_DENIED);
    // Calls that need another privilege still work.
    let input = HypercallInput::simple(HypercallCode::GET_PARTITION_ID);
    assert_eq!(w.call(input, 0, OUTPUT_GPA), HvStatus::SUCCESS);
}

#[test]
fn get_partition_id_without_access_partition_id_is_access_denied() {
    let mut w = World::new();
    w.privileges = PartitionPrivileges(PartitionPrivileges::ACCESS_STATS);
    let input = HypercallInput::simple(HypercallCode::GET_PARTITION_ID);
    assert_eq!(w.call(input, 0, OUTPUT_GPA), HvStatus::ACCESS_DENIED);
    let mut out = [0u8; 8];
    w.ram.read(OUTPUT_GPA, &mut out).unwrap();
    assert_eq!(out, [0; 8], "nothing written");
    // Stats calls do not need it.
    assert_eq!(w.map(w.own_vp(0, 5)), HvStatus::SUCCESS);
}

#[test]
fn rule6_global_pages_from_a_guest_are_access_denied() {
    let mut w = World::new();
    let hv = map_block(StatsObjectType::HYPERVISOR, StatsObjectIdentity::hypervisor(StatsAreaType::SELF), 5);
    let lp = map_block(
        StatsObjectType::LOGICAL_PROCESSOR,
        StatsObjectIdentity::logical_processor(0, StatsAreaType::SELF),
        5,
    );
    assert_eq!(w.map(hv), HvStatus::ACCESS_DENIED);
    assert_eq!(w.map(lp), HvStatus::ACCESS_DENIED);
}

#[test]
fn rule7_other_partitions_and_the_parent_view_are_access_denied_whether_or_not_they_exist() {
    let mut w = World::new();
    let other = w.other.id();
    let existing =
        map_block(StatsObjectType::PARTITION, StatsObjectIdentity::partition(other, StatsAreaType::SELF), 5);
    let missing =
        map_block(StatsObjectType::PARTITION, StatsObjectIdentity::partition(999, StatsAreaType::SELF), 5);
    let parent =
        map_block(StatsObjectType::VP, StatsObjectIdentity::vp(w.guest.id(), 0, StatsAreaType::PARENT), 5);
    assert_eq!(w.map(existing), HvStatus::ACCESS_DENIED);
    assert_eq!(w.map(missing), HvStatus::ACCESS_DENIED, "a guest learns nothing about other ids");
    assert_eq!(w.map(parent), HvStatus::ACCESS_DENIED);
}

#[test]
fn rule8_vp_index_out_of_range_is_invalid_vp_index() {
    let mut w = World::new();
    assert_eq!(w.map(w.own_vp(2, 5)), HvStatus::INVALID_VP_INDEX);
    assert_eq!(w.map(w.own_vp(HV_VP_INDEX_SELF - 1, 5)), HvStatus::INVALID_VP_INDEX);
}

#[test]
fn rule9_a_partition_not_active_is_invalid_partition_state() {
    let mut w = World::new();
    w.guest.set_active(false);
    assert_eq!(w.map(w.own_vp(0, 5)), HvStatus::INVALID_PARTITION_STATE);
    w.guest.set_active(true);
    assert_eq!(w.map(w.own_vp(0, 5)), HvStatus::SUCCESS);
}

#[test]
fn rule10_mapping_an_object_twice_is_operation_denied() {
    let mut w = World::new();
    assert_eq!(w.map(w.own_vp(0, 5)), HvStatus::SUCCESS);
    assert_eq!(w.map(w.own_vp(0, 6)), HvStatus::OPERATION_DENIED);
    assert_eq!(w.overlays.map_calls, 1);
}

#[test]
fn rule11_a_used_up_quota_is_insufficient_memory_and_an_unmap_frees_a_slot() {
    let mut w = World::new();
    w.guest.set_stats_page_quota(2);
    let part = map_block(
        StatsObjectType::PARTITION,
        StatsObjectIdentity::partition(w.guest.id(), StatsAreaType::SELF),
        7,
    );
    assert_eq!(w.map(w.own_vp(0, 5)), HvStatus::SUCCESS);
    // Beyond the GPA space still takes a slot.
    assert_eq!(w.map(w.own_vp(1, GPA_SPACE_PAGES + 1)), HvStatus::SUCCESS);
    assert_eq!(w.map(part), HvStatus::INSUFFICIENT_MEMORY);
    let id = StatsObjectIdentity::vp(w.guest.id(), 0, StatsAreaType::SELF);
    assert_eq!(w.unmap(StatsObjectType::VP, id), HvStatus::SUCCESS);
    assert_eq!(w.map(part), HvStatus::SUCCESS);
}

#[test]
fn the_default_quota_is_64_pages() {
    let w = World::new();
    assert_eq!(w.guest.gpa_space().mappings().quota(), 64);
}

#[test]
fn unmapping_an_object_not_mapped_is_invalid_parameter() {
    let mut w = World::new();
    let id = StatsObjectIdentity::vp(w.guest.id(), 1, StatsAreaType::SELF);
    assert_eq!(w.unmap(StatsObjectType::VP, id), HvStatus::INVALID_PARAMETER);
}

#[test]
fn the_root_naming_a_missing_partition_or_lp_gets_invalid_partition_id_or_lp_index() {
    let mut w = World::new();
    for (t, id, want) in [
        (
            StatsObjectType::PARTITION,
            StatsObjectIdentity::partition(999, StatsAreaType::SELF),
            HvStatus::INVALID_PARTITION_ID,
        ),
        (
            StatsObjectType::VP,
            StatsObjectIdentity::vp(999, 0, StatsAreaType::PARENT),
            HvStatus::INVALID_PARTITION_ID,
        ),
        (
            StatsObjectType::PARTITION,
            StatsObjectIdentity::partition(HV_PARTITION_ID_SELF, StatsAreaType::SELF),
            HvStatus::INVALID_PARTITION_ID,
        ),
        (
            StatsObjectType::LOGICAL_PROCESSOR,
            StatsObjectIdentity::logical_processor(2, StatsAreaType::SELF),
            HvStatus::INVALID_LP_INDEX,
        ),
    ] {
        w.put(INPUT_GPA, map_block(t, id, 5).as_bytes());
        assert_eq!(w.root_call(map_input(), INPUT_GPA, 0), want);
    }
}

// ---- The order: a request breaking two rules gets the earlier rule's status ----

#[test]
fn rules_are_checked_in_order() {
    type Setup = fn(&mut World) -> (HypercallInput, u64);
    fn write(w: &mut World, block: MapStatsPageInput) -> u64 {
        w.put(INPUT_GPA, block.as_bytes());
        INPUT_GPA
    }
    let cases: [(&str, Setup, HvStatus); 10] = [
        (
            "1 alignment before 2 reserved bits",
            |w| {
                let b = w.own_vp(0, 5);
                write(w, b);
                (HypercallInput(map_input().0 | 1 << 60), INPUT_GPA + 4)
            },
            HvStatus::INVALID_ALIGNMENT,
        ),
        (
            "2 rep count before 3 unknown code",
            |_| (HypercallInput::simple(HypercallCode(0x0999)).with_rep_count(3), INPUT_GPA),
            HvStatus::INVALID_HYPERCALL_INPUT,
        ),
        (
            "3 unknown code before 4 a malformed block",
            |w| {
                let mut b = w.own_vp(0, 5);
                b.padding = 7;
                (HypercallInput::simple(HypercallCode(0x0999)), write(w, b))
            },
            HvStatus::INVALID_HYPERCALL_CODE,
        ),
        (
            "4 padding before 5 no AccessStats",
            |w| {
                w.privileges = PartitionPrivileges(0);
                let mut b = w.own_vp(0, 5);
                b.padding = 7;
                (map_input(), write(w, b))
            },
            HvStatus::INVALID_PARAMETER,
        ),
        (
            "4 area INTERNAL before 7 another partition",
            |w| {
                let id = StatsObjectIdentity::partition(w.other.id(), StatsAreaType::INTERNAL);
                (map_input(), write(w, map_block(StatsObjectType::PARTITION, id, 5)))
            },
            HvStatus::INVALID_PARAMETER,
        ),
        (
            "5/6/7 access before 8 VP index",
            |w| {
                let id = StatsObjectIdentity::vp(w.other.id(), 50, StatsAreaType::SELF);
                (map_input(), write(w, map_block(StatsObjectType::VP, id, 5)))
            },
            HvStatus::ACCESS_DENIED,
        ),
        (
            "7 another (inactive) partition before 9 partition state",
            |w| {
                w.other.set_active(false);
                let id = StatsObjectIdentity::partition(w.other.id(), StatsAreaType::SELF);
                (map_input(), write(w, map_block(StatsObjectType::PARTITION, id, 5)))
            },
            HvStatus::ACCESS_DENIED,
        ),
        (
            "8 VP index before 9 partition state",
            |w| {
                w.guest.set_active(false);
                let b = w.own_vp(9, 5);
                (map_input(), write(w, b))
            },
            HvStatus::INVALID_VP_INDEX,
        ),
        (
            "9 partition state before 10 already mapped",
            |w| {
                let b = w.own_vp(0, 5);
                assert_eq!(w.map(b), HvStatus::SUCCESS);
                w.guest.set_active(false);
                (map_input(), write(w, b))
            },
            HvStatus::INVALID_PARTITION_STATE,
        ),
        (
            "10 already mapped before 11 quota",
            |w| {
                w.guest.set_stats_page_quota(1);
                let b = w.own_vp(0, 5);
                assert_eq!(w.map(b), HvStatus::SUCCESS);
                (map_input(), write(w, b))
            },
            HvStatus::OPERATION_DENIED,
        ),
    ];
    for (what, setup, want) in cases {
        let mut w = World::new();
        let (input, gpa) = setup(&mut w);
        assert_eq!(w.call(input, gpa, 0), want, "{what}");
    }
}
