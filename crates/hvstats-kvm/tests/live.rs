//! The partition while it runs: the WHv API reads exact values from a running VP, and the
//! hypercall-port and MSR extension points route exits to registered handlers.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::kvm_available;
use hvstats::{Hypervisor, whv};
use hvstats_abi::catalog::vp;
use hvstats_guest::{Mode, Program, layout};
use hvstats_kvm::{
    HandlerError, Handlers, HypercallHandler, MsrHandler, Partition, PartitionConfig, VpContext,
};
use iced_x86::code_asm::*;

#[test]
fn the_whv_api_reads_exact_counts_from_a_running_vp() {
    if !kvm_available("the_whv_api_reads_exact_counts_from_a_running_vp") {
        return;
    }
    let mut p = Program::new(Mode::Long, layout::DEFAULT_LOAD_GPA).unwrap();
    p.counted_loop(hvstats_guest::program::LoopCount::fixed(500), |p| {
        p.asm().xor(eax, eax)?;
        p.asm().cpuid()?;
        Ok(())
    })
    .unwrap();
    let mut spin = p.asm().create_label();
    p.asm().set_label(&mut spin).unwrap();
    p.asm().jmp(spin).unwrap();
    let image = p.finish().unwrap();
    let hv = Hypervisor::new().unwrap();
    let config = PartitionConfig { timeout: Duration::from_secs(3), ..Default::default() };
    let partition = Partition::new(&hv, config, Handlers::builtin()).unwrap();
    partition.load(image.load_gpa, &image.bytes).unwrap();
    let running = AtomicBool::new(true);
    let seen_while_running = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let start = Instant::now();
            while running.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(10) {
                let ic = whv::intercept_counters(&partition, 0).unwrap();
                if ic.cpuid_instructions.count == 500 && running.load(Ordering::SeqCst) {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            false
        });
        let report = partition.run(image.entry).unwrap();
        running.store(false, Ordering::SeqCst);
        assert!(
            report.vps[0]
                .fault
                .as_ref()
                .is_some_and(|f| matches!(f.cause, hvstats_kvm::FaultCause::TimedOut))
        );
        reader.join().unwrap()
    });
    assert!(seen_while_running, "the reader never saw the 500 CPUIDs while the VP ran");
}

/// A hypercall through port 0xE8: RAX = RCX + 1.
struct AddOne;

impl HypercallHandler for AddOne {
    fn hypercall(&self, vp: &mut VpContext<'_>) -> Result<(), HandlerError> {
        let mut regs = vp.vcpu.get_regs().map_err(HandlerError::registers("KVM_GET_REGS"))?;
        regs.rax = regs.rcx + 1;
        vp.vcpu.set_regs(&regs).map_err(HandlerError::registers("KVM_SET_REGS"))
    }
}

/// MSR 0x40000123 reads as the VP index times 10.
struct IndexMsr;

impl MsrHandler for IndexMsr {
    fn read(&self, vp: &mut VpContext<'_>, _: u32) -> Option<u64> {
        Some(vp.index as u64 * 10)
    }
    fn write(&self, _: &mut VpContext<'_>, _: u32, _: u64) -> bool {
        false
    }
}

#[test]
fn hypercall_ports_and_msr_handlers_are_routed_and_counted() {
    if !kvm_available("hypercall_ports_and_msr_handlers_are_routed_and_counted") {
        return;
    }
    let mut p = Program::new(Mode::Long, layout::DEFAULT_LOAD_GPA).unwrap();
    {
        let a = p.asm();
        // Three hypercalls: RCX = 41, then the result + 0 twice more.
        a.mov(ecx, 41u32).unwrap();
        for _ in 0..3 {
            a.out(0xE8u32, al).unwrap();
            a.mov(rcx, rax).unwrap();
        }
        a.mov(esi, eax).unwrap();
        a.mov(ecx, 0x4000_0123u32).unwrap();
        a.rdmsr().unwrap();
        a.add(esi, eax).unwrap();
        a.mov(edx, layout::EXIT_PORT as u32).unwrap();
        a.mov(eax, esi).unwrap();
        a.out(dx, eax).unwrap();
    }
    let image = p.finish().unwrap();
    let mut handlers = Handlers::builtin();
    handlers.add_hypercall_port(0xE8, Arc::new(AddOne));
    handlers.add_msr(0x4000_0123, Arc::new(IndexMsr));
    let hv = Hypervisor::new().unwrap();
    let config = PartitionConfig { vp_count: 2, timeout: Duration::from_secs(20), ..Default::default() };
    let partition = Partition::new(&hv, config, handlers).unwrap();
    partition.load(image.load_gpa, &image.bytes).unwrap();
    let report = partition.run(image.entry).unwrap();
    for out in &report.vps {
        assert!(out.fault.is_none(), "{:?}", out.fault);
        assert_eq!(out.exit_status, Some(44 + out.index * 10));
        let page = partition.stats().vp_page(out.index).unwrap();
        assert_eq!(page.get(vp::HYPERCALLS), 3);
        // The hypercall port writes are not I/O instructions; the exit port write is.
        assert_eq!(page.get(vp::IO_INSTRUCTIONS), 1);
        assert_eq!(page.get(vp::MSR_ACCESSES), 1);
        assert_eq!(whv::intercept_counters(&partition, out.index).unwrap().msr_accesses.count, 1);
    }
}

#[test]
fn rep_outsb_to_the_serial_port_keeps_every_byte() {
    if !kvm_available("rep_outsb_to_the_serial_port_keeps_every_byte") {
        return;
    }
    let text = b"a string longer than eight bytes\n";
    let mut p = Program::new(Mode::Long, layout::DEFAULT_LOAD_GPA).unwrap();
    let mut data = p.asm().create_label();
    p.asm().lea(rsi, ptr(data)).unwrap();
    p.asm().mov(ecx, text.len() as u32).unwrap();
    p.asm().mov(edx, layout::SERIAL_PORT as u32).unwrap();
    p.asm().rep().outsb().unwrap();
    p.exit(0).unwrap();
    p.asm().set_label(&mut data).unwrap();
    p.asm().db(text).unwrap();
    let image = p.finish().unwrap();
    let hv = Hypervisor::new().unwrap();
    let partition = Partition::new(&hv, PartitionConfig::default(), Handlers::builtin()).unwrap();
    partition.load(image.load_gpa, &image.bytes).unwrap();
    let report = partition.run(image.entry).unwrap();
    assert!(report.vps[0].fault.is_none(), "{:?}", report.vps[0].fault);
    assert_eq!(report.vps[0].serial, text);
}
