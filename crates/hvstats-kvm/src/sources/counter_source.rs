//! The seam every source of a VP's counters plugs into: a [`CounterSource`] is opened for the
//! VP's thread and vCPU, reads what it reads and writes the counters the catalog gives its
//! [`Source`](hvstats_abi::Source) key into the VP's page. A VP's sources are the list
//! [`open_all`] makes; a new source is one file implementing the trait, one line in that list,
//! and the catalog rows that name its key. A source that reads a thread from outside its process
//! serves observed VMs too: [`open_observed_all`] opens those for an observed VM's vCPU thread.

use std::fmt::Debug;
use std::os::fd::RawFd;
use std::path::Path;

use hvstats::SharedPage;
use hvstats::whv::VpExtras;
use hvstats_abi::source::SourceKind;

use crate::accounting::UserExitCounts;

/// When a source is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// With the intercepts a guest can see change from one instruction to the next: every
    /// refresh, the VP thread's own at hypercalls included.
    Exits,
    /// With the thread's times, which change whenever it runs: full merges only.
    Times,
}

/// Where a VP's sources are opened: its thread and its vCPU.
#[derive(Clone, Copy, Debug)]
pub struct VpThread {
    /// The VP thread's id.
    pub tid: libc::pid_t,
    /// The vCPU's file descriptor.
    pub vcpu_fd: RawFd,
}

/// An observed VM's vCPU thread: a thread of another process.
#[derive(Clone, Copy, Debug)]
pub struct ObservedThread<'a> {
    /// The procfs the process is seen under.
    pub procfs: &'a Path,
    /// The VMM's process id.
    pub pid: libc::pid_t,
    /// The vCPU thread's id.
    pub tid: libc::pid_t,
}

/// One source of a VP's counters.
pub trait CounterSource: Send + Debug {
    /// When it is read.
    fn part(&self) -> Part;

    /// The kinds of catalog key whose counters it writes.
    fn keys(&self) -> &'static [SourceKind];

    /// Reads the source and writes its counters into `page` (inside the caller's merge window);
    /// a reading that fails leaves them as they are. `user` is the run loop's own counts, for the
    /// sources that add or take off what KVM does not see; `extras` what a reading tells the WHv
    /// API beyond the page.
    fn merge(&mut self, page: &SharedPage, user: &UserExitCounts, extras: &mut VpExtras);

    /// The VP thread is ending (called on it): take the last reading a later merge should keep.
    fn thread_exiting(&mut self) {}

    /// Why some of its counters cannot be kept, said for a person (empty when all can).
    fn unavailable(&self) -> Vec<String> {
        Vec::new()
    }

    /// The KVM statistic `name` of the vCPU, for cross-checks, when this source reads them.
    fn kvm_stat(&self, _name: &str) -> Option<u64> {
        None
    }
}

/// How one source is opened (`None` where the host cannot give it at all).
type Open = fn(VpThread) -> Option<Box<dyn CounterSource>>;

/// Every source of a VP's counters, in the order a merge reads them.
const SOURCES: &[Open] = &[
    super::tracepoint::open_source,
    super::vcpu_stats::open_source,
    super::thread::open_source,
    super::host_faults::open_source,
];

/// Opens every source for `vp`.
pub fn open_all(vp: VpThread) -> Vec<Box<dyn CounterSource>> {
    SOURCES.iter().filter_map(|open| open(vp)).collect()
}

/// How one source is opened for an observed VM's vCPU thread.
type OpenObserved = for<'a> fn(ObservedThread<'a>) -> Option<Box<dyn CounterSource>>;

/// The sources the observer opens on each vCPU thread it finds (the rest of an observed VM's
/// counters come from its in-kernel counting and QMP, read once for the whole VM).
const OBSERVED_SOURCES: &[OpenObserved] = &[super::thread::open_observed, super::host_faults::open_observed];

/// Opens every source of an observed vCPU thread.
pub fn open_observed_all(thread: ObservedThread<'_>) -> Vec<Box<dyn CounterSource>> {
    OBSERVED_SOURCES.iter().filter_map(|open| open(thread)).collect()
}
