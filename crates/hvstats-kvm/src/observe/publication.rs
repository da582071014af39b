//! What an observed partition tells readers beyond its counts: the instance is an observer's,
//! each partition carries the VMM's name for its VM, and the counters no source gives it are
//! declared unavailable (readers show null, never 0).
//!
//! Every observed-partition fact goes through here, so what the index can carry and what it
//! cannot (the attach time and the vCPU threads are logged on stderr and kept by
//! [`super::ObservedVm`], not published) is decided in one place.

use hvstats::PartitionStats;
use hvstats::index::InstanceDescription;
use hvstats_abi::CounterId;

/// The instance description of an observer (`kind` "observer").
pub fn description() -> InstanceDescription {
    InstanceDescription { kind: "observer".to_owned(), name: "hvstats observe".to_owned() }
}

/// Declares `unavailable` for `partition` (its own counters and its VPs').
pub fn declare_unavailable(partition: &PartitionStats, unavailable: &[CounterId]) {
    partition.set_unavailable(unavailable);
}
