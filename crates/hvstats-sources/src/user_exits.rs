//! The run loop's counts that kernel sources correct with: what KVM's tracepoints do not see
//! (MSR accesses handled in userspace) or see as something else (hypercall port writes, which
//! `kvm_pio` counts as port I/O). Written by the VP thread only, read by its sources' writes.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counts the run loop keeps that a merge needs too (written by the VP thread only).
#[derive(Debug, Default)]
pub struct UserExitCounts {
    /// MSR accesses handled in userspace (KVM's `kvm_msr` does not fire for them).
    pub msr: AtomicU64,
    /// Hypercall port writes (KVM's `kvm_pio` counts them, they are not I/O instructions).
    pub hypercalls: AtomicU64,
}

impl UserExitCounts {
    /// Adds one to `counter` (single writer: a plain load and store).
    pub fn bump(counter: &AtomicU64) {
        counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}
