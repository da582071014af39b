//! The observer out of descriptors: a process it cannot read for want of a descriptor is not a
//! process that exited. The test runs in a child of this test binary (re-executed with an
//! environment variable), which fills every descriptor its open file limit allows, so the
//! harness's other threads are not starved.

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod observe_support;

use std::fs::File;
use std::process::Command;

use hvstats::Hypervisor;
use hvstats_observe::discovery::is_shortage;
use hvstats_observe::{ObserveOptions, Observer, ObserverEvent, Procfs, Targets};
use observe_support::{FakeProcess, TempDir};

const CHILD: &str = "HVSTATS_TEST_FD_CHILD";

fn gettid() -> i32 {
    // SAFETY: gettid has no arguments and no memory effects.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// Opens /dev/null until the open file limit refuses: what it returns holds every descriptor.
fn exhaust_descriptors() -> Vec<File> {
    let mut held = Vec::new();
    loop {
        match File::open("/dev/null") {
            Ok(f) => held.push(f),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e}");
                return held;
            }
        }
    }
}

#[test]
fn a_process_unreadable_for_want_of_descriptors_is_deferred_not_called_exited() {
    if std::env::var_os(CHILD).is_none() {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "a_process_unreadable_for_want_of_descriptors_is_deferred_not_called_exited"])
            .args(["--nocapture", "--test-threads", "1"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{said}");
        assert!(said.contains("1 passed"), "the child ran the test: {said}");
        return;
    }
    // In the child: a small limit, so filling it is quick.
    let lim = libc::rlimit { rlim_cur: 256, rlim_max: 256 };
    // SAFETY: `lim` is a valid rlimit the kernel reads.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);

    let tmp = TempDir::new("fd-starved");
    let proc_root = tmp.path().join("proc");
    let pid = std::process::id() as i32;
    let fake = FakeProcess::new(&proc_root, pid, &["qemu-system-x86_64", "-S"], "qemu-system-x86");
    fake.fd(4, "anon_inode:kvm-vm").fd(5, "anon_inode:kvm-vcpu:0");
    fake.thread(gettid(), "CPU 0/KVM", 0);
    // A second --pid, not attached yet when descriptors run out.
    let other = FakeProcess::new(&proc_root, pid + 1, &["qemu-system-x86_64"], "qemu-system-x86");
    other.fd(4, "anon_inode:kvm-vm").fd(5, "anon_inode:kvm-vcpu:0");

    let hv = Hypervisor::new().unwrap();
    let procfs = Procfs::at(&proc_root, None);
    let mut observer =
        Observer::new(hv.clone(), procfs.clone(), Targets::Pids(vec![pid]), ObserveOptions::default());
    let events = observer.tick();
    assert!(matches!(&events[0], ObserverEvent::Attached { .. }), "{events:?}");
    let mut late =
        Observer::new(hv.clone(), procfs.clone(), Targets::Pids(vec![pid + 1]), ObserveOptions::default());

    let held = exhaust_descriptors();
    let e = procfs.is_alive(pid).unwrap_err();
    assert!(is_shortage(&e), "{e}");
    // The observed VM stays observed, said once; the unattached one waits, said once.
    for round in 0..3 {
        let events = observer.tick();
        assert!(!events.iter().any(|e| matches!(e, ObserverEvent::Detached { .. })), "{events:?}");
        assert_eq!(events.len(), usize::from(round == 0), "{events:?}");
        if round == 0 {
            assert!(matches!(&events[0], ObserverEvent::Deferred { pid: p, .. } if *p == pid), "{events:?}");
        }
        assert_eq!(observer.vms().count(), 1);
        let events = late.tick();
        assert!(!events.iter().any(|e| matches!(e, ObserverEvent::Failed { .. })), "{events:?}");
        assert!(!late.finished(), "a --pid observer does not give up on a process it could not read");
    }
    drop(held);
    // Descriptors back: both are observed again.
    assert!(observer.tick().is_empty());
    assert_eq!(observer.vms().count(), 1);
    let events = late.tick();
    assert!(matches!(&events[0], ObserverEvent::Attached { .. }), "{events:?}");
}
