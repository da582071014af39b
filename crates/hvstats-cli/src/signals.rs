//! SIGINT, SIGTERM and SIGHUP as requests to finish, not as sudden death.
//!
//! A command that holds something (running VPs, a published instance, a hardware counter
//! allocation) blocks these signals in its main thread before it starts any other thread, so no
//! thread takes their default action; they wait, pending, until a watcher takes them with
//! `sigtimedwait` and asks the work to stop. The work then ends the ordinary way: it prints what
//! it has, drops what it holds (removing the instance), and `run` exits 130, 143 or 129.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hvstats_host::os::{check, check_errno};

use crate::output::ExitStatus;

/// A signal that asks the command to finish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Signal {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM.
    Terminate,
    /// SIGHUP (the terminal went away).
    Hangup,
}

impl Signal {
    /// The signal's name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Interrupt => "SIGINT",
            Self::Terminate => "SIGTERM",
            Self::Hangup => "SIGHUP",
        }
    }

    /// The exit status of a command it ended (128 + the signal's number).
    pub(crate) fn exit_status(self) -> ExitStatus {
        match self {
            Self::Interrupt => ExitStatus::Interrupted,
            Self::Terminate => ExitStatus::Terminated,
            Self::Hangup => ExitStatus::HungUp,
        }
    }

    fn from_raw(signal: libc::c_int) -> Option<Self> {
        match signal {
            libc::SIGINT => Some(Self::Interrupt),
            libc::SIGTERM => Some(Self::Terminate),
            libc::SIGHUP => Some(Self::Hangup),
            _ => None,
        }
    }
}

fn set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise and fill the set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        set
    }
}

/// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread and every thread it starts afterwards,
/// so they stay pending for [`wait`], [`take_pending`] or [`during`] instead of ending the
/// process.
///
/// # Errors
/// When the signal mask cannot be changed.
pub(crate) fn block() -> io::Result<()> {
    block_of(&set())
}

/// Blocks the signals of `set` in the calling thread (and the threads it starts afterwards).
fn block_of(set: &libc::sigset_t) -> io::Result<()> {
    // SAFETY: set is a valid signal set; the old mask is not wanted (null).
    check_errno(unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, set, std::ptr::null_mut()) })
}

/// Takes a pending SIGINT or SIGTERM (blocked by [`block`]), waiting at most `timeout`; `None`
/// when none came.
///
/// # Errors
/// When the wait fails.
pub(crate) fn take(timeout: Duration) -> io::Result<Option<Signal>> {
    Ok(take_of(&set(), timeout)?.and_then(Signal::from_raw))
}

/// Takes a pending signal of `set` (blocked), waiting at most `timeout`: its number, `None` when
/// none came.
fn take_of(set: &libc::sigset_t, timeout: Duration) -> io::Result<Option<libc::c_int>> {
    let ts = libc::timespec {
        tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(timeout.subsec_nanos().min(999_999_999) as i32),
    };
    loop {
        // SAFETY: set and ts are valid values we own; the siginfo is not wanted (null).
        match check(unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &ts) }) {
            Ok(raw) => return Ok(Some(raw)),
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// A SIGINT or SIGTERM that is pending now (blocked by [`block`]), taken without waiting.
///
/// # Errors
/// When the pending signals cannot be examined.
pub(crate) fn take_pending() -> io::Result<Option<Signal>> {
    take(Duration::ZERO)
}

/// Waits for SIGINT or SIGTERM (blocked by [`block`]).
///
/// # Errors
/// When the wait fails.
pub(crate) fn wait() -> io::Result<Signal> {
    loop {
        if let Some(s) = take(Duration::from_secs(3600))? {
            return Ok(s);
        }
    }
}

/// What the work of [`during`] can ask of its watcher.
pub(crate) struct Watching {
    #[cfg_attr(not(test), allow(dead_code, reason = "only tests raise signals at the watcher"))]
    thread: libc::pthread_t,
    /// The watcher's thread id.
    #[cfg_attr(not(test), allow(dead_code, reason = "only tests look at the watcher's table"))]
    tid: libc::pid_t,
}

impl Watching {
    /// The watcher's thread id.
    #[cfg(test)]
    pub(crate) fn tid(&self) -> libc::pid_t {
        self.tid
    }

    /// Sends `signal` to the watcher thread alone, as the terminal or `kill` would send it to the
    /// process (a test's way in: a process-wide signal would reach the test harness's threads).
    #[cfg(test)]
    pub(crate) fn raise(&self, signal: Signal) -> io::Result<()> {
        let raw = match signal {
            Signal::Interrupt => libc::SIGINT,
            Signal::Terminate => libc::SIGTERM,
            Signal::Hangup => libc::SIGHUP,
        };
        // SAFETY: the watcher thread runs until `during` has joined it, after the work returned,
        // so the pthread_t names a live thread while the work can call this.
        check_errno(unsafe { libc::pthread_kill(self.thread, raw) })
    }
}

/// How long the watcher waits before it looks again whether the work has finished, should the
/// wake-up ([`wake_signal`]) not reach it: it is woken when the work ends, not by a clock.
const POLL: Duration = Duration::from_secs(5);

/// The signal the work sends its watcher thread alone (`pthread_kill`) when it has finished, so
/// that the watcher waits for signals without waking to poll (20 wake-ups a second cost an idle
/// observer about a millisecond of CPU a second). Only the watcher blocks it; a real-time signal
/// apart from the one that kicks a VP out of KVM_RUN (`SIGRTMIN + 3`).
fn wake_signal() -> libc::c_int {
    libc::SIGRTMIN() + 4
}

/// Wake-ups the watchers of this process took: each work that ended by itself sends one.
static WAKE_UPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The signals the watcher takes: [`set`]'s, and its wake-up.
fn watched_set() -> libc::sigset_t {
    let mut set = set();
    // SAFETY: set is a signal set initialised by `set`; the wake-up is a valid signal number.
    unsafe { libc::sigaddset(&mut set, wake_signal()) };
    set
}

/// Whether the watcher of [`during`] shares the work's table of descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Table {
    /// Shared, as threads share it: `on_signal` may use the work's descriptors (a server's stop
    /// wakes its runtime through one).
    Shared,
    /// The watcher leaves the work's table as it starts (`close_range(3, ~0,
    /// CLOSE_RANGE_UNSHARE)`: a table of its own, with only stdin, stdout and stderr), so the
    /// work's table has one user. The kernel then takes a descriptor for a system call of the
    /// work's without counting a reference to its file (`fdget` of a table no other thread
    /// shares): an observer makes thousands of such calls a refresh. `on_signal` must use no
    /// descriptor. Where the kernel cannot (before Linux 5.9), the table stays shared.
    Apart,
}

/// Runs `work` on the calling thread while a watcher thread takes SIGINT, SIGTERM and SIGHUP; the
/// first one that comes calls `on_signal` (which should make `work` finish soon). Returns what `work`
/// returned and the signal, if one came. Call [`block`] first, before any other thread exists, so
/// that only the watcher takes these signals.
///
/// # Errors
/// When the watcher cannot wait for signals (the work's result is then lost; nothing has been
/// asked of it).
pub(crate) fn during<R>(
    work: impl FnOnce(&Watching) -> R,
    on_signal: impl FnOnce(Signal) + Send,
) -> io::Result<(R, Option<Signal>)> {
    during_with(Table::Shared, work, on_signal)
}

/// As [`during`], the watcher's table of descriptors as `table` says.
///
/// # Errors
/// As [`during`]'s.
pub(crate) fn during_with<R>(
    table: Table,
    work: impl FnOnce(&Watching) -> R,
    on_signal: impl FnOnce(Signal) + Send,
) -> io::Result<(R, Option<Signal>)> {
    let done = AtomicBool::new(false);
    let done = &done;
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        let watcher = s.spawn(move || {
            // The watcher blocks the signals itself too, so `raise` never reaches a default
            // action, and its wake-up, before the work can send it.
            let watched = watched_set();
            block_of(&watched)?;
            if table == Table::Apart {
                leave_table();
            }
            // SAFETY: pthread_self and gettid have no preconditions.
            let _ = tx.send(unsafe { (libc::pthread_self(), libc::gettid()) });
            // `done` is looked at after each wait: the wake-up is sent once it is set, so the
            // watcher ends by taking it (or, should it not come, by its timeout).
            loop {
                match take_of(&watched, POLL)? {
                    Some(raw) if raw == wake_signal() => _ = WAKE_UPS.fetch_add(1, Ordering::Relaxed),
                    Some(raw) => {
                        if let Some(signal) = Signal::from_raw(raw) {
                            on_signal(signal);
                            return Ok(Some(signal));
                        }
                    }
                    None => {}
                }
                if done.load(Ordering::SeqCst) {
                    return Ok(None);
                }
            }
        });
        let (thread, tid) = match rx.recv() {
            Ok(t) => t,
            Err(_) => {
                return Err(watcher
                    .join()
                    .unwrap_or_else(|_| Err(io::Error::other("the signal watcher failed")))
                    .err()
                    .unwrap_or_else(|| io::Error::other("the signal watcher failed")));
            }
        };
        let result = work(&Watching { thread, tid });
        done.store(true, Ordering::SeqCst);
        // The watcher blocks its wake-up, and stays pending until it has taken it: a wake-up sent
        // before it waits is taken at once. Where it cannot be sent, the watcher sees `done`
        // within POLL.
        // SAFETY: the watcher is joined only below, so `thread` still names it (running, or ended
        // and not yet joined, where the signal is dropped).
        let _ = unsafe { libc::pthread_kill(thread, wake_signal()) };
        let signal = watcher.join().map_err(|_| io::Error::other("the signal watcher panicked"))??;
        Ok((result, signal))
    })
}

/// Gives the calling thread a table of descriptors of its own, holding only 0, 1 and 2 (see
/// [`Table::Apart`]); where the kernel cannot, the thread keeps sharing its process's.
fn leave_table() {
    // SAFETY: close_range takes two descriptor numbers and flags and touches no memory of ours;
    // the descriptors it closes are the calling thread's copies, made by the same call.
    let _ = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_UNSHARE) };
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    #[test]
    fn a_signal_during_the_work_stops_it_and_is_reported() {
        for signal in [Signal::Interrupt, Signal::Terminate, Signal::Hangup] {
            let (stop_tx, stop_rx) = mpsc::channel();
            let (result, got) = during(
                |w| {
                    w.raise(signal).unwrap();
                    // The work runs until asked to stop, as `Partition::run` does.
                    stop_rx.recv_timeout(Duration::from_secs(10)).map(|()| "stopped")
                },
                |s| {
                    assert_eq!(s, signal);
                    stop_tx.send(()).unwrap();
                },
            )
            .unwrap();
            assert_eq!(result, Ok("stopped"));
            assert_eq!(got, Some(signal));
            let status = match signal {
                Signal::Interrupt => 130,
                Signal::Terminate => 143,
                Signal::Hangup => 129,
            };
            assert_eq!(got.unwrap().exit_status() as u8, status);
        }
    }

    /// A watcher apart holds no copy of the work's descriptors: one the work closes is closed
    /// (a pipe's reader sees its end), and one the work opens is not in the watcher's table; a
    /// signal still stops the work.
    #[test]
    fn a_watcher_apart_keeps_no_descriptor_of_the_works_open() {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        let (mut reader, writer) = std::io::pipe().unwrap();
        let (stop_tx, stop_rx) = mpsc::channel();
        let (result, got) = during_with(
            Table::Apart,
            |w| {
                // The watcher left the table before it said who it is: by now its table is its own.
                let watcher = w.tid();
                let own = std::fs::File::open("/dev/null").unwrap();
                let theirs = format!("/proc/self/task/{watcher}/fd/{}", own.as_raw_fd());
                // SAFETY: gettid has no preconditions.
                let me = unsafe { libc::gettid() };
                let mine = format!("/proc/self/task/{me}/fd/{}", own.as_raw_fd());
                let seen = (std::path::Path::new(&theirs).exists(), std::path::Path::new(&mine).exists());
                drop(writer);
                let mut rest = Vec::new();
                // Blocks for good if the watcher still held the write end.
                let read = reader.read_to_end(&mut rest).map(|n| n == 0);
                w.raise(Signal::Terminate).unwrap();
                let stopped = stop_rx.recv_timeout(Duration::from_secs(10)).is_ok();
                (seen, read.ok(), stopped)
            },
            move |_| stop_tx.send(()).unwrap(),
        )
        .unwrap();
        assert_eq!(result, ((false, true), Some(true), true));
        assert_eq!(got, Some(Signal::Terminate));
    }

    #[test]
    fn work_that_ends_by_itself_reports_no_signal() {
        let (result, got) = during(|_| 7, |_| panic!("no signal was sent")).unwrap();
        assert_eq!((result, got), (7, None));
    }

    /// The watcher waits for signals without waking on a clock: work that ends wakes it with its
    /// wake-up, which it takes (and does not report as a signal).
    #[test]
    fn work_that_ends_wakes_its_watcher_with_its_wake_up() {
        let before = WAKE_UPS.load(Ordering::Relaxed);
        let (result, got) = during(
            |_| {
                // Long enough that the watcher is waiting when the work ends.
                std::thread::sleep(Duration::from_millis(200));
                "done"
            },
            |_| panic!("no signal was sent"),
        )
        .unwrap();
        assert_eq!((result, got), ("done", None));
        assert!(
            WAKE_UPS.load(Ordering::Relaxed) > before,
            "the watcher ended by its wake-up, not its timeout"
        );
    }
}
