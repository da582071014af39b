//! `hvstats catalog` and `hvstats dump`, run as the built binary.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use hvstats_abi::catalog::{self, counters_of};
use hvstats_abi::group::{GroupHeader, GroupType, GroupVersion};
use hvstats_abi::page::{PageBuilder, PageLayout, StatsPage};
use hvstats_abi::{CATALOG, GroupKind, Maintained, ObjectKind, Presentation, Unit};
use serde_json::Value;

fn hvstats(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hvstats")).args(args).output().expect("run hvstats")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("utf-8 stdout")
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).expect("utf-8 stderr")
}

/// A fresh path in the test's temporary directory.
fn temp_path(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let n = N.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!("catalog_dump-{}-{n}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// Writes `bytes` to a fresh file and returns its path.
fn page_file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = temp_path(name);
    std::fs::write(&path, bytes).expect("write page file");
    path
}

fn page_bytes(page: &StatsPage) -> Vec<u8> {
    page.data.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A page of `kind` whose counters hold distinct, recognisable values.
fn sample_page(kind: ObjectKind) -> StatsPage {
    let mut page = StatsPage::new(kind);
    for (i, c) in counters_of(kind).enumerate() {
        page.set(c.id, value_of(i));
    }
    page
}

fn value_of(i: usize) -> u64 {
    0x1000_0000_0000 + (i as u64) * 1_000_003
}

fn dump_json(path: &std::path::Path, extra: &[&str]) -> Value {
    let mut args = vec!["dump", path.to_str().unwrap(), "--json"];
    args.extend_from_slice(extra);
    let o = hvstats(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("dump --json prints JSON")
}

#[test]
fn catalog_json_lists_every_counter_of_the_catalog() {
    let o = hvstats(&["catalog", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(doc["schema_version"], 2);
    let rows = doc["counters"].as_array().unwrap();
    // The 96 of seed 001, 2 appended in VP release 1.1 and 2 in 1.2, 9 + 2 in hvstats' own group
    // (1.1), 1 in its 1.2, 1 in its 1.3 (failed hypercalls) and 1 in its 1.4 (the time of the
    // counts' publication), the 29 rows of the partition
    // page's own group saying which source gave what, its 1.1's VM state, its 1.2's rows of
    // sources 7 to 15 (27), its 1.3's two origins of counting and its 1.4's origin of the counts
    // kept across observers, and the observer's health (5) on the hypervisor page, with its 1.1's
    // VMs refused by reason (a row per reason of the refusal table).
    let reasons = hvstats_abi::refusal::Refusal::ALL.len();
    assert_eq!(rows.len(), 96 + 2 + 2 + 9 + 2 + 1 + 1 + 1 + 29 + 1 + 27 + 2 + 1 + 5 + reasons);
    assert_eq!(rows.len(), CATALOG.len());
    for (row, c) in rows.iter().zip(CATALOG) {
        assert_eq!(row["object"], c.id.kind.short_name());
        assert_eq!(row["object_type"], c.id.kind.object_type().0);
        assert_eq!(row["group"], c.id.group.name());
        assert_eq!(row["group_type"], c.id.group.group_type().0);
        assert_eq!(row["index"], c.id.index);
        assert_eq!(row["offset"], c.id.offset());
        assert_eq!(row["name"], c.name);
        // The keys a document gives the counter, by what it holds.
        assert_eq!(row["json_keys"]["total"], common::total(c.name));
        assert_eq!(row["json_keys"]["presented"], common::presented(c.name));
        assert_eq!(row["unit"], c.unit.name());
        assert_eq!(row["presentation"], c.presentation.name());
        // The seed's words first; a time the seed describes as shown also says what the page holds.
        let description = row["description"].as_str().unwrap();
        assert!(description.starts_with(c.description), "{description}");
        if c.presentation == Presentation::Cost && c.unit == Unit::Time100ns {
            assert!(
                description.contains("The page holds the total time in 100 ns units; over"),
                "{description}"
            );
        }
        assert_eq!(row["maintained_note"], c.maintained.note());
        match c.maintained {
            Maintained::By(source, _) => assert_eq!(row["maintained"], source.name()),
            Maintained::No(_) => assert_eq!(row["maintained"], "no"),
        }
    }
    // Spot checks against seed 001 itself: first and last of every group.
    let find = |object: &str, group: &str, index: u64| {
        rows.iter()
            .find(|r| r["object"] == object && r["group"] == group && r["index"] == index)
            .map(|r| r["name"].as_str().unwrap().to_owned())
    };
    assert_eq!(find("hypervisor", "architectural", 1).as_deref(), Some("Logical processors"));
    assert_eq!(find("hypervisor", "architectural", 5).as_deref(), Some("Monitored notifications"));
    assert_eq!(find("lp", "architectural", 1).as_deref(), Some("Global time"));
    assert_eq!(find("lp", "architectural", 18).as_deref(), Some("% C3 time"));
    assert_eq!(find("partition", "architectural", 1).as_deref(), Some("Virtual processors"));
    assert_eq!(find("partition", "release", 1).as_deref(), Some("Virtual TLB Pages"));
    assert_eq!(find("partition", "release", 7).as_deref(), Some("Recommended virtual TLB size"));
    assert_eq!(find("vp", "architectural", 2).as_deref(), Some("Hypervisor run time"));
    assert_eq!(find("vp", "release", 1).as_deref(), Some("Hypercalls/sec"));
    assert_eq!(find("vp", "release", 63).as_deref(), Some("Virtual processor hypercalls/sec"));
    assert_eq!(find("vp", "release", 65).as_deref(), Some("CPU wait time per dispatch"));
    assert_eq!(find("vp", "hvstats", 1).as_deref(), Some("Sequence"));
    assert_eq!(find("vp", "hvstats", 35).as_deref(), Some("IO intercept time histogram"));
}

#[test]
fn catalog_table_has_a_row_per_counter_in_aligned_columns() {
    let o = hvstats(&["catalog"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1 + CATALOG.len());
    assert!(lines[0].starts_with("OBJECT"));
    let name_col = lines[0].find("NAME").unwrap();
    let desc_col = lines[0].find("DESCRIPTION").unwrap();
    for (line, c) in lines[1..].iter().zip(CATALOG) {
        assert_eq!(&line[name_col..name_col + c.name.len()], c.name, "{line}");
        assert!(line[desc_col..].starts_with(c.description), "{line}");
        assert!(line.starts_with(c.id.kind.short_name()));
    }
    let row = lines.iter().find(|l| l.contains("Hypercalls cost")).unwrap();
    assert!(
        row.ends_with(
            "The average time (in nanoseconds) spent processing a hypercall. The page holds the total \
             time in 100 ns units; over \"Hypercalls/sec\" it is this average."
        ),
        "{row}"
    );
    // "no" with the reason for a counter KVM cannot maintain.
    let row = lines.iter().find(|l| l.contains("MWAIT instructions/sec")).unwrap();
    assert!(row.contains(" no ") && row.contains("KVM counts no MWAIT exits"), "{row}");
}

#[test]
fn dump_prints_every_counter_of_each_kind_and_infers_its_type() {
    for kind in ObjectKind::ALL {
        let path = page_file(kind.short_name(), &page_bytes(&sample_page(kind)));
        let v = dump_json(&path, &[]);
        assert_eq!(v["type"], kind.short_name());
        assert_eq!(v["inferred"], true);
        let counters = v["counters"].as_object().unwrap();
        assert_eq!(counters.len(), counters_of(kind).count());
        for (i, c) in counters_of(kind).enumerate() {
            assert_eq!(counters[&common::total(c.name)], value_of(i), "{kind:?} {}", c.name);
        }
        let layout = PageLayout::of(kind);
        let groups = v["groups"].as_array().unwrap();
        assert_eq!(groups.len(), layout.slots().count());
        for (g, slot) in groups.iter().zip(layout.slots()) {
            assert_eq!(g["offset"], slot.header_offset);
            assert_eq!(g["counters"], slot.counters);
            assert_eq!(g["version"], slot.version.to_string());
            assert_eq!(g["extra_counters"], 0);
        }
        assert_eq!(v["unknown_groups"], serde_json::json!([]));
        assert_eq!(v["end"]["offset"], layout.end_offset);

        // Given the type, it is not inferred; the text form names every counter with its value.
        let v = dump_json(&path, &["--type", kind.short_name()]);
        assert_eq!(v["inferred"], false);
        let o = hvstats(&["dump", path.to_str().unwrap()]);
        assert!(o.status.success());
        let text = stdout(&o);
        assert!(text.starts_with(&format!("type: {} (inferred", kind.short_name())), "{text}");
        for (i, c) in counters_of(kind).enumerate() {
            if c.is_bookkeeping() {
                // The sequence counter is no measurement: in --json only.
                assert!(!text.lines().any(|l| l.starts_with(c.name)), "{text}");
                assert_eq!(v["counters"][common::total(c.name)], value_of(i), "{v}");
                continue;
            }
            let line = text.lines().find(|l| l.starts_with(c.name)).unwrap_or_else(|| panic!("{}", c.name));
            let cells: Vec<&str> = line[c.name.len()..].split_whitespace().collect();
            assert_eq!(cells, [value_of(i).to_string().as_str(), c.unit.name()], "{line}");
        }
    }
}

#[test]
fn dump_reads_a_newer_minor_and_lists_unknown_groups() {
    let mut b = PageBuilder::new();
    b.group(GroupType(7), GroupVersion { major: 3, minor: 4 }, &[1, 2]).unwrap();
    b.group(GroupType::ARCHITECTURAL, GroupVersion::V1_0, &[11, 12]).unwrap();
    let release: Vec<u64> = (1..=70).map(|i| 100 + i).collect();
    b.group(GroupType::RELEASE, GroupVersion { major: 1, minor: 3 }, &release).unwrap();
    b.group(GroupType::INTERNAL, GroupVersion::V1_0, &[0; 4]).unwrap();
    let path = page_file("newer", &page_bytes(&b.finish()));

    let v = dump_json(&path, &[]);
    assert_eq!(v["type"], "vp");
    assert_eq!(v["counters"][common::total("Total run time")], 11);
    assert_eq!(v["counters"][common::total("Hypercalls/sec")], 101);
    assert_eq!(v["counters"][common::total("Virtual processor hypercalls/sec")], 163);
    assert_eq!(v["counters"][common::total("CPU wait time per dispatch")], 165);
    assert_eq!(v["counters"][common::total("Nested page fault intercepts cost")], 167);
    let release = &v["groups"][1];
    assert_eq!(release["version"], "1.3");
    assert_eq!(release["extra_counters"], 3);
    let unknown = v["unknown_groups"].as_array().unwrap();
    assert_eq!(unknown.len(), 2);
    assert_eq!(
        (&unknown[0]["offset"], &unknown[0]["type"], &unknown[0]["length"]),
        (&0.into(), &7.into(), &16.into())
    );
    assert_eq!(unknown[0]["version"], "3.4");
    assert_eq!((&unknown[1]["type"], &unknown[1]["name"]), (&14.into(), &"internal".into()));

    let text = stdout(&hvstats(&["dump", path.to_str().unwrap()]));
    assert!(text.contains("version 1.3 at byte 48: 70 counters, 3 more from a newer minor"), "{text}");
    assert!(
        text.contains("unknown groups (skipped):\n  byte 0: type 7 (unknown) version 3.4, length 16"),
        "{text}"
    );
    assert!(text.contains("byte 616: type 14 (internal) version 1.0, length 32"), "{text}");
}

#[test]
fn dump_rejects_malformed_pages_with_the_offset_and_reason() {
    let valid = page_bytes(&sample_page(ObjectKind::Vp));
    let release_at = PageLayout::of(ObjectKind::Vp).group_offset(GroupKind::Release).unwrap();
    let header = |bytes: &mut Vec<u8>, h: GroupHeader| {
        bytes[release_at..release_at + 8].copy_from_slice(&{
            let mut w = [0u8; 8];
            w[0..2].copy_from_slice(&h.group_type.0.to_le_bytes());
            w[2..4].copy_from_slice(&h.minor.to_le_bytes());
            w[4..6].copy_from_slice(&h.major.to_le_bytes());
            w[6..8].copy_from_slice(&h.length.to_le_bytes());
            w
        })
    };
    let cases: Vec<(&str, GroupHeader, &str)> = vec![
        (
            "past",
            GroupHeader::new(GroupType::RELEASE, GroupVersion::V1_0, 4080),
            "at byte 24: group at byte 24: length 4080 runs past the end of the page",
        ),
        (
            "misaligned",
            GroupHeader::new(GroupType::RELEASE, GroupVersion::V1_0, 501),
            "at byte 24: group at byte 24: length 501 is not a multiple of 8",
        ),
        (
            "major",
            GroupHeader::new(GroupType::RELEASE, GroupVersion { major: 2, minor: 0 }, 504),
            "at byte 24: group release-specific(3) at byte 24: major version 2 is not the reader's 1",
        ),
    ];
    for (name, h, message) in cases {
        let mut bytes = valid.clone();
        header(&mut bytes, h);
        let path = page_file(name, &bytes);
        for extra in [&[][..], &["--type", "vp"][..], &["--json"][..]] {
            let mut args = vec!["dump", path.to_str().unwrap()];
            args.extend_from_slice(extra);
            let o = hvstats(&args);
            assert_eq!(o.status.code(), Some(1), "{name} {extra:?}");
            assert!(o.stdout.is_empty());
            let err = stderr(&o);
            assert!(err.contains("malformed"), "{err}");
            if extra.first() == Some(&"--type") || name != "major" {
                assert!(err.contains(message), "{name} {extra:?}: {err}");
            } else {
                // Inference finds no kind for a page of a newer major, and says why for each.
                assert!(err.contains("no object type reads it"), "{err}");
                assert!(
                    err.contains("as vp at byte 24: group release-specific(3) at byte 24: major"),
                    "{err}"
                );
            }
        }
    }

    // No END_OF_LIST: a group running to the very end of the page.
    let mut bytes = vec![0u8; 4096];
    bytes[0..8].copy_from_slice(&[9, 0, 0, 0, 1, 0, 0xF8, 0x0F]);
    let o = hvstats(&["dump", page_file("noend", &bytes).to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("at byte 4096: no END_OF_LIST header"), "{}", stderr(&o));

    // A page of the wrong kind for --type: a group too short, or a missing group, is named.
    let pt = page_file("pt", &page_bytes(&sample_page(ObjectKind::Partition)));
    let o = hvstats(&["dump", pt.to_str().unwrap(), "--type", "hypervisor"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains(
            "malformed hypervisor page at byte 0: group architectural(2) at byte 0: \
             length 8 is less than the 40 bytes its version defines"
        ),
        "{}",
        stderr(&o)
    );
    let hv = page_file("hv", &page_bytes(&sample_page(ObjectKind::Hypervisor)));
    let o = hvstats(&["dump", hv.to_str().unwrap(), "--type", "vp"]);
    assert_eq!(o.status.code(), Some(1));
    // The hypervisor page's own group (the observer's 5 rows and the refused VMs by reason) is far
    // shorter than the VP's.
    assert!(
        stderr(&o).contains(
            "malformed vp page at byte 48: group hvstats(18518) at byte 48: length 112 is less than the \
             2136 bytes its version defines"
        ),
        "{}",
        stderr(&o)
    );
}

#[test]
fn dump_refuses_files_that_are_not_one_page() {
    for len in [0usize, 4095, 4097, 8192] {
        let path = page_file("size", &vec![0u8; len]);
        let o = hvstats(&["dump", path.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(1), "{len}");
        assert!(
            stderr(&o).contains(&format!("is not a stats page: it has {len} bytes, a page has exactly 4096"))
        );
    }
    let missing = temp_path("missing");
    let o = hvstats(&["dump", missing.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("cannot read") && stderr(&o).contains("No such file"), "{}", stderr(&o));
}

#[test]
fn dump_usage_errors_exit_2() {
    let o = hvstats(&["dump", "x", "--type", "cpu"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("possible values: hypervisor, lp, partition, vp"), "{}", stderr(&o));
    assert_eq!(hvstats(&["dump"]).status.code(), Some(2));
}

#[test]
fn dump_writes_a_sample_page_that_reads_back() {
    let path = temp_path("sample");
    let o = hvstats(&["dump", path.to_str().unwrap(), "--write-sample", "--type", "lp"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 4096);
    let v = dump_json(&path, &[]);
    assert_eq!(v["type"], "lp");
    for c in counters_of(ObjectKind::LogicalProcessor) {
        assert_eq!(v["counters"][common::total(c.name)], c.id.offset(), "{}", c.name);
    }
    assert_eq!(v["counters"][common::total("% C3 time")], catalog::lp::C3_TIME.offset());
    // It never overwrites a file.
    let o = hvstats(&["dump", path.to_str().unwrap(), "--write-sample"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("cannot create"), "{}", stderr(&o));
}

#[test]
fn dump_names_the_release_1_1_counters_and_shows_histograms() {
    use hvstats_abi::catalog::vp;
    use hvstats_abi::histogram::Log2Histogram;
    let mut page = StatsPage::new(ObjectKind::Vp);
    page.set(vp::DISPATCHES, 40);
    page.set(vp::CPU_WAIT_TIME_PER_DISPATCH, 1_234_567);
    let mut h = Log2Histogram::default();
    for ns in [900, 900, 900, 70_000] {
        h.record(ns);
    }
    let at = vp::IO_TIME_HISTOGRAM.slot();
    page.data[at..at + h.to_slots().len()].copy_from_slice(&h.to_slots());
    let path = page_file("histograms", &page_bytes(&page));

    let v = dump_json(&path, &[]);
    assert_eq!(v["counters"][common::total("Dispatches/sec")], 40);
    assert_eq!(v["counters"][common::total("CPU wait time per dispatch")], 1_234_567);
    let io = &v["histograms"]["IO intercept time histogram"];
    assert_eq!(io["count"], 4);
    assert_eq!(io["sum_ns"], 3 * 900 + 70_000);
    assert_eq!(io["buckets"][10], 3);
    assert_eq!(io["buckets"][17], 1);
    assert_eq!(io["p50_ns_at_most"], 1023);
    assert_eq!(io["p99_ns_at_most"], 131_071);
    assert_eq!(v["histograms"]["Halt wait histogram"]["count"], 0);
    assert_eq!(v["groups"][2]["group"], "hvstats");
    assert_eq!(v["groups"][1]["version"], "1.2");

    let text = stdout(&hvstats(&["dump", path.to_str().unwrap()]));
    assert!(text.contains("group release (type 3) version 1.2 at byte 24: 67 counters\n"), "{text}");
    assert!(text.contains("group hvstats (type 18518) version 1.4 at byte 568"), "{text}");
    let line = text.lines().find(|l| l.starts_with("CPU wait time per dispatch")).unwrap();
    assert!(line.ends_with("1234567  ns"), "{line}");
    let at = text.find("IO intercept time histogram").unwrap();
    assert!(text[at..].lines().nth(1) == Some("  4 times, p50 <= 1023 ns, p99 <= 131071 ns"), "{text}");
}

#[test]
fn dump_decodes_a_1_0_page_and_lists_the_1_1_counters_as_absent() {
    // An older hypervisor's VP page: both TLFS groups at 1.0, the 63 release counters of seed 001.
    let v1_0 = [(GroupKind::Architectural, GroupVersion::V1_0), (GroupKind::Release, GroupVersion::V1_0)];
    let layout = PageLayout::written_at(ObjectKind::Vp, &v1_0);
    let mut page = layout.page();
    let carried: Vec<_> =
        counters_of(ObjectKind::Vp).enumerate().filter(|(_, c)| layout.slot_of(c.id).is_some()).collect();
    assert_eq!(carried.len(), 2 + 63);
    for &(i, c) in &carried {
        page.data[layout.slot_of(c.id).unwrap()] = value_of(i);
    }
    let path = page_file("v1_0", &page_bytes(&page));

    let v = dump_json(&path, &[]);
    assert_eq!(v["type"], "vp", "the 1.0 page is recognised as a VP page");
    for &(i, c) in &carried {
        assert_eq!(v["counters"][common::total(c.name)], value_of(i), "{}", c.name);
    }
    for c in counters_of(ObjectKind::Vp).filter(|c| layout.slot_of(c.id).is_none()) {
        assert!(v["counters"][common::total(c.name)].is_null(), "{} is absent: {}", c.name, v["counters"]);
    }
    let release = &v["groups"][1];
    assert_eq!((&release["version"], &release["counters"]), (&"1.0".into(), &63.into()));
    assert_eq!((&release["absent_counters"], &release["extra_counters"]), (&4.into(), &0.into()));
    assert_eq!(v["groups"].as_array().unwrap().len(), 2, "no hvstats group");

    let o = hvstats(&["dump", path.to_str().unwrap(), "--type", "vp"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("version 1.0 at byte 24: 63 counters, 4 of a later minor absent"), "{text}");
    let cells = |name: &str| {
        let line = text.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace().rev().take(2).collect::<Vec<_>>()
    };
    assert_eq!(cells("Dispatches/sec"), ["count", "-"]);
    assert_eq!(cells("CPU wait time per dispatch"), ["ns", "-"]);
    let hypercalls = carried.iter().find(|(_, c)| c.id == catalog::vp::HYPERCALLS).unwrap().0;
    assert_eq!(cells("Hypercalls/sec"), ["count", value_of(hypercalls).to_string().as_str()]);
}
