//! What accounting costs on the exit path: the accounting work of one exit, alone.
//!
//! The round trip it sits on needs a guest workload, so it is measured where workloads are
//! built ([`guest`](crate::guest), the criterion benches), with
//! [`PartitionConfig::accounting`](hvstats_kvm::PartitionConfig) on and off. A measurement,
//! never a test.

use std::time::{Duration, Instant};

use hvstats::SharedPage;
use hvstats_abi::ObjectKind;

use hvstats_kvm::accounting::{ExitAccounting, UserExit};
use hvstats_kvm::cycles;
use hvstats_sources::user_exits::UserExitCounts;

/// The accounting work of one exit on its own (two clock reads and the page updates), averaged
/// over `n` exits.
pub fn accounting_alone(n: u32) -> Duration {
    let Ok(page) = SharedPage::anonymous(ObjectKind::Vp) else { return Duration::ZERO };
    let user = UserExitCounts::default();
    let mut acct = ExitAccounting::new(true);
    let start = Instant::now();
    for _ in 0..n {
        let t0 = cycles::now();
        acct.record(&page, &user, std::hint::black_box(UserExit::Io), cycles::now().wrapping_sub(t0));
    }
    start.elapsed() / n.max(1)
}
