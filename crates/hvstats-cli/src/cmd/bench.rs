//! `hvstats bench`: what hvstats costs, each figure measured side by side with its baseline in
//! the same run. The rows are measured by `hvstats-bench` (see its documentation for what each
//! compares); this command parses the options, lends the exporter's and the snapshot's encoders
//! to the scrape rows, and prints the rows: a table marking each `met` or `MISSED` against its
//! goal, or with `--json` one object per line, `{"name", "ours", "baseline", "unit", "ratio",
//! "goal", "met"}` (`{"name", "skipped": why}` for a row this host cannot measure).

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

use hvstats::snapshot::InstanceSnapshot;
use hvstats_bench::scrape::EncodeError;
use hvstats_bench::{Options, ScrapeEncoders};
use serde_json::{Value, json};

use crate::cmd::serve::DEFAULT_MAX_VPS;
use crate::output;
use hvstats_present::exposition::Exposition;
use hvstats_present::live::Reading;

/// Flags of `hvstats bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// One JSON object per row instead of a table.
    #[arg(long)]
    json: bool,
    /// Rounds per comparison (medians are reported).
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u32).range(1..=1000))]
    rounds: u32,
    /// Userspace exits per guest run (KVM rows).
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    exits: u32,
    /// Hypercalls per guest run (KVM rows).
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    hypercalls: u32,
    /// Run only the rows whose name contains this (repeat it for rows of several names).
    #[arg(long, value_name = "TEXT")]
    only: Vec<String>,
    /// Partitions × VPs of the snapshot row (the scale: 4096 × 16).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    partitions: u32,
}

/// `serve`'s `/metrics` and `snapshot --json` of one reading, for the scrape rows.
#[derive(Default)]
struct Encoders {
    reading: Option<Arc<Reading>>,
}

impl ScrapeEncoders for Encoders {
    fn load(&mut self, instances: Vec<InstanceSnapshot>) {
        self.reading = Some(Arc::new(Reading::of(instances)));
    }

    fn metrics(&self, max_vps: usize) -> Result<usize, EncodeError> {
        let reading = self.reading.clone().ok_or("no reading to encode")?;
        Ok(Exposition::new(reading, max_vps).encode()?.len())
    }

    fn snapshot_json(&self) -> usize {
        let instances: Vec<Value> = self
            .reading
            .iter()
            .flat_map(|r| &r.instances)
            .map(hvstats_present::snapshot_json::snapshot_json)
            .collect();
        json!({ "instances": instances }).to_string().len()
    }

    fn default_max_vps(&self) -> usize {
        DEFAULT_MAX_VPS
    }
}

/// Runs `hvstats bench`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let options = Options {
        rounds: args.rounds,
        exits: args.exits,
        hypercalls: args.hypercalls,
        only: args.only,
        partitions: args.partitions,
    };
    let rows = hvstats_bench::run(&options, &mut Encoders::default())?;
    output::with_stdout(|out| {
        if args.json {
            for row in &rows {
                writeln!(out, "{}", row.json())?;
            }
        } else {
            writeln!(out, "{}", hvstats_bench::table_header())?;
            for row in &rows {
                writeln!(out, "{}", row.table_line())?;
            }
        }
        Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scrape_rows_measure_both_sides_of_the_same_reading() {
        let mut encoders = Encoders::default();
        let rows = hvstats_bench::scrape::rows_for(4, 3, 1, &mut encoders).unwrap();
        assert_eq!(rows.len(), 2);
        for row in &rows {
            let hvstats_bench::Row::Measured { ours, baseline, unit, .. } = row else { panic!("{row:?}") };
            assert!(*ours > 0.0 && *baseline > 0.0, "{row:?}");
            assert_eq!(*unit, "ms");
        }
        assert_eq!(encoders.reading.unwrap().vp_count(), 12);
    }

    #[test]
    fn metrics_and_json_encode_the_loaded_reading() {
        let mut encoders = Encoders::default();
        assert!(encoders.metrics(usize::MAX).is_err(), "nothing loaded yet");
        encoders.load(vec![hvstats_testkit::synthetic_instance(2, 2)]);
        let one_by_one = encoders.metrics(usize::MAX).unwrap();
        let capped = encoders.metrics(1).unwrap();
        assert!(capped < one_by_one, "{capped} < {one_by_one}: past the cap VPs are summed");
        assert!(encoders.snapshot_json() > 100);
    }
}
