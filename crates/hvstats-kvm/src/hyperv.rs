//! Hyper-V enlightenment, done in userspace: the CPUID leaves, the synthetic MSRs and the
//! hypercall page a guest sees.
//!
//! KVM's own Hyper-V emulation is not used (it may be compiled out, and it forwards no stats
//! hypercalls). The VMM answers CPUID 0x40000000.. through `KVM_SET_CPUID2`, the synthetic MSRs
//! through user-space MSR exits, and writes a hypercall page whose code traps to the VMM with a
//! port write (`vmcall` does not reach userspace on every host) and returns with `ret`.

use hvstats_abi::cpuid;
use hvstats_abi::hypercall::{
    INTERFACE_SIGNATURE, MSR_GUEST_OS_ID, MSR_HYPERCALL, MSR_VP_INDEX, PartitionPrivileges, hypercall_msr,
};

pub use hvstats_abi::boot::{HYPERCALL_CODE, HYPERCALL_PORT};

/// The synthetic MSRs hvstats handles.
pub const SYNTHETIC_MSRS: [u32; 3] = [MSR_GUEST_OS_ID, MSR_HYPERCALL, MSR_VP_INDEX];

/// CPUID 0x40000000: the highest hypervisor leaf hvstats answers.
pub const CPUID_MAX_LEAF: u32 = cpuid::HV_LIMITS;

/// Privilege bits of `HV_PARTITION_PRIVILEGE_MASK` that hvstats grants or withholds.
pub mod privilege {
    /// AccessHypercallMsrs: GUEST_OS_ID and HYPERCALL.
    pub const ACCESS_HYPERCALL_MSRS: u64 = super::PartitionPrivileges::ACCESS_HYPERCALL_MSRS;
    /// AccessVpIndex: the VP_INDEX MSR.
    pub const ACCESS_VP_INDEX: u64 = super::PartitionPrivileges::ACCESS_VP_INDEX;
    /// AccessPartitionId: HvCallGetPartitionId.
    pub const ACCESS_PARTITION_ID: u64 = super::PartitionPrivileges::ACCESS_PARTITION_ID;
    /// AccessStats: HvCallMapStatsPage and HvCallUnmapStatsPage.
    pub const ACCESS_STATS: u64 = super::PartitionPrivileges::ACCESS_STATS;
}

/// One CPUID leaf as the guest sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuidLeaf {
    /// EAX input.
    pub function: u32,
    /// ECX input (sub-leaf); 0 for these leaves.
    pub index: u32,
    /// EAX output.
    pub eax: u32,
    /// EBX output.
    pub ebx: u32,
    /// ECX output.
    pub ecx: u32,
    /// EDX output.
    pub edx: u32,
}

/// What a partition's guests are told about the hypervisor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Enlightenment {
    /// The partition's privileges (CPUID 0x40000003 EAX:EBX).
    pub privileges: PartitionPrivileges,
    /// Number of VPs in the partition (CPUID 0x40000005).
    pub vp_count: u32,
    /// Number of host logical processors (CPUID 0x40000005).
    pub lp_count: u32,
}

impl Enlightenment {
    /// The privileges of an ordinary guest partition: hypercall MSRs, VP index, partition id and,
    /// when `access_stats`, AccessStats.
    pub(crate) fn guest_privileges(access_stats: bool) -> PartitionPrivileges {
        let mut mask =
            privilege::ACCESS_HYPERCALL_MSRS | privilege::ACCESS_VP_INDEX | privilege::ACCESS_PARTITION_ID;
        if access_stats {
            mask |= privilege::ACCESS_STATS;
        }
        PartitionPrivileges(mask)
    }

    /// The hypervisor CPUID leaves 0x40000000..=0x40000005.
    pub(crate) fn cpuid_leaves(&self) -> [CpuidLeaf; 6] {
        let leaf = |function, eax, ebx, ecx, edx| CpuidLeaf { function, index: 0, eax, ebx, ecx, edx };
        let mask = self.privileges.0;
        let [vendor_b, vendor_c, vendor_d] = cpuid::HV_VENDOR_SIGNATURE;
        [
            // Vendor: "Microsoft Hv".
            leaf(cpuid::HV_VENDOR_AND_MAX, CPUID_MAX_LEAF, vendor_b, vendor_c, vendor_d),
            leaf(cpuid::HV_INTERFACE, INTERFACE_SIGNATURE, 0, 0, 0),
            // Version: build 1, version 1.0, no service pack.
            leaf(cpuid::HV_VERSION, 1, 0x0001_0000, 0, 0),
            // Privileges (EAX bits 31:0, EBX bits 63:32); no further features.
            leaf(cpuid::HV_FEATURES, mask as u32, (mask >> 32) as u32, 0, 0),
            // Recommendations: none; long spin wait notifications never recommended (all ones).
            leaf(cpuid::HV_RECOMMENDATIONS, 0, u32::MAX, 0, 0),
            // Limits: VPs and LPs.
            leaf(cpuid::HV_LIMITS, self.vp_count, self.lp_count, 0, 0),
        ]
    }
}

/// A guest MSR access that must fault (#GP).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsrFault;

/// What a synthetic MSR write asks the VMM to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsrEffect {
    /// Nothing beyond the register update.
    None,
    /// Write the hypercall page code at this GPA (page aligned).
    InstallHypercallPage(u64),
    /// The hypercall page was disabled.
    RemoveHypercallPage,
}

/// The partition-wide synthetic MSR state (GUEST_OS_ID and HYPERCALL are per partition).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyntheticMsrs {
    guest_os_id: u64,
    hypercall: u64,
}

/// HYPERCALL MSR: bit 0 enable.
const HYPERCALL_ENABLE: u64 = hypercall_msr::ENABLE;
/// HYPERCALL MSR: bits 11:2 reserved (bit 1, Locked, is accepted and kept).
const HYPERCALL_RESERVED: u64 = hypercall_msr::RESERVED;

impl SyntheticMsrs {
    /// True when `msr` is one of the synthetic MSRs hvstats handles.
    pub fn handles(msr: u32) -> bool {
        SYNTHETIC_MSRS.contains(&msr)
    }

    /// The GPA of the enabled hypercall page.
    pub fn hypercall_page(&self) -> Option<u64> {
        (self.hypercall & HYPERCALL_ENABLE != 0).then_some(self.hypercall & hypercall_msr::GPA_MASK)
    }

    /// A guest RDMSR of `msr` on VP `vp_index`.
    ///
    /// # Errors
    /// [`MsrFault`] for an MSR hvstats does not handle.
    pub fn read(&self, msr: u32, vp_index: u32) -> Result<u64, MsrFault> {
        match msr {
            MSR_GUEST_OS_ID => Ok(self.guest_os_id),
            MSR_HYPERCALL => Ok(self.hypercall),
            MSR_VP_INDEX => Ok(vp_index as u64),
            _ => Err(MsrFault),
        }
    }

    /// A guest WRMSR of `value` to `msr`.
    ///
    /// Enabling the hypercall page is ignored (the enable bit stays clear) while GUEST_OS_ID is 0;
    /// clearing GUEST_OS_ID disables the hypercall page, as the TLFS says.
    ///
    /// # Errors
    /// [`MsrFault`] for VP_INDEX (read-only), reserved HYPERCALL bits, a HYPERCALL page beyond
    /// `gpa_limit`, or an MSR hvstats does not handle.
    pub fn write(&mut self, msr: u32, value: u64, gpa_limit: u64) -> Result<MsrEffect, MsrFault> {
        let was = self.hypercall_page();
        match msr {
            MSR_GUEST_OS_ID => {
                self.guest_os_id = value;
                if value == 0 {
                    self.hypercall &= !HYPERCALL_ENABLE;
                }
            }
            MSR_HYPERCALL => {
                if value & HYPERCALL_RESERVED != 0 {
                    return Err(MsrFault);
                }
                let enable = value & HYPERCALL_ENABLE != 0 && self.guest_os_id != 0;
                if enable && (value & hypercall_msr::GPA_MASK).saturating_add(0x1000) > gpa_limit {
                    return Err(MsrFault);
                }
                self.hypercall = (value & !HYPERCALL_ENABLE & !HYPERCALL_RESERVED) | enable as u64;
            }
            _ => return Err(MsrFault),
        }
        Ok(match (was, self.hypercall_page()) {
            (_, Some(gpa)) if was != Some(gpa) => MsrEffect::InstallHypercallPage(gpa),
            (Some(_), None) => MsrEffect::RemoveHypercallPage,
            _ => MsrEffect::None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpuid_says_microsoft_hv_and_grants_access_stats_in_ebx_bit_8() {
        let e = Enlightenment { privileges: Enlightenment::guest_privileges(true), vp_count: 2, lp_count: 4 };
        let leaves = e.cpuid_leaves();
        let vendor: Vec<u8> =
            [leaves[0].ebx, leaves[0].ecx, leaves[0].edx].iter().flat_map(|r| r.to_le_bytes()).collect();
        assert_eq!(&vendor, b"Microsoft Hv");
        assert_eq!(leaves[0].eax, 0x4000_0005);
        assert_eq!(leaves[1].eax.to_le_bytes(), *b"Hv#1");
        assert_eq!(leaves[3].ebx & (1 << 8), 1 << 8);
        let denied = Enlightenment { privileges: Enlightenment::guest_privileges(false), ..e };
        assert_eq!(denied.cpuid_leaves()[3].ebx & (1 << 8), 0);
        assert_eq!(leaves[5].eax, 2);
        assert_eq!(leaves[5].ebx, 4);
    }

    #[test]
    fn hypercall_page_enables_only_after_guest_os_id() {
        let mut m = SyntheticMsrs::default();
        assert_eq!(m.write(MSR_HYPERCALL, 0x5000 | 1, 1 << 20), Ok(MsrEffect::None));
        assert_eq!(m.hypercall_page(), None);
        assert_eq!(m.read(MSR_HYPERCALL, 0), Ok(0x5000));
        assert_eq!(m.write(MSR_GUEST_OS_ID, 0x8100_0000_0000_0000, 1 << 20), Ok(MsrEffect::None));
        assert_eq!(m.write(MSR_HYPERCALL, 0x5000 | 1, 1 << 20), Ok(MsrEffect::InstallHypercallPage(0x5000)));
        assert_eq!(m.read(MSR_HYPERCALL, 0), Ok(0x5001));
        assert_eq!(m.write(MSR_HYPERCALL, 0x5000 | 1, 1 << 20), Ok(MsrEffect::None));
        assert_eq!(m.write(MSR_GUEST_OS_ID, 0, 1 << 20), Ok(MsrEffect::RemoveHypercallPage));
    }

    #[test]
    fn bad_msr_writes_fault() {
        let mut m = SyntheticMsrs::default();
        m.write(MSR_GUEST_OS_ID, 1, 1 << 20).unwrap();
        assert_eq!(m.write(MSR_VP_INDEX, 3, 1 << 20), Err(MsrFault));
        assert_eq!(m.write(MSR_HYPERCALL, 0x5000 | 0x10 | 1, 1 << 20), Err(MsrFault));
        assert_eq!(m.write(MSR_HYPERCALL, (1 << 20) | 1, 1 << 20), Err(MsrFault));
        assert_eq!(m.write(0x4000_0099, 1, 1 << 20), Err(MsrFault));
        assert_eq!(m.read(MSR_VP_INDEX, 7), Ok(7));
    }
}
