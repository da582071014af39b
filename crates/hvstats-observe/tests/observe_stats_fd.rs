//! KVM's statistics of another process's VM read from the stats descriptor its VMM holds
//! (copied with `pidfd_getfd`), against what that VMM reads from the same descriptor itself.
//!
//! The VMM is this test binary run again as `test_vmm` (an ignored test that only acts when
//! `HVSTATS_TEST_VMM` is set): it creates a VM and a vCPU, opens the vCPU's binary statistics
//! and keeps them open as QEMU ≥ 8.1 does, runs a small real-mode guest to its end on a thread
//! named as QEMU names vCPU threads, prints every statistic it reads from its own descriptor,
//! and waits for its standard input to close. Run in phases, it stops its guest after each
//! phase's rounds, prints its statistics and waits for a line on its standard input to go on.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod observe_support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;

use hvstats::Hypervisor;
use hvstats_abi::catalog::vp;
use hvstats_abi::vm_sources::{Origin, SourceTable};
use hvstats_observe::{ObserveOptions, Observer, Procfs, Targets};
use observe_support::{TempDir, kvm_available};

/// The guest: `out 0x80, al` and `hlt` 25 times a phase, then `cli; hlt` once more (the end).
const ROUNDS: usize = 25;

/// The phases the VMM runs its guest in (`HVSTATS_TEST_VMM_PHASES`, 1 unless set).
fn phases() -> usize {
    std::env::var("HVSTATS_TEST_VMM_PHASES").ok().and_then(|p| p.parse().ok()).unwrap_or(1)
}

fn guest_code() -> Vec<u8> {
    let mut code = Vec::new();
    for _ in 0..ROUNDS * phases() {
        code.extend_from_slice(&[0xE6, 0x80, 0xF4]); // out 0x80, al; hlt
    }
    code.extend_from_slice(&[0xFA, 0xF4]); // cli; hlt
    code
}

/// The VMM's side: runs the guest, prints `name=value` for every statistic read from its own
/// descriptor (histograms as `name=v1,v2,…`), then `ready`, and waits for stdin to close.
#[test]
#[ignore = "the VMM process of observe_stats_fd's tests, run by them"]
fn test_vmm() {
    if std::env::var_os("HVSTATS_TEST_VMM").is_none() {
        return;
    }
    use kvm_ioctls::{Kvm, VcpuExit};
    let kvm = Kvm::new().unwrap();
    let size = 0x10000;
    // SAFETY: an anonymous private mapping of `size` bytes, owned by this process until it exits.
    let mem = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(mem, libc::MAP_FAILED);
    let code = guest_code();
    // SAFETY: the mapping is `size` bytes long and the code is shorter; nothing else uses it yet.
    unsafe { std::ptr::copy_nonoverlapping(code.as_ptr(), (mem as *mut u8).add(0x1000), code.len()) };
    let (vm, vcpu, stats) = observe_support::real_mode_vm(&kvm, mem, size);
    // QEMU names its vCPU threads so (with debug-threads=on): the observer finds it by name. The
    // thread stays, holding its vCPU, once the guest has ended, as a VMM's vCPU thread does.
    let phases = phases();
    let (paused, pause) = std::sync::mpsc::channel();
    let (go_on, go) = std::sync::mpsc::channel::<()>();
    let _runner = std::thread::Builder::new()
        .name("CPU 0/KVM".into())
        .spawn(move || {
            let mut vcpu = vcpu;
            let mut halts = 0;
            loop {
                match vcpu.run().unwrap() {
                    VcpuExit::Hlt => {
                        halts += 1;
                        if halts > ROUNDS * phases {
                            break;
                        }
                        // A phase's end: the guest stays out until it is told to go on.
                        if halts % ROUNDS == 0 && halts < ROUNDS * phases {
                            paused.send(false).unwrap();
                            go.recv().unwrap();
                        }
                    }
                    VcpuExit::IoOut(..) => {}
                    other => panic!("unexpected exit {other:?}"),
                }
            }
            paused.send(true).unwrap();
            loop {
                std::thread::park();
            }
        })
        .unwrap();
    let mut stdin = BufReader::new(std::io::stdin());
    loop {
        let ended = pause.recv().unwrap();
        let snap = stats.snapshot().unwrap();
        let mut out = std::io::stdout().lock();
        for name in stats.names() {
            writeln!(
                out,
                "{name}={}",
                snap.values(&name).iter().map(u64::to_string).collect::<Vec<_>>().join(",")
            )
            .unwrap();
        }
        writeln!(out, "ready").unwrap();
        out.flush().unwrap();
        drop(out);
        if ended {
            break;
        }
        let mut line = String::new();
        if stdin.read_line(&mut line).unwrap() == 0 {
            break;
        }
        go_on.send(()).unwrap();
    }
    let mut rest = Vec::new();
    let _ = stdin.read_to_end(&mut rest);
    drop((vm, stats));
}

/// The VMM, started; killed on drop.
struct TestVmm {
    child: std::process::Child,
    stats: BTreeMap<String, Vec<u64>>,
    stdout: BufReader<std::process::ChildStdout>,
}

impl TestVmm {
    fn start() -> Self {
        Self::start_in(1)
    }

    /// The VMM running its guest in `phases` phases, stopped after the first.
    fn start_in(phases: usize) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "test_vmm", "--ignored", "--nocapture", "--test-threads=1"])
            .env("HVSTATS_TEST_VMM", "1")
            .env("HVSTATS_TEST_VMM_PHASES", phases.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut vmm = Self { child, stats: BTreeMap::new(), stdout };
        vmm.read_stats();
        vmm
    }

    /// Reads the statistics the VMM prints, up to its `ready`.
    fn read_stats(&mut self) {
        self.stats.clear();
        let mut line = String::new();
        loop {
            line.clear();
            assert_ne!(self.stdout.read_line(&mut line).unwrap(), 0, "the test VMM ended");
            let line = line.trim_end();
            if line == "ready" {
                break;
            }
            if let Some((name, values)) = line.split_once('=') {
                let values = values.split(',').filter_map(|v| v.parse().ok()).collect();
                self.stats.insert(name.to_owned(), values);
            }
        }
        assert!(!self.stats.is_empty(), "the test VMM printed no statistics");
    }

    /// Runs the guest's next phase, and reads the statistics at its end.
    fn next_phase(&mut self) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(b"go\n").unwrap();
        stdin.flush().unwrap();
        self.read_stats();
    }

    fn stat(&self, name: &str) -> u64 {
        self.stats[name][0]
    }
}

impl Drop for TestVmm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_vmms_own_stats_descriptor_gives_every_kvm_statistic_as_the_vmm_reads_it() {
    if !kvm_available("a_vmms_own_stats_descriptor_gives_every_kvm_statistic_as_the_vmm_reads_it") {
        return;
    }
    let vmm = TestVmm::start();
    assert_eq!(vmm.stat("halt_exits"), ROUNDS as u64 + 1, "the guest ran to its end");
    let tmp = TempDir::new("stats-fd");
    let hv: Arc<Hypervisor> = Hypervisor::new_published(&tmp.path().join("run")).unwrap();
    let observer = observe(&vmm, &hv);
    let vm = observer.vms().next().expect("the test VMM is observed");
    assert_eq!(vm.source_of(vp::HLT_INSTRUCTIONS), Some("stats-fd"));
    let part = hv.partitions()[0].clone();
    let page = part.vp_page(0).unwrap();
    assert_page_holds(&vmm, page);
    // Each catalog counter KVM's statistics give is given here: none is declared unavailable.
    let unavailable = vm.unavailable();
    for id in [
        vp::HLT_INSTRUCTIONS,
        vp::HLT_INSTRUCTIONS_COST,
        vp::HALT_WAIT_HISTOGRAM,
        vp::HALT_POLL_FAIL_HISTOGRAM,
    ] {
        assert!(!unavailable.contains(&id), "{id:?}");
    }
    // Readers of the partition page see which source writes what, and from when it counts.
    let table = SourceTable::decode(|id| Some(part.page().get(id))).unwrap();
    let writer = table.writer(vp::HLT_INSTRUCTIONS).unwrap();
    assert_eq!((writer.name(), writer.up, writer.origin), ("stats-fd", true, Origin::VcpuCreation));
    assert_eq!(
        table.writer(vp::CPUID_INSTRUCTIONS).map(|s| (s.name(), s.origin)),
        Some(("tracepoints", Origin::Attach))
    );
    assert_eq!(table.sources().next().map(|s| s.name()), Some("stats-fd"), "the first of the VM's sources");
}

/// Every counter KVM's statistics give, on VP page `page`, is the VMM's own reading of the same
/// descriptor.
fn assert_page_holds(vmm: &TestVmm, page: &hvstats::SharedPage) {
    let sum = |names: &[&str]| names.iter().map(|n| vmm.stat(n)).sum::<u64>();
    assert_eq!(page.get(vp::HLT_INSTRUCTIONS), vmm.stat("halt_exits"));
    assert_eq!(page.get(vp::EMULATED_INSTRUCTIONS), vmm.stat("insn_emulation"));
    assert_eq!(page.get(vp::EXTERNAL_INTERRUPTS), vmm.stat("irq_exits"));
    assert_eq!(page.get(vp::PENDING_INTERRUPTS), vmm.stat("irq_window_exits"));
    assert_eq!(page.get(vp::PAGE_INVALIDATIONS), vmm.stat("invlpg"));
    assert_eq!(page.get(vp::NESTED_PAGE_FAULT_INTERCEPTS), vmm.stat("pf_taken"));
    assert_eq!(page.get(vp::REFLECTED_GUEST_PAGE_FAULTS), vmm.stat("pf_guest"));
    assert_eq!(page.get(vp::VIRTUAL_INTERRUPTS), vmm.stat("irq_injections"));
    assert_eq!(page.get(vp::HYPERCALLS), vmm.stat("hypercalls"));
    assert_eq!(
        page.get(vp::HLT_INSTRUCTIONS_COST),
        sum(&["halt_wait_ns", "halt_poll_success_ns", "halt_poll_fail_ns"]) / 100
    );
    for (id, sum, buckets) in [
        (vp::HALT_WAIT_HISTOGRAM, "halt_wait_ns", "halt_wait_hist"),
        (vp::HALT_POLL_SUCCESS_HISTOGRAM, "halt_poll_success_ns", "halt_poll_success_hist"),
        (vp::HALT_POLL_FAIL_HISTOGRAM, "halt_poll_fail_ns", "halt_poll_fail_hist"),
    ] {
        let slots: Vec<u64> =
            page.histogram_slots(id).iter().map(|s| s.load(std::sync::atomic::Ordering::Relaxed)).collect();
        assert_eq!(slots[0], vmm.stat(sum), "{sum}");
        assert_eq!(slots[1..], vmm.stats[buckets][..slots.len() - 1], "{buckets}");
    }
}

/// Observes the test VMM `vmm` until its vCPU thread is known.
fn observe(vmm: &TestVmm, hv: &Arc<Hypervisor>) -> Observer {
    let pid = vmm.child.id() as i32;
    let mut observer =
        Observer::new(hv.clone(), Procfs::host(), Targets::Pids(vec![pid]), ObserveOptions::default());
    for _ in 0..50 {
        observer.tick();
        if observer.vms().any(|v| v.vcpu_threads() == vec![vcpu_thread(pid)]) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    observer.tick();
    observer
}

#[test]
fn each_refresh_holds_the_statistics_of_its_moment_whether_they_moved_or_not() {
    if !kvm_available("each_refresh_holds_the_statistics_of_its_moment_whether_they_moved_or_not") {
        return;
    }
    let mut vmm = TestVmm::start_in(3);
    assert_eq!(vmm.stat("halt_exits"), ROUNDS as u64, "the guest stopped after its first phase");
    let tmp = TempDir::new("stats-fd-phases");
    let hv: Arc<Hypervisor> = Hypervisor::new_published(&tmp.path().join("run")).unwrap();
    let mut observer = observe(&vmm, &hv);
    assert_eq!(observer.vms().next().and_then(|vm| vm.source_of(vp::HLT_INSTRUCTIONS)), Some("stats-fd"));
    let part = hv.partitions()[0].clone();
    let page = part.vp_page(0).unwrap();
    assert_page_holds(&vmm, page);
    // Refreshes while nothing moves keep every value; a phase moves some statistics, and the
    // next refresh writes them, the others held as they were.
    for phase in 2..=3 {
        observer.tick();
        assert_page_holds(&vmm, page);
        let before = vmm.stats.clone();
        vmm.next_phase();
        let ended = phase == 3;
        assert_eq!(vmm.stat("halt_exits"), (ROUNDS * phase + usize::from(ended)) as u64);
        let moved = vmm.stats.iter().filter(|(name, values)| before.get(*name) != Some(values)).count();
        assert!(moved > 0 && moved < vmm.stats.len(), "{moved} of {} statistics moved", vmm.stats.len());
        let taken = hvstats_host::bpf::stats_copy::taken();
        observer.tick();
        assert_page_holds(&vmm, page);
        // Read from the kernel's copy of every descriptor where this host has it.
        let copied = hvstats_host::bpf::stats_copy::taken() - taken;
        if std::env::var_os("HVSTATS_REQUIRE_KVM").is_some() {
            assert!(copied >= 1, "the vCPU's statistics were read by pread");
        }
    }
}

/// The thread of `pid` named `CPU 0/KVM`.
fn vcpu_thread(pid: i32) -> Option<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten().find_map(|t| {
        let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
        (comm.trim() == "CPU 0/KVM").then(|| t.file_name().to_str()?.parse().ok()).flatten()
    })
}
