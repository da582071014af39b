//! Which two readings `top` shows its values between: the latest one, and the one they are
//! counted from (the reading before it, or the one at the last reset).
//!
//! ```text
//!   Empty ──sample──► First ──sample──► Rolling ◄──┐ sample: the latest becomes the base
//!     │                 │                  │  └────┘
//!   reset             reset              reset
//!     ▼                 ▼                  ▼
//!   Armed ──sample──► Pinned ◄─────────────┘
//!                      │  ▲  sample: the base stays; reset: the latest becomes the base
//!                      └──┘
//! ```
//!
//! A reset before any reading (`Armed`) pins the first reading that comes. Values are shown once
//! there are two readings ([`Baseline::pair`]), over the time between them
//! ([`Baseline::seconds`]); `Pinned` says "since reset".

use hvstats_present::live::Reading;

/// The readings `top` compares, and whether a reset pinned the older one.
#[derive(Debug, Default)]
pub enum Baseline {
    /// No reading yet.
    #[default]
    Empty,
    /// A reset came before any reading: the first one will be the base.
    Armed,
    /// One reading, nothing to compare it with.
    First(Box<Reading>),
    /// The latest reading and the one before it.
    Rolling {
        /// The reading before the latest.
        base: Box<Reading>,
        /// The latest reading.
        latest: Box<Reading>,
    },
    /// The latest reading and the one taken at the last reset.
    Pinned {
        /// The reading at the reset.
        base: Box<Reading>,
        /// The latest reading.
        latest: Box<Reading>,
    },
}

impl Baseline {
    /// Takes a new reading: the latest becomes the base, unless a reset pinned one.
    pub fn sample(&mut self, reading: Reading) {
        let reading = Box::new(reading);
        *self = match std::mem::take(self) {
            Baseline::Empty => Baseline::First(reading),
            Baseline::Armed => Baseline::Pinned { base: reading.clone(), latest: reading },
            Baseline::First(base) | Baseline::Rolling { latest: base, .. } => {
                Baseline::Rolling { base, latest: reading }
            }
            Baseline::Pinned { base, .. } => Baseline::Pinned { base, latest: reading },
        };
    }

    /// Counts from now on: the latest reading becomes the base, and stays until the next reset.
    pub fn reset(&mut self) {
        *self = match std::mem::take(self) {
            Baseline::Empty | Baseline::Armed => Baseline::Armed,
            Baseline::First(latest) | Baseline::Rolling { latest, .. } | Baseline::Pinned { latest, .. } => {
                Baseline::Pinned { base: latest.clone(), latest }
            }
        };
    }

    /// The base and the latest reading, once there are both.
    pub fn pair(&self) -> Option<(&Reading, &Reading)> {
        match self {
            Baseline::Rolling { base, latest } | Baseline::Pinned { base, latest } => Some((base, latest)),
            Baseline::Empty | Baseline::Armed | Baseline::First(_) => None,
        }
    }

    /// The latest reading, if any.
    pub fn latest(&self) -> Option<&Reading> {
        match self {
            Baseline::First(latest) | Baseline::Rolling { latest, .. } | Baseline::Pinned { latest, .. } => {
                Some(latest)
            }
            Baseline::Empty | Baseline::Armed => None,
        }
    }

    /// Seconds between the base and the latest reading.
    pub fn seconds(&self) -> Option<f64> {
        let (base, latest) = self.pair()?;
        Some(latest.at.saturating_duration_since(base.at).as_secs_f64())
    }

    /// True when a reset pinned the base (or will pin the first reading).
    pub fn since_reset(&self) -> bool {
        matches!(self, Baseline::Armed | Baseline::Pinned { .. })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use hvstats_testkit::synthetic_instance;

    use super::*;

    /// A reading `s` seconds after `first`.
    fn after(first: &Reading, s: u64) -> Reading {
        let mut r = first.clone();
        r.at = first.at + Duration::from_secs(s);
        r
    }

    #[test]
    fn the_base_rolls_with_each_reading_until_a_reset_pins_it() {
        let r0 = Reading::of(vec![synthetic_instance(1, 1)]);
        let mut b = Baseline::default();
        b.sample(r0.clone());
        assert!(b.pair().is_none() && b.latest().is_some() && b.seconds().is_none());
        b.sample(after(&r0, 1));
        b.sample(after(&r0, 3));
        // Over the last interval: from second 1 to 3.
        assert_eq!((b.seconds(), b.since_reset()), (Some(2.0), false));
        b.reset();
        assert_eq!((b.seconds(), b.since_reset()), (Some(0.0), true));
        b.sample(after(&r0, 4));
        b.sample(after(&r0, 6));
        // Since the reset at second 3.
        assert_eq!((b.seconds(), b.since_reset()), (Some(3.0), true));
        b.reset();
        b.sample(after(&r0, 7));
        assert_eq!(b.seconds(), Some(1.0));
    }

    #[test]
    fn a_reset_before_any_reading_pins_the_first_one() {
        let r0 = Reading::of(vec![synthetic_instance(1, 1)]);
        let mut b = Baseline::default();
        b.reset();
        assert!(b.since_reset() && b.latest().is_none());
        b.sample(r0.clone());
        b.sample(after(&r0, 5));
        assert_eq!((b.seconds(), b.since_reset()), (Some(5.0), true));
    }
}
