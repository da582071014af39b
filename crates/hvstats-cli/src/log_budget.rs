//! The observers' log budget: however fast VMs come and go, the log grows by a bounded number of
//! lines. Every line an observer loop says (attaches, detaches, refusals, the mshv reader's)
//! spends from one budget: [`BURST`] lines at once, then one per [`REFILL`]. What the budget
//! holds back is summed up once per summary period (a minute; `HVSTATS_LOG_SUMMARY_SECONDS`
//! for tests): how many lines were held back, how many VMs came and went, were attached and
//! were refused meanwhile.

use std::time::{Duration, Instant};

use hvstats_observe::ObserverEvent;

/// Lines said at once before the budget holds any back.
pub(crate) const BURST: u32 = 24;

/// The time that earns one more line.
pub(crate) const REFILL: Duration = Duration::from_secs(6);

/// How often what was held back is summed up, unless `HVSTATS_LOG_SUMMARY_SECONDS` says.
pub(crate) const SUMMARY_EVERY: Duration = Duration::from_secs(60);

/// What happened since the last summary.
#[derive(Debug, Default)]
struct Period {
    held: usize,
    attached: usize,
    detached: usize,
    refused: usize,
}

/// The budget of one observer loop's log.
#[derive(Debug)]
pub(crate) struct LogBudget {
    /// Lines that may be said now.
    lines: f64,
    /// When `lines` was last refilled.
    refilled: Instant,
    /// How often what was held back is summed up.
    summary_every: Duration,
    /// Since when the current period runs.
    since: Instant,
    period: Period,
}

impl LogBudget {
    /// A full budget at `now`, summing up every [`SUMMARY_EVERY`] (or what
    /// `HVSTATS_LOG_SUMMARY_SECONDS` says).
    pub(crate) fn new(now: Instant) -> Self {
        let summary_every = std::env::var("HVSTATS_LOG_SUMMARY_SECONDS")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(SUMMARY_EVERY, Duration::from_secs_f64);
        Self::with_summary_every(now, summary_every)
    }

    /// A full budget at `now`, summing up every `summary_every`.
    pub(crate) fn with_summary_every(now: Instant, summary_every: Duration) -> Self {
        Self { lines: f64::from(BURST), refilled: now, summary_every, since: now, period: Period::default() }
    }

    /// Counts what `event` says of a VM for the next summary (said or not).
    pub(crate) fn note(&mut self, event: &ObserverEvent) {
        match event {
            ObserverEvent::Attached { .. } => self.period.attached += 1,
            ObserverEvent::Detached { .. } => self.period.detached += 1,
            ObserverEvent::Refused { .. } | ObserverEvent::Deferred { .. } | ObserverEvent::Failed { .. } => {
                self.period.refused += 1;
            }
            _ => {}
        }
    }

    /// True when a line may be said at `now` (it is then spent); else it is counted as held back.
    pub(crate) fn admit(&mut self, now: Instant) -> bool {
        let earned = now.saturating_duration_since(self.refilled).as_secs_f64() / REFILL.as_secs_f64();
        self.lines = (self.lines + earned).min(f64::from(BURST));
        self.refilled = now;
        if self.lines >= 1.0 {
            self.lines -= 1.0;
            true
        } else {
            self.period.held += 1;
            false
        }
    }

    /// Once a period, when lines were held back in it: the line that sums it up.
    pub(crate) fn summary(&mut self, now: Instant) -> Option<String> {
        let elapsed = now.saturating_duration_since(self.since);
        if elapsed < self.summary_every {
            return None;
        }
        let period = std::mem::take(&mut self.period);
        self.since = now;
        (period.held > 0).then(|| {
            format!(
                "in the last {:.0} s: {} VMs came and went; {} attached, {} refused ({} log lines held back: \
                 the log says at most {BURST} lines at once, then one per {} s)",
                elapsed.as_secs_f64(),
                period.detached,
                period.attached,
                period.refused,
                period.held,
                REFILL.as_secs()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hvstats_observe::vm::Departure;

    #[test]
    fn sixty_vms_in_twenty_seconds_say_a_bounded_log_and_one_summary_a_period() {
        let start = Instant::now();
        let mut budget = LogBudget::with_summary_every(start, Duration::from_secs(60));
        let (mut said, mut summaries) = (0, Vec::new());
        // Sixty VMs, one every 0.33 s, each attached and detached: 120 lines asked for.
        for n in 0..60u64 {
            let at = start + Duration::from_millis(n * 333);
            for event in [
                ObserverEvent::Attached {
                    pid: n as i32,
                    name: "vm".into(),
                    vmm: "qemu",
                    vcpus: 1,
                    partition: n,
                    fds: 2,
                    threads: 1,
                    left_out: 0,
                    qmp: None,
                    qmp_error: None,
                },
                ObserverEvent::Detached { pid: n as i32, name: "vm".into(), why: Departure::Exited },
            ] {
                budget.note(&event);
                said += usize::from(budget.admit(at));
            }
            summaries.extend(budget.summary(at));
        }
        // 24 at once, then one per 6 s over 20 s.
        assert!(said <= 24 + 4, "{said} lines said");
        assert!(summaries.is_empty(), "a period is a minute: {summaries:?}");
        let summary = budget.summary(start + Duration::from_secs(61)).unwrap();
        assert!(summary.contains("60 VMs came and went; 60 attached, 0 refused"), "{summary}");
        assert!(budget.summary(start + Duration::from_secs(122)).is_none(), "nothing held back since");
    }
}
