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
use hvstats::mshv::unmapped::ObjectRef;
use hvstats::present;
use hvstats::snapshot::{self, InstanceSnapshot, ObjectReading, PartitionSnapshot, VpSnapshot};
use hvstats::text::Escaped;
use hvstats_abi::catalog::counters_of;
use hvstats_abi::{Counter, ObjectKind, Presentation};
use serde_json::{Map, Value, json};

use crate::output::{self, ExitStatus, note};
use hvstats::present::human_ns;

/// Flags of `hvstats snapshot`.
#[derive(clap::Args)]
pub struct Args {
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

    /// Keeps the partitions `--vm` matches (by name, or `instance:id` when unnamed); with
    /// `--vm`, the host-wide objects go.
    fn apply(&self, mut s: InstanceSnapshot) -> InstanceSnapshot {
        if let Some(vm) = &self.vm {
            let instance = s.name.clone();
            s.partitions.retain(|p| vm.is_match(&crate::cmd::live::Live::vm_name(&instance, p)));
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
                        counters.retain(|name, _| self.keeps_counter(name));
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

/// The earlier reading of an interval and its length, when there is one.
#[derive(Clone, Copy)]
struct Earlier<'a> {
    snapshot: &'a InstanceSnapshot,
    seconds: f64,
}

/// One object's counters now, and its reading at the start of the interval.
fn cells<'a>(
    now: &'a ObjectReading,
    then: Option<&'a ObjectReading>,
    seconds: f64,
) -> impl Iterator<Item = (&'static Counter, Option<Value>)> + 'a {
    let kind_counters: Vec<&'static Counter> = match now {
        ObjectReading::Counters(values) => values.iter().map(|(c, _)| *c).collect(),
        ObjectReading::Unreadable { .. } => Vec::new(),
    };
    kind_counters.into_iter().map(move |c| {
        let after = now.get(c.name);
        let value = match (then, after) {
            (_, None) => None,
            (None, Some(v)) => Some(json!(v)),
            // A counter no source maintains reads 0 on the page; it has no rate or average.
            (Some(_), Some(_)) if !c.maintained.is_maintained() => None,
            (Some(then), Some(after)) => then.get(c.name).and_then(|before| {
                let paired = c.paired_count().and_then(|p| Some((then.get(p.name)?, now.get(p.name)?)));
                present::over_interval(c, before, after, seconds, paired).map(|p| json!(p.value))
            }),
        };
        (c, value)
    })
}

/// Runs `hvstats snapshot`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let filter = Filter { vm: args.vm, counters: args.counter };
    let dir = super::runtime_dir(args.runtime_dir)?;
    let mut attach = Attach::new(&dir);
    let changes = attach.refresh()?;
    for removed in &changes.removed_dead {
        note!("removed a file of a dead instance: {}", removed.display());
    }
    let mut failed = !changes.problems.is_empty();
    for problem in &changes.problems {
        note!("{}", hvstats::snapshot::error_chain(problem));
    }
    // Streaming keeps memory bounded for any number of VPs; a filtered document is built whole
    // (it holds only what the filters keep).
    if args.json && args.interval.is_none() && filter.is_empty() {
        output::with_stdout(|out| {
            let mut out = io::BufWriter::new(out);
            failed |= stream_json(&mut attach, &mut out)?;
            out.flush()
        })?;
        return Ok(if failed { ExitStatus::RuntimeError.into() } else { ExitStatus::Success.into() });
    }
    let started = Instant::now();
    let first: Vec<InstanceSnapshot> =
        attach.instances_mut().map(|i| filter.apply(Instance::snapshot(i))).collect();
    let (snapshots, earlier) = match args.interval {
        None => (first, None),
        Some(seconds) => {
            std::thread::sleep(Duration::from_secs_f64(seconds));
            attach.refresh()?;
            let elapsed = started.elapsed().as_secs_f64();
            (
                attach.instances_mut().map(|i| filter.apply(Instance::snapshot(i))).collect(),
                Some((first, elapsed)),
            )
        }
    };
    failed |= snapshots.iter().any(has_unreadable);
    let earlier_of = |s: &InstanceSnapshot| {
        earlier.as_ref().and_then(|(first, seconds)| {
            first.iter().find(|f| f.name == s.name).map(|snapshot| Earlier { snapshot, seconds: *seconds })
        })
    };
    if args.json {
        let instances: Vec<Value> = snapshots.iter().map(|s| instance_json(s, earlier_of(s))).collect();
        let mut doc = json!({ "instances": instances });
        if let Some((_, seconds)) = &earlier {
            doc["interval_seconds"] = json!(seconds);
        }
        filter.apply_json(&mut doc);
        output::print_json(&doc, true)?;
    } else if snapshots.is_empty() && failed {
        note!("no instance under {} could be read", dir.display());
    } else if snapshots.is_empty() {
        output::print(&format!("no live hvstats instance under {}\n", dir.display()))?;
    } else {
        snapshots.iter().for_each(note_unreadable);
        output::with_stdout(|out| {
            for s in &snapshots {
                write!(out, "{}", instance_table(s, earlier_of(s), &filter))?;
            }
            Ok(())
        })?;
    }
    Ok(if failed { ExitStatus::RuntimeError.into() } else { ExitStatus::Success.into() })
}

/// True when a reading failed for a reason other than permissions (which the user chose).
fn unreadable(r: &ObjectReading) -> bool {
    matches!(r, ObjectReading::Unreadable { permission_denied: false, .. })
}

/// Says on standard error why each object of `s` that could not be read could not.
fn note_unreadable(s: &InstanceSnapshot) {
    let note = |what: String, r: &ObjectReading| {
        if let ObjectReading::Unreadable { reason, .. } = r {
            note!("instance {} {what}: unreadable: {}", Escaped(&s.name), Escaped(reason));
        }
    };
    note("hypervisor".into(), &s.hypervisor);
    for lp in &s.lps {
        note(format!("LP {}", lp.index), &lp.reading);
    }
    for p in &s.partitions {
        note(format!("partition {}", p.id), &p.reading);
        for vp in &p.vps {
            note(format!("partition {} VP {}", p.id, vp.index), &vp.reading);
        }
    }
}

fn has_unreadable(s: &InstanceSnapshot) -> bool {
    unreadable(&s.hypervisor)
        || s.lps.iter().any(|lp| unreadable(&lp.reading))
        || s.partitions.iter().any(partition_unreadable)
}

fn partition_unreadable(p: &PartitionSnapshot) -> bool {
    unreadable(&p.reading) || p.vps.iter().any(|vp| unreadable(&vp.reading))
}

/// Writes `{"instances": [...]}` one partition at a time; true when something was unreadable.
fn stream_json(attach: &mut Attach, out: &mut impl Write) -> io::Result<bool> {
    let mut failed = false;
    out.write_all(b"{\"instances\":[")?;
    for (n, instance) in attach.instances_mut().enumerate() {
        instance.refresh();
        if n > 0 {
            out.write_all(b",")?;
        }
        let head = snapshot::take_instance_globals(instance);
        failed |= has_unreadable(&head);
        let mut fields = match instance_json(&head, None) {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        fields.remove("partitions");
        let text = serde_json::to_string(&Value::Object(fields)).map_err(io::Error::from)?;
        // The object without its closing brace, then the partitions streamed into it.
        out.write_all(&text.as_bytes()[..text.len().saturating_sub(1)])?;
        out.write_all(b",\"partitions\":[")?;
        for (i, p) in instance.partitions().iter().enumerate() {
            let snap = snapshot::take_partition(instance, p);
            failed |= partition_unreadable(&snap);
            if i > 0 {
                out.write_all(b",")?;
            }
            write_partition(out, &snap, &head)?;
        }
        out.write_all(b"]}")?;
    }
    out.write_all(b"]}\n")?;
    Ok(failed)
}

/// Each kind's counters with their names as JSON strings, computed once.
fn json_names(kind: ObjectKind) -> &'static [(&'static Counter, String)] {
    static NAMES: std::sync::OnceLock<Vec<Vec<(&'static Counter, String)>>> = std::sync::OnceLock::new();
    let all = NAMES.get_or_init(|| {
        ObjectKind::ALL
            .iter()
            .map(|&k| counters_of(k).map(|c| (c, Value::String(c.name.to_owned()).to_string())).collect())
            .collect()
    });
    &all[kind as usize]
}

/// What [`reading_json`] gives without an interval, written straight out (no tree per object:
/// streaming 65,536 VPs stays cheap): the reading's fields, then `extra` (already JSON), in one
/// object.
fn write_reading(
    out: &mut impl Write,
    reading: &ObjectReading,
    kind: ObjectKind,
    extra: &str,
) -> io::Result<()> {
    out.write_all(b"{")?;
    match reading {
        ObjectReading::Counters(values) => {
            out.write_all(b"\"counters\":{")?;
            let mut values = values.iter().peekable();
            for (i, (c, name)) in json_names(kind).iter().enumerate() {
                if i > 0 {
                    out.write_all(b",")?;
                }
                out.write_all(name.as_bytes())?;
                match values.next_if(|(v, _)| v.id == c.id) {
                    Some((_, v)) => write!(out, ":{v}")?,
                    None => out.write_all(b":null")?,
                }
            }
            out.write_all(b"}")?;
        }
        ObjectReading::Unreadable { permission_denied, reason } => {
            write!(
                out,
                "\"permission_denied\":{permission_denied},\"unreadable\":{}",
                Value::String(reason.clone())
            )?;
        }
    }
    if !extra.is_empty() {
        write!(out, ",{extra}")?;
    }
    out.write_all(b"}")
}

/// [`partition_json`] without an interval, written straight out.
/// The VMM process running an observed VM: `{"kind": "qemu", "pid": N}`, else null.
fn vmm_json(p: &PartitionSnapshot) -> Value {
    p.vmm.map_or(Value::Null, |v| json!({"kind": v.vmm.name(), "pid": v.pid}))
}

fn write_partition(out: &mut impl Write, p: &PartitionSnapshot, s: &InstanceSnapshot) -> io::Result<()> {
    let state = if p.active { "active" } else { "stopped" };
    let unmapped = |at| unmapped_json(s, at).map_or(String::new(), |u| format!("\"unmapped\":{u},"));
    let head = format!(
        "\"active\":{},\"id\":{},\"name\":{},\"state\":\"{state}\",\"stopped_reason\":{},{}\"vmm\":{},\"vps\":[",
        p.active,
        p.id,
        Value::String(p.name.clone()),
        p.stopped.as_ref().map_or(Value::Null, |r| Value::String(r.clone())),
        unmapped(ObjectRef::Partition(p.id)),
        vmm_json(p),
    );
    // The partition's reading and fields, its VPs streamed into the open array.
    let mut text = Vec::new();
    write_reading(&mut text, &p.reading, ObjectKind::Partition, &head)?;
    text.pop();
    out.write_all(&text)?;
    for (i, vp) in p.vps.iter().enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        let extra = format!(
            "\"histograms\":{},\"index\":{}{}",
            histograms_json(vp),
            vp.index,
            unmapped_json(s, ObjectRef::Vp(p.id, vp.index))
                .map_or(String::new(), |u| format!(",\"unmapped\":{u}"))
        );
        write_reading(out, &vp.reading, ObjectKind::Vp, &extra)?;
    }
    out.write_all(b"]}")
}

/// A VP's histograms: `{name: {"sum_ns", "count", "buckets": [32 counts], "p50_ns", "p99_ns"}}`,
/// bucket `i` counting times in `[2^(i-1), 2^i)` ns (bucket 0: zero, the last: everything
/// longer); the quantiles are upper bounds of their buckets (`null` when nothing was recorded).
pub(crate) fn histograms_json(vp: &VpSnapshot) -> Value {
    let map: Map<String, Value> = vp
        .histograms
        .iter()
        .map(|(c, h)| {
            let value = json!({
                "sum_ns": h.sum_ns,
                "count": h.count(),
                "buckets": h.buckets.to_vec(),
                "p50_ns": h.quantile_upper_ns(0.5),
                "p99_ns": h.quantile_upper_ns(0.99),
            });
            (c.name.to_owned(), value)
        })
        .collect();
    Value::Object(map)
}

/// `{"counters": {name: value}}` (with `"interval": {name: rate, % or ns}` over an interval), or
/// `{"unreadable": reason, "permission_denied": bool}`.
fn reading_json(
    reading: &ObjectReading,
    kind: ObjectKind,
    then: Option<(Option<&ObjectReading>, f64)>,
) -> Map<String, Value> {
    let mut object = Map::new();
    match reading {
        ObjectReading::Counters(values) => {
            // Every catalog counter of the kind (even when the publisher declared them all
            // unavailable): one declared unavailable is null.
            let mut counters = Map::new();
            for c in counters_of(kind) {
                counters.insert(c.name.to_owned(), Value::Null);
            }
            for (c, v) in values {
                counters.insert(c.name.to_owned(), json!(v));
            }
            object.insert("counters".into(), Value::Object(counters));
            if let Some((then, seconds)) = then {
                let presented = match then {
                    Some(then) => cells(reading, Some(then), seconds)
                        .map(|(c, v)| (c.name.to_owned(), v.unwrap_or(Value::Null)))
                        .collect::<Map<_, _>>(),
                    None => Map::new(),
                };
                object.insert("interval".into(), Value::Object(presented));
            }
        }
        ObjectReading::Unreadable { permission_denied, reason } => {
            object.insert("unreadable".into(), json!(reason));
            object.insert("permission_denied".into(), json!(permission_denied));
        }
    }
    object
}

fn with(mut object: Map<String, Value>, fields: Value) -> Value {
    if let Value::Object(fields) = fields {
        let mut merged = fields;
        merged.append(&mut object);
        return Value::Object(merged);
    }
    Value::Object(object)
}

fn instance_json(s: &InstanceSnapshot, earlier: Option<Earlier<'_>>) -> Value {
    let then = |find: &dyn Fn(&InstanceSnapshot) -> Option<&ObjectReading>| {
        earlier.map(|e| (find(e.snapshot), e.seconds))
    };
    let lps: Vec<Value> = s
        .lps
        .iter()
        .map(|lp| {
            let t = then(&|e| e.lps.iter().find(|l| l.index == lp.index).map(|l| &l.reading));
            let fields = json!({"index": lp.index, "cpu": lp.cpu});
            with(
                reading_json(&lp.reading, ObjectKind::LogicalProcessor, t),
                with_unmapped(fields, s, ObjectRef::Lp(lp.index)),
            )
        })
        .collect();
    let partitions: Vec<Value> = s.partitions.iter().map(|p| partition_json(p, earlier, s)).collect();
    let mut hypervisor = reading_json(&s.hypervisor, ObjectKind::Hypervisor, then(&|e| Some(&e.hypervisor)));
    if let Some(u) = unmapped_json(s, ObjectRef::Hypervisor) {
        hypervisor.insert("unmapped".into(), u);
    }
    json!({
        "name": s.name,
        "pid": s.pid,
        "kind": s.description.kind,
        "description": s.description.name,
        "hypervisor": Value::Object(hypervisor),
        "lps": lps,
        "partitions": partitions,
    })
}

/// The JSON of one instance as `snapshot --json` prints it, for other commands.
pub(crate) fn snapshot_json(s: &InstanceSnapshot) -> Value {
    instance_json(s, None)
}

/// With `--mshv` instances: the values the catalog has no counter for, by name, of one object
/// (`None` for an instance that keeps no such values).
fn unmapped_json(s: &InstanceSnapshot, at: ObjectRef) -> Option<Value> {
    let all = s.unmapped.as_ref()?;
    let map: Map<String, Value> =
        all.get(&at).into_iter().flatten().map(|(name, v)| (name.clone(), json!(v))).collect();
    Some(Value::Object(map))
}

/// `fields` with an `unmapped` object added, when the instance keeps unmapped values.
fn with_unmapped(mut fields: Value, s: &InstanceSnapshot, at: ObjectRef) -> Value {
    if let (Some(u), Value::Object(map)) = (unmapped_json(s, at), &mut fields) {
        map.insert("unmapped".into(), u);
    }
    fields
}

fn partition_json(p: &PartitionSnapshot, earlier: Option<Earlier<'_>>, s: &InstanceSnapshot) -> Value {
    let then = |find: &dyn Fn(&InstanceSnapshot) -> Option<&ObjectReading>| {
        earlier.map(|e| (find(e.snapshot), e.seconds))
    };
    let vps: Vec<Value> = p
        .vps
        .iter()
        .map(|vp| {
            let t = then(&|e| earlier_vp(e, p.id, vp.index));
            let fields = json!({"index": vp.index, "histograms": histograms_json(vp)});
            with(
                reading_json(&vp.reading, ObjectKind::Vp, t),
                with_unmapped(fields, s, ObjectRef::Vp(p.id, vp.index)),
            )
        })
        .collect();
    let t = then(&|e| earlier_partition(e, p.id).map(|e| &e.reading));
    let state = match &p.stopped {
        None if p.active => json!("active"),
        None => json!("stopped"),
        Some(_) => json!("stopped"),
    };
    let vmm = vmm_json(p);
    let fields = json!({"id": p.id, "name": p.name, "vmm": vmm, "active": p.active, "state": state, "stopped_reason": p.stopped, "vps": vps});
    with(
        reading_json(&p.reading, ObjectKind::Partition, t),
        with_unmapped(fields, s, ObjectRef::Partition(p.id)),
    )
}

fn earlier_partition(e: &InstanceSnapshot, id: u64) -> Option<&PartitionSnapshot> {
    e.partitions.iter().find(|p| p.id == id)
}

fn earlier_vp(e: &InstanceSnapshot, id: u64, index: u32) -> Option<&ObjectReading> {
    earlier_partition(e, id)?.vps.iter().find(|v| v.index == index).map(|v| &v.reading)
}

/// A row's name: the catalog's, except that without an interval a "/sec" counter is its total
/// and a time counter its total time (the page holds cumulative values; rates need two readings).
fn row_name(counter: &Counter, interval: bool) -> String {
    if interval {
        return counter.name.to_owned();
    }
    match counter.presentation {
        Presentation::Rate => match counter.name.strip_suffix("/sec") {
            Some(base) => format!("{base} (total)"),
            None => format!("{} (total)", counter.name),
        },
        Presentation::Cost | Presentation::PercentTime | Presentation::CumulativeTime => {
            format!("{} (total time)", counter.name.trim_start_matches("% "))
        }
        _ => counter.name.to_owned(),
    }
}

/// A count scaled for reading: `950`, `12.3k`, `4.56M`, `7.89G`.
fn scaled_count(v: f64) -> String {
    let (value, unit) = match v.abs() {
        a if a < 1e4 => return format!("{v:.0}"),
        a if a < 1e6 => (v / 1e3, "k"),
        a if a < 1e9 => (v / 1e6, "M"),
        a if a < 1e12 => (v / 1e9, "G"),
        _ => (v / 1e12, "T"),
    };
    if value.abs() < 99.95 { format!("{value:.2}{unit}") } else { format!("{value:.1}{unit}") }
}

/// A table cell: the value scaled (a count with k/M/G, a time in ns/µs/ms/s), or the presented
/// value over the interval. JSON keeps the exact values.
fn cell_text(counter: &Counter, value: Option<Value>, interval: bool) -> String {
    let Some(v) = value.and_then(|v| v.as_f64()) else { return "-".into() };
    let time_ns = |v: f64| match counter.unit {
        hvstats_abi::catalog::Unit::Time100ns => Some(v * 100.0),
        hvstats_abi::catalog::Unit::Nanoseconds => Some(v),
        _ => None,
    };
    if !interval || counter.presentation == Presentation::Instant {
        return match time_ns(v) {
            Some(ns) if counter.presentation != Presentation::Instant => human_ns(ns as u64),
            _ => scaled_count(v),
        };
    }
    match counter.presentation {
        Presentation::PercentTime => format!("{v:.1}%"),
        Presentation::Cost => human_ns(v as u64),
        _ if v.abs() >= 1e4 => scaled_count(v),
        _ => format!("{v:.1}"),
    }
}

/// One table per object kind: a row per counter, a column per object (with its earlier reading
/// over an interval).
fn kind_table(
    kind: ObjectKind,
    columns: &[(String, &ObjectReading, Option<&ObjectReading>)],
    histograms: &[Histograms<'_>],
    seconds: Option<f64>,
    filter: &Filter,
) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    // The host-wide objects `--vm` left out read as nothing.
    let columns: Vec<(String, &ObjectReading, Option<&ObjectReading>)> = columns
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
    let _ = write!(out, "    {:name_width$}", "");
    for ((label, _, _), w) in columns.iter().zip(&widths) {
        let _ = write!(out, "  {label:>w$}");
    }
    out.push('\n');
    for (label, reading, _) in &columns {
        // Why is said on standard error ([`note_unreadable`]).
        if let ObjectReading::Unreadable { .. } = reading {
            let _ = writeln!(out, "    {label}: unreadable");
        }
    }
    if columns.iter().all(|(_, r, _)| matches!(r, ObjectReading::Unreadable { .. })) {
        return out;
    }
    let column_cells: Vec<Vec<(&'static Counter, Option<Value>)>> = columns
        .iter()
        .map(|(_, now, then)| match seconds {
            // An object that appeared during the interval has no earlier reading: nothing to show.
            Some(secs) => match then {
                Some(then) => cells(now, Some(then), secs).collect(),
                None => cells(now, None, secs).map(|(c, _)| (c, None)).collect(),
            },
            None => cells(now, None, 0.0).collect(),
        })
        .collect();
    // Bookkeeping (the sequence counter of consistent reads) is no measurement: JSON keeps it.
    for counter in counters_of(kind).filter(|c| !c.is_bookkeeping() && filter.keeps_counter(c.name)) {
        let _ = write!(out, "    {:name_width$}", row_name(counter, seconds.is_some()));
        for (i, (cells, w)) in column_cells.iter().zip(&widths).enumerate() {
            let text = match histograms.get(i) {
                Some(h) if counter.presentation == Presentation::Histogram => {
                    h.cell(counter, seconds.is_some())
                }
                _ => {
                    let value = cells.iter().find(|(c, _)| c.id == counter.id).and_then(|(_, v)| v.clone());
                    cell_text(counter, value, seconds.is_some())
                }
            };
            let _ = write!(out, "  {text:>w$}");
        }
        out.push('\n');
    }
    out
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

fn instance_table(s: &InstanceSnapshot, earlier: Option<Earlier<'_>>, filter: &Filter) -> String {
    let seconds = earlier.map(|e| e.seconds);
    let mut out = format!("instance {} (pid {}", Escaped(&s.name), s.pid);
    if !s.description.kind.is_empty() || !s.description.name.is_empty() {
        out += &format!(", {}: {}", Escaped(&s.description.kind), Escaped(&s.description.name));
    }
    out.push(')');
    if let Some(secs) = seconds {
        out += &format!(" over {secs:.2} s: rates per second, % of the time, average cost");
    }
    out.push('\n');
    let e = earlier.map(|e| e.snapshot);
    out += &kind_table(
        ObjectKind::Hypervisor,
        &[("hypervisor".into(), &s.hypervisor, e.map(|e| &e.hypervisor))],
        &[],
        seconds,
        filter,
    );
    let lps: Vec<_> = s
        .lps
        .iter()
        .map(|lp| {
            let then = e.and_then(|e| e.lps.iter().find(|l| l.index == lp.index)).map(|l| &l.reading);
            (format!("LP {} (cpu {})", lp.index, lp.cpu), &lp.reading, then)
        })
        .collect();
    out += &kind_table(ObjectKind::LogicalProcessor, &lps, &[], seconds, filter);
    let parts: Vec<_> = s
        .partitions
        .iter()
        .map(|p| {
            let then = e.and_then(|e| earlier_partition(e, p.id)).map(|p| &p.reading);
            let name = if p.name.is_empty() { String::new() } else { format!(" \"{}\"", Escaped(&p.name)) };
            let state = match &p.stopped {
                Some(reason) if !reason.is_empty() => format!(" (stopped: {})", Escaped(reason)),
                _ if !p.active => " (stopped)".to_owned(),
                _ => String::new(),
            };
            (format!("partition {}{name}{state}", p.id), &p.reading, then)
        })
        .collect();
    out += &kind_table(ObjectKind::Partition, &parts, &[], seconds, filter);
    let vps: Vec<_> = s
        .partitions
        .iter()
        .flat_map(|p| {
            p.vps.iter().map(move |vp| {
                let then = e.and_then(|e| earlier_vp(e, p.id, vp.index));
                (format!("p{} VP {}", p.id, vp.index), &vp.reading, then)
            })
        })
        .collect();
    let histograms: Vec<Histograms<'_>> = s
        .partitions
        .iter()
        .flat_map(|p| {
            p.vps.iter().map(move |vp| Histograms {
                now: vp,
                then: e
                    .and_then(|e| earlier_partition(e, p.id))
                    .and_then(|ep| ep.vps.iter().find(|v| v.index == vp.index)),
            })
        })
        .collect();
    out += &kind_table(ObjectKind::Vp, &vps, &histograms, seconds, filter);
    out.push('\n');
    out
}
