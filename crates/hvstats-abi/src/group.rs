//! Statistics group headers (seed 004): a page is a packed list of groups, each an 8-byte header
//! followed by `Length` bytes of 64-bit values, ended by an `END_OF_LIST` header.

use core::fmt;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// The size of a stats page (`HV_PAGE_SIZE`).
pub const PAGE_SIZE: usize = 4096;

/// The size of one counter value.
pub const VALUE_SIZE: usize = 8;

/// `HV_STATISTICS_GROUP_HEADER`: Type u16 @0, Minor u16 @2, Major u16 @4, Length u16 @6.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, IntoBytes, FromBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct GroupHeader {
    /// Type @0: which group the data belongs to ([`GroupType`]); END_OF_LIST ends the list.
    pub group_type: GroupType,
    /// Minor version: incremented when counters are appended.
    pub minor: u16,
    /// Major version: incremented when the format changes.
    pub major: u16,
    /// Bytes of data after the header (a multiple of 8).
    pub length: u16,
}

const _: () = assert!(size_of::<GroupHeader>() == 8);

/// `HV_ST_MAX_COUNTERS_PER_GROUP`: a group filling a page beside its own header and END_OF_LIST.
pub const MAX_COUNTERS_PER_GROUP: usize = (PAGE_SIZE - 2 * size_of::<GroupHeader>()) / VALUE_SIZE;

const _: () = assert!(MAX_COUNTERS_PER_GROUP == 510);

impl GroupHeader {
    /// A header for `group_type` at `version` with `length` data bytes.
    pub const fn new(group_type: GroupType, version: GroupVersion, length: u16) -> Self {
        Self { group_type, minor: version.minor, major: version.major, length }
    }

    /// The END_OF_LIST header (zero version and length).
    pub const END_OF_LIST: Self = Self::new(GroupType::END_OF_LIST, GroupVersion::ZERO, 0);

    /// This header's version.
    pub const fn version(&self) -> GroupVersion {
        GroupVersion { major: self.major, minor: self.minor }
    }
}

/// A group type (open enum): the id in a group header.
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord, IntoBytes, FromBytes, Immutable, KnownLayout,
)]
#[repr(transparent)]
pub struct GroupType(pub u16);

impl GroupType {
    /// `HV_STATISTICS_GROUP_END_OF_LIST`: ends the list of groups.
    pub const END_OF_LIST: Self = Self(0);
    /// `HV_STATISTICS_GROUP_END_OF_PAGE`: ends this page's groups.
    pub const END_OF_PAGE: Self = Self(1);
    /// The architectural group (`HV_STATISTICS_GROUP_*A_ID`) of every page.
    pub const ARCHITECTURAL: Self = Self(2);
    /// The release-specific group (`HV_STATISTICS_GROUP_*V_ID`) of every page.
    pub const RELEASE: Self = Self(3);
    /// The internal group (`HV_STATISTICS_GROUP_*I_ID`) of every page.
    pub const INTERNAL: Self = Self(14);
    /// `HV_STATISTICS_GROUP_HYPERCALL_BASED`: a manifest pseudo-group, never on a page.
    pub const HYPERCALL_BASED: Self = Self(15);
    /// hvstats' own group (sequence counter, histograms): far from the TLFS ids, so a TLFS reader
    /// takes it for an unknown type and skips it by its Length.
    pub const HVSTATS: Self = Self(0x4856);

    /// The short name of a known group type.
    pub const fn name(self) -> Option<&'static str> {
        match self.0 {
            0 => Some("END_OF_LIST"),
            1 => Some("END_OF_PAGE"),
            2 => Some("architectural"),
            3 => Some("release-specific"),
            14 => Some("internal"),
            15 => Some("HYPERCALL_BASED"),
            0x4856 => Some("hvstats"),
            _ => None,
        }
    }
}

impl fmt::Debug for GroupType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n}({})", self.0),
            None => write!(f, "GroupType({})", self.0),
        }
    }
}

/// A group version: read as a little-endian u32, `0x00010000` is major 1, minor 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupVersion {
    /// Major version (format).
    pub major: u16,
    /// Minor version (appended counters).
    pub minor: u16,
}

impl GroupVersion {
    /// Version 0.0, used by END_OF_LIST and END_OF_PAGE.
    pub const ZERO: Self = Self { major: 0, minor: 0 };
    /// `0x00010000`: major 1, minor 0, the first version of every group hvstats writes.
    pub const V1_0: Self = Self::from_u32(0x0001_0000);

    /// Decodes the 32-bit form (major in the high half).
    pub const fn from_u32(v: u32) -> Self {
        Self { major: (v >> 16) as u16, minor: v as u16 }
    }

    /// The 32-bit form.
    pub const fn as_u32(self) -> u32 {
        ((self.major as u32) << 16) | self.minor as u32
    }

    /// Seed 004's rule: a reader compiled for `self` finds every counter it knows in a group at
    /// `found` when the majors are equal and the found minor is at least the compiled one. A
    /// group of an older minor still reads, for the counters it carries (see
    /// [`PageView`](crate::PageView)); only another major is refused.
    pub const fn accepts(self, found: GroupVersion) -> bool {
        found.major == self.major && found.minor >= self.minor
    }
}

impl fmt::Display for GroupVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}
