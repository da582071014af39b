//! The sources of an observed VM's counters, composed by the observer on the one seam of
//! [`hvstats_sources::counter_source`].
//!
//! A [`VmSource`] is a counter source read once per refresh for all of a VM's vCPUs: it says
//! which counters it gives, and writes them into the VM's partition and VP pages. The observer
//! composes the sources a VM has, in the order of [`VM_SOURCES`] (the first that gives a counter
//! writes it), and declares unavailable what none gives. The sources:
//!
//! - [`stats_fd`]: KVM's statistics from the binary-stats descriptors the VMM holds, copied with
//!   `pidfd_getfd` (every vCPU statistic, whole-life, no guest interruption);
//! - [`libvirt_stats`]: KVM's statistics of a libvirt domain from libvirt's bulk statistics, over
//!   a read-only connection (never tainting the domain), through a KubeVirt pod's own daemon
//!   where [`pod_libvirt`]'s rule binds it to the VMM;
//! - [`events`]: KVM's tracepoints, counted per thread from attach on (in the kernel where BPF is
//!   permitted), written by the event writers of [`tracepoints`], [`exit_classes`] and [`hyperv`];
//! - [`thread_clock`]: where the kernel's task iterator cannot be loaded, the vCPU threads'
//!   migrations, a perf software event on the same threads, which counts from attach;
//! - [`qmp_stats`]: KVM's statistics through QEMU's QMP `query-stats`, the VM's run state, and
//!   QMP's knowledge of the vCPU threads and the VM's name; its session heals;
//! - [`threads`]: what the kernel keeps of each vCPU thread from its start (run time, hypervisor
//!   time, CPU wait, dispatches, the host's page faults on it, and the migrations too where it is
//!   read by the kernel's task iterator, `thread-iter`: one walk of the VMM's threads a refresh),
//!   or else read from each vCPU thread's `/proc` files (`thread`).
//!
//! Every source that carries KVM's statistics maps them to counters through [`kvm_stat_map`].
//!
//! A new source is one file implementing [`VmSource`] and one line in [`VM_SOURCES`].

pub mod event_writer;
pub mod events;
pub mod exit_classes;
pub mod hyperv;
pub mod kvm_stat_map;
pub mod libvirt_stats;
pub mod pod_libvirt;
pub mod qmp_stats;
pub mod stats_fd;
pub mod thread_clock;
pub mod threads;
pub mod tracepoints;
pub mod vm_source;

pub use event_writer::KvmExitState;
pub use vm_source::{
    Counting, Learned, Named, Peer, PeerKind, PeerState, Vcpu, VcpuThread, VmAttach, VmSource, VmView,
};

use crate::attach::ObserveError;

/// How one source is opened for a VM being attached: `Ok(None)` where the VM or the host does
/// not have it; an error ends the attach.
type OpenVm = fn(&VmAttach<'_>) -> Result<Option<Box<dyn VmSource>>, ObserveError>;

/// Every source of an observed VM, in the order that decides which writes a counter several
/// give: KVM's own statistics first, whole-life, by how little reading them costs the guest and
/// the host (the VMM's open descriptors, then libvirt, then QMP), then what is counted from attach in the kernel
/// (tracepoints, and on VMX/SVM hosts exits by reason, which give a class's count and time where
/// no KVM statistic does), then the threads' migrations by perf counters (only where the task
/// iterator cannot read the kernel's), then the threads' own accounting. One source
/// has one origin: the migrations a perf counter counts, which nothing keeps across observers,
/// are not the events source's, and the threads' accounting counts from the thread's start.
pub const VM_SOURCES: &[OpenVm] =
    &[stats_fd::open, libvirt_stats::open, qmp_stats::open, events::open, thread_clock::open, threads::open];

/// The tracepoint events a VM attached with `options` is counted with: kept beyond the observer
/// where the options say, counted in the kernel where that is permitted.
pub(crate) fn vm_event_list(options: &crate::attach::ObserveOptions) -> crate::thread_counters::EventList {
    use crate::thread_counters::EventList;
    let specs = events::vm_events(events::host_isa());
    match &options.kept_in {
        Some(dir) => EventList::kept_in(specs, dir),
        None => EventList::new(specs),
    }
}

/// Descriptors each counted thread of a VMM seen through `procfs` holds, by the method `events`
/// are counted with: a perf counter per event not counted in the kernel (none where the in-kernel
/// tally counts them all), and the thread clock's (one: migrations; none where the task
/// iterator reads them). What admitting a VM costs per thread ([`VmAttach::per_thread`]).
pub(crate) fn descriptors_per_thread(
    events: &crate::thread_counters::EventList,
    procfs: &crate::discovery::Procfs,
) -> usize {
    events.perf_events_per_thread() + thread_clock::events_for(procfs).len()
}

/// Descriptors a thread past the in-kernel engine's rows holds: a perf counter per event of
/// `events` and the thread clock's ([`VmAttach::past_rows_per_thread`]).
pub(crate) fn descriptors_past_rows(
    events: &crate::thread_counters::EventList,
    procfs: &crate::discovery::Procfs,
) -> usize {
    events.perf_events_without_row() + thread_clock::events_for(procfs).len()
}

impl<'a> VmAttach<'a> {
    /// What the sources of the VM of `pid` are given: its event list made once for `options`,
    /// and what each of its counted threads costs in descriptors by the method it gets.
    #[allow(clippy::too_many_arguments, reason = "what attaching takes, each from another owner")]
    pub(crate) fn new(
        procfs: &'a crate::discovery::Procfs,
        pid: i32,
        fds: &'a crate::discovery::KvmFds,
        options: &'a crate::attach::ObserveOptions,
        room: usize,
        qmp: Option<&'a std::path::Path>,
        superseded: &'a [std::os::fd::OwnedFd],
    ) -> Self {
        let events = vm_event_list(options);
        let per_thread = descriptors_per_thread(&events, procfs);
        let past_rows_per_thread = descriptors_past_rows(&events, procfs);
        Self { procfs, pid, fds, options, room, events, per_thread, past_rows_per_thread, qmp, superseded }
    }
}

// Every source of the list has its rows on the VM's partition page.
const _: () = assert!(
    VM_SOURCES.len() <= hvstats_abi::vm_sources::MAX_SOURCES,
    "a VM's partition page names at most MAX_SOURCES sources"
);
