//! The mark an observer leaves in the runtime directory, so that an observer that is gone stays
//! visible.
//!
//! An observer killed outright leaves its instance behind, and the exporter that saw it die
//! reports it down; but once anything cleans the dead instance away (`hvstats snapshot` does), a
//! restarted exporter would know of no observer at all, and an alert on "observer down" could
//! never fire. So an observer, once published, writes its instance name to [`MARK`] at the top
//! of the runtime directory, and removes it when it stops cleanly; an exporter that finds the
//! mark and no observer publishing reports that one down.
//!
//! The mark is believed only as the runtime directory's owner (or root) left it: a regular file
//! (never through a link), not writable by group or others, at most [`MAX_LEN`] bytes, holding an
//! instance name. It is replaced by a rename, so a reader sees the old name or the new one.

use std::io::{Read, Write};
use std::path::Path;

use crate::publish::InstanceName;
use crate::runtime_dir::{Dir, RuntimeDirError, Use, euid, fstat};

/// The mark's file name, at the top of the runtime directory.
pub const MARK: &str = "observer";

/// The longest mark read.
pub const MAX_LEN: u64 = 64;

/// Leaves the mark of the observer publishing as `name` under `runtime_dir`.
///
/// # Errors
/// When the runtime directory fails its checks or the mark cannot be written.
pub fn leave(runtime_dir: &Path, name: &InstanceName) -> Result<(), RuntimeDirError> {
    let dir = Dir::open(runtime_dir, Use::Publish)?;
    let temp = format!(".{MARK}.{}", std::process::id());
    let _ = dir.remove_file(&temp);
    let mut file = dir.create_file(&temp, 0o644, None)?;
    let written = file.write_all(format!("{name}\n").as_bytes());
    drop(file);
    if let Err(source) = written {
        let _ = dir.remove_file(&temp);
        return Err(RuntimeDirError::Io { path: dir.path().join(&temp), what: "write", source });
    }
    dir.rename_replace(&temp, MARK).inspect_err(|_| {
        let _ = dir.remove_file(&temp);
    })
}

/// Removes the mark under `runtime_dir` if it is still `name`'s (an observer stopping cleanly).
pub fn clear(runtime_dir: &Path, name: &InstanceName) {
    if let Ok(Some(marked)) = read(runtime_dir)
        && marked == *name
        && let Ok(dir) = Dir::open(runtime_dir, Use::Publish)
    {
        let _ = dir.remove_file(MARK);
    }
}

/// The observer marked under `runtime_dir`: `None` when there is no mark.
///
/// # Errors
/// When the runtime directory fails its checks, or the mark is not one its owner left (a link,
/// not a regular file, another user's, writable by others, too long, not an instance name).
pub fn read(runtime_dir: &Path) -> Result<Option<InstanceName>, RuntimeDirError> {
    let dir = match Dir::open(runtime_dir, Use::Read) {
        Ok(dir) => dir,
        // No runtime directory yet: no observer ever left its mark there.
        Err(e) if e.io_kind() == Some(std::io::ErrorKind::NotFound) => return Ok(None),
        Err(e) => return Err(e),
    };
    let path = dir.path().join(MARK);
    let file = match dir.open_file(MARK, false) {
        Ok(file) => file,
        Err(e) if e.io_kind() == Some(std::io::ErrorKind::NotFound) => return Ok(None),
        Err(e) => return Err(e),
    };
    let st = fstat(std::os::fd::AsFd::as_fd(&file)).map_err(|source| RuntimeDirError::Io {
        path: path.clone(),
        what: "stat",
        source,
    })?;
    let owner = fstat(dir.fd()).map(|d| d.st_uid).unwrap_or(u32::MAX);
    let invalid = |why: &str| RuntimeDirError::Io {
        path: path.clone(),
        what: "believe",
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_owned()),
    };
    if st.st_uid != owner && st.st_uid != euid() && st.st_uid != 0 {
        return Err(invalid("it belongs to another user than the runtime directory"));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(invalid("it is writable by group or others"));
    }
    let mut text = String::new();
    file.take(MAX_LEN + 1).read_to_string(&mut text).map_err(|source| RuntimeDirError::Io {
        path: path.clone(),
        what: "read",
        source,
    })?;
    if text.len() as u64 > MAX_LEN {
        return Err(invalid("it is longer than a mark"));
    }
    InstanceName::parse(text.trim_end_matches('\n'))
        .map(Some)
        .ok_or_else(|| invalid("it holds no instance name"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_mark_is_left_read_and_cleared_and_a_planted_one_is_not_believed() {
        let tmp = hvstats_testkit::TempDir::new("observer-mark");
        let name = InstanceName { pid: 42, start_time: 7, seq: 0 };
        assert_eq!(read(tmp.path()).unwrap(), None);
        leave(tmp.path(), &name).unwrap();
        assert_eq!(read(tmp.path()).unwrap(), Some(name));
        // Another observer's stop leaves this one's mark alone.
        clear(tmp.path(), &InstanceName { pid: 43, ..name });
        assert_eq!(read(tmp.path()).unwrap(), Some(name));
        clear(tmp.path(), &name);
        assert_eq!(read(tmp.path()).unwrap(), None);
        let mark = tmp.path().join(MARK);
        for planted in ["not a name\n", "1-2-3-4\n", &"9".repeat(100)] {
            std::fs::write(&mark, planted).unwrap();
            std::fs::set_permissions(&mark, std::fs::Permissions::from_mode(0o644)).unwrap();
            assert!(read(tmp.path()).is_err(), "{planted:?}");
        }
        std::fs::write(&mark, "1-2-3\n").unwrap();
        std::fs::set_permissions(&mark, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(read(tmp.path()).is_err(), "a mark anyone may write is believed");
        std::fs::remove_file(&mark).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &mark).unwrap();
        assert!(read(tmp.path()).is_err(), "a link is followed");
        // Leaving the mark replaces the link, never writes through it.
        leave(tmp.path(), &name).unwrap();
        assert_eq!(read(tmp.path()).unwrap(), Some(name));
    }
}
