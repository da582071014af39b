//! A builder for guest programs in real, protected or long mode.
//!
//! The builder wraps iced-x86's `CodeAssembler` at the mode's bitness and adds the few things every
//! hvstats guest needs. Loops count in EBP so that CPUID, RDMSR and port I/O (which clobber EAX, EBX,
//! ECX and EDX) can sit in a loop body, and EDI/ESI keep the VP index and count from entry.

use iced_x86::code_asm::*;
use iced_x86::{BlockEncoderOptions, IcedError};

use crate::layout;

pub use hvstats_abi::boot::Mode;

/// Why a program could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The assembler rejected an instruction or could not resolve a label.
    #[error("assembler")]
    Assembler(#[from] IcedError),
    /// The program needs something its mode cannot do.
    #[error("{what} is not available in {mode} mode")]
    Unsupported {
        /// What was asked for.
        what: &'static str,
        /// The mode's name.
        mode: &'static str,
    },
    /// Real-mode code must load below 1 MiB.
    #[error("real-mode image at {0:#x} is not below 1 MiB")]
    RealModeAddress(u64),
}

/// A raw guest image: bytes, where they load, and where execution starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestImage {
    /// The mode the image is entered in.
    pub mode: Mode,
    /// Guest physical address of the first byte.
    pub load_gpa: u64,
    /// Guest physical address of the first instruction.
    pub entry: u64,
    /// The machine code, to be copied to `load_gpa` as is.
    pub bytes: Vec<u8>,
}

/// The number of iterations of a loop: `base + vp_index * per_vp`, so VPs of one image can run
/// different counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoopCount {
    /// Iterations of VP 0.
    pub base: u32,
    /// Extra iterations per VP index.
    pub per_vp: u32,
}

impl LoopCount {
    /// The same count on every VP.
    pub const fn fixed(n: u32) -> Self {
        Self { base: n, per_vp: 0 }
    }

    /// `base + vp_index * per_vp`.
    pub const fn per_vp(base: u32, per_vp: u32) -> Self {
        Self { base, per_vp }
    }

    /// The count of VP `vp`.
    pub const fn of(self, vp: u32) -> u64 {
        self.base as u64 + vp as u64 * self.per_vp as u64
    }

    /// True when no VP runs an iteration.
    pub const fn is_zero(self) -> bool {
        self.base == 0 && self.per_vp == 0
    }
}

/// A guest program under construction.
pub struct Program {
    asm: CodeAssembler,
    mode: Mode,
    load_gpa: u64,
}

impl Program {
    /// A new, empty program for `mode`, to be loaded (and entered) at `load_gpa`.
    ///
    /// # Errors
    /// A real-mode program must load below 1 MiB.
    pub fn new(mode: Mode, load_gpa: u64) -> Result<Self, BuildError> {
        if mode == Mode::Real && load_gpa >= 0x10_0000 {
            return Err(BuildError::RealModeAddress(load_gpa));
        }
        Ok(Self { asm: CodeAssembler::new(mode.bitness())?, mode, load_gpa })
    }

    /// The CPU mode the program is assembled for and will be entered in.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The assembler, for instructions the builder has no helper for.
    pub fn asm(&mut self) -> &mut CodeAssembler {
        &mut self.asm
    }

    fn unsupported(&self, what: &'static str) -> BuildError {
        BuildError::Unsupported { what, mode: self.mode.name() }
    }

    /// Writes `status` to the exit port: the VP stops with that exit status.
    ///
    /// # Errors
    /// [`BuildError`] when the assembler rejects an instruction.
    pub fn exit(&mut self, status: u32) -> Result<(), BuildError> {
        self.asm.mov(edx, layout::EXIT_PORT as u32)?;
        self.asm.mov(eax, status)?;
        self.asm.out(dx, eax)?;
        let mut spin = self.asm.create_label();
        self.asm.set_label(&mut spin)?;
        self.asm.hlt()?;
        self.asm.jmp(spin)?;
        Ok(())
    }

    /// Writes `text` to the serial port, one `out` per byte.
    ///
    /// # Errors
    /// [`BuildError`] when the assembler rejects an instruction.
    pub(crate) fn serial_print(&mut self, text: &[u8]) -> Result<(), BuildError> {
        if text.is_empty() {
            return Ok(());
        }
        self.asm.mov(edx, layout::SERIAL_PORT as u32)?;
        for &b in text {
            self.asm.mov(al, b as u32)?;
            self.asm.out(dx, al)?;
        }
        Ok(())
    }

    /// Runs `body` `count` times (per VP), counting in EBP. The body must preserve EBP, EDI and
    /// ESI.
    ///
    /// # Errors
    /// [`BuildError`] when the assembler rejects an instruction, or the body fails.
    pub fn counted_loop(
        &mut self,
        count: LoopCount,
        body: impl FnOnce(&mut Self) -> Result<(), BuildError>,
    ) -> Result<(), BuildError> {
        if count.is_zero() {
            return Ok(());
        }
        let mut top = self.asm.create_label();
        let mut done = self.asm.create_label();
        self.asm.mov(ebp, edi)?;
        self.asm.imul_3(ebp, ebp, count.per_vp as i32)?;
        self.asm.add(ebp, count.base as i32)?;
        self.asm.test(ebp, ebp)?;
        self.asm.jz(done)?;
        self.asm.set_label(&mut top)?;
        body(self)?;
        self.asm.dec(ebp)?;
        self.asm.jnz(top)?;
        self.asm.set_label(&mut done)?;
        // A label needs an instruction after it.
        self.asm.nop()?;
        Ok(())
    }

    /// Stores the 32-bit `value` at guest physical address `gpa` (clobbers EBX). Not in real mode,
    /// which cannot reach addresses above 1 MiB.
    ///
    /// # Errors
    /// [`BuildError`] when the assembler rejects an instruction, or in real mode or above 4 GiB.
    pub(crate) fn store32(&mut self, gpa: u64, value: u32) -> Result<(), BuildError> {
        let addr = u32::try_from(gpa).map_err(|_| self.unsupported("an address above 4 GiB"))?;
        match self.mode {
            Mode::Real => return Err(self.unsupported("a 32-bit address")),
            Mode::Protected => {
                self.asm.mov(ebx, addr)?;
                self.asm.mov(dword_ptr(ebx), value)?;
            }
            Mode::Long => {
                // A register-held address: a 32-bit displacement would be sign-extended.
                self.asm.mov(ebx, addr)?;
                self.asm.mov(dword_ptr(rbx), value)?;
            }
        }
        Ok(())
    }

    /// Points IDT vector `vector` at the handler at guest address `handler` (an interrupt gate in
    /// the VMM's IDT). Clobbers EAX, EBX and EDX. The address of a handler in the same program is
    /// known after a first assembly: see [`Program::finish_with_labels`].
    ///
    /// # Errors
    /// [`BuildError`] when the assembler rejects an instruction, or in real mode.
    pub(crate) fn install_interrupt_gate(&mut self, vector: u8, handler: u32) -> Result<(), BuildError> {
        let (entry_size, gate) = match self.mode {
            Mode::Real => return Err(self.unsupported("an interrupt gate")),
            Mode::Protected => (8u64, 0x8E00u32),
            Mode::Long => (16u64, 0x8E00u32),
        };
        let entry = layout::IDT_BASE + vector as u64 * entry_size;
        self.asm.mov(eax, handler)?;
        self.asm.mov(edx, eax)?;
        self.asm.and(eax, 0xFFFF)?;
        self.asm.or(eax, (layout::CODE_SELECTOR as i32) << 16)?;
        self.asm.and(edx, 0xFFFF_0000u32 as i32)?;
        self.asm.or(edx, gate as i32)?;
        self.asm.mov(ebx, entry as u32)?;
        match self.mode {
            Mode::Long => {
                self.asm.mov(dword_ptr(rbx), eax)?;
                self.asm.mov(dword_ptr(rbx + 4), edx)?;
                self.asm.mov(dword_ptr(rbx + 8), 0u32)?;
                self.asm.mov(dword_ptr(rbx + 12), 0u32)?;
            }
            _ => {
                self.asm.mov(dword_ptr(ebx), eax)?;
                self.asm.mov(dword_ptr(ebx + 4), edx)?;
            }
        }
        Ok(())
    }

    /// Emits, at `label`, an interrupt handler that writes the APIC EOI register and returns.
    ///
    /// # Errors
    /// [`BuildError`] when the assembler rejects an instruction, or in real mode.
    pub(crate) fn eoi_handler(&mut self, label: &mut CodeLabel) -> Result<(), BuildError> {
        self.asm.set_label(label)?;
        match self.mode {
            Mode::Real => return Err(self.unsupported("an APIC interrupt handler")),
            Mode::Protected => {
                self.asm.push(ebx)?;
                self.asm.mov(ebx, layout::APIC_EOI as u32)?;
                self.asm.mov(dword_ptr(ebx), 0u32)?;
                self.asm.pop(ebx)?;
                // KVM's instruction emulator cannot do a protected-mode IRET; a far return that
                // drops EFLAGS does the same here, since the workloads only take interrupts with
                // IF=1 (STI's shadow covers the return).
                self.asm.sti()?;
                self.asm.retf_1(4)?;
            }
            Mode::Long => {
                self.asm.push(rbx)?;
                self.asm.mov(ebx, layout::APIC_EOI as u32)?;
                self.asm.mov(dword_ptr(rbx), 0u32)?;
                self.asm.pop(rbx)?;
                self.asm.iretq()?;
            }
        }
        Ok(())
    }

    /// Assembles the program into an image entered at its first byte.
    ///
    /// # Errors
    /// When a label is unresolved or an instruction cannot be encoded at the address.
    pub fn finish(self) -> Result<GuestImage, BuildError> {
        self.finish_with_labels(&[]).map(|(image, _)| image)
    }

    /// Emits, at `label`, an exception handler that skips the 2-byte instruction that faulted
    /// (e.g. `ud2`) and returns. It expects to be entered through an interrupt gate with IF=0 before
    /// the exception.
    ///
    /// # Errors
    /// [`BuildError`] when the assembler rejects an instruction, or in real mode.
    pub(crate) fn skip_instruction_handler(&mut self, label: &mut CodeLabel) -> Result<(), BuildError> {
        self.asm.set_label(label)?;
        match self.mode {
            Mode::Real => return Err(self.unsupported("an exception handler")),
            Mode::Protected => {
                self.asm.add(dword_ptr(esp), 2)?;
                // As in `eoi_handler`: a far return instead of the IRET KVM cannot emulate here.
                self.asm.retf_1(4)?;
            }
            Mode::Long => {
                self.asm.add(qword_ptr(rsp), 2)?;
                self.asm.iretq()?;
            }
        }
        Ok(())
    }

    /// Emits, at `label`, a long-mode handler for an exception that pushes an error code (#PF):
    /// it drops the code and skips the 2-byte instruction that faulted.
    ///
    /// # Errors
    /// [`BuildError`] when the assembler rejects an instruction, or outside long mode.
    pub(crate) fn skip_instruction_handler_with_error_code(
        &mut self,
        label: &mut CodeLabel,
    ) -> Result<(), BuildError> {
        if self.mode != Mode::Long {
            return Err(self.unsupported("an error-code exception handler"));
        }
        self.asm.set_label(label)?;
        self.asm.add(rsp, 8)?;
        self.asm.add(qword_ptr(rsp), 2)?;
        self.asm.iretq()?;
        Ok(())
    }

    /// Assembles the program and also returns the guest address of each of `labels`.
    ///
    /// # Errors
    /// As [`Program::finish`].
    pub fn finish_with_labels(mut self, labels: &[CodeLabel]) -> Result<(GuestImage, Vec<u64>), BuildError> {
        let base = match self.mode {
            Mode::Real => Mode::real_mode_segment_base(self.load_gpa),
            _ => 0,
        };
        let result = self
            .asm
            .assemble_options(self.load_gpa - base, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)?;
        let addresses =
            labels.iter().map(|l| result.label_ip(l).map(|ip| ip + base)).collect::<Result<Vec<_>, _>>()?;
        let bytes = result.inner.code_buffer;
        Ok((GuestImage { mode: self.mode, load_gpa: self.load_gpa, entry: self.load_gpa, bytes }, addresses))
    }
}
