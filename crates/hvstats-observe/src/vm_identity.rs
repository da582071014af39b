//! Which KVM VM object a process holds: a VM is its kernel object, not the process, and not a
//! descriptor number.
//!
//! Every KVM descriptor is a file on one shared anonymous inode, so neither the inode nor the
//! link (`anon_inode:kvm-vm`) tells two VMs apart. What does is the open file itself: `kcmp(2)`
//! with `KCMP_FILE` says whether two descriptors (of this process or another, with the ptrace
//! read access the observer has as root or with `CAP_SYS_PTRACE`) are the very same file, and
//! `KVM_CREATE_VM` makes one file per VM. A `fork()` or `SCM_RIGHTS` shares the file; only
//! `KVM_CREATE_VM` makes another.
//!
//! - [`VmObject`]: the VM an observed VM was attached with, held as a copy of its descriptor
//!   (`pidfd_getfd`), against which a descriptor of any process is compared;
//! - `distinct_vms`: the VM objects among a process's `kvm-vm` descriptors (a process may
//!   `dup` one);
//! - [`VmWatch`]: notices at each refresh that the VM a process runs is no longer the one
//!   attached (closed and made anew, or another made beside it), at the cost of one `kcmp` and
//!   one `stat` of its `fd` directory (held open: no path is walked); a full reading of its
//!   descriptors (in the kernel, one run of a task-file iterator over its files,
//!   [`hvstats_host::bpf::vm_files`], where it can be had; else `/proc/PID/fd`, a `readlink`
//!   each) when their number changed, and at least once every [`RESCAN_TICKS`] refreshes
//!   (every N refreshes for a process holding N descriptors, more than that), so a VMM that
//!   keeps its count of descriptors steady is found within that bound. Watches made together
//!   (every VM found at an observer's start) take turns for their first full reading, so the
//!   readings of many VMs spread over the ticks instead of all falling in one tick every
//!   [`RESCAN_TICKS`];
//! - [`vm_token`]: what names a VM beyond this process's life (its KVM debugfs directory), for
//!   the in-kernel counts kept across observers.
//!
//! The rule the observer keeps ([`crate::observer`]): a VM object is attached once, to the first
//! of its holders to be attached, and a holder found later is its twin, not a second VM, for as
//! long as that one stays attached (the decision does not flip). Holders found in the same tick
//! are taken in this order: a process KVM's debugfs names as having made a VM, then the oldest.
//! Only the process that made a VM can run its vCPUs (KVM refuses `KVM_RUN` from any other
//! process's memory map), and a child forked from it is younger than it.

use std::cmp::Ordering;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

use hvstats_host::bpf::task_iter::{self, HeldFile};
use hvstats_host::os as sys;

use crate::discovery::{Procfs, is_gone};

/// `KCMP_FILE` of `<linux/kcmp.h>`.
const KCMP_FILE: libc::c_int = 0;

/// Refreshes between two full readings of an observed VMM's descriptors when their number holds
/// still (a process with more descriptors than this is read once per that many refreshes).
pub const RESCAN_TICKS: u64 = 64;

/// How descriptor `fd_a` of `pid_a` compares with descriptor `fd_b` of `pid_b` as open files:
/// `Equal` when they are the very same file (the kernel orders the others by an obfuscated
/// address of theirs, the same for the life of the host).
///
/// # Errors
/// When a process or a descriptor is gone (`ESRCH`, `EBADF`), this process may not read the
/// other (`EPERM`), or the kernel has no `kcmp` (`ENOSYS`).
pub(crate) fn compare_files(pid_a: i32, fd_a: RawFd, pid_b: i32, fd_b: RawFd) -> io::Result<Ordering> {
    // SAFETY: kcmp takes two pids, a type and two descriptor numbers, and touches no memory of ours.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, pid_a, pid_b, KCMP_FILE, fd_a, fd_b) };
    match sys::check_long(r)? {
        0 => Ok(Ordering::Equal),
        2 => Ok(Ordering::Greater),
        // 1: less; 3: not equal, and not ordered (the kernel may withhold the order).
        _ => Ok(Ordering::Less),
    }
}

/// True when descriptor `fd_a` of `pid_a` and `fd_b` of `pid_b` are the same open file; a
/// descriptor or process gone is not.
///
/// # Errors
/// As [`compare_files`], but for a descriptor or process gone.
fn same_file(pid_a: i32, fd_a: RawFd, pid_b: i32, fd_b: RawFd) -> io::Result<bool> {
    match compare_files(pid_a, fd_a, pid_b, fd_b) {
        Ok(order) => Ok(order == Ordering::Equal),
        Err(e) if is_gone(&e) || e.raw_os_error() == Some(libc::EBADF) => Ok(false),
        Err(e) => Err(e),
    }
}

/// True when descriptor `fd_a` of `pid_a` and `fd_b` of `pid_b` are the same open file; what
/// cannot be compared is not.
pub(crate) fn same_files(pid_a: i32, fd_a: RawFd, pid_b: i32, fd_b: RawFd) -> bool {
    same_file(pid_a, fd_a, pid_b, fd_b).unwrap_or(false)
}

/// True when descriptor `fd` of `pid` is one of `copies` (descriptors of this process); what
/// cannot be compared is not.
pub(crate) fn is_one_of(pid: i32, fd: RawFd, copies: &[OwnedFd]) -> bool {
    copies.iter().any(|c| same_file(pid, fd, me(), c.as_raw_fd()).unwrap_or(false))
}

/// Copies of a VMM's descriptors of VMs it replaced kept aside at most, per VMM: a VMM that
/// replaced its VM more often than this while keeping the old VMs' statistics open is not
/// observed (the copies would cost this process a descriptor each).
pub const MAX_SUPERSEDED: usize = 256;

/// Keeps of `copies` (copies of `pid`'s KVM statistics descriptors of VMs it replaced) those it
/// still holds: one it closed can no longer be taken for its VM's. Unchanged where its
/// descriptors cannot be read.
pub(crate) fn still_held(procfs: &Procfs, pid: i32, copies: &mut Vec<OwnedFd>) {
    if copies.is_empty() {
        return;
    }
    let dir = procfs.root().join(pid.to_string()).join("fd");
    let Ok(entries) = std::fs::read_dir(&dir) else { return };
    let stats: Vec<RawFd> = entries
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|l| {
                let l = l.to_string_lossy();
                l.starts_with("anon_inode:kvm-vcpu-stats:") || l == "anon_inode:kvm-vm-stats"
            })
        })
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    copies.retain(|c| stats.iter().any(|&fd| same_files(pid, fd, me(), c.as_raw_fd())));
}

/// This process's id, as `kcmp` names it: asked of the kernel once (`getpid` is a system call,
/// and every refresh of every VM compares a descriptor with one of this process's).
fn me() -> i32 {
    static ME: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    *ME.get_or_init(|| std::process::id() as i32)
}

/// The distinct VM objects among `vms`, descriptors of `pid` linked `anon_inode:kvm-vm`
/// (ascending): one descriptor of each, the lowest.
///
/// # Errors
/// When they cannot be compared (see [`compare_files`]).
pub(crate) fn distinct_vms(pid: i32, vms: &[u32]) -> io::Result<Vec<u32>> {
    let mut distinct: Vec<u32> = Vec::new();
    for &fd in vms {
        let mut seen = false;
        for &kept in &distinct {
            if same_file(pid, fd as RawFd, pid, kept as RawFd)? {
                seen = true;
                break;
            }
        }
        if !seen {
            distinct.push(fd);
        }
    }
    Ok(distinct)
}

/// What names the VM of descriptor `vm_fd` of `pid` beyond this process's life, for the
/// in-kernel counts kept across observers ([`hvstats_host::bpf::VmToken`]): the inode of the VM's
/// directory in KVM's debugfs, `kvm/<tid>-<fd>`, which KVM makes when thread `tid` makes the VM
/// at descriptor `fd` and removes with the VM (an inode number is not reused while its directory
/// is there). Taken where exactly one such directory names a thread of `pid` and `vm_fd`; 0 (not
/// told: kept counts are then not adopted) without debugfs, for a VM whose descriptor was moved,
/// or made by a thread of another process.
pub fn vm_token(procfs: &Procfs, pid: i32, vm_fd: u32) -> hvstats_host::bpf::VmToken {
    use std::os::unix::fs::MetadataExt;
    let Some(debugfs) = procfs.debugfs() else { return 0 };
    let Ok(entries) = std::fs::read_dir(debugfs.join("kvm")) else { return 0 };
    let task = procfs.root().join(pid.to_string()).join("task");
    let suffix = format!("-{vm_fd}");
    let mut found = entries.flatten().filter(|e| {
        let name = e.file_name();
        let tid = name.to_str().and_then(|n| n.strip_suffix(&suffix));
        tid.is_some_and(|t| t.parse::<i32>().is_ok() && task.join(t).is_dir())
    });
    match (found.next(), found.next()) {
        (Some(dir), None) => dir.metadata().map_or(0, |m| m.ino()),
        _ => 0,
    }
}

/// The VM object an observed VM was attached with: a copy of the VMM's `kvm-vm` descriptor,
/// held while the VM is observed (it keeps the kernel's VM object alive that long, not its
/// memory, which is the VMM's).
#[derive(Debug)]
pub struct VmObject {
    copy: OwnedFd,
}

impl VmObject {
    /// The VM of descriptor `fd` of `pid`, copied: checked to be a KVM VM by what this process's
    /// own `/proc/self/fd` names the copy (the VMM may have put anything at that number since its
    /// descriptors were listed).
    ///
    /// # Errors
    /// When the descriptor cannot be copied (the process is gone, or this one may not), or is not
    /// a KVM VM.
    pub fn of(pid: i32, fd: u32) -> io::Result<Self> {
        let pidfd = pidfd(pid)?;
        let copy: OwnedFd = copy_fd(&pidfd, fd as RawFd)?.into();
        let link = std::fs::read_link(format!("/proc/self/fd/{}", copy.as_raw_fd()))?;
        if link.as_os_str() != "anon_inode:kvm-vm" {
            let what = link.to_string_lossy();
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("descriptor {fd} is {what:?}")));
        }
        Ok(Self { copy })
    }

    /// True when descriptor `fd` of `pid` is this VM; a descriptor or process gone is not.
    ///
    /// # Errors
    /// When the two cannot be compared for another reason (`kcmp` refused: `EPERM`, `ENOSYS`).
    pub fn is_held_at(&self, pid: i32, fd: u32) -> io::Result<bool> {
        same_file(pid, fd as RawFd, me(), self.copy.as_raw_fd())
    }

    /// The descriptors of `pid` that are KVM VMs, found in the kernel
    /// ([`hvstats_host::bpf::vm_files`]: one run over its files, where `/proc` costs a
    /// `readlink` a descriptor); `None` where the kernel cannot tell, or tells of none: whether
    /// the process is gone, or holds no VM, is then read from `/proc`.
    fn vms_held_by(&self, pid: i32) -> Option<Vec<u32>> {
        hvstats_host::bpf::vm_files::vm_fds(pid, self.copy.as_fd())?.ok().filter(|vms| !vms.is_empty())
    }

    /// Has each walk of the host's tasks check that `pid` holds this VM at `fd`
    /// ([`task_iter::TaskIterProgram::watch_file`]); false where the walk cannot.
    fn watch_in_walks(&self, pid: i32, fd: u32) -> bool {
        task_iter::shared().is_some_and(|p| p.watch_file(pid, fd, self.copy.as_fd()))
    }

    /// Ends what [`watch_in_walks`](Self::watch_in_walks) began.
    fn unwatch_in_walks(&self, pid: i32, fd: u32) {
        if let Some(program) = task_iter::shared() {
            program.unwatch_file(pid, fd, self.copy.as_fd());
        }
    }

    /// What `walked` (a walk's check of `pid`'s main thread) says of this VM held at `fd`, when
    /// it is the check of this very VM at that descriptor.
    fn walked_held(&self, fd: u32, walked: Option<HeldFile>) -> Option<bool> {
        walked.filter(|w| w.fd == fd && w.ours == self.copy.as_raw_fd()).map(|w| w.held)
    }
}

/// What became of the VM a process was attached with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmChange {
    /// The process no longer holds it: it closed it (and made another, or holds none).
    Replaced,
    /// The process holds another VM beside it: which one its vCPU threads run cannot be told.
    Another,
}

/// Watches whether a VMM still runs the VM it was attached with, refresh after refresh.
#[derive(Debug)]
pub struct VmWatch {
    object: VmObject,
    /// The descriptor the VMM holds it at.
    fd: u32,
    /// The VMM's number of descriptors at the last full reading, where procfs tells it.
    count: Option<u64>,
    /// The VMM's `fd` directory, held to read its number without a path walk each refresh
    /// (`None` where it could not be opened: the number is then read by its path).
    fd_dir: Option<File>,
    refreshes: u64,
    /// The refresh at which its descriptors are read in full next, whatever else holds.
    rescan_at: u64,
    /// The VMM, while the walks of the host's tasks check that it holds the VM at `fd` (then
    /// no `kcmp(2)` is needed at a refresh whose walk did).
    walked: Option<i32>,
}

impl Drop for VmWatch {
    fn drop(&mut self) {
        if let Some(pid) = self.walked {
            self.object.unwatch_in_walks(pid, self.fd);
        }
    }
}

impl VmWatch {
    /// Watches `object`, held by `pid` at descriptor `fd`.
    pub fn new(procfs: &Procfs, pid: i32, fd: u32, object: VmObject) -> Self {
        let fd_dir = procfs.fd_dir(pid).ok();
        let walked = object.watch_in_walks(pid, fd).then_some(pid);
        let mut watch =
            Self { object, fd, count: None, fd_dir, refreshes: 0, rescan_at: first_rescan(), walked };
        watch.count = watch.fd_count(procfs, pid);
        watch
    }

    /// The VMM's number of descriptors now, where procfs tells it.
    fn fd_count(&self, procfs: &Procfs, pid: i32) -> Option<u64> {
        match &self.fd_dir {
            Some(dir) => procfs.fd_count_of(dir),
            None => procfs.fd_count(pid),
        }
        .ok()
        .flatten()
    }

    /// The VM object watched.
    pub fn object(&self) -> &VmObject {
        &self.object
    }

    /// What became of the VM of `pid` since the last check (`None`: it holds it still, and no
    /// other). `walked` is what this tick's walk of the host's tasks found of `pid`'s watched
    /// file, which answers in place of a `kcmp(2)` when it is of this VM at its descriptor.
    /// Without `count_fds` (KVM's debugfs, watched, names no VM made by `pid` since the last
    /// check), the number of its descriptors is not read: a VM made beside the one attached is
    /// then found by the periodic full reading alone, as where procfs does not tell the number
    /// (a VM KVM gave no directory, or one made by another process and passed to it).
    ///
    /// # Errors
    /// When the process's descriptors cannot be read or compared for another reason than its
    /// exit (out of descriptors): nothing is known then.
    pub fn check(
        &mut self,
        procfs: &Procfs,
        pid: i32,
        walked: Option<HeldFile>,
        count_fds: bool,
    ) -> io::Result<Option<VmChange>> {
        self.refreshes += 1;
        // The walk of this tick answered for this VM at this descriptor: as `kcmp` would have.
        let same = match self.object.walked_held(self.fd, walked.filter(|_| self.walked == Some(pid))) {
            Some(held) => held,
            None => self.object.is_held_at(pid, self.fd)?,
        };
        // Where procfs does not tell the number (before Linux 6.2), the periodic reading alone
        // finds a VM made beside the one attached.
        let counted = count_fds.then(|| self.fd_count(procfs, pid));
        let moved = counted.is_some_and(|count| count != self.count);
        if same && !moved && self.refreshes < self.rescan_at {
            return Ok(None);
        }
        let count = counted.unwrap_or_else(|| self.fd_count(procfs, pid));
        let vms = match self.vm_descriptors(procfs, pid) {
            Ok(vms) => vms,
            // Gone: its refresh says so at the next turn.
            Err(e) if is_gone(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        self.count = count;
        let every = count.unwrap_or(0).max(RESCAN_TICKS);
        self.rescan_at = self.refreshes + every;
        let mut held_at = None;
        let mut others = false;
        for &fd in &vms {
            if self.object.is_held_at(pid, fd)? {
                held_at.get_or_insert(fd);
            } else {
                others = true;
            }
        }
        Ok(match (held_at, others) {
            (None, _) => Some(VmChange::Replaced),
            (Some(_), true) => Some(VmChange::Another),
            (Some(fd), false) => {
                if fd != self.fd
                    && let Some(pid) = self.walked.take()
                {
                    self.object.unwatch_in_walks(pid, self.fd);
                    self.walked = self.object.watch_in_walks(pid, fd).then_some(pid);
                }
                self.fd = fd;
                None
            }
        })
    }

    /// The descriptors of `pid` that are KVM VMs, read in full: in the kernel where it tells
    /// ([`VmObject::vms_held_by`]), else from `/proc`.
    fn vm_descriptors(&self, procfs: &Procfs, pid: i32) -> io::Result<Vec<u32>> {
        match self.object.vms_held_by(pid) {
            Some(vms) => Ok(vms),
            None => match &self.fd_dir {
                Some(dir) => crate::discovery::kvm_fds_in(dir).map(|(fds, _)| fds.vms),
                None => procfs.kvm_fds(pid).map(|fds| fds.vms),
            },
        }
    }
}

/// The refresh at which a new watch first reads its VMM's descriptors in full: each watch made
/// takes the next of [`RESCAN_TICKS`] turns, so VMs attached in the same tick (every VM an
/// observer finds at its start) are read in full in different ticks, a few each tick, not all
/// in one tick every [`RESCAN_TICKS`] ticks. Within the bound all the same (at most
/// [`RESCAN_TICKS`] refreshes).
fn first_rescan() -> u64 {
    static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    1 + MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % RESCAN_TICKS
}

/// A process's descriptor, copied into this one (`pidfd_getfd(2)`).
///
/// # Errors
/// When the process is gone, the descriptor is not open, or this process may not copy it.
pub fn copy_fd(pidfd: &OwnedFd, fd: RawFd) -> io::Result<File> {
    // SAFETY: pidfd_getfd takes a pidfd we hold, a descriptor number and flags 0; it returns a new
    // descriptor or -1 and touches no memory of ours.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    let r = sys::check(i32::try_from(r).unwrap_or(-1))?;
    // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
    Ok(unsafe { File::from_raw_fd(r) })
}

/// A descriptor referring to process `pid` (`pidfd_open(2)`).
///
/// # Errors
/// When the process is gone.
pub fn pidfd(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags 0; it returns a new descriptor or -1.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let r = sys::check(i32::try_from(r).unwrap_or(-1))?;
    // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev_null() -> OwnedFd {
        std::fs::File::open("/dev/null").unwrap().into()
    }

    #[test]
    fn a_duplicate_is_the_same_file_and_another_open_is_not() {
        let (a, b) = (dev_null(), dev_null());
        let dup = a.try_clone().unwrap();
        let (fa, fb, fdup) = (a.as_raw_fd(), b.as_raw_fd(), dup.as_raw_fd());
        assert_eq!(compare_files(me(), fa, me(), fdup).unwrap(), Ordering::Equal);
        let ab = compare_files(me(), fa, me(), fb).unwrap();
        assert_ne!(ab, Ordering::Equal);
        assert_eq!(compare_files(me(), fb, me(), fa).unwrap(), ab.reverse(), "one order both ways");
        assert!(!same_file(me(), fa, me(), 1_000_000).unwrap(), "a descriptor not open is no file");
        let fds = [fa as u32, fdup as u32, fb as u32];
        let mut sorted = fds;
        sorted.sort_unstable();
        let distinct = distinct_vms(me(), &sorted).unwrap();
        assert_eq!(distinct.len(), 2, "{distinct:?}");
    }

    #[test]
    fn watches_made_together_first_read_their_descriptors_in_different_ticks_within_the_bound() {
        let firsts: std::collections::BTreeSet<u64> = (0..RESCAN_TICKS).map(|_| first_rescan()).collect();
        assert_eq!(firsts.len() as u64, RESCAN_TICKS, "{firsts:?}");
        assert!(firsts.iter().all(|&t| (1..=RESCAN_TICKS).contains(&t)), "{firsts:?}");
    }

    #[test]
    fn this_process_is_named_by_its_own_id() {
        let null = dev_null();
        assert_eq!(me(), std::process::id() as i32);
        let fd = null.as_raw_fd();
        assert_eq!(compare_files(me(), fd, std::process::id() as i32, fd).unwrap(), Ordering::Equal);
    }
}
