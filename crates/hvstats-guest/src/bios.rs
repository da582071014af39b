//! Tiny BIOS-replacement images whose guest does a known number of intercepts, for testing and
//! measuring the observer against a real QEMU (`-bios`).
//!
//! QEMU maps a 64 KiB `-bios` file at the top of the first MiB and of 4 GiB; the CPU starts in
//! real mode at F000:FFF0 (file offset 0xFFF0). A far jump there to F000:0000 runs the program
//! assembled at file offset 0. CPUID overwrites EAX..EDX, so loop counters live in BP.

use iced_x86::code_asm::{CodeAssembler, al, ax, bp, ds, eax, ecx, edx, word_ptr};

/// The size of a `-bios` image.
pub const IMAGE_SIZE: usize = 64 * 1024;

/// The guest physical address [`BiosProgram::touch_ram`] writes.
pub const FIRST_TOUCH: u16 = 0x8000;

/// What the guest does, in order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BiosProgram {
    /// CPUID instructions (leaf 0).
    pub cpuid: u16,
    /// `out 0x80, al` instructions.
    pub out: u16,
    /// `in al, 0x61` instructions.
    pub in_: u16,
    /// Writes of the EOI register as x2APIC MSR 0x80B (x2APIC is enabled first when this or
    /// `x2apic_tpr` is not 0, with one RDMSR and one WRMSR of IA32_APIC_BASE).
    pub x2apic_eoi: u16,
    /// Writes of the TPR register as x2APIC MSR 0x808.
    pub x2apic_tpr: u16,
    /// Writes one word at [`FIRST_TOUCH`], guest RAM nothing else touches: the first touch of
    /// that RAM, which the host takes as a page fault on the vCPU thread.
    pub touch_ram: bool,
    /// What it does afterwards.
    pub end: BiosEnd,
}

/// How a [`BiosProgram`] ends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BiosEnd {
    /// `cli; hlt` (once: with interrupts off the vCPU stays halted).
    #[default]
    Halt,
    /// `out 0x80, al` forever: a steady stream of userspace exits (for exit-rate measurements).
    OutForever,
}

/// An error assembling an image.
#[derive(Debug, thiserror::Error)]
#[error("cannot assemble the BIOS image: {0}")]
pub struct BiosError(String);

impl BiosProgram {
    /// The 64 KiB image.
    ///
    /// # Errors
    /// When the assembler fails (never for these programs).
    pub fn image(&self) -> Result<Vec<u8>, BiosError> {
        let err = |e: iced_x86::IcedError| BiosError(e.to_string());
        let mut a = CodeAssembler::new(16).map_err(err)?;
        a.cli().map_err(err)?;
        if self.x2apic_eoi > 0 || self.x2apic_tpr > 0 {
            // IA32_APIC_BASE: set EN (bit 11) and EXTD (bit 10).
            a.mov(ecx, 0x1Bu32).map_err(err)?;
            a.rdmsr().map_err(err)?;
            a.or(eax, 0xC00).map_err(err)?;
            a.wrmsr().map_err(err)?;
        }
        for (count, body) in
            [(self.cpuid, 0u8), (self.out, 1), (self.in_, 2), (self.x2apic_eoi, 3), (self.x2apic_tpr, 4)]
        {
            if count == 0 {
                continue;
            }
            let mut top = a.create_label();
            a.mov(bp, u32::from(count)).map_err(err)?;
            a.set_label(&mut top).map_err(err)?;
            match body {
                0 => {
                    a.xor(eax, eax).map_err(err)?;
                    a.xor(ecx, ecx).map_err(err)?;
                    a.cpuid().map_err(err)?;
                }
                1 => a.out(0x80, al).map_err(err)?,
                2 => a.in_(al, 0x61).map_err(err)?,
                _ => {
                    a.mov(ecx, if body == 3 { 0x80Bu32 } else { 0x808 }).map_err(err)?;
                    a.xor(eax, eax).map_err(err)?;
                    a.xor(edx, edx).map_err(err)?;
                    a.wrmsr().map_err(err)?;
                }
            }
            a.dec(bp).map_err(err)?;
            a.jnz(top).map_err(err)?;
        }
        if self.touch_ram {
            a.xor(ax, ax).map_err(err)?;
            a.mov(ds, ax).map_err(err)?;
            a.mov(word_ptr(u32::from(FIRST_TOUCH)), 1u32).map_err(err)?;
        }
        let mut end = a.create_label();
        a.set_label(&mut end).map_err(err)?;
        match self.end {
            BiosEnd::Halt => a.hlt().map_err(err)?,
            BiosEnd::OutForever => a.out(0x80, al).map_err(err)?,
        }
        a.jmp(end).map_err(err)?;
        let code = a.assemble(0).map_err(err)?;
        if code.len() > 0xFFF0 {
            return Err(BiosError(format!("{} bytes of code do not fit below the reset vector", code.len())));
        }
        let mut image = vec![0xF4u8; IMAGE_SIZE]; // hlt everywhere else
        image[..code.len()].copy_from_slice(&code);
        // F000:FFF0: jmp far F000:0000.
        image[0xFFF0..0xFFF5].copy_from_slice(&[0xEA, 0x00, 0x00, 0x00, 0xF0]);
        Ok(image)
    }
}

#[cfg(test)]
mod tests {
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};

    use super::*;

    #[test]
    fn the_image_jumps_from_the_reset_vector_to_the_program() {
        let p = BiosProgram { cpuid: 777, out: 333, in_: 55, end: BiosEnd::Halt, ..BiosProgram::default() };
        let image = p.image().unwrap();
        assert_eq!(image.len(), IMAGE_SIZE);
        let mut reset = Decoder::with_ip(16, &image[0xFFF0..], 0xFFF0, DecoderOptions::NONE);
        let jmp = reset.decode();
        assert_eq!(jmp.mnemonic(), Mnemonic::Jmp);
        assert_eq!((jmp.far_branch_selector(), jmp.far_branch16()), (0xF000, 0));
        let mnemonics: Vec<Mnemonic> = Decoder::with_ip(16, &image[..64], 0, DecoderOptions::NONE)
            .into_iter()
            .map(|i| i.mnemonic())
            .collect();
        for m in [Mnemonic::Cli, Mnemonic::Cpuid, Mnemonic::Out, Mnemonic::In, Mnemonic::Hlt] {
            assert!(mnemonics.contains(&m), "{m:?} in {mnemonics:?}");
        }
        let counts: Vec<u32> = Decoder::with_ip(16, &image[..64], 0, DecoderOptions::NONE)
            .into_iter()
            .filter(|i| i.mnemonic() == Mnemonic::Mov)
            .map(|i| i.immediate32())
            .collect();
        assert_eq!(counts, vec![777, 333, 55]);
    }
}
