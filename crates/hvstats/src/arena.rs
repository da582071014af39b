//! The writer's side of an arena: one shared-memory file holding the stats pages of many objects
//! and the index that describes them (format in [`crate::index`]).
//!
//! One fd and one address range per arena, not per page: the writer reserves a large range of
//! address space once and maps each chunk of the file at its place in it as the file grows, so
//! every page keeps its address for the life of the arena (a KVM memory slot or a VP thread may
//! hold it). Storage is allocated (`fallocate`) a chunk at a time when the chunk is made, so a full
//! filesystem is an error when an object is created, never a SIGBUS when a counter is written.
//!
//! Adding an object pops a free slot (or takes the next unused one) and removing it pushes the
//! slot back: O(1), no rewrite of anything else. A slot is released only when the last
//! [`SharedPage`](crate::SharedPage) of its object is dropped, so a writer that still holds a
//! removed object's page can never scribble on the slot's next object; its reuse bumps the
//! entry's generation.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::sync::{Mutex, MutexGuard};

use hvstats_abi::page::{PAGE_SLOTS, PageLayout};
use hvstats_abi::{ObjectKind, PAGE_SIZE};
use hvstats_host::os;

use crate::index::{
    self, CHUNK_BYTES, CHUNK_SLOTS, ENTRY_WORDS, HEADER_BYTES, Header, InstanceDescription, Role, ew, hw,
};

/// Objects an arena can hold at most (the address range it reserves).
pub const MAX_SLOTS: usize = 1 << 20;

/// What an index entry says about a new object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectRecord {
    /// Hypervisor, LP, partition or VP: what `id` and `index` mean.
    pub kind: ObjectKind,
    /// Partition id, LP index, or 0.
    pub id: u64,
    /// VP index, host CPU, or 0.
    pub index: u32,
    /// A partition's VP count; 0 for every other kind.
    pub vp_count: u64,
}

struct Slots {
    chunks: usize,
    next_unused: usize,
    free: Vec<usize>,
}

/// One arena file mapped by its writer.
pub struct Arena {
    file: File,
    base: NonNull<u8>,
    reserved: usize,
    max_slots: usize,
    slots: Mutex<Slots>,
}

// SAFETY: the mapping is shared memory accessed through atomics only; the slot table is behind a
// mutex.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena").field("fd", &self.file.as_raw_fd()).finish_non_exhaustive()
    }
}

/// Allocates `len` bytes of `file` from `offset` (growing it), so later stores cannot fault.
fn allocate(file: &File, offset: usize, len: usize) -> io::Result<()> {
    // SAFETY: plain syscall on an fd we own; no memory is passed.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), offset as libc::off_t, len as libc::off_t) };
    os::check_errno(rc)
}

impl Arena {
    /// Lays out a new arena in `file` (empty, opened read-write) for at most `max_slots` objects,
    /// with its first chunk allocated.
    ///
    /// # Errors
    /// When storage cannot be allocated (a full filesystem: `ENOSPC`) or mapped.
    pub fn create(
        file: File,
        role: Role,
        description: &InstanceDescription,
        max_slots: usize,
    ) -> io::Result<Self> {
        let max_slots = max_slots.clamp(1, MAX_SLOTS);
        let max_chunks = max_slots.div_ceil(CHUNK_SLOTS);
        let reserved = index::file_bytes(max_chunks);
        allocate(&file, 0, HEADER_BYTES)?;
        // SAFETY: a fresh anonymous PROT_NONE reservation at an address the kernel picks; nothing
        // can touch it until chunks are mapped over it below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserved,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        let base = os::check_map(base)?;
        let arena = Self {
            file,
            base,
            reserved,
            max_slots,
            slots: Mutex::new(Slots { chunks: 0, next_unused: 0, free: Vec::new() }),
        };
        arena.map_fixed(0, HEADER_BYTES)?;
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let header = arena.words(0, HEADER_BYTES / 8);
        for (i, v) in Header::initial_words(role, u64::from(std::process::id()), created) {
            header[i].store(v, Ordering::Relaxed);
        }
        for (n, w) in index::encode_text(&description.kind, index::KIND_BYTES / 8).into_iter().enumerate() {
            header[hw::KIND_OFFSET / 8 + n].store(w, Ordering::Relaxed);
        }
        for (n, w) in index::encode_text(&description.name, index::NAME_BYTES / 8).into_iter().enumerate() {
            header[hw::NAME_OFFSET / 8 + n].store(w, Ordering::Relaxed);
        }
        arena.grow(&mut arena.lock())?;
        Ok(arena)
    }

    /// Notes in the header that the publisher refreshed its counters now, and the period since
    /// the refresh before, for readers to learn the cadence at which counters move.
    pub(crate) fn note_refresh(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let before = self.header(hw::REFRESHED_US).swap(now, Ordering::Relaxed);
        if before != 0 && now > before {
            self.header(hw::REFRESH_PERIOD_US).store(now - before, Ordering::Relaxed);
        }
    }

    /// The arena file, for mapping one of its pages at its offset.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// The open arena file (read-write: this is the publisher's side).
    pub fn file(&self) -> &File {
        &self.file
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn map_fixed(&self, offset: usize, len: usize) -> io::Result<()> {
        if offset + len > self.reserved {
            return Err(io::Error::other("arena reservation exhausted"));
        }
        // SAFETY: the target lies inside our own reservation (checked above), which nothing else
        // uses; MAP_FIXED replaces the PROT_NONE placeholder there with the file's bytes.
        let ptr = unsafe {
            libc::mmap(
                self.base.as_ptr().add(offset).cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                self.file.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        os::check_map(ptr).map(drop)
    }

    fn words(&self, offset: usize, count: usize) -> &[AtomicU64] {
        // SAFETY: callers pass ranges inside the mapped header or a mapped chunk; the mapping lives
        // as long as `self`; AtomicU64 has the layout of u64 and offsets are 8-aligned.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(offset).cast::<AtomicU64>(), count) }
    }

    fn header(&self, word: usize) -> &AtomicU64 {
        &self.words(0, HEADER_BYTES / 8)[word]
    }

    fn entry(&self, slot: usize) -> &[AtomicU64; ENTRY_WORDS] {
        let words = self.words(index::entry_offset(slot), ENTRY_WORDS);
        words.try_into().unwrap_or_else(|_| unreachable!("ENTRY_WORDS words"))
    }

    /// The address of slot `slot`'s page (stable for the life of the arena).
    pub fn page(&self, slot: usize) -> NonNull<AtomicU64> {
        // SAFETY: slots handed out lie in mapped chunks inside the reservation.
        unsafe { NonNull::new_unchecked(self.base.as_ptr().add(index::page_offset(slot)).cast()) }
    }

    fn grow(&self, slots: &mut Slots) -> io::Result<()> {
        let offset = index::file_bytes(slots.chunks);
        allocate(&self.file, offset, CHUNK_BYTES)?;
        self.map_fixed(offset, CHUNK_BYTES)?;
        slots.chunks += 1;
        self.header(hw::CHUNKS).store(slots.chunks as u64, Ordering::Release);
        Ok(())
    }

    /// Starts a change of the index: readers see the layout sequence odd until it is dropped.
    pub fn change(&self) -> IndexChange<'_> {
        let slots = self.lock();
        let seq = self.header(hw::LAYOUT_SEQ);
        seq.store(seq.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        IndexChange { arena: self, slots }
    }

    /// Returns `slot` to the free list (its object's last page handle is gone).
    pub fn release(&self, slot: usize) {
        let mut change = self.change();
        change.write_entry(slot, |w| {
            w[ew::STATE] = index::state::FREE;
            w[ew::KIND] = 0;
        });
        change.slots.free.push(slot);
    }
}

/// A change of an arena's index under way (holds the arena's lock).
pub struct IndexChange<'a> {
    arena: &'a Arena,
    slots: MutexGuard<'a, Slots>,
}

impl IndexChange<'_> {
    /// Takes a slot for `record`: its page is reset to empty counters under `kind`'s headers and
    /// its entry gets a new generation, active.
    ///
    /// # Errors
    /// When the arena is full or a new chunk cannot be allocated (`ENOSPC`).
    pub fn allocate(&mut self, record: ObjectRecord) -> io::Result<usize> {
        let slot = match self.slots.free.pop() {
            Some(slot) => slot,
            None => {
                if self.slots.next_unused >= self.arena.max_slots {
                    return Err(io::Error::new(
                        io::ErrorKind::OutOfMemory,
                        format!("the arena holds at most {} objects", self.arena.max_slots),
                    ));
                }
                if self.slots.next_unused == self.slots.chunks * CHUNK_SLOTS {
                    self.arena.grow(&mut self.slots)?;
                }
                self.slots.next_unused += 1;
                self.slots.next_unused - 1
            }
        };
        let mut headers = [0u64; PAGE_SLOTS];
        PageLayout::of(record.kind).write_headers(&mut headers);
        // SAFETY: the slot's page is mapped, PAGE_SIZE bytes, and no live object owns it.
        let page = unsafe { &*(self.arena.page(slot).as_ptr() as *const [AtomicU64; PAGE_SLOTS]) };
        for (dst, v) in page.iter().zip(headers) {
            dst.store(v, Ordering::Relaxed);
        }
        self.write_entry(slot, |w| {
            *w = [0; ENTRY_WORDS];
            w[ew::KIND] = index::kind_code(record.kind);
            w[ew::STATE] = index::state::ACTIVE;
            w[ew::ID] = record.id;
            w[ew::INDEX] = u64::from(record.index);
            w[ew::VP_COUNT] = record.vp_count;
        });
        Ok(slot)
    }

    /// Rewrites slot `slot`'s entry (the sequence and generation words are kept, except that a
    /// new object gets the next generation).
    pub(crate) fn write_entry(&mut self, slot: usize, f: impl FnOnce(&mut [u64; ENTRY_WORDS])) {
        let entry = self.arena.entry(slot);
        let seq = entry[ew::SEQ].load(Ordering::Relaxed);
        let mut words = [0u64; ENTRY_WORDS];
        for (w, a) in words.iter_mut().zip(entry.iter()) {
            *w = a.load(Ordering::Relaxed);
        }
        let old_kind = words[ew::KIND];
        let generation = words[ew::GENERATION];
        f(&mut words);
        words[ew::SEQ] = seq;
        words[ew::GENERATION] =
            if old_kind == 0 && words[ew::KIND] != 0 { generation + 1 } else { generation };
        entry[ew::SEQ].store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        for (a, w) in entry.iter().zip(words).skip(1) {
            a.store(w, Ordering::Relaxed);
        }
        entry[ew::SEQ].store(seq.wrapping_add(2), Ordering::Release);
    }
}

impl Drop for IndexChange<'_> {
    fn drop(&mut self) {
        let seq = self.arena.header(hw::LAYOUT_SEQ);
        seq.store(seq.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: our reservation (and the chunks mapped over it); no page handle outlives the
        // arena, since each holds an `Arc` of it.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.reserved) };
    }
}

/// A new anonymous (memfd) file for an unpublished arena.
///
/// # Errors
/// When memfd_create fails.
pub(crate) fn anonymous_file() -> io::Result<File> {
    use std::os::fd::{FromRawFd, OwnedFd};
    // SAFETY: the name is a NUL-terminated literal; we check the result.
    let fd = unsafe { libc::memfd_create(c"hvstats-arena".as_ptr(), libc::MFD_CLOEXEC) };
    let fd = os::check(fd)?;
    // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Bytes of the page of slot `slot` in the file.
pub(crate) fn page_file_offset(slot: usize) -> u64 {
    index::page_offset(slot) as u64
}

const _: () = assert!(PAGE_SIZE == 4096);
