//! OpenStack Nova's identity of a libvirt domain, read from its metadata as Nova's libvirt driver
//! writes it (nova `nova/virt/libvirt/config.py`, `LibvirtConfigGuestMetaNovaInstance`), over the
//! observer's read-only session with a libvirtd of the test's own, and read again after the
//! metadata changes (a resize) within the observer's period of a minute.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod observe_support;

use std::time::{Duration, Instant};

use hvstats::Hypervisor;
use hvstats_guest::bios::{BiosEnd, BiosProgram};
use hvstats_observe::{ObserveOptions, Observer, Procfs, Targets};
use hvstats_testkit::Libvirtd;
use observe_support::kvm_available;

/// The `<nova:instance>` element as Nova writes it in namespace `version`, with flavor `flavor`
/// (its id only in 1.1, as Nova gives it there) and, in 1.1, the image.
fn nova_instance(version: &str, flavor: &str) -> String {
    let (flavor_id, image) = match version {
        "1.1" => (
            " id=\"7\"",
            "<nova:image uuid=\"3b4c5d6e-7f80-4912-a3b4-c5d6e7f80912\"><nova:containerFormat>bare</nova:containerFormat><nova:diskFormat>qcow2</nova:diskFormat><nova:minDisk>1</nova:minDisk><nova:minRam>0</nova:minRam></nova:image>",
        ),
        _ => ("", ""),
    };
    format!(
        "<nova:instance xmlns:nova=\"http://openstack.org/xmlns/libvirt/nova/{version}\">\
         <nova:package version=\"27.1.0\"/><nova:name>web-1</nova:name>\
         <nova:creationTime>2024-03-01 10:09:13</nova:creationTime>\
         <nova:flavor name=\"{flavor}\"{flavor_id}><nova:memory>2048</nova:memory><nova:disk>20</nova:disk>\
         <nova:swap>0</nova:swap><nova:ephemeral>0</nova:ephemeral><nova:vcpus>1</nova:vcpus></nova:flavor>\
         <nova:owner><nova:user uuid=\"5f8e3c2a9b1d4e6f8a7b6c5d4e3f2a1b\">alice</nova:user>\
         <nova:project uuid=\"0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f\">shop</nova:project></nova:owner>\
         <nova:root type=\"image\" uuid=\"3b4c5d6e-7f80-4912-a3b4-c5d6e7f80912\"/>{image}</nova:instance>"
    )
}

/// Sets the domain's Nova metadata of `version`, live (`virDomainSetMetadata`): libvirt keeps it
/// in the domain XML as Nova defines it there, `<nova:instance xmlns:nova=…>`. libvirt puts the
/// element in the namespace itself, so it is given without one.
fn set_metadata(libvirtd: &Libvirtd, name: &str, version: &str, flavor: &str) {
    let uri = format!("http://openstack.org/xmlns/libvirt/nova/{version}");
    let xml =
        nova_instance(version, flavor).replace(&format!(" xmlns:nova=\"{uri}\""), "").replace("nova:", "");
    libvirtd.virsh(&["metadata", name, "--uri", &uri, "--key", "nova", "--set", &xml, "--live"]);
}

/// Ticks `observer` until its VM's platform label `label` reads `value` (`limit` at most).
fn await_label(observer: &mut Observer, label: &str, value: &str, limit: Duration) {
    let t = Instant::now();
    loop {
        observer.tick();
        let vm = observer.vms().next();
        let now = vm.and_then(|v| v.platform()).and_then(|p| p.label(label)).map(str::to_owned);
        if now.as_deref() == Some(value) {
            return;
        }
        let peers = vm.map(|v| format!("{:?}", v.peers()));
        assert!(t.elapsed() < limit, "{label} is {now:?}, not {value:?}, after {limit:?}: {peers:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn nova_metadata_names_the_instance_and_a_resize_is_seen_within_a_minute() {
    if !kvm_available("nova_metadata_names_the_instance_and_a_resize_is_seen_within_a_minute") {
        return;
    }
    let Some(libvirtd) = Libvirtd::start("libvirt-nova") else { return };
    let program = BiosProgram { cpuid: 5, out: 5, end: BiosEnd::Halt, ..BiosProgram::default() };
    let name = format!("instance-{:08x}", std::process::id());
    let uuid = "629b29b9-b0fb-4766-b27d-f4a686d5cbda";
    let domain = libvirtd.run_domain(&name, uuid, &program.image().unwrap());
    // An instance Nova created before 1.1: namespace 1.0.
    set_metadata(&libvirtd, &name, "1.0", "m1.small");

    let tmp = observe_support::TempDir::new("libvirt-nova-observer");
    let hv = Hypervisor::new_published(&tmp.path().join("run")).unwrap();
    let options = ObserveOptions { libvirt: Some(libvirtd.socket_ro()), ..Default::default() };
    let mut observer = Observer::new(hv, Procfs::host(), Targets::Pids(vec![domain.pid]), options);
    await_label(&mut observer, "flavor_name", "m1.small", Duration::from_secs(30));
    let vm = observer.vms().next().unwrap();
    let platform = vm.platform().unwrap();
    assert_eq!(platform.platform(), hvstats_platform::Platform::OpenStack);
    assert_eq!(platform.source(), "libvirt-metadata");
    for (label, value) in [
        ("instance_name", "web-1"),
        ("instance_id", uuid),
        ("project_id", "0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f"),
        ("project_name", "shop"),
        ("user_id", "5f8e3c2a9b1d4e6f8a7b6c5d4e3f2a1b"),
        ("user_name", "alice"),
        ("root_type", "image"),
    ] {
        assert_eq!(platform.label(label), Some(value), "{label}");
    }
    assert_eq!(platform.label("flavor_id"), None, "1.0 has no flavor id");
    // The platforms file beside the instance says so, and is not made again while nothing
    // changed.
    let run = tmp.path().join("run");
    let file = || platform_file(&run);
    let (text, inode) = file();
    assert!(text.contains("\tlabel.flavor_name\tm1.small\n"), "{text}");
    // Checked after each tick: a file written anew is made while the old one is still there,
    // so its inode is another.
    for _ in 0..2 {
        observer.tick();
        assert_eq!(file(), (text.clone(), inode), "written again though nothing changed");
    }

    // A resize by a Nova that writes 1.1: the new flavor, its id and the image, within a minute
    // (the observer asks again once a minute; the bound leaves room for a loaded host).
    set_metadata(&libvirtd, &name, "1.1", "m1.large");
    await_label(&mut observer, "flavor_name", "m1.large", Duration::from_secs(90));
    let platform = observer.vms().next().unwrap().platform().unwrap().clone();
    assert_eq!(platform.label("flavor_id"), Some("7"));
    assert_eq!(platform.label("image_id"), Some("3b4c5d6e-7f80-4912-a3b4-c5d6e7f80912"));
    let (text, _) = file();
    assert!(text.contains("\tlabel.flavor_name\tm1.large\n") && !text.contains("m1.small"), "{text}");
}

/// The text of the one platforms file under runtime directory `run`, and its inode (another
/// each time it is written: it is renamed into place).
fn platform_file(run: &std::path::Path) -> (String, u64) {
    use std::os::unix::fs::MetadataExt;
    let files: Vec<_> = std::fs::read_dir(run.join("instances"))
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "platform"))
        .collect();
    let [file] = files.as_slice() else { panic!("not one platforms file: {files:?}") };
    (std::fs::read_to_string(file).unwrap(), std::fs::metadata(file).unwrap().ino())
}
