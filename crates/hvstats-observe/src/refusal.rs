//! Why the observer does not observe a VM it found, in one place: the table of reasons
//! ([`Refusal`], shared with the page's rows and the metrics' `reason` label), the reason each
//! failure of an attach is refused for (`of_attach_error`), and the count by reason the observer
//! publishes ([`RefusedCounts`]).
//!
//! A new reason is a row of [`hvstats_abi::refusal`]'s table (and its catalog row); the place
//! that refuses for it names it, and the count, the page, the metrics and the log follow.

use std::collections::BTreeMap;

pub use hvstats_abi::refusal::Refusal;

use super::attach::ObserveError;
use super::claim::ClaimError;
use super::discovery::is_shortage;

/// The reason an attach that failed with `e` is refused for.
pub(crate) fn of_attach_error(e: &ObserveError) -> Refusal {
    match e {
        ObserveError::Budget { .. } => Refusal::DescriptorBudget,
        ObserveError::SeveralVms { .. } => Refusal::SeveralVms,
        ObserveError::Proc { source, .. } if is_shortage(source) => Refusal::Shortage,
        ObserveError::NoVm(_) | ObserveError::Proc { .. } | ObserveError::Publish { .. } => Refusal::Failed,
    }
}

/// The reason a claim that failed with `e` is refused for.
pub(crate) fn of_claim_error(e: &ClaimError) -> Refusal {
    match e {
        ClaimError::Taken { .. } => Refusal::ClaimedElsewhere,
        e if e.is_shortage() => Refusal::Shortage,
        _ => Refusal::Failed,
    }
}

/// The VMs refused now, by reason: every reason of the table, 0 where none is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RefusedCounts(BTreeMap<Refusal, usize>);

impl RefusedCounts {
    /// Counts `reasons`.
    pub(crate) fn of(reasons: impl IntoIterator<Item = Refusal>) -> Self {
        let mut counts = BTreeMap::new();
        for r in reasons {
            *counts.entry(r).or_insert(0) += 1;
        }
        Self(counts)
    }

    /// The VMs refused for `reason`.
    pub(crate) fn get(&self, reason: Refusal) -> usize {
        self.0.get(&reason).copied().unwrap_or(0)
    }

    /// Every reason with its count, in the table's order.
    pub fn iter(&self) -> impl Iterator<Item = (Refusal, usize)> + '_ {
        Refusal::ALL.iter().map(|r| (*r, self.get(*r)))
    }

    /// The VMs refused for any reason.
    pub fn total(&self) -> usize {
        self.0.values().sum()
    }
}
