//! The catalog against seed 001: counts per object and group, names, and the derived layout.

use hvstats_abi::ObjectKind;
use hvstats_abi::catalog::{self, CATALOG, GroupKind, Presentation, counters_of, vp};
use hvstats_abi::page::PageLayout;

/// True for a row of seed 001 (not appended in a later minor, not in hvstats' own group).
fn of_seed_001(c: &catalog::Counter) -> bool {
    let appended = catalog::APPENDED
        .iter()
        .any(|a| a.kind == c.id.kind && a.group == c.id.group && c.id.index >= a.first_index);
    !appended && c.id.group != GroupKind::Hvstats
}

#[test]
fn catalog_has_the_96_counters_of_seed_001() {
    let count = |k, g| hvstats_abi::page::group_counters(k, g);
    assert_eq!(CATALOG.iter().filter(|c| of_seed_001(c)).count(), 96);
    // Release 1.1 of the VP page appends 2, its 1.2 2 more; hvstats' group holds the sequence and
    // 8 histograms, its 1.1 the host's page faults (2), its 1.2 the VP's exits of every reason (1),
    // its 1.3 the failed hypercalls (1), its 1.4 the time of the counts' publication (1);
    // the partition page's hvstats group says which source of an observed VM gave what (6 sources
    // of 3 rows, 3 + 8 rows of writers), in its 1.1 the VM's run state (1), in its 1.2 sources
    // 7 to 15 (9 sources of 3 rows), in its 1.3 from when its counters count (2), in its 1.4 from
    // when the counts kept across observers count (1); the hypervisor page's the observer's
    // health (5), in its 1.1 the VMs refused by reason (one row per reason of the refusal table).
    let reasons = hvstats_abi::refusal::Refusal::ALL.len();
    assert_eq!(CATALOG.len(), 96 + 2 + 2 + 9 + 2 + 1 + 1 + 1 + 29 + 1 + 27 + 2 + 1 + 5 + reasons);
    assert_eq!(count(ObjectKind::Partition, GroupKind::Hvstats), 60);
    assert_eq!(catalog::counters_at(ObjectKind::Partition, GroupKind::Hvstats, 0), 29);
    assert_eq!(catalog::counters_at(ObjectKind::Partition, GroupKind::Hvstats, 1), 30);
    assert_eq!(catalog::counters_at(ObjectKind::Partition, GroupKind::Hvstats, 2), 57);
    assert_eq!(catalog::counters_at(ObjectKind::Partition, GroupKind::Hvstats, 3), 59);
    assert_eq!(catalog::partition::COUNTING_SINCE.introduced_in(), 3);
    assert_eq!(catalog::counters_at(ObjectKind::Partition, GroupKind::Hvstats, 4), 60);
    assert_eq!(catalog::partition::KEPT_SINCE.introduced_in(), 4);
    assert_eq!(count(ObjectKind::Hypervisor, GroupKind::Hvstats), 5 + reasons);
    assert_eq!(catalog::counters_at(ObjectKind::Hypervisor, GroupKind::Hvstats, 0), 5);
    assert_eq!(count(ObjectKind::Hypervisor, GroupKind::Architectural), 5);
    assert_eq!(count(ObjectKind::LogicalProcessor, GroupKind::Architectural), 18);
    assert_eq!(count(ObjectKind::Partition, GroupKind::Architectural), 1);
    assert_eq!(count(ObjectKind::Partition, GroupKind::Release), 7);
    assert_eq!(count(ObjectKind::Vp, GroupKind::Architectural), 2);
    assert_eq!(count(ObjectKind::Vp, GroupKind::Release), 67);
    assert_eq!(catalog::counters_at(ObjectKind::Vp, GroupKind::Release, 0), 63);
    assert_eq!(catalog::counters_at(ObjectKind::Vp, GroupKind::Release, 1), 65);
    assert_eq!(catalog::counters_at(ObjectKind::Vp, GroupKind::Release, 2), 67);
    assert_eq!(vp::NESTED_PAGE_FAULT_INTERCEPTS.introduced_in(), 2);
    assert_eq!(count(ObjectKind::Vp, GroupKind::Hvstats), 1 + 8 * 33 + 2 + 1 + 1 + 1);
    assert_eq!(catalog::counters_at(ObjectKind::Vp, GroupKind::Hvstats, 0), 1 + 8 * 33);
    assert_eq!(catalog::counters_at(ObjectKind::Vp, GroupKind::Hvstats, 1), 1 + 8 * 33 + 2);
    assert_eq!(vp::HOST_PAGE_FAULTS.introduced_in(), 1);
    assert_eq!(vp::EXITS.introduced_in(), 2);
    assert_eq!(catalog::counters_at(ObjectKind::Vp, GroupKind::Hvstats, 2), 1 + 8 * 33 + 2 + 1);
    assert_eq!(vp::FAILED_HYPERCALLS.introduced_in(), 3);
    assert_eq!(catalog::counters_at(ObjectKind::Vp, GroupKind::Hvstats, 3), 1 + 8 * 33 + 2 + 1 + 1);
    for kind in ObjectKind::ALL {
        for group in GroupKind::ALL {
            let n = count(kind, group);
            let mut rows: Vec<_> = counters_of(kind).filter(|c| c.id.group == group).collect();
            rows.sort_by_key(|c| c.id.index);
            // Each row's slots start where the previous row's end: the group is tiled, no gaps.
            let mut next = 1;
            for c in rows {
                assert_eq!(c.id.index as usize, next, "{kind:?} {group:?} dense at {}", c.name);
                next += c.slots();
            }
            assert_eq!(next, n + 1, "{kind:?} {group:?}");
        }
    }
}

#[test]
fn vp_page_layout_matches_the_counter_ids_of_the_tlfs() {
    let layout = PageLayout::of(ObjectKind::Vp);
    assert_eq!(layout.group_offset(GroupKind::Architectural), Some(0));
    assert_eq!(layout.group_offset(GroupKind::Release), Some(24));
    assert_eq!(layout.group_offset(GroupKind::Hvstats), Some(24 + 8 + 67 * 8));
    assert_eq!(layout.end_offset, 24 + 8 + 67 * 8 + 8 + 270 * 8);
    // Seed 001 gives the architectural VP group 2 counters, so the release-specific header is
    // slot 3 and its first counter slot 4.
    assert_eq!(vp::TOTAL_RUN_TIME.slot(), 1);
    assert_eq!(vp::HYPERVISOR_RUN_TIME.slot(), 2);
    assert_eq!(vp::HYPERCALLS.slot(), 4);
    assert_eq!(vp::VIRTUAL_PROCESSOR_HYPERCALLS.slot(), 66);
    // Release 1.1 appends after the last counter of 1.0.
    assert_eq!(vp::DISPATCHES.slot(), 67);
    assert_eq!(vp::CPU_WAIT_TIME_PER_DISPATCH.slot(), 68);
    // And 1.2 after 1.1's.
    assert_eq!(vp::NESTED_PAGE_FAULT_INTERCEPTS.slot(), 69);
    assert_eq!(vp::NESTED_PAGE_FAULT_INTERCEPTS_COST.slot(), 70);
    assert_eq!(vp::SEQUENCE.slot(), 72);
    // hvstats 1.4 appends the publication time after every histogram and count before it.
    assert_eq!(vp::PUBLISHED.slot(), 72 + 269);
    assert_eq!(vp::PUBLISHED.introduced_in(), 4);
}

#[test]
fn every_cost_counter_follows_its_count() {
    for c in CATALOG.iter().filter(|c| c.presentation == Presentation::Cost) {
        let pair = c.paired_count().expect("cost has a count");
        assert_eq!(pair.presentation, Presentation::Rate, "{}", c.name);
        if pair.name == "Dispatches/sec" {
            // perfmon's own name for the average over its count.
            assert_eq!(c.name, "CPU wait time per dispatch");
            continue;
        }
        assert!(c.name.ends_with(" cost") && pair.name.ends_with("/sec"), "{}", c.name);
        assert_eq!(c.name.trim_end_matches(" cost"), pair.name.trim_end_matches("/sec"));
    }
}

#[test]
fn names_are_unique_per_kind_and_find_their_row() {
    for kind in ObjectKind::ALL {
        let mut names: Vec<&str> = counters_of(kind).map(|c| c.name).collect();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n, "{kind:?} names are JSON keys and must be unique");
    }
    for c in CATALOG {
        assert_eq!(catalog::counter_by_name(c.id.kind, c.name), Some(c));
        assert_eq!(c.id.counter(), Some(c));
        assert!(!c.description.is_empty() && !c.maintained.note().is_empty(), "{}", c.name);
    }
    assert_eq!(catalog::counter_by_name(ObjectKind::Vp, "Logical processors"), None);
    let foreign = catalog::CounterId { kind: ObjectKind::Hypervisor, group: GroupKind::Release, index: 1 };
    assert_eq!(foreign.counter(), None);
}

#[test]
fn presentation_agrees_with_the_seed_name() {
    for c in CATALOG {
        if c.name.ends_with("/sec") {
            assert_eq!(c.presentation, Presentation::Rate, "{}", c.name);
            assert_eq!(c.unit, catalog::Unit::Count, "{}", c.name);
        }
        if c.name.starts_with("% ") {
            assert_eq!(c.presentation, Presentation::PercentTime, "{}", c.name);
        }
        // "Monitor transition cost" is a hardware cost in cycles, not averaged over a count.
        if c.name.ends_with(" cost") && c.name != "Monitor transition cost" {
            assert_eq!(c.presentation, Presentation::Cost, "{}", c.name);
        }
    }
}

#[test]
fn well_known_constants_name_their_seed_rows() {
    use catalog::{hypervisor, lp, partition};
    assert_eq!(hypervisor::LOGICAL_PROCESSORS.counter().unwrap().name, "Logical processors");
    assert_eq!(lp::C3_TIME.counter().unwrap().name, "% C3 time");
    assert_eq!(lp::C3_TIME.index, 18);
    assert_eq!(
        partition::RECOMMENDED_VIRTUAL_TLB_SIZE.counter().unwrap().name,
        "Recommended virtual TLB size"
    );
    assert_eq!(vp::CPUID_INSTRUCTIONS.counter().unwrap().name, "CPUID instructions/sec");
    assert_eq!(vp::CPUID_INSTRUCTIONS.index, 13);
    assert_eq!(vp::VIRTUAL_PROCESSOR_HYPERCALLS.index, 63);
}
