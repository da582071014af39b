//! `hvstats hwc list/alloc/free` as an operator runs them: statuses by name and value, exit codes,
//! allocations that persist until freed, and `--hold` allocations that die with their process.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use common::TempDir;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;

const PMU: &str = "gp=6,fixed=3,cpus=128";

/// `hvstats hwc <args> --runtime-dir dir`, with `HVSTATS_PMU=pmu` (or unset).
fn hwc(dir: &Path, pmu: Option<&str>, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hvstats"));
    cmd.arg("hwc").args(args).arg("--runtime-dir").arg(dir).env_remove("HVSTATS_RUNTIME_DIR");
    match pmu {
        Some(p) => cmd.env("HVSTATS_PMU", p),
        None => cmd.env_remove("HVSTATS_PMU"),
    };
    cmd
}

fn run(dir: &Path, pmu: Option<&str>, args: &[&str]) -> Output {
    hwc(dir, pmu, args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

fn kernel_has_a_pmu() -> bool {
    ["cpu", "cpu_core", "cpu_atom"]
        .iter()
        .any(|n| Path::new("/sys/bus/event_source/devices").join(n).is_dir())
}

#[test]
fn list_tells_the_truth_about_this_machines_pmu() {
    let dir = TempDir::new("hwc-list");
    let o = run(dir.path(), None, &["list"]);
    assert!(o.status.success());
    let text = stdout(&o);
    let v = json(&run(dir.path(), None, &["list", "--json"]));
    assert_eq!(v["pmu"]["source"], "discovered");
    assert_eq!(v["holders"], Value::Array(vec![]));
    if kernel_has_a_pmu() {
        assert_eq!(v["pmu"]["present"], true);
    } else {
        assert!(text.contains("no PMU: the kernel drives no hardware PMU"), "{text}");
        assert_eq!(v["pmu"]["present"], false);
        assert!(v["pmu"]["absent_reason"].as_str().unwrap().contains("no hardware PMU"));
    }

    let v = json(&run(dir.path(), Some(PMU), &["list", "--json"]));
    assert_eq!(v["pmu"]["processors"], 128);
    assert_eq!(v["pmu"]["cpus"][0]["cpus"], "0-127");
    assert_eq!(v["pmu"]["cpus"][0]["gp"], 6);
    assert_eq!(v["pmu"]["cpus"][0]["fixed"], 3);
    let text = stdout(&run(dir.path(), Some(PMU), &["list"]));
    assert!(text.contains("CPUs 0-127: 6 general-purpose x 48 bits, 3 fixed x 48 bits"), "{text}");

    let o = run(dir.path(), Some("gp=lots"), &["list"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("bad PMU configuration"));
}

#[test]
fn alloc_persists_until_freed_and_statuses_are_printed_by_name_and_value() {
    let dir = TempDir::new("hwc-alloc");
    let d = dir.path();
    let o = run(
        d,
        Some(PMU),
        &["alloc", "--cpus", "0-3", "--counter", "0", "--range", "1-2", "--tag", "7", "--json"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = json(&o);
    assert_eq!(v["status"], "STATUS_SUCCESS");
    assert_eq!(v["code"], "0x00000000");
    let handle = v["handle"].as_u64().unwrap();
    assert_eq!(v["allocation"]["cpus"], "0-3");
    assert_eq!(v["allocation"]["resources"]["counters"], serde_json::json!([0, 1, 2]));
    assert_eq!(v["allocation"]["lifetime"], "until_freed");

    // The allocating process has exited; the allocation has not.
    let v = json(&run(d, Some(PMU), &["list", "--json"]));
    assert_eq!(v["holders"][0]["handle"], handle);
    assert_eq!(v["holders"][0]["process"], "hvstats");
    let o = run(d, Some(PMU), &["alloc", "--group", "0", "--mask", "0x4", "--counter", "1"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stdout(&o).trim(),
        format!(
            "allocation refused: STATUS_INSUFFICIENT_RESOURCES (0xC000009A): counters 1 on CPUs 2 held by \
             handle {handle} (process hvstats pid {}, until freed)",
            v["holders"][0]["pid"]
        )
    );
    // The same counter on processors the first does not hold.
    let o = run(d, Some(PMU), &["alloc", "--group", "1", "--mask", "ff", "--counter", "1"]);
    assert!(o.status.success(), "{}", stdout(&o));
    assert!(stdout(&o).contains("CPUs 64-71: counters 1"), "{}", stdout(&o));

    let o = run(d, Some(PMU), &["free", &handle.to_string()]);
    assert!(o.status.success());
    assert_eq!(stdout(&o).trim(), format!("handle {handle} freed: STATUS_SUCCESS (0x00000000)"));
    let o = run(d, Some(PMU), &["free", &handle.to_string(), "--json"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(json(&o)["status"], "STATUS_INVALID_PARAMETER");
    assert_eq!(json(&o)["code"], "0xC000000D");
}

#[test]
fn bad_requests_and_unsupported_ones_fail() {
    let dir = TempDir::new("hwc-bad");
    let d = dir.path();
    for args in [
        &["alloc", "--range", "3-2"][..],
        &["alloc", "--counter", "9"],
        &["alloc", "--cpus", "128", "--exclusive"],
        &["alloc", "--group", "2", "--mask", "1", "--exclusive"],
        &["alloc", "--group", "0", "--mask", "0", "--exclusive"],
    ] {
        let o = run(d, Some(PMU), args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(stdout(&o).contains("STATUS_INVALID_PARAMETER (0xC000000D)"), "{args:?}: {}", stdout(&o));
    }
    // Flags that cannot make a request at all.
    for args in [
        &["alloc"][..],
        &["alloc", "--group", "0", "--exclusive"],
        &["alloc", "--mask", "zz", "--group", "0", "--exclusive"],
        &["alloc", "--range", "1", "--exclusive"],
    ] {
        let o = run(d, Some(PMU), args);
        assert!(!o.status.success(), "{args:?}");
        assert!(o.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn without_a_pmu_counters_are_refused_and_exclusive_use_is_granted() {
    let dir = TempDir::new("hwc-nopmu");
    let d = dir.path();
    let o = run(d, Some("none,cpus=8"), &["alloc", "--counter", "0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stdout(&o).contains("STATUS_INSUFFICIENT_RESOURCES (0xC000009A): no PMU: configured by HVSTATS_PMU"),
        "{}",
        stdout(&o)
    );
    let o = run(d, Some("none,cpus=8"), &["alloc", "--exclusive", "--cpus", "7", "--json"]);
    assert!(o.status.success());
    assert_eq!(json(&o)["allocation"]["resources"]["exclusive"], true);
}

/// A `--hold` process, killed if a test fails before it ends it.
struct Holder(Option<Child>);

impl Holder {
    fn child(&mut self) -> &mut Child {
        self.0.as_mut().unwrap()
    }

    fn take(&mut self) -> Child {
        self.0.take().unwrap()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn_hold(dir: &Path) -> (Holder, u64) {
    let mut child = hwc(dir, Some(PMU), &["alloc", "--exclusive", "--cpus", "0-1", "--hold"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    let handle =
        line.strip_prefix("handle ").and_then(|r| r.split(':').next()).unwrap_or_else(|| panic!("{line:?}"));
    (Holder(Some(child)), handle.parse().unwrap())
}

#[test]
fn a_held_allocation_dies_with_its_process_even_by_sigkill() {
    let dir = TempDir::new("hwc-sigkill");
    let d = dir.path();
    let (mut holder, handle) = spawn_hold(d);
    let v = json(&run(d, Some(PMU), &["list", "--json"]));
    assert_eq!(v["holders"][0]["handle"], handle);
    assert_eq!(v["holders"][0]["pid"], holder.child().id());
    assert_eq!(v["holders"][0]["lifetime"], "process");
    assert_eq!(run(d, Some(PMU), &["alloc", "--cpus", "1", "--counter", "0"]).status.code(), Some(1));

    let mut child = holder.take();
    child.kill().unwrap();
    child.wait().unwrap();
    let v = json(&run(d, Some(PMU), &["list", "--json"]));
    assert_eq!(v["holders"], Value::Array(vec![]), "the killed holder is shown as free");
    let o = run(d, Some(PMU), &["alloc", "--cpus", "1", "--counter", "0"]);
    assert!(o.status.success(), "{}", stdout(&o));
}

#[test]
fn a_held_allocation_is_freed_on_sigterm() {
    let dir = TempDir::new("hwc-sigterm");
    let d = dir.path();
    let (mut holder, handle) = spawn_hold(d);
    let killed = Command::new("kill").args(["-TERM", &holder.child().id().to_string()]).status().unwrap();
    assert!(killed.success());
    let child = holder.take();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "a clean exit after freeing");
    assert!(
        stdout(&out).contains(&format!("signal SIGTERM: freed handle {handle}: STATUS_SUCCESS")),
        "{}",
        stdout(&out)
    );
    let v = json(&run(d, Some(PMU), &["list", "--json"]));
    assert_eq!(v["holders"], Value::Array(vec![]));
}

/// The attack on a runtime directory another user can write: `nobody` owns it, root allocates a
/// tag, `nobody` moves `hwc/` aside, root allocates the same tag again. The tag must never be
/// granted twice: the directory is refused as instances' directories are, before anything is
/// granted.
#[test]
fn a_runtime_dir_another_user_can_write_is_refused_so_nothing_is_granted_twice() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: needs root (the test hands the directory to nobody)");
        return;
    }
    let tmp = TempDir::new("hwc-nobody");
    let d = tmp.path().join("rt");
    std::fs::create_dir(&d).unwrap();
    std::os::unix::fs::chown(&d, Some(65534), Some(65534)).unwrap();
    let alloc = || {
        let o = run(&d, Some(PMU), &["alloc", "--cpus", "0", "--tag", "5", "--json"]);
        let granted = o.status.success().then(|| json(&o)["handle"].as_u64().unwrap());
        (granted, String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let (first, why) = alloc();
    if first.is_some() {
        // What nobody does to a table it can reach: move it aside.
        let o = Command::new("mv").arg(d.join("hwc")).arg(d.join("aside")).uid(65534).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let (second, _) = alloc();
    assert!(first.is_none() || second.is_none(), "tag 5 granted twice: handles {first:?} and {second:?}");
    assert!(first.is_none(), "a runtime directory owned by nobody was used");
    assert!(why.contains("belongs to uid 65534") && why.contains(d.to_str().unwrap()), "{why}");
    assert!(!d.join("hwc").exists(), "nothing is created in a refused directory");

    // Root's, but writable by everyone (even sticky): refused the same way.
    std::os::unix::fs::chown(&d, Some(0), Some(0)).unwrap();
    for mode in [0o777, 0o1777, 0o775] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
        let (granted, why) = alloc();
        assert_eq!(granted, None, "mode {mode:o}");
        assert!(why.contains("writable by group or others"), "{why}");
        let o = run(&d, Some(PMU), &["list"]);
        assert_eq!(o.status.code(), Some(1));
    }
    // Made safe, it works, and the same tag is then refused while held.
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (granted, why) = alloc();
    assert_eq!(granted, Some(1), "{why}");
    assert_eq!(alloc().0, None, "tag 5 is held");
}

#[test]
fn a_holder_name_with_control_characters_is_listed_escaped() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = TempDir::new("hwc-name");
    let d = tmp.path();
    // A table as another process left it: its holder's name is what that process called itself.
    let o = run(d, Some(PMU), &["alloc", "--cpus", "0", "--counter", "0"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = d.join("hwc").join("table.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&table).unwrap()).unwrap();
    v["records"][0]["holder"]["name"] = "evil\nHANDLE forged\u{1b}[2J".into();
    std::fs::write(&table, serde_json::to_vec(&v).unwrap()).unwrap();
    std::fs::set_permissions(&table, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = run(d, Some(PMU), &["list"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = stdout(&o);
    assert!(!text.contains('\u{1b}') && !text.lines().any(|l| l.starts_with("HANDLE forged")), "{text:?}");
    assert!(text.contains(r"evil\nHANDLE forged\u{1b}[2J"), "{text}");
    // JSON keeps it exact.
    assert_eq!(
        json(&run(d, Some(PMU), &["list", "--json"]))["holders"][0]["process"],
        "evil\nHANDLE forged\u{1b}[2J"
    );
}
