//! The event writer of KVM's Hyper-V emulation: the `kvm:kvm_hv_*` tracepoints an enlightened
//! guest (Windows, or Linux on Hyper-V's enlightenments) makes KVM fire on its vCPU threads,
//! counted into the VP counters seed 001 gives them.
//!
//! - every `kvm_hv_hypercall`, and one filtered column per hypercall class, the codes of each
//!   class taken from the one hypercall table ([`hvstats_abi::hypercall::HYPERCALLS`]); Other is
//!   every record no class took (unknown codes, the debug and extended calls);
//! - the time from `kvm_hv_hypercall` to `kvm_hv_hypercall_done`, timed in the kernel (a span of
//!   its own lane, so that a hypercall inside a `kvm_exit` span does not end it);
//! - `kvm_hv_hypercall_done` whose status is not success;
//! - `kvm_hv_synic_set_irq` delivered (`ret > 0`) by the vCPU's own thread (a synthetic timer's
//!   message, a SINT the guest's own hypercall or EOM asserts); one a VMM thread asserts through
//!   an irqfd fires on that thread, not the target's, and is not counted;
//! - the TLB flushes: a `kvm_hv_flush_tlb`/`_ex` record names neither the hypercall nor its rep
//!   count, so each is counted with what the thread's `kvm_hv_hypercall` record before it carried
//!   (its code, by the table's effects, and its `rep_cnt` for GVA range lists), split by the flush
//!   record's `HV_FLUSH_ALL_VIRTUAL_ADDRESS_SPACES` flag. Carried counts are the kernel's only:
//!   where programs cannot be loaded, the flush counters are not given.
//!
//! Hypercalls/sec and their cost are given here only where `kvm:kvm_exit` does not fire: where
//! it does (VMX/SVM hosts), its VMCALL/VMMCALL exits count every hypercall, KVM's own and Xen's
//! too, not only Hyper-V's ([`super::exit_classes`]).

use std::sync::OnceLock;

use hvstats::SharedPage;
use hvstats_abi::ObjectKind;
use hvstats_abi::catalog::{Maintained, observed, vp};
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::hypercall::{HYPERCALLS, HypercallClass, HypercallEffect, flush_flags};
use hvstats_abi::source::{KvmHv, Source};
use hvstats_abi::{CounterId, catalog};

use super::event_writer::{EventWriter, KvmExitState, ThreadReading};
use crate::thread_counters::EventSpec;
use hvstats_sources::counter_source::Gives;

/// The hypercall tracepoint.
pub const HYPERCALL: &str = "kvm_hv_hypercall";
/// Its completion.
pub const HYPERCALL_DONE: &str = "kvm_hv_hypercall_done";
/// A synthetic interrupt asserted.
pub const SYNIC_SET_IRQ: &str = "kvm_hv_synic_set_irq";
/// The flush records, each of the codes whose table row names it.
pub const FLUSH_RECORDS: [&str; 2] = ["kvm_hv_flush_tlb", "kvm_hv_flush_tlb_ex"];
/// The effects that flush, each counted by whether the flags flush every address space.
const FLUSHES: [HypercallEffect; 2] = [HypercallEffect::AddressSpaceFlush, HypercallEffect::GvaRangeFlush];

/// The ftrace filter matching the `kvm_hv_hypercall` records of `codes`, `None` when there are none.
fn code_filter(codes: impl Iterator<Item = u16>) -> Option<String> {
    let terms: Vec<String> = codes.map(|c| format!("code == {c:#x}")).collect();
    (!terms.is_empty()).then(|| terms.join(" || "))
}

/// The filter of the hypercalls of `class` (`None`: the table names no code of it).
pub fn class_filter(class: HypercallClass) -> Option<String> {
    code_filter(HYPERCALLS.iter().filter(|r| r.class == class).map(|r| r.code.0))
}

/// The classes counted by a filter of their own: every class but Other (the rest). Worked out
/// once: every event index of the writer follows from it, and each VP of every VM is written
/// at every refresh.
fn classified() -> impl Iterator<Item = HypercallClass> {
    static CLASSIFIED: OnceLock<Vec<HypercallClass>> = OnceLock::new();
    let classes = CLASSIFIED.get_or_init(|| {
        HypercallClass::ALL
            .into_iter()
            .filter(|c| *c != HypercallClass::Other && class_filter(*c).is_some())
            .collect()
    });
    classes.iter().copied()
}

/// The filter of the hypercalls whose flush is `effect` and recorded by `record`.
fn flush_codes(effect: HypercallEffect, record: &str) -> Option<String> {
    code_filter(
        HYPERCALLS.iter().filter(|r| r.effect == effect && r.record == Some(record)).map(|r| r.code.0),
    )
}

/// The flush record's filter on whether it flushes every address space.
fn flags_filter(all_spaces: bool) -> String {
    let bit = flush_flags::ALL_VIRTUAL_ADDRESS_SPACES;
    if all_spaces { format!("flags & {bit:#x}") } else { format!("!(flags & {bit:#x})") }
}

/// True when a flush of `effect` counts the hypercall's rep elements, not one per call (the
/// catalog's [`HypercallEffect::flush`] says so).
fn counts_reps(effect: HypercallEffect) -> bool {
    effect.flush(0, 2).is_some_and(|(_, n)| n == 2)
}

/// The flush columns: (record, effect, all spaces), in event order.
fn flush_columns() -> impl Iterator<Item = (&'static str, HypercallEffect, bool)> {
    FLUSH_RECORDS
        .into_iter()
        .flat_map(|record| FLUSHES.into_iter().flat_map(move |e| [false, true].map(|all| (record, e, all))))
}

/// Where this writer's events sit: every hypercall, then one per classified class, the span,
/// the failed ones, synthetic interrupts, then the flush columns.
const ALL: usize = 0;
const CLASSES: usize = 1;

fn classes() -> usize {
    classified().count()
}
fn span() -> usize {
    CLASSES + classes()
}
fn failed() -> usize {
    span() + 1
}
fn synic() -> usize {
    span() + 2
}
fn flushes() -> usize {
    span() + 3
}

/// The event of `class`'s hypercalls (`None` for Other: the rest).
fn class_event(class: HypercallClass) -> Option<usize> {
    classified().position(|c| c == class).map(|i| CLASSES + i)
}

/// The flush events of the counter of (`effect`, `all_spaces`): one per flush record.
fn flush_events(effect: HypercallEffect, all_spaces: bool) -> Vec<usize> {
    flush_columns()
        .enumerate()
        .filter(|(_, (_, e, all))| *e == effect && *all == all_spaces)
        .map(|(i, _)| flushes() + i)
        .collect()
}

/// The counter of `effect` on a record whose flags do (or do not) flush every address space.
fn flush_counter(effect: HypercallEffect, all_spaces: bool) -> Option<CounterId> {
    let flags = if all_spaces { flush_flags::ALL_VIRTUAL_ADDRESS_SPACES } else { 0 };
    effect.flush(flags, 1).map(|(id, _)| id)
}

/// What the writer gives a counter from: its observed key when that is KVM's Hyper-V
/// emulation; Hypercalls/sec and their cost, where `kvm_exit` does not give them.
fn kvm_hv_of(c: &catalog::Counter) -> Option<KvmHv> {
    match observed(c).and_then(Maintained::source) {
        Some(Source::KvmHv(what)) => Some(what),
        _ if c.id == vp::HYPERCALLS => Some(KvmHv::AllHypercalls),
        _ if c.id == vp::HYPERCALLS_COST => Some(KvmHv::HypercallTime),
        _ => None,
    }
}

/// The events `what` is written from.
fn events_of(what: KvmHv) -> Vec<usize> {
    match what {
        KvmHv::AllHypercalls => vec![ALL],
        KvmHv::Hypercalls(HypercallClass::Other) => (ALL..CLASSES + classes()).collect(),
        KvmHv::Hypercalls(class) => class_event(class).into_iter().collect(),
        KvmHv::HypercallTime => vec![span()],
        KvmHv::FailedHypercalls => vec![failed()],
        KvmHv::SyntheticInterrupts => vec![synic()],
        KvmHv::Flushes(effect, all) => flush_events(effect, all),
    }
}

/// Every VP counter this writer may give, in catalog order, with what it is written from and
/// the events that takes ([`events_of`]): worked out once, read for every VP at every refresh.
fn written() -> &'static [(CounterId, KvmHv, Vec<usize>)] {
    static WRITTEN: OnceLock<Vec<(CounterId, KvmHv, Vec<usize>)>> = OnceLock::new();
    WRITTEN.get_or_init(|| {
        catalog::CATALOG
            .iter()
            .filter(|c| c.id.kind == ObjectKind::Vp)
            .filter_map(|c| kvm_hv_of(c).map(|what| (c.id, what, events_of(what))))
            .collect()
    })
}

/// The value of `what`, written from `events`, from a reading, if every event it needs is
/// counted.
fn value_of(what: KvmHv, events: &[usize], reading: &ThreadReading<'_>) -> Option<u64> {
    let sum = |events: &mut dyn Iterator<Item = usize>| events.map(|i| reading.count(i)).sum::<Option<u64>>();
    match what {
        KvmHv::Hypercalls(HypercallClass::Other) => {
            let total = reading.count(ALL)?;
            Some(total.saturating_sub(sum(&mut (CLASSES..CLASSES + classes()))?))
        }
        KvmHv::HypercallTime => reading.count(span()).map(|ns| ns / 100),
        _ => sum(&mut events.iter().copied()),
    }
}

/// True when `what` is this writer's to give with `kvm_exit` in state `kvm_exit`.
fn ours(what: KvmHv, kvm_exit: KvmExitState) -> bool {
    match what {
        KvmHv::AllHypercalls | KvmHv::HypercallTime => kvm_exit != KvmExitState::Fires,
        _ => true,
    }
}

/// KVM's Hyper-V emulation.
#[derive(Debug)]
pub struct HypervEnlightenments;

impl EventWriter for HypervEnlightenments {
    fn events(&self, _isa: Option<u32>) -> Vec<EventSpec> {
        let mut specs = vec![EventSpec::tracepoint("kvm", HYPERCALL)];
        for class in classified() {
            if let Some(filter) = class_filter(class) {
                specs.push(EventSpec::filtered("kvm", HYPERCALL, &filter));
            }
        }
        specs.push(EventSpec::span("kvm", HYPERCALL, None, HYPERCALL_DONE));
        specs.push(EventSpec::filtered("kvm", HYPERCALL_DONE, "result & 0xffff"));
        specs.push(EventSpec::filtered("kvm", SYNIC_SET_IRQ, "ret > 0"));
        for (record, effect, all) in flush_columns() {
            let codes = flush_codes(effect, record);
            let weight = counts_reps(effect).then_some("rep_cnt");
            let flags = flags_filter(all);
            specs.push(EventSpec::carried(
                "kvm",
                (record, Some(&flags)),
                (HYPERCALL, Some(codes.as_deref().unwrap_or("code == 0xffff && code == 0"))),
                weight,
            ));
        }
        specs
    }

    fn gives(&self, counted: &dyn Fn(usize) -> bool, kvm_exit: KvmExitState) -> Gives {
        let mut set = CounterSet::EMPTY;
        for (id, what, events) in written() {
            if ours(*what, kvm_exit) && events.iter().all(|&i| counted(i)) {
                set.insert(*id);
            }
        }
        Gives::vp(set)
    }

    fn write(&self, reading: &ThreadReading<'_>, page: &SharedPage, only: &CounterSet) {
        for (id, what, events) in written().iter().filter(|(id, ..)| only.contains(*id)) {
            if !ours(*what, reading.kvm_exit) {
                continue;
            }
            if let Some(value) = value_of(*what, events, reading) {
                page.set(*id, value);
            }
        }
    }
}

/// Hypercalls/sec and their cost, which this writer gives where `kvm_exit` does not fire: the
/// Hyper-V hypercalls are every hypercall only of a guest its VMM enlightened (one that is not
/// makes KVM's own, which `kvm_hv_hypercall` does not see), so the events source gives them only
/// for a VM whose enlightenments are known and not none ([`gives_totals`]).
pub fn totals() -> CounterSet {
    CounterSet::of_kind(ObjectKind::Vp, |c| c.id == vp::HYPERCALLS || c.id == vp::HYPERCALLS_COST)
}

/// True when the Hyper-V hypercalls are a VM's every hypercall: its enlightenments (a word of
/// [`hvstats_abi::hyperv_features`]) are known and not none.
pub fn gives_totals(enlightenments: Option<u64>) -> bool {
    enlightenments.and_then(hvstats_abi::hyperv_features::names).is_some_and(|mut n| n.next().is_some())
}

/// Every VP counter this writer can give, with what it is written from (for tests and docs).
pub fn counters() -> Vec<(CounterId, KvmHv)> {
    written().iter().map(|(id, what, _)| (*id, *what)).collect()
}

/// The counter a flush column writes to (for tests): `None` when `event` is no flush column.
pub fn flush_counter_of(event: usize) -> Option<CounterId> {
    let (_, effect, all) = flush_columns().nth(event.checked_sub(flushes())?)?;
    flush_counter(effect, all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_of_the_enlightenments_has_its_events() {
        let events = HypervEnlightenments.events(None);
        assert_eq!(events.len(), flushes() + 8);
        for (id, what) in counters() {
            let name = id.counter().map_or("?", |c| c.name);
            assert!(!events_of(what).is_empty(), "{name}");
            assert!(events_of(what).iter().all(|&i| i < events.len()), "{name}");
        }
        // Every flush column writes the counter the catalog's observed key names.
        for i in 0..events.len() {
            if let Some(id) = flush_counter_of(i) {
                let what = id.counter().and_then(kvm_hv_of);
                assert!(matches!(what, Some(KvmHv::Flushes(..))), "{id:?}");
                assert!(events_of(what.unwrap()).contains(&i));
            }
        }
        assert_eq!(class_filter(HypercallClass::LongSpinWait).as_deref(), Some("code == 0x8"));
        assert_eq!(
            class_filter(HypercallClass::SyntheticInterrupt).as_deref(),
            Some("code == 0x5c || code == 0x5d")
        );
        assert_eq!(
            flush_codes(HypercallEffect::GvaRangeFlush, "kvm_hv_flush_tlb").as_deref(),
            Some("code == 0x3")
        );
    }

    #[test]
    fn the_hyper_v_hypercalls_are_the_total_only_of_an_enlightened_guest() {
        use hvstats_abi::hyperv_features::{KNOWN, bit};
        assert!(gives_totals(Some(KNOWN | bit("hv-relaxed").unwrap())));
        assert!(!gives_totals(Some(KNOWN)), "known to have none");
        assert!(!gives_totals(None), "not known");
        assert!(totals().contains(vp::HYPERCALLS) && totals().contains(vp::HYPERCALLS_COST));
        assert_eq!(totals().ids().count(), 2);
    }

    #[test]
    fn hypercalls_and_their_cost_are_given_only_where_kvm_exit_does_not_fire() {
        let counted = |_| true;
        let fires = HypervEnlightenments.gives(&counted, KvmExitState::Fires).vp;
        assert!(!fires.contains(vp::HYPERCALLS) && !fires.contains(vp::HYPERCALLS_COST));
        assert!(fires.contains(vp::LONG_SPIN_WAIT_HYPERCALLS) && fires.contains(vp::SYNTHETIC_INTERRUPTS));
        for state in [KvmExitState::NoHardwareVirtualization, KvmExitState::Undecided, KvmExitState::Silent] {
            let gives = HypervEnlightenments.gives(&counted, state).vp;
            assert!(gives.contains(vp::HYPERCALLS) && gives.contains(vp::HYPERCALLS_COST), "{state:?}");
            assert!(gives.contains(vp::FAILED_HYPERCALLS) && gives.contains(vp::LOCAL_FLUSHED_GVA_RANGES));
        }
        // Perf counters count no carried column: the flush counters are not given, the rest are.
        let flushes_at = flushes();
        let perf = HypervEnlightenments.gives(&|i| i < flushes_at, KvmExitState::NoHardwareVirtualization).vp;
        assert!(!perf.contains(vp::ADDRESS_SPACE_FLUSHES) && !perf.contains(vp::GLOBAL_GVA_RANGE_FLUSHES));
        assert!(perf.contains(vp::VIRTUAL_MMU_HYPERCALLS) && perf.contains(vp::OTHER_HYPERCALLS));
    }
}
