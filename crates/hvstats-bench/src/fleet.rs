//! A fleet host's scrape: 1,000 VMs of 4 VPs published in a real instance, read and encoded as
//! `serve` answers `/metrics` and `/api/v1/snapshot`, next to the Prometheus client library
//! encoding the same families alone.
//!
//! Each round measures, in the CPU time of the thread doing it and in an order reversed every
//! other round: the scrape (reading every live instance through [`Live`], then the exposition
//! with the exporter's default cap), the exposition alone of one reading, the library's encoding
//! of the same families ([`crate::client`]), and the snapshot API (the same reading, then its
//! JSON).

use std::sync::Arc;

use hvstats::{InstanceConfig, PartitionStats};
use hvstats_abi::ObjectKind;
use hvstats_abi::catalog::{Presentation, counters_of};
use hvstats_present::exposition::DEFAULT_MAX_VPS;
use hvstats_present::live::{Live, Reading};

use crate::authority::TempRuntime;
use crate::client::LibraryFamilies;
use crate::error::{BenchError, Step};
use crate::row::{CpuClock, Pace, Plan, Rounds, Row, median};
use crate::scrape::{metrics, series, snapshot_body};

/// One thing a round measures.
type Measure<'a> = dyn Fn() -> Result<(), BenchError> + 'a;

/// VMs of the fleet host.
pub const VMS: u32 = 1000;
/// VPs of each.
pub const VPS_EACH: u32 = 4;

/// `serve`'s `/metrics` (read and encoded) against the library encoding the same families.
pub const SCRAPE_ROW: &str = "serve-scrape-1000-vms-x4-vps-vs-prometheus-client";
/// The exposition of one reading against the library encoding the same families.
pub const EXPOSITION_ROW: &str = "exposition-1000-vms-x4-vps-vs-prometheus-client";
/// The most the exposition may take of the library's time for the same families.
pub const EXPOSITION_GOAL: f64 = 0.5;
/// `serve`'s `/api/v1/snapshot` (read and encoded) against its `/metrics`.
pub const SNAPSHOT_API_ROW: &str = "snapshot-api-1000-vms-x4-vps-vs-serve-scrape";
/// The rows, measured together.
pub const ROWS: [&str; 3] = [SCRAPE_ROW, EXPOSITION_ROW, SNAPSHOT_API_ROW];

/// Publishes `vms` partitions named `vm-0001`, … of `vps_each` VPs in an instance under `rt`, every
/// counter of every VP set and every histogram holding times; the partitions, to keep them.
///
/// # Errors
/// When the instance or a partition cannot be made.
pub(crate) fn publish_fleet(
    rt: &TempRuntime,
    vms: u32,
    vps_each: u32,
) -> Result<(Arc<hvstats::Hypervisor>, Vec<Arc<PartitionStats>>), BenchError> {
    let hv = hvstats::Hypervisor::with_config(InstanceConfig {
        runtime_dir: Some(rt.path().to_owned()),
        ..Default::default()
    })
    .step("publishing the fleet instance")?;
    let mut partitions = Vec::new();
    for vm in 0..vms {
        let p = hv.create_partition_named(vps_each, &format!("vm-{:04}", vm + 1)).step("creating a VM")?;
        for (n, page) in p.vp_pages() {
            let seed = u64::from(vm) * 1000 + u64::from(n) * 100;
            for (i, c) in counters_of(ObjectKind::Vp).enumerate() {
                match c.presentation {
                    Presentation::Histogram => {
                        for k in 0..8 {
                            page.record_time(c.id, (seed + i as u64) << k);
                        }
                    }
                    _ if c.id != hvstats_abi::catalog::vp::SEQUENCE => page.set(c.id, seed * 7 + i as u64),
                    _ => {}
                }
            }
        }
        partitions.push(p);
    }
    Ok((hv, partitions))
}

/// The fleet rows, for `vms` VMs of `vps_each` VPs (the rows keep their names).
///
/// # Errors
/// When the fleet cannot be published, read or encoded.
pub fn fleet_rows(plan: &Plan<'_>, vms: u32, vps_each: u32) -> Result<Vec<Row>, BenchError> {
    let rt = TempRuntime::new("fleet")?;
    let (_hv, _partitions) = publish_fleet(&rt, vms, vps_each)?;
    let live = Live::new(Some(rt.path().to_owned()));
    let read =
        || -> Result<Arc<Reading>, BenchError> { Ok(Arc::new(live.read().step("reading the fleet")?)) };
    let one_reading = read()?;
    let vps = one_reading.vp_count();
    if vps != (vms * vps_each) as usize {
        return Err(BenchError::Missing(format!("{vps} VPs read of the {} published", vms * vps_each)));
    }
    let exposition = metrics(&one_reading, DEFAULT_MAX_VPS)?;
    let library = LibraryFamilies::parse(&exposition).step("taking the exposition apart")?;
    let library_bytes = library.encode().step("encoding with the library")?.len();
    let api_bytes = snapshot_body(&one_reading).len();
    if library.series() != series(&exposition) {
        return Err(BenchError::Missing("the library holds other series than the exposition".into()));
    }

    let (mut scrape, mut alone, mut client, mut api) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..plan.start(&ROWS, Pace::Quick) {
        let mut measure: [(&mut Vec<f64>, &Measure<'_>); 4] = [
            (&mut scrape, &|| metrics(&read()?, DEFAULT_MAX_VPS).map(drop)),
            (&mut alone, &|| metrics(&one_reading, DEFAULT_MAX_VPS).map(drop)),
            (&mut client, &|| library.encode().map(drop).step("encoding with the library")),
            (&mut api, &|| read().map(|r| drop(std::hint::black_box(snapshot_body(&r))))),
        ];
        if round % 2 == 1 {
            measure.reverse();
        }
        for (samples, f) in measure {
            let start = CpuClock::now();
            f()?;
            samples.push(start.elapsed().as_secs_f64() * 1e3);
        }
        plan.tick();
    }
    let vps = vps as f64;
    let api_ms = median(api.clone());
    let scrape_facts = vec![
        ("series", series(&exposition) as f64),
        ("bytes", exposition.len() as f64),
        ("library_bytes", library_bytes as f64),
    ];
    Ok(vec![
        Row::Measured {
            name: SCRAPE_ROW,
            rounds: Rounds { ours: scrape.clone(), baseline: client.clone() },
            unit: "ms",
            goal: None,
            facts: scrape_facts.clone(),
        },
        Row::Measured {
            name: EXPOSITION_ROW,
            rounds: Rounds { ours: alone, baseline: client },
            unit: "ms",
            goal: Some(EXPOSITION_GOAL),
            facts: scrape_facts,
        },
        Row::Measured {
            name: SNAPSHOT_API_ROW,
            rounds: Rounds { ours: api, baseline: scrape },
            unit: "ms",
            goal: None,
            facts: vec![
                ("vps", vps),
                ("bytes", api_bytes as f64),
                ("bytes_per_vp", api_bytes as f64 / vps),
                ("ns_per_vp", api_ms * 1e6 / vps),
            ],
        },
    ])
}
