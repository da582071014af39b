//! Dispatch of the stats hypercalls, independent of any backend.
//!
//! The backend traps a hypercall and hands [`dispatch`] the input value and the two GPAs, with
//! access to guest RAM ([`GuestMemory`]) and a hook that makes a stats page appear read-only at a
//! GPA page or disappear ([`StatsOverlays`]). Dispatch applies the rules (alignment, input value,
//! call code, then [`crate::rules`]), keeps the caller's GPA-space bookkeeping and the partition's
//! GPA counters, and returns the result value for RAX. It does not count the hypercall itself:
//! the backend's run loop counts Hypercalls/sec, their cost and their class.
//!
//! Calls: HvCallMapStatsPage (0x006C) and HvCallMapStatsPage2 (0x0131) with the 32-byte input of
//! seed 003 (TargetGpaPage at offset 24); HvCallUnmapStatsPage (0x006D, 24 bytes);
//! HvCallGetPartitionId (0x0046, a u64 written at the output GPA; needs AccessPartitionId); HvCallNotifyLongSpinWait
//! (0x0008, success and nothing else; memory or fast form).
//!
//! Choices where the TLFS is silent:
//! - Rule 1 (alignment) applies to the memory form only; with the fast bit the GPAs are data. For
//!   an unknown call code only the input GPA's 8-byte alignment is checked.
//! - An input block (or the GetPartitionId output) not in guest RAM → `INVALID_PARAMETER`.
//! - An output block on a GPA page where the caller has a stats page mapped → `ACCESS_DENIED`,
//!   nothing written: the overlay is read-only to the guest, and writing the RAM it hides would
//!   put the output where the guest cannot see it.
//! - A target GPA page beyond the caller's GPA space: `SUCCESS`, the mapping is recorded (so it
//!   counts against the quota and can be unmapped) and the overlay hook is not called.
//! - A target GPA page already showing another stats page → `INVALID_PARAMETER`.
//! - The backend failing to install an overlay → `INSUFFICIENT_MEMORY` (nothing recorded); failing
//!   to remove one → `OPERATION_DENIED` (the mapping stays).
//! - Unmapping an object not mapped → `INVALID_PARAMETER`.
//! - Every successful map and unmap by a guest adds one to its partition's "GPA space
//!   modifications/sec"; "GPA pages" counts RAM plus visible overlays lying outside RAM.
//! - The root's partition id is [`ROOT_PARTITION_ID`]; the root has no partition or VP object of
//!   its own, so SELF ids from the root name nothing (`INVALID_PARTITION_ID`).

use hvstats_abi::catalog::partition;
use hvstats_abi::hypercall::{
    GetPartitionIdOutput, HypercallCode, HypercallInput, HypercallOutput, MapStatsPageInput,
    PartitionPrivileges, UnmapStatsPageInput,
};
use hvstats_abi::{HvError, HvResult, HvStatus, PAGE_SIZE};
use zerocopy::{FromBytes, IntoBytes};

use crate::gpa_space::{GpaSpace, OverlayMapping};
use crate::instance::Hypervisor;
use crate::page::SharedPage;
use crate::rules::{self, ObjectKey, Requester};

pub use crate::rules::ROOT_PARTITION_ID;

/// A GPA that is not guest RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("GPA {gpa:#x} is not guest RAM")]
pub struct NotRam {
    /// The first GPA of the access that is not RAM.
    pub gpa: u64,
}

/// Guest RAM as the hypercall handler reads and writes it.
pub trait GuestMemory {
    /// Reads `buf.len()` bytes at `gpa`.
    ///
    /// # Errors
    /// [`NotRam`] when any byte of the range is not guest RAM.
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), NotRam>;

    /// Writes `data` at `gpa`.
    ///
    /// # Errors
    /// [`NotRam`] when any byte of the range is not guest RAM.
    fn write(&mut self, gpa: u64, data: &[u8]) -> Result<(), NotRam>;

    /// True when the page holding `gpa` is guest RAM.
    fn is_ram(&self, gpa: u64) -> bool;
}

/// The backend failed to install or remove an overlay.
#[derive(Debug, thiserror::Error)]
#[error("stats overlay at GPA page {gpa_page:#x}")]
pub struct OverlayError {
    /// The GPA page number (GPA >> 12) of the overlay, as the caller asked for it.
    pub gpa_page: u64,
    /// The backend's error installing or removing the overlay.
    #[source]
    pub source: std::io::Error,
}

/// The backend's hook for stats overlays in the caller's GPA space.
///
/// [`dispatch`] calls it with the caller's GPA-space bookkeeping locked, so the calls for one
/// partition never overlap. [`crate::gpa_space::ram_pieces`] gives the RAM left visible around
/// the overlays, for a backend whose memory slots cannot overlap.
pub trait StatsOverlays {
    /// Makes `page` appear read-only at GPA page `gpa_page` (over RAM or outside it), hiding what
    /// lies beneath until [`unmap_overlay`](Self::unmap_overlay).
    ///
    /// # Errors
    /// When the backend cannot install it.
    fn map_overlay(&mut self, gpa_page: u64, page: &SharedPage) -> Result<(), OverlayError>;

    /// Removes the overlay at `gpa_page`; RAM beneath, if any, reappears intact.
    ///
    /// # Errors
    /// When the backend cannot remove it.
    fn unmap_overlay(&mut self, gpa_page: u64) -> Result<(), OverlayError>;
}

/// Who makes a hypercall, and what they may do.
#[derive(Clone, Copy, Debug)]
pub struct CallerContext<'a> {
    /// The hypervisor instance whose objects the call reads and maps.
    pub hypervisor: &'a Hypervisor,
    /// The root, or a guest partition's VP.
    pub caller: Requester,
    /// The caller's privileges (AccessStats is checked).
    pub privileges: PartitionPrivileges,
    /// Size of the caller's GPA space, in pages: overlays at or past it are not accessible.
    pub gpa_space_pages: u64,
}

impl<'a> CallerContext<'a> {
    /// VP `vp_index` of guest partition `partition_id`.
    pub fn guest(
        hypervisor: &'a Hypervisor,
        partition_id: u64,
        vp_index: u32,
        privileges: PartitionPrivileges,
        gpa_space_pages: u64,
    ) -> Self {
        Self { hypervisor, caller: Requester::Guest { partition_id, vp_index }, privileges, gpa_space_pages }
    }

    /// The root partition (the process owning `hypervisor`), with AccessStats and a GPA space
    /// covering every page number.
    pub fn root(hypervisor: &'a Hypervisor) -> Self {
        Self {
            hypervisor,
            caller: Requester::Root,
            privileges: PartitionPrivileges(
                PartitionPrivileges::ACCESS_STATS | PartitionPrivileges::ACCESS_PARTITION_ID,
            ),
            gpa_space_pages: u64::MAX,
        }
    }
}

/// The calls dispatch knows, with the sizes of their memory blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    MapStatsPage,
    UnmapStatsPage,
    GetPartitionId,
    NotifyLongSpinWait,
}

impl Call {
    fn of(code: HypercallCode) -> Option<Self> {
        match code {
            HypercallCode::MAP_STATS_PAGE | HypercallCode::MAP_STATS_PAGE2 => Some(Call::MapStatsPage),
            HypercallCode::UNMAP_STATS_PAGE => Some(Call::UnmapStatsPage),
            HypercallCode::GET_PARTITION_ID => Some(Call::GetPartitionId),
            HypercallCode::NOTIFY_LONG_SPIN_WAIT => Some(Call::NotifyLongSpinWait),
            _ => None,
        }
    }

    fn input_size(self) -> u64 {
        match self {
            Call::MapStatsPage => size_of::<MapStatsPageInput>() as u64,
            Call::UnmapStatsPage => size_of::<UnmapStatsPageInput>() as u64,
            Call::GetPartitionId => 0,
            Call::NotifyLongSpinWait => 8,
        }
    }

    fn output_size(self) -> u64 {
        match self {
            Call::GetPartitionId => size_of::<GetPartitionIdOutput>() as u64,
            _ => 0,
        }
    }

    fn allows_fast(self) -> bool {
        self == Call::NotifyLongSpinWait
    }
}

/// Handles one hypercall from `ctx`'s caller and returns the value for RAX.
///
/// `input_gpa` and `output_gpa` are RDX and R8. `mem` is the caller's RAM; `overlays` installs
/// and removes stats pages in the caller's GPA space. See the module documentation for the rules
/// and their order.
pub fn dispatch(
    ctx: &CallerContext<'_>,
    input: HypercallInput,
    input_gpa: u64,
    output_gpa: u64,
    mem: &mut dyn GuestMemory,
    overlays: &mut dyn StatsOverlays,
) -> HypercallOutput {
    let status = match run(ctx, input, input_gpa, output_gpa, mem, overlays) {
        Ok(()) => HvStatus::SUCCESS,
        Err(e) => e.status(),
    };
    HypercallOutput::new(status, 0)
}

fn run(
    ctx: &CallerContext<'_>,
    input: HypercallInput,
    input_gpa: u64,
    output_gpa: u64,
    mem: &mut dyn GuestMemory,
    overlays: &mut dyn StatsOverlays,
) -> HvResult<()> {
    let call = Call::of(input.code());
    // Rule 1.
    if !input.fast() {
        match call {
            Some(call) => {
                check_block(input_gpa, call.input_size())?;
                check_block(output_gpa, call.output_size())?;
            }
            None => check_block(input_gpa, 8)?,
        }
    }
    // Rule 2.
    if input.reserved() != 0
        || input.rep_count() != 0
        || input.rep_start() != 0
        || input.variable_header_size() != 0
        || (input.fast() && !call.is_some_and(Call::allows_fast))
    {
        return Err(HvError::INVALID_HYPERCALL_INPUT);
    }
    // Rule 3.
    let call = call.ok_or(HvError::INVALID_HYPERCALL_CODE)?;
    match call {
        Call::NotifyLongSpinWait => Ok(()),
        Call::GetPartitionId => {
            if !ctx.privileges.access_partition_id() {
                return Err(HvError::ACCESS_DENIED);
            }
            let partition_id = match ctx.caller {
                Requester::Root => ROOT_PARTITION_ID,
                Requester::Guest { partition_id, .. } => partition_id,
            };
            let out = GetPartitionIdOutput { partition_id };
            check_output_not_overlaid(ctx, output_gpa)?;
            mem.write(output_gpa, out.as_bytes()).map_err(|_| HvError::INVALID_PARAMETER)
        }
        Call::MapStatsPage => {
            let mut block = MapStatsPageInput::default();
            mem.read(input_gpa, block.as_mut_bytes()).map_err(|_| HvError::INVALID_PARAMETER)?;
            map(ctx, &block, mem, overlays)
        }
        Call::UnmapStatsPage => {
            let mut buf = [0u8; size_of::<UnmapStatsPageInput>()];
            mem.read(input_gpa, &mut buf).map_err(|_| HvError::INVALID_PARAMETER)?;
            let block = UnmapStatsPageInput::read_from_bytes(&buf).map_err(|_| HvError::INVALID_PARAMETER)?;
            unmap(ctx, &block, overlays)
        }
    }
}

/// An output block must not lie on a page the caller sees a stats page at (module documentation).
fn check_output_not_overlaid(ctx: &CallerContext<'_>, output_gpa: u64) -> HvResult<()> {
    let gpa_page = output_gpa / PAGE_SIZE as u64;
    with_gpa_space(ctx, |gpa, _| {
        if gpa.mappings().iter().any(|(_, m)| m.accessible && m.gpa_page == gpa_page) {
            return Err(HvError::ACCESS_DENIED);
        }
        Ok(())
    })
}

/// Rule 1 for one block: 8-byte aligned and within one page.
fn check_block(gpa: u64, size: u64) -> HvResult<()> {
    if size == 0 {
        return Ok(());
    }
    let page = PAGE_SIZE as u64;
    if !gpa.is_multiple_of(8) || gpa % page + size > page {
        return Err(HvError::INVALID_ALIGNMENT);
    }
    Ok(())
}

/// Rules 4 to 9, shared by map and unmap.
fn authorize(
    ctx: &CallerContext<'_>,
    stats_type: hvstats_abi::StatsObjectType,
    padding: u32,
    identity: hvstats_abi::StatsObjectIdentity,
) -> HvResult<ObjectKey> {
    let request = rules::parse_request(stats_type, padding, identity)?;
    rules::authorize(ctx.caller, ctx.privileges.access_stats(), &request, ctx.hypervisor)
}

/// Runs `f` on the caller's GPA space, with the partition whose counters it keeps (none for
/// the root).
fn with_gpa_space<R>(
    ctx: &CallerContext<'_>,
    f: impl FnOnce(&mut GpaSpace, Option<&crate::instance::PartitionStats>) -> HvResult<R>,
) -> HvResult<R> {
    match ctx.caller {
        Requester::Root => f(&mut ctx.hypervisor.root_gpa_space(), None),
        Requester::Guest { partition_id, .. } => {
            let stats = ctx.hypervisor.partition(partition_id).ok_or(HvError::INVALID_PARTITION_ID)?;
            let mut gpa = stats.gpa_space();
            f(&mut gpa, Some(&stats))
        }
    }
}

fn map(
    ctx: &CallerContext<'_>,
    block: &MapStatsPageInput,
    mem: &dyn GuestMemory,
    overlays: &mut dyn StatsOverlays,
) -> HvResult<()> {
    let key = authorize(ctx, block.stats_type, block.padding, block.identity)?;
    let gpa_page = block.target_gpa_page;
    // Resolved before the GPA space is locked: the instance locks partitions, then GPA spaces.
    // An object gone since the rules ran belongs to a partition no longer active.
    let page = ctx.hypervisor.object_page(key.object).ok_or(HvError::INVALID_PARTITION_STATE)?;
    with_gpa_space(ctx, |gpa, stats| {
        // Rules 10 and 11.
        gpa.mappings().check_map(&key)?;
        let accessible = gpa_page < ctx.gpa_space_pages;
        let mut outside_ram = false;
        if accessible {
            if gpa.mappings().iter().any(|(_, m)| m.accessible && m.gpa_page == gpa_page) {
                return Err(HvError::INVALID_PARAMETER);
            }
            let address = gpa_page.checked_mul(PAGE_SIZE as u64);
            outside_ram = !address.is_some_and(|a| mem.is_ram(a));
            overlays.map_overlay(gpa_page, page.page()).map_err(|_| HvError::INSUFFICIENT_MEMORY)?;
        }
        gpa.mappings_mut().insert(key, OverlayMapping { gpa_page, accessible, outside_ram });
        if let Some(stats) = stats {
            stats.page().set(partition::GPA_PAGES, gpa.gpa_pages());
            stats.page().fetch_add(partition::GPA_SPACE_MODIFICATIONS, 1);
        }
        Ok(())
    })
}

fn unmap(
    ctx: &CallerContext<'_>,
    block: &UnmapStatsPageInput,
    overlays: &mut dyn StatsOverlays,
) -> HvResult<()> {
    let key = authorize(ctx, block.stats_type, block.padding, block.identity)?;
    with_gpa_space(ctx, |gpa, stats| {
        let mapping = gpa.mappings_mut().remove(&key)?;
        if mapping.accessible
            && let Err(_e) = overlays.unmap_overlay(mapping.gpa_page)
        {
            gpa.mappings_mut().insert(key, mapping);
            return Err(HvError::OPERATION_DENIED);
        }
        if let Some(stats) = stats {
            stats.page().set(partition::GPA_PAGES, gpa.gpa_pages());
            stats.page().fetch_add(partition::GPA_SPACE_MODIFICATIONS, 1);
        }
        Ok(())
    })
}
