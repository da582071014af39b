//! How the command's text names what it shows: a counter's row in a table, and an instant.
//! `snapshot`'s tables, the suggestions for a mistyped counter and the observer's log all name
//! things this one way.

use hvstats_abi::{Counter, Presentation};
use hvstats_present::present;

/// A row's name: the catalog's, except that without an interval a "/sec" counter is its total
/// and a time counter its total time (the page holds cumulative values; rates need two readings).
pub(crate) fn row_name(counter: &Counter, interval: bool) -> String {
    if counter.is_time_halted() {
        return present::TIME_HALTED_NAME.to_owned() + if interval { "" } else { " (total time)" };
    }
    if interval {
        return counter.name.to_owned();
    }
    match counter.presentation {
        Presentation::Rate => match counter.name.strip_suffix("/sec") {
            Some(base) => format!("{base} (total)"),
            None => format!("{} (total)", counter.name),
        },
        // A cost's total is the time alone: "per dispatch" is what it is averaged over, which
        // only an interval gives.
        Presentation::Cost | Presentation::PercentTime | Presentation::CumulativeTime => {
            let name = counter.name.trim_start_matches("% ");
            format!("{} (total time)", name.split(" per ").next().unwrap_or(name))
        }
        _ => counter.name.to_owned(),
    }
}

/// A Unix time in nanoseconds as RFC 3339 in UTC, to the millisecond (`2026-11-27T22:49:10.374Z`);
/// the number itself when it is no representable time.
pub(crate) fn utc_time(ns: f64) -> String {
    let at = time::OffsetDateTime::from_unix_timestamp_nanos((ns / 1e6).round() as i128 * 1_000_000);
    match at.ok().and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok()) {
        Some(text) => text,
        None => format!("{ns:.0} ns since 1970"),
    }
}
