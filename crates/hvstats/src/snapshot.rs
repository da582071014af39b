//! A snapshot of every counter of one attached instance, as a root reader sees it at a moment.
//!
//! Each page is copied from the reader's mapping (checked against its index entry) and decoded by
//! the catalog. A page the reader may not read (a global page when not its owner or root), cannot
//! decode, or that vanished while being read is reported as such, never as zeros; a counter the
//! publisher declared unavailable for a partition, or one the page does not carry (a group of an
//! older minor, written by an older hypervisor), is left out (readers show it as unknown).
//!
//! [`take_partition`] reads one partition and its VPs, so a caller can stream a large instance
//! partition by partition; [`take_instance`] reads everything.

use std::sync::OnceLock;

use hvstats_abi::catalog::{Counter, Presentation, counters_of};
use hvstats_abi::histogram::{HISTOGRAM_SLOTS, Log2Histogram};
use hvstats_abi::page::{PAGE_SLOTS, PageLayout};
use hvstats_abi::vm_sources::SourceTable;
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
    /// Values the publisher keeps by name beside its pages, for counters the catalog has no
    /// place for (an mshv observer's, see [`crate::unmapped`]); `None` when it keeps none,
    /// or they cannot be read.
    pub unmapped: Option<crate::unmapped::Unmapped>,
}

/// Decodes `page` as `kind` into every catalog counter of that kind.
pub fn decode(kind: ObjectKind, page: &StatsPage) -> ObjectReading {
    decode_with(kind, &page.data, &|_| false)
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

/// Decodes a page's words: when its headers are this build's layout (the usual case), each
/// counter is read at its slot; otherwise the page is parsed as seed 004 allows (other versions).
fn decode_with(
    kind: ObjectKind,
    data: &[u64; PAGE_SLOTS],
    unavailable: &dyn Fn(usize) -> bool,
) -> ObjectReading {
    let t = table(kind);
    if t.laid_out(data) {
        let mut values = Vec::with_capacity(t.counters.len());
        values.extend(
            t.counters.iter().filter(|(_, slot)| !unavailable(*slot)).map(|&(c, slot)| (c, data[slot])),
        );
        return ObjectReading::Counters(values);
    }
    match PageView::read(data.as_bytes(), kind) {
        // A counter the page does not carry (its group is of an older minor) is left out, as an
        // unavailable one is: readers show it as unknown, never as 0.
        Ok(view) => ObjectReading::Counters(
            t.counters
                .iter()
                .filter(|(_, slot)| !unavailable(*slot))
                .filter_map(|&(c, _)| Some((c, view.value(c.id)?)))
                .collect(),
        ),
        Err(e) => {
            ObjectReading::Unreadable { permission_denied: false, reason: format!("malformed page: {e}") }
        }
    }
}

fn read(
    instance: &Instance,
    object: StatsObject,
    buf: &mut StatsPage,
    unavailable: &dyn Fn(usize) -> bool,
) -> ObjectReading {
    read_with(object, buf, unavailable, &|out| instance.read_prefix(object, out))
}

/// Copies the used part of the page first (`copy_prefix`): when its headers are this build's,
/// that is all there is; otherwise the whole page, parsed as seed 004 allows.
fn read_with(
    object: StatsObject,
    buf: &mut StatsPage,
    unavailable: &dyn Fn(usize) -> bool,
    copy_prefix: &dyn Fn(&mut [u64]) -> Result<(), AttachError>,
) -> ObjectReading {
    let t = table(object.kind());
    let copied = match copy_prefix(&mut buf.data[..t.used]) {
        Ok(()) if t.laid_out(&buf.data) => Ok(()),
        Ok(()) => copy_prefix(&mut buf.data[..]),
        Err(e) => Err(e),
    };
    match copied {
        Ok(()) => decode_with(object.kind(), &buf.data, unavailable),
        Err(e) => ObjectReading::unreadable(&e),
    }
}

pub use crate::error_chain::error_chain;

impl PartitionSnapshot {
    /// Which source of an observed VM gave each of its counters, as its partition page says
    /// ([`SourceTable`]); `None` for a partition that names no source (our own, or an
    /// unreadable page).
    pub fn sources(&self) -> Option<SourceTable> {
        let ObjectReading::Counters(values) = &self.reading else { return None };
        SourceTable::decode(|id| values.iter().find(|(c, _)| c.id == id).map(|(_, v)| *v))
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
        sum.map(ObjectReading::Counters)
    }
}

impl Instance {
    /// Every counter of the instance now (after a [`refresh`](Self::refresh)).
    pub fn snapshot(&mut self) -> InstanceSnapshot {
        self.refresh();
        take_instance(self)
    }
}

/// Reads one partition of `instance` and its VPs, as its last refresh listed them.
pub fn take_partition(instance: &Instance, p: &PartitionInfo) -> PartitionSnapshot {
    let mut buf = StatsPage::default();
    let part_unavailable = |slot| p.is_unavailable(ObjectKind::Partition, slot);
    let vp_unavailable = |slot| p.is_unavailable(ObjectKind::Vp, slot);
    PartitionSnapshot {
        id: p.id,
        active: p.is_active(),
        name: p.name.clone(),
        vmm: p.vmm,
        uuid: p.uuid,
        stopped: match &p.state {
            ObjectState::Active => None,
            ObjectState::Stopped { reason } => Some(reason.clone()),
        },
        reading: read(instance, StatsObject::Partition(p.id), &mut buf, &part_unavailable),
        vps: p
            .vp_indices()
            .iter()
            .enumerate()
            .map(|(i, &index)| {
                let reading = read_with(StatsObject::Vp(p.id, index), &mut buf, &vp_unavailable, &|out| {
                    instance.read_vp_prefix(p, i, out)
                });
                let histograms = match reading {
                    ObjectReading::Counters(_) => histograms_of(&buf, &vp_unavailable),
                    ObjectReading::Unreadable { .. } => Vec::new(),
                };
                VpSnapshot { index, reading, histograms }
            })
            .collect(),
    }
}

/// The histograms of the VP page in `page`, each catalog row presented as one, unless declared
/// unavailable.
pub fn histograms_of(
    page: &StatsPage,
    unavailable: &dyn Fn(usize) -> bool,
) -> Vec<(&'static Counter, Log2Histogram)> {
    let t = table(ObjectKind::Vp);
    if t.laid_out(&page.data) {
        // This build's layout (the usual case): each histogram at its slots, no parsing.
        let mut histograms = Vec::with_capacity(t.histograms.len());
        histograms.extend(t.histograms.iter().filter(|(_, slot)| !unavailable(*slot)).filter_map(
            |&(c, slot)| Some((c, Log2Histogram::from_slots(page.data.get(slot..slot + HISTOGRAM_SLOTS)?)?)),
        ));
        return histograms;
    }
    let Ok(view) = PageView::read(page.as_bytes(), ObjectKind::Vp) else { return Vec::new() };
    counters_of(ObjectKind::Vp)
        .filter(|c| c.presentation == Presentation::Histogram && !unavailable(c.id.slot()))
        .filter_map(|c| Some((c, view.histogram(c.id)?)))
        .collect()
}

/// Reads every object of `instance`, as its last refresh listed them.
pub fn take_instance(instance: &Instance) -> InstanceSnapshot {
    let mut snapshot = take_instance_globals(instance);
    snapshot.partitions = instance.partitions().iter().map(|p| take_partition(instance, p)).collect();
    snapshot
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
