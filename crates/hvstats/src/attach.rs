//! Attach: root tools in other processes find the live instances under the runtime directory and
//! read their pages — the very pages the owning processes write — with no request to them.
//!
//! [`Attach`] is the long-lived reader `snapshot`, `top`, `serve` and the exporters build on: it
//! opens and maps each instance once, and each [`refresh`](Attach::refresh) notices new, removed
//! and dead instances (one directory listing and one lock test each) and layout changes (one load
//! of each arena's layout sequence; the index is scanned again only when it moved). Reading a VP
//! is a copy from memory checked against its index entry, so a reader never gets the page of a
//! removed object or of the next object in its slot.
//!
//! ```no_run
//! use hvstats::attach::Attach;
//! use hvstats::rules::StatsObject;
//!
//! let mut attach = Attach::new(&hvstats::runtime_dir::runtime_dir());
//! let changes = attach.refresh()?;
//! for problem in &changes.problems {
//!     eprintln!("{}", hvstats::error_chain(problem));
//! }
//! for instance in attach.instances_mut() {
//!     println!("{} ({}: {})", instance.name(), instance.description().kind, instance.description().name);
//!     for partition in instance.partitions() {
//!         for &vp in partition.vp_indices() {
//!             let page = instance.read(StatsObject::Vp(partition.id, vp))?;
//!             let _ = hvstats::snapshot::decode(hvstats_abi::ObjectKind::Vp, &page);
//!         }
//!     }
//!     let _whole = instance.snapshot();
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! An attached root is the root partition: [`RootReader`] applies the same map rules as a
//! hypercall ([`crate::rules`]) to the pages it maps. File permissions add the host's own rule:
//! global pages (hypervisor, LPs) are in a file only their owner (and root) may read.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use hvstats_abi::page::PAGE_SLOTS;
use hvstats_abi::{HvError, ObjectKind, StatsAreaType, StatsObjectIdentity, StatsObjectType, StatsPage};

use crate::index::{self, Entry, InstanceDescription, ObjectState};
use crate::page::MappedPage;
use crate::publish::{self, ARENA_SUFFIX, GLOBAL_SUFFIX, INSTANCES_DIR, InstanceName};
use crate::reader::{ArenaError, ArenaReader, PageCopyError, ReadPath};
use crate::rules::{
    self, DEFAULT_STATS_PAGE_QUOTA, MappingTable, ObjectDirectory, ObjectKey, PartitionFacts, Requester,
    StatsObject,
};
use crate::runtime_dir::{self, Dir, RuntimeDirError, Use};
use crate::trust::{self, Distrust};

/// An error attaching to an instance or reading one of its pages.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The runtime directory (or a file in it) failed its checks or could not be read.
    #[error(transparent)]
    Dir(#[from] RuntimeDirError),
    /// An arena file could not be read, or is not one.
    #[error("cannot read {}", path.display())]
    Arena {
        /// The instance's `.arena` file.
        path: PathBuf,
        /// Why it could not be read, or why it is not an arena.
        #[source]
        source: ArenaError,
    },
    /// A page could not be mapped.
    #[error("cannot map a page of {}", path.display())]
    Page {
        /// The `.arena` or `.global` file holding the page.
        path: PathBuf,
        /// The `mmap` error, or `PermissionDenied` when this user may not map the file.
        #[source]
        source: io::Error,
    },
    /// The object is not (or no longer) in the instance.
    #[error("no such object: {0:?}")]
    NotFound(StatsObject),
    /// The object was removed (or its slot reused) while being read, or its entry stayed busy.
    #[error("{0:?} changed while being read (removed?)")]
    Changed(StatsObject),
    /// Every copy of the object's page overlapped a merge into it for as long as a reader waits
    /// ([`crate::patience::DEADLINE`]; its writer stopped half-way through one?): no copy from one
    /// moment could be taken.
    #[error("{0:?} stayed mid-update through every read for {deadline:?} (its writer stopped during a merge?)", deadline = crate::patience::DEADLINE)]
    Torn(StatsObject),
    /// The map rules refused the request.
    #[error("stats page request refused: {0}")]
    Refused(HvError),
    /// An arena shrank while it was mapped (its owner truncated it): what was read past its new
    /// end was thrown away, and the instance is read again from what the file holds now.
    #[error("{} shrank to {size} bytes while it was read (truncated by its owner?): read again from what it holds", path.display())]
    Shrunk {
        /// The `.arena` or `.global` file.
        path: PathBuf,
        /// Its size now.
        size: u64,
    },
    /// The instance's files are not believed: they do not belong to the user whose process holds
    /// them (see [`crate::trust`]).
    #[error("not believing {}: {why}", path.display())]
    Untrusted {
        /// The instance's `.arena` file.
        path: PathBuf,
        /// Which ownership check failed (file, directory and holding process disagree).
        #[source]
        why: Distrust,
    },
}

impl AttachError {
    /// True when the object exists but this user may not read it.
    pub(crate) fn is_permission_denied(&self) -> bool {
        match self {
            AttachError::Dir(RuntimeDirError::Io { source, .. }) | AttachError::Page { source, .. } => {
                source.kind() == io::ErrorKind::PermissionDenied
            }
            _ => false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SlotRef {
    slot: usize,
    generation: u64,
}

/// One partition as the index describes it.
#[derive(Clone, Debug)]
pub struct PartitionInfo {
    /// The partition id the publisher gave it; unique within the instance.
    pub id: u64,
    /// Its name (may be empty).
    pub name: String,
    /// Active, or stopped with a reason.
    pub state: ObjectState,
    /// The VMM process running it, for an observed VM.
    pub vmm: Option<crate::vmm::VmmProcess>,
    /// The VM's UUID, for an observed VM whose VMM has one.
    pub uuid: Option<crate::vmm::VmUuid>,
    /// The VM's Hyper-V enlightenments (`hvstats_abi::hyperv_features`; 0: not known).
    pub hyperv_enlightenments: u64,
    unavailable_partition: [u64; 4],
    unavailable_vp: [u64; 4],
    slot: SlotRef,
    vp_indices: Vec<u32>,
    vps: Vec<SlotRef>,
}

impl PartitionInfo {
    /// True while active.
    pub fn is_active(&self) -> bool {
        self.state == ObjectState::Active
    }

    /// The indices of its VPs found in the index, in order.
    pub fn vp_indices(&self) -> &[u32] {
        &self.vp_indices
    }

    /// True when counter slot `slot` of `kind` (partition or VP) is one no source gives for it.
    pub fn is_unavailable(&self, kind: ObjectKind, slot: usize) -> bool {
        match kind {
            ObjectKind::Partition => index::is_unavailable(&self.unavailable_partition, kind, slot),
            ObjectKind::Vp => index::is_unavailable(&self.unavailable_vp, kind, slot),
            _ => false,
        }
    }

    fn vp(&self, index: u32) -> Option<SlotRef> {
        self.vp_indices.binary_search(&index).ok().map(|i| self.vps[i])
    }
}

/// One logical processor as the index describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LpInfo {
    /// The LP index: 0, 1, … over the CPUs the instance covers, whatever their host numbers.
    pub index: u32,
    /// The host CPU number the LP stands for.
    pub cpu: u32,
    slot: SlotRef,
    unavailable: [u64; 4],
}

impl LpInfo {
    /// True when counter slot `slot` of the LP is one no source gives for it.
    pub fn is_unavailable(&self, slot: usize) -> bool {
        index::is_unavailable(&self.unavailable, ObjectKind::LogicalProcessor, slot)
    }
}

#[derive(Debug, Default)]
struct GlobalLayout {
    seq: Option<u64>,
    hypervisor: Option<SlotRef>,
    hypervisor_unavailable: [u64; 4],
    lps: Vec<LpInfo>,
}

#[derive(Debug, Default)]
struct PartitionLayout {
    seq: Option<u64>,
    /// In order of id (a read finds one by binary search, no hashing).
    partitions: Vec<PartitionInfo>,
}

/// One live instance, mapped once.
#[derive(Debug)]
pub struct Instance {
    name: InstanceName,
    path: PathBuf,
    arena: ArenaReader,
    global: Result<ArenaReader, String>,
    global_denied: bool,
    global_layout: GlobalLayout,
    layout: PartitionLayout,
}

/// Scans an arena's entries: each live one, decoded, with its slot. Junk entries are skipped.
fn scan(arena: &ArenaReader) -> Vec<(SlotRef, Entry)> {
    let mut found = Vec::new();
    for slot in 0..arena.slots() {
        let Ok(words) = arena.entry_words(slot) else { continue };
        if let Ok(Some(entry)) = Entry::decode(&words) {
            found.push((SlotRef { slot, generation: entry.generation }, entry));
        }
    }
    found
}

impl Instance {
    /// Opens the instance `name` in the instances directory `dir`.
    ///
    /// # Errors
    /// When its partitions arena cannot be opened or read. (A global arena this user may not read
    /// is no error: its objects read as permission denied.)
    pub fn open(dir: &Dir, name: InstanceName) -> Result<Self, AttachError> {
        Self::open_with(dir, name, ReadPath::MapWhenSafe)
    }

    /// As [`open`](Self::open), reaching the arenas by `read_path` ([`ReadPath::Pread`]: never
    /// mapped, as another user's arenas are read).
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn open_with(dir: &Dir, name: InstanceName, read_path: ReadPath) -> Result<Self, AttachError> {
        let path = dir.path().join(name.arena_file());
        let file = dir.open_file(&name.arena_file(), false)?;
        let dir_owner =
            runtime_dir::fstat(dir.fd()).map(|st| st.st_uid).unwrap_or_else(|_| runtime_dir::euid());
        let arena = ArenaReader::open_with(file, read_path)
            .map_err(|source| AttachError::Arena { path: path.clone(), source })?;
        let claimed = arena.header().pid;
        trust::verify(arena.file(), claimed, dir_owner)
            .map_err(|why| AttachError::Untrusted { path: path.clone(), why })?;
        let mut global_denied = false;
        let global = match dir.open_file(&name.global_file(), false) {
            Ok(file) => match trust::verify(&file, claimed, dir_owner) {
                Ok(()) => ArenaReader::open_with(file, read_path).map_err(|e| crate::error_chain(&e)),
                Err(why) => Err(crate::error_chain(&AttachError::Untrusted {
                    path: dir.path().join(name.global_file()),
                    why,
                })),
            },
            Err(e) => {
                global_denied = AttachError::from(e.clone_kind()).is_permission_denied();
                Err(crate::error_chain(&e))
            }
        };
        let mut instance = Self {
            name,
            path,
            arena,
            global,
            global_denied,
            global_layout: GlobalLayout::default(),
            layout: PartitionLayout::default(),
        };
        instance.refresh();
        Ok(instance)
    }

    /// The instance's name (`<pid>-<start>-<n>`), as in its file names.
    pub fn name(&self) -> InstanceName {
        self.name
    }

    /// The path of its partitions arena.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The owning process, as its own PID namespace numbers it.
    pub fn pid(&self) -> u64 {
        self.arena.header().pid
    }

    /// What its publisher says it is.
    pub fn description(&self) -> &InstanceDescription {
        &self.arena.header().description
    }

    /// How often its publisher refreshes its counters, as it last did it (`None` before its
    /// second refresh): a reader sampling more often sees rates alternate between 0 and about
    /// twice the real one.
    pub fn refresh_period(&self) -> Option<std::time::Duration> {
        self.arena.refresh_period()
    }

    /// When the publisher last refreshed its counters, in µs since the Unix epoch (`None`
    /// before its first refresh): the whole instance's time, for pages without their own.
    pub fn refreshed_us(&self) -> Option<u64> {
        self.arena.refreshed_us()
    }

    /// True while its publisher holds its lock (works whatever PID namespace it runs in).
    pub fn is_live(&self) -> bool {
        publish::is_locked(self.arena.file().as_fd())
    }

    /// True when its arena is mapped (not read with pread).
    pub fn is_mapped(&self) -> bool {
        self.arena.is_mapped()
    }

    /// The problem of an arena of this instance that shrank under its mapping, if one did.
    fn shrunk(&self) -> Option<AttachError> {
        let global = self.global.as_ref().ok().filter(|g| g.shrunk());
        let (path, arena) = match (self.arena.shrunk(), global) {
            (true, _) => (self.path.clone(), &self.arena),
            (false, Some(global)) => (self.path.with_extension(&GLOBAL_SUFFIX[1..]), global),
            (false, None) => return None,
        };
        let size = runtime_dir::fstat(arena.file().as_fd()).map(|st| st.st_size as u64).unwrap_or(0);
        Some(AttachError::Shrunk { path, size })
    }

    /// Follows the publisher's changes: new chunks, and the index when its layout sequence moved
    /// (one load per arena when nothing did). Returns true when the layout changed.
    pub fn refresh(&mut self) -> bool {
        let mut changed = false;
        if let Ok(global) = &mut self.global {
            let _ = global.grow();
            let seq = global.layout_seq();
            if self.global_layout.seq != Some(seq) {
                self.global_layout = scan_global(global, seq);
                changed = true;
            }
        }
        let _ = self.arena.grow();
        let seq = self.arena.layout_seq();
        if self.layout.seq != Some(seq) {
            self.layout = scan_partitions(&self.arena, seq);
            changed = true;
        }
        changed
    }

    /// The partitions, by id, as of the last [`refresh`](Self::refresh).
    pub fn partitions(&self) -> &[PartitionInfo] {
        &self.layout.partitions
    }

    /// The partition `id`, as of the last refresh.
    pub fn partition(&self, id: u64) -> Option<&PartitionInfo> {
        let partitions = &self.layout.partitions;
        partitions.binary_search_by_key(&id, |p| p.id).ok().map(|i| &partitions[i])
    }

    /// The LPs, by index (empty when the global pages cannot be read).
    pub fn logical_processors(&self) -> &[LpInfo] {
        &self.global_layout.lps
    }

    /// True when counter slot `slot` of the hypervisor object is one no source gives.
    pub(crate) fn hypervisor_unavailable(&self, slot: usize) -> bool {
        index::is_unavailable(&self.global_layout.hypervisor_unavailable, ObjectKind::Hypervisor, slot)
    }

    /// Why the global pages cannot be read, if they cannot: (reason, permission denied).
    pub fn global_unreadable(&self) -> Option<(&str, bool)> {
        self.global.as_ref().err().map(|e| (e.as_str(), self.global_denied))
    }

    fn locate(&self, object: StatsObject) -> Result<(&ArenaReader, SlotRef), AttachError> {
        let global = || {
            self.global.as_ref().map_err(|_| AttachError::Page {
                path: self.path.with_extension(&GLOBAL_SUFFIX[1..]),
                source: io::Error::from(if self.global_denied {
                    io::ErrorKind::PermissionDenied
                } else {
                    io::ErrorKind::InvalidData
                }),
            })
        };
        let missing = || AttachError::NotFound(object);
        match object {
            StatsObject::Hypervisor => Ok((global()?, self.global_layout.hypervisor.ok_or_else(missing)?)),
            StatsObject::LogicalProcessor(n) => {
                let arena = global()?;
                let lp = self.global_layout.lps.iter().find(|lp| lp.index == n).ok_or_else(missing)?;
                Ok((arena, lp.slot))
            }
            StatsObject::Partition(id) => Ok((&self.arena, self.partition(id).ok_or_else(missing)?.slot)),
            StatsObject::Vp(id, n) => {
                Ok((&self.arena, self.partition(id).and_then(|p| p.vp(n)).ok_or_else(missing)?))
            }
        }
    }

    /// Copies `object`'s page into `out` (a copy from memory, checked against its index entry).
    ///
    /// # Errors
    /// [`AttachError::NotFound`] when the last refresh did not list it, [`AttachError::Changed`]
    /// when it was removed since, or its global file cannot be read; [`AttachError::Torn`] when
    /// every copy of a VP page overlapped a merge into it (a VP page is copied from one moment,
    /// inside its sequence counter, so all its counters come from the same merge).
    pub fn read_into(&self, object: StatsObject, out: &mut [u64; PAGE_SLOTS]) -> Result<(), AttachError> {
        self.read_prefix(object, out)
    }

    /// Copies the first `out.len()` words of `object`'s page into `out` (the headers and
    /// counters of a known layout, without the unused rest of the page).
    ///
    /// # Errors
    /// As [`read_into`](Self::read_into).
    pub fn read_prefix(&self, object: StatsObject, out: &mut [u64]) -> Result<(), AttachError> {
        let (arena, at) = self.locate(object)?;
        copy_page(arena, at, object, out)
    }

    /// [`read_prefix`](Self::read_prefix) of the `i`th VP of `p` (as [`PartitionInfo::vp_indices`]
    /// lists them), without looking the partition up again.
    pub(crate) fn read_vp_prefix(
        &self,
        p: &PartitionInfo,
        i: usize,
        out: &mut [u64],
    ) -> Result<(), AttachError> {
        let at = p.vps.get(i).ok_or(AttachError::NotFound(StatsObject::Partition(p.id)))?;
        let object = StatsObject::Vp(p.id, p.vp_indices.get(i).copied().unwrap_or(u32::MAX));
        copy_page(&self.arena, *at, object, out)
    }

    /// True when `object`, listed by the last refresh, has since been removed (its slot freed or
    /// reused): a copy of it that failed failed because it is gone, not because it is unreadable.
    pub fn removed_since_refresh(&self, object: StatsObject) -> bool {
        match self.locate(object) {
            Ok((arena, at)) => !arena.holds(at.slot, at.generation),
            Err(_) => false,
        }
    }

    /// A copy of `object`'s page.
    ///
    /// # Errors
    /// As [`read_into`](Self::read_into).
    pub fn read(&self, object: StatsObject) -> Result<StatsPage, AttachError> {
        let mut page = StatsPage::default();
        self.read_into(object, &mut page.data)?;
        Ok(page)
    }

    fn map_page(&self, object: StatsObject) -> Result<MappedPage, AttachError> {
        let (arena, at) = self.locate(object)?;
        if !arena.is_mapped() {
            return Err(AttachError::Page {
                path: self.path.clone(),
                source: io::Error::new(io::ErrorKind::PermissionDenied, "the arena belongs to another user"),
            });
        }
        let offset = index::page_offset(at.slot) as u64;
        MappedPage::map_at(arena.file().as_fd(), offset)
            .map_err(|source| AttachError::Page { path: self.path.clone(), source })
    }
}

/// Copies `object`'s page at `at` into `out`; a page with its own sequence counter (a VP's) from
/// one moment of it, so every counter of the copy comes from the same merge.
fn copy_page(
    arena: &ArenaReader,
    at: SlotRef,
    object: StatsObject,
    out: &mut [u64],
) -> Result<(), AttachError> {
    match crate::page::sequence_slot(object.kind()) {
        Some(sequence) => {
            arena.read_page_prefix_consistent(at.slot, at.generation, out, sequence).map_err(|e| match e {
                PageCopyError::Changed => AttachError::Changed(object),
                PageCopyError::Torn => AttachError::Torn(object),
            })
        }
        None => arena.read_page_prefix(at.slot, at.generation, out).map_err(|_| AttachError::Changed(object)),
    }
}

fn scan_global(arena: &ArenaReader, seq: u64) -> GlobalLayout {
    let mut layout = GlobalLayout { seq: Some(seq), ..Default::default() };
    for (at, entry) in scan(arena) {
        match entry.kind {
            ObjectKind::Hypervisor => {
                layout.hypervisor = Some(at);
                layout.hypervisor_unavailable = entry.unavailable_partition;
            }
            ObjectKind::LogicalProcessor => {
                let index = u32::try_from(entry.id).unwrap_or(u32::MAX);
                let unavailable = entry.unavailable_partition;
                layout.lps.push(LpInfo { index, cpu: entry.index, slot: at, unavailable });
            }
            _ => {}
        }
    }
    layout.lps.sort_by_key(|lp| lp.index);
    layout.lps.dedup_by_key(|lp| lp.index);
    layout
}

fn scan_partitions(arena: &ArenaReader, seq: u64) -> PartitionLayout {
    // A consistent scan is one the layout sequence did not move across (even before and after);
    // under constant churn, after a few tries, each entry is still consistent on its own.
    let mut entries = Vec::new();
    for _ in 0..8 {
        let before = arena.layout_seq();
        entries = scan(arena);
        if before.is_multiple_of(2) && arena.layout_seq() == before {
            break;
        }
    }
    let mut vps: HashMap<u64, BTreeMap<u32, SlotRef>> = HashMap::new();
    // By id: the layout's partitions are listed in that order.
    let mut partitions = BTreeMap::new();
    for (at, entry) in entries {
        match entry.kind {
            ObjectKind::Vp => {
                vps.entry(entry.id).or_default().insert(entry.index, at);
            }
            ObjectKind::Partition => {
                partitions.insert(entry.id, (at, entry));
            }
            _ => {}
        }
    }
    let mut layout = PartitionLayout { seq: Some(seq), ..Default::default() };
    for (id, (at, entry)) in partitions {
        let found = vps.remove(&id).unwrap_or_default();
        layout.partitions.push(PartitionInfo {
            id,
            name: entry.name,
            vmm: entry.vmm,
            uuid: entry.uuid,
            hyperv_enlightenments: entry.hyperv_enlightenments,
            state: entry.state,
            unavailable_partition: entry.unavailable_partition,
            unavailable_vp: entry.unavailable_vp,
            slot: at,
            vp_indices: found.keys().copied().collect(),
            vps: found.values().copied().collect(),
        });
    }
    layout
}

impl ObjectDirectory for Instance {
    fn logical_processors(&self) -> u32 {
        self.global_layout.lps.len() as u32
    }

    fn partition_facts(&self, id: u64) -> Option<PartitionFacts> {
        self.partition(id).map(|p| PartitionFacts { vp_count: p.vps.len() as u32, active: p.is_active() })
    }
}

impl RuntimeDirError {
    fn clone_kind(&self) -> RuntimeDirError {
        match self {
            RuntimeDirError::Io { path, what, source } => {
                RuntimeDirError::Io { path: path.clone(), what, source: io::Error::from(source.kind()) }
            }
            RuntimeDirError::Owner { path, owner, euid, root_ok } => {
                RuntimeDirError::Owner { path: path.clone(), owner: *owner, euid: *euid, root_ok: *root_ok }
            }
            RuntimeDirError::Writable { path, mode } => {
                RuntimeDirError::Writable { path: path.clone(), mode: *mode }
            }
            RuntimeDirError::NotRegular { path, expected } => {
                RuntimeDirError::NotRegular { path: path.clone(), expected }
            }
        }
    }
}

/// The instances whose arenas the instances directory lists.
fn listed_instances(dir: &Dir) -> Result<HashSet<InstanceName>, AttachError> {
    let mut listed = HashSet::new();
    for name in &dir.names()? {
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(ARENA_SUFFIX)) else { continue };
        if let Some(name) = InstanceName::parse(stem) {
            listed.insert(name);
        }
    }
    Ok(listed)
}

/// What a [`refresh`](Attach::refresh) noticed.
#[derive(Debug, Default)]
pub struct Changes {
    /// Instances seen for the first time.
    pub added: Vec<InstanceName>,
    /// Instances gone (exited, or died: their publisher no longer holds the lock).
    pub removed: Vec<InstanceName>,
    /// Those of `removed` that died: their publisher let go of the lock and left its files
    /// (a publisher that ends removes its files first).
    pub died: Vec<InstanceName>,
    /// Files of dead publishers removed from the runtime directory.
    pub removed_dead: Vec<PathBuf>,
    /// Instances whose layout changed (partitions added, removed, stopped, renamed).
    pub layout_changed: Vec<InstanceName>,
    /// What could not be read (the rest was).
    pub problems: Vec<AttachError>,
}

/// The long-lived reader of every instance under a runtime directory.
#[derive(Debug)]
pub struct Attach {
    runtime_dir: PathBuf,
    instances: BTreeMap<InstanceName, Instance>,
    read_path: ReadPath,
}

impl Attach {
    /// A reader of the instances under `runtime_dir` (nothing is read until
    /// [`refresh`](Self::refresh)).
    pub fn new(runtime_dir: &Path) -> Self {
        Self::with_read_path(runtime_dir, ReadPath::MapWhenSafe)
    }

    /// As [`new`](Self::new), opening each instance's arenas by `read_path`.
    pub fn with_read_path(runtime_dir: &Path, read_path: ReadPath) -> Self {
        Self { runtime_dir: runtime_dir.to_owned(), instances: BTreeMap::new(), read_path }
    }

    /// Looks again: opens new instances, drops removed and dead ones (removing a dead publisher's
    /// files when this user may), and follows each kept instance's layout.
    ///
    /// # Errors
    /// When the runtime directory exists but fails its checks or cannot be listed (a missing
    /// directory holds no instance).
    pub fn refresh(&mut self) -> Result<Changes, AttachError> {
        let mut changes = Changes::default();
        let dir =
            match Dir::open(&self.runtime_dir, Use::Read).and_then(|d| d.subdir(INSTANCES_DIR, Use::Read)) {
                Ok(dir) => dir,
                Err(RuntimeDirError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                    changes.removed = std::mem::take(&mut self.instances).into_keys().collect();
                    return Ok(changes);
                }
                Err(e) => return Err(e.into()),
            };
        let listed = listed_instances(&dir)?;
        self.drop_shrunk_and_gone(&listed, &mut changes);
        let sweep = publish::sweep(&dir);
        changes.removed_dead = sweep.removed;
        for (path, source) in sweep.not_removed {
            changes.problems.push(AttachError::Dir(RuntimeDirError::Io {
                path,
                what: "remove a dead instance",
                source,
            }));
        }
        self.open_new(&dir, listed, &mut changes);
        for (name, instance) in &mut self.instances {
            if instance.refresh() && !changes.added.contains(name) {
                changes.layout_changed.push(*name);
            }
        }
        Ok(changes)
    }

    /// Drops the instances whose arena shrank under its mapping (said, and opened again from
    /// what its files hold now), and those no longer `listed` or no longer live.
    fn drop_shrunk_and_gone(&mut self, listed: &HashSet<InstanceName>, changes: &mut Changes) {
        let shrunk: Vec<InstanceName> = self
            .instances
            .iter()
            .filter_map(|(name, instance)| {
                changes.problems.push(instance.shrunk()?);
                Some(*name)
            })
            .collect();
        for name in shrunk {
            self.instances.remove(&name);
        }
        let gone: Vec<InstanceName> = self
            .instances
            .iter()
            .filter(|(name, instance)| !listed.contains(name) || !instance.is_live())
            .map(|(name, _)| *name)
            .collect();
        for name in gone {
            if listed.contains(&name) {
                changes.died.push(name);
            }
            self.instances.remove(&name);
            changes.removed.push(name);
        }
    }

    /// Opens the `listed` instances not open yet, the live ones kept.
    fn open_new(&mut self, dir: &Dir, listed: HashSet<InstanceName>, changes: &mut Changes) {
        for name in listed {
            if self.instances.contains_key(&name) {
                continue;
            }
            match Instance::open_with(dir, name, self.read_path) {
                Ok(instance) if instance.is_live() => {
                    changes.added.push(name);
                    self.instances.insert(name, instance);
                }
                // Died between the sweep and now.
                Ok(_) => {}
                Err(AttachError::Dir(RuntimeDirError::Io { source, .. }))
                    if source.kind() == io::ErrorKind::NotFound => {}
                Err(e) => changes.problems.push(e),
            }
        }
    }

    /// The live instances (as of the last refresh), in name order.
    pub fn instances(&self) -> impl Iterator<Item = &Instance> {
        self.instances.values()
    }

    /// The live instances, to refresh or snapshot them one by one.
    pub fn instances_mut(&mut self) -> impl Iterator<Item = &mut Instance> {
        self.instances.values_mut()
    }

    /// The instance `name`.
    pub fn instance(&self, name: InstanceName) -> Option<&Instance> {
        self.instances.get(&name)
    }

    /// Takes the instances out (to hand them to [`RootReader`]s).
    pub fn into_instances(self) -> Vec<Instance> {
        self.instances.into_values().collect()
    }
}

/// What [`discover`] found.
#[derive(Debug, Default)]
pub struct Discovery {
    /// The live instances, in name order.
    pub instances: Vec<Instance>,
    /// Files of dead instances that were removed.
    pub removed_dead: Vec<PathBuf>,
    /// What could not be read or removed.
    pub problems: Vec<AttachError>,
}

/// Finds the live instances under `runtime_dir` once, removing those of dead processes.
///
/// # Errors
/// As [`Attach::refresh`].
pub fn discover(runtime_dir: &Path) -> Result<Discovery, AttachError> {
    let mut attach = Attach::new(runtime_dir);
    let changes = attach.refresh()?;
    Ok(Discovery {
        instances: attach.into_instances(),
        removed_dead: changes.removed_dead,
        problems: changes.problems,
    })
}

/// A root reader attached to one instance: the pages it has mapped, under the map rules.
pub struct RootReader {
    instance: Instance,
    mappings: MappingTable<MappedPage>,
}

impl RootReader {
    /// A reader of `instance` with the default quota of mapped pages.
    pub fn new(instance: Instance) -> Self {
        Self { instance, mappings: MappingTable::new(DEFAULT_STATS_PAGE_QUOTA) }
    }

    /// The attached instance, with its partitions as of its last refresh.
    pub fn instance(&self) -> &Instance {
        &self.instance
    }

    /// The instance, to refresh it.
    pub fn instance_mut(&mut self) -> &mut Instance {
        &mut self.instance
    }

    /// Changes the quota of mapped pages.
    pub fn set_quota(&mut self, quota: u32) {
        self.mappings.set_quota(quota);
    }

    /// HvMapStatsPage for the root: maps the page of the object `identity` names, read-only.
    ///
    /// # Errors
    /// [`AttachError::Refused`] with the rule's status, or [`AttachError::Page`] when the page
    /// cannot be mapped.
    pub fn map_stats_page(
        &mut self,
        stats_type: StatsObjectType,
        identity: StatsObjectIdentity,
    ) -> Result<&MappedPage, AttachError> {
        let key = self.authorize(stats_type, identity)?;
        self.mappings.check_map(&key).map_err(AttachError::Refused)?;
        let page = self.instance.map_page(key.object)?;
        self.mappings.insert(key, page);
        self.mappings.get(&key).ok_or(AttachError::Refused(HvError::INVALID_PARAMETER))
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

    /// A copy of `object`'s page at this moment. Unlike a mapping request, a read is not refused
    /// for a stopped partition: the root keeps reading its final values.
    ///
    /// # Errors
    /// As [`Instance::read`].
    pub fn read(&mut self, object: StatsObject) -> Result<StatsPage, AttachError> {
        self.instance.read(object)
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
