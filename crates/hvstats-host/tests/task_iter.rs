//! The task iterator's records of real threads of this test process, against what the kernel
//! shows of the same threads in `/proc`: `schedstat` (run, wait, dispatches), `stat` (guest time
//! in clock ticks, faults) and `sched` (`se.nr_migrations`). A sleeping thread's readings just
//! before and just after the walk bracket it; when they are equal, the walk's must be too. Needs
//! root (CAP_BPF and CAP_PERFMON); without them it says "skipped", and fails under
//! `HVSTATS_REQUIRE_KVM=1`.

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::mpsc;

use hvstats_host::bpf::task_iter::{ProcessTasks, TaskIterProgram, TaskSched};
use hvstats_host::sched::{SchedStatFile, path_under};
use hvstats_host::task_stat::{STAT_MAX, StatFile, thread_path, ticks_per_second};

fn program(test: &str) -> Option<TaskIterProgram> {
    match TaskIterProgram::load() {
        Ok(p) => Some(p),
        Err(e) => {
            let why = hvstats_host::error_chain::error_chain(&e);
            assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "{test}: {why}");
            eprintln!("{test}: skipped: {why}");
            None
        }
    }
}

/// What `/proc` shows of thread `tid` of this process, in the record's terms.
fn from_proc(tid: i32) -> TaskSched {
    let pid = std::process::id() as i32;
    let proc = std::path::Path::new("/proc");
    let sched = SchedStatFile::open_path(&path_under(proc, pid, tid)).unwrap().read().unwrap();
    let mut buf = [0u8; STAT_MAX];
    let file = StatFile::open(&thread_path(proc, pid, tid)).unwrap();
    let stat = file.read(&mut buf).unwrap();
    TaskSched {
        tid,
        tgid: pid,
        run_ns: sched.run_ns,
        wait_ns: sched.wait_ns,
        dispatches: sched.dispatches,
        migrations: migrations_of(pid, tid).unwrap_or(0),
        // In clock ticks, as `stat` gives it: compared after the same rounding.
        guest_ns: stat.guest_ticks().unwrap(),
        minor_faults: stat.minor_faults().unwrap(),
        major_faults: stat.major_faults().unwrap(),
    }
}

/// `se.nr_migrations` of `/proc/PID/task/TID/sched`, where the kernel has that file.
fn migrations_of(pid: i32, tid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/sched")).ok()?;
    let line = text.lines().find(|l| l.starts_with("se.nr_migrations"))?;
    line.split(':').nth(1)?.trim().parse().ok()
}

/// A record with its guest time in clock ticks, as `stat` rounds it.
fn in_ticks(mut t: TaskSched) -> TaskSched {
    t.guest_ns /= 1_000_000_000 / ticks_per_second();
    t
}

/// A thread of this process that sleeps until told, and its id.
fn sleeper() -> (i32, mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (tid_tx, tid_rx) = mpsc::channel();
    let (wake, asleep) = mpsc::channel::<()>();
    let handle = std::thread::spawn(move || {
        // SAFETY: gettid has no arguments and no memory effects.
        tid_tx.send(unsafe { libc::syscall(libc::SYS_gettid) } as i32).unwrap();
        let _ = asleep.recv();
    });
    (tid_rx.recv().unwrap(), wake, handle)
}

#[test]
fn a_sleeping_threads_record_is_what_proc_shows_of_it() {
    let test = "a_sleeping_threads_record_is_what_proc_shows_of_it";
    let Some(program) = program(test) else { return };
    let pid = std::process::id() as i32;
    let (tid, wake, handle) = sleeper();
    let mut tasks = ProcessTasks::open(&program, pid).unwrap();
    // A thread may still be settling into its sleep: a few tries, each bracketed by /proc.
    let mut compared = false;
    for _ in 0..20 {
        let before = from_proc(tid);
        let walked: Vec<TaskSched> = tasks.read().unwrap().collect();
        let after = from_proc(tid);
        let me = walked.iter().find(|t| t.tid == tid).copied().expect("the sleeper is walked");
        assert!(walked.iter().all(|t| t.tgid == pid), "only this process's threads: {walked:?}");
        assert!(walked.iter().any(|t| t.tid == pid), "its main thread too");
        if before == after {
            assert_eq!(in_ticks(me), before, "the record is /proc's reading");
            if migrations_of(pid, tid).is_none() {
                eprintln!("{test}: this kernel has no /proc/PID/task/TID/sched: migrations not compared");
            }
            compared = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(compared, "the sleeping thread did not stay still for a reading");
    wake.send(()).unwrap();
    handle.join().unwrap();
}

#[test]
fn a_thread_moved_between_cpus_counts_its_migrations() {
    let test = "a_thread_moved_between_cpus_counts_its_migrations";
    let Some(program) = program(test) else { return };
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    if cpus < 2 {
        eprintln!("{test}: skipped: one CPU");
        return;
    }
    let pid = std::process::id() as i32;
    let mut tasks = ProcessTasks::open(&program, pid).unwrap();
    // SAFETY: gettid has no arguments and no memory effects.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    let mine = |tasks: &mut ProcessTasks| tasks.read().unwrap().find(|t| t.tid == tid).unwrap();
    let first = mine(&mut tasks).migrations;
    for cpu in [0, 1, 0, 1] {
        // SAFETY: a zeroed cpu_set_t with one CPU set, alive for the call, for this thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            assert_eq!(libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set), 0);
        }
    }
    let last = mine(&mut tasks).migrations;
    assert!(last >= first + 3, "moved between CPU 0 and 1 four times: {first} -> {last}");
    if let Some(proc) = migrations_of(pid, tid) {
        assert_eq!(proc, last, "as /proc/PID/task/TID/sched counts them (this thread did not move since)");
    }
    // SAFETY: as above, every CPU set again.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        (0..cpus).for_each(|c| libc::CPU_SET(c, &mut set));
        libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
    }
}
