//! `serve --observe-all` as a process: SIGTERM removes the observer's instance files, as
//! `observe` does, and a VM another observer already publishes is left to it (one observer per
//! VM per host) until that observer is gone.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{TempDir, hold_a_vm, kvm_available};

/// A child killed and reaped on drop, with its stderr lines.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    fn start(args: &[&str], dir: &Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hvstats"))
            .args(args)
            .arg("--runtime-dir")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    fn wait_line(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(e) => panic!("no line containing {needle:?}: {e}"),
            }
        }
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        // SAFETY: kill has no memory effects; the pid is our child's.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) }, 0);
        let t = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "no exit 5 s after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn instance_files(dir: &Path) -> Vec<String> {
    match std::fs::read_dir(dir.join("instances")) {
        Ok(d) => d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn sigterm_ends_serve_observe_all_and_removes_the_observers_instance_files() {
    let tmp = TempDir::new("serve-observe-term");
    let mut serve = Running::start(
        &["serve", "--listen", "127.0.0.1:0", "--observe-all", "--observe-interval", "0.1"],
        tmp.path(),
    );
    serve.wait_line("observing every KVM VM on this host as instance");
    assert!(!instance_files(tmp.path()).is_empty());
    let status = serve.terminate();
    assert_eq!(status.code(), Some(0), "{status}");
    assert_eq!(instance_files(tmp.path()), Vec::<String>::new());
}

#[test]
fn serve_observe_all_leaves_a_vm_to_the_observer_that_claimed_it() {
    if !kvm_available("serve_observe_all_leaves_a_vm_to_the_observer_that_claimed_it") {
        return;
    }
    let tmp = TempDir::new("serve-observe-claim");
    let _vm = hold_a_vm();
    let me = std::process::id().to_string();
    let mut observe = Running::start(&["observe", "--pid", &me, "--interval", "0.1"], tmp.path());
    observe.wait_line(&format!("attach pid {me}"));
    let mut serve = Running::start(
        &["serve", "--listen", "127.0.0.1:0", "--observe-all", "--observe-interval", "0.1"],
        tmp.path(),
    );
    let waiting = serve.wait_line(&format!("pid {me} not observed for now"));
    assert!(waiting.contains(&format!("already observed by pid {}", observe.child.id())), "{waiting}");
    // The observer goes: serve takes the VM over.
    assert_eq!(observe.terminate().code(), Some(0));
    serve.wait_line(&format!("attach pid {me}"));
    assert_eq!(serve.terminate().code(), Some(0));
    assert_eq!(instance_files(tmp.path()), Vec::<String>::new());
}
