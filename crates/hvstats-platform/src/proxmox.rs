//! Proxmox VE's identity of a VM: `qm start` runs `/usr/bin/kvm -id <vmid> -name <name> …
//! -chardev socket,id=qmp,path=/var/run/qemu-server/<vmid>.qmp,server=on,wait=off …` as root,
//! and the cluster filesystem keeps the VM's configuration at `/etc/pve/qemu-server/<vmid>.conf`
//! (`name: web1`, `tags: prod;db`), owned by root, mode 0640.
//!
//! The labels are those pve-exporter gives (`pve_guest_info`): `vmid`, `id` (`qemu/<vmid>`),
//! `name` and `tags`. A `-id` is root's word only on a VMM root runs: any user can start a
//! process named `kvm` with `-id 100`, which gets no Proxmox identity.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::{Identity, Label, Platform, Process, Source};

/// Where Proxmox VE keeps its VMs' configurations.
pub const CONFIG_DIR: &str = "/etc/pve/qemu-server";

/// The most of a configuration file read: a VM's is a few KiB (its snapshots' sections follow
/// its own, and are not read).
const MAX_CONFIG_BYTES: u64 = 256 << 10;

/// What a VM's configuration file says of its identity.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Its `name:`.
    pub name: Option<String>,
    /// Its `tags:` (as written: `;`-separated).
    pub tags: Option<String>,
}

/// The identity of the VM of a file's text: the `name:` and `tags:` of its own section (before
/// the first `[snapshot]` section).
pub fn parse_config(text: &str) -> Config {
    let mut config = Config::default();
    for line in text.lines() {
        if line.starts_with('[') {
            break;
        }
        let Some((key, value)) = line.split_once(':') else { continue };
        let value = Some(value.trim().to_owned()).filter(|v| !v.is_empty());
        match key.trim() {
            "name" => config.name = value,
            "tags" => config.tags = value,
            _ => {}
        }
    }
    config
}

/// The configuration of VM `vmid` in `dir` ([`CONFIG_DIR`] on a Proxmox VE node), when it is a
/// regular file root owns and no other user may write (a link is not followed); `None` otherwise,
/// or where there is none.
pub fn read_config(dir: &Path, vmid: u32) -> Option<Config> {
    let mut file = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(dir.join(format!("{vmid}.conf")))
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        return None;
    }
    let mut text = String::new();
    (&mut file).take(MAX_CONFIG_BYTES).read_to_string(&mut text).ok()?;
    Some(parse_config(&text))
}

/// The VM id of a Proxmox-shaped command line: the program is `kvm` and `-id` is a number.
pub fn vmid(process: &Process<'_>) -> Option<u32> {
    if process.program() != "kvm" {
        return None;
    }
    process.option("-id")?.parse().ok()
}

/// The Proxmox identity of `process`, when it is shaped like Proxmox's `kvm`: trusted when root
/// runs it. `config` gives the VM's configuration (see [`read_config`]), asked only of a
/// VMM root runs.
pub fn identity(process: &Process<'_>, config: impl FnOnce(u32) -> Option<Config>) -> Option<Identity> {
    let vmid = vmid(process)?;
    let trusted = process.is_root();
    let config = if trusted { config(vmid).unwrap_or_default() } else { Config::default() };
    let from_line = |name, value: String| Label { name, value, source: Source::CommandLine };
    let from_file =
        |name, value: Option<String>| value.map(|value| Label { name, value, source: Source::PveConfig });
    let mut labels = vec![from_line("vmid", vmid.to_string()), from_line("id", format!("qemu/{vmid}"))];
    labels.extend(from_file("name", config.name));
    labels.extend(from_file("tags", config.tags));
    Some(Identity::new(Platform::Proxmox, labels, trusted))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args;

    /// A VM's file as Proxmox VE 8 writes it, with a snapshot section after its own.
    const CONF: &str = "boot: order=scsi0;net0\ncores: 2\nmemory: 2048\nname: web1\n\
        net0: virtio=BC:24:11:2E:6A:01,bridge=vmbr0\nscsi0: local-lvm:vm-100-disk-0,size=32G\n\
        tags: prod;web\nvmgenid: 3b0e5a5c-6c39-4f1d-9a0d-0f2d5f1c8e11\n\n[before-upgrade]\n\
        name: old-name\ntags: stale\n";

    fn kvm(id: &str) -> Vec<String> {
        args(&[
            "/usr/bin/kvm",
            "-id",
            id,
            "-name",
            "web1,debug-threads=on",
            "-no-shutdown",
            "-chardev",
            &format!("socket,id=qmp,path=/var/run/qemu-server/{id}.qmp,server=on,wait=off"),
            "-mon",
            "chardev=qmp,mode=control",
        ])
    }

    #[test]
    fn the_vm_section_of_a_config_gives_name_and_tags() {
        assert_eq!(
            parse_config(CONF),
            Config { name: Some("web1".to_owned()), tags: Some("prod;web".to_owned()) }
        );
    }

    #[test]
    fn roots_kvm_gets_pve_exporters_labels() {
        let args = kvm("100");
        let process = Process { args: &args, uid: 0, cgroup: "0::/qemu.slice/100.scope\n" };
        let id = identity(&process, |vmid| (vmid == 100).then(|| parse_config(CONF))).unwrap();
        assert_eq!(id.platform(), Platform::Proxmox);
        assert_eq!(id.label("vmid"), Some("100"));
        assert_eq!(id.label("id"), Some("qemu/100"));
        assert_eq!(id.label("name"), Some("web1"));
        assert_eq!(id.label("tags"), Some("prod;web"));
        assert_eq!(id.source(), "pve-config+command-line");
    }

    #[test]
    fn a_forged_id_of_an_unprivileged_kvm_is_not_proxmoxs() {
        let forged = kvm("100");
        let process = Process { args: &forged, uid: 65534, cgroup: "" };
        let id = identity(&process, |_| panic!("a forged id must not make its file read")).unwrap();
        assert!(!id.trusted());
        assert!(id.labels().is_empty());
        // Not Proxmox's shape at all: another program, or an id that is no number.
        let qemu = args(&["qemu-system-x86_64", "-id", "100"]);
        assert!(vmid(&Process { args: &qemu, uid: 0, cgroup: "" }).is_none());
        let word = kvm("web");
        assert!(vmid(&Process { args: &word, uid: 0, cgroup: "" }).is_none());
    }

    #[test]
    fn a_config_file_is_read_only_when_root_owns_it_and_nobody_else_writes_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("hvstats-pve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("101.conf");
        std::fs::write(&path, CONF).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let root = our_uid() == 0;
        assert_eq!(read_config(&dir, 101).is_some(), root, "root-owned 0640 is read (when we are root)");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(read_config(&dir, 101), None, "a file others may write is not the platform's");
        std::os::unix::fs::symlink(&path, dir.join("102.conf")).unwrap();
        assert_eq!(read_config(&dir, 102), None, "a link is not followed");
        assert_eq!(read_config(&dir, 103), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// This process's owner, as the files it creates get it.
    fn our_uid() -> u32 {
        std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(u32::MAX)
    }
}
