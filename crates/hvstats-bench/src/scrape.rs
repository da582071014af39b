//! The scrape of a large host: encoding `/metrics` for 65,536 VPs next to the JSON of
//! `snapshot --json` for the same reading.
//!
//! The reading is built in memory (every VP with every counter, distinct values:
//! [`hvstats_testkit::synthetic_instance`]), so the row measures what `serve` adds to a scrape —
//! walking the objects, labels and the text encoding — independently of how pages are mapped.
//! Both encodings belong to the command's surfaces, which supply them as [`ScrapeEncoders`].

use std::time::Instant;

use hvstats::snapshot::InstanceSnapshot;

use crate::error::BenchError;
use crate::row::{Row, median};

/// The row with every VP exported one by one.
pub const ONE_BY_ONE_ROW: &str = "serve-scrape-65536-vps-one-by-one-vs-snapshot-json";
/// The row with the exporter's default cap (partition sums past it).
pub const CAPPED_ROW: &str = "serve-scrape-65536-vps-capped-vs-snapshot-json";
/// Both rows.
pub const ROWS: [&str; 2] = [ONE_BY_ONE_ROW, CAPPED_ROW];

/// A boxed error of an encoder.
pub type EncodeError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The two encodings the scrape rows compare, of one reading the encoder holds.
pub trait ScrapeEncoders {
    /// Takes the reading both encodings encode, once, before anything is timed.
    fn load(&mut self, instances: Vec<InstanceSnapshot>);
    /// Encodes `/metrics` of the reading with at most `max_vps` VPs exported one by one; its size.
    ///
    /// # Errors
    /// When the encoding fails.
    fn metrics(&self, max_vps: usize) -> Result<usize, EncodeError>;
    /// Encodes `snapshot --json` of the reading; its size.
    fn snapshot_json(&self) -> usize;
    /// The exporter's default cap on VPs exported one by one.
    fn default_max_vps(&self) -> usize;
}

/// The rows for 65,536 VPs (4,096 partitions of 16): `/metrics` with every VP exported one by
/// one, and with the default cap, each against `snapshot --json` of the same reading; medians
/// of `rounds`, interleaved.
///
/// # Errors
/// When encoding fails.
pub fn scrape_rows(rounds: u32, encoders: &mut dyn ScrapeEncoders) -> Result<Vec<Row>, BenchError> {
    rows_for(4096, 16, rounds, encoders)
}

/// [`scrape_rows`] for `partitions × vps_each` VPs (the rows keep their names).
///
/// # Errors
/// When encoding fails.
pub fn rows_for(
    partitions: u32,
    vps_each: u32,
    rounds: u32,
    encoders: &mut dyn ScrapeEncoders,
) -> Result<Vec<Row>, BenchError> {
    encoders.load(vec![hvstats_testkit::synthetic_instance(partitions, vps_each)]);
    let encoders: &dyn ScrapeEncoders = encoders;
    let mut rows = Vec::new();
    for (name, cap) in [(ONE_BY_ONE_ROW, usize::MAX), (CAPPED_ROW, encoders.default_max_vps())] {
        let (mut ours, mut baseline) = (Vec::new(), Vec::new());
        for round in 0..rounds.max(1) {
            let exposition = || -> Result<f64, BenchError> {
                let start = Instant::now();
                std::hint::black_box(
                    encoders
                        .metrics(cap)
                        .map_err(|source| BenchError::Step { step: "encoding /metrics".into(), source })?,
                );
                Ok(start.elapsed().as_secs_f64() * 1e3)
            };
            let json_ms = || {
                let start = Instant::now();
                std::hint::black_box(encoders.snapshot_json());
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
        rows.push(Row::Measured {
            name,
            ours: median(ours),
            baseline: median(baseline),
            unit: "ms",
            goal: None,
        });
    }
    Ok(rows)
}
