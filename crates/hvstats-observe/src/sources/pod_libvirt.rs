//! A KubeVirt VMI's own libvirt: the daemon its `virt-launcher` pod runs (`virtqemud`, or
//! `libvirtd`) to start and run the VMI's QEMU, in session mode as the pod's unprivileged user,
//! and the rule by which the observer believes such a daemon for one VMM.
//!
//! Where it is found, for a VMM whose cgroup is a pod's ([`kubevirt::pod_uid`]): in the pod's
//! `libvirt-runtime` emptyDir volume, which the pod mounts at `/var/run/libvirt` and the host
//! sees under the kubelet's root ([`KUBELET_ROOT`], or [`KUBELET_ROOT_ENV`]'s), as
//! `<root>/pods/<pod UID>/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock` (or
//! `libvirt-sock`, of a pod that runs `libvirtd`); else, where the kubelet's directory is not to
//! be seen, through the VMM's own root (`/proc/<pid>/root/run/libvirt/…`).
//!
//! A root daemon found there is held to the rule of libvirt's system daemons
//! ([`super::libvirt_stats`]). A daemon of another user is believed for the VMM only when all
//! of these hold ([`bind`]):
//! - the socket was found in that pod's volume, every directory above which, from the kubelet's
//!   root to `kubernetes.io~empty-dir`, is root's and writable by no one else (so the path is
//!   the kubelet's making), or in the VMM's own root;
//! - the daemon (the socket's listener, as the kernel records it) is in the VMM's pod's cgroup:
//!   placement under the top-level `kubepods` is root's, which no user of the host or of another
//!   pod can choose;
//! - the daemon holds the other end of a Unix connection the VMM holds (the VMM's monitor, which
//!   libvirt connects to; the kernel's record of who connected, `SO_PEERCRED`): it runs this
//!   VMM, not only some VMM of the pod;
//! - the domain it reports has the VMM's UUID (asked by it) and the name the VMM's `-name`
//!   gives.
//!
//! A daemon that fails any of them is refused, with the one that failed, and never asked again
//! for this VMM.

use std::fs;
use std::os::fd::{AsFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use hvstats_platform::kubevirt;
use hvstats_vmm::libvirt::{Domain, Libvirt};

use crate::discovery::Procfs;
use crate::vm_identity::{copy_fd, pidfd};

/// Where the kubelet keeps its pods' directories, unless [`KUBELET_ROOT_ENV`] names another
/// (the kubelet's `--root-dir`).
pub const KUBELET_ROOT: &str = "/var/lib/kubelet";

/// The environment variable naming the kubelet's root, where it is not [`KUBELET_ROOT`].
pub const KUBELET_ROOT_ENV: &str = "HVSTATS_KUBELET_ROOT";

/// The pod's libvirt runtime volume, under the pod's directory.
const VOLUMES: &str = "volumes/kubernetes.io~empty-dir";
const VOLUME: &str = "libvirt-runtime";

/// The daemon's socket in that volume (mounted at `/var/run/libvirt`): the modular QEMU
/// daemon's, then the monolithic daemon's.
const SOCKET_NAMES: [&str; 2] = ["virtqemud-sock", "libvirt-sock"];

/// The most of a VMM's sockets asked who connected them.
const MAX_SOCKETS: usize = 1024;

/// Where a pod's daemon socket was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// In the pod's volume under the kubelet's root.
    Volume,
    /// In the VMM's own root.
    VmmRoot,
}

/// A pod's libvirt socket for a VMM.
#[derive(Clone, Debug)]
pub(crate) struct PodSocket {
    /// The socket.
    pub path: PathBuf,
    /// The pod's UID, from the VMM's cgroup.
    pub pod_uid: String,
    /// Where it was found.
    pub found: Found,
    /// The kubelet's root it was looked for under.
    pub kubelet: PathBuf,
}

/// The kubelet's root: the one `given` (the options'), else [`KUBELET_ROOT_ENV`]'s, else
/// [`KUBELET_ROOT`].
fn kubelet_root(given: Option<&Path>) -> PathBuf {
    given.map(Path::to_owned).unwrap_or_else(|| {
        let env = std::env::var_os(KUBELET_ROOT_ENV).filter(|v| !v.is_empty());
        env.map_or_else(|| KUBELET_ROOT.into(), PathBuf::from)
    })
}

/// The pod's libvirt socket of the VMM `pid`, with the kubelet's root `kubelet` (see
/// [`kubelet_root`]): `None` when its cgroup is no pod's, or no socket is at either place.
pub(crate) fn find(procfs: &Procfs, pid: i32, kubelet: Option<&Path>) -> Option<PodSocket> {
    let pod_uid = kubevirt::pod_uid(&procfs.cgroup(pid))?;
    let kubelet = kubelet_root(kubelet);
    let volume = kubelet.join("pods").join(&pod_uid).join(VOLUMES).join(VOLUME);
    // `run`, not `var/run`: an absolute link (`/var/run` -> `/run`) would be followed in this
    // process's root, not the VMM's.
    let vmm_root = procfs.root().join(pid.to_string()).join("root/run/libvirt");
    for (dir, found) in [(volume, Found::Volume), (vmm_root, Found::VmmRoot)] {
        for name in SOCKET_NAMES {
            let path = dir.join(name);
            if fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket()) {
                return Some(PodSocket { path, pod_uid, found, kubelet });
            }
        }
    }
    None
}

/// Whether the daemon serving `conn`, not root, is the VMM `vmm`'s pod's own libvirt running
/// `domain` in it (the rule of the module's text); why not, when not.
pub(crate) fn bind(
    procfs: &Procfs,
    vmm: i32,
    socket: &PodSocket,
    conn: &Libvirt,
    domain: &Domain,
) -> Result<(), String> {
    if socket.found == Found::Volume {
        kubelets_path(&socket.kubelet, &socket.pod_uid)?;
    }
    let (daemon, uid, pod) = (conn.daemon(), conn.daemon_uid(), &socket.pod_uid);
    match kubevirt::pod_uid(&procfs.cgroup(daemon)) {
        Some(theirs) if theirs == *pod => {}
        Some(theirs) => {
            return Err(format!(
                "its daemon, pid {daemon} of uid {uid}, is in pod {theirs}, not the VMM's pod {pod}"
            ));
        }
        None => {
            return Err(format!(
                "its daemon, pid {daemon} of uid {uid}, is in no pod's cgroup (the VMM is in pod {pod})"
            ));
        }
    }
    if !connected_by(procfs, vmm, daemon) {
        return Err(format!(
            "its daemon, pid {daemon}, holds no connection of the VMM's (libvirt holds its monitor)"
        ));
    }
    let args = procfs.cmdline(vmm).unwrap_or_default();
    match crate::qemu_args::name(args.get(1..).unwrap_or_default()) {
        Some(name) if name != domain.name => Err(format!(
            "its daemon's domain of the VMM's UUID is {:?}, the VMM's -name {name:?}",
            domain.name
        )),
        _ => Ok(()),
    }
}

/// Whether the directories of the pod's volumes, from the kubelet's root down, are root's and
/// writable by no one else; which is not, when one is not.
fn kubelets_path(kubelet: &Path, pod_uid: &str) -> Result<(), String> {
    let mut dir = kubelet.to_owned();
    for part in ["pods", pod_uid, VOLUMES].iter().flat_map(|p| Path::new(p).components()) {
        check_root_dir(&dir)?;
        dir.push(part);
    }
    check_root_dir(&dir)
}

/// Whether `dir` is a directory of root's that no one else may write.
fn check_root_dir(dir: &Path) -> Result<(), String> {
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() && m.uid() == 0 && m.mode() & 0o022 == 0 => Ok(()),
        Ok(m) => Err(format!(
            "{} (uid {}, mode {:o}) is not the kubelet's: not a directory of root's that no one else may write",
            dir.display(),
            m.uid(),
            m.mode() & 0o7777
        )),
        Err(e) => Err(format!("{}: {e}", dir.display())),
    }
}

/// True when `daemon` connected to one of the VMM `vmm`'s Unix sockets (the kernel's record of
/// the peer of the VMM's end), among its first [`MAX_SOCKETS`] sockets. Each is looked at
/// through a copy (`pidfd_getfd`) closed at once: the VMM's connection is not touched.
fn connected_by(procfs: &Procfs, vmm: i32, daemon: i32) -> bool {
    let Ok(pidfd) = pidfd(vmm) else { return false };
    let Ok(entries) = fs::read_dir(procfs.root().join(vmm.to_string()).join("fd")) else { return false };
    entries
        .flatten()
        .filter(|e| fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("socket:")))
        .take(MAX_SOCKETS)
        .filter_map(|e| e.file_name().to_str()?.parse::<RawFd>().ok())
        .any(|fd| {
            let copy = copy_fd(&pidfd, fd).ok();
            copy.and_then(|c| hvstats_vmm::peer::credentials(c.as_fd())).is_some_and(|c| c.pid == daemon)
        })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_directory_of_the_kubelets_path_must_be_roots_and_closed_to_others_writes() {
        let dir = std::env::temp_dir().join(format!("pod-libvirt-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        let closed = check_root_dir(&dir);
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let open = check_root_dir(&dir);
        let owner = fs::metadata(&dir).unwrap().uid();
        fs::remove_dir(&dir).unwrap();
        // The tests run as root on the hosts that run them all; as another user the directory
        // is that user's, and refused for it.
        assert_eq!(closed.is_ok(), owner == 0, "{closed:?}");
        assert!(open.unwrap_err().contains("mode 777"));
        assert!(check_root_dir(Path::new("/nonexistent-kubelet")).is_err());
    }
}
