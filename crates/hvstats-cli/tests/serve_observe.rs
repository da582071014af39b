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

/// A child killed and reaped on drop, with its output lines.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// Every line read so far (a line waited for later may have come first).
    seen: std::cell::RefCell<Vec<String>>,
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
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Standard output (serve's address) and error (the log), as lines of one stream.
        let (tx, lines) = mpsc::channel();
        let out: Box<dyn std::io::Read + Send> = Box::new(child.stdout.take().unwrap());
        let err: Box<dyn std::io::Read + Send> = Box::new(child.stderr.take().unwrap());
        for stream in [out, err] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Self { child, lines, seen: Default::default() }
    }

    fn wait_line(&self, needle: &str) -> String {
        if let Some(line) = self.seen.borrow_mut().iter_mut().find(|l| l.contains(needle)) {
            // Taken: the next wait for the same text needs a new line.
            return std::mem::take(line);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(line) => self.seen.borrow_mut().push(line),
                Err(e) => panic!("no line containing {needle:?}: {e}"),
            }
        }
    }

    /// The body `serve` answers for `path`.
    fn get(&self, path: &str) -> String {
        let line = self.wait_line("serving http://");
        let addr = line.split("http://").nth(1).unwrap().split('/').next().unwrap().parse().unwrap();
        self.seen.borrow_mut().push(line);
        let reply = common::http_get(addr, path);
        reply.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or(reply)
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
    // Its VM's info names the VMM process (this test holds the VM: no VMM it knows).
    let metrics = serve.get("/metrics");
    let info = metrics
        .lines()
        .find(|l| l.starts_with("hvstats_vm_info{") && l.contains(&format!("vmm_pid=\"{me}\"")));
    assert!(
        info.is_some_and(|l| l.contains("vmm=\"other\"") && l.contains("publisher_kind=\"observer\"")),
        "{metrics}"
    );
    assert_eq!(serve.terminate().code(), Some(0));
    assert_eq!(instance_files(tmp.path()), Vec::<String>::new());
}
