//! The series counts the README and docs/surfaces.md state (series per VP and per VM of the
//! default collectors, the labels of `hvstats_vm_info`) are what a scrape exports: a partition of
//! `hvstats run` and a QEMU VM `hvstats observe` publishes, both of 4 VPs, scraped by a default
//! `hvstats serve`. When the code changes a count, this test fails until the documents say it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{KilledOnDrop, TempDir, http_get, serve};

/// One sample line of an exposition: its metric name and labels.
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
}

/// The sample lines of a text exposition (values and comments left out).
fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|line| {
            let (name, rest) = line.split_at(line.find(['{', ' ']).unwrap());
            let mut labels = BTreeMap::new();
            if let Some(body) = rest.strip_prefix('{').and_then(|r| r.split_once("} ")).map(|(b, _)| b) {
                // name="value" pairs; values here hold no quote or comma.
                for pair in body.split(',').filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once('=').unwrap();
                    labels.insert(k.to_owned(), v.trim_matches('"').to_owned());
                }
            }
            Sample { name: name.to_owned(), labels }
        })
        .collect()
}

/// What a scrape exports of the VM `vm`: (series of VP 0, series per VM of the `vp` collector
/// (`vp="all"`), series per VM of the `vm` collector less its sources, its sources, the labels of
/// its `hvstats_vm_info`).
fn counts(samples: &[Sample], vm: &str) -> (usize, usize, usize, usize, BTreeSet<String>) {
    let of_vm: Vec<&Sample> =
        samples.iter().filter(|s| s.labels.get("vm").map(String::as_str) == Some(vm)).collect();
    let vp0 = of_vm.iter().filter(|s| s.labels.get("vp").map(String::as_str) == Some("0")).count();
    let vp_all = of_vm.iter().filter(|s| s.labels.get("vp").map(String::as_str) == Some("all")).count();
    let per_vm: Vec<&&Sample> = of_vm.iter().filter(|s| !s.labels.contains_key("vp")).collect();
    let sources = per_vm.iter().filter(|s| s.name == "hvstats_vm_source_up").count();
    let info =
        per_vm.iter().find(|s| s.name == "hvstats_vm_info").map(|s| s.labels.keys().cloned().collect());
    (vp0, vp_all, per_vm.len() - sources, sources, info.unwrap_or_default())
}

/// `text` with every run of white space one space (the documents wrap their lines anywhere).
fn flat(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The number written just before `phrase` in `text` (`17` of "… 17 on one of …").
fn number_before(text: &str, phrase: &str) -> usize {
    let at = text.find(phrase).unwrap_or_else(|| panic!("no {phrase:?} in the document"));
    let digits: String = text[..at]
        .trim_end()
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    digits.parse().unwrap_or_else(|_| panic!("no number before {phrase:?}"))
}

/// The cells of the README's collector table row of `collector`.
fn collector_row(readme: &str, collector: &str) -> Vec<String> {
    let row = readme.lines().find(|l| l.starts_with(&format!("| `{collector}` |"))).unwrap();
    row.split('|').map(|c| c.trim().to_owned()).collect()
}

/// The labels docs/surfaces.md's table of series gives `hvstats_vm_info`: (every VM's, a QEMU
/// VM's with a `-uuid` and no platform that says who it is).
fn info_labels(surfaces: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let row = surfaces.lines().find(|l| l.starts_with("| `hvstats_vm_info` |")).unwrap();
    let cell = row.split('|').nth(2).unwrap();
    let names = |s: &str| {
        s.split('`')
            .skip(1)
            .step_by(2)
            .filter(|n| !n.contains(' ') && !n.starts_with('-'))
            .map(str::to_owned)
            .collect()
    };
    // A platform's labels come only where a platform says who the VM is (docs/platforms/).
    let unplatformed = cell.split_once("; where the platform").map_or(cell, |(before, _)| before);
    (names(cell.split_once("for an observed VM").unwrap().0), names(unplatformed))
}

/// A QEMU VM of 4 vCPUs named `obs-4` with a QMP socket under `work`, and `hvstats observe`
/// publishing it under `dir`; `None` without QEMU (skipped, unless required).
fn observed_qemu(dir: &Path, work: &Path) -> Option<(KilledOnDrop, KilledOnDrop)> {
    let vm = ("obs-4", "6b29fc40-ca47-1067-b31d-00dd010662da", 4);
    common::observed_qemu(dir, work, vm, "the_documents_series_counts_are_a_scrapes")
}

#[test]
fn the_documents_series_counts_are_a_scrapes() {
    if !common::kvm_available("the_documents_series_counts_are_a_scrapes") {
        return;
    }
    let (runtime, work) = (TempDir::new("readme-counts"), TempDir::new("readme-counts-work"));
    let _run = KilledOnDrop(
        Command::new(env!("CARGO_BIN_EXE_hvstats"))
            .args(["run", "--name", "run-4", "--vps", "4", "--forever", "--runtime-dir"])
            .arg(runtime.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let Some(_observed) = observed_qemu(runtime.path(), work.path()) else { return };
    let (_serve, addr) = serve(runtime.path(), &[]);

    // Scraped once both VMs export every VP and their classes (the partition's guest has made
    // every exit it makes; the observed VM's tracepoints and QMP statistics are up).
    let deadline = Instant::now() + Duration::from_secs(120);
    let (own, observed) = loop {
        let s = samples(http_get(addr, "/metrics").split_once("\r\n\r\n").unwrap().1);
        let (own, observed) = (counts(&s, "run-4"), counts(&s, "obs-4"));
        let vps = |vm: &str| {
            s.iter().filter(|x| x.name == "hvstats_vp_exits_total" && x.labels["vm"] == vm).count()
        };
        // Its sources: QMP, the tracepoints and the threads' accounting (by the task iterator;
        // by /proc files and a thread clock's perf counters, two sources, where it cannot load).
        let iterated = s.iter().any(|x| {
            x.name == "hvstats_vm_source_up"
                && x.labels["vm"] == "obs-4"
                && x.labels["source"] == "thread-iter"
        });
        let sources = if iterated { 3 } else { 4 };
        if vps("run-4") == 4 && vps("obs-4") == 4 && own.1 == 3 && observed.3 == sources {
            break (own, observed);
        }
        assert!(Instant::now() < deadline, "the scrape never held both VMs whole");
        std::thread::sleep(Duration::from_millis(500));
    };
    eprintln!("per VP, per VM (vp, vm), sources: own {own:?}; observed {observed:?}");

    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md")).unwrap();
    let surfaces =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/surfaces.md"))
            .unwrap();
    let (readme_flat, surfaces_flat) = (flat(&readme), flat(&surfaces));
    let vp_row = collector_row(&readme, "vp");
    let vm_row = collector_row(&readme, "vm");
    // Series per VP: hvstats' own partition, and a VM observed on a host without VMX/SVM (which
    // this one is: `kvm_exit` never fires here, so the observed VM has no Other intercepts).
    assert_eq!(number_before(&vp_row[3], "on one of hvstats' own partitions"), own.0, "{vp_row:?}");
    assert_eq!(number_before(&surfaces_flat, "per VP on one of hvstats' own partitions"), own.0);
    assert_eq!(number_before(&readme_flat, "per VP), 557 KB"), own.0, "the 100-VM scrape's VPs are ours");
    assert_eq!(
        number_before(&vp_row[3], "on a VM observed on a host without VMX/SVM"),
        observed.0,
        "{vp_row:?}"
    );
    assert_eq!(number_before(&surfaces_flat, "on a VM observed on a host without VMX/SVM"), observed.0);
    // Series per VM: the vp collector's handling times (ours), the vm collector's, 1 per source.
    assert_eq!(number_before(&vp_row[4], "(the handling time"), own.1, "{vp_row:?}");
    assert_eq!(number_before(&vm_row[4], ", and 1 per source"), own.2, "{vm_row:?}");
    assert_eq!(observed.2, own.2, "the vm collector exports as many series of each VM");
    assert_eq!(number_before(&surfaces_flat, "per VM and 1 per source"), own.2);
    // The labels of hvstats_vm_info: those of every VM, and an observed QEMU's (its VMM, its
    // enlightenments, its UUID) besides.
    let (always, qemu) = info_labels(&surfaces);
    assert_eq!(own.4, always, "hvstats_vm_info of our own partition");
    assert_eq!(observed.4, qemu, "hvstats_vm_info of an observed QEMU VM");
}
