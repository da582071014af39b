//! What `top` shows, computed from two readings: a group per partition (its total row and a row
//! per VP), each cell a [`Column`] of [`VP_COLUMNS`] presented over the time between the readings.
//!
//! Shared by the full-screen view and `--once`, so both show the same numbers.

use std::cmp::Ordering;
use std::fmt::Write;

use hvstats::present::{Column, VP_COLUMNS};
use hvstats::snapshot::{ObjectReading, VpSnapshot};
use hvstats_abi::catalog::vp;
use serde_json::{Map, Value, json};

use crate::cmd::live::{Live, Reading};
use crate::cmd::serve::exposition::summed;

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
}

impl Row {
    /// CPU wait between the readings: per dispatch in ns, and as a percentage of the interval.
    pub fn wait(&self, seconds: f64) -> (Option<f64>, Option<f64>) {
        let delta = |id: hvstats_abi::CounterId| {
            let name = id.counter()?.name;
            self.deltas.iter().find(|(n, _)| *n == name).map(|(_, d)| *d)
        };
        let wait = delta(vp::CPU_WAIT_TIME_PER_DISPATCH);
        let per_dispatch = match (wait, delta(vp::DISPATCHES)) {
            (Some(w), Some(d)) if d > 0 => Some(w as f64 / d as f64),
            _ => None,
        };
        let percent = wait.filter(|_| seconds > 0.0).map(|w| w as f64 / (seconds * 1e9) * 100.0);
        (per_dispatch, percent)
    }
}

/// What each histogram of `after` recorded since `before`.
fn quantiles(before: &VpSnapshot, after: &VpSnapshot) -> Vec<(&'static str, u64, Option<u64>, Option<u64>)> {
    after
        .histograms
        .iter()
        .filter_map(|(c, now)| {
            let (_, then) = before.histograms.iter().find(|(b, _)| b.id == c.id)?;
            let d = now.since(then)?;
            Some((c.name, d.count(), d.quantile_upper_ns(0.5), d.quantile_upper_ns(0.99)))
        })
        .collect()
}

/// One partition: its total row and its VPs.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// The VM name (`instance:partition`).
    pub vm: String,
    /// The instance.
    pub instance: String,
    /// The partition id.
    pub partition: u64,
    /// False once the partition stopped.
    pub active: bool,
    /// The partition total (its VPs summed).
    pub total: Row,
    /// The VPs.
    pub vps: Vec<Row>,
}

fn row(label: String, vp: Option<u32>, before: &ObjectReading, after: &ObjectReading, seconds: f64) -> Row {
    let values = VP_COLUMNS.iter().map(|c| c.value(before, after, seconds)).collect();
    let deltas = match after {
        ObjectReading::Counters(values) => values
            .iter()
            .filter(|(c, _)| c.maintained.is_maintained())
            .filter_map(|(c, v)| Some((c.name, v.checked_sub(before.get(c.name)?)?)))
            .collect(),
        ObjectReading::Unreadable { .. } => Vec::new(),
    };
    Row { label, vp, values, deltas, quantiles: Vec::new() }
}

/// The groups of every partition present in both readings (a partition or VP that appeared in
/// between has no earlier reading and waits for the next one).
pub fn groups(before: &Reading, after: &Reading) -> Vec<Group> {
    let seconds = after.at.saturating_duration_since(before.at).as_secs_f64();
    let mut out = Vec::new();
    for instance in &after.instances {
        for partition in &instance.partitions {
            let Some(earlier) = before.partition(&instance.name, partition.id) else { continue };
            let vps: Vec<Row> = partition
                .vps
                .iter()
                .filter_map(|vp| {
                    let then = earlier.vps.iter().find(|v| v.index == vp.index)?;
                    let mut r =
                        row(format!("VP {}", vp.index), Some(vp.index), &then.reading, &vp.reading, seconds);
                    r.quantiles = quantiles(then, vp);
                    Some(r)
                })
                .collect();
            let vm = Live::vm_name(&instance.name, partition);
            let total = match (summed(earlier), summed(partition)) {
                (Some(then), Some(now)) => row(vm.clone(), None, &then, &now, seconds),
                _ => Row {
                    label: vm.clone(),
                    vp: None,
                    values: vec![None; VP_COLUMNS.len()],
                    deltas: Vec::new(),
                    quantiles: Vec::new(),
                },
            };
            out.push(Group {
                vm,
                instance: instance.name.clone(),
                partition: partition.id,
                active: partition.active,
                total,
                vps,
            });
        }
    }
    out
}

/// Orders rows by column `column` (largest first, `-` last), or by name when `None`.
pub fn compare(a: &Row, b: &Row, column: Option<usize>, descending: bool) -> Ordering {
    let by_name = a.vp.cmp(&b.vp).then_with(|| a.label.cmp(&b.label));
    let Some(column) = column else { return by_name };
    let value = |r: &Row| r.values.get(column).copied().flatten();
    let ordering = match (value(a), value(b)) {
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

/// A cell's text: `-` for nothing to show, one decimal below 100, none above.
pub fn cell(value: Option<f64>) -> String {
    match value {
        None => "-".into(),
        Some(v) if v.abs() < 100.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.0}"),
    }
}

/// Width of the label column.
pub const LABEL_WIDTH: usize = 24;

/// Width of each value column.
pub fn column_width(column: &Column) -> usize {
    column.header().chars().count().max(8)
}

/// The text table of `--once`: every column, a group per partition.
pub fn text(groups: &[Group], seconds: f64, dir: &str) -> String {
    let mut out = String::new();
    if groups.is_empty() {
        let _ = writeln!(out, "no live partition under {dir}");
        return out;
    }
    let _ = writeln!(out, "over {seconds:.2} s: % of the time, rates per second, average cost in µs");
    let _ = write!(out, "{:<LABEL_WIDTH$}", "VM / VP");
    for c in &VP_COLUMNS {
        let _ = write!(out, " {:>w$}", c.header(), w = column_width(c));
    }
    out.push('\n');
    for group in groups {
        let mut line = |r: &Row, indent: &str| {
            let label: String = format!("{indent}{}", r.label).chars().take(LABEL_WIDTH).collect();
            let _ = write!(out, "{label:<LABEL_WIDTH$}");
            for (c, v) in VP_COLUMNS.iter().zip(&r.values) {
                let _ = write!(out, " {:>w$}", cell(*v), w = column_width(c));
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

fn row_json(r: &Row, seconds: f64) -> Value {
    let presented: Map<String, Value> =
        VP_COLUMNS.iter().zip(&r.values).map(|(c, v)| (c.counter().name.to_owned(), json!(v))).collect();
    let deltas: Map<String, Value> = r.deltas.iter().map(|(n, d)| ((*n).to_owned(), json!(d))).collect();
    let quantiles: Map<String, Value> = r
        .quantiles
        .iter()
        .map(|&(n, count, p50, p99)| (n.to_owned(), json!({"count": count, "p50_ns": p50, "p99_ns": p99})))
        .collect();
    let (per_dispatch, percent) = r.wait(seconds);
    json!({
        "presented": presented,
        "deltas": deltas,
        "histograms": quantiles,
        "cpu_wait": {"per_dispatch_ns": per_dispatch, "percent": percent},
    })
}

/// The JSON of `--once --json`: the interval, the units of the presented values, and per partition
/// its total and VPs, each with presented values and raw deltas keyed by catalog name.
pub fn json(groups: &[Group], seconds: f64) -> Value {
    let units: Map<String, Value> = VP_COLUMNS
        .iter()
        .map(|c| {
            let header = c.header();
            let unit = header.strip_prefix(c.label).unwrap_or(&header).trim().to_owned();
            (c.counter().name.to_owned(), json!(unit))
        })
        .collect();
    let partitions: Vec<Value> = groups
        .iter()
        .map(|g| {
            let vps: Vec<Value> = g
                .vps
                .iter()
                .map(|r| {
                    let mut v = row_json(r, seconds);
                    v["vp"] = json!(r.vp);
                    v
                })
                .collect();
            json!({
                "vm": g.vm,
                "instance": g.instance,
                "partition": g.partition,
                "active": g.active,
                "total": row_json(&g.total, seconds),
                "vps": vps,
            })
        })
        .collect();
    json!({ "interval_seconds": seconds, "units": units, "partitions": partitions })
}
