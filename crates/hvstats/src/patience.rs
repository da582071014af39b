//! How long a reader waits for a write under way to end.
//!
//! A writer keeps an entry's or a page's sequence counter odd for the microseconds of one update,
//! but a writer preempted half-way on a loaded host keeps it odd for as long as the scheduler
//! keeps it off a CPU: milliseconds, sometimes more. A reader that gave up after a count of spins
//! gave up sooner the faster it was, and reported a healthy writer's page as torn. A reader
//! therefore waits by the clock: it spins, then yields, then sleeps in growing naps until
//! [`DEADLINE`] has passed since the first nap. A writer that stopped half-way (killed, or
//! stopped by a signal) costs one such wait; a reader that remembers it ([`Patience::of`]) only
//! spins and yields for later copies, until a copy that had to retry succeeds again, so a
//! publisher whose every page is left odd cannot hold a reader for a deadline per page.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Tries that spin before the first yield.
const SPINS: u32 = 64;
/// Tries that yield before the first nap.
const YIELDS: u32 = 64;
/// The longest nap between two tries.
const LONGEST_NAP: Duration = Duration::from_millis(2);

/// The longest a reader waits for one write to end, counted from its first nap: far beyond an
/// update (microseconds) and beyond a preempted writer's wait for a CPU on a loaded host.
pub const DEADLINE: Duration = Duration::from_millis(500);

/// One copy's wait for a writer (see the module documentation).
#[derive(Debug)]
pub(crate) struct Patience<'a> {
    tries: u32,
    napping_since: Option<Instant>,
    /// Set when a wait ran out: later copies only spin and yield.
    stalled: Option<&'a AtomicBool>,
    brief: bool,
}

impl<'a> Patience<'a> {
    /// A wait that remembers in `stalled` whether the last one ran out.
    pub(crate) fn of(stalled: &'a AtomicBool) -> Self {
        let brief = stalled.load(Ordering::Relaxed);
        Self { tries: 0, napping_since: None, stalled: Some(stalled), brief }
    }

    /// A wait with nothing to remember it by: always up to the deadline.
    pub(crate) fn alone() -> Self {
        Self { tries: 0, napping_since: None, stalled: None, brief: false }
    }

    /// Waits before the next try; false when the wait is over and the copy should give up.
    pub(crate) fn wait(&mut self) -> bool {
        self.tries = self.tries.saturating_add(1);
        if self.tries <= SPINS {
            std::hint::spin_loop();
            return true;
        }
        if self.tries <= SPINS + YIELDS {
            std::thread::yield_now();
            return true;
        }
        if self.brief {
            return false;
        }
        let since = *self.napping_since.get_or_insert_with(Instant::now);
        let waited = since.elapsed();
        if waited >= DEADLINE {
            if let Some(stalled) = self.stalled {
                stalled.store(true, Ordering::Relaxed);
            }
            return false;
        }
        let doublings = (self.tries - SPINS - YIELDS).min(10);
        let nap = (Duration::from_micros(10) * (1 << doublings)).min(LONGEST_NAP).min(DEADLINE - waited);
        std::thread::sleep(nap);
        true
    }

    /// Marks the copy done: a copy that had to retry shows its writer moving again.
    pub(crate) fn succeeded(self) {
        if self.tries > 0
            && let Some(stalled) = self.stalled
        {
            stalled.store(false, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_runs_out_after_the_deadline_and_the_next_one_only_spins() {
        let stalled = AtomicBool::new(false);
        let start = Instant::now();
        let mut p = Patience::of(&stalled);
        while p.wait() {}
        assert!(start.elapsed() >= DEADLINE);
        assert!(stalled.load(Ordering::Relaxed));
        let mut brief = Patience::of(&stalled);
        let mut tries = 0;
        while brief.wait() {
            tries += 1;
        }
        assert_eq!(tries, SPINS + YIELDS);
        // A retried copy that succeeds clears the memory.
        let mut again = Patience::of(&stalled);
        assert!(again.wait());
        again.succeeded();
        assert!(!stalled.load(Ordering::Relaxed));
    }

    #[test]
    fn a_copy_that_never_waited_leaves_the_memory_alone() {
        let stalled = AtomicBool::new(true);
        Patience::of(&stalled).succeeded();
        assert!(stalled.load(Ordering::Relaxed));
    }
}
