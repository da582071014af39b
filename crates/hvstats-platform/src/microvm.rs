//! The names microVM VMMs give their VMs on their command lines, and Kata Containers' sandbox
//! behind them: Cloud Hypervisor's `--api-socket` (`path=/run/ch/web1.sock` or the bare path),
//! Firecracker's `--id`, and Kata's sandbox id, the directory Kata gives each sandbox's VMM
//! (`/run/vc/vm/<sandbox id>/clh-api.sock` for Cloud Hypervisor, `/run/vc/vm/<id>/qmp.sock` for
//! QEMU, `/run/vc/firecracker/<id>/…` for Firecracker).
//!
//! A name is the VMM's claim ([`Identity::claimed_name`]): the VM's name where it has no other.
//! Kata's `sandbox_id` label is given only for a VMM root runs (Kata's runtime is root's).

use std::path::Path;

use crate::{Identity, Label, Platform, Process, Source};

/// The directories under which Kata gives each sandbox's VMM a directory named by its id.
const KATA_DIRS: [&str; 2] = ["/run/vc/vm/", "/run/vc/firecracker/"];

/// File names that say nothing of the VM (Kata's, and common choices): the directory names it.
const GENERIC: [&str; 4] = ["clh-api", "api", "qmp", "firecracker"];

/// Cloud Hypervisor's API socket path (`--api-socket path=P` or `--api-socket P`).
fn api_socket<'a>(process: &'a Process<'a>) -> Option<&'a str> {
    let value = process.option("--api-socket")?;
    value.split(',').find_map(|p| p.strip_prefix("path=")).or((!value.contains('=')).then_some(value))
}

/// The sandbox id of a path under Kata's directories.
fn sandbox_of(path: &str) -> Option<&str> {
    let rest = KATA_DIRS.iter().find_map(|d| path.strip_prefix(d))?;
    rest.split('/').next().filter(|id| !id.is_empty())
}

/// The VM's name a socket path gives: its file's stem, or its directory's name when the stem is
/// a generic one.
fn name_of_socket(path: &str) -> Option<String> {
    let path = Path::new(path);
    let stem = path.file_stem()?.to_str()?;
    if !GENERIC.contains(&stem) {
        return Some(stem.to_owned());
    }
    path.parent()?.file_name()?.to_str().map(str::to_owned)
}

/// The paths a command line names that may say the sandbox: Cloud Hypervisor's API socket,
/// Firecracker's, and the QMP or chardev socket paths of a Kata QEMU.
fn paths<'a>(process: &'a Process<'a>) -> impl Iterator<Item = &'a str> {
    let api = api_socket(process).into_iter().chain(process.option("--api-sock"));
    let qemu = process
        .args
        .iter()
        .flat_map(|a| a.split(','))
        .filter_map(|p| p.strip_prefix("path=").or_else(|| p.strip_prefix("unix:")));
    api.chain(qemu)
}

/// The identity of a Kata sandbox's VMM, or of a Cloud Hypervisor or Firecracker VMM, from
/// its command line.
pub fn identity(process: &Process<'_>) -> Option<Identity> {
    if let Some(sandbox) = paths(process).find_map(sandbox_of) {
        let label = Label { name: "sandbox_id", value: sandbox.to_owned(), source: Source::CommandLine };
        let identity = Identity::new(Platform::Kata, vec![label], process.is_root());
        return Some(identity.with_claimed_name(Some(sandbox.to_owned())));
    }
    let program = process.program();
    if program.starts_with("cloud-hyperviso") {
        let name = api_socket(process).and_then(name_of_socket);
        return Some(Identity::new(Platform::CloudHypervisor, vec![], true).with_claimed_name(name));
    }
    if program.starts_with("firecracker") {
        let name = process.option("--id").map(str::to_owned);
        return Some(Identity::new(Platform::Firecracker, vec![], true).with_claimed_name(name));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args;

    fn of(a: &[&str], uid: u32) -> Identity {
        let args = args(a);
        identity(&Process { args: &args, uid, cgroup: "" }).unwrap()
    }

    #[test]
    fn cloud_hypervisor_is_named_by_its_api_socket() {
        let ch = |socket: &str| {
            of(&["cloud-hypervisor", "--api-socket", socket, "--kernel", "vmlinux", "--cpus", "boot=2"], 0)
        };
        let id = ch("path=/run/ch/web1.sock");
        assert_eq!(id.platform(), Platform::CloudHypervisor);
        assert_eq!(id.claimed_name(), Some("web1"));
        assert!(id.labels().is_empty(), "a name is no platform label");
        assert_eq!(ch("/var/lib/ch/db7/api.sock").claimed_name(), Some("db7"));
        let fc = of(&["firecracker", "--api-sock", "/tmp/fc.sock", "--id", "fc-1"], 1000);
        assert_eq!((fc.platform(), fc.claimed_name()), (Platform::Firecracker, Some("fc-1")));
    }

    #[test]
    fn a_kata_sandboxs_vmm_is_named_by_its_sandbox() {
        let id = "4c2e9f4b1d7a4e3f9b8c7d6e5f4a3b2c";
        let socket = format!("path=/run/vc/vm/{id}/clh-api.sock");
        let clh = of(&["/opt/kata/bin/cloud-hypervisor", "--api-socket", &socket], 0);
        assert_eq!(clh.platform(), Platform::Kata);
        assert_eq!((clh.label("sandbox_id"), clh.claimed_name()), (Some(id), Some(id)));
        let qmp = format!("unix:/run/vc/vm/{id}/qmp.sock,server=on,wait=off");
        let qemu =
            of(&["/opt/kata/bin/qemu-system-x86_64", "-name", &format!("sandbox-{id}"), "-qmp", &qmp], 0);
        assert_eq!(qemu.label("sandbox_id"), Some(id));
        // Anyone's VMM may put its socket there in name: not root's, no label.
        let forged = of(&["cloud-hypervisor", "--api-socket", &socket], 65534);
        assert!(forged.labels().is_empty());
        assert_eq!(forged.claimed_name(), Some(id));
    }
}
