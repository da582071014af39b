//! `hvstats dump`: decodes a 4 KiB TLFS stats page from a file.
//!
//! The page is read with `hvstats_abi::page::PageView`, as the kind given by `--type` or, without
//! it, as the kind `infer_kind` recognises from its groups. A page that does not read is reported
//! with the byte offset and reason of the fault, and the command fails. A group of an older minor
//! (an older hypervisor's page) is read for the counters it carries; those a later minor appended
//! are listed as absent (`-`, `null` in JSON).

use std::fmt::Write as _;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use hvstats_abi::catalog::counters_of;
use hvstats_abi::group::PAGE_SIZE;
use hvstats_abi::histogram::Log2Histogram;
use hvstats_abi::page::{GroupWalk, ListEnd, PageError, PageView, RawGroup, StatsPage, infer_kind};
use hvstats_abi::{GroupKind, ObjectKind, Presentation};
use hvstats_present::json_keys::{self, Held};
use serde_json::{Map, Value, json};

use crate::input;
use crate::output::{self, note};

/// Flags of `hvstats dump`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// The page file: exactly 4096 bytes, as published by hvstats or saved from a partition.
    file: PathBuf,
    /// Read the page as this object's page instead of inferring the type from its groups.
    #[arg(long = "type", value_name = "TYPE", value_parser = kind_parser())]
    kind: Option<ObjectKind>,
    /// Print JSON: {"type", "inferred", "groups", "counters", "unknown_groups", "end"}.
    #[arg(long)]
    json: bool,
    /// Instead of reading FILE, create it holding a sample page of --type (default vp) in which
    /// every counter's value is its own byte offset.
    #[arg(long)]
    write_sample: bool,
}

/// Parses `hypervisor`, `lp`, `partition` or `vp`, listing them in `--help`.
fn kind_parser() -> impl TypedValueParser<Value = ObjectKind> {
    PossibleValuesParser::new(ObjectKind::ALL.map(ObjectKind::short_name)).try_map(|name| {
        ObjectKind::from_short_name(&name).ok_or_else(|| format!("unknown object type {name:?}"))
    })
}

/// Runs `hvstats dump`.
pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.write_sample {
        let kind = args.kind.unwrap_or(ObjectKind::Vp);
        write_sample(&args.file, kind)?;
        note!("wrote a sample {} page to {}", kind.short_name(), args.file.display());
        return Ok(ExitCode::SUCCESS);
    }
    let bytes = input::read_prefix(&args.file, PAGE_SIZE as u64)?;
    if bytes.len() != PAGE_SIZE {
        let size = fs::metadata(&args.file).map_or(bytes.len() as u64, |m| m.len());
        bail!(
            "{} is not a stats page: it has {size} bytes, a page has exactly {PAGE_SIZE}",
            args.file.display(),
        );
    }
    let file = args.file.display();
    let (view, inferred) = match args.kind {
        Some(kind) => {
            (PageView::read(&bytes, kind).map_err(|e| malformed(&file, kind.short_name(), e))?, false)
        }
        None => match infer_kind(&bytes) {
            Some(kind) => {
                (PageView::read(&bytes, kind).map_err(|e| malformed(&file, kind.short_name(), e))?, true)
            }
            None => return Err(not_inferred(&file, &bytes)),
        },
    };
    if args.json {
        output::print_json(&page_json(&view, inferred), true)?;
    } else {
        output::print(&page_text(&view, inferred))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Creates `path` holding a `kind` page in which every counter holds its own byte offset.
fn write_sample(path: &Path, kind: ObjectKind) -> anyhow::Result<()> {
    let mut page = StatsPage::new(kind);
    for c in counters_of(kind) {
        page.set(c.id, c.id.offset() as u64);
    }
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    let bytes: Vec<u8> = page.data.iter().flat_map(|v| v.to_le_bytes()).collect();
    file.write_all(&bytes).with_context(|| format!("cannot write {}", path.display()))
}

/// The error for a page that does not read: where, and why.
fn malformed(file: &impl std::fmt::Display, kind: &str, e: PageError) -> anyhow::Error {
    let what = if kind.is_empty() { "page".to_owned() } else { format!("{kind} page") };
    match e.offset() {
        Some(offset) => anyhow::anyhow!("{file}: malformed {what} at byte {offset}: {e}"),
        None => anyhow::anyhow!("{file}: malformed {what}: {e}"),
    }
}

/// The error for a page no kind reads: its framing fault if it has one, otherwise why each kind
/// refuses it.
fn not_inferred(file: &impl std::fmt::Display, bytes: &[u8]) -> anyhow::Error {
    if let Ok(walk) = GroupWalk::new(bytes) {
        for group in walk {
            if let Err(e) = group {
                return malformed(file, "", e);
            }
        }
    }
    let mut why = String::new();
    for kind in ObjectKind::ALL {
        if let Err(e) = PageView::read(bytes, kind) {
            let at = e.offset().map(|o| format!(" at byte {o}")).unwrap_or_default();
            let _ = write!(why, "\n  as {}{at}: {e}", kind.short_name());
        }
    }
    anyhow::anyhow!("{file}: malformed page: no object type reads it (use --type to choose one){why}")
}

/// The short name of a group type: `architectural`, `release`, or the type's own name.
fn group_name(group: &RawGroup<'_>) -> String {
    match GroupKind::from_group_type(group.header.group_type) {
        Some(kind) => kind.name().to_owned(),
        None => group.header.group_type.name().map_or_else(|| "unknown".to_owned(), str::to_owned),
    }
}

/// The page as JSON.
fn page_json(view: &PageView<'_>, inferred: bool) -> Value {
    let groups: Vec<Value> = GroupKind::ALL
        .into_iter()
        .filter_map(|gk| view.group(gk).map(|g| (gk, g)))
        .map(|(gk, g)| {
            json!({
                "group": gk.name(),
                "type": g.header.group_type.0,
                "offset": g.offset,
                "version": g.header.version().to_string(),
                "major": g.header.major,
                "minor": g.header.minor,
                "length": g.header.length,
                "counters": g.len(),
                "extra_counters": view.extra_counters(gk),
                "absent_counters": view.absent_counters(gk),
            })
        })
        .collect();
    let counters: Map<String, Value> =
        counters_of(view.kind).map(|c| (json_keys::key(c, Held::Total), json!(view.value(c.id)))).collect();
    let histograms: Map<String, Value> = counters_of(view.kind)
        .filter(|c| c.presentation == Presentation::Histogram)
        .filter_map(|c| Some((c.name.to_owned(), histogram_json(&view.histogram(c.id)?))))
        .collect();
    let unknown: Vec<Value> = view
        .unknown_groups()
        .map(|g| {
            json!({
                "offset": g.offset,
                "type": g.header.group_type.0,
                "name": group_name(&g),
                "version": g.header.version().to_string(),
                "major": g.header.major,
                "minor": g.header.minor,
                "length": g.header.length,
            })
        })
        .collect();
    let (end, end_offset) = match view.end {
        ListEnd::EndOfList(o) => ("END_OF_LIST", o),
        ListEnd::EndOfPage(o) => ("END_OF_PAGE", o),
    };
    json!({
        json_keys::SCHEMA_KEY: json_keys::SCHEMA_VERSION,
        "type": view.kind.short_name(),
        "inferred": inferred,
        "groups": groups,
        "counters": counters,
        "histograms": histograms,
        "unknown_groups": unknown,
        "end": { "header": end, "offset": end_offset },
    })
}

/// A histogram as JSON: its sum, count, quantile bounds and buckets (bucket `i` counts times in
/// `[2^(i-1), 2^i)` ns, bucket 0 zero times, the last bucket everything longer).
fn histogram_json(h: &Log2Histogram) -> Value {
    json!({
        "sum_ns": h.sum_ns,
        "count": h.count(),
        "p50_ns_at_most": h.quantile_upper_ns(0.5),
        "p99_ns_at_most": h.quantile_upper_ns(0.99),
        "buckets": h.buckets.to_vec(),
    })
}

/// A histogram in one line: how many times, and the bounds of its median and 99th percentile.
fn histogram_text(h: &Log2Histogram) -> String {
    match (h.quantile_upper_ns(0.5), h.quantile_upper_ns(0.99)) {
        (Some(p50), Some(p99)) => format!("{} times, p50 <= {p50} ns, p99 <= {p99} ns", h.count()),
        _ => "no times recorded".to_owned(),
    }
}

/// The page as text: what it is, its groups, every counter by name, and the groups skipped.
fn page_text(view: &PageView<'_>, inferred: bool) -> String {
    let mut s = String::new();
    let how = if inferred { " (inferred from its groups; --type chooses)" } else { "" };
    let _ = writeln!(s, "type: {}{how}", view.kind.short_name());
    for gk in GroupKind::ALL {
        let Some(g) = view.group(gk) else { continue };
        let extra = match (view.extra_counters(gk), view.absent_counters(gk)) {
            (0, 0) => String::new(),
            (n, 0) => format!(", {n} more from a newer minor"),
            (_, n) => format!(", {n} of a later minor absent"),
        };
        let _ = writeln!(
            s,
            "group {} (type {}) version {} at byte {}: {} counter{}{extra}",
            gk.name(),
            g.header.group_type.0,
            g.header.version(),
            g.offset,
            g.len(),
            if g.len() == 1 { "" } else { "s" },
        );
    }
    let _ = match view.end {
        ListEnd::EndOfList(o) => writeln!(s, "END_OF_LIST at byte {o}"),
        ListEnd::EndOfPage(o) => writeln!(s, "END_OF_PAGE at byte {o} (the list goes on in another page)"),
    };
    let width = counters_of(view.kind).map(|c| c.name.chars().count()).max().unwrap_or(0);
    let _ = writeln!(s);
    // Bookkeeping (the sequence counter of consistent reads) is no measurement: --json keeps it.
    for c in counters_of(view.kind).filter(|c| !c.is_bookkeeping()) {
        let value = view.value(c.id).map_or_else(|| "-".to_owned(), |v| v.to_string());
        let _ = writeln!(s, "{:<width$}  {value:>20}  {}", c.name, c.unit.name());
        if let Some(h) = view.histogram(c.id).filter(|_| c.presentation == Presentation::Histogram) {
            let _ = writeln!(s, "  {}", histogram_text(&h));
        }
    }
    let unknown: Vec<RawGroup<'_>> = view.unknown_groups().collect();
    if !unknown.is_empty() {
        let _ = writeln!(s, "\nunknown groups (skipped):");
        for g in unknown {
            let _ = writeln!(
                s,
                "  byte {}: type {} ({}) version {}, length {}",
                g.offset,
                g.header.group_type.0,
                group_name(&g),
                g.header.version(),
                g.header.length
            );
        }
    }
    s
}
