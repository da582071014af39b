//! Measurement and test support stay out of the product crates: no product crate depends on the
//! bench or the test kit (except as a dev-dependency), hvstats-kvm links no assembler, and no
//! test includes another crate's test files by path.

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The product crates: what a user of the libraries or the command links.
const PRODUCT: [&str; 7] = [
    "hvstats-abi",
    "hvstats",
    "hvstats-present",
    "hvstats-kvm",
    "hvstats-mshv",
    "hvstats-guest",
    "hvstats-cli",
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Each workspace package's dependencies as (name, kind), kind `null` for a normal one.
fn dependencies() -> Vec<(String, Vec<(String, Value)>)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(workspace_root())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let metadata: Value = serde_json::from_slice(&out.stdout).unwrap();
    metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| (d["name"].as_str().unwrap().to_owned(), d["kind"].clone()))
                .collect();
            (p["name"].as_str().unwrap().to_owned(), deps)
        })
        .collect()
}

#[test]
fn product_crates_take_the_bench_and_the_test_kit_only_as_the_command_and_tests_need_them() {
    let packages = dependencies();
    for product in PRODUCT {
        let (_, deps) = packages.iter().find(|(name, _)| name == product).expect(product);
        for (dep, kind) in deps {
            let normal = kind.is_null();
            if dep == "hvstats-testkit" {
                assert!(!normal, "{product} depends on hvstats-testkit outside its tests");
            }
            if dep == "hvstats-bench" {
                // The command runs the bench's rows (`hvstats bench`); no library does.
                assert_eq!(product, "hvstats-cli", "{product} depends on hvstats-bench");
            }
            if dep == "iced-x86" && product != "hvstats-guest" {
                assert!(!normal, "{product} links iced-x86 outside its tests");
            }
        }
    }
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn no_test_includes_another_crates_test_files_by_path() {
    let crates = workspace_root().join("crates");
    let mut files = Vec::new();
    for krate in std::fs::read_dir(&crates).unwrap() {
        let krate = krate.unwrap().path();
        for sub in ["tests", "benches", "src"] {
            if krate.join(sub).is_dir() {
                rust_files(&krate.join(sub), &mut files);
            }
        }
    }
    assert!(files.len() > 20, "{} files: not the workspace?", files.len());
    let borrowed: Vec<String> = files
        .iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(file).unwrap();
            text.lines()
                .filter(|l| l.trim_start().starts_with("#[path") && l.contains("/tests/"))
                .map(|l| format!("{}: {}", file.display(), l.trim()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(borrowed.is_empty(), "test files included by path: {borrowed:#?}");
}
