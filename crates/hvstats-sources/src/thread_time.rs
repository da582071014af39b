//! A VP thread's CPU time and guest time, from procfs.
//!
//! Total run time is the thread's CPU clock (`clock_gettime` of its per-thread clock, which
//! includes the slice it is running right now, unlike `schedstat`). Guest time is field 43 of
//! `stat` (clock ticks): on VMX/SVM hosts it grows while the guest runs; under KVM's instruction
//! emulator it stays 0 and all of the VP's time is hypervisor time.
//!
//! [`ThreadClock`] keeps the `stat` file open and re-reads it with `pread` into a stack buffer, so
//! a reading costs two system calls and no allocation.

use std::io;
use std::path::Path;

use hvstats_host::task_stat::{self, STAT_MAX, StatFile, StatLine};

use hvstats_host::os as sys;

/// One reading of a thread's times, in 100 ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadTimes {
    /// CPU time of the thread.
    pub total_100ns: u64,
    /// Guest time of the thread (0 under instruction emulation).
    pub guest_100ns: u64,
}

impl ThreadTimes {
    /// Time outside the guest: total less guest time.
    pub fn hypervisor_100ns(self) -> u64 {
        self.total_100ns.saturating_sub(self.guest_100ns)
    }
}

/// Reads the times of thread `tid` of this process.
///
/// # Errors
/// When procfs cannot be read or parsed.
pub fn read(tid: libc::pid_t) -> io::Result<ThreadTimes> {
    let run_ns = thread_cpu_ns(tid)?;
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))?;
    let guest_ticks = parse_guest_ticks(&stat)?;
    Ok(ThreadTimes { total_100ns: run_ns / 100, guest_100ns: task_stat::ticks_to_100ns(guest_ticks) })
}

/// The guest time (clock ticks) of thread `tid` of process `pid`, under the procfs at `procfs`:
/// for threads of other processes (an observed VMM's vCPU threads).
///
/// # Errors
/// When the thread's `stat` cannot be read or parsed.
pub fn guest_ticks_of(procfs: &Path, pid: i32, tid: i32) -> io::Result<u64> {
    parse_guest_ticks(&std::fs::read_to_string(task_stat::thread_path(procfs, pid, tid))?)
}

/// A thread's times, read repeatedly.
#[derive(Debug)]
pub struct ThreadClock {
    tid: libc::pid_t,
    stat: StatFile,
}

impl ThreadClock {
    /// Opens the times of thread `tid` of this process.
    ///
    /// # Errors
    /// When its `stat` file cannot be opened (the thread is gone, or there is no procfs).
    pub fn open(tid: libc::pid_t) -> io::Result<Self> {
        let stat = StatFile::open(Path::new(&format!("/proc/self/task/{tid}/stat")))?;
        Ok(Self { tid, stat })
    }

    /// The thread's times now.
    ///
    /// # Errors
    /// When the thread is gone or its `stat` cannot be parsed.
    pub fn read(&self) -> io::Result<ThreadTimes> {
        let run_ns = thread_cpu_ns(self.tid)?;
        let mut buf = [0u8; STAT_MAX];
        let guest_ticks = self
            .stat
            .read(&mut buf)?
            .guest_ticks()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "stat without guest time"))?;
        Ok(ThreadTimes { total_100ns: run_ns / 100, guest_100ns: task_stat::ticks_to_100ns(guest_ticks) })
    }
}

/// CPU time of thread `tid` of this process, from its per-thread CPU clock
/// (`MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)`).
fn thread_cpu_ns(tid: libc::pid_t) -> io::Result<u64> {
    let clock = ((!tid) << 3) | 6;
    // An invalid clock id (a thread gone) gives EINVAL.
    let time = sys::clock_time(clock as libc::clockid_t)?;
    Ok(u64::try_from(time.as_nanos()).unwrap_or(u64::MAX))
}

/// Field 43 (guest_time) of a `stat` line.
fn parse_guest_ticks(stat: &str) -> io::Result<u64> {
    StatLine::parse(stat)
        .and_then(|s| s.guest_ticks())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unparsable stat"))
}

/// The calling thread's id.
pub fn gettid() -> libc::pid_t {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_time_is_field_43_even_with_a_strange_command_name() {
        let mut fields: Vec<String> = (3..=52).map(|i| i.to_string()).collect();
        fields[43 - 3] = "777".into();
        let line = format!("123 (a) b (c) {}", fields.join(" "));
        assert_eq!(parse_guest_ticks(&line).unwrap(), 777);
        assert!(parse_guest_ticks("garbage").is_err());
    }

    #[test]
    fn own_thread_times_are_readable() {
        let t = read(gettid()).unwrap();
        assert!(t.total_100ns > 0);
        assert!(t.hypervisor_100ns() <= t.total_100ns);
    }

    #[test]
    fn an_open_clock_rereads_the_same_thread() {
        let clock = ThreadClock::open(gettid()).unwrap();
        let first = clock.read().unwrap();
        // Burn some CPU so the thread's time moves.
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(5) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let second = clock.read().unwrap();
        assert!(second.total_100ns > first.total_100ns, "{first:?} then {second:?}");
        assert_eq!(second.guest_100ns, read(gettid()).unwrap().guest_100ns);
    }
}
