//! A vCPU that never runs, for measuring a read of KVM's per-vCPU statistics beside others and
//! for holding a VM open while a test looks for it.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use hvstats_sources::kvm_stats::{KvmStats, open_for};

/// A vCPU that never runs and its binary stats: what a reader of KVM's per-vCPU statistics reads,
/// for measuring that read beside others. The VM and vCPU stay open as long as this lives.
pub struct IdleVcpu {
    /// The vCPU's statistics.
    pub stats: KvmStats,
    vcpu: kvm_ioctls::VcpuFd,
    _vm: kvm_ioctls::VmFd,
}

impl IdleVcpu {
    /// Creates a VM with one vCPU (never run) and opens its statistics.
    ///
    /// # Errors
    /// When `/dev/kvm`, the VM, the vCPU or its statistics cannot be opened.
    pub fn new() -> io::Result<Self> {
        let kvm = kvm_ioctls::Kvm::new()?;
        let vm = kvm.create_vm()?;
        let vcpu = vm.create_vcpu(0)?;
        let stats = open_for(&vcpu)?;
        Ok(Self { stats, vcpu, _vm: vm })
    }

    /// The vCPU's file descriptor, for opening other per-vCPU sources on it.
    pub fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the vCPU fd is open as long as `self` lives, which the borrow ties the result to.
        unsafe { BorrowedFd::borrow_raw(self.vcpu.as_raw_fd()) }
    }
}
