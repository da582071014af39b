//! A virtual processor: its thread, the KVM_RUN loop, and exit classification.
//!
//! Each VP runs on its own thread. The loop enters the guest, classifies the exit, hands it to the
//! handler registered for it ([`crate::handlers`]), and accounts it by class with the time spent in
//! userspace ([`crate::accounting`]). A guest can stop its VP (exit port), fault (triple fault,
//! emulation failure, failed entry, an exit nobody handles), or be stopped from outside: the
//! partition sets `stop`, sets `immediate_exit` in the vCPU's `kvm_run` and signals the thread, which
//! makes KVM_RUN return EINTR wherever the thread is.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use hvstats::error_chain;
use hvstats::whv::VpExtras;
use hvstats::{PartitionStats, SharedPage};
use hvstats_hwc::{GuestCounts, VpHardwareCounters};
use kvm_bindings::{KVM_SYNC_X86_REGS, KVM_SYNC_X86_SREGS};
use kvm_ioctls::{SyncReg, VcpuExit, VcpuFd};

use crate::accounting::{ExitAccounting, UserExit, VpSources};
use crate::cycles;
use crate::guest_space::{GuestSpace, VpPresence};
use crate::handlers::{HandlerError, Handlers, PortAction, VpContext};
use hvstats_abi::counter_set::CounterSet;
use hvstats_sources::counter_source::{VpThread, vp_counters_of};
use hvstats_sources::thread_time::gettid;
use hvstats_sources::user_exits::UserExitCounts;

/// Why a VP stopped other than by writing the exit port, and where.
#[derive(Clone, Debug)]
pub struct VpFault {
    /// What stopped it: a fault of the guest or of its handling, or the host.
    pub cause: FaultCause,
    /// The last guest RIP (IP in real mode) the VP is known to have had: see [`Self::rip_seen`].
    pub rip: u64,
    /// Where [`Self::rip`] was read.
    pub rip_seen: RipSeen,
}

/// Where a handler's error came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandlerSite {
    /// A hypercall's handler.
    Hypercall,
    /// The handler of a write to the port.
    PortWrite(u16),
    /// The handler of a read of the port.
    PortRead(u16),
}

impl std::fmt::Display for HandlerSite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandlerSite::Hypercall => write!(f, "hypercall failed"),
            HandlerSite::PortWrite(port) => write!(f, "port {port:#x} write"),
            HandlerSite::PortRead(port) => write!(f, "port {port:#x} read"),
        }
    }
}

/// What stopped a VP other than its exit port. Only [`TimedOut`](Self::TimedOut) and
/// [`StopRequested`](Self::StopRequested) come from the host; every other cause is a fault.
#[derive(Clone, Debug, thiserror::Error)]
pub enum FaultCause {
    /// A triple fault (`KVM_EXIT_SHUTDOWN`): the registers are undefined after it.
    #[error("triple fault (KVM_EXIT_SHUTDOWN)")]
    TripleFault,
    /// KVM could not go on (`KVM_EXIT_INTERNAL_ERROR`).
    #[error("{} (KVM_EXIT_INTERNAL_ERROR, suberror {suberror})", internal_error_name(*suberror))]
    InternalError {
        /// KVM's suberror: 1 emulation failed, 2 simultaneous exceptions, 3 delivery event failed.
        suberror: u32,
    },
    /// VM entry failed (`KVM_EXIT_FAIL_ENTRY`).
    #[error("VM entry failed (KVM_EXIT_FAIL_ENTRY, reason {reason:#x}, cpu {cpu})")]
    FailedEntry {
        /// The hardware's entry failure reason.
        reason: u64,
        /// The CPU it happened on.
        cpu: u32,
    },
    /// A system event (`KVM_EXIT_SYSTEM_EVENT`: shutdown, reset, crash).
    #[error("system event {kind} (KVM_EXIT_SYSTEM_EVENT)")]
    SystemEvent {
        /// KVM's event type.
        kind: u32,
    },
    /// An exit no handler exists for.
    #[error("unhandled exit {exit}")]
    UnhandledExit {
        /// The exit, as kvm-ioctls names it.
        exit: String,
    },
    /// A handler failed.
    #[error("{site}")]
    Handler {
        /// Which handler.
        site: HandlerSite,
        /// Its error.
        #[source]
        source: Arc<HandlerError>,
    },
    /// KVM_RUN itself failed.
    #[error("KVM_RUN failed")]
    KvmRun(#[source] kvm_ioctls::Error),
    /// The VP was not in the guest space it should run in.
    #[error("no VP {0} in the guest space")]
    NoPresence(u32),
    /// The VP's thread panicked.
    #[error("VP thread panicked")]
    ThreadPanicked,
    /// The run's deadline passed before the VP exited: the host stopped it, not a fault.
    #[error("stopped before it exited (timeout)")]
    TimedOut,
    /// The host asked the run to stop ([`crate::Partition::stop`]): not a fault.
    #[error("stopped before it exited (stop requested)")]
    StopRequested,
}

fn internal_error_name(suberror: u32) -> &'static str {
    match suberror {
        1 => "instruction emulation failed",
        2 => "simultaneous exceptions",
        3 => "delivery event failed",
        _ => "internal error",
    }
}

impl FaultCause {
    /// True for a fault of the guest or of its handling; false when the host stopped the VP (its
    /// deadline, a stop request).
    pub fn is_fault(&self) -> bool {
        !matches!(self, FaultCause::TimedOut | FaultCause::StopRequested)
    }

    /// True when the registers are undefined after it (a triple fault resets the vCPU).
    fn leaves_registers_undefined(&self) -> bool {
        matches!(self, FaultCause::TripleFault)
    }

    /// A short stable name for reports and JSON: "triple-fault", "timeout", ….
    pub fn kind(&self) -> &'static str {
        match self {
            FaultCause::TripleFault => "triple-fault",
            FaultCause::InternalError { .. } => "internal-error",
            FaultCause::FailedEntry { .. } => "failed-entry",
            FaultCause::SystemEvent { .. } => "system-event",
            FaultCause::UnhandledExit { .. } => "unhandled-exit",
            FaultCause::Handler { .. } => "handler-error",
            FaultCause::KvmRun(_) => "kvm-run-failed",
            FaultCause::NoPresence(_) => "no-presence",
            FaultCause::ThreadPanicked => "thread-panicked",
            FaultCause::TimedOut => "timeout",
            FaultCause::StopRequested => "stop-requested",
        }
    }
}

impl VpFault {
    /// The cause with its whole chain of sources, for reports.
    pub fn reason(&self) -> String {
        error_chain(&self.cause)
    }

    /// Where it happened, for reports: "RIP 0x1008", "RIP 0x1004 (at an earlier exit)", "RIP
    /// 0x1000 (at entry)" or "an unknown RIP".
    pub fn location(&self) -> String {
        match self.rip_seen {
            RipSeen::AtFault => format!("RIP {:#x}", self.rip),
            RipSeen::AtEarlierExit | RipSeen::AtEntry => {
                format!("RIP {:#x} (at {})", self.rip, self.rip_seen.as_str())
            }
            RipSeen::Unknown => "an unknown RIP".to_owned(),
        }
    }
}

/// Where a fault report's RIP comes from.
///
/// Most faults leave the registers as they were at the faulting exit. A triple fault does not:
/// the processor's state is undefined after a shutdown, and KVM on AMD resets the vCPU (RIP
/// 0xfff0) before it reports it, so the RIP KVM gives then is none the guest ever had. The report
/// gives the RIP of the last exit before it instead, or the entry point when there was none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RipSeen {
    /// At the exit that stopped the VP.
    AtFault,
    /// At the last return from KVM_RUN before the one that stopped the VP (the faulting exit's
    /// registers are undefined), as the exit's handler left them.
    AtEarlierExit,
    /// Where the VP entered the guest: it had no earlier exit, or its RIP at exits is not known
    /// (the partition does not sync registers through `kvm_run`).
    AtEntry,
    /// Not known (the VP's thread ended abnormally); [`VpFault::rip`] is 0.
    Unknown,
}

impl RipSeen {
    /// A short name for reports: "fault", "earlier exit" or "entry".
    pub fn as_str(self) -> &'static str {
        match self {
            RipSeen::AtFault => "fault",
            RipSeen::AtEarlierExit => "earlier exit",
            RipSeen::AtEntry => "entry",
            RipSeen::Unknown => "unknown",
        }
    }
}

/// The RIP the VP is known to have had at its last exits, kept without an ioctl: read from the
/// registers KVM syncs into `kvm_run` when the partition syncs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LastRip {
    rip: u64,
    seen: RipSeen,
}

impl LastRip {
    /// Before the first entry: the entry point.
    fn entry(rip: u64) -> Self {
        Self { rip, seen: RipSeen::AtEntry }
    }

    /// An exit was handled and the VP is about to re-enter: `synced` is the RIP in `kvm_run` (as
    /// the handlers left it), when KVM syncs the general registers.
    fn exit_handled(&mut self, synced: Option<u64>) {
        if let Some(rip) = synced {
            *self = Self { rip, seen: RipSeen::AtEarlierExit };
        }
    }

    /// The RIP to report for a fault at an exit whose registers are `at_fault` (None when they
    /// could not be read); `defined` is false when the exit leaves them undefined (a shutdown).
    fn for_fault(self, at_fault: Option<u64>, defined: bool) -> (u64, RipSeen) {
        match at_fault {
            Some(rip) if defined => (rip, RipSeen::AtFault),
            _ => (self.rip, self.seen),
        }
    }
}

/// How one VP ended.
#[derive(Clone, Debug, Default)]
pub struct VpOutcome {
    /// The VP index.
    pub index: u32,
    /// The status the guest wrote to the exit port, if it did.
    pub exit_status: Option<u32>,
    /// Bytes the guest wrote to the serial port.
    pub serial: Vec<u8>,
    /// The fault that stopped the VP, if one did.
    pub fault: Option<VpFault>,
    /// Time from the VP's first entry into the guest until it stopped.
    pub run_time: std::time::Duration,
    /// CPU time the VP's thread used over `run_time` (in the guest, in KVM and handling exits),
    /// without the time it waited for a CPU: what a busy host does not inflate.
    pub cpu_time: std::time::Duration,
    /// Guest cycles and instructions retired, when the partition was given hardware counters:
    /// the counts, or why the PMU could not count them (never zeros in their place).
    pub hardware: Option<Result<GuestCounts, HardwareCountError>>,
}

/// Why a VP's guest cycles and instructions were not counted.
#[derive(Clone, Debug, thiserror::Error)]
pub enum HardwareCountError {
    /// The VP thread could not count under the allocation.
    #[error("cannot count under the hardware counter allocation")]
    Open(#[source] Arc<hvstats_hwc::Unavailable>),
    /// The counters could not be read when the VP stopped.
    #[error("reading the hardware counters")]
    Read(#[source] Arc<std::io::Error>),
}

/// A hardware counter allocation the VPs count guest cycles and instructions under.
#[derive(Clone, Debug)]
pub struct HardwareCounters {
    /// The host's shared allocation table.
    pub allocator: Arc<hvstats_hwc::Allocator>,
    /// The allocation (it must cover every processor the VP threads may run on).
    pub handle: hvstats_hwc::CounterSetHandle,
}

/// The state of a VP its thread and the partition share: the run loop's own counts and the
/// VP's kernel sources (opened by its thread when it starts).
#[derive(Debug)]
pub(crate) struct VpShared {
    pub(crate) index: u32,
    pub(crate) user: Arc<UserExitCounts>,
    sources: Mutex<Option<VpSources>>,
    /// The VP thread's id while it runs the vCPU, 0 before and after.
    tid: AtomicI32,
}

/// Who merges a VP's sources into its page, which decides what is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refresh {
    /// The VP's own thread, before a hypercall and as it ends: the intercept counters a guest can
    /// check ([`VpSources::merge_exits`]).
    OwnThread,
    /// Any other thread (the collector, the WHv API, the end of a run): every source
    /// ([`VpSources::merge`]).
    Everything,
}

impl VpShared {
    pub(crate) fn new(index: u32) -> Self {
        Self { index, user: Arc::default(), sources: Mutex::new(None), tid: AtomicI32::new(0) }
    }

    /// The VP thread's id while it runs the vCPU.
    pub(crate) fn thread_id(&self) -> Option<libc::pid_t> {
        Some(self.tid.load(Ordering::SeqCst)).filter(|&tid| tid != 0)
    }

    /// Merges the VP's sources into `page` as `mode` says; the exception count of the reading
    /// (0 before the VP started).
    fn refresh(&self, page: &SharedPage, mode: Refresh) -> VpExtras {
        match lock(&self.sources).as_mut() {
            Some(sources) => match mode {
                Refresh::OwnThread => sources.merge_exits(page),
                Refresh::Everything => sources.merge(page),
            },
            None => VpExtras::default(),
        }
    }

    /// Runs `f` on the VP's sources, once its thread opened them.
    pub(crate) fn with_sources<T>(&self, f: impl FnOnce(&VpSources) -> T) -> Option<T> {
        lock(&self.sources).as_ref().map(f)
    }
}

/// A VP's counters as one value: its page, the run loop's own counts (the page's single writer)
/// and its kernel sources. The run loop records exits and refreshes through it, and the partition
/// (collector, WHv API, end of run) refreshes through it: one merge, whoever calls.
#[derive(Clone, Copy, Debug)]
pub(crate) struct VpCounters<'a> {
    page: &'a SharedPage,
    shared: &'a VpShared,
}

impl<'a> VpCounters<'a> {
    /// The counters of the VP whose page is `page` and shared state `shared`.
    pub(crate) fn new(page: &'a SharedPage, shared: &'a VpShared) -> Self {
        Self { page, shared }
    }

    /// Counts a hypercall as it begins (see [`ExitAccounting::begin_hypercall`]).
    fn begin_hypercall(self, acct: &mut ExitAccounting) {
        acct.begin_hypercall(self.page, &self.shared.user);
    }

    /// Records one userspace exit (see [`ExitAccounting::record`]).
    #[inline]
    fn record(self, acct: &mut ExitAccounting, class: UserExit, ticks: u64) {
        acct.record(self.page, &self.shared.user, class, ticks);
    }

    /// Merges the VP's sources into its page as `mode` says; the exception count of the
    /// reading (0 before the VP started).
    pub(crate) fn refresh(self, mode: Refresh) -> VpExtras {
        self.shared.refresh(self.page, mode)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a VP thread needs of its partition: its page, the handlers, the guest space (RAM, the
/// gate, its presence), the partition's stats object, and how to run.
pub(crate) struct VpEnv<'a> {
    /// The VP's stats page, when the instance has one for it.
    pub(crate) page: Option<&'a SharedPage>,
    /// The partition's stats objects (overlay writes, the active flag).
    pub(crate) stats: &'a PartitionStats,
    /// The handlers exits are routed to.
    pub(crate) handlers: &'a Handlers,
    /// Guest memory and the gate.
    pub(crate) space: &'a GuestSpace,
    /// The register sets (`KVM_SYNC_X86_*` bits) KVM copies into `kvm_run` at every exit.
    pub(crate) sync_regs: u64,
    /// Whether userspace exits are accounted.
    pub(crate) accounting: bool,
    /// The hardware counter allocation to count guest cycles and instructions under.
    pub(crate) hardware: Option<&'a HardwareCounters>,
    /// Set by [`crate::Partition::stop`]: a VP stopped now was stopped on request, not by the
    /// timeout.
    pub(crate) stop_requested: &'a AtomicBool,
    /// The VP counters a VP's sources could not give, so far (the partition declares them).
    pub(crate) missing: &'a Mutex<CounterSet>,
}

enum Step {
    Continue,
    Stop(u32),
    Fault(FaultCause),
}

/// The VP counters of the kinds of source a VP opens: what a VP lacks when none of its sources
/// gives them.
fn from_vp_sources() -> CounterSet {
    use hvstats_abi::source::SourceKind as K;
    vp_counters_of(&[K::Tracepoint, K::KvmStats, K::ThreadTime, K::PerfSoftware, K::HostFaults])
}

/// Declares unavailable, for the partition's VPs, what `sources` cannot give on this host (a
/// tracepoint tracefs lacks, a statistic this kernel does not keep): readers show it absent, not
/// as a 0 nothing measured.
fn declare_missing(env: &VpEnv<'_>, sources: &VpSources) {
    let mut missing = lock(env.missing);
    let now = missing.union(&from_vp_sources().difference(sources.given()));
    if now != *missing {
        *missing = now;
        env.stats.set_unavailable(&missing.ids().collect::<Vec<_>>());
    }
}

/// The calling thread's CPU time (0 when it cannot be read: CLOCK_THREAD_CPUTIME_ID always
/// exists on Linux).
fn thread_cpu_time() -> std::time::Duration {
    hvstats_host::os::clock_time(libc::CLOCK_THREAD_CPUTIME_ID).unwrap_or_default()
}

/// Runs VP `shared.index` on the calling thread until it stops, faults or is stopped.
pub(crate) fn run(env: &VpEnv<'_>, shared: &VpShared, mut vcpu: VcpuFd) -> VpOutcome {
    let index = shared.index;
    let Some(presence) = env.space.vp(index) else {
        let rip = rip(&vcpu).unwrap_or(0);
        let fault = VpFault { cause: FaultCause::NoPresence(index), rip, rip_seen: RipSeen::AtEntry };
        return VpOutcome { index, fault: Some(fault), ..VpOutcome::default() };
    };
    enter(env, shared, presence, &mut vcpu);
    let hardware = env.hardware.map(|h| VpHardwareCounters::open(&h.allocator, h.handle, 0));
    let mut service = ExitService {
        env,
        index,
        counters: env.page.map(|page| VpCounters::new(page, shared)),
        serial: Vec::new(),
        acct: ExitAccounting::new(env.accounting && env.page.is_some()),
    };
    let started = Instant::now();
    let started_cpu = thread_cpu_time();
    let ended = service.until_stopped(presence, &mut vcpu);
    let outcome = VpOutcome {
        index,
        exit_status: ended.as_ref().ok().copied(),
        fault: ended.err(),
        run_time: started.elapsed(),
        cpu_time: thread_cpu_time().saturating_sub(started_cpu),
        hardware: hardware.map(|h| match h {
            Ok(mut counters) => counters.read().map_err(|e| HardwareCountError::Read(Arc::new(e))),
            Err(why) => Err(HardwareCountError::Open(Arc::new(why))),
        }),
        serial: Vec::new(),
    };
    leave(env, shared, presence, service.counters, outcome.fault.as_ref());
    drop(vcpu);
    VpOutcome { serial: service.serial, ..outcome }
}

/// Makes the calling thread VP `shared.index`'s: opens its sources (declaring what they cannot
/// give), enters the guest space, publishes the thread's id and asks KVM to sync the registers
/// the partition syncs.
fn enter(env: &VpEnv<'_>, shared: &VpShared, presence: &VpPresence, vcpu: &mut VcpuFd) {
    let thread = VpThread { tid: gettid(), vcpu_fd: vcpu.as_raw_fd(), user: shared.user.clone() };
    let sources = VpSources::open(&thread, shared.index);
    declare_missing(env, &sources);
    *lock(&shared.sources) = Some(sources);
    presence.enter(vcpu.get_kvm_run());
    shared.tid.store(thread.tid, Ordering::SeqCst);
    for (set, reg) in [(KVM_SYNC_X86_REGS, SyncReg::Register), (KVM_SYNC_X86_SREGS, SyncReg::SystemRegister)]
    {
        if env.sync_regs & u64::from(set) != 0 {
            vcpu.set_sync_valid_reg(reg);
        }
    }
}

/// Ends the VP's run on its thread: the partition's stats say why a VP stopped other than by its
/// exit port, the page gets its last values, and the sources and the guest space let the thread go.
fn leave(
    env: &VpEnv<'_>,
    shared: &VpShared,
    presence: &VpPresence,
    counters: Option<VpCounters<'_>>,
    fault: Option<&VpFault>,
) {
    if let Some(fault) = fault {
        // A partition with a faulted VP is being torn down: no longer active for guests, while
        // root readers keep its final values and see why it stopped.
        let what = if fault.cause.is_fault() { "faulted" } else { "was stopped" };
        env.stats.stop(&format!("VP {} {what}: {}", shared.index, fault.reason()));
    }
    if let Some(counters) = counters {
        counters.refresh(Refresh::OwnThread);
    }
    if let Some(s) = lock(&shared.sources).as_mut() {
        s.thread_exiting();
    }
    shared.tid.store(0, Ordering::SeqCst);
    presence.leave();
}

/// The RIP now (KVM_GET_REGS also when registers are synced: it is exact between runs).
fn rip(vcpu: &VcpuFd) -> Option<u64> {
    vcpu.get_regs().map(|r| r.rip).ok()
}

/// What serves one VP's exits on its thread: the partition's handlers and stats, and the VP's
/// counters, serial output and exit accounting.
struct ExitService<'a> {
    env: &'a VpEnv<'a>,
    index: u32,
    counters: Option<VpCounters<'a>>,
    serial: Vec<u8>,
    acct: ExitAccounting,
}

impl<'a> ExitService<'a> {
    /// Enters the guest again and again until the guest stops its VP (its exit status), a fault
    /// stops it, or the partition does (the fault, with the RIP it was last known at).
    fn until_stopped(&mut self, presence: &VpPresence, vcpu: &mut VcpuFd) -> Result<u32, VpFault> {
        let mut last_rip = LastRip::entry(rip(vcpu).unwrap_or(0));
        let synced_regs = self.env.sync_regs & u64::from(KVM_SYNC_X86_REGS) != 0;
        let mut entered = false;
        loop {
            if entered && synced_regs {
                last_rip.exit_handled(Some(vcpu.sync_regs_mut().regs.rip));
            }
            if presence.stopping() {
                let cause = match self.env.stop_requested.load(Ordering::SeqCst) {
                    true => FaultCause::StopRequested,
                    false => FaultCause::TimedOut,
                };
                let (rip, rip_seen) = last_rip.for_fault(rip(vcpu), true);
                return Err(VpFault { cause, rip, rip_seen });
            }
            entered = true;
            match self.step(presence, vcpu) {
                Step::Continue => {}
                Step::Stop(status) => return Ok(status),
                Step::Fault(cause) => {
                    let (rip, rip_seen) = match cause.leaves_registers_undefined() {
                        true => last_rip.for_fault(None, false),
                        false => last_rip.for_fault(rip(vcpu), true),
                    };
                    return Err(VpFault { cause, rip, rip_seen });
                }
            }
        }
    }

    /// One KVM_RUN, the handling of its exit and its accounting (the exit's class and the time
    /// its handling took); what to do next.
    #[inline]
    fn step(&mut self, presence: &VpPresence, vcpu: &mut VcpuFd) -> Step {
        // Memory slot changes wait until no VP is in the guest (a guest must never see a slot gap).
        if !presence.enter_guest(self.env.space.gate()) {
            return Step::Continue;
        }
        let exit = vcpu.run();
        presence.left_guest();
        let t0 = if self.acct.enabled() { Some(cycles::now()) } else { None };
        let (class, step) = match exit {
            Ok(VcpuExit::IoOut(port, data)) => {
                let (mut small, mut large) = ([0u8; 8], Vec::new());
                let bytes = copied(data, &mut small, &mut large);
                self.port_write(vcpu, port, bytes)
            }
            Ok(VcpuExit::IoIn(port, data)) => {
                let (ptr, len) = (data.as_mut_ptr(), data.len());
                // SAFETY: `ptr` points into this vCPU's kvm_run mapping (the I/O data area of
                // `len` bytes KVM gave us); the mapping lives as long as `vcpu`, not running.
                (Some(UserExit::Io), unsafe { self.port_read(vcpu, port, ptr, len) })
            }
            Ok(VcpuExit::MmioRead(_, data)) => {
                data.fill(0xFF);
                (Some(UserExit::Mmio), Step::Continue)
            }
            Ok(VcpuExit::MmioWrite(gpa, _)) => {
                // A write to a read-only stats overlay: it changes nothing, the authority records it.
                self.env.stats.record_overlay_write(gpa);
                (Some(UserExit::Mmio), Step::Continue)
            }
            Ok(VcpuExit::X86Rdmsr(e)) => {
                let (msr, data, error) = (e.index, e.data as *mut u64, e.error as *mut u8);
                // SAFETY: both point into this vCPU's kvm_run mapping, alive with `vcpu`; not running.
                unsafe { self.msr_read(vcpu, msr, data, error) }
            }
            Ok(VcpuExit::X86Wrmsr(e)) => {
                let (msr, value, error) = (e.index, e.data, e.error as *mut u8);
                // SAFETY: as for RDMSR.
                unsafe { self.msr_write(vcpu, msr, value, error) }
            }
            Ok(VcpuExit::IrqWindowOpen | VcpuExit::Hlt) => (Some(UserExit::Other), Step::Continue),
            Ok(VcpuExit::Intr) => (None, Step::Continue),
            Ok(VcpuExit::Shutdown) => (None, Step::Fault(FaultCause::TripleFault)),
            Ok(VcpuExit::InternalError) => (None, Step::Fault(internal_error(vcpu))),
            Ok(VcpuExit::FailEntry(reason, cpu)) => {
                (None, Step::Fault(FaultCause::FailedEntry { reason, cpu }))
            }
            Ok(VcpuExit::SystemEvent(kind, _)) => (None, Step::Fault(FaultCause::SystemEvent { kind })),
            Ok(other) => {
                (Some(UserExit::Other), Step::Fault(FaultCause::UnhandledExit { exit: format!("{other:?}") }))
            }
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                (None, interrupted(presence, vcpu))
            }
            Err(e) => (None, Step::Fault(FaultCause::KvmRun(e))),
        };
        if let (Some(class), Some(t0), Some(counters)) = (class, t0, self.counters) {
            counters.record(&mut self.acct, class, cycles::now().wrapping_sub(t0));
        }
        step
    }

    /// What the handlers see of the VP while it is out of the guest.
    #[inline]
    fn context<'v>(&'v mut self, vcpu: &'v mut VcpuFd) -> VpContext<'v> {
        VpContext {
            index: self.index,
            vcpu,
            space: self.env.space,
            stats: self.env.stats,
            serial: &mut self.serial,
        }
    }

    /// A write of `bytes` to `port`: a hypercall when the port takes them (counted as it begins,
    /// with the page refreshed for the guest to check), otherwise the port's handler.
    #[inline]
    fn port_write(&mut self, vcpu: &mut VcpuFd, port: u16, bytes: &[u8]) -> (Option<UserExit>, Step) {
        let handlers = self.env.handlers;
        if let Some(h) = handlers.hypercall_ports.get(&port).filter(|h| h.accepts_hypercalls()) {
            if let Some(counters) = self.counters {
                counters.begin_hypercall(&mut self.acct);
                counters.refresh(Refresh::OwnThread);
            }
            let step = match h.hypercall(&mut self.context(vcpu)) {
                Ok(()) => Step::Continue,
                Err(e) => Step::Fault(handler_fault(HandlerSite::Hypercall, e)),
            };
            return (Some(UserExit::Hypercall), step);
        }
        let step = match handlers.ports.get(&port).map(|h| h.write(&mut self.context(vcpu), port, bytes)) {
            None | Some(Ok(PortAction::Continue)) => Step::Continue,
            Some(Ok(PortAction::Stop(status))) => Step::Stop(status),
            Some(Err(e)) => Step::Fault(handler_fault(HandlerSite::PortWrite(port), e)),
        };
        (Some(UserExit::Io), step)
    }

    /// A read of `len` bytes from `port` (all ones where no handler answers), stored at `data`.
    ///
    /// # Safety
    /// `data` points to `len` writable bytes of the vCPU's `kvm_run` area, which outlive the call.
    #[inline]
    unsafe fn port_read(&mut self, vcpu: &mut VcpuFd, port: u16, data: *mut u8, len: usize) -> Step {
        // `rep ins` asks for size * count bytes at once.
        let mut small = [0xFFu8; 8];
        let mut large = Vec::new();
        let buf: &mut [u8] = if len <= small.len() {
            &mut small[..len]
        } else {
            large.resize(len, 0xFF);
            &mut large
        };
        let result = match self.env.handlers.ports.get(&port) {
            Some(h) => h.read(&mut self.context(vcpu), port, buf),
            None => Ok(()),
        };
        // SAFETY: as the caller promises.
        unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), data, len) };
        match result {
            Ok(()) => Step::Continue,
            Err(e) => Step::Fault(handler_fault(HandlerSite::PortRead(port), e)),
        }
    }

    /// RDMSR of `msr`: its handler's value at `data`, or a #GP (`error` set) when none answers.
    ///
    /// # Safety
    /// `data` and `error` point into the vCPU's `kvm_run` area, which outlives the call.
    #[inline]
    unsafe fn msr_read(
        &mut self,
        vcpu: &mut VcpuFd,
        msr: u32,
        data: *mut u64,
        error: *mut u8,
    ) -> (Option<UserExit>, Step) {
        let handlers = self.env.handlers;
        let value = handlers.msrs.get(&msr).and_then(|h| h.read(&mut self.context(vcpu), msr));
        // SAFETY: as the caller promises.
        unsafe {
            *data = value.unwrap_or(0);
            *error = u8::from(value.is_none());
        }
        (Some(UserExit::Msr), Step::Continue)
    }

    /// WRMSR of `value` to `msr`: a #GP (`error` set) unless its handler takes it.
    ///
    /// # Safety
    /// `error` points into the vCPU's `kvm_run` area, which outlives the call.
    #[inline]
    unsafe fn msr_write(
        &mut self,
        vcpu: &mut VcpuFd,
        msr: u32,
        value: u64,
        error: *mut u8,
    ) -> (Option<UserExit>, Step) {
        let handlers = self.env.handlers;
        let ok = handlers.msrs.get(&msr).is_some_and(|h| h.write(&mut self.context(vcpu), msr, value));
        // SAFETY: as the caller promises.
        unsafe { *error = u8::from(!ok) };
        (Some(UserExit::Msr), Step::Continue)
    }
}

/// `data` copied out of the vCPU's `kvm_run` area (so the handlers may use the vCPU): into
/// `small` without allocating for the usual access of at most 4 bytes, into `large` for what
/// `rep outs` gives (size * count bytes).
#[inline]
fn copied<'b>(data: &[u8], small: &'b mut [u8; 8], large: &'b mut Vec<u8>) -> &'b [u8] {
    match small.get_mut(..data.len()) {
        Some(small) => {
            small.copy_from_slice(data);
            small
        }
        None => {
            large.extend_from_slice(data);
            large
        }
    }
}

/// The fault of a `KVM_EXIT_INTERNAL_ERROR`, with KVM's suberror.
fn internal_error(vcpu: &mut VcpuFd) -> FaultCause {
    // SAFETY: the exit reason is KVM_EXIT_INTERNAL_ERROR, so `internal` is the active member.
    let suberror = unsafe { vcpu.get_kvm_run().__bindgen_anon_1.internal.suberror };
    FaultCause::InternalError { suberror }
}

/// KVM_RUN returned without entering (a signal, `immediate_exit`): the next entry goes into the
/// guest again unless the VP is being stopped.
fn interrupted(presence: &VpPresence, vcpu: &mut VcpuFd) -> Step {
    if !presence.stopping() {
        vcpu.get_kvm_run().immediate_exit = 0;
    }
    Step::Continue
}

fn handler_fault(site: HandlerSite, error: HandlerError) -> FaultCause {
    FaultCause::Handler { site, source: Arc::new(error) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shutdown_reports_the_rip_of_the_last_exit_before_it() {
        let mut last = LastRip::entry(0x1000);
        // Before any exit the entry point is all that is known.
        assert_eq!(last.for_fault(None, false), (0x1000, RipSeen::AtEntry));
        // Without synced registers the exits teach nothing.
        last.exit_handled(None);
        assert_eq!(last.for_fault(Some(0xfff0), false), (0x1000, RipSeen::AtEntry));
        last.exit_handled(Some(0x1004));
        last.exit_handled(Some(0x1010));
        // KVM's registers after a shutdown (0xfff0 after AMD's reset, or garbage) are not used.
        assert_eq!(last.for_fault(Some(0xfff0), false), (0x1010, RipSeen::AtEarlierExit));
        assert_eq!(last.for_fault(Some(u64::MAX), false), (0x1010, RipSeen::AtEarlierExit));
    }

    #[test]
    fn other_faults_report_the_rip_at_the_fault_when_it_can_be_read() {
        let mut last = LastRip::entry(0x1000);
        last.exit_handled(Some(0x1004));
        assert_eq!(last.for_fault(Some(0x1008), true), (0x1008, RipSeen::AtFault));
        // KVM_GET_REGS failed: the last known RIP, said to be such.
        assert_eq!(last.for_fault(None, true), (0x1004, RipSeen::AtEarlierExit));
    }

    #[test]
    fn a_fault_location_says_where_its_rip_was_seen() {
        let at = |rip_seen| VpFault { cause: FaultCause::TimedOut, rip: 0x1008, rip_seen }.location();
        assert_eq!(at(RipSeen::AtFault), "RIP 0x1008");
        assert_eq!(at(RipSeen::AtEarlierExit), "RIP 0x1008 (at earlier exit)");
        assert_eq!(at(RipSeen::AtEntry), "RIP 0x1008 (at entry)");
        assert_eq!(at(RipSeen::Unknown), "an unknown RIP");
    }
}
