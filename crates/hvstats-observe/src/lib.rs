//! Observing the KVM VMs of other processes (QEMU, Firecracker, cloud-hypervisor, crosvm,
//! kvmtool) and publishing each as a partition of the observer's own instance.
//!
//! - [`discovery`]: VM and vCPU descriptors in `/proc/PID/fd`, vCPU threads from debugfs and
//!   thread names, the VM's name, who a process is ([`discovery::ProcessIdentity`]);
//!   [`kvm_scan`]: every VM on the host at a cost other processes cannot inflate;
//!   [`qemu_args`]: QEMU's own reading of its command line;
//! - [`thread_counters`]: per-thread event counters on every thread of another process from attach
//!   on (the engine that counts them is `hvstats_host::counting`);
//! - `hvstats_vmm` (its own crate) talks to the VMMs: QEMU's QMP, libvirt's remote protocol, who
//!   holds their sockets, and the [`cancel`] flag every wait looks at;
//! - [`sources`]: the sources of an observed VM's counters (the VMM's KVM statistics descriptors,
//!   libvirt, QMP, its events, its threads' own files), composed on the seam our own VPs' sources share;
//! - [`vm`]: one observed VM and its partition; [`vm_identity`]: which KVM VM object a process
//!   holds (a VM is its kernel object: a forked twin is not a second VM, a VM made anew is a new one); [`observer`]: attach, refresh, detach, over one
//!   record per process (`record`: its identity, stage and what was said of it);
//!   [`happenings`]: what the observer says happened in a tick (the attach/detach log's lines);
//! - [`publication`]: what an observed partition publishes beside its pages;
//! - [`refusal`]: why a VM found is not observed (one table of reasons, counted by reason on the
//!   observer's page); [`capabilities`]: the capabilities the observer uses, each missing one
//!   said once with what it costs;
//! - [`claim`]: one observer per VM per host.
//!
//! Descriptors per VM: while its vCPU threads are unknown, counters on every thread of the
//! process, for at most [`sources::events::EXTRA_THREADS`] threads beyond one per vCPU and within what the
//! open file limit leaves above [`observer::FD_RESERVE`]; once known, on each vCPU thread. On
//! each such thread the thread clock ([`sources::thread_clock`]) holds its two software events
//! (task clock, migrations); where BPF is permitted the tracepoints are counted in the kernel
//! ([`thread_counters`]) and hold no descriptor per thread, with perf counters they hold every event of
//! [`sources::events::vm_events`] but the spans, which only the kernel counts (32 on a host
//! without VMX/SVM, 48 with). Plus one QMP socket when
//! given, one libvirt connection for a libvirt domain, a copy of each KVM statistics
//! descriptor the VMM holds, and one of its VM descriptor (to tell its VM object from others,
//! [`vm_identity`]).

#![deny(missing_docs)]

pub mod attach;
pub mod capabilities;
pub mod claim;
pub mod discovery;
pub mod filter;
pub mod happenings;
pub mod kvm_scan;
pub mod observer;
pub mod publication;
pub mod qemu_args;
mod record;
pub mod refusal;
mod socket_access;
pub mod sources;
mod task_walk;
pub mod thread_counters;
pub mod vm;
pub mod vm_identity;

/// The flag a signal sets to end every wait, which an [`Observer`] is given.
pub use hvstats_vmm::cancel;

pub use attach::{ObserveError, ObserveOptions};
pub use discovery::{Procfs, Vmm};
pub use happenings::ObserverEvent;
pub use observer::{Observer, Targets, raise_fd_limit};
pub use sources::KvmExitState;
pub use vm::ObservedVm;
