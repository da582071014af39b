//! One observer per runtime directory.
//!
//! An observer of a runtime directory adopts the in-kernel counts kept for it, claims its VMs
//! there and leaves its mark ([`crate::observer_mark`]). A second observer of the same directory
//! would adopt the rows the first is counting with, replace the first's mark and remove it on
//! exit. So an observer takes [`LOCK`] first, before anything else it does there: an exclusive
//! `flock` held for its whole life, which the kernel drops with the process (an observer that
//! crashed never blocks the next one). A second observer finds it taken and is refused, told who
//! holds it: the holder writes its pid, when it took the lock and its command line into the file.
//!
//! The file gets the runtime directory's discipline (the effective user's directory, never
//! through a link, a regular file); what it holds is only ever shown, never acted upon.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use hvstats_host::os;

use crate::runtime_dir::{Dir, RuntimeDirError, Use};

/// The lock's file name, at the top of the runtime directory.
pub const LOCK: &str = "observer.lock";

/// The longest holder text read.
const MAX_LEN: u64 = 512;

/// The longest command line written.
const MAX_COMMAND: usize = 256;

/// The observer holding a runtime directory, as it said when it took it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// Its process id.
    pub pid: i32,
    /// When it took the lock.
    pub since: SystemTime,
    /// Its command line, arguments separated by spaces (control characters shown as `?`).
    pub command: String,
}

/// Why the runtime directory could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The runtime directory or the lock file failed its checks or could not be opened.
    #[error(transparent)]
    Dir(#[from] RuntimeDirError),
    /// Another observer holds it (`holder`: who, when it said so already).
    #[error("{} is held by another observer{}", path.display(), holder.as_ref().map(|h| format!(", pid {}", h.pid)).unwrap_or_default())]
    Held {
        /// The lock file.
        path: PathBuf,
        /// Who holds it, when the file says.
        holder: Option<Holder>,
    },
    /// The lock could not be taken or the holder could not be written.
    #[error("{}: {what}", path.display())]
    Io {
        /// The lock file.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// The runtime directory, held by this observer until dropped (or until the process ends).
#[derive(Debug)]
pub struct ObserverLock {
    _file: File,
}

/// Takes the runtime directory `runtime_dir` for this process's observer.
///
/// # Errors
/// [`LockError::Held`] when another observer holds it; the others when the directory fails its
/// checks or the lock file cannot be opened, locked or written.
pub fn take(runtime_dir: &Path) -> Result<ObserverLock, LockError> {
    let dir = Dir::open(runtime_dir, Use::Publish)?;
    let path = dir.path().join(LOCK);
    let mut file = open_or_create(&dir)?;
    // SAFETY: flock on a descriptor we own; no memory is passed.
    if let Err(e) = os::check(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }) {
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(LockError::Held { holder: read_holder(&mut file), path });
        }
        return Err(LockError::Io { path, what: "lock", source: e });
    }
    let io = |source| LockError::Io { path: path.clone(), what: "write", source };
    file.set_len(0).map_err(io)?;
    let since = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let text = format!("{}\n{}\n{}\n", std::process::id(), since.as_micros(), own_command());
    std::os::unix::fs::FileExt::write_all_at(&file, text.as_bytes(), 0).map_err(io)?;
    Ok(ObserverLock { _file: file })
}

/// The lock file, made (mode 0644: who holds the directory is no secret) when missing.
fn open_or_create(dir: &Dir) -> Result<File, RuntimeDirError> {
    match dir.open_file(LOCK, true) {
        Err(e) if e.io_kind() == Some(io::ErrorKind::NotFound) => match dir.create_file(LOCK, 0o644, None) {
            // Made by another observer starting at the same moment: open theirs.
            Err(e) if e.io_kind() == Some(io::ErrorKind::AlreadyExists) => dir.open_file(LOCK, true),
            made => made,
        },
        opened => opened,
    }
}

/// The holder a lock file names (`None` when it names none yet, or not as a holder writes).
fn read_holder(file: &mut File) -> Option<Holder> {
    let mut text = String::new();
    file.take(MAX_LEN).read_to_string(&mut text).ok()?;
    parse_holder(&text)
}

/// A holder's text: its pid, the time it took the lock (µs since the epoch) and its command, a
/// line each.
fn parse_holder(text: &str) -> Option<Holder> {
    let mut lines = text.lines();
    let pid = lines.next()?.parse().ok().filter(|&p: &i32| p > 0)?;
    let us: u64 = lines.next()?.parse().ok()?;
    let since = SystemTime::UNIX_EPOCH.checked_add(Duration::from_micros(us))?;
    let command = lines.next().unwrap_or_default().chars().map(shown).collect();
    Some(Holder { pid, since, command })
}

/// A character of a command as a message shows it.
fn shown(c: char) -> char {
    if c.is_control() { '?' } else { c }
}

/// This process's command line, arguments separated by spaces, at most [`MAX_COMMAND`] bytes.
fn own_command() -> String {
    let raw = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    let mut command: String = String::from_utf8_lossy(&raw)
        .trim_end_matches('\0')
        .chars()
        .map(|c| if c == '\0' { ' ' } else { shown(c) })
        .collect();
    if command.len() > MAX_COMMAND {
        let mut end = MAX_COMMAND;
        while !command.is_char_boundary(end) {
            end -= 1;
        }
        command.truncate(end);
    }
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_taker_is_told_who_holds_the_directory_and_takes_it_once_released() {
        let tmp = hvstats_testkit::TempDir::new("observer-lock");
        let first = take(tmp.path()).unwrap();
        // flock locks belong to the open file: a second open in this process is a second taker.
        match take(tmp.path()) {
            Err(LockError::Held { holder: Some(holder), path }) => {
                assert_eq!(holder.pid, std::process::id() as i32);
                assert!(!holder.command.is_empty());
                let age = SystemTime::now().duration_since(holder.since).unwrap();
                assert!(age < Duration::from_secs(600), "{age:?}");
                assert_eq!(path, tmp.path().join(LOCK));
            }
            other => panic!("{other:?}"),
        }
        drop(first);
        let again = take(tmp.path()).unwrap();
        drop(again);
    }

    #[test]
    fn a_holder_text_that_is_not_one_names_no_holder() {
        for text in ["", "x\n1\nc\n", "0\n1\nc\n", "12\nnot a time\n", "-3\n5\n"] {
            assert_eq!(parse_holder(text), None, "{text:?}");
        }
        let h = parse_holder("12\n5000000\nhvstats\u{1b}[2J observe\n").unwrap();
        assert_eq!((h.pid, h.command.as_str()), (12, "hvstats?[2J observe"));
        assert_eq!(h.since, SystemTime::UNIX_EPOCH + Duration::from_secs(5));
    }
}
