//! The seam inside the events source: an [`EventWriter`] names the events it needs counted on
//! each vCPU thread and writes counters from their counts ([`ThreadReading`]). One file per
//! writer, one line in the events source's list.

use std::fmt::Debug;

use hvstats::SharedPage;
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::source::Tracepoint;

use crate::thread_counters::EventSpec;
use hvstats_sources::counter_source::Gives;

/// What is known about `kvm:kvm_exit` on this host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvmExitState {
    /// Not a VMX/SVM host: it is not counted by reason.
    NoHardwareVirtualization,
    /// No exit seen yet.
    Undecided,
    /// It fires: intercepts are counted by reason.
    Fires,
    /// The guest made exits (userspace exits or CPUID) but `kvm_exit` stayed 0.
    Silent,
}

/// What an event writer writes from: its events' counts on one vCPU thread since attach.
#[derive(Clone, Copy, Debug)]
pub struct ThreadReading<'a> {
    /// The counts of the writer's events, in the order it named them (`None`: not counted).
    pub counts: &'a [Option<u64>],
    /// What `kvm_exit` does on this host.
    pub kvm_exit: KvmExitState,
}

impl ThreadReading<'_> {
    /// The count of the writer's event `i`.
    pub fn count(&self, i: usize) -> Option<u64> {
        self.counts.get(i).copied().flatten()
    }
}

/// One part of the events source: the events it counts and the counters it writes from them.
pub trait EventWriter: Debug + Sync {
    /// The events it counts on each thread, on a host of `isa` ([`host_isa`]).
    fn events(&self, isa: Option<u32>) -> Vec<EventSpec>;

    /// The counters it gives, `counted(i)` saying whether its event `i` is counted on every vCPU
    /// thread.
    fn gives(&self, counted: &dyn Fn(usize) -> bool, kvm_exit: KvmExitState) -> Gives;

    /// Writes the VP counters of `only` from one thread's reading.
    fn write(&self, reading: &ThreadReading<'_>, page: &SharedPage, only: &CounterSet);
}

/// The event counting a tracepoint of the catalog's observed keys, as the writers name it (the
/// same event our own VPs count it with).
pub fn tracepoint_event(tp: Tracepoint) -> EventSpec {
    hvstats_sources::tracepoint::event(tp)
}
