//! The per-thread counting layer of the observer, tested for real with a tracepoint that fires
//! on this machine: `syscalls:sys_enter_getppid`, on threads of this test process that make a
//! known number of `getppid` calls.

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::mpsc;
use std::thread;

use hvstats_observe::Procfs;
use hvstats_observe::thread_counters::{EventList, EventSpec, Method, SW_TASK_CLOCK, ThreadCounters};

fn getppid_events() -> Option<EventList> {
    getppid_events_by(Method::InKernel)
}

/// Where BPF is not permitted the in-kernel list falls back to perf counters: said, and a failure
/// under `HVSTATS_REQUIRE_KVM=1` (a KVM host of our CI runs these tests as root).
fn getppid_events_by(method: Method) -> Option<EventList> {
    let events = EventList::with_method(
        vec![
            EventSpec::tracepoint("syscalls", "sys_enter_getppid"),
            EventSpec::Software(SW_TASK_CLOCK),
            EventSpec::tracepoint("syscalls", "no_such_event"),
        ],
        method,
    );
    if let Some(why) = events.unavailable(0) {
        eprintln!("syscalls:sys_enter_getppid is unavailable ({why}): skipped");
        return None;
    }
    if method == Method::InKernel && events.method() != Method::InKernel {
        let why = events.method_description();
        assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "{why}");
        eprintln!("{why}");
    }
    Some(events)
}

fn getppid(n: usize) {
    for _ in 0..n {
        // SAFETY: getppid has no arguments and no memory effects.
        unsafe { libc::syscall(libc::SYS_getppid) };
    }
}

fn gettid() -> i32 {
    // SAFETY: gettid has no arguments and no memory effects.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// A thread that runs each closure it is sent, answering with its tid and waiting for the next.
struct Worker {
    tid: i32,
    jobs: mpsc::Sender<Box<dyn FnOnce() + Send>>,
    done: mpsc::Receiver<()>,
    handle: Option<thread::JoinHandle<()>>,
}

impl Worker {
    fn start() -> Self {
        let (jobs, rx) = mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let (done_tx, done) = mpsc::channel();
        let (tid_tx, tid_rx) = mpsc::channel();
        let handle = thread::spawn(move || {
            tid_tx.send(gettid()).unwrap();
            for job in rx {
                job();
                done_tx.send(()).unwrap();
            }
        });
        Self { tid: tid_rx.recv().unwrap(), jobs, done, handle: Some(handle) }
    }

    fn run(&self, job: impl FnOnce() + Send + 'static) {
        self.jobs.send(Box::new(job)).unwrap();
        self.done.recv().unwrap();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let (tx, _) = mpsc::channel();
        drop(std::mem::replace(&mut self.jobs, tx));
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn me() -> i32 {
    std::process::id() as i32
}

#[test]
fn counts_are_exact_and_start_at_attach() {
    for method in [Method::InKernel, Method::Perf] {
        counts_are_exact_and_start_at_attach_by(method);
    }
}

fn counts_are_exact_and_start_at_attach_by(method: Method) {
    let Some(events) = getppid_events_by(method) else { return };
    let worker = Worker::start();
    worker.run(|| getppid(100)); // before attach: not counted
    let mut counters = ThreadCounters::attach(&Procfs::host(), me(), events).unwrap();
    worker.run(|| getppid(777));
    let counts = counters.read(worker.tid).expect("the worker is counted");
    assert_eq!(counts[0], Some(777), "{method:?}");
    assert!(counts[1].is_some_and(|ns| ns > 0), "task clock {:?}", counts[1]);
    assert_eq!(counts[2], None, "an unknown tracepoint is unavailable, not 0");
    assert!(counters.events().unavailable(2).is_some());
    worker.run(|| getppid(3));
    assert_eq!(counters.read(worker.tid).unwrap()[0], Some(780));
}

#[test]
fn threads_are_told_apart() {
    let Some(events) = getppid_events() else { return };
    let a = Worker::start();
    let b = Worker::start();
    let mut counters = ThreadCounters::attach(&Procfs::host(), me(), events).unwrap();
    a.run(|| getppid(11));
    b.run(|| getppid(222));
    assert_eq!(counters.read(a.tid).unwrap()[0], Some(11));
    assert_eq!(counters.read(b.tid).unwrap()[0], Some(222));
}

#[test]
fn threads_that_appear_after_attach_are_counted_from_the_scan_that_finds_them() {
    let Some(events) = getppid_events() else { return };
    let procfs = Procfs::host();
    let mut counters = ThreadCounters::attach(&procfs, me(), events).unwrap();
    let late = Worker::start();
    assert!(counters.read(late.tid).is_none(), "not seen yet");
    late.run(|| getppid(5));
    assert!(counters.rescan(&procfs).unwrap() >= 1);
    late.run(|| getppid(321));
    assert_eq!(counters.read(late.tid).unwrap()[0], Some(321));
}

#[test]
fn a_thread_attributed_late_has_every_count_since_attach_and_others_are_closed() {
    for method in [Method::InKernel, Method::Perf] {
        a_thread_attributed_late_by(method);
    }
}

fn a_thread_attributed_late_by(method: Method) {
    let Some(events) = getppid_events_by(method) else { return };
    // The tracepoint in the kernel: the thread holds only its task clock's perf counter.
    let per_thread = if events.method() == Method::InKernel { 1 } else { 2 };
    let procfs = Procfs::host();
    let vcpu = Worker::start();
    let other = Worker::start();
    let mut counters = ThreadCounters::attach(&procfs, me(), events).unwrap();
    // The "vCPU" runs before anyone knows it is one.
    vcpu.run(|| getppid(64));
    other.run(|| getppid(9));
    let before = counters.fds();
    // Now its thread is known: keep only it.
    counters.retain(&[vcpu.tid]);
    assert!(counters.fds() < before, "{} < {before}", counters.fds());
    assert_eq!(counters.fds(), per_thread, "{method:?}: the events open on the one thread left");
    assert_eq!(counters.tids(), vec![vcpu.tid]);
    assert!(counters.read(other.tid).is_none());
    vcpu.run(|| getppid(36));
    assert_eq!(counters.read(vcpu.tid).unwrap()[0], Some(100), "{method:?}");
    // Threads appearing once narrowed are not counted.
    let late = Worker::start();
    assert_eq!(counters.rescan(&procfs).unwrap(), 0);
    assert!(counters.read(late.tid).is_none());
}

#[test]
fn a_thread_that_exits_keeps_its_last_reading() {
    let Some(events) = getppid_events() else { return };
    let worker = Worker::start();
    let tid = worker.tid;
    let mut counters = ThreadCounters::attach(&Procfs::host(), me(), events).unwrap();
    worker.run(|| getppid(42));
    assert_eq!(counters.read(tid).unwrap()[0], Some(42));
    drop(worker);
    assert_eq!(counters.read(tid).unwrap()[0], Some(42));
}

#[test]
fn a_gone_process_is_an_error() {
    let Some(events) = getppid_events() else { return };
    assert!(ThreadCounters::attach(&Procfs::host(), i32::MAX, events).is_err());
}

#[test]
fn the_kernel_accepts_every_vm_event_and_filter_including_the_vmx_and_svm_exit_classes() {
    use hvstats_abi::exit_reason::{ISA_SVM, ISA_VMX};
    use hvstats_observe::sources::events::vm_events;
    if !std::path::Path::new("/sys/kernel/tracing/events/kvm/kvm_exit").is_dir() {
        eprintln!("no kvm tracepoints on this host: skipped");
        return;
    }
    let worker = Worker::start();
    for method in [Method::Perf, Method::InKernel] {
        for isa in [None, Some(ISA_VMX), Some(ISA_SVM)] {
            let specs = vm_events(isa);
            let events = EventList::with_method(specs.clone(), method);
            for (i, spec) in specs.iter().enumerate() {
                assert!(events.unavailable(i).is_none(), "{spec:?}");
            }
            // In the kernel: every tracepoint, with every filter, is counted by a program.
            let description = events.method_description();
            let in_kernel = events.method() == Method::InKernel;
            if method == Method::InKernel {
                assert!(in_kernel || std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "{description}");
                assert!(!in_kernel || !description.contains("except"), "{description}");
            }
            let mut counters = ThreadCounters::attach(&Procfs::host(), me(), events).unwrap();
            counters.retain(&[worker.tid]);
            // A counter whose filter the kernel rejected would have been dropped. Spans (exit to
            // entry per class, VMX/SVM; hypercall to its completion) and carried counts (the
            // Hyper-V flushes) are counted in the kernel or not at all.
            let is_span = |i: usize| specs[i].in_kernel_only();
            let spans = (0..specs.len()).filter(|&i| is_span(i)).count();
            let classes = hvstats_abi::exit_reason::InterceptClass::EXITS.len();
            let flushes = hvstats_observe::sources::hyperv::FLUSH_RECORDS.len() * 4;
            assert_eq!(spans, if isa.is_some() { classes } else { 0 } + 1 + flushes);
            // In the kernel every event of the list is the tally's: no perf counter is left on
            // the thread (its clock is another source's).
            let expected = if in_kernel { 0 } else { specs.len() - spans };
            assert_eq!(
                counters.fds(),
                expected,
                "{method:?}, isa {isa:?}: every event opened with its filter"
            );
            let counts = counters.read(worker.tid).unwrap().to_vec();
            for (i, count) in counts.iter().enumerate() {
                let counted = in_kernel || !is_span(i);
                assert_eq!(count.is_some(), counted, "{method:?}, isa {isa:?}, {:?}: {count:?}", specs[i]);
                assert_eq!(counters.is_open(worker.tid, i), counted, "{:?}", specs[i]);
            }
        }
        // And a filter nobody can evaluate leaves its event unavailable rather than counting
        // everything: the program refuses it, and so does perf.
        let bad = EventList::with_method(
            vec![EventSpec::filtered("kvm", "kvm_exit", "no_such_field == 1")],
            method,
        );
        assert_eq!(bad.method(), Method::Perf, "{}", bad.method_description());
        let mut counters = ThreadCounters::attach(&Procfs::host(), me(), bad).unwrap();
        counters.retain(&[worker.tid]);
        assert_eq!(counters.fds(), 0);
        assert_eq!(counters.read(worker.tid).unwrap(), vec![None]);
        assert!(!counters.is_open(worker.tid, 0));
    }
}

fn clock_nanosleep(clock: libc::clockid_t, ms: i64) {
    let ts = libc::timespec { tv_sec: 0, tv_nsec: ms * 1_000_000 };
    // SAFETY: clock_nanosleep reads the timespec we own; no remainder is asked for.
    assert_eq!(unsafe { libc::clock_nanosleep(clock, 0, &ts, std::ptr::null_mut()) }, 0);
}

#[test]
fn a_span_is_the_time_from_its_start_to_its_end_in_the_kernel_and_absent_with_perf() {
    // As the observer times kvm_exit by class until kvm_entry on VMX/SVM hosts.
    let specs = || {
        vec![
            EventSpec::tracepoint("syscalls", "sys_enter_clock_nanosleep"),
            EventSpec::span(
                "syscalls",
                "sys_enter_clock_nanosleep",
                Some("which_clock == 1"),
                "sys_exit_clock_nanosleep",
            ),
            EventSpec::Software(SW_TASK_CLOCK),
            EventSpec::span("syscalls", "sys_enter_clock_nanosleep", None, "sys_exit_clock_nanosleep"),
        ]
    };
    let events = EventList::with_method(specs(), Method::InKernel);
    if events.method() != Method::InKernel {
        let why = events.method_description();
        assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "{why}");
        eprintln!("skipped: {why}");
        return;
    }
    assert!(events.in_kernel(1) && events.in_kernel(3));
    let worker = Worker::start();
    let mut counters = ThreadCounters::attach(&Procfs::host(), me(), events).unwrap();
    let started = std::time::Instant::now();
    worker.run(|| {
        for _ in 0..3 {
            clock_nanosleep(libc::CLOCK_MONOTONIC, 4);
        }
        clock_nanosleep(libc::CLOCK_REALTIME, 2);
    });
    let wall = started.elapsed().as_nanos() as u64;
    let counts = counters.read(worker.tid).unwrap();
    assert_eq!(counts[0], Some(4));
    // The monotonic sleeps open the first span; the realtime one falls to the unfiltered span.
    let monotonic = counts[1].unwrap();
    let rest = counts[3].unwrap();
    assert!((12_000_000..=wall).contains(&monotonic), "{counts:?} in {wall} ns");
    assert!((2_000_000..=wall - monotonic).contains(&rest), "{counts:?} in {wall} ns");
    // Perf counters cannot time a span: it is absent, never a count of its start tracepoint.
    let perf = EventList::with_method(specs(), Method::Perf);
    assert_eq!(perf.perf_events_per_thread(), 2);
    let mut counters = ThreadCounters::attach(&Procfs::host(), me(), perf).unwrap();
    worker.run(|| clock_nanosleep(libc::CLOCK_MONOTONIC, 1));
    let counts = counters.read(worker.tid).unwrap();
    assert_eq!((counts[0], counts[1], counts[3]), (Some(1), None, None), "{counts:?}");
}
