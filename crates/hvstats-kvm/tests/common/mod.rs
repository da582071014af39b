//! Shared set-up of the KVM tests: run a workload and read back every view of its counters.

#![allow(dead_code)]
// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hvstats::Hypervisor;
use hvstats::whv;
use hvstats_abi::whv::{ApicCounters, EventCounters, InterceptCounters};
use hvstats_guest::program::LoopCount;
use hvstats_guest::workload::{Expected, Workload};
use hvstats_guest::{Mode, layout};
use hvstats_kvm::enlightenment::HyperV;
use hvstats_kvm::{Handlers, Partition, PartitionConfig, RunReport};

pub use hvstats_testkit::kvm_available;

/// A workload run: the partition (for its pages and the WHv API) and the report.
pub struct Run {
    pub hv: Arc<Hypervisor>,
    pub partition: Partition,
    pub report: RunReport,
}

pub fn run(workload: &Workload, mode: Mode, vps: u32) -> Run {
    run_with(workload, mode, vps, |_| {})
}

/// As [`run`], with `adjust` applied to the configuration.
pub fn run_with(workload: &Workload, mode: Mode, vps: u32, adjust: impl FnOnce(&mut PartitionConfig)) -> Run {
    run_beside(workload, mode, vps, adjust, |_, _| {})
}

/// As [`run_with`], with `beside` running on another thread while the partition runs: it is given
/// the partition and a flag that turns false once the run has returned.
pub fn run_beside(
    workload: &Workload,
    mode: Mode,
    vps: u32,
    adjust: impl FnOnce(&mut PartitionConfig),
    beside: impl FnOnce(&Partition, &AtomicBool) + Send,
) -> Run {
    let image = workload.build(mode, layout::DEFAULT_LOAD_GPA).expect("build");
    let hv = Hypervisor::new().expect("hypervisor");
    let mut config =
        PartitionConfig { vp_count: vps, mode, timeout: Duration::from_secs(60), ..Default::default() };
    adjust(&mut config);
    // Every partition is enlightened: workloads that make hypercalls need it, the others do not
    // notice it.
    let mut handlers = Handlers::builtin();
    HyperV::new(hv.clone(), true).install(&mut config, &mut handlers);
    let partition = Partition::new(&hv, config, handlers).expect("partition");
    partition.load(image.load_gpa, &image.bytes).expect("load");
    let running = AtomicBool::new(true);
    let report = std::thread::scope(|s| {
        let helper = s.spawn(|| beside(&partition, &running));
        let report = partition.run(image.entry);
        running.store(false, Ordering::SeqCst);
        helper.join().expect("the thread beside the run");
        report.expect("run")
    });
    for vp in &report.vps {
        assert!(vp.fault.is_none(), "VP {} faulted: {:?}", vp.index, vp.fault);
        assert_eq!(vp.exit_status, Some(workload.exit_status), "VP {}", vp.index);
    }
    for i in 0..vps {
        let missing = partition.unavailable_sources(i);
        assert!(missing.is_empty(), "tracepoint counters unavailable: {missing:?}");
    }
    Run { hv, partition, report }
}

pub struct Views {
    pub intercepts: InterceptCounters,
    pub events: EventCounters,
    pub apic: ApicCounters,
}

pub fn views(run: &Run, vp: u32) -> Views {
    Views {
        intercepts: whv::intercept_counters(&run.partition, vp).expect("intercepts"),
        events: whv::event_counters(&run.partition, vp).expect("events"),
        apic: whv::apic_counters(&run.partition, vp).expect("apic"),
    }
}

/// Asserts every count `expected` gives, in the WHv structs and in the page, and KVM's own stats
/// where they overlap.
pub fn assert_exact(run: &Run, vp: u32, expected: &Expected) {
    use hvstats_abi::catalog::vp as c;
    let v = views(run, vp);
    let page = run.partition.stats().vp_page(vp).expect("page");
    let ctx = format!("VP {vp}");
    assert_eq!(v.intercepts.cpuid_instructions.count, expected.cpuid, "{ctx} cpuid (whv)");
    assert_eq!(page.get(c::CPUID_INSTRUCTIONS), expected.cpuid, "{ctx} cpuid (page)");
    assert_eq!(v.intercepts.io_instructions.count, expected.io, "{ctx} io (whv)");
    assert_eq!(page.get(c::IO_INSTRUCTIONS), expected.io, "{ctx} io (page)");
    assert_eq!(page.get(c::IO_INTERCEPT_MESSAGES), expected.io_exits, "{ctx} io exits (page)");
    assert_eq!(v.intercepts.msr_accesses.count, expected.msr, "{ctx} msr (whv)");
    assert_eq!(page.get(c::MSR_ACCESSES), expected.msr, "{ctx} msr (page)");
    assert_eq!(page.get(c::OTHER_MESSAGES), expected.user_msr, "{ctx} userspace msr exits (page)");
    assert_eq!(
        page.get(c::MEMORY_INTERCEPT_MESSAGES),
        expected.user_mmio,
        "{ctx} userspace mmio exits (page)"
    );
    assert_eq!(page.get(c::HYPERCALLS), expected.hypercalls, "{ctx} hypercalls (page)");
    assert_eq!(page.get(c::LONG_SPIN_WAIT_HYPERCALLS), expected.hypercalls, "{ctx} long spin waits (page)");
    assert_eq!(v.intercepts.halt_instructions.count, expected.hlt, "{ctx} hlt (whv)");
    assert_eq!(page.get(c::HLT_INSTRUCTIONS), expected.hlt, "{ctx} hlt (page)");
    assert_eq!(v.apic.mmio_access_count, expected.apic_mmio, "{ctx} apic mmio (whv)");
    assert_eq!(page.get(c::APIC_MMIO_ACCESSES), expected.apic_mmio, "{ctx} apic mmio (page)");
    assert_eq!(v.apic.eoi_access_count, expected.eoi, "{ctx} eoi (whv)");
    assert_eq!(page.get(c::APIC_EOI_ACCESSES), expected.eoi, "{ctx} eoi (page)");
    assert_eq!(v.apic.sent_ipi_count, expected.ipis, "{ctx} ipis (whv)");
    assert_eq!(page.get(c::APIC_IPIS_SENT), expected.ipis, "{ctx} ipis (page)");
    assert_eq!(v.apic.self_ipi_count, expected.self_ipis, "{ctx} self ipis (whv)");
    assert_eq!(page.get(c::APIC_SELF_IPIS_SENT), expected.self_ipis, "{ctx} self ipis (page)");
    assert_eq!(v.apic.tpr_access_count, expected.tpr, "{ctx} tpr (whv)");
    assert_eq!(page.get(c::APIC_TPR_ACCESSES), expected.tpr, "{ctx} tpr (page)");
    // Interrupts are KVM's injections: an injection cancelled before VM entry (host preemption,
    // a signal) is injected, and counted, again. The guest's handler EOIs above are the exact
    // number delivered; the injections are at least that and equal KVM's own stat.
    assert!(v.events.interrupt_count >= expected.interrupts, "{ctx} interrupts (whv)");
    assert!(
        v.events.interrupt_count <= expected.interrupts + expected.interrupts / 10 + 5,
        "{ctx} interrupts (whv)"
    );
    assert_eq!(page.get(c::VIRTUAL_INTERRUPTS), v.events.interrupt_count, "{ctx} interrupts (page)");
    // KVM's own per-vCPU stats agree where they overlap.
    let stat = |name| run.partition.kvm_stat(vp, name).unwrap_or_else(|| panic!("{ctx}: no KVM stat {name}"));
    assert_eq!(stat("halt_exits"), expected.hlt, "{ctx} KVM halt_exits");
    assert_eq!(stat("irq_injections"), v.events.interrupt_count, "{ctx} KVM irq_injections");
    // KVM's `exits` counts userspace exits (hypercalls among them), halts and guest exceptions (and a few exits of its
    // own, e.g. at the first entry), so it bounds ours from above.
    let exits = stat("exits");
    let ours = expected.io_exits
        + expected.user_msr
        + expected.user_mmio
        + expected.hlt
        + expected.exceptions
        + expected.hypercalls;
    assert!(exits >= ours && exits <= ours + 16, "{ctx} KVM exits {exits} vs {ours}");
    // Time halted is all of KVM's halt time (polling and blocking). It may be 0 even with HLTs:
    // when the wake-up is already pending as HLT executes, KVM does not halt at all.
    let halted_ns = stat("halt_wait_ns") + stat("halt_poll_success_ns") + stat("halt_poll_fail_ns");
    assert_eq!(v.intercepts.halt_instructions.time_100ns, halted_ns / 100, "{ctx} hlt time");
    if expected.hlt == 0 {
        assert_eq!(halted_ns, 0, "{ctx} hlt time without HLTs");
    }
    assert_eq!(
        v.intercepts.emulated_instructions.count,
        stat("insn_emulation"),
        "{ctx} emulated instructions"
    );
    let rt = whv::runtime_counters(&run.partition, vp).expect("runtime");
    assert!(rt.total_runtime_100ns > 0, "{ctx} total run time");
    assert!(rt.hypervisor_runtime_100ns <= rt.total_runtime_100ns, "{ctx} hypervisor run time");
}

pub fn counts(base: u32, per_vp: u32) -> LoopCount {
    LoopCount::per_vp(base, per_vp)
}
