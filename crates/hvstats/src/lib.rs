//! The statistics authority of hvstats, independent of any backend.
//!
//! It owns the stats objects and their pages ([`page`]) in one arena per instance ([`arena`],
//! format in [`index`]), the instance that holds them ([`instance`]), the map/unmap rules
//! ([`rules`]) and the stats hypercalls built on them ([`hypercall`], [`gpa_space`]), publication
//! of live instances to the runtime directory ([`publish`], [`runtime_dir`]) and attach for root
//! readers in other processes ([`attach`], [`reader`], [`trust`]), the LP objects ([`lp`]), the
//! values an instance keeps by name beside its pages ([`unmapped`]), snapshots of attached
//! instances ([`snapshot`]), and — built on those — the typed VP counter API. What it reads of the
//! host (thread stat lines) comes from the host readers of `hvstats_host`. The hardware counter
//! allocator, which needs only the runtime directory and the host's perf readers, is its own
//! crate, `hvstats_hwc`.

#![deny(missing_docs)]

pub mod arena;
pub mod attach;
pub mod gpa_space;
pub mod hypercall;
pub mod index;
pub mod instance;
pub mod lp;
pub mod observer_lock;
pub mod observer_mark;
pub mod page;
pub mod patience;
pub mod platform_file;
pub mod publish;
pub mod reader;
pub mod rules;
pub mod runtime_dir;
mod shrink_guard;
pub mod snapshot;
pub mod trust;
pub mod unmapped;
pub mod vm_name;
pub mod vmm;
pub mod whv;

/// An error and its sources on one line, as every report shows one. Defined with the host readers
/// (whose own reports need it) and named here so the crates built on the authority (the
/// presentation, mshv, the sources, the run loop) need not depend on the host readers for it.
pub use hvstats_host::error_chain::error_chain;
pub use index::InstanceDescription;
pub use instance::{Hypervisor, InstanceConfig, PartitionStats};
pub use page::{MappedPage, SharedPage};
pub use publish::PageAccess;
