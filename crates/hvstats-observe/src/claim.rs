//! One observer per VM per host: before an observer counts on a VMM, it claims the VMM in the
//! runtime directory, so a second `hvstats observe` (or `serve --observe-all`) of the same QEMU
//! does not attach again and double every sum readers make.
//!
//! A claim is the file `observed/<vmm pid>-<vmm start time>` under the runtime directory (the pid
//! and start time name one process for the life of the host, whatever pids are reused), held
//! with an exclusive `flock` for as long as the observer counts, holding the claimant's pid and
//! instance name. The directory gets the same checks as the instances' (the effective user's,
//! writable by nobody else; no link or FIFO is followed), so nobody else can plant or move a
//! claim. A claim whose holder died is free again: the kernel drops the lock with the process.
//! The file is removed by its holder when done; a lock taken on a file another observer removed
//! meanwhile is noticed (the name no longer leads to the locked file) and taken again.
//!
//! `flock` needs no more than a descriptor open for reading, so a claim file is its owner's
//! alone (mode 0600, set again on a file an older hvstats left readable), and a claim counts
//! only while its holder runs as the runtime directory's owner: a lock another user took (on a
//! file they could once open) is no claim, and its name is taken over with a new file.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsFd;
use std::path::Path;

use hvstats::publish;
use hvstats::runtime_dir::{Dir, RuntimeDirError, Use, fstat};
use hvstats::trust;

use super::discovery::is_shortage;

/// The subdirectory of the runtime directory that holds the claims.
pub const CLAIMS_DIR: &str = "observed";

/// The longest claim file read (a pid and an instance name).
const MAX_CLAIM: u64 = 256;

/// A claim file's mode: its owner's alone (a lock needs only a descriptor open for reading).
const CLAIM_MODE: u32 = 0o600;

/// Why a VMM could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// Another process observes it.
    #[error("already observed by pid {holder}{}", instance.as_deref().map(|i| format!(" (instance {i})")).unwrap_or_default())]
    Taken {
        /// The process holding the claim.
        holder: u32,
        /// Its instance, as its claim file says.
        instance: Option<String>,
    },
    /// The claims directory or a claim file could not be used.
    #[error("cannot claim the VMM in the runtime directory")]
    Dir(#[from] RuntimeDirError),
    /// The VMM's start time could not be read.
    #[error("cannot read the start time of process {pid}")]
    StartTime {
        /// The VMM.
        pid: i32,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Locking or writing the claim failed.
    #[error("cannot lock or write the claim {name}")]
    Io {
        /// The claim file's name.
        name: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

impl ClaimError {
    /// True when the claim failed for want of descriptors or memory of this process (it may
    /// succeed later), not because of the VMM or the directory.
    pub fn is_shortage(&self) -> bool {
        match self {
            ClaimError::StartTime { source, .. } | ClaimError::Io { source, .. } => is_shortage(source),
            ClaimError::Dir(RuntimeDirError::Io { source, .. }) => is_shortage(source),
            ClaimError::Taken { .. } | ClaimError::Dir(_) => false,
        }
    }
}

/// A held claim on one VMM: released (its file removed) on drop.
#[derive(Debug)]
pub struct Claim {
    dir: Dir,
    name: String,
    _file: File,
}

impl Claim {
    /// Claims the VMM `pid` for this process, publishing as `instance`, in the runtime directory
    /// `runtime_dir` (the claims subdirectory is created when missing).
    ///
    /// # Errors
    /// [`ClaimError::Taken`] when another process holds the claim; others when the directory is
    /// not trusted or the files cannot be used.
    pub fn take(runtime_dir: &Path, pid: i32, instance: &str) -> Result<Self, ClaimError> {
        let start = u32::try_from(pid)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
            .and_then(publish::process_start_time)
            .map_err(|source| ClaimError::StartTime { pid, source })?;
        let name = format!("{pid}-{start}");
        let dir = Dir::open(runtime_dir, Use::Publish)?.subdir(CLAIMS_DIR, Use::Publish)?;
        let owner = fstat(dir.fd()).map_err(|source| RuntimeDirError::Io {
            path: dir.path().to_owned(),
            what: "stat",
            source,
        })?;
        let io_err = |source| ClaimError::Io { name: name.clone(), source };
        // A file another observer removes between our open and our lock is locked in vain:
        // the name leads elsewhere then, and we start over (a few times at most).
        for _ in 0..8 {
            let mut file = match dir.create_file(&name, CLAIM_MODE, None) {
                Ok(f) => f,
                Err(e) if e.io_kind() == Some(io::ErrorKind::AlreadyExists) => {
                    match dir.open_file(&name, true) {
                        Ok(f) => f,
                        Err(e) if e.io_kind() == Some(io::ErrorKind::NotFound) => continue,
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(e) => return Err(e.into()),
            };
            if let Err(e) = publish::lock(file.as_fd()) {
                if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                    return Err(io_err(e));
                }
                if held_by_another_user(&file, owner.st_uid) {
                    // No claim: the name gets a new file of ours (the directory is ours alone).
                    let _ = dir.remove_file(&name);
                    continue;
                }
                return Err(taken(&mut file));
            }
            if !names_file(&dir, &name, &file) {
                continue;
            }
            // A file an older hvstats created readable by all: ours alone from now on.
            file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(CLAIM_MODE)).map_err(io_err)?;
            file.set_len(0).map_err(io_err)?;
            writeln!(file, "{} {instance}", std::process::id()).map_err(io_err)?;
            return Ok(Self { dir, name, _file: file });
        }
        Err(io_err(io::Error::other("the claim file kept being replaced")))
    }

    /// The claim file's name (`<pid>-<start time>`).
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        // Removed while still locked (the file closes after this): the next claimant of this
        // name creates a new file, or notices it locked a removed one.
        let _ = self.dir.remove_file(&self.name);
    }
}

/// Who holds the claim `file`: the pid `/proc/locks` lists (the file's own words are only
/// used when the holder is invisible, in another PID namespace), and the instance it names.
fn taken(file: &mut File) -> ClaimError {
    let mut text = String::new();
    let _ = file.rewind().and_then(|()| file.take(MAX_CLAIM).read_to_string(&mut text));
    let mut words = text.split_whitespace();
    let said: Option<u32> = words.next().and_then(|w| w.parse().ok());
    let instance = words.next().filter(|i| i.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    let listed = hvstats::trust::holders(file).ok().and_then(|h| h.first().map(|h| h.pid));
    ClaimError::Taken { holder: listed.or(said).unwrap_or(0), instance: instance.map(str::to_owned) }
}

/// True when the lock on `file` is held by a process that does not run as `dir_owner` (the
/// runtime directory's owner): such a lock is no claim. A holder whose user cannot be read (in a
/// PID namespace this one cannot see, or `/proc` hidden) counts only on a file nobody but its
/// owner, the directory's owner, can open.
fn held_by_another_user(file: &File, dir_owner: u32) -> bool {
    let Ok(holders) = trust::holders(file) else { return false };
    let owners_only = fstat(file.as_fd()).is_ok_and(|st| st.st_uid == dir_owner && st.st_mode & 0o077 == 0);
    if holders.is_empty() {
        return !owners_only;
    }
    holders.iter().any(|h| match h.euid {
        Some(uid) => uid != dir_owner,
        None => !owners_only,
    })
}

/// True when `name` in `dir` is the very file `file` is open on.
fn names_file(dir: &Dir, name: &str, file: &File) -> bool {
    let (Ok(now), Ok(ours)) = (dir.open_file(name, false), fstat(file.as_fd())) else { return false };
    fstat(now.as_fd()).is_ok_and(|st| st.st_dev == ours.st_dev && st.st_ino == ours.st_ino)
}
