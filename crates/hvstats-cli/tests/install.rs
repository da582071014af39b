//! What an operator installs beside the binary: the man pages and completions `hvstats` generates,
//! and the systemd unit for `serve`, checked by `systemd-analyze verify` against those pages.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::path::Path;
use std::process::Command;

use common::TempDir;

fn hvstats() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hvstats"))
}

fn man_pages(dir: &Path) {
    let out = hvstats().args(["man", "--out-dir"]).arg(dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn man_pages_cover_every_command_with_its_flags() {
    let tmp = TempDir::new("install-man");
    let man1 = tmp.path().join("man1");
    man_pages(&man1);
    let top = std::fs::read_to_string(man1.join("hvstats-top.1")).unwrap();
    assert!(top.contains(".TH hvstats-top 1"), "{top}");
    assert!(top.contains("interval"), "the page lists top's flags: {top}");
    let help = hvstats().arg("--help").output().unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    // Every command `--help` lists has its page.
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.len() >= 10, "{help}");
    for c in commands {
        assert!(man1.join(format!("hvstats-{c}.1")).is_file(), "no page for {c}");
    }
    // A missing directory is created with its parents, as `install -d` would; a file in its
    // place is an error and stays as it was.
    let missing = tmp.path().join("share/man/man1");
    let out = hvstats().args(["man", "--out-dir"]).arg(&missing).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(missing.join("hvstats-serve.1").is_file());
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "kept").unwrap();
    let out = hvstats().args(["man", "--out-dir"]).arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a directory"));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "kept");
}

#[test]
fn a_bash_completion_script_parses_and_completes_the_commands() {
    let out = hvstats().args(["completions", "bash"]).output().unwrap();
    assert!(out.status.success());
    let script = String::from_utf8(out.stdout).unwrap();
    assert!(script.contains("snapshot") && script.contains("--runtime-dir"), "{script}");
    let tmp = TempDir::new("install-completions");
    let file = tmp.path().join("hvstats.bash");
    std::fs::write(&file, &script).unwrap();
    let check = Command::new("bash").arg("-n").arg(&file).status().unwrap();
    assert!(check.success(), "bash -n rejects the script");
    let out = hvstats().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "an unknown shell is a usage error");
}

/// The shipped unit `name` (`hvstats-serve.service`, `hvstats-observe.service`) with its
/// ExecStart pointing at this build, written into `tmp`.
fn unit_for_this_build(name: &str, tmp: &TempDir) -> (String, std::path::PathBuf) {
    let unit =
        std::fs::read_to_string(format!("{}/../../packaging/systemd/{name}", env!("CARGO_MANIFEST_DIR")))
            .unwrap();
    let path = tmp.path().join(name);
    std::fs::write(&path, unit.replace("/usr/bin/hvstats", env!("CARGO_BIN_EXE_hvstats"))).unwrap();
    (unit, path)
}

/// `systemd-analyze` with `args` and the man pages (when `with_man`) under MANPATH: (success and
/// nothing said, what it said); `None` when systemd-analyze is missing (CI installs it, so there
/// it must run).
fn analyze(args: &[&std::ffi::OsStr], tmp: &TempDir, with_man: bool) -> Option<(bool, String)> {
    let man = tmp.path().join(if with_man { "man" } else { "no-man" });
    if with_man {
        man_pages(&man.join("man1"));
    } else {
        std::fs::create_dir_all(&man).unwrap();
    }
    let out = match Command::new("systemd-analyze").args(args).env("MANPATH", &man).output() {
        Ok(out) => out,
        Err(e) => {
            assert!(std::env::var("CI").is_err(), "systemd-analyze cannot run ({e}); .ci/run installs it");
            eprintln!("systemd-analyze cannot run ({e}): skipped");
            return None;
        }
    };
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Some((out.status.success() && text.trim().is_empty(), text))
}

fn verify(path: &Path, tmp: &TempDir, with_man: bool) -> Option<(bool, String)> {
    analyze(&["verify".as_ref(), path.as_os_str()], tmp, with_man)
}

/// `systemd-analyze security --offline` of a unit file: its overall exposure (0 safest, 10 least).
fn exposure(path: &Path, tmp: &TempDir) -> Option<f64> {
    let (_, text) = analyze(&["security".as_ref(), "--offline=true".as_ref(), path.as_os_str()], tmp, false)?;
    let line =
        text.lines().find(|l| l.contains("Overall exposure level for")).unwrap_or_else(|| panic!("{text}"));
    Some(line.split(": ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap())
}

#[test]
fn both_units_pass_systemd_analyze_verify_and_are_hardened() {
    let tmp = TempDir::new("install-unit");
    let (serve, serve_path) = unit_for_this_build("hvstats-serve.service", &tmp);
    let (observe, observe_path) = unit_for_this_build("hvstats-observe.service", &tmp);
    for (unit, hardening) in [
        (&serve, "CapabilityBoundingSet=\n"),
        (&observe, "CapabilityBoundingSet=CAP_DAC_READ_SEARCH CAP_SYS_PTRACE CAP_PERFMON CAP_BPF\n"),
        (&observe, "PrivateNetwork=yes"),
        (&serve, "ProtectHome=yes"),
        (&serve, "PrivateTmp=yes"),
        // QMP sockets may be under /tmp or /home: seen, read-only (tests/unit_sandbox.rs).
        (&observe, "ProtectHome=read-only\n"),
        (&observe, "PrivateTmp=no\n"),
        (&observe, "RestrictAddressFamilies=AF_UNIX\n"),
    ]
    .into_iter()
    .chain(
        [
            "NoNewPrivileges=yes",
            "ProtectSystem=strict",
            "EnvironmentFile=-/etc/default/hvstats\n",
            "PrivateDevices=yes",
            "MemoryDenyWriteExecute=yes",
            "SystemCallFilter=@system-service",
            "RuntimeDirectory=hvstats\n",
        ]
        .into_iter()
        .flat_map(|h| [(&serve, h), (&observe, h)]),
    ) {
        assert!(unit.contains(hardening), "a unit lacks {hardening:?}");
    }
    // Their flags from /etc/default/hvstats; without it, the exporter on 127.0.0.1:9966.
    assert!(serve.contains("Environment=\"HVSTATS_SERVE_ARGS=--listen 127.0.0.1:9966\"\n"));
    assert!(serve.contains("ExecStart=/usr/bin/hvstats serve --expect-observer $HVSTATS_SERVE_ARGS\n"));
    assert!(observe.contains("ExecStart=/usr/bin/hvstats observe --all $HVSTATS_OBSERVE_ARGS\n"));
    for path in [&serve_path, &observe_path] {
        let Some((ok, text)) = verify(path, &tmp, true) else { return };
        assert!(ok, "systemd-analyze verify {}: {text}", path.display());
    }
    // systemd's own measure of what a unit leaves open (0 to 10; 2 is "OK").
    let (Some(serve), Some(observe)) = (exposure(&serve_path, &tmp), exposure(&observe_path, &tmp)) else {
        return;
    };
    eprintln!("exposure: hvstats-serve {serve}, hvstats-observe {observe}");
    assert!(serve <= 2.0, "hvstats-serve exposure {serve}");
    assert!(observe <= 2.0, "hvstats-observe exposure {observe}");
    // The check is real: the documentation it names must exist, and so must the binary.
    let bare = TempDir::new("install-unit-no-man");
    let (_, path) = unit_for_this_build("hvstats-serve.service", &bare);
    let Some((ok, text)) = verify(&path, &bare, false) else { return };
    assert!(!ok && text.contains("hvstats-serve(1)"), "{text}");
    let broken = TempDir::new("install-unit-no-exe");
    std::fs::write(broken.path().join("hvstats-serve.service"), serve_text_with_missing_binary()).unwrap();
    let Some((ok, text)) = verify(&broken.path().join("hvstats-serve.service"), &broken, true) else {
        return;
    };
    assert!(!ok, "{text}");
}

fn serve_text_with_missing_binary() -> String {
    std::fs::read_to_string(format!(
        "{}/../../packaging/systemd/hvstats-serve.service",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
    .replace("ExecStart=/usr/bin/hvstats", "ExecStart=/nonexistent/hvstats")
}
