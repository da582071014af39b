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

use super::sources::events::{host_isa, vm_events};
use super::thread_counters::{EventList, Method};

/// The instance description of an observer (`kind` "observer"); its name says how the VMs'
/// tracepoints are counted on this host (in the kernel, or by perf counters), which is what
/// observing costs their guests.
pub fn description() -> InstanceDescription {
    let how = match counting_method().0 {
        Method::InKernel => "counting in the kernel (eBPF)",
        Method::Perf => "counting with perf counters",
    };
    InstanceDescription { kind: "observer".to_owned(), name: format!("hvstats observe, {how}") }
}

/// How this host lets the observer count VMs' tracepoints, and why, said for a log: the method
/// a VM attached now would get.
pub fn counting_method() -> (Method, String) {
    let events = EventList::new(vm_events(host_isa()));
    (events.method(), events.method_description())
}

/// Declares `unavailable` for `partition` (its own counters and its VPs').
pub(crate) fn declare_unavailable(partition: &PartitionStats, unavailable: &[CounterId]) {
    partition.set_unavailable(unavailable);
}
