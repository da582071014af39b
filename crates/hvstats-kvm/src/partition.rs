//! A partition: one KVM VM with guest RAM, an in-kernel interrupt controller, a GPA map and N VPs,
//! each with its stats page from the hypervisor instance.
//!
//! [`Partition::new`] builds the VM and its vCPUs; [`Partition::run`] starts one thread per VP,
//! collects the kernel sources into the pages on a cadence while they run, and returns when every
//! VP has stopped or the timeout has passed (stuck VPs are kicked out of KVM_RUN, never waited
//! for). The partition implements [`VpCounterSource`], so the WHv API reads exact values from it
//! at any moment, during or after the run.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant};

use hvstats::whv::{VpCounterSource, VpExtras};
use hvstats::{Hypervisor, PartitionStats, SharedPage};
use hvstats_abi::boot::{self as layout, Mode};
use hvstats_abi::catalog::partition as pt;
use hvstats_abi::source::{SourceKind, maintained_by, maintained_count};
use hvstats_abi::{Counter, ObjectKind};
use kvm_bindings::{KVM_MAX_CPUID_ENTRIES, kvm_cpuid_entry2, kvm_enable_cap};
use kvm_ioctls::{Cap, Kvm, VcpuFd, VmFd};

use crate::accounting::kvm_stat_names;
use crate::error::{Error, kvm};
use crate::gpa_map::GpaMap;
use crate::handlers::Handlers;
use crate::memory::GuestRam;
use crate::modes;
use crate::sources::kvm_stats::KvmStats;
use crate::vp::{self, GuestGate, VpOutcome, VpShared};

/// The partition counters kept from the VM's KVM statistics: the catalog's `KvmStats(Vm(..))` rows.
const FROM_VM_STATS: [&Counter; maintained_count(ObjectKind::Partition, SourceKind::KvmStats)] =
    maintained_by(ObjectKind::Partition, SourceKind::KvmStats);

/// `KVM_CAP_X86_USER_SPACE_MSR` reasons: UNKNOWN | INVAL | FILTER.
const USER_SPACE_MSR_REASONS: u64 = 7;

/// How to build a partition.
#[derive(Clone, Debug)]
pub struct PartitionConfig {
    /// Number of VPs (1 to [`layout::MAX_VPS`]).
    pub vp_count: u32,
    /// Guest RAM in bytes (a multiple of 4 KiB, at least 1 MiB).
    pub memory_bytes: u64,
    /// The CPU mode VPs start in.
    pub mode: Mode,
    /// How long [`Partition::run`] waits for the VPs to stop.
    pub timeout: Duration,
    /// Whether the run loop accounts userspace exits (off only to measure what accounting costs).
    pub accounting: bool,
    /// Whether a partition with hypercall ports has KVM sync the VPs' general and system registers
    /// into `kvm_run` at every exit, so a hypercall needs no register ioctl (off only to measure or
    /// test the ioctl path; without KVM_CAP_SYNC_REGS the ioctls are used anyway).
    pub sync_registers: bool,
    /// How often the collector merges kernel sources into the pages during a run.
    pub collect_interval: Duration,
    /// CPUID entries replacing (same function and index) or extending KVM's supported set.
    pub cpuid: Vec<kvm_cpuid_entry2>,
    /// Guest cycles and instructions retired per VP, counted with the PMU under this allocation
    /// (none: not counted).
    pub hardware_counters: Option<HardwareCounters>,
}

/// A hardware counter allocation the VPs count guest cycles and instructions under.
#[derive(Clone, Debug)]
pub struct HardwareCounters {
    /// The host's shared allocation table.
    pub allocator: Arc<hvstats::hwc::Allocator>,
    /// The allocation (it must cover every processor the VP threads may run on).
    pub handle: hvstats::hwc::CounterSetHandle,
}

impl Default for PartitionConfig {
    fn default() -> Self {
        Self {
            vp_count: 1,
            memory_bytes: 2 << 20,
            mode: Mode::Long,
            timeout: Duration::from_secs(30),
            accounting: true,
            sync_registers: true,
            collect_interval: Duration::from_millis(100),
            cpuid: Vec::new(),
            hardware_counters: None,
        }
    }
}

/// A page a guest can see read-only through an overlay; it must stay mapped while the overlay
/// exists, which holding it in an `Arc` guarantees.
pub trait OverlayBacking: Send + Sync {
    /// Host address of the 4 KiB page.
    fn host_address(&self) -> u64;
}

impl OverlayBacking for SharedPage {
    fn host_address(&self) -> u64 {
        SharedPage::host_address(self) as u64
    }
}

/// A partition's or VP's stats page as an overlay: holding the partition's stats objects keeps
/// the page mapped for as long as the overlay exists.
#[derive(Debug, Clone)]
pub struct StatsPageOverlay {
    stats: Arc<PartitionStats>,
    vp: Option<u32>,
}

impl StatsPageOverlay {
    /// The partition page of `stats`.
    pub fn partition(stats: Arc<PartitionStats>) -> Self {
        Self { stats, vp: None }
    }

    /// The page of VP `index` of `stats`, if it has that VP.
    pub fn vp(stats: Arc<PartitionStats>, index: u32) -> Option<Self> {
        stats.vp_page(index)?;
        Some(Self { stats, vp: Some(index) })
    }

    fn page(&self) -> &SharedPage {
        match self.vp.and_then(|i| self.stats.vp_page(i)) {
            Some(page) => page,
            None => self.stats.page(),
        }
    }
}

impl OverlayBacking for StatsPageOverlay {
    fn host_address(&self) -> u64 {
        self.page().host_address() as u64
    }
}

/// What a run produced.
#[derive(Clone, Debug)]
pub struct RunReport {
    /// Each VP's outcome, by index.
    pub vps: Vec<VpOutcome>,
    /// Wall time of the run.
    pub elapsed: Duration,
}

impl RunReport {
    /// True when any VP faulted or did not stop in time.
    pub fn faulted(&self) -> bool {
        self.vps.iter().any(|v| v.fault.is_some())
    }
}

/// One KVM VM with its VPs and stats objects.
pub struct Partition {
    // Field order is drop order: the VM goes before the RAM and overlays it maps.
    vcpus: Mutex<Vec<VcpuFd>>,
    vm_stats: Option<KvmStats>,
    gpa_map: Mutex<GpaMap>,
    vm: VmFd,
    _kvm: Kvm,
    overlays: Mutex<HashMap<u64, Arc<dyn OverlayBacking>>>,
    ram: GuestRam,
    vps: Vec<VpShared>,
    gate: GuestGate,
    handlers: Handlers,
    sync_regs: u64,
    config: PartitionConfig,
    stats: Arc<PartitionStats>,
    hv: Arc<Hypervisor>,
}

/// The register sets to sync through `kvm_run`: the general and system registers when the
/// partition has hypercall ports (a hypercall then reads its registers and the CPU mode, and writes
/// its result, without an ioctl) and KVM supports both; none otherwise, since KVM copies the synced
/// sets at every exit.
fn sync_regs(kvm_sys: &Kvm, config: &PartitionConfig, handlers: &Handlers) -> u64 {
    let wanted = u64::from(kvm_bindings::KVM_SYNC_X86_REGS | kvm_bindings::KVM_SYNC_X86_SREGS);
    if !config.sync_registers || handlers.hypercall_ports.is_empty() {
        return 0;
    }
    let supported = u64::try_from(kvm_sys.check_extension_int(Cap::SyncRegs)).unwrap_or(0);
    if supported & wanted == wanted { wanted } else { 0 }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Partition {
    /// Creates the VM, its RAM, interrupt controller and vCPUs, and the stats objects in `hv`.
    ///
    /// # Errors
    /// An invalid configuration, a missing KVM capability, or a failed ioctl.
    pub fn new(hv: &Arc<Hypervisor>, config: PartitionConfig, handlers: Handlers) -> Result<Self, Error> {
        if config.vp_count == 0 || config.vp_count > layout::MAX_VPS {
            return Err(Error::Config(format!(
                "{} VPs: between 1 and {} are supported",
                config.vp_count,
                layout::MAX_VPS
            )));
        }
        if config.memory_bytes < 1 << 20 || config.memory_bytes > 3 << 30 {
            return Err(Error::Config(format!(
                "memory of {:#x} bytes: between 1 MiB and 3 GiB",
                config.memory_bytes
            )));
        }
        let kvm_sys = Kvm::new().map_err(Error::OpenKvm)?;
        for (cap, name) in [(Cap::Irqchip, "KVM_CAP_IRQCHIP"), (Cap::UserMemory, "KVM_CAP_USER_MEMORY")] {
            if !kvm_sys.check_extension(cap) {
                return Err(Error::Config(format!("KVM lacks {name}")));
            }
        }
        let vm = kvm_sys.create_vm().map_err(kvm("KVM_CREATE_VM"))?;
        let _ = vm.set_tss_address(0xFFFB_D000);
        vm.create_irq_chip().map_err(kvm("KVM_CREATE_IRQCHIP"))?;
        let mut cap = kvm_enable_cap { cap: kvm_bindings::KVM_CAP_X86_USER_SPACE_MSR, ..Default::default() };
        cap.args[0] = USER_SPACE_MSR_REASONS;
        vm.enable_cap(&cap).map_err(kvm("KVM_ENABLE_CAP(X86_USER_SPACE_MSR)"))?;
        let ram = GuestRam::new(config.memory_bytes)?;
        let gpa_map = GpaMap::new(&vm, ram.host_address(), ram.size())?;
        modes::write_tables(&ram, config.mode)?;
        let supported =
            kvm_sys.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).map_err(kvm("KVM_GET_SUPPORTED_CPUID"))?;
        let mut vcpus = Vec::new();
        for i in 0..config.vp_count {
            let vcpu = vm.create_vcpu(i as u64).map_err(kvm("KVM_CREATE_VCPU"))?;
            let mut cpuid = supported.clone();
            for e in cpuid.as_mut_slice() {
                match e.function {
                    1 => e.ebx = (e.ebx & 0x00FF_FFFF) | (i << 24),
                    0xB | 0x1F => e.edx = i,
                    _ => {}
                }
            }
            let mut entries = cpuid.as_slice().to_vec();
            for o in &config.cpuid {
                match entries.iter_mut().find(|e| e.function == o.function && e.index == o.index) {
                    Some(e) => *e = *o,
                    None => entries.push(*o),
                }
            }
            let cpuid = kvm_bindings::CpuId::from_entries(&entries)
                .map_err(|_| Error::Config("too many CPUID entries".into()))?;
            vcpu.set_cpuid2(&cpuid).map_err(kvm("KVM_SET_CPUID2"))?;
            vcpus.push(vcpu);
        }
        let vm_stats = KvmStats::open(vm.as_raw_fd()).ok();
        let stats = hv
            .create_partition(config.vp_count)
            .map_err(|source| Error::Host { op: "stats pages", source })?;
        // The authority keeps "GPA pages" and the hypervisor's "Total pages" from the RAM size, and
        // counts overlay maps and unmaps as GPA space modifications; setting up RAM is the first.
        stats.set_ram_pages(ram.size() / 4096);
        stats.page().fetch_add(pt::GPA_SPACE_MODIFICATIONS, gpa_map.modifications());
        let vps = (0..config.vp_count).map(VpShared::new).collect();
        let sync_regs = sync_regs(&kvm_sys, &config, &handlers);
        let p = Self {
            vcpus: Mutex::new(vcpus),
            vm_stats,
            gpa_map: Mutex::new(gpa_map),
            vm,
            _kvm: kvm_sys,
            overlays: Mutex::new(HashMap::new()),
            ram,
            vps,
            gate: GuestGate::default(),
            handlers,
            sync_regs,
            config,
            stats,
            hv: hv.clone(),
        };
        p.refresh_partition();
        Ok(p)
    }

    /// The partition's stats objects.
    pub fn stats(&self) -> &Arc<PartitionStats> {
        &self.stats
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &PartitionConfig {
        &self.config
    }

    pub(crate) fn gate(&self) -> &GuestGate {
        &self.gate
    }

    /// The handlers exits are routed to.
    pub fn handlers(&self) -> &Handlers {
        &self.handlers
    }

    /// The register sets (`KVM_SYNC_X86_*` bits) KVM copies into each VP's `kvm_run` at every exit.
    pub(crate) fn sync_regs(&self) -> u64 {
        self.sync_regs
    }

    /// Guest RAM.
    pub fn ram(&self) -> &GuestRam {
        &self.ram
    }

    /// The VM fd (for KVM's VM stats and ioctls the partition does not wrap).
    pub fn vm(&self) -> &VmFd {
        &self.vm
    }

    /// Copies `bytes` into guest RAM at `gpa`.
    ///
    /// # Errors
    /// When they do not fit in RAM.
    pub fn load(&self, gpa: u64, bytes: &[u8]) -> Result<(), Error> {
        self.ram.write("image", gpa, bytes)
    }

    /// Shows `page` read-only at GPA page `gpa_page` (over RAM, or outside it). A guest write to it
    /// exits to userspace as an MMIO write and leaves the page unchanged. Running VPs are held out
    /// of the guest while the slots change, so none sees RAM missing; a handler may call this.
    ///
    /// # Errors
    /// When an overlay is already there or KVM refuses the slot change.
    pub fn add_overlay(&self, gpa_page: u64, page: Arc<dyn OverlayBacking>) -> Result<(), Error> {
        let mut overlays = lock(&self.overlays);
        self.gate.exclusive(&self.vps, || {
            lock(&self.gpa_map).add_overlay(&self.vm, gpa_page, page.host_address())
        })?;
        overlays.insert(gpa_page, page);
        Ok(())
    }

    /// Removes the overlay at GPA page `gpa_page`; RAM under it shows again.
    ///
    /// # Errors
    /// When there is no overlay there or KVM refuses the slot change.
    pub fn remove_overlay(&self, gpa_page: u64) -> Result<(), Error> {
        let mut overlays = lock(&self.overlays);
        self.gate.exclusive(&self.vps, || lock(&self.gpa_map).remove_overlay(&self.vm, gpa_page))?;
        overlays.remove(&gpa_page);
        Ok(())
    }

    /// KVM memory slots in use (RAM pieces and overlays).
    pub fn memory_slots(&self) -> usize {
        lock(&self.gpa_map).slot_count()
    }

    /// KVM memory slots created or deleted so far.
    pub fn memory_slot_changes(&self) -> u64 {
        lock(&self.gpa_map).modifications()
    }

    /// Pages KVM maps for the guest: RAM not hidden by an overlay, plus overlays.
    pub fn mapped_pages(&self) -> u64 {
        lock(&self.gpa_map).gpa_pages()
    }

    /// Merges VP `index`'s kernel sources into its page now. On the VP's own thread (at an exit)
    /// that is the intercept counters a guest can check; from anywhere else, every source (see
    /// [`VpSources`](crate::accounting::VpSources)).
    pub fn refresh(&self, index: u32) -> VpExtras {
        self.refresh_sources(index, false)
    }

    /// Merges VP `index`'s sources into its page: all of them when `everything`, else as
    /// [`refresh`](Self::refresh) decides.
    fn refresh_sources(&self, index: u32, everything: bool) -> VpExtras {
        let Some(shared) = self.vps.get(index as usize) else { return VpExtras::default() };
        let Some(page) = self.stats.vp_page(index) else { return VpExtras::default() };
        if let Some(sources) = lock(&shared.sources).as_mut() {
            let extras = if everything {
                sources.merge(page, &shared.user)
            } else {
                sources.refresh(page, &shared.user)
            };
            shared.exceptions.store(extras.exception_count, Ordering::Relaxed);
        }
        VpExtras { exception_count: shared.exceptions.load(Ordering::Relaxed) }
    }

    /// Brings the partition page's KVM-sourced counters (VM stats) up to date.
    pub fn refresh_partition(&self) {
        let page = self.stats.page();
        if let Some(snap) = self.vm_stats.as_ref().and_then(|s| s.snapshot().ok()) {
            for counter in FROM_VM_STATS {
                let value = kvm_stat_names(counter).iter().map(|name| snap.raw(name)).sum();
                page.set(counter.id, value);
            }
        }
    }

    /// Why tracepoint counters are unavailable for VP `index`, if some are (after it started).
    pub fn unavailable_sources(&self, index: u32) -> Vec<String> {
        let Some(shared) = self.vps.get(index as usize) else { return Vec::new() };
        let guard = lock(&shared.sources);
        let Some(s) = guard.as_ref() else { return Vec::new() };
        crate::sources::tracepoint::Tracepoint::ALL
            .iter()
            .filter_map(|&tp| s.tracepoints().unavailable(tp).map(str::to_string))
            .collect()
    }

    /// Reads VP `index`'s KVM stats by name (for cross-checks), if the vCPU has a stats fd.
    pub fn kvm_stat(&self, index: u32, name: &str) -> Option<u64> {
        let shared = self.vps.get(index as usize)?;
        let guard = lock(&shared.sources);
        let stats = guard.as_ref()?.kvm_stats()?;
        stats.has(name).then(|| stats.snapshot().ok().map(|s| s.raw(name))).flatten()
    }

    /// Starts every VP at `entry` and waits until all have stopped or the timeout has passed.
    ///
    /// # Errors
    /// When the partition already ran or a vCPU cannot be set up.
    pub fn run(&self, entry: u64) -> Result<RunReport, Error> {
        let vcpus = std::mem::take(&mut *lock(&self.vcpus));
        if vcpus.is_empty() {
            return Err(Error::AlreadyRan);
        }
        if self.config.mode == Mode::Real && entry >= 1 << 20 {
            return Err(Error::Config(format!("real-mode entry {entry:#x} is not below 1 MiB")));
        }
        for (i, vcpu) in vcpus.iter().enumerate() {
            let mut sregs = vcpu.get_sregs().map_err(kvm("KVM_GET_SREGS"))?;
            let regs =
                modes::initial_state(self.config.mode, &mut sregs, entry, i as u32, self.config.vp_count);
            vcpu.set_sregs(&sregs).map_err(kvm("KVM_SET_SREGS"))?;
            vcpu.set_regs(&regs).map_err(kvm("KVM_SET_REGS"))?;
            // With the in-kernel irqchip, APs wait for INIT/SIPI; every VP starts running here.
            let runnable = kvm_bindings::kvm_mp_state { mp_state: kvm_bindings::KVM_MP_STATE_RUNNABLE };
            vcpu.set_mp_state(runnable).map_err(kvm("KVM_SET_MP_STATE"))?;
        }
        let start = Instant::now();
        let deadline = start + self.config.timeout;
        let accounting = self.config.accounting;
        let outcomes = std::thread::scope(|s| {
            let (done_tx, done_rx) = mpsc::channel::<usize>();
            let handles: Vec<_> = vcpus
                .into_iter()
                .zip(&self.vps)
                .enumerate()
                .map(|(i, (vcpu, shared))| {
                    let tx = done_tx.clone();
                    s.spawn(move || {
                        let outcome = vp::run(self, shared, vcpu, accounting);
                        let _ = tx.send(i);
                        outcome
                    })
                })
                .collect();
            drop(done_tx);
            let mut remaining = handles.len();
            let mut next_collect = Instant::now() + self.config.collect_interval;
            let mut stopping = false;
            while remaining > 0 {
                let now = Instant::now();
                if !stopping && now >= deadline {
                    stopping = true;
                }
                if stopping {
                    for shared in &self.vps {
                        shared.request_stop();
                    }
                }
                let wake =
                    if stopping { now + Duration::from_millis(20) } else { next_collect.min(deadline) };
                match done_rx.recv_timeout(wake.saturating_duration_since(now)) {
                    Ok(_) => remaining -= 1,
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
                if Instant::now() >= next_collect {
                    for i in 0..self.config.vp_count {
                        self.refresh(i);
                    }
                    self.refresh_partition();
                    // The LP pages' writer is whoever collects; a host without procfs keeps them.
                    let _ = self.hv.refresh_lps();
                    next_collect = Instant::now() + self.config.collect_interval;
                }
            }
            handles
                .into_iter()
                .enumerate()
                .map(|(i, h)| {
                    h.join().unwrap_or_else(|_| VpOutcome {
                        index: i as u32,
                        exit_status: None,
                        serial: Vec::new(),
                        fault: Some(vp::VpFault { reason: "VP thread panicked".into(), rip: 0 }),
                        hardware: None,
                        run_time: Duration::ZERO,
                    })
                })
                .collect::<Vec<_>>()
        });
        // The VPs' final readings (their threads took the last thread times as they ended).
        for i in 0..self.config.vp_count {
            self.refresh_sources(i, true);
        }
        self.refresh_partition();
        Ok(RunReport { vps: outcomes, elapsed: start.elapsed() })
    }
}

impl VpCounterSource for Partition {
    fn stats(&self) -> &PartitionStats {
        &self.stats
    }

    fn refresh_vp(&self, vp_index: u32) -> Result<VpExtras, String> {
        if vp_index >= self.config.vp_count {
            return Err(format!("no VP {vp_index}"));
        }
        // Synchronously, everything, whichever thread asks.
        Ok(self.refresh_sources(vp_index, true))
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.hv.remove_partition(self.stats.id());
    }
}

impl std::fmt::Debug for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partition")
            .field("id", &self.stats.id())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
