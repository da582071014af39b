//! `hvstats-bench-vmm VCPUS PACE_MS`: the bench's minimal VMM. One KVM VM of `VCPUS` vCPU threads,
//! each leaving the guest once every `PACE_MS` milliseconds, with KVM's statistics descriptors
//! open as QEMU 8.1 and later keeps them ([`hvstats_testkit::PacedVm`]). Says `ready` on standard
//! output once every vCPU runs, and ends when its standard input ends (or its parent does).

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use hvstats_testkit::PacedVm;

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let mut number = |what: &str| -> Result<u64, String> {
        args.next()
            .and_then(|a| a.parse().ok())
            .ok_or(format!("usage: hvstats-bench-vmm VCPUS PACE_MS ({what})"))
    };
    let (vcpus, pace) = (number("VCPUS")?, Duration::from_millis(number("PACE_MS")?));
    // SAFETY: prctl with a signal number has no memory effects.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let _vm = PacedVm::start(vcpus, pace).map_err(|e| format!("cannot run the VM: {e}"))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready").and_then(|()| out.flush()).map_err(|e| e.to_string())?;
    drop(out);
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hvstats-bench-vmm: {e}");
            ExitCode::FAILURE
        }
    }
}
