//! The statistics authority of hvstats, independent of any backend.
//!
//! It owns the stats objects and their pages ([`page`]) in one arena per instance ([`arena`],
//! format in [`index`]), the instance that holds them ([`instance`]), the map/unmap rules
//! ([`rules`]) and the stats hypercalls built on them ([`hypercall`], [`gpa_space`]), publication
//! of live instances to the runtime directory ([`publish`], [`runtime_dir`]) and attach for root
//! readers in other processes ([`attach`], [`reader`], [`trust`]), the LP objects ([`lp`]), the
//! values an instance keeps by name beside its pages ([`unmapped`]), snapshots of attached
//! instances ([`snapshot`]), threads' CPU wait ([`sched`]), and — built on those — the typed VP
//! counter API and the hardware counter allocator.

#![deny(missing_docs)]

pub mod arena;
pub mod attach;
pub mod error_chain;
pub mod gpa_space;
pub mod hwc;
pub mod hypercall;
pub mod index;
pub mod instance;
pub mod lp;
pub mod metrics;
pub mod os;
pub mod page;
pub mod perf_event;
pub mod perf_group;
pub mod present;
pub mod publish;
pub mod reader;
pub mod rules;
pub mod runtime_dir;
pub mod sched;
pub mod snapshot;
pub mod task_stat;
pub mod text;
pub mod trust;
pub mod unmapped;
pub mod vmm;
pub mod whv;

pub use index::InstanceDescription;
pub use instance::{Hypervisor, InstanceConfig, PartitionStats};
pub use page::{MappedPage, SharedPage};
pub use publish::PageAccess;
