//! The recording file of `record`, read by `report` and `plot`: newline-delimited JSON.
//!
//! The first line is a header naming the format, the hvstats and group versions, the sampling
//! interval and, for partitions and VPs, every catalog counter in the order the samples list their
//! values (with unit, presentation and whether KVM maintains it), so a file can be read without
//! this build's catalog. Each further line is one sample: seconds since the start and, per
//! partition of every live instance, its values and its VPs' values. A sample is written in one
//! piece and flushed, so a recording cut short (Ctrl-C, a killed process) is valid up to its last
//! whole line.

use std::io::{BufRead, Write};

use anyhow::Context;
use hvstats::snapshot::ObjectReading;
use hvstats_abi::catalog::counters_of;
use hvstats_abi::{Counter, GroupKind, ObjectKind};
use serde::{Deserialize, Serialize};

use crate::cmd::live::{Live, Reading};

/// The `format` of the header.
pub const FORMAT: &str = "hvstats-recording";

/// The version of the format this build writes and reads.
pub const VERSION: u32 = 1;

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

    /// The catalog row of the same name, when this build knows it.
    pub fn counter(&self, kind: ObjectKind) -> Option<&'static Counter> {
        hvstats_abi::catalog::counter_by_name(kind, &self.name)
    }
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
}

/// The first line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// [`FORMAT`].
    pub format: String,
    /// [`VERSION`].
    pub version: u32,
    /// The sampling interval asked for.
    pub interval_seconds: f64,
    /// When the recording started.
    pub started_unix_ms: u64,
    /// The counters.
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
            },
        }
    }
}

/// One VP in a sample.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VpSample {
    /// The VP index.
    pub vp: u32,
    /// Values in the header's VP order (`null` for a counter the publisher declares unavailable);
    /// absent when the page could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<Option<u64>>>,
    /// Why the page could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreadable: Option<String>,
}

/// One partition in a sample.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PartitionSample {
    /// The VM name (`instance:partition`).
    pub vm: String,
    /// The publishing instance.
    pub instance: String,
    /// The partition id.
    pub partition: u64,
    /// True while active.
    pub active: bool,
    /// Values in the header's partition order (`null` when unavailable); absent when unreadable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Vec<Option<u64>>>,
    /// The VPs.
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
            .map(|(i, p)| PartitionSample {
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
                        VpSample { vp: vp.index, values, unreadable }
                    })
                    .collect(),
            })
            .collect();
        Self { t, partitions }
    }
}

/// Writes one JSON line and flushes it.
///
/// # Errors
/// When writing fails (a full disk).
pub fn write_line(out: &mut impl Write, value: &impl Serialize) -> anyhow::Result<()> {
    let mut line = serde_json::to_vec(value)?;
    line.push(b'\n');
    out.write_all(&line)?;
    out.flush()?;
    Ok(())
}

/// A recording read back.
#[derive(Clone, Debug)]
pub struct Recording {
    /// The header.
    pub header: Header,
    /// The samples, in time order.
    pub samples: Vec<Sample>,
}

/// The longest line accepted: a sample of 65,536 VPs with 65 values each fits with room.
const MAX_LINE: usize = 256 << 20;

impl Recording {
    /// Reads a recording. A last line without its newline (a recorder killed mid-write) is
    /// ignored; anything else malformed is an error naming the line.
    ///
    /// # Errors
    /// When the file cannot be read, is not a recording of this format, or a sample is malformed.
    pub fn read(mut input: impl BufRead) -> anyhow::Result<Self> {
        let mut lines = Vec::new();
        loop {
            let mut line = Vec::new();
            let n = std::io::Read::take(&mut input, MAX_LINE as u64 + 1).read_until(b'\n', &mut line)?;
            if n == 0 {
                break;
            }
            anyhow::ensure!(
                line.len() <= MAX_LINE,
                "line {} is longer than {MAX_LINE} bytes",
                lines.len() + 1
            );
            lines.push(line);
        }
        let Some(first) = lines.first() else { anyhow::bail!("the file is empty: not a recording") };
        let header: Header = serde_json::from_slice(first).context("line 1 is not a recording header")?;
        anyhow::ensure!(header.format == FORMAT, "line 1: format {:?}, not {FORMAT:?}", header.format);
        anyhow::ensure!(
            header.version == VERSION,
            "line 1: recording format version {} (this hvstats reads version {VERSION})",
            header.version
        );
        let last = lines.len() - 1;
        let mut samples = Vec::new();
        for (i, line) in lines.iter().enumerate().skip(1) {
            if i == last && !line.ends_with(b"\n") {
                break;
            }
            let sample: Sample =
                serde_json::from_slice(line).with_context(|| format!("line {} is not a sample", i + 1))?;
            for p in &sample.partitions {
                let bad = p.values.as_ref().is_some_and(|v| v.len() != header.catalog.partition.len())
                    || p.vps
                        .iter()
                        .any(|vp| vp.values.as_ref().is_some_and(|v| v.len() != header.catalog.vp.len()));
                anyhow::ensure!(!bad, "line {}: a sample's values do not match the header's counters", i + 1);
            }
            samples.push(sample);
        }
        Ok(Self { header, samples })
    }

    /// The VP counters with this build's catalog rows (unknown names are `None`).
    pub fn vp_counters(&self) -> Vec<(&CounterInfo, Option<&'static Counter>)> {
        self.header.catalog.vp.iter().map(|c| (c, c.counter(ObjectKind::Vp))).collect()
    }
}
