//! How long SIGTERM takes to end an observer: the wall-clock time from the signal to the exit of
//! the real `hvstats` binary, with a VM attached.
//!
//! - [`OBSERVE_ROW`]: `hvstats observe --all` observing one VM;
//! - [`SERVE_ROW`]: `hvstats serve --observe-all` observing the same VM and serving.
//!
//! Both against the same binary's `hvstats serve` alone (no `--observe-all`), signalled once it
//! serves: a process of the same program, with the same runtime, log and signal handling, that
//! has nothing of an observer's to let go (no in-kernel programs to detach and hand over, no
//! counters, no refresh loop to wake). The ratio is what observing adds to a shutdown; a plain
//! child that exits on SIGTERM would only say how much more than the kernel's own teardown the
//! whole program takes. The documented bound is absolute (SIGTERM ends serve and the observer
//! within a second, on a busy host too): our side's median is the figure to hold against it.
//!
//! Wall-clock time, not CPU time: a shutdown waits on the kernel (programs detached, threads
//! joined, the process reaped), and that wait is what the operator's `systemctl stop` sees.
//!
//! The VM is the bench's own (an [`IdleVcpu`]: a VM with one vCPU that never runs), and the
//! observers are told to observe it alone (`--vm` the bench's pid), so other VMs on the host are
//! left alone. Each round signals the observer at a different point of its 1 s refresh (0, 250,
//! 500 or 750 ms after it said it attached the VM). Each process gets the runtime directory of
//! the run, one after the other. The rows need KVM, root (the observer's programs and counters)
//! and the `hvstats` binary (beside `hvstats-bench`, or on `PATH`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use hvstats_testkit::{IdleVcpu, TempDir};

use crate::row::{Pace, Plan, Rounds, Row};

/// The row of `hvstats observe --all`'s SIGTERM to exit, with a VM attached.
pub const OBSERVE_ROW: &str = "sigterm-to-exit-observe-all-vs-serve-alone";

/// The row of `hvstats serve --observe-all`'s SIGTERM to exit, with a VM attached.
pub const SERVE_ROW: &str = "sigterm-to-exit-serve-observe-all-vs-serve-alone";

/// Both rows, measured together (they share the baseline's rounds).
pub const ROWS: [&str; 2] = [OBSERVE_ROW, SERVE_ROW];

/// How long a process may take to say it is ready (an observer attached, serve serving).
const READY_WITHIN: Duration = Duration::from_secs(30);

/// How long a process may take to exit after SIGTERM before the row gives up on it.
const EXIT_WITHIN: Duration = Duration::from_secs(10);

/// The rows `wanted` selects, measured over the plan's rounds; `kvm` says whether this host can
/// make a VM, and if not why. A row this host cannot measure is skipped, with why.
pub fn shutdown_rows(plan: &Plan<'_>, kvm: &Result<(), String>, wanted: &dyn Fn(&str) -> bool) -> Vec<Row> {
    if !ROWS.iter().any(|name| wanted(name)) {
        return Vec::new();
    }
    let measured = kvm
        .clone()
        .and_then(|()| root())
        .and_then(|()| hvstats_binary())
        .and_then(|hvstats| measure(plan, &hvstats));
    ROWS.into_iter()
        .filter(|name| wanted(name))
        .map(|name| match &measured {
            Ok([observe, serve]) => {
                let rounds = if name == OBSERVE_ROW { observe } else { serve };
                Row::measured(name, rounds.clone(), "s", None)
            }
            Err(why) => Row::Skipped { name, why: why.clone() },
        })
        .collect()
}

/// Whether this process runs as root, and if not why a row needs it.
pub(crate) fn root() -> Result<(), String> {
    // SAFETY: geteuid has no arguments and cannot fail.
    match unsafe { libc::geteuid() } {
        0 => Ok(()),
        _ => Err("needs root: the observer's in-kernel programs and counters".into()),
    }
}

/// The `hvstats` binary: beside the running executable, in the directory above it (a test's
/// executable runs from `deps/` under the directory the binaries are built in), or on `PATH`.
///
/// # Errors
/// Where none is found, saying where it was looked for.
pub fn hvstats_binary() -> Result<PathBuf, String> {
    binary("hvstats", "cargo build -p hvstats-cli --bin hvstats")
}

/// The binary `name`, found as [`hvstats_binary`] finds `hvstats`; `build` says how to build it.
pub(crate) fn binary(name: &str, build: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the running executable: {e}"))?;
    let beside = exe.parent().into_iter().flat_map(|dir| [Some(dir), dir.parent()]).flatten();
    let on_path =
        std::env::var_os("PATH").into_iter().flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>());
    beside
        .map(Path::to_owned)
        .chain(on_path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| format!("needs the {name} binary beside hvstats-bench or on PATH ({build})"))
}

/// Each round's SIGTERM-to-exit of `observe --all` and `serve --observe-all` (ours) and of
/// `serve` alone (the baseline, shared), in seconds: in even rounds the observers then serve
/// alone, in odd ones serve alone then the observers, so a drift of the host cancels in a block.
fn measure(plan: &Plan<'_>, hvstats: &Path) -> Result<[Rounds; 2], String> {
    let vm = IdleVcpu::new().map_err(|e| format!("cannot make the VM to observe: {e}"))?;
    let dir = TempDir::new("bench-sigterm");
    let me = std::process::id().to_string();
    let attached = format!("attach pid {me}");
    let observe = ["observe", "--all", "--vm", &me];
    let serve_all = ["serve", "--listen", "127.0.0.1:0", "--observe-all", "--vm", &me];
    let serve = ["serve", "--listen", "127.0.0.1:0"];
    let (mut observed, mut served) = (Rounds::default(), Rounds::default());
    for round in 0..plan.start(&ROWS, Pace::Slow) {
        // Where in the observer's 1 s refresh the signal lands.
        let phase = Duration::from_millis(250 * u64::from(round % 4));
        let run = |args: &[&str], ready: &[&str], after: Duration| {
            Hvstats::start(hvstats, args, dir.path())?.sigterm_to_exit(ready, after)
        };
        let alone = |rounds: [&mut Rounds; 2]| -> Result<(), String> {
            let took = run(&serve, &["serving http://"], phase)?;
            rounds.into_iter().for_each(|r| r.baseline.push(took));
            Ok(())
        };
        if round % 2 == 1 {
            alone([&mut observed, &mut served])?;
        }
        observed.ours.push(run(&observe, &[&attached], phase)?);
        served.ours.push(run(&serve_all, &[&attached, "serving http://"], phase)?);
        if round % 2 == 0 {
            alone([&mut observed, &mut served])?;
        }
        plan.tick();
    }
    drop(vm);
    Ok([observed, served])
}

/// A running `hvstats`, its standard output and error read as lines of one stream to the end
/// (so that it never blocks on a full pipe while it shuts down); killed on drop.
pub(crate) struct Hvstats {
    pub(crate) child: Child,
    pub(crate) lines: Receiver<String>,
    args: String,
}

impl Hvstats {
    /// Starts `hvstats ARGS --runtime-dir DIR`.
    pub(crate) fn start(hvstats: &Path, args: &[&str], dir: &Path) -> Result<Self, String> {
        let mut child = Command::new(hvstats)
            .args(args)
            .arg("--runtime-dir")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{}: {e}", hvstats.display()))?;
        let (tx, lines) = channel();
        let out = child.stdout.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>);
        let err = child.stderr.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>);
        for stream in [out, err].into_iter().flatten() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in std::io::BufRead::lines(std::io::BufReader::new(stream)).map_while(Result::ok) {
                    // Read on when nobody listens: the process must never block on its output.
                    let _ = tx.send(line);
                }
            });
        }
        Ok(Self { child, lines, args: format!("hvstats {}", args.join(" ")) })
    }

    /// Waits until every one of `ready` was said, then `after`, then sends SIGTERM: the seconds
    /// until the process exited (with status 0).
    fn sigterm_to_exit(mut self, ready: &[&str], after: Duration) -> Result<f64, String> {
        let mut waiting: Vec<&str> = ready.to_vec();
        let deadline = Instant::now() + READY_WITHIN;
        while !waiting.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .map_err(|_| format!("{} did not say {waiting:?} in {READY_WITHIN:?}", self.args))?;
            waiting.retain(|needle| !line.contains(needle));
        }
        std::thread::sleep(after);
        let pid = i32::try_from(self.child.id()).map_err(|e| e.to_string())?;
        let t = Instant::now();
        // SAFETY: kill has no memory effects; the pid is our child's, not yet reaped.
        if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
            return Err(format!("cannot signal {}: {}", self.args, std::io::Error::last_os_error()));
        }
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(t.elapsed().as_secs_f64()),
                Ok(Some(status)) => return Err(format!("{} ended on SIGTERM with {status}", self.args)),
                Ok(None) if t.elapsed() > EXIT_WITHIN => {
                    return Err(format!("{} still ran {EXIT_WITHIN:?} after SIGTERM", self.args));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => return Err(format!("waiting for {}: {e}", self.args)),
            }
        }
    }
}

impl Drop for Hvstats {
    fn drop(&mut self) {
        // Already reaped after a measured round; killed and reaped after a failed one.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
