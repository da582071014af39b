//! Turning `HalAllocateHardwareCounters`' arguments into what is asked for on which processors.
//!
//! Validation follows seed 002 and decides every input before the table is consulted, so a bad
//! request is `STATUS_INVALID_PARAMETER` whatever others hold. Descriptors are checked in order and
//! the first bad one decides: `ExtendedCounterConfiguration` is `STATUS_NOT_SUPPORTED`; everything
//! malformed is `STATUS_INVALID_PARAMETER`. Overlapping descriptors of one request (counter 2 and the
//! range 0-3) merge.
//!
//! What a request holds on each of its processors (see [`ResourceSet::conflicts_with`]):
//! - exclusive use (no resource list): the whole PMU of the processor, so it conflicts with every
//!   other holder there, and every later request there conflicts with it;
//! - counters: each counter index has one holder per processor;
//! - the overflow interrupt: one holder per processor (it has one handler);
//! - the event buffer configuration: one holder per processor (one configuration is programmed);
//! - identification tags: a tag is a name with one holder per processor, so two consumers cannot
//!   claim the same tag on the same processor; different tags never conflict.
//!
//! Without a PMU, a request naming counters, the overflow interrupt or the event buffer cannot be
//! met (`STATUS_INSUFFICIENT_RESOURCES` after validation; counter indices are not checked against
//! a PMU that does not exist). Tags need no hardware and are still arbitrated, and exclusive use
//! succeeds, as seed 002 says happens in a virtual machine.

use std::collections::BTreeSet;

use hvstats_abi::hal::{
    GroupAffinity, NtStatus, PhysicalCounterResourceDescriptor, PhysicalCounterResourceList, ResourceType,
};
use serde::{Deserialize, Serialize};

use super::cpuset::{CpuSet, GROUP_SIZE};
use super::pmu::PmuShape;

/// What one allocation holds on each of its processors.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceSet {
    /// The whole PMU (a request without a resource list).
    pub exclusive: bool,
    /// Counter indices, bit n = counter n (general-purpose first, then fixed); stored and shown
    /// as a list of indices.
    #[serde(with = "counter_list")]
    pub counters: u64,
    /// The counter overflow interrupt.
    pub overflow: bool,
    /// The event buffer configuration.
    pub event_buffer: bool,
    /// Identification tags.
    pub tags: BTreeSet<u32>,
}

impl ResourceSet {
    /// Exclusive use of the whole PMU.
    pub fn exclusive() -> Self {
        Self { exclusive: true, ..Self::default() }
    }

    /// Whether two holders of these sets cannot share a processor (module documentation).
    pub fn conflicts_with(&self, other: &Self) -> bool {
        self.exclusive
            || other.exclusive
            || self.counters & other.counters != 0
            || (self.overflow && other.overflow)
            || (self.event_buffer && other.event_buffer)
            || !self.tags.is_disjoint(&other.tags)
    }

    /// What `self` and `other` cannot both hold on one processor: all of `other` when `self` is
    /// exclusive, the whole PMU when `other` is, otherwise what they have in common.
    pub(crate) fn shared_with(&self, other: &Self) -> Self {
        if other.exclusive {
            return Self::exclusive();
        }
        if self.exclusive {
            return other.clone();
        }
        Self {
            exclusive: false,
            counters: self.counters & other.counters,
            overflow: self.overflow && other.overflow,
            event_buffer: self.event_buffer && other.event_buffer,
            tags: self.tags.intersection(&other.tags).copied().collect(),
        }
    }

    /// Whether the set needs PMU hardware (counters, overflow or event buffer).
    pub fn needs_hardware(&self) -> bool {
        self.counters != 0 || self.overflow || self.event_buffer
    }

    /// The counter indices held, ascending.
    pub fn counter_indices(&self) -> impl Iterator<Item = u32> + '_ {
        (0..64).filter(|i| self.counters & (1u64 << i) != 0)
    }
}

impl std::fmt::Display for ResourceSet {
    /// `exclusive`, or e.g. `counters 0-2,5 overflow tags 7,9`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.exclusive {
            return f.write_str("exclusive (whole PMU)");
        }
        let mut parts = Vec::new();
        if self.counters != 0 {
            let set: CpuSet = self.counter_indices().collect();
            parts.push(format!("counters {set}"));
        }
        if self.overflow {
            parts.push("overflow".into());
        }
        if self.event_buffer {
            parts.push("event-buffer".into());
        }
        if !self.tags.is_empty() {
            let tags: Vec<String> = self.tags.iter().map(u32::to_string).collect();
            parts.push(format!("tags {}", tags.join(",")));
        }
        f.write_str(&parts.join(" "))
    }
}

/// A counter mask as the list of its indices, so the table reads as people write counters.
mod counter_list {
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(mask: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq((0..64u32).filter(|i| mask & (1 << i) != 0))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        Vec::<u32>::deserialize(d)?.into_iter().try_fold(0u64, |m, i| {
            if i < 64 {
                Ok(m | 1 << i)
            } else {
                Err(D::Error::custom(format!("counter index {i} is above 63")))
            }
        })
    }
}

/// A validated request: the same resources on each of a set of processors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The CPUs the resources are asked for on: every processor when no affinity was given.
    pub cpus: CpuSet,
    /// What is held on each of them.
    pub resources: ResourceSet,
}

impl Request {
    /// Validates seed 002's arguments against `pmu` (module documentation).
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER` for malformed input, `STATUS_NOT_SUPPORTED` for
    /// `ExtendedCounterConfiguration`, `STATUS_INSUFFICIENT_RESOURCES` when hardware is asked of a
    /// machine without a PMU.
    pub fn validate(
        affinity: Option<&[GroupAffinity]>,
        resources: Option<&PhysicalCounterResourceList<'_>>,
        pmu: &PmuShape,
    ) -> Result<Self, NtStatus> {
        let cpus = processors(affinity, pmu.processors())?;
        let resources = match resources {
            None => ResourceSet::exclusive(),
            Some(list) => resource_set(list, &cpus, pmu)?,
        };
        Ok(Self { cpus, resources })
    }
}

/// No affinity = every processor; otherwise the union of the groups' masks, each of which must be
/// nonzero, have zero reserved words and name only processors that exist.
fn processors(affinity: Option<&[GroupAffinity]>, processors: u32) -> Result<CpuSet, NtStatus> {
    let Some(groups) = affinity else {
        return Ok(CpuSet::first(processors));
    };
    if groups.is_empty() {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let mut cpus = CpuSet::new();
    for g in groups {
        if g.mask == 0 || g.reserved != [0; 3] {
            return Err(NtStatus::INVALID_PARAMETER);
        }
        for bit in 0..GROUP_SIZE {
            if g.mask & (1 << bit) != 0 {
                let cpu = u32::from(g.group) * GROUP_SIZE + bit;
                if cpu >= processors {
                    return Err(NtStatus::INVALID_PARAMETER);
                }
                cpus.insert(cpu);
            }
        }
    }
    Ok(cpus)
}

fn resource_set(
    list: &PhysicalCounterResourceList<'_>,
    cpus: &CpuSet,
    pmu: &PmuShape,
) -> Result<ResourceSet, NtStatus> {
    if list.count == 0 || list.count as usize != list.descriptors.len() {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let indices = CounterIndices::on(cpus, pmu);
    let mut set = ResourceSet::default();
    let mut counters_named = false;
    for d in list.descriptors {
        counters_named |= add_descriptor(&mut set, d, &indices)?;
    }
    if !pmu.is_present() && (counters_named || set.needs_hardware()) {
        return Err(NtStatus::INSUFFICIENT_RESOURCES);
    }
    Ok(set)
}

/// The counter indices a request may name on its processors.
struct CounterIndices {
    /// The counters that exist on every requested processor (a request names the same indices on
    /// each); `None` without a PMU, where indices are not checked: the request fails later for
    /// want of hardware.
    available: Option<Option<u32>>,
}

impl CounterIndices {
    fn on(cpus: &CpuSet, pmu: &PmuShape) -> Self {
        let available =
            pmu.is_present().then(|| cpus.iter().filter_map(|c| pmu.counters(c)).map(|c| c.total()).min());
        Self { available }
    }

    fn check(&self, i: u32) -> Result<(), NtStatus> {
        match self.available {
            Some(Some(n)) if i < n => Ok(()),
            Some(_) => Err(NtStatus::INVALID_PARAMETER),
            None => Ok(()),
        }
    }

    /// The mask of counters `begin..=end`; empty without a PMU.
    fn bits(&self, begin: u32, end: u32) -> u64 {
        if self.available.is_some() { (begin..=end).fold(0u64, |m, i| m | 1 << i) } else { 0 }
    }
}

/// Adds what descriptor `d` asks for to `set`; true when it names counters.
fn add_descriptor(
    set: &mut ResourceSet,
    d: &PhysicalCounterResourceDescriptor,
    indices: &CounterIndices,
) -> Result<bool, NtStatus> {
    if d.flags != 0 {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let reserved_from = |i: usize| d.u[i..].iter().any(|&w| w != 0);
    match d.resource_type {
        ResourceType::SINGLE => {
            if reserved_from(1) {
                return Err(NtStatus::INVALID_PARAMETER);
            }
            let i = d.counter_index();
            indices.check(i)?;
            set.counters |= indices.bits(i, i);
            return Ok(true);
        }
        ResourceType::RANGE => {
            let (begin, end) = d.range_bounds();
            if reserved_from(2) || begin > end {
                return Err(NtStatus::INVALID_PARAMETER);
            }
            indices.check(end)?;
            set.counters |= indices.bits(begin, end);
            return Ok(true);
        }
        ResourceType::EXTENDED_COUNTER_CONFIGURATION => return Err(NtStatus::NOT_SUPPORTED),
        ResourceType::OVERFLOW => {
            if reserved_from(2) {
                return Err(NtStatus::INVALID_PARAMETER);
            }
            set.overflow = true;
        }
        ResourceType::EVENT_BUFFER => set.event_buffer = true,
        ResourceType::IDENTIFICATION_TAG => {
            if reserved_from(1) {
                return Err(NtStatus::INVALID_PARAMETER);
            }
            set.tags.insert(d.tag());
        }
        _ => return Err(NtStatus::INVALID_PARAMETER),
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use hvstats_abi::hal::PhysicalCounterResourceDescriptor as D;

    use super::*;

    fn pmu() -> PmuShape {
        PmuShape::uniform(128, 6, 3).unwrap()
    }

    fn list(d: &[D]) -> PhysicalCounterResourceList<'_> {
        PhysicalCounterResourceList::new(d)
    }

    #[test]
    fn groups_map_to_linux_cpus() {
        let r = Request::validate(Some(&[GroupAffinity::new(1, 0b101)]), None, &pmu()).unwrap();
        assert_eq!(r.cpus.to_string(), "64,66");
        assert!(r.resources.exclusive);
        let r = Request::validate(None, Some(&list(&[D::range(6, 8)])), &pmu()).unwrap();
        assert_eq!(r.cpus.to_string(), "0-127");
        assert_eq!(r.resources.to_string(), "counters 6-8");
    }

    #[test]
    fn overlapping_descriptors_merge() {
        let d = [D::single(2), D::range(0, 3), D::identification_tag(9), D::identification_tag(9)];
        let r = Request::validate(None, Some(&list(&d)), &pmu()).unwrap();
        assert_eq!(r.resources.counters, 0b1111);
        assert_eq!(r.resources.tags.len(), 1);
    }

    #[test]
    fn first_bad_descriptor_decides() {
        let d = [
            D { resource_type: ResourceType::EXTENDED_COUNTER_CONFIGURATION, ..D::default() },
            D::single(99),
        ];
        assert_eq!(Request::validate(None, Some(&list(&d)), &pmu()), Err(NtStatus::NOT_SUPPORTED));
        let d = [
            D::single(99),
            D { resource_type: ResourceType::EXTENDED_COUNTER_CONFIGURATION, ..D::default() },
        ];
        assert_eq!(Request::validate(None, Some(&list(&d)), &pmu()), Err(NtStatus::INVALID_PARAMETER));
    }

    #[test]
    fn conflict_rules() {
        let c = |counters| ResourceSet { counters, ..ResourceSet::default() };
        let t = |tag| ResourceSet { tags: [tag].into(), ..ResourceSet::default() };
        let o = ResourceSet { overflow: true, ..ResourceSet::default() };
        let e = ResourceSet { event_buffer: true, ..ResourceSet::default() };
        assert!(c(0b11).conflicts_with(&c(0b10)));
        assert!(!c(0b01).conflicts_with(&c(0b10)));
        assert!(t(1).conflicts_with(&t(1)) && !t(1).conflicts_with(&t(2)));
        assert!(o.conflicts_with(&o) && e.conflicts_with(&e) && !o.conflicts_with(&e));
        assert!(
            ResourceSet::exclusive().conflicts_with(&t(1)) && t(1).conflicts_with(&ResourceSet::exclusive())
        );
    }
}
