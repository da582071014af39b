//! `hvstats snapshot`: the counters of every live instance on this host, read from another
//! process through the long-lived reader ([`hvstats::attach::Attach`]): each instance's arena is
//! mapped once and each page copied from it (no request to the instances).
//!
//! `--json` without `--interval` streams: one partition at a time is read, written and dropped,
//! so memory stays bounded whatever the number of VPs. Exit status 1 when something could not be
//! read (the rest is still printed); output goes through [`crate::output`] (a closed pipe ends it
//! quietly, a full device is an error).

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use hvstats::attach::{Attach, Instance};
use hvstats::snapshot::{InstanceSnapshot, ObjectReading, PartitionSnapshot, VpSnapshot};
use hvstats_abi::catalog::counters_of;
use hvstats_abi::{Counter, ObjectKind, Presentation};
use hvstats_present::present;
use hvstats_present::text::Escaped;
use serde_json::{Value, json};

use crate::names::{row_name, utc_time};
use crate::output::{self, ExitStatus, note};
use hvstats_present::present::{Interval, SAME_PUBLICATION, human_ns};
use hvstats_present::snapshot_json::{
    Earlier, add_platforms_from, cells, earlier_partition, earlier_vp, has_unreadable, instance_json,
    stream_json, unreadable_lines,
};

/// Flags of `hvstats snapshot`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// The runtime directory the instances are published under (default: $HVSTATS_RUNTIME_DIR,
    /// or /run/hvstats).
    #[arg(long, value_name = "DIR")]
    runtime_dir: Option<PathBuf>,
    /// Read every page twice, SECS apart, and show each counter as perfmon does over that
    /// interval: rates per second, % of the time, average cost in ns, instantaneous values.
    #[arg(long, value_name = "SECS", value_parser = parse_interval)]
    interval: Option<f64>,
    /// Only the VMs (partitions) whose name matches this regex, and none of the host-wide
    /// hypervisor and LP objects.
    #[arg(long, value_name = "REGEX")]
    vm: Option<regex::Regex>,
    /// Only the counters whose name contains this text (case ignored); may be repeated.
    #[arg(long, value_name = "TEXT")]
    counter: Vec<String>,
}

/// What `--vm` and `--counter` keep.
struct Filter {
    vm: Option<regex::Regex>,
    counters: Vec<String>,
}

impl Filter {
    fn is_empty(&self) -> bool {
        self.vm.is_none() && self.counters.is_empty()
    }

    fn keeps_counter(&self, name: &str) -> bool {
        let name = name.to_lowercase();
        self.counters.is_empty() || self.counters.iter().any(|c| name.contains(&c.to_lowercase()))
    }

    /// Keeps a JSON key when `--counter` names its counter by catalog name or by the key.
    fn keeps_key(&self, key: &str) -> bool {
        let name = hvstats_present::json_keys::counter_of_key(key).map(|c| c.name);
        self.keeps_counter(key) || name.is_some_and(|n| self.keeps_counter(n))
    }

    /// Keeps the partitions `--vm` matches (by name, or `instance:id` when unnamed); with
    /// `--vm`, the host-wide objects go.
    fn apply(&self, mut s: InstanceSnapshot) -> InstanceSnapshot {
        if let Some(vm) = &self.vm {
            let instance = s.name.clone();
            s.partitions.retain(|p| vm.is_match(&hvstats_present::live::Live::vm_name(&instance, p)));
            s.lps.clear();
            s.hypervisor = ObjectReading::Counters(Vec::new());
        }
        s
    }

    /// Drops the counters `--counter` does not name from a JSON document, recursively (every
    /// `counters`, `interval` and `histograms` object).
    fn apply_json(&self, value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (key, v) in map.iter_mut() {
                    if matches!(key.as_str(), "counters" | "interval" | "histograms")
                        && let Value::Object(counters) = v
                    {
                        counters.retain(|key, _| self.keeps_key(key));
                    } else {
                        self.apply_json(v);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.apply_json(v)),
            _ => {}
        }
    }
}

fn parse_interval(s: &str) -> Result<f64, String> {
    super::parse_interval(s)
}

/// Runs `hvstats snapshot`.
pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    let filter = Filter { vm: args.vm, counters: args.counter };
    let dir = super::runtime_dir(args.runtime_dir)?;
    let mut attach = Attach::new(&dir);
    let changes = attach.refresh()?;
    for removed in &changes.removed_dead {
        note!("removed a file of a dead instance: {}", removed.display());
    }
    let mut failed = !changes.problems.is_empty();
    for problem in &changes.problems {
        note!("{}", hvstats_host::error_chain::error_chain(problem));
        if let Some(access) = crate::access::arena_access(problem) {
            note!("{access}");
        }
    }
    if !failed && attach.instances().next().is_none() {
        return nothing_published(&dir, args.json);
    }
    // Streaming keeps memory bounded for any number of VPs; a filtered document is built whole
    // (it holds only what the filters keep).
    if args.json && args.interval.is_none() && filter.is_empty() {
        output::with_stdout(|out| {
            let mut out = io::BufWriter::new(out);
            let unreadable = stream_json(&mut attach, &mut out)?;
            failed |= unreadable.failed;
            unreadable.lines.iter().for_each(|line| note!("{line}"));
            out.flush()
        })?;
        return Ok(if failed { ExitStatus::RuntimeError.into() } else { ExitStatus::Success.into() });
    }
    let (snapshots, earlier) = take(&mut attach, &filter, args.interval)?;
    failed |= snapshots.iter().any(has_unreadable);
    let shown = Shown { snapshots: &snapshots, earlier: earlier.as_ref(), filter: &filter };
    if args.json {
        output::print_json(&shown.json(&dir), true)?;
    } else if snapshots.is_empty() && failed {
        note!("no instance under {} could be read", dir.display());
    } else if snapshots.is_empty() {
        output::print(&format!("{}\n", hvstats_surfaces::nothing_publishes(&dir)))?;
    } else {
        snapshots.iter().for_each(note_unreadable);
        output::with_stdout(|out| shown.write_tables(out))?;
    }
    Ok(if failed { ExitStatus::RuntimeError.into() } else { ExitStatus::Success.into() })
}

/// The snapshots taken an interval before, and the seconds between them and the later ones.
type EarlierSnapshots = (Vec<InstanceSnapshot>, f64);

/// The snapshots of every instance `filter` keeps, and with `interval` (seconds) the earlier ones
/// taken that long before, with the time between them.
fn take(
    attach: &mut Attach,
    filter: &Filter,
    interval: Option<f64>,
) -> anyhow::Result<(Vec<InstanceSnapshot>, Option<EarlierSnapshots>)> {
    let started = Instant::now();
    let first: Vec<InstanceSnapshot> =
        attach.instances_mut().map(|i| filter.apply(Instance::snapshot(i))).collect();
    let Some(seconds) = interval else { return Ok((first, None)) };
    std::thread::sleep(Duration::from_secs_f64(seconds));
    attach.refresh()?;
    let elapsed = started.elapsed().as_secs_f64();
    let now = attach.instances_mut().map(|i| filter.apply(Instance::snapshot(i))).collect();
    Ok((now, Some((first, elapsed))))
}

/// The snapshots printed, with their earlier readings over an interval.
struct Shown<'a> {
    snapshots: &'a [InstanceSnapshot],
    earlier: Option<&'a EarlierSnapshots>,
    filter: &'a Filter,
}

impl Shown<'_> {
    /// The earlier reading of `s`, if any.
    fn earlier_of(&self, s: &InstanceSnapshot) -> Option<Earlier<'_>> {
        let (first, seconds) = self.earlier?;
        first.iter().find(|f| f.name == s.name).map(|snapshot| Earlier { snapshot, seconds: *seconds })
    }

    /// The `--json` document, with the platform of each VM whose observer under `dir` names it.
    fn json(&self, dir: &std::path::Path) -> Value {
        let instances: Vec<Value> =
            self.snapshots.iter().map(|s| instance_json(s, self.earlier_of(s))).collect();
        let mut doc = hvstats_present::snapshot_json::document(instances);
        add_platforms_from(&mut doc, dir, self.snapshots).iter().for_each(|p| note!("{p}"));
        if let Some((_, seconds)) = self.earlier {
            doc["interval_seconds"] = json!(seconds);
        }
        self.filter.apply_json(&mut doc);
        doc
    }

    /// The tables, one instance after another.
    fn write_tables(&self, out: &mut dyn Write) -> io::Result<()> {
        for s in self.snapshots {
            write!(out, "{}", instance_table(s, self.earlier_of(s), self.filter))?;
        }
        Ok(())
    }
}

/// No instance under `dir`: says so and how to start one (on standard error beside an empty JSON
/// document), with the status of its own a script tells apart from an unreadable directory.
fn nothing_published(dir: &std::path::Path, json: bool) -> anyhow::Result<ExitCode> {
    let line = hvstats_surfaces::nothing_publishes(dir);
    if json {
        output::print_json(&hvstats_present::snapshot_json::document(Vec::new()), true)?;
        note!("{line}");
    } else {
        output::print(&format!("{line}\n"))?;
    }
    Ok(ExitStatus::NothingPublished.into())
}

/// Says on standard error why each object of `s` that could not be read could not.
fn note_unreadable(s: &InstanceSnapshot) {
    unreadable_lines(s).iter().for_each(|line| note!("{line}"));
}

/// A table cell: the value scaled (a count with k/M/G, a time in ns/µs/ms/s), or the presented
/// value over the interval. JSON keeps the exact values. Over an `interval` whose readings hold
/// the same publication, a counter read in both without a value is [`SAME_PUBLICATION`] (the
/// caller gives no interval for one the object lacks: that is a `-`).
fn cell_text(counter: &Counter, value: Option<Value>, interval: Option<&Interval>) -> String {
    // A state is shown by its name.
    if let Some(Value::String(name)) = &value {
        return name.clone();
    }
    let Some(v) = value.and_then(|v| v.as_f64()) else {
        let same = interval.is_some_and(|i| i.same_publication() && i.seconds_for(counter).is_none());
        return if same && !matches!(counter.presentation, Presentation::Instant | Presentation::State) {
            SAME_PUBLICATION.into()
        } else {
            "-".into()
        };
    };
    let interval = interval.is_some();
    let time_ns = |v: f64| match counter.unit {
        hvstats_abi::catalog::Unit::Time100ns => Some(v * 100.0),
        hvstats_abi::catalog::Unit::Nanoseconds => Some(v),
        _ => None,
    };
    if !interval || counter.presentation == Presentation::Instant {
        return match time_ns(v) {
            // A moment is a time of day; a time at a moment (the time since boot) a duration.
            Some(ns) if counter.is_timestamp() => utc_time(ns),
            Some(ns) => human_ns(ns as u64),
            None => hvstats_surfaces::top::table::scaled_count(v),
        };
    }
    match present::shown_as(counter) {
        Presentation::PercentTime => format!("{v:.1}%"),
        Presentation::Cost => human_ns(v as u64),
        _ if v.abs() >= 1e4 => hvstats_surfaces::top::table::scaled_count(v),
        _ => format!("{v:.1}"),
    }
}

/// A column of a kind's table: its label, the object's reading, and over an interval its earlier
/// reading with the interval from it.
type TableColumn<'a> = (String, &'a ObjectReading, Option<(&'a ObjectReading, Interval)>);

/// One table per object kind: a row per counter, a column per object (with its earlier reading
/// over an interval).
fn kind_table(
    kind: ObjectKind,
    columns: &[TableColumn<'_>],
    histograms: &[Histograms<'_>],
    seconds: Option<f64>,
    filter: &Filter,
) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    // The host-wide objects `--vm` left out read as nothing.
    let columns: Vec<TableColumn<'_>> = columns
        .iter()
        .filter(|(_, r, _)| !matches!(r, ObjectReading::Counters(v) if v.is_empty()))
        .cloned()
        .collect();
    if columns.is_empty() || !counters_of(kind).any(|c| filter.keeps_counter(c.name)) {
        return out;
    }
    let _ = match histograms.is_empty() {
        true => writeln!(out, "  {}", kind.title()),
        false => writeln!(out, "  {} (histograms: upper bounds of p50/p99)", kind.title()),
    };
    let name_width = counters_of(kind).map(|c| row_name(c, seconds.is_some()).len()).max().unwrap_or(0);
    // A histogram's cell (`1023ns/4.2ms`) is wider than a number's.
    let least = if histograms.is_empty() { 12 } else { 15 };
    let widths: Vec<usize> = columns.iter().map(|(label, _, _)| label.len().max(least)).collect();
    column_heads(&mut out, &columns, &widths, name_width);
    if columns.iter().all(|(_, r, _)| matches!(r, ObjectReading::Unreadable { .. })) {
        return out;
    }
    let column_cells: Vec<Vec<(&'static Counter, Option<Value>)>> =
        columns.iter().map(|(_, now, then)| column_cells(now, then.as_ref(), seconds)).collect();
    // Bookkeeping (the sequence counter of consistent reads) is no measurement: JSON keeps it.
    for counter in counters_of(kind).filter(|c| !c.is_bookkeeping() && filter.keeps_counter(c.name)) {
        let _ = write!(out, "    {:name_width$}", row_name(counter, seconds.is_some()));
        for (i, ((cells, w), (_, now, then))) in column_cells.iter().zip(&widths).zip(&columns).enumerate() {
            let text = match histograms.get(i) {
                Some(h) if counter.presentation == Presentation::Histogram => {
                    h.cell(counter, seconds.is_some())
                }
                _ => {
                    let value = cells.iter().find(|(c, _)| c.id == counter.id).and_then(|(_, v)| v.clone());
                    // A counter the object lacks (unavailable, or not maintained) is a `-`.
                    let held = counter.is_maintained_anywhere() && now.get(counter.name).is_some();
                    let interval = then.as_ref().map(|(_, i)| i).filter(|_| held);
                    cell_text(counter, value, seconds.and(interval))
                }
            };
            let _ = write!(out, "  {text:>w$}");
        }
        out.push('\n');
    }
    out
}

/// The line of column labels, then a line per column whose object could not be read (why is said
/// on standard error, by [`note_unreadable`]).
fn column_heads(out: &mut String, columns: &[TableColumn<'_>], widths: &[usize], name_width: usize) {
    use std::fmt::Write;
    let _ = write!(out, "    {:name_width$}", "");
    for ((label, _, _), w) in columns.iter().zip(widths) {
        let _ = write!(out, "  {label:>w$}");
    }
    out.push('\n');
    for (label, reading, _) in columns {
        if let ObjectReading::Unreadable { .. } = reading {
            let _ = writeln!(out, "    {label}: unreadable");
        }
    }
}

/// A column's values: its reading `now`, or over an interval (`seconds`) the change from `then`.
/// An object that appeared during the interval has no earlier reading: nothing to show.
fn column_cells(
    now: &ObjectReading,
    then: Option<&(&ObjectReading, Interval)>,
    seconds: Option<f64>,
) -> Vec<(&'static Counter, Option<Value>)> {
    match (seconds, then) {
        (Some(_), Some((then, interval))) => cells(now, Some((then, interval))).collect(),
        (Some(_), None) => cells(now, None).map(|(c, _)| (c, None)).collect(),
        (None, _) => cells(now, None).collect(),
    }
}

/// A VP's histograms now and at the start of the interval, for its column of the table.
struct Histograms<'a> {
    now: &'a VpSnapshot,
    then: Option<&'a VpSnapshot>,
}

impl Histograms<'_> {
    /// `p50/p99` (bucket upper bounds, human units) of what `counter` recorded: since the VP
    /// started, or over the interval; `-` when it recorded nothing (or the VP has no earlier
    /// reading for an interval).
    fn cell(&self, counter: &Counter, interval: bool) -> String {
        let find = |vp: &VpSnapshot| vp.histograms.iter().find(|(c, _)| c.id == counter.id).map(|(_, h)| *h);
        let histogram = match (find(self.now), interval) {
            (Some(now), false) => Some(now),
            (Some(now), true) => self.then.and_then(find).and_then(|then| now.since(&then)),
            (None, _) => None,
        };
        let quantiles = histogram.and_then(|h| Some((h.quantile_upper_ns(0.5)?, h.quantile_upper_ns(0.99)?)));
        match quantiles {
            Some((p50, p99)) => format!("{}/{}", human_ns(p50), human_ns(p99)),
            None => "-".into(),
        }
    }
}

/// `then`, an object's earlier reading, with the interval from it to `now`, its reading in `s`.
fn with_interval<'a>(
    earlier: Option<Earlier<'_>>,
    then: Option<&'a ObjectReading>,
    now: &ObjectReading,
    s: &InstanceSnapshot,
) -> Option<(&'a ObjectReading, Interval)> {
    let earlier = earlier?;
    then.map(|t| (t, earlier.interval(t, now, s)))
}

/// An instance's heading line: its name, publisher and description, and the interval.
fn instance_heading(s: &InstanceSnapshot, seconds: Option<f64>) -> String {
    let mut out = format!("instance {} (pid {}", Escaped(&s.name), s.pid);
    if !s.description.kind.is_empty() || !s.description.name.is_empty() {
        out += &format!(", {}: {}", Escaped(&s.description.kind), Escaped(&s.description.name));
    }
    out.push(')');
    if let Some(secs) = seconds {
        out += &format!(
            " over {secs:.2} s: rates per second, % of the time, average cost, over the time between \
             the publisher's refreshes read"
        );
    }
    out.push('\n');
    out
}

/// A partition's column label: its id, name and whether (and why) it stopped.
fn partition_label(p: &PartitionSnapshot) -> String {
    let name = if p.name.is_empty() { String::new() } else { format!(" \"{}\"", Escaped(&p.name)) };
    let state = match &p.stopped {
        Some(reason) if !reason.is_empty() => format!(" (stopped: {})", Escaped(reason)),
        _ if !p.active => " (stopped)".to_owned(),
        _ => String::new(),
    };
    format!("partition {}{name}{state}", p.id)
}

/// Every VP's histograms in `s`, with their earlier reading in `e`.
fn vp_histograms<'a>(s: &'a InstanceSnapshot, e: Option<&'a InstanceSnapshot>) -> Vec<Histograms<'a>> {
    s.partitions
        .iter()
        .flat_map(|p| {
            p.vps.iter().map(move |vp| Histograms {
                now: vp,
                then: e
                    .and_then(|e| earlier_partition(e, p.id))
                    .and_then(|ep| ep.vps.iter().find(|v| v.index == vp.index)),
            })
        })
        .collect()
}

/// An instance's tables, one per object kind, over the interval from `earlier` if any.
fn instance_table(s: &InstanceSnapshot, earlier: Option<Earlier<'_>>, filter: &Filter) -> String {
    let seconds = earlier.map(|e| e.seconds);
    let mut out = instance_heading(s, seconds);
    let e = earlier.map(|e| e.snapshot);
    let interval = |then, now| with_interval(earlier, then, now, s);
    out += &kind_table(
        ObjectKind::Hypervisor,
        &[("hypervisor".into(), &s.hypervisor, interval(e.map(|e| &e.hypervisor), &s.hypervisor))],
        &[],
        seconds,
        filter,
    );
    let lps: Vec<_> = s
        .lps
        .iter()
        .map(|lp| {
            let then = e.and_then(|e| e.lps.iter().find(|l| l.index == lp.index)).map(|l| &l.reading);
            (format!("LP {} (cpu {})", lp.index, lp.cpu), &lp.reading, interval(then, &lp.reading))
        })
        .collect();
    out += &kind_table(ObjectKind::LogicalProcessor, &lps, &[], seconds, filter);
    let parts: Vec<_> = s
        .partitions
        .iter()
        .map(|p| {
            let then = e.and_then(|e| earlier_partition(e, p.id)).map(|p| &p.reading);
            (partition_label(p), &p.reading, interval(then, &p.reading))
        })
        .collect();
    out += &kind_table(ObjectKind::Partition, &parts, &[], seconds, filter);
    let vps: Vec<_> = s
        .partitions
        .iter()
        .flat_map(|p| {
            p.vps.iter().map(move |vp| {
                let then = e.and_then(|e| earlier_vp(e, p.id, vp.index));
                (format!("p{} VP {}", p.id, vp.index), &vp.reading, interval(then, &vp.reading))
            })
        })
        .collect();
    if vps.iter().any(|(_, _, then)| then.as_ref().is_some_and(|(_, i)| i.same_publication())) {
        out += &format!(
            "  {SAME_PUBLICATION}: both readings of the VP hold the same refresh of its publisher (no new \
             counts), so no rate\n"
        );
    }
    out += &kind_table(ObjectKind::Vp, &vps, &vp_histograms(s, e), seconds, filter);
    out.push('\n');
    out
}
