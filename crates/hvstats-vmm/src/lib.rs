//! Talking to VMMs: the QMP client and the libvirt client the observer reads a VM's statistics
//! through, and what they need to know about the sockets they speak on.
//!
//! - [`qmp`]: QEMU's QMP for KVM's statistics, vCPU threads and run state;
//! - [`kvm_stats`]: KVM's statistics by name, as a VMM relays them;
//! - [`libvirt`]: a read-only client of libvirt's remote protocol, for its domain statistics;
//! - [`unix_sockets`]: who holds a Unix socket's connections and who waits on it, from the
//!   kernel's tables;
//! - [`peer`]: who is at the other end of a Unix socket, from the kernel's record;
//! - [`cancel`]: the flag a signal sets to end every wait.
//!
//! Nothing here knows of observing: the clients are given a socket's path, a timeout and a
//! [`cancel::Cancel`], and say what the peer said or why it did not.

#![deny(missing_docs)]

pub mod cancel;
pub mod kvm_stats;
pub mod libvirt;
pub mod peer;
pub mod qmp;
pub mod unix_sockets;
