//! The page writer and reader: round trips, seed 004's version rules, unknown groups, and every
//! error the reader (and the builder) can give, each from a page crafted to produce it.

use hvstats_abi::catalog::{self, counters_of};
use hvstats_abi::group::{GroupHeader, GroupType, GroupVersion, MAX_COUNTERS_PER_GROUP, PAGE_SIZE};
use hvstats_abi::page::{
    GroupWalk, ListEnd, PageBuilder, PageError, PageLayout, PageView, StatsPage, infer_kind,
};
use hvstats_abi::refusal::Refusal;
use hvstats_abi::{GroupKind, ObjectKind};
use proptest::prelude::*;
use zerocopy::IntoBytes;

const V1_0: GroupVersion = GroupVersion::V1_0;
const V1_1: GroupVersion = GroupVersion { major: 1, minor: 1 };

fn kind_strategy() -> impl Strategy<Value = ObjectKind> {
    prop::sample::select(ObjectKind::ALL.to_vec())
}

/// The values of `kind`'s groups in a page written for `kind`, in group order.
fn group_values(kind: ObjectKind, group: GroupKind, f: impl Fn(u16) -> u64) -> Vec<u64> {
    (1..=hvstats_abi::page::group_counters(kind, group) as u16).map(f).collect()
}

/// Writes the header at `offset` of a page's bytes.
fn put_header(bytes: &mut [u8], offset: usize, header: GroupHeader) {
    bytes[offset..offset + 8].copy_from_slice(header.as_bytes());
}

#[test]
fn layouts_put_groups_back_to_back_and_end_the_list() {
    // (kind, architectural, release, hvstats' own group, END_OF_LIST)
    let expect = [
        // Hypervisor: 5 counters, then hvstats' own group (the observer's health, 5; in its 1.1
        // the VMs refused by reason, one row per reason).
        (ObjectKind::Hypervisor, Some(0), None, Some(48), 48 + 8 + (5 + Refusal::ALL.len()) * 8),
        (ObjectKind::LogicalProcessor, Some(0), None, None, 152),
        // Partition: then hvstats' own group (which source of an observed VM gave what, 29 rows;
        // in its 1.1 the VM's run state; in its 1.2 the rows of sources 7 to 15, 27; in its 1.3
        // from when its counters count, 2; in its 1.4 from when the counts kept across observers
        // count, 1).
        (ObjectKind::Partition, Some(0), Some(16), Some(80), 80 + 8 + 60 * 8),
        // VP: release 1.2 (67 counters), then hvstats' own group (sequence, 8 histograms, 2
        // fault counts, the exits, the failed hypercalls and the time of the counts' publication).
        (ObjectKind::Vp, Some(0), Some(24), Some(568), 568 + 8 + 270 * 8),
    ];
    for (kind, arch, release, own, end) in expect {
        let layout = PageLayout::of(kind);
        assert_eq!(layout.group_offset(GroupKind::Architectural), arch, "{kind:?}");
        assert_eq!(layout.group_offset(GroupKind::Release), release, "{kind:?}");
        assert_eq!(layout.group_offset(GroupKind::Hvstats), own, "{kind:?}");
        assert_eq!(layout.end_offset, end, "{kind:?}");
        let page = StatsPage::new(kind);
        let view = PageView::read(page.as_bytes(), kind).unwrap();
        assert_eq!(view.end, ListEnd::EndOfList(end));
        for group in GroupKind::ALL {
            let present = layout.group_offset(group).is_some();
            assert_eq!(view.version(group), present.then_some(group.version(kind)), "{kind:?} {group:?}");
        }
        // Exactly the headers and END_OF_LIST are written; every value is zero.
        let headers: Vec<usize> = layout.slots().map(|s| s.header_offset / 8).chain([end / 8]).collect();
        for (slot, &word) in page.data.iter().enumerate() {
            if !headers.contains(&slot) {
                assert_eq!(word, 0, "{kind:?} slot {slot}");
            }
        }
    }
}

#[test]
fn counter_offsets_follow_the_group_header() {
    use catalog::{hypervisor, lp, partition, vp};
    assert_eq!(hypervisor::LOGICAL_PROCESSORS.offset(), 8);
    assert_eq!(hypervisor::MONITORED_NOTIFICATIONS.offset(), 40);
    assert_eq!(lp::GLOBAL_TIME.offset(), 8);
    assert_eq!(lp::C3_TIME.offset(), 144);
    assert_eq!(partition::VIRTUAL_PROCESSORS.offset(), 8);
    assert_eq!(partition::VIRTUAL_TLB_PAGES.offset(), 24);
    assert_eq!(partition::RECOMMENDED_VIRTUAL_TLB_SIZE.offset(), 72);
    assert_eq!(vp::HYPERVISOR_RUN_TIME.offset(), 16);
    assert_eq!(vp::HYPERCALLS.offset(), 32);
    assert_eq!(vp::CPUID_INSTRUCTIONS.offset(), 32 + 12 * 8);
    assert_eq!(vp::VIRTUAL_PROCESSOR_HYPERCALLS.offset(), 528);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random values in every counter of a kind, written with `StatsPage::set`, read back by name.
    #[test]
    fn stats_page_values_round_trip(kind in kind_strategy(), seed in any::<u64>()) {
        let mut page = StatsPage::new(kind);
        let value = |i: usize| seed.rotate_left(i as u32 * 7) ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for (i, c) in counters_of(kind).enumerate() {
            page.set(c.id, value(i));
        }
        let view = PageView::read(page.as_bytes(), kind).unwrap();
        for (i, c) in counters_of(kind).enumerate() {
            prop_assert_eq!(view.get(c.id), value(i), "{}", c.name);
            prop_assert_eq!(page.get(c.id), value(i));
            prop_assert_eq!(page.data[c.id.slot()], value(i));
        }
        for group in GroupKind::ALL {
            prop_assert_eq!(view.extra_counters(group), 0);
        }
        prop_assert_eq!(view.unknown_groups().count(), 0);
        prop_assert_eq!(infer_kind(page.as_bytes()), Some(kind));
    }

    /// Values written through `PageLayout` offsets land where `PageView` finds them.
    #[test]
    fn layout_offsets_round_trip(kind in kind_strategy(), values in prop::collection::vec(any::<u64>(), 65)) {
        let layout = PageLayout::of(kind);
        let mut data = [0u64; 512];
        layout.write_headers(&mut data);
        for (c, &v) in counters_of(kind).zip(&values) {
            let group = layout.group_offset(c.id.group).unwrap();
            data[(group + c.id.index as usize * 8) / 8] = v;
        }
        let view = PageView::read(data.as_bytes(), kind).unwrap();
        for (c, &v) in counters_of(kind).zip(&values) {
            prop_assert_eq!(view.get(c.id), v, "{}", c.name);
        }
    }

    /// Arbitrary group lists written by `PageBuilder` come back from `GroupWalk` unchanged.
    #[test]
    fn builder_group_lists_round_trip(
        groups in prop::collection::vec(
            (4u16..0xFFFF, any::<u16>(), any::<u16>(), prop::collection::vec(any::<u64>(), 0..40)),
            0..12,
        )
    ) {
        let mut builder = PageBuilder::new();
        let mut written = Vec::new();
        let mut used = 8; // END_OF_LIST
        for (t, major, minor, values) in &groups {
            let version = GroupVersion { major: *major, minor: *minor };
            let needed = (1 + values.len()) * 8;
            let result = builder.group(GroupType(*t), version, values).map(|_| ());
            if used + needed <= PAGE_SIZE {
                prop_assert!(result.is_ok());
                written.push((GroupType(*t), version, values.clone()));
                used += needed;
            } else {
                prop_assert_eq!(result, Err(PageError::PageFull { offset: used - 8, needed }));
            }
        }
        let page = builder.finish();
        let mut walk = GroupWalk::new(page.as_bytes()).unwrap();
        let mut offset = 0;
        for (t, version, values) in &written {
            let g = walk.next().unwrap().unwrap();
            prop_assert_eq!(g.offset, offset);
            prop_assert_eq!(g.header.group_type, *t);
            prop_assert_eq!(g.header.version(), *version);
            prop_assert_eq!(g.len(), values.len());
            for (i, v) in values.iter().enumerate() {
                prop_assert_eq!(g.value(i as u16 + 1), Some(*v));
            }
            prop_assert_eq!(g.value(0), None);
            prop_assert_eq!(g.value(values.len() as u16 + 1), None);
            offset += 8 + values.len() * 8;
        }
        prop_assert!(walk.next().is_none());
        prop_assert_eq!(walk.end(), Some(ListEnd::EndOfList(offset)));
    }

    /// Pages of each kind built group by group (any order of known and unknown groups, newer
    /// minors with extra counters) read back with the right values.
    #[test]
    fn built_pages_of_newer_minors_read_back(
        kind in kind_strategy(),
        extra in (0usize..20, 0usize..20),
        minor in (0u16..5, 0u16..5),
        unknown_first in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let value = |g: GroupKind, i: u16| seed ^ ((g as u64) << 56) ^ u64::from(i);
        let mut builder = PageBuilder::new();
        if unknown_first {
            builder.group(GroupType(7), GroupVersion { major: 9, minor: 9 }, &[1, 2, 3]).unwrap();
        }
        let layout = PageLayout::of(kind);
        let mut extras = [0; GroupKind::ALL.len()];
        for slot in layout.slots() {
            let (e, m) = if slot.group == GroupKind::Architectural { (extra.0, minor.0) } else { (extra.1, minor.1) };
            let m = slot.version.minor + m;
            extras[slot.group as usize] = e;
            let values: Vec<u64> = (1..=(slot.counters + e) as u16).map(|i| value(slot.group, i)).collect();
            builder.group(slot.group.group_type(), GroupVersion { major: 1, minor: m }, &values).unwrap();
        }
        if !unknown_first {
            builder.group(GroupType::INTERNAL, V1_0, &[4; 5]).unwrap();
        }
        let page = builder.finish();
        let view = PageView::read(page.as_bytes(), kind).unwrap();
        for c in counters_of(kind) {
            prop_assert_eq!(view.get(c.id), value(c.id.group, c.id.index), "{}", c.name);
        }
        for group in GroupKind::ALL {
            prop_assert_eq!(view.extra_counters(group), extras[group as usize]);
        }
        prop_assert_eq!(view.unknown_groups().count(), 1);
    }
}

#[test]
fn a_newer_minor_with_extra_counters_is_read_by_the_current_reader() {
    let kind = ObjectKind::Vp;
    let arch: Vec<u64> = group_values(kind, GroupKind::Architectural, |i| 100 + u64::from(i));
    let mut release: Vec<u64> = group_values(kind, GroupKind::Release, |i| 1000 + u64::from(i));
    release.extend([0xAAAA, 0xBBBB, 0xCCCC]);
    // A page without hvstats' own group, as another writer makes it, reads as well.
    let mut b = PageBuilder::new();
    b.group(GroupType::ARCHITECTURAL, V1_0, &arch).unwrap();
    b.group(GroupType::RELEASE, GroupVersion { major: 1, minor: 4 }, &release).unwrap();
    let page = b.finish();
    let view = PageView::read(page.as_bytes(), kind).unwrap();
    assert_eq!(view.get(catalog::vp::TOTAL_RUN_TIME), 101);
    assert_eq!(view.get(catalog::vp::HYPERCALLS), 1001);
    assert_eq!(view.get(catalog::vp::VIRTUAL_PROCESSOR_HYPERCALLS), 1063);
    assert_eq!(view.get(catalog::vp::CPU_WAIT_TIME_PER_DISPATCH), 1065);
    assert_eq!(view.get(catalog::vp::NESTED_PAGE_FAULT_INTERCEPTS_COST), 1067);
    assert_eq!(view.histogram(catalog::vp::IO_TIME_HISTOGRAM), None);
    assert_eq!(view.get(catalog::vp::SEQUENCE), 0);
    assert_eq!(view.version(GroupKind::Release), Some(GroupVersion { major: 1, minor: 4 }));
    assert_eq!(view.extra_counters(GroupKind::Release), 3);
    assert_eq!(view.extra_counters(GroupKind::Architectural), 0);
    assert_eq!(view.end, ListEnd::EndOfList(8 + 16 + 8 + 70 * 8));
    // The newer page is still recognised as a VP page.
    assert_eq!(infer_kind(page.as_bytes()), Some(ObjectKind::Vp));
}

#[test]
fn a_newer_major_is_refused() {
    let mut b = PageBuilder::new();
    b.group(GroupType::ARCHITECTURAL, GroupVersion { major: 2, minor: 0 }, &[1; 5]).unwrap();
    let page = b.finish();
    assert_eq!(
        PageView::read(page.as_bytes(), ObjectKind::Hypervisor).unwrap_err(),
        PageError::MajorMismatch {
            offset: 0,
            group: GroupType::ARCHITECTURAL,
            found: GroupVersion { major: 2, minor: 0 },
            expected: V1_0,
        }
    );
    assert_eq!(infer_kind(page.as_bytes()), None);
}

#[test]
fn an_older_minor_is_read_for_the_counters_it_carries() {
    // This build writes release 1.2 on VP pages; a reader compiled for a 1.3 that appended two
    // more reads them, those two absent, and still reads 1.3 and later whole.
    const V1_2: GroupVersion = GroupVersion { major: 1, minor: 2 };
    const V1_3: GroupVersion = GroupVersion { major: 1, minor: 3 };
    let compiled = &[(GroupKind::Architectural, V1_0), (GroupKind::Release, V1_3)];
    let mut page = StatsPage::new(ObjectKind::Vp);
    page.set(catalog::vp::NESTED_PAGE_FAULT_INTERCEPTS_COST, 67);
    let view = PageView::read_compiled_for(page.as_bytes(), ObjectKind::Vp, compiled).unwrap();
    assert_eq!(view.version(GroupKind::Release), Some(V1_2));
    assert_eq!(view.value(catalog::vp::NESTED_PAGE_FAULT_INTERCEPTS_COST), Some(67));
    assert_eq!(view.extra_counters(GroupKind::Release), 0);
    let mut b = PageBuilder::new();
    b.group(GroupType::ARCHITECTURAL, V1_0, &[1, 2]).unwrap();
    b.group(GroupType::RELEASE, V1_3, &[3; 67]).unwrap();
    let page = b.finish();
    let view = PageView::read_compiled_for(page.as_bytes(), ObjectKind::Vp, compiled).unwrap();
    assert_eq!(view.get(catalog::vp::HYPERCALLS), 3);
    // Major 0 is older still, and refused by its major.
    let mut b = PageBuilder::new();
    b.group(GroupType::ARCHITECTURAL, GroupVersion { major: 0, minor: 0xFFFF }, &[1; 5]).unwrap();
    let page = b.finish();
    assert!(matches!(
        PageView::read(page.as_bytes(), ObjectKind::Hypervisor),
        Err(PageError::MajorMismatch { offset: 0, .. })
    ));
}

#[test]
fn unknown_groups_are_skipped_by_their_length_and_listed() {
    let kind = ObjectKind::Partition;
    let mut b = PageBuilder::new();
    b.group(GroupType(7), GroupVersion { major: 5, minor: 5 }, &[0xDEAD; 4]).unwrap();
    b.group(GroupType::ARCHITECTURAL, V1_0, &[11]).unwrap();
    b.group(GroupType::INTERNAL, V1_0, &[0xBEEF; 2]).unwrap();
    b.group(GroupType::RELEASE, V1_0, &[21, 22, 23, 24, 25, 26, 27]).unwrap();
    b.group(GroupType(0xFFFF), GroupVersion { major: 0xFFFF, minor: 0 }, &[]).unwrap();
    let page = b.finish();
    let view = PageView::read(page.as_bytes(), kind).unwrap();
    assert_eq!(view.get(catalog::partition::VIRTUAL_PROCESSORS), 11);
    assert_eq!(view.get(catalog::partition::VIRTUAL_TLB_PAGES), 21);
    assert_eq!(view.get(catalog::partition::RECOMMENDED_VIRTUAL_TLB_SIZE), 27);
    let unknown: Vec<(usize, u16, u16, usize)> =
        view.unknown_groups().map(|g| (g.offset, g.header.group_type.0, g.header.length, g.len())).collect();
    assert_eq!(unknown, vec![(0, 7, 32, 4), (56, 14, 16, 2), (144, 0xFFFF, 0, 0)]);
    assert_eq!(infer_kind(page.as_bytes()), Some(kind));

    // A known group type the kind does not use is skipped too (a hypervisor page has no
    // release-specific group).
    let mut b = PageBuilder::new();
    b.group(GroupType::ARCHITECTURAL, V1_0, &[1, 2, 3, 4, 5]).unwrap();
    b.group(GroupType::RELEASE, GroupVersion { major: 7, minor: 0 }, &[9]).unwrap();
    let page = b.finish();
    let view = PageView::read(page.as_bytes(), ObjectKind::Hypervisor).unwrap();
    assert_eq!(view.get(catalog::hypervisor::MONITORED_NOTIFICATIONS), 5);
    assert_eq!(view.unknown_groups().map(|g| g.offset).collect::<Vec<_>>(), vec![48]);
}

#[test]
fn end_of_page_ends_the_list() {
    let mut page = StatsPage::new(ObjectKind::Hypervisor);
    let end = PageLayout::of(ObjectKind::Hypervisor).end_offset;
    page.data[end / 8] = 1; // END_OF_PAGE, version 0, length 0
    let view = PageView::read(page.as_bytes(), ObjectKind::Hypervisor).unwrap();
    assert_eq!(view.end, ListEnd::EndOfPage(end));
}

#[test]
fn a_group_filling_the_page_holds_max_counters() {
    let values = vec![7u64; MAX_COUNTERS_PER_GROUP];
    let mut b = PageBuilder::new();
    b.group(GroupType(9), V1_0, &values).unwrap();
    let page = b.finish();
    let g = GroupWalk::new(page.as_bytes()).unwrap().next().unwrap().unwrap();
    assert_eq!(g.len(), 510);
    assert_eq!(g.header.length, 4080);

    let mut b = PageBuilder::new();
    let too_many = vec![7u64; MAX_COUNTERS_PER_GROUP + 1];
    assert_eq!(
        b.group(GroupType(9), V1_0, &too_many).map(|_| ()),
        Err(PageError::PageFull { offset: 0, needed: 4096 })
    );
}

#[test]
fn infer_kind_tells_the_four_pages_apart() {
    for kind in ObjectKind::ALL {
        assert_eq!(infer_kind(StatsPage::new(kind).as_bytes()), Some(kind));
    }
    assert_eq!(infer_kind(StatsPage::default().as_bytes()), None, "an empty list has no groups");
    assert_eq!(infer_kind(&[0u8; 100]), None);
}

/// Each variant of `PageError`, from a page crafted to produce it, with the offset it names.
#[test]
fn every_page_error_comes_from_a_crafted_page() {
    let vp = ObjectKind::Vp;
    let valid = StatsPage::new(vp);
    let release_at = PageLayout::of(vp).group_offset(GroupKind::Release).unwrap();

    // Truncated and Oversized.
    let short = &valid.as_bytes()[..4000];
    assert_eq!(PageView::read(short, vp).unwrap_err(), PageError::Truncated { len: 4000 });
    assert_eq!(PageError::Truncated { len: 4000 }.offset(), Some(4000));
    let mut long = valid.as_bytes().to_vec();
    long.push(0);
    assert_eq!(PageView::read(&long, vp).unwrap_err(), PageError::Oversized { len: 4097 });
    assert_eq!(GroupWalk::new(&long).err(), Some(PageError::Oversized { len: 4097 }));

    // LengthPastPage: a length that runs off the end.
    let mut bytes = valid.as_bytes().to_vec();
    put_header(&mut bytes, release_at, GroupHeader::new(GroupType::RELEASE, V1_0, 4072 + 8));
    let e = PageView::read(&bytes, vp).unwrap_err();
    assert_eq!(e, PageError::LengthPastPage { offset: release_at, length: 4080 });
    assert_eq!(e.offset(), Some(24));

    // LengthMisaligned.
    put_header(&mut bytes, release_at, GroupHeader::new(GroupType::RELEASE, V1_0, 63 * 8 + 3));
    assert_eq!(
        PageView::read(&bytes, vp).unwrap_err(),
        PageError::LengthMisaligned { offset: release_at, length: 507 }
    );

    // NoEndOfList: groups that exactly fill the page with no terminator.
    let mut bytes = vec![0u8; PAGE_SIZE];
    put_header(&mut bytes, 0, GroupHeader::new(GroupType(9), V1_0, 4088));
    assert_eq!(PageView::read(&bytes, vp).unwrap_err(), PageError::NoEndOfList);
    assert_eq!(PageError::NoEndOfList.offset(), Some(PAGE_SIZE));

    // BadTerminator: END_OF_LIST with a version, END_OF_PAGE with a length.
    let end = PageLayout::of(vp).end_offset;
    let mut bytes = valid.as_bytes().to_vec();
    put_header(&mut bytes, end, GroupHeader::new(GroupType::END_OF_LIST, V1_0, 0));
    assert_eq!(PageView::read(&bytes, vp).unwrap_err(), PageError::BadTerminator { offset: end });
    put_header(&mut bytes, end, GroupHeader::new(GroupType::END_OF_PAGE, GroupVersion::ZERO, 8));
    assert_eq!(PageView::read(&bytes, vp).unwrap_err(), PageError::BadTerminator { offset: end });

    // MajorMismatch.
    let mut bytes = valid.as_bytes().to_vec();
    put_header(
        &mut bytes,
        release_at,
        GroupHeader::new(GroupType::RELEASE, GroupVersion { major: 2, minor: 0 }, 504),
    );
    assert!(matches!(
        PageView::read(&bytes, vp).unwrap_err(),
        PageError::MajorMismatch { offset: 24, group: GroupType::RELEASE, .. }
    ));

    // GroupTooShort: the release group (1.1) of a VP page with 64 of its 65 counters.
    let mut bytes = valid.as_bytes().to_vec();
    put_header(&mut bytes, release_at, GroupHeader::new(GroupType::RELEASE, V1_1, 64 * 8));
    bytes[release_at + 8 + 64 * 8..][..8].copy_from_slice(GroupHeader::END_OF_LIST.as_bytes());
    assert_eq!(
        PageView::read(&bytes, vp).unwrap_err(),
        PageError::GroupTooShort { offset: 24, group: GroupType::RELEASE, length: 512, needed: 520 }
    );

    // DuplicateGroup.
    let mut b = PageBuilder::new();
    b.group(GroupType::ARCHITECTURAL, V1_0, &[1; 5]).unwrap();
    b.group(GroupType::ARCHITECTURAL, V1_0, &[2; 5]).unwrap();
    let page = b.finish();
    assert_eq!(
        PageView::read(page.as_bytes(), ObjectKind::Hypervisor).unwrap_err(),
        PageError::DuplicateGroup { offset: 48, group: GroupType::ARCHITECTURAL }
    );

    // MissingGroup: a partition page with no release-specific group.
    let mut b = PageBuilder::new();
    b.group(GroupType::ARCHITECTURAL, V1_0, &[1]).unwrap();
    let page = b.finish();
    let e = PageView::read(page.as_bytes(), ObjectKind::Partition).unwrap_err();
    assert_eq!(e, PageError::MissingGroup { group: GroupType::RELEASE });
    assert_eq!(e.offset(), None);

    // PageFull: the builder refuses a group that leaves no room for END_OF_LIST.
    let mut b = PageBuilder::new();
    b.group(GroupType(9), V1_0, &[0; 500]).unwrap();
    assert_eq!(
        b.group(GroupType(9), V1_0, &[0; 10]).map(|_| ()),
        Err(PageError::PageFull { offset: 4008, needed: 88 })
    );

    // No refusal for an older minor: a page of minor 0 read by a reader compiled for minor 1
    // reads, its group's counters all carried (no counter of these groups came with a minor 1).
    let compiled = &[(GroupKind::Architectural, V1_1), (GroupKind::Release, V1_1)];
    let view = PageView::read_compiled_for(valid.as_bytes(), vp, compiled).unwrap();
    assert_eq!(view.absent_counters(GroupKind::Architectural), 0);
}

#[test]
fn errors_render_their_offset_and_reason() {
    let e = PageError::LengthPastPage { offset: 24, length: 4080 };
    assert_eq!(e.to_string(), "group at byte 24: length 4080 runs past the end of the page");
    let e = PageError::LengthMisaligned { offset: 8, length: 3 };
    assert_eq!(e.to_string(), "group at byte 8: length 3 is not a multiple of 8");
    let e = PageError::MajorMismatch {
        offset: 0,
        group: GroupType::ARCHITECTURAL,
        found: GroupVersion { major: 2, minor: 0 },
        expected: V1_0,
    };
    assert_eq!(e.to_string(), "group architectural(2) at byte 0: major version 2 is not the reader's 1");
}
