//! A reader's view of one arena file: mapped once (read-only) when the file cannot shrink under
//! us, read with `pread` otherwise, and never trusted.
//!
//! The file is mapped only when it belongs to the effective user or root: nobody else can then
//! truncate it under the mapping, which would turn a read into SIGBUS. Any other file is read with
//! `pread`, which reports a short read instead. Its owner still can truncate it: each mapping is
//! registered with [`ShrinkGuard`], so a read past the new end reads zeros instead of raising
//! SIGBUS, every copy that met one is thrown away, and the file is read with `pread` from then
//! on ([`ArenaReader::shrunk`] says so). How much is read comes from the file itself
//! (`fstat`) bounded by what its header says, never from the header alone; every entry and page
//! copy is checked against the entry's sequence word ([`crate::index`]).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};

use hvstats_abi::PAGE_SIZE;
use hvstats_abi::page::PAGE_SLOTS;
use hvstats_host::os;

use crate::index::{
    self, CHUNK_BYTES, CHUNK_SLOTS, ENTRY_BYTES, ENTRY_WORDS, FormatError, HEADER_BYTES, Header, ew, hw,
};
use crate::patience::Patience;
use crate::runtime_dir;
use crate::shrink_guard::ShrinkGuard;

/// Why an arena could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ArenaError {
    /// The file could not be read, stat'ed or mapped.
    #[error("cannot read the arena")]
    Io(#[source] io::Error),
    /// The header is not one this build reads.
    #[error("not an arena this build reads")]
    Format(#[source] FormatError),
}

/// How a reader reaches an arena's words.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadPath {
    /// Map the file when that is safe (it belongs to the effective user or root), `pread` it
    /// otherwise: what every reader does.
    #[default]
    MapWhenSafe,
    /// Always `pread`, as for another user's file: the path an unprivileged reader of a root
    /// publisher takes, chosen on purpose (to test it, or to compare its cost).
    Pread,
}

enum Access {
    Mapped { ptr: NonNull<u8>, len: usize },
    Pread,
}

/// One arena file as a reader sees it.
pub struct ArenaReader {
    file: File,
    access: Access,
    chunks: usize,
    header: Header,
    /// Whether this processor reads an aligned 16-byte word whole ([`copy_words`]): asked once,
    /// when opened, not at every read.
    wide: bool,
    /// The mapping's registration with the SIGBUS handler, while mapped.
    guard: Option<ShrinkGuard>,
    /// True once the file shrank under the mapping (it is read with `pread` since).
    shrank: bool,
    /// True once a wait for a write under way ran out ([`Patience`]).
    stalled: AtomicBool,
}

// SAFETY: the mapping is read-only and accessed through atomics; it lives as long as the value.
unsafe impl Send for ArenaReader {}
// SAFETY: as above.
unsafe impl Sync for ArenaReader {}

impl std::fmt::Debug for ArenaReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArenaReader")
            .field("mapped", &matches!(self.access, Access::Mapped { .. }))
            .field("chunks", &self.chunks)
            .finish_non_exhaustive()
    }
}

/// An entry or page that changed, vanished or stayed busy while being read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Changed;

/// Why a copy of a page guarded by its own sequence counter failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageCopyError {
    /// The slot was freed or reused, or its entry kept changing.
    Changed,
    /// The page's sequence counter showed a merge under way through every try (a writer that
    /// stopped half-way leaves it so): the copy would mix values from before and after it.
    Torn,
}

impl From<Changed> for PageCopyError {
    fn from(_: Changed) -> Self {
        PageCopyError::Changed
    }
}

/// The chunks a reader takes from an arena whose header announces `announced` chunks in a file of
/// `file_size` bytes: no more than the file holds, and no more than a publisher ever makes
/// ([`crate::arena::MAX_SLOTS`]), so a sparse file of a terabyte cannot make a reader scan for
/// minutes.
fn visible_chunks(announced: usize, file_size: u64) -> usize {
    let held = usize::try_from(file_size).unwrap_or(usize::MAX).saturating_sub(HEADER_BYTES) / CHUNK_BYTES;
    announced.min(held).min(crate::arena::MAX_SLOTS / CHUNK_SLOTS)
}

/// True when storage backs at least half of the first `bytes` of the file `st` describes. A
/// publisher allocates each chunk when it makes it (`posix_fallocate`), so its arena is backed
/// whole; a file that is mostly holes was not made by one, and is read without mapping it.
fn backed(st: &libc::stat, bytes: usize) -> bool {
    let allocated = u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512);
    allocated >= (bytes as u64) / 2
}

impl ArenaReader {
    /// Reads the header of `file` and maps it when that is safe.
    ///
    /// # Errors
    /// When it cannot be read or is not an arena.
    pub fn open(file: File) -> Result<Self, ArenaError> {
        Self::open_with(file, ReadPath::MapWhenSafe)
    }

    /// Reads the header of `file` and reaches its words by `path` (mapped only when `path`
    /// allows it and it is safe).
    ///
    /// # Errors
    /// When it cannot be read or is not an arena.
    pub fn open_with(file: File, path: ReadPath) -> Result<Self, ArenaError> {
        let st = runtime_dir::fstat(file.as_fd()).map_err(ArenaError::Io)?;
        let trusted = path == ReadPath::MapWhenSafe && (st.st_uid == runtime_dir::euid() || st.st_uid == 0);
        let mut bytes = vec![0u8; HEADER_BYTES];
        let got = read_at(&file, &mut bytes, 0).map_err(ArenaError::Io)?;
        let header = Header::decode(&bytes[..got]).map_err(ArenaError::Format)?;
        let access =
            if trusted { Access::Mapped { ptr: NonNull::dangling(), len: 0 } } else { Access::Pread };
        let mut reader = Self {
            file,
            access,
            chunks: 0,
            header,
            wide: wide_loads_are_atomic(),
            guard: None,
            shrank: false,
            stalled: AtomicBool::new(false),
        };
        reader.grow().map_err(ArenaError::Io)?;
        Ok(reader)
    }

    /// The header as read when opened (chunks and layout sequence as of then).
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The arena file read (the same open file description as given to [`open`](Self::open)).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// True when the arena is mapped (not read with pread).
    pub fn is_mapped(&self) -> bool {
        matches!(self.access, Access::Mapped { .. }) && !self.shrunk()
    }

    /// True once the file shrank under this reader's mapping (its owner truncated it): a read
    /// past its new end met zeros, not the file, and was thrown away; it is read with `pread`
    /// from then on, which sees the file's real end.
    pub fn shrunk(&self) -> bool {
        self.shrank || self.guard.as_ref().is_some_and(ShrinkGuard::shrunk)
    }

    /// Unmaps the file, to read it with `pread` from now on.
    fn unmap(&mut self) {
        // Unregistered first: nothing reads the mapping past this point.
        self.guard = None;
        if let Access::Mapped { ptr, len } = self.access
            && len > 0
        {
            // SAFETY: our mapping; nothing borrows it past this call (borrows of the reader's
            // memory end with each read).
            unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
        }
        self.access = Access::Pread;
    }

    /// Slots the reader can see now.
    pub fn slots(&self) -> usize {
        self.chunks * CHUNK_SLOTS
    }

    fn header_word(&self, word: usize) -> u64 {
        if let Some(w) = self.atomics(word * 8, 1) {
            let value = w[0].load(Ordering::Acquire);
            // A load past a shrunk file's end read zeros: read the file instead.
            if !self.shrunk() {
                return value;
            }
        }
        let mut b = [0u8; 8];
        match read_at(&self.file, &mut b, (word * 8) as u64) {
            Ok(8) => u64::from_le_bytes(b),
            _ => 0,
        }
    }

    /// When the publisher last refreshed its counters, in µs since the Unix epoch, as its header
    /// says now (`None` before its first refresh). One time for the whole arena, outside every
    /// page's sequence counter: readers of pages that carry their own publication time
    /// (`vp::PUBLISHED`) use that instead.
    pub fn refreshed_us(&self) -> Option<u64> {
        Some(self.header_word(hw::REFRESHED_US)).filter(|&us| us != 0)
    }

    /// The period between the publisher's last two refreshes, as its header says now (`None`
    /// before it refreshed twice).
    pub fn refresh_period(&self) -> Option<std::time::Duration> {
        match self.header_word(hw::REFRESH_PERIOD_US) {
            0 => None,
            us => Some(std::time::Duration::from_micros(us)),
        }
    }

    /// The layout sequence now (one load): it changes with every index change.
    pub(crate) fn layout_seq(&self) -> u64 {
        self.header_word(hw::LAYOUT_SEQ)
    }

    /// Follows the file's growth: maps (or accepts) the chunks the writer has made that the file
    /// really holds. Returns true when more slots became visible.
    ///
    /// # Errors
    /// When the file cannot be stat'ed or mapped.
    pub fn grow(&mut self) -> io::Result<bool> {
        if self.shrunk() && !self.shrank {
            self.shrank = true;
            self.unmap();
        }
        let announced = usize::try_from(self.header_word(hw::CHUNKS)).unwrap_or(usize::MAX);
        let unmapped = matches!(self.access, Access::Mapped { len: 0, .. });
        if announced <= self.chunks && !unmapped {
            return Ok(false);
        }
        let st = runtime_dir::fstat(self.file.as_fd())?;
        let chunks = visible_chunks(announced, u64::try_from(st.st_size).unwrap_or(0));
        if chunks <= self.chunks && !unmapped {
            return Ok(false);
        }
        if matches!(self.access, Access::Mapped { .. }) && !backed(&st, index::file_bytes(chunks)) {
            // Holes where a publisher's chunks would be: read with pread rather than map address
            // space no storage backs (a sparse file claiming every chunk would map 1.3 GB).
            self.unmap();
        }
        if let Access::Mapped { .. } = self.access {
            let new_len = index::file_bytes(chunks);
            // SAFETY: a read-only shared mapping of bytes the file holds (checked by fstat just
            // now; the file belongs to us or root, so no one else can shrink it).
            let new = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    new_len,
                    libc::PROT_READ,
                    libc::MAP_SHARED,
                    self.file.as_raw_fd(),
                    0,
                )
            };
            let ptr = os::check_map(new)?;
            self.unmap();
            match ShrinkGuard::register(ptr.as_ptr(), new_len) {
                Some(guard) => {
                    self.guard = Some(guard);
                    self.access = Access::Mapped { ptr, len: new_len };
                }
                // No place for it with the SIGBUS handler: a truncation could not be survived.
                None => {
                    // SAFETY: the mapping just made; nothing borrows it.
                    unsafe { libc::munmap(ptr.as_ptr().cast(), new_len) };
                }
            }
        }
        let grew = chunks > self.chunks;
        self.chunks = chunks;
        Ok(grew)
    }

    /// True unless slot `slot` no longer holds the object of generation `generation` (freed or
    /// reused): what a reader asks after a copy failed, to tell an object removed while it was
    /// read from one whose entry stayed busy.
    pub fn holds(&self, slot: usize, generation: u64) -> bool {
        match self.entry_words(slot) {
            Ok(words) => words[ew::GENERATION] == generation && words[ew::STATE] != index::state::FREE,
            // Out of sight (the file shrank) is gone; busy all along is still there.
            Err(Changed) => slot < self.slots(),
        }
    }

    /// A wait for a write under way, remembering whether this file's last one ran out.
    fn patience(&self) -> Patience<'_> {
        Patience::of(&self.stalled)
    }

    fn atomics(&self, offset: usize, count: usize) -> Option<&[AtomicU64]> {
        match self.access {
            Access::Mapped { ptr, len } if offset + count * 8 <= len && !self.shrunk() => {
                // SAFETY: inside the mapping, 8-aligned; the writer uses atomics, so do we.
                Some(unsafe {
                    std::slice::from_raw_parts(ptr.as_ptr().add(offset).cast::<AtomicU64>(), count)
                })
            }
            _ => None,
        }
    }

    fn pread_words(&self, offset: usize, out: &mut [u64]) -> Result<(), Changed> {
        let mut bytes = vec![0u8; out.len() * 8];
        match read_at(&self.file, &mut bytes, offset as u64) {
            Ok(n) if n == bytes.len() => {
                for (w, b) in out.iter_mut().zip(bytes.chunks_exact(8)) {
                    *w = u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
                }
                Ok(())
            }
            _ => Err(Changed),
        }
    }

    /// A consistent copy of slot `slot`'s entry words.
    ///
    /// # Errors
    /// When the slot is out of sight or the writer kept changing it.
    pub fn entry_words(&self, slot: usize) -> Result<[u64; ENTRY_WORDS], Changed> {
        if slot >= self.slots() {
            return Err(Changed);
        }
        let offset = index::entry_offset(slot);
        match self.atomics(offset, ENTRY_WORDS) {
            Some(a) => {
                let entry =
                    index::read_entry(a.try_into().map_err(|_| Changed)?, self.patience()).ok_or(Changed);
                // Read past a shrunk file's end: read it again from the file.
                if self.shrunk() { self.entry_words(slot) } else { entry }
            }
            None => {
                let mut patience = self.patience();
                loop {
                    let mut words = [0u64; ENTRY_WORDS];
                    self.pread_words(offset, &mut words)?;
                    let mut seq = [0u64; 1];
                    self.pread_words(offset, &mut seq)?;
                    if words[ew::SEQ] % 2 == 0 && seq[0] == words[ew::SEQ] {
                        patience.succeeded();
                        return Ok(words);
                    }
                    if !patience.wait() {
                        return Err(Changed);
                    }
                }
            }
        }
    }

    /// Copies slot `slot`'s page into `out`, provided the slot still holds the object of
    /// generation `generation` (live) before and after the copy.
    ///
    /// # Errors
    /// [`Changed`] when the slot was freed or reused, or kept changing.
    pub fn read_page(
        &self,
        slot: usize,
        generation: u64,
        out: &mut [u64; PAGE_SLOTS],
    ) -> Result<(), Changed> {
        self.read_page_prefix(slot, generation, out)
    }

    /// As [`read_page`](Self::read_page), copying only the first `out.len()` words of the page
    /// (a reader that knows the layout copies the counters, not 4 KiB).
    ///
    /// # Errors
    /// [`Changed`] when the slot was freed or reused, or kept changing.
    pub fn read_page_prefix(&self, slot: usize, generation: u64, out: &mut [u64]) -> Result<(), Changed> {
        let out = match out.len() {
            0..=PAGE_SLOTS => out,
            _ => &mut out[..PAGE_SLOTS],
        };
        if slot >= self.slots() {
            return Err(Changed);
        }
        let page_offset = index::page_offset(slot);
        match self.atomics(page_offset, out.len()) {
            Some(page) => {
                let copied = self.under_entry(slot, generation, || {
                    copy_words(page, out, self.wide);
                    Ok(Some(()))
                });
                // Read past a shrunk file's end: read it again from the file.
                if self.shrunk() {
                    self.read_page_prefix(slot, generation, out)
                } else {
                    copied.map_err(|_| Changed)
                }
            }
            None => self
                .under_entry(slot, generation, || self.pread_words(page_offset, out).map(Some))
                .map_err(|_| Changed),
        }
    }

    /// Runs `copy` while slot `slot` holds the object of generation `generation` (live), between
    /// two readings of its entry's sequence, and returns what `copy` gave when the entry did not
    /// change meanwhile: the one seqlock retry loop of every page copy. `copy` gives `None` when
    /// the page's own sequence showed a merge under way (a torn copy), and is tried again. Mapped,
    /// a busy or changed entry is retried too, for as long as [`Patience`] waits; read with
    /// `pread`, a busy or changed entry ends the copy.
    ///
    /// # Errors
    /// [`PageCopyError::Changed`] when the slot was freed or reused, its entry kept changing, or
    /// `copy` failed; [`PageCopyError::Torn`] when the last try was torn.
    fn under_entry<T>(
        &self,
        slot: usize,
        generation: u64,
        mut copy: impl FnMut() -> Result<Option<T>, Changed>,
    ) -> Result<T, PageCopyError> {
        let entry_offset = index::entry_offset(slot);
        let mapped = self.atomics(entry_offset, ENTRY_WORDS);
        let mut patience = self.patience();
        let mut torn = false;
        loop {
            let head = self.entry_head(mapped, entry_offset)?;
            if head[ew::SEQ].is_multiple_of(2) {
                if head[ew::GENERATION] != generation || head[ew::STATE] == index::state::FREE {
                    return Err(PageCopyError::Changed);
                }
                let value = copy()?;
                fence(Ordering::Acquire);
                if self.entry_seq(mapped, entry_offset)? == head[ew::SEQ] {
                    match value {
                        Some(value) => {
                            patience.succeeded();
                            return Ok(value);
                        }
                        None => torn = true,
                    }
                } else if mapped.is_none() {
                    return Err(PageCopyError::Changed);
                }
            } else if mapped.is_none() {
                return Err(PageCopyError::Changed);
            }
            if !patience.wait() {
                // Out of time: torn when the last try overlapped a merge into the page.
                return Err(if torn { PageCopyError::Torn } else { PageCopyError::Changed });
            }
        }
    }

    /// The first words of the entry at `offset` (sequence, generation, state): loaded from
    /// `mapped` when the entry is mapped, read with `pread` otherwise.
    fn entry_head(&self, mapped: Option<&[AtomicU64]>, offset: usize) -> Result<[u64; 4], Changed> {
        let mut head = [0u64; 4];
        match mapped {
            Some(entry) => {
                head[ew::SEQ] = entry[ew::SEQ].load(Ordering::Acquire);
                head[ew::GENERATION] = entry[ew::GENERATION].load(Ordering::Relaxed);
                head[ew::STATE] = entry[ew::STATE].load(Ordering::Relaxed);
            }
            None => self.pread_words(offset, &mut head)?,
        }
        Ok(head)
    }

    /// The entry's sequence word again, after a copy (ordered by the caller's fence).
    fn entry_seq(&self, mapped: Option<&[AtomicU64]>, offset: usize) -> Result<u64, Changed> {
        match mapped {
            Some(entry) => Ok(entry[ew::SEQ].load(Ordering::Relaxed)),
            None => {
                let mut seq = [0u64; 1];
                self.pread_words(offset, &mut seq)?;
                Ok(seq[0])
            }
        }
    }
}

impl ArenaReader {
    /// As [`read_page_prefix`](Self::read_page_prefix), and from one moment of the page itself:
    /// the copy is taken between two loads of the page's sequence counter in slot `sequence`
    /// ([`hvstats_abi::seqcount`]) and retried while a merge is under way, for as long as
    /// [`Patience`] waits (up to [`crate::patience::DEADLINE`]). What a consistent read costs
    /// over a plain one is two loads and a compare inside the same retry loop.
    ///
    /// # Errors
    /// [`PageCopyError::Changed`] as `read_page_prefix`; [`PageCopyError::Torn`] when every try
    /// overlapped a merge.
    pub fn read_page_prefix_consistent(
        &self,
        slot: usize,
        generation: u64,
        out: &mut [u64],
        sequence: usize,
    ) -> Result<(), PageCopyError> {
        let out = match out.len() {
            0..=PAGE_SLOTS => out,
            _ => &mut out[..PAGE_SLOTS],
        };
        if slot >= self.slots() || sequence >= PAGE_SLOTS {
            return Err(PageCopyError::Changed);
        }
        let page_offset = index::page_offset(slot);
        match self.atomics(page_offset, out.len().max(sequence + 1)) {
            Some(page) => {
                let seq = &page[sequence];
                let copied = self.under_entry(slot, generation, || {
                    let before = seq.load(Ordering::Acquire);
                    if !before.is_multiple_of(2) {
                        return Ok(None);
                    }
                    copy_words(page, out, self.wide);
                    fence(Ordering::Acquire);
                    Ok((seq.load(Ordering::Relaxed) == before).then_some(()))
                });
                // Read past a shrunk file's end: read it again from the file.
                match self.shrunk() {
                    true => self.read_page_prefix_consistent(slot, generation, out, sequence),
                    false => copied,
                }
            }
            None => {
                let seq_offset = page_offset + sequence * 8;
                self.under_entry(slot, generation, || {
                    let (mut before, mut after) = ([0u64; 1], [0u64; 1]);
                    self.pread_words(seq_offset, &mut before)?;
                    self.pread_words(page_offset, out)?;
                    self.pread_words(seq_offset, &mut after)?;
                    Ok((before == after && before[0].is_multiple_of(2)).then_some(()))
                })
            }
        }
    }
}

impl Drop for ArenaReader {
    fn drop(&mut self) {
        self.unmap();
    }
}

/// True when this processor reads an aligned 16-byte word in one access, so that a copy by 16-byte
/// loads sees each 8-byte counter whole: Intel and AMD guarantee it of aligned `MOVDQA` on every
/// processor that supports AVX (Intel SDM vol. 3A, "Guaranteed Atomic Operations"; AMD APM
/// vol. 2, "Access Atomicity").
fn wide_loads_are_atomic() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Copies the first `min(src.len(), dst.len())` words of `src` into `dst`, each word read whole
/// (a writer's store to it is seen entirely or not at all), as a relaxed atomic load would.
///
/// This is a reader's hot loop (a VP page is 338 words, a snapshot reads tens of thousands of
/// pages), and word-by-word atomic loads are never vectorised: where `wide` says the processor
/// reads an aligned 16-byte word whole, the words are copied in aligned 16-byte pairs instead,
/// half the loads and stores, by one routine whatever the caller ([`copy_pairs`]); an odd word
/// left over, or every word elsewhere, by an atomic load.
fn copy_words(src: &[AtomicU64], dst: &mut [u64], wide: bool) {
    let n = src.len().min(dst.len());
    let done = if wide { copy_whole_pairs(&src[..n], &mut dst[..n]) } else { 0 };
    for (d, s) in dst[done..n].iter_mut().zip(&src[done..n]) {
        *d = s.load(Ordering::Relaxed);
    }
}

/// Copies the whole 16-byte pairs of `src` (as many words as both hold, rounded down to even)
/// into `dst` by aligned 16-byte loads, when `src` is 16-byte aligned; the words copied. Only
/// where [`wide_loads_are_atomic`].
#[cfg(target_arch = "x86_64")]
fn copy_whole_pairs(src: &[AtomicU64], dst: &mut [u64]) -> usize {
    let pairs = src.len().min(dst.len()) / 2;
    if pairs == 0 || !(src.as_ptr() as usize).is_multiple_of(16) {
        return 0;
    }
    // SAFETY: `src` holds at least `pairs * 2` words from a 16-byte aligned start, readable (a
    // live shared slice), and `dst` as many, writable and ours alone (`&mut`); `pairs` is at
    // least 1; the caller found AVX ([`wide_loads_are_atomic`]), which `copy_pairs` needs. The
    // assembly reads `src` only with aligned 16-byte loads (VEX.128 `VMOVDQA`), each of which
    // reads its two words whole on such a processor, and is a compiler barrier for memory like
    // any `asm!` without `nomem`, so it stays between the loads that order it in its caller.
    unsafe { copy_pairs(src.as_ptr().cast(), dst.as_mut_ptr(), pairs) };
    pairs * 2
}

/// Elsewhere no load is known to read two words whole: nothing is copied here.
#[cfg(not(target_arch = "x86_64"))]
fn copy_whole_pairs(_src: &[AtomicU64], _dst: &mut [u64]) -> usize {
    0
}

/// Copies `pairs` runs of 16 bytes from `src` (16-byte aligned) to `dst` by aligned 16-byte
/// loads: four at a time in a loop aligned to 32 bytes (so every caller's copy runs the very same
/// instructions from the same place), the rest one by one. VEX-encoded, so it never pays for a
/// switch between SSE and AVX code.
///
/// # Safety
/// The processor must support AVX; `src` must be 16-byte aligned and readable for `pairs * 16`
/// bytes, `dst` writable for as many, the two not overlapping, and `pairs` at least 1.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline(never)]
unsafe fn copy_pairs(src: *const u64, dst: *mut u64, pairs: usize) {
    // SAFETY: as the caller promises; the loops copy `pairs` (≥ 1) runs of 16 bytes in all.
    unsafe {
        std::arch::asm!(
            "mov {rest:e}, {pairs:e}",
            "and {rest:e}, 3",
            "shr {pairs}, 2",
            "jz 3f",
            ".p2align 5",
            "2:",
            "vmovdqa {a}, xmmword ptr [{src}]",
            "vmovdqa {b}, xmmword ptr [{src} + 16]",
            "vmovdqa {c}, xmmword ptr [{src} + 32]",
            "vmovdqa {d}, xmmword ptr [{src} + 48]",
            "vmovdqu xmmword ptr [{dst}], {a}",
            "vmovdqu xmmword ptr [{dst} + 16], {b}",
            "vmovdqu xmmword ptr [{dst} + 32], {c}",
            "vmovdqu xmmword ptr [{dst} + 48], {d}",
            "add {src}, 64",
            "add {dst}, 64",
            "dec {pairs}",
            "jnz 2b",
            "3:",
            "test {rest:e}, {rest:e}",
            "jz 5f",
            "4:",
            "vmovdqa {a}, xmmword ptr [{src}]",
            "vmovdqu xmmword ptr [{dst}], {a}",
            "add {src}, 16",
            "add {dst}, 16",
            "dec {rest:e}",
            "jnz 4b",
            "5:",
            src = inout(reg) src => _,
            dst = inout(reg) dst => _,
            pairs = inout(reg) pairs => _,
            rest = out(reg) _,
            a = out(xmm_reg) _,
            b = out(xmm_reg) _,
            c = out(xmm_reg) _,
            d = out(xmm_reg) _,
            options(nostack),
        );
    }
}

/// `pread` until `buf` is full or the file ends; the bytes read.
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

const _: () = assert!(ENTRY_BYTES.is_multiple_of(8) && PAGE_SIZE.is_multiple_of(8));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_words_copies_every_length_and_alignment_both_ways() {
        let words: Vec<AtomicU64> = (0..80u64).map(|i| AtomicU64::new(i * 0x0101_0101_0101 + 7)).collect();
        for wide in [false, wide_loads_are_atomic()] {
            for start in 0..3 {
                for len in 0..(words.len() - start) {
                    let src = &words[start..start + len];
                    let mut dst = vec![u64::MAX; len + 1];
                    copy_words(src, &mut dst, wide);
                    let expected: Vec<u64> = src.iter().map(|w| w.load(Ordering::Relaxed)).collect();
                    assert_eq!(&dst[..len], &expected[..], "start {start} len {len} wide {wide}");
                    assert_eq!(dst[len], u64::MAX, "nothing past the source");
                }
            }
        }
    }

    #[test]
    fn copy_words_sees_each_word_whole_while_a_writer_stores_to_it() {
        // A page's alignment, so the wide path runs where the processor has it.
        #[repr(align(4096))]
        struct Page([AtomicU64; 64]);
        let page = Page(std::array::from_fn(|_| AtomicU64::new(0)));
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                // Each store writes a word whose halves are equal: a torn read shows them unequal.
                let mut v = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    v = v.wrapping_add(0x0123_4567) & 0xFFFF_FFFF;
                    for w in &page.0 {
                        w.store(v | (v << 32), Ordering::Relaxed);
                    }
                }
            });
            let mut out = [0u64; 64];
            // Copies go on until they have seen the writer's stores change a thousand times
            // (a reader faster than the writer's start would otherwise copy only zeros).
            let (mut copies, mut changes, mut last) = (0u32, 0u32, 0u64);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
            while copies < 30_000 || changes < 1000 {
                assert!(std::time::Instant::now() < deadline, "{copies} copies saw {changes} stores");
                copy_words(&page.0, &mut out, wide_loads_are_atomic());
                for w in out {
                    assert_eq!(w >> 32, w & 0xFFFF_FFFF, "{w:#x} is torn");
                }
                changes += u32::from(out[0] != last);
                last = out[0];
                copies += 1;
            }
            stop.store(true, Ordering::Relaxed);
        });
    }

    #[test]
    fn a_reader_takes_no_more_chunks_than_the_file_holds_or_a_publisher_makes() {
        let bytes = |chunks: usize| (HEADER_BYTES + chunks * CHUNK_BYTES) as u64;
        assert_eq!(visible_chunks(3, bytes(3)), 3);
        assert_eq!(visible_chunks(3, bytes(2) + 100), 2, "a chunk the file does not hold whole");
        assert_eq!(visible_chunks(usize::MAX, bytes(5)), 5, "the header's count is not believed");
        assert_eq!(visible_chunks(1, bytes(5)), 1);
        assert_eq!(visible_chunks(0, 0), 0);
        // A sparse terabyte announcing everything: capped at what a publisher ever makes.
        let most = crate::arena::MAX_SLOTS / CHUNK_SLOTS;
        assert_eq!(visible_chunks(usize::MAX, 1 << 40), most);
        assert_eq!(visible_chunks(usize::MAX, u64::MAX), most);
    }
}
