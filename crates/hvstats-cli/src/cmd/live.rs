//! Readings of every live instance, for the operator surfaces (`top`, `serve`, `record`).
//!
//! Each surface asks this one module for "every instance now" and gets snapshots; how they are
//! read — discovering the runtime directory again and mapping each page through the root's map
//! rules — stays here, so a longer-lived reader replaces it without touching the surfaces.

use std::path::{Path, PathBuf};
use std::time::Instant;

use hvstats::attach::{self, RootReader};
use hvstats::snapshot::{self, InstanceSnapshot, PartitionSnapshot, error_chain};

/// Every live instance at one moment.
#[derive(Clone, Debug)]
pub struct Reading {
    /// When the reading was taken (after every page was read).
    pub at: Instant,
    /// The instances, in name order.
    pub instances: Vec<InstanceSnapshot>,
    /// What could not be read, one line each.
    pub problems: Vec<String>,
}

impl Reading {
    /// The partition `id` of instance `instance`, if present.
    pub fn partition(&self, instance: &str, id: u64) -> Option<&PartitionSnapshot> {
        self.instances.iter().find(|i| i.name == instance)?.partitions.iter().find(|p| p.id == id)
    }

    /// The number of VPs over every instance.
    pub fn vp_count(&self) -> usize {
        self.instances.iter().flat_map(|i| &i.partitions).map(|p| p.vps.len()).sum()
    }
}

/// The runtime directory the surfaces read.
#[derive(Clone, Debug)]
pub struct Live {
    dir: PathBuf,
}

impl Live {
    /// A reader of the instances under `dir` (or the default runtime directory).
    pub fn new(dir: Option<PathBuf>) -> Self {
        Self { dir: dir.unwrap_or_else(hvstats::runtime_dir::runtime_dir) }
    }

    /// The runtime directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reads every live instance now. Instances that appeared since the last reading are
    /// included, those that exited are not.
    ///
    /// # Errors
    /// When the runtime directory exists but cannot be listed.
    pub fn read(&self) -> anyhow::Result<Reading> {
        let found = attach::discover(&self.dir)?;
        let problems = found.problems.iter().map(|p| error_chain(p)).collect();
        let instances = found
            .instances
            .into_iter()
            .map(|instance| snapshot::take(&mut RootReader::new(instance)))
            .collect();
        Ok(Reading { at: Instant::now(), instances, problems })
    }

    /// A partition's name for people and labels: `<instance>:<id>` until partitions carry names.
    pub fn vm_name(instance: &str, partition: &PartitionSnapshot) -> String {
        format!("{instance}:{}", partition.id)
    }
}
