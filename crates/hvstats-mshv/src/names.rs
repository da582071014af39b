//! The one table from the names Linux prints for the Microsoft Hypervisor's counters to the
//! counters of the catalog (seed 001), by name: debugfs prints names, and the ids behind them
//! differ between hypervisor builds.
//!
//! A counter has one name in hvstats, the one mainline Linux prints (with its object prefix:
//! `VpCpuidInstructionsCount`). Microsoft's kernel tree prints the same counter without the prefix
//! (`CpuidInstructionsCount`); [`canonical`] takes either form to the one name, so the table,
//! the side file of unmapped values and every surface name a counter the same on every host.
//!
//! A modern `XCount`/`XTime` pair is the catalog's "X/sec" and "X cost": the count stays a raw
//! cumulative count and the time a cumulative time, averaged by readers over the count. The
//! hypervisor's times are in 100 ns units, as most of the catalog's are; where the catalog states
//! nanoseconds ("Context switch time", "CPU wait time per dispatch") the value is converted.
//! A name this table does not know is not dropped: the publisher keeps it beside the pages
//! ([`hvstats::unmapped`]).

use std::collections::HashMap;
use std::sync::LazyLock;

use hvstats_abi::catalog::{CATALOG, Unit, hypervisor as hv, lp, partition as pt, vp};
use hvstats_abi::{CounterId, ObjectKind};

use crate::dialect::Dialect;

/// How a printed value becomes the catalog's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// The same unit.
    Same,
    /// 100 ns units to the nanoseconds the catalog states (× 100, saturating).
    Time100nsToNs,
}

impl Scale {
    /// The catalog's value of printed value `v`.
    pub const fn apply(self, v: u64) -> u64 {
        match self {
            Scale::Same => v,
            Scale::Time100nsToNs => v.saturating_mul(100),
        }
    }
}

/// One mapping: the printed name, the catalog counter, and the scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// The counter's name (mainline's, with its `Hv`, `Lp`, `Pt` or `Vp` prefix).
    pub name: &'static str,
    /// The catalog counter it is.
    pub counter: CounterId,
    /// How its value is converted.
    pub scale: Scale,
}

const fn m(name: &'static str, counter: CounterId) -> Mapping {
    Mapping { name, counter, scale: Scale::Same }
}

const fn ns(name: &'static str, counter: CounterId) -> Mapping {
    Mapping { name, counter, scale: Scale::Time100nsToNs }
}

/// Every mapped name.
pub const MAPPINGS: &[Mapping] = &[
    m("HvLogicalProcessors", hv::LOGICAL_PROCESSORS),
    m("HvPartitions", hv::PARTITIONS),
    m("HvTotalPages", hv::TOTAL_PAGES),
    m("HvVirtualProcessors", hv::VIRTUAL_PROCESSORS),
    m("HvMonitoredNotifications", hv::MONITORED_NOTIFICATIONS),
    m("LpGlobalTime", lp::GLOBAL_TIME),
    m("LpTotalRunTime", lp::TOTAL_RUN_TIME),
    m("LpHypervisorRunTime", lp::HYPERVISOR_RUN_TIME),
    m("LpHardwareInterrupts", lp::HARDWARE_INTERRUPTS),
    m("LpContextSwitches", lp::CONTEXT_SWITCHES),
    m("LpInterProcessorInterrupts", lp::INTER_PROCESSOR_INTERRUPTS),
    m("LpSchedulerInterrupts", lp::SCHEDULER_INTERRUPTS),
    m("LpTimerInterrupts", lp::TIMER_INTERRUPTS),
    m("LpInterProcessorInterruptsSent", lp::IPIS_SENT),
    m("LpProcessorHalts", lp::PROCESSOR_HALTS),
    m("LpMonitorTransitionCost", lp::MONITOR_TRANSITION_COST),
    ns("LpContextSwitchTime", lp::CONTEXT_SWITCH_TIME),
    m("LpC1TransitionsCount", lp::C1_TRANSITIONS),
    m("LpC1RunTime", lp::C1_TIME),
    m("LpC2TransitionsCount", lp::C2_TRANSITIONS),
    m("LpC2RunTime", lp::C2_TIME),
    m("LpC3TransitionsCount", lp::C3_TRANSITIONS),
    m("LpC3RunTime", lp::C3_TIME),
    m("PtVirtualProcessors", pt::VIRTUAL_PROCESSORS),
    m("PtTlbSize", pt::VIRTUAL_TLB_PAGES),
    m("PtAddressSpaces", pt::ADDRESS_SPACES),
    m("PtDepositedPages", pt::DEPOSITED_PAGES),
    m("PtGpaPages", pt::GPA_PAGES),
    m("PtGpaSpaceModifications", pt::GPA_SPACE_MODIFICATIONS),
    // Spelled so by the hypervisor's headers.
    m("PtVirtualTlbFlushEntires", pt::VIRTUAL_TLB_FLUSH_ENTRIES),
    m("PtRecommendedTlbSize", pt::RECOMMENDED_VIRTUAL_TLB_SIZE),
    m("VpTotalRunTime", vp::TOTAL_RUN_TIME),
    m("VpHypervisorRunTime", vp::HYPERVISOR_RUN_TIME),
    m("VpHypercallsCount", vp::HYPERCALLS),
    m("VpHypercallsTime", vp::HYPERCALLS_COST),
    m("VpPageInvalidationsCount", vp::PAGE_INVALIDATIONS),
    m("VpPageInvalidationsTime", vp::PAGE_INVALIDATIONS_COST),
    m("VpControlRegisterAccessesCount", vp::CONTROL_REGISTER_ACCESSES),
    m("VpControlRegisterAccessesTime", vp::CONTROL_REGISTER_ACCESSES_COST),
    m("VpIoInstructionsCount", vp::IO_INSTRUCTIONS),
    m("VpIoInstructionsTime", vp::IO_INSTRUCTIONS_COST),
    m("VpHltInstructionsCount", vp::HLT_INSTRUCTIONS),
    m("VpHltInstructionsTime", vp::HLT_INSTRUCTIONS_COST),
    m("VpMwaitInstructionsCount", vp::MWAIT_INSTRUCTIONS),
    m("VpMwaitInstructionsTime", vp::MWAIT_INSTRUCTIONS_COST),
    m("VpCpuidInstructionsCount", vp::CPUID_INSTRUCTIONS),
    m("VpCpuidInstructionsTime", vp::CPUID_INSTRUCTIONS_COST),
    m("VpMsrAccessesCount", vp::MSR_ACCESSES),
    m("VpMsrAccessesTime", vp::MSR_ACCESSES_COST),
    m("VpOtherInterceptsCount", vp::OTHER_INTERCEPTS),
    m("VpOtherInterceptsTime", vp::OTHER_INTERCEPTS_COST),
    m("VpExternalInterruptsCount", vp::EXTERNAL_INTERRUPTS),
    m("VpExternalInterruptsTime", vp::EXTERNAL_INTERRUPTS_COST),
    m("VpPendingInterruptsCount", vp::PENDING_INTERRUPTS),
    m("VpPendingInterruptsTime", vp::PENDING_INTERRUPTS_COST),
    m("VpEmulatedInstructionsCount", vp::EMULATED_INSTRUCTIONS),
    m("VpEmulatedInstructionsTime", vp::EMULATED_INSTRUCTIONS_COST),
    m("VpDebugRegisterAccessesCount", vp::DEBUG_REGISTER_ACCESSES),
    m("VpDebugRegisterAccessesTime", vp::DEBUG_REGISTER_ACCESSES_COST),
    m("VpPageFaultInterceptsCount", vp::PAGE_FAULT_INTERCEPTS),
    m("VpPageFaultInterceptsTime", vp::PAGE_FAULT_INTERCEPTS_COST),
    m("VpNestedPageFaultInterceptsCount", vp::NESTED_PAGE_FAULT_INTERCEPTS),
    m("VpNestedPageFaultInterceptsTime", vp::NESTED_PAGE_FAULT_INTERCEPTS_COST),
    m("VpGuestPageTableMaps", vp::GUEST_PAGE_TABLE_MAPS),
    m("VpLargePageTlbFills", vp::LARGE_PAGE_TLB_FILLS),
    m("VpSmallPageTlbFills", vp::SMALL_PAGE_TLB_FILLS),
    m("VpReflectedGuestPageFaults", vp::REFLECTED_GUEST_PAGE_FAULTS),
    m("VpApicMmioAccesses", vp::APIC_MMIO_ACCESSES),
    m("VpIoInterceptMessages", vp::IO_INTERCEPT_MESSAGES),
    m("VpMemoryInterceptMessages", vp::MEMORY_INTERCEPT_MESSAGES),
    m("VpApicEoiAccesses", vp::APIC_EOI_ACCESSES),
    m("VpOtherMessages", vp::OTHER_MESSAGES),
    m("VpPageTableAllocations", vp::PAGE_TABLE_ALLOCATIONS),
    m("VpLogicalProcessorMigrations", vp::LOGICAL_PROCESSOR_MIGRATIONS),
    m("VpAddressSpaceEvictions", vp::ADDRESS_SPACE_EVICTIONS),
    m("VpAddressSpaceSwitches", vp::ADDRESS_SPACE_SWITCHES),
    m("VpAddressDomainFlushes", vp::ADDRESS_DOMAIN_FLUSHES),
    m("VpAddressSpaceFlushes", vp::ADDRESS_SPACE_FLUSHES),
    m("VpGlobalGvaRangeFlushes", vp::GLOBAL_GVA_RANGE_FLUSHES),
    m("VpLocalGvaRangeFlushes", vp::LOCAL_FLUSHED_GVA_RANGES),
    m("VpPageTableEvictions", vp::PAGE_TABLE_EVICTIONS),
    m("VpPageTableReclamations", vp::PAGE_TABLE_RECLAMATIONS),
    m("VpPageTableResets", vp::PAGE_TABLE_RESETS),
    m("VpPageTableValidations", vp::PAGE_TABLE_VALIDATIONS),
    m("VpApicTprAccesses", vp::APIC_TPR_ACCESSES),
    m("VpPageTableWriteIntercepts", vp::PAGE_TABLE_WRITE_INTERCEPTS),
    m("VpSyntheticInterrupts", vp::SYNTHETIC_INTERRUPTS),
    m("VpVirtualInterrupts", vp::VIRTUAL_INTERRUPTS),
    m("VpApicIpisSent", vp::APIC_IPIS_SENT),
    m("VpApicSelfIpisSent", vp::APIC_SELF_IPIS_SENT),
    m("VpGpaSpaceHypercalls", vp::GPA_SPACE_HYPERCALLS),
    m("VpLogicalProcessorHypercalls", vp::LOGICAL_PROCESSOR_HYPERCALLS),
    m("VpLongSpinWaitHypercalls", vp::LONG_SPIN_WAIT_HYPERCALLS),
    m("VpOtherHypercalls", vp::OTHER_HYPERCALLS),
    m("VpSyntheticInterruptHypercalls", vp::SYNTHETIC_INTERRUPT_HYPERCALLS),
    m("VpVirtualInterruptHypercalls", vp::VIRTUAL_INTERRUPT_HYPERCALLS),
    m("VpVirtualMmuHypercalls", vp::VIRTUAL_MMU_HYPERCALLS),
    m("VpVirtualProcessorHypercalls", vp::VIRTUAL_PROCESSOR_HYPERCALLS),
    m("VpLogicalProcessorDispatches", vp::DISPATCHES),
    ns("VpWaitingForCpuTime", vp::CPU_WAIT_TIME_PER_DISPATCH),
];

/// The prefix mainline prints before a name of `kind`'s file (and every canonical name has).
pub const fn prefix(kind: ObjectKind) -> &'static str {
    match kind {
        ObjectKind::Hypervisor => "Hv",
        ObjectKind::LogicalProcessor => "Lp",
        ObjectKind::Partition => "Pt",
        ObjectKind::Vp => "Vp",
    }
}

/// Index of `kind` in [`ObjectKind::ALL`].
const fn slot(kind: ObjectKind) -> usize {
    match kind {
        ObjectKind::Hypervisor => 0,
        ObjectKind::LogicalProcessor => 1,
        ObjectKind::Partition => 2,
        ObjectKind::Vp => 3,
    }
}

/// Every name some kernel prints in a file of each kind, as printed, to its canonical name; and
/// mainline's names without their prefix, should a kernel print them so.
static CANONICAL: LazyLock<[HashMap<&'static str, &'static str>; 4]> = LazyLock::new(|| {
    ObjectKind::ALL.map(|kind| {
        let prefix = prefix(kind);
        let mut by_printed: HashMap<&'static str, &'static str> = HashMap::new();
        for &(_, name) in Dialect::Mainline.names(kind) {
            by_printed.insert(name, name);
            if let Some(stem) = name.strip_prefix(prefix) {
                by_printed.insert(stem, name);
            }
        }
        for dialect in Dialect::ALL {
            for &(_, printed) in dialect.names(kind) {
                if by_printed.contains_key(printed) {
                    continue;
                }
                // A name only Microsoft's tree prints (a placeholder): its canonical form is made
                // once, for the life of the process.
                let canonical: &'static str = Box::leak(format!("{prefix}{printed}").into_boxed_str());
                by_printed.insert(printed, canonical);
                by_printed.insert(canonical, canonical);
            }
        }
        by_printed
    })
});

/// The canonical name of `printed`, a name printed in a file of `kind`, with or without its object
/// prefix: `None` when no kernel hvstats knows prints it there (a newer or other build).
pub fn canonical(kind: ObjectKind, printed: &str) -> Option<&'static str> {
    CANONICAL[slot(kind)].get(printed).copied()
}

/// The mappings by canonical name.
static BY_NAME: LazyLock<HashMap<&'static str, &'static Mapping>> =
    LazyLock::new(|| MAPPINGS.iter().map(|m| (m.name, m)).collect());

/// The mapping of the counter named `name` (canonical) in a file of `kind`.
pub fn mapping(kind: ObjectKind, name: &str) -> Option<&'static Mapping> {
    BY_NAME.get(name).copied().filter(|m| m.counter.kind == kind)
}

/// The catalog counters of `kind` that no mapped name gives (readers show them as absent).
pub fn never_given(kind: ObjectKind) -> impl Iterator<Item = CounterId> {
    CATALOG
        .iter()
        .filter(move |c| c.id.kind == kind && !MAPPINGS.iter().any(|m| m.counter == c.id))
        .map(|c| c.id)
}

/// The unit a mapped value has once scaled (the catalog's).
pub fn unit(mapping: &Mapping) -> Option<Unit> {
    mapping.counter.counter().map(|c| c.unit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hvstats_abi::catalog::{GroupKind, Presentation};

    #[test]
    fn every_mapped_name_is_one_linux_prints_for_its_kind_and_maps_once() {
        for (i, a) in MAPPINGS.iter().enumerate() {
            let kind = a.counter.kind;
            let mainline = Dialect::Mainline.names(kind);
            assert!(mainline.iter().any(|(_, n)| *n == a.name), "{} not printed", a.name);
            assert_eq!(canonical(kind, a.name), Some(a.name), "{}", a.name);
            assert!(a.counter.counter().is_some(), "{}", a.name);
            for b in &MAPPINGS[i + 1..] {
                assert!(a.name != b.name && a.counter != b.counter, "{} / {} twice", a.name, b.name);
            }
        }
    }

    #[test]
    fn counts_and_times_pair_as_the_catalog_pairs_rates_and_costs() {
        for m in MAPPINGS.iter().filter(|m| m.name.ends_with("Time") && m.name.starts_with("Vp")) {
            let Some(count) = m.name.strip_suffix("Time").map(|s| format!("{s}Count")) else { continue };
            let Some(c) = mapping(ObjectKind::Vp, &count) else { continue };
            let cost = m.counter.counter().unwrap();
            assert_eq!(cost.presentation, Presentation::Cost, "{}", m.name);
            assert_eq!(cost.paired_count().map(|p| p.id), Some(c.counter), "{}", m.name);
        }
        // 15 Count/Time pairs.
        let costs =
            MAPPINGS.iter().filter(|m| m.counter.counter().unwrap().presentation == Presentation::Cost);
        assert_eq!(costs.count(), 16, "15 pairs and the CPU wait per dispatch");
    }

    #[test]
    fn the_2013_catalog_is_covered_except_hvstats_own_group() {
        for kind in ObjectKind::ALL {
            let missing: Vec<_> = never_given(kind).collect();
            assert!(missing.iter().all(|c| c.group == GroupKind::Hvstats), "{kind:?}: {missing:?}");
        }
        assert_eq!(
            mapping(ObjectKind::Vp, "VpCpuidInstructionsCount").map(|m| m.counter),
            Some(vp::CPUID_INSTRUCTIONS)
        );
        assert_eq!(mapping(ObjectKind::Partition, "VpCpuidInstructionsCount"), None);
    }

    #[test]
    fn a_name_is_taken_with_or_without_its_object_prefix_in_its_own_kind_only() {
        for printed in ["CpuidInstructionsCount", "VpCpuidInstructionsCount"] {
            assert_eq!(canonical(ObjectKind::Vp, printed), Some("VpCpuidInstructionsCount"));
        }
        assert_eq!(canonical(ObjectKind::Partition, "PartitionId"), Some("PtPartitionId"));
        assert_eq!(canonical(ObjectKind::Hypervisor, "LogicalProcessors"), Some("HvLogicalProcessors"));
        // A mainline name without its prefix, though no kernel prints it so yet.
        assert_eq!(canonical(ObjectKind::Vp, "LoadAvg"), Some("VpLoadAvg"));
        // Microsoft's placeholders mainline does not have.
        assert_eq!(canonical(ObjectKind::LogicalProcessor, "Placeholder10"), Some("LpPlaceholder10"));
        assert_eq!(canonical(ObjectKind::Vp, "Placeholder9"), Some("VpPlaceholder9"));
        assert_eq!(canonical(ObjectKind::Partition, "CpuidInstructionsCount"), None);
        assert_eq!(canonical(ObjectKind::Vp, "VpFutureThing"), None);
        assert_eq!(canonical(ObjectKind::Vp, "cpuidinstructionscount"), None);
    }

    #[test]
    fn times_the_catalog_states_in_nanoseconds_are_converted() {
        for m in MAPPINGS {
            let unit = unit(m).unwrap();
            assert_eq!(m.scale == Scale::Time100nsToNs, unit == Unit::Nanoseconds, "{}", m.name);
        }
        assert_eq!(Scale::Time100nsToNs.apply(7), 700);
        assert_eq!(Scale::Time100nsToNs.apply(u64::MAX), u64::MAX);
    }
}
