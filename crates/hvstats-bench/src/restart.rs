//! What a restarted observer pays to take back the counts the kernel kept while none ran: the
//! wall-clock time from opening the kept counting engine (its maps found in bpffs, every row's owner
//! read and checked) to every row claimed by its thread, as a new observer does at start.
//!
//! The rows are [`KEPT_ROWS`] live threads of the bench (parked, each a counted thread in a kept
//! engine of exactly as many rows, on the two tracepoints a guest's `out` fires): the row's name
//! and its `rows` fact say how many. Once counted, the engine is dropped
//! with every row in use, so its maps and programs stay pinned as an ending observer leaves
//! them; each round then adopts and claims them all and drops the engine again. Against one second
//! (the documented bound: the ratio is the share of it taken). The fact `fresh_engine_s` is what
//! making the engine without anything kept took (programs loaded and attached, maps pinned).

use std::path::Path;
use std::time::Instant;

use hvstats_host::bpf::{Claim, Engine, EngineLayout, ThreadTable, TracepointColumn, keep};
use hvstats_host::error_chain::error_chain;
use hvstats_testkit::TempDir;

use crate::row::{Pace, Plan, Rounds, Row};

/// The kept rows a restart adopts: a host of 4,096 vCPU threads.
pub const KEPT_ROWS: usize = 4096;

/// The VM object every row is counted for (any token but 0, the unknown one).
const VM: keep::VmToken = 1;

/// The row's name: the rows it really adopts.
pub fn row_name() -> String {
    format!("restart-adopt-{}-kept-rows-vs-1s", rows())
}

/// The rows adopted: [`KEPT_ROWS`], the engine made with exactly as many.
fn rows() -> usize {
    KEPT_ROWS
}

/// Threads of this process that stay alive, parked, until dropped.
pub(crate) struct Parked {
    /// Their thread ids.
    pub(crate) tids: Vec<i32>,
    handles: Vec<std::thread::JoinHandle<()>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Parked {
    /// Starts `n` threads; their ids once each runs.
    pub(crate) fn spawn(n: usize) -> Result<Self, String> {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut parked = Self { tids: Vec::with_capacity(n), handles: Vec::with_capacity(n), stop };
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..n {
            let (tx, stop) = (tx.clone(), std::sync::Arc::clone(&parked.stop));
            let handle = std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || {
                    // SAFETY: gettid has no arguments and no memory effects.
                    let _ = tx.send(unsafe { libc::syscall(libc::SYS_gettid) } as i32);
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::thread::park();
                    }
                })
                .map_err(|e| format!("cannot start a thread to count: {e}"))?;
            parked.handles.push(handle);
        }
        drop(tx);
        parked.tids = rx.iter().take(n).collect();
        Ok(parked)
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for handle in self.handles.drain(..) {
            handle.thread().unpark();
            let _ = handle.join();
        }
    }
}

/// The row, over the plan's rounds; skipped with why where this host cannot keep counts (no
/// root, tracefs or bpffs).
pub fn restart_row(plan: &Plan<'_>, name: &'static str) -> Row {
    match measure(plan, name) {
        Ok((rounds, fresh)) => Row::Measured {
            name,
            rounds,
            unit: "s",
            goal: Some(1.0),
            facts: vec![("rows", rows() as f64), ("rows_asked", KEPT_ROWS as f64), ("fresh_engine_s", fresh)],
        },
        Err(why) => Row::Skipped { name, why },
    }
}

fn measure(plan: &Plan<'_>, name: &str) -> Result<(Rounds, f64), String> {
    crate::shutdown::root()?;
    let tracefs = hvstats_host::tracefs::root().map_err(|e| format!("tracefs: {}", error_chain(e)))?;
    let runtime = TempDir::new("bench-restart");
    let identity = keep::identity_dir(runtime.path()).map_err(|e| format!("bpffs: {e}"))?;
    let column = |name: &str| TracepointColumn { system: "kvm".into(), name: name.into(), filter: None };
    let layout = EngineLayout {
        counted: vec![column("kvm_pio"), column("kvm_userspace_exit")],
        rows: Some(KEPT_ROWS as u32),
        ..Default::default()
    };
    let open =
        || Engine::kept(tracefs, &layout, ThreadTable::for_host(), &identity).map_err(|e| error_chain(&e));
    let threads = Parked::spawn(rows())?;
    let me = std::process::id() as i32;
    let start = Instant::now();
    let (engine, _) = open()?;
    let fresh = start.elapsed().as_secs_f64();
    for &tid in &threads.tids {
        engine.add_thread_in(me, tid, VM).map_err(|e| error_chain(&e))?;
    }
    if engine.kept_in().is_none() {
        return Err("the engine's counts cannot be kept in bpffs here".into());
    }
    drop(engine);
    let mut rounds = Rounds::default();
    for _ in 0..plan.start(&[name], Pace::Slow) {
        let start = Instant::now();
        let (engine, adoption) = open()?;
        let claimed = threads
            .tids
            .iter()
            .filter(|&&tid| matches!(engine.claim(me, tid, VM), Claim::Adopted(_)))
            .count();
        rounds.ours.push(start.elapsed().as_secs_f64());
        rounds.baseline.push(1.0);
        if adoption.adopted != threads.tids.len() || claimed != threads.tids.len() {
            return Err(format!(
                "adopted {} and claimed {claimed} of {} kept rows",
                adoption.adopted,
                threads.tids.len()
            ));
        }
        drop(engine);
        plan.tick();
    }
    forget(open()?.0, &threads.tids, me);
    remove_kept(&identity);
    Ok((rounds, fresh))
}

/// Claims and stops counting every thread of `tids`, so the dropped engine keeps nothing.
fn forget(engine: Engine, tids: &[i32], me: i32) {
    for &tid in tids {
        let _ = engine.claim(me, tid, VM);
        engine.remove_thread(tid);
    }
}

/// Removes what is left of the bench's kept tallies.
fn remove_kept(identity: &Path) {
    keep::remove_tree(identity);
}
