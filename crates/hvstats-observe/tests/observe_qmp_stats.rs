//! KVM statistics through QMP, merged into an observed VM's pages from attach on. The peer is a
//! QMP server in this test that answers as QEMU with KVM does (`query-stats` with the `kvm`
//! provider, `query-cpus-fast` with thread ids); the VM is this test process described by a fake
//! procfs whose vCPU thread has no telling name, so only QMP can say which thread it is.

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod observe_support;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use hvstats::Hypervisor;
use hvstats_abi::catalog::{partition, vp};
use hvstats_abi::vm_sources::SourceTable;
use hvstats_observe::{ObserveOptions, Observer, ObserverEvent, Procfs, Targets};
use observe_support::{FakeProcess, TempDir};
use serde_json::{Value, json};

fn gettid() -> i32 {
    // SAFETY: gettid has no arguments and no memory effects.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// Serves QMP on `listener` for one client: vCPU 0 is thread `tid`; `halts` is its halt_exits.
/// Once `halts` reaches `u64::MAX` the server hangs up, as a QEMU whose monitor died would.
fn serve(listener: UnixListener, tid: i32, halts: Arc<AtomicU64>) -> thread::JoinHandle<Vec<String>> {
    thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut out = stream.try_clone().unwrap();
        let mut commands = Vec::new();
        writeln!(out, r#"{{"QMP": {{"version": {{"qemu": {{"major": 7, "minor": 2, "micro": 0}}}}, "capabilities": []}}}}"#).unwrap();
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            let req: Value = serde_json::from_str(&line).unwrap();
            let cmd = req["execute"].as_str().unwrap().to_owned();
            if halts.load(Ordering::SeqCst) == u64::MAX {
                break;
            }
            let ret = match cmd.as_str() {
                "qmp_capabilities" => json!({}),
                "query-name" => json!({"name": "from-qmp"}),
                "query-cpus-fast" => json!([
                    {"cpu-index": 0, "thread-id": tid, "qom-path": "/machine/unattached/device[0]", "target": "x86_64"}
                ]),
                "query-stats" if req["arguments"]["target"] == "vm" => json!([
                    {"provider": "kvm", "stats": [{"name": "remote_tlb_flush", "value": 100 + halts.load(Ordering::SeqCst)}]}
                ]),
                "query-stats" => {
                    let h = halts.load(Ordering::SeqCst);
                    json!([{"provider": "kvm", "qom-path": "/machine/unattached/device[0]", "stats": [
                        {"name": "halt_exits", "value": h},
                        {"name": "insn_emulation", "value": 1000 + 3 * h},
                        {"name": "halt_poll_success_hist", "value": [1, 2]},
                        {"name": "halt_wait_ns", "value": 70_000_000 * h},
                        {"name": "halt_wait_hist", "value": [0, h, 0, 2 * h]},
                    ]}])
                }
                _ => json!(null),
            };
            commands.push(cmd);
            // An asynchronous event first, as QEMU may send one at any time.
            writeln!(out, r#"{{"event": "RESUME", "timestamp": {{"seconds": 1, "microseconds": 2}}}}"#)
                .unwrap();
            writeln!(out, "{}", json!({ "return": ret })).unwrap();
        }
        commands
    })
}

#[test]
fn kvm_statistics_through_qmp_are_whole_life_and_name_the_vcpu_thread() {
    let tmp = TempDir::new("qmp-stats");
    let proc_root = tmp.path().join("proc");
    let pid = std::process::id() as i32;
    let fake = FakeProcess::new(&proc_root, pid, &["qemu-system-x86_64", "-S"], "qemu-system-x86");
    fake.fd(4, "anon_inode:kvm-vm").fd(5, "anon_inode:kvm-vcpu:0");
    let tid = gettid();
    fake.thread(pid, "qemu-system-x86", 0).thread(tid, "qemu-system-x86", 0);
    let sock = tmp.path().join("qmp.sock");
    let halts = Arc::new(AtomicU64::new(5)); // five before attach: KVM counts from the vCPU's creation
    let server = serve(UnixListener::bind(&sock).unwrap(), tid, halts.clone());

    let runtime = tmp.path().join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    let hv = Hypervisor::new_published(&runtime).unwrap();
    let procfs = Procfs::at(&proc_root, None);
    let options = ObserveOptions { qmp: Some(sock.clone()), ..Default::default() };
    let mut observer = Observer::new(hv.clone(), procfs, Targets::Pids(vec![pid]), options);
    let events = observer.tick();
    assert!(
        matches!(&events[0], ObserverEvent::Attached { name, qmp_error: None, .. } if name == "from-qmp"),
        "{events:?}"
    );
    let vm = observer.vms().next().unwrap();
    assert!(vm.has_qmp_stats());
    assert_eq!(vm.vcpu_threads(), vec![Some(tid)], "the thread QMP named");
    let stats = hv.partitions()[0].clone();
    let page = stats.vp_page(0).unwrap();
    assert_eq!(page.get(vp::HLT_INSTRUCTIONS), 5, "KVM's own value, whole-life");

    halts.store(12, Ordering::SeqCst);
    observer.tick();
    assert_eq!(page.get(vp::HLT_INSTRUCTIONS), 12, "halt_exits as KVM reports it");
    assert_eq!(page.get(vp::EMULATED_INSTRUCTIONS), 1036, "insn_emulation as KVM reports it");
    assert_eq!(stats.page().get(partition::VIRTUAL_TLB_FLUSH_ENTRIES), 112);
    let unavailable = observer.vms().next().unwrap().unavailable();
    assert!(!unavailable.contains(&vp::HLT_INSTRUCTIONS));
    assert!(!unavailable.contains(&vp::EMULATED_INSTRUCTIONS));
    assert!(unavailable.contains(&vp::MWAIT_INSTRUCTIONS), "only kvm_exit gives MWAIT");
    assert!(
        unavailable.contains(&vp::REFLECTED_GUEST_PAGE_FAULTS),
        "a statistic QEMU does not report is unavailable"
    );
    assert!(!unavailable.contains(&partition::VIRTUAL_TLB_FLUSH_ENTRIES));
    // KVM's halt histogram, its sum and buckets as QMP gives them (the dashboard's heatmaps read
    // it); a histogram QMP gives without its sum is not given.
    assert!(!unavailable.contains(&vp::HALT_WAIT_HISTOGRAM));
    let slots: Vec<u64> = page
        .histogram_slots(vp::HALT_WAIT_HISTOGRAM)
        .iter()
        .take(5)
        .map(|s| s.load(Ordering::Relaxed))
        .collect();
    assert_eq!(slots, [70_000_000 * 12, 0, 12, 0, 24]);
    assert!(unavailable.contains(&vp::HALT_POLL_SUCCESS_HISTOGRAM));

    // Readers see QMP up, writing KVM's counters; refreshes that change nothing of the sources
    // leave the table as it was.
    let qmp_writes = |stats: &hvstats::PartitionStats| {
        let table = SourceTable::decode(|id| Some(stats.page().get(id))).unwrap();
        let qmp = table.sources().find(|s| s.name() == "qmp").map(|s| s.up);
        (qmp, table.writer(vp::HLT_INSTRUCTIONS).map(|w| w.name().to_owned()))
    };
    assert_eq!(qmp_writes(&stats), (Some(true), Some("qmp".to_owned())));
    observer.tick();
    assert_eq!(qmp_writes(&stats), (Some(true), Some("qmp".to_owned())));

    // QMP goes away: its counters become unavailable instead of going stale; the rest stays.
    halts.store(u64::MAX, Ordering::SeqCst);
    observer.tick();
    let vm = observer.vms().next().unwrap();
    assert!(!vm.has_qmp_stats());
    assert!(vm.qmp_error().is_some());
    let unavailable = vm.unavailable();
    assert!(unavailable.contains(&vp::HLT_INSTRUCTIONS));
    assert!(!unavailable.contains(&vp::CPUID_INSTRUCTIONS));
    assert_eq!(page.get(vp::HLT_INSTRUCTIONS), 12);
    // The page says so: QMP down, and no source writes its counters.
    assert_eq!(qmp_writes(&stats), (Some(false), None));
    assert!(unavailable_on_page(&runtime, vp::HLT_INSTRUCTIONS));
    let commands = server.join().unwrap();
    assert_eq!(&commands[..2], ["qmp_capabilities", "query-name"]);
    assert!(commands.iter().filter(|c| *c == "query-stats").count() >= 4);

    // QMP comes back (a QEMU whose monitor answers again): the page says it is up and writes
    // KVM's counters again, with KVM's values now.
    std::fs::remove_file(&sock).unwrap();
    halts.store(20, Ordering::SeqCst);
    let server = serve(UnixListener::bind(&sock).unwrap(), tid, halts.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    while !observer.vms().next().unwrap().has_qmp_stats() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
        observer.tick();
    }
    assert!(observer.vms().next().unwrap().has_qmp_stats(), "QMP is read again after its backoff");
    assert_eq!(qmp_writes(&stats), (Some(true), Some("qmp".to_owned())));
    assert!(!unavailable_on_page(&runtime, vp::HLT_INSTRUCTIONS));
    assert_eq!(page.get(vp::HLT_INSTRUCTIONS), 20);
    drop(observer);
    server.join().unwrap();
}

/// True when the index published under `runtime` declares VP counter `counter` of its one
/// partition unavailable, as a reader sees it.
fn unavailable_on_page(runtime: &std::path::Path, counter: hvstats_abi::CounterId) -> bool {
    let mut attach = hvstats::attach::Attach::new(runtime);
    attach.refresh().unwrap();
    let info = attach.instances().next().unwrap().partitions()[0].clone();
    info.is_unavailable(hvstats_abi::ObjectKind::Vp, counter.slot())
}
