//! The built-in workloads: guests whose intercept counts are known exactly in advance.
//!
//! A [`Workload`] lists how many of each operation a VP performs (per VP, so VPs of one image run
//! different counts); [`Workload::build`] assembles it for a mode and [`Workload::expected`] says
//! what every counter source must then report for VP `i`.

use iced_x86::code_asm::*;

use hvstats_abi::apic;
use hvstats_abi::hypercall::{HypercallCode, MSR_GUEST_OS_ID, MSR_HYPERCALL, hypercall_msr};

use crate::hyperv::GUEST_OS_ID;
use crate::layout;
use crate::program::{BuildError, GuestImage, LoopCount, Mode, Program};

/// The interrupt vector the workloads' APIC timer and self-IPIs use.
pub const VECTOR: u8 = 0x40;
/// #UD (invalid opcode), vector 6: where the `ud2` loop's exceptions are handled.
pub const UD_VECTOR: u8 = 6;
/// #PF (page fault), vector 14: where the page-fault loop's faults are handled (long mode).
pub const PF_VECTOR: u8 = 14;
/// An address the long-mode identity map leaves unmapped (it covers the low 4 GiB).
pub const UNMAPPED_ADDRESS: u64 = 0x1_0000_0000;
/// The MSR the workloads read and KVM answers in the kernel (IA32_TIME_STAMP_COUNTER).
pub const KERNEL_READ_MSR: u32 = 0x10;
/// The MSR the workloads write and KVM handles in the kernel (IA32_SYSENTER_CS).
pub const KERNEL_WRITE_MSR: u32 = 0x174;
/// An MSR no one implements: KVM sends its reads to userspace, where the VMM answers 0.
pub use hvstats_abi::boot::SINK_MSR;
/// The APIC timer's initial count in the HLT loop: 500 µs at KVM's 1 GHz APIC bus. The timer must
/// outlast the instructions from arming it to HLT under the slowest backend (every instruction
/// emulated, on a loaded host): a wake-up already pending as HLT executes makes KVM skip the halt,
/// and nothing reaches its halt time or histograms.
pub const TIMER_COUNT: u32 = 500_000;
/// The exit status of a workload whose hypercall did not return `HV_STATUS_SUCCESS`.
pub const HYPERCALL_FAILED: u32 = 0xE1;
/// The first guest RAM the workloads' fresh-memory writes use: nothing below it is needed by a
/// workload, and nothing from it on is touched by the VMM or by the guest before them.
pub const FRESH_RAM: u64 = 4 << 20;
/// One fresh-memory write per region of this size (2 MiB, the largest page the host may back
/// guest RAM with): each write is the first touch of its region, whatever page size the host
/// uses.
pub const FRESH_REGION: u64 = 2 << 20;
/// The fresh-memory writes one VP may do; VP `i` writes in its own
/// `FRESH_WRITES_PER_VP` regions from `FRESH_RAM + i * FRESH_WRITES_PER_VP * FRESH_REGION`.
pub const FRESH_WRITES_PER_VP: u32 = 16;

/// The guest RAM a partition of `vps` VPs needs for fresh-memory writes.
pub const fn fresh_ram_end(vps: u32) -> u64 {
    FRESH_RAM + vps as u64 * FRESH_WRITES_PER_VP as u64 * FRESH_REGION
}

/// Operation counts of a workload, each `base + vp_index * per_vp`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Workload {
    /// CPUID instructions (handled in the kernel).
    pub cpuid: LoopCount,
    /// OUTs to the sink port (handled in userspace).
    pub out: LoopCount,
    /// INs from the sink port (handled in userspace).
    pub in_: LoopCount,
    /// RDMSRs of [`KERNEL_READ_MSR`] (handled in the kernel).
    pub rdmsr: LoopCount,
    /// WRMSRs of [`KERNEL_WRITE_MSR`] (handled in the kernel).
    pub wrmsr: LoopCount,
    /// RDMSRs of [`SINK_MSR`] (handled in userspace).
    pub user_msr: LoopCount,
    /// HLTs, each woken by a one-shot APIC timer interrupt.
    pub hlt: LoopCount,
    /// Writes to the APIC EOI register.
    pub eoi: LoopCount,
    /// Self-IPIs through the APIC ICR, each followed by a sink-port write and taken by a handler
    /// that writes EOI.
    pub self_ipi: LoopCount,
    /// Writes to the APIC TPR register.
    pub tpr: LoopCount,
    /// Writes to [`SINK_MMIO`](layout::SINK_MMIO), each an MMIO exit handled in userspace (a
    /// memory intercept). Protected and long mode.
    pub mmio: LoopCount,
    /// Writes of the EOI register as x2APIC MSR 0x80B, after every other APIC use: the VP
    /// switches its APIC to x2APIC mode first (an RDMSR and a WRMSR of IA32_APIC_BASE, handled
    /// in the kernel), when this or `x2apic_tpr` is not zero.
    pub x2apic_eoi: LoopCount,
    /// Writes of the TPR as x2APIC MSR 0x808.
    pub x2apic_tpr: LoopCount,
    /// Reads and writes of CR0 (`mov eax, cr0; mov cr0, eax`: two accesses each).
    pub cr0: LoopCount,
    /// `ud2` instructions, each raising #UD that a handler skips (an exception injected).
    pub ud2: LoopCount,
    /// `invlpg` instructions (paging is on only in long mode).
    pub invlpg: LoopCount,
    /// Reads of an unmapped address, each a #PF delivered to the guest and skipped by its handler
    /// (long mode only).
    pub page_faults: LoopCount,
    /// Writes to guest RAM nothing touched before, one per [`FRESH_REGION`] (the iterations past
    /// [`FRESH_WRITES_PER_VP`] write nothing; the partition needs RAM up to [`fresh_ram_end`]):
    /// each one a page the host allocates on the VP thread as the guest first touches it.
    /// Protected and long mode; a repeat writes the same regions again.
    pub fresh_memory: LoopCount,
    /// HvCallNotifyLongSpinWait hypercalls through the hypercall page, which the workload enables
    /// first (two synthetic MSR writes). Needs the partition's Hyper-V enlightenment; long and
    /// protected mode.
    pub hypercalls: LoopCount,
    /// Runs the loops again and again, never reaching the serial text and the exit port, until
    /// the host stops the VP: a workload that lasts as long as the host wants.
    pub repeat: bool,
    /// Text written to the serial port before exiting.
    pub serial: Vec<u8>,
    /// The exit status (every VP exits with it).
    pub exit_status: u32,
}

/// What a VP running a workload must be counted as doing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Expected {
    /// CPUID instructions.
    pub cpuid: u64,
    /// Port I/O instructions (sink, serial and exit ports).
    pub io: u64,
    /// Port I/O exits to userspace (all of them here).
    pub io_exits: u64,
    /// MSR accesses, kernel and userspace.
    pub msr: u64,
    /// MSR accesses handled in userspace.
    pub user_msr: u64,
    /// HLT instructions.
    pub hlt: u64,
    /// APIC MMIO accesses.
    pub apic_mmio: u64,
    /// MMIO exits to userspace (memory intercept messages).
    pub user_mmio: u64,
    /// APIC EOI writes (xAPIC or x2APIC): one per interrupt handled, plus the EOI loops'.
    pub eoi: u64,
    /// IPIs sent, self IPIs included (the workloads send no other kind).
    pub ipis: u64,
    /// Self IPIs sent.
    pub self_ipis: u64,
    /// Interrupts the guest handles: a timer interrupt per HLT and one per self IPI.
    pub interrupts: u64,
    /// Control register accesses: two per CR0 loop iteration (read, then write back).
    pub cr: u64,
    /// APIC TPR accesses.
    pub tpr: u64,
    /// Exceptions the guest takes: a #UD per `ud2` and a #PF per page fault.
    pub exceptions: u64,
    /// INVLPG instructions.
    pub invlpg: u64,
    /// Page faults delivered to the guest.
    pub page_faults: u64,
    /// Fresh guest memory regions written (each a host page fault of the VP thread).
    pub fresh_memory: u64,
    /// Hypercalls (all of the long spin wait class).
    pub hypercalls: u64,
}

impl Workload {
    fn uses_interrupts(&self) -> bool {
        !self.hlt.is_zero() || !self.self_ipi.is_zero()
    }

    fn uses_x2apic(&self) -> bool {
        !self.x2apic_eoi.is_zero() || !self.x2apic_tpr.is_zero()
    }

    fn uses_apic(&self) -> bool {
        self.uses_interrupts() || !self.eoi.is_zero() || !self.tpr.is_zero()
    }

    /// The counts VP `vp` must report.
    pub fn expected(&self, vp: u32) -> Expected {
        let n = |c: LoopCount| c.of(vp);
        let io = n(self.out) + n(self.in_) + n(self.self_ipi) + self.serial.len() as u64 + 1;
        let setup_mmio = if self.uses_apic() { 1 } else { 0 } + if self.hlt.is_zero() { 0 } else { 2 };
        // Enabling the hypercall page: GUEST_OS_ID and HYPERCALL, both handled in userspace.
        let hypercall_msrs = if self.hypercalls.is_zero() { 0 } else { 2 };
        // x2APIC mode: IA32_APIC_BASE read and written, then one WRMSR per register write.
        let x2apic = n(self.x2apic_eoi) + n(self.x2apic_tpr);
        let x2apic_msrs = if self.uses_x2apic() { 2 + x2apic } else { 0 };
        Expected {
            cpuid: n(self.cpuid),
            io,
            io_exits: io,
            msr: n(self.rdmsr) + n(self.wrmsr) + n(self.user_msr) + hypercall_msrs + x2apic_msrs,
            user_msr: n(self.user_msr) + hypercall_msrs,
            hypercalls: n(self.hypercalls),
            hlt: n(self.hlt),
            user_mmio: n(self.mmio),
            apic_mmio: setup_mmio + 2 * n(self.hlt) + n(self.eoi) + 2 * n(self.self_ipi) + n(self.tpr),
            eoi: n(self.hlt) + n(self.eoi) + n(self.self_ipi) + n(self.x2apic_eoi),
            ipis: n(self.self_ipi),
            self_ipis: n(self.self_ipi),
            interrupts: n(self.hlt) + n(self.self_ipi),
            cr: 2 * n(self.cr0),
            tpr: n(self.tpr) + n(self.x2apic_tpr),
            exceptions: n(self.ud2) + n(self.page_faults),
            invlpg: n(self.invlpg),
            page_faults: n(self.page_faults),
            fresh_memory: n(self.fresh_memory).min(FRESH_WRITES_PER_VP as u64),
        }
    }

    /// Assembles the workload for `mode`, loaded at `load_gpa`.
    ///
    /// # Errors
    /// APIC work (HLT with timer, EOI, TPR, self-IPIs) and exceptions need protected or long
    /// mode.
    pub fn build(&self, mode: Mode, load_gpa: u64) -> Result<GuestImage, BuildError> {
        // The first assembly finds the handler's address; the second uses it (same layout: the
        // address is a 32-bit immediate either way).
        let (_, handlers) = self.assemble(mode, load_gpa, [0; 3])?;
        let (image, again) = self.assemble(mode, load_gpa, handlers.map(|a| a as u32))?;
        debug_assert_eq!(handlers, again);
        Ok(image)
    }

    fn assemble(
        &self,
        mode: Mode,
        load_gpa: u64,
        handler_addresses: [u32; 3],
    ) -> Result<(GuestImage, [u64; 3]), BuildError> {
        let mut p = Program::new(mode, load_gpa)?;
        let mut handler = p.asm().create_label();
        let mut ud_handler = p.asm().create_label();
        let mut pf_handler = p.asm().create_label();
        if self.uses_interrupts() {
            p.install_interrupt_gate(VECTOR, handler_addresses[0])?;
        }
        if !self.ud2.is_zero() {
            p.install_interrupt_gate(UD_VECTOR, handler_addresses[1])?;
        }
        if !self.page_faults.is_zero() {
            if mode != Mode::Long {
                return Err(BuildError::Unsupported { what: "page faults (paging)", mode: mode.name() });
            }
            p.install_interrupt_gate(PF_VECTOR, handler_addresses[2])?;
        }
        if self.uses_apic() {
            p.store32(layout::APIC_SVR, 0x1FF)?;
        }
        if !self.hlt.is_zero() {
            p.store32(layout::APIC_TIMER_DIVIDE, 0xB)?;
            p.store32(layout::APIC_LVT_TIMER, VECTOR as u32)?;
        }
        let mut again = p.asm().create_label();
        p.asm().set_label(&mut again)?;
        p.counted_loop(self.cpuid, |p| {
            p.asm().xor(eax, eax)?;
            p.asm().xor(ecx, ecx)?;
            p.asm().cpuid()?;
            Ok(())
        })?;
        p.counted_loop(self.out, |p| {
            p.asm().mov(edx, layout::SINK_PORT as u32)?;
            p.asm().out(dx, al)?;
            Ok(())
        })?;
        p.counted_loop(self.in_, |p| {
            p.asm().mov(edx, layout::SINK_PORT as u32)?;
            p.asm().in_(al, dx)?;
            Ok(())
        })?;
        p.counted_loop(self.rdmsr, |p| {
            p.asm().mov(ecx, KERNEL_READ_MSR)?;
            p.asm().rdmsr()?;
            Ok(())
        })?;
        p.counted_loop(self.wrmsr, |p| {
            p.asm().mov(ecx, KERNEL_WRITE_MSR)?;
            p.asm().mov(eax, edi)?;
            p.asm().xor(edx, edx)?;
            p.asm().wrmsr()?;
            Ok(())
        })?;
        p.counted_loop(self.user_msr, |p| {
            p.asm().mov(ecx, SINK_MSR)?;
            p.asm().rdmsr()?;
            Ok(())
        })?;
        p.counted_loop(self.mmio, |p| p.store32(layout::SINK_MMIO, 0))?;
        p.counted_loop(self.cr0, |p| {
            match p.mode() {
                Mode::Long => {
                    p.asm().mov(rax, cr0)?;
                    p.asm().mov(cr0, rax)?;
                }
                _ => {
                    p.asm().mov(eax, cr0)?;
                    p.asm().mov(cr0, eax)?;
                }
            }
            Ok(())
        })?;
        p.counted_loop(self.ud2, |p| {
            p.asm().ud2()?;
            Ok(())
        })?;
        p.counted_loop(self.invlpg, |p| {
            match p.mode() {
                Mode::Long => p.asm().invlpg(byte_ptr(rbx))?,
                _ => p.asm().invlpg(byte_ptr(ebx))?,
            }
            Ok(())
        })?;
        p.counted_loop(self.page_faults, |p| {
            // `mov eax, [rbx]` (2 bytes) on an unmapped address: #PF, skipped by the handler.
            p.asm().mov(rbx, UNMAPPED_ADDRESS)?;
            p.asm().mov(eax, dword_ptr(rbx))?;
            Ok(())
        })?;
        if !self.fresh_memory.is_zero() && mode == Mode::Real {
            return Err(BuildError::Unsupported {
                what: "fresh-memory writes (above 1 MiB)",
                mode: mode.name(),
            });
        }
        p.counted_loop(self.fresh_memory, |p| {
            // EBX = FRESH_RAM + (vp * FRESH_WRITES_PER_VP + count - 1) * FRESH_REGION; the
            // iterations past the VP's regions write nothing.
            let shift = FRESH_REGION.trailing_zeros();
            let mut past = p.asm().create_label();
            p.asm().cmp(ebp, FRESH_WRITES_PER_VP as i32)?;
            p.asm().ja(past)?;
            p.asm().mov(ebx, edi)?;
            p.asm().imul_3(ebx, ebx, FRESH_WRITES_PER_VP as i32)?;
            p.asm().add(ebx, ebp)?;
            p.asm().dec(ebx)?;
            p.asm().shl(ebx, shift)?;
            p.asm().add(ebx, FRESH_RAM as i32)?;
            match p.mode() {
                Mode::Long => p.asm().mov(dword_ptr(rbx), 1u32)?,
                _ => p.asm().mov(dword_ptr(ebx), 1u32)?,
            }
            p.asm().set_label(&mut past)?;
            p.asm().nop()?;
            Ok(())
        })?;
        if !self.hypercalls.is_zero() {
            if mode == Mode::Real {
                return Err(BuildError::Unsupported { what: "hypercalls", mode: mode.name() });
            }
            p.asm().mov(ecx, MSR_GUEST_OS_ID)?;
            p.asm().mov(eax, GUEST_OS_ID as u32)?;
            p.asm().mov(edx, (GUEST_OS_ID >> 32) as u32)?;
            p.asm().wrmsr()?;
            p.asm().mov(ecx, MSR_HYPERCALL)?;
            p.asm().mov(eax, layout::HYPERCALL_PAGE as u32 | hypercall_msr::ENABLE as u32)?;
            p.asm().xor(edx, edx)?;
            p.asm().wrmsr()?;
        }
        p.counted_loop(self.hypercalls, |p| {
            let code = HypercallCode::NOTIFY_LONG_SPIN_WAIT.0 as u32;
            if p.mode() == Mode::Long {
                // RCX = input value, RDX = input GPA, R8 = output GPA.
                p.asm().mov(ecx, code)?;
                p.asm().mov(edx, layout::HYPERCALL_INPUT as u32)?;
                p.asm().xor(r8d, r8d)?;
                p.asm().call(layout::HYPERCALL_PAGE)?;
            } else {
                // EDX:EAX = input value, EBX:ECX = input GPA, EDI:ESI = output GPA.
                p.asm().push(edi)?;
                p.asm().push(esi)?;
                p.asm().mov(eax, code)?;
                p.asm().xor(edx, edx)?;
                p.asm().mov(ecx, layout::HYPERCALL_INPUT as u32)?;
                p.asm().xor(ebx, ebx)?;
                p.asm().xor(edi, edi)?;
                p.asm().xor(esi, esi)?;
                p.asm().call(layout::HYPERCALL_PAGE)?;
                p.asm().pop(esi)?;
                p.asm().pop(edi)?;
            }
            // The status is in AX in both conventions: anything but success stops the VP.
            let mut ok = p.asm().create_label();
            p.asm().test(ax, ax)?;
            p.asm().jz(ok)?;
            p.exit(HYPERCALL_FAILED)?;
            p.asm().set_label(&mut ok)?;
            p.asm().nop()?;
            Ok(())
        })?;
        p.counted_loop(self.hlt, |p| {
            p.asm().cli()?;
            p.store32(layout::APIC_TIMER_INITIAL, TIMER_COUNT)?;
            // STI's one-instruction shadow keeps the interrupt off until HLT has executed.
            p.asm().sti()?;
            p.asm().hlt()?;
            Ok(())
        })?;
        p.counted_loop(self.eoi, |p| p.store32(layout::APIC_EOI, 0))?;
        if !self.self_ipi.is_zero() {
            p.asm().sti()?;
        }
        p.counted_loop(self.tpr, |p| p.store32(layout::APIC_TPR, 0))?;
        p.counted_loop(self.self_ipi, |p| {
            p.store32(layout::APIC_ICR_LOW, layout::ICR_SELF | VECTOR as u32)?;
            // KVM's instruction emulator injects a pending interrupt only when it enters the guest
            // again; an exit to userspace (a sink-port write) makes that happen at once.
            p.asm().mov(edx, layout::SINK_PORT as u32)?;
            p.asm().out(dx, al)?;
            Ok(())
        })?;
        if self.uses_x2apic() {
            // After every xAPIC MMIO access and interrupt: in x2APIC mode the MMIO page is gone.
            p.asm().cli()?;
            p.asm().mov(ecx, apic::IA32_APIC_BASE)?;
            p.asm().rdmsr()?;
            p.asm().or(eax, apic::APIC_BASE_X2APIC_ENABLE)?;
            p.asm().wrmsr()?;
        }
        for (count, msr) in [(self.x2apic_eoi, apic::X2APIC_EOI_MSR), (self.x2apic_tpr, apic::X2APIC_TPR_MSR)]
        {
            p.counted_loop(count, |p| {
                p.asm().mov(ecx, msr)?;
                p.asm().xor(eax, eax)?;
                p.asm().xor(edx, edx)?;
                p.asm().wrmsr()?;
                Ok(())
            })?;
        }
        p.asm().cli()?;
        if self.repeat {
            p.asm().jmp(again)?;
        }
        p.serial_print(&self.serial)?;
        p.exit(self.exit_status)?;
        let mut used = Vec::new();
        if self.uses_interrupts() {
            p.eoi_handler(&mut handler)?;
            used.push((0, handler));
        }
        if !self.ud2.is_zero() {
            p.skip_instruction_handler(&mut ud_handler)?;
            used.push((1, ud_handler));
        }
        if !self.page_faults.is_zero() {
            p.skip_instruction_handler_with_error_code(&mut pf_handler)?;
            used.push((2, pf_handler));
        }
        let labels: Vec<_> = used.iter().map(|(_, l)| *l).collect();
        let (image, found) = p.finish_with_labels(&labels)?;
        let mut addresses = [0u64; 3];
        for ((i, _), address) in used.iter().zip(found) {
            addresses[*i] = address;
        }
        Ok((image, addresses))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_assemble_in_every_mode_they_support() {
        let w = Workload {
            cpuid: LoopCount::per_vp(10, 5),
            out: LoopCount::fixed(3),
            in_: LoopCount::fixed(3),
            serial: b"hi".to_vec(),
            ..Workload::default()
        };
        for mode in [Mode::Real, Mode::Protected, Mode::Long] {
            let image = w.build(mode, layout::DEFAULT_LOAD_GPA).unwrap();
            assert!(!image.bytes.is_empty());
            assert_eq!(image.entry, layout::DEFAULT_LOAD_GPA);
        }
        assert_eq!(w.expected(2).cpuid, 20);
        assert_eq!(w.expected(0).io, 3 + 3 + 2 + 1);
    }

    #[test]
    fn apic_work_is_refused_in_real_mode() {
        let w = Workload { eoi: LoopCount::fixed(1), ..Workload::default() };
        assert!(matches!(w.build(Mode::Real, 0x1_0000), Err(BuildError::Unsupported { .. })));
        assert!(w.build(Mode::Protected, 0x1_0000).is_ok());
    }
}
