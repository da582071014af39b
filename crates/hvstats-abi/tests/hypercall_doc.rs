//! The hypercall table: the codes KVM handles, their classes and further counters, and
//! `docs/hyperv-hypercalls.md` rendered from it.

use std::collections::BTreeSet;
use std::path::Path;

use hvstats_abi::catalog::{hypercall_class_counter, vp};
use hvstats_abi::hypercall::{
    HYPERCALLS, HypercallClass, HypercallCode, HypercallEffect, KVM_EXTENDED_CALLS, KernelRelease, KvmPath,
    flush_flags,
};
use hvstats_abi::hypercall_page::{CHECKED_KERNELS, write_markdown};

const BEGIN: &str = "<!-- hypercall table: begin -->\n";
const END: &str = "<!-- hypercall table: end -->";

#[test]
fn docs_hyperv_hypercalls_md_holds_the_table() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/hyperv-hypercalls.md");
    let mut text = std::fs::read_to_string(&path).unwrap();
    let from = text.find(BEGIN).expect("begin marker") + BEGIN.len();
    let to = from + text[from..].find(END).expect("end marker");
    let mut table = String::new();
    write_markdown(&mut table).unwrap();
    if text[from..to] == table {
        return;
    }
    if std::env::var_os("HVSTATS_UPDATE_DOCS").is_some() {
        text.replace_range(from..to, &table);
        std::fs::write(&path, &text).unwrap();
        return;
    }
    panic!("docs/hyperv-hypercalls.md differs from the hypercall table (HVSTATS_UPDATE_DOCS=1 rewrites it)");
}

/// The `case` labels of `kvm_hv_hypercall` in `arch/x86/kvm/hyperv.c` of each checked release,
/// extended calls aside (5.15.85, 6.1.20, 6.6.87 and 6.12.19 have the same ones).
const KVM_CASES: [u16; 12] =
    [0x0002, 0x0003, 0x0008, 0x000B, 0x0013, 0x0014, 0x0015, 0x005C, 0x005D, 0x0069, 0x006A, 0x006B];

#[test]
fn the_codes_kvm_handles_are_the_cases_of_kvm_hv_hypercall() {
    let handled: BTreeSet<u16> = HYPERCALLS
        .iter()
        .filter(|r| r.kvm.is_some_and(|k| k.since == KernelRelease::V5_15))
        .map(|r| r.code.0)
        .collect();
    assert_eq!(handled, KVM_CASES.into_iter().collect());
    // The extended calls: HV_EXT_CALL_QUERY_CAPABILITIES ..= HV_EXT_CALL_MAX (0x8001 + 64), to the
    // VMM, absent in 6.1.20 and present in 6.6.87.
    let (first, last, ext) = KVM_EXTENDED_CALLS;
    assert_eq!((first.0, last.0, ext.path, ext.since), (0x8001, 0x8041, KvmPath::Vmm, KernelRelease::V6_6));
    for code in [0x8001, 0x8005, 0x8041] {
        assert_eq!(HypercallCode(code).kvm(), Some(ext), "{code:#x}");
        assert_eq!(HypercallCode(code).class(), HypercallClass::Other);
    }
    for code in [0x0001, 0x0004, 0x006C, 0x8000, 0x8042, 0xFFFF] {
        assert_eq!(HypercallCode(code).kvm(), None, "{code:#x}");
    }
    // Post message always, signal event without an eventfd for its connection id, and SynDbg
    // calls go to the VMM as KVM_EXIT_HYPERV_HCALL.
    assert_eq!(HypercallCode::POST_MESSAGE.kvm().unwrap().path, KvmPath::Vmm);
    assert_eq!(HypercallCode::SIGNAL_EVENT.kvm().unwrap().path, KvmPath::EventfdOrVmm);
    assert_eq!(HypercallCode::RESET_DEBUG_SESSION.kvm().unwrap().path, KvmPath::SynDbgVmm);
    assert_eq!(HypercallCode::FLUSH_VIRTUAL_ADDRESS_LIST_EX.kvm().unwrap().path, KvmPath::Kernel);
}

#[test]
fn each_code_kvm_handles_is_counted_in_its_tlfs_class() {
    use HypercallClass::*;
    let expect = [
        (0x0002, VirtualMmu),
        (0x0003, VirtualMmu),
        (0x0008, LongSpinWait),
        (0x000B, VirtualInterrupt),
        (0x0013, VirtualMmu),
        (0x0014, VirtualMmu),
        (0x0015, VirtualInterrupt),
        (0x005C, SyntheticInterrupt),
        (0x005D, SyntheticInterrupt),
        (0x0069, Other),
        (0x006A, Other),
        (0x006B, Other),
    ];
    for (code, class) in expect {
        assert_eq!(HypercallCode(code).class(), class, "{code:#x}");
        assert!(hypercall_class_counter(class).is_some(), "{class:?} has a counter");
    }
    assert_eq!(HypercallCode(0x7FFF).class(), Other);
}

#[test]
fn flushes_feed_the_seed_flush_counters_and_ranges_count_their_reps() {
    let all = flush_flags::ALL_VIRTUAL_ADDRESS_SPACES;
    for code in [HypercallCode::FLUSH_VIRTUAL_ADDRESS_SPACE, HypercallCode::FLUSH_VIRTUAL_ADDRESS_SPACE_EX] {
        assert_eq!(code.effect(), HypercallEffect::AddressSpaceFlush);
        assert_eq!(code.effect().flush(0, 0), Some((vp::ADDRESS_SPACE_FLUSHES, 1)));
        assert_eq!(code.effect().flush(flush_flags::ALL_PROCESSORS, 0), Some((vp::ADDRESS_SPACE_FLUSHES, 1)));
        assert_eq!(code.effect().flush(all, 0), Some((vp::ADDRESS_DOMAIN_FLUSHES, 1)));
    }
    for code in [HypercallCode::FLUSH_VIRTUAL_ADDRESS_LIST, HypercallCode::FLUSH_VIRTUAL_ADDRESS_LIST_EX] {
        assert_eq!(code.effect(), HypercallEffect::GvaRangeFlush);
        assert_eq!(code.effect().flush(0, 5), Some((vp::LOCAL_FLUSHED_GVA_RANGES, 5)));
        assert_eq!(
            code.effect().flush(all | flush_flags::ALL_PROCESSORS, 4095),
            Some((vp::GLOBAL_GVA_RANGE_FLUSHES, 4095))
        );
    }
    for code in [HypercallCode::SEND_SYNTHETIC_CLUSTER_IPI, HypercallCode::SEND_SYNTHETIC_CLUSTER_IPI_EX] {
        assert_eq!(code.effect(), HypercallEffect::SyntheticIpi);
        assert_eq!(code.effect().flush(all, 3), None);
    }
    assert_eq!(HypercallCode::NOTIFY_LONG_SPIN_WAIT.effect().flush(0, 1), None);
    assert_eq!(HypercallCode(0x7FFF).effect(), HypercallEffect::ClassOnly);
}

#[test]
fn the_table_is_in_code_order_and_names_each_code_once() {
    assert!(HYPERCALLS.windows(2).all(|w| w[0].code < w[1].code));
    for row in HYPERCALLS {
        assert_eq!(row.code.name(), Some(row.name));
        assert_eq!(row.code.class(), row.class);
        assert_eq!(row.code.effect(), row.effect);
        assert_eq!(row.code.kvm(), row.kvm);
        // Only work KVM does in the kernel has a record of its own.
        assert_eq!(row.record.is_some(), row.effect != HypercallEffect::ClassOnly, "{}", row.name);
    }
    assert_eq!(CHECKED_KERNELS.map(|k| k.release), KernelRelease::ALL);
}
