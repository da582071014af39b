//! Per-thread counting of a list of events on every thread of another process.
//!
//! A VM attached while paused must be counted exactly from its first instruction, before anyone
//! knows which thread runs which vCPU. So the observer opens its counters on every thread of the
//! process at attach, opens them on threads that appear later as soon as it sees them, and lets
//! the caller attribute a thread's counts to a vCPU once that is known — the counts are then the
//! thread's whole history since attach. Threads that turn out not to run a vCPU are closed
//! ([`ThreadCounters::retain`]) to keep the descriptors per VM bounded.
//!
//! The engine is `hvstats_host::counting` (one per thread, in the kernel where BPF is permitted,
//! perf counters otherwise), the same our own VPs' tracepoints are counted with; it is tested on
//! this machine with tracepoints that fire without KVM (`syscalls:sys_enter_getppid`).

use std::collections::BTreeMap;
use std::io;

use hvstats_host::bpf::VmToken;
use hvstats_host::counting::ThreadEvents;
pub use hvstats_host::counting::{EventList, EventSpec, InKernelError, Method};
pub use hvstats_host::perf_event::{SW_CPU_MIGRATIONS, SW_TASK_CLOCK};

use super::discovery::Procfs;

/// The event counters on every thread of one process, from attach on.
#[derive(Debug)]
pub struct ThreadCounters {
    pid: i32,
    events: EventList,
    threads: Threads,
    /// Once set, only these threads are counted (new threads are ignored).
    only: Option<Vec<i32>>,
    /// The most threads counted before [`retain`](Self::retain) narrows the set.
    max_threads: usize,
    /// Threads counted before others when not all fit (the likely vCPU threads).
    first: Vec<i32>,
    /// Threads seen at the last scan and not counted (over `max_threads`).
    left_out: usize,
    /// The VM object the process runs, as kept counts name it (0: not told).
    vm: VmToken,
    /// Moves whenever a thread's counters are opened or closed: what is worked out from the
    /// counters open (which events each thread counts, since when, by which method) holds until
    /// it moves.
    generation: u64,
}

/// The counted threads' counters, by ascending thread id: a VMM's few vCPU threads in one small
/// vector rather than a map's nodes.
#[derive(Debug, Default)]
struct Threads(Vec<(i32, ThreadEvents)>);

impl Threads {
    fn at(&self, tid: i32) -> Result<usize, usize> {
        self.0.binary_search_by_key(&tid, |(t, _)| *t)
    }

    fn get(&self, tid: i32) -> Option<&ThreadEvents> {
        self.at(tid).ok().map(|i| &self.0[i].1)
    }

    fn get_mut(&mut self, tid: i32) -> Option<&mut ThreadEvents> {
        self.at(tid).ok().map(|i| &mut self.0[i].1)
    }

    /// Counts `tid` with `events` (replacing any counters it had).
    fn insert(&mut self, tid: i32, events: ThreadEvents) {
        match self.at(tid) {
            Ok(i) => self.0[i].1 = events,
            Err(i) => self.0.insert(i, (tid, events)),
        }
    }
}

impl ThreadCounters {
    /// Opens the counters of `events` on every thread of `pid` now.
    ///
    /// # Errors
    /// When the process's threads cannot be listed.
    pub fn attach(procfs: &Procfs, pid: i32, events: EventList) -> io::Result<Self> {
        Self::attach_at_most(procfs, pid, events, usize::MAX, &[])
    }

    /// Opens the counters of `events` on at most `max_threads` threads of `pid` now and at later
    /// scans: the threads of `first` before the others, then by ascending thread id.
    ///
    /// # Errors
    /// When the process's threads cannot be listed.
    pub(crate) fn attach_at_most(
        procfs: &Procfs,
        pid: i32,
        events: EventList,
        max_threads: usize,
        first: &[i32],
    ) -> io::Result<Self> {
        Self::attach_in_vm(procfs, pid, events, (max_threads, first), 0)
    }

    /// As [`attach_at_most`](Self::attach_at_most) (`max_threads` and `first` as a pair), the
    /// process running the VM object `vm`: a kept row of one of its threads is adopted only for
    /// that VM.
    ///
    /// # Errors
    /// When the process's threads cannot be listed.
    pub(crate) fn attach_in_vm(
        procfs: &Procfs,
        pid: i32,
        events: EventList,
        (max_threads, first): (usize, &[i32]),
        vm: VmToken,
    ) -> io::Result<Self> {
        let mut me = Self {
            pid,
            events,
            threads: Threads::default(),
            only: None,
            max_threads,
            first: first.to_vec(),
            left_out: 0,
            vm,
            generation: 0,
        };
        me.rescan(procfs)?;
        Ok(me)
    }

    /// Opens counters on threads that appeared since the last scan (unless [`retain`] has
    /// narrowed the set), up to the limit; returns how many were added.
    ///
    /// # Errors
    /// When the process's threads cannot be listed (it is gone).
    ///
    /// [`retain`]: Self::retain
    pub fn rescan(&mut self, procfs: &Procfs) -> io::Result<usize> {
        if self.only.is_some() {
            return Ok(0);
        }
        let mut listed: Vec<i32> = procfs.threads(self.pid)?.into_iter().map(|t| t.tid).collect();
        listed.sort_by_key(|tid| (!self.first.contains(tid), *tid));
        let (mut added, mut left_out) = (0, 0);
        for tid in listed {
            if self.threads.get(tid).is_some() {
                continue;
            }
            if self.threads.0.len() >= self.max_threads {
                left_out += 1;
                continue;
            }
            self.threads.insert(tid, ThreadEvents::open_in(self.pid, tid, self.vm, &self.events));
            added += 1;
        }
        self.generation += (added > 0) as u64;
        self.left_out = left_out;
        Ok(added)
    }

    /// Threads of the process the last scan did not count because of the limit.
    pub fn left_out(&self) -> usize {
        self.left_out
    }

    /// Keeps counting only `tids` and closes every other thread's counters; a thread of `tids`
    /// not counted yet (left out by the limit) is counted from now on; threads that appear later
    /// are not counted.
    pub fn retain(&mut self, tids: &[i32]) {
        self.threads.0.retain(|(tid, _)| tids.contains(tid));
        for tid in tids {
            if self.threads.get(*tid).is_none() {
                self.threads.insert(*tid, ThreadEvents::open_in(self.pid, *tid, self.vm, &self.events));
            }
        }
        // The threads counted from now on are all there will be.
        self.threads.0.shrink_to_fit();
        self.generation += 1;
        self.only = Some(tids.to_vec());
        self.left_out = 0;
    }

    /// True once [`retain`](Self::retain) has narrowed the set.
    pub(crate) fn is_narrowed(&self) -> bool {
        self.only.is_some()
    }

    /// A number that moves whenever a thread's counters are opened or closed (see
    /// [`open_on_all`](Self::open_on_all), [`kept_since_of`](Self::kept_since_of) and
    /// [`past_engine_rows`](Self::past_engine_rows), which hold while it does not).
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// The threads counted, ascending.
    pub fn tids(&self) -> Vec<i32> {
        self.threads.0.iter().map(|(tid, _)| *tid).collect()
    }

    /// The counts of thread `tid` since attach (or since it was first seen), by event index;
    /// `None` for an event that is unavailable. `None` when the thread is not counted.
    pub fn read(&mut self, tid: i32) -> Option<&[Option<u64>]> {
        let events = &self.events;
        self.threads.get_mut(tid).map(|t| t.read(events))
    }

    /// Reads the counts of each `(index, tid)` of `threads`, keeping them in the thread's
    /// counters ([`last`](Self::last)); `read` is left holding those that are counted, in order.
    pub(crate) fn read_threads(
        &mut self,
        threads: impl IntoIterator<Item = (u32, i32)>,
        read: &mut Vec<(u32, i32)>,
    ) {
        read.clear();
        for (index, tid) in threads {
            if self.read(tid).is_some() {
                read.push((index, tid));
            }
        }
    }

    /// The counts of thread `tid` at its last read, by event; `None` when it is not counted.
    pub(crate) fn last(&self, tid: i32) -> Option<&[Option<u64>]> {
        self.threads.get(tid).map(ThreadEvents::last)
    }

    /// Reads the counts of each `(index, tid)` of `threads` into `readings` by index, reusing the
    /// vectors already there (a refresh allocates none once the threads are known); an index
    /// whose thread is not counted has none.
    pub(crate) fn read_each(
        &mut self,
        threads: impl IntoIterator<Item = (u32, i32)>,
        readings: &mut BTreeMap<u32, Vec<Option<u64>>>,
    ) {
        let mut before = std::mem::take(readings);
        for (index, tid) in threads {
            let Some(counts) = self.read(tid) else { continue };
            let mut reading = before.remove(&index).unwrap_or_default();
            reading.clear();
            reading.extend_from_slice(counts);
            readings.insert(index, reading);
        }
    }

    /// True when event `i` is open on thread `tid` (it may fail to open on one thread and not
    /// another: a thread gone meanwhile, or not ours to count).
    pub fn is_open(&self, tid: i32, i: usize) -> bool {
        self.threads.get(tid).is_some_and(|t| t.is_open(&self.events, i))
    }

    /// Sets `counted` to say, by event, whether it is counted on every thread of `tids`: it can
    /// be counted at all, and it is open on each of them (a thread not counted has none open).
    /// Each thread is looked up once, and `counted` keeps its allocation.
    pub(crate) fn open_on_all(&self, tids: impl IntoIterator<Item = i32>, counted: &mut Vec<bool>) {
        let events = &self.events;
        counted.clear();
        counted.extend((0..events.len()).map(|i| events.unavailable(i).is_none()));
        for tid in tids {
            match self.threads.get(tid) {
                Some(t) => counted.iter_mut().enumerate().for_each(|(i, c)| *c &= t.is_open(events, i)),
                None => counted.iter_mut().for_each(|c| *c = false),
            }
        }
    }

    /// Perf file descriptors held for the threads (the in-kernel tally's few descriptors are
    /// shared by every list of the same events, and not counted here).
    pub fn fds(&self) -> usize {
        self.threads.0.iter().map(|(_, t)| t.fds()).sum()
    }

    /// Since when the in-kernel counts of `tids` count (µs since the epoch), when every one of
    /// them is counted and kept beyond this observer: the latest, so that a thread counted anew
    /// (its earlier counts lost) moves it.
    pub fn kept_since_of(&self, tids: impl IntoIterator<Item = i32>) -> Option<u64> {
        let mut since: Option<u64> = None;
        for tid in tids {
            let s = self.threads.get(tid)?.kept_since()?;
            since = Some(since.map_or(s, |x| x.max(s)));
        }
        since
    }

    /// Of `tids`, the threads counted by perf counters for want of a row in the in-kernel engine
    /// (none unless the list counts in the kernel).
    pub(crate) fn past_engine_rows(&self, tids: impl IntoIterator<Item = i32>) -> usize {
        if self.events.method() != hvstats_host::counting::Method::InKernel {
            return 0;
        }
        tids.into_iter().filter(|tid| self.threads.get(*tid).is_some_and(|t| !t.in_engine())).count()
    }

    /// The events.
    pub fn events(&self) -> &EventList {
        &self.events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_past_the_engines_rows_are_told_from_those_counted_in_the_kernel() {
        let spec = EventSpec::Tracepoint {
            system: "syscalls".into(),
            name: "sys_enter_getppid".into(),
            filter: None,
        };
        let events = EventList::with_rows(vec![spec], 2);
        if events.method() != Method::InKernel {
            assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "{}", events.method_description());
            return;
        }
        // This process's threads (the test harness's and three parked here): two get a row.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
        let parked: Vec<_> = (0..3)
            .map(|_| {
                let rx = rx.clone();
                std::thread::spawn(move || {
                    let _ = rx.lock().map(|r| r.recv());
                })
            })
            .collect();
        let pid = std::process::id() as i32;
        let counters = ThreadCounters::attach(&Procfs::host(), pid, events).unwrap();
        let tids = counters.tids();
        assert!(tids.len() >= 4, "{tids:?}");
        assert_eq!(counters.past_engine_rows(tids.iter().copied()), tids.len() - 2);
        assert_eq!(counters.past_engine_rows(tids[..2].iter().copied()), 0, "the first two have rows");
        assert!(counters.fds() <= tids.len() - 2, "one perf counter at most a thread past the rows");
        drop(counters);
        for _ in &parked {
            tx.send(()).unwrap();
        }
        parked.into_iter().for_each(|t| t.join().unwrap());
    }
}
