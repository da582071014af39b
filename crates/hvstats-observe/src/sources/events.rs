//! The events source: KVM's tracepoints, counted on each thread of a VMM from attach on
//! ([`crate::thread_counters`]), written by event writers.
//!
//! At attach every thread of the process is counted (the vCPU threads are not known yet, and a
//! VM attached while paused must be counted from its first instruction); once every vCPU's
//! thread is known the others are closed. The threads' own clocks are another source, counted
//! on the same threads within the same budget ([`vmm_threads`]). An [`EventWriter`] is one file that names the events
//! it needs and writes counters from their counts: [`WRITERS`] lists them, and the list of
//! events counted on each thread is theirs put end to end ([`vm_events`]), so no index is written
//! by hand.

use hvstats::SharedPage;
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::exit_reason;
use hvstats_abi::source::Tracepoint;
use hvstats_abi::vm_sources::Origin;

use super::event_writer::{EventWriter, KvmExitState, ThreadReading, tracepoint_event};
use super::hyperv;
use super::vm_source::{Counting, Learned, VmAttach, VmSource, VmView};
use crate::attach::ObserveError;
use crate::thread_counters::{EventSpec, ThreadCounters};
use hvstats_sources::counter_source::{CounterSource, Gives, Object};

/// Threads of a VMM counted beyond one per vCPU while the vCPU threads are unknown: a VMM's
/// other threads (main loop, I/O, RCU, a worker pool) rarely number more; the rest of a process
/// with thousands of threads is left out, and said to be.
pub const EXTRA_THREADS: usize = 256;

/// How many of the VMM's threads a source counting on them may count at attach, and the threads
/// to count first (those known to run a vCPU): at most [`EXTRA_THREADS`] beyond one per vCPU,
/// and as many as the descriptors left hold [`VmAttach::per_thread`] events each, the same for
/// every such source, so that together they stay within [`VmAttach::room`].
///
/// # Errors
/// When the descriptors left cannot hold the events of every vCPU's thread.
pub(crate) fn vmm_threads(at: &VmAttach<'_>) -> Result<(usize, Vec<i32>), ObserveError> {
    let (procfs, pid) = (at.procfs, at.pid);
    let cost = ThreadCost::of(at);
    let vcpus = at.fds.vcpus.len();
    let max_threads = cost.threads_within(at.room).min(vcpus + EXTRA_THREADS);
    if max_threads < vcpus.max(1) {
        let (needed, counting) = (cost.descriptors(vcpus.max(1)), cost.said(vcpus.max(1)));
        return Err(ObserveError::Budget { pid, vcpus, needed, counting, room: at.room });
    }
    let mut first: Vec<i32> = at
        .fds
        .vms
        .first()
        .map(|&vm_fd| procfs.debugfs_vcpu_threads(pid, vm_fd).into_values().collect())
        .unwrap_or_default();
    first.extend(procfs.named_vcpu_threads(pid).unwrap_or_default().into_values());
    Ok((max_threads, first))
}

/// What counting a VMM's threads costs in descriptors, by the method each thread gets: a thread
/// with a row in the in-kernel engine holds the thread clock's (and a perf counter per event the
/// engine does not count); one past the engine's rows, a perf counter per event besides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ThreadCost {
    /// Descriptors of a thread counted by the list's method ([`VmAttach::per_thread`]).
    per_thread: usize,
    /// Descriptors of a thread past the engine's rows.
    past_rows: usize,
    /// The engine's rows and those free, when the list counts in the kernel.
    rows: Option<(u32, usize)>,
}

impl ThreadCost {
    fn of(at: &VmAttach<'_>) -> Self {
        let (per_thread, past_rows) = (at.per_thread.max(1), at.past_rows_per_thread.max(1));
        Self { per_thread, past_rows, rows: at.events.engine_rows() }
    }

    /// Of `threads`, those the engine has a row for.
    fn in_rows(&self, threads: usize) -> usize {
        self.rows.map_or(threads, |(_, free)| threads.min(free))
    }

    /// Descriptors `threads` threads need.
    fn descriptors(&self, threads: usize) -> usize {
        let in_rows = self.in_rows(threads);
        in_rows * self.per_thread + (threads - in_rows) * self.past_rows
    }

    /// The most threads `room` descriptors count.
    fn threads_within(&self, room: usize) -> usize {
        let by_method = room / self.per_thread;
        let free = self.in_rows(by_method);
        if free == by_method { by_method } else { free + (room - free * self.per_thread) / self.past_rows }
    }

    /// How `threads` threads are counted, and what each costs, said for a refusal.
    fn said(&self, threads: usize) -> String {
        let in_rows = self.in_rows(threads);
        match self.rows {
            None => format!(
                "{} per vCPU thread: a perf counter per tracepoint, and for migrations the thread \
                 clock's unless the task iterator counts them",
                self.per_thread
            ),
            Some(_) if in_rows == threads => format!(
                "{} per vCPU thread: tracepoints counted in the kernel, and for migrations the thread \
                 clock's unless the task iterator counts them",
                self.per_thread
            ),
            Some((rows, free)) => format!(
                "{in_rows} vCPU threads in the kernel at {} each, and {} past the in-kernel engine's \
                 rows ({free} of {rows} free) by perf counters at {} each",
                self.per_thread,
                threads - in_rows,
                self.past_rows
            ),
        }
    }
}

/// The hardware virtualization of this host's KVM: `Some(ISA_VMX)`, `Some(ISA_SVM)`, or `None`
/// (a software backend, where `kvm_exit` does not fire).
pub fn host_isa() -> Option<u32> {
    if std::path::Path::new("/sys/module/kvm_intel").is_dir() {
        Some(exit_reason::ISA_VMX)
    } else if std::path::Path::new("/sys/module/kvm_amd").is_dir() {
        Some(exit_reason::ISA_SVM)
    } else {
        None
    }
}

/// The event writers, in the order their events are counted.
pub const WRITERS: &[&dyn EventWriter] = &[
    &super::tracepoints::KvmTracepoints,
    &super::exit_classes::ExitClasses,
    &super::hyperv::HypervEnlightenments,
];

/// The events counted on a VMM's threads on a host of `isa`: every writer's, end to end.
pub fn vm_events(isa: Option<u32>) -> Vec<EventSpec> {
    WRITERS.iter().flat_map(|w| w.events(isa)).collect()
}

/// The events source of one VM.
#[derive(Debug)]
pub struct Events {
    counters: ThreadCounters,
    /// By writer, the index of its first event in the list.
    offsets: Vec<usize>,
    kvm_exit: KvmExitState,
    /// By VP index (ascending), the thread read at the last refresh: its counts are kept once,
    /// in its counters ([`ThreadCounters::last`]).
    read: Vec<(u32, i32)>,
    /// By event, whether it is counted on every vCPU thread known.
    counted: Vec<bool>,
    /// Whether the VM's Hyper-V hypercalls are all its hypercalls ([`hyperv::gives_totals`]).
    hyperv_totals: bool,
    /// Since when every count it writes counts (µs since the epoch), when all are kept beyond
    /// this observer: every vCPU thread known and counted in a kept row, no event left to perf.
    kept_since: Option<u64>,
    /// vCPU threads whose tracepoints are perf counters for want of a row in the in-kernel
    /// engine: the VM is counted at perf's cost, and its source is named so.
    past_rows: usize,
    /// What it gives, and the events counted and `kvm_exit` state it was worked out from: asked
    /// several times a refresh, worked out again only when those change.
    gives: (Gives, Vec<bool>, KvmExitState),
    /// The list's method, said ([`crate::thread_counters::EventList::method_description`]): fixed when the list is made,
    /// said at every refresh.
    method: std::sync::Arc<str>,
    /// The counters' generation, whether every vCPU's thread was known, and the vCPU threads,
    /// that `counted`, `kept_since` and `past_rows` were worked out for: they hold until one of
    /// these changes.
    worked_out_for: Option<(u64, bool, Vec<i32>)>,
}

/// Opens the events source: counters on every thread of the VMM (the threads known to run a
/// vCPU first), as many as [`vmm_threads`] says.
///
/// # Errors
/// When the descriptors left cannot hold a counter group per vCPU, or the threads cannot be
/// listed.
pub fn open(at: &VmAttach<'_>) -> Result<Option<Box<dyn VmSource>>, ObserveError> {
    let (procfs, pid) = (at.procfs, at.pid);
    let isa = host_isa();
    let (max_threads, first) = vmm_threads(at)?;
    // Kept counts are adopted only for the VM object they counted (see `vm_identity::vm_token`).
    let vm = at.fds.vms.first().map_or(0, |&fd| crate::vm_identity::vm_token(procfs, pid, fd));
    let counters = ThreadCounters::attach_in_vm(procfs, pid, at.events.clone(), (max_threads, &first), vm)
        .map_err(|source| ObserveError::Proc { pid, source })?;
    let mut offsets = Vec::with_capacity(WRITERS.len());
    let mut at_event = 0;
    for writer in WRITERS {
        offsets.push(at_event);
        at_event += writer.events(isa).len();
    }
    let kvm_exit =
        if isa.is_some() { KvmExitState::Undecided } else { KvmExitState::NoHardwareVirtualization };
    let mut me = Events {
        counters,
        offsets,
        kvm_exit,
        read: Vec::new(),
        counted: Vec::new(),
        hyperv_totals: hyperv::gives_totals(procfs.hyperv_enlightenments(pid)),
        kept_since: None,
        past_rows: 0,
        gives: (Gives::NOTHING, Vec::new(), kvm_exit),
        method: at.events.method_description().into(),
        worked_out_for: None,
    };
    me.gives.0 = me.work_out_gives();
    Ok(Some(Box::new(me)))
}

impl Events {
    /// How its tracepoints are counted, said: the list's method, and the vCPU threads (of
    /// `vcpu_threads`) past the in-kernel engine's rows, counted by perf counters instead.
    fn method(&self, vcpu_threads: usize) -> std::sync::Arc<str> {
        let events = self.counters.events();
        let method = &self.method;
        match (self.past_rows, events.engine_rows()) {
            (0, _) | (_, None) => method.clone(),
            (past, Some((rows, _))) => format!(
                "{method}; {past} of {vcpu_threads} vCPU threads by perf counters ({} a thread): the \
                 engine's {rows} rows are all in use",
                events.perf_events_without_row()
            )
            .into(),
        }
    }

    /// What it gives from the events counted and the `kvm_exit` state now.
    fn work_out_gives(&self) -> Gives {
        let mut gives = Gives::NOTHING;
        for (w, writer) in WRITERS.iter().enumerate() {
            let range = self.range(w);
            let counted = |i: usize| self.counted.get(range.start + i).copied().unwrap_or(false);
            gives = gives.union(&writer.gives(&counted, self.kvm_exit));
        }
        // Where kvm_exit does not fire, a guest that is not enlightened makes no Hyper-V
        // hypercall but may make KVM's: kvm_hv_hypercall is not its total.
        if !self.hyperv_totals && self.kvm_exit != KvmExitState::Fires {
            gives.vp = gives.vp.difference(&hyperv::totals());
        }
        gives
    }

    /// The events of writer `w`, as a range of the list.
    fn range(&self, w: usize) -> std::ops::Range<usize> {
        let end = self.offsets.get(w + 1).copied().unwrap_or(self.counters.events().len());
        self.offsets[w]..end
    }

    /// Works out, from the counters open on the vCPU threads known, which events are counted on
    /// them all, since when their counts are kept, and how many are past the engine's rows;
    /// only where the counters or the threads changed since it last did.
    fn work_out_threads(&mut self, vm: &VmView<'_>) {
        let tids = || vm.threads().map(|(_, tid)| tid);
        let (generation, all_known) = (self.counters.generation(), vm.all_known());
        if self.worked_out_for.as_ref().is_some_and(|(g, known, was)| {
            (*g, *known) == (generation, all_known) && was.iter().copied().eq(tids())
        }) {
            return;
        }
        // An event is counted when it can be at all and is open on every vCPU thread known.
        self.counters.open_on_all(tids(), &mut self.counted);
        let all_in_kernel = self.counters.events().perf_events_per_thread() == 0;
        self.kept_since = (all_known && all_in_kernel).then(|| self.counters.kept_since_of(tids())).flatten();
        self.past_rows = self.counters.past_engine_rows(tids());
        self.worked_out_for = Some((generation, all_known, tids().collect()));
    }

    /// Decides whether `kvm_exit` fires, from exits the guest is seen to make.
    fn decide_kvm_exit(&mut self) {
        if self.kvm_exit != KvmExitState::Undecided {
            return;
        }
        let specs = self.counters.events().specs();
        let at = |spec: &EventSpec| specs.iter().position(|s| s == spec);
        let kvm_exit = at(&EventSpec::tracepoint("kvm", "kvm_exit"));
        let exits: Vec<usize> = [Tracepoint::UserspaceIo, Tracepoint::UserspaceMmio, Tracepoint::Cpuid]
            .into_iter()
            .filter_map(|tp| at(&tracepoint_event(tp)))
            .collect();
        let sum = |indices: &[usize]| -> u64 {
            self.read
                .iter()
                .filter_map(|&(_, tid)| self.counters.last(tid))
                .map(|c| indices.iter().map(|&i| c.get(i).copied().flatten().unwrap_or(0)).sum::<u64>())
                .sum()
        };
        if kvm_exit.is_some_and(|i| sum(&[i]) > 0) {
            self.kvm_exit = KvmExitState::Fires;
        } else if sum(&exits) > 0 {
            self.kvm_exit = KvmExitState::Silent;
        }
    }
}

impl CounterSource for Events {
    fn name(&self) -> &'static str {
        if self.past_rows > 0 { "tracepoints-perf" } else { "tracepoints" }
    }

    fn gives(&self) -> Gives {
        self.gives.0
    }

    fn write(&self, object: Object, page: &SharedPage, only: &CounterSet) {
        let Object::Vp(index) = object else { return };
        let Ok(at) = self.read.binary_search_by_key(&index, |&(vp, _)| vp) else { return };
        let Some(counts) = self.counters.last(self.read[at].1) else { return };
        for (w, writer) in WRITERS.iter().enumerate() {
            let range = self.range(w);
            let Some(counts) = counts.get(range) else { continue };
            let reading = ThreadReading { counts, kvm_exit: self.kvm_exit };
            writer.write(&reading, page, only);
        }
    }

    fn unavailable(&self) -> Vec<String> {
        let events = self.counters.events();
        (0..events.len()).filter_map(|i| events.unavailable(i).map(|e| e.to_string())).collect()
    }
}

impl VmSource for Events {
    fn read(&mut self, vm: &VmView<'_>) -> Learned {
        // A process that cannot be listed is gone: the refresh says so.
        let _ = self.counters.rescan(vm.procfs);
        // Once every vCPU's thread is known, only those are counted.
        if vm.all_known() && !self.counters.is_narrowed() {
            let tids: Vec<i32> = vm.threads().map(|(_, tid)| tid).collect();
            self.counters.retain(&tids);
        }
        self.counters.read_threads(vm.threads(), &mut self.read);
        self.work_out_threads(vm);
        self.decide_kvm_exit();
        if (&self.gives.1, self.gives.2) != (&self.counted, self.kvm_exit) {
            self.gives = (self.work_out_gives(), self.counted.clone(), self.kvm_exit);
        }
        let counting = Counting {
            kvm_exit: self.kvm_exit,
            threads: self.counters.tids().len(),
            left_out: self.counters.left_out(),
            method: self.method(vm.threads().count()),
        };
        Learned { counting: Some(counting), ..Learned::holding(self.counters.fds()) }
    }

    /// Kept when every count it writes is kept in the kernel beyond this observer (a restarted
    /// observer continues them); else counted from this attach.
    fn origin(&self) -> Origin {
        if self.kept_since.is_some() { Origin::Kept } else { Origin::Attach }
    }

    fn kept_since(&self) -> Option<std::time::SystemTime> {
        self.kept_since.map(|us| std::time::UNIX_EPOCH + std::time::Duration::from_micros(us))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_counts_each_thread_by_the_method_it_gets_and_a_refusal_says_which() {
        // Counting in the kernel: a 1,024-vCPU VM needs at most the thread clock's descriptor a
        // thread (none where the task iterator counts the migrations: 1 still, at least).
        let in_kernel = ThreadCost { per_thread: 1, past_rows: 44, rows: Some((4096, 4096)) };
        assert_eq!(in_kernel.descriptors(1024), 1024);
        assert_eq!(in_kernel.threads_within(19_673), 4096 + (19_673 - 4096) / 44);
        assert!(in_kernel.said(1024).starts_with("1 per vCPU thread: tracepoints counted in the kernel"));
        // Past the engine's rows, each thread beyond costs perf's descriptors, and is said so.
        let full = ThreadCost { rows: Some((4096, 100)), ..in_kernel };
        assert_eq!(full.descriptors(1024), 100 + 924 * 44);
        assert_eq!(full.threads_within(1000), 100 + 900 / 44);
        assert_eq!(
            full.said(1024),
            "100 vCPU threads in the kernel at 1 each, and 924 past the in-kernel engine's rows \
             (100 of 4096 free) by perf counters at 44 each"
        );
        // Perf counters everywhere: every thread at perf's cost.
        let perf = ThreadCost { per_thread: 44, past_rows: 44, rows: None };
        assert_eq!((perf.descriptors(1024), perf.threads_within(19_673)), (45_056, 447));
        let refusal = ObserveError::Budget {
            pid: 7,
            vcpus: 1024,
            needed: full.descriptors(1024),
            counting: full.said(1024),
            room: 1000,
        };
        let said = refusal.to_string();
        assert!(said.contains("the descriptor budget: its 1024 vCPUs need 40756 descriptors"), "{said}");
        assert!(
            said.contains("924 past the in-kernel engine's rows") && said.contains("1000 are left"),
            "{said}"
        );
        assert_eq!(crate::refusal::of_attach_error(&refusal).label(), "descriptor_budget");
    }
}
