//! KVM's statistics by name, as a VMM relays them: what the QMP client reads out of QEMU's
//! `query-stats` and what the observer maps to counters, a type neither side owns.

use std::collections::BTreeMap;

/// KVM statistics by name: single values, and the buckets of the histograms (KVM's log2
/// `halt_*_hist`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatValues {
    values: BTreeMap<String, u64>,
    histograms: BTreeMap<String, Vec<u64>>,
}

impl StatValues {
    /// The single value of statistic `name`.
    pub fn get(&self, name: &str) -> Option<&u64> {
        self.values.get(name)
    }

    /// The buckets of histogram statistic `name`.
    pub fn histogram(&self, name: &str) -> Option<&[u64]> {
        self.histograms.get(name).map(Vec::as_slice)
    }

    /// True when no statistic is held.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty() && self.histograms.is_empty()
    }

    /// The statistics held, single values and histograms.
    pub fn len(&self) -> usize {
        self.values.len() + self.histograms.len()
    }

    /// Holds `value` as the single value of statistic `name`.
    pub fn set(&mut self, name: &str, value: u64) {
        self.values.insert(name.to_owned(), value);
    }

    /// Holds `buckets` as the buckets of histogram statistic `name`.
    pub fn set_histogram(&mut self, name: &str, buckets: Vec<u64>) {
        self.histograms.insert(name.to_owned(), buckets);
    }

    /// Adds the statistics of `other`, its values replacing those of the same names.
    pub fn extend(&mut self, other: StatValues) {
        self.values.extend(other.values);
        self.histograms.extend(other.histograms);
    }
}
