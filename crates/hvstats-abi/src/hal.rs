//! The structures of `HalAllocateHardwareCounters` (seed 002).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// An `NTSTATUS` as `HalAllocateHardwareCounters` returns it (open: unknown codes round-trip).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, IntoBytes, FromBytes, Immutable, KnownLayout)]
#[repr(transparent)]
pub struct NtStatus(pub u32);

impl NtStatus {
    /// `STATUS_SUCCESS`.
    pub const SUCCESS: Self = Self(0);
    /// `STATUS_INVALID_PARAMETER`.
    pub const INVALID_PARAMETER: Self = Self(0xC000_000D);
    /// `STATUS_INSUFFICIENT_RESOURCES`.
    pub const INSUFFICIENT_RESOURCES: Self = Self(0xC000_009A);
    /// `STATUS_NOT_SUPPORTED`.
    pub const NOT_SUPPORTED: Self = Self(0xC000_00BB);

    /// The name of a known status.
    pub const fn name(self) -> Option<&'static str> {
        match self {
            Self::SUCCESS => Some("STATUS_SUCCESS"),
            Self::INVALID_PARAMETER => Some("STATUS_INVALID_PARAMETER"),
            Self::INSUFFICIENT_RESOURCES => Some("STATUS_INSUFFICIENT_RESOURCES"),
            Self::NOT_SUPPORTED => Some("STATUS_NOT_SUPPORTED"),
            _ => None,
        }
    }

    /// Whether this is `STATUS_SUCCESS`.
    pub const fn is_success(self) -> bool {
        self.0 == Self::SUCCESS.0
    }
}

impl core::fmt::Display for NtStatus {
    /// `NAME (0xXXXXXXXX)`, or just the hex value for an unknown status.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} ({:#010X})", self.0),
            None => write!(f, "{:#010X}", self.0),
        }
    }
}

/// `GROUP_AFFINITY` (16 bytes): processors `Mask` of processor group `Group`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, IntoBytes, FromBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct GroupAffinity {
    /// `KAFFINITY Mask`: bit n = processor n of the group.
    pub mask: u64,
    /// `WORD Group`.
    pub group: u16,
    /// `WORD Reserved[3]`.
    pub reserved: [u16; 3],
}

impl GroupAffinity {
    /// Processors `mask` of processor group `group`, reserved words zero.
    pub const fn new(group: u16, mask: u64) -> Self {
        Self { mask, group, reserved: [0; 3] }
    }
}

/// `PHYSICAL_COUNTER_RESOURCE_DESCRIPTOR_TYPE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, IntoBytes, FromBytes, Immutable, KnownLayout)]
#[repr(transparent)]
pub struct ResourceType(pub u32);

impl ResourceType {
    /// `ResourceTypeSingle`: one counter, `u.CounterIndex`.
    pub const SINGLE: Self = Self(0);
    /// `ResourceTypeRange`: counters `u.Range.Begin..=u.Range.End`.
    pub const RANGE: Self = Self(1);
    /// `ResourceTypeExtendedCounterConfiguration`: not supported.
    pub const EXTENDED_COUNTER_CONFIGURATION: Self = Self(2);
    /// `ResourceTypeOverflow`: the counter overflow interrupt.
    pub const OVERFLOW: Self = Self(3);
    /// `ResourceTypeEventBuffer`: the event buffer configuration.
    pub const EVENT_BUFFER: Self = Self(4);
    /// `ResourceTypeIdenitificationTag`: an identification tag.
    pub const IDENTIFICATION_TAG: Self = Self(5);
    /// `ResourceTypeMax`: one past the last defined type (not a type itself).
    pub const MAX: Self = Self(6);

    /// The SDK name of a defined type (keeping the SDK's spelling of the tag type).
    pub const fn name(self) -> Option<&'static str> {
        match self {
            Self::SINGLE => Some("ResourceTypeSingle"),
            Self::RANGE => Some("ResourceTypeRange"),
            Self::EXTENDED_COUNTER_CONFIGURATION => Some("ResourceTypeExtendedCounterConfiguration"),
            Self::OVERFLOW => Some("ResourceTypeOverflow"),
            Self::EVENT_BUFFER => Some("ResourceTypeEventBuffer"),
            Self::IDENTIFICATION_TAG => Some("ResourceTypeIdenitificationTag"),
            _ => None,
        }
    }
}

/// `PHYSICAL_COUNTER_RESOURCE_DESCRIPTOR` (24 bytes on x64): Type @0, Flags @4, union `u` @8.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, IntoBytes, FromBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct PhysicalCounterResourceDescriptor {
    /// `Type` @0: which member of the union `u` is meaningful.
    pub resource_type: ResourceType,
    /// Flags; none are defined, so it must be zero.
    pub flags: u32,
    /// The union `u`: CounterIndex u32 @0; Range {Begin u32 @0, End u32 @4}; OverflowHandler
    /// pointer @0; EventBufferConfiguration {handler @0, CustomEventBufferEntrySize u32 @8,
    /// EventThreshold u32 @12}; IdentificationTag u32 @0.
    pub u: [u32; 4],
}

impl Default for ResourceType {
    fn default() -> Self {
        Self::SINGLE
    }
}

impl PhysicalCounterResourceDescriptor {
    /// `ResourceTypeSingle`: counter `counter_index` alone.
    pub const fn single(counter_index: u32) -> Self {
        Self { resource_type: ResourceType::SINGLE, flags: 0, u: [counter_index, 0, 0, 0] }
    }

    /// `ResourceTypeRange`: counters `begin..=end` (both ends included).
    pub const fn range(begin: u32, end: u32) -> Self {
        Self { resource_type: ResourceType::RANGE, flags: 0, u: [begin, end, 0, 0] }
    }

    /// The overflow interrupt, handled by `handler` (an opaque address).
    pub const fn overflow(handler: u64) -> Self {
        Self {
            resource_type: ResourceType::OVERFLOW,
            flags: 0,
            u: [handler as u32, (handler >> 32) as u32, 0, 0],
        }
    }

    /// `ResourceTypeEventBuffer`: `handler` @0, `entry_size` @8, `threshold` @12 of the union.
    pub const fn event_buffer(handler: u64, entry_size: u32, threshold: u32) -> Self {
        Self {
            resource_type: ResourceType::EVENT_BUFFER,
            flags: 0,
            u: [handler as u32, (handler >> 32) as u32, entry_size, threshold],
        }
    }

    /// `ResourceTypeIdenitificationTag`: `tag` in `u.IdentificationTag`.
    pub const fn identification_tag(tag: u32) -> Self {
        Self { resource_type: ResourceType::IDENTIFICATION_TAG, flags: 0, u: [tag, 0, 0, 0] }
    }

    /// `u.CounterIndex` (single).
    pub const fn counter_index(&self) -> u32 {
        self.u[0]
    }

    /// `u.Range` as (begin, end).
    pub const fn range_bounds(&self) -> (u32, u32) {
        (self.u[0], self.u[1])
    }

    /// `u.IdentificationTag`.
    pub const fn tag(&self) -> u32 {
        self.u[0]
    }
}

/// The fixed head of `PHYSICAL_COUNTER_RESOURCE_LIST`: `ULONG Count`, then (at offset 8 on x64) the
/// descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, IntoBytes, FromBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct PhysicalCounterResourceListHeader {
    /// Number of descriptors.
    pub count: u32,
    /// Alignment padding before the descriptors.
    pub padding: u32,
}

/// Byte offset of the first descriptor in a `PHYSICAL_COUNTER_RESOURCE_LIST`.
pub const RESOURCE_LIST_DESCRIPTORS_OFFSET: usize = 8;

/// `PHYSICAL_COUNTER_RESOURCE_LIST`: a count and that many descriptors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PhysicalCounterResourceList<'a> {
    /// The `Count` field as given (it may disagree with the descriptors supplied).
    pub count: u32,
    /// The descriptors actually supplied; their number may differ from [`count`](Self::count).
    pub descriptors: &'a [PhysicalCounterResourceDescriptor],
}

impl<'a> PhysicalCounterResourceList<'a> {
    /// A list whose count matches its descriptors.
    pub fn new(descriptors: &'a [PhysicalCounterResourceDescriptor]) -> Self {
        Self { count: descriptors.len() as u32, descriptors }
    }

    /// Decodes the list from its in-memory form; `None` when the bytes are too short for the
    /// count or misaligned.
    pub fn from_bytes(bytes: &'a [u8]) -> Option<Self> {
        let (header, rest) = PhysicalCounterResourceListHeader::read_from_prefix(bytes).ok()?;
        let n = header.count as usize;
        let need = n.checked_mul(size_of::<PhysicalCounterResourceDescriptor>())?;
        let descriptors = <[PhysicalCounterResourceDescriptor]>::ref_from_bytes(rest.get(..need)?).ok()?;
        Some(Self { count: header.count, descriptors })
    }
}

const _: () = assert!(size_of::<GroupAffinity>() == 16);
const _: () = assert!(size_of::<PhysicalCounterResourceDescriptor>() == 24);
const _: () = assert!(size_of::<PhysicalCounterResourceListHeader>() == RESOURCE_LIST_DESCRIPTORS_OFFSET);

#[cfg(test)]
mod tests {
    extern crate std;
    use std::string::ToString;

    use super::*;

    #[test]
    fn statuses_print_by_name_and_value() {
        assert_eq!(
            NtStatus::INSUFFICIENT_RESOURCES.to_string(),
            "STATUS_INSUFFICIENT_RESOURCES (0xC000009A)"
        );
        assert_eq!(NtStatus::SUCCESS.to_string(), "STATUS_SUCCESS (0x00000000)");
        assert_eq!(NtStatus(0xC000_0001).to_string(), "0xC0000001");
        assert!(NtStatus::SUCCESS.is_success() && !NtStatus::NOT_SUPPORTED.is_success());
    }

    #[test]
    fn resource_types_have_their_sdk_names() {
        assert_eq!(
            ResourceType::EXTENDED_COUNTER_CONFIGURATION.name(),
            Some("ResourceTypeExtendedCounterConfiguration")
        );
        assert_eq!(ResourceType::IDENTIFICATION_TAG.name(), Some("ResourceTypeIdenitificationTag"));
        assert_eq!(ResourceType::MAX.name(), None);
        assert_eq!(GroupAffinity::new(3, 0x10), GroupAffinity { mask: 0x10, group: 3, reserved: [0; 3] });
    }
}
