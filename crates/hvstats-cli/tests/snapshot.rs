//! `hvstats snapshot` run as a separate process reads the counters of an instance this test
//! publishes, through the published pages.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use common::{TempDir, publish, publish_with, rss_anon_kib, write_1_0_vp_page};

use std::path::Path;
use std::process::Command;

use hvstats::InstanceConfig;
use hvstats_abi::ObjectKind;
use hvstats_abi::catalog::{counters_of, hypervisor, partition, vp};
use serde_json::Value;

fn snapshot(dir: &Path, json: bool) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hvstats"));
    cmd.arg("snapshot").arg("--runtime-dir").arg(dir);
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().unwrap();
    (out.status.success(), String::from_utf8(out.stdout).unwrap())
}

fn name(c: hvstats_abi::CounterId) -> &'static str {
    c.counter().unwrap().name
}

#[test]
fn snapshot_json_shows_the_counters_of_a_published_instance() {
    let tmp = TempDir::new("json");
    let hv = publish(tmp.path());
    let part = hv.create_partition(2).unwrap();
    part.set_ram_pages(100);
    part.vp_page(1).unwrap().set(vp::CPUID_INSTRUCTIONS, 4242);
    part.page().set(partition::GPA_SPACE_MODIFICATIONS, 3);

    let (ok, stdout) = snapshot(tmp.path(), true);
    assert!(ok);
    let v: Value = serde_json::from_str(&stdout).unwrap();
    let instances = v["instances"].as_array().unwrap();
    assert_eq!(instances.len(), 1);
    let i = &instances[0];
    assert_eq!(i["pid"], std::process::id());
    assert_eq!(i["hypervisor"]["counters"][common::total(name(hypervisor::PARTITIONS))], 1);
    assert_eq!(i["hypervisor"]["counters"][common::total(name(hypervisor::VIRTUAL_PROCESSORS))], 2);
    assert_eq!(i["hypervisor"]["counters"][common::total(name(hypervisor::TOTAL_PAGES))], 1 + 1 + 3 + 100);
    assert_eq!(i["lps"].as_array().unwrap().len(), 1);
    assert_eq!(i["lps"][0]["index"], 0);
    let p = &i["partitions"][0];
    assert_eq!(p["id"], part.id());
    assert_eq!(p["counters"][common::total(name(partition::GPA_PAGES))], 100);
    assert_eq!(p["counters"][common::total(name(partition::GPA_SPACE_MODIFICATIONS))], 3);
    // The 8 of seed 001 and the VM's state (a state: by its name).
    assert_eq!(p["counters"].as_object().unwrap().len(), 8 + 1);
    assert_eq!(p["counters"][common::total(name(partition::VM_STATE))], "running");
    // The observer's health is an observer's alone.
    assert_eq!(i["hypervisor"]["counters"][common::total(name(hypervisor::OBSERVER_UP))], Value::Null);
    assert_eq!(p["vps"].as_array().unwrap().len(), 2);
    assert_eq!(p["vps"][1]["index"], 1);
    assert_eq!(p["vps"][1]["counters"][common::total(name(vp::CPUID_INSTRUCTIONS))], 4242);
    assert_eq!(p["vps"][0]["counters"][common::total(name(vp::CPUID_INSTRUCTIONS))], 0);
    // Every VP row of the catalog: seed 001's 65, release 1.1's CPU wait and dispatches, 1.2's
    // nested page faults, and hvstats' own sequence counter, histograms (by their sums), host
    // page faults, exits, failed hypercalls and the time of the counts' publication.
    assert_eq!(p["vps"][0]["counters"].as_object().unwrap().len(), counters_of(ObjectKind::Vp).count());
    assert_eq!(counters_of(ObjectKind::Vp).count(), 65 + 2 + 2 + 9 + 2 + 1 + 1 + 1);
    assert_eq!(p["vps"][0]["counters"][common::total(name(vp::CPU_WAIT_TIME_PER_DISPATCH))], 0);

    // A second snapshot sees the writer's new value.
    part.vp_page(1).unwrap().add(vp::CPUID_INSTRUCTIONS, 8);
    let (_, stdout) = snapshot(tmp.path(), true);
    let v: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        v["instances"][0]["partitions"][0]["vps"][1]["counters"][common::total(name(vp::CPUID_INSTRUCTIONS))],
        4250
    );

    let (ok, table) = snapshot(tmp.path(), false);
    assert!(ok);
    assert!(table.contains("Hyper-V Hypervisor Virtual Processor"), "{table}");
    assert!(!table.contains("Sequence"), "bookkeeping is no row of a table: {table}");
    // Without an interval a "/sec" counter is its total, and says so.
    let row = table.lines().find(|l| l.trim_start().starts_with("CPUID instructions (total)")).unwrap();
    assert!(row.contains(" 4250"), "{row}");
}

#[test]
fn snapshot_json_carries_each_vps_full_histograms_and_wait() {
    let tmp = TempDir::new("json-histograms");
    let hv = publish(tmp.path());
    let part = hv.create_partition(2).unwrap();
    let vp1 = part.vp_page(1).unwrap();
    // 98 exits in [512, 1024) ns, one in [65536, 131072), one past the last bound.
    for _ in 0..98 {
        vp1.record_time(vp::MSR_TIME_HISTOGRAM, 600);
    }
    vp1.record_time(vp::MSR_TIME_HISTOGRAM, 100_000);
    vp1.record_time(vp::MSR_TIME_HISTOGRAM, 1 << 40);
    vp1.set(vp::DISPATCHES, 12);
    vp1.set(vp::CPU_WAIT_TIME_PER_DISPATCH, 3_000);

    // The streamed document and the one taken over an interval carry the same histograms.
    let mut docs = vec![snapshot(tmp.path(), true).1];
    let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["snapshot", "--json", "--interval", "0.1", "--runtime-dir"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    docs.push(String::from_utf8(out.stdout).unwrap());
    for doc in docs {
        let v: Value = serde_json::from_str(&doc).unwrap();
        let vps = &v["instances"][0]["partitions"][0]["vps"];
        let h = &vps[1]["histograms"][name(vp::MSR_TIME_HISTOGRAM)];
        assert_eq!(h["count"], 100, "{h}");
        assert_eq!(h["sum_ns"], 98 * 600 + 100_000 + (1u64 << 40));
        let buckets: Vec<u64> =
            h["buckets"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap()).collect();
        let mut expected = vec![0u64; hvstats_abi::histogram::BUCKETS];
        expected[10] = 98;
        expected[17] = 1;
        expected[31] = 1;
        assert_eq!(buckets, expected);
        assert_eq!(h["p50_ns"], 1023);
        assert_eq!(h["p99_ns"], 131_071);
        // Every histogram row of the catalog, recorded or not.
        let all = vps[0]["histograms"].as_object().unwrap();
        let rows = counters_of(ObjectKind::Vp)
            .filter(|c| c.presentation == hvstats_abi::catalog::Presentation::Histogram)
            .count();
        assert_eq!(all.len(), rows);
        assert_eq!(all[name(vp::MSR_TIME_HISTOGRAM)]["count"], 0);
        assert_eq!(all[name(vp::MSR_TIME_HISTOGRAM)]["p50_ns"], Value::Null);
        assert_eq!(vps[1]["counters"][common::total(name(vp::DISPATCHES))], 12);
        assert_eq!(vps[1]["counters"][common::total(name(vp::CPU_WAIT_TIME_PER_DISPATCH))], 3_000);
    }

    // The table shows each histogram as the bounds of its p50/p99 (VP 0 recorded nothing).
    let (ok, table) = snapshot(tmp.path(), false);
    assert!(ok);
    assert!(
        table.contains("Hyper-V Hypervisor Virtual Processor (histograms: upper bounds of p50/p99)"),
        "{table}"
    );
    let row = table.lines().find(|l| l.trim_start().starts_with(name(vp::MSR_TIME_HISTOGRAM))).unwrap();
    assert_eq!(row.split_whitespace().rev().take(2).collect::<Vec<_>>(), ["1.0µs/131µs", "-"], "{row}");
    // Over an interval, what was recorded in it: nothing here.
    let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["snapshot", "--interval", "0.1", "--runtime-dir"])
        .arg(tmp.path())
        .output()
        .unwrap();
    let table = String::from_utf8(out.stdout).unwrap();
    let row = table.lines().find(|l| l.trim_start().starts_with(name(vp::MSR_TIME_HISTOGRAM))).unwrap();
    assert_eq!(row.split_whitespace().rev().take(2).collect::<Vec<_>>(), ["-", "-"], "{row}");
}

/// With no instance, `snapshot` says that nothing publishes and how to start a publisher, with
/// status 4 (not 0: nothing was read; not 1: nothing failed), and `--json` an empty document.
#[test]
fn snapshot_with_no_live_instance_says_how_to_start_one_with_a_status_of_its_own() {
    let tmp = TempDir::new("none");
    let run = |json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hvstats"));
        cmd.args(["snapshot", "--runtime-dir"]).arg(tmp.path());
        if json {
            cmd.arg("--json");
        }
        cmd.output().unwrap()
    };
    let dir = tmp.path().display().to_string();
    let said = format!(
        "no observer or partition publishes under {dir}: start the observer (`hvstats observe --all \
         --runtime-dir {dir}` as root) to count the VMs running here, or run a partition (`hvstats run \
         --runtime-dir {dir}`)"
    );
    let out = run(true);
    assert_eq!(out.status.code(), Some(4));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["instances"].as_array().unwrap().len(), 0);
    assert_eq!(String::from_utf8_lossy(&out.stderr), format!("hvstats: {said}\n"));
    let out = run(false);
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{said}\n"));
}

/// On a host where nothing made the runtime directory yet (`/run/hvstats` missing), `snapshot`
/// says the same, with the observer's unit first, and nothing about opening a directory.
#[test]
fn snapshot_with_no_runtime_directory_says_how_to_start_the_observer() {
    let Some(out) = common::hvstats_without_runtime_dir(&["snapshot"]) else { return };
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(4), "{stdout}{stderr}");
    assert!(
        stdout.starts_with(
            "no observer or partition publishes under /run/hvstats: start the observer (`systemctl start \
             hvstats-observe`, or `hvstats observe --all` as root)"
        ),
        "{stdout}"
    );
    assert!(stderr.is_empty(), "{stderr}");
}

/// A user the arena refuses is told which file, whose instance's arena it is, who may read it and
/// how to get access.
#[test]
fn snapshot_by_a_user_the_arena_refuses_says_whose_arena_and_how_to_read_it() {
    let tmp = TempDir::new("refused");
    let hv = publish(tmp.path());
    hv.create_partition(1).unwrap();
    let Some(out) = snapshot_as_nobody(tmp.path()) else { return };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let instance = hv.published_name().unwrap().to_string();
    let arena = tmp.path().join("instances").join(format!("{instance}.arena"));
    let said = format!(
        "hvstats: {} is the arena of instance {instance} (its partitions' and VPs' pages), which only its \
         owner root may read (mode 0600): run this as root (sudo); without root, `hvstats serve \
         --socket-group GROUP` lets that group's members read the same counters through its socket",
        arena.display()
    );
    assert!(stderr.contains(&said), "{stderr}");
}

fn euid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

#[test]
fn snapshot_by_a_non_root_user_reports_global_pages_unreadable_not_zero() {
    let tmp = TempDir::new("nonroot");
    // Partition and VP pages are the owner's unless a group is named: name nobody's group.
    let hv = publish_with(
        tmp.path(),
        InstanceConfig { page_access: hvstats::PageAccess { group: Some(65534) }, ..Default::default() },
    );
    let part = hv.create_partition(1).unwrap();
    part.vp_page(0).unwrap().set(vp::HYPERCALLS, 9);
    let mut cmd = if euid() == 0 {
        // As root every file is readable: drop to nobody to see what other users see.
        if !Path::new("/usr/bin/setpriv").exists() {
            eprintln!("setpriv is missing: cannot run the snapshot as a non-root user; skipping");
            return;
        }
        let mut cmd = Command::new("/usr/bin/setpriv");
        cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", env!("CARGO_BIN_EXE_hvstats")]);
        cmd
    } else {
        Command::new(env!("CARGO_BIN_EXE_hvstats"))
    };
    let out = cmd.args(["snapshot", "--json", "--runtime-dir"]).arg(tmp.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let i = &v["instances"][0];
    assert_eq!(i["hypervisor"]["permission_denied"], true, "{i}");
    assert!(i["hypervisor"].get("counters").is_none());
    // Which LPs exist is itself in the owner-only global file: none is listed, none reads 0.
    assert_eq!(i["lps"].as_array().map(Vec::len), Some(0), "{i}");
    assert_eq!(i["partitions"][0]["vps"][0]["counters"][common::total(name(vp::HYPERCALLS))], 9);
}

#[test]
fn snapshot_shows_descriptions_names_stopped_partitions_and_unknown_counters() {
    let tmp = TempDir::new("states");
    let hv = publish_with(
        tmp.path(),
        InstanceConfig {
            description: hvstats::InstanceDescription { kind: "observer".into(), name: "qemu 4242".into() },
            ..Default::default()
        },
    );
    let part = hv.create_partition_named(1, "web-1").unwrap();
    part.vp_page(0).unwrap().set(vp::CPUID_INSTRUCTIONS, 77);
    part.set_unavailable(&[vp::HYPERCALLS]);
    part.stop("VP 0 faulted: triple fault");

    let (ok, stdout) = snapshot(tmp.path(), true);
    assert!(ok);
    let v: Value = serde_json::from_str(&stdout).unwrap();
    let i = &v["instances"][0];
    assert_eq!(i["kind"], "observer");
    assert_eq!(i["description"], "qemu 4242");
    let p = &i["partitions"][0];
    assert_eq!(p["name"], "web-1");
    assert_eq!(p["state"], "stopped");
    assert_eq!(p["stopped_reason"], "VP 0 faulted: triple fault");
    // The root keeps reading a stopped partition's final values.
    assert_eq!(p["vps"][0]["counters"][common::total(name(vp::CPUID_INSTRUCTIONS))], 77);
    // A counter no source gives is unknown, not 0, and still listed.
    assert!(p["vps"][0]["counters"][common::total(name(vp::HYPERCALLS))].is_null(), "{}", p["vps"][0]);
    assert_eq!(p["vps"][0]["counters"].as_object().unwrap().len(), counters_of(ObjectKind::Vp).count());

    let (ok, table) = snapshot(tmp.path(), false);
    assert!(ok);
    assert!(table.contains("observer: qemu 4242"), "{table}");
    assert!(table.contains("partition 1 \"web-1\" (stopped: VP 0 faulted: triple fault)"), "{table}");
    let row = table.lines().find(|l| l.trim_start().starts_with("Hypercalls (total)")).unwrap();
    assert!(row.trim_end().ends_with('-'), "{row}");
}

#[test]
fn snapshot_json_into_a_closed_pipe_ends_quietly() {
    let tmp = TempDir::new("pipe");
    let hv = publish(tmp.path());
    let _parts: Vec<_> = (0..200).map(|_| hv.create_partition(4).unwrap()).collect();
    let mut child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["snapshot", "--json", "--runtime-dir"])
        .arg(tmp.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Read a little, then close the pipe, as `| head -c 100` does.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 100];
    std::io::Read::read_exact(&mut stdout, &mut first).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn snapshot_json_of_65536_vps_streams_in_bounded_memory() {
    if std::env::var_os("HVSTATS_SKIP_SCALE").is_some_and(|v| v == "1") {
        eprintln!("skipped: HVSTATS_SKIP_SCALE=1");
        return;
    }
    let tmp = TempDir::new("scale");
    let hv = publish(tmp.path());
    let _partitions: Vec<_> = (0..4096).map(|_| hv.create_partition(16).unwrap()).collect();
    let mut child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["snapshot", "--json", "--runtime-dir"])
        .arg(tmp.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    // Count without keeping the document: VP objects, and the last VP's value.
    let (mut bytes, mut vps, mut peak) = (0usize, 0usize, 0u64);
    let mut tail = Vec::new();
    let pid = child.id();
    loop {
        peak = peak.max(rss_anon_kib(pid).unwrap_or(0));
        let buf = std::io::BufRead::fill_buf(&mut stdout).unwrap();
        if buf.is_empty() {
            break;
        }
        let text = [tail.as_slice(), buf].concat();
        vps += text.windows(b"\"index\":".len()).filter(|w| w == b"\"index\":").count();
        let n = buf.len();
        bytes += n;
        // Shorter than the pattern: a match is never counted twice.
        tail = text[text.len().saturating_sub(7)..].to_vec();
        std::io::BufRead::consume(&mut stdout, n);
    }
    assert!(child.wait().unwrap().success());
    // One `"index":` per VP, and one for the instance's LP.
    assert_eq!(vps, 65_536 + 1);
    assert!(bytes > 65_536 * 1000, "{bytes} bytes");
    assert!(peak > 0);
    assert!(peak < 64 * 1024, "snapshot --json of 65,536 VPs held {peak} KiB of heap");
}

/// True when this test may make a PID namespace with its own /proc (root, util-linux unshare).
fn can_unshare_pid_and_proc() -> bool {
    Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn a_reader_in_a_child_pid_namespace_believes_files_of_the_directory_owner_only() {
    if !can_unshare_pid_and_proc() {
        eprintln!("skipped: `unshare --pid --fork --mount-proc` is not available here");
        return;
    }
    let tmp = TempDir::new("pidns-reader");
    let hv = publish(tmp.path());
    let part = hv.create_partition(1).unwrap();
    part.vp_page(0).unwrap().set(vp::CPUID_INSTRUCTIONS, 77);
    // A copy owned by nobody, kept alive by this process: a reader that cannot see this process
    // (its /proc lists no lock of it) believes only files of the runtime directory's owner.
    let copy = hvstats::publish::instances_dir(tmp.path()).join("99-99-99.arena");
    std::fs::copy(hv.published_path().unwrap(), &copy).unwrap();
    let held = std::fs::File::open(&copy).unwrap();
    hvstats::publish::lock(std::os::fd::AsFd::as_fd(&held)).unwrap();
    std::os::unix::fs::chown(&copy, Some(65534), Some(65534)).unwrap();

    let out = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(env!("CARGO_BIN_EXE_hvstats"))
        .args(["snapshot", "--json", "--runtime-dir"])
        .arg(tmp.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("99-99-99.arena")
            && stderr.contains("uid 65534")
            && stderr.contains("directory's owner"),
        "{stderr}"
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let instances = v["instances"].as_array().unwrap();
    assert_eq!(instances.len(), 1, "the host's own instance is still read");
    assert_eq!(instances[0]["pid"], std::process::id());
    let vp0 = &instances[0]["partitions"][0]["vps"][0];
    assert_eq!(vp0["counters"][common::total(name(vp::CPUID_INSTRUCTIONS))], 77, "{vp0}");
    drop(held);
}

/// A 2-VP VM among others, read for one VM and a few counters: only those rows and columns, the
/// values scaled, the JSON exact.
#[test]
fn snapshot_filters_by_vm_and_counter_and_scales_what_it_shows() {
    let tmp = TempDir::new("filters");
    let hv = publish(tmp.path());
    let web = hv.create_partition_named(2, "web-1").unwrap();
    let _db = hv.create_partition_named(2, "db-1").unwrap();
    web.vp_page(1).unwrap().set(vp::CPUID_INSTRUCTIONS, 1_234_567);
    web.vp_page(1).unwrap().set(vp::TOTAL_RUN_TIME, 25_000_000); // 2.5 s in 100 ns
    let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["snapshot", "--vm", "^web", "--counter", "cpuid", "--counter", "Total run", "--runtime-dir"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains("p1 VP 1") && !table.contains("db-1"), "{table}");
    assert!(!table.contains("Hyper-V Hypervisor Logical Processor"), "host-wide objects left out: {table}");
    let rows: Vec<&str> =
        table.lines().filter(|l| l.starts_with("    ") && !l.trim().starts_with('p')).collect();
    assert!(rows.iter().all(|r| r.contains("CPUID") || r.contains("Total run time")), "{table}");
    let cpuid = table.lines().find(|l| l.trim_start().starts_with("CPUID instructions (total)")).unwrap();
    assert!(cpuid.trim_end().ends_with("1.23M"), "{cpuid}");
    let run = table.lines().find(|l| l.trim_start().starts_with("Total run time (total time)")).unwrap();
    assert!(run.trim_end().ends_with("2.5s"), "{run}");
    let out = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["snapshot", "--json", "--vm", "web", "--counter", "CPUID instructions/sec", "--runtime-dir"])
        .arg(tmp.path())
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let parts = v["instances"][0]["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 1, "{v}");
    let counters = parts[0]["vps"][1]["counters"].as_object().unwrap();
    assert_eq!(counters.len(), 1, "{counters:?}");
    // Keyed by what the value is: a total (`--counter` takes the catalog's name or the key).
    assert_eq!(counters["cpuid_instructions_total"], 1_234_567);
}

#[test]
fn snapshot_reads_an_arena_of_1_0_pages_and_shows_the_1_1_counters_as_unknown() {
    let tmp = TempDir::new("v1_0");
    let hv = publish(tmp.path());
    let part = hv.create_partition(2).unwrap();
    write_1_0_vp_page(&hv, &part, 0, &[(vp::CPUID_INSTRUCTIONS, 63), (vp::TOTAL_RUN_TIME, 9)]);
    part.vp_page(1).unwrap().set(vp::DISPATCHES, 5);

    let (ok, stdout) = snapshot(tmp.path(), true);
    assert!(ok, "{stdout}");
    let v: Value = serde_json::from_str(&stdout).unwrap();
    let vps = &v["instances"][0]["partitions"][0]["vps"];
    let old = &vps[0]["counters"];
    assert!(vps[0]["unreadable"].is_null(), "{}", vps[0]);
    assert_eq!(old[common::total(name(vp::CPUID_INSTRUCTIONS))], 63);
    assert_eq!(old[common::total(name(vp::TOTAL_RUN_TIME))], 9);
    assert_eq!(
        old[common::total(name(vp::VIRTUAL_PROCESSOR_HYPERCALLS))],
        0,
        "the last counter of 1.0 is carried"
    );
    // The 1.1 counters, and hvstats' own group, are not on the page: unknown, not 0.
    for c in [vp::DISPATCHES, vp::CPU_WAIT_TIME_PER_DISPATCH, vp::SEQUENCE, vp::IO_TIME_HISTOGRAM] {
        assert!(old[common::total(name(c))].is_null(), "{}: {old}", name(c));
    }
    assert_eq!(old.as_object().unwrap().len(), counters_of(ObjectKind::Vp).count());
    // The 1.1 page beside it reads whole.
    assert_eq!(vps[1]["counters"][common::total(name(vp::DISPATCHES))], 5);

    let (ok, table) = snapshot(tmp.path(), false);
    assert!(ok);
    // One column per VP: the 1.0 page's is "-", the 1.1 page's its value.
    // Without an interval a "/sec" counter is shown as its total.
    let total = |id: hvstats_abi::CounterId| format!("{} (total)", name(id).trim_end_matches("/sec"));
    let row = table.lines().find(|l| l.trim_start().starts_with(&total(vp::DISPATCHES))).unwrap();
    let cells: Vec<&str> = row.split_whitespace().rev().take(2).collect();
    assert_eq!(cells, ["5", "-"], "{row}");
    let row = table.lines().find(|l| l.trim_start().starts_with(&total(vp::CPUID_INSTRUCTIONS))).unwrap();
    assert_eq!(row.split_whitespace().rev().take(2).collect::<Vec<_>>(), ["0", "63"], "{row}");
}

#[test]
fn names_and_reasons_from_publishers_reach_the_terminal_escaped() {
    let tmp = TempDir::new("escaped");
    let hv = publish_with(
        tmp.path(),
        InstanceConfig {
            description: hvstats::InstanceDescription {
                kind: "observer".into(),
                name: "qemu\n\x1b]0;owned\x07".into(),
            },
            ..Default::default()
        },
    );
    let part = hv.create_partition_named(1, "evil\ninstance 1 (pid 1)\x1b[2J").unwrap();
    part.stop("VP 0\nforged line");
    let (ok, table) = snapshot(tmp.path(), false);
    assert!(ok);
    assert!(!table.contains('\x1b') && !table.contains('\x07'), "{table:?}");
    assert!(!table.lines().any(|l| l.starts_with("instance 1 (pid 1)") || l == "forged line)"), "{table}");
    assert!(table.contains(r"observer: qemu\n\u{1b}]0;owned\u{7})"), "{table}");
    assert!(
        table.contains(r#"partition 1 "evil\ninstance 1 (pid 1)\u{1b}[2J" (stopped: VP 0\nforged line)"#),
        "{table}"
    );
}

#[test]
fn why_a_page_is_unreadable_goes_to_standard_error() {
    let tmp = TempDir::new("unreadable-stderr");
    let hv = publish_with(
        tmp.path(),
        InstanceConfig { page_access: hvstats::PageAccess { group: Some(65534) }, ..Default::default() },
    );
    hv.create_partition(1).unwrap();
    let Some(out) = snapshot_as_nobody(tmp.path()) else { return };
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("    hypervisor: unreadable\n"), "{stdout}");
    assert!(!stdout.contains("ermission denied"), "the reason is not table text: {stdout}");
    assert!(stderr.contains("hypervisor: unreadable: ") && stderr.contains("ermission denied"), "{stderr}");
}

#[test]
fn snapshot_shows_what_nothing_collects_as_unknown_and_times_as_times() {
    let tmp = TempDir::new("times");
    let hv = publish_with(
        tmp.path(),
        InstanceConfig {
            description: hvstats::index::InstanceDescription {
                kind: hvstats::index::OBSERVER_KIND.into(),
                name: "observer".into(),
            },
            ..Default::default()
        },
    );
    hv.refresh_lps().unwrap();
    // The observer's last refresh: 2026-11-27T22:49:10.374Z, in 100 ns since 1970.
    hv.page().set(hypervisor::OBSERVER_LAST_REFRESH, 17_958_197_503_740_000);

    let (ok, text) = snapshot(tmp.path(), false);
    assert!(ok);
    let row = |name: &str| text.lines().find(|l| l.trim_start().starts_with(name)).unwrap().to_owned();
    // A moment is a time of day in UTC, not "17958.2T".
    assert!(row("Observer last refresh timestamp").ends_with(" 2026-11-27T22:49:10.374Z"), "{text}");
    // The time since boot is a duration in adapted units, not "20.94G".
    let global = row(hvstats_abi::catalog::lp::GLOBAL_TIME.counter().unwrap().name);
    let cell = global.split_whitespace().last().unwrap();
    assert!(cell.ends_with('s') || cell.ends_with('m') || cell.ends_with('h'), "{global}");
    assert!(!cell.contains('G') && !cell.contains('T'), "{global}");
    // What nothing collects on Linux is unknown, not a measured 0.
    for id in [hvstats_abi::catalog::lp::CONTEXT_SWITCHES, hvstats_abi::catalog::lp::IPIS_SENT] {
        let name = name(id).strip_suffix("/sec").unwrap();
        assert_eq!(row(&format!("{name} (total)")).split_whitespace().last(), Some("-"), "{text}");
    }
    assert_eq!(row(name(hypervisor::MONITORED_NOTIFICATIONS)).split_whitespace().last(), Some("-"));
    let (_, json) = snapshot(tmp.path(), true);
    let v: Value = serde_json::from_str(&json).unwrap();
    let lp = &v["instances"][0]["lps"][0]["counters"];
    let switches = common::total(name(hvstats_abi::catalog::lp::CONTEXT_SWITCHES));
    assert!(lp.as_object().unwrap().get(&switches).is_none_or(Value::is_null), "{lp}");
    assert!(!lp[common::total(name(hvstats_abi::catalog::lp::TIMER_INTERRUPTS))].is_null(), "{lp}");
}

/// `hvstats snapshot` of `dir` run as `nobody`; `None` (skipped, said) without root or setpriv.
fn snapshot_as_nobody(dir: &Path) -> Option<std::process::Output> {
    if euid() != 0 || !Path::new("/usr/bin/setpriv").exists() {
        println!("skipped: needs root and setpriv to read as another user");
        return None;
    }
    let out = Command::new("/usr/bin/setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", env!("CARGO_BIN_EXE_hvstats")])
        .args(["snapshot", "--runtime-dir"])
        .arg(dir)
        .output()
        .unwrap();
    Some(out)
}
