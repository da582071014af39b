//! What observing costs the observed guest: its exit rate with and without the observer, side by
//! side on the same QEMU.
//!
//! A paused QEMU (`-accel kvm`) runs a guest that does `out 0x80` forever (every one a userspace
//! exit). Rounds alternate between observed (an [`Observer`] attached, refreshing as
//! `hvstats observe` does) and not observed; each round's rate is KVM's `io_exits` of the vCPU
//! (read through a QMP socket of its own, which costs the guest nothing) over the round's length.
//! The result is the ratio of the medians; the goal is at least 0.98.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hvstats::Hypervisor;

use super::bios::{BiosEnd, BiosProgram};
use super::discovery::Procfs;
use super::observer::{Observer, Targets};
use super::qmp::Qmp;
use super::vm::ObserveOptions;

/// The measured exit rates, in exits per second.
#[derive(Clone, Debug)]
pub struct ExitRates {
    /// Each observed round.
    pub observed: Vec<f64>,
    /// Each unobserved round.
    pub unobserved: Vec<f64>,
}

impl ExitRates {
    /// The median of each: (observed, unobserved).
    pub fn medians(&self) -> (f64, f64) {
        (median(&self.observed), median(&self.unobserved))
    }

    /// Observed median over unobserved median (goal ≥ 0.98).
    pub fn ratio(&self) -> f64 {
        let (on, off) = self.medians();
        if off > 0.0 { on / off } else { 0.0 }
    }
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// An error measuring the overhead.
#[derive(Debug, thiserror::Error)]
pub enum OverheadError {
    /// QEMU could not be started or did not come up.
    #[error("cannot run QEMU for the measurement: {0}")]
    Qemu(String),
    /// QMP failed.
    #[error("QMP failed during the measurement")]
    Qmp(#[from] super::qmp::QmpError),
    /// KVM's statistics are not available through QMP (not a KVM QEMU).
    #[error("QEMU reports no KVM io_exits: the measurement needs -accel kvm")]
    NoStats,
    /// The observer's instance could not be created.
    #[error("cannot create the observer's instance")]
    Instance(#[source] std::io::Error),
}

struct QemuChild {
    child: Child,
    dir: PathBuf,
}

impl Drop for QemuChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Measures `rounds` observed and `rounds` unobserved windows of `window` each, with the
/// observer refreshing every `interval`.
///
/// # Errors
/// When QEMU with KVM cannot be run or QMP fails.
pub fn guest_exit_rate_on_vs_off(
    rounds: u32,
    window: Duration,
    interval: Duration,
) -> Result<ExitRates, OverheadError> {
    let dir = std::env::temp_dir().join(format!("hvstats-observe-overhead-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| OverheadError::Qemu(e.to_string()))?;
    let image = BiosProgram { cpuid: 0, out: 0, in_: 0, end: BiosEnd::OutForever }
        .image()
        .map_err(|e| OverheadError::Qemu(e.to_string()))?;
    let bios = dir.join("bios.bin");
    std::fs::write(&bios, image).map_err(|e| OverheadError::Qemu(e.to_string()))?;
    let (ctl, obs) = (dir.join("ctl.sock"), dir.join("obs.sock"));
    let child = Command::new("qemu-system-x86_64")
        .args(["-accel", "kvm", "-S", "-display", "none", "-nodefaults", "-m", "16"])
        .args(["-name", "guest=overhead,debug-threads=on", "-bios"])
        .arg(&bios)
        .arg("-qmp")
        .arg(format!("unix:{},server=on,wait=off", ctl.display()))
        .arg("-qmp")
        .arg(format!("unix:{},server=on,wait=off", obs.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| OverheadError::Qemu(format!("qemu-system-x86_64: {e}")))?;
    let qemu = QemuChild { child, dir };
    let t = Instant::now();
    while !(ctl.exists() && obs.exists()) {
        if t.elapsed() > Duration::from_secs(20) {
            return Err(OverheadError::Qemu("no QMP socket after 20 s".into()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut control = Qmp::connect(&ctl, Duration::from_secs(5))?;
    control.cont()?;
    let io_exits = |q: &mut Qmp| -> Result<u64, OverheadError> {
        let stats = q.query_kvm_stats()?.ok_or(OverheadError::NoStats)?;
        Ok(stats.vcpus.values().filter_map(|s| s.get("io_exits")).sum())
    };
    let pid = qemu.child.id() as i32;
    let mut rates = ExitRates { observed: Vec::new(), unobserved: Vec::new() };
    let hv = Hypervisor::new().map_err(OverheadError::Instance)?;
    for round in 0..rounds * 2 {
        let observed = (round % 2 == 0) == (round / 2 % 2 == 0);
        let mut observer = observed.then(|| {
            Observer::new(
                Arc::clone(&hv),
                Procfs::host(),
                Targets::Pids(vec![pid]),
                ObserveOptions { qmp: Some(obs.clone()) },
            )
        });
        if let Some(o) = observer.as_mut() {
            o.tick();
        }
        let before = io_exits(&mut control)?;
        let start = Instant::now();
        while start.elapsed() < window {
            std::thread::sleep(interval.min(window.saturating_sub(start.elapsed())));
            if let Some(o) = observer.as_mut() {
                o.tick();
            }
        }
        let after = io_exits(&mut control)?;
        let rate = after.saturating_sub(before) as f64 / start.elapsed().as_secs_f64();
        if observed { rates.observed.push(rate) } else { rates.unobserved.push(rate) }
    }
    drop(qemu);
    Ok(rates)
}

/// The `bench --json` row name.
pub const BENCH_ROW: &str = "observe-guest-exit-rate-on-vs-off";

/// The `bench --json` row: the observed guest's exit rate with the observer (`ours`) and without
/// (`baseline`), and their ratio (goal ≥ 0.98).
///
/// # Errors
/// As [`guest_exit_rate_on_vs_off`].
pub fn bench_row(rounds: u32, window: Duration) -> Result<serde_json::Value, OverheadError> {
    let rates = guest_exit_rate_on_vs_off(rounds, window, Duration::from_secs(1))?;
    let (on, off) = rates.medians();
    Ok(serde_json::json!({
        "name": BENCH_ROW,
        "ours": on,
        "baseline": off,
        "unit": "exits/s",
        "ratio": rates.ratio(),
        "goal": ">= 0.98",
        "rounds": rounds,
        "window_s": window.as_secs_f64(),
    }))
}
