//! The sources of our VPs' counters beyond the run loop: what KVM, perf and procfs know about a
//! VP that the run loop does not see (intercepts handled inside KVM, CPU time, migrations, the
//! host's page faults).
//!
//! Each is one file on the seam of [`counter_source`]: it declares the counters it gives and
//! writes them from a reading, reading the host through `hvstats_host` (tracefs, perf groups,
//! `stat` lines, schedstat). A VP's sources are the list [`open_all`] makes, in the order that
//! decides which writes a counter several give; the KVM backend's `VpSources` merges them into
//! the VP's page and derives what the VP lacks from what they declare. The sources that read a
//! thread from outside its process (its schedstat, the host's page faults on it) serve observed
//! VMs' vCPU threads too ([`OBSERVED_THREAD_SOURCES`]); the observer composes those with an
//! observed VM's own sources (`hvstats_observe::sources`).

#![deny(missing_docs)]

pub mod counter_source;
pub mod host_faults;
pub mod kvm_stats;
pub mod perf_sw;
pub mod thread;
pub mod thread_time;
pub mod tracepoint;
pub mod user_exits;
pub mod vcpu_stats;

use counter_source::{Composition, ObservedThread, VpSource, VpThread};

/// How one source of our VPs is opened (`None` where the host cannot give it at all).
type Open = fn(&VpThread) -> Option<Box<dyn VpSource>>;

/// Every source of our VPs' counters, in the order a merge reads them (and the order that
/// decides which writes a counter several give).
const SOURCES: &[Open] =
    &[tracepoint::open_source, vcpu_stats::open_source, thread::open_source, host_faults::open_source];

/// Opens every source for `vp`.
pub fn open_all(vp: &VpThread) -> Composition<dyn VpSource> {
    Composition::new(SOURCES.iter().filter_map(|open| open(vp)).collect())
}

/// How one source is opened for an observed VM's vCPU thread.
type OpenObserved = for<'a> fn(ObservedThread<'a>) -> Option<Box<dyn VpSource>>;

/// The sources that read a thread from outside its process, opened on each vCPU thread of an
/// observed VM (the observer composes them with the VM's own sources).
pub const OBSERVED_THREAD_SOURCES: &[OpenObserved] = &[thread::open_observed];
