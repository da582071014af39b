//! Guests with exactly known intercept counts, in every CPU mode: the WHv structs, the VP pages and
//! KVM's own stats must all agree with what the guest did.

mod common;

use common::{assert_exact, counts, kvm_available, run, run_with};
use hvstats_guest::Mode;
use hvstats_guest::workload::Workload;

fn port_cpuid_msr() -> Workload {
    Workload {
        cpuid: counts(300, 0),
        out: counts(200, 0),
        in_: counts(150, 0),
        rdmsr: counts(120, 0),
        wrmsr: counts(80, 0),
        user_msr: counts(40, 0),
        serial: b"ok\n".to_vec(),
        exit_status: 7,
        ..Workload::default()
    }
}

fn apic() -> Workload {
    Workload {
        hlt: counts(25, 0),
        eoi: counts(100, 0),
        self_ipi: counts(60, 0),
        tpr: counts(30, 0),
        mmio: counts(40, 0),
        exit_status: 3,
        ..Workload::default()
    }
}

#[test]
fn cpuid_io_and_msr_counts_are_exact_in_long_mode() {
    if !kvm_available("cpuid_io_and_msr_counts_are_exact_in_long_mode") {
        return;
    }
    let w = port_cpuid_msr();
    let r = run(&w, Mode::Long, 1);
    assert_eq!(r.report.vps[0].serial, b"ok\n");
    assert_exact(&r, 0, &w.expected(0));
}

#[test]
fn cpuid_io_and_msr_counts_are_exact_in_real_and_protected_mode() {
    if !kvm_available("cpuid_io_and_msr_counts_are_exact_in_real_and_protected_mode") {
        return;
    }
    let w = port_cpuid_msr();
    for mode in [Mode::Real, Mode::Protected] {
        let r = run(&w, mode, 1);
        assert_eq!(r.report.vps[0].serial, b"ok\n", "{mode:?}");
        assert_exact(&r, 0, &w.expected(0));
    }
}

#[test]
fn hlt_eoi_tpr_and_self_ipi_counts_are_exact_in_protected_mode() {
    if !kvm_available("hlt_eoi_tpr_and_self_ipi_counts_are_exact_in_protected_mode") {
        return;
    }
    let w = apic();
    assert_exact(&run(&w, Mode::Protected, 1), 0, &w.expected(0));
}

#[test]
fn hlt_eoi_tpr_and_self_ipi_counts_are_exact_in_long_mode() {
    if !kvm_available("hlt_eoi_tpr_and_self_ipi_counts_are_exact_in_long_mode") {
        return;
    }
    let w = apic();
    assert_exact(&run(&w, Mode::Long, 1), 0, &w.expected(0));
}

#[test]
fn x2apic_eoi_and_tpr_writes_are_counted_exactly_beside_xapic_ones() {
    if !kvm_available("x2apic_eoi_and_tpr_writes_are_counted_exactly_beside_xapic_ones") {
        return;
    }
    // xAPIC MMIO work first (interrupts, EOI, TPR), then x2APIC: EOI and TPR as MSRs, which no
    // kvm_mmio sees.
    let w = Workload { x2apic_eoi: counts(70, 0), x2apic_tpr: counts(40, 0), ..apic() };
    for mode in [Mode::Protected, Mode::Long] {
        let r = run(&w, mode, 1);
        assert_exact(&r, 0, &w.expected(0));
        assert_eq!(w.expected(0).eoi, 25 + 100 + 60 + 70, "{mode:?}");
    }
}

#[test]
fn several_vps_run_different_counts_at_once() {
    if !kvm_available("several_vps_run_different_counts_at_once") {
        return;
    }
    let w = Workload {
        cpuid: counts(100, 50),
        out: counts(20, 10),
        in_: counts(10, 5),
        rdmsr: counts(30, 7),
        user_msr: counts(5, 3),
        hlt: counts(5, 2),
        eoi: counts(10, 10),
        self_ipi: counts(8, 4),
        tpr: counts(3, 1),
        serial: b"x".to_vec(),
        ..Workload::default()
    };
    let r = run(&w, Mode::Long, 4);
    for vp in 0..4 {
        assert_exact(&r, vp, &w.expected(vp));
    }
}

#[test]
fn exceptions_page_faults_and_page_invalidations_are_counted_in_long_mode() {
    if !kvm_available("exceptions_page_faults_and_page_invalidations_are_counted_in_long_mode") {
        return;
    }
    let w =
        Workload { ud2: counts(40, 0), invlpg: counts(30, 0), cpuid: counts(10, 0), ..Workload::default() };
    let r = run(&w, Mode::Long, 1);
    let e = w.expected(0);
    assert_exact(&r, 0, &e);
    let v = common::views(&r, 0);
    assert_eq!(v.events.exception_count, e.exceptions, "exceptions (whv)");
    assert_eq!(v.intercepts.page_invalidations.count, e.invlpg, "invlpg (whv)");
    assert_eq!(r.partition.kvm_stat(0, "invlpg"), Some(e.invlpg), "KVM invlpg");
    assert_eq!(v.events.page_fault_count, e.page_faults, "page faults (whv)");
    assert_eq!(r.partition.kvm_stat(0, "pf_guest"), Some(e.page_faults), "KVM pf_guest");
}

#[test]
fn exceptions_are_counted_in_protected_mode() {
    if !kvm_available("exceptions_are_counted_in_protected_mode") {
        return;
    }
    let w = Workload { ud2: counts(25, 0), ..Workload::default() };
    let r = run(&w, Mode::Protected, 1);
    assert_eq!(common::views(&r, 0).events.exception_count, 25);
}

#[test]
fn several_vps_in_real_and_protected_mode_keep_their_own_counts() {
    if !kvm_available("several_vps_in_real_and_protected_mode_keep_their_own_counts") {
        return;
    }
    let w = Workload {
        cpuid: counts(50, 25),
        out: counts(10, 5),
        in_: counts(5, 5),
        rdmsr: counts(10, 3),
        wrmsr: counts(4, 4),
        user_msr: counts(2, 1),
        exit_status: 1,
        ..Workload::default()
    };
    for mode in [Mode::Real, Mode::Protected] {
        let r = run(&w, mode, 3);
        for vp in 0..3 {
            assert_exact(&r, vp, &w.expected(vp));
        }
    }
}

#[test]
fn hypercall_counts_are_exact_in_long_and_protected_mode() {
    if !kvm_available("hypercall_counts_are_exact_in_long_and_protected_mode") {
        return;
    }
    let w = Workload {
        hypercalls: counts(150, 50),
        cpuid: counts(100, 0),
        out: counts(20, 0),
        exit_status: 5,
        ..Workload::default()
    };
    for mode in [Mode::Long, Mode::Protected] {
        let r = run(&w, mode, 2);
        for vp in 0..2 {
            assert_exact(&r, vp, &w.expected(vp));
        }
    }
}

#[test]
fn hypercall_counts_are_exact_through_the_register_ioctls() {
    if !kvm_available("hypercall_counts_are_exact_through_the_register_ioctls") {
        return;
    }
    // The path a host without KVM_CAP_SYNC_REGS takes: KVM_GET_REGS/SREGS and KVM_SET_REGS.
    let w =
        Workload { hypercalls: counts(60, 20), cpuid: counts(40, 0), exit_status: 6, ..Workload::default() };
    for mode in [Mode::Long, Mode::Protected] {
        let r = run_with(&w, mode, 2, |c| c.sync_registers = false);
        for vp in 0..2 {
            assert_exact(&r, vp, &w.expected(vp));
        }
    }
}
