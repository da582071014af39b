//! A cheap clock for the exit path: the time-stamp counter, calibrated once against the
//! monotonic clock. Two TSC reads cost a few nanoseconds where two `clock_gettime` calls cost tens,
//! which matters when every userspace exit is timed.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A timestamp in TSC ticks.
#[inline]
pub fn now() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC has no memory effects; every x86_64 CPU has it.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        fallback_ns()
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn fallback_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// 100 ns units per tick, as a 32.32 fixed-point factor.
fn factor() -> u64 {
    static FACTOR: OnceLock<u64> = OnceLock::new();
    *FACTOR.get_or_init(|| {
        #[cfg(not(target_arch = "x86_64"))]
        {
            (1u64 << 32) / 100
        }
        #[cfg(target_arch = "x86_64")]
        {
            let (t0, c0) = (Instant::now(), now());
            std::thread::sleep(Duration::from_millis(20));
            let (dt, dc) = (t0.elapsed(), now().wrapping_sub(c0).max(1));
            let units = dt.as_nanos() / 100;
            ((units << 32) / dc as u128).min(u64::MAX as u128) as u64
        }
    })
}

/// Calibrates the clock now (it otherwise happens at the first conversion).
pub(crate) fn calibrate() {
    let _ = factor();
}

/// Converts a tick count to 100 ns units.
#[inline]
pub fn to_100ns(ticks: u64) -> u64 {
    ((ticks as u128 * factor() as u128) >> 32) as u64
}

/// Converts a tick count to nanoseconds (for histograms of times).
#[inline]
pub(crate) fn to_ns(ticks: u64) -> u64 {
    ((ticks as u128 * factor() as u128 * 100) >> 32).min(u64::MAX as u128) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_convert_to_about_the_elapsed_time() {
        let c0 = now();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_millis(30));
        let measured = to_100ns(now() - c0);
        let real = (t0.elapsed().as_nanos() / 100) as u64;
        assert!(measured > real / 2 && measured < real * 2, "{measured} vs {real}");
        let ns = to_ns(now() - c0);
        assert!(ns / 100 >= measured, "{ns} ns vs {measured} x 100 ns");
    }
}
