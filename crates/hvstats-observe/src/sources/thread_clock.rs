//! The event writer of a vCPU thread's clocks: its CPU time (the task clock, counted from
//! attach), its hypervisor time (CPU time less guest time of the same moment) and its
//! migrations between host CPUs. Another process's thread clock cannot be read, so these are
//! perf software events on the thread.

use hvstats::SharedPage;
use hvstats_abi::ObjectKind;
use hvstats_abi::catalog::{Maintained, observed};
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::source::{PerfSoftwareEvent, Source, ThreadTime};

use super::event_writer::{EventWriter, KvmExitState, ThreadReading};
use crate::counting::{EventSpec, SW_CPU_MIGRATIONS, SW_TASK_CLOCK};
use hvstats_sources::counter_source::Gives;

/// Its events: the task clock (nanoseconds), then migrations.
const TASK_CLOCK: usize = 0;
const MIGRATIONS: usize = 1;

/// The event of `source`, when it is one of this writer's.
fn event_of(source: Source) -> Option<usize> {
    match source {
        Source::ThreadTime(ThreadTime::Total | ThreadTime::Hypervisor) => Some(TASK_CLOCK),
        Source::PerfSoftware(PerfSoftwareEvent::CpuMigrations) => Some(MIGRATIONS),
        _ => None,
    }
}

/// The thread's clocks.
#[derive(Debug)]
pub struct ThreadClock;

impl EventWriter for ThreadClock {
    fn events(&self, _isa: Option<u32>) -> Vec<EventSpec> {
        vec![EventSpec::Software(SW_TASK_CLOCK), EventSpec::Software(SW_CPU_MIGRATIONS)]
    }

    fn gives(&self, counted: &dyn Fn(usize) -> bool, _kvm_exit: KvmExitState) -> Gives {
        Gives::vp(CounterSet::of_kind(ObjectKind::Vp, |c| {
            observed(c).and_then(Maintained::source).and_then(event_of).is_some_and(counted)
        }))
    }

    fn write(&self, reading: &ThreadReading<'_>, page: &SharedPage, only: &CounterSet) {
        for counter in hvstats_abi::catalog::counters_of(ObjectKind::Vp).filter(|c| only.contains(c.id)) {
            let value = match observed(counter).and_then(Maintained::source) {
                Some(Source::ThreadTime(ThreadTime::Total)) => reading.count(TASK_CLOCK).map(|ns| ns / 100),
                Some(Source::ThreadTime(ThreadTime::Hypervisor)) => reading
                    .count(TASK_CLOCK)
                    .map(|ns| (ns / 100).saturating_sub(reading.guest_100ns.unwrap_or(0))),
                Some(Source::PerfSoftware(PerfSoftwareEvent::CpuMigrations)) => reading.count(MIGRATIONS),
                _ => None,
            };
            if let Some(v) = value {
                page.set(counter.id, v);
            }
        }
    }
}
