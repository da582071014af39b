//! What a full reading of a VMM's descriptors costs the observer (the one that finds a VM made
//! beside the one attached, every N refreshes for a VMM of N descriptors): one run of the
//! kernel's task-file iterator over the process's files (`hvstats_host::bpf::vm_files`), in CPU
//! µs a reading, against `/proc/PID/fd` listed and each link read, as the observer reads it
//! without the iterator ([`hvstats_observe::discovery::kvm_fds_in`], its directory held open).
//! The process read is this one, holding a KVM VM and as many descriptors in all as a QEMU of a
//! few devices holds ([`DESCRIPTORS`]).

use std::os::fd::OwnedFd;

use hvstats_observe::discovery::{Procfs, kvm_fds_in};
use hvstats_testkit::IdleVm;

use crate::row::{CpuClock, Plan, Row, ns_per, side_by_side};

/// The row.
pub const ROW: &str = "observe-vm-fds-in-kernel-vs-proc";

/// The descriptors the process read holds, at least: a QEMU with a few disks and NICs holds
/// about this many (eventfds, its VM and vCPUs, sockets, images).
pub const DESCRIPTORS: usize = 128;

/// Readings a side takes each round.
const READINGS: u64 = 20;

/// The row, over the plan's rounds (skipped, with why, without KVM or the iterator).
pub fn vm_fds_row(plan: &Plan<'_>) -> Row {
    match measure(plan) {
        Ok(row) => row,
        Err(why) => Row::Skipped { name: ROW, why },
    }
}

fn measure(plan: &Plan<'_>) -> Result<Row, String> {
    let vm = IdleVm::new(None, 1).map_err(|e| format!("a KVM VM: {e}"))?;
    let me = std::process::id() as i32;
    let procfs = Procfs::host();
    let dir = procfs.fd_dir(me).map_err(|e| format!("/proc/{me}/fd: {e}"))?;
    let held = || std::fs::read_dir(format!("/proc/{me}/fd")).map_or(0, Iterator::count);
    // Eventfds, as most of a QEMU's descriptors are, up to the count.
    let extra: Vec<OwnedFd> = (held()..DESCRIPTORS)
        .map(|_| {
            // SAFETY: eventfd takes two integers and returns a new descriptor or -1.
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
            // SAFETY: a descriptor the kernel just gave us, owned by nothing else.
            (fd >= 0).then(|| unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
        })
        .collect::<Option<_>>()
        .ok_or("eventfd failed")?;
    let in_kernel = hvstats_host::bpf::vm_files::vm_fds(me, vm.fd())
        .ok_or("the kernel's task-file iterator cannot be had here")?
        .map_err(|e| format!("the task-file iterator: {e}"))?;
    let from_proc = kvm_fds_in(&dir).map_err(|e| format!("/proc/{me}/fd: {e}"))?.0.vms;
    if in_kernel != from_proc {
        return Err(format!("the two readings differ: {in_kernel:?} in the kernel, {from_proc:?} in /proc"));
    }
    let descriptors = held();
    let rounds = side_by_side(
        plan,
        ROW,
        || {
            let start = CpuClock::now();
            for _ in 0..READINGS {
                std::hint::black_box(hvstats_host::bpf::vm_files::vm_fds(me, vm.fd()));
            }
            ns_per(start, READINGS) / 1e3
        },
        || {
            let start = CpuClock::now();
            for _ in 0..READINGS {
                std::hint::black_box(kvm_fds_in(&dir).ok());
            }
            ns_per(start, READINGS) / 1e3
        },
    );
    drop(extra);
    Ok(Row::Measured {
        name: ROW,
        rounds,
        unit: "µs/reading",
        goal: None,
        facts: vec![("descriptors", descriptors as f64), ("vms_found", in_kernel.len() as f64)],
    })
}
