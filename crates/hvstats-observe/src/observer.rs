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
//! A process is who it was when it was first seen ([`ProcessIdentity`]): what the observer knows
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
use super::cancel::Cancel;
use super::claim::{Claim, ClaimError};
use super::discovery::{ProcessIdentity, Procfs, is_shortage, read_error};
use super::filter::VmIdentity;
use super::kvm_scan::KvmScan;
use super::qmp::Qmp;
use super::sources::{KvmExitState, PeerState};
use super::unix_sockets::UnixSockets;
use super::vm::{Departure, ObservedVm, ThreadRefusal};

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

/// Something that happened in one [`Observer::tick`], for the attach/detach log.
#[derive(Debug)]
pub enum ObserverEvent {
    /// A VM is now observed.
    Attached {
        /// The VMM process.
        pid: i32,
        /// The VM's name.
        name: String,
        /// The VMM.
        vmm: &'static str,
        /// Its vCPUs.
        vcpus: u32,
        /// The partition id it is published as.
        partition: u64,
        /// Perf descriptors held at attach (every thread; fewer once the vCPUs are known).
        fds: usize,
        /// Threads of the process counted at attach.
        threads: usize,
        /// Threads left out by the descriptor budget (counted should they turn out to run a vCPU).
        left_out: usize,
        /// The QMP socket used, when the VM has one.
        qmp: Option<PathBuf>,
        /// Why KVM's statistics through QMP are unavailable for now, when its session failed.
        qmp_error: Option<String>,
    },
    /// A source's peer stopped answering: the counters it gives are unavailable until it is
    /// back (it is retried).
    SourceDown {
        /// The VMM process.
        pid: i32,
        /// The VM's name.
        name: String,
        /// The source (`qmp`).
        source: &'static str,
        /// Why.
        why: String,
    },
    /// A source's peer answers again (or for the first time since attach).
    SourceUp {
        /// The VMM process.
        pid: i32,
        /// The VM's name.
        name: String,
        /// The source (`qmp`).
        source: &'static str,
        /// How long it was down.
        after: Duration,
    },
    /// A VM the filter (`--vm`, `--exclude-vm`) leaves out; said once per process.
    Excluded {
        /// The VMM process.
        pid: i32,
        /// The VM's name.
        name: String,
    },
    /// The vCPU threads of a VM are all known; counters on other threads are closed.
    VcpusKnown {
        /// The VMM process.
        pid: i32,
        /// Thread of each VP.
        threads: Vec<i32>,
        /// Perf descriptors held now.
        fds: usize,
    },
    /// Whether `kvm_exit` fires was decided for a VM.
    KvmExit {
        /// The VMM process.
        pid: i32,
        /// What was decided.
        state: KvmExitState,
    },
    /// A VM is no longer observed: its process exited, `exec()`ed, or its pid names another
    /// process now.
    Detached {
        /// The VMM process.
        pid: i32,
        /// The VM's name.
        name: String,
        /// Why.
        why: Departure,
    },
    /// A VM just attached is named as, or like, a VM observed already (a lookalike differs only
    /// by characters that show nothing or by confusable letters; see
    /// [`hvstats::vm_name::looks_like`]).
    NamedLike {
        /// The VMM process of the VM just attached.
        pid: i32,
        /// Its name.
        name: String,
        /// The VMM process of the VM observed already.
        other: i32,
        /// That VM's name.
        other_name: String,
    },
    /// A VM just attached has the UUID of a VM observed already.
    DuplicateUuid {
        /// The VMM process of the VM just attached.
        pid: i32,
        /// The UUID.
        uuid: hvstats::vmm::VmUuid,
        /// The VMM process of the VM observed already.
        other: i32,
    },
    /// A source refused what the VMM offered it (a descriptor or a socket that is not what it
    /// was listed as); said once, when the VM is attached. The counters come from the VM's other
    /// sources.
    SourceRefused {
        /// The VMM process.
        pid: i32,
        /// The VM's name.
        name: String,
        /// The source (`stats-fd`, `qmp`).
        source: &'static str,
        /// What was refused, and why.
        why: String,
    },
    /// A thread id a source named for one of a VM's vCPUs is not used (said once per thread).
    ThreadRefused {
        /// The VMM process.
        pid: i32,
        /// The VM's name.
        name: String,
        /// The thread, who named it and why it was refused.
        refusal: ThreadRefusal,
    },
    /// A process cannot be attached or refreshed now for want of descriptors or memory of this
    /// process; it is tried again at the next tick (said once until that changes).
    Deferred {
        /// The process.
        pid: i32,
        /// Why.
        reason: String,
    },
    /// A process that may hold a VM is not observed because this process may not read it (its
    /// `/proc/PID/fd`), or a VM's QMP socket is not seen from this process's mount namespace;
    /// said once per process, with what would let it in. Counted as refused while it lasts.
    Refused {
        /// The process.
        pid: i32,
        /// Its VM's name (as its command line gives it).
        name: String,
        /// Why, and the fix.
        why: String,
    },
    /// A process could not be observed.
    Failed {
        /// The process.
        pid: i32,
        /// Why.
        error: String,
    },
}

/// Observes VMs and publishes each as a partition of one instance.
#[derive(Debug)]
pub struct Observer {
    hv: Arc<Hypervisor>,
    procfs: Procfs,
    targets: Targets,
    options: ObserveOptions,
    vms: BTreeMap<i32, ObservedVm>,
    /// Processes that failed or exited (never retried with `--pid`; retried with `--all` only
    /// when they appear again with a new VM).
    done: BTreeSet<i32>,
    reported: BTreeMap<i32, (bool, KvmExitState)>,
    /// With `--all`: processes seen with a VM but not attached yet, and their vCPU count then.
    /// A VMM creates its vCPUs one by one after the VM; attaching waits until the count holds
    /// still for one interval, so a partition gets every vCPU.
    pending: BTreeMap<i32, usize>,
    /// Processes deferred at the last tick (their reason was said once).
    deferred: BTreeSet<i32>,
    /// Processes that failed and may still hold a VM (refused, with those deferred).
    failed: BTreeSet<i32>,
    /// Processes the filter leaves out (said once).
    excluded: BTreeSet<i32>,
    /// Each VM's sources with a peer: whether it answered at the last tick, and since when it
    /// has not.
    peers: BTreeMap<(i32, &'static str), Option<Instant>>,
    /// With a QMP socket as the target: when its server's pid is asked next.
    socket_retry: Instant,
    /// Who each process the observer keeps something about was then: what is kept of a pid is
    /// forgotten once it names another process or program.
    known: BTreeMap<i32, ProcessIdentity>,
    /// `--pid` processes whose VM left by an `exec()`: waited for until they hold a VM again.
    execed: BTreeSet<i32>,
    /// Every process holding a KVM VM, found anew each tick from what changed.
    scan: KvmScan,
    /// Processes refused (by the scan, or a QMP socket hidden from this mount namespace) whose
    /// refusal was said.
    refusals_said: BTreeSet<i32>,
    /// Observed VMs whose QMP socket their VMM's mount namespace has and this one does not.
    hidden_qmp: BTreeSet<i32>,
    /// Processes the scan was refused that the filter takes: counted as refused.
    refused_vms: BTreeSet<i32>,
}

/// Descriptors kept out of the counters' reach (for `/proc`, the runtime directory, QMP sockets
/// and, in `serve`, HTTP connections), or a quarter of the limit when that is smaller.
pub const FD_RESERVE: usize = 256;

impl Observer {
    /// An observer publishing into `hv`.
    pub fn new(hv: Arc<Hypervisor>, procfs: Procfs, targets: Targets, options: ObserveOptions) -> Self {
        Self {
            hv,
            procfs,
            targets,
            options,
            vms: BTreeMap::new(),
            done: BTreeSet::new(),
            reported: BTreeMap::new(),
            pending: BTreeMap::new(),
            deferred: BTreeSet::new(),
            failed: BTreeSet::new(),
            excluded: BTreeSet::new(),
            peers: BTreeMap::new(),
            socket_retry: Instant::now(),
            known: BTreeMap::new(),
            execed: BTreeSet::new(),
            scan: KvmScan::new(),
            refusals_said: BTreeSet::new(),
            hidden_qmp: BTreeSet::new(),
            refused_vms: BTreeSet::new(),
        }
    }

    /// The VMs observed now, by pid.
    pub fn vms(&self) -> impl Iterator<Item = &ObservedVm> {
        self.vms.values()
    }

    /// True when observing `--pid` processes and every one has exited or failed.
    pub fn finished(&self) -> bool {
        match &self.targets {
            Targets::Pids(pids) => pids.iter().all(|p| self.done.contains(p)),
            Targets::All | Targets::QmpSocket(_) => false,
        }
    }

    /// VMs found and not observed now: deferred (another observer holds them, descriptors ran
    /// out) or failed while their process lives.
    pub fn refused(&self) -> usize {
        let mut refused: BTreeSet<i32> = self.deferred.union(&self.failed).copied().collect();
        refused.extend(&self.refused_vms);
        refused.extend(self.hidden_qmp.iter().filter(|p| self.vms.contains_key(p)));
        refused.len()
    }

    /// Observed VMs whose QMP session answers now.
    pub fn qmp_sessions_up(&self) -> usize {
        self.vms.values().filter(|vm| vm.monitor_up()).count()
    }

    /// Perf descriptors held for every VM.
    pub fn fds(&self) -> usize {
        self.vms.values().map(ObservedVm::fds).sum()
    }

    /// Attaches to new VMs, refreshes every observed one, detaches from gone ones.
    pub fn tick(&mut self) -> Vec<ObserverEvent> {
        let mut events = Vec::new();
        // Every VM's questions go out before any VM is read: its peers answer meanwhile.
        let paths: Vec<PathBuf> = self.vms.values().filter_map(|vm| vm.qmp_path().map(Into::into)).collect();
        let sockets = match paths.is_empty() {
            true => UnixSockets::default(),
            false => UnixSockets::read_of(paths.iter().map(PathBuf::as_path)).unwrap_or_default(),
        };
        for vm in self.vms.values_mut() {
            vm.ask(&sockets);
        }
        // Refresh first: a VM attached now was refreshed by its attach.
        let pids: Vec<i32> = self.vms.keys().copied().collect();
        let mut deferred = BTreeSet::new();
        for pid in pids {
            let Some(vm) = self.vms.get_mut(&pid) else { continue };
            let refreshed = vm.refresh(&self.procfs);
            for refusal in vm.take_refusals() {
                events.push(ObserverEvent::ThreadRefused { pid, name: vm.name().to_owned(), refusal });
            }
            match refreshed {
                Ok(None) => {}
                Ok(Some(why)) => {
                    if let Some(vm) = self.vms.remove(&pid) {
                        // Who left: a process that takes the pid now is told from it.
                        self.known.insert(pid, vm.identity());
                        self.scan.recheck(pid);
                        events.push(ObserverEvent::Detached { pid, name: vm.name().to_owned(), why });
                    }
                    self.reported.remove(&pid);
                    self.peers.retain(|(p, _), _| *p != pid);
                    match (why, &self.targets) {
                        // The process lives on: a VM it makes now is a new one.
                        (Departure::Exec, Targets::Pids(_)) => {
                            self.execed.insert(pid);
                        }
                        (Departure::Exec | Departure::PidReused, Targets::All | Targets::QmpSocket(_)) => {}
                        // `--pid` named the process that exited, not whichever reuses its pid.
                        (Departure::Exited | Departure::PidReused, _) => {
                            self.done.insert(pid);
                        }
                    }
                }
                // Not knowing whether it lives is not knowing it died: keep it, say why once.
                Err(e) => {
                    self.defer(&mut events, &mut deferred, pid, format!("cannot read process {pid}: {e}"))
                }
            }
        }
        for (pid, result) in self.candidates(&mut events) {
            let waits = self.targets == Targets::All || self.execed.contains(&pid);
            let fds = match result {
                // A VM without vCPUs yet: wait for them (a partition's VPs are fixed at attach).
                Ok(fds) if fds.has_vm() && fds.vcpus.is_empty() => continue,
                // Kept while it is not attached: a VM deferred now is not waited for again (and
                // said again) next tick.
                Ok(fds) if fds.has_vm() && waits => {
                    let seen = self.pending.insert(pid, fds.vcpus.len());
                    if seen != Some(fds.vcpus.len()) {
                        continue;
                    }
                    fds
                }
                Ok(fds) if fds.has_vm() => fds,
                // A `--pid` process that `exec()`ed: its new program may make a VM later.
                Ok(_) if waits => continue,
                Ok(_) => {
                    self.fail(&mut events, pid, format!("process {pid} holds no KVM VM"));
                    continue;
                }
                Err(e) if is_shortage(&e) => {
                    self.defer(&mut events, &mut deferred, pid, format!("cannot read process {pid}: {e}"));
                    continue;
                }
                Err(e) => {
                    let why = read_error(&self.procfs, pid, &e);
                    self.fail(&mut events, pid, why);
                    continue;
                }
            };
            let claim = match self.claim(pid) {
                Ok(claim) => claim,
                // With --all, a VM another observer publishes is read from its instance; it is
                // taken over should that observer stop.
                Err(e)
                    if e.is_shortage()
                        || (matches!(e, ClaimError::Taken { .. }) && self.targets == Targets::All) =>
                {
                    let reason = format!("process {pid}: {}", hvstats_host::error_chain::error_chain(&e));
                    self.defer(&mut events, &mut deferred, pid, reason);
                    continue;
                }
                Err(e) => {
                    self.fail(
                        &mut events,
                        pid,
                        format!("process {pid}: {}", hvstats_host::error_chain::error_chain(&e)),
                    );
                    continue;
                }
            };
            let room = descriptor_room();
            let qmp = self.qmp_for(pid);
            match ObservedVm::attach(&self.hv, &self.procfs, pid, &fds, &self.options, room, qmp.as_deref()) {
                Ok(mut vm) => {
                    if let Some(claim) = claim {
                        vm.hold(claim);
                    }
                    self.pending.remove(&pid);
                    self.failed.remove(&pid);
                    let now = Instant::now();
                    for (source, state) in vm.peers() {
                        let down = (state != PeerState::Up).then_some(now);
                        self.peers.insert((pid, source), down);
                    }
                    self.execed.remove(&pid);
                    self.known.insert(pid, vm.identity());
                    let (threads, left_out) = vm.threads_counted();
                    events.push(ObserverEvent::Attached {
                        pid,
                        name: vm.name().to_owned(),
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
                        events.push(ObserverEvent::SourceRefused {
                            pid,
                            name: vm.name().to_owned(),
                            source,
                            why,
                        });
                    }
                    for refusal in vm.take_refusals() {
                        events.push(ObserverEvent::ThreadRefused {
                            pid,
                            name: vm.name().to_owned(),
                            refusal,
                        });
                    }
                    if let Some(path) = qmp.as_deref().filter(|p| self.procfs.hidden_from_here(pid, p)) {
                        self.hidden_qmp.insert(pid);
                        self.refusals_said.insert(pid);
                        events.push(ObserverEvent::Refused {
                            pid,
                            name: vm.name().to_owned(),
                            why: format!(
                                "its QMP socket {} is in its mount namespace and not in this one's: a \
                                 private /tmp or a hidden /home stands between them (PrivateTmp=, \
                                 ProtectHome=yes in hvstats-observe.service); observed without QMP",
                                path.display()
                            ),
                        });
                    }
                    events.extend(self.resemblances(&vm));
                    self.vms.insert(pid, vm);
                }
                Err(e @ ObserveError::Budget { .. }) => {
                    self.defer(&mut events, &mut deferred, pid, hvstats_host::error_chain::error_chain(&e));
                }
                Err(ObserveError::Proc { source, .. }) if is_shortage(&source) => {
                    let reason = format!("cannot read process {pid}: {source}");
                    self.defer(&mut events, &mut deferred, pid, reason);
                }
                Err(e) => self.fail(&mut events, pid, hvstats_host::error_chain::error_chain(&e)),
            }
        }
        self.deferred = deferred;
        self.say_refusals(&mut events);
        self.peer_changes(&mut events);
        for (pid, vm) in &self.vms {
            let known = vm.vcpu_threads().iter().all(Option::is_some);
            let (was_known, was_state) =
                self.reported.get(pid).copied().unwrap_or((false, KvmExitState::Undecided));
            if known && !was_known {
                let threads = vm.vcpu_threads().into_iter().flatten().collect();
                events.push(ObserverEvent::VcpusKnown { pid: *pid, threads, fds: vm.fds() });
            }
            if vm.kvm_exit() != was_state && vm.kvm_exit() != KvmExitState::Undecided {
                events.push(ObserverEvent::KvmExit { pid: *pid, state: vm.kvm_exit() });
            }
            self.reported.insert(*pid, (known, vm.kvm_exit()));
        }
        self.write_health();
        events
    }

    /// What a VM just attached shares with the VMs observed already: a name, one that looks
    /// alike, a UUID. The VM observed first keeps its name on every surface; the newcomer is the
    /// one readers must tell apart, and this says so.
    fn resemblances(&self, vm: &ObservedVm) -> Vec<ObserverEvent> {
        let mut said = Vec::new();
        for other in self.vms.values() {
            if vm.name() == other.name() || hvstats::vm_name::looks_like(vm.name(), other.name()) {
                said.push(ObserverEvent::NamedLike {
                    pid: vm.pid(),
                    name: vm.name().to_owned(),
                    other: other.pid(),
                    other_name: other.name().to_owned(),
                });
            }
            if let Some(uuid) = vm.uuid().filter(|u| other.uuid() == Some(*u)) {
                said.push(ObserverEvent::DuplicateUuid { pid: vm.pid(), uuid, other: other.pid() });
            }
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

    /// Says once each process the scan was refused that the filter takes, with the fix, and
    /// counts it; forgets those gone. One the filter leaves out is said to be left out instead.
    fn say_refusals(&mut self, events: &mut Vec<ObserverEvent>) {
        let now: BTreeSet<i32> = self.scan.refused().keys().copied().collect();
        self.refused_vms.retain(|p| now.contains(p));
        self.hidden_qmp.retain(|p| self.vms.contains_key(p));
        self.refusals_said.retain(|p| now.contains(p) || self.hidden_qmp.contains(p));
        for pid in now {
            if !self.refusals_said.insert(pid) || self.filtered_out(events, pid) {
                continue;
            }
            self.refused_vms.insert(pid);
            let Some(e) = self.scan.refused().get(&pid) else { continue };
            let why = read_error(&self.procfs, pid, e);
            let (_, name) = self.procfs.identify(pid);
            events.push(ObserverEvent::Refused { pid, name, why });
        }
    }

    /// Says each source whose peer went down or came back since the last tick, once.
    fn peer_changes(&mut self, events: &mut Vec<ObserverEvent>) {
        let now = Instant::now();
        for (pid, vm) in &self.vms {
            for (source, state) in vm.peers() {
                let Some(was) = self.peers.get_mut(&(*pid, source)) else { continue };
                match (&state, *was) {
                    (PeerState::Down(why), None) => {
                        *was = Some(now);
                        let name = vm.name().to_owned();
                        events.push(ObserverEvent::SourceDown { pid: *pid, name, source, why: why.clone() });
                    }
                    (PeerState::Up, Some(since)) => {
                        *was = None;
                        let name = vm.name().to_owned();
                        events.push(ObserverEvent::SourceUp { pid: *pid, name, source, after: now - since });
                    }
                    _ => {}
                }
            }
        }
    }

    /// Writes the observer's health on its instance's hypervisor page.
    fn write_health(&self) {
        let page = self.hv.page();
        let since_epoch = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        page.set(hypervisor::OBSERVER_UP, 1);
        page.set(hypervisor::OBSERVER_LAST_REFRESH, (since_epoch.as_nanos() / 100) as u64);
        page.set(hypervisor::OBSERVER_VMS_ATTACHED, self.vms.len() as u64);
        page.set(hypervisor::OBSERVER_VMS_REFUSED, self.refused() as u64);
        page.set(hypervisor::OBSERVER_QMP_SESSIONS_UP, self.qmp_sessions_up() as u64);
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
        if self.excluded.contains(&pid) {
            return true;
        }
        let (_, name) = self.procfs.identify(pid);
        let vm = VmIdentity { pid, name: &name, uuid: self.procfs.vm_uuid(pid) };
        if self.options.filter.takes(&vm) {
            return false;
        }
        self.excluded.insert(pid);
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
    fn defer(&self, events: &mut Vec<ObserverEvent>, now: &mut BTreeSet<i32>, pid: i32, reason: String) {
        if !self.deferred.contains(&pid) {
            events.push(ObserverEvent::Deferred { pid, reason });
        }
        now.insert(pid);
    }

    fn fail(&mut self, events: &mut Vec<ObserverEvent>, pid: i32, error: String) {
        self.done.insert(pid);
        self.failed.insert(pid);
        self.pending.remove(&pid);
        self.execed.remove(&pid);
        events.push(ObserverEvent::Failed { pid, error });
    }

    /// Forgets what is kept of each of `pids` that names another process, or runs another
    /// program, than when it was kept: a new process (or program) is a new candidate.
    fn forget_changed(&mut self, pids: &[i32]) {
        for &pid in pids {
            if self.vms.contains_key(&pid) {
                continue;
            }
            let Ok(now) = self.procfs.identity(pid) else { continue };
            if self.known.insert(pid, now).is_some_and(|was| was != now) {
                self.done.remove(&pid);
                self.pending.remove(&pid);
                self.deferred.remove(&pid);
                self.reported.remove(&pid);
                self.failed.remove(&pid);
                self.excluded.remove(&pid);
            }
        }
    }

    /// Processes to attach to now, with their KVM descriptors. With `--all`, a process that
    /// failed or exited is not retried while it is listed, and is forgotten once it is not (so
    /// a reused pid is observed again).
    fn candidates(
        &mut self,
        events: &mut Vec<ObserverEvent>,
    ) -> Vec<(i32, io::Result<super::discovery::KvmFds>)> {
        let found: Vec<(i32, io::Result<super::discovery::KvmFds>)> = match self.targets.clone() {
            Targets::Pids(pids) => {
                self.failed.retain(|p| self.procfs.is_alive(*p).unwrap_or(true));
                pids.iter()
                    .filter(|p| !self.vms.contains_key(p) && !self.done.contains(p))
                    .map(|&p| (p, self.procfs.kvm_fds(p)))
                    .collect()
            }
            Targets::QmpSocket(path) => match self.socket_server(&path) {
                Some(p) if !self.vms.contains_key(&p) && !self.done.contains(&p) => {
                    vec![(p, self.procfs.kvm_fds(p))]
                }
                _ => Vec::new(),
            },
            Targets::All => {
                let me = std::process::id() as i32;
                // A listing that failed (out of descriptors) changes nothing: retried next tick.
                // The VMs observed are not looked at again (their refresh says when they go).
                let vms = &self.vms;
                let Ok(listed) = self.scan.kvm_processes(&self.procfs, &|p| vms.contains_key(&p)) else {
                    return Vec::new();
                };
                let pids: Vec<i32> = listed.iter().map(|(p, _)| *p).collect();
                let still = |p: &i32| pids.contains(p);
                self.done.retain(still);
                self.failed.retain(still);
                self.excluded.retain(still);
                self.pending.retain(|p, _| still(p));
                self.known.retain(|p, _| pids.contains(p) || self.vms.contains_key(p));
                self.forget_changed(&pids);
                // Only this process is left out: what a process holds, not what it is called,
                // makes it a VMM. Oldest first, so partition ids follow the VMMs' ages.
                let mut found: Vec<(i32, super::discovery::KvmFds)> = listed
                    .into_iter()
                    .filter(|(p, _)| *p != me && !self.vms.contains_key(p) && !self.done.contains(p))
                    .collect();
                found.sort_by_key(|(p, _)| (self.known.get(p).map(|k| k.start_time), *p));
                found.into_iter().map(|(p, fds)| (p, Ok(fds))).collect()
            }
        };
        found.into_iter().filter(|(pid, _)| !self.filtered_out(events, *pid)).collect()
    }

    /// The process serving the QMP socket `path` (the one that bound it, as the kernel records),
    /// asked at most once a second while none is observed.
    fn socket_server(&mut self, path: &std::path::Path) -> Option<i32> {
        if let Some(pid) = self.vms.keys().next() {
            return Some(*pid);
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
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid rlimit the kernel writes into.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
    }
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
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid rlimit the kernel writes into.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: `lim` is a valid rlimit the kernel reads.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(lim.rlim_cur)
}
