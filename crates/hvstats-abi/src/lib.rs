//! The Hyper-V statistics ABI, as hvstats speaks it.
//!
//! This crate owns the wire and memory formats only: stats object types and identities
//! ([`object`]), group headers and versions ([`group`]), the counter catalog from which every
//! counter's id, name, offset and help text is derived ([`catalog`]) and sets of its counters
//! ([`counter_set`]), the page writer and reader
//! ([`page`]), log2 histograms of times and the sequence counter of consistent reads
//! ([`histogram`], [`seqcount`]), the hypercall ABI of the stats calls ([`hypercall`],
//! [`status`]), the typed counter sets of `WHvGetVirtualProcessorCounters` ([`whv`]) and the
//! structures of `HalAllocateHardwareCounters` ([`hal`]), which source gave each counter of an
//! observed VM ([`vm_sources`]), the run states of a VM ([`vm_state`]), and the boot contract
//! between the VMM and its guest programs ([`boot`], [`apic`]).
//!
//! It is `no_std` and free of `unsafe`: every memory structure derives zerocopy's traits and has
//! its size asserted beside it.

#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod apic;
pub mod boot;
pub mod catalog;
pub mod counter;
pub mod counter_set;
pub mod cpuid;
pub mod exit_filter;
pub mod exit_reason;
pub mod group;
pub mod hal;
pub mod histogram;
pub mod hypercall;
pub mod hypercall_page;
pub mod hyperv_features;
pub mod object;
pub mod page;
pub mod refusal;
pub mod seqcount;
pub mod source;
pub mod status;
pub mod vm_sources;
pub mod vm_state;
pub mod whv;

pub use catalog::{CATALOG, Counter, CounterId, GroupKind, Maintained, Presentation, Source, Unit};
pub use group::{GroupHeader, GroupType, GroupVersion, MAX_COUNTERS_PER_GROUP, PAGE_SIZE};
pub use object::{ObjectKind, StatsAreaType, StatsObjectIdentity, StatsObjectType};
pub use page::{PageError, PageLayout, PageView, StatsPage};
pub use status::{HvError, HvResult, HvStatus};
