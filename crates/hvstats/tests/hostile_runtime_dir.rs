//! A runtime directory nobody can turn against root, and readers no file can crash: each test
//! plants what a careless user or an attacker could, and checks hvstats refuses it clearly,
//! without following, hanging, over-allocating or dying.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hvstats::attach::{Attach, AttachError};
use hvstats::index;
use hvstats::publish;
use hvstats::rules::StatsObject;
use hvstats::runtime_dir::RuntimeDirError;
use hvstats::trust::Distrust;
use hvstats::{Hypervisor, InstanceConfig};
use hvstats_abi::catalog::vp;
use hvstats_host::error_chain::error_chain;

use hvstats_testkit::TempDir;

fn publish(dir: &Path) -> Result<std::sync::Arc<Hypervisor>, String> {
    Hypervisor::with_config(InstanceConfig {
        runtime_dir: Some(dir.to_owned()),
        logical_processors: Some(vec![0]),
        ..Default::default()
    })
    .map_err(|e| error_chain(&e))
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn a_world_writable_runtime_directory_is_refused_by_publishers_and_readers() {
    let tmp = TempDir::new("world-writable");
    std::fs::set_permissions(&tmp.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = publish(&tmp.0).unwrap_err();
    assert!(e.contains(&tmp.0.display().to_string()) && e.contains("chmod go-w"), "{e}");
    let e = Attach::new(&tmp.0).refresh().unwrap_err();
    assert!(matches!(e, AttachError::Dir(RuntimeDirError::Writable { .. })), "{e}");
    // A writable instances directory inside a good one is refused the same way.
    std::fs::set_permissions(&tmp.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let instances = publish::instances_dir(&tmp.0);
    std::fs::create_dir(&instances).unwrap();
    std::fs::set_permissions(&instances, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = publish(&tmp.0).unwrap_err();
    assert!(e.contains("instances") && e.contains("writable"), "{e}");
}

#[test]
fn a_runtime_directory_of_another_user_is_refused() {
    if !is_root() {
        eprintln!("skipped: needs root to give the directory to another user");
        return;
    }
    let tmp = TempDir::new("owner");
    let c = CString::new(tmp.0.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; chown to nobody.
    assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0);
    let e = publish(&tmp.0).unwrap_err();
    assert!(e.contains("belongs to uid 65534") && e.contains("a runtime directory of your own"), "{e}");
    let e = Attach::new(&tmp.0).refresh().unwrap_err();
    assert!(matches!(e, AttachError::Dir(RuntimeDirError::Owner { owner: 65534, .. })), "{e}");
}

#[test]
fn a_swapped_instances_directory_is_never_followed() {
    let tmp = TempDir::new("swapped");
    let elsewhere = TempDir::new("swapped-target");
    std::fs::write(elsewhere.0.join("keep"), b"x").unwrap();
    std::os::unix::fs::symlink(&elsewhere.0, publish::instances_dir(&tmp.0)).unwrap();
    let e = publish(&tmp.0).unwrap_err();
    assert!(e.contains("not a directory"), "{e}");
    assert!(Attach::new(&tmp.0).refresh().is_err());
    assert!(elsewhere.0.join("keep").exists());
}

#[test]
fn planted_links_and_fifos_are_refused_without_following_or_hanging() {
    let tmp = TempDir::new("planted");
    let hv = publish(&tmp.0).unwrap();
    let instances = publish::instances_dir(&tmp.0);
    // A link to a root-only file, and a FIFO, under instance names.
    std::os::unix::fs::symlink("/etc/shadow", instances.join("7-7-7.arena")).unwrap();
    let fifo = CString::new(instances.join("8-8-8.arena").as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let started = Instant::now();
    let mut attach = Attach::new(&tmp.0);
    let changes = attach.refresh().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "a FIFO made the reader wait");
    assert_eq!(attach.instances().count(), 1, "the real instance is still read");
    let problems: Vec<String> = changes.problems.iter().map(|p| error_chain(p)).collect();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems.iter().all(|p| p.contains("is not a regular file")), "{problems:?}");
    // A new publisher neither follows nor removes what it cannot vouch for.
    drop(publish(&tmp.0).unwrap());
    assert!(Path::new("/etc/shadow").exists());
    drop(hv);
}

#[test]
fn numbers_in_the_index_are_not_trusted_for_sizes() {
    let tmp = TempDir::new("huge-counts");
    let hv = publish(&tmp.0).unwrap();
    let p = hv.create_partition(2).unwrap();
    p.vp_page(1).unwrap().set(vp::HYPERCALLS, 3);
    let path = hv.published_path().unwrap();
    // Claim 4 billion VPs and 2^64-1 chunks, as a hostile or broken writer could.
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    let reader = hvstats::reader::ArenaReader::open(std::fs::File::open(&path).unwrap()).unwrap();
    let slot = (0..reader.slots())
        .find(|&s| {
            let words = reader.entry_words(s).unwrap();
            matches!(index::Entry::decode(&words), Ok(Some(e)) if e.kind == hvstats_abi::ObjectKind::Partition)
        })
        .unwrap();
    use std::os::unix::fs::FileExt;
    file.write_all_at(&u64::MAX.to_le_bytes(), 4 * 8).unwrap(); // header: chunks
    file.write_all_at(&4_294_967_295u64.to_le_bytes(), (index::entry_offset(slot) + 6 * 8) as u64).unwrap();
    let mut attach = Attach::new(&tmp.0);
    attach.refresh().unwrap();
    let instance = attach.instances_mut().next().unwrap();
    assert_eq!(instance.partitions()[0].vp_indices(), &[0, 1], "VPs are counted, not believed");
    let snap = instance.snapshot();
    assert_eq!(snap.partitions[0].vps.len(), 2);
    assert_eq!(snap.partitions[0].vps[1].reading.get("Hypercalls/sec"), Some(3));
    drop(file);
}

#[test]
fn a_sparse_arena_claiming_every_chunk_is_read_without_mapping_it() {
    let tmp = TempDir::new("sparse-arena");
    let hv = publish(&tmp.0).unwrap();
    let p = hv.create_partition(2).unwrap();
    p.vp_page(1).unwrap().set(vp::HYPERCALLS, 3);
    let path = hv.published_path().unwrap();
    let before = hvstats::reader::ArenaReader::open(std::fs::File::open(&path).unwrap()).unwrap();
    assert!(before.is_mapped(), "a publisher's arena is mapped");
    // The largest arena a publisher makes (16,384 chunks, 1.3 GB), as a hole: nothing backs it.
    let most = hvstats::arena::MAX_SLOTS / index::CHUNK_SLOTS;
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    use std::os::unix::fs::FileExt;
    file.write_all_at(&(most as u64).to_le_bytes(), 4 * 8).unwrap(); // header: chunks
    file.set_len(index::file_bytes(most) as u64).unwrap();
    let reader = hvstats::reader::ArenaReader::open(std::fs::File::open(&path).unwrap()).unwrap();
    assert!(!reader.is_mapped(), "1.3 GB of holes mapped");
    assert_eq!(reader.slots(), most * index::CHUNK_SLOTS);
    // A reader that mapped it before stops mapping when it follows the growth.
    let mut before = before;
    before.grow().unwrap();
    assert!(!before.is_mapped());
    // And what the arena holds still reads.
    let mut attach = Attach::new(&tmp.0);
    attach.refresh().unwrap();
    let instance = attach.instances_mut().next().unwrap();
    let snap = instance.snapshot();
    assert_eq!(snap.partitions[0].vps[1].reading.get("Hypercalls/sec"), Some(3));
    drop(file);
}

/// A process running as `uid` that holds the publisher's lock on `path` through its own open file
/// until dropped, as a publisher run by that user would.
struct Holder(std::process::Child);

impl Holder {
    fn spawn(path: &Path, uid: u32) -> Self {
        use std::os::unix::process::CommandExt;
        let file = std::fs::File::open(path).unwrap();
        let fd = file.as_raw_fd();
        let mut cmd = Command::new("sleep");
        cmd.arg("120");
        // SAFETY: between fork and exec the child makes only async-signal-safe calls (flock,
        // fcntl, setgroups, setgid, setuid) on an fd it inherited.
        unsafe {
            cmd.pre_exec(move || {
                if libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) != 0
                    || libc::fcntl(fd, libc::F_SETFD, 0) != 0
                    || libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(uid) != 0
                    || libc::setuid(uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        // spawn returns once the child has exec'ed: the lock is held from here on.
        let child = cmd.spawn().unwrap();
        drop(file);
        Self(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A copy of `hv`'s arena under the live name `99-99-99`, owned by `owner`, claiming publisher
/// `claimed` (None: the pid of the holder), held by a process running as `holder_uid`.
fn planted_copy(
    hv: &Hypervisor,
    instances: &Path,
    owner: u32,
    holder_uid: u32,
    claimed: Option<u64>,
) -> (PathBuf, Holder) {
    use std::os::unix::fs::FileExt;
    let copy = instances.join("99-99-99.arena");
    std::fs::copy(hv.published_path().unwrap(), &copy).unwrap();
    let c = CString::new(copy.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::chown(c.as_ptr(), owner, owner) }, 0);
    let holder = Holder::spawn(&copy, holder_uid);
    let claimed = claimed.unwrap_or(u64::from(holder.pid()));
    // The header's publisher pid (word 6).
    let file = std::fs::OpenOptions::new().write(true).open(&copy).unwrap();
    file.write_all_at(&claimed.to_le_bytes(), 6 * 8).unwrap();
    (copy, holder)
}

const COPY: publish::InstanceName = publish::InstanceName { pid: 99, start_time: 99, seq: 99 };

#[test]
fn an_arena_another_user_can_truncate_is_read_with_pread_and_truncation_cannot_kill_the_reader() {
    if !is_root() {
        eprintln!("skipped: needs root to give a file to another user");
        return;
    }
    let tmp = TempDir::new("truncated");
    let hv = publish(&tmp.0).unwrap();
    let p = hv.create_partition(1).unwrap();
    p.vp_page(0).unwrap().set(vp::HYPERCALLS, 11);
    let instances = publish::instances_dir(&tmp.0);
    // A copy of the arena owned by nobody and held by a process running as nobody (who could
    // truncate it at any moment): believed, but never mapped.
    let (copy, _holder) = planted_copy(&hv, &instances, 65534, 65534, None);

    let mut attach = Attach::new(&tmp.0);
    let changes = attach.refresh().unwrap();
    assert!(changes.problems.is_empty(), "{:?}", changes.problems);
    let instance = attach.instance(COPY).expect("the copy is read");
    assert!(!instance.is_mapped(), "never mapped: its owner could truncate it under us");
    let id = instance.partitions()[0].id;
    assert_eq!(instance.read(StatsObject::Vp(id, 0)).unwrap().data[vp::HYPERCALLS.slot()], 11);
    // Truncated under the reader: reads fail, the reader lives.
    std::fs::OpenOptions::new().write(true).open(&copy).unwrap().set_len(4096).unwrap();
    assert!(matches!(instance.read(StatsObject::Vp(id, 0)), Err(AttachError::Changed(_))));
}

#[test]
fn an_instance_whose_files_are_not_its_holders_is_not_believed() {
    if !is_root() {
        eprintln!("skipped: needs root to give a file to another user");
        return;
    }
    let tmp = TempDir::new("not-the-holders");
    let hv = publish(&tmp.0).unwrap();
    hv.create_partition(1).unwrap();
    let instances = publish::instances_dir(&tmp.0);
    // Nobody's file, kept alive by a root process: whoever wrote it is not who vouches for it.
    let (copy, holder) = planted_copy(&hv, &instances, 65534, 0, None);
    let mut attach = Attach::new(&tmp.0);
    let changes = attach.refresh().unwrap();
    assert!(attach.instance(COPY).is_none());
    assert_eq!(attach.instances().count(), 1, "the real instance is still read");
    let [AttachError::Untrusted { path, why }] = changes.problems.as_slice() else {
        panic!("{:?}", changes.problems)
    };
    assert_eq!(path, &copy);
    assert_eq!(why, &Distrust::NotTheHoldersFile { owner: 65534, pid: holder.pid(), holder_uid: 0 });
    let message = error_chain(&changes.problems[0]);
    assert!(message.contains("99-99-99.arena") && message.contains("uid 65534"), "{message}");
}

#[test]
fn a_copy_claiming_another_publisher_is_not_believed() {
    if !is_root() {
        eprintln!("skipped: needs root to run a holder");
        return;
    }
    let tmp = TempDir::new("other-pid");
    let hv = publish(&tmp.0).unwrap();
    hv.create_partition(1).unwrap();
    let instances = publish::instances_dir(&tmp.0);
    // A root-owned copy of this process's instance (its header names this process), held by
    // another root process: not the instance it claims to be.
    let me = u64::from(std::process::id());
    let (_copy, holder) = planted_copy(&hv, &instances, 0, 0, Some(me));
    let mut attach = Attach::new(&tmp.0);
    let changes = attach.refresh().unwrap();
    assert!(attach.instance(COPY).is_none());
    let [AttachError::Untrusted { why, .. }] = changes.problems.as_slice() else {
        panic!("{:?}", changes.problems)
    };
    assert_eq!(why, &Distrust::NotTheClaimedPid { claimed: me, pid: holder.pid() });
}

#[test]
fn a_full_filesystem_is_a_clear_error_at_creation_never_a_sigbus() {
    if !is_root() {
        eprintln!("skipped: needs root to mount a small tmpfs");
        return;
    }
    let tmp = TempDir::new("full");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs"])
        .arg(&tmp.0)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("skipped: cannot mount a tmpfs here");
        return;
    }
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(&tmp.0);
    let e = publish(&tmp.0).unwrap_err();
    assert!(e.contains("cannot allocate the arena") && e.contains("No space left on device"), "{e}");

    // With room for the instance but not for many partitions: creation fails cleanly, and the
    // pages already made keep counting.
    let _ = Command::new("mount").args(["-o", "remount,size=1m"]).arg(&tmp.0).status();
    let hv = publish(&tmp.0).unwrap();
    let mut made = Vec::new();
    let err = loop {
        match hv.create_partition(16) {
            Ok(p) => made.push(p),
            Err(e) => break e,
        }
        assert!(made.len() < 100, "a 1 MiB tmpfs holds fewer than 100 × 17 pages");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    for p in &made {
        p.vp_page(15).unwrap().set(vp::HYPERCALLS, 1);
    }
    assert!(!made.is_empty());
}

#[test]
fn an_arena_its_owner_truncates_under_a_mapping_is_a_clear_error_not_a_sigbus() {
    let tmp = TempDir::new("shrunk-mapped");
    let hv = publish(&tmp.0).unwrap();
    let p = hv.create_partition(64).unwrap();
    p.vp_page(63).unwrap().set(vp::HYPERCALLS, 63);
    let path = hv.published_path().unwrap();
    let mut attach = Attach::new(&tmp.0);
    assert!(attach.refresh().unwrap().problems.is_empty());
    let name = attach.instances().next().unwrap().name();
    let instance = attach.instance(name).unwrap();
    assert!(instance.is_mapped(), "this user's arena is mapped");
    let id = instance.partitions()[0].id;
    let last = StatsObject::Vp(id, 63);
    assert_eq!(instance.read(last).unwrap().data[vp::HYPERCALLS.slot()], 63);
    // Its owner truncates it under the reader's mapping.
    let before = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(8192).unwrap();
    // The publisher would fault writing past the end it was cut to (as it leaves): it is left as
    // it is.
    std::mem::forget((p, hv));
    assert!(before > 8192 * 4, "VP 63's page lay past the new end ({before} bytes before)");
    // The read that meets the new end is an error of that read, and the reader lives.
    assert!(matches!(instance.read(last), Err(AttachError::Changed(_))));
    assert!(!instance.is_mapped(), "read with pread since");
    // The next look says why, and reads the instance again from what its file holds now.
    let changes = attach.refresh().unwrap();
    let [AttachError::Shrunk { path: shrunk, size: 8192 }] = changes.problems.as_slice() else {
        panic!("{:?}", changes.problems)
    };
    assert_eq!(shrunk, &path);
    let message = error_chain(&changes.problems[0]);
    assert!(message.contains("shrank to 8192 bytes while it was read"), "{message}");
    let instance = attach.instance(name).expect("read again");
    assert!(instance.partitions().is_empty(), "no page of it is left: {:?}", instance.partitions());
    assert!(attach.refresh().unwrap().problems.is_empty(), "said once");
}
