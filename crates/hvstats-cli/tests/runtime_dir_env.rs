//! `HVSTATS_RUNTIME_DIR` naming a missing directory is refused by every command exactly as
//! `--runtime-dir` with that path is: nothing is created, and the command fails.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::process::Command;

use common::TempDir;

#[test]
fn a_missing_directory_in_the_environment_is_refused_like_the_flag() {
    let tmp = TempDir::new("rtdir-env");
    let missing = tmp.path().join("no-such-dir");
    let commands: [&[&str]; 4] =
        [&["hwc", "list"], &["snapshot"], &["run", "--vps", "1"], &["observe", "--all"]];
    for args in commands {
        let by_env = Command::new(env!("CARGO_BIN_EXE_hvstats"))
            .args(args)
            .env("HVSTATS_RUNTIME_DIR", &missing)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&by_env.stderr);
        assert!(!by_env.status.success(), "{args:?} succeeded: {err}");
        assert!(
            err.contains(&format!("HVSTATS_RUNTIME_DIR={} does not exist", missing.display())),
            "{args:?}: {err}"
        );
        assert!(!missing.exists(), "{args:?} created {}", missing.display());
        let by_flag = Command::new(env!("CARGO_BIN_EXE_hvstats"))
            .args(args)
            .arg("--runtime-dir")
            .arg(&missing)
            .env_remove("HVSTATS_RUNTIME_DIR")
            .output()
            .unwrap();
        assert_eq!(by_flag.status.code(), by_env.status.code(), "{args:?}");
        assert!(!missing.exists());
    }
    // A file where the directory should be.
    let file = tmp.path().join("file");
    std::fs::write(&file, "").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .arg("snapshot")
        .env("HVSTATS_RUNTIME_DIR", &file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a directory"));
}
