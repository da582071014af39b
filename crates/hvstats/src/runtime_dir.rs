//! Where live hvstats instances and the shared hardware counter table are published, and the
//! discipline every access to it follows.
//!
//! `HVSTATS_RUNTIME_DIR` when set, otherwise `/run/hvstats`. Library code takes the directory as an
//! argument; only the command line resolves the default.
//!
//! hvstats runs as root and reads what other processes write there, so, as ssh and tmux do with
//! their directories: a directory is used only when it belongs to the effective user (or, for a
//! reader, root) and nobody else may write to it — otherwise it is refused with an error naming the
//! path and the fix; directories and files get explicit modes, never the umask's; every file is
//! opened relative to a directory fd with `O_NOFOLLOW | O_NONBLOCK` and must be a regular file
//! (a link or FIFO planted in its place is refused, never followed or waited on); new files are
//! created `O_EXCL` and renamed into place; removal never follows a link.

use hvstats_host::os::{self, check};
use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// The environment variable naming the runtime directory.
pub const RUNTIME_DIR_ENV: &str = "HVSTATS_RUNTIME_DIR";

/// The runtime directory when the environment does not name one.
pub const DEFAULT_RUNTIME_DIR: &str = "/run/hvstats";

/// The mode of directories hvstats creates.
pub const DIR_MODE: u32 = 0o755;

/// The runtime directory: `$HVSTATS_RUNTIME_DIR`, or `/run/hvstats`.
pub fn runtime_dir() -> PathBuf {
    std::env::var_os(RUNTIME_DIR_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_RUNTIME_DIR))
}

/// An error using the runtime directory.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeDirError {
    /// A directory or file could not be opened, created or listed.
    #[error("{}: {what}", path.display())]
    Io {
        /// The directory or file concerned.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A directory belongs to another user.
    #[error(
        "{} belongs to uid {owner}, not to you (uid {euid}){}: refusing to use it; use a runtime \
         directory of your own (`mkdir -m 0700 $XDG_RUNTIME_DIR/hvstats`, then --runtime-dir or \
         HVSTATS_RUNTIME_DIR), or run as its owner",
        path.display(), if *root_ok { " or root" } else { "" }
    )]
    Owner {
        /// The directory whose owner is neither this user nor an accepted root.
        path: PathBuf,
        /// The uid that owns it.
        owner: u32,
        /// This process's effective uid.
        euid: u32,
        /// Whether root would have been accepted.
        root_ok: bool,
    },
    /// A directory others may write to.
    #[error("{} is writable by group or others (mode {mode:04o}): refusing to use it; `chmod go-w {}`", path.display(), path.display())]
    Writable {
        /// The directory group or others may write to.
        path: PathBuf,
        /// Its permission bits (group or other write set).
        mode: u32,
    },
    /// Something that should be a directory or regular file is not.
    #[error("{} is not a {expected} (a link, FIFO or device planted there?): refusing to use it", path.display())]
    NotRegular {
        /// The path whose file type is wrong.
        path: PathBuf,
        /// What was expected.
        expected: &'static str,
    },
}

impl RuntimeDirError {
    /// The underlying I/O error kind, when there is one.
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            RuntimeDirError::Io { source, .. } => Some(source.kind()),
            _ => None,
        }
    }
}

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// `fstat` of an open fd.
///
/// # Errors
/// What `fstat(2)` reports (e.g. `EBADF`).
pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value for the kernel to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer for the call; we check the result.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// The effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// Who may use a directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// To publish (create and remove files): it must be the effective user's.
    Publish,
    /// To read: the effective user's or root's.
    Read,
}

/// An open, checked directory under the runtime directory.
#[derive(Debug)]
pub struct Dir {
    path: PathBuf,
    fd: OwnedFd,
}

impl Dir {
    /// Opens the directory `path` for `usage`, creating it (mode [`DIR_MODE`]) when publishing and
    /// it is missing (its parent must exist).
    ///
    /// # Errors
    /// When it cannot be opened, is not a directory, or fails the owner and mode checks.
    pub fn open(path: &Path, usage: Use) -> Result<Self, RuntimeDirError> {
        let created = usage == Use::Publish && {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().mode(DIR_MODE).create(path).is_ok()
        };
        let c = cstr(path.as_os_str()).map_err(|source| io_error(path, "open", source))?;
        // SAFETY: a NUL-terminated path; we own the fd returned.
        let fd = check(unsafe {
            libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        })
        .map_err(|source| classify(path, "open the directory", source, "directory"))?;
        // SAFETY: just returned by open.
        let dir = Self { path: path.to_owned(), fd: unsafe { OwnedFd::from_raw_fd(fd) } };
        if created {
            // The umask may have cut the mode: set it explicitly, on the directory we opened.
            // SAFETY: plain fchmod on an fd we own.
            let _ = unsafe { libc::fchmod(dir.fd.as_raw_fd(), DIR_MODE) };
        }
        dir.verify(usage)?;
        Ok(dir)
    }

    fn verify(&self, usage: Use) -> Result<(), RuntimeDirError> {
        let st = fstat(self.fd.as_fd()).map_err(|source| io_error(&self.path, "stat", source))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(RuntimeDirError::NotRegular { path: self.path.clone(), expected: "directory" });
        }
        let me = euid();
        let root_ok = usage == Use::Read;
        if st.st_uid != me && !(root_ok && st.st_uid == 0) {
            return Err(RuntimeDirError::Owner {
                path: self.path.clone(),
                owner: st.st_uid,
                euid: me,
                root_ok,
            });
        }
        if st.st_mode & 0o022 != 0 {
            return Err(RuntimeDirError::Writable { path: self.path.clone(), mode: st.st_mode & 0o7777 });
        }
        Ok(())
    }

    /// The directory's path (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory fd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Opens (creating it when publishing) the subdirectory `name`, with the same checks.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn subdir(&self, name: &str, usage: Use) -> Result<Self, RuntimeDirError> {
        let path = self.path.join(name);
        let c = cstr(OsStr::new(name)).map_err(|source| io_error(&path, "open", source))?;
        if usage == Use::Publish {
            // SAFETY: a NUL-terminated name relative to our directory fd.
            let made = check(unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), DIR_MODE) });
            if made.is_ok() {
                // The umask may have cut the mode: set it explicitly.
                let fd = self.open_raw(&c, libc::O_RDONLY | libc::O_DIRECTORY, &path, "directory")?;
                // SAFETY: plain fchmod on an fd we own.
                let _ = unsafe { libc::fchmod(fd.as_raw_fd(), DIR_MODE) };
            }
        }
        let fd = self.open_raw(&c, libc::O_RDONLY | libc::O_DIRECTORY, &path, "directory")?;
        let dir = Self { path, fd };
        dir.verify(usage)?;
        Ok(dir)
    }

    fn open_raw(
        &self,
        c: &CString,
        flags: libc::c_int,
        path: &Path,
        expected: &'static str,
    ) -> Result<OwnedFd, RuntimeDirError> {
        // SAFETY: a NUL-terminated name relative to our directory fd; we own the fd returned.
        let fd = check(unsafe {
            libc::openat(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                flags | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        })
        .map_err(|source| classify(path, "open", source, expected))?;
        // SAFETY: just returned by openat.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Opens the regular file `name` (read-only, or read-write), never following a link and never
    /// blocking on a FIFO.
    ///
    /// # Errors
    /// When it cannot be opened or is not a regular file.
    pub fn open_file(&self, name: &str, write: bool) -> Result<File, RuntimeDirError> {
        let path = self.path.join(name);
        let c = cstr(OsStr::new(name)).map_err(|source| io_error(&path, "open", source))?;
        let fd =
            self.open_raw(&c, if write { libc::O_RDWR } else { libc::O_RDONLY }, &path, "regular file")?;
        let st = fstat(fd.as_fd()).map_err(|source| io_error(&path, "stat", source))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(RuntimeDirError::NotRegular { path, expected: "regular file" });
        }
        Ok(File::from(fd))
    }

    /// Creates the new regular file `name` (`O_EXCL`: never an existing file or link) with exactly
    /// `mode`, and, when given, group `gid`.
    ///
    /// # Errors
    /// When it exists or cannot be created.
    pub fn create_file(&self, name: &str, mode: u32, gid: Option<u32>) -> Result<File, RuntimeDirError> {
        let path = self.path.join(name);
        let c = cstr(OsStr::new(name)).map_err(|source| io_error(&path, "create", source))?;
        let fd = self.open_raw(&c, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, &path, "regular file")?;
        let set = || -> io::Result<()> {
            if let Some(gid) = gid {
                // SAFETY: fchown on an fd we own (uid -1 leaves the owner); the result is checked.
                check(unsafe { libc::fchown(fd.as_raw_fd(), u32::MAX, gid) })?;
            }
            // SAFETY: fchmod on an fd we own; the result is checked.
            check(unsafe { libc::fchmod(fd.as_raw_fd(), mode) })?;
            Ok(())
        };
        if let Err(source) = set() {
            let _ = self.remove_file(name);
            return Err(io_error(&path, "set the mode of", source));
        }
        Ok(File::from(fd))
    }

    /// Renames `from` to `to` in this directory, failing if `to` exists.
    ///
    /// # Errors
    /// When the rename fails (`AlreadyExists` when `to` exists).
    pub(crate) fn rename_new(&self, from: &str, to: &str) -> Result<(), RuntimeDirError> {
        let path = self.path.join(to);
        let (f, t) = (cstr(OsStr::new(from)), cstr(OsStr::new(to)));
        let (Ok(f), Ok(t)) = (f, t) else {
            return Err(io_error(&path, "rename", io::ErrorKind::InvalidInput.into()));
        };
        let dir = self.fd.as_raw_fd();
        // SAFETY: NUL-terminated names relative to our directory fd.
        check(unsafe { libc::renameat2(dir, f.as_ptr(), dir, t.as_ptr(), libc::RENAME_NOREPLACE) })
            .map(drop)
            .map_err(|source| io_error(&path, "rename into place", source))
    }

    /// Renames `from` to `to` in this directory, replacing `to` at once when it exists (a file or
    /// link there is replaced, never followed): readers see the old file or the new one.
    ///
    /// # Errors
    /// When the rename fails.
    pub(crate) fn rename_replace(&self, from: &str, to: &str) -> Result<(), RuntimeDirError> {
        let path = self.path.join(to);
        let (f, t) = (cstr(OsStr::new(from)), cstr(OsStr::new(to)));
        let (Ok(f), Ok(t)) = (f, t) else {
            return Err(io_error(&path, "rename", io::ErrorKind::InvalidInput.into()));
        };
        let dir = self.fd.as_raw_fd();
        // SAFETY: NUL-terminated names relative to our directory fd.
        check(unsafe { libc::renameat(dir, f.as_ptr(), dir, t.as_ptr()) })
            .map(drop)
            .map_err(|source| io_error(&path, "rename into place", source))
    }

    /// Removes the file (or link: never what it points to) `name`.
    ///
    /// # Errors
    /// When it cannot be removed.
    pub fn remove_file(&self, name: &str) -> io::Result<()> {
        let c = cstr(OsStr::new(name))?;
        // SAFETY: a NUL-terminated name relative to our directory fd; unlinkat never follows.
        check(unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) }).map(drop)
    }

    /// The names in the directory (not `.` and `..`).
    ///
    /// # Errors
    /// When it cannot be listed.
    pub fn names(&self) -> Result<Vec<OsString>, RuntimeDirError> {
        let list = || -> io::Result<Vec<OsString>> {
            let fd = self.fd.try_clone()?;
            // SAFETY: fdopendir takes ownership of the duplicate on success.
            let dir = os::check_ptr(unsafe { libc::fdopendir(fd.as_raw_fd()) })?.as_ptr();
            std::mem::forget(fd);
            // SAFETY: `dir` is a valid DIR*; rewind so a reused directory offset starts over.
            unsafe { libc::rewinddir(dir) };
            let mut names = Vec::new();
            loop {
                // SAFETY: `dir` is valid until closedir below.
                let entry = unsafe { libc::readdir(dir) };
                if entry.is_null() {
                    break;
                }
                // SAFETY: d_name is NUL-terminated inside the entry readdir returned.
                let name = unsafe { std::ffi::CStr::from_ptr((*entry).d_name.as_ptr()) };
                let bytes = name.to_bytes();
                if bytes != b"." && bytes != b".." {
                    names.push(OsString::from_vec(bytes.to_vec()));
                }
            }
            // SAFETY: closes the DIR* and the duplicate fd it owns.
            unsafe { libc::closedir(dir) };
            Ok(names)
        };
        list().map_err(|source| io_error(&self.path, "list", source))
    }
}

fn io_error(path: &Path, what: &'static str, source: io::Error) -> RuntimeDirError {
    RuntimeDirError::Io { path: path.to_owned(), what, source }
}

fn classify(path: &Path, what: &'static str, source: io::Error, expected: &'static str) -> RuntimeDirError {
    match source.raw_os_error() {
        Some(libc::ELOOP | libc::ENOTDIR) => RuntimeDirError::NotRegular { path: path.to_owned(), expected },
        _ => io_error(path, what, source),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("hvstats-rtdir-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_world_writable_directory_is_refused_with_the_fix() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tmp("ww");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = Dir::open(&dir, Use::Read).unwrap_err();
        assert!(matches!(e, RuntimeDirError::Writable { mode: 0o777, .. }), "{e}");
        assert!(e.to_string().contains("chmod go-w"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn links_and_fifos_are_refused_not_followed_or_waited_on() {
        let dir = tmp("planted");
        let d = Dir::open(&dir, Use::Publish).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join("link")).unwrap();
        let c = CString::new(dir.join("fifo").as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(d.open_file("link", false), Err(RuntimeDirError::NotRegular { .. })));
        assert!(matches!(d.open_file("fifo", false), Err(RuntimeDirError::NotRegular { .. })));
        assert!(d.create_file("link", 0o600, None).is_err(), "O_EXCL never writes through a link");
        d.remove_file("link").unwrap();
        assert!(Path::new("/etc/passwd").exists());
        std::os::unix::fs::symlink("/tmp", dir.join("sub")).unwrap();
        assert!(matches!(d.subdir("sub", Use::Read), Err(RuntimeDirError::NotRegular { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn modes_are_explicit_whatever_the_umask() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tmp("umask");
        // SAFETY: umask only changes this process's file creation mask.
        let old = unsafe { libc::umask(0) };
        let d = Dir::open(&dir, Use::Publish).unwrap();
        let sub = d.subdir("instances", Use::Publish).unwrap();
        let f = sub.create_file("x", 0o600, None).unwrap();
        // SAFETY: restores the mask.
        unsafe { libc::umask(old) };
        assert_eq!(f.metadata().unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(sub.path()).unwrap().permissions().mode() & 0o777, 0o755);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
