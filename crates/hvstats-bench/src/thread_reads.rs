//! What the observer's per-thread reads cost each refresh, on [`THREADS`] live threads, in CPU
//! ns per thread, against one `pread` of a schedstat held open per thread (the least a read per
//! thread costs). Ours is what the observer does where it can: one walk of the kernel's task
//! iterator over the process's threads (`hvstats_host::bpf::task_iter`); the `proc_files_ns`
//! fact is its fallback, every source an observed vCPU thread has
//! ([`hvstats_sources::OBSERVED_THREAD_SOURCES`]: its schedstat and `stat`, opened and read each
//! refresh). The `us_per_vm_of_4` fact is what ours costs a VM of 4 vCPUs by the thread;
//! `small_walk_us` is a whole walk of this process while it has few threads
//! (`small_walk_threads`): what a small VM's refresh costs, whatever its threads.

use std::os::unix::fs::FileExt;

use hvstats_sources::OBSERVED_THREAD_SOURCES;
use hvstats_sources::counter_source::{ObservedThread, VpSource};

use crate::restart::Parked;
use crate::row::{CpuClock, Plan, Row, ns_per, side_by_side};

/// The row.
pub const ROW: &str = "observe-thread-reads-per-vcpu-thread-vs-held-pread";

/// Threads read each round.
pub const THREADS: usize = 1024;

/// The row, over the plan's rounds (skipped, with why, where the threads' files cannot be read).
pub fn thread_reads_row(plan: &Plan<'_>) -> Row {
    match measure(plan) {
        Ok(row) => row,
        Err(why) => Row::Skipped { name: ROW, why },
    }
}

/// CPU µs of one task-iterator walk of this process while it has few threads (what a refresh
/// costs a small VM, whatever it reads per thread), and how many threads it walked.
fn small_walk(pid: i32) -> Option<(f64, f64)> {
    let program = hvstats_host::bpf::task_iter::shared()?;
    let mut tasks = hvstats_host::bpf::task_iter::ProcessTasks::open(program, pid).ok()?;
    let mut samples = Vec::new();
    let mut walked = 0;
    for _ in 0..50 {
        let start = CpuClock::now();
        walked = tasks.read().ok()?.count();
        samples.push(ns_per(start, 1) / 1e3);
    }
    Some((crate::row::Spread::of(&samples).median, walked as f64))
}

fn measure(plan: &Plan<'_>) -> Result<Row, String> {
    let pid = std::process::id() as i32;
    let (small_walk_us, small_walk_threads) = small_walk(pid).unwrap_or((f64::NAN, 0.0));
    let threads = Parked::spawn(THREADS)?;
    let procfs = std::path::Path::new("/proc");
    let mut sources: Vec<Box<dyn VpSource>> = threads
        .tids
        .iter()
        .flat_map(|&tid| {
            OBSERVED_THREAD_SOURCES.iter().filter_map(move |open| open(ObservedThread { procfs, pid, tid }))
        })
        .collect();
    if sources.len() < THREADS {
        return Err(format!("{} sources opened on {THREADS} threads", sources.len()));
    }
    let held = threads
        .tids
        .iter()
        .map(|tid| std::fs::File::open(format!("/proc/{pid}/task/{tid}/schedstat")))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("schedstat: {e}"))?;
    let mut buf = [0u8; 128];
    let mut proc_files = || {
        let start = CpuClock::now();
        sources.iter_mut().for_each(|s| s.read());
        ns_per(start, THREADS as u64)
    };
    let proc_files_ns = crate::row::Spread::of(&(0..5).map(|_| proc_files()).collect::<Vec<_>>()).median;
    let mut iterated = hvstats_host::bpf::task_iter::shared()
        .map(|program| hvstats_host::bpf::task_iter::ProcessTasks::open(program, pid))
        .transpose()
        .map_err(|e| format!("the task iterator: {e}"))?;
    let task_iterator = iterated.is_some();
    let rounds = side_by_side(
        plan,
        ROW,
        || match iterated.as_mut() {
            Some(tasks) => {
                let start = CpuClock::now();
                let walked = tasks.read().map(Iterator::count).unwrap_or(0);
                std::hint::black_box(walked);
                ns_per(start, THREADS as u64)
            }
            None => proc_files(),
        },
        || {
            let start = CpuClock::now();
            for file in &held {
                std::hint::black_box(file.read_at(&mut buf, 0).ok());
            }
            ns_per(start, THREADS as u64)
        },
    );
    let per_thread = crate::row::Spread::of(&rounds.ours).median;
    Ok(Row::Measured {
        name: ROW,
        rounds,
        unit: "ns/thread",
        goal: None,
        facts: vec![
            ("threads", THREADS as f64),
            ("sources_per_thread", sources.len() as f64 / THREADS as f64),
            ("task_iterator", f64::from(u8::from(task_iterator))),
            ("proc_files_ns", proc_files_ns),
            ("small_walk_us", small_walk_us),
            ("small_walk_threads", small_walk_threads),
            ("us_per_vm_of_4", per_thread * 4.0 / 1e3),
        ],
    })
}
