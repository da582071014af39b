//! A minimal VMM for measuring what observing many VMs costs: one KVM VM in the calling process,
//! its vCPU threads each running a real-mode guest that does `out 0x80` forever, paced by the
//! thread (one exit, then a sleep), and KVM's binary statistics opened as QEMU 8.1 and later
//! opens them (`KVM_GET_STATS_FD` on the VM and on each vCPU, kept open for the VM's life), so an
//! observer finds what it finds in such a QEMU. A VM costs a few hundred kilobytes, not QEMU's
//! tens of megabytes, so a small host runs a thousand.

use std::io;
use std::time::Duration;

use hvstats_sources::kvm_stats::{KvmStats, open_for};
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd, VmFd};

/// Where the guest's code is.
const CODE_AT: u64 = 0x1000;
/// The guest's memory: one page of nothing, then the code's page.
const MEMORY: usize = 0x2000;
/// `out 0x80, al; jmp $-2`: an exit to the VMM on every `out`.
const GUEST: [u8; 4] = [0xe6, 0x80, 0xeb, 0xfc];
/// A vCPU thread's stack: it runs a loop of a few frames.
const STACK: usize = 64 * 1024;

/// A VM of `vcpus` vCPUs running in this process: its descriptors and statistics stay open, and
/// its vCPU threads (named as QEMU names them, `CPU n/KVM`) run, as long as the process does.
pub struct PacedVm {
    _vm: VmFd,
    _stats: Vec<KvmStats>,
    _memory: Memory,
}

/// The guest's memory: an anonymous mapping of this process, unmapped on drop.
struct Memory(*mut libc::c_void);

// SAFETY: the mapping is plain memory; KVM and the vCPU threads reach it only through the VM.
unsafe impl Send for Memory {}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours, `MEMORY` bytes long, and the VM using it was dropped first.
        unsafe { libc::munmap(self.0, MEMORY) };
    }
}

impl PacedVm {
    /// Makes the VM and starts its vCPU threads, each leaving the guest once every `pace`.
    ///
    /// # Errors
    /// When `/dev/kvm`, the VM, its memory, a vCPU, a statistics descriptor or a thread cannot be
    /// made.
    pub fn start(vcpus: u64, pace: Duration) -> io::Result<Self> {
        Self::start_named(vcpus, pace, |index| format!("CPU {index}/KVM"))
    }

    /// As [`start`](Self::start), its vCPU threads named by `name` (of the vCPU's index), as
    /// another VMM names them (Firecracker's `fc_vcpu 0`, Cloud Hypervisor's `vcpu0`).
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_named(vcpus: u64, pace: Duration, name: impl Fn(u64) -> String) -> io::Result<Self> {
        let kvm = Kvm::new()?;
        let vm = kvm.create_vm()?;
        let memory = guest_memory(&vm)?;
        let mut stats = vec![open_for(&vm)?];
        for index in 0..vcpus {
            let vcpu = vm.create_vcpu(index)?;
            stats.push(open_for(&vcpu)?);
            real_mode(&vcpu)?;
            std::thread::Builder::new()
                .name(name(index))
                .stack_size(STACK)
                .spawn(move || run_paced(vcpu, pace))?;
        }
        Ok(Self { _vm: vm, _stats: stats, _memory: memory })
    }
}

/// The guest's memory, holding its code, set as the VM's slot 0 at guest address 0.
fn guest_memory(vm: &VmFd) -> io::Result<Memory> {
    // SAFETY: a fresh private anonymous mapping; the result is checked before use.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            MEMORY,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if at == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let memory = Memory(at);
    // SAFETY: the mapping is `MEMORY` bytes, and the code fits after `CODE_AT`.
    unsafe {
        std::ptr::copy_nonoverlapping(GUEST.as_ptr(), at.cast::<u8>().add(CODE_AT as usize), GUEST.len())
    };
    let region = kvm_bindings::kvm_userspace_memory_region {
        slot: 0,
        flags: 0,
        guest_phys_addr: 0,
        memory_size: MEMORY as u64,
        userspace_addr: at as u64,
    };
    // SAFETY: the region is a live mapping of this process that outlives the VM (`PacedVm`
    // drops the VM before the memory).
    unsafe { vm.set_user_memory_region(region) }?;
    Ok(memory)
}

/// Sets `vcpu` in real mode at the guest's code.
fn real_mode(vcpu: &VcpuFd) -> io::Result<()> {
    let mut sregs = vcpu.get_sregs()?;
    sregs.cs.base = 0;
    sregs.cs.selector = 0;
    vcpu.set_sregs(&sregs)?;
    let mut regs = vcpu.get_regs()?;
    regs.rip = CODE_AT;
    regs.rflags = 2;
    vcpu.set_regs(&regs)?;
    Ok(())
}

/// Runs the guest one exit at a time, sleeping `pace` after each, until the guest does something
/// else than its `out` (it does not) or KVM fails; then the thread parks, holding its vCPU, as a
/// VMM's vCPU thread does.
fn run_paced(mut vcpu: VcpuFd, pace: Duration) {
    while let Ok(VcpuExit::IoOut(..)) = vcpu.run() {
        std::thread::sleep(pace);
    }
    loop {
        std::thread::park();
    }
}
