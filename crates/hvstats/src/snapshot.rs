//! A snapshot of every counter of one attached instance, as a root reader sees it at a moment.
//!
//! Each page is copied from the reader's mapping (checked against its index entry) and decoded by
//! the catalog. A page the reader may not read (a global page when not its owner or root), cannot
//! decode, or that vanished while being read is reported as such, never as zeros; a counter the
//! publisher declared unavailable for a partition, or one the page does not carry (a group of an
//! older minor, written by an older hypervisor), is left out (readers show it as unknown).
//!
//! [`take_partition`] reads one partition and its VPs, so a caller can stream a large instance
//! partition by partition; [`take_instance`] reads everything; [`Instance::snapshot_into`] reads
//! everything into an earlier snapshot's memory, for a reader that reads over and over.

use std::borrow::Cow;
use std::sync::OnceLock;

use hvstats_abi::catalog::{Counter, Presentation, counters_of};
use hvstats_abi::histogram::{HISTOGRAM_SLOTS, Log2Histogram};
use hvstats_abi::page::{PAGE_SLOTS, PageLayout};
use hvstats_abi::vm_sources::{CountOrigins, SourceTable};
use hvstats_abi::{ObjectKind, PageView, StatsPage};
use zerocopy::IntoBytes;

use crate::attach::{AttachError, Instance, PartitionInfo};
use crate::index::{InstanceDescription, ObjectState};
use crate::rules::StatsObject;

/// The counters of one object, or why they could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjectReading {
    /// Every catalog counter of the object's kind that it maintains, with its value, in page order
    /// (counters declared unavailable for it, or that its page does not carry, are left out:
    /// [`get`](Self::get) gives `None`).
    Counters(Vec<(&'static Counter, u64)>),
    /// The page could not be read or decoded.
    Unreadable {
        /// True when the reason is file permissions (a global page read by another user).
        permission_denied: bool,
        /// Why, for people.
        reason: String,
    },
}

impl ObjectReading {
    /// The value of the counter named `name`, if read (and available).
    pub fn get(&self, name: &str) -> Option<u64> {
        match self {
            ObjectReading::Counters(values) => values.iter().find(|(c, _)| c.name == name).map(|(_, v)| *v),
            ObjectReading::Unreadable { .. } => None,
        }
    }

    fn unreadable(e: &AttachError) -> Self {
        ObjectReading::Unreadable { permission_denied: e.is_permission_denied(), reason: error_chain(e) }
    }
}

/// One VP.
#[derive(Clone, Debug)]
pub struct VpSnapshot {
    /// The VP index within its partition (0-based).
    pub index: u32,
    /// Its counters, or why its page could not be read.
    pub reading: ObjectReading,
    /// Its histograms (catalog rows presented as histograms), from the same copy of the page as
    /// `reading`; empty when the page could not be read.
    pub histograms: Vec<(&'static Counter, Log2Histogram)>,
}

/// One partition and its VPs.
#[derive(Clone, Debug)]
pub struct PartitionSnapshot {
    /// The partition id the publisher gave it.
    pub id: u64,
    /// True until the partition stops; its counters then hold final values.
    pub active: bool,
    /// Its name (may be empty).
    pub name: String,
    /// The VMM process running it, for an observed VM.
    pub vmm: Option<crate::vmm::VmmProcess>,
    /// The VM's UUID, for an observed VM whose VMM has one.
    pub uuid: Option<crate::vmm::VmUuid>,
    /// The VM's Hyper-V enlightenments (`hvstats_abi::hyperv_features`; 0: not known).
    pub hyperv_enlightenments: u64,
    /// Why it stopped, when it is not active.
    pub stopped: Option<String>,
    /// Its counters, or why its page could not be read.
    pub reading: ObjectReading,
    /// Its VPs, by index.
    pub vps: Vec<VpSnapshot>,
}

/// One logical processor.
#[derive(Clone, Debug)]
pub struct LpSnapshot {
    /// The LP index in the instance.
    pub index: u32,
    /// The host CPU the LP stands for.
    pub cpu: u32,
    /// Its counters, or why its page could not be read.
    pub reading: ObjectReading,
}

/// Every counter of one instance.
#[derive(Clone, Debug)]
pub struct InstanceSnapshot {
    /// The instance's name.
    pub name: String,
    /// The owning process (as its PID namespace numbers it).
    pub pid: u32,
    /// What its publisher says it is.
    pub description: InstanceDescription,
    /// The hypervisor object's counters, or why its page could not be read.
    pub hypervisor: ObjectReading,
    /// The LPs, by index (empty when the global pages cannot be read).
    pub lps: Vec<LpSnapshot>,
    /// The partitions, by id (empty from [`take_instance_globals`]).
    pub partitions: Vec<PartitionSnapshot>,
    /// When the publisher last refreshed its counters, by its arena's header, in µs since the
    /// Unix epoch (`None` before its first refresh): read before its pages, outside their
    /// sequence counters, so only the time of the pages that carry none of their own
    /// (`vp::PUBLISHED`).
    pub refreshed_us: Option<u64>,
    /// Values the publisher keeps by name beside its pages, for counters the catalog has no
    /// place for (an mshv observer's, see [`crate::unmapped`]); `None` when it keeps none,
    /// or they cannot be read.
    pub unmapped: Option<crate::unmapped::Unmapped>,
}

/// Decodes `page` as `kind` into every catalog counter of that kind.
pub fn decode(kind: ObjectKind, page: &StatsPage) -> ObjectReading {
    Selection::of(kind, &|_| false).decode(&page.data)
}

/// Per kind: the page's expected header words (slot, word) and each counter with its slot.
struct KindTable {
    /// Words up to and including END_OF_LIST: all a page of this build's layout uses.
    used: usize,
    headers: Vec<(usize, u64)>,
    counters: Vec<(&'static Counter, usize)>,
    /// The rows presented as histograms, each with its first slot.
    histograms: Vec<(&'static Counter, usize)>,
}

impl KindTable {
    /// True when `data` has this build's headers: each counter is then at its slot.
    fn laid_out(&self, data: &[u64]) -> bool {
        self.headers.iter().all(|&(slot, word)| data.get(slot) == Some(&word))
    }
}

fn table(kind: ObjectKind) -> &'static KindTable {
    static TABLES: OnceLock<Vec<KindTable>> = OnceLock::new();
    let tables = TABLES.get_or_init(|| {
        ObjectKind::ALL
            .iter()
            .map(|&kind| {
                let mut words = [0u64; PAGE_SLOTS];
                PageLayout::of(kind).write_headers(&mut words);
                let layout = PageLayout::of(kind);
                let mut headers: Vec<(usize, u64)> =
                    layout.slots().map(|g| g.header_offset / 8).map(|s| (s, words[s])).collect();
                headers.push((layout.end_offset / 8, words[layout.end_offset / 8]));
                let counters: Vec<_> = counters_of(kind).map(|c| (c, c.id.slot())).collect();
                KindTable {
                    used: layout.end_offset / 8 + 1,
                    headers,
                    histograms: counters
                        .iter()
                        .filter(|(c, _)| c.presentation == Presentation::Histogram)
                        .copied()
                        .collect(),
                    counters,
                }
            })
            .collect()
    });
    &tables[kind as usize]
}

/// What a reader decodes of the objects of one kind that share one set of unavailable counters
/// (a partition's VPs): the kind's counters and histograms with the unavailable ones left out,
/// chosen once for them all. A snapshot of 65,536 VPs decodes some five million counters; asking
/// whether each is unavailable, object by object, cost more than copying the pages.
struct Selection {
    kind: ObjectKind,
    table: &'static KindTable,
    counters: Cow<'static, [(&'static Counter, usize)]>,
    histograms: Cow<'static, [(&'static Counter, usize)]>,
}

impl Selection {
    /// The counters of `kind` for which `unavailable` (given a counter's slot) is false.
    fn of(kind: ObjectKind, unavailable: &dyn Fn(usize) -> bool) -> Self {
        let table = table(kind);
        let keep = |list: &'static [(&'static Counter, usize)]| -> Cow<'static, _> {
            if list.iter().any(|&(_, slot)| unavailable(slot)) {
                Cow::Owned(list.iter().filter(|&&(_, slot)| !unavailable(slot)).copied().collect())
            } else {
                Cow::Borrowed(list)
            }
        };
        Self { kind, table, counters: keep(&table.counters), histograms: keep(&table.histograms) }
    }

    /// Decodes a page's words into `out`, reusing its memory: when its headers are this build's
    /// layout (the usual case), each counter is read at its slot; otherwise the page is parsed as
    /// seed 004 allows (other versions).
    fn decode_into(&self, data: &[u64; PAGE_SLOTS], out: &mut ObjectReading) {
        let values = match out {
            ObjectReading::Counters(values) => values,
            ObjectReading::Unreadable { .. } => {
                *out = ObjectReading::Counters(Vec::with_capacity(self.counters.len()));
                let ObjectReading::Counters(values) = out else { return };
                values
            }
        };
        values.clear();
        if self.table.laid_out(data) {
            values.reserve_exact(self.counters.len());
            values.extend(self.counters.iter().map(|&(c, slot)| (c, data[slot])));
            return;
        }
        match PageView::read(data.as_bytes(), self.kind) {
            // A counter the page does not carry (its group is of an older minor) is left out, as
            // an unavailable one is: readers show it as unknown, never as 0.
            Ok(view) => {
                values.extend(self.counters.iter().filter_map(|&(c, _)| Some((c, view.value(c.id)?))))
            }
            Err(e) => {
                *out = ObjectReading::Unreadable {
                    permission_denied: false,
                    reason: format!("malformed page: {e}"),
                }
            }
        }
    }

    /// Decodes a page's words (see [`decode_into`](Self::decode_into)).
    fn decode(&self, data: &[u64; PAGE_SLOTS]) -> ObjectReading {
        let mut reading = ObjectReading::Counters(Vec::new());
        self.decode_into(data, &mut reading);
        reading
    }

    /// The histograms of the page `data` (of a VP), each chosen catalog row presented as one,
    /// into `out` (emptied first, its memory reused).
    fn histograms_into(&self, data: &[u64; PAGE_SLOTS], out: &mut Vec<(&'static Counter, Log2Histogram)>) {
        out.clear();
        if self.histograms.is_empty() {
            return;
        }
        if self.table.laid_out(data) {
            // This build's layout (the usual case): each histogram at its slots, no parsing, in
            // one allocation of the size they take.
            out.reserve_exact(self.histograms.len());
            out.extend(self.histograms.iter().filter_map(|&(c, slot)| {
                Some((c, Log2Histogram::from_slots(data.get(slot..slot + HISTOGRAM_SLOTS)?)?))
            }));
            return;
        }
        let Ok(view) = PageView::read(data.as_bytes(), self.kind) else { return };
        out.extend(self.histograms.iter().filter_map(|&(c, _)| Some((c, view.histogram(c.id)?))));
    }

    /// Copies the used part of the page first (`copy_prefix`) into `buf`: when its headers are
    /// this build's, that is all there is; otherwise the whole page, parsed as seed 004 allows;
    /// and decodes it into `out`.
    fn read_into(
        &self,
        buf: &mut StatsPage,
        copy_prefix: impl Fn(&mut [u64]) -> Result<(), AttachError>,
        out: &mut ObjectReading,
    ) {
        let copied = match copy_prefix(&mut buf.data[..self.table.used]) {
            Ok(()) if self.table.laid_out(&buf.data) => Ok(()),
            Ok(()) => copy_prefix(&mut buf.data[..]),
            Err(e) => Err(e),
        };
        match copied {
            Ok(()) => self.decode_into(&buf.data, out),
            Err(e) => *out = ObjectReading::unreadable(&e),
        }
    }
}

fn read(
    instance: &Instance,
    object: StatsObject,
    buf: &mut StatsPage,
    unavailable: &dyn Fn(usize) -> bool,
) -> ObjectReading {
    let mut reading = ObjectReading::Counters(Vec::new());
    Selection::of(object.kind(), unavailable).read_into(
        buf,
        |out| instance.read_prefix(object, out),
        &mut reading,
    );
    reading
}

use crate::error_chain;

impl PartitionSnapshot {
    /// Which source of an observed VM gave each of its counters, as its partition page says
    /// ([`SourceTable`]); `None` for a partition that names no source (our own, or an
    /// unreadable page).
    pub fn sources(&self) -> Option<SourceTable> {
        let ObjectReading::Counters(values) = &self.reading else { return None };
        SourceTable::decode(|id| values.iter().find(|(c, _)| c.id == id).map(|(_, v)| *v))
    }

    /// From when its counters count, as its page says ([`CountOrigins`]; all unknown for an
    /// unreadable page or one of an older publisher).
    pub fn origins(&self) -> CountOrigins {
        let ObjectReading::Counters(values) = &self.reading else { return CountOrigins::default() };
        CountOrigins::decode(|id| values.iter().find(|(c, _)| c.id == id).map(|(_, v)| *v))
    }

    /// The readable VPs summed counter by counter (`None` when none was readable): a partition's
    /// total, for every surface that shows one. A counter some VP does not have is left out.
    pub fn vps_summed(&self) -> Option<ObjectReading> {
        let mut sum: Option<Vec<(&'static Counter, u64)>> = None;
        for vp in &self.vps {
            let ObjectReading::Counters(values) = &vp.reading else { continue };
            match &mut sum {
                None => sum = Some(values.clone()),
                // The usual case: the same counters in the same order.
                Some(sum)
                    if sum.len() == values.len() && sum.iter().zip(values).all(|(a, b)| a.0.id == b.0.id) =>
                {
                    for ((_, total), (_, v)) in sum.iter_mut().zip(values) {
                        *total = total.wrapping_add(*v);
                    }
                }
                Some(sum) => {
                    sum.retain_mut(|(c, total)| match values.iter().find(|(other, _)| other.id == c.id) {
                        Some((_, v)) => {
                            *total = total.wrapping_add(*v);
                            true
                        }
                        None => false,
                    })
                }
            }
        }
        let mut sum = sum?;
        // A time is not a count: the VPs' publication time is their mean, whose change is the
        // mean of theirs (the VPs of one refresh move together).
        let published_id = hvstats_abi::catalog::vp::PUBLISHED;
        let name = published_id.counter().map_or("", |c| c.name);
        let published: Vec<u64> =
            self.vps.iter().filter_map(|vp| vp.reading.get(name)).filter(|&t| t != 0).collect();
        if let Some((_, total)) = sum.iter_mut().find(|(c, _)| c.id == published_id) {
            *total = match published.len() {
                n if n == self.vps.len() => {
                    published.iter().map(|&t| u128::from(t)).sum::<u128>() as u64 / n as u64
                }
                // Some VP has not published yet: no time for the sum.
                _ => 0,
            };
        }
        Some(ObjectReading::Counters(sum))
    }
}

impl Instance {
    /// Every counter of the instance now (after a [`refresh`](Self::refresh)).
    pub fn snapshot(&mut self) -> InstanceSnapshot {
        self.refresh();
        take_instance(self)
    }

    /// [`snapshot`](Self::snapshot) into `snapshot`, reusing the memory of what it held (an
    /// earlier snapshot, of this instance or another): the same values, without allocating
    /// where the shapes did not change. A reader that snapshots a large host over and over
    /// (65,536 VPs: some 220 MB of counters and histograms) otherwise spends as long having
    /// fresh memory faulted in as reading the pages.
    pub fn snapshot_into(&mut self, snapshot: &mut InstanceSnapshot) {
        self.refresh();
        take_instance_into(self, snapshot);
    }
}

/// Reads one partition of `instance` and its VPs, as its last refresh listed them: `None` when
/// the partition was removed while being read; a VP removed while being read is left out. (What
/// was removed is gone, not unreadable: a reader racing a VM's teardown reports no failure.)
pub fn take_partition(instance: &Instance, p: &PartitionInfo) -> Option<PartitionSnapshot> {
    let mut snapshot = PartitionSnapshot {
        id: p.id,
        active: false,
        name: String::new(),
        vmm: None,
        uuid: None,
        hyperv_enlightenments: 0,
        stopped: None,
        reading: ObjectReading::Counters(Vec::new()),
        vps: Vec::with_capacity(p.vp_indices().len()),
    };
    take_partition_into(instance, p, &mut snapshot).then_some(snapshot)
}

/// [`take_partition`] into `out`, reusing the memory of what it held; false when the partition
/// was removed while being read.
fn take_partition_into(instance: &Instance, p: &PartitionInfo, out: &mut PartitionSnapshot) -> bool {
    let mut buf = StatsPage::default();
    out.id = p.id;
    out.active = p.is_active();
    out.name.clone_from(&p.name);
    out.vmm = p.vmm;
    out.uuid = p.uuid;
    out.hyperv_enlightenments = p.hyperv_enlightenments;
    out.stopped = match &p.state {
        ObjectState::Active => None,
        ObjectState::Stopped { reason } => Some(reason.clone()),
    };
    let partition =
        Selection::of(ObjectKind::Partition, &|slot| p.is_unavailable(ObjectKind::Partition, slot));
    partition.read_into(
        &mut buf,
        |words| instance.read_prefix(StatsObject::Partition(p.id), words),
        &mut out.reading,
    );
    let gone = |reading: &ObjectReading, object| {
        matches!(reading, ObjectReading::Unreadable { .. }) && instance.removed_since_refresh(object)
    };
    if gone(&out.reading, StatsObject::Partition(p.id)) {
        return false;
    }
    // Its VPs share one set of unavailable counters: chosen once for them all.
    let vp = Selection::of(ObjectKind::Vp, &|slot| p.is_unavailable(ObjectKind::Vp, slot));
    let indices = p.vp_indices();
    out.vps.truncate(indices.len());
    for (i, &index) in indices.iter().enumerate() {
        if out.vps.len() == i {
            out.vps.push(VpSnapshot {
                index,
                reading: ObjectReading::Counters(Vec::new()),
                histograms: Vec::new(),
            });
        }
        let snapshot = &mut out.vps[i];
        snapshot.index = index;
        vp.read_into(&mut buf, |words| instance.read_vp_prefix(p, i, words), &mut snapshot.reading);
        match snapshot.reading {
            ObjectReading::Counters(_) => vp.histograms_into(&buf.data, &mut snapshot.histograms),
            ObjectReading::Unreadable { .. } => snapshot.histograms.clear(),
        }
    }
    out.vps.retain(|v| !gone(&v.reading, StatsObject::Vp(p.id, v.index)));
    true
}

#[cfg(test)]
/// The histograms of the VP page in `page`, each catalog row presented as one, unless declared
/// unavailable.
pub(crate) fn histograms_of(
    page: &StatsPage,
    unavailable: &dyn Fn(usize) -> bool,
) -> Vec<(&'static Counter, Log2Histogram)> {
    let mut histograms = Vec::new();
    Selection::of(ObjectKind::Vp, unavailable).histograms_into(&page.data, &mut histograms);
    histograms
}

/// Reads every object of `instance`, as its last refresh listed them.
pub fn take_instance(instance: &Instance) -> InstanceSnapshot {
    let mut snapshot = take_instance_globals(instance);
    snapshot.partitions = instance.partitions().iter().filter_map(|p| take_partition(instance, p)).collect();
    snapshot
}

/// [`take_instance`] into `out`, reusing the memory of its partitions and VPs.
fn take_instance_into(instance: &Instance, out: &mut InstanceSnapshot) {
    let mut partitions = std::mem::take(&mut out.partitions);
    *out = take_instance_globals(instance);
    let list = instance.partitions();
    partitions.truncate(list.len());
    let mut kept = 0;
    for p in list {
        let present = match partitions.get_mut(kept) {
            Some(reused) => take_partition_into(instance, p, reused),
            None => take_partition(instance, p).map(|s| partitions.push(s)).is_some(),
        };
        kept += usize::from(present);
    }
    partitions.truncate(kept);
    out.partitions = partitions;
}

/// Reads the instance's description, hypervisor and LPs, leaving its partitions out (to stream
/// them one by one with [`take_partition`]).
pub fn take_instance_globals(instance: &Instance) -> InstanceSnapshot {
    let mut buf = StatsPage::default();
    let hypervisor_unavailable = |slot| instance.hypervisor_unavailable(slot);
    let global_error = instance.global_unreadable().map(|(reason, denied)| ObjectReading::Unreadable {
        permission_denied: denied,
        reason: reason.to_owned(),
    });
    InstanceSnapshot {
        name: instance.name().to_string(),
        pid: u32::try_from(instance.pid()).unwrap_or(u32::MAX),
        description: instance.description().clone(),
        hypervisor: global_error
            .clone()
            .unwrap_or_else(|| read(instance, StatsObject::Hypervisor, &mut buf, &hypervisor_unavailable)),
        lps: instance
            .logical_processors()
            .iter()
            .map(|lp| LpSnapshot {
                index: lp.index,
                cpu: lp.cpu,
                reading: read(instance, StatsObject::LogicalProcessor(lp.index), &mut buf, &|slot| {
                    lp.is_unavailable(slot)
                }),
            })
            .collect(),
        partitions: Vec::new(),
        refreshed_us: instance.refreshed_us(),
        unmapped: crate::unmapped::read(instance).ok().flatten(),
    }
}

#[cfg(test)]
mod tests {
    use hvstats_abi::GroupKind;
    use hvstats_abi::catalog::vp;
    use hvstats_abi::group::GroupVersion;

    use super::*;

    fn name(id: hvstats_abi::CounterId) -> &'static str {
        id.counter().map_or("", |c| c.name)
    }

    #[test]
    fn a_1_0_page_decodes_with_what_it_does_not_carry_left_out() {
        let v1_0 = [(GroupKind::Architectural, GroupVersion::V1_0), (GroupKind::Release, GroupVersion::V1_0)];
        let layout = PageLayout::written_at(ObjectKind::Vp, &v1_0);
        let mut page = layout.page();
        let slot = layout.slot_of(vp::HYPERCALLS).expect("a 1.0 counter");
        page.data[slot] = 5;
        let reading = decode(ObjectKind::Vp, &page);
        assert_eq!(reading.get(name(vp::HYPERCALLS)), Some(5));
        for absent in [vp::DISPATCHES, vp::CPU_WAIT_TIME_PER_DISPATCH, vp::SEQUENCE, vp::IO_TIME_HISTOGRAM] {
            assert_eq!(reading.get(name(absent)), None, "{}", name(absent));
        }
        let ObjectReading::Counters(values) = &reading else { panic!("{reading:?}") };
        assert_eq!(values.len(), 2 + 63);
        assert!(histograms_of(&page, &|_| false).is_empty());

        // This build's page: every counter and histogram, from their slots.
        let mut page = StatsPage::new(ObjectKind::Vp);
        page.set(vp::DISPATCHES, 3);
        page.data[vp::IO_TIME_HISTOGRAM.slot()] = 700;
        page.data[vp::IO_TIME_HISTOGRAM.slot() + 1 + 10] = 1;
        assert_eq!(decode(ObjectKind::Vp, &page).get(name(vp::DISPATCHES)), Some(3));
        let histograms = histograms_of(&page, &|slot| slot == vp::HALT_WAIT_HISTOGRAM.slot());
        assert_eq!(histograms.len(), 7, "eight, one declared unavailable");
        let io = histograms.iter().find(|(c, _)| c.id == vp::IO_TIME_HISTOGRAM).map(|(_, h)| h);
        assert_eq!(io.map(|h| (h.sum_ns, h.count())), Some((700, 1)));
    }
}
