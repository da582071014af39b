//! The page reader's contract, checked on arbitrary bytes.
//!
//! This one function is the body of the `page_reader` fuzz target and of the workspace test that
//! feeds it random and mutated pages, so the two can never drift apart. Whatever the bytes, the
//! reader must return values or a [`PageError`] whose offset lies in the page; it must never panic,
//! loop, or read outside the page, and what it returns must agree with the raw bytes.

use hvstats_abi::catalog::counters_of;
use hvstats_abi::group::{GroupType, PAGE_SIZE};
use hvstats_abi::page::{GroupWalk, ListEnd, PageError, PageView, infer_kind};
use hvstats_abi::{GroupKind, ObjectKind};

/// What the reader made of one page, for callers that count outcomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The walk over the groups: how many groups it yielded, or its fault.
    pub walk: Result<usize, PageError>,
    /// `PageView::read` as each kind of [`ObjectKind::ALL`], in that order.
    pub read: [Result<(), PageError>; 4],
    /// What `infer_kind` said.
    pub inferred: Option<ObjectKind>,
}

/// Feeds `data` to every reader entry point and checks what comes back.
///
/// Input of any length is first offered as is (anything but exactly one page must be refused),
/// then as one page: truncated or zero-padded to 4096 bytes.
pub fn check(data: &[u8]) -> Verdict {
    if data.len() != PAGE_SIZE {
        let expected = if data.len() < PAGE_SIZE {
            PageError::Truncated { len: data.len() }
        } else {
            PageError::Oversized { len: data.len() }
        };
        assert_eq!(GroupWalk::new(data).err(), Some(expected));
        for kind in ObjectKind::ALL {
            assert_eq!(PageView::read(data, kind).err(), Some(expected));
        }
        assert_eq!(infer_kind(data), None);
    }
    let mut page = [0u8; PAGE_SIZE];
    let n = data.len().min(PAGE_SIZE);
    page[..n].copy_from_slice(&data[..n]);
    check_page(&page)
}

/// Checks the reader on one 4 KiB page.
pub fn check_page(page: &[u8; PAGE_SIZE]) -> Verdict {
    let walk = check_walk(page);
    let mut read = [Ok(()); 4];
    for (slot, kind) in read.iter_mut().zip(ObjectKind::ALL) {
        *slot = check_read(page, kind);
        if let Err(e) = slot {
            check_error(e);
        }
        if slot.is_ok() {
            assert!(walk.is_ok(), "{kind:?} read a page whose walk failed: {walk:?}");
        }
    }
    let inferred = infer_kind(page);
    match inferred {
        Some(kind) => assert!(read[kind as usize].is_ok(), "inferred {kind:?}, which does not read"),
        None => assert!(read.iter().all(Result::is_err), "no kind inferred for a readable page"),
    }
    Verdict { walk, read, inferred }
}

/// Walks the groups and checks each one's framing against the raw bytes.
fn check_walk(page: &[u8; PAGE_SIZE]) -> Result<usize, PageError> {
    let mut walk = GroupWalk::new(page).expect("a full page starts a walk");
    let mut expected_offset = 0;
    let mut groups = 0;
    for item in &mut walk {
        let group = match item {
            Ok(group) => group,
            Err(e) => {
                check_error(&e);
                return Err(e);
            }
        };
        assert_eq!(group.offset, expected_offset, "groups are packed");
        assert_eq!(group.offset % 8, 0);
        assert_ne!(group.header.group_type, GroupType::END_OF_LIST);
        assert_ne!(group.header.group_type, GroupType::END_OF_PAGE);
        assert_eq!(group.data.len(), group.header.length as usize);
        assert_eq!(group.header.length % 8, 0);
        let data_start = group.offset + 8;
        assert_eq!(group.data, &page[data_start..data_start + group.data.len()]);
        expected_offset = data_start + group.data.len();
        groups += 1;
        assert!(groups <= PAGE_SIZE / 8, "the walk does not loop");
    }
    let end = walk.end().expect("a walk that ends without a fault found a terminator");
    let (offset, terminator) = match end {
        ListEnd::EndOfList(offset) => (offset, GroupType::END_OF_LIST),
        ListEnd::EndOfPage(offset) => (offset, GroupType::END_OF_PAGE),
    };
    assert_eq!(offset, expected_offset);
    assert_eq!(&page[offset..offset + 8], &[terminator.0 as u8, 0, 0, 0, 0, 0, 0, 0]);
    assert!(walk.next().is_none(), "a finished walk stays finished");
    Ok(groups)
}

/// Reads the page as `kind` and, when that succeeds, checks every value against the raw bytes.
fn check_read(page: &[u8; PAGE_SIZE], kind: ObjectKind) -> Result<(), PageError> {
    let view = PageView::read(page, kind)?;
    assert_eq!(view.kind, kind);
    let offsets = GroupKind::ALL.map(|group| group_offset(page, group));
    for counter in counters_of(kind) {
        let id = counter.id;
        let Some(header_offset) = offsets[id.group as usize] else {
            // Only hvstats' own group may be missing (a page of another writer); its rows read 0.
            assert_eq!(id.group, GroupKind::Hvstats, "a read page has each of its TLFS groups");
            assert_eq!(view.get(id), 0, "{} of {kind:?}", counter.name);
            continue;
        };
        let version = view.version(id.group).expect("a group found on the page has a version");
        if id.introduced_in() > version.minor {
            // Appended by a later minor than the page's: absent, whatever bytes follow.
            assert_eq!(view.value(id), None, "{} of {kind:?}", counter.name);
            continue;
        }
        let at = header_offset + id.index as usize * 8;
        let raw = u64::from_le_bytes(page[at..at + 8].try_into().expect("8 bytes"));
        assert_eq!(view.value(id), Some(raw), "{} of {kind:?}", counter.name);
    }
    for group in GroupKind::ALL {
        if let Some(version) = view.version(group) {
            assert_eq!(group.version(kind).major, version.major, "only the reader's major reads");
        }
    }
    for other in ObjectKind::ALL.into_iter().filter(|&k| k != kind) {
        if let Some(counter) = counters_of(other).last() {
            assert_eq!(view.get(counter.id), 0, "a counter of another kind reads 0");
        }
    }
    for unknown in view.unknown_groups() {
        assert!(unknown.offset + 8 + unknown.data.len() <= PAGE_SIZE);
    }
    Ok(())
}

/// The header offset of the first group of `group`'s type on the page.
fn group_offset(page: &[u8; PAGE_SIZE], group: GroupKind) -> Option<usize> {
    GroupWalk::new(page)
        .ok()?
        .map_while(Result::ok)
        .find(|g| g.header.group_type == group.group_type())
        .map(|g| g.offset)
}

/// Every error names a place inside the page (or just past it) and renders.
fn check_error(e: &PageError) {
    if let Some(offset) = e.offset() {
        assert!(offset <= PAGE_SIZE, "{e:?}");
    }
    assert!(!e.to_string().is_empty());
}
