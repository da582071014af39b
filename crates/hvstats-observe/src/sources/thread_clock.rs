//! The thread clock source: each vCPU thread's migrations between host CPUs where the kernel's
//! task iterator cannot read them. The kernel's own count (`se.nr_migrations`) is read by the
//! [`super::threads`] source's task iterator, from the thread's start, where it loads; elsewhere
//! no file gives it to a reader (`/proc/<pid>/task/<tid>/sched` exists only with
//! `CONFIG_SCHED_DEBUG`), so they are a perf software event on the thread, which no kernel object
//! keeps once the observer is gone: they count from attach, and this source is not opened
//! where the task iterator counts ([`events_for`]).
//!
//! It counts on the VMM's threads as the events source does ([`super::events`]): every thread
//! at attach (the vCPU threads are not known yet, and a VM attached while paused must be counted
//! from its first instruction), within the same budget, and only the vCPU threads once all are
//! known.

use std::collections::BTreeMap;

use hvstats::SharedPage;
use hvstats_abi::ObjectKind;
use hvstats_abi::catalog::{Maintained, observed};
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::source::{PerfSoftwareEvent, Source};

use super::events::vmm_threads;
use super::vm_source::{Learned, VmAttach, VmSource, VmView};
use crate::attach::ObserveError;
use crate::thread_counters::{EventList, EventSpec, Method, SW_CPU_MIGRATIONS, ThreadCounters};
use hvstats_sources::counter_source::{CounterSource, Gives, Object};

/// Its one event: migrations.
const MIGRATIONS: usize = 0;

/// The events it counts on each thread: perf counters, whatever the host permits in the kernel.
pub fn events() -> Vec<EventSpec> {
    vec![EventSpec::Software(SW_CPU_MIGRATIONS)]
}

/// The event of `source`, when it is one of this source's.
fn event_of(source: Source) -> Option<usize> {
    match source {
        Source::PerfSoftware(PerfSoftwareEvent::CpuMigrations) => Some(MIGRATIONS),
        _ => None,
    }
}

/// The events it counts on each thread of a VM seen through `procfs`: none where the threads
/// source reads the migrations with the kernel's task iterator.
pub fn events_for(procfs: &crate::discovery::Procfs) -> Vec<EventSpec> {
    if super::threads::iterated(procfs) { Vec::new() } else { events() }
}

/// The thread clocks of one VM.
#[derive(Debug)]
pub struct ThreadClock {
    counters: ThreadCounters,
    /// By VP index, the last reading of its thread's events.
    readings: BTreeMap<u32, Vec<Option<u64>>>,
    /// By event, whether it is counted on every vCPU thread known.
    counted: Vec<bool>,
}

/// Opens the thread clocks (none where the task iterator counts): counters on every thread of the VMM (the threads known to run a
/// vCPU first), as many as the events source counts on ([`vmm_threads`]).
///
/// # Errors
/// When the descriptors left cannot hold a counter group per vCPU, or the threads cannot be
/// listed.
pub fn open(at: &VmAttach<'_>) -> Result<Option<Box<dyn VmSource>>, ObserveError> {
    if events_for(at.procfs).is_empty() {
        return Ok(None);
    }
    let (max_threads, first) = vmm_threads(at)?;
    // Software events are perf counters everywhere: asking for no in-kernel tally spares one.
    let events = EventList::with_method(events(), Method::Perf);
    let counters = ThreadCounters::attach_at_most(at.procfs, at.pid, events, max_threads, &first)
        .map_err(|source| ObserveError::Proc { pid: at.pid, source })?;
    Ok(Some(Box::new(ThreadClock { counters, readings: BTreeMap::new(), counted: Vec::new() })))
}

impl CounterSource for ThreadClock {
    fn name(&self) -> &'static str {
        "thread-clock"
    }

    fn gives(&self) -> Gives {
        let counted = |i: usize| self.counted.get(i).copied().unwrap_or(false);
        Gives::vp(CounterSet::of_kind(ObjectKind::Vp, |c| {
            observed(c).and_then(Maintained::source).and_then(event_of).is_some_and(counted)
        }))
    }

    fn write(&self, object: Object, page: &SharedPage, only: &CounterSet) {
        let Object::Vp(index) = object else { return };
        let Some(counts) = self.readings.get(&index) else { return };
        let count = |i: usize| counts.get(i).copied().flatten();
        for counter in hvstats_abi::catalog::counters_of(ObjectKind::Vp).filter(|c| only.contains(c.id)) {
            let value = match observed(counter).and_then(Maintained::source) {
                Some(Source::PerfSoftware(PerfSoftwareEvent::CpuMigrations)) => count(MIGRATIONS),
                _ => None,
            };
            if let Some(v) = value {
                page.set(counter.id, v);
            }
        }
    }

    fn unavailable(&self) -> Vec<String> {
        let events = self.counters.events();
        (0..events.len()).filter_map(|i| events.unavailable(i).map(|e| e.to_string())).collect()
    }
}

impl VmSource for ThreadClock {
    fn read(&mut self, vm: &VmView<'_>) -> Learned {
        let _ = self.counters.rescan(vm.procfs);
        // Once every vCPU's thread is known, only those are counted.
        if vm.all_known() && !self.counters.is_narrowed() {
            let tids: Vec<i32> = vm.threads().map(|(_, tid)| tid).collect();
            self.counters.retain(&tids);
        }
        self.counters.read_each(vm.threads(), &mut self.readings);
        // An event is counted when it can be at all and is open on every vCPU thread known.
        self.counters.open_on_all(vm.threads().map(|(_, tid)| tid), &mut self.counted);
        Learned::holding(self.counters.fds())
    }
}
