//! Discovery of KVM VMs, vCPUs and vCPU threads on fake `/proc` and debugfs trees shaped like
//! those of QEMU (with and without debug-threads), Firecracker, cloud-hypervisor, crosvm and
//! kvmtool.

mod observe_support;

use std::collections::BTreeMap;

use hvstats_observe::{Procfs, Vmm};
use observe_support::{FakeProcess, TempDir, debugfs_vcpu};

fn kvm_fds(p: &FakeProcess, vcpus: u32) {
    p.fd(0, "/dev/null").fd(3, "/dev/kvm").fd(4, "anon_inode:kvm-vm");
    for n in 0..vcpus {
        p.fd(10 + n, &format!("anon_inode:kvm-vcpu:{n}"));
    }
    p.fd(30, "anon_inode:[eventfd]").fd(31, "socket:[1234]");
}

#[test]
fn qemu_with_debug_threads_is_found_named_and_its_vcpus_matched_by_thread_name() {
    let tmp = TempDir::new("disc-qemu");
    let p = FakeProcess::new(
        tmp.path(),
        4242,
        &["/usr/bin/qemu-system-x86_64", "-name", "guest=web1,debug-threads=on", "-smp", "2"],
        "qemu-system-x86",
    );
    kvm_fds(&p, 2);
    p.thread(4242, "qemu-system-x86", 0)
        .thread(4243, "call_rcu", 0)
        .thread(4244, "CPU 0/KVM", 0)
        .thread(4245, "CPU 1/KVM", 0)
        .thread(4246, "kvm-nx-lpage-re", 0);
    let procfs = Procfs::at(tmp.path(), None);
    let found = procfs.kvm_processes().unwrap();
    assert_eq!(found.len(), 1);
    let (pid, fds) = &found[0];
    assert_eq!(*pid, 4242);
    assert_eq!(fds.vms, vec![4]);
    assert_eq!(fds.vcpus, BTreeMap::from([(0, 10), (1, 11)]));
    assert_eq!(procfs.identify(4242), (Vmm::Qemu, "web1".to_owned()));
    assert_eq!(procfs.named_vcpu_threads(4242).unwrap(), BTreeMap::from([(0, 4244), (1, 4245)]));
}

#[test]
fn qemu_without_debug_threads_needs_debugfs_which_knows_a_vcpu_only_after_it_ran() {
    let tmp = TempDir::new("disc-qemu-plain");
    let proc_root = tmp.path().join("proc");
    let debugfs = tmp.path().join("debug");
    let p = FakeProcess::new(&proc_root, 500, &["qemu-system-x86_64", "-smp", "2"], "qemu-system-x86");
    kvm_fds(&p, 2);
    for tid in [500, 501, 502, 503] {
        p.thread(tid, "qemu-system-x86", 0);
    }
    debugfs_vcpu(&debugfs, 500, 4, 0, 502);
    debugfs_vcpu(&debugfs, 500, 4, 1, 0); // not run yet
    let procfs = Procfs::at(&proc_root, Some(debugfs.clone()));
    assert!(procfs.named_vcpu_threads(500).unwrap().is_empty(), "every thread has the same name");
    assert_eq!(procfs.debugfs_vcpu_threads(500, 4), BTreeMap::from([(0, 502)]));
    debugfs_vcpu(&debugfs, 500, 4, 1, 503);
    assert_eq!(procfs.debugfs_vcpu_threads(500, 4), BTreeMap::from([(0, 502), (1, 503)]));
    // Another VM fd of the same pid is another directory.
    assert!(procfs.debugfs_vcpu_threads(500, 5).is_empty());
    // No name given: the command and a digest of its command line, the same for a VMM started
    // the same way (another pid), another for another command line; never the pid.
    let (vmm, name) = procfs.identify(500);
    assert_eq!(vmm, Vmm::Qemu);
    let digest = name.strip_prefix("qemu-system-x86-").expect("the command first");
    assert!(digest.len() == 8 && digest.chars().all(|c| c.is_ascii_hexdigit()), "{name}");
    assert!(!name.contains("500"), "{name}");
    FakeProcess::new(&proc_root, 600, &["qemu-system-x86_64", "-smp", "2"], "qemu-system-x86");
    FakeProcess::new(&proc_root, 700, &["qemu-system-x86_64", "-smp", "4"], "qemu-system-x86");
    assert_eq!(procfs.identify(600).1, name, "started again the same way");
    assert_ne!(procfs.identify(700).1, name, "another command line");
}

#[test]
fn firecracker_cloud_hypervisor_crosvm_and_kvmtool_threads_are_matched() {
    let tmp = TempDir::new("disc-vmms");
    /// pid, command line, comm, thread names, VMM, VM name.
    type Case<'a> = (i32, &'a [&'a str], &'a str, &'a [&'a str], Vmm, &'a str);
    let cases: [Case; 4] = [
        (
            100,
            &["firecracker", "--api-sock", "/run/fc.sock", "--id", "fc-vm-1"],
            "firecracker",
            &["firecracker", "fc_api", "fc_vcpu 0", "fc_vcpu 1"],
            Vmm::Firecracker,
            "fc-vm-1",
        ),
        (
            200,
            &["/usr/local/bin/cloud-hypervisor", "--api-socket", "path=/tmp/ch.sock"],
            "cloud-hyperviso",
            &["cloud-hyperviso", "vmm", "http-server", "vcpu0", "vcpu1"],
            Vmm::CloudHypervisor,
            // No name on its command line: named by its API socket's file.
            "ch",
        ),
        (
            300,
            &["crosvm", "run", "--name", "cros1", "vmlinux"],
            "cros1",
            &["cros1", "v_console", "crosvm_vcpu0", "crosvm_vcpu1"],
            Vmm::Crosvm,
            "cros1",
        ),
        (
            400,
            &["lkvm", "run", "--name=guest-a"],
            "lkvm",
            &["lkvm", "term-poll", "kvm-vcpu-0", "kvm-vcpu-1"],
            Vmm::Kvmtool,
            "guest-a",
        ),
    ];
    for (pid, cmdline, comm, threads, vmm, name) in cases {
        let p = FakeProcess::new(tmp.path(), pid, cmdline, comm);
        kvm_fds(&p, 2);
        for (i, t) in threads.iter().enumerate() {
            p.thread(pid + i as i32, t, 0);
        }
        let procfs = Procfs::at(tmp.path(), None);
        assert_eq!(procfs.identify(pid), (vmm, name.to_owned()), "{cmdline:?}");
        let vcpus = procfs.named_vcpu_threads(pid).unwrap();
        let first = threads.len() as i32 - 2; // the two vCPU threads come last
        assert_eq!(vcpus, BTreeMap::from([(0, pid + first), (1, pid + first + 1)]), "{cmdline:?}");
    }
    let all: Vec<i32> =
        Procfs::at(tmp.path(), None).kvm_processes().unwrap().into_iter().map(|(p, _)| p).collect();
    assert_eq!(all, vec![100, 200, 300, 400]);
}

#[test]
fn processes_without_a_vm_or_unreadable_ones_are_skipped() {
    let tmp = TempDir::new("disc-skip");
    let shell = FakeProcess::new(tmp.path(), 7, &["bash"], "bash");
    shell.fd(0, "/dev/pts/0").fd(3, "/dev/kvm"); // /dev/kvm alone is no VM
    std::fs::create_dir_all(tmp.path().join("8")).unwrap(); // no fd dir
    std::fs::create_dir_all(tmp.path().join("self")).unwrap(); // not a pid
    let procfs = Procfs::at(tmp.path(), None);
    assert!(procfs.kvm_processes().unwrap().is_empty());
    assert!(!procfs.kvm_fds(7).unwrap().has_vm());
    assert!(procfs.kvm_fds(8).is_err());
    assert!(procfs.is_alive(7).unwrap());
    shell.set_state('Z');
    assert!(!procfs.is_alive(7).unwrap(), "a zombie is gone");
    assert!(!procfs.is_alive(9).unwrap());
}

#[test]
fn a_huge_command_line_is_read_only_up_to_its_cap() {
    let tmp = TempDir::new("disc-cmdline");
    FakeProcess::new(tmp.path(), 7, &["qemu-system-x86_64", "-name", "guest=big"], "qemu-system-x86");
    // 8 MiB of one more argument: what a process with a large stack limit may show.
    let path = tmp.path().join("7").join("cmdline");
    let mut raw = std::fs::read(&path).unwrap();
    raw.extend(std::iter::repeat_n(b'a', 8 << 20));
    std::fs::write(&path, raw).unwrap();
    let procfs = Procfs::at(tmp.path(), None);
    let args = procfs.cmdline(7).unwrap();
    assert_eq!(&args[..3], ["qemu-system-x86_64", "-name", "guest=big"]);
    // Arguments and the NULs between them (the last one is cut, with no NUL after it).
    let read = args.iter().map(String::len).sum::<usize>() + args.len() - 1;
    assert_eq!(read as u64, hvstats_observe::discovery::MAX_CMDLINE, "no more than the cap is read");
    assert_eq!(procfs.identify(7).1, "big");
}

#[test]
fn a_qemu_vm_has_the_uuid_of_its_command_line_and_nothing_else_does() {
    let tmp = TempDir::new("disc-uuid");
    let uuid = "6B29FC40-CA47-1067-B31D-00DD010662DA";
    FakeProcess::new(
        tmp.path(),
        10,
        &["qemu-system-x86_64", "-name", "guest=a", "-uuid", uuid],
        "qemu-system-x86",
    );
    FakeProcess::new(tmp.path(), 11, &["/usr/bin/qemu-system-x86_64", "--uuid", uuid], "qemu-system-x86");
    // QEMU knows no option `-uuid=…` (it refuses to start): nothing is taken from it.
    FakeProcess::new(tmp.path(), 16, &["qemu-system-x86_64", &format!("-uuid={uuid}")], "qemu");
    FakeProcess::new(tmp.path(), 12, &["qemu-system-x86_64", "-uuid", "not-a-uuid"], "qemu-system-x86");
    FakeProcess::new(tmp.path(), 13, &["qemu-system-x86_64", "-uuid"], "qemu-system-x86");
    FakeProcess::new(tmp.path(), 14, &["crosvm", "run", "-uuid", uuid], "crosvm");
    FakeProcess::new(
        tmp.path(),
        15,
        &["qemu-system-x86_64", "-uuid", "00000000-0000-0000-0000-000000000000"],
        "qemu",
    );
    let procfs = Procfs::at(tmp.path(), None);
    let canonical = Some("6b29fc40-ca47-1067-b31d-00dd010662da".to_owned());
    assert_eq!(procfs.vm_uuid(10).map(|u| u.to_string()), canonical);
    assert_eq!(procfs.vm_uuid(11).map(|u| u.to_string()), canonical);
    for pid in [12, 13, 14, 15, 16, 17] {
        assert_eq!(procfs.vm_uuid(pid), None, "pid {pid}");
    }
}

#[test]
fn a_vm_kvm_gives_no_debugfs_directory_is_found_where_its_pid_held_or_left_a_vm() {
    use hvstats_observe::kvm_scan::KvmScan;
    let tmp = TempDir::new("scan-no-dir");
    let (root, debugfs) = (tmp.path().join("proc"), tmp.path().join("debug"));
    std::fs::create_dir_all(debugfs.join("kvm")).unwrap();
    let procfs = Procfs::at(&root, Some(debugfs.clone()));
    // `status` of a process of its own thread group.
    let status = |root: &std::path::Path, id: i32, tgid: i32| {
        let text = format!("Name:\tx\nState:\tS (x)\nTgid:\t{tgid}\n");
        std::fs::write(root.join(id.to_string()).join("status"), text).unwrap();
    };
    let vmm = |pid: i32, start: u64| {
        let p = FakeProcess::new(&root, pid, &["qemu-system-x86_64"], "qemu");
        p.set_start_time(pid, "qemu", start);
        status(&root, pid, pid);
        kvm_fds(&p, 1);
    };
    let found = |scan: &mut KvmScan| -> Vec<i32> {
        scan.kvm_processes(&procfs, &|_| false, &|_| false).unwrap().into_iter().map(|(p, _)| p).collect()
    };
    // A VM debugfs names is found; one it does not name (KVM made no directory) is not looked for.
    vmm(100, 1000);
    std::fs::create_dir_all(debugfs.join("kvm/100-4")).unwrap();
    vmm(200, 1000);
    let mut scan = KvmScan::new();
    assert_eq!(found(&mut scan), [100]);
    // The VMM at 100 exits and its directory goes; a VMM taking its pid makes a VM KVM gives no
    // directory (the old one was still there): found, as a process that held a VM at its pid.
    std::fs::remove_dir_all(root.join("100")).unwrap();
    std::fs::remove_dir(debugfs.join("kvm/100-4")).unwrap();
    vmm(100, 2000);
    assert_eq!(found(&mut scan), [100]);
    // A pid whose VM left is looked at while a process has it, named by debugfs or not.
    scan.recheck(200);
    assert_eq!(found(&mut scan), [100, 200]);
    std::fs::remove_dir_all(root.join("200")).unwrap();
    assert_eq!(found(&mut scan), [100]);
}

#[test]
fn a_process_whose_outcome_stands_is_watched_by_its_pidfd_and_read_again_only_once_it_exits() {
    use hvstats_observe::kvm_scan::KvmScan;
    let tmp = TempDir::new("scan-settled");
    // Processes of this host, shown by their own pids in a tree of their own.
    let mut children: Vec<_> =
        (0..2).map(|_| std::process::Command::new("sleep").arg("60").spawn().unwrap()).collect();
    let pids: Vec<i32> = children.iter().map(|c| c.id() as i32).collect();
    let fakes: Vec<FakeProcess> = pids
        .iter()
        .map(|&pid| {
            let p = FakeProcess::new(tmp.path(), pid, &["qemu-system-x86_64"], "qemu");
            kvm_fds(&p, 1);
            p
        })
        .collect();
    let procfs = Procfs::at(tmp.path(), None).with_own_pids();
    // One is left out (say): its outcome stands while it lives.
    let (left_out, other) = (pids[0], pids[1]);
    let settled = |p: i32| p == left_out;
    let found = |scan: &mut KvmScan| -> Vec<i32> {
        let found = scan.kvm_processes(&procfs, &|_| false, &settled).unwrap();
        let mut pids: Vec<i32> = found.into_iter().map(|(p, _)| p).collect();
        pids.sort_unstable();
        pids
    };
    let mut both = pids.clone();
    both.sort_unstable();
    let mut scan = KvmScan::new();
    assert_eq!(found(&mut scan), both);
    assert!(scan.is_watched(left_out) && !scan.is_watched(other));
    // Both starts change in the tree: a process read now is taken for another one.
    fakes[0].set_start_time(left_out, "qemu", 2000);
    fakes[1].set_start_time(other, "qemu", 2000);
    assert_eq!(found(&mut scan), both, "the watched one is listed as it was found");
    assert_eq!(scan.found_as_before(left_out), Some(1000), "not read while it lives");
    assert_eq!(scan.found_as_before(other), None, "read, and taken for a new process");
    // Once it exits it is read again, and the process the tree shows now is found.
    children[0].kill().unwrap();
    children[0].wait().unwrap();
    assert_eq!(found(&mut scan), both);
    assert_eq!(scan.found_as_before(left_out), None, "read again once it exited");
    for mut child in children {
        let _ = child.kill();
        let _ = child.wait();
    }
}
