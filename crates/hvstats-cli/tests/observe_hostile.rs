//! Hostile VMMs and peers against `hvstats observe` and `serve --observe-all`, on the host's real
//! `/proc` with real processes: stand-in VMMs (this test binary run again, holding a KVM VM under
//! a QEMU command line) that `exec()` themselves, reuse a pid, call themselves `hvstats` or take a
//! running VM's name; a QMP peer naming other processes' threads as its vCPU threads; a `nobody`
//! process holding 400,000 descriptors. They need /dev/kvm and root (a host without KVM prints
//! "skipped"; `HVSTATS_REQUIRE_KVM=1` makes that a failure).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{FakeVmm, TempDir, kvm_available};
use serde_json::{Value, json};

const UUID_A: &str = "aaaaaaaa-1111-4111-8111-aaaaaaaaaaaa";

/// Held by each test whose observer watches every VM on the host (`--all`, `--observe-all`), and
/// by each test whose VMs share a name with theirs: one such observer at a time, so none connects
/// to the QMP socket of another test's QEMU, counts another test's processes or names a VM
/// `thief#2` beside another test's `thief`.
static HOST_WIDE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn host_wide() -> std::sync::MutexGuard<'static, ()> {
    HOST_WIDE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
const UUID_B: &str = "bbbbbbbb-2222-4222-8222-bbbbbbbbbbbb";

/// Not a test: the body of the stand-in VMMs the tests below start (`FakeVmm`).
#[test]
#[ignore = "run by the tests below as a stand-in VMM"]
fn fake_vmm() {
    common::fake_vmm_body();
}

/// Not a test: a stand-in for libvirt's socket at `HVSTATS_TEST_FAKE_LIBVIRT`, which says
/// "listening", takes every connection and counts the bytes it is sent, and once its standard
/// input closes says "accepted N, sent M bytes".
#[test]
#[ignore = "run by a_libvirt_socket_another_user_serves_and_a_vmm_copying_a_domains_uuid_are_refused"]
fn fake_libvirt() {
    use std::io::Read;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let Some(path) = std::env::var_os("HVSTATS_TEST_FAKE_LIBVIRT") else { return };
    let listener = UnixListener::bind(path).unwrap();
    let (accepted, done, sent) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    {
        let (accepted, done, sent) = (Arc::clone(&accepted), Arc::clone(&done), Arc::clone(&sent));
        std::thread::spawn(move || {
            for mut s in listener.incoming().map_while(Result::ok) {
                accepted.fetch_add(1, Ordering::SeqCst);
                let (done, sent) = (Arc::clone(&done), Arc::clone(&sent));
                std::thread::spawn(move || {
                    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                    let mut buf = [0u8; 4096];
                    while let Ok(n @ 1..) = s.read(&mut buf) {
                        sent.fetch_add(n as u64, Ordering::SeqCst);
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
    }
    let mut out = std::io::stdout();
    writeln!(out, "listening").unwrap();
    out.flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    // Every connection read to its end (the client closed it) before the count is said.
    let t = Instant::now();
    while done.load(Ordering::SeqCst) < accepted.load(Ordering::SeqCst)
        && t.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    writeln!(out, "accepted {}, sent {} bytes", accepted.load(Ordering::SeqCst), sent.load(Ordering::SeqCst))
        .unwrap();
}

/// Runs the helper test `name` of this binary as `nobody` (uid and gid 65534) with `env` set, its
/// standard input and output piped, and waits for it to say a line beginning with `ready`; the
/// process and the rest of what it says.
fn helper_as_nobody(
    name: &str,
    (key, value): (&str, &str),
    ready: &str,
) -> (std::process::Child, BufReader<std::process::ChildStdout>) {
    use std::os::unix::process::CommandExt;
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", name])
        .env(key, value)
        .uid(65534)
        .gid(65534)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with(ready) {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "{name} ended");
    }
    (child, out)
}

/// Not a test: a process holding `HVSTATS_TEST_HOLD_FDS` descriptors (copies of /dev/null)
/// until its standard input closes; it says "holding N" once it holds them.
#[test]
#[ignore = "run by discovery_reads_no_descriptor_of_a_process_holding_400000_of_them"]
fn descriptor_holder() {
    let Some(count) = std::env::var("HVSTATS_TEST_HOLD_FDS").ok().and_then(|c| c.parse::<usize>().ok())
    else {
        return;
    };
    let null = std::fs::File::open("/dev/null").unwrap();
    for _ in 0..count {
        // SAFETY: dup of a descriptor we hold; the copies are kept open on purpose.
        assert!(unsafe { libc::dup(std::os::fd::AsRawFd::as_raw_fd(&null)) } >= 0, "dup failed");
    }
    let mut out = std::io::stdout();
    writeln!(out, "holding {count}").unwrap();
    out.flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

/// An `hvstats` child killed and reaped on drop, with its standard error's lines.
struct Logged {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Logged {
    fn start(args: &[&str]) -> Self {
        Self::start_with_env(args, &[])
    }

    fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines, seen: Vec::new() }
    }

    /// `observe` with `args`, every 0.1 s, publishing under `runtime`.
    fn observe(args: &[&str], runtime: &Path) -> Self {
        let runtime = runtime.to_str().unwrap();
        Self::start(&[&["observe"], args, &["--interval", "0.1", "--runtime-dir", runtime]].concat())
    }

    /// The first line containing every one of `needles`, waiting up to 30 s.
    fn wait_line(&mut self, needles: &[&str]) -> String {
        let matches = |l: &String| needles.iter().all(|n| l.contains(n));
        if let Some(at) = self.seen.iter().position(matches) {
            return self.seen.remove(at);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if matches(&line) => return line,
                Ok(line) => self.seen.push(line),
                Err(e) => panic!("no line with {needles:?} ({e}); lines: {:#?}", self.seen),
            }
        }
    }

    /// Every line said so far.
    fn said(&mut self) -> Vec<String> {
        self.seen.extend(self.lines.try_iter());
        self.seen.clone()
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill has no memory effects; the pid is our child's.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `snapshot --json` over `runtime`: a reading that met a page being changed (status 1) is
/// taken again, up to 20 times; one that found nothing published (status 4) is an empty reading.
fn snapshot(runtime: &Path) -> Value {
    for _ in 0..20 {
        let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
            .args(["snapshot", "--json", "--runtime-dir"])
            .arg(runtime)
            .output()
            .unwrap();
        // 4: nothing publishes there (yet), an empty reading.
        if out.status.success() || out.status.code() == Some(4) {
            return serde_json::from_slice(&out.stdout).unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("snapshot kept failing under {}", runtime.display());
}

/// The partitions of every instance under `runtime` whose VMM is `pid`.
fn partitions_of_vmm(runtime: &Path, pid: i32) -> Vec<Value> {
    let v = snapshot(runtime);
    v["instances"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|i| i["partitions"].as_array().unwrap().clone())
        .filter(|p| p["vmm"]["pid"] == pid)
        .collect()
}

fn runtime_dir(tmp: &TempDir) -> std::path::PathBuf {
    let runtime = tmp.path().join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    runtime
}

#[test]
fn a_vmm_that_execs_in_place_is_its_old_vm_leaving_and_a_new_one_attaching() {
    if !kvm_available("a_vmm_that_execs_in_place_is_its_old_vm_leaving_and_a_new_one_attaching") {
        return;
    }
    let _host = host_wide();
    let tmp = TempDir::new("hostile-exec");
    let runtime = runtime_dir(&tmp);
    let mut vmm = FakeVmm::spawn(&["-name", "before-exec", "-uuid", UUID_A], "CPU 0/KVM");
    let pid = vmm.pid();
    let mut observer = Logged::observe(&["--all"], &runtime);
    observer.wait_line(&[&format!("attach pid {pid} "), "\"before-exec\""]);
    // The same process (pid and start time) runs a new program, with a new VM.
    vmm.exec(&["-name", "after-exec", "-uuid", UUID_B]);
    let detach = observer.wait_line(&[&format!("detach pid {pid} ")]);
    assert!(detach.contains("\"before-exec\": the process exec'd a program"), "{detach}");
    observer.wait_line(&[&format!("attach pid {pid} "), "\"after-exec\""]);
    let partitions = partitions_of_vmm(&runtime, pid);
    assert_eq!(partitions.len(), 1, "{partitions:?}");
    assert_eq!(partitions[0]["name"], "after-exec");
    assert_eq!(partitions[0]["uuid"], UUID_B);
}

/// Starts a stand-in VMM whose pid is `pid` (free now): the host's next pid is set to it and the
/// start retried until no other process took it first.
fn fake_vmm_at_pid(pid: i32, args: &[&str]) -> FakeVmm {
    for _ in 0..200 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).unwrap();
        let vmm = FakeVmm::spawn(args, "CPU 0/KVM");
        if vmm.pid() == pid {
            return vmm;
        }
    }
    panic!("pid {pid} kept being taken by other processes");
}

#[test]
fn a_pid_reused_within_one_refresh_is_the_old_vm_leaving_and_the_new_vmm_attaching() {
    if !kvm_available("a_pid_reused_within_one_refresh_is_the_old_vm_leaving_and_the_new_vmm_attaching") {
        return;
    }
    let _host = host_wide();
    let tmp = TempDir::new("hostile-reuse");
    let runtime = runtime_dir(&tmp);
    let mut old = FakeVmm::spawn(&["-name", "old-vmm", "-uuid", UUID_A], "CPU 0/KVM");
    let pid = old.pid();
    let mut observer = Logged::observe(&["--all"], &runtime);
    observer.wait_line(&[&format!("attach pid {pid} "), "\"old-vmm\""]);
    // Between two refreshes (the observer stopped), the VMM exits and another takes its pid.
    observer.signal(libc::SIGSTOP);
    old.kill();
    let new = fake_vmm_at_pid(pid, &["-name", "new-vmm", "-uuid", UUID_B]);
    observer.signal(libc::SIGCONT);
    let detach = observer.wait_line(&[&format!("detach pid {pid} ")]);
    // Where the observer watches a VMM's exit by its pidfd it knows the old process exited;
    // elsewhere it sees the pid name another process. Either way the old VM leaves.
    assert!(
        detach.contains("\"old-vmm\": the process exited")
            || detach.contains("\"old-vmm\": the pid names another process now"),
        "{detach}"
    );
    observer.wait_line(&[&format!("attach pid {pid} "), "\"new-vmm\""]);
    let partitions = partitions_of_vmm(&runtime, pid);
    assert_eq!(partitions.len(), 1, "{partitions:?}");
    assert_eq!(partitions[0]["name"], "new-vmm");
    assert_eq!(partitions[0]["uuid"], UUID_B, "the new VMM's UUID, not the old one's");
    drop(new);
}

#[test]
fn a_vmm_called_hvstats_is_observed_and_hvstats_run_is_left_to_its_own_instance() {
    if !kvm_available("a_vmm_called_hvstats_is_observed_and_hvstats_run_is_left_to_its_own_instance") {
        return;
    }
    let _host = host_wide();
    let tmp = TempDir::new("hostile-comm");
    let runtime = runtime_dir(&tmp);
    // A VMM naming itself `hvstats` holds a VM like any other: it is observed.
    let vmm = FakeVmm::spawn_with(&["-name", "calls-itself-hvstats"], "CPU 0/KVM", |c| {
        c.env(common::FAKE_VMM_COMM, "hvstats");
    });
    assert_eq!(std::fs::read_to_string(format!("/proc/{}/comm", vmm.pid())).unwrap(), "hvstats\n");
    // `hvstats run` publishes its own partition: an observer leaves it to it.
    let mut run =
        Logged::start(&["run", "--forever", "--vps", "1", "--runtime-dir", runtime.to_str().unwrap()]);
    let run_pid = run.child.id() as i32;
    let t = Instant::now();
    while snapshot(&runtime)["instances"].as_array().unwrap().is_empty() {
        assert!(t.elapsed() < Duration::from_secs(30), "hvstats run published nothing: {:?}", run.said());
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut observer = Logged::observe(&["--all"], &runtime);
    observer.wait_line(&[&format!("attach pid {} ", vmm.pid()), "\"calls-itself-hvstats\""]);
    let left = observer.wait_line(&[&format!("pid {run_pid} not observed for now")]);
    assert!(left.contains(&format!("already observed by pid {run_pid}")), "{left}");
    // One partition for `run`'s VM: its own.
    let v = snapshot(&runtime);
    let instances = v["instances"].as_array().unwrap();
    let of_run: Vec<&Value> = instances.iter().filter(|i| i["pid"] == run_pid).collect();
    assert_eq!(of_run.len(), 1);
    assert_eq!(of_run[0]["partitions"].as_array().unwrap().len(), 1);
    assert!(partitions_of_vmm(&runtime, run_pid).is_empty(), "run's VM is not observed as well: {v}");
    assert_eq!(partitions_of_vmm(&runtime, vmm.pid()).len(), 1);
}

/// Serves QMP for one client as a QEMU whose vCPU 0 is, by turns, thread 1 (init), thread
/// `foreign` (another process's), then `real` (the VMM's own vCPU thread).
fn lying_qmp(listener: UnixListener, foreign: i32, real: i32) {
    std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut out = stream.try_clone().unwrap();
        writeln!(out, r#"{{"QMP": {{"version": {{"qemu": {{"major": 7, "minor": 2, "micro": 0}}}}, "capabilities": []}}}}"#).unwrap();
        let mut answers = [1, 1, 1, foreign, foreign, real].into_iter();
        let mut last = 1;
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            let req: Value = serde_json::from_str(&line).unwrap();
            let ret = match req["execute"].as_str().unwrap() {
                "qmp_capabilities" => json!({}),
                "query-name" => json!({"name": "liar"}),
                "query-cpus-fast" => {
                    last = answers.next().unwrap_or(last);
                    json!([{"cpu-index": 0, "thread-id": last, "qom-path": "/machine/unattached/device[0]"}])
                }
                "query-status" => json!({"running": true, "status": "running"}),
                "query-uuid" => json!({"UUID": "00000000-0000-0000-0000-000000000000"}),
                // No KVM statistics provider, as QEMU with TCG answers.
                "query-stats" => json!([]),
                _ => json!({}),
            };
            if writeln!(out, "{}", json!({ "return": ret })).is_err() {
                break;
            }
        }
    });
}

#[test]
fn thread_ids_a_qmp_peer_names_are_used_only_while_they_are_its_own_tasks() {
    if !kvm_available("thread_ids_a_qmp_peer_names_are_used_only_while_they_are_its_own_tasks") {
        return;
    }
    let tmp = TempDir::new("hostile-threads");
    let runtime = runtime_dir(&tmp);
    // The VMM's vCPU thread has no telling name: only QMP says which thread it is.
    let vmm = FakeVmm::spawn(&["-name", "liar"], "worker");
    let pid = vmm.pid();
    let real: i32 = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .find(|tid| std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).unwrap() == "worker\n")
        .unwrap();
    // Another process, burning CPU: the peer names it as its vCPU thread.
    let burner = common::KilledOnDrop(
        Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let foreign = burner.0.id() as i32;
    let sock = tmp.path().join("qmp.sock");
    lying_qmp(UnixListener::bind(&sock).unwrap(), foreign, real);
    let mut observer =
        Logged::observe(&["--pid", &pid.to_string(), "--qmp", sock.to_str().unwrap()], &runtime);
    let init = observer.wait_line(&[&format!("pid {pid} "), "thread 1 named by qmp for VP 0 is not used"]);
    assert!(init.contains(&format!("it is not a thread of process {pid}")), "{init}");
    let other = observer.wait_line(&[&format!("thread {foreign} named by qmp for VP 0 is not used")]);
    assert!(other.contains(&format!("it is not a thread of process {pid}")), "{other}");
    let known = observer.wait_line(&[&format!("pid {pid}: vCPU threads")]);
    assert!(known.contains(&format!("[{real}]")), "{known}");
    // Each refused thread was said once, however often the peer named it.
    std::thread::sleep(Duration::from_millis(500));
    let said = observer.said();
    assert!(!said.iter().any(|l| l.contains("thread 1 named by")), "{said:?}");
    // The VP's run time is its own parked thread's, not the burner's half second and more.
    let burned_100ns = || {
        let stat = std::fs::read_to_string(format!("/proc/{foreign}/stat")).unwrap();
        // SAFETY: sysconf has no memory effects.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        cpu_ticks(&stat) * 10_000_000 / per_second
    };
    while burned_100ns() < 5_000_000 {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(300));
    let burned_100ns = burned_100ns();
    let partitions = partitions_of_vmm(&runtime, pid);
    let run = partitions[0]["vps"][0]["counters"][common::total("Total run time")].as_u64().unwrap();
    assert!(run < burned_100ns / 10, "VP run time {run} (100 ns) vs the burner's {burned_100ns}");
    drop(burner);
}

/// User plus system time of a `stat` line, in clock ticks.
fn cpu_ticks(stat: &str) -> u64 {
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<u64> = after.split(' ').map(|f| f.parse().unwrap_or(0)).collect();
    // Fields 14 and 15 of the line; `after` starts at field 3.
    fields[14 - 3] + fields[15 - 3]
}

#[test]
fn a_vmm_naming_another_qemus_qmp_socket_is_not_given_its_session() {
    if !kvm_available("a_vmm_naming_another_qemus_qmp_socket_is_not_given_its_session") {
        return;
    }
    let _host = host_wide();
    let tmp = TempDir::new("hostile-qmp-theft");
    let runtime = runtime_dir(&tmp);
    let sock = tmp.path().join("victim.sock");
    let qmp = format!("unix:{},server=on,wait=off", sock.display());
    // The thief holds a VM and names the victim's socket on its command line. It starts first,
    // so an observer attaches it first (oldest first) and would connect first.
    let thief = FakeVmm::spawn(&["-name", "thief", "-qmp", &qmp], "CPU 0/KVM");
    let victim = common::KilledOnDrop(
        Command::new("qemu-system-x86_64")
            .args(["-accel", "kvm", "-display", "none", "-nodefaults", "-m", "32"])
            .args(["-name", "guest=victim,debug-threads=on", "-qmp", &qmp])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("qemu-system-x86_64 starts (.ci/run installs it)"),
    );
    let victim_pid = victim.0.id() as i32;
    hvstats_testkit::wait_for_kvm_vcpus(victim_pid, 1, Duration::from_secs(30));
    let t = Instant::now();
    while !sock.exists() {
        assert!(t.elapsed() < Duration::from_secs(30), "QEMU made no QMP socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (mut serve, addr) = serve_observe_all(&runtime);
    let refused = serve.wait_line(&[&format!("pid {} ", thief.pid()), "qmp refused"]);
    assert!(refused.contains(&format!("is served by pid {victim_pid}, not by the VMM")), "{refused}");
    // Each VM is published under its own name: the thief's is not the one the victim's QMP says.
    assert_eq!(label(&vm_info(addr, thief.pid()), "vm"), "thief");
    assert_eq!(label(&vm_info(addr, victim_pid), "vm"), "victim");
    // The victim keeps its QMP source; the thief has none.
    let up = |vm: &str| format!("hvstats_vm_source_up{{vm=\"{vm}\",source=\"qmp\"}}");
    let t = Instant::now();
    loop {
        let metrics = common::http_get(addr, "/metrics");
        let (victim_up, thief_up) =
            (common::sample(&metrics, &up("victim")), common::sample(&metrics, &up("thief")));
        if victim_up.as_deref() == Some("1") {
            assert_eq!(thief_up.as_deref(), Some("0"), "{metrics}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the victim's QMP is not up:\n{metrics}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Refused once, and never connected again: the victim's session is never lost.
    std::thread::sleep(Duration::from_secs(2));
    let said = serve.said();
    assert_eq!(said.iter().filter(|l| l.contains("qmp refused")).count(), 0, "said once: {said:?}");
    let lost = format!("pid {victim_pid} ");
    assert!(!said.iter().any(|l| l.contains(&lost) && l.contains("qmp lost")), "{said:?}");
    eprintln!("{refused}");
    drop(thief);
}

/// `serve --observe-all` over `runtime` and the address it serves on.
fn serve_observe_all(runtime: &Path) -> (Logged, std::net::SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["serve", "--listen", "127.0.0.1:0", "--observe-all", "--observe-interval", "0.1"])
        .arg("--runtime-dir")
        .arg(runtime)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addr = common::serving_addr(&mut child);
    let (tx, lines) = mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (Logged { child, lines, seen: Vec::new() }, addr)
}

/// The `hvstats_vm_info` line of the VM whose VMM is `pid`, waiting up to 30 s for it.
fn vm_info(addr: std::net::SocketAddr, pid: i32) -> String {
    let t = Instant::now();
    loop {
        let metrics = common::http_get(addr, "/metrics");
        let mine = format!("vmm_pid=\"{pid}\"");
        if let Some(line) = metrics.lines().find(|l| l.starts_with("hvstats_vm_info{") && l.contains(&mine)) {
            return line.to_owned();
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no hvstats_vm_info for pid {pid}:\n{metrics}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The value of label `name` in a series line.
fn label<'a>(line: &'a str, name: &str) -> &'a str {
    let start = line.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
    let mut end = start;
    let bytes = line.as_bytes();
    while bytes[end] != b'"' {
        end += if bytes[end] == b'\\' { 2 } else { 1 };
    }
    &line[start..end]
}

#[test]
fn a_vmm_taking_a_running_vms_name_is_told_apart_and_lookalikes_and_uuids_are_said() {
    if !kvm_available("a_vmm_taking_a_running_vms_name_is_told_apart_and_lookalikes_and_uuids_are_said") {
        return;
    }
    let _host = host_wide();
    let tmp = TempDir::new("hostile-names");
    let runtime = runtime_dir(&tmp);
    let real = FakeVmm::spawn(&["-name", "prod-db", "-uuid", UUID_A], "CPU 0/KVM");
    let (mut serve, addr) = serve_observe_all(&runtime);
    let info = vm_info(addr, real.pid());
    assert_eq!(label(&info, "vm"), "prod-db", "{info}");
    // A second VMM with the same name and UUID, and one whose name hides a zero-width space.
    let copy = FakeVmm::spawn(&["-name", "prod-db", "-uuid", UUID_A], "CPU 0/KVM");
    let lookalike = FakeVmm::spawn(&["-name", "prod\u{200b}-db"], "CPU 0/KVM");
    let copy_info = vm_info(addr, copy.pid());
    let lookalike_info = vm_info(addr, lookalike.pid());
    // The VM that was there first keeps its label; the newcomers are the ones told apart.
    let info = vm_info(addr, real.pid());
    assert_eq!(label(&info, "vm"), "prod-db", "{info}");
    assert_eq!(label(&copy_info, "vm"), "prod-db#2", "{copy_info}");
    // The zero-width space is shown, escaped (the exposition escapes the backslash once more).
    assert_eq!(label(&lookalike_info, "vm"), r"prod\\u{200b}-db", "{lookalike_info}");
    let (real_pid, copy_pid, lookalike_pid) = (real.pid(), copy.pid(), lookalike.pid());
    let named = serve.wait_line(&[&format!("pid {copy_pid} \"prod-db\": the name of pid {real_pid}'s VM")]);
    assert!(named.contains("which keeps it"), "{named}");
    serve.wait_line(&[&format!("pid {copy_pid}: UUID {UUID_A} is also pid {real_pid}'s VM's")]);
    serve.wait_line(&[
        &format!("pid {lookalike_pid} \"prod\\u{{200b}}-db\": looks like the name of pid "),
        "\"prod-db\"",
    ]);
}

/// Counts the `readlink` system calls of the threads of `pid` from now on.
struct Readlinks(Vec<hvstats_host::perf_event::PerfCounter>);

impl Readlinks {
    fn of(pid: u32) -> Self {
        use hvstats_host::perf_event::{PerfCounter, TYPE_TRACEPOINT};
        let ids: Vec<u64> = ["sys_enter_readlink", "sys_enter_readlinkat"]
            .iter()
            .map(|e| hvstats_host::tracefs::event_id("syscalls", e).unwrap())
            .collect();
        let mut counters = Vec::new();
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
            let tid: i32 = task.file_name().to_str().unwrap().parse().unwrap();
            for &id in &ids {
                counters.push(PerfCounter::open(TYPE_TRACEPOINT, id, tid).unwrap());
            }
        }
        Self(counters)
    }

    fn count(&self) -> u64 {
        self.0.iter().map(|c| c.read().unwrap()).sum()
    }
}

/// User plus system time of process `pid`, in clock ticks.
fn cpu_ticks_of(pid: u32) -> u64 {
    cpu_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap())
}

#[test]
fn discovery_reads_no_descriptor_of_a_process_holding_400000_of_them() {
    if !kvm_available("discovery_reads_no_descriptor_of_a_process_holding_400000_of_them") {
        return;
    }
    let _host = host_wide();
    // 400,000 descriptors held by `nobody`: in one process where the hard limit allows it, else
    // in as many processes as the limit (20,000 on some hosts) takes.
    const HELD: u64 = 400_000;
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid rlimit the kernel writes into, then reads.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        lim.rlim_max = lim.rlim_max.max(HELD + 64);
        lim.rlim_cur = lim.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
            assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
            lim.rlim_cur = lim.rlim_max;
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
    }
    let per_holder = (lim.rlim_cur - 64).min(HELD);
    let mut holders = Vec::new();
    for _ in 0..HELD.div_ceil(per_holder) {
        let (holder, out) = helper_as_nobody(
            "descriptor_holder",
            ("HVSTATS_TEST_HOLD_FDS", &per_holder.to_string()),
            "holding",
        );
        holders.push((holder, out));
    }
    let tmp = TempDir::new("hostile-fds");
    let runtime = runtime_dir(&tmp);
    // With KVM's debugfs (as root), and from /proc alone (a `--proc-root` has no debugfs).
    for (how, extra) in [("debugfs", &[][..]), ("/proc alone", &["--proc-root", "/proc"][..])] {
        let observer = Logged::observe(&[&["--all"], extra].concat(), &runtime);
        let pid = observer.child.id();
        // Counted from once its first tick (which reads each process once) is published.
        let t = Instant::now();
        while !snapshot(&runtime)["instances"].as_array().unwrap().iter().any(|i| i["pid"] == pid) {
            assert!(t.elapsed() < Duration::from_secs(60), "the observer published nothing");
            std::thread::sleep(Duration::from_millis(50));
        }
        let readlinks = Readlinks::of(pid);
        let (cpu_then, t) = (cpu_ticks_of(pid), Instant::now());
        std::thread::sleep(Duration::from_secs(6));
        let (read, cpu) = (readlinks.count(), cpu_ticks_of(pid) - cpu_then);
        // SAFETY: sysconf has no memory effects.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        eprintln!(
            "{how}: {read} descriptors read in {:.1} s of ticks every 0.1 s, {:.1} % of a CPU",
            t.elapsed().as_secs_f64(),
            cpu as f64 / per_second / t.elapsed().as_secs_f64() * 100.0
        );
        // Sixty ticks. Each process is read when first seen (each holder once, from /proc
        // alone), never at every tick: less than twice what the holders hold, in all.
        assert!(read < 2 * HELD, "{how}: {read} readlinks in 60 ticks");
        if how == "debugfs" {
            assert!(read < HELD / 10, "{how}: {read} readlinks: the holder's descriptors were read");
        }
    }
    for (mut holder, _out) in holders {
        drop(holder.stdin.take());
        let _ = holder.wait();
    }
}

/// The partition of the VM whose VMM is `pid` in `observer`'s publication under `runtime`, once
/// `done` holds for it (waiting up to 60 s).
fn partition_until(runtime: &Path, pid: i32, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let t = Instant::now();
    loop {
        if let Some(p) = partitions_of_vmm(runtime, pid).into_iter().find(|p| done(p)) {
            return p;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "{what}: {:#?}", partitions_of_vmm(runtime, pid));
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether the source `source` of partition `p` is up (`None`: the VM has no such source).
fn source_up(p: &Value, source: &str) -> Option<bool> {
    p["sources"].as_array()?.iter().find(|s| s["name"] == source).and_then(|s| s["up"].as_bool())
}

#[test]
fn a_libvirt_socket_another_user_serves_and_a_vmm_copying_a_domains_uuid_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    let test = "a_libvirt_socket_another_user_serves_and_a_vmm_copying_a_domains_uuid_are_refused";
    if !kvm_available(test) {
        return;
    }
    // Its VMs are the host's: a test observing every VM would see them.
    let _host = host_wide();
    let Some(libvirtd) = hvstats_testkit::Libvirtd::start("hostile-libvirt") else { return };
    let tmp = TempDir::new("hostile-libvirt");
    let runtime = runtime_dir(&tmp);
    // The victim: a domain of the test's own libvirtd, its QEMU started by the daemon.
    let uuid = "6c1d2e3f-4a5b-4c6d-8e7f-8091a2b3c4d5";
    let name = format!("hvstats-victim-{}", std::process::id());
    let guest = hvstats_guest::bios::BiosProgram {
        cpuid: 10,
        end: hvstats_guest::bios::BiosEnd::Halt,
        ..Default::default()
    };
    let domain = libvirtd.run_domain(&name, uuid, &guest.image().unwrap());
    // The thief: a process holding a KVM VM whose command line copies the domain's UUID.
    let thief = FakeVmm::spawn(&["-name", "thief", "-uuid", uuid], "CPU 0/KVM");
    let real = format!("qemu:///system?socket={}", libvirtd.socket_ro().display());
    let pids = ["--pid", &domain.pid.to_string(), "--pid", &thief.pid().to_string()].map(str::to_owned);
    let pids: Vec<&str> = pids.iter().map(String::as_str).collect();
    let args = [
        &["observe"][..],
        &pids,
        &["--no-qmp", "--interval", "0.1", "--runtime-dir", runtime.to_str().unwrap()],
    ]
    .concat();
    let mut observer = Logged::start_with_env(&args, &[("LIBVIRT_DEFAULT_URI", &real)]);
    let refused = observer.wait_line(&[&format!("pid {} ", thief.pid()), "libvirt refused"]);
    assert!(
        refused.contains(&format!(
            "libvirt's domain \"{name}\" with this process's UUID runs in pid {}, not in this process",
            domain.pid
        )),
        "{refused}"
    );
    // The domain keeps its libvirt source and its name; the thief has neither.
    let victim = partition_until(&runtime, domain.pid, "the domain's libvirt source is up", |p| {
        source_up(p, "libvirt") == Some(true)
    });
    assert_eq!(victim["name"], name.as_str());
    let stolen = partition_until(&runtime, thief.pid(), "the thief is published", |_| true);
    assert_eq!(stolen["name"], "thief", "{stolen:#}");
    assert_eq!(source_up(&stolen, "libvirt"), Some(false), "{stolen:#}");
    std::thread::sleep(Duration::from_secs(1));
    let said = observer.said();
    assert_eq!(said.iter().filter(|l| l.contains("libvirt refused")).count(), 0, "said once: {said:#?}");
    drop(observer);

    // A socket served by `nobody`, named where the observer is told libvirt listens: refused
    // before a byte is sent to it.
    let dir = tmp.path().join("fake");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    let socket = dir.join("libvirt-sock-ro");
    let (mut fake, mut fake_out) = helper_as_nobody(
        "fake_libvirt",
        ("HVSTATS_TEST_FAKE_LIBVIRT", socket.to_str().unwrap()),
        "listening",
    );
    let fake_pid = fake.id();
    let runtime2 = tmp.path().join("run2");
    std::fs::create_dir(&runtime2).unwrap();
    let args = [
        "observe",
        "--pid",
        &domain.pid.to_string(),
        "--no-qmp",
        "--interval",
        "0.1",
        "--runtime-dir",
        runtime2.to_str().unwrap(),
    ]
    .map(str::to_owned);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let fake_uri = format!("qemu:///system?socket={}", socket.display());
    let mut observer = Logged::start_with_env(&args, &[("LIBVIRT_DEFAULT_URI", &fake_uri)]);
    let refused = observer.wait_line(&[&format!("pid {} ", domain.pid), "libvirt refused"]);
    assert!(
        refused
            .contains(&format!("is served by pid {fake_pid} of uid 65534, not by libvirt's daemon (root)")),
        "{refused}"
    );
    let p = partition_until(&runtime2, domain.pid, "the domain is published", |_| true);
    assert_eq!(source_up(&p, "libvirt"), Some(false), "{p:#}");
    drop(observer);
    drop(fake.stdin.take());
    let mut line = String::new();
    fake_out.read_line(&mut line).unwrap();
    let _ = fake.wait();
    assert!(line.starts_with("accepted ") && line.trim_end().ends_with(", sent 0 bytes"), "{line}");
    eprintln!("{refused}");
    drop(thief);
}

/// A listener on `path` that accepts every connection and counts them, until dropped.
struct CountingListener {
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl CountingListener {
    fn bind(path: &Path) -> Self {
        use std::sync::atomic::Ordering;
        let listener = UnixListener::bind(path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let me = Self { accepted: Default::default(), stop: Default::default() };
        let (accepted, stop) = (me.accepted.clone(), me.stop.clone());
        std::thread::spawn(move || {
            let mut held = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((s, _)) => {
                        accepted.fetch_add(1, Ordering::SeqCst);
                        held.push(s);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        me
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for CountingListener {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A directory `name` under `parent` with `mode`, root's.
fn dir_with_mode(parent: &Path, name: &str, mode: u32) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = parent.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
    dir
}

#[test]
fn a_nobody_vmm_naming_a_socket_in_a_root_only_directory_makes_the_observer_connect_nowhere() {
    if !kvm_available(
        "a_nobody_vmm_naming_a_socket_in_a_root_only_directory_makes_the_observer_connect_nowhere",
    ) {
        return;
    }
    // Another test's `--all` observer would look at this VMM's socket too.
    let _host = host_wide();
    let tmp = TempDir::new("hostile-qmp-reach");
    dir_with_mode(tmp.path(), ".", 0o755);
    let runtime = runtime_dir(&tmp);
    // A root daemon's socket in a directory only root may search.
    let hidden = dir_with_mode(tmp.path(), "root-only", 0o700).join("s.sock");
    let daemon = CountingListener::bind(&hidden);
    // A nobody VMM holding a real KVM VM names it as its QMP socket.
    let qmp = format!("unix:{},server=on,wait=off", hidden.display());
    let vmm = FakeVmm::spawn_with(&["-name", "pointer", "-qmp", &qmp], "CPU 0/KVM", common::as_nobody);
    let pid = vmm.pid();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(status.lines().any(|l| l.starts_with("Uid:") && l.contains("65534")), "{status}");
    let mut observer = Logged::observe(&["--pid", &pid.to_string()], &runtime);
    observer.wait_line(&[&format!("attach pid {pid} "), "\"pointer\""]);
    let refused = observer.wait_line(&[&format!("pid {pid} "), "qmp refused"]);
    assert!(refused.contains("is one the VMM could not connect to itself"), "{refused}");
    assert!(refused.contains("root-only: uid 65534 gid 65534 may not search it (mode 700"), "{refused}");
    // Many refreshes later (every 0.1 s): never connected, and said once.
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        assert_eq!(daemon.accepted(), 0, "the observer connected where nobody may not");
        std::thread::sleep(Duration::from_millis(100));
    }
    let said = observer.said();
    assert_eq!(said.iter().filter(|l| l.contains("qmp refused")).count(), 0, "said once: {said:?}");
    eprintln!("{refused}");
}

#[test]
fn a_qmp_socket_a_nobody_qemu_can_reach_is_still_used() {
    use std::os::unix::process::CommandExt;
    if !kvm_available("a_qmp_socket_a_nobody_qemu_can_reach_is_still_used") {
        return;
    }
    // Another test's `--all` observer would hold this QEMU's only QMP session.
    let _host = host_wide();
    let tmp = TempDir::new("hostile-qmp-reachable");
    dir_with_mode(tmp.path(), ".", 0o755);
    let runtime = runtime_dir(&tmp);
    let sock = dir_with_mode(tmp.path(), "open", 0o755).join("q.sock");
    // QEMU opens /dev/kvm and binds its socket as root, then runs as nobody (-runas); made with
    // no umask, the socket is writable by all, so nobody could connect to it.
    let mut command = Command::new("qemu-system-x86_64");
    command
        .args(["-accel", "kvm", "-display", "none", "-nodefaults", "-m", "32", "-runas", "nobody"])
        .args(["-name", "guest=reachable,debug-threads=on"])
        .args(["-qmp", &format!("unix:{},server=on,wait=off", sock.display())])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: umask is async-signal-safe and touches only the child's mask.
    unsafe {
        command.pre_exec(|| {
            libc::umask(0);
            Ok(())
        })
    };
    let qemu =
        common::KilledOnDrop(command.spawn().expect("qemu-system-x86_64 starts (.ci/run installs it)"));
    let pid = qemu.0.id() as i32;
    hvstats_testkit::wait_for_kvm_vcpus(pid, 1, Duration::from_secs(30));
    // It runs as nobody once its set-up is done.
    let t = Instant::now();
    while !std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap().contains("Uid:\t65534\t") {
        assert!(t.elapsed() < Duration::from_secs(30), "QEMU did not become nobody");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut observer = Logged::observe(&["--pid", &pid.to_string()], &runtime);
    let attach = observer.wait_line(&[&format!("attach pid {pid} "), "\"reachable\""]);
    assert!(attach.contains("; QMP ") && !attach.contains("unavailable"), "{attach}");
    let t = Instant::now();
    loop {
        let up = partitions_of_vmm(&runtime, pid).iter().any(|p| {
            p["sources"].as_array().is_some_and(|s| s.iter().any(|s| s["name"] == "qmp" && s["up"] == true))
        });
        if up {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "QMP not up: {:?}", observer.said());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!observer.said().iter().any(|l| l.contains("qmp refused")), "{:?}", observer.said());
}
