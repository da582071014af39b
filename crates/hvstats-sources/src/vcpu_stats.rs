//! The VP counters kept from the vCPU's KVM binary statistics (the catalog's
//! `KvmStats(Vcpu(..))` rows): one `pread` of the stats fd per merge.

use std::sync::atomic::Ordering;

use hvstats::SharedPage;
use hvstats_abi::catalog::{maintained_by, maintained_count};
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::histogram::{BUCKETS, HISTOGRAM_SLOTS};
use hvstats_abi::source::{Source, SourceKind};
use hvstats_abi::{Counter, ObjectKind, Presentation, Unit};

use super::counter_source::{CounterSource, Gives, Object, Part, VpSource, VpThread};
use super::kvm_stats::{KvmStats, Stat};

/// The VP counters kept from the vCPU's KVM statistics: the catalog's `KvmStats(Vcpu(..))` rows,
/// each the sum of the statistics its key names.
///
/// HLT time is the whole time halted: KVM first polls for a wake-up (`halt_poll_success_ns` when
/// one came, `halt_poll_fail_ns` when it gave up), then blocks (`halt_wait_ns`); a halt ended by
/// polling never shows in `halt_wait_ns` alone.
const FROM_KVM_STATS: [&Counter; maintained_count(ObjectKind::Vp, SourceKind::KvmStats)] =
    maintained_by(ObjectKind::Vp, SourceKind::KvmStats);

/// The statistics a KVM-stats counter sums (none for a counter of another source).
pub fn kvm_stat_names(counter: &Counter) -> &'static [&'static str] {
    match counter.maintained.source() {
        Some(Source::KvmStats(key)) => key.names(),
        _ => &[],
    }
}

/// A counter's value from the sum of its statistics: nanoseconds converted to its time unit,
/// raw counts otherwise.
fn stat_value(counter: &Counter, stats: &[Stat], data: &[u64]) -> u64 {
    match counter.unit {
        Unit::Time100ns => stats.iter().map(|s| s.nanoseconds(data)).sum::<u64>() / 100,
        Unit::Nanoseconds => stats.iter().map(|s| s.nanoseconds(data)).sum(),
        _ => stats.iter().map(|s| s.raw(data)).sum(),
    }
}

/// Copies one of KVM's log2 histograms into `page`: the sum from its `_ns` statistic, the buckets
/// from its `_hist` statistic. `stats` are the two, in that order; nothing is written without both.
fn write_kvm_histogram(page: &SharedPage, counter: &Counter, stats: &[Stat], data: &[u64]) {
    let [sum, buckets] = stats else { return };
    copy_kvm_histogram(page, counter, sum.nanoseconds(data), buckets.values(data));
}

/// Copies one of KVM's log2 histograms into `counter`'s slots of `page`: the sum (nanoseconds),
/// then the buckets, whose bucketing (`fls64` of the nanoseconds, capped at the last bucket) is
/// the page's own; a kernel with more buckets than the page puts its excess in the last, open one.
pub fn copy_kvm_histogram(page: &SharedPage, counter: &Counter, sum_ns: u64, values: &[u64]) {
    let slots = page.histogram_slots(counter.id);
    slots[0].store(sum_ns, Ordering::Relaxed);
    for (slot, &v) in slots[1..].iter().zip(values.iter().take(BUCKETS)) {
        slot.store(v, Ordering::Relaxed);
    }
    if values.len() > BUCKETS {
        let rest: u64 = values[BUCKETS..].iter().fold(0, |a, &v| a.wrapping_add(v));
        let last = &slots[HISTOGRAM_SLOTS - 1];
        last.store(values[BUCKETS - 1].wrapping_add(rest), Ordering::Relaxed);
    }
}

/// A vCPU's KVM statistics with the ones hvstats keeps looked up once, and a buffer for the data
/// block, so a refresh is one `pread` and a few indexed loads.
#[derive(Debug)]
pub struct VcpuStats {
    stats: KvmStats,
    /// By [`FROM_KVM_STATS`] row, the statistics the kernel has (one it lacks adds nothing).
    lookups: [Vec<Stat>; FROM_KVM_STATS.len()],
    /// The data block of the last successful read (valid once `read_once`).
    data: Vec<u64>,
    /// The buffer a read fills, swapped with `data` when the read succeeds.
    spare: Vec<u64>,
    read_once: bool,
}

impl VcpuStats {
    /// Looks the statistics hvstats keeps up in `stats`, once.
    pub fn new(stats: KvmStats) -> Self {
        let lookups = FROM_KVM_STATS.map(|c| {
            let found: Vec<Stat> = kvm_stat_names(c).iter().filter_map(|n| stats.stat(n)).collect();
            // A histogram needs both of its statistics, the sum and the buckets, in that order.
            let whole = c.presentation != Presentation::Histogram || found.len() == 2;
            if whole { found } else { Vec::new() }
        });
        let data = vec![0; stats.data_words()];
        Self { stats, lookups, spare: data.clone(), data, read_once: false }
    }

    /// Reads the statistics; a failed read keeps the last reading.
    pub fn read(&mut self) {
        if self.stats.read_into(&mut self.spare).is_ok() {
            std::mem::swap(&mut self.spare, &mut self.data);
            self.read_once = true;
        }
    }

    /// Writes the counters of `only` from the last reading.
    pub fn write(&self, page: &SharedPage, only: &CounterSet) {
        if !self.read_once {
            return;
        }
        let data = &self.data;
        for (counter, stats) in FROM_KVM_STATS.iter().zip(&self.lookups) {
            if !only.contains(counter.id) {
                continue;
            }
            if counter.presentation == Presentation::Histogram {
                write_kvm_histogram(page, counter, stats, data);
            } else {
                page.set(counter.id, stat_value(counter, stats, data));
            }
        }
    }

    /// The counters the kernel's statistics give: those with at least one of their statistics.
    pub fn given(&self) -> CounterSet {
        let mut set = CounterSet::EMPTY;
        for (counter, stats) in FROM_KVM_STATS.iter().zip(&self.lookups) {
            if !stats.is_empty() {
                set.insert(counter.id);
            }
        }
        set
    }
}

impl CounterSource for VcpuStats {
    fn name(&self) -> &'static str {
        "kvm-stats"
    }

    fn gives(&self) -> Gives {
        Gives::vp(self.given())
    }

    fn write(&self, _object: Object, page: &SharedPage, only: &CounterSet) {
        VcpuStats::write(self, page, only);
    }
}

impl VpSource for VcpuStats {
    fn part(&self) -> Part {
        Part::Exits
    }

    fn read(&mut self) {
        VcpuStats::read(self);
    }

    fn kvm_stat(&self, name: &str) -> Option<u64> {
        self.stats.has(name).then(|| self.stats.snapshot().ok().map(|snap| snap.raw(name))).flatten()
    }
}

/// The vCPU's statistics, where the kernel has a stats fd.
pub(super) fn open_source(vp: &VpThread) -> Option<Box<dyn VpSource>> {
    Some(Box::new(VcpuStats::new(KvmStats::open(vp.vcpu_fd).ok()?)))
}
