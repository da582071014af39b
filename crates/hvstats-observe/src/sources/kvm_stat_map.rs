//! Every KVM statistic to its catalog counter, for every source of an observed VM that carries
//! KVM's statistics (the VMM's stats descriptors, libvirt's domain statistics, QMP).
//!
//! The catalog names the statistics each counter sums ([`catalog::observed_kvm_stat`]); this
//! module turns a reading of them, however it was read, into those counters: a count is the sum
//! of its statistics, a time their nanoseconds in its unit (HLT cost: `halt_wait_ns` plus both
//! poll times), a histogram its `_ns` sum and its `_hist` buckets, KVM's log2 bucketing being the
//! page's own. Values are KVM's own, whole-life: they count from the vCPU's (or VM's) creation.

use std::collections::BTreeMap;

use hvstats::SharedPage;
use hvstats_abi::catalog::{self, Counter};
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::source::KvmStat;
use hvstats_abi::{ObjectKind, Presentation, Unit};

use hvstats_sources::counter_source::Gives;
use hvstats_sources::vcpu_stats::copy_kvm_histogram;
use hvstats_vmm::kvm_stats::StatValues;

/// One reading of KVM statistics by the kernel's names.
pub trait KvmStatReading {
    /// The value of the single-valued statistic `name` (nanoseconds for a time: KVM's time
    /// statistics are the `_ns` ones, exponent -9); `None` when the reading lacks it.
    fn value(&self, name: &str) -> Option<u64>;

    /// The buckets of the histogram statistic `name`; `None` when the reading lacks it.
    fn buckets(&self, name: &str) -> Option<&[u64]>;
}

/// The statistics `counter` of `kind`'s object sums, when KVM's statistics give it.
fn stat_names(counter: &Counter, kind: ObjectKind) -> Option<&'static [&'static str]> {
    match (kind, catalog::observed_kvm_stat(counter)?) {
        (ObjectKind::Vp, KvmStat::Vcpu(names)) | (ObjectKind::Partition, KvmStat::Vm(names)) => Some(names),
        _ => None,
    }
}

/// The counters of `kind`'s objects that KVM's statistics give, each with the statistics it
/// sums, in catalog order.
pub(crate) fn kvm_stat_counters(
    kind: ObjectKind,
) -> impl Iterator<Item = (&'static Counter, &'static [&'static str])> {
    // Worked out once: every VP of every VM is written from it at every refresh.
    type Table = Vec<(&'static Counter, &'static [&'static str])>;
    static TABLES: std::sync::OnceLock<Vec<Table>> = std::sync::OnceLock::new();
    let tables = TABLES.get_or_init(|| {
        ObjectKind::ALL
            .iter()
            .map(|&k| catalog::counters_of(k).filter_map(|c| Some((c, stat_names(c, k)?))).collect())
            .collect()
    });
    tables.get(kind as usize).into_iter().flatten().copied()
}

/// True when a reading that `has` the statistics it names gives `counter`: every statistic it
/// sums (a partial sum would be a wrong value), and for a histogram its sum and its buckets.
fn complete(counter: &Counter, names: &[&str], has: &dyn Fn(&str, bool) -> bool) -> bool {
    match (counter.presentation, names) {
        (Presentation::Histogram, [sum, buckets]) => has(sum, false) && has(buckets, true),
        (Presentation::Histogram, _) => false,
        _ => !names.is_empty() && names.iter().all(|n| has(n, false)),
    }
}

/// The counters of `kind` a reading gives, from whether it `has` each statistic (the flag asks
/// for a histogram's buckets rather than a single value).
pub fn given(kind: ObjectKind, has: &dyn Fn(&str, bool) -> bool) -> CounterSet {
    let mut set = CounterSet::EMPTY;
    for (counter, names) in kvm_stat_counters(kind) {
        if complete(counter, names, has) {
            set.insert(counter.id);
        }
    }
    set
}

/// The counters of `kind` that `reading` gives.
pub(crate) fn given_by(kind: ObjectKind, reading: &dyn KvmStatReading) -> CounterSet {
    given(kind, &|name, buckets| {
        if buckets { reading.buckets(name).is_some() } else { reading.value(name).is_some() }
    })
}

/// The counters of an object of `kind` that every one of `readings` gives (one reading per vCPU:
/// a VP counter is given only when each vCPU's statistics give it); none without readings.
pub(crate) fn given_by_all<'a, R: KvmStatReading + 'a>(
    kind: ObjectKind,
    readings: impl IntoIterator<Item = &'a R>,
) -> CounterSet {
    readings.into_iter().map(|r| given_by(kind, r)).reduce(|a, b| a.intersection(&b)).unwrap_or_default()
}

/// The counters a source reading KVM's statistics per object gives: the VM's from `vm` (when
/// read), and each VP counter that every vCPU's reading gives, none unless all `vp_count` vCPUs'
/// statistics were read (a VP without its reading would keep a stale value).
pub(crate) fn gives<R: KvmStatReading>(vm: Option<&R>, vcpus: &BTreeMap<u32, R>, vp_count: usize) -> Gives {
    let vp = match vcpus.len() == vp_count {
        true => given_by_all(ObjectKind::Vp, vcpus.values()),
        false => CounterSet::EMPTY,
    };
    let partition = vm.map(|r| given_by(ObjectKind::Partition, r)).unwrap_or_default();
    Gives { partition, vp }
}

/// Writes the counters of `only` for an object of `kind` from `reading` into `page`; a counter
/// whose statistics the reading lacks is left as it is.
pub fn write(kind: ObjectKind, page: &SharedPage, only: &CounterSet, reading: &dyn KvmStatReading) {
    for (counter, names) in kvm_stat_counters(kind).filter(|(c, _)| only.contains(c.id)) {
        if counter.presentation == Presentation::Histogram {
            let [sum, buckets] = names else { continue };
            if let (Some(sum), Some(buckets)) = (reading.value(sum), reading.buckets(buckets)) {
                copy_kvm_histogram(page, counter, sum, buckets);
            }
            continue;
        }
        // Every statistic or none: a partial sum would be a wrong value.
        let sum = names.iter().try_fold(0u64, |a, n| Some(a.saturating_add(reading.value(n)?)));
        let Some(sum) = sum else { continue };
        set_sum(page, counter, sum);
    }
}

/// Sets `counter` to `sum`, the sum of its statistics (nanoseconds for a time), in its unit.
fn set_sum(page: &SharedPage, counter: &Counter, sum: u64) {
    let value = match counter.unit {
        Unit::Time100ns => sum / 100,
        _ => sum,
    };
    page.set(counter.id, value);
}

/// Where one counter's statistics sit in a reading of fixed layout (`K` locates a statistic).
#[derive(Debug)]
enum Row<K> {
    /// A count or a time: the sum of these statistics of the list ([`Resolved::stats`]).
    Sum(std::ops::Range<usize>),
    /// A histogram: its `_ns` sum and its buckets.
    Histogram(K, K),
}

/// The counters of one object's kind that a reading of fixed layout gives (a stats descriptor's,
/// whose statistics are fixed while it is open), each with its statistics located once: a
/// refresh then reads them by place, not by name. What it gives and writes is what
/// [`given_by`] and [`write`] make of the same reading.
#[derive(Debug)]
pub(crate) struct Resolved<K> {
    rows: Vec<(&'static Counter, Row<K>)>,
    /// The statistics the sums add, every row's in one list (not a list per row).
    stats: Vec<K>,
    given: CounterSet,
}

impl<K: Copy> Resolved<K> {
    /// The counters of `kind` whose every statistic `find` locates (the flag asks for a
    /// histogram's buckets rather than a single value).
    pub(crate) fn of(kind: ObjectKind, find: &dyn Fn(&str, bool) -> Option<K>) -> Self {
        let mut stats = Vec::new();
        let mut rows: Vec<(&'static Counter, Row<K>)> = kvm_stat_counters(kind)
            .filter_map(|(counter, names)| {
                let row = match (counter.presentation, names) {
                    (Presentation::Histogram, [sum, buckets]) => {
                        Row::Histogram(find(sum, false)?, find(buckets, true)?)
                    }
                    (Presentation::Histogram, _) => return None,
                    _ if names.is_empty() => return None,
                    _ => {
                        let found: Option<Vec<K>> = names.iter().map(|n| find(n, false)).collect();
                        let start = stats.len();
                        stats.extend(found?);
                        Row::Sum(start..stats.len())
                    }
                };
                Some((counter, row))
            })
            .collect();
        rows.shrink_to_fit();
        stats.shrink_to_fit();
        let mut given = CounterSet::EMPTY;
        rows.iter().for_each(|(c, _)| given.insert(c.id));
        Self { rows, stats, given }
    }

    /// The counters it gives.
    pub(crate) fn given(&self) -> CounterSet {
        self.given
    }

    /// Writes the counters of `only` into `page`, each statistic's single value (nanoseconds for
    /// a time) from `value` and a histogram's buckets from `buckets`.
    pub(crate) fn write<'d>(
        &self,
        page: &SharedPage,
        only: &CounterSet,
        value: impl Fn(K) -> u64,
        buckets: impl Fn(K) -> &'d [u64],
    ) {
        // Most often it writes all it gives (no source before it gives any): then no row is
        // looked up in `only`.
        let all = self.given.difference(only).is_empty();
        for (counter, row) in self.rows.iter().filter(|(c, _)| all || only.contains(c.id)) {
            match row {
                Row::Histogram(sum, b) => copy_kvm_histogram(page, counter, value(*sum), buckets(*b)),
                Row::Sum(at) => {
                    let stats = self.stats.get(at.clone()).unwrap_or(&[]);
                    let sum = stats.iter().fold(0u64, |a, k| a.saturating_add(value(*k)));
                    set_sum(page, counter, sum);
                }
            }
        }
    }
}

/// QMP's reading (`query-stats`): single values and histograms by name, raw as KVM keeps them.
impl KvmStatReading for StatValues {
    fn value(&self, name: &str) -> Option<u64> {
        self.get(name).copied()
    }

    fn buckets(&self, name: &str) -> Option<&[u64]> {
        self.histogram(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reading of every statistic the catalog names for `kind`, each a value of its own, less
    /// `missing` (a counter summing it is then not given).
    fn reading(kind: ObjectKind, missing: &str) -> StatValues {
        let mut values = StatValues::default();
        for (n, (counter, names)) in kvm_stat_counters(kind).enumerate() {
            for (i, name) in names.iter().enumerate().filter(|(_, name)| **name != missing) {
                let v = 1000 * n as u64 + 7 * i as u64 + 3;
                match (counter.presentation, i) {
                    (Presentation::Histogram, 1) => {
                        values.set_histogram(name, (0..40).map(|b| v + b).collect())
                    }
                    _ => values.set(name, v),
                }
            }
        }
        values
    }

    #[test]
    fn statistics_located_once_write_what_a_reading_by_name_writes() {
        for kind in [ObjectKind::Vp, ObjectKind::Partition] {
            let missing = kvm_stat_counters(kind).next().map(|(_, names)| names[0]).unwrap_or_default();
            let values = reading(kind, missing);
            // A statistic is located by its place among the catalog's names.
            let names: Vec<&str> =
                kvm_stat_counters(kind).flat_map(|(_, names)| names.iter().copied()).collect();
            let resolved = Resolved::of(kind, &|name, buckets| {
                let present =
                    if buckets { values.histogram(name).is_some() } else { values.get(name).is_some() };
                names.iter().position(|n| *n == name).filter(|_| present)
            });
            assert_eq!(resolved.given(), given_by(kind, &values));
            assert!(kind != ObjectKind::Vp || resolved.given().ids().count() > 10, "{:?}", resolved.given());
            // All it gives, and every other counter of it.
            let mut some = CounterSet::EMPTY;
            resolved.given().ids().step_by(2).for_each(|id| some.insert(id));
            for only in [resolved.given(), some] {
                let (by_name, by_place) =
                    (SharedPage::anonymous(kind).unwrap(), SharedPage::anonymous(kind).unwrap());
                write(kind, &by_name, &only, &values);
                resolved.write(
                    &by_place,
                    &only,
                    |i| values.value(names[i]).unwrap_or(0),
                    |i| values.buckets(names[i]).unwrap_or(&[]),
                );
                assert_eq!(by_name.snapshot().data, by_place.snapshot().data, "{kind:?}");
                let written = SharedPage::anonymous(kind).unwrap().snapshot().data != by_name.snapshot().data;
                assert_eq!(written, !only.is_empty(), "{kind:?}");
            }
        }
    }
}
