//! Counters as perfmon presents them over an interval, from two raw readings.
//!
//! A page holds raw cumulative values; a reader turns them into what a person wants by the
//! catalog's presentation of each counter: a "/sec" count becomes a rate, a "%" time a percentage
//! of the elapsed time, a cost the average time per event of its paired count (in nanoseconds),
//! and an instantaneous value stays as it is. [`VP_COLUMNS`] picks the VP counters a live view
//! shows, each presented the same way.

use hvstats_abi::catalog::vp;
use hvstats_abi::{Counter, CounterId, Presentation, Source, Unit};

use hvstats::snapshot::ObjectReading;

/// A counter over an interval: what it shows and in which unit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Presented {
    /// The number in `unit`: per second, % (at most 100), ns per second, ns per event, or as is.
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

/// The presentation a reader gives `counter` over an interval: the catalog's, except time halted
/// ([`Counter::is_time_halted`], the seed's HLT cost), which is the share of the interval the VP
/// spent halted (% of one processor), not an average per HLT.
pub fn shown_as(counter: &Counter) -> Presentation {
    if counter.is_time_halted() { Presentation::PercentTime } else { counter.presentation }
}

/// The name a reader shows for `counter`: the catalog's, except time halted, whose seed name
/// ("HLT instructions cost") would read as time spent handling HLTs.
pub fn shown_name(counter: &Counter) -> &'static str {
    if counter.is_time_halted() { TIME_HALTED_NAME } else { counter.name }
}

/// What readers call [`Counter::is_time_halted`]'s counter.
pub const TIME_HALTED_NAME: &str = "HLT time halted";

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
    if matches!(counter.presentation, Presentation::Instant | Presentation::State) {
        return Some(Presented { value: after as f64, unit: "" });
    }
    if seconds <= 0.0 || !seconds.is_finite() {
        return None;
    }
    let delta = after.checked_sub(before)? as f64;
    match shown_as(counter) {
        Presentation::Rate => Some(Presented { value: delta / seconds, unit: "/s" }),
        Presentation::CumulativeTime => {
            let ns = nanoseconds_per(counter.unit).unwrap_or(1.0);
            Some(Presented { value: delta * ns / seconds, unit: "ns/s" })
        }
        Presentation::PercentTime => {
            let ns = nanoseconds_per(counter.unit)?;
            // One processor's time: capped at 100 % as perfmon caps it (PDH_FMT_NOCAP100 aside),
            // since a reader's interval and the collector's writes are not in phase.
            Some(Presented { value: (100.0 * delta * ns / (seconds * 1e9)).min(100.0), unit: "%" })
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
        Presentation::Instant | Presentation::State => unreachable!("handled above"),
    }
}

/// What a table shows for a rate, share or cost whose two readings hold the same refresh of its
/// publisher: no count moved between them, so there is no rate to show (not a 0, and not the
/// `-` of a counter nothing maintains).
pub const SAME_PUBLICATION: &str = "=";

/// What dates the counts of two readings of one object, so a rate is taken over the time between
/// the two refreshes that took them, never over the reader's clock (which a refresh is not in
/// phase with: a reader at the publisher's own period would see a refresh, then none, then two).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatedBy {
    /// The page's own publication time ([`vp::PUBLISHED`]), read with its counts.
    Page,
    /// The instance's last refresh, from its arena's header: a page of an older publisher,
    /// which carries no time of its own (or a kind of page that has none).
    Instance,
    /// The reader's clock: nothing says when the counts were taken.
    Reader,
}

impl DatedBy {
    /// Its name in JSON and recordings: `page`, `instance refresh`, `reader`.
    pub const fn name(self) -> &'static str {
        match self {
            DatedBy::Page => "page",
            DatedBy::Instance => "instance refresh",
            DatedBy::Reader => "reader",
        }
    }
}

/// How far apart two readings of one object are: the time between the refreshes whose counts
/// they hold, and between the readings themselves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Interval {
    /// Seconds between the two refreshes the readings hold (0: the same one; negative: the
    /// object was replaced in between).
    pub published: f64,
    /// What dated them.
    pub dated_by: DatedBy,
    /// Seconds between the two readings on the reader's clock.
    pub read: f64,
    /// True when the object's run-loop counts are written as they happen (a VP of our own
    /// partitions, whose run loop counts each exit it handles): those are dated by the reader's
    /// clock, every other count by its refresh.
    pub live_run_loop: bool,
}

impl Interval {
    /// The interval between `before` and `after`, read `read` seconds apart: dated by the pages'
    /// publication times when both carry one, else by `refreshed_us`, the instance's last refresh
    /// (µs) at each reading, when both are known, else by the reader's clock.
    pub fn between(
        before: &ObjectReading,
        after: &ObjectReading,
        read: f64,
        refreshed_us: (Option<u64>, Option<u64>),
        live_run_loop: bool,
    ) -> Self {
        let name = vp::PUBLISHED.counter().map_or("", |c| c.name);
        let published = (before.get(name), after.get(name));
        Self::dated(published, refreshed_us, read, live_run_loop)
    }

    /// As [`between`](Self::between), from the pages' publication times (ns, 0 or `None` for a
    /// page without one) rather than from the readings.
    pub fn dated(
        published_ns: (Option<u64>, Option<u64>),
        refreshed_us: (Option<u64>, Option<u64>),
        read: f64,
        live_run_loop: bool,
    ) -> Self {
        let stamped = |t: Option<u64>| t.filter(|&t| t != 0);
        let (published, dated_by) = match (stamped(published_ns.0), stamped(published_ns.1), refreshed_us) {
            (Some(b), Some(a), _) => (seconds_between(b, a, 1e9), DatedBy::Page),
            (_, _, (Some(b), Some(a))) => (seconds_between(b, a, 1e6), DatedBy::Instance),
            _ => (read, DatedBy::Reader),
        };
        Self { published, dated_by, read, live_run_loop }
    }

    /// An interval the reader's clock alone dates (counts of a source that says nothing of
    /// when it took them).
    pub const fn by_reader(seconds: f64) -> Self {
        Self { published: seconds, dated_by: DatedBy::Reader, read: seconds, live_run_loop: false }
    }

    /// True when both readings hold the same refresh: no count moved between them, and they
    /// give no rate (absent, never 0).
    pub fn same_publication(&self) -> bool {
        self.dated_by != DatedBy::Reader && self.published == 0.0
    }

    /// The seconds `counter`'s change is taken over: `None` when the readings hold the same
    /// publication (or the object was replaced), for a count its refreshes write.
    pub fn seconds_for(&self, counter: &Counter) -> Option<f64> {
        let live = self.live_run_loop && matches!(counter.maintained.source(), Some(Source::RunLoop(_)));
        let seconds = if live { self.read } else { self.published };
        (seconds > 0.0 && seconds.is_finite()).then_some(seconds)
    }
}

/// Seconds from `before` to `after`, both in units of which `per_second` make a second; negative
/// when time went back (the object's publisher was replaced).
fn seconds_between(before: u64, after: u64, per_second: f64) -> f64 {
    match after.checked_sub(before) {
        Some(d) => d as f64 / per_second,
        None => -((before - after) as f64 / per_second),
    }
}

/// `counter` between `before` and `after`, over `interval`, as [`over_interval`] presents it;
/// `paired` is the readings of the count a cost is averaged over. An instantaneous value shows
/// as it is; anything else is `None` where the interval gives it no time (the same publication).
pub fn between(
    counter: &Counter,
    before: u64,
    after: u64,
    interval: &Interval,
    paired: Option<(u64, u64)>,
) -> Option<Presented> {
    let seconds = match counter.presentation {
        Presentation::Instant | Presentation::State => 0.0,
        _ => interval.seconds_for(counter)?,
    };
    over_interval(counter, before, after, seconds, paired)
}

/// A column of a live per-VP view (`hvstats top`): a catalog counter under a short label, shown by
/// its presentation — `%` of the interval, `/s`, or average cost in µs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    /// The short label, e.g. `CPUID`.
    pub label: &'static str,
    /// The VP counter.
    pub counter: CounterId,
}

/// The VP columns, most important first: a narrow view shows a prefix of them.
pub const VP_COLUMNS: [Column; 23] = [
    Column { label: "Run", counter: vp::TOTAL_RUN_TIME },
    Column { label: "Exits", counter: vp::EXITS },
    Column { label: "Hcall", counter: vp::HYPERCALLS },
    Column { label: "Hcall", counter: vp::HYPERCALLS_COST },
    Column { label: "IO", counter: vp::IO_INSTRUCTIONS },
    Column { label: "IO", counter: vp::IO_INSTRUCTIONS_COST },
    Column { label: "CPUID", counter: vp::CPUID_INSTRUCTIONS },
    Column { label: "CPUID", counter: vp::CPUID_INSTRUCTIONS_COST },
    Column { label: "MSR", counter: vp::MSR_ACCESSES },
    Column { label: "MSR", counter: vp::MSR_ACCESSES_COST },
    Column { label: "HLT", counter: vp::HLT_INSTRUCTIONS },
    Column { label: "Halted", counter: vp::HLT_INSTRUCTIONS_COST },
    Column { label: "APIC", counter: vp::APIC_MMIO_ACCESSES },
    Column { label: "Other", counter: vp::OTHER_INTERCEPTS },
    Column { label: "Other", counter: vp::OTHER_INTERCEPTS_COST },
    Column { label: "Emul", counter: vp::EMULATED_INSTRUCTIONS },
    Column { label: "GuestPF", counter: vp::REFLECTED_GUEST_PAGE_FAULTS },
    Column { label: "HostPF", counter: vp::HOST_PAGE_FAULTS },
    Column { label: "Hv", counter: vp::HYPERVISOR_RUN_TIME },
    Column { label: "Intr", counter: vp::VIRTUAL_INTERRUPTS },
    Column { label: "ExtIntr", counter: vp::EXTERNAL_INTERRUPTS },
    Column { label: "Migr", counter: vp::LOGICAL_PROCESSOR_MIGRATIONS },
    Column { label: "Wait", counter: vp::CPU_WAIT_TIME_PER_DISPATCH },
];

impl Column {
    /// The catalog row.
    ///
    /// # Panics
    /// Never for the columns of [`VP_COLUMNS`] (a test checks each); only for an id made by hand
    /// that is not in the catalog.
    #[allow(clippy::expect_used, reason = "every column names a catalog counter; a test checks each")]
    pub fn counter(&self) -> &'static Counter {
        self.counter.counter().expect("columns name catalog counters")
    }

    /// The header: the label and the presented unit (`Run%`, `IO/s`, `IO µs`).
    pub fn header(&self) -> String {
        match shown_as(self.counter()) {
            Presentation::PercentTime => format!("{}%", self.label),
            Presentation::Rate => format!("{}/s", self.label),
            Presentation::Cost => format!("{} µs", self.label),
            Presentation::CumulativeTime => format!("{} ns/s", self.label),
            Presentation::Instant | Presentation::Histogram | Presentation::State => self.label.to_owned(),
        }
    }

    /// The value shown over `interval` between `before` and `after`, in the header's unit.
    ///
    /// `None` when there is nothing to show: the counter is not maintained, either reading lacks
    /// it, the readings hold the same publication, or [`over_interval`] has nothing (a cost
    /// without events, a counter that went back).
    pub fn value(&self, before: &ObjectReading, after: &ObjectReading, interval: &Interval) -> Option<f64> {
        let counter = self.counter();
        if !counter.is_maintained_anywhere() {
            return None;
        }
        let paired = match counter.paired_count() {
            Some(p) => Some((before.get(p.name)?, after.get(p.name)?)),
            None => None,
        };
        let shown = between(counter, before.get(counter.name)?, after.get(counter.name)?, interval, paired)?;
        Some(if shown_as(counter) == Presentation::Cost { shown.value / 1000.0 } else { shown.value })
    }
}

/// A time in nanoseconds with a human unit: `850ns`, `1.0µs`, `33µs`, `5.2ms`, `1.1s`, and from
/// 100 s on in minutes, hours and days: `8m00s`, `5h27m`, `3d04h`.
pub fn human_ns(ns: u64) -> String {
    let seconds = ns / 1_000_000_000;
    match seconds {
        0..100 => {}
        100..3_600 => return format!("{}m{:02}s", seconds / 60, seconds % 60),
        3_600..86_400 => return format!("{}h{:02}m", seconds / 3_600, seconds % 3_600 / 60),
        _ => return format!("{}d{:02}h", seconds / 86_400, seconds % 86_400 / 3_600),
    }
    let ns = ns as f64;
    let (value, unit) = match ns {
        n if n < 1e3 => return format!("{n:.0}ns"),
        n if n < 1e6 => (n / 1e3, "µs"),
        n if n < 1e9 => (n / 1e6, "ms"),
        n => (n / 1e9, "s"),
    };
    if value < 99.95 { format!("{value:.1}{unit}") } else { format!("{value:.0}{unit}") }
}

#[cfg(test)]
mod tests {
    use hvstats_abi::catalog::{lp, partition, vp};

    use super::*;

    #[test]
    fn a_reader_out_of_phase_with_the_collector_still_sees_at_most_100_percent() {
        // A reader's 1 s interval that spans 1.1 s of collector writes.
        let shown = over_interval(
            hvstats_abi::catalog::lp::TOTAL_RUN_TIME.counter().unwrap(),
            0,
            11_000_000,
            1.0,
            None,
        );
        assert_eq!(shown.map(|p| p.value), Some(100.0));
        let shown = over_interval(
            hvstats_abi::catalog::lp::TOTAL_RUN_TIME.counter().unwrap(),
            0,
            2_500_000,
            1.0,
            None,
        );
        assert_eq!(shown.map(|p| p.value), Some(25.0));
    }

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

    fn reading(values: &[(CounterId, u64)]) -> ObjectReading {
        ObjectReading::Counters(
            hvstats_abi::catalog::counters_of(hvstats_abi::ObjectKind::Vp)
                .map(|c| (c, values.iter().find(|(id, _)| *id == c.id).map_or(0, |(_, v)| *v)))
                .collect(),
        )
    }

    #[test]
    fn columns_show_percent_rate_and_cost_in_microseconds() {
        let before = reading(&[(vp::IO_INSTRUCTIONS, 10), (vp::IO_INSTRUCTIONS_COST, 100)]);
        let after = reading(&[
            (vp::IO_INSTRUCTIONS, 30),
            (vp::IO_INSTRUCTIONS_COST, 100 + 20 * 35),
            (vp::TOTAL_RUN_TIME, 5_000_000),
        ]);
        let col = |id| VP_COLUMNS.iter().find(|c| c.counter == id).unwrap();
        assert_eq!(col(vp::IO_INSTRUCTIONS).header(), "IO/s");
        assert_eq!(col(vp::IO_INSTRUCTIONS).value(&before, &after, &Interval::by_reader(2.0)), Some(10.0));
        // 20 exits took 700 × 100 ns: 3.5 µs each.
        assert_eq!(col(vp::IO_INSTRUCTIONS_COST).header(), "IO µs");
        assert_eq!(
            col(vp::IO_INSTRUCTIONS_COST).value(&before, &after, &Interval::by_reader(2.0)),
            Some(3.5)
        );
        assert_eq!(col(vp::TOTAL_RUN_TIME).header(), "Run%");
        assert_eq!(col(vp::TOTAL_RUN_TIME).value(&before, &after, &Interval::by_reader(2.0)), Some(25.0));
        // No CPUID exits: no average cost, not 0 µs.
        assert_eq!(col(vp::CPUID_INSTRUCTIONS_COST).value(&before, &after, &Interval::by_reader(2.0)), None);
    }

    #[test]
    fn time_halted_is_a_share_of_the_interval_per_vp_not_a_time_per_hlt() {
        // 18 HLTs in 1 s, halted 0.9 s of it: 90 % halted, not 50 ms per HLT.
        let halted = row(vp::HLT_INSTRUCTIONS_COST);
        let shown = over_interval(halted, 0, 9_000_000, 1.0, Some((0, 18))).unwrap();
        assert_eq!(shown, Presented { value: 90.0, unit: "%" });
        // Halted throughout without a HLT in the interval: 100 %, where an average per HLT has
        // nothing to divide by.
        assert_eq!(over_interval(halted, 0, 10_000_000, 1.0, Some((5, 5))).map(|p| p.value), Some(100.0));
        let col = VP_COLUMNS.iter().find(|c| c.counter == vp::HLT_INSTRUCTIONS_COST).unwrap();
        assert_eq!(col.header(), "Halted%");
        let before = reading(&[(vp::HLT_INSTRUCTIONS, 10)]);
        let after = reading(&[(vp::HLT_INSTRUCTIONS, 12), (vp::HLT_INSTRUCTIONS_COST, 5_000_000)]);
        assert_eq!(col.value(&before, &after, &Interval::by_reader(2.0)), Some(25.0));
        // Every other cost stays an average per event.
        assert_eq!(shown_as(row(vp::IO_INSTRUCTIONS_COST)), Presentation::Cost);
    }

    #[test]
    fn every_column_names_a_vp_counter_once() {
        for (i, c) in VP_COLUMNS.iter().enumerate() {
            assert_eq!(c.counter().id.kind, hvstats_abi::ObjectKind::Vp);
            assert!(VP_COLUMNS[..i].iter().all(|o| o.counter != c.counter), "{}", c.header());
        }
    }

    #[test]
    fn long_times_read_in_minutes_hours_and_days_not_as_a_pile_of_seconds() {
        let s = 1_000_000_000u64;
        assert_eq!(human_ns(54_604_973), "54.6ms");
        assert_eq!(human_ns(99 * s), "99.0s");
        assert_eq!(human_ns(480 * s), "8m00s");
        assert_eq!(human_ns(2_094 * s), "34m54s");
        assert_eq!(human_ns(19_620 * s), "5h27m");
        assert_eq!(human_ns(273_600 * s), "3d04h");
    }

    /// A VP reading whose page says it was published at `published_ns`.
    fn published(published_ns: u64, values: &[(CounterId, u64)]) -> ObjectReading {
        let mut all = values.to_vec();
        all.push((vp::PUBLISHED, published_ns));
        reading(&all)
    }

    #[test]
    fn a_rate_is_taken_over_the_time_between_publications_not_the_readers_clock() {
        let col = |id| VP_COLUMNS.iter().find(|c| c.counter == id).unwrap();
        let exits = col(vp::CPUID_INSTRUCTIONS);
        // Refreshed at 10 s and 11 s, with 54 exits in between; read 0.5 s apart (the reader
        // caught the second refresh just after it): 54/s, not 108/s.
        let t0 = 10_000_000_000;
        let before = published(t0, &[(vp::CPUID_INSTRUCTIONS, 1_000)]);
        let after = published(t0 + 1_000_000_000, &[(vp::CPUID_INSTRUCTIONS, 1_054)]);
        let interval = Interval::between(&before, &after, 0.5, (None, None), false);
        assert_eq!(interval.dated_by, DatedBy::Page);
        assert!(!interval.same_publication());
        assert_eq!(exits.value(&before, &after, &interval), Some(54.0));
        // The next reading, 0.5 s later, holds the same refresh: no rate, not 0.
        let again = Interval::between(&after, &after.clone(), 0.5, (None, None), false);
        assert!(again.same_publication());
        assert_eq!(exits.value(&after, &after, &again), None);
        // Run time as a share of the time between publications: 0.25 s in 1 s, not in 0.5 s.
        let before = published(t0, &[(vp::TOTAL_RUN_TIME, 0)]);
        let after = published(t0 + 1_000_000_000, &[(vp::TOTAL_RUN_TIME, 2_500_000)]);
        let interval = Interval::between(&before, &after, 0.5, (None, None), false);
        assert_eq!(col(vp::TOTAL_RUN_TIME).value(&before, &after, &interval), Some(25.0));
        assert_eq!(col(vp::TOTAL_RUN_TIME).value(&after, &after, &again), None);
    }

    #[test]
    fn pages_without_their_own_time_fall_back_to_the_instances_refresh_then_the_reader() {
        let before = reading(&[(vp::CPUID_INSTRUCTIONS, 100)]);
        let after = reading(&[(vp::CPUID_INSTRUCTIONS, 300)]);
        let by_instance = Interval::between(&before, &after, 0.5, (Some(5_000_000), Some(7_000_000)), false);
        assert_eq!(by_instance.dated_by, DatedBy::Instance);
        assert_eq!(by_instance.published, 2.0);
        let same = Interval::between(&before, &before, 0.5, (Some(5_000_000), Some(5_000_000)), false);
        assert!(same.same_publication());
        assert_eq!(between(row(vp::CPUID_INSTRUCTIONS), 100, 100, &same, None), None);
        let by_reader = Interval::between(&before, &after, 0.5, (None, Some(5_000_000)), false);
        assert_eq!(by_reader.dated_by, DatedBy::Reader);
        assert!(!by_reader.same_publication());
        assert_eq!(
            between(row(vp::CPUID_INSTRUCTIONS), 100, 300, &by_reader, None).map(|p| p.value),
            Some(400.0)
        );
        // One page stamped, the other not (a publisher restarted older): the instance decides.
        let mixed = Interval::between(&published(9, &[]), &after, 0.5, (Some(1), Some(1_000_001)), false);
        assert_eq!((mixed.dated_by, mixed.published), (DatedBy::Instance, 1.0));
    }

    #[test]
    fn counts_a_run_loop_writes_as_they_happen_are_dated_by_the_reader() {
        let t0 = 1_000_000_000;
        let before = published(t0, &[(vp::IO_INTERCEPT_MESSAGES, 0), (vp::TOTAL_RUN_TIME, 0)]);
        let after = published(t0, &[(vp::IO_INTERCEPT_MESSAGES, 50), (vp::TOTAL_RUN_TIME, 0)]);
        let interval = Interval::between(&before, &after, 0.5, (None, None), true);
        assert!(interval.same_publication());
        let io = row(vp::IO_INTERCEPT_MESSAGES);
        assert!(matches!(io.maintained.source(), Some(Source::RunLoop(_))));
        assert_eq!(between(io, 0, 50, &interval, None).map(|p| p.value), Some(100.0));
        assert_eq!(between(row(vp::TOTAL_RUN_TIME), 0, 0, &interval, None), None);
        // Of a publisher whose every count is refreshed (an observer), the refresh dates them.
        let observed = Interval { live_run_loop: false, ..interval };
        assert_eq!(between(io, 0, 50, &observed, None), None);
    }

    #[test]
    fn a_publication_time_that_went_back_gives_no_rate() {
        let before = published(5_000_000_000, &[(vp::CPUID_INSTRUCTIONS, 10)]);
        let after = published(1_000_000_000, &[(vp::CPUID_INSTRUCTIONS, 20)]);
        let interval = Interval::between(&before, &after, 1.0, (None, None), false);
        assert!(interval.published < 0.0 && !interval.same_publication());
        assert_eq!(between(row(vp::CPUID_INSTRUCTIONS), 10, 20, &interval, None), None);
        // An instant value shows as it is, whatever the interval.
        assert_eq!(
            between(row(partition::VIRTUAL_PROCESSORS), 2, 4, &interval, None).map(|p| p.value),
            Some(4.0)
        );
    }

    #[test]
    fn nothing_to_show_is_none_not_zero() {
        assert_eq!(over_interval(row(vp::HYPERCALLS_COST), 10, 10, 1.0, Some((3, 3))), None);
        assert_eq!(over_interval(row(vp::CPUID_INSTRUCTIONS), 9, 5, 1.0, None), None);
        assert_eq!(over_interval(row(vp::CPUID_INSTRUCTIONS), 1, 5, 0.0, None), None);
    }
}
