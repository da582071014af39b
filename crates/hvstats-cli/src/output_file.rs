//! Files a user names for a command to write (`record -o`, `plot -o`), opened so that nobody can
//! steer the write elsewhere.
//!
//! hvstats usually runs as root, and its output often goes to a shared directory (`/tmp`). Opening
//! the path as `File::create` does would follow a link another user planted there (overwriting the
//! file it points to) and would wait forever on a FIFO. Here the path itself is never opened:
//!
//! - the directory is reached by a walk that follows no component another user controls: each
//!   directory and link on the way must belong to root or to this user, in a directory nobody
//!   else may rename entries of (not writable by others, or sticky), or the walk stops with an
//!   error naming the component (a link root or this user made, as `/var/run`, is followed);
//!   everything after the walk happens relative to the directory it opened, so nothing swapped
//!   in later is followed either;
//! - what is at the name is examined without following it; a link, FIFO, device, socket or
//!   directory is refused at once, and an existing regular file only with `--force`;
//! - the bytes go to a new temporary file in the same directory, created `O_EXCL | O_NOFOLLOW`
//!   with mode 0600 (the umask may narrow it, never widen it): counters are their tenants';
//! - [`OutputFile::put_in_place`] renames it to the name: without `--force` with
//!   `RENAME_NOREPLACE` (whatever appeared there meanwhile is left alone), with `--force` by a
//!   plain rename, which replaces a link planted meanwhile and never writes to what it points to.
//!
//! `-` and `/dev/stdout` write to standard output as it is (a pipe, a terminal, a file the shell
//! opened), so `record -o - | …` keeps working.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, bail};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};

/// The mode of a file written for the user, before the umask.
const OUTPUT_MODE: u32 = 0o600;

/// Links followed in one path at most (as the kernel's own limit).
const MAX_LINKS: usize = 40;

/// A file being written for the user, at a temporary name until [`put_in_place`](Self::put_in_place).
#[derive(Debug)]
pub(crate) struct OutputFile {
    file: File,
    /// The directory, the temporary name and the final name; `None` for standard output or once
    /// in place.
    pending: Option<Pending>,
    force: bool,
}

#[derive(Debug)]
struct Pending {
    dir: OwnedFd,
    tmp: OsString,
    name: OsString,
    /// The path as the user gave it (for messages).
    shown: PathBuf,
}

/// True when `path` means standard output.
pub(crate) fn is_stdout(path: &Path) -> bool {
    path == Path::new("-") || path == Path::new("/dev/stdout")
}

/// What a non-regular file is, in words.
fn kind_of(t: FileType) -> &'static str {
    match t {
        FileType::Symlink => "a symbolic link",
        FileType::Directory => "a directory",
        FileType::Fifo => "a FIFO",
        FileType::CharacterDevice | FileType::BlockDevice => "a device",
        FileType::Socket => "a socket",
        _ => "not a regular file",
    }
}

impl OutputFile {
    /// Starts writing `path` (see the module documentation); `force` allows replacing an existing
    /// regular file.
    ///
    /// # Errors
    /// When the walk to its directory meets a component another user controls, something other
    /// than a regular file is at `path`, a regular file is there and `force` is not given, or the
    /// temporary file cannot be created.
    pub(crate) fn create(path: &Path, force: bool) -> anyhow::Result<Self> {
        if is_stdout(path) {
            let fd = io::stdout().as_fd().try_clone_to_owned().context("cannot use standard output")?;
            return Ok(Self { file: File::from(fd), pending: None, force });
        }
        let name = path.file_name().with_context(|| format!("{} does not name a file", path.display()))?;
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = open_dir(parent)?;
        check_target(&dir, name, path, force)?;
        let mut last = None;
        for attempt in 0..16u32 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let mut tmp = OsString::from(".");
            tmp.push(name);
            tmp.push(format!(".{}-{nanos:x}-{attempt}.tmp", std::process::id()));
            let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            match rustix::fs::openat(&dir, tmp.as_os_str(), flags, Mode::from_raw_mode(OUTPUT_MODE)) {
                Ok(fd) => {
                    let pending = Pending { dir, tmp, name: name.to_owned(), shown: path.to_owned() };
                    return Ok(Self { file: File::from(fd), pending: Some(pending), force });
                }
                // Something (perhaps planted) has that name: try another.
                Err(e) if e == rustix::io::Errno::EXIST => last = Some(io::Error::from(e)),
                Err(e) => {
                    return Err(io::Error::from(e))
                        .with_context(|| format!("cannot create a file in {}", parent.display()));
                }
            }
        }
        Err(last.unwrap_or_else(|| io::ErrorKind::AlreadyExists.into()))
            .with_context(|| format!("cannot create a temporary file in {}", parent.display()))
    }

    /// The file to write to: the temporary file, or standard output for `-` or `/dev/stdout`.
    pub(crate) fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// Gives the written file its name (see the module documentation). Writes after this still go
    /// to the same file, now at its name: a recording is put in place after its header, so it can
    /// be read while it grows. Does nothing for standard output or a second time.
    ///
    /// # Errors
    /// When something appeared at the path meanwhile (without `--force`), or the rename fails.
    pub(crate) fn put_in_place(&mut self) -> anyhow::Result<()> {
        let Some(p) = self.pending.as_ref() else { return Ok(()) };
        if self.force {
            rustix::fs::renameat(&p.dir, &p.tmp, &p.dir, &p.name)
                .map_err(io::Error::from)
                .with_context(|| format!("cannot replace {}", p.shown.display()))?;
        } else {
            rename_noreplace(p).map_err(|e| match e.kind() {
                io::ErrorKind::AlreadyExists => anyhow::anyhow!(
                    "{} appeared while it was being written: left alone (--force replaces a regular file)",
                    p.shown.display()
                ),
                _ => anyhow::Error::new(e).context(format!("cannot create {}", p.shown.display())),
            })?;
        }
        self.pending = None;
        Ok(())
    }
}

impl Drop for OutputFile {
    /// A file never put in place (an error on the way) leaves nothing behind.
    fn drop(&mut self) {
        if let Some(p) = self.pending.take() {
            let _ = rustix::fs::unlinkat(&p.dir, &p.tmp, AtFlags::empty());
        }
    }
}

/// The owner and mode of the directory or link `fd` is open on.
struct Node {
    fd: OwnedFd,
    stat: rustix::fs::Stat,
}

impl Node {
    fn open(dir: impl AsFd, name: &OsStr) -> io::Result<Self> {
        let fd =
            rustix::fs::openat(dir, name, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
        let stat = rustix::fs::fstat(&fd)?;
        Ok(Self { fd, stat })
    }

    fn file_type(&self) -> FileType {
        FileType::from_raw_mode(self.stat.st_mode)
    }

    /// True when root or this process's user owns it.
    fn owned_by_us(&self) -> bool {
        self.stat.st_uid == 0 || self.stat.st_uid == rustix::process::geteuid().as_raw()
    }

    /// True when only root and this user can rename or replace entries in it: it is theirs, and
    /// no one else may write to it, or it is sticky (others may add entries, not replace ours).
    fn guards_its_entries(&self) -> bool {
        let mode = self.stat.st_mode;
        self.owned_by_us() && (mode & 0o022 == 0 || mode & libc::S_ISVTX != 0)
    }
}

/// Checks that the directory `path` is reached by a walk that follows no component another user
/// controls (see the module documentation), as a socket's directory must be.
///
/// # Errors
/// When it cannot be opened, or the walk meets such a component.
pub(crate) fn check_dir(path: &Path) -> anyhow::Result<()> {
    open_dir(path).map(drop)
}

/// Opens the directory `path` by a walk that follows no component another user controls (see
/// the module documentation).
fn open_dir(path: &Path) -> anyhow::Result<OwnedFd> {
    let refuse = |what: &OsStr, why: &str| {
        anyhow::anyhow!(
            "{}: {} {why}: refusing to write through a path another user controls",
            path.display(),
            Path::new(what).display()
        )
    };
    let io_err =
        |e: io::Error| anyhow::Error::new(e).context(format!("cannot open the directory {}", path.display()));
    let root = || Node::open(rustix::fs::CWD, OsStr::new("/")).map_err(io_err);
    let mut at = if path.is_absolute() { root()? } else { Node::open(rustix::fs::CWD, OsStr::new("."))? };
    // The components still to walk, last first.
    let mut rest: Vec<OsString> = components(path);
    let mut links = 0;
    while let Some(name) = rest.pop() {
        if name == ".." {
            at = Node::open(&at.fd, &name).map_err(io_err)?;
            continue;
        }
        let next = Node::open(&at.fd, &name).map_err(io_err)?;
        if !at.guards_its_entries() {
            return Err(refuse(
                &name,
                &format!(
                    "is in a directory uid {} or others may change (mode {:o})",
                    at.stat.st_uid,
                    at.stat.st_mode & 0o7777
                ),
            ));
        }
        if !next.owned_by_us() {
            return Err(refuse(
                &name,
                &format!("is {} of uid {}", kind_of(next.file_type()), next.stat.st_uid),
            ));
        }
        match next.file_type() {
            FileType::Directory => at = next,
            FileType::Symlink => {
                links += 1;
                if links > MAX_LINKS {
                    bail!("{}: more than {MAX_LINKS} symbolic links", path.display());
                }
                let target =
                    rustix::fs::readlinkat(&next.fd, "", Vec::new()).map_err(|e| io_err(e.into()))?;
                let target = PathBuf::from(OsStr::from_bytes(target.as_bytes()));
                rest.extend(components(&target));
                if target.is_absolute() {
                    at = root()?;
                }
            }
            t => return Err(refuse(&name, &format!("is {}, not a directory", kind_of(t)))),
        }
    }
    Ok(at.fd)
}

/// The names to walk in `path`, last first (`.` left out; the root is the walk's start).
fn components(path: &Path) -> Vec<OsString> {
    let mut names: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect();
    names.reverse();
    names
}

/// Refuses `name` in `dir` when what is there must not be written: anything but a regular file,
/// and a regular file unless `force`.
fn check_target(dir: &OwnedFd, name: &OsStr, path: &Path, force: bool) -> anyhow::Result<()> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile if !force => {
                bail!("{} exists: refusing to replace it (--force replaces it)", path.display())
            }
            FileType::RegularFile => Ok(()),
            t => bail!("{} is {}: refusing to write there (name a new file)", path.display(), kind_of(t)),
        },
        Err(e) if e == rustix::io::Errno::NOENT => Ok(()),
        Err(e) => Err(io::Error::from(e)).with_context(|| format!("cannot examine {}", path.display())),
    }
}

/// Renames the temporary file to its name unless the name exists (a link included).
fn rename_noreplace(p: &Pending) -> io::Result<()> {
    match rustix::fs::renameat_with(&p.dir, &p.tmp, &p.dir, &p.name, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(()),
        // A filesystem without RENAME_NOREPLACE: a hard link fails the same way on an existing name.
        Err(e) if e == rustix::io::Errno::INVAL => {
            rustix::fs::linkat(&p.dir, &p.tmp, &p.dir, &p.name, AtFlags::empty())?;
            rustix::fs::unlinkat(&p.dir, &p.tmp, AtFlags::empty())?;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("hvstats-output-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_new_file_appears_only_when_put_in_place_and_an_abandoned_one_leaves_nothing() {
        let dir = tmp("new");
        let path = dir.join("chart.svg");
        let mut out = OutputFile::create(&path, false).unwrap();
        out.file().write_all(b"abc").unwrap();
        assert!(!path.exists());
        out.put_in_place().unwrap();
        out.file().write_all(b"def").unwrap();
        drop(out);
        assert_eq!(std::fs::read(&path).unwrap(), b"abcdef");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no temporary file left");
        let abandoned = OutputFile::create(&dir.join("other"), false).unwrap();
        drop(abandoned);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_that_appears_meanwhile_is_left_alone_unless_forced() {
        let dir = tmp("race");
        let path = dir.join("rec");
        let mut out = OutputFile::create(&path, false).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &path).unwrap();
        let e = out.put_in_place().unwrap_err();
        assert!(e.to_string().contains("appeared while it was being written"), "{e:#}");
        assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_symlink());
        drop(out);
        // Forced: the link itself is replaced, never what it points to.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(dir.join("target"), b"keep").unwrap();
        let mut out = OutputFile::create(&path, true).unwrap();
        std::os::unix::fs::symlink(dir.join("target"), &path).unwrap();
        out.file().write_all(b"new").unwrap();
        out.put_in_place().unwrap();
        assert_eq!(std::fs::read(dir.join("target")).unwrap(), b"keep");
        assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_file());
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
