//! The scrape of a large host: encoding `/metrics` for 65,536 VPs next to the JSON of
//! `snapshot --json` for the same reading.
//!
//! The reading is built in memory (every VP with every counter, distinct values:
//! [`hvstats_testkit::synthetic_instance`]), so the rows measure what `serve` adds to a scrape —
//! walking the objects, labels and the text encoding — independently of how pages are mapped,
//! with the encoders `serve` and `snapshot` use ([`hvstats_present`]), each timed in the CPU time
//! of the thread encoding.

use hvstats_present::collectors::{Collector, Selection};
use hvstats_present::exposition::{DEFAULT_MAX_VPS, Exposition};
use hvstats_present::live::Reading;
use std::sync::Arc;

use crate::error::{BenchError, Step};
use crate::row::{CpuClock, Pace, Plan, Rounds, Row};

/// The row with every VP exported one by one.
pub const ONE_BY_ONE_ROW: &str = "serve-scrape-65536-vps-one-by-one-vs-snapshot-json";
/// The row with the exporter's default cap (partition sums past it).
pub const CAPPED_ROW: &str = "serve-scrape-65536-vps-capped-vs-snapshot-json";
/// Both rows.
pub const ROWS: [&str; 2] = [ONE_BY_ONE_ROW, CAPPED_ROW];

/// `/metrics` of `reading` with at most `max_vps` VPs exported one by one, every collector on but
/// `created`.
///
/// # Errors
/// When encoding fails.
pub fn metrics(reading: &Arc<Reading>, max_vps: usize) -> Result<String, BenchError> {
    // Every collector but `created`: the rows that set this encoder beside the prometheus-client
    // library encode the same families, and the library's text has no `_created` samples.
    Exposition::new(Arc::clone(reading), max_vps)
        .collect(Selection::all().without(Collector::Created))
        .encode()
        .step("encoding /metrics")
}

/// The body of `serve`'s `GET /api/v1/snapshot` (the JSON of `snapshot --json`) for `reading`,
/// written as `serve` writes it.
pub fn snapshot_body(reading: &Reading) -> Vec<u8> {
    let mut body = Vec::new();
    // Writing to memory cannot fail.
    let _ = hvstats_present::snapshot_json::write_instances(&reading.instances, &mut body);
    body
}

/// Series (sample lines) of an exposition.
pub fn series(exposition: &str) -> usize {
    exposition.lines().filter(|l| !l.is_empty() && !l.starts_with('#')).count()
}

/// The rows for 65,536 VPs (4,096 partitions of 16): `/metrics` with every VP exported one by
/// one, and with the exporter's default cap, each against `snapshot --json` of the same reading.
///
/// # Errors
/// When encoding fails.
pub fn scrape_rows(plan: &Plan<'_>) -> Result<Vec<Row>, BenchError> {
    rows_for(4096, 16, plan)
}

/// [`scrape_rows`] for `partitions × vps_each` VPs (the rows keep their names). Each row's facts:
/// the exposition's series and bytes, the JSON's bytes, and both per VP.
///
/// # Errors
/// When encoding fails.
pub fn rows_for(partitions: u32, vps_each: u32, plan: &Plan<'_>) -> Result<Vec<Row>, BenchError> {
    let reading = Arc::new(Reading::of(vec![hvstats_testkit::synthetic_instance(partitions, vps_each)]));
    let vps = reading.vp_count().max(1) as f64;
    let mut rows = Vec::new();
    for (name, cap) in [(ONE_BY_ONE_ROW, usize::MAX), (CAPPED_ROW, DEFAULT_MAX_VPS)] {
        let (mut rounds, mut sizes) = (Rounds::default(), (0, 0, 0));
        for round in 0..plan.start(&[name], Pace::Slow) {
            let mut exposition = || -> Result<f64, BenchError> {
                let start = CpuClock::now();
                let text = std::hint::black_box(metrics(&reading, cap)?);
                let ms = start.elapsed().as_secs_f64() * 1e3;
                sizes.0 = series(&text);
                sizes.1 = text.len();
                Ok(ms)
            };
            let mut json_ms = || {
                let start = CpuClock::now();
                sizes.2 = std::hint::black_box(snapshot_body(&reading)).len();
                start.elapsed().as_secs_f64() * 1e3
            };
            if round % 2 == 0 {
                rounds.ours.push(exposition()?);
                rounds.baseline.push(json_ms());
            } else {
                rounds.baseline.push(json_ms());
                rounds.ours.push(exposition()?);
            }
            plan.tick();
        }
        let (series, bytes, json_bytes) = (sizes.0 as f64, sizes.1 as f64, sizes.2 as f64);
        let facts = vec![
            ("series", series),
            ("bytes", bytes),
            ("json_bytes", json_bytes),
            ("bytes_per_vp", bytes / vps),
            ("json_bytes_per_vp", json_bytes / vps),
            ("json_ns_per_vp", crate::row::median(rounds.baseline.clone()) * 1e6 / vps),
        ];
        rows.push(Row::Measured { name, rounds, unit: "ms", goal: None, facts });
    }
    Ok(rows)
}
