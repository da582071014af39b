//! The guest side of the Hyper-V stats protocol: 64-bit programs that detect the hypervisor,
//! enable the hypercall page, learn their partition id and VP index, map their own stats pages,
//! find counters by walking the group headers, and probe the hypercall rules.
//!
//! Programs follow the partition conventions of hvstats-kvm: long mode with an identity map, entry
//! with RDI = VP index and RSI = VP count, a stack per VP, a write to port 0xF4 stops the VP with
//! the value written as its exit status, and port 0x3F8 is the serial port.

use iced_x86::IcedError;
use iced_x86::code_asm::*;

use hvstats_abi::catalog::{CounterId, partition, vp};
use hvstats_abi::cpuid;
use hvstats_abi::hypercall::{
    HV_PARTITION_ID_SELF, HV_VP_INDEX_SELF, HypercallCode, INTERFACE_SIGNATURE, MSR_GUEST_OS_ID,
    MSR_HYPERCALL, MSR_VP_INDEX, hypercall_msr, map_input,
};

use crate::layout;
use hvstats_abi::object::StatsObjectType;

/// The guest OS id the programs announce (an open-source OS, vendor 0x8100 per the TLFS).
pub const GUEST_OS_ID: u64 = 0x8100_0000_0000_0001;

/// Where a program keeps its hypercall page and its per-VP input/output pages (all GPAs, which
/// equal the virtual addresses under the identity map).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HypercallLayout {
    /// GPA of the hypercall page (page aligned, in RAM).
    pub hypercall_page: u64,
    /// GPA of VP 0's input page; VP n uses `io_pages + n * 0x2000`, its output page the page after.
    pub io_pages: u64,
}

/// Exit statuses of [`stats_self_check`]: the step that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum SelfCheckFailure {
    /// CPUID 0x40000000 does not say "Microsoft Hv".
    NotHyperV = 10,
    /// CPUID 0x40000001 does not say "Hv#1".
    NoInterface = 11,
    /// CPUID 0x40000003 EBX bit 8 (AccessStats) is clear.
    NoAccessStats = 12,
    /// The VP_INDEX MSR does not give the VP index of the entry registers.
    WrongVpIndex = 13,
    /// HvCallGetPartitionId failed.
    GetPartitionId = 14,
    /// Mapping the VP page failed.
    MapVpPage = 15,
    /// The mapped page has no readable release-specific group.
    NoGroup = 16,
    /// The CPUID counter did not grow by exactly the CPUIDs executed.
    CpuidCount = 17,
    /// The hypercall counter is not the number of hypercalls made.
    HypercallCount = 18,
    /// Mapping the partition page failed (VP 0).
    MapPartitionPage = 19,
    /// The partition page's VP count is not the VP count of the entry registers.
    PartitionVps = 20,
    /// A write to the mapped page changed it.
    OverlayWritable = 21,
    /// Unmapping failed.
    Unmap = 22,
    /// The RAM beneath the overlay did not reappear intact.
    RamBeneath = 23,
}

/// Parameters of [`stats_self_check`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SelfCheck {
    /// Hypercall page and I/O pages.
    pub layout: HypercallLayout,
    /// VP n maps its VP page at GPA page `vp_page_base + n` (in RAM: the RAM beneath is checked).
    pub vp_page_base: u64,
    /// VP 0 maps the partition page at this GPA page.
    pub partition_page: u64,
    /// CPUIDs each VP executes between two reads of its CPUID counter.
    pub cpuids: u32,
}

/// A 64-bit program that checks, from inside the guest, that its own stats pages tell the truth.
///
/// Each VP: detects Hyper-V, enables the hypercall page, checks VP_INDEX, gets its partition id,
/// fills the target page with a pattern, maps its VP page there, finds the CPUID and hypercall
/// counters by walking the group headers, executes `cpuids` CPUIDs, makes a hypercall, and checks
/// the CPUID counter grew by exactly `cpuids` and the hypercall counter equals the hypercalls it
/// made; writes to the overlay and checks nothing changed; VP 0 also maps the partition page and
/// checks its VP count. Then it unmaps and checks the RAM pattern reappeared. The serial output
/// carries `vp=<index> cpuid=<before> <after> hc=<count>` per VP; the exit status is 0 or a
/// [`SelfCheckFailure`].
///
/// # Errors
/// When the assembler rejects the program (a label or an immediate out of range).
pub fn stats_self_check(p: SelfCheck, load_gpa: u64) -> Result<Vec<u8>, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    let mut fail = a.create_label();
    let mut print_hex = a.create_label();
    let mut walk = a.create_label();

    prologue(&mut a, p.layout)?;
    enable_hypercalls(&mut a, p.layout, &mut fail)?;

    // r9 = hypercalls made so far (kept in the page of the caller and checked against it).
    // GetPartitionId → rbp.
    a.mov(rcx, HypercallCode::GET_PARTITION_ID.0 as u64)?;
    call_hypercall(&mut a, p.layout)?;
    fail_if_status(&mut a, SelfCheckFailure::GetPartitionId, &mut fail)?;
    a.mov(rbp, qword_ptr(r15))?;

    // rbx = target GPA of this VP's page = (vp_page_base + vp) * 4096; fill it with a pattern.
    a.mov(rbx, p.vp_page_base)?;
    a.add(rbx, r12)?;
    a.shl(rbx, 12)?;
    fill_pattern(&mut a)?;

    // Map the VP page: type VP, identity (partition id, vp index, SELF).
    map_input(&mut a, StatsObjectType::VP.0)?;
    a.mov(qword_ptr(r14 + map_input::PARTITION_ID as i32), rbp)?;
    a.mov(dword_ptr(r14 + map_input::VP_INDEX as i32), r12d)?;
    // The rest of the identity: reserved bytes and the area, SELF.
    a.mov(dword_ptr(r14 + map_input::VP_INDEX as i32 + 4), 0u32)?;
    a.mov(rax, rbx)?;
    a.shr(rax, 12)?;
    a.mov(qword_ptr(r14 + map_input::TARGET_GPA_PAGE as i32), rax)?;
    a.mov(rcx, HypercallCode::MAP_STATS_PAGE.0 as u64)?;
    call_hypercall(&mut a, p.layout)?;
    fail_if_status(&mut a, SelfCheckFailure::MapVpPage, &mut fail)?;

    // Hypercalls so far: GetPartitionId and MapStatsPage. Read the counters after them.
    read_counter(&mut a, vp::CPUID_INSTRUCTIONS, &mut walk, &mut fail)?;
    a.mov(qword_ptr(r15 + 0x100), rax)?;
    // Execute the CPUIDs.
    a.mov(r10d, p.cpuids)?;
    let mut again = a.create_label();
    let mut done = a.create_label();
    a.set_label(&mut again)?;
    a.test(r10d, r10d)?;
    a.jz(done)?;
    a.push(rbx)?;
    a.xor(eax, eax)?;
    a.cpuid()?;
    a.pop(rbx)?;
    a.dec(r10d)?;
    a.jmp(again)?;
    a.set_label(&mut done)?;
    // A hypercall refreshes the page: NotifyLongSpinWait (3 hypercalls made now).
    a.mov(rcx, HypercallCode::NOTIFY_LONG_SPIN_WAIT.0 as u64)?;
    call_hypercall(&mut a, p.layout)?;
    read_counter(&mut a, vp::CPUID_INSTRUCTIONS, &mut walk, &mut fail)?;
    a.mov(qword_ptr(r15 + 0x108), rax)?;
    a.sub(rax, qword_ptr(r15 + 0x100))?;
    a.cmp(rax, p.cpuids as i32)?;
    a.mov(eax, SelfCheckFailure::CpuidCount as u32)?;
    a.jne(fail)?;
    read_counter(&mut a, vp::HYPERCALLS, &mut walk, &mut fail)?;
    a.mov(qword_ptr(r15 + 0x110), rax)?;
    a.cmp(rax, 3)?;
    a.mov(eax, SelfCheckFailure::HypercallCount as u32)?;
    a.jne(fail)?;

    // Serial: "vp=<i> cpuid=<before> <after> hc=<n>\n".
    serial_str(&mut a, "vp=")?;
    a.mov(rax, r12)?;
    a.call(print_hex)?;
    serial_str(&mut a, " cpuid=")?;
    a.mov(rax, qword_ptr(r15 + 0x100))?;
    a.call(print_hex)?;
    serial_str(&mut a, " ")?;
    a.mov(rax, qword_ptr(r15 + 0x108))?;
    a.call(print_hex)?;
    serial_str(&mut a, " hc=")?;
    a.mov(rax, qword_ptr(r15 + 0x110))?;
    a.call(print_hex)?;
    serial_str(&mut a, "\n")?;

    // A write to the overlay changes nothing.
    a.mov(rax, qword_ptr(rbx + 8))?;
    a.mov(rdx, 0xDEAD_BEEF_DEAD_BEEFu64)?;
    a.mov(qword_ptr(rbx + 8), rdx)?;
    a.cmp(qword_ptr(rbx + 8), rdx)?;
    a.mov(eax, SelfCheckFailure::OverlayWritable as u32)?;
    a.je(fail)?;

    // VP 0: map the partition page (SELF ids) and check its VP count.
    let mut not_vp0 = a.create_label();
    a.test(r12, r12)?;
    a.jnz(not_vp0)?;
    map_input(&mut a, StatsObjectType::PARTITION.0)?;
    a.mov(rax, HV_PARTITION_ID_SELF)?;
    a.mov(qword_ptr(r14 + map_input::PARTITION_ID as i32), rax)?;
    a.mov(qword_ptr(r14 + map_input::VP_INDEX as i32), 0i32)?;
    a.mov(rax, p.partition_page)?;
    a.mov(qword_ptr(r14 + map_input::TARGET_GPA_PAGE as i32), rax)?;
    a.mov(rcx, HypercallCode::MAP_STATS_PAGE2.0 as u64)?;
    call_hypercall(&mut a, p.layout)?;
    fail_if_status(&mut a, SelfCheckFailure::MapPartitionPage, &mut fail)?;
    a.push(rbx)?;
    a.mov(rbx, p.partition_page << 12)?;
    read_counter(&mut a, partition::VIRTUAL_PROCESSORS, &mut walk, &mut fail)?;
    a.pop(rbx)?;
    a.cmp(rax, r13)?;
    a.mov(eax, SelfCheckFailure::PartitionVps as u32)?;
    a.jne(fail)?;
    a.set_label(&mut not_vp0)?;

    // Unmap the VP page (SELF VP index this time) and check the RAM beneath.
    map_input(&mut a, StatsObjectType::VP.0)?;
    a.mov(qword_ptr(r14 + map_input::PARTITION_ID as i32), rbp)?;
    a.mov(dword_ptr(r14 + map_input::VP_INDEX as i32), HV_VP_INDEX_SELF)?;
    // The rest of the identity: reserved bytes and the area, SELF.
    a.mov(dword_ptr(r14 + map_input::VP_INDEX as i32 + 4), 0u32)?;
    a.mov(rcx, HypercallCode::UNMAP_STATS_PAGE.0 as u64)?;
    call_hypercall(&mut a, p.layout)?;
    fail_if_status(&mut a, SelfCheckFailure::Unmap, &mut fail)?;
    check_pattern(&mut a, &mut fail)?;

    a.xor(eax, eax)?;
    a.out(layout::EXIT_PORT as u32, al)?;
    a.hlt()?;
    // Failure: "fail status=<last hypercall result>" on the serial port, then the step's code.
    a.set_label(&mut fail)?;
    a.push(rax)?;
    serial_str(&mut a, "fail status=")?;
    a.mov(rax, qword_ptr(r15 + 0x118))?;
    a.call(print_hex)?;
    serial_str(&mut a, "\n")?;
    a.pop(rax)?;
    a.out(layout::EXIT_PORT as u32, al)?;
    a.hlt()?;

    emit_print_hex(&mut a, &mut print_hex)?;
    emit_walk(&mut a, &mut walk)?;
    a.assemble(load_gpa)
}

/// One hypercall of a [`hypercall_probe`] program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeCall {
    /// The input value (RCX).
    pub control: u64,
    /// Bytes written at the input GPA before the call.
    pub input: Vec<u8>,
    /// Offset of the input GPA within the VP's input page (to test alignment).
    pub input_offset: u32,
    /// Offset of the output GPA within the VP's output page.
    pub output_offset: u32,
    /// The status the call must return.
    pub expect: u16,
    /// Repeat the call up to this many more times while it returns another status (for a status
    /// that appears only once something else has happened, e.g. another VP faulting).
    pub retries: u32,
}

impl ProbeCall {
    /// A call of `control` with `input` at the start of the input page, expecting `expect`.
    pub fn new(control: u64, input: &[u8], expect: u16) -> Self {
        Self { control, input: input.to_vec(), input_offset: 0, output_offset: 0, expect, retries: 0 }
    }
}

/// A 64-bit program that enables the hypercall page and makes `calls` in order on every VP.
///
/// Each status is printed to the serial port as `s=<hex>`; the program stops with exit status 0
/// when every call returned its expected status, or `100 + i` for the first call `i` that did not
/// (and 10..=13 when the enlightenment itself is missing).
///
/// # Errors
/// When the assembler rejects the program (a label or an immediate out of range).
pub fn hypercall_probe(
    layout: HypercallLayout,
    calls: &[ProbeCall],
    load_gpa: u64,
) -> Result<Vec<u8>, IcedError> {
    probe(layout, calls, None, load_gpa)
}

/// [`hypercall_probe`] where VP `faulting_vp` does not probe but faults at once (`ud2` with no IDT:
/// a triple fault), so the other VPs can observe a partition that is no longer active.
///
/// # Errors
/// As [`hypercall_probe`].
pub fn hypercall_probe_with_faulting_vp(
    layout: HypercallLayout,
    calls: &[ProbeCall],
    faulting_vp: u32,
    load_gpa: u64,
) -> Result<Vec<u8>, IcedError> {
    probe(layout, calls, Some(faulting_vp), load_gpa)
}

fn probe(
    layout: HypercallLayout,
    calls: &[ProbeCall],
    faulting_vp: Option<u32>,
    load_gpa: u64,
) -> Result<Vec<u8>, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    let mut fail = a.create_label();
    let mut print_hex = a.create_label();
    prologue(&mut a, layout)?;
    if let Some(vp) = faulting_vp {
        let mut other = a.create_label();
        a.cmp(r12, vp as i32)?;
        a.jne(other)?;
        a.ud2()?;
        a.set_label(&mut other)?;
    }
    enable_hypercalls(&mut a, layout, &mut fail)?;
    for (i, call) in calls.iter().enumerate() {
        let mut attempt = a.create_label();
        let mut checked = a.create_label();
        a.mov(ebp, call.retries)?;
        a.set_label(&mut attempt)?;
        for (j, chunk) in call.input.chunks(8).enumerate() {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            a.mov(rax, u64::from_le_bytes(word))?;
            a.mov(qword_ptr(r14 + (call.input_offset as i32 + 8 * j as i32)), rax)?;
        }
        a.mov(rcx, call.control)?;
        a.lea(rdx, qword_ptr(r14 + call.input_offset as i32))?;
        a.lea(r8, qword_ptr(r15 + call.output_offset as i32))?;
        a.mov(rax, layout.hypercall_page)?;
        a.call(rax)?;
        a.push(rax)?;
        serial_str(&mut a, "s=")?;
        a.mov(rax, qword_ptr(rsp))?;
        a.and(eax, 0xFFFF)?;
        a.call(print_hex)?;
        serial_str(&mut a, "\n")?;
        a.pop(rax)?;
        a.cmp(ax, call.expect as i32)?;
        a.je(checked)?;
        a.sub(ebp, 1)?;
        a.jae(attempt)?;
        a.mov(eax, 100 + i as u32)?;
        a.jmp(fail)?;
        a.set_label(&mut checked)?;
    }
    a.xor(eax, eax)?;
    a.set_label(&mut fail)?;
    a.out(layout::EXIT_PORT as u32, al)?;
    a.hlt()?;
    emit_print_hex(&mut a, &mut print_hex)?;
    a.assemble(load_gpa)
}

/// r12 = VP index, r13 = VP count, r14 = input page, r15 = output page.
fn prologue(a: &mut CodeAssembler, layout: HypercallLayout) -> Result<(), IcedError> {
    a.mov(r12, rdi)?;
    a.mov(r13, rsi)?;
    a.mov(r14, r12)?;
    a.shl(r14, 13)?;
    a.mov(rax, layout.io_pages)?;
    a.add(r14, rax)?;
    a.lea(r15, qword_ptr(r14 + 0x1000))?;
    Ok(())
}

/// Detects Hyper-V, checks AccessStats-independent basics, sets GUEST_OS_ID, enables the hypercall
/// page and checks VP_INDEX. AccessStats is checked only by the self check.
fn enable_hypercalls(
    a: &mut CodeAssembler,
    layout: HypercallLayout,
    fail: &mut CodeLabel,
) -> Result<(), IcedError> {
    a.mov(eax, cpuid::HV_VENDOR_AND_MAX)?;
    a.cpuid()?;
    a.cmp(ebx, cpuid::HV_VENDOR_SIGNATURE[0] as i32)?;
    a.mov(eax, SelfCheckFailure::NotHyperV as u32)?;
    a.jne(*fail)?;
    a.cmp(edx, cpuid::HV_VENDOR_SIGNATURE[2] as i32)?;
    a.jne(*fail)?;
    a.mov(eax, cpuid::HV_INTERFACE)?;
    a.cpuid()?;
    a.cmp(eax, INTERFACE_SIGNATURE as i32)?;
    a.mov(eax, SelfCheckFailure::NoInterface as u32)?;
    a.jne(*fail)?;
    a.mov(ecx, MSR_GUEST_OS_ID)?;
    a.mov(eax, GUEST_OS_ID as u32)?;
    a.mov(edx, (GUEST_OS_ID >> 32) as u32)?;
    a.wrmsr()?;
    a.mov(ecx, MSR_HYPERCALL)?;
    a.mov(eax, (layout.hypercall_page as u32) | hypercall_msr::ENABLE as u32)?;
    a.mov(edx, (layout.hypercall_page >> 32) as u32)?;
    a.wrmsr()?;
    a.mov(ecx, MSR_VP_INDEX)?;
    a.rdmsr()?;
    a.cmp(rax, r12)?;
    a.mov(eax, SelfCheckFailure::WrongVpIndex as u32)?;
    a.jne(*fail)?;
    Ok(())
}

/// Calls the hypercall page with RCX as set, RDX = input page, R8 = output page.
fn call_hypercall(a: &mut CodeAssembler, layout: HypercallLayout) -> Result<(), IcedError> {
    a.mov(rdx, r14)?;
    a.mov(r8, r15)?;
    a.mov(rax, layout.hypercall_page)?;
    a.call(rax)?;
    Ok(())
}

fn fail_if_status(
    a: &mut CodeAssembler,
    code: SelfCheckFailure,
    fail: &mut CodeLabel,
) -> Result<(), IcedError> {
    a.mov(qword_ptr(r15 + 0x118), rax)?;
    a.test(ax, ax)?;
    a.mov(eax, code as u32)?;
    a.jnz(*fail)?;
    Ok(())
}

/// Starts a map/unmap input block of `stats_type` at r14 (padding zero).
fn map_input(a: &mut CodeAssembler, stats_type: u32) -> Result<(), IcedError> {
    a.mov(dword_ptr(r14 + map_input::STATS_TYPE as i32), stats_type)?;
    a.mov(dword_ptr(r14 + map_input::PADDING as i32), 0u32)?;
    Ok(())
}

/// Pattern of qword i of the RAM page beneath an overlay.
fn fill_pattern(a: &mut CodeAssembler) -> Result<(), IcedError> {
    let mut l = a.create_label();
    a.xor(ecx, ecx)?;
    a.set_label(&mut l)?;
    a.mov(rax, 0xA5A5_0000_0000_0000u64)?;
    a.or(rax, rcx)?;
    a.mov(qword_ptr(rbx + rcx * 8), rax)?;
    a.inc(ecx)?;
    a.cmp(ecx, 512)?;
    a.jb(l)?;
    Ok(())
}

fn check_pattern(a: &mut CodeAssembler, fail: &mut CodeLabel) -> Result<(), IcedError> {
    let mut l = a.create_label();
    a.xor(ecx, ecx)?;
    a.set_label(&mut l)?;
    a.mov(rax, 0xA5A5_0000_0000_0000u64)?;
    a.or(rax, rcx)?;
    a.cmp(qword_ptr(rbx + rcx * 8), rax)?;
    a.mov(eax, SelfCheckFailure::RamBeneath as u32)?;
    a.jne(*fail)?;
    a.inc(ecx)?;
    a.cmp(ecx, 512)?;
    a.jb(l)?;
    Ok(())
}

/// rax = value of `counter` in the page at rbx, found by walking the group headers.
fn read_counter(
    a: &mut CodeAssembler,
    counter: CounterId,
    walk: &mut CodeLabel,
    fail: &mut CodeLabel,
) -> Result<(), IcedError> {
    a.mov(edx, counter.group.group_type().0 as u32)?;
    a.mov(esi, counter.index as u32)?;
    a.call(*walk)?;
    a.cmp(rcx, -1)?;
    let mut ok = a.create_label();
    a.jne(ok)?;
    a.mov(eax, SelfCheckFailure::NoGroup as u32)?;
    a.jmp(*fail)?;
    a.set_label(&mut ok)?;
    Ok(())
}

/// walk(rbx = page, edx = group type, esi = index) → rax = value, rcx = offset (or -1 when the group
/// is missing, has another major version, or is too short for the index).
fn emit_walk(a: &mut CodeAssembler, walk: &mut CodeLabel) -> Result<(), IcedError> {
    let mut lp = a.create_label();
    let mut found = a.create_label();
    let mut missing = a.create_label();
    a.set_label(walk)?;
    a.xor(ecx, ecx)?;
    a.set_label(&mut lp)?;
    a.cmp(ecx, 4096 - 8)?;
    a.ja(missing)?;
    a.movzx(eax, word_ptr(rbx + rcx))?;
    a.cmp(eax, 1)?;
    a.jbe(missing)?;
    a.cmp(eax, edx)?;
    a.je(found)?;
    a.movzx(eax, word_ptr(rbx + rcx + 6))?;
    a.lea(ecx, dword_ptr(rcx + rax + 8))?;
    a.jmp(lp)?;
    a.set_label(&mut found)?;
    a.movzx(eax, word_ptr(rbx + rcx + 4))?;
    a.cmp(eax, 1)?;
    a.jne(missing)?;
    a.movzx(eax, word_ptr(rbx + rcx + 6))?;
    a.shr(eax, 3)?;
    a.cmp(esi, eax)?;
    a.ja(missing)?;
    a.lea(ecx, dword_ptr(rcx + rsi * 8))?;
    a.mov(rax, qword_ptr(rbx + rcx))?;
    a.ret()?;
    a.set_label(&mut missing)?;
    a.mov(rcx, -1i64)?;
    a.ret()?;
    Ok(())
}

fn serial_str(a: &mut CodeAssembler, s: &str) -> Result<(), IcedError> {
    a.mov(dx, layout::SERIAL_PORT as u32)?;
    for b in s.bytes() {
        a.mov(al, b as u32)?;
        a.out(dx, al)?;
    }
    Ok(())
}

/// print_hex(rax): writes rax as 16 hex digits to the serial port; keeps every register but rax,
/// rcx, rdx.
fn emit_print_hex(a: &mut CodeAssembler, label: &mut CodeLabel) -> Result<(), IcedError> {
    let mut lp = a.create_label();
    let mut digit = a.create_label();
    a.set_label(label)?;
    a.push(rbx)?;
    a.mov(rbx, rax)?;
    a.mov(ecx, 16u32)?;
    a.mov(dx, layout::SERIAL_PORT as u32)?;
    a.set_label(&mut lp)?;
    a.rol(rbx, 4)?;
    a.mov(eax, ebx)?;
    a.and(eax, 0xF)?;
    a.add(eax, b'0' as i32)?;
    a.cmp(eax, b'9' as i32)?;
    a.jbe(digit)?;
    a.add(eax, (b'a' - b'9' - 1) as i32)?;
    a.set_label(&mut digit)?;
    a.out(dx, al)?;
    a.dec(ecx)?;
    a.jnz(lp)?;
    a.pop(rbx)?;
    a.ret()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_assemble() {
        let layout = HypercallLayout { hypercall_page: 0x5000, io_pages: 0x10_000 };
        let code = stats_self_check(
            SelfCheck { layout, vp_page_base: 0x40, partition_page: 0x60, cpuids: 100 },
            0x8000,
        )
        .unwrap();
        assert!(code.len() > 200);
        let probe = hypercall_probe(layout, &[ProbeCall::new(0x46, &[], 0)], 0x8000).unwrap();
        assert!(!probe.is_empty());
    }
}
