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
//!
//! What was said of it ([`Said`]) is a second machine beside the stage, so that each thing is
//! said once:
//!
//! ```text
//!   Nothing ──filter leaves it out──► Excluded ──forgotten──► Nothing
//!    │  ▲  ▲
//!    │  │  └── scan no longer refuses it (and no hidden socket) ◄── Refused(reason), QmpHidden
//!    │  └──────────────────────── forgotten ◄────────────────────────┘
//!    ├─ the scan refuses it, the filter takes it ─► Refused(reason)   (counted as refused)
//!    └─ attached without its QMP socket, hidden from here ─► QmpHidden   (counted as refused)
//! ```
//!
//! The stage and what was said change only through the record's methods (its transitions).

use std::collections::BTreeMap;
use std::time::Instant;

use super::discovery::ProcessIdentity;
use super::discovery::Procfs;
use super::happenings::ObserverEvent;
use super::refusal::Refusal;
use super::sources::{KvmExitState, PeerState};
use super::vm::{Departure, ObservedVm};
use super::vm_identity;

/// Where a process stands for the observer.
#[derive(Debug, Default)]
enum Stage {
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
    Attached(Box<Observed>, AtHand),
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
struct Observed {
    /// The VM.
    vm: ObservedVm,
    /// Each source with a peer: since when it has not answered (`None` while it answers).
    peers: BTreeMap<&'static str, Option<Instant>>,
    /// Whether its vCPU threads were all known when last said.
    vcpus_known: bool,
    /// What was last said of `kvm_exit`.
    kvm_exit: KvmExitState,
}

/// What a pass over every record asks of an attached VM at each tick, kept in the record beside
/// its stage: such a pass does not go to each VM (a cold line of memory each, on a host of a
/// thousand VMs). It is what the VM's last telling found ([`Observed::tell`]).
#[derive(Debug, Clone, Copy)]
struct AtHand {
    /// A source of the VM puts questions to a peer ([`ObservedVm::asks`]).
    asks: bool,
    /// Its QMP socket is in its VMM's mount namespace and not in this one's (counted as refused).
    hidden_qmp: bool,
    /// Its monitor session (QMP) answered.
    monitor_up: bool,
    /// Which identity on a platform it has, if any ([`ObservedVm::platform_version`]).
    platform: Option<u64>,
    /// What its refresh made known was told at this tick ([`Record::tell_refreshed`]).
    told: bool,
}

impl Observed {
    /// A VM just attached: its peers as they are now (one down is said when it comes back).
    fn new(vm: ObservedVm) -> Self {
        let now = Instant::now();
        let peers =
            vm.peers().into_iter().map(|(s, state)| (s, (state != PeerState::Up).then_some(now))).collect();
        Self { vm, peers, vcpus_known: false, kvm_exit: KvmExitState::Undecided }
    }

    /// Tells what its VM's last refresh made known: its peers and progress; and keeps in
    /// `at_hand` what the tick's passes ask of it.
    fn tell(&mut self, pid: i32, now: Instant, told: &mut Told, at_hand: &mut AtHand) {
        self.say_peers(pid, now, &mut told.peers);
        self.say_progress(pid, &mut told.progress);
        at_hand.monitor_up = self.vm.monitor_up();
        at_hand.platform = self.vm.platform_version();
    }

    /// Says each source whose peer went down or came back since the last tick, once.
    fn say_peers(&mut self, pid: i32, now: Instant, events: &mut Vec<ObserverEvent>) {
        // A VM whose sources have no peer (a VMM without a monitor) has nothing to say, and its
        // peers are not copied out to find so, at every tick.
        if self.peers.is_empty() {
            return;
        }
        for (source, state) in self.vm.peers() {
            let Some(was) = self.peers.get_mut(source) else { continue };
            let name = || self.vm.name().to_owned();
            match (state, *was) {
                (PeerState::Down(why), None) => {
                    *was = Some(now);
                    events.push(ObserverEvent::SourceDown { pid, name: name(), source, why });
                }
                (PeerState::Up, Some(since)) => {
                    *was = None;
                    events.push(ObserverEvent::SourceUp { pid, name: name(), source, after: now - since });
                }
                _ => {}
            }
        }
    }

    /// Says once that its vCPU threads are all known, and each decision on `kvm_exit`.
    fn say_progress(&mut self, pid: i32, events: &mut Vec<ObserverEvent>) {
        let known = self.vm.vcpu_threads_known();
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

/// What a tick tells of its records, gathered as each record is at hand (its VM right after its
/// refresh, the rest in one pass at the tick's end): the events of the VMs' peers and progress,
/// told after the tick's refusals, peers first; and what the observer's health counts.
#[derive(Debug, Default)]
pub(crate) struct Told {
    pub(crate) peers: Vec<ObserverEvent>,
    pub(crate) progress: Vec<ObserverEvent>,
    /// VMs attached, and those whose monitor session answers.
    pub(crate) attached: usize,
    pub(crate) monitors_up: usize,
    /// The reason of each record counted as refused.
    pub(crate) refused: Vec<Refusal>,
    /// Each VM with an identity on a platform, and which identity
    /// ([`ObservedVm::platform_version`]), by pid: the platforms file is made again only where
    /// this changed.
    pub(crate) platforms: Vec<(i32, u64)>,
}

/// What was said of a process beyond its stage, each said once.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Said {
    /// Nothing.
    #[default]
    Nothing,
    /// The filter leaves it out (said).
    Excluded,
    /// The scan was refused it and the filter takes it (said): counted as refused, for this reason.
    Refused(Refusal),
    /// It is attached without its QMP socket, hidden from here (said; counted through its stage).
    QmpHidden,
}

/// What the observer knows of one process.
#[derive(Debug, Default)]
pub(crate) struct Record {
    /// Who the process was when this was kept: what is kept is forgotten once its pid names
    /// another process or it runs another program.
    identity: Option<ProcessIdentity>,
    /// Where it stands.
    stage: Stage,
    /// It was deferred at the last tick, and why (its reason was said).
    deferred: Option<Refusal>,
    /// It was deferred at this tick, and why.
    deferred_now: Option<Refusal>,
    /// What was said of it beyond its stage.
    said: Said,
    /// Copies of the descriptors of the VMs it ran before and replaced (their KVM statistics):
    /// none is read for a VM it runs now.
    superseded: Vec<std::os::fd::OwnedFd>,
}

impl Record {
    /// The VM observed, when it is attached.
    pub(crate) fn vm(&self) -> Option<&ObservedVm> {
        match &self.stage {
            Stage::Attached(o, _) => Some(&o.vm),
            _ => None,
        }
    }

    /// Asks the processor for the state of its VM, when it is attached, without reading it: a
    /// hint, for a VM refreshed soon.
    pub(crate) fn prefetch_vm(&self) {
        if let Stage::Attached(observed, _) = &self.stage {
            crate::vm::prefetch_lines_of::<Observed>(&**observed);
        }
    }

    /// The VM observed, to ask and refresh, when it is attached.
    pub(crate) fn vm_mut(&mut self) -> Option<&mut ObservedVm> {
        match &mut self.stage {
            Stage::Attached(o, _) => Some(&mut o.vm),
            _ => None,
        }
    }

    /// Who the process was when this was kept.
    pub(crate) fn identity(&self) -> Option<ProcessIdentity> {
        self.identity
    }

    /// Copies of the statistics descriptors of the VMs it replaced.
    pub(crate) fn superseded(&self) -> &[std::os::fd::OwnedFd] {
        &self.superseded
    }

    /// True while it is observed.
    pub(crate) fn is_attached(&self) -> bool {
        matches!(self.stage, Stage::Attached(..))
    }

    /// True while it is observed and a source of its VM puts questions to a peer.
    pub(crate) fn asks(&self) -> bool {
        matches!(self.stage, Stage::Attached(_, AtHand { asks: true, .. }))
    }

    /// True while it is observed and its VM has an identity on a platform (as its last
    /// refresh or attach found).
    pub(crate) fn has_platform(&self) -> bool {
        matches!(self.stage, Stage::Attached(_, AtHand { platform: Some(_), .. }))
    }

    /// True while it holds the VM of another process observed (it is not a candidate then).
    pub(crate) fn is_twin(&self) -> bool {
        matches!(self.stage, Stage::Twin { .. })
    }

    /// True once it failed or is gone: not tried again while it is the same process.
    pub(crate) fn is_done(&self) -> bool {
        matches!(self.stage, Stage::Failed(_) | Stage::Gone)
    }

    /// True once it failed (and may have exited since).
    pub(crate) fn is_failed(&self) -> bool {
        matches!(self.stage, Stage::Failed(_))
    }

    /// True while a VM found in it is waited for (its vCPUs settling, or a new program's VM).
    pub(crate) fn waits(&self) -> bool {
        matches!(self.stage, Stage::Settling { .. } | Stage::Execed)
    }

    /// True while the filter leaves it out (said).
    pub(crate) fn is_excluded(&self) -> bool {
        self.said == Said::Excluded
    }

    /// Why its VM is found and not observed now, when it is not: deferred, failed while it
    /// lives, refused by the scan, or attached without its hidden QMP socket.
    pub(crate) fn refusal(&self) -> Option<Refusal> {
        let scan_refused = match self.said {
            Said::Refused(why) => Some(why),
            _ => None,
        };
        match &self.stage {
            Stage::Failed(why) => Some(*why),
            Stage::Attached(_, AtHand { hidden_qmp: true, .. }) => Some(Refusal::QmpSocketHidden),
            _ => self.deferred.or(scan_refused),
        }
    }

    /// Notes it deferred at this tick for `why`; true when that is news (it was not deferred at
    /// the last).
    pub(crate) fn defer(&mut self, why: Refusal) -> bool {
        self.deferred_now = Some(why);
        self.deferred.is_none()
    }

    /// `Seen`, `Settling` → `Settling { vcpus }`: its VM has `vcpus` vCPUs at this tick; true
    /// when the count held still since the last (it is ready to attach).
    pub(crate) fn settle(&mut self, vcpus: usize) -> bool {
        let was = std::mem::replace(&mut self.stage, Stage::Settling { vcpus });
        matches!(was, Stage::Settling { vcpus: v } if v == vcpus)
    }

    /// → `Attached`: `vm` is observed, `qmp_hidden` when its QMP socket is hidden from here (which
    /// was said).
    pub(crate) fn attach(&mut self, vm: ObservedVm, qmp_hidden: bool) {
        self.identity = Some(vm.identity());
        if qmp_hidden {
            self.said = Said::QmpHidden;
        }
        let at_hand = AtHand {
            asks: vm.asks(),
            hidden_qmp: qmp_hidden,
            monitor_up: vm.monitor_up(),
            platform: vm.platform_version(),
            told: false,
        };
        self.stage = Stage::Attached(Box::new(Observed::new(vm)), at_hand);
    }

    /// `Attached` → `Seen`, `Execed` or `Gone`: its VM left for `why`, its process named by
    /// `--pid` (`named`) or found. Returns the VM that left (`None` when none was attached).
    pub(crate) fn detach(&mut self, why: Departure, named: bool) -> Option<ObservedVm> {
        let next = match why {
            // The process lives on, with another VM: a new candidate.
            Departure::VmChanged => Stage::Seen,
            // The process lives on: a VM it makes now is a new one.
            Departure::Exec if named => Stage::Execed,
            Departure::Exec | Departure::PidReused if !named => Stage::Seen,
            // `--pid` named the process that exited, not whichever reuses its pid.
            Departure::Exec | Departure::Exited | Departure::PidReused => Stage::Gone,
        };
        if !self.is_attached() {
            return None;
        }
        let Stage::Attached(o, _) = std::mem::replace(&mut self.stage, next) else { return None };
        // Who left: a process that takes the pid now is told from it.
        self.identity = Some(o.vm.identity());
        if why == Departure::VmChanged {
            self.superseded.extend(o.vm.vmm_copies());
        }
        Some(o.vm)
    }

    /// → `Twin { of }`: it holds the very VM object of the VM observed as process `of`.
    pub(crate) fn twin(&mut self, of: i32) {
        self.stage = Stage::Twin { of };
    }

    /// `Twin { of }` → `Seen` when `of` is `pid`, which detached: the VM may live on in it.
    pub(crate) fn release_twin_of(&mut self, pid: i32) {
        if matches!(self.stage, Stage::Twin { of } if of == pid) {
            self.stage = Stage::Seen;
        }
    }

    /// → `Failed`: it cannot be observed, for `why`.
    pub(crate) fn fail(&mut self, why: Refusal) {
        self.stage = Stage::Failed(why);
    }

    /// `Failed` → `Gone`: it exited after failing.
    pub(crate) fn exited(&mut self) {
        if self.is_failed() {
            self.stage = Stage::Gone;
        }
    }

    /// Keeps of the statistics descriptors of the VMs it replaced those process `pid` still
    /// holds; when they are more than [`vm_identity::MAX_SUPERSEDED`], drops them all and
    /// returns how many there were.
    pub(crate) fn prune_superseded(&mut self, procfs: &Procfs, pid: i32) -> Result<(), usize> {
        if self.superseded.is_empty() {
            return Ok(());
        }
        vm_identity::still_held(procfs, pid, &mut self.superseded);
        let kept = self.superseded.len();
        if kept <= vm_identity::MAX_SUPERSEDED {
            return Ok(());
        }
        self.superseded.clear();
        Err(kept)
    }

    /// Nothing → `Excluded`: the filter leaves it out (said now).
    pub(crate) fn exclude(&mut self) {
        self.said = Said::Excluded;
    }

    /// Nothing → `Refused(why)`: the scan was refused it, and that was said now.
    pub(crate) fn scan_refused(&mut self, why: Refusal) {
        self.said = Said::Refused(why);
    }

    /// True when what was said of it leaves nothing to say of the scan refusing it (it was
    /// said, or the filter leaves it out, or its hidden QMP socket was said).
    pub(crate) fn refusal_said(&self) -> bool {
        self.said != Said::Nothing
    }

    /// `Refused`, `QmpHidden` → `Nothing` unless the scan still refuses it (`refused_now`) or it
    /// is attached without its hidden QMP socket: what is said again should it come back.
    pub(crate) fn unsay_refusal(&mut self, refused_now: bool) {
        let stands = match self.said {
            Said::Nothing | Said::Excluded => true,
            Said::Refused(_) => refused_now,
            Said::QmpHidden => {
                refused_now || matches!(self.stage, Stage::Attached(_, AtHand { hidden_qmp: true, .. }))
            }
        };
        if !stands {
            self.said = Said::Nothing;
        }
    }

    /// Keeps who the process is `now`; forgets what was kept when that names another process or
    /// program than when it was kept.
    pub(crate) fn recognize(&mut self, now: ProcessIdentity) {
        if self.identity.is_some_and(|was| was != now) {
            self.forget();
        }
        self.identity = Some(now);
    }

    /// Forgets what was kept of the process it was (back to `Seen`, nothing said): it names
    /// another process or program now, or is no longer listed.
    pub(crate) fn forget(&mut self) {
        *self = Self::default();
    }

    /// Ends a tick: what was deferred at it is what the next compares with.
    pub(crate) fn end_tick(&mut self) {
        self.deferred = std::mem::take(&mut self.deferred_now);
    }

    /// Tells what the refresh of its VM at this tick made known (see [`Told`]): called right
    /// after the refresh, while the VM is at hand.
    pub(crate) fn tell_refreshed(&mut self, pid: i32, now: Instant, told: &mut Told) {
        if let Stage::Attached(o, at_hand) = &mut self.stage {
            o.tell(pid, now, told, at_hand);
            at_hand.told = true;
        }
    }

    /// Ends a tick for the record in one pass: [`end_tick`](Self::end_tick), what was said of a
    /// refusal the scan no longer makes unsaid ([`unsay_refusal`](Self::unsay_refusal)), what a
    /// VM not refreshed at this tick (attached at it) made known told, and the record counted
    /// for the observer's health.
    pub(crate) fn close_tick(&mut self, pid: i32, refused_now: bool, now: Instant, told: &mut Told) {
        self.end_tick();
        self.unsay_refusal(refused_now);
        if let Stage::Attached(o, at_hand) = &mut self.stage {
            if !std::mem::take(&mut at_hand.told) {
                o.tell(pid, now, told, at_hand);
            }
            told.attached += 1;
            told.monitors_up += usize::from(at_hand.monitor_up);
            told.platforms.extend(at_hand.platform.map(|version| (pid, version)));
        }
        told.refused.extend(self.refusal());
    }

    /// True when nothing is kept of the process (the record can go).
    pub(crate) fn is_blank(&self) -> bool {
        self.identity.is_none()
            && matches!(self.stage, Stage::Seen)
            && self.deferred.is_none()
            && self.deferred_now.is_none()
            && self.said == Said::Nothing
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
        let mut r = Record::default();
        r.fail(Refusal::NoCapSysPtrace);
        r.exclude();
        assert!(r.is_done() && !r.waits() && !r.is_attached());
        assert_eq!(r.refusal(), Some(Refusal::NoCapSysPtrace));
        r.forget();
        assert!(matches!(r.stage, Stage::Seen) && !r.is_excluded() && !r.is_done() && r.refusal().is_none());
        r.fail(Refusal::Failed);
        r.exited();
        assert!(r.is_done() && r.refusal().is_none(), "an exited process is not a VM refused");
        r.forget();
        assert!(!r.settle(2) && r.waits() && !r.is_done() && !r.is_blank());
        assert!(r.settle(2), "the count held still: ready");
        assert!(!r.settle(3), "one more vCPU: settling again");
    }

    #[test]
    fn a_scan_refusal_is_said_once_and_unsaid_when_the_scan_no_longer_refuses() {
        let mut r = Record::default();
        assert!(!r.refusal_said());
        r.scan_refused(Refusal::NoCapSysPtrace);
        assert!(r.refusal_said() && r.refusal() == Some(Refusal::NoCapSysPtrace));
        r.unsay_refusal(true);
        assert_eq!(r.refusal(), Some(Refusal::NoCapSysPtrace), "still refused: still counted");
        r.unsay_refusal(false);
        assert!(!r.refusal_said() && r.refusal().is_none() && r.is_blank());
        r.exclude();
        r.unsay_refusal(false);
        assert!(r.is_excluded() && r.refusal_said(), "left out stands until forgotten");
    }

    #[test]
    fn a_ticks_close_moves_the_deferral_unsays_the_scans_old_refusal_and_counts_the_record_once() {
        let close = |r: &mut Record, refused_now: bool| {
            let mut told = Told::default();
            r.close_tick(7, refused_now, Instant::now(), &mut told);
            told
        };
        let mut r = Record::default();
        r.scan_refused(Refusal::NoCapSysPtrace);
        let told = close(&mut r, true);
        assert_eq!(told.refused, [Refusal::NoCapSysPtrace], "refused by the scan still: counted");
        assert!(r.refusal_said());
        let told = close(&mut r, false);
        assert!(told.refused.is_empty() && !r.refusal_said() && r.is_blank(), "no longer refused: unsaid");
        // A deferral counts from the close of the tick that deferred it, as `end_tick` has it.
        assert!(r.defer(Refusal::DescriptorBudget));
        let told = close(&mut r, false);
        assert_eq!(told.refused, [Refusal::DescriptorBudget]);
        assert_eq!((told.attached, told.monitors_up), (0, 0), "nothing attached");
        assert!(told.peers.is_empty() && told.progress.is_empty());
        let told = close(&mut r, false);
        assert!(told.refused.is_empty() && r.is_blank(), "a tick without it: no longer refused");
    }
}
