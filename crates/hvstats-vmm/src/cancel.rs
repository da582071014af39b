//! Cancellation: a flag a signal watcher sets, which the observer's waits (each QMP exchange)
//! look at every [`CANCEL_POLL`], and which ends the observing commands' pause between refreshes
//! ([`Cancel::pause`]) at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How often a wait looks at its [`Cancel`].
pub const CANCEL_POLL: Duration = Duration::from_millis(100);

/// The flag, and what wakes a [`Cancel::pause`] when it is set.
#[derive(Debug, Default)]
struct Flag {
    set: AtomicBool,
    lock: Mutex<()>,
    woken: Condvar,
}

/// A flag another thread sets to end every wait now (a signal asked the observer to stop).
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<Flag>);

impl Cancel {
    /// A flag not set yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the flag: a pause in progress ends now, other waits within [`CANCEL_POLL`], later
    /// ones at once.
    pub fn cancel(&self) {
        let _held = self.0.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.0.set.store(true, Ordering::SeqCst);
        self.0.woken.notify_all();
    }

    /// True once [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.set.load(Ordering::SeqCst)
    }

    /// Waits `length`, or until the flag is set; true when it was set.
    pub fn pause(&self, length: Duration) -> bool {
        let until = Instant::now() + length;
        let mut held = self.0.lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if self.is_cancelled() {
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            held = match self.0.woken.wait_timeout(held, left) {
                Ok((held, _)) => held,
                Err(e) => e.into_inner().0,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_ends_when_the_flag_is_set_and_not_before_its_length_otherwise() {
        let cancel = Cancel::new();
        let t = Instant::now();
        assert!(!cancel.pause(Duration::from_millis(30)));
        assert!(t.elapsed() >= Duration::from_millis(30));
        let other = cancel.clone();
        let setter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            other.cancel();
        });
        // Ends on the flag, long before its hour.
        assert!(cancel.pause(Duration::from_secs(3600)));
        setter.join().unwrap();
        assert!(cancel.pause(Duration::from_secs(3600)), "a set flag ends every later pause at once");
    }
}
