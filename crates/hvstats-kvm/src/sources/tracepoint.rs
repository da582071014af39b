//! Per-thread perf tracepoint counters of KVM's events (`kvm:kvm_cpuid`, `kvm:kvm_msr`, …).
//!
//! KVM has no per-reason exit counters, but its tracepoints fire once per intercept it handles in
//! the kernel, on the vCPU's thread. A counting perf event per tracepoint, opened for the VP thread,
//! gives exact counts without tracing anything to a buffer. The event ids live in tracefs, which is
//! mounted at `/sys/kernel/tracing` when it is absent (that needs root); when that is impossible the
//! counters are unavailable and the reason is kept, never guessed.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use hvstats::perf_event::{PerfCounter, TYPE_TRACEPOINT};
use hvstats_abi::apic;

use crate::sys;

pub use hvstats_abi::source::Tracepoint;

/// The ftrace filter that narrows `tp`'s event, if any, written from the ABI's APIC facts.
pub fn filter(tp: Tracepoint) -> Option<String> {
    // kvm_mmio type: 0 unsatisfied read (the read is then traced again), 1 read, 2 write.
    let (page, end) = (apic::APIC_BASE, apic::APIC_BASE + apic::APIC_PAGE_SIZE);
    match tp {
        Tracepoint::ApicMmio => Some(format!("gpa >= {page:#x} && gpa < {end:#x} && type != 0")),
        Tracepoint::ApicTpr => Some(format!("gpa == {:#x} && type != 0", apic::APIC_TPR)),
        Tracepoint::ApicEoi => Some(format!("gpa == {:#x} && type == 2", apic::APIC_EOI)),
        // x2APIC registers are MSRs 0x800 + offset / 16 (kvm_msr write: 1 for WRMSR).
        Tracepoint::X2apicTpr => Some(format!("ecx == {:#x}", apic::X2APIC_TPR_MSR)),
        Tracepoint::X2apicEoi => Some(format!("ecx == {:#x} && write == 1", apic::X2APIC_EOI_MSR)),
        // Destination shorthand (ICR bits 19:18) = 01, "self".
        Tracepoint::ApicSelfIpi => Some(format!(
            "(icr_low & {}) && !(icr_low & {})",
            apic::ICR_SELF,
            apic::ICR_SHORTHAND_MASK & !apic::ICR_SELF
        )),
        _ => None,
    }
}

/// Why tracefs, and with it every tracepoint counter, is unavailable.
#[derive(Debug, thiserror::Error)]
pub enum TracefsError {
    /// It is not mounted, and mounting it failed (mounting needs root).
    #[error("tracefs is not mounted and mounting it at /sys/kernel/tracing failed")]
    Mount(#[source] io::Error),
    /// It is mounted but has no KVM events.
    #[error("tracefs has no kvm events (is the kvm module loaded?)")]
    NoKvmEvents,
}

/// Why one tracepoint counter is unavailable.
#[derive(Debug, thiserror::Error)]
pub enum TracepointError {
    /// tracefs is unavailable.
    #[error(transparent)]
    Tracefs(&'static TracefsError),
    /// The event's id cannot be read.
    #[error("{}: {source}", path.display())]
    EventId {
        /// The id file.
        path: PathBuf,
        /// The read error.
        #[source]
        source: io::Error,
    },
    /// The event's id file does not hold a number.
    #[error("{}: not a number", path.display())]
    EventIdFormat {
        /// The id file.
        path: PathBuf,
    },
    /// perf_event_open refused the counter.
    #[error("perf_event_open of kvm:{event}: {source}")]
    Open {
        /// The event.
        event: &'static str,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
    /// The kernel refused the event's filter.
    #[error("filter {filter:?} on kvm:{event}: {source}")]
    Filter {
        /// The filter.
        filter: String,
        /// The event.
        event: &'static str,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
}

/// Where tracefs is, mounting it when needed.
///
/// # Errors
/// Why it is unavailable (found once per process).
pub fn tracefs() -> Result<&'static Path, &'static TracefsError> {
    static ROOT: OnceLock<Result<PathBuf, TracefsError>> = OnceLock::new();
    ROOT.get_or_init(find_or_mount).as_ref().map(|p| p.as_path())
}

fn find_or_mount() -> Result<PathBuf, TracefsError> {
    for root in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if Path::new(root).join("events/kvm").is_dir() {
            return Ok(PathBuf::from(root));
        }
    }
    let target = c"/sys/kernel/tracing";
    // SAFETY: all arguments are NUL-terminated literals; a null data pointer is allowed.
    let r = unsafe {
        libc::mount(c"tracefs".as_ptr(), target.as_ptr(), c"tracefs".as_ptr(), 0, std::ptr::null())
    };
    sys::check(r).map_err(TracefsError::Mount)?;
    let root = PathBuf::from("/sys/kernel/tracing");
    if root.join("events/kvm").is_dir() { Ok(root) } else { Err(TracefsError::NoKvmEvents) }
}

fn event_id(tp: Tracepoint) -> Result<u64, TracepointError> {
    let root = tracefs().map_err(TracepointError::Tracefs)?;
    let path = root.join("events/kvm").join(tp.event()).join("id");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(source) => return Err(TracepointError::EventId { path, source }),
    };
    text.trim().parse().map_err(|_| TracepointError::EventIdFormat { path })
}

/// Words of a group read of every tracepoint: `nr`, then a value and an id per event.
const GROUP_WORDS: usize = 1 + 2 * Tracepoint::ALL.len();

/// One reading of every tracepoint counter of a VP, by [`Tracepoint::index`]; `None` where the
/// counter is unavailable or could not be read.
pub type TracepointCounts = [Option<u64>; Tracepoint::ALL.len()];

/// An open tracepoint counter: a member of the VP's group (read with the group, found in it by
/// its id), or on its own when the group could not take it.
#[derive(Debug)]
enum Counter {
    Grouped { counter: PerfCounter, id: u64 },
    Alone(PerfCounter),
}

/// The tracepoint counters of one VP thread, in one perf event group (the first counter that
/// opens is the leader), so that a single `read` gives all of them.
#[derive(Debug)]
pub struct VpTracepoints {
    counters: Vec<Result<Counter, TracepointError>>,
    /// Index in `counters` of the group leader, if any counter opened.
    leader: Option<usize>,
}

impl VpTracepoints {
    /// Opens every tracepoint counter for thread `tid`; a counter that cannot be opened keeps the
    /// reason.
    pub fn open(tid: libc::pid_t) -> Self {
        let mut counters: Vec<Result<Counter, TracepointError>> = Vec::with_capacity(Tracepoint::ALL.len());
        let mut leader: Option<usize> = None;
        for tp in Tracepoint::ALL {
            let group = leader.and_then(|i| match &counters[i] {
                Ok(Counter::Grouped { counter, .. }) => Some(counter),
                _ => None,
            });
            let opened = Self::open_one(tp, tid, group);
            if leader.is_none() && matches!(opened, Ok(Counter::Grouped { .. })) {
                leader = Some(counters.len());
            }
            counters.push(opened);
        }
        Self { counters, leader }
    }

    fn open_one(
        tp: Tracepoint,
        tid: libc::pid_t,
        leader: Option<&PerfCounter>,
    ) -> Result<Counter, TracepointError> {
        let id = event_id(tp)?;
        let open_err = |source| TracepointError::Open { event: tp.event(), source };
        let counter = match PerfCounter::open_in_group(TYPE_TRACEPOINT, id, tid, leader) {
            Ok(c) => match c.id() {
                Ok(event) => Counter::Grouped { counter: c, id: event },
                // Without its id its value cannot be found in a group read: count it alone.
                Err(_) => Counter::Alone(PerfCounter::open(TYPE_TRACEPOINT, id, tid).map_err(open_err)?),
            },
            // A group that cannot take it (never expected for tracepoints): count it alone.
            Err(_) if leader.is_some() => {
                Counter::Alone(PerfCounter::open(TYPE_TRACEPOINT, id, tid).map_err(open_err)?)
            }
            Err(e) => return Err(open_err(e)),
        };
        if let Some(f) = filter(tp) {
            let c = match &counter {
                Counter::Grouped { counter, .. } | Counter::Alone(counter) => counter,
            };
            if let Err(source) = c.set_filter(&f) {
                return Err(TracepointError::Filter { filter: f, event: tp.event(), source });
            }
        }
        Ok(counter)
    }

    /// Every count at one moment: the group with one `read`, plus any counter outside it.
    pub fn read_all(&self) -> TracepointCounts {
        let mut counts: TracepointCounts = [None; Tracepoint::ALL.len()];
        let mut buf = [0u64; GROUP_WORDS];
        let group = match self.leader.map(|i| &self.counters[i]) {
            Some(Ok(Counter::Grouped { counter, .. })) => counter.read_group(&mut buf).ok(),
            _ => None,
        };
        // `{ nr, { value, id }[nr] }`: the pairs actually returned.
        let pairs = group.map_or(&[][..], |words| {
            let nr = (buf[0] as usize).min((words.saturating_sub(1)) / 2);
            &buf[1..1 + 2 * nr]
        });
        for (count, counter) in counts.iter_mut().zip(&self.counters) {
            *count = match counter {
                Ok(Counter::Grouped { id, .. }) => pairs.chunks_exact(2).find(|p| p[1] == *id).map(|p| p[0]),
                Ok(Counter::Alone(c)) => c.read().ok(),
                Err(_) => None,
            };
        }
        counts
    }

    /// The count of `tp`, or `None` when it is unavailable or cannot be read now.
    pub fn read(&self, tp: Tracepoint) -> Option<u64> {
        self.read_all()[tp.index()]
    }

    /// Why `tp` is unavailable, if it is.
    pub fn unavailable(&self, tp: Tracepoint) -> Option<&TracepointError> {
        self.counters[tp.index()].as_ref().err()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_written_from_the_apic_facts_are_the_ones_kvm_was_given_before() {
        let f = |tp| filter(tp).unwrap_or_default();
        assert_eq!(f(Tracepoint::ApicMmio), "gpa >= 0xfee00000 && gpa < 0xfee01000 && type != 0");
        assert_eq!(f(Tracepoint::ApicTpr), "gpa == 0xfee00080 && type != 0");
        assert_eq!(f(Tracepoint::ApicEoi), "gpa == 0xfee000b0 && type == 2");
        assert_eq!(f(Tracepoint::ApicSelfIpi), "(icr_low & 262144) && !(icr_low & 524288)");
        assert_eq!(f(Tracepoint::X2apicTpr), "ecx == 0x808");
        assert_eq!(f(Tracepoint::X2apicEoi), "ecx == 0x80b && write == 1");
        assert_eq!(filter(Tracepoint::Cpuid), None);
    }
}
