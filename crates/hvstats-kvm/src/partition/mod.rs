//! A partition: one KVM VM with guest RAM, an in-kernel interrupt controller, a GPA map and N VPs,
//! each with its stats page from the hypervisor instance.
//!
//! [`Partition::new`] builds the VM and its vCPUs (each with its CPUID table, [`cpuid`]);
//! [`Partition::run`] starts one thread per VP, collects the kernel sources into the pages on a
//! cadence while they run ([`collector`]), and returns when every VP has stopped or the timeout
//! has passed (stuck VPs are kicked out of KVM_RUN, never waited for). The partition implements
//! [`VpCounterSource`], so the WHv API reads exact values from it at any moment, during or after
//! the run.

mod collector;
mod cpuid;

use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hvstats::whv::{RefreshError, VpCounterSource, VpExtras};
use hvstats::{Hypervisor, PartitionStats, SharedPage};
use hvstats_abi::boot::{self as layout, Mode};
use hvstats_abi::catalog::partition as pt;
use hvstats_abi::catalog::{maintained_by, maintained_count};
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::source::SourceKind;
use hvstats_abi::{Counter, ObjectKind};
use kvm_bindings::{KVM_MAX_CPUID_ENTRIES, kvm_cpuid_entry2, kvm_enable_cap};
use kvm_ioctls::{Cap, Kvm, VcpuFd, VmFd};

use crate::error::Error;
pub use crate::guest_space::OverlayBacking;
use crate::guest_space::{self, GuestSpace};
use crate::handlers::Handlers;
use crate::memory::GuestRam;
use crate::modes;
pub use crate::vp::HardwareCounters;
use crate::vp::{Refresh, VpCounters, VpOutcome, VpShared};
use hvstats_sources::kvm_stats::KvmStats;
use hvstats_sources::vcpu_stats::kvm_stat_names;

/// The partition counters kept from the VM's KVM statistics: the catalog's `KvmStats(Vm(..))` rows.
const FROM_VM_STATS: [&Counter; maintained_count(ObjectKind::Partition, SourceKind::KvmStats)] =
    maintained_by(ObjectKind::Partition, SourceKind::KvmStats);

/// `KVM_CAP_X86_USER_SPACE_MSR` reasons: UNKNOWN | INVAL | FILTER.
const USER_SPACE_MSR_REASONS: u64 = 7;

/// Where KVM puts the three pages of the real-mode TSS (Intel needs them below 4 GiB, outside
/// RAM): just below the local APIC and the BIOS area, as QEMU does.
const TSS_ADDRESS: usize = 0xFFFB_D000;

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
    /// Whether KVM syncs the VPs' general registers (and, with hypercall ports, the system
    /// registers) into `kvm_run` at every exit, so a hypercall needs no register ioctl and a fault
    /// report knows the RIP of the last exit (off only to measure or test the ioctl path; without
    /// KVM_CAP_SYNC_REGS the ioctls are used anyway).
    pub sync_registers: bool,
    /// How often the collector merges kernel sources into the pages during a run.
    pub collect_interval: Duration,
    /// CPUID entries replacing (same function and index) or extending KVM's supported set.
    pub cpuid: Vec<kvm_cpuid_entry2>,
    /// Guest cycles and instructions retired per VP, counted with the PMU under this allocation
    /// (none: not counted).
    pub hardware_counters: Option<HardwareCounters>,
    /// The partition's name for readers (`vm` in the exporter's series, `name` in snapshots):
    /// what identifies it across runs. Empty: unnamed.
    pub name: String,
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
            name: String::new(),
        }
    }
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
    /// True when any VP faulted (a fault of the guest or of its handling, not a stop by the host).
    pub fn faulted(&self) -> bool {
        self.vps.iter().any(|v| v.fault.as_ref().is_some_and(|f| f.cause.is_fault()))
    }

    /// True when any VP was still running when the run's deadline passed.
    pub fn timed_out(&self) -> bool {
        self.vps
            .iter()
            .any(|v| v.fault.as_ref().is_some_and(|f| matches!(f.cause, crate::vp::FaultCause::TimedOut)))
    }
}

/// One KVM VM with its VPs and stats objects.
pub struct Partition {
    // Field order is drop order: the vCPUs go before the VM, the VM before the RAM and overlays
    // it maps (see [`GuestSpace`]).
    vcpus: Mutex<Vec<VcpuFd>>,
    vm_stats: Option<KvmStats>,
    space: GuestSpace,
    _kvm: Kvm,
    vps: Vec<VpShared>,
    handlers: Handlers,
    sync_regs: u64,
    config: PartitionConfig,
    stats: Arc<PartitionStats>,
    hv: Arc<Hypervisor>,
    stop_requested: AtomicBool,
    /// The VP counters some VP's sources cannot give on this host, declared unavailable for the
    /// partition's VPs as their threads open their sources.
    missing: Mutex<CounterSet>,
}

/// The register sets to sync through `kvm_run`: the general registers whenever KVM supports it
/// (the run loop then knows the RIP of every exit without an ioctl, which a fault report needs
/// when the faulting exit leaves the registers undefined), and the system registers too when the
/// partition has hypercall ports (a hypercall then reads the CPU mode without an ioctl). KVM copies
/// the synced sets at every exit, so the system registers, four times larger, are synced only
/// where they are used.
fn sync_regs(kvm_sys: &Kvm, config: &PartitionConfig, handlers: &Handlers) -> u64 {
    if !config.sync_registers {
        return 0;
    }
    let regs = u64::from(kvm_bindings::KVM_SYNC_X86_REGS);
    let sregs = u64::from(kvm_bindings::KVM_SYNC_X86_SREGS);
    let supported = u64::try_from(kvm_sys.check_extension_int(Cap::SyncRegs)).unwrap_or(0);
    let wanted = if handlers.hypercall_ports.is_empty() { regs } else { regs | sregs };
    supported & wanted
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
            return Err(Error::VpCount { count: config.vp_count, max: layout::MAX_VPS });
        }
        if config.memory_bytes < 1 << 20 || config.memory_bytes > 3 << 30 {
            return Err(Error::MemorySize { bytes: config.memory_bytes });
        }
        guest_space::install_kick_handler()?;
        let kvm_sys = Kvm::new().map_err(Error::OpenKvm)?;
        for (cap, name) in [(Cap::Irqchip, "KVM_CAP_IRQCHIP"), (Cap::UserMemory, "KVM_CAP_USER_MEMORY")] {
            if !kvm_sys.check_extension(cap) {
                return Err(Error::MissingCapability { name });
            }
        }
        let vm = kvm_sys.create_vm().map_err(Error::CreateVm)?;
        vm.set_tss_address(TSS_ADDRESS).map_err(Error::SetTssAddress)?;
        vm.create_irq_chip().map_err(Error::CreateIrqChip)?;
        let mut cap = kvm_enable_cap { cap: kvm_bindings::KVM_CAP_X86_USER_SPACE_MSR, ..Default::default() };
        cap.args[0] = USER_SPACE_MSR_REASONS;
        vm.enable_cap(&cap).map_err(Error::EnableUserSpaceMsr)?;
        let ram = GuestRam::new(config.memory_bytes)?;
        modes::write_tables(&ram, config.mode)?;
        let space = GuestSpace::new(vm, ram, config.vp_count)?;
        let supported = kvm_sys.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).map_err(Error::SupportedCpuid)?;
        let mut vcpus = Vec::new();
        for i in 0..config.vp_count {
            let vcpu =
                space.vm().create_vcpu(u64::from(i)).map_err(|source| Error::CreateVcpu { vp: i, source })?;
            vcpu.set_cpuid2(&cpuid::vp_cpuid(&supported, i, &config.cpuid)?)
                .map_err(|source| Error::SetCpuid { vp: i, source })?;
            vcpus.push(vcpu);
        }
        // A kernel without binary stats leaves the VM-stat counters unmaintained.
        let vm_stats = KvmStats::open(space.vm().as_raw_fd()).ok();
        let stats = hv.create_partition_named(config.vp_count, &config.name).map_err(Error::StatsPages)?;
        // The authority keeps "GPA pages" and the hypervisor's "Total pages" from the RAM size, and
        // counts overlay maps and unmaps as GPA space modifications; setting up RAM is the first.
        stats.set_ram_pages(space.ram().size() / 4096);
        stats.page().fetch_add(pt::GPA_SPACE_MODIFICATIONS, space.memory_slot_changes());
        let vps = (0..config.vp_count).map(VpShared::new).collect();
        let sync_regs = sync_regs(&kvm_sys, &config, &handlers);
        let p = Self {
            vcpus: Mutex::new(vcpus),
            vm_stats,
            space,
            _kvm: kvm_sys,
            vps,
            handlers,
            sync_regs,
            config,
            stats,
            hv: hv.clone(),
            stop_requested: AtomicBool::new(false),
            missing: Mutex::default(),
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

    /// The handlers exits are routed to.
    pub fn handlers(&self) -> &Handlers {
        &self.handlers
    }

    /// The guest physical address space: RAM and stats overlays.
    pub fn space(&self) -> &GuestSpace {
        &self.space
    }

    /// Guest RAM.
    pub fn ram(&self) -> &GuestRam {
        self.space.ram()
    }

    /// The VM fd (for KVM's VM stats and ioctls the partition does not wrap).
    pub fn vm(&self) -> &VmFd {
        self.space.vm()
    }

    /// Copies `bytes` into guest RAM at `gpa`.
    ///
    /// # Errors
    /// When they do not fit in RAM.
    pub fn load(&self, gpa: u64, bytes: &[u8]) -> Result<(), Error> {
        self.space.ram().write("image", gpa, bytes)
    }

    /// Shows `page` read-only at GPA page `gpa_page`; see [`GuestSpace::add_overlay`].
    ///
    /// # Errors
    /// When an overlay is already there or KVM refuses the slot change.
    pub fn add_overlay(&self, gpa_page: u64, page: Arc<dyn OverlayBacking>) -> Result<(), Error> {
        self.space.add_overlay(gpa_page, page)
    }

    /// Removes the overlay at GPA page `gpa_page`; see [`GuestSpace::remove_overlay`].
    ///
    /// # Errors
    /// When there is no overlay there or KVM refuses the slot change.
    pub fn remove_overlay(&self, gpa_page: u64) -> Result<(), Error> {
        self.space.remove_overlay(gpa_page)
    }

    /// KVM memory slots in use (RAM pieces and overlays).
    pub fn memory_slots(&self) -> usize {
        self.space.memory_slots()
    }

    /// KVM memory slots created or deleted so far.
    pub fn memory_slot_changes(&self) -> u64 {
        self.space.memory_slot_changes()
    }

    /// Pages KVM maps for the guest: RAM not hidden by an overlay, plus overlays.
    pub fn mapped_pages(&self) -> u64 {
        self.space.mapped_pages()
    }

    /// Merges every source of VP `index` into its page now (from any thread but the VP's own,
    /// which refreshes itself at hypercalls); the exception count of that reading.
    pub fn refresh(&self, index: u32) -> VpExtras {
        self.refresh_as(index, Refresh::Everything)
    }

    fn refresh_as(&self, index: u32, mode: Refresh) -> VpExtras {
        match (self.vps.get(index as usize), self.stats.vp_page(index)) {
            (Some(shared), Some(page)) => VpCounters::new(page, shared).refresh(mode),
            _ => VpExtras::default(),
        }
    }

    /// Brings the partition page's KVM-sourced counters (VM stats) up to date.
    pub(crate) fn refresh_partition(&self) {
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
        shared.with_sources(|s| s.unavailable()).unwrap_or_default()
    }

    /// The id of the thread running VP `index`, while it runs (for per-thread readers: schedstat,
    /// perf counters, CPU affinity).
    pub fn vp_thread_id(&self, index: u32) -> Option<libc::pid_t> {
        self.vps.get(index as usize)?.thread_id()
    }

    /// Reads VP `index`'s KVM stats by name (for cross-checks), if the vCPU has a stats fd.
    pub fn kvm_stat(&self, index: u32, name: &str) -> Option<u64> {
        let shared = self.vps.get(index as usize)?;
        shared.with_sources(|s| s.kvm_stat(name)).flatten()
    }
}

impl VpCounterSource for Partition {
    fn stats(&self) -> &PartitionStats {
        &self.stats
    }

    fn refresh_vp(&self, vp_index: u32) -> Result<VpExtras, RefreshError> {
        if vp_index >= self.config.vp_count {
            return Err(RefreshError::NoVp { index: vp_index });
        }
        // Synchronously, everything, whichever thread asks.
        Ok(self.refresh_as(vp_index, Refresh::Everything))
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
