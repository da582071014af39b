//! A thread's scheduler accounting: time on a CPU, time waiting for one, and dispatches.
//!
//! Hyper-V counts how long a virtual processor waited for a logical processor to run on (perfmon's
//! "CPU Wait Time Per Dispatch"). On Linux a VP is a thread, and the scheduler keeps exactly that
//! for every thread in `/proc/<pid>/task/<tid>/schedstat`: three numbers, the time run on a CPU
//! (ns), the time spent runnable on a run queue waiting for a CPU (ns), and the number of times the
//! thread was put on a CPU (its dispatches, or timeslices). This module reads that file for any
//! thread — a VP thread of an own partition or the vCPU thread of an observed VM — and says
//! clearly what is wrong when the file is missing or not what the kernel writes.
//!
//! [`SchedStatFile`] keeps the file open and re-reads it with `pread` into a stack buffer, so a
//! reading on a collector's cadence costs one system call and no allocation.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// One reading of a thread's scheduler accounting, as the kernel keeps it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedStat {
    /// Time the thread ran on a CPU, in nanoseconds.
    pub run_ns: u64,
    /// Time the thread was runnable but waiting on a run queue for a CPU, in nanoseconds.
    pub wait_ns: u64,
    /// Number of times the thread was put on a CPU (its timeslices).
    pub dispatches: u64,
}

impl SchedStat {
    /// Average wait for a CPU per dispatch, in nanoseconds (`None` before the first dispatch).
    pub fn wait_per_dispatch_ns(&self) -> Option<f64> {
        (self.dispatches > 0).then(|| self.wait_ns as f64 / self.dispatches as f64)
    }

    #[cfg(test)]
    /// The share of the thread's runnable time spent waiting, in percent (`None` when it was
    /// never runnable).
    pub(crate) fn percent_waiting(&self) -> Option<f64> {
        let runnable = self.run_ns.checked_add(self.wait_ns)?;
        (runnable > 0).then(|| 100.0 * self.wait_ns as f64 / runnable as f64)
    }

    /// What happened between `earlier` and `self` (`None` if any field went backwards: not the
    /// same thread).
    pub fn since(&self, earlier: &SchedStat) -> Option<SchedStat> {
        Some(SchedStat {
            run_ns: self.run_ns.checked_sub(earlier.run_ns)?,
            wait_ns: self.wait_ns.checked_sub(earlier.wait_ns)?,
            dispatches: self.dispatches.checked_sub(earlier.dispatches)?,
        })
    }
}

/// Why a thread's scheduler accounting could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SchedError {
    /// The file could not be opened: no such thread, no procfs, or a kernel without
    /// `CONFIG_SCHED_INFO`.
    #[error("cannot open {}", path.display())]
    Open {
        /// The schedstat file (a thread's `/proc/<pid>/task/<tid>/schedstat`, or a copy).
        path: PathBuf,
        /// The `open` error (`ENOENT` for no such thread or a kernel without schedstat).
        #[source]
        source: io::Error,
    },
    /// The file could not be read (the thread exited after it was opened: `ESRCH`).
    #[error("cannot read {}", path.display())]
    Read {
        /// The schedstat file (a thread's `/proc/<pid>/task/<tid>/schedstat`, or a copy).
        path: PathBuf,
        /// The read error (`ESRCH` when the thread exited after the open).
        #[source]
        source: io::Error,
    },
    /// The file does not hold what the kernel writes there.
    #[error("{} is not a schedstat line ({reason}): {text:?}", path.display())]
    Malformed {
        /// The schedstat file (a thread's `/proc/<pid>/task/<tid>/schedstat`, or a copy).
        path: PathBuf,
        /// What is wrong.
        reason: &'static str,
        /// The start of what the file held.
        text: String,
    },
}

/// Longer than any schedstat line: three 20-digit numbers, two spaces and a newline make 63.
const SCHEDSTAT_MAX: usize = 128;

/// Parses a schedstat line: exactly three unsigned decimal numbers separated by single spaces,
/// ending in one newline (`"%llu %llu %lu\n"`, as `proc_pid_schedstat` prints it).
///
/// # Errors
/// A description of what is wrong, for [`SchedError::Malformed`].
pub fn parse(text: &[u8]) -> Result<SchedStat, &'static str> {
    if text.is_empty() {
        return Err("empty");
    }
    if text.len() >= SCHEDSTAT_MAX {
        return Err("too long");
    }
    let line = text.strip_suffix(b"\n").ok_or("no newline at the end")?;
    let mut fields = line.split(|&b| b == b' ');
    let mut next = || -> Result<u64, &'static str> {
        let field = fields.next().ok_or("fewer than three fields")?;
        if field.is_empty() || !field.iter().all(u8::is_ascii_digit) {
            return Err("a field is not an unsigned decimal number");
        }
        // All ASCII digits, so valid UTF-8; the parse fails only on overflow.
        std::str::from_utf8(field).ok().and_then(|f| f.parse().ok()).ok_or("a number does not fit in 64 bits")
    };
    let stat = SchedStat { run_ns: next()?, wait_ns: next()?, dispatches: next()? };
    if fields.next().is_some() {
        return Err("more than three fields");
    }
    Ok(stat)
}

/// The schedstat file of thread `tid` of process `pid`.
pub(crate) fn path_of(pid: libc::pid_t, tid: libc::pid_t) -> PathBuf {
    path_under(Path::new("/proc"), pid, tid)
}

/// The schedstat file of thread `tid` of process `pid` under the procfs at `procfs`.
pub fn path_under(procfs: &Path, pid: libc::pid_t, tid: libc::pid_t) -> PathBuf {
    procfs.join(pid.to_string()).join("task").join(tid.to_string()).join("schedstat")
}

#[cfg(test)]
/// Reads the scheduler accounting of thread `tid` of process `pid` once.
///
/// # Errors
/// When the file cannot be opened or read, or does not hold a schedstat line.
pub(crate) fn read_thread(pid: libc::pid_t, tid: libc::pid_t) -> Result<SchedStat, SchedError> {
    SchedStatFile::open(pid, tid)?.read()
}

/// A thread's schedstat file, kept open to be read repeatedly.
#[derive(Debug)]
pub struct SchedStatFile {
    file: File,
    path: PathBuf,
}

impl SchedStatFile {
    /// Opens the schedstat file of thread `tid` of process `pid`.
    ///
    /// # Errors
    /// [`SchedError::Open`] when there is no such thread (or no such file).
    pub fn open(pid: libc::pid_t, tid: libc::pid_t) -> Result<Self, SchedError> {
        Self::open_path(&path_of(pid, tid))
    }

    /// Opens a schedstat file by path (a thread's, or a copy of one).
    ///
    /// # Errors
    /// [`SchedError::Open`] when it cannot be opened.
    pub fn open_path(path: &Path) -> Result<Self, SchedError> {
        let file = File::open(path).map_err(|source| SchedError::Open { path: path.to_owned(), source })?;
        Ok(Self { file, path: path.to_owned() })
    }

    /// The path of the file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The thread's accounting now.
    ///
    /// # Errors
    /// [`SchedError::Read`] when the thread has exited, [`SchedError::Malformed`] when the file
    /// does not hold a schedstat line.
    pub fn read(&self) -> Result<SchedStat, SchedError> {
        let mut buf = [0u8; SCHEDSTAT_MAX];
        let mut len = 0;
        // Read to end of file (procfs gives the line in one read, a regular file may not); a file
        // longer than the buffer is malformed, not a reason to allocate.
        while len < buf.len() {
            match self.file.read_at(&mut buf[len..], len as u64) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => return Err(SchedError::Read { path: self.path.clone(), source }),
            }
        }
        parse(&buf[..len]).map_err(|reason| SchedError::Malformed {
            path: self.path.clone(),
            reason,
            text: String::from_utf8_lossy(&buf[..len.min(64)]).into_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_line_parses_into_its_three_fields() {
        let s = parse(b"72439541 39384365 112\n").unwrap();
        assert_eq!(s, SchedStat { run_ns: 72_439_541, wait_ns: 39_384_365, dispatches: 112 });
        assert_eq!(parse(b"18446744073709551615 0 0\n").unwrap().run_ns, u64::MAX);
    }

    #[test]
    fn anything_else_is_refused_with_its_reason() {
        for (text, reason) in [
            (&b""[..], "empty"),
            (b"1 2 3", "no newline at the end"),
            (b"1 2\n", "fewer than three fields"),
            (b"1 2 3 4\n", "more than three fields"),
            (b"1 -2 3\n", "a field is not an unsigned decimal number"),
            (b"1  2 3\n", "a field is not an unsigned decimal number"),
            (b"1 2 3\n\n", "a field is not an unsigned decimal number"),
            (b"1 x 3\n", "a field is not an unsigned decimal number"),
            (b"18446744073709551616 0 0\n", "a number does not fit in 64 bits"),
            (&[b'1'; 200][..], "too long"),
        ] {
            assert_eq!(parse(text), Err(reason), "{:?}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn derived_values_follow_the_raw_ones() {
        let s = SchedStat { run_ns: 300, wait_ns: 100, dispatches: 4 };
        assert_eq!(s.wait_per_dispatch_ns(), Some(25.0));
        assert_eq!(s.percent_waiting(), Some(25.0));
        assert_eq!(SchedStat::default().wait_per_dispatch_ns(), None);
        assert_eq!(SchedStat::default().percent_waiting(), None);
        let later = SchedStat { run_ns: 500, wait_ns: 150, dispatches: 6 };
        assert_eq!(later.since(&s), Some(SchedStat { run_ns: 200, wait_ns: 50, dispatches: 2 }));
        assert_eq!(s.since(&later), None);
    }

    #[test]
    fn a_missing_thread_is_an_open_error_naming_the_file() {
        let e = read_thread(std::process::id() as libc::pid_t, libc::pid_t::MAX).unwrap_err();
        assert!(matches!(e, SchedError::Open { .. }), "{e:?}");
        assert!(e.to_string().contains(&format!("/task/{}/schedstat", libc::pid_t::MAX)), "{e}");
    }

    #[test]
    fn a_file_of_garbage_is_malformed_not_a_panic() {
        let dir = std::env::temp_dir().join(format!("hvstats-sched-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("schedstat");
        for content in [&b"not numbers\n"[..], &[b'7'; 4096][..], b"\xff\xfe 1 2\n"] {
            std::fs::write(&path, content).unwrap();
            let e = SchedStatFile::open_path(&path).unwrap().read().unwrap_err();
            assert!(matches!(e, SchedError::Malformed { .. }), "{e:?}");
            assert!(e.to_string().contains("is not a schedstat line"), "{e}");
        }
        std::fs::write(&path, b"5 6 7\n").unwrap();
        let ok = SchedStatFile::open_path(&path).unwrap().read().unwrap();
        assert_eq!(ok, SchedStat { run_ns: 5, wait_ns: 6, dispatches: 7 });
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
