//! The typed VP counter API of `WHvGetVirtualProcessorCounters` (seed 000).
//!
//! A VMM asks for one counter set of one VP. The values come from the VP's stats page (the page is
//! the storage), after the backend has merged its kernel sources into it, so they are exact at the
//! moment of the call. This module knows nothing of KVM: a backend implements
//! [`VpCounterSource`].
//!
//! Field to counter mapping (VP page counters of the catalog):
//!
//! | set | field | counter(s) |
//! |---|---|---|
//! | Runtime | TotalRuntime100ns, HypervisorRuntime100ns | Total run time, Hypervisor run time |
//! | Intercepts | each `{Count, Time100ns}` | the matching `…/sec` count and `… cost` time |
//! | Events | PageFaultCount | Reflected guest page faults/sec |
//! | Events | ExceptionCount | no catalog counter: [`VpExtras::exception_count`] from the backend |
//! | Events | InterruptCount | Virtual interrupts/sec |
//! | Apic | Mmio, Eoi, Tpr, SentIpi, SelfIpi | APIC MMIO / EOI / TPR accesses, APIC IPIs sent, self IPIs |

use hvstats_abi::catalog::vp;
use hvstats_abi::exit_reason::InterceptClass;
use hvstats_abi::whv::{
    ApicCounters, CounterSet, EventCounters, HResult, InterceptCounter, InterceptCounters, RuntimeCounters,
};
use zerocopy::{FromBytes, IntoBytes};

use crate::instance::PartitionStats;
use crate::page::SharedPage;

/// Values a WHv set reports that have no counter in the VP page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VpExtras {
    /// Exceptions injected into the guest (Events.ExceptionCount); 0 when the backend cannot count
    /// them.
    pub exception_count: u64,
}

/// A partition whose VP counters can be read: its stats objects, and a way to bring one VP's page
/// up to date with the backend's sources.
pub trait VpCounterSource {
    /// The partition's stats objects.
    fn stats(&self) -> &PartitionStats;

    /// Merges every source of VP `vp_index` into its page now, and returns the values that have no
    /// place in the page.
    ///
    /// # Errors
    /// When the backend has no such VP or cannot read its sources.
    fn refresh_vp(&self, vp_index: u32) -> Result<VpExtras, RefreshError>;
}

/// Why a backend could not bring a VP's page up to date.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RefreshError {
    /// The backend has no VP with this index.
    #[error("the backend has no virtual processor {index}")]
    NoVp {
        /// The index asked for.
        index: u32,
    },
    /// A source the backend must read is unreadable.
    #[error("{source_name} cannot be read")]
    Unreadable {
        /// What could not be read, as the backend names it in the message.
        source_name: &'static str,
    },
}

/// Why a VP counter query failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WhvError {
    /// The counter set is not one of seed 000's (`WHV_E_UNKNOWN_PROPERTY`).
    #[error("unknown counter set {0}")]
    UnknownProperty(u32),
    /// The buffer is smaller than the set (`WHV_E_INSUFFICIENT_BUFFER`); `needed` is the set's size.
    #[error("buffer of {given} bytes is smaller than the counter set ({needed} bytes)")]
    InsufficientBuffer {
        /// The set's size in bytes.
        needed: usize,
        /// The buffer's size in bytes.
        given: usize,
    },
    /// The partition has no VP with this index (`E_INVALIDARG`).
    #[error("the partition has no virtual processor {index} (it has {count})")]
    InvalidVpIndex {
        /// The index asked for.
        index: u32,
        /// The number of VPs.
        count: u32,
    },
    /// A backend source could not be read (`E_FAIL`).
    #[error("refreshing the VP counters failed")]
    Refresh(#[source] RefreshError),
}

impl WhvError {
    /// The `HRESULT` the WHv API returns for this error.
    pub fn hresult(&self) -> HResult {
        match self {
            WhvError::UnknownProperty(_) => HResult::WHV_E_UNKNOWN_PROPERTY,
            WhvError::InsufficientBuffer { .. } => HResult::WHV_E_INSUFFICIENT_BUFFER,
            WhvError::InvalidVpIndex { .. } => HResult::E_INVALIDARG,
            WhvError::Refresh(_) => HResult::E_FAIL,
        }
    }
}

/// `WHvGetVirtualProcessorCounters`: writes counter set `set` of VP `vp_index` into `buffer` and
/// returns the bytes written (the set's size).
///
/// # Errors
/// An unknown set, a VP index out of range, a buffer smaller than the set (reporting the size
/// needed), or a source that cannot be read.
pub fn vp_counters<S: VpCounterSource + ?Sized>(
    partition: &S,
    vp_index: u32,
    set: CounterSet,
    buffer: &mut [u8],
) -> Result<usize, WhvError> {
    let size = set.size().ok_or(WhvError::UnknownProperty(set.0))?;
    let count = partition.stats().vp_count();
    if vp_index >= count {
        return Err(WhvError::InvalidVpIndex { index: vp_index, count });
    }
    if buffer.len() < size {
        return Err(WhvError::InsufficientBuffer { needed: size, given: buffer.len() });
    }
    let (page, extras) = refreshed(partition, vp_index)?;
    let out = &mut buffer[..size];
    match set {
        CounterSet::RUNTIME => out.copy_from_slice(runtime_from(page).as_bytes()),
        CounterSet::INTERCEPTS => out.copy_from_slice(intercepts_from(page).as_bytes()),
        CounterSet::EVENTS => out.copy_from_slice(events_from(page, extras).as_bytes()),
        CounterSet::APIC => out.copy_from_slice(apic_from(page).as_bytes()),
        _ => return Err(WhvError::UnknownProperty(set.0)),
    }
    Ok(size)
}

fn refreshed<S: VpCounterSource + ?Sized>(
    partition: &S,
    vp_index: u32,
) -> Result<(&SharedPage, VpExtras), WhvError> {
    let count = partition.stats().vp_count();
    let page =
        partition.stats().vp_page(vp_index).ok_or(WhvError::InvalidVpIndex { index: vp_index, count })?;
    let extras = partition.refresh_vp(vp_index).map_err(WhvError::Refresh)?;
    Ok((page, extras))
}

/// The Runtime set of VP `vp_index`, refreshed.
///
/// # Errors
/// A VP index out of range, or a source that cannot be read.
pub fn runtime_counters<S: VpCounterSource + ?Sized>(
    p: &S,
    vp_index: u32,
) -> Result<RuntimeCounters, WhvError> {
    Ok(runtime_from(refreshed(p, vp_index)?.0))
}

/// The Intercepts set of VP `vp_index`, refreshed.
///
/// # Errors
/// As [`runtime_counters`].
pub fn intercept_counters<S: VpCounterSource + ?Sized>(
    p: &S,
    vp_index: u32,
) -> Result<InterceptCounters, WhvError> {
    Ok(intercepts_from(refreshed(p, vp_index)?.0))
}

/// The Events set of VP `vp_index`, refreshed.
///
/// # Errors
/// As [`runtime_counters`].
pub fn event_counters<S: VpCounterSource + ?Sized>(p: &S, vp_index: u32) -> Result<EventCounters, WhvError> {
    let (page, extras) = refreshed(p, vp_index)?;
    Ok(events_from(page, extras))
}

/// The Apic set of VP `vp_index`, refreshed.
///
/// # Errors
/// As [`runtime_counters`].
pub fn apic_counters<S: VpCounterSource + ?Sized>(p: &S, vp_index: u32) -> Result<ApicCounters, WhvError> {
    Ok(apic_from(refreshed(p, vp_index)?.0))
}

/// The Runtime set as the page holds it now.
pub(crate) fn runtime_from(page: &SharedPage) -> RuntimeCounters {
    RuntimeCounters {
        total_runtime_100ns: page.get(vp::TOTAL_RUN_TIME),
        hypervisor_runtime_100ns: page.get(vp::HYPERVISOR_RUN_TIME),
    }
}

/// The Intercepts set as the page holds it now: each class of [`InterceptClass::WHV`], in the
/// struct's order, its count and its time.
pub(crate) fn intercepts_from(page: &SharedPage) -> InterceptCounters {
    let pairs = InterceptClass::WHV.map(|class| InterceptCounter {
        count: page.get(class.counter()),
        time_100ns: class.cost().map_or(0, |cost| page.get(cost)),
    });
    InterceptCounters::read_from_bytes(pairs.as_bytes()).unwrap_or_default()
}

/// The Events set as the page (and the backend's extras) hold it now.
pub(crate) fn events_from(page: &SharedPage, extras: VpExtras) -> EventCounters {
    EventCounters {
        page_fault_count: page.get(vp::REFLECTED_GUEST_PAGE_FAULTS),
        exception_count: extras.exception_count,
        interrupt_count: page.get(vp::VIRTUAL_INTERRUPTS),
    }
}

/// The Apic set as the page holds it now.
pub(crate) fn apic_from(page: &SharedPage) -> ApicCounters {
    ApicCounters {
        mmio_access_count: page.get(vp::APIC_MMIO_ACCESSES),
        eoi_access_count: page.get(vp::APIC_EOI_ACCESSES),
        tpr_access_count: page.get(vp::APIC_TPR_ACCESSES),
        sent_ipi_count: page.get(vp::APIC_IPIS_SENT),
        self_ipi_count: page.get(vp::APIC_SELF_IPIS_SENT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::sync::Arc;
    use zerocopy::FromBytes;

    use crate::instance::Hypervisor;

    struct Fake {
        _hv: Arc<Hypervisor>,
        stats: Arc<PartitionStats>,
        refreshes: Cell<u32>,
    }

    impl VpCounterSource for Fake {
        fn stats(&self) -> &PartitionStats {
            &self.stats
        }
        fn refresh_vp(&self, vp_index: u32) -> Result<VpExtras, RefreshError> {
            self.refreshes.set(self.refreshes.get() + 1);
            // A refresh brings the page up to date: here it adds one CPUID per call.
            self.stats
                .vp_page(vp_index)
                .ok_or(RefreshError::NoVp { index: vp_index })?
                .add(vp::CPUID_INSTRUCTIONS, 1);
            Ok(VpExtras { exception_count: 3 })
        }
    }

    fn fake(vps: u32) -> Fake {
        let hv = Hypervisor::new().unwrap();
        let stats = hv.create_partition(vps).unwrap();
        Fake { _hv: hv, stats, refreshes: Cell::new(0) }
    }

    #[test]
    fn unknown_set_is_unknown_property_whatever_the_buffer() {
        let p = fake(1);
        let mut buf = [0u8; 0];
        let err = vp_counters(&p, 0, CounterSet(4), &mut buf).unwrap_err();
        assert_eq!(err, WhvError::UnknownProperty(4));
        assert_eq!(err.hresult(), HResult::WHV_E_UNKNOWN_PROPERTY);
        let mut big = [0u8; 1024];
        assert_eq!(
            vp_counters(&p, 0, CounterSet(u32::MAX), &mut big).unwrap_err().hresult(),
            HResult::WHV_E_UNKNOWN_PROPERTY
        );
    }

    #[test]
    fn short_buffer_reports_the_size_needed_and_writes_nothing() {
        let p = fake(1);
        for (set, size) in [
            (CounterSet::RUNTIME, 16),
            (CounterSet::INTERCEPTS, 176),
            (CounterSet::EVENTS, 24),
            (CounterSet::APIC, 40),
        ] {
            let mut buf = vec![0xAAu8; size - 1];
            let err = vp_counters(&p, 0, set, &mut buf).unwrap_err();
            assert_eq!(err, WhvError::InsufficientBuffer { needed: size, given: size - 1 });
            assert_eq!(err.hresult(), HResult::WHV_E_INSUFFICIENT_BUFFER);
            assert!(buf.iter().all(|&b| b == 0xAA));
        }
        assert_eq!(p.refreshes.get(), 0);
    }

    #[test]
    fn vp_index_out_of_range_is_an_error() {
        let p = fake(2);
        let mut buf = [0u8; 64];
        assert_eq!(
            vp_counters(&p, 2, CounterSet::RUNTIME, &mut buf).unwrap_err(),
            WhvError::InvalidVpIndex { index: 2, count: 2 }
        );
        assert!(intercept_counters(&p, 7).is_err());
    }

    #[test]
    fn exact_buffer_gets_the_struct_refreshed_at_the_call() {
        let p = fake(2);
        let page = p.stats.vp_page(1).unwrap();
        page.set(vp::CPUID_INSTRUCTIONS, 41);
        page.set(vp::CPUID_INSTRUCTIONS_COST, 9);
        page.set(vp::TOTAL_RUN_TIME, 500);
        page.set(vp::HYPERVISOR_RUN_TIME, 200);
        page.set(vp::APIC_SELF_IPIS_SENT, 6);
        page.set(vp::VIRTUAL_INTERRUPTS, 8);
        let mut buf = [0u8; 176 + 8];
        assert_eq!(vp_counters(&p, 1, CounterSet::INTERCEPTS, &mut buf), Ok(176));
        let ic = InterceptCounters::read_from_bytes(&buf[..176]).unwrap();
        assert_eq!(ic.cpuid_instructions, InterceptCounter { count: 42, time_100ns: 9 });
        assert_eq!(&buf[176..], &[0u8; 8]);
        let mut rt = [0u8; 16];
        assert_eq!(vp_counters(&p, 1, CounterSet::RUNTIME, &mut rt), Ok(16));
        assert_eq!(
            RuntimeCounters::read_from_bytes(&rt).unwrap(),
            RuntimeCounters { total_runtime_100ns: 500, hypervisor_runtime_100ns: 200 }
        );
        let ev = event_counters(&p, 1).unwrap();
        assert_eq!(ev, EventCounters { page_fault_count: 0, exception_count: 3, interrupt_count: 8 });
        assert_eq!(apic_counters(&p, 1).unwrap().self_ipi_count, 6);
        // VP 0 was not touched by the writes to VP 1.
        assert_eq!(intercept_counters(&p, 0).unwrap().cpuid_instructions.count, 1);
    }
}
