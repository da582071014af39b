//! `hvstats observe` as a command: attach and detach lines, publication that `snapshot` reads,
//! exit when the observed process is gone, SIGTERM, and flag errors. Without KVM the observed
//! "VM" is this test process described by a fake procfs tree (`--proc-root`), whose vCPU thread
//! is a real thread of this process: the observer's counters on it are real.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::TempDir;
use serde_json::Value;

fn gettid() -> i32 {
    // SAFETY: gettid has no arguments and no memory effects.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// `proc/<pid>` describing this process as QEMU with one vCPU run by thread `vcpu_tid`.
/// The `-uuid` of the fake QEMU (as libvirt passes it, in upper case).
const UUID: &str = "6B29FC40-CA47-1067-B31D-00DD010662DA";

fn fake_qemu(root: &Path, vcpu_tid: i32) -> std::path::PathBuf {
    let pid = std::process::id();
    let dir = root.join(pid.to_string());
    std::fs::create_dir_all(dir.join("fd")).unwrap();
    symlink("anon_inode:kvm-vm", dir.join("fd/4")).unwrap();
    symlink("anon_inode:kvm-vcpu:0", dir.join("fd/5")).unwrap();
    std::fs::write(dir.join("cmdline"), format!(
            "qemu-system-x86_64\0-name\0guest=cli-vm\0-uuid\0{UUID}\0-cpu\0host,hv-relaxed=on,hv_vpindex,hv-synic=off\0"
        ))
        .unwrap();
    std::fs::write(dir.join("comm"), "qemu-system-x86\n").unwrap();
    std::fs::write(dir.join("status"), "State:\tS (sleeping)\n").unwrap();
    std::fs::write(dir.join("stat"), fake_stat(pid as i32, "qemu-system-x86")).unwrap();
    fake_task(&dir, vcpu_tid, "CPU 0/KVM");
    // Its scheduler accounting is the real thread's: run time, CPU wait, dispatches.
    let real = format!("/proc/{pid}/task/{vcpu_tid}/schedstat");
    symlink(real, dir.join("task").join(vcpu_tid.to_string()).join("schedstat")).unwrap();
    dir
}

/// A `stat` line whose start time (field 22) is 1000 and every other field 0.
fn fake_stat(pid: i32, comm: &str) -> String {
    let mut fields: Vec<String> = (3..=52).map(|_| "0".to_owned()).collect();
    fields[0] = "S".to_owned();
    fields[22 - 3] = "1000".to_owned();
    format!("{pid} ({comm}) {}\n", fields.join(" "))
}

/// `task/<tid>` of the fake process at `dir`: its name and `stat`.
fn fake_task(dir: &Path, tid: i32, comm: &str) {
    let task = dir.join("task").join(tid.to_string());
    std::fs::create_dir_all(&task).unwrap();
    std::fs::write(task.join("comm"), format!("{comm}\n")).unwrap();
    std::fs::write(task.join("stat"), fake_stat(tid, comm)).unwrap();
}

/// Starts `hvstats observe` and a thread forwarding its stderr lines.
/// `observe` of `target` (`--pid N` or `--all`) every 50 ms over the fake /proc at `proc_root`,
/// publishing under `runtime`.
fn observe_fake(target: &[&str], runtime: &Path, proc_root: &Path) -> (Child, mpsc::Receiver<String>) {
    let (runtime, proc_root) = (runtime.to_str().unwrap(), proc_root.to_str().unwrap());
    let args = [target, &["--interval", "0.05", "--runtime-dir", runtime, "--proc-root", proc_root]].concat();
    observe(&args)
}

fn observe(args: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .arg("observe")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

fn wait_line(rx: &mpsc::Receiver<String>, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return line,
            Ok(line) => seen.push(line),
            Err(e) => panic!("no line containing {needle:?}: {e}; the lines before: {seen:#?}"),
        }
    }
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "hvstats observe did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn snapshot(runtime: &Path) -> Value {
    common::snapshot_json(runtime)
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec the kernel writes into.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[test]
fn observe_publishes_what_snapshot_shows_and_leaves_when_the_process_exits() {
    let tmp = TempDir::new("observe-cli");
    let runtime = tmp.path().join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    // The "vCPU": a thread that spins when told to and reports the CPU time it used.
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (tid_tx, tid_rx) = mpsc::channel();
    let (used_tx, used_rx) = mpsc::channel();
    std::thread::spawn(move || {
        tid_tx.send(gettid()).unwrap();
        for () in go_rx {
            let start = thread_cpu_ns();
            let t = Instant::now();
            while t.elapsed() < Duration::from_millis(200) {
                std::hint::spin_loop();
            }
            used_tx.send(thread_cpu_ns() - start).unwrap();
        }
    });
    let tid = tid_rx.recv().unwrap();
    let proc_root = tmp.path().join("proc");
    let fake = fake_qemu(&proc_root, tid);
    let pid = std::process::id().to_string();
    let (mut child, lines) = observe_fake(&["--pid", &pid], &runtime, &proc_root);
    let attach = wait_line(&lines, "attach pid");
    assert!(attach.contains("\"cli-vm\": 1 vCPUs as partition 1"), "{attach}");
    let known = wait_line(&lines, "vCPU threads");
    assert!(known.contains(&format!("[{tid}]")), "{known}");

    go_tx.send(()).unwrap();
    let used_ns = used_rx.recv().unwrap();
    // Until a refresh (every 50 ms) has published the spin, however busy the host.
    let total_run = |v: &Value| {
        let of_observer = v["instances"].as_array().and_then(|i| i.iter().find(|i| i["pid"] == child.id()));
        of_observer
            .and_then(|i| i["partitions"][0]["vps"][0]["counters"][common::total("Total run time")].as_u64())
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let v = loop {
        let v = snapshot(&runtime);
        if total_run(&v).is_some_and(|t| t >= used_ns / 100 * 95 / 100) {
            break v;
        }
        assert!(Instant::now() < deadline, "the {used_ns} ns spun never reached the VP's run time: {v}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let observer = v["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["pid"] == child.id())
        .expect("the observer's instance is listed");
    assert_eq!(observer["kind"], "observer");
    let partitions = observer["partitions"].as_array().unwrap();
    assert_eq!(partitions.len(), 1);
    assert_eq!(partitions[0]["name"], "cli-vm");
    // Which VMM process runs it, so two VMs of one name are told apart and joined to the VMM.
    assert_eq!(partitions[0]["vmm"]["kind"], "qemu");
    assert_eq!(partitions[0]["vmm"]["pid"], std::process::id());
    // Its UUID, as QEMU was given it, to join the VM to the tools that manage it.
    let uuid = UUID.to_lowercase();
    assert_eq!(partitions[0]["uuid"], uuid.as_str());
    let metrics = common::scrape(&runtime);
    let info = metrics.lines().find(|l| l.starts_with("hvstats_vm_info{") && l.contains("vm=\"cli-vm\""));
    assert!(info.is_some_and(|l| l.contains(&format!("uuid=\"{uuid}\""))), "{metrics}");
    // Its Hyper-V enlightenments, as QEMU's -cpu gives them.
    assert_eq!(partitions[0]["hyperv_enlightenments"], serde_json::json!(["hv-relaxed", "hv-vpindex"]));
    assert!(info.is_some_and(|l| l.contains("hyperv_enlightenments=\"hv-relaxed,hv-vpindex\"")), "{metrics}");
    let vps = partitions[0]["vps"].as_array().unwrap();
    assert_eq!(vps.len(), 1);
    let total = vps[0]["counters"][common::total("Total run time")].as_u64().unwrap();
    assert!(total >= used_ns / 100 * 95 / 100, "total run time {total} covers the {used_ns} ns spun");
    assert_eq!(vps[0]["counters"][common::total("CPUID instructions/sec")], 0);
    // No QMP and no kvm_exit on this host: HLT is not available (null), not 0.
    assert!(vps[0]["counters"][common::total("HLT instructions/sec")].is_null(), "{}", vps[0]);
    // Without kvm_exit, Hypercalls cost is the Hyper-V hypercalls' time (kvm_hv_hypercall to its
    // completion), counted where the kernel has the tracepoints: this thread made none.
    let hv_traced = std::path::Path::new("/sys/kernel/tracing/events/kvm/kvm_hv_hypercall").exists();
    let cost = &vps[0]["counters"][common::total("Hypercalls cost")];
    assert!(if hv_traced { *cost == 0 } else { cost.is_null() }, "{cost}");

    // The process "exits": the observer detaches and, with only --pid, ends.
    std::fs::write(fake.join("status"), "State:\tZ (zombie)\n").unwrap();
    let detach = wait_line(&lines, "detach pid");
    assert!(detach.contains("cli-vm"), "{detach}");
    assert!(wait_exit(&mut child).success());
    let v = snapshot(&runtime);
    assert!(v["instances"].as_array().unwrap().iter().all(|i| i["pid"] != child.id()), "instance gone: {v}");
}

#[test]
fn sigterm_ends_the_observer_and_removes_its_instance() {
    let tmp = TempDir::new("observe-term");
    let runtime = tmp.path().join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    let proc_root = tmp.path().join("proc");
    fake_qemu(&proc_root, gettid());
    let (mut child, lines) = observe_fake(&["--all"], &runtime, &proc_root);
    wait_line(&lines, "attach pid");
    assert_eq!(snapshot(&runtime)["instances"].as_array().unwrap().len(), 1);
    // SAFETY: kill has no memory effects; the pid is our child's.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    wait_line(&lines, "SIGTERM");
    assert!(wait_exit(&mut child).success());
    assert!(snapshot(&runtime)["instances"].as_array().unwrap().is_empty());
}

#[test]
fn bad_flags_and_processes_without_a_vm_are_clear_errors() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_hvstats")).arg("observe").args(args).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ok, err) = run(&[]);
    assert!(!ok && err.contains("--pid"), "{err}");
    let (ok, err) = run(&["--pid", "0"]);
    assert!(!ok && err.contains("--pid 0: not a process id"), "{err}");
    let (ok, err) = run(&["--pid", "1", "--pid", "2", "--qmp", "/tmp/x"]);
    assert!(!ok && err.contains("give one --pid with it, or none"), "{err}");
    let (ok, err) = run(&["--all", "--qmp", "/tmp/x"]);
    assert!(!ok && err.contains("cannot be used with"), "{err}");
    let (ok, err) = run(&["--all", "--vm", "db-("]);
    assert!(!ok && err.contains("\"db-(\" is not a pid, a UUID or a regular expression"), "{err}");
    let (ok, err) = run(&["--pid", "1", "--interval", "0"]);
    assert!(!ok && err.contains("interval"), "{err}");
    let (ok, err) = run(&["--pid", "1", "--all"]);
    assert!(!ok && err.contains("cannot be used with"), "{err}");
    // This test process holds no VM: a clear error, and the observer ends with failure.
    let tmp = TempDir::new("observe-novm");
    let pid = std::process::id().to_string();
    let (ok, err) =
        run(&["--pid", &pid, "--runtime-dir", tmp.path().to_str().unwrap(), "--interval", "0.05"]);
    assert!(!ok, "{err}");
    assert!(err.contains(&format!("cannot observe pid {pid}: process {pid} holds no KVM VM")), "{err}");
}

#[test]
fn a_killed_observer_leaves_no_instance_readers_show() {
    let tmp = TempDir::new("observe-kill");
    let runtime = tmp.path().join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    let proc_root = tmp.path().join("proc");
    fake_qemu(&proc_root, gettid());
    let pid = std::process::id().to_string();
    let (mut child, lines) = observe_fake(&["--pid", &pid], &runtime, &proc_root);
    wait_line(&lines, "attach pid");
    assert_eq!(snapshot(&runtime)["instances"].as_array().unwrap().len(), 1);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        snapshot(&runtime)["instances"].as_array().unwrap().is_empty(),
        "a dead observer's instance is not shown"
    );
}

#[test]
fn sigterm_stops_the_observer_within_a_second_while_a_qmp_peer_drips() {
    use std::io::Write;
    let tmp = TempDir::new("observe-drip");
    let runtime = tmp.path().join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    let proc_root = tmp.path().join("proc");
    fake_qemu(&proc_root, gettid());
    // A QMP peer that sends its greeting one byte every 0.3 s and never finishes it: each read
    // gets a byte, so only a deadline on the whole exchange, or the signal, ends the wait.
    let sock = tmp.path().join("drip.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let (accepted_tx, accepted_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        accepted_tx.send(()).unwrap();
        while s.write_all(b" ").is_ok() {
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    let pid = std::process::id().to_string();
    let (runtime_s, proc_s, sock_s) =
        (runtime.to_str().unwrap(), proc_root.to_str().unwrap(), sock.to_str().unwrap());
    let (mut child, _lines) = observe(&[
        "--pid",
        &pid,
        "--qmp",
        sock_s,
        "--interval",
        "0.05",
        "--runtime-dir",
        runtime_s,
        "--proc-root",
        proc_s,
    ]);
    accepted_rx.recv_timeout(Duration::from_secs(20)).expect("the observer connects to QMP");
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    // SAFETY: kill has no memory effects; the pid is our child's.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = wait_exit(&mut child);
    assert!(t.elapsed() < Duration::from_secs(1), "stopped after {:?}", t.elapsed());
    assert!(status.success(), "{status}");
    let left: Vec<_> =
        std::fs::read_dir(runtime.join("instances")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "the instance's files are removed: {left:?}");
}

/// A process's peak resident memory (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A memfd laid out as KVM's statistics of vCPU 0 whose one statistic lies 256 MiB into its
/// data block, and which is that long (sparse): what a VMM can `dup2` into the number its `fd`
/// directory just listed as `anon_inode:kvm-vcpu-stats:0`.
fn crafted_stats_file() -> std::fs::File {
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::FileExt;
    const DATA: u32 = 4096;
    const CLAIMED: u32 = 256 << 20;
    // SAFETY: a literal name and no flags; the result is checked before it is owned.
    let fd = unsafe { libc::memfd_create(c"crafted-stats".as_ptr(), 0) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // Above the numbers the fake `fd` directory lists for the VM and its vCPU (4 and 5), which a
    // test process with few descriptors open would otherwise be given.
    // SAFETY: fcntl on the descriptor just made; the copy is checked before it is owned.
    let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 100) };
    assert!(high >= 100, "F_DUPFD: {}", std::io::Error::last_os_error());
    // SAFETY: the descriptors the kernel just gave us; nothing else owns them.
    let (file, _low) = unsafe { (std::fs::File::from_raw_fd(high), std::fs::File::from_raw_fd(fd)) };
    file.set_len(u64::from(DATA + CLAIMED)).unwrap();
    // flags, name_size, num_desc, id_offset, desc_offset, data_offset.
    let header: Vec<u8> = [0u32, 48, 1, 24, 72, DATA].iter().flat_map(|w| w.to_le_bytes()).collect();
    file.write_all_at(&header, 0).unwrap();
    file.write_all_at(b"kvm-1/vcpu-0", 24).unwrap();
    let mut desc = vec![0u8; 64];
    desc[6..8].copy_from_slice(&1u16.to_le_bytes());
    desc[8..12].copy_from_slice(&(CLAIMED - 8).to_le_bytes());
    desc[16..26].copy_from_slice(b"halt_exits");
    file.write_all_at(&desc, 72).unwrap();
    file
}

#[test]
fn a_file_dup2d_behind_a_stats_descriptor_is_refused_and_allocates_nothing() {
    use std::os::fd::AsRawFd;
    // SAFETY: geteuid has no memory effects.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping: copying another process's descriptor needs root");
        return;
    }
    let tmp = TempDir::new("observe-crafted-stats");
    let runtime = tmp.path().join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    let proc_root = tmp.path().join("proc");
    let fake = fake_qemu(&proc_root, gettid());
    // The VMM's `fd` directory as the observer read it, and what the number held by the time it
    // was copied: the crafted file, not KVM's statistics.
    let crafted = crafted_stats_file();
    let fd = crafted.as_raw_fd();
    symlink("anon_inode:kvm-vcpu-stats:0", fake.join(format!("fd/{fd}"))).unwrap();
    let pid = std::process::id().to_string();
    let (child, lines) = observe_fake(&["--pid", &pid], &runtime, &proc_root);
    let child = common::KilledOnDrop(child);
    // A VM is read once as it is attached: a block read then is in the peak by its attach line.
    let attach = wait_line(&lines, "attach pid");
    let peak = peak_rss_kib(child.0.id());
    eprintln!("{attach}; the observer's peak resident memory: {peak} KiB");
    assert!(peak < 64 << 10, "the observer's peak resident memory is {peak} KiB");
    let refused = wait_line(&lines, "stats-fd refused");
    assert!(
        refused.contains(&format!(
            "descriptor {fd}, listed as \"anon_inode:kvm-vcpu-stats:0\": it is a file, not KVM's"
        )),
        "{refused}"
    );
    // The refusal is said while the VM is attached; its partition is published after.
    let t = Instant::now();
    let observer = loop {
        let v = snapshot(&runtime);
        let found = v["instances"].as_array().unwrap().iter().find(|i| i["pid"] == child.0.id()).cloned();
        if let Some(o) = found.filter(|o| o["partitions"][0]["sources"].is_array()) {
            break o;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the observer never published the VM: {v}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let sources = observer["partitions"][0]["sources"].as_array().unwrap();
    let stats_fd = sources.iter().find(|s| s["name"] == "stats-fd").expect("the source is listed");
    assert_eq!(stats_fd["up"], false, "{sources:?}");
    let vp = &observer["partitions"][0]["vps"][0]["counters"];
    assert!(vp[common::total("HLT instructions/sec")].is_null(), "{vp}");
    // Said once, as the VM was attached, however many refreshes since.
    let t = Instant::now();
    let mut again = Vec::new();
    while t.elapsed() < Duration::from_millis(500) {
        again.extend(lines.try_iter().filter(|l| l.contains("stats-fd refused")));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(again.is_empty(), "{again:?}");
    eprintln!("{refused}");
    drop((child, crafted));
}

/// `count` threads of this process that park until `release` is dropped; their thread ids.
fn parked_threads(count: usize) -> (Vec<i32>, mpsc::Sender<()>) {
    let (release, parked) = mpsc::channel::<()>();
    let parked = std::sync::Arc::new(std::sync::Mutex::new(parked));
    let (tid_tx, tid_rx) = mpsc::channel();
    for _ in 0..count {
        let (parked, tid_tx) = (parked.clone(), tid_tx.clone());
        std::thread::Builder::new()
            .stack_size(64 << 10)
            .spawn(move || {
                tid_tx.send(gettid()).unwrap();
                // Every thread waits on the one channel; all wake when the sender is dropped.
                let _ = parked.lock().map(|r| r.recv());
            })
            .unwrap();
    }
    let tids = (0..count).map(|_| tid_rx.recv().unwrap()).collect();
    (tids, release)
}

#[test]
fn a_vmm_with_more_threads_than_descriptors_is_observed_within_a_budget_and_never_called_exited() {
    use std::os::unix::process::CommandExt;
    let tmp = TempDir::new("observe-fds");
    let runtime = tmp.path().join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    let proc_root = tmp.path().join("proc");
    // This process as a QEMU whose one vCPU thread has no telling name, with 300 real threads:
    // 16 counters each would need 4800 descriptors of the observer's 1024.
    let (tids, release) = parked_threads(300);
    let dir = fake_qemu(&proc_root, tids[0]);
    std::fs::write(dir.join("task").join(tids[0].to_string()).join("comm"), "worker\n").unwrap();
    for tid in &tids[1..] {
        fake_task(&dir, *tid, "worker");
    }
    let pid = std::process::id().to_string();
    let mut command = Command::new(env!("CARGO_BIN_EXE_hvstats"));
    command
        .args(["observe", "--pid", &pid, "--interval", "0.05", "--runtime-dir"])
        .arg(&runtime)
        .arg("--proc-root")
        .arg(&proc_root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: the closure only calls setrlimit, which is async-signal-safe, between fork and exec.
    unsafe {
        command.pre_exec(|| {
            let lim = libc::rlimit { rlim_cur: 1024, rlim_max: 1024 };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let attach = wait_line(&lines, "attach pid");
    assert!(attach.contains("of 300 threads"), "{attach}");
    assert!(attach.contains("left out"), "{attach}");
    // A second of refreshes: the process lives, so no line may say it exited, and the observer
    // keeps running with room to spare under its limit.
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        child.try_wait().unwrap().is_none(),
        "observe exited: {:?}",
        lines.try_iter().collect::<Vec<_>>()
    );
    let open = std::fs::read_dir(format!("/proc/{}/fd", child.id())).unwrap().count();
    assert!(open < 1024 - 64, "{open} descriptors open of 1024");
    let said: Vec<String> = lines.try_iter().collect();
    assert!(!said.iter().any(|l| l.contains("exited")), "{said:?}");
    // Readers still get in: the observer's instance and its one partition.
    let v = snapshot(&runtime);
    assert_eq!(v["instances"][0]["partitions"].as_array().map(Vec::len), Some(1), "{v}");
    // SAFETY: kill has no memory effects; the pid is our child's.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    assert!(wait_exit(&mut child).success());
    drop(release);
}

#[test]
fn a_second_observer_of_the_same_runtime_directory_is_refused_and_leaves_the_first_alone() {
    let tmp = TempDir::new("observe-twice");
    let runtime = tmp.path().join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    let proc_root = tmp.path().join("proc");
    fake_qemu(&proc_root, gettid());
    let pid = std::process::id().to_string();
    let (mut first, first_lines) = observe_fake(&["--pid", &pid], &runtime, &proc_root);
    wait_line(&first_lines, "attach pid");
    let mark = std::fs::read_to_string(runtime.join("observer")).unwrap();
    let claims = || -> Vec<_> {
        std::fs::read_dir(runtime.join("observed")).unwrap().map(|e| e.unwrap().file_name()).collect()
    };
    let claimed = claims();
    assert_eq!(claimed.len(), 1, "{claimed:?}");

    // A second observer of the same runtime directory, of any kind: refused at start, naming the
    // first, before it adopts, claims, publishes or marks anything.
    for target in [&["--pid", pid.as_str()][..], &["--all"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
            .arg("observe")
            .args(target)
            .args(["--interval", "0.05", "--runtime-dir", runtime.to_str().unwrap(), "--proc-root"])
            .arg(&proc_root)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{said}");
        let refusal = said.lines().find(|l| l.contains("another observer already observes under")).unwrap();
        assert!(refusal.contains(&format!("pid {} (`", first.id())), "{refusal}");
        assert!(refusal.contains("observe --pid") && refusal.contains("since 20"), "{refusal}");
        assert!(!said.contains("adopted") && !said.contains("publishing"), "{said}");
    }
    // The first's mark, claim and instance are as they were, and it goes on refreshing its VM.
    assert_eq!(std::fs::read_to_string(runtime.join("observer")).unwrap(), mark);
    assert_eq!(claims(), claimed);
    let v = snapshot(&runtime);
    let observers: Vec<&Value> = v["instances"].as_array().unwrap().iter().collect();
    assert_eq!(observers.len(), 1, "{v}");
    assert_eq!(
        (observers[0]["pid"].as_u64(), observers[0]["partitions"][0]["name"].as_str()),
        (Some(first.id().into()), Some("cli-vm"))
    );
    let refreshed = || -> f64 {
        let m = common::scrape(&runtime);
        let line = m.lines().find(|l| l.starts_with("hvstats_observer_last_refresh_timestamp_seconds{"));
        let up = format!("hvstats_observer_up{{publisher=\"{}\"}}", mark.trim_end());
        assert_eq!(common::sample(&m, &up).as_deref(), Some("1"), "{m}");
        line.and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or_else(|| panic!("{m}"))
    };
    let before = refreshed();
    let deadline = Instant::now() + Duration::from_secs(20);
    while refreshed() <= before {
        assert!(Instant::now() < deadline, "the first observer stopped refreshing");
        std::thread::sleep(Duration::from_millis(50));
    }

    // Killed outright, the first holds nothing more: a new observer starts and takes the VM.
    first.kill().unwrap();
    first.wait().unwrap();
    let (mut next, next_lines) = observe_fake(&["--all"], &runtime, &proc_root);
    wait_line(&next_lines, &format!("attach pid {pid}"));
    // SAFETY: kill has no memory effects; the pid is our child's.
    assert_eq!(unsafe { libc::kill(next.id() as i32, libc::SIGTERM) }, 0);
    assert!(wait_exit(&mut next).success());
}

#[test]
fn a_real_vmm_with_3000_threads_gets_a_bounded_number_of_counters() {
    if !common::kvm_available("a_real_vmm_with_3000_threads_gets_a_bounded_number_of_counters") {
        return;
    }
    let tmp = TempDir::new("observe-3000");
    let runtime = tmp.path().join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    // This process holds a KVM VM with one vCPU, and 3000 more threads: a VMM as the host's
    // /proc shows it.
    let _vm = common::hold_a_vm();
    let (_tids, release) = parked_threads(3000);
    let pid = std::process::id().to_string();
    let (mut child, lines) =
        observe(&["--pid", &pid, "--interval", "0.1", "--runtime-dir", runtime.to_str().unwrap()]);
    let attach = wait_line(&lines, "attach pid");
    // One vCPU plus 256 other threads, 16 counters each (31 on VMX/SVM hosts), not one group
    // per thread of the 3000.
    assert!(attach.contains(" on 257 of "), "{attach}");
    assert!(attach.contains("left out: descriptor budget"), "{attach}");
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.try_wait().unwrap().is_none(), "observe exited");
    let open = std::fs::read_dir(format!("/proc/{}/fd", child.id())).unwrap().count();
    assert!(open <= 257 * 31 + 64, "{open} descriptors open");
    // SAFETY: kill has no memory effects; the pid is our child's.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    assert!(wait_exit(&mut child).success());
    let said: Vec<String> = lines.try_iter().collect();
    assert!(!said.iter().any(|l| l.contains("exited") || l.contains("cannot")), "{said:?}");
    drop(release);
}

#[test]
fn a_pid_of_another_user_the_observer_may_not_read_is_refused_with_the_fix() {
    if Command::new("setpriv").arg("--version").output().is_err() {
        assert!(std::env::var("CI").is_err(), "setpriv (util-linux) is missing");
        return;
    }
    // A process of nobody's; the observer with the capabilities of hvstats-observe.service but
    // CAP_DAC_READ_SEARCH, as the unit had them before.
    let mut other = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "sleep", "60"])
        .spawn()
        .unwrap();
    let pid = other.id();
    let t = Instant::now();
    let uid = |pid: u32| {
        std::fs::metadata(format!("/proc/{pid}")).ok().map(|m| std::os::unix::fs::MetadataExt::uid(&m))
    };
    while uid(pid) != Some(65534) {
        assert!(t.elapsed() < Duration::from_secs(10), "the process did not become nobody's");
        std::thread::sleep(Duration::from_millis(10));
    }
    let tmp = TempDir::new("observe-refused");
    let out = Command::new("setpriv")
        .args(["--bounding-set=-all,+sys_ptrace,+perfmon,+bpf", "--inh-caps=-all", "--no-new-privs"])
        .arg(env!("CARGO_BIN_EXE_hvstats"))
        .args(["observe", "--pid", &pid.to_string(), "--interval", "0.05", "--runtime-dir"])
        .arg(tmp.path())
        .output()
        .unwrap();
    let _ = other.kill();
    let _ = other.wait();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("cannot observe pid {pid}: cannot read the descriptors of process {pid} (a process of uid 65534): Permission denied"))
            && err.contains("reason no_cap_dac_read_search; fix: give the observer CAP_DAC_READ_SEARCH"),
        "{err}"
    );
}
