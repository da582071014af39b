//! A reader sampling faster than a publisher refreshes sees rates alternate between 0 and twice
//! the real one. `snapshot --interval` and `record --interval` say so, naming the instance and
//! its period as its header says it (an observer's included), and stay quiet at the cadence.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{KilledOnDrop, TempDir};
use hvstats_testkit::{spawn_qemu, wait_for_kvm_vcpus};

fn hvstats(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hvstats")).args(args).arg("--runtime-dir").arg(dir).output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// An instance refreshed every `period` by a thread of this process (as a publisher's loop
/// does), until dropped.
struct Refreshing {
    stop: Arc<AtomicBool>,
    name: String,
}

impl Refreshing {
    fn start(dir: &Path, period: Duration) -> Self {
        let hv = common::publish(dir);
        hv.create_partition_named(1, "slow").unwrap();
        let name = hv.published_name().unwrap().to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                let _ = hv.refresh_lps();
                std::thread::sleep(period);
            }
        });
        Self { stop, name }
    }
}

impl Drop for Refreshing {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[test]
fn snapshot_and_record_warn_below_a_publishers_refresh_period_and_not_at_it() {
    let tmp = TempDir::new("cadence");
    let publisher = Refreshing::start(tmp.path(), Duration::from_secs(1));
    // Two refreshes make a period: wait until the instance says it.
    let mut attach = hvstats::attach::Attach::new(tmp.path());
    let deadline = Instant::now() + Duration::from_secs(60);
    while attach.refresh().is_err() || attach.instances().all(|i| i.refresh_period().is_none()) {
        assert!(Instant::now() < deadline, "the publisher never refreshed twice");
        std::thread::sleep(Duration::from_millis(50));
    }
    let warning = format!("between refreshes of instance {}", publisher.name);

    let out = hvstats(tmp.path(), &["snapshot", "--interval", "0.5"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stderr(&out);
    // The period is the publisher's 1 s plus what its refresh and a busy host add (1.0 to 1.1 s
    // and more): the message says the one measured.
    assert!(said.contains("--interval 0.5 s is shorter than the 1.") && said.contains(&warning), "{said}");
    assert!(said.contains("use --interval 1.") && said.contains(" or more"), "{said}");
    // At an interval no load brings the period to, nothing is said.
    let out = hvstats(tmp.path(), &["snapshot", "--interval", "2"]);
    assert!(out.status.success() && !stderr(&out).contains("between refreshes"), "{}", stderr(&out));

    let file = tmp.path().join("r.ndjson");
    let out = hvstats(
        tmp.path(),
        &["record", "--interval", "0.5", "--duration", "1.5", "-o", file.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stderr(&out);
    assert_eq!(said.matches(&warning).count(), 1, "said once, not at every sample: {said}");
    let out = hvstats(
        tmp.path(),
        &["record", "--interval", "2", "--duration", "2", "--force", "-o", file.to_str().unwrap()],
    );
    assert!(out.status.success() && !stderr(&out).contains("between refreshes"), "{}", stderr(&out));
}

/// The README's own example over a real observer: `record --interval 0.5` of an observed QEMU VM,
/// which its observer refreshes once a second.
#[test]
fn recording_an_observed_vm_below_its_observers_cadence_is_warned_about() {
    let test = "recording_an_observed_vm_below_its_observers_cadence_is_warned_about";
    if !common::kvm_available(test) {
        return;
    }
    let Some(qemu) = spawn_qemu(
        Command::new("qemu-system-x86_64")
            .args([
                "-accel",
                "kvm",
                "-display",
                "none",
                "-nodefaults",
                "-m",
                "16",
                "-name",
                "guest=cadence-vm",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        test,
    ) else {
        return;
    };
    let qemu = KilledOnDrop(qemu);
    let pid = qemu.0.id().to_string();
    wait_for_kvm_vcpus(qemu.0.id() as i32, 1, Duration::from_secs(30));
    let tmp = TempDir::new("cadence-observed");
    let observer = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["observe", "--interval", "1", "--pid", &pid, "--runtime-dir"])
        .arg(tmp.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _observer = KilledOnDrop(observer);
    let _qemu = qemu;
    // Until the observer has refreshed twice and shows the VM.
    let deadline = Instant::now() + Duration::from_secs(60);
    let file = tmp.path().join("r.ndjson");
    loop {
        let out = hvstats(
            tmp.path(),
            &["record", "--interval", "0.5", "--duration", "1", "--force", "-o", file.to_str().unwrap()],
        );
        let said = stderr(&out);
        let recorded = std::fs::read_to_string(&file).unwrap_or_default();
        if said.contains("shorter than the 1.0 s between refreshes of instance")
            && recorded.contains("cadence-vm")
        {
            break;
        }
        assert!(Instant::now() < deadline, "no warning:\n{said}");
        std::thread::sleep(Duration::from_millis(500));
    }
}
