//! Guests that fault or never stop: each is reported for its VP with RIP and reason, and the host
//! never hangs.

// Test and bench set-up: a failed step is the run's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::kvm_available;
use hvstats::Hypervisor;
use hvstats_guest::{Mode, Program, layout};
use hvstats_kvm::{FaultCause, Handlers, Partition, PartitionConfig, RipSeen, RunReport};
use iced_x86::code_asm::*;

fn run(mode: Mode, vps: u32, timeout: Duration, body: impl Fn(&mut Program)) -> (Arc<Hypervisor>, RunReport) {
    let mut p = Program::new(mode, layout::DEFAULT_LOAD_GPA).unwrap();
    body(&mut p);
    let image = p.finish().unwrap();
    let hv = Hypervisor::new().unwrap();
    let config = PartitionConfig { vp_count: vps, mode, timeout, ..Default::default() };
    let partition = Partition::new(&hv, config, Handlers::builtin()).unwrap();
    partition.load(image.load_gpa, &image.bytes).unwrap();
    let report = partition.run(image.entry).unwrap();
    (hv, report)
}

#[test]
fn a_triple_fault_is_reported_with_its_rip() {
    if !kvm_available("a_triple_fault_is_reported_with_its_rip") {
        return;
    }
    for mode in [Mode::Protected, Mode::Long] {
        // No IDT entry for #UD: #UD, then #GP, then #DF, then shutdown.
        let (_, report) = run(mode, 1, Duration::from_secs(20), |p| {
            p.asm().nop().unwrap();
            p.asm().ud2().unwrap();
        });
        let fault = report.vps[0].fault.clone().expect("fault");
        assert!(report.faulted());
        assert_eq!(report.vps[0].exit_status, None);
        assert!(
            matches!(fault.cause, FaultCause::TripleFault | FaultCause::InternalError { .. }),
            "{mode:?}: {fault:?}"
        );
        assert!(fault.cause.is_fault(), "{mode:?}: {fault:?}");
        assert_ne!(fault.rip, u64::MAX, "{mode:?}: {fault:?}");
    }
}

#[test]
fn a_triple_fault_reports_the_last_rip_the_vp_had_not_the_reset_state() {
    if !kvm_available("a_triple_fault_reports_the_last_rip_the_vp_had_not_the_reset_state") {
        return;
    }
    for mode in [Mode::Protected, Mode::Long] {
        // One exit (a serial byte) just before the fault, so the last RIP the VP had is known:
        // the `out` itself or, once completed, the `ud2` after it.
        let mut p = Program::new(mode, layout::DEFAULT_LOAD_GPA).unwrap();
        let mut before = p.asm().create_label();
        let mut ud2 = p.asm().create_label();
        p.asm().mov(dx, u32::from(layout::SERIAL_PORT)).unwrap();
        p.asm().mov(al, b'x' as u32).unwrap();
        p.asm().set_label(&mut before).unwrap();
        p.asm().out(dx, al).unwrap();
        p.asm().set_label(&mut ud2).unwrap();
        p.asm().ud2().unwrap();
        let (image, at) = p.finish_with_labels(&[before, ud2]).unwrap();
        let hv = Hypervisor::new().unwrap();
        let config =
            PartitionConfig { vp_count: 1, mode, timeout: Duration::from_secs(20), ..Default::default() };
        let partition = Partition::new(&hv, config, Handlers::builtin()).unwrap();
        partition.load(image.load_gpa, &image.bytes).unwrap();
        let report = partition.run(image.entry).unwrap();
        let fault = report.vps[0].fault.clone().expect("fault");
        assert_eq!(report.vps[0].serial, b"x", "{mode:?}");
        if matches!(fault.cause, FaultCause::TripleFault) {
            assert_eq!(fault.rip_seen, RipSeen::AtEarlierExit, "{mode:?}: {fault:?}");
        }
        assert!(fault.rip == at[0] || fault.rip == at[1], "{mode:?}: {fault:?}, out at {:#x}", at[0]);
    }
}

#[test]
fn a_spinning_and_a_halted_vp_are_stopped_at_the_timeout() {
    if !kvm_available("a_spinning_and_a_halted_vp_are_stopped_at_the_timeout") {
        return;
    }
    let started = Instant::now();
    // VP 0 exits at once; VP 1 spins; VP 2 halts with interrupts off.
    let (_, report) = run(Mode::Long, 3, Duration::from_millis(500), |p| {
        let mut spin = p.asm().create_label();
        let mut halt = p.asm().create_label();
        p.asm().cmp(edi, 1).unwrap();
        p.asm().je(spin).unwrap();
        p.asm().cmp(edi, 2).unwrap();
        p.asm().je(halt).unwrap();
        p.exit(5).unwrap();
        p.asm().set_label(&mut spin).unwrap();
        p.asm().jmp(spin).unwrap();
        p.asm().set_label(&mut halt).unwrap();
        p.asm().cli().unwrap();
        p.asm().hlt().unwrap();
        p.asm().jmp(halt).unwrap();
    });
    assert!(started.elapsed() < Duration::from_secs(15), "the run took {:?}", started.elapsed());
    assert_eq!(report.vps[0].exit_status, Some(5));
    assert!(report.vps[0].fault.is_none());
    assert!(report.timed_out() && !report.faulted(), "stopped by the deadline, not faulted");
    for vp in &report.vps[1..] {
        let fault = vp.fault.as_ref().expect("stopped VP has a fault");
        assert!(matches!(fault.cause, FaultCause::TimedOut), "VP {}: {fault:?}", vp.index);
        assert!(!fault.cause.is_fault(), "a VP stopped by the deadline did not fault");
        assert!(fault.rip >= layout::DEFAULT_LOAD_GPA, "VP {}: {fault:?}", vp.index);
    }
}
