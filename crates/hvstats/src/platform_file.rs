//! The file beside an observer's instance that names its VMs on their platforms (Nova's project,
//! KubeVirt's pod, Proxmox's vmid): text of variable length that no index entry can carry,
//! written whole by the observer and read by every surface that shows a VM's identity.
//!
//! It lives beside the instance's arena as `<instance name>.platform`, under the directory's
//! discipline ([`crate::runtime_dir`]): written to a temporary file and renamed into place, read
//! only when it is a regular file of the directory's owner (or root) that no other user may
//! write, and never more than [`MAX_BYTES`]. It goes with its instance: the publication removes
//! it at its end, and a sweep removes one whose arena is gone ([`crate::publish::sweep`]). What
//! it says is parsed by its reader, which trusts none of it beyond its shape.

use std::io::{Read, Write};
use std::path::Path;

use crate::publish::{INSTANCES_DIR, InstanceName};
use crate::runtime_dir::{Dir, RuntimeDirError, Use, euid, fstat};

/// The most of the file read: a few hundred bytes per VM.
pub const MAX_BYTES: u64 = 4 << 20;

/// The instances directory of `runtime_dir`, opened for `usage`.
fn instances(runtime_dir: &Path, usage: Use) -> Result<Dir, RuntimeDirError> {
    Dir::open(runtime_dir, usage)?.subdir(INSTANCES_DIR, usage)
}

/// Replaces the file of instance `name` in `runtime_dir` with `text` (removes it when `text` is
/// empty).
///
/// # Errors
/// When the directory cannot be opened to publish, or the file cannot be written or renamed.
pub fn write(runtime_dir: &Path, name: &InstanceName, text: &str) -> Result<(), RuntimeDirError> {
    let dir = instances(runtime_dir, Use::Publish)?;
    let target = name.platform_file();
    if text.is_empty() {
        let _ = dir.remove_file(&target);
        return Ok(());
    }
    let temp = format!(".{target}.{}", std::process::id());
    let _ = dir.remove_file(&temp);
    let mut file = dir.create_file(&temp, 0o644, None)?;
    let written = file.write_all(text.as_bytes());
    drop(file);
    if let Err(source) = written {
        let _ = dir.remove_file(&temp);
        return Err(RuntimeDirError::Io { path: dir.path().join(&temp), what: "write", source });
    }
    dir.rename_replace(&temp, &target).inspect_err(|_| {
        let _ = dir.remove_file(&temp);
    })
}

/// The text of instance `name`'s file in `runtime_dir`, `None` when it has none.
///
/// # Errors
/// When it cannot be read, or is not believed: another user's than the directory's owner (or
/// root), writable by group or others, or longer than [`MAX_BYTES`].
pub fn read(runtime_dir: &Path, name: &InstanceName) -> Result<Option<String>, RuntimeDirError> {
    let not_found = |e: &RuntimeDirError| e.io_kind() == Some(std::io::ErrorKind::NotFound);
    let dir = match instances(runtime_dir, Use::Read) {
        Err(e) if not_found(&e) => return Ok(None),
        dir => dir?,
    };
    let target = name.platform_file();
    let path = dir.path().join(&target);
    let file = match dir.open_file(&target, false) {
        Err(e) if not_found(&e) => return Ok(None),
        file => file?,
    };
    let io = |what, source| RuntimeDirError::Io { path: path.clone(), what, source };
    let invalid =
        |why: &str| io("believe", std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_owned()));
    let st = fstat(std::os::fd::AsFd::as_fd(&file)).map_err(|e| io("stat", e))?;
    let owner = fstat(dir.fd()).map(|d| d.st_uid).unwrap_or(u32::MAX);
    if st.st_uid != owner && st.st_uid != euid() && st.st_uid != 0 {
        return Err(invalid("it belongs to another user than the runtime directory"));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(invalid("it is writable by group or others"));
    }
    let mut text = String::new();
    file.take(MAX_BYTES + 1).read_to_string(&mut text).map_err(|e| io("read", e))?;
    if text.len() as u64 > MAX_BYTES {
        return Err(invalid("it is longer than a platform file"));
    }
    Ok(Some(text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_file_is_written_read_replaced_and_a_planted_one_is_not_believed() {
        let tmp = hvstats_testkit::TempDir::new("platform-file");
        let name = InstanceName { pid: 42, start_time: 7, seq: 0 };
        assert_eq!(read(tmp.path(), &name).unwrap(), None);
        write(tmp.path(), &name, "1\tplatform\tproxmox\n").unwrap();
        assert_eq!(read(tmp.path(), &name).unwrap().as_deref(), Some("1\tplatform\tproxmox\n"));
        write(tmp.path(), &name, "").unwrap();
        assert_eq!(read(tmp.path(), &name).unwrap(), None, "empty is no file");
        let path = tmp.path().join(INSTANCES_DIR).join(name.platform_file());
        std::fs::write(&path, "x").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(read(tmp.path(), &name).is_err(), "a file anyone may write is believed");
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &path).unwrap();
        assert!(read(tmp.path(), &name).is_err(), "a link is followed");
    }

    #[test]
    fn a_file_whose_instance_is_gone_is_swept_and_one_whose_instance_lives_is_kept() {
        let tmp = hvstats_testkit::TempDir::new("platform-sweep");
        let hv = crate::Hypervisor::new_published(tmp.path()).unwrap();
        let live = hv.published_name().unwrap();
        let gone = InstanceName { pid: 42, start_time: 7, seq: 0 };
        write(tmp.path(), &live, "1\tplatform\tkata\n").unwrap();
        write(tmp.path(), &gone, "1\tplatform\tkata\n").unwrap();
        let instances = instances(tmp.path(), Use::Publish).unwrap();
        let swept = crate::publish::sweep(&instances);
        assert_eq!(swept.removed, [instances.path().join(gone.platform_file())]);
        assert!(read(tmp.path(), &live).unwrap().is_some());
        drop(hv);
        assert_eq!(read(tmp.path(), &live).unwrap(), None, "its publication's end removes it");
    }
}
