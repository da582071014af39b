//! The one place a libc return value becomes a `Result`, for every crate of the workspace: system
//! calls that return -1 (or a negative value) and set `errno`, the pthread calls (and
//! `posix_fallocate`) that return the error number itself, `mmap`'s `MAP_FAILED`, the calls that
//! return a null pointer, a clock read and the open file limits.

use std::io;
use std::ptr::NonNull;
use std::time::Duration;

/// `ret` when it is not negative, else the `errno` the call set.
///
/// # Errors
/// The OS error of a negative `ret`.
pub fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(ret) }
}

/// As [`check`], for `syscall(2)`, which returns a `long`.
///
/// # Errors
/// The OS error of a negative `ret`.
pub fn check_long(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(ret) }
}

/// For calls that return 0 or an error number (the pthread family).
///
/// # Errors
/// The OS error `ret` names.
pub fn check_errno(ret: libc::c_int) -> io::Result<()> {
    if ret == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(ret)) }
}

/// The mapping `mmap` returned, unless it is `MAP_FAILED` (the `errno` the call set) or null
/// (which the kernel gives only for a fixed mapping at address 0, never asked for).
///
/// # Errors
/// The OS error of a failed mapping.
pub fn check_map(ptr: *mut libc::c_void) -> io::Result<NonNull<u8>> {
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
}

/// `ptr` unless it is null, then the `errno` the call set (`fdopendir`, `opendir`).
///
/// # Errors
/// The OS error of a null `ptr`.
pub fn check_ptr<T>(ptr: *mut T) -> io::Result<NonNull<T>> {
    NonNull::new(ptr).ok_or_else(io::Error::last_os_error)
}

/// The time on `clock` (`CLOCK_MONOTONIC`, `CLOCK_BOOTTIME`, a thread's CPU clock), from its
/// origin.
///
/// # Errors
/// When the clock cannot be read (Linux refuses only a clock it does not have).
pub fn clock_time(clock: libc::clockid_t) -> io::Result<Duration> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec for the kernel to fill.
    check(unsafe { libc::clock_gettime(clock, &mut ts) })?;
    Ok(Duration::new(u64::try_from(ts.tv_sec).unwrap_or(0), u32::try_from(ts.tv_nsec).unwrap_or(0)))
}

/// This process's limits on open files: the soft one (`rlim_cur`) and the hard one.
///
/// # Errors
/// When the limits cannot be read.
pub fn file_limits() -> io::Result<libc::rlimit> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid rlimit the kernel writes into.
    check(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) })?;
    Ok(lim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_returns_carry_errno_and_others_pass_through() {
        // SAFETY: closing an fd that cannot be open (-1) only sets errno to EBADF.
        let e = check(unsafe { libc::close(-1) }).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
        assert_eq!(check(7).unwrap(), 7);
        assert_eq!(check_long(1 << 40).unwrap(), 1 << 40);
        assert_eq!(check_errno(libc::ESRCH).unwrap_err().raw_os_error(), Some(libc::ESRCH));
        assert!(check_errno(0).is_ok());
        // SAFETY: fdopendir of an fd that cannot be open only sets errno to EBADF.
        let e = check_ptr(unsafe { libc::fdopendir(-1) }).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
        assert_eq!(check_map(libc::MAP_FAILED).unwrap_err().kind(), io::Error::last_os_error().kind());
    }

    #[test]
    fn a_clock_is_read_and_a_missing_one_refused() {
        let before = clock_time(libc::CLOCK_MONOTONIC).unwrap();
        assert!(clock_time(libc::CLOCK_MONOTONIC).unwrap() >= before);
        assert!(clock_time(libc::CLOCK_BOOTTIME).unwrap() >= before);
        assert_eq!(clock_time(-1000).unwrap_err().raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn the_open_file_limits_are_those_the_process_has() {
        let lim = file_limits().unwrap();
        assert!(lim.rlim_cur <= lim.rlim_max);
        let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
        assert!(lim.rlim_cur >= open, "{open} open over a limit of {}", lim.rlim_cur);
    }
}
