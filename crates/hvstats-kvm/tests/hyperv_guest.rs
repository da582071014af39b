//! Enlightened guests: they detect Hyper-V, enable the hypercall page, map their own stats pages
//! with HvMapStatsPage and check from the inside that the counters are exact; and every status of
//! the map rules, produced by a real guest.

// Test and bench set-up: a failed step is the run's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use hvstats::Hypervisor;
use hvstats_abi::catalog::{partition as pt, vp};
use hvstats_abi::hypercall::{
    HV_PARTITION_ID_SELF, HV_VP_INDEX_SELF, HypercallCode, HypercallInput, MapStatsPageInput,
    UnmapStatsPageInput,
};
use hvstats_abi::{HvStatus, StatsAreaType, StatsObjectIdentity, StatsObjectType};
use hvstats_guest::hyperv::{
    HypercallLayout, ProbeCall, SelfCheck, hypercall_probe, hypercall_probe_with_faulting_vp,
    stats_self_check,
};
use hvstats_guest::{Mode, layout};
use hvstats_kvm::enlightenment::HyperV;
use hvstats_kvm::{Handlers, Partition, PartitionConfig, RunReport};
use zerocopy::IntoBytes;

const LAYOUT: HypercallLayout = HypercallLayout { hypercall_page: 0x10_0000, io_pages: 0x10_2000 };

fn enlightened(hv: &Arc<Hypervisor>, vps: u32, access_stats: bool) -> Partition {
    let mut config = PartitionConfig {
        vp_count: vps,
        mode: Mode::Long,
        memory_bytes: 4 << 20,
        timeout: Duration::from_secs(60),
        ..Default::default()
    };
    let mut handlers = Handlers::builtin();
    HyperV::new(hv.clone(), access_stats).install(&mut config, &mut handlers);
    Partition::new(hv, config, handlers).expect("partition")
}

fn run(partition: &Partition, code: &[u8]) -> RunReport {
    partition.load(layout::DEFAULT_LOAD_GPA, code).expect("load");
    partition.run(layout::DEFAULT_LOAD_GPA).expect("run")
}

fn serial(report: &RunReport, vp: usize) -> String {
    String::from_utf8_lossy(&report.vps[vp].serial).into_owned()
}

#[test]
fn guest_reads_exact_counters_from_its_own_mapped_pages() {
    if !common::kvm_available("guest_reads_exact_counters_from_its_own_mapped_pages") {
        return;
    }
    let hv = Hypervisor::new().unwrap();
    let partition = enlightened(&hv, 2, true);
    let check = SelfCheck { layout: LAYOUT, vp_page_base: 0x140, partition_page: 0x180, cpuids: 300 };
    let report = run(&partition, &stats_self_check(check, layout::DEFAULT_LOAD_GPA).unwrap());
    for (i, v) in report.vps.iter().enumerate() {
        assert!(v.fault.is_none(), "VP {i}: {:?}", v.fault);
        assert_eq!(v.exit_status, Some(0), "VP {i} failed its self check; serial: {}", serial(&report, i));
        let line = serial(&report, i);
        assert!(line.starts_with(&format!("vp={i:016x} cpuid=")), "{line}");
    }
    // The host sees the same counts the guests checked, and the hypercall classes.
    let stats = partition.stats();
    for i in 0..2u32 {
        let page = stats.vp_page(i).unwrap();
        let maps = if i == 0 { 3 } else { 2 };
        assert_eq!(page.get(vp::HYPERCALLS), maps + 2, "VP {i} hypercalls");
        assert_eq!(page.get(vp::GPA_SPACE_HYPERCALLS), maps, "VP {i} GPA space hypercalls");
        assert_eq!(page.get(vp::OTHER_HYPERCALLS), 1, "VP {i} other hypercalls (GetPartitionId)");
        assert_eq!(page.get(vp::LONG_SPIN_WAIT_HYPERCALLS), 1, "VP {i} long spin waits");
        assert!(page.get(vp::HYPERCALLS_COST) > 0, "VP {i} hypercall time");
    }
    // Five maps and unmaps changed the GPA space; the one write to each overlay was refused.
    assert_eq!(stats.overlay_writes(), 2);
    assert!(stats.page().get(pt::GPA_SPACE_MODIFICATIONS) >= 5);
}

/// A MapStatsPage input block.
fn map_input(kind: StatsObjectType, identity: StatsObjectIdentity, target_gpa_page: u64) -> Vec<u8> {
    MapStatsPageInput { stats_type: kind, padding: 0, identity, target_gpa_page }.as_bytes().to_vec()
}

fn unmap_input(kind: StatsObjectType, identity: StatsObjectIdentity) -> Vec<u8> {
    UnmapStatsPageInput { stats_type: kind, padding: 0, identity }.as_bytes().to_vec()
}

const MAP: u64 = HypercallCode::MAP_STATS_PAGE.0 as u64;
const UNMAP: u64 = HypercallCode::UNMAP_STATS_PAGE.0 as u64;

fn self_vp(vp_index: u32) -> StatsObjectIdentity {
    StatsObjectIdentity::vp(HV_PARTITION_ID_SELF, vp_index, StatsAreaType::SELF)
}

/// Runs `calls` on a one-VP guest and asserts every status came back as expected.
fn probe(partition: &Partition, calls: &[ProbeCall]) {
    let code = hypercall_probe(LAYOUT, calls, layout::DEFAULT_LOAD_GPA).unwrap();
    let report = run(partition, &code);
    let v = &report.vps[0];
    assert!(v.fault.is_none(), "{:?}", v.fault);
    assert_eq!(
        v.exit_status,
        Some(0),
        "call {} returned another status; serial:\n{}",
        v.exit_status.unwrap_or(0).wrapping_sub(100),
        serial(&report, 0)
    );
}

#[test]
fn every_map_rule_status_comes_back_to_a_guest() {
    if !common::kvm_available("every_map_rule_status_comes_back_to_a_guest") {
        return;
    }
    let hv = Hypervisor::new().unwrap();
    let partition = enlightened(&hv, 1, true);
    // Another partition exists; the guest must not be able to tell it from one that does not.
    let other = enlightened(&hv, 1, true);
    let other_id = other.stats().id();
    let vp_page = map_input(StatsObjectType::VP, self_vp(0), 0x140);
    let s = |st: HvStatus| st.0;
    let map =
        |ty, identity, gpa_page, st: HvStatus| ProbeCall::new(MAP, &map_input(ty, identity, gpa_page), st.0);
    let mut misaligned = ProbeCall::new(MAP, &vp_page, s(HvStatus::INVALID_ALIGNMENT));
    misaligned.input_offset = 4;
    let mut crossing = ProbeCall::new(MAP, &vp_page, s(HvStatus::INVALID_ALIGNMENT));
    crossing.input_offset = 4096 - 16;
    let mut bad_padding = MapStatsPageInput {
        stats_type: StatsObjectType::VP,
        padding: 1,
        identity: self_vp(0),
        target_gpa_page: 0x140,
    };
    let padding_bytes = bad_padding.as_bytes().to_vec();
    bad_padding.padding = 0;
    bad_padding.identity.bytes[13] = 1;
    let reserved_identity = bad_padding.as_bytes().to_vec();
    let calls = vec![
        misaligned,
        crossing,
        ProbeCall::new(
            HypercallInput::simple(HypercallCode::MAP_STATS_PAGE).0 | 1 << 27,
            &vp_page,
            s(HvStatus::INVALID_HYPERCALL_INPUT),
        ),
        ProbeCall::new(
            HypercallInput::simple(HypercallCode::MAP_STATS_PAGE).with_rep_count(1).0,
            &vp_page,
            s(HvStatus::INVALID_HYPERCALL_INPUT),
        ),
        ProbeCall::new(
            HypercallInput::simple(HypercallCode::MAP_STATS_PAGE).with_fast(true).0,
            &vp_page,
            s(HvStatus::INVALID_HYPERCALL_INPUT),
        ),
        ProbeCall::new(0x0777, &vp_page, s(HvStatus::INVALID_HYPERCALL_CODE)),
        ProbeCall::new(MAP, &padding_bytes, s(HvStatus::INVALID_PARAMETER)),
        ProbeCall::new(MAP, &reserved_identity, s(HvStatus::INVALID_PARAMETER)),
        map(StatsObjectType(0x77), self_vp(0), 0x140, HvStatus::INVALID_PARAMETER),
        map(
            StatsObjectType::VP,
            StatsObjectIdentity::vp(HV_PARTITION_ID_SELF, 0, StatsAreaType::INTERNAL),
            0x140,
            HvStatus::INVALID_PARAMETER,
        ),
        map(
            StatsObjectType::HYPERVISOR,
            StatsObjectIdentity::hypervisor(StatsAreaType::SELF),
            0x140,
            HvStatus::ACCESS_DENIED,
        ),
        map(
            StatsObjectType::LOGICAL_PROCESSOR,
            StatsObjectIdentity::logical_processor(0, StatsAreaType::SELF),
            0x140,
            HvStatus::ACCESS_DENIED,
        ),
        map(
            StatsObjectType::PARTITION,
            StatsObjectIdentity::partition(other_id, StatsAreaType::SELF),
            0x140,
            HvStatus::ACCESS_DENIED,
        ),
        map(
            StatsObjectType::PARTITION,
            StatsObjectIdentity::partition(0xDEAD_0000, StatsAreaType::SELF),
            0x140,
            HvStatus::ACCESS_DENIED,
        ),
        map(
            StatsObjectType::VP,
            StatsObjectIdentity::vp(HV_PARTITION_ID_SELF, 0, StatsAreaType::PARENT),
            0x140,
            HvStatus::ACCESS_DENIED,
        ),
        map(StatsObjectType::VP, self_vp(7), 0x140, HvStatus::INVALID_VP_INDEX),
        ProbeCall::new(
            UNMAP,
            &unmap_input(StatsObjectType::VP, self_vp(HV_VP_INDEX_SELF)),
            s(HvStatus::INVALID_PARAMETER),
        ),
        ProbeCall::new(MAP, &vp_page, s(HvStatus::SUCCESS)),
        map(StatsObjectType::VP, self_vp(HV_VP_INDEX_SELF), 0x141, HvStatus::OPERATION_DENIED),
        // Beyond the GPA space: success, nothing accessible.
        map(
            StatsObjectType::PARTITION,
            StatsObjectIdentity::partition(HV_PARTITION_ID_SELF, StatsAreaType::SELF),
            1 << 24,
            HvStatus::SUCCESS,
        ),
        ProbeCall::new(UNMAP, &unmap_input(StatsObjectType::VP, self_vp(0)), s(HvStatus::SUCCESS)),
        ProbeCall::new(
            UNMAP,
            &unmap_input(
                StatsObjectType::PARTITION,
                StatsObjectIdentity::partition(HV_PARTITION_ID_SELF, StatsAreaType::SELF),
            ),
            s(HvStatus::SUCCESS),
        ),
    ];
    probe(&partition, &calls);
    let page = partition.stats().vp_page(0).unwrap();
    assert_eq!(page.get(vp::HYPERCALLS), calls.len() as u64);
    // Each call answered with another status than success is a failed hypercall (none retried).
    let failed = calls.iter().filter(|c| c.expect != HvStatus::SUCCESS.0).count() as u64;
    assert!(failed > 0 && failed < calls.len() as u64);
    assert_eq!(page.get(vp::FAILED_HYPERCALLS), failed);
}

#[test]
fn a_guest_without_access_stats_is_denied() {
    if !common::kvm_available("a_guest_without_access_stats_is_denied") {
        return;
    }
    let hv = Hypervisor::new().unwrap();
    let partition = enlightened(&hv, 1, false);
    probe(
        &partition,
        &[ProbeCall::new(MAP, &map_input(StatsObjectType::VP, self_vp(0), 0x140), HvStatus::ACCESS_DENIED.0)],
    );
}

#[test]
fn the_stats_page_quota_runs_out() {
    if !common::kvm_available("the_stats_page_quota_runs_out") {
        return;
    }
    let hv = Hypervisor::new().unwrap();
    let partition = enlightened(&hv, 1, true);
    partition.stats().set_stats_page_quota(1);
    let own = StatsObjectIdentity::partition(HV_PARTITION_ID_SELF, StatsAreaType::SELF);
    probe(
        &partition,
        &[
            ProbeCall::new(MAP, &map_input(StatsObjectType::VP, self_vp(0), 0x140), HvStatus::SUCCESS.0),
            ProbeCall::new(
                MAP,
                &map_input(StatsObjectType::PARTITION, own, 0x141),
                HvStatus::INSUFFICIENT_MEMORY.0,
            ),
        ],
    );
}

#[test]
fn a_partition_with_a_faulted_vp_is_not_active() {
    if !common::kvm_available("a_partition_with_a_faulted_vp_is_not_active") {
        return;
    }
    let hv = Hypervisor::new().unwrap();
    let partition = enlightened(&hv, 2, true);
    let vp1 = StatsObjectIdentity::vp(HV_PARTITION_ID_SELF, HV_VP_INDEX_SELF, StatsAreaType::SELF);
    let mut wait =
        ProbeCall::new(MAP, &map_input(StatsObjectType::VP, vp1, 0x150), HvStatus::INVALID_PARTITION_STATE.0);
    wait.retries = 1_000_000;
    let code = hypercall_probe_with_faulting_vp(LAYOUT, &[wait], 0, layout::DEFAULT_LOAD_GPA).unwrap();
    let report = run(&partition, &code);
    assert!(report.vps[0].fault.is_some(), "VP 0 was to fault");
    assert_eq!(report.vps[1].exit_status, Some(0), "VP 1 serial: {}", serial(&report, 1));
    assert!(!partition.stats().is_active());
}
