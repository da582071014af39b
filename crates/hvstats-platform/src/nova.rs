//! OpenStack Nova's identity of an instance: the `<nova:instance>` element Nova's libvirt driver
//! keeps in the domain's metadata (nova `nova/virt/libvirt/config.py`,
//! `LibvirtConfigGuestMetaNovaInstance` and the classes it holds).
//!
//! Nova writes it in namespace [`NS_1_0`] (every release since Havana) or [`NS_1_1`] (newer
//! releases, whose `nova:flavor` also carries the flavor's `id` and which add `nova:image`):
//!
//! ```xml
//! <nova:instance xmlns:nova="http://openstack.org/xmlns/libvirt/nova/1.1">
//!   <nova:package version="27.1.0"/>
//!   <nova:name>web-1</nova:name>
//!   <nova:creationTime>2024-03-01 10:09:13</nova:creationTime>
//!   <nova:flavor name="m1.small" id="2"><nova:memory>2048</nova:memory>…</nova:flavor>
//!   <nova:owner>
//!     <nova:user uuid="…">alice</nova:user>
//!     <nova:project uuid="…">shop</nova:project>
//!   </nova:owner>
//!   <nova:root type="image" uuid="…"/>
//!   <nova:image uuid="…">…</nova:image>
//! </nova:instance>
//! ```
//!
//! The labels are those the libvirt exporters give: `instance_name`, `instance_id` (the domain's
//! UUID, which is Nova's instance UUID), `flavor_name`, `flavor_id`, `project_id`,
//! `project_name`, `user_id`, `user_name`, `root_type`, `root_id`, `image_id`.

use roxmltree::{Document, Node};

use crate::{Identity, Label, Platform, Source};

/// Nova's first metadata namespace.
pub const NS_1_0: &str = "http://openstack.org/xmlns/libvirt/nova/1.0";
/// Nova's metadata namespace since the flavor carries its id.
pub const NS_1_1: &str = "http://openstack.org/xmlns/libvirt/nova/1.1";
/// The namespaces asked for, newest first (a domain carries one).
pub const NAMESPACES: [&str; 2] = [NS_1_1, NS_1_0];

/// The longest metadata text parsed: Nova's element is under a KiB (its ports list grows with
/// the instance's interfaces).
pub const MAX_XML_BYTES: usize = 64 << 10;

/// Why a metadata text gave no identity.
#[derive(Debug, thiserror::Error)]
pub enum NovaError {
    /// It is longer than [`MAX_XML_BYTES`].
    #[error("Nova metadata of {0} bytes is longer than {MAX_XML_BYTES}")]
    TooLong(usize),
    /// It is not XML.
    #[error("Nova metadata is not XML")]
    Xml(#[from] roxmltree::Error),
    /// It holds no `instance` element in a Nova namespace.
    #[error("no <nova:instance> element in a Nova namespace")]
    NoInstance,
}

/// Nova's identity of the domain whose UUID is `domain_uuid`, from `xml`: the `<nova:instance>`
/// element (as `virDomainGetMetadata` gives it) or a whole domain XML holding it. `trusted` is
/// whether the libvirt daemon that gave it is root's (see [`crate`]).
///
/// # Errors
/// When `xml` is too long, is not XML, or holds no Nova instance element.
pub fn identity(xml: &str, domain_uuid: Option<&str>, trusted: bool) -> Result<Identity, NovaError> {
    if xml.len() > MAX_XML_BYTES {
        return Err(NovaError::TooLong(xml.len()));
    }
    let document = Document::parse(xml)?;
    // `virDomainGetMetadata` gives the element it was asked for by namespace without its
    // namespace: a root `<instance>` of none is Nova's then.
    let root = document.root_element();
    let bare = root.tag_name().name() == "instance" && root.tag_name().namespace().is_none();
    let instance = match bare {
        true => root,
        false => document
            .descendants()
            .find(|n| n.tag_name().name() == "instance" && is_nova(n))
            .ok_or(NovaError::NoInstance)?,
    };
    let mut labels = Vec::new();
    let mut push = |name, value: Option<&str>| {
        if let Some(value) = value {
            labels.push(Label { name, value: value.trim().to_owned(), source: Source::LibvirtMetadata });
        }
    };
    push("instance_name", child(instance, "name").and_then(|n| n.text()));
    push("instance_id", domain_uuid);
    let flavor = child(instance, "flavor");
    push("flavor_name", flavor.and_then(|f| f.attribute("name")));
    push("flavor_id", flavor.and_then(|f| f.attribute("id")));
    let owner = child(instance, "owner");
    let project = owner.and_then(|o| child(o, "project"));
    push("project_id", project.and_then(|p| p.attribute("uuid")));
    push("project_name", project.and_then(|p| p.text()));
    let user = owner.and_then(|o| child(o, "user"));
    push("user_id", user.and_then(|u| u.attribute("uuid")));
    push("user_name", user.and_then(|u| u.text()));
    let root = child(instance, "root");
    push("root_type", root.and_then(|r| r.attribute("type")));
    push("root_id", root.and_then(|r| r.attribute("uuid")));
    push("image_id", child(instance, "image").and_then(|i| i.attribute("uuid")));
    Ok(Identity::new(Platform::OpenStack, labels, trusted))
}

/// True when `node` is in one of Nova's namespaces.
fn is_nova(node: &Node<'_, '_>) -> bool {
    node.tag_name().namespace().is_some_and(|ns| NAMESPACES.contains(&ns))
}

/// The first child element of `node` named `name` in `node`'s namespace (Nova's, or none).
fn child<'a, 'i>(node: Node<'a, 'i>, name: &str) -> Option<Node<'a, 'i>> {
    let ns = node.tag_name().namespace();
    node.children().find(|c| c.is_element() && c.tag_name().name() == name && c.tag_name().namespace() == ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As Nova 2023.1 writes it (namespace 1.1; `virsh metadata --uri … instance` prints this).
    const NOVA_1_1: &str = r#"<instance xmlns="http://openstack.org/xmlns/libvirt/nova/1.1">
  <package version="27.1.0"/>
  <name>web-1</name>
  <creationTime>2024-03-01 10:09:13</creationTime>
  <flavor name="m1.small" id="2">
    <memory>2048</memory>
    <disk>20</disk>
    <swap>0</swap>
    <ephemeral>0</ephemeral>
    <vcpus>1</vcpus>
  </flavor>
  <owner>
    <user uuid="5f8e3c2a9b1d4e6f8a7b6c5d4e3f2a1b">alice</user>
    <project uuid="0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f">shop</project>
  </owner>
  <root type="image" uuid="3b4c5d6e-7f80-4912-a3b4-c5d6e7f80912"/>
  <image uuid="3b4c5d6e-7f80-4912-a3b4-c5d6e7f80912">
    <containerFormat>bare</containerFormat>
    <diskFormat>qcow2</diskFormat>
    <minDisk>1</minDisk>
    <minRam>0</minRam>
  </image>
  <ports>
    <port uuid="9a8b7c6d-5e4f-4321-8a9b-7c6d5e4f3210">
      <ip type="fixed" address="10.0.0.12" ipVersion="4"/>
    </port>
  </ports>
</instance>"#;

    /// A domain XML as older Nova writes it (namespace 1.0, prefixed, no flavor id).
    const DOMAIN_1_0: &str = r#"<domain type='kvm' id='23'>
  <name>instance-0000002a</name>
  <uuid>629b29b9-b0fb-4766-b27d-f4a686d5cbda</uuid>
  <metadata>
    <nova:instance xmlns:nova="http://openstack.org/xmlns/libvirt/nova/1.0">
      <nova:package version="14.0.0"/>
      <nova:name>db &amp; cache</nova:name>
      <nova:creationTime>2017-04-29 06:01:09</nova:creationTime>
      <nova:flavor name="t8.16medium">
        <nova:memory>16384</nova:memory>
        <nova:vcpus>8</nova:vcpus>
      </nova:flavor>
      <nova:owner>
        <nova:user uuid="b1">bob</nova:user>
        <nova:project uuid="p1">admin</nova:project>
      </nova:owner>
      <nova:root type="image" uuid="i1"/>
    </nova:instance>
    <other:thing xmlns:other="urn:x"><other:name>not nova</other:name></other:thing>
  </metadata>
</domain>"#;

    #[test]
    fn nova_1_1_metadata_gives_the_exporters_labels() {
        let id = identity(NOVA_1_1, Some("629b29b9-b0fb-4766-b27d-f4a686d5cbda"), true).unwrap();
        assert_eq!(id.platform(), Platform::OpenStack);
        let get = |n| id.label(n);
        assert_eq!(get("instance_name"), Some("web-1"));
        assert_eq!(get("instance_id"), Some("629b29b9-b0fb-4766-b27d-f4a686d5cbda"));
        assert_eq!(get("flavor_name"), Some("m1.small"));
        assert_eq!(get("flavor_id"), Some("2"));
        assert_eq!(get("project_id"), Some("0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f"));
        assert_eq!(get("project_name"), Some("shop"));
        assert_eq!(get("user_id"), Some("5f8e3c2a9b1d4e6f8a7b6c5d4e3f2a1b"));
        assert_eq!(get("user_name"), Some("alice"));
        assert_eq!(get("root_type"), Some("image"));
        assert_eq!(get("image_id"), Some("3b4c5d6e-7f80-4912-a3b4-c5d6e7f80912"));
        assert_eq!(id.source(), "libvirt-metadata");
    }

    #[test]
    fn nova_1_0_in_a_whole_domain_xml_is_read_too() {
        let id = identity(DOMAIN_1_0, None, true).unwrap();
        assert_eq!(id.label("instance_name"), Some("db & cache"));
        assert_eq!(id.label("flavor_name"), Some("t8.16medium"));
        assert_eq!(id.label("flavor_id"), None, "1.0 has no flavor id");
        assert_eq!(id.label("project_name"), Some("admin"));
        assert_eq!(id.label("instance_id"), None);
    }

    #[test]
    fn the_element_virdomaingetmetadata_gives_has_no_namespace_and_is_novas() {
        // `virsh metadata DOMAIN --uri …/nova/1.0` prints it so.
        let bare = "<instance>\n  <package version=\"27.1.0\"/>\n  <name>web-1</name>\n  \
            <flavor name=\"m1.small\"><memory>2048</memory></flavor>\n  <owner>\n    \
            <project uuid=\"p1\">shop</project>\n  </owner>\n</instance>\n";
        let id = identity(bare, None, true).unwrap();
        assert_eq!(id.label("instance_name"), Some("web-1"));
        assert_eq!(id.label("flavor_name"), Some("m1.small"));
        assert_eq!(id.label("project_name"), Some("shop"));
    }

    #[test]
    fn what_is_not_nova_metadata_is_an_error() {
        assert!(matches!(identity("<domain><instance/></domain>", None, true), Err(NovaError::NoInstance)));
        assert!(matches!(identity("<instance", None, true), Err(NovaError::Xml(_))));
        let huge = format!("<a>{}</a>", "x".repeat(MAX_XML_BYTES));
        assert!(matches!(identity(&huge, None, true), Err(NovaError::TooLong(_))));
        // A billion laughs is refused by the parser's entity limits, not expanded.
        let laughs = r#"<!DOCTYPE l [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">
<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;"><!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;">]>
<instance xmlns="http://openstack.org/xmlns/libvirt/nova/1.0"><name>&d;&d;&d;&d;&d;&d;</name></instance>"#;
        if let Ok(id) = identity(laughs, None, true) {
            assert!(id.label("instance_name").is_some_and(|n| n.len() <= crate::MAX_VALUE_BYTES));
        }
    }

    #[test]
    fn metadata_from_a_daemon_not_trusted_gives_no_labels() {
        let id = identity(NOVA_1_1, Some("629b29b9-b0fb-4766-b27d-f4a686d5cbda"), false).unwrap();
        assert!(id.labels().is_empty());
    }
}
