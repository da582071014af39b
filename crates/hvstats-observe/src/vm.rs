//! One observed VM: the sources of its counters ([`super::sources`]), which thread runs each
//! vCPU, and the partition (partition page + a VP page per vCPU) it is published as.
//!
//! At attach the VM's sources are opened (the events source and the thread clocks count on every
//! thread of the process, since the vCPU threads are not known yet); each refresh finds which thread runs which
//! vCPU (a source that knows, such as QMP `query-cpus-fast`, then KVM's debugfs, then thread
//! names), reads every source, writes each VP page and the partition page from the source that
//! gives each counter, and declares unavailable what no source gives.
//!
//! Nothing another process says is taken on its word. A VM is its process's for as long as that
//! process is the one it was at attach ([`ProcessIdentity`]: the same pid, start time and
//! program); a change is the VM leaving ([`Departure`]). A thread id is used for a vCPU only
//! while it is a task of the VMM's process that started when it did when it was first accepted,
//! and runs no other vCPU, checked at attach and at every refresh: a QMP peer naming another
//! process's thread (or the init process) is refused, said once per thread
//! ([`ObservedVm::take_refusals`]), and that VP stays unknown until a thread that passes is found.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::Arc;
use std::time::SystemTime;

use hvstats::{Hypervisor, PartitionStats};
use hvstats_abi::ObjectKind;
use hvstats_abi::catalog::{self, CounterId};
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::source::Source;
use hvstats_abi::vm_sources::{Origin, SourceEntry, SourceTable};
use hvstats_host::bpf::task_iter::HeldFile;

use super::attach::{ObserveError, ObserveOptions};
use super::claim::Claim;
use super::discovery::{KvmFds, ProcessIdentity, Procfs, Vmm, is_gone, is_shortage};
use super::publication;
use super::sources::KvmExitState;
use super::sources::{
    Counting, Learned, Named, PeerKind, PeerState, VM_SOURCES, Vcpu, VmAttach, VmSource, VmView,
};
use super::task_walk::VmmTasks;
use super::vm_identity::{VmObject, VmWatch, compare_files, distinct_vms};
use hvstats_abi::vm_state::VmState;
use hvstats_host::exit_watch::ExitWatch;
use hvstats_sources::counter_source::{Composition, Gives, Object};
use hvstats_vmm::unix_sockets::UnixSockets;

/// The partition and VP counters an observed VM could have: every counter whose observed key
/// is a source (the authority's own, like the VP count, are always there). What no source gives
/// of these is declared unavailable.
fn relevant() -> Gives {
    static RELEVANT: std::sync::OnceLock<Gives> = std::sync::OnceLock::new();
    *RELEVANT.get_or_init(|| {
        // The partition page's own bookkeeping (which source gave what) is the observer's to
        // write, not a counter a source gives: declared unavailable, no reader would see it.
        let sourced = |c: &catalog::Counter| {
            !c.is_bookkeeping() && catalog::observed(c).is_some_and(|m| m.source() != Some(Source::Authority))
        };
        Gives {
            partition: CounterSet::of_kind(ObjectKind::Partition, sourced),
            vp: CounterSet::of_kind(ObjectKind::Vp, sourced),
        }
    })
}

/// Why an observed VM is no longer observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Departure {
    /// Its process exited.
    Exited,
    /// Its process `exec()`ed a program (another, or its own anew): what it runs now is not the
    /// VM that was attached.
    Exec,
    /// Its pid now names another process (the VMM exited and the pid was reused).
    PidReused,
    /// The VM its process runs is another KVM VM object now: it closed the one attached (and
    /// made another), or holds another beside it ([`crate::vm_identity::VmWatch`]). A new VM is
    /// attached anew, counting from a new origin: never the old one's counters, frozen.
    VmChanged,
}

/// A thread id a source named for a vCPU and the observer refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadRefusal {
    /// The VP it was named for.
    pub vp: u32,
    /// The thread id.
    pub tid: i32,
    /// Who named it (`qmp`, `debugfs`, `thread name`).
    pub by: &'static str,
    /// Why it was refused.
    pub why: String,
}

/// One observed VM published as a partition.
#[derive(Debug)]
pub struct ObservedVm {
    pid: i32,
    /// Who the VMM process was at attach.
    identity: ProcessIdentity,
    /// Its `exec()`s at attach, as the walk of its threads counts them (`None` where it was
    /// not walked: its identity is read from `/proc` at each refresh).
    exec_id: Option<u64>,
    /// Each accepted vCPU thread's start time (clock ticks after boot), by thread id.
    thread_starts: BTreeMap<i32, u64>,
    /// When the vCPU threads are checked to be who they were.
    thread_check: ThreadCheck,
    /// Thread ids refused once (not said again), and refusals not yet taken.
    refused: BTreeSet<i32>,
    refusals: Vec<ThreadRefusal>,
    vmm: Vmm,
    name: String,
    uuid: Option<hvstats::vmm::VmUuid>,
    vm_fd: u32,
    /// The VM's identity on its platform, as last read (`None` before its first refresh; read
    /// again once a [`hvstats_platform::REREAD_PERIOD`], so a change the platform makes is seen
    /// within it).
    platform: Option<PlatformRead>,
    attached: SystemTime,
    vcpus: Vec<Vcpu>,
    sources: Composition<dyn VmSource>,
    /// Whether any of its sources puts questions to a peer ([`VmSource::asks`]).
    asks: bool,
    /// What each source learned at the last refresh, in the sources' order.
    learned: Vec<Learned>,
    partition: Arc<PartitionStats>,
    hv: Arc<Hypervisor>,
    /// The sources' state the partition page's facts were last published from (`None` before
    /// the first publication).
    published: Option<Vec<SourceState>>,
    /// The counters last declared unavailable.
    declared: Option<Gives>,
    /// This observer's claim on the VMM, released after the partition is removed.
    claim: Option<Claim>,
    /// The VMM's exit, watched without reading `/proc` (on the host's procfs only).
    exit: Option<ExitWatch>,
    /// The VM object attached, watched for its replacement (`None` where its descriptor cannot
    /// be copied or compared).
    watch: Option<VmWatch>,
}

/// The sources a VM is attached with, and what each names of it (its vCPU threads, name, UUID).
type Opened = (Vec<Box<dyn VmSource>>, Vec<Named>);

/// Opens every source of the VM `at` attaches to, in [`VM_SOURCES`]' order.
fn open_sources(at: &VmAttach<'_>) -> Result<Opened, ObserveError> {
    let mut opened = Vec::new();
    for open in VM_SOURCES {
        opened.extend(open(at)?);
    }
    let named = opened.iter_mut().map(|s| s.named()).collect();
    Ok((opened, named))
}

/// Whether `procfs` is the host's own (a fixture names descriptors that are not its), and then
/// the watch on which KVM VM object descriptor `vm_fd` of `pid` is (its descriptors copied and
/// compared).
fn watch_of(procfs: &Procfs, pid: i32, vm_fd: u32) -> (bool, Option<VmWatch>) {
    let live = procfs.root() == std::path::Path::new("/proc");
    let watch = live
        .then(|| VmObject::of(pid, vm_fd).ok())
        .flatten()
        .map(|object| VmWatch::new(procfs, pid, vm_fd, object));
    (live, watch)
}

/// A VM's identity on its platform, as last read.
#[derive(Debug)]
struct PlatformRead {
    /// When it was read.
    at: std::time::Instant,
    /// The VMM's owner then.
    owner: Option<u32>,
    /// Whether the process could be read (its command line, owner and cgroup): one that could
    /// not is read again at the next reading.
    read_whole: bool,
    /// What the process tells: its command line, owner and cgroup, and for Proxmox VE its VM's
    /// configuration ([`Procfs::platform_identity`]).
    of_process: Option<hvstats_platform::Identity>,
    /// What is shown: a peer's word where one is had (libvirt's Nova metadata), else the
    /// process's.
    shown: Option<hvstats_platform::Identity>,
    /// Which `shown` this is: another number, unique in the process, each time it changes, so
    /// what shows the host's VMs (the platforms file) is made again only when one changed.
    version: u64,
}

impl PlatformRead {
    /// Whether the process is read again, its owner now `owner`: where it could not be read
    /// last time, its owner changed, or its identity draws on a file its platform may change (a
    /// Proxmox VE VM's configuration).
    fn reads_process_again(&self, owner: Option<u32>) -> bool {
        use hvstats_platform::Platform;
        let keeps_a_file = self.of_process.as_ref().is_some_and(|i| i.platform() == Platform::Proxmox);
        !self.read_whole || self.owner != owner || keeps_a_file
    }

    /// Shows `peer`'s word where a peer gave one; else the process's where it was `reread` at
    /// this refresh, else what was shown (a peer's word outlives a refresh its peer missed,
    /// until the process is read again). Takes a new version when what is shown changed.
    fn show(&mut self, peer: Option<&hvstats_platform::Identity>, reread: bool) {
        static VERSIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let shown = match peer {
            Some(peer) => Some(peer),
            None if reread => self.of_process.as_ref(),
            None => return,
        };
        if self.shown.as_ref() != shown {
            self.shown = shown.cloned();
            self.version = VERSIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl ObservedVm {
    /// Attaches to the VM of `pid` (whose KVM descriptors are `fds`): opens its sources (no more
    /// than `room` descriptors for its counters, none of `superseded`: copies of descriptors of
    /// a VM it ran before) and creates the partition in `hv`.
    ///
    /// # Errors
    /// When the process has no VM, or holds several, cannot be read, `room` cannot hold a counter
    /// group per vCPU, or the partition cannot be created.
    #[allow(clippy::too_many_arguments, reason = "what attaching takes, each from another owner")]
    pub fn attach(
        hv: &Arc<Hypervisor>,
        procfs: &Procfs,
        pid: i32,
        fds: &KvmFds,
        options: &ObserveOptions,
        room: usize,
        qmp: Option<&std::path::Path>,
        superseded: &[std::os::fd::OwnedFd],
    ) -> Result<Self, ObserveError> {
        let vm_fd = the_vm(pid, fds)?;
        // Walked before `/proc` is read: an exec between the two is seen at the next refresh.
        let walked = crate::task_walk::of_process(procfs, pid);
        let identity = procfs.identity(pid).map_err(|source| ObserveError::Proc { pid, source })?;
        let tasks = walked.as_deref().and_then(|tasks| VmmTasks::of(pid, tasks));
        let exec_id = tasks.map(|t| t.leader()).filter(|l| l.start_ticks() == identity.start_time);
        let attached = SystemTime::now();
        let (live, watch) = watch_of(procfs, pid, vm_fd);
        let at = VmAttach::new(procfs, pid, fds, options, room, qmp, superseded);
        let (opened, named) = open_sources(&at)?;
        let (vmm, name) = procfs.identify(pid);
        let name = named.iter().find_map(|n| n.vm_name.clone()).unwrap_or(name);
        let vcpus: Vec<Vcpu> =
            fds.vcpus.keys().map(|&vcpu_id| Vcpu { vcpu_id, tid: None, qom_path: None }).collect();
        // What the VMM itself says (QMP), else what its command line gives it.
        let uuid = named.iter().find_map(|n| n.vm_uuid).or_else(|| procfs.vm_uuid(pid));
        let partition = publish(hv, pid, vmm, &name, vcpus.len(), uuid)?;
        describe(&partition, procfs, pid, identity.start_time);
        let me = Self {
            pid,
            identity,
            exec_id: exec_id.map(|l| l.exec_id),
            thread_starts: BTreeMap::new(),
            thread_check: ThreadCheck::default(),
            refused: BTreeSet::new(),
            refusals: Vec::new(),
            vmm,
            name,
            uuid,
            vm_fd,
            platform: None,
            attached,
            vcpus,
            asks: opened.iter().any(|s| s.asks()),
            sources: Composition::new(opened),
            learned: Vec::new(),
            partition,
            hv: hv.clone(),
            published: None,
            declared: None,
            claim: None,
            exit: live.then(|| ExitWatch::new(pid)).flatten(),
            watch,
        };
        me.first_refresh(procfs, tasks)
    }

    /// The attached VM after its first refresh, which must find the process still there.
    fn first_refresh(mut self, procfs: &Procfs, tasks: Option<VmmTasks<'_>>) -> Result<Self, ObserveError> {
        let pid = self.pid;
        match self.refresh(procfs, tasks, true) {
            Ok(None) => Ok(self),
            Ok(Some(_)) => Err(ObserveError::Proc { pid, source: io::ErrorKind::NotFound.into() }),
            Err(source) => Err(ObserveError::Proc { pid, source }),
        }
    }

    /// True when descriptor `fd` of `pid` is this VM's very KVM VM object: compared with the copy
    /// held of it, else (where it could not be copied: an observer without `CAP_SYS_PTRACE` under
    /// Yama) with the VMM's own descriptor, which `kcmp` reads with less; `None` where neither can
    /// be told.
    pub fn is_held_at(&self, pid: i32, fd: u32) -> Option<bool> {
        match &self.watch {
            Some(w) => w.object().is_held_at(pid, fd).ok(),
            None => compare_files(pid, fd as i32, self.pid, self.vm_fd as i32).ok().map(|o| o.is_eq()),
        }
    }

    /// Copies of the VMM's descriptors this VM's sources hold (its KVM statistics): once its
    /// VMM replaced the VM, those of the old one, which the new one must not read.
    pub fn vmm_copies(&self) -> Vec<std::os::fd::OwnedFd> {
        let copies = self.sources.sources().iter().flat_map(|s| s.vmm_copies());
        copies.filter_map(|fd| fd.try_clone_to_owned().ok()).collect()
    }

    /// Holds `claim` on the VMM for as long as this VM is observed.
    pub fn hold(&mut self, claim: Claim) {
        self.claim = Some(claim);
    }

    /// The VMM process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Who the VMM process was at attach.
    pub fn identity(&self) -> ProcessIdentity {
        self.identity
    }

    /// The thread ids refused since the last call, each said once.
    pub fn take_refusals(&mut self) -> Vec<ThreadRefusal> {
        std::mem::take(&mut self.refusals)
    }

    /// Each source with what it learned at the last refresh.
    fn learned(&self) -> impl Iterator<Item = (&dyn VmSource, &Learned)> {
        self.sources.sources().iter().map(|s| &**s).zip(&self.learned)
    }

    /// What the VMM offered each source that refused it, and why (see [`Learned::refused`]).
    pub fn source_refusals(&self) -> Vec<(&'static str, String)> {
        self.learned().filter_map(|(s, l)| Some((s.name(), l.refused.clone()?))).collect()
    }

    /// The VM's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The VM's UUID, as QMP or its command line gives it.
    pub fn uuid(&self) -> Option<hvstats::vmm::VmUuid> {
        self.uuid
    }

    /// The VM's identity on the platform that runs it, when one is read (trusted or not: see
    /// [`hvstats_platform::Identity::labels`]).
    pub fn platform(&self) -> Option<&hvstats_platform::Identity> {
        self.platform.as_ref().and_then(|read| read.shown.as_ref())
    }

    /// Which identity [`platform`](Self::platform) is: a number unique in the process, another
    /// each time it changes (`None` while it has none).
    pub(crate) fn platform_version(&self) -> Option<u64> {
        self.platform.as_ref().filter(|read| read.shown.is_some()).map(|read| read.version)
    }

    /// Reads the VM's platform identity again once [`hvstats_platform::REREAD_PERIOD`] passed
    /// since the last. What the process tells is read once: its command line and cgroup are
    /// fixed while it runs a VM, and read anew where its owner changed (a VMM that drops root
    /// after making its VM); what its platform may change meanwhile (a Proxmox VE VM's
    /// configuration) is read again each time. A thousand VMs' command lines are then not read
    /// every minute. True when it was read again (what is shown is then decided anew, by
    /// [`PlatformRead::show`]).
    fn reread_platform(&mut self, procfs: &Procfs) -> bool {
        use hvstats_platform::REREAD_PERIOD;
        let read = match &self.platform {
            Some(read) if read.at.elapsed() < REREAD_PERIOD => return false,
            read => read,
        };
        let owner = procfs.owner(self.pid);
        let of_process = match read {
            Some(read) if !read.reads_process_again(owner) => Some(read.of_process.clone()),
            _ => procfs.platform_identity(self.pid),
        };
        let (read_whole, of_process) = (of_process.is_some(), of_process.flatten());
        let at = std::time::Instant::now();
        let (shown, version) = self.platform.take().map(|r| (r.shown, r.version)).unwrap_or_default();
        self.platform = Some(PlatformRead { at, owner, read_whole, of_process, shown, version });
        true
    }

    /// The VMM.
    pub fn vmm(&self) -> Vmm {
        self.vmm
    }

    /// The partition it is published as.
    pub fn partition(&self) -> &Arc<PartitionStats> {
        &self.partition
    }

    /// When counting began.
    pub fn attached(&self) -> SystemTime {
        self.attached
    }

    /// The thread of each VP, by VP index (`None` while unknown).
    pub fn vcpu_threads(&self) -> Vec<Option<i32>> {
        self.vcpus.iter().map(|v| v.tid).collect()
    }

    /// True when the thread of every VP is known.
    pub(crate) fn vcpu_threads_known(&self) -> bool {
        self.vcpus.iter().all(|v| v.tid.is_some())
    }

    /// The VM's sources, in the order that decides which writes a counter several give.
    pub fn sources(&self) -> &[Box<dyn VmSource>] {
        self.sources.sources()
    }

    /// The source that writes `counter` for this VM now, if any.
    pub fn source_of(&self, counter: CounterId) -> Option<&'static str> {
        let object = match counter.kind {
            ObjectKind::Partition => Object::Partition,
            _ => Object::Vp(0),
        };
        self.sources.writer_of(object, counter).map(|s| s.name())
    }

    /// Threads of the process counted now, and threads left out by the limit.
    pub(crate) fn threads_counted(&self) -> (usize, usize) {
        self.counting().map_or((0, 0), |c| (c.threads, c.left_out))
    }

    /// How the source that counts on the VMM's threads counts, once read.
    fn counting(&self) -> Option<&Counting> {
        self.learned.iter().find_map(|l| l.counting.as_ref())
    }

    /// Descriptors held for this VM's sources.
    pub fn fds(&self) -> usize {
        self.learned.iter().map(|l| l.fds).sum()
    }

    /// How this VM's tracepoints are counted (in the kernel, or by perf counters, and why).
    pub fn counting_method(&self) -> String {
        self.counting().map(|c| c.method.to_string()).unwrap_or_default()
    }

    /// What is known about `kvm_exit`.
    pub fn kvm_exit(&self) -> KvmExitState {
        self.counting().map_or(KvmExitState::Undecided, |c| c.kvm_exit)
    }

    /// The VM's run state, as the first source that knows it says it.
    pub fn vm_state(&self) -> Option<VmState> {
        self.learned.iter().find_map(|l| l.vm_state)
    }

    /// The source that holds the VMM's monitor session (QMP), when the VM has one, and what it
    /// learned.
    fn monitor(&self) -> Option<(&dyn VmSource, &Learned)> {
        self.learned().find(|(_, l)| l.peer.as_ref().is_some_and(|p| p.kind == PeerKind::Monitor))
    }

    /// Why KVM's statistics through QMP are unavailable, when a socket was given and failed.
    pub fn qmp_error(&self) -> Option<&str> {
        // A refused socket is said by its own line ([`Self::source_refusals`]).
        self.monitor().filter(|(_, l)| l.refused.is_none()).and_then(|(_, l)| l.error.as_deref())
    }

    /// Whether any of its sources puts questions to a peer ([`VmSource::asks`]): one that does
    /// not is not asked anything.
    pub(crate) fn asks(&self) -> bool {
        self.asks
    }

    /// Puts this refresh's questions to the peers of the VM's sources (see [`VmSource::ask`]).
    pub fn ask(&mut self, sockets: &UnixSockets) {
        if !self.asks {
            return;
        }
        let mut given = Gives::NOTHING;
        for source in self.sources.sources_mut() {
            source.ask(sockets, &given);
            given = given.union(&source.gives());
        }
    }

    /// The Unix sockets the VM's sources' next questions need the kernel's tables of.
    pub(crate) fn sockets_in_use(&self, now: std::time::Instant) -> impl Iterator<Item = &std::path::Path> {
        let sources = if self.asks { self.sources.sources() } else { &[] };
        sources.iter().filter_map(move |s| s.socket_in_use(now))
    }

    /// Each source with a peer, and whether that peer answers now.
    pub fn peers(&self) -> Vec<(&'static str, PeerState)> {
        self.learned().filter_map(|(s, l)| Some((s.name(), l.peer.clone()?.state))).collect()
    }

    /// True while the VMM's monitor session (QMP) answers.
    pub fn monitor_up(&self) -> bool {
        self.monitor().and_then(|(_, l)| l.peer.as_ref()).is_some_and(|p| p.state == PeerState::Up)
    }

    /// The watch on the VMM's exit, when it has one: polled with every VM's at once each tick.
    pub(crate) fn exit_watch(&self) -> Option<&ExitWatch> {
        self.exit.as_ref()
    }

    /// True when KVM's statistics come through QMP.
    pub fn has_qmp_stats(&self) -> bool {
        self.monitor().is_some_and(|(s, _)| !s.gives().vp.is_empty())
    }

    /// Asks the processor for what a refresh reads first of its state behind its own struct:
    /// its partition, its sources' list and its vCPUs: a hint, asked once the struct itself is
    /// at hand.
    pub(crate) fn prefetch_parts(&self) {
        prefetch_lines_of(Arc::as_ptr(&self.partition));
        let sources = self.sources.sources();
        prefetch_bytes(sources.as_ptr().cast(), std::mem::size_of_val(sources));
        prefetch_bytes(self.vcpus.as_ptr().cast(), std::mem::size_of_val(self.vcpus.as_slice()));
    }

    /// Asks the processor for the lines of its pages a refresh writes first: a hint.
    pub(crate) fn prefetch_pages(&self) {
        self.partition.vp_pages().for_each(|(_, page)| page.prefetch());
        self.partition.page().prefetch();
    }

    /// Finds vCPU threads, reads every source and writes the pages, the VMM's threads taken from
    /// `tasks` (this tick's walk of the host's tasks) where they are had, else from `/proc`.
    /// Returns why the VM left once its process is gone or no longer the one attached (nothing
    /// is written then), `None` while it is observed.
    ///
    /// # Errors
    /// When the process's status cannot be read for another reason than its exit (this process
    /// is out of descriptors or memory): the VM is not refreshed, and stays observed.
    pub(crate) fn refresh(
        &mut self,
        procfs: &Procfs,
        tasks: Option<VmmTasks<'_>>,
        count_fds: bool,
    ) -> io::Result<Option<Departure>> {
        let gone = match (&self.exit, tasks) {
            // Walked: its main thread says whether it exits (in `departure`); an exit the watch
            // saw already stays.
            (Some(watch), Some(_)) => watch.exited(),
            (Some(watch), None) => watch.has_exited(),
            (None, _) => !procfs.is_alive(self.pid)?,
        };
        if gone {
            return Ok(Some(Departure::Exited));
        }
        // Its pages are written last, after its sources are read: asked for meanwhile (and
        // already while the VM before it was refreshed).
        self.prefetch_pages();
        let threads = match self.departure(procfs, tasks)? {
            Ok(threads) => threads,
            Err(why) => return Ok(Some(why)),
        };
        if self.vm_changed(procfs, tasks.and_then(|t| t.leader().held), count_fds)? {
            return Ok(Some(Departure::VmChanged));
        }
        let reread = self.reread_platform(procfs);
        if self.thread_check.due(threads) {
            self.check_threads(procfs, tasks);
        }
        self.find_threads(procfs, tasks);
        let view = VmView { procfs, pid: self.pid, vcpus: &self.vcpus, tasks };
        self.learned.clear();
        self.learned.extend(self.sources.sources_mut().map(|s| s.read(&view)));
        // A peer's word on the platform (libvirt's Nova metadata) before the process's own.
        if let Some(read) = &mut self.platform {
            read.show(self.learned.iter().find_map(|l| l.platform.as_ref()), reread);
        }
        self.sources.decide();
        // Every VP's counts were read above: one time dates them all.
        let now = hvstats::page::publication_time();
        for index in 0..self.vcpus.len() as u32 {
            if self.vcpus[index as usize].tid.is_none() {
                continue;
            }
            let Some(page) = self.partition.vp_page(index) else { continue };
            let _merge = page.begin_publication_at(now);
            self.sources.write(Object::Vp(index), page, |_| true);
        }
        self.sources.write(Object::Partition, self.partition.page(), |_| true);
        self.publish_facts();
        Ok(None)
    }

    /// Why the VMM is no longer the process attached (it exited, its pid names another process,
    /// it `exec()`ed), else its number of threads (`None` where that cannot be told): from its
    /// main thread in `tasks` (told against what the walk gave at attach), else from its `/proc`
    /// files.
    ///
    /// # Errors
    /// As [`refresh`](Self::refresh).
    fn departure(
        &self,
        procfs: &Procfs,
        tasks: Option<VmmTasks<'_>>,
    ) -> io::Result<Result<Option<u64>, Departure>> {
        if let (Some(tasks), Some(exec_id)) = (tasks, self.exec_id) {
            let leader = tasks.leader();
            return Ok(match () {
                () if leader.start_ticks() != self.identity.start_time => Err(Departure::PidReused),
                // An exiting process is leaving, whether or not it exec()ed on its way.
                () if leader.exiting => Err(Departure::Exited),
                () if leader.exec_id != exec_id => Err(Departure::Exec),
                () => Ok(Some(tasks.threads().len() as u64)),
            });
        }
        let (now, threads) = match procfs.identity_and_threads(self.pid) {
            Ok(now) => now,
            Err(e) if is_gone(&e) => return Ok(Err(Departure::Exited)),
            Err(e) => return Err(e),
        };
        if now.start_time != self.identity.start_time {
            return Ok(Err(Departure::PidReused));
        }
        if now.exec != self.identity.exec {
            // A process whose memory is gone is exiting (its program's marks read 0 then, and
            // its executable no longer shows), not running another program.
            return Ok(Err(match now.is_exiting() {
                true => Departure::Exited,
                false => Departure::Exec,
            }));
        }
        Ok(Ok(threads))
    }

    /// True when the VM its process runs is no longer the VM object attached (see
    /// [`VmWatch::check`]); a process whose descriptors cannot be compared is no longer watched.
    ///
    /// # Errors
    /// When this process is out of descriptors or memory: nothing is known then.
    fn vm_changed(&mut self, procfs: &Procfs, walked: Option<HeldFile>, count_fds: bool) -> io::Result<bool> {
        let Some(watch) = &mut self.watch else { return Ok(false) };
        match watch.check(procfs, self.pid, walked, count_fds) {
            Ok(change) => Ok(change.is_some()),
            Err(e) if is_shortage(&e) => Err(e),
            Err(_) => {
                self.watch = None;
                Ok(false)
            }
        }
    }

    /// Forgets every vCPU thread that is no longer the task of the VMM it was when accepted (it
    /// exited, or its id now names another thread): it is found again, or the VP stays unknown.
    fn check_threads(&mut self, procfs: &Procfs, tasks: Option<VmmTasks<'_>>) {
        for vcpu in &mut self.vcpus {
            let Some(tid) = vcpu.tid else { continue };
            let start = match tasks {
                // The walk holds every thread of the process: one missing from it is gone.
                Some(tasks) => {
                    tasks.thread(tid).map(|t| t.start_ticks()).ok_or_else(|| io::ErrorKind::NotFound.into())
                }
                None => procfs.task_start_time(self.pid, tid),
            };
            match start {
                Ok(start) if self.thread_starts.get(&tid) == Some(&start) => {}
                // Out of descriptors: nothing is known of the thread, keep it.
                Err(e) if is_shortage(&e) => {}
                _ => {
                    vcpu.tid = None;
                    vcpu.qom_path = None;
                    self.thread_starts.remove(&tid);
                }
            }
        }
    }

    /// True when `tid` may run VP `index`: a task of the VMM now, running no other VP. A refusal
    /// is recorded once per thread id.
    fn accept(
        &mut self,
        procfs: &Procfs,
        tasks: Option<VmmTasks<'_>>,
        index: u32,
        tid: i32,
        by: &'static str,
    ) -> bool {
        let why = if let Some(other) = self.vcpus.iter().position(|v| v.tid == Some(tid)) {
            format!("it already runs VP {other}")
        } else {
            // A thread started since the walk is not in it: `/proc` tells.
            let walked = tasks.and_then(|t| t.thread(tid)).map(|t| Ok(t.start_ticks()));
            match walked.unwrap_or_else(|| procfs.task_start_time(self.pid, tid)) {
                Ok(start) => {
                    self.thread_starts.insert(tid, start);
                    return true;
                }
                Err(e) if is_gone(&e) => format!("it is not a thread of process {}", self.pid),
                Err(e) => format!("its stat cannot be read: {e}"),
            }
        };
        if self.refused.insert(tid) {
            self.refusals.push(ThreadRefusal { vp: index, tid, by, why });
        }
        false
    }

    /// Which thread runs each vCPU: a source that knows (QMP; a thread is said to be named by the
    /// source that named it), then debugfs, then thread names.
    fn find_threads(&mut self, procfs: &Procfs, tasks: Option<VmmTasks<'_>>) {
        if self.vcpus.iter().all(|v| v.tid.is_some()) {
            return;
        }
        let mut by_index = BTreeMap::new();
        for source in self.sources.sources_mut() {
            let by = source.name();
            for (index, thread) in source.named().threads {
                by_index.entry(index).or_insert((thread, by));
            }
        }
        let by_id = procfs.debugfs_vcpu_threads(self.pid, self.vm_fd);
        let by_name = procfs.named_vcpu_threads(self.pid).unwrap_or_default();
        for index in 0..self.vcpus.len() {
            if self.vcpus[index].tid.is_some() {
                continue;
            }
            let vp = index as u32;
            let vcpu_id = self.vcpus[index].vcpu_id;
            let named = [
                by_index.remove(&vp).map(|(t, by)| (t.tid, t.qom_path, by)),
                by_id.get(&vcpu_id).map(|&tid| (tid, None, "debugfs")),
                by_name.get(&vp).map(|&tid| (tid, None, "thread name")),
            ];
            for (tid, qom_path, by) in named.into_iter().flatten() {
                if self.accept(procfs, tasks, vp, tid, by) {
                    self.vcpus[index].tid = Some(tid);
                    self.vcpus[index].qom_path = qom_path;
                    break;
                }
            }
        }
    }

    /// The partition and VP counters no source gives this VM now.
    pub fn unavailable(&self) -> Vec<CounterId> {
        ids_of(&self.sources.missing(&relevant()))
    }

    /// Each source's state now, in the sources' order: what the partition page's facts (the
    /// source table, the time kept counts count from, the counters declared unavailable) are
    /// made of.
    fn source_states(&self) -> Vec<SourceState> {
        self.learned()
            .map(|(s, l)| {
                let gives = s.gives();
                // A source with a peer is up while its peer answers (the QMP source always says
                // the VM's state); another, while it gives counters.
                let up = match &l.peer {
                    Some(peer) => peer.state == PeerState::Up,
                    None => !(gives.partition.is_empty() && gives.vp.is_empty()),
                };
                SourceState { up, gives, origin: s.origin(), kept_since: s.kept_since() }
            })
            .collect()
    }

    /// The VM's sources, whether each gives counters now and from when it counts, and which
    /// writes each counter: what its partition page tells readers.
    fn source_table(&self, states: &[SourceState]) -> SourceTable {
        let mut table = SourceTable::default();
        let numbers: Vec<Option<u8>> = self
            .sources
            .sources()
            .iter()
            .zip(states)
            .map(|(s, state)| table.push(SourceEntry::new(s.name(), state.up, state.origin)))
            .collect();
        // Each source's own counters, as the composition decided: one pass per source over what
        // it writes, not a search of the sources per counter.
        let relevant = relevant();
        for (i, number) in numbers.iter().enumerate() {
            let Some(number) = *number else { continue };
            for object in [Object::Partition, Object::Vp(0)] {
                let writes = self.sources.writes(i).of(object).intersection(relevant.of(object));
                writes.ids().for_each(|id| table.set_writer(id, number));
            }
        }
        table
    }

    /// Publishes what the partition page says of the VM's sources (the source table, the time
    /// kept counts count from, the counters no source gives), when the sources' state changed
    /// since it was last published.
    fn publish_facts(&mut self) {
        let states = self.source_states();
        if self.published.as_ref() == Some(&states) {
            return;
        }
        let page = self.partition.page();
        for (row, value) in self.source_table(&states).rows() {
            page.set(row, value);
        }
        let kept = kept_since(states.iter().map(|s| (s.origin, s.kept_since)));
        self.partition.set_kept_since(kept);
        let missing = self.sources.missing(&relevant());
        if self.declared != Some(missing) {
            publication::declare_unavailable(&self.partition, &ids_of(&missing));
            self.declared = Some(missing);
        }
        self.published = Some(states);
    }
}

/// The partition and VP counters of `gives`, partition first.
fn ids_of(gives: &Gives) -> Vec<CounterId> {
    gives.partition.ids().chain(gives.vp.ids()).collect()
}

/// One source's state, as the partition page's facts say it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SourceState {
    /// Whether it is up (its peer answers, or it gives counters).
    up: bool,
    /// The counters it gives.
    gives: Gives,
    /// From when its counts count.
    origin: Origin,
    /// For a source whose counts are kept across observers, from when.
    kept_since: Option<SystemTime>,
}

/// Refreshes between two checks of the vCPU threads' identities while the VMM's number of
/// threads stays the same.
const THREAD_RECHECK: u32 = 10;

/// When the vCPU threads are checked to be the threads accepted (each a `stat` read): at every
/// refresh where the VMM's number of threads changed (a thread that exits changes it, unless
/// another starts in the same interval), and at least every [`THREAD_RECHECK`] refreshes. A
/// thread that exited meanwhile keeps its last reading until then; its id names no other thread
/// sooner than the kernel's ids wrap around.
#[derive(Debug, Default)]
struct ThreadCheck {
    /// The VMM's number of threads at the last check.
    threads: Option<u64>,
    /// Refreshes since the last check.
    since: u32,
}

impl ThreadCheck {
    /// True when the threads are to be checked now, the VMM having `threads` threads (`None`
    /// where that cannot be told: then at every refresh).
    fn due(&mut self, threads: Option<u64>) -> bool {
        self.since += 1;
        let due = threads.is_none() || threads != self.threads || self.since >= THREAD_RECHECK;
        if due {
            *self = Self { threads, since: 0 };
        }
        due
    }
}

/// From when the VM's counts kept across observers count: the earliest time its sources whose
/// origin is [`Origin::Kept`] give (`None` when none does).
fn kept_since(sources: impl Iterator<Item = (Origin, Option<SystemTime>)>) -> Option<SystemTime> {
    sources.filter(|(origin, _)| *origin == Origin::Kept).filter_map(|(_, at)| at).min()
}

/// The descriptor of the one VM object `pid` holds among `fds` (a `dup` of it is the same VM).
///
/// # Errors
/// When it holds none, or several VM objects: which one its vCPU threads run cannot be told.
fn the_vm(pid: i32, fds: &KvmFds) -> Result<u32, ObserveError> {
    // Where descriptors cannot be compared (no kcmp), each is taken for a VM of its own.
    let vms = distinct_vms(pid, &fds.vms).unwrap_or_else(|_| fds.vms.clone());
    match vms[..] {
        [] => Err(ObserveError::NoVm(pid)),
        [vm] => Ok(vm),
        _ => Err(ObserveError::SeveralVms { pid, vms: vms.len() }),
    }
}

/// Publishes the partition of the VM of `pid`, named `name`, with `vcpus` VPs.
fn publish(
    hv: &Hypervisor,
    pid: i32,
    vmm: Vmm,
    name: &str,
    vcpus: usize,
    uuid: Option<hvstats::vmm::VmUuid>,
) -> Result<Arc<PartitionStats>, ObserveError> {
    // Nothing is read yet: every counter a source could give is declared unavailable until the
    // first refresh declares what the sources give, so no reader sees a 0 that was never measured.
    let nothing_yet = ids_of(&relevant());
    let indices: Vec<u32> = (0..vcpus as u32).collect();
    let partition = hv
        .create_partition_declared(None, &indices, name, &nothing_yet)
        .map_err(|source| ObserveError::Publish { pid, source })?;
    partition.set_vmm(hvstats::vmm::VmmProcess { vmm, pid: pid as u32 });
    if let Some(uuid) = uuid {
        partition.set_uuid(uuid);
    }
    Ok(partition)
}

/// What the VMM's process says of its VM beside its counters: when it started (`start_time`, read
/// from the host's own procfs only) and which Hyper-V enlightenments its command line gives.
fn describe(partition: &PartitionStats, procfs: &Procfs, pid: i32, start_time: u64) {
    let host = procfs.root() == std::path::Path::new("/proc");
    if let Some(at) = host.then(|| hvstats_host::task_stat::started_at(start_time)).flatten() {
        partition.set_vm_started(at);
    }
    partition.set_hyperv_enlightenments(procfs.hyperv_enlightenments(pid).unwrap_or(0));
}

impl Drop for ObservedVm {
    fn drop(&mut self) {
        self.hv.remove_partition(self.partition.id());
    }
}

/// Asks the processor for every line of the `T` at `at`: a hint.
pub(crate) fn prefetch_lines_of<T>(at: *const T) {
    prefetch_bytes(at.cast(), std::mem::size_of::<T>());
}

/// Asks the processor for the lines of the `len` bytes at `at`: a hint.
fn prefetch_bytes(at: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for offset in (0..len).step_by(64) {
        // SAFETY: a prefetch only hints at memory to come: it reads nothing into the program and
        // does not fault, whatever the address.
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                at.wrapping_add(offset).cast::<i8>(),
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (at, len);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_vcpu_threads_are_checked_when_the_vmms_threads_change_and_at_least_every_few_refreshes() {
        let mut check = ThreadCheck::default();
        assert!(check.due(Some(5)), "the first refresh checks");
        let quiet: Vec<bool> = (1..THREAD_RECHECK).map(|_| check.due(Some(5))).collect();
        assert!(quiet.iter().all(|due| !due), "{quiet:?}");
        assert!(check.due(Some(5)), "checked again after THREAD_RECHECK refreshes");
        assert!(!check.due(Some(5)));
        assert!(check.due(Some(4)), "a thread exited");
        assert!(check.due(Some(6)), "threads started");
        assert!(!check.due(Some(6)));
        // Where the number cannot be told, at every refresh.
        assert!(check.due(None) && check.due(None));
    }

    #[test]
    fn the_counts_kept_count_from_the_earliest_kept_source() {
        let at = |s: u64| Some(SystemTime::UNIX_EPOCH + Duration::from_secs(s));
        let sources = [
            (Origin::Attach, at(50)),
            (Origin::Kept, at(300)),
            (Origin::VcpuCreation, at(100)),
            (Origin::Kept, None),
            (Origin::Kept, at(200)),
        ];
        assert_eq!(kept_since(sources.into_iter()), at(200), "only kept sources, the earliest");
        assert_eq!(kept_since(sources[..4].iter().copied()), at(300));
        assert_eq!(kept_since(sources[..1].iter().copied()), None, "a time of a source not kept is not one");
        assert_eq!(kept_since([(Origin::Kept, None)].into_iter()), None, "kept, not known yet");
    }

    #[test]
    fn a_processs_command_line_is_read_once_but_where_its_owner_changed_or_its_platform_keeps_a_file() {
        use hvstats_platform::{Identity, Platform};
        let read = |owner, platform: Option<Platform>| PlatformRead {
            at: std::time::Instant::now(),
            owner,
            read_whole: true,
            of_process: platform.map(|p| Identity::new(p, Vec::new(), true)),
            shown: None,
            version: 0,
        };
        for platform in [None, Some(Platform::KubeVirt)] {
            assert!(!read(Some(0), platform).reads_process_again(Some(0)), "{platform:?}");
            assert!(read(Some(0), platform).reads_process_again(Some(64055)), "{platform:?}: root dropped");
            assert!(read(None, platform).reads_process_again(Some(0)), "{platform:?}: owner told now");
            let unread = PlatformRead { read_whole: false, ..read(Some(0), platform) };
            assert!(unread.reads_process_again(Some(0)), "{platform:?}: not read last time");
        }
        assert!(read(Some(0), Some(Platform::Proxmox)).reads_process_again(Some(0)), "its VM's file");
    }

    #[test]
    fn what_is_shown_takes_a_new_version_only_when_it_changes() {
        use hvstats_platform::{Identity, Label, Platform, Source};
        let nova = |flavor: &str| {
            let label =
                Label { name: "flavor_name", value: flavor.to_owned(), source: Source::LibvirtMetadata };
            Identity::new(Platform::OpenStack, vec![label], true)
        };
        let process = Identity::new(Platform::KubeVirt, Vec::new(), true);
        let mut read = PlatformRead {
            at: std::time::Instant::now(),
            owner: Some(0),
            read_whole: true,
            of_process: Some(process.clone()),
            shown: None,
            version: 0,
        };
        let mut versions = Vec::new();
        let mut step = |read: &mut PlatformRead, peer: Option<&Identity>, reread: bool| {
            read.show(peer, reread);
            versions.push(read.version);
            read.shown.clone()
        };
        // Read for the first time: the process's word, a version of its own.
        assert_eq!(step(&mut read, None, true), Some(process.clone()));
        // A peer's word (a small flavor), then the same word again: one new version.
        assert_eq!(step(&mut read, Some(&nova("m1.small")), false), Some(nova("m1.small")));
        assert_eq!(step(&mut read, Some(&nova("m1.small")), false), Some(nova("m1.small")));
        // A refresh its peer missed keeps the peer's word.
        assert_eq!(step(&mut read, None, false), Some(nova("m1.small")));
        // Read again with the peer's word as it was: no change.
        assert_eq!(step(&mut read, Some(&nova("m1.small")), true), Some(nova("m1.small")));
        // A resize: a new version.
        assert_eq!(step(&mut read, Some(&nova("m1.large")), false), Some(nova("m1.large")));
        // Read again without the peer: the process's word once more.
        assert_eq!(step(&mut read, None, true), Some(process));
        let new: Vec<bool> = versions.windows(2).map(|w| w[0] != w[1]).collect();
        assert_eq!(new, [true, false, false, false, true, true], "{versions:?}");
        assert!(versions[0] != 0 && versions.windows(2).all(|w| w[0] <= w[1]), "{versions:?}");
    }
}
