//! Knowing that an observed VMM exited without reading `/proc` at every refresh: a pidfd
//! (`pidfd_open(2)`) polls readable once its process has exited, zombie or reaped, so each
//! refresh asks the kernel one `poll` per VM instead of formatting and reading its status.
//!
//! A pidfd names the process it was opened on, never a later process given the same pid. Where
//! one cannot be had (a kernel before 5.3, a fixture procfs, a process already gone), the caller
//! reads `/proc` as before.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use hvstats_host::os::{check, check_long};

/// The exit of one process, watched through its pidfd.
#[derive(Debug)]
pub struct ExitWatch(OwnedFd);

impl ExitWatch {
    /// Watches process `pid`; `None` when no pidfd can be had for it.
    pub fn new(pid: i32) -> Option<Self> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; it has
        // no memory arguments.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        let fd = libc::c_int::try_from(check_long(fd).ok()?).ok()?;
        // SAFETY: `fd` is a descriptor pidfd_open just returned and nothing else owns.
        Some(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// True once the process has exited.
    pub(crate) fn has_exited(&self) -> bool {
        let mut fd = libc::pollfd { fd: self.0.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: `fd` is one valid pollfd we own; the kernel writes only its `revents`.
        let ready = check(unsafe { libc::poll(&mut fd, 1, 0) }).is_ok_and(|n| n > 0);
        ready && fd.revents & (libc::POLLIN | libc::POLLHUP) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_seen_to_exit_and_this_process_is_not() {
        let me = ExitWatch::new(std::process::id() as i32).unwrap();
        assert!(!me.has_exited());
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let watch = ExitWatch::new(child.id() as i32).unwrap();
        assert!(!watch.has_exited());
        child.kill().unwrap();
        // Exited (a zombie until reaped) and reaped alike.
        let t = std::time::Instant::now();
        while !watch.has_exited() {
            assert!(t.elapsed() < std::time::Duration::from_secs(10), "never seen to exit");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child.wait().unwrap();
        assert!(watch.has_exited());
    }
}
