//! Finding every process that holds a KVM VM, tick after tick, at a cost that does not grow with
//! what other processes hold.
//!
//! Reading a process's descriptors is one `readlink` each: a process of another user holding
//! 400,000 of them would make every tick of `--all` cost more than half a CPU. So:
//!
//! - where KVM's debugfs directory can be listed, it names every VM by the pid of the process
//!   that made it (`kvm/<pid>-<vm fd>`): only those processes are looked at; elsewhere every
//!   process is;
//! - a process's descriptors are read when it is first seen (a process is its pid and start
//!   time: a reused pid is a new process) and again only when their number changed (the size of its `fd` directory, which procfs keeps without
//!   listing it), and no more often than once per tick for each [`READS_PER_TICK`] descriptors it
//!   had: a process churning 400,000 descriptors is read once every hundred ticks, not every
//!   tick. Where the number cannot be told (a fixture tree, a kernel before 6.2), that bound alone
//!   applies;
//! - KVM names a VM's directory by the thread that made it, and makes none when a directory of
//!   that name is still there (a VM of a process that exited, held on by another): a VM made by
//!   a thread that took the id of one whose VM lingers has no directory. So besides the processes
//!   debugfs names, a process is looked at while it held a VM at its last reading, and a pid
//!   whose VM left (see [`KvmScan::recheck`]) while a process has it: a VMM that takes the pid
//!   of the one it replaced, as a restarted VMM may, is found with or without its directory;
//! - a process whose outcome stands while it lives (one a filter leaves out) is watched by its
//!   pidfd (`pidfd_open(2)`), and not read again until it exits: the pidfds of all are polled at
//!   once each tick. A thousand VMs a filter leaves out cost one `poll`, not two reads of `/proc`
//!   each (their start and their number of descriptors), which cost more than observing them;
//! - KVM's debugfs directory is watched (`inotify(7)`), and listed again only when a name was
//!   made or removed in it since the last listing, or the watch could not be had or ended, or
//!   `RELIST_TICKS` (64) ticks passed: on a host of a thousand VMs, its listing was the larger part
//!   of a quiet tick's scan.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io;

use super::discovery::{KvmFds, Procfs, is_refusal};
use hvstats_host::dir_watch::{DirWatch, Seen as WatchSeen};
use hvstats_host::exit_watch::{self, ExitWatch};

/// Descriptors of one process read per tick, averaged over the ticks between its readings.
pub const READS_PER_TICK: u64 = 4096;

/// Ticks a listing of KVM's debugfs directory is kept at most while its watch says nothing
/// changed: a bound on what a lost event could hide.
const RELIST_TICKS: u64 = 64;

/// What the last reading of one process found.
#[derive(Debug)]
struct Seen {
    start_time: u64,
    /// Its number of descriptors then, where procfs tells it.
    count: Option<u64>,
    /// The tick it was read at, and how many descriptors it had.
    read_at: u64,
    read: u64,
    /// Its KVM descriptors (empty when it holds no VM, or cannot be read).
    fds: KvmFds,
    /// Its exit, watched while its outcome stands ([`KvmScan::kvm_processes`]'s `settled`):
    /// it is not read again until it exits.
    exit: Option<ExitWatch>,
}

/// The processes holding a KVM VM, found anew each tick from what changed.
#[derive(Debug, Default)]
pub struct KvmScan {
    seen: BTreeMap<i32, Seen>,
    /// Pids whose VM left, looked at while a process has them.
    recheck: BTreeSet<i32>,
    /// Processes that may hold a VM (KVM's debugfs names them, or they run a VMM) whose
    /// descriptors this process was refused, with why.
    refused: BTreeMap<i32, io::Error>,
    /// The process of each VM directory of KVM's debugfs, as found when the directory was first
    /// listed (a directory lives as long as its VM: its name names the same thread meanwhile).
    named: BTreeMap<OsString, i32>,
    /// The watch of KVM's debugfs directory, made before the listing it guards.
    watch: Option<DirWatch>,
    /// What the last listing gave, while the watch says nothing changed since.
    listed: Option<BTreeSet<i32>>,
    /// The processes the last listing named that the one before did not.
    fresh: BTreeSet<i32>,
    /// Listings of the directory taken, and the tick of the last.
    listings: u64,
    listed_at: u64,
    tick: u64,
    /// Exit watches held (one descriptor each), and how many may be ([`watch_room`]).
    watches: usize,
    watch_room: Option<usize>,
}

/// Exit watches a scan may hold: a quarter of the open file limit, so that the processes it
/// leaves out never take the descriptors the VMs it observes count with.
fn watch_room() -> usize {
    hvstats_host::os::file_limits().map_or(0, |lim| usize::try_from(lim.rlim_cur / 4).unwrap_or(usize::MAX))
}

impl KvmScan {
    /// An empty scan: every process is read at its first tick.
    pub fn new() -> Self {
        Self::default()
    }

    /// The processes KVM's debugfs names as holding a VM (the thread that made each, taken to its
    /// process when its directory is first seen). `None` without a debugfs whose `kvm` directory
    /// can be listed, or when a new VM's thread has exited (its process can then only be found
    /// by its descriptors).
    fn debugfs_vm_pids(&mut self, procfs: &Procfs) -> Option<BTreeSet<i32>> {
        let seen = self.watch.as_mut().map_or(WatchSeen::Ended, DirWatch::take);
        if seen == WatchSeen::Quiet && self.listed.is_some() && self.tick < self.listed_at + RELIST_TICKS {
            // What the last listing named anew was told to the refreshes since.
            self.fresh.clear();
            return self.listed.clone();
        }
        if seen == WatchSeen::Ended {
            // Made before the listing it guards. A directory that cannot be watched (none yet, or
            // no inotify instance left to this user) is listed at every tick.
            self.watch = procfs.debugfs_kvm_dir().and_then(|dir| DirWatch::new(&dir).ok());
        }
        let listed = self.list_debugfs(procfs);
        self.listed_at = self.tick;
        self.listed = if self.watch.is_some() { listed.clone() } else { None };
        listed
    }

    /// [`debugfs_vm_pids`](Self::debugfs_vm_pids) from a listing of the directory.
    fn list_debugfs(&mut self, procfs: &Procfs) -> Option<BTreeSet<i32>> {
        self.listings += 1;
        self.fresh.clear();
        let threads = procfs.debugfs_vm_threads()?;
        self.named.retain(|name, _| threads.contains_key(name));
        let mut pids = BTreeSet::new();
        for (name, tid) in threads {
            let pid = match self.named.get(&name) {
                Some(pid) => *pid,
                None => {
                    let pid = procfs.thread_group(tid)?;
                    self.named.insert(name, pid);
                    self.fresh.insert(pid);
                    pid
                }
            };
            pids.insert(pid);
        }
        Some(pids)
    }

    /// Where KVM's debugfs is watched and no name was made or removed in it since the last
    /// listing (its watch holds no event, read or not): the processes that listing named anew,
    /// which made a VM since the listing before. `None` where that cannot be told (no watch, no
    /// listing kept, or a change since): any process may have made a VM then.
    pub fn made_vms_since_listing(&self) -> Option<&BTreeSet<i32>> {
        let watch = self.watch.as_ref()?;
        self.listed.as_ref()?;
        (!watch.pending()).then_some(&self.fresh)
    }

    /// Looks at `pid` at every tick from now on while a process has it, whether or not KVM's
    /// debugfs names it: its VM left, and a process taking the pid may make a VM KVM gives no
    /// directory (the old VM's may still be there under the same thread id).
    pub fn recheck(&mut self, pid: i32) {
        self.recheck.insert(pid);
    }

    /// The processes KVM's debugfs named, at the last tick, as having made a VM that lives (empty
    /// without debugfs).
    pub fn creators(&self) -> BTreeSet<i32> {
        self.named.values().copied().collect()
    }

    /// The start time of `pid` where the last tick's listing found it as the one before did (the
    /// same start, the same number of descriptors) and did not read its descriptors again.
    pub fn found_as_before(&self, pid: i32) -> Option<u64> {
        self.seen.get(&pid).filter(|s| s.read_at < self.tick).map(|s| s.start_time)
    }

    /// The processes that may hold a VM (KVM's debugfs names them, or they run a VMM) whose
    /// descriptors this process may not read, as of the last tick, with why.
    pub fn refused(&self) -> &BTreeMap<i32, io::Error> {
        &self.refused
    }

    /// Every process that holds a KVM VM now, with its descriptors, by pid, but those `known`
    /// names (the VMs observed already, whose refresh says when they go). Those `settled` names
    /// (whose outcome stands while they live: left out by a filter) are watched by pidfd once
    /// found so, and listed as they were found until they exit, without being read: a VM one of
    /// them makes meanwhile (after an `exec()`) is its, and left out with it.
    ///
    /// # Errors
    /// When the procfs root cannot be listed (out of descriptors, say): nothing is known then.
    pub fn kvm_processes(
        &mut self,
        procfs: &Procfs,
        known: &dyn Fn(i32) -> bool,
        settled: &dyn Fn(i32) -> bool,
    ) -> io::Result<Vec<(i32, KvmFds)>> {
        self.tick += 1;
        let debugfs = self.debugfs_vm_pids(procfs);
        let named_vm = |pid: i32| debugfs.as_ref().is_some_and(|n| n.contains(&pid));
        let pids: Vec<i32> = match debugfs.clone() {
            Some(mut named) => {
                named.extend(self.seen.iter().filter(|(_, s)| s.fds.has_vm()).map(|(p, _)| *p));
                named.extend(self.recheck.iter().copied());
                named.into_iter().collect()
            }
            None => procfs.pids()?,
        };
        self.seen.retain(|pid, _| pids.binary_search(pid).is_ok());
        self.refused.retain(|pid, _| pids.binary_search(pid).is_ok());
        self.watches = self.seen.values().filter(|s| s.exit.is_some()).count();
        exit_watch::poll_all(self.seen.values().filter_map(|s| s.exit.as_ref()));
        let mut found = Vec::new();
        for pid in pids.into_iter().filter(|p| !known(*p)) {
            // Watched, living, and still settled: as it was found.
            let watched =
                self.seen.get(&pid).is_some_and(|s| s.exit.as_ref().is_some_and(|w| !w.has_exited()));
            let there = (watched && settled(pid)) || self.look_at(procfs, pid, named_vm(pid));
            if !there {
                continue;
            }
            if settled(pid) {
                self.watch(procfs, pid);
            }
            if let Some(s) = self.seen.get(&pid)
                && s.fds.has_vm()
            {
                found.push((pid, s.fds.clone()));
            }
        }
        Ok(found)
    }
}

impl KvmScan {
    /// Reads process `pid` where it is new or changed since it was last read (`named_vm`: KVM's
    /// debugfs names it as having made a VM). False when it is gone, or not ours to look at:
    /// it holds nothing we can observe then, and is forgotten.
    fn look_at(&mut self, procfs: &Procfs, pid: i32, named_vm: bool) -> bool {
        let Ok(start_time) = procfs.start_time(pid) else {
            self.seen.remove(&pid);
            self.recheck.remove(&pid);
            self.refused.remove(&pid);
            return false;
        };
        let count = procfs.fd_count(pid).ok().flatten();
        let fresh = self.seen.get(&pid).is_some_and(|s| {
            s.start_time == start_time
                && ((count.is_some() && count == s.count) || self.tick < s.read_at + s.read / READS_PER_TICK)
        });
        if !fresh {
            let (fds, read) = match procfs.kvm_fds_read(pid) {
                Ok(read) => {
                    self.refused.remove(&pid);
                    read
                }
                // Refused: counted when the process may hold a VM, else nothing of ours.
                Err(e) if is_refusal(&e) && (named_vm || procfs.runs_vmm(pid)) => {
                    self.refused.insert(pid, e);
                    Default::default()
                }
                Err(_) => Default::default(),
            };
            self.seen.insert(pid, Seen { start_time, count, read_at: self.tick, read, fds, exit: None });
        }
        true
    }

    /// Watches the exit of `pid`, found as [`Seen`] at this tick, where it is not watched yet,
    /// room is left and a pidfd can be had ([`Procfs::exit_watch`]).
    fn watch(&mut self, procfs: &Procfs, pid: i32) {
        let room = *self.watch_room.get_or_insert_with(watch_room);
        let Some(seen) = self.seen.get_mut(&pid) else { return };
        if seen.exit.as_ref().is_some_and(|w| !w.exited()) || self.watches >= room {
            return;
        }
        seen.exit = procfs.exit_watch(pid, seen.start_time);
        self.watches += usize::from(seen.exit.is_some());
    }

    /// True when `pid` is watched by its pidfd, not read, while it lives.
    pub fn is_watched(&self, pid: i32) -> bool {
        self.seen.get(&pid).is_some_and(|s| s.exit.as_ref().is_some_and(|w| !w.exited()))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use hvstats_testkit::TempDir;

    use super::*;

    /// A VM directory in KVM's debugfs made by thread `tid` of process `pid`.
    fn vm_made(root: &Path, tid: i32, pid: i32, fd: u32) {
        std::fs::create_dir_all(root.join(format!("proc/{tid}"))).unwrap();
        std::fs::write(root.join(format!("proc/{tid}/status")), format!("Name:\tx\nTgid:\t{pid}\n")).unwrap();
        std::fs::create_dir_all(root.join(format!("debug/kvm/{tid}-{fd}"))).unwrap();
    }

    #[test]
    fn kvms_debugfs_is_listed_again_only_when_a_name_was_made_or_removed_in_it() {
        let root = TempDir::new("kvm-scan-listings");
        std::fs::create_dir_all(root.0.join("debug/kvm")).unwrap();
        let procfs = Procfs::at(root.0.join("proc"), Some(root.0.join("debug")));
        let mut scan = KvmScan::new();
        vm_made(&root.0, 101, 100, 11);
        assert_eq!(scan.debugfs_vm_pids(&procfs), Some(BTreeSet::from([100])));
        assert_eq!(scan.listings, 1);
        assert_eq!(scan.made_vms_since_listing(), Some(&BTreeSet::from([100])), "named anew");
        for _ in 0..3 {
            assert_eq!(scan.debugfs_vm_pids(&procfs), Some(BTreeSet::from([100])));
        }
        assert_eq!(scan.listings, 1, "nothing changed: the last listing stands");
        assert_eq!(scan.made_vms_since_listing(), Some(&BTreeSet::new()), "told once");
        // A VM made since: listed again at the next tick, once.
        vm_made(&root.0, 200, 200, 4);
        assert_eq!(scan.made_vms_since_listing(), None, "a change not listed yet: anyone may have made a VM");
        assert_eq!(scan.debugfs_vm_pids(&procfs), Some(BTreeSet::from([100, 200])));
        assert_eq!(scan.made_vms_since_listing(), Some(&BTreeSet::from([200])));
        assert_eq!(scan.debugfs_vm_pids(&procfs), Some(BTreeSet::from([100, 200])));
        assert_eq!(scan.made_vms_since_listing(), Some(&BTreeSet::new()));
        assert_eq!(scan.listings, 2);
        // A VM gone.
        std::fs::remove_dir(root.0.join("debug/kvm/101-11")).unwrap();
        assert_eq!(scan.debugfs_vm_pids(&procfs), Some(BTreeSet::from([200])));
        assert_eq!(scan.listings, 3);
        // A VM whose thread has exited can only be found by its descriptors: `None`, and asked
        // again at every tick, not kept.
        std::fs::create_dir_all(root.0.join("debug/kvm/300-4")).unwrap();
        assert_eq!(scan.debugfs_vm_pids(&procfs), None);
        assert_eq!(scan.debugfs_vm_pids(&procfs), None);
        assert_eq!(scan.made_vms_since_listing(), None, "no listing kept");
        assert_eq!(scan.listings, 5);
        std::fs::remove_dir(root.0.join("debug/kvm/300-4")).unwrap();
        assert_eq!(scan.debugfs_vm_pids(&procfs), Some(BTreeSet::from([200])));
        // However quiet, listed again every RELIST_TICKS ticks.
        let listings = scan.listings;
        scan.tick += RELIST_TICKS;
        assert_eq!(scan.debugfs_vm_pids(&procfs), Some(BTreeSet::from([200])));
        assert_eq!(scan.listings, listings + 1);
        assert_eq!(scan.debugfs_vm_pids(&procfs), Some(BTreeSet::from([200])));
        assert_eq!(scan.listings, listings + 1);
        // The directory removed and made again (KVM's module unloaded and loaded): watched anew.
        std::fs::remove_dir_all(root.0.join("debug/kvm")).unwrap();
        assert_eq!(scan.debugfs_vm_pids(&procfs), None, "no directory");
        std::fs::create_dir_all(root.0.join("debug/kvm")).unwrap();
        vm_made(&root.0, 101, 100, 11);
        assert_eq!(scan.debugfs_vm_pids(&procfs), Some(BTreeSet::from([100])));
        let listings = scan.listings;
        assert_eq!(scan.debugfs_vm_pids(&procfs), Some(BTreeSet::from([100])));
        assert_eq!(scan.listings, listings, "watched again");
        vm_made(&root.0, 200, 200, 4);
        assert_eq!(scan.debugfs_vm_pids(&procfs), Some(BTreeSet::from([100, 200])));
    }
}
