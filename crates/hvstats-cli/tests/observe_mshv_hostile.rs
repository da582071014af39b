//! `hvstats observe --mshv DIR` over a tree another user controls: whatever `nobody` puts there —
//! files of made-up names, links into the rest of the system, a directory posing as `self`,
//! thousands of junk entries — the observer run by root stays bounded and says so, follows no
//! link below the root, publishes `self` as itself, and reads the real partitions and VPs.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{KilledOnDrop, TempDir};
use hvstats_abi::ObjectKind;
use hvstats_mshv::dialect::Dialect;
use serde_json::Value;

/// The attacker: `nobody` where the tests run as root (as on the hosts the attacks were run on),
/// else the test's own user.
fn attacker() -> Option<u32> {
    // SAFETY: geteuid has no preconditions.
    (unsafe { libc::geteuid() } == 0).then_some(65534)
}

/// Runs `program args` as the attacker in `dir`.
fn as_attacker(program: &str, args: &[String], dir: &Path) {
    let mut command = Command::new(program);
    command.args(args).current_dir(dir);
    if let Some(uid) = attacker() {
        command.uid(uid).gid(uid);
    }
    let out = command.output().unwrap();
    assert!(out.status.success(), "{program} as the attacker: {}", String::from_utf8_lossy(&out.stderr));
}

/// A directory the attacker owns (and may write into).
fn attackers_dir(path: &Path) {
    std::fs::create_dir_all(path).unwrap();
    if let Some(uid) = attacker() {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::chown(c.as_ptr(), uid, uid) }, 0);
    }
}

/// A `stats` file of `kind` at `dir`, as mainline prints it, readable by anyone (so the attacker
/// can copy it).
fn stats(dir: &Path, kind: ObjectKind, counters: &[(&str, u64)]) {
    std::fs::create_dir_all(dir).unwrap();
    let text: String = counters.iter().map(|(n, v)| Dialect::Mainline.line(kind, n, *v)).collect();
    std::fs::write(dir.join("stats"), text).unwrap();
}

/// `hvstats observe --mshv tree` publishing into `runtime`, its log kept.
fn observe(tree: &Path, runtime: &Path) -> KilledOnDrop {
    let child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["observe", "--interval", "0.05", "--runtime-dir"])
        .arg(runtime)
        .arg("--mshv")
        .arg(tree)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    KilledOnDrop(child)
}

/// The observer's log, once SIGTERM has stopped it (it logs the refresh under way first).
fn log_of(observer: KilledOnDrop) -> String {
    let mut observer = observer;
    let stderr = observer.0.stderr.take().unwrap();
    // SAFETY: plain kill of the child we started and have not reaped.
    unsafe { libc::kill(observer.0.id() as i32, libc::SIGTERM) };
    let status = observer.0.wait().unwrap();
    assert!(status.success(), "observe ended with {status}");
    std::io::read_to_string(stderr).unwrap()
}

/// Polls `snapshot --json` until `done` holds for the mshv instance (or 60 s pass).
fn wait_for(runtime: &Path, done: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let doc = common::snapshot_json(runtime);
        let found = doc["instances"].as_array().and_then(|a| a.iter().find(|i| i["kind"] == "mshv"));
        if let Some(i) = found.filter(|i| done(i)) {
            return i.clone();
        }
        assert!(start.elapsed() < Duration::from_secs(60), "never: {doc}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn partitions(instance: &Value) -> Vec<&Value> {
    instance["partitions"].as_array().unwrap().iter().collect()
}

struct Setup {
    _tmp: TempDir,
    tree: PathBuf,
    runtime: PathBuf,
}

/// A temporary directory (searchable by the attacker) with `tree` and `runtime`.
fn setup(name: &str) -> Setup {
    in_dir(TempDir::new(name))
}

/// [`setup`] in memory where the host has a tmpfs at `/dev/shm`: thousands of directories are
/// made and removed there in a blink, where a busy disk takes seconds.
fn setup_in_memory(name: &str) -> Setup {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        return setup(name);
    }
    let dir = shm.join(format!("hvstats-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    in_dir(TempDir(dir))
}

fn in_dir(tmp: TempDir) -> Setup {
    let tree = tmp.path().join("tree");
    let runtime = tmp.path().join("run");
    std::fs::create_dir_all(&runtime).unwrap();
    Setup { _tmp: tmp, tree, runtime }
}

#[test]
fn made_up_names_values_and_series_are_bounded_and_said_so() {
    let s = setup("mshv-hostile-names");
    // The attacker's tree: 300 VPs, each printing 64 made-up names they share and 36 of their
    // own — 30,000 values of 10,864 names no kernel prints.
    let staging = s.tree.with_file_name("staging");
    stats(&staging.join("partition/1"), ObjectKind::Partition, &[("PtGpaPages", 1)]);
    for v in 0..300u64 {
        let shared = (0..64).map(|i| (format!("VpShared{i}"), i));
        let own = (0..36).map(|i| (format!("VpOwn{v}x{i}"), i));
        let counters: Vec<(String, u64)> = shared.chain(own).collect();
        let counters: Vec<(&str, u64)> = counters.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        stats(&staging.join(format!("partition/1/vp/{v}")), ObjectKind::Vp, &counters);
    }
    attackers_dir(&s.tree);
    as_attacker("cp", &["-r".into(), format!("{}/.", staging.display()), ".".into()], &s.tree);

    let observer = observe(&s.tree, &s.runtime);
    let i = wait_for(&s.runtime, |i| {
        partitions(i).len() == 1
            && partitions(i)[0]["vps"].as_array().is_some_and(|v| v.len() == 300)
            && partitions(i)[0]["vps"][0]["unmapped"].is_object()
    });
    // At most 64 distinct names, and 16,384 values in all: the first 256 VPs keep their 64
    // shared names' values, the rest none.
    let vps = partitions(&i)[0]["vps"].as_array().unwrap().clone();
    let mut names = std::collections::BTreeSet::new();
    let mut values = 0;
    for vp in &vps {
        let unmapped = vp["unmapped"].as_object();
        let kept = unmapped.map_or(0, |u| u.len());
        let index = vp["index"].as_u64().unwrap();
        assert_eq!(kept, if index < 256 { 64 } else { 0 }, "VP {index}");
        values += kept;
        names.extend(unmapped.into_iter().flat_map(|u| u.keys().cloned()));
    }
    assert_eq!(values, 16_384);
    assert_eq!(names.len(), 64);
    assert!(names.iter().all(|n| n.starts_with("VpShared")), "{names:?}");

    // /metrics: every value kept is one series while the VPs fit --max-vps; past it, none, and
    // the values left out are counted.
    let scrape = |max_vps: &str| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--collector.mshv",
                "--max-vps",
                max_vps,
                "--runtime-dir",
            ])
            .arg(&s.runtime)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let addr = common::serving_addr(&mut child);
        let _serve = KilledOnDrop(child);
        common::http_get(addr, "/metrics")
    };
    let count = |text: &str, prefix: &str| text.lines().filter(|l| l.starts_with(prefix)).count();
    let omitted = |text: &str| -> u64 {
        let line = text.lines().find(|l| l.starts_with("hvstats_mshv_values_omitted{")).unwrap();
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let all = scrape("1000");
    assert_eq!(count(&all, "hvstats_mshv_value{"), 16_384);
    assert_eq!(omitted(&all), 0);
    let capped = scrape("100");
    assert_eq!(count(&capped, "hvstats_mshv_value{"), 0);
    assert_eq!(omitted(&capped), 16_384);

    let log = log_of(observer);
    let said =
        "names no known kernel prints: only the first 64 of them, and 16384 of their values in all, are kept";
    assert_eq!(log.matches(said).count(), 1, "said once: {log}");
    assert_eq!(log.matches("has no catalog counter").count(), 64, "{log}");
}

#[test]
fn no_link_under_the_root_is_followed_into_the_rest_of_the_system() {
    let s = setup("mshv-hostile-links");
    // Root's own files elsewhere (the rest of debugfs, say), which the attacker cannot read.
    let secret = s.tree.with_file_name("secret");
    stats(&secret.join("lp"), ObjectKind::LogicalProcessor, &[("LpGlobalTime", 666_666)]);
    stats(&secret.join("partition"), ObjectKind::Partition, &[("PtGpaPages", 666_666)]);
    stats(&secret.join("vp"), ObjectKind::Vp, &[("VpTotalRunTime", 666_666)]);
    let c = std::ffi::CString::new(secret.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::chmod(c.as_ptr(), 0o700) }, 0);
    // The attacker's tree: a real partition, and links where an LP, a partition and a VP belong.
    let staging = s.tree.with_file_name("staging");
    stats(&staging.join("partition/7"), ObjectKind::Partition, &[("PtGpaPages", 7)]);
    std::fs::create_dir_all(staging.join("partition/7/vp")).unwrap();
    std::fs::create_dir_all(staging.join("lp")).unwrap();
    attackers_dir(&s.tree);
    as_attacker("cp", &["-r".into(), format!("{}/.", staging.display()), ".".into()], &s.tree);
    let link = |target: &str, at: &str| {
        let args = ["-s".to_owned(), secret.join(target).display().to_string(), at.to_owned()];
        as_attacker("ln", &args, &s.tree);
    };
    link("lp", "lp/0");
    link("partition", "partition/8");
    link("vp", "partition/7/vp/0");

    let observer = observe(&s.tree, &s.runtime);
    let i = wait_for(&s.runtime, |i| {
        partitions(i).len() == 1 && partitions(i)[0]["counters"][common::total("GPA pages")] == 7
    });
    assert!(!i.to_string().contains("666666"), "a linked file was read: {i}");
    assert_eq!(i["lps"].as_array().unwrap().len(), 0);
    assert_eq!(partitions(&i)[0]["id"], 7);
    assert_eq!(partitions(&i)[0]["counters"][common::total("GPA pages")], 7);
    assert_eq!(partitions(&i)[0]["vps"].as_array().unwrap().len(), 0);
    let log = log_of(observer);
    for at in ["lp/0", "partition/8", "partition/7/vp/0"] {
        assert!(log.contains(&format!("{at}: a link: not followed")), "{at}: {log}");
    }
}

#[test]
fn a_numbered_directory_cannot_stand_in_for_self() {
    let s = setup("mshv-hostile-self");
    // The kernel's L1VH tree…
    stats(&s.tree.join("partition/self"), ObjectKind::Partition, &[("PtGpaPages", 1)]);
    stats(&s.tree.join("partition/self/vp/0"), ObjectKind::Vp, &[("VpTotalRunTime", 1)]);
    // …and the attacker's partition of the id the kernel names `self`.
    let staging = s.tree.with_file_name("staging");
    stats(&staging.join("18446744073709551615"), ObjectKind::Partition, &[("PtGpaPages", 666_666)]);
    attackers_dir(&s.tree.join("partition"));
    as_attacker(
        "cp",
        &["-r".into(), format!("{}/.", staging.display()), ".".into()],
        &s.tree.join("partition"),
    );

    let observer = observe(&s.tree, &s.runtime);
    let i = wait_for(&s.runtime, |i| {
        partitions(i).len() == 1 && partitions(i)[0]["counters"][common::total("GPA pages")].is_u64()
    });
    assert_eq!(partitions(&i)[0]["name"], "mshv:self", "{i}");
    let i = wait_for(&s.runtime, |i| {
        partitions(i)[0]["vps"][0]["counters"][common::total("Total run time")] == 1
    });
    let own = partitions(&i)[0];
    assert_eq!(own["id"], u64::MAX);
    assert_eq!(own["counters"][common::total("GPA pages")], 1);
    assert_eq!(own["vps"][0]["counters"][common::total("Total run time")], 1);
    let log = log_of(observer);
    let refused = "partition/18446744073709551615: the id of `self`, beside `self`: refused";
    assert!(log.contains(refused), "{log}");
    assert!(!log.contains("cannot publish partition"), "{log}");
}

#[test]
fn junk_entries_take_no_place_from_real_partitions_and_vps() {
    let s = setup_in_memory("mshv-hostile-junk");
    // The kernel's partitions…
    stats(&s.tree.join("partition/self"), ObjectKind::Partition, &[("PtGpaPages", 1)]);
    stats(&s.tree.join("partition/7"), ObjectKind::Partition, &[("PtGpaPages", 7)]);
    stats(&s.tree.join("partition/7/vp/3"), ObjectKind::Vp, &[("VpTotalRunTime", 3)]);
    // …and thousands of entries of names the kernel does not make, sorting before theirs, in
    // directories the attacker may write into.
    attackers_dir(&s.tree.join("partition"));
    attackers_dir(&s.tree.join("partition/7/vp"));
    let junk: Vec<String> = (0..4200).map(|n| format!("0{n}")).collect();
    as_attacker("mkdir", &junk, &s.tree.join("partition"));
    as_attacker("mkdir", &junk, &s.tree.join("partition/7/vp"));

    let observer = observe(&s.tree, &s.runtime);
    let i = wait_for(&s.runtime, |i| partitions(i).len() == 2);
    let mut names: Vec<&str> = partitions(&i).iter().map(|p| p["name"].as_str().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(names, ["mshv:7", "mshv:self"]);
    let seven = partitions(&i).into_iter().find(|p| p["id"] == 7).unwrap();
    assert_eq!(seven["vps"].as_array().unwrap().len(), 1);
    assert_eq!(seven["vps"][0]["index"], 3);
    assert_eq!(seven["vps"][0]["counters"][common::total("Total run time")], 3);
    // The junk is said, a few by name and the rest counted: a bounded log.
    let log = log_of(observer);
    assert!(log.contains("4196 more entries skipped: not what the kernel makes here"), "{log}");
    assert!(log.lines().count() < 40, "{log}");
}
