//! Publication of live instances under the runtime directory, so root tools in other processes
//! can find them and map their pages without asking the owning process for anything.
//!
//! Layout, under `<runtime dir>/instances/`:
//!
//! ```text
//! <pid>-<start time>-<n>.arena    partitions and VPs: one arena (see crate::index); mode 0600,
//!                                 or 0640 with the group named by InstanceConfig::page_access
//! <pid>-<start time>-<n>.global   the hypervisor and LPs: an arena of their own, always 0600
//! <pid>-<start time>-<n>.unmapped (mshv observers only) counters the catalog has no place for,
//!                                 as text (crate::unmapped); mode as the .arena's
//! .<…>.tmp                        an arena being set up, renamed into place when complete
//! ```
//!
//! Each arena IS the pages (the writer maps it `MAP_SHARED`), so a reader that maps it sees every
//! update as it happens, and its index tells what is where. The publisher holds an exclusive
//! `flock` on each of its files for as long as it lives; a reader or a new publisher tests it
//! without blocking. The lock belongs to the open file, not to a pid, so a publisher in another
//! PID namespace (whose pid means nothing here) is alive exactly as long as it runs, and a file
//! whose lock is free is dead and removed by whoever next publishes or reads.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use hvstats_host::os;

use crate::runtime_dir::{Dir, RuntimeDirError, Use};

/// The subdirectory of the runtime directory that holds instances.
pub const INSTANCES_DIR: &str = "instances";
/// The file suffix of a partitions arena.
pub const ARENA_SUFFIX: &str = ".arena";
/// The file suffix of a global-objects arena.
pub const GLOBAL_SUFFIX: &str = ".global";
/// The file suffix of an instance's side file of counters the catalog has no place for.
pub const UNMAPPED_SUFFIX: &str = ".unmapped";
/// The file suffix of an instance's side file of its VMs' platform identities
/// ([`crate::platform_file`]); it goes with the instance's arena.
pub const PLATFORM_SUFFIX: &str = ".platform";
/// The file suffix of an arena being set up.
pub const TMP_SUFFIX: &str = ".tmp";

/// An error publishing an instance.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The runtime directory or a file in it could not be used.
    #[error(transparent)]
    Dir(#[from] RuntimeDirError),
    /// An arena could not be laid out (a full filesystem is `ENOSPC` here).
    #[error("cannot allocate the arena {}", path.display())]
    Arena {
        /// The arena file (at its temporary name until the instance is committed).
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The side file could not be written.
    #[error("cannot write {}", path.display())]
    SideFile {
        /// The side file at its temporary name.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// This process's start time could not be read.
    #[error("cannot read the start time of process {pid}")]
    StartTime {
        /// This process's pid.
        pid: u32,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The publisher's lock could not be taken.
    #[error("cannot lock {}", path.display())]
    Lock {
        /// The new file, at its temporary name, that could not be locked.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

impl PublishError {
    /// The underlying I/O error kind, when there is one.
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            PublishError::Dir(e) => e.io_kind(),
            PublishError::Arena { source, .. }
            | PublishError::SideFile { source, .. }
            | PublishError::StartTime { source, .. }
            | PublishError::Lock { source, .. } => Some(source.kind()),
        }
    }
}

/// The name of an instance: `<pid>-<start time>-<n>`, unique among the files of the directory.
/// Only a name: liveness is the publisher's lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstanceName {
    /// The owning process, as its own PID namespace numbers it.
    pub pid: u32,
    /// Its start time in clock ticks after boot.
    pub start_time: u64,
    /// Which of the process's instances.
    pub seq: u32,
}

impl InstanceName {
    /// Parses `<pid>-<start>-<n>`.
    pub fn parse(s: &str) -> Option<Self> {
        let mut parts = s.split('-');
        let name = Self {
            pid: parts.next()?.parse().ok()?,
            start_time: parts.next()?.parse().ok()?,
            seq: parts.next()?.parse().ok()?,
        };
        (parts.next().is_none() && name.to_string() == s).then_some(name)
    }

    /// The name of its partitions arena.
    pub fn arena_file(&self) -> String {
        format!("{self}{ARENA_SUFFIX}")
    }

    /// The name of its global arena.
    pub fn global_file(&self) -> String {
        format!("{self}{GLOBAL_SUFFIX}")
    }

    /// The name of its platform file.
    pub fn platform_file(&self) -> String {
        format!("{self}{PLATFORM_SUFFIX}")
    }
}

impl std::fmt::Display for InstanceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}-{}", self.pid, self.start_time, self.seq)
    }
}

/// The start time of process `pid` in clock ticks after boot (`/proc/<pid>/stat` field 22).
///
/// # Errors
/// When the process does not exist or its stat line cannot be parsed.
pub fn process_start_time(pid: u32) -> io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_state_and_start_time(&stat)
        .map(|(_, start)| start)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed stat line"))
}

/// Fields 3 (state) and 22 (start time) of a `/proc/<pid>/stat` line.
fn parse_state_and_start_time(stat: &str) -> Option<(char, u64)> {
    let stat = hvstats_host::task_stat::StatLine::parse(stat)?;
    Some((stat.state()?, stat.start_time()?))
}

/// `<runtime dir>/instances`.
pub fn instances_dir(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join(INSTANCES_DIR)
}

/// Takes the publisher's lock on `file` (exclusive, without waiting).
///
/// # Errors
/// When it is held by someone else, or flock fails.
pub fn lock(file: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain flock on an fd we hold.
    os::check(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }).map(drop)
}

/// True while some process holds the publisher's lock of the file `file` is open on (tested
/// without waiting, through this separate open file; works across PID namespaces).
pub(crate) fn is_locked(file: BorrowedFd<'_>) -> bool {
    // SAFETY: plain flock on an fd we hold.
    match os::check(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) }) {
        Ok(_) => {
            // SAFETY: as above: drop the shared lock we just took (it goes with the file anyway).
            let _ = os::check(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) });
            false
        }
        Err(e) => e.raw_os_error() == Some(libc::EWOULDBLOCK),
    }
}

/// What a sweep of the instances directory did.
#[derive(Debug, Default)]
pub struct Sweep {
    /// Files of dead publishers that were removed.
    pub removed: Vec<PathBuf>,
    /// Files of dead publishers that could not be removed, with why.
    pub not_removed: Vec<(PathBuf, io::Error)>,
}

/// True for a name hvstats publishes (`<name>.arena`, `<name>.global`, `.<…>.tmp`).
fn is_ours<'a>(name: &'a str) -> bool {
    let known = |n: &'a str| -> Option<&'a str> {
        [ARENA_SUFFIX, GLOBAL_SUFFIX, UNMAPPED_SUFFIX].iter().find_map(|s| n.strip_suffix(s))
    };
    let stem = known(name)
        .or_else(|| name.strip_prefix('.').and_then(|n| n.strip_suffix(TMP_SUFFIX)).and_then(known));
    stem.and_then(InstanceName::parse).is_some()
}

/// Removes the files of dead publishers (no lock held) from `instances`. Files this user cannot
/// open are left alone.
pub fn sweep(instances: &Dir) -> Sweep {
    let mut sweep = Sweep::default();
    let Ok(names) = instances.names() else { return sweep };
    for name in names {
        let Some(name) = name.to_str() else { continue };
        if let Some(stem) = name.strip_suffix(PLATFORM_SUFFIX) {
            // A platform file goes with its instance's arena (it holds no lock of its own).
            let orphan = instances.open_file(&format!("{stem}{ARENA_SUFFIX}"), false).is_err();
            if orphan && InstanceName::parse(stem).is_some() && instances.remove_file(name).is_ok() {
                sweep.removed.push(instances.path().join(name));
            }
            continue;
        }
        if !is_ours(name) {
            continue;
        }
        let Ok(file) = instances.open_file(name, false) else { continue };
        // A file being made is left alone before its lock is tested: testing takes a shared lock
        // for a moment, which would make its maker's own lock fail.
        if is_being_made(name, &file) || is_locked(file.as_fd()) {
            continue;
        }
        let path = instances.path().join(name);
        match instances.remove_file(name) {
            Ok(()) => sweep.removed.push(path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => sweep.not_removed.push((path, e)),
        }
    }
    sweep
}

/// A temporary file is created, then locked: in between it looks dead. One younger than a minute
/// is left to its maker.
fn is_being_made(name: &str, file: &File) -> bool {
    name.ends_with(TMP_SUFFIX)
        && file
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().map_or(true, |age| age < std::time::Duration::from_secs(60)))
}

static NEXT_SEQ: AtomicU32 = AtomicU32::new(0);

/// Who may read an instance's partition and VP pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageAccess {
    /// A group that may read partition and VP pages (mode 0640); `None`: the owner only (0600).
    /// Global pages (hypervisor, LPs) are always the owner's only.
    pub group: Option<u32>,
}

/// The files of an instance this process publishes; removed when dropped.
#[derive(Debug)]
pub struct Publication {
    instances: Dir,
    name: InstanceName,
    committed: bool,
    access: PageAccess,
    /// The side file in place, held locked so readers believe it and sweeps leave it.
    side: std::sync::Mutex<Option<File>>,
}

/// The two arena files of a new publication, locked, empty, not yet visible.
#[derive(Debug)]
pub struct NewFiles {
    /// Partitions and VPs.
    pub partitions: File,
    /// The hypervisor and LPs.
    pub global: File,
}

impl Publication {
    /// Starts publishing a new instance under `runtime_dir`: checks the directory, removes dead
    /// instances, and creates the instance's two arena files (locked) under temporary names;
    /// [`commit`](Self::commit) puts them in place.
    ///
    /// # Errors
    /// When the directory fails its checks, or the files cannot be created or locked.
    pub fn begin(runtime_dir: &Path, access: PageAccess) -> Result<(Self, NewFiles), PublishError> {
        let pid = std::process::id();
        let start_time = process_start_time(pid).map_err(|source| PublishError::StartTime { pid, source })?;
        let root = Dir::open(runtime_dir, Use::Publish)?;
        let instances = root.subdir(INSTANCES_DIR, Use::Publish)?;
        sweep(&instances);
        loop {
            let name = InstanceName { pid, start_time, seq: NEXT_SEQ.fetch_add(1, Ordering::Relaxed) };
            let taken = |n: &str| instances.open_file(n, false).is_ok();
            if taken(&name.arena_file()) || taken(&name.global_file()) {
                continue;
            }
            let mode = if access.group.is_some() { 0o640 } else { 0o600 };
            let publication = Self { instances, name, committed: false, access, side: Default::default() };
            let global = publication.create(&name.global_file(), 0o600, None)?;
            let partitions = publication.create(&name.arena_file(), mode, access.group)?;
            return Ok((publication, NewFiles { partitions, global }));
        }
    }

    fn create(&self, file: &str, mode: u32, group: Option<u32>) -> Result<File, PublishError> {
        let tmp = format!(".{file}{TMP_SUFFIX}");
        let f = self.instances.create_file(&tmp, mode, group)?;
        // A reader testing whether the new file is alive holds a shared lock on it for a moment:
        // wait that out (the file is ours, made just now with O_EXCL).
        let mut waits = 0;
        loop {
            match lock(f.as_fd()) {
                Ok(()) => return Ok(f),
                Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) && waits < 200 => {
                    waits += 1;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(source) => {
                    let _ = self.instances.remove_file(&tmp);
                    return Err(PublishError::Lock { path: self.instances.path().join(&tmp), source });
                }
            }
        }
    }

    /// The instance's name.
    pub fn name(&self) -> InstanceName {
        self.name
    }

    /// The path of the partitions arena (under its temporary name until committed).
    pub fn arena_path(&self) -> PathBuf {
        let file = self.name.arena_file();
        self.instances.path().join(if self.committed { file } else { format!(".{file}{TMP_SUFFIX}") })
    }

    /// Puts the arenas in place: from now on readers see the instance.
    ///
    /// # Errors
    /// When a rename fails.
    pub fn commit(&mut self) -> Result<(), PublishError> {
        for file in [self.name.global_file(), self.name.arena_file()] {
            self.instances.rename_new(&format!(".{file}{TMP_SUFFIX}"), &file)?;
        }
        self.committed = true;
        Ok(())
    }

    /// Replaces the instance's side file `<name>.unmapped` with `bytes` at once (written under a
    /// temporary name, locked, renamed over the old one): readers see the old contents or the new.
    ///
    /// # Errors
    /// When the file cannot be created, written, locked or renamed.
    pub(crate) fn replace_unmapped(&self, bytes: &[u8]) -> Result<(), PublishError> {
        use std::io::Write;
        let file = format!("{}{UNMAPPED_SUFFIX}", self.name);
        let tmp = format!(".{file}{TMP_SUFFIX}");
        // One replacement at a time: the temporary name is the same for all.
        let mut side = self.side.lock().unwrap_or_else(|e| e.into_inner());
        let _ = self.instances.remove_file(&tmp);
        let mode = if self.access.group.is_some() { 0o640 } else { 0o600 };
        let mut f = self.create(&file, mode, self.access.group)?;
        let path = self.instances.path().join(&tmp);
        f.write_all(bytes).map_err(|source| PublishError::SideFile { path, source })?;
        self.instances.rename_replace(&tmp, &file)?;
        *side = Some(f);
        Ok(())
    }
}

impl Drop for Publication {
    fn drop(&mut self) {
        // Files left behind are found dead (unlocked) and removed by the next publisher or reader.
        let unmapped = format!("{}{UNMAPPED_SUFFIX}", self.name);
        for file in [self.name.arena_file(), self.name.global_file(), unmapped] {
            let _ = self.instances.remove_file(&file);
            let _ = self.instances.remove_file(&format!(".{file}{TMP_SUFFIX}"));
        }
        let _ = self.instances.remove_file(&self.name.platform_file());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_field_22_even_when_the_name_has_spaces_and_parens() {
        let line = "1234 (a b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10";
        assert_eq!(parse_state_and_start_time(line), Some(('S', 98765)));
        assert_eq!(parse_state_and_start_time("garbage"), None);
    }

    #[test]
    fn instance_names_round_trip_and_reject_junk() {
        let name = InstanceName { pid: 42, start_time: 7, seq: 3 };
        assert_eq!(InstanceName::parse(&name.to_string()), Some(name));
        assert_eq!(InstanceName::parse("42-7"), None);
        assert_eq!(InstanceName::parse("42-7-3-1"), None);
        assert_eq!(InstanceName::parse("x-7-3"), None);
        assert_eq!(InstanceName::parse("+42-7-3"), None);
        assert!(is_ours("1-2-3.arena") && is_ours(".1-2-3.global.tmp"));
        assert!(is_ours("1-2-3.unmapped") && is_ours(".1-2-3.unmapped.tmp"));
        assert!(!is_ours("notes") && !is_ours("1-2-3.page"));
    }
}
