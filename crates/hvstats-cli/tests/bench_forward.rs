//! `hvstats bench` as the built binary: it runs the `hvstats-bench` tool found beside it or on
//! `PATH` with every argument, its output and exit status the tool's, and without the tool says
//! how to get it. A stand-in tool (a shell script) shows what it was given; the rows themselves
//! are tested with the tool (`crates/hvstats-bench/tests/tool.rs`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A directory of its own under the target directory, holding a copy of the built `hvstats`.
struct Install(PathBuf);

impl Install {
    fn new(test: &str) -> Self {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("bench-forward-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("bin")).unwrap();
        let hvstats = root.join("bin/hvstats");
        // A link where the file system allows it (the copy is large), a copy where not.
        if std::fs::hard_link(env!("CARGO_BIN_EXE_hvstats"), &hvstats).is_err() {
            std::fs::copy(env!("CARGO_BIN_EXE_hvstats"), &hvstats).unwrap();
        }
        Self(root)
    }

    /// A stand-in tool in `dir` (made if need be) that prints `tag` and each argument in brackets,
    /// and exits 7.
    fn tool(&self, dir: &str, tag: &str) {
        let dir = self.0.join(dir);
        std::fs::create_dir_all(&dir).unwrap();
        let tool = dir.join("hvstats-bench");
        std::fs::write(&tool, format!("#!/bin/sh\nprintf '{tag}'\nprintf '[%s]' \"$@\"\nexit 7\n")).unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// `hvstats bench ARGS` run from the copy, with `PATH` set to `path` (under the install).
    fn bench(&self, args: &[&str], path: &str) -> std::process::Output {
        Command::new(self.0.join("bin/hvstats"))
            .arg("bench")
            .args(args)
            .env("PATH", self.0.join(path))
            .output()
            .unwrap()
    }
}

impl Drop for Install {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn hvstats_bench_runs_the_tool_beside_it_with_every_argument_and_its_exit_status() {
    let install = Install::new("beside");
    install.tool("bin", "beside");
    install.tool("path", "on-path");
    let out = install.bench(&["--json", "--only", "two words", "--help", "-q"], "path");
    assert_eq!(out.status.code(), Some(7), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "beside[--json][--only][two words][--help][-q]");
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn hvstats_bench_runs_the_tool_on_path_when_none_is_beside_it() {
    let install = Install::new("path");
    install.tool("path", "on-path");
    let out = install.bench(&["--rounds", "2"], "path");
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "on-path[--rounds][2]");
}

#[test]
fn without_the_tool_hvstats_bench_says_how_to_get_it_and_exits_1() {
    let install = Install::new("absent");
    std::fs::create_dir_all(install.0.join("empty")).unwrap();
    let out = install.bench(&["--json"], "empty");
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    for needed in [
        "hvstats-bench",
        "PATH",
        "cargo build --release -p hvstats-bench",
        "cargo install --path crates/hvstats-bench",
    ] {
        assert!(err.contains(needed), "{needed:?} not in {err}");
    }
}
