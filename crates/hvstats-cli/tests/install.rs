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
    std::fs::create_dir_all(dir).unwrap();
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
    // A missing directory is an error, nothing is created.
    let missing = tmp.path().join("nope");
    let out = hvstats().args(["man", "--out-dir"]).arg(&missing).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(!missing.exists());
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

/// `systemd-analyze verify` of the shipped unit, with its ExecStart pointing at this build and the
/// man pages it documents installed under MANPATH; `None` when systemd-analyze is missing (CI
/// installs it, so there it must run).
fn verify(unit: &str, tmp: &TempDir, with_man: bool) -> Option<(bool, String)> {
    let path = tmp.path().join("hvstats-serve.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/hvstats", env!("CARGO_BIN_EXE_hvstats"))).unwrap();
    let man = tmp.path().join(if with_man { "man" } else { "no-man" });
    if with_man {
        man_pages(&man.join("man1"));
    } else {
        std::fs::create_dir_all(&man).unwrap();
    }
    let out = match Command::new("systemd-analyze").arg("verify").arg(&path).env("MANPATH", &man).output() {
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

#[test]
fn the_serve_unit_passes_systemd_analyze_verify_and_is_hardened() {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../packaging/systemd/hvstats-serve.service"
    ))
    .unwrap();
    for hardening in [
        "CapabilityBoundingSet=\n",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateDevices=yes",
        "MemoryDenyWriteExecute=yes",
        "SystemCallFilter=@system-service",
    ] {
        assert!(unit.contains(hardening), "the unit lacks {hardening:?}");
    }
    assert!(unit.contains("ExecStart=/usr/local/bin/hvstats serve --listen 127.0.0.1:9966\n"));
    let tmp = TempDir::new("install-unit");
    let Some((ok, text)) = verify(&unit, &tmp, true) else { return };
    assert!(ok, "systemd-analyze verify: {text}");
    // The check is real: the documentation it names must exist, and so must the binary.
    let Some((ok, text)) = verify(&unit, &TempDir::new("install-unit-no-man"), false) else { return };
    assert!(!ok && text.contains("hvstats-serve(1)"), "{text}");
    let broken = unit.replace("ExecStart=/usr/local/bin/hvstats", "ExecStart=/nonexistent/hvstats");
    let Some((ok, text)) = verify(&broken, &TempDir::new("install-unit-no-exe"), true) else { return };
    assert!(!ok, "{text}");
}
