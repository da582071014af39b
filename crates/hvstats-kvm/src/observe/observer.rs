//! The observer: which processes to watch, attaching to their VMs as they appear and detaching
//! as they go, one refresh of every observed VM per interval.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::Arc;

use hvstats::Hypervisor;

use super::attach::{ObserveError, ObserveOptions};
use super::claim::{Claim, ClaimError};
use super::discovery::{Procfs, is_shortage};
use super::sources::KvmExitState;
use super::vm::ObservedVm;

/// Which processes are observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Targets {
    /// These processes (each must hold a KVM VM).
    Pids(Vec<i32>),
    /// Every process on the host holding a KVM VM, including ones that appear later.
    All,
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
        /// Why KVM's statistics through QMP are unavailable, when a socket was given and failed.
        qmp_error: Option<String>,
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
    /// A VM is no longer observed (its process exited).
    Detached {
        /// The VMM process.
        pid: i32,
        /// The VM's name.
        name: String,
    },
    /// A process cannot be attached or refreshed now for want of descriptors or memory of this
    /// process; it is tried again at the next tick (said once until that changes).
    Deferred {
        /// The process.
        pid: i32,
        /// Why.
        reason: String,
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
            Targets::All => false,
        }
    }

    /// Perf descriptors held for every VM.
    pub fn fds(&self) -> usize {
        self.vms.values().map(ObservedVm::fds).sum()
    }

    /// Attaches to new VMs, refreshes every observed one, detaches from gone ones.
    pub fn tick(&mut self) -> Vec<ObserverEvent> {
        let mut events = Vec::new();
        // Refresh first: a VM attached now was refreshed by its attach.
        let pids: Vec<i32> = self.vms.keys().copied().collect();
        let mut deferred = BTreeSet::new();
        for pid in pids {
            let Some(vm) = self.vms.get_mut(&pid) else { continue };
            match vm.refresh(&self.procfs) {
                Ok(true) => {}
                Ok(false) => {
                    if let Some(vm) = self.vms.remove(&pid) {
                        events.push(ObserverEvent::Detached { pid, name: vm.name().to_owned() });
                    }
                    self.done.insert(pid);
                    self.reported.remove(&pid);
                }
                // Not knowing whether it lives is not knowing it died: keep it, say why once.
                Err(e) => {
                    self.defer(&mut events, &mut deferred, pid, format!("cannot read process {pid}: {e}"))
                }
            }
        }
        for (pid, result) in self.candidates() {
            let fds = match result {
                // A VM without vCPUs yet: wait for them (a partition's VPs are fixed at attach).
                Ok(fds) if fds.has_vm() && fds.vcpus.is_empty() => continue,
                Ok(fds) if fds.has_vm() && self.targets == Targets::All => {
                    let seen = self.pending.insert(pid, fds.vcpus.len());
                    if seen != Some(fds.vcpus.len()) {
                        continue;
                    }
                    self.pending.remove(&pid);
                    fds
                }
                Ok(fds) if fds.has_vm() => fds,
                Ok(_) => {
                    self.fail(&mut events, pid, format!("process {pid} holds no KVM VM"));
                    continue;
                }
                Err(e) if is_shortage(&e) => {
                    self.defer(&mut events, &mut deferred, pid, format!("cannot read process {pid}: {e}"));
                    continue;
                }
                Err(e) => {
                    self.fail(&mut events, pid, format!("cannot read process {pid}: {e}"));
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
                    let reason = format!("process {pid}: {}", hvstats::snapshot::error_chain(&e));
                    self.defer(&mut events, &mut deferred, pid, reason);
                    continue;
                }
                Err(e) => {
                    self.fail(
                        &mut events,
                        pid,
                        format!("process {pid}: {}", hvstats::snapshot::error_chain(&e)),
                    );
                    continue;
                }
            };
            let room = descriptor_room();
            match ObservedVm::attach(&self.hv, &self.procfs, pid, &fds, &self.options, room) {
                Ok(mut vm) => {
                    if let Some(claim) = claim {
                        vm.hold(claim);
                    }
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
                        qmp_error: vm.qmp_error().map(str::to_owned),
                    });
                    self.vms.insert(pid, vm);
                }
                Err(e @ ObserveError::Budget { .. }) => {
                    self.defer(&mut events, &mut deferred, pid, hvstats::snapshot::error_chain(&e));
                }
                Err(ObserveError::Proc { source, .. }) if is_shortage(&source) => {
                    let reason = format!("cannot read process {pid}: {source}");
                    self.defer(&mut events, &mut deferred, pid, reason);
                }
                Err(e) => self.fail(&mut events, pid, hvstats::snapshot::error_chain(&e)),
            }
        }
        self.deferred = deferred;
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
        events
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
        events.push(ObserverEvent::Failed { pid, error });
    }

    /// Processes to attach to now, with their KVM descriptors. With `--all`, a process that
    /// failed or exited is not retried while it is listed, and is forgotten once it is not (so
    /// a reused pid is observed again).
    fn candidates(&mut self) -> Vec<(i32, io::Result<super::discovery::KvmFds>)> {
        match &self.targets {
            Targets::Pids(pids) => pids
                .iter()
                .filter(|p| !self.vms.contains_key(p) && !self.done.contains(p))
                .map(|&p| (p, self.procfs.kvm_fds(p)))
                .collect(),
            Targets::All => {
                let me = std::process::id() as i32;
                // A listing that failed (out of descriptors) changes nothing: retried next tick.
                let Ok(listed) = self.procfs.kvm_processes() else { return Vec::new() };
                self.done.retain(|p| listed.iter().any(|(q, _)| q == p));
                self.pending.retain(|p, _| listed.iter().any(|(q, _)| q == p));
                // hvstats' own partitions are published by the process that runs them: an
                // observer would only show them twice.
                let own = |p: &i32| self.procfs.comm(*p).is_ok_and(|c| c == "hvstats");
                listed
                    .into_iter()
                    .filter(|(p, _)| {
                        *p != me && !self.vms.contains_key(p) && !self.done.contains(p) && !own(p)
                    })
                    .map(|(p, fds)| (p, Ok(fds)))
                    .collect()
            }
        }
    }
}

/// Descriptors this process may still open for counters: the open file limit less those open
/// now and less [`FD_RESERVE`] (or a quarter of the limit); 0 when that cannot be told.
pub fn descriptor_room() -> usize {
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
