//! Stats objects: the four object types of the TLFS and their 16-byte identities.
//!
//! `HV_STATS_OBJECT_TYPE` is a `u32` that comes from outside (a guest's hypercall input, a file), so
//! it is an open type: an unknown value round-trips and can be reported instead of panicking.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `HV_STATS_OBJECT_TYPE`: which kind of object a stats page describes (open enum).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    IntoBytes,
    FromBytes,
    Immutable,
    KnownLayout,
)]
#[repr(transparent)]
pub struct StatsObjectType(pub u32);

impl StatsObjectType {
    /// `HvStatsObjectHypervisor`: hypervisor-wide counters (global, root only).
    pub const HYPERVISOR: Self = Self(0x0000_0001);
    /// `HvStatsObjectLogicalProcessor`: one host processor (global, root only).
    pub const LOGICAL_PROCESSOR: Self = Self(0x0000_0002);
    /// `HvStatsObjectPartition`: one partition (local).
    pub const PARTITION: Self = Self(0x0001_0001);
    /// `HvStatsObjectVp`: one virtual processor of a partition (local).
    pub const VP: Self = Self(0x0001_0002);

    /// The known object kind of this type, if any.
    pub const fn kind(self) -> Option<ObjectKind> {
        match self {
            Self::HYPERVISOR => Some(ObjectKind::Hypervisor),
            Self::LOGICAL_PROCESSOR => Some(ObjectKind::LogicalProcessor),
            Self::PARTITION => Some(ObjectKind::Partition),
            Self::VP => Some(ObjectKind::Vp),
            _ => None,
        }
    }
}

/// The four kinds of stats object hvstats knows (the closed form of [`StatsObjectType`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    /// The hypervisor as a whole.
    Hypervisor,
    /// One logical (host) processor.
    LogicalProcessor,
    /// One partition.
    Partition,
    /// One virtual processor.
    Vp,
}

impl ObjectKind {
    /// Every kind, in catalog order.
    pub const ALL: [ObjectKind; 4] =
        [ObjectKind::Hypervisor, ObjectKind::LogicalProcessor, ObjectKind::Partition, ObjectKind::Vp];

    /// The wire value of this kind.
    pub const fn object_type(self) -> StatsObjectType {
        match self {
            ObjectKind::Hypervisor => StatsObjectType::HYPERVISOR,
            ObjectKind::LogicalProcessor => StatsObjectType::LOGICAL_PROCESSOR,
            ObjectKind::Partition => StatsObjectType::PARTITION,
            ObjectKind::Vp => StatsObjectType::VP,
        }
    }

    /// Global kinds (hypervisor, LP) may be read by the root partition only.
    pub const fn is_global(self) -> bool {
        matches!(self, ObjectKind::Hypervisor | ObjectKind::LogicalProcessor)
    }

    /// The short name used on the command line and in JSON: `hypervisor`, `lp`, `partition`, `vp`.
    pub const fn short_name(self) -> &'static str {
        match self {
            ObjectKind::Hypervisor => "hypervisor",
            ObjectKind::LogicalProcessor => "lp",
            ObjectKind::Partition => "partition",
            ObjectKind::Vp => "vp",
        }
    }

    /// The perfmon counter-set title of this kind.
    pub const fn title(self) -> &'static str {
        match self {
            ObjectKind::Hypervisor => "Hyper-V Hypervisor",
            ObjectKind::LogicalProcessor => "Hyper-V Hypervisor Logical Processor",
            ObjectKind::Partition => "Hyper-V Hypervisor Partition",
            ObjectKind::Vp => "Hyper-V Hypervisor Virtual Processor",
        }
    }

    /// Parses a [`short_name`](Self::short_name).
    pub fn from_short_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.short_name() == name)
    }
}

/// `HV_STATS_AREA_TYPE`: which view of an object's counters a page shows (open enum).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, IntoBytes, FromBytes, Immutable, KnownLayout)]
#[repr(transparent)]
pub struct StatsAreaType(pub u8);

impl StatsAreaType {
    /// The object's own view (what a partition maps for itself).
    pub const SELF: Self = Self(0);
    /// The parent's view (what the root maps for its children).
    pub const PARENT: Self = Self(1);
    /// The hypervisor-internal view; never mappable.
    pub const INTERNAL: Self = Self(2);
}

/// `HV_STATS_OBJECT_IDENTITY`: the 16-byte union naming one object.
///
/// Layout (byte offsets): LP index u32 @0; partition id u64 @0; VP index u32 @8; stats area type
/// u8 @15. Every byte not used by the object's type is reserved and must be zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, IntoBytes, FromBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct StatsObjectIdentity {
    /// The raw bytes; use the accessors.
    pub bytes: [u8; 16],
}

const _: () = assert!(size_of::<StatsObjectIdentity>() == 16);

/// Byte offset of the stats area type in an identity.
pub const IDENTITY_AREA_OFFSET: usize = 15;

impl StatsObjectIdentity {
    /// The hypervisor object.
    pub const fn hypervisor(area: StatsAreaType) -> Self {
        let mut bytes = [0; 16];
        bytes[IDENTITY_AREA_OFFSET] = area.0;
        Self { bytes }
    }

    /// Logical processor `lp_index`.
    pub const fn logical_processor(lp_index: u32, area: StatsAreaType) -> Self {
        let mut id = Self::hypervisor(area);
        id.set_u32(0, lp_index);
        id
    }

    /// Partition `partition_id`.
    pub const fn partition(partition_id: u64, area: StatsAreaType) -> Self {
        let mut id = Self::hypervisor(area);
        let b = partition_id.to_le_bytes();
        let mut i = 0;
        while i < 8 {
            id.bytes[i] = b[i];
            i += 1;
        }
        id
    }

    /// Virtual processor `vp_index` of partition `partition_id`.
    pub const fn vp(partition_id: u64, vp_index: u32, area: StatsAreaType) -> Self {
        let mut id = Self::partition(partition_id, area);
        id.set_u32(8, vp_index);
        id
    }

    const fn set_u32(&mut self, at: usize, v: u32) {
        let b = v.to_le_bytes();
        self.bytes[at] = b[0];
        self.bytes[at + 1] = b[1];
        self.bytes[at + 2] = b[2];
        self.bytes[at + 3] = b[3];
    }

    const fn u32_at(&self, at: usize) -> u32 {
        u32::from_le_bytes([self.bytes[at], self.bytes[at + 1], self.bytes[at + 2], self.bytes[at + 3]])
    }

    /// LP index (bytes 0..4), meaningful for logical processor objects.
    pub const fn lp_index(&self) -> u32 {
        self.u32_at(0)
    }

    /// Partition id (bytes 0..8), meaningful for partition and VP objects.
    pub const fn partition_id(&self) -> u64 {
        let b = &self.bytes;
        u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
    }

    /// VP index (bytes 8..12), meaningful for VP objects.
    pub const fn vp_index(&self) -> u32 {
        self.u32_at(8)
    }

    /// The stats area type (byte 15).
    pub const fn area(&self) -> StatsAreaType {
        StatsAreaType(self.bytes[IDENTITY_AREA_OFFSET])
    }

    /// Bytes `[0, used)` carry the object's fields for `kind`; byte 15 is the area.
    const fn used_bytes(kind: ObjectKind) -> usize {
        match kind {
            ObjectKind::Hypervisor => 0,
            ObjectKind::LogicalProcessor => 4,
            ObjectKind::Partition => 8,
            ObjectKind::Vp => 12,
        }
    }

    /// True when every byte reserved for `kind` is zero.
    pub fn reserved_clear(&self, kind: ObjectKind) -> bool {
        self.bytes[Self::used_bytes(kind)..IDENTITY_AREA_OFFSET].iter().all(|&b| b == 0)
    }
}
