//! Publishes an instance whose VPs count steady, made-up traffic, so the operator surfaces
//! (`top`, `serve`, `record`, `plot`) can be tried and shown on a host without KVM.
//!
//! Every value is made up: VP `n` of the `p`-th partition (from 1) counts about
//! `(n + 1) × p × 100` I/O exits per second (swelling and ebbing every 10 s) at 4 µs each but one
//! in 50 at 300 µs, half as many CPUID exits and MSR accesses (1.5 µs), one hypercall per 10 I/O
//! exits (2.5 µs), and 60 % run time; each handling time goes into its class's histogram too. Each
//! VP is dispatched 100 times a second, waiting 20 µs each time.
//!
//! ```sh
//! cargo run --example synthetic_load -- /tmp/hv 30   # runtime dir, seconds
//! ```

use std::path::PathBuf;
use std::time::{Duration, Instant};

use hvstats::Hypervisor;
use hvstats_abi::catalog::vp;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().ok_or("usage: synthetic_load RUNTIME_DIR [SECONDS]")?);
    let seconds: f64 = args.next().map_or(Ok(30.0), |s| s.parse())?;
    std::fs::create_dir_all(&dir)?;
    let hv = Hypervisor::new_published(&dir)?;
    let partitions = [hv.create_partition_named(2, "web-1")?, hv.create_partition_named(4, "db-1")?];
    let tick = Duration::from_millis(100);
    let start = Instant::now();
    let mut ticks = 0u64;
    while start.elapsed().as_secs_f64() < seconds {
        ticks += 1;
        // A wave so charts have something to show: traffic swells and ebbs every 10 s.
        let swell = 1.0 + (ticks as f64 * 0.0628).sin() * 0.5;
        for (p, partition) in partitions.iter().enumerate() {
            for n in 0..partition.vp_count() {
                let Some(page) = partition.vp_page(n) else { continue };
                let io = ((n as f64 + 1.0) * (p as f64 + 1.0) * 10.0 * swell) as u64;
                page.add(vp::IO_INSTRUCTIONS, io);
                let mut io_ns = 0;
                for i in 0..io {
                    // About one in 50, spread over the ticks.
                    let ns = if (ticks * 7 + i).is_multiple_of(50) { 300_000 } else { 4_000 };
                    page.record_time(vp::IO_TIME_HISTOGRAM, ns);
                    io_ns += ns;
                }
                page.add(vp::IO_INSTRUCTIONS_COST, io_ns / 100);
                page.add(vp::CPUID_INSTRUCTIONS, io / 2);
                page.add(vp::MSR_ACCESSES, io / 2);
                page.add(vp::MSR_ACCESSES_COST, io / 2 * 15);
                page.add(vp::HYPERCALLS, io / 10);
                page.add(vp::HYPERCALLS_COST, io / 10 * 25);
                page.add(vp::HLT_INSTRUCTIONS, 5);
                page.add(vp::HLT_INSTRUCTIONS_COST, 5 * 1_000);
                page.add(vp::APIC_MMIO_ACCESSES, io / 4);
                page.add(vp::TOTAL_RUN_TIME, 600_000);
                page.add(vp::HYPERVISOR_RUN_TIME, 100_000);
                for _ in 0..io / 2 {
                    page.record_time(vp::MSR_TIME_HISTOGRAM, 1_500);
                }
                for _ in 0..io / 10 {
                    page.record_time(vp::HYPERCALLS_TIME_HISTOGRAM, 2_500);
                }
                page.add(vp::DISPATCHES, 10);
                page.add(vp::CPU_WAIT_TIME_PER_DISPATCH, 10 * 20_000);
            }
        }
        std::thread::sleep((start + tick * ticks as u32).saturating_duration_since(Instant::now()));
    }
    Ok(())
}
