//! In-kernel counts that outlive the process that counts them: an engine kept in bpffs by one
//! process, which then ends without a word (as a killed observer does), goes on counting this
//! test's thread, and the next process adopts its row with every firing made meanwhile.
//!
//! The counting processes are this test binary run again (`kept_counter`, ignored unless run by
//! the test), so that the counted thread, this test's, lives on while its counters come and go.
//! The tracepoint is `syscalls:sys_enter_getppid`, which fires here without KVM. Needs root
//! (CAP_BPF, CAP_PERFMON, bpffs); without them it says "skipped", and fails under
//! `HVSTATS_REQUIRE_KVM=1`.

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use hvstats_host::bpf::keep;
use hvstats_host::bpf::{Engine, EngineLayout, ThreadTable, TracepointColumn};

fn layout(names: &[&str]) -> EngineLayout {
    EngineLayout {
        counted: names
            .iter()
            .map(|n| TracepointColumn { system: "syscalls".into(), name: (*n).into(), filter: None })
            .collect(),
        ..EngineLayout::default()
    }
}

fn gettid() -> i32 {
    // SAFETY: gettid has no arguments and no memory effects.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

fn getppid(n: usize) {
    for _ in 0..n {
        // SAFETY: getppid has no arguments and no memory effects.
        unsafe { libc::syscall(libc::SYS_getppid) };
    }
}

/// What one counting process said: adopted or added, the count, since when, and its notes.
#[derive(Debug)]
struct Said {
    adopted: bool,
    count: u64,
    since: u64,
    /// The engine's rows.
    rows: u32,
    notes: String,
}

/// Runs a counting process for thread `tid` of `pid` with the columns `names`, keeping its
/// counts for `runtime`; it ends without dropping anything. `None` where it could not count
/// (no BPF), said.
fn try_count_once(runtime: &Path, names: &str, pid: i32, tid: i32) -> Option<Said> {
    try_count_in_vm(runtime, names, pid, tid, 1)
}

/// As [`try_count_once`], the thread running the VM object `vm` (a [`keep::VmToken`]).
fn try_count_in_vm(runtime: &Path, names: &str, pid: i32, tid: i32, vm: u64) -> Option<Said> {
    try_count_in_rows(runtime, names, (pid, tid, vm), None)
}

/// As [`try_count_in_vm`], a new engine holding `rows` threads (`None`: as many as this host is
/// sized for).
fn try_count_in_rows(
    runtime: &Path,
    names: &str,
    thread: (i32, i32, u64),
    rows: Option<u32>,
) -> Option<Said> {
    let (pid, tid, vm) = thread;
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "kept_counter", "--ignored", "--nocapture", "--test-threads=1"])
        .env("HVSTATS_KEPT_RUNTIME", runtime)
        .env("HVSTATS_KEPT_COLUMNS", names)
        .env("HVSTATS_KEPT_THREAD", format!("{pid}:{tid}:{vm}"))
        .env("HVSTATS_KEPT_ROWS", rows.map(|r| r.to_string()).unwrap_or_default())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = stdout.lines().find_map(|l| l.find("kept: ").map(|at| &l[at..])).unwrap_or_else(|| {
        panic!("the counting process said nothing: {stdout}\n{}", String::from_utf8_lossy(&out.stderr))
    });
    if let Some(why) = line.strip_prefix("kept: skipped ") {
        eprintln!("kept_counts: skipped: {why}");
        return None;
    }
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .unwrap_or_else(|| panic!("{k} in {line}"))
            .to_owned()
    };
    Some(Said {
        adopted: field("adopted=") == "true",
        count: field("count=").parse().unwrap(),
        since: field("since=").parse().unwrap(),
        rows: field("rows=").parse().unwrap(),
        notes: stdout.lines().filter(|l| l.contains("note: ")).collect::<Vec<_>>().join("\n"),
    })
}

/// As [`try_count_once`], where the first count showed BPF is there.
fn count_once(runtime: &Path, names: &str, pid: i32, tid: i32) -> Said {
    try_count_once(runtime, names, pid, tid).expect("BPF went away")
}

/// The counting process: claims the thread's kept row or adds it, says its count, and ends
/// with `exit`, dropping nothing (its pins stay, as a killed process's do).
#[test]
#[ignore = "a counting process run by kept_counts_outlive_their_counter"]
fn kept_counter() {
    let (Some(runtime), Some(names), Some(thread)) = (
        std::env::var_os("HVSTATS_KEPT_RUNTIME"),
        std::env::var("HVSTATS_KEPT_COLUMNS").ok(),
        std::env::var("HVSTATS_KEPT_THREAD").ok(),
    ) else {
        return;
    };
    let [pid, tid, vm] = thread.split(':').collect::<Vec<_>>()[..] else { panic!("{thread}") };
    let (pid, tid, vm): (i32, i32, u64) = (pid.parse().unwrap(), tid.parse().unwrap(), vm.parse().unwrap());
    let identity = keep::identity_dir(Path::new(&runtime)).unwrap();
    let names: Vec<&str> = names.split(',').collect();
    let rows = std::env::var("HVSTATS_KEPT_ROWS").ok().and_then(|r| r.parse().ok());
    let layout = EngineLayout { rows, ..layout(&names) };
    let made = Engine::kept(Path::new("/sys/kernel/tracing"), &layout, ThreadTable::for_host(), &identity);
    let (tally, adoption) = match made {
        Ok(made) => made,
        Err(e) => {
            // No BPF here (no CAP_BPF, a kernel without it): said, for the test to skip.
            println!("kept: skipped {}", hvstats_host::error_chain::error_chain(&e));
            std::process::exit(0);
        }
    };
    for note in &adoption.notes {
        println!("note: {note}");
    }
    let (slot, adopted) = match tally.claim(pid, tid, vm) {
        hvstats_host::bpf::Claim::Adopted(slot) => (slot, true),
        hvstats_host::bpf::Claim::OtherVm => {
            println!("note: the thread ran another VM");
            (tally.add_thread_in(pid, tid, vm).unwrap(), false)
        }
        hvstats_host::bpf::Claim::Nothing => (tally.add_thread_in(pid, tid, vm).unwrap(), false),
    };
    let count = tally.read(slot).unwrap()[0];
    let since = tally.kept_since(slot).unwrap();
    let (rows, unclaimed) = (tally.capacity(), tally.unclaimed());
    println!("kept: adopted={adopted} count={count} since={since} rows={rows} unclaimed={unclaimed}");
    std::process::exit(0);
}

/// A runtime directory of its own for the test `name` (`hvstats-<name>-<pid>`) and its identity
/// directory in bpffs; `None`, said, where bpffs cannot be had.
fn kept_place(name: &str) -> Option<(PathBuf, PathBuf)> {
    let runtime = std::env::temp_dir().join(format!("hvstats-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&runtime).unwrap();
    match keep::identity_dir(&runtime) {
        Ok(identity) => Some((runtime, identity)),
        Err(e) => {
            assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "bpffs: {e}");
            eprintln!("{name}: skipped: bpffs: {e}");
            None
        }
    }
}

/// The kept layout directories of `runtime`'s identity.
fn layouts(identity: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(identity).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default()
}

#[test]
fn kept_counts_outlive_their_counter_and_are_adopted_only_by_the_same_thread_vm_and_programs() {
    let Some((runtime, identity)) = kept_place("kept") else { return };
    let (me, tid) = (std::process::id() as i32, gettid());

    // The first counter adds this thread, then ends.
    let Some(first) = try_count_once(&runtime, "sys_enter_getppid", me, tid) else {
        assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "no BPF to keep counts with");
        return;
    };
    assert!(!first.adopted, "{first:?}");
    assert_eq!(layouts(&identity).len(), 1, "one layout kept");
    // While no counter runs, the kernel goes on counting.
    getppid(700);
    let second = count_once(&runtime, "sys_enter_getppid", me, tid);
    assert!(second.adopted, "{second:?}");
    assert_eq!(second.count, first.count + 700, "{second:?}");
    assert_eq!(second.since, first.since, "the row counts since the first counter added it");
    getppid(300);
    let third = count_once(&runtime, "sys_enter_getppid", me, tid);
    assert_eq!((third.adopted, third.count, third.since), (true, first.count + 1000, first.since));

    // Another thread under this thread's id is not this thread: a thread of a process gone is
    // dropped at the next start, and another process's claim is refused.
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let sleeper_pid = sleeper.id() as i32;
    let counted = count_once(&runtime, "sys_enter_getppid", sleeper_pid, sleeper_pid);
    assert!(!counted.adopted);
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    let after = count_once(&runtime, "sys_enter_getppid", me, tid);
    assert!(after.adopted, "{after:?}");
    assert!(after.notes.contains("1 thread(s) gone while no observer ran"), "{}", after.notes);

    // The same thread running another VM object is not adopted: its row is dropped and counts
    // anew, from now; the next claim for that VM adopts the new row.
    getppid(10);
    let replaced = try_count_in_vm(&runtime, "sys_enter_getppid", me, tid, 2).unwrap();
    assert!(!replaced.adopted && replaced.notes.contains("another VM"), "{replaced:?}");
    assert!(replaced.since > first.since, "a new origin: {replaced:?}");
    let again = try_count_in_vm(&runtime, "sys_enter_getppid", me, tid, 2).unwrap();
    assert_eq!((again.adopted, again.since), (true, replaced.since), "{again:?}");
    // A VM that could not be told (0) is never adopted, even by the same thread and token.
    let unknown = try_count_in_vm(&runtime, "sys_enter_getppid", me, tid, 0).unwrap();
    assert!(!unknown.adopted);
    assert!(!try_count_in_vm(&runtime, "sys_enter_getppid", me, tid, 0).unwrap().adopted);

    // Another layout of the programs drops the kept counts, says so, and counts anew.
    let other = count_once(&runtime, "sys_enter_getppid,sys_enter_getpid", me, tid);
    assert!(!other.adopted, "{other:?}");
    assert!(other.notes.contains("other version or layout"), "{}", other.notes);
    assert!(other.since >= first.since);
    assert_eq!(layouts(&identity).len(), 1, "only the new layout is kept");

    keep::remove_tree(&identity);
    std::fs::remove_dir(&runtime).unwrap();

    // A runtime directory gone takes its kept counts with it at the next start anywhere, once
    // they count no live thread (one this process cannot see may be another namespace's).
    let gone = std::env::temp_dir().join(format!("hvstats-kept-gone-{}", std::process::id()));
    std::fs::create_dir_all(&gone).unwrap();
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
    let worker = std::thread::spawn(move || {
        tid_tx.send(gettid()).unwrap();
        let _ = end_rx.recv();
    });
    let worker_tid = tid_rx.recv().unwrap();
    assert!(!count_once(&gone, "sys_enter_getppid", me, worker_tid).adopted);
    let gone_identity = keep::identity_dir(&gone).unwrap();
    std::fs::remove_dir(&gone).unwrap();
    let elsewhere = std::env::temp_dir().join(format!("hvstats-kept-other-{}", std::process::id()));
    std::fs::create_dir_all(&elsewhere).unwrap();
    let other_identity = keep::identity_dir(&elsewhere).unwrap();
    assert!(gone_identity.exists(), "the kept counts of a live thread were removed");
    end_tx.send(()).unwrap();
    worker.join().unwrap();
    keep::identity_dir(&elsewhere).unwrap();
    assert!(!gone_identity.exists(), "{} outlived its runtime directory and thread", gone_identity.display());
    keep::remove_tree(&other_identity);
    std::fs::remove_dir(&elsewhere).unwrap();
}

#[test]
fn kept_rows_survive_a_change_of_the_rows_a_new_engine_would_have() {
    let Some((runtime, identity)) = kept_place("kept-rows") else { return };
    let me = (std::process::id() as i32, gettid(), 1);
    // An engine of 8 rows keeps this thread's row; the next observer would size one for this
    // host (4,096 rows or more), and one after that for 16.
    let Some(small) = try_count_in_rows(&runtime, "sys_enter_getppid", me, Some(8)) else {
        assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "no BPF to keep counts with");
        return;
    };
    assert_eq!((small.adopted, small.rows), (false, 8), "{small:?}");
    getppid(250);
    let host = try_count_in_rows(&runtime, "sys_enter_getppid", me, None).unwrap();
    assert_eq!((host.adopted, host.count, host.since), (true, small.count + 250, small.since), "{host:?}");
    assert_eq!(host.rows, 8, "the kept engine is adopted with its rows: {host:?}");
    assert!(!host.notes.contains("dropped"), "{}", host.notes);
    getppid(50);
    let other = try_count_in_rows(&runtime, "sys_enter_getppid", me, Some(16)).unwrap();
    assert_eq!((other.adopted, other.count), (true, small.count + 300), "{other:?}");
    keep::remove_tree(&identity);
    std::fs::remove_dir_all(&runtime).unwrap();
}

/// The threads `HVSTATS_KEPT_THREADS` names (`pid:tid:vm`, comma-separated).
fn kept_threads() -> Vec<(i32, i32, u64)> {
    let threads = std::env::var("HVSTATS_KEPT_THREADS").unwrap_or_default();
    threads
        .split(',')
        .filter(|t| !t.is_empty())
        .map(|t| {
            let [pid, tid, vm] = t.split(':').collect::<Vec<_>>()[..] else { panic!("{t}") };
            (pid.parse().unwrap(), tid.parse().unwrap(), vm.parse().unwrap())
        })
        .collect()
}

/// A counting process for the grown engines' test: with `HVSTATS_KEPT_GROW` set, it keeps the
/// first of its threads in an engine of one row and the second in an engine grown beside it
/// (as a list grows its engines when their rows are all in use); else it makes the list a
/// restarted observer makes, keeping its counts in the same place, and opens each thread's
/// counters. It says each thread's count and whether its row was adopted, and ends with `exit`,
/// dropping nothing.
#[test]
#[ignore = "a counting process run by kept_rows_of_an_engine_grown_beside_the_first_are_adopted_with_it"]
fn kept_tally() {
    use hvstats_host::counting::{EventList, EventSpec, Method, ThreadEvents};
    let Some(runtime) = std::env::var_os("HVSTATS_KEPT_RUNTIME") else { return };
    let identity = keep::identity_dir(Path::new(&runtime)).unwrap();
    let threads = kept_threads();
    if std::env::var_os("HVSTATS_KEPT_GROW").is_some() {
        let tracefs = Path::new("/sys/kernel/tracing");
        let layout = EngineLayout { rows: Some(1), ..layout(&["sys_enter_getppid"]) };
        let made =
            Engine::kept(tracefs, &layout, ThreadTable::for_host(), &identity).and_then(|(first, _)| {
                Engine::kept_grown(tracefs, &layout, ThreadTable::for_host(), &identity, 1)
                    .map(|(grown, _)| (first, grown))
            });
        let (first, grown) = match made {
            Ok(made) => made,
            Err(e) => {
                println!("kept: skipped {}", hvstats_host::error_chain::error_chain(&e));
                std::process::exit(0);
            }
        };
        for (engine, &(pid, tid, vm)) in [&first, &grown].into_iter().zip(&threads) {
            let slot = engine.add_thread_in(pid, tid, vm).unwrap();
            println!("kept: tid={tid} adopted=false count={}", engine.read(slot).unwrap()[0]);
        }
        std::process::exit(0);
    }
    let spec =
        EventSpec::Tracepoint { system: "syscalls".into(), name: "sys_enter_getppid".into(), filter: None };
    let events = EventList::kept_in(vec![spec], &identity);
    assert_eq!(events.method(), Method::InKernel, "{}", events.method_description());
    for note in hvstats_host::counting::kept_notes() {
        println!("note: {note}");
    }
    for &(pid, tid, vm) in &threads {
        let mut counters = ThreadEvents::open_in(pid, tid, keep::VmToken::from(vm), &events);
        let count = counters.read(&events)[0].unwrap();
        let adopted = counters.kept_since().is_some();
        println!("kept: tid={tid} adopted={adopted} count={count} in_engine={}", counters.in_engine());
    }
    println!("kept: rows={:?}", events.engine_rows());
    std::process::exit(0);
}

/// Runs [`kept_tally`] for `threads` (growing the engines when `grow`): its lines that say
/// something, or `None` where it could not count (no BPF), said.
fn run_kept_tally(runtime: &Path, threads: &[(i32, i32, u64)], grow: bool) -> Option<Vec<String>> {
    let listed: Vec<String> = threads.iter().map(|(p, t, v)| format!("{p}:{t}:{v}")).collect();
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "kept_tally", "--ignored", "--nocapture", "--test-threads=1"])
        .env("HVSTATS_KEPT_RUNTIME", runtime)
        .env("HVSTATS_KEPT_THREADS", listed.join(","));
    if grow {
        command.env("HVSTATS_KEPT_GROW", "1");
    }
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let said: Vec<String> = stdout
        .lines()
        .filter_map(|l| l.find("kept: ").or_else(|| l.find("note: ")).map(|at| l[at..].to_owned()))
        .collect();
    assert!(
        said.iter().any(|l| l.starts_with("kept: ")),
        "the counting process said nothing: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    if let Some(why) = said.iter().find_map(|l| l.strip_prefix("kept: skipped ")) {
        assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "no BPF to keep counts with: {why}");
        eprintln!("kept_grown: skipped: {why}");
        return None;
    }
    Some(said)
}

#[test]
fn kept_rows_of_an_engine_grown_beside_the_first_are_adopted_with_it() {
    let Some((runtime, identity)) = kept_place("kept-grown") else { return };
    // This test's thread and one more, each counted by getppid on its own.
    let (tx, rx) = std::sync::mpsc::channel::<usize>();
    let (done_tx, done) = std::sync::mpsc::channel::<i32>();
    let helper = std::thread::spawn(move || {
        done_tx.send(gettid()).unwrap();
        for n in rx {
            getppid(n);
            done_tx.send(0).unwrap();
        }
    });
    let helper_tid = done.recv().unwrap();
    let me = std::process::id() as i32;
    let threads = [(me, gettid(), 7), (me, helper_tid, 7)];
    let Some(made) = run_kept_tally(&runtime, &threads, true) else { return };
    assert!(made.iter().filter(|l| l.contains("count=0")).count() == 2, "{made:?}");
    // The engines count on with no process holding them.
    getppid(100);
    tx.send(200).unwrap();
    done.recv().unwrap();
    let restarted = run_kept_tally(&runtime, &threads, false).unwrap();
    for ((_, tid, _), count) in threads.iter().zip([100, 200]) {
        let line = format!("kept: tid={tid} adopted=true count={count} in_engine=true");
        assert!(restarted.contains(&line), "{line} in {restarted:#?}");
    }
    assert!(restarted.iter().any(|l| l.starts_with("kept: rows=Some((2, ")), "{restarted:#?}");
    assert!(!restarted.iter().any(|l| l.contains("dropped")), "{restarted:#?}");
    drop(tx);
    helper.join().unwrap();
    keep::remove_tree(&identity);
    std::fs::remove_dir_all(&runtime).unwrap();
}
