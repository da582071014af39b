//! Measurement and test support stay out of the product crates: no product crate (the command
//! included) depends on the bench or the test kit except as a dev-dependency, so neither is in
//! what the shipped `hvstats` binary links; hvstats-kvm links no assembler; and no test includes
//! another crate's test files by path.

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The product crates: what a user of the libraries or the command links.
const PRODUCT: [&str; 7] = [
    "hvstats-abi",
    "hvstats",
    "hvstats-host",
    "hvstats-present",
    "hvstats-kvm",
    "hvstats-guest",
    "hvstats-cli",
];

/// The crates that only measure or test: never a normal dependency of a product crate.
const DEVELOPMENT: [&str; 2] = ["hvstats-bench", "hvstats-testkit"];

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
fn no_product_crate_takes_the_bench_or_the_test_kit_as_a_normal_dependency() {
    let packages = dependencies();
    let names: BTreeSet<&str> = packages.iter().map(|(name, _)| name.as_str()).collect();
    for crate_name in PRODUCT.iter().chain(&DEVELOPMENT) {
        assert!(names.contains(crate_name), "{crate_name} is not in the workspace: {names:?}");
    }
    for product in PRODUCT {
        let (_, deps) = packages.iter().find(|(name, _)| name == product).expect(product);
        for (dep, kind) in deps {
            let normal = kind.is_null();
            if DEVELOPMENT.contains(&dep.as_str()) {
                assert!(!normal, "{product} depends on {dep} outside its tests");
            }
            if dep == "iced-x86" && product != "hvstats-guest" {
                assert!(!normal, "{product} links iced-x86 outside its tests");
            }
        }
    }
}

#[test]
fn the_shipped_binary_links_neither_the_bench_nor_the_test_kit() {
    // What `cargo tree -p hvstats-cli -e normal` lists of the workspace: every crate reached
    // from the command through normal dependencies.
    let packages = dependencies();
    let normal_deps = |name: &str| -> Vec<String> {
        packages
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, deps)| deps.iter().filter(|(_, kind)| kind.is_null()).map(|(d, _)| d.clone()).collect())
            .unwrap_or_default()
    };
    let mut linked = BTreeSet::from(["hvstats-cli".to_owned()]);
    let mut next = vec!["hvstats-cli".to_owned()];
    while let Some(name) = next.pop() {
        for dep in normal_deps(&name) {
            if linked.insert(dep.clone()) {
                next.push(dep);
            }
        }
    }
    assert!(linked.contains("hvstats-present") && linked.contains("hvstats-kvm"), "{linked:?}");
    for development in DEVELOPMENT {
        assert!(!linked.contains(development), "the hvstats binary links {development}: {linked:?}");
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
