//! The QMP client against a real QEMU (Debian's qemu-system-x86, run with TCG since this
//! machine has no KVM), and the vCPU thread matching against QEMU's real thread names.

mod observe_support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hvstats_kvm::observe::Procfs;
use hvstats_kvm::observe::qmp::{Qmp, QmpError};
use observe_support::TempDir;

/// A QEMU child killed on drop.
struct Qemu {
    child: Child,
    qmp: PathBuf,
}

impl Qemu {
    /// Starts a paused TCG QEMU with a QMP socket, or `None` (printing why) when QEMU is missing.
    fn start(dir: &Path, extra: &[&str]) -> Option<Self> {
        let qmp = dir.join("qmp.sock");
        let child = Command::new("qemu-system-x86_64")
            .args(["-accel", "tcg", "-S", "-display", "none", "-nodefaults", "-m", "16"])
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp.display()))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) => {
                if std::env::var("CI").is_ok() {
                    panic!("qemu-system-x86_64 cannot be started ({e}); .ci/run installs it");
                }
                eprintln!("qemu-system-x86_64 cannot be started ({e}): skipped");
                return None;
            }
        };
        let me = Self { child, qmp };
        let t = Instant::now();
        while !me.qmp.exists() {
            assert!(t.elapsed() < Duration::from_secs(20), "QEMU did not create its QMP socket");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(me)
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn connect(&self) -> Qmp {
        Qmp::connect(&self.qmp, Duration::from_secs(5)).expect("QMP connects")
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn qmp_speaks_to_a_real_qemu_and_tcg_has_no_kvm_stats() {
    let tmp = TempDir::new("qmp-tcg");
    let Some(qemu) = Qemu::start(tmp.path(), &["-name", "guest=qmp-peer,debug-threads=on", "-smp", "2"])
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
    let Some(qemu) = Qemu::start(tmp.path(), &[]) else { return };
    let mut qmp = qemu.connect();
    assert_eq!(qmp.query_name().unwrap(), None);
    let cpus = qmp.query_cpus().unwrap();
    assert_eq!(cpus.len(), 1);
    let procfs = Procfs::host();
    assert!(procfs.named_vcpu_threads(qemu.pid()).unwrap().is_empty());
    let (_, name) = procfs.identify(qemu.pid());
    assert_eq!(name, format!("qemu-system-x86:{}", qemu.pid()));
}

#[test]
fn a_qemu_that_exits_gives_an_error_not_a_hang() {
    let tmp = TempDir::new("qmp-exit");
    let Some(mut qemu) = Qemu::start(tmp.path(), &[]) else { return };
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
