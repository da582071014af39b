//! The task iterator's records of real threads of this test process, against what the kernel
//! shows of the same threads in `/proc`: `schedstat` (run, wait, dispatches), `stat` (guest time
//! in clock ticks, faults) and `sched` (`se.nr_migrations`). A sleeping thread's readings just
//! before and just after the walk bracket it; when they are equal, the walk's must be too. Needs
//! root (CAP_BPF and CAP_PERFMON); without them it says "skipped", and fails under
//! `HVSTATS_REQUIRE_KVM=1`. The host's walk is compared with /proc the same way: each thread's start
//! time, a process's exec and exit.

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::mpsc;

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hvstats_host::bpf::task_iter::{HostTasks, ProcessTasks, Task, TaskIterProgram, TaskSched};
use hvstats_host::sched::{SchedStatFile, path_under};
use hvstats_host::task_stat::{STAT_MAX, StatFile, StatLine, thread_path, ticks_per_second};

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

/// Thread `tid` of process `pid` as `/proc/PID/task/TID/stat` shows it.
fn stat_of(pid: i32, tid: i32) -> (u64, char) {
    let text = std::fs::read_to_string(thread_path(std::path::Path::new("/proc"), pid, tid)).unwrap();
    let stat = StatLine::parse(&text).unwrap();
    (stat.start_time().unwrap(), stat.state().unwrap())
}

/// A `sh` that waits for a line on its standard input, then `exec()`s `sleep`.
fn shell_that_execs_on_a_line() -> Child {
    let script = "read _ && exec sleep 30";
    Command::new("sh").args(["-c", script]).stdin(Stdio::piped()).spawn().unwrap()
}

/// Waits (a generous bound) until `done`.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(t.elapsed() < Duration::from_secs(20), "{what} within 20 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn one_walk_of_the_host_gives_every_processs_threads_with_procs_start_times_and_no_kernel_thread() {
    let test =
        "one_walk_of_the_host_gives_every_processs_threads_with_procs_start_times_and_no_kernel_thread";
    let Some(program) = program(test) else { return };
    let me = std::process::id() as i32;
    let (tid, wake, handle) = sleeper();
    let mut children: Vec<Child> = (0..3).map(|_| shell_that_execs_on_a_line()).collect();
    let mut host = HostTasks::open(&program).unwrap();
    let walked = host.walk().unwrap();
    assert!(walked.complete(), "this host has fewer than 65,536 threads");
    let tasks: Vec<Task> = walked.tasks().collect();
    let find = |pid: i32, tid: i32| tasks.iter().find(|t| t.sched.tid == tid && t.sched.tgid == pid);
    for (pid, tid) in children.iter().map(|c| (c.id() as i32, c.id() as i32)).chain([(me, me), (me, tid)]) {
        let task = find(pid, tid).unwrap_or_else(|| panic!("thread {tid} of {pid} is walked"));
        assert_eq!(task.start_ticks(), stat_of(pid, tid).0, "thread {tid}: /proc's field 22");
        assert!(!task.exiting, "thread {tid} lives");
    }
    // kthreadd (pid 2) and every thread it made are the kernel's own.
    let kernel = std::fs::read_to_string("/proc/2/comm").unwrap_or_default();
    if kernel.trim() == "kthreadd" {
        assert!(tasks.iter().all(|t| t.sched.tid != 2), "no kernel thread is walked");
    }
    wake.send(()).unwrap();
    handle.join().unwrap();
    for child in &mut children {
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

#[test]
fn a_process_that_execs_is_walked_with_its_next_exec_and_its_start_and_an_exited_one_as_exiting() {
    let test = "a_process_that_execs_is_walked_with_its_next_exec_and_its_start_and_an_exited_one_as_exiting";
    let Some(program) = program(test) else { return };
    let mut child = shell_that_execs_on_a_line();
    let pid = child.id() as i32;
    let mut tasks = ProcessTasks::open(&program, pid).unwrap();
    let leader =
        |tasks: &mut ProcessTasks| tasks.tasks().unwrap().tasks().find(|t| t.sched.tid == pid).unwrap();
    let comm = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    // The child runs `sh` once its own exec is done (a forked child counts its parent's execs).
    wait_until("sh", || comm(pid) == "sh\n");
    let before = leader(&mut tasks);
    writeln!(child.stdin.as_ref().unwrap()).unwrap();
    wait_until("the exec", || comm(pid) == "sleep\n");
    let after = leader(&mut tasks);
    assert_eq!(after.exec_id, before.exec_id + 1, "one exec: {before:?} -> {after:?}");
    assert_eq!(after.start_ns, before.start_ns, "the same process");
    assert_eq!(after.start_ticks(), stat_of(pid, pid).0);
    assert!(!after.exiting);
    // Exited and not yet waited for: a zombie, walked as exiting, its exec unchanged.
    child.kill().unwrap();
    wait_until("the exit", || stat_of(pid, pid).1 == 'Z');
    let mut host = HostTasks::open(&program).unwrap();
    let zombie = host.walk().unwrap().tasks().find(|t| t.sched.tid == pid).expect("a zombie is walked");
    assert!(zombie.exiting, "{zombie:?}");
    assert_eq!((zombie.exec_id, zombie.start_ns), (after.exec_id, after.start_ns));
    child.wait().unwrap();
}

#[test]
fn a_walk_says_whether_a_process_holds_the_file_watched_at_its_descriptor_as_kcmp_would() {
    use std::io::{BufRead, BufReader};
    use std::os::fd::{AsFd, AsRawFd};
    use std::os::unix::process::CommandExt;

    let test = "a_walk_says_whether_a_process_holds_the_file_watched_at_its_descriptor_as_kcmp_would";
    let Some(program) = program(test) else { return };
    let path = std::env::temp_dir().join(format!("hvstats-held-{}", std::process::id()));
    let ours = std::fs::File::create(&path).unwrap();
    let raw = ours.as_raw_fd();
    let mut command = Command::new("sh");
    command
        .args([
            "-c",
            "echo ready; read a; exec 7</dev/null; echo replaced; read b; exec 7<&-; echo closed; read c",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    // SAFETY: between fork and exec the child only calls dup2 or fcntl, which are
    // async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            // Our file may be 7 already (as other tests' descriptors come and go): dup2 onto
            // itself leaves its close-on-exec flag set, so the flag is cleared instead.
            let done = match raw {
                7 => libc::fcntl(7, libc::F_SETFD, 0),
                _ => libc::dup2(raw, 7),
            };
            if done < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().unwrap();
    let pid = child.id() as i32;
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut step = |say: bool| {
        if say {
            writeln!(stdin).unwrap();
        }
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        line.trim().to_owned()
    };
    assert_eq!(step(false), "ready");
    let held = |program: &TaskIterProgram| -> Option<(u32, i32, bool)> {
        let mut host = HostTasks::open(program).unwrap();
        let from_host = host.walk().unwrap().tasks().find(|t| t.sched.tid == pid).unwrap().held;
        let mut own = ProcessTasks::open(program, pid).unwrap();
        let from_own = own.tasks().unwrap().tasks().find(|t| t.sched.tid == pid).unwrap().held;
        assert_eq!(from_host, from_own, "the host's walk and the process's own agree");
        from_host.map(|h| (h.fd, h.ours, h.held))
    };
    assert_eq!(held(&program), None, "not watched: not asked");
    if !program.watch_file(pid, 7, ours.as_fd()) {
        assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "{test}: no held-file check");
        eprintln!("{test}: skipped: this kernel's walk has no held-file check");
        let _ = child.kill();
        let _ = child.wait();
        return;
    }
    assert_eq!(held(&program), Some((7, raw, true)), "the child holds our file at 7 (dup'ed across fork)");
    // Another opening of the same path is another file, as kcmp(KCMP_FILE) tells them apart.
    let other = std::fs::File::open(&path).unwrap();
    assert!(program.watch_file(pid, 7, other.as_fd()));
    assert_eq!(held(&program), Some((7, other.as_raw_fd(), false)), "a later watch replaces the earlier");
    assert!(program.watch_file(pid, 1 << 20, ours.as_fd()));
    assert_eq!(held(&program), Some((1 << 20, raw, false)), "a descriptor past the child's table");
    assert!(program.watch_file(pid, 7, ours.as_fd()));
    assert_eq!(held(&program), Some((7, raw, true)));
    // Not unwatched by a watch that is not the current one.
    program.unwatch_file(pid, 7, other.as_fd());
    assert_eq!(held(&program), Some((7, raw, true)));
    assert_eq!(step(true), "replaced");
    assert_eq!(held(&program), Some((7, raw, false)), "the child put /dev/null at 7");
    assert_eq!(step(true), "closed");
    assert_eq!(held(&program), Some((7, raw, false)), "the child closed 7");
    program.unwatch_file(pid, 7, ours.as_fd());
    assert_eq!(held(&program), None, "unwatched");
    writeln!(stdin).unwrap();
    assert!(child.wait().unwrap().success());
    let _ = std::fs::remove_file(&path);
}
