//! The observer: which processes to watch, attaching to their VMs as they appear and detaching
//! as they go, one refresh of every observed VM per interval; and what it says of itself.
//!
//! Each tick puts the questions of every VM's sources out first ([`ObservedVm::ask`]) and then
//! refreshes the VMs, so peers that answer late (a stopped QEMU) cost one deadline per tick,
//! not one per VM. A source whose peer stops answering or comes back is said once each way
//! ([`ObserverEvent::SourceDown`], [`ObserverEvent::SourceUp`]). After every tick the observer
//! writes its health on its instance's hypervisor page (the catalog's observer rows): that it
//! is up, when it last finished a refresh, the VMs it observes and those it found and does not,
//! and the QMP sessions that answer.
//!
//! A process is who it was when it was first seen ([`ProcessIdentity`](super::discovery::ProcessIdentity)): what the observer knows
//! of a pid (observed, failed, waited for) is forgotten once the pid names another process or
//! the process runs another program, so a pid reused or a VMM that `exec()`s between two ticks
//! is the old VM leaving and a new one attaching. With `--all`, VMs found in the same tick attach
//! oldest process first, so a VM's partition id follows its VMM's age. Every process holding a
//! KVM VM is a candidate except this one; a process that publishes its own partitions (`hvstats
//! run`) claims itself, and is left to its own instance like a VM another observer holds.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use hvstats::Hypervisor;
use hvstats_abi::catalog::hypervisor;

use super::attach::{ObserveError, ObserveOptions};
use super::capabilities::Capabilities;
use super::claim::{Claim, ClaimError};
use super::discovery::{KvmFds, Procfs, is_refusal, is_shortage, read_error};
use super::filter::VmIdentity;
use super::happenings::ObserverEvent;
use super::kvm_scan::KvmScan;
use super::record::{Record, Told};
use super::refusal::{self, Refusal, RefusedCounts};
use super::task_walk::TaskWalk;
use super::vm::{Departure, ObservedVm};
use super::vm_identity;
use hvstats_host::error_chain::error_chain;
use hvstats_host::exit_watch;
use hvstats_host::os::{check, file_limits};
use hvstats_vmm::cancel::Cancel;
use hvstats_vmm::qmp::Qmp;
use hvstats_vmm::unix_sockets::UnixSockets;

/// Which processes are observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Targets {
    /// These processes (each must hold a KVM VM).
    Pids(Vec<i32>),
    /// Every process on the host holding a KVM VM, including ones that appear later.
    All,
    /// The QEMU serving this QMP socket, whichever process that is now: a QEMU restarted on
    /// the same socket is observed again.
    QmpSocket(PathBuf),
}

/// Observes VMs and publishes each as a partition of one instance.
#[derive(Debug)]
pub struct Observer {
    hv: Arc<Hypervisor>,
    procfs: Procfs,
    targets: Targets,
    options: ObserveOptions,
    /// What is known of each process the observer keeps something about, by pid.
    records: BTreeMap<i32, Record>,
    /// With a QMP socket as the target: when its server's pid is asked next.
    socket_retry: Instant,
    /// Every process holding a KVM VM, found anew each tick from what changed.
    scan: KvmScan,
    /// The events every VM is counted with, made at start when counts are kept beyond this
    /// observer: making them adopts the rows an earlier observer kept (and drops those of VMs
    /// gone meanwhile) before any VM is attached, and holding them keeps the adopted rows until
    /// their VMs are attached again or end.
    kept: Option<crate::thread_counters::EventList>,
    /// What is to be said of the kept counts at the next tick.
    kept_notes: Vec<String>,
    /// The capabilities this process holds, read at start.
    capabilities: Capabilities,
    /// The missing capabilities are said (at the first tick).
    capabilities_said: bool,
    /// The VMs whose platform identities were last written beside the instance, and which
    /// identity each had ([`Told::platforms`]).
    platforms_written: Vec<(i32, u64)>,
    /// The walk of the host's tasks that gives every observed VMM's threads once a tick (`None`
    /// where the task iterator is not had: each VM reads `/proc`).
    walk: Option<TaskWalk>,
}

/// Descriptors kept out of the counters' reach (for `/proc`, the runtime directory, QMP sockets
/// and, in `serve`, HTTP connections), or a quarter of the limit when that is smaller.
pub const FD_RESERVE: usize = 256;

impl Observer {
    /// An observer publishing into `hv`.
    ///
    /// With a runtime directory to claim VMs in (`options.claims`), the in-kernel counts are kept
    /// in bpffs beyond this observer, for the next observer of that runtime directory.
    pub fn new(hv: Arc<Hypervisor>, procfs: Procfs, targets: Targets, options: ObserveOptions) -> Self {
        let mut options = options;
        let (kept, kept_notes) = match &options.claims {
            Some(runtime) => keep_counts(runtime),
            None => (None, Vec::new()),
        };
        options.kept_in = kept.as_ref().map(|(dir, _)| dir.clone());
        // A socket the operator names is taken as given, as `--qmp` with `--pid` is.
        if let Targets::QmpSocket(path) = &targets {
            options.qmp = Some(path.clone());
        }
        let kept = kept.map(|(_, events)| events);
        Self {
            hv,
            targets,
            options,
            records: BTreeMap::new(),
            socket_retry: Instant::now(),
            scan: KvmScan::new(),
            kept,
            kept_notes,
            capabilities: Capabilities::of_this_process(),
            capabilities_said: false,
            platforms_written: Vec::new(),
            walk: TaskWalk::open(&procfs),
            procfs,
        }
    }

    /// The VMs observed now, by pid.
    pub fn vms(&self) -> impl Iterator<Item = &ObservedVm> {
        self.records.values().filter_map(Record::vm)
    }

    /// True when observing `--pid` processes and every one has exited or failed.
    pub fn finished(&self) -> bool {
        match &self.targets {
            Targets::Pids(pids) => pids.iter().all(|p| self.records.get(p).is_some_and(Record::is_done)),
            Targets::All | Targets::QmpSocket(_) => false,
        }
    }

    /// Says what keeping the in-kernel counts found since the last tick, after dropping the
    /// adopted rows of VMs that ended before being attached again.
    fn say_kept(&mut self, events: &mut Vec<ObserverEvent>) {
        if self.kept.is_some() {
            let gone = hvstats_host::counting::drop_gone_kept();
            if gone > 0 {
                self.kept_notes.push(format!("dropped the kept counts of {gone} thread(s) that ended"));
            }
        }
        self.kept_notes.extend(hvstats_host::counting::kept_notes());
        events.extend(self.kept_notes.drain(..).map(ObserverEvent::Kept));
        events.extend(hvstats_host::counting::full_notes().into_iter().map(ObserverEvent::PastEngineRows));
    }

    /// Leaves the in-kernel counts kept for this observer's VMs counting for the next observer
    /// of its runtime directory, rather than releasing them as its VMs are dropped: called when
    /// the observer ends (a signal, serve stopping) while its VMs go on.
    pub fn leave_kept_counts(&self) {
        if self.kept.is_some() {
            hvstats_host::counting::leave_kept_counts();
        }
    }

    /// VMs found and not observed now, by reason: deferred (another observer holds them,
    /// descriptors ran out), failed while their process lives, unreadable, or attached without
    /// their hidden QMP socket.
    pub fn refused(&self) -> RefusedCounts {
        RefusedCounts::of(self.records.values().filter_map(Record::refusal))
    }

    /// Observed VMs whose QMP session answers now.
    pub fn qmp_sessions_up(&self) -> usize {
        self.vms().filter(|vm| vm.monitor_up()).count()
    }

    /// Perf descriptors held for every VM.
    pub fn fds(&self) -> usize {
        self.vms().map(ObservedVm::fds).sum()
    }

    /// Attaches to new VMs, refreshes every observed one, detaches from gone ones: each record
    /// takes its turn.
    pub fn tick(&mut self) -> Vec<ObserverEvent> {
        let mut events = Vec::new();
        if !std::mem::replace(&mut self.capabilities_said, true) {
            events.extend(self.capabilities.missing().map(ObserverEvent::CapabilityMissing));
        }
        // Refresh first: a VM attached now was refreshed by its attach. Those with a peer to ask
        // are found in the same pass.
        let (mut attached, mut asking) = (BTreeSet::new(), Vec::new());
        for (&pid, record) in self.records.iter().filter(|(_, r)| r.is_attached()) {
            attached.insert(pid);
            if record.asks() {
                asking.push(pid);
            }
        }
        self.ask_peers(&asking);
        // One walk of the host's tasks for every VM refreshed.
        let mut walk = self.walk.take();
        if let Some(walk) = walk.as_mut().filter(|_| !attached.is_empty()) {
            walk.walk(&attached);
        }
        self.before_refreshes(walk.as_ref());
        // Every VM's KVM statistics copied in one pass; where it fails, each is read by itself.
        let _ = hvstats_host::bpf::stats_copy::run_shared();
        let now = Instant::now();
        let mut told = Told::default();
        self.refresh_all(&attached, walk.as_ref(), now, &mut told, &mut events);
        self.walk = walk;
        for (pid, found) in self.candidates(&mut events) {
            // Stopping: no VM is attached only to be detached (each attach loads and attaches
            // programs, a wait a signal should not add up); the rest are found again next time.
            if self.options.cancel.is_cancelled() {
                break;
            }
            self.consider(pid, found, &mut events);
        }
        self.close_records(now, &mut told, &mut events);
        self.say_kept(&mut events);
        self.write_health(&told);
        self.write_platforms(&told.platforms);
        events
    }

    /// Refreshes every VM of `attached` (with `walk`, this tick's walk of their tasks), and tells
    /// what each made known right after its refresh, while it is at hand.
    fn refresh_all(
        &mut self,
        attached: &BTreeSet<i32>,
        walk: Option<&TaskWalk>,
        now: Instant,
        told: &mut Told,
        events: &mut Vec<ObserverEvent>,
    ) {
        // Which VMMs may have made a VM beside the one attached since their last refresh.
        let made = self.scan.made_vms_since_listing().cloned();
        let pids: Vec<i32> = attached.iter().copied().collect();
        for (i, &pid) in pids.iter().enumerate() {
            // What the next VMs' refreshes read first is asked for now, a VM ahead each step, as
            // each step reads what the one before it brought: the state of the third VM from
            // here, the parts of the second, the pages of the next. They come while this one is
            // refreshed.
            let ahead = |n: usize| pids.get(i + n).and_then(|p| self.records.get(p));
            if let Some(third) = ahead(3) {
                third.prefetch_vm();
            }
            if let Some(second) = ahead(2).and_then(Record::vm) {
                second.prefetch_parts();
            }
            if let Some(next) = ahead(1).and_then(Record::vm) {
                next.prefetch_pages();
            }
            let count_fds = made.as_ref().is_none_or(|made| made.contains(&pid));
            self.refresh(pid, walk, count_fds, events);
            if let Some(record) = self.records.get_mut(&pid) {
                record.tell_refreshed(pid, now, told);
            }
        }
    }

    /// Ends every record's tick in one pass ([`Record::close_tick`]), after the scan's new
    /// refusals are said (a record the scan refuses keeps what was said of it, whichever comes
    /// first); forgets the records left blank; tells the VMs' peers' and progress news.
    fn close_records(&mut self, now: Instant, told: &mut Told, events: &mut Vec<ObserverEvent>) {
        let refused_now: BTreeSet<i32> = self.scan.refused().keys().copied().collect();
        self.say_refusals(&refused_now, events);
        let mut blank = Vec::new();
        for (&pid, record) in &mut self.records {
            record.close_tick(pid, refused_now.contains(&pid), now, told);
            if record.is_blank() {
                blank.push(pid);
            }
        }
        for pid in blank {
            self.records.remove(&pid);
        }
        events.append(&mut told.peers);
        events.append(&mut told.progress);
    }

    /// Writes the observed VMs' trusted platform identities beside the instance
    /// ([`hvstats::platform_file`]) when they changed; tried again next tick when that fails.
    fn write_platforms(&mut self, platforms: &[(i32, u64)]) {
        // Made again only where a VM with a platform came, went or changed its identity since
        // the file was written: not from a thousand VMs at every tick.
        if platforms == self.platforms_written.as_slice() {
            return;
        }
        // Those with a platform, as each VM's telling at this tick found: a VM without one (most,
        // off a platform) is not gone to.
        let vms = self.records.values().filter(|r| r.has_platform()).filter_map(Record::vm);
        let vms = vms.filter_map(|vm| vm.platform().map(|p| (vm.partition().id(), p)));
        let text = hvstats_platform::shown::encode(vms);
        let (Some(path), Some(name)) = (self.hv.published_path(), self.hv.published_name()) else { return };
        let Some(runtime) = path.parent().and_then(std::path::Path::parent) else { return };
        if hvstats::platform_file::write(runtime, &name, &text).is_ok() {
            self.platforms_written = platforms.to_vec();
        }
    }

    /// Puts the questions of every observed VM that has a peer to ask (`asking`, by pid) out
    /// before any VM is read: its peers answer meanwhile.
    fn ask_peers(&mut self, asking: &[i32]) {
        if asking.is_empty() {
            return;
        }
        let now = Instant::now();
        let vms = asking.iter().filter_map(|pid| self.records.get(pid)?.vm());
        let paths: Vec<PathBuf> = vms.flat_map(|vm| vm.sockets_in_use(now).map(Into::into)).collect();
        let sockets = match paths.is_empty() {
            true => UnixSockets::default(),
            false => UnixSockets::read_of(paths.iter().map(PathBuf::as_path)).unwrap_or_default(),
        };
        for pid in asking {
            if let Some(vm) = self.records.get_mut(pid).and_then(Record::vm_mut) {
                vm.ask(&sockets);
            }
        }
    }

    /// What every VM's refresh would ask the kernel one VM at a time, asked once for all: which
    /// VMMs exited (one poll of the pidfds), of those `walk` did not find (a walked VMM's refresh
    /// tells its exit from its main thread in the walk).
    fn before_refreshes(&self, walk: Option<&TaskWalk>) {
        // Told by their pids, without going to each VM walked.
        let unwalked = self
            .records
            .iter()
            .filter(|(pid, _)| walk.and_then(|w| w.of(**pid)).is_none())
            .filter_map(|(_, r)| r.vm());
        exit_watch::poll_all(unwalked.filter_map(ObservedVm::exit_watch));
    }

    /// Refreshes the VM of `pid`, detaching it once it left.
    fn refresh(
        &mut self,
        pid: i32,
        walk: Option<&TaskWalk>,
        count_fds: bool,
        events: &mut Vec<ObserverEvent>,
    ) {
        let Some(vm) = self.records.get_mut(&pid).and_then(Record::vm_mut) else { return };
        let refreshed = vm.refresh(&self.procfs, walk.and_then(|w| w.of(pid)), count_fds);
        for refusal in vm.take_refusals() {
            events.push(ObserverEvent::ThreadRefused { pid, name: vm.name().to_owned(), refusal });
        }
        match refreshed {
            Ok(None) => {}
            Ok(Some(why)) => self.detach(pid, why, events),
            // Not knowing whether it lives is not knowing it died: keep it, say why once.
            Err(e) => {
                let why = format!("cannot read process {pid}: {e}");
                let reason = if is_shortage(&e) { Refusal::Shortage } else { Refusal::Failed };
                self.defer(events, pid, reason, why);
            }
        }
    }

    /// The VM of `pid` left for `why`: its partition goes, and what comes next depends on who
    /// was observed.
    fn detach(&mut self, pid: i32, why: Departure, events: &mut Vec<ObserverEvent>) {
        let named = matches!(self.targets, Targets::Pids(_));
        let Some(vm) = self.records.get_mut(&pid).and_then(|r| r.detach(why, named)) else { return };
        // A process holding the same VM is a candidate now (the VM may live on in it).
        for record in self.records.values_mut() {
            record.release_twin_of(pid);
        }
        self.scan.recheck(pid);
        events.push(ObserverEvent::Detached { pid, name: vm.name().to_owned(), why });
    }

    /// Attaches to the VM `pid` holds, found with `found`, when it is ready and this observer
    /// may have it.
    fn consider(&mut self, pid: i32, found: io::Result<KvmFds>, events: &mut Vec<ObserverEvent>) {
        let Some(fds) = self.ready(pid, found, events) else { return };
        if let Some(with) = self.twin_of(pid, &fds) {
            self.records.entry(pid).or_default().twin(with);
            return events.push(ObserverEvent::SharesVm { pid, with });
        }
        let claim = match self.claim(pid) {
            Ok(claim) => claim,
            // With --all, a VM another observer publishes is read from its instance; it is
            // taken over should that observer stop.
            Err(e)
                if e.is_shortage()
                    || (matches!(e, ClaimError::Taken { .. }) && self.targets == Targets::All) =>
            {
                let reason = refusal::of_claim_error(&e);
                return self.defer(events, pid, reason, format!("process {pid}: {}", error_chain(&e)));
            }
            Err(e) => {
                let reason = refusal::of_claim_error(&e);
                return self.fail(events, pid, reason, format!("process {pid}: {}", error_chain(&e)));
            }
        };
        let room = descriptor_room();
        let qmp = self.qmp_for(pid);
        if !self.superseded_within_bound(pid, events) {
            return;
        }
        let superseded = self.records.get(&pid).map(Record::superseded).unwrap_or_default();
        let options = &self.options;
        match ObservedVm::attach(&self.hv, &self.procfs, pid, &fds, options, room, qmp.as_deref(), superseded)
        {
            Ok(mut vm) => {
                if let Some(claim) = claim {
                    vm.hold(claim);
                }
                self.attached(vm, qmp, events);
            }
            Err(e @ (ObserveError::Budget { .. } | ObserveError::SeveralVms { .. })) => {
                self.defer(events, pid, refusal::of_attach_error(&e), error_chain(&e));
            }
            Err(ObserveError::Proc { source, .. }) if is_shortage(&source) => {
                self.defer(events, pid, Refusal::Shortage, format!("cannot read process {pid}: {source}"));
            }
            Err(e) => self.fail(events, pid, refusal::of_attach_error(&e), error_chain(&e)),
        }
    }

    /// Keeps of the statistics descriptors of the VMs `pid` replaced those it still holds; false
    /// (the process failed, said) when they are more than [`vm_identity::MAX_SUPERSEDED`].
    fn superseded_within_bound(&mut self, pid: i32, events: &mut Vec<ObserverEvent>) -> bool {
        let Some(record) = self.records.get_mut(&pid) else { return true };
        let Err(kept) = record.prune_superseded(&self.procfs, pid) else { return true };
        let why = format!(
            "process {pid} replaced its VM again and again, keeping {kept} statistics descriptors of the \
             VMs it replaced open (at most {} are told apart)",
            vm_identity::MAX_SUPERSEDED
        );
        self.fail(events, pid, Refusal::SeveralVms, why);
        false
    }

    /// The process observed whose VM object `pid` holds too (by a descriptor it inherited or was
    /// passed), if any: that VM is attached once, to the process first attached (see
    /// [`Self::listed`]), and this one is no second VM.
    fn twin_of(&self, pid: i32, fds: &KvmFds) -> Option<i32> {
        self.vms()
            .find(|vm| fds.vms.iter().any(|&fd| vm.is_held_at(pid, fd) == Some(true)))
            .map(ObservedVm::pid)
    }

    /// The KVM descriptors of `pid` when its VM is ready to attach: it has vCPUs, and (when it
    /// is waited for) their count held still since the last tick.
    fn ready(
        &mut self,
        pid: i32,
        found: io::Result<KvmFds>,
        events: &mut Vec<ObserverEvent>,
    ) -> Option<KvmFds> {
        let record = self.records.entry(pid).or_default();
        let waits = self.targets == Targets::All || record.waits();
        match found {
            // A VM without vCPUs yet: wait for them (a partition's VPs are fixed at attach).
            Ok(fds) if fds.has_vm() && fds.vcpus.is_empty() => None,
            // Kept while it is not attached: a VM deferred now is not waited for again (and
            // said again) next tick.
            Ok(fds) if fds.has_vm() && waits => record.settle(fds.vcpus.len()).then_some(fds),
            Ok(fds) if fds.has_vm() => Some(fds),
            // A `--pid` process that `exec()`ed: its new program may make a VM later.
            Ok(_) if waits => None,
            Ok(_) => {
                self.fail(events, pid, Refusal::Failed, format!("process {pid} holds no KVM VM"));
                None
            }
            Err(e) if is_shortage(&e) => {
                self.defer(events, pid, Refusal::Shortage, format!("cannot read process {pid}: {e}"));
                None
            }
            Err(e) => {
                let why = read_error(&self.procfs, pid, &e);
                let reason = self.unreadable(pid, &e);
                self.fail(events, pid, reason, why);
                None
            }
        }
    }

    /// Says what a VM just attached is and what it refused, and keeps it observed.
    fn attached(&mut self, vm: ObservedVm, qmp: Option<PathBuf>, events: &mut Vec<ObserverEvent>) {
        let pid = vm.pid();
        let name = vm.name().to_owned();
        let (threads, left_out) = vm.threads_counted();
        events.push(ObserverEvent::Attached {
            pid,
            name: name.clone(),
            vmm: vm.vmm().name(),
            vcpus: vm.partition().vp_count(),
            partition: vm.partition().id(),
            fds: vm.fds(),
            threads,
            left_out,
            qmp: qmp.clone(),
            qmp_error: vm.qmp_error().map(str::to_owned),
        });
        for (source, why) in vm.source_refusals() {
            events.push(ObserverEvent::SourceRefused { pid, name: name.clone(), source, why });
        }
        let mut vm = vm;
        for refusal in vm.take_refusals() {
            events.push(ObserverEvent::ThreadRefused { pid, name: name.clone(), refusal });
        }
        // A socket hidden here is still reached through the VMM's root where that may be opened.
        let hidden = qmp.as_deref().filter(|p| self.procfs.hidden_from_here(pid, p) && !vm.monitor_up());
        if let Some(path) = hidden {
            let why = format!("{}: observed without QMP", path.display());
            events.push(ObserverEvent::Refused { pid, name, reason: Refusal::QmpSocketHidden, why });
        }
        events.extend(self.resemblances(&vm));
        self.records.entry(pid).or_default().attach(vm, hidden.is_some());
    }

    /// What a VM just attached shares with the VMs observed already: a name, one that looks
    /// alike, a UUID. The VM observed first keeps its name on every surface; the newcomer is the
    /// one readers must tell apart, and this says so, naming the first VM observed of each
    /// likeness (at most three lines however many VMs share it: a fleet of one name attaching
    /// would otherwise say, and hold, a line for every pair).
    fn resemblances(&self, vm: &ObservedVm) -> Vec<ObserverEvent> {
        let first = |like: &dyn Fn(&ObservedVm) -> bool| {
            self.vms().filter(|other| like(other)).min_by_key(|other| other.partition().id())
        };
        let named = first(&|other| vm.name() == other.name());
        let alike = first(&|other| {
            vm.name() != other.name() && hvstats::vm_name::looks_like(vm.name(), other.name())
        });
        let mut said: Vec<ObserverEvent> = [named, alike]
            .into_iter()
            .flatten()
            .map(|other| ObserverEvent::NamedLike {
                pid: vm.pid(),
                name: vm.name().to_owned(),
                other: other.pid(),
                other_name: other.name().to_owned(),
            })
            .collect();
        if let Some(uuid) = vm.uuid()
            && let Some(other) = first(&|other| other.uuid() == Some(uuid))
        {
            said.push(ObserverEvent::DuplicateUuid { pid: vm.pid(), uuid, other: other.pid() });
        }
        said
    }

    /// The QMP socket of the VM of `pid`: the one given, else (when asked to) the first its
    /// command line names that no other client holds, else the first it names.
    fn qmp_for(&self, pid: i32) -> Option<PathBuf> {
        if let Some(path) = &self.options.qmp {
            return Some(path.clone());
        }
        if let Targets::QmpSocket(path) = &self.targets {
            return Some(path.clone());
        }
        if !self.options.qmp_auto {
            return None;
        }
        let named = self.procfs.qmp_sockets(pid);
        if named.is_empty() {
            return None;
        }
        let sockets = UnixSockets::read_of(named.iter().map(PathBuf::as_path)).unwrap_or_default();
        named.iter().find(|p| sockets.of(p).accepted == 0).or(named.first()).cloned()
    }

    /// Says once each process the scan is refused now (`now`) that the filter takes, with the
    /// fix, and counts it; one the filter leaves out is said to be left out instead. What was
    /// said of those it no longer refuses is unsaid as each record's tick closes
    /// ([`Record::close_tick`]).
    fn say_refusals(&mut self, now: &BTreeSet<i32>, events: &mut Vec<ObserverEvent>) {
        for &pid in now {
            if self.records.entry(pid).or_default().refusal_said() || self.filtered_out(events, pid) {
                continue;
            }
            let Some(e) = self.scan.refused().get(&pid) else { continue };
            let reason = self.unreadable(pid, e);
            let why = read_error(&self.procfs, pid, e);
            self.records.entry(pid).or_default().scan_refused(reason);
            let (_, name) = self.procfs.identify(pid);
            events.push(ObserverEvent::Refused { pid, name, reason, why });
        }
    }

    /// Writes the observer's health on its instance's hypervisor page.
    fn write_health(&self, told: &Told) {
        let page = self.hv.page();
        let since_epoch = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        page.set(hypervisor::OBSERVER_UP, 1);
        page.set(hypervisor::OBSERVER_LAST_REFRESH, (since_epoch.as_nanos() / 100) as u64);
        page.set(hypervisor::OBSERVER_VMS_ATTACHED, told.attached as u64);
        let refused = RefusedCounts::of(told.refused.iter().copied());
        page.set(hypervisor::OBSERVER_VMS_REFUSED, refused.total() as u64);
        for (reason, n) in refused.iter() {
            page.set(reason.row(), n as u64);
        }
        page.set(hypervisor::OBSERVER_QMP_SESSIONS_UP, told.monitors_up as u64);
    }

    /// Says on its instance that the observer stopped refreshing (its loop ended, the instance
    /// stays published a while).
    pub fn mark_stopped(&self) {
        self.hv.page().set(hypervisor::OBSERVER_UP, 0);
    }

    /// The filter's verdict on `pid`'s VM, said once when it leaves it out.
    fn filtered_out(&mut self, events: &mut Vec<ObserverEvent>, pid: i32) -> bool {
        if self.options.filter.is_empty() {
            return false;
        }
        if self.records.get(&pid).is_some_and(Record::is_excluded) {
            return true;
        }
        let (_, name) = self.procfs.identify(pid);
        let vm = VmIdentity { pid, name: &name, uuid: self.procfs.vm_uuid(pid) };
        if self.options.filter.takes(&vm) {
            return false;
        }
        self.records.entry(pid).or_default().exclude();
        events.push(ObserverEvent::Excluded { pid, name });
        true
    }

    /// Claims the VMM `pid` for this observer when the options name a runtime directory.
    fn claim(&self, pid: i32) -> Result<Option<Claim>, ClaimError> {
        let Some(dir) = &self.options.claims else { return Ok(None) };
        let instance = self.hv.published_name().map(|n| n.to_string()).unwrap_or_default();
        Claim::take(dir, pid, &instance).map(Some)
    }

    /// Notes that `pid` could not be attached or refreshed this tick for a passing reason; says
    /// so unless it was already deferred at the last tick.
    fn defer(&mut self, events: &mut Vec<ObserverEvent>, pid: i32, reason: Refusal, why: String) {
        if self.records.entry(pid).or_default().defer(reason) {
            events.push(ObserverEvent::Deferred { pid, reason, why });
        }
    }

    /// Notes that `pid` cannot be observed, for `reason`: it is not tried again while it is the
    /// same process.
    fn fail(&mut self, events: &mut Vec<ObserverEvent>, pid: i32, reason: Refusal, error: String) {
        self.records.entry(pid).or_default().fail(reason);
        events.push(ObserverEvent::Failed { pid, reason, error });
    }

    /// Why `pid`, whose descriptors could not be read for `e`, is refused: the capability that
    /// would have let its `fd` directory be listed or its links read, when this process lacks it.
    fn unreadable(&self, pid: i32, e: &io::Error) -> Refusal {
        if !is_refusal(e) {
            return Refusal::Failed;
        }
        self.capabilities.refusal_of_unreadable(!self.procfs.fd_listable(pid))
    }

    /// Forgets what is kept of each of `pids` that names another process, or runs another
    /// program, than when it was kept: a new process (or program) is a new candidate.
    fn forget_changed(&mut self, pids: &[i32]) {
        for &pid in pids {
            let record = self.records.get(&pid);
            if record.is_some_and(Record::is_attached) {
                continue;
            }
            // One the listing found as it was (the same start, the same descriptors), recognized
            // at that start, is not read again: a thousand VMs a filter leaves out would cost two
            // reads of `/proc` each, every tick. A program it exec()s closes the VM's descriptors
            // (KVM's are close-on-exec), which the listing sees.
            let known = record.and_then(Record::identity).map(|i| i.start_time);
            if known.is_some() && known == self.scan.found_as_before(pid) {
                continue;
            }
            let Ok(now) = self.procfs.identity(pid) else { continue };
            self.records.entry(pid).or_default().recognize(now);
        }
    }

    /// Processes to attach to now, with their KVM descriptors, the filter's leaving out said.
    fn candidates(&mut self, events: &mut Vec<ObserverEvent>) -> Vec<(i32, io::Result<KvmFds>)> {
        let found = match self.targets.clone() {
            Targets::Pids(pids) => self.named(&pids),
            Targets::QmpSocket(path) => match self.socket_server(&path) {
                Some(p) => self.named(&[p]),
                None => Vec::new(),
            },
            Targets::All => self.listed(),
        };
        found.into_iter().filter(|(pid, _)| !self.filtered_out(events, *pid)).collect()
    }

    /// Those of `pids` neither observed nor done, with their KVM descriptors; a process that
    /// failed and exited is gone.
    fn named(&mut self, pids: &[i32]) -> Vec<(i32, io::Result<KvmFds>)> {
        for (&pid, record) in self.records.iter_mut().filter(|(_, r)| r.is_failed()) {
            if !self.procfs.is_alive(pid).unwrap_or(true) {
                record.exited();
            }
        }
        pids.iter()
            .filter(|p| self.records.get(p).is_none_or(|r| !r.is_attached() && !r.is_done() && !r.is_twin()))
            .map(|&p| (p, self.procfs.kvm_fds(p)))
            .collect()
    }

    /// With `--all`: every process holding a KVM VM, oldest first, but this one and those
    /// observed or done. A process that failed or exited is not retried while it is listed,
    /// and is forgotten once it is not (so a reused pid is observed again).
    fn listed(&mut self) -> Vec<(i32, io::Result<KvmFds>)> {
        let me = std::process::id() as i32;
        // A listing that failed (out of descriptors) changes nothing: retried next tick.
        // The VMs observed are not looked at again (their refresh says when they go).
        let records = &self.records;
        let observed = |p: i32| records.get(&p).is_some_and(Record::is_attached);
        // Left out by the filter: so while the process lives.
        let settled = |p: i32| records.get(&p).is_some_and(Record::is_excluded);
        let Ok(listed) = self.scan.kvm_processes(&self.procfs, &observed, &settled) else {
            return Vec::new();
        };
        let mut pids: Vec<i32> = listed.iter().map(|(p, _)| *p).collect();
        pids.sort_unstable();
        // A process the scan is refused is not listed, and is still the process whose
        // leaving out (or refusal) was said: forgotten only once the scan no longer has it.
        let refused = self.scan.refused();
        for (pid, record) in &mut self.records {
            if !record.is_attached() && pids.binary_search(pid).is_err() && !refused.contains_key(pid) {
                record.forget();
            }
        }
        self.forget_changed(&pids);
        // Only this process is left out: what a process holds, not what it is called, makes
        // it a VMM. Oldest first, so partition ids follow the VMMs' ages.
        let takes = |p: &i32| {
            *p != me && self.records.get(p).is_none_or(|r| !r.is_attached() && !r.is_done() && !r.is_twin())
        };
        let mut found: Vec<(i32, KvmFds)> = listed.into_iter().filter(|(p, _)| takes(p)).collect();
        // A VM two processes hold (a VMM that forked) is attached to the first: the one that made
        // a VM (KVM's debugfs names it; only its threads can run the vCPUs, KVM refusing any other
        // process's), else the oldest (a child is younger than the parent it was forked from).
        let creators = self.scan.creators();
        found.sort_by_key(|(p, _)| {
            let start = self.records.get(p).and_then(Record::identity).map(|k| k.start_time);
            (!creators.contains(p), start, *p)
        });
        found.into_iter().map(|(p, fds)| (p, Ok(fds))).collect()
    }

    /// The process serving the QMP socket `path` (the one that bound it, as the kernel records),
    /// asked at most once a second while none is observed.
    fn socket_server(&mut self, path: &std::path::Path) -> Option<i32> {
        if let Some(vm) = self.vms().next() {
            return Some(vm.pid());
        }
        let now = Instant::now();
        if now < self.socket_retry {
            return None;
        }
        self.socket_retry = now + Duration::from_secs(1);
        // Connecting takes no turn of QEMU's: the kernel knows the listener without it greeting.
        let qmp = Qmp::begin(path, Duration::ZERO, Cancel::new()).ok()?;
        qmp.peer_pid()
    }
}

/// Descriptors this process may still open for counters: the open file limit less those open
/// now and less [`FD_RESERVE`] (or a quarter of the limit); 0 when that cannot be told.
pub(crate) fn descriptor_room() -> usize {
    let Ok(lim) = file_limits() else { return 0 };
    let limit = usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX);
    // Listing the directory takes a descriptor itself: at the limit it fails, and the room is 0.
    let Ok(open) = std::fs::read_dir("/proc/self/fd").map(Iterator::count) else { return 0 };
    limit.saturating_sub(open).saturating_sub(FD_RESERVE.min(limit / 4))
}

/// Raises the soft limit on open files to the hard limit; returns the new soft limit.
///
/// # Errors
/// When the limit cannot be read or set.
pub fn raise_fd_limit() -> io::Result<u64> {
    let mut lim = file_limits()?;
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: `lim` is a valid rlimit the kernel reads.
        check(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) })?;
    }
    Ok(lim.rlim_cur)
}

/// Keeps the in-kernel counts of VMs observed for `runtime` beyond this observer, adopting what
/// an earlier one kept: the events every VM is counted with (made now, so the adoption happens
/// at start), and what to say of it.
fn keep_counts(
    runtime: &std::path::Path,
) -> (Option<(std::path::PathBuf, crate::thread_counters::EventList)>, Vec<String>) {
    match hvstats_host::counting::keep_counts_in(runtime) {
        Ok(dir) => {
            use crate::sources::events::{host_isa, vm_events};
            let events = crate::thread_counters::EventList::kept_in(vm_events(host_isa()), &dir);
            let mut notes = hvstats_host::counting::kept_notes();
            if events.is_kept() {
                notes.push(format!("kept in {}, for the next observer to adopt", dir.display()));
            }
            (Some((dir, events)), notes)
        }
        Err(e) => (None, vec![format!("not kept beyond this observer: {e}")]),
    }
}
