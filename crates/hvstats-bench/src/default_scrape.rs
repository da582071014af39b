//! What a fleet's Prometheus pays for one host: the default scrape (the collectors on by
//! default, what the shipped mixin reads) of 100 VMs of 4 VPs, published in a real instance and
//! read as `serve` reads it, against the scrape of every collector of the same reading.
//!
//! The row's facts are the default scrape's size, as Prometheus pays for it: its series, those
//! per VP, its bytes and its bytes gzipped as `serve` gzips them. The goals are facts' too: at
//! most 20 series per VP, 11,000 series, 1 MB and 100 KB gzipped.
//!
//! [`FLEET_ROW`]: the default scrape of a big host, 1,000 VMs of 4 VPs, encoded and gzipped (as
//! a Prometheus that asks for gzip gets it) against encoded alone (plain), in ms of CPU; its
//! facts are both sizes. The goal is absolute: our side's median at most 50 ms.

use std::io::Write;
use std::sync::Arc;

use flate2::Compression;
use flate2::write::GzEncoder;
use hvstats_present::collectors::Selection;
use hvstats_present::exposition::{DEFAULT_MAX_VPS, Exposition};
use hvstats_present::live::{Live, Reading};

use crate::authority::TempRuntime;
use crate::error::{BenchError, Step};
use crate::row::{CpuClock, Pace, Plan, Rounds, Row};
use crate::scrape::series;

/// The row.
pub const ROW: &str = "serve-scrape-default-100-vms-x4-vps-vs-every-collector";
/// VMs of the host.
pub const VMS: u32 = 100;
/// VPs of each.
pub const VPS_EACH: u32 = 4;
/// The row of a big host's default scrape, gzipped against plain.
pub const FLEET_ROW: &str = "serve-scrape-default-1000-vms-x4-vps-gzip-vs-plain";
/// VMs of [`FLEET_ROW`]'s host.
pub const FLEET_VMS: u32 = 1000;

/// `/metrics` of `reading` with the collectors of `selection`.
fn text(reading: &Arc<Reading>, selection: Selection) -> Result<String, BenchError> {
    Exposition::new(Arc::clone(reading), DEFAULT_MAX_VPS)
        .collect(selection)
        .encode()
        .step("encoding /metrics")
}

/// `text` gzipped as `serve` gzips it (the fastest level).
///
/// # Errors
/// When the compressor fails (it writes to memory: it does not).
pub fn gzipped(text: &str) -> Result<Vec<u8>, BenchError> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    gz.write_all(text.as_bytes()).step("gzipping /metrics")?;
    gz.finish().step("gzipping /metrics")
}

/// The sizes of a scrape: series, series with a `vp` label of a VP's index per VP, bytes, gzipped
/// bytes.
///
/// # Errors
/// When gzipping fails.
pub fn sizes(text: &str, vps: usize) -> Result<[f64; 4], BenchError> {
    let per_vp = text
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains("vp=\"") && !l.contains("vp=\"all\""))
        .count();
    Ok([
        series(text) as f64,
        per_vp as f64 / vps.max(1) as f64,
        text.len() as f64,
        gzipped(text)?.len() as f64,
    ])
}

/// The row: the default scrape encoded and gzipped, against every collector's encoded and
/// gzipped, of one reading of `vms` VMs of `vps_each` VPs.
///
/// # Errors
/// When the host cannot be published, read or encoded.
pub fn default_scrape_row(plan: &Plan<'_>, vms: u32, vps_each: u32) -> Result<Row, BenchError> {
    let rt = TempRuntime::new("default-scrape")?;
    let (_hv, _partitions) = crate::fleet::publish_fleet(&rt, vms, vps_each)?;
    let reading = Arc::new(Live::new(Some(rt.path().to_owned())).read().step("reading the host")?);
    let vps = reading.vp_count();
    let default = text(&reading, Selection::defaults())?;
    let [series, per_vp, bytes, gzip_bytes] = sizes(&default, vps)?;
    let every = text(&reading, Selection::all())?;
    let [every_series, _, every_bytes, every_gzip] = sizes(&every, vps)?;
    let mut rounds = Rounds::default();
    for round in 0..plan.start(&[ROW], Pace::Quick) {
        let measure = |selection| -> Result<f64, BenchError> {
            let start = CpuClock::now();
            std::hint::black_box(gzipped(&text(&reading, selection)?)?);
            Ok(start.elapsed().as_secs_f64() * 1e3)
        };
        if round % 2 == 0 {
            rounds.ours.push(measure(Selection::defaults())?);
            rounds.baseline.push(measure(Selection::all())?);
        } else {
            rounds.baseline.push(measure(Selection::all())?);
            rounds.ours.push(measure(Selection::defaults())?);
        }
        plan.tick();
    }
    Ok(Row::Measured {
        name: ROW,
        rounds,
        unit: "ms",
        goal: None,
        facts: vec![
            ("series", series),
            ("series_per_vp", per_vp),
            ("bytes", bytes),
            ("gzip_bytes", gzip_bytes),
            ("every_collector_series", every_series),
            ("every_collector_bytes", every_bytes),
            ("every_collector_gzip_bytes", every_gzip),
        ],
    })
}

/// [`FLEET_ROW`] of `vms` VMs of `vps_each` VPs: the default scrape encoded then gzipped (ours)
/// against encoded alone (the baseline), in ms of CPU, in ABBA order.
///
/// # Errors
/// When the host cannot be published, read or encoded.
pub fn gzip_row(plan: &Plan<'_>, vms: u32, vps_each: u32) -> Result<Row, BenchError> {
    let rt = TempRuntime::new("default-scrape-fleet")?;
    let (_hv, _partitions) = crate::fleet::publish_fleet(&rt, vms, vps_each)?;
    let reading = Arc::new(Live::new(Some(rt.path().to_owned())).read().step("reading the host")?);
    let [series, per_vp, bytes, gzip_bytes] =
        sizes(&text(&reading, Selection::defaults())?, reading.vp_count())?;
    let measure = |gzip: bool| -> Result<f64, BenchError> {
        let start = CpuClock::now();
        let plain = text(&reading, Selection::defaults())?;
        if gzip {
            std::hint::black_box(gzipped(&plain)?);
        }
        std::hint::black_box(plain);
        Ok(start.elapsed().as_secs_f64() * 1e3)
    };
    let mut rounds = Rounds::default();
    for round in 0..plan.start(&[FLEET_ROW], Pace::Quick) {
        let first = round % 2 == 0;
        let a = measure(first)?;
        let b = measure(!first)?;
        let (gz, plain) = if first { (a, b) } else { (b, a) };
        rounds.ours.push(gz);
        rounds.baseline.push(plain);
        plan.tick();
    }
    Ok(Row::Measured {
        name: FLEET_ROW,
        rounds,
        unit: "ms",
        goal: None,
        facts: vec![
            ("vps", reading.vp_count() as f64),
            ("series", series),
            ("series_per_vp", per_vp),
            ("bytes", bytes),
            ("gzip_bytes", gzip_bytes),
            ("goal_ms", 50.0),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_scrape_of_100_vms_of_4_vps_is_within_its_goals() {
        let reading = Arc::new(Reading::of(vec![hvstats_testkit::synthetic_instance(VMS, VPS_EACH)]));
        let [series, per_vp, bytes, gzip_bytes] =
            sizes(&text(&reading, Selection::defaults()).unwrap(), (VMS * VPS_EACH) as usize).unwrap();
        assert!((10.0..=20.0).contains(&per_vp), "{per_vp} series per VP");
        assert!(series <= 11_000.0, "{series} series");
        assert!(bytes <= 1e6, "{bytes} bytes");
        assert!(gzip_bytes <= 100e3, "{gzip_bytes} bytes gzipped");
        let [every, ..] = sizes(&text(&reading, Selection::all()).unwrap(), 400).unwrap();
        eprintln!(
            "default: {series} series, {per_vp} per VP, {bytes} bytes, {gzip_bytes} gzipped; every collector: {every} series"
        );
        assert!(every > 2.0 * series, "{every} series with every collector, {series} by default");
    }
}
