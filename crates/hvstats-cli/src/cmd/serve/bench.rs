//! The scrape of a large host as a `bench --json` row: encoding `/metrics` for 65,536 VPs next to
//! the JSON of `snapshot --json` for the same reading.
//!
//! The reading is built in memory (every VP with every counter, distinct values), so the row
//! measures what `serve` adds to a scrape — walking the objects, labels and the text encoding —
//! independently of how pages are mapped.

use std::time::Instant;

use hvstats::snapshot::{InstanceSnapshot, ObjectReading, PartitionSnapshot, VpSnapshot};
use hvstats_abi::ObjectKind;
use hvstats_abi::catalog::counters_of;
use serde_json::{Value, json};

use super::exposition::Exposition;
use crate::cmd::live::Reading;

/// A reading of one instance with `partitions` partitions of `vps_each` VPs, every counter set.
pub fn synthetic_reading(partitions: u32, vps_each: u32) -> Reading {
    let counters = |seed: u64, kind| {
        ObjectReading::Counters(
            counters_of(kind).enumerate().map(|(i, c)| (c, seed * 1000 + i as u64)).collect(),
        )
    };
    let partitions = (0..partitions)
        .map(|p| PartitionSnapshot {
            id: u64::from(p) + 1,
            active: true,
            name: String::new(),
            vmm: None,
            stopped: None,
            reading: counters(u64::from(p), ObjectKind::Partition),
            vps: (0..vps_each)
                .map(|index| VpSnapshot {
                    index,
                    reading: counters(u64::from(p * vps_each + index), ObjectKind::Vp),
                    histograms: Vec::new(),
                })
                .collect(),
        })
        .collect();
    let instance = InstanceSnapshot {
        name: "4242-1-0".into(),
        pid: 4242,
        description: Default::default(),
        hypervisor: counters(0, ObjectKind::Hypervisor),
        lps: Vec::new(),
        partitions,
        unmapped: None,
    };
    Reading { at: Instant::now(), instances: vec![instance], problems: Vec::new(), failed: Vec::new() }
}

/// One side-by-side measurement, in the shape of `bench --json` rows.
#[derive(Clone, Debug, PartialEq)]
pub struct ScrapeRow {
    /// The row's name.
    pub name: &'static str,
    /// Milliseconds to encode `/metrics`.
    pub ours: f64,
    /// Milliseconds to encode `snapshot --json` of the same reading.
    pub baseline: f64,
    /// `ms`.
    pub unit: &'static str,
}

/// The rows for 65,536 VPs (4,096 partitions of 16): `/metrics` with every VP exported one by
/// one, and with the default cap (partition sums past 4,096 VPs), each against `snapshot --json`
/// of the same reading; medians of `rounds`, interleaved.
///
/// # Errors
/// When encoding fails.
pub fn scrape_rows(rounds: u32) -> anyhow::Result<Vec<ScrapeRow>> {
    rows_for(4096, 16, rounds)
}

/// [`scrape_rows`] for `partitions × vps_each` VPs.
///
/// # Errors
/// When encoding fails.
pub fn rows_for(partitions: u32, vps_each: u32, rounds: u32) -> anyhow::Result<Vec<ScrapeRow>> {
    let reading = std::sync::Arc::new(synthetic_reading(partitions, vps_each));
    let snapshot_json = || {
        let instances: Vec<Value> =
            reading.instances.iter().map(crate::snapshot_json::snapshot_json).collect();
        json!({ "instances": instances }).to_string().len()
    };
    let mut rows = Vec::new();
    for (name, cap) in [
        ("serve-scrape-65536-vps-one-by-one-vs-snapshot-json", usize::MAX),
        ("serve-scrape-65536-vps-capped-vs-snapshot-json", serve_default_cap()),
    ] {
        let (mut ours, mut baseline) = (Vec::new(), Vec::new());
        for round in 0..rounds.max(1) {
            let exposition = || -> anyhow::Result<f64> {
                let start = Instant::now();
                std::hint::black_box(Exposition::new(reading.clone(), cap).encode()?);
                Ok(start.elapsed().as_secs_f64() * 1e3)
            };
            let json_ms = || {
                let start = Instant::now();
                std::hint::black_box(snapshot_json());
                start.elapsed().as_secs_f64() * 1e3
            };
            if round % 2 == 0 {
                ours.push(exposition()?);
                baseline.push(json_ms());
            } else {
                baseline.push(json_ms());
                ours.push(exposition()?);
            }
        }
        rows.push(ScrapeRow { name, ours: median(ours), baseline: median(baseline), unit: "ms" });
    }
    Ok(rows)
}

fn serve_default_cap() -> usize {
    super::DEFAULT_MAX_VPS
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_measure_both_sides_of_the_same_reading() {
        let rows = rows_for(4, 3, 1).unwrap();
        assert_eq!(rows.len(), 2);
        for row in &rows {
            assert!(row.ours > 0.0 && row.baseline > 0.0, "{row:?}");
            assert_eq!(row.unit, "ms");
        }
        assert_eq!(synthetic_reading(4, 3).vp_count(), 12);
    }
}
