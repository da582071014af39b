//! Hardware performance counters: `HalAllocateHardwareCounters` (seed 002) for every process on
//! the host.
//!
//! Tools that program the PMU must not use the same counters at once, or exact counts become
//! multiplexed estimates. This crate arbitrates them the way the Windows HAL does: a consumer
//! asks for counters, ranges, the overflow interrupt, the event buffer or identification tags on a
//! set of processors, or for the whole PMU, and gets a handle or a clear status.
//!
//! - [`pmu`]: the PMU's shape, discovered (or "none", with the reason) or configured;
//! - [`cpuset`]: Linux CPU sets and the Windows processor-group mapping (group g bit b = CPU 64g+b);
//! - [`request`]: argument validation and what conflicts with what;
//! - [`holder`]: which process holds an allocation, and whether it still runs;
//! - [`table`]: the lock-protected table file under `<runtime dir>/hwc/`;
//! - [`allocator`]: allocate and free over that table;
//! - [`perf`]: guest cycles and instructions of a VP, only under an allocation.
//!
//! It needs only the runtime directory's checks (`hvstats::runtime_dir`) and the host's readers
//! (`hvstats_host`): the statistics authority does not depend on it.

#![deny(missing_docs)]

pub mod allocator;
pub mod cpuset;
pub mod holder;
pub mod perf;
pub mod pmu;
pub mod request;
pub mod table;

pub use allocator::{Allocation, Allocator, CounterSetHandle, HwcError, Lifetime, Refusal};
pub use cpuset::CpuSet;
pub use holder::Holder;
pub use perf::{GuestCounts, Unavailable, VpHardwareCounters};
pub use pmu::{CpuCounters, PMU_ENV, PmuError, PmuShape};
pub use request::{Request, ResourceSet};
pub use table::TableError;
