//! Counters as perfmon presents them over an interval, from two raw readings.
//!
//! A page holds raw cumulative values; a reader turns them into what a person wants by the
//! catalog's presentation of each counter: a "/sec" count becomes a rate, a "%" time a percentage
//! of the elapsed time, a cost the average time per event of its paired count (in nanoseconds),
//! and an instantaneous value stays as it is.

use hvstats_abi::{Counter, Presentation, Unit};

/// A counter over an interval: what it shows and in which unit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Presented {
    /// The value.
    pub value: f64,
    /// Its unit, e.g. `/s`, `%`, `ns`.
    pub unit: &'static str,
}

/// Nanoseconds in one unit of `unit`, for time units.
fn nanoseconds_per(unit: Unit) -> Option<f64> {
    match unit {
        Unit::Time100ns => Some(100.0),
        Unit::Nanoseconds => Some(1.0),
        Unit::Count | Unit::Cycles | Unit::Pages => None,
    }
}

/// `counter` over `seconds`, read as `before` then `after`; `paired` is the readings of the count
/// a cost is averaged over.
///
/// `None` when there is nothing to show: a cost whose count did not move, a counter that went
/// backwards (its object was replaced), an interval that is not positive, or a histogram (a
/// distribution, read whole with `PageView::histogram`).
pub fn over_interval(
    counter: &Counter,
    before: u64,
    after: u64,
    seconds: f64,
    paired: Option<(u64, u64)>,
) -> Option<Presented> {
    if counter.presentation == Presentation::Instant {
        return Some(Presented { value: after as f64, unit: "" });
    }
    if seconds <= 0.0 || !seconds.is_finite() {
        return None;
    }
    let delta = after.checked_sub(before)? as f64;
    match counter.presentation {
        Presentation::Rate => Some(Presented { value: delta / seconds, unit: "/s" }),
        Presentation::CumulativeTime => {
            let ns = nanoseconds_per(counter.unit).unwrap_or(1.0);
            Some(Presented { value: delta * ns / seconds, unit: "ns/s" })
        }
        Presentation::PercentTime => {
            let ns = nanoseconds_per(counter.unit)?;
            Some(Presented { value: 100.0 * delta * ns / (seconds * 1e9), unit: "%" })
        }
        Presentation::Cost => {
            let (count_before, count_after) = paired?;
            let events = count_after.checked_sub(count_before)?;
            if events == 0 {
                return None;
            }
            let ns = nanoseconds_per(counter.unit).unwrap_or(1.0);
            Some(Presented { value: delta * ns / events as f64, unit: "ns" })
        }
        // A distribution, not one number: read it whole with `PageView::histogram`.
        Presentation::Histogram => None,
        Presentation::Instant => unreachable!("handled above"),
    }
}

#[cfg(test)]
mod tests {
    use hvstats_abi::catalog::{lp, partition, vp};

    use super::*;

    fn row(id: hvstats_abi::CounterId) -> &'static Counter {
        id.counter().unwrap()
    }

    #[test]
    fn each_presentation_over_two_seconds() {
        let rate = over_interval(row(vp::CPUID_INSTRUCTIONS), 100, 700, 2.0, None).unwrap();
        assert_eq!(rate, Presented { value: 300.0, unit: "/s" });
        // 5_000_000 × 100 ns = 0.5 s busy in 2 s: 25 %.
        let pct = over_interval(row(lp::TOTAL_RUN_TIME), 0, 5_000_000, 2.0, None).unwrap();
        assert_eq!(pct, Presented { value: 25.0, unit: "%" });
        // 30 × 100 ns over 6 hypercalls: 500 ns each.
        let cost = over_interval(row(vp::HYPERCALLS_COST), 10, 40, 2.0, Some((4, 10))).unwrap();
        assert_eq!(cost, Presented { value: 500.0, unit: "ns" });
        let instant = over_interval(row(partition::VIRTUAL_PROCESSORS), 2, 4, 2.0, None).unwrap();
        assert_eq!(instant, Presented { value: 4.0, unit: "" });
        let switch = over_interval(row(lp::CONTEXT_SWITCH_TIME), 0, 4_000, 2.0, None).unwrap();
        assert_eq!(switch, Presented { value: 2_000.0, unit: "ns/s" });
    }

    #[test]
    fn nothing_to_show_is_none_not_zero() {
        assert_eq!(over_interval(row(vp::HYPERCALLS_COST), 10, 10, 1.0, Some((3, 3))), None);
        assert_eq!(over_interval(row(vp::CPUID_INSTRUCTIONS), 9, 5, 1.0, None), None);
        assert_eq!(over_interval(row(vp::CPUID_INSTRUCTIONS), 1, 5, 0.0, None), None);
    }
}
