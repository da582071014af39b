//! KubeVirt's identity of a VM: a VMI's QEMU runs in its `virt-launcher` pod, started by the
//! pod's libvirt with `-name guest=<namespace>_<name>,debug-threads=on` and
//! `-smbios type=1,manufacturer=KubeVirt,product=None,…`, in the pod's cgroup, which the kubelet
//! (root) made: `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/…`
//! under systemd's cgroup driver (the UID's `-` written `_`), `/kubepods/burstable/pod<uid>/…`
//! under cgroupfs'.
//!
//! Labels: `namespace` and `name` (the `-name` split on its first `_`: a namespace has no `_`),
//! and `pod_uid`, the pod's UID, which kube-state-metrics' `kube_pod_info{uid}` carries. The
//! identity is trusted only when the pod UID comes from a cgroup under the hierarchy's top-level
//! `kubepods`, which only root can place a process in: anyone can write KubeVirt's command line,
//! and a user with a delegated cgroup subtree can name a cgroup `kubepods…pod<uid>` below it.
//!
//! Where the observer reaches the pod's own libvirt daemon and binds it to the VMM (the
//! daemon is in the VMM's pod and holds its monitor: the observer's rule), the namespace and
//! name come from the domain that daemon runs in the VMM instead ([`from_pod_daemon`]), and
//! `identity_source` says `pod-libvirt`.

use crate::{Identity, Label, Platform, Process, Source};

/// The SMBIOS manufacturer KubeVirt gives its VMs.
const MANUFACTURER: &str = "KubeVirt";

/// The value of `key` in a QEMU option value (`k=v,k2=v2`, `,,` a comma).
fn key_value(value: &str, key: &str) -> Option<String> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            (',', Some(',')) => {
                chars.next();
                current.push(',');
            }
            (',', _) => parts.push(std::mem::take(&mut current)),
            _ => current.push(c),
        }
    }
    parts.push(current);
    parts.iter().rev().find_map(|p| p.strip_prefix(key)?.strip_prefix('=').map(str::to_owned))
}

/// True when `process` is shaped like KubeVirt's QEMU: its `-smbios type=1` names KubeVirt.
fn is_kubevirt(process: &Process<'_>) -> bool {
    let args = process.args;
    args.windows(2).any(|w| {
        w[0] == "-smbios"
            && key_value(&w[1], "type").as_deref() == Some("1")
            && key_value(&w[1], "manufacturer").as_deref() == Some(MANUFACTURER)
    })
}

/// The pod UID of a `/proc/<pid>/cgroup` text, when the process is in a pod's cgroup under the
/// hierarchy's top-level `kubepods` (`kubepods.slice` or `kubepods`), in its canonical form.
pub fn pod_uid(cgroup: &str) -> Option<String> {
    cgroup.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        let mut components = path.strip_prefix('/')?.split('/');
        let top = components.next()?;
        if top != "kubepods" && top != "kubepods.slice" {
            return None;
        }
        std::iter::once(top).chain(components).find_map(uid_of_component)
    })
}

/// The pod UID a cgroup path component names (`pod<uid>`, or systemd's
/// `kubepods-<class>-pod<uid with _>.slice`).
fn uid_of_component(component: &str) -> Option<String> {
    let component = component.strip_suffix(".slice").unwrap_or(component);
    let at = component.rfind("pod")?;
    let uid = component[at + 3..].replace('_', "-").to_ascii_lowercase();
    let shape: Vec<usize> = uid.split('-').map(str::len).collect();
    let hex = uid.chars().all(|c| c == '-' || c.is_ascii_hexdigit());
    (shape == [8, 4, 4, 4, 12] && hex && (at == 0 || component[..at].ends_with('-'))).then_some(uid)
}

/// The KubeVirt identity of `process`, when it is shaped like KubeVirt's QEMU.
pub fn identity(process: &Process<'_>) -> Option<Identity> {
    if !is_kubevirt(process) {
        return None;
    }
    let args = process.args;
    let guest = args.windows(2).filter(|w| w[0] == "-name").find_map(|w| key_value(&w[1], "guest"));
    let split = guest.as_deref().and_then(|g| g.split_once('_'));
    let from_line = |name, value: &str| Label { name, value: value.to_owned(), source: Source::CommandLine };
    let mut labels = Vec::new();
    if let Some((namespace, name)) = split {
        labels.push(from_line("namespace", namespace));
        labels.push(from_line("name", name));
    }
    let uid = pod_uid(process.cgroup);
    let trusted = uid.is_some();
    labels.extend(uid.map(|value| Label { name: "pod_uid", value, source: Source::Cgroup }));
    Some(Identity::new(Platform::KubeVirt, labels, trusted).with_claimed_name(guest))
}

/// KubeVirt's identity of the VM whose VMM's pod is `pod_uid` (its cgroup's), from `domain`,
/// the name of the domain the pod's libvirt daemon runs in it (`<namespace>_<name>`, split on
/// the first `_`; a name without one is the whole name, as KubeVirt reads it). Trusted: the
/// caller has bound the daemon to the VMM's pod.
pub fn from_pod_daemon(domain: &str, pod_uid: &str) -> Identity {
    let from_daemon = |name, value: &str| Label { name, value: value.to_owned(), source: Source::PodLibvirt };
    let mut labels = match domain.split_once('_') {
        Some((namespace, name)) => vec![from_daemon("namespace", namespace), from_daemon("name", name)],
        None => vec![from_daemon("name", domain)],
    };
    labels.push(Label { name: "pod_uid", value: pod_uid.to_owned(), source: Source::Cgroup });
    Identity::new(Platform::KubeVirt, labels, true).with_claimed_name(Some(domain.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args;

    /// The command line virt-launcher's libvirt gives a VMI `testvm` of namespace `default`
    /// (KubeVirt 1.x, trimmed of its devices).
    fn launcher() -> Vec<String> {
        args(&[
            "/usr/libexec/qemu-kvm",
            "-name",
            "guest=default_testvm,debug-threads=on",
            "-S",
            "-object",
            "{\"qom-type\":\"secret\",\"id\":\"masterKey0\",\"format\":\"raw\"}",
            "-machine",
            "pc-q35-rhel9.2.0,usb=off,dump-guest-core=off,memory-backend=pc.ram",
            "-smbios",
            "type=1,manufacturer=KubeVirt,product=None,uuid=5a9fc181-957e-5c32-9e5a-2de5e9673531,family=KubeVirt",
            "-uuid",
            "5a9fc181-957e-5c32-9e5a-2de5e9673531",
        ])
    }

    const SYSTEMD: &str = "0::/kubepods.slice/kubepods-burstable.slice/\
        kubepods-burstable-pod6f2b1c3e_4d5a_4b6c_8d7e_9f0a1b2c3d4e.slice/\
        cri-containerd-0123456789abcdef.scope\n";
    const CGROUPFS: &str =
        "12:pids:/kubepods/besteffort/pod6f2b1c3e-4d5a-4b6c-8d7e-9f0a1b2c3d4e/0123456789abcdef\n";

    #[test]
    fn the_pod_uid_is_read_from_both_cgroup_drivers_paths() {
        let uid = Some("6f2b1c3e-4d5a-4b6c-8d7e-9f0a1b2c3d4e".to_owned());
        assert_eq!(pod_uid(SYSTEMD), uid);
        assert_eq!(pod_uid(CGROUPFS), uid);
        assert_eq!(pod_uid("0::/user.slice/user-1000.slice/session-2.scope\n"), None);
        // A delegated subtree's own "kubepods" is not the kubelet's.
        let delegated = "0::/user.slice/user-65534.slice/user@65534.service/kubepods/\
            pod6f2b1c3e-4d5a-4b6c-8d7e-9f0a1b2c3d4e/x\n";
        assert_eq!(pod_uid(delegated), None);
        assert_eq!(pod_uid("0::/kubepods/podnot-a-uid/x\n"), None);
    }

    #[test]
    fn a_launchers_qemu_in_its_pod_gets_namespace_name_and_pod() {
        let args = launcher();
        let id = identity(&Process { args: &args, uid: 107, cgroup: SYSTEMD }).unwrap();
        assert!(id.trusted());
        assert_eq!(id.label("namespace"), Some("default"));
        assert_eq!(id.label("name"), Some("testvm"));
        assert_eq!(id.label("pod_uid"), Some("6f2b1c3e-4d5a-4b6c-8d7e-9f0a1b2c3d4e"));
        assert_eq!(id.source(), "cgroup+command-line");
        // Split on the first `_`: a VMI's name may hold more.
        let mut odd = launcher();
        odd[2] = "guest=ns_my_vm,debug-threads=on".to_owned();
        let id = identity(&Process { args: &odd, uid: 107, cgroup: CGROUPFS }).unwrap();
        assert_eq!((id.label("namespace"), id.label("name")), (Some("ns"), Some("my_vm")));
    }

    #[test]
    fn the_pod_daemons_domain_names_namespace_and_name() {
        let uid = "6f2b1c3e-4d5a-4b6c-8d7e-9f0a1b2c3d4e";
        let id = from_pod_daemon("default_my_vm", uid);
        assert!(id.trusted());
        assert_eq!((id.label("namespace"), id.label("name")), (Some("default"), Some("my_vm")));
        assert_eq!(id.label("pod_uid"), Some(uid));
        assert_eq!(id.source(), "pod-libvirt+cgroup");
        let bare = from_pod_daemon("testvm", uid);
        assert_eq!((bare.label("namespace"), bare.label("name")), (None, Some("testvm")));
    }

    #[test]
    fn a_forged_kubevirt_command_line_outside_a_pod_gets_no_labels() {
        let mut forged = launcher();
        forged[2] = "guest=prod_db".to_owned();
        let id =
            identity(&Process { args: &forged, uid: 65534, cgroup: "0::/user.slice/x.scope\n" }).unwrap();
        assert!(!id.trusted());
        assert!(id.labels().is_empty());
        assert_eq!(id.claimed_name(), Some("prod_db"));
        let plain = args(&["qemu-system-x86_64", "-name", "guest=prod_db"]);
        assert!(identity(&Process { args: &plain, uid: 0, cgroup: SYSTEMD }).is_none());
    }
}
