//! Where an exposition writes its families: the OpenMetrics text ([`OpenMetrics`]) or the
//! Prometheus protobuf format ([`crate::protobuf`]).
//!
//! The exposition walks a reading once and says, family by family, each series' labels and
//! value; a sink turns that into its format. The text sink writes straight into its writer: no
//! label set is built or cloned per sample (every label value is a `&str` the walk made once per
//! scrape), which is what makes a scrape of thousands of VPs cheap.

use std::fmt::{self, Write};

use hvstats_abi::histogram::{BUCKETS, Log2Histogram, bucket_upper_ns};

use crate::metrics::{BaseUnit, PREFIX};

/// A family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Only grows (`_total`).
    Counter,
    /// A value at the moment of the scrape.
    Gauge,
    /// A histogram of times in seconds.
    Histogram,
}

/// A sample's value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Number {
    /// A whole number, kept exact.
    Whole(u64),
    /// A signed whole number.
    Signed(i64),
    /// A number with a fraction.
    Real(f64),
}

impl Number {
    /// The value as a float (what the protobuf format carries).
    pub(crate) fn as_f64(self) -> f64 {
        match self {
            Number::Whole(v) => v as f64,
            Number::Signed(v) => v as f64,
            Number::Real(v) => v,
        }
    }
}

/// A series' labels: a few name/value pairs, the values unescaped.
pub(crate) type Labels<'a> = [(&'a str, &'a str)];

/// What an exposition writes to.
pub(crate) trait Sink {
    /// Begins a family: `name` without prefix or unit, as the catalog's families name it.
    fn family(&mut self, name: &str, help: &str, unit: Option<BaseUnit>, kind: Kind) -> fmt::Result;
    /// One series of the current counter or gauge family.
    fn sample(&mut self, labels: &Labels<'_>, value: Number) -> fmt::Result;
    /// One series of the current histogram family.
    fn histogram(&mut self, labels: &Labels<'_>, h: &Log2Histogram) -> fmt::Result;
    /// When the series just written (of a counter or histogram family, labelled `labels`) began
    /// counting, in microseconds since the Unix epoch: its OpenMetrics `_created`.
    fn created(&mut self, labels: &Labels<'_>, at_us: u64) -> fmt::Result;
    /// Ends the exposition.
    fn finish(&mut self) -> fmt::Result;
}

/// The OpenMetrics text (1.0.0), as the Prometheus client library writes it: `# HELP`, `# TYPE`
/// and `# UNIT` per family, `_total` samples for counters, `_sum`, `_count` and cumulative
/// `_bucket{le}` for histograms, `# EOF` at the end.
pub(crate) struct OpenMetrics<'w, W: Write> {
    out: &'w mut W,
    /// The current family's name: prefix, name and unit.
    name: String,
    kind: Kind,
    /// The current family's `# HELP`, `# TYPE` and `# UNIT` lines, until its first series: a
    /// family without series (nothing measured it) is left out whole.
    header: String,
    /// The `le` label of each bucket, made once.
    bounds: [String; BUCKETS],
}

impl<'w, W: Write> OpenMetrics<'w, W> {
    /// A sink writing to `out`.
    pub(crate) fn new(out: &'w mut W) -> Self {
        let bounds = std::array::from_fn(|i| match bucket_upper_ns(i) {
            Some(ns) => dtoa::Buffer::new().format(ns as f64 / 1e9).to_owned(),
            None => "+Inf".to_owned(),
        });
        Self { out, name: String::new(), kind: Kind::Gauge, header: String::new(), bounds }
    }

    /// Writes the family's header before its first series.
    fn begin(&mut self) -> fmt::Result {
        if !self.header.is_empty() {
            self.out.write_str(&self.header)?;
            self.header.clear();
        }
        Ok(())
    }

    fn labels(&mut self, first: Option<(&str, &str)>, labels: &Labels<'_>) -> fmt::Result {
        if first.is_none() && labels.is_empty() {
            return Ok(());
        }
        self.out.write_char('{')?;
        let mut comma = false;
        for (name, value) in first.iter().chain(labels) {
            if comma {
                self.out.write_char(',')?;
            }
            comma = true;
            self.out.write_str(name)?;
            self.out.write_str("=\"")?;
            escape_label(self.out, value)?;
            self.out.write_char('"')?;
        }
        self.out.write_char('}')
    }
}

/// A label value with `\`, `"` and newlines escaped.
fn escape_label(out: &mut impl Write, value: &str) -> fmt::Result {
    if !value.bytes().any(|b| matches!(b, b'\\' | b'"' | b'\n')) {
        return out.write_str(value);
    }
    for ch in value.chars() {
        match ch {
            '\\' => out.write_str("\\\\")?,
            '"' => out.write_str("\\\"")?,
            '\n' => out.write_str("\\n")?,
            c => out.write_char(c)?,
        }
    }
    Ok(())
}

/// `us` microseconds as seconds with six decimals, exactly (`1700000000.000001`).
fn write_seconds(out: &mut impl Write, us: u64) -> fmt::Result {
    out.write_str(itoa::Buffer::new().format(us / 1_000_000))?;
    let frac = us % 1_000_000;
    write!(out, ".{frac:06}")
}

/// The exposed family name: prefix, name, unit.
pub(crate) fn full_name(name: &str, unit: Option<BaseUnit>) -> String {
    let mut full = format!("{PREFIX}_{name}");
    if let Some(unit) = unit {
        full.push('_');
        full.push_str(unit.suffix());
    }
    full
}

impl<W: Write> Sink for OpenMetrics<'_, W> {
    fn family(&mut self, name: &str, help: &str, unit: Option<BaseUnit>, kind: Kind) -> fmt::Result {
        self.name = full_name(name, unit);
        self.kind = kind;
        let kind_name = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let name = &self.name;
        self.header.clear();
        write!(self.header, "# HELP {name} {help}\n# TYPE {name} {kind_name}\n")?;
        if let Some(unit) = unit {
            writeln!(self.header, "# UNIT {name} {}", unit.suffix())?;
        }
        Ok(())
    }

    fn sample(&mut self, labels: &Labels<'_>, value: Number) -> fmt::Result {
        self.begin()?;
        self.out.write_str(&self.name)?;
        if self.kind == Kind::Counter {
            self.out.write_str("_total")?;
        }
        self.labels(None, labels)?;
        self.out.write_char(' ')?;
        match value {
            Number::Whole(v) => self.out.write_str(itoa::Buffer::new().format(v))?,
            Number::Signed(v) => self.out.write_str(itoa::Buffer::new().format(v))?,
            Number::Real(v) => self.out.write_str(dtoa::Buffer::new().format(v))?,
        }
        self.out.write_char('\n')
    }

    fn histogram(&mut self, labels: &Labels<'_>, h: &Log2Histogram) -> fmt::Result {
        self.begin()?;
        let name = std::mem::take(&mut self.name);
        let result = (|| {
            self.out.write_str(&name)?;
            self.out.write_str("_sum")?;
            self.labels(None, labels)?;
            self.out.write_char(' ')?;
            self.out.write_str(dtoa::Buffer::new().format(h.sum_ns as f64 / 1e9))?;
            self.out.write_char('\n')?;
            self.out.write_str(&name)?;
            self.out.write_str("_count")?;
            self.labels(None, labels)?;
            self.out.write_char(' ')?;
            self.out.write_str(itoa::Buffer::new().format(h.count()))?;
            self.out.write_char('\n')?;
            let mut cumulative = 0u64;
            for i in 0..BUCKETS {
                cumulative = cumulative.wrapping_add(h.buckets[i]);
                self.out.write_str(&name)?;
                self.out.write_str("_bucket")?;
                let bound = std::mem::take(&mut self.bounds[i]);
                let written = self.labels(Some(("le", &bound)), labels);
                self.bounds[i] = bound;
                written?;
                self.out.write_char(' ')?;
                self.out.write_str(itoa::Buffer::new().format(cumulative))?;
                self.out.write_char('\n')?;
            }
            Ok(())
        })();
        self.name = name;
        result
    }

    fn created(&mut self, labels: &Labels<'_>, at_us: u64) -> fmt::Result {
        self.out.write_str(&self.name)?;
        self.out.write_str("_created")?;
        self.labels(None, labels)?;
        self.out.write_char(' ')?;
        write_seconds(self.out, at_us)?;
        self.out.write_char('\n')
    }

    fn finish(&mut self) -> fmt::Result {
        self.out.write_str("# EOF\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_has_the_client_librarys_shape() {
        let mut out = String::new();
        let mut sink = OpenMetrics::new(&mut out);
        sink.family("vp_hypercalls", "Hypercalls.", None, Kind::Counter).unwrap();
        sink.sample(&[("vm", "a\"b"), ("vp", "0")], Number::Whole(u64::MAX)).unwrap();
        sink.family("partition_gpa", "GPA.", Some(BaseUnit::Bytes), Kind::Gauge).unwrap();
        sink.sample(&[], Number::Real(0.001234)).unwrap();
        let mut h = Log2Histogram::default();
        h.record(3);
        sink.family("vp_x_duration", "X.", Some(BaseUnit::Seconds), Kind::Histogram).unwrap();
        sink.histogram(&[("vm", "a")], &h).unwrap();
        sink.created(&[("vm", "a")], 1_700_000_000_000_042).unwrap();
        sink.family("vp_unmeasured", "Nothing measures it.", None, Kind::Counter).unwrap();
        sink.finish().unwrap();
        assert!(!out.contains("unmeasured"), "a family without series is left out: {out}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[..8],
            [
                "# HELP hvstats_vp_hypercalls Hypercalls.",
                "# TYPE hvstats_vp_hypercalls counter",
                "hvstats_vp_hypercalls_total{vm=\"a\\\"b\",vp=\"0\"} 18446744073709551615",
                "# HELP hvstats_partition_gpa_bytes GPA.",
                "# TYPE hvstats_partition_gpa_bytes gauge",
                "# UNIT hvstats_partition_gpa_bytes bytes",
                "hvstats_partition_gpa_bytes 0.001234",
                "# HELP hvstats_vp_x_duration_seconds X.",
            ]
        );
        assert!(out.contains("hvstats_vp_x_duration_seconds_sum{vm=\"a\"} 3e-9\n"), "{out}");
        assert!(out.contains("hvstats_vp_x_duration_seconds_count{vm=\"a\"} 1\n"), "{out}");
        assert!(out.contains("hvstats_vp_x_duration_seconds_bucket{le=\"4e-9\",vm=\"a\"} 1\n"), "{out}");
        assert!(out.contains("hvstats_vp_x_duration_seconds_bucket{le=\"+Inf\",vm=\"a\"} 1\n"), "{out}");
        assert!(out.contains("hvstats_vp_x_duration_seconds_created{vm=\"a\"} 1700000000.000042\n"), "{out}");
        assert!(out.ends_with("# EOF\n"));
    }

    #[test]
    fn a_counters_created_follows_its_total_with_the_same_labels() {
        let mut out = String::new();
        let mut sink = OpenMetrics::new(&mut out);
        sink.family("vp_intercepts", "Intercepts.", None, Kind::Counter).unwrap();
        sink.sample(&[("vm", "a"), ("intercept", "io")], Number::Whole(169)).unwrap();
        sink.created(&[("vm", "a"), ("intercept", "io")], 1_764_290_000_500_000).unwrap();
        sink.finish().unwrap();
        assert_eq!(
            out.lines().skip(2).take(2).collect::<Vec<_>>(),
            [
                "hvstats_vp_intercepts_total{vm=\"a\",intercept=\"io\"} 169",
                "hvstats_vp_intercepts_created{vm=\"a\",intercept=\"io\"} 1764290000.500000",
            ]
        );
    }
}
