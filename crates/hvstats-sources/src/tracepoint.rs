//! KVM's tracepoints (`kvm:kvm_cpuid`, `kvm:kvm_msr`, …) counted on a VP's thread.
//!
//! KVM has no per-reason exit counters, but its tracepoints fire once per intercept it handles in
//! the kernel, on the vCPU's thread. Counting them on the VP thread gives exact counts without
//! tracing anything to a buffer; they are counted by the engine every tracepoint count of hvstats
//! goes through (`hvstats_host::counting`: one eBPF program per tracepoint where BPF is
//! permitted, perf counters otherwise), with the same events ([`event`]) the observer counts on an
//! observed VM's threads, and written by the same function ([`write_tracepoint_counts`]). When
//! tracefs is unavailable the counters are unavailable and the reason is kept, never guessed.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use hvstats::SharedPage;
use hvstats::whv::VpExtras;
use hvstats_abi::apic;
use hvstats_abi::catalog::{maintained_by, maintained_count};
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::source::{Source, SourceKind};
use hvstats_abi::{Counter, ObjectKind};
use hvstats_host::counting::{EventList, EventSpec, ThreadEvents};

use super::counter_source::{CounterSource, Gives, Object, Part, VpSource, VpThread};
use super::user_exits::UserExitCounts;

pub use hvstats_abi::source::Tracepoint;

/// The ftrace filter that narrows `tp`'s event, if any, written from the ABI's APIC facts.
pub fn filter(tp: Tracepoint) -> Option<String> {
    // The kvm_exit parts: the exits of a class the exit tables add to its tracepoint's count.
    if let Some(class) = tp.exit_class() {
        return hvstats_abi::exit_filter::added_filter(class).map(|f| f.to_string());
    }
    // kvm_mmio type: 0 unsatisfied read (the read is then traced again), 1 read, 2 write.
    let (page, end) = (apic::APIC_BASE, apic::APIC_BASE + apic::APIC_PAGE_SIZE);
    match tp {
        Tracepoint::ApicMmio => Some(format!("gpa >= {page:#x} && gpa < {end:#x} && type != 0")),
        Tracepoint::ApicTpr => Some(format!("gpa == {:#x} && type != 0", apic::APIC_TPR)),
        Tracepoint::ApicEoi => Some(format!("gpa == {:#x} && type == 2", apic::APIC_EOI)),
        // x2APIC registers are MSRs 0x800 + offset / 16 (kvm_msr write: 1 for WRMSR).
        Tracepoint::X2apicTpr => Some(format!("ecx == {:#x}", apic::X2APIC_TPR_MSR)),
        Tracepoint::X2apicEoi => Some(format!("ecx == {:#x} && write == 1", apic::X2APIC_EOI_MSR)),
        // Destination shorthand (ICR bits 19:18) = 01, "self".
        Tracepoint::ApicSelfIpi => Some(format!(
            "(icr_low & {}) && !(icr_low & {})",
            apic::ICR_SELF,
            apic::ICR_SHORTHAND_MASK & !apic::ICR_SELF
        )),
        // KVM_EXIT_IO 2, KVM_EXIT_MMIO 6, KVM_EXIT_INTR 10, KVM_EXIT_X86_RDMSR/WRMSR 29/30. Only
        // returns with errno 0 are exits: KVM_RUN interrupted by a signal (EINTR) fires the
        // tracepoint too, with the reason of the exit before it still in place.
        Tracepoint::UserspaceIo => Some("reason == 2 && errno == 0".into()),
        Tracepoint::UserspaceMmio => Some("reason == 6 && errno == 0".into()),
        Tracepoint::UserspaceOther => Some("reason != 2 && reason != 6 && reason != 10 && errno == 0".into()),
        Tracepoint::UserspaceMsr => Some("(reason == 29 || reason == 30) && errno == 0".into()),
        // KVM injects an exception again, with `reinjected` set, when the entry it was injected
        // for did not deliver it: the entry was cancelled (a signal, a preemption or a request
        // between the injection and the entry: `cancel_injection` in vcpu_enter_guest, x86.c) or
        // the delivery itself exited. The guest raised it once: only first injections count.
        Tracepoint::InjException => Some("reinjected == 0".into()),
        // ft: a trap-like access (a write KVM completes after AVIC made it), not a fault KVM
        // emulates (kvm_mmio sees those); the EOI register's are counted from kvm_exit.
        Tracepoint::AvicTrap => Some(format!("ft == 1 && offset != {:#x}", apic::APIC_EOI - apic::APIC_BASE)),
        _ => None,
    }
}

/// The event that counts `tp`: its tracepoint, narrowed by its [`filter`].
pub fn event(tp: Tracepoint) -> EventSpec {
    match filter(tp) {
        Some(f) => EventSpec::filtered("kvm", tp.event(), &f),
        None => EventSpec::tracepoint("kvm", tp.event()),
    }
}

/// One reading of every tracepoint counter of a VP, by [`Tracepoint::index`]; `None` where the
/// counter is unavailable or could not be read.
pub type TracepointCounts = [Option<u64>; Tracepoint::ALL.len()];

/// The tracepoint counters of one VP thread, counted by the engine every tracepoint count of
/// hvstats goes through (`hvstats_host::counting`): in the kernel where BPF is permitted, else a
/// perf group read at once.
#[derive(Debug)]
pub struct VpTracepoints {
    events: EventList,
    thread: ThreadEvents,
    /// By [`Tracepoint::index`], its event in the list when our VPs count it.
    at: [Option<usize>; Tracepoint::ALL.len()],
}

impl VpTracepoints {
    /// Opens the tracepoint counters our VPs use ([`Tracepoint::counted_for_partitions`]) for
    /// thread `tid` of this process; a counter that cannot be opened keeps the reason.
    pub fn open(tid: libc::pid_t) -> Self {
        let mut at = [None; Tracepoint::ALL.len()];
        let mut specs = Vec::new();
        for tp in Tracepoint::ALL.into_iter().filter(|tp| tp.counted_for_partitions()) {
            at[tp.index()] = Some(specs.len());
            specs.push(event(tp));
        }
        let events = EventList::new(specs);
        let thread = ThreadEvents::open(std::process::id() as i32, tid, &events);
        Self { events, thread, at }
    }

    /// Every count at one moment.
    pub fn read_all(&mut self) -> TracepointCounts {
        let counts = self.thread.read(&self.events);
        self.at.map(|i| i.and_then(|i| counts.get(i).copied().flatten()))
    }

    /// The count of `tp`, or `None` when it is unavailable or cannot be read now.
    pub fn read(&mut self, tp: Tracepoint) -> Option<u64> {
        self.read_all()[tp.index()]
    }

    /// Why `tp` is not counted, said for a person, if it is not (a tracepoint our VPs do not use
    /// is not "unavailable").
    pub fn unavailable(&self, tp: Tracepoint) -> Option<String> {
        let i = self.at[tp.index()]?;
        if let Some(e) = self.events.unavailable(i) {
            return Some(hvstats::error_chain(e));
        }
        if self.thread.is_open(&self.events, i) {
            return None;
        }
        let why = self.thread.refused(&self.events, i).map(|e| hvstats::error_chain(e));
        Some(format!("perf counter of kvm:{}: {}", tp.event(), why.unwrap_or_else(|| "not opened".into())))
    }

    /// How the counters are counted (in the kernel, or by perf counters, and why).
    pub fn method(&self) -> String {
        self.events.method_description()
    }
}

/// The VP counters kept from tracepoint counts: the catalog's `Tracepoint(..)` rows.
const FROM_TRACEPOINTS: [&Counter; maintained_count(ObjectKind::Vp, SourceKind::Tracepoint)] =
    maintained_by(ObjectKind::Vp, SourceKind::Tracepoint);

/// What the run loop counts that a tracepoint count is corrected with: MSR accesses handled in
/// userspace (`kvm_msr` does not see them) and hypercall port writes (`kvm_pio` counts them as
/// port I/O). An observed VM's VMM does its own accounting: it has none.
#[derive(Clone, Copy, Debug, Default)]
pub struct Corrections {
    /// MSR accesses handled in userspace.
    pub user_msr: u64,
    /// Hypercalls made through a port.
    pub hypercalls: u64,
}

/// Whose catalog key says which tracepoint feeds a counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keys {
    /// Our own VPs: the row's key.
    Own,
    /// Observed VMs: the row's observed key.
    Observed,
}

impl Keys {
    /// Every VP counter a tracepoint feeds under these keys, with its tracepoint, in catalog
    /// order: worked out once, as every VP of every VM is written through it at every refresh.
    fn keyed(self) -> &'static [(&'static Counter, Tracepoint)] {
        type Table = std::sync::OnceLock<Vec<(&'static Counter, Tracepoint)>>;
        static OWN: Table = Table::new();
        static OBSERVED: Table = Table::new();
        let table = match self {
            Keys::Own => &OWN,
            Keys::Observed => &OBSERVED,
        };
        table.get_or_init(|| {
            hvstats_abi::catalog::counters_of(ObjectKind::Vp)
                .filter_map(|c| Some((c, self.tracepoint(c)?)))
                .collect()
        })
    }

    /// The tracepoint that feeds `counter` under these keys, if one does.
    pub fn tracepoint(self, counter: &Counter) -> Option<Tracepoint> {
        let source = match self {
            Keys::Own => counter.maintained.source(),
            Keys::Observed => {
                hvstats_abi::catalog::observed(counter).and_then(hvstats_abi::Maintained::source)
            }
        };
        match source {
            Some(Source::Tracepoint(tp)) => Some(tp),
            _ => None,
        }
    }
}

/// Writes the VP counters of `only` whose key (under `keys`) is a tracepoint from a reading,
/// `count(tp)` giving each tracepoint's count: each counter gets its tracepoint's count with the
/// parts added to it (x2APIC accesses beside xAPIC MMIO) and `corrections` applied. A tracepoint
/// not counted (or unreadable right now) leaves its counter as it is: never a guessed value.
pub fn write_tracepoint_counts(
    page: &SharedPage,
    only: &CounterSet,
    keys: Keys,
    count: impl Fn(Tracepoint) -> Option<u64>,
    corrections: Corrections,
) {
    // The keyed counters of `only`, from a table made once: no walk of the catalog per write.
    for &(counter, tp) in keys.keyed().iter().filter(|(c, _)| only.contains(c.id)) {
        let Some(n) = count(tp) else { continue };
        // By xAPIC MMIO, plus by x2APIC MSR.
        let n = n + tp.added().iter().map(|a| count(*a).unwrap_or(0)).sum::<u64>();
        let value = match tp {
            Tracepoint::Msr => n + corrections.user_msr,
            Tracepoint::Pio => n.saturating_sub(corrections.hypercalls),
            _ => n,
        };
        page.set(counter.id, value);
    }
}

/// The VP thread's tracepoint group as a counter source; the guest exceptions it counts go to
/// the WHv API.
#[derive(Debug)]
pub struct TracepointSource {
    tracepoints: VpTracepoints,
    user: Arc<UserExitCounts>,
    counts: TracepointCounts,
    exceptions: u64,
}

impl CounterSource for TracepointSource {
    fn name(&self) -> &'static str {
        "tracepoints"
    }

    fn gives(&self) -> Gives {
        let mut vp = CounterSet::EMPTY;
        for counter in FROM_TRACEPOINTS {
            if let Some(Source::Tracepoint(tp)) = counter.maintained.source()
                && self.tracepoints.unavailable(tp).is_none()
            {
                vp.insert(counter.id);
            }
        }
        Gives::vp(vp)
    }

    fn write(&self, _object: Object, page: &SharedPage, only: &CounterSet) {
        let corrections = Corrections {
            user_msr: self.user.msr.load(Ordering::Relaxed),
            hypercalls: self.user.hypercalls.load(Ordering::Relaxed),
        };
        write_tracepoint_counts(page, only, Keys::Own, |tp| self.counts[tp.index()], corrections);
    }

    fn unavailable(&self) -> Vec<String> {
        Tracepoint::ALL.iter().filter_map(|&tp| self.tracepoints.unavailable(tp)).collect()
    }
}

impl VpSource for TracepointSource {
    fn part(&self) -> Part {
        Part::Exits
    }

    fn read(&mut self) {
        self.counts = self.tracepoints.read_all();
        if let Some(n) = self.counts[Tracepoint::InjException.index()] {
            self.exceptions = n;
        }
    }

    fn extras(&self, extras: &mut VpExtras) {
        extras.exception_count = self.exceptions;
    }
}

/// The tracepoint group of the VP thread.
pub(super) fn open_source(vp: &VpThread) -> Option<Box<dyn VpSource>> {
    Some(Box::new(TracepointSource {
        tracepoints: VpTracepoints::open(vp.tid),
        user: vp.user.clone(),
        counts: [None; Tracepoint::ALL.len()],
        exceptions: 0,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_written_from_the_apic_facts_are_the_ones_kvm_was_given_before() {
        let f = |tp| filter(tp).unwrap_or_default();
        assert_eq!(f(Tracepoint::ApicMmio), "gpa >= 0xfee00000 && gpa < 0xfee01000 && type != 0");
        assert_eq!(f(Tracepoint::ApicTpr), "gpa == 0xfee00080 && type != 0");
        assert_eq!(f(Tracepoint::ApicEoi), "gpa == 0xfee000b0 && type == 2");
        assert_eq!(f(Tracepoint::ApicSelfIpi), "(icr_low & 262144) && !(icr_low & 524288)");
        assert_eq!(f(Tracepoint::X2apicTpr), "ecx == 0x808");
        assert_eq!(f(Tracepoint::X2apicEoi), "ecx == 0x80b && write == 1");
        assert_eq!(filter(Tracepoint::Cpuid), None);
        assert_eq!(f(Tracepoint::InjException), "reinjected == 0");
        assert_eq!(f(Tracepoint::AvicTrap), "ft == 1 && offset != 0xb0");
        // The kvm_exit parts are the exit tables' added rows, on either architecture.
        for tp in Tracepoint::ALL.into_iter().filter(|tp| tp.exit_class().is_some()) {
            assert!(f(tp).starts_with("(isa == "), "{tp:?}: {}", f(tp));
        }
        assert_eq!(f(Tracepoint::ExitMsr), "(isa == 2 && (exit_reason == 0x8f))");
    }
}
