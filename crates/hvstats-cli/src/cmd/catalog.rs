//! `hvstats catalog`: the counter catalog as a table or as JSON.
//!
//! Every row comes from `hvstats_abi::CATALOG`; this module only chooses how to show it.

use std::io::{self, Write};
use std::process::ExitCode;

use hvstats_abi::catalog::observed;
use hvstats_abi::{CATALOG, Counter, Maintained, Presentation, Unit};
use hvstats_present::json_keys::{self, Held};
use serde_json::{Value, json};

use crate::output;

/// Flags of `hvstats catalog`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// Print JSON instead of a table: `{"schema_version", "counters": [one object per counter]}`,
    /// each with the keys snapshots, reports and top's JSON give it (`json_keys`).
    #[arg(long)]
    json: bool,
}

/// Runs `hvstats catalog`.
pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.json {
        let rows: Vec<Value> = CATALOG.iter().map(counter_json).collect();
        let doc = json!({ json_keys::SCHEMA_KEY: json_keys::SCHEMA_VERSION, "counters": rows });
        output::print_json(&doc, true)?;
    } else {
        output::with_stdout(write_table)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The source that maintains a counter, or `no`.
fn maintained_by(m: Maintained) -> &'static str {
    match m {
        Maintained::By(source, _) => source.name(),
        Maintained::No(_) => "no",
    }
}

/// Whether the observer of other processes' VMs maintains a counter: its source, `no`, or `-` for
/// the hypervisor and LP objects (which an observer's instance keeps as any instance does).
fn observed_by(c: &Counter) -> &'static str {
    observed(c).map_or("-", maintained_by)
}

/// One counter as a JSON object.
pub(crate) fn counter_json(c: &Counter) -> Value {
    json!({
        "object": c.id.kind.short_name(),
        "object_type": c.id.kind.object_type().0,
        "group": c.id.group.name(),
        "group_type": c.id.group.group_type().0,
        "index": c.id.index,
        "offset": c.id.offset(),
        "name": c.name,
        "json_keys": {
            "total": json_keys::key(c, Held::Total),
            "delta": json_keys::key(c, Held::Delta),
            "presented": json_keys::key(c, Held::Presented),
        },
        "unit": c.unit.name(),
        "presentation": c.presentation.name(),
        "maintained": maintained_by(c.maintained),
        "maintained_note": c.maintained.note(),
        "observed": observed(c).map(maintained_by),
        "observed_note": observed(c).map(Maintained::note),
        "mshv": hvstats_mshv::names::MAPPINGS.iter().find(|m| m.counter == c.id).map(|m| m.name),
        "description": description(c),
    })
}

/// The seed's description, and for a time the seed describes as shown (an average, a
/// percentage) what the page holds, so the unit and the text agree.
fn description(c: &Counter) -> String {
    let unit = match c.unit {
        Unit::Time100ns => "100 ns units",
        Unit::Nanoseconds => "nanoseconds",
        _ => return c.description.to_owned(),
    };
    match c.presentation {
        Presentation::Cost => match c.paired_count() {
            Some(count) => format!(
                "{} The page holds the total time in {unit}; over {:?} it is this average.",
                c.description, count.name
            ),
            None => format!("{} The page holds the total time in {unit}.", c.description),
        },
        Presentation::PercentTime if c.description.contains("percentage") => format!(
            "{} The page holds the time in {unit}; over the time elapsed it is this percentage.",
            c.description
        ),
        _ => c.description.to_owned(),
    }
}

/// The catalog as aligned columns, the description last.
fn write_table(out: &mut impl Write) -> io::Result<()> {
    const HEADINGS: [&str; 10] = [
        "OBJECT",
        "GROUP",
        "INDEX",
        "NAME",
        "UNIT",
        "PRESENTATION",
        "MAINTAINED",
        "NOTE",
        "OBSERVED",
        "DESCRIPTION",
    ];
    let rows: Vec<[String; 10]> = CATALOG
        .iter()
        .map(|c| {
            [
                c.id.kind.short_name().to_owned(),
                c.id.group.name().to_owned(),
                c.id.index.to_string(),
                c.name.to_owned(),
                c.unit.name().to_owned(),
                c.presentation.name().to_owned(),
                maintained_by(c.maintained).to_owned(),
                c.maintained.note().to_owned(),
                observed_by(c).to_owned(),
                description(c),
            ]
        })
        .collect();
    let mut widths = HEADINGS.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let headings = HEADINGS.map(str::to_owned);
    for row in std::iter::once(&headings).chain(&rows) {
        let last = row.len() - 1;
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i == last {
                line.push_str(cell);
            } else if i == 2 {
                line.push_str(&format!("{cell:>w$}  "));
            } else {
                line.push_str(&format!("{cell:<w$}  "));
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}
