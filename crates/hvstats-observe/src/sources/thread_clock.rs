//! The thread clock source: each vCPU thread's CPU time (the task clock), its hypervisor time
//! (CPU time less guest time of the same moment) and its migrations between host CPUs. Another
//! process's thread clock cannot be read, so these are perf software events on the thread, which
//! no kernel object can keep once the observer is gone: they always count from attach.
//!
//! It counts on the VMM's threads as the events source does ([`super::events`]): every thread
//! at attach (the vCPU threads are not known yet, and a VM attached while paused must be counted
//! from its first instruction), within the same budget, and only the vCPU threads once all are
//! known. Each thread's guest time is noted when its counters are opened, so the hypervisor time
//! is of the same span as the task clock.

use std::collections::BTreeMap;

use hvstats::SharedPage;
use hvstats_abi::ObjectKind;
use hvstats_abi::catalog::{Maintained, observed};
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::source::{PerfSoftwareEvent, Source, ThreadTime};

use super::events::vmm_threads;
use super::vm_source::{Learned, VmAttach, VmSource, VmView};
use crate::attach::ObserveError;
use crate::counting::{EventList, EventSpec, Method, SW_CPU_MIGRATIONS, SW_TASK_CLOCK, ThreadCounters};
use crate::discovery::Procfs;
use hvstats_sources::counter_source::{CounterSource, Gives, Object};

/// Its events: the task clock (nanoseconds), then migrations.
const TASK_CLOCK: usize = 0;
const MIGRATIONS: usize = 1;

/// The events it counts on each thread: perf counters, whatever the host permits in the kernel.
pub fn events() -> Vec<EventSpec> {
    vec![EventSpec::Software(SW_TASK_CLOCK), EventSpec::Software(SW_CPU_MIGRATIONS)]
}

/// The event of `source`, when it is one of this source's.
fn event_of(source: Source) -> Option<usize> {
    match source {
        Source::ThreadTime(ThreadTime::Total | ThreadTime::Hypervisor) => Some(TASK_CLOCK),
        Source::PerfSoftware(PerfSoftwareEvent::CpuMigrations) => Some(MIGRATIONS),
        _ => None,
    }
}

/// The thread clocks of one VM.
#[derive(Debug)]
pub struct ThreadClock {
    counters: ThreadCounters,
    /// Each counted thread's guest time (clock ticks) when its counters were opened.
    guest_ticks_at_open: BTreeMap<i32, u64>,
    /// By VP index, the last reading of its thread's events and its guest time since open, in
    /// 100 ns.
    readings: BTreeMap<u32, (Vec<Option<u64>>, Option<u64>)>,
    /// By event, whether it is counted on every vCPU thread known.
    counted: Vec<bool>,
}

/// Opens the thread clocks: counters on every thread of the VMM (the threads known to run a
/// vCPU first), as many as the events source counts on ([`vmm_threads`]).
///
/// # Errors
/// When the descriptors left cannot hold a counter group per vCPU, or the threads cannot be
/// listed.
pub fn open(at: &VmAttach<'_>) -> Result<Option<Box<dyn VmSource>>, ObserveError> {
    let (max_threads, first) = vmm_threads(at)?;
    // Software events are perf counters everywhere: asking for no in-kernel tally spares one.
    let events = EventList::with_method(events(), Method::Perf);
    let counters = ThreadCounters::attach_at_most(at.procfs, at.pid, events, max_threads, &first)
        .map_err(|source| ObserveError::Proc { pid: at.pid, source })?;
    let mut me = ThreadClock {
        counters,
        guest_ticks_at_open: BTreeMap::new(),
        readings: BTreeMap::new(),
        counted: Vec::new(),
    };
    me.note_guest_ticks(at.procfs, at.pid);
    Ok(Some(Box::new(me)))
}

impl ThreadClock {
    /// Records the guest time of threads whose counters were just opened: guest time counts from
    /// the same moment as the thread's counters.
    fn note_guest_ticks(&mut self, procfs: &Procfs, pid: i32) {
        for tid in self.counters.tids() {
            if let std::collections::btree_map::Entry::Vacant(v) = self.guest_ticks_at_open.entry(tid) {
                v.insert(guest_ticks(procfs, pid, tid).unwrap_or(0));
            }
        }
    }
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
        let Some((counts, guest_100ns)) = self.readings.get(&index) else { return };
        let count = |i: usize| counts.get(i).copied().flatten();
        for counter in hvstats_abi::catalog::counters_of(ObjectKind::Vp).filter(|c| only.contains(c.id)) {
            let value = match observed(counter).and_then(Maintained::source) {
                Some(Source::ThreadTime(ThreadTime::Total)) => count(TASK_CLOCK).map(|ns| ns / 100),
                Some(Source::ThreadTime(ThreadTime::Hypervisor)) => {
                    count(TASK_CLOCK).map(|ns| (ns / 100).saturating_sub(guest_100ns.unwrap_or(0)))
                }
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
        if self.counters.rescan(vm.procfs).is_ok_and(|added| added > 0) {
            self.note_guest_ticks(vm.procfs, vm.pid);
        }
        // Once every vCPU's thread is known, only those are counted.
        if vm.all_known() && !self.counters.is_narrowed() {
            let tids: Vec<i32> = vm.threads().map(|(_, tid)| tid).collect();
            self.counters.retain(&tids);
            self.guest_ticks_at_open.retain(|tid, _| tids.contains(tid));
            // A vCPU thread the budget had left out is counted from now: so is its guest time.
            self.note_guest_ticks(vm.procfs, vm.pid);
        }
        self.readings.clear();
        for (index, tid) in vm.threads() {
            let Some(counts) = self.counters.read(tid) else { continue };
            let guest = guest_ticks(vm.procfs, vm.pid, tid)
                .zip(self.guest_ticks_at_open.get(&tid).copied())
                .map(|(now, then)| hvstats_host::task_stat::ticks_to_100ns(now.saturating_sub(then)));
            self.readings.insert(index, (counts, guest));
        }
        // An event is counted when it can be at all and is open on every vCPU thread known.
        let events = self.counters.events();
        self.counted = (0..events.len())
            .map(|i| {
                events.unavailable(i).is_none() && vm.threads().all(|(_, tid)| self.counters.is_open(tid, i))
            })
            .collect();
        Learned::holding(self.counters.fds())
    }
}

/// The guest time (clock ticks) of thread `tid` of `pid`.
fn guest_ticks(procfs: &Procfs, pid: i32, tid: i32) -> Option<u64> {
    hvstats_sources::thread_time::guest_ticks_of(procfs.root(), pid, tid).ok()
}
