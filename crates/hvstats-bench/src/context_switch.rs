//! What the observer costs every context switch of the host: two threads of this process, both
//! on CPU 0, hand a byte back and forth through two pipes (each hand-over is a switch from one to
//! the other), in ns per switch, with `hvstats observe --all` running and observing a VM of the
//! bench's VMM (its programs attached, its task iterator linked) against no observer at all,
//! rounds interleaved. Whatever the observer runs in the kernel on a context switch shows here.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use hvstats_host::bpf::keep;

use crate::observe_scale::{published, start_vmm};
use crate::row::{Pace, Plan, Rounds, Row};
use crate::shutdown::{Hvstats, binary, hvstats_binary, root};

/// The row.
pub const ROW: &str = "context-switch-ns-with-observer-vs-without";

/// Round trips a measurement makes (two switches each).
const ROUND_TRIPS: u32 = 50_000;

/// The row (skipped, with why, without root, KVM or the binaries).
pub fn context_switch_row(plan: &Plan<'_>, kvm: &Result<(), String>) -> Row {
    let tools = kvm.clone().and_then(|()| root()).and_then(|()| {
        Ok((hvstats_binary()?, binary("hvstats-bench-vmm", "cargo build -p hvstats-bench --bins")?))
    });
    match tools.and_then(|(hvstats, vmm)| measure(plan, &hvstats, &vmm)) {
        Ok(row) => row,
        Err(why) => Row::Skipped { name: ROW, why },
    }
}

fn measure(plan: &Plan<'_>, hvstats: &Path, vmm: &Path) -> Result<Row, String> {
    let mut vm = start_vmm(vmm)?;
    let pid = vm.id().to_string();
    let with_observer = || -> Result<f64, String> {
        let dir = hvstats_testkit::TempDir::new("bench-switch");
        let args = ["observe", "--all", "--interval", "1", "--vm", &pid];
        let observer = Hvstats::start(hvstats, &args, dir.path())?;
        let t = Instant::now();
        while published(dir.path()).0 < 1 {
            if t.elapsed() > Duration::from_secs(30) {
                return Err("the observer did not publish the VM in 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let ns = ping_pong()?;
        drop(observer);
        // It kept its counts of the VM, still running, for a successor that never comes.
        if let Ok(kept) = keep::identity_dir(dir.path()) {
            keep::remove_tree(&kept);
        }
        Ok(ns)
    };
    let mut rounds = Rounds::default();
    for round in 0..plan.start(&[ROW], Pace::Slow) {
        if round % 2 == 0 {
            rounds.ours.push(with_observer()?);
            rounds.baseline.push(ping_pong()?);
        } else {
            rounds.baseline.push(ping_pong()?);
            rounds.ours.push(with_observer()?);
        }
        plan.tick();
    }
    drop(vm.stdin.take());
    let _ = vm.kill();
    let _ = vm.wait();
    Ok(Row::Measured {
        name: ROW,
        rounds,
        unit: "ns/switch",
        goal: None,
        facts: vec![("round_trips", f64::from(ROUND_TRIPS)), ("load_average_1m", load_average())],
    })
}

/// Both threads of the ping-pong on CPU 0: each hand-over a switch, not a wake-up of another CPU.
fn on_cpu_0() -> Result<(), String> {
    // SAFETY: a zeroed cpu_set_t with CPU 0 set, alive for the call, for the calling thread.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set)
    };
    if r == 0 { Ok(()) } else { Err(format!("sched_setaffinity: {}", std::io::Error::last_os_error())) }
}

/// Wall-clock ns per switch of [`ROUND_TRIPS`] hand-overs between two threads on CPU 0.
fn ping_pong() -> Result<f64, String> {
    let (mut here, mut there) = UnixStream::pair().map_err(|e| e.to_string())?;
    let echo = std::thread::spawn(move || -> Result<(), String> {
        on_cpu_0()?;
        let mut byte = [0u8; 1];
        for _ in 0..ROUND_TRIPS {
            there.read_exact(&mut byte).map_err(|e| e.to_string())?;
            there.write_all(&byte).map_err(|e| e.to_string())?;
        }
        Ok(())
    });
    let run = || -> Result<f64, String> {
        on_cpu_0()?;
        let mut byte = [0u8; 1];
        let start = Instant::now();
        for _ in 0..ROUND_TRIPS {
            here.write_all(&byte).map_err(|e| e.to_string())?;
            here.read_exact(&mut byte).map_err(|e| e.to_string())?;
        }
        Ok(start.elapsed().as_nanos() as f64 / (2.0 * f64::from(ROUND_TRIPS)))
    };
    let ns = std::thread::scope(|s| s.spawn(run).join()).map_err(|_| "the ping-pong thread panicked")??;
    echo.join().map_err(|_| "the echo thread panicked")??;
    Ok(ns)
}

/// The host's load average over the last minute (the machine may be shared).
fn load_average() -> f64 {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}
