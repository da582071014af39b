//! Cancellation: a flag a signal watcher sets, which the observer's waits (each QMP exchange, and
//! the observing commands' pause between refreshes) look at every [`CANCEL_POLL`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How often a wait looks at its [`Cancel`].
pub const CANCEL_POLL: Duration = Duration::from_millis(100);

/// A flag another thread sets to end every wait now (a signal asked the observer to stop).
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// A flag not set yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the flag: waits in progress end within [`CANCEL_POLL`], later ones at once.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// True once [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}
