//! Which rows a run measures and how the scrape rows use the encoders lent to them, on the
//! quickest rows (no guest, no tracepoint).

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cell::Cell;

use hvstats::snapshot::InstanceSnapshot;
use hvstats_bench::scrape::{self, EncodeError, ScrapeEncoders};
use hvstats_bench::{Options, Row};

/// Encoders that count their calls and encode nothing but the reading's size.
#[derive(Default)]
struct Counting {
    vps: usize,
    metrics: Cell<Vec<usize>>,
    json: Cell<u32>,
}

impl ScrapeEncoders for Counting {
    fn load(&mut self, instances: Vec<InstanceSnapshot>) {
        self.vps = instances.iter().flat_map(|i| &i.partitions).map(|p| p.vps.len()).sum();
    }

    fn metrics(&self, max_vps: usize) -> Result<usize, EncodeError> {
        let mut caps = self.metrics.take();
        caps.push(max_vps);
        self.metrics.set(caps);
        Ok(self.vps)
    }

    fn snapshot_json(&self) -> usize {
        self.json.set(self.json.get() + 1);
        self.vps
    }

    fn default_max_vps(&self) -> usize {
        7
    }
}

#[test]
fn a_run_measures_only_the_rows_asked_for_in_the_reports_order() {
    let options = Options {
        rounds: 1,
        only: vec!["vp-read-consistent-vs-plain".into(), "read-vp-vs-pread-page".into()],
        ..Options::default()
    };
    let mut encoders = Counting::default();
    let rows = hvstats_bench::run(&options, &mut encoders).unwrap();
    let names: Vec<&str> = rows.iter().map(Row::name).collect();
    assert_eq!(names, ["read-vp-vs-pread-page", "vp-read-consistent-vs-plain"], "{rows:?}");
    for row in &rows {
        let Row::Measured { ours, baseline, unit, .. } = row else { panic!("{row:?}") };
        assert!(*ours > 0.0 && *baseline > 0.0, "{row:?}");
        assert_eq!(*unit, "ns/read");
    }
    assert_eq!(encoders.json.get(), 0, "the scrape rows were not asked for");
}

#[test]
fn the_scrape_rows_encode_one_reading_every_round_uncapped_then_capped() {
    let mut encoders = Counting::default();
    let rows = scrape::rows_for(3, 2, 3, &mut encoders).unwrap();
    assert_eq!(encoders.vps, 6);
    let names: Vec<&str> = rows.iter().map(Row::name).collect();
    assert_eq!(names, scrape::ROWS);
    assert_eq!(encoders.metrics.take(), [usize::MAX, usize::MAX, usize::MAX, 7, 7, 7]);
    assert_eq!(encoders.json.get(), 6);
}
