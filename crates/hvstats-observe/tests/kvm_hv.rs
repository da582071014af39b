//! KVM's Hyper-V tracepoints (`kvm:kvm_hv_*`), as records of the formats of Linux 5.15, 6.1, 6.6
//! and 6.12 (and this host's), through the programs the observer attaches to them.
//!
//! No machine here emulates Hyper-V (KVM refuses QEMU's `hv-*` MSRs without VMX/SVM), so none of
//! these tracepoints fires: the observer's own event list (`vm_events`) is made into a rehearsal
//! tally — the very programs it attaches, attached nowhere — and the kernel runs them on each
//! record with `BPF_PROG_TEST_RUN` as a firing on this thread would. Each record must add exactly
//! what the TLFS says to its VP counter and nothing elsewhere, written into a page by the event
//! writers; the same records go through the evaluator the perf counters' filters compile to.
//!
//! What each code is counted as is written out here apart from the hypercall table
//! (`hvstats_abi::hypercall::HYPERCALLS`), from the TLFS: a wrong row of the table fails these
//! tests. The layouts are those of `docs/kvm-hv-tracepoints.md` (`arch/x86/kvm/trace.h` of each
//! release). The rehearsal needs root (CAP_BPF); without it the tests say "skipped", and fail
//! under `HVSTATS_REQUIRE_KVM=1`.

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod replay;

use replay::{KVM_ENTRY, KVM_EXIT, RecordFormat, gettid, host_format};

use std::collections::BTreeMap;

use hvstats::SharedPage;
use hvstats_abi::catalog::{self, vp};
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::exit_reason::{ISA_VMX, InterceptClass};
use hvstats_abi::{CounterId, ObjectKind};
use hvstats_host::bpf::filter;
use hvstats_host::bpf::{Context, Engine, EngineError, Slot, ThreadTable};
use hvstats_host::counting::{EventSpec, engine_columns, engine_layout};
use hvstats_observe::sources::event_writer::{EventWriter, KvmExitState, ThreadReading};
use hvstats_observe::sources::events::{WRITERS, vm_events};
use hvstats_observe::sources::exit_classes::class_filter;
use hvstats_observe::sources::hyperv;

/// A field: (type, name, offset, size, signed).
type FieldDecl = (&'static str, &'static str, u16, u8, bool);

/// A tracepoint's format file as tracefs prints it (the `print fmt` line left out: nothing reads
/// it), with the common header every release has.
fn format_text(name: &str, id: u32, fields: &[FieldDecl]) -> String {
    let mut t = format!(
        "name: {name}\nID: {id}\nformat:\n\
         \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
         \tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n\
         \tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n\
         \tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
    );
    for (ty, field, offset, size, signed) in fields {
        t.push_str(&format!(
            "\tfield:{ty} {field};\toffset:{offset};\tsize:{size};\tsigned:{};\n",
            u8::from(*signed)
        ));
    }
    t.push('\n');
    t
}

/// The kernel releases whose layouts are replayed (docs/kvm-hv-tracepoints.md).
const RELEASES: [&str; 4] = ["5.15", "6.1", "6.6", "6.12"];

/// The format of `kvm:name` in `release` (`arch/x86/kvm/trace.h` of that release).
fn release_format(release: &str, name: &str) -> Option<String> {
    let before_6_1 = release == "5.15";
    let guest_mode = matches!(release, "6.6" | "6.12");
    let mut fields: Vec<FieldDecl> = match name {
        "kvm_hv_hypercall" => {
            let mut f = vec![
                ("__u16", "rep_cnt", 8, 2, false),
                ("__u16", "rep_idx", 10, 2, false),
                ("__u64", "ingpa", 16, 8, false),
                ("__u64", "outgpa", 24, 8, false),
                ("__u16", "code", 32, 2, false),
            ];
            if before_6_1 {
                f.push(("bool", "fast", 34, 1, false));
            } else {
                f.push(("__u16", "var_cnt", 34, 2, false));
                f.push(("bool", "fast", 36, 1, false));
            }
            f
        }
        "kvm_hv_hypercall_done" => vec![("__u64", "result", 8, 8, false)],
        "kvm_hv_flush_tlb" => vec![
            ("u64", "processor_mask", 8, 8, false),
            ("u64", "address_space", 16, 8, false),
            ("u64", "flags", 24, 8, false),
        ],
        "kvm_hv_flush_tlb_ex" => vec![
            ("u64", "valid_bank_mask", 8, 8, false),
            ("u64", "format", 16, 8, false),
            ("u64", "address_space", 24, 8, false),
            ("u64", "flags", 32, 8, false),
        ],
        "kvm_hv_send_ipi" => vec![("u32", "vector", 8, 4, false), ("u64", "processor_mask", 16, 8, false)],
        "kvm_hv_send_ipi_ex" => vec![
            ("u32", "vector", 8, 4, false),
            ("u64", "format", 16, 8, false),
            ("u64", "valid_bank_mask", 24, 8, false),
        ],
        "kvm_hv_synic_set_irq" => vec![
            ("int", "vcpu_id", 8, 4, true),
            ("u32", "sint", 12, 4, false),
            ("int", "vector", 16, 4, true),
            ("int", "ret", 20, 4, true),
        ],
        "kvm_exit" => return Some(KVM_EXIT.to_owned()),
        "kvm_entry" => return Some(KVM_ENTRY.to_owned()),
        _ => return None,
    };
    if guest_mode {
        match name {
            "kvm_hv_flush_tlb" => fields.push(("bool", "guest_mode", 32, 1, false)),
            "kvm_hv_flush_tlb_ex" => fields.push(("bool", "guest_mode", 40, 1, false)),
            _ => {}
        }
    }
    let id = 200 + name.len() as u32;
    Some(format_text(name, id, &fields))
}

/// The format files of one kernel, by tracepoint.
type Formats = Box<dyn Fn(&str) -> Option<String>>;

/// The formats replayed: each release's, and this host's where it has the tracepoints.
fn formats() -> Vec<(String, Formats)> {
    let mut out: Vec<(String, Formats)> = RELEASES
        .into_iter()
        .map(|r| (format!("linux {r}"), Box::new(move |name: &str| release_format(r, name)) as Box<_>))
        .collect();
    if host_format("kvm_hv_hypercall").is_some() {
        out.push((
            "this host".to_owned(),
            Box::new(|name: &str| match name {
                "kvm_exit" | "kvm_entry" => release_format("6.12", name),
                _ => host_format(name),
            }),
        ));
    }
    out
}

/// What a guest does, as the records KVM writes for it on the vCPU thread.
#[derive(Clone, Copy, Debug)]
enum Act {
    /// A hypercall: its code, rep count and fast bit; the flush or IPI record KVM writes while
    /// doing it (with its `flags` for a flush); its result (status and reps completed).
    Hypercall { code: u16, reps: u16, fast: bool, work: Option<(&'static str, u64)>, result: u64 },
    /// A synthetic interrupt asserted on the thread, with the APIC's answer.
    Sint { ret: i32 },
}

/// The observer's programs for one list, rehearsed on one release's formats, counting this thread.
struct Rehearsal {
    specs: Vec<EventSpec>,
    columns: Vec<Option<usize>>,
    tally: Engine,
    slot: Slot,
    formats: BTreeMap<&'static str, RecordFormat>,
    isa: Option<u32>,
}

const TRACEPOINTS: [&str; 9] = [
    "kvm_hv_hypercall",
    "kvm_hv_hypercall_done",
    "kvm_hv_flush_tlb",
    "kvm_hv_flush_tlb_ex",
    "kvm_hv_send_ipi",
    "kvm_hv_send_ipi_ex",
    "kvm_hv_synic_set_irq",
    "kvm_exit",
    "kvm_entry",
];

impl Rehearsal {
    /// `None` (after saying why) where this host does not permit BPF.
    fn new(isa: Option<u32>, format: &dyn Fn(&str) -> Option<String>, test: &str) -> Option<Self> {
        let specs = vm_events(isa);
        let layout = engine_layout(&specs);
        let formats = |system: &str, name: &str| if system == "kvm" { format(name) } else { None };
        let tally = match Engine::rehearse(&formats, &layout, ThreadTable::for_host()) {
            Ok(t) => t,
            Err(e @ EngineError::Map(_)) => {
                let why = hvstats_host::error_chain::error_chain(&e);
                assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "{test}: {why}");
                eprintln!("{test}: skipped: {why}");
                return None;
            }
            Err(e) => panic!("{test}: {}", hvstats_host::error_chain::error_chain(&e)),
        };
        let columns = engine_columns(&specs);
        // Every event on a Hyper-V tracepoint has its program: none is refused.
        for (i, spec) in specs.iter().enumerate() {
            let on_hv = match spec {
                EventSpec::Tracepoint { name, .. } | EventSpec::Carried { name, .. } => {
                    name.starts_with("kvm_hv_")
                }
                EventSpec::Span { start, .. } => start.starts_with("kvm_hv_"),
                EventSpec::Software(_) => false,
            };
            if on_hv {
                assert_eq!(tally.refused(columns[i].unwrap()), None, "{spec:?}");
            }
        }
        let formats =
            TRACEPOINTS.into_iter().filter_map(|n| Some((n, RecordFormat::parse(&format(n)?)))).collect();
        let slot = tally.add_thread(std::process::id() as i32, gettid()).unwrap();
        Some(Rehearsal { specs, columns, tally, slot, formats, isa })
    }

    fn read(&self) -> Vec<u64> {
        self.tally.read(self.slot).unwrap()
    }

    /// Fires `name` with `values`, as KVM would on this thread; a tracepoint the observer attaches
    /// no program to is not fired (nothing runs there).
    fn fire(&self, name: &str, values: &[(&str, u64)]) {
        let Some(context) = self.tally.context("kvm", name) else {
            assert!(
                !self.specs.iter().any(|s| matches!(s, EventSpec::Tracepoint { name: n, .. } if n == name)),
                "{name} is counted, so it has a program"
            );
            return;
        };
        let record = match context {
            Context::Record => self.formats[name].record_present(gettid(), values),
            Context::Arguments => Vec::new(),
        };
        assert_eq!(self.tally.fire("kvm", name, &record).unwrap(), 1, "{name}: the firing goes on");
    }

    /// Plays `act` as KVM records it (inside a VMCALL exit on a VMX host).
    fn play(&self, act: &Act) {
        match *act {
            Act::Hypercall { code, reps, fast, work, result } => {
                if self.isa.is_some() {
                    self.fire("kvm_exit", &[("exit_reason", 18), ("isa", u64::from(ISA_VMX))]);
                }
                let input = [
                    ("rep_cnt", u64::from(reps)),
                    ("rep_idx", 0),
                    ("ingpa", 0x1000),
                    ("outgpa", 0x2000),
                    ("code", u64::from(code)),
                    ("var_cnt", 0),
                    ("fast", u64::from(fast)),
                ];
                self.fire("kvm_hv_hypercall", &input);
                if let Some((record, flags)) = work {
                    let values = [
                        ("processor_mask", 0xf),
                        ("valid_bank_mask", 1),
                        ("format", 0),
                        ("address_space", 0x1_2345_6000),
                        ("flags", flags),
                        ("vector", 0xef),
                        ("guest_mode", 0),
                    ];
                    self.fire(record, &values);
                }
                self.fire("kvm_hv_hypercall_done", &[("result", result)]);
                if self.isa.is_some() {
                    self.fire("kvm_entry", &[("vcpu_id", 0)]);
                }
            }
            Act::Sint { ret } => {
                self.fire(
                    "kvm_hv_synic_set_irq",
                    &[("vcpu_id", 0), ("sint", 2), ("vector", 0xd1), ("ret", ret as u64)],
                );
            }
        }
    }

    /// Plays `acts`; the counts they added, by event of the list.
    fn counts(&self, acts: &[Act]) -> Vec<Option<u64>> {
        let before = self.read();
        for act in acts {
            self.play(act);
        }
        assert_eq!(
            self.tally.open_spans(self.slot).unwrap().iter().flatten().count(),
            0,
            "every span closed"
        );
        let after = self.read();
        self.columns.iter().map(|c| Some(c.map_or(0, |c| after[c] - before[c]))).collect()
    }
}

/// A VP page as the event writers write it from one thread's `counts` (by event of the list).
fn page_of(isa: Option<u32>, counts: &[Option<u64>], kvm_exit: KvmExitState) -> SharedPage {
    let all = CounterSet::of_kind(ObjectKind::Vp, |_| true);
    let page = SharedPage::anonymous(ObjectKind::Vp).unwrap();
    let mut at = 0;
    for writer in WRITERS {
        let n = writer.events(isa).len();
        let reading = ThreadReading { counts: &counts[at..at + n], kvm_exit };
        writer.write(&reading, &page, &all);
        at += n;
    }
    assert_eq!(at, counts.len());
    page
}

/// The counters of the enlightenments, and the exit-fed ones a hypercall's VMCALL exit feeds.
fn watched() -> Vec<CounterId> {
    let mut ids: Vec<CounterId> = hyperv::counters().into_iter().map(|(id, _)| id).collect();
    ids.extend([vp::HYPERCALLS, vp::HYPERCALLS_COST, vp::OTHER_INTERCEPTS, vp::OTHER_INTERCEPTS_COST]);
    ids.sort_by_key(|id| id.index);
    ids.dedup();
    ids
}

fn name(id: CounterId) -> &'static str {
    id.counter().map_or("?", |c| c.name)
}

/// The TLFS's class of each code, written out apart from the table: (code, the class counter).
/// The codes KVM emulates, the ones it answers with HV_STATUS_INVALID_HYPERCALL_CODE (still
/// traced, still counted), the extended range and unknown codes.
const CLASS_FACTS: &[(u16, CounterId)] = &[
    (0x0001, vp::VIRTUAL_MMU_HYPERCALLS), // HvCallSwitchVirtualAddressSpace
    (0x0002, vp::VIRTUAL_MMU_HYPERCALLS), // HvCallFlushVirtualAddressSpace
    (0x0003, vp::VIRTUAL_MMU_HYPERCALLS), // HvCallFlushVirtualAddressList
    (0x0004, vp::LOGICAL_PROCESSOR_HYPERCALLS), // HvCallGetLogicalProcessorRunTime
    (0x0008, vp::LONG_SPIN_WAIT_HYPERCALLS), // HvCallNotifyLongSpinWait
    (0x000B, vp::VIRTUAL_INTERRUPT_HYPERCALLS), // HvCallSendSyntheticClusterIpi
    (0x0013, vp::VIRTUAL_MMU_HYPERCALLS), // HvCallFlushVirtualAddressSpaceEx
    (0x0014, vp::VIRTUAL_MMU_HYPERCALLS), // HvCallFlushVirtualAddressListEx
    (0x0015, vp::VIRTUAL_INTERRUPT_HYPERCALLS), // HvCallSendSyntheticClusterIpiEx
    (0x0046, vp::OTHER_HYPERCALLS),       // HvCallGetPartitionId
    (0x004B, vp::GPA_SPACE_HYPERCALLS),   // HvCallMapGpaPages
    (0x004C, vp::GPA_SPACE_HYPERCALLS),   // HvCallUnmapGpaPages
    (0x0050, vp::VIRTUAL_PROCESSOR_HYPERCALLS), // HvCallGetVpRegisters
    (0x0051, vp::VIRTUAL_PROCESSOR_HYPERCALLS), // HvCallSetVpRegisters
    (0x005C, vp::SYNTHETIC_INTERRUPT_HYPERCALLS), // HvCallPostMessage
    (0x005D, vp::SYNTHETIC_INTERRUPT_HYPERCALLS), // HvCallSignalEvent
    (0x0069, vp::OTHER_HYPERCALLS),       // HvCallPostDebugData
    (0x006A, vp::OTHER_HYPERCALLS),       // HvCallRetrieveDebugData
    (0x006B, vp::OTHER_HYPERCALLS),       // HvCallResetDebugSession
    (0x006C, vp::GPA_SPACE_HYPERCALLS),   // HvCallMapStatsPage
    (0x006D, vp::GPA_SPACE_HYPERCALLS),   // HvCallUnmapStatsPage
    (0x0131, vp::GPA_SPACE_HYPERCALLS),   // HvCallMapStatsPage2
    (0x8001, vp::OTHER_HYPERCALLS),       // HvExtCallQueryCapabilities
    (0x8002, vp::OTHER_HYPERCALLS),       // HvExtCallGetBootZeroedMemory
    (0x8020, vp::OTHER_HYPERCALLS),       // an extended call without a name
    (0x0000, vp::OTHER_HYPERCALLS),       // reserved
    (0x0099, vp::OTHER_HYPERCALLS),       // unknown
    (0xFFFF, vp::OTHER_HYPERCALLS),       // unknown
];

/// The flush record KVM writes for a code, and what a flush adds (TLFS "Virtual MMU"): one
/// Address space flush a call, one Address domain flush with HV_FLUSH_ALL_VIRTUAL_ADDRESS_SPACES
/// (bit 1); a list adds its rep count (GVA ranges) to Local flushed GVA ranges, or to Global GVA
/// range flushes with the bit.
///
/// KVM writes the flush record only for a call whose input it takes: a space flush with no rep
/// count, a list flush with one (`kvm_hv_hypercall`); the others fail before it.
fn flush_fact(code: u16, flags: u64, reps: u16) -> Option<(&'static str, CounterId, u64)> {
    let all = flags & 2 != 0;
    match code {
        0x0002 | 0x0013 if reps != 0 => None,
        0x0003 | 0x0014 if reps == 0 => None,
        0x0002 => Some((
            "kvm_hv_flush_tlb",
            if all { vp::ADDRESS_DOMAIN_FLUSHES } else { vp::ADDRESS_SPACE_FLUSHES },
            1,
        )),
        0x0013 => Some((
            "kvm_hv_flush_tlb_ex",
            if all { vp::ADDRESS_DOMAIN_FLUSHES } else { vp::ADDRESS_SPACE_FLUSHES },
            1,
        )),
        0x0003 | 0x0014 => Some((
            if code == 0x0003 { "kvm_hv_flush_tlb" } else { "kvm_hv_flush_tlb_ex" },
            if all { vp::GLOBAL_GVA_RANGE_FLUSHES } else { vp::LOCAL_FLUSHED_GVA_RANGES },
            u64::from(reps),
        )),
        _ => None,
    }
}

/// The IPI record KVM writes for a code.
fn ipi_record(code: u16) -> Option<&'static str> {
    match code {
        0x000B => Some("kvm_hv_send_ipi"),
        0x0015 => Some("kvm_hv_send_ipi_ex"),
        _ => None,
    }
}

/// Checks the page against `expected` (every other watched counter 0), Hypercalls cost against
/// the nanoseconds of the span that gives it.
fn check(page: &SharedPage, expected: &BTreeMap<CounterId, u64>, cost_ns: u64, what: &str) {
    for id in watched() {
        let want =
            if id == vp::HYPERCALLS_COST { cost_ns / 100 } else { expected.get(&id).copied().unwrap_or(0) };
        assert_eq!(page.get(id), want, "{what}: {}", name(id));
    }
}

/// The hypercall span's event.
fn span_event(specs: &[EventSpec]) -> usize {
    let span = EventSpec::span("kvm", hyperv::HYPERCALL, None, hyperv::HYPERCALL_DONE);
    specs.iter().position(|s| *s == span).unwrap()
}

#[test]
fn kvm_hv_every_hypercall_record_adds_exactly_its_counters_through_the_observers_programs() {
    let test = "kvm_hv_every_hypercall_record_adds_exactly_its_counters";
    let kvm_exit = KvmExitState::NoHardwareVirtualization;
    let mut records = 0;
    for (source, format) in formats() {
        let Some(r) = Rehearsal::new(None, &*format, test) else { return };
        let span = span_event(&r.specs);
        for &(code, class) in CLASS_FACTS {
            for (reps, flags, status) in [(0u16, 0u64, 0u64), (5, 2, 0), (3, 0, 3), (0, 2, 0x13)] {
                let flush = flush_fact(code, flags, reps);
                let work = flush.map(|(record, _, _)| (record, flags)).or(ipi_record(code).map(|r| (r, 0)));
                let result = status | (u64::from(reps) << 32);
                let act = Act::Hypercall { code, reps, fast: reps == 0, work, result };
                let counts = r.counts(&[act]);
                let page = page_of(None, &counts, kvm_exit);
                let mut expected = BTreeMap::from([(class, 1), (vp::HYPERCALLS, 1)]);
                if status != 0 {
                    expected.insert(vp::FAILED_HYPERCALLS, 1);
                }
                if let Some((_, counter, n)) = flush {
                    *expected.entry(counter).or_default() += n;
                }
                expected.retain(|_, v| *v != 0);
                let what =
                    format!("{source}: code {code:#06x}, reps {reps}, flags {flags:#x}, status {status:#x}");
                assert!(counts[span].unwrap() > 0, "{what}: the hypercall is timed");
                check(&page, &expected, counts[span].unwrap(), &what);
                records += 1;
            }
        }
        // A synthetic interrupt delivered counts; one the APIC did not take (ret 0, or -1) does not.
        for (ret, added) in [(1, 1), (2, 1), (0, 0), (-1, 0)] {
            let counts = r.counts(&[Act::Sint { ret }]);
            let page = page_of(None, &counts, kvm_exit);
            let expected = BTreeMap::from([(vp::SYNTHETIC_INTERRUPTS, added)]);
            let expected = expected.into_iter().filter(|(_, v)| *v != 0).collect();
            check(&page, &expected, 0, &format!("{source}: ret {ret}"));
        }
    }
    eprintln!("{records} hypercall records, each into its counters");
}

/// A Windows guest's minute, as its records: spin waits, flushes with rep counts, IPIs, synthetic
/// interrupts (timer messages and VMBus signals), posted messages (one the host's queue refuses).
fn windows_stream() -> (Vec<Act>, BTreeMap<CounterId, u64>) {
    let hc = |code: u16, reps: u16, work: Option<(&'static str, u64)>, status: u64| Act::Hypercall {
        code,
        reps,
        fast: reps == 0 && work.is_none(),
        work,
        result: status | (u64::from(reps) << 32),
    };
    let mut acts = Vec::new();
    for i in 0..40 {
        acts.push(hc(0x0008, 0, None, 0)); // a long spin wait (fast)
        if i % 4 == 0 {
            acts.push(hc(0x0003, 6, Some(("kvm_hv_flush_tlb", 0)), 0)); // 6 GVA ranges, one space
        }
        if i % 5 == 0 {
            acts.push(hc(0x0014, 9, Some(("kvm_hv_flush_tlb_ex", 2 | 1)), 0)); // 9 ranges, every space
        }
        if i % 8 == 0 {
            acts.push(hc(0x0002, 0, Some(("kvm_hv_flush_tlb", 1)), 0)); // one space, every VP
            acts.push(hc(0x0013, 0, Some(("kvm_hv_flush_tlb_ex", 2)), 0)); // every space
        }
        acts.push(hc(0x000B, 0, Some(("kvm_hv_send_ipi", 0)), 0));
        if i % 2 == 0 {
            acts.push(hc(0x0015, 0, Some(("kvm_hv_send_ipi_ex", 0)), 0));
        }
        acts.push(Act::Sint { ret: 1 }); // a synthetic timer's message
        acts.push(hc(0x005D, 0, None, 0)); // a VMBus channel's event
        acts.push(hc(0x005C, 0, None, if i == 17 { 0x0013 } else { 0 })); // a posted message
    }
    // Counted by hand from the loop above: 40 rounds.
    let expected = BTreeMap::from([
        (vp::LONG_SPIN_WAIT_HYPERCALLS, 40),
        // 0x0003 ×10, 0x0014 ×8, 0x0002 ×5, 0x0013 ×5.
        (vp::VIRTUAL_MMU_HYPERCALLS, 10 + 8 + 5 + 5),
        (vp::LOCAL_FLUSHED_GVA_RANGES, 10 * 6),
        (vp::GLOBAL_GVA_RANGE_FLUSHES, 8 * 9),
        (vp::ADDRESS_SPACE_FLUSHES, 5),
        (vp::ADDRESS_DOMAIN_FLUSHES, 5),
        (vp::VIRTUAL_INTERRUPT_HYPERCALLS, 40 + 20),
        (vp::SYNTHETIC_INTERRUPTS, 40),
        (vp::SYNTHETIC_INTERRUPT_HYPERCALLS, 80),
        (vp::FAILED_HYPERCALLS, 1),
        (vp::HYPERCALLS, 40 + 28 + 60 + 80),
    ]);
    (acts, expected)
}

#[test]
fn kvm_hv_a_windows_like_stream_lands_exactly() {
    let test = "kvm_hv_a_windows_like_stream_lands_exactly";
    let (acts, expected) = windows_stream();
    for (source, format) in formats() {
        // On a software KVM host, and on a VMX host where each hypercall is a VMCALL exit: the
        // hypercall's span and the exit's are timed in lanes of their own.
        for isa in [None, Some(ISA_VMX)] {
            let Some(r) = Rehearsal::new(isa, &*format, test) else { return };
            let counts = r.counts(&acts);
            let what = format!("{source}, isa {isa:?}");
            let span = span_event(&r.specs);
            let kvm_exit =
                if isa.is_some() { KvmExitState::Fires } else { KvmExitState::NoHardwareVirtualization };
            let page = page_of(isa, &counts, kvm_exit);
            // Where kvm_exit fires, Hypercalls/sec and their cost are its VMCALL exits' (the same
            // 208 here: every hypercall is one), timed from exit to entry; the hypercall spans
            // inside them are timed too, in a lane of their own.
            let cost_ns = match isa {
                Some(isa) => {
                    let filter = class_filter(isa, InterceptClass::Hypercall);
                    let exit_span = EventSpec::span("kvm", "kvm_exit", Some(&filter), "kvm_entry");
                    let exit_span = r.specs.iter().position(|s| *s == exit_span).unwrap();
                    assert!(
                        counts[exit_span].unwrap() > counts[span].unwrap(),
                        "{what}: the exit holds the hypercall"
                    );
                    counts[exit_span].unwrap()
                }
                None => counts[span].unwrap(),
            };
            assert!(counts[span].unwrap() > 0, "{what}: hypercalls are timed");
            check(&page, &expected, cost_ns, &what);
        }
    }
}

#[test]
fn kvm_hv_records_through_the_perf_counters_filters_count_all_but_the_flushes() {
    // Where programs cannot be loaded, each event is a perf counter with its ftrace filter: the
    // kernel evaluates the filter on the record, as the evaluator here does. Spans and carried
    // counts have no perf counter: the cost and the flush counters are not given.
    let (acts, mut expected) = windows_stream();
    let specs = vm_events(None);
    let writer_at = specs.iter().position(|s| *s == EventSpec::tracepoint("kvm", hyperv::HYPERCALL)).unwrap();
    for (source, format) in formats() {
        let formats: BTreeMap<&str, RecordFormat> =
            TRACEPOINTS.into_iter().filter_map(|n| Some((n, RecordFormat::parse(&format(n)?)))).collect();
        let mut counts: Vec<Option<u64>> =
            specs.iter().map(|s| if s.in_kernel_only() { None } else { Some(0) }).collect();
        let mut fire = |name: &str, values: &[(&str, u64)]| {
            let record = formats[name].record_present(gettid(), values);
            for (i, spec) in specs.iter().enumerate() {
                if let EventSpec::Tracepoint { name: n, filter, .. } = spec
                    && n == name
                {
                    let holds = filter.as_deref().is_none_or(|f| {
                        filter::parse_filter(f, &formats[name].fields).unwrap().eval(&record)
                    });
                    if holds {
                        *counts[i].as_mut().unwrap() += 1;
                    }
                }
            }
        };
        for act in &acts {
            match *act {
                Act::Hypercall { code, reps, fast, work, result } => {
                    fire(
                        "kvm_hv_hypercall",
                        &[("rep_cnt", u64::from(reps)), ("code", u64::from(code)), ("fast", u64::from(fast))],
                    );
                    if let Some((record, flags)) = work {
                        fire(record, &[("flags", flags), ("vector", 0xef)]);
                    }
                    fire("kvm_hv_hypercall_done", &[("result", result)]);
                }
                Act::Sint { ret } => fire("kvm_hv_synic_set_irq", &[("ret", ret as u64)]),
            }
        }
        let kvm_exit = KvmExitState::NoHardwareVirtualization;
        // What the writer gives where only the perf counters count.
        let n = hyperv::HypervEnlightenments.events(None).len();
        let counted = |i: usize| counts[writer_at + i].is_some();
        let gives = hvstats_observe::sources::event_writer::EventWriter::gives(
            &hyperv::HypervEnlightenments,
            &counted,
            kvm_exit,
        )
        .vp;
        assert!(n > 0);
        for id in [
            vp::ADDRESS_SPACE_FLUSHES,
            vp::ADDRESS_DOMAIN_FLUSHES,
            vp::LOCAL_FLUSHED_GVA_RANGES,
            vp::GLOBAL_GVA_RANGE_FLUSHES,
            vp::HYPERCALLS_COST,
        ] {
            assert!(!gives.contains(id), "{source}: {} is not given by perf counters", name(id));
            expected.remove(&id);
        }
        let page = page_of(None, &counts, kvm_exit);
        for id in watched() {
            if gives.contains(id) {
                assert_eq!(page.get(id), expected.get(&id).copied().unwrap_or(0), "{source}: {}", name(id));
            } else {
                assert_eq!(page.get(id), 0, "{source}: {} is left alone", name(id));
            }
        }
    }
}

#[test]
fn kvm_hv_every_flush_and_class_counter_has_an_observed_source() {
    use hvstats_abi::catalog::observed;
    for id in [
        vp::GPA_SPACE_HYPERCALLS,
        vp::LOGICAL_PROCESSOR_HYPERCALLS,
        vp::LONG_SPIN_WAIT_HYPERCALLS,
        vp::OTHER_HYPERCALLS,
        vp::SYNTHETIC_INTERRUPT_HYPERCALLS,
        vp::VIRTUAL_INTERRUPT_HYPERCALLS,
        vp::VIRTUAL_MMU_HYPERCALLS,
        vp::VIRTUAL_PROCESSOR_HYPERCALLS,
        vp::SYNTHETIC_INTERRUPTS,
        vp::ADDRESS_SPACE_FLUSHES,
        vp::ADDRESS_DOMAIN_FLUSHES,
        vp::LOCAL_FLUSHED_GVA_RANGES,
        vp::GLOBAL_GVA_RANGE_FLUSHES,
        vp::FAILED_HYPERCALLS,
    ] {
        let c = id.counter().unwrap();
        let o = observed(c).unwrap();
        assert!(o.is_maintained(), "{}: {}", c.name, o.note());
        assert!(matches!(o.source(), Some(catalog::Source::KvmHv(_))), "{}", c.name);
        assert!(o.note().contains("kvm:kvm_hv_"), "{}: {}", c.name, o.note());
        assert!(hyperv::counters().iter().any(|(x, _)| *x == id), "{} has a writer", c.name);
    }
}
