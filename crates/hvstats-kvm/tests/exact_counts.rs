//! Guests with exactly known intercept counts, in every CPU mode: the WHv structs, the VP pages and
//! KVM's own stats must all agree with what the guest did.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{assert_exact, counts, kvm_available, run, run_beside, run_with};
use hvstats_guest::Mode;
use hvstats_guest::workload::Workload;
use hvstats_host::counting::{EventList, EventSpec, ThreadEvents};
use hvstats_kvm::Partition;

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

/// A signal whose handler does nothing and which does not restart system calls: delivered to a VP
/// thread, it only makes KVM_RUN return EINTR, as the partition's own kick does.
fn install_interrupting_signal() -> libc::c_int {
    extern "C" fn ignore(_: libc::c_int) {}
    let sig = libc::SIGUSR2;
    // SAFETY: a zeroed sigaction is "no flags, empty mask"; the handler does nothing, which is
    // async-signal-safe; without SA_RESTART an interrupted KVM_RUN returns EINTR.
    let ok = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = ignore as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask) == 0 && libc::sigaction(sig, &sa, std::ptr::null_mut()) == 0
    };
    assert!(ok, "sigaction: {}", std::io::Error::last_os_error());
    sig
}

/// Sends `sig` to the VP thread of `partition` every 50 µs or so until the run returns, counting on
/// that thread the exceptions KVM injects again (`kvm:kvm_inj_exception` with `reinjected` set).
fn interrupt_vp_until_it_stops(partition: &Partition, running: &AtomicBool, sig: libc::c_int) -> u64 {
    let pid = std::process::id() as libc::pid_t;
    // From the VP's first exit on: a signal before its first KVM_RUN completed would only delay
    // the vCPU's set-up on its thread, which KVM restarts.
    let tid = loop {
        let entered = partition.kvm_stat(0, "exits").is_some_and(|n| n > 0);
        match partition.vp_thread_id(0) {
            Some(tid) if entered => break tid,
            _ if running.load(Ordering::SeqCst) => std::thread::sleep(Duration::from_micros(100)),
            _ => return 0,
        }
    };
    let events = EventList::new(vec![EventSpec::filtered("kvm", "kvm_inj_exception", "reinjected == 1")]);
    let mut again = ThreadEvents::open(pid, tid, &events);
    assert!(again.is_open(&events, 0), "kvm_inj_exception on the VP thread: {:?}", again.refused(&events, 0));
    let mut counted = 0;
    while running.load(Ordering::SeqCst) && partition.vp_thread_id(0) == Some(tid) {
        // A pause after each signal lets the VP make progress between them.
        // SAFETY: tgkill with this process's id and one of its thread ids; a thread that has just
        // ended makes it fail with ESRCH, which ends the loop at the next check.
        unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, sig) };
        counted = again.read(&events)[0].unwrap_or(counted);
        std::thread::sleep(Duration::from_micros(50));
    }
    again.read(&events)[0].unwrap_or(counted)
}

#[test]
fn an_exception_kvm_injects_again_after_an_interrupted_entry_is_counted_once() {
    if !kvm_available("an_exception_kvm_injects_again_after_an_interrupted_entry_is_counted_once") {
        return;
    }
    // KVM injects a pending exception (kvm_check_and_inject_events, x86.c) before it looks for a
    // pending signal; finding one, it cancels the entry (cancel_injection), returns EINTR, and the
    // next KVM_RUN injects the same exception again, `reinjected` set. A preemption or a request
    // in that window does the same. Signals sent to the VP thread every few tens of µs while the guest
    // raises #UD after #UD make it happen; a counter of the re-injections on the VP thread shows
    // that it did, and the guest's exceptions must still be counted once each.
    let sig = install_interrupting_signal();
    let w = Workload { ud2: counts(20_000, 0), ..Workload::default() };
    for mode in [Mode::Protected, Mode::Long] {
        let mut again_per_run = Vec::new();
        while again_per_run.len() < 5 && !again_per_run.iter().any(|&n| n > 0) {
            let mut again = 0;
            let r = run_beside(
                &w,
                mode,
                1,
                |_| {},
                |p, running| again = interrupt_vp_until_it_stops(p, running, sig),
            );
            let signals = r.partition.kvm_stat(0, "signal_exits").expect("signal_exits");
            assert!(signals > 0, "{mode:?}: no signal reached KVM_RUN");
            assert_eq!(
                common::views(&r, 0).events.exception_count,
                w.expected(0).exceptions,
                "{mode:?}: exceptions (whv), with {again} injected again and {signals} signal exits"
            );
            again_per_run.push(again);
        }
        assert!(
            again_per_run.iter().any(|&n| n > 0),
            "{mode:?}: KVM injected no exception again in {} runs",
            again_per_run.len()
        );
    }
}
