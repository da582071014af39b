//! One observed VM: its counters on the VMM's threads, the vCPU threads once known, and the
//! partition (partition page + a VP page per vCPU) it is published as.
//!
//! At attach every thread of the process gets the counters of [`vm_events`]; each refresh finds
//! which thread runs which vCPU (QMP `query-cpus-fast`, KVM's debugfs, thread names), writes each
//! known vCPU thread's counts since attach into its VP page, and, once every vCPU is known, closes
//! the counters on the other threads. Kernel-cumulative values (KVM's statistics through QMP,
//! the thread's guest time) have their value at attach subtracted, so every counter counts from
//! attach.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hvstats::whv::VpExtras;
use hvstats::{Hypervisor, PartitionStats, SharedPage};
use hvstats_abi::catalog::{self, Counter, CounterId, Maintained, vp};
use hvstats_abi::exit_reason::{self, ExitReasonRow, InterceptClass};
use hvstats_abi::source::{KvmStat, PerfSoftwareEvent, Source, SourceKind, ThreadTime, Tracepoint};

use hvstats_host::task_stat::ticks_to_100ns;

use super::claim::Claim;
use super::counting::{EventList, EventSpec, SW_CPU_MIGRATIONS, SW_TASK_CLOCK, ThreadCounters};
use super::discovery::{KvmFds, Procfs, Vmm};
use super::publication;
use super::qmp::{Cancel, KvmStatsReply, Qmp, QmpError};
use crate::accounting::UserExitCounts;
use crate::sources::counter_source::{CounterSource, ObservedThread, open_observed_all};
use crate::sources::{thread_time, tracepoint};

/// Where each event sits in the list [`vm_events`] makes: the KVM tracepoints the catalog's
/// observed keys name (with the parts added to them), then `kvm_exit`, the task clock, the
/// migrations, and on VMX/SVM hosts `kvm_exit` per intercept class, then the spans from
/// `kvm_exit` to `kvm_entry` per intercept class (Other last: every exit no class took).
#[derive(Debug)]
struct Layout {
    /// By [`Tracepoint::index`], its event's index when the observer counts it.
    tracepoints: [Option<usize>; Tracepoint::ALL.len()],
    kvm_exit: usize,
    task_clock: usize,
    migrations: usize,
    /// The first per-class `kvm_exit` counter, in [`InterceptClass::ALL`] order without `Other`.
    classes: usize,
    /// The first per-class span (exit to entry, nanoseconds), in [`InterceptClass::ALL`] order
    /// without `Other`, then Other's.
    times: usize,
}

impl Layout {
    fn tracepoint(&self, tp: Tracepoint) -> Option<usize> {
        self.tracepoints[tp.index()]
    }
}

fn layout() -> &'static Layout {
    static LAYOUT: std::sync::OnceLock<Layout> = std::sync::OnceLock::new();
    LAYOUT.get_or_init(|| {
        let mut tracepoints = [None; Tracepoint::ALL.len()];
        let mut n = 0;
        for tp in Tracepoint::ALL.into_iter().filter(|tp| tp.counted_for_observed()) {
            tracepoints[tp.index()] = Some(n);
            n += 1;
        }
        let classes = n + 3;
        let times = classes + InterceptClass::ALL.len() - 1;
        Layout { tracepoints, kvm_exit: n, task_clock: n + 1, migrations: n + 2, classes, times }
    })
}

/// The hardware virtualization of this host's KVM: `Some(ISA_VMX)`, `Some(ISA_SVM)`, or `None`
/// (a software backend, where `kvm_exit` does not fire).
pub fn host_isa() -> Option<u32> {
    if std::path::Path::new("/sys/module/kvm_intel").is_dir() {
        Some(exit_reason::ISA_VMX)
    } else if std::path::Path::new("/sys/module/kvm_amd").is_dir() {
        Some(exit_reason::ISA_SVM)
    } else {
        None
    }
}

/// The ftrace filter on `kvm_exit` that matches the reasons of `class` in `rows`.
pub fn class_filter(rows: &[ExitReasonRow], class: InterceptClass) -> Option<String> {
    let terms: Vec<String> = rows
        .iter()
        .filter(|r| r.class == class)
        .map(|r| {
            let reason = if r.first == r.last {
                format!("exit_reason == {}", r.first)
            } else {
                format!("(exit_reason >= {} && exit_reason <= {})", r.first, r.last)
            };
            match r.condition {
                Some(c) => format!("({reason} && {c})"),
                None => reason,
            }
        })
        .collect();
    (!terms.is_empty()).then(|| terms.join(" || "))
}

/// The events counted on a VMM's threads: the KVM tracepoints the catalog's observed keys name
/// (`kvm_userspace_exit` by reason among them), `kvm_exit` (whether it fires at all), task clock
/// and migrations, and on VMX/SVM hosts (`isa`) `kvm_exit` per intercept class.
pub fn vm_events(isa: Option<u32>) -> Vec<EventSpec> {
    let at = layout();
    let mut specs: Vec<EventSpec> = Tracepoint::ALL
        .into_iter()
        .filter(|tp| at.tracepoint(*tp).is_some())
        .map(|tp| match tracepoint::filter(tp) {
            Some(f) => EventSpec::filtered("kvm", tp.event(), &f),
            None => EventSpec::tracepoint("kvm", tp.event()),
        })
        .collect();
    specs.push(EventSpec::tracepoint("kvm", "kvm_exit"));
    specs.push(EventSpec::Software(SW_TASK_CLOCK));
    specs.push(EventSpec::Software(SW_CPU_MIGRATIONS));
    debug_assert_eq!(specs.len(), at.classes);
    if let Some(rows) = isa.and_then(exit_reason::table) {
        // Every class but Other has rows on VMX; on SVM two have none: a filter that matches
        // nothing keeps the indices fixed.
        let filter = |class| class_filter(rows, class).unwrap_or_else(|| "exit_reason == 4294967295".into());
        for class in classified() {
            specs.push(EventSpec::filtered("kvm", "kvm_exit", &filter(class)));
        }
        debug_assert_eq!(specs.len(), at.times);
        // A thread has one open span: the first class whose filter matches opens it, and the
        // unfiltered span last takes every exit no class took (Other).
        for class in classified() {
            specs.push(EventSpec::span("kvm", "kvm_exit", Some(&filter(class)), "kvm_entry"));
        }
        specs.push(EventSpec::span("kvm", "kvm_exit", None, "kvm_entry"));
    }
    specs
}

/// The classes counted by their own `kvm_exit` filter (all but Other, which is the rest).
fn classified() -> impl Iterator<Item = InterceptClass> {
    InterceptClass::ALL.into_iter().filter(|c| *c != InterceptClass::Other)
}

/// What is known about `kvm:kvm_exit` on this host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvmExitState {
    /// Not a VMX/SVM host: it is not counted by reason.
    NoHardwareVirtualization,
    /// No exit seen yet.
    Undecided,
    /// It fires: intercepts are counted by reason.
    Fires,
    /// The guest made exits (userspace exits or CPUID) but `kvm_exit` stayed 0.
    Silent,
}

/// The counters of `kind` the observer keeps for an observed VM, with their observed key.
fn observed_counters(kind: hvstats_abi::ObjectKind) -> impl Iterator<Item = (&'static Counter, Source)> {
    hvstats_abi::CATALOG
        .iter()
        .filter(move |c| c.id.kind == kind)
        .filter_map(|c| Some((c, catalog::observed(c).and_then(Maintained::source)?)))
}

/// True when `id` is the counter of an intercept class `kvm_exit` counts by reason.
fn is_class_counter(id: CounterId) -> bool {
    classified().any(|c| c.counter() == id)
}

/// One VP of an observed VM.
#[derive(Debug)]
struct ObservedVp {
    /// KVM's vCPU id (from the fd link).
    vcpu_id: u32,
    tid: Option<i32>,
    qom_path: Option<String>,
    /// The sources opened on the thread when it was found (the list of
    /// [`open_observed_all`]).
    sources: Vec<Box<dyn CounterSource>>,
}

impl ObservedVp {
    /// Whether a source of its thread writes the counters of `kind`.
    fn has_source(&self, kind: SourceKind) -> bool {
        self.sources.iter().any(|s| s.keys().contains(&kind))
    }
}

/// How to observe a VM.
#[derive(Clone, Debug, Default)]
pub struct ObserveOptions {
    /// A QMP socket of the VMM (QEMU) for KVM's statistics and vCPU threads.
    pub qmp: Option<PathBuf>,
    /// Ends every QMP wait at once when set (the observer is stopping).
    pub cancel: Cancel,
    /// The runtime directory in which each VMM is claimed before it is observed (see
    /// [`super::claim`]); `None` observes without claiming.
    pub claims: Option<PathBuf>,
}

/// Threads of a VMM counted beyond one per vCPU while the vCPU threads are unknown: a VMM's
/// other threads (main loop, I/O, RCU, a worker pool) rarely number more; the rest of a process
/// with thousands of threads is left out, and said to be.
pub const EXTRA_THREADS: usize = 256;

/// The deadline of one QMP exchange (the connect and greeting, or one command and its reply).
pub const QMP_TIMEOUT: Duration = Duration::from_secs(2);

/// An error attaching to a VM.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The process holds no KVM VM.
    #[error("process {0} holds no KVM VM")]
    NoVm(i32),
    /// Its threads or descriptors could not be read.
    #[error("cannot read process {pid}")]
    Proc {
        /// The process.
        pid: i32,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Not enough descriptors are left to count on the VM's vCPU threads.
    #[error(
        "process {pid}: its {vcpus} vCPUs need {needed} perf descriptors and {room} are left \
         under the open file limit (less a reserve for /proc and the runtime directory)"
    )]
    Budget {
        /// The process.
        pid: i32,
        /// Its vCPUs.
        vcpus: usize,
        /// Descriptors its vCPU threads need.
        needed: usize,
        /// Descriptors left for counters.
        room: usize,
    },
    /// The partition could not be created.
    #[error("cannot publish a partition for process {pid}")]
    Publish {
        /// The process.
        pid: i32,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// One observed VM published as a partition.
#[derive(Debug)]
pub struct ObservedVm {
    pid: i32,
    vmm: Vmm,
    name: String,
    vm_fd: u32,
    attached: SystemTime,
    counters: ThreadCounters,
    vps: Vec<ObservedVp>,
    partition: Arc<PartitionStats>,
    hv: Arc<Hypervisor>,
    qmp: Option<Qmp>,
    qmp_error: Option<String>,
    /// KVM statistics at attach (through QMP).
    stats_at_attach: Option<KvmStatsReply>,
    kvm_exit: KvmExitState,
    /// Each counted thread's guest time (clock ticks) when its counters were opened.
    guest_ticks_at_open: BTreeMap<i32, u64>,
    /// The counters last declared unavailable.
    declared: Option<Vec<CounterId>>,
    /// This observer's claim on the VMM, released after the partition is removed.
    claim: Option<Claim>,
}

impl ObservedVm {
    /// Attaches to the VM of `pid` (whose KVM descriptors are `fds`): opens counters on its
    /// threads (at most [`EXTRA_THREADS`] beyond one per vCPU, the threads known to run a vCPU
    /// first, and no more than `room` descriptors), connects QMP when given, and creates the
    /// partition in `hv`.
    ///
    /// # Errors
    /// When the process has no VM, cannot be read, `room` cannot hold a counter group per vCPU,
    /// or the partition cannot be created.
    pub fn attach(
        hv: &Arc<Hypervisor>,
        procfs: &Procfs,
        pid: i32,
        fds: &KvmFds,
        options: &ObserveOptions,
        room: usize,
    ) -> Result<Self, AttachError> {
        let Some(&vm_fd) = fds.vms.first() else { return Err(AttachError::NoVm(pid)) };
        let isa = host_isa();
        let attached = SystemTime::now();
        let events = EventList::new(vm_events(isa));
        let per_thread = events.len().max(1);
        let vcpus = fds.vcpus.len();
        let max_threads = (room / per_thread).min(vcpus + EXTRA_THREADS);
        if max_threads < vcpus.max(1) {
            return Err(AttachError::Budget { pid, vcpus, needed: vcpus.max(1) * per_thread, room });
        }
        // Threads already known to run a vCPU are counted before any other.
        let mut first: Vec<i32> = procfs.debugfs_vcpu_threads(pid, vm_fd).into_values().collect();
        first.extend(procfs.named_vcpu_threads(pid).unwrap_or_default().into_values());
        let counters = ThreadCounters::attach_at_most(procfs, pid, events, max_threads, &first)
            .map_err(|source| AttachError::Proc { pid, source })?;
        let (vmm, mut name) = procfs.identify(pid);
        let (mut qmp, mut qmp_error) = (None, None);
        if let Some(path) = &options.qmp {
            match Qmp::connect_with(path, QMP_TIMEOUT, options.cancel.clone()) {
                Ok(q) => qmp = Some(q),
                Err(e) => qmp_error = Some(hvstats::snapshot::error_chain(&e)),
            }
        }
        let mut stats_at_attach = None;
        if let Some(q) = qmp.as_mut() {
            let asked = match q.query_name() {
                Ok(n) => {
                    name = n.unwrap_or(name);
                    q.query_kvm_stats()
                }
                Err(e) => Err(e),
            };
            match asked {
                Ok(s) => stats_at_attach = s,
                Err(e) => {
                    // A peer out of step (late, lying, gone) is not asked again.
                    if !e.is_command_error() {
                        qmp = None;
                    }
                    qmp_error = Some(hvstats::snapshot::error_chain(&e));
                }
            }
        }
        let vps: Vec<ObservedVp> = fds
            .vcpus
            .keys()
            .map(|&vcpu_id| ObservedVp { vcpu_id, tid: None, qom_path: None, sources: Vec::new() })
            .collect();
        // Nothing is read yet: every counter but the authority's own (the VP count) is declared
        // unavailable until the first refresh declares what the sources give, so no reader sees
        // a 0 that was never measured.
        let nothing_yet: Vec<CounterId> = hvstats_abi::CATALOG
            .iter()
            .filter(|c| matches!(c.id.kind, hvstats_abi::ObjectKind::Partition | hvstats_abi::ObjectKind::Vp))
            .filter(|c| catalog::observed(c).and_then(Maintained::source) != Some(Source::Authority))
            .map(|c| c.id)
            .collect();
        let indices: Vec<u32> = (0..vps.len() as u32).collect();
        let partition = hv
            .create_partition_declared(None, &indices, &name, &nothing_yet)
            .map_err(|source| AttachError::Publish { pid, source })?;
        partition.set_vmm(hvstats::vmm::VmmProcess { vmm, pid: pid as u32 });
        if let Some(uuid) = procfs.vm_uuid(pid) {
            partition.set_uuid(uuid);
        }
        let kvm_exit =
            if isa.is_some() { KvmExitState::Undecided } else { KvmExitState::NoHardwareVirtualization };
        let mut me = Self {
            pid,
            vmm,
            name,
            vm_fd,
            attached,
            counters,
            vps,
            partition,
            hv: hv.clone(),
            qmp,
            qmp_error,
            stats_at_attach,
            kvm_exit,
            declared: None,
            guest_ticks_at_open: BTreeMap::new(),
            claim: None,
        };
        me.note_guest_ticks(procfs);
        if let Err(source) = me.refresh(procfs) {
            return Err(AttachError::Proc { pid, source });
        }
        Ok(me)
    }

    /// Holds `claim` on the VMM for as long as this VM is observed.
    pub fn hold(&mut self, claim: Claim) {
        self.claim = Some(claim);
    }

    /// The VMM process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The VM's name.
    pub fn name(&self) -> &str {
        &self.name
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
        self.vps.iter().map(|v| v.tid).collect()
    }

    /// Threads of the process counted now, and threads left out by the limit.
    pub fn threads_counted(&self) -> (usize, usize) {
        (self.counters.tids().len(), self.counters.left_out())
    }

    /// Perf descriptors held for this VM.
    pub fn fds(&self) -> usize {
        self.counters.fds()
    }

    /// How this VM's tracepoints are counted (in the kernel, or by perf counters, and why).
    pub fn counting_method(&self) -> String {
        self.counters.events().method_description()
    }

    /// What is known about `kvm_exit`.
    pub fn kvm_exit(&self) -> KvmExitState {
        self.kvm_exit
    }

    /// Why KVM's statistics through QMP are unavailable, when a socket was given and failed.
    pub fn qmp_error(&self) -> Option<&str> {
        self.qmp_error.as_deref()
    }

    /// True when KVM's statistics come through QMP.
    pub fn has_qmp_stats(&self) -> bool {
        self.stats_at_attach.is_some()
    }

    /// Finds vCPU threads, reads every counter and writes the pages. Returns `false` once the
    /// process is gone.
    ///
    /// # Errors
    /// When the process's status cannot be read for another reason than its exit (this process
    /// is out of descriptors or memory): the VM is not refreshed, and stays observed.
    pub fn refresh(&mut self, procfs: &Procfs) -> io::Result<bool> {
        if !procfs.is_alive(self.pid)? {
            return Ok(false);
        }
        if self.counters.rescan(procfs).is_ok_and(|added| added > 0) {
            self.note_guest_ticks(procfs);
        }
        self.find_threads(procfs);
        let stats = self.read_qmp_stats();
        let mut exits_seen = false;
        let mut kvm_exits = 0;
        // An observed VM's sources use neither the run loop's counts nor the WHv extras.
        let (user, mut extras) = (UserExitCounts::default(), VpExtras::default());
        for (index, vp) in self.vps.iter_mut().enumerate() {
            let Some(tid) = vp.tid else { continue };
            let Some(page) = self.partition.vp_page(index as u32) else { continue };
            for source in &mut vp.sources {
                source.merge(page, &user, &mut extras);
            }
            let Some(counts) = self.counters.read(tid) else { continue };
            let at = layout();
            let c = |i: usize| counts.get(i).copied().flatten();
            let tp = |tp: Tracepoint| at.tracepoint(tp).and_then(c);
            write_tracepoint_counts(page, &counts);
            // Thread times: task clock since attach; guest time is kernel-cumulative.
            if let Some(ns) = c(at.task_clock) {
                let total = ns / 100;
                let guest = guest_ticks(procfs, self.pid, tid)
                    .zip(self.guest_ticks_at_open.get(&tid).copied())
                    .map_or(0, |(now, then)| ticks_to_100ns(now.saturating_sub(then)));
                page.set(vp::TOTAL_RUN_TIME, total);
                page.set(vp::HYPERVISOR_RUN_TIME, total.saturating_sub(guest));
            }
            if let Some(m) = c(at.migrations) {
                page.set(vp::LOGICAL_PROCESSOR_MIGRATIONS, m);
            }
            exits_seen |= [Tracepoint::UserspaceIo, Tracepoint::UserspaceMmio, Tracepoint::Cpuid]
                .into_iter()
                .map(|t| tp(t).unwrap_or(0))
                .sum::<u64>()
                > 0;
            kvm_exits += c(at.kvm_exit).unwrap_or(0);
            let exits = self.kvm_exit == KvmExitState::Fires;
            if exits {
                write_exit_classes(page, &counts);
                write_exit_times(page, &counts);
            }
            if let (Some(now), Some(then), Some(q)) = (&stats, &self.stats_at_attach, &vp.qom_path)
                && let (Some(now), Some(then)) = (now.vcpus.get(q), then.vcpus.get(q))
            {
                for (counter, source) in observed_counters(hvstats_abi::ObjectKind::Vp) {
                    let Source::KvmStats(KvmStat::Vcpu(names)) = source else { continue };
                    // Where kvm_exit gives the counter by reason, that count is kept.
                    if exits && is_class_counter(counter.id) {
                        continue;
                    }
                    if let Some(v) = since_attach(names, now, then) {
                        page.set(counter.id, v);
                    }
                }
            }
        }
        if let (Some(now), Some(then)) = (&stats, &self.stats_at_attach) {
            for (counter, source) in observed_counters(hvstats_abi::ObjectKind::Partition) {
                if let Source::KvmStats(KvmStat::Vm(names)) = source
                    && let Some(v) = since_attach(names, &now.vm, &then.vm)
                {
                    self.partition.page().set(counter.id, v);
                }
            }
        }
        if self.kvm_exit == KvmExitState::Undecided {
            if kvm_exits > 0 {
                self.kvm_exit = KvmExitState::Fires;
            } else if exits_seen {
                self.kvm_exit = KvmExitState::Silent;
            }
        }
        self.narrow();
        self.publish_facts();
        Ok(true)
    }

    /// Records the guest time of threads whose counters were just opened: guest time counts from
    /// the same moment as the thread's counters.
    fn note_guest_ticks(&mut self, procfs: &Procfs) {
        for tid in self.counters.tids() {
            if let std::collections::btree_map::Entry::Vacant(v) = self.guest_ticks_at_open.entry(tid) {
                v.insert(guest_ticks(procfs, self.pid, tid).unwrap_or(0));
            }
        }
    }

    /// Which thread runs each vCPU: QMP, then debugfs, then thread names.
    fn find_threads(&mut self, procfs: &Procfs) {
        if self.vps.iter().all(|v| v.tid.is_some()) {
            return;
        }
        let mut by_index: BTreeMap<u32, (i32, Option<String>)> = BTreeMap::new();
        match self.qmp.as_mut().map(Qmp::query_cpus) {
            Some(Ok(cpus)) => {
                for c in cpus {
                    by_index.insert(c.index, (c.thread_id, Some(c.qom_path)));
                }
            }
            Some(Err(e)) => self.qmp_failed(&e),
            None => {}
        }
        let by_id = procfs.debugfs_vcpu_threads(self.pid, self.vm_fd);
        let by_name = procfs.named_vcpu_threads(self.pid).unwrap_or_default();
        for (index, vp) in self.vps.iter_mut().enumerate() {
            if vp.tid.is_some() {
                continue;
            }
            let index = index as u32;
            let found = by_index
                .get(&index)
                .cloned()
                .or_else(|| by_id.get(&vp.vcpu_id).map(|t| (*t, None)))
                .or_else(|| by_name.get(&index).map(|t| (*t, None)));
            if let Some((tid, qom)) = found {
                vp.tid = Some(tid);
                vp.qom_path = qom;
                vp.sources = open_observed_all(ObservedThread { procfs: procfs.root(), pid: self.pid, tid });
            }
        }
    }

    /// Once every vCPU's thread is known, counts only on those threads.
    fn narrow(&mut self) {
        if self.counters.is_narrowed() || self.vps.iter().any(|v| v.tid.is_none()) {
            return;
        }
        let tids: Vec<i32> = self.vps.iter().filter_map(|v| v.tid).collect();
        self.counters.retain(&tids);
        self.guest_ticks_at_open.retain(|tid, _| tids.contains(tid));
    }

    fn read_qmp_stats(&mut self) -> Option<KvmStatsReply> {
        self.stats_at_attach.as_ref()?;
        let q = self.qmp.as_mut()?;
        match q.query_kvm_stats() {
            Ok(s) => s,
            Err(e) => {
                // QMP is gone: its counters stop being available rather than going stale.
                self.qmp_error = Some(hvstats::snapshot::error_chain(&e));
                self.qmp = None;
                self.stats_at_attach = None;
                None
            }
        }
    }

    /// Notes a failed QMP exchange; a session out of step (late, lying, gone) is dropped.
    fn qmp_failed(&mut self, e: &QmpError) {
        self.qmp_error = Some(hvstats::snapshot::error_chain(e));
        if !e.is_command_error() {
            self.qmp = None;
            self.stats_at_attach = None;
        }
    }

    /// The partition and VP counters no source gives this VM now.
    pub fn unavailable(&self) -> Vec<CounterId> {
        let exits = self.kvm_exit == KvmExitState::Fires;
        let at = layout();
        // A statistic QEMU did not report at attach has no baseline: its counter is unavailable.
        let vcpu_stat = |stat: &str| {
            self.stats_at_attach.as_ref().is_some_and(|s| s.vcpus.values().any(|v| v.contains_key(stat)))
        };
        let vm_stat = |stat: &str| self.stats_at_attach.as_ref().is_some_and(|s| s.vm.contains_key(stat));
        let events = self.counters.events();
        // An event is missing when it cannot be counted at all, or is not open on a vCPU thread.
        let event_missing = |i: usize| {
            events.unavailable(i).is_some()
                || self.vps.iter().filter_map(|v| v.tid).any(|tid| !self.counters.is_open(tid, i))
        };
        hvstats_abi::CATALOG
            .iter()
            .filter(|c| {
                let Some(observed) = catalog::observed(c) else { return false };
                let Some(source) = observed.source() else { return true };
                match source {
                    Source::Authority => false,
                    Source::KvmExit(_) => !exits,
                    Source::KvmExitTime(class) => !exits || span_of(class).is_none_or(event_missing),
                    Source::KvmStats(KvmStat::Vcpu(names)) => {
                        !(exits && is_class_counter(c.id) || names.iter().any(|n| vcpu_stat(n)))
                    }
                    Source::KvmStats(KvmStat::Vm(names)) => !names.iter().any(|n| vm_stat(n)),
                    Source::Tracepoint(tp) => at.tracepoint(tp).is_none_or(event_missing),
                    // schedstat needs no perf event: available once every vCPU thread's is read.
                    Source::ThreadTime(ThreadTime::Dispatches | ThreadTime::CpuWait) => {
                        self.vps.iter().any(|v| !v.has_source(SourceKind::ThreadTime))
                    }
                    Source::ThreadTime(ThreadTime::Total | ThreadTime::Hypervisor) => {
                        event_missing(at.task_clock)
                    }
                    Source::PerfSoftware(PerfSoftwareEvent::CpuMigrations) => event_missing(at.migrations),
                    Source::HostFaults(_) => self.vps.iter().any(|v| !v.has_source(SourceKind::HostFaults)),
                    // The VMM's own exit handling and the host-wide files are not this VM's.
                    Source::RunLoop(_) | Source::Hypercall(_) | Source::Procfs => true,
                }
            })
            .map(|c| c.id)
            .collect()
    }

    /// Declares the counters no source gives this VM now, when that changed.
    fn publish_facts(&mut self) {
        let unavailable = self.unavailable();
        if self.declared.as_ref() != Some(&unavailable) {
            publication::declare_unavailable(&self.partition, &unavailable);
            self.declared = Some(unavailable);
        }
    }
}

impl Drop for ObservedVm {
    fn drop(&mut self) {
        self.hv.remove_partition(self.partition.id());
    }
}

/// A KVM statistic's count since attach: the sum over `names` of each one's growth, `None`
/// when QEMU reports none of them now.
fn since_attach(names: &[&str], now: &BTreeMap<String, u64>, then: &BTreeMap<String, u64>) -> Option<u64> {
    let grown =
        names.iter().filter_map(|n| Some(now.get(*n)?.saturating_sub(then.get(*n).copied().unwrap_or(0))));
    grown.reduce(u64::saturating_add)
}

/// Writes the counters whose observed key is a tracepoint: its count, plus the parts added to it
/// (x2APIC accesses) and, for MSR accesses, the VMM's MSR exits; an unavailable event leaves its
/// counter as it is.
fn write_tracepoint_counts(page: &SharedPage, counts: &[Option<u64>]) {
    let at = layout();
    let c = |tp: Tracepoint| at.tracepoint(tp).and_then(|i| counts.get(i).copied().flatten());
    for (counter, source) in observed_counters(hvstats_abi::ObjectKind::Vp) {
        let Source::Tracepoint(tp) = source else { continue };
        let Some(n) = c(tp) else { continue };
        let mut value = n + tp.added().iter().map(|a| c(*a).unwrap_or(0)).sum::<u64>();
        if tp == Tracepoint::Msr {
            value += c(Tracepoint::UserspaceMsr).unwrap_or(0);
        }
        page.set(counter.id, value);
    }
}

/// Writes the classes counted from `kvm_exit` that no tracepoint gives, and Other (every exit
/// not in a class).
fn write_exit_classes(page: &SharedPage, counts: &[Option<u64>]) {
    let at = layout();
    let Some(total) = counts.get(at.kvm_exit).copied().flatten() else { return };
    let mut classified = 0u64;
    for (i, class) in classified_classes().enumerate() {
        let Some(n) = counts.get(at.classes + i).copied().flatten() else { continue };
        classified += n;
        if !class_has_tracepoint(class) {
            page.set(class.counter(), n);
        }
    }
    page.set(vp::OTHER_INTERCEPTS, total.saturating_sub(classified));
}

/// Writes each intercept class's time from exit to entry (nanoseconds, as 100 ns) into its cost
/// counter, from the spans `kvm_exit` → `kvm_entry`; a span not counted leaves its counter.
fn write_exit_times(page: &SharedPage, counts: &[Option<u64>]) {
    for class in InterceptClass::ALL {
        let cost = class.counter().counter().and_then(Counter::cost);
        if let (Some(cost), Some(Some(ns))) = (cost, span_of(class).map(|i| counts.get(i).copied().flatten()))
        {
            page.set(cost.id, ns / 100);
        }
    }
}

/// The event index of `class`'s span in the list of a VMX/SVM host.
fn span_of(class: InterceptClass) -> Option<usize> {
    let at = layout();
    match class {
        InterceptClass::Other => Some(at.times + InterceptClass::ALL.len() - 1),
        _ => classified().position(|c| c == class).map(|i| at.times + i),
    }
}

fn classified_classes() -> impl Iterator<Item = InterceptClass> {
    classified()
}

/// Classes whose counter a tracepoint already gives exactly (the tracepoint is kept): the
/// counter's observed key is a tracepoint.
fn class_has_tracepoint(class: InterceptClass) -> bool {
    let counter = class.counter().counter();
    matches!(counter.and_then(catalog::observed).and_then(Maintained::source), Some(Source::Tracepoint(_)))
}

/// The guest time (clock ticks) of thread `tid` of `pid`.
fn guest_ticks(procfs: &Procfs, pid: i32, tid: i32) -> Option<u64> {
    thread_time::guest_ticks_of(procfs.root(), pid, tid).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_filters_name_every_reason_of_the_class() {
        let vmx = exit_reason::VMX;
        assert_eq!(class_filter(vmx, InterceptClass::Cpuid).as_deref(), Some("exit_reason == 10"));
        assert_eq!(
            class_filter(vmx, InterceptClass::Msr).as_deref(),
            Some("exit_reason == 31 || exit_reason == 32 || exit_reason == 84 || exit_reason == 85")
        );
        assert_eq!(
            class_filter(vmx, InterceptClass::PageFault).as_deref(),
            Some("(exit_reason == 0 && intr_info == 0x80000b0e)")
        );
        let svm = exit_reason::SVM;
        assert_eq!(
            class_filter(svm, InterceptClass::DebugRegister).as_deref(),
            Some("(exit_reason >= 32 && exit_reason <= 63)")
        );
        assert_eq!(class_filter(svm, InterceptClass::ApicEoi), None);
    }

    #[test]
    fn event_indices_match_the_list() {
        let at = layout();
        assert_eq!(vm_events(None).len(), at.classes);
        let vmx = vm_events(Some(exit_reason::ISA_VMX));
        assert_eq!(vmx.len(), at.times + InterceptClass::ALL.len());
        assert_eq!(
            vmx[at.times],
            EventSpec::span("kvm", "kvm_exit", Some("exit_reason == 14 || exit_reason == 58"), "kvm_entry")
        );
        assert_eq!(
            vmx[span_of(InterceptClass::Other).unwrap()],
            EventSpec::span("kvm", "kvm_exit", None, "kvm_entry")
        );
        assert_eq!(vm_events(Some(exit_reason::ISA_SVM)).len(), vmx.len());
        assert_eq!(vm_events(None)[at.task_clock], EventSpec::Software(SW_TASK_CLOCK));
        assert_eq!(vm_events(None)[at.migrations], EventSpec::Software(SW_CPU_MIGRATIONS));
        assert!(
            matches!(&vm_events(None)[at.kvm_exit], EventSpec::Tracepoint { name, filter: None, .. } if name == "kvm_exit")
        );
        let userspace_io = at.tracepoint(Tracepoint::UserspaceIo).unwrap();
        assert_eq!(
            vm_events(None)[userspace_io],
            EventSpec::filtered("kvm", "kvm_userspace_exit", "reason == 2 && errno == 0")
        );
        assert!(at.tracepoint(Tracepoint::InjException).is_none(), "no observed row counts exceptions");
    }

    #[test]
    fn exit_to_entry_spans_are_the_costs_of_their_classes() {
        let page = SharedPage::anonymous(hvstats_abi::ObjectKind::Vp).unwrap();
        let mut counts = vec![None; layout().times + InterceptClass::ALL.len()];
        counts[span_of(InterceptClass::Cpuid).unwrap()] = Some(123_456);
        counts[span_of(InterceptClass::Halt).unwrap()] = Some(5_000_000_000);
        counts[span_of(InterceptClass::Other).unwrap()] = Some(900);
        write_exit_times(&page, &counts);
        assert_eq!(page.get(vp::CPUID_INSTRUCTIONS_COST), 1_234);
        assert_eq!(page.get(vp::HLT_INSTRUCTIONS_COST), 50_000_000);
        assert_eq!(page.get(vp::OTHER_INTERCEPTS_COST), 9);
        // A span not counted leaves its counter alone.
        assert_eq!(page.get(vp::IO_INSTRUCTIONS_COST), 0);
        // Every class with a cost counter has a span, and the catalog says where it comes from.
        for class in InterceptClass::ALL {
            let Some(cost) = class.counter().counter().and_then(Counter::cost) else { continue };
            assert!(span_of(class).is_some(), "{class:?}");
            let observed = catalog::observed(cost).and_then(Maintained::source);
            assert_eq!(observed, Some(Source::KvmExitTime(class)), "{}", cost.name);
        }
    }

    #[test]
    fn exit_classes_fill_other_with_the_rest() {
        let page = SharedPage::anonymous(hvstats_abi::ObjectKind::Vp).unwrap();
        let layout = layout();
        let mut counts = vec![Some(0); layout.classes + InterceptClass::ALL.len() - 1];
        counts[layout.kvm_exit] = Some(100);
        let at = |c: InterceptClass| layout.classes + classified().position(|x| x == c).unwrap();
        counts[at(InterceptClass::Halt)] = Some(7);
        counts[at(InterceptClass::Cpuid)] = Some(50);
        counts[at(InterceptClass::ExternalInterrupt)] = Some(3);
        write_exit_classes(&page, &counts);
        assert_eq!(page.get(vp::HLT_INSTRUCTIONS), 7);
        assert_eq!(page.get(vp::EXTERNAL_INTERRUPTS), 3);
        assert_eq!(page.get(vp::OTHER_INTERCEPTS), 40);
        // CPUID comes from kvm_cpuid, not from kvm_exit.
        assert_eq!(page.get(vp::CPUID_INSTRUCTIONS), 0);
    }
}
