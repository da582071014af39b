//! The VP counters kept from the VP thread itself: its CPU and guest time, its CPU wait and
//! dispatches (schedstat) and its migrations (a perf software event), written together so
//! Hypervisor run time is total less guest time of the same reading. An observed VM's vCPU thread
//! has the schedstat part ([`open_observed`]): its run time (and hypervisor time), CPU wait and
//! dispatches since the thread started, as the kernel keeps them.

use hvstats::SharedPage;
use hvstats_abi::catalog::{maintained_by, maintained_count};
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::source::{PerfSoftwareEvent, Source, SourceKind, ThreadTime};
use hvstats_abi::{Counter, ObjectKind};
use hvstats_host::sched::{SchedStat, SchedStatFile};

use super::counter_source::{
    CounterSource, Gives, Object, ObservedThread, Part, ReadUntilExit, VpSource, VpThread,
};
use super::host_faults::{FROM_HOST_FAULTS, Faults, write_host_faults};
use super::perf_sw::Migrations;
use super::thread_time::{ThreadClock, ThreadTimes};

/// The VP counters kept from the thread's clocks and perf software events.
const FROM_THREAD: [&Counter;
    maintained_count(ObjectKind::Vp, SourceKind::ThreadTime)
        + maintained_count(ObjectKind::Vp, SourceKind::PerfSoftware)] = {
    const T: usize = maintained_count(ObjectKind::Vp, SourceKind::ThreadTime);
    const P: usize = maintained_count(ObjectKind::Vp, SourceKind::PerfSoftware);
    let times: [&Counter; T] = maintained_by(ObjectKind::Vp, SourceKind::ThreadTime);
    let perf: [&Counter; P] = maintained_by(ObjectKind::Vp, SourceKind::PerfSoftware);
    let mut out = [&hvstats_abi::CATALOG[0]; T + P];
    let mut i = 0;
    while i < T + P {
        out[i] = if i < T { times[i] } else { perf[i - T] };
        i += 1;
    }
    out
};

/// The value a thread reading gives `counter`, if it gives one.
fn thread_value(
    counter: &Counter,
    times: Option<ThreadTimes>,
    sched: Option<SchedStat>,
    migrated: Option<u64>,
) -> Option<u64> {
    match counter.maintained.source()? {
        Source::ThreadTime(ThreadTime::Total) => times.map(|t| t.total_100ns),
        Source::ThreadTime(ThreadTime::Hypervisor) => times.map(ThreadTimes::hypervisor_100ns),
        Source::ThreadTime(ThreadTime::CpuWait) => sched.map(|s| s.wait_ns),
        Source::ThreadTime(ThreadTime::Dispatches) => sched.map(|s| s.dispatches),
        Source::PerfSoftware(PerfSoftwareEvent::CpuMigrations) => migrated,
        _ => None,
    }
}

/// Writes the counters of `only` a thread reading gives; one it lacks is left as it is.
pub fn write_thread_counts(
    page: &SharedPage,
    only: &CounterSet,
    times: Option<ThreadTimes>,
    sched: Option<SchedStat>,
    migrated: Option<u64>,
) {
    for counter in FROM_THREAD.iter().filter(|c| only.contains(c.id)) {
        if let Some(v) = thread_value(counter, times, sched, migrated) {
            page.set(counter.id, v);
        }
    }
}

/// The counters of [`FROM_THREAD`] whose source `has` says is there.
fn thread_gives(has: impl Fn(Source) -> bool) -> Gives {
    let mut vp = CounterSet::EMPTY;
    for counter in FROM_THREAD {
        if counter.maintained.source().is_some_and(&has) {
            vp.insert(counter.id);
        }
    }
    Gives::vp(vp)
}

/// The thread's clocks, schedstat and migrations, and their last reading.
#[derive(Debug)]
pub struct ThreadSource {
    clock: Option<ThreadClock>,
    times: Option<ThreadTimes>,
    sched: Option<SchedStatFile>,
    sched_stat: Option<SchedStat>,
    migrations: Option<Migrations>,
    migrated: Option<u64>,
    /// The thread ended: its last reading is kept (its tid may be reused).
    gone: bool,
}

impl ReadUntilExit for ThreadSource {
    fn read_thread(&mut self) {
        if let Some(t) = self.clock.as_ref().and_then(|c| c.read().ok()) {
            self.times = Some(t);
        }
        if let Some(m) = self.migrations.as_ref().and_then(|m| m.read().ok()) {
            self.migrated = Some(m);
        }
        if let Some(s) = self.sched.as_ref().and_then(|s| s.read().ok()) {
            self.sched_stat = Some(s);
        }
    }

    fn gone(&mut self) -> &mut bool {
        &mut self.gone
    }
}

impl CounterSource for ThreadSource {
    fn name(&self) -> &'static str {
        "thread"
    }

    fn gives(&self) -> Gives {
        thread_gives(|source| match source {
            Source::ThreadTime(ThreadTime::Total | ThreadTime::Hypervisor) => self.clock.is_some(),
            Source::ThreadTime(ThreadTime::CpuWait | ThreadTime::Dispatches) => self.sched.is_some(),
            Source::PerfSoftware(PerfSoftwareEvent::CpuMigrations) => self.migrations.is_some(),
            _ => false,
        })
    }

    fn write(&self, _object: Object, page: &SharedPage, only: &CounterSet) {
        write_thread_counts(page, only, self.times, self.sched_stat, self.migrated);
    }
}

/// The thread's sources (each one the host lacks is left out of the reading, not zero).
pub(super) fn open_source(vp: &VpThread) -> Option<Box<dyn VpSource>> {
    Some(Box::new(ThreadSource {
        clock: ThreadClock::open(vp.tid).ok(),
        times: None,
        sched: SchedStatFile::open(std::process::id() as libc::pid_t, vp.tid).ok(),
        sched_stat: None,
        migrations: Migrations::open(vp.tid).ok(),
        migrated: None,
        gone: false,
    }))
}

/// An observed vCPU thread's run time, hypervisor time, CPU wait and dispatches, and the host's
/// page faults on it, as the kernel keeps them from the thread's start (`schedstat`, and the
/// guest time and fault counts of its `stat`, each file read once a refresh): nothing is taken
/// off at attach, so a new observer continues where the last one left, and nothing is lost
/// while none runs.
#[derive(Debug)]
pub struct ObservedSched {
    /// The thread's `schedstat`, opened for each reading (no descriptor held per vCPU thread).
    path: std::path::PathBuf,
    /// The thread's `stat`, for its guest time and faults.
    stat: std::path::PathBuf,
    sched: Option<SchedStat>,
    times: Option<ThreadTimes>,
    faults: Option<Faults>,
}

impl ObservedSched {
    /// The thread's times from one `schedstat` reading (its run time, less its guest time so
    /// far) and its faults, from one reading of its `stat`.
    fn read_stat(&self, sched: &SchedStat) -> (Option<ThreadTimes>, Option<Faults>) {
        let mut buf = [0u8; hvstats_host::task_stat::STAT_MAX];
        let Ok(file) = hvstats_host::task_stat::StatFile::open(&self.stat) else { return (None, None) };
        let Ok(line) = file.read(&mut buf) else { return (None, None) };
        let times = line.guest_ticks().map(|guest_ticks| ThreadTimes {
            total_100ns: sched.run_ns / 100,
            guest_100ns: hvstats_host::task_stat::ticks_to_100ns(guest_ticks),
        });
        (times, Faults::of(&line))
    }
}

impl CounterSource for ObservedSched {
    fn name(&self) -> &'static str {
        "thread"
    }

    fn gives(&self) -> Gives {
        let mut gives = thread_gives(|source| match source {
            Source::ThreadTime(ThreadTime::CpuWait | ThreadTime::Dispatches) => true,
            Source::ThreadTime(ThreadTime::Total | ThreadTime::Hypervisor) => self.times.is_some(),
            _ => false,
        });
        if self.faults.is_some() {
            gives.vp = gives.vp.union(&CounterSet::of(&FROM_HOST_FAULTS.map(|c| c.id)));
        }
        gives
    }

    fn write(&self, _object: Object, page: &SharedPage, only: &CounterSet) {
        write_thread_counts(page, only, self.times, self.sched, None);
        if let Some(faults) = self.faults {
            write_host_faults(page, only, faults);
        }
    }
}

impl VpSource for ObservedSched {
    fn part(&self) -> Part {
        Part::Times
    }

    fn read(&mut self) {
        let Ok(now) = SchedStatFile::open_path(&self.path).and_then(|f| f.read()) else { return };
        // A reading that went back is not the same thread's: the last is kept.
        if self.sched.is_some_and(|was| now.since(&was).is_none()) {
            return;
        }
        self.sched = Some(now);
        let (times, faults) = self.read_stat(&now);
        self.times = times.or(self.times);
        self.faults = faults.or(self.faults);
    }
}

/// An observed vCPU thread's accounting from one walk of the kernel's task iterator
/// (`hvstats_host::bpf::task_iter`): what [`ObservedSched`] reads from its `schedstat` and
/// `stat`, and its migrations, all from the thread's start, read for every thread of the VMM at
/// once. Its guest time is the kernel's in nanoseconds (`stat` rounds it to clock ticks).
#[derive(Clone, Copy, Debug)]
pub struct IteratedThread(pub hvstats_host::bpf::task_iter::TaskSched);

impl CounterSource for IteratedThread {
    fn name(&self) -> &'static str {
        "thread-iter"
    }

    fn gives(&self) -> Gives {
        let mut gives = thread_gives(|source| {
            matches!(
                source,
                Source::ThreadTime(
                    ThreadTime::Total | ThreadTime::Hypervisor | ThreadTime::CpuWait | ThreadTime::Dispatches
                ) | Source::PerfSoftware(PerfSoftwareEvent::CpuMigrations)
            )
        });
        gives.vp = gives.vp.union(&CounterSet::of(&FROM_HOST_FAULTS.map(|c| c.id)));
        gives
    }

    fn write(&self, _object: Object, page: &SharedPage, only: &CounterSet) {
        let t = self.0;
        let times = ThreadTimes { total_100ns: t.run_ns / 100, guest_100ns: t.guest_ns / 100 };
        let sched = SchedStat { run_ns: t.run_ns, wait_ns: t.wait_ns, dispatches: t.dispatches };
        write_thread_counts(page, only, Some(times), Some(sched), Some(t.migrations));
        write_host_faults(page, only, Faults { minor: t.minor_faults, major: t.major_faults });
    }
}

/// The schedstat of an observed vCPU thread, counted from the thread's start (`None` when it
/// cannot be read).
pub(super) fn open_observed(thread: ObservedThread<'_>) -> Option<Box<dyn VpSource>> {
    let path = hvstats_host::sched::path_under(thread.procfs, thread.pid, thread.tid);
    let stat = hvstats_host::task_stat::thread_path(thread.procfs, thread.pid, thread.tid);
    let mut source = ObservedSched { path, stat, sched: None, times: None, faults: None };
    source.read();
    source.sched.is_some().then(|| Box::new(source) as Box<dyn VpSource>)
}
