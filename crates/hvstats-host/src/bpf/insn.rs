//! eBPF instructions and a small assembler with forward labels.
//!
//! The programs hvstats loads are a few dozen instructions, generated at run time from a
//! tracepoint's format and the classes to count, so they are assembled here rather than compiled:
//! `cargo build` needs no compiler for BPF. The encoding is the kernel's `struct bpf_insn`
//! (Documentation/bpf/standardization/instruction-set.rst).

/// A register, `r0`..`r10` (`r10` is the read-only frame pointer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reg(pub u8);

/// Return value and helper results.
pub const R0: Reg = Reg(0);
/// First helper argument; the context at entry.
pub const R1: Reg = Reg(1);
/// Second helper argument.
pub const R2: Reg = Reg(2);
/// Third helper argument / scratch.
pub const R3: Reg = Reg(3);
/// Fourth helper argument / scratch.
pub const R4: Reg = Reg(4);
/// Fifth helper argument / scratch.
pub const R5: Reg = Reg(5);
/// Callee-saved.
pub const R6: Reg = Reg(6);
/// Callee-saved.
pub const R7: Reg = Reg(7);
/// Callee-saved.
pub const R8: Reg = Reg(8);
/// Callee-saved.
pub const R9: Reg = Reg(9);
/// The frame pointer.
pub const R10: Reg = Reg(10);

/// Helper `bpf_map_lookup_elem`.
pub const HELPER_MAP_LOOKUP_ELEM: i32 = 1;
/// Helper `bpf_ktime_get_ns` (`CLOCK_MONOTONIC` nanoseconds).
pub const HELPER_KTIME_GET_NS: i32 = 5;
/// Helper `bpf_get_current_pid_tgid`.
pub const HELPER_GET_CURRENT_PID_TGID: i32 = 14;
/// Helper `bpf_get_current_task` (the running task's address, as a number).
pub const HELPER_GET_CURRENT_TASK: i32 = 35;
/// Helper `bpf_probe_read_kernel` (copies kernel memory; a fault copies zeros and fails).
pub const HELPER_PROBE_READ_KERNEL: i32 = 113;
/// Helper `bpf_seq_write` (an iterator program's output; GPL programs only).
pub const HELPER_SEQ_WRITE: i32 = 127;

/// Memory access sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// 1 byte.
    B,
    /// 2 bytes.
    H,
    /// 4 bytes.
    W,
    /// 8 bytes.
    Dw,
}

impl Size {
    /// The size of a field of `bytes` bytes, if it is one a load can take.
    pub fn of(bytes: usize) -> Option<Self> {
        Some(match bytes {
            1 => Size::B,
            2 => Size::H,
            4 => Size::W,
            8 => Size::Dw,
            _ => return None,
        })
    }

    fn code(self) -> u8 {
        match self {
            Size::W => 0x00,
            Size::H => 0x08,
            Size::B => 0x10,
            Size::Dw => 0x18,
        }
    }
}

/// Conditional jumps (64-bit compares).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cond {
    /// `==`.
    Eq,
    /// `!=`.
    Ne,
    /// Unsigned `>`.
    Gt,
    /// Unsigned `>=`.
    Ge,
    /// Unsigned `<`.
    Lt,
    /// Unsigned `<=`.
    Le,
    /// Signed `>`.
    Sgt,
    /// Signed `>=`.
    Sge,
    /// Signed `<`.
    Slt,
    /// Signed `<=`.
    Sle,
    /// `a & b != 0`.
    Set,
}

impl Cond {
    fn op(self) -> u8 {
        match self {
            Cond::Eq => 0x10,
            Cond::Gt => 0x20,
            Cond::Ge => 0x30,
            Cond::Set => 0x40,
            Cond::Ne => 0x50,
            Cond::Sgt => 0x60,
            Cond::Sge => 0x70,
            Cond::Lt => 0xa0,
            Cond::Le => 0xb0,
            Cond::Slt => 0xc0,
            Cond::Sle => 0xd0,
        }
    }
}

const CLASS_LDX: u8 = 0x01;
const CLASS_ST: u8 = 0x02;
const CLASS_STX: u8 = 0x03;
const CLASS_JMP: u8 = 0x05;
const CLASS_ALU: u8 = 0x04;
const CLASS_ALU64: u8 = 0x07;
const MODE_MEM: u8 = 0x60;
const SRC_X: u8 = 0x08;
const ALU_ADD: u8 = 0x00;
const ALU_SUB: u8 = 0x10;
const ALU_LSH: u8 = 0x60;
const ALU_RSH: u8 = 0x70;
const ALU_MOV: u8 = 0xb0;
const ALU_ARSH: u8 = 0xc0;
/// `BPF_PSEUDO_MAP_FD`: the 64-bit immediate of `ld_imm64` is a map's fd.
const PSEUDO_MAP_FD: u8 = 1;
/// `BPF_PSEUDO_KFUNC_CALL`: a call's immediate is a kernel function's BTF id.
const PSEUDO_KFUNC_CALL: u8 = 2;

/// One encoded instruction (`struct bpf_insn`).
pub fn encode(code: u8, dst: Reg, src: Reg, off: i16, imm: i32) -> u64 {
    u64::from(code)
        | (u64::from(dst.0 & 0xf) << 8)
        | (u64::from(src.0 & 0xf) << 12)
        | (u64::from(off as u16) << 16)
        | (u64::from(imm as u32) << 32)
}

/// A label: a jump target bound later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Label(usize);

/// A program under construction.
#[derive(Debug, Default)]
pub struct Asm {
    insns: Vec<u64>,
    /// Where each label is bound.
    labels: Vec<Option<usize>>,
    /// Jumps to patch: (instruction index, label).
    fixups: Vec<(usize, Label)>,
}

/// An error assembling a program.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AsmError {
    /// A jump targets a label never bound.
    #[error("a jump targets a label that was never bound")]
    Unbound,
    /// A jump is farther than 32,767 instructions.
    #[error("a jump is too far for a 16-bit offset")]
    TooFar,
}

impl Asm {
    /// A new label.
    pub fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    /// Binds `label` to the next instruction.
    pub fn bind(&mut self, label: Label) {
        self.labels[label.0] = Some(self.insns.len());
    }

    fn push(&mut self, insn: u64) {
        self.insns.push(insn);
    }

    /// `dst = src` (64-bit).
    pub fn mov(&mut self, dst: Reg, src: Reg) {
        self.push(encode(CLASS_ALU64 | ALU_MOV | SRC_X, dst, src, 0, 0));
    }

    /// `dst = (u32)src` (the upper half cleared).
    pub(crate) fn mov32(&mut self, dst: Reg, src: Reg) {
        self.push(encode(CLASS_ALU | ALU_MOV | SRC_X, dst, src, 0, 0));
    }

    /// `dst = imm` (sign-extended).
    pub(crate) fn mov_imm(&mut self, dst: Reg, imm: i32) {
        self.push(encode(CLASS_ALU64 | ALU_MOV, dst, Reg(0), 0, imm));
    }

    /// `dst += imm` (sign-extended).
    pub(crate) fn add_imm(&mut self, dst: Reg, imm: i32) {
        self.push(encode(CLASS_ALU64 | ALU_ADD, dst, Reg(0), 0, imm));
    }

    /// `dst += src`.
    pub fn add(&mut self, dst: Reg, src: Reg) {
        self.push(encode(CLASS_ALU64 | ALU_ADD | SRC_X, dst, src, 0, 0));
    }

    /// `dst -= src`.
    pub fn sub(&mut self, dst: Reg, src: Reg) {
        self.push(encode(CLASS_ALU64 | ALU_SUB | SRC_X, dst, src, 0, 0));
    }

    /// `dst <<= imm`.
    pub(crate) fn lsh_imm(&mut self, dst: Reg, imm: i32) {
        self.push(encode(CLASS_ALU64 | ALU_LSH, dst, Reg(0), 0, imm));
    }

    /// `dst >>= imm` (logical).
    pub(crate) fn rsh_imm(&mut self, dst: Reg, imm: i32) {
        self.push(encode(CLASS_ALU64 | ALU_RSH, dst, Reg(0), 0, imm));
    }

    /// `dst >>= imm` (arithmetic).
    pub(crate) fn arsh_imm(&mut self, dst: Reg, imm: i32) {
        self.push(encode(CLASS_ALU64 | ALU_ARSH, dst, Reg(0), 0, imm));
    }

    /// `dst = imm` for any 64-bit value (two instruction slots).
    pub fn ld_imm64(&mut self, dst: Reg, imm: u64) {
        self.push(encode(0x18, dst, Reg(0), 0, imm as u32 as i32));
        self.push(encode(0, Reg(0), Reg(0), 0, (imm >> 32) as u32 as i32));
    }

    /// `dst = the map whose fd is fd` (two instruction slots, resolved by the kernel at load).
    pub fn ld_map_fd(&mut self, dst: Reg, fd: i32) {
        self.push(encode(0x18, dst, Reg(PSEUDO_MAP_FD), 0, fd));
        self.push(0);
    }

    /// `dst = *(size *)(src + off)`, zero-extended.
    pub fn load(&mut self, size: Size, dst: Reg, src: Reg, off: i16) {
        self.push(encode(CLASS_LDX | MODE_MEM | size.code(), dst, src, off, 0));
    }

    /// `*(size *)(dst + off) = src`.
    pub fn store(&mut self, size: Size, dst: Reg, off: i16, src: Reg) {
        self.push(encode(CLASS_STX | MODE_MEM | size.code(), dst, src, off, 0));
    }

    /// `*(size *)(dst + off) = imm`.
    pub(crate) fn store_imm(&mut self, size: Size, dst: Reg, off: i16, imm: i32) {
        self.push(encode(CLASS_ST | MODE_MEM | size.code(), dst, Reg(0), off, imm));
    }

    /// `if dst <cond> imm goto label` (imm sign-extended to 64 bits).
    pub(crate) fn jump_imm(&mut self, cond: Cond, dst: Reg, imm: i32, label: Label) {
        self.fixups.push((self.insns.len(), label));
        self.push(encode(CLASS_JMP | cond.op(), dst, Reg(0), 0, imm));
    }

    /// `if dst <cond> src goto label`.
    pub(crate) fn jump_reg(&mut self, cond: Cond, dst: Reg, src: Reg, label: Label) {
        self.fixups.push((self.insns.len(), label));
        self.push(encode(CLASS_JMP | cond.op() | SRC_X, dst, src, 0, 0));
    }

    /// `goto label`.
    pub fn ja(&mut self, label: Label) {
        self.fixups.push((self.insns.len(), label));
        self.push(encode(CLASS_JMP, Reg(0), Reg(0), 0, 0));
    }

    /// Calls helper `id` (arguments in r1..r5, result in r0; r1..r5 are clobbered).
    pub fn call(&mut self, id: i32) {
        self.push(encode(CLASS_JMP | 0x80, Reg(0), Reg(0), 0, id));
    }

    /// Calls the kernel's function `btf_id` (a kfunc: its `FUNC` id in the kernel's BTF, whose
    /// prototype the verifier checks the arguments against), as [`call`](Self::call) does.
    pub(crate) fn call_kfunc(&mut self, btf_id: u32) {
        self.push(encode(CLASS_JMP | 0x80, Reg(0), Reg(PSEUDO_KFUNC_CALL), 0, btf_id as i32));
    }

    /// Returns r0.
    pub fn exit(&mut self) {
        self.push(encode(CLASS_JMP | 0x90, Reg(0), Reg(0), 0, 0));
    }

    /// The instructions, jumps resolved.
    ///
    /// # Errors
    /// When a label is unbound or a jump too far.
    pub fn finish(mut self) -> Result<Vec<u64>, AsmError> {
        for &(at, label) in &self.fixups {
            let target = self.labels[label.0].ok_or(AsmError::Unbound)?;
            let off = target as i64 - (at as i64 + 1);
            let off = i16::try_from(off).map_err(|_| AsmError::TooFar)?;
            self.insns[at] = (self.insns[at] & !0xffff_0000) | (u64::from(off as u16) << 16);
        }
        Ok(self.insns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_are_the_kernels() {
        // Values as `bpftool prog dump xlated opcodes` shows them (little-endian words).
        let mut a = Asm::default();
        a.mov(R6, R1); // bf 16 00 00 00 00 00 00
        a.mov_imm(R0, 0); // b7 00 00 00 00 00 00 00
        a.load(Size::W, R2, R6, 8); // 61 62 08 00 00 00 00 00
        a.store(Size::W, R10, -4, R0); // 63 0a fc ff 00 00 00 00
        a.call(HELPER_MAP_LOOKUP_ELEM); // 85 00 00 00 01 00 00 00
        a.exit(); // 95 00 ...
        let insns = a.finish().unwrap();
        let bytes: Vec<[u8; 8]> = insns.iter().map(|i| i.to_le_bytes()).collect();
        assert_eq!(bytes[0], [0xbf, 0x16, 0, 0, 0, 0, 0, 0]);
        assert_eq!(bytes[1], [0xb7, 0x00, 0, 0, 0, 0, 0, 0]);
        assert_eq!(bytes[2], [0x61, 0x62, 8, 0, 0, 0, 0, 0]);
        assert_eq!(bytes[3], [0x63, 0x0a, 0xfc, 0xff, 0, 0, 0, 0]);
        assert_eq!(bytes[4], [0x85, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(bytes[5], [0x95, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn jumps_land_on_their_labels_forward_and_back() {
        let mut a = Asm::default();
        let top = a.label();
        let out = a.label();
        a.bind(top);
        a.jump_imm(Cond::Eq, R0, 7, out); // 0 -> 4: off 3
        a.ld_imm64(R1, 1 << 40); // 1, 2
        a.ja(top); // 3 -> 0: off -4
        // 4: exit
        a.bind(out);
        a.exit();
        let insns = a.finish().unwrap();
        let off = |i: usize| (insns[i] >> 16) as u16 as i16;
        assert_eq!(off(0), 3);
        assert_eq!(off(3), -4);
        assert_eq!(insns[0] >> 32, 7);
        assert_eq!((insns[1] >> 32, insns[2] >> 32), (0, 1 << 8));
    }

    #[test]
    fn an_unbound_label_is_an_error() {
        let mut a = Asm::default();
        let nowhere = a.label();
        a.ja(nowhere);
        assert_eq!(a.finish(), Err(AsmError::Unbound));
    }
}
