//! Who is at the other end of a Unix socket: the kernel's record of the peer (`SO_PEERCRED`,
//! `SO_PEERPIDFD`), which no peer can forge. Of a socket this process connected to, the
//! listener; of a connection a server accepted, the process that connected.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use hvstats_host::os::check;

/// The credentials the peer had when it called `listen` or `connect` (`SO_PEERCRED`): its pid
/// then (in this process's PID namespace), its user and group; `None` when the kernel does not
/// say (not a connected Unix socket).
pub fn credentials(socket: BorrowedFd<'_>) -> Option<libc::ucred> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a valid ucred of `len` bytes the kernel writes into; the socket is
    // borrowed open for the call.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast::<libc::c_void>(),
            &mut len,
        )
    };
    (check(rc).is_ok() && cred.pid > 0).then_some(cred)
}

/// The process listening on the socket now: the listener's pidfd (`SO_PEERPIDFD`, Linux 6.5)
/// says its pid in this namespace, or that it has exited, so a listener that exited is never
/// taken for a process that was given its pid since; where the kernel lacks it, `SO_PEERCRED`'s
/// pid. `None` when the listener has exited or is not visible here.
pub(crate) fn listener_pid(socket: BorrowedFd<'_>) -> Option<i32> {
    /// `SO_PEERPIDFD` (asm-generic; libc does not name it on every target).
    const SO_PEERPIDFD: libc::c_int = 77;
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `fd` is a valid c_int of `len` bytes the kernel writes a new descriptor into; the
    // socket is borrowed open for the call.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&raw mut fd).cast::<libc::c_void>(),
            &mut len,
        )
    };
    if let Err(e) = check(rc) {
        return match e.raw_os_error() {
            Some(libc::ENOPROTOOPT) => credentials(socket).map(|c| c.pid),
            _ => None,
        };
    }
    if fd < 0 {
        return None;
    }
    // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd) };
    // A pidfd's `Pid:` is its process's pid in this namespace, -1 once it has exited.
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())).ok()?;
    let pid = info.lines().find_map(|l| l.strip_prefix("Pid:"))?.trim().parse::<i32>().ok()?;
    (pid > 0).then_some(pid)
}
