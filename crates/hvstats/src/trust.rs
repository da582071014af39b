//! Whether an instance's files are believed: they must belong to the user whose process holds
//! them.
//!
//! A publisher keeps its instance alive by holding a `flock` on its files (see
//! [`crate::publish`]). The kernel lists every flock in `/proc/locks` with the pid that took it,
//! as the reading process's PID namespace numbers it; a lock taken by a process that namespace
//! cannot see is not listed. A reader therefore checks, before it believes anything an instance
//! says:
//!
//! - when the holder is listed: the file belongs to the user the holder runs as (its effective
//!   uid), and, when the holder is in the reader's own PID namespace, it is the pid the instance
//!   claims in its header (a copy of another instance's files, or a pid reused under a stale
//!   name, is not that instance);
//! - when no holder is listed (a publisher in a PID namespace this one cannot see): the file
//!   belongs to the runtime directory's owner, the only user who can create files there.
//!
//! What cannot be read (`/proc` hidden, a process gone between two reads) is not held against
//! the instance: the checks that could be made decide.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsFd;

use crate::runtime_dir;

/// At most this much of `/proc/locks` is read (a host with more locks than that is checked on
/// the part read).
const MAX_LOCKS_BYTES: u64 = 16 << 20;

/// Why an instance's files are not believed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Distrust {
    /// The file belongs to another user than the process holding its lock runs as.
    #[error("it belongs to uid {owner} but the process holding it (pid {pid}) runs as uid {holder_uid}")]
    NotTheHoldersFile {
        /// The file's owner.
        owner: u32,
        /// The holder, as this PID namespace numbers it.
        pid: u32,
        /// The holder's effective uid.
        holder_uid: u32,
    },
    /// The file says its publisher is one process, and another one holds its lock.
    #[error("it claims to be published by pid {claimed} but pid {pid} holds it")]
    NotTheClaimedPid {
        /// The pid in the file's header.
        claimed: u64,
        /// The pid of the process holding the file's lock, in this PID namespace.
        pid: u32,
    },
    /// No holder is visible, and the file does not belong to the runtime directory's owner.
    #[error("it belongs to uid {owner}, not to the runtime directory's owner (uid {dir_owner})")]
    NotTheDirectoryOwners {
        /// The file's owner.
        owner: u32,
        /// The directory's owner.
        dir_owner: u32,
    },
}

/// A process `/proc/locks` lists as holding a flock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holder {
    /// Its pid in this PID namespace.
    pub pid: u32,
    /// Its effective uid, when `/proc/<pid>/status` could be read.
    pub euid: Option<u32>,
    /// Whether it runs in this process's PID namespace, when that could be read.
    pub same_pid_namespace: Option<bool>,
}

/// The pids `locks` (the text of `/proc/locks`) lists as holding a flock on the inode `ino` of
/// the device `major:minor` (waiters, listed with `->`, hold nothing).
pub(crate) fn flock_holders(locks: &str, major: u32, minor: u32, ino: u64) -> Vec<u32> {
    let want = format!("{major:02x}:{minor:02x}:{ino}");
    let mut pids = Vec::new();
    for line in locks.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // "<n>: FLOCK ADVISORY WRITE <pid> <maj>:<min>:<ino> <start> <end>"
        let [_, "FLOCK", _, _, pid, file, ..] = fields.as_slice() else { continue };
        let pid = pid.parse::<u32>().unwrap_or(0);
        if *file == want && pid != 0 && !pids.contains(&pid) {
            pids.push(pid);
        }
    }
    pids
}

/// The effective uid in the text of `/proc/<pid>/status`.
pub(crate) fn effective_uid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The processes holding a flock on `file`.
///
/// # Errors
/// When `file` cannot be stat'ed or `/proc/locks` cannot be read.
pub fn holders(file: &File) -> io::Result<Vec<Holder>> {
    holders_of(&runtime_dir::fstat(file.as_fd())?)
}

/// The processes holding a flock on the file `st` describes.
fn holders_of(st: &libc::stat) -> io::Result<Vec<Holder>> {
    let mut locks = String::new();
    File::open("/proc/locks")?.take(MAX_LOCKS_BYTES).read_to_string(&mut locks)?;
    let own_ns = std::fs::read_link("/proc/self/ns/pid").ok();
    let holders = flock_holders(&locks, libc::major(st.st_dev), libc::minor(st.st_dev), st.st_ino)
        .into_iter()
        .map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok();
            let ns = std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
            Holder {
                pid,
                euid: status.as_deref().and_then(effective_uid),
                same_pid_namespace: own_ns.as_ref().zip(ns).map(|(own, theirs)| *own == theirs),
            }
        })
        .collect();
    Ok(holders)
}

/// Decides whether a file owned by `owner`, whose header claims publisher pid `claimed`, held by
/// `holders`, in a directory owned by `dir_owner`, is believed.
///
/// # Errors
/// The first [`Distrust`] found.
pub fn check(owner: u32, claimed: u64, holders: &[Holder], dir_owner: u32) -> Result<(), Distrust> {
    if holders.is_empty() && owner != dir_owner {
        return Err(Distrust::NotTheDirectoryOwners { owner, dir_owner });
    }
    for h in holders {
        match h.euid {
            Some(holder_uid) if holder_uid != owner => {
                return Err(Distrust::NotTheHoldersFile { owner, pid: h.pid, holder_uid });
            }
            _ => {}
        }
        if h.same_pid_namespace == Some(true) && u64::from(h.pid) != claimed {
            return Err(Distrust::NotTheClaimedPid { claimed, pid: h.pid });
        }
    }
    Ok(())
}

/// Checks `file` (whose header claims publisher pid `claimed`) in a directory owned by
/// `dir_owner`, reading `/proc` for its holders.
///
/// # Errors
/// Why it is not believed. A file or `/proc/locks` that cannot be read is checked as if no
/// holder were listed.
pub fn verify(file: &File, claimed: u64, dir_owner: u32) -> Result<(), Distrust> {
    let st = match runtime_dir::fstat(file.as_fd()) {
        Ok(st) => st,
        // Unreadable metadata is the reader's own problem to report when it reads the file.
        Err(_) => return Ok(()),
    };
    let holders = holders_of(&st).unwrap_or_default();
    check(st.st_uid, claimed, &holders, dir_owner)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCKS: &str = "\
1: POSIX  ADVISORY  WRITE 812 00:19:1234 0 EOF
2: FLOCK  ADVISORY  WRITE 4242 00:2d:98765 0 EOF
2: -> FLOCK  ADVISORY  WRITE 4343 00:2d:98765 0 EOF
3: FLOCK  ADVISORY  READ 17 00:2d:98765 0 EOF
4: FLOCK  ADVISORY  WRITE 99 00:2d:987650 0 EOF
5: OFDLCK ADVISORY  READ -1 00:2d:98765 0 EOF
6: LEASE  ACTIVE    READ 55 00:2d:98765 0 EOF
7: FLOCK  ADVISORY  WRITE 0 00:2d:98765 0 EOF
";

    #[test]
    fn holders_are_the_flock_owners_of_that_inode_and_not_waiters() {
        assert_eq!(flock_holders(LOCKS, 0, 0x2d, 98765), vec![4242, 17]);
        assert_eq!(flock_holders(LOCKS, 0, 0x2d, 98_766), Vec::<u32>::new());
        assert_eq!(flock_holders(LOCKS, 0, 0x19, 1234), Vec::<u32>::new(), "POSIX locks are not ours");
        assert_eq!(flock_holders("garbage\n\n1:\n: FLOCK", 0, 0x2d, 98765), Vec::<u32>::new());
    }

    #[test]
    fn the_effective_uid_is_the_second_uid() {
        assert_eq!(effective_uid("Name:\tx\nUid:\t1000\t0\t0\t0\nGid:\t5\t5\t5\t5\n"), Some(0));
        assert_eq!(effective_uid("Name:\tx\n"), None);
        assert_eq!(effective_uid("Uid:\t1000\n"), None);
    }

    #[test]
    fn a_file_is_believed_only_for_the_user_and_pid_holding_it() {
        let me = |pid, euid| Holder { pid, euid: Some(euid), same_pid_namespace: Some(true) };
        assert_eq!(check(1000, 50, &[me(50, 1000)], 0), Ok(()));
        assert_eq!(
            check(65534, 50, &[me(50, 0)], 0),
            Err(Distrust::NotTheHoldersFile { owner: 65534, pid: 50, holder_uid: 0 })
        );
        assert_eq!(check(0, 50, &[me(51, 0)], 0), Err(Distrust::NotTheClaimedPid { claimed: 50, pid: 51 }));
        // In another PID namespace the claimed pid means nothing here; the user still counts.
        let other = Holder { pid: 7000, euid: Some(0), same_pid_namespace: Some(false) };
        assert_eq!(check(0, 1, &[other], 0), Ok(()));
        // What could not be read is not held against it.
        let unknown = Holder { pid: 7000, euid: None, same_pid_namespace: None };
        assert_eq!(check(1000, 1, &[unknown], 0), Ok(()));
        // No visible holder: only the directory's owner can have put it there.
        assert_eq!(check(0, 1, &[], 0), Ok(()));
        assert_eq!(
            check(65534, 1, &[], 0),
            Err(Distrust::NotTheDirectoryOwners { owner: 65534, dir_owner: 0 })
        );
    }

    #[test]
    fn this_process_is_seen_holding_its_own_lock() {
        let path = std::env::temp_dir().join(format!("hvstats-holder-{}", std::process::id()));
        let file = File::create(&path).unwrap();
        crate::publish::lock(file.as_fd()).unwrap();
        let found = holders(&file).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].pid, std::process::id());
        assert_eq!(found[0].euid, Some(runtime_dir::euid()));
        assert_eq!(found[0].same_pid_namespace, Some(true));
    }
}
