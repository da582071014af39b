//! `hvstats serve` against peers that try to turn it against others: a signal that would end it
//! without its cleanup, a flood of wrong passwords in front of a new scraper, clients that
//! reconnect as fast as the connection cap evicts them, and an observer killed and cleaned away
//! before the exporter restarts. Each test runs the real binary over real sockets.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Running, TempDir, hold_a_vm, kvm_available};

fn entries(dir: &Path) -> Vec<String> {
    match std::fs::read_dir(dir) {
        Ok(d) => d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    }
}

/// Sends `signal` to `running` and waits (at most 5 s) for it to end.
fn end_with(running: &mut Running, signal: libc::c_int) -> std::process::ExitStatus {
    // SAFETY: kill has no memory effects; the pid is our child's.
    assert_eq!(unsafe { libc::kill(running.child.id() as i32, signal) }, 0);
    let t = Instant::now();
    loop {
        if let Some(s) = running.child.try_wait().unwrap() {
            return s;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "no exit 5 s after signal {signal}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sighup_sigterm_and_sigint_end_serve_and_serve_observe_all_with_0_and_remove_what_they_made() {
    if !kvm_available(
        "sighup_sigterm_and_sigint_end_serve_and_serve_observe_all_with_0_and_remove_what_they_made",
    ) {
        return;
    }
    // This test's process holds a VM: `--observe-all --vm <it>` attaches it and claims it.
    let _vm = hold_a_vm();
    let me = std::process::id().to_string();
    for (signal, name) in [(libc::SIGHUP, "SIGHUP"), (libc::SIGTERM, "SIGTERM"), (libc::SIGINT, "SIGINT")] {
        let tmp = TempDir::new("serve-signals");
        let socket = tmp.path().join("serve.sock");
        let mut serve = Running::start(&["serve"], tmp.path());
        serve.wait_line("serving unix:");
        assert!(socket.exists());
        let status = end_with(&mut serve, signal);
        assert_eq!(status.code(), Some(0), "serve, {name}: {status}");
        assert!(!socket.exists(), "serve, {name}: the socket is left behind");
        serve.wait_line(&format!("{name}: stopping"));

        let mut serve =
            Running::start(&["serve", "--observe-all", "--observe-interval", "0.1", "--vm", &me], tmp.path());
        serve.wait_line(&format!("attach pid {me}"));
        assert!(socket.exists());
        assert!(!entries(&tmp.path().join("instances")).is_empty());
        assert!(!entries(&tmp.path().join("observed")).is_empty(), "no claim made");
        let status = end_with(&mut serve, signal);
        assert_eq!(status.code(), Some(0), "serve --observe-all, {name}: {status}");
        assert!(!socket.exists(), "serve --observe-all, {name}: the socket is left behind");
        assert_eq!(
            entries(&tmp.path().join("instances")),
            Vec::<String>::new(),
            "{name}: instance files left"
        );
        assert_eq!(entries(&tmp.path().join("observed")), Vec::<String>::new(), "{name}: a claim is left");
    }
}
