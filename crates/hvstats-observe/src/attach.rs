//! What attaching an observed VM takes ([`ObserveOptions`]) and how it fails ([`ObserveError`]):
//! the observer, the VM and each of its sources share these.

use std::io;
use std::path::PathBuf;

use super::filter::VmFilter;
use hvstats_vmm::cancel::Cancel;

/// How to observe a VM.
#[derive(Clone, Debug, Default)]
pub struct ObserveOptions {
    /// A QMP socket of the VMM (QEMU) for KVM's statistics, its run state and vCPU threads.
    pub qmp: Option<PathBuf>,
    /// Without `qmp`: use a QMP socket the QEMU's command line names (the first no other
    /// client holds).
    pub qmp_auto: bool,
    /// Which VMs to observe.
    pub filter: VmFilter,
    /// libvirt's read-only socket, for the statistics of libvirt's domains; `None` takes the
    /// socket of libvirt's `LIBVIRT_DEFAULT_URI`, else the usual places
    /// ([`hvstats_vmm::libvirt::SOCKETS`]).
    pub libvirt: Option<PathBuf>,
    /// The kubelet's root, under which a KubeVirt pod's own libvirt socket is looked for
    /// ([`crate::sources::pod_libvirt`]); `None` takes `HVSTATS_KUBELET_ROOT`, else
    /// `/var/lib/kubelet`.
    pub kubelet_root: Option<PathBuf>,
    /// Ends every QMP wait at once when set (the observer is stopping).
    pub cancel: Cancel,
    /// The runtime directory in which each VMM is claimed before it is observed (see
    /// [`super::claim`]); `None` observes without claiming.
    pub claims: Option<PathBuf>,
    /// Where in bpffs the in-kernel counts are kept beyond the observer, for the runtime
    /// directory of `claims` ([`hvstats_host::counting::keep_counts_in`]): [`crate::Observer::new`]
    /// sets it (what is given here is replaced); `None`: not kept.
    pub kept_in: Option<PathBuf>,
}

/// An error observing a VM.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    /// The process holds no KVM VM.
    #[error("process {0} holds no KVM VM")]
    NoVm(i32),
    /// Its threads or descriptors could not be read.
    #[error("cannot read process {pid}")]
    Proc {
        /// The process.
        pid: i32,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Not enough descriptors are left to count on the VM's vCPU threads.
    #[error(
        "process {pid}: the descriptor budget: its {vcpus} vCPUs need {needed} descriptors \
         ({counting}) and {room} are left under the open file limit (less a reserve \
         for /proc and the runtime directory)"
    )]
    Budget {
        /// The process.
        pid: i32,
        /// Its vCPUs.
        vcpus: usize,
        /// Descriptors its vCPU threads need.
        needed: usize,
        /// How its vCPU threads would be counted (in the kernel, or past the engine's rows by
        /// perf counters), and what each costs, said.
        counting: String,
        /// Descriptors left for counters.
        room: usize,
    },
    /// The process holds several KVM VM objects: which one its vCPU threads run cannot be told,
    /// and one process is observed as one VM (retried while it lives: once it holds one, that
    /// one is attached).
    #[error("process {pid} holds {vms} KVM VMs: which one it runs cannot be told")]
    SeveralVms {
        /// The process.
        pid: i32,
        /// The distinct VM objects it holds.
        vms: usize,
    },
    /// The partition could not be created.
    #[error("cannot publish a partition for process {pid}")]
    Publish {
        /// The process.
        pid: i32,
        /// The cause.
        #[source]
        source: io::Error,
    },
}
