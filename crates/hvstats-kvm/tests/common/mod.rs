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
    /// Interrupts the host took, on every CPU, while the partition ran.
    pub host_interrupts: u64,
}

/// Interrupts the host has taken since boot, on every CPU: the first number of `/proc/stat`'s
/// `intr` line (on x86 it includes the local APIC's: timer, rescheduling, function calls, …).
pub fn host_interrupts_since_boot() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let intr = stat.lines().find_map(|l| l.strip_prefix("intr ")).expect("an intr line in /proc/stat");
    intr.split_whitespace().next().and_then(|n| n.parse().ok()).expect("the interrupt total")
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
    let interrupts_before = host_interrupts_since_boot();
    let report = std::thread::scope(|s| {
        let helper = s.spawn(|| beside(&partition, &running));
        let report = partition.run(image.entry);
        running.store(false, Ordering::SeqCst);
        helper.join().expect("the thread beside the run");
        report.expect("run")
    });
    let host_interrupts = host_interrupts_since_boot() - interrupts_before;
    for vp in &report.vps {
        assert!(vp.fault.is_none(), "VP {} faulted: {:?}", vp.index, vp.fault);
        assert_eq!(vp.exit_status, Some(workload.exit_status), "VP {}", vp.index);
    }
    for i in 0..vps {
        let missing = partition.unavailable_sources(i);
        assert!(missing.is_empty(), "tracepoint counters unavailable: {missing:?}");
    }
    Run { hv, partition, report, host_interrupts }
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
    // KVM's own per-vCPU stats agree where they overlap.
    let stat = |name| run.partition.kvm_stat(vp, name).unwrap_or_else(|| panic!("{ctx}: no KVM stat {name}"));
    let left = entries_left_for_the_host(&stat, run.host_interrupts);
    // Interrupts are KVM's injections (irq_injections, counted by the vendor's inject_irq), and an
    // injection whose entry was cancelled or whose delivery was cut short is injected, and
    // counted, again: at most once per such entry, which KVM counts in `left`. The guest's
    // handler EOIs above are the exact number delivered.
    let injections = stat("irq_injections");
    assert_eq!(v.events.interrupt_count, injections, "{ctx} interrupts (whv) are KVM's irq_injections");
    assert!(
        injections >= expected.interrupts && injections <= expected.interrupts + left.total(),
        "{ctx} interrupts (whv) {injections} vs {} delivered, {left:?}",
        expected.interrupts
    );
    assert_eq!(page.get(c::VIRTUAL_INTERRUPTS), v.events.interrupt_count, "{ctx} interrupts (page)");
    assert_eq!(stat("halt_exits"), expected.hlt, "{ctx} KVM halt_exits");
    // KVM's `exits` (vcpu_enter_guest, x86.c: one per return from the guest) counts, on this
    // software backend, the exits to userspace (hypercalls among them), halts and guest
    // exceptions, and the times the guest was left for the host, which `left` bounds.
    let exits = stat("exits");
    let ours = expected.io_exits
        + expected.user_msr
        + expected.user_mmio
        + expected.hlt
        + expected.exceptions
        + expected.hypercalls;
    assert!(exits >= ours && exits <= ours + left.total(), "{ctx} KVM exits {exits} vs {ours}, {left:?}");
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

/// Bounds the times a VP's guest was left, or an entry into it cancelled, for the host rather
/// than for an intercept of the guest. Each such return from the guest is one KVM `exits`
/// (vcpu_enter_guest, x86.c) and each such cancelled entry injects a pending interrupt again
/// (cancel_injection); each has a cause counted here.
#[derive(Debug)]
pub struct LeftForTheHost {
    /// `signal_exits`: kvm_handle_signal_exit() (include/linux/kvm_host.h, from vcpu_run's
    /// xfer_to_guest_mode work), once per KVM_RUN returning EINTR for a pending signal.
    pub signals: u64,
    /// `preemption_reported` + `preemption_other`: kvm_steal_time_set_preempted() (x86.c), from
    /// kvm_arch_vcpu_put() when kvm_sched_out() (virt/kvm/kvm_main.c) switches the VP thread out
    /// while it is runnable, i.e. after the guest was left for a reschedule.
    pub preemptions: u64,
    /// `irq_exits`: the exit handlers of host interrupts (handle_external_interrupt() in vmx.c,
    /// interrupt_intercept() in svm.c).
    pub irq_exits: u64,
    /// `request_irq_exits`: vcpu_run() (x86.c), a return to the VMM for its interrupt window.
    pub interrupt_windows: u64,
    /// The interrupts the host took on any CPU during the run (`/proc/stat`). The software
    /// backend leaves the guest for a host interrupt (and for a request another CPU's interrupt
    /// raised, e.g. the APIC timer's) without counting it in `irq_exits`, which stays 0: no KVM
    /// statistic counts those exits, and every interrupt the host took is what bounds them.
    pub host_interrupts: u64,
}

impl LeftForTheHost {
    pub fn total(&self) -> u64 {
        self.signals + self.preemptions + self.irq_exits.max(self.host_interrupts) + self.interrupt_windows
    }
}

/// [`LeftForTheHost`] from a VP's KVM statistics and the host's interrupts during the run.
pub fn entries_left_for_the_host(
    stat: &impl Fn(&'static str) -> u64,
    host_interrupts: u64,
) -> LeftForTheHost {
    LeftForTheHost {
        signals: stat("signal_exits"),
        preemptions: stat("preemption_reported") + stat("preemption_other"),
        irq_exits: stat("irq_exits"),
        interrupt_windows: stat("request_irq_exits"),
        host_interrupts,
    }
}

pub fn counts(base: u32, per_vp: u32) -> LoopCount {
    LoopCount::per_vp(base, per_vp)
}
