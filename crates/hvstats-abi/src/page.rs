//! Stats pages: the writer that lays out an object's page and the reader that walks any page.
//!
//! A page is a packed list of groups (seed 004): header, values, next header, …, END_OF_LIST. The
//! reader never trusts the page: a short page, a Length running past the page or not a multiple of
//! 8, a missing END_OF_LIST, or a group of another major version gives a [`PageError`], never a
//! panic. A group of an older minor is read for the counters it carries; the counters a later
//! minor appended are absent from it ([`PageView::value`] gives `None`), never a refusal.

use core::fmt;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::catalog::Counter;
use crate::catalog::{CounterId, GroupKind, count_group, counters_at};
use crate::group::{GroupHeader, GroupType, GroupVersion, PAGE_SIZE, VALUE_SIZE};
use crate::histogram::{HISTOGRAM_SLOTS, Log2Histogram};
use crate::object::ObjectKind;

/// Number of 64-bit slots in a page.
pub const PAGE_SLOTS: usize = PAGE_SIZE / VALUE_SIZE;

/// `HV_STATS_PAGE`: one 4 KiB page of 64-bit slots.
#[derive(Clone, PartialEq, Eq, IntoBytes, FromBytes, Immutable, KnownLayout)]
#[repr(C, align(8))]
pub struct StatsPage {
    /// The page as 512 slots; slot `n` is bytes `8n..8n+8`.
    pub data: [u64; PAGE_SLOTS],
}

const _: () = assert!(size_of::<StatsPage>() == PAGE_SIZE);

impl Default for StatsPage {
    fn default() -> Self {
        Self { data: [0; PAGE_SLOTS] }
    }
}

impl StatsPage {
    /// A page laid out for `kind` with every counter at zero.
    pub fn new(kind: ObjectKind) -> Self {
        let mut page = Self::default();
        PageLayout::of(kind).write_headers(&mut page.data);
        page
    }

    /// The value of `counter`.
    ///
    /// # Panics
    ///
    /// When `counter` is not on `kind`'s page (not a catalog counter): see [`CounterId::offset`].
    pub fn get(&self, counter: CounterId) -> u64 {
        self.data[counter.slot()]
    }

    /// Sets the value of `counter`.
    ///
    /// # Panics
    ///
    /// When `counter` is not on `kind`'s page (not a catalog counter): see [`CounterId::offset`].
    pub fn set(&mut self, counter: CounterId, value: u64) {
        self.data[counter.slot()] = value;
    }
}

/// Where one group sits in a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupSlot {
    /// Which catalog group (architectural, release or hvstats') this slot holds.
    pub group: GroupKind,
    /// Byte offset of its header.
    pub header_offset: usize,
    /// Number of counters (data bytes / 8).
    pub counters: usize,
    /// The version written in its header.
    pub version: GroupVersion,
}

impl GroupSlot {
    /// The header written for this group.
    pub const fn header(&self) -> GroupHeader {
        GroupHeader::new(self.group.group_type(), self.version, (self.counters * VALUE_SIZE) as u16)
    }
}

/// The layout of one object kind's page, computed from the catalog.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageLayout {
    /// The object kind.
    pub kind: ObjectKind,
    /// The groups, in page order (`None` where the kind has no counters in that group).
    pub groups: [Option<GroupSlot>; GROUPS],
    /// Byte offset of the END_OF_LIST header.
    pub end_offset: usize,
}

/// Number of group kinds a page can hold ([`GroupKind::ALL`]).
pub const GROUPS: usize = GroupKind::ALL.len();

/// The layout of every kind's page, indexed by [`ObjectKind`], computed once at compile time. A
/// `static`, not a `const`: indexed at run time, a `const` array is built anew on the stack at
/// each use, and a counter's offset is asked at every write of a page.
static LAYOUTS: [PageLayout; 4] = [
    PageLayout::compute(ObjectKind::Hypervisor),
    PageLayout::compute(ObjectKind::LogicalProcessor),
    PageLayout::compute(ObjectKind::Partition),
    PageLayout::compute(ObjectKind::Vp),
];

impl PageLayout {
    /// The layout of `kind`'s page (a table lookup: layouts are computed at compile time).
    #[inline]
    pub const fn of(kind: ObjectKind) -> Self {
        *Self::of_ref(kind)
    }

    /// [`of`](Self::of) without the copy.
    #[inline]
    const fn of_ref(kind: ObjectKind) -> &'static Self {
        &LAYOUTS[kind as usize]
    }

    /// The number of counters of `group` in `kind`'s page (0 when the page has no such group).
    pub const fn counters(&self, group: GroupKind) -> usize {
        match self.groups[group as usize] {
            Some(slot) => slot.counters,
            None => 0,
        }
    }

    /// Lays out `kind`'s page from the catalog.
    const fn compute(kind: ObjectKind) -> Self {
        let mut groups = [None; GROUPS];
        let mut offset = 0;
        let mut i = 0;
        while i < GroupKind::ALL.len() {
            let group = GroupKind::ALL[i];
            let counters = count_group(kind, group);
            if counters > 0 {
                groups[i] =
                    Some(GroupSlot { group, header_offset: offset, counters, version: group.version(kind) });
                offset += (1 + counters) * VALUE_SIZE;
            }
            i += 1;
        }
        Self { kind, groups, end_offset: offset }
    }

    /// The byte offset of `group`'s header, which is also where its index 0 lies.
    #[inline]
    pub const fn group_offset(&self, group: GroupKind) -> Option<usize> {
        match self.groups[group as usize] {
            Some(slot) => Some(slot.header_offset),
            None => None,
        }
    }

    /// The groups present, in page order.
    pub fn slots(&self) -> impl Iterator<Item = GroupSlot> + '_ {
        self.groups.iter().flatten().copied()
    }

    /// The layout of `kind`'s page as a writer of the groups and versions `versions` lays it out:
    /// each group of `kind` listed there at its version, holding the counters that version defines
    /// ([`counters_at`]), groups in page order, those not listed left out. With this build's
    /// versions it is [`of`](Self::of); with older minors, the page an older hypervisor writes.
    ///
    /// ```
    /// use hvstats_abi::catalog::vp;
    /// use hvstats_abi::group::GroupVersion;
    /// use hvstats_abi::{GroupKind, ObjectKind, PageLayout, PageView};
    ///
    /// // The VP page of seed 001 alone: both TLFS groups at 1.0, no hvstats group.
    /// let v1_0 = [(GroupKind::Architectural, GroupVersion::V1_0), (GroupKind::Release, GroupVersion::V1_0)];
    /// let layout = PageLayout::written_at(ObjectKind::Vp, &v1_0);
    /// assert_eq!(layout.counters(GroupKind::Release), 63);
    /// let mut page = layout.page();
    /// page.data[layout.slot_of(vp::HYPERCALLS).unwrap()] = 7;
    /// assert_eq!(layout.slot_of(vp::DISPATCHES), None, "appended in 1.1");
    /// let view = PageView::read(zerocopy::IntoBytes::as_bytes(&page), ObjectKind::Vp)?;
    /// assert_eq!(view.value(vp::HYPERCALLS), Some(7));
    /// assert_eq!(view.value(vp::DISPATCHES), None);
    /// # Ok::<(), hvstats_abi::PageError>(())
    /// ```
    pub fn written_at(kind: ObjectKind, versions: &[(GroupKind, GroupVersion)]) -> Self {
        let current = Self::of(kind);
        let mut groups = [None; GROUPS];
        let mut offset = 0;
        for slot in current.slots() {
            let Some(&(_, version)) = versions.iter().find(|(g, _)| *g == slot.group) else { continue };
            let counters = counters_at(kind, slot.group, version.minor);
            groups[slot.group as usize] =
                Some(GroupSlot { group: slot.group, header_offset: offset, counters, version });
            offset += (1 + counters) * VALUE_SIZE;
        }
        Self { kind, groups, end_offset: offset }
    }

    /// The index of `counter`'s value in a page of this layout seen as `[u64; 512]`: `None` when
    /// the page does not carry it (another kind's counter, a group left out, or appended by a
    /// later minor).
    pub fn slot_of(&self, counter: CounterId) -> Option<usize> {
        let group = self.groups[counter.group as usize].filter(|_| counter.kind == self.kind)?;
        let last = counter.counter().map_or(1, Counter::slots) + counter.index as usize - 1;
        (counter.index > 0 && last <= group.counters)
            .then_some(group.header_offset / VALUE_SIZE + counter.index as usize)
    }

    /// A page of this layout: its headers and END_OF_LIST written, every value zero.
    pub fn page(&self) -> StatsPage {
        let mut page = StatsPage::default();
        self.write_headers(&mut page.data);
        page
    }

    /// Writes every group header and the END_OF_LIST header into `data`; values are untouched.
    pub fn write_headers(&self, data: &mut [u64; PAGE_SLOTS]) {
        for slot in self.slots() {
            data[slot.header_offset / VALUE_SIZE] = header_word(slot.header());
        }
        data[self.end_offset / VALUE_SIZE] = header_word(GroupHeader::END_OF_LIST);
    }
}

/// A header as the 64-bit word it occupies in a page.
pub fn header_word(header: GroupHeader) -> u64 {
    u64::from_le_bytes(header.as_bytes().try_into().unwrap_or([0; 8]))
}

/// Builds a page from arbitrary groups: for tests, fuzzing, and pages of other versions.
pub struct PageBuilder {
    page: StatsPage,
    cursor: usize,
}

impl Default for PageBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl PageBuilder {
    /// An empty page.
    pub fn new() -> Self {
        Self { page: StatsPage::default(), cursor: 0 }
    }

    /// Appends a group with `values`; fails when the group and the END_OF_LIST after it would not
    /// fit in the page.
    ///
    /// # Errors
    /// [`PageError::PageFull`] when the group and the END_OF_LIST after it would not fit.
    pub fn group(
        &mut self,
        group_type: GroupType,
        version: GroupVersion,
        values: &[u64],
    ) -> Result<&mut Self, PageError> {
        let needed = (1 + values.len()) * VALUE_SIZE;
        if self.cursor + needed + VALUE_SIZE > PAGE_SIZE {
            return Err(PageError::PageFull { offset: self.cursor, needed });
        }
        let slot = self.cursor / VALUE_SIZE;
        let length = (values.len() * VALUE_SIZE) as u16;
        self.page.data[slot] = header_word(GroupHeader::new(group_type, version, length));
        self.page.data[slot + 1..slot + 1 + values.len()].copy_from_slice(values);
        self.cursor += needed;
        Ok(self)
    }

    /// Ends the list with END_OF_LIST and returns the page.
    pub fn finish(mut self) -> StatsPage {
        self.page.data[self.cursor / VALUE_SIZE] = header_word(GroupHeader::END_OF_LIST);
        self.page
    }
}

/// Why a page could not be read (or written).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageError {
    /// The page is shorter than 4096 bytes.
    Truncated {
        /// Bytes available (fewer than 4096).
        len: usize,
    },
    /// The page is longer than 4096 bytes.
    Oversized {
        /// Bytes given (more than 4096).
        len: usize,
    },
    /// A group's Length runs past the end of the page.
    LengthPastPage {
        /// Byte offset of the group header.
        offset: usize,
        /// The header's Length, in bytes (past the page from `offset + 8`).
        length: u16,
    },
    /// A group's Length is not a multiple of 8.
    LengthMisaligned {
        /// Byte offset of the group header.
        offset: usize,
        /// The header's Length, in bytes (not a multiple of 8).
        length: u16,
    },
    /// The groups run to the end of the page with no END_OF_LIST or END_OF_PAGE.
    NoEndOfList,
    /// An END_OF_LIST or END_OF_PAGE header with a nonzero version or length.
    BadTerminator {
        /// Byte offset of the header.
        offset: usize,
    },
    /// A known group whose major version differs from the reader's.
    MajorMismatch {
        /// Byte offset of the group header.
        offset: usize,
        /// Type of the group whose major version differs.
        group: GroupType,
        /// The version on the page.
        found: GroupVersion,
        /// The version the reader is compiled for.
        expected: GroupVersion,
    },
    /// A known group too short to hold the counters its version promises.
    GroupTooShort {
        /// Byte offset of the group header.
        offset: usize,
        /// Type of the group that is too short.
        group: GroupType,
        /// The header's Length, in bytes (less than `needed`).
        length: u16,
        /// The bytes the reader's version needs.
        needed: usize,
    },
    /// A known group appears twice.
    DuplicateGroup {
        /// Byte offset of the second header.
        offset: usize,
        /// Type of the group seen for the second time.
        group: GroupType,
    },
    /// The page lacks a group the object kind needs.
    MissingGroup {
        /// Type of the group the page should hold but does not.
        group: GroupType,
    },
    /// Writing: the group does not fit in what remains of the page.
    PageFull {
        /// Where the group would start.
        offset: usize,
        /// Bytes it needs (header and values).
        needed: usize,
    },
}

impl PageError {
    /// The byte offset of the fault in the page, where there is one.
    pub fn offset(&self) -> Option<usize> {
        match *self {
            PageError::Truncated { len } => Some(len),
            PageError::Oversized { .. } => Some(PAGE_SIZE),
            PageError::LengthPastPage { offset, .. }
            | PageError::LengthMisaligned { offset, .. }
            | PageError::BadTerminator { offset }
            | PageError::MajorMismatch { offset, .. }
            | PageError::GroupTooShort { offset, .. }
            | PageError::DuplicateGroup { offset, .. }
            | PageError::PageFull { offset, .. } => Some(offset),
            PageError::NoEndOfList => Some(PAGE_SIZE),
            PageError::MissingGroup { .. } => None,
        }
    }
}

impl fmt::Display for PageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PageError::Truncated { len } => write!(f, "page truncated: {len} of {PAGE_SIZE} bytes"),
            PageError::Oversized { len } => write!(f, "not a stats page: {len} bytes, expected {PAGE_SIZE}"),
            PageError::LengthPastPage { offset, length } => {
                write!(f, "group at byte {offset}: length {length} runs past the end of the page")
            }
            PageError::LengthMisaligned { offset, length } => {
                write!(f, "group at byte {offset}: length {length} is not a multiple of 8")
            }
            PageError::NoEndOfList => write!(f, "no END_OF_LIST header before the end of the page"),
            PageError::BadTerminator { offset } => {
                write!(f, "end header at byte {offset} has a nonzero version or length")
            }
            PageError::MajorMismatch { offset, group, found, expected } => write!(
                f,
                "group {group:?} at byte {offset}: major version {} is not the reader's {}",
                found.major, expected.major
            ),
            PageError::GroupTooShort { offset, group, length, needed } => write!(
                f,
                "group {group:?} at byte {offset}: length {length} is less than the {needed} bytes its version defines"
            ),
            PageError::DuplicateGroup { offset, group } => {
                write!(f, "group {group:?} at byte {offset} appears a second time")
            }
            PageError::MissingGroup { group } => write!(f, "the page has no {group:?} group"),
            PageError::PageFull { offset, needed } => {
                write!(f, "a group of {needed} bytes at byte {offset} does not fit in the page")
            }
        }
    }
}

impl core::error::Error for PageError {}

/// One group as found on a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawGroup<'a> {
    /// Byte offset of the header.
    pub offset: usize,
    /// The header as read: never a terminator, Length checked, type and version not.
    pub header: GroupHeader,
    /// The data bytes (`header.length` of them).
    pub data: &'a [u8],
}

impl RawGroup<'_> {
    /// Value `index` of the group (1-based, as counters are numbered), if the group holds it.
    pub fn value(&self, index: u16) -> Option<u64> {
        let start = (index as usize).checked_sub(1)? * VALUE_SIZE;
        let bytes = self.data.get(start..start + VALUE_SIZE)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    }

    /// Number of values in the group.
    pub fn len(&self) -> usize {
        self.data.len() / VALUE_SIZE
    }

    /// True for a group with no values.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

/// How a page's list of groups ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListEnd {
    /// END_OF_LIST at this byte offset.
    EndOfList(usize),
    /// END_OF_PAGE at this byte offset: the list goes on in another page.
    EndOfPage(usize),
}

/// Walks the groups of a page, validating each header's framing.
///
/// Yields each group up to the terminator, then stops; a framing fault is yielded once as an error
/// and ends the walk. After a clean walk, [`GroupWalk::end`] says how the list ended.
pub struct GroupWalk<'a> {
    page: &'a [u8],
    cursor: usize,
    end: Option<ListEnd>,
    failed: bool,
}

impl<'a> GroupWalk<'a> {
    /// Starts a walk over `page`, which must be exactly one 4 KiB page.
    ///
    /// # Errors
    /// [`PageError`] when `page` is not 4 KiB long.
    pub fn new(page: &'a [u8]) -> Result<Self, PageError> {
        if page.len() < PAGE_SIZE {
            return Err(PageError::Truncated { len: page.len() });
        }
        if page.len() > PAGE_SIZE {
            return Err(PageError::Oversized { len: page.len() });
        }
        Ok(Self { page, cursor: 0, end: None, failed: false })
    }

    /// How the list ended, once the walk has finished without a fault.
    pub fn end(&self) -> Option<ListEnd> {
        self.end
    }

    fn step(&mut self) -> Result<Option<RawGroup<'a>>, PageError> {
        let offset = self.cursor;
        let Some(bytes) = self.page.get(offset..offset + VALUE_SIZE) else {
            return Err(PageError::NoEndOfList);
        };
        let header = GroupHeader::read_from_bytes(bytes).map_err(|_| PageError::NoEndOfList)?;
        if header.group_type == GroupType::END_OF_LIST || header.group_type == GroupType::END_OF_PAGE {
            if header.version() != GroupVersion::ZERO || header.length != 0 {
                return Err(PageError::BadTerminator { offset });
            }
            self.end = Some(if header.group_type == GroupType::END_OF_LIST {
                ListEnd::EndOfList(offset)
            } else {
                ListEnd::EndOfPage(offset)
            });
            return Ok(None);
        }
        let length = header.length;
        if !(length as usize).is_multiple_of(VALUE_SIZE) {
            return Err(PageError::LengthMisaligned { offset, length });
        }
        let data_start = offset + VALUE_SIZE;
        let data_end = data_start + length as usize;
        let Some(data) = self.page.get(data_start..data_end) else {
            return Err(PageError::LengthPastPage { offset, length });
        };
        self.cursor = data_end;
        Ok(Some(RawGroup { offset, header, data }))
    }
}

impl<'a> Iterator for GroupWalk<'a> {
    type Item = Result<RawGroup<'a>, PageError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.end.is_some() {
            return None;
        }
        match self.step() {
            Ok(Some(group)) => Some(Ok(group)),
            Ok(None) => None,
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

/// A page read as one object kind's page: the groups the reader knows, checked by seed 004's rule.
#[derive(Clone, Copy, Debug)]
pub struct PageView<'a> {
    /// The object kind the page was read as.
    pub kind: ObjectKind,
    page: &'a [u8],
    known: [Option<RawGroup<'a>>; GROUPS],
    /// Counters per group the reader reads: those both it and the page's version define.
    known_counters: [usize; GROUPS],
    /// Counters per group the reader's own version defines.
    reader_counters: [usize; GROUPS],
    /// How the list ended.
    pub end: ListEnd,
}

impl<'a> PageView<'a> {
    /// Reads `page` as `kind`'s page.
    ///
    /// Unknown group types are skipped by their Length. A known group must have the reader's major
    /// version and be long enough for the counters its own minor defines: a newer minor's extra
    /// counters are skipped ([`extra_counters`](Self::extra_counters)), an older minor's missing
    /// ones are absent ([`value`](Self::value) gives `None`). Every TLFS group `kind` has must be
    /// present; hvstats' own group may be absent (its counters are then absent too).
    ///
    /// ```
    /// use hvstats_abi::catalog::vp;
    /// use hvstats_abi::{ObjectKind, PageView, StatsPage};
    /// use zerocopy::IntoBytes;
    ///
    /// let mut page = StatsPage::new(ObjectKind::Vp);
    /// page.set(vp::CPUID_INSTRUCTIONS, 300);
    /// let view = PageView::read(page.as_bytes(), ObjectKind::Vp)?;
    /// assert_eq!(view.get(vp::CPUID_INSTRUCTIONS), 300);
    /// assert!(PageView::read(&[0u8; 16], ObjectKind::Vp).is_err(), "a short page is refused");
    /// # Ok::<(), hvstats_abi::PageError>(())
    /// ```
    ///
    /// # Errors
    /// A [`PageError`] when the page is short, a header is malformed, a known group has another
    /// major version or is shorter than its own version defines, or a TLFS group of `kind` is
    /// missing.
    pub fn read(page: &'a [u8], kind: ObjectKind) -> Result<Self, PageError> {
        let compiled = GroupKind::ALL.map(|g| (g, g.version(kind)));
        Self::read_compiled_for(page, kind, &compiled)
    }

    /// Reads `page` as a reader compiled for the groups and versions `compiled` would:
    /// [`read`](Self::read) with the groups and versions of this build. A group not in `compiled`
    /// is unknown to that reader and skipped by its Length, like any unknown type; a known group
    /// is read for the counters both the reader's minor and the page's define ([`counters_at`] of
    /// the older of the two), and must be long enough for them.
    ///
    /// # Errors
    /// As [`read`](Self::read).
    pub fn read_compiled_for(
        page: &'a [u8],
        kind: ObjectKind,
        compiled: &[(GroupKind, GroupVersion)],
    ) -> Result<Self, PageError> {
        let layout = PageLayout::of(kind);
        let compiled_for = |gk: GroupKind| compiled.iter().find(|(g, _)| *g == gk).map(|&(_, v)| v);
        let mut known: [Option<RawGroup<'a>>; GROUPS] = [None; GROUPS];
        let mut known_counters = [0; GROUPS];
        let mut reader_counters = [0; GROUPS];
        let mut walk = GroupWalk::new(page)?;
        for group in &mut walk {
            let group = group?;
            let Some(gk) = GroupKind::from_group_type(group.header.group_type) else {
                continue;
            };
            if layout.groups[gk as usize].is_none() {
                continue;
            }
            let Some(expected) = compiled_for(gk) else {
                continue;
            };
            let found = group.header.version();
            let (offset, group_type) = (group.offset, group.header.group_type);
            if found.major != expected.major {
                return Err(PageError::MajorMismatch { offset, group: group_type, found, expected });
            }
            // Seed 004 protects an old reader of a newer minor; a newer reader of an older minor
            // knows exactly which counters that minor carries, and reads those.
            let counters = counters_at(kind, gk, expected.minor.min(found.minor));
            let needed = counters * VALUE_SIZE;
            if (group.header.length as usize) < needed {
                return Err(PageError::GroupTooShort {
                    offset,
                    group: group_type,
                    length: group.header.length,
                    needed,
                });
            }
            if known[gk as usize].is_some() {
                return Err(PageError::DuplicateGroup { offset, group: group_type });
            }
            known[gk as usize] = Some(group);
            known_counters[gk as usize] = counters;
            reader_counters[gk as usize] = counters_at(kind, gk, expected.minor);
        }
        let end = walk.end().ok_or(PageError::NoEndOfList)?;
        // hvstats' own group is optional: a page written by another hypervisor has none, and its
        // counters then read as absent.
        let required = |s: &GroupSlot| s.group != GroupKind::Hvstats && compiled_for(s.group).is_some();
        for slot in layout.slots().filter(required) {
            if known[slot.group as usize].is_none() {
                return Err(PageError::MissingGroup { group: slot.group.group_type() });
            }
        }
        Ok(Self { kind, page, known, known_counters, reader_counters, end })
    }

    /// The value of `counter`, 0 when the page does not carry it: [`value`](Self::value) tells
    /// the two apart.
    pub fn get(&self, counter: CounterId) -> u64 {
        self.value(counter).unwrap_or(0)
    }

    /// The value of `counter`: `None` when the page does not carry it (a counter of another object
    /// kind, of a group the page lacks or the reader skips, or appended by a later minor than
    /// the page's group has, or than the reader knows).
    pub fn value(&self, counter: CounterId) -> Option<u64> {
        if counter.kind != self.kind || counter.index as usize > self.known_counters[counter.group as usize] {
            return None;
        }
        self.known[counter.group as usize].and_then(|g| g.value(counter.index))
    }

    /// True when the page carries `counter` ([`value`](Self::value) gives `Some`).
    pub fn carries(&self, counter: CounterId) -> bool {
        self.value(counter).is_some()
    }

    /// The histogram whose first slot is `counter` (a catalog row presented as a histogram):
    /// `None` when the reader does not know its group or the group is too short for it.
    pub fn histogram(&self, counter: CounterId) -> Option<Log2Histogram> {
        if counter.kind != self.kind {
            return None;
        }
        let last = (counter.index as usize).checked_add(HISTOGRAM_SLOTS - 1)?;
        if counter.index == 0 || last > self.known_counters[counter.group as usize] {
            return None;
        }
        let group = self.known[counter.group as usize]?;
        let start = (counter.index as usize - 1) * VALUE_SIZE;
        let bytes = group.data.get(start..start + HISTOGRAM_SLOTS * VALUE_SIZE)?;
        let mut slots = [0u64; HISTOGRAM_SLOTS];
        for (v, b) in slots.iter_mut().zip(bytes.chunks_exact(VALUE_SIZE)) {
            *v = u64::from_le_bytes(b.try_into().ok()?);
        }
        Log2Histogram::from_slots(&slots)
    }

    /// `group` as found on the page (offset, header and data), if the kind has it.
    pub fn group(&self, group: GroupKind) -> Option<RawGroup<'a>> {
        self.known[group as usize]
    }

    /// The version of `group` on the page.
    pub fn version(&self, group: GroupKind) -> Option<GroupVersion> {
        self.known[group as usize].map(|g| g.header.version())
    }

    /// Counters on the page beyond those the reader knows (from a newer minor), per group.
    pub fn extra_counters(&self, group: GroupKind) -> usize {
        let known = self.known_counters[group as usize];
        self.known[group as usize].map_or(0, |g| g.len().saturating_sub(known))
    }

    /// Counters the reader knows that the page's group does not carry (it is of an older minor),
    /// per group present on the page.
    pub fn absent_counters(&self, group: GroupKind) -> usize {
        let (known, reader) = (self.known_counters[group as usize], self.reader_counters[group as usize]);
        self.known[group as usize].map_or(0, |_| reader.saturating_sub(known))
    }

    /// The groups the reader skipped: unknown types, types the reader was not compiled for, and
    /// known types the kind does not use.
    pub fn unknown_groups(&self) -> impl Iterator<Item = RawGroup<'a>> + 'a {
        let kept = self.known.map(|g| g.map(|g| g.offset));
        GroupWalk::new(self.page)
            .into_iter()
            .flatten()
            .map_while(Result::ok)
            .filter(move |g| !kept.contains(&Some(g.offset)))
    }
}

/// Infers which object kind a page describes from its groups' lengths.
///
/// All four pages use the same group ids, so the kind is told by which groups are present and how
/// long they are: an exact match with a kind's layout wins, otherwise the most specific kind whose
/// groups fit (a page from a newer minor has longer groups). `None` when no kind reads the page.
pub fn infer_kind(page: &[u8]) -> Option<ObjectKind> {
    const ORDER: [ObjectKind; 4] =
        [ObjectKind::Vp, ObjectKind::Partition, ObjectKind::LogicalProcessor, ObjectKind::Hypervisor];
    let exact = |kind: ObjectKind| {
        let layout = PageLayout::of(kind);
        let mut lens = [None; GROUPS];
        for g in GroupWalk::new(page).into_iter().flatten().map_while(Result::ok) {
            if let Some(gk) = GroupKind::from_group_type(g.header.group_type) {
                lens[gk as usize] = Some(g.len());
            }
        }
        layout.groups.iter().zip(lens).all(|(slot, len)| slot.map(|s| s.counters) == len)
    };
    ORDER
        .into_iter()
        .find(|&k| exact(k) && PageView::read(page, k).is_ok())
        .or_else(|| ORDER.into_iter().find(|&k| PageView::read(page, k).is_ok()))
}

impl CounterId {
    /// The byte offset of this counter's value in its object's page.
    ///
    /// Computed from the catalog: each group present in the page is its header followed by its
    /// values, groups in [`GroupKind::ALL`] order.
    ///
    /// # Panics
    ///
    /// When the id names a group its kind's page does not have, or an index past the page: only
    /// ids made by hand can, never the catalog's constants (a test checks every one).
    #[inline]
    pub const fn offset(self) -> usize {
        let base = match PageLayout::of_ref(self.kind).group_offset(self.group) {
            Some(base) => base,
            None => panic!("counter in a group its page does not have"),
        };
        let offset = base + self.index as usize * VALUE_SIZE;
        assert!(offset + VALUE_SIZE <= PAGE_SIZE, "counter index past the end of the page");
        offset
    }

    /// The index of this counter's value in the page seen as `[u64; 512]`.
    #[inline]
    pub const fn slot(self) -> usize {
        self.offset() / VALUE_SIZE
    }
}

/// The number of counters in `group` of `kind` (the highest index, since indices are dense).
pub const fn group_counters(kind: ObjectKind, group: GroupKind) -> usize {
    PageLayout::of_ref(kind).counters(group)
}
