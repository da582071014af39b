//! What every command does with closed and full outputs, hostile input files, bad ranges and
//! signals: clear errors and the documented exit statuses, never a panic or a hang.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use common::{TempDir, kvm_available};

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

fn hvstats() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_hvstats"));
    c.env("HVSTATS_PMU", "gp=6,fixed=3,cpus=4").env_remove("HVSTATS_RUNTIME_DIR");
    c
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Waits at most `limit` for `child`; kills it and fails the test when it hangs.
fn wait_bounded(mut child: Child, limit: Duration, what: &str) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} still ran after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A sample page (every counter holding its offset) at `dir/page`.
fn sample_page(dir: &Path) -> String {
    let page = dir.join("page");
    let o = hvstats().args(["dump", "--write-sample"]).arg(&page).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    page.to_str().unwrap().to_owned()
}

/// The commands that print something without KVM, each with the args it needs, and the instance
/// they read under `dir` (with nothing published, `snapshot` and `top` end with status 4).
fn printing_commands(dir: &Path) -> (Vec<Vec<String>>, std::sync::Arc<hvstats::Hypervisor>) {
    let hv = common::publish(dir);
    hv.create_partition(1).unwrap();
    let page = sample_page(dir);
    let rt = dir.to_str().unwrap().to_owned();
    let recording = dir.join("recording").to_str().unwrap().to_owned();
    let o = hvstats()
        .args(["record", "--quiet", "--duration", "0.01", "--output", &recording, "--runtime-dir", &rt])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let s = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let commands = vec![
        s(&["catalog"]),
        s(&["catalog", "--json"]),
        s(&["dump", &page]),
        s(&["dump", &page, "--json"]),
        s(&["hwc", "list", "--runtime-dir", &rt]),
        s(&["hwc", "list", "--json", "--runtime-dir", &rt]),
        s(&["snapshot", "--runtime-dir", &rt]),
        s(&["snapshot", "--json", "--runtime-dir", &rt]),
        s(&["top", "--once", "--interval", "0.1", "--runtime-dir", &rt]),
        s(&["top", "--once", "--json", "--interval", "0.1", "--runtime-dir", &rt]),
        s(&["report", &recording]),
        s(&["report", "--json", &recording]),
    ];
    (commands, hv)
}

fn status_and_stderr(o: &Output) -> (Option<i32>, String) {
    (o.status.code(), stderr(o))
}

#[test]
fn a_closed_pipe_ends_every_command_quietly_with_its_usual_status() {
    let dir = TempDir::new("closed-pipe");
    let (commands, _instance) = printing_commands(dir.path());
    for args in commands {
        // The reader is gone before the command writes anything: every write gets EPIPE.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let child = hvstats().args(&args).stdout(writer).stderr(Stdio::piped()).spawn().unwrap();
        let o = wait_bounded(child, Duration::from_secs(30), &format!("{args:?}"));
        assert_eq!(status_and_stderr(&o), (Some(0), String::new()), "{args:?}");
    }
}

#[test]
fn a_recording_into_a_closed_pipe_ends_quietly_and_into_a_full_device_is_an_error() {
    let dir = TempDir::new("record-pipe");
    let rt = dir.path().to_str().unwrap();
    let record = ["record", "--quiet", "--interval", "0.1", "--duration", "5", "--output", "/dev/stdout"];
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let child = hvstats()
        .args(record)
        .args(["--runtime-dir", rt])
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = wait_bounded(child, Duration::from_secs(30), "record into a closed pipe");
    assert_eq!(status_and_stderr(&o), (Some(0), String::new()));
    let full = File::options().write(true).open("/dev/full").unwrap();
    let o = hvstats().args(record).args(["--runtime-dir", rt]).stdout(full).output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("writing /dev/stdout: No space left on device"), "{}", stderr(&o));
}

#[test]
fn a_full_device_is_an_error_message_and_status_1_for_every_command() {
    let dir = TempDir::new("dev-full");
    let (commands, _instance) = printing_commands(dir.path());
    for args in commands {
        let full = File::options().write(true).open("/dev/full").unwrap();
        let o = hvstats().args(&args).stdout(full).output().unwrap();
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("No space left on device"), "{args:?}: {}", stderr(&o));
        if args[0] != "snapshot" {
            assert!(stderr(&o).contains("cannot write to standard output: "), "{args:?}: {}", stderr(&o));
        }
    }
}

#[test]
fn a_closed_standard_error_does_not_turn_an_error_into_a_panic() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = hvstats().args(["dump", "/nonexistent/page"]).stderr(writer).output().unwrap();
    assert_eq!(o.status.code(), Some(1), "a panic exits 101");
}

#[test]
fn dump_and_run_refuse_devices_fifos_and_directories_without_reading_them() {
    let dir = TempDir::new("inputs");
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: c is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let fifo = fifo.to_str().unwrap();
    for (file, what) in [("/dev/zero", "a character device"), (fifo, "a FIFO"), ("/", "a directory")] {
        for args in [vec!["dump", file], vec!["run", "--image", file]] {
            let child = hvstats().args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
            let o = wait_bounded(child, Duration::from_secs(20), &format!("{args:?}"));
            assert_eq!(o.status.code(), Some(1), "{args:?}");
            assert!(
                stderr(&o).contains(&format!("{file} is {what}, not a regular file")),
                "{args:?}: {}",
                stderr(&o)
            );
        }
    }
}

#[test]
fn an_image_larger_than_guest_ram_is_refused_after_a_bounded_read() {
    let dir = TempDir::new("big-image");
    let image = dir.path().join("image");
    // Sparse: 64 GiB of apparent size, none of it stored.
    File::create(&image).unwrap().set_len(64 << 30).unwrap();
    let child = hvstats()
        .args(["run", "--memory", "1M", "--image"])
        .arg(&image)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = wait_bounded(child, Duration::from_secs(20), "run --image <64 GiB>");
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("is larger than an image for this guest RAM can be (1048576 bytes at most)"),
        "{}",
        stderr(&o)
    );
    // dump reads one page and one byte of it, and names the real size.
    let o = hvstats().arg("dump").arg(&image).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("it has 68719476736 bytes, a page has exactly 4096"), "{}", stderr(&o));
}

#[test]
fn usage_errors_exit_2_and_state_the_real_range() {
    for (args, says) in [
        (&["run", "--vps", "0"][..], "0 is not in 1..=64"),
        (&["run", "--vps", "65"][..], "65 is not in 1..=64"),
        (&["run", "--timeout", "0"][..], "more than 0 and at most 86400 seconds"),
        (&["run", "--timeout=-1"][..], "more than 0 and at most 86400 seconds"),
        (&["run", "--memory", "512K"][..], "not in the range 1 MiB (1048576) to 3 GiB (3221225472)"),
        (&["snapshot", "--interval", "0.01"][..], "at least 0.1 s, the publishers' refresh cadence"),
        (&["snapshot", "--interval", "0"][..], "at least 0.1 and at most 3600"),
        (&["record", "-o", "r", "--interval", "0.01"][..], "at least 0.1 s, the publishers' refresh cadence"),
        (&["plot", "r", "-o", "c.svg", "--counter", "MSR cost"][..], "did you mean \"MSR accesses cost\""),
        (&["plot", "r", "-o", "c.gif"][..], "the chart is written as .png or .svg"),
        (&["plot", "r", "-o", "c.png", "--size", "8000x8000"][..], "larger than 64 MiB of bitmap"),
        (
            &[
                "plot",
                "r",
                "-o",
                "c.png",
                "--size",
                "1000x1000",
                "--counter",
                "Hypercalls/sec",
                "--counter",
                "Hypercalls/sec",
                "--counter",
                "Hypercalls/sec",
                "--counter",
                "Hypercalls/sec",
                "--counter",
                "Hypercalls/sec",
                "--counter",
                "Hypercalls/sec",
                "--counter",
                "Hypercalls/sec",
                "--counter",
                "Hypercalls/sec",
                "--counter",
                "Hypercalls/sec",
                "--counter",
                "Hypercalls/sec",
                "--counter",
                "Hypercalls/sec",
                "--counter",
                "Hypercalls/sec",
                "--counter",
                "Hypercalls/sec",
                "--counter",
                "Hypercalls/sec",
                "--counter",
                "Hypercalls/sec",
                "--counter",
                "Hypercalls/sec",
                "--counter",
                "Hypercalls/sec",
                "--counter",
                "Hypercalls/sec",
                "--counter",
                "Hypercalls/sec",
                "--counter",
                "Hypercalls/sec",
                "--counter",
                "Hypercalls/sec",
                "--counter",
                "Hypercalls/sec",
                "--counter",
                "Hypercalls/sec",
            ][..],
            "with 23 charts is larger than 64 MiB",
        ),
        (&["no-such-command"][..], "unrecognized subcommand"),
        (&["catalog", "--bogus"][..], "unexpected argument"),
    ] {
        let o = hvstats().args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
    // Help is not an error.
    let o = hvstats().arg("--help").output().unwrap();
    assert_eq!(o.status.code(), Some(0));
}

#[test]
fn a_runtime_dir_that_does_not_exist_is_an_error_not_a_new_directory() {
    let dir = TempDir::new("no-runtime-dir");
    let missing = dir.path().join("typo");
    let every = [
        vec!["hwc", "list"],
        vec!["run"],
        vec!["snapshot"],
        vec!["observe", "--pid", "1"],
        vec!["top", "--once"],
        vec!["serve", "--listen", "127.0.0.1:0"],
        vec!["record", "--output", "/dev/null", "--duration", "0.1"],
    ];
    for args in every {
        let o = hvstats().args(&args).arg("--runtime-dir").arg(&missing).output().unwrap();
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(
            stderr(&o).contains("--runtime-dir") && stderr(&o).contains("does not exist"),
            "{args:?}: {}",
            stderr(&o)
        );
        assert!(!missing.exists(), "{args:?} created {}", missing.display());
    }
}

/// An image that spins forever (`jmp $`), in real mode.
fn spinning_image(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("spin.bin");
    std::fs::write(&path, [0xEB, 0xFE]).unwrap();
    path
}

fn run_until_signalled(signal: libc::c_int, json: bool) -> (ExitStatus, String, String, TempDir) {
    let dir = TempDir::new(&format!("signal-{signal}-{json}"));
    let rt = dir.path().join("rt");
    std::fs::create_dir(&rt).unwrap();
    let mut cmd = hvstats();
    cmd.args(["run", "--mode", "real", "--timeout", "120", "--vps", "2", "--image"])
        .arg(spinning_image(dir.path()))
        .arg("--runtime-dir")
        .arg(&rt)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if json {
        cmd.arg("--json");
    }
    let mut child = cmd.spawn().unwrap();
    // Once run has published its partition and both VPs have run (however slow the start).
    let deadline = Instant::now() + Duration::from_secs(60);
    let ran = |v: &serde_json::Value| {
        let vps = v["instances"][0]["partitions"][0]["vps"].as_array().cloned().unwrap_or_default();
        vps.len() == 2
            && vps
                .iter()
                .all(|vp| vp["counters"][common::total("Total run time")].as_u64().is_some_and(|t| t > 0))
    };
    loop {
        let out = hvstats().args(["snapshot", "--json", "--runtime-dir"]).arg(&rt).output().unwrap();
        if serde_json::from_slice(&out.stdout).is_ok_and(|v| ran(&v)) {
            break;
        }
        assert!(Instant::now() < deadline, "run published no running VPs: {}", stderr(&out));
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: kill on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, signal) }, 0);
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(start.elapsed() < Duration::from_secs(30), "run did not stop on signal {signal}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut out = String::new();
    let mut err = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    (child.wait().unwrap(), out, err, dir)
}

#[test]
fn sigint_and_sigterm_stop_run_print_the_counts_and_remove_the_instance() {
    if !kvm_available("sigint_and_sigterm_stop_run_print_the_counts_and_remove_the_instance") {
        return;
    }
    for (signal, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 143), (libc::SIGHUP, 129)] {
        let (status, out, err, dir) = run_until_signalled(signal, true);
        assert_eq!(status.code(), Some(code), "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        for vp in v["vps"].as_array().unwrap() {
            assert!(vp["fault"].is_null(), "a VP the host stopped did not fault: {vp}");
            assert_eq!(vp["stopped"]["kind"], "stop-requested", "{vp}");
            assert!(vp["runtime"]["TotalRuntime100ns"].as_u64().unwrap() > 0, "{vp}");
        }
        let rt = dir.path().join("rt");
        let left: Vec<_> = walk(&rt).into_iter().filter(|p| !p.starts_with(rt.join("hwc"))).collect();
        assert!(left.is_empty(), "the instance was left behind: {left:?}");
    }
    let (status, out, _, _) = run_until_signalled(libc::SIGINT, false);
    assert_eq!(status.code(), Some(130));
    assert!(out.contains("VP 1 — stopped before it exited (stop requested) at RIP"), "{out}");
    assert!(!out.contains("FAULT"), "a VP the host stopped did not fault: {out}");
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            files.extend(walk(&p));
        } else {
            files.push(p);
        }
    }
    files
}

#[test]
fn run_into_a_closed_pipe_ends_quietly() {
    if !kvm_available("run_into_a_closed_pipe_ends_quietly") {
        return;
    }
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = hvstats().args(["run", "--vps", "1"]).stdout(writer).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
}

/// Runs `command` as `nobody` (uid and gid 65534).
fn as_nobody(command: &str, args: &[&Path]) {
    use std::os::unix::process::CommandExt;
    let o = Command::new(command).args(args).uid(65534).gid(65534).output().unwrap();
    assert!(o.status.success(), "{command} as nobody: {}", stderr(&o));
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// What `record` and `plot` leave at `out` (and the file a link there points to) when something
/// is already there.
#[test]
fn outputs_never_follow_planted_links_never_wait_on_fifos_and_replace_only_with_force() {
    let dir = TempDir::new("outputs");
    let rt = dir.path().join("rt");
    std::fs::create_dir(&rt).unwrap();
    let rt = rt.to_str().unwrap().to_owned();
    let record = |out: &Path, force: bool| {
        let mut c = hvstats();
        c.args(["record", "-q", "--duration", "0.1", "--runtime-dir", &rt, "-o"]).arg(out);
        if force {
            c.arg("--force");
        }
        wait_bounded(c.stderr(Stdio::piped()).spawn().unwrap(), Duration::from_secs(20), "record")
    };
    let recording = dir.path().join("rec.ndjson");
    assert!(record(&recording, false).status.success());
    let plot = |out: &Path, force: bool| {
        let mut c = hvstats();
        c.arg("plot").arg(&recording).arg("-o").arg(out);
        if force {
            c.arg("--force");
        }
        wait_bounded(c.stderr(Stdio::piped()).spawn().unwrap(), Duration::from_secs(20), "plot")
    };
    let target = dir.path().join("precious");
    type Run<'a> = &'a dyn Fn(&Path, bool) -> Output;
    let commands: [(&str, Run<'_>); 2] = [("record", &record), ("plot", &plot)];
    for (what, run) in commands {
        let out = dir.path().join(format!("{what}-out.svg"));
        // A link to another file: refused with or without --force, the file untouched.
        std::fs::write(&target, b"keep me").unwrap();
        std::os::unix::fs::symlink(&target, &out).unwrap();
        for force in [false, true] {
            let o = run(&out, force);
            assert_eq!(o.status.code(), Some(1), "{what} --force={force}: {}", stderr(&o));
            assert!(stderr(&o).contains("is a symbolic link: refusing to write there"), "{}", stderr(&o));
            assert_eq!(std::fs::read(&target).unwrap(), b"keep me", "{what} wrote through a link");
        }
        std::fs::remove_file(&out).unwrap();
        // A FIFO: refused at once, never waited on (the old open blocked for a reader forever).
        let c = std::ffi::CString::new(out.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let started = Instant::now();
        let o = run(&out, true);
        assert_eq!(o.status.code(), Some(1), "{what}: {}", stderr(&o));
        assert!(stderr(&o).contains("is a FIFO"), "{}", stderr(&o));
        assert!(started.elapsed() < Duration::from_secs(10));
        std::fs::remove_file(&out).unwrap();
        // An existing file: kept without --force, replaced with it.
        std::fs::write(&out, b"old").unwrap();
        let o = run(&out, false);
        assert_eq!(o.status.code(), Some(1), "{what}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("exists: refusing to replace it (--force replaces it)"),
            "{}",
            stderr(&o)
        );
        assert_eq!(std::fs::read(&out).unwrap(), b"old");
        let o = run(&out, true);
        assert!(o.status.success(), "{what}: {}", stderr(&o));
        assert_ne!(std::fs::read(&out).unwrap(), b"old");
        // Nothing else is left in the directory (no temporary file).
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(names.is_empty(), "{names:?}");
    }

    // A path that cannot be written: one plain sentence, the whole chain, no Debug dump.
    let o = plot(&dir.path().join("no-such-dir").join("c.png"), false);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("cannot open the directory") && err.contains("No such file or directory"), "{err}");
    assert!(!err.contains("Os {") && !err.contains("kind:"), "{err}");

    // The attack itself: in a shared sticky directory another user plants the output's name as a
    // link to one of root's files (with fs.protected_symlinks=0 the kernel follows it for root).
    if !is_root() {
        println!("skipped the planted-by-nobody case: needs root");
        return;
    }
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o1777)).unwrap();
    std::fs::write(&target, b"root's file").unwrap();
    for (what, run) in commands {
        let out = shared.join(format!("{what}.svg"));
        as_nobody("ln", &[Path::new("-s"), &target, &out]);
        for force in [false, true] {
            let o = run(&out, force);
            assert_eq!(o.status.code(), Some(1), "{what}: {}", stderr(&o));
            assert_eq!(std::fs::read(&target).unwrap(), b"root's file", "{what} wrote through nobody's link");
        }
    }
}

/// The walk to an output's directory: a directory on the way that another user owns, or a link
/// another user planted in its place, is never followed (root would write where they choose); a
/// link root made is; the recording is created owner-only.
#[test]
fn an_output_path_through_a_directory_or_link_of_another_user_is_refused_and_outputs_are_owner_only() {
    let dir = TempDir::new("output-walk");
    let rt = dir.path().join("rt");
    std::fs::create_dir(&rt).unwrap();
    let record = |out: &Path, force: bool| {
        let mut c = hvstats();
        c.args(["record", "-q", "--duration", "0.1", "--runtime-dir"]).arg(&rt).arg("-o").arg(out);
        if force {
            c.arg("--force");
        }
        wait_bounded(c.stderr(Stdio::piped()).spawn().unwrap(), Duration::from_secs(20), "record")
    };
    // A link root made, in a directory only root changes: followed; the recording is 0600.
    let real = dir.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap();
    let o = record(&dir.path().join("link").join("rec.ndjson"), false);
    assert!(o.status.success(), "{}", stderr(&o));
    let mode = std::fs::metadata(real.join("rec.ndjson")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "a recording of tenants' counters readable by others");

    if !is_root() {
        println!("skipped the directories of nobody: needs root");
        return;
    }
    // In a shared sticky directory (as /tmp), nobody makes `d` a link to a directory of root's,
    // and `e` a directory of their own.
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let roots = dir.path().join("roots");
    std::fs::create_dir(&roots).unwrap();
    std::fs::write(roots.join("out"), b"root's file").unwrap();
    as_nobody("ln", &[Path::new("-s"), &roots, &shared.join("d")]);
    as_nobody("mkdir", &[&shared.join("e")]);
    for (component, out) in [("d", shared.join("d").join("out")), ("e", shared.join("e").join("new"))] {
        for force in [false, true] {
            let o = record(&out, force);
            assert_eq!(o.status.code(), Some(1), "{}: {}", out.display(), stderr(&o));
            let err = stderr(&o);
            assert!(
                err.contains(&format!("{component} is a "))
                    && err.contains("of uid 65534")
                    && err.contains("refusing to write through a path another user controls"),
                "{err}"
            );
        }
    }
    assert_eq!(std::fs::read(roots.join("out")).unwrap(), b"root's file", "written through nobody's link");
    let left: Vec<_> = std::fs::read_dir(&roots).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(std::fs::read_dir(shared.join("e")).unwrap().count(), 0, "written into nobody's directory");
}

#[test]
fn record_to_standard_output_still_works_with_a_dash() {
    let dir = TempDir::new("record-dash");
    let o = hvstats()
        .args(["record", "-q", "--duration", "0.1", "-o", "-", "--runtime-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(text.starts_with("{\"format\":\"hvstats-recording\""), "{text}");
    assert_eq!(text.lines().count(), 2, "a header and one sample: {text}");
}

#[test]
fn observe_without_a_target_names_every_choice() {
    let o = hvstats().arg("observe").output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    for choice in ["--pid", "--all", "--qmp", "--mshv"] {
        assert!(err.contains(choice), "{choice} is not named: {err}");
    }
}

#[test]
fn observe_of_a_pid_no_process_has_says_so() {
    let tmp = TempDir::new("observe-nopid");
    // A pid no process has: the highest one that is free now.
    let max: i32 = std::fs::read_to_string("/proc/sys/kernel/pid_max").unwrap().trim().parse().unwrap();
    let pid = (2..max).rev().find(|p| !Path::new(&format!("/proc/{p}")).exists()).unwrap();
    let o = hvstats()
        .args(["observe", "--pid", &pid.to_string(), "--runtime-dir"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains(&format!("cannot observe pid {pid}: no process {pid}")), "{err}");
    assert!(!err.contains("No such file"), "{err}");
}

#[test]
fn observe_of_a_qmp_socket_that_is_not_there_fails_at_once() {
    let tmp = TempDir::new("observe-noqmp");
    let socket = tmp.path().join("missing.sock");
    let child = hvstats()
        .args(["observe", "--qmp"])
        .arg(&socket)
        .arg("--runtime-dir")
        .arg(tmp.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // It does not wait for a QEMU that may never come: it ends, with why.
    let o = wait_bounded(child, Duration::from_secs(30), "observe --qmp on a missing socket");
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains(&format!("--qmp {}: No such file", socket.display()))
            && err.contains("no QMP socket there"),
        "{err}"
    );
}

/// Runs `hvstats ARGS` as `nobody` (no capability): its output.
fn run_as_nobody(args: &[&str]) -> Option<Output> {
    if Command::new("setpriv").arg("--version").output().is_err() {
        assert!(std::env::var("CI").is_err(), "setpriv (util-linux) is missing");
        return None;
    }
    let o = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--inh-caps=-all"])
        .arg(env!("CARGO_BIN_EXE_hvstats"))
        .args(args)
        .env_remove("HVSTATS_RUNTIME_DIR")
        .current_dir("/")
        .output()
        .unwrap();
    Some(o)
}

#[test]
fn hwc_list_as_nobody_says_why_once() {
    if !Path::new("/run").exists() || Path::new("/run/hvstats").exists() {
        // Where /run/hvstats exists nobody may read the table, or list it: another error.
        eprintln!("hwc_list_as_nobody_says_why_once: /run/hvstats exists: skipped");
        return;
    }
    let Some(o) = run_as_nobody(&["hwc", "list"]) else { return };
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(err.matches("Permission denied").count(), 1, "the cause once: {err}");
    assert!(err.contains("cannot create /run/hvstats"), "{err}");
}

#[test]
fn observe_as_nobody_tells_an_unreadable_tracefs_from_a_missing_one() {
    let tracing = Path::new("/sys/kernel/tracing/events");
    if !tracing.is_dir() {
        eprintln!(
            "observe_as_nobody_tells_an_unreadable_tracefs_from_a_missing_one: tracefs is not mounted: skipped"
        );
        return;
    }
    let mode = std::fs::metadata("/sys/kernel/tracing").unwrap().permissions().mode();
    if mode & 0o005 == 0o005 {
        eprintln!(
            "observe_as_nobody_tells_an_unreadable_tracefs_from_a_missing_one: tracefs is readable by all: skipped"
        );
        return;
    }
    let tmp = TempDir::new("observe-nobody");
    // A runtime directory of nobody's own: one of root's is refused before tracefs is looked at.
    std::os::unix::fs::chown(tmp.path(), Some(65534), Some(65534)).unwrap();
    let Some(o) = run_as_nobody(&["observe", "--pid", "1", "--runtime-dir", tmp.path().to_str().unwrap()])
    else {
        return;
    };
    let err = stderr(&o);
    assert!(err.contains("tracefs is mounted but not readable: /sys/kernel/tracing/events"), "{err}");
    assert!(!err.contains("not mounted"), "{err}");
}
