//! CPU wait of an observed VM's vCPU threads, run without KVM: a fake `/proc` tree describes this
//! test process as a QEMU with one vCPU whose thread is a real thread of this process, and gives
//! that thread a schedstat; the observer publishes its run time, wait and dispatches as the
//! kernel keeps them, from the thread's start.

mod observe_support;

use std::sync::mpsc;

use hvstats::Hypervisor;
use hvstats_abi::catalog::vp;
use hvstats_observe::{ObserveOptions, Observer, ObserverEvent, Procfs, Targets};
use observe_support::{FakeProcess, TempDir};

#[test]
fn an_observed_vcpu_thread_has_its_cpu_wait_and_dispatches_since_the_thread_started() {
    let tmp = TempDir::new("observe-cpu-wait");
    let proc_root = tmp.path().join("proc");
    let runtime = tmp.path().join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    let pid = std::process::id() as i32;
    let (tid_tx, tid_rx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let vcpu = std::thread::spawn(move || {
        // SAFETY: gettid has no arguments and no memory effects.
        tid_tx.send(unsafe { libc::syscall(libc::SYS_gettid) as i32 }).unwrap();
        let _ = stop_rx.recv();
    });
    let tid = tid_rx.recv().unwrap();
    // SAFETY: as above.
    let me = unsafe { libc::syscall(libc::SYS_gettid) as i32 };
    let fake =
        FakeProcess::new(&proc_root, pid, &["/usr/bin/qemu-system-x86_64", "-name", "guest=waiting"], "qemu");
    fake.fd(3, "/dev/kvm").fd(4, "anon_inode:kvm-vm").fd(5, "anon_inode:kvm-vcpu:0");
    fake.thread(me, "qemu", 0).thread(tid, "CPU 0/KVM", 0);
    let schedstat = proc_root.join(pid.to_string()).join("task").join(tid.to_string()).join("schedstat");
    std::fs::write(&schedstat, "1000 5000 10\n").unwrap();

    let hv = Hypervisor::new_published(&runtime).unwrap();
    let mut observer = Observer::new(
        hv.clone(),
        Procfs::at(&proc_root, None),
        Targets::Pids(vec![pid]),
        ObserveOptions::default(),
    );
    let events = observer.tick();
    let Some(ObserverEvent::Attached { partition, .. }) = events.first() else { panic!("{events:?}") };
    let stats = hv.partition(*partition).expect("the partition");

    // What the thread did before the observer came is counted: nothing is taken off at attach.
    let page = stats.vp_page(0).unwrap();
    observer.tick();
    assert_eq!(page.get(vp::CPU_WAIT_TIME_PER_DISPATCH), 5000);
    assert_eq!(page.get(vp::DISPATCHES), 10);
    // The thread ran 2 µs more, waited 7 µs more and was dispatched 7 more times.
    std::fs::write(&schedstat, "3000 12000 17\n").unwrap();
    observer.tick();
    assert_eq!(page.get(vp::CPU_WAIT_TIME_PER_DISPATCH), 12000);
    assert_eq!(page.get(vp::DISPATCHES), 17);
    // Its run time is schedstat's (in 100 ns), all of it outside a guest here (no guest time).
    assert_eq!(page.get(vp::TOTAL_RUN_TIME), 30);
    assert_eq!(page.get(vp::HYPERVISOR_RUN_TIME), 30);

    // A reader in another process sees them as available counters.
    let mut attach = hvstats::attach::Attach::new(&runtime);
    attach.refresh().unwrap();
    let instance = attach.instances_mut().next().expect("the observer's instance");
    let snap = instance.snapshot();
    let p = snap.partitions.iter().find(|p| p.id == *partition).expect("the observed partition");
    assert_eq!(p.vps[0].reading.get("CPU wait time per dispatch"), Some(12000));
    assert_eq!(p.vps[0].reading.get("Dispatches/sec"), Some(17));

    // A schedstat that stops making sense (not the same thread) leaves the counters as they were.
    std::fs::write(&schedstat, "garbage\n").unwrap();
    observer.tick();
    assert_eq!(page.get(vp::CPU_WAIT_TIME_PER_DISPATCH), 12000);
    // Nor does one that went back.
    std::fs::write(&schedstat, "3000 11000 17\n").unwrap();
    observer.tick();
    assert_eq!(page.get(vp::CPU_WAIT_TIME_PER_DISPATCH), 12000);
    drop(attach);
    drop(observer);
    stop_tx.send(()).unwrap();
    vcpu.join().unwrap();
}
