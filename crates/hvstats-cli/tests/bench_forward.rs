//! `hvstats bench` run as the built binary on its quickest rows: which rows `--only` selects, and
//! how each is marked against its goal.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

use std::process::Command;

use serde_json::Value;

#[test]
fn only_a_whole_row_name_runs_that_row_alone_marked_against_its_goal() {
    let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["bench", "--json", "--rounds", "1"])
        .args(["--only", "read-vp-vs-pread-page", "--only", "vp-read-consistent-vs-plain"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["read-vp-vs-pread-page", "vp-read-consistent-vs-plain"], "{rows:?}");
    // No goal: neither met nor missed.
    assert!(rows[0]["goal"].is_null() && rows[0]["met"].is_null(), "{}", rows[0]);
    // A goal: met exactly when the ratio is within it.
    let (ratio, goal) = (rows[1]["ratio"].as_f64().unwrap(), rows[1]["goal"].as_f64().unwrap());
    assert_eq!(rows[1]["met"], ratio <= goal, "{}", rows[1]);
}
