//! Files a user names for a command to write (`record -o`, `plot -o`), opened so that nobody can
//! steer the write elsewhere.
//!
//! hvstats usually runs as root, and its output often goes to a shared directory (`/tmp`). Opening
//! the path as `File::create` does would follow a link another user planted there (overwriting the
//! file it points to) and would wait forever on a FIFO. Here the path itself is never opened:
//!
//! - what is at the path is examined without following it; a link, FIFO, device, socket or
//!   directory is refused at once, and an existing regular file only with `--force`;
//! - the bytes go to a new temporary file in the same directory, created `O_EXCL | O_NOFOLLOW`;
//! - [`OutputFile::put_in_place`] renames it to the path: without `--force` with
//!   `RENAME_NOREPLACE` (whatever appeared there meanwhile is left alone), with `--force` by a
//!   plain rename, which replaces a link planted meanwhile and never writes to what it points to.
//!
//! `-` and `/dev/stdout` write to standard output as it is (a pipe, a terminal, a file the shell
//! opened), so `record -o - | …` keeps working.

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// A file being written for the user, at a temporary name until [`put_in_place`](Self::put_in_place).
#[derive(Debug)]
pub struct OutputFile {
    file: File,
    /// The temporary file and where it goes; `None` for standard output or once in place.
    pending: Option<(PathBuf, PathBuf)>,
    force: bool,
}

/// True when `path` means standard output.
pub fn is_stdout(path: &Path) -> bool {
    path == Path::new("-") || path == Path::new("/dev/stdout")
}

/// What a non-regular file is, in words.
fn kind_of(t: std::fs::FileType) -> &'static str {
    if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

impl OutputFile {
    /// Starts writing `path` (see the module documentation); `force` allows replacing an existing
    /// regular file.
    ///
    /// # Errors
    /// When something other than a regular file is at `path`, a regular file is there and `force`
    /// is not given, or the temporary file cannot be created.
    pub fn create(path: &Path, force: bool) -> anyhow::Result<Self> {
        if is_stdout(path) {
            let fd = io::stdout().as_fd().try_clone_to_owned().context("cannot use standard output")?;
            return Ok(Self { file: File::from(fd), pending: None, force });
        }
        check_target(path, force)?;
        let name = path.file_name().with_context(|| format!("{} does not name a file", path.display()))?;
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let mut last = None;
        for attempt in 0..16u32 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let mut tmp_name = std::ffi::OsString::from(".");
            tmp_name.push(name);
            tmp_name.push(format!(".{}-{nanos:x}-{attempt}.tmp", std::process::id()));
            let tmp = dir.join(tmp_name);
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o666)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp)
            {
                Ok(file) => return Ok(Self { file, pending: Some((tmp, path.to_owned())), force }),
                // Something (perhaps planted) has that name: try another.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot create a file in {}", dir.display()));
                }
            }
        }
        Err(last.unwrap_or_else(|| io::ErrorKind::AlreadyExists.into()))
            .with_context(|| format!("cannot create a temporary file in {}", dir.display()))
    }

    /// The file to write to: the temporary file, or standard output for `-` or `/dev/stdout`.
    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// Gives the written file its name (see the module documentation). Writes after this still go
    /// to the same file, now at its name: a recording is put in place after its header, so it can
    /// be read while it grows. Does nothing for standard output or a second time.
    ///
    /// # Errors
    /// When something appeared at the path meanwhile (without `--force`), or the rename fails.
    pub fn put_in_place(&mut self) -> anyhow::Result<()> {
        let Some((tmp, target)) = self.pending.as_ref() else { return Ok(()) };
        if self.force {
            std::fs::rename(tmp, target).with_context(|| format!("cannot replace {}", target.display()))?;
        } else {
            rename_noreplace(tmp, target).map_err(|e| match e.kind() {
                io::ErrorKind::AlreadyExists => anyhow::anyhow!(
                    "{} appeared while it was being written: left alone (--force replaces a regular file)",
                    target.display()
                ),
                _ => anyhow::Error::new(e).context(format!("cannot create {}", target.display())),
            })?;
        }
        self.pending = None;
        Ok(())
    }
}

impl Drop for OutputFile {
    /// A file never put in place (an error on the way) leaves nothing behind.
    fn drop(&mut self) {
        if let Some((tmp, _)) = self.pending.take() {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

/// Refuses `path` when what is there must not be written: anything but a regular file, and a
/// regular file unless `force`.
fn check_target(path: &Path, force: bool) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_file() => bail!(
            "{} is {}: refusing to write there (name a new file)",
            path.display(),
            kind_of(meta.file_type())
        ),
        Ok(_) if !force => {
            bail!("{} exists: refusing to replace it (--force replaces it)", path.display())
        }
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("cannot examine {}", path.display())),
    }
}

/// Renames `from` to `to` unless `to` exists (a link included).
fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput);
    let (f, t) = (c(from)?, c(to)?);
    // SAFETY: NUL-terminated paths; renameat2 reads them and writes no memory of ours.
    let rc = unsafe {
        libc::renameat2(libc::AT_FDCWD, f.as_ptr(), libc::AT_FDCWD, t.as_ptr(), libc::RENAME_NOREPLACE)
    };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EINVAL) {
        return Err(e);
    }
    // A filesystem without RENAME_NOREPLACE: a hard link fails the same way on an existing name.
    std::fs::hard_link(from, to)?;
    std::fs::remove_file(from)
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
