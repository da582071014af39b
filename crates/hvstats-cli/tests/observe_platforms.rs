//! Platform identities on `hvstats_vm_info`, from stand-in VMMs (this test binary run again,
//! holding a real KVM VM under a platform's command line): Proxmox VE's `kvm -id`, a KubeVirt
//! launcher's QEMU in a pod's cgroup and a mount namespace of its own, a Cloud Hypervisor named
//! by its API socket; and the same
//! command lines forged by a `nobody` process, which get no platform's labels.
//!
//! A Proxmox VM's configuration under `/etc/pve/qemu-server/` as the observer sees it (an overlay on
//! its own `/etc`, in a mount namespace of its own): root's file names and tags the VM; one
//! another user may write, or a link, does not.
//!
//! And Proxmox's QMP socket kept Proxmox's while observed: a real QEMU started as Proxmox starts
//! it (`/usr/bin/kvm`, `-name`, and Proxmox's own QMP chardev at a `qemu-server/<vmid>.qmp`
//! path; without `-id`, which only Proxmox's build of QEMU takes), and a client that connects
//! for each command as `qm` does, answered within one refresh each time the observer held the
//! session, which the observer then takes back.
//!
//! They need /dev/kvm and root (a host without KVM prints "skipped"; `HVSTATS_REQUIRE_KVM=1`
//! makes that a failure).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    FakeVmm, KilledOnDrop, Running, TempDir, as_nobody, kvm_available, partition, snapshot_until, source_up,
    total, vm_info,
};
use hvstats_testkit::{CgroupDriver, PodCgroup};
use hvstats_vmm::unix_sockets::{PathUse, UnixSockets};

/// Not a test: the body of the stand-in VMMs the tests below start (`FakeVmm`).
#[test]
#[ignore = "run by the tests below as a stand-in VMM"]
fn fake_vmm() {
    common::fake_vmm_body();
}

/// The sandbox id of the Kata stand-in.
const KATA_SANDBOX: &str = "3f1c0a9e7b2d4c6e8a0b1c2d3e4f5a6b";

/// The pod UID the KubeVirt stand-in's cgroup names.
const POD_UID: &str = "6f2b1c3e-4d5a-4b6c-8d7e-9f0a1b2c3d4e";

/// A stand-in VMM whose program is `program` (its `argv[0]`), run as `nobody` when `nobody`.
fn vmm(program: &'static str, args: &[&str], nobody: bool) -> FakeVmm {
    FakeVmm::spawn_with(args, "CPU 0/KVM", |command| {
        command.arg0(program);
        if nobody {
            as_nobody(command);
        }
    })
}

/// As [`vmm`] run by root, its vCPU thread named `thread` and running a guest that leaves it by
/// an `out` every 10 ms (the KVM descriptors a microVM VMM holds, and exits to count).
fn running_vmm(program: &'static str, args: &[&str], thread: &str) -> FakeVmm {
    FakeVmm::spawn_with(args, thread, |command| {
        command.arg0(program).env(common::FAKE_VMM_PACED, "1");
    })
}

/// As [`vmm`] run by root, in a mount namespace of its own, as a pod's QEMU is.
fn vmm_in_own_mounts(program: &'static str, args: &[&str]) -> FakeVmm {
    FakeVmm::spawn_with(args, "CPU 0/KVM", |command| {
        command.arg0(program);
        // SAFETY: unshare is async-signal-safe and touches no memory of the parent's.
        unsafe {
            command.pre_exec(|| match libc::unshare(libc::CLONE_NEWNS) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            });
        }
    })
}

#[test]
fn platform_vms_get_their_platforms_labels_and_forged_command_lines_do_not() {
    if !kvm_available("platform_vms_get_their_platforms_labels_and_forged_command_lines_do_not") {
        return;
    }
    let tmp = TempDir::new("observe-platforms");
    let proxmox = ["-id", "100", "-name", "web1,debug-threads=on", "-no-shutdown"];
    let kubevirt = [
        "-name",
        "guest=default_testvm,debug-threads=on",
        "-smbios",
        "type=1,manufacturer=KubeVirt,product=None,family=KubeVirt",
    ];
    let pve = vmm("/usr/bin/kvm", &proxmox, false);
    let forged_pve = vmm("/usr/bin/kvm", &["-id", "101", "-name", "prod_db"], true);
    let launcher = vmm_in_own_mounts("/usr/libexec/qemu-kvm", &kubevirt);
    let mounts = |pid: i32| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap();
    assert_ne!(mounts(launcher.pid()), mounts(std::process::id() as i32), "the launcher's own mounts");
    let pod =
        PodCgroup::new(CgroupDriver::Cgroupfs, POD_UID).expect("a cgroup hierarchy to place the pod in");
    pod.add(launcher.pid());
    let forged_kubevirt =
        vmm("qemu-system-x86_64", &["-name", "guest=prod_db", kubevirt[2], kubevirt[3]], true);
    // The microVM VMMs as each names its vCPU threads: Cloud Hypervisor `vcpu0`, Firecracker
    // `fc_vcpu 0`; and Kata's Cloud Hypervisor, its API socket in the sandbox's directory.
    let ch = running_vmm("cloud-hypervisor", &["--api-socket", "path=/run/ch/web-ch.sock"], "vcpu0");
    let fc = running_vmm("firecracker", &["--api-sock", "/run/fc/fc.sock", "--id", "fc-vm-1"], "fc_vcpu 0");
    let kata_api = format!("path=/run/vc/vm/{KATA_SANDBOX}/clh-api.sock");
    let kata = running_vmm("cloud-hypervisor", &["--api-socket", &kata_api], "vcpu0");
    let pids = [&pve, &forged_pve, &launcher, &forged_kubevirt, &ch, &fc, &kata].map(|v| v.pid().to_string());
    let mut args = vec!["observe", "--interval", "0.2"];
    for pid in &pids {
        args.extend(["--pid", pid]);
    }
    let _observer = Running::start(&args, tmp.path());

    let line = vm_info(tmp.path(), pve.pid(), |l| l.contains("platform="));
    for label in ["vm=\"web1\"", "vmm=\"qemu\"", "platform=\"proxmox\"", "vmid=\"100\"", "id=\"qemu/100\""] {
        assert!(line.contains(label), "{label} not in {line}");
    }
    assert!(line.contains("identity_source=\"command-line\""), "{line}");
    let line = vm_info(tmp.path(), launcher.pid(), |l| l.contains("platform="));
    for label in [
        "platform=\"kubevirt\"",
        "identity_source=\"cgroup+command-line\"",
        "namespace=\"default\"",
        "name=\"testvm\"",
        &format!("pod_uid=\"{POD_UID}\""),
    ] {
        assert!(line.contains(label), "{label} not in {line}");
    }
    let line = vm_info(tmp.path(), ch.pid(), |_| true);
    assert!(line.contains("vm=\"web-ch\"") && !line.contains("platform="), "{line}");
    let line = vm_info(tmp.path(), fc.pid(), |_| true);
    assert!(line.contains("vm=\"fc-vm-1\"") && line.contains("vmm=\"firecracker\""), "{line}");
    let line = vm_info(tmp.path(), kata.pid(), |l| l.contains("platform="));
    for label in
        [&format!("vm=\"{KATA_SANDBOX}\""), "platform=\"kata\"", &format!("sandbox_id=\"{KATA_SANDBOX}\"")]
    {
        assert!(line.contains(label), "{label} not in {line}");
    }
    // Each microVM's guest is counted as any KVM VM's: its port writes, by the tracepoints.
    for name in ["web-ch", "fc-vm-1", KATA_SANDBOX] {
        snapshot_until(tmp.path(), name, |s| {
            partition(s, name)
                .and_then(|p| p["vps"][0]["counters"][total("IO instructions/sec")].as_u64())
                .is_some_and(|n| n > 0)
        });
    }
    // The forged ones are observed, named as they name themselves, and get no platform.
    for (forged, name) in [(&forged_pve, "prod_db"), (&forged_kubevirt, "prod_db#2")] {
        let line = vm_info(tmp.path(), forged.pid(), |_| true);
        assert!(
            !line.contains("platform=") && !line.contains("vmid=") && !line.contains("namespace="),
            "{line}"
        );
        assert!(line.contains("vm=\"prod_db") || line.contains(&format!("vm=\"{name}\"")), "{line}");
    }
    // snapshot --json says the same of each partition.
    let doc = common::snapshot_json(tmp.path());
    let partitions: Vec<&serde_json::Value> = doc["instances"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|i| i["partitions"].as_array().unwrap())
        .collect();
    let of = |pid: i32| *partitions.iter().find(|p| p["vmm"]["pid"] == pid).unwrap();
    let platform = &of(pve.pid())["platform"];
    assert_eq!(platform["platform"], "proxmox", "{platform}");
    assert_eq!(platform["labels"]["id"], "qemu/100", "{platform}");
    assert_eq!(of(launcher.pid())["platform"]["labels"]["pod_uid"], POD_UID);
    assert!(of(forged_kubevirt.pid()).get("platform").is_none());
    drop(pod);
}

/// The VM id of the Proxmox-shaped QEMU below.
const VMID: &str = "100";

/// A real QEMU under KVM started as Proxmox VE starts one: the program `/usr/bin/kvm`, `-name
/// <name>,debug-threads=on`, `-no-shutdown`, and Proxmox's own QMP socket
/// (`-chardev socket,id=qmp,path=<dir>/qemu-server/<vmid>.qmp,server=on,wait=off -mon
/// chardev=qmp,mode=control`); a tiny guest (no disk, SeaBIOS alone). Upstream QEMU refuses
/// Proxmox's `-id <vmid>`, so it is left out. `None` where `/usr/bin/kvm` cannot be started.
fn proxmox_kvm(dir: &Path, name: &str, test: &str) -> Option<(KilledOnDrop, PathBuf)> {
    let qmp = dir.join("qemu-server").join(format!("{VMID}.qmp"));
    std::fs::create_dir_all(qmp.parent().unwrap()).unwrap();
    let qemu = hvstats_testkit::spawn_qemu(
        Command::new("/usr/bin/kvm")
            .args(["-accel", "kvm", "-display", "none", "-nodefaults", "-m", "32", "-no-shutdown"])
            .args(["-name", &format!("{name},debug-threads=on"), "-chardev"])
            .arg(format!("socket,id=qmp,path={},server=on,wait=off", qmp.display()))
            .args(["-mon", "chardev=qmp,mode=control"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        test,
    )?;
    let qemu = KilledOnDrop(qemu);
    hvstats_testkit::wait_for_kvm_vcpus(qemu.0.id() as i32, 1, Duration::from_secs(30));
    Some((qemu, qmp))
}

/// One command as `qm` sends it: a fresh connection to `qmp`, the greeting read,
/// `qmp_capabilities`, then `query-status`, whose answer is returned (events skipped), closed.
fn qm_query_status(qmp: &Path) -> serde_json::Value {
    let stream = UnixStream::connect(qmp).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut lines = BufReader::new(stream).lines();
    let mut next = move || -> serde_json::Value {
        loop {
            let line = lines.next().expect("QEMU closed the QMP connection").expect("a QMP line in 30 s");
            let message: serde_json::Value = serde_json::from_str(&line).unwrap();
            if message.get("event").is_none() {
                return message;
            }
        }
    };
    assert!(next().get("QMP").is_some(), "the greeting");
    writer.write_all(b"{\"execute\":\"qmp_capabilities\"}\n").unwrap();
    assert_eq!(next()["return"], serde_json::json!({}));
    writer.write_all(b"{\"execute\":\"query-status\"}\n").unwrap();
    next()
}

/// Waits (a minute at most) until the observer, alone, holds the QMP session at `qmp` again
/// and its snapshot says the VM's QMP source is up.
fn until_observer_holds(run: &Path, qmp: &Path, name: &str) {
    let t = Instant::now();
    while UnixSockets::read().unwrap().of(qmp) != (PathUse { accepted: 1, waiting: 0 }) {
        assert!(t.elapsed() < Duration::from_secs(60), "{:?}", UnixSockets::read().unwrap().of(qmp));
        std::thread::sleep(Duration::from_millis(50));
    }
    snapshot_until(run, "the QMP source up", |s| {
        partition(s, name).and_then(|p| source_up(p, "qmp")) == Some(true)
    });
}

#[test]
fn a_proxmox_vms_qmp_socket_answers_a_client_per_command_within_one_refresh_while_observed() {
    let test = "a_proxmox_vms_qmp_socket_answers_a_client_per_command_within_one_refresh_while_observed";
    if !kvm_available(test) {
        return;
    }
    let tmp = TempDir::new("observe-pve-qm");
    let name = format!("pve-qm-{}", std::process::id());
    let Some((qemu, qmp)) = proxmox_kvm(tmp.path(), &name, test) else { return };
    let pid = qemu.0.id().to_string();
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let observer = Running::start(&["observe", "--interval", "1", "--pid", &pid], &run);
    observer.wait_line(&format!("attach pid {pid}"));

    // Each command comes while the observer holds the session: QEMU serves one client at a
    // time, so each is answered only once the observer lets go (at its next refresh).
    let mut took = Vec::new();
    for _ in 0..10 {
        until_observer_holds(&run, &qmp, &name);
        let t = Instant::now();
        let answer = qm_query_status(&qmp);
        took.push(t.elapsed());
        assert_eq!(answer["return"]["status"], "running", "{answer}");
    }
    let mut sorted = took.clone();
    sorted.sort();
    eprintln!(
        "{test}: answered after {took:?}; median {:?}, max {:?}",
        sorted[sorted.len() / 2],
        sorted[sorted.len() - 1]
    );
    // One refresh (1 s) and QEMU's greeting; a generous bound for a loaded host.
    assert!(took.iter().all(|t| *t < Duration::from_secs(3)), "{took:?}");

    // The observer takes the session back, and its QMP readings go on: the vCPU's exits (which
    // only QMP's `query-stats` gives on this host) still move.
    until_observer_holds(&run, &qmp, &name);
    let exits =
        |s: &serde_json::Value| partition(s, &name)?["vps"][0]["counters"][total("Exits/sec")].as_u64();
    let before = exits(&common::snapshot_json(&run)).expect("the vCPU's exits, from QMP");
    snapshot_until(&run, "the vCPU's exits moving on", |s| exits(s) > Some(before));
    let lost = observer.lines_with(&format!("pid {pid} \"{name}\": qmp lost"));
    assert!(lost.iter().any(|l| l.contains("another client waits for the QMP socket")), "{lost:?}");
}

/// Starts `hvstats ARGS --runtime-dir RUNTIME` in a mount namespace of its own whose `/etc` is
/// the host's with `over` laid on it (overlayfs, `work` its work directory): to the observer
/// alone, `over/pve/qemu-server/<vmid>.conf` is `/etc/pve/qemu-server/<vmid>.conf`, where a
/// Proxmox VE node's cluster filesystem shows it. The host's `/etc` is not touched.
fn observer_with_etc_over(args: &[&str], runtime: &Path, over: &Path, work: &Path) -> Running {
    let options = std::ffi::CString::new(format!(
        "lowerdir=/etc,upperdir={},workdir={}",
        over.display(),
        work.display()
    ))
    .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_hvstats"));
    command.args(args).arg("--runtime-dir").arg(runtime);
    // SAFETY: unshare and mount are async-signal-safe; their arguments were made before the fork
    // and outlive it (`options` is moved into the closure).
    unsafe {
        command.pre_exec(move || {
            let private = libc::MS_REC | libc::MS_PRIVATE;
            let done = libc::unshare(libc::CLONE_NEWNS) == 0
                && libc::mount(c"none".as_ptr(), c"/".as_ptr(), std::ptr::null(), private, std::ptr::null())
                    == 0
                && libc::mount(
                    c"overlay".as_ptr(),
                    c"/etc".as_ptr(),
                    c"overlay".as_ptr(),
                    0,
                    options.as_ptr().cast(),
                ) == 0;
            if done { Ok(()) } else { Err(std::io::Error::last_os_error()) }
        });
    }
    Running::spawn(command)
}

/// Writes `text` as `dir/<vmid>.conf`, root's, of `mode`.
fn pve_config(dir: &Path, vmid: u32, text: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(format!("{vmid}.conf"));
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn a_proxmox_vms_config_under_etc_pve_names_and_tags_it_and_one_another_user_may_write_does_not() {
    if !kvm_available(
        "a_proxmox_vms_config_under_etc_pve_names_and_tags_it_and_one_another_user_may_write_does_not",
    ) {
        return;
    }
    let tmp = TempDir::new("observe-pve-config");
    let (over, work, runtime) = (tmp.path().join("etc"), tmp.path().join("work"), tmp.path().join("run"));
    let configs = over.join("pve/qemu-server");
    for dir in [&configs, &work, &runtime] {
        std::fs::create_dir_all(dir).unwrap();
    }
    // As Proxmox VE 8 writes them (root's, mode 0640), a snapshot's section after the VM's own.
    let text = |name: &str| {
        format!(
            "cores: 1\nmemory: 512\nname: {name}\ntags: db;prod\nvmgenid: 3b0e5a5c-6c39-4f1d-9a0d-0f2d5f1c8e11\n\n\
             [before-upgrade]\nname: stale\ntags: old\n"
        )
    };
    pve_config(&configs, 200, &text("db1"), 0o640);
    // Another user may write it: not the cluster filesystem's word.
    pve_config(&configs, 201, &text("db2"), 0o666);
    // A link is not followed, whatever it points at.
    pve_config(&over, 299, &text("db3"), 0o640);
    std::os::unix::fs::symlink(over.join("299.conf"), configs.join("202.conf")).unwrap();
    let kvm = |vmid: &str, name: &str| vmm("/usr/bin/kvm", &["-id", vmid, "-name", name], false);
    let (trusted, writable, linked) = (kvm("200", "vm-200"), kvm("201", "vm-201"), kvm("202", "vm-202"));
    let pids = [&trusted, &writable, &linked].map(|v| v.pid().to_string());
    let mut args = vec!["observe", "--interval", "0.2"];
    for pid in &pids {
        args.extend(["--pid", pid]);
    }
    let _observer = observer_with_etc_over(&args, &runtime, &over, &work);
    assert!(!Path::new("/etc/pve/qemu-server/200.conf").exists(), "the host's /etc is untouched");

    let line = vm_info(&runtime, trusted.pid(), |l| l.contains("tags="));
    for label in [
        "platform=\"proxmox\"",
        "vmid=\"200\"",
        "id=\"qemu/200\"",
        "name=\"db1\"",
        "tags=\"db;prod\"",
        "identity_source=\"pve-config+command-line\"",
    ] {
        assert!(line.contains(label), "{label} not in {line}");
    }
    for (vmm, vmid) in [(&writable, "201"), (&linked, "202")] {
        let line = vm_info(&runtime, vmm.pid(), |l| l.contains("platform="));
        assert!(line.contains(&format!("vmid=\"{vmid}\"")), "{line}");
        assert!(line.contains("identity_source=\"command-line\""), "{line}");
        assert!(!line.contains("tags=") && !line.contains("name=\"db"), "{line}");
    }
}
