//! Log2 histograms of times, as they sit in a stats page.
//!
//! A cost counter gives an average; an operator chasing a slow path wants the distribution. A
//! histogram here is [`HISTOGRAM_SLOTS`] consecutive 64-bit values in hvstats' own group: the sum
//! of all recorded times in nanoseconds, then [`BUCKETS`] counts. Bucket 0 counts zero times and
//! bucket `i` counts times in `[2^(i-1), 2^i)` ns; the last bucket also takes everything longer.
//! This is the bucketing of KVM's own log2 histograms (`halt_wait_hist` and friends, filled with
//! `fls64`), so those are copied into a page unchanged.
//!
//! The writer of a VP page is its VP thread alone, so [`record`] is a plain relaxed load and store
//! per slot, no locked read-modify-write: an exit costs two stores more than it did. A reader copies
//! the slots into a [`Log2Histogram`] and asks it for counts and quantiles.

use core::sync::atomic::{AtomicU64, Ordering};

/// Number of buckets of a histogram (as many as KVM's `HALT_POLL_HIST_COUNT`).
pub const BUCKETS: usize = 32;

/// Page slots one histogram occupies: the sum, then the buckets.
pub const HISTOGRAM_SLOTS: usize = 1 + BUCKETS;

/// The bucket a time of `ns` nanoseconds falls in: `fls64(ns)`, capped at the last bucket.
pub const fn bucket_of(ns: u64) -> usize {
    let fls = (u64::BITS - ns.leading_zeros()) as usize;
    if fls < BUCKETS { fls } else { BUCKETS - 1 }
}

/// The smallest time in nanoseconds bucket `i` counts.
pub const fn bucket_lower_ns(i: usize) -> u64 {
    if i == 0 { 0 } else { 1 << (i - 1) }
}

/// The smallest time in nanoseconds above bucket `i` (`None` for the last bucket, which is open).
/// Every time the bucket counts is at most this less one: the bound a Prometheus `le` label
/// takes.
pub const fn bucket_upper_ns(i: usize) -> Option<u64> {
    if i + 1 >= BUCKETS { None } else { Some(1 << i) }
}

/// Records a time of `ns` nanoseconds into a histogram's page slots.
///
/// For the histogram's single writer: a relaxed load and store of the sum and of one bucket, no
/// atomic read-modify-write. `slots` are the [`HISTOGRAM_SLOTS`] values of the histogram in the
/// page.
#[inline]
pub fn record(slots: &[AtomicU64; HISTOGRAM_SLOTS], ns: u64) {
    let bump = |slot: &AtomicU64, by: u64| {
        slot.store(slot.load(Ordering::Relaxed).wrapping_add(by), Ordering::Relaxed)
    };
    bump(&slots[0], ns);
    bump(&slots[1 + bucket_of(ns)], 1);
}

/// A histogram read out of a page (or kept in memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Log2Histogram {
    /// Sum of the recorded times, in nanoseconds.
    pub sum_ns: u64,
    /// Counts per bucket (see [`bucket_of`]).
    pub buckets: [u64; BUCKETS],
}

impl Default for Log2Histogram {
    fn default() -> Self {
        Self { sum_ns: 0, buckets: [0; BUCKETS] }
    }
}

impl Log2Histogram {
    /// A histogram from its page slots (sum, then buckets); `None` unless exactly
    /// [`HISTOGRAM_SLOTS`] values are given.
    pub fn from_slots(slots: &[u64]) -> Option<Self> {
        let (&sum_ns, rest) = slots.split_first()?;
        Some(Self { sum_ns, buckets: rest.try_into().ok()? })
    }

    /// The histogram's page slots (sum, then buckets).
    pub fn to_slots(&self) -> [u64; HISTOGRAM_SLOTS] {
        let mut slots = [0; HISTOGRAM_SLOTS];
        slots[0] = self.sum_ns;
        slots[1..].copy_from_slice(&self.buckets);
        slots
    }

    /// Records one time of `ns` nanoseconds.
    pub fn record(&mut self, ns: u64) {
        self.sum_ns = self.sum_ns.wrapping_add(ns);
        let b = &mut self.buckets[bucket_of(ns)];
        *b = b.wrapping_add(1);
    }

    /// Number of recorded times.
    pub fn count(&self) -> u64 {
        self.buckets.iter().fold(0u64, |a, &b| a.wrapping_add(b))
    }

    /// What was recorded since `earlier` (bucket by bucket); `None` when any value went backwards
    /// (not the same histogram).
    pub fn since(&self, earlier: &Log2Histogram) -> Option<Log2Histogram> {
        let mut d = Log2Histogram { sum_ns: self.sum_ns.checked_sub(earlier.sum_ns)?, ..Default::default() };
        for (i, b) in d.buckets.iter_mut().enumerate() {
            *b = self.buckets[i].checked_sub(earlier.buckets[i])?;
        }
        Some(d)
    }

    /// The bucket holding quantile `q` (0.0 ..= 1.0) of the recorded times: the first bucket whose
    /// cumulative count reaches `ceil(q * count)`, at least one. `None` when nothing was recorded
    /// or `q` is not in range.
    pub fn quantile_bucket(&self, q: f64) -> Option<usize> {
        if !(0.0..=1.0).contains(&q) {
            return None;
        }
        let count = self.count();
        if count == 0 {
            return None;
        }
        let rank = libm_ceil(q * count as f64).max(1.0);
        let mut seen = 0u64;
        for (i, &b) in self.buckets.iter().enumerate() {
            seen = seen.saturating_add(b);
            if seen as f64 >= rank {
                return Some(i);
            }
        }
        Some(BUCKETS - 1)
    }

    /// An upper bound in nanoseconds of quantile `q`: the upper bound of its bucket, or for the
    /// open last bucket its lower bound. `None` as for [`quantile_bucket`](Self::quantile_bucket).
    pub fn quantile_upper_ns(&self, q: f64) -> Option<u64> {
        let b = self.quantile_bucket(q)?;
        Some(bucket_upper_ns(b).map_or(bucket_lower_ns(b), |u| u - 1))
    }

    /// Average recorded time in nanoseconds (`None` when nothing was recorded).
    pub fn mean_ns(&self) -> Option<f64> {
        let count = self.count();
        (count > 0).then(|| self.sum_ns as f64 / count as f64)
    }
}

/// `ceil` for the non-negative values a quantile rank takes, without `std`.
fn libm_ceil(x: f64) -> f64 {
    let t = x as u64 as f64;
    if t < x { t + 1.0 } else { t }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_land_in_their_log2_bucket() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1), 1);
        assert_eq!(bucket_of(2), 2);
        assert_eq!(bucket_of(3), 2);
        assert_eq!(bucket_of(4), 3);
        assert_eq!(bucket_of(1023), 10);
        assert_eq!(bucket_of(1024), 11);
        assert_eq!(bucket_of(1 << 30), 31);
        assert_eq!(bucket_of(u64::MAX), 31);
        for i in 0..BUCKETS {
            assert_eq!(bucket_of(bucket_lower_ns(i)), i);
            if let Some(u) = bucket_upper_ns(i) {
                assert_eq!(bucket_of(u - 1), i);
                assert_eq!(bucket_of(u), i + 1);
            }
        }
    }

    #[test]
    fn recording_in_page_slots_matches_recording_in_memory() {
        let slots: [AtomicU64; HISTOGRAM_SLOTS] = core::array::from_fn(|_| AtomicU64::new(0));
        let mut mem = Log2Histogram::default();
        for ns in [0, 1, 700, 700, 1500, 2_000_000, u64::MAX / 4] {
            record(&slots, ns);
            mem.record(ns);
        }
        let read: [u64; HISTOGRAM_SLOTS] = core::array::from_fn(|i| slots[i].load(Ordering::Relaxed));
        let h = Log2Histogram::from_slots(&read).unwrap();
        assert_eq!(h, mem);
        assert_eq!(h.count(), 7);
        assert_eq!(h.buckets[bucket_of(700)], 2);
        assert_eq!(h.to_slots(), read);
        assert_eq!(Log2Histogram::from_slots(&read[1..]), None);
    }

    #[test]
    fn quantiles_name_the_bucket_of_the_ranked_time() {
        let mut h = Log2Histogram::default();
        for _ in 0..98 {
            h.record(1000); // bucket 10: [512, 1024)
        }
        h.record(100_000); // bucket 17
        h.record(5_000_000); // bucket 23
        assert_eq!(h.quantile_bucket(0.5), Some(10));
        assert_eq!(h.quantile_upper_ns(0.5), Some(1023));
        assert_eq!(h.quantile_bucket(0.98), Some(10));
        assert_eq!(h.quantile_bucket(0.99), Some(17));
        assert_eq!(h.quantile_bucket(1.0), Some(23));
        assert_eq!(h.quantile_bucket(1.5), None);
        assert_eq!(Log2Histogram::default().quantile_bucket(0.5), None);
        assert_eq!(h.mean_ns(), Some((98.0 * 1000.0 + 100_000.0 + 5_000_000.0) / 100.0));
    }

    #[test]
    fn a_difference_is_bucketwise_and_refuses_a_reset() {
        let mut a = Log2Histogram::default();
        a.record(10);
        let mut b = a;
        b.record(10);
        b.record(1 << 20);
        let d = b.since(&a).unwrap();
        assert_eq!(d.count(), 2);
        assert_eq!(d.sum_ns, 10 + (1 << 20));
        assert_eq!(d.buckets[bucket_of(10)], 1);
        assert_eq!(a.since(&b), None);
    }
}
