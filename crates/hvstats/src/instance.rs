//! A hypervisor instance: the hypervisor object, its LPs, and its partitions with their VPs,
//! each with a stats page.
//!
//! The process that owns a [`Hypervisor`] is the root partition. The instance keeps the
//! hypervisor-wide counters (partitions, VPs, total pages, LPs) up to date, holds each guest
//! partition's GPA-space bookkeeping of mapped stats pages ([`GpaSpace`]) and the state the map
//! rules check. Its pages live in two arenas ([`crate::arena`]): one for the hypervisor and LP
//! objects, one for partitions and VPs, each in a memfd, or, when published
//! ([`Hypervisor::new_published`]), in files under the runtime directory ([`crate::publish`]) that
//! readers map; what the index says about each object (its ids, name, state, the counters no
//! source gives) is written there as it changes.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use hvstats_abi::catalog::{hypervisor, partition};
use hvstats_abi::vm_state::VmState;
use hvstats_abi::{CounterId, ObjectKind};

use crate::arena::{self, Arena, ObjectRecord};
use crate::gpa_space::GpaSpace;
use crate::index::{self, InstanceDescription, Role, ew};
use crate::page::SharedPage;
use crate::publish::{NewFiles, PageAccess, Publication, PublishError};
use crate::rules::{DEFAULT_STATS_PAGE_QUOTA, ObjectDirectory, ObjectKey, PartitionFacts, StatsObject};

/// An error creating an instance or its objects.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    /// A page could not be created (the arena is full, or its storage cannot grow: `ENOSPC`).
    #[error("cannot create a stats page")]
    Page(#[source] io::Error),
    /// An arena could not be laid out (a full filesystem is `ENOSPC` here).
    #[error("cannot create the instance's arena")]
    Arena(#[source] io::Error),
    /// Publication failed.
    #[error(transparent)]
    Publish(#[from] PublishError),
}

impl From<InstanceError> for io::Error {
    fn from(e: InstanceError) -> Self {
        let kind = match &e {
            InstanceError::Page(io) | InstanceError::Arena(io) => io.kind(),
            InstanceError::Publish(p) => p.io_kind().unwrap_or(io::ErrorKind::Other),
        };
        io::Error::new(kind, e)
    }
}

/// How to build a [`Hypervisor`].
#[derive(Clone, Debug)]
pub struct InstanceConfig {
    /// Publish under this runtime directory (`None`: pages in anonymous memory only).
    pub runtime_dir: Option<PathBuf>,
    /// The host CPUs to create LP objects for (`None`: every online CPU).
    pub logical_processors: Option<Vec<u32>>,
    /// The number of stats pages each caller (each guest partition, and the root) may map at once.
    pub stats_page_quota: u32,
    /// What readers are told about the instance: what publishes it and a free name.
    pub description: InstanceDescription,
    /// Who besides the owner may read partition and VP pages (default: nobody).
    pub page_access: PageAccess,
    /// The most partition and VP objects the instance can hold (address space reserved up front).
    pub max_objects: usize,
}

impl Default for InstanceConfig {
    fn default() -> Self {
        Self {
            runtime_dir: None,
            logical_processors: None,
            stats_page_quota: DEFAULT_STATS_PAGE_QUOTA,
            description: InstanceDescription::default(),
            page_access: PageAccess::default(),
            max_objects: arena::MAX_SLOTS,
        }
    }
}

/// One logical processor object.
#[derive(Debug)]
pub struct LogicalProcessorStats {
    index: u32,
    cpu: u32,
    page: SharedPage,
    /// The counters the host last gave nothing for ([`crate::lp::unmeasured`]), as declared.
    unmeasured: Mutex<Option<Vec<CounterId>>>,
}

impl LogicalProcessorStats {
    /// The LP index: 0, 1, … over the CPUs the instance covers, whatever their host numbers.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The host CPU it stands for.
    pub fn cpu(&self) -> u32 {
        self.cpu
    }

    /// The stats page of this LP (host CPU [`cpu`](Self::cpu)).
    pub fn page(&self) -> &SharedPage {
        &self.page
    }
}

/// The stats objects of one partition: its page and one page per VP, its state, and the stats
/// pages mapped into its GPA space.
#[derive(Debug)]
pub struct PartitionStats {
    id: u64,
    page: SharedPage,
    vps: Vec<SharedPage>,
    /// The VPs' indices when they are not `0..vps.len()` (a partition published under another
    /// hypervisor's numbering), ascending.
    vp_indices: Option<Vec<u32>>,
    active: AtomicBool,
    removed: AtomicBool,
    gpa: Mutex<GpaSpace>,
    overlay_writes: AtomicU64,
    hypervisor: Weak<Hypervisor>,
    /// True for a partition this process runs (not one published for another VMM or
    /// hypervisor): the authority keeps its run state.
    own: bool,
}

impl PartitionStats {
    /// The partition id: from 1 in creation order, or the observed hypervisor's own id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The partition's page.
    pub fn page(&self) -> &SharedPage {
        &self.page
    }

    /// The page of VP `index`.
    pub fn vp_page(&self, index: u32) -> Option<&SharedPage> {
        match &self.vp_indices {
            None => self.vps.get(index as usize),
            Some(indices) => indices.binary_search(&index).ok().map(|i| &self.vps[i]),
        }
    }

    /// Each VP's index and page, in index order.
    pub fn vp_pages(&self) -> impl Iterator<Item = (u32, &SharedPage)> {
        self.vps.iter().enumerate().map(|(i, page)| match &self.vp_indices {
            None => (i as u32, page),
            Some(indices) => (indices[i], page),
        })
    }

    /// Number of VPs the partition was created with (an observer's indices need not be `0..n`).
    pub fn vp_count(&self) -> u32 {
        self.vps.len() as u32
    }

    /// True while the partition is active. A new partition is active; one being torn down is not,
    /// and map requests naming it get `INVALID_PARTITION_STATE`.
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Marks the partition active or not (readers see it in the index; a partition made inactive
    /// this way is "stopped" with no reason given).
    pub fn set_active(&self, active: bool) {
        if self.own {
            let state = if active { VmState::Running } else { VmState::Shutdown };
            self.page.set(partition::VM_STATE, state.code());
        }
        if self.active.swap(active, Ordering::Relaxed) != active {
            self.write_entry(|w| {
                w[ew::STATE] = if active { index::state::ACTIVE } else { index::state::STOPPED };
                if active {
                    w[ew::REASON..ew::REASON + 8].fill(0);
                }
            });
        }
    }

    /// Stops the partition, saying why (e.g. "VP 1 faulted: triple fault"): guests get
    /// `INVALID_PARTITION_STATE` from now on, while root readers keep reading every page of it
    /// (its final values) and see the reason.
    pub fn stop(&self, reason: &str) {
        if self.own {
            self.page.set(partition::VM_STATE, VmState::Shutdown.code());
        }
        self.active.store(false, Ordering::Relaxed);
        let text = index::encode_text(reason, index::TEXT_BYTES / 8);
        self.write_entry(|w| {
            w[ew::STATE] = index::state::STOPPED;
            w[ew::REASON..ew::REASON + 8].copy_from_slice(&text);
        });
    }

    /// Records the VMM process that runs this partition's VM (an observed VM), for readers.
    pub fn set_vmm(&self, vmm: crate::vmm::VmmProcess) {
        self.write_entry(|w| w[ew::VMM] = vmm.to_word());
    }

    /// Records when the observed VM's process started: the origin of the counters its sources
    /// count from the vCPU's creation ([`hvstats_abi::vm_sources::CountOrigins`]).
    pub fn set_vm_started(&self, at: std::time::SystemTime) {
        self.page.set(partition::VM_STARTED, unix_micros(at));
    }

    /// Records when the counts the kernel keeps for the observed VM across observers began (the
    /// first observer's attach), `None` when none are kept: the origin of the counters its
    /// sources keep ([`hvstats_abi::vm_sources::CountOrigins`]).
    pub fn set_kept_since(&self, at: Option<std::time::SystemTime>) {
        self.page.set(partition::KEPT_SINCE, at.map_or(0, unix_micros));
    }

    /// Records the VM's UUID (an observed VM whose VMM was given one), for readers.
    pub fn set_uuid(&self, uuid: crate::vmm::VmUuid) {
        self.write_entry(|w| w[ew::UUID..ew::UUID + 2].copy_from_slice(&uuid.to_words()));
    }

    /// Records the VM's Hyper-V enlightenments (an observed VM: a word of
    /// `hvstats_abi::hyperv_features`, its `KNOWN` bit set), for readers.
    pub fn set_hyperv_enlightenments(&self, word: u64) {
        self.write_entry(|w| w[ew::HYPERV] = word);
    }

    /// Declares counters of this partition and of its VPs that no source gives (an observed VM's
    /// hypercall counts, say): readers report them as unknown (`None`, JSON null), never as 0.
    /// Replaces any earlier declaration; ids of other object kinds are ignored. A partition this
    /// process runs keeps the catalog's unmaintained rows declared besides `counters`.
    pub fn set_unavailable(&self, counters: &[CounterId]) {
        let own = self.own.then(own_unmaintained).unwrap_or_default();
        self.write_entry(|w| write_unavailable(w, &[counters, &own].concat()));
    }

    fn write_entry(&self, f: impl FnOnce(&mut [u64; index::ENTRY_WORDS])) {
        // A removed partition's entry is already free: leave it so.
        if self.removed.load(Ordering::Relaxed) {
            return;
        }
        if let (Some(hv), Some(slot)) = (self.hypervisor.upgrade(), self.page.arena_slot()) {
            let _partitions = hv.lock_partitions();
            if self.removed.load(Ordering::Relaxed) {
                return;
            }
            hv.arena.change().write_entry(slot, f);
        }
    }

    /// Tells the authority the size of the partition's RAM: it sets "GPA pages" (RAM plus
    /// overlays outside RAM) and the hypervisor's "Total pages".
    pub fn set_ram_pages(&self, pages: u64) {
        let mut gpa = self.gpa_space();
        let old = gpa.set_ram_pages(pages);
        self.page.set(partition::GPA_PAGES, gpa.gpa_pages());
        if gpa.detached() {
            return;
        }
        if let Some(hv) = self.hypervisor.upgrade() {
            hv.page.fetch_add(hypervisor::TOTAL_PAGES, pages.wrapping_sub(old));
        }
    }

    /// The stats pages mapped into the partition's GPA space, locked while the guard is held:
    /// read what you need and drop it before calling anything else on the instance (the instance
    /// takes its partition list before a GPA space, never the other way round).
    pub fn gpa_space(&self) -> MutexGuard<'_, GpaSpace> {
        self.gpa.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The object whose stats page is visible at `gpa` in this partition, if any.
    pub fn overlay_at(&self, gpa: u64) -> Option<ObjectKey> {
        self.gpa_space().overlay_at(gpa)
    }

    /// Called by the backend when a guest wrote to `gpa`: true (and counted) when `gpa` is a
    /// stats overlay, whose contents the write did not change. The backend counts the exit itself
    /// (a memory intercept message); this count is the authority's own record.
    pub fn record_overlay_write(&self, gpa: u64) -> bool {
        let hit = self.overlay_at(gpa).is_some();
        if hit {
            self.overlay_writes.fetch_add(1, Ordering::Relaxed);
        }
        hit
    }

    /// Guest writes to stats overlays seen by [`record_overlay_write`](Self::record_overlay_write).
    pub fn overlay_writes(&self) -> u64 {
        self.overlay_writes.load(Ordering::Relaxed)
    }

    /// Limits the number of stats pages the partition may map at once (default 64).
    pub fn set_stats_page_quota(&self, quota: u32) {
        self.gpa_space().mappings_mut().set_quota(quota);
    }

    fn stats_pages(&self) -> u64 {
        1 + self.vps.len() as u64
    }
}

/// The hypervisor's page and one LP object per CPU of `cpus`, made in one change of the global
/// arena, the hypervisor's page counting them.
fn global_pages(
    global: &Arc<Arena>,
    cpus: Vec<u32>,
) -> Result<(SharedPage, Vec<LogicalProcessorStats>), InstanceError> {
    let mut change = global.change();
    let mut create = |kind, id: u64, index: u32| {
        let record = ObjectRecord { kind, id, index, vp_count: 0 };
        SharedPage::in_arena(global, &mut change, record).map_err(InstanceError::Page)
    };
    let page = create(ObjectKind::Hypervisor, 0, 0)?;
    let mut lps = Vec::with_capacity(cpus.len());
    for (index, cpu) in cpus.into_iter().enumerate() {
        let index = index as u32;
        lps.push(LogicalProcessorStats {
            index,
            cpu,
            page: create(ObjectKind::LogicalProcessor, u64::from(index), cpu)?,
            unmeasured: Mutex::new(None),
        });
    }
    drop(change);
    page.set(hypervisor::LOGICAL_PROCESSORS, lps.len() as u64);
    page.set(hypervisor::TOTAL_PAGES, 1 + lps.len() as u64);
    Ok((page, lps))
}

/// Declares what no source gives from the start (an importer that gives more, as mshv's,
/// declares again): the catalog's unmaintained rows, the observer's health on an instance that
/// is not an observer, an LP's C-states its CPU does not have.
fn declare_global_unavailable(
    global: &Arena,
    page: &SharedPage,
    lps: &[LogicalProcessorStats],
    observer: bool,
) {
    let unmaintained: Vec<CounterId> = hvstats_abi::catalog::counters_of(ObjectKind::Hypervisor)
        .filter(|c| !c.maintained.is_maintained())
        .map(|c| c.id)
        .collect();
    if let Some(slot) = page.arena_slot() {
        global.change().write_entry(slot, |w| {
            write_global_unavailable(w, ObjectKind::Hypervisor, &unmaintained, observer)
        });
    }
    for lp in lps {
        let missing = crate::lp::unavailable_on_host(lp.cpu);
        if let Some(slot) = lp.page.arena_slot() {
            global.change().write_entry(slot, |w| {
                write_global_unavailable(w, ObjectKind::LogicalProcessor, &missing, observer)
            });
        }
    }
}

/// The page of one object, holding its partition alive while borrowed.
#[derive(Debug)]
pub enum ObjectPage<'a> {
    /// The hypervisor page or an LP page.
    Global(&'a SharedPage),
    /// A partition's page (`None`) or the page of one of its VPs.
    Partition(Arc<PartitionStats>, Option<u32>),
}

impl ObjectPage<'_> {
    /// The hypervisor, LP, partition or VP page this names.
    pub fn page(&self) -> &SharedPage {
        match self {
            ObjectPage::Global(page) => page,
            ObjectPage::Partition(p, None) => &p.page,
            // Made by `object_page` only for a VP the partition has.
            ObjectPage::Partition(p, Some(n)) => p.vp_page(*n).unwrap_or(&p.page),
        }
    }
}

/// One hypervisor instance: the root partition's view of every object.
#[derive(Debug)]
pub struct Hypervisor {
    me: Weak<Hypervisor>,
    page: SharedPage,
    lps: Vec<LogicalProcessorStats>,
    partitions: Mutex<BTreeMap<u64, Arc<PartitionStats>>>,
    next_id: AtomicU64,
    root_gpa: Mutex<GpaSpace>,
    quota: u32,
    arena: Arc<Arena>,
    global: Arc<Arena>,
    /// True for an observer's instance (its hypervisor page carries the observer's health).
    observer: bool,
    /// The host's files the LPs' refreshes read, held open.
    host_files: Mutex<crate::lp::HostFiles>,
    // Dropped after the pages: their files are removed from the runtime directory.
    publication: Option<Publication>,
}

impl Hypervisor {
    /// A new unpublished instance with no partitions and an LP object per online CPU.
    ///
    /// # Errors
    /// When a page cannot be created.
    pub fn new() -> io::Result<Arc<Self>> {
        Ok(Self::with_config(InstanceConfig::default())?)
    }

    /// A new instance published under `runtime_dir` (see [`crate::publish`]).
    ///
    /// # Errors
    /// When the instance directory, a page file or the manifest cannot be created.
    pub fn new_published(runtime_dir: &Path) -> Result<Arc<Self>, InstanceError> {
        Self::with_config(InstanceConfig { runtime_dir: Some(runtime_dir.to_owned()), ..Default::default() })
    }

    /// A new instance as `config` says.
    ///
    /// # Errors
    /// When a page, or the publication, cannot be created.
    pub fn with_config(config: InstanceConfig) -> Result<Arc<Self>, InstanceError> {
        let (mut publication, files) = match config.runtime_dir.as_deref() {
            Some(dir) => {
                let (p, files) = Publication::begin(dir, config.page_access)?;
                (Some(p), files)
            }
            None => {
                let memfd = || arena::anonymous_file().map_err(InstanceError::Arena);
                (None, NewFiles { partitions: memfd()?, global: memfd()? })
            }
        };
        let cpus = config.logical_processors.unwrap_or_else(crate::lp::online_cpus);
        let layout = |file: File, role, max| {
            Arena::create(file, role, &config.description, max).map(Arc::new).map_err(|source| {
                match &publication {
                    Some(p) => InstanceError::Publish(PublishError::Arena { path: p.arena_path(), source }),
                    None => InstanceError::Arena(source),
                }
            })
        };
        let global = layout(files.global, Role::Global, 1 + cpus.len())?;
        let arena = layout(files.partitions, Role::Partitions, config.max_objects)?;
        let (page, lps) = global_pages(&global, cpus)?;
        let observer = config.description.kind == index::OBSERVER_KIND;
        declare_global_unavailable(&global, &page, &lps, observer);
        if let Some(p) = &mut publication {
            p.commit()?;
        }
        Ok(Arc::new_cyclic(|me| Self {
            me: me.clone(),
            page,
            lps,
            partitions: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(1),
            root_gpa: Mutex::new(GpaSpace::new(config.stats_page_quota)),
            quota: config.stats_page_quota,
            arena,
            global,
            observer,
            host_files: Mutex::default(),
            publication,
        }))
    }

    /// The hypervisor object's stats page.
    pub fn page(&self) -> &SharedPage {
        &self.page
    }

    /// The logical processor objects, by index.
    pub fn logical_processors(&self) -> &[LogicalProcessorStats] {
        &self.lps
    }

    /// Refreshes every LP page from the host's `/proc/stat`, `/proc/interrupts` and cpuidle
    /// (see [`crate::lp`]); called on the collector's cadence, the only writer of LP pages.
    /// Every publisher calls it once per refresh of its counters, so it also notes the refresh
    /// and its period in the instance's headers, where readers learn how often counters move
    /// ([`crate::attach::Instance::refresh_period`]).
    ///
    /// # Errors
    /// When procfs cannot be read.
    pub fn refresh_lps(&self) -> io::Result<()> {
        self.arena.note_refresh();
        self.global.note_refresh();
        let cpus: Vec<u32> = self.lps.iter().map(|lp| lp.cpu).collect();
        let samples = self.host_files.lock().unwrap_or_else(PoisonError::into_inner).sample(&cpus)?;
        self.refresh_lps_with(&samples);
        Ok(())
    }

    /// Writes `samples` (one per LP, in LP order) into the LP pages, and declares unavailable
    /// what the host gave nothing for ([`crate::lp::unmeasured`]: an idle state its cpuidle
    /// driver lacks, a CPU without a line in `/proc/stat`), so readers show it absent rather
    /// than 0. The declaration is written only when it changes.
    pub fn refresh_lps_with(&self, samples: &[crate::lp::LpSample]) {
        for (lp, sample) in self.lps.iter().zip(samples) {
            crate::lp::apply(&lp.page, sample);
            let unmeasured = crate::lp::unmeasured(sample);
            let mut declared = lp.unmeasured.lock().unwrap_or_else(|p| p.into_inner());
            if declared.as_ref() != Some(&unmeasured) {
                self.set_global_unavailable(Some(lp.index), &unmeasured);
                *declared = Some(unmeasured);
            }
        }
    }

    /// Declares counters of the hypervisor object (`lp` `None`) or of LP `lp` that no source
    /// gives (an L1VH prints no hypervisor or LP file): readers report them as unknown (`None`,
    /// JSON null), never as 0. Replaces any earlier declaration; ids of other kinds are ignored.
    pub fn set_global_unavailable(&self, lp: Option<u32>, counters: &[CounterId]) {
        let (kind, page) = match lp {
            None => (ObjectKind::Hypervisor, Some(&self.page)),
            Some(n) => (ObjectKind::LogicalProcessor, self.lps.get(n as usize).map(|lp| &lp.page)),
        };
        let Some(slot) = page.and_then(SharedPage::arena_slot) else { return };
        self.global
            .change()
            .write_entry(slot, |w| write_global_unavailable(w, kind, counters, self.observer));
    }

    /// Replaces the published instance's side file of counters the catalog has no place for
    /// (see [`crate::unmapped`]); nothing when not published.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn publish_unmapped(&self, bytes: &[u8]) -> Result<(), PublishError> {
        match &self.publication {
            Some(p) => p.replace_unmapped(bytes),
            None => Ok(()),
        }
    }

    /// The path of the published partitions arena, when published.
    pub fn published_path(&self) -> Option<PathBuf> {
        self.publication.as_ref().map(Publication::arena_path)
    }

    /// The published instance's name, when published.
    pub fn published_name(&self) -> Option<crate::publish::InstanceName> {
        self.publication.as_ref().map(Publication::name)
    }

    /// Creates the stats objects of a new, active partition with `vp_count` VPs.
    ///
    /// # Errors
    /// When a page cannot be created (the arena is full, or its storage cannot grow).
    pub fn create_partition(&self, vp_count: u32) -> io::Result<Arc<PartitionStats>> {
        self.create_partition_named(vp_count, "")
    }

    /// Creates the stats objects of a new, active partition with `vp_count` VPs, named `name`
    /// for readers.
    ///
    /// # Errors
    /// When a page cannot be created (the arena is full, or its storage cannot grow).
    pub fn create_partition_named(&self, vp_count: u32, name: &str) -> io::Result<Arc<PartitionStats>> {
        let indices: Vec<u32> = (0..vp_count).collect();
        self.create(None, &indices, name, &[], true)
    }

    /// Creates the stats objects of a new, active partition under the id `id`, with VPs numbered
    /// `vp_indices` (ascending), named `name`: how an observer of another hypervisor publishes
    /// that hypervisor's partitions under their own ids and VP indices.
    ///
    /// # Errors
    /// `AlreadyExists` when a partition has the id, `InvalidInput` when the indices are not
    /// ascending; otherwise as [`create_partition`](Self::create_partition).
    pub fn create_partition_with_id(
        &self,
        id: u64,
        vp_indices: &[u32],
        name: &str,
    ) -> io::Result<Arc<PartitionStats>> {
        self.create(Some(id), vp_indices, name, &[], false)
    }

    /// As [`create_partition_with_id`](Self::create_partition_with_id) (under the next free id
    /// when `id` is `None`), with the counters no source gives declared unavailable from the
    /// start, in the same index change: no reader ever sees them as 0.
    ///
    /// # Errors
    /// As [`create_partition_with_id`](Self::create_partition_with_id).
    pub fn create_partition_declared(
        &self,
        id: Option<u64>,
        vp_indices: &[u32],
        name: &str,
        unavailable: &[CounterId],
    ) -> io::Result<Arc<PartitionStats>> {
        self.create(id, vp_indices, name, unavailable, false)
    }

    /// Creates a partition; `own` for one this process runs (see [`PartitionStats::own`]).
    fn create(
        &self,
        id: Option<u64>,
        vp_indices: &[u32],
        name: &str,
        unavailable: &[CounterId],
        own: bool,
    ) -> io::Result<Arc<PartitionStats>> {
        if !vp_indices.is_sorted_by(|a, b| a < b) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "VP indices not ascending"));
        }
        let id = id.unwrap_or_else(|| self.next_id.fetch_add(1, Ordering::Relaxed));
        let vp_count = vp_indices.len() as u32;
        let mut partitions = self.lock_partitions();
        if partitions.contains_key(&id) {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("partition {id} exists")));
        }
        let (page, vps) = self.partition_pages(id, vp_indices, name, unavailable, own)?;
        page.set(partition::VIRTUAL_PROCESSORS, vp_count as u64);
        // Every counter of the page counts from now (but those an observer says count from the
        // VM's start): a reader tells a partition published again from one that went quiet.
        page.set(partition::COUNTING_SINCE, unix_micros(std::time::SystemTime::now()));
        if own {
            page.set(partition::VM_STATE, VmState::Running.code());
        }
        let stats = Arc::new(PartitionStats {
            id,
            page,
            vps,
            vp_indices: vp_indices.iter().copied().ne(0..vp_count).then(|| vp_indices.to_vec()),
            active: AtomicBool::new(true),
            removed: AtomicBool::new(false),
            gpa: Mutex::new(GpaSpace::new(self.quota)),
            overlay_writes: AtomicU64::new(0),
            hypervisor: self.me.clone(),
            own,
        });
        partitions.insert(id, stats.clone());
        self.page.set(hypervisor::PARTITIONS, partitions.len() as u64);
        self.page.fetch_add(hypervisor::VIRTUAL_PROCESSORS, vp_count as u64);
        self.page.fetch_add(hypervisor::TOTAL_PAGES, stats.stats_pages());
        Ok(stats)
    }

    /// A partition's page and its VPs' pages, made in one index change: VPs first, their
    /// partition last, so a reader never finds a partition whose VPs are not there yet. The
    /// partition's entry carries its name and the counters unavailable from the start.
    fn partition_pages(
        &self,
        id: u64,
        vp_indices: &[u32],
        name: &str,
        unavailable: &[CounterId],
        own: bool,
    ) -> io::Result<(SharedPage, Vec<SharedPage>)> {
        let mut vps = Vec::with_capacity(vp_indices.len());
        let mut change = self.arena.change();
        let made = (|| {
            for &n in vp_indices {
                let record = ObjectRecord { kind: ObjectKind::Vp, id, index: n, vp_count: 0 };
                vps.push(SharedPage::in_arena(&self.arena, &mut change, record)?);
            }
            let vp_count = vp_indices.len() as u64;
            let record = ObjectRecord { kind: ObjectKind::Partition, id, index: 0, vp_count };
            let page = SharedPage::in_arena(&self.arena, &mut change, record)?;
            if let Some(slot) = page.arena_slot() {
                let text = (!name.is_empty()).then(|| index::encode_text(name, index::TEXT_BYTES / 8));
                change.write_entry(slot, |w| {
                    if let Some(text) = text {
                        w[ew::NAME..ew::NAME + 8].copy_from_slice(&text);
                    }
                    match own {
                        true => write_unavailable(w, &[unavailable, &own_unmaintained()].concat()),
                        false => write_unavailable(w, unavailable),
                    }
                });
            }
            Ok::<_, io::Error>(page)
        })();
        // On an error the pages made so far release their slots as they drop, after the change.
        drop(change);
        made.map(|page| (page, vps))
    }

    /// Removes partition `id`'s objects: it stops being active, its pages leave the counts and
    /// the index (mappings already made stay valid; a slot is reused only once every handle to
    /// its page is dropped, and then with a new generation).
    pub fn remove_partition(&self, id: u64) {
        let mut partitions = self.lock_partitions();
        let Some(stats) = partitions.remove(&id) else { return };
        stats.active.store(false, Ordering::Relaxed);
        stats.removed.store(true, Ordering::Relaxed);
        {
            let mut change = self.arena.change();
            // The partition first, then its VPs: a reader never finds VPs of a listed partition gone.
            let slots = std::iter::once(&stats.page).chain(&stats.vps).filter_map(SharedPage::arena_slot);
            for slot in slots {
                change.write_entry(slot, |w| {
                    w[ew::STATE] = index::state::FREE;
                    w[ew::KIND] = 0;
                });
            }
        }
        let ram = {
            let mut gpa = stats.gpa_space();
            gpa.detach();
            gpa.ram_pages()
        };
        self.page.set(hypervisor::PARTITIONS, partitions.len() as u64);
        self.page.fetch_add(hypervisor::VIRTUAL_PROCESSORS, (stats.vp_count() as u64).wrapping_neg());
        self.page.fetch_add(hypervisor::TOTAL_PAGES, (stats.stats_pages() + ram).wrapping_neg());
        drop(partitions);
    }

    /// The partition with `id`.
    pub fn partition(&self, id: u64) -> Option<Arc<PartitionStats>> {
        self.lock_partitions().get(&id).cloned()
    }

    /// Every partition, by id.
    pub fn partitions(&self) -> Vec<Arc<PartitionStats>> {
        self.lock_partitions().values().cloned().collect()
    }

    /// The stats pages the root (this process) has mapped through [`crate::hypercall::dispatch`].
    pub fn root_gpa_space(&self) -> MutexGuard<'_, GpaSpace> {
        self.root_gpa.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The page of `object`, if it exists.
    pub(crate) fn object_page(&self, object: StatsObject) -> Option<ObjectPage<'_>> {
        match object {
            StatsObject::Hypervisor => Some(ObjectPage::Global(&self.page)),
            StatsObject::LogicalProcessor(n) => {
                self.lps.get(n as usize).map(|lp| ObjectPage::Global(&lp.page))
            }
            StatsObject::Partition(id) => self.partition(id).map(|p| ObjectPage::Partition(p, None)),
            StatsObject::Vp(id, n) => self
                .partition(id)
                .filter(|p| p.vp_page(n).is_some())
                .map(|p| ObjectPage::Partition(p, Some(n))),
        }
    }

    fn lock_partitions(&self) -> MutexGuard<'_, BTreeMap<u64, Arc<PartitionStats>>> {
        self.partitions.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ObjectDirectory for Hypervisor {
    fn logical_processors(&self) -> u32 {
        self.lps.len() as u32
    }

    fn partition_facts(&self, id: u64) -> Option<PartitionFacts> {
        self.partition(id).map(|p| PartitionFacts { vp_count: p.vp_count(), active: p.is_active() })
    }
}

/// Writes the bitmaps of the partition and VP counters among `counters` into a partition entry
/// (ids of other kinds are ignored). The partition bitmap's upper words hold the VM's UUID: only
/// its bit-holding words are written.
/// Writes the unavailable-counter bitmap of a hypervisor or LP entry: `counters` of `kind`, and
/// for the hypervisor of an instance that is not an `observer`, the observer's health rows.
fn write_global_unavailable(
    w: &mut [u64; index::ENTRY_WORDS],
    kind: ObjectKind,
    counters: &[CounterId],
    observer: bool,
) {
    let observer_rows = hvstats_abi::CATALOG.iter().filter(|c| {
        !observer
            && c.id.kind == ObjectKind::Hypervisor
            && matches!(c.maintained.source(), Some(hvstats_abi::Source::Observer(_)))
    });
    let mut bitmap = [0u64; 4];
    for c in counters.iter().filter(|c| c.kind == kind).copied().chain(observer_rows.map(|c| c.id)) {
        if c.kind != kind {
            continue;
        }
        if let Some(bit) = index::unavailable_bit(kind, c.slot()) {
            bitmap[bit / 64] |= 1 << (bit % 64);
        }
    }
    w[ew::UNAVAILABLE_PARTITION..ew::UNAVAILABLE_PARTITION + 4].copy_from_slice(&bitmap);
}

/// The partition and VP rows the catalog says no source maintains for a partition this process
/// runs (synthetic interrupts, the flush counters, …): declared unavailable from its creation on,
/// so that readers show them absent, never as a 0 nothing measured (observed VMs, which have
/// sources for some of them, declare their own).
fn own_unmaintained() -> Vec<CounterId> {
    hvstats_abi::CATALOG
        .iter()
        .filter(|c| {
            matches!(c.id.kind, ObjectKind::Partition | ObjectKind::Vp) && !c.maintained.is_maintained()
        })
        .map(|c| c.id)
        .collect()
}

fn write_unavailable(w: &mut [u64; index::ENTRY_WORDS], counters: &[CounterId]) {
    let (mut part, mut vp) = ([0u64; 4], [0u64; 4]);
    for c in counters {
        let bitmap = match c.kind {
            ObjectKind::Partition => &mut part,
            ObjectKind::Vp => &mut vp,
            _ => continue,
        };
        if let Some(bit) = index::unavailable_bit(c.kind, c.slot()) {
            bitmap[bit / 64] |= 1 << (bit % 64);
        }
    }
    let part_words = index::PARTITION_BITMAP_WORDS;
    w[ew::UNAVAILABLE_PARTITION..ew::UNAVAILABLE_PARTITION + part_words].copy_from_slice(&part[..part_words]);
    let vp_words = index::VP_BITMAP_WORDS;
    w[ew::UNAVAILABLE_VP..ew::UNAVAILABLE_VP + vp_words].copy_from_slice(&vp[..vp_words]);
}

/// `at` in microseconds since the Unix epoch (0 before it, which readers take as unknown).
fn unix_micros(at: std::time::SystemTime) -> u64 {
    at.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hvstats_abi::ObjectKind;

    fn small() -> Arc<Hypervisor> {
        Hypervisor::with_config(InstanceConfig { logical_processors: Some(vec![0, 1]), ..Default::default() })
            .unwrap()
    }

    #[test]
    fn hypervisor_counters_follow_partitions_and_ram() {
        let hv = small();
        assert_eq!(hv.page().get(hypervisor::LOGICAL_PROCESSORS), 2);
        assert_eq!(hv.page().get(hypervisor::TOTAL_PAGES), 3);
        let a = hv.create_partition(2).unwrap();
        let b = hv.create_partition(1).unwrap();
        a.set_ram_pages(256);
        assert_eq!(a.page().get(partition::GPA_PAGES), 256);
        assert_eq!(hv.page().get(hypervisor::PARTITIONS), 2);
        assert_eq!(hv.page().get(hypervisor::VIRTUAL_PROCESSORS), 3);
        assert_eq!(hv.page().get(hypervisor::TOTAL_PAGES), 3 + 3 + 2 + 256);
        a.set_ram_pages(16);
        assert_eq!(hv.page().get(hypervisor::TOTAL_PAGES), 3 + 3 + 2 + 16);
        hv.remove_partition(a.id());
        assert!(!a.is_active());
        a.set_ram_pages(999);
        assert_eq!(hv.page().get(hypervisor::PARTITIONS), 1);
        assert_eq!(hv.page().get(hypervisor::VIRTUAL_PROCESSORS), 1);
        assert_eq!(hv.page().get(hypervisor::TOTAL_PAGES), 3 + 2);
        assert_eq!(hv.partition(b.id()).unwrap().vp_count(), 1);
    }

    #[test]
    fn refresh_lps_fills_each_lp_page_from_the_host() {
        let hv = Hypervisor::new().unwrap();
        assert_eq!(hv.logical_processors().len(), crate::lp::online_cpus().len());
        hv.refresh_lps().unwrap();
        let lp0 = hv.logical_processors()[0].page();
        assert!(lp0.get(hvstats_abi::catalog::lp::GLOBAL_TIME) > 0);
        assert!(lp0.get(hvstats_abi::catalog::lp::TOTAL_RUN_TIME) > 0);
    }

    #[test]
    fn object_pages_are_found_by_object() {
        let hv = small();
        let p = hv.create_partition(2).unwrap();
        let kind = |o| hv.object_page(o).map(|page| page.page().kind());
        assert_eq!(kind(StatsObject::Hypervisor), Some(ObjectKind::Hypervisor));
        assert_eq!(kind(StatsObject::LogicalProcessor(1)), Some(ObjectKind::LogicalProcessor));
        assert_eq!(kind(StatsObject::LogicalProcessor(2)), None);
        assert_eq!(kind(StatsObject::Vp(p.id(), 1)), Some(ObjectKind::Vp));
        assert_eq!(kind(StatsObject::Vp(p.id(), 2)), None);
        assert_eq!(kind(StatsObject::Partition(p.id() + 1)), None);
    }
}
