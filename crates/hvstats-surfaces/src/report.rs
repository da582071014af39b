//! What `hvstats report` says of a recording, per VP — each counter's cumulative value at the VP's
//! last sample (keyed by what they hold: `hvstats_present::json_keys`), its change over the recording, and that change presented
//! as the catalog says: rates per second, % of the time, average cost in ns; per histogram, what
//! it recorded over the recording (count, sum, and p50/p99 as upper bounds of their buckets, from
//! the bucket deltas between the VP's first and last sample); and its CPU wait.
//!
//! Counters KVM does not maintain are `null`, never 0, and so are those a VP's page did not carry
//! (a group of an older minor) and those this build knows that an older recording does not list.
//! A recording made before histograms were recorded (format version 1) says so instead of
//! showing them.

use std::collections::{HashMap, HashSet};
use std::io::BufRead;

use hvstats_abi::{Counter, Presentation, Unit};
use hvstats_present::json_keys::{self, Held};
use hvstats_present::present::{self, Interval, human_ns};
use serde_json::{Map, Value, json};

use hvstats_present::text::Escaped;

use crate::recording::{CounterInfo, Header, RecordingError, SampleReader, VpKey, VpSample};

/// One VP over the recording.
#[derive(Clone, Debug)]
struct VpReport {
    /// The VM's name (`instance:partition`) in the VP's first readable sample.
    pub vm: String,
    /// The publishing instance's name (`<pid>-<start>-<n>`).
    pub instance: String,
    /// The partition id within that instance.
    pub partition: u64,
    /// The VP index within that partition.
    pub vp: u32,
    /// Seconds between its first and last readable samples (what its rates are over).
    pub seconds: f64,
    /// Samples in which its page was readable (the others say nothing of its counters).
    pub samples: usize,
    /// The report as JSON (the same object `--json` prints).
    pub json: Value,
}

/// What `report` keeps of a recording, gathered one VP at a time so that a recording of any
/// length and width is read in the memory of one line and two compact readings per VP: the
/// header, how many samples over what span, and each VP's first and last readable values.
pub struct Digest {
    /// The recording's header (line 1), as read and checked.
    header: Header,
    /// Samples in the recording.
    pub samples: usize,
    /// Seconds between its first and last sample.
    span: f64,
    /// The `t` of its last whole sample (`None`: no sample).
    last_t: Option<f64>,
    /// Its last line's number and bytes when the writer stopped in its middle.
    cut: Option<(usize, usize)>,
    vps: Vec<VpDigest>,
}

/// A VP's values and histograms at one sample, packed: each number as a LEB128 varint (most are
/// small), so a VP costs its report tens of bytes a reading, not the 16 of an `Option<u64>` per
/// counter.
#[derive(Clone)]
struct Reading {
    t: f64,
    /// [`VpSample::run_loop_live`].
    run_loop_live: bool,
    packed: Box<[u8]>,
}

/// Appends `v` as a LEB128 varint.
fn put(out: &mut Vec<u8>, mut v: u128) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Reads a LEB128 varint at `*at`.
fn take(bytes: &[u8], at: &mut usize) -> Option<u128> {
    let mut v = 0u128;
    for shift in (0..128).step_by(7) {
        let byte = *bytes.get(*at)?;
        *at += 1;
        v |= u128::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// An absent value packs as 0, a value `v` as `v + 1`.
fn put_option(out: &mut Vec<u8>, v: Option<u64>) {
    put(out, v.map_or(0, |v| u128::from(v) + 1));
}

fn take_option(bytes: &[u8], at: &mut usize) -> Option<Option<u64>> {
    Some(match take(bytes, at)? {
        0 => None,
        v => Some(u64::try_from(v - 1).ok()?),
    })
}

impl Reading {
    /// Packs `vp` (`None` when its page could not be read).
    fn of(t: f64, vp: VpSample) -> Option<Self> {
        let run_loop_live = vp.run_loop_live;
        let values = vp.values?;
        let mut out = Vec::with_capacity(values.len() * 2 + 16);
        put(&mut out, values.len() as u128);
        values.iter().for_each(|&v| put_option(&mut out, v));
        match &vp.histograms {
            None => put(&mut out, 0),
            Some(h) => {
                put(&mut out, h.len() as u128 + 1);
                for slots in h {
                    match slots {
                        None => put(&mut out, 0),
                        Some(slots) => {
                            put(&mut out, slots.len() as u128 + 1);
                            slots.iter().for_each(|&s| put(&mut out, u128::from(s)));
                        }
                    }
                }
            }
        }
        Some(Self { t, run_loop_live, packed: out.into_boxed_slice() })
    }

    /// The reading as the recording had it.
    fn unpack(&self) -> VpSample {
        let b = &self.packed;
        let mut at = 0;
        let mut values = Vec::new();
        let mut histograms = None;
        let _ = (|| -> Option<()> {
            let n = take(b, &mut at)?;
            for _ in 0..n {
                values.push(take_option(b, &mut at)?);
            }
            let h = take(b, &mut at)?;
            if h > 0 {
                let mut all = Vec::new();
                for _ in 0..h - 1 {
                    let len = take(b, &mut at)?;
                    if len == 0 {
                        all.push(None);
                        continue;
                    }
                    let slots: Option<Vec<u64>> =
                        (0..len - 1).map(|_| u64::try_from(take(b, &mut at)?).ok()).collect();
                    all.push(Some(slots?));
                }
                histograms = Some(all);
            }
            Some(())
        })();
        VpSample {
            vp: 0,
            values: Some(values),
            unreadable: None,
            histograms,
            run_loop_live: self.run_loop_live,
        }
    }
}

/// One VP's first and last readable samples, and how many it has.
struct VpDigest {
    vm: String,
    key: VpKey,
    samples: usize,
    first: Reading,
    last: Reading,
}

impl Digest {
    /// Reads a recording one VP at a time.
    ///
    /// # Errors
    /// As [`SampleReader`].
    pub fn read(input: impl BufRead) -> Result<Self, RecordingError> {
        let mut reader = SampleReader::new(input)?;
        let mut vps: Vec<VpDigest> = Vec::new();
        let mut at: HashMap<VpKey, usize> = HashMap::new();
        let (mut samples, mut first_t, mut last_t) = (0usize, None, 0.0);
        while let Some(t) = reader.next_with(|v| {
            let key = v.key();
            let vm = v.vm;
            // A sample whose page could not be read says nothing of the VP's counters.
            let Some(reading) = Reading::of(v.t, v.vp) else { return };
            match at.get(&key) {
                Some(&i) => {
                    vps[i].samples += 1;
                    vps[i].last = reading;
                }
                None => {
                    at.insert(key.clone(), vps.len());
                    vps.push(VpDigest {
                        vm: vm.to_owned(),
                        key,
                        samples: 1,
                        first: reading.clone(),
                        last: reading,
                    });
                }
            }
        })? {
            samples += 1;
            first_t.get_or_insert(t);
            last_t = t;
        }
        let span = first_t.map_or(0.0, |first| last_t - first);
        let last_t = first_t.map(|_| last_t);
        Ok(Self { header: reader.header().clone(), samples, span, last_t, cut: reader.cut_short(), vps })
    }

    /// VPs in the recording with a readable sample.
    pub fn vp_count(&self) -> usize {
        self.vps.len()
    }
}

/// A reading's values by position (`None` past the end or where absent).
struct Values<'a>(Option<&'a [Option<u64>]>);

impl Values<'_> {
    fn get(&self, i: usize) -> Option<u64> {
        *self.0?.get(i)?
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
fn no_histograms_note(header: &Header) -> Option<String> {
    (!header.has_histograms()).then(|| {
        format!(
            "recording format version {} has no histograms: record again with this hvstats for \
             their distributions",
            header.version
        )
    })
}

/// The JSON key of a recorded counter when it holds `held`: the catalog's ([`json_keys`]), or
/// the recording's name for a counter this build does not know.
fn json_key(info: &CounterInfo, counter: Option<&'static Counter>, held: Held) -> String {
    counter.map_or_else(|| info.name.clone(), |c| json_keys::key(c, held))
}

/// The per-VP reports of a recording, in order of first appearance.
fn reports(digest: &Digest) -> impl Iterator<Item = VpReport> + '_ {
    let header = &digest.header;
    let counters = header.vp_counters();
    // Where each counter's paired count is, found once.
    let paired_at = header.vp_paired_at();
    let published_at = header.vp_published_at();
    digest.vps.iter().map(move |d| vp_report(header, &counters, &paired_at, published_at, d))
}

/// One VP's report: its counters between its first and last readable samples.
fn vp_report(
    header: &Header,
    counters: &[(&CounterInfo, Option<&'static Counter>)],
    paired_at: &[Option<usize>],
    published_at: Option<usize>,
    d: &VpDigest,
) -> VpReport {
    let (vm, instance, partition, vp) = (d.vm.clone(), d.key.instance.to_string(), d.key.partition, d.key.vp);
    let (first_t, last_t) = (d.first.t, d.last.t);
    let (first_vp, last_vp) = (d.first.unpack(), d.last.unpack());
    let (first, last) = (Values(first_vp.values.as_deref()), Values(last_vp.values.as_deref()));
    let seconds = last_t - first_t;
    // Rates over the time between the refreshes the first and last samples hold.
    let interval = last_vp.interval_since(&first_vp, seconds, published_at);
    let maps = CounterMaps::between(counters, paired_at, (&first, &last), &interval);
    let cpu_wait = maps.cpu_wait(&interval);
    let json = json!({
        "vm": vm,
        "instance": instance,
        "partition": partition,
        "vp": vp,
        "samples": d.samples,
        "first_t": first_t,
        "last_t": last_t,
        "seconds": seconds,
        "publication": hvstats_present::snapshot_json::publication_json(&interval),
        "cumulative": maps.cumulative,
        "deltas": maps.deltas,
        "rates_per_second": maps.rates,
        "percent_of_time": maps.percent,
        "average_cost_ns": maps.costs,
        "cpu_wait": cpu_wait,
        "histograms": histograms(header, &first_vp, &last_vp),
    });
    VpReport { vm, instance, partition, vp, seconds, samples: d.samples, json }
}

/// A VP's counters over the recording, by JSON key: each map one object of its report.
struct CounterMaps {
    cumulative: Map<String, Value>,
    deltas: Map<String, Value>,
    rates: Map<String, Value>,
    percent: Map<String, Value>,
    costs: Map<String, Value>,
}

impl CounterMaps {
    /// The values of `counters` (with their paired counts at `paired_at`) between the `first`
    /// and `last` samples, `interval` apart.
    fn between(
        counters: &[(&CounterInfo, Option<&'static Counter>)],
        paired_at: &[Option<usize>],
        (first, last): (&Values<'_>, &Values<'_>),
        interval: &Interval,
    ) -> Self {
        let mut maps = Self {
            cumulative: Map::new(),
            deltas: Map::new(),
            rates: Map::new(),
            percent: Map::new(),
            costs: Map::new(),
        };
        for (i, (info, counter)) in counters.iter().enumerate() {
            let total = json_key(info, *counter, Held::Total);
            // Not maintained on KVM, or declared unavailable by the publisher: unknown.
            let (Some(before), Some(after), true) = (first.get(i), last.get(i), info.maintained) else {
                maps.cumulative.insert(total, Value::Null);
                continue;
            };
            maps.cumulative.insert(total, json!(after));
            maps.deltas.insert(json_key(info, *counter, Held::Delta), json!(after.checked_sub(before)));
            let Some(counter) = counter else { continue };
            let name = json_keys::key(counter, Held::Presented);
            let paired = paired_at[i].and_then(|j| Some((first.get(j)?, last.get(j)?)));
            let shown = present::between(counter, before, after, interval, paired).map(|p| p.value);
            match present::shown_as(counter) {
                Presentation::Rate => maps.rates.insert(name, json!(shown)),
                Presentation::PercentTime => maps.percent.insert(name, json!(shown)),
                Presentation::Cost => maps.costs.insert(name, json!(shown)),
                Presentation::CumulativeTime
                | Presentation::Instant
                | Presentation::Histogram
                | Presentation::State => None,
            };
        }
        // A counter this build knows that the recording does not list (one made by an older
        // hvstats, before the counter was appended) is unknown too.
        for c in hvstats_abi::catalog::counters_of(hvstats_abi::ObjectKind::Vp) {
            maps.cumulative.entry(json_keys::key(c, Held::Total)).or_insert(Value::Null);
        }
        maps
    }

    /// CPU wait: per dispatch (the catalog's cost), as a share of the recording's time, and as a
    /// share of the VP's runnable time (run + wait), the share the mixin's CPU-wait rule and alert
    /// read (packaging/prometheus/hvstats.rules.yml, vm:hvstats_cpu_wait:ratio1m).
    fn cpu_wait(&self, interval: &Interval) -> Value {
        use hvstats_abi::catalog::vp;
        let delta_of = |id: hvstats_abi::CounterId| {
            id.counter()
                .and_then(|c| self.deltas.get(&json_keys::key(c, Held::Delta)))
                .and_then(Value::as_u64)
        };
        let wait = vp::CPU_WAIT_TIME_PER_DISPATCH.counter();
        let wait_delta = delta_of(vp::CPU_WAIT_TIME_PER_DISPATCH);
        let run_ns = delta_of(vp::TOTAL_RUN_TIME).map(|d| d.saturating_mul(100));
        let per_dispatch = wait.and_then(|c| self.costs.get(&json_keys::key(c, Held::Presented)));
        json!({
            "wait_ns": wait_delta,
            "run_ns": run_ns,
            "dispatches": delta_of(vp::DISPATCHES),
            "per_dispatch_ns": per_dispatch.cloned().unwrap_or(Value::Null),
            "percent_of_time": wait_delta
                .zip(wait.and_then(|c| interval.seconds_for(c)))
                .map(|(w, seconds)| w as f64 / (seconds * 1e9) * 100.0),
            "percent_of_runnable": wait_delta.zip(run_ns).and_then(|(w, r)| share_of_runnable(w, r)),
        })
    }
}

/// CPU wait as a share of runnable time, in %: of the time a VP wanted a host CPU (it ran, or
/// waited for one), the part it waited. `None` when it wanted none.
fn share_of_runnable(wait_ns: u64, run_ns: u64) -> Option<f64> {
    let runnable = wait_ns as f64 + run_ns as f64;
    (runnable > 0.0).then(|| wait_ns as f64 / runnable * 100.0)
}

/// Where a recording the writer stopped in the middle of a line ends: after its last whole
/// sample, which the report reads up to.
fn ended_note(digest: &Digest) -> Option<String> {
    let (line, bytes) = digest.cut?;
    let last = match digest.last_t {
        Some(t) => format!("sample {} at t = {t:.2} s (line {})", digest.samples, line - 1),
        None => "its header (line 1)".to_owned(),
    };
    Some(format!(
        "the recording ends cut short: line {line} holds {bytes} bytes of a sample its writer never \
         finished (a full disk, a kill); this report reads it up to its last whole line, {last}"
    ))
}

/// The first lines of the text report.
fn text_head(digest: &Digest) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "{} samples over {:.2} s, {} VPs", digest.samples, digest.span, digest.vp_count());
    if let Some(ended) = ended_note(digest) {
        let _ = writeln!(out, "note: {ended}");
    }
    if let Some(note) = no_histograms_note(&digest.header) {
        let _ = writeln!(out, "note: {note}");
    }
    out
}

/// One VP's part of the text report. The VM name is escaped (it comes from a VMM's command line
/// and could hold control characters), and the instance and partition say which VM it is when two
/// share a name.
fn text_vp(digest: &Digest, histogram_names: &HashSet<&str>, r: &VpReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{} VP {} (instance {}, partition {}; {} samples over {:.2} s)",
        Escaped(&r.vm),
        r.vp,
        Escaped(&r.instance),
        r.partition,
        r.samples,
        r.seconds
    );
    let _ =
        writeln!(out, "  {:<40} {:>20} {:>16} {:>16}", "counter", "cumulative", "delta", "over recording");
    // Page order, as the header lists the counters.
    for (info, counter) in digest.header.vp_counters() {
        // A histogram's one value is its sum; the histogram section below gives all of it. The
        // page's bookkeeping (its sequence counter) is no measurement.
        if histogram_names.contains(info.name.as_str()) || counter.is_some_and(|c| c.is_bookkeeping()) {
            continue;
        }
        if let Some(line) = text_counter(r, info, counter) {
            out += &line;
        }
    }
    text_cpu_wait(&mut out, &r.json["cpu_wait"]);
    text_histograms(&mut out, &r.json["histograms"]);
    out
}

/// A counter's line of a VP's text report; `None` when it is unknown or 0.
fn text_counter(r: &VpReport, info: &CounterInfo, counter: Option<&'static Counter>) -> Option<String> {
    let name = counter.map_or_else(|| info.name.clone(), |c| present::shown_name(c).to_owned());
    let v = r.json["cumulative"][json_key(info, counter, Held::Total)].as_u64().filter(|&v| v != 0)?;
    let delta = r.json["deltas"][json_key(info, counter, Held::Delta)].as_u64();
    let presented = json_key(info, counter, Held::Presented);
    let shown = [("rates_per_second", "/s"), ("percent_of_time", "%")]
        .iter()
        .find_map(|(k, unit)| Some(format!("{:.1}{unit}", r.json[k][&presented].as_f64()?)))
        .or_else(|| Some(human_ns(r.json["average_cost_ns"][&presented].as_f64()?.round() as u64)))
        .unwrap_or_default();
    // Times in their unit: a total time read as a count of 100 ns says nothing.
    let (v, delta) = match counter.map(|c| c.unit) {
        Some(Unit::Time100ns) => {
            (human_ns(v.saturating_mul(100)), delta.map(|d| human_ns(d.saturating_mul(100))))
        }
        Some(Unit::Nanoseconds) => (human_ns(v), delta.map(human_ns)),
        _ => (v.to_string(), delta.map(|d| d.to_string())),
    };
    let delta = delta.unwrap_or_else(|| "-".into());
    Some(format!("  {name:<40} {v:>20} {delta:>16} {shown:>16}\n"))
}

/// The CPU wait line of a VP's text report, when its wait is known.
fn text_cpu_wait(out: &mut String, wait: &Value) {
    use std::fmt::Write as _;
    if let (Some(per), Some(percent)) = (wait["per_dispatch_ns"].as_f64(), wait["percent_of_time"].as_f64()) {
        let runnable = wait["percent_of_runnable"]
            .as_f64()
            .map_or_else(String::new, |p| format!("{p:.2} % of runnable time (run + wait), "));
        let _ = writeln!(
            out,
            "  CPU wait: {} per dispatch, {runnable}{percent:.3} % of the time",
            human_ns(per.round() as u64)
        );
    }
}

/// The histogram lines of a VP's text report: those that recorded something.
fn text_histograms(out: &mut String, histograms: &Value) {
    use std::fmt::Write as _;
    let Some(histograms) = histograms.as_object() else { return };
    let busy: Vec<_> =
        histograms.iter().filter(|(_, h)| h["count"].as_u64().is_some_and(|c| c > 0)).collect();
    if busy.is_empty() {
        return;
    }
    let _ = writeln!(out, "  {:<40} {:>20} {:>16} {:>16}", "histogram", "count", "p50 ≤", "p99 ≤");
    for (name, h) in busy {
        let count = h["count"].as_u64().map_or("-".into(), |v| v.to_string());
        let q = |k: &str| h[k].as_u64().map_or("-".into(), human_ns);
        let _ = writeln!(out, "  {name:<40} {count:>20} {:>16} {:>16}", q("p50_ns"), q("p99_ns"));
    }
}

/// The `--json` document; its VPs are made and written one at a time.
#[derive(serde::Serialize)]
struct Document<'a> {
    schema_version: u32,
    format_version: u32,
    note: Option<String>,
    bytes_per_sample: Option<u64>,
    samples: usize,
    interval_seconds: f64,
    /// Where the recording ends: its last whole sample's `t`, and the line cut short after it.
    ended: Value,
    catalog: Value,
    vps: EachVp<'a>,
}

/// The VPs of a digest, serialized as they are made.
struct EachVp<'a>(&'a Digest);

impl serde::Serialize for EachVp<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(reports(self.0).map(|r| r.json))
    }
}

/// The `--json` document of `digest`, whose VPs are made as it is written; `bytes_per_sample` is
/// what a sample costs on disk (the header spread over the samples), so a recording's growth can be
/// checked.
pub fn document(digest: &Digest, bytes_per_sample: Option<u64>) -> impl serde::Serialize + '_ {
    Document {
        schema_version: json_keys::SCHEMA_VERSION,
        format_version: digest.header.version,
        note: no_histograms_note(&digest.header),
        bytes_per_sample,
        samples: digest.samples,
        interval_seconds: digest.header.interval_seconds,
        ended: json!({
            "last_sample_seconds": digest.last_t,
            "cut_line": digest.cut.map(|(line, _)| line),
            "cut_bytes": digest.cut.map(|(_, bytes)| bytes),
            "note": ended_note(digest),
        }),
        catalog: json!({ "hvstats": digest.header.catalog.hvstats, "groups": digest.header.catalog.groups }),
        vps: EachVp(digest),
    }
}

/// The text report of `digest`, in pieces made one at a time: its first lines, then each VP's.
pub fn text(digest: &Digest) -> impl Iterator<Item = String> + '_ {
    // Found once, not per counter of every VP: a hostile header may list millions of each.
    let histogram_names: HashSet<&str> =
        digest.header.catalog.vp_histograms.iter().map(|h| h.name.as_str()).collect();
    std::iter::once(text_head(digest))
        .chain(reports(digest).map(move |r| text_vp(digest, &histogram_names, &r)))
}
