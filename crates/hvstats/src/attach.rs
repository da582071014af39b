//! Attach: a root tool in another process finds the live instances under the runtime directory
//! and maps their pages read-only — the very pages the owning process writes, with no copy and no
//! request to it.
//!
//! An attached reader is the root partition, so it goes through the same rules as a hypercall
//! ([`crate::rules`]): it may map any object, the global ones and the PARENT area included, once
//! per object and view, within its quota. File permissions add the host's own rule: global pages
//! are mode 0600, so only the root user can read them.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use hvstats_abi::{HvStatus, StatsAreaType, StatsObjectIdentity, StatsObjectType, StatsPage};

use crate::page::MappedPage;
use crate::publish::{self, InstanceName, Manifest, PublishError};
use crate::rules::{
    self, DEFAULT_STATS_PAGE_QUOTA, MappingTable, ObjectDirectory, ObjectKey, PartitionFacts, Requester,
    StatsObject,
};

/// An error attaching to an instance or mapping one of its pages.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The runtime directory could not be surveyed.
    #[error(transparent)]
    Survey(#[from] PublishError),
    /// An instance's manifest could not be read.
    #[error("cannot read the manifest of {}", path.display())]
    Manifest {
        /// The instance directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A page file could not be opened or mapped (for global pages: not the root user).
    #[error("cannot map {}", path.display())]
    Page {
        /// The page file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The map rules refused the request.
    #[error("stats page request refused: {0}")]
    Refused(HvStatus),
}

impl AttachError {
    /// True when the page exists but this user may not read it.
    pub fn is_permission_denied(&self) -> bool {
        matches!(self, AttachError::Page { source, .. } if source.kind() == io::ErrorKind::PermissionDenied)
    }
}

/// One live instance, as its manifest describes it.
#[derive(Clone, Debug)]
pub struct AttachedInstance {
    name: InstanceName,
    dir: PathBuf,
    manifest: Manifest,
}

/// What [`discover`] found.
#[derive(Debug, Default)]
pub struct Discovery {
    /// The live instances, in name order.
    pub instances: Vec<AttachedInstance>,
    /// Directories of dead instances that were removed.
    pub removed_dead: Vec<PathBuf>,
    /// Dead instances that could not be removed, and live ones whose manifest could not be read.
    pub problems: Vec<AttachError>,
}

/// Finds the live instances under `runtime_dir`, removing those of dead processes.
///
/// # Errors
/// When the runtime directory exists but cannot be listed.
pub fn discover(runtime_dir: &Path) -> Result<Discovery, AttachError> {
    let survey = publish::survey(runtime_dir)?;
    let mut found = Discovery { removed_dead: survey.removed, ..Default::default() };
    for (path, source) in survey.not_removed {
        found.problems.push(AttachError::Manifest { path, source });
    }
    for (name, dir) in survey.live {
        match AttachedInstance::open(name, dir) {
            Ok(instance) => found.instances.push(instance),
            // It exited between the listing and now.
            Err(AttachError::Manifest { source, .. }) if source.kind() == io::ErrorKind::NotFound => {}
            Err(e) => found.problems.push(e),
        }
    }
    Ok(found)
}

impl AttachedInstance {
    fn open(name: InstanceName, dir: PathBuf) -> Result<Self, AttachError> {
        let manifest = publish::read_manifest(&dir)
            .map_err(|source| AttachError::Manifest { path: dir.clone(), source })?;
        Ok(Self { name, dir, manifest })
    }

    /// The instance's name.
    pub fn name(&self) -> InstanceName {
        self.name
    }

    /// The owning process.
    pub fn pid(&self) -> u32 {
        self.manifest.pid
    }

    /// The instance directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The manifest as last read.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// True while the owning process runs.
    pub fn is_live(&self) -> bool {
        self.name.is_alive()
    }

    /// Reads the manifest again (partitions come and go).
    ///
    /// # Errors
    /// When it cannot be read (the instance may be gone).
    pub fn refresh(&mut self) -> Result<(), AttachError> {
        self.manifest = publish::read_manifest(&self.dir)
            .map_err(|source| AttachError::Manifest { path: self.dir.clone(), source })?;
        Ok(())
    }

    fn map_file(&self, object: StatsObject) -> Result<MappedPage, AttachError> {
        let path = publish::page_path(&self.dir, object);
        let file = match File::open(&path) {
            Ok(file) => file,
            // Listed a moment ago, removed since: the partition no longer exists.
            Err(e) if e.kind() == io::ErrorKind::NotFound && !object.kind().is_global() => {
                return Err(AttachError::Refused(HvStatus::INVALID_PARTITION_ID));
            }
            Err(source) => return Err(AttachError::Page { path, source }),
        };
        MappedPage::map(file.as_fd()).map_err(|source| AttachError::Page { path, source })
    }
}

impl ObjectDirectory for AttachedInstance {
    fn logical_processors(&self) -> u32 {
        self.manifest.logical_processors.len() as u32
    }

    fn partition_facts(&self, id: u64) -> Option<PartitionFacts> {
        self.manifest
            .partitions
            .iter()
            .find(|p| p.id == id)
            .map(|p| PartitionFacts { vp_count: p.vp_count, active: p.active })
    }
}

/// A root reader attached to one instance: the pages it has mapped, under the map rules.
pub struct RootReader {
    instance: AttachedInstance,
    mappings: MappingTable<MappedPage>,
}

impl RootReader {
    /// A reader of `instance` with the default quota of mapped pages.
    pub fn new(instance: AttachedInstance) -> Self {
        Self { instance, mappings: MappingTable::new(DEFAULT_STATS_PAGE_QUOTA) }
    }

    /// The instance.
    pub fn instance(&self) -> &AttachedInstance {
        &self.instance
    }

    /// The instance, to refresh its manifest.
    pub fn instance_mut(&mut self) -> &mut AttachedInstance {
        &mut self.instance
    }

    /// Changes the quota of mapped pages.
    pub fn set_quota(&mut self, quota: u32) {
        self.mappings.set_quota(quota);
    }

    /// HvMapStatsPage for the root: maps the page of the object `identity` names, read-only.
    ///
    /// # Errors
    /// [`AttachError::Refused`] with the rule's status, or [`AttachError::Page`] when the file
    /// cannot be mapped.
    pub fn map_stats_page(
        &mut self,
        stats_type: StatsObjectType,
        identity: StatsObjectIdentity,
    ) -> Result<&MappedPage, AttachError> {
        let key = self.authorize(stats_type, identity)?;
        self.mappings.check_map(&key).map_err(AttachError::Refused)?;
        let page = self.instance.map_file(key.object)?;
        self.mappings.insert(key, page);
        self.mappings.get(&key).ok_or(AttachError::Refused(HvStatus::INVALID_PARAMETER))
    }

    /// HvUnmapStatsPage for the root.
    ///
    /// # Errors
    /// [`AttachError::Refused`] with the rule's status (`INVALID_PARAMETER` when not mapped).
    pub fn unmap_stats_page(
        &mut self,
        stats_type: StatsObjectType,
        identity: StatsObjectIdentity,
    ) -> Result<(), AttachError> {
        let key = self.authorize(stats_type, identity)?;
        self.mappings.remove(&key).map(drop).map_err(AttachError::Refused)
    }

    /// A copy of `object`'s page at this moment: map (own view), copy, unmap.
    ///
    /// # Errors
    /// As [`map_stats_page`](Self::map_stats_page).
    pub fn read(&mut self, object: StatsObject) -> Result<StatsPage, AttachError> {
        let (stats_type, identity) = wire(object, StatsAreaType::SELF);
        let copy = self.map_stats_page(stats_type, identity)?.snapshot();
        self.unmap_stats_page(stats_type, identity)?;
        Ok(copy)
    }

    fn authorize(
        &self,
        stats_type: StatsObjectType,
        identity: StatsObjectIdentity,
    ) -> Result<ObjectKey, AttachError> {
        let request = rules::parse_request(stats_type, 0, identity).map_err(AttachError::Refused)?;
        rules::authorize(Requester::Root, true, &request, &self.instance).map_err(AttachError::Refused)
    }
}

/// The wire form (stats type and identity) of `object` in `area`.
pub fn wire(object: StatsObject, area: StatsAreaType) -> (StatsObjectType, StatsObjectIdentity) {
    let identity = match object {
        StatsObject::Hypervisor => StatsObjectIdentity::hypervisor(area),
        StatsObject::LogicalProcessor(n) => StatsObjectIdentity::logical_processor(n, area),
        StatsObject::Partition(id) => StatsObjectIdentity::partition(id, area),
        StatsObject::Vp(id, n) => StatsObjectIdentity::vp(id, n, area),
    };
    (object.kind().object_type(), identity)
}
