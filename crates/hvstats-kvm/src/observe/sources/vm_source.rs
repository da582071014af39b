//! The seam of an observed VM's sources: a [`VmSource`] is a counter source read once per
//! refresh for all of a VM's vCPUs ([`VmView`]), opened when the VM is attached ([`VmAttach`]).

use std::collections::BTreeMap;

use super::event_writer::KvmExitState;
use crate::sources::counter_source::CounterSource;

use crate::observe::attach::ObserveOptions;
use crate::observe::discovery::{KvmFds, Procfs};

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
}

impl VmView<'_> {
    /// The vCPU threads known, by VP index.
    pub fn threads(&self) -> impl Iterator<Item = (u32, i32)> + '_ {
        self.vcpus.iter().enumerate().filter_map(|(i, v)| Some((i as u32, v.tid?)))
    }

    /// True once every vCPU's thread is known.
    pub fn all_known(&self) -> bool {
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
    /// Descriptors the source may hold (what the open file limit leaves for this VM).
    pub room: usize,
}

/// One source of an observed VM's counters.
pub trait VmSource: CounterSource {
    /// Reads the source for the VM as it is now (once per refresh, for every vCPU).
    fn read(&mut self, vm: &VmView<'_>);

    /// Which thread runs each vCPU, by VP index, as far as this source knows.
    fn vcpu_threads(&mut self) -> BTreeMap<u32, VcpuThread> {
        BTreeMap::new()
    }

    /// The VM's name, as far as this source knows it.
    fn vm_name(&mut self) -> Option<String> {
        None
    }

    /// The VM's UUID, as far as this source knows it.
    fn vm_uuid(&mut self) -> Option<hvstats::vmm::VmUuid> {
        None
    }

    /// Why the source gives nothing now, when it was meant to (a peer that failed).
    fn error(&self) -> Option<&str> {
        None
    }

    /// Descriptors it holds.
    fn fds(&self) -> usize {
        0
    }

    /// What the source knows of `kvm:kvm_exit` on this host, if it counts it.
    fn kvm_exit(&self) -> Option<KvmExitState> {
        None
    }

    /// Threads of the VMM it counts, and threads it left out for want of descriptors, if it
    /// counts on threads.
    fn threads_counted(&self) -> Option<(usize, usize)> {
        None
    }

    /// How it counts, said for a log (in the kernel, or by perf counters, and why), if that
    /// varies by host.
    fn method(&self) -> Option<String> {
        None
    }
}
