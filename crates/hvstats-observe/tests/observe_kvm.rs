//! The observer on real QEMU VMs with KVM: exact counts for a guest that knows what it did, an
//! unmodified SeaBIOS on two vCPUs, QEMU without debug-threads, two VMs with `--all`, a VM that
//! exits while observed, fifty paused QEMUs. They need /dev/kvm (a host without it prints
//! "skipped"; `HVSTATS_REQUIRE_KVM=1` makes that a failure).

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod observe_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hvstats::{Hypervisor, PartitionStats};
use hvstats_abi::catalog::vp;
use hvstats_guest::bios::{BiosEnd, BiosProgram};
use hvstats_observe::sources::events::vm_events;
use hvstats_observe::thread_counters::EventList;
use hvstats_observe::{ObserveOptions, Observer, ObserverEvent, Procfs, Targets};
use hvstats_testkit::wait_for_kvm_vcpus;
use observe_support::{Qemu, TempDir, kvm_available};

/// How long a QEMU may take to start its vCPU threads on a loaded host (tests run in parallel).
const STARTUP: Duration = Duration::from_secs(60);

/// Ticks `observer` every 50 ms until `done` holds, for at most `limit`.
fn tick_until(
    observer: &mut Observer,
    limit: Duration,
    mut done: impl FnMut(&mut Observer) -> bool,
) -> Vec<ObserverEvent> {
    let t = Instant::now();
    let mut events = Vec::new();
    loop {
        events.extend(observer.tick());
        if done(observer) {
            return events;
        }
        assert!(t.elapsed() < limit, "condition not reached in {limit:?}; events {events:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn only_partition(hv: &Arc<Hypervisor>) -> Arc<PartitionStats> {
    let parts = hv.partitions();
    assert_eq!(parts.len(), 1);
    parts[0].clone()
}

/// A paused QEMU with a control QMP socket (`ctl`) and one for the observer (`obs`).
fn qemu_with_bios(tmp: &TempDir, program: BiosProgram, extra: &[&str]) -> Option<(Qemu, std::path::PathBuf)> {
    let bios = tmp.path().join("bios.bin");
    std::fs::write(&bios, program.image().unwrap()).unwrap();
    let obs = tmp.path().join("obs.sock");
    let obs_arg = format!("unix:{},server=on,wait=off", obs.display());
    let mut args = vec!["-bios", bios.to_str().unwrap(), "-qmp", obs_arg.as_str()];
    args.extend_from_slice(extra);
    let qemu = Qemu::start(tmp.path(), "ctl", "kvm", &args)?;
    wait_for_kvm_vcpus(qemu.pid(), 1, Duration::from_secs(10));
    let t = Instant::now();
    while !obs.exists() {
        assert!(t.elapsed() < Duration::from_secs(10), "QEMU made no QMP socket in 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    Some((qemu, obs))
}

#[test]
fn a_paused_qemu_guest_is_counted_exactly_from_its_first_instruction() {
    if !kvm_available("a_paused_qemu_guest_is_counted_exactly_from_its_first_instruction") {
        return;
    }
    let tmp = TempDir::new("kvm-exact");
    let program = BiosProgram {
        cpuid: 777,
        out: 333,
        in_: 55,
        touch_ram: true,
        end: BiosEnd::Halt,
        ..BiosProgram::default()
    };
    let uuid = "1f0b7c1e-8d2a-4c3b-9e4f-5a6b7c8d9e0f";
    let Some((qemu, obs)) =
        qemu_with_bios(&tmp, program, &["-name", "guest=exact,debug-threads=on", "-uuid", uuid])
    else {
        return;
    };
    let hv = Hypervisor::new_published(&tmp.path().join("run")).unwrap();
    let mut observer = Observer::new(
        hv.clone(),
        Procfs::host(),
        Targets::Pids(vec![qemu.pid()]),
        ObserveOptions { qmp: Some(obs), ..Default::default() },
    );
    // QEMU creates its vCPU threads after it answers QMP: wait until this VM is attached.
    let pid = qemu.pid();
    let events = tick_until(&mut observer, STARTUP, |o| o.vms().any(|v| v.pid() == pid));
    assert!(
        events.iter().any(
            |e| matches!(e, ObserverEvent::Attached { pid: p, name, vcpus: 1, .. } if *p == pid && name == "exact")
        ),
        "{events:?}"
    );
    let part = only_partition(&hv);
    let page = part.vp_page(0).unwrap();
    assert_eq!(page.get(vp::CPUID_INSTRUCTIONS), 0, "paused: nothing ran yet");
    // Readers of the runtime directory see the VM's UUID, from QEMU's own command line.
    let mut attach = hvstats::attach::Attach::new(&tmp.path().join("run"));
    attach.refresh().unwrap();
    let info = attach.instances().next().unwrap().partitions()[0].clone();
    assert_eq!(info.uuid.map(|u| u.to_string()).as_deref(), Some(uuid));
    // The host's faults on the vCPU thread count from the moment the observer found it: between
    // two readings the page grows by exactly what the thread's `stat` says.
    let tid = observer.vms().next().unwrap().vcpu_threads()[0].expect("the vCPU thread is known");
    let faults_now = || {
        let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).unwrap();
        let stat = hvstats_host::task_stat::StatLine::parse(&text).unwrap();
        stat.minor_faults().unwrap() + stat.major_faults().unwrap()
    };
    // A reading during which the thread took no fault: (the page's count, the thread's faults).
    let settled = |observer: &mut Observer| {
        for _ in 0..100 {
            let before = faults_now();
            observer.tick();
            if faults_now() == before {
                return (page.get(vp::HOST_PAGE_FAULTS), before);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("the vCPU thread kept faulting through 100 readings");
    };
    let (counted_paused, faults_paused) = settled(&mut observer);
    let unavailable = observer.vms().next().unwrap().unavailable();
    assert!(!unavailable.contains(&vp::HOST_PAGE_FAULTS), "{unavailable:?}");
    qemu.connect().cont().unwrap();
    tick_until(&mut observer, Duration::from_secs(60), |_| {
        page.get(vp::CPUID_INSTRUCTIONS) == 777 && page.get(vp::IO_INSTRUCTIONS) == 388
    });
    // Let the final HLT land, then check everything once more: nothing moves any more.
    std::thread::sleep(Duration::from_millis(300));
    observer.tick();
    assert_eq!(page.get(vp::CPUID_INSTRUCTIONS), 777);
    assert_eq!(page.get(vp::IO_INSTRUCTIONS), 333 + 55);
    assert_eq!(page.get(vp::IO_INTERCEPT_MESSAGES), 333 + 55, "every port access went to QEMU");
    assert_eq!(page.get(vp::MEMORY_INTERCEPT_MESSAGES), 0);
    assert_eq!(page.get(vp::MSR_ACCESSES), 0);
    let vm = observer.vms().next().unwrap();
    eprintln!("counted by {}", vm.counting_method());
    if vm.has_qmp_stats() {
        assert_eq!(page.get(vp::HLT_INSTRUCTIONS), 1, "one HLT, from KVM's halt_exits through QMP");
    }
    assert!(page.get(vp::TOTAL_RUN_TIME) > 0);
    // The guest's write of RAM nothing had touched is a fault of its vCPU thread, and the page
    // grew by exactly the thread's faults.
    let (counted, faults) = settled(&mut observer);
    assert!(counted - counted_paused >= 1, "the guest's first touch of RAM is a host fault");
    assert_eq!(counted - counted_paused, faults - faults_paused);
}

#[test]
fn x2apic_eoi_and_tpr_writes_of_a_qemu_guest_are_counted_exactly() {
    if !kvm_available("x2apic_eoi_and_tpr_writes_of_a_qemu_guest_are_counted_exactly") {
        return;
    }
    let tmp = TempDir::new("kvm-x2apic");
    // x2APIC registers are MSRs: no MMIO at all, so only kvm_apic sees these accesses.
    let program =
        BiosProgram { x2apic_eoi: 91, x2apic_tpr: 17, end: BiosEnd::Halt, ..BiosProgram::default() };
    let Some((qemu, obs)) =
        qemu_with_bios(&tmp, program, &["-cpu", "qemu64,+x2apic", "-name", "guest=x2apic,debug-threads=on"])
    else {
        return;
    };
    let hv = Hypervisor::new().unwrap();
    let mut observer = Observer::new(
        hv.clone(),
        Procfs::host(),
        Targets::Pids(vec![qemu.pid()]),
        ObserveOptions { qmp: Some(obs), ..Default::default() },
    );
    observer.tick();
    let part = only_partition(&hv);
    let page = part.vp_page(0).unwrap();
    qemu.connect().cont().unwrap();
    tick_until(&mut observer, Duration::from_secs(60), |_| {
        page.get(vp::APIC_EOI_ACCESSES) == 91 && page.get(vp::APIC_TPR_ACCESSES) == 17
    });
    std::thread::sleep(Duration::from_millis(300));
    observer.tick();
    assert_eq!(page.get(vp::APIC_EOI_ACCESSES), 91, "EOI writes by x2APIC MSR");
    assert_eq!(page.get(vp::APIC_TPR_ACCESSES), 17, "TPR writes by x2APIC MSR");
    assert_eq!(page.get(vp::APIC_MMIO_ACCESSES), 0, "no APIC access was MMIO");
    let unavailable = observer.vms().next().unwrap().unavailable();
    assert!(!unavailable.contains(&vp::APIC_EOI_ACCESSES) && !unavailable.contains(&vp::APIC_TPR_ACCESSES));
}

#[test]
fn seabios_on_two_vcpus_shows_both_with_the_right_indices() {
    if !kvm_available("seabios_on_two_vcpus_shows_both_with_the_right_indices") {
        return;
    }
    let tmp = TempDir::new("kvm-seabios");
    // No debug-threads, no observer QMP: the vCPU threads come from KVM's debugfs.
    let Some(qemu) = Qemu::start(tmp.path(), "ctl", "kvm", &["-smp", "2", "-m", "64"]) else { return };
    wait_for_kvm_vcpus(qemu.pid(), 2, Duration::from_secs(10));
    let hv = Hypervisor::new().unwrap();
    let mut observer =
        Observer::new(hv.clone(), Procfs::host(), Targets::Pids(vec![qemu.pid()]), ObserveOptions::default());
    let pid = qemu.pid();
    tick_until(&mut observer, STARTUP, |o| o.vms().any(|v| v.pid() == pid));
    let part = only_partition(&hv);
    assert_eq!(part.vp_count(), 2);
    let mut control = qemu.connect();
    control.cont().unwrap();
    // SeaBIOS probes with CPUID on the BSP and starts the AP, which executes CPUID at least once.
    tick_until(&mut observer, Duration::from_secs(60), |o| {
        o.vms().next().unwrap().vcpu_threads().iter().all(Option::is_some)
            && part.vp_page(0).unwrap().get(vp::CPUID_INSTRUCTIONS) > 10
            && part.vp_page(1).unwrap().get(vp::CPUID_INSTRUCTIONS) >= 1
    });
    let threads = observer.vms().next().unwrap().vcpu_threads();
    for cpu in control.query_cpus().unwrap() {
        assert_eq!(
            threads[cpu.index as usize],
            Some(cpu.thread_id),
            "VP {} is QEMU's CPU {}",
            cpu.index,
            cpu.index
        );
    }
    assert!(part.vp_page(0).unwrap().get(vp::IO_INSTRUCTIONS) > 100, "the BSP does SeaBIOS's port I/O");
}

#[test]
fn two_vms_with_all_and_one_exits_while_observed() {
    if !kvm_available("two_vms_with_all_and_one_exits_while_observed") {
        return;
    }
    let tmp = TempDir::new("kvm-all");
    let program = BiosProgram { cpuid: 10, end: BiosEnd::Halt, ..BiosProgram::default() };
    let a_dir = TempDir::new("kvm-all-a");
    let b_dir = TempDir::new("kvm-all-b");
    let Some((a, _)) = qemu_with_bios(&a_dir, program, &["-name", "guest=vm-a"]) else { return };
    let Some((b, _)) = qemu_with_bios(&b_dir, program, &["-name", "guest=vm-b"]) else { return };
    let hv = Hypervisor::new_published(&tmp.path().join("run")).unwrap();
    let mut observer = Observer::new(hv.clone(), Procfs::host(), Targets::All, ObserveOptions::default());
    // --all attaches a VM once its vCPU count held still for one interval. Other VMs on the host
    // (other tests', an operator's) are attached too: only this test's two are looked at.
    let (a_pid, b_pid) = (a.pid(), b.pid());
    let events = tick_until(&mut observer, STARTUP, |o| {
        o.vms().any(|v| v.pid() == a_pid) && o.vms().any(|v| v.pid() == b_pid)
    });
    let attached = |pid: i32, want: &str| {
        events
            .iter()
            .any(|e| matches!(e, ObserverEvent::Attached { pid: p, name, .. } if *p == pid && name == want))
    };
    assert!(attached(a_pid, "vm-a") && attached(b_pid, "vm-b"), "{events:?}");
    // vm-a quits: it is detached within one interval, its partition goes, vm-b stays.
    a.connect().execute("quit", None).ok();
    let events = tick_until(&mut observer, Duration::from_secs(20), |o| o.vms().all(|v| v.pid() != a_pid));
    assert!(
        events.iter().any(
            |e| matches!(e, ObserverEvent::Detached { pid, name, .. } if *pid == a_pid && name == "vm-a")
        )
    );
    assert!(observer.vms().any(|v| v.pid() == b_pid));
    drop(b);
}

#[test]
fn fifty_paused_qemus_are_observed_with_a_bounded_number_of_descriptors() {
    if !kvm_available("fifty_paused_qemus_are_observed_with_a_bounded_number_of_descriptors") {
        return;
    }
    let dirs: Vec<TempDir> = (0..50).map(|i| TempDir::new(&format!("kvm-scale-{i}"))).collect();
    let mut qemus = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        let name = format!("guest=scale-{i},debug-threads=on");
        let Some(q) = Qemu::start(d.path(), "ctl", "kvm", &["-name", &name]) else { return };
        qemus.push(q);
    }
    for q in &qemus {
        wait_for_kvm_vcpus(q.pid(), 1, Duration::from_secs(10));
    }
    hvstats_observe::raise_fd_limit().unwrap();
    let hv = Hypervisor::new().unwrap();
    let pids: Vec<i32> = qemus.iter().map(Qemu::pid).collect();
    let mut observer =
        Observer::new(hv.clone(), Procfs::host(), Targets::Pids(pids), ObserveOptions::default());
    // Fifty QEMUs start their vCPU threads in their own time: wait until all are attached.
    let events = tick_until(&mut observer, STARTUP, |o| o.vms().count() == 50);
    let attached = events.iter().filter(|e| matches!(e, ObserverEvent::Attached { .. })).count();
    assert_eq!(attached, 50, "{events:?}");
    assert_eq!(hv.partitions().len(), 50);
    // debug-threads names give every vCPU thread at once: one counter group per VM remains.
    // (Counted in the kernel, a VM's tracepoints hold no descriptor per thread; its migrations
    // are the thread clock's perf counter, or the observer's one walk of the host's tasks reads
    // them with the rest of the threads' accounting, holding no descriptor of the VM's.)
    use hvstats_observe::sources::thread_clock;
    let events = EventList::new(vm_events(hvstats_observe::sources::events::host_isa()));
    let procfs = Procfs::host();
    let per_vm = events.perf_events_per_thread() + thread_clock::events_for(&procfs).len();
    assert_eq!(observer.fds(), 50 * per_vm, "{per_vm} descriptors per one-vCPU VM");
    // One reader pass over every observed VM.
    observer.tick();
    assert_eq!(observer.vms().count(), 50);
}

#[test]
fn a_qemu_given_two_names_and_two_uuids_is_named_as_qemu_itself_says() {
    if !kvm_available("a_qemu_given_two_names_and_two_uuids_is_named_as_qemu_itself_says") {
        return;
    }
    let tmp = TempDir::new("kvm-two-names");
    let (first, second) = ("1f0b7c1e-8d2a-4c3b-9e4f-5a6b7c8d9e01", "2f0b7c1e-8d2a-4c3b-9e4f-5a6b7c8d9e02");
    let obs = tmp.path().join("obs.sock");
    let obs_arg = format!("unix:{},server=on,wait=off", obs.display());
    let args = [
        "-name",
        "first-name",
        "-uuid",
        first,
        "-qmp",
        &obs_arg,
        "-name",
        "guest=second-name",
        "-uuid",
        second,
    ];
    let Some(qemu) = Qemu::start(tmp.path(), "ctl", "kvm", &args) else { return };
    wait_for_kvm_vcpus(qemu.pid(), 1, Duration::from_secs(10));
    let pid = qemu.pid();
    // QEMU itself keeps the last of each.
    let mut control = qemu.connect();
    assert_eq!(control.query_name().unwrap().as_deref(), Some("second-name"));
    assert_eq!(control.query_uuid().unwrap().map(|u| u.to_string()).as_deref(), Some(second));
    // Its command line, read as QEMU reads it, says the same.
    let procfs = Procfs::host();
    assert_eq!(procfs.identify(pid).1, "second-name");
    assert_eq!(procfs.vm_uuid(pid).map(|u| u.to_string()).as_deref(), Some(second));
    // Observed without QMP (the command line) and with it (QEMU's answers): the same VM.
    for (run, qmp) in [("run-cmdline", None), ("run-qmp", Some(obs.clone()))] {
        let runtime = tmp.path().join(run);
        let hv = Hypervisor::new_published(&runtime).unwrap();
        let options = ObserveOptions { qmp, ..Default::default() };
        let mut observer = Observer::new(hv.clone(), Procfs::host(), Targets::Pids(vec![pid]), options);
        let events = tick_until(&mut observer, STARTUP, |o| o.vms().any(|v| v.pid() == pid));
        assert!(
            events.iter().any(|e| matches!(e, ObserverEvent::Attached { name, .. } if name == "second-name")),
            "{run}: {events:?}"
        );
        let mut attach = hvstats::attach::Attach::new(&runtime);
        attach.refresh().unwrap();
        let info = attach.instances().next().unwrap().partitions()[0].clone();
        assert_eq!(info.name, "second-name", "{run}");
        assert_eq!(info.uuid.map(|u| u.to_string()).as_deref(), Some(second), "{run}");
    }
}

#[test]
fn a_vm_the_filter_leaves_out_is_said_once_however_long_it_runs() {
    if !kvm_available("a_vm_the_filter_leaves_out_is_said_once_however_long_it_runs") {
        return;
    }
    let tmp = TempDir::new("kvm-left-out");
    let program = BiosProgram { cpuid: 10, end: BiosEnd::Halt, ..BiosProgram::default() };
    let dir = TempDir::new("kvm-left-out-vm");
    let Some((vm, _)) = qemu_with_bios(&dir, program, &["-name", "guest=left-out"]) else { return };
    wait_for_kvm_vcpus(vm.pid(), 1, STARTUP);
    let hv = Hypervisor::new_published(&tmp.path().join("run")).unwrap();
    let filter = hvstats_observe::filter::VmFilter {
        include: Vec::new(),
        exclude: vec![hvstats_observe::filter::VmPattern::parse("^left-out$").unwrap()],
    };
    let options = ObserveOptions { filter, ..ObserveOptions::default() };
    let mut observer = Observer::new(hv, Procfs::host(), Targets::All, options);
    let mut events = Vec::new();
    // Sixty ticks: as many as a minute of a 1 s refresh.
    for _ in 0..60 {
        events.extend(observer.tick());
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = vm.pid();
    let said =
        events.iter().filter(|e| matches!(e, ObserverEvent::Excluded { pid: p, .. } if *p == pid)).count();
    assert_eq!(said, 1, "{events:?}");
    assert!(observer.vms().all(|v| v.pid() != pid));
}
