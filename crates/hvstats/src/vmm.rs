//! Which VMM runs a VM another process holds, and that process: what an observer publishes of
//! each VM beside its counts, so readers can tell VMs of one name apart and join them to the
//! VMM's own tools.

/// The VMM a process runs, told from its command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Vmm {
    /// QEMU (`qemu-system-*`, `qemu-kvm`).
    Qemu,
    /// Firecracker.
    Firecracker,
    /// Cloud Hypervisor.
    CloudHypervisor,
    /// crosvm.
    Crosvm,
    /// kvmtool (`lkvm`).
    Kvmtool,
    /// Anything else that holds a KVM VM.
    Other,
}

impl Vmm {
    /// Tells the VMM from the program name (`argv[0]`, any directory stripped).
    pub fn from_program(program: &str) -> Self {
        let base = program.rsplit('/').next().unwrap_or(program);
        if base.starts_with("qemu-system") || base == "qemu-kvm" {
            Vmm::Qemu
        } else if base.starts_with("firecracker") {
            Vmm::Firecracker
        } else if base.starts_with("cloud-hyperviso") {
            Vmm::CloudHypervisor
        } else if base.starts_with("crosvm") {
            Vmm::Crosvm
        } else if base == "lkvm" || base == "vm" {
            Vmm::Kvmtool
        } else {
            Vmm::Other
        }
    }

    /// Short name for logs.
    pub const fn name(self) -> &'static str {
        match self {
            Vmm::Qemu => "qemu",
            Vmm::Firecracker => "firecracker",
            Vmm::CloudHypervisor => "cloud-hypervisor",
            Vmm::Crosvm => "crosvm",
            Vmm::Kvmtool => "kvmtool",
            Vmm::Other => "other",
        }
    }
}

impl Vmm {
    const ALL: [Vmm; 6] =
        [Vmm::Qemu, Vmm::Firecracker, Vmm::CloudHypervisor, Vmm::Crosvm, Vmm::Kvmtool, Vmm::Other];

    /// The code of the VMM in an index entry (1-based: 0 is "not an observed VM").
    const fn code(self) -> u64 {
        self as u64 + 1
    }
}

/// The VMM process of an observed VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VmmProcess {
    /// What runs the VM.
    pub vmm: Vmm,
    /// The process holding the VM's KVM descriptors.
    pub pid: u32,
}

impl VmmProcess {
    /// The index word: the pid in bits 0..32, the VMM's code in bits 32..40; 0 for none.
    pub const fn to_word(self) -> u64 {
        (self.vmm.code() << 32) | self.pid as u64
    }

    /// The VMM process of an index word, `None` for 0 or a code this build does not know.
    pub fn from_word(word: u64) -> Option<Self> {
        let code = (word >> 32) & 0xff;
        let vmm = *Vmm::ALL.iter().find(|v| v.code() == code)?;
        Some(Self { vmm, pid: word as u32 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vmm_process_survives_its_index_word_and_no_word_is_misread() {
        for vmm in Vmm::ALL {
            let p = VmmProcess { vmm, pid: 4_194_303 };
            assert_eq!(VmmProcess::from_word(p.to_word()), Some(p));
        }
        assert_eq!(VmmProcess::from_word(0), None);
        assert_eq!(VmmProcess::from_word(0xff << 32 | 7), None);
        assert_eq!(Vmm::from_program("/usr/bin/qemu-system-x86_64"), Vmm::Qemu);
    }
}
