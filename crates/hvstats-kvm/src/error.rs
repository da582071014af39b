//! Errors of the KVM backend: one variant per operation, carrying its cause.

use std::io;

/// What went wrong setting up or running a partition.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `/dev/kvm` cannot be opened.
    #[error("cannot open /dev/kvm: {0}")]
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
    /// The partition configuration cannot work.
    #[error("invalid partition configuration: {0}")]
    Config(String),
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
