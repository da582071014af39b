//! `hvstats-bench` run as the built tool on its quickest rows: which rows `--only` selects, and
//! how each reports its spread, its interval and its verdict.

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use serde_json::Value;

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hvstats-bench")).args(args).output().unwrap()
}

#[test]
fn only_whole_row_names_run_those_rows_each_with_its_spread_interval_and_verdict() {
    let out = bench(&[
        "--json",
        "--rounds",
        "12",
        "--only",
        "read-vp-vs-pread-page",
        "--only",
        "vp-read-consistent-vs-plain",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Not a terminal: no progress bar.
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["read-vp-vs-pread-page", "vp-read-consistent-vs-plain"], "{rows:?}");
    for row in &rows {
        assert_eq!(row["rounds"], 12, "{row}");
        for side in ["ours", "baseline"] {
            let (min, median, max) = (
                row[side]["min"].as_f64().unwrap(),
                row[side]["median"].as_f64().unwrap(),
                row[side]["max"].as_f64().unwrap(),
            );
            assert!(0.0 < min && min <= median && median <= max, "{row}");
        }
        let ratio = row["ratio"].as_f64().unwrap();
        let medians = row["ours"]["median"].as_f64().unwrap() / row["baseline"]["median"].as_f64().unwrap();
        assert!((ratio - medians).abs() <= 1e-12 * medians, "{row}");
        // Six ABBA blocks: their whole range, 1 - 2·(½)^6 = 96.9 %.
        let interval = &row["interval"];
        assert_eq!(interval["blocks"], 6, "{row}");
        assert!((interval["confidence"].as_f64().unwrap() - (1.0 - 2.0 / 64.0)).abs() < 1e-12, "{row}");
        let (low, high) = (interval["low"].as_f64().unwrap(), interval["high"].as_f64().unwrap());
        assert!(0.0 < low && low <= high, "{row}");
    }
    // No goal: no verdict.
    assert!(rows[0]["goal"].is_null() && rows[0]["verdict"].is_null(), "{}", rows[0]);
    // A goal: met when the whole interval is within it, missed when beyond it, else undecided.
    let (low, high, goal) = (
        rows[1]["interval"]["low"].as_f64().unwrap(),
        rows[1]["interval"]["high"].as_f64().unwrap(),
        rows[1]["goal"].as_f64().unwrap(),
    );
    let expected = if high <= goal {
        "met"
    } else if low > goal {
        "missed"
    } else {
        "undecided"
    };
    assert_eq!(rows[1]["verdict"], expected, "{}", rows[1]);
}

#[test]
fn too_few_rounds_decide_nothing_and_the_table_says_so() {
    let out = bench(&["--only", "vp-read-consistent-vs-plain", "--rounds", "2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].starts_with("row ") && lines[0].ends_with("verdict"), "{text}");
    // One ABBA block: an interval of 0 % confidence, whatever its place.
    assert!(lines[1].starts_with("vp-read-consistent-vs-plain "), "{text}");
    assert!(lines[1].ends_with(" 0%  <=1.1 undecided"), "{text}");
}

#[test]
fn a_bad_flag_is_a_usage_error() {
    let out = bench(&["--rounds", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--rounds"));
}
