//! A row of the report and how rows are measured: medians of interleaved rounds, each side timed
//! in the CPU time of the thread doing it.

use std::time::Duration;

use serde_json::{Value, json};

/// One row of the report.
#[derive(Clone, Debug, PartialEq)]
pub enum Row {
    /// Both sides measured.
    Measured {
        /// What was measured, against what.
        name: &'static str,
        /// Our side.
        ours: f64,
        /// The baseline.
        baseline: f64,
        /// The unit of both sides.
        unit: &'static str,
        /// The most `ours / baseline` may be, when the row has a goal.
        goal: Option<f64>,
    },
    /// Not measured on this host.
    Skipped {
        /// The row's name.
        name: &'static str,
        /// Why not.
        why: String,
    },
}

/// The table's header line, matching [`Row::table_line`].
pub fn table_header() -> String {
    format!(
        "{:<30} {:>14} {:>14} {:>12} {:>8} {:>6} {:>6}",
        "row", "ours", "baseline", "unit", "ratio", "goal", "met"
    )
}

impl Row {
    /// The row as one `bench --json` object: `{"name", "ours", "baseline", "unit", "ratio",
    /// "goal", "met"}`, or `{"name", "skipped"}`.
    pub fn json(&self) -> Value {
        match self {
            Row::Measured { name, ours, baseline, unit, goal } => json!({
                "name": name, "ours": ours, "baseline": baseline, "unit": unit,
                "ratio": ours / baseline, "goal": goal, "met": self.met(),
            }),
            Row::Skipped { name, why } => json!({ "name": name, "skipped": why }),
        }
    }

    /// The row as one line of the table under [`table_header`].
    pub fn table_line(&self) -> String {
        match self {
            Row::Measured { name, ours, baseline, unit, goal } => format!(
                "{name:<30} {ours:>14.3} {baseline:>14.3} {unit:>12} {:>8.3} {:>6} {:>6}",
                ours / baseline,
                goal.map_or("-".to_owned(), |g| format!("<={g}")),
                self.mark(),
            ),
            Row::Skipped { name, why } => format!("{name:<30} skipped: {why}"),
        }
    }

    /// Whether a measured row's ratio is within its goal: `None` without a goal (or a measure).
    /// A ratio that is not a number (a side that measured nothing) misses its goal.
    pub fn met(&self) -> Option<bool> {
        match self {
            Row::Measured { ours, baseline, goal: Some(goal), .. } => Some(ours / baseline <= *goal),
            Row::Measured { goal: None, .. } | Row::Skipped { .. } => None,
        }
    }

    /// The row's name.
    pub fn name(&self) -> &'static str {
        match self {
            Row::Measured { name, .. } | Row::Skipped { name, .. } => name,
        }
    }

    /// The table's mark for [`met`](Self::met).
    pub fn mark(&self) -> &'static str {
        match self.met() {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "-",
        }
    }
}

/// Whether `--only` (each value a part of a row's name; none: every row) selects row `name`.
pub fn selects(only: &[String], name: &str) -> bool {
    only.is_empty() || only.iter().any(|part| name.contains(part.as_str()))
}

/// The median of `v` (NaN when empty).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Medians of `ours` and `baseline` over `rounds`, interleaved, alternating which goes first.
pub(crate) fn side_by_side(
    rounds: u32,
    mut ours: impl FnMut() -> f64,
    mut baseline: impl FnMut() -> f64,
) -> (f64, f64) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        if round % 2 == 0 {
            a.push(ours());
            b.push(baseline());
        } else {
            b.push(baseline());
            a.push(ours());
        }
    }
    (median(a), median(b))
}

/// The calling thread's CPU time: what single-threaded rows measure, so that time the thread
/// spends preempted on a busy host counts for neither side.
#[derive(Clone, Copy)]
pub(crate) struct CpuClock(Duration);

impl CpuClock {
    /// The calling thread's CPU time now.
    pub(crate) fn now() -> Self {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid out-pointer; CLOCK_THREAD_CPUTIME_ID always exists on Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        Self(Duration::new(ts.tv_sec.max(0) as u64, ts.tv_nsec.clamp(0, 999_999_999) as u32))
    }

    /// The calling thread's CPU time since `self`.
    pub(crate) fn elapsed(self) -> Duration {
        Self::now().0.saturating_sub(self.0)
    }
}

/// CPU nanoseconds per operation since `start`, over `n` operations.
pub(crate) fn ns_per(start: CpuClock, n: u64) -> f64 {
    start.elapsed().as_nanos() as f64 / n as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(ours: f64, baseline: f64, goal: Option<f64>) -> Row {
        Row::Measured { name: "r", ours, baseline, unit: "ns", goal }
    }

    #[test]
    fn a_row_is_marked_met_or_missed_against_its_goal_in_the_table_and_the_json() {
        let missed = measured(125.0, 409.0, Some(0.2));
        assert_eq!((missed.met(), missed.mark()), (Some(false), "MISSED"));
        assert_eq!(missed.json()["met"], false);
        let met = measured(60.0, 409.0, Some(0.2));
        assert_eq!((met.met(), met.mark()), (Some(true), "met"));
        assert_eq!(met.json()["met"], true);
        let no_goal = measured(1.0, 2.0, None);
        assert_eq!((no_goal.met(), no_goal.mark()), (None, "-"));
        assert!(no_goal.json()["met"].is_null());
        assert_eq!(measured(f64::NAN, 1.0, Some(1.0)).met(), Some(false), "nothing measured");
        let skipped = Row::Skipped { name: "r", why: "needs KVM".into() };
        assert_eq!(skipped.met(), None);
        assert!(skipped.json().get("met").is_none());
    }

    #[test]
    fn only_selects_rows_by_any_part_of_their_name_and_repeats() {
        let only = |parts: &[&str]| parts.iter().map(|p| (*p).to_owned()).collect::<Vec<_>>();
        assert!(selects(&[], "read-vp-vs-stats-fd"));
        assert!(selects(&only(&["read-vp-vs-stats-fd"]), "read-vp-vs-stats-fd"));
        assert!(!selects(&only(&["read-vp-vs-stats-fd"]), "read-vp-vs-pread-page"));
        let two = only(&["read-vp-vs-stats-fd", "snapshot-"]);
        assert!(selects(&two, "snapshot-1024-vps-vs-memcpy"));
        assert!(selects(&two, "read-vp-vs-stats-fd"));
        assert!(!selects(&two, "update-vs-fetch-add"));
    }

    #[test]
    fn the_table_lines_up_under_its_header() {
        let line = measured(60.0, 409.0, Some(0.2)).table_line();
        assert_eq!(line.len(), table_header().len(), "{line}");
        assert!(table_header().starts_with("row ") && table_header().ends_with("goal    met"));
        assert!(line.starts_with("r ") && line.ends_with("<=0.2    met"), "{line}");
    }
}
