//! Why the observer does not observe a VM, and what its log says while VMs come and go: real
//! KVM VMs held by `nobody` (stand-in VMMs, `FakeVmm`), the observer run with the capabilities of
//! its unit less one (`setpriv`), or as root.
//!
//! - each capability the unit gives, missing, is one line at start naming it, what it costs and
//!   the unit line that gives it; the VMs it hides are counted as refused with its reason (the
//!   snapshot's row of that reason), and a VM only some sources can count is attached;
//! - a VM the filter leaves out is said once, however long it lives;
//! - sixty short VMs in twenty seconds make at most forty log lines, and a summary;
//! - a VM of 1,024 vCPUs is admitted by what counting in the kernel costs, not perf's.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{FAKE_VMM_VCPUS, FakeVmm, Running, TempDir, as_nobody, kvm_available, total};
use serde_json::Value;

/// Not a test: the body of the stand-in VMMs the tests below start (`FakeVmm`).
#[test]
#[ignore = "run by the tests below as a stand-in VMM"]
fn fake_vmm() {
    common::fake_vmm_body();
}

/// One observer of the host at a time: each test's counts are of its own VMs only.
static HOST_WIDE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn host_wide() -> std::sync::MutexGuard<'static, ()> {
    HOST_WIDE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The capabilities of the observer's unit (packaging/systemd/hvstats-observe.service), as
/// setpriv names them.
fn unit_capabilities() -> Vec<String> {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../packaging/systemd/hvstats-observe.service"
    ))
    .unwrap();
    let line = unit.lines().find_map(|l| l.strip_prefix("CapabilityBoundingSet=")).unwrap();
    line.split_whitespace().map(|c| c.trim_start_matches("CAP_").to_lowercase()).collect()
}

/// `hvstats observe --all ARGS` with the unit's capabilities less `without` (as setpriv names it)
/// and no new privileges, publishing under `runtime`.
fn observe_without(without: &str, args: &[&str], runtime: &Path) -> Running {
    let bounding: String =
        unit_capabilities().iter().filter(|c| *c != without).map(|c| format!(",+{c}")).collect();
    let mut command = Command::new("setpriv");
    command
        .arg(format!("--bounding-set=-all{bounding}"))
        .args(["--inh-caps=-all", "--ambient-caps=-all", "--no-new-privs"])
        .arg(env!("CARGO_BIN_EXE_hvstats"))
        .args(["observe", "--all"])
        .args(args)
        .arg("--runtime-dir")
        .arg(runtime);
    Running::spawn(command)
}

/// A stand-in VMM run as `nobody`, holding a real KVM VM of `vcpus` vCPUs named `name`.
fn nobody_vmm(name: &str, vcpus: u32) -> FakeVmm {
    FakeVmm::spawn_with(&["-name", name], "CPU 0/KVM", |c| {
        as_nobody(c);
        c.env(FAKE_VMM_VCPUS, vcpus.to_string());
    })
}

/// The counter `name` of the observer's instance in a snapshot.
fn observer_counter(snapshot: &Value, name: &str) -> Option<u64> {
    let key = total(name);
    snapshot["instances"].as_array()?.iter().find_map(|i| i["hypervisor"]["counters"][&key].as_u64())
}

/// The partition of the VMM `pid` in a snapshot.
fn partition_of(snapshot: &Value, pid: i32) -> Option<&Value> {
    snapshot["instances"].as_array()?.iter().find_map(|i| {
        i["partitions"].as_array()?.iter().find(|p| p["vmm"]["pid"].as_i64() == Some(i64::from(pid)))
    })
}

/// Whether source `source` of partition `p` is up.
fn source_up(p: &Value, source: &str) -> Option<bool> {
    p["sources"].as_array()?.iter().find(|s| s["name"] == source).and_then(|s| s["up"].as_bool())
}

/// Takes snapshots of `runtime` until `done` holds (at most a minute); the last.
fn snapshot_until(runtime: &Path, what: &str, mut done: impl FnMut(&Value) -> bool) -> Value {
    let t = Instant::now();
    loop {
        let s = common::snapshot_json(runtime);
        if done(&s) {
            return s;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "{what}: not reached in a minute:\n{s:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// True when setpriv is here; a failure under CI.
fn setpriv_present(test: &str) -> bool {
    if Command::new("setpriv").arg("--version").output().is_ok() {
        return true;
    }
    assert!(std::env::var("CI").is_err(), "setpriv (util-linux) is missing");
    eprintln!("{test}: setpriv is missing: skipped");
    false
}

#[test]
fn each_missing_capability_is_one_line_and_the_vms_it_hides_are_refused_for_it() {
    let test = "each_missing_capability_is_one_line_and_the_vms_it_hides_are_refused_for_it";
    if !kvm_available(test) || !setpriv_present(test) {
        return;
    }
    let _host = host_wide();
    // (capability, the row its hidden VMs are counted in, or None: the VM is attached)
    let cases = [
        ("sys_ptrace", Some("Observer VMs refused: no CAP_SYS_PTRACE")),
        ("dac_read_search", Some("Observer VMs refused: no CAP_DAC_READ_SEARCH")),
        ("perfmon", None),
        ("bpf", None),
    ];
    for (cap, row) in cases {
        let name = format!("capvm-{cap}-{}", std::process::id());
        let vmm = nobody_vmm(&name, 1);
        let pid = vmm.pid();
        let tmp = TempDir::new(&format!("observe-without-{cap}"));
        let observer = observe_without(cap, &["--vm", &name, "--interval", "0.2"], tmp.path());
        let upper = format!("CAP_{}", cap.to_uppercase());
        let line = observer.wait_line(&format!("{upper} is missing"));
        assert!(line.contains("CapabilityBoundingSet=") && line.contains(&upper), "{line}");
        match row {
            Some(row) => {
                let reason = format!("no_cap_{cap}");
                let refused = observer.wait_line(&format!("refused pid {pid} "));
                assert!(
                    refused.contains(&format!("(reason {reason})")) && refused.contains(&upper),
                    "{refused}"
                );
                let s = snapshot_until(tmp.path(), "refused for its reason", |s| {
                    observer_counter(s, row) == Some(1)
                });
                assert_eq!(observer_counter(&s, "Observer VMs refused"), Some(1), "{s:#}");
                assert_eq!(observer_counter(&s, "Observer VMs attached"), Some(0), "{s:#}");
            }
            None => {
                observer.wait_line(&format!("attach pid {pid} "));
                let s = snapshot_until(tmp.path(), "attached", |s| partition_of(s, pid).is_some());
                assert_eq!(observer_counter(&s, "Observer VMs refused"), Some(0), "{s:#}");
                if cap == "perfmon" {
                    // Counted by its KVM statistics descriptors; its threads cannot be: said down.
                    let p = partition_of(&s, pid).unwrap();
                    assert_eq!(source_up(p, "tracepoints"), Some(false), "{p:#}");
                    assert_eq!(source_up(p, "thread-clock"), Some(false), "{p:#}");
                }
            }
        }
        std::thread::sleep(Duration::from_secs(1));
        // The line waited for above is taken: no other.
        let again = observer.lines_with("is missing");
        assert!(again.is_empty(), "one line for the one capability missing: {again:?}");
        let os_errors = observer.lines_with("os error");
        let refused_program = os_errors.iter().filter(|l| l.contains("BPF") || l.contains("program")).count();
        assert_eq!(refused_program, 0, "no line of the errors a missing capability causes: {os_errors:?}");
        drop(observer);
        drop(vmm);
    }
}

#[test]
fn sixty_short_vms_in_twenty_seconds_make_at_most_forty_log_lines_and_a_summary() {
    let test = "sixty_short_vms_in_twenty_seconds_make_at_most_forty_log_lines_and_a_summary";
    if !kvm_available(test) {
        return;
    }
    let _host = host_wide();
    let tmp = TempDir::new("observe-churn");
    // Every VM of the host, as the unit observes them; a summary every 5 s rather than a minute.
    let args = ["observe", "--all", "--interval", "0.1"];
    let mut observer = Running::start_with(&args, tmp.path(), &[("HVSTATS_LOG_SUMMARY_SECONDS", "5")]);
    observer.wait_line("publishing observed VMs");
    let start = Instant::now();
    for i in 0..60u32 {
        let vmm = nobody_vmm(&format!("churn-{}-{i}", std::process::id()), 1);
        let until = start + Duration::from_millis(333 * u64::from(i + 1));
        std::thread::sleep(until.saturating_duration_since(Instant::now()));
        drop(vmm);
    }
    let summary = observer.wait_line("VMs came and went");
    assert!(summary.contains("attached") && summary.contains("log lines held back"), "{summary}");
    observer.terminate();
    std::thread::sleep(Duration::from_millis(200));
    // Every line of the run: the two waited for, and the rest.
    let lines = observer.lines_with("");
    eprintln!("{} log lines for 60 VMs in {:.1} s", lines.len() + 2, start.elapsed().as_secs_f64());
    assert!(lines.len() + 2 <= 40, "{} lines:\n{}", lines.len() + 2, lines.join("\n"));
}

#[test]
fn a_vm_of_1024_vcpus_is_admitted_by_what_counting_in_the_kernel_costs() {
    let test = "a_vm_of_1024_vcpus_is_admitted_by_what_counting_in_the_kernel_costs";
    if !kvm_available(test) {
        return;
    }
    let _host = host_wide();
    let name = format!("big-{}", std::process::id());
    let vmm = nobody_vmm(&name, 1024);
    let pid = vmm.pid();
    let tmp = TempDir::new("observe-1024");
    let observer = Running::start(&["observe", "--all", "--vm", &name, "--interval", "0.5"], tmp.path());
    let counting = observer.wait_line("counting");
    if !counting.contains("in-kernel") {
        assert!(std::env::var("HVSTATS_REQUIRE_KVM").is_err(), "BPF does not load here: {counting}");
        eprintln!("{test}: tracepoints are not counted in the kernel here ({counting}): skipped");
        return;
    }
    let attached = observer.wait_line(&format!("attach pid {pid} "));
    assert!(attached.contains("1024 vCPUs"), "{attached}");
    // Its thread list, said in ranges rather than 1,024 ids.
    let threads = observer.wait_line(&format!("pid {pid}: vCPU threads"));
    assert!(threads.contains("1024 threads: ") && threads.len() < 400, "{threads}");
    eprintln!("{attached}\n{threads}");
    let s = snapshot_until(tmp.path(), "the 1,024 VPs published", |s| {
        partition_of(s, pid).is_some_and(|p| p["vps"].as_array().is_some_and(|v| v.len() == 1024))
    });
    let p = partition_of(&s, pid).unwrap();
    assert_eq!(source_up(p, "tracepoints"), Some(true));
    assert_eq!(observer_counter(&s, "Observer VMs refused"), Some(0));
    assert!(observer.lines_with("descriptor_budget").is_empty());
}

#[test]
fn past_the_engines_rows_the_fallback_is_said_once_and_the_vm_names_its_costlier_source() {
    let test = "past_the_engines_rows_the_fallback_is_said_once_and_the_vm_names_its_costlier_source";
    if !kvm_available(test) {
        return;
    }
    let _host = host_wide();
    let name = format!("rows-{}", std::process::id());
    let vmm = nobody_vmm(&name, 4);
    let pid = vmm.pid();
    let tmp = TempDir::new("observe-rows");
    // An engine of 2 rows: the VM's 4 vCPU threads (and its other threads, at attach) do not fit.
    let args = ["observe", "--all", "--vm", &name, "--interval", "0.5"];
    let observer = Running::start_with(&args, tmp.path(), &[("HVSTATS_ENGINE_ROWS", "2")]);
    // The start's line (the fallback's line says "in-kernel counting:").
    let counting = observer.wait_line("observe: counting ");
    if !counting.contains("in-kernel") {
        assert!(std::env::var("HVSTATS_REQUIRE_KVM").is_err(), "BPF does not load here: {counting}");
        eprintln!("{test}: tracepoints are not counted in the kernel here ({counting}): skipped");
        return;
    }
    let said = observer.wait_line("rows are all in use");
    eprintln!("{said}");
    assert!(said.contains("in-kernel counting: the in-kernel counting engine's 2 rows"), "{said}");
    assert!(said.contains(&format!("of process {pid}")) && said.contains("perf counters a thread"), "{said}");
    let s = snapshot_until(tmp.path(), "its source named by its method", |s| {
        partition_of(s, pid).is_some_and(|p| source_up(p, "tracepoints-perf") == Some(true))
    });
    let p = partition_of(&s, pid).unwrap();
    assert_eq!(source_up(p, "tracepoints"), None, "one name for the source: {p:#}");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(observer.lines_with("rows are all in use").len(), 0, "said once");
    drop(observer);
    drop(vmm);
}

#[test]
fn the_vcpu_threads_are_read_by_the_task_iterator_and_without_it_the_fallback_is_said_once() {
    let test = "the_vcpu_threads_are_read_by_the_task_iterator_and_without_it_the_fallback_is_said_once";
    if !kvm_available(test) || !setpriv_present(test) {
        return;
    }
    let _host = host_wide();
    let name = format!("iter-{}", std::process::id());
    let vmm = nobody_vmm(&name, 2);
    let pid = vmm.pid();
    // The unit's capabilities: the threads' accounting is one walk of the VMM's threads, the
    // migrations with it; no thread clock.
    let tmp = TempDir::new("observe-thread-iter");
    let observer = observe_without("none", &["--vm", &name, "--interval", "0.2"], tmp.path());
    let s = snapshot_until(tmp.path(), "the threads read by the task iterator", |s| {
        partition_of(s, pid).is_some_and(|p| source_up(p, "thread-iter") == Some(true))
    });
    let p = partition_of(&s, pid).unwrap();
    assert_eq!((source_up(p, "thread"), source_up(p, "thread-clock")), (None, None), "{p:#}");
    assert!(observer.lines_with("task iterator").is_empty(), "nothing to say: {:?}", observer.lines_with(""));
    drop(observer);
    // Without CAP_BPF: the /proc files and the thread clock's perf counter, said once.
    let tmp = TempDir::new("observe-thread-iter-fallback");
    let observer = observe_without("bpf", &["--vm", &name, "--interval", "0.2"], tmp.path());
    let said = observer.wait_line("task iterator cannot be loaded");
    assert!(said.contains("in-kernel counting: ") && said.contains("CAP_BPF and CAP_PERFMON"), "{said}");
    assert!(said.contains("/proc files") && said.contains("perf counter from attach"), "{said}");
    let s = snapshot_until(tmp.path(), "the threads read from /proc", |s| {
        partition_of(s, pid).is_some_and(|p| source_up(p, "thread") == Some(true))
    });
    let p = partition_of(&s, pid).unwrap();
    assert_eq!((source_up(p, "thread-iter"), source_up(p, "thread-clock")), (None, Some(true)), "{p:#}");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(observer.lines_with("task iterator").len(), 0, "said once");
    drop(observer);
    drop(vmm);
}
