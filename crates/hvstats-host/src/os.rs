//! The one place a libc return value becomes a `Result`, for every crate of the workspace: system
//! calls that return -1 (or a negative value) and set `errno`, and the pthread calls that return
//! the error number itself.

use std::io;

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
    }
}
