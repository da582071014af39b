//! Errors of the KVM backend: one variant per operation, carrying its cause.

use std::io;

/// What to do about `/dev/kvm` not opening, by the kernel's reason.
fn open_kvm_hint(e: &kvm_ioctls::Error) -> &'static str {
    match e.errno() {
        libc::EACCES | libc::EPERM => {
            " (its group is `kvm`: add your user to it with `usermod -aG kvm $USER` and log in again, or run as root)"
        }
        libc::ENOENT | libc::ENODEV | libc::ENXIO => {
            " (no KVM on this host: the kvm module is not loaded, or the processor offers no \
             virtualization to it; `dmesg | grep -i kvm` says why)"
        }
        _ => "",
    }
}

/// What went wrong setting up or running a partition.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `/dev/kvm` cannot be opened.
    #[error("cannot open /dev/kvm{}", open_kvm_hint(.0))]
    OpenKvm(#[source] kvm_ioctls::Error),
    /// The VM cannot be created (`KVM_CREATE_VM`).
    #[error("cannot create a KVM VM (KVM_CREATE_VM)")]
    CreateVm(#[source] kvm_ioctls::Error),
    /// The VM's TSS address cannot be set (`KVM_SET_TSS_ADDR`).
    #[error("cannot set the VM's TSS address (KVM_SET_TSS_ADDR)")]
    SetTssAddress(#[source] kvm_ioctls::Error),
    /// The in-kernel interrupt controller cannot be created (`KVM_CREATE_IRQCHIP`).
    #[error("cannot create the in-kernel interrupt controller (KVM_CREATE_IRQCHIP)")]
    CreateIrqChip(#[source] kvm_ioctls::Error),
    /// MSR accesses cannot be sent to userspace (`KVM_ENABLE_CAP(KVM_CAP_X86_USER_SPACE_MSR)`).
    #[error("cannot have KVM forward MSR accesses (KVM_ENABLE_CAP(KVM_CAP_X86_USER_SPACE_MSR))")]
    EnableUserSpaceMsr(#[source] kvm_ioctls::Error),
    /// The CPUID KVM supports cannot be read (`KVM_GET_SUPPORTED_CPUID`).
    #[error("cannot read the CPUID KVM supports (KVM_GET_SUPPORTED_CPUID)")]
    SupportedCpuid(#[source] kvm_ioctls::Error),
    /// A vCPU cannot be created (`KVM_CREATE_VCPU`).
    #[error("cannot create vCPU {vp} (KVM_CREATE_VCPU)")]
    CreateVcpu {
        /// The VP index.
        vp: u32,
        /// The kernel's error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// A vCPU's CPUID cannot be set (`KVM_SET_CPUID2`).
    #[error("cannot set the CPUID of vCPU {vp} (KVM_SET_CPUID2)")]
    SetCpuid {
        /// The VP index.
        vp: u32,
        /// The kernel's error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// A vCPU's start state cannot be read or set.
    #[error("cannot set the start state of vCPU {vp} ({ioctl})")]
    StartState {
        /// The VP index.
        vp: u32,
        /// The ioctl that failed (`KVM_SET_SREGS`, …).
        ioctl: &'static str,
        /// The kernel's error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// A memory slot cannot be set (`KVM_SET_USER_MEMORY_REGION`).
    #[error("cannot set memory slot {slot} (KVM_SET_USER_MEMORY_REGION)")]
    SetMemorySlot {
        /// The slot.
        slot: u32,
        /// The kernel's error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// Guest RAM cannot be mapped.
    #[error("cannot map {bytes:#x} bytes of guest RAM")]
    MapGuestRam {
        /// The size asked for.
        bytes: u64,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The handler of the signal that kicks a VP out of `KVM_RUN` cannot be installed.
    #[error("cannot install the handler of the VP kick signal")]
    KickHandler(#[source] io::Error),
    /// The partition's stats pages cannot be published.
    #[error("cannot publish the partition's stats pages")]
    StatsPages(#[source] io::Error),
    /// A vCPU's binary statistics cannot be opened (`KVM_GET_STATS_FD`).
    #[error("cannot open the vCPU's statistics (KVM_GET_STATS_FD)")]
    StatsFd(#[source] io::Error),
    /// The partition asks for a number of VPs the guest layout has no stacks for.
    #[error("{count} VPs: between 1 and {max} are supported")]
    VpCount {
        /// VPs asked for.
        count: u32,
        /// The most the layout holds.
        max: u32,
    },
    /// Guest RAM of a size hvstats does not build.
    #[error("memory of {bytes:#x} bytes: a multiple of 4 KiB between 1 MiB and 3 GiB is supported")]
    MemorySize {
        /// The size asked for.
        bytes: u64,
    },
    /// KVM lacks a capability every partition needs.
    #[error("KVM lacks {name}")]
    MissingCapability {
        /// The capability.
        name: &'static str,
    },
    /// A VP's CPUID table is larger than KVM takes.
    #[error("{count} CPUID entries: KVM takes at most {max}", max = kvm_bindings::KVM_MAX_CPUID_ENTRIES)]
    TooManyCpuidEntries {
        /// Entries in the table.
        count: usize,
    },
    /// A real-mode entry point above what real mode can address.
    #[error("real-mode entry {entry:#x} is not below 1 MiB")]
    RealModeEntry {
        /// The entry point.
        entry: u64,
    },
    /// An image or a write does not fit guest memory.
    #[error("{what} at {gpa:#x} (+{len:#x}) is outside guest memory ({size:#x} bytes)")]
    OutOfRam {
        /// What was written.
        what: &'static str,
        /// Its guest physical address.
        gpa: u64,
        /// Its length.
        len: u64,
        /// The size of guest RAM.
        size: u64,
    },
    /// An overlay request cannot be honoured.
    #[error("overlay at GPA page {gpa_page:#x}: {why}")]
    Overlay {
        /// The GPA page number.
        gpa_page: u64,
        /// Why.
        why: &'static str,
    },
    /// The partition has already run.
    #[error("the partition has already run")]
    AlreadyRan,
}
