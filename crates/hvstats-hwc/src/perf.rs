//! Guest cycles and instructions retired of one VP thread, through perf, under an allocation.
//!
//! A VP may count with the PMU only through an allocation that covers every processor its thread
//! may run on and holds at least two counters there (or the whole PMU), so hvstats never
//! oversubscribes the PMU and never turns exact counts into multiplexed estimates. The events are
//! `PERF_TYPE_HARDWARE` cycles and instructions with `exclude_host`, so only guest execution counts.
//! Where that is impossible the answer is [`Unavailable`] with the reason, never zeros.

use std::io;

use hvstats_host::perf_event::{HW_CPU_CYCLES, HW_INSTRUCTIONS, PerfCounter, TYPE_HARDWARE};

use super::allocator::{Allocator, CounterSetHandle};
use super::cpuset::CpuSet;
use super::pmu::PmuError;
use super::table::TableError;

/// Why a VP cannot have hardware counters.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    /// There is no PMU.
    #[error("no PMU")]
    NoPmu(#[source] PmuError),
    /// The handle is not held.
    #[error("hardware counter allocation {0} is not held")]
    NotAllocated(CounterSetHandle),
    /// The allocation does not cover every processor the thread may run on.
    #[error("allocation {handle} holds CPUs {held} but the thread may run on CPUs {allowed}")]
    NotCovered {
        /// The allocation the thread's counters were asked under.
        handle: CounterSetHandle,
        /// The CPUs the allocation holds counters on.
        held: CpuSet,
        /// The CPUs the thread may run on (its affinity mask).
        allowed: CpuSet,
    },
    /// The allocation holds fewer than two counters and not the whole PMU.
    #[error("allocation {0} holds fewer than the two counters needed (cycles, instructions)")]
    TooFewCounters(CounterSetHandle),
    /// The table cannot be used.
    #[error(transparent)]
    Table(#[from] TableError),
    /// The thread's affinity cannot be read.
    #[error("cannot read the affinity of thread {tid}: {source}")]
    Affinity {
        /// The thread (Linux tid) whose affinity was asked for.
        tid: i32,
        /// The `sched_getaffinity` error (`ESRCH` when the thread has exited).
        #[source]
        source: io::Error,
    },
    /// The kernel refused the event.
    #[error("perf_event_open({event}, exclude_host) failed: {source}")]
    Perf {
        /// Which hardware event: `cycles` or `instructions`.
        event: &'static str,
        /// The cause (ENOENT where there is no hardware PMU).
        #[source]
        source: io::Error,
    },
}

/// Guest-only counts of one thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestCounts {
    /// CPU cycles spent in the guest.
    pub cycles: u64,
    /// Instructions retired in the guest.
    pub instructions: u64,
}

/// Guest cycles and instructions retired of one VP thread.
#[derive(Debug)]
pub struct VpHardwareCounters {
    handle: CounterSetHandle,
    cycles: PerfCounter,
    instructions: PerfCounter,
}

/// The processors thread `tid` may run on (0 = the calling thread).
fn thread_affinity(tid: i32) -> io::Result<CpuSet> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes at most size_of::<cpu_set_t>() bytes into set, which we own.
    let rc = unsafe { libc::sched_getaffinity(tid, size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let cpus = 8 * size_of::<libc::cpu_set_t>();
    // SAFETY: CPU_ISSET reads a bit of our set below its size.
    Ok((0..cpus).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).map(|c| c as u32).collect())
}

impl VpHardwareCounters {
    /// Opens guest cycles and instructions of thread `tid` (0 = the calling thread) under the
    /// allocation `handle`.
    ///
    /// # Errors
    /// [`Unavailable`] with the reason: no PMU, the handle not held, not covering the thread's
    /// processors or holding too few counters, or perf refusing the events.
    pub fn open(allocator: &Allocator, handle: CounterSetHandle, tid: i32) -> Result<Self, Unavailable> {
        if let Some(reason) = allocator.pmu().absent_reason() {
            return Err(Unavailable::NoPmu(reason.clone()));
        }
        let allocation = allocator.allocation(handle)?.ok_or(Unavailable::NotAllocated(handle))?;
        let processors = CpuSet::first(allocator.pmu().processors());
        let allowed: CpuSet = thread_affinity(tid)
            .map_err(|source| Unavailable::Affinity { tid, source })?
            .iter()
            .filter(|&c| processors.contains(c))
            .collect();
        if !allocation.cpus.is_superset(&allowed) {
            return Err(Unavailable::NotCovered { handle, held: allocation.cpus, allowed });
        }
        let r = &allocation.resources;
        if !r.exclusive && r.counters.count_ones() < 2 {
            return Err(Unavailable::TooFewCounters(handle));
        }
        let open = |config, event| {
            PerfCounter::open_guest_only(TYPE_HARDWARE, config, tid)
                .map_err(|source| Unavailable::Perf { event, source })
        };
        let cycles = open(HW_CPU_CYCLES, "cycles")?;
        let instructions = open(HW_INSTRUCTIONS, "instructions")?;
        Ok(Self { handle, cycles, instructions })
    }

    /// The allocation the counters run under.
    pub fn handle(&self) -> CounterSetHandle {
        self.handle
    }

    /// Reads both counts.
    ///
    /// # Errors
    /// When a counter cannot be read.
    pub fn read(&mut self) -> io::Result<GuestCounts> {
        Ok(GuestCounts { cycles: self.cycles.read()?, instructions: self.instructions.read()? })
    }
}
