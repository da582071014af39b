//! What counting a tracepoint costs the thread that fires it, by method: perf counters (one per
//! class, each evaluated on every firing) against one in-kernel program classifying into as many
//! columns. Measured on a thread of this process firing tracepoints that exist on every host, so
//! a host without KVM (or without VMX) measures it too:
//!
//! - `syscalls:sys_enter_getppid`, counted by 1, 4 and 16 filtered events (every filter matches,
//!   so every count must equal the calls made, which is checked);
//! - the *VMX load*: `syscalls:sys_enter_getpriority` classified exactly as the observer
//!   classifies `kvm_exit` on a VMX host (the exit-reason filters of every intercept class, with
//!   `which` for `exit_reason` and `who` for `intr_info` and `info1`), the thread cycling through
//!   the VMX exit reasons: counting every class against counting one.
//!
//! Times are the firing thread's CPU time per call (its preemption on a busy host counts for no
//! side); configurations alternate within each round, the order rotating from round to round.

use std::sync::mpsc;
use std::time::Duration;

use crate::row::{Pace, Plan, Rounds};

use hvstats_abi::exit_reason::{self, InterceptClass};

use hvstats_observe::Procfs;
use hvstats_observe::sources::exit_classes::class_filter;
use hvstats_observe::thread_counters::{EventList, EventSpec, Method, ThreadCounters};

/// One measured comparison: `ours` against `baseline`, in ns per call, round by round.
#[derive(Clone, Debug)]
pub struct CostRow {
    /// The row's name.
    pub name: &'static str,
    /// Both sides, ns per call, by round.
    pub rounds: Rounds,
    /// The goal for `ours / baseline`, when there is one.
    pub goal: Option<f64>,
}

/// Row names of [`tracepoint_costs`], by number of filtered events.
pub const PERF_VS_PROGRAM_ROWS: [(usize, &str); 3] = [
    (1, "tracepoint-program-vs-perf-1"),
    (4, "tracepoint-program-vs-perf-4"),
    (16, "tracepoint-program-vs-perf-16"),
];
/// The added cost of 16 classes in the kernel over an uncounted call, and of 16 perf events.
pub const PROGRAM_16_VS_NONE: &str = "tracepoint-program-16-vs-uncounted";
/// As [`PROGRAM_16_VS_NONE`], for 16 filtered perf events.
pub const PERF_16_VS_NONE: &str = "tracepoint-perf-16-vs-uncounted";
/// The VMX proxy: every class against one, in the kernel (goal ≤ 1.2 of the added cost).
pub const VMX_PROXY_ROW: &str = "vmx-load-program-all-classes-vs-one";
/// The VMX proxy with perf counters, for comparison.
pub const VMX_PROXY_PERF_ROW: &str = "vmx-load-perf-all-classes-vs-one";

/// What the worker thread does per call.
#[derive(Clone, Copy, Debug)]
enum Load {
    Getppid,
    /// `getpriority(reason, 0)` cycling through these reasons.
    Getpriority(&'static [u32]),
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: the kernel writes one timespec into `ts`, which we own for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec.max(0) as u64 * 1_000_000_000 + ts.tv_nsec.max(0) as u64
}

fn run(load: Load, calls: u32) -> Duration {
    let start = thread_cpu_ns();
    match load {
        Load::Getppid => {
            for _ in 0..calls {
                // SAFETY: getppid has no arguments and no memory effects.
                unsafe { libc::syscall(libc::SYS_getppid) };
            }
        }
        Load::Getpriority(reasons) => {
            for i in 0..calls as usize {
                let which = reasons[i % reasons.len()];
                // SAFETY: getpriority reads two integers; an unknown `which` is EINVAL.
                unsafe { libc::syscall(libc::SYS_getpriority, which, 0) };
            }
        }
    }
    Duration::from_nanos(thread_cpu_ns().saturating_sub(start))
}

/// A thread of this process that runs loads on request.
struct Worker {
    tid: i32,
    jobs: Option<mpsc::Sender<(Load, u32)>>,
    done: mpsc::Receiver<Duration>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    fn start() -> Result<Self, String> {
        let (jobs, rx) = mpsc::channel::<(Load, u32)>();
        let (done_tx, done) = mpsc::channel();
        let (tid_tx, tid_rx) = mpsc::channel();
        let handle = std::thread::spawn(move || {
            // SAFETY: gettid has no arguments and no memory effects.
            tid_tx.send(unsafe { libc::syscall(libc::SYS_gettid) } as i32).ok();
            for (load, calls) in rx {
                done_tx.send(run(load, calls)).ok();
            }
        });
        let tid = tid_rx.recv().map_err(|e| e.to_string())?;
        Ok(Self { tid, jobs: Some(jobs), done, handle: Some(handle) })
    }

    fn run(&self, load: Load, calls: u32) -> Result<Duration, String> {
        self.jobs.as_ref().ok_or("no worker")?.send((load, calls)).map_err(|e| e.to_string())?;
        self.done.recv().map_err(|e| e.to_string())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// One way of counting the worker: nothing, or `specs` by `method`; `exact` lists the events
/// whose count must equal the calls made.
#[derive(Clone, Debug)]
struct Config {
    counting: Option<(Vec<EventSpec>, Method)>,
    exact: Vec<usize>,
}

/// ns per call of each config in each of the plan's rounds for `rows`, configs alternating in
/// each.
fn measure(
    configs: &[Config],
    load: Load,
    plan: &Plan<'_>,
    rows: &[&str],
    calls: u32,
) -> Result<Vec<Vec<f64>>, String> {
    let worker = Worker::start()?;
    worker.run(load, calls / 10)?; // warm up
    let me = std::process::id() as i32;
    let mut samples = vec![Vec::new(); configs.len()];
    for round in 0..plan.start(rows, Pace::Slow) as usize {
        for k in 0..configs.len() {
            // Rotate the order each round, so no config always follows the same one.
            let i = (k + round) % configs.len();
            let config = &configs[i];
            let counters = match &config.counting {
                None => None,
                Some((specs, method)) => {
                    let events = EventList::with_method(specs.clone(), *method);
                    if events.method() != *method {
                        return Err(events.method_description());
                    }
                    let mut c =
                        ThreadCounters::attach(&Procfs::host(), me, events).map_err(|e| e.to_string())?;
                    c.retain(&[worker.tid]);
                    Some(c)
                }
            };
            let took = worker.run(load, calls)?;
            if let Some(mut c) = counters {
                let counts = c.read(worker.tid).ok_or("the worker is not counted")?;
                for &e in &config.exact {
                    if counts.get(e).copied().flatten() != Some(u64::from(calls)) {
                        return Err(format!("event {e} counted {:?} of {calls} calls", counts.get(e)));
                    }
                }
            }
            samples[i].push(took.as_nanos() as f64 / f64::from(calls));
        }
        plan.tick();
    }
    Ok(samples)
}

/// Config `ours` against config `baseline`, round by round.
fn paired(ns: &[Vec<f64>], ours: usize, baseline: usize) -> Rounds {
    Rounds { ours: ns[ours].clone(), baseline: ns[baseline].clone() }
}

/// `n` filtered events on `syscalls:sys_enter_getppid`, every filter matching every call.
fn getppid_specs(n: usize) -> Vec<EventSpec> {
    (0..n)
        .map(|i| {
            EventSpec::filtered("syscalls", "sys_enter_getppid", &format!("__syscall_nr != {}", 100_000 + i))
        })
        .collect()
}

/// Per-call cost of 1, 4 and 16 filtered perf events on one tracepoint against one program
/// counting the same 1, 4 and 16 classes; and each 16 against no counting.
///
/// # Errors
/// When the tracepoint or BPF is unavailable, or a count is not exact.
pub fn tracepoint_costs(plan: &Plan<'_>, calls: u32) -> Result<Vec<CostRow>, String> {
    let mut configs = vec![Config { counting: None, exact: Vec::new() }];
    for (n, _) in PERF_VS_PROGRAM_ROWS {
        for method in [Method::Perf, Method::InKernel] {
            configs.push(Config { counting: Some((getppid_specs(n), method)), exact: (0..n).collect() });
        }
    }
    let mut names: Vec<&str> = PERF_VS_PROGRAM_ROWS.iter().map(|(_, n)| *n).collect();
    names.extend([PROGRAM_16_VS_NONE, PERF_16_VS_NONE]);
    let ns = measure(&configs, Load::Getppid, plan, &names, calls)?;
    let mut rows: Vec<CostRow> = PERF_VS_PROGRAM_ROWS
        .iter()
        .enumerate()
        .map(|(k, (_, name))| CostRow { name, rounds: paired(&ns, 2 + 2 * k, 1 + 2 * k), goal: Some(1.0) })
        .collect();
    rows.push(CostRow { name: PROGRAM_16_VS_NONE, rounds: paired(&ns, 6, 0), goal: None });
    rows.push(CostRow { name: PERF_16_VS_NONE, rounds: paired(&ns, 5, 0), goal: None });
    Ok(rows)
}

/// The exit reasons a VMX host's `kvm_exit` reports (every row of the table), cycled through.
fn vmx_reasons() -> &'static [u32] {
    static REASONS: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();
    REASONS.get_or_init(|| {
        let mut r: Vec<u32> = exit_reason::VMX
            .iter()
            .flat_map(|row| row.first..=row.last)
            .filter_map(|r| u32::try_from(r).ok())
            .collect();
        r.sort_unstable();
        r.dedup();
        r
    })
}

/// The observer's `kvm_exit` events on a VMX host, on `sys_enter_getpriority`: the unfiltered
/// count, then (when `classes`) one per intercept class.
fn vmx_specs(classes: bool) -> Vec<EventSpec> {
    let tp = |filter: Option<String>| match filter {
        Some(f) => EventSpec::filtered("syscalls", "sys_enter_getpriority", &f),
        None => EventSpec::tracepoint("syscalls", "sys_enter_getpriority"),
    };
    let mut specs = vec![tp(None)];
    if classes {
        for class in InterceptClass::EXITS.into_iter().filter(|c| *c != InterceptClass::Other) {
            let f = class_filter(exit_reason::ISA_VMX, class);
            specs.push(tp(Some(
                f.replace("exit_reason", "which").replace("intr_info", "who").replace("info1", "who"),
            )));
        }
    }
    specs
}

/// The VMX load: the added per-call cost of counting every intercept class over counting one
/// (the total), in the kernel and with perf counters.
///
/// # Errors
/// When the tracepoint or BPF is unavailable, or the total is not exact.
pub fn vmx_proxy(plan: &Plan<'_>, calls: u32) -> Result<Vec<CostRow>, String> {
    let mut configs = vec![Config { counting: None, exact: Vec::new() }];
    for method in [Method::InKernel, Method::Perf] {
        for classes in [false, true] {
            configs.push(Config { counting: Some((vmx_specs(classes), method)), exact: vec![0] });
        }
    }
    let ns = measure(
        &configs,
        Load::Getpriority(vmx_reasons()),
        plan,
        &[VMX_PROXY_ROW, VMX_PROXY_PERF_ROW],
        calls,
    )?;
    // What counting adds to each round's uncounted call.
    let added = |i: usize| -> Vec<f64> {
        ns[i].iter().zip(&ns[0]).map(|(n, none)| (n - none).max(f64::MIN_POSITIVE)).collect()
    };
    Ok(vec![
        CostRow {
            name: VMX_PROXY_ROW,
            rounds: Rounds { ours: added(2), baseline: added(1) },
            goal: Some(1.2),
        },
        CostRow {
            name: VMX_PROXY_PERF_ROW,
            rounds: Rounds { ours: added(4), baseline: added(3) },
            goal: None,
        },
    ])
}
