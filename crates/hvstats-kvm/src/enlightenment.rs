//! Wires the Hyper-V interface ([`crate::hyperv`]) into a partition's run loop: the CPUID leaves
//! go into the partition's CPUID table, the synthetic MSRs and the hypercall port into its
//! handlers, and each hypercall into [`hvstats::hypercall::dispatch`], whose stats overlays become
//! read-only KVM memory slots.
//!
//! The hypercall registers follow the TLFS: in long mode RCX = input value, RDX = input GPA, R8 =
//! output GPA, result in RAX; in 32-bit mode EDX:EAX = input value, EBX:ECX = input GPA, EDI:ESI =
//! output GPA, result in EDX:EAX. Every hypercall is counted in the caller's VP page before it is
//! handled (Hypercalls/sec by the run loop, the class counter here), and the VP's kernel sources are
//! merged into its page first, so a guest reading its page after a hypercall sees exact values.

use std::sync::{Arc, Mutex};

use hvstats::hypercall::{self, CallerContext, GuestMemory, NotRam, OverlayError, StatsOverlays};
use hvstats::{Hypervisor, MappedPage, SharedPage};
use hvstats_abi::catalog::hypercall_class_counter;
use hvstats_abi::hypercall::{HypercallClass, HypercallInput, PartitionPrivileges};
use hvstats_abi::source::RunLoopCount;
use hvstats_abi::status::HvStatus;
use kvm_bindings::kvm_cpuid_entry2;

use crate::guest_space::{GuestSpace, OverlayBacking};
use crate::handlers::{HandlerError, Handlers, HypercallHandler, MsrHandler, VpContext};
use crate::hyperv::{
    Enlightenment, HYPERCALL_CODE, HYPERCALL_PORT, MsrEffect, SYNTHETIC_MSRS, SyntheticMsrs,
};
use crate::memory::GuestRam;
use crate::partition::PartitionConfig;

/// Pages of a partition's GPA space: the 4 GiB the VMM's identity map covers. A stats page mapped
/// at or beyond it is recorded but not accessible (seed 003).
pub const GPA_SPACE_PAGES: u64 = 1 << 20;

/// The Hyper-V interface of one partition.
#[derive(Debug)]
pub struct HyperV {
    hypervisor: Arc<Hypervisor>,
    privileges: PartitionPrivileges,
    msrs: Mutex<SyntheticMsrs>,
}

impl HyperV {
    /// The interface of a guest partition of `hypervisor`, with AccessStats when `access_stats`.
    pub fn new(hypervisor: Arc<Hypervisor>, access_stats: bool) -> Arc<Self> {
        Arc::new(Self {
            hypervisor,
            privileges: Enlightenment::guest_privileges(access_stats),
            msrs: Mutex::new(SyntheticMsrs::default()),
        })
    }

    /// Adds the hypervisor CPUID leaves to `config` and routes the synthetic MSRs and the hypercall
    /// port to this interface.
    pub fn install(self: &Arc<Self>, config: &mut PartitionConfig, handlers: &mut Handlers) {
        let lp_count = hvstats::lp::online_cpus().len() as u32;
        let e = Enlightenment { privileges: self.privileges, vp_count: config.vp_count, lp_count };
        config.cpuid.extend(e.cpuid_leaves().iter().map(|l| kvm_cpuid_entry2 {
            function: l.function,
            index: l.index,
            eax: l.eax,
            ebx: l.ebx,
            ecx: l.ecx,
            edx: l.edx,
            ..Default::default()
        }));
        for msr in SYNTHETIC_MSRS {
            handlers.add_msr(msr, self.clone());
        }
        handlers.add_hypercall_port(HYPERCALL_PORT as u16, self.clone());
    }

    fn msrs(&self) -> std::sync::MutexGuard<'_, SyntheticMsrs> {
        self.msrs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl MsrHandler for HyperV {
    fn read(&self, vp: &mut VpContext<'_>, msr: u32) -> Option<u64> {
        self.msrs().read(msr, vp.index).ok()
    }

    fn write(&self, vp: &mut VpContext<'_>, msr: u32, value: u64) -> bool {
        let ram = vp.space.ram();
        let mut msrs = self.msrs();
        match msrs.write(msr, value, ram.size()) {
            Ok(MsrEffect::InstallHypercallPage(gpa)) => {
                ram.write("hypercall page", gpa, &HYPERCALL_CODE).is_ok()
            }
            Ok(MsrEffect::None | MsrEffect::RemoveHypercallPage) => true,
            Err(_) => false,
        }
    }
}

/// Counts a hypercall of `class` in the caller's VP page, under the counter the catalog gives the
/// class (seed 001).
pub(crate) fn count_hypercall_class(page: &SharedPage, class: HypercallClass) {
    if let Some(counter) = hypercall_class_counter(class) {
        page.add(counter, 1);
    }
}

impl HypercallHandler for HyperV {
    /// The port is the hypercall page's: a write there is a hypercall only once the guest has
    /// enabled the page (after setting GUEST_OS_ID), as `vmcall` would be on Hyper-V.
    fn accepts_hypercalls(&self) -> bool {
        self.msrs().hypercall_page().is_some()
    }

    fn hypercall(&self, vp: &mut VpContext<'_>) -> Result<(), HandlerError> {
        let mut regs = vp.regs()?;
        let long_mode = vp.long_mode()?;
        let join = |hi: u64, lo: u64| (hi << 32) | (lo & 0xFFFF_FFFF);
        let (input, input_gpa, output_gpa) = if long_mode {
            (regs.rcx, regs.rdx, regs.r8)
        } else {
            (join(regs.rdx, regs.rax), join(regs.rbx, regs.rcx), join(regs.rdi, regs.rsi))
        };
        let input = HypercallInput(input);
        if let Some(page) = vp.stats.vp_page(vp.index) {
            count_hypercall_class(page, input.code().class());
        }
        let ctx =
            CallerContext::guest(&self.hypervisor, vp.stats.id(), vp.index, self.privileges, GPA_SPACE_PAGES);
        let output = hypercall::dispatch(
            &ctx,
            input,
            input_gpa,
            output_gpa,
            &mut RamAccess(vp.space.ram()),
            &mut KvmOverlays(vp.space),
        );
        if output.status() != HvStatus::SUCCESS
            && let Some(page) = vp.stats.vp_page(vp.index)
        {
            page.add(RunLoopCount::FailedHypercalls.counter(), 1);
        }
        if long_mode {
            regs.rax = output.0;
        } else {
            regs.rax = output.0 & 0xFFFF_FFFF;
            regs.rdx = output.0 >> 32;
        }
        vp.set_regs(&regs)
    }
}

/// Guest RAM as the hypercall handler sees it.
struct RamAccess<'a>(&'a GuestRam);

impl GuestMemory for RamAccess<'_> {
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), NotRam> {
        self.0.read(gpa, buf).map_err(|_| NotRam { gpa })
    }

    fn write(&mut self, gpa: u64, data: &[u8]) -> Result<(), NotRam> {
        self.0.write("hypercall output", gpa, data).map_err(|_| NotRam { gpa })
    }

    fn is_ram(&self, gpa: u64) -> bool {
        gpa < self.0.size()
    }
}

/// A stats page shown to a guest: its own read-only mapping of the page file, which lives as long
/// as the memory slot that points at it.
struct ReadOnlyPage(MappedPage);

impl OverlayBacking for ReadOnlyPage {
    fn host_address(&self) -> u64 {
        self.0.host_address() as u64
    }
}

/// Stats overlays as read-only KVM memory slots of the partition.
struct KvmOverlays<'a>(&'a GuestSpace);

impl StatsOverlays for KvmOverlays<'_> {
    fn map_overlay(&mut self, gpa_page: u64, page: &SharedPage) -> Result<(), OverlayError> {
        let io = |e: std::io::Error| OverlayError { gpa_page, source: e };
        let mapped = page.map_read_only().map_err(io)?;
        self.0.add_overlay(gpa_page, Arc::new(ReadOnlyPage(mapped))).map_err(|e| io(std::io::Error::other(e)))
    }

    fn unmap_overlay(&mut self, gpa_page: u64) -> Result<(), OverlayError> {
        self.0
            .remove_overlay(gpa_page)
            .map_err(|e| OverlayError { gpa_page, source: std::io::Error::other(e) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hvstats_abi::hypercall::{MSR_GUEST_OS_ID, MSR_HYPERCALL};

    #[test]
    fn the_hypercall_port_is_a_hypercall_only_once_the_page_is_enabled() {
        let hv = HyperV::new(Hypervisor::new().unwrap(), true);
        assert!(!hv.accepts_hypercalls(), "before GUEST_OS_ID and the HYPERCALL MSR");
        hv.msrs().write(MSR_HYPERCALL, 0x5000 | 1, 1 << 20).unwrap();
        assert!(!hv.accepts_hypercalls(), "enabling is ignored while GUEST_OS_ID is 0");
        hv.msrs().write(MSR_GUEST_OS_ID, 0x8100_0000_0000_0000, 1 << 20).unwrap();
        hv.msrs().write(MSR_HYPERCALL, 0x5000 | 1, 1 << 20).unwrap();
        assert!(hv.accepts_hypercalls());
        hv.msrs().write(MSR_HYPERCALL, 0x5000, 1 << 20).unwrap();
        assert!(!hv.accepts_hypercalls(), "disabled again");
    }
}
