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

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
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

/// One allocation in the table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The handle returned to the allocator's caller (never 0).
    pub handle: u64,
    /// Who holds it.
    pub holder: Holder,
    /// The processors.
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
    #[error("hardware counter table: cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
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
        /// The file.
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
    #[error("cannot identify this process as a holder: {0}")]
    Identity(#[source] io::Error),
}

/// The table's files.
#[derive(Clone, Debug)]
pub struct TableFile {
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
        fs::create_dir_all(&dir).map_err(|source| TableError::Io {
            action: "create",
            path: dir.clone(),
            source,
        })?;
        Ok(Self { dir, lock_timeout: DEFAULT_LOCK_TIMEOUT })
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
    pub fn set_lock_timeout(&mut self, timeout: Duration) {
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
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io_err("open"))?;
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
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(TableData::default()),
            Err(source) => return Err(TableError::Io { action: "read", path, source }),
        };
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
        let mut f = File::create(&tmp).map_err(io_err("create", &tmp))?;
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
