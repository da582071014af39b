//! The allocation table shared by every process on the host: a file under `<runtime dir>/hwc/`.
//!
//! `hwc/lock` is never replaced and carries an exclusive `flock` for the whole of every read-modify-
//! write; `hwc/table.json` is replaced by writing `hwc/table.json.tmp` and renaming it over, so a
//! process killed mid-write leaves the previous table intact. A missing table is an empty one.
//!
//! A table that cannot be decoded (truncated, corrupt, another version) is reported as
//! [`TableError::Corrupt`] by every operation and is never reset automatically: resetting would
//! forget allocations that live processes still hold, and hand their counters out twice. The
//! operator removes the file once no consumer holds counters.
//!
//! Nobody else may steer these writes: `hwc/` is created mode 0700 and its files 0600 whatever the
//! umask; a `hwc/` that is a link, belongs to another user, or is writable by group or others is
//! refused ([`TableError::Unsafe`]); every file is opened with `O_NOFOLLOW` and `O_NONBLOCK` and
//! must be a regular file (a planted link or FIFO is refused, never followed or waited on); the
//! temporary file is created afresh with `O_EXCL`; and a table larger than [`MAX_TABLE_BYTES`] is
//! corrupt, not read to the end. The runtime directory itself passes the checks of every
//! instance's ([`hvstats::runtime_dir`]) at every operation: who may write it could move `hwc/`
//! aside, and an empty table in its place would grant what is held a second time.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::cpuset::CpuSet;
use super::holder::Holder;
use super::request::ResourceSet;

/// The format version this code reads and writes.
pub const TABLE_VERSION: u32 = 1;

/// The directory under the runtime directory that holds the table.
pub const TABLE_DIR: &str = "hwc";

/// The largest table file read (far above what the records of any host's consumers need).
pub const MAX_TABLE_BYTES: u64 = 16 << 20;

/// The mode of `hwc/`.
pub const DIR_MODE: u32 = 0o700;

/// The mode of the table's files.
pub const FILE_MODE: u32 = 0o600;

/// One allocation in the table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The handle returned to the allocator's caller (never 0).
    pub handle: u64,
    /// The process that holds it (pid and start time, so a reused pid is not mistaken for it).
    pub holder: Holder,
    /// The CPUs it holds counters on.
    pub cpus: CpuSet,
    /// What is held on each of them.
    pub resources: ResourceSet,
}

/// The table's contents.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableData {
    /// [`TABLE_VERSION`].
    pub version: u32,
    /// The next handle to give out; handles are never reused while the table exists.
    pub next_handle: u64,
    /// Counts every grant and release, so an audit log can be ordered.
    pub generation: u64,
    /// The PMU shape ([`super::pmu::PmuShape::fingerprint`]) the records were granted under.
    pub pmu: Option<String>,
    /// The allocations held.
    pub records: Vec<Record>,
}

impl Default for TableData {
    fn default() -> Self {
        Self { version: TABLE_VERSION, next_handle: 1, generation: 0, pmu: None, records: Vec::new() }
    }
}

/// The table cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// A file of the table could not be opened, locked, read or written.
    #[error("hardware counter table: cannot {action} {}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The table's directory, data file or lock file the action was on.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The table file cannot be decoded.
    #[error(
        "hardware counter table {} is corrupt ({reason}); remove it once no process holds hardware counters",
        path.display()
    )]
    Corrupt {
        /// The table's data file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The table holds allocations granted under another PMU shape.
    #[error(
        "hardware counter table: its allocations were granted for a PMU of {table}, but this process \
         sees {ours} (set HVSTATS_PMU alike in every process sharing the runtime directory)"
    )]
    ShapeMismatch {
        /// The table's shape.
        table: String,
        /// This process's shape.
        ours: String,
    },
    /// The calling process cannot be identified (its `/proc` entry).
    #[error("cannot identify this process as a holder")]
    Identity(#[source] io::Error),
    /// A path of the table could be steered by another user, or is not what it must be.
    #[error("hardware counter table: refusing {}: {reason}", path.display())]
    Unsafe {
        /// The directory or file refused (a link, another user's, or writable by others).
        path: PathBuf,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// The runtime directory holding `hwc/` fails the checks every instance's directory passes
    /// (another user could move the table aside and have its counters granted twice).
    #[error("hardware counter table: {0}")]
    RuntimeDir(#[from] hvstats::runtime_dir::RuntimeDirError),
    /// Every handle has been given out (handles are never reused while the table exists).
    #[error(
        "hardware counter table {}: no handle is left to give out; remove the table once no process \
         holds hardware counters",
        path.display()
    )]
    HandlesExhausted {
        /// The table file.
        path: PathBuf,
    },
}

/// Checks that `dir` is a real directory of ours that nobody else can write to.
fn check_dir(dir: &Path) -> Result<(), TableError> {
    let unsafe_dir = |reason: String| TableError::Unsafe { path: dir.to_owned(), reason };
    let meta = fs::symlink_metadata(dir).map_err(|source| TableError::Io {
        action: "examine",
        path: dir.to_owned(),
        source,
    })?;
    if !meta.file_type().is_dir() {
        return Err(unsafe_dir("it is not a directory (a link or file in its place); remove it".into()));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if meta.uid() != euid {
        return Err(unsafe_dir(format!(
            "it belongs to uid {}, not to this user (uid {euid}); remove it or use another runtime directory",
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(unsafe_dir(format!(
            "it is writable by group or others (mode {:o}); chmod 700 it",
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

/// Checks the runtime directory as publishers check theirs ([`hvstats::runtime_dir::Dir`]): this
/// user's, and writable by nobody else, so nobody else can rename `hwc/` away and make an empty
/// table grant what is held a second time.
fn check_runtime_dir(runtime_dir: &Path) -> Result<(), TableError> {
    hvstats::runtime_dir::Dir::open(runtime_dir, hvstats::runtime_dir::Use::Publish)?;
    Ok(())
}

const NOT_REGULAR: &str = "it is not a regular file (a FIFO, device or directory in its place); remove it";

/// Opens the existing or new file `path` (by `options`) without following a link or waiting on a
/// FIFO, and checks it is a regular file.
fn open_regular(path: &Path, options: &mut OpenOptions, action: &'static str) -> Result<File, TableError> {
    let file = options
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| match source.raw_os_error() {
            Some(libc::ELOOP) => TableError::Unsafe {
                path: path.to_owned(),
                reason: "it is a symbolic link; remove it".into(),
            },
            // A FIFO opened for writing without a reader, or a device without its driver.
            Some(libc::ENXIO) => TableError::Unsafe { path: path.to_owned(), reason: NOT_REGULAR.into() },
            _ => TableError::Io { action, path: path.to_owned(), source },
        })?;
    let meta = file.metadata().map_err(|source| TableError::Io { action, path: path.to_owned(), source })?;
    if !meta.file_type().is_file() {
        return Err(TableError::Unsafe { path: path.to_owned(), reason: NOT_REGULAR.into() });
    }
    Ok(file)
}

/// The table's files.
#[derive(Clone, Debug)]
pub struct TableFile {
    runtime_dir: PathBuf,
    dir: PathBuf,
    lock_timeout: Duration,
}

/// How long an operation waits for the table lock unless told otherwise.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// The table, locked against every other user until dropped.
pub struct LockedTable<'a> {
    file: &'a TableFile,
    _lock: File,
}

impl TableFile {
    /// The table of the runtime directory `runtime_dir`, creating `<runtime_dir>/hwc`.
    ///
    /// # Errors
    /// When the directory cannot be created.
    pub fn open(runtime_dir: &Path) -> Result<Self, TableError> {
        let dir = runtime_dir.join(TABLE_DIR);
        let io_create = |path: &Path| {
            let path = path.to_owned();
            move |source| TableError::Io { action: "create", path, source }
        };
        fs::create_dir_all(runtime_dir).map_err(io_create(runtime_dir))?;
        check_runtime_dir(runtime_dir)?;
        match fs::DirBuilder::new().mode(DIR_MODE).create(&dir) {
            Ok(()) => {
                // The umask may have taken bits away; set exactly the mode meant.
                fs::set_permissions(&dir, fs::Permissions::from_mode(DIR_MODE)).map_err(io_create(&dir))?;
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_create(&dir)(e)),
        }
        check_dir(&dir)?;
        Ok(Self { runtime_dir: runtime_dir.to_owned(), dir, lock_timeout: DEFAULT_LOCK_TIMEOUT })
    }

    /// The table's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The table's data file.
    pub fn path(&self) -> PathBuf {
        self.dir.join("table.json")
    }

    /// How long [`TableFile::lock`] waits for another user to release the lock.
    pub(crate) fn set_lock_timeout(&mut self, timeout: Duration) {
        self.lock_timeout = timeout;
    }

    /// Takes the exclusive lock, waiting up to the lock timeout (10 s unless set) for other users
    /// to release it: a holder that is stopped or stuck must not hang everyone else.
    ///
    /// # Errors
    /// When the lock file cannot be opened or locked, or the wait times out.
    pub fn lock(&self) -> Result<LockedTable<'_>, TableError> {
        let path = self.dir.join("lock");
        let io_err = |action| move |source| TableError::Io { action, path: self.dir.join("lock"), source };
        // Again at every operation: whoever can write the runtime directory can swap `hwc/`.
        check_runtime_dir(&self.runtime_dir)?;
        check_dir(&self.dir)?;
        let lock = open_regular(
            &path,
            OpenOptions::new().create(true).truncate(false).write(true).mode(FILE_MODE),
            "open",
        )?;
        let deadline = Instant::now() + self.lock_timeout;
        let mut pause = Duration::from_micros(20);
        loop {
            // SAFETY: flock on a file descriptor we own; it has no memory effects.
            let rc = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc == 0 {
                break;
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock if Instant::now() < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(2));
                }
                io::ErrorKind::WouldBlock => {
                    let waited = self.lock_timeout.as_secs_f64();
                    let e = io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("another process has held the lock for more than {waited} s"),
                    );
                    return Err(io_err("lock")(e));
                }
                _ => return Err(io_err("lock")(e)),
            }
        }
        Ok(LockedTable { file: self, _lock: lock })
    }
}

impl LockedTable<'_> {
    /// Reads and checks the table; a missing file is an empty table.
    ///
    /// # Errors
    /// [`TableError::Io`] when it cannot be read, [`TableError::Corrupt`] when it cannot be decoded.
    pub fn read(&self) -> Result<TableData, TableError> {
        let path = self.file.path();
        let file = match open_regular(&path, OpenOptions::new().read(true), "read") {
            Ok(f) => f,
            Err(TableError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                return Ok(TableData::default());
            }
            Err(e) => return Err(e),
        };
        let mut bytes = Vec::new();
        file.take(MAX_TABLE_BYTES + 1).read_to_end(&mut bytes).map_err(|source| TableError::Io {
            action: "read",
            path: path.clone(),
            source,
        })?;
        if bytes.len() as u64 > MAX_TABLE_BYTES {
            let reason = format!("larger than {MAX_TABLE_BYTES} bytes");
            return Err(TableError::Corrupt { path, reason });
        }
        decode(&bytes).map_err(|reason| TableError::Corrupt { path, reason })
    }

    /// Replaces the table with `data`.
    ///
    /// # Errors
    /// When the new file cannot be written or renamed into place.
    pub fn write(&self, data: &TableData) -> Result<(), TableError> {
        let path = self.file.path();
        let tmp = self.file.dir.join("table.json.tmp");
        let io_err = |action, path: &Path| {
            let path = path.to_owned();
            move |source| TableError::Io { action, path, source }
        };
        let mut bytes = serde_json::to_vec_pretty(data).map_err(|e| TableError::Io {
            action: "encode",
            path: path.clone(),
            source: e.into(),
        })?;
        bytes.push(b'\n');
        // A stale temporary file (a writer killed mid-write) or anything planted there is removed,
        // never followed (unlink acts on the link itself), and the file is made afresh.
        match fs::remove_file(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove", &tmp)(e)),
        }
        let mut f =
            open_regular(&tmp, OpenOptions::new().write(true).create_new(true).mode(FILE_MODE), "create")?;
        f.write_all(&bytes).map_err(io_err("write", &tmp))?;
        drop(f);
        fs::rename(&tmp, &path).map_err(io_err("replace", &path))
    }
}

/// Decodes and checks table bytes; the reason when they are not a valid table.
pub(crate) fn decode(bytes: &[u8]) -> Result<TableData, String> {
    let data: TableData = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if data.version != TABLE_VERSION {
        return Err(format!("version {} (this build reads {TABLE_VERSION})", data.version));
    }
    let mut handles = std::collections::BTreeSet::new();
    for r in &data.records {
        if r.handle == 0 || r.handle >= data.next_handle {
            return Err(format!("handle {} is outside 1..{}", r.handle, data.next_handle));
        }
        if !handles.insert(r.handle) {
            return Err(format!("handle {} appears twice", r.handle));
        }
        if r.cpus.is_empty() {
            return Err(format!("handle {} holds no processors", r.handle));
        }
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_rejects_bad_tables_with_a_reason() {
        let good = serde_json::to_vec(&TableData::default()).unwrap();
        assert_eq!(decode(&good), Ok(TableData::default()));
        for (bytes, what) in [
            (&b""[..], "EOF"),
            (&good[..good.len() - 3], "EOF"),
            (&b"\x00\xff garbage"[..], "expected value"),
            (&br#"{"version":2,"next_handle":1,"generation":0,"pmu":null,"records":[]}"#[..], "version 2"),
            (
                &br#"{"version":1,"next_handle":1,"generation":0,"pmu":null,"records":[{"handle":5,"holder":{"pid":1,"start_time":1,"name":"x","persistent":true},"cpus":"0","resources":{"exclusive":true,"counters":[],"overflow":false,"event_buffer":false,"tags":[]}}]}"#[..],
                "outside",
            ),
            (
                &br#"{"version":1,"next_handle":9,"generation":0,"pmu":null,"records":[{"handle":5,"holder":{"pid":1,"start_time":1,"name":"x","persistent":true},"cpus":"3-1","resources":{"exclusive":true,"counters":[],"overflow":false,"event_buffer":false,"tags":[]}}]}"#[..],
                "inverted",
            ),
            (
                &br#"{"version":1,"next_handle":9,"generation":0,"pmu":null,"records":[{"handle":5,"holder":{"pid":1,"start_time":1,"name":"x","persistent":true},"cpus":"1","resources":{"exclusive":false,"counters":[64],"overflow":false,"event_buffer":false,"tags":[]}}]}"#[..],
                "above 63",
            ),
        ] {
            let reason = decode(bytes).unwrap_err();
            assert!(reason.contains(what), "{reason:?} should mention {what:?}");
        }
    }
}
