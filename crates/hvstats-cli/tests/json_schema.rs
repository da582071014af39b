//! Every JSON document the command prints carries the schema version, and no counter key says a
//! rate or a catalog name its value is not: totals end in `_total`, deltas in `_delta`, values over
//! an interval say their unit (`_per_second`, `_percent`, `_ns`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::path::Path;
use std::process::Command;

use common::TempDir;
use hvstats_abi::catalog::vp;
use serde_json::Value;

fn json_of(args: &[&str], dir: Option<&Path>) -> Value {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hvstats"));
    cmd.args(args);
    if let Some(dir) = dir {
        cmd.arg("--runtime-dir").arg(dir);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// Checks every counter map in `v` (recursively): keys by what they hold.
fn keys_say_what_they_hold(v: &Value, what: &str) -> usize {
    let mut checked = 0;
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                let suffixes: &[&str] = match k.as_str() {
                    "counters" | "cumulative" => &["_total"],
                    "deltas" => &["_delta"],
                    "interval" | "presented" | "rates_per_second" | "percent_of_time" | "average_cost_ns" => {
                        &["_per_second", "_percent", "_ns"]
                    }
                    _ => &[],
                };
                if let (false, Value::Object(counters)) = (suffixes.is_empty(), child) {
                    for key in counters.keys() {
                        assert!(!key.contains('/') && !key.contains(' '), "{what}: {k}.{key}");
                        // An instantaneous value (a count of VPs, the sequence, a VM's state) is
                        // the same in every document and names no interval.
                        let counter = hvstats_present::json_keys::counter_of_key(key);
                        let instant = counter.is_some_and(|c| {
                            matches!(
                                c.presentation,
                                hvstats_abi::Presentation::Instant | hvstats_abi::Presentation::State
                            )
                        });
                        assert!(instant || suffixes.iter().any(|s| key.ends_with(s)), "{what}: {k}.{key}");
                        checked += 1;
                    }
                } else {
                    checked += keys_say_what_they_hold(child, what);
                }
            }
        }
        Value::Array(items) => {
            checked += items.iter().map(|i| keys_say_what_they_hold(i, what)).sum::<usize>()
        }
        _ => {}
    }
    checked
}

#[test]
fn every_json_document_has_the_schema_version_and_keys_that_say_what_they_hold() {
    let tmp = TempDir::new("json-schema");
    let (_hv, part) = common::publish_partition(tmp.path(), 2);
    part.vp_page(0).unwrap().set(vp::IO_INSTRUCTIONS, 10);
    part.vp_page(0).unwrap().set(vp::IO_INSTRUCTIONS_COST, 300);
    let page = tmp.path().join("vp.page");
    let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["dump", "--write-sample", "--type", "vp"])
        .arg(&page)
        .output()
        .unwrap();
    assert!(out.status.success());
    let recording = tmp.path().join("r.ndjson");
    let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["record", "--interval", "0.2", "--duration", "0.5", "-o"])
        .arg(&recording)
        .arg("--runtime-dir")
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let documents = [
        ("catalog --json", json_of(&["catalog", "--json"], None)),
        ("dump --json", json_of(&["dump", "--json", page.to_str().unwrap()], None)),
        ("snapshot --json", json_of(&["snapshot", "--json"], Some(tmp.path()))),
        (
            "snapshot --json --interval",
            json_of(&["snapshot", "--json", "--interval", "0.2"], Some(tmp.path())),
        ),
        ("top --once --json", json_of(&["top", "--once", "--json", "--interval", "0.2"], Some(tmp.path()))),
        ("hwc list --json", json_of(&["hwc", "list", "--json"], Some(tmp.path()))),
        ("report --json", json_of(&["report", "--json", recording.to_str().unwrap()], None)),
        ("serve /api/v1/snapshot", {
            let reply = api_snapshot(tmp.path());
            serde_json::from_str(reply.split_once("\r\n\r\n").unwrap().1).unwrap()
        }),
    ];
    for (what, doc) in &documents {
        assert_eq!(doc["schema_version"], 2, "{what}: {doc}");
        let checked = keys_say_what_they_hold(doc, what);
        if *what != "catalog --json" && *what != "hwc list --json" {
            assert!(checked > 20, "{what}: only {checked} counter keys");
        }
    }
    // The catalog says each counter's keys.
    let catalog = &documents[0].1["counters"];
    let io = catalog.as_array().unwrap().iter().find(|c| c["name"] == "IO instructions/sec").unwrap();
    assert_eq!(io["json_keys"]["total"], "io_instructions_total");
    assert_eq!(io["json_keys"]["presented"], "io_instructions_per_second");
    // A per-dispatch value exists over an interval only.
    let interval = &documents[3].1["instances"][0]["partitions"][0]["vps"][0];
    assert!(interval["interval"].get("cpu_wait_time_per_dispatch_ns").is_some(), "{interval}");
    assert!(interval["counters"].get("cpu_wait_time_ns_total").is_some(), "{interval}");
}

fn api_snapshot(dir: &Path) -> String {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["serve", "--listen", "127.0.0.1:0", "--snapshot-api", "--runtime-dir"])
        .arg(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let addr = common::serving_addr(&mut child);
    let _serve = common::KilledOnDrop(child);
    common::http_get(addr, "/api/v1/snapshot")
}

#[test]
fn run_json_has_the_schema_version_and_total_keys() {
    if !common::kvm_available("run_json_has_the_schema_version_and_total_keys") {
        return;
    }
    let tmp = TempDir::new("json-schema-run");
    let doc = json_of(&["run", "--vps", "1", "--json"], Some(tmp.path()));
    assert_eq!(doc["schema_version"], 2);
    assert_eq!(doc["partition"]["name"], "demo");
    assert!(keys_say_what_they_hold(&doc, "run --json") > 60);
}
