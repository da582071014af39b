//! `hvstats catalog`: the counter catalog as a table or as JSON.
//!
//! Every row comes from `hvstats_abi::CATALOG`; this module only chooses how to show it.

use std::io::{self, Write};
use std::process::ExitCode;

use hvstats_abi::source::observed;
use hvstats_abi::{CATALOG, Counter, Maintained};
use serde_json::{Value, json};

use crate::output;

/// Flags of `hvstats catalog`.
#[derive(clap::Args)]
pub struct Args {
    /// Print a JSON array with one object per counter instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs `hvstats catalog`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.json {
        let rows: Vec<Value> = CATALOG.iter().map(counter_json).collect();
        output::print_json(&rows, true)?;
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
pub fn counter_json(c: &Counter) -> Value {
    json!({
        "object": c.id.kind.short_name(),
        "object_type": c.id.kind.object_type().0,
        "group": c.id.group.name(),
        "group_type": c.id.group.group_type().0,
        "index": c.id.index,
        "offset": c.id.offset(),
        "name": c.name,
        "unit": c.unit.name(),
        "presentation": c.presentation.name(),
        "maintained": maintained_by(c.maintained),
        "maintained_note": c.maintained.note(),
        "observed": observed(c).map(maintained_by),
        "observed_note": observed(c).map(Maintained::note),
        "mshv": hvstats::mshv::names::MAPPINGS.iter().find(|m| m.counter == c.id).map(|m| m.name),
        "description": c.description,
    })
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
                c.description.to_owned(),
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

/// The catalog names of `kind` nearest to `name`, best first, at most `n`: names holding every
/// word of `name` (shortest first), then names spelled alike. For "did you mean" in usage errors.
pub fn nearest_names(kind: hvstats_abi::ObjectKind, name: &str, n: usize) -> Vec<&'static str> {
    let wanted = name.to_lowercase();
    let words: Vec<&str> = wanted.split_whitespace().collect();
    let mut scored: Vec<(u8, usize, &'static str)> = hvstats_abi::catalog::counters_of(kind)
        .filter_map(|c| {
            let lower = c.name.to_lowercase();
            if !words.is_empty() && words.iter().all(|w| lower.contains(w)) {
                return Some((0, c.name.len(), c.name));
            }
            let similarity = strsim::normalized_damerau_levenshtein(&wanted, &lower);
            (similarity >= 0.6).then_some((1, ((1.0 - similarity) * 1000.0) as usize, c.name))
        })
        .collect();
    scored.sort();
    scored.into_iter().take(n).map(|(_, _, name)| name).collect()
}

/// "; did you mean …?" for `name`, or nothing when no catalog name is near it.
pub fn did_you_mean(kind: hvstats_abi::ObjectKind, name: &str) -> String {
    let near = nearest_names(kind, name, 3);
    if near.is_empty() {
        return String::new();
    }
    let quoted: Vec<String> = near.iter().map(|n| format!("{n:?}")).collect();
    format!("; did you mean {}?", quoted.join(" or "))
}
