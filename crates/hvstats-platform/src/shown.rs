//! What a surface shows of VMs' identities, as the observer writes it for them
//! ([`hvstats::platform_file`](../../hvstats/platform_file/index.html)) and they read it back:
//! one line per fact, `<partition id>\t<key>\t<value>`, where the key is `platform`, `source`,
//! or `label.<name>`. Only trusted identities are written. A reader believes nothing beyond the
//! shape: a label name outside [`LABEL_NAMES`], a value with a control character or longer than
//! [`MAX_VALUE_BYTES`], or a partition past [`MAX_VMS`] is dropped.

use std::collections::BTreeMap;

use crate::{Identity, MAX_VALUE_BYTES, bounded};

/// Every label a platform identity may carry: what a reader accepts, so that no line can name
/// a label of the surfaces' own (`vm`, `uuid`) or one that is not a label name at all.
pub const LABEL_NAMES: &[&str] = &[
    "instance_name",
    "instance_id",
    "flavor_name",
    "flavor_id",
    "project_id",
    "project_name",
    "user_id",
    "user_name",
    "root_type",
    "root_id",
    "image_id",
    "namespace",
    "name",
    "pod_uid",
    "vmid",
    "id",
    "tags",
    "sandbox_id",
];

/// The most VMs read from one text.
pub const MAX_VMS: usize = 16_384;

/// A VM's platform identity as a surface shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shown {
    /// The `platform` label's value.
    pub platform: String,
    /// The `identity_source` label's value ([`Identity::source`]).
    pub source: String,
    /// The platform's labels, in the identity's order.
    pub labels: Vec<(&'static str, String)>,
}

/// The text of `vms` (partition id, identity): the trusted identities' lines.
pub fn encode<'a>(vms: impl IntoIterator<Item = (u64, &'a Identity)>) -> String {
    let mut text = String::new();
    for (partition, identity) in vms.into_iter().filter(|(_, i)| i.trusted() && !i.labels().is_empty()) {
        let mut line = |key: &str, value: &str| text.push_str(&format!("{partition}\t{key}\t{value}\n"));
        line("platform", identity.platform().name());
        line("source", &identity.source());
        for label in identity.labels() {
            line(&format!("label.{}", label.name), &label.value);
        }
    }
    text
}

/// The identities a text gives, by partition id (see the module's text for what is dropped).
pub fn decode(text: &str) -> BTreeMap<u64, Shown> {
    let mut vms: BTreeMap<u64, Shown> = BTreeMap::new();
    for line in text.lines() {
        let mut fields = line.splitn(3, '\t');
        let (Some(partition), Some(key), Some(value)) = (fields.next(), fields.next(), fields.next()) else {
            continue;
        };
        let Ok(partition) = partition.parse::<u64>() else { continue };
        if value.len() > MAX_VALUE_BYTES || bounded(value) != value {
            continue;
        }
        if !vms.contains_key(&partition) && vms.len() >= MAX_VMS {
            continue;
        }
        let vm = vms.entry(partition).or_default();
        match key {
            "platform" => vm.platform = value.to_owned(),
            "source" => vm.source = value.to_owned(),
            _ => {
                let name = key.strip_prefix("label.").and_then(|n| LABEL_NAMES.iter().find(|&&l| l == n));
                if let Some(name) = name.filter(|n| vm.labels.iter().all(|(l, _)| l != *n)) {
                    vm.labels.push((name, value.to_owned()));
                }
            }
        }
    }
    vms.retain(|_, vm| !vm.platform.is_empty());
    vms
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Label, Platform, Source};

    #[test]
    fn trusted_identities_round_trip_and_others_are_not_written() {
        let label = |name, value: &str| Label { name, value: value.to_owned(), source: Source::CommandLine };
        let proxmox =
            Identity::new(Platform::Proxmox, vec![label("vmid", "100"), label("id", "qemu/100")], true);
        let forged = Identity::new(Platform::Proxmox, vec![label("vmid", "100")], false);
        let text = encode([(3, &proxmox), (4, &forged)]);
        let vms = decode(&text);
        assert_eq!(vms.len(), 1);
        let vm = &vms[&3];
        assert_eq!((vm.platform.as_str(), vm.source.as_str()), ("proxmox", "command-line"));
        assert_eq!(vm.labels, [("vmid", "100".to_owned()), ("id", "qemu/100".to_owned())]);
    }

    #[test]
    fn a_text_names_no_label_of_the_surfaces_own_and_no_oversized_value() {
        let long = "x".repeat(MAX_VALUE_BYTES + 1);
        let text = format!(
            "1\tplatform\tkubevirt\n1\tlabel.vm\tspoof\n1\tlabel.name\tdb\n1\tlabel.name\tagain\n\
             1\tlabel.tags\t{long}\n1\tlabel.namespace\ta\u{1b}[31m\nx\tplatform\ty\n2\tlabel.name\torphan\n"
        );
        let vms = decode(&text);
        assert_eq!(vms.len(), 1, "a partition without a platform is dropped");
        assert_eq!(vms[&1].labels, [("name", "db".to_owned())]);
    }
}
