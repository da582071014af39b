//! What accounting costs on the exit path: the userspace exit round trip measured with
//! accounting on and off, and the accounting work alone.
//!
//! Used by the criterion bench and `hvstats bench`; a measurement, never a test.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hvstats::{Hypervisor, SharedPage};
use hvstats_abi::ObjectKind;
use hvstats_guest::program::LoopCount;
use hvstats_guest::{Mode, Workload, layout};

use crate::accounting::{ExitAccounting, ExitClass, UserExitCounts};
use crate::cycles;
use crate::error::Error;
use crate::handlers::Handlers;
use crate::partition::{Partition, PartitionConfig};

/// Runs a one-VP long-mode guest doing `exits` OUTs to the sink port (each one a userspace exit)
/// and returns the VP's run time divided by the exits (the exit port write included).
///
/// # Errors
/// When the partition cannot be built or the guest does not exit cleanly.
pub fn round_trip(hv: &Arc<Hypervisor>, exits: u32, accounting: bool) -> Result<Duration, Error> {
    let workload = Workload { out: LoopCount::fixed(exits), ..Workload::default() };
    let image = workload
        .build(Mode::Long, layout::DEFAULT_LOAD_GPA)
        .map_err(|e| Error::Config(format!("building the bench guest: {e}")))?;
    let config =
        PartitionConfig { accounting, timeout: Duration::from_secs(120), ..PartitionConfig::default() };
    let partition = Partition::new(hv, config, Handlers::builtin())?;
    partition.load(image.load_gpa, &image.bytes)?;
    let report = partition.run(image.entry)?;
    let vp = &report.vps[0];
    if let Some(f) = &vp.fault {
        return Err(Error::Config(format!("bench guest faulted: {} at {:#x}", f.reason, f.rip)));
    }
    Ok(vp.run_time / (exits + 1))
}

/// The accounting work of one exit on its own (two clock reads and the page updates), averaged
/// over `n` exits.
pub fn accounting_alone(n: u32) -> Duration {
    let Ok(page) = SharedPage::anonymous(ObjectKind::Vp) else { return Duration::ZERO };
    let user = UserExitCounts::default();
    let mut acct = ExitAccounting::new(true);
    let start = Instant::now();
    for _ in 0..n {
        let t0 = cycles::now();
        acct.record(&page, &user, std::hint::black_box(ExitClass::Io), cycles::now().wrapping_sub(t0));
    }
    start.elapsed() / n.max(1)
}
