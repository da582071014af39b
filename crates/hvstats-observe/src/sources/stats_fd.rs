//! KVM's statistics of an observed VM read from the binary-stats descriptors its VMM already
//! holds: every KVM vCPU (and VM) statistic, whole-life, with no interruption of the guest.
//!
//! KVM refuses `KVM_GET_STATS_FD` to any process but the VM's own (`kvm->mm != current->mm`), but
//! a descriptor the VMM opened (QEMU ≥ 8.1 keeps one per vCPU, `anon_inode:kvm-vcpu-stats:N` in
//! `/proc/<pid>/fd`) reads the same from anywhere: root copies it with `pidfd_open(2)` and
//! `pidfd_getfd(2)` and `pread`s it as our own VPs read theirs ([`KvmStats`]). A VMM that holds
//! none (QEMU before 8.1 opens one per query and closes it) has no such source; one whose
//! descriptors cannot be copied (not root) has a source that gives nothing and says why.
//!
//! The VMM's `fd` directory only says what a descriptor number held when it was read: the VMM
//! may `dup2` anything into that number before it is copied. So the copy itself is checked
//! ([`check_copy`]): it must be an anonymous inode that the kernel names, in this process's own
//! `/proc/self/fd`, as KVM's statistics of that vCPU (or the VM), and its header must describe
//! no more than KVM makes ([`KvmStats::parse`]). Anything else refuses the whole source, said
//! once ([`VmSource::refused`]); nothing is allocated from a size the VMM chose.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io;
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, PoisonError};

use hvstats::SharedPage;
use hvstats_abi::ObjectKind;
use hvstats_abi::vm_sources::Origin;
use hvstats_host::bpf::stats_copy::{CopySlot, StatsOf};

use super::kvm_stat_map::Resolved;
use super::vm_source::{Learned, VmAttach, VmSource, VmView};
use crate::attach::ObserveError;
use crate::vm_identity::{self, copy_fd, pidfd};
use hvstats_abi::counter_set::CounterSet;
use hvstats_host::os::check;
use hvstats_sources::counter_source::Gives;
use hvstats_sources::counter_source::{CounterSource, Object};
use hvstats_sources::kvm_stats::{Descriptors, KvmStats, Stat};

/// The descriptor link of a vCPU's statistics (`anon_inode:kvm-vcpu-stats:<vcpu id>`).
const VCPU_STATS: &str = "anon_inode:kvm-vcpu-stats:";
/// The descriptor link of a VM's statistics.
const VM_STATS: &str = "anon_inode:kvm-vm-stats";
/// The file system of anonymous inodes (`ANON_INODE_FS_MAGIC`), where KVM's descriptors live.
const ANON_INODE_FS_MAGIC: i64 = 0x0904_1934;

/// One copied descriptor and its last reading.
#[derive(Debug)]
struct Copied {
    /// Its slot in the kernel's copy of every listed descriptor's statistics, where it has one:
    /// dropped before `stats`, the descriptor it lists.
    slot: Option<CopySlot>,
    stats: KvmStats,
    /// Its counters, located in its data block once (its statistics are fixed while it is open),
    /// shared with every copy of the same layout ([`located`]).
    resolved: Arc<Resolved<Stat>>,
    /// The words of its data block the located counters are in: all a refresh reads.
    words: Range<usize>,
    /// Where its last reading is.
    reading: Reading,
}

std::thread_local! {
    /// A block copied out of the kernel's copy, to write its counters from.
    static SCRATCH: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The counters of `kind` located in `stats`, and the words of its data block they are in: taken
/// from the copy of another descriptor of the same layout when one was made. Every vCPU of a
/// host's VMs has the same layout, and every VM the same: an observer of a thousand VMs keeps
/// two, which a refresh finds warm, where one a VM would be read cold at each.
fn located(stats: &KvmStats, kind: ObjectKind) -> (Arc<Resolved<Stat>>, Range<usize>) {
    type Kept = (Descriptors, ObjectKind, Arc<Resolved<Stat>>, Range<usize>);
    /// A few are enough: a vCPU's and a VM's, of each KVM module loaded meanwhile.
    const MAX_KEPT: usize = 8;
    static KEPT: Mutex<Vec<Kept>> = Mutex::new(Vec::new());
    let layout = stats.descriptors();
    let mut kept = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((.., resolved, words)) = kept.iter().find(|(l, k, ..)| *l == layout && *k == kind) {
        return (resolved.clone(), words.clone());
    }
    // Every statistic located, whether or not its counter keeps it: a few words more at most,
    // never one less.
    let words = std::cell::RefCell::new(0..0);
    let resolved = Resolved::of(kind, &|name, buckets| {
        let stat = stats.stat(name).filter(|stat| !buckets || stat.is_histogram())?;
        let mut all = words.borrow_mut();
        let at = stat.words();
        *all = if all.is_empty() { at } else { all.start.min(at.start)..all.end.max(at.end) };
        Some(stat)
    });
    let (resolved, words) = (Arc::new(resolved), words.into_inner());
    if kept.len() < MAX_KEPT {
        kept.push((layout, kind, resolved.clone(), words.clone()));
    }
    (resolved, words)
}

/// Where a descriptor's last reading is.
#[derive(Debug)]
enum Reading {
    /// Not read yet.
    None,
    /// In its slot of this tick's copy in the kernel, read from there.
    Copied,
    /// Read by `pread` into this buffer (a data block's words).
    Read(Vec<u64>),
}

impl Copied {
    /// `stats`, of an object of `kind`, its counters located anew or taken from those of an
    /// earlier copy of the same layout ([`located`]).
    fn new(stats: KvmStats, kind: ObjectKind) -> Self {
        let (resolved, words) = located(&stats, kind);
        let of = match kind {
            ObjectKind::Partition => StatsOf::Vm,
            _ => StatsOf::Vcpu,
        };
        let slot = CopySlot::add(stats.as_fd(), of, stats.data_block().1);
        Self { slot, stats, resolved, words, reading: Reading::None }
    }

    /// Reads the words of its located counters: where this tick's copy in the kernel has them,
    /// they are read from there when written; else in one `pread`.
    fn read(&mut self) -> io::Result<()> {
        if self.slot.as_ref().is_some_and(CopySlot::is_fresh) {
            self.reading = Reading::Copied;
            return Ok(());
        }
        let mut data = match std::mem::replace(&mut self.reading, Reading::None) {
            Reading::Read(data) => data,
            _ => vec![0; self.stats.data_words()],
        };
        self.stats.read_words_into(&mut data, self.words.clone())?;
        self.reading = Reading::Read(data);
        Ok(())
    }

    /// The counters its reading gives: none before it was read.
    fn given(&self) -> CounterSet {
        match self.reading {
            Reading::None => CounterSet::EMPTY,
            _ => self.resolved.given(),
        }
    }

    /// Writes the counters of `only` from its last reading (nothing before the first).
    fn write(&self, page: &SharedPage, only: &CounterSet) {
        let write = |data: &[u64]| {
            let value = |stat: Stat| if stat.is_time() { stat.nanoseconds(data) } else { stat.raw(data) };
            self.resolved.write(page, only, value, |stat| stat.values(data));
        };
        match (&self.reading, &self.slot) {
            (Reading::Read(data), _) => write(data),
            // Still this tick's: copied at its start, read now (a copy made since, by another
            // observer in this process, is as fresh). Copied whole into a buffer first: one
            // pass in order, where the counters' reads jump about the block.
            (Reading::Copied, Some(slot)) => {
                _ = slot.with_words(|words| {
                    SCRATCH.with_borrow_mut(|scratch| {
                        scratch.clear();
                        scratch.extend_from_slice(words);
                        write(scratch);
                    });
                });
            }
            _ => {}
        }
    }
}

/// The VMM's statistics descriptors, copied.
#[derive(Debug)]
pub struct StatsFd {
    /// By VP index.
    vcpus: BTreeMap<u32, Copied>,
    /// VPs of the VM.
    vp_count: usize,
    vm: Option<Copied>,
    error: Option<String>,
    /// Why what the VMM held was refused, when it was.
    refused: Option<String>,
    /// What it gives, worked out at each read (asked several times a refresh).
    gives: Gives,
}

/// The statistics descriptors a VMM holds, from its `fd` directory: by vCPU id, and the VM's.
#[derive(Debug, Default)]
struct Held {
    vcpus: BTreeMap<u32, RawFd>,
    vm: Option<RawFd>,
    /// A statistics descriptor held twice as distinct files (of two VMs, or two opens): which one
    /// is its VM's cannot be told. Its link, and how many.
    twice: Option<(String, usize)>,
}

/// The statistics descriptors `pid` holds, from its `fd` directory `fd_dir`, but those that are
/// `superseded` (copies of the statistics of a VM it ran before, see [`VmAttach::superseded`]).
fn held(fd_dir: &std::path::Path, pid: i32, superseded: &[OwnedFd]) -> io::Result<Held> {
    let mut held = Held::default();
    // Each link's first descriptor, and how many distinct files it names.
    let mut seen: BTreeMap<String, (RawFd, usize)> = BTreeMap::new();
    for entry in fs::read_dir(fd_dir)?.flatten() {
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse::<RawFd>().ok()) else { continue };
        let Ok(link) = fs::read_link(entry.path()) else { continue };
        let link = link.to_string_lossy();
        let id = link.strip_prefix(VCPU_STATS).and_then(|id| id.parse::<u32>().ok());
        if (id.is_none() && link != VM_STATS) || vm_identity::is_one_of(pid, fd, superseded) {
            continue;
        }
        let (first, files) = seen.entry(link.to_string()).or_insert((fd, 0));
        // A duplicate of the same file (`dup`) is that file again, not another.
        if *files > 0 && vm_identity::same_files(pid, *first, pid, fd) {
            continue;
        }
        *files += 1;
        if *files > 1 {
            held.twice = Some((link.to_string(), *files));
        }
        match id {
            Some(id) => _ = held.vcpus.insert(id, fd),
            None => held.vm = Some(fd),
        }
    }
    Ok(held)
}

/// Why a copied descriptor is not KVM's statistics named `link` (`VCPU_STATS` with the vCPU id,
/// or `VM_STATS`), `None` when it is: an anonymous inode that this process's own
/// `/proc/self/fd` names so. Only KVM makes anonymous inodes of those names, and nobody but
/// this process can change what its own descriptor refers to.
fn check_copy(file: &File, link: &str) -> Option<String> {
    // SAFETY: an all-zero statfs is a valid value of the plain C struct the kernel fills.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs writes one statfs into `fs`, which we own, about a descriptor we hold.
    if let Err(e) = check(unsafe { libc::fstatfs(file.as_raw_fd(), &mut fs) }) {
        return Some(format!("its file system cannot be read: {e}"));
    }
    if fs.f_type as i64 != ANON_INODE_FS_MAGIC {
        return Some(format!("it is a file, not KVM's (file system {:#x})", fs.f_type));
    }
    match fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())) {
        Ok(is) if is.as_os_str() == link => None,
        Ok(is) => Some(format!("it is {:?}", is.to_string_lossy())),
        Err(e) => Some(format!("its copy cannot be named: {e}")),
    }
}

/// Why copying and reading the VMM's statistics descriptors did not work.
enum Failure {
    /// A descriptor could not be copied or read (this process is not root, or one is gone).
    Copy(io::Error),
    /// The VMM held something other than KVM's statistics there.
    Refused(String),
}

/// Descriptor `fd` of the VMM, copied, checked to be KVM's statistics named `link`, and parsed
/// (its counters located as in any other copy of the same layout).
fn copy_checked(pidfd: &OwnedFd, fd: RawFd, link: &str, kind: ObjectKind) -> Result<Copied, Failure> {
    let file = copy_fd(pidfd, fd).map_err(Failure::Copy)?;
    if let Some(why) = check_copy(&file, link) {
        return Err(Failure::Refused(format!("descriptor {fd}, listed as {link:?}: {why}")));
    }
    let stats = KvmStats::parse(file).map_err(|e| match e.kind() {
        io::ErrorKind::InvalidData => Failure::Refused(format!("descriptor {fd} ({link}): {e}")),
        _ => Failure::Copy(e),
    })?;
    Ok(Copied::new(stats, kind))
}

/// Copies the statistics descriptors the VMM holds; `None` when it holds none.
///
/// # Errors
/// Never: descriptors that cannot be copied are the source's own state.
pub fn open(at: &VmAttach<'_>) -> Result<Option<Box<dyn VmSource>>, ObserveError> {
    let fd_dir = at.procfs.root().join(at.pid.to_string()).join("fd");
    let Ok(held) = held(&fd_dir, at.pid, at.superseded) else { return Ok(None) };
    let Held { vcpus: vcpu_fds, vm: vm_fd, twice } = held;
    if vcpu_fds.is_empty() && vm_fd.is_none() {
        return Ok(None);
    }
    let mut me = StatsFd {
        vcpus: BTreeMap::new(),
        vp_count: at.fds.vcpus.len(),
        vm: None,
        error: None,
        refused: None,
        gives: Gives::NOTHING,
    };
    // The VP index of a vCPU is its place among the VM's vCPU ids, as the observer numbers VPs.
    let index_of: BTreeMap<u32, u32> =
        at.fds.vcpus.keys().enumerate().map(|(i, &id)| (id, i as u32)).collect();
    // Two files under one name: one is another VM's (or a copy the VMM made), and which cannot be
    // told from here; taking either could read a VM that no longer runs.
    let unique = match twice {
        Some((link, n)) => Err(Failure::Refused(format!(
            "it holds {n} distinct descriptors listed as {link:?}: which is its VM's cannot be told"
        ))),
        None => Ok(()),
    };
    let copied = unique.and_then(|()| pidfd(at.pid).map_err(Failure::Copy)).and_then(|pidfd| {
        for (id, fd) in &vcpu_fds {
            if let Some(&index) = index_of.get(id) {
                let link = format!("{VCPU_STATS}{id}");
                let copied = copy_checked(&pidfd, *fd, &link, ObjectKind::Vp)?;
                me.vcpus.insert(index, copied);
            }
        }
        if let Some(fd) = vm_fd {
            me.vm = Some(copy_checked(&pidfd, fd, VM_STATS, ObjectKind::Partition)?);
        }
        Ok(())
    });
    match copied {
        Ok(()) => {}
        Err(Failure::Copy(e)) => {
            me.error = Some(format!("cannot copy the VMM's KVM statistics descriptors: {e}"));
        }
        Err(Failure::Refused(why)) => {
            me.error = Some(format!("refused what the VMM holds as KVM's statistics: {why}"));
            me.refused = Some(why);
        }
    }
    if me.error.is_some() {
        me.vcpus.clear();
        me.vm = None;
    }
    Ok(Some(Box::new(me)))
}

impl StatsFd {
    /// The counters its last readings give: the VM's, and each VP counter every vCPU's reading
    /// gives, none unless every vCPU's statistics were read (a VP without its reading would keep
    /// a stale value), as [`super::kvm_stat_map::gives`] makes of them.
    fn work_out_gives(&self) -> Gives {
        let vp = match self.vcpus.len() == self.vp_count {
            true => {
                self.vcpus.values().map(Copied::given).reduce(|a, b| a.intersection(&b)).unwrap_or_default()
            }
            false => CounterSet::EMPTY,
        };
        Gives { partition: self.vm.as_ref().map(Copied::given).unwrap_or_default(), vp }
    }
}

impl CounterSource for StatsFd {
    fn name(&self) -> &'static str {
        "stats-fd"
    }

    fn gives(&self) -> Gives {
        self.gives
    }

    fn write(&self, object: Object, page: &SharedPage, only: &CounterSet) {
        let copied = match object {
            Object::Vp(index) => self.vcpus.get(&index),
            Object::Partition => self.vm.as_ref(),
        };
        if let Some(c) = copied {
            c.write(page, only);
        }
    }

    fn unavailable(&self) -> Vec<String> {
        let mut why: Vec<String> = self.error.iter().cloned().collect();
        if self.error.is_none() && self.vcpus.len() < self.vp_count {
            why.push(format!(
                "the VMM holds statistics descriptors for {} of its {} vCPUs",
                self.vcpus.len(),
                self.vp_count
            ));
        }
        why
    }
}

impl VmSource for StatsFd {
    fn read(&mut self, _vm: &VmView<'_>) -> Learned {
        let mut failed = None;
        for c in self.vcpus.values_mut().chain(self.vm.as_mut()) {
            if let Err(e) = c.read() {
                failed = Some(e);
            }
        }
        if let Some(e) = failed {
            // KVM's statistics of a live vCPU do not fail to read: what did is no longer given.
            self.error = Some(format!("cannot read a copied KVM statistics descriptor: {e}"));
            self.vcpus.clear();
            self.vm = None;
        }
        self.gives = self.work_out_gives();
        Learned {
            error: self.error.clone(),
            refused: self.refused.clone(),
            ..Learned::holding(self.vcpus.len() + usize::from(self.vm.is_some()))
        }
    }

    fn origin(&self) -> Origin {
        Origin::VcpuCreation
    }

    fn vmm_copies(&self) -> Vec<std::os::fd::BorrowedFd<'_>> {
        self.vcpus.values().chain(self.vm.as_ref()).map(|c| c.stats.as_fd()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counters_of_one_layout_are_located_once_for_every_vm() {
        let Ok(kvm) = kvm_ioctls::Kvm::new() else {
            assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "/dev/kvm is required");
            return;
        };
        let open = |vcpus: u64| {
            let vm = kvm.create_vm().unwrap();
            let vcpus: Vec<_> = (0..vcpus).map(|i| vm.create_vcpu(i).unwrap()).collect();
            let stats: Vec<KvmStats> =
                vcpus.iter().map(|v| hvstats_sources::kvm_stats::open_for(v).unwrap()).collect();
            let vm_stats = hvstats_sources::kvm_stats::open_for(&vm).unwrap();
            (vm, vcpus, stats, vm_stats)
        };
        let (_a, _av, a, a_vm) = open(2);
        let (_b, _bv, b, b_vm) = open(1);
        let (first, words) = located(&a[0], ObjectKind::Vp);
        for other in [&a[1], &b[0]] {
            let (same, same_words) = located(other, ObjectKind::Vp);
            assert!(Arc::ptr_eq(&first, &same), "one location for every vCPU, of either VM");
            assert_eq!(same_words, words);
        }
        let (vm, _) = located(&a_vm, ObjectKind::Partition);
        assert!(Arc::ptr_eq(&vm, &located(&b_vm, ObjectKind::Partition).0), "one for every VM");
        assert!(!Arc::ptr_eq(&vm, &first), "a VM's and a vCPU's are located apart");
        assert!(!first.given().is_empty() && !vm.given().is_empty());
    }
}
