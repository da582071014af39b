//! Sets of catalog counters: what a counter source gives, what a partition lacks.
//!
//! A source of counters says which counters it gives as a [`CounterSet`]; whoever composes
//! several sources takes unions and differences of those sets to decide which source writes each
//! counter and which counters no source gives. One bit per catalog row, so a set is a few words
//! and every operation is a handful of instructions.

use crate::catalog::{CATALOG, Counter, CounterId};
use crate::object::ObjectKind;

/// Words of a set: one bit per catalog row.
const WORDS: usize = CATALOG.len().div_ceil(64);

/// The position of `id`'s row in [`CATALOG`].
fn row(id: CounterId) -> Option<usize> {
    crate::catalog::row(id)
}

/// A set of catalog counters.
///
/// ```
/// use hvstats_abi::catalog::vp;
/// use hvstats_abi::counter_set::CounterSet;
///
/// let mut io = CounterSet::EMPTY;
/// io.insert(vp::IO_INSTRUCTIONS);
/// let both = io.union(&CounterSet::of(&[vp::CPUID_INSTRUCTIONS]));
/// assert!(both.contains(vp::CPUID_INSTRUCTIONS) && both.contains(vp::IO_INSTRUCTIONS));
/// assert_eq!(both.difference(&io).ids().collect::<Vec<_>>(), [vp::CPUID_INSTRUCTIONS]);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CounterSet([u64; WORDS]);

impl CounterSet {
    /// No counter.
    pub const EMPTY: CounterSet = CounterSet([0; WORDS]);

    /// The set of `ids` (ids not in the catalog are left out).
    pub fn of(ids: &[CounterId]) -> Self {
        let mut set = Self::EMPTY;
        ids.iter().for_each(|&id| set.insert(id));
        set
    }

    /// Every counter of `kind` that `keep` holds for.
    pub fn of_kind(kind: ObjectKind, keep: impl Fn(&Counter) -> bool) -> Self {
        let mut set = Self::EMPTY;
        CATALOG.iter().filter(|c| c.id.kind == kind && keep(c)).for_each(|c| set.insert(c.id));
        set
    }

    /// Adds `id` (a counter not in the catalog is not added).
    pub fn insert(&mut self, id: CounterId) {
        if let Some(r) = row(id) {
            self.0[r / 64] |= 1 << (r % 64);
        }
    }

    /// True when `id` is in the set.
    pub fn contains(&self, id: CounterId) -> bool {
        row(id).is_some_and(|r| self.0[r / 64] & (1 << (r % 64)) != 0)
    }

    /// The counters in either set.
    pub fn union(&self, other: &Self) -> Self {
        let mut out = *self;
        out.0.iter_mut().zip(other.0).for_each(|(w, o)| *w |= o);
        out
    }

    /// The counters in both sets.
    pub fn intersection(&self, other: &Self) -> Self {
        let mut out = *self;
        out.0.iter_mut().zip(other.0).for_each(|(w, o)| *w &= o);
        out
    }

    /// The counters in this set and not in `other`.
    pub fn difference(&self, other: &Self) -> Self {
        let mut out = *self;
        out.0.iter_mut().zip(other.0).for_each(|(w, o)| *w &= !o);
        out
    }

    /// True when the set holds no counter.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    /// The counters of the set, in catalog order.
    pub fn ids(&self) -> impl Iterator<Item = CounterId> + '_ {
        self.counters().map(|c| c.id)
    }

    /// The catalog rows of the set's counters, in catalog order: one step per counter held, not
    /// per row of the catalog.
    pub fn counters(&self) -> impl Iterator<Item = &'static Counter> + '_ {
        self.0.iter().enumerate().flat_map(|(w, &word)| {
            let mut bits = word;
            core::iter::from_fn(move || {
                let bit = bits.trailing_zeros() as usize;
                (bits != 0).then(|| {
                    bits &= bits - 1;
                    &CATALOG[w * 64 + bit]
                })
            })
        })
    }
}

impl core::fmt::Debug for CounterSet {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_set().entries(self.ids().filter_map(|id| id.counter().map(|c| c.name))).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_catalog_row_has_its_own_bit() {
        let mut seen = CounterSet::EMPTY;
        for c in CATALOG {
            assert!(!seen.contains(c.id), "{} shares a bit", c.name);
            seen.insert(c.id);
            assert!(seen.contains(c.id));
        }
        assert_eq!(seen.ids().count(), CATALOG.len());
        assert!(seen.ids().eq(CATALOG.iter().map(|c| c.id)), "every row, in catalog order");
        let mut every_third = CounterSet::EMPTY;
        CATALOG.iter().step_by(3).for_each(|c| every_third.insert(c.id));
        assert!(every_third.counters().eq(CATALOG.iter().step_by(3)), "only the rows held, in order");
        let outside = CounterId { index: crate::catalog::INDICES as u16 + 7, ..CATALOG[0].id };
        seen.insert(outside);
        assert!(!seen.contains(outside));
    }
}
