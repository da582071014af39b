//! The keys of counters in JSON documents, derived from the catalog, so each says what its value
//! holds.
//!
//! A page holds cumulative values, which readers show as totals, as deltas over an interval, or
//! as perfmon presents them over an interval (rates, percentages, averages). The catalog's names
//! speak of the presented form ("IO instructions/sec", "Hypercalls cost"), which a total is not:
//! so a JSON key is the name in snake case with what the value holds and its unit —
//! `io_instructions_total`, `hypercalls_time_100ns_total`, `io_instructions_per_second`,
//! `hypercalls_time_per_event_ns`, `cpu_wait_time_per_dispatch_ns`, `total_run_time_percent`.
//! `hvstats catalog --json` lists every counter's keys.
//!
//! Every JSON document a command prints carries [`SCHEMA_VERSION`] under [`SCHEMA_KEY`].

use hvstats_abi::{Counter, Presentation, Unit};

use crate::metrics::snake_name;

/// The key of the version of the shape of every JSON document hvstats prints.
pub const SCHEMA_KEY: &str = "schema_version";

/// The shape of hvstats' JSON documents. 2: counters are keyed by what they hold (this module),
/// not by their catalog names, and every document carries its version.
pub const SCHEMA_VERSION: u32 = 2;

/// The key of time halted as presented: the share of the interval a VP spent halted, in %.
pub const TIME_HALTED_PERCENT: &str = "hlt_time_halted_percent";

/// What a counter's value in a document holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// The page's cumulative value, in the catalog's raw unit.
    Total,
    /// The growth of the cumulative value over an interval, in the raw unit.
    Delta,
    /// The value as perfmon presents it over an interval: per second, % of the time, average
    /// time per event in ns, or (an instantaneous value) as is.
    Presented,
}

/// The counter's name as a word, a cost without its "per …" (what it is averaged over).
fn stem(counter: &Counter) -> String {
    let word = snake_name(counter.name);
    match counter.presentation {
        Presentation::Cost => word.split("_per_").next().unwrap_or(&word).to_owned(),
        _ => word,
    }
}

/// The raw unit as a key suffix: `_100ns`, `_ns`, `_pages`, `_cycles`, or nothing for a count.
fn raw_unit(counter: &Counter, word: &str) -> &'static str {
    match counter.unit {
        Unit::Time100ns => "_100ns",
        Unit::Nanoseconds => "_ns",
        Unit::Pages if word.ends_with("_pages") => "",
        Unit::Pages => "_pages",
        Unit::Cycles => "_cycles",
        Unit::Count => "",
    }
}

/// The JSON key of `counter`'s value when it holds `held`.
///
/// ```
/// use hvstats_abi::catalog::{partition, vp};
/// use hvstats_present::json_keys::{Held, key};
///
/// let k = |id: hvstats_abi::CounterId, held| key(id.counter().unwrap(), held);
/// assert_eq!(k(vp::IO_INSTRUCTIONS, Held::Total), "io_instructions_total");
/// assert_eq!(k(vp::IO_INSTRUCTIONS, Held::Presented), "io_instructions_per_second");
/// assert_eq!(k(vp::HYPERCALLS_COST, Held::Total), "hypercalls_time_100ns_total");
/// assert_eq!(k(vp::HYPERCALLS_COST, Held::Presented), "hypercalls_time_per_event_ns");
/// assert_eq!(k(vp::CPU_WAIT_TIME_PER_DISPATCH, Held::Delta), "cpu_wait_time_ns_delta");
/// assert_eq!(k(vp::CPU_WAIT_TIME_PER_DISPATCH, Held::Presented), "cpu_wait_time_per_dispatch_ns");
/// assert_eq!(k(vp::TOTAL_RUN_TIME, Held::Presented), "total_run_time_percent");
/// assert_eq!(k(partition::GPA_PAGES, Held::Total), "gpa_pages");
/// ```
pub fn key(counter: &Counter, held: Held) -> String {
    // Time halted is presented as a share of the time, not per HLT (`present::shown_as`).
    if counter.is_time_halted() && held == Held::Presented {
        return TIME_HALTED_PERCENT.to_owned();
    }
    let word = stem(counter);
    let unit = raw_unit(counter, &word);
    match (counter.presentation, held) {
        // A value at a moment is the same whatever the document holds.
        (Presentation::Instant | Presentation::State, _) => format!("{word}{unit}"),
        (Presentation::Histogram, Held::Total) => format!("{word}_sum_ns_total"),
        (Presentation::Histogram, Held::Delta) => format!("{word}_sum_ns_delta"),
        // Documents present a histogram whole, under "histograms"; its sum over an interval would
        // be time per second.
        (Presentation::Histogram, Held::Presented) => format!("{word}_sum_ns_per_second"),
        (_, Held::Total) => format!("{word}{unit}_total"),
        (_, Held::Delta) => format!("{word}{unit}_delta"),
        (Presentation::Rate, Held::Presented) => format!("{word}_per_second"),
        (Presentation::PercentTime, Held::Presented) => format!("{word}_percent"),
        (Presentation::CumulativeTime, Held::Presented) => format!("{word}_ns_per_second"),
        (Presentation::Cost, Held::Presented) => match snake_name(counter.name).split_once("_per_") {
            Some((_, per)) => format!("{word}_per_{per}_ns"),
            None => format!("{word}_per_event_ns"),
        },
    }
}

/// The counter a key names, of any kind and any [`Held`].
pub fn counter_of_key(name: &str) -> Option<&'static Counter> {
    use std::collections::HashMap;
    use std::sync::OnceLock;
    static KEYS: OnceLock<HashMap<String, &'static Counter>> = OnceLock::new();
    let keys = KEYS.get_or_init(|| {
        hvstats_abi::CATALOG
            .iter()
            .flat_map(|c| [Held::Total, Held::Delta, Held::Presented].map(|h| (key(c, h), c)))
            .collect()
    });
    keys.get(name).copied()
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use hvstats_abi::{CATALOG, ObjectKind};

    use super::*;

    #[test]
    fn every_key_is_unique_within_its_kind_and_names_no_rate_it_does_not_hold() {
        for kind in ObjectKind::ALL {
            for held in [Held::Total, Held::Delta, Held::Presented] {
                let keys: Vec<String> =
                    CATALOG.iter().filter(|c| c.id.kind == kind).map(|c| key(c, held)).collect();
                let unique: HashSet<&String> = keys.iter().collect();
                assert_eq!(unique.len(), keys.len(), "{kind:?} {held:?}: {keys:?}");
                for k in &keys {
                    assert!(
                        k.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                        "{k}"
                    );
                    if held != Held::Presented {
                        assert!(!k.contains("per_second") && !k.ends_with("_percent"), "{k}");
                    }
                    assert_eq!(
                        counter_of_key(k).map(|c| c.id.kind == kind || key(c, held) == *k),
                        Some(true)
                    );
                }
            }
        }
    }

    #[test]
    fn times_say_their_unit_and_totals_say_they_are_totals() {
        for c in CATALOG {
            let total = key(c, Held::Total);
            match (c.presentation, c.unit) {
                (Presentation::Instant | Presentation::State, _) => {}
                (_, Unit::Time100ns) => assert!(total.ends_with("_100ns_total"), "{total}"),
                (_, Unit::Nanoseconds) => assert!(total.ends_with("ns_total"), "{total}"),
                _ => assert!(total.ends_with("_total"), "{total}"),
            }
            if c.presentation == Presentation::Cost && !c.is_time_halted() {
                assert!(key(c, Held::Presented).ends_with("_ns"), "{}", c.name);
            }
        }
    }
}
