//! Publication of live instances under the runtime directory, so root tools in other processes
//! can find them and map their pages without asking the owning process for anything.
//!
//! Layout, under `<runtime dir>/instances/`:
//!
//! ```text
//! <pid>-<start time>-<n>/          one live instance (n tells apart instances of one process)
//!     manifest.json                pid, start time, LPs, partitions with VP counts and state
//!     hypervisor.page              mode 0600: global pages are for the root only
//!     lp/<index>.page              mode 0600
//!     partition/<id>/partition.page        mode 0644
//!     partition/<id>/vp/<index>.page       mode 0644
//! .<pid>-<start time>-<n>.staging/ an instance being set up, renamed into place when complete
//! ```
//!
//! Each page file IS the object's page (the writer maps it `MAP_SHARED`), so a reader that maps it
//! sees every update as it happens. The manifest is replaced atomically (temporary file, then
//! rename). The start time is the process's start in clock ticks after boot
//! (`/proc/<pid>/stat` field 22): an instance whose pid is gone, or now names another process, is
//! dead, and whoever next publishes or reads removes it.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use serde::{Deserialize, Serialize};

use crate::page::SharedPage;
use crate::rules::StatsObject;

/// The version of the manifest format this build writes and reads.
pub const MANIFEST_FORMAT: u32 = 1;

/// The manifest's file name in an instance directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// An error publishing an instance.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// A directory or file could not be created.
    #[error("cannot create {}", path.display())]
    Create {
        /// What could not be created.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The manifest could not be written.
    #[error("cannot write the manifest {}", path.display())]
    Manifest {
        /// The manifest path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// This process's start time could not be read.
    #[error("cannot read the start time of process {pid}")]
    StartTime {
        /// The process.
        pid: u32,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The runtime directory could not be listed.
    #[error("cannot list {}", path.display())]
    Scan {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// One logical processor in the manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LpEntry {
    /// The LP index (the identity's LP index and the page file name).
    pub index: u32,
    /// The host CPU number it stands for.
    pub cpu: u32,
}

/// One partition in the manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionEntry {
    /// The partition id.
    pub id: u64,
    /// Number of VPs (pages `vp/0.page` …).
    pub vp_count: u32,
    /// True while the partition is active.
    pub active: bool,
}

/// What an instance directory holds, as JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_FORMAT`].
    pub format: u32,
    /// The owning process.
    pub pid: u32,
    /// Its start time in clock ticks after boot.
    pub start_time: u64,
    /// When the instance was created, in milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// The logical processors.
    pub logical_processors: Vec<LpEntry>,
    /// The partitions, by id.
    pub partitions: Vec<PartitionEntry>,
}

/// The name of an instance directory: `<pid>-<start time>-<n>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct InstanceName {
    /// The owning process.
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
        parts.next().is_none().then_some(name)
    }

    /// True while the process that published it runs: its pid exists, is not a zombie (killed,
    /// not yet reaped), and started when the instance says.
    pub fn is_alive(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .ok()
            .and_then(|stat| parse_state_and_start_time(&stat))
            .is_some_and(|(state, start)| !matches!(state, 'Z' | 'X' | 'x') && start == self.start_time)
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
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_state_and_start_time(&stat)
        .map(|(_, start)| start)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed stat line"))
}

/// Fields 3 (state) and 22 (start time) of a `/proc/<pid>/stat` line. The command name
/// (field 2) may hold spaces and parentheses, so fields are counted after its last `)`.
fn parse_state_and_start_time(stat: &str) -> Option<(char, u64)> {
    let mut fields = stat[stat.rfind(')')? + 1..].split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    // Field 3 was the first after ')': field 22 is 18 further on.
    Some((state, fields.nth(18)?.parse().ok()?))
}

/// `<runtime dir>/instances`.
pub fn instances_dir(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join("instances")
}

/// The page file of `object` in an instance directory.
pub fn page_path(instance_dir: &Path, object: StatsObject) -> PathBuf {
    match object {
        StatsObject::Hypervisor => instance_dir.join("hypervisor.page"),
        StatsObject::LogicalProcessor(n) => instance_dir.join("lp").join(format!("{n}.page")),
        StatsObject::Partition(id) => partition_dir(instance_dir, id).join("partition.page"),
        StatsObject::Vp(id, n) => partition_dir(instance_dir, id).join("vp").join(format!("{n}.page")),
    }
}

fn partition_dir(instance_dir: &Path, id: u64) -> PathBuf {
    instance_dir.join("partition").join(id.to_string())
}

/// Reads the manifest of an instance directory.
///
/// # Errors
/// When it cannot be read or is not a manifest of [`MANIFEST_FORMAT`].
pub fn read_manifest(instance_dir: &Path) -> io::Result<Manifest> {
    let text = fs::read(instance_dir.join(MANIFEST_FILE))?;
    let manifest: Manifest =
        serde_json::from_slice(&text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    if manifest.format != MANIFEST_FORMAT {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("manifest format {} (this build reads {MANIFEST_FORMAT})", manifest.format),
        ));
    }
    Ok(manifest)
}

/// What a look at the runtime directory found.
#[derive(Debug, Default)]
pub struct Survey {
    /// Live instances, by name.
    pub live: Vec<(InstanceName, PathBuf)>,
    /// Directories of dead instances that were removed.
    pub removed: Vec<PathBuf>,
    /// Directories of dead instances that could not be removed, with why.
    pub not_removed: Vec<(PathBuf, io::Error)>,
}

/// Lists the live instances under `runtime_dir`, removing those of dead processes. A missing
/// directory holds no instance.
///
/// # Errors
/// When the directory exists but cannot be listed.
pub fn survey(runtime_dir: &Path) -> Result<Survey, PublishError> {
    let dir = instances_dir(runtime_dir);
    let mut survey = Survey::default();
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(survey),
        Err(source) => return Err(PublishError::Scan { path: dir, source }),
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(name) = file_name.to_str() else { continue };
        let (parsed, staging) = match name.strip_prefix('.').and_then(|n| n.strip_suffix(".staging")) {
            Some(inner) => (InstanceName::parse(inner), true),
            None => (InstanceName::parse(name), false),
        };
        let Some(parsed) = parsed else { continue };
        let path = entry.path();
        if parsed.is_alive() {
            if !staging {
                survey.live.push((parsed, path));
            }
            continue;
        }
        match fs::remove_dir_all(&path) {
            Ok(()) => survey.removed.push(path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => survey.not_removed.push((path, e)),
        }
    }
    survey.live.sort_by_key(|(name, _)| *name);
    Ok(survey)
}

static NEXT_SEQ: AtomicU32 = AtomicU32::new(0);

/// The directory of an instance this process publishes; removed when dropped.
#[derive(Debug)]
pub struct Publication {
    name: InstanceName,
    dir: PathBuf,
    committed: bool,
    created_unix_ms: u64,
}

impl Publication {
    /// Starts publishing a new instance under `runtime_dir`: removes dead instances and creates
    /// the staging directory. Pages are created in it, then [`commit`](Self::commit) puts it in
    /// place.
    ///
    /// # Errors
    /// When the directories cannot be created or this process's start time cannot be read.
    pub fn begin(runtime_dir: &Path) -> Result<Self, PublishError> {
        let pid = std::process::id();
        let start_time = process_start_time(pid).map_err(|source| PublishError::StartTime { pid, source })?;
        let instances = instances_dir(runtime_dir);
        create_dir_all(&instances)?;
        survey(runtime_dir)?;
        let name = InstanceName { pid, start_time, seq: NEXT_SEQ.fetch_add(1, Ordering::Relaxed) };
        let dir = instances.join(format!(".{name}.staging"));
        create_dir(&dir)?;
        let created_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Ok(Self { name, dir, committed: false, created_unix_ms })
    }

    /// The instance's name.
    pub fn name(&self) -> InstanceName {
        self.name
    }

    /// The instance directory (the staging directory until committed).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Creates the page file of `object`: 0600 for global objects, 0644 for the others.
    ///
    /// # Errors
    /// When its directory or the file cannot be created.
    pub fn create_page(&self, object: StatsObject) -> Result<SharedPage, PublishError> {
        let path = page_path(&self.dir, object);
        if let Some(parent) = path.parent() {
            create_dir_all(parent)?;
        }
        let kind = object.kind();
        SharedPage::create_file(kind, &path, !kind.is_global())
            .map_err(|source| PublishError::Create { path, source })
    }

    /// Removes partition `id`'s page files (readers that mapped them keep their mappings).
    pub fn remove_partition(&self, id: u64) {
        // Nothing a reader relies on depends on this succeeding: the manifest no longer lists it.
        let _ = fs::remove_dir_all(partition_dir(&self.dir, id));
    }

    /// A manifest for this instance with the given objects.
    pub fn manifest(&self, logical_processors: Vec<LpEntry>, partitions: Vec<PartitionEntry>) -> Manifest {
        Manifest {
            format: MANIFEST_FORMAT,
            pid: self.name.pid,
            start_time: self.name.start_time,
            created_unix_ms: self.created_unix_ms,
            logical_processors,
            partitions,
        }
    }

    /// Replaces the manifest atomically.
    ///
    /// # Errors
    /// When the temporary file cannot be written or renamed.
    pub fn write_manifest(&self, manifest: &Manifest) -> Result<(), PublishError> {
        let path = self.dir.join(MANIFEST_FILE);
        let tmp = self.dir.join(format!(".{MANIFEST_FILE}.tmp"));
        let write = || -> io::Result<()> {
            let mut file =
                fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o644).open(&tmp)?;
            file.write_all(&serde_json::to_vec_pretty(manifest).map_err(io::Error::other)?)?;
            fs::rename(&tmp, &path)
        };
        write().map_err(|source| PublishError::Manifest { path, source })
    }

    /// Puts the staging directory in place: from now on readers see the instance.
    ///
    /// # Errors
    /// When the rename fails.
    pub fn commit(&mut self) -> Result<(), PublishError> {
        let Some(parent) = self.dir.parent() else {
            return Err(PublishError::Create {
                path: self.dir.clone(),
                source: io::Error::other("no parent"),
            });
        };
        let target = parent.join(self.name.to_string());
        fs::rename(&self.dir, &target)
            .map_err(|source| PublishError::Create { path: target.clone(), source })?;
        self.dir = target;
        self.committed = true;
        Ok(())
    }

    /// True once the instance is in place.
    pub fn is_committed(&self) -> bool {
        self.committed
    }
}

impl Drop for Publication {
    fn drop(&mut self) {
        // A directory left behind is found dead and removed by the next publisher or reader.
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn create_dir(path: &Path) -> Result<(), PublishError> {
    fs::DirBuilder::new()
        .mode(0o755)
        .create(path)
        .map_err(|source| PublishError::Create { path: path.to_owned(), source })
}

fn create_dir_all(path: &Path) -> Result<(), PublishError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path)
        .map_err(|source| PublishError::Create { path: path.to_owned(), source })
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
    fn our_own_process_is_alive_and_a_wrong_start_time_is_dead() {
        let pid = std::process::id();
        let start_time = process_start_time(pid).unwrap();
        assert!(InstanceName { pid, start_time, seq: 0 }.is_alive());
        assert!(!InstanceName { pid, start_time: start_time + 1, seq: 0 }.is_alive());
    }

    #[test]
    fn instance_names_round_trip_and_reject_junk() {
        let name = InstanceName { pid: 42, start_time: 7, seq: 3 };
        assert_eq!(InstanceName::parse(&name.to_string()), Some(name));
        assert_eq!(InstanceName::parse("42-7"), None);
        assert_eq!(InstanceName::parse("42-7-3-1"), None);
        assert_eq!(InstanceName::parse("x-7-3"), None);
    }
}
