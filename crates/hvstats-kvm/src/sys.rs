//! The one place a libc return value becomes a `Result`: system calls that return -1 (or a
//! negative value) and set `errno`, and the pthread calls that return the error number itself.

use std::io;

/// `ret` when it is not negative, else the `errno` the call set.
///
/// # Errors
/// The OS error of a negative `ret`.
pub(crate) fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(ret) }
}

/// For calls that return 0 or an error number (the pthread family).
///
/// # Errors
/// The OS error `ret` names.
pub(crate) fn check_errno(ret: libc::c_int) -> io::Result<()> {
    if ret == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(ret)) }
}
