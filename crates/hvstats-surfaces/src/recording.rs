//! The recording file of `hvstats record`, read by `report` and `plot`: newline-delimited JSON.
//!
//! The first line is a header naming the format, the hvstats and group versions, the sampling
//! interval and, for partitions and VPs, every catalog counter in the order the samples list their
//! values (with unit, presentation and whether KVM maintains it), so a file can be read without
//! this build's catalog. Each further line is one sample: seconds since the start and, per
//! partition of every live instance, its values and its VPs' values. A sample is written in one
//! piece and flushed, so a recording cut short (Ctrl-C, a killed process) is valid up to its last
//! whole line.
//!
//! Version 2 adds each VP's histograms: the header lists them (catalog name and bucketing), and a
//! VP in a sample carries, per histogram, its sum then its bucket counts with the trailing zero
//! buckets left out, so an idle histogram costs a few bytes and a busy VP at most
//! [`HISTOGRAM_SLOTS`] numbers per histogram. A version 1 recording still reads, without
//! histograms ([`Header::has_histograms`]); a version this build does not know is an error.

use std::io::{BufRead, Write};

use hvstats::snapshot::ObjectReading;
use hvstats::snapshot::VpSnapshot;
use hvstats_abi::catalog::counters_of;
use hvstats_abi::histogram::{BUCKETS, HISTOGRAM_SLOTS, Log2Histogram};
use hvstats_abi::{Counter, GroupKind, ObjectKind, Presentation};
use serde::{Deserialize, Serialize};

use hvstats_present::live::{Live, Reading};

/// The `format` of the header.
const FORMAT: &str = "hvstats-recording";

/// The version of the format this build writes (and the newest it reads).
const VERSION: u32 = 2;

/// The oldest version this build reads (version 1: no histograms).
const OLDEST_VERSION: u32 = 1;

/// The `bucketing` of a histogram in the header: [`hvstats_abi::histogram`]'s log2 buckets of
/// nanoseconds.
const LOG2_NS: &str = "log2-ns";

/// A catalog counter as the header describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterInfo {
    /// The catalog name (the key in reports).
    pub name: String,
    /// The raw unit (`count`, `100ns`, …).
    pub unit: String,
    /// The presentation (`rate`, `cost`, `percent-time`, …).
    pub presentation: String,
    /// False when KVM maintains it not: its values are 0 and mean nothing.
    pub maintained: bool,
}

impl CounterInfo {
    fn of(c: &Counter) -> Self {
        Self {
            name: c.name.to_owned(),
            unit: c.unit.name().to_owned(),
            presentation: c.presentation.name().to_owned(),
            maintained: c.maintained.is_maintained(),
        }
    }
}

/// A VP histogram as the header describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistogramInfo {
    /// The catalog name of the histogram row (e.g. `IO intercept time histogram`); its key in reports.
    pub name: String,
    /// How its buckets divide times: [`LOG2_NS`].
    pub bucketing: String,
    /// Its number of buckets ([`BUCKETS`]).
    pub buckets: usize,
}

/// The VP histograms this build records, in sample order.
fn vp_histograms() -> impl Iterator<Item = &'static Counter> {
    counters_of(ObjectKind::Vp).filter(|c| c.presentation == Presentation::Histogram)
}

/// The catalog part of the header.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogInfo {
    /// The hvstats version that wrote the file.
    pub hvstats: String,
    /// The version of the architectural and release groups (`1.0`).
    pub groups: String,
    /// The partition counters, in sample order.
    pub partition: Vec<CounterInfo>,
    /// The VP counters, in sample order.
    pub vp: Vec<CounterInfo>,
    /// The VP histograms, in sample order (none in a version 1 recording).
    #[serde(default)]
    pub vp_histograms: Vec<HistogramInfo>,
}

/// The first line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// Always [`FORMAT`]; a reader refuses a file with another.
    pub format: String,
    /// The format version, [`OLDEST_VERSION`]`..=`[`VERSION`] for a file this build reads.
    pub version: u32,
    /// The `--interval` asked for, in seconds; samples' `t` give the actual spacing.
    pub interval_seconds: f64,
    /// When the recording started, in milliseconds since the Unix epoch (0 if the clock is before it).
    pub started_unix_ms: u64,
    /// Which counters and histograms the samples hold, and in which order.
    pub catalog: CatalogInfo,
}

impl Header {
    /// The header of a recording this build makes.
    pub fn new(interval_seconds: f64, started_unix_ms: u64) -> Self {
        let group = GroupKind::Architectural.version(ObjectKind::Vp);
        Self {
            format: FORMAT.into(),
            version: VERSION,
            interval_seconds,
            started_unix_ms,
            catalog: CatalogInfo {
                hvstats: env!("CARGO_PKG_VERSION").into(),
                groups: format!("{}.{}", group.major, group.minor),
                partition: counters_of(ObjectKind::Partition).map(CounterInfo::of).collect(),
                vp: counters_of(ObjectKind::Vp).map(CounterInfo::of).collect(),
                vp_histograms: vp_histograms()
                    .map(|c| HistogramInfo {
                        name: c.name.to_owned(),
                        bucketing: LOG2_NS.to_owned(),
                        buckets: BUCKETS,
                    })
                    .collect(),
            },
        }
    }
}

/// One VP in a sample.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VpSample {
    /// The VP index within its partition.
    pub vp: u32,
    /// Values in the header's VP order (`null` for a counter the publisher declares unavailable);
    /// absent when the page could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<Option<u64>>>,
    /// Why the page could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
    /// Per histogram of the header, in its order: the sum in ns then the bucket counts, trailing
    /// zero buckets left out (`null` for a histogram the publisher declares unavailable); absent
    /// when the page could not be read, and in version 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub histograms: Option<Vec<Option<Vec<u64>>>>,
    /// True for a VP of a partition its publisher runs itself, whose run loop writes the exits it
    /// handles as they happen: those counts are dated by the sample's `t`, every other by the
    /// VP's publication time (the `Published` value). Absent (false) for other publishers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub run_loop_live: bool,
}

impl VpSample {
    /// The interval from `before`, this VP's earlier sample taken `seconds` before, to this one:
    /// dated by the VP's publication time (at `published_at` in its values) when both samples
    /// have it, else by the samples' `t`.
    pub fn interval_since(
        &self,
        before: &VpSample,
        seconds: f64,
        published_at: Option<usize>,
    ) -> hvstats_present::present::Interval {
        let published =
            |vp: &VpSample| published_at.and_then(|i| vp.values.as_ref()?.get(i).copied().flatten());
        hvstats_present::present::Interval::dated(
            (published(before), published(self)),
            (None, None),
            seconds,
            self.run_loop_live,
        )
    }

    /// Histogram `i` of the header, when this sample has it.
    pub fn histogram(&self, i: usize) -> Option<Log2Histogram> {
        let slots = self.histograms.as_ref()?.get(i)?.as_ref()?;
        let mut full = [0u64; HISTOGRAM_SLOTS];
        full.get_mut(..slots.len())?.copy_from_slice(slots);
        Log2Histogram::from_slots(&full)
    }
}

/// A histogram's recorded slots: the sum, then the buckets up to the last non-zero one.
fn compact(h: &Log2Histogram) -> Vec<u64> {
    let used = h.buckets.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    std::iter::once(h.sum_ns).chain(h.buckets[..used].iter().copied()).collect()
}

/// The histograms of `vp` in the header's order.
fn histograms(vp: &VpSnapshot) -> Option<Vec<Option<Vec<u64>>>> {
    match vp.reading {
        ObjectReading::Counters(_) => Some(
            vp_histograms()
                .map(|c| vp.histograms.iter().find(|(h, _)| h.id == c.id).map(|(_, h)| compact(h)))
                .collect(),
        ),
        ObjectReading::Unreadable { .. } => None,
    }
}

/// One partition in a sample.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PartitionSample {
    /// The VM name (`instance:partition`).
    pub vm: String,
    /// The publishing instance's name (`<pid>-<start>-<n>`).
    pub instance: String,
    /// The partition id within that instance.
    pub partition: u64,
    /// True until the partition stops; a stopped one keeps its final values.
    pub active: bool,
    /// Values in the header's partition order (`null` when unavailable); absent when unreadable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<Option<u64>>>,
    /// Its VPs, by index.
    pub vps: Vec<VpSample>,
}

/// One line after the header.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since the first sample.
    pub t: f64,
    /// Every partition of every live instance.
    pub partitions: Vec<PartitionSample>,
}

/// The values of `reading` in the catalog order of `kind`, as the header lists the counters.
fn values(kind: ObjectKind, reading: &ObjectReading) -> (Option<Vec<Option<u64>>>, Option<String>) {
    match reading {
        ObjectReading::Counters(_) => (Some(counters_of(kind).map(|c| reading.get(c.name)).collect()), None),
        ObjectReading::Unreadable { reason, .. } => (None, Some(reason.clone())),
    }
}

impl Sample {
    /// The sample of `reading`, `t` seconds into the recording.
    pub fn of(reading: &Reading, t: f64) -> Self {
        let partitions = reading
            .instances
            .iter()
            .flat_map(|i| i.partitions.iter().map(move |p| (i, p)))
            .map(|(i, p)| (i, p, i.description.runs_its_partitions()))
            .map(|(i, p, run_loop_live)| PartitionSample {
                vm: Live::vm_name(&i.name, p),
                instance: i.name.clone(),
                partition: p.id,
                active: p.active,
                values: values(ObjectKind::Partition, &p.reading).0,
                vps: p
                    .vps
                    .iter()
                    .map(|vp| {
                        let (values, unreadable) = values(ObjectKind::Vp, &vp.reading);
                        VpSample {
                            vp: vp.index,
                            values,
                            unreadable,
                            histograms: histograms(vp),
                            run_loop_live,
                        }
                    })
                    .collect(),
            })
            .collect();
        Self { t, partitions }
    }
}

/// Why a recording could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    /// The input could not be read.
    #[error(transparent)]
    Read(std::io::Error),
    /// A line could not be written or flushed.
    #[error(transparent)]
    Write(std::io::Error),
    /// A value could not be encoded as JSON.
    #[error(transparent)]
    Encode(serde_json::Error),
    /// A sample longer than a line may be, 128 MiB (its length in bytes).
    #[error(
        "a sample of {0} bytes is longer than a recording line may be ({MAX_LINE} bytes): too many VPs \
         for one recording"
    )]
    SampleTooLong(usize),
    /// Nothing to read.
    #[error("the file is empty: not a recording")]
    Empty,
    /// Line 1 does not parse as a header.
    #[error("line 1 is not a recording header")]
    NotAHeader(#[source] serde_json::Error),
    /// Line 1 names another format.
    #[error("line 1: format {0:?}, not {FORMAT:?}")]
    Format(String),
    /// Line 1 names a version this build does not read.
    #[error(
        "line 1: recording format version {0} ({why}; this hvstats reads versions {OLDEST_VERSION} to {VERSION})",
        why = if *.0 > VERSION { "written by a newer hvstats" } else { "no such version" }
    )]
    Version(u32),
    /// A histogram of the header is bucketed otherwise than this build's.
    #[error(
        "line 1: histogram {:?} has {} buckets of {:?}; this hvstats reads {BUCKETS} of {LOG2_NS:?}",
        .0.name, .0.buckets, .0.bucketing
    )]
    Bucketing(HistogramInfo),
    /// Line 1 is longer than a header may be, 1 MiB (the limit).
    #[error(
        "line 1 is longer than {0} bytes: not a recording header (a header lists the catalog's \
         counters, tens of KiB)"
    )]
    HeaderTooLong(usize),
    /// A sample line is longer than a line may be, 128 MiB.
    #[error("line {line} is longer than {max} bytes")]
    LineTooLong {
        /// Its number.
        line: usize,
        /// The limit.
        max: usize,
    },
    /// A line does not parse as a sample that fits the header.
    #[error("line {line} is not a sample")]
    NotASample {
        /// Its number.
        line: usize,
        /// What did not parse.
        #[source]
        source: serde_json::Error,
    },
}

/// Writes one JSON line and flushes it.
///
/// # Errors
/// When writing fails (a full disk).
pub fn write_line(out: &mut impl Write, value: &impl Serialize) -> Result<(), RecordingError> {
    let mut line = serde_json::to_vec(value).map_err(RecordingError::Encode)?;
    line.push(b'\n');
    if line.len() > MAX_LINE {
        return Err(RecordingError::SampleTooLong(line.len()));
    }
    out.write_all(&line).map_err(RecordingError::Write)?;
    out.flush().map_err(RecordingError::Write)
}

/// The longest line accepted, and written: 128 MiB, a sample of 100,000 VPs with every counter in
/// the billions, or of 16,384 VPs with every value and histogram slot at its largest (a test checks
/// both). A reader holds one line at a time, and one VP of it parsed, so this bounds what a line
/// costs it.
const MAX_LINE: usize = 128 << 20;

/// The longest header accepted: 1 MiB, dozens of times what this build writes (its catalog's
/// counters and histograms, about 20 KiB), so a newer catalog still reads while a header of
/// millions of made-up counters is refused before anything is parsed.
const MAX_HEADER: usize = 1 << 20;

/// A recording read one sample at a time, so what reads it holds no more than it keeps: the
/// header is read and checked first, then each [`next_with`](Self::next_with) parses and checks one line.
pub struct SampleReader<R> {
    input: R,
    header: Header,
    /// Lines read so far (the header is line 1).
    line: usize,
    /// The last line, when it was cut short: its number and bytes.
    cut: Option<(usize, usize)>,
}

impl<R: BufRead> SampleReader<R> {
    /// Reads and checks the header.
    ///
    /// # Errors
    /// When the input cannot be read, is empty, or does not start with a header of a format and
    /// version this build reads.
    pub fn new(mut input: R) -> Result<Self, RecordingError> {
        let Some(first) = read_line(&mut input, 1, MAX_HEADER)? else { return Err(RecordingError::Empty) };
        // Format and version first: a newer version may have a header this build cannot parse.
        #[derive(Deserialize)]
        struct Version {
            format: String,
            version: u32,
        }
        let v: Version = serde_json::from_slice(&first).map_err(RecordingError::NotAHeader)?;
        if v.format != FORMAT {
            return Err(RecordingError::Format(v.format));
        }
        if !(OLDEST_VERSION..=VERSION).contains(&v.version) {
            return Err(RecordingError::Version(v.version));
        }
        let header: Header = serde_json::from_slice(&first).map_err(RecordingError::NotAHeader)?;
        if let Some(h) =
            header.catalog.vp_histograms.iter().find(|h| h.bucketing != LOG2_NS || h.buckets != BUCKETS)
        {
            return Err(RecordingError::Bucketing(h.clone()));
        }
        Ok(Self { input, header, line: 1, cut: None })
    }

    /// The number and length in bytes of the last line, when the writer stopped in its middle
    /// (a full disk, a kill): the recording ends at the sample before it.
    pub fn cut_short(&self) -> Option<(usize, usize)> {
        self.cut
    }

    /// The header of line 1, already checked: format, version and histogram bucketing.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Reads the next sample one VP at a time: `visit` gets each VP as it is parsed, so no more
    /// than one VP of the sample is ever held, whatever its size. Returns the sample's time, or
    /// `None` at the end (as a line cut short at the end is ignored).
    ///
    /// # Errors
    /// When the input cannot be read, or a line is too long, not a sample, or does not match the
    /// header's counters; and whatever `visit` returns.
    pub fn next_with(&mut self, mut visit: impl FnMut(VpAt<'_>)) -> Result<Option<f64>, RecordingError> {
        let Some((n, line)) = self.next_line()? else { return Ok(None) };
        let not_a_sample = |source| RecordingError::NotASample { line: n, source };
        let parse = |t: Option<f64>, visit: &mut dyn FnMut(VpAt<'_>)| {
            let mut de = serde_json::Deserializer::from_slice(&line);
            let mut t_late = false;
            let seed = stream::SampleSeed { header: &self.header, t, t_late: &mut t_late, visit };
            let result =
                serde::de::DeserializeSeed::deserialize(seed, &mut de).and_then(|t| de.end().map(|()| t));
            (result, t_late)
        };
        let (result, t_late) = parse(None, &mut visit);
        let result = if t_late {
            // "t" after the partitions (a tool rewrote the line with its keys sorted): nothing was
            // visited yet; find "t" first, skipping the rest, and read the line again.
            #[derive(Deserialize)]
            struct Time {
                t: f64,
            }
            let time: Time = serde_json::from_slice(&line).map_err(not_a_sample)?;
            parse(Some(time.t), &mut visit).0
        } else {
            result
        };
        Ok(Some(result.map_err(not_a_sample)?))
    }

    /// The next whole line and its number; `None` at the end or at a last line cut short.
    fn next_line(&mut self) -> Result<Option<(usize, Vec<u8>)>, RecordingError> {
        self.line += 1;
        let n = self.line;
        let Some(line) = read_line(&mut self.input, n, MAX_LINE)? else { return Ok(None) };
        if !line.ends_with(b"\n") {
            self.cut = (!line.is_empty()).then_some((n, line.len()));
            return Ok(None);
        }
        Ok(Some((n, line)))
    }
}

/// True when `vp`'s values and histograms have the shape the header gives them.
fn fits(header: &Header, vp: &VpSample) -> bool {
    let histograms = header.catalog.vp_histograms.len();
    vp.values.as_ref().is_none_or(|v| v.len() == header.catalog.vp.len())
        && vp.histograms.as_ref().is_none_or(|h| {
            h.len() == histograms && h.iter().flatten().all(|s| !s.is_empty() && s.len() <= HISTOGRAM_SLOTS)
        })
}

/// One VP of a sample, as [`SampleReader::next_with`] hands it.
pub struct VpAt<'a> {
    /// The sample's `t`: seconds since the first sample.
    pub t: f64,
    /// The VM's name, as `instance:partition`.
    pub vm: &'a str,
    /// The publishing instance's name (`<pid>-<start>-<n>`).
    pub instance: &'a str,
    /// The partition id within that instance.
    pub partition: u64,
    /// The VP as recorded, already checked to fit the header's counters and histograms.
    pub vp: VpSample,
}

impl VpAt<'_> {
    /// Who the VP is: the publishing instance, the partition, the VP index. Two VMs that share a
    /// name are two VMs.
    pub fn key(&self) -> VpKey {
        VpKey { instance: self.instance.into(), partition: self.partition, vp: self.vp.vp }
    }
}

/// A VP's identity in a recording.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VpKey {
    /// The publishing instance's name (`<pid>-<start>-<n>`).
    pub instance: Box<str>,
    /// The partition id within that instance.
    pub partition: u64,
    /// The VP index within that partition.
    pub vp: u32,
}

/// The sample parser of [`SampleReader::next_with`]: serde seeds that hand each VP on as soon as
/// it is parsed. `record` writes `t` before the partitions and a partition's identity before its
/// VPs; a line whose keys come in another order (rewritten by a tool) still reads: its `t` is
/// found first, and a partition's VPs wait for its identity.
mod stream {
    use std::fmt;

    use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

    use super::{Header, VpAt, VpSample, fits};

    type Visit<'v> = dyn FnMut(VpAt<'_>) + 'v;

    pub(super) struct SampleSeed<'h, 'v, 'f> {
        pub header: &'h Header,
        /// The sample's time when known before parsing.
        pub t: Option<f64>,
        /// Set when the partitions came before `t` (and `t` was not known): nothing was visited.
        pub t_late: &'f mut bool,
        pub visit: &'f mut Visit<'v>,
    }

    impl<'de> DeserializeSeed<'de> for SampleSeed<'_, '_, '_> {
        type Value = f64;
        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<f64, D::Error> {
            d.deserialize_map(self)
        }
    }

    impl<'de> Visitor<'de> for SampleSeed<'_, '_, '_> {
        type Value = f64;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a sample")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<f64, A::Error> {
            let (mut t, mut partitions) = (self.t, false);
            while let Some(key) = map.next_key::<String>()? {
                match key.as_str() {
                    "t" => t = Some(map.next_value::<f64>()?),
                    "partitions" => {
                        let Some(t) = t else {
                            *self.t_late = true;
                            return Err(de::Error::custom("\"partitions\" before \"t\""));
                        };
                        map.next_value_seed(Partitions { t, header: self.header, visit: &mut *self.visit })?;
                        partitions = true;
                    }
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            match (t, partitions) {
                (Some(t), true) => Ok(t),
                (None, _) => Err(de::Error::missing_field("t")),
                (_, false) => Err(de::Error::missing_field("partitions")),
            }
        }
    }

    struct Partitions<'h, 'v, 'f> {
        t: f64,
        header: &'h Header,
        visit: &'f mut Visit<'v>,
    }

    impl<'de> DeserializeSeed<'de> for Partitions<'_, '_, '_> {
        type Value = ();
        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_seq(self)
        }
    }

    impl<'de> Visitor<'de> for Partitions<'_, '_, '_> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of partitions")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while seq
                .next_element_seed(Partition { t: self.t, header: self.header, visit: &mut *self.visit })?
                .is_some()
            {}
            Ok(())
        }
    }

    struct Partition<'h, 'v, 'f> {
        t: f64,
        header: &'h Header,
        visit: &'f mut Visit<'v>,
    }

    impl<'de> DeserializeSeed<'de> for Partition<'_, '_, '_> {
        type Value = ();
        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_map(self)
        }
    }

    impl<'de> Visitor<'de> for Partition<'_, '_, '_> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a partition")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            let (mut vm, mut instance, mut partition) = (None::<String>, None::<String>, None::<u64>);
            let mut early: Option<Vec<VpSample>> = None;
            while let Some(key) = map.next_key::<String>()? {
                match key.as_str() {
                    "vm" => vm = Some(map.next_value()?),
                    "instance" => instance = Some(map.next_value()?),
                    "partition" => partition = Some(map.next_value()?),
                    "values" => {
                        let values: Option<Vec<Option<u64>>> = map.next_value()?;
                        if values.is_some_and(|v| v.len() != self.header.catalog.partition.len()) {
                            return Err(de::Error::custom(
                                "a sample's values do not match the header's counters",
                            ));
                        }
                    }
                    "vps" => {
                        let (Some(vm), Some(instance), Some(partition)) = (&vm, &instance, partition) else {
                            // The VPs before the partition's identity (keys in another order than
                            // `record` writes): this partition's VPs are kept until it is known.
                            early = Some(map.next_value::<Vec<VpSample>>()?);
                            continue;
                        };
                        map.next_value_seed(Vps {
                            t: self.t,
                            vm,
                            instance,
                            partition,
                            header: self.header,
                            visit: &mut *self.visit,
                        })?;
                    }
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            if let Some(vps) = early {
                let (Some(vm), Some(instance), Some(partition)) = (&vm, &instance, partition) else {
                    return Err(de::Error::custom("a partition without its vm, instance or id"));
                };
                for vp in vps {
                    if !fits(self.header, &vp) {
                        return Err(de::Error::custom(
                            "a sample's values do not match the header's counters",
                        ));
                    }
                    let at = VpAt { t: self.t, vm, instance, partition, vp };
                    (self.visit)(at);
                }
            }
            Ok(())
        }
    }

    struct Vps<'a, 'v, 'f> {
        t: f64,
        vm: &'a str,
        instance: &'a str,
        partition: u64,
        header: &'a Header,
        visit: &'f mut Visit<'v>,
    }

    impl<'de> DeserializeSeed<'de> for Vps<'_, '_, '_> {
        type Value = ();
        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_seq(self)
        }
    }

    impl<'de> Visitor<'de> for Vps<'_, '_, '_> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of VPs")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while let Some(vp) = seq.next_element::<VpSample>()? {
                if !fits(self.header, &vp) {
                    return Err(de::Error::custom("a sample's values do not match the header's counters"));
                }
                let at =
                    VpAt { t: self.t, vm: self.vm, instance: self.instance, partition: self.partition, vp };
                (self.visit)(at);
            }
            Ok(())
        }
    }
}

/// Line `n` of `input` (with its newline, if it has one), at most `max` bytes; `None` at the
/// end.
fn read_line(input: &mut impl BufRead, n: usize, max: usize) -> Result<Option<Vec<u8>>, RecordingError> {
    let mut line = Vec::new();
    let read = std::io::Read::take(input, max as u64 + 1)
        .read_until(b'\n', &mut line)
        .map_err(RecordingError::Read)?;
    if read == 0 {
        return Ok(None);
    }
    match n {
        _ if line.len() <= max => Ok(Some(line)),
        1 => Err(RecordingError::HeaderTooLong(max)),
        _ => Err(RecordingError::LineTooLong { line: n, max }),
    }
}

impl Header {
    /// True when the recording carries the VPs' histograms (format version 2 and later).
    pub fn has_histograms(&self) -> bool {
        self.version >= 2
    }

    /// The VP counters with this build's catalog rows (unknown names are `None`), looked up in
    /// one table of the catalog: linear in the header, however long a hostile one is.
    pub fn vp_counters(&self) -> Vec<(&CounterInfo, Option<&'static Counter>)> {
        let catalog: std::collections::HashMap<&str, &'static Counter> =
            counters_of(ObjectKind::Vp).map(|c| (c.name, c)).collect();
        self.catalog.vp.iter().map(|c| (c, catalog.get(c.name.as_str()).copied())).collect()
    }

    /// Where the VPs' publication time is in the header's VP order (`None` in a recording made
    /// before pages carried one).
    pub fn vp_published_at(&self) -> Option<usize> {
        let name = hvstats_abi::catalog::vp::PUBLISHED.counter()?.name;
        self.catalog.vp.iter().position(|c| c.name == name)
    }

    /// Where each VP counter's paired count (a cost's count) is in the header's VP order,
    /// found through one table of names: linear in the header.
    pub fn vp_paired_at(&self) -> Vec<Option<usize>> {
        let mut at: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        for (i, c) in self.catalog.vp.iter().enumerate() {
            at.entry(c.name.as_str()).or_insert(i);
        }
        self.vp_counters()
            .iter()
            .map(|(_, c)| at.get(c.and_then(|c| c.paired_count())?.name).copied())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use hvstats::snapshot::ObjectReading;

    use super::*;
    use hvstats_testkit::synthetic_instance;

    /// The bytes one VP adds to a sample line.
    fn vp_bytes(values: u64, histogram_slots: u64) -> usize {
        let mut reading = hvstats_present::live::Reading::of(vec![synthetic_instance(1, 1)]);
        let vp = &mut reading.instances[0].partitions[0].vps[0];
        let ObjectReading::Counters(counters) = &mut vp.reading else { unreachable!() };
        counters.iter_mut().for_each(|(_, v)| *v = values);
        let full = Log2Histogram { sum_ns: histogram_slots, buckets: [histogram_slots; BUCKETS] };
        vp.histograms = vp_histograms().map(|c| (c, full)).collect();
        let with = serde_json::to_vec(&Sample::of(&reading, 1.0)).unwrap().len();
        reading.instances[0].partitions[0].vps.clear();
        with - serde_json::to_vec(&Sample::of(&reading, 1.0)).unwrap().len()
    }

    #[test]
    fn a_sample_stays_bounded_per_vp_and_an_idle_histogram_costs_a_few_bytes() {
        let largest = vp_bytes(u64::MAX, u64::MAX);
        assert!(largest * 16_384 < MAX_LINE, "{largest} bytes per VP");
        // 100,000 VPs with every counter in the billions, histograms idle.
        let busy = vp_bytes(1_000_000_000, 0);
        assert!(busy * 100_000 < MAX_LINE, "{busy} bytes per VP");
        // Each histogram at its largest: its sum and every bucket, 20 digits each.
        assert!(largest > vp_histograms().count() * HISTOGRAM_SLOTS * 20, "{largest}");
        // Idle histograms: `[0]` each.
        let idle = vp_bytes(0, 0);
        let counters = counters_of(ObjectKind::Vp).count();
        assert!(idle <= 2 * counters + 4 * vp_histograms().count() + 64, "{idle} bytes for an idle VP");
    }

    #[test]
    fn histograms_round_trip_with_trailing_zero_buckets_left_out() {
        let mut h = Log2Histogram::default();
        h.record(700);
        h.record(3_000_000);
        let slots = compact(&h);
        assert_eq!(slots.len(), 1 + hvstats_abi::histogram::bucket_of(3_000_000) + 1);
        let vp = VpSample {
            vp: 0,
            values: None,
            unreadable: None,
            histograms: Some(vec![None, Some(slots)]),
            run_loop_live: false,
        };
        assert_eq!(vp.histogram(1), Some(h));
        assert_eq!(vp.histogram(0), None);
        assert_eq!(vp.histogram(2), None);
        let too_long = VpSample { histograms: Some(vec![Some(vec![0; HISTOGRAM_SLOTS + 1])]), ..vp };
        assert_eq!(too_long.histogram(0), None);
    }
}
