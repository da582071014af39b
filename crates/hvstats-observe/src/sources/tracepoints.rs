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
    // Worked out once: every counter of every VP is written through it at every refresh.
    static POSITIONS: std::sync::OnceLock<[Option<usize>; Tracepoint::ALL.len()]> =
        std::sync::OnceLock::new();
    let positions = POSITIONS.get_or_init(|| {
        let mut at = [None; Tracepoint::ALL.len()];
        counted().enumerate().for_each(|(i, tp)| at[tp.index()] = Some(i));
        at
    });
    positions.get(tp.index()).copied().flatten()
}

/// The VP counters whose observed key is a counted tracepoint, each with its tracepoint's
/// position among [`counted`].
fn keyed() -> &'static [(hvstats_abi::CounterId, usize)] {
    static KEYED: std::sync::OnceLock<Vec<(hvstats_abi::CounterId, usize)>> = std::sync::OnceLock::new();
    KEYED.get_or_init(|| {
        let counters = hvstats_abi::catalog::counters_of(ObjectKind::Vp);
        counters.filter_map(|c| Some((c.id, Keys::Observed.tracepoint(c).and_then(position)?))).collect()
    })
}

/// The tracepoints of the catalog's observed keys.
#[derive(Debug)]
pub struct KvmTracepoints;

impl EventWriter for KvmTracepoints {
    fn events(&self, _isa: Option<u32>) -> Vec<EventSpec> {
        counted().map(tracepoint_event).collect()
    }

    fn gives(&self, counted: &dyn Fn(usize) -> bool, _kvm_exit: KvmExitState) -> Gives {
        let mut vp = CounterSet::EMPTY;
        keyed().iter().filter(|(_, at)| counted(*at)).for_each(|(id, _)| vp.insert(*id));
        Gives::vp(vp)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_worked_out_once_say_what_a_search_of_the_catalog_says() {
        for tp in Tracepoint::ALL {
            assert_eq!(position(tp), counted().position(|t| t == tp), "{tp:?}");
        }
        // Every event counted, none, and every other one.
        let predicates: [&dyn Fn(usize) -> bool; 3] = [&|_| true, &|_| false, &|i| i % 2 == 0];
        for counted in predicates {
            let searched = CounterSet::of_kind(ObjectKind::Vp, |c| {
                Keys::Observed.tracepoint(c).and_then(position).is_some_and(counted)
            });
            assert_eq!(KvmTracepoints.gives(counted, KvmExitState::Undecided).vp, searched);
        }
        assert!(!keyed().is_empty());
    }
}
