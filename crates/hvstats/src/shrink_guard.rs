//! Mappings of files that may shrink under a reader: a read past the file's new end is absorbed,
//! not a SIGBUS that kills the process.
//!
//! A reader maps an arena only when nobody but its owner (this user or root) can truncate it,
//! but its owner still can (`truncate -s 8192` as root). A load from a page of a shared mapping
//! past the file's end raises SIGBUS. A reader registers each mapping it reads from
//! ([`ShrinkGuard::register`]); this process's SIGBUS handler, installed once, looks the faulting
//! address up among them and, when it lies in one, puts a private page of zeros in place of the
//! faulting page (`mmap` with `MAP_FIXED`, a system call the handler may make) and marks the
//! mapping shrunk ([`ShrinkGuard::shrunk`]). The load then runs again and reads zeros; the reader
//! asks after each copy whether its mapping shrank, throws the copy away, and reads the file with
//! `pread` from then on, which reports the new end as a short read. Nothing jumps out of the
//! handler: the interrupted copy completes, so no lock or borrow is left half-way.
//!
//! A SIGBUS at any other address is not ours: it goes to the handler that was there before (the
//! standard library's, which tells a stack overflow apart), or ends the process as it would have.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Mappings registered at once, at most; a reader that finds no free place reads with `pread`.
const PLACES: usize = 1024;

/// One registered mapping: `start` is 0 while the place is free.
struct Place {
    start: AtomicUsize,
    len: AtomicUsize,
    shrunk: AtomicBool,
    taken: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const, reason = "a template for the array below, each copy its own")]
const FREE: Place = Place {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    shrunk: AtomicBool::new(false),
    taken: AtomicBool::new(false),
};

static PLACES_: [Place; PLACES] = [FREE; PLACES];

/// The SIGBUS action before ours, once ours is installed; `None` when installing failed.
static PREVIOUS: OnceLock<Option<libc::sigaction>> = OnceLock::new();

/// The size of a page of memory.
static PAGE: AtomicUsize = AtomicUsize::new(4096);

/// A mapping of a file that may shrink, registered with this process's SIGBUS handler for as long
/// as this lives (drop it before unmapping).
#[derive(Debug)]
pub(crate) struct ShrinkGuard {
    place: usize,
}

impl ShrinkGuard {
    /// Registers the mapping of `len` bytes at `start`; `None` when the handler could not be
    /// installed or every place is taken (the caller reads with `pread` then).
    pub(crate) fn register(start: *const u8, len: usize) -> Option<Self> {
        if start.is_null() || len == 0 || !install() {
            return None;
        }
        let place = PLACES_.iter().position(|p| {
            p.taken.compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        })?;
        let p = &PLACES_[place];
        p.shrunk.store(false, Ordering::Relaxed);
        p.len.store(len, Ordering::Relaxed);
        // The handler takes a place as registered once its start is set.
        p.start.store(start as usize, Ordering::Release);
        Some(Self { place })
    }

    /// True once a read of the mapping faulted past the file's end: what was read from it since
    /// the last check may hold zeros in place of the file's bytes.
    pub(crate) fn shrunk(&self) -> bool {
        PLACES_[self.place].shrunk.load(Ordering::Acquire)
    }
}

impl Drop for ShrinkGuard {
    fn drop(&mut self) {
        let p = &PLACES_[self.place];
        p.start.store(0, Ordering::Release);
        p.len.store(0, Ordering::Relaxed);
        p.taken.store(false, Ordering::Release);
    }
}

/// Installs the handler once; true when it is in place.
fn install() -> bool {
    PREVIOUS
        .get_or_init(|| {
            // SAFETY: sysconf has no memory effects.
            let page = hvstats_host::os::check_long(unsafe { libc::sysconf(libc::_SC_PAGESIZE) });
            if let Some(page) = page.ok().and_then(|page| usize::try_from(page).ok())
                && page.is_power_of_two()
            {
                PAGE.store(page, Ordering::Relaxed);
            }
            // SAFETY: an all-zero sigaction is a valid value of the plain C struct.
            let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
            action.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
            // On the alternate stack where a thread has one; the interrupted load is retried.
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            // SAFETY: `action.sa_mask` is ours to initialise.
            unsafe { libc::sigemptyset(&mut action.sa_mask) };
            // SAFETY: as above.
            let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: both structs are valid and ours; the handler is a plain extern "C" fn.
            let rc =
                hvstats_host::os::check(unsafe { libc::sigaction(libc::SIGBUS, &action, &mut previous) });
            rc.ok().map(|_| previous)
        })
        .is_some()
}

/// The SIGBUS handler: a fault in a registered mapping gets a page of zeros and marks it shrunk;
/// any other goes to the action before ours.
extern "C" fn on_sigbus(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    let page = PAGE.load(Ordering::Relaxed);
    for p in &PLACES_ {
        let start = p.start.load(Ordering::Acquire);
        if start == 0 || addr < start || addr - start >= p.len.load(Ordering::Relaxed) {
            continue;
        }
        let at = addr & !(page - 1);
        // SAFETY: the page lies in a mapping of ours that its reader registered and keeps
        // mapped while registered; replacing it with private zeros (read-only, as the mapping
        // was) is the only change, and the faulting load then completes.
        let zeros = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if zeros != libc::MAP_FAILED {
            p.shrunk.store(true, Ordering::Release);
            return;
        }
    }
    chain(signal, info, context);
}

/// Hands a SIGBUS that is not ours to the action installed before ours.
fn chain(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let Some(Some(previous)) = PREVIOUS.get() else { return reset(signal) };
    match previous.sa_sigaction {
        libc::SIG_DFL => reset(signal),
        libc::SIG_IGN => {}
        handler if previous.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the previous action was installed with SA_SIGINFO: a handler of this type.
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(handler) };
            handler(signal, info, context);
        }
        handler => {
            // SAFETY: the previous action was installed without SA_SIGINFO: a handler of this type.
            let handler: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
            handler(signal);
        }
    }
}

/// Puts the default action back: the faulting load runs again and ends the process, as it
/// would have without this handler.
fn reset(signal: libc::c_int) {
    // SAFETY: an all-zero sigaction is a valid value; SIG_DFL (0) restores the default.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = libc::SIG_DFL;
    // SAFETY: a valid struct of ours; no previous action is asked for.
    unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) };
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsRawFd;

    use super::*;

    /// A read-only shared mapping of `len` bytes of `file`.
    fn map(file: &std::fs::File, len: usize) -> *const u8 {
        // SAFETY: a new read-only shared mapping of a file we hold; the result is checked.
        let ptr = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0)
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        ptr.cast()
    }

    fn load(ptr: *const u8, offset: usize) -> u64 {
        // SAFETY: inside the caller's mapping, 8-aligned.
        unsafe { &*(ptr.add(offset) as *const std::sync::atomic::AtomicU64) }.load(Ordering::Relaxed)
    }

    #[test]
    fn a_read_past_a_shrunk_files_end_reads_zeros_and_says_so() {
        let path = std::env::temp_dir().join(format!("hvstats-shrink-{}", std::process::id()));
        let mut file =
            std::fs::File::options().create(true).truncate(true).read(true).write(true).open(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        file.write_all(&[0xAB; 4 * 4096]).unwrap();
        let ptr = map(&file, 4 * 4096);
        let guard = ShrinkGuard::register(ptr, 4 * 4096).unwrap();
        assert_eq!(load(ptr, 3 * 4096), 0xABAB_ABAB_ABAB_ABAB);
        assert!(!guard.shrunk());
        file.set_len(4096).unwrap();
        // The first page is still the file's; the third is past its end now.
        assert_eq!(load(ptr, 0), 0xABAB_ABAB_ABAB_ABAB);
        assert!(!guard.shrunk());
        assert_eq!(load(ptr, 2 * 4096 + 8), 0);
        assert!(guard.shrunk());
        drop(guard);
        // SAFETY: our mapping, no longer used.
        unsafe { libc::munmap(ptr as *mut libc::c_void, 4 * 4096) };
    }
}
