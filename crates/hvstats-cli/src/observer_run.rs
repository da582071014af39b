//! The observer's loop, one for `hvstats observe` and `serve --observe-all`: each interval it
//! refreshes the instance's LP pages, ticks the observer of KVM VMs (and the mshv reader, for
//! `observe --mshv`), logs what happened through the [`LogLimiter`] and within the log's
//! [`LogBudget`] (one for every line the loop says), and pauses until the next refresh or until
//! a cancel, which ends the pause at once.
//!
//! A tick that panics ends the loop with the observer marked stopped on its instance
//! (`hvstats_observer_up` 0), instead of taking the process down: `serve` keeps exporting
//! everything else, and says the observer is down.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use hvstats::Hypervisor;
use hvstats::observer_lock::{LockError, ObserverLock};
use hvstats_mshv::observer::MshvObserver;
use hvstats_observe::cancel::Cancel;
use hvstats_observe::{Observer, ObserverEvent};

use crate::log_budget::LogBudget;
use crate::observer_log::{LogLimiter, describe_mshv};

/// How an observer's loop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The cancel was set (a signal, or serve stopping).
    Cancelled,
    /// Every `--pid` process is gone; `failed` when one could not be observed.
    Finished {
        /// Whether a process could not be observed.
        failed: bool,
    },
    /// A tick panicked: the observer is marked stopped.
    Panicked,
}

/// One observer loop: what it ticks, how often, what ends it and where it logs.
pub(crate) struct Runner<'a> {
    /// The observer of KVM VMs, if any.
    pub observer: Option<&'a mut Observer>,
    /// Its instance, whose LP pages are kept.
    pub hv: Option<&'a Hypervisor>,
    /// The reader of the Microsoft Hypervisor's tree, if any.
    pub mshv: Option<&'a mut MshvObserver>,
    /// Time between ticks.
    pub interval: Duration,
    /// Ends the loop (and every QMP wait) when set.
    pub cancel: &'a Cancel,
    /// Where a line goes.
    pub log: &'a dyn Fn(&str),
}

impl Runner<'_> {
    /// Ticks until the cancel is set, every `--pid` process is gone (never while an mshv tree
    /// is read), or a tick panics.
    pub(crate) fn run(mut self) -> Ended {
        let mut failed = false;
        let mut voice = Voice { limiter: LogLimiter::default(), budget: LogBudget::new(Instant::now()) };
        loop {
            if let Some(m) = self.mshv.as_deref_mut() {
                // The mshv tree is the root's (debugfs), not an unprivileged user's to churn, and
                // its reader bounds what it says itself (64 unknown names at most): not on the
                // budget the observer of other users' VMs keeps.
                for event in m.tick() {
                    (self.log)(&describe_mshv(&event));
                }
            }
            // The instance's LP pages, as every instance keeps them; a host without procfs
            // leaves them.
            if let Some(hv) = self.hv {
                let _ = hv.refresh_lps();
            }
            if let Some(observer) = self.observer.as_deref_mut() {
                let events = match catch_unwind(AssertUnwindSafe(|| observer.tick())) {
                    Ok(events) => events,
                    Err(panic) => {
                        let what = panic
                            .downcast_ref::<&str>()
                            .map(|s| (*s).to_owned())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_default();
                        observer.mark_stopped();
                        (self.log)(&format!("the observer stopped: a refresh failed ({what})"));
                        return Ended::Panicked;
                    }
                };
                failed |= events.iter().any(|e| matches!(e, ObserverEvent::Failed { .. }));
                voice.events(&events, self.log);
                if observer.finished() && self.mshv.is_none() {
                    return Ended::Finished { failed };
                }
            }
            if let Some(line) = voice.budget.summary(Instant::now()) {
                (self.log)(&line);
            }
            if self.cancel.pause(self.interval) {
                return Ended::Cancelled;
            }
        }
    }
}

/// What an observer loop says, within its limits: a line of one kind about one VM at most once a
/// window ([`LogLimiter`]), and every line within the log's budget ([`LogBudget`]).
struct Voice {
    limiter: LogLimiter,
    budget: LogBudget,
}

impl Voice {
    /// Says the lines of a tick's `events` that the limiter lets through, as the budget has room;
    /// what the host lacks and the costlier method it falls back to (each said once by its
    /// maker) are said whatever the budget, so that a flood of VMs never silences them.
    fn events(&mut self, events: &[ObserverEvent], log: &dyn Fn(&str)) {
        let now = Instant::now();
        for event in events {
            self.budget.note(event);
            let once =
                matches!(event, ObserverEvent::CapabilityMissing(_) | ObserverEvent::PastEngineRows(_));
            if let Some(line) = self.limiter.line(event, now)
                && (once || self.budget.admit(now))
            {
                log(&line);
            }
        }
    }
}

/// An observer's mark in the runtime directory ([`hvstats::observer_mark`]): left once its
/// instance is published, removed when this is dropped (a clean stop), so an exporter started
/// after the observer was killed still reports it down.
pub(crate) struct Mark {
    dir: std::path::PathBuf,
    name: hvstats::publish::InstanceName,
}

impl Mark {
    /// Leaves the mark of `hv`'s instance under `dir`; a failure is logged, never fatal.
    pub(crate) fn leave(dir: &std::path::Path, hv: &Hypervisor, log: &dyn Fn(&str)) -> Option<Self> {
        let name = hv.published_name()?;
        match hvstats::observer_mark::leave(dir, &name) {
            Ok(()) => Some(Self { dir: dir.to_owned(), name }),
            Err(e) => {
                log(&format!(
                    "cannot leave the observer's mark: {}",
                    hvstats_host::error_chain::error_chain(&e)
                ));
                None
            }
        }
    }
}

impl Drop for Mark {
    fn drop(&mut self) {
        hvstats::observer_mark::clear(&self.dir, &self.name);
    }
}

/// Takes the runtime directory `dir` for this process's observer ([`hvstats::observer_lock`]),
/// before it adopts kept counts, claims a VM or leaves its mark there.
///
/// # Errors
/// When another observer holds it (said with who: its pid, command and since when), or the lock
/// cannot be taken.
pub(crate) fn hold_runtime_dir(dir: &std::path::Path) -> anyhow::Result<ObserverLock> {
    match hvstats::observer_lock::take(dir) {
        Ok(lock) => Ok(lock),
        Err(LockError::Held { holder, .. }) => {
            let who = match holder {
                Some(h) => {
                    let ns = h.since.duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
                    let since = crate::names::utc_time(ns as f64);
                    format!("pid {} (`{}`), since {since}", h.pid, h.command)
                }
                None => "a process starting now".to_owned(),
            };
            anyhow::bail!(
                "another observer already observes under {}: {who}; one observer per runtime \
                 directory: stop it first (its counts and claims are its own)",
                dir.display()
            )
        }
        Err(e) => {
            Err(anyhow::Error::new(e).context(format!("cannot take {} for the observer", dir.display())))
        }
    }
}
