//! Fixtures and set-up shared by the workspace's tests and benches, so that no test borrows
//! another crate's test files or a surface's internals:
//!
//! - [`TempDir`]: a temporary runtime directory;
//! - [`kvm_available`]: the check of tests that need a guest (skipped without /dev/kvm, a
//!   failure under `HVSTATS_REQUIRE_KVM=1`);
//! - [`IdleVcpu`]: a VM with one vCPU that never runs, and its KVM statistics;
//! - [`PacedVm`]: a VM of vCPU threads leaving the guest at a pace, with its statistics open as
//!   QEMU 8.1 keeps them: what the bench's minimal VMM runs;
//! - [`Libvirtd`]: a libvirt daemon of the test's own (a system one, or a session one as a
//!   KubeVirt pod runs), with a QEMU domain;
//! - [`PodCgroup`]: a cgroup shaped like a pod's container's, as the kubelet makes it, and
//!   [`libvirt_volume`], a pod's libvirt volume under a kubelet root;
//! - [`synthetic_instance`]: a reading of a large host, every counter set, built in memory;
//! - [`synthetic_load`]: a published instance counting made-up traffic, for the surfaces;
//! - [`tls_client`], [`self_signed_localhost`]: a TLS client of the exporter that trusts one
//!   certificate.
//!
//! Test code only: the product crates take it as a dev-dependency (the bench, which measures
//! with the synthetic reading, as a dependency).

#![deny(missing_docs)]

mod dir;
mod idle_vcpu;
mod kvm;
mod libvirt;
mod load;
mod paced_vmm;
mod pod;
mod reading;
mod tls;

pub use dir::TempDir;
pub use idle_vcpu::{IdleVcpu, IdleVm};
pub use kvm::{kvm_available, kvm_vcpus, spawn_qemu, wait_for_kvm_vcpus};
pub use libvirt::{LibvirtDomain, Libvirtd};
pub use load::synthetic_load;
pub use paced_vmm::PacedVm;
pub use pod::{CgroupDriver, PodCgroup, libvirt_volume};
pub use reading::synthetic_instance;
pub use tls::{self_signed_localhost, tls_client};
