//! The QMP client against a real QEMU (Debian's qemu-system-x86, run with TCG since this
//! machine has no KVM), and the vCPU thread matching against QEMU's real thread names.

mod observe_support;

use std::time::{Duration, Instant};

use hvstats_observe::Procfs;
use hvstats_vmm::qmp::{Qmp, QmpError};
use observe_support::{Qemu, TempDir};

#[test]
fn qmp_speaks_to_a_real_qemu_and_tcg_has_no_kvm_stats() {
    let tmp = TempDir::new("qmp-tcg");
    let Some(qemu) =
        Qemu::start(tmp.path(), "qmp", "tcg", &["-name", "guest=qmp-peer,debug-threads=on", "-smp", "2"])
    else {
        return;
    };
    let mut qmp = qemu.connect();
    assert_eq!(qmp.version()["qemu"]["major"].as_u64().map(|m| m >= 7), Some(true), "{}", qmp.version());
    assert_eq!(qmp.query_name().unwrap().as_deref(), Some("qmp-peer"));
    // TCG has no KVM statistics: "not available", not an error and not zeros.
    assert_eq!(qmp.query_kvm_stats().unwrap(), None);
    assert!(!qmp.is_running().unwrap(), "started with -S");

    // The vCPU threads QMP reports carry QEMU's names, and name matching finds the same threads.
    let cpus = qmp.query_cpus().unwrap();
    assert_eq!(cpus.iter().map(|c| c.index).collect::<Vec<_>>(), vec![0, 1]);
    let procfs = Procfs::host();
    let threads = procfs.threads(qemu.pid()).unwrap();
    for cpu in &cpus {
        let comm = &threads.iter().find(|t| t.tid == cpu.thread_id).expect("a thread of QEMU").comm;
        assert_eq!(comm, &format!("CPU {}/TCG", cpu.index));
    }
    let named = procfs.named_vcpu_threads(qemu.pid()).unwrap();
    assert_eq!(named.len(), 2);
    for cpu in &cpus {
        assert_eq!(named[&cpu.index], cpu.thread_id);
    }
    // TCG holds no KVM VM: the process is not something to observe.
    assert!(!procfs.kvm_fds(qemu.pid()).unwrap().has_vm());

    qmp.cont().unwrap();
    assert!(qmp.is_running().unwrap());
    match qmp.execute("no-such-command", None) {
        Err(QmpError::Command { class, .. }) => assert_eq!(class, "CommandNotFound"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn without_debug_threads_qemu_threads_share_one_name() {
    let tmp = TempDir::new("qmp-plain");
    let Some(qemu) = Qemu::start(tmp.path(), "qmp", "tcg", &[]) else { return };
    let mut qmp = qemu.connect();
    assert_eq!(qmp.query_name().unwrap(), None);
    let cpus = qmp.query_cpus().unwrap();
    assert_eq!(cpus.len(), 1);
    let procfs = Procfs::host();
    assert!(procfs.named_vcpu_threads(qemu.pid()).unwrap().is_empty());
    let (_, name) = procfs.identify(qemu.pid());
    assert!(name.starts_with("qemu-system-x86-") && !name.contains(&qemu.pid().to_string()), "{name}");
}

#[test]
fn a_qemu_that_exits_gives_an_error_not_a_hang() {
    let tmp = TempDir::new("qmp-exit");
    let Some(mut qemu) = Qemu::start(tmp.path(), "qmp", "tcg", &[]) else { return };
    let mut qmp = qemu.connect();
    let _ = qemu.child.kill();
    let _ = qemu.child.wait();
    let t = Instant::now();
    assert!(matches!(qmp.query_name(), Err(QmpError::Io(_))));
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_socket_that_is_not_qmp_is_refused() {
    let tmp = TempDir::new("qmp-junk");
    let path = tmp.path().join("junk.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let server = std::thread::spawn(move || {
        use std::io::Write;
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(b"hello, not json\n").unwrap();
    });
    match Qmp::connect(&path, Duration::from_secs(2)) {
        Err(QmpError::Protocol(_)) => {}
        other => panic!("{other:?}"),
    }
    server.join().unwrap();
    assert!(matches!(
        Qmp::connect(&tmp.path().join("missing"), Duration::from_secs(1)),
        Err(QmpError::Connect { .. })
    ));
}

#[test]
fn the_bios_image_runs_its_loops_to_the_final_hlt_on_a_real_qemu() {
    use hvstats_guest::bios::{BiosEnd, BiosProgram};
    let tmp = TempDir::new("qmp-bios");
    let image = BiosProgram { cpuid: 777, out: 333, in_: 55, end: BiosEnd::Halt, ..BiosProgram::default() }
        .image()
        .unwrap();
    let bios = tmp.path().join("bios.bin");
    std::fs::write(&bios, &image).unwrap();
    let Some(qemu) = Qemu::start(tmp.path(), "qmp", "tcg", &["-bios", bios.to_str().unwrap()]) else {
        return;
    };
    let mut qmp = qemu.connect();
    let registers = |qmp: &mut Qmp| {
        let r =
            qmp.execute("human-monitor-command", Some(serde_json::json!({"command-line": "info registers"})));
        r.unwrap().as_str().unwrap().to_owned()
    };
    assert!(registers(&mut qmp).contains("EIP=0000fff0"), "paused at the reset vector");
    qmp.cont().unwrap();
    // The program is a few dozen bytes at F000:0000; it ends halted with BP counted down to 0.
    let hlt = image.iter().position(|b| *b == 0xF4).unwrap();
    let t = Instant::now();
    loop {
        let regs = registers(&mut qmp);
        if regs.contains("HLT=1") {
            assert!(regs.contains("EBP=00000000"), "{regs}");
            let eip = format!("EIP={:08x}", hlt + 1);
            assert!(
                regs.contains(&eip) || regs.contains(&format!("EIP={hlt:08x}")),
                "halted at {hlt:#x}: {regs}"
            );
            assert!(regs.contains("CS =f000"), "{regs}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "the guest never halted: {regs}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
