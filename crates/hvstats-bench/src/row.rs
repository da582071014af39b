//! A row of the report, and how sure it is.
//!
//! A row keeps every round it measured: our side and the baseline's, paired by round, each round
//! measuring both. Two rounds in a row make an ABBA block (ours then the baseline, then the
//! baseline then ours), so a drift of the host during the block (a neighbour starting, the CPU
//! clocking down) weighs on both sides alike and cancels. The row reports each side's minimum,
//! median and maximum, the ratio of the medians, and an interval for the ratio: the
//! distribution-free confidence interval of the median of the blocks' ratios (order statistics of
//! the blocks, at the narrowest ranks whose binomial coverage is at least 95 %). A goal is met
//! when the whole interval is within it, missed when the whole interval is beyond it, and
//! undecided when the interval straddles it or too few blocks were measured for 95 %.
//!
//! Every single-threaded side is timed in the CPU time of the thread doing it, so time spent
//! preempted on a busy host counts for neither side.

use std::time::Duration;

use serde_json::{Map, Value, json};

/// The least coverage an interval must have for a row to say met or missed.
pub const CONFIDENCE: f64 = 0.95;

/// One side of a row over its rounds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    /// The smallest round.
    pub min: f64,
    /// The median round.
    pub median: f64,
    /// The largest round.
    pub max: f64,
}

impl Spread {
    /// The spread of `samples` (NaN everywhere when there are none).
    pub fn of(samples: &[f64]) -> Self {
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        Self {
            min: sorted.first().copied().unwrap_or(f64::NAN),
            median: median_of_sorted(&sorted),
            max: sorted.last().copied().unwrap_or(f64::NAN),
        }
    }

    fn json(&self) -> Value {
        json!({ "min": self.min, "median": self.median, "max": self.max })
    }
}

/// An interval for a row's ratio.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Interval {
    /// The lower bound.
    pub low: f64,
    /// The upper bound.
    pub high: f64,
    /// How likely the interval holds the median ratio of a block, whatever the distribution
    /// of the blocks' ratios (0 for a single block).
    pub confidence: f64,
    /// The ABBA blocks it was computed from.
    pub blocks: usize,
}

/// What a row says of its goal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The whole interval is within the goal.
    Met,
    /// The whole interval is beyond the goal.
    Missed,
    /// The interval straddles the goal, or has too little confidence to say.
    Undecided,
}

impl Verdict {
    /// The verdict's word in the table and the JSON.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::Missed => "missed",
            Verdict::Undecided => "undecided",
        }
    }
}

/// The rounds of a measured row: `ours[i]` and `baseline[i]` were measured in round `i`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rounds {
    /// Our side, by round.
    pub ours: Vec<f64>,
    /// The baseline, by round.
    pub baseline: Vec<f64>,
}

impl Rounds {
    /// Each complete ABBA block's ratio: rounds `2k` and `2k+1`, our two sides summed over the
    /// baseline's two. A block with a side that is not a positive number gives NaN.
    pub fn block_ratios(&self) -> Vec<f64> {
        self.ours
            .chunks_exact(2)
            .zip(self.baseline.chunks_exact(2))
            .map(|(a, b)| {
                let (a, b) = (a[0] + a[1], b[0] + b[1]);
                if a.is_finite() && b.is_finite() && a >= 0.0 && b > 0.0 { a / b } else { f64::NAN }
            })
            .collect()
    }
}

/// One row of the report.
#[derive(Clone, Debug, PartialEq)]
pub enum Row {
    /// Both sides measured.
    Measured {
        /// What was measured, against what.
        name: &'static str,
        /// The rounds of both sides.
        rounds: Rounds,
        /// The unit of both sides.
        unit: &'static str,
        /// The most `ours / baseline` may be, when the row has a goal.
        goal: Option<f64>,
        /// What else the row found, by name (a scrape's series and bytes).
        facts: Vec<(&'static str, f64)>,
    },
    /// Not measured on this host.
    Skipped {
        /// The row's name.
        name: &'static str,
        /// Why not.
        why: String,
    },
}

impl Row {
    /// A measured row without facts.
    pub fn measured(name: &'static str, rounds: Rounds, unit: &'static str, goal: Option<f64>) -> Self {
        Row::Measured { name, rounds, unit, goal, facts: Vec::new() }
    }

    /// The row's name.
    pub fn name(&self) -> &'static str {
        match self {
            Row::Measured { name, .. } | Row::Skipped { name, .. } => name,
        }
    }

    /// Our side's spread (`None` for a skipped row).
    pub fn ours(&self) -> Option<Spread> {
        match self {
            Row::Measured { rounds, .. } => Some(Spread::of(&rounds.ours)),
            Row::Skipped { .. } => None,
        }
    }

    /// The baseline's spread (`None` for a skipped row).
    pub fn baseline(&self) -> Option<Spread> {
        match self {
            Row::Measured { rounds, .. } => Some(Spread::of(&rounds.baseline)),
            Row::Skipped { .. } => None,
        }
    }

    /// Our median over the baseline's (`None` for a skipped row).
    pub fn ratio(&self) -> Option<f64> {
        Some(self.ours()?.median / self.baseline()?.median)
    }

    /// The interval for the ratio, from the ABBA blocks (`None` for a skipped row or one
    /// without a complete block).
    pub fn interval(&self) -> Option<Interval> {
        let Row::Measured { rounds, .. } = self else { return None };
        interval(&rounds.block_ratios())
    }

    /// What the row says of its goal: `None` without a goal (or a measure).
    pub fn verdict(&self) -> Option<Verdict> {
        let Row::Measured { goal: Some(goal), .. } = self else { return None };
        Some(match self.interval() {
            Some(i) if i.confidence >= CONFIDENCE && i.high <= *goal => Verdict::Met,
            Some(i) if i.confidence >= CONFIDENCE && i.low > *goal => Verdict::Missed,
            _ => Verdict::Undecided,
        })
    }

    /// The row as one JSON object: `{"name", "unit", "rounds", "ours": {"min", "median", "max"},
    /// "baseline": {…}, "ratio", "interval": {"low", "high", "confidence", "blocks"} | null,
    /// "goal", "verdict": "met" | "missed" | "undecided" | null, "facts": {…}, "samples": {"ours":
    /// [each round], "baseline": [each round]}}`, or `{"name", "skipped"}`.
    pub fn json(&self) -> Value {
        match self {
            Row::Measured { name, rounds, unit, goal, facts } => {
                let (ours, baseline) = (Spread::of(&rounds.ours), Spread::of(&rounds.baseline));
                let facts: Map<String, Value> =
                    facts.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect();
                json!({
                    "name": name,
                    "unit": unit,
                    "rounds": rounds.ours.len().min(rounds.baseline.len()),
                    "ours": ours.json(),
                    "baseline": baseline.json(),
                    "ratio": ours.median / baseline.median,
                    "interval": self.interval().map(|i| json!({
                        "low": i.low, "high": i.high, "confidence": i.confidence, "blocks": i.blocks,
                    })),
                    "goal": goal,
                    "verdict": self.verdict().map(Verdict::word),
                    "facts": facts,
                    "samples": { "ours": rounds.ours, "baseline": rounds.baseline },
                })
            }
            Row::Skipped { name, why } => json!({ "name": name, "skipped": why }),
        }
    }

    /// The row as one line of the table under [`table_header`]; its facts on a line of their
    /// own below it.
    pub fn table_line(&self) -> String {
        match self {
            Row::Measured { name, unit, goal, facts, .. } => {
                let (ours, baseline) = (self.ours(), self.baseline());
                let side = |s: Option<Spread>| {
                    s.map_or(String::new(), |s| format!("{} [{}, {}]", num(s.median), num(s.min), num(s.max)))
                };
                let interval = self.interval().map_or("-".to_owned(), |i| {
                    format!("[{:.3}, {:.3}] {:.0}%", i.low, i.high, i.confidence * 100.0)
                });
                let mut line = format!(
                    "{name:<52} {:>30} {:>30} {unit:>11} {:>7.3} {interval:>21} {:>6} {}",
                    side(ours),
                    side(baseline),
                    self.ratio().unwrap_or(f64::NAN),
                    goal.map_or("-".to_owned(), |g| format!("<={g}")),
                    self.verdict().map_or("-", Verdict::word),
                );
                if !facts.is_empty() {
                    let facts: Vec<String> = facts.iter().map(|(k, v)| format!("{k} {}", num(*v))).collect();
                    line.push_str(&format!("\n{:<52} {}", "", facts.join(", ")));
                }
                line
            }
            Row::Skipped { name, why } => format!("{name:<52} skipped: {why}"),
        }
    }
}

/// The table's header line, matching [`Row::table_line`].
pub fn table_header() -> String {
    format!(
        "{:<52} {:>30} {:>30} {:>11} {:>7} {:>21} {:>6} {}",
        "row",
        "ours median [min, max]",
        "baseline median [min, max]",
        "unit",
        "ratio",
        "interval (confidence)",
        "goal",
        "verdict"
    )
}

/// A number as the table shows it: three decimals below 1000, whole above.
fn num(v: f64) -> String {
    if v.abs() >= 1000.0 { format!("{v:.0}") } else { format!("{v:.3}") }
}

/// The interval of the median of `ratios` (each an ABBA block's): the order statistics
/// `r(k) ≤ … ≤ r(n+1-k)` for the largest `k` whose coverage `1 - 2·P(Bin(n, ½) < k)` is at least
/// [`CONFIDENCE`] (`k = 1`, the whole range, when no `k` reaches it). `None` without a ratio.
pub fn interval(ratios: &[f64]) -> Option<Interval> {
    let mut sorted: Vec<f64> = ratios.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    // P(Bin(n, ½) ≤ j), for j = 0, 1, …
    let mut below = Vec::with_capacity(n);
    let (mut choose, mut total) = (1f64, 0f64);
    let all = 2f64.powi(i32::try_from(n).unwrap_or(i32::MAX));
    for j in 0..n {
        total += choose;
        below.push(total / all);
        choose = choose * (n - j) as f64 / (j + 1) as f64;
    }
    // [r(k), r(n+1-k)] misses the median only when fewer than k blocks fall on one side of it.
    let coverage = |k: usize| (1.0 - 2.0 * below[k - 1]).max(0.0);
    let k = (1..=n.div_ceil(2)).rev().find(|&k| coverage(k) >= CONFIDENCE).unwrap_or(1);
    Some(Interval { low: sorted[k - 1], high: sorted[n - k], confidence: coverage(k), blocks: n })
}

fn median_of_sorted(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The median of `v` (NaN when empty).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    median_of_sorted(&v)
}

/// Whether `--only` (each value a part of a row's name; none: every row) selects row `name`.
pub fn selects(only: &[String], name: &str) -> bool {
    only.is_empty() || only.iter().any(|part| name.contains(part.as_str()))
}

/// What a run reports while it measures: the groups of rows it starts and the rounds it ends,
/// for a progress display. Called between measurements, never inside one.
pub trait Progress {
    /// A group of rows measured together starts, with `rounds` rounds.
    fn group(&self, rows: &[&str], rounds: u32);
    /// A round of the current group ended.
    fn round(&self);
}

/// No progress display.
#[derive(Clone, Copy, Debug, Default)]
pub struct Silent;

impl Progress for Silent {
    fn group(&self, _rows: &[&str], _rounds: u32) {}
    fn round(&self) {}
}

/// How long one round of a group of rows takes, which sets its rounds when none are asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pace {
    /// Well under a second a round: 40 rounds, 20 ABBA blocks, whose 95 % interval leaves out
    /// the five most extreme blocks on each side (a neighbour's burst on a shared host).
    Quick,
    /// Seconds a round (a guest observed for seconds, 65,536 VPs encoded): 12 rounds, 6 blocks,
    /// the fewest whose whole range is a 95 % interval.
    Slow,
}

impl Pace {
    /// The rounds of a group at this pace.
    pub const fn rounds(self) -> u32 {
        match self {
            Pace::Quick => 40,
            Pace::Slow => 12,
        }
    }
}

/// How many rounds the comparisons of a run take, and whom to tell as each ends.
#[derive(Clone, Copy)]
pub struct Plan<'a> {
    asked: Option<u32>,
    progress: &'a dyn Progress,
}

impl std::fmt::Debug for Plan<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan").field("asked", &self.asked).finish_non_exhaustive()
    }
}

impl<'a> Plan<'a> {
    /// `asked` rounds per comparison (each group's [`Pace`] when `None`), told to `progress`.
    pub fn new(asked: Option<u32>, progress: &'a dyn Progress) -> Self {
        Self { asked, progress }
    }

    /// `rounds` rounds per comparison, told to nobody.
    pub fn quiet(rounds: u32) -> Plan<'static> {
        Plan { asked: Some(rounds), progress: &Silent }
    }

    /// Says a group of rows starts; the rounds it takes (those asked for, else its pace's).
    pub fn start(&self, rows: &[&str], pace: Pace) -> u32 {
        let rounds = self.asked.unwrap_or(pace.rounds());
        self.progress.group(rows, rounds);
        rounds
    }

    /// Says a round ended.
    pub fn tick(&self) {
        self.progress.round();
    }
}

/// Row `name`'s `ours` and `baseline` (each taking well under a second) over the plan's rounds
/// in ABBA order: ours first in even rounds, the baseline first in odd ones.
pub(crate) fn side_by_side(
    plan: &Plan<'_>,
    name: &str,
    mut ours: impl FnMut() -> f64,
    mut baseline: impl FnMut() -> f64,
) -> Rounds {
    let mut rounds = Rounds::default();
    for round in 0..plan.start(&[name], Pace::Quick) {
        if round % 2 == 0 {
            rounds.ours.push(ours());
            rounds.baseline.push(baseline());
        } else {
            rounds.baseline.push(baseline());
            rounds.ours.push(ours());
        }
        plan.tick();
    }
    rounds
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

    fn measured(ours: &[f64], baseline: &[f64], goal: Option<f64>) -> Row {
        Row::measured("r", Rounds { ours: ours.to_vec(), baseline: baseline.to_vec() }, "ns", goal)
    }

    /// Twelve rounds whose blocks' ratios are `ratios` (six blocks: 96.9 %, the whole range).
    fn blocks(ratios: [f64; 6]) -> Rounds {
        let mut rounds = Rounds::default();
        for r in ratios {
            rounds.ours.extend([50.0 * r, 50.0 * r]);
            rounds.baseline.extend([50.0, 50.0]);
        }
        rounds
    }

    #[test]
    fn the_interval_takes_the_order_statistics_whose_coverage_reaches_95_percent() {
        // Six blocks: only the whole range covers 95 % (1 - 2/64 = 96.9 %).
        let i = interval(&[1.3, 1.0, 1.1, 1.2, 1.05, 1.15]).unwrap();
        assert_eq!((i.low, i.high, i.blocks), (1.0, 1.3, 6));
        assert!((i.confidence - (1.0 - 2.0 / 64.0)).abs() < 1e-12, "{i:?}");
        // Twelve blocks: the 3rd and 10th (1 - 2·(1 + 12 + 66)/4096 = 96.1 %).
        let twelve: Vec<f64> = (1..=12).map(f64::from).collect();
        let i = interval(&twelve).unwrap();
        assert_eq!((i.low, i.high), (3.0, 10.0));
        assert!((i.confidence - (1.0 - 2.0 * 79.0 / 4096.0)).abs() < 1e-12, "{i:?}");
        // Too few blocks for 95 %: the whole range, with the confidence it has.
        let i = interval(&[2.0, 1.0]).unwrap();
        assert_eq!((i.low, i.high, i.confidence), (1.0, 2.0, 0.5));
        let i = interval(&[1.5]).unwrap();
        assert_eq!((i.low, i.high, i.confidence), (1.5, 1.5, 0.0));
        assert_eq!(interval(&[]), None);
    }

    #[test]
    fn blocks_pair_two_rounds_so_a_steady_drift_cancels() {
        // The host slows down by 1 ns per measurement; both sides really take 100 ns. Round 0
        // measures ours then the baseline, round 1 the baseline then ours (ABBA).
        let rounds = Rounds { ours: vec![100.0, 103.0], baseline: vec![101.0, 102.0] };
        assert_eq!(rounds.block_ratios(), [1.0]);
        // An odd last round joins no block; a side that measured nothing makes the block NaN.
        let rounds = Rounds { ours: vec![1.0, 1.0, 5.0], baseline: vec![2.0, 2.0, 5.0] };
        assert_eq!(rounds.block_ratios(), [0.5]);
        assert!(Rounds { ours: vec![1.0, 1.0], baseline: vec![0.0, 0.0] }.block_ratios()[0].is_nan());
    }

    #[test]
    fn a_row_is_met_missed_or_undecided_by_where_its_interval_lies() {
        let row = |ratios, goal| Row::measured("r", blocks(ratios), "ns", goal);
        let met = row([0.8, 0.9, 0.85, 0.95, 0.9, 0.88], Some(1.0));
        assert_eq!(met.verdict(), Some(Verdict::Met));
        assert_eq!(met.json()["verdict"], "met");
        let missed = row([1.2, 1.1, 1.3, 1.05, 1.2, 1.15], Some(1.0));
        assert_eq!(missed.verdict(), Some(Verdict::Missed));
        // The medians' ratio is within the goal, but the interval straddles it.
        let straddles = row([0.9, 0.95, 0.97, 0.98, 1.02, 1.1], Some(1.0));
        assert!(straddles.ratio().unwrap() < 1.0);
        assert_eq!(straddles.verdict(), Some(Verdict::Undecided));
        assert_eq!(straddles.json()["verdict"], "undecided");
        // Well within the goal, but two rounds are one block: too few to say.
        let few = measured(&[1.0, 1.0], &[10.0, 10.0], Some(1.0));
        assert_eq!(few.verdict(), Some(Verdict::Undecided));
        assert_eq!(measured(&[1.0], &[2.0], None).verdict(), None);
        assert!(measured(&[1.0], &[2.0], None).json()["verdict"].is_null());
        // A side that measured nothing decides nothing.
        let nothing =
            Row::measured("r", Rounds { ours: vec![f64::NAN; 12], baseline: vec![1.0; 12] }, "ns", Some(1.0));
        assert_eq!(nothing.verdict(), Some(Verdict::Undecided));
        let skipped = Row::Skipped { name: "r", why: "needs KVM".into() };
        assert_eq!(skipped.verdict(), None);
        assert!(skipped.json().get("verdict").is_none());
    }

    #[test]
    fn the_json_gives_each_sides_spread_the_ratio_of_medians_and_the_interval() {
        let mut rounds = blocks([0.5, 0.5, 0.5, 0.5, 0.5, 0.5]);
        rounds.ours[0] = 10.0;
        rounds.ours[11] = 40.0;
        let row =
            Row::Measured { name: "r", rounds, unit: "ms", goal: Some(1.0), facts: vec![("series", 7.0)] };
        let json = row.json();
        assert_eq!(json["ours"], json!({"min": 10.0, "median": 25.0, "max": 40.0}));
        assert_eq!(json["baseline"], json!({"min": 50.0, "median": 50.0, "max": 50.0}));
        assert_eq!((json["ratio"].as_f64(), json["rounds"].as_u64()), (Some(0.5), Some(12)));
        assert_eq!(json["interval"]["low"].as_f64(), Some(0.35));
        assert_eq!(json["interval"]["high"].as_f64(), Some(0.65));
        assert_eq!(json["interval"]["blocks"], 6);
        assert_eq!(json["facts"], json!({"series": 7.0}));
        assert_eq!(json["verdict"], "met");
    }

    #[test]
    fn a_group_takes_the_rounds_asked_for_else_those_of_its_pace() {
        let silent = Silent;
        let default = Plan::new(None, &silent);
        assert_eq!((default.start(&["r"], Pace::Quick), default.start(&["r"], Pace::Slow)), (40, 12));
        let asked = Plan::new(Some(6), &silent);
        assert_eq!((asked.start(&["r"], Pace::Quick), asked.start(&["r"], Pace::Slow)), (6, 6));
        // Twenty blocks: the 95 % interval leaves five out on each side.
        let twenty: Vec<f64> = (1..=20).map(f64::from).collect();
        let i = interval(&twenty).unwrap();
        assert_eq!((i.low, i.high), (6.0, 15.0));
        assert!(i.confidence >= CONFIDENCE, "{i:?}");
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
        let line = Row::measured("r", blocks([0.5; 6]), "ns", Some(0.2)).table_line();
        let header = table_header();
        let at = |text: &str, word: &str| text.find(word).unwrap() + word.len();
        // Right-aligned columns end where their headers end.
        assert_eq!(at(&line, "ns"), at(&header, "unit"), "{header}\n{line}");
        assert_eq!(at(&line, "<=0.2"), at(&header, "goal"), "{header}\n{line}");
        assert!(line.ends_with("missed"), "{line}");
        let with_facts = Row::Measured {
            name: "r",
            rounds: blocks([0.5; 6]),
            unit: "ms",
            goal: None,
            facts: vec![("bytes", 1234.0)],
        };
        let line = with_facts.table_line();
        assert!(line.ends_with(&format!("\n{}bytes 1234", " ".repeat(53))), "{line}");
    }
}
