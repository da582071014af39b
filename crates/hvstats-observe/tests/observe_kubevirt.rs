//! A KubeVirt-shaped libvirt daemon that is not the VMM's pod's own is refused, with the reason,
//! and gives the VM neither statistics nor identity: `libvirtd` in session mode as `nobody` (as a
//! pod runs it), in PID and mount namespaces of its own, whose domain's QEMU is placed in a pod's
//! cgroup and whose socket is in that pod's libvirt volume under a kubelet root of the test's
//! own, while the daemon itself is in no pod's cgroup, or in another pod's.
//!
//! And a pod's own daemon found through its QEMU's root (`/proc/<pid>/root/run/libvirt/`), where
//! the kubelet's directory does not hold it: believed, its domain's name the VM's namespace and
//! name.
//!
//! The daemon of the VMM's own pod, trusted, is observed through the observer's unit in
//! `hvstats-cli/tests/unit_sandbox.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod observe_support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hvstats::Hypervisor;
use hvstats_guest::bios::{BiosEnd, BiosProgram};
use hvstats_observe::{ObserveOptions, Observer, ObserverEvent, Procfs, Targets};
use hvstats_testkit::{CgroupDriver, Libvirtd, PodCgroup, libvirt_volume};
use observe_support::{TempDir, kvm_available};

/// The pod the VMs are placed in, and the pod one of the daemons is in.
const VMM_POD: &str = "1b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d";
const DAEMON_POD: &str = "2c3d4e5f-6071-4b8c-9dae-1f2a3b4c5d6e";
const OTHER_VMM_POD: &str = "3d4e5f60-7182-4c9d-8ebf-2a3b4c5d6e7f";

/// Ticks `observer` until it said it refused the libvirt sources of every one of `pids` (two
/// minutes at most); why, by pid.
fn refusals_of(observer: &mut Observer, pids: &[i32]) -> BTreeMap<i32, String> {
    let t = Instant::now();
    let mut refused = BTreeMap::new();
    while !pids.iter().all(|p| refused.contains_key(p)) {
        for event in observer.tick() {
            if let ObserverEvent::SourceRefused { pid, source: "libvirt", why, .. } = event {
                refused.insert(pid, why);
            }
        }
        assert!(t.elapsed() < Duration::from_secs(120), "libvirt refusals of {pids:?}: only {refused:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    refused
}

#[test]
fn a_session_libvirt_outside_the_vmms_pod_is_refused_and_gives_no_identity() {
    if !kvm_available("a_session_libvirt_outside_the_vmms_pod_is_refused_and_gives_no_identity") {
        return;
    }
    let kubelet = TempDir::new("kubelet");
    let guest = BiosProgram { cpuid: 10, end: BiosEnd::Halt, ..BiosProgram::default() }.image().unwrap();
    // A daemon in no pod's cgroup, its VM placed in pod VMM_POD.
    let vmm_pod = PodCgroup::new(CgroupDriver::Systemd, VMM_POD).expect("a cgroup hierarchy for pods");
    let Some(outside) = Libvirtd::start_session("kv-outside", &libvirt_volume(kubelet.path(), VMM_POD), None)
    else {
        return;
    };
    let a = outside.run_kubevirt_domain("default_a", "4e5f6071-8293-4dae-9fc0-3b4c5d6e7f80", &guest);
    vmm_pod.add(a.pid);
    // A daemon in pod DAEMON_POD, its VM placed in pod OTHER_VMM_POD.
    let daemon_pod = PodCgroup::new(CgroupDriver::Systemd, DAEMON_POD).unwrap();
    let other_vmm_pod = PodCgroup::new(CgroupDriver::Systemd, OTHER_VMM_POD).unwrap();
    let volume = libvirt_volume(kubelet.path(), OTHER_VMM_POD);
    let Some(elsewhere) = Libvirtd::start_session("kv-elsewhere", &volume, Some(daemon_pod.path())) else {
        return;
    };
    let b = elsewhere.run_kubevirt_domain("default_b", "5f607182-93a4-4ebf-a0d1-4c5d6e7f8091", &guest);
    other_vmm_pod.add(b.pid);

    let tmp = TempDir::new("kv-observer");
    let hv = Hypervisor::new_published(&tmp.path().join("run")).unwrap();
    let options = ObserveOptions { kubelet_root: Some(kubelet.path().to_owned()), ..Default::default() };
    let mut observer = Observer::new(hv, Procfs::host(), Targets::Pids(vec![a.pid, b.pid]), options);
    let refused = refusals_of(&mut observer, &[a.pid, b.pid]);
    let why = &refused[&a.pid];
    assert!(why.contains("is in no pod's cgroup") && why.contains(VMM_POD), "{why}");
    let why = &refused[&b.pid];
    assert!(why.contains(&format!("is in pod {DAEMON_POD}, not the VMM's pod {OTHER_VMM_POD}")), "{why}");
    // Neither VM takes the daemon's word: their identity is the command line's in the pod's
    // cgroup, where root placed them.
    for vm in observer.vms() {
        let platform = vm.platform().expect("a KubeVirt command line in a pod's cgroup");
        assert_eq!(platform.source(), "cgroup+command-line", "{}", vm.name());
    }
    assert_eq!(observer.vms().count(), 2);
}

#[test]
fn a_pods_own_libvirt_is_reached_through_the_vmms_root_where_the_kubelets_directory_is_not_seen() {
    let test = "a_pods_own_libvirt_is_reached_through_the_vmms_root_where_the_kubelets_directory_is_not_seen";
    if !kvm_available(test) {
        return;
    }
    const POD: &str = "4e5f6071-8293-4dae-8fc0-3b4c5d6e7f81";
    let pod = PodCgroup::new(CgroupDriver::Systemd, POD).expect("a cgroup hierarchy for pods");
    // The pod's volume where the observer does not look: an empty kubelet root is given.
    let elsewhere = TempDir::new("kv-volume-elsewhere");
    let kubelet = TempDir::new("kv-empty-kubelet");
    let Some(daemon) =
        Libvirtd::start_session("kv-root", &libvirt_volume(elsewhere.path(), POD), Some(pod.path()))
    else {
        return;
    };
    let guest = BiosProgram { cpuid: 10, end: BiosEnd::Halt, ..BiosProgram::default() }.image().unwrap();
    let vmi = daemon.run_kubevirt_domain("web_vm-1", "60718293-a4b5-4c6d-8e7f-8091a2b3c4d5", &guest);

    let tmp = TempDir::new("kv-root-observer");
    let hv = Hypervisor::new_published(&tmp.path().join("run")).unwrap();
    let options = ObserveOptions { kubelet_root: Some(kubelet.path().to_owned()), ..Default::default() };
    let mut observer = Observer::new(hv, Procfs::host(), Targets::Pids(vec![vmi.pid]), options);
    let t = Instant::now();
    let identity = loop {
        let events = observer.tick();
        assert!(
            !events.iter().any(|e| matches!(e, ObserverEvent::SourceRefused { source: "libvirt", .. })),
            "{events:?}"
        );
        let platform = observer.vms().next().and_then(|v| v.platform().cloned());
        if let Some(platform) = platform.as_ref().filter(|p| p.source() == "pod-libvirt+cgroup") {
            break platform.clone();
        }
        assert!(t.elapsed() < Duration::from_secs(60), "no identity from the pod's libvirt: {platform:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!((identity.label("namespace"), identity.label("name")), (Some("web"), Some("vm-1")));
    assert_eq!(identity.label("pod_uid"), Some(POD));
    let vm = observer.vms().next().unwrap();
    let libvirt = vm.peers().into_iter().find(|(source, _)| *source == "libvirt");
    assert_eq!(libvirt, Some(("libvirt", hvstats_observe::sources::PeerState::Up)), "{:?}", vm.peers());
}
