//! Knowing that an observed VMM exited without reading `/proc` at every refresh: a pidfd
//! (`pidfd_open(2)`) polls readable once its process has exited, zombie or reaped. The observer
//! polls at once each tick ([`poll_all`]) the pidfd of every VM whose VMM the tick's walk of the
//! host's tasks did not find (a walked VMM's main thread says whether it exits), and each VM's
//! refresh then takes the answer its watch holds: one `poll` a tick for all VMs, not one a VM. A
//! watch not polled so (a VM refreshed outside a tick) polls on its own.
//!
//! A pidfd names the process it was opened on, never a later process given the same pid. Where
//! one cannot be had (a kernel before 5.3, a fixture procfs, a process already gone), the caller
//! reads `/proc` as before.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU8, Ordering};

use crate::os::{check, check_long};

/// The exit of one process, watched through its pidfd.
#[derive(Debug)]
pub struct ExitWatch {
    fd: OwnedFd,
    /// What the last [`poll_all`] found and no [`has_exited`](ExitWatch::has_exited) has taken
    /// yet: [`UNPOLLED`], [`RUNNING`] or [`EXITED`] (which stays: an exit is for good).
    polled: AtomicU8,
}

/// No answer held: [`ExitWatch::has_exited`] polls.
const UNPOLLED: u8 = 0;
/// [`poll_all`] found the process running; the next [`ExitWatch::has_exited`] takes it.
const RUNNING: u8 = 1;
/// The process exited.
const EXITED: u8 = 2;

/// Polls the pidfds of every watch in `watches` in one `poll(2)`, each watch then holding
/// whether its process has exited for its next [`ExitWatch::has_exited`]. Where the poll
/// fails, nothing is held and each watch polls on its own.
pub fn poll_all<'a>(watches: impl IntoIterator<Item = &'a ExitWatch>) {
    let watches: Vec<&ExitWatch> = watches.into_iter().filter(|w| !w.exited()).collect();
    let mut fds: Vec<libc::pollfd> = watches
        .iter()
        .map(|w| libc::pollfd { fd: w.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 })
        .collect();
    if fds.is_empty() {
        return;
    }
    // SAFETY: `fds` is a buffer of `fds.len()` valid pollfds we own; the kernel writes only
    // their `revents`.
    if check(unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) }).is_err() {
        return;
    }
    for (watch, fd) in watches.iter().zip(&fds) {
        let state = if is_exit(fd) { EXITED } else { RUNNING };
        watch.polled.store(state, Ordering::Relaxed);
    }
}

/// True when a polled pidfd says its process exited.
fn is_exit(fd: &libc::pollfd) -> bool {
    fd.revents & (libc::POLLIN | libc::POLLHUP) != 0
}

impl ExitWatch {
    /// Watches process `pid`; `None` when no pidfd can be had for it.
    pub fn new(pid: i32) -> Option<Self> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1; it has
        // no memory arguments.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        let fd = libc::c_int::try_from(check_long(fd).ok()?).ok()?;
        // SAFETY: `fd` is a descriptor pidfd_open just returned and nothing else owns.
        Some(Self { fd: unsafe { OwnedFd::from_raw_fd(fd) }, polled: AtomicU8::new(UNPOLLED) })
    }

    /// True once the process has exited: the answer of the last [`poll_all`] when one is held
    /// (taken, so the next call asks again), else a poll of this watch alone.
    pub fn has_exited(&self) -> bool {
        match self.polled.compare_exchange(RUNNING, UNPOLLED, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return false,
            Err(EXITED) => return true,
            Err(_) => {}
        }
        let mut fd = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: `fd` is one valid pollfd we own; the kernel writes only its `revents`.
        let exited = check(unsafe { libc::poll(&mut fd, 1, 0) }).is_ok_and(|n| n > 0) && is_exit(&fd);
        if exited {
            self.polled.store(EXITED, Ordering::Relaxed);
        }
        exited
    }

    /// True when an exit was seen already (asking nothing of the kernel).
    pub fn exited(&self) -> bool {
        self.polled.load(Ordering::Relaxed) == EXITED
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

    /// One poll of many watches hands each its own answer, once: a running process's answer is
    /// taken by the next check, an exit stays.
    #[test]
    fn one_poll_of_many_watches_hands_each_its_own_exit() {
        let mut children: Vec<_> =
            (0..40).map(|_| std::process::Command::new("sleep").arg("30").spawn().unwrap()).collect();
        let watches: Vec<_> = children.iter().map(|c| ExitWatch::new(c.id() as i32).unwrap()).collect();
        for child in children.iter_mut().skip(3).step_by(5) {
            child.kill().unwrap();
            child.wait().unwrap();
        }
        poll_all(&watches);
        let gone: Vec<usize> = (0..40).filter(|i| watches[*i].has_exited()).collect();
        assert_eq!(gone, (3..40).step_by(5).collect::<Vec<_>>());
        assert!(watches.iter().all(|w| w.polled.load(Ordering::Relaxed) != RUNNING), "answers taken");
        children[0].kill().unwrap();
        children[0].wait().unwrap();
        assert!(watches[0].has_exited(), "with no answer held, a watch polls on its own");
        poll_all(&watches);
        assert!(watches[0].has_exited() && watches[3].has_exited() && !watches[1].has_exited());
        for child in &mut children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
