//! The same metric families in the Prometheus client library's own types, for the scrape rows'
//! baseline: what encoding them costs the library alone, with no reading to walk.
//!
//! [`LibraryFamilies::parse`] takes an OpenMetrics exposition (ours) apart into its families —
//! name, type, unit, help and every sample with its labels — and registers each in a
//! [`prometheus_client`] registry: counters and gauges as the library's `Family` of `Counter` or
//! `Gauge`, histograms and infos as the library's `Family` of a metric that hands its fixed values
//! to the library's encoder. [`LibraryFamilies::encode`] is then the library's text encoding of
//! exactly the series the exposition held.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Registry, Unit};

/// A series' labels, in exposition order.
type Labels = Vec<(String, String)>;

/// A histogram's sum, count and buckets (each bucket's own count, not cumulative).
type HistogramValues = (f64, u64, Vec<(f64, u64)>);

/// Why an exposition could not be taken apart.
#[derive(Debug, thiserror::Error)]
#[error("line {line} of the exposition: {why}")]
pub struct ParseError {
    /// The line (1-based).
    pub line: usize,
    /// What was wrong with it.
    pub why: String,
}

/// A histogram's values, fixed once and encoded by the library.
#[derive(Debug, Default)]
struct FixedHistogram(OnceLock<HistogramValues>);

impl TypedMetric for FixedHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for FixedHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = self.0.get().ok_or(std::fmt::Error)?;
        encoder.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// The series of an info family (each `1`, told apart by its labels).
#[derive(Debug, Default)]
struct InfoSeries(Vec<Labels>);

impl TypedMetric for InfoSeries {
    const TYPE: MetricType = MetricType::Info;
}

impl EncodeMetric for InfoSeries {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for labels in &self.0 {
            encoder.encode_info(labels)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// One family as the exposition described it.
#[derive(Debug, Default)]
struct Described {
    kind: String,
    unit: Option<String>,
    help: String,
    /// Counter, gauge and info samples: labels and value text.
    samples: Vec<(Labels, String)>,
    /// Histogram samples, by their labels without `le`: sum, count and buckets.
    histograms: BTreeMap<Labels, HistogramValues>,
    /// Histogram label sets in exposition order.
    histogram_order: Vec<Labels>,
}

/// The families of an exposition, registered in the library's own types.
#[derive(Debug)]
pub struct LibraryFamilies {
    registry: Registry,
    series: usize,
}

impl LibraryFamilies {
    /// Takes `exposition` (OpenMetrics text) apart and registers its families.
    ///
    /// # Errors
    /// When a line is not one the OpenMetrics text format allows, or a value is not a number.
    pub fn parse(exposition: &str) -> Result<Self, ParseError> {
        let mut families: Vec<(String, Described)> = Vec::new();
        let mut series = 0;
        for (n, line) in exposition.lines().enumerate() {
            let err = |why: &str| ParseError { line: n + 1, why: why.to_owned() };
            if line.is_empty() || line == "# EOF" {
                continue;
            }
            if let Some(meta) = line.strip_prefix("# ") {
                let mut parts = meta.splitn(3, ' ');
                let (what, name, rest) = (parts.next(), parts.next(), parts.next().unwrap_or(""));
                let name = name.ok_or_else(|| err("a comment without a name"))?;
                if families.last().is_none_or(|(last, _)| last != name) {
                    families.push((name.to_owned(), Described::default()));
                }
                let Some((_, family)) = families.last_mut() else { continue };
                match what {
                    Some("TYPE") => family.kind = rest.to_owned(),
                    Some("UNIT") => family.unit = Some(rest.to_owned()),
                    Some("HELP") => family.help = unescape(rest),
                    _ => return Err(err("an unknown comment")),
                }
                continue;
            }
            let (sample, labels, value) = split_sample(line).ok_or_else(|| err("not a sample"))?;
            let (name, family) = families.last_mut().ok_or_else(|| err("a sample before any family"))?;
            let suffix =
                sample.strip_prefix(name.as_str()).ok_or_else(|| err("a sample of another family"))?;
            series += 1;
            match (family.kind.as_str(), suffix) {
                ("histogram", "_bucket" | "_sum" | "_count") => {
                    let mut labels = labels;
                    let le = labels.iter().position(|(k, _)| k == "le").map(|i| labels.remove(i).1);
                    if !family.histograms.contains_key(&labels) {
                        family.histogram_order.push(labels.clone());
                    }
                    let h = family.histograms.entry(labels).or_default();
                    match (suffix, le) {
                        ("_bucket", Some(le)) => {
                            // The text is cumulative; the library takes each bucket's own count.
                            let bound = if le == "+Inf" { f64::INFINITY } else { number(&le, &err)? };
                            let below: u64 = h.2.iter().map(|(_, n)| n).sum();
                            h.2.push((bound, (number(value, &err)? as u64).saturating_sub(below)));
                        }
                        ("_sum", None) => h.0 = number(value, &err)?,
                        ("_count", None) => h.1 = number(value, &err)? as u64,
                        _ => return Err(err("a histogram sample out of place")),
                    }
                }
                ("counter", "_total") | ("gauge" | "unknown", "") | ("info", "_info") => {
                    number(value, &err)?;
                    family.samples.push((labels, value.to_owned()));
                }
                _ => return Err(err("a sample whose suffix does not fit its family's type")),
            }
        }
        let mut registry = Registry::default();
        for (name, family) in families {
            register(&mut registry, &name, family);
        }
        Ok(Self { registry, series })
    }

    /// The series registered (as many as the exposition's sample lines).
    pub fn series(&self) -> usize {
        self.series
    }

    /// The library's text encoding of the families.
    ///
    /// # Errors
    /// Only when formatting fails (it writes to a `String`).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// Registers `family` under `name` (its unit, which the library appends, taken off the name).
fn register(registry: &mut Registry, name: &str, family: Described) {
    let help = family.help.strip_suffix('.').unwrap_or(&family.help).to_owned();
    let unit = family.unit.filter(|u| !u.is_empty());
    let base = match &unit {
        Some(u) => name.strip_suffix(&format!("_{u}")).unwrap_or(name).to_owned(),
        None => name.to_owned(),
    };
    let unit = unit.map(Unit::Other);
    let mut put =
        |metric: Box<dyn EncodeMetric + Send + Sync>| add(registry, &base, &help, unit.clone(), metric);
    let whole = family.samples.iter().all(|(_, v)| v.parse::<i64>().is_ok());
    // A family of one series without labels is one metric, not a family of label sets.
    if let [(labels, v)] = family.samples.as_slice()
        && labels.is_empty()
    {
        match family.kind.as_str() {
            "counter" if whole => {
                let c = Counter::<u64>::default();
                c.inc_by(v.parse().unwrap_or(0));
                put(Box::new(c));
            }
            "counter" => {
                let c = Counter::<f64, AtomicU64>::default();
                c.inc_by(v.parse().unwrap_or(0.0));
                put(Box::new(c));
            }
            "gauge" | "unknown" if whole => {
                let g = Gauge::<i64>::default();
                g.set(v.parse().unwrap_or(0));
                put(Box::new(g));
            }
            "gauge" | "unknown" => {
                let g = Gauge::<f64, AtomicU64>::default();
                g.set(v.parse().unwrap_or(0.0));
                put(Box::new(g));
            }
            _ => put(Box::new(InfoSeries(vec![Vec::new()]))),
        }
        return;
    }
    match family.kind.as_str() {
        "counter" if whole => {
            let f = Family::<Labels, Counter<u64>>::default();
            for (labels, v) in &family.samples {
                f.get_or_create(labels).inc_by(v.parse().unwrap_or(0));
            }
            put(Box::new(f));
        }
        "counter" => {
            let f = Family::<Labels, Counter<f64, AtomicU64>>::default();
            for (labels, v) in &family.samples {
                f.get_or_create(labels).inc_by(v.parse().unwrap_or(0.0));
            }
            put(Box::new(f));
        }
        "gauge" | "unknown" if whole => {
            let f = Family::<Labels, Gauge<i64>>::default();
            for (labels, v) in &family.samples {
                f.get_or_create(labels).set(v.parse().unwrap_or(0));
            }
            put(Box::new(f));
        }
        "gauge" | "unknown" => {
            let f = Family::<Labels, Gauge<f64, AtomicU64>>::default();
            for (labels, v) in &family.samples {
                f.get_or_create(labels).set(v.parse().unwrap_or(0.0));
            }
            put(Box::new(f));
        }
        "info" => put(Box::new(InfoSeries(family.samples.into_iter().map(|(labels, _)| labels).collect()))),
        "histogram" => {
            let f = Family::<Labels, FixedHistogram>::default();
            let mut values = family.histograms;
            for labels in &family.histogram_order {
                if let Some(v) = values.remove(labels) {
                    let _ = f.get_or_create(labels).0.set(v);
                }
            }
            put(Box::new(f));
        }
        _ => {}
    }
}

/// Registers `metric` as `name` (with `unit` appended by the library, when given).
fn add(
    registry: &mut Registry,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    metric: Box<dyn EncodeMetric + Send + Sync>,
) {
    let metric = Boxed(metric);
    match unit {
        Some(unit) => registry.register_with_unit(name, help, unit, metric),
        None => registry.register(name, help, metric),
    }
}

/// A family of any of the library's metric types.
struct Boxed(Box<dyn EncodeMetric + Send + Sync>);

impl std::fmt::Debug for Boxed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Boxed")
    }
}

impl EncodeMetric for Boxed {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

/// A sample line's name, labels and value text.
fn split_sample(line: &str) -> Option<(&str, Labels, &str)> {
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    let rest = &line[name_end..];
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(inner) => {
            let (labels, after) = parse_labels(inner)?;
            (labels, after)
        }
        None => (Vec::new(), rest),
    };
    let value = rest.trim_start().split(' ').next()?;
    Some((name, labels, value))
}

/// `k="v",…}` up to and including the closing brace; the labels and what follows.
fn parse_labels(mut s: &str) -> Option<(Labels, &str)> {
    let mut labels = Vec::new();
    loop {
        if let Some(after) = s.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim_start_matches(',').to_owned();
        let mut value = String::new();
        let mut chars = s[eq + 1..].strip_prefix('"')?.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.push((key, value));
        s = &s[eq + 2 + end + 1..];
        s = s.strip_prefix(',').unwrap_or(s);
    }
}

/// A HELP text without its escapes.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match (c, c == '\\') {
            (_, true) => match chars.next() {
                Some('n') => out.push('\n'),
                Some(other) => out.push(other),
                None => out.push('\\'),
            },
            (c, false) => out.push(c),
        }
    }
    out
}

fn number(text: &str, err: &dyn Fn(&str) -> ParseError) -> Result<f64, ParseError> {
    match text {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        _ => text.parse().map_err(|_| err("a value that is not a number")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPOSITION: &str = "\
# HELP hv_vp_exits Exits of the VP.
# TYPE hv_vp_exits counter
hv_vp_exits_total{vm=\"a \\\"quoted\\\" vm\",vp=\"0\"} 7
hv_vp_exits_total{vm=\"b\",vp=\"1\"} 9
# HELP hv_vp_wait_seconds Time waiting.
# TYPE hv_vp_wait_seconds counter
# UNIT hv_vp_wait_seconds seconds
hv_vp_wait_seconds_total{vm=\"b\"} 0.25
# HELP hv_up Whether it is up.
# TYPE hv_up gauge
hv_up 1
# HELP hv_vm Who runs the VM.
# TYPE hv_vm info
hv_vm_info{vm=\"b\",vmm=\"qemu\"} 1
# HELP hv_io_seconds IO times.
# TYPE hv_io_seconds histogram
# UNIT hv_io_seconds seconds
hv_io_seconds_bucket{vm=\"b\",le=\"1e-9\"} 1
hv_io_seconds_bucket{vm=\"b\",le=\"+Inf\"} 3
hv_io_seconds_sum{vm=\"b\"} 0.5
hv_io_seconds_count{vm=\"b\"} 3
# EOF
";

    #[test]
    fn the_library_encodes_every_series_of_the_exposition_with_its_labels_and_value() {
        let families = LibraryFamilies::parse(EXPOSITION).unwrap();
        let text = families.encode().unwrap();
        assert_eq!(families.series(), 9, "{text}");
        for line in [
            "# TYPE hv_vp_exits counter",
            "hv_vp_exits_total{vm=\"a \\\"quoted\\\" vm\",vp=\"0\"} 7",
            "hv_vp_exits_total{vm=\"b\",vp=\"1\"} 9",
            "# UNIT hv_vp_wait_seconds seconds",
            "hv_vp_wait_seconds_total{vm=\"b\"} 0.25",
            "hv_up 1",
            "hv_vm_info{vm=\"b\",vmm=\"qemu\"} 1",
            "hv_io_seconds_bucket{le=\"1e-9\",vm=\"b\"} 1",
            "hv_io_seconds_bucket{le=\"+Inf\",vm=\"b\"} 3",
            "hv_io_seconds_sum{vm=\"b\"} 0.5",
            "hv_io_seconds_count{vm=\"b\"} 3",
        ] {
            assert!(text.contains(line), "{line:?} not in\n{text}");
        }
        let samples = text.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(samples, families.series(), "{text}");
    }

    #[test]
    fn a_line_the_format_does_not_allow_is_an_error_naming_it() {
        let bad = "# TYPE hv_up gauge\nhv_up{vm=\"a\" 1\n";
        assert_eq!(LibraryFamilies::parse(bad).unwrap_err().line, 2);
        let bad = "# TYPE hv_up gauge\nhv_up one\n";
        assert_eq!(LibraryFamilies::parse(bad).unwrap_err().line, 2);
        assert_eq!(LibraryFamilies::parse("hv_up 1\n").unwrap_err().line, 1, "no family");
    }
}
