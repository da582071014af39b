//! A virtual processor: its thread, the KVM_RUN loop, and exit classification.
//!
//! Each VP runs on its own thread. The loop enters the guest, classifies the exit, hands it to the
//! handler registered for it ([`crate::handlers`]), and accounts it by class with the time spent in
//! userspace ([`crate::accounting`]). A guest can stop its VP (exit port), fault (triple fault,
//! emulation failure, failed entry, an exit nobody handles), or be stopped from outside: the
//! partition sets `stop`, sets `immediate_exit` in the vCPU's `kvm_run` and signals the thread, which
//! makes KVM_RUN return EINTR wherever the thread is.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, Once};
use std::time::Instant;

use hvstats::hwc::{GuestCounts, VpHardwareCounters};
use kvm_bindings::{KVM_SYNC_X86_REGS, KVM_SYNC_X86_SREGS};
use kvm_ioctls::{SyncReg, VcpuExit, VcpuFd};

use crate::accounting::{ExitAccounting, ExitClass, UserExitCounts, VpSources};
use crate::cycles;
use crate::handlers::{PortAction, VpContext};
use crate::partition::Partition;
use crate::sources::thread_time::gettid;

/// Keeps VPs out of the guest while the partition changes its memory slots.
///
/// A changer closes the gate, kicks every VP that is in KVM_RUN and waits until none is; a VP
/// sets its `in_guest` flag before looking at the gate (both sequentially consistent), so either
/// the changer sees the flag and waits for it, or the VP sees the gate closed and waits.
#[derive(Debug, Default)]
pub(crate) struct GuestGate {
    closed: AtomicBool,
    changer: Mutex<()>,
    opened: std::sync::Condvar,
    waiters: Mutex<()>,
}

impl GuestGate {
    fn closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    fn wait_open(&self, stop: impl Fn() -> bool) {
        let mut g = lock(&self.waiters);
        while self.closed() && !stop() {
            g = self
                .opened
                .wait_timeout(g, std::time::Duration::from_millis(10))
                .map(|r| r.0)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Runs `change` with no VP in the guest. The VP calling this (from a handler) is not in the
    /// guest, so it may.
    pub(crate) fn exclusive<T>(&self, vps: &[VpShared], change: impl FnOnce() -> T) -> T {
        let _changer = lock(&self.changer);
        self.closed.store(true, Ordering::SeqCst);
        // Kicked VPs leave KVM_RUN within microseconds; the bound only keeps a broken kick from
        // hanging the host.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while vps.iter().any(VpShared::in_guest) && std::time::Instant::now() < deadline {
            for vp in vps.iter().filter(|vp| vp.in_guest()) {
                vp.kick();
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        let result = change();
        {
            let _w = lock(&self.waiters);
            self.closed.store(false, Ordering::SeqCst);
        }
        self.opened.notify_all();
        result
    }
}

/// Why a VP stopped other than by writing the exit port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VpFault {
    /// What happened, e.g. "triple fault (KVM_EXIT_SHUTDOWN)".
    pub reason: String,
    /// The guest RIP (IP in real mode) when it happened.
    pub rip: u64,
}

/// How one VP ended.
#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// Guest cycles and instructions retired, when the partition was given hardware counters:
    /// the counts, or why the PMU could not count them (never zeros in their place).
    pub hardware: Option<Result<GuestCounts, String>>,
}

/// Where to kick a running VP thread.
#[derive(Debug, Default)]
struct KickTarget {
    live: bool,
    thread: u64,
    run: usize,
}

/// The state of a VP shared between its thread and the partition.
#[derive(Debug)]
pub(crate) struct VpShared {
    pub(crate) index: u32,
    pub(crate) user: UserExitCounts,
    pub(crate) sources: Mutex<Option<VpSources>>,
    pub(crate) exceptions: AtomicU64,
    stop: AtomicBool,
    /// True while the thread is in (or about to enter) KVM_RUN; see [`GuestGate`].
    in_guest: AtomicBool,
    kick: Mutex<KickTarget>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The signal that interrupts KVM_RUN; its handler does nothing.
fn kick_signal() -> libc::c_int {
    libc::SIGRTMIN() + 3
}

extern "C" fn on_kick(_: libc::c_int) {}

fn install_kick_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: a zeroed sigaction with a handler that does nothing (async-signal-safe) and no
        // SA_RESTART, so KVM_RUN returns EINTR.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_kick as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(kick_signal(), &sa, std::ptr::null_mut());
        }
    });
}

impl VpShared {
    pub(crate) fn new(index: u32) -> Self {
        install_kick_handler();
        Self {
            index,
            user: UserExitCounts::default(),
            sources: Mutex::new(None),
            exceptions: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            in_guest: AtomicBool::new(false),
            kick: Mutex::new(KickTarget::default()),
        }
    }

    /// Asks the VP to stop and kicks it out of KVM_RUN. Safe to repeat.
    pub(crate) fn request_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.kick();
    }

    /// Makes KVM_RUN return (now, or at once when it is next entered) without stopping the VP.
    pub(crate) fn kick(&self) {
        let k = lock(&self.kick);
        if k.live {
            // SAFETY: `run` is the vCPU's kvm_run mapping, alive while `live` is set (the VP thread
            // clears it under this lock before dropping the vCPU). A volatile byte store is what
            // KVM expects of immediate_exit.
            unsafe {
                let run = k.run as *mut kvm_bindings::kvm_run;
                std::ptr::write_volatile(std::ptr::addr_of_mut!((*run).immediate_exit), 1);
            }
            // SAFETY: `thread` is the VP thread's pthread_t; it is not joined while `live` is set.
            unsafe { libc::pthread_kill(k.thread as libc::pthread_t, kick_signal()) };
        }
    }

    /// True while the VP thread is inside KVM_RUN (or about to enter it).
    pub(crate) fn in_guest(&self) -> bool {
        self.in_guest.load(Ordering::SeqCst)
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

enum Step {
    Continue,
    Stop(u32),
    Fault(String),
}

/// Runs VP `shared.index` on the calling thread until it stops, faults or is stopped.
pub(crate) fn run(partition: &Partition, shared: &VpShared, mut vcpu: VcpuFd, accounting: bool) -> VpOutcome {
    let index = shared.index;
    *lock(&shared.sources) = Some(VpSources::open(gettid(), vcpu.as_raw_fd()));
    {
        let mut k = lock(&shared.kick);
        // SAFETY: pthread_self has no preconditions.
        k.thread = unsafe { libc::pthread_self() } as u64;
        k.run = vcpu.get_kvm_run() as *mut kvm_bindings::kvm_run as usize;
        k.live = true;
    }
    let sync = partition.sync_regs();
    for (set, reg) in [(KVM_SYNC_X86_REGS, SyncReg::Register), (KVM_SYNC_X86_SREGS, SyncReg::SystemRegister)]
    {
        if sync & u64::from(set) != 0 {
            vcpu.set_sync_valid_reg(reg);
        }
    }
    let mut hardware = partition
        .config()
        .hardware_counters
        .as_ref()
        .map(|h| VpHardwareCounters::open(&h.allocator, h.handle, 0).map_err(|e| e.to_string()));
    let page = partition.stats().vp_page(index);
    let mut acct = ExitAccounting::new(accounting && page.is_some());
    let mut serial = Vec::new();
    let mut outcome = VpOutcome {
        index,
        exit_status: None,
        serial: Vec::new(),
        fault: None,
        run_time: Default::default(),
        hardware: None,
    };
    let started = Instant::now();
    loop {
        if shared.stopping() {
            let why = if partition.stop_requested() { "stop requested" } else { "timeout" };
            outcome.fault =
                Some(VpFault { reason: format!("stopped before it exited ({why})"), rip: rip(&vcpu) });
            break;
        }
        let (class, step) = step(partition, shared, &mut vcpu, &mut serial, &mut acct);
        if let (Some((class, t0)), Some(page)) = (class, page) {
            acct.record(page, &shared.user, class, cycles::now().wrapping_sub(t0));
        }
        match step {
            Step::Continue => {}
            Step::Stop(status) => {
                outcome.exit_status = Some(status);
                break;
            }
            Step::Fault(reason) => {
                outcome.fault = Some(VpFault { reason, rip: rip(&vcpu) });
                break;
            }
        }
    }
    outcome.run_time = started.elapsed();
    outcome.hardware = hardware.as_mut().map(|h| match h {
        Ok(counters) => counters.read().map_err(|e| format!("reading the hardware counters: {e}")),
        Err(why) => Err(why.clone()),
    });
    if outcome.fault.is_some() {
        // A partition with a faulted VP is being torn down: no longer active.
        partition.stats().set_active(false);
    }
    partition.refresh(index);
    if let Some(s) = lock(&shared.sources).as_mut() {
        s.thread_exited();
    }
    lock(&shared.kick).live = false;
    drop(vcpu);
    outcome.serial = serial;
    outcome
}

fn rip(vcpu: &VcpuFd) -> u64 {
    vcpu.get_regs().map(|r| r.rip).unwrap_or(0)
}

/// One KVM_RUN and the handling of its exit; returns the exit's class and the time its handling
/// started (for accounting), and what to do next.
fn step(
    partition: &Partition,
    shared: &VpShared,
    vcpu: &mut VcpuFd,
    serial: &mut Vec<u8>,
    acct: &mut ExitAccounting,
) -> (Option<(ExitClass, u64)>, Step) {
    let index = shared.index;
    let handlers = partition.handlers();
    // Memory slot changes wait until no VP is in the guest (a guest must never see a slot gap).
    loop {
        shared.in_guest.store(true, Ordering::SeqCst);
        if !partition.gate().closed() {
            break;
        }
        shared.in_guest.store(false, Ordering::SeqCst);
        partition.gate().wait_open(|| shared.stopping());
        if shared.stopping() {
            return (None, Step::Continue);
        }
    }
    let exit = vcpu.run();
    shared.in_guest.store(false, Ordering::SeqCst);
    let t0 = if acct.enabled() { Some(cycles::now()) } else { None };
    let with = |class: ExitClass| t0.map(|t| (class, t));
    match exit {
        Ok(VcpuExit::IoOut(port, data)) => {
            // Usually one access of at most 4 bytes; `rep outs` gives size * count bytes.
            let mut small = [0u8; 8];
            let large;
            let bytes: &[u8] = if data.len() <= small.len() {
                small[..data.len()].copy_from_slice(data);
                &small[..data.len()]
            } else {
                large = data.to_vec();
                &large
            };
            let mut ctx = VpContext { index, vcpu, partition, serial };
            if let Some(h) = handlers.hypercall_ports.get(&port).filter(|h| h.accepts_hypercalls()) {
                if let Some(page) = partition.stats().vp_page(index) {
                    acct.begin_hypercall(page, &shared.user);
                }
                partition.refresh(index);
                let step = match h.hypercall(&mut ctx) {
                    Ok(()) => Step::Continue,
                    Err(e) => Step::Fault(format!("hypercall failed: {e}")),
                };
                return (with(ExitClass::Hypercall), step);
            }
            let step = match handlers.ports.get(&port).map(|h| h.write(&mut ctx, port, bytes)) {
                None | Some(Ok(PortAction::Continue)) => Step::Continue,
                Some(Ok(PortAction::Stop(status))) => Step::Stop(status),
                Some(Err(e)) => Step::Fault(format!("port {port:#x} write: {e}")),
            };
            (with(ExitClass::Io), step)
        }
        Ok(VcpuExit::IoIn(port, data)) => {
            let (ptr, len) = (data.as_mut_ptr(), data.len());
            // `rep ins` asks for size * count bytes at once.
            let mut small = [0xFFu8; 8];
            let mut large = Vec::new();
            let buf: &mut [u8] = if len <= small.len() {
                &mut small[..len]
            } else {
                large.resize(len, 0xFF);
                &mut large
            };
            let mut ctx = VpContext { index, vcpu, partition, serial };
            let result = match handlers.ports.get(&port) {
                Some(h) => h.read(&mut ctx, port, buf),
                None => Ok(()),
            };
            // SAFETY: `ptr` points into this vCPU's kvm_run mapping (the I/O data area of `len`
            // bytes KVM gave us); the mapping lives as long as `vcpu` and the vCPU is not running.
            unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), ptr, len) };
            let step = match result {
                Ok(()) => Step::Continue,
                Err(e) => Step::Fault(format!("port {port:#x} read: {e}")),
            };
            (with(ExitClass::Io), step)
        }
        Ok(VcpuExit::MmioRead(_, data)) => {
            data.fill(0xFF);
            (with(ExitClass::Mmio), Step::Continue)
        }
        Ok(VcpuExit::MmioWrite(gpa, _)) => {
            // A write to a read-only stats overlay lands here and changes nothing; the authority
            // keeps its own record of those.
            partition.stats().record_overlay_write(gpa);
            (with(ExitClass::Mmio), Step::Continue)
        }
        Ok(VcpuExit::X86Rdmsr(e)) => {
            let (msr, data, error) = (e.index, e.data as *mut u64, e.error as *mut u8);
            let mut ctx = VpContext { index, vcpu, partition, serial };
            let value = handlers.msrs.get(&msr).and_then(|h| h.read(&mut ctx, msr));
            // SAFETY: both point into this vCPU's kvm_run mapping, alive with `vcpu`; not running.
            unsafe {
                *data = value.unwrap_or(0);
                *error = u8::from(value.is_none());
            }
            (with(ExitClass::Msr), Step::Continue)
        }
        Ok(VcpuExit::X86Wrmsr(e)) => {
            let (msr, value, error) = (e.index, e.data, e.error as *mut u8);
            let mut ctx = VpContext { index, vcpu, partition, serial };
            let ok = handlers.msrs.get(&msr).is_some_and(|h| h.write(&mut ctx, msr, value));
            // SAFETY: as for RDMSR.
            unsafe { *error = u8::from(!ok) };
            (with(ExitClass::Msr), Step::Continue)
        }
        Ok(VcpuExit::Shutdown) => (None, Step::Fault("triple fault (KVM_EXIT_SHUTDOWN)".into())),
        Ok(VcpuExit::InternalError) => {
            // SAFETY: the exit reason is KVM_EXIT_INTERNAL_ERROR, so `internal` is the active member.
            let sub = unsafe { vcpu.get_kvm_run().__bindgen_anon_1.internal.suberror };
            let what = match sub {
                1 => "instruction emulation failed",
                2 => "simultaneous exceptions",
                3 => "delivery event failed",
                _ => "internal error",
            };
            (None, Step::Fault(format!("{what} (KVM_EXIT_INTERNAL_ERROR, suberror {sub})")))
        }
        Ok(VcpuExit::FailEntry(reason, cpu)) => (
            None,
            Step::Fault(format!("VM entry failed (KVM_EXIT_FAIL_ENTRY, reason {reason:#x}, cpu {cpu})")),
        ),
        Ok(VcpuExit::SystemEvent(kind, _)) => {
            (None, Step::Fault(format!("system event {kind} (KVM_EXIT_SYSTEM_EVENT)")))
        }
        Ok(VcpuExit::Intr) => (None, Step::Continue),
        Ok(VcpuExit::IrqWindowOpen) | Ok(VcpuExit::Hlt) => (with(ExitClass::Other), Step::Continue),
        Ok(other) => {
            let what = format!("{other:?}");
            (with(ExitClass::Other), Step::Fault(format!("unhandled exit {what}")))
        }
        Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
            let run = vcpu.get_kvm_run();
            if !shared.stopping() {
                run.immediate_exit = 0;
            }
            (None, Step::Continue)
        }
        Err(e) => (None, Step::Fault(format!("KVM_RUN failed: {e}"))),
    }
}
