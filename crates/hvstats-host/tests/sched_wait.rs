//! CPU wait of threads made to compete for one CPU, read through `hvstats_host::sched`, against the
//! kernel's own accounting of the same threads.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

use std::os::unix::thread::JoinHandleExt;
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use hvstats_host::sched::{SchedStat, SchedStatFile};

/// CPU time each competing thread burns.
const BURN: Duration = Duration::from_millis(80);

/// The first CPU this process may run on.
fn some_allowed_cpu() -> usize {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most its size into it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above; pid 0 is the calling thread.
    let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) };
    assert_eq!(rc, 0, "sched_getaffinity: {}", std::io::Error::last_os_error());
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `set` is initialised and `cpu` is below CPU_SETSIZE.
        .find(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .expect("the process may run on some CPU")
}

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: usize) {
    // SAFETY: cpu_set_t is plain data.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (it came from the allowed mask).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is the calling thread; the set is initialised.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    assert_eq!(rc, 0, "sched_setaffinity: {}", std::io::Error::last_os_error());
}

/// The calling thread's own CPU clock.
fn own_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0);
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The CPU clock of another thread of this process, in ns (the kernel's `sum_exec_runtime`).
fn cpu_clock_ns(thread: libc::pthread_t) -> u64 {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: `thread` is a live (joinable, not yet joined) thread; the call writes one clockid.
    assert_eq!(unsafe { libc::pthread_getcpuclockid(thread, &mut clock) }, 0);
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec we own.
    assert_eq!(unsafe { libc::clock_gettime(clock, &mut ts) }, 0);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The kernel's file read and split here, independently of the module under test.
fn kernel_fields(pid: u32, tid: libc::pid_t) -> [u64; 3] {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).unwrap();
    let v: Vec<u64> = text.split_whitespace().map(|f| f.parse().unwrap()).collect();
    [v[0], v[1], v[2]]
}

#[test]
fn threads_competing_for_one_cpu_wait_and_the_reading_matches_the_kernel() {
    let cpu = some_allowed_cpu();
    let pid = std::process::id();
    let start = Barrier::new(3);
    let start = Arc::new(start);
    let (done_tx, done_rx) = mpsc::channel();
    let mut release = Vec::new();
    let mut handles = Vec::new();
    let began = Instant::now();
    // Two VP-like threads and a busy host thread, all on one CPU.
    for role in ["vp0", "vp1", "host"] {
        let start = Arc::clone(&start);
        let done_tx = done_tx.clone();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        release.push(release_tx);
        handles.push((
            role,
            std::thread::spawn(move || {
                pin_to(cpu);
                // SAFETY: gettid has no arguments and cannot fail.
                let tid = unsafe { libc::gettid() };
                start.wait();
                let from = own_cpu_time();
                let mut x = 0u64;
                while own_cpu_time() - from < BURN {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
                done_tx.send((role, tid)).unwrap();
                // Parked until the test has read: a sleeping thread's accounting stands still.
                let _ = release_rx.recv();
            }),
        ));
    }
    drop(done_tx);
    let mut tids: Vec<(&str, libc::pid_t)> = done_rx.iter().take(3).collect();
    tids.sort();
    assert_eq!(tids.len(), 3);

    // Let the last thread reach its receive and go to sleep.
    std::thread::sleep(Duration::from_millis(50));
    let elapsed_ns = began.elapsed().as_nanos() as u64;
    for (role, tid) in &tids {
        let (_, handle) = handles.iter().find(|(r, _)| r == role).unwrap();
        let file = SchedStatFile::open(pid as libc::pid_t, *tid).unwrap();
        let ours = file.read().unwrap();
        let kernel = kernel_fields(pid, *tid);
        let clock_ns = cpu_clock_ns(handle.as_pthread_t());
        let again = file.read().unwrap();
        assert_eq!(ours, again, "{role}: a parked thread's accounting moved");
        assert_eq!([ours.run_ns, ours.wait_ns, ours.dispatches], kernel, "{role}: not the kernel's file");
        assert_eq!(ours.run_ns, clock_ns, "{role}: run time is not the thread's CPU clock");
        assert!(ours.run_ns >= BURN.as_nanos() as u64, "{role}: {ours:?}");
        assert!(ours.wait_ns > 0, "{role}: three busy threads on one CPU, yet no wait: {ours:?}");
        assert!(ours.dispatches >= 2, "{role}: {ours:?}");
        assert!(ours.run_ns + ours.wait_ns <= elapsed_ns, "{role}: {ours:?} in {elapsed_ns} ns");
        let per_dispatch = ours.wait_per_dispatch_ns().unwrap();
        assert_eq!(per_dispatch, ours.wait_ns as f64 / ours.dispatches as f64);
    }
    // Sharing one CPU three ways, the threads together waited at least as long as one of them ran.
    let total_wait: u64 = tids
        .iter()
        .map(|(_, tid)| SchedStatFile::open(pid as libc::pid_t, *tid).unwrap().read().unwrap().wait_ns)
        .sum();
    assert!(total_wait >= BURN.as_nanos() as u64, "total wait {total_wait} ns");

    drop(release);
    for (_, h) in handles {
        h.join().unwrap();
    }
}

#[test]
fn a_thread_that_exited_after_opening_is_a_read_error() {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        // SAFETY: gettid has no arguments and cannot fail.
        tx.send(unsafe { libc::gettid() }).unwrap();
    });
    let tid = rx.recv().unwrap();
    let file = SchedStatFile::open(std::process::id() as libc::pid_t, tid);
    h.join().unwrap();
    // The thread may be gone before the open (an open error) or after it (a read error); either
    // way the answer is an error naming the file, never a stale or zero reading.
    let deadline = Instant::now() + Duration::from_secs(5);
    let err = match file {
        Err(e) => e,
        Ok(file) => loop {
            match file.read() {
                Err(e) => break e,
                Ok(s) => {
                    let _: SchedStat = s;
                    assert!(Instant::now() < deadline, "a reaped thread still reads");
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        },
    };
    assert!(err.to_string().contains(&format!("/task/{tid}/schedstat")), "{err}");
}
