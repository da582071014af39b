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

/// A VM whose vCPUs never run, made on a `/dev/kvm` descriptor given (one a more privileged
/// parent opened for a process that may not open `/dev/kvm` itself) or opened here: what a VMM
/// holds, for tests that look for it. The VM and vCPUs stay open as long as this lives.
pub struct IdleVm {
    _vcpus: Vec<kvm_ioctls::VcpuFd>,
    _vm: kvm_ioctls::VmFd,
}

impl IdleVm {
    /// Creates a VM with `vcpus` vCPUs on `kvm` (else on `/dev/kvm`, opened now).
    ///
    /// # Errors
    /// When `/dev/kvm`, the VM or a vCPU cannot be made.
    pub fn new(kvm: Option<std::os::fd::OwnedFd>, vcpus: u64) -> io::Result<Self> {
        use std::os::fd::{FromRawFd, IntoRawFd};
        let kvm = match kvm {
            // SAFETY: the descriptor is ours (owned) and is a /dev/kvm descriptor, as the caller
            // says; the Kvm takes it over.
            Some(fd) => unsafe { kvm_ioctls::Kvm::from_raw_fd(fd.into_raw_fd()) },
            None => kvm_ioctls::Kvm::new()?,
        };
        let vm = kvm.create_vm()?;
        let vcpus = (0..vcpus).map(|i| vm.create_vcpu(i)).collect::<Result<Vec<_>, _>>()?;
        Ok(Self { _vcpus: vcpus, _vm: vm })
    }

    /// The VM's file descriptor (`anon_inode:kvm-vm`), as a VMM holds it.
    pub fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the VM fd is open as long as `self` lives, which the borrow ties the result to.
        unsafe { BorrowedFd::borrow_raw(self._vm.as_raw_fd()) }
    }
}
