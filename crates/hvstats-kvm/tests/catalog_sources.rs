//! The catalog against the backend's sources, through a full workload run under KVM: every VP
//! and partition counter the catalog marks "no" stays 0, and every counter it marks maintained
//! that the workload exercises is written. (`src/source_tables.rs` checks the same without KVM,
//! source by source.)

mod common;

use common::{counts, kvm_available, run_with};
use hvstats_abi::ObjectKind;
use hvstats_abi::catalog::{counters_of, vp};
use hvstats_guest::Mode;
use hvstats_guest::workload::Workload;

/// Maintained VP counters this workload may leave at 0, and why.
const MAY_STAY_ZERO: &[(hvstats_abi::CounterId, &str)] = &[
    (vp::CONTROL_REGISTER_ACCESSES, "kvm_cr does not fire under KVM's instruction emulator"),
    (vp::EXTERNAL_INTERRUPTS, "the instruction emulator has no external interrupt exits"),
    (
        vp::NESTED_PAGE_FAULT_INTERCEPTS,
        "no MMU faults under the instruction emulator, once mapped with EPT/NPT",
    ),
    (vp::REFLECTED_GUEST_PAGE_FAULTS, "with EPT/NPT guest page faults are not intercepted"),
    (vp::PENDING_INTERRUPTS, "an interrupt window exit needs an interrupt the guest blocks"),
    (vp::EMULATED_INSTRUCTIONS, "nothing in the workload needs emulation on VMX/SVM"),
    (vp::LOGICAL_PROCESSOR_MIGRATIONS, "the VP thread may stay on one CPU"),
    (
        vp::FAILED_HYPERCALLS,
        "the workload's hypercalls succeed; hyperv_guest's status probe counts each failure",
    ),
    (vp::HYPERVISOR_RUN_TIME, "all of the thread's time may be guest time at tick granularity"),
    (
        vp::OTHER_TIME_HISTOGRAM,
        "with the in-kernel irqchip every userspace exit is port I/O, MMIO, MSR or a hypercall \
         (HLT and interrupt windows stay in the kernel); accounting's unit tests cover the class",
    ),
    // How each halt ends depends on the host's halt_poll_ns and on when the timer fires: polled
    // until the wake-up (success), polled in vain then blocked (fail and wait), or not polled.
    // At least one of the three is written (asserted below).
    (vp::HALT_WAIT_HISTOGRAM, "a halt may end while KVM still polls"),
    (vp::HALT_POLL_SUCCESS_HISTOGRAM, "a halt's poll may give up before the wake-up"),
    (vp::HALT_POLL_FAIL_HISTOGRAM, "a halt's poll may see the wake-up in time"),
    (
        vp::CPU_WAIT_TIME_PER_DISPATCH,
        "a lone VP on an idle host may never wait for a CPU; \
         cost_and_wait::vps_competing_for_one_cpu_with_a_busy_host_thread_show_cpu_wait makes it wait",
    ),
    (vp::GPA_SPACE_HYPERCALLS, "the workload's hypercalls are HvCallNotifyLongSpinWait"),
    (vp::LOGICAL_PROCESSOR_HYPERCALLS, "the workload's hypercalls are HvCallNotifyLongSpinWait"),
    (vp::OTHER_HYPERCALLS, "the workload's hypercalls are HvCallNotifyLongSpinWait"),
    (vp::SYNTHETIC_INTERRUPT_HYPERCALLS, "the workload's hypercalls are HvCallNotifyLongSpinWait"),
    (vp::VIRTUAL_INTERRUPT_HYPERCALLS, "the workload's hypercalls are HvCallNotifyLongSpinWait"),
    (vp::VIRTUAL_MMU_HYPERCALLS, "the workload's hypercalls are HvCallNotifyLongSpinWait"),
    (vp::VIRTUAL_PROCESSOR_HYPERCALLS, "the workload's hypercalls are HvCallNotifyLongSpinWait"),
    (
        vp::HOST_MAJOR_PAGE_FAULTS,
        "guest RAM is anonymous memory: a fault waits for a disk only under swapping",
    ),
];

#[test]
fn unmaintained_counters_stay_zero_and_maintained_ones_are_written_through_a_full_run() {
    let w = Workload {
        cpuid: counts(30, 0),
        out: counts(20, 0),
        in_: counts(10, 0),
        rdmsr: counts(12, 0),
        wrmsr: counts(8, 0),
        user_msr: counts(4, 0),
        hlt: counts(5, 0),
        eoi: counts(10, 0),
        self_ipi: counts(6, 0),
        tpr: counts(3, 0),
        mmio: counts(4, 0),
        x2apic_eoi: counts(4, 0),
        x2apic_tpr: counts(2, 0),
        cr0: counts(5, 0),
        invlpg: counts(7, 0),
        ud2: counts(4, 0),
        page_faults: counts(3, 0),
        hypercalls: counts(9, 0),
        fresh_memory: counts(3, 0),
        repeat: false,
        serial: b"catalog\n".to_vec(),
        exit_status: 5,
    };
    // The workload assembles on any host; running it needs KVM.
    assert!(w.build(Mode::Long, hvstats_guest::layout::DEFAULT_LOAD_GPA).is_ok());
    if !kvm_available("unmaintained_counters_stay_zero_and_maintained_ones_are_written_through_a_full_run") {
        return;
    }
    let r = run_with(&w, Mode::Long, 1, |c| c.memory_bytes = hvstats_guest::workload::fresh_ram_end(1));
    let stats = r.partition.stats();
    let page = stats.vp_page(0).expect("VP 0 page");
    let mut wrong = Vec::new();
    for c in counters_of(ObjectKind::Vp) {
        let value = page.get(c.id);
        if !c.maintained.is_maintained() && value != 0 {
            wrong.push(format!("{} is marked not maintained but reads {value}", c.name));
        }
        let may_stay_zero = MAY_STAY_ZERO.iter().any(|(id, _)| *id == c.id);
        if c.maintained.is_maintained() && !may_stay_zero && value == 0 {
            wrong.push(format!("{} ({}) was never written", c.name, c.maintained.note()));
        }
    }
    let halts_recorded: u64 =
        [vp::HALT_WAIT_HISTOGRAM, vp::HALT_POLL_SUCCESS_HISTOGRAM, vp::HALT_POLL_FAIL_HISTOGRAM]
            .into_iter()
            .map(|h| page.histogram_slots(h).each_ref().map(|s| s.load(std::sync::atomic::Ordering::Relaxed)))
            .filter_map(|slots| hvstats_abi::histogram::Log2Histogram::from_slots(&slots))
            .map(|h| h.count())
            .sum();
    if halts_recorded == 0 {
        wrong.push("none of the halt histograms was written, with 5 HLTs".to_string());
    }
    for c in counters_of(ObjectKind::Partition).filter(|c| !c.maintained.is_maintained()) {
        let value = stats.page().get(c.id);
        if value != 0 {
            wrong.push(format!("partition {} is marked not maintained but reads {value}", c.name));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
