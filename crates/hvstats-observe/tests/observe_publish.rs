//! An observed VM is published as a partition: the whole path from discovery to pages, run
//! without KVM. A fake `/proc` tree describes this test process as a QEMU holding a VM with two
//! vCPUs whose threads are two real threads of this process; the observer counts on those real
//! threads (task clock, and KVM tracepoints that stay 0 here), subtracts the guest time the tree
//! says they had at attach, and publishes everything under a temporary runtime directory.

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod observe_support;

use std::sync::Arc;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use hvstats::Hypervisor;
use hvstats_abi::catalog::vp;
use hvstats_abi::vm_sources::{Origin, SourceTable};
use hvstats_observe::refusal::Refusal;
use hvstats_observe::sources::events::vm_events;
use hvstats_observe::sources::thread_clock;
use hvstats_observe::thread_counters::EventList;
use hvstats_observe::{KvmExitState, ObserveOptions, Observer, ObserverEvent, Procfs, Targets};
use observe_support::{FakeProcess, TempDir};

fn gettid() -> i32 {
    // SAFETY: gettid has no arguments and no memory effects.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec the kernel writes into.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A thread that spins until it has used the CPU time it is sent, and answers with the CPU time
/// it used (ns).
fn spinner() -> (i32, mpsc::Sender<Duration>, mpsc::Receiver<u64>) {
    let (tx, rx) = mpsc::channel::<Duration>();
    let (done_tx, done) = mpsc::channel();
    let (tid_tx, tid_rx) = mpsc::channel();
    thread::spawn(move || {
        tid_tx.send(gettid()).unwrap();
        for d in rx {
            let start = thread_cpu_ns();
            while thread_cpu_ns() - start < d.as_nanos() as u64 {
                std::hint::spin_loop();
            }
            done_tx.send(thread_cpu_ns() - start).unwrap();
        }
    });
    (tid_rx.recv().unwrap(), tx, done)
}

fn ticks_per_sec() -> u64 {
    // SAFETY: sysconf has no memory effects.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as u64 }
}

#[test]
fn an_observed_vm_becomes_a_partition_and_goes_when_its_process_does() {
    let tmp = TempDir::new("observe-publish");
    let proc_root = tmp.path().join("proc");
    let runtime = tmp.path().join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    let pid = std::process::id() as i32;
    let (tid0, spin0, done0) = spinner();
    let (tid1, _spin1, _done1) = spinner();

    let fake = FakeProcess::new(
        &proc_root,
        pid,
        &["/usr/bin/qemu-system-x86_64", "-name", "guest=fixture-vm,debug-threads=on"],
        "qemu-system-x86",
    );
    fake.fd(3, "/dev/kvm")
        .fd(4, "anon_inode:kvm-vm")
        .fd(5, "anon_inode:kvm-vcpu:0")
        .fd(6, "anon_inode:kvm-vcpu:1");
    fake.thread(gettid(), "qemu-system-x86", 0).thread(tid0, "CPU 0/KVM", 5).thread(tid1, "CPU 1/KVM", 0);
    fake.real_schedstat(tid0).real_schedstat(tid1);

    let hv = Hypervisor::new_published(&runtime).unwrap();
    let procfs = Procfs::at(&proc_root, None);
    let mut observer = Observer::new(hv.clone(), procfs, Targets::Pids(vec![pid]), ObserveOptions::default());
    let events = observer.tick();
    let partition = match &events[..] {
        [ObserverEvent::Attached { pid: p, name, vmm, vcpus, partition, .. }, rest @ ..] => {
            assert_eq!((*p, name.as_str(), *vmm, *vcpus), (pid, "fixture-vm", "qemu", 2));
            assert!(
                rest.iter().any(
                    |e| matches!(e, ObserverEvent::VcpusKnown { threads, .. } if *threads == vec![tid0, tid1])
                ),
                "{rest:?}"
            );
            *partition
        }
        other => panic!("expected an attach, got {other:?}"),
    };
    let stats = hv.partition(partition).expect("the partition exists");
    assert_eq!(stats.vp_count(), 2);
    let vm = observer.vms().next().unwrap();
    assert_eq!(vm.vcpu_threads(), vec![Some(tid0), Some(tid1)]);
    assert_eq!(vm.kvm_exit(), KvmExitState::NoHardwareVirtualization, "no VMX/SVM on this host");
    // Counters only on the two vCPU threads now; every event of the events source's list that is
    // not counted in the kernel is a perf counter on each, and so is each of the thread clock's.
    let events_per_thread =
        EventList::new(vm_events(None)).perf_events_per_thread() + thread_clock::events().len();
    assert_eq!(vm.fds(), 2 * events_per_thread, "the fd budget: {events_per_thread} per vCPU thread");
    // One source, one origin: the migrations (a perf counter, which nothing keeps across
    // observers) are a source of their own, counting from attach, apart from the tracepoints;
    // the run time is the threads' own files', which the kernel keeps from the thread's start.
    assert_eq!(vm.source_of(vp::TOTAL_RUN_TIME), Some("thread"));
    assert_eq!(vm.source_of(vp::LOGICAL_PROCESSOR_MIGRATIONS), Some("thread-clock"));
    assert_eq!(vm.source_of(vp::CPUID_INSTRUCTIONS), Some("tracepoints"));
    let table = SourceTable::decode(|id| Some(stats.page().get(id))).unwrap();
    let clock = table.writer(vp::LOGICAL_PROCESSOR_MIGRATIONS).unwrap();
    assert_eq!((clock.name(), clock.origin), ("thread-clock", Origin::Attach));
    let thread = table.writer(vp::HYPERVISOR_RUN_TIME).unwrap();
    assert_eq!((thread.name(), thread.origin), ("thread", Origin::ThreadStart));
    let names: Vec<&str> = table.sources().map(|s| s.name()).collect();
    let at = |name: &str| names.iter().position(|n| *n == name);
    assert!(at("tracepoints") < at("thread-clock") && at("thread-clock") < at("thread"), "{names:?}");
    assert_eq!(stats.page().get(hvstats_abi::catalog::partition::KEPT_SINCE), 0, "nothing kept here");

    // vCPU 0 runs for 100 ms of CPU; the tree says 8 ticks of its life were guest time.
    spin0.send(Duration::from_millis(100)).unwrap();
    let used_ns = done0.recv().unwrap();
    fake.set_guest_ticks(tid0, "CPU 0/KVM", 8);
    assert!(observer.tick().is_empty());
    let page = stats.vp_page(0).unwrap();
    let total = page.get(vp::TOTAL_RUN_TIME);
    // schedstat's run time is the thread's whole life, as its CPU clock is: what it spun, and
    // what it ran before the observer came (read after the tick, the thread may have run on a
    // little, back to its wait).
    assert!(total >= used_ns / 100, "total {total} covers the {used_ns} ns the thread measured");
    let life = std::fs::read_to_string(format!("/proc/{pid}/task/{tid0}/schedstat")).unwrap();
    let life_100ns = life.split(' ').next().unwrap().parse::<u64>().unwrap() / 100;
    assert!(
        total <= life_100ns && life_100ns - total < 100_000,
        "total {total}, the thread's life {life_100ns}"
    );
    let guest = 8 * 10_000_000 / ticks_per_sec();
    assert!(total > guest);
    assert_eq!(page.get(vp::HYPERVISOR_RUN_TIME), total - guest, "guest time counts from the thread's start");
    assert_eq!(page.get(vp::CPUID_INSTRUCTIONS), 0, "no guest ran");
    assert_eq!(stats.vp_page(1).unwrap().get(vp::TOTAL_RUN_TIME) / 10_000, 0, "vCPU 1 stayed idle");

    // What a reader in another process gets: the name, and unavailable counters as unknown.
    let mut attach = hvstats::attach::Attach::new(&runtime);
    attach.refresh().unwrap();
    let instance = attach.instances_mut().next().expect("the observer's instance");
    let snap = instance.snapshot();
    let p = snap.partitions.iter().find(|p| p.id == partition).expect("the observed partition");
    assert_eq!(p.name, "fixture-vm");
    let vp0 = &p.vps[0].reading;
    for name in [
        "HLT instructions/sec",
        "CPUID instructions cost",
        "Emulated instructions/sec",
        "Other intercepts/sec",
    ] {
        assert_eq!(vp0.get(name), None, "{name} is unavailable without QMP or kvm_exit");
    }
    assert_eq!(vp0.get("CPUID instructions/sec"), Some(0));
    assert!(vp0.get("Total run time").is_some_and(|t| t >= total));
    assert_eq!(vp0.get("IO intercept messages/sec"), Some(0));
    drop(attach);

    // The process exits: the VM is detached and its partition is gone.
    fake.set_state('Z');
    let events = observer.tick();
    assert!(
        matches!(&events[..], [ObserverEvent::Detached { pid: p, name, .. }] if *p == pid && name == "fixture-vm"),
        "{events:?}"
    );
    assert!(hv.partition(partition).is_none());
    assert!(observer.finished());
    drop(observer);
    assert!(Arc::strong_count(&hv) == 1);
}

#[test]
fn a_pid_without_a_vm_fails_clearly_and_ends_the_observer() {
    let tmp = TempDir::new("observe-novm");
    let fake = FakeProcess::new(tmp.path(), 77, &["bash"], "bash");
    fake.fd(0, "/dev/null");
    let hv = Hypervisor::new().unwrap();
    let mut observer = Observer::new(
        hv.clone(),
        Procfs::at(tmp.path(), None),
        Targets::Pids(vec![77, 78]),
        ObserveOptions::default(),
    );
    let events = observer.tick();
    let errors: Vec<String> = events
        .iter()
        .map(|e| match e {
            ObserverEvent::Failed { error, .. } => error.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(errors.len(), 2);
    assert!(errors[0].contains("process 77 holds no KVM VM"), "{}", errors[0]);
    assert!(errors[1].contains("no process 78"), "{}", errors[1]);
    assert!(observer.finished());
    assert!(hv.partitions().is_empty());
}

#[test]
fn with_all_a_failing_process_is_reported_once_and_retried_when_it_comes_back() {
    let tmp = TempDir::new("observe-all-retry");
    let fake = FakeProcess::new(tmp.path(), 91, &["firecracker", "--id", "fc"], "firecracker");
    fake.fd(4, "anon_inode:kvm-vm").fd(5, "anon_inode:kvm-vcpu:0");
    // No readable threads: attach fails.
    std::fs::remove_dir_all(tmp.path().join("91/task")).unwrap();
    let hv = Hypervisor::new().unwrap();
    let mut observer =
        Observer::new(hv.clone(), Procfs::at(tmp.path(), None), Targets::All, ObserveOptions::default());
    assert!(observer.tick().is_empty(), "with --all, a VM is attached once its vCPU count held still");
    let events = observer.tick();
    assert!(
        matches!(&events[..], [ObserverEvent::Failed { pid: 91, error, reason: Refusal::Failed }] if error.contains("cannot read process 91")),
        "{events:?}"
    );
    assert!(observer.tick().is_empty(), "not retried while it is the same process");
    assert!(!observer.finished(), "--all never finishes by itself");
    // It goes away, and a process with that pid comes back, now readable.
    std::fs::remove_dir_all(tmp.path().join("91")).unwrap();
    assert!(observer.tick().is_empty());
    let fake = FakeProcess::new(tmp.path(), 91, &["firecracker", "--id", "fc"], "firecracker");
    fake.fd(4, "anon_inode:kvm-vm").fd(5, "anon_inode:kvm-vcpu:0");
    fake.thread(91, "firecracker", 0);
    assert!(observer.tick().is_empty());
    let events = observer.tick();
    assert!(
        matches!(&events[0], ObserverEvent::Attached { pid: 91, name, vmm: "firecracker", vcpus: 1, .. } if name == "fc"),
        "{events:?}"
    );
}

#[test]
fn counters_that_cannot_be_opened_on_a_vcpu_thread_are_unavailable_not_zero() {
    let tmp = TempDir::new("observe-unopenable");
    let pid = std::process::id() as i32;
    let fake = FakeProcess::new(tmp.path(), pid, &["crosvm", "run", "--name", "x"], "crosvm");
    fake.fd(4, "anon_inode:kvm-vm").fd(5, "anon_inode:kvm-vcpu:0");
    // The vCPU thread the tree names does not exist: nothing can be opened on it.
    fake.thread(i32::MAX - 1, "crosvm_vcpu0", 0);
    let hv = Hypervisor::new().unwrap();
    let mut observer = Observer::new(
        hv.clone(),
        Procfs::at(tmp.path(), None),
        Targets::Pids(vec![pid]),
        ObserveOptions::default(),
    );
    let events = observer.tick();
    assert!(matches!(&events[0], ObserverEvent::Attached { fds: 0, .. }), "{events:?}");
    let vm = observer.vms().next().unwrap();
    assert_eq!(vm.vcpu_threads(), vec![Some(i32::MAX - 1)]);
    let unavailable = vm.unavailable();
    for c in [vp::CPUID_INSTRUCTIONS, vp::IO_INSTRUCTIONS, vp::TOTAL_RUN_TIME, vp::IO_INTERCEPT_MESSAGES] {
        assert!(unavailable.contains(&c), "{c:?}");
    }
}

#[test]
fn a_hundred_vms_with_all_hold_a_bounded_number_of_descriptors_and_come_and_go() {
    let tmp = TempDir::new("observe-hundred");
    hvstats_observe::raise_fd_limit().unwrap();
    let (tid, _spin, _done) = spinner();
    // A hundred Firecracker processes, each with one vCPU whose thread is a real thread here.
    let fakes: Vec<FakeProcess> = (0..100)
        .map(|i| {
            let pid = 200_000 + i;
            let id = format!("fc-{i}");
            let f = FakeProcess::new(tmp.path(), pid, &["firecracker", "--id", &id], "firecracker");
            f.fd(4, "anon_inode:kvm-vm").fd(5, "anon_inode:kvm-vcpu:0");
            f.thread(tid, "fc_vcpu 0", 0);
            f
        })
        .collect();
    let hv = Hypervisor::new().unwrap();
    let mut observer =
        Observer::new(hv.clone(), Procfs::at(tmp.path(), None), Targets::All, ObserveOptions::default());
    assert!(observer.tick().is_empty(), "with --all, a VM is attached once its vCPU count held still");
    let events = observer.tick();
    let attached = events.iter().filter(|e| matches!(e, ObserverEvent::Attached { .. })).count();
    assert_eq!(attached, 100);
    assert_eq!(hv.partitions().len(), 100);
    let per_vcpu = EventList::new(vm_events(None)).perf_events_per_thread() + thread_clock::events().len();
    assert_eq!(observer.fds(), 100 * per_vcpu, "{per_vcpu} per one-vCPU VM");
    let mut names: Vec<String> = observer.vms().map(|v| v.name().to_owned()).collect();
    names.sort();
    assert_eq!(names.first().map(String::as_str), Some("fc-0"));
    assert!(observer.tick().is_empty(), "a second pass changes nothing");
    // Half of them exit: all detached within one interval.
    for f in &fakes[..50] {
        f.set_state('Z');
    }
    let events = observer.tick();
    assert_eq!(events.iter().filter(|e| matches!(e, ObserverEvent::Detached { .. })).count(), 50);
    assert_eq!(hv.partitions().len(), 50);
    assert_eq!(observer.fds(), 50 * per_vcpu);
}

#[test]
fn with_all_a_vm_is_attached_once_its_vcpus_stop_appearing() {
    let tmp = TempDir::new("observe-settle");
    let fake = FakeProcess::new(tmp.path(), 93, &["cloud-hypervisor"], "cloud-hyperviso");
    fake.thread(93, "cloud-hyperviso", 0);
    fake.fd(4, "anon_inode:kvm-vm");
    let hv = Hypervisor::new().unwrap();
    let mut observer =
        Observer::new(hv.clone(), Procfs::at(tmp.path(), None), Targets::All, ObserveOptions::default());
    assert!(observer.tick().is_empty(), "a VM without vCPUs waits");
    assert!(observer.tick().is_empty());
    fake.fd(5, "anon_inode:kvm-vcpu:0");
    assert!(observer.tick().is_empty(), "one vCPU so far");
    fake.fd(6, "anon_inode:kvm-vcpu:1");
    assert!(observer.tick().is_empty(), "a second one appeared");
    let events = observer.tick();
    assert!(matches!(&events[..], [ObserverEvent::Attached { pid: 93, vcpus: 2, .. }, ..]), "{events:?}");
    let attached = events.iter().filter(|e| matches!(e, ObserverEvent::Attached { .. })).count();
    assert_eq!(attached, 1, "{events:?}");
}

#[test]
fn vms_are_taken_by_pid_uuid_or_name_and_the_rest_said_once_to_be_left_out() {
    use hvstats_observe::filter::{VmFilter, VmPattern};
    let tmp = TempDir::new("observe-filter");
    let uuid = "1f0b7c1e-8d2a-4c3b-9e4f-5a6b7c8d9e0f";
    let vms = [
        (301, vec!["qemu-system-x86_64", "-name", "web-1"]),
        (302, vec!["qemu-system-x86_64", "-name", "db-1", "-uuid", uuid]),
        (303, vec!["qemu-system-x86_64", "-name", "db-2"]),
        (304, vec!["firecracker", "--id", "fc"]),
    ];
    let _fakes: Vec<FakeProcess> = vms
        .iter()
        .map(|(pid, args)| {
            let f = FakeProcess::new(tmp.path(), *pid, args, "vmm");
            f.fd(4, "anon_inode:kvm-vm").fd(5, "anon_inode:kvm-vcpu:0");
            f.thread(*pid, "vmm", 0);
            f
        })
        .collect();
    let pattern = |p: &str| VmPattern::parse(p).unwrap();
    // The db VMs and pid 304, less the one with that UUID.
    let filter = VmFilter { include: vec![pattern("^db-"), pattern("304")], exclude: vec![pattern(uuid)] };
    let hv = Hypervisor::new().unwrap();
    let options = ObserveOptions { filter, ..Default::default() };
    let mut observer = Observer::new(hv.clone(), Procfs::at(tmp.path(), None), Targets::All, options);
    let mut events = Vec::new();
    for _ in 0..4 {
        events.extend(observer.tick());
    }
    let mut attached: Vec<String> = observer.vms().map(|v| v.name().to_owned()).collect();
    attached.sort();
    assert_eq!(attached, ["db-2", "fc"], "{events:?}");
    let excluded: Vec<i32> = events
        .iter()
        .filter_map(|e| match e {
            ObserverEvent::Excluded { pid, .. } => Some(*pid),
            _ => None,
        })
        .collect();
    assert_eq!(excluded, [301, 302], "each said once: {events:?}");
    assert_eq!(observer.refused().total(), 0, "left out by choice is not refused");
}

#[test]
fn a_vm_another_observer_claims_is_said_once_and_counted_refused_on_the_observers_page() {
    use hvstats_abi::catalog::hypervisor;
    let tmp = TempDir::new("observe-claimed");
    let proc_root = tmp.path().join("proc");
    let runtime = tmp.path().join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    // A real process to claim (claims check it exists), other than this one (which --all skips).
    let mut sleeper = std::process::Command::new("sleep").arg("60").spawn().unwrap();
    let pid = sleeper.id() as i32;
    let fake = FakeProcess::new(&proc_root, pid, &["firecracker", "--id", "held"], "firecracker");
    fake.fd(4, "anon_inode:kvm-vm").fd(5, "anon_inode:kvm-vcpu:0");
    fake.thread(pid, "fc_vcpu 0", 0);
    let observer = |targets| {
        let options = ObserveOptions { claims: Some(runtime.clone()), ..Default::default() };
        let hv = Hypervisor::new().unwrap();
        (hv.clone(), Observer::new(hv, Procfs::at(&proc_root, None), targets, options))
    };
    let (first_hv, mut first) = observer(Targets::Pids(vec![pid]));
    assert!(matches!(&first.tick()[0], ObserverEvent::Attached { .. }));
    let (hv, mut all) = observer(Targets::All);
    let mut events = Vec::new();
    for _ in 0..10 {
        events.extend(all.tick());
    }
    let deferred = events.iter().filter(|e| matches!(e, ObserverEvent::Deferred { .. })).count();
    assert_eq!(deferred, 1, "said once while it lasts, not every other tick: {events:?}");
    let page = hv.page();
    assert_eq!(page.get(hypervisor::OBSERVER_UP), 1);
    assert_eq!(page.get(hypervisor::OBSERVER_VMS_ATTACHED), 0);
    assert_eq!(page.get(hypervisor::OBSERVER_VMS_REFUSED), 1);
    // Counted for its reason, and for no other.
    assert_eq!(page.get(hypervisor::OBSERVER_VMS_REFUSED_CLAIMED_ELSEWHERE), 1);
    for reason in Refusal::ALL.iter().filter(|r| **r != Refusal::ClaimedElsewhere) {
        assert_eq!(page.get(reason.row()), 0, "{reason:?}");
    }
    assert!(
        matches!(
            events.iter().find(|e| matches!(e, ObserverEvent::Deferred { .. })),
            Some(ObserverEvent::Deferred { reason: Refusal::ClaimedElsewhere, .. })
        ),
        "{events:?}"
    );
    assert!(page.get(hypervisor::OBSERVER_LAST_REFRESH) > 0);
    assert_eq!(first_hv.page().get(hypervisor::OBSERVER_VMS_ATTACHED), 1);
    // The first observer goes: the VM is taken over, and refused no more.
    drop(first);
    let events = all.tick();
    assert!(matches!(&events[..], [ObserverEvent::Attached { .. }, ..]), "{events:?}");
    assert_eq!(page.get(hypervisor::OBSERVER_VMS_REFUSED), 0);
    assert_eq!(page.get(hypervisor::OBSERVER_VMS_ATTACHED), 1);
    all.mark_stopped();
    assert_eq!(page.get(hypervisor::OBSERVER_UP), 0);
    drop(all);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}
