//! The stats hypercall dispatcher's contract, checked on arbitrary call sequences.
//!
//! This function is the body of the `hypercall_dispatch` fuzz target and of the workspace test
//! that runs it on random byte strings. The bytes become a sequence of hypercalls made by a guest
//! VP (with or without its privileges) or by the root, with arbitrary input values and GPAs and
//! with input blocks that are either raw bytes or nearly valid map/unmap requests, against fake
//! guest RAM and a fake overlay hook. Whatever the sequence, dispatch must never panic, and:
//! - a guest only ever sees its own partition's and VPs' pages, each at most once, and only with
//!   AccessStats;
//! - the overlays installed are exactly the accessible mappings the bookkeeping records, never two
//!   at one GPA page, and an overlay is removed only if it was installed;
//! - "GPA space modifications" counts exactly the guest's successful maps and unmaps;
//! - the only RAM a call writes is a successful GetPartitionId's 8-byte output, which is never
//!   under one of the caller's overlays.

use std::collections::BTreeMap;
use std::sync::Arc;

use hvstats::hypercall::{CallerContext, GuestMemory, NotRam, OverlayError, StatsOverlays, dispatch};
use hvstats::{Hypervisor, InstanceConfig, PartitionStats, SharedPage};
use hvstats_abi::catalog::partition;
use hvstats_abi::hypercall::{
    HV_PARTITION_ID_SELF, HV_VP_INDEX_SELF, HypercallCode, HypercallInput, MapStatsPageInput,
    PartitionPrivileges,
};
use hvstats_abi::{HvStatus, StatsAreaType, StatsObjectIdentity, StatsObjectType};
use zerocopy::IntoBytes;

use crate::bytes::Bytes;

const PAGE: u64 = 4096;
const RAM_PAGES: u64 = 8;
const GPA_SPACE_PAGES: u64 = 16;

struct Ram(Vec<u8>);

impl GuestMemory for Ram {
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), NotRam> {
        let start = usize::try_from(gpa).map_err(|_| NotRam { gpa })?;
        let end = start.checked_add(buf.len()).ok_or(NotRam { gpa })?;
        buf.copy_from_slice(self.0.get(start..end).ok_or(NotRam { gpa })?);
        Ok(())
    }

    fn write(&mut self, gpa: u64, data: &[u8]) -> Result<(), NotRam> {
        let start = usize::try_from(gpa).map_err(|_| NotRam { gpa })?;
        let end = start.checked_add(data.len()).ok_or(NotRam { gpa })?;
        self.0.get_mut(start..end).ok_or(NotRam { gpa })?.copy_from_slice(data);
        Ok(())
    }

    fn is_ram(&self, gpa: u64) -> bool {
        gpa < self.0.len() as u64
    }
}

/// The overlays installed, by GPA page, with the host address of the page shown there.
#[derive(Default)]
struct Overlays {
    installed: BTreeMap<u64, usize>,
    fail_next: bool,
}

impl StatsOverlays for Overlays {
    fn map_overlay(&mut self, gpa_page: u64, page: &SharedPage) -> Result<(), OverlayError> {
        if std::mem::take(&mut self.fail_next) {
            return Err(OverlayError { gpa_page, source: std::io::Error::other("no slot") });
        }
        let previous = self.installed.insert(gpa_page, page.host_address() as usize);
        assert!(previous.is_none(), "two overlays at GPA page {gpa_page:#x}");
        Ok(())
    }

    fn unmap_overlay(&mut self, gpa_page: u64) -> Result<(), OverlayError> {
        assert!(self.installed.remove(&gpa_page).is_some(), "unmap of GPA page {gpa_page:#x}, never mapped");
        Ok(())
    }
}

/// A GPA: usually one of the interesting ones (RAM, its edges, the hole, misaligned), else raw.
fn gpa(b: &mut Bytes<'_>) -> u64 {
    match b.u8() % 8 {
        0 => 0,
        1 => PAGE,
        2 => 2 * PAGE + 8 * u64::from(b.u8() % 16),
        3 => RAM_PAGES * PAGE - 8,
        4 => RAM_PAGES * PAGE,
        5 => u64::from(b.u8() % 32) * PAGE + u64::from(b.u8()),
        6 => u64::MAX - 7,
        _ => b.u64(),
    }
}

/// A stats object request: mostly the guest's own objects, sometimes others' or garbage.
fn request(b: &mut Bytes<'_>, guest: u64, other: u64) -> MapStatsPageInput {
    let area = StatsAreaType(b.u8() % 4);
    let partition_id = match b.u8() % 4 {
        0 => guest,
        1 => HV_PARTITION_ID_SELF,
        2 => other,
        _ => b.u64(),
    };
    let vp_index = match b.u8() % 4 {
        0 => 0,
        1 => 1,
        2 => HV_VP_INDEX_SELF,
        _ => u32::from(b.u8()),
    };
    let (stats_type, identity) = match b.u8() % 5 {
        0 => (StatsObjectType::VP, StatsObjectIdentity::vp(partition_id, vp_index, area)),
        1 => (StatsObjectType::PARTITION, StatsObjectIdentity::partition(partition_id, area)),
        2 => (StatsObjectType::HYPERVISOR, StatsObjectIdentity::hypervisor(area)),
        3 => (StatsObjectType::LOGICAL_PROCESSOR, StatsObjectIdentity::logical_processor(vp_index, area)),
        _ => (StatsObjectType(b.u8().into()), StatsObjectIdentity::vp(partition_id, vp_index, area)),
    };
    let padding = if b.u8().is_multiple_of(16) { 1 } else { 0 };
    MapStatsPageInput { stats_type, padding, identity, target_gpa_page: u64::from(b.u8() % 24) }
}

/// Runs the calls `data` describes and checks the contract (module documentation).
///
/// Returns how many calls succeeded, for callers that count outcomes.
pub fn check(data: &[u8]) -> usize {
    let hv = Hypervisor::with_config(InstanceConfig {
        logical_processors: Some(vec![0, 1]),
        ..Default::default()
    })
    .expect("an instance without publication");
    let guest = hv.create_partition(2).expect("a partition");
    guest.set_ram_pages(RAM_PAGES);
    let other = hv.create_partition(1).expect("another partition");
    let own_pages: Vec<usize> = std::iter::once(guest.page().host_address() as usize)
        .chain((0..2).filter_map(|i| guest.vp_page(i)).map(|p| p.host_address() as usize))
        .collect();
    let mut ram = Ram(vec![0; (RAM_PAGES * PAGE) as usize]);
    let mut overlays = Overlays::default();
    let mut root_overlays = Overlays::default();
    let mut b = Bytes(data);
    let mut modifications = 0u64;
    let mut successes = 0;
    for _ in 0..64 {
        if b.is_empty() {
            break;
        }
        let op = b.u8();
        let code = match op % 8 {
            0 | 1 => HypercallCode::MAP_STATS_PAGE,
            2 => HypercallCode::MAP_STATS_PAGE2,
            3 | 4 => HypercallCode::UNMAP_STATS_PAGE,
            5 => HypercallCode::GET_PARTITION_ID,
            6 => HypercallCode::NOTIFY_LONG_SPIN_WAIT,
            _ => HypercallCode(u16::from(b.u8()) | u16::from(b.u8()) << 8),
        };
        let mut input = HypercallInput::simple(code);
        match b.u8() % 16 {
            0 => input = input.with_fast(true),
            1 => input = HypercallInput(b.u64()),
            2 => input = input.with_rep_count(1),
            _ => {}
        }
        let input_gpa = gpa(&mut b);
        let output_gpa = gpa(&mut b);
        // The input block: a near-valid request or raw bytes, where it fits in RAM.
        let block = request(&mut b, guest.id(), other.id());
        let mut bytes = [0u8; 32];
        if b.u8() % 4 == 0 {
            bytes.iter_mut().for_each(|x| *x = b.u8());
        } else {
            bytes.copy_from_slice(block.as_bytes());
        }
        let _ = ram.write(input_gpa, &bytes);
        let flags = b.u8();
        overlays.fail_next = flags & 0x10 != 0;
        if flags & 0x20 != 0 && flags & 0x40 != 0 {
            guest.set_active(false);
        }
        let before = ram.0.clone();
        let privileges = PartitionPrivileges(
            if flags & 1 == 0 { PartitionPrivileges::ACCESS_STATS } else { 0 }
                | if flags & 2 == 0 { PartitionPrivileges::ACCESS_PARTITION_ID } else { 0 },
        );
        let root = flags & 0x80 != 0;
        let status = if root {
            let ctx = CallerContext::root(&hv);
            dispatch(&ctx, input, input_gpa, output_gpa, &mut ram, &mut root_overlays).status()
        } else {
            let vp = u32::from(flags >> 2 & 1);
            let ctx = CallerContext::guest(&hv, guest.id(), vp, privileges, GPA_SPACE_PAGES);
            dispatch(&ctx, input, input_gpa, output_gpa, &mut ram, &mut overlays).status()
        };
        assert!(HvStatus::KNOWN.contains(&status), "{status:?} is not a documented status");
        let success = status == HvStatus::SUCCESS;
        successes += usize::from(success);
        let is_map_or_unmap = matches!(
            input.code(),
            HypercallCode::MAP_STATS_PAGE | HypercallCode::MAP_STATS_PAGE2 | HypercallCode::UNMAP_STATS_PAGE
        );
        if success && !root && is_map_or_unmap {
            modifications += 1;
            assert!(privileges.access_stats(), "a map or unmap without AccessStats succeeded");
        }
        // Only a successful GetPartitionId writes RAM: 8 bytes at its output GPA, visible RAM.
        if ram.0 != before {
            let differs = |i: &usize| ram.0[*i] != before[*i];
            let first = (0..ram.0.len()).find(differs).unwrap_or(0);
            let last = (0..ram.0.len()).rfind(differs).unwrap_or(0);
            assert!(success && input.code() == HypercallCode::GET_PARTITION_ID, "{code:?} wrote RAM");
            assert!(first as u64 >= output_gpa && last as u64 <= output_gpa + 7, "wrote outside its output");
            let under = if root { &root_overlays } else { &overlays };
            assert!(!under.installed.contains_key(&(output_gpa / PAGE)), "wrote RAM under an overlay");
        }
        check_guest(&guest, &overlays, &own_pages, modifications);
    }
    drop(other);
    successes
}

/// The guest's overlays against its bookkeeping and counters.
fn check_guest(guest: &Arc<PartitionStats>, overlays: &Overlays, own_pages: &[usize], modifications: u64) {
    let space = guest.gpa_space();
    let accessible: Vec<u64> =
        space.mappings().iter().filter(|(_, m)| m.accessible).map(|(_, m)| m.gpa_page).collect();
    let installed: Vec<u64> = overlays.installed.keys().copied().collect();
    let mut sorted = accessible.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, installed, "overlays installed and accessible mappings differ");
    for (gpa_page, address) in &overlays.installed {
        assert!(*gpa_page < GPA_SPACE_PAGES, "an overlay outside the GPA space");
        assert!(own_pages.contains(address), "the guest sees a page that is not its own");
    }
    let shown: std::collections::BTreeSet<usize> = overlays.installed.values().copied().collect();
    assert_eq!(shown.len(), overlays.installed.len(), "one page shown twice");
    drop(space);
    assert_eq!(guest.page().get(partition::GPA_SPACE_MODIFICATIONS), modifications);
}
