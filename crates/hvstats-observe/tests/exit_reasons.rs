//! Every VMX exit reason and SVM exit code of the exit tables, as `kvm:kvm_exit` records of the
//! kernel's format, through the programs the observer attaches to `kvm_exit` and `kvm_entry`.
//!
//! No VMX or SVM here, so `kvm_exit` never fires: the observer's own event list for each
//! architecture (`vm_events`) is made into a rehearsal tally — the very programs it attaches,
//! instruction for instruction, attached nowhere — and the kernel runs them on each record with
//! `BPF_PROG_TEST_RUN` as a firing on this thread would. Each record must land in exactly the
//! class its row names (Other for the rest), be added to the tracepoint counters its row says, and
//! open exactly its class's span until `kvm_entry` closes it. The same records go through the
//! evaluator the filters compile to (which needs no privilege), and, record by record, into the
//! VP counters the writers make of them; so do AVIC's unaccelerated accesses
//! (`kvm_avic_unaccelerated_access`), which the APIC counters add.
//!
//! The records are built from the format text (`events/kvm/kvm_exit/format`): this host's when it
//! has one, and the kernel's as printed with and without the `requests` field it gained. The
//! rehearsal needs root (CAP_BPF); without it that part says "skipped", and fails under
//! `HVSTATS_REQUIRE_KVM=1`.

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod replay;

use replay::{KVM_ENTRY, KVM_EXIT, RecordFormat, gettid, host_format};

use std::collections::BTreeMap;
use std::path::Path;

use hvstats::SharedPage;
use hvstats_abi::catalog::{self, Maintained, vp};
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::exit_reason::{
    self as er, Counted, ExitFields, ExitReasonRow, ISA_SVM, ISA_VMX, InterceptClass, VMX_BUS_LOCK_DETECTED,
    VMX_ENCLAVE_MODE, VMX_FAILED_VMENTRY, VMX_FLAG_SETS,
};
use hvstats_abi::source::{Source, Tracepoint};
use hvstats_abi::{CounterId, ObjectKind};
use hvstats_host::bpf::filter::{self, Pred};
use hvstats_host::bpf::{Context, Engine, EngineError, Slot, ThreadTable};
use hvstats_host::counting::{EventSpec, engine_columns, engine_layout};
use hvstats_observe::sources::event_writer::{KvmExitState, ThreadReading, tracepoint_event};
use hvstats_observe::sources::events::{WRITERS, vm_events};
use hvstats_observe::sources::exit_classes::class_filter;

/// The same before `TRACE_EVENT_KVM_EXIT` gained `requests`.
const KVM_EXIT_BEFORE_REQUESTS: &str = "name: kvm_exit\nID: 97\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n\
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n\
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\
\n\
\tfield:unsigned int exit_reason;\toffset:8;\tsize:4;\tsigned:0;\n\
\tfield:unsigned long guest_rip;\toffset:16;\tsize:8;\tsigned:0;\n\
\tfield:u32 isa;\toffset:24;\tsize:4;\tsigned:0;\n\
\tfield:u64 info1;\toffset:32;\tsize:8;\tsigned:0;\n\
\tfield:u64 info2;\toffset:40;\tsize:8;\tsigned:0;\n\
\tfield:u32 intr_info;\toffset:48;\tsize:4;\tsigned:0;\n\
\tfield:u32 error_code;\toffset:52;\tsize:4;\tsigned:0;\n\
\tfield:unsigned int vcpu_id;\toffset:56;\tsize:4;\tsigned:0;\n\n";

/// `kvm:kvm_avic_unaccelerated_access` (6.18).
const KVM_AVIC_UNACCELERATED_ACCESS: &str = "name: kvm_avic_unaccelerated_access\nID: 60\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n\
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n\
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\
\n\
\tfield:u32 vcpu;\toffset:8;\tsize:4;\tsigned:0;\n\
\tfield:u32 offset;\toffset:12;\tsize:4;\tsigned:0;\n\
\tfield:bool ft;\toffset:16;\tsize:1;\tsigned:0;\n\
\tfield:bool rw;\toffset:17;\tsize:1;\tsigned:0;\n\
\tfield:u32 vec;\toffset:20;\tsize:4;\tsigned:0;\n\n";

/// The `kvm_exit` formats records are built from: this host's, and the kernel's two layouts.
fn exit_formats() -> Vec<(&'static str, String)> {
    let mut formats =
        vec![("linux", KVM_EXIT.to_owned()), ("linux before requests", KVM_EXIT_BEFORE_REQUESTS.to_owned())];
    if let Some(host) = host_format("kvm_exit") {
        formats.insert(0, ("this host", host));
    }
    formats
}

impl RecordFormat {
    /// A `kvm_exit` record of `isa` with `fields`, and the other fields a real one carries.
    fn exit(&self, tid: i32, isa: u32, e: &ExitFields) -> Vec<u8> {
        let mut values = vec![
            ("exit_reason", u64::from(e.exit_reason)),
            ("guest_rip", 0xffff_ffff_8100_0000),
            ("isa", u64::from(isa)),
            ("info1", e.info1),
            ("info2", 0x8000_0030),
            ("intr_info", u64::from(e.intr_info)),
            ("error_code", 4),
            ("vcpu_id", 1),
        ];
        if self.fields.contains_key("requests") {
            values.push(("requests", 1 << 3));
        }
        self.record(tid, &values)
    }
}

/// One exit to drive through the programs, and what its row says of it.
#[derive(Clone, Copy, Debug)]
struct Case {
    fields: ExitFields,
    class: InterceptClass,
    /// The row that takes it (none: Other, no row names it).
    row: Option<&'static ExitReasonRow>,
}

/// The exits of every row (VMX: bare, and with each combination of the kept flags), the exits a
/// row's condition leaves to another, the failed entries and unknown flags, and a sweep of the
/// codes no row names.
fn cases(isa: u32) -> Vec<Case> {
    let rows = er::table(isa).unwrap();
    let mut out = Vec::new();
    let mut push = |fields: ExitFields, class: InterceptClass| {
        // The reference classification must agree with the row the case was made from.
        assert_eq!(er::class_of(isa, &fields), class, "isa {isa}: {fields:x?}");
        out.push(Case { fields, class, row: er::row_of(isa, &fields) });
    };
    let flag_sets: &[u32] =
        if isa == ISA_VMX { &[0, VMX_FLAG_SETS[0], VMX_FLAG_SETS[1], VMX_FLAG_SETS[2]] } else { &[0] };
    for row in rows {
        for reason in row.first..=row.last {
            let reason = reason as u32;
            for &flags in flag_sets {
                let base = ExitFields { exit_reason: reason | flags, info1: 0, intr_info: 0 };
                match row.when {
                    Some(c) => {
                        for &v in c.values {
                            let mut f = base;
                            match c.field {
                                er::ExitField::IntrInfo => f.intr_info = v as u32,
                                er::ExitField::Info1 => f.info1 = v,
                            }
                            push(f, row.class);
                        }
                    }
                    None => push(base, row.class),
                }
            }
            if isa == ISA_VMX {
                // A failed entry, or a flag that changes the meaning: Other whatever the reason.
                for flag in [
                    VMX_FAILED_VMENTRY,
                    1 << 28,
                    1 << 29,
                    1 << 16,
                    VMX_FAILED_VMENTRY | VMX_BUS_LOCK_DETECTED,
                ] {
                    push(
                        ExitFields { exit_reason: reason | flag, ..ExitFields::default() },
                        InterceptClass::Other,
                    );
                }
            }
        }
    }
    // The same reasons with the neighbours of a condition's values: the row without one takes
    // them (or Other).
    let near_misses: &[(u32, ExitFields)] = match isa {
        ISA_VMX => &[
            (0, ExitFields { exit_reason: 0, intr_info: 0x8000_0306, info1: 0 }), // #UD
            (0, ExitFields { exit_reason: 0, intr_info: 0x8000_0202, info1: 0 }), // NMI
            (0, ExitFields { exit_reason: 0, intr_info: 0x8000_0b0d, info1: 0 }), // #GP
            (0, ExitFields { exit_reason: 0, intr_info: 0x0000_0b0e, info1: 0 }), // not valid
            (44, ExitFields { exit_reason: 44, intr_info: 0, info1: 0x00b0 }),    // EOI read
            (44, ExitFields { exit_reason: 44, intr_info: 0, info1: 0x1080 }),    // TPR write
            (44, ExitFields { exit_reason: 44 | VMX_ENCLAVE_MODE, intr_info: 0, info1: 0x1300 }),
        ],
        _ => &[
            (0x402, ExitFields { exit_reason: 0x402, intr_info: 0, info1: 0xb0 }), // EOI read
            (0x402, ExitFields { exit_reason: 0x402, intr_info: 0, info1: (1 << 32) | 0x80 }),
            (0x402, ExitFields { exit_reason: 0x402, intr_info: 0, info1: (1 << 32) | 0x300 }),
        ],
    };
    for &(_, f) in near_misses {
        push(f, er::class_of(isa, &f));
    }
    let sweep: Vec<u32> = match isa {
        ISA_VMX => (0..=0x7f).chain([0xff, 0x100, 0x1000, 0xffff]).collect(),
        _ => (0..=0x4ff)
            .chain([0x7fff_ffff, 0x8000_0001, 0x8000_0010, 0xf000_0000, 0xffff_fffe, er::SVM_EXIT_ERR])
            .collect(),
    };
    for reason in sweep {
        let f = ExitFields { exit_reason: reason, ..ExitFields::default() };
        push(f, er::class_of(isa, &f));
    }
    out
}

/// Where each event of the observer's list counts: the list, its tally columns, and the events on
/// `kvm_exit` by what they are.
struct Layout {
    isa: u32,
    specs: Vec<EventSpec>,
    columns: Vec<Option<usize>>,
    total: usize,
    /// By classified class, its count event.
    class_count: BTreeMap<InterceptClass, usize>,
    /// By class (Other too), its span event.
    class_span: BTreeMap<InterceptClass, usize>,
    /// The `kvm_exit` parts of the tracepoint writer, with the class whose added exits they count.
    parts: Vec<(Tracepoint, InterceptClass, usize)>,
}

impl Layout {
    fn of(isa: u32) -> Self {
        let specs = vm_events(Some(isa));
        let at = |spec: &EventSpec| {
            let found: Vec<usize> = (0..specs.len()).filter(|&i| &specs[i] == spec).collect();
            assert_eq!(found.len(), 1, "{spec:?} is one event of the list");
            found[0]
        };
        let total = at(&EventSpec::tracepoint("kvm", "kvm_exit"));
        let classified = InterceptClass::EXITS.into_iter().filter(|c| *c != InterceptClass::Other);
        let class_count = classified
            .clone()
            .map(|c| (c, at(&EventSpec::filtered("kvm", "kvm_exit", &class_filter(isa, c)))))
            .collect();
        let mut class_span: BTreeMap<_, _> = classified
            .map(|c| (c, at(&EventSpec::span("kvm", "kvm_exit", Some(&class_filter(isa, c)), "kvm_entry"))))
            .collect();
        class_span.insert(InterceptClass::Other, at(&EventSpec::span("kvm", "kvm_exit", None, "kvm_entry")));
        let parts = Tracepoint::ALL
            .into_iter()
            .filter_map(|tp| Some((tp, tp.exit_class()?, at(&tracepoint_event(tp)))))
            .collect();
        let columns = engine_columns(&specs);
        Layout { isa, specs, columns, total, class_count, class_span, parts }
    }

    /// The events of the list on `kvm_exit` one case adds one to, and the span it opens.
    fn expected(&self, case: &Case) -> (Vec<usize>, usize) {
        let mut up = vec![self.total];
        if let Some(&i) = self.class_count.get(&case.class) {
            up.push(i);
        }
        for &(_, class, i) in &self.parts {
            if case.row.is_some_and(|r| r.class == class && r.counted == Counted::Added) {
                up.push(i);
            }
        }
        up.sort_unstable();
        (up, self.class_span[&case.class])
    }

    /// The events on `kvm_exit` that count (not spans).
    fn exit_counts(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.specs.len())
            .filter(|&i| matches!(&self.specs[i], EventSpec::Tracepoint { name, .. } if name == "kvm_exit"))
    }

    fn spans(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.specs.len())
            .filter(|&i| matches!(&self.specs[i], EventSpec::Span { start, .. } if start == "kvm_exit"))
    }
}

/// The observer's programs for one architecture, rehearsed, counting this thread.
struct Rehearsal {
    layout: Layout,
    tally: Engine,
    slot: Slot,
    exit: RecordFormat,
}

impl Rehearsal {
    /// `None` (after saying why) where this host does not permit BPF.
    fn new(isa: u32, exit_format: &str, test: &str) -> Option<Self> {
        let layout = Layout::of(isa);
        let engine_layout = engine_layout(&layout.specs);
        let formats = |system: &str, name: &str| match (system, name) {
            ("kvm", "kvm_exit") => Some(exit_format.to_owned()),
            ("kvm", "kvm_entry") => Some(host_format("kvm_entry").unwrap_or_else(|| KVM_ENTRY.to_owned())),
            ("kvm", "kvm_avic_unaccelerated_access") => Some(
                host_format("kvm_avic_unaccelerated_access")
                    .unwrap_or_else(|| KVM_AVIC_UNACCELERATED_ACCESS.to_owned()),
            ),
            // Only these fire here: the other tracepoints' programs are left out.
            _ => None,
        };
        let tally = match Engine::rehearse(&formats, &engine_layout, ThreadTable::for_host()) {
            Ok(t) => t,
            Err(e @ EngineError::Map(_)) => {
                let why = hvstats_host::error_chain::error_chain(&e);
                assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "{test}: {why}");
                eprintln!("{test}: skipped: {why}");
                return None;
            }
            Err(e) => panic!("{test}: {}", hvstats_host::error_chain::error_chain(&e)),
        };
        // Every kvm_exit and kvm_entry event has its program: none is refused.
        for i in layout.exit_counts().chain(layout.spans()) {
            let column = layout.columns[i].unwrap();
            assert_eq!(tally.refused(column), None, "{:?}", layout.specs[i]);
        }
        assert_eq!(
            tally.context("kvm", "kvm_exit"),
            Some(Context::Record),
            "kvm_exit's fields are in its record"
        );
        let slot = tally.add_thread(std::process::id() as i32, gettid()).unwrap();
        Some(Rehearsal { layout, tally, slot, exit: RecordFormat::parse(exit_format) })
    }

    fn read(&self) -> Vec<u64> {
        self.tally.read(self.slot).unwrap()
    }

    /// Fires `kvm_exit` with the case's record: the program's return value, each event's count
    /// added (by event of the list), and the span left open.
    fn exit(&self, case: &Case) -> (u32, Vec<u64>, Option<usize>) {
        let before = self.read();
        let record = self.exit.exit(gettid(), self.layout.isa, &case.fields);
        let ret = self.tally.fire("kvm", "kvm_exit", &record).unwrap();
        let after = self.read();
        let added = self.layout.columns.iter().map(|c| c.map_or(0, |c| after[c] - before[c])).collect();
        (ret, added, self.tally.open_span(self.slot).unwrap())
    }

    /// Fires `kvm_entry`: the time added to each span event.
    fn entry(&self) -> Vec<u64> {
        let before = self.read();
        let context: &[u8] = &[];
        assert_eq!(
            self.tally.context("kvm", "kvm_entry"),
            Some(Context::Arguments),
            "kvm_entry reads no field"
        );
        self.tally.fire("kvm", "kvm_entry", context).unwrap();
        let after = self.read();
        self.layout.columns.iter().map(|c| c.map_or(0, |c| after[c] - before[c])).collect()
    }
}

#[test]
fn every_exit_of_both_architectures_lands_in_its_class_through_the_observers_programs() {
    let test = "every_exit_lands_in_its_class_through_the_observers_programs";
    for (source, format) in exit_formats() {
        for isa in [ISA_VMX, ISA_SVM] {
            let Some(r) = Rehearsal::new(isa, &format, test) else { return };
            let span_column = |event: usize| r.layout.columns[event].unwrap();
            let cases = cases(isa);
            for case in &cases {
                let what = format!(
                    "{source} format, isa {isa}, {:x?} ({:?})",
                    case.fields,
                    case.row.map(|r| r.name)
                );
                let (ret, added, open) = r.exit(case);
                // As any tracepoint program of ours: the firing goes on to perf events.
                assert_eq!(ret, 1, "{what}");
                let (up, span) = r.layout.expected(case);
                let counted: Vec<usize> = (0..added.len()).filter(|&i| added[i] != 0).collect();
                assert_eq!(counted, up, "{what}: the events counted (expected {:?})", case.class);
                assert!(up.iter().all(|&i| added[i] == 1), "{what}: {added:?}");
                // Exactly its class's span is open, until kvm_entry closes it.
                assert_eq!(open, Some(span_column(span)), "{what}: the span opened");
                let timed = r.entry();
                assert_eq!(r.tally.open_span(r.slot).unwrap(), None, "{what}: kvm_entry closes the span");
                for i in r.layout.spans() {
                    assert_eq!(
                        timed[i] > 0,
                        i == span,
                        "{what}: span {:?} timed {}",
                        r.layout.specs[i],
                        timed[i]
                    );
                }
            }
            eprintln!("{source} format, isa {isa}: {} kvm_exit records, each in its class", cases.len());
        }
    }
}

#[test]
fn every_exit_lands_in_its_class_through_the_evaluator_the_filters_compile_to() {
    for (source, format) in exit_formats() {
        let exit = RecordFormat::parse(&format);
        for isa in [ISA_VMX, ISA_SVM] {
            let layout = Layout::of(isa);
            let preds: BTreeMap<usize, Option<Pred>> = layout
                .exit_counts()
                .chain(layout.spans())
                .map(|i| {
                    let filter = match &layout.specs[i] {
                        EventSpec::Tracepoint { filter, .. } | EventSpec::Span { filter, .. } => {
                            filter.as_deref()
                        }
                        EventSpec::Software(_) | EventSpec::Carried { .. } => None,
                    };
                    (i, filter.map(|f| filter::parse_filter(f, &exit.fields).unwrap()))
                })
                .collect();
            for case in cases(isa) {
                let what = format!("{source} format, isa {isa}, {:x?}", case.fields);
                let record = exit.exit(gettid(), isa, &case.fields);
                let holds = |i: usize| preds[&i].as_ref().is_none_or(|p| p.eval(&record));
                let counted: Vec<usize> = layout.exit_counts().filter(|&i| holds(i)).collect();
                let (up, span) = layout.expected(&case);
                assert_eq!(counted, up, "{what}");
                // The spans, in the order the program tries them: the first that holds opens.
                assert_eq!(layout.spans().find(|&i| holds(i)), Some(span), "{what}");
            }
        }
    }
}

/// What the kernel sources say a few exits are, written out apart from the tables: (isa,
/// exit_reason, intr_info, info1) and the VP counter `kvm_exit` must add one to (Other intercepts
/// when no class takes it; none when a tracepoint of what KVM does counts it instead).
const FACTS: &[(u32, u32, u32, u64, Option<CounterId>)] = &[
    // VMX: APICv (vmx.c handle_apic_eoi_induced, handle_apic_write, handle_tpr_below_threshold).
    (ISA_VMX, 45, 0, 0, Some(vp::APIC_EOI_ACCESSES)),
    (ISA_VMX, 56, 0, 0x300, Some(vp::APIC_MMIO_ACCESSES)),
    (ISA_VMX, 43, 0, 0, Some(vp::APIC_TPR_ACCESSES)),
    // handle_apic_access: a linear EOI write (fasteoi) is not emulated.
    (ISA_VMX, 44, 0, 0x10b0, Some(vp::APIC_EOI_ACCESSES)),
    // Flags 26/27 leave the basic reason; 31 is a failed entry (KVM_EXIT_FAIL_ENTRY).
    (ISA_VMX, 12 | (1 << 26), 0, 0, Some(vp::HLT_INSTRUCTIONS)),
    (ISA_VMX, 12 | (1 << 27), 0, 0, Some(vp::HLT_INSTRUCTIONS)),
    (ISA_VMX, 1 | (3 << 26), 0, 0, Some(vp::EXTERNAL_INTERRUPTS)),
    (ISA_VMX, 33 | (1 << 31), 0, 0, Some(vp::OTHER_INTERCEPTS)),
    (ISA_VMX, 12 | (1 << 31), 0, 0, Some(vp::OTHER_INTERCEPTS)),
    // A #PF exception exit, with NMI unblocking (intr_info bit 12) and without.
    (ISA_VMX, 0, 0x8000_0b0e, 0, Some(vp::PAGE_FAULT_INTERCEPTS)),
    (ISA_VMX, 0, 0x8000_1b0e, 0, Some(vp::PAGE_FAULT_INTERCEPTS)),
    (ISA_VMX, 0, 0x8000_0306, 0, Some(vp::OTHER_INTERCEPTS)),
    (ISA_VMX, 48, 0, 0x181, Some(vp::NESTED_PAGE_FAULT_INTERCEPTS)),
    (ISA_VMX, 49, 0, 0, Some(vp::NESTED_PAGE_FAULT_INTERCEPTS)),
    (ISA_VMX, 18, 0, 0, Some(vp::HYPERCALLS)),
    (ISA_VMX, 29, 0, 0, Some(vp::DEBUG_REGISTER_ACCESSES)),
    (ISA_VMX, 36, 0, 0, Some(vp::MWAIT_INSTRUCTIONS)),
    (ISA_VMX, 7, 0, 0, Some(vp::PENDING_INTERRUPTS)),
    (ISA_VMX, 14, 0, 0, Some(vp::PAGE_INVALIDATIONS)),
    (ISA_VMX, 40, 0, 0, Some(vp::OTHER_INTERCEPTS)),
    // Counted by the tracepoints of what KVM does (kvm_cpuid, kvm_pio, kvm_msr, kvm_cr, kvm_mmio).
    (ISA_VMX, 10, 0, 0, None),
    (ISA_VMX, 30, 0, 0, None),
    (ISA_VMX, 32 | (1 << 27), 0, 0, None),
    (ISA_VMX, 28, 0, 0, None),
    (ISA_VMX, 44, 0, 0x1080, None),
    // SVM: AVIC (avic.c), SVM_EXIT_ERR (svm_handle_exit), NPF, #PF, the SEV-ES traps.
    (ISA_SVM, 0x401, 0, 0, Some(vp::APIC_MMIO_ACCESSES)),
    (ISA_SVM, 0x402, 0, (1 << 32) | 0xb0, Some(vp::APIC_EOI_ACCESSES)),
    (ISA_SVM, 0xffff_ffff, 0, 0, Some(vp::OTHER_INTERCEPTS)),
    (ISA_SVM, 0x400, 0, 0, Some(vp::NESTED_PAGE_FAULT_INTERCEPTS)),
    (ISA_SVM, 0x04e, 0, 0, Some(vp::PAGE_FAULT_INTERCEPTS)),
    (ISA_SVM, 0x094, 0, 0, Some(vp::CONTROL_REGISTER_ACCESSES)),
    (ISA_SVM, 0x08f, 0, 0, Some(vp::MSR_ACCESSES)),
    (ISA_SVM, 0x078, 0, 0, Some(vp::HLT_INSTRUCTIONS)),
    (ISA_SVM, 0x0a6, 0, 0, Some(vp::HLT_INSTRUCTIONS)),
    (ISA_SVM, 0x060, 0, 0, Some(vp::EXTERNAL_INTERRUPTS)),
    (ISA_SVM, 0x081, 0, 0, Some(vp::HYPERCALLS)),
    (ISA_SVM, 0x403, 0, 0, Some(vp::OTHER_INTERCEPTS)),
    (ISA_SVM, 0x072, 0, 0, None),
    (ISA_SVM, 0x07c, 1, 0, None),
    (ISA_SVM, 0x402, 0, (1 << 32) | 0x300, None),
];

/// The VP counters an exit is counted into by the event writers: the intercept classes' and the
/// tracepoint counters `kvm_exit` parts are added to.
fn exit_fed_counters() -> Vec<CounterId> {
    let mut ids: Vec<CounterId> = InterceptClass::EXITS.iter().map(|c| c.counter()).collect();
    ids.sort_by_key(|id| id.index);
    ids.dedup();
    ids
}

/// A VP page as the event writers write it from one thread's `counts` (by event of the list, as
/// the events source hands each writer its own), `kvm_exit` seen to fire.
fn page_of(isa: u32, counts: &[Option<u64>]) -> SharedPage {
    let all = CounterSet::of_kind(ObjectKind::Vp, |_| true);
    let page = SharedPage::anonymous(ObjectKind::Vp).unwrap();
    let mut at = 0;
    for writer in WRITERS {
        let n = writer.events(Some(isa)).len();
        let reading = ThreadReading { counts: &counts[at..at + n], kvm_exit: KvmExitState::Fires };
        writer.write(&reading, &page, &all);
        at += n;
    }
    assert_eq!(at, counts.len());
    page
}

#[test]
fn each_exit_adds_one_to_the_vp_counter_the_kernel_sources_say() {
    let test = "each_exit_adds_one_to_the_vp_counter_the_kernel_sources_say";
    for isa in [ISA_VMX, ISA_SVM] {
        let Some(r) = Rehearsal::new(isa, KVM_EXIT, test) else { return };
        for &(_, exit_reason, intr_info, info1, counter) in FACTS.iter().filter(|f| f.0 == isa) {
            let fields = ExitFields { exit_reason, intr_info, info1 };
            let case = Case { fields, class: er::class_of(isa, &fields), row: er::row_of(isa, &fields) };
            let before = r.read();
            r.exit(&case);
            r.entry();
            let after = r.read();
            // The reading of this one exit: the counts it added; the tracepoints that did not fire
            // (kvm_mmio, kvm_msr, …: no program here) counted 0.
            let counts: Vec<Option<u64>> =
                r.layout.columns.iter().map(|c| Some(c.map_or(0, |c| after[c] - before[c]))).collect();
            let page = page_of(isa, &counts);
            let what = format!(
                "isa {isa}, exit_reason {exit_reason:#x}, intr_info {intr_info:#x}, info1 {info1:#x}"
            );
            for id in exit_fed_counters() {
                let name = id.counter().unwrap().name;
                assert_eq!(page.get(id), u64::from(Some(id) == counter), "{what}: {name}");
            }
        }
    }
}

#[test]
fn the_programs_rehearsed_are_accepted_as_the_tracepoint_programs_the_observer_attaches() {
    let tracefs = Path::new("/sys/kernel/tracing");
    if host_format("kvm_exit").is_none() {
        eprintln!("no kvm_exit tracepoint on this host: skipped");
        return;
    }
    for isa in [ISA_VMX, ISA_SVM] {
        let layout = Layout::of(isa);
        let tally = match Engine::of_layout(tracefs, &engine_layout(&layout.specs), ThreadTable::for_host()) {
            Ok(t) => t,
            Err(e @ EngineError::Map(_)) => {
                let why = hvstats_host::error_chain::error_chain(&e);
                assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "{why}");
                eprintln!("skipped: {why}");
                return;
            }
            Err(e) => panic!("{}", hvstats_host::error_chain::error_chain(&e)),
        };
        for i in layout.exit_counts().chain(layout.spans()) {
            assert_eq!(tally.refused(layout.columns[i].unwrap()), None, "{:?}", layout.specs[i]);
        }
    }
}

/// A reason (or range) as the docs write it.
fn reason_text(isa: u32, r: &ExitReasonRow) -> String {
    let n = |v: u64| if isa == ISA_VMX { v.to_string() } else { format!("0x{v:03x}") };
    if r.first == r.last { n(r.first) } else { format!("{}–{}", n(r.first), n(r.last)) }
}

/// How the docs say a row's counter gets it.
fn counted_text(r: &ExitReasonRow) -> String {
    let counter = r.class.counter().counter().unwrap();
    let tracepoint = match catalog::observed(counter).and_then(Maintained::source) {
        Some(Source::Tracepoint(tp)) => Some(tp.event()),
        _ => None,
    };
    match (r.counted, r.class) {
        (Counted::Exit, InterceptClass::Other) => "kvm_exit, less every classified exit".into(),
        (Counted::Exit, _) => "kvm_exit".into(),
        (Counted::Tracepoint(tp), _) => format!("{tp} (kvm_exit takes it out of Other)"),
        (Counted::Added, _) => format!("kvm_exit, added to {}'s count", tracepoint.unwrap()),
    }
}

/// The docs' table of one architecture, from its exit table.
fn doc_table(isa: u32) -> String {
    let mut t =
        String::from("| Reason | Name | Condition | Class | Counter | Counted by | What KVM does |\n");
    t.push_str("|---|---|---|---|---|---|---|\n");
    for r in er::table(isa).unwrap() {
        let condition = r.when.map_or_else(String::new, |c| {
            let values: Vec<String> = c.values.iter().map(|v| format!("{v:#x}")).collect();
            format!("`{}` ∈ {{{}}}: {}", c.field.name(), values.join(", "), c.meaning)
        });
        let counter = r.class.counter().counter().unwrap().name;
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            reason_text(isa, r),
            r.name,
            condition,
            r.class.name(),
            counter,
            counted_text(r),
            r.note
        ));
    }
    let any = if isa == ISA_VMX {
        "any other basic reason, or any flag but bits 26 and 27"
    } else {
        "any other code"
    };
    t.push_str(&format!(
        "| {any} | | | other | Other intercepts/sec | kvm_exit, less every classified exit | |\n"
    ));
    t
}

#[test]
fn docs_exits_md_holds_the_exit_tables() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/exits.md");
    let mut text = std::fs::read_to_string(&path).unwrap();
    let mut stale = Vec::new();
    for (isa, name) in [(ISA_VMX, "vmx"), (ISA_SVM, "svm")] {
        let (begin, end) = (format!("<!-- {name} table: begin -->\n"), format!("<!-- {name} table: end -->"));
        let from = text.find(&begin).map(|i| i + begin.len()).expect("begin marker");
        let to = from + text[from..].find(&end).expect("end marker");
        let table = doc_table(isa);
        if text[from..to] != table {
            stale.push(name);
            text.replace_range(from..to, &table);
        }
    }
    if !stale.is_empty() && std::env::var_os("HVSTATS_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &text).unwrap();
        return;
    }
    assert!(
        stale.is_empty(),
        "docs/exits.md: the {stale:?} tables differ from the code's (HVSTATS_UPDATE_DOCS=1 rewrites them)"
    );
}

#[test]
fn avic_writes_kvm_completes_after_the_fact_are_added_to_apic_mmio_accesses_but_eoi() {
    // avic.c: a trap-like unaccelerated access (ft) is a write KVM completes without emulating
    // it, which kvm_mmio does not see; a fault is emulated (kvm_mmio sees it); the EOI's trap is
    // counted from kvm_exit (0x402 with EXITINFO1 0x1000000B0) as an EOI.
    let test = "avic_writes_are_added_to_apic_mmio_accesses";
    let Some(r) = Rehearsal::new(ISA_SVM, KVM_EXIT, test) else { return };
    let name = "kvm_avic_unaccelerated_access";
    let format =
        RecordFormat::parse(&host_format(name).unwrap_or_else(|| KVM_AVIC_UNACCELERATED_ACCESS.to_owned()));
    let part = (0..r.layout.specs.len())
        .find(|&i| r.layout.specs[i] == tracepoint_event(Tracepoint::AvicTrap))
        .unwrap();
    let column = r.layout.columns[part].unwrap();
    for (offset, trap, write, added) in
        [(0x300, 1, 1, 1), (0x320, 1, 1, 1), (0xb0, 1, 1, 0), (0x300, 0, 1, 0), (0x80, 0, 0, 0)]
    {
        let before = r.read();
        let record = format
            .record(gettid(), &[("vcpu", 1), ("offset", offset), ("ft", trap), ("rw", write), ("vec", 0)]);
        assert_eq!(r.tally.fire("kvm", name, &record).unwrap(), 1);
        let after = r.read();
        assert_eq!(after[column] - before[column], added, "offset {offset:#x}, trap {trap}");
        // Into the page: APIC MMIO accesses gains it, and only it.
        let counts: Vec<Option<u64>> =
            r.layout.columns.iter().map(|c| Some(c.map_or(0, |c| after[c] - before[c]))).collect();
        let page = page_of(ISA_SVM, &counts);
        for id in exit_fed_counters() {
            let expected = if id == vp::APIC_MMIO_ACCESSES { added } else { 0 };
            assert_eq!(
                page.get(id),
                expected,
                "offset {offset:#x}, trap {trap}: {}",
                id.counter().unwrap().name
            );
        }
    }
}
