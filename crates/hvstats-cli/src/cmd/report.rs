//! `hvstats report`: what a recording says per VP — each counter's cumulative value at the VP's
//! last sample (catalog names as keys), its change over the recording, and that change presented
//! as the catalog says: rates per second, % of the time, average cost in ns; per histogram, what
//! it recorded over the recording (count, sum, and p50/p99 as upper bounds of their buckets, from
//! the bucket deltas between the VP's first and last sample); and its CPU wait.
//!
//! Counters KVM does not maintain are `null`, never 0, and so are those a VP's page did not carry
//! (a group of an older minor) and those this build knows that an older recording does not list.
//! A recording made before histograms were recorded (format version 1) says so instead of
//! showing them.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use hvstats::present;
use hvstats_abi::Presentation;
use serde_json::{Map, Value, json};

use crate::cmd::recording::{Header, SampleReader, VpSample};

/// Flags of `hvstats report`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A recording made by `hvstats record`.
    #[arg(value_name = "FILE")]
    file: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// One VP over the recording.
#[derive(Clone, Debug)]
pub struct VpReport {
    /// The VM name.
    pub vm: String,
    /// The VP index.
    pub vp: u32,
    /// Seconds between its first and last sample.
    pub seconds: f64,
    /// Samples it appears in.
    pub samples: usize,
    /// The report as JSON (the same object `--json` prints).
    pub json: Value,
}

/// What `report` keeps of a recording, gathered one sample at a time so that a recording of any
/// length is read in the memory of one sample and two per VP: the header, how many samples over
/// what span, and each VP's first and last readable sample.
pub struct Digest {
    /// The recording's header.
    pub header: Header,
    /// Samples in the recording.
    pub samples: usize,
    /// Seconds between its first and last sample.
    pub span: f64,
    vps: Vec<VpDigest>,
}

/// One VP's first and last readable samples, and how many it has.
struct VpDigest {
    vm: String,
    instance: String,
    partition: u64,
    vp: u32,
    samples: usize,
    first: (f64, VpSample),
    last: (f64, VpSample),
}

impl Digest {
    /// Reads a recording one sample at a time.
    ///
    /// # Errors
    /// As [`SampleReader`].
    pub fn read(input: impl BufRead) -> anyhow::Result<Self> {
        let mut reader = SampleReader::new(input)?;
        let mut vps: Vec<VpDigest> = Vec::new();
        let mut at: HashMap<(String, u32), usize> = HashMap::new();
        let (mut samples, mut first_t, mut last_t) = (0usize, None, 0.0);
        while let Some(sample) = reader.next()? {
            samples += 1;
            first_t.get_or_insert(sample.t);
            last_t = sample.t;
            for p in sample.partitions {
                for vp in p.vps {
                    // A sample whose page could not be read says nothing of the VP's counters.
                    if vp.values.is_none() {
                        continue;
                    }
                    match at.get(&(p.vm.clone(), vp.vp)) {
                        Some(&i) => {
                            vps[i].samples += 1;
                            vps[i].last = (sample.t, vp);
                        }
                        None => {
                            at.insert((p.vm.clone(), vp.vp), vps.len());
                            vps.push(VpDigest {
                                vm: p.vm.clone(),
                                instance: p.instance.clone(),
                                partition: p.partition,
                                vp: vp.vp,
                                samples: 1,
                                first: (sample.t, vp.clone()),
                                last: (sample.t, vp),
                            });
                        }
                    }
                }
            }
        }
        let span = first_t.map_or(0.0, |first| last_t - first);
        Ok(Self { header: reader.header().clone(), samples, span, vps })
    }
}

/// What each histogram recorded between `first` and `last`: count, sum, mean and p50/p99 upper
/// bounds (`null` when either sample lacks it, or it went backwards: not the same histogram).
fn histograms(header: &Header, first: &VpSample, last: &VpSample) -> Value {
    if !header.has_histograms() {
        return Value::Null;
    }
    let classes: Map<String, Value> = header
        .catalog
        .vp_histograms
        .iter()
        .enumerate()
        .map(|(i, info)| {
            let delta = first.histogram(i).zip(last.histogram(i)).and_then(|(a, b)| b.since(&a));
            let v = delta.map_or(Value::Null, |d| {
                json!({
                    "count": d.count(),
                    "sum_ns": d.sum_ns,
                    "mean_ns": d.mean_ns(),
                    "p50_ns": d.quantile_upper_ns(0.5),
                    "p99_ns": d.quantile_upper_ns(0.99),
                })
            });
            (info.name.clone(), v)
        })
        .collect();
    Value::Object(classes)
}

/// Why a report has no histograms, when it has none.
pub fn no_histograms_note(header: &Header) -> Option<String> {
    (!header.has_histograms()).then(|| {
        format!(
            "recording format version {} has no histograms: record again with this hvstats for \
             their distributions",
            header.version
        )
    })
}

/// The per-VP reports of a recording, in order of first appearance.
pub fn reports(digest: &Digest) -> Vec<VpReport> {
    let header = &digest.header;
    let counters = header.vp_counters();
    digest
        .vps
        .iter()
        .filter_map(|d| {
            let (vm, instance, partition, vp) = (d.vm.clone(), d.instance.clone(), d.partition, d.vp);
            let ((first_t, first_vp), (last_t, last_vp)) = (&d.first, &d.last);
            let (first, last) = (first_vp.values.as_ref()?, last_vp.values.as_ref()?);
            let seconds = last_t - first_t;
            let mut cumulative = Map::new();
            let mut deltas = Map::new();
            let mut rates = Map::new();
            let mut percent = Map::new();
            let mut costs = Map::new();
            for (i, (info, counter)) in counters.iter().enumerate() {
                let name = info.name.clone();
                // Not maintained on KVM, or declared unavailable by the publisher: unknown.
                let (Some(before), Some(after)) = (first[i], last[i]) else {
                    cumulative.insert(name, Value::Null);
                    continue;
                };
                if !info.maintained {
                    cumulative.insert(name, Value::Null);
                    continue;
                }
                cumulative.insert(name.clone(), json!(after));
                deltas.insert(name.clone(), json!(after.checked_sub(before)));
                let Some(counter) = counter else { continue };
                let paired = counter.paired_count().and_then(|p| {
                    let j = counters.iter().position(|(c, _)| c.name == p.name)?;
                    Some((first[j]?, last[j]?))
                });
                let shown = present::over_interval(counter, before, after, seconds, paired).map(|p| p.value);
                match counter.presentation {
                    Presentation::Rate => rates.insert(name, json!(shown)),
                    Presentation::PercentTime => percent.insert(name, json!(shown)),
                    Presentation::Cost => costs.insert(name, json!(shown)),
                    Presentation::CumulativeTime | Presentation::Instant | Presentation::Histogram => None,
                };
            }
            // A counter this build knows that the recording does not list (one made by an older
            // hvstats, before the counter was appended) is unknown too.
            for c in hvstats_abi::catalog::counters_of(hvstats_abi::ObjectKind::Vp) {
                cumulative.entry(c.name).or_insert(Value::Null);
            }
            // CPU wait: per dispatch (the catalog's cost) and as a share of the recording's time.
            let wait = hvstats_abi::catalog::vp::CPU_WAIT_TIME_PER_DISPATCH.counter().map(|c| c.name);
            let wait_delta = wait.and_then(|n| deltas.get(n)).and_then(Value::as_u64);
            let dispatches = hvstats_abi::catalog::vp::DISPATCHES.counter().map(|c| c.name);
            let cpu_wait = json!({
                "wait_ns": wait_delta,
                "dispatches": dispatches.and_then(|n| deltas.get(n)).and_then(Value::as_u64),
                "per_dispatch_ns": wait.and_then(|n| costs.get(n)).cloned().unwrap_or(Value::Null),
                "percent_of_time": wait_delta
                    .filter(|_| seconds > 0.0)
                    .map(|w| w as f64 / (seconds * 1e9) * 100.0),
            });
            let json = json!({
                "vm": vm,
                "instance": instance,
                "partition": partition,
                "vp": vp,
                "samples": d.samples,
                "first_t": first_t,
                "last_t": last_t,
                "seconds": seconds,
                "cumulative": cumulative,
                "deltas": deltas,
                "rates_per_second": rates,
                "percent_of_time": percent,
                "average_cost_ns": costs,
                "cpu_wait": cpu_wait,
                "histograms": histograms(header, first_vp, last_vp),
            });
            Some(VpReport { vm, vp, seconds, samples: d.samples, json })
        })
        .collect()
}

fn text(digest: &Digest, reports: &[VpReport]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "{} samples over {:.2} s, {} VPs", digest.samples, digest.span, reports.len());
    if let Some(note) = no_histograms_note(&digest.header) {
        let _ = writeln!(out, "note: {note}");
    }
    for r in reports {
        let _ = writeln!(out, "\n{} VP {} ({} samples over {:.2} s)", r.vm, r.vp, r.samples, r.seconds);
        let _ = writeln!(
            out,
            "  {:<40} {:>20} {:>16} {:>16}",
            "counter", "cumulative", "delta", "over recording"
        );
        // Page order, as the header lists the counters.
        for info in &digest.header.catalog.vp {
            let name = &info.name;
            // A histogram's one value is its sum; the histogram section below gives all of it.
            if digest.header.catalog.vp_histograms.iter().any(|h| h.name == *name) {
                continue;
            }
            let Some(v) = r.json["cumulative"][name].as_u64() else { continue };
            if v == 0 {
                continue;
            }
            let delta = r.json["deltas"][name].as_u64().map_or("-".into(), |d| d.to_string());
            let shown = [("rates_per_second", "/s"), ("percent_of_time", "%"), ("average_cost_ns", " ns")]
                .iter()
                .find_map(|(k, unit)| Some(format!("{:.1}{unit}", r.json[k][name].as_f64()?)))
                .unwrap_or_default();
            let _ = writeln!(out, "  {name:<40} {v:>20} {delta:>16} {shown:>16}");
        }
        let wait = &r.json["cpu_wait"];
        if let (Some(per), Some(percent)) =
            (wait["per_dispatch_ns"].as_f64(), wait["percent_of_time"].as_f64())
        {
            let _ = writeln!(out, "  CPU wait: {per:.0} ns per dispatch, {percent:.3} % of the time");
        }
        let Some(histograms) = r.json["histograms"].as_object() else { continue };
        let busy: Vec<_> =
            histograms.iter().filter(|(_, h)| h["count"].as_u64().is_some_and(|c| c > 0)).collect();
        if busy.is_empty() {
            continue;
        }
        let _ = writeln!(out, "  {:<40} {:>20} {:>16} {:>16}", "histogram", "count", "p50 ≤ ns", "p99 ≤ ns");
        for (name, h) in busy {
            let q = |k: &str| h[k].as_u64().map_or("-".into(), |v| v.to_string());
            let _ = writeln!(out, "  {name:<40} {:>20} {:>16} {:>16}", q("count"), q("p50_ns"), q("p99_ns"));
        }
    }
    out
}

/// Runs `hvstats report`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let file = File::open(&args.file).with_context(|| format!("cannot open {}", args.file.display()))?;
    let metadata = file.metadata()?;
    anyhow::ensure!(metadata.is_file(), "{} is not a regular file", args.file.display());
    let digest =
        Digest::read(BufReader::new(file)).with_context(|| format!("reading {}", args.file.display()))?;
    let reports = reports(&digest);
    // What a sample costs on disk (the header spread over the samples), so a recording's growth
    // can be checked.
    let bytes_per_sample = (digest.samples > 0).then(|| metadata.len() / digest.samples as u64);
    // Through the shared output path: a closed pipe ends quietly, a full device is an error.
    if args.json {
        let vps: Vec<&Value> = reports.iter().map(|r| &r.json).collect();
        let doc = json!({
            "format_version": digest.header.version,
            "note": no_histograms_note(&digest.header),
            "bytes_per_sample": bytes_per_sample,
            "samples": digest.samples,
            "interval_seconds": digest.header.interval_seconds,
            "catalog": { "hvstats": digest.header.catalog.hvstats, "groups": digest.header.catalog.groups },
            "vps": vps,
        });
        crate::output::print_json(&doc, true)?;
    } else {
        crate::output::print(&text(&digest, &reports))?;
    }
    Ok(ExitCode::SUCCESS)
}
