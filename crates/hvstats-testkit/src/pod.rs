//! A cgroup shaped like the one the kubelet makes for a pod's container, and a pod's libvirt
//! volume under a kubelet root of the test's own, for tests of what the observer reads of
//! KubeVirt's pods.

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

/// How the kubelet names a pod's cgroups (its `--cgroup-driver`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupDriver {
    /// systemd's: `kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid with
    /// _>.slice/cri-containerd-<id>.scope`.
    Systemd,
    /// cgroupfs': `kubepods/besteffort/pod<uid>/<id>`.
    Cgroupfs,
}

/// A pod's container's cgroup (a best-effort pod's), in the unified hierarchy where it is the
/// host's only one, else in v1's `pids`; removed on drop, its processes moved to the root first.
pub struct PodCgroup {
    hierarchy: PathBuf,
    /// Its directories, the top-level `kubepods` first.
    dirs: Vec<PathBuf>,
}

impl PodCgroup {
    /// Makes the cgroup of a container of pod `uid`, as `driver` names it; `None` where the host
    /// has no hierarchy to make it in.
    pub fn new(driver: CgroupDriver, uid: &str) -> Option<Self> {
        let hierarchy = [Path::new("/sys/fs/cgroup"), Path::new("/sys/fs/cgroup/pids")]
            .into_iter()
            .find(|h| h.join("cgroup.procs").exists())?
            .to_owned();
        let container = "0123456789abcdef";
        let parts = match driver {
            CgroupDriver::Systemd => vec![
                "kubepods.slice".to_owned(),
                "kubepods-besteffort.slice".to_owned(),
                format!("kubepods-besteffort-pod{}.slice", uid.replace('-', "_")),
                format!("cri-containerd-{container}.scope"),
            ],
            CgroupDriver::Cgroupfs => {
                vec![
                    "kubepods".to_owned(),
                    "besteffort".to_owned(),
                    format!("pod{uid}"),
                    container.to_owned(),
                ]
            }
        };
        let mut dirs = Vec::new();
        let mut dir = hierarchy.clone();
        for part in parts {
            dir.push(part);
            dirs.push(dir.clone());
        }
        std::fs::create_dir_all(&dir).ok()?;
        Some(Self { hierarchy, dirs })
    }

    /// The container's cgroup directory.
    pub fn path(&self) -> &Path {
        self.dirs.last().unwrap()
    }

    /// Moves process `pid` into it (as the container runtime places a container's processes).
    ///
    /// # Panics
    /// When the kernel refuses.
    pub fn add(&self, pid: i32) {
        std::fs::write(self.path().join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        let procs = std::fs::read_to_string(self.path().join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines() {
            let _ = std::fs::write(self.hierarchy.join("cgroup.procs"), pid);
        }
        // The shared levels go only once no other test's pod is under them.
        for dir in self.dirs.iter().rev() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// The `libvirt-runtime` emptyDir volume of pod `uid` under the kubelet root `kubelet`, made as
/// the kubelet makes it: root's directories down to `kubernetes.io~empty-dir` (closed to others'
/// writes), the volume open to all.
///
/// # Panics
/// When it cannot be made.
pub fn libvirt_volume(kubelet: &Path, uid: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let volumes = kubelet.join("pods").join(uid).join("volumes/kubernetes.io~empty-dir");
    std::fs::create_dir_all(&volumes).unwrap();
    let volume = volumes.join("libvirt-runtime");
    std::fs::create_dir(&volume).unwrap();
    std::fs::set_permissions(&volume, std::fs::Permissions::from_mode(0o777)).unwrap();
    volume
}
