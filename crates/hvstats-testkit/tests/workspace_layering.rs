//! Measurement and test support stay out of the product crates: no product crate (the command
//! included) depends on the bench or the test kit except as a dev-dependency, so neither is in
//! what the shipped `hvstats` binary links; hvstats-kvm links no assembler; and no test includes
//! another crate's test files by path; the crates depend on each other in the one direction
//! docs/architecture.md draws.

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

mod common;
use common::{packages, workspace_root};

/// The product crates: what a user of the libraries or the command links.
const PRODUCT: [&str; 15] = [
    "hvstats-abi",
    "hvstats-platform",
    "hvstats",
    "hvstats-host",
    "hvstats-present",
    "hvstats-sources",
    "hvstats-kvm",
    "hvstats-observe",
    "hvstats-vmm",
    "hvstats-hwc",
    "hvstats-mshv",
    "hvstats-guest",
    "hvstats-surfaces",
    "hvstats-serve",
    "hvstats-cli",
];

/// The crates that only measure or test: never a normal dependency of a product crate.
const DEVELOPMENT: [&str; 2] = ["hvstats-bench", "hvstats-testkit"];

/// Each workspace package's dependencies as (name, kind), kind `null` for a normal one.
fn dependencies() -> Vec<(String, Vec<(String, Value)>)> {
    packages()
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
    for product in ["hvstats-present", "hvstats-kvm", "hvstats-observe", "hvstats-sources"] {
        assert!(linked.contains(product), "the hvstats binary does not link {product}: {linked:?}");
    }
    for development in DEVELOPMENT {
        assert!(!linked.contains(development), "the hvstats binary links {development}: {linked:?}");
    }
}

/// Every workspace crate `name` reaches through normal dependencies, itself left out.
fn reached_from(packages: &[(String, Vec<(String, Value)>)], name: &str) -> BTreeSet<String> {
    let mut reached = BTreeSet::new();
    let mut next = vec![name.to_owned()];
    while let Some(name) = next.pop() {
        let Some((_, deps)) = packages.iter().find(|(n, _)| *n == name) else { continue };
        for (dep, kind) in deps {
            if kind.is_null() && dep.starts_with("hvstats") && reached.insert(dep.clone()) {
                next.push(dep.clone());
            }
        }
    }
    reached
}

/// The rows of docs/architecture.md's drawing, bottom up: a crate may use only crates of lower
/// rows. Two crates of one row are beside each other and never use each other.
const ROWS: [&[&str]; 5] = [
    &["hvstats-abi", "hvstats-host", "hvstats-platform"],
    &["hvstats"],
    &["hvstats-sources", "hvstats-vmm", "hvstats-hwc", "hvstats-present", "hvstats-mshv", "hvstats-guest"],
    &["hvstats-kvm", "hvstats-observe", "hvstats-surfaces", "hvstats-serve"],
    &["hvstats-cli"],
];

fn row_of(krate: &str) -> usize {
    ROWS.iter().position(|row| row.contains(&krate)).unwrap_or_else(|| panic!("{krate} is in no row of ROWS"))
}

#[test]
fn the_crates_depend_on_each_other_in_the_direction_the_architecture_draws() {
    let packages = dependencies();
    let (mut arrows, mut back) = (0, Vec::new());
    for product in PRODUCT {
        let (_, deps) = packages.iter().find(|(name, _)| name == product).expect(product);
        for (dep, kind) in deps {
            if !kind.is_null() || !PRODUCT.contains(&dep.as_str()) {
                continue;
            }
            arrows += 1;
            if row_of(dep) >= row_of(product) {
                back.push(format!("{product} -> {dep}"));
            }
        }
        // No circle: nothing a crate reaches reaches it back.
        assert!(!reached_from(&packages, product).contains(product), "{product} is in a circle");
    }
    assert!(arrows > 20, "{arrows} arrows: not the workspace?");
    assert!(back.is_empty(), "arrows sideways or back up the drawing: {back:#?}");
    assert!(reached_from(&packages, "hvstats-observe").contains("hvstats-sources"));
    assert!(reached_from(&packages, "hvstats-kvm").contains("hvstats-sources"));
}

#[test]
fn every_product_crate_has_a_row_in_the_drawing() {
    let rows: usize = ROWS.iter().map(|row| row.len()).sum();
    assert_eq!(rows, PRODUCT.len(), "ROWS and PRODUCT list different crates");
    for product in PRODUCT {
        row_of(product);
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

/// A crate's modules (paths from its `src/`, `["observe", "sources"]`) and the source of each,
/// without its unit tests.
fn modules(src: &Path) -> BTreeMap<Vec<String>, String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files
        .into_iter()
        .map(|file| {
            let rel = file.strip_prefix(src).unwrap().with_extension("");
            let mut path: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
            if matches!(path.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                path.pop();
            }
            let text = std::fs::read_to_string(&file).unwrap();
            let text = match text.find("#[cfg(test)]\nmod tests") {
                Some(at) => text[..at].to_owned(),
                None => text,
            };
            let text: String =
                text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
            (path, without_inline_modules(&text))
        })
        .collect()
}

/// `text` without its inline modules (`mod name { … }`), whose `super` is not the file's: a module
/// of their own, left out of the check.
fn without_inline_modules(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("mod ") {
        let head = &rest[at + 4..];
        let name_len = head.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(head.len());
        let after = head[name_len..].trim_start();
        let starts_word = at == 0 || !rest[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_');
        if name_len == 0 || !starts_word || !after.starts_with('{') {
            out.push_str(&rest[..at + 4]);
            rest = &rest[at + 4..];
            continue;
        }
        out.push_str(&rest[..at]);
        let body = &rest[at + 4 + name_len + (head[name_len..].len() - after.len())..];
        let mut depth = 0usize;
        let mut end = body.len();
        for (i, c) in body.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &body[end..];
    }
    out.push_str(rest);
    out
}

/// The modules `module` refers to (by `crate::`, `super::` or a child module's name), each the
/// longest module path the reference names; its own ancestors count when an item of theirs is
/// named, not when a path only passes through them.
fn references(module: &[String], text: &str, all: &BTreeMap<Vec<String>, String>) -> BTreeSet<Vec<String>> {
    let mut found = BTreeSet::new();
    let children: Vec<&String> = all
        .keys()
        .filter(|m| m.len() == module.len() + 1 && m.starts_with(module))
        .map(|m| &m[module.len()])
        .collect();
    let words: Vec<&str> = text.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')).collect();
    for word in words {
        let parts: Vec<&str> = word.split("::").filter(|p| !p.is_empty()).collect();
        let Some(first) = parts.first() else { continue };
        let (mut base, rest): (Vec<String>, &[&str]) = match *first {
            "crate" => (Vec::new(), &parts[1..]),
            "super" => {
                let ups = parts.iter().take_while(|p| **p == "super").count();
                (module[..module.len().saturating_sub(ups)].to_vec(), &parts[ups..])
            }
            name if parts.len() > 1 && children.iter().any(|c| c.as_str() == name) => {
                (module.to_vec(), &parts[..])
            }
            _ => continue,
        };
        // `pub(crate)`, `pub(super)`: a visibility, not a path.
        if rest.is_empty() {
            continue;
        }
        for part in rest {
            base.push((*part).to_owned());
        }
        let target = (1..=base.len()).rev().map(|k| base[..k].to_vec()).find(|m| all.contains_key(m));
        if let Some(target) = target
            && target.as_slice() != module
        {
            found.insert(target);
        }
    }
    found
}

/// The modules' references of one crate: each module and the modules it refers to.
type Edges<'a> = BTreeMap<&'a Vec<String>, BTreeSet<Vec<String>>>;

/// Calls `visit` with every crate's `src`, its references, and each reference (module, target)
/// of the crate; returns how many references there were.
fn each_reference(mut visit: impl FnMut(&Path, &Edges<'_>, &[String], &[String])) -> usize {
    let mut checked = 0;
    for krate in std::fs::read_dir(workspace_root().join("crates")).unwrap() {
        let src = krate.unwrap().path().join("src");
        if !src.is_dir() {
            continue;
        }
        let all = modules(&src);
        let edges: Edges<'_> = all.iter().map(|(m, text)| (m, references(m, text, &all))).collect();
        for (module, refs) in &edges {
            for target in refs {
                checked += 1;
                visit(&src, &edges, module, target);
            }
        }
    }
    checked
}

#[test]
fn no_two_modules_of_a_crate_import_each_other_in_a_loop() {
    let mut loops = Vec::new();
    // A module is in a loop when one of the modules it refers to reaches it back.
    let checked = each_reference(|src, edges, module, target| {
        if reaches(edges, target, |m| m == module) {
            loops.push(format!(
                "{}: {} refers to {}, which reaches it back",
                src.display(),
                module.join("::"),
                target.join("::")
            ));
        }
    });
    assert!(checked > 100, "{checked} references: not the workspace?");
    assert!(loops.is_empty(), "modules in a loop: {loops:#?}");
}

/// Whether `from` reaches, through the modules' references, a module `arrived` takes.
fn reaches(edges: &Edges<'_>, from: &[String], arrived: impl Fn(&[String]) -> bool) -> bool {
    let (mut seen, mut todo) = (BTreeSet::new(), vec![from.to_vec()]);
    while let Some(m) = todo.pop() {
        if arrived(&m) {
            return true;
        }
        if seen.insert(m.clone()) {
            todo.extend(edges.get(&m).into_iter().flatten().cloned());
        }
    }
    false
}

#[test]
fn no_module_refers_to_a_module_that_reaches_back_into_its_parent() {
    // `hypercall::doc` referring to `catalog`, which refers to `hypercall`: the room `hypercall`
    // and the room `catalog` then use each other, through an arrow only the child draws.
    let mut back = Vec::new();
    let checked = each_reference(|src, edges, module, target| {
        let rooms = (1..module.len()).map(|k| &module[..k]).filter(|room| !target.starts_with(room));
        for room in rooms.filter(|room| reaches(edges, target, |m| m.starts_with(room))) {
            back.push(format!(
                "{}: {} refers to {}, which reaches back into {}",
                src.display(),
                module.join("::"),
                target.join("::"),
                room.join("::")
            ));
        }
    });
    assert!(checked > 100, "{checked} references: not the workspace?");
    assert!(back.is_empty(), "back arrows: {back:#?}");
}
