//! The scrape of a large host as a `bench --json` row: encoding `/metrics` for 65,536 VPs next to
//! the JSON of `snapshot --json` for the same reading.
//!
//! The reading is built in memory (every VP with every counter, distinct values), so the row
//! measures what `serve` adds to a scrape — walking the objects, labels and the text encoding —
//! independently of how pages are mapped.

use std::time::{Duration, Instant};

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
            reading: counters(u64::from(p), ObjectKind::Partition),
            vps: (0..vps_each)
                .map(|index| VpSnapshot {
                    index,
                    reading: counters(u64::from(p * vps_each + index), ObjectKind::Vp),
                })
                .collect(),
        })
        .collect();
    let instance = InstanceSnapshot {
        name: "4242-1-0".into(),
        pid: 4242,
        hypervisor: counters(0, ObjectKind::Hypervisor),
        lps: Vec::new(),
        partitions,
    };
    Reading { at: Instant::now(), instances: vec![instance], problems: Vec::new() }
}

fn median_of(runs: usize, mut f: impl FnMut() -> usize) -> (Duration, usize) {
    let mut times = Vec::with_capacity(runs);
    let mut size = 0;
    for _ in 0..runs {
        let start = Instant::now();
        size = std::hint::black_box(f());
        times.push(start.elapsed());
    }
    times.sort();
    (times[runs / 2], size)
}

/// The rows: `/metrics` for `partitions × vps_each` VPs exported one by one, and with the default
/// cap (partition sums past 4,096 VPs), each against `snapshot --json` of the same reading.
///
/// # Errors
/// When encoding fails.
pub fn scrape_rows(partitions: u32, vps_each: u32, runs: usize) -> anyhow::Result<Vec<Value>> {
    let reading = synthetic_reading(partitions, vps_each);
    let vps = reading.vp_count();
    let (baseline, _) = median_of(runs, || {
        let instances: Vec<Value> =
            reading.instances.iter().map(crate::cmd::snapshot::snapshot_json).collect();
        json!({ "instances": instances }).to_string().len()
    });
    let mut rows = Vec::new();
    for (name, cap) in [("one by one", usize::MAX), ("capped at 4096", 4096)] {
        let mut failed = None;
        let (ours, bytes) = median_of(runs, || match Exposition::new(reading.clone(), cap).encode() {
            Ok(text) => text.len(),
            Err(e) => {
                failed = Some(e);
                0
            }
        });
        if let Some(e) = failed {
            anyhow::bail!("encoding the exposition failed: {e}");
        }
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        rows.push(json!({
            "name": format!("serve /metrics scrape of {vps} VPs, {name} ({bytes} bytes) vs snapshot --json"),
            "ours": ms(ours),
            "baseline": ms(baseline),
            "unit": "ms",
            "ratio": ms(ours) / ms(baseline),
        }));
    }
    Ok(rows)
}
