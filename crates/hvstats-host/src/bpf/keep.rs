//! Counts that outlive their counter: an engine's maps and links pinned in the BPF filesystem, so
//! the kernel keeps counting while no observer runs, and the next observer re-adopts them.
//!
//! Everything kept lives under `/sys/fs/bpf/hvstats/<identity>/<layout>/` (each directory 0700
//! and ours): `<identity>` names the runtime directory of the observer that made it (so observers
//! of separate runtime directories never adopt each other's counts), `<layout>` is a digest of
//! the columns, the thread table and the program assembler's sources (so only the very programs
//! that made the counts are adopted: any other version or layout is dropped, and said to be).
//! Beside the maps the programs write, an `owners` map names each row's thread: its process and
//! thread ids, their start times and the process's executable, the VM object the thread ran
//! ([`VmToken`]), and since when the row counts. A row is re-adopted only by the same thread of the
//! same process running the same VM (a VMM that replaced its VM while no observer ran has its
//! rows dropped, and counted anew); rows of processes gone while no observer ran are removed when
//! the next one starts.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::sys::ArrayMap;
use crate::task_stat::StatLine;

/// Where BPF filesystems are mounted.
const BPFFS: &str = "/sys/fs/bpf";
/// `BPF_FS_MAGIC`.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
/// The directory of everything hvstats keeps, in [`BPFFS`].
const BASE: &str = "hvstats";
/// Bumped when what is kept changes its meaning without a change of the files the digest reads
/// (2: an owner names the VM object its thread ran).
const KEPT_FORMAT: &str = "hvstats-kept-2";

/// Bytes of one owner: tid, pid (u32 each), process start, thread start (clock ticks since
/// boot), executable (device and inode, folded), counting since (µs since the epoch), VM.
pub(crate) const OWNER_SIZE: usize = 48;

/// The thread a kept row counts, and since when.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    /// Thread id.
    pub tid: u32,
    /// Its process.
    pub pid: u32,
    /// The process's start (clock ticks since boot).
    pub pid_start: u64,
    /// The thread's start (clock ticks since boot).
    pub tid_start: u64,
    /// The process's executable: device and inode, folded.
    pub exe: u64,
    /// When the row began counting, in µs since the epoch.
    pub since_us: u64,
    /// The VM object the thread ran when the row began, as its counter named it (see
    /// [`VmToken`]); 0 where it could not be told: such a row is never adopted.
    pub vm: u64,
}

/// What names the KVM VM object a counted thread runs, the same for the life of that VM and
/// another for any other VM (an observer takes the inode of the VM's directory in KVM's
/// debugfs); 0: unknown. A kept row is adopted only by the same thread running the same VM.
pub type VmToken = u64;

impl Owner {
    /// The owner of thread `tid` of `pid` as it is now (starting to count now); `None` when the
    /// thread is gone.
    pub(crate) fn now(pid: i32, tid: i32, vm: VmToken) -> Option<Self> {
        let (pid_start, tid_start, exe) = identity(pid, tid)?;
        Some(Self { tid: tid as u32, pid: pid as u32, pid_start, tid_start, exe, since_us: now_us(), vm })
    }

    /// The owner of a thread whose identity cannot be read: never adopted again.
    pub(crate) fn unknown(pid: i32, tid: i32) -> Self {
        Self { tid: tid as u32, pid: pid as u32, since_us: now_us(), ..Self::default() }
    }

    /// True when the thread it names is still the same thread of the same process, running the
    /// same executable.
    pub(crate) fn is_alive(&self) -> bool {
        self.is_alive_in(&mut Processes::default())
    }

    /// As [`is_alive`](Self::is_alive), its process's part read once for all the owners asked
    /// about with `processes` (a VMM's threads are several owners of one process).
    pub(crate) fn is_alive_in(&self, processes: &mut Processes) -> bool {
        let (pid, tid) = (self.pid as i32, self.tid as i32);
        let process = *processes.0.entry(pid).or_insert_with(|| process_identity(pid));
        process == Some((self.pid_start, self.exe)) && start(pid, tid) == Some(self.tid_start)
    }

    pub(crate) fn encode(&self) -> [u8; OWNER_SIZE] {
        let mut b = [0u8; OWNER_SIZE];
        b[0..4].copy_from_slice(&self.tid.to_ne_bytes());
        b[4..8].copy_from_slice(&self.pid.to_ne_bytes());
        b[8..16].copy_from_slice(&self.pid_start.to_ne_bytes());
        b[16..24].copy_from_slice(&self.tid_start.to_ne_bytes());
        b[24..32].copy_from_slice(&self.exe.to_ne_bytes());
        b[32..40].copy_from_slice(&self.since_us.to_ne_bytes());
        b[40..48].copy_from_slice(&self.vm.to_ne_bytes());
        b
    }

    /// Decodes an owner; `None` for a free row (tid 0) or a short value.
    pub(crate) fn decode(b: &[u8]) -> Option<Self> {
        let u32_at = |o: usize| Some(u32::from_ne_bytes(b.get(o..o + 4)?.try_into().ok()?));
        let u64_at = |o: usize| Some(u64::from_ne_bytes(b.get(o..o + 8)?.try_into().ok()?));
        let owner = Self {
            tid: u32_at(0)?,
            pid: u32_at(4)?,
            pid_start: u64_at(8)?,
            tid_start: u64_at(16)?,
            exe: u64_at(24)?,
            since_us: u64_at(32)?,
            vm: u64_at(40)?,
        };
        (owner.tid != 0).then_some(owner)
    }
}

fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// Set when this process is ending: kept rows are then left for the next observer, not released.
pub(crate) static LEAVING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Leaves every kept row of this process's engines counting for the next observer: called by an
/// observer that is ending (and whose VMs may well go on).
pub fn leave() {
    LEAVING.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The process's and the thread's start times and the process's executable, from /proc.
fn identity(pid: i32, tid: i32) -> Option<(u64, u64, u64)> {
    let (pid_start, exe) = process_identity(pid)?;
    Some((pid_start, start(pid, tid)?, exe))
}

/// The start time of process `pid` and its executable, from /proc.
fn process_identity(pid: i32) -> Option<(u64, u64)> {
    // The leader's own stat, not the process's: the same start time, without the kernel summing
    // every thread's times, which made adopting N rows of one process cost N².
    let pid_start = start(pid, pid)?;
    let exe = std::fs::metadata(format!("/proc/{pid}/exe")).map_or(0, |m| m.dev().rotate_left(32) ^ m.ino());
    Some((pid_start, exe))
}

/// The start time of thread `tid` of process `pid`, from /proc.
fn start(pid: i32, tid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    StatLine::parse(&text)?.start_time()
}

/// Processes' identities ([`process_identity`]), each read once while this is held.
#[derive(Debug, Default)]
pub(crate) struct Processes(std::collections::BTreeMap<i32, Option<(u64, u64)>>);

/// Where the kept counts of the runtime directory `runtime` are, whether or not there are any
/// ([`identity_dir`] makes it).
pub fn identity_path(runtime: &Path) -> PathBuf {
    Path::new(BPFFS).join(BASE).join(escape(runtime))
}

/// The directory of the kept counts of a runtime directory, made (and bpffs mounted) when
/// needed; directories of runtime directories that no longer exist are removed on the way.
///
/// # Errors
/// When bpffs is not there and cannot be mounted, or a directory is not ours alone.
pub fn identity_dir(runtime: &Path) -> io::Result<PathBuf> {
    mount_if_needed()?;
    let base = Path::new(BPFFS).join(BASE);
    private_dir(&base)?;
    if let Ok(entries) = std::fs::read_dir(&base) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            // Kept counts of a runtime directory gone: removed once they count no live thread
            // (a runtime directory this process cannot see, from another mount namespace, may
            // still have an observer and VMs).
            if let Some(path) = name.to_str().and_then(unescape)
                && !path.is_dir()
                && !counts_a_live_thread(&entry.path())
            {
                remove_tree(&entry.path());
            }
        }
    }
    let dir = identity_path(runtime);
    private_dir(&dir)?;
    Ok(dir)
}

/// True when a layout of identity directory `identity` has an owner that is alive, or its
/// owners cannot be read (left alone, then).
fn counts_a_live_thread(identity: &Path) -> bool {
    let Ok(layouts) = std::fs::read_dir(identity) else { return false };
    layouts.flatten().any(|layout| match ArrayMap::open_pinned(&layout.path().join("owners")) {
        Ok(owners) => (0..owners.entries())
            .filter_map(|slot| owners.read(slot).ok().and_then(|v| Owner::decode(&v)))
            .any(|owner| owner.is_alive()),
        // A layout whose owners were never pinned is a pinning cut short: nothing to keep.
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(_) => true,
    })
}

/// The directory of one layout's kept counts in an identity directory: `layout` describes the
/// columns, the thread table and the rows.
pub(crate) fn layout_dir(identity: &Path, layout: &str) -> PathBuf {
    identity.join(format!("{:016x}", digest(layout)))
}

/// Where the `n`th engine grown beside the kept engine of `dir` is kept: beside it, its name
/// and `+n`.
pub(crate) fn grown_dir(dir: &Path, n: u32) -> PathBuf {
    let mut name = dir.as_os_str().to_owned();
    name.push(format!("+{n}"));
    PathBuf::from(name)
}

/// Removes the layouts of `identity` other than `keep` and the engines grown beside it
/// ([`grown_dir`]), returning how many held counts.
pub(crate) fn drop_other_layouts(identity: &Path, keep: &Path) -> usize {
    let mut dropped = 0;
    let grown = |path: &Path| {
        use std::os::unix::ffi::OsStrExt;
        let (path, keep) = (path.as_os_str().as_bytes(), keep.as_os_str().as_bytes());
        path.strip_prefix(keep)
            .and_then(|rest| rest.strip_prefix(b"+"))
            .is_some_and(|n| !n.is_empty() && n.iter().all(u8::is_ascii_digit))
    };
    if let Ok(entries) = std::fs::read_dir(identity) {
        for entry in entries.flatten() {
            if entry.path() != keep && !grown(&entry.path()) {
                remove_tree(&entry.path());
                dropped += 1;
            }
        }
    }
    dropped
}

/// Removes a directory of kept objects, its pins with it; what cannot be removed stays (a
/// later start tries again).
pub fn remove_tree(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}

/// Makes `dir` (0700) or checks the one there: a directory (not a link) of this user, that no
/// one else may write to.
pub(crate) fn private_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is not a directory of uid {me} alone", dir.display()),
        ));
    }
    Ok(())
}

fn mount_if_needed() -> io::Result<()> {
    if is_bpffs(Path::new(BPFFS)) {
        return Ok(());
    }
    // SAFETY: all arguments are NUL-terminated literals.
    let r = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            c"/sys/fs/bpf".as_ptr(),
            c"bpf".as_ptr(),
            0,
            c"mode=0700".as_ptr().cast(),
        )
    };
    crate::os::check(r)
        .map_err(|e| io::Error::new(e.kind(), format!("mounting a BPF filesystem on {BPFFS}: {e}")))?;
    Ok(())
}

fn is_bpffs(path: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else { return false };
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `c` is NUL-terminated; `st` is a statfs the call fills.
    let r = unsafe { libc::statfs(c.as_ptr(), st.as_mut_ptr()) };
    #[allow(clippy::unnecessary_cast, reason = "f_type is i64 here, another width on other targets")]
    // SAFETY: `st` was zeroed, and statfs filled it when it succeeded; either way it is a valid
    // statfs.
    let magic = unsafe { st.assume_init() }.f_type as i64;
    r == 0 && magic == BPF_FS_MAGIC
}

/// A runtime directory's name in [`BASE`]: `/` as `-`, and every byte but ASCII letters, digits
/// and `_` as `%XX` (so a name decodes to the one path it came from; bpffs refuses names with a
/// dot, which it reserves).
fn escape(path: &Path) -> String {
    let mut out = String::new();
    for &b in path.as_os_str().as_encoded_bytes() {
        match b {
            b'/' => out.push('-'),
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn unescape(name: &str) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let bytes = name.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'-' => out.push(b'/'),
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    (out.first() == Some(&b'/')).then(|| PathBuf::from(std::ffi::OsString::from_vec(out)))
}

/// FNV-1a over what makes a layout's programs and maps: the kept format, the layout's
/// description (columns, thread table, rows) and the sources of the assembler.
fn digest(layout: &str) -> u64 {
    let parts: [&[u8]; 7] = [
        KEPT_FORMAT.as_bytes(),
        layout.as_bytes(),
        include_str!("program.rs").as_bytes(),
        include_str!("insn.rs").as_bytes(),
        include_str!("filter.rs").as_bytes(),
        include_str!("raw.rs").as_bytes(),
        include_str!("engine.rs").as_bytes(),
    ];
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part.iter().chain(&[0xff]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// The owners map of a kept engine: one [`Owner`] per each of its `slots`.
pub(crate) fn owners_map(slots: u32) -> io::Result<ArrayMap> {
    ArrayMap::create(OWNER_SIZE, slots, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_directories_escape_to_names_that_decode_to_the_same_path() {
        for path in ["/run/hvstats", "/tmp/a-b c/%x", "/run/hvstats/", "/ü", "/tmp/.x"] {
            let name = escape(Path::new(path));
            assert!(!name.contains('/') && !name.contains('.'), "{name}");
            assert_eq!(unescape(&name).as_deref(), Some(Path::new(path)), "{name}");
        }
        assert_eq!(unescape("relative"), None);
        assert_eq!(unescape("-bad%zz"), None);
    }

    #[test]
    fn an_owner_survives_its_encoding_and_a_free_row_is_none() {
        let owner =
            Owner { tid: 7, pid: 5, pid_start: 100, tid_start: 101, exe: 9, since_us: 1_700_000, vm: 33 };
        assert_eq!(Owner::decode(&owner.encode()), Some(owner));
        assert_eq!(Owner::decode(&[0u8; OWNER_SIZE]), None);
        assert_eq!(Owner::decode(&[1u8; 8]), None);
    }

    #[test]
    fn this_thread_is_alive_and_a_changed_start_is_another_thread() {
        // SAFETY: getpid and gettid have no preconditions.
        let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
        let me = Owner::now(pid, tid, 0).expect("this thread is in /proc");
        assert!(me.is_alive());
        assert!(!Owner { tid_start: me.tid_start + 1, ..me }.is_alive());
        assert!(!Owner { exe: me.exe ^ 1, ..me }.is_alive());
        // Asked with the process read once: the same answers, and another thread of the process
        // is told from it.
        let mut processes = Processes::default();
        assert!(me.is_alive_in(&mut processes));
        assert!(!Owner { tid_start: me.tid_start + 1, ..me }.is_alive_in(&mut processes));
        let other = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            Owner::now(pid, tid, 0).expect("this thread is in /proc")
        })
        .join()
        .unwrap();
        assert!(!other.is_alive_in(&mut processes), "its thread ended");
        assert_eq!(processes.0.len(), 1, "one process read");
    }

    #[test]
    fn layouts_of_other_columns_have_other_digests() {
        assert_ne!(digest("kvm:kvm_pio Array 1024"), digest("kvm:kvm_mmio Array 1024"));
        assert_ne!(digest("kvm:kvm_pio Array 1024"), digest("kvm:kvm_pio Hash 1024"));
        assert_eq!(digest("kvm:kvm_pio Array 1024"), digest("kvm:kvm_pio Array 1024"));
    }
}
