//! Guests with exactly known intercept counts, in every CPU mode: the WHv structs, the VP pages and
//! KVM's own stats must all agree with what the guest did.

mod common;

use common::{assert_exact, counts, kvm_available, run};
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
