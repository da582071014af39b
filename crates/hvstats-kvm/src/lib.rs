//! The KVM backend of hvstats: partitions on `/dev/kvm`, the VP run loop, and the counter sources
//! that make every VP page exact.
//!
//! - [`partition`]: a VM with an in-kernel irqchip and N VPs, and the run that collects their
//!   sources; [`guest_space`]: its RAM and stats overlays, and the gate that holds VPs out of the
//!   guest while the memory slots change;
//! - [`hyperv`] and [`enlightenment`]: the Hyper-V interface a guest sees (CPUID leaves, synthetic MSRs, hypercalls);
//! - [`vp`]: the VP thread and its KVM_RUN loop, given only what a VP needs; [`handlers`]: who
//!   handles which exit;
//! - [`modes`]: real, protected and long mode set-up;
//! - [`accounting`]: userspace exits counted with their time, and what the kernel counts
//!   (tracepoints, KVM stats, perf, procfs: the sources of `hvstats_sources`) merged into the pages.

#![deny(missing_docs)]

pub mod accounting;
pub mod cycles;
pub mod enlightenment;
pub mod error;
pub mod gpa_map;
pub mod guest_space;
pub mod handlers;
#[cfg(test)]
mod histogram_sources;
pub mod hyperv;
pub mod memory;
pub mod modes;
pub mod partition;
#[cfg(test)]
mod source_tables;
pub mod vp;

pub use error::Error;
pub use guest_space::GuestSpace;
pub use handlers::{
    HandlerError, Handlers, HypercallHandler, MsrHandler, PortAction, PortHandler, VpContext,
};
pub use partition::{
    HardwareCounters, OverlayBacking, Partition, PartitionConfig, RunReport, StatsPageOverlay,
};
pub use vp::{FaultCause, HandlerSite, HardwareCountError, RipSeen, VpFault, VpOutcome};
