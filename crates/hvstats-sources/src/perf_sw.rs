//! perf software events on a VP thread: CPU migrations ("Logical processor migrations/sec").

use std::io;

use hvstats_host::perf_event::{PerfCounter, SW_CPU_MIGRATIONS, TYPE_SOFTWARE};

/// The migrations of one thread between host CPUs.
#[derive(Debug)]
pub struct Migrations(PerfCounter);

impl Migrations {
    /// Starts counting the migrations of thread `tid`.
    ///
    /// # Errors
    /// When perf refuses the event.
    pub fn open(tid: libc::pid_t) -> io::Result<Self> {
        PerfCounter::open(TYPE_SOFTWARE, SW_CPU_MIGRATIONS, tid).map(Self)
    }

    /// Migrations so far.
    ///
    /// # Errors
    /// When the read fails.
    pub fn read(&self) -> io::Result<u64> {
        self.0.read()
    }
}
