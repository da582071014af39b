//! The catalog against seed 001: counts per object and group, names, and the derived layout.

use hvstats_abi::ObjectKind;
use hvstats_abi::catalog::{self, CATALOG, GroupKind, Presentation, counters_of, vp};
use hvstats_abi::page::PageLayout;

#[test]
fn catalog_has_the_96_counters_of_seed_001() {
    assert_eq!(CATALOG.len(), 96);
    let count = |k, g| catalog::group_counters(k, g);
    assert_eq!(count(ObjectKind::Hypervisor, GroupKind::Architectural), 5);
    assert_eq!(count(ObjectKind::LogicalProcessor, GroupKind::Architectural), 18);
    assert_eq!(count(ObjectKind::Partition, GroupKind::Architectural), 1);
    assert_eq!(count(ObjectKind::Partition, GroupKind::Release), 7);
    assert_eq!(count(ObjectKind::Vp, GroupKind::Architectural), 2);
    assert_eq!(count(ObjectKind::Vp, GroupKind::Release), 63);
    for kind in ObjectKind::ALL {
        for group in GroupKind::ALL {
            let n = count(kind, group);
            let mut indices: Vec<u16> =
                counters_of(kind).filter(|c| c.id.group == group).map(|c| c.id.index).collect();
            indices.sort();
            assert_eq!(indices, (1..=n as u16).collect::<Vec<_>>(), "{kind:?} {group:?} dense");
        }
    }
}

#[test]
fn vp_page_layout_matches_the_counter_ids_of_the_tlfs() {
    let layout = PageLayout::of(ObjectKind::Vp);
    assert_eq!(layout.group_offset(GroupKind::Architectural), Some(0));
    assert_eq!(layout.group_offset(GroupKind::Release), Some(24));
    assert_eq!(layout.end_offset, 24 + 8 + 63 * 8);
    // Linux mshv ids: HypercallsCount 7? (modern) — WDK: VPV starts at slot 4.
    assert_eq!(vp::TOTAL_RUN_TIME.slot(), 1);
    assert_eq!(vp::HYPERVISOR_RUN_TIME.slot(), 2);
    assert_eq!(vp::HYPERCALLS.slot(), 4);
    assert_eq!(vp::VIRTUAL_PROCESSOR_HYPERCALLS.slot(), 66);
}

#[test]
fn every_cost_counter_follows_its_count() {
    for c in CATALOG.iter().filter(|c| c.presentation == Presentation::Cost) {
        let pair = c.paired_count().expect("cost has a count");
        assert_eq!(pair.presentation, Presentation::Rate, "{}", c.name);
        assert!(c.name.ends_with(" cost") && pair.name.ends_with("/sec"), "{}", c.name);
        assert_eq!(c.name.trim_end_matches(" cost"), pair.name.trim_end_matches("/sec"));
    }
}
