//! The counter catalog: every counter of seed 001 in one declarative table.
//!
//! Each row gives the object kind, group, index (as numbered in the seed; index 0 is the group
//! header), the seed's name, unit, presentation, who maintains it on KVM, and the seed's
//! description. Everything else — the `CounterId` constants in [`hypervisor`], [`lp`],
//! [`partition`] and [`vp`], page offsets, group lengths, JSON keys and help texts — is derived from
//! this table; no counter is written down anywhere else.
//!
//! The table grows as seed 004 says: counters appended to a group after its 1.0 are listed in
//! [`APPENDED`], which raises the group's minor version on that kind's page; data of hvstats' own
//! (the sequence counter of consistent reads, log2 histograms of times) sits in a group of its own
//! type, [`GroupKind::Hvstats`], which TLFS readers skip by its Length. A histogram is one row
//! whose value spans [`HISTOGRAM_SLOTS`] slots.

use crate::exit_reason::InterceptClass;
use crate::group::GroupVersion;
use crate::histogram::HISTOGRAM_SLOTS;
use crate::hypercall::HypercallClass;
use crate::object::ObjectKind;
use crate::source::{KvmHv, SourceKind, Tracepoint};

pub use crate::counter::{Counter, CounterId, GroupKind, Maintained, Presentation, Unit};
pub use crate::source::Source;

/// A row's observed key, when it has one.
macro_rules! observed_by {
    () => {
        None
    };
    ($obs:expr) => {
        Some($obs)
    };
}

macro_rules! catalog {
    ($(
        $(#[$mdoc:meta])*
        mod $module:ident = $kind:ident {
            $( $group:ident $index:literal $ident:ident $name:literal,
               $unit:ident, $pres:ident, $maint:expr, $(observed $obs:expr,)? $desc:literal; )*
        }
    )*) => {
        $(
            $(#[$mdoc])*
            pub mod $module {
                use super::*;
                $(
                    #[doc = $name]
                    pub const $ident: CounterId = CounterId {
                        kind: ObjectKind::$kind,
                        group: GroupKind::$group,
                        index: $index,
                    };
                )*
            }
        )*

        /// Every counter, in page order within each object kind.
        pub const CATALOG: &[Counter] = &[
            $($(
                Counter {
                    id: $module::$ident,
                    name: $name,
                    unit: Unit::$unit,
                    presentation: Presentation::$pres,
                    maintained: $maint,
                    observed_by: observed_by!($($obs)?),
                    description: $desc,
                },
            )*)*
        ];
    };
}

use crate::exit_reason::InterceptClass as Ic;
use crate::hypercall::HypercallEffect;
use crate::refusal::Refusal;
use crate::source::{
    HostFault, KvmStat, ObserverFact, PerfSoftwareEvent, RunLoopCount, RunLoopCount as Loop, ThreadTime,
    Tracepoint as Tp, VmsState,
};
use HypercallClass as Hc;
use Maintained::{By, No};
use Source::*;

const NO_VTLB: &str = "KVM has no virtual TLB: it uses nested or shadow paging in the kernel";
const NO_TIME: &str = "handled inside KVM, which records no per-event time";
const NO_SLOTS: &str = "the VMM's memory slots are not visible from outside";
const SOURCE_TABLE: &str = "written by the observer from the sources it composes for the VM";
/// The index of the first refusal reason's row in the hypervisor page's hvstats group.
pub const FIRST_REFUSAL_ROW: u16 = 6;

impl Refusal {
    /// Its row on the observer's hypervisor page: how many VMs are refused for it (a row of this
    /// catalog, so the table of reasons needs nothing of the counters).
    pub const fn row(self) -> CounterId {
        CounterId {
            kind: ObjectKind::Hypervisor,
            group: GroupKind::Hvstats,
            index: FIRST_REFUSAL_ROW + self.code(),
        }
    }
}

const REFUSED_BY_REASON: &str = "VMs found but not observed, for this reason of the refusal table";
const COUNT_ORIGINS: &str =
    "written by the publisher when it creates the partition, and by the observer at attach";

catalog! {
    /// Counters of the hypervisor object (root only).
    mod hypervisor = Hypervisor {
        Architectural 1 LOGICAL_PROCESSORS "Logical processors", Count, Instant,
            By(Procfs, "online host CPUs"),
            "The number of logical processors that are present in the computer.";
        Architectural 2 PARTITIONS "Partitions", Count, Instant,
            By(Authority, "live partitions of this instance"),
            "The number of partitions (that is, virtual machines) that are present in the computer.";
        Architectural 3 TOTAL_PAGES "Total pages", Pages, Instant,
            By(Authority, "guest RAM pages plus stats pages held by this instance"),
            "The number of bootstrap and deposited pages in the hypervisor.";
        Architectural 4 VIRTUAL_PROCESSORS "Virtual processors", Count, Instant,
            By(Authority, "VPs of all live partitions of this instance"),
            "The number of virtual processors that are present in the computer.";
        Architectural 5 MONITORED_NOTIFICATIONS "Monitored notifications", Count, Instant,
            No("hvstats implements no monitored-notification facility"),
            "The number of monitored notifications that are registered with the hypervisor.";
        // hvstats' own group: the observer of other processes' VMs, about itself. Every other
        // instance declares these unavailable.
        Hvstats 1 OBSERVER_UP "Observer up", Count, Instant,
            By(Observer(ObserverFact::Up), "1 while the observer refreshes the VMs it observes, 0 once its loop stopped"),
            "1 while this instance's observer of other processes' VMs refreshes them, 0 once it stopped (a reader reports an observer that died as 0 too).";
        Hvstats 2 OBSERVER_LAST_REFRESH "Observer last refresh timestamp", Time100ns, Instant,
            By(Observer(ObserverFact::LastRefresh), "the wall clock when the observer's last refresh of every VM ended"),
            "The Unix time (in 100ns) at which the observer last finished refreshing every VM it observes.";
        Hvstats 3 OBSERVER_VMS_ATTACHED "Observer VMs attached", Count, Instant,
            By(Observer(ObserverFact::Vms(VmsState::Attached)), "VMs published as partitions of the observer's instance"),
            "The number of VMs of other processes the observer observes (each a partition of its instance).";
        Hvstats 4 OBSERVER_VMS_REFUSED "Observer VMs refused", Count, Instant,
            By(Observer(ObserverFact::Vms(VmsState::Refused)), "VMs found but not observed, for any reason: the sum of the rows by reason that follow"),
            "The number of VMs the observer found and does not observe now for any reason (the rows that follow count them by reason): they have no counters.";
        Hvstats 5 OBSERVER_QMP_SESSIONS_UP "Observer QMP sessions up", Count, Instant,
            By(Observer(ObserverFact::QmpSessionsUp), "observed VMs whose QMP session answers now"),
            "The number of observed VMs whose QMP session answers now.";
        // hvstats 1.1 of the hypervisor page (see APPENDED): the VMs refused, by reason
        // ([`crate::refusal::Refusal`], whose `row` is each one's index).
        Hvstats 6 OBSERVER_VMS_REFUSED_NO_CAP_DAC_READ_SEARCH "Observer VMs refused: no CAP_DAC_READ_SEARCH", Count, Instant,
            By(Observer(ObserverFact::Refused(Refusal::NoCapDacReadSearch)), REFUSED_BY_REASON),
            "The number of VMs the observer found and does not observe now because their /proc/PID/fd may not be listed without CAP_DAC_READ_SEARCH.";
        Hvstats 7 OBSERVER_VMS_REFUSED_NO_CAP_SYS_PTRACE "Observer VMs refused: no CAP_SYS_PTRACE", Count, Instant,
            By(Observer(ObserverFact::Refused(Refusal::NoCapSysPtrace)), REFUSED_BY_REASON),
            "The number of VMs the observer found and does not observe now because their descriptors may not be read without CAP_SYS_PTRACE.";
        Hvstats 8 OBSERVER_VMS_REFUSED_UNREADABLE "Observer VMs refused: unreadable", Count, Instant,
            By(Observer(ObserverFact::Refused(Refusal::Unreadable)), REFUSED_BY_REASON),
            "The number of VMs the observer found and does not observe now because their descriptors were refused though the observer holds CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE.";
        Hvstats 9 OBSERVER_VMS_REFUSED_QMP_SOCKET_HIDDEN "Observer VMs refused: QMP socket hidden", Count, Instant,
            By(Observer(ObserverFact::Refused(Refusal::QmpSocketHidden)), REFUSED_BY_REASON),
            "The number of VMs the observer found and does not observe now because their QMP socket is in their mount namespace and not in the observer's (observed without QMP).";
        Hvstats 10 OBSERVER_VMS_REFUSED_DESCRIPTOR_BUDGET "Observer VMs refused: descriptor budget", Count, Instant,
            By(Observer(ObserverFact::Refused(Refusal::DescriptorBudget)), REFUSED_BY_REASON),
            "The number of VMs the observer found and does not observe now because the descriptors their vCPU threads need are more than the open file limit leaves.";
        Hvstats 11 OBSERVER_VMS_REFUSED_SHORTAGE "Observer VMs refused: shortage", Count, Instant,
            By(Observer(ObserverFact::Refused(Refusal::Shortage)), REFUSED_BY_REASON),
            "The number of VMs the observer found and does not observe now because the observer ran out of descriptors or memory reading them.";
        Hvstats 12 OBSERVER_VMS_REFUSED_CLAIMED_ELSEWHERE "Observer VMs refused: claimed elsewhere", Count, Instant,
            By(Observer(ObserverFact::Refused(Refusal::ClaimedElsewhere)), REFUSED_BY_REASON),
            "The number of VMs the observer found and does not observe now because another observer publishes them.";
        Hvstats 13 OBSERVER_VMS_REFUSED_FAILED "Observer VMs refused: failed", Count, Instant,
            By(Observer(ObserverFact::Refused(Refusal::Failed)), REFUSED_BY_REASON),
            "The number of VMs the observer found and does not observe now because they could not be observed for another reason.";
        Hvstats 14 OBSERVER_VMS_REFUSED_SEVERAL_VMS "Observer VMs refused: several VMs", Count, Instant,
            By(Observer(ObserverFact::Refused(Refusal::SeveralVms)), REFUSED_BY_REASON),
            "The number of processes the observer found holding several distinct KVM VMs, none observed while it cannot tell which one their vCPU threads run.";
    }

    /// Counters of a logical (host) processor object (root only).
    mod lp = LogicalProcessor {
        Architectural 1 GLOBAL_TIME "Global time", Time100ns, Instant,
            By(Procfs, "CLOCK_BOOTTIME in 100 ns"),
            "The global time on this logical processor.";
        Architectural 2 TOTAL_RUN_TIME "Total run time", Time100ns, PercentTime,
            By(Procfs, "/proc/stat: all non-idle time of the CPU"),
            "The total time (in 100ns) spent by the processor in guest and hypervisor code.";
        Architectural 3 HYPERVISOR_RUN_TIME "Hypervisor run time", Time100ns, PercentTime,
            By(Procfs, "/proc/stat: non-idle time less guest time"),
            "The total time (in 100ns) spent by the processor in hypervisor code.";
        Architectural 4 HARDWARE_INTERRUPTS "Hardware interrupts/sec", Count, Rate,
            By(Procfs, "/proc/interrupts: device interrupts of the CPU"),
            "The total number of hardware interrupts on the processor (excluding hypervisor interrupts).";
        Architectural 5 CONTEXT_SWITCHES "Context switches/sec", Count, Rate,
            No("Linux keeps no per-CPU context switch count readable without a system-wide perf event"),
            "The total number of virtual processor context switches on the processor.";
        Architectural 6 INTER_PROCESSOR_INTERRUPTS "Inter-processor interrupts/sec", Count, Rate,
            By(Procfs, "/proc/interrupts: CAL (function call) interrupts"),
            "The total number of hypervisor interprocessor interrupts delivered to the processor.";
        Architectural 7 SCHEDULER_INTERRUPTS "Scheduler interrupts/sec", Count, Rate,
            By(Procfs, "/proc/interrupts: RES (rescheduling) interrupts"),
            "The total number of hypervisor scheduler interrupts on the processor.";
        Architectural 8 TIMER_INTERRUPTS "Timer interrupts/sec", Count, Rate,
            By(Procfs, "/proc/interrupts: LOC (local timer) interrupts"),
            "The total number of hypervisor timer interrupts on the processor.";
        Architectural 9 IPIS_SENT "Interprocessor interrupts sent/sec", Count, Rate,
            No("Linux counts IPIs where they are received, not where they are sent"),
            "The total number of hypervisor interprocessor interrupts sent by the processor.";
        Architectural 10 PROCESSOR_HALTS "Processor halts/sec", Count, Rate,
            By(Procfs, "cpuidle: entries into every idle state of the CPU"),
            "The total number of entries into a halt state by the processor.";
        Architectural 11 MONITOR_TRANSITION_COST "Monitor transition cost", Cycles, Instant,
            No("needs a hardware cycle counter around VM entry and exit"),
            "The hardware cost of transitions into the hypervisor.";
        Architectural 12 CONTEXT_SWITCH_TIME "Context switch time", Nanoseconds, CumulativeTime,
            No("Linux does not account the time spent switching between tasks"),
            "The total time (in nanoseconds) spent switching between virtual processors.";
        Architectural 13 C1_TRANSITIONS "C1 transitions/sec", Count, Rate,
            By(Procfs, "cpuidle state named C1, when the CPU has one"),
            "The total number of entries of the processor into the C1 low-power idle state.";
        Architectural 14 C1_TIME "% C1 time", Time100ns, PercentTime,
            By(Procfs, "cpuidle state named C1, when the CPU has one"),
            "The percentage of time the processor spends in the C1 low-power idle state. % C1 time is a subset of the total processor idle time.";
        Architectural 15 C2_TRANSITIONS "C2 transitions/sec", Count, Rate,
            By(Procfs, "cpuidle state named C2, when the CPU has one"),
            "The total number of entries of the processor into the C2 low-power idle state.";
        Architectural 16 C2_TIME "% C2 time", Time100ns, PercentTime,
            By(Procfs, "cpuidle state named C2, when the CPU has one"),
            "The percentage of time the processor spends in the C2 low-power idle state. % C2 time is a subset of the total processor idle time.";
        Architectural 17 C3_TRANSITIONS "C3 transitions/sec", Count, Rate,
            By(Procfs, "cpuidle state named C3, when the CPU has one"),
            "The total number of entries of the processor into the C3 low-power idle state.";
        Architectural 18 C3_TIME "% C3 time", Time100ns, PercentTime,
            By(Procfs, "cpuidle state named C3, when the CPU has one"),
            "The percentage of time the processor spends in the C3 low-power idle state. % C3 time is a subset of the total processor idle time.";
    }

    /// Counters of a partition object.
    mod partition = Partition {
        Architectural 1 VIRTUAL_PROCESSORS "Virtual processors", Count, Instant,
            By(Authority, "VPs of the partition"),
            observed By(Authority, "vCPU file descriptors of the VMM process"),
            "The number of virtual processors that are present in the partition.";
        Release 1 VIRTUAL_TLB_PAGES "Virtual TLB Pages", Pages, Instant,
            No(NO_VTLB),
            "The number of pages used by the virtual TLB of the partition.";
        Release 2 ADDRESS_SPACES "Address spaces", Count, Instant,
            No(NO_VTLB),
            "The number of address spaces in the virtual TLB of the partition.";
        Release 3 DEPOSITED_PAGES "Deposited pages", Pages, Instant,
            No("KVM takes no page deposits from the parent"),
            "The number of pages that are deposited into the partition.";
        Release 4 GPA_PAGES "GPA pages", Pages, Instant,
            By(Authority, "pages of guest RAM plus mapped stats overlays"),
            observed No(NO_SLOTS),
            "The number of pages that are present in the GPA space of the partition (zero for root partition).";
        Release 5 GPA_SPACE_MODIFICATIONS "GPA space modifications/sec", Count, Rate,
            By(Authority, "memory slot changes: RAM set-up, stats page maps and unmaps"),
            observed No(NO_SLOTS),
            "The total number of modifications to the GPA space of the partition.";
        Release 6 VIRTUAL_TLB_FLUSH_ENTRIES "Virtual TLB flush entries/sec", Count, Rate,
            By(KvmStats(KvmStat::Vm(&["remote_tlb_flush"])), "VM stat remote_tlb_flush"),
            "The total number of flushes of the entire virtual TLB.";
        Release 7 RECOMMENDED_VIRTUAL_TLB_SIZE "Recommended virtual TLB size", Pages, Instant,
            No(NO_VTLB),
            "The recommended number of pages to be deposited for the virtual TLB.";
        // hvstats' own group of the partition page: which source of an observed VM gave each of
        // its counters ([`crate::vm_sources`]). Bookkeeping: surfaces read it through that module.
        Hvstats 1 SOURCE_1_NAME "Source 1 name", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "The first 8 bytes of the name of the observed VM's source 1, NUL-padded.";
        Hvstats 2 SOURCE_1_NAME_2 "Source 1 name, continued", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Bytes 8 to 15 of the name of the observed VM's source 1, NUL-padded.";
        Hvstats 3 SOURCE_1_STATE "Source 1 state", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Whether the observed VM's source 1 is there (bit 0) and gives counters now (bit 1), and from when it counts (bits 8-15: 1 attach, 2 the vCPU's creation, 3 kept in the kernel since the first attach, 4 the vCPU thread's start).";
        Hvstats 4 SOURCE_2_NAME "Source 2 name", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "The first 8 bytes of the name of the observed VM's source 2, NUL-padded.";
        Hvstats 5 SOURCE_2_NAME_2 "Source 2 name, continued", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Bytes 8 to 15 of the name of the observed VM's source 2, NUL-padded.";
        Hvstats 6 SOURCE_2_STATE "Source 2 state", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Whether the observed VM's source 2 is there (bit 0) and gives counters now (bit 1), and from when it counts (bits 8-15: 1 attach, 2 the vCPU's creation, 3 kept in the kernel since the first attach, 4 the vCPU thread's start).";
        Hvstats 7 SOURCE_3_NAME "Source 3 name", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "The first 8 bytes of the name of the observed VM's source 3, NUL-padded.";
        Hvstats 8 SOURCE_3_NAME_2 "Source 3 name, continued", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Bytes 8 to 15 of the name of the observed VM's source 3, NUL-padded.";
        Hvstats 9 SOURCE_3_STATE "Source 3 state", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Whether the observed VM's source 3 is there (bit 0) and gives counters now (bit 1), and from when it counts (bits 8-15: 1 attach, 2 the vCPU's creation, 3 kept in the kernel since the first attach, 4 the vCPU thread's start).";
        Hvstats 10 SOURCE_4_NAME "Source 4 name", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "The first 8 bytes of the name of the observed VM's source 4, NUL-padded.";
        Hvstats 11 SOURCE_4_NAME_2 "Source 4 name, continued", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Bytes 8 to 15 of the name of the observed VM's source 4, NUL-padded.";
        Hvstats 12 SOURCE_4_STATE "Source 4 state", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Whether the observed VM's source 4 is there (bit 0) and gives counters now (bit 1), and from when it counts (bits 8-15: 1 attach, 2 the vCPU's creation, 3 kept in the kernel since the first attach, 4 the vCPU thread's start).";
        Hvstats 13 SOURCE_5_NAME "Source 5 name", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "The first 8 bytes of the name of the observed VM's source 5, NUL-padded.";
        Hvstats 14 SOURCE_5_NAME_2 "Source 5 name, continued", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Bytes 8 to 15 of the name of the observed VM's source 5, NUL-padded.";
        Hvstats 15 SOURCE_5_STATE "Source 5 state", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Whether the observed VM's source 5 is there (bit 0) and gives counters now (bit 1), and from when it counts (bits 8-15: 1 attach, 2 the vCPU's creation, 3 kept in the kernel since the first attach, 4 the vCPU thread's start).";
        Hvstats 16 SOURCE_6_NAME "Source 6 name", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "The first 8 bytes of the name of the observed VM's source 6, NUL-padded.";
        Hvstats 17 SOURCE_6_NAME_2 "Source 6 name, continued", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Bytes 8 to 15 of the name of the observed VM's source 6, NUL-padded.";
        Hvstats 18 SOURCE_6_STATE "Source 6 state", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Whether the observed VM's source 6 is there (bit 0) and gives counters now (bit 1), and from when it counts (bits 8-15: 1 attach, 2 the vCPU's creation, 3 kept in the kernel since the first attach, 4 the vCPU thread's start).";
        Hvstats 19 PARTITION_WRITERS_1 "Partition counter sources 1", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Which source writes each partition counter of the observed VM, 4 bits per counter (the partition counters 0 to 15 in catalog order): 0 none, else the source's number.";
        Hvstats 20 PARTITION_WRITERS_2 "Partition counter sources 2", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Which source writes each partition counter of the observed VM, 4 bits per counter (the partition counters 16 to 31 in catalog order): 0 none, else the source's number.";
        Hvstats 21 VP_WRITERS_1 "VP counter sources 1", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Which source writes each VP counter of the observed VM, 4 bits per counter (the VP counters 0 to 15 in catalog order): 0 none, else the source's number.";
        Hvstats 22 VP_WRITERS_2 "VP counter sources 2", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Which source writes each VP counter of the observed VM, 4 bits per counter (the VP counters 16 to 31 in catalog order): 0 none, else the source's number.";
        Hvstats 23 VP_WRITERS_3 "VP counter sources 3", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Which source writes each VP counter of the observed VM, 4 bits per counter (the VP counters 32 to 47 in catalog order): 0 none, else the source's number.";
        Hvstats 24 VP_WRITERS_4 "VP counter sources 4", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Which source writes each VP counter of the observed VM, 4 bits per counter (the VP counters 48 to 63 in catalog order): 0 none, else the source's number.";
        Hvstats 25 VP_WRITERS_5 "VP counter sources 5", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Which source writes each VP counter of the observed VM, 4 bits per counter (the VP counters 64 to 79 in catalog order): 0 none, else the source's number.";
        Hvstats 26 VP_WRITERS_6 "VP counter sources 6", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Which source writes each VP counter of the observed VM, 4 bits per counter (the VP counters 80 to 95 in catalog order): 0 none, else the source's number.";
        Hvstats 27 VP_WRITERS_7 "VP counter sources 7", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Which source writes each VP counter of the observed VM, 4 bits per counter (the VP counters 96 to 111 in catalog order): 0 none, else the source's number.";
        Hvstats 28 VP_WRITERS_8 "VP counter sources 8", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Which source writes each VP counter of the observed VM, 4 bits per counter (the VP counters 112 to 127 in catalog order): 0 none, else the source's number.";
        Hvstats 29 PARTITION_WRITERS_3 "Partition counter sources 3", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Which source writes each partition counter of the observed VM, 4 bits per counter (the partition counters 32 to 47 in catalog order): 0 none, else the source's number.";
        // hvstats 1.1 of the partition page (see APPENDED): what the VM is doing.
        Hvstats 30 VM_STATE "VM state", Count, State,
            By(RunState, "running while the partition runs, shutdown once it stopped"),
            observed By(RunState, "libvirt's domain state for a libvirt domain, else QEMU's run state (QMP query-status): unknown while neither answers"),
            "Whether the VM runs, is paused, shut down, stopped on an internal error KVM could not get past, or its state is unknown now.";
        // hvstats 1.2 of the partition page: room for every source a 4-bit source number can
        // name ([`crate::vm_sources::MAX_SOURCES`]), so a VM composing more sources needs no
        // layout change.
        Hvstats 31 SOURCE_7_NAME "Source 7 name", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "The first 8 bytes of the name of the observed VM's source 7, NUL-padded.";
        Hvstats 32 SOURCE_7_NAME_2 "Source 7 name, continued", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Bytes 8 to 15 of the name of the observed VM's source 7, NUL-padded.";
        Hvstats 33 SOURCE_7_STATE "Source 7 state", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Whether the observed VM's source 7 is there (bit 0) and gives counters now (bit 1), and from when it counts (bits 8-15: 1 attach, 2 the vCPU's creation, 3 kept in the kernel since the first attach, 4 the vCPU thread's start).";
        Hvstats 34 SOURCE_8_NAME "Source 8 name", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "The first 8 bytes of the name of the observed VM's source 8, NUL-padded.";
        Hvstats 35 SOURCE_8_NAME_2 "Source 8 name, continued", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Bytes 8 to 15 of the name of the observed VM's source 8, NUL-padded.";
        Hvstats 36 SOURCE_8_STATE "Source 8 state", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Whether the observed VM's source 8 is there (bit 0) and gives counters now (bit 1), and from when it counts (bits 8-15: 1 attach, 2 the vCPU's creation, 3 kept in the kernel since the first attach, 4 the vCPU thread's start).";
        Hvstats 37 SOURCE_9_NAME "Source 9 name", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "The first 8 bytes of the name of the observed VM's source 9, NUL-padded.";
        Hvstats 38 SOURCE_9_NAME_2 "Source 9 name, continued", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Bytes 8 to 15 of the name of the observed VM's source 9, NUL-padded.";
        Hvstats 39 SOURCE_9_STATE "Source 9 state", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Whether the observed VM's source 9 is there (bit 0) and gives counters now (bit 1), and from when it counts (bits 8-15: 1 attach, 2 the vCPU's creation, 3 kept in the kernel since the first attach, 4 the vCPU thread's start).";
        Hvstats 40 SOURCE_10_NAME "Source 10 name", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "The first 8 bytes of the name of the observed VM's source 10, NUL-padded.";
        Hvstats 41 SOURCE_10_NAME_2 "Source 10 name, continued", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Bytes 8 to 15 of the name of the observed VM's source 10, NUL-padded.";
        Hvstats 42 SOURCE_10_STATE "Source 10 state", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Whether the observed VM's source 10 is there (bit 0) and gives counters now (bit 1), and from when it counts (bits 8-15: 1 attach, 2 the vCPU's creation, 3 kept in the kernel since the first attach, 4 the vCPU thread's start).";
        Hvstats 43 SOURCE_11_NAME "Source 11 name", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "The first 8 bytes of the name of the observed VM's source 11, NUL-padded.";
        Hvstats 44 SOURCE_11_NAME_2 "Source 11 name, continued", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Bytes 8 to 15 of the name of the observed VM's source 11, NUL-padded.";
        Hvstats 45 SOURCE_11_STATE "Source 11 state", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Whether the observed VM's source 11 is there (bit 0) and gives counters now (bit 1), and from when it counts (bits 8-15: 1 attach, 2 the vCPU's creation, 3 kept in the kernel since the first attach, 4 the vCPU thread's start).";
        Hvstats 46 SOURCE_12_NAME "Source 12 name", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "The first 8 bytes of the name of the observed VM's source 12, NUL-padded.";
        Hvstats 47 SOURCE_12_NAME_2 "Source 12 name, continued", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Bytes 8 to 15 of the name of the observed VM's source 12, NUL-padded.";
        Hvstats 48 SOURCE_12_STATE "Source 12 state", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Whether the observed VM's source 12 is there (bit 0) and gives counters now (bit 1), and from when it counts (bits 8-15: 1 attach, 2 the vCPU's creation, 3 kept in the kernel since the first attach, 4 the vCPU thread's start).";
        Hvstats 49 SOURCE_13_NAME "Source 13 name", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "The first 8 bytes of the name of the observed VM's source 13, NUL-padded.";
        Hvstats 50 SOURCE_13_NAME_2 "Source 13 name, continued", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Bytes 8 to 15 of the name of the observed VM's source 13, NUL-padded.";
        Hvstats 51 SOURCE_13_STATE "Source 13 state", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Whether the observed VM's source 13 is there (bit 0) and gives counters now (bit 1), and from when it counts (bits 8-15: 1 attach, 2 the vCPU's creation, 3 kept in the kernel since the first attach, 4 the vCPU thread's start).";
        Hvstats 52 SOURCE_14_NAME "Source 14 name", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "The first 8 bytes of the name of the observed VM's source 14, NUL-padded.";
        Hvstats 53 SOURCE_14_NAME_2 "Source 14 name, continued", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Bytes 8 to 15 of the name of the observed VM's source 14, NUL-padded.";
        Hvstats 54 SOURCE_14_STATE "Source 14 state", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Whether the observed VM's source 14 is there (bit 0) and gives counters now (bit 1), and from when it counts (bits 8-15: 1 attach, 2 the vCPU's creation, 3 kept in the kernel since the first attach, 4 the vCPU thread's start).";
        Hvstats 55 SOURCE_15_NAME "Source 15 name", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "The first 8 bytes of the name of the observed VM's source 15, NUL-padded.";
        Hvstats 56 SOURCE_15_NAME_2 "Source 15 name, continued", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Bytes 8 to 15 of the name of the observed VM's source 15, NUL-padded.";
        Hvstats 57 SOURCE_15_STATE "Source 15 state", Count, Instant,
            By(Authority, SOURCE_TABLE),
            "Whether the observed VM's source 15 is there (bit 0) and gives counters now (bit 1), and from when it counts (bits 8-15: 1 attach, 2 the vCPU's creation, 3 kept in the kernel since the first attach, 4 the vCPU thread's start).";
        // hvstats 1.3 of the partition page (see APPENDED): from when its counters count, so a
        // reader tells a reset (a new publisher, a new attach) from a quiet VM. Bookkeeping:
        // surfaces read it through `crate::vm_sources::CountOrigins`.
        Hvstats 58 COUNTING_SINCE "Counting since", Count, Instant,
            By(Authority, COUNT_ORIGINS),
            "When the publisher created the partition's page (an observer: attached to the VM), in microseconds since the Unix epoch: the origin of every counter that counts from then, which a new publisher starts again from 0.";
        Hvstats 59 VM_STARTED "VM started", Count, Instant,
            By(Authority, COUNT_ORIGINS),
            "When the observed VM's process started, in microseconds since the Unix epoch (0: unknown): the origin of the counters its sources count from the vCPU's creation, which survive a new observer.";
        // hvstats 1.4 of the partition page (see APPENDED): from when the counts kept in the
        // kernel across observers count.
        Hvstats 60 KEPT_SINCE "Counts kept since", Count, Instant,
            By(Authority, COUNT_ORIGINS),
            "When the first observer attached to the VM began the counts the kernel keeps for it across observers, in microseconds since the Unix epoch (0: none kept): the origin of the counters its sources count from then, which a restarted observer continues.";
    }

    /// Counters of a virtual processor object.
    mod vp = Vp {
        Architectural 1 TOTAL_RUN_TIME "Total run time", Time100ns, PercentTime,
            By(ThreadTime(ThreadTime::Total), "CPU clock of the VP thread (guest, KVM and run-loop time)"),
            "The total time (in 100ns) spent by the processor in guest and hypervisor code.";
        Architectural 2 HYPERVISOR_RUN_TIME "Hypervisor run time", Time100ns, PercentTime,
            By(ThreadTime(ThreadTime::Hypervisor), "VP thread CPU time less its guest time (stat field 43; 0 under KVM's instruction emulator, so all of it)"),
            "The total time (in 100ns) spent by the virtual processor in hypervisor code.";
        Release 1 HYPERCALLS "Hypercalls/sec", Count, Rate,
            By(RunLoop(Loop::Hypercalls), "writes to a registered hypercall port (the hypercall page traps through one)"),
            observed By(KvmStats(KvmStat::Vcpu(&["hypercalls"])), "vCPU stat hypercalls (stats-fd, libvirt, qmp: every hypercall KVM sees, whole-life); else VMCALL/VMMCALL exits from kvm:kvm_exit on VMX/SVM hosts (every hypercall, from attach); else, where kvm_exit does not fire, kvm:kvm_hv_hypercall records for a VM whose hv-* features are known and not none (its Hyper-V hypercalls are all its hypercalls; from attach)"),
            "The total number of hypercalls made by guest code on the virtual processor.";
        Release 2 HYPERCALLS_COST "Hypercalls cost", Time100ns, Cost,
            By(RunLoop(Loop::HypercallsTime), "time from the hypercall exit to the next entry into the guest"),
            observed By(KvmExitTime(Ic::Hypercall), "time from a VMCALL/VMMCALL kvm:kvm_exit to the next kvm:kvm_entry, timed in the kernel, on VMX/SVM hosts; where kvm_exit does not fire, from kvm:kvm_hv_hypercall to kvm:kvm_hv_hypercall_done for an enlightened VM (Hyper-V hypercalls; it includes the VMM's handling of the calls KVM hands to it)"),
            "The average time (in nanoseconds) spent processing a hypercall.";
        Release 3 PAGE_INVALIDATIONS "Page invalidations/sec", Count, Rate,
            By(KvmStats(KvmStat::Vcpu(&["invlpg"])), "vCPU stat invlpg"),
            "The total number of INVLPG instructions executed by guest code on the virtual processor.";
        Release 4 PAGE_INVALIDATIONS_COST "Page invalidations cost", Time100ns, Cost,
            No(NO_TIME),
            "The average time (in nanoseconds) spent processing an INVLPG instruction.";
        Release 5 CONTROL_REGISTER_ACCESSES "Control register accesses/sec", Count, Rate,
            By(Tracepoint(Tp::Cr), "kvm:kvm_cr; fires on VMX/SVM hosts, stays 0 under KVM's instruction emulator"),
            "The total number of control register accesses by guest code on the virtual processor.";
        Release 6 CONTROL_REGISTER_ACCESSES_COST "Control register accesses cost", Time100ns, Cost,
            No(NO_TIME),
            "The average time (in nanoseconds) spent processing a control register access.";
        Release 7 IO_INSTRUCTIONS "IO instructions/sec", Count, Rate,
            By(Tracepoint(Tp::Pio), "kvm:kvm_pio (every port access, in the kernel or in userspace) less hypercall port writes"),
            "The total number of IO instructions executed by guest code on a virtual processor.";
        Release 8 IO_INSTRUCTIONS_COST "IO instructions cost", Time100ns, Cost,
            By(RunLoop(Loop::IoTime), "time of the port accesses handled in userspace"),
            "The average time (in nanoseconds) spent processing an IO instruction.";
        Release 9 HLT_INSTRUCTIONS "HLT instructions/sec", Count, Rate,
            By(KvmStats(KvmStat::Vcpu(&["halt_exits"])), "vCPU stat halt_exits"),
            "The total number of HLT instructions executed by guest code on a virtual processor.";
        Release 10 HLT_INSTRUCTIONS_COST "HLT instructions cost", Time100ns, Cost,
            By(KvmStats(KvmStat::Vcpu(&["halt_wait_ns", "halt_poll_success_ns", "halt_poll_fail_ns"])), "vCPU stats halt_wait_ns + halt_poll_success_ns + halt_poll_fail_ns: all time halted"),
            "The total time (in 100ns) the virtual processor spent halted after HLT instructions, waiting or polling for a wake-up: time halted, not time spent handling them (readers show it per virtual processor as a share of the time).";
        Release 11 MWAIT_INSTRUCTIONS "MWAIT instructions/sec", Count, Rate,
            No("KVM counts no MWAIT exits"),
            observed By(KvmExit(Ic::Mwait), "MWAIT exits on VMX/SVM hosts only"),
            "The total number of MWAIT instructions executed by guest code on a virtual processor.";
        Release 12 MWAIT_INSTRUCTIONS_COST "MWAIT instructions cost", Time100ns, Cost,
            No(NO_TIME),
            "The average time (in nanoseconds) spent processing an MWAIT instruction.";
        Release 13 CPUID_INSTRUCTIONS "CPUID instructions/sec", Count, Rate,
            By(Tracepoint(Tp::Cpuid), "kvm:kvm_cpuid"),
            "The total number of CPUID instructions executed by guest code on a virtual processor.";
        Release 14 CPUID_INSTRUCTIONS_COST "CPUID instructions cost", Time100ns, Cost,
            No(NO_TIME),
            "The average time (in nanoseconds) spent processing a CPUID instruction.";
        Release 15 MSR_ACCESSES "MSR accesses/sec", Count, Rate,
            By(Tracepoint(Tp::Msr), "kvm:kvm_msr plus MSR exits handled in userspace"),
            "The total number of MSR instructions executed by guest code on a virtual processor.";
        Release 16 MSR_ACCESSES_COST "MSR accesses cost", Time100ns, Cost,
            By(RunLoop(Loop::MsrTime), "time of the MSR accesses handled in userspace"),
            "The average time (in nanoseconds) spent processing an MSR instruction.";
        Release 17 OTHER_INTERCEPTS "Other intercepts/sec", Count, Rate,
            By(RunLoop(Loop::OtherIntercepts), "userspace exits other than port I/O, MSR and hypercalls (MMIO included)"),
            observed By(KvmExit(Ic::Other), "kvm_exit less every classified reason, on VMX/SVM hosts only"),
            "The total number of other intercepts triggered by guest code on a virtual processor.";
        Release 18 OTHER_INTERCEPTS_COST "Other intercepts cost", Time100ns, Cost,
            By(RunLoop(Loop::OtherInterceptsTime), "time of those exits"),
            "The average time (in nanoseconds) spent processing other intercepts.";
        Release 19 EXTERNAL_INTERRUPTS "External interrupts/sec", Count, Rate,
            By(KvmStats(KvmStat::Vcpu(&["irq_exits"])), "vCPU stat irq_exits; host interrupts exit VMX/SVM guests, the instruction emulator has none"),
            "The total number of external interrupts received by the hypervisor while executing guest code on the virtual processor.";
        Release 20 EXTERNAL_INTERRUPTS_COST "External interrupts cost", Time100ns, Cost,
            No(NO_TIME),
            "The average time (in nanoseconds) spent processing an external interrupt.";
        Release 21 PENDING_INTERRUPTS "Pending interrupts/sec", Count, Rate,
            By(KvmStats(KvmStat::Vcpu(&["irq_window_exits"])), "vCPU stat irq_window_exits"),
            "The total number of intercepts due to a task priority (TPR) reduction by guest code on the virtual processor.";
        Release 22 PENDING_INTERRUPTS_COST "Pending interrupts cost", Time100ns, Cost,
            No(NO_TIME),
            "The average time (in nanoseconds) spent processing a pending interrupt intercept.";
        Release 23 EMULATED_INSTRUCTIONS "Emulated instructions/sec", Count, Rate,
            By(KvmStats(KvmStat::Vcpu(&["insn_emulation"])), "vCPU stat insn_emulation"),
            "The total number of emulated instructions while executing guest code on the virtual processor.";
        Release 24 EMULATED_INSTRUCTIONS_COST "Emulated instructions cost", Time100ns, Cost,
            No(NO_TIME),
            "The average time (in nanoseconds) spent emulating an instruction.";
        Release 25 DEBUG_REGISTER_ACCESSES "Debug register accesses/sec", Count, Rate,
            No("KVM counts no debug register exits and has no tracepoint for them"),
            observed By(KvmExit(Ic::DebugRegister), "DR access exits on VMX/SVM hosts only"),
            "The total number of debug register accesses by guest code on the virtual processor.";
        Release 26 DEBUG_REGISTER_ACCESSES_COST "Debug register accesses cost", Time100ns, Cost,
            No(NO_TIME),
            "The average time (in nanoseconds) spent handling a debug register access.";
        Release 27 PAGE_FAULT_INTERCEPTS "Page fault intercepts/sec", Count, Rate,
            No("KVM counts no #PF exits: its pf_taken counts its MMU's faults, nested page faults under EPT/NPT (Nested page fault intercepts)"),
            observed By(KvmExit(Ic::PageFault), "#PF exception exits on VMX/SVM hosts only"),
            "The total number of page fault exceptions intercepted by the hypervisor while executing guest code on the virtual processor.";
        Release 28 PAGE_FAULT_INTERCEPTS_COST "Page fault intercepts cost", Time100ns, Cost,
            No(NO_TIME),
            "The average time (in nanoseconds) spent processing a page fault intercept.";
        Release 29 GUEST_PAGE_TABLE_MAPS "Guest page table maps/sec", Count, Rate,
            No(NO_VTLB),
            "The total number of map operations for guest page table pages.";
        Release 30 LARGE_PAGE_TLB_FILLS "Large page TLB fills/sec", Count, Rate,
            No(NO_VTLB),
            "The total number of virtual TLB misses on large pages.";
        Release 31 SMALL_PAGE_TLB_FILLS "Small page TLB fills/sec", Count, Rate,
            No(NO_VTLB),
            "The total number of virtual TLB misses on 4K pages.";
        Release 32 REFLECTED_GUEST_PAGE_FAULTS "Reflected guest page faults/sec", Count, Rate,
            By(KvmStats(KvmStat::Vcpu(&["pf_guest"])), "vCPU stat pf_guest"),
            "The total number of page fault exceptions delivered to the guest.";
        Release 33 APIC_MMIO_ACCESSES "APIC MMIO accesses/sec", Count, Rate,
            By(Tracepoint(Tp::ApicMmio), "kvm:kvm_mmio on the local APIC page at 0xFEE00000 (guest accesses only)"),
            "The total number of APIC MMIO register accesses by guest code on the virtual processor.";
        Release 34 IO_INTERCEPT_MESSAGES "IO intercept messages/sec", Count, Rate,
            By(RunLoop(Loop::IoExits), "port-I/O exits to userspace (a write to the hypercall port is a hypercall, not I/O)"),
            observed By(Tracepoint(Tp::UserspaceIo), "kvm_userspace_exit reason 2 (KVM_EXIT_IO)"),
            "The total number of IO intercept messages sent to the parent partition.";
        Release 35 MEMORY_INTERCEPT_MESSAGES "Memory intercept messages/sec", Count, Rate,
            By(RunLoop(Loop::MmioExits), "MMIO exits to userspace"),
            observed By(Tracepoint(Tp::UserspaceMmio), "kvm_userspace_exit reason 6 (KVM_EXIT_MMIO)"),
            "The total number of memory intercept messages sent to the parent partition.";
        Release 36 APIC_EOI_ACCESSES "APIC EOI accesses/sec", Count, Rate,
            By(Tracepoint(Tp::ApicEoi), "kvm:kvm_mmio writes of the APIC EOI register, plus kvm:kvm_msr writes of x2APIC MSR 0x80B"),
            "The total number of APIC EOI register writes by guest code on the virtual processor.";
        Release 37 OTHER_MESSAGES "Other messages/sec", Count, Rate,
            By(RunLoop(Loop::OtherExits), "userspace exits other than port I/O, MMIO and hypercalls (MSR exits among them)"),
            observed By(Tracepoint(Tp::UserspaceOther), "kvm_userspace_exit other than IO, MMIO and signal interruptions (reason 10)"),
            "The total number of other intercept messages sent to the parent partition.";
        Release 38 PAGE_TABLE_ALLOCATIONS "Page table allocations/sec", Count, Rate,
            No(NO_VTLB),
            "The total number of page table allocations in the virtual TLB.";
        Release 39 LOGICAL_PROCESSOR_MIGRATIONS "Logical processor migrations/sec", Count, Rate,
            By(PerfSoftware(PerfSoftwareEvent::CpuMigrations), "cpu-migrations of the VP thread"),
            observed By(PerfSoftware(PerfSoftwareEvent::CpuMigrations), "the vCPU thread's migrations from its start (the kernel's se.nr_migrations, read by the task iterator: source thread-iter); where the iterator cannot be loaded, a cpu-migrations perf counter on the thread, from attach (source thread-clock)"),
            "The total number of migrations by the virtual processor to a different logical processor.";
        Release 40 ADDRESS_SPACE_EVICTIONS "Address space evictions/sec", Count, Rate,
            No(NO_VTLB),
            "The total number of address space evictions in the virtual TLB.";
        Release 41 ADDRESS_SPACE_SWITCHES "Address space switches/sec", Count, Rate,
            No(NO_VTLB),
            "The total number of address space switches by guest code on the virtual processor.";
        Release 42 ADDRESS_DOMAIN_FLUSHES "Address domain flushes/sec", Count, Rate,
            No("hvstats implements no virtual TLB flush hypercalls"),
            observed By(KvmHv(KvmHv::Flushes(HypercallEffect::AddressSpaceFlush, true)), "kvm:kvm_hv_flush_tlb/_ex records of HvCallFlushVirtualAddressSpace(Ex) with HV_FLUSH_ALL_VIRTUAL_ADDRESS_SPACES: one per call, the code and rep count taken from the kvm:kvm_hv_hypercall record before it on the vCPU thread, counted in the kernel from attach (not counted by perf counters)"),
            "The total number of explicit flushes of the virtual TLB by guest code on the virtual processor.";
        Release 43 ADDRESS_SPACE_FLUSHES "Address space flushes/sec", Count, Rate,
            No("hvstats implements no virtual TLB flush hypercalls"),
            observed By(KvmHv(KvmHv::Flushes(HypercallEffect::AddressSpaceFlush, false)), "kvm:kvm_hv_flush_tlb/_ex records of HvCallFlushVirtualAddressSpace(Ex) of one address space: one per call, the code and rep count taken from the kvm:kvm_hv_hypercall record before it on the vCPU thread, counted in the kernel from attach (not counted by perf counters)"),
            "The total number of explicit flushes of one address space by guest code on the virtual processor.";
        Release 44 GLOBAL_GVA_RANGE_FLUSHES "Global GVA range flushes/sec", Count, Rate,
            No("hvstats implements no virtual TLB flush hypercalls"),
            observed By(KvmHv(KvmHv::Flushes(HypercallEffect::GvaRangeFlush, true)), "kvm:kvm_hv_flush_tlb/_ex records of HvCallFlushVirtualAddressList(Ex) with HV_FLUSH_ALL_VIRTUAL_ADDRESS_SPACES: the call's rep count (its GVA ranges), the code and rep count taken from the kvm:kvm_hv_hypercall record before it on the vCPU thread, counted in the kernel from attach (not counted by perf counters)"),
            "The total number of explicit flushes of a virtual address range in all address spaces by guest code on the virtual processor.";
        Release 45 LOCAL_FLUSHED_GVA_RANGES "Local flushed GVA ranges/sec", Count, Rate,
            No("hvstats implements no virtual TLB flush hypercalls"),
            observed By(KvmHv(KvmHv::Flushes(HypercallEffect::GvaRangeFlush, false)), "kvm:kvm_hv_flush_tlb/_ex records of HvCallFlushVirtualAddressList(Ex) of one address space: the call's rep count (its GVA ranges), the code and rep count taken from the kvm:kvm_hv_hypercall record before it on the vCPU thread, counted in the kernel from attach (not counted by perf counters)"),
            "The total number of explicit flushes of a virtual address range in one address space by guest code on the virtual processor.";
        Release 46 PAGE_TABLE_EVICTIONS "Page table evictions/sec", Count, Rate,
            No(NO_VTLB),
            "The total number of page table evictions in the virtual TLB.";
        Release 47 PAGE_TABLE_RECLAMATIONS "Page table reclamations/sec", Count, Rate,
            No(NO_VTLB),
            "The total number of reclamations of unreferenced page tables in the virtual TLB.";
        Release 48 PAGE_TABLE_RESETS "Page table resets/sec", Count, Rate,
            No(NO_VTLB),
            "The total number of page table resets In the virtual TLB.";
        Release 49 PAGE_TABLE_VALIDATIONS "Page table validations/sec", Count, Rate,
            No(NO_VTLB),
            "The total number of page table validations to remove state entries in the virtual TLB.";
        Release 50 APIC_TPR_ACCESSES "APIC TPR accesses/sec", Count, Rate,
            By(Tracepoint(Tp::ApicTpr), "kvm:kvm_mmio accesses of the APIC TPR register, plus kvm:kvm_msr accesses of x2APIC MSR 0x808"),
            "The total number of APIC TPR accesses by guest code on the virtual processor.";
        Release 51 PAGE_TABLE_WRITE_INTERCEPTS "Page table write intercepts/sec", Count, Rate,
            No("KVM counts shadow page table writes per VM (mmu_pte_write), not per VP"),
            "The total number of write intercepts on guest page tables by guest code on the virtual processor.";
        Release 52 SYNTHETIC_INTERRUPTS "Synthetic interrupts/sec", Count, Rate,
            No("hvstats implements no synthetic interrupt controller"),
            observed By(KvmHv(KvmHv::SyntheticInterrupts), "kvm:kvm_hv_synic_set_irq records: every SINT KVM's SynIC asserts on the vCPU (messages, event flags, synthetic timers not in direct mode), counted on the vCPU thread"),
            "The total number of synthetic interrupts delivered to the virtual processor.";
        Release 53 VIRTUAL_INTERRUPTS "Virtual interrupts/sec", Count, Rate,
            By(KvmStats(KvmStat::Vcpu(&["irq_injections"])), "vCPU stat irq_injections (an injection cancelled before VM entry counts again)"),
            "The total number of interrupts (including synthetic interrupts) delivered to the virtual processor.";
        Release 54 APIC_IPIS_SENT "APIC IPIs sent/sec", Count, Rate,
            By(Tracepoint(Tp::ApicIpi), "kvm:kvm_apic_ipi"),
            "The total number of APIC inter-processor interrupts (including to self) sent to the virtual processor.";
        Release 55 APIC_SELF_IPIS_SENT "APIC self IPIs sent/sec", Count, Rate,
            By(Tracepoint(Tp::ApicSelfIpi), "kvm:kvm_apic_ipi filtered on the self destination shorthand"),
            "The total number of APIC interrupts sent by the virtual processor to itself.";
        Release 56 GPA_SPACE_HYPERCALLS "GPA space hypercalls/sec", Count, Rate,
            By(Hypercall(Hc::GpaSpace), "hypercalls of the GPA space class (map and unmap stats page)"),
            "The total number of guest physical address space hypercalls made by guest code on the virtual processor.";
        Release 57 LOGICAL_PROCESSOR_HYPERCALLS "Logical processor hypercalls/sec", Count, Rate,
            By(Hypercall(Hc::LogicalProcessor), "hypercalls of the logical processor class"),
            "The total number of logical processor hypercalls made by guest code on the virtual processor.";
        Release 58 LONG_SPIN_WAIT_HYPERCALLS "Long spin wait hypercalls/sec", Count, Rate,
            By(Hypercall(Hc::LongSpinWait), "HvCallNotifyLongSpinWait"),
            "The total number of long spin wait hypercalls made by guest code on the virtual processor.";
        Release 59 OTHER_HYPERCALLS "Other hypercalls/sec", Count, Rate,
            By(Hypercall(Hc::Other), "hypercalls of no other class, unknown codes included"),
            "The total number of other hypercalls made by guest code on the virtual processor.";
        Release 60 SYNTHETIC_INTERRUPT_HYPERCALLS "Synthetic interrupt hypercalls/sec", Count, Rate,
            By(Hypercall(Hc::SyntheticInterrupt), "hypercalls of the synthetic interrupt class"),
            "The total number of Synthetic Interrupt hypercalls made by guest code on the virtual processor.";
        Release 61 VIRTUAL_INTERRUPT_HYPERCALLS "Virtual interrupt hypercalls/sec", Count, Rate,
            By(Hypercall(Hc::VirtualInterrupt), "hypercalls of the virtual interrupt class"),
            "The total number of Virtual Interrupt hypercalls made by guest code on the virtual processor.";
        Release 62 VIRTUAL_MMU_HYPERCALLS "Virtual MMU hypercalls/sec", Count, Rate,
            By(Hypercall(Hc::VirtualMmu), "hypercalls of the virtual MMU class"),
            "The total number of Virtual MMU hypercalls made by guest code on the virtual processor.";
        Release 63 VIRTUAL_PROCESSOR_HYPERCALLS "Virtual processor hypercalls/sec", Count, Rate,
            By(Hypercall(Hc::VirtualProcessor), "hypercalls of the virtual processor class"),
            "The total number of Virtual Processor hypercalls made by guest code on the virtual processor.";
        // Release 1.1 (see APPENDED): the VP thread's wait for a CPU, from its schedstat.
        Release 64 DISPATCHES "Dispatches/sec", Count, Rate,
            By(ThreadTime(ThreadTime::Dispatches), "schedstat of the VP thread: the times it was put on a CPU"),
            "The total number of times the virtual processor was dispatched to run on a logical processor.";
        Release 65 CPU_WAIT_TIME_PER_DISPATCH "CPU wait time per dispatch", Nanoseconds, Cost,
            By(ThreadTime(ThreadTime::CpuWait), "schedstat of the VP thread: time runnable on a run queue, waiting for a CPU"),
            "The average time (in nanoseconds) the virtual processor waited for a logical processor to run on, per dispatch; as a share of elapsed time, the time it was ready but not running.";
        // Release 1.2 (see APPENDED): faults of the second-level translation, which Hyper-V counts
        // apart from the guest's own page faults (its NestedPageFaultIntercepts, WHv's
        // NestedPageFault intercept pair).
        Release 66 NESTED_PAGE_FAULT_INTERCEPTS "Nested page fault intercepts/sec", Count, Rate,
            By(KvmStats(KvmStat::Vcpu(&["pf_taken"])), "vCPU stat pf_taken: the faults KVM's MMU takes, under EPT/NPT the EPT violations and NPFs it does not resolve as MMIO; stays 0 under KVM's instruction emulator"),
            "The total number of nested page fault intercepts (faults of the second-level address translation: EPT violations and misconfigurations, NPT faults) taken by guest code on the virtual processor.";
        Release 67 NESTED_PAGE_FAULT_INTERCEPTS_COST "Nested page fault intercepts cost", Time100ns, Cost,
            No(NO_TIME),
            "The average time (in nanoseconds) spent processing a nested page fault intercept.";
        // hvstats' own group: skipped by TLFS readers.
        Hvstats 1 SEQUENCE "Sequence", Count, Instant,
            By(Authority, "made odd before and even after every merge of kernel counters into the page"),
            "Odd while counters are merged into the page: a reader that finds it even and unchanged around its copy has every counter from one moment.";
        Hvstats 2 HYPERCALLS_TIME_HISTOGRAM "Hypercall time histogram", Nanoseconds, Histogram,
            By(RunLoop(Loop::HypercallsHistogram), "each hypercall's time, from its exit to the next entry into the guest"),
            "The distribution of the time (in nanoseconds) spent processing a hypercall.";
        Hvstats 35 IO_TIME_HISTOGRAM "IO intercept time histogram", Nanoseconds, Histogram,
            By(RunLoop(Loop::IoHistogram), "each port access handled in userspace"),
            "The distribution of the time (in nanoseconds) spent processing an IO intercept in the parent.";
        Hvstats 68 MSR_TIME_HISTOGRAM "MSR intercept time histogram", Nanoseconds, Histogram,
            By(RunLoop(Loop::MsrHistogram), "each MSR access handled in userspace"),
            "The distribution of the time (in nanoseconds) spent processing an MSR intercept in the parent.";
        Hvstats 101 MEMORY_TIME_HISTOGRAM "Memory intercept time histogram", Nanoseconds, Histogram,
            By(RunLoop(Loop::MmioHistogram), "each MMIO access handled in userspace"),
            "The distribution of the time (in nanoseconds) spent processing a memory intercept in the parent.";
        Hvstats 134 OTHER_TIME_HISTOGRAM "Other intercept time histogram", Nanoseconds, Histogram,
            By(RunLoop(Loop::OtherHistogram), "each userspace exit other than port I/O, MMIO, MSR and hypercalls"),
            "The distribution of the time (in nanoseconds) spent processing other intercepts in the parent.";
        Hvstats 167 HALT_WAIT_HISTOGRAM "Halt wait histogram", Nanoseconds, Histogram,
            By(KvmStats(KvmStat::Vcpu(&["halt_wait_ns", "halt_wait_hist"])), "vCPU stats halt_wait_ns (the sum) and halt_wait_hist (the buckets)"),
            "The distribution of the time (in nanoseconds) a halted virtual processor waited, blocked, for a wake-up.";
        Hvstats 200 HALT_POLL_SUCCESS_HISTOGRAM "Halt poll success histogram", Nanoseconds, Histogram,
            By(KvmStats(KvmStat::Vcpu(&["halt_poll_success_ns", "halt_poll_success_hist"])), "vCPU stats halt_poll_success_ns and halt_poll_success_hist"),
            "The distribution of the time (in nanoseconds) a halted virtual processor polled before a wake-up came.";
        Hvstats 233 HALT_POLL_FAIL_HISTOGRAM "Halt poll fail histogram", Nanoseconds, Histogram,
            By(KvmStats(KvmStat::Vcpu(&["halt_poll_fail_ns", "halt_poll_fail_hist"])), "vCPU stats halt_poll_fail_ns and halt_poll_fail_hist"),
            "The distribution of the time (in nanoseconds) a halted virtual processor polled in vain before blocking.";
        Hvstats 266 HOST_PAGE_FAULTS "Host page faults/sec", Count, Rate,
            By(HostFaults(HostFault::All), "minflt + majflt of the VP thread since it began running the guest"),
            observed By(HostFaults(HostFault::All), "minflt + majflt of the vCPU thread since the observer found it"),
            "The total number of page faults the host took on the virtual processor's thread: guest memory touched for the first time, reclaimed or swapped out, and the VMM's own memory on that thread.";
        Hvstats 267 HOST_MAJOR_PAGE_FAULTS "Host major page faults/sec", Count, Rate,
            By(HostFaults(HostFault::Major), "majflt of the VP thread since it began running the guest"),
            observed By(HostFaults(HostFault::Major), "majflt of the vCPU thread since the observer found it"),
            "The total number of page faults on the virtual processor's thread that waited for I/O: guest memory swapped out or backed by a file, during which the virtual processor did not run.";
        // hvstats 1.2 (see APPENDED): every exit of the VP, whatever its reason.
        Hvstats 268 EXITS "Exits/sec", Count, Rate,
            By(KvmStats(KvmStat::Vcpu(&["exits"])), "vCPU stat exits: every exit from the guest on VMX/SVM hosts (userspace exits and halts under KVM's instruction emulator)"),
            "The total number of exits from guest code on the virtual processor to the hypervisor, of every reason: the total the intercept classes break down (an exit of a class no counter has is counted here too).";
        // hvstats 1.3 (see APPENDED): hypercalls that failed.
        Hvstats 269 FAILED_HYPERCALLS "Failed hypercalls/sec", Count, Rate,
            By(RunLoop(Loop::FailedHypercalls), "hypercalls the handler answered with a status other than HV_STATUS_SUCCESS"),
            observed By(KvmHv(KvmHv::FailedHypercalls), "kvm:kvm_hv_hypercall_done records whose result's status (bits 15:0) is not HV_STATUS_SUCCESS"),
            "The total number of hypercalls made by guest code on the virtual processor that returned a status other than success.";
        // hvstats 1.4 (see APPENDED): when the counts the page holds were taken.
        Hvstats 270 PUBLISHED "Published", Nanoseconds, Instant,
            By(Authority, "CLOCK_MONOTONIC (system-wide, immune to wall-clock steps) of each full refresh, written under the sequence counter with the counts it took; 0: never"),
            "When the publisher took the counts the page holds, in nanoseconds of the host's monotonic clock (CLOCK_MONOTONIC): a reader divides the change of a count between two readings by the change of this time, so its rates are true at any interval, and two readings with the same time hold the same publication (no rate between them). 0 until the first refresh.";
    }
}

impl CounterId {
    /// The catalog row of this counter, if it is in the catalog.
    pub const fn counter(self) -> Option<&'static Counter> {
        let mut i = 0;
        while i < CATALOG.len() {
            let c = &CATALOG[i];
            if c.id.kind as u8 == self.kind as u8
                && c.id.group as u8 == self.group as u8
                && c.id.index == self.index
            {
                return Some(c);
            }
            i += 1;
        }
        None
    }
}

impl Counter {
    /// For a cost counter, the count it is averaged over (the previous index of its group).
    pub fn paired_count(&self) -> Option<&'static Counter> {
        if self.presentation != Presentation::Cost {
            return None;
        }
        CounterId { index: self.id.index.checked_sub(1)?, ..self.id }.counter()
    }
}

impl Counter {
    /// True for the reader's bookkeeping rather than a measurement: the rows of hvstats' own
    /// group that the authority writes about the page itself (the sequence counter of consistent
    /// reads). Surfaces that show measurements leave them out; hvstats' own measurements (the
    /// histograms, the host's page faults) are shown.
    ///
    /// ```
    /// use hvstats_abi::catalog::vp;
    ///
    /// assert!(vp::SEQUENCE.counter().unwrap().is_bookkeeping());
    /// assert!(!vp::HOST_PAGE_FAULTS.counter().unwrap().is_bookkeeping());
    /// assert!(!vp::CPUID_INSTRUCTIONS.counter().unwrap().is_bookkeeping());
    /// ```
    pub const fn is_bookkeeping(&self) -> bool {
        matches!(self.id.group, GroupKind::Hvstats)
            && matches!(self.maintained, Maintained::By(Source::Authority, _))
    }

    /// True when some source maintains the counter: for our own partitions (`maintained`) or
    /// for observed VMs ([`observed`]). Surfaces export and show exactly these; a partition
    /// whose sources do not give one declares it unavailable, so it reads as absent there.
    ///
    /// ```
    /// use hvstats_abi::catalog::vp;
    ///
    /// // Our own partitions count no synthetic interrupts; observed VMs' come from kvm_hv.
    /// let synic = vp::SYNTHETIC_INTERRUPTS.counter().unwrap();
    /// assert!(!synic.maintained.is_maintained());
    /// assert!(synic.is_maintained_anywhere());
    /// assert!(vp::CPUID_INSTRUCTIONS.counter().unwrap().is_maintained_anywhere());
    /// assert!(!vp::EMULATED_INSTRUCTIONS_COST.counter().unwrap().is_maintained_anywhere());
    /// ```
    pub const fn is_maintained_anywhere(&self) -> bool {
        self.maintained.is_maintained() || matches!(observed(self), Some(Maintained::By(..)))
    }

    /// True for the time a VP spent halted: the seed's "HLT instructions cost", which KVM's
    /// statistics (`halt_wait_ns` and the halt poll times) fill with the time the vCPU was
    /// halted, waiting or polling for a wake-up, rather than time spent handling HLTs. Readers
    /// show it per VP as a share of the time ("time halted"), never as an average per HLT (a
    /// vCPU halted throughout an interval made no HLT in it), and never add one VP's to
    /// another's count of HLTs.
    ///
    /// ```
    /// use hvstats_abi::catalog::vp;
    ///
    /// assert!(vp::HLT_INSTRUCTIONS_COST.counter().unwrap().is_time_halted());
    /// assert!(!vp::IO_INSTRUCTIONS_COST.counter().unwrap().is_time_halted());
    /// ```
    pub const fn is_time_halted(&self) -> bool {
        let halted = vp::HLT_INSTRUCTIONS_COST;
        self.id.kind as u8 == halted.kind as u8
            && self.id.group as u8 == halted.group as u8
            && self.id.index == halted.index
    }

    /// True for a moment in time rather than a duration: a time counter whose value is a Unix
    /// time (the observer's last refresh). Readers show it as a time of day, in UTC.
    ///
    /// ```
    /// use hvstats_abi::catalog::{hypervisor, lp};
    ///
    /// assert!(hypervisor::OBSERVER_LAST_REFRESH.counter().unwrap().is_timestamp());
    /// assert!(!lp::GLOBAL_TIME.counter().unwrap().is_timestamp());
    /// ```
    pub fn is_timestamp(&self) -> bool {
        matches!(self.unit, Unit::Time100ns | Unit::Nanoseconds) && self.name.ends_with(" timestamp")
    }

    /// The page slots the counter's value spans: [`HISTOGRAM_SLOTS`] for a histogram, else 1.
    pub const fn slots(&self) -> usize {
        match self.presentation {
            Presentation::Histogram => HISTOGRAM_SLOTS,
            _ => 1,
        }
    }

    /// For a count, the cost counter averaged over it (the next index of its group), if any.
    pub fn cost(&self) -> Option<&'static Counter> {
        let next = CounterId { index: self.id.index.checked_add(1)?, ..self.id }.counter()?;
        (next.presentation == Presentation::Cost).then_some(next)
    }
}

/// The counters of one object kind, in page order.
pub fn counters_of(kind: ObjectKind) -> impl Iterator<Item = &'static Counter> {
    CATALOG.iter().filter(move |c| c.id.kind == kind)
}

/// Looks a counter up by object kind and its catalog name.
///
/// ```
/// use hvstats_abi::catalog::{counter_by_name, vp};
/// use hvstats_abi::{ObjectKind, Unit};
///
/// let c = counter_by_name(ObjectKind::Vp, "CPUID instructions/sec").unwrap();
/// assert_eq!(c.id, vp::CPUID_INSTRUCTIONS);
/// assert_eq!(c.unit, Unit::Count);
/// assert_eq!(c.maintained.source().map(|s| s.name()), Some("tracepoint"));
/// assert_eq!(vp::CPUID_INSTRUCTIONS.counter(), Some(c));
/// assert!(counter_by_name(ObjectKind::Partition, "CPUID instructions/sec").is_none());
/// ```
pub fn counter_by_name(kind: ObjectKind, name: &str) -> Option<&'static Counter> {
    counters_of(kind).find(|c| c.name == name)
}

/// A counter appended to a group after 1.0 (seed 004): from `first_index` on, the group's counters
/// on `kind`'s page arrived in version 1.`minor`, and a reader compiled for an earlier minor does
/// not know them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    /// The object kind whose page has the group.
    pub kind: ObjectKind,
    /// The group.
    pub group: GroupKind,
    /// The minor version that appended the counters.
    pub minor: u16,
    /// The index of the first counter it appended.
    pub first_index: u16,
}

/// Every minor version of a group past 1.0, oldest first per group.
pub const APPENDED: &[Appended] = &[
    // hvstats 1.1 of the hypervisor page: the VMs an observer refuses, by reason.
    Appended { kind: ObjectKind::Hypervisor, group: GroupKind::Hvstats, minor: 1, first_index: 6 },
    // Release 1.1 of the VP page: dispatches and CPU wait time.
    Appended { kind: ObjectKind::Vp, group: GroupKind::Release, minor: 1, first_index: 64 },
    // Release 1.2 of the VP page: nested page fault intercepts and their time.
    Appended { kind: ObjectKind::Vp, group: GroupKind::Release, minor: 2, first_index: 66 },
    // hvstats 1.1 of the VP page: the host's page faults on the VP thread.
    Appended { kind: ObjectKind::Vp, group: GroupKind::Hvstats, minor: 1, first_index: 266 },
    // hvstats 1.2 of the VP page: every exit of the VP.
    Appended { kind: ObjectKind::Vp, group: GroupKind::Hvstats, minor: 2, first_index: 268 },
    // hvstats 1.3 of the VP page: failed hypercalls.
    Appended { kind: ObjectKind::Vp, group: GroupKind::Hvstats, minor: 3, first_index: 269 },
    // hvstats 1.4 of the VP page: when the counts the page holds were taken.
    Appended { kind: ObjectKind::Vp, group: GroupKind::Hvstats, minor: 4, first_index: 270 },
    // hvstats 1.1 of the partition page: the VM's run state.
    Appended { kind: ObjectKind::Partition, group: GroupKind::Hvstats, minor: 1, first_index: 30 },
    // hvstats 1.2 of the partition page: sources 7 to 15 of an observed VM.
    Appended { kind: ObjectKind::Partition, group: GroupKind::Hvstats, minor: 2, first_index: 31 },
    // hvstats 1.3 of the partition page: from when its counters count.
    Appended { kind: ObjectKind::Partition, group: GroupKind::Hvstats, minor: 3, first_index: 58 },
    // hvstats 1.4 of the partition page: from when the counts kept across observers count.
    Appended { kind: ObjectKind::Partition, group: GroupKind::Hvstats, minor: 4, first_index: 60 },
];

impl CounterId {
    /// The minor version of its group that introduced this counter: 0 for a counter of the
    /// group's 1.0, else the [`APPENDED`] entry that appended it. A page whose group has an
    /// older minor does not carry the counter.
    ///
    /// ```
    /// use hvstats_abi::catalog::vp;
    ///
    /// assert_eq!(vp::HYPERCALLS.introduced_in(), 0);
    /// assert_eq!(vp::DISPATCHES.introduced_in(), 1);
    /// ```
    pub const fn introduced_in(self) -> u16 {
        let mut minor = 0;
        let mut i = 0;
        while i < APPENDED.len() {
            let a = &APPENDED[i];
            if a.kind as u8 == self.kind as u8
                && a.group as u8 == self.group as u8
                && self.index >= a.first_index
                && a.minor > minor
            {
                minor = a.minor;
            }
            i += 1;
        }
        minor
    }
}

/// The number of counters (64-bit values) of `group` on `kind`'s page that a reader compiled for
/// minor version `minor` knows: the whole group for the current minor, fewer for an older one.
pub const fn counters_at(kind: ObjectKind, group: GroupKind, minor: u16) -> usize {
    let mut known = count_group(kind, group);
    let mut i = 0;
    while i < APPENDED.len() {
        let a = &APPENDED[i];
        if a.kind as u8 == kind as u8
            && a.group as u8 == group as u8
            && a.minor > minor
            && (a.first_index as usize) <= known
        {
            known = a.first_index as usize - 1;
        }
        i += 1;
    }
    known
}

/// [`group_counters`] computed by scanning the catalog (for the compile-time page layouts).
pub(crate) const fn count_group(kind: ObjectKind, group: GroupKind) -> usize {
    let mut max = 0;
    let mut i = 0;
    while i < CATALOG.len() {
        let id = CATALOG[i].id;
        let last = id.index as usize + CATALOG[i].slots() - 1;
        if id.kind as u8 == kind as u8 && id.group as u8 == group as u8 && last > max {
            max = last;
        }
        i += 1;
    }
    max
}

impl GroupKind {
    /// The version of this group on `kind`'s page that hvstats writes and, as a reader, is
    /// compiled for: 1.0, with the minor raised once for each [`APPENDED`] entry of the group.
    pub const fn version(self, kind: ObjectKind) -> GroupVersion {
        let mut minor = 0;
        let mut i = 0;
        while i < APPENDED.len() {
            let a = &APPENDED[i];
            if a.kind as u8 == kind as u8 && a.group as u8 == self as u8 && a.minor > minor {
                minor = a.minor;
            }
            i += 1;
        }
        GroupVersion { major: 1, minor }
    }
}

impl RunLoopCount {
    /// The counter the catalog gives this count.
    ///
    /// # Panics
    /// When no catalog row is maintained by it; in a constant (as the run loop uses it) that is a
    /// compile error, so a run-loop count cannot lose its counter unnoticed.
    pub const fn counter(self) -> CounterId {
        let mut i = 0;
        while i < CATALOG.len() {
            if let Some(Source::RunLoop(k)) = CATALOG[i].maintained.source()
                && k as u8 == self as u8
            {
                return CATALOG[i].id;
            }
            i += 1;
        }
        panic!("a run-loop count without a catalog row")
    }
}

/// The number of counters of `object` maintained by a source of `kind`.
pub const fn maintained_count(object: ObjectKind, kind: SourceKind) -> usize {
    let mut n = 0;
    let mut i = 0;
    while i < CATALOG.len() {
        if is_of(&CATALOG[i], object, kind) {
            n += 1;
        }
        i += 1;
    }
    n
}

/// The counters of `object` maintained by a source of `kind`, in catalog order; `N` is
/// [`maintained_count`] of the same arguments.
///
/// ```
/// use hvstats_abi::ObjectKind;
/// use hvstats_abi::catalog::{maintained_by, maintained_count};
/// use hvstats_abi::source::{Source, SourceKind, Tracepoint};
///
/// const N: usize = maintained_count(ObjectKind::Vp, SourceKind::Tracepoint);
/// const FROM_TRACEPOINTS: [&hvstats_abi::Counter; N] = maintained_by(ObjectKind::Vp, SourceKind::Tracepoint);
/// let cpuid = FROM_TRACEPOINTS.iter().find(|c| c.maintained.source() == Some(Source::Tracepoint(Tracepoint::Cpuid)));
/// assert_eq!(cpuid.unwrap().name, "CPUID instructions/sec");
/// ```
///
/// # Panics
/// When `N` is not that count (in a constant: a compile error).
pub const fn maintained_by<const N: usize>(object: ObjectKind, kind: SourceKind) -> [&'static Counter; N] {
    let mut out = [&CATALOG[0]; N];
    let mut n = 0;
    let mut i = 0;
    while i < CATALOG.len() {
        if is_of(&CATALOG[i], object, kind) {
            assert!(n < N, "more counters of this source than N");
            out[n] = &CATALOG[i];
            n += 1;
        }
        i += 1;
    }
    assert!(n == N, "fewer counters of this source than N");
    out
}

const fn is_of(c: &Counter, object: ObjectKind, kind: SourceKind) -> bool {
    match c.maintained.source() {
        Some(s) => c.id.kind as u8 == object as u8 && s.kind() as u8 == kind as u8,
        None => false,
    }
}

/// The VP counter the catalog gives hypercalls of `class`.
///
/// ```
/// use hvstats_abi::catalog::vp;
/// use hvstats_abi::hypercall::HypercallClass;
/// use hvstats_abi::catalog::hypercall_class_counter;
/// assert_eq!(hypercall_class_counter(HypercallClass::GpaSpace), Some(vp::GPA_SPACE_HYPERCALLS));
/// ```
pub const fn hypercall_class_counter(class: HypercallClass) -> Option<CounterId> {
    let mut i = 0;
    while i < CATALOG.len() {
        if let Some(Source::Hypercall(c)) = CATALOG[i].maintained.source()
            && c as u8 == class as u8
        {
            return Some(CATALOG[i].id);
        }
        i += 1;
    }
    None
}

impl InterceptClass {
    /// The VP counter the class is counted in.
    pub const fn counter(self) -> CounterId {
        match self {
            InterceptClass::PageInvalidation => vp::PAGE_INVALIDATIONS,
            InterceptClass::ControlRegister => vp::CONTROL_REGISTER_ACCESSES,
            InterceptClass::Io => vp::IO_INSTRUCTIONS,
            InterceptClass::Halt => vp::HLT_INSTRUCTIONS,
            InterceptClass::Mwait => vp::MWAIT_INSTRUCTIONS,
            InterceptClass::Cpuid => vp::CPUID_INSTRUCTIONS,
            InterceptClass::Msr => vp::MSR_ACCESSES,
            InterceptClass::ExternalInterrupt => vp::EXTERNAL_INTERRUPTS,
            InterceptClass::PendingInterrupt => vp::PENDING_INTERRUPTS,
            InterceptClass::DebugRegister => vp::DEBUG_REGISTER_ACCESSES,
            InterceptClass::PageFault => vp::PAGE_FAULT_INTERCEPTS,
            InterceptClass::NestedPageFault => vp::NESTED_PAGE_FAULT_INTERCEPTS,
            InterceptClass::ApicAccess => vp::APIC_MMIO_ACCESSES,
            InterceptClass::ApicEoi => vp::APIC_EOI_ACCESSES,
            InterceptClass::ApicTpr => vp::APIC_TPR_ACCESSES,
            InterceptClass::Hypercall => vp::HYPERCALLS,
            InterceptClass::Other => vp::OTHER_INTERCEPTS,
            InterceptClass::Emulated => vp::EMULATED_INSTRUCTIONS,
        }
    }

    /// The VP counter of the class's time (the cost counter after its count), where the catalog
    /// has one.
    pub fn cost(self) -> Option<CounterId> {
        self.counter().counter()?.cost().map(|c| c.id)
    }
}

impl Tracepoint {
    /// True when our own VPs count it: a source of a catalog row for our partitions, a part
    /// [`added`](Self::added) to one, or the WHv exception count.
    pub fn counted_for_partitions(self) -> bool {
        self == Tracepoint::InjException
            || CATALOG.iter().any(|c| match c.maintained.source() {
                Some(Source::Tracepoint(tp)) => tp == self || tp.added().contains(&self),
                _ => false,
            })
    }

    /// True when the observer counts it on a VMM's threads: a source of a catalog row for observed
    /// VMs, a part [`added`](Self::added) to one, or the VMM's MSR exits.
    pub const fn counted_for_observed(self) -> bool {
        COUNTED_FOR_OBSERVED[self.index()]
    }
}

const OBSERVED_NO_TIME: &str = "the VMM's exit handling is not visible from outside: no per-intercept time";
const OBSERVED_HYPERCALL_CLASS: &str = "kvm:kvm_hv_hypercall records whose code the hypercall table \
     (docs/hyperv-hypercalls.md) puts in this class, counted on the vCPU thread from attach (in the kernel, or by \
     perf counters filtered on the codes): the Hyper-V hypercalls of an enlightened guest (a VM's \
     hyperv_enlightenments says whether it is one)";
const OBSERVED_NO_VTLB: &str = "KVM has no virtual TLB";
const NO_OUTSIDE: &str = "no source outside the VMM process gives it";
const OBSERVED_KVM_STAT: &str = "the same KVM statistic, counted from the vCPU's creation, from the first of the VM's \
     sources that carry KVM's statistics: the VMM's open stats descriptors (stats-fd), libvirt's domain statistics \
     (libvirt), QEMU's QMP (qmp); where none does, an intercept class is counted from kvm:kvm_exit by reason on \
     VMX/SVM hosts, from attach";
const OBSERVED_KVM_TIME: &str = "the same KVM statistics, counted from the vCPU's creation, from the first of the VM's \
     sources that carry KVM's statistics (stats-fd, libvirt, qmp); where none does, the time from kvm:kvm_exit to \
     the next kvm:kvm_entry on VMX/SVM hosts, from attach";

/// The intercept class whose time the cost counter `id` is: the class counted at the index
/// before it.
const fn class_timed(id: CounterId) -> Option<InterceptClass> {
    if id.index == 0 {
        return None;
    }
    let mut i = 0;
    while i < InterceptClass::EXITS.len() {
        let class = InterceptClass::EXITS[i];
        let count = class.counter();
        if count.kind as u8 == id.kind as u8
            && count.group as u8 == id.group as u8
            && count.index + 1 == id.index
        {
            return Some(class);
        }
        i += 1;
    }
    None
}

const OBSERVED_EXIT_TIME: &str = "time from kvm:kvm_exit of the class to the next kvm:kvm_entry, timed in the \
     kernel, on VMX/SVM hosts only (it includes the VMM's handling of exits to userspace)";

/// How the observer maintains `counter` for a VM hvstats did not start; `None` for the
/// hypervisor and LP objects, which the observer's instance keeps as any instance does.
///
/// The row's observed key when it has one (`observed` in the catalog), else its own key where
/// the observer reads the same thing from outside the VMM: a KVM tracepoint on the vCPU thread,
/// a count from KVM's vCPU or VM statistics (through QEMU's QMP), the vCPU thread's times and
/// migrations; an intercept class's cost, timed in the kernel from `kvm_exit` to `kvm_entry`
/// (VMX/SVM hosts). Everything else the VMM itself does (its hypercall classes, its memory
/// slots, its emulation) is not available, and says why.
///
/// ```
/// use hvstats_abi::catalog::{Maintained, observed, vp};
/// use hvstats_abi::exit_reason::InterceptClass;
/// use hvstats_abi::source::{Source, Tracepoint};
/// let cpuid = vp::CPUID_INSTRUCTIONS.counter().unwrap();
/// assert_eq!(observed(cpuid).and_then(Maintained::source), Some(Source::Tracepoint(Tracepoint::Cpuid)));
/// let io_cost = vp::IO_INSTRUCTIONS_COST.counter().unwrap();
/// assert_eq!(observed(io_cost).and_then(Maintained::source), Some(Source::KvmExitTime(InterceptClass::Io)));
/// let emulated_cost = vp::EMULATED_INSTRUCTIONS_COST.counter().unwrap();
/// assert!(!observed(emulated_cost).unwrap().is_maintained());
/// ```
pub const fn observed(counter: &Counter) -> Option<Maintained> {
    // The observer asks this of every counter of every VM at every refresh: the catalog's rows
    // have their answers worked out once, at compile time.
    match row(counter.id) {
        Some(i) => OBSERVED[i],
        None => observed_of(counter),
    }
}

/// Every row's answer of [`observed`], in catalog order. Tables indexed at run time are `static`:
/// a `const` array is built anew on the stack at each use.
static OBSERVED: [Option<Maintained>; CATALOG.len()] = {
    let mut table = [None; CATALOG.len()];
    let mut i = 0;
    while i < CATALOG.len() {
        table[i] = observed_of(&CATALOG[i]);
        i += 1;
    }
    table
};

/// Each tracepoint's answer of [`Tracepoint::counted_for_observed`], by index.
static COUNTED_FOR_OBSERVED: [bool; Tracepoint::ALL.len()] = {
    let mut table = [false; Tracepoint::ALL.len()];
    table[Tracepoint::UserspaceMsr.index()] = true;
    let mut i = 0;
    while i < CATALOG.len() {
        if let Some(Maintained::By(Source::Tracepoint(tp), _)) = OBSERVED[i] {
            table[tp.index()] = true;
            let added = tp.added();
            let mut a = 0;
            while a < added.len() {
                table[added[a].index()] = true;
                a += 1;
            }
        }
        i += 1;
    }
    table
};

/// The highest index a catalog row has in its group, plus one.
pub(crate) const INDICES: usize = {
    let mut max = 0;
    let mut i = 0;
    while i < CATALOG.len() {
        if CATALOG[i].id.index as usize >= max {
            max = CATALOG[i].id.index as usize + 1;
        }
        i += 1;
    }
    max
};

/// The catalog row of each (kind, group, index), plus one (0: not in the catalog).
static ROWS: [[[u8; INDICES]; 3]; 4] = {
    assert!(CATALOG.len() < u8::MAX as usize, "row numbers fit a byte");
    let mut table = [[[0u8; INDICES]; 3]; 4];
    let mut i = 0;
    while i < CATALOG.len() {
        let id = CATALOG[i].id;
        table[id.kind as usize][id.group as usize][id.index as usize] = (i + 1) as u8;
        i += 1;
    }
    table
};

/// The position of `id`'s row in [`CATALOG`], if it has one.
pub(crate) const fn row(id: CounterId) -> Option<usize> {
    let (kind, group, index) = (id.kind as usize, id.group as usize, id.index as usize);
    if kind >= ROWS.len() || group >= ROWS[0].len() || index >= INDICES {
        return None;
    }
    match ROWS[kind][group][index] {
        0 => None,
        at => Some(at as usize - 1),
    }
}

/// The position of `id` among its kind's counters, in catalog order (the catalog lists each
/// kind's rows together), if it is in the catalog.
pub(crate) const fn position_in_kind(id: CounterId) -> Option<usize> {
    let Some(at) = row(id) else { return None };
    let mut first = at;
    while first > 0 && CATALOG[first - 1].id.kind as u8 == id.kind as u8 {
        first -= 1;
    }
    Some(at - first)
}

/// [`observed`] worked out from the row.
const fn observed_of(counter: &Counter) -> Option<Maintained> {
    match counter.id.kind {
        ObjectKind::Hypervisor | ObjectKind::LogicalProcessor => return None,
        ObjectKind::Partition | ObjectKind::Vp => {}
    }
    if let Some(m) = counter.observed_by {
        return Some(m);
    }
    // A time per intercept is the VMM's (or KVM's) own; a thread's scheduling times are not.
    // Where the intercept is a class kvm_exit tells, the kernel times it from exit to entry.
    let thread_time = matches!(counter.maintained.source(), Some(Source::ThreadTime(_)));
    if counter.presentation as u8 == Presentation::Cost as u8 && !thread_time {
        let kvm_time = matches!(counter.maintained.source(), Some(Source::KvmStats(_)));
        return Some(match class_timed(counter.id) {
            Some(class) if kvm_time => Maintained::By(Source::KvmExitTime(class), OBSERVED_KVM_TIME),
            Some(class) => Maintained::By(Source::KvmExitTime(class), OBSERVED_EXIT_TIME),
            None => Maintained::No(OBSERVED_NO_TIME),
        });
    }
    let source = match counter.maintained {
        // Not maintained for our own partitions either: the catalog's reason holds.
        Maintained::No(why) => return Some(Maintained::No(why)),
        Maintained::By(source, _) => source,
    };
    let same = Maintained::By(source, counter.maintained.note());
    Some(match source {
        Source::Tracepoint(_) | Source::ThreadTime(_) | Source::PerfSoftware(_) | Source::HostFaults(_) => {
            same
        }
        Source::KvmStats(_) => Maintained::By(source, OBSERVED_KVM_STAT),
        Source::Hypercall(class) => {
            Maintained::By(Source::KvmHv(KvmHv::Hypercalls(class)), OBSERVED_HYPERCALL_CLASS)
        }
        _ if is_tlb(counter.name) => Maintained::No(OBSERVED_NO_VTLB),
        _ => Maintained::No(NO_OUTSIDE),
    })
}

const fn is_tlb(name: &str) -> bool {
    let (b, t) = (name.as_bytes(), b"TLB");
    let mut i = 0;
    while i + t.len() <= b.len() {
        if b[i] == t[0] && b[i + 1] == t[1] && b[i + 2] == t[2] {
            return true;
        }
        i += 1;
    }
    false
}

/// The KVM statistics an observed VM's sources of KVM's statistics (its stats descriptors,
/// libvirt, QMP) read for `counter`: its observed key when that is a KVM statistic, else its own
/// (HLT cost, whose observed key is the exit-to-entry span of VMX/SVM hosts, is KVM's halted time
/// for them); `None` for a counter no KVM statistic gives.
///
/// ```
/// use hvstats_abi::catalog::{observed_kvm_stat, vp};
/// use hvstats_abi::source::KvmStat;
/// let stat = |id: hvstats_abi::CounterId| id.counter().and_then(observed_kvm_stat);
/// assert_eq!(stat(vp::HYPERCALLS), Some(KvmStat::Vcpu(&["hypercalls"])));
/// assert_eq!(stat(vp::HALT_WAIT_HISTOGRAM), Some(KvmStat::Vcpu(&["halt_wait_ns", "halt_wait_hist"])));
/// assert!(stat(vp::HLT_INSTRUCTIONS_COST).is_some());
/// assert_eq!(stat(vp::CPUID_INSTRUCTIONS), None);
/// ```
pub const fn observed_kvm_stat(counter: &Counter) -> Option<KvmStat> {
    if let Some(Maintained::By(Source::KvmStats(key), _)) = observed(counter) {
        return Some(key);
    }
    match (observed(counter), counter.maintained) {
        (Some(Maintained::By(_, _)), Maintained::By(Source::KvmStats(key), _)) => Some(key),
        _ => None,
    }
}

#[cfg(test)]
/// The partition and VP counters an observed VM never has (to publish as not available).
pub(crate) fn never_observed() -> impl Iterator<Item = CounterId> {
    CATALOG.iter().filter(|c| observed(c).is_some_and(|m| !m.is_maintained())).map(|c| c.id)
}

// The counters a flush feeds are the catalog's, so this table says which: the hypercall table
// (`crate::hypercall`) knows nothing of counters.
impl crate::hypercall::HypercallEffect {
    /// The VP counter a flush adds to, and how much, from the flush record's `flags` and the
    /// hypercall record's `rep_cnt`; `None` for an effect that is no flush.
    ///
    /// ```
    /// use hvstats_abi::catalog::vp;
    /// use hvstats_abi::hypercall::{HypercallCode, flush_flags};
    /// let list = HypercallCode::FLUSH_VIRTUAL_ADDRESS_LIST.effect();
    /// assert_eq!(list.flush(0, 3), Some((vp::LOCAL_FLUSHED_GVA_RANGES, 3)));
    /// let all = flush_flags::ALL_VIRTUAL_ADDRESS_SPACES;
    /// assert_eq!(list.flush(all, 3), Some((vp::GLOBAL_GVA_RANGE_FLUSHES, 3)));
    /// ```
    pub const fn flush(self, flags: u64, rep_count: u16) -> Option<(CounterId, u64)> {
        let all_spaces = flags & crate::hypercall::flush_flags::ALL_VIRTUAL_ADDRESS_SPACES != 0;
        match (self, all_spaces) {
            (crate::hypercall::HypercallEffect::AddressSpaceFlush, false) => {
                Some((vp::ADDRESS_SPACE_FLUSHES, 1))
            }
            (crate::hypercall::HypercallEffect::AddressSpaceFlush, true) => {
                Some((vp::ADDRESS_DOMAIN_FLUSHES, 1))
            }
            (crate::hypercall::HypercallEffect::GvaRangeFlush, false) => {
                Some((vp::LOCAL_FLUSHED_GVA_RANGES, rep_count as u64))
            }
            (crate::hypercall::HypercallEffect::GvaRangeFlush, true) => {
                Some((vp::GLOBAL_GVA_RANGE_FLUSHES, rep_count as u64))
            }
            (
                crate::hypercall::HypercallEffect::ClassOnly
                | crate::hypercall::HypercallEffect::SyntheticIpi,
                _,
            ) => None,
        }
    }
}

#[cfg(test)]
mod observed_tests {
    use super::*;
    use crate::source::{KvmStat, ThreadTime, Tracepoint};

    fn observed_source(id: CounterId) -> Option<Source> {
        id.counter().and_then(observed).and_then(Maintained::source)
    }

    #[test]
    fn the_tables_worked_out_at_compile_time_say_what_the_rows_say() {
        for c in CATALOG {
            assert_eq!(observed(c), observed_of(c), "{}", c.name);
            let at = counters_of(c.id.kind).position(|x| x.id == c.id);
            assert_eq!(position_in_kind(c.id), at, "{}", c.name);
        }
        let outside = CounterId { index: INDICES as u16, ..vp::HYPERCALLS };
        assert_eq!(position_in_kind(outside), None);
        for tp in Tracepoint::ALL {
            let counted = tp == Tracepoint::UserspaceMsr
                || CATALOG.iter().any(|c| match observed_of(c).and_then(Maintained::source) {
                    Some(Source::Tracepoint(t)) => t == tp || t.added().contains(&tp),
                    _ => false,
                });
            assert_eq!(tp.counted_for_observed(), counted, "{tp:?}");
        }
    }

    #[test]
    fn every_partition_and_vp_counter_has_an_observed_answer() {
        for c in CATALOG {
            match c.id.kind {
                ObjectKind::Partition | ObjectKind::Vp => {
                    let o = observed(c).unwrap_or_else(|| panic!("{} has no answer", c.name));
                    assert!(!o.note().is_empty(), "{}", c.name);
                }
                _ => assert!(observed(c).is_none(), "{}", c.name),
            }
        }
    }

    #[test]
    fn costs_and_slots_are_unavailable_for_observed_vms_and_hypercall_classes_come_from_kvm_hv() {
        // A cost of an intercept class is timed in the kernel from kvm_exit to kvm_entry; a cost
        // of no class (emulated instructions) is the VMM's own, not visible.
        for (id, class) in [
            (vp::CPUID_INSTRUCTIONS_COST, InterceptClass::Cpuid),
            (vp::IO_INSTRUCTIONS_COST, InterceptClass::Io),
            (vp::HLT_INSTRUCTIONS_COST, InterceptClass::Halt),
            (vp::OTHER_INTERCEPTS_COST, InterceptClass::Other),
        ] {
            assert_eq!(observed_source(id), Some(Source::KvmExitTime(class)));
        }
        assert_eq!(
            vp::EMULATED_INSTRUCTIONS_COST.counter().and_then(observed),
            Some(Maintained::No(OBSERVED_NO_TIME))
        );
        // A hypercall class is counted from kvm_hv_hypercall records, classified by the table.
        assert_eq!(
            observed_source(vp::GPA_SPACE_HYPERCALLS),
            Some(Source::KvmHv(KvmHv::Hypercalls(HypercallClass::GpaSpace)))
        );
        assert!(observed_source(partition::GPA_PAGES).is_none());
        assert_eq!(
            observed_source(vp::HALT_WAIT_HISTOGRAM),
            Some(Source::KvmStats(KvmStat::Vcpu(&["halt_wait_ns", "halt_wait_hist"])))
        );
        assert!(never_observed().any(|c| c == vp::EMULATED_INSTRUCTIONS_COST));
        assert!(!never_observed().any(|c| c == vp::IO_INSTRUCTIONS));
    }

    #[test]
    fn observed_keys_are_the_rows_own_where_the_observer_reads_the_same_thing() {
        assert_eq!(observed_source(vp::CPUID_INSTRUCTIONS), Some(Source::Tracepoint(Tracepoint::Cpuid)));
        assert_eq!(observed_source(vp::TOTAL_RUN_TIME), Some(Source::ThreadTime(ThreadTime::Total)));
        assert_eq!(
            observed_source(vp::HLT_INSTRUCTIONS),
            Some(Source::KvmStats(KvmStat::Vcpu(&["halt_exits"])))
        );
        assert_eq!(
            observed_source(vp::IO_INTERCEPT_MESSAGES),
            Some(Source::Tracepoint(Tracepoint::UserspaceIo))
        );
        assert_eq!(observed_source(vp::MWAIT_INSTRUCTIONS), Some(Source::KvmExit(InterceptClass::Mwait)));
        // A cost, but the vCPU thread's own scheduling: schedstat gives it from outside.
        assert_eq!(
            observed_source(vp::CPU_WAIT_TIME_PER_DISPATCH),
            Some(Source::ThreadTime(ThreadTime::CpuWait))
        );
        assert_eq!(Source::Tracepoint(Tracepoint::UserspaceIo).name(), "userspace-exit");
    }

    #[test]
    fn each_exit_row_is_counted_as_the_observed_key_of_its_class_counter_says() {
        use crate::exit_filter::added_filter;
        use crate::exit_reason::{Counted, SVM, VMX};
        for r in VMX.iter().chain(SVM) {
            let counter = r.class.counter().counter().unwrap();
            let tracepoint = match observed(counter).and_then(Maintained::source) {
                Some(Source::Tracepoint(tp)) => Some(tp),
                _ => None,
            };
            match r.counted {
                // The exit classes write the counter: no tracepoint does.
                Counted::Exit => assert_eq!(tracepoint, None, "{r:?}"),
                Counted::Tracepoint(name) => {
                    assert!(name.contains(tracepoint.unwrap().event()), "{r:?}")
                }
                // A kvm_exit part of the class is added to the tracepoint's count.
                Counted::Added => assert!(
                    tracepoint.unwrap().added().iter().any(|p| p.exit_class() == Some(r.class)),
                    "{r:?}"
                ),
            }
        }
        // Every kvm_exit part counts added exits, and is added to its class counter's tracepoint.
        for part in Tracepoint::ALL.into_iter().filter(|tp| tp.exit_class().is_some()) {
            let class = part.exit_class().unwrap();
            assert!(added_filter(class).is_some(), "{part:?}");
            let counter = class.counter().counter().unwrap();
            let Some(Source::Tracepoint(tp)) = observed(counter).and_then(Maintained::source) else {
                panic!("{part:?}: {} is not counted from a tracepoint", counter.name)
            };
            assert!(tp.added().contains(&part), "{part:?}");
        }
    }

    #[test]
    fn page_faults_of_the_guest_and_of_the_second_level_translation_are_two_counters() {
        // #PF intercepts: from kvm_exit only; KVM's pf_taken (its MMU's faults, EPT/NPT faults
        // under nested paging) is the nested page fault count.
        assert_eq!(
            observed_source(vp::PAGE_FAULT_INTERCEPTS),
            Some(Source::KvmExit(InterceptClass::PageFault))
        );
        assert!(!vp::PAGE_FAULT_INTERCEPTS.counter().unwrap().maintained.is_maintained());
        assert_eq!(
            vp::NESTED_PAGE_FAULT_INTERCEPTS.counter().unwrap().maintained.source(),
            Some(Source::KvmStats(KvmStat::Vcpu(&["pf_taken"])))
        );
        assert_eq!(
            observed_source(vp::NESTED_PAGE_FAULT_INTERCEPTS_COST),
            Some(Source::KvmExitTime(InterceptClass::NestedPageFault))
        );
        // Appended as seed 004 says: a new minor of the release group.
        assert_eq!(vp::NESTED_PAGE_FAULT_INTERCEPTS.introduced_in(), 2);
        assert_eq!(GroupKind::Release.version(ObjectKind::Vp), GroupVersion { major: 1, minor: 2 });
        assert_eq!(counters_at(ObjectKind::Vp, GroupKind::Release, 1), 65);
    }

    #[test]
    fn our_vps_and_the_observer_count_the_tracepoints_their_rows_name() {
        let ours: [bool; Tracepoint::ALL.len()] = Tracepoint::ALL.map(Tracepoint::counted_for_partitions);
        let observed: [bool; Tracepoint::ALL.len()] = Tracepoint::ALL.map(Tracepoint::counted_for_observed);
        for tp in [Tracepoint::Cpuid, Tracepoint::ApicTpr, Tracepoint::X2apicTpr, Tracepoint::InjException] {
            assert!(ours[tp.index()], "{tp:?}");
        }
        for tp in [Tracepoint::UserspaceIo, Tracepoint::UserspaceMsr] {
            assert!(!ours[tp.index()], "{tp:?}: our run loop counts these itself");
        }
        for tp in
            [Tracepoint::Cpuid, Tracepoint::X2apicEoi, Tracepoint::UserspaceOther, Tracepoint::UserspaceMsr]
        {
            assert!(observed[tp.index()], "{tp:?}");
        }
        assert!(!observed[Tracepoint::InjException.index()]);
    }
}
