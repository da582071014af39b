//! `serve --observe-all` as a process: SIGTERM removes the observer's instance files, as
//! `observe` does, and a runtime directory another observer holds is refused (one observer per
//! runtime directory) until that observer is gone.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Running, TempDir, hold_a_vm, kvm_available};
use hvstats_testkit::kvm_vcpus;

fn instance_files(dir: &Path) -> Vec<String> {
    match std::fs::read_dir(dir.join("instances")) {
        Ok(d) => d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn sigterm_ends_serve_observe_all_and_removes_the_observers_instance_files() {
    let tmp = TempDir::new("serve-observe-term");
    // Only this test's process, which holds no VM: other tests' VMMs on the host are theirs.
    let me = std::process::id().to_string();
    let mut serve = Running::start(
        &["serve", "--listen", "127.0.0.1:0", "--observe-all", "--observe-interval", "0.1", "--vm", &me],
        tmp.path(),
    );
    serve.wait_line("observing every KVM VM on this host as instance");
    assert!(!instance_files(tmp.path()).is_empty());
    let status = serve.terminate();
    assert_eq!(status.code(), Some(0), "{status}");
    assert_eq!(instance_files(tmp.path()), Vec::<String>::new());
}

/// Every CPU of the host busy (one spinning thread each) until dropped.
struct BusyHost {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl BusyHost {
    fn new() -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let threads = (0..cpus)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        Self { stop, threads }
    }
}

impl Drop for BusyHost {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.threads.drain(..).for_each(|t| t.join().unwrap());
    }
}

#[test]
fn sigterm_ends_serve_and_the_observer_promptly_on_a_host_busy_on_every_cpu() {
    if !kvm_available("sigterm_ends_serve_and_the_observer_promptly_on_a_host_busy_on_every_cpu") {
        return;
    }
    let tmp = TempDir::new("sigterm-busy");
    let tag = format!("busy-{}", std::process::id());
    let qemu = common::QemuGuest::start(tmp.path(), &tag);
    let pid = qemu.pid().to_string();
    let _busy = BusyHost::new();
    let mut took = Vec::new();
    // Each kind of observer, signalled as it starts and once it counts: [`Running::terminate`]
    // fails past 5 s.
    for (round, args) in [
        &["observe", "--all", "--vm", &pid][..],
        &["serve", "--listen", "127.0.0.1:0", "--observe-all", "--vm", &pid],
    ]
    .into_iter()
    .cycle()
    .take(6)
    .enumerate()
    {
        let mut observer = Running::start(args, tmp.path());
        // Its programs attached and nothing kept in them yet: stopping detaches every one.
        observer.wait_line("for the next observer to adopt");
        if round >= 2 {
            observer.wait_line("vCPU threads");
            std::thread::sleep(Duration::from_millis(300 * round as u64));
        }
        let t = Instant::now();
        let status = observer.terminate();
        took.push(t.elapsed());
        assert_eq!(status.code(), Some(0), "{args:?}: {status}");
    }
    took.sort();
    eprintln!("SIGTERM to exit on a busy host: median {:?}, all {took:?}", took[took.len() / 2]);
}

#[test]
fn serve_observe_all_is_refused_a_runtime_directory_another_observer_holds() {
    if !kvm_available("serve_observe_all_is_refused_a_runtime_directory_another_observer_holds") {
        return;
    }
    let tmp = TempDir::new("serve-observe-held");
    let _vm = hold_a_vm();
    let me = std::process::id().to_string();
    let mut observe = Running::start(&["observe", "--pid", &me, "--interval", "0.1"], tmp.path());
    observe.wait_line(&format!("attach pid {me}"));
    let mark = std::fs::read_to_string(tmp.path().join("observer")).unwrap();
    let serve_all = || {
        Running::start(
            &["serve", "--listen", "127.0.0.1:0", "--observe-all", "--observe-interval", "0.1", "--vm", &me],
            tmp.path(),
        )
    };
    // The exporter's own observer would share the runtime directory: serve does not start.
    let mut refused = serve_all();
    let said = refused.wait_line("another observer already observes under");
    assert!(said.contains(&format!("pid {} (`", observe.child.id())), "{said}");
    let status = refused.child.wait().unwrap();
    assert!(!status.success(), "{status}");
    assert!(refused.lines_with("adopted").is_empty() && refused.lines_with("serving").is_empty());
    assert_eq!(std::fs::read_to_string(tmp.path().join("observer")).unwrap(), mark);
    // The observer goes (killed outright): serve takes the directory, and the VM, over.
    observe.child.kill().unwrap();
    observe.child.wait().unwrap();
    let mut serve = serve_all();
    serve.wait_line(&format!("attach pid {me}"));
    // Its VM's info names the VMM process (this test holds the VM: no VMM it knows).
    let metrics = serve.get("/metrics");
    let info = metrics
        .lines()
        .find(|l| l.starts_with("hvstats_vm_info{") && l.contains(&format!("vmm_pid=\"{me}\"")));
    assert!(
        info.is_some_and(|l| l.contains("vmm=\"other\"") && l.contains("publisher_kind=\"observer\"")),
        "{metrics}"
    );
    assert_eq!(serve.terminate().code(), Some(0));
    // The killed observer's instance files are cleaned by readers; serve's own are gone.
    let left = instance_files(tmp.path());
    assert!(left.iter().all(|f| !f.starts_with(&format!("{}-", serve.child.id()))), "{left:?}");
}

/// A QEMU with KVM (SeaBIOS with no disk: it halts on a timer, a few dozen times a second) and a
/// QMP socket `<dir>/<tag>.sock` on its command line, killed on drop.
struct Qemu {
    child: Child,
    qmp: std::path::PathBuf,
}

impl Qemu {
    fn start(dir: &Path, tag: &str, extra: &[&str]) -> Self {
        let qmp = dir.join(format!("{tag}.sock"));
        let child = Command::new("qemu-system-x86_64")
            .args(["-accel", "kvm", "-display", "none", "-nodefaults", "-m", "32"])
            .args(["-name", &format!("guest={tag},debug-threads=on")])
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp.display()))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("qemu-system-x86_64 starts (.ci/run installs it)");
        let me = Self { child, qmp };
        let t = Instant::now();
        while !me.qmp.exists() || kvm_vcpus(me.pid()) < 1 {
            assert!(t.elapsed() < Duration::from_secs(30), "QEMU made no vCPU in 30 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        me
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// SIGSTOP, and wait until every thread of it is stopped.
    fn stop(&self) {
        // SAFETY: kill has no memory effects; the pid is our child's.
        assert_eq!(unsafe { libc::kill(self.pid(), libc::SIGSTOP) }, 0);
        let stopped = || {
            std::fs::read_dir(format!("/proc/{}/task", self.pid())).unwrap().flatten().all(|t| {
                let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T'))
            })
        };
        let t = Instant::now();
        while !stopped() {
            assert!(t.elapsed() < Duration::from_secs(10), "QEMU did not stop");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn cont(&self) {
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(self.pid(), libc::SIGCONT) }, 0);
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of the first sample of `family` (any labels).
fn first_sample(text: &str, family: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(family)?.strip_prefix('{')?.rsplit_once(' ')?.1.parse().ok())
}

#[test]
fn a_qemu_stopped_for_ten_seconds_loses_its_qmp_counters_and_gets_them_back_within_two_refreshes() {
    if !kvm_available("a_qemu_stopped_for_ten_seconds_loses_its_qmp_counters_and_gets_them_back") {
        return;
    }
    let tmp = TempDir::new("serve-qmp-heal");
    let tag = format!("heal-{}", std::process::id());
    // A second QMP socket, held by this test, says when QEMU answers again after SIGCONT.
    let ctl = tmp.path().join("ctl.sock");
    let ctl_arg = format!("unix:{},server=on,wait=off", ctl.display());
    let qemu = Qemu::start(tmp.path(), &tag, &["-qmp", &ctl_arg]);
    let mut control = hvstats_vmm::qmp::Qmp::connect(&ctl, Duration::from_secs(10)).unwrap();
    let pid = qemu.pid().to_string();
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    // The QMP socket comes from QEMU's command line; the filter keeps other tests' VMs out.
    let serve = Running::start(
        &["serve", "--listen", "127.0.0.1:0", "--observe-all", "--observe-interval", "1", "--vm", &pid],
        &run,
    );
    let attach = serve.wait_line(&format!("attach pid {pid}"));
    assert!(attach.contains(&format!("; QMP {}", qemu.qmp.display())), "{attach}");
    let up = format!("hvstats_vm_source_up{{vm=\"{tag}\",source=\"qmp\"}}");
    let state = |s: &str| format!("hvstats_vm_state{{vm=\"{tag}\",state=\"{s}\"}}");
    let hlt = format!("hvstats_vp_intercepts_total{{vm=\"{tag}\",vp=\"0\",intercept=\"hlt\"}}");
    let halts = |m: &str| common::sample(m, &hlt).and_then(|v| v.parse::<u64>().ok());
    // SeaBIOS reaches its first HLT in seconds here, longer on a host busy emulating others.
    let m = serve.metrics_until(Duration::from_secs(120), |m| {
        common::sample(m, &up).as_deref() == Some("1") && halts(m).is_some_and(|h| h > 0)
    });
    assert_eq!(common::sample(&m, &state("running")).as_deref(), Some("1"), "{m}");
    assert_eq!(first_sample(&m, "hvstats_observer_qmp_sessions_up"), Some(1.0), "{m}");
    let before = halts(&m).unwrap();

    // Stopped: within the QMP deadline the source is down, the state unknown, KVM's counters
    // from QMP absent (not frozen at a stale value); the VM stays observed.
    qemu.stop();
    let stopped_at = Instant::now();
    let m = serve.metrics_until(Duration::from_secs(10), |m| common::sample(m, &up).as_deref() == Some("0"));
    assert_eq!(common::sample(&m, &state("unknown")).as_deref(), Some("1"), "{m}");
    assert_eq!(halts(&m), None, "{m}");
    assert_eq!(first_sample(&m, "hvstats_observer_qmp_sessions_up"), Some(0.0), "{m}");
    let lost = serve.wait_line(&format!("pid {pid} \"{tag}\": qmp lost"));
    assert!(lost.contains("stopped (SIGSTOP or a debugger)"), "{lost}");
    std::thread::sleep(Duration::from_secs(10).saturating_sub(stopped_at.elapsed()));

    // Continued: back at the latest at the second refresh that ends after QEMU answers again
    // (counted by the observer's own refresh time, so a slow host changes nothing).
    let refreshed = |m: &str| first_sample(m, "hvstats_observer_last_refresh_timestamp_seconds");
    let since_epoch = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    qemu.cont();
    assert!(control.is_running().unwrap(), "QEMU answers again, running");
    let continued = since_epoch().as_secs_f64();
    let mut refreshes = std::collections::BTreeSet::new();
    let m = serve.metrics_until(Duration::from_secs(20), |m| {
        if let Some(t) = refreshed(m).filter(|t| *t > continued) {
            refreshes.insert(t.to_bits());
        }
        common::sample(m, &up).as_deref() == Some("1")
    });
    assert!(refreshes.len() <= 2, "back after {} refreshes", refreshes.len());
    assert_eq!(common::sample(&m, &state("running")).as_deref(), Some("1"), "{m}");
    // The counts go on from where they were (the same QEMU: counted since attach).
    let m = serve.metrics_until(Duration::from_secs(20), |m| halts(m).is_some_and(|h| h > before));
    assert!(halts(&m).unwrap() > before);
    let back = serve.wait_line(&format!("pid {pid} \"{tag}\": qmp back after"));
    assert!(back.contains(" s"), "{back}");
    // One line each way (both taken above), not one per refresh.
    let more = serve.lines_with(&format!("pid {pid} \"{tag}\": qmp"));
    assert!(more.is_empty(), "{more:?}");
}

#[test]
fn a_qemu_restarted_on_the_same_socket_is_observed_again() {
    if !kvm_available("a_qemu_restarted_on_the_same_socket_is_observed_again") {
        return;
    }
    let tmp = TempDir::new("observe-qmp-restart");
    let tag = format!("again-{}", std::process::id());
    let first = Qemu::start(tmp.path(), &tag, &["-S"]);
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let socket = first.qmp.to_str().unwrap().to_owned();
    let observe = Running::start(&["observe", "--qmp", &socket, "--interval", "0.2"], &run);
    let attach = observe.wait_line(&format!("attach pid {}", first.pid()));
    assert!(!attach.contains("unavailable"), "{attach}");
    // Paused (-S): its state says so.
    let paused = || {
        let v = common::snapshot_json(&run);
        let p = v["instances"][0]["partitions"].as_array().cloned().unwrap_or_default();
        p.iter().any(|p| p["counters"]["vm_state"] == "paused")
    };
    let t = Instant::now();
    while !paused() {
        assert!(t.elapsed() < Duration::from_secs(10), "{}", common::snapshot_json(&run));
        std::thread::sleep(Duration::from_millis(100));
    }
    let first_pid = first.pid();
    drop(first);
    observe.wait_line(&format!("detach pid {first_pid}"));
    // The same socket, a new QEMU: observed again, by the same observer.
    let second = Qemu::start(tmp.path(), &tag, &["-S"]);
    let attach = observe.wait_line(&format!("attach pid {}", second.pid()));
    assert!(attach.contains(&format!("\"{tag}\"")), "{attach}");
}

#[test]
fn a_qemu_stopped_at_attach_is_named_stopped_and_gives_its_counters_once_continued() {
    if !kvm_available("a_qemu_stopped_at_attach_is_named_stopped_and_gives_its_counters_once_continued") {
        return;
    }
    let tmp = TempDir::new("observe-qmp-stall");
    let tag = format!("stall-{}", std::process::id());
    let qemu = Qemu::start(tmp.path(), &tag, &["-S"]);
    qemu.stop();
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let pid = qemu.pid().to_string();
    let observe = Running::start(&["observe", "--pid", &pid, "--interval", "0.2"], &run);
    let attach = observe.wait_line(&format!("attach pid {pid}"));
    assert!(attach.contains("stopped (SIGSTOP or a debugger)"), "{attach}");
    assert!(!attach.contains("another client"), "a stall is no other client: {attach}");
    qemu.cont();
    observe.wait_line(&format!("pid {pid} \"{tag}\": qmp back after"));
}

#[test]
fn an_observer_that_dies_is_reported_down_until_another_observer_publishes() {
    let tmp = TempDir::new("serve-observer-dies");
    // An observer waiting for a QEMU on a socket no one serves now (a QEMU that stopped leaves
    // its socket file): up, observing nothing. A path with no socket at all is refused at once.
    let nowhere = tmp.path().join("nobody.sock");
    drop(std::os::unix::net::UnixListener::bind(&nowhere).unwrap());
    let observer =
        || Running::start(&["observe", "--qmp", nowhere.to_str().unwrap(), "--interval", "0.1"], tmp.path());
    let mut first = observer();
    let published = first.wait_line("publishing observed VMs as instance ");
    let name = published.split("as instance ").nth(1).unwrap().split(' ').next().unwrap().to_owned();
    let serve = Running::start(&["serve", "--listen", "127.0.0.1:0"], tmp.path());
    let up = |name: &str| format!("hvstats_observer_up{{publisher=\"{name}\"}}");
    let m = serve
        .metrics_until(Duration::from_secs(20), |m| common::sample(m, &up(&name)).as_deref() == Some("1"));
    assert!(
        first_sample(&m, "hvstats_observer_last_refresh_timestamp_seconds").is_some_and(|t| t > 1e9),
        "{m}"
    );
    assert_eq!(
        common::sample(&m, &format!("hvstats_observer_vms{{publisher=\"{name}\",state=\"attached\"}}"))
            .as_deref(),
        Some("0")
    );
    // Killed: it removes nothing, and is reported down, not gone.
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    serve.metrics_until(Duration::from_secs(20), |m| common::sample(m, &up(&name)).as_deref() == Some("0"));
    // Another observer publishes: the dead one is forgotten.
    let second = observer();
    let published = second.wait_line("publishing observed VMs as instance ");
    let name2 = published.split("as instance ").nth(1).unwrap().split(' ').next().unwrap().to_owned();
    let m = serve
        .metrics_until(Duration::from_secs(20), |m| common::sample(m, &up(&name2)).as_deref() == Some("1"));
    assert_eq!(common::sample(&m, &up(&name)), None, "{m}");
}

#[test]
fn the_observer_lets_go_of_a_qemus_qmp_socket_when_another_client_waits_for_it() {
    if !kvm_available("the_observer_lets_go_of_a_qemus_qmp_socket_when_another_client_waits_for_it") {
        return;
    }
    let tmp = TempDir::new("observe-qmp-yield");
    let tag = format!("yield-{}", std::process::id());
    let qemu = Qemu::start(tmp.path(), &tag, &["-S"]);
    let run = tmp.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let pid = qemu.pid().to_string();
    // The socket is found on QEMU's command line, and held by the observer.
    let observe = Running::start(&["observe", "--pid", &pid, "--interval", "0.2"], &run);
    let attach = observe.wait_line(&format!("attach pid {pid}"));
    assert!(attach.contains("; QMP ") && !attach.contains("unavailable"), "{attach}");
    // An operator's tool connects: it is served (QEMU serves one client), not left waiting.
    let mut tool = hvstats_vmm::qmp::Qmp::connect(&qemu.qmp, Duration::from_secs(10))
        .expect("the observer let go of the socket");
    assert!(!tool.is_running().unwrap(), "started with -S");
    let lost = observe.wait_line(&format!("pid {pid} \"{tag}\": qmp lost"));
    assert!(lost.contains("another client waits for the QMP socket"), "{lost}");
    // Once the tool is gone, the observer takes the socket again.
    drop(tool);
    observe.wait_line(&format!("pid {pid} \"{tag}\": qmp back after"));
}
