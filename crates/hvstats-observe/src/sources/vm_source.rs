//! The seam of an observed VM's sources: a [`VmSource`] is a counter source read once per
//! refresh for all of a VM's vCPUs ([`VmView`]), opened when the VM is attached ([`VmAttach`]).
//! A source that asks a peer (a VMM's socket) puts its questions out for every VM before any is
//! read ([`VmSource::ask`]), so the observer waits for all peers within one deadline, and says
//! whether its peer answers ([`VmSource::peer`]).

use std::collections::BTreeMap;
use std::path::Path;

use hvstats_abi::vm_sources::Origin;
use hvstats_abi::vm_state::VmState;

use super::event_writer::KvmExitState;
use hvstats_sources::counter_source::{CounterSource, Gives};

use crate::attach::ObserveOptions;
use crate::discovery::{KvmFds, Procfs};
use hvstats_vmm::unix_sockets::UnixSockets;

/// One vCPU of an observed VM as the observer knows it now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vcpu {
    /// KVM's vCPU id (from the descriptor's link).
    pub vcpu_id: u32,
    /// The thread that runs it, once known.
    pub tid: Option<i32>,
    /// QEMU's QOM path of the vCPU, where QMP said it.
    pub qom_path: Option<String>,
}

/// What a source knows of a vCPU's thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VcpuThread {
    /// The thread.
    pub tid: i32,
    /// QEMU's QOM path of the vCPU, if the source has one.
    pub qom_path: Option<String>,
}

/// The VM a source reads, as the observer knows it at one refresh.
#[derive(Clone, Copy, Debug)]
pub struct VmView<'a> {
    /// The procfs the VMM is seen under.
    pub procfs: &'a Procfs,
    /// The VMM process.
    pub pid: i32,
    /// Its vCPUs, by VP index.
    pub vcpus: &'a [Vcpu],
    /// Its threads in this refresh's walk of the host's tasks, where one is had.
    pub(crate) tasks: Option<crate::task_walk::VmmTasks<'a>>,
}

impl VmView<'_> {
    /// The vCPU threads known, by VP index.
    pub fn threads(&self) -> impl Iterator<Item = (u32, i32)> + '_ {
        self.vcpus.iter().enumerate().filter_map(|(i, v)| Some((i as u32, v.tid?)))
    }

    /// True once every vCPU's thread is known.
    pub(crate) fn all_known(&self) -> bool {
        self.vcpus.iter().all(|v| v.tid.is_some())
    }
}

/// What a source is given when a VM is attached.
#[derive(Debug)]
pub struct VmAttach<'a> {
    /// The procfs the VMM is seen under.
    pub procfs: &'a Procfs,
    /// The VMM process.
    pub pid: i32,
    /// Its KVM descriptors.
    pub fds: &'a KvmFds,
    /// How the VM is observed.
    pub options: &'a ObserveOptions,
    /// Descriptors the sources may hold (what the open file limit leaves for this VM).
    pub room: usize,
    /// The tracepoint events the VM is counted with, made once for its attach (lists of the same
    /// events share one in-kernel tally).
    pub events: crate::thread_counters::EventList,
    /// Descriptors each counted thread of the VMM holds by the counting method in use, for every
    /// source that counts on its threads together ([`super::descriptors_per_thread`]): those
    /// sources count on as many threads as `room` holds this many descriptors for.
    pub per_thread: usize,
    /// Descriptors each thread past the in-kernel engine's rows holds
    /// ([`super::descriptors_past_rows`]).
    pub past_rows_per_thread: usize,
    /// The VMM's QMP socket for this VM: given (`--qmp`), or named on its command line.
    pub qmp: Option<&'a Path>,
    /// Copies of descriptors of a VM this VMM ran before and replaced (its statistics, kept open
    /// by the VMM or not): never this VM's (see [`crate::vm_identity`]).
    pub superseded: &'a [std::os::fd::OwnedFd],
}

/// Whether a source's peer answers now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerState {
    /// It answers: the source gives what it can.
    Up,
    /// It does not, and why: the counters it gives are unavailable until it is back.
    Down(String),
}

/// Which peer a source talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerKind {
    /// The VMM's own monitor session (QEMU's QMP): the one whose sessions the observer counts
    /// and whose failure it reports at attach.
    Monitor,
    /// Another service that answers for the VM (libvirt).
    Service,
}

/// A source's peer and whether it answers now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Which peer it is.
    pub kind: PeerKind,
    /// Whether it answers.
    pub state: PeerState,
}

/// How a source counts on the VMM's threads, for a source that does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counting {
    /// What it knows of `kvm:kvm_exit` on this host.
    pub kvm_exit: KvmExitState,
    /// Threads of the VMM it counts on.
    pub threads: usize,
    /// Threads it left out for want of descriptors.
    pub left_out: usize,
    /// How it counts, said for a log (in the kernel, or by perf counters, and why): shared, as
    /// it is said again at every refresh and seldom changes.
    pub method: std::sync::Arc<str>,
}

/// What a source's peer names of the VM: its vCPU threads, its name and UUID. Asked when the VM
/// is attached (its name and UUID) and at each refresh before the sources are read (its vCPU
/// threads, which the sources that count on threads then read).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Named {
    /// Which thread runs each vCPU, by VP index.
    pub threads: BTreeMap<u32, VcpuThread>,
    /// The VM's name.
    pub vm_name: Option<String>,
    /// The VM's UUID.
    pub vm_uuid: Option<hvstats::vmm::VmUuid>,
}

/// What a source learned at one refresh of its VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Learned {
    /// Its peer and whether it answers, for a source that has one.
    pub peer: Option<Peer>,
    /// Why it gives nothing now, when it was meant to (a peer that failed).
    pub error: Option<String>,
    /// What the VMM offered it that it refused, and why (a descriptor or a socket that is not
    /// what it was listed as); said once, when the VM is attached.
    pub refused: Option<String>,
    /// Descriptors it holds.
    pub fds: usize,
    /// How it counts on the VMM's threads, for a source that does.
    pub counting: Option<Counting>,
    /// The VM's run state, for a source that knows it.
    pub vm_state: Option<VmState>,
    /// The VM's identity on its platform, for a source whose peer says it (libvirt's Nova
    /// metadata).
    pub platform: Option<hvstats_platform::Identity>,
}

impl Learned {
    /// A source with no peer that holds `fds` descriptors and refused nothing.
    pub fn holding(fds: usize) -> Self {
        Self { peer: None, error: None, refused: None, fds, counting: None, vm_state: None, platform: None }
    }
}

/// One source of an observed VM's counters.
pub trait VmSource: CounterSource {
    /// Puts this refresh's questions to the source's peer, without waiting for answers (called
    /// for every observed VM before any is read); `sockets` is the host's table of Unix
    /// sockets at this refresh (every network namespace's entries of the sockets
    /// [`socket_in_use`](Self::socket_in_use) named), `given_before` what the sources before this one in the VM's list
    /// gave at the last refresh (what this one need not ask for).
    fn ask(&mut self, _sockets: &UnixSockets, _given_before: &Gives) {}

    /// True for a source that puts questions to a peer ([`ask`](Self::ask),
    /// [`socket_in_use`](Self::socket_in_use)): a VM none of whose sources does is not asked
    /// anything at a refresh, and its sources are not gone through for it.
    fn asks(&self) -> bool {
        false
    }

    /// The Unix socket whose entries in the kernel's tables its next [`ask`](Self::ask) needs
    /// (a session it holds, waits on or is due to begin), if any: the tables are read only
    /// for those.
    fn socket_in_use(&self, _now: std::time::Instant) -> Option<&std::path::Path> {
        None
    }

    /// What its peer names of the VM now (nothing, for a source without one).
    fn named(&mut self) -> Named {
        Named::default()
    }

    /// Reads the source for the VM as it is now (once per refresh, for every vCPU), and says
    /// what it learned.
    fn read(&mut self, vm: &VmView<'_>) -> Learned;

    /// From when its counters count: what it counts itself from attach (the default), KVM's
    /// own statistics from the vCPU's creation, or counts the kernel keeps for the VM across
    /// observers from when the first observer began them.
    fn origin(&self) -> Origin {
        Origin::Attach
    }

    /// For a source whose counts are kept across observers ([`Origin::Kept`]): when they began
    /// (the first observer's attach), once known. The VM's partition page says the earliest of
    /// its kept sources' (see [`hvstats_abi::vm_sources::CountOrigins`]).
    fn kept_since(&self) -> Option<std::time::SystemTime> {
        None
    }

    /// The VMM's descriptors this source holds copies of (its KVM statistics): once the VMM
    /// replaces its VM, they are the old VM's, and the new one's sources refuse them.
    fn vmm_copies(&self) -> Vec<std::os::fd::BorrowedFd<'_>> {
        Vec::new()
    }
}
