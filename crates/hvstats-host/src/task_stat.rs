//! The one parser of procfs `stat` lines (`/proc/<pid>/stat`, `/proc/<pid>/task/<tid>/stat`).
//!
//! The command name (field 2) is in parentheses and may itself hold spaces and parentheses, so
//! fields are counted after its *last* `)`. Every reader of a `stat` line in hvstats — a
//! publisher's start time, a hardware-counter holder's liveness, a VP's or an observed vCPU
//! thread's guest time — goes through [`StatLine`], numbering fields as proc(5) does.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// proc(5) field 3: the state letter.
pub const STATE: usize = 3;
/// proc(5) field 10: minor faults, those that loaded no page from disk.
pub const MIN_FLT: usize = 10;
/// proc(5) field 12: major faults, those that loaded a page from disk.
pub const MAJ_FLT: usize = 12;
/// proc(5) field 22: start time, in clock ticks after boot.
pub const START_TIME: usize = 22;
/// proc(5) field 43: guest time, in clock ticks (time running a vCPU in guest mode).
pub const GUEST_TIME: usize = 43;

/// A parsed `stat` line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatLine<'a> {
    comm: &'a str,
    /// Everything after the command's closing parenthesis: field 3 onwards.
    rest: &'a str,
}

impl<'a> StatLine<'a> {
    /// Splits `text` at its command name; `None` when it has no `(...)`.
    pub fn parse(text: &'a str) -> Option<Self> {
        let open = text.find('(')?;
        let close = text.rfind(')')?;
        Some(Self { comm: text.get(open + 1..close)?, rest: text.get(close + 1..)? })
    }

    /// Field 2, the command name, without its parentheses.
    pub fn comm(&self) -> &'a str {
        self.comm
    }

    /// Field `n` (numbered as in proc(5), from 3 on) as text.
    pub fn field(&self, n: usize) -> Option<&'a str> {
        self.rest.split_ascii_whitespace().nth(n.checked_sub(STATE)?)
    }

    /// Field `n` as a number.
    pub fn number(&self, n: usize) -> Option<u64> {
        self.field(n)?.parse().ok()
    }

    /// The state letter (`R`, `S`, `Z`, ...).
    pub fn state(&self) -> Option<char> {
        self.field(STATE)?.chars().next()
    }

    /// The start time, in clock ticks after boot.
    pub fn start_time(&self) -> Option<u64> {
        self.number(START_TIME)
    }

    /// The guest time, in clock ticks.
    pub fn guest_ticks(&self) -> Option<u64> {
        self.number(GUEST_TIME)
    }

    /// Minor faults (those that loaded no page from disk) since the task began.
    pub fn minor_faults(&self) -> Option<u64> {
        self.number(MIN_FLT)
    }

    /// Major faults (those that loaded a page from disk) since the task began.
    pub fn major_faults(&self) -> Option<u64> {
        self.number(MAJ_FLT)
    }
}

/// Longer than any `stat` line (the command name is at most 64 bytes, the 52 numbers at most
/// 20 digits each).
pub const STAT_MAX: usize = 2048;

/// A `stat` file kept open and re-read with `pread` into the caller's buffer: a reading costs one
/// system call and no allocation.
#[derive(Debug)]
pub struct StatFile {
    file: File,
}

impl StatFile {
    /// Opens the `stat` file at `path`.
    ///
    /// # Errors
    /// When it cannot be opened (the task is gone, or there is no procfs).
    pub fn open(path: &Path) -> io::Result<Self> {
        Ok(Self { file: File::open(path)? })
    }

    /// Reads the line into `buf` and parses it.
    ///
    /// # Errors
    /// When the task is gone (ESRCH), or the text is empty, oversized or not a `stat` line.
    pub fn read<'b>(&self, buf: &'b mut [u8; STAT_MAX]) -> io::Result<StatLine<'b>> {
        let n = self.file.read_at(buf, 0)?;
        if n == 0 || n == buf.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "empty or oversized stat"));
        }
        std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(StatLine::parse)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unparsable stat"))
    }
}

/// `<procfs>/<pid>/task/<tid>/stat`.
pub fn thread_path(procfs: &Path, pid: i32, tid: i32) -> PathBuf {
    procfs.join(pid.to_string()).join("task").join(tid.to_string()).join("stat")
}

/// Clock ticks per second (`_SC_CLK_TCK`; 100 when unknown).
pub fn ticks_per_second() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let t = crate::os::check_long(unsafe { libc::sysconf(libc::_SC_CLK_TCK) });
    t.ok().and_then(|t| u64::try_from(t).ok()).filter(|&t| t > 0).unwrap_or(100)
}

/// `ticks` clock ticks in 100 ns units.
pub fn ticks_to_100ns(ticks: u64) -> u64 {
    ticks.saturating_mul(10_000_000 / ticks_per_second())
}

/// The wall-clock time of a start time in clock ticks after boot (`stat` field 22, which the
/// kernel counts on the boot-time clock): the boot's wall-clock time (now, less the boot-time
/// clock), down to the clock tick, plus the start time; `None` when the clock cannot be read or the
/// time lies in the future.
///
/// The boot's time is taken to the tick, the start time's own resolution, so two readings a
/// process apart give the same instant: what a thread's counters are dated by stays the same
/// across an observer's restart.
pub fn started_at(start_ticks: u64) -> Option<std::time::SystemTime> {
    let since_boot = crate::os::clock_time(libc::CLOCK_BOOTTIME).ok()?;
    let booted =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?.checked_sub(since_boot)?;
    let hz = u128::from(ticks_per_second());
    let tick_ns = 1_000_000_000 / hz;
    let booted = std::time::Duration::from_nanos(u64::try_from(booted.as_nanos() / tick_ns * tick_ns).ok()?);
    let started =
        std::time::Duration::from_nanos(u64::try_from(u128::from(start_ticks) * 1_000_000_000 / hz).ok()?);
    (started <= since_boot).then(|| std::time::UNIX_EPOCH + booted + started)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_started_before_now_and_after_boot() {
        let text = std::fs::read_to_string("/proc/self/stat").unwrap();
        let ticks = StatLine::parse(&text).and_then(|s| s.start_time()).unwrap();
        let at = started_at(ticks).unwrap();
        let age = std::time::SystemTime::now().duration_since(at).unwrap();
        // A tick's rounding at most, and no test process lives a day.
        assert!(age < std::time::Duration::from_secs(86_400), "{age:?}");
        assert!(started_at(u64::MAX).is_none(), "a start in the future is no time");
    }

    #[test]
    fn a_start_time_read_again_is_the_same_instant() {
        let text = std::fs::read_to_string("/proc/self/stat").unwrap();
        let ticks = StatLine::parse(&text).and_then(|s| s.start_time()).unwrap();
        let first = started_at(ticks).unwrap();
        for _ in 0..1_000 {
            assert_eq!(started_at(ticks).unwrap(), first);
        }
    }

    #[test]
    fn fields_are_counted_after_the_last_parenthesis_of_a_strange_command_name() {
        let mut fields: Vec<String> = (3..=52).map(|i| i.to_string()).collect();
        fields[0] = "S".into();
        fields[GUEST_TIME - 3] = "777".into();
        fields[START_TIME - 3] = "4242".into();
        let line = format!("123 (a) b (c) {}", fields.join(" "));
        let stat = StatLine::parse(&line).unwrap();
        assert_eq!(stat.comm(), "a) b (c");
        assert_eq!(stat.state(), Some('S'));
        assert_eq!(stat.guest_ticks(), Some(777));
        assert_eq!(stat.start_time(), Some(4242));
        assert_eq!(stat.field(2), None, "the command is not a numbered field here");
        assert_eq!(stat.number(53), None);
    }

    #[test]
    fn garbage_is_not_a_stat_line() {
        assert_eq!(StatLine::parse("garbage"), None);
        assert_eq!(StatLine::parse("1 (x").map(|s| s.state()), None);
        assert_eq!(StatLine::parse("1 (x)").and_then(|s| s.state()), None);
        assert_eq!(StatLine::parse(")(").map(|s| s.comm()), None);
    }

    #[test]
    fn this_thread_reads_as_running() {
        let text = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let stat = StatLine::parse(&text).unwrap();
        assert_eq!(stat.state(), Some('R'));
        assert!(stat.start_time().is_some());
        assert!(stat.guest_ticks().is_some());
    }
}
