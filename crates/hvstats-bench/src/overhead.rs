//! What observing costs the observed guest: its exit rate with and without the observer, side by
//! side on the same QEMU.
//!
//! A paused QEMU (`-accel kvm`) runs a guest that does `out 0x80` forever (every one a userspace
//! exit). Rounds alternate between observed (an [`Observer`] attached, refreshing as
//! `hvstats observe` does) and not observed; each round's rate is KVM's `exits` of the vCPU
//! (read through a QMP socket of its own, which costs the guest nothing) over the CPU time the
//! vCPU thread ran in the round (its schedstat): what each exit costs the guest, undisturbed by
//! the time a busy host keeps the thread off a CPU. `exits` moves on every host; `io_exits` is
//! counted only by the VMX/SVM exit handlers and stays 0 under a software KVM. The goal: an
//! observed exit rate at least 0.99 of the unobserved one.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hvstats::Hypervisor;

use hvstats_guest::bios::{BiosEnd, BiosProgram};
use hvstats_host::bpf::{Engine, TracepointColumn};
use hvstats_observe::{ObserveOptions, Observer, Procfs, Targets};
use hvstats_vmm::qmp::{Qmp, QmpError};

use crate::row::{Pace, Plan};

/// The measured exit rates, in exits per second (of the vCPU thread's CPU time for
/// [`guest_exit_rate_on_vs_off`]).
#[derive(Clone, Debug)]
pub struct ExitRates {
    /// Each observed round.
    pub observed: Vec<f64>,
    /// Each unobserved round.
    pub unobserved: Vec<f64>,
    /// Each round with programs attached to the tracepoints an exit fires but the guest's thread
    /// not counted: what attaching costs a firing, whatever the program does (empty where the
    /// measurement has no such rounds).
    pub attached: Vec<f64>,
}

impl ExitRates {
    /// The median of each: (observed, unobserved).
    pub fn medians(&self) -> (f64, f64) {
        (median(&self.observed), median(&self.unobserved))
    }

    /// Observed median over unobserved median (goal ≥ 0.99); `None` when a side has no
    /// positive rate (nothing was measured), so no ratio can be formed.
    pub fn ratio(&self) -> Option<f64> {
        let (on, off) = self.medians();
        (on > 0.0 && off > 0.0 && on.is_finite() && off.is_finite()).then(|| on / off)
    }

    /// The median of the rounds with programs attached but nothing counted.
    pub fn attached_median(&self) -> f64 {
        median(&self.attached)
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
    Qmp(#[from] QmpError),
    /// KVM's statistics are not available through QMP (not a KVM QEMU).
    #[error("QEMU reports no KVM exits statistic: the measurement needs -accel kvm")]
    NoStats,
    /// The guest made no exits in some round: there is no rate to compare.
    #[error("the guest made no exits in a round (observed {observed:?}, unobserved {unobserved:?} exits/s)")]
    NoExits {
        /// Each observed round's rate.
        observed: Vec<f64>,
        /// Each unobserved round's rate.
        unobserved: Vec<f64>,
    },
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

/// Measures the plan's rounds of observed, unobserved and attached windows of `window` each, with the
/// observer refreshing every `interval`.
///
/// # Errors
/// When QEMU with KVM cannot be run or QMP fails.
pub fn guest_exit_rate_on_vs_off(
    plan: &Plan<'_>,
    window: Duration,
    interval: Duration,
) -> Result<ExitRates, OverheadError> {
    if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        return Err(OverheadError::Qemu(format!("/dev/kvm is not available: {e}")));
    }
    let dir = std::env::temp_dir().join(format!("hvstats-observe-overhead-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| OverheadError::Qemu(e.to_string()))?;
    let image = BiosProgram { end: BiosEnd::OutForever, ..BiosProgram::default() }
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
    let exits = |q: &mut Qmp| -> Result<u64, OverheadError> {
        let stats = q.query_kvm_stats()?.ok_or(OverheadError::NoStats)?;
        let per_vcpu: Vec<u64> = stats.vcpus.values().filter_map(|s| s.get("exits").copied()).collect();
        if per_vcpu.is_empty() {
            return Err(OverheadError::NoStats);
        }
        Ok(per_vcpu.iter().sum())
    };
    let pid = qemu.child.id() as i32;
    let vcpu = control.query_cpus()?.first().map(|c| c.thread_id).ok_or(OverheadError::NoStats)?;
    let schedstat = format!("/proc/{pid}/task/{vcpu}/schedstat");
    // Nanoseconds the vCPU thread has run (the first field of its schedstat).
    let cpu_ns = || -> Result<u64, OverheadError> {
        let text = std::fs::read_to_string(&schedstat)
            .map_err(|e| OverheadError::Qemu(format!("{schedstat}: {e}")))?;
        text.split_whitespace()
            .next()
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| OverheadError::Qemu(format!("{schedstat}: no run time")))
    };
    let mut rates = ExitRates { observed: Vec::new(), unobserved: Vec::new(), attached: Vec::new() };
    let hv = Hypervisor::new().map_err(OverheadError::Instance)?;
    let rounds = plan.start(&[GUEST_ROW, GUEST_OVER_ATTACHED_ROW, ATTACHED_ROW], Pace::Slow);
    for round in 0..rounds * 3 {
        // Each triple of rounds in another order, so no kind always follows another.
        let kind = [Round::Observed, Round::Unobserved, Round::Attached][(round + round / 3) as usize % 3];
        let observed = kind == Round::Observed;
        let _attached = (kind == Round::Attached).then(attach_uncounted).transpose()?;
        let mut observer = observed.then(|| {
            Observer::new(
                Arc::clone(&hv),
                Procfs::host(),
                Targets::Pids(vec![pid]),
                ObserveOptions { qmp: Some(obs.clone()), ..Default::default() },
            )
        });
        if let Some(o) = observer.as_mut() {
            o.tick();
        }
        let (before, ran_before) = (exits(&mut control)?, cpu_ns()?);
        let start = Instant::now();
        while start.elapsed() < window {
            std::thread::sleep(interval.min(window.saturating_sub(start.elapsed())));
            if let Some(o) = observer.as_mut() {
                o.tick();
            }
        }
        let (after, ran_after) = (exits(&mut control)?, cpu_ns()?);
        let ran = ran_after.saturating_sub(ran_before) as f64 / 1e9;
        let rate = if ran > 0.0 { after.saturating_sub(before) as f64 / ran } else { 0.0 };
        match kind {
            Round::Observed => rates.observed.push(rate),
            Round::Unobserved => rates.unobserved.push(rate),
            Round::Attached => rates.attached.push(rate),
        }
        if round % 3 == 2 {
            plan.tick();
        }
    }
    drop(qemu);
    if rates
        .observed
        .iter()
        .chain(&rates.unobserved)
        .chain(&rates.attached)
        .any(|r| r.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater))
    {
        return Err(OverheadError::NoExits { observed: rates.observed, unobserved: rates.unobserved });
    }
    Ok(rates)
}

/// A round of [`guest_exit_rate_on_vs_off`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Round {
    Observed,
    Unobserved,
    Attached,
}

/// In-kernel counting programs on the two tracepoints every `out` exit of the guest fires
/// (`kvm_pio`, `kvm_userspace_exit`), counting no thread: each firing runs a program that finds
/// its thread uncounted and returns — the least any tracepoint-attached counting costs an exit.
fn attach_uncounted() -> Result<Engine, OverheadError> {
    let root = hvstats_host::tracefs::root().map_err(|e| {
        OverheadError::Qemu(format!("tracefs: {}", hvstats_host::error_chain::error_chain(e)))
    })?;
    let column = |name: &str| TracepointColumn { system: "kvm".into(), name: name.into(), filter: None };
    Engine::new(root, &[column("kvm_pio"), column("kvm_userspace_exit")]).map_err(|e| {
        OverheadError::Qemu(format!(
            "cannot attach the programs: {}",
            hvstats_host::error_chain::error_chain(&e)
        ))
    })
}

/// The `bench --json` row name of [`guest_exit_rate_on_vs_off`].
pub const GUEST_ROW: &str = "observe-guest-exit-rate-on-vs-off";

/// The row of the observed rounds over those with programs attached and nothing counted: what
/// the observer's counting adds to the least a tracepoint-attached program costs.
pub const GUEST_OVER_ATTACHED_ROW: &str = "observe-guest-exit-rate-on-vs-programs-only";

/// The row of the rounds with programs attached and nothing counted over the unobserved ones:
/// the cost of the attachment alone, on this host.
pub const ATTACHED_ROW: &str = "observe-guest-exit-rate-programs-only-vs-off";

/// The `bench --json` row name of [`counted_event_rate_on_vs_off`].
pub const COUNTING_ROW: &str = "observe-counted-event-rate-on-vs-off";

/// What counting costs the counted thread where no guest can run: a thread makes `calls`
/// `getppid` system calls (each fires `syscalls:sys_enter_getppid`, as each guest intercept fires
/// a `kvm:*` tracepoint) with the observer's counters open on it and without, rounds
/// interleaved; rates in calls per second. A proxy for the guest exit rate on hosts without KVM.
///
/// # Errors
/// When the tracepoint is unavailable or the process's threads cannot be read.
pub fn counted_event_rate_on_vs_off(plan: &Plan<'_>, calls: u32) -> Result<ExitRates, String> {
    use hvstats_observe::sources::{events::vm_events, thread_clock};
    use hvstats_observe::thread_counters::{EventList, EventSpec, ThreadCounters};
    // Every event the observer counts on a vCPU thread: the events source's and the thread
    // clock's.
    let mut specs = vm_events(None);
    specs.extend(thread_clock::events());
    specs.push(EventSpec::tracepoint("syscalls", "sys_enter_getppid"));
    let probe = EventList::new(specs.clone());
    if let Some(why) = probe.unavailable(specs.len() - 1) {
        return Err(format!("syscalls:sys_enter_getppid: {why}"));
    }
    let run = |calls: u32| {
        let start = Instant::now();
        for _ in 0..calls {
            // SAFETY: getppid has no arguments and no memory effects.
            unsafe { libc::syscall(libc::SYS_getppid) };
        }
        start.elapsed()
    };
    let (tx, rx) = std::sync::mpsc::channel::<bool>();
    let (done_tx, done) = std::sync::mpsc::channel();
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        run(calls / 10); // warm up, before anything is counted
        // SAFETY: gettid has no arguments and no memory effects.
        tid_tx.send(unsafe { libc::syscall(libc::SYS_gettid) } as i32).ok();
        for _ in rx {
            done_tx.send(run(calls)).ok();
        }
    });
    let tid = tid_rx.recv().map_err(|e| e.to_string())?;
    let me = std::process::id() as i32;
    let mut rates = ExitRates { observed: Vec::new(), unobserved: Vec::new(), attached: Vec::new() };
    for round in 0..plan.start(&[COUNTING_ROW], Pace::Quick) * 2 {
        let observed = (round % 2 == 0) == (round / 2 % 2 == 0);
        let counters = if observed {
            let mut c = ThreadCounters::attach(&Procfs::host(), me, EventList::new(specs.clone()))
                .map_err(|e| e.to_string())?;
            c.retain(&[tid]);
            Some(c)
        } else {
            None
        };
        tx.send(true).map_err(|e| e.to_string())?;
        let took = done.recv().map_err(|e| e.to_string())?;
        if let Some(mut c) = counters {
            let counted = c.read(tid).and_then(|v| v.last().copied().flatten());
            if counted != Some(u64::from(calls)) {
                return Err(format!("counted {counted:?} of {calls} calls"));
            }
        }
        let rate = f64::from(calls) / took.as_secs_f64();
        if observed {
            rates.observed.push(rate)
        } else {
            rates.unobserved.push(rate)
        }
        if round % 2 == 1 {
            plan.tick();
        }
    }
    drop(tx);
    worker.join().map_err(|_| "the worker panicked".to_owned())?;
    Ok(rates)
}
