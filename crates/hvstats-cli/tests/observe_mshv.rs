//! `hvstats observe --mshv DIR`: a tree written in a kernel's exact format — mainline Linux's,
//! Microsoft's kernel tree's, or its older one-page-per-object revision's, on a root partition or
//! an L1VH — is published, and `snapshot --json` shows exactly its values under the catalog's
//! names, the names the catalog lacks under `unmapped`, and partitions as their directories come
//! and go; `--list-unknown` lists those names.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::TempDir;
use hvstats::unmapped::ObjectRef;
use hvstats_abi::ObjectKind;
use hvstats_mshv::dialect::Dialect;
use hvstats_mshv::names::{canonical, mapping};
use hvstats_mshv::synthetic::{Area, Host, KernelTree, SyntheticTree, full_file, kernel_tree, kind_of};
use serde_json::Value;

fn snapshot(runtime: &Path) -> Value {
    common::snapshot_json(runtime)
}

/// Polls `snapshot --json` until `done` holds for its mshv instance (or 20 s pass).
fn wait_for(runtime: &Path, done: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let doc = snapshot(runtime);
        let found = doc["instances"].as_array().and_then(|a| a.iter().find(|i| i["kind"] == "mshv"));
        if let Some(i) = found.filter(|i| done(i)) {
            return i.clone();
        }
        assert!(start.elapsed() < Duration::from_secs(20), "never: {doc}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Observer(Child);

impl Drop for Observer {
    fn drop(&mut self) {
        // SAFETY: plain kill of the child we started.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

fn vp(instance: &Value, partition: u64, index: u64) -> &Value {
    let p = instance["partitions"].as_array().unwrap().iter().find(|p| p["id"] == partition).unwrap();
    p["vps"].as_array().unwrap().iter().find(|v| v["index"] == index).unwrap()
}

#[test]
fn snapshot_shows_the_trees_values_under_the_catalogs_names_and_follows_its_partitions() {
    let tmp = TempDir::new("observe-mshv");
    let runtime = tmp.path().join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    let tree = SyntheticTree::new("cli").unwrap();
    let val = |object: u64| move |id: u16| object * 1000 + u64::from(id);
    tree.hypervisor(&full_file(ObjectKind::Hypervisor, val(1))).unwrap();
    tree.lp(0, &full_file(ObjectKind::LogicalProcessor, val(10))).unwrap();
    tree.partition("4", &full_file(ObjectKind::Partition, val(20))).unwrap();
    tree.vp("4", 0, &full_file(ObjectKind::Vp, val(30))).unwrap();
    tree.vp("4", 1, &full_file(ObjectKind::Vp, val(31))).unwrap();
    tree.partition("self", &[("PtVirtualProcessors", 1)]).unwrap();
    tree.vp("self", 0, &[("VpCpuidInstructionsCount", 77)]).unwrap();

    let child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["observe", "--interval", "0.05", "--runtime-dir"])
        .arg(&runtime)
        .arg("--mshv")
        .arg(tree.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut observer = Observer(child);
    let stderr = BufReader::new(observer.0.stderr.take().unwrap());
    let log = std::thread::spawn(move || stderr.lines().map_while(Result::ok).collect::<Vec<_>>());

    // A refresh writes the partitions first and the hypervisor's file last (its Partitions count
    // has the final word) and the unmapped side file after it: wait until one has landed whole.
    let i = wait_for(&runtime, |i| {
        i["partitions"].as_array().is_some_and(|p| p.len() == 2)
            && i["hypervisor"]["counters"][common::total("Partitions")] == 1002
            && i["hypervisor"]["unmapped"].is_object()
    });
    assert_eq!(i["hypervisor"]["counters"][common::total("Partitions")], 1002);
    assert_eq!(i["hypervisor"]["unmapped"]["HvSubsumedPages"], 1012);
    let lp = &i["lps"][0];
    assert_eq!(lp["counters"][common::total("Global time")], 10001);
    assert_eq!(
        lp["counters"][common::total("Context switch time")],
        10012 * 100,
        "100 ns to the catalog's ns"
    );
    assert_eq!(lp["unmapped"]["LpPerfmonInterruptCount"], 10051);
    let p4 = i["partitions"].as_array().unwrap().iter().find(|p| p["id"] == 4).unwrap();
    assert_eq!(p4["name"], "mshv:4");
    assert_eq!(p4["counters"][common::total("GPA pages")], 20006);
    assert_eq!(p4["unmapped"]["PtNumberofActiveChildPartitions"], 20046);
    let v1 = vp(&i, 4, 1);
    assert_eq!(v1["counters"][common::total("CPUID instructions/sec")], 31019);
    assert_eq!(v1["counters"][common::total("CPUID instructions cost")], 31020);
    assert_eq!(v1["counters"][common::total("Hypercalls/sec")], 31007);
    assert_eq!(v1["counters"][common::total("Virtual processor hypercalls/sec")], 31069);
    assert_eq!(v1["counters"][common::total("Dispatches/sec")], 31074);
    assert_eq!(v1["counters"][common::total("CPU wait time per dispatch")], 31075 * 100);
    assert_eq!(v1["unmapped"]["VpWaitingForCpuTimeBucket12"], 31209);
    assert_eq!(v1["unmapped"]["VpVtl1DispatchCount"], 31182);
    assert_eq!(v1["counters"][common::total("Nested page fault intercepts/sec")], 31071);
    assert_eq!(v1["counters"][common::total("Nested page fault intercepts cost")], 31072);
    assert_eq!(v1["unmapped"].as_object().unwrap().len(), 212 - 1 - 69, "every VP name the catalog lacks");
    assert_eq!(vp(&i, 4, 0)["counters"][common::total("Total run time")], 30001);
    // The L1VH's own partition: what its file lacks is absent, not 0.
    let own = vp(&i, u64::MAX, 0);
    assert_eq!(own["counters"][common::total("CPUID instructions/sec")], 77);
    assert_eq!(own["counters"][common::total("Hypercalls/sec")], Value::Null);
    // hvstats' own counters are no mshv counter: absent, the last histograms of the page too.
    for own_counter in ["Sequence", "IO intercept time histogram", "Halt poll fail histogram"] {
        assert_eq!(vp(&i, 4, 1)["counters"][common::total(own_counter)], Value::Null, "{own_counter}");
    }

    // The other readers, unchanged: /metrics and top.
    let metrics = common::scrape(&runtime);
    let name = i["name"].as_str().unwrap();
    let cpuid = "hvstats_vp_intercepts_total{vm=\"mshv:4\",vp=\"1\",intercept=\"cpuid\"} 31019";
    assert!(metrics.lines().any(|l| l == cpuid), "{metrics}");
    let vtl = format!(
        "hvstats_mshv_value{{publisher=\"{name}\",object=\"vp\",partition=\"4\",vp=\"1\",name=\"VpVtl1DispatchCount\"}} 31182"
    );
    assert!(metrics.lines().any(|l| l == vtl), "{metrics}");
    let top = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["top", "--once", "--interval", "0.1", "--runtime-dir"])
        .arg(&runtime)
        .output()
        .unwrap();
    assert!(top.status.success(), "{}", String::from_utf8_lossy(&top.stderr));
    assert!(String::from_utf8_lossy(&top.stdout).lines().any(|l| l.starts_with("mshv:4")));

    // A partition destroyed: its directory goes, and so does it from the next snapshot.
    tree.remove_partition("4").unwrap();
    let i = wait_for(&runtime, |i| i["partitions"].as_array().is_some_and(|p| p.len() == 1));
    assert_eq!(i["partitions"][0]["name"], "mshv:self");

    drop(observer);
    let log = log.join().unwrap();
    assert!(log.iter().any(|l| l.contains("mshv partition 4: VPs [0, 1]")), "{log:?}");
    assert!(log.iter().any(|l| l.contains("mshv partition 4: gone")), "{log:?}");
    assert!(log.iter().any(|l| l.contains("vp counter VpVtl2RunTime has no catalog counter")), "{log:?}");
}

#[test]
fn an_l1vh_tree_without_hypervisor_or_lp_files_shows_their_counters_as_null() {
    let tmp = TempDir::new("observe-mshv-l1vh");
    let runtime = tmp.path().join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    let tree = SyntheticTree::new("cli-l1vh").unwrap();
    tree.partition("self", &[("PtVirtualProcessors", 1)]).unwrap();
    tree.vp("self", 0, &[("VpTotalRunTime", 5)]).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["observe", "--interval", "0.05", "--runtime-dir"])
        .arg(&runtime)
        .arg("--mshv")
        .arg(tree.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _observer = Observer(child);
    let i = wait_for(&runtime, |i| i["partitions"].as_array().is_some_and(|p| p.len() == 1));
    let counters = i["hypervisor"]["counters"].as_object().unwrap();
    // Every hypervisor counter of the catalog (the observer's own rows included) is there, null.
    let catalog = hvstats_abi::catalog::counters_of(hvstats_abi::ObjectKind::Hypervisor).count();
    assert_eq!(counters.len(), catalog);
    assert!(counters.values().all(Value::is_null), "{counters:?}");
    assert_eq!(i["lps"].as_array().unwrap().len(), 0);
    assert_eq!(vp(&i, u64::MAX, 0)["counters"][common::total("Total run time")], 5);
    assert_eq!(vp(&i, u64::MAX, 0)["counters"][common::total("Hypervisor run time")], Value::Null);
}

#[test]
fn the_catalog_names_the_mshv_counter_behind_each_of_its_counters() {
    let out = Command::new(env!("CARGO_BIN_EXE_hvstats")).args(["catalog", "--json"]).output().unwrap();
    assert!(out.status.success());
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = doc["counters"].as_array().unwrap();
    let row =
        |object: &str, name: &str| rows.iter().find(|r| r["object"] == object && r["name"] == name).unwrap();
    assert_eq!(row("vp", "CPUID instructions/sec")["mshv"], "VpCpuidInstructionsCount");
    assert_eq!(row("vp", "CPU wait time per dispatch")["mshv"], "VpWaitingForCpuTime");
    assert_eq!(row("partition", "Virtual TLB flush entries/sec")["mshv"], "PtVirtualTlbFlushEntires");
    assert_eq!(row("vp", "Sequence")["mshv"], Value::Null);
}

#[test]
fn list_unknown_names_what_the_catalog_lacks_and_reads_nothing_else() {
    let tree = SyntheticTree::new("cli-list").unwrap();
    tree.partition("1", &[("PtVirtualProcessors", 1), ("PtPagesShattered", 3)]).unwrap();
    tree.vp("1", 0, &[("VpCpuidInstructionsCount", 1), ("VpLoadAvg", 2), ("VpFutureThing", 3)]).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["observe", "--list-unknown", "--mshv"])
        .arg(tree.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "partition\tPtPagesShattered\n\
         vp\tVpFutureThing\t(printed by no kernel hvstats knows: a newer or other build)\n\
         vp\tVpLoadAvg\n"
    );
    let missing = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["observe", "--list-unknown", "--mshv"])
        .arg(tree.path().join("absent"))
        .output()
        .unwrap();
    assert!(!missing.status.success());
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("cannot read the mshv debugfs tree") && err.contains("absent"), "{err}");
}

/// Pages whose values tell objects, counters and areas apart, with zeros where a kernel's choice
/// between the SELF and PARENT pages shows: SELF holds values at odd ids, PARENT at ids divisible
/// by 3.
fn pages(at: ObjectRef, area: Area, id: u16) -> u64 {
    let object = match at {
        ObjectRef::Hypervisor => 1,
        ObjectRef::Lp(n) => 10 + u64::from(n),
        ObjectRef::Partition(p) => 100 + p % 100,
        ObjectRef::Vp(p, n) => 1_000 + (p % 100) * 100 + u64::from(n),
    } * 10_000;
    let id = u64::from(id);
    match area {
        Area::Own if id % 2 == 1 => object + id,
        Area::Parent if id % 3 == 0 => object + 5_000 + id,
        _ => 0,
    }
}

/// The JSON object of `at` in an instance of `snapshot --json`.
fn object_of(instance: &Value, at: ObjectRef) -> &Value {
    fn find<'a>(list: &'a Value, key: &str, want: u64) -> Option<&'a Value> {
        list.as_array()?.iter().find(|o| o[key] == want)
    }
    let found = match at {
        ObjectRef::Hypervisor => Some(&instance["hypervisor"]),
        ObjectRef::Lp(n) => find(&instance["lps"], "cpu", u64::from(n)),
        ObjectRef::Partition(id) => find(&instance["partitions"], "id", id),
        ObjectRef::Vp(id, n) => {
            find(&instance["partitions"], "id", id).and_then(|p| find(&p["vps"], "index", u64::from(n)))
        }
    };
    found.unwrap_or_else(|| panic!("{at} is not in {instance}"))
}

/// Checks that every line `k` printed is in `instance`: a mapped counter under its catalog name
/// at exactly the printed value (scaled to the catalog's unit), any other under `unmapped` by its
/// one name; and that every counter the catalog maps was printed.
fn assert_published_exactly(k: &KernelTree, instance: &Value) {
    for (at, lines) in &k.printed {
        let kind = kind_of(*at);
        let object = object_of(instance, *at);
        let mut mapped = 0;
        for (printed, value) in lines {
            let name = canonical(kind, printed).unwrap();
            match mapping(kind, name) {
                Some(m) => {
                    let counter = m.counter.counter().unwrap().name;
                    assert_eq!(
                        object["counters"][common::total(counter)],
                        m.scale.apply(*value),
                        "{at} {printed} ({counter})"
                    );
                    mapped += 1;
                }
                None => assert_eq!(object["unmapped"][name], *value, "{at} {printed} ({name})"),
            }
        }
        let catalog = hvstats_mshv::names::MAPPINGS.iter().filter(|m| m.counter.kind == kind).count();
        assert_eq!(mapped, catalog, "{at}: every counter the catalog maps is printed");
        let unmapped = object["unmapped"].as_object().map_or(0, |u| u.len());
        assert_eq!(unmapped, lines.len() - mapped, "{at}: nothing else is under unmapped");
    }
}

#[test]
fn every_kernels_tree_root_and_l1vh_publishes_every_mapped_counter_at_its_exact_value() {
    let tmp = TempDir::new("observe-mshv-dialects");
    let cases = [
        (Dialect::Mainline, Host::root(2, vec![(5, vec![0, 2])])),
        (Dialect::Mainline, Host::l1vh(2, vec![(6, vec![1])])),
        (Dialect::Microsoft, Host::root(2, vec![(5, vec![0, 2])])),
        (Dialect::Microsoft, Host::l1vh(2, vec![(6, vec![1])])),
        (Dialect::MicrosoftSinglePage, Host::root(2, vec![(5, vec![0, 2])])),
    ];
    // Every tree observed at once, each into a runtime directory of its own.
    let observed: Vec<(KernelTree, std::path::PathBuf, Observer)> = cases
        .iter()
        .enumerate()
        .map(|(i, (dialect, host))| {
            let k = kernel_tree(&format!("cli-dialect-{i}"), *dialect, host, pages).unwrap();
            let runtime = tmp.path().join(format!("run{i}"));
            std::fs::create_dir_all(&runtime).unwrap();
            let child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
                .args(["observe", "--interval", "0.05", "--runtime-dir"])
                .arg(&runtime)
                .arg("--mshv")
                .arg(k.tree.path())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (k, runtime, Observer(child))
        })
        .collect();
    for ((k, runtime, mut observer), (dialect, host)) in observed.into_iter().zip(&cases) {
        let partitions = k.printed.keys().filter(|at| matches!(at, ObjectRef::Partition(_))).count();
        // The side file is published after every page of a reading is written.
        let instance = wait_for(&runtime, |i| {
            i["partitions"]
                .as_array()
                .is_some_and(|p| p.len() == partitions && p.iter().all(|p| p["unmapped"].is_object()))
        });
        assert_published_exactly(&k, &instance);
        if !host.root {
            // No hypervisor or LP files: their counters are absent, not 0.
            assert!(instance["hypervisor"]["counters"].as_object().unwrap().values().all(Value::is_null));
            assert_eq!(instance["lps"].as_array().unwrap().len(), 0);
            assert!(instance["partitions"].as_array().unwrap().iter().any(|p| p["name"] == "mshv:self"));
        }
        // The log names the format, and each unmapped name under the kind of file that printed it.
        let stderr = observer.0.stderr.take().unwrap();
        drop(observer);
        let log = std::io::read_to_string(stderr).unwrap();
        assert!(log.contains(&format!("mshv: the tree is printed in {}", dialect.label())), "{log}");
        assert!(log.contains("mshv: vp counter VpVtl1DispatchCount has no catalog counter"), "{log}");
        let hv = "mshv: hypervisor counter HvSubsumedPages has no catalog counter";
        assert_eq!(log.contains(hv), host.root, "{log}");
        assert!(log.contains("mshv: partition counter PtPagesShattered has no catalog counter"), "{log}");
        assert!(!log.contains("hypervisor counter Vp") && !log.contains("hypervisor counter Pt"), "{log}");
    }
}

#[test]
fn list_unknown_names_counters_of_microsofts_tree_under_their_one_name() {
    let k = kernel_tree("cli-list-ms", Dialect::Microsoft, &Host::root(1, vec![]), pages).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["observe", "--list-unknown", "--mshv"])
        .arg(k.tree.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // Every name Microsoft's tree prints that the catalog lacks, by its one name, none unknown.
    let expected: usize = ObjectKind::ALL
        .iter()
        .map(|&kind| {
            Dialect::Microsoft
                .names(kind)
                .iter()
                .filter(|(_, n)| mapping(kind, canonical(kind, n).unwrap()).is_none())
                .count()
        })
        .sum();
    assert_eq!(lines.len(), expected, "{text}");
    assert!(lines.contains(&"hypervisor\tHvSubsumedPages"), "{text}");
    assert!(lines.contains(&"lp\tLpPlaceholder10"), "{text}");
    assert!(lines.contains(&"vp\tVpVtl1DispatchCount"), "{text}");
    assert!(lines.iter().all(|l| !l.contains("no kernel hvstats knows")), "{text}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the tree is printed in the format of Microsoft's kernel tree"), "{err}");
}
