//! CPUID shaping: the table each vCPU gets from KVM's supported set, with its own APIC id and
//! the partition's additions (the hypervisor leaves of the enlightenment, tests' overrides).

use hvstats_abi::cpuid;
use kvm_bindings::{CpuId, kvm_cpuid_entry2};

use crate::error::Error;

/// The CPUID table of VP `index`: KVM's `supported` entries with the initial APIC id set to the
/// VP index (leaf 1 EBX[31:24], leaves 0xB and 0x1F EDX), then `overrides` replacing entries of
/// the same function and index or extending the table.
///
/// # Errors
/// When the table grows past what KVM takes.
pub(crate) fn vp_cpuid(
    supported: &CpuId,
    index: u32,
    overrides: &[kvm_cpuid_entry2],
) -> Result<CpuId, Error> {
    let mut entries = supported.as_slice().to_vec();
    for e in &mut entries {
        match e.function {
            cpuid::FEATURES => e.ebx = (e.ebx & 0x00FF_FFFF) | (index << 24),
            cpuid::EXTENDED_TOPOLOGY | cpuid::V2_EXTENDED_TOPOLOGY => e.edx = index,
            _ => {}
        }
    }
    for o in overrides {
        match entries.iter_mut().find(|e| e.function == o.function && e.index == o.index) {
            Some(e) => *e = *o,
            None => entries.push(*o),
        }
    }
    let count = entries.len();
    CpuId::from_entries(&entries).map_err(|_| Error::TooManyCpuidEntries { count })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(function: u32, index: u32, ebx: u32, edx: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 { function, index, ebx, edx, ..Default::default() }
    }

    #[test]
    fn each_vp_gets_its_apic_id_and_overrides_replace_or_extend() {
        let supported = CpuId::from_entries(&[
            entry(1, 0, 0xAB00_1234, 0),
            entry(0xB, 0, 0, 9),
            entry(0x4000_0000, 0, 1, 1),
        ])
        .unwrap();
        let table =
            vp_cpuid(&supported, 3, &[entry(0x4000_0000, 0, 7, 7), entry(0x4000_0001, 0, 8, 8)]).unwrap();
        let e = table.as_slice();
        assert_eq!(e[0].ebx, 0x0300_1234);
        assert_eq!(e[1].edx, 3);
        assert_eq!((e[2].ebx, e[2].edx), (7, 7));
        assert_eq!((e[3].function, e[3].ebx), (0x4000_0001, 8));
        let too_many = vec![entry(0x4000_0100, 0, 0, 0); kvm_bindings::KVM_MAX_CPUID_ENTRIES + 1];
        let overrides: Vec<_> =
            too_many.iter().enumerate().map(|(i, e)| kvm_cpuid_entry2 { index: i as u32, ..*e }).collect();
        assert!(matches!(vp_cpuid(&supported, 0, &overrides), Err(Error::TooManyCpuidEntries { .. })));
    }
}
