//! The Debian package `packaging/deb/build-deb` makes from this build: what it holds, that it
//! installs, runs and purges without a trace (into a `dpkg --root` of its own, so the host's
//! packages are never touched), and that the observer's unit gives it exactly the capabilities it
//! needs: without any one of them, it observes less.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{KilledOnDrop, TempDir};
use hvstats_testkit::{spawn_qemu, wait_for_kvm_vcpus};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

/// Runs `cmd`, which must succeed; its standard output.
fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// True when dpkg-deb and binutils are here (every Debian host that builds Rust has them).
fn tools_present() -> bool {
    ["dpkg-deb", "dpkg", "objcopy", "readelf"]
        .iter()
        .all(|t| Command::new(t).arg("--version").output().is_ok())
}

/// The section names of an ELF file.
fn sections(file: &Path) -> String {
    run(Command::new("readelf").arg("--section-headers").arg("--wide").arg(file))
}

/// Every file (not directory) under `root`, relative to it.
fn files_under(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            } else {
                out.push(path.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn the_package_holds_a_stripped_binary_and_installs_runs_and_purges_cleanly() {
    if !tools_present() {
        assert!(std::env::var("CI").is_err(), "dpkg-deb or binutils missing");
        eprintln!("dpkg-deb or binutils missing: skipped");
        return;
    }
    let tmp = TempDir::new("package");
    let out = tmp.path().join("out");
    let built = run(Command::new(repo("packaging/deb/build-deb"))
        .arg(env!("CARGO_BIN_EXE_hvstats"))
        .arg(&out)
        .env("HVSTATS_DEB_COMPRESSION", "gzip"));
    let debs: Vec<&str> = built.lines().collect();
    assert_eq!(debs.len(), 2, "{built}");
    let (deb, dbgsym) = (Path::new(debs[0]), Path::new(debs[1]));
    let version = env!("CARGO_PKG_VERSION");
    let name = deb.file_name().unwrap().to_string_lossy();
    assert!(name.starts_with(&format!("hvstats_{version}_")) && name.ends_with(".deb"), "{name}");

    let info = run(Command::new("dpkg-deb").arg("--field").arg(deb));
    assert!(info.contains("Package: hvstats\n") && info.contains(&format!("Version: {version}\n")), "{info}");
    let contents = run(Command::new("dpkg-deb").arg("--contents").arg(deb));
    for path in [
        "./usr/bin/hvstats",
        "./usr/share/man/man1/hvstats.1.gz",
        "./usr/share/man/man1/hvstats-serve.1.gz",
        "./usr/share/man/man1/hvstats-observe.1.gz",
        "./usr/share/bash-completion/completions/hvstats",
        "./usr/share/zsh/vendor-completions/_hvstats",
        "./usr/share/fish/vendor_completions.d/hvstats.fish",
        "./lib/systemd/system/hvstats-serve.service",
        "./lib/systemd/system/hvstats-observe.service",
        "./usr/share/hvstats/prometheus/hvstats.rules.yml",
        "./usr/share/hvstats/prometheus/hvstats.alerts.yml",
        "./usr/share/hvstats/prometheus/hvstats.test.yml",
        "./usr/share/hvstats/grafana/hvstats.json",
        "./usr/share/doc/hvstats/copyright",
        "./etc/default/hvstats",
    ] {
        assert!(contents.lines().any(|l| l.ends_with(path)), "the package lacks {path}:\n{contents}");
    }

    // Installed into a root of its own: dpkg's database there, the maintainer scripts run
    // outside it (they leave systemd alone under DPKG_ROOT).
    let root = tmp.path().join("root");
    for dir in ["var/lib/dpkg/info", "var/lib/dpkg/updates", "var/log"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    std::fs::write(root.join("var/lib/dpkg/status"), "").unwrap();
    let dpkg = |args: &[&str], debs: &[&Path]| {
        run(Command::new("dpkg")
            .arg(format!("--root={}", root.display()))
            .args(["--force-script-chrootless", "--force-depends", "--force-not-root"])
            .arg(format!("--log={}", tmp.path().join("dpkg.log").display()))
            .args(args)
            .args(debs))
    };
    dpkg(&["--install"], &[deb, dbgsym]);
    let binary = root.join("usr/bin/hvstats");
    // Stripped: no debug sections in the installed binary, which names its debug file; the debug
    // info is in the dbgsym package, under the binary's build id.
    let installed = sections(&binary);
    assert!(!installed.contains(".debug_info") && !installed.contains(".debug_line"), "{installed}");
    assert!(installed.contains(".gnu_debuglink"), "{installed}");
    let build_id = run(Command::new("readelf").arg("-n").arg(&binary));
    let id = build_id.lines().find_map(|l| l.trim().strip_prefix("Build ID: ")).unwrap().to_owned();
    let debug_file = root.join(format!("usr/lib/debug/.build-id/{}/{}.debug", &id[..2], &id[2..]));
    assert!(sections(&debug_file).contains(".debug_line"), "no debug info in {}", debug_file.display());
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    assert!(size(&binary) < size(Path::new(env!("CARGO_BIN_EXE_hvstats"))), "not smaller than the build");

    // It runs: the version, and the exporter answers a scrape.
    assert_eq!(run(Command::new(&binary).arg("--version")).trim(), format!("hvstats {version}"));
    let runtime = TempDir::new("package-runtime");
    let mut child = Command::new(&binary)
        .args(["serve", "--listen", "127.0.0.1:0", "--runtime-dir"])
        .arg(runtime.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = common::serving_addr(&mut child);
    let _serve = KilledOnDrop(child);
    let reply = common::http_get(addr, "/metrics");
    assert!(reply.starts_with("HTTP/1.") && reply.contains("hvstats_build_info{version="), "{reply}");

    // /etc/default/hvstats is a conffile: an upgrade keeps the operator's edits.
    let conffiles = std::fs::read_to_string(root.join("var/lib/dpkg/info/hvstats.conffiles")).unwrap();
    assert_eq!(conffiles.trim(), "/etc/default/hvstats");
    // Real man pages: beyond the flags, what the command needs and touches.
    let page = run(Command::new("zcat").arg(root.join("usr/share/man/man1/hvstats-observe.1.gz")));
    for section in [".SH PRIVILEGES", ".SH FILES", ".SH ENVIRONMENT", ".SH \"EXIT STATUS\"", ".SH EXAMPLES"] {
        assert!(page.contains(section), "hvstats-observe(1) lacks {section}");
    }
    assert!(page.contains("CAP_DAC_READ_SEARCH") && page.contains("/etc/default/hvstats"), "{page}");

    // /run/hvstats as the services leave it (the observer's empty instances/ and a claim no one
    // holds), and another user's hardware counter table beside them.
    let runtime = root.join("run/hvstats");
    let leave = |with_table: bool| {
        std::fs::create_dir_all(runtime.join("instances")).unwrap();
        std::fs::create_dir_all(runtime.join("observed")).unwrap();
        std::fs::write(runtime.join("observed/4242-99"), "1 1-2-0\n").unwrap();
        if with_table {
            std::fs::create_dir_all(runtime.join("hwc")).unwrap();
            std::fs::write(runtime.join("hwc/table"), "another user's allocations").unwrap();
        }
    };
    leave(true);
    // Purged, it leaves nothing but dpkg's own records, and the files it did not make.
    dpkg(&["--purge", "hvstats-dbgsym", "hvstats"], &[]);
    let left: Vec<String> =
        files_under(&root).into_iter().filter(|f| !f.starts_with("var/lib/dpkg/")).collect();
    assert_eq!(left, ["run/hvstats/hwc/table"], "left after purge");
    assert!(!runtime.join("observed").exists() && !runtime.join("instances").exists());
    let status = std::fs::read_to_string(root.join("var/lib/dpkg/status")).unwrap();
    assert!(!status.contains("Package: hvstats"), "{status}");
    // With nothing but its own files there, /run/hvstats goes too.
    std::fs::remove_dir_all(runtime.join("hwc")).unwrap();
    dpkg(&["--install"], &[deb]);
    leave(false);
    dpkg(&["--purge", "hvstats"], &[]);
    assert!(!runtime.exists(), "/run/hvstats is left after purge");
    let left: Vec<String> =
        files_under(&root).into_iter().filter(|f| !f.starts_with("var/lib/dpkg/")).collect();
    assert!(left.is_empty(), "left after purge: {left:?}");
}

/// The files the rule files' headers name (`hvstats.test.yml`, `packaging/grafana/hvstats.json`):
/// every one exists.
#[test]
fn the_rule_files_headers_name_files_that_exist() {
    let dir = repo("packaging/prometheus");
    let mut named = 0;
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap();
        for line in text.lines().take_while(|l| l.starts_with('#') || l.trim().is_empty()) {
            for word in line.split(|c: char| c.is_whitespace() || "()`,;:'\"".contains(c)) {
                let word = word.trim_end_matches('.');
                if !(word.ends_with(".yml") || word.ends_with(".json")) {
                    continue;
                }
                let path = if word.contains('/') { repo(word) } else { dir.join(word) };
                assert!(path.exists(), "{} names {word}, which does not exist", entry.path().display());
                named += 1;
            }
        }
    }
    assert!(named >= 4, "{named} files named");
}

/// The capabilities the observer's unit bounds it to, as setpriv names them (`sys_ptrace`, …).
fn unit_capabilities() -> Vec<String> {
    let unit = std::fs::read_to_string(repo("packaging/systemd/hvstats-observe.service")).unwrap();
    let line = unit.lines().find_map(|l| l.strip_prefix("CapabilityBoundingSet=")).unwrap();
    line.split_whitespace().map(|c| c.trim_start_matches("CAP_").to_lowercase()).collect()
}

/// `hvstats observe --pid pid` under a bounding set of `caps` only, for as long as it takes to
/// attach (or give up): what it logged.
fn observe_with(caps: &[String], pid: u32, runtime: &Path) -> String {
    let bounding: String = caps.iter().map(|c| format!(",+{c}")).collect();
    let mut child = Command::new("setpriv")
        .arg(format!("--bounding-set=-all{bounding}"))
        .args([
            "--inh-caps=-all",
            "--no-new-privs",
            env!("CARGO_BIN_EXE_hvstats"),
            "observe",
            "--pid",
            &pid.to_string(),
        ])
        .arg("--runtime-dir")
        .arg(runtime)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let _observer = KilledOnDrop(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // Done when it has attached and said what it opened, or given the VM up.
    let mut log = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) else { continue };
        log.push_str(&line);
        log.push('\n');
        if line.contains("vCPU threads [") || line.contains("cannot observe") {
            return log;
        }
    }
    panic!("the observer neither attached nor gave up within 30 s:\n{log}");
}

#[test]
fn the_observer_unit_grants_exactly_the_capabilities_observing_needs() {
    let test = "the_observer_unit_grants_exactly_the_capabilities_observing_needs";
    if !common::kvm_available(test) {
        return;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        assert!(std::env::var("CI").is_err(), "setpriv (util-linux) is missing");
        eprintln!("{test}: setpriv is missing: skipped");
        return;
    }
    let caps = unit_capabilities();
    let listed: Vec<String> =
        common::observer_capabilities().iter().map(|c| c.trim_start_matches("CAP_").to_lowercase()).collect();
    assert_eq!(caps, listed, "the unit's bounding set is not packaging/capabilities");
    let Some(qemu) = spawn_qemu(
        Command::new("qemu-system-x86_64")
            .args(["-accel", "kvm", "-display", "none", "-nodefaults", "-m", "16", "-name", "guest=caps-vm"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        test,
    ) else {
        return;
    };
    let qemu = KilledOnDrop(qemu);
    let pid = qemu.0.id();
    wait_for_kvm_vcpus(qemu.0.id() as i32, 1, Duration::from_secs(30));
    let without = |cap: &str| caps.iter().filter(|c| *c != cap).cloned().collect::<Vec<_>>();
    let runtime = TempDir::new("package-caps");

    // With the unit's set: attached, counting in the kernel, no capability missing. Its counters
    // hold no descriptor of their own: the programs and the host's task walk are shared by every
    // VM, and this QEMU keeps no KVM statistics descriptor.
    let log = observe_with(&caps, pid, runtime.path());
    assert!(log.contains("counting in-kernel"), "{log}");
    assert!(log.contains("\"caps-vm\": 1 vCPUs as partition") && !log.contains(" is missing"), "{log}");
    // CAP_DAC_READ_SEARCH is for VMMs of another user (this QEMU is root's own): what it takes
    // away is shown by tests/unit_sandbox.rs on a libvirt domain run as libvirt-qemu.
    // Without CAP_SYS_PTRACE the VMM's descriptors cannot be read (a QEMU holding capabilities
    // the observer lacks fails the ptrace access check): said, and refused for it.
    let log = observe_with(&without("sys_ptrace"), pid, runtime.path());
    assert!(log.contains("CAP_SYS_PTRACE is missing: "), "{log}");
    assert!(log.contains("cannot observe") && log.contains("reason no_cap_sys_ptrace"), "{log}");
    // Without CAP_PERFMON no tracepoint can be counted, in the kernel or by perf: one line says
    // so, not the errors it causes.
    let log = observe_with(&without("perfmon"), pid, runtime.path());
    assert!(
        log.contains("CAP_PERFMON is missing: ") && log.contains(" 0 descriptors open for its counters"),
        "{log}"
    );
    assert!(!log.contains("os error"), "{log}");
    // Without CAP_BPF it falls back to a perf counter per class and thread (what costs the
    // guest more, see README "Cost").
    let log = observe_with(&without("bpf"), pid, runtime.path());
    assert!(
        log.contains("CAP_BPF is missing: ") && log.contains("counting with perf counters per thread"),
        "{log}"
    );
}
