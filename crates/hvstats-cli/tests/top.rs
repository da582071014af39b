//! `hvstats top` over instances this test publishes: `--once` (JSON and text) with exact deltas,
//! and the full-screen view in a real terminal (tmux: `send-keys`, `capture-pane`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use common::{KilledOnDrop, TempDir, publish_partition as publish};

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use hvstats_abi::catalog::vp;
use hvstats_testkit::{spawn_qemu, wait_for_kvm_vcpus};
use serde_json::Value;

/// Waits until `top --once` (process `pid`) has taken its first reading: its one thread then
/// sleeps through the interval (`clock_nanosleep`), and what is written now falls in it.
fn wait_for_first_reading(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let syscall = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
        if syscall.split(' ').next().and_then(|n| n.parse::<i64>().ok()) == Some(libc::SYS_clock_nanosleep) {
            return;
        }
        assert!(Instant::now() < deadline, "top took no first reading: {syscall}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn name(id: hvstats_abi::CounterId) -> &'static str {
    id.counter().unwrap().name
}

fn top(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .arg("top")
        .arg("--runtime-dir")
        .arg(dir)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn once_json_gives_exact_deltas_rates_and_costs_over_its_interval() {
    let tmp = TempDir::new("top-once");
    let (_hv, part) = publish(tmp.path(), 2);
    let page = part.vp_page(1).unwrap();
    page.set(vp::IO_INSTRUCTIONS, 500);
    page.set(vp::IO_INSTRUCTIONS_COST, 1_000);
    // Recorded before the first reading: not part of the interval's distribution.
    for _ in 0..50 {
        page.record_time(vp::IO_TIME_HISTOGRAM, 5_000_000);
    }
    // The first reading is taken at once, the second 3 s later: write in between.
    let child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["top", "--once", "--json", "--interval", "3", "--runtime-dir"])
        .arg(tmp.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_first_reading(child.id());
    page.add(vp::IO_INSTRUCTIONS, 1200);
    page.add(vp::IO_INSTRUCTIONS_COST, 1200 * 42); // 4.2 µs each
    part.vp_page(0).unwrap().add(vp::HYPERCALLS, 3);
    // In the interval: 98 port accesses in [512, 1024) ns, 2 in [16384, 32768) ns; 30 dispatches
    // that waited 1.5 ms in all.
    for ns in std::iter::repeat_n(700, 98).chain([20_000, 30_000]) {
        page.record_time(vp::IO_TIME_HISTOGRAM, ns);
    }
    page.add(vp::DISPATCHES, 30);
    page.add(vp::CPU_WAIT_TIME_PER_DISPATCH, 1_500_000);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let seconds = v["interval_seconds"].as_f64().unwrap();
    assert!((3.0..4.0).contains(&seconds), "{seconds}");
    let p = &v["partitions"][0];
    assert_eq!(p["partition"], part.id());
    let vp1 = p["vps"].as_array().unwrap().iter().find(|r| r["vp"] == 1).unwrap();
    assert_eq!(vp1["deltas"][common::delta(name(vp::IO_INSTRUCTIONS))], 1200);
    assert_eq!(vp1["deltas"][common::delta(name(vp::IO_INSTRUCTIONS_COST))], 1200 * 42);
    let rate = vp1["presented"][common::presented(name(vp::IO_INSTRUCTIONS))].as_f64().unwrap();
    assert!((rate * seconds - 1200.0).abs() < 1e-6, "{rate} × {seconds}");
    // Costs in ns, as the key says (the live columns show them in µs).
    assert_eq!(vp1["presented"][common::presented(name(vp::IO_INSTRUCTIONS_COST))].as_f64().unwrap(), 4200.0);
    // No CPUID exits: no average cost, shown as null rather than 0.
    assert_eq!(vp1["presented"][common::presented(name(vp::CPUID_INSTRUCTIONS_COST))], Value::Null);
    assert_eq!(v["schema_version"], 2);
    assert_eq!(v["units"][common::presented(name(vp::IO_INSTRUCTIONS_COST))], "ns");
    assert_eq!(v["units"][common::presented(name(vp::IO_INSTRUCTIONS))], "/s");
    // The interval's cost distribution and CPU wait.
    let io = &vp1["histograms"][name(vp::IO_TIME_HISTOGRAM)];
    assert_eq!(io["count"], 100, "{vp1}");
    assert_eq!(io["p50_ns"], 1023);
    assert_eq!(io["p99_ns"], 32_767);
    let vp0 = p["vps"].as_array().unwrap().iter().find(|r| r["vp"] == 0).unwrap();
    assert_eq!(vp0["histograms"][name(vp::IO_TIME_HISTOGRAM)]["p50_ns"], Value::Null);
    assert_eq!(vp1["cpu_wait"]["per_dispatch_ns"].as_f64().unwrap(), 50_000.0);
    // The catalog's own presentation of CPU wait (a cost per dispatch) is a column, in ns per
    // dispatch over the interval.
    assert_eq!(vp1["presented"]["cpu_wait_time_per_dispatch_ns"].as_f64().unwrap(), 50_000.0);
    assert_eq!(v["units"]["cpu_wait_time_per_dispatch_ns"], "ns");
    let percent = vp1["cpu_wait"]["percent"].as_f64().unwrap();
    assert!((percent * seconds - 0.15).abs() < 1e-9, "{percent} % over {seconds} s");
    assert_eq!(vp0["cpu_wait"]["per_dispatch_ns"], Value::Null);
    // The partition total sums its VPs.
    assert_eq!(p["total"]["deltas"][common::delta(name(vp::IO_INSTRUCTIONS))], 1200);
    assert_eq!(p["total"]["deltas"][common::delta(name(vp::HYPERCALLS))], 3);
}

#[test]
fn once_text_lists_partitions_and_vps_or_says_there_is_nothing() {
    let tmp = TempDir::new("top-text");
    let out = top(tmp.path(), &["--once", "--interval", "0.1"]);
    assert_eq!(out.status.code(), Some(4), "nothing publishes: snapshot's status");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.starts_with("no observer or partition publishes under") && said.contains("hvstats run"),
        "{said}"
    );
    let (hv, part) = publish(tmp.path(), 3);
    let out = top(tmp.path(), &["--once", "--interval", "0.1"]);
    let text = String::from_utf8(out.stdout).unwrap();
    let vm = format!("{}:{}", hv.published_name().unwrap(), part.id());
    assert!(text.lines().nth(1).unwrap().contains("CPUID/s"), "{text}");
    assert!(text.lines().any(|l| l.starts_with(&vm)), "{text}");
    for i in 0..3 {
        assert!(text.lines().any(|l| l.starts_with(&format!("  VP {i} "))), "{text}");
    }
    // Cost columns: the dominant class of the interval and its p50/p99, in human units.
    let page = part.vp_page(2).unwrap();
    page.record_time(vp::MSR_TIME_HISTOGRAM, 90_000_000); // before the interval: not shown
    let child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["top", "--once", "--interval", "2", "--runtime-dir"])
        .arg(tmp.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_first_reading(child.id());
    // VP 2: 97 port accesses in [512, 1024) ns and 3 in [2, 4) ms (IO: 6.07 ms in all), 10 MSR
    // accesses of 100 µs (1 ms): IO dominates, p50 ≤ 1023 ns, p99 ≤ 4194303 ns.
    for ns in std::iter::repeat_n(700, 97).chain([3_000_000; 3]) {
        page.record_time(vp::IO_TIME_HISTOGRAM, ns);
    }
    for _ in 0..10 {
        page.record_time(vp::MSR_TIME_HISTOGRAM, 100_000);
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let cells = |line: &str| {
        line.get(24..).unwrap().split_whitespace().take(5).map(str::to_owned).collect::<Vec<_>>()
    };
    // Only the cost columns move: they come first, then the columns that stay at 0 (run time,
    // exits and CPU wait first among them, in their order).
    let header = text.lines().nth(1).unwrap();
    assert_eq!(cells(header), ["Class", "p50", "p99", "Run%", "Exits/s"], "{text}");
    let row = |prefix: &str| text.lines().find(|l| l.starts_with(prefix)).unwrap();
    assert_eq!(cells(row("  VP 2 "))[..3], ["IO", "1.0µs", "4.2ms"], "{text}");
    assert_eq!(cells(row("  VP 0 "))[..3], ["-", "-", "-"], "{text}");
    assert_eq!(cells(row(&vm))[..3], ["IO", "1.0µs", "4.2ms"], "{text}");

    let missing = top(&tmp.path().join("missing"), &["--once"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("does not exist"));
    let bad = top(tmp.path(), &["--once", "--interval", "0"]);
    assert!(!bad.status.success());
    let json_alone = top(tmp.path(), &["--json"]);
    assert!(!json_alone.status.success(), "--json needs --once");
    // Not a terminal (the output is a pipe): a clear error, not a broken screen.
    let piped = top(tmp.path(), &[]);
    assert!(!piped.status.success());
    assert!(String::from_utf8_lossy(&piped.stderr).contains("needs a terminal"));
}

/// On a host where nothing made the runtime directory yet (`/run/hvstats` missing), `top --once`
/// says that no observer or partition publishes and how to start one, with `snapshot`'s status,
/// and nothing about opening a directory; `--json` gives an empty table.
#[test]
fn once_with_no_runtime_directory_says_how_to_start_the_observer() {
    let Some(out) = common::hvstats_without_runtime_dir(&["top", "--once", "--interval", "0.1"]) else {
        return;
    };
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(4), "{stdout}{stderr}");
    let said = "no observer or partition publishes under /run/hvstats: start the observer (`systemctl start \
                hvstats-observe`, or `hvstats observe --all` as root) to count the VMs running here, or run \
                a partition (`hvstats run`)";
    assert_eq!(stdout, format!("{said}\n"));
    assert!(stderr.is_empty(), "{stderr}");
    let Some(out) = common::hvstats_without_runtime_dir(&["top", "--once", "--json", "--interval", "0.1"])
    else {
        return;
    };
    assert_eq!(out.status.code(), Some(4));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["partitions"].as_array().map(Vec::len), Some(0), "{v}");
    assert_eq!(String::from_utf8_lossy(&out.stderr), format!("hvstats: {said}\n"));
}

/// tmux on a private socket, killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux").arg("-L").arg(&self.socket).args(args).output().unwrap()
    }

    fn screen(&self) -> String {
        String::from_utf8(self.run(&["capture-pane", "-p", "-t", "top"]).stdout).unwrap()
    }

    /// Waits until the screen shows `text` (10 s at most); returns the screen.
    fn wait_for(&self, text: &str) -> String {
        self.wait_until(text, |screen| screen.contains(text))
    }

    /// Waits until `ok` holds for the screen (10 s at most); returns the screen.
    fn wait_until(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let screen = self.screen();
            if ok(&screen) {
                return screen;
            }
            assert!(Instant::now() < deadline, "the screen never showed {what}:\n{screen}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn alive(&self) -> bool {
        self.run(&["has-session", "-t", "top"]).status.success()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

#[test]
fn top_in_tmux_shows_the_vps_of_a_live_partition_and_quits_on_q() {
    if Command::new("tmux").arg("-V").output().is_err() {
        assert!(std::env::var("HVSTATS_REQUIRE_TMUX").as_deref() != Ok("1"), "tmux is missing");
        eprintln!("top_in_tmux: tmux is missing (Debian package tmux): skipped");
        return;
    }
    let tmp = TempDir::new("top-tmux");
    let (hv, part) = publish(tmp.path(), 2);
    part.vp_page(1).unwrap().set(vp::HYPERCALLS, 1);
    let tmux = Tmux { socket: format!("hvstats-top-{}", std::process::id()) };
    let command = format!(
        "{} top --interval 0.3 --runtime-dir {}",
        env!("CARGO_BIN_EXE_hvstats"),
        tmp.path().display()
    );
    let started = tmux.run(&["new-session", "-d", "-s", "top", "-x", "200", "-y", "30", &command]);
    assert!(started.status.success(), "{}", String::from_utf8_lossy(&started.stderr));
    // Keep the pane after the command exits, to tell "quit" from "crashed".
    tmux.run(&["set-option", "-t", "top", "remain-on-exit", "on"]);

    let vm = format!("{}:{}", hv.published_name().unwrap(), part.id());
    let screen = tmux.wait_for("VP 1");
    assert!(screen.contains("hvstats top"), "{screen}");
    assert!(screen.contains(&vm), "{screen}");
    assert!(screen.contains("VP 0"), "{screen}");
    assert!(screen.contains("Hcall/s") && screen.contains("CPUID/s"), "{screen}");

    // Hypercalls at a steady rate show up in the VP's row and sort it first.
    let writer_stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (part, stop) = (part.clone(), writer_stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let page = part.vp_page(1).unwrap();
                page.add(vp::HYPERCALLS, 100);
                page.record_time(vp::IO_TIME_HISTOGRAM, 700);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    // Run%, Exits/s, Wait%, p50, p99, then hypercalls.
    tmux.run(&["send-keys", "-t", "top", "o", "o", "o", "o", "o", "o"]);
    tmux.wait_for("sort Hcall/s↓");
    // VP 1 makes hypercalls and port accesses of 700 ns, VP 0 none: VP 1 comes first, its class
    // IO with p50 and p99 ≤ 1023 ns. The columns that move come first: Class, p50, p99, Hcall/s.
    let cells = |line: &str| line.split_whitespace().skip(2).map(str::to_owned).collect::<Vec<_>>();
    let hcall_rate = |line: &str| cells(line).get(3).and_then(|v| v.parse::<f64>().ok());
    let screen = tmux.wait_until("VP 1 first with hypercalls", |screen| {
        let vps: Vec<&str> = screen.lines().filter(|l| l.trim_start().starts_with("VP ")).collect();
        let header = screen.lines().find(|l| l.starts_with("VM / VP")).unwrap_or_default();
        header.split_whitespace().skip(3).take(4).eq(["Class", "p50", "p99", "Hcall/s"])
            && vps.len() == 2
            && vps[0].trim_start().starts_with("VP 1")
            && hcall_rate(vps[0]).is_some_and(|r| r > 0.0)
    });
    let vp1 = screen.lines().find(|l| l.trim_start().starts_with("VP 1")).unwrap();
    assert_eq!(cells(vp1)[..3], ["IO", "1.0µs", "1.0µs"], "{screen}");
    let vp0 = screen.lines().find(|l| l.trim_start().starts_with("VP 0")).unwrap();
    assert_eq!(hcall_rate(vp0), Some(0.0), "{screen}");
    assert_eq!(cells(vp0)[..3], ["-", "-", "-"], "{screen}");

    tmux.run(&["send-keys", "-t", "top", "h"]);
    let screen = tmux.wait_for(" keys ");
    assert!(screen.contains("filter VMs by regex"), "{screen}");
    tmux.run(&["send-keys", "-t", "top", "h"]);

    // A filter nothing matches empties the view; an empty filter shows everything again.
    tmux.run(&["send-keys", "-t", "top", "f", "nomatch", "Enter"]);
    tmux.wait_for("no VM matches the filter");
    tmux.run(&[
        "send-keys",
        "-t",
        "top",
        "f",
        "BSpace",
        "BSpace",
        "BSpace",
        "BSpace",
        "BSpace",
        "BSpace",
        "BSpace",
    ]);
    tmux.run(&["send-keys", "-t", "top", "Enter"]);
    tmux.wait_for("VP 1");

    // The terminal shrinks: fewer columns (those that move), still running.
    tmux.run(&["resize-window", "-t", "top", "-x", "60", "-y", "20"]);
    let screen =
        tmux.wait_until("60 columns", |s| s.lines().all(|l| l.chars().count() <= 60) && s.contains("p99"));
    assert!(!screen.contains("Migr/s") && !screen.contains("Run%"), "{screen}");

    // The instance goes away: the view says so and keeps running.
    writer_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    drop((part, hv));
    tmux.wait_for("no observer or partition publishes");

    tmux.run(&["send-keys", "-t", "top", "q"]);
    let pid = tmux.run(&["display-message", "-p", "-t", "top", "#{pane_pid}"]);
    let pid = String::from_utf8_lossy(&pid.stdout).trim().to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // dead, exit status, and the signal that ended it (empty unless killed by one)
        let format = "#{pane_dead} #{pane_dead_status} #{pane_dead_signal}";
        let dead = tmux.run(&["display-message", "-p", "-t", "top", format]);
        let status = String::from_utf8_lossy(&dead.stdout).trim().to_owned();
        if status == "1 0" {
            break;
        }
        // tmux has been seen to leave its pane's process unreaped: once it has exited, the
        // kernel keeps its exit status in /proc until someone reaps it.
        if let Some(exit) = zombie_exit_status(&pid) {
            assert_eq!(exit, 0, "top exited with wait status {exit:#x} on q");
            break;
        }
        if Instant::now() >= deadline {
            let state = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let state = state.lines().find(|l| l.starts_with("State:")).unwrap_or("gone").to_owned();
            panic!(
                "top did not exit 0 on q (dead, status, signal: {status:?}; pane process {pid}: {state})\n{}",
                tmux.screen()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(tmux.alive());
}

/// The wait status of process `pid` once it has exited and is not yet reaped (a zombie): field 52
/// of /proc/<pid>/stat.
fn zombie_exit_status(pid: &str) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may itself hold spaces and parentheses: field 3 first.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    (fields.first() == Some(&"Z")).then(|| fields.get(52 - 3)?.parse().ok()).flatten()
}

#[test]
fn the_wait_status_of_an_unreaped_process_is_read_from_proc() {
    let mut child = Command::new("sh").args(["-c", "exit 3"]).spawn().unwrap();
    let pid = child.id().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = zombie_exit_status(&pid) {
            break status;
        }
        assert!(Instant::now() < deadline, "sh never exited");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status, 3 << 8, "exit(3) in the form waitpid reports");
    child.wait().unwrap();
    assert_eq!(zombie_exit_status(&pid), None, "reaped: no longer a zombie");
}

/// An observed QEMU VM (SeaBIOS booting, then idle) in an 80-column terminal: the columns that
/// have data come first, so its port I/O rate shows instead of columns of dashes.
#[test]
fn top_at_80_columns_shows_the_columns_that_have_data_for_an_observed_qemu_vm() {
    if !common::kvm_available("top_at_80_columns_shows_the_columns_that_have_data_for_an_observed_qemu_vm") {
        return;
    }
    if Command::new("tmux").arg("-V").output().is_err() {
        assert!(std::env::var("HVSTATS_REQUIRE_TMUX").as_deref() != Ok("1"), "tmux is missing");
        eprintln!("tmux is missing (Debian package tmux): skipped");
        return;
    }
    // With a QMP socket, as operators run QEMU: KVM's statistics (the exits among them) come
    // through it.
    let work = TempDir::new("top-qemu-qmp");
    let Some(qemu) = spawn_qemu(
        Command::new("qemu-system-x86_64")
            .args(["-accel", "kvm", "-display", "none", "-nodefaults", "-m", "16", "-name", "guest=top-vm"])
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", work.path().join("qmp.sock").display()))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
        "top_at_80_columns_shows_the_columns_that_have_data_for_an_observed_qemu_vm",
    ) else {
        return;
    };
    let qemu = KilledOnDrop(qemu);
    // `observe --pid` needs the VM to exist: wait for QEMU's first vCPU descriptor.
    wait_for_kvm_vcpus(qemu.0.id() as i32, 1, Duration::from_secs(30));
    let tmp = TempDir::new("top-qemu");
    let observer = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["observe", "--interval", "0.2", "--pid", &qemu.0.id().to_string(), "--runtime-dir"])
        .arg(tmp.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _observer = KilledOnDrop(observer);
    let tmux = Tmux { socket: format!("hvstats-top-qemu-{}", std::process::id()) };
    let command = format!(
        "{} top --interval 0.5 --runtime-dir {}",
        env!("CARGO_BIN_EXE_hvstats"),
        tmp.path().display()
    );
    let started = tmux.run(&["new-session", "-d", "-s", "top", "-x", "80", "-y", "24", &command]);
    assert!(started.status.success(), "{}", String::from_utf8_lossy(&started.stderr));
    // The port I/O rate is a column once the observer's events source has counted the first
    // accesses, which a busy host may take a few screens to: then it must fit in 80 columns.
    let header_of = |s: &str| s.lines().find(|l| l.starts_with("VM / VP")).unwrap_or_default().to_owned();
    let screen = tmux.wait_until("the VM's rows with its port I/O rate (IO/s) within 80 columns", |s| {
        s.lines().any(|l| l.starts_with("top-vm")) && header_of(s).contains("IO/s")
    });
    // Columns with data first: in the VM's row no dash comes before a value.
    let row = screen.lines().find(|l| l.starts_with("top-vm")).unwrap();
    let cells: Vec<&str> = row["top-vm".len()..].split_whitespace().collect();
    let first_dash = cells.iter().position(|c| *c == "-").unwrap_or(cells.len());
    assert!(cells[first_dash..].iter().all(|c| *c == "-"), "a column of data after one without:\n{screen}");
    assert!(first_dash >= 3, "Run%, Wait% and the port I/O rate have data:\n{screen}");
    // The exits move: at 80 columns their rate is shown, and no column at 0 comes before one
    // that moves.
    assert!(header_of(&screen).contains("Exits/s"), "the exit rate is cut off at 80 columns:\n{screen}");
    let first_zero =
        cells.iter().position(|c| c.parse::<f64>().is_ok_and(|v| v == 0.0)).unwrap_or(cells.len());
    let moving_after =
        cells[first_zero..].iter().any(|c| *c != "-" && !c.parse::<f64>().is_ok_and(|v| v == 0.0));
    assert!(!moving_after, "a moving column after one at 0:\n{screen}");
}

/// Exits per second are a column (`--fields Exits/s`) and a JSON value; a large rate is scaled as
/// `snapshot` scales counts, and the columns that move come before those that stay at 0 or have
/// nothing to show.
#[test]
fn once_shows_exits_per_second_scaled_with_the_moving_columns_first() {
    let tmp = TempDir::new("top-exits");
    let (_hv, part) = publish(tmp.path(), 2);
    let once = |args: &[&str], during: &dyn Fn()| {
        let child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
            .args(["top", "--once", "--interval", "2", "--runtime-dir"])
            .arg(tmp.path())
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        wait_for_first_reading(child.id());
        during();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    // VP 0 exits 2.4 million times in the interval (about 1.2M a second), VP 1 not at all.
    let exits = || part.vp_page(0).unwrap().add(vp::EXITS, 2_400_000);
    let json: Value = serde_json::from_str(&once(&["--json"], &exits)).unwrap();
    let seconds = json["interval_seconds"].as_f64().unwrap();
    let key = common::presented(name(vp::EXITS));
    let p = &json["partitions"][0];
    let rate = p["vps"][0]["presented"][&key].as_f64().unwrap();
    assert!((rate * seconds - 2_400_000.0).abs() < 1e-3, "{rate} × {seconds}");
    assert_eq!(p["vps"][1]["presented"][&key], 0.0);
    assert_eq!(p["total"]["deltas"][common::delta(name(vp::EXITS))], 2_400_000);
    assert_eq!(json["units"][&key], "/s");

    let text = once(&["--fields", "exits/s,Run%"], &exits);
    let header = text.lines().find(|l| l.starts_with("VM / VP")).unwrap();
    assert_eq!(header.split_whitespace().collect::<Vec<_>>(), ["VM", "/", "VP", "Exits/s", "Run%"], "{text}");
    let cell =
        text.lines().find(|l| l.starts_with("  VP 0 ")).unwrap()[24..].split_whitespace().next().unwrap();
    let millions: f64 =
        cell.strip_suffix('M').unwrap_or_else(|| panic!("{cell:?} is not in millions")).parse().unwrap();
    assert!((1.0..=1.2).contains(&millions) && cell.len() == "1.18M".len(), "{cell}");
    assert_eq!(
        text.lines().find(|l| l.starts_with("  VP 1 ")).unwrap()[24..].split_whitespace().next(),
        Some("0.0")
    );

    // Every column: Exits/s, the only one that moves, first; then those at 0; then those that
    // have nothing to show (the run loop's costs without exits).
    let text = once(&[], &exits);
    let header = text.lines().find(|l| l.starts_with("VM / VP")).unwrap();
    let row = text.lines().find(|l| l.starts_with("  VP 0 ")).unwrap();
    let columns: Vec<&str> = header[24..].split_whitespace().filter(|h| *h != "µs").collect();
    let cells: Vec<&str> = row[24..].split_whitespace().collect();
    assert_eq!((columns[0], cells.len()), ("Exits/s", columns.len()), "{text}");
    let kind = |c: &str| match c {
        "-" => 2,
        _ if c.parse::<f64>().is_ok_and(|v| v == 0.0) => 1,
        _ => 0,
    };
    let kinds: Vec<u8> = cells.iter().map(|c| kind(c)).collect();
    assert!(
        kinds.windows(2).all(|w| w[0] <= w[1]),
        "a moving column after one at 0, or one at 0 after a -:\n{text}"
    );
    assert_eq!(kinds[0], 0, "{text}");
    assert!(kinds.contains(&1) && kinds.contains(&2), "{text}");
}

/// Two VMs with one name are two groups told apart by their instance; `--fields` picks the
/// columns, and a missing column is a usage error naming the columns there are.
#[test]
fn once_tells_two_vms_of_one_name_apart_and_shows_the_chosen_fields() {
    let tmp = TempDir::new("top-dup");
    let a = common::publish(tmp.path());
    let b = common::publish(tmp.path());
    let pa = a.create_partition_named(1, "dup").unwrap();
    let pb = b.create_partition_named(1, "dup").unwrap();
    pa.vp_page(0).unwrap().set(vp::IO_INSTRUCTIONS, 1);
    pb.vp_page(0).unwrap().set(vp::IO_INSTRUCTIONS, 1);
    let out = top(tmp.path(), &["--once", "--interval", "0.2", "--fields", "IO/s,run%"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let header = text.lines().find(|l| l.starts_with("VM / VP")).unwrap();
    assert_eq!(header.split_whitespace().collect::<Vec<_>>(), ["VM", "/", "VP", "IO/s", "Run%"], "{text}");
    for hv in [&a, &b] {
        let label = format!("dup [{}]", hv.published_name().unwrap());
        assert!(text.lines().any(|l| l.starts_with(&label)), "no row {label:?}:\n{text}");
    }
    let out = top(tmp.path(), &["--once", "--fields", "IO/s,MSR cost"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no column \"MSR cost\"") && stderr.contains("MSR µs"), "{stderr}");
}

#[test]
fn a_vm_name_with_control_characters_is_shown_escaped() {
    let tmp = TempDir::new("top-name");
    let hv = common::publish(tmp.path());
    let _part = hv.create_partition_named(1, "dup\n  VP 9 forged\u{1b}[2J").unwrap();
    let out = top(tmp.path(), &["--once", "--interval", "0.1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains('\u{1b}') && !text.lines().any(|l| l.starts_with("  VP 9 forged")), "{text:?}");
    // Escaped, then cut to the label column.
    assert!(text.lines().any(|l| l.starts_with(r"dup\n  VP 9 forged\u{1b} ")), "{text}");
}

/// `--vm` keeps the VMs whose name matches, in `--once` and in the live view, where an
/// 80-column screen keeps the help and quit keys in its key bar.
#[test]
fn top_vm_shows_only_the_vms_named_and_an_80_column_key_bar_keeps_quit() {
    let tmp = TempDir::new("top-vm");
    let hv = common::publish(tmp.path());
    let web = hv.create_partition_named(1, "web-1").unwrap();
    let db = hv.create_partition_named(1, "db-1").unwrap();
    web.vp_page(0).unwrap().set(vp::IO_INSTRUCTIONS, 1);
    db.vp_page(0).unwrap().set(vp::IO_INSTRUCTIONS, 1);
    let out = top(tmp.path(), &["--once", "--interval", "0.2", "--vm", "^db-"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.lines().any(|l| l.starts_with("db-1")), "{text}");
    assert!(!text.contains("web-1"), "{text}");
    let out = top(tmp.path(), &["--once", "--vm", "("]);
    assert_eq!(out.status.code(), Some(2), "an invalid regex is a usage error");

    if Command::new("tmux").arg("-V").output().is_err() {
        assert!(std::env::var("HVSTATS_REQUIRE_TMUX").as_deref() != Ok("1"), "tmux is missing");
        eprintln!("top_vm: tmux is missing (Debian package tmux): skipped");
        return;
    }
    let tmux = Tmux { socket: format!("hvstats-top-vm-{}", std::process::id()) };
    let command = format!(
        "{} top --interval 0.3 --vm web --runtime-dir {}",
        env!("CARGO_BIN_EXE_hvstats"),
        tmp.path().display()
    );
    let started = tmux.run(&["new-session", "-d", "-s", "top", "-x", "80", "-y", "24", &command]);
    assert!(started.status.success(), "{}", String::from_utf8_lossy(&started.stderr));
    let screen = tmux.wait_for("web-1");
    assert!(!screen.contains("db-1"), "{screen}");
    let bar = screen.lines().rev().find(|l| !l.trim().is_empty()).unwrap();
    assert!(bar.trim_end().ends_with("h help  q quit"), "the key bar lost its keys at 80 columns:\n{screen}");
    assert!(bar.starts_with("o/O sort"), "{screen}");
    tmux.run(&["send-keys", "-t", "top", "q"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while tmux.alive() {
        assert!(Instant::now() < deadline, "q did not quit:\n{}", tmux.screen());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn once_with_a_vm_regex_that_matches_nothing_says_so_and_lists_the_vms_there_are() {
    let tmp = TempDir::new("top-nomatch");
    let (hv, part) = publish(tmp.path(), 1);
    let vm = format!("{}:{}", hv.published_name().unwrap(), part.id());
    let out = top(tmp.path(), &["--once", "--interval", "0.1", "--vm", "nosuch"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text, format!("no VM matches --vm nosuch: the live VMs are \"{vm}\"\n"));
    // A regex that matches still gives the table.
    let out = top(tmp.path(), &["--once", "--interval", "0.1", "--vm", &regex_escape(&vm)]);
    assert!(String::from_utf8_lossy(&out.stdout).lines().any(|l| l.starts_with(&vm)));
}

/// `s` as a regex matching itself.
fn regex_escape(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_string() } else { format!("\\{c}") }).collect()
}
