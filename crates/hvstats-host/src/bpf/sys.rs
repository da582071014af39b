//! The `bpf(2)` commands hvstats uses: create an array map, read and write its elements, load a
//! tracepoint program, and attach it to a tracepoint through a perf event
//! (`PERF_EVENT_IOC_SET_BPF`), or run it once on a context of our making (`BPF_PROG_TEST_RUN`).
//! Every fd is owned the moment it exists.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const CMD_MAP_CREATE: libc::c_int = 0;
const CMD_MAP_LOOKUP_ELEM: libc::c_int = 1;
const CMD_MAP_UPDATE_ELEM: libc::c_int = 2;
const CMD_MAP_DELETE_ELEM: libc::c_int = 3;
/// `BPF_MAP_TYPE_HASH`.
pub const MAP_HASH: u32 = 1;
const CMD_PROG_LOAD: libc::c_int = 5;
const CMD_PROG_TEST_RUN: libc::c_int = 10;
/// The largest context `BPF_PROG_TEST_RUN` gives a raw tracepoint program:
/// `MAX_BPF_FUNC_ARGS` (12) `u64`s (`bpf_prog_test_run_raw_tp`).
pub const MAX_TEST_RUN_CONTEXT: usize = 12 * 8;
/// `BPF_MAP_TYPE_ARRAY`.
pub const MAP_ARRAY: u32 = 2;
/// `BPF_MAP_TYPE_PERCPU_ARRAY`.
pub const MAP_PERCPU_ARRAY: u32 = 6;
/// `BPF_F_MMAPABLE`: an array whose values a process may map and read as memory.
const MAP_F_MMAPABLE: u32 = 1 << 10;
/// `BPF_PROG_TYPE_TRACEPOINT`.
const PROG_TRACEPOINT: u32 = 5;
/// `BPF_PROG_TYPE_RAW_TRACEPOINT`.
const PROG_RAW_TRACEPOINT: u32 = 17;
/// `BPF_PROG_TYPE_TRACING`.
const PROG_TRACING: u32 = 26;
/// `BPF_TRACE_ITER`: a tracing program run by a BPF iterator.
const ATTACH_TRACE_ITER: u32 = 28;
const CMD_ITER_CREATE: libc::c_int = 33;
const CMD_RAW_TRACEPOINT_OPEN: libc::c_int = 17;
const CMD_OBJ_PIN: libc::c_int = 6;
const CMD_OBJ_GET: libc::c_int = 7;
const CMD_OBJ_GET_INFO_BY_FD: libc::c_int = 15;
const CMD_LINK_CREATE: libc::c_int = 28;
/// `BPF_PERF_EVENT`: a link from a program to a perf event (a tracepoint's).
const ATTACH_PERF_EVENT: u32 = 41;
/// `PERF_EVENT_IOC_SET_BPF` = `_IOW('$', 8, __u32)`.
const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;

/// `union bpf_attr`, as zeroed words the commands fill (the kernel requires unused bytes zero).
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Self {
        Self([0; 128])
    }
    fn u32_at(&mut self, off: usize, v: u32) -> &mut Self {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64_at(&mut self, off: usize, v: u64) -> &mut Self {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn get_u32(&self, off: usize) -> u32 {
        let mut w = [0u8; 4];
        w.copy_from_slice(&self.0[off..off + 4]);
        u32::from_ne_bytes(w)
    }
    fn call(&mut self, cmd: libc::c_int) -> io::Result<libc::c_long> {
        // SAFETY: `self` is a bpf_attr-sized buffer we own for the call; every pointer stored in
        // it by the caller points to memory alive for the call and large enough for the command.
        let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, self.0.as_mut_ptr(), self.0.len() as u32) };
        crate::os::check_long(r)
    }
}

fn owned(fd: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// Pins `fd` (a map, program or link) at `path` in a BPF filesystem: it then lives on, named
/// there, after every descriptor of it is closed, until the name is removed.
fn pin(fd: i32, path: &std::path::Path) -> io::Result<()> {
    let path = path_cstring(path)?;
    Attr::new().u64_at(0, path.as_ptr() as u64).u32_at(8, fd as u32).call(CMD_OBJ_PIN)?;
    Ok(())
}

/// Opens what is pinned at `path`.
fn pinned(path: &std::path::Path) -> io::Result<OwnedFd> {
    let path = path_cstring(path)?;
    let fd = Attr::new().u64_at(0, path.as_ptr() as u64).call(CMD_OBJ_GET)?;
    Ok(owned(fd))
}

fn path_cstring(path: &std::path::Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// What the kernel says of a map: `struct bpf_map_info`'s type, key size, value size and
/// entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MapInfo {
    kind: u32,
    key_size: u32,
    value_size: u32,
    entries: u32,
}

fn map_info(fd: i32) -> io::Result<MapInfo> {
    // struct bpf_map_info: type @0, id @4, key_size @8, value_size @12, max_entries @16, ...
    let mut info = [0u8; 64];
    Attr::new()
        .u32_at(0, fd as u32)
        .u32_at(4, info.len() as u32)
        .u64_at(8, info.as_mut_ptr() as u64)
        .call(CMD_OBJ_GET_INFO_BY_FD)?;
    let at = |off: usize| u32::from_ne_bytes([info[off], info[off + 1], info[off + 2], info[off + 3]]);
    Ok(MapInfo { kind: at(0), key_size: at(8), value_size: at(12), entries: at(16) })
}

/// A BPF map with `u32` keys: an array (per CPU or not), or a hash ([`ArrayMap::create_hash`]).
#[derive(Debug)]
pub struct ArrayMap {
    fd: OwnedFd,
    value_size: usize,
    entries: u32,
    /// Copies per key: the possible CPUs of a per-CPU map, else 1.
    copies: usize,
    /// The values mapped into this process, when the map is made mappable and the kernel let
    /// it be mapped: a read is then a load from memory, not a `bpf(2)` call.
    mapped: Option<Mapped>,
}

/// An array map's values mapped read-only into this process (`mmap` of a `BPF_F_MMAPABLE`
/// array): the kernel's own memory, where the programs add, so a load reads what a
/// `BPF_MAP_LOOKUP_ELEM` of the same key would copy out at that instant.
#[derive(Debug)]
struct Mapped {
    base: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is shared memory of the kernel's, only ever read here, through atomic
// loads (`Mapped::word`) or copied whole while no program writes it (`ArrayMap::copy_mapped`),
// and unmapped once, by its owner's drop; any thread may do any of these.
unsafe impl Send for Mapped {}
// SAFETY: as for Send: shared references only load, atomically.
unsafe impl Sync for Mapped {}

impl Mapped {
    /// Maps the `len` bytes of values of the mappable array `fd`, read-only.
    fn of(fd: i32, len: usize) -> io::Result<Self> {
        // SAFETY: a new shared read-only mapping chosen by the kernel, of `len` bytes of the map
        // (the kernel refuses a length past the map's values, or a map not made mappable).
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, fd, 0) };
        Ok(Self { base: crate::os::check_map(ptr)?, len })
    }

    /// The `u64` at byte `offset` (a multiple of 8 below `len`), loaded atomically: the
    /// programs add to it on other CPUs while it is read.
    fn word(&self, offset: usize) -> u64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= self.len);
        // SAFETY: `offset + 8 <= len` (callers index within the map's values), the mapping is
        // page-aligned so every multiple of 8 is aligned for a u64, and it lives as long as
        // `self`; the kernel writes it concurrently, which an atomic load allows.
        let word = unsafe { &*self.base.as_ptr().add(offset).cast::<std::sync::atomic::AtomicU64>() };
        word.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: `base` and `len` are the mapping `Mapped::of` made, unmapped only here.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Bytes of `entries` values of `stride` bytes, rounded up to whole pages (what an array's
/// mapping spans).
fn mapped_len(stride: usize, entries: u32) -> usize {
    // SAFETY: sysconf reads a constant of the system.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1);
    (stride * entries as usize).div_ceil(page) * page
}

/// A map of `kind` keyed by `u32`, of `entries` values of `value_size` bytes, made with `flags`
/// (`bpf(BPF_MAP_CREATE)`).
fn create_map(kind: u32, value_size: usize, entries: u32, flags: u32) -> io::Result<OwnedFd> {
    let size = u32::try_from(value_size).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let fd = Attr::new()
        .u32_at(0, kind)
        .u32_at(4, 4)
        .u32_at(8, size)
        .u32_at(12, entries)
        .u32_at(16, flags)
        .call(CMD_MAP_CREATE)?;
    Ok(owned(fd))
}

impl ArrayMap {
    /// Creates a map of `entries` values of `value_size` bytes; `per_cpu` gives each CPU its own.
    ///
    /// # Errors
    /// What `bpf(BPF_MAP_CREATE)` returns (EPERM without CAP_BPF, ENOMEM).
    pub fn create(value_size: usize, entries: u32, per_cpu: bool) -> io::Result<Self> {
        let copies = if per_cpu { possible_cpus()? } else { 1 };
        let kind = if per_cpu { MAP_PERCPU_ARRAY } else { MAP_ARRAY };
        let fd = create_map(kind, value_size, entries, 0)?;
        Ok(Self { fd, value_size, entries, copies, mapped: None })
    }

    /// Creates an array map (one copy a key) whose values this process reads from memory:
    /// made `BPF_F_MMAPABLE` and mapped, so reading every row each refresh costs no system call.
    /// Where the kernel refuses either, the map is made as [`create`](Self::create) makes it and
    /// read by lookups: the same values, a `bpf(2)` call a read.
    ///
    /// # Errors
    /// As [`create`](Self::create).
    pub fn create_mapped(value_size: usize, entries: u32) -> io::Result<Self> {
        let Ok(fd) = create_map(MAP_ARRAY, value_size, entries, MAP_F_MMAPABLE) else {
            return Self::create(value_size, entries, false);
        };
        let mut map = Self { fd, value_size, entries, copies: 1, mapped: None };
        map.map_values();
        Ok(map)
    }

    /// Maps the values when the map allows it (see [`create_mapped`](Self::create_mapped));
    /// otherwise reads stay lookups.
    fn map_values(&mut self) {
        if self.copies == 1 {
            self.mapped = Mapped::of(self.raw_fd(), mapped_len(self.stride(), self.entries)).ok();
        }
    }

    /// True when reads are loads from memory rather than lookups.
    pub(crate) fn is_mapped(&self) -> bool {
        self.mapped.is_some()
    }

    /// Word `word` of key `key`'s value, loaded from the mapped values; `None` where the values
    /// are not mapped, or past them.
    pub(crate) fn mapped_word(&self, key: u32, word: usize) -> Option<u64> {
        let mapped = self.mapped.as_ref().filter(|_| key < self.entries && 8 * word < self.value_size)?;
        Some(mapped.word(key as usize * self.stride() + 8 * word))
    }

    /// Copies the values of the first `count` keys (`stride` bytes each) from the mapped values
    /// into `out` (cleared first), when they are mapped and there are that many. Only for a map
    /// no program writes meanwhile: the copy is not atomic word by word.
    pub(crate) fn copy_mapped(&self, count: u32, out: &mut Vec<u8>) -> bool {
        out.clear();
        let Some(mapped) = self.mapped.as_ref().filter(|_| count <= self.entries) else { return false };
        let len = count as usize * self.stride();
        debug_assert!(len <= mapped.len);
        // SAFETY: `len` bytes from the start of the mapping, which spans every key's value
        // (`count <= entries`); the caller holds that no program writes them during the copy,
        // and `out` has the room reserved before the copy, its length set after.
        unsafe {
            out.reserve(len);
            std::ptr::copy_nonoverlapping(mapped.base.as_ptr(), out.as_mut_ptr(), len);
            out.set_len(len);
        }
        true
    }

    /// Words `words` of key `key`'s value, in the mapped values, where they are mapped and
    /// within the value. Only for a map no program writes while the slice is held: the caller
    /// holds that (no program of its runs meanwhile).
    pub(crate) fn mapped_words(&self, key: u32, words: std::ops::Range<usize>) -> Option<&[u64]> {
        let within = key < self.entries && words.start <= words.end && 8 * words.end <= self.value_size;
        let mapped = self.mapped.as_ref().filter(|_| within)?;
        let at = key as usize * self.stride() + 8 * words.start;
        debug_assert!(at + 8 * words.len() <= mapped.len);
        // SAFETY: the words lie within key's value (checked above), within the mapping, which
        // spans every key's value, lives as long as `self`, and is 8-byte aligned at every value
        // (the stride is a multiple of 8); the caller holds that no program writes them while
        // the slice is held, and this process never writes the read-only mapping.
        Some(unsafe { std::slice::from_raw_parts(mapped.base.as_ptr().add(at).cast::<u64>(), words.len()) })
    }

    /// Creates a hash map of at most `entries` values of `value_size` bytes, keyed by `u32`.
    ///
    /// # Errors
    /// What `bpf(BPF_MAP_CREATE)` returns.
    pub fn create_hash(value_size: usize, entries: u32) -> io::Result<Self> {
        let fd = create_map(MAP_HASH, value_size, entries, 0)?;
        Ok(Self { fd, value_size, entries, copies: 1, mapped: None })
    }

    /// Pins the map at `path` (see [`ArrayMap::open_pinned`]).
    ///
    /// # Errors
    /// What `bpf(BPF_OBJ_PIN)` returns (EEXIST, ENOENT: not in a BPF filesystem).
    pub(crate) fn pin(&self, path: &std::path::Path) -> io::Result<()> {
        pin(self.raw_fd(), path)
    }

    /// Opens the map pinned at `path`, which must be the same kind of map as this one, of the same
    /// sizes: anything else is refused (InvalidData).
    ///
    /// # Errors
    /// What `bpf(BPF_OBJ_GET)` returns; InvalidData for another kind or size of map.
    pub(crate) fn pinned_like(&self, path: &std::path::Path) -> io::Result<Self> {
        let fd = pinned(path)?;
        let (have, want) = (map_info(fd.as_raw_fd())?, map_info(self.raw_fd())?);
        if have != want {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("another kind of map ({have:?}, not {want:?})"),
            ));
        }
        let mut map = Self {
            fd,
            value_size: self.value_size,
            entries: self.entries,
            copies: self.copies,
            mapped: None,
        };
        // A map pinned by a version that did not make it mappable is read by lookups.
        if self.is_mapped() {
            map.map_values();
        }
        Ok(map)
    }

    /// Opens the array map pinned at `path` (one copy a key), whatever its sizes: for reading
    /// a map whose maker's layout is not known here.
    ///
    /// # Errors
    /// What `bpf(BPF_OBJ_GET)` returns; InvalidData for a map that is not a plain array of
    /// `u32` keys.
    pub(crate) fn open_pinned(path: &std::path::Path) -> io::Result<Self> {
        let fd = pinned(path)?;
        let info = map_info(fd.as_raw_fd())?;
        if info.kind != MAP_ARRAY || info.key_size != 4 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("not an array map: {info:?}")));
        }
        Ok(Self { fd, value_size: info.value_size as usize, entries: info.entries, copies: 1, mapped: None })
    }

    /// Removes key `key` (a hash map's; an array's keys cannot be removed).
    ///
    /// # Errors
    /// What `bpf(BPF_MAP_DELETE_ELEM)` returns (ENOENT: no such key).
    pub(crate) fn delete(&self, key: u32) -> io::Result<()> {
        Attr::new()
            .u32_at(0, self.raw_fd() as u32)
            .u64_at(8, &key as *const u32 as u64)
            .call(CMD_MAP_DELETE_ELEM)?;
        Ok(())
    }

    /// The map's fd (for `ld_map_fd`).
    pub(crate) fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// The number of keys.
    pub fn entries(&self) -> u32 {
        self.entries
    }

    /// Bytes of one copy of a value as the kernel lays them out (rounded up to 8).
    fn stride(&self) -> usize {
        self.value_size.div_ceil(8) * 8
    }

    /// Reads key `key`: every CPU's copy, `stride` bytes each, into one buffer.
    ///
    /// # Errors
    /// What `bpf(BPF_MAP_LOOKUP_ELEM)` returns (ENOENT past the end).
    pub fn read(&self, key: u32) -> io::Result<Vec<u8>> {
        let mut value = vec![0u8; self.stride() * self.copies];
        Attr::new()
            .u32_at(0, self.raw_fd() as u32)
            .u64_at(8, &key as *const u32 as u64)
            .u64_at(16, value.as_mut_ptr() as u64)
            .call(CMD_MAP_LOOKUP_ELEM)?;
        Ok(value)
    }

    /// Sums, over every CPU's copy of key `key`, the `u64` at each of the first `n` positions.
    ///
    /// # Errors
    /// As [`read`](Self::read).
    pub fn sum_u64(&self, key: u32, n: usize) -> io::Result<Vec<u64>> {
        let mut sums = vec![0u64; n.min(self.value_size / 8)];
        self.sum_u64_into(key, &mut Vec::new(), &mut sums)?;
        Ok(sums)
    }

    /// As [`sum_u64`](Self::sum_u64) into `sums` (its length says how many positions), reading
    /// through `scratch`: with buffers kept from one call to the next, a read allocates nothing
    /// (a VP thread refreshing its own page at a hypercall must not fault in memory).
    ///
    /// # Errors
    /// As [`read`](Self::read).
    pub(crate) fn sum_u64_into(&self, key: u32, scratch: &mut Vec<u8>, sums: &mut [u64]) -> io::Result<()> {
        if let Some(mapped) = &self.mapped {
            return self.load_u64_into(mapped, key, sums);
        }
        self.look_up_u64_into(key, scratch, sums)
    }

    /// As [`sum_u64_into`](Self::sum_u64_into) from the mapped values (one copy a key).
    fn load_u64_into(&self, mapped: &Mapped, key: u32, sums: &mut [u64]) -> io::Result<()> {
        if key >= self.entries {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        }
        let n = sums.len().min(self.value_size / 8);
        let row = key as usize * self.stride();
        for (i, sum) in sums.iter_mut().enumerate() {
            *sum = if i < n { mapped.word(row + 8 * i) } else { 0 };
        }
        Ok(())
    }

    /// As [`sum_u64_into`](Self::sum_u64_into) by `BPF_MAP_LOOKUP_ELEM`, whether or not the
    /// values are mapped.
    pub(crate) fn look_up_u64_into(
        &self,
        key: u32,
        scratch: &mut Vec<u8>,
        sums: &mut [u64],
    ) -> io::Result<()> {
        scratch.resize(self.stride() * self.copies, 0);
        Attr::new()
            .u32_at(0, self.raw_fd() as u32)
            .u64_at(8, &key as *const u32 as u64)
            .u64_at(16, scratch.as_mut_ptr() as u64)
            .call(CMD_MAP_LOOKUP_ELEM)?;
        let n = sums.len().min(self.value_size / 8);
        sums.iter_mut().for_each(|s| *s = 0);
        for copy in scratch.chunks_exact(self.stride()) {
            for (sum, word) in sums[..n].iter_mut().zip(copy.chunks_exact(8)) {
                let mut w = [0u8; 8];
                w.copy_from_slice(word);
                *sum = sum.wrapping_add(u64::from_ne_bytes(w));
            }
        }
        Ok(())
    }

    /// Writes `value` (one copy, `value_size` bytes) as every CPU's copy of key `key`.
    ///
    /// # Errors
    /// What `bpf(BPF_MAP_UPDATE_ELEM)` returns; EINVAL when `value` has the wrong size.
    pub fn write(&self, key: u32, value: &[u8]) -> io::Result<()> {
        if value.len() != self.value_size {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let mut all = vec![0u8; self.stride() * self.copies];
        for copy in all.chunks_exact_mut(self.stride()) {
            copy[..value.len()].copy_from_slice(value);
        }
        Attr::new()
            .u32_at(0, self.raw_fd() as u32)
            .u64_at(8, &key as *const u32 as u64)
            .u64_at(16, all.as_ptr() as u64)
            .call(CMD_MAP_UPDATE_ELEM)?;
        Ok(())
    }
}

/// The number of possible CPUs (the copies of a per-CPU map value), from
/// `/sys/devices/system/cpu/possible` (`0-N` or a list of ranges).
///
/// # Errors
/// When the file cannot be read or parsed.
pub(crate) fn possible_cpus() -> io::Result<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    parse_cpu_list(&text).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad cpu list"))
}

/// The highest CPU of a list such as `0-3,8-11`, plus one (per-CPU copies are indexed by CPU).
fn parse_cpu_list(text: &str) -> Option<usize> {
    let mut max = None;
    for part in text.trim().split(',') {
        let last = part.rsplit('-').next()?;
        let n: usize = last.trim().parse().ok()?;
        max = max.max(Some(n));
    }
    max.map(|m| m + 1)
}

/// A loaded BPF program.
#[derive(Debug)]
pub struct Program {
    fd: OwnedFd,
}

/// Why a program was refused, with the verifier's log.
#[derive(Debug, thiserror::Error)]
#[error("the kernel refused the program: {source}{}", if log.is_empty() { String::new() } else { format!("; verifier: {log}") })]
pub struct LoadError {
    /// The kernel's error.
    #[source]
    pub source: io::Error,
    /// The verifier's log (its last lines).
    pub log: String,
}

impl Program {
    /// Loads `insns` as a tracepoint program (its context: the tracepoint's record, laid out
    /// as its tracefs format says).
    ///
    /// # Errors
    /// The kernel's refusal (EPERM without CAP_BPF/CAP_PERFMON, EACCES/EINVAL from the verifier,
    /// whose log is kept).
    pub fn load_tracepoint(insns: &[u64]) -> Result<Self, LoadError> {
        Self::load(PROG_TRACEPOINT, insns)
    }

    /// Loads `insns` as a raw tracepoint program (its context: the tracepoint's arguments, one
    /// `u64` each).
    ///
    /// # Errors
    /// As [`load_tracepoint`](Self::load_tracepoint).
    pub(crate) fn load_raw_tracepoint(insns: &[u64]) -> Result<Self, LoadError> {
        Self::load(PROG_RAW_TRACEPOINT, insns)
    }

    /// Runs a raw tracepoint program once, on this thread and CPU, with `context` as its context
    /// (the tracepoint's arguments, or whatever the program reads there), and returns what it
    /// returned: the kernel's `BPF_PROG_TEST_RUN`, whose raw tracepoint runner calls the program
    /// as a firing of its tracepoint would (`bpf_prog_test_run_raw_tp`).
    ///
    /// # Errors
    /// EINVAL when the context is longer than [`MAX_TEST_RUN_CONTEXT`] or shorter than what the
    /// program reads, or the program is not a raw tracepoint program; what else the kernel says.
    pub(crate) fn test_run(&self, context: &[u8]) -> io::Result<u32> {
        if context.len() > MAX_TEST_RUN_CONTEXT {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let mut attr = Attr::new();
        // struct bpf_attr.test: prog_fd @0, retval @4, ctx_size_in @40, ctx_in @48.
        attr.u32_at(0, self.fd.as_raw_fd() as u32);
        if !context.is_empty() {
            attr.u32_at(40, context.len() as u32).u64_at(48, context.as_ptr() as u64);
        }
        attr.call(CMD_PROG_TEST_RUN)?;
        Ok(attr.get_u32(4))
    }

    /// Loads `insns` as a task iterator program (a tracing program of `BPF_TRACE_ITER` attached
    /// to `bpf_iter_task`, whose type id in the kernel's BTF is `iter_task`): its context is
    /// `struct bpf_iter__task` (the seq_file's meta, then the task or null).
    ///
    /// # Errors
    /// As [`load_tracepoint`](Self::load_tracepoint).
    pub(crate) fn load_task_iter(insns: &[u64], iter_task: u32) -> Result<Self, LoadError> {
        Self::load_attached(PROG_TRACING, insns, Some((ATTACH_TRACE_ITER, iter_task)))
    }

    fn load(kind: u32, insns: &[u64]) -> Result<Self, LoadError> {
        Self::load_attached(kind, insns, None)
    }

    /// Loads a program of `kind`, attached where `attach` says (its expected attach type and the
    /// BTF id of what it attaches to). The license is GPL: the helpers hvstats calls from a
    /// tracing program (`bpf_seq_write`) are given to GPL programs only.
    fn load_attached(kind: u32, insns: &[u64], attach: Option<(u32, u32)>) -> Result<Self, LoadError> {
        let license = c"GPL";
        let (expected, btf_id) = attach.unwrap_or((0, 0));
        let attempt = |log: &mut [u8], level: u32| {
            Attr::new()
                // struct bpf_attr's prog load: expected_attach_type @68, attach_btf_id @108.
                .u32_at(68, expected)
                .u32_at(108, btf_id)
                .u32_at(0, kind)
                .u32_at(4, insns.len() as u32)
                .u64_at(8, insns.as_ptr() as u64)
                .u64_at(16, license.as_ptr() as u64)
                .u32_at(24, level)
                .u32_at(28, log.len() as u32)
                // No log: a null buffer (an empty slice's pointer is not null, and the kernel
                // refuses a buffer without a size).
                .u64_at(32, if log.is_empty() { 0 } else { log.as_mut_ptr() as u64 })
                .call(CMD_PROG_LOAD)
        };
        match attempt(&mut [], 0) {
            Ok(fd) => Ok(Self { fd: owned(fd) }),
            Err(source) => {
                // Load again with the verifier's log, to say why.
                let mut log = vec![0u8; 64 * 1024];
                if let Ok(fd) = attempt(&mut log, 1) {
                    // Accepted the second time (a transient failure): keep it.
                    return Ok(Self { fd: owned(fd) });
                }
                let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
                let text = String::from_utf8_lossy(&log[..end]);
                let tail: Vec<&str> = text.lines().rev().take(6).collect();
                let log = tail.into_iter().rev().collect::<Vec<_>>().join(" | ");
                Err(LoadError { source, log })
            }
        }
    }
}

/// A program attached to a tracepoint (through a disabled perf event, or as a raw tracepoint):
/// it runs on every firing of the tracepoint (on any thread) until this is dropped.
#[derive(Debug)]
pub struct Attachment {
    _event: OwnedFd,
}

impl Attachment {
    /// Attaches `program` (a raw tracepoint program) to the kernel tracepoint `name`: it then
    /// runs with the tracepoint's arguments, before any record is made.
    ///
    /// # Errors
    /// What `bpf(BPF_RAW_TRACEPOINT_OPEN)` returns (ENOENT: no such tracepoint).
    pub(crate) fn raw_tracepoint(name: &str, program: &Program) -> io::Result<Self> {
        let name = std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let fd = Attr::new()
            .u64_at(0, name.as_ptr() as u64)
            .u32_at(8, program.fd.as_raw_fd() as u32)
            .call(CMD_RAW_TRACEPOINT_OPEN)?;
        Ok(Self { _event: owned(fd) })
    }

    /// Pins the attachment at `path`: the program then stays attached after this is dropped
    /// (and after this process ends), until the name is removed. Only a link can be pinned: a
    /// raw tracepoint's, or [`tracepoint_link`](Self::tracepoint_link)'s.
    ///
    /// # Errors
    /// What `bpf(BPF_OBJ_PIN)` returns (EINVAL for an attachment that is not a link).
    pub(crate) fn pin(&self, path: &std::path::Path) -> io::Result<()> {
        pin(self._event.as_raw_fd(), path)
    }

    /// As [`tracepoint`](Self::tracepoint), through a BPF link (`BPF_LINK_CREATE` on the perf
    /// event) that holds the event: one that can be pinned.
    ///
    /// # Errors
    /// What `perf_event_open` or `BPF_LINK_CREATE` return (EINVAL before Linux 5.15).
    pub(crate) fn tracepoint_link(tracepoint: u64, program: &Program) -> io::Result<Self> {
        let event = Self::tracepoint_event(tracepoint)?;
        // struct bpf_attr.link_create: prog_fd @0, target_fd @4, attach_type @8, flags @12.
        let fd = Attr::new()
            .u32_at(0, program.fd.as_raw_fd() as u32)
            .u32_at(4, event.as_raw_fd() as u32)
            .u32_at(8, ATTACH_PERF_EVENT)
            .call(CMD_LINK_CREATE)?;
        // The link holds the event; our descriptor of it closes here.
        Ok(Self { _event: owned(fd) })
    }

    /// Attaches `program` to tracepoint id `tracepoint` (from tracefs).
    ///
    /// # Errors
    /// What `perf_event_open` or `PERF_EVENT_IOC_SET_BPF` return.
    pub fn tracepoint(tracepoint: u64, program: &Program) -> io::Result<Self> {
        let event = Self::tracepoint_event(tracepoint)?;
        // SAFETY: our fd is a perf tracepoint event; the argument is a program fd by value.
        let r = unsafe { libc::ioctl(event.as_raw_fd(), PERF_EVENT_IOC_SET_BPF, program.fd.as_raw_fd()) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { _event: event })
    }

    /// A disabled counting perf event on tracepoint id `tracepoint`, on every thread of CPU 0:
    /// what a program is attached to.
    fn tracepoint_event(tracepoint: u64) -> io::Result<OwnedFd> {
        // struct perf_event_attr, PERF_ATTR_SIZE_VER0 (64 bytes): type, size, config, …, flags.
        let mut attr = [0u64; 8];
        attr[0] = u64::from(crate::perf_event::TYPE_TRACEPOINT) | (64u64 << 32);
        attr[1] = tracepoint;
        // sample_period 0: a counting event, and it stays disabled: only the program runs.
        attr[5] = 1; // flags: disabled
        // SAFETY: `attr` is a perf_event_attr of the size it declares (64), alive for the call;
        // the kernel only reads it. We check the result before using it as an fd.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                attr.as_ptr(),
                -1 as libc::pid_t,
                0 as libc::c_int,
                -1 as libc::c_int,
                PERF_FLAG_FD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(owned(fd))
    }
}

/// A task iterator program linked to the threads of one process, or of the host: each
/// [`walk`](Self::walk) runs the program once for every thread of them, in the kernel, and gives
/// what the program wrote, in one read of a few system calls whatever the number of threads.
#[derive(Debug)]
pub(crate) struct TaskIterLink {
    link: OwnedFd,
}

impl TaskIterLink {
    /// Links `program` (a task iterator's) to the threads of process `pid` (the task
    /// iterator's `pid` filter, Linux 6.1 and later: `bpf_iter_link_info.task.pid`).
    ///
    /// # Errors
    /// What `bpf(BPF_LINK_CREATE)` returns (EINVAL before 6.1, ESRCH: no such process).
    pub(crate) fn of_process(program: &Program, pid: i32) -> io::Result<Self> {
        // union bpf_iter_link_info: task { tid, pid, pid_fd }.
        Self::link(program, Some(&[0, pid as u32, 0]))
    }

    /// Links `program` (a task iterator's) to every task of the host: no filter, which every
    /// kernel with the task iterator (5.8) takes.
    ///
    /// # Errors
    /// What `bpf(BPF_LINK_CREATE)` returns.
    pub(crate) fn of_host(program: &Program) -> io::Result<Self> {
        Self::link(program, None)
    }

    fn link(program: &Program, info: Option<&[u32; 3]>) -> io::Result<Self> {
        // struct bpf_attr.link_create: prog_fd @0, target_fd @4, attach_type @8, flags @12,
        // iter_info @16, iter_info_len @24.
        let (at, len) = info.map_or((0, 0), |i| (i.as_ptr() as u64, std::mem::size_of_val(i) as u32));
        let fd = Attr::new()
            .u32_at(0, program.fd.as_raw_fd() as u32)
            .u32_at(8, ATTACH_TRACE_ITER)
            .u64_at(16, at)
            .u32_at(24, len)
            .call(CMD_LINK_CREATE)?;
        Ok(Self { link: owned(fd) })
    }

    /// Runs the iterator over the process's threads, putting what the program wrote in `out`
    /// (cleared first), `max` bytes at most: the walk stops there, however many threads the
    /// process made.
    ///
    /// # Errors
    /// What `bpf(BPF_ITER_CREATE)` or reading it returns.
    pub(crate) fn walk(&self, out: &mut Vec<u8>, max: u64) -> io::Result<()> {
        out.clear();
        let fd = Attr::new().u32_at(0, self.link.as_raw_fd() as u32).call(CMD_ITER_CREATE)?;
        let iter = std::fs::File::from(owned(fd));
        io::Read::read_to_end(&mut io::Read::take(&iter, max), out)?;
        Ok(())
    }
}

/// The attachments of an engine's programs, detached together when dropped: detaching one that
/// is not pinned waits for the kernel's RCU grace period (the tracepoint's probe is removed, and
/// a perf tracepoint event's last user waits for `tracepoint_synchronize_unregister`), tens of
/// milliseconds each on a loaded host. One after another, a dozen tracepoints held a stopping
/// observer for a second and more; dropped on threads of their own, the grace periods overlap.
#[derive(Debug, Default)]
pub(crate) struct Attachments(Vec<Attachment>);

impl FromIterator<Attachment> for Attachments {
    fn from_iter<I: IntoIterator<Item = Attachment>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl Drop for Attachments {
    fn drop(&mut self) {
        let all = std::mem::take(&mut self.0);
        if all.len() < 2 {
            return;
        }
        std::thread::scope(|s| {
            for attachment in all {
                // Where no thread can be had, the closure, and the attachment with it, is
                // dropped here.
                let _ = std::thread::Builder::new().spawn_scoped(s, move || drop(attachment));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn possible_cpu_lists_give_the_highest_cpu_plus_one() {
        assert_eq!(parse_cpu_list("0-1\n"), Some(2));
        assert_eq!(parse_cpu_list("0\n"), Some(1));
        assert_eq!(parse_cpu_list("0-3,8-11"), Some(12));
        assert_eq!(parse_cpu_list("x"), None);
    }

    /// A mapped array's loads give, for every key, what a lookup of the key gives: across many
    /// pages of values, words of a row past the first, and a value size not a multiple of 8.
    #[test]
    fn mapped_reads_equal_the_lookups_of_every_row() {
        const ROWS: u32 = 3000;
        let map = match ArrayMap::create_mapped(20, ROWS) {
            Ok(map) => map,
            Err(e) => {
                assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "{e}");
                return eprintln!("mapped_reads: skipped: {e}");
            }
        };
        assert!(map.is_mapped(), "this kernel maps BPF_F_MMAPABLE arrays");
        assert!(mapped_len(map.stride(), ROWS) > 4 * 4096, "the rows span many pages");
        for key in (0..ROWS).filter(|k| k % 7 != 3) {
            let words = [u64::from(key) << 32 | 1, u64::MAX - u64::from(key)];
            let mut value = words.iter().flat_map(|w| w.to_ne_bytes()).collect::<Vec<_>>();
            value.extend_from_slice(&key.to_ne_bytes());
            map.write(key, &value).unwrap();
        }
        let (mut scratch, mut loaded, mut looked_up) = (Vec::new(), [0u64; 3], [0u64; 3]);
        for key in 0..ROWS {
            map.sum_u64_into(key, &mut scratch, &mut loaded).unwrap();
            map.look_up_u64_into(key, &mut scratch, &mut looked_up).unwrap();
            assert_eq!(loaded, looked_up, "row {key}");
            let written =
                if key % 7 == 3 { [0, 0] } else { [u64::from(key) << 32 | 1, u64::MAX - u64::from(key)] };
            assert_eq!(loaded[..2], written, "row {key}");
        }
        assert_eq!(
            map.sum_u64_into(ROWS, &mut scratch, &mut loaded).unwrap_err().raw_os_error(),
            Some(libc::ENOENT)
        );
    }
}
