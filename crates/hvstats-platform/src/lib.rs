//! Who a VM is on the platform that runs it, read from what the platform writes: OpenStack
//! Nova's libvirt metadata ([`nova`]), Proxmox VE's command line and `/etc/pve` ([`proxmox`]),
//! KubeVirt's command line and its pod's cgroup ([`kubevirt`]), and the names Kata, Cloud
//! Hypervisor and Firecracker put on their command lines ([`microvm`]); and KubeVirt's identity
//! from the domain its pod's own libvirt runs ([`kubevirt::from_pod_daemon`]).
//!
//! The readers are pure: they take text (a metadata element, a command line, a cgroup file, a
//! configuration file) and the facts about where it came from (who runs the VMM, who owns the
//! file), and give one [`Identity`]. Reading `/proc` and asking libvirt is the observer's.
//!
//! Nothing here takes a VMM at its word. A command line is written by whoever starts the
//! process: an unprivileged user's VMM can claim `-name guest=prod_db` or `-id 100`. An identity
//! is [`trusted`](Identity::trusted) only when what makes it the platform's comes from something
//! the VMM cannot choose: a root daemon's metadata (libvirt), a root-owned file nobody else may
//! write (`/etc/pve`), the cgroup a root kubelet placed the process in, or the command line of a
//! VMM root started. An identity that is not trusted gives no platform labels
//! ([`Identity::labels`] is empty then): only its [`claimed_name`](Identity::claimed_name).

pub mod kubevirt;
pub mod microvm;
pub mod nova;
pub mod proxmox;
pub mod shown;

/// The longest label value kept, in bytes: values are others' text, and a label is on every
/// scrape.
pub const MAX_VALUE_BYTES: usize = 128;

/// How often a VM's platform identity is read again: a Nova resize, a Proxmox tag, are seen
/// within it.
pub const REREAD_PERIOD: std::time::Duration = std::time::Duration::from_secs(60);

/// The platform an identity is read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Platform {
    /// OpenStack Nova (libvirt's `<nova:instance>` metadata).
    OpenStack,
    /// KubeVirt (a `virt-launcher` pod's QEMU).
    KubeVirt,
    /// Proxmox VE (`qm`'s `kvm`).
    Proxmox,
    /// Kata Containers (a sandbox's VMM).
    Kata,
    /// Cloud Hypervisor on its own.
    CloudHypervisor,
    /// Firecracker on its own.
    Firecracker,
}

impl Platform {
    /// The `platform` label's value.
    pub const fn name(self) -> &'static str {
        match self {
            Platform::OpenStack => "openstack",
            Platform::KubeVirt => "kubevirt",
            Platform::Proxmox => "proxmox",
            Platform::Kata => "kata",
            Platform::CloudHypervisor => "cloud-hypervisor",
            Platform::Firecracker => "firecracker",
        }
    }
}

/// What said a label's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// The libvirt daemon's domain metadata (Nova's element), or the domain's UUID it keeps.
    LibvirtMetadata,
    /// The domain a KubeVirt pod's own libvirt daemon runs in the VMM (its name).
    PodLibvirt,
    /// A Proxmox VE configuration file (`/etc/pve/qemu-server/<vmid>.conf`).
    PveConfig,
    /// The VMM process's cgroup path (`/proc/<pid>/cgroup`).
    Cgroup,
    /// The VMM's command line.
    CommandLine,
}

impl Source {
    /// The name said in `identity_source`.
    pub const fn name(self) -> &'static str {
        match self {
            Source::LibvirtMetadata => "libvirt-metadata",
            Source::PodLibvirt => "pod-libvirt",
            Source::PveConfig => "pve-config",
            Source::Cgroup => "cgroup",
            Source::CommandLine => "command-line",
        }
    }
}

/// One label of a platform identity: its name, its value (bounded, see [`bounded`]), and what
/// said it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    /// The label's name, as the platform's users join on it (`project_name`, `vmid`).
    pub name: &'static str,
    /// Its value.
    pub value: String,
    /// What said it.
    pub source: Source,
}

/// A VM's identity on its platform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    platform: Platform,
    labels: Vec<Label>,
    claimed_name: Option<String>,
    trusted: bool,
}

impl Identity {
    /// An identity of `platform`; `trusted` when what makes it the platform's comes from
    /// something the VMM cannot choose. Empty values are left out, others are [`bounded`].
    pub fn new(platform: Platform, labels: Vec<Label>, trusted: bool) -> Self {
        let labels: Vec<Label> = labels
            .into_iter()
            .filter(|l| !l.value.is_empty())
            .map(|l| Label { value: bounded(&l.value), ..l })
            .collect();
        Self { platform, labels, claimed_name: None, trusted }
    }

    /// The same identity, with the name the VMM's command line gives its VM.
    pub fn with_claimed_name(mut self, name: Option<String>) -> Self {
        self.claimed_name = name.filter(|n| !n.is_empty()).map(|n| bounded(&n));
        self
    }

    /// The platform.
    pub fn platform(&self) -> Platform {
        self.platform
    }

    /// True when the identity is the platform's word, not only the VMM's.
    pub fn trusted(&self) -> bool {
        self.trusted
    }

    /// The platform's labels: none when the identity is not trusted.
    pub fn labels(&self) -> &[Label] {
        if self.trusted { &self.labels } else { &[] }
    }

    /// The value of label `name`, when trusted and present.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels().iter().find(|l| l.name == name).map(|l| l.value.as_str())
    }

    /// The name the VMM gives its VM on its command line (Kata's sandbox id, Cloud Hypervisor's
    /// API socket's name, Firecracker's `--id`, KubeVirt's `-name`), trusted or not: a name for
    /// the VM when it has no other, never a platform label.
    pub fn claimed_name(&self) -> Option<&str> {
        self.claimed_name.as_deref()
    }

    /// What said the identity, for `identity_source`: the distinct sources of its labels in a
    /// fixed order joined by `+` (`cgroup+command-line`); `command-line` for an identity that is
    /// not trusted (only its claimed name is shown).
    pub fn source(&self) -> String {
        let mut sources: Vec<Source> = self.labels().iter().map(|l| l.source).collect();
        sources.sort();
        sources.dedup();
        if sources.is_empty() {
            return Source::CommandLine.name().to_owned();
        }
        sources.iter().map(|s| s.name()).collect::<Vec<_>>().join("+")
    }
}

/// `value` fit for a label: control characters dropped, and cut (at a character boundary) to
/// [`MAX_VALUE_BYTES`]. Escaping for a format is the encoder's.
pub fn bounded(value: &str) -> String {
    let mut out = String::new();
    for c in value.chars().filter(|c| !c.is_control()) {
        if out.len() + c.len_utf8() > MAX_VALUE_BYTES {
            break;
        }
        out.push(c);
    }
    out
}

/// What the observer knows of a VMM process, for the readers that read processes.
#[derive(Clone, Copy, Debug)]
pub struct Process<'a> {
    /// Its command line, the program first.
    pub args: &'a [String],
    /// The user it runs as (its `/proc/<pid>` owner).
    pub uid: u32,
    /// Its `/proc/<pid>/cgroup` text (empty when unknown).
    pub cgroup: &'a str,
}

impl Process<'_> {
    /// True when root started it: its command line is root's word.
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// The value of `option` (`-o V`, `--o V`, `--o=V`): the first one given.
    pub(crate) fn option(&self, option: &str) -> Option<&str> {
        let mut it = self.args.iter().skip(1);
        while let Some(a) = it.next() {
            if a == option {
                return it.next().map(String::as_str);
            }
            if let Some(v) = a.strip_prefix(option).and_then(|r| r.strip_prefix('=')) {
                return Some(v);
            }
        }
        None
    }

    /// The program's name, without its directory.
    pub(crate) fn program(&self) -> &str {
        let first = self.args.first().map_or("", String::as_str);
        first.rsplit('/').next().unwrap_or(first)
    }
}

/// The platform identity of the VMM `process`, from what its command line, its cgroup and (for
/// Proxmox) `pve_config` say: KubeVirt, Proxmox, then the microVMs'; `None` when it looks like
/// none of them. `pve_config` reads a VM's configuration file where the host has one.
pub fn of_process(
    process: &Process<'_>,
    pve_config: impl FnOnce(u32) -> Option<proxmox::Config>,
) -> Option<Identity> {
    kubevirt::identity(process)
        .or_else(|| proxmox::identity(process, pve_config))
        .or_else(|| microvm::identity(process))
}

#[cfg(test)]
pub(crate) fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| (*s).to_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_bounded_and_lose_control_characters() {
        assert_eq!(bounded("web\n1\u{7}"), "web1");
        let long = "é".repeat(100);
        let cut = bounded(&long);
        assert!(cut.len() <= MAX_VALUE_BYTES && cut.len() == 128, "{}", cut.len());
        assert_eq!(bounded(&"x".repeat(500)).len(), MAX_VALUE_BYTES);
    }

    #[test]
    fn an_untrusted_identity_shows_only_its_claimed_name() {
        let label = |name, value: &str| Label { name, value: value.to_owned(), source: Source::CommandLine };
        let forged = Identity::new(Platform::KubeVirt, vec![label("name", "db")], false)
            .with_claimed_name(Some("prod_db".to_owned()));
        assert!(forged.labels().is_empty());
        assert_eq!(forged.label("name"), None);
        assert_eq!(forged.claimed_name(), Some("prod_db"));
        assert_eq!(forged.source(), "command-line");
        let cgroup = Label { name: "pod_uid", value: "u".to_owned(), source: Source::Cgroup };
        let real = Identity::new(Platform::KubeVirt, vec![label("name", "db"), cgroup, label("x", "")], true);
        assert_eq!(real.labels().len(), 2, "an empty value is left out");
        assert_eq!(real.source(), "cgroup+command-line");
    }
}
