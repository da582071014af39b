//! CPUID leaves hvstats reads, shapes or answers: the architectural leaves the VMM gives each VP
//! its APIC id in, and the Hyper-V leaves (TLFS "Hypervisor CPUID leaves") with their signatures.

/// Leaf 1: feature information; EBX bits 31:24 hold the initial APIC id.
pub const FEATURES: u32 = 0x1;
/// Leaf 0xB: extended topology; EDX is the x2APIC id.
pub const EXTENDED_TOPOLOGY: u32 = 0xB;
/// Leaf 0x1F: V2 extended topology; EDX is the x2APIC id.
pub const V2_EXTENDED_TOPOLOGY: u32 = 0x1F;

/// Hypervisor vendor and the highest hypervisor leaf.
pub const HV_VENDOR_AND_MAX: u32 = 0x4000_0000;
/// Hypervisor interface signature.
pub const HV_INTERFACE: u32 = 0x4000_0001;
/// Hypervisor system identity (build and version).
pub const HV_VERSION: u32 = 0x4000_0002;
/// Hypervisor feature identification: the partition privilege mask in EAX:EBX.
pub const HV_FEATURES: u32 = 0x4000_0003;
/// Implementation recommendations.
pub const HV_RECOMMENDATIONS: u32 = 0x4000_0004;
/// Implementation limits: maximum VPs and LPs.
pub const HV_LIMITS: u32 = 0x4000_0005;

/// The vendor signature of leaf 0x40000000 in EBX, ECX, EDX: "Microsoft Hv".
pub const HV_VENDOR_SIGNATURE: [u32; 3] =
    [u32::from_le_bytes(*b"Micr"), u32::from_le_bytes(*b"osof"), u32::from_le_bytes(*b"t Hv")];
/// The interface signature of leaf 0x40000001 in EAX: "Hv#1".
pub const HV_INTERFACE_SIGNATURE: u32 = u32::from_le_bytes(*b"Hv#1");
