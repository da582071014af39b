//! The JSON of snapshots, one shape for every surface that prints or serves it (`snapshot
//! --json`, serve's `/api/v1/snapshot`): streamed one partition at a time for a whole host, or
//! built as a document (with rates over an interval, or filtered).

use std::io::{self, Write};

use crate::json_keys::{Held, SCHEMA_KEY, SCHEMA_VERSION, key};
use crate::present::{self, Interval};
use crate::text::Escaped;
use hvstats::attach::Attach;
use hvstats::snapshot::{self, InstanceSnapshot, ObjectReading, PartitionSnapshot, VpSnapshot};
use hvstats::unmapped::ObjectRef;
use hvstats_abi::catalog::counters_of;
use hvstats_abi::vm_state::VmState;
use hvstats_abi::{Counter, ObjectKind, Presentation};
use serde_json::{Map, Value, json};

/// The earlier reading of an interval and its length, when there is one.
#[derive(Clone, Copy)]
pub struct Earlier<'a> {
    /// The first reading.
    pub snapshot: &'a InstanceSnapshot,
    /// Seconds between the two readings.
    pub seconds: f64,
}

impl Earlier<'_> {
    /// The interval from `then`, an object of the earlier reading, to `now`, the same object of
    /// instance `s`: dated by the page's publication times, else by the instance's refreshes.
    pub fn interval(&self, then: &ObjectReading, now: &ObjectReading, s: &InstanceSnapshot) -> Interval {
        let refreshed = (self.snapshot.refreshed_us, s.refreshed_us);
        Interval::between(then, now, self.seconds, refreshed, s.description.runs_its_partitions())
    }
}

/// An object's earlier reading and the interval from it, over an interval: `None` inside for an
/// object that appeared during the interval.
type Then<'a> = Option<Option<(&'a ObjectReading, Interval)>>;

/// What dated an object's rates, for JSON: the seconds between the refreshes its readings hold,
/// whether they hold the same one (its rates are then null, not 0), and what dated them.
pub fn publication_json(interval: &Interval) -> Value {
    json!({
        "published_seconds": (interval.published > 0.0).then_some(interval.published),
        "same_publication": interval.same_publication(),
        "dated_by": interval.dated_by.name(),
    })
}

/// What [`stream_json`] could not read.
#[derive(Debug, Default)]
pub struct Unreadable {
    /// True when something could not be read for a reason other than permissions (see
    /// [`unreadable`]).
    pub failed: bool,
    /// A line for each object that could not be read ([`unreadable_lines`]).
    pub lines: Vec<String>,
}

/// Writes `{"schema_version": N, "instances": [...]}` one partition at a time; returns what could
/// not be read.
///
/// # Errors
/// When writing to `out` fails.
pub fn stream_json(attach: &mut Attach, out: &mut impl Write) -> io::Result<Unreadable> {
    let mut report = Unreadable::default();
    write!(out, "{{\"{SCHEMA_KEY}\":{SCHEMA_VERSION},\"instances\":[")?;
    for (n, instance) in attach.instances_mut().enumerate() {
        instance.refresh();
        if n > 0 {
            out.write_all(b",")?;
        }
        let head = snapshot::take_instance_globals(instance);
        report.failed |= has_unreadable(&head);
        report.lines.extend(unreadable_lines(&head));
        let platforms = match head.description.kind == hvstats::index::OBSERVER_KIND {
            true => instance_platforms(instance).unwrap_or_else(|line| {
                report.lines.push(line);
                None
            }),
            false => None,
        };
        let partitions = instance.partitions().iter().filter_map(|p| snapshot::take_partition(instance, p));
        let noted = partitions.inspect(|p| {
            report.failed |= partition_unreadable(p);
            report.lines.extend(partition_unreadable_lines(&head.name, p));
        });
        write_instance(out, &head, noted, platforms.as_ref())?;
    }
    out.write_all(b"]}\n")?;
    Ok(report)
}

/// The platform identities the observer `instance` wrote beside it (its arena is
/// `<runtime dir>/instances/<name>.arena`).
///
/// # Errors
/// When they cannot be read or believed: the problem, said for a person.
fn instance_platforms(instance: &hvstats::attach::Instance) -> Result<Option<Platforms>, String> {
    let Some(runtime) = instance.path().parent().and_then(std::path::Path::parent) else { return Ok(None) };
    crate::live::platforms_of(runtime, &instance.name())
}

/// An observer's VMs' platform identities, by partition id.
type Platforms = std::collections::BTreeMap<u64, hvstats_platform::shown::Shown>;

/// Writes `{"schema_version": N, "instances": [...], "max_vps": N, "vps_left_out": M}` of `instances` one partition at
/// a time, as [`stream_json`] does, with at most `max_vps` VPs: the partitions whose VPs no longer
/// fit have `"vps": []` and say how many were left out (`"vps_left_out"`). Takes the partitions
/// out of `instances` as it goes. Returns the number of VPs left out.
///
/// # Errors
/// When writing to `out` fails.
pub fn write_capped(
    out: &mut impl Write,
    instances: &mut [InstanceSnapshot],
    max_vps: usize,
) -> io::Result<usize> {
    let (mut budget, mut left_out) = (max_vps, 0usize);
    write!(out, "{{\"{SCHEMA_KEY}\":{SCHEMA_VERSION},\"instances\":[")?;
    for (n, instance) in instances.iter_mut().enumerate() {
        if n > 0 {
            out.write_all(b",")?;
        }
        let partitions = std::mem::take(&mut instance.partitions);
        let mut fields = match instance_json(instance, None) {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        fields.remove("partitions");
        let text = serde_json::to_string(&Value::Object(fields)).map_err(io::Error::from)?;
        out.write_all(&text.as_bytes()[..text.len().saturating_sub(1)])?;
        out.write_all(b",\"partitions\":[")?;
        for (i, mut p) in partitions.into_iter().enumerate() {
            if i > 0 {
                out.write_all(b",")?;
            }
            if p.vps.len() <= budget {
                budget -= p.vps.len();
                write_partition(out, &p, instance, None)?;
                continue;
            }
            let dropped = std::mem::take(&mut p.vps).len();
            left_out += dropped;
            let mut text = Vec::new();
            write_partition(&mut text, &p, instance, None)?;
            text.pop();
            out.write_all(&text)?;
            write!(out, ",\"vps_left_out\":{dropped}}}")?;
        }
        out.write_all(b"]}")?;
    }
    writeln!(out, "],\"max_vps\":{max_vps},\"vps_left_out\":{left_out}}}")?;
    Ok(left_out)
}

/// True for a row documents show as a counter: not the partition page's source table, which is
/// bookkeeping read whole into `"sources"` (the VP page's sequence counter stays, as it is).
fn is_counter(c: &Counter) -> bool {
    !(c.id.kind == ObjectKind::Partition && c.is_bookkeeping())
}

/// Writes `{"schema_version": N, "instances": [...]}` of `instances` straight out: the document
/// [`document`] of their [`snapshot_json`] holds, without a tree per object (a host of 4,000 VPs
/// is some 40 MB of JSON; the tree took ten times as long to build and print).
///
/// # Errors
/// When writing to `out` fails.
pub fn write_instances(instances: &[InstanceSnapshot], out: &mut impl Write) -> io::Result<()> {
    write!(out, "{{\"{SCHEMA_KEY}\":{SCHEMA_VERSION},\"instances\":[")?;
    for (n, instance) in instances.iter().enumerate() {
        if n > 0 {
            out.write_all(b",")?;
        }
        write_instance(out, instance, instance.partitions.iter(), None)?;
    }
    out.write_all(b"]}\n")
}

/// One instance as [`instance_json`] gives it without an interval: its own fields from `head`
/// (whose partitions are not looked at), then `partitions`, each written as it comes.
fn write_instance<P: std::borrow::Borrow<PartitionSnapshot>>(
    out: &mut impl Write,
    head: &InstanceSnapshot,
    partitions: impl Iterator<Item = P>,
    platforms: Option<&Platforms>,
) -> io::Result<()> {
    let text = serde_json::to_string(&Value::Object(instance_fields(head, None))).map_err(io::Error::from)?;
    // The object without its closing brace, then the partitions streamed into it.
    out.write_all(&text.as_bytes()[..text.len().saturating_sub(1)])?;
    out.write_all(b",\"partitions\":[")?;
    for (i, p) in partitions.enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        let p = p.borrow();
        write_partition(out, p, head, platforms.and_then(|vms| vms.get(&p.id)))?;
    }
    out.write_all(b"]}")
}

/// Each kind's counters with their keys as totals ([`Held::Total`]) as JSON strings, computed once.
fn json_names(kind: ObjectKind) -> &'static [(&'static Counter, String)] {
    static NAMES: std::sync::OnceLock<Vec<Vec<(&'static Counter, String)>>> = std::sync::OnceLock::new();
    let all = NAMES.get_or_init(|| {
        ObjectKind::ALL
            .iter()
            .map(|&k| counters_of(k).map(|c| (c, Value::String(key(c, Held::Total)).to_string())).collect())
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
            let mut first = true;
            for (c, name) in json_names(kind) {
                let value = values.next_if(|(v, _)| v.id == c.id);
                if !is_counter(c) {
                    continue;
                }
                if !std::mem::take(&mut first) {
                    out.write_all(b",")?;
                }
                out.write_all(name.as_bytes())?;
                match value {
                    Some((_, v)) => write!(out, ":{}", counter_json(c, *v))?,
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

/// An observed VM's sources, in the order that decides which writes a counter several give:
/// each with whether it gives counters now, from when it counts, and the counters it writes;
/// null for a partition that names none.
fn sources_json(p: &PartitionSnapshot) -> Value {
    let Some(table) = p.sources() else { return Value::Null };
    let origins = p.origins();
    let written = |kind: ObjectKind, source: &hvstats_abi::vm_sources::SourceEntry| -> Vec<&'static str> {
        counters_of(kind)
            .filter(|c| !c.is_bookkeeping() && table.writer(c.id).is_some_and(|w| std::ptr::eq(w, source)))
            .map(|c| c.name)
            .collect()
    };
    Value::Array(
        table
            .sources()
            .map(|s| {
                json!({
                    "name": s.name(),
                    "up": s.up,
                    "counts_from": s.origin.name(),
                    "counts_since": seconds_json(origins.of_source(s)),
                    "partition": written(ObjectKind::Partition, s),
                    "vp": written(ObjectKind::Vp, s),
                })
            })
            .collect(),
    )
}

/// From when the partition's counters count, in seconds since the Unix epoch (µs precision): the
/// page's creation (an observer's attach), which a new publisher starts again, so a counter lower
/// than before under a later `counting_since` was reset, not lost. The counters of an observed
/// VM's sources that count from the vCPU's creation, or keep their counts across observers, say
/// their own in `sources[].counts_since`.
/// Null for a page of an older publisher.
fn counting_since_json(p: &PartitionSnapshot) -> Value {
    seconds_json(p.origins().counting_since_us)
}

/// From when the counts the kernel keeps for an observed VM across observers count, in seconds
/// since the Unix epoch (µs precision): the first observer's attach, which a restarted observer
/// continues from; the counters of the sources that keep their counts (`counts_from` "kept") say
/// it in `sources[].counts_since`. Null when none are kept.
fn kept_since_json(p: &PartitionSnapshot) -> Value {
    seconds_json(p.origins().kept_since_us)
}

/// Microseconds since the epoch as seconds, null when unknown.
fn seconds_json(us: Option<u64>) -> Value {
    us.map_or(Value::Null, |us| json!(us as f64 / 1e6))
}

/// An observed VM's UUID (`"6b29fc40-ca47-1067-b31d-00dd010662da"`), else null.
fn uuid_json(p: &PartitionSnapshot) -> Value {
    p.uuid.map_or(Value::Null, |u| Value::String(u.to_string()))
}

/// An observed VM's Hyper-V enlightenments (`["hv-relaxed","hv-synic"]`, `[]` for a VM its VMM
/// gave none), else null (not known: another VMM, or our own partition).
fn hyperv_json(p: &PartitionSnapshot) -> Value {
    hvstats_abi::hyperv_features::names(p.hyperv_enlightenments)
        .map_or(Value::Null, |n| json!(n.collect::<Vec<_>>()))
}

fn write_partition(
    out: &mut impl Write,
    p: &PartitionSnapshot,
    s: &InstanceSnapshot,
    platform: Option<&hvstats_platform::shown::Shown>,
) -> io::Result<()> {
    // As `partition_json` says it: a partition with a reason to have stopped has stopped.
    let state = if p.active && p.stopped.is_none() { "active" } else { "stopped" };
    let unmapped = |at| unmapped_json(s, at).map_or(String::new(), |u| format!("\"unmapped\":{u},"));
    let head = format!(
        "\"active\":{},\"counting_since\":{},\"hyperv_enlightenments\":{},\"id\":{},\"kept_since\":{},\"name\":{},{}\"sources\":{},\"state\":\"{state}\",\"stopped_reason\":{},{}\"uuid\":{},\"vmm\":{},\"vps\":[",
        p.active,
        counting_since_json(p),
        hyperv_json(p),
        p.id,
        kept_since_json(p),
        Value::String(p.name.clone()),
        platform.map_or(String::new(), |shown| format!("\"platform\":{},", platform_json(shown))),
        sources_json(p),
        p.stopped.as_ref().map_or(Value::Null, |r| Value::String(r.clone())),
        unmapped(ObjectRef::Partition(p.id)),
        uuid_json(p),
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
        let mut histograms = String::new();
        write_histograms(&mut histograms, vp);
        let extra = format!(
            "\"histograms\":{histograms},\"index\":{}{}",
            vp.index,
            unmapped_json(s, ObjectRef::Vp(p.id, vp.index))
                .map_or(String::new(), |u| format!(",\"unmapped\":{u}"))
        );
        write_reading(out, &vp.reading, ObjectKind::Vp, &extra)?;
    }
    out.write_all(b"]}")
}

/// What [`histograms_json`] gives, written straight out (keys in the same order as its object's):
/// a VP's histograms are most of its JSON, and a tree of them per VP was most of the time.
fn write_histograms(out: &mut String, vp: &VpSnapshot) {
    use std::fmt::Write as _;
    let mut sorted: Vec<_> = vp.histograms.iter().collect();
    sorted.sort_by_key(|(c, _)| c.name);
    out.push('{');
    for (i, (c, h)) in sorted.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        // Keyed by the histogram's catalog name, as histograms_json keys it.
        out.push_str(&Value::String(c.name.to_owned()).to_string());
        out.push_str(":{\"buckets\":[");
        for (b, count) in h.buckets.iter().enumerate() {
            if b > 0 {
                out.push(',');
            }
            let _ = write!(out, "{count}");
        }
        let quantile = |q| h.quantile_upper_ns(q).map_or("null".to_owned(), |ns| ns.to_string());
        let _ = write!(
            out,
            "],\"count\":{},\"p50_ns\":{},\"p99_ns\":{},\"sum_ns\":{}}}",
            h.count(),
            quantile(0.5),
            quantile(0.99),
            h.sum_ns
        );
    }
    out.push('}');
}

/// A VP's histograms: `{name: {"sum_ns", "count", "buckets": [32 counts], "p50_ns", "p99_ns"}}`,
/// bucket `i` counting times in `[2^(i-1), 2^i)` ns (bucket 0: zero, the last: everything
/// longer); the quantiles are upper bounds of their buckets (`null` when nothing was recorded).
pub fn histograms_json(vp: &VpSnapshot) -> Value {
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

/// `{"counters": {key: total}}` (with `"interval": {key: rate, % or ns}` over an interval, keys
/// as [`crate::json_keys`] makes them), or
/// `{"unreadable": reason, "permission_denied": bool}`.
fn reading_json(reading: &ObjectReading, kind: ObjectKind, then: Then<'_>) -> Map<String, Value> {
    let mut object = Map::new();
    match reading {
        ObjectReading::Counters(values) => {
            // Every catalog counter of the kind (even when the publisher declared them all
            // unavailable): one declared unavailable is null.
            let mut counters = Map::new();
            for c in counters_of(kind).filter(|c| is_counter(c)) {
                counters.insert(key(c, Held::Total), Value::Null);
            }
            for (c, v) in values.iter().filter(|(c, _)| is_counter(c)) {
                counters.insert(key(c, Held::Total), counter_json(c, *v));
            }
            object.insert("counters".into(), Value::Object(counters));
            if let Some(then) = then {
                let presented = match then {
                    // A histogram is presented whole, under "histograms".
                    Some((then, interval)) => cells(reading, Some((then, &interval)))
                        .filter(|(c, _)| {
                            c.presentation != hvstats_abi::Presentation::Histogram && is_counter(c)
                        })
                        .map(|(c, v)| (key(c, Held::Presented), v.unwrap_or(Value::Null)))
                        .collect::<Map<_, _>>(),
                    None => Map::new(),
                };
                object.insert("interval".into(), Value::Object(presented));
                if let Some((_, interval)) = then {
                    object.insert("publication".into(), publication_json(&interval));
                }
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

/// One instance as JSON: its LPs and partitions with every counter, and with an `earlier`
/// reading the rates, percentages and average costs over the interval.
pub fn instance_json(s: &InstanceSnapshot, earlier: Option<Earlier<'_>>) -> Value {
    let mut fields = instance_fields(s, earlier);
    let partitions: Vec<Value> = s.partitions.iter().map(|p| partition_json(p, earlier, s)).collect();
    fields.insert("partitions".into(), Value::Array(partitions));
    Value::Object(fields)
}

/// [`instance_json`] without its partitions.
fn instance_fields(s: &InstanceSnapshot, earlier: Option<Earlier<'_>>) -> Map<String, Value> {
    let then = |find: &dyn Fn(&InstanceSnapshot) -> Option<&ObjectReading>, now: &ObjectReading| {
        earlier.map(|e| find(e.snapshot).map(|t| (t, e.interval(t, now, s))))
    };
    let lps: Vec<Value> = s
        .lps
        .iter()
        .map(|lp| {
            let t = then(&|e| e.lps.iter().find(|l| l.index == lp.index).map(|l| &l.reading), &lp.reading);
            let fields = json!({"index": lp.index, "cpu": lp.cpu});
            with(
                reading_json(&lp.reading, ObjectKind::LogicalProcessor, t),
                with_unmapped(fields, s, ObjectRef::Lp(lp.index)),
            )
        })
        .collect();
    let mut hypervisor =
        reading_json(&s.hypervisor, ObjectKind::Hypervisor, then(&|e| Some(&e.hypervisor), &s.hypervisor));
    if let Some(u) = unmapped_json(s, ObjectRef::Hypervisor) {
        hypervisor.insert("unmapped".into(), u);
    }
    let mut fields = Map::new();
    fields.insert("name".into(), json!(s.name));
    fields.insert("pid".into(), json!(s.pid));
    fields.insert("kind".into(), json!(s.description.kind));
    fields.insert("description".into(), json!(s.description.name));
    fields.insert("hypervisor".into(), Value::Object(hypervisor));
    fields.insert("lps".into(), Value::Array(lps));
    fields
}

/// The document of `instances` (each an [`instance_json`]): `{"schema_version", "instances"}`.
pub fn document(instances: Vec<Value>) -> Value {
    json!({ SCHEMA_KEY: SCHEMA_VERSION, "instances": instances })
}

/// Adds to each partition of `doc` (a [`document`]) whose observer wrote its platform identity
/// ([`crate::live::read_platforms`]) a `platform` object: `{"platform", "identity_source",
/// "labels": {name: value}}`, as `hvstats_vm_info` carries them.
pub fn add_platforms(
    doc: &mut Value,
    platforms: &std::collections::BTreeMap<
        String,
        std::collections::BTreeMap<u64, hvstats_platform::shown::Shown>,
    >,
) {
    let Some(instances) = doc.get_mut("instances").and_then(Value::as_array_mut) else { return };
    for instance in instances {
        let name = instance.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
        let Some(vms) = platforms.get(&name) else { continue };
        let Some(partitions) = instance.get_mut("partitions").and_then(Value::as_array_mut) else { continue };
        for partition in partitions {
            let Some(shown) = partition.get("id").and_then(Value::as_u64).and_then(|id| vms.get(&id)) else {
                continue;
            };
            partition["platform"] = platform_json(shown);
        }
    }
}

/// [`add_platforms`] of the identities the observers among `instances` wrote in the runtime
/// directory `dir`; what could not be read, one line each.
pub fn add_platforms_from(
    doc: &mut Value,
    dir: &std::path::Path,
    instances: &[InstanceSnapshot],
) -> Vec<String> {
    let mut problems = Vec::new();
    add_platforms(doc, &crate::live::read_platforms(dir, instances, &mut problems));
    problems
}

/// A VM's platform identity: `{"platform", "identity_source", "labels": {name: value}}`.
fn platform_json(shown: &hvstats_platform::shown::Shown) -> Value {
    let labels: Map<String, Value> =
        shown.labels.iter().map(|(n, v)| ((*n).to_owned(), Value::from(v.as_str()))).collect();
    json!({"platform": shown.platform, "identity_source": shown.source, "labels": labels})
}

/// The JSON of one instance as `snapshot --json` prints it, for other commands.
pub fn snapshot_json(s: &InstanceSnapshot) -> Value {
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

pub(crate) fn partition_json(
    p: &PartitionSnapshot,
    earlier: Option<Earlier<'_>>,
    s: &InstanceSnapshot,
) -> Value {
    let then = |find: &dyn Fn(&InstanceSnapshot) -> Option<&ObjectReading>, now: &ObjectReading| {
        earlier.map(|e| find(e.snapshot).map(|t| (t, e.interval(t, now, s))))
    };
    let vps: Vec<Value> = p
        .vps
        .iter()
        .map(|vp| {
            let t = then(&|e| earlier_vp(e, p.id, vp.index), &vp.reading);
            let fields = json!({"index": vp.index, "histograms": histograms_json(vp)});
            with(
                reading_json(&vp.reading, ObjectKind::Vp, t),
                with_unmapped(fields, s, ObjectRef::Vp(p.id, vp.index)),
            )
        })
        .collect();
    let t = then(&|e| earlier_partition(e, p.id).map(|e| &e.reading), &p.reading);
    let state = match &p.stopped {
        None if p.active => json!("active"),
        None => json!("stopped"),
        Some(_) => json!("stopped"),
    };
    let (vmm, uuid) = (vmm_json(p), uuid_json(p));
    let fields = json!({"counting_since": counting_since_json(p), "kept_since": kept_since_json(p), "id": p.id, "name": p.name, "uuid": uuid, "vmm": vmm, "hyperv_enlightenments": hyperv_json(p), "sources": sources_json(p), "active": p.active, "state": state, "stopped_reason": p.stopped, "vps": vps});
    with(
        reading_json(&p.reading, ObjectKind::Partition, t),
        with_unmapped(fields, s, ObjectRef::Partition(p.id)),
    )
}

/// Partition `id` in the earlier reading `e`.
pub fn earlier_partition(e: &InstanceSnapshot, id: u64) -> Option<&PartitionSnapshot> {
    e.partitions.iter().find(|p| p.id == id)
}

/// VP `index` of partition `id` in the earlier reading `e`.
pub fn earlier_vp(e: &InstanceSnapshot, id: u64, index: u32) -> Option<&ObjectReading> {
    earlier_partition(e, id)?.vps.iter().find(|v| v.index == index).map(|v| &v.reading)
}

/// A counter's raw value as JSON: a number, or a state's name (`"running"`).
pub fn counter_json(counter: &Counter, raw: u64) -> Value {
    match counter.presentation {
        Presentation::State => json!(VmState::from_code(raw).label()),
        _ => json!(raw),
    }
}

/// One object's counters now, and its reading at the start of the interval with the interval
/// from it (see [`Earlier::interval`]): over an interval whose readings hold the same
/// publication, a rate, share or cost is null, never 0.
pub fn cells<'a>(
    now: &'a ObjectReading,
    then: Option<(&'a ObjectReading, &'a Interval)>,
) -> impl Iterator<Item = (&'static Counter, Option<Value>)> + 'a {
    let kind_counters: Vec<&'static Counter> = match now {
        ObjectReading::Counters(values) => values.iter().map(|(c, _)| *c).collect(),
        ObjectReading::Unreadable { .. } => Vec::new(),
    };
    kind_counters.into_iter().map(move |c| {
        let after = now.get(c.name);
        let value = match (then, after) {
            (_, None) => None,
            (_, Some(v)) if c.presentation == Presentation::State => Some(counter_json(c, v)),
            (None, Some(v)) => Some(json!(v)),
            // A counter no source maintains reads 0 on the page; it has no rate or average.
            (Some(_), Some(_)) if !c.is_maintained_anywhere() => None,
            (Some((then, interval)), Some(after)) => then.get(c.name).and_then(|before| {
                let paired = c.paired_count().and_then(|p| Some((then.get(p.name)?, now.get(p.name)?)));
                present::between(c, before, after, interval, paired).map(|p| json!(p.value))
            }),
        };
        (c, value)
    })
}

/// True when a reading failed for a reason other than permissions (which the user chose).
pub fn unreadable(r: &ObjectReading) -> bool {
    matches!(r, ObjectReading::Unreadable { permission_denied: false, .. })
}

/// True when something of `s` could not be read (see [`unreadable`]).
pub fn has_unreadable(s: &InstanceSnapshot) -> bool {
    unreadable(&s.hypervisor)
        || s.lps.iter().any(|lp| unreadable(&lp.reading))
        || s.partitions.iter().any(partition_unreadable)
}

/// A line for each object of `s` that could not be read, permissions included: "instance NAME
/// partition P VP V: unreadable: REASON", names escaped.
pub fn unreadable_lines(s: &InstanceSnapshot) -> Vec<String> {
    let mut lines: Vec<String> = unreadable_line(&s.name, "hypervisor", &s.hypervisor).into_iter().collect();
    for lp in &s.lps {
        lines.extend(unreadable_line(&s.name, &format!("LP {}", lp.index), &lp.reading));
    }
    for p in &s.partitions {
        lines.extend(partition_unreadable_lines(&s.name, p));
    }
    lines
}

fn partition_unreadable_lines(instance: &str, p: &PartitionSnapshot) -> Vec<String> {
    let mut lines: Vec<String> =
        unreadable_line(instance, &format!("partition {}", p.id), &p.reading).into_iter().collect();
    for vp in &p.vps {
        lines.extend(unreadable_line(instance, &format!("partition {} VP {}", p.id, vp.index), &vp.reading));
    }
    lines
}

fn unreadable_line(instance: &str, what: &str, r: &ObjectReading) -> Option<String> {
    match r {
        ObjectReading::Unreadable { reason, .. } => {
            Some(format!("instance {} {what}: unreadable: {}", Escaped(instance), Escaped(reason)))
        }
        _ => None,
    }
}

/// True when the partition or one of its VPs could not be read.
pub(crate) fn partition_unreadable(p: &PartitionSnapshot) -> bool {
    unreadable(&p.reading) || p.vps.iter().any(|vp| unreadable(&vp.reading))
}

#[cfg(test)]
mod tests {
    use hvstats::unmapped::Unmapped;
    use hvstats_abi::catalog::vp;
    use hvstats_abi::histogram::Log2Histogram;

    use super::*;

    #[test]
    fn the_written_document_is_the_tree_of_every_instance_whatever_they_hold() {
        let mut a = hvstats_testkit::synthetic_instance(3, 2);
        let io = vp::IO_TIME_HISTOGRAM.counter().unwrap();
        let mut h = Log2Histogram::default();
        h.record(1500);
        let halt = vp::HALT_WAIT_HISTOGRAM.counter().unwrap();
        let mut slow = Log2Histogram::default();
        slow.record(3_000_000_000);
        slow.record(7);
        a.partitions[0].vps[1].histograms = vec![(io, h), (halt, slow)];
        a.partitions[1].vps[1].histograms = vec![(halt, Log2Histogram::default())];
        a.partitions[1].vps[0].reading =
            ObjectReading::Unreadable { permission_denied: false, reason: "changed \"under\" us".into() };
        a.partitions[2].active = false;
        a.partitions[2].stopped = Some("VP 0 faulted".into());
        a.partitions[2].name = "db-1".into();
        let mut unmapped = Unmapped::new();
        unmapped.insert(ObjectRef::Vp(1, 1), [("Weird count".to_owned(), 7u64)].into_iter().collect());
        unmapped.insert(ObjectRef::Hypervisor, [("Other".to_owned(), 9u64)].into_iter().collect());
        a.unmapped = Some(unmapped);
        let mut b = hvstats_testkit::synthetic_instance(1, 1);
        b.name = "4243-1-0".into();
        b.partitions[0].reading =
            ObjectReading::Unreadable { permission_denied: true, reason: "denied".into() };
        let instances = [a, b];
        let mut written = Vec::new();
        write_instances(&instances, &mut written).unwrap();
        let tree = document(instances.iter().map(snapshot_json).collect());
        let parsed: Value = serde_json::from_slice(&written).unwrap();
        assert_eq!(parsed, tree);
        assert!(written.ends_with(b"]}\n"));
        let first = &parsed["instances"][0]["partitions"][0];
        assert_eq!(first["vps"][1]["histograms"][io.name]["sum_ns"], 1500, "{first}");
        assert_eq!(parsed["instances"][0]["partitions"][2]["state"], "stopped");
        assert_eq!(parsed["instances"][0]["partitions"][0]["vps"][1]["unmapped"]["Weird count"], 7);
    }

    #[test]
    fn an_interval_shows_an_observed_vms_synthetic_interrupts_and_null_for_our_own_partition() {
        use crate::json_keys::{Held, key};
        // Partition 1 is an observed guest whose kvm_hv sources count synthetic interrupts and
        // flushes; partition 2 is ours, whose page declares what the catalog does not maintain
        // for it unavailable (its reading leaves those out).
        let mut before = hvstats_testkit::synthetic_instance(2, 1);
        let ObjectReading::Counters(own) = &mut before.partitions[1].vps[0].reading else { panic!() };
        own.retain(|(c, _)| c.maintained.is_maintained());
        let mut after = before.clone();
        let ObjectReading::Counters(observed) = &mut after.partitions[0].vps[0].reading else { panic!() };
        for (c, v) in observed.iter_mut() {
            match c.id {
                id if id == vp::SYNTHETIC_INTERRUPTS => *v += 500,
                id if id == vp::LOCAL_FLUSHED_GVA_RANGES => *v += 30,
                _ => {}
            }
        }
        let earlier = || Some(Earlier { snapshot: &before, seconds: 2.0 });
        let synic = key(vp::SYNTHETIC_INTERRUPTS.counter().unwrap(), Held::Presented);
        let ranges = key(vp::LOCAL_FLUSHED_GVA_RANGES.counter().unwrap(), Held::Presented);
        let windows = partition_json(&after.partitions[0], earlier(), &after);
        assert_eq!(windows["vps"][0]["interval"][&synic], 250.0, "{windows}");
        assert_eq!(windows["vps"][0]["interval"][&ranges], 15.0, "{windows}");
        let ours = partition_json(&after.partitions[1], earlier(), &after);
        let interval = &ours["vps"][0]["interval"];
        assert_eq!(interval[&synic], Value::Null, "{ours}");
        assert_eq!(interval[&ranges], Value::Null, "{ours}");
        assert_eq!(
            ours["vps"][0]["counters"][key(vp::SYNTHETIC_INTERRUPTS.counter().unwrap(), Held::Total)],
            Value::Null
        );
        // Our own partition's maintained counters are there all the same (unchanged: 0 per s).
        assert_eq!(interval[key(vp::HYPERCALLS.counter().unwrap(), Held::Presented)], 0.0, "{ours}");
    }
}
