//! What `top` shows, computed from two readings: a group per partition (its total row and a row
//! per VP), each cell a [`Column`] of [`VP_COLUMNS`] presented over the time between the readings,
//! and the p50/p99 handling time of the row's dominant intercept class: of the catalog's histograms
//! of handling times kept on the exit path, the one whose recorded time grew most in the interval.
//!
//! Shared by the full-screen view and `--once`, so both show the same numbers.

use hvstats_abi::catalog::counter_by_name;
use hvstats_present::json_keys::{Held, SCHEMA_KEY, SCHEMA_VERSION, key};
use std::cmp::Ordering;
use std::fmt::Write;

use hvstats::snapshot::{ObjectReading, VpSnapshot};
use hvstats_abi::catalog::{Counter, counters_of, vp};
use hvstats_abi::histogram::Log2Histogram;
use hvstats_abi::source::SourceKind;
use hvstats_abi::vm_state::VmState;
use hvstats_abi::{ObjectKind, Presentation};
use hvstats_present::present::{Column, DatedBy, Interval, SAME_PUBLICATION, VP_COLUMNS, human_ns, shown_as};
use hvstats_present::snapshot_json::publication_json;
use hvstats_present::text::Escaped;
use serde_json::{Map, Value, json};

use hvstats_present::live::{Live, Reading};

/// One row: a VP, or a partition's total.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// `VP 3`, or the partition's name for its total row.
    pub label: String,
    /// The VP index (`None` for a total row).
    pub vp: Option<u32>,
    /// One value per column of [`VP_COLUMNS`]; `None` shows as `-`.
    pub values: Vec<Option<f64>>,
    /// The raw counter deltas between the readings, by catalog name (maintained counters only).
    pub deltas: Vec<(&'static str, u64)>,
    /// Per histogram of the VP (by catalog name), what was recorded between the readings: its
    /// count and the upper bounds of its p50 and p99 in ns (empty for a total row).
    pub quantiles: Vec<(&'static str, u64, Option<u64>, Option<u64>)>,
    /// Per histogram of the VP (for a total row: of its VPs, summed), what was recorded between
    /// the readings.
    pub costs: Vec<(&'static Counter, Log2Histogram)>,
    /// The share of the interval the VP spent waiting for a CPU, in % (a total row: its VPs'
    /// shares summed); `None` when the source gives no CPU wait.
    pub wait_percent: Option<f64>,
    /// The time between the refreshes the two readings hold, which the rates are taken over.
    pub interval: Interval,
}

impl Row {
    /// CPU wait between the readings: per dispatch in ns, and as a percentage of the time between
    /// the refreshes they hold (`None` when they hold the same one).
    pub fn wait(&self) -> (Option<f64>, Option<f64>) {
        let delta = |id: hvstats_abi::CounterId| {
            let name = id.counter()?.name;
            self.deltas.iter().find(|(n, _)| *n == name).map(|(_, d)| *d)
        };
        let wait = delta(vp::CPU_WAIT_TIME_PER_DISPATCH);
        let per_dispatch = match (wait, delta(vp::DISPATCHES)) {
            (Some(w), Some(d)) if d > 0 => Some(w as f64 / d as f64),
            _ => None,
        };
        let seconds = vp::CPU_WAIT_TIME_PER_DISPATCH.counter().and_then(|c| self.interval.seconds_for(c));
        let percent = wait.zip(seconds).map(|(w, seconds)| w as f64 / (seconds * 1e9) * 100.0);
        (per_dispatch, percent)
    }

    /// True when `counter`, read in both readings, has no value because they hold the same
    /// publication (not because no source gives it: that is a `-`).
    fn holds_one_publication_of(&self, counter: &Counter) -> bool {
        self.interval.same_publication()
            && self.interval.seconds_for(counter).is_none()
            && self.deltas.iter().any(|(name, _)| *name == counter.name)
    }

    /// The dominant intercept class between the readings: of the [`cost_classes`], the one with
    /// the most handling time recorded (then the most exits); `None` when none recorded any.
    pub fn dominant(&self) -> Option<(&'static Counter, &Log2Histogram)> {
        self.costs
            .iter()
            .filter(|(c, d)| is_cost_class(c) && d.count() > 0)
            .max_by_key(|(c, d)| (d.sum_ns, d.count(), std::cmp::Reverse(c.id)))
            .map(|(c, d)| (*c, d))
    }

    /// A partition total's percent-of-time columns: the sum of its VPs' percents (each VP is one
    /// processor's time, capped at 100 %), as `top` adds the threads of a process: a partition of
    /// four VPs at 60 % runs 240 %, not the 100 % one processor's cap would give the summed times.
    /// Time halted is one of them: each VP's halted time is its own share, never added to another
    /// VP's and divided by that VP's HLTs.
    fn with_percents_of(mut self, vps: &[Row]) -> Self {
        for (i, column) in VP_COLUMNS.iter().enumerate() {
            if shown_as(column.counter()) != Presentation::PercentTime {
                continue;
            }
            let shown: Vec<f64> = vps.iter().filter_map(|r| r.values.get(i).copied().flatten()).collect();
            if let Some(value) = self.values.get_mut(i) {
                *value = if shown.is_empty() { None } else { Some(shown.iter().sum()) };
            }
        }
        self
    }

    fn with_costs(mut self, costs: Vec<(&'static Counter, Log2Histogram)>) -> Self {
        self.quantiles = costs
            .iter()
            .map(|(c, d)| (c.name, d.count(), d.quantile_upper_ns(0.5), d.quantile_upper_ns(0.99)))
            .collect();
        self.costs = costs;
        self
    }
}

/// True for a catalog histogram of the time hvstats measures handling one class of intercepts on
/// the exit path (the run loop's own histograms, not the waits KVM reports).
fn is_cost_class(c: &Counter) -> bool {
    c.id.kind == ObjectKind::Vp
        && c.presentation == Presentation::Histogram
        && c.maintained.source().is_some_and(|s| s.kind() == SourceKind::RunLoop)
}

/// The intercept classes whose handling time `top` shows, from the catalog's histogram rows.
fn cost_classes() -> impl Iterator<Item = &'static Counter> {
    counters_of(ObjectKind::Vp).filter(|c| is_cost_class(c))
}

/// The short label of a cost class: its catalog name less the words every such name shares
/// (`IO intercept time histogram` → `IO`).
fn class_label(c: &Counter) -> &'static str {
    let name = c.name;
    [" intercept time histogram", " time histogram", " histogram"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name)
}

/// What each histogram of `after` recorded since `before`.
fn costs(before: &VpSnapshot, after: &VpSnapshot) -> Vec<(&'static Counter, Log2Histogram)> {
    after
        .histograms
        .iter()
        .filter_map(|(c, now)| {
            let (_, then) = before.histograms.iter().find(|(b, _)| b.id == c.id)?;
            Some((*c, now.since(then)?))
        })
        .collect()
}

/// The VPs' histogram deltas summed per histogram, for a partition's total row.
fn summed_costs(vps: &[Row]) -> Vec<(&'static Counter, Log2Histogram)> {
    let mut sum: Vec<(&'static Counter, Log2Histogram)> = Vec::new();
    for (c, d) in vps.iter().flat_map(|r| &r.costs) {
        let at = match sum.iter().position(|(s, _)| s.id == c.id) {
            Some(at) => at,
            None => {
                sum.push((*c, Log2Histogram::default()));
                sum.len() - 1
            }
        };
        let total = &mut sum[at].1;
        total.sum_ns = total.sum_ns.wrapping_add(d.sum_ns);
        for (t, b) in total.buckets.iter_mut().zip(&d.buckets) {
            *t = t.wrapping_add(*b);
        }
    }
    sum
}

/// One partition: its total row and its VPs.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// The VM name (`instance:partition`).
    pub vm: String,
    /// The publishing instance's name (`<pid>-<start>-<n>`).
    pub instance: String,
    /// The partition id within that instance.
    pub partition: u64,
    /// False once the partition stopped.
    pub active: bool,
    /// What the VM is doing, when its publisher says (an observed VM without QMP does not).
    pub state: Option<VmState>,
    /// The partition total (its VPs summed).
    pub total: Row,
    /// One row per VP present in both readings, by index.
    pub vps: Vec<Row>,
}

fn row(
    label: String,
    vp: Option<u32>,
    before: &ObjectReading,
    after: &ObjectReading,
    interval: Interval,
) -> Row {
    let values = VP_COLUMNS.iter().map(|c| c.value(before, after, &interval)).collect();
    let deltas = match after {
        ObjectReading::Counters(values) => values
            .iter()
            .filter(|(c, _)| c.is_maintained_anywhere())
            .filter_map(|(c, v)| Some((c.name, v.checked_sub(before.get(c.name)?)?)))
            .collect(),
        ObjectReading::Unreadable { .. } => Vec::new(),
    };
    let mut row = Row {
        label,
        vp,
        values,
        deltas,
        quantiles: Vec::new(),
        costs: Vec::new(),
        wait_percent: None,
        interval,
    };
    row.wait_percent = row.wait().1;
    row
}

/// The groups of every partition present in both readings (a partition or VP that appeared in
/// between has no earlier reading and waits for the next one).
pub fn groups(before: &Reading, after: &Reading) -> Vec<Group> {
    let seconds = after.at.saturating_duration_since(before.at).as_secs_f64();
    let mut out = Vec::new();
    for instance in &after.instances {
        let refreshed = (before.instance(&instance.name).and_then(|i| i.refreshed_us), instance.refreshed_us);
        let live = instance.description.runs_its_partitions();
        let interval = |then: &ObjectReading, now: &ObjectReading| {
            Interval::between(then, now, seconds, refreshed, live)
        };
        for partition in &instance.partitions {
            let Some(earlier) = before.partition(&instance.name, partition.id) else { continue };
            let vps: Vec<Row> = partition
                .vps
                .iter()
                .filter_map(|vp| {
                    let then = earlier.vps.iter().find(|v| v.index == vp.index)?;
                    let between = interval(&then.reading, &vp.reading);
                    let r =
                        row(format!("VP {}", vp.index), Some(vp.index), &then.reading, &vp.reading, between);
                    Some(r.with_costs(costs(then, vp)))
                })
                .collect();
            let vm = Live::vm_name(&instance.name, partition);
            let total = match (earlier.vps_summed(), partition.vps_summed()) {
                (Some(then), Some(now)) => row(vm.clone(), None, &then, &now, interval(&then, &now)),
                _ => Row {
                    label: vm.clone(),
                    vp: None,
                    values: vec![None; VP_COLUMNS.len()],
                    deltas: Vec::new(),
                    quantiles: Vec::new(),
                    costs: Vec::new(),
                    wait_percent: None,
                    interval: Interval::by_reader(seconds),
                },
            }
            .with_costs(summed_costs(&vps))
            .with_percents_of(&vps);
            out.push(Group {
                vm,
                instance: instance.name.clone(),
                partition: partition.id,
                active: partition.active,
                state: partition.reading.get(vm_state_name()).map(VmState::from_code),
                total,
                vps,
            });
        }
    }
    tell_apart(&mut out);
    for g in &mut out {
        // A VM that is not running says so beside its name: one stuck on an internal error
        // or paused is not an idle VM.
        if let Some(state) = g.state.filter(|s| *s != VmState::Running) {
            g.total.label = format!("{} ({})", g.total.label, state.label());
        }
    }
    out
}

/// The catalog name of a VM's run state.
fn vm_state_name() -> &'static str {
    hvstats_abi::catalog::partition::VM_STATE.counter().map_or("", |c| c.name)
}

/// Two VMs with one name (two QEMUs started with the same `-name`) are told apart by their
/// instance, shown after the name.
fn tell_apart(groups: &mut [Group]) {
    let names: Vec<String> = groups.iter().map(|g| g.vm.clone()).collect();
    for g in groups.iter_mut() {
        if names.iter().filter(|n| **n == g.vm).count() > 1 {
            g.total.label = format!("{} [{}]", g.vm, g.instance);
        }
    }
}

/// What a column holds over the rows of some groups, in the order [`columns`] shows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Holds {
    /// Some row has a number other than 0 (or a class name): the column moves.
    Moving,
    /// Every row that shows something shows 0 (`0.0`, or a value that rounds to it).
    Zero,
    /// No row has anything to show (`-` throughout).
    Nothing,
}

/// What `column` holds over the rows of `groups`, as its cells show it.
fn holds(column: Shown, groups: &[Group]) -> Holds {
    let mut holds = Holds::Nothing;
    for r in groups.iter().flat_map(|g| std::iter::once(&g.total).chain(&g.vps)) {
        let text = column.cell(r);
        if text == "-" {
            continue;
        }
        if text.parse::<f64>().is_ok_and(|v| v == 0.0) {
            holds = Holds::Zero;
        } else {
            return Holds::Moving;
        }
    }
    holds
}

/// The columns to show for `groups`, left to right: `fields` when the user chose them; otherwise
/// every column of [`shown`], those that move (a number other than 0 in some row) first, then
/// those that stay at 0, then those with nothing to show, each in their order, so a narrow
/// terminal shows the columns that move.
pub fn columns(groups: &[Group], fields: Option<&[Shown]>) -> Vec<Shown> {
    if let Some(fields) = fields {
        return fields.to_vec();
    }
    let mut columns: Vec<(Holds, Shown)> = shown().map(|c| (holds(c, groups), c)).collect();
    // A stable sort: each kind keeps the columns' order.
    columns.sort_by_key(|(holds, _)| *holds);
    columns.into_iter().map(|(_, c)| c).collect()
}

/// The columns `--fields` names, in its order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fields(pub Vec<Shown>);

/// Parses `--fields` (see [`parse_fields`]).
///
/// # Errors
/// As [`parse_fields`].
pub fn parse_fields_flag(list: &str) -> Result<Fields, String> {
    parse_fields(list).map(Fields)
}

/// A header as typed: lower case, no spaces, `us` for `µs`.
fn typed(header: &str) -> String {
    header.to_lowercase().replace('µ', "u").chars().filter(|c| !c.is_whitespace()).collect()
}

/// Parses a list of column headers as `top` shows them (`Run%,IO/s,CPUID/s,Hcall µs`):
/// comma-separated, case and spaces ignored, `us` for `µs`.
///
/// # Errors
/// A message naming the header that matches no column, and every header there is.
pub fn parse_fields(list: &str) -> Result<Vec<Shown>, String> {
    let mut fields = Vec::new();
    for want in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        match shown().find(|c| typed(&c.header()) == typed(want)) {
            Some(c) if !fields.contains(&c) => fields.push(c),
            Some(_) => {}
            None => {
                let all: Vec<String> = shown().map(Shown::header).collect();
                return Err(format!("no column {want:?}; the columns are: {}", all.join(", ")));
            }
        }
    }
    if fields.is_empty() {
        return Err("no column named: give headers separated by commas, e.g. Run%,IO/s".into());
    }
    Ok(fields)
}

/// Orders rows by column `column` (largest first, `-` last), or by name when `None`.
pub fn compare(a: &Row, b: &Row, column: Option<Shown>, descending: bool) -> Ordering {
    let by_name = a.vp.cmp(&b.vp).then_with(|| a.label.cmp(&b.label));
    let Some(column) = column else { return by_name };
    let ordering = match (column.sort_value(a), column.sort_value(b)) {
        (Some(x), Some(y)) => {
            let o = x.total_cmp(&y);
            if descending { o.reverse() } else { o }
        }
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    };
    ordering.then(by_name)
}

/// The columns rows can be sorted by, in the order shown: every column with a number (not
/// [`Shown::Class`], a name).
pub fn sortable() -> impl Iterator<Item = Shown> {
    shown().filter(|c| *c != Shown::Class)
}

/// A cell's text: `-` for nothing to show, one decimal below 100, none below 10,000, and from
/// there scaled as `snapshot` scales counts (`12.3k`, `1.18M`).
fn cell(value: Option<f64>) -> String {
    match value {
        None => "-".into(),
        Some(v) if v.abs() < 100.0 => format!("{v:.1}"),
        Some(v) if v.abs() < 1e4 => format!("{v:.0}"),
        Some(v) => scaled_count(v),
    }
}

/// Width of the label column.
pub const LABEL_WIDTH: usize = 24;

/// Width of each value column.
fn column_width(column: &Column) -> usize {
    column.header().chars().count().max(8)
}

/// A column of the table, most important first: the run time, the dominant intercept class with
/// the p50 and p99 of its handling time, then the rest of [`VP_COLUMNS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shown {
    /// [`VP_COLUMNS`]`[i]`, presented.
    Presented(usize),
    /// The label of the row's dominant intercept class ([`Row::dominant`]).
    Class,
    /// The upper bound of the p50 of its handling time.
    P50,
    /// The upper bound of the p99 of its handling time.
    P99,
    /// The share of the interval spent waiting for a CPU ([`Row::wait_percent`]).
    WaitPercent,
}

/// Every column in the order shown (a narrow view shows a prefix): run time, the exits per second
/// (the headline the dashboard and the exit-storm alert read) and the share of time spent waiting
/// for a CPU (as `top`'s `%st` beside `%us`), the dominant class's handling time, then the other
/// [`VP_COLUMNS`] (CPU wait per dispatch among them).
pub fn shown() -> impl Iterator<Item = Shown> {
    [Shown::Presented(0), Shown::Presented(1), Shown::WaitPercent, Shown::Class, Shown::P50, Shown::P99]
        .into_iter()
        .chain((2..VP_COLUMNS.len()).map(Shown::Presented))
}

impl Shown {
    /// The column's header.
    pub fn header(self) -> String {
        match self {
            Shown::Presented(i) => VP_COLUMNS[i].header(),
            Shown::Class => "Class".into(),
            Shown::P50 => "p50".into(),
            Shown::P99 => "p99".into(),
            Shown::WaitPercent => "Wait%".into(),
        }
    }

    /// The column's width.
    pub fn width(self) -> usize {
        match self {
            Shown::Presented(i) => column_width(&VP_COLUMNS[i]),
            Shown::Class => cost_classes().map(|c| class_label(c).chars().count()).max().unwrap_or(0).max(8),
            Shown::P50 | Shown::P99 | Shown::WaitPercent => 8,
        }
    }

    /// The number `row` is sorted by in this column (`None` sorts last; a class name has none).
    pub fn sort_value(self, row: &Row) -> Option<f64> {
        let quantile = |q| row.dominant().and_then(|(_, d)| d.quantile_upper_ns(q)).map(|ns| ns as f64);
        match self {
            Shown::Presented(i) => row.values.get(i).copied().flatten(),
            Shown::Class => None,
            Shown::P50 => quantile(0.5),
            Shown::P99 => quantile(0.99),
            Shown::WaitPercent => row.wait_percent,
        }
    }

    /// The text of `row`'s cell in this column (`-` for nothing to show).
    pub fn cell(self, row: &Row) -> String {
        let quantile = |q| row.dominant().and_then(|(_, d)| d.quantile_upper_ns(q)).map(human_ns);
        let text = match self {
            Shown::Presented(i) => match row.values.get(i).copied().flatten() {
                None if row.holds_one_publication_of(VP_COLUMNS[i].counter()) => {
                    return SAME_PUBLICATION.into();
                }
                value => return cell(value),
            },
            Shown::Class => row.dominant().map(|(c, _)| class_label(c).to_owned()),
            Shown::P50 => quantile(0.5),
            Shown::P99 => quantile(0.99),
            Shown::WaitPercent
                if row.wait_percent.is_none()
                    && vp::CPU_WAIT_TIME_PER_DISPATCH
                        .counter()
                        .is_some_and(|c| row.holds_one_publication_of(c)) =>
            {
                return SAME_PUBLICATION.into();
            }
            Shown::WaitPercent => return cell(row.wait_percent),
        };
        text.unwrap_or_else(|| "-".into())
    }
}

/// The text table of `--once`: every column (those that move first) or the chosen `fields`, a
/// group per partition.
pub fn text(groups: &[Group], seconds: f64, dir: &str, fields: Option<&[Shown]>) -> String {
    let columns = columns(groups, fields);
    let mut out = String::new();
    if groups.is_empty() {
        let _ = writeln!(out, "no live partition under {dir}");
        return out;
    }
    let _ = writeln!(
        out,
        "over {seconds:.2} s (rates over the time between the publisher's refreshes read): % of the time, \
         rates per second, average cost in µs; p50/p99: upper bounds of the handling time of the class \
         with the most"
    );
    let rows = || groups.iter().flat_map(|g| std::iter::once(&g.total).chain(&g.vps));
    if rows().any(|r| r.interval.same_publication()) {
        let _ = writeln!(
            out,
            "{SAME_PUBLICATION}: both readings hold the same refresh of its publisher (no new counts), so no rate; \
             read again, or at an interval of at least the publisher's period"
        );
    }
    if let Some(r) = rows().find(|r| r.interval.dated_by == DatedBy::Instance) {
        let _ = writeln!(
            out,
            "{}: rates over its instance's refreshes (its publisher does not date its pages)",
            Escaped(&r.label)
        );
    }
    let _ = write!(out, "{:<LABEL_WIDTH$}", "VM / VP");
    for c in &columns {
        let _ = write!(out, " {:>w$}", c.header(), w = c.width());
    }
    out.push('\n');
    for group in groups {
        let mut line = |r: &Row, indent: &str| {
            let label: String = format!("{indent}{}", Escaped(&r.label)).chars().take(LABEL_WIDTH).collect();
            let _ = write!(out, "{label:<LABEL_WIDTH$}");
            for c in &columns {
                let _ = write!(out, " {:>w$}", c.cell(r), w = c.width());
            }
            out.push('\n');
        };
        line(&group.total, "");
        for vp in &group.vps {
            line(vp, "  ");
        }
    }
    out
}

fn row_json(r: &Row) -> Value {
    // The columns show costs in µs; the JSON keys say ns, as every document gives times.
    let presented: Map<String, Value> = VP_COLUMNS
        .iter()
        .zip(&r.values)
        .map(|(c, v)| {
            let v = match shown_as(c.counter()) {
                Presentation::Cost => v.map(|us| us * 1000.0),
                _ => *v,
            };
            (key(c.counter(), Held::Presented), json!(v))
        })
        .collect();
    let deltas: Map<String, Value> = r
        .deltas
        .iter()
        .map(|(n, d)| {
            let name =
                counter_by_name(ObjectKind::Vp, n).map_or_else(|| (*n).to_owned(), |c| key(c, Held::Delta));
            (name, json!(d))
        })
        .collect();
    let quantiles: Map<String, Value> = r
        .quantiles
        .iter()
        .map(|&(n, count, p50, p99)| (n.to_owned(), json!({"count": count, "p50_ns": p50, "p99_ns": p99})))
        .collect();
    let (per_dispatch, percent) = r.wait();
    let dominant = r.dominant().map(|(c, d)| {
        json!({
            "histogram": c.name,
            "class": class_label(c),
            "count": d.count(),
            "p50_ns": d.quantile_upper_ns(0.5),
            "p99_ns": d.quantile_upper_ns(0.99),
        })
    });
    json!({
        "presented": presented,
        "deltas": deltas,
        "histograms": quantiles,
        "dominant": dominant,
        "cpu_wait": {"per_dispatch_ns": per_dispatch, "percent": percent},
        "publication": publication_json(&r.interval),
    })
}

/// The JSON of `--once --json`: the interval, the units of the presented values, and per partition
/// its total and VPs, each with presented values and raw deltas keyed by what they hold
/// ([`hvstats_present::json_keys`]).
pub fn json(groups: &[Group], seconds: f64) -> Value {
    let units: Map<String, Value> = VP_COLUMNS
        .iter()
        .map(|c| {
            let unit = match shown_as(c.counter()) {
                Presentation::Cost => "ns".to_owned(),
                _ => {
                    let header = c.header();
                    header.strip_prefix(c.label).unwrap_or(&header).trim().to_owned()
                }
            };
            (key(c.counter(), Held::Presented), json!(unit))
        })
        .collect();
    let partitions: Vec<Value> = groups
        .iter()
        .map(|g| {
            let vps: Vec<Value> = g
                .vps
                .iter()
                .map(|r| {
                    let mut v = row_json(r);
                    v["vp"] = json!(r.vp);
                    v
                })
                .collect();
            json!({
                "vm": g.vm,
                "instance": g.instance,
                "partition": g.partition,
                "active": g.active,
                "state": g.state.map(VmState::label),
                "total": row_json(&g.total),
                "vps": vps,
            })
        })
        .collect();
    json!({ SCHEMA_KEY: SCHEMA_VERSION, "interval_seconds": seconds, "units": units, "partitions": partitions })
}

/// A count scaled for reading: `950`, `12.3k`, `4.56M`, `7.89G`.
pub fn scaled_count(v: f64) -> String {
    let (value, unit) = match v.abs() {
        a if a < 1e4 => return format!("{v:.0}"),
        a if a < 1e6 => (v / 1e3, "k"),
        a if a < 1e9 => (v / 1e6, "M"),
        a if a < 1e12 => (v / 1e9, "G"),
        _ => (v / 1e12, "T"),
    };
    if value.abs() < 99.95 { format!("{value:.2}{unit}") } else { format!("{value:.1}{unit}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_classes_are_the_catalogs_exit_path_histograms_with_short_labels() {
        let labels: Vec<&str> = cost_classes().map(class_label).collect();
        assert_eq!(labels, ["Hypercall", "IO", "MSR", "Memory", "Other"]);
        // KVM's halt histograms are waits, not handling costs.
        assert!(!is_cost_class(vp::HALT_WAIT_HISTOGRAM.counter().unwrap()));
    }

    /// A published instance of one LP in a runtime directory of its own under the system's
    /// temporary directory (`hvstats-top-TAG-PID`), for a test to read back through [`Live`].
    fn one_lp_instance(tag: &str) -> (std::path::PathBuf, std::sync::Arc<hvstats::Hypervisor>) {
        let dir = std::env::temp_dir().join(format!("hvstats-top-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let hv = hvstats::Hypervisor::with_config(hvstats::InstanceConfig {
            runtime_dir: Some(dir.clone()),
            logical_processors: Some(vec![0]),
            ..Default::default()
        })
        .unwrap();
        (dir, hv)
    }

    #[test]
    fn a_partition_total_runs_the_sum_of_its_vps_percents_not_one_processors_cap() {
        let (dir, hv) = one_lp_instance("total");
        let part = hv.create_partition(4).unwrap();
        let live = Live::new(Some(dir.clone()));
        let before = live.read().unwrap();
        // Three VPs ran the whole interval (and more: their readings are capped at 100 %), one
        // did not run.
        for index in 0..3 {
            part.vp_page(index).unwrap().set(vp::TOTAL_RUN_TIME, 1_000_000_000);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        let after = live.read().unwrap();
        let groups = groups(&before, &after);
        let run = VP_COLUMNS.iter().position(|c| c.counter == vp::TOTAL_RUN_TIME).unwrap();
        let shown: Vec<Option<f64>> = groups[0].vps.iter().map(|r| r.values[run]).collect();
        assert_eq!(shown, [Some(100.0), Some(100.0), Some(100.0), Some(0.0)]);
        assert_eq!(groups[0].total.values[run], Some(300.0));
        drop((part, hv));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_halted_time_of_one_vp_is_never_added_to_anothers() {
        let (dir, hv) = one_lp_instance("halted");
        let part = hv.create_partition(3).unwrap();
        let live = Live::new(Some(dir.clone()));
        let before = live.read().unwrap();
        // VP 0 made 18 HLTs and was halted throughout; VP 1 stayed halted without a HLT in the
        // interval (its halted time grew all the same); VP 2 ran. (Each reading is capped at one
        // processor's 100 % of whatever interval the two readings span.)
        let (p0, p1) = (part.vp_page(0).unwrap(), part.vp_page(1).unwrap());
        p0.set(vp::HLT_INSTRUCTIONS, 18);
        p0.set(vp::HLT_INSTRUCTIONS_COST, 1_000_000_000);
        p1.set(vp::HLT_INSTRUCTIONS_COST, 1_000_000_000);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let after = live.read().unwrap();
        let g = &groups(&before, &after)[0];
        let halted = VP_COLUMNS.iter().position(|c| c.counter == vp::HLT_INSTRUCTIONS_COST).unwrap();
        assert_eq!(VP_COLUMNS[halted].header(), "Halted%");
        let shown: Vec<Option<f64>> = g.vps.iter().map(|r| r.values[halted]).collect();
        assert_eq!(shown, [Some(100.0), Some(100.0), Some(0.0)]);
        // The VM's total is its VPs' shares summed (as Run%), not both VPs' halted time over
        // VP 0's 18 HLTs.
        assert_eq!(g.total.values[halted], Some(200.0));
        let json = json(&groups(&before, &after), 1.0);
        let vp1 = &json["partitions"][0]["vps"][1]["presented"];
        assert_eq!(vp1[hvstats_present::json_keys::TIME_HALTED_PERCENT], 100.0, "{vp1}");
        assert_eq!(json["units"][hvstats_present::json_keys::TIME_HALTED_PERCENT], "%");
        drop((part, hv));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn times_read_in_human_units() {
        let cases = [
            (0, "0ns"),
            (999, "999ns"),
            (1023, "1.0µs"),
            (32_767, "32.8µs"),
            (99_949, "99.9µs"),
            (524_287, "524µs"),
            (8_388_607, "8.4ms"),
            (2_147_483_648, "2.1s"),
        ];
        for (ns, text) in cases {
            assert_eq!(human_ns(ns), text, "{ns}");
        }
    }
}
