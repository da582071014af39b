//! The map and unmap rules of seed 003: who may see which stats page, and in what order a request
//! is refused.
//!
//! The same rules serve a guest's HvCallMapStatsPage (through [`crate::hypercall`]) and a root tool
//! attached from another process (through [`crate::attach`]), so they are written against a small
//! [`ObjectDirectory`] (which objects exist and whether their partition is active) and a
//! [`MappingTable`] (what the caller already has mapped), not against any backend.
//!
//! The order, after the hypercall-level checks (alignment, input value, call code):
//! 4. padding or reserved identity bytes nonzero, unknown stats type, area INTERNAL or unknown →
//!    `INVALID_PARAMETER` ([`parse_request`]);
//! 5. caller lacks AccessStats → `ACCESS_DENIED`;
//! 6. a global type (hypervisor, LP) from a guest → `ACCESS_DENIED`;
//! 7. from a guest, any partition but its own, or the PARENT area → `ACCESS_DENIED` — before any
//!    existence check, so a guest learns nothing about other partitions;
//!    the root naming a partition that does not exist → `INVALID_PARTITION_ID`;
//! 8. VP index out of range → `INVALID_VP_INDEX`; an LP index past the host's LPs →
//!    `INVALID_LP_INDEX`;
//! 9. partition not active → `INVALID_PARTITION_STATE` ([`authorize`]);
//! 10. object already mapped by the caller → `OPERATION_DENIED`;
//! 11. the caller's quota of mapped stats pages used up → `INSUFFICIENT_MEMORY`
//!     ([`MappingTable::check_map`]).
//!
//! Unmapping an object the caller has not mapped → `INVALID_PARAMETER` (the TLFS row "the page
//! was not initialized or mapped").

use std::collections::HashMap;

use hvstats_abi::hypercall::{HV_PARTITION_ID_SELF, HV_VP_INDEX_SELF};
use hvstats_abi::{HvError, HvResult, ObjectKind, StatsAreaType, StatsObjectIdentity, StatsObjectType};

/// The default number of stats pages one caller may have mapped at once.
pub const DEFAULT_STATS_PAGE_QUOTA: u32 = 64;

/// The partition id hvstats gives the root partition (guest partitions are numbered from 1).
pub const ROOT_PARTITION_ID: u64 = 0;

/// The mappable views of an object's counters (`HV_STATS_AREA_TYPE` less INTERNAL).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StatsArea {
    /// The object's own view.
    OwnView,
    /// The parent's view (root only).
    Parent,
}

/// One stats object, with `HV_PARTITION_ID_SELF` and `HV_VP_INDEX_SELF` resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StatsObject {
    /// The hypervisor object.
    Hypervisor,
    /// Logical processor `n`.
    LogicalProcessor(u32),
    /// Partition `id`.
    Partition(u64),
    /// VP `index` of partition `id`.
    Vp(u64, u32),
}

impl StatsObject {
    /// The object kind.
    pub const fn kind(self) -> ObjectKind {
        match self {
            StatsObject::Hypervisor => ObjectKind::Hypervisor,
            StatsObject::LogicalProcessor(_) => ObjectKind::LogicalProcessor,
            StatsObject::Partition(_) => ObjectKind::Partition,
            StatsObject::Vp(..) => ObjectKind::Vp,
        }
    }
}

/// What a caller maps: an object and the view of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// The object mapped (SELF ids already resolved).
    pub object: StatsObject,
    /// Which view of it (the object's own or the parent's).
    pub area: StatsArea,
}

/// A well-formed request as the caller wrote it (SELF ids not yet resolved).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatsRequest {
    /// The stats type asked for, as an object kind.
    pub kind: ObjectKind,
    /// The identity (reserved bytes known to be zero).
    pub identity: StatsObjectIdentity,
    /// The requested view.
    pub area: StatsArea,
}

/// Rule 4: the request's form. Nonzero padding or reserved identity bytes, an unknown stats type,
/// and the INTERNAL or an unknown area give `INVALID_PARAMETER`.
///
/// # Errors
/// `HvStatus::INVALID_PARAMETER` as above.
pub fn parse_request(
    stats_type: StatsObjectType,
    padding: u32,
    identity: StatsObjectIdentity,
) -> HvResult<StatsRequest> {
    let kind = stats_type.kind().ok_or(HvError::INVALID_PARAMETER)?;
    if padding != 0 || !identity.reserved_clear(kind) {
        return Err(HvError::INVALID_PARAMETER);
    }
    let area = match identity.area() {
        StatsAreaType::SELF => StatsArea::OwnView,
        StatsAreaType::PARENT => StatsArea::Parent,
        _ => return Err(HvError::INVALID_PARAMETER),
    };
    Ok(StatsRequest { kind, identity, area })
}

/// Who asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requester {
    /// The root partition: the process owning the instance, or a root tool attached to it.
    Root,
    /// A guest partition, from one of its VPs.
    Guest {
        /// The id of the caller's own partition.
        partition_id: u64,
        /// The VP making the call, by its index in that partition.
        vp_index: u32,
    },
}

/// What the rules need to know about a partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionFacts {
    /// Number of VPs: VP indices `0..vp_count` are valid.
    pub vp_count: u32,
    /// True while the partition is active (running, not being torn down).
    pub active: bool,
}

/// The objects of one hypervisor instance, as the rules see them.
pub trait ObjectDirectory {
    /// Number of logical processors with a stats object.
    fn logical_processors(&self) -> u32;
    /// The partition with `id`, if it exists.
    fn partition_facts(&self, id: u64) -> Option<PartitionFacts>;
}

/// Rules 5 to 9: may `requester` (holding AccessStats or not) see the object `request` names?
/// Returns the object with SELF ids resolved.
///
/// # Errors
/// `ACCESS_DENIED`, `INVALID_PARTITION_ID`, `INVALID_VP_INDEX`, `INVALID_LP_INDEX` or
/// `INVALID_PARTITION_STATE`, in the order of the module documentation.
pub fn authorize(
    requester: Requester,
    access_stats: bool,
    request: &StatsRequest,
    directory: &dyn ObjectDirectory,
) -> HvResult<ObjectKey> {
    // Rule 5.
    if !access_stats {
        return Err(HvError::ACCESS_DENIED);
    }
    let object = match requester {
        Requester::Guest { partition_id, vp_index } => {
            guest_object(partition_id, vp_index, request, directory)?
        }
        Requester::Root => root_object(request, directory)?,
    };
    Ok(ObjectKey { object, area: request.area })
}

/// Rules 6 to 9 for a guest of partition `own` calling from its VP `own_vp`.
fn guest_object(
    own: u64,
    own_vp: u32,
    request: &StatsRequest,
    directory: &dyn ObjectDirectory,
) -> HvResult<StatsObject> {
    let id = &request.identity;
    // Rule 6.
    if request.kind.is_global() {
        return Err(HvError::ACCESS_DENIED);
    }
    // Rule 7: before any existence check.
    let target = id.partition_id();
    if (target != HV_PARTITION_ID_SELF && target != own) || request.area == StatsArea::Parent {
        return Err(HvError::ACCESS_DENIED);
    }
    let facts = directory.partition_facts(own).ok_or(HvError::INVALID_PARTITION_ID)?;
    let vp = if id.vp_index() == HV_VP_INDEX_SELF { own_vp } else { id.vp_index() };
    partition_object(request.kind, own, vp, facts)
}

/// Rules 8 and 9 for the root, which may see every object.
fn root_object(request: &StatsRequest, directory: &dyn ObjectDirectory) -> HvResult<StatsObject> {
    let id = &request.identity;
    match request.kind {
        ObjectKind::Hypervisor => Ok(StatsObject::Hypervisor),
        ObjectKind::LogicalProcessor => {
            if id.lp_index() >= directory.logical_processors() {
                return Err(HvError::INVALID_LP_INDEX);
            }
            Ok(StatsObject::LogicalProcessor(id.lp_index()))
        }
        kind @ (ObjectKind::Partition | ObjectKind::Vp) => {
            // The root has no partition or VP object of its own: SELF names nothing.
            let pid = id.partition_id();
            let facts = directory.partition_facts(pid).ok_or(HvError::INVALID_PARTITION_ID)?;
            partition_object(kind, pid, id.vp_index(), facts)
        }
    }
}

/// Rules 8 and 9 for an existing partition `pid` with `facts`: the partition (`kind` Partition)
/// or its VP `vp`, while it is active.
fn partition_object(kind: ObjectKind, pid: u64, vp: u32, facts: PartitionFacts) -> HvResult<StatsObject> {
    let object = match kind {
        ObjectKind::Partition => StatsObject::Partition(pid),
        _ => {
            if vp >= facts.vp_count {
                return Err(HvError::INVALID_VP_INDEX);
            }
            StatsObject::Vp(pid, vp)
        }
    };
    if !facts.active {
        return Err(HvError::INVALID_PARTITION_STATE);
    }
    Ok(object)
}

/// The stats pages one caller has mapped (a guest partition's GPA space, or one root reader),
/// with its quota. `T` is what a mapping holds: a GPA page for a guest, a mapped page for a
/// root reader.
#[derive(Debug)]
pub struct MappingTable<T> {
    entries: HashMap<ObjectKey, T>,
    quota: u32,
}

impl<T> MappingTable<T> {
    /// An empty table allowing `quota` mappings at once.
    pub fn new(quota: u32) -> Self {
        Self { entries: HashMap::new(), quota }
    }

    /// The most mappings held at once; one more fails with `HV_STATUS_INSUFFICIENT_MEMORY`.
    pub fn quota(&self) -> u32 {
        self.quota
    }

    /// Changes the quota; mappings already made stay.
    pub fn set_quota(&mut self, quota: u32) {
        self.quota = quota;
    }

    /// Rules 10 and 11: may `key` be mapped now?
    ///
    /// # Errors
    /// `OPERATION_DENIED` when it is already mapped, `INSUFFICIENT_MEMORY` when the quota is used.
    pub fn check_map(&self, key: &ObjectKey) -> HvResult<()> {
        if self.entries.contains_key(key) {
            return Err(HvError::OPERATION_DENIED);
        }
        if self.entries.len() >= self.quota as usize {
            return Err(HvError::INSUFFICIENT_MEMORY);
        }
        Ok(())
    }

    /// Records a mapping (after [`check_map`](Self::check_map) allowed it).
    pub fn insert(&mut self, key: ObjectKey, value: T) {
        self.entries.insert(key, value);
    }

    /// Removes the mapping of `key`.
    ///
    /// # Errors
    /// `INVALID_PARAMETER` when `key` is not mapped.
    pub fn remove(&mut self, key: &ObjectKey) -> HvResult<T> {
        self.entries.remove(key).ok_or(HvError::INVALID_PARAMETER)
    }

    /// The mapping of `key`.
    pub fn get(&self, key: &ObjectKey) -> Option<&T> {
        self.entries.get(key)
    }

    /// Every mapping.
    pub fn iter(&self) -> impl Iterator<Item = (&ObjectKey, &T)> {
        self.entries.iter()
    }

    /// Number of mappings.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is mapped.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct OnePartition {
        active: bool,
    }

    impl ObjectDirectory for OnePartition {
        fn logical_processors(&self) -> u32 {
            2
        }
        fn partition_facts(&self, id: u64) -> Option<PartitionFacts> {
            (id == 7).then_some(PartitionFacts { vp_count: 2, active: self.active })
        }
    }

    fn request(kind: ObjectKind, identity: StatsObjectIdentity) -> StatsRequest {
        parse_request(kind.object_type(), 0, identity).unwrap()
    }

    #[test]
    fn guest_self_ids_resolve_to_the_caller() {
        let dir = OnePartition { active: true };
        let guest = Requester::Guest { partition_id: 7, vp_index: 1 };
        let req = request(
            ObjectKind::Vp,
            StatsObjectIdentity::vp(HV_PARTITION_ID_SELF, HV_VP_INDEX_SELF, StatsAreaType::SELF),
        );
        let key = authorize(guest, true, &req, &dir).unwrap();
        assert_eq!(key.object, StatsObject::Vp(7, 1));
    }

    #[test]
    fn a_guest_naming_a_missing_partition_is_denied_not_told_it_is_missing() {
        let dir = OnePartition { active: true };
        let guest = Requester::Guest { partition_id: 7, vp_index: 0 };
        let req = request(ObjectKind::Partition, StatsObjectIdentity::partition(99, StatsAreaType::SELF));
        assert_eq!(authorize(guest, true, &req, &dir), Err(HvError::ACCESS_DENIED));
        assert_eq!(authorize(Requester::Root, true, &req, &dir), Err(HvError::INVALID_PARTITION_ID));
    }

    #[test]
    fn root_lp_index_past_the_host_is_invalid_lp_index() {
        let dir = OnePartition { active: true };
        let req = request(
            ObjectKind::LogicalProcessor,
            StatsObjectIdentity::logical_processor(2, StatsAreaType::SELF),
        );
        assert_eq!(authorize(Requester::Root, true, &req, &dir), Err(HvError::INVALID_LP_INDEX));
    }

    #[test]
    fn internal_area_is_an_invalid_parameter() {
        let id = StatsObjectIdentity::partition(7, StatsAreaType::INTERNAL);
        assert_eq!(parse_request(StatsObjectType::PARTITION, 0, id), Err(HvError::INVALID_PARAMETER));
    }

    #[test]
    fn unmapping_what_is_not_mapped_is_an_invalid_parameter() {
        let mut table = MappingTable::<u64>::new(1);
        let key = ObjectKey { object: StatsObject::Hypervisor, area: StatsArea::OwnView };
        assert_eq!(table.remove(&key), Err(HvError::INVALID_PARAMETER));
        table.check_map(&key).unwrap();
        table.insert(key, 5);
        assert_eq!(table.check_map(&key), Err(HvError::OPERATION_DENIED));
        let other = ObjectKey { object: StatsObject::LogicalProcessor(0), area: StatsArea::OwnView };
        assert_eq!(table.check_map(&other), Err(HvError::INSUFFICIENT_MEMORY));
        assert_eq!(table.remove(&key), Ok(5));
    }
}
