//! What observing a fleet costs, on real QEMUs with KVM.
//!
//! - [`FLEET_ROW`]: the CPU time one refresh of `observe --all` takes (the observer's thread:
//!   every VM's QMP questions, events, thread files and pages, and the instance's LP pages) with
//!   64 QEMUs on the host, each with a QMP socket on its command line that the observer finds and
//!   uses, against the refresh interval of one second: the ratio is the share of one CPU the
//!   observer takes at a 1 s refresh (goal: at most 1 %). The QEMUs are paused (`-S`), so 64 of
//!   them fit a small host; the observer does the same work for a running VM (it asks every VM the
//!   same questions and reads the same counters), and what counting costs a running guest is the
//!   guest rows' measure.
//! - [`QMP_INTERRUPTION_ROW`]: before QEMU 8.1, every `query-stats` of the vCPUs runs on each
//!   vCPU's thread, kicking it out of the guest once (KVM's `signal_exits`): the kicks per vCPU per
//!   refresh the observer's QMP session costs a running guest, against one bare `query-stats` of
//!   the vCPUs per refresh (the least any reader of KVM's vCPU statistics through QMP pays). A
//!   QEMU that reads its vCPUs' statistics without kicking them (8.1 and later keep the
//!   descriptors open) has nothing to measure: the row says so.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hvstats::Hypervisor;
use hvstats_observe::filter::{VmFilter, VmPattern};
use hvstats_observe::{ObserveOptions, Observer, Procfs, Targets, raise_fd_limit};
use hvstats_testkit::kvm_vcpus;
use hvstats_vmm::qmp::{Qmp, add_stats, stats_request};

use crate::row::{CpuClock, Pace, Plan, Rounds, Row};

/// The row of the observer's CPU per refresh with 64 VMs.
pub const FLEET_ROW: &str = "observe-all-64-vms-cpu-per-1s-refresh";

/// The row of the vCPU kicks per refresh of the observer's QMP session.
pub const QMP_INTERRUPTION_ROW: &str = "observe-qmp-vcpu-kicks-per-refresh-vs-one-query";

/// Both rows.
pub const ROWS: [&str; 2] = [FLEET_ROW, QMP_INTERRUPTION_ROW];

/// VMs of [`FLEET_ROW`].
const FLEET_VMS: usize = 64;

/// The refresh interval both rows observe at.
const INTERVAL: Duration = Duration::from_secs(1);

/// The QMP deadline of the bench's own questions.
const QMP_TIMEOUT: Duration = Duration::from_secs(5);

/// The rows `wanted` selects, measured over the plan's rounds (refreshes of the fleet; windows
/// of the interruption count); `kvm` says whether this host can run a guest, and if not why.
pub fn observe_fleet_rows(
    plan: &Plan<'_>,
    kvm: &Result<(), String>,
    wanted: &dyn Fn(&str) -> bool,
) -> Vec<Row> {
    let skipped = |name, why: String| Row::Skipped { name, why };
    let mut rows = Vec::new();
    if wanted(FLEET_ROW) {
        rows.push(match kvm.clone().and_then(|()| fleet_cpu(plan)) {
            Ok(rounds) => Row::measured(FLEET_ROW, rounds, "s/refresh", Some(0.01)),
            Err(why) => skipped(FLEET_ROW, why),
        });
    }
    if wanted(QMP_INTERRUPTION_ROW) {
        rows.push(match kvm.clone().and_then(|()| qmp_kicks(plan)) {
            Ok(rounds) if crate::row::Spread::of(&rounds.baseline).median < 0.5 => skipped(
                QMP_INTERRUPTION_ROW,
                "this QEMU reads its vCPUs' statistics without interrupting them (8.1 or later)".into(),
            ),
            Ok(rounds) => Row::measured(QMP_INTERRUPTION_ROW, rounds, "kicks/vCPU", Some(1.1)),
            Err(why) => skipped(QMP_INTERRUPTION_ROW, why),
        });
    }
    rows
}

/// QEMUs of the bench, killed (and their directory removed) on drop.
struct Qemus {
    children: Vec<Child>,
    dir: PathBuf,
}

impl Drop for Qemus {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
        }
        for child in &mut self.children {
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Qemus {
    fn new(tag: &str) -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("hvstats-bench-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(Self { children: Vec::new(), dir })
    }

    /// Starts a QEMU with KVM named `name` with a QMP socket per name of `sockets` (in that
    /// order on its command line) and `extra` arguments; returns its pid once its sockets and
    /// vCPUs are there.
    fn start(&mut self, name: &str, sockets: &[&str], extra: &[&str]) -> Result<i32, String> {
        let mut command = Command::new("qemu-system-x86_64");
        command.args(["-accel", "kvm", "-display", "none", "-nodefaults", "-m", "16"]);
        command.args(["-name", &format!("guest={name},debug-threads=on")]).args(extra);
        for socket in sockets {
            command.arg("-qmp").arg(format!("unix:{},server=on,wait=off", self.socket(socket).display()));
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("qemu-system-x86_64: {e}"))?;
        let pid = child.id() as i32;
        self.children.push(child);
        let t = Instant::now();
        while !sockets.iter().all(|s| self.socket(s).exists()) || kvm_vcpus(pid) == 0 {
            if t.elapsed() > Duration::from_secs(30) {
                return Err(format!("QEMU {name} made no QMP socket or vCPU in 30 s"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(pid)
    }

    fn socket(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.sock"))
    }
}

/// An observer of `pids` alone (other VMs on the host are not the bench's), finding each one's
/// QMP socket on its command line (`qmp`: `None`) or given it.
fn observer(pids: &[i32], qmp: Option<&Path>) -> Result<Observer, String> {
    let hv = Hypervisor::new().map_err(|e| format!("cannot create the observer's instance: {e}"))?;
    let filter = VmFilter { include: pids.iter().map(|p| VmPattern::Pid(*p)).collect(), exclude: Vec::new() };
    let (targets, qmp_auto) = match qmp {
        Some(_) => (Targets::Pids(pids.to_vec()), false),
        None => (Targets::All, true),
    };
    let options = ObserveOptions { qmp: qmp.map(Path::to_owned), qmp_auto, filter, ..Default::default() };
    Ok(Observer::new(Arc::clone(&hv), Procfs::host(), targets, options))
}

/// Ticks `observer` every 50 ms until `vms` VMs are attached with their QMP session answering
/// (at most a minute).
fn settle(observer: &mut Observer, vms: usize) -> Result<(), String> {
    let t = Instant::now();
    loop {
        observer.tick();
        let known = observer.vms().all(|vm| vm.vcpu_threads().iter().all(Option::is_some));
        if observer.vms().count() == vms && observer.qmp_sessions_up() == vms && known {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(60) {
            return Err(format!(
                "after a minute {} of {vms} VMs are observed and {} QMP sessions answer",
                observer.vms().count(),
                observer.qmp_sessions_up()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The CPU time of each refresh of an `--all` observer of 64 paused QEMUs (ours) against the
/// interval (the baseline), over the plan's rounds of refreshes one interval apart.
fn fleet_cpu(plan: &Plan<'_>) -> Result<Rounds, String> {
    let _ = raise_fd_limit();
    let mut qemus = Qemus::new("fleet")?;
    let mut pids = Vec::with_capacity(FLEET_VMS);
    for i in 0..FLEET_VMS {
        pids.push(qemus.start(&format!("fleet-{i}"), &[&format!("vm{i}")], &["-S"])?);
    }
    let mut observer = observer(&pids, None)?;
    settle(&mut observer, FLEET_VMS)?;
    let lps = Hypervisor::new().map_err(|e| format!("cannot create an instance: {e}"))?;
    let mut rounds = Rounds::default();
    let mut next = Instant::now();
    for _ in 0..plan.start(&[FLEET_ROW], Pace::Slow).max(2) {
        next += INTERVAL;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        let cpu = CpuClock::now();
        // What the observer's loop does each interval.
        let _ = lps.refresh_lps();
        observer.tick();
        rounds.ours.push(cpu.elapsed().as_secs_f64());
        rounds.baseline.push(INTERVAL.as_secs_f64());
        if observer.qmp_sessions_up() != FLEET_VMS {
            return Err(format!("{} of {FLEET_VMS} QMP sessions answer", observer.qmp_sessions_up()));
        }
        plan.tick();
    }
    drop(observer);
    drop(qemus);
    Ok(rounds)
}

/// KVM's `signal_exits` of every vCPU of the QEMU `control` speaks to, summed.
fn signal_exits(control: &mut Qmp) -> Result<(u64, usize), String> {
    let reply = control
        .execute("query-stats", Some(stats_request("vcpu", &["signal_exits"])))
        .map_err(|e| hvstats_host::error_chain::error_chain(&e))?;
    let mut stats = Default::default();
    add_stats(&mut stats, "vcpu", &reply);
    let per_vcpu: Vec<u64> = stats.vcpus.values().filter_map(|s| s.get("signal_exits").copied()).collect();
    match per_vcpu.is_empty() {
        true => Err("QEMU reports no signal_exits statistic: the row needs -accel kvm".into()),
        false => Ok((per_vcpu.iter().sum(), per_vcpu.len())),
    }
}

/// The vCPU kicks per vCPU per refresh of an observer's QMP session (ours), and of one bare
/// `query-stats` of the vCPUs per refresh (the baseline): one window of each per round, in ABBA
/// order, on a running QEMU (SeaBIOS with no disk: its vCPU halts on a timer, in KVM), with one
/// QMP socket for the observer and one for the count.
fn qmp_kicks(plan: &Plan<'_>) -> Result<Rounds, String> {
    const REFRESHES: u32 = 5;
    const EVERY: Duration = Duration::from_millis(200);
    let mut qemus = Qemus::new("qmp-kicks")?;
    let pid = qemus.start("kicks", &["obs", "ctl"], &[])?;
    let mut control = Qmp::connect(&qemus.socket("ctl"), QMP_TIMEOUT).map_err(|e| e.to_string())?;
    let mut observer = observer(&[pid], Some(&qemus.socket("obs")))?;
    settle(&mut observer, 1)?;
    // Kicks per vCPU per refresh over one window of `refresh`es; the count's own last read
    // kicks each vCPU once, and is taken off.
    let window =
        |control: &mut Qmp, refresh: &mut dyn FnMut(&mut Qmp) -> Result<(), String>| -> Result<f64, String> {
            let (before, vcpus) = signal_exits(control)?;
            for _ in 0..REFRESHES {
                std::thread::sleep(EVERY);
                refresh(control)?;
            }
            let (after, _) = signal_exits(control)?;
            let kicks = after.saturating_sub(before).saturating_sub(vcpus as u64);
            Ok(kicks as f64 / vcpus as f64 / f64::from(REFRESHES))
        };
    let mut rounds = Rounds::default();
    for round in 0..plan.start(&[QMP_INTERRUPTION_ROW], Pace::Slow).max(2) {
        let mut observed = |control: &mut Qmp| {
            window(control, &mut |_| {
                observer.tick();
                Ok(())
            })
        };
        let bare = |control: &mut Qmp| {
            window(control, &mut |control| {
                control
                    .execute("query-stats", Some(stats_request("vcpu", &["halt_exits"])))
                    .map(drop)
                    .map_err(|e| e.to_string())
            })
        };
        if round % 2 == 0 {
            rounds.ours.push(observed(&mut control)?);
            rounds.baseline.push(bare(&mut control)?);
        } else {
            rounds.baseline.push(bare(&mut control)?);
            rounds.ours.push(observed(&mut control)?);
        }
        plan.tick();
    }
    drop(observer);
    drop(qemus);
    Ok(rounds)
}
