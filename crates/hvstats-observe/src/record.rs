//! What the observer knows of one process: who it was ([`ProcessIdentity`]), where it stands
//! ([`Stage`]: seen, settling, waited for after an `exec()`, attached, failed, gone), and what was
//! said of it (deferred, left out by the filter, refused), so that each is said once.
//!
//! A process moves between the stages as the observer's ticks find it:
//!
//! ```text
//!   Seen ──VM, vCPUs count──► Settling ──count holds still──► Attached ──exit, pid reused──► Gone
//!    │  ▲                                                        │ │
//!    │  └──── exec() (--all), or no longer listed ◄──────────────┘ └─ exec() (--pid) ─► Execed ─► Settling
//!    └─ cannot be observed ─► Failed ── exits (--pid) ─► Gone
//! ```
//!
//! A process holding the very VM object of a VM attached already (a forked child) is a `Twin` of
//! that VM's process, neither published nor refused, and back to `Seen` once that process
//! detaches; an attached VM whose process no longer holds it as its only VM (replaced in place)
//! detaches back to `Seen`, the old VM's statistics descriptors kept aside (`superseded`).
//!
//! With `--all`, a record of a process no longer listed, or that names another process or program
//! than when it was kept, is forgotten (back to `Seen`): a new process is a new candidate.

use std::collections::BTreeMap;
use std::time::Instant;

use super::discovery::ProcessIdentity;
use super::event::ObserverEvent;
use super::refusal::Refusal;
use super::sources::{KvmExitState, PeerState};
use super::vm::ObservedVm;

/// Where a process stands for the observer.
#[derive(Debug, Default)]
pub(crate) enum Stage {
    /// Known (or not yet), nothing under way: a candidate when it holds a VM.
    #[default]
    Seen,
    /// Holds a VM whose vCPUs numbered this many at the last tick: a VMM creates its vCPUs one by
    /// one after the VM, so it is attached once the count holds still for one interval (with
    /// `--all`, or after an `exec()`).
    Settling {
        /// vCPUs at the last tick.
        vcpus: usize,
    },
    /// A `--pid` process whose VM left by an `exec()`: waited for until it holds a VM again.
    Execed,
    /// Observed.
    Attached(Box<Observed>),
    /// Could not be observed: not retried while it is the same process (with `--pid`, never), and
    /// counted as refused, for its reason, while it lives.
    Failed(Refusal),
    /// Exited, or (with `--pid`) its pid names another process now: not retried.
    Gone,
    /// Holds the very VM object of the VM observed as process `of` (see
    /// [`crate::vm_identity`]): not a VM of its own while `of` is attached.
    Twin {
        /// The process whose VM it is.
        of: i32,
    },
}

/// An observed VM and what the observer said of it.
#[derive(Debug)]
pub(crate) struct Observed {
    /// The VM.
    pub(crate) vm: ObservedVm,
    /// Each source with a peer: since when it has not answered (`None` while it answers).
    peers: BTreeMap<&'static str, Option<Instant>>,
    /// Whether its vCPU threads were all known when last said.
    vcpus_known: bool,
    /// What was last said of `kvm_exit`.
    kvm_exit: KvmExitState,
    /// Its QMP socket is in its VMM's mount namespace and not in this one's (counted as refused).
    pub(crate) hidden_qmp: bool,
}

impl Observed {
    /// A VM just attached: its peers as they are now (one down is said when it comes back).
    pub(crate) fn new(vm: ObservedVm, hidden_qmp: bool) -> Self {
        let now = Instant::now();
        let peers =
            vm.peers().into_iter().map(|(s, state)| (s, (state != PeerState::Up).then_some(now))).collect();
        Self { vm, peers, vcpus_known: false, kvm_exit: KvmExitState::Undecided, hidden_qmp }
    }

    /// Says each source whose peer went down or came back since the last tick, once.
    fn say_peers(&mut self, pid: i32, now: Instant, events: &mut Vec<ObserverEvent>) {
        for (source, state) in self.vm.peers() {
            let Some(was) = self.peers.get_mut(source) else { continue };
            let name = self.vm.name().to_owned();
            match (state, *was) {
                (PeerState::Down(why), None) => {
                    *was = Some(now);
                    events.push(ObserverEvent::SourceDown { pid, name, source, why });
                }
                (PeerState::Up, Some(since)) => {
                    *was = None;
                    events.push(ObserverEvent::SourceUp { pid, name, source, after: now - since });
                }
                _ => {}
            }
        }
    }

    /// Says once that its vCPU threads are all known, and each decision on `kvm_exit`.
    fn say_progress(&mut self, pid: i32, events: &mut Vec<ObserverEvent>) {
        let known = self.vm.vcpu_threads().iter().all(Option::is_some);
        if known && !self.vcpus_known {
            let threads = self.vm.vcpu_threads().into_iter().flatten().collect();
            events.push(ObserverEvent::VcpusKnown { pid, threads, fds: self.vm.fds() });
        }
        let state = self.vm.kvm_exit();
        if state != self.kvm_exit && state != KvmExitState::Undecided {
            events.push(ObserverEvent::KvmExit { pid, state });
        }
        self.vcpus_known = known;
        self.kvm_exit = state;
    }
}

/// What the observer knows of one process.
#[derive(Debug, Default)]
pub(crate) struct Record {
    /// Who the process was when this was kept: what is kept is forgotten once its pid names
    /// another process or it runs another program.
    pub(crate) identity: Option<ProcessIdentity>,
    /// Where it stands.
    pub(crate) stage: Stage,
    /// It was deferred at the last tick, and why (its reason was said).
    deferred: Option<Refusal>,
    /// It was deferred at this tick, and why.
    deferred_now: Option<Refusal>,
    /// The filter leaves it out (said once).
    pub(crate) excluded: bool,
    /// The scan was refused it and the filter takes it: counted as refused, for this reason.
    pub(crate) scan_refused: Option<Refusal>,
    /// Its refusal (by the scan, or a QMP socket hidden from here) was said.
    pub(crate) refusal_said: bool,
    /// Copies of the descriptors of the VMs it ran before and replaced (their KVM statistics):
    /// none is read for a VM it runs now.
    pub(crate) superseded: Vec<std::os::fd::OwnedFd>,
}

impl Record {
    /// The VM observed, when it is attached.
    pub(crate) fn vm(&self) -> Option<&ObservedVm> {
        match &self.stage {
            Stage::Attached(o) => Some(&o.vm),
            _ => None,
        }
    }

    /// The VM observed and what was said of it, when it is attached.
    pub(crate) fn observed_mut(&mut self) -> Option<&mut Observed> {
        match &mut self.stage {
            Stage::Attached(o) => Some(o),
            _ => None,
        }
    }

    /// True while it is observed.
    pub(crate) fn is_attached(&self) -> bool {
        matches!(self.stage, Stage::Attached(_))
    }

    /// True while it holds the VM of another process observed (it is not a candidate then).
    pub(crate) fn is_twin(&self) -> bool {
        matches!(self.stage, Stage::Twin { .. })
    }

    /// True once it failed or is gone: not tried again while it is the same process.
    pub(crate) fn is_done(&self) -> bool {
        matches!(self.stage, Stage::Failed(_) | Stage::Gone)
    }

    /// True while a VM found in it is waited for (its vCPUs settling, or a new program's VM).
    pub(crate) fn waits(&self) -> bool {
        matches!(self.stage, Stage::Settling { .. } | Stage::Execed)
    }

    /// Why its VM is found and not observed now, when it is not: deferred, failed while it
    /// lives, refused by the scan, or attached without its hidden QMP socket.
    pub(crate) fn refusal(&self) -> Option<Refusal> {
        match &self.stage {
            Stage::Failed(why) => Some(*why),
            Stage::Attached(o) if o.hidden_qmp => Some(Refusal::QmpSocketHidden),
            _ => self.deferred.or(self.scan_refused),
        }
    }

    /// Notes it deferred at this tick for `why`; true when that is news (it was not deferred at
    /// the last).
    pub(crate) fn defer(&mut self, why: Refusal) -> bool {
        self.deferred_now = Some(why);
        self.deferred.is_none()
    }

    /// Forgets what was kept of the process it was: it names another process or program now.
    pub(crate) fn forget(&mut self) {
        self.stage = Stage::Seen;
        self.superseded.clear();
        self.deferred = None;
        self.excluded = false;
    }

    /// Says what changed of its peers since the last tick.
    pub(crate) fn say_peers(&mut self, pid: i32, now: Instant, events: &mut Vec<ObserverEvent>) {
        if let Some(o) = self.observed_mut() {
            o.say_peers(pid, now, events);
        }
    }

    /// Says what became known of its VM since the last tick.
    pub(crate) fn say_progress(&mut self, pid: i32, events: &mut Vec<ObserverEvent>) {
        if let Some(o) = self.observed_mut() {
            o.say_progress(pid, events);
        }
    }

    /// Ends a tick: what was deferred at it is what the next compares with.
    pub(crate) fn end_tick(&mut self) {
        self.deferred = std::mem::take(&mut self.deferred_now);
    }

    /// True when nothing is kept of the process (the record can go).
    pub(crate) fn is_blank(&self) -> bool {
        self.identity.is_none()
            && matches!(self.stage, Stage::Seen)
            && !(self.deferred.is_some()
                || self.deferred_now.is_some()
                || self.excluded
                || self.scan_refused.is_some()
                || self.refusal_said)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deferral_is_news_once_and_counts_as_refused_until_a_tick_passes_without_it() {
        let mut r = Record::default();
        let budget = Refusal::DescriptorBudget;
        assert!(r.is_blank() && r.refusal().is_none());
        assert!(r.defer(budget), "deferred for the first time: said");
        r.end_tick();
        assert!(r.refusal() == Some(budget) && !r.is_blank());
        assert!(!r.defer(budget), "deferred at the last tick too: not said again");
        r.end_tick();
        assert_eq!(r.refusal(), Some(budget));
        // A tick without it: no longer refused, and said again should it come back.
        r.end_tick();
        assert!(r.refusal().is_none() && r.is_blank());
        assert!(r.defer(budget));
    }

    #[test]
    fn a_failed_process_is_done_and_refused_until_it_is_forgotten() {
        let failed = Stage::Failed(Refusal::NoCapSysPtrace);
        let mut r = Record { stage: failed, excluded: true, ..Record::default() };
        assert!(r.is_done() && !r.waits() && !r.is_attached());
        assert_eq!(r.refusal(), Some(Refusal::NoCapSysPtrace));
        r.forget();
        assert!(matches!(r.stage, Stage::Seen) && !r.excluded && !r.is_done() && r.refusal().is_none());
        r.stage = Stage::Gone;
        assert!(r.is_done() && r.refusal().is_none(), "an exited process is not a VM refused");
        r.stage = Stage::Execed;
        assert!(r.waits() && !r.is_done());
        r.stage = Stage::Settling { vcpus: 2 };
        assert!(r.waits() && !r.is_blank());
    }
}
