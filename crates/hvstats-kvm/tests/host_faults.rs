//! The host's page faults on a VP thread (a source added behind the `CounterSource` seam): a
//! guest writing guest RAM nothing touched before makes the host allocate it on the VP thread,
//! one fault per region written, whatever page size backs the RAM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{counts, kvm_available, run_with};
use hvstats_abi::catalog::vp;
use hvstats_guest::Mode;
use hvstats_guest::workload::{FRESH_WRITES_PER_VP, Workload, fresh_ram_end};

/// Each VP's (all faults, major faults) after running `w` on `vps` VPs.
fn faults(w: &Workload, mode: Mode, vps: u32) -> Vec<(u64, u64)> {
    let r = run_with(w, mode, vps, |c| c.memory_bytes = fresh_ram_end(vps));
    (0..vps)
        .map(|i| {
            let page = r.partition.stats().vp_page(i).expect("page");
            (page.get(vp::HOST_PAGE_FAULTS), page.get(vp::HOST_MAJOR_PAGE_FAULTS))
        })
        .collect()
}

#[test]
fn each_fresh_region_a_guest_writes_is_one_host_fault_of_its_vp_thread() {
    if !kvm_available("each_fresh_region_a_guest_writes_is_one_host_fault_of_its_vp_thread") {
        return;
    }
    let vps = 3;
    // VP 2 is asked for more than its regions: the writes past them touch nothing.
    let writes = Workload { fresh_memory: counts(5, 6), exit_status: 1, ..Workload::default() };
    let none = Workload { exit_status: 1, ..Workload::default() };
    assert_eq!(writes.expected(2).fresh_memory, u64::from(FRESH_WRITES_PER_VP));
    for mode in [Mode::Protected, Mode::Long] {
        // The run loop's own faults on a VP thread are a few (its stack, its first allocations),
        // the same in both runs of a pair, but a host busy elsewhere can add one to either run
        // (a signal frame that reaches a new stack page): a pair is measured again, up to three
        // times, and one pair must show every region exactly.
        let mut tries = Vec::new();
        let exact = (0..3).any(|_| {
            let (with, without) = (faults(&writes, mode, vps), faults(&none, mode, vps));
            let exact = (0..vps as usize)
                .all(|i| with[i].0.checked_sub(without[i].0) == Some(writes.expected(i as u32).fresh_memory));
            for i in 0..vps as usize {
                let ctx = format!("{mode:?} VP {i}: {:?} with the writes, {:?} without", with[i], without[i]);
                assert!(without[i].0 <= 8, "{ctx}");
                assert!(with[i].0 >= without[i].0, "{ctx}");
                assert_eq!((with[i].1, without[i].1), (0, 0), "{ctx}: nothing waited for a disk");
            }
            tries.push((with, without));
            exact
        });
        assert!(exact, "{mode:?}: no pair counted every fresh region exactly: {tries:?}");
    }
}
