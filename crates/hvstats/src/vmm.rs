//! Which VMM runs a VM another process holds, and that process: what an observer publishes of
//! each VM beside its counts, so readers can tell VMs of one name apart and join them to the
//! VMM's own tools.

/// The VMM a process runs, told from its command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Vmm {
    /// QEMU (`qemu-system-*`, `qemu-kvm`, and `kvm`: Proxmox VE starts its VMs as `/usr/bin/kvm`).
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
        if base.starts_with("qemu-system") || base == "qemu-kvm" || base == "kvm" {
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
    pub(crate) fn from_word(word: u64) -> Option<Self> {
        let code = (word >> 32) & 0xff;
        let vmm = *Vmm::ALL.iter().find(|v| v.code() == code)?;
        Some(Self { vmm, pid: word as u32 })
    }
}

/// A VM's UUID, as its VMM was given it (QEMU `-uuid`, which libvirt always passes): what joins a
/// VM's series to the inventory of the tools that manage it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VmUuid([u8; 16]);

impl VmUuid {
    /// Parses the canonical form, 8-4-4-4-12 hex digits in either case; `None` for anything else
    /// and for the nil UUID (QEMU's "none given").
    ///
    /// ```
    /// use hvstats::vmm::VmUuid;
    ///
    /// let u = VmUuid::parse("6B29FC40-CA47-1067-B31D-00DD010662DA").unwrap();
    /// assert_eq!(u.to_string(), "6b29fc40-ca47-1067-b31d-00dd010662da");
    /// assert_eq!(VmUuid::parse("6b29fc40ca471067b31d00dd010662da"), None);
    /// assert_eq!(VmUuid::parse("00000000-0000-0000-0000-000000000000"), None);
    /// ```
    pub fn parse(text: &str) -> Option<Self> {
        let groups: Vec<&str> = text.split('-').collect();
        let lengths: Vec<usize> = groups.iter().map(|g| g.len()).collect();
        if lengths != [8, 4, 4, 4, 12] {
            return None;
        }
        let hex: String = groups.concat();
        let mut bytes = [0u8; 16];
        for (i, b) in bytes.iter_mut().enumerate() {
            let pair = hex.get(2 * i..2 * i + 2)?;
            if !pair.bytes().all(|c| c.is_ascii_hexdigit()) {
                return None;
            }
            *b = u8::from_str_radix(pair, 16).ok()?;
        }
        (bytes != [0; 16]).then_some(Self(bytes))
    }

    /// Its 16 bytes, in the canonical form's order.
    pub fn bytes(self) -> [u8; 16] {
        self.0
    }

    /// The two index words: the bytes in order, as little-endian words.
    pub(crate) fn to_words(self) -> [u64; 2] {
        let (a, b) = self.0.split_at(8);
        [
            u64::from_le_bytes(a.try_into().unwrap_or([0; 8])),
            u64::from_le_bytes(b.try_into().unwrap_or([0; 8])),
        ]
    }

    /// The UUID of two index words, `None` when both are 0 (none recorded).
    pub(crate) fn from_words(words: [u64; 2]) -> Option<Self> {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&words[0].to_le_bytes());
        bytes[8..].copy_from_slice(&words[1].to_le_bytes());
        (bytes != [0; 16]).then_some(Self(bytes))
    }
}

impl std::fmt::Display for VmUuid {
    /// The canonical lowercase form.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uuid_survives_its_index_words_and_bad_text_is_none() {
        let u = VmUuid::parse("00112233-4455-6677-8899-aabbccddeeff").unwrap();
        assert_eq!(VmUuid::from_words(u.to_words()), Some(u));
        assert_eq!(u.to_string(), "00112233-4455-6677-8899-aabbccddeeff");
        assert_eq!(VmUuid::from_words([0, 0]), None);
        for bad in [
            "",
            "00112233-4455-6677-8899-aabbccddeef",
            "00112233-4455-6677-8899-aabbccddeefg",
            "0011223-34455-6677-8899-aabbccddeeff",
            "00112233-4455-6677-8899-aabbccddeeff-",
            "+0112233-4455-6677-8899-aabbccddeeff",
            "00112233-4455-6677-8899-aabbccddée",
        ] {
            assert_eq!(VmUuid::parse(bad), None, "{bad:?}");
        }
    }

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
