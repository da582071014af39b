//! The event writer of VM exits by intercept class, on VMX/SVM hosts: `kvm:kvm_exit` counted
//! whole and filtered by the exit reasons of each class ([`hvstats_abi::exit_reason`]), each class
//! written into its intercept counter (Other: every exit no class took), and the time from each
//! class's exit to the thread's next `kvm:kvm_entry`, timed in the kernel, into its cost counter.
//! A class whose counter a tracepoint gives (CPUID: `kvm_cpuid`) is counted here only to take it
//! out of Other and to time it; the exits that tracepoint misses (APICv's) are added to it by the
//! tracepoint writer, from the same tables.
//!
//! `kvm_exit` counted whole also tells whether it fires at all (a software KVM never fires it);
//! nothing of this writer is given until it is seen to.

use hvstats::SharedPage;
use hvstats_abi::ObjectKind;
use hvstats_abi::catalog::{self, Counter, Maintained};
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::exit_filter;
use hvstats_abi::exit_reason::{self, InterceptClass};
use hvstats_abi::source::Source;

use super::event_writer::{EventWriter, KvmExitState, ThreadReading};
use crate::thread_counters::EventSpec;
use hvstats_sources::counter_source::Gives;

/// The ftrace filter on `kvm_exit` that matches the exits of `class` on a host of `isa`, or one
/// that matches none where the architecture has no exit of the class (so that every class keeps
/// its place in the list, and no exit is counted in two).
pub fn class_filter(isa: u32, class: InterceptClass) -> String {
    exit_filter::class_filter(isa, class).map_or_else(|| exit_filter::NO_EXIT.to_owned(), |f| f.to_string())
}

/// The classes counted by their own `kvm_exit` filter (all but Other, which is the rest).
fn classified() -> impl Iterator<Item = InterceptClass> {
    InterceptClass::EXITS.into_iter().filter(|c| *c != InterceptClass::Other)
}

/// Where this writer's events sit: `kvm_exit` whole, then on VMX/SVM hosts one filtered
/// `kvm_exit` per classified class, then one span per classified class and Other's last.
const KVM_EXIT: usize = 0;
const CLASSES: usize = 1;
const CLASSIFIED: usize = InterceptClass::EXITS.len() - 1;
const TIMES: usize = CLASSES + CLASSIFIED;

/// The event of `class`'s span.
fn span_of(class: InterceptClass) -> Option<usize> {
    match class {
        InterceptClass::Other => Some(TIMES + CLASSIFIED),
        _ => classified().position(|c| c == class).map(|i| TIMES + i),
    }
}

/// Classes whose counter a tracepoint already gives exactly (the tracepoint is kept): the
/// counter's observed key is a tracepoint.
fn class_has_tracepoint(class: InterceptClass) -> bool {
    let counter = class.counter().counter();
    matches!(counter.and_then(catalog::observed).and_then(Maintained::source), Some(Source::Tracepoint(_)))
}

/// True when `id` is the counter of an intercept class `kvm_exit` counts by reason.
fn is_class_counter(id: hvstats_abi::CounterId) -> bool {
    InterceptClass::EXITS
        .into_iter()
        .any(|c| c.counter() == id && (c == InterceptClass::Other || !class_has_tracepoint(c)))
}

/// VM exits by intercept class.
#[derive(Debug)]
pub struct ExitClasses;

impl EventWriter for ExitClasses {
    fn events(&self, isa: Option<u32>) -> Vec<EventSpec> {
        let mut specs = vec![EventSpec::tracepoint("kvm", "kvm_exit")];
        if let Some(isa) = isa.filter(|&isa| exit_reason::table(isa).is_some()) {
            for class in classified() {
                specs.push(EventSpec::filtered("kvm", "kvm_exit", &class_filter(isa, class)));
            }
            // A thread has one open span: the class whose filter matches opens it (no exit is in
            // two), and the unfiltered span last takes every exit no class took (Other).
            for class in classified() {
                specs.push(EventSpec::span("kvm", "kvm_exit", Some(&class_filter(isa, class)), "kvm_entry"));
            }
            specs.push(EventSpec::span("kvm", "kvm_exit", None, "kvm_entry"));
        }
        specs
    }

    fn gives(&self, counted: &dyn Fn(usize) -> bool, kvm_exit: KvmExitState) -> Gives {
        if kvm_exit != KvmExitState::Fires {
            return Gives::NOTHING;
        }
        Gives::vp(CounterSet::of_kind(ObjectKind::Vp, |c| {
            match catalog::observed(c).and_then(Maintained::source) {
                Some(Source::KvmExitTime(class)) => span_of(class).is_some_and(counted),
                Some(Source::KvmExit(_)) => true,
                _ => is_class_counter(c.id),
            }
        }))
    }

    fn write(&self, reading: &ThreadReading<'_>, page: &SharedPage, only: &CounterSet) {
        if reading.kvm_exit != KvmExitState::Fires {
            return;
        }
        write_exit_classes(page, only, reading);
        write_exit_times(page, only, reading);
    }
}

/// Writes the classes counted from `kvm_exit` that no tracepoint gives, and Other (every exit
/// not in a class).
fn write_exit_classes(page: &SharedPage, only: &CounterSet, reading: &ThreadReading<'_>) {
    let Some(total) = reading.count(KVM_EXIT) else { return };
    let mut classified_exits = 0u64;
    for (i, class) in classified().enumerate() {
        let Some(n) = reading.count(CLASSES + i) else { continue };
        classified_exits += n;
        if !class_has_tracepoint(class) && only.contains(class.counter()) {
            page.set(class.counter(), n);
        }
    }
    if only.contains(InterceptClass::Other.counter()) {
        page.set(InterceptClass::Other.counter(), total.saturating_sub(classified_exits));
    }
}

/// Writes each intercept class's time from exit to entry (nanoseconds, as 100 ns) into its cost
/// counter, from the spans `kvm_exit` → `kvm_entry`; a span not counted leaves its counter.
fn write_exit_times(page: &SharedPage, only: &CounterSet, reading: &ThreadReading<'_>) {
    for class in InterceptClass::EXITS {
        let cost = class.counter().counter().and_then(Counter::cost);
        if let (Some(cost), Some(ns)) = (cost, span_of(class).and_then(|i| reading.count(i)))
            && only.contains(cost.id)
        {
            page.set(cost.id, ns / 100);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hvstats_abi::catalog::vp;

    fn all() -> CounterSet {
        CounterSet::of_kind(ObjectKind::Vp, |_| true)
    }

    #[test]
    fn class_filters_name_every_reason_of_the_class_and_a_class_without_exits_matches_none() {
        use exit_reason::{ISA_SVM, ISA_VMX};
        assert!(class_filter(ISA_VMX, InterceptClass::Cpuid).starts_with("exit_reason == 10 || "));
        assert!(class_filter(ISA_VMX, InterceptClass::Msr).starts_with(
            "exit_reason == 31 || exit_reason == 32 || exit_reason == 84 || exit_reason == 85 || "
        ));
        assert_eq!(
            class_filter(ISA_SVM, InterceptClass::DebugRegister),
            "(exit_reason >= 0x20 && exit_reason <= 0x2f) || (exit_reason >= 0x30 && exit_reason <= 0x3f)"
        );
        // SVM has no TPR exit: not `exit_reason == 0xffffffff`, which is SVM_EXIT_ERR.
        assert_eq!(class_filter(ISA_SVM, InterceptClass::ApicTpr), exit_filter::NO_EXIT);
    }

    #[test]
    fn event_indices_match_the_list() {
        assert_eq!(ExitClasses.events(None), [EventSpec::tracepoint("kvm", "kvm_exit")]);
        let vmx = ExitClasses.events(Some(exit_reason::ISA_VMX));
        assert_eq!(vmx.len(), TIMES + InterceptClass::EXITS.len());
        let invlpg = class_filter(exit_reason::ISA_VMX, InterceptClass::PageInvalidation);
        assert!(invlpg.starts_with("exit_reason == 14 || exit_reason == 58 || "), "{invlpg}");
        assert_eq!(vmx[TIMES], EventSpec::span("kvm", "kvm_exit", Some(&invlpg), "kvm_entry"));
        assert_eq!(
            vmx[span_of(InterceptClass::Other).unwrap()],
            EventSpec::span("kvm", "kvm_exit", None, "kvm_entry")
        );
        assert_eq!(ExitClasses.events(Some(exit_reason::ISA_SVM)).len(), vmx.len());
    }

    #[test]
    fn exit_to_entry_spans_are_the_costs_of_their_classes() {
        let page = hvstats::SharedPage::anonymous(ObjectKind::Vp).unwrap();
        let mut counts = vec![None; TIMES + InterceptClass::EXITS.len()];
        counts[span_of(InterceptClass::Cpuid).unwrap()] = Some(123_456);
        counts[span_of(InterceptClass::Halt).unwrap()] = Some(5_000_000_000);
        counts[span_of(InterceptClass::Other).unwrap()] = Some(900);
        let reading = ThreadReading { counts: &counts, kvm_exit: KvmExitState::Fires };
        write_exit_times(&page, &all(), &reading);
        assert_eq!(page.get(vp::CPUID_INSTRUCTIONS_COST), 1_234);
        assert_eq!(page.get(vp::HLT_INSTRUCTIONS_COST), 50_000_000);
        assert_eq!(page.get(vp::OTHER_INTERCEPTS_COST), 9);
        // A span not counted leaves its counter alone.
        assert_eq!(page.get(vp::IO_INSTRUCTIONS_COST), 0);
        // Every class with a cost counter has a span, and the catalog says where it comes from.
        for class in InterceptClass::EXITS {
            let Some(cost) = class.counter().counter().and_then(Counter::cost) else { continue };
            assert!(span_of(class).is_some(), "{class:?}");
            let observed = catalog::observed(cost).and_then(Maintained::source);
            assert_eq!(observed, Some(Source::KvmExitTime(class)), "{}", cost.name);
        }
    }

    #[test]
    fn exit_classes_fill_other_with_the_rest() {
        let page = hvstats::SharedPage::anonymous(ObjectKind::Vp).unwrap();
        let mut counts = vec![Some(0); TIMES];
        counts[KVM_EXIT] = Some(100);
        let at = |c: InterceptClass| CLASSES + classified().position(|x| x == c).unwrap();
        counts[at(InterceptClass::Halt)] = Some(7);
        counts[at(InterceptClass::Cpuid)] = Some(50);
        counts[at(InterceptClass::ExternalInterrupt)] = Some(3);
        let reading = ThreadReading { counts: &counts, kvm_exit: KvmExitState::Fires };
        write_exit_classes(&page, &all(), &reading);
        assert_eq!(page.get(vp::HLT_INSTRUCTIONS), 7);
        assert_eq!(page.get(vp::EXTERNAL_INTERRUPTS), 3);
        assert_eq!(page.get(vp::OTHER_INTERCEPTS), 40);
        // CPUID comes from kvm_cpuid, not from kvm_exit.
        assert_eq!(page.get(vp::CPUID_INSTRUCTIONS), 0);
    }

    #[test]
    fn nothing_is_given_before_kvm_exit_is_seen_to_fire() {
        let counted = |_| true;
        assert_eq!(ExitClasses.gives(&counted, KvmExitState::Undecided), Gives::NOTHING);
        assert_eq!(ExitClasses.gives(&counted, KvmExitState::NoHardwareVirtualization), Gives::NOTHING);
        let fires = ExitClasses.gives(&counted, KvmExitState::Fires).vp;
        assert!(fires.contains(vp::HLT_INSTRUCTIONS) && fires.contains(vp::OTHER_INTERCEPTS));
        assert!(fires.contains(vp::HLT_INSTRUCTIONS_COST));
        // CPUID is the tracepoint's.
        assert!(!fires.contains(vp::CPUID_INSTRUCTIONS));
    }
}
