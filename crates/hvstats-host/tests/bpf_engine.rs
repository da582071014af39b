//! In-kernel counting with programs assembled by hvstats, tested for real on tracepoints that fire
//! on this machine: `syscalls:sys_enter_getppid` (no fields to speak of) and
//! `syscalls:sys_enter_getpriority` (two `int` arguments, classified as the observer classifies
//! `kvm_exit` by exit reason), on threads of this test process. Needs root (CAP_BPF and
//! CAP_PERFMON); without them it says "skipped", and fails under `HVSTATS_REQUIRE_KVM=1`.

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use hvstats_host::bpf::{
    CarriedColumn, Engine, EngineError, EngineLayout, SpanColumn, ThreadTable, TracepointColumn,
};

fn tracefs() -> &'static Path {
    Path::new("/sys/kernel/tracing")
}

fn column(name: &str, filter: Option<&str>) -> TracepointColumn {
    TracepointColumn { system: "syscalls".into(), name: name.into(), filter: filter.map(Into::into) }
}

/// The engine, or `None` (after saying why) where this host does not allow BPF.
fn engine(columns: &[TracepointColumn], test: &str) -> Option<Engine> {
    engine_with(columns, test, None)
}

fn engine_with(columns: &[TracepointColumn], test: &str, table: Option<ThreadTable>) -> Option<Engine> {
    let made = match table {
        Some(table) => Engine::with_table(tracefs(), columns, table),
        None => Engine::new(tracefs(), columns),
    };
    match made {
        Ok(t) => Some(t),
        Err(e @ (EngineError::Map(_) | EngineError::Format { .. })) => {
            let why = hvstats_host::error_chain::error_chain(&e);
            assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "{test}: {why}");
            eprintln!("{test}: skipped: {why}");
            None
        }
        Err(e) => panic!("{test}: {}", hvstats_host::error_chain::error_chain(&e)),
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

fn getpriority(which: i32, who: i32) {
    // SAFETY: getpriority reads its two integers; an invalid `which` is EINVAL.
    unsafe { libc::syscall(libc::SYS_getpriority, which, who) };
}

#[test]
fn a_thread_is_counted_exactly_from_zero_and_other_threads_not_at_all() {
    // Both thread tables: an array where pid_max is small, a hash where it is not.
    for table in [ThreadTable::Array, ThreadTable::Hash] {
        a_thread_is_counted_exactly_with(table);
    }
}

fn a_thread_is_counted_exactly_with(table: ThreadTable) {
    let Some(t) =
        engine_with(&[column("sys_enter_getppid", None)], "a_thread_is_counted_exactly", Some(table))
    else {
        return;
    };
    let me = std::process::id() as i32;
    getppid(10); // before: not counted
    let slot = t.add_thread(me, gettid()).unwrap();
    getppid(1234);
    let other = std::thread::spawn(|| getppid(500));
    other.join().unwrap();
    assert_eq!(t.read(slot).unwrap(), vec![1234]);
    // A second thread gets its own row; a removed one stops counting.
    let (tx, rx) = std::sync::mpsc::channel();
    let (go_tx, go) = std::sync::mpsc::channel::<()>();
    let worker = std::thread::spawn(move || {
        tx.send(gettid()).unwrap();
        go.recv().unwrap();
        getppid(77);
    });
    let worker_slot = t.add_thread(me, rx.recv().unwrap()).unwrap();
    go_tx.send(()).unwrap();
    worker.join().unwrap();
    assert_eq!(t.read(worker_slot).unwrap(), vec![77]);
    t.remove_thread(gettid());
    getppid(5);
    assert_eq!(t.read(slot).unwrap(), vec![1234], "a removed thread's row no longer moves");
    // The slot is reused from zero.
    let again = t.add_thread(me, gettid()).unwrap();
    getppid(3);
    assert_eq!(t.read(again).unwrap(), vec![3]);
}

#[test]
fn a_thread_id_of_another_process_is_not_counted() {
    let Some(t) = engine(&[column("sys_enter_getppid", None)], "a_thread_id_of_another_process") else {
        return;
    };
    // Our thread id under a process id that is not ours: the program checks both.
    let slot = t.add_thread(std::process::id() as i32 + 1, gettid()).unwrap();
    getppid(100);
    assert_eq!(t.read(slot).unwrap(), vec![0]);
}

#[test]
fn columns_classify_each_firing_by_its_fields_as_the_filters_say() {
    // `which` stands for kvm_exit's exit_reason and `who` for its intr_info.
    let filters = [
        None,
        Some("which == 10"),
        Some("which == 31 || which == 32"),
        Some("(which >= 40 && which <= 49)"),
        Some("(which == 0 && who == 0x80000b0e)"),
        Some("which != 10 && which != 31"),
        Some("(who & 262144) && !(who & 524288)"),
        Some("who > 0x7fffffff"),
    ];
    let columns: Vec<TracepointColumn> =
        filters.iter().map(|f| column("sys_enter_getpriority", *f)).collect();
    let Some(t) = engine(&columns, "columns_classify_each_firing") else { return };
    let slot = t.add_thread(std::process::id() as i32, gettid()).unwrap();
    let calls: &[(i32, i32, u32)] = &[
        (10, 0, 7),
        (31, 0, 3),
        (32, 0, 4),
        (45, 0, 5),
        (49, 0, 1),
        (50, 0, 2),
        (0, 0x8000_0b0eu32 as i32, 6),
        (0, 0x8000_0b0fu32 as i32, 1),
        (1000, 262_144, 8),
        (1000, 262_144 | 524_288, 9),
    ];
    for &(which, who, n) in calls {
        for _ in 0..n {
            getpriority(which, who);
        }
    }
    let expected: Vec<u64> = filters
        .iter()
        .map(|f| {
            calls
                .iter()
                .filter(|&&(w, o, _)| match *f {
                    None => true,
                    Some("which == 10") => w == 10,
                    Some("which == 31 || which == 32") => w == 31 || w == 32,
                    Some("(which >= 40 && which <= 49)") => (40..=49).contains(&w),
                    Some("(which == 0 && who == 0x80000b0e)") => w == 0 && o as u32 == 0x8000_0b0e,
                    Some("which != 10 && which != 31") => w != 10 && w != 31,
                    Some("(who & 262144) && !(who & 524288)") => o & 262_144 != 0 && o & 524_288 == 0,
                    Some("who > 0x7fffffff") => o as u32 > 0x7fff_ffff,
                    Some(other) => panic!("no model for {other}"),
                })
                .map(|&(_, _, n)| u64::from(n))
                .sum()
        })
        .collect();
    assert_eq!(t.read(slot).unwrap(), expected);
}

#[test]
fn a_filter_the_program_cannot_evaluate_leaves_its_tracepoint_refused_and_others_counted() {
    let columns = [column("sys_enter_getppid", None), column("sys_enter_getpriority", Some("nope == 1"))];
    let Some(t) = engine(&columns, "a_filter_the_program_cannot_evaluate") else { return };
    assert_eq!(t.refused(0), None);
    assert!(t.refused(1).is_some_and(|why| why.contains("nope")), "{:?}", t.refused(1));
    let slot = t.add_thread(std::process::id() as i32, gettid()).unwrap();
    getppid(9);
    assert_eq!(t.read(slot).unwrap()[0], 9);
}

#[test]
fn a_perf_counter_on_the_same_tracepoint_still_counts_every_firing() {
    // A classic tracepoint program returning 0 would hide every firing from every perf event on
    // the tracepoint: another tool's `perf stat` would read 0.
    let Some(t) = engine(&[column("sys_enter_getppid", None)], "a_perf_counter_on_the_same_tracepoint")
    else {
        return;
    };
    let id: u64 = std::fs::read_to_string(tracefs().join("events/syscalls/sys_enter_getppid/id"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let perf =
        hvstats_host::perf_event::PerfCounter::open(hvstats_host::perf_event::TYPE_TRACEPOINT, id, gettid())
            .unwrap();
    let slot = t.add_thread(std::process::id() as i32, gettid()).unwrap();
    getppid(321);
    assert_eq!(t.read(slot).unwrap(), vec![321]);
    assert_eq!(perf.read().unwrap(), 321);
}

fn clock_nanosleep(clock: libc::clockid_t, ms: i64) {
    let ts = libc::timespec { tv_sec: 0, tv_nsec: ms * 1_000_000 };
    // SAFETY: clock_nanosleep reads the timespec we own; no remainder is asked for.
    let r = unsafe { libc::clock_nanosleep(clock, 0, &ts, std::ptr::null_mut()) };
    assert_eq!(r, 0);
}

#[test]
fn spans_time_each_class_from_its_start_to_the_next_end_on_the_same_thread() {
    // clock_nanosleep's entry opens a span classified by clock (as kvm_exit's by exit reason),
    // its return closes it (as kvm_entry): each span column is the time slept on that clock.
    let span = |filter: &str| SpanColumn {
        start: column("sys_enter_clock_nanosleep", Some(filter)),
        end_system: "syscalls".into(),
        end_name: "sys_exit_clock_nanosleep".into(),
    };
    let counted = [column("sys_enter_clock_nanosleep", None), column("sys_exit_clock_nanosleep", None)];
    let spans = [span("which_clock == 1"), span("which_clock == 0")];
    let made = Engine::with_spans(tracefs(), &counted, &spans, ThreadTable::Array);
    let t = match made {
        Ok(t) => t,
        Err(e @ (EngineError::Map(_) | EngineError::Format { .. })) => {
            let why = hvstats_host::error_chain::error_chain(&e);
            assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "{why}");
            eprintln!("spans_time_each_class: skipped: {why}");
            return;
        }
        Err(e) => panic!("{}", hvstats_host::error_chain::error_chain(&e)),
    };
    assert!((0..4).all(|i| t.refused(i).is_none()));
    let slot = t.add_thread(std::process::id() as i32, gettid()).unwrap();
    // Another thread's sleeps are not ours.
    let other = std::thread::spawn(|| clock_nanosleep(libc::CLOCK_MONOTONIC, 30));
    let started = std::time::Instant::now();
    for _ in 0..5 {
        clock_nanosleep(libc::CLOCK_MONOTONIC, 3);
    }
    let monotonic_wall = started.elapsed().as_nanos() as u64;
    let started = std::time::Instant::now();
    for _ in 0..4 {
        clock_nanosleep(libc::CLOCK_REALTIME, 1);
    }
    let realtime_wall = started.elapsed().as_nanos() as u64;
    other.join().unwrap();
    let row = t.read(slot).unwrap();
    assert_eq!(row[..2], [9, 9], "{row:?}");
    // Each span lasts at least the sleep asked for and at most the time its loop took.
    assert!((15_000_000..=monotonic_wall).contains(&row[2]), "{row:?}, {monotonic_wall} ns");
    assert!((4_000_000..=realtime_wall).contains(&row[3]), "{row:?}, {realtime_wall} ns");
    // A span is closed once: returns without a new start add nothing.
    getppid(10);
    assert_eq!(t.read(slot).unwrap(), row);
}

#[test]
fn a_rehearsal_counts_each_record_as_the_attached_program_counts_the_same_firing() {
    // The same columns, attached to sys_enter_getpriority and fired by real calls, and rehearsed:
    // the kernel runs the rehearsed program (BPF_PROG_TEST_RUN) on records laid out from the
    // format, one per call. Both must count alike.
    let filters = [
        None,
        Some("which == 10"),
        Some("which == 31 || which == 32"),
        Some("(which >= 40 && which <= 49) && !(which == 44 && who == 0x10b0)"),
        Some("(which == 0 && (who == 0xb0e || who == 0x1b0e))"),
        Some("(which & 0xc000000) && (which == 0x400000c || which == 0xc00000c)"),
    ];
    let columns: Vec<TracepointColumn> =
        filters.iter().map(|f| column("sys_enter_getpriority", *f)).collect();
    let Some(attached) = engine(&columns, "a_rehearsal_counts_each_record") else { return };
    let format =
        std::fs::read_to_string(tracefs().join("events/syscalls/sys_enter_getpriority/format")).unwrap();
    let formats = |system: &str, name: &str| (system, name) == ("syscalls", "sys_enter_getpriority");
    let rehearsal = Engine::rehearsal(
        &|s, n| formats(s, n).then(|| format.clone()),
        &columns,
        &[],
        ThreadTable::for_host(),
    )
    .unwrap();
    assert_eq!(
        rehearsal.context("syscalls", "sys_enter_getpriority"),
        Some(hvstats_host::bpf::Context::Record)
    );
    let me = std::process::id() as i32;
    let (real, rehearsed) =
        (attached.add_thread(me, gettid()).unwrap(), rehearsal.add_thread(me, gettid()).unwrap());
    let calls: &[(i32, i32, u32)] = &[
        (10, 0, 7),
        (31, 0, 3),
        (32, 0, 4),
        (44, 0x10b0, 5),
        (44, 0x10c0, 2),
        (49, 0, 1),
        (0, 0xb0e, 6),
        (0, 0x1b0e, 2),
        (0, 0x306, 1),
        (0x400_000c, 0, 3),
        (0x800_000c, 0, 1),
        (0xc00_000c, 0, 2),
    ];
    let fields = hvstats_host::bpf::filter::parse_format(&format);
    let id: u64 = format.lines().find_map(|l| l.strip_prefix("ID: ")).unwrap().trim().parse().unwrap();
    let mut record = vec![0u8; 32];
    let put = |record: &mut Vec<u8>, name: &str, v: u64| {
        let f = fields[name];
        let at = usize::from(f.offset);
        record[at..at + usize::from(f.size)].copy_from_slice(&v.to_le_bytes()[..usize::from(f.size)]);
    };
    put(&mut record, "common_type", id);
    put(&mut record, "common_pid", gettid() as u64);
    put(&mut record, "__syscall_nr", libc::SYS_getpriority as u64);
    for &(which, who, n) in calls {
        put(&mut record, "which", which as u64);
        put(&mut record, "who", who as u64);
        for _ in 0..n {
            getpriority(which, who);
            assert_eq!(rehearsal.fire("syscalls", "sys_enter_getpriority", &record).unwrap(), 1);
        }
    }
    let counts = attached.read(real).unwrap();
    assert_eq!(rehearsal.read(rehearsed).unwrap(), counts);
    assert_eq!(counts, vec![37, 7, 7, 3, 8, 5]);
    // A rehearsal runs only what it rehearses; an attached engine runs nothing on demand; the
    // kernel refuses a context longer than a raw tracepoint's.
    assert!(matches!(
        rehearsal.fire("syscalls", "sys_enter_getppid", &record),
        Err(EngineError::NotRehearsed(_))
    ));
    assert!(matches!(
        attached.fire("syscalls", "sys_enter_getpriority", &record),
        Err(EngineError::NotRehearsed(_))
    ));
    assert!(matches!(
        rehearsal.fire("syscalls", "sys_enter_getpriority", &[0u8; 104]),
        Err(EngineError::Run { .. })
    ));
    // A tracepoint without a format is not counted, and says so.
    let without = Engine::rehearsal(
        &|s, n| formats(s, n).then(|| format.clone()),
        &[column("sys_enter_getppid", None), column("sys_enter_getpriority", None)],
        &[],
        ThreadTable::for_host(),
    )
    .unwrap();
    assert!(without.refused(0).is_some_and(|why| why.contains("no format")), "{:?}", without.refused(0));
    assert_eq!(without.refused(1), None);
}

fn syscall0(nr: libc::c_long) {
    // SAFETY: the calls used here (getpid, gettid) have no arguments and no memory effects.
    unsafe { libc::syscall(nr) };
}

#[test]
fn a_carried_column_adds_what_the_threads_record_before_it_left_and_spans_of_two_ends_do_not_close_each_other()
 {
    // getpriority plays kvm_hv_hypercall (its `who` the rep count, `which == 7` the codes of a
    // kind), getppid the flush record after it: each getppid adds the `who` of the thread's last
    // getpriority when that one's `which` was 7, else nothing. And two spans of two ends, as
    // kvm_exit → kvm_entry holds kvm_hv_hypercall → kvm_hv_hypercall_done: getpriority → getpid
    // and getppid → gettid, the second opened inside the first.
    let test = "a_carried_column_adds_what_the_threads_record_before_it_left";
    let carried = |filter: Option<&str>, weight: Option<&str>| CarriedColumn {
        counted: column("sys_enter_getppid", filter),
        from: column("sys_enter_getpriority", Some("which == 7")),
        weight: weight.map(Into::into),
    };
    let span = |start: &str, end: &str| SpanColumn {
        start: column(start, None),
        end_system: "syscalls".into(),
        end_name: end.into(),
    };
    let layout = EngineLayout {
        counted: vec![column("sys_enter_getppid", None)],
        spans: vec![
            span("sys_enter_getpriority", "sys_enter_getpid"),
            span("sys_enter_getppid", "sys_enter_gettid"),
        ],
        carried: vec![carried(None, Some("who")), carried(None, None)],
        rows: None,
    };
    let t = match Engine::of_layout(tracefs(), &layout, ThreadTable::for_host()) {
        Ok(t) => t,
        Err(e @ (EngineError::Map(_) | EngineError::Format { .. })) => {
            let why = hvstats_host::error_chain::error_chain(&e);
            assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "{test}: {why}");
            eprintln!("{test}: skipped: {why}");
            return;
        }
        Err(e) => panic!("{test}: {}", hvstats_host::error_chain::error_chain(&e)),
    };
    for i in 0..5 {
        assert_eq!(t.refused(i), None, "column {i}");
    }
    let slot = t.add_thread(std::process::id() as i32, gettid()).unwrap();
    let read = || t.read(slot).unwrap();
    let before = read();
    // Nothing carried yet: a getppid adds nothing to the carried columns.
    getppid(1);
    syscall0(libc::SYS_gettid);
    getpriority(7, 5);
    getppid(2); // 5 each, one each
    getpriority(0, 9); // not of the kind: carries nothing
    getppid(1);
    getpriority(7, 3);
    getppid(1); // 3, one
    syscall0(libc::SYS_gettid);
    syscall0(libc::SYS_getpid);
    let after = read();
    let added: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(added[0], 5, "every getppid");
    assert_eq!((added[3], added[4]), (5 + 5 + 3, 3), "carried: the weights, the firings");
    // Both spans were timed, and each closed on its own end.
    assert!(added[1] > 0 && added[2] > 0, "{added:?}");
    assert_eq!(t.open_spans(slot).unwrap(), vec![None, None]);
    // A span of one end left open is not closed by the other's end.
    getpriority(0, 0);
    syscall0(libc::SYS_gettid);
    assert_eq!(t.open_spans(slot).unwrap(), vec![Some(1), None]);
    syscall0(libc::SYS_getpid);
    assert_eq!(t.open_spans(slot).unwrap(), vec![None, None]);
}

/// Threads of this process, parked until [`Crowd::count`]: the `i`-th then calls getppid `i + 1`
/// times, and all stay alive (their ids not reused) until [`Crowd::end`].
struct Crowd {
    tids: Vec<i32>,
    go: std::sync::Arc<std::sync::Barrier>,
    counted: std::sync::Arc<std::sync::Barrier>,
    done: std::sync::Arc<std::sync::Barrier>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Crowd {
    fn spawn(n: usize) -> Self {
        use std::sync::{Arc, Barrier};
        let [go, counted, done] = [(); 3].map(|()| Arc::new(Barrier::new(n + 1)));
        let (tx, rx) = std::sync::mpsc::channel();
        let threads = (0..n)
            .map(|i| {
                let (tx, go, counted, done) = (tx.clone(), go.clone(), counted.clone(), done.clone());
                std::thread::Builder::new()
                    .stack_size(64 << 10)
                    .spawn(move || {
                        tx.send((i, gettid())).unwrap();
                        go.wait();
                        getppid(i + 1);
                        counted.wait();
                        done.wait();
                    })
                    .unwrap()
            })
            .collect();
        let mut tids = vec![0; n];
        for _ in 0..n {
            let (i, tid) = rx.recv().unwrap();
            tids[i] = tid;
        }
        Crowd { tids, go, counted, done, threads }
    }

    /// Lets every thread count, and returns once all have.
    fn count(&self) {
        self.go.wait();
        self.counted.wait();
    }

    fn end(self) {
        self.done.wait();
        for t in self.threads {
            t.join().unwrap();
        }
    }
}

#[test]
fn the_1100th_thread_and_every_one_before_it_are_counted_in_the_kernel() {
    let Some(t) = engine(&[column("sys_enter_getppid", None)], "the_1100th_thread") else { return };
    let layout = EngineLayout { counted: vec![column("sys_enter_getppid", None)], ..EngineLayout::default() };
    println!(
        "rows: {} (this host: {}), {} bytes a row of one column, {} KiB of rows",
        t.capacity(),
        hvstats_host::bpf::rows_for_host(&layout),
        layout.row_bytes(),
        u64::from(t.capacity()) * layout.row_bytes() / 1024
    );
    assert!(t.capacity() >= hvstats_host::bpf::MIN_ROWS, "{}", t.capacity());
    let me = std::process::id() as i32;
    let crowd = Crowd::spawn(1100);
    let slots: Vec<_> = crowd.tids.iter().map(|&tid| t.add_thread(me, tid).unwrap()).collect();
    crowd.count();
    for (i, &slot) in slots.iter().enumerate() {
        assert_eq!(t.read(slot).unwrap(), vec![i as u64 + 1], "thread {} of 1100", i + 1);
    }
    assert_eq!(t.turned_away(), 0);
    for &tid in &crowd.tids {
        t.remove_thread(tid);
    }
    crowd.end();
}

#[test]
fn an_engine_made_while_the_host_runs_more_threads_than_its_least_rows_holds_every_one_of_them() {
    // Half the least rows and more, running before the engine is made: sized for twice the
    // host's threads, it holds each (and MIN_ROWS alone would not hold twice them).
    let crowd = Crowd::spawn(hvstats_host::bpf::MIN_ROWS as usize / 2 + 400);
    let Some(t) = engine(&[column("sys_enter_getppid", None)], "an_engine_made_while") else {
        crowd.count();
        return crowd.end();
    };
    assert!(t.capacity() >= 2 * crowd.tids.len() as u32, "{} rows", t.capacity());
    let me = std::process::id() as i32;
    let slots: Vec<_> = crowd.tids.iter().map(|&tid| t.add_thread(me, tid).unwrap()).collect();
    crowd.count();
    for (i, &slot) in slots.iter().enumerate() {
        assert_eq!(t.read(slot).unwrap(), vec![i as u64 + 1], "thread {} of {}", i + 1, slots.len());
    }
    assert_eq!(t.turned_away(), 0);
    for &tid in &crowd.tids {
        t.remove_thread(tid);
    }
    crowd.end();
}

#[test]
fn past_its_rows_a_thread_is_turned_away_until_a_row_frees() {
    let layout = EngineLayout {
        counted: vec![column("sys_enter_getppid", None)],
        rows: Some(8),
        ..EngineLayout::default()
    };
    let t = match Engine::of_layout(tracefs(), &layout, ThreadTable::for_host()) {
        Ok(t) => t,
        Err(e) => {
            let why = hvstats_host::error_chain::error_chain(&e);
            assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "{why}");
            return eprintln!("past_its_rows: skipped: {why}");
        }
    };
    assert_eq!((t.capacity(), t.rows_free()), (8, 8));
    let me = std::process::id() as i32;
    let crowd = Crowd::spawn(9);
    let slots: Vec<_> = crowd.tids[..8].iter().map(|&tid| t.add_thread(me, tid).unwrap()).collect();
    assert!(matches!(t.add_thread(me, crowd.tids[8]), Err(EngineError::Full(8))));
    assert_eq!((t.rows_free(), t.turned_away()), (0, 1));
    t.remove_thread(crowd.tids[0]);
    let ninth = t.add_thread(me, crowd.tids[8]).unwrap();
    crowd.count();
    assert_eq!(t.read(ninth).unwrap(), vec![9], "the ninth counts in the row the first left");
    assert_eq!(t.read(slots[7]).unwrap(), vec![8]);
    crowd.end();
}

#[test]
fn past_the_first_engines_rows_an_engine_grows_beside_it_and_every_thread_is_counted_in_the_kernel() {
    use hvstats_host::counting::{EventList, EventSpec, Method, ThreadEvents, full_notes};
    let spec =
        EventSpec::Tracepoint { system: "syscalls".into(), name: "sys_enter_getppid".into(), filter: None };
    let events = EventList::new(vec![spec]);
    if events.method() != Method::InKernel {
        let why = events.method_description();
        assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "{why}");
        return eprintln!("an_engine_grows: skipped: {why}");
    }
    let (first, free) = events.engine_rows().unwrap();
    assert!(free > first as usize, "rows may grow past the first engine's {first}: {free} free");
    let me = std::process::id() as i32;
    let crowd = Crowd::spawn(first as usize + 2);
    let mut threads: Vec<ThreadEvents> =
        crowd.tids.iter().map(|&tid| ThreadEvents::open(me, tid, &events)).collect();
    let past: Vec<usize> = (0..threads.len()).filter(|&i| !threads[i].in_engine()).collect();
    assert_eq!(past, [0usize; 0], "threads not in the kernel, of {}", threads.len());
    assert_eq!(threads.iter().map(ThreadEvents::fds).sum::<usize>(), 0, "no perf counter");
    assert_eq!(events.engine_rows().map(|(rows, _)| rows), Some(2 * first), "one engine grown");
    assert!(!full_notes().iter().any(|n| n.contains(&format!("process {me},"))), "no fallback said");
    crowd.count();
    for (i, thread) in threads.iter_mut().enumerate() {
        assert_eq!(thread.read(&events), [Some(i as u64 + 1)], "thread {} of {}", i + 1, crowd.tids.len());
    }
    drop(threads);
    crowd.end();
}

#[test]
fn past_the_engines_rows_threads_are_counted_by_perf_and_that_is_said_once() {
    use hvstats_host::counting::{EventList, EventSpec, Method, ThreadEvents, full_notes};
    let spec =
        EventSpec::Tracepoint { system: "syscalls".into(), name: "sys_enter_getppid".into(), filter: None };
    let events = EventList::with_rows(vec![spec], 4);
    if events.method() != Method::InKernel {
        let why = events.method_description();
        assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "{why}");
        return eprintln!("past_the_engines_rows: skipped: {why}");
    }
    assert_eq!(events.engine_rows(), Some((4, 4)));
    let me = std::process::id() as i32;
    let crowd = Crowd::spawn(6);
    let mut threads: Vec<ThreadEvents> =
        crowd.tids.iter().map(|&tid| ThreadEvents::open(me, tid, &events)).collect();
    let in_engine: Vec<bool> = threads.iter().map(ThreadEvents::in_engine).collect();
    assert_eq!(in_engine, [true, true, true, true, false, false]);
    assert_eq!(threads.iter().map(ThreadEvents::fds).collect::<Vec<_>>(), [0, 0, 0, 0, 1, 1]);
    let notes: Vec<String> =
        full_notes().into_iter().filter(|n| n.contains(&format!("thread {} ", crowd.tids[4]))).collect();
    assert_eq!(notes.len(), 1, "said once, for the first thread past the rows: {notes:?}");
    assert!(
        notes[0].contains("4 rows are all in use") && notes[0].contains("by 1 perf counters"),
        "{}",
        notes[0]
    );
    assert!(!full_notes().iter().any(|n| n.contains(&format!("process {me},"))), "not said again");
    crowd.count();
    for (i, thread) in threads.iter_mut().enumerate() {
        assert_eq!(thread.read(&events), [Some(i as u64 + 1)], "thread {}, in the kernel: {}", i + 1, i < 4);
    }
    drop(threads);
    crowd.end();
}
