//! The statistics authority of hvstats, independent of any backend.
//!
//! It owns the stats objects and their pages ([`page`]), the instance that holds them
//! ([`instance`]), and — built on those — publication to the runtime directory, attach for root
//! readers, the map/unmap rules, the typed VP counter API and the hardware counter allocator.

#![deny(missing_docs)]

pub mod hwc;
pub mod instance;
pub mod page;
pub mod runtime_dir;

pub use instance::{Hypervisor, PartitionStats};
pub use page::{MappedPage, SharedPage};
