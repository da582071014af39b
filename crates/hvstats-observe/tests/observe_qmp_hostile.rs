//! The QMP client against peers that lie: a real Unix socket served by a thread of this test
//! that drips its greeting one byte at a time, streams events without end, answers with a
//! 16 MB line, or accepts nobody while another client holds the socket (a real QEMU). Each
//! exchange must end by its deadline, in little CPU and little memory, with an error naming
//! what happened.

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod observe_support;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use hvstats_vmm::cancel::Cancel;
use hvstats_vmm::qmp::{MAX_LINE, Qmp, QmpError};
use observe_support::{Qemu, TempDir};

const GREETING: &str =
    r#"{"QMP": {"version": {"qemu": {"major": 7, "minor": 2, "micro": 0}}, "capabilities": []}}"#;

/// Binds `<dir>/<tag>.sock` and runs `peer` on the first client, in a thread.
fn peer(
    dir: &std::path::Path,
    tag: &str,
    peer: impl FnOnce(UnixStream) + Send + 'static,
) -> std::path::PathBuf {
    let path = dir.join(format!("{tag}.sock"));
    let listener = UnixListener::bind(&path).unwrap();
    thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        peer(s);
    });
    path
}

/// Greets, and answers `qmp_capabilities`; the next request is left for the caller.
fn handshake(s: &UnixStream) -> BufReader<UnixStream> {
    let mut w = s.try_clone().unwrap();
    writeln!(w, "{GREETING}").unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.contains("qmp_capabilities"), "{line}");
    writeln!(w, r#"{{"return": {{}}}}"#).unwrap();
    r
}

/// Runs `f` on a thread and gives its result, failing the test (instead of hanging it) when it
/// takes longer than `limit`; also the CPU time the thread used.
fn bounded<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> (T, Duration, Duration) {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let t = Instant::now();
        let r = f();
        let _ = tx.send((r, t.elapsed(), thread_cpu()));
    });
    rx.recv_timeout(limit).unwrap_or_else(|_| panic!("the QMP exchange was still going after {limit:?}"))
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec the kernel writes into.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[test]
fn a_greeting_dripped_one_byte_at_a_time_is_dropped_at_the_deadline() {
    let tmp = TempDir::new("qmp-drip");
    let path = peer(tmp.path(), "drip", |mut s| {
        // Every byte comes well within any per-read timeout; the whole never comes in time.
        for b in GREETING.bytes() {
            if s.write_all(&[b]).is_err() {
                return;
            }
            thread::sleep(Duration::from_millis(200));
        }
    });
    let (r, took, _) = bounded(Duration::from_secs(10), move || Qmp::connect(&path, Duration::from_secs(1)));
    match r {
        Err(QmpError::Timeout { what, .. }) => assert_eq!(what, "greeting"),
        other => panic!("{other:?}"),
    }
    assert!(took >= Duration::from_millis(900) && took < Duration::from_millis(1500), "{took:?}");
}

#[test]
fn an_endless_event_stream_ends_the_exchange_quickly_and_cheaply() {
    let tmp = TempDir::new("qmp-events");
    let path = peer(tmp.path(), "events", |s| {
        let _r = handshake(&s);
        let mut w = s;
        let event = br#"{"event": "RTC_CHANGE", "data": {"offset": 0}, "timestamp": {"seconds": 1, "microseconds": 2}}
"#;
        while w.write_all(event).is_ok() {}
    });
    let (r, took, cpu) = bounded(Duration::from_secs(10), move || {
        let mut q = Qmp::connect(&path, Duration::from_secs(2)).unwrap();
        q.query_name()
    });
    match r {
        Err(QmpError::Protocol(m)) => assert!(m.contains("events and no reply"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(cpu < Duration::from_millis(500), "{cpu:?} of CPU");
}

/// Peak resident memory of this process, in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_16_mb_reply_is_refused_after_at_most_one_line_of_memory() {
    let tmp = TempDir::new("qmp-huge");
    let path = peer(tmp.path(), "huge", |s| {
        let _r = handshake(&s);
        let mut w = s;
        // A reply that is valid JSON once complete: {"return": "xxxx…"} of 16 MB, sent from
        // one small buffer so the peer itself stays small.
        let _ = w.write_all(br#"{"return": ""#);
        let chunk = vec![b'x'; 64 << 10];
        for _ in 0..256 {
            if w.write_all(&chunk).is_err() {
                return;
            }
        }
        let _ = w.write_all(b"\"}\n");
    });
    // Reset the peak so it measures this exchange (Linux: "5" to clear_refs resets VmHWM).
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    let before = peak_rss_kib();
    let (r, took, _) = bounded(Duration::from_secs(20), move || {
        let mut q = Qmp::connect(&path, Duration::from_secs(5)).unwrap();
        q.query_name()
    });
    let grew = peak_rss_kib().saturating_sub(before);
    match r {
        Err(QmpError::Protocol(m)) => assert!(m.contains(&format!("longer than {MAX_LINE} bytes")), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(took < Duration::from_secs(5), "{took:?}");
    // The line buffer stops at MAX_LINE (1 MiB): a few MiB of slack for the test's own threads.
    assert!(grew < 6 << 10, "peak RSS grew by {grew} KiB");
}

#[test]
fn a_cancel_ends_a_stuck_exchange_within_its_poll() {
    let tmp = TempDir::new("qmp-cancel");
    let (hold_tx, hold_rx) = mpsc::channel::<()>();
    let path = peer(tmp.path(), "stuck", move |s| {
        let _r = handshake(&s);
        // Never answers, never closes, until the test is over.
        let _ = hold_rx.recv();
    });
    let cancel = Cancel::new();
    let mut q = Qmp::connect_with(&path, Duration::from_secs(30), cancel.clone()).unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(q.query_name());
    });
    thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    cancel.cancel();
    let r = rx.recv_timeout(Duration::from_secs(5)).expect("the exchange ended");
    assert!(t.elapsed() < Duration::from_millis(500), "{:?}", t.elapsed());
    match r {
        Err(QmpError::Cancelled { what }) => assert_eq!(what, "query-name"),
        other => panic!("{other:?}"),
    }
    drop(hold_tx);
}

#[test]
fn a_qemu_serving_another_client_is_named_taken() {
    let tmp = TempDir::new("qmp-taken");
    let Some(qemu) = Qemu::start(tmp.path(), "qmp", "tcg", &[]) else { return };
    // The first client (libvirt, on a libvirt host) holds QEMU's only monitor connection.
    let mut first = qemu.connect();
    let t = Instant::now();
    let e = Qmp::connect(&qemu.qmp, Duration::from_secs(1)).unwrap_err();
    assert!(matches!(e, QmpError::Taken { .. }), "{e:?}");
    assert!(e.to_string().contains("taken by another client: QEMU serves one at a time"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // The first client is unaffected.
    assert!(!first.is_running().unwrap());
}

#[test]
fn a_peer_streaming_blank_lines_is_dropped_cheaply_and_named_for_what_it_did() {
    let tmp = TempDir::new("qmp-blank");
    let path = peer(tmp.path(), "blank", |mut s| {
        let newlines = vec![b'\n'; 64 << 10];
        while s.write_all(&newlines).is_ok() {}
    });
    let (r, took, cpu) =
        bounded(Duration::from_secs(10), move || Qmp::connect(&path, Duration::from_secs(2)));
    match r {
        Err(QmpError::Protocol(m)) => {
            assert!(m.contains("blank lines and no message"), "{m}");
            assert!(m.starts_with("greeting:"), "{m}");
        }
        other => panic!("{other:?}"),
    }
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(cpu < Duration::from_millis(500), "{cpu:?} of CPU");
}

#[test]
fn a_peer_that_accepts_and_never_greets_while_running_is_a_stall_not_another_client() {
    let tmp = TempDir::new("qmp-mute");
    let (hold_tx, hold_rx) = mpsc::channel::<()>();
    let path = peer(tmp.path(), "mute", move |_s| {
        let _ = hold_rx.recv();
    });
    let e = Qmp::connect(&path, Duration::from_millis(500)).unwrap_err();
    match &e {
        QmpError::Stalled { what, why, .. } => {
            assert_eq!(what, "greeting");
            assert!(why.contains("runs but its monitor does not answer"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    assert!(!e.to_string().contains("another client"), "{e}");
    drop(hold_tx);
}

/// Sends `signal` to `pid`; for SIGSTOP, waits until every thread of it has stopped (the
/// signal takes effect a moment after it is sent).
fn signal(pid: i32, signal: libc::c_int) {
    // SAFETY: kill has no memory effects; the pid is this test's child.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    let t = Instant::now();
    while signal == libc::SIGSTOP && !stopped(pid) {
        assert!(t.elapsed() < Duration::from_secs(10), "pid {pid} did not stop");
        thread::sleep(Duration::from_millis(5));
    }
}

/// True when every thread of `pid` is stopped.
fn stopped(pid: i32) -> bool {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks.flatten().all(|t| {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T'))
    })
}

#[test]
fn a_stopped_qemu_is_named_stopped_at_connect_and_greets_the_same_session_once_continued() {
    let tmp = TempDir::new("qmp-stopped");
    let Some(qemu) = Qemu::start(tmp.path(), "qmp", "tcg", &[]) else { return };
    // A first session proves it listens, then leaves.
    drop(qemu.connect());
    signal(qemu.pid(), libc::SIGSTOP);
    let t = Instant::now();
    let e = Qmp::connect(&qemu.qmp, Duration::from_secs(1)).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    match &e {
        QmpError::Stalled { what, why, .. } => {
            assert_eq!(what, "greeting");
            assert!(why.contains("stopped (SIGSTOP or a debugger)"), "{why}");
        }
        other => panic!("a stopped QEMU is no other client: {other:?}"),
    }
    // A connection begun while it is stopped is greeted once it runs again: no reconnect.
    let mut q = Qmp::begin(&qemu.qmp, Duration::from_secs(5), Cancel::new()).unwrap();
    assert!(matches!(q.greet(Instant::now()), Err(QmpError::Stalled { .. })));
    assert_eq!(q.peer_pid(), Some(qemu.pid()), "the kernel says who listens, greeting or not");
    signal(qemu.pid(), libc::SIGCONT);
    q.greet(Instant::now() + Duration::from_secs(5)).unwrap();
    assert!(!q.is_running().unwrap(), "started with -S");
}
