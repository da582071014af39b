//! `hvstats snapshot`: the counters of every live instance on this host, read from another
//! process by mapping the published pages (no request to the instances).

use std::path::PathBuf;
use std::process::ExitCode;

use hvstats::attach::{self, RootReader};
use hvstats::snapshot::{self, InstanceSnapshot, ObjectReading};
use hvstats_abi::ObjectKind;
use hvstats_abi::catalog::counters_of;
use serde_json::{Map, Value, json};

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
}

/// Runs `hvstats snapshot`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let dir = args.runtime_dir.unwrap_or_else(hvstats::runtime_dir::runtime_dir);
    let found = attach::discover(&dir)?;
    for removed in &found.removed_dead {
        eprintln!("hvstats: removed the instance of a dead process: {}", removed.display());
    }
    for problem in &found.problems {
        eprintln!("hvstats: {}", hvstats::snapshot::error_chain(problem));
    }
    let snapshots: Vec<InstanceSnapshot> =
        found.instances.into_iter().map(|i| snapshot::take(&mut RootReader::new(i))).collect();
    if args.json {
        let instances: Vec<Value> = snapshots.iter().map(instance_json).collect();
        println!("{}", serde_json::to_string_pretty(&json!({ "instances": instances }))?);
    } else if snapshots.is_empty() {
        println!("no live hvstats instance under {}", dir.display());
    } else {
        for s in &snapshots {
            print!("{}", instance_table(s));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `{"counters": {name: value}}`, or `{"unreadable": reason, "permission_denied": bool}`.
fn reading_json(reading: &ObjectReading) -> Map<String, Value> {
    let mut object = Map::new();
    match reading {
        ObjectReading::Counters(values) => {
            let counters = values.iter().map(|(c, v)| (c.name.to_owned(), json!(v))).collect::<Map<_, _>>();
            object.insert("counters".into(), Value::Object(counters));
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

fn instance_json(s: &InstanceSnapshot) -> Value {
    let lps: Vec<Value> = s
        .lps
        .iter()
        .map(|lp| with(reading_json(&lp.reading), json!({"index": lp.index, "cpu": lp.cpu})))
        .collect();
    let partitions: Vec<Value> = s
        .partitions
        .iter()
        .map(|p| {
            let vps: Vec<Value> =
                p.vps.iter().map(|vp| with(reading_json(&vp.reading), json!({"index": vp.index}))).collect();
            with(reading_json(&p.reading), json!({"id": p.id, "active": p.active, "vps": vps}))
        })
        .collect();
    json!({
        "name": s.name,
        "pid": s.pid,
        "hypervisor": Value::Object(reading_json(&s.hypervisor)),
        "lps": lps,
        "partitions": partitions,
    })
}

/// One table per object kind: a row per counter, a column per object.
fn kind_table(kind: ObjectKind, columns: &[(String, &ObjectReading)]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    if columns.is_empty() {
        return out;
    }
    let _ = writeln!(out, "  {}", kind.title());
    let name_width = counters_of(kind).map(|c| c.name.len()).max().unwrap_or(0);
    let widths: Vec<usize> = columns.iter().map(|(label, _)| label.len().max(12)).collect();
    let _ = write!(out, "    {:name_width$}", "");
    for ((label, _), w) in columns.iter().zip(&widths) {
        let _ = write!(out, "  {label:>w$}");
    }
    out.push('\n');
    for (label, reading) in columns {
        if let ObjectReading::Unreadable { reason, .. } = reading {
            let _ = writeln!(out, "    {label}: unreadable ({reason})");
        }
    }
    if columns.iter().all(|(_, r)| matches!(r, ObjectReading::Unreadable { .. })) {
        return out;
    }
    for counter in counters_of(kind) {
        let _ = write!(out, "    {:name_width$}", counter.name);
        for ((_, reading), w) in columns.iter().zip(&widths) {
            match reading.get(counter.name) {
                Some(v) => {
                    let _ = write!(out, "  {v:>w$}");
                }
                None => {
                    let _ = write!(out, "  {:>w$}", "-");
                }
            }
        }
        out.push('\n');
    }
    out
}

fn instance_table(s: &InstanceSnapshot) -> String {
    let mut out = format!("instance {} (pid {})\n", s.name, s.pid);
    out += &kind_table(ObjectKind::Hypervisor, &[("hypervisor".into(), &s.hypervisor)]);
    let lps: Vec<_> =
        s.lps.iter().map(|lp| (format!("LP {} (cpu {})", lp.index, lp.cpu), &lp.reading)).collect();
    out += &kind_table(ObjectKind::LogicalProcessor, &lps);
    let parts: Vec<_> = s
        .partitions
        .iter()
        .map(|p| (format!("partition {}{}", p.id, if p.active { "" } else { " (inactive)" }), &p.reading))
        .collect();
    out += &kind_table(ObjectKind::Partition, &parts);
    let vps: Vec<_> = s
        .partitions
        .iter()
        .flat_map(|p| p.vps.iter().map(move |vp| (format!("p{} VP {}", p.id, vp.index), &vp.reading)))
        .collect();
    out += &kind_table(ObjectKind::Vp, &vps);
    out.push('\n');
    out
}
