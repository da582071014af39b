//! Steady, made-up traffic in a published instance, so the operator surfaces (`top`, `serve`,
//! `record`, `plot`) and the monitoring mixin can be tried and tested on a host without KVM.
//!
//! Every value is made up: VP `n` of the `p`-th partition (from 1) counts about
//! `(n + 1) × p × 100` I/O exits per second (swelling and ebbing every 10 s) at 4 µs each but one
//! in 50 at 300 µs, half as many CPUID exits and MSR accesses (1.5 µs), one hypercall per 10 I/O
//! exits (2.5 µs), a quarter as many APIC accesses, 50 halts, and 60 % run time; each handling
//! time goes into its class's histogram too, and every exit into the VP's total of exits. Each VP
//! is dispatched 100 times a second, waiting 20 µs each time.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hvstats::Hypervisor;
use hvstats_abi::catalog::vp;

/// Publishes an instance under `dir` with two partitions, `web-1` (2 VPs) and `db-1` (4 VPs),
/// and counts their traffic every 100 ms until `seconds` have passed or `stop` is set.
///
/// # Errors
/// When the instance or its partitions cannot be published.
pub fn synthetic_load(dir: &Path, seconds: f64, stop: &AtomicBool) -> std::io::Result<()> {
    let hv = Hypervisor::new_published(dir)?;
    let partitions = [hv.create_partition_named(2, "web-1")?, hv.create_partition_named(4, "db-1")?];
    let tick = Duration::from_millis(100);
    let start = Instant::now();
    let mut ticks = 0u64;
    while start.elapsed().as_secs_f64() < seconds && !stop.load(Ordering::Relaxed) {
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
                page.add(vp::EXITS, io + io / 2 + io / 2 + io / 10 + 5 + io / 4);
                page.add(vp::TOTAL_RUN_TIME, 600_000);
                page.add(vp::HYPERVISOR_RUN_TIME, 100_000);
                for _ in 0..io / 2 {
                    page.record_time(vp::MSR_TIME_HISTOGRAM, 1_500);
                }
                for _ in 0..io / 10 {
                    page.record_time(vp::HYPERCALLS_TIME_HISTOGRAM, 2_500);
                }
                for _ in 0..5 {
                    page.record_time(vp::HALT_WAIT_HISTOGRAM, 1_000);
                }
                page.add(vp::DISPATCHES, 10);
                page.add(vp::CPU_WAIT_TIME_PER_DISPATCH, 10 * 20_000);
            }
        }
        std::thread::sleep((start + tick * ticks as u32).saturating_duration_since(Instant::now()));
    }
    Ok(())
}
