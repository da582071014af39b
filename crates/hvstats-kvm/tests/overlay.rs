//! Read-only overlay pages in the GPA map: a guest reads the page, its writes do not reach it, and
//! removing the overlay restores RAM.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::kvm_available;
use hvstats::{Hypervisor, SharedPage};
use hvstats_abi::ObjectKind;
use hvstats_abi::catalog::{partition as pt, vp};
use hvstats_guest::{Mode, Program, layout};
use hvstats_kvm::{Handlers, Partition, PartitionConfig, StatsPageOverlay};
use iced_x86::code_asm::*;

const OVERLAY_GPA: u64 = 0x4_0000;
const OUTSIDE_GPA: u64 = 0x1000_0000;
/// A VP counter no source writes on KVM (it is not maintained), so a planted value stays.
const COUNTER: hvstats_abi::CounterId = vp::SMALL_PAGE_TLB_FILLS;

#[test]
fn a_guest_reads_an_overlay_and_cannot_write_it() {
    if !kvm_available("a_guest_reads_an_overlay_and_cannot_write_it") {
        return;
    }
    let counter = OVERLAY_GPA + COUNTER.offset() as u64;
    let outside = OUTSIDE_GPA + COUNTER.offset() as u64;
    let mut p = Program::new(Mode::Long, layout::DEFAULT_LOAD_GPA).unwrap();
    let mut bad = p.asm().create_label();
    {
        let a = p.asm();
        a.mov(ebx, counter as u32).unwrap();
        a.mov(eax, dword_ptr(rbx)).unwrap();
        a.mov(dword_ptr(rbx), 0xDEADu32).unwrap();
        a.mov(ecx, dword_ptr(rbx)).unwrap();
        a.cmp(eax, ecx).unwrap();
        a.jne(bad).unwrap();
        // The same page mapped a second time, outside RAM.
        a.mov(ebx, outside as u32).unwrap();
        a.mov(ecx, dword_ptr(rbx)).unwrap();
        a.cmp(eax, ecx).unwrap();
        a.jne(bad).unwrap();
        a.mov(esi, eax).unwrap();
    }
    p.asm().mov(edx, layout::EXIT_PORT as u32).unwrap();
    p.asm().mov(eax, esi).unwrap();
    p.asm().out(dx, eax).unwrap();
    p.asm().set_label(&mut bad).unwrap();
    p.exit(0xBAD).unwrap();
    let image = p.finish().unwrap();

    let hv = Hypervisor::new().unwrap();
    let config = PartitionConfig { timeout: Duration::from_secs(20), ..Default::default() };
    let partition = Partition::new(&hv, config, Handlers::builtin()).unwrap();
    partition.load(image.load_gpa, &image.bytes).unwrap();
    let ram_pages = (2 << 20) / 4096;
    let ppage = partition.stats().page();
    // The authority's counters: RAM pages, and setting up RAM as the first GPA space change.
    assert_eq!(ppage.get(pt::GPA_PAGES), ram_pages);
    assert_eq!(ppage.get(pt::GPA_SPACE_MODIFICATIONS), 1);
    assert_eq!(partition.memory_slots(), 1);
    assert_eq!(partition.memory_slot_changes(), 1);

    // VP 0's own stats page, as the guest would map it; the run loop merges into it at the end,
    // so the value is planted in a counter nothing in this guest touches.
    let overlay = StatsPageOverlay::vp(partition.stats().clone(), 0).unwrap();
    assert!(StatsPageOverlay::vp(partition.stats().clone(), 1).is_none());
    let page = partition.stats().vp_page(0).unwrap();
    page.set(COUNTER, 0x1234);
    partition.add_overlay(OVERLAY_GPA / 4096, Arc::new(overlay.clone())).unwrap();
    assert!(partition.add_overlay(OVERLAY_GPA / 4096, Arc::new(overlay.clone())).is_err(), "mapped twice");
    partition.add_overlay(OUTSIDE_GPA / 4096, Arc::new(overlay)).unwrap();
    // RAM split around the overlay: before, overlay, after; and the page outside RAM.
    assert_eq!(partition.memory_slots(), 4);
    // The overlay hides one RAM page; the outside one adds a page.
    assert_eq!(partition.mapped_pages(), ram_pages + 1);
    // One RAM slot deleted, three created, one more created.
    assert_eq!(partition.memory_slot_changes(), 1 + 4 + 1);

    let report = partition.run(image.entry).unwrap();
    let outcome = &report.vps[0];
    assert!(outcome.fault.is_none(), "{:?}", outcome.fault);
    assert_eq!(outcome.exit_status, Some(0x1234), "the guest read the overlay and its write did not land");
    assert_eq!(page.get(COUNTER), 0x1234);
    // The refused write reached userspace as an MMIO exit.
    let vp_page = partition.stats().vp_page(0).unwrap();
    assert_eq!(vp_page.get(vp::MEMORY_INTERCEPT_MESSAGES), 1);

    partition.remove_overlay(OVERLAY_GPA / 4096).unwrap();
    partition.remove_overlay(OUTSIDE_GPA / 4096).unwrap();
    assert!(partition.remove_overlay(OUTSIDE_GPA / 4096).is_err(), "removed twice");
    assert_eq!(partition.memory_slots(), 1);
    assert_eq!(partition.mapped_pages(), ram_pages);
    assert_eq!(partition.memory_slot_changes(), 6 + 4 + 1);
}

#[test]
fn overlays_change_while_vps_run_without_faults() {
    if !kvm_available("overlays_change_while_vps_run_without_faults") {
        return;
    }
    use hvstats_guest::Workload;
    use hvstats_guest::program::LoopCount;
    let w = Workload { cpuid: LoopCount::per_vp(3000, 1000), ..Workload::default() };
    let image = w.build(Mode::Long, layout::DEFAULT_LOAD_GPA).unwrap();
    let hv = Hypervisor::new().unwrap();
    let config = PartitionConfig { vp_count: 2, timeout: Duration::from_secs(60), ..Default::default() };
    let partition = Partition::new(&hv, config, Handlers::builtin()).unwrap();
    partition.load(image.load_gpa, &image.bytes).unwrap();
    let page = Arc::new(SharedPage::anonymous(ObjectKind::Vp).unwrap());
    let done = std::sync::atomic::AtomicBool::new(false);
    let (report, changes) = std::thread::scope(|s| {
        let changer = s.spawn(|| {
            let mut changes = 0;
            // At least one change whenever this thread first runs, however fast the guest ends.
            while changes < 2 || (!done.load(std::sync::atomic::Ordering::SeqCst) && changes < 400) {
                partition.add_overlay(OVERLAY_GPA / 4096, page.clone()).unwrap();
                partition.remove_overlay(OVERLAY_GPA / 4096).unwrap();
                changes += 2;
            }
            changes
        });
        let report = partition.run(image.entry).unwrap();
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        (report, changer.join().unwrap())
    });
    assert!(changes > 0);
    for vp in &report.vps {
        assert!(vp.fault.is_none(), "VP {}: {:?} after {changes} overlay changes", vp.index, vp.fault);
        let page = partition.stats().vp_page(vp.index).unwrap();
        assert_eq!(page.get(vp::CPUID_INSTRUCTIONS), w.expected(vp.index).cpuid);
    }
    assert_eq!(partition.memory_slots(), 1);
}
