//! CPU mode set-up: the tables the VMM writes into guest RAM and the register state a VP starts
//! with, for real, protected (32-bit flat) and long (64-bit, identity-mapped) mode.

use hvstats_abi::boot::{self as layout, Mode};
use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};

use crate::error::Error;
use crate::memory::GuestRam;

const CR0_PE: u64 = 1;
const CR0_ET: u64 = 1 << 4;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
/// EFER.LMA: long mode active.
pub(crate) const EFER_LMA: u64 = 1 << 10;
/// Present, writable.
const PTE_PW: u64 = 0x3;
/// Present, writable, 2 MiB page.
const PDE_2M: u64 = 0x83;
/// The identity map covers the low 4 GiB (RAM and the APIC page at 0xFEE00000).
const MAPPED_GIB: u64 = 4;

fn gdt_entry(flags: u64) -> u64 {
    // base 0, limit 0xFFFFF (with G: 4 GiB), access/flags as given.
    0xFFFF | (0xF << 48) | flags
}

/// Writes the GDT (and for long mode the page tables) that `mode` needs.
///
/// # Errors
/// When RAM is too small to hold the tables.
pub(crate) fn write_tables(ram: &GuestRam, mode: Mode) -> Result<(), Error> {
    let code = match mode {
        Mode::Real => return Ok(()),
        // P, DPL 0, code exec/read, D (32-bit), G.
        Mode::Protected => gdt_entry(0x9B << 40 | 0xC << 52),
        // P, DPL 0, code exec/read, L (64-bit), G.
        Mode::Long => gdt_entry(0x9B << 40 | 0xA << 52),
    };
    let data = gdt_entry(0x93 << 40 | 0xC << 52);
    ram.write_u64(layout::GDT_BASE, 0)?;
    ram.write_u64(layout::GDT_BASE + layout::CODE_SELECTOR as u64, code)?;
    ram.write_u64(layout::GDT_BASE + layout::DATA_SELECTOR as u64, data)?;
    if mode == Mode::Long {
        let pml4 = layout::PAGE_TABLES_BASE;
        let pdpt = pml4 + 0x1000;
        let pd = pdpt + 0x1000;
        ram.write_u64(pml4, pdpt | PTE_PW)?;
        for g in 0..MAPPED_GIB {
            ram.write_u64(pdpt + g * 8, (pd + g * 0x1000) | PTE_PW)?;
            for e in 0..512 {
                let gpa = (g << 30) | (e << 21);
                ram.write_u64(pd + g * 0x1000 + e * 8, gpa | PDE_2M)?;
            }
        }
    }
    Ok(())
}

fn segment(selector: u16, code: bool, long: bool) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xFFFF_FFFF,
        selector,
        type_: if code { 0xB } else { 0x3 },
        present: 1,
        dpl: 0,
        db: if long && code { 0 } else { 1 },
        s: 1,
        l: if long && code { 1 } else { 0 },
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

fn real_segment(base: u64) -> kvm_segment {
    kvm_segment {
        base,
        limit: 0xFFFF,
        selector: (base >> 4) as u16,
        type_: 0x3,
        present: 1,
        dpl: 0,
        db: 0,
        s: 1,
        l: 0,
        g: 0,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// The stack top of VP `index`.
pub fn stack_top(index: u32) -> u64 {
    layout::stack_top(index)
}

/// Sets `sregs` and builds the registers VP `index` of `count` starts with at `entry`.
pub(crate) fn initial_state(
    mode: Mode,
    sregs: &mut kvm_sregs,
    entry: u64,
    index: u32,
    count: u32,
) -> kvm_regs {
    let mut regs = kvm_regs { rflags: 2, rdi: index as u64, rsi: count as u64, ..Default::default() };
    let top = stack_top(index);
    match mode {
        Mode::Real => {
            let cs_base = Mode::real_mode_segment_base(entry);
            let mut cs = real_segment(cs_base);
            cs.type_ = 0xB;
            sregs.cs = cs;
            sregs.ds = real_segment(cs_base);
            sregs.es = real_segment(cs_base);
            sregs.fs = real_segment(cs_base);
            sregs.gs = real_segment(cs_base);
            sregs.ss = real_segment(top - layout::STACK_SIZE);
            sregs.cr0 = CR0_ET;
            sregs.cr4 = 0;
            sregs.efer = 0;
            regs.rip = entry - cs_base;
            regs.rsp = layout::STACK_SIZE;
        }
        Mode::Protected | Mode::Long => {
            let long = mode == Mode::Long;
            sregs.cs = segment(layout::CODE_SELECTOR, true, long);
            let data = segment(layout::DATA_SELECTOR, false, long);
            sregs.ds = data;
            sregs.es = data;
            sregs.fs = data;
            sregs.gs = data;
            sregs.ss = data;
            sregs.gdt.base = layout::GDT_BASE;
            sregs.gdt.limit = 3 * 8 - 1;
            sregs.idt.base = layout::IDT_BASE;
            sregs.idt.limit = layout::IDT_LIMIT;
            if long {
                sregs.cr3 = layout::PAGE_TABLES_BASE;
                sregs.cr4 = CR4_PAE;
                sregs.cr0 = CR0_PE | CR0_ET | CR0_PG;
                sregs.efer = EFER_LME | EFER_LMA;
            } else {
                sregs.cr0 = CR0_PE | CR0_ET;
                sregs.cr4 = 0;
                sregs.efer = 0;
            }
            regs.rip = entry;
            regs.rsp = top;
        }
    }
    regs
}
