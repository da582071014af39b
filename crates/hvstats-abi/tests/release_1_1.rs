//! Seed 004 compatibility of the VP page's release group past 1.0 (1.1, then 1.2): a reader
//! compiled for 1.0 (which knows neither the appended counters nor hvstats' own group) reads a page
//! of this build unchanged, and this build's reader reads a 1.0 page, the appended counters absent
//! from it.

use hvstats_abi::catalog::{APPENDED, CATALOG, GroupKind, Presentation, vp};
use hvstats_abi::group::{GroupType, GroupVersion};
use hvstats_abi::histogram::{HISTOGRAM_SLOTS, Log2Histogram};
use hvstats_abi::page::{PageBuilder, PageLayout, PageView, StatsPage};
use hvstats_abi::{Counter, ObjectKind};
use zerocopy::IntoBytes;

const V1_0: GroupVersion = GroupVersion::V1_0;

/// What the reader of the previous release was compiled for: the two TLFS groups at 1.0.
const READER_1_0: &[(GroupKind, GroupVersion)] =
    &[(GroupKind::Architectural, V1_0), (GroupKind::Release, V1_0)];

/// A distinct value for every slot of every VP counter.
fn value_of(c: &Counter, slot: usize) -> u64 {
    0x1000 * (c.id.group as u64 + 1) + 0x10 * u64::from(c.id.index) + slot as u64
}

fn vp_rows() -> impl Iterator<Item = &'static Counter> {
    CATALOG.iter().filter(|c| c.id.kind == ObjectKind::Vp)
}

fn is_1_0(c: &Counter) -> bool {
    c.id.group != GroupKind::Hvstats
        && !APPENDED
            .iter()
            .any(|a| a.kind == c.id.kind && a.group == c.id.group && c.id.index >= a.first_index)
}

/// A 1.1 page as this build writes it, every slot of every counter set.
fn page_1_1() -> StatsPage {
    let mut page = StatsPage::new(ObjectKind::Vp);
    for c in vp_rows() {
        for s in 0..c.slots() {
            page.data[c.id.slot() + s] = value_of(c, s);
        }
    }
    page
}

#[test]
fn a_reader_compiled_for_1_0_reads_a_1_1_page_unchanged() {
    let page = page_1_1();
    let old = PageView::read_compiled_for(page.as_bytes(), ObjectKind::Vp, READER_1_0).unwrap();
    // The same counters as the previous release wrote them: 2 architectural, 63 release, no
    // hvstats group; read by the same old reader.
    let mut b = PageBuilder::new();
    let arch: Vec<u64> =
        vp_rows().filter(|c| c.id.group == GroupKind::Architectural).map(|c| value_of(c, 0)).collect();
    let release: Vec<u64> =
        vp_rows().filter(|c| c.id.group == GroupKind::Release && is_1_0(c)).map(|c| value_of(c, 0)).collect();
    assert_eq!((arch.len(), release.len()), (2, 63));
    b.group(GroupType::ARCHITECTURAL, V1_0, &arch).unwrap();
    b.group(GroupType::RELEASE, V1_0, &release).unwrap();
    let written_1_0 = b.finish();
    let old_on_old = PageView::read_compiled_for(written_1_0.as_bytes(), ObjectKind::Vp, READER_1_0).unwrap();

    for c in vp_rows().filter(|c| is_1_0(c)) {
        assert_eq!(old.get(c.id), value_of(c, 0), "{}", c.name);
        assert_eq!(old.get(c.id), old_on_old.get(c.id), "{}", c.name);
        // At the very byte offset the 1.0 layout gave it: groups keep their place.
        let offset_1_0 = match c.id.group {
            GroupKind::Architectural => 8 * c.id.index as usize,
            _ => 24 + 8 * c.id.index as usize,
        };
        assert_eq!(c.id.offset(), offset_1_0, "{}", c.name);
    }
    // The old reader sees the appended counters (2 in 1.1, 2 in 1.2) only as "more from a newer
    // minor", and hvstats' group as an unknown type it skipped by its Length.
    assert_eq!(old.version(GroupKind::Release), Some(GroupVersion { major: 1, minor: 2 }));
    assert_eq!(old.extra_counters(GroupKind::Release), 4);
    assert_eq!(old.get(vp::NESTED_PAGE_FAULT_INTERCEPTS), 0);
    assert_eq!(old.get(vp::CPU_WAIT_TIME_PER_DISPATCH), 0);
    assert_eq!(old.histogram(vp::IO_TIME_HISTOGRAM), None);
    let skipped: Vec<_> = old.unknown_groups().map(|g| (g.header.group_type, g.len())).collect();
    assert_eq!(skipped, [(GroupType::HVSTATS, 1 + 8 * HISTOGRAM_SLOTS + 2 + 1 + 1 + 1)]);
}

#[test]
fn the_current_reader_reads_every_counter_and_histogram_of_a_1_1_page() {
    let page = page_1_1();
    let view = PageView::read(page.as_bytes(), ObjectKind::Vp).unwrap();
    assert_eq!(view.extra_counters(GroupKind::Release), 0);
    assert_eq!(view.unknown_groups().count(), 0);
    for c in vp_rows() {
        assert_eq!(view.get(c.id), value_of(c, 0), "{}", c.name);
        if c.presentation == Presentation::Histogram {
            let h = view.histogram(c.id).unwrap();
            let expected: Vec<u64> = (0..HISTOGRAM_SLOTS).map(|s| value_of(c, s)).collect();
            assert_eq!(h, Log2Histogram::from_slots(&expected).unwrap(), "{}", c.name);
        } else {
            assert!(c.slots() == 1, "{}", c.name);
        }
    }
    assert_eq!(view.get(vp::DISPATCHES), value_of(vp::DISPATCHES.counter().unwrap(), 0));
}

#[test]
fn a_1_0_page_is_read_by_the_1_1_reader_with_the_appended_counters_absent() {
    // An older hypervisor's VP page, written by the page writer set to 1.0: the 63 release
    // counters of seed 001, no appended ones, no hvstats group.
    let layout = PageLayout::written_at(ObjectKind::Vp, READER_1_0);
    assert_eq!(layout.counters(GroupKind::Release), 63);
    assert_eq!(layout.group_offset(GroupKind::Hvstats), None);
    let mut page = layout.page();
    for c in vp_rows() {
        if let Some(slot) = layout.slot_of(c.id) {
            page.data[slot] = value_of(c, 0);
        }
    }
    let view = PageView::read(page.as_bytes(), ObjectKind::Vp).unwrap();
    assert_eq!(view.version(GroupKind::Release), Some(V1_0));
    assert_eq!(view.extra_counters(GroupKind::Release), 0);
    assert_eq!(view.absent_counters(GroupKind::Release), 4);
    assert_eq!(view.absent_counters(GroupKind::Architectural), 0);
    for c in vp_rows() {
        if is_1_0(c) {
            assert_eq!(c.id.introduced_in(), 0, "{}", c.name);
            assert_eq!(view.value(c.id), Some(value_of(c, 0)), "{}", c.name);
        } else {
            // Appended in 1.1, or of hvstats' group, which the page does not have: absent, not 0.
            assert_eq!(view.value(c.id), None, "{}", c.name);
            assert!(!view.carries(c.id), "{}", c.name);
            assert_eq!(view.histogram(c.id), None, "{}", c.name);
        }
    }
    assert_eq!(vp::DISPATCHES.introduced_in(), 1);
    assert_eq!(vp::CPU_WAIT_TIME_PER_DISPATCH.introduced_in(), 1);
    assert_eq!(vp::NESTED_PAGE_FAULT_INTERCEPTS_COST.introduced_in(), 2);
    // The older reader reads the same page the same way, the appended counters unknown to it.
    let old = PageView::read_compiled_for(page.as_bytes(), ObjectKind::Vp, READER_1_0).unwrap();
    assert_eq!(old.value(vp::HYPERCALLS), view.value(vp::HYPERCALLS));
    assert_eq!(old.absent_counters(GroupKind::Release), 0);
    assert_eq!(hvstats_abi::page::infer_kind(page.as_bytes()), Some(ObjectKind::Vp));
}

#[test]
fn a_1_0_group_too_short_for_its_own_63_counters_is_refused() {
    let mut b = PageBuilder::new();
    b.group(GroupType::ARCHITECTURAL, V1_0, &[1, 2]).unwrap();
    b.group(GroupType::RELEASE, V1_0, &[3; 62]).unwrap();
    let page = b.finish();
    assert_eq!(
        PageView::read(page.as_bytes(), ObjectKind::Vp).unwrap_err(),
        hvstats_abi::PageError::GroupTooShort {
            offset: 24,
            group: GroupType::RELEASE,
            length: 62 * 8,
            needed: 63 * 8
        }
    );
}
