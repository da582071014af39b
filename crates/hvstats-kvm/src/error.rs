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
    /// A KVM ioctl failed.
    #[error("{op}: {source}")]
    Kvm {
        /// The operation.
        op: &'static str,
        /// The kernel's error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// A host system call failed.
    #[error("{op}: {source}")]
    Host {
        /// The operation.
        op: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
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

pub(crate) fn kvm(op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |source| Error::Kvm { op, source }
}
