//! A stats page in shared memory: the storage of an object's counters.
//!
//! The counters live in the page at the offsets the catalog gives; there is no second copy. The
//! page is 4 KiB of a `MAP_SHARED` file: a slot of its instance's arena ([`crate::arena`]), or a
//! memfd of its own for a page outside any instance. So the same bytes can be mapped read-only
//! into a guest (a KVM memory slot) and into root tools on the host. Values are accessed as relaxed atomics: a VP thread, the only writer of
//! its VP page, does a plain load and store per update; counters with several writers use
//! [`SharedPage::fetch_add`].

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hvstats_abi::catalog::vp;
use hvstats_abi::histogram::{self, HISTOGRAM_SLOTS};
use hvstats_abi::page::{PAGE_SLOTS, PageLayout, StatsPage};
use hvstats_abi::seqcount::{self, SeqRead, SeqWrite};
use hvstats_abi::{CounterId, GroupKind, ObjectKind, PAGE_SIZE};
use hvstats_host::os;

use crate::arena::Arena;
use crate::patience::Patience;

/// One object's stats page, mapped shared and writable by its owner.
pub struct SharedPage {
    kind: ObjectKind,
    backing: Backing,
    ptr: NonNull<AtomicU64>,
}

enum Backing {
    /// A memfd of its own, mapped by this value.
    Own(File),
    /// Slot `.1` of an arena, released when this value is dropped.
    Arena(Arc<Arena>, usize),
}

// SAFETY: the mapping is only accessed through atomics, and it lives as long as the value.
unsafe impl Send for SharedPage {}
// SAFETY: as above; concurrent access goes through `AtomicU64`.
unsafe impl Sync for SharedPage {}

impl SharedPage {
    /// A page for `kind` in an anonymous memfd, laid out with every counter at zero.
    ///
    /// # Errors
    /// When the memfd cannot be created, sized or mapped.
    pub fn anonymous(kind: ObjectKind) -> io::Result<Self> {
        // SAFETY: the name is a NUL-terminated literal; we check the result.
        let fd = os::check(unsafe { libc::memfd_create(c"hvstats-page".as_ptr(), libc::MFD_CLOEXEC) })?;
        // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        Self::from_file(kind, file)
    }

    fn from_file(kind: ObjectKind, file: File) -> io::Result<Self> {
        file.set_len(PAGE_SIZE as u64)?;
        let ptr = map(file.as_fd(), libc::PROT_READ | libc::PROT_WRITE, 0)?;
        let page = Self { kind, backing: Backing::Own(file), ptr: ptr.cast() };
        let mut headers = [0u64; PAGE_SLOTS];
        PageLayout::of(kind).write_headers(&mut headers);
        for (i, word) in headers.iter().enumerate() {
            page.slots()[i].store(*word, Ordering::Relaxed);
        }
        Ok(page)
    }

    /// Takes a slot of `arena` for `record` (its page reset to `record.kind`'s empty layout),
    /// inside an index change.
    ///
    /// # Errors
    /// When the arena is full or its storage cannot grow.
    pub(crate) fn in_arena(
        arena: &Arc<Arena>,
        change: &mut crate::arena::IndexChange<'_>,
        record: crate::arena::ObjectRecord,
    ) -> io::Result<Self> {
        let slot = change.allocate(record)?;
        Ok(Self { kind: record.kind, ptr: arena.page(slot), backing: Backing::Arena(arena.clone(), slot) })
    }

    /// The arena slot of the page, when it lives in an arena.
    pub(crate) fn arena_slot(&self) -> Option<usize> {
        match &self.backing {
            Backing::Arena(_, slot) => Some(*slot),
            Backing::Own(_) => None,
        }
    }

    /// The object kind the page is laid out for.
    pub fn kind(&self) -> ObjectKind {
        self.kind
    }

    #[inline]
    fn slots(&self) -> &[AtomicU64; PAGE_SLOTS] {
        // SAFETY: `ptr` maps PAGE_SIZE bytes, page-aligned, for the life of `self`; AtomicU64 has
        // the size and alignment of u64.
        unsafe { &*(self.ptr.as_ptr() as *const [AtomicU64; PAGE_SLOTS]) }
    }

    /// Asks the processor to bring the line a refresh writes first (the page's sequence counter,
    /// or its first line for a page without one) into its cache, and the page into its address
    /// translation, ahead of the write: a hint, which changes nothing of the page and may be
    /// ignored.
    #[inline]
    pub fn prefetch(&self) {
        let first = &self.slots()[sequence_slot(self.kind).unwrap_or(0)];
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch only hints at memory to come: it reads nothing into the program and
        // does not fault, and `first` is in this page's mapping besides.
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                std::ptr::from_ref(first).cast::<i8>(),
            );
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = first;
    }

    /// The value of `counter`.
    #[inline]
    pub fn get(&self, counter: CounterId) -> u64 {
        debug_assert_eq!(counter.kind, self.kind);
        self.slots()[counter.slot()].load(Ordering::Relaxed)
    }

    /// Sets `counter` (single writer).
    #[inline]
    pub fn set(&self, counter: CounterId, value: u64) {
        debug_assert_eq!(counter.kind, self.kind);
        self.slots()[counter.slot()].store(value, Ordering::Relaxed);
    }

    /// Adds to `counter` with a plain load and store: only for the page's single writer.
    #[inline]
    pub fn add(&self, counter: CounterId, delta: u64) {
        let slot = &self.slots()[counter.slot()];
        slot.store(slot.load(Ordering::Relaxed).wrapping_add(delta), Ordering::Relaxed);
    }

    /// Adds to `counter` atomically: for counters with several writers.
    #[inline]
    pub fn fetch_add(&self, counter: CounterId, delta: u64) -> u64 {
        self.slots()[counter.slot()].fetch_add(delta, Ordering::Relaxed)
    }

    /// The page slots of histogram `counter` (a catalog row presented as a histogram).
    ///
    /// # Panics
    /// When `counter` does not leave room for a histogram before the end of the page: only ids
    /// made by hand can.
    #[inline]
    pub fn histogram_slots(&self, counter: CounterId) -> &[AtomicU64; HISTOGRAM_SLOTS] {
        debug_assert_eq!(counter.kind, self.kind);
        let start = counter.slot();
        let slots: &[AtomicU64] = &self.slots()[start..start + HISTOGRAM_SLOTS];
        slots.try_into().unwrap_or_else(|_| unreachable!("the range is HISTOGRAM_SLOTS long"))
    }

    /// Records a time of `ns` nanoseconds into histogram `counter`: a plain load and store of two
    /// slots, only for the page's single writer (the VP thread, on its exit path).
    #[inline]
    pub fn record_time(&self, counter: CounterId, ns: u64) {
        histogram::record(self.histogram_slots(counter), ns);
    }

    /// Opens a merge of many counters: the page's sequence counter stays odd until the returned
    /// guard drops, so readers using [`consistent_snapshot`](Self::consistent_snapshot) retry
    /// instead of seeing half of it. `None` for a page without hvstats' own group (only VP pages
    /// have one). Merges into one page must be serialized by the caller.
    pub fn begin_merge(&self) -> Option<SeqWrite<'_>> {
        sequence_slot(self.kind).map(|slot| SeqWrite::begin(&self.slots()[slot]))
    }

    /// Opens a merge that publishes a full refresh: as [`begin_merge`](Self::begin_merge), and
    /// inside the same window stamps the page's publication time ([`vp::PUBLISHED`]: now, in
    /// nanoseconds of `CLOCK_MONOTONIC`, the clock every process of the host shares and that no
    /// wall-clock step moves). A reader that copies the page consistently gets the counts and the
    /// time they were taken together, and takes rates over the time between two publications,
    /// never over its own clock. Only a merge that writes every counter the page's refreshes
    /// keep should publish: a partial one (a VP's intercepts at a hypercall) would date counts it
    /// did not take. `None`, and no stamp, for a page without a sequence counter.
    pub fn begin_publication(&self) -> Option<SeqWrite<'_>> {
        self.begin_publication_at(publication_time())
    }

    /// As [`begin_publication`](Self::begin_publication), stamping `now` (a
    /// [`publication_time`] taken after the counts were read): a writer that publishes many
    /// pages from one reading reads the clock once for all of them.
    pub fn begin_publication_at(&self, now: u64) -> Option<SeqWrite<'_>> {
        let merge = self.begin_merge()?;
        if let Some(slot) = publication_slots(self.kind).1 {
            self.slots()[slot].store(now, Ordering::Relaxed);
        }
        Some(merge)
    }

    /// A copy of the whole page from one moment: taken outside any merge
    /// ([`begin_merge`](Self::begin_merge)), retried for up to [`crate::patience::DEADLINE`]. A
    /// page without a sequence counter gives a plain copy, reported as consistent.
    pub fn consistent_snapshot(&self) -> SeqRead<StatsPage> {
        consistent_copy(self.kind, self.slots())
    }

    /// A copy of the whole page.
    pub fn snapshot(&self) -> StatsPage {
        let mut page = StatsPage::default();
        for (dst, src) in page.data.iter_mut().zip(self.slots()) {
            *dst = src.load(Ordering::Relaxed);
        }
        page
    }

    /// The file behind the page (the whole arena, for a page in one: the page lies at
    /// [`file_offset`](Self::file_offset)).
    pub fn fd(&self) -> BorrowedFd<'_> {
        match &self.backing {
            Backing::Own(file) => file.as_fd(),
            Backing::Arena(arena, _) => arena.fd(),
        }
    }

    /// Where the page lies in [`fd`](Self::fd)'s file.
    pub fn file_offset(&self) -> u64 {
        match &self.backing {
            Backing::Own(_) => 0,
            Backing::Arena(_, slot) => crate::arena::page_file_offset(*slot),
        }
    }

    /// A read-only mapping of this very page (to show it to a guest through a KVM memory slot).
    ///
    /// # Errors
    /// When the mapping fails.
    pub fn map_read_only(&self) -> io::Result<MappedPage> {
        MappedPage::map_at(self.fd(), self.file_offset())
    }

    /// The host address of the writable mapping.
    #[inline]
    pub fn host_address(&self) -> *mut u8 {
        self.ptr.as_ptr().cast()
    }
}

impl Drop for SharedPage {
    fn drop(&mut self) {
        match &self.backing {
            // SAFETY: `ptr` is our mapping of PAGE_SIZE bytes and nothing borrows it past `self`.
            Backing::Own(_) => unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), PAGE_SIZE);
            },
            Backing::Arena(arena, slot) => arena.release(*slot),
        }
    }
}

impl std::fmt::Debug for SharedPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPage").field("kind", &self.kind).finish_non_exhaustive()
    }
}

/// A read-only view of a stats page file, mapped without copying.
pub struct MappedPage {
    ptr: NonNull<u8>,
}

// SAFETY: the mapping is read-only and lives as long as the value.
unsafe impl Send for MappedPage {}
// SAFETY: as above.
unsafe impl Sync for MappedPage {}

impl MappedPage {
    /// The host address of the read-only mapping (to show it to a guest).
    pub fn host_address(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Maps the first page of `fd` read-only.
    ///
    /// # Errors
    /// When the file is not at least one page long or cannot be mapped.
    pub fn map(fd: BorrowedFd<'_>) -> io::Result<Self> {
        Self::map_at(fd, 0)
    }

    /// Maps the page at `offset` (page-aligned) of `fd` read-only.
    ///
    /// # Errors
    /// When the file does not hold a whole page there, or it cannot be mapped.
    pub(crate) fn map_at(fd: BorrowedFd<'_>, offset: u64) -> io::Result<Self> {
        let len = std::fs::File::from(fd.try_clone_to_owned()?).metadata()?.len();
        if !offset.is_multiple_of(PAGE_SIZE as u64) || len < offset.saturating_add(PAGE_SIZE as u64) {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "the file holds no whole page there"));
        }
        Ok(Self { ptr: map(fd, libc::PROT_READ, offset)? })
    }

    /// The value in slot `slot` at the moment of the call.
    pub fn slot(&self, slot: usize) -> u64 {
        // SAFETY: the mapping is PAGE_SIZE bytes, 8-aligned; the writer uses atomics, so we do too.
        let slots = unsafe { &*(self.ptr.as_ptr() as *const [AtomicU64; PAGE_SLOTS]) };
        slots[slot].load(Ordering::Relaxed)
    }

    /// A copy of the page at the moment of the call.
    pub fn snapshot(&self) -> StatsPage {
        let mut page = StatsPage::default();
        for (i, v) in page.data.iter_mut().enumerate() {
            *v = self.slot(i);
        }
        page
    }

    /// A copy of the page from one moment, as [`SharedPage::consistent_snapshot`], for a page of
    /// `kind`.
    pub fn consistent_snapshot(&self, kind: ObjectKind) -> SeqRead<StatsPage> {
        // SAFETY: the mapping is PAGE_SIZE bytes, 8-aligned; the writer uses atomics, so we do too.
        let slots = unsafe { &*(self.ptr.as_ptr() as *const [AtomicU64; PAGE_SLOTS]) };
        consistent_copy(kind, slots)
    }
}

/// Now as a page's publication time stamps it ([`SharedPage::begin_publication_at`]).
pub fn publication_time() -> u64 {
    monotonic_ns()
}

/// Now on `CLOCK_MONOTONIC`, in nanoseconds (0 if the clock cannot be read, which Linux never
/// refuses for this clock).
pub(crate) fn monotonic_ns() -> u64 {
    os::clock_time(libc::CLOCK_MONOTONIC).map_or(0, |t| u64::try_from(t.as_nanos()).unwrap_or(u64::MAX))
}

/// The slot of the sequence counter on `kind`'s page, if the page has hvstats' own group.
pub(crate) fn sequence_slot(kind: ObjectKind) -> Option<usize> {
    publication_slots(kind).0
}

/// The slots of `kind`'s page sequence counter and publication time, where it has them: worked
/// out once, as every page of every VM is published through them at every refresh.
fn publication_slots(kind: ObjectKind) -> (Option<usize>, Option<usize>) {
    type Slots = [(Option<usize>, Option<usize>); ObjectKind::ALL.len()];
    static SLOTS: std::sync::OnceLock<Slots> = std::sync::OnceLock::new();
    let slots = SLOTS.get_or_init(|| {
        let mut slots: Slots = Default::default();
        for kind in ObjectKind::ALL {
            let layout = PageLayout::of(kind);
            let sequence = (kind == ObjectKind::Vp && layout.group_offset(GroupKind::Hvstats).is_some())
                .then(|| vp::SEQUENCE.slot());
            slots[kind as usize] = (sequence, layout.slot_of(vp::PUBLISHED));
        }
        slots
    });
    slots[kind as usize]
}

fn consistent_copy(kind: ObjectKind, slots: &[AtomicU64; PAGE_SLOTS]) -> SeqRead<StatsPage> {
    let copy = || {
        let mut page = StatsPage::default();
        for (dst, src) in page.data.iter_mut().zip(slots) {
            *dst = src.load(Ordering::Relaxed);
        }
        page
    };
    match sequence_slot(kind) {
        Some(slot) => {
            let mut patience = Patience::alone();
            seqcount::read_while(&slots[slot], || patience.wait(), copy)
        }
        None => SeqRead::Consistent { value: copy(), sequence: 0 },
    }
}

impl Drop for MappedPage {
    fn drop(&mut self) {
        // SAFETY: our mapping of PAGE_SIZE bytes.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), PAGE_SIZE) };
    }
}

fn map(fd: BorrowedFd<'_>, prot: libc::c_int, offset: u64) -> io::Result<NonNull<u8>> {
    use std::os::fd::AsRawFd;
    let offset = libc::off_t::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: we map PAGE_SIZE bytes of a file we hold open, at an address the kernel picks.
    let ptr = unsafe {
        libc::mmap(std::ptr::null_mut(), PAGE_SIZE, prot, libc::MAP_SHARED, fd.as_raw_fd(), offset)
    };
    os::check_map(ptr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hvstats_abi::catalog::vp;
    use hvstats_abi::page::PageView;
    use zerocopy::IntoBytes;

    #[test]
    fn a_publication_dates_its_counts_under_the_sequence_counter_and_a_partial_merge_does_not() {
        let page = SharedPage::anonymous(ObjectKind::Vp).unwrap();
        assert_eq!(page.get(vp::PUBLISHED), 0, "never published");
        let before = monotonic_ns();
        {
            let _publication = page.begin_publication().unwrap();
            assert_eq!(page.get(vp::SEQUENCE) % 2, 1, "stamped inside the window");
            page.set(vp::CPUID_INSTRUCTIONS, 5);
        }
        let first = page.get(vp::PUBLISHED);
        assert!(first >= before && first <= monotonic_ns(), "{before} {first}");
        // A reader's consistent copy holds the counts and their time together.
        let copy = MappedPage::map(page.fd()).unwrap().consistent_snapshot(ObjectKind::Vp);
        let view_page = copy.into_value();
        let view = PageView::read(view_page.as_bytes(), ObjectKind::Vp).unwrap();
        assert_eq!((view.get(vp::CPUID_INSTRUCTIONS), view.get(vp::PUBLISHED)), (5, first));
        // A merge of part of the counts leaves the time of the last full refresh.
        drop(page.begin_merge());
        assert_eq!(page.get(vp::PUBLISHED), first);
        std::thread::sleep(std::time::Duration::from_millis(2));
        drop(page.begin_publication());
        assert!(page.get(vp::PUBLISHED) > first);
        // A page without a sequence counter is neither merged nor dated.
        let partition = SharedPage::anonymous(ObjectKind::Partition).unwrap();
        assert!(partition.begin_publication().is_none());
    }

    #[test]
    fn counters_written_are_read_back_through_a_second_mapping() {
        let page = SharedPage::anonymous(ObjectKind::Vp).unwrap();
        page.set(vp::CPUID_INSTRUCTIONS, 41);
        page.add(vp::CPUID_INSTRUCTIONS, 1);
        page.fetch_add(vp::HYPERCALLS, 7);
        let reader = MappedPage::map(page.fd()).unwrap();
        let copy = reader.snapshot();
        let view = PageView::read(copy.as_bytes(), ObjectKind::Vp).unwrap();
        assert_eq!(view.get(vp::CPUID_INSTRUCTIONS), 42);
        assert_eq!(view.get(vp::HYPERCALLS), 7);
    }
}
