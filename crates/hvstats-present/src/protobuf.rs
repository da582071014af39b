//! The Prometheus protobuf exposition format: length-delimited `io.prometheus.client.MetricFamily`
//! messages, every histogram a native (sparse, exponential) histogram.
//!
//! The messages mirror `metrics.proto` of prometheus/client_model (`syntax = "proto2"`, package
//! `io.prometheus.client`), field for field and tag for tag, for the fields this exporter sets:
//! `LabelPair` (name 1, value 2), `Gauge` (value 1), `Counter` (value 1, created_timestamp 3), `Histogram`
//! (sample_count 1, sample_sum 2, schema 5, zero_threshold 6, zero_count 7, positive_span 12,
//! positive_delta 13, created_timestamp 15), `Timestamp` (seconds 1, nanos 2), `BucketSpan` (offset 1, length 2), `Metric` (label 1, gauge 2, counter 3,
//! histogram 7) and `MetricFamily` (name 1, help 2, type 3, metric 4), with `MetricType`'s values
//! (COUNTER 0, GAUGE 1, HISTOGRAM 4). They are declared with `prost`'s derive, as no `protoc` is
//! needed for so few.
//!
//! A scraper that asks for this format (Prometheus with `--enable-feature=native-histograms`)
//! gets each histogram as one native histogram of schema 0, whose buckets are powers of two:
//!
//! - our buckets (and KVM's `halt_*_hist`) count times in nanoseconds: bucket 0 holds 0 ns,
//!   bucket `i` (1 ≤ i ≤ 30) holds `[2^(i-1), 2^i)` ns, bucket 31 holds `[2^30, ∞)` ns;
//! - a native bucket of schema 0 with index `k` holds `(2^(k-1), 2^k]` in the family's unit,
//!   seconds; its zero bucket holds `[-t, t]` for the zero threshold `t`.
//!
//! A second is 10^9 ns, not a power of two, so a nanosecond bucket cannot be a native bucket of
//! seconds. Our bucket 0 is the zero bucket (`[-2^-30, 2^-30]` s, which holds 0 ns and no other
//! whole number of nanoseconds); bucket `i` ≥ 1 is native
//! bucket `i - 30`, `(2^(i-31), 2^(i-30)]` s, the native bucket nearest to it: its bounds are ours
//! times 2^-30 × 10^9 ≈ 0.9313 (6.9 % lower), besides the open and closed ends trading places;
//! bucket 31, open above, is native bucket 1, `(0.5 s, 1 s]`. Counts and the sum are exact.

use hvstats_abi::histogram::{BUCKETS, Log2Histogram};
use prost::Message;

use crate::metrics::BaseUnit;
use crate::sink::{Kind, Labels, Number, Sink, full_name};

/// The media type of the reply.
pub const CONTENT_TYPE: &str =
    "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited";

/// The native bucket index our bucket `i` (≥ 1) becomes: see the module's text.
pub const INDEX_SHIFT: i32 = 30;

/// The zero bucket's half width, 2^-30 s (0.93 ns): the lower bound of the native bucket our
/// bucket 1 becomes, so the zero bucket holds our bucket 0 (0 ns) alone. A threshold above 0
/// also says "native" to Prometheus 2.42, which takes a histogram with no observation and a
/// zero threshold of 0 for a classic one.
pub const ZERO_THRESHOLD: f64 = 1.0 / (1u64 << 30) as f64;

/// `io.prometheus.client.LabelPair`.
#[derive(Clone, PartialEq, Message)]
pub struct LabelPair {
    /// The label's name.
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    /// Its value.
    #[prost(string, optional, tag = "2")]
    pub value: Option<String>,
}

/// `io.prometheus.client.Gauge`.
#[derive(Clone, PartialEq, Message)]
pub struct Gauge {
    /// The value.
    #[prost(double, optional, tag = "1")]
    pub value: Option<f64>,
}

/// `google.protobuf.Timestamp`.
#[derive(Clone, PartialEq, Message)]
pub struct Timestamp {
    /// Seconds since the Unix epoch.
    #[prost(int64, optional, tag = "1")]
    pub seconds: Option<i64>,
    /// Nanoseconds past them.
    #[prost(int32, optional, tag = "2")]
    pub nanos: Option<i32>,
}

impl Timestamp {
    /// `us` microseconds after the epoch.
    pub fn from_micros(us: u64) -> Self {
        Self {
            seconds: i64::try_from(us / 1_000_000).ok(),
            nanos: i32::try_from(us % 1_000_000 * 1_000).ok(),
        }
    }
}

/// `io.prometheus.client.Counter` (without exemplar).
#[derive(Clone, PartialEq, Message)]
pub struct Counter {
    /// The value.
    #[prost(double, optional, tag = "1")]
    pub value: Option<f64>,
    /// When it began counting.
    #[prost(message, optional, tag = "3")]
    pub created_timestamp: Option<Timestamp>,
}

/// `io.prometheus.client.BucketSpan`: `length` consecutive buckets, `offset` buckets after the
/// last span's end (the first span's offset is its first bucket's index).
#[derive(Clone, PartialEq, Message)]
pub struct BucketSpan {
    /// Gap to the previous span, or the first index.
    #[prost(sint32, optional, tag = "1")]
    pub offset: Option<i32>,
    /// Buckets in the span.
    #[prost(uint32, optional, tag = "2")]
    pub length: Option<u32>,
}

/// `io.prometheus.client.Histogram`, its native (sparse) fields.
#[derive(Clone, PartialEq, Message)]
pub struct Histogram {
    /// Observations.
    #[prost(uint64, optional, tag = "1")]
    pub sample_count: Option<u64>,
    /// Their sum.
    #[prost(double, optional, tag = "2")]
    pub sample_sum: Option<f64>,
    /// The schema: bucket boundaries are powers of 2^(2^-schema).
    #[prost(sint32, optional, tag = "5")]
    pub schema: Option<i32>,
    /// The zero bucket's half width.
    #[prost(double, optional, tag = "6")]
    pub zero_threshold: Option<f64>,
    /// Observations in the zero bucket.
    #[prost(uint64, optional, tag = "7")]
    pub zero_count: Option<u64>,
    /// The spans of positive buckets.
    #[prost(message, repeated, tag = "12")]
    pub positive_span: Vec<BucketSpan>,
    /// Each positive bucket's count less the previous one's.
    #[prost(sint64, repeated, packed = "false", tag = "13")]
    pub positive_delta: Vec<i64>,
    /// When it began counting.
    #[prost(message, optional, tag = "15")]
    pub created_timestamp: Option<Timestamp>,
}

/// `io.prometheus.client.Metric`: one series.
#[derive(Clone, PartialEq, Message)]
pub struct Metric {
    /// Its labels.
    #[prost(message, repeated, tag = "1")]
    pub label: Vec<LabelPair>,
    /// A gauge's value.
    #[prost(message, optional, tag = "2")]
    pub gauge: Option<Gauge>,
    /// A counter's value.
    #[prost(message, optional, tag = "3")]
    pub counter: Option<Counter>,
    /// A histogram.
    #[prost(message, optional, tag = "7")]
    pub histogram: Option<Histogram>,
}

/// `io.prometheus.client.MetricType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum MetricType {
    /// COUNTER.
    Counter = 0,
    /// GAUGE.
    Gauge = 1,
    /// HISTOGRAM.
    Histogram = 4,
}

/// `io.prometheus.client.MetricFamily`.
#[derive(Clone, PartialEq, Message)]
pub struct MetricFamily {
    /// The series' name (`_total` included for counters).
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    /// The help text.
    #[prost(string, optional, tag = "2")]
    pub help: Option<String>,
    /// The type.
    #[prost(enumeration = "MetricType", optional, tag = "3")]
    pub r#type: Option<i32>,
    /// The series.
    #[prost(message, repeated, tag = "4")]
    pub metric: Vec<Metric>,
}

/// `h` as a native histogram of schema 0 in seconds (see the module's text).
pub fn native(h: &Log2Histogram) -> Histogram {
    let used: Vec<usize> = (1..BUCKETS).filter(|&i| h.buckets[i] != 0).collect();
    let (mut spans, mut deltas) = (Vec::new(), Vec::new());
    if let (Some(&first), Some(&last)) = (used.first(), used.last()) {
        spans.push(BucketSpan {
            offset: Some(first as i32 - INDEX_SHIFT),
            length: Some((last - first + 1) as u32),
        });
        let mut previous = 0i64;
        for i in first..=last {
            let count = h.buckets[i] as i64;
            deltas.push(count.wrapping_sub(previous));
            previous = count;
        }
    } else {
        // An empty span says "native" to a reader of a histogram that has no observation yet.
        spans.push(BucketSpan { offset: Some(0), length: Some(0) });
    }
    Histogram {
        sample_count: Some(h.count()),
        sample_sum: Some(h.sum_ns as f64 / 1e9),
        schema: Some(0),
        zero_threshold: Some(ZERO_THRESHOLD),
        zero_count: Some(h.buckets[0]),
        positive_span: spans,
        positive_delta: deltas,
        created_timestamp: None,
    }
}

/// A sink making `MetricFamily` messages, each written length-delimited once complete.
#[derive(Default)]
pub(crate) struct Protobuf {
    out: Vec<u8>,
    family: Option<MetricFamily>,
}

impl Protobuf {
    fn flush(&mut self) {
        if let Some(family) = self.family.take().filter(|f| !f.metric.is_empty()) {
            // Writing to a Vec cannot run out of room.
            let _ = family.encode_length_delimited(&mut self.out);
        }
    }

    /// The bytes of every family.
    pub(crate) fn into_bytes(mut self) -> Vec<u8> {
        self.flush();
        self.out
    }

    fn push(&mut self, labels: &Labels<'_>, fill: impl FnOnce(&mut Metric)) {
        let Some(family) = self.family.as_mut() else { return };
        let mut metric = Metric {
            label: labels
                .iter()
                .map(|(n, v)| LabelPair { name: Some((*n).to_owned()), value: Some((*v).to_owned()) })
                .collect(),
            gauge: None,
            counter: None,
            histogram: None,
        };
        fill(&mut metric);
        family.metric.push(metric);
    }
}

impl Sink for Protobuf {
    fn family(&mut self, name: &str, help: &str, unit: Option<BaseUnit>, kind: Kind) -> std::fmt::Result {
        self.flush();
        let mut name = full_name(name, unit);
        let kind = match kind {
            Kind::Counter => {
                name.push_str("_total");
                MetricType::Counter
            }
            Kind::Gauge => MetricType::Gauge,
            Kind::Histogram => MetricType::Histogram,
        };
        self.family = Some(MetricFamily {
            name: Some(name),
            help: Some(help.to_owned()),
            r#type: Some(kind as i32),
            metric: Vec::new(),
        });
        Ok(())
    }

    fn sample(&mut self, labels: &Labels<'_>, value: Number) -> std::fmt::Result {
        let counter = self.family.as_ref().is_some_and(|f| f.r#type == Some(MetricType::Counter as i32));
        self.push(labels, |m| match counter {
            true => m.counter = Some(Counter { value: Some(value.as_f64()), created_timestamp: None }),
            false => m.gauge = Some(Gauge { value: Some(value.as_f64()) }),
        });
        Ok(())
    }

    fn histogram(&mut self, labels: &Labels<'_>, h: &Log2Histogram) -> std::fmt::Result {
        self.push(labels, |m| m.histogram = Some(native(h)));
        Ok(())
    }

    fn created(&mut self, _labels: &Labels<'_>, at_us: u64) -> std::fmt::Result {
        let last = self.family.as_mut().and_then(|f| f.metric.last_mut());
        if let Some(m) = last {
            let at = Some(Timestamp::from_micros(at_us));
            if let Some(c) = m.counter.as_mut() {
                c.created_timestamp = at;
            } else if let Some(h) = m.histogram.as_mut() {
                h.created_timestamp = at;
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> std::fmt::Result {
        self.flush();
        Ok(())
    }
}

/// The families of a protobuf exposition (for tests and tools reading one back).
///
/// # Errors
/// When `bytes` is not a sequence of length-delimited `MetricFamily` messages.
pub fn decode(mut bytes: &[u8]) -> Result<Vec<MetricFamily>, prost::DecodeError> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        out.push(MetricFamily::decode_length_delimited(&mut bytes)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log2_histogram_is_a_schema_0_native_one_with_exact_counts_and_sum() {
        let mut h = Log2Histogram::default();
        for ns in [0, 1_024, 1_500, 3_000, 1 << 20] {
            h.record(ns);
        }
        let n = native(&h);
        assert_eq!((n.schema, n.sample_count, n.zero_count), (Some(0), Some(5), Some(1)));
        assert_eq!(n.sample_sum, Some((1_024 + 1_500 + 3_000 + (1 << 20)) as f64 / 1e9));
        // 1,024 and 1,500 ns are bucket 11 ([1024, 2048) ns), 3,000 bucket 12, 2^20 bucket 21:
        // native indexes -19, -18 and -9.
        let first = hvstats_abi::histogram::bucket_of(1_024) as i32;
        assert_eq!(first, 11);
        assert_eq!(n.positive_span, [BucketSpan { offset: Some(first - 30), length: Some(11) }]);
        let counts: Vec<i64> = n
            .positive_delta
            .iter()
            .scan(0i64, |c, d| {
                *c += d;
                Some(*c)
            })
            .collect();
        assert_eq!(counts.iter().sum::<i64>(), 4);
        assert_eq!(counts[..2], [2, 1]);
        assert_eq!(counts[10], 1);
        let empty = native(&Log2Histogram::default());
        assert_eq!(empty.positive_span, [BucketSpan { offset: Some(0), length: Some(0) }]);
    }
}
