//! What an observed partition publishes beyond its pages: its name, the VMM, the attach time,
//! the vCPU threads, and the counters no source gives it.
//!
//! The pages carry counts only. Until the instance manifest carries per-partition names and
//! "not available" marks, this module writes them to `observed.json` beside the partition's
//! pages (removed with them), and every observed-partition fact goes through here, so switching
//! to the manifest is a change in this one place.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use hvstats::PartitionStats;
use serde::Serialize;

/// The file beside an observed partition's pages.
pub const OBSERVED_FILE: &str = "observed.json";

/// The facts of one observed VM.
#[derive(Clone, Debug, Serialize)]
pub struct ObservedFacts {
    /// The VM's name (the VMM's own, else command and pid).
    pub name: String,
    /// The VMM.
    pub vmm: &'static str,
    /// The VMM's process id.
    pub pid: i32,
    /// When counting began, in nanoseconds since the Unix epoch: every counter counts from here.
    pub attached_unix_ns: u128,
    /// The thread of each VP, by VP index (`null` while unknown).
    pub vcpu_threads: Vec<Option<i32>>,
    /// Whether `kvm:kvm_exit` fires on this host (`null` while undecided).
    pub kvm_exit_fires: Option<bool>,
    /// Whether KVM's statistics come through QMP.
    pub qmp_stats: bool,
    /// The names of the counters no source gives this VM: readers show them as not available.
    pub unavailable: Vec<&'static str>,
}

/// The path of `partition`'s facts file in the instance directory `instance_dir`.
pub fn facts_path(instance_dir: &Path, partition: u64) -> PathBuf {
    instance_dir.join("partition").join(partition.to_string()).join(OBSERVED_FILE)
}

/// Publishes `facts` for `partition` (atomically: temporary file, then rename). An instance that
/// is not published has nowhere to put them.
///
/// # Errors
/// When the file cannot be written.
pub fn publish(
    instance_dir: Option<&Path>,
    partition: &PartitionStats,
    facts: &ObservedFacts,
) -> std::io::Result<()> {
    let Some(dir) = instance_dir else { return Ok(()) };
    let path = facts_path(dir, partition.id());
    let Some(parent) = path.parent() else { return Ok(()) };
    let tmp = parent.join(format!(".{OBSERVED_FILE}.tmp"));
    let text = serde_json::to_vec_pretty(facts).map_err(std::io::Error::other)?;
    let mut file =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o644).open(&tmp)?;
    file.write_all(&text)?;
    std::fs::rename(&tmp, &path)
}
