//! The event writer of KVM's tracepoints: every counter whose observed key is a `kvm:*`
//! tracepoint (CPUID, MSR and APIC accesses, port I/O and MMIO, the VMM's exits by reason), with
//! the parts added to it, written by the same function as our own VPs' tracepoint counts.

use hvstats::SharedPage;
use hvstats_abi::ObjectKind;
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::source::Tracepoint;

use super::event_writer::{EventWriter, KvmExitState, ThreadReading, tracepoint_event};
use crate::thread_counters::EventSpec;
use hvstats_sources::counter_source::Gives;
use hvstats_sources::tracepoint::{Corrections, Keys, write_tracepoint_counts};

/// The tracepoints counted for observed VMs, in their events' order.
fn counted() -> impl Iterator<Item = Tracepoint> {
    Tracepoint::ALL.into_iter().filter(|tp| tp.counted_for_observed())
}

/// The position of `tp` among [`counted`].
fn position(tp: Tracepoint) -> Option<usize> {
    counted().position(|t| t == tp)
}

/// The tracepoints of the catalog's observed keys.
#[derive(Debug)]
pub struct KvmTracepoints;

impl EventWriter for KvmTracepoints {
    fn events(&self, _isa: Option<u32>) -> Vec<EventSpec> {
        counted().map(tracepoint_event).collect()
    }

    fn gives(&self, counted: &dyn Fn(usize) -> bool, _kvm_exit: KvmExitState) -> Gives {
        Gives::vp(CounterSet::of_kind(ObjectKind::Vp, |c| {
            Keys::Observed.tracepoint(c).and_then(position).is_some_and(counted)
        }))
    }

    fn write(&self, reading: &ThreadReading<'_>, page: &SharedPage, only: &CounterSet) {
        let count = |tp: Tracepoint| position(tp).and_then(|i| reading.count(i));
        // The VMM's own MSR exits are MSR accesses `kvm_msr` does not see; nothing of an observed
        // VMM's ports is a hypercall.
        let corrections =
            Corrections { user_msr: count(Tracepoint::UserspaceMsr).unwrap_or(0), hypercalls: 0 };
        write_tracepoint_counts(page, only, Keys::Observed, count, corrections);
    }
}
