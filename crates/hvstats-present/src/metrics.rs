//! Metric families for exporters, derived from the catalog.
//!
//! An exporter (Prometheus, OpenMetrics) wants base units, `_total` cumulative counters, gauges for
//! instantaneous values, help texts and a label scheme that makes aggregation work. None of that
//! is written down here counter by counter: every family comes from a catalog row — its name from
//! the row's name, its type from the presentation, its unit and scale from the raw unit, its help
//! from the description. The one grouping added is the intercept class: the count and the time of
//! each class of the WHv Intercepts set become one counter family each with an `intercept` label,
//! so `sum by (intercept)` and `rate(seconds) / rate(count)` work across classes.
//!
//! The same grouping holds the catalog's rows that say one thing of several subjects: the VMs an
//! observer found, by whether it observes them (`observer_vms{state}`) — see [`labelled`]. A row that is a state
//! ([`Presentation::State`], the VM's run state) is a state set: a gauge per state, 1 for the
//! current one. hvstats' own rows of the hypervisor and partition pages speak of the publisher
//! and of the VM rather than of a TLFS object, and are named by their row alone
//! (`hvstats_observer_up`, `hvstats_vm_state`).
//!
//! Counters no KVM source maintains have no family at all: an exporter leaves them absent rather than exporting zeros that look like measurements.
//! Nor has the reader's bookkeeping (the sequence counter of consistent reads), which measures
//! nothing. Help texts say the exported unit ([`help_in_unit`]).

use std::sync::OnceLock;

use hvstats_abi::catalog::CATALOG;
use hvstats_abi::exit_reason::InterceptClass;
use hvstats_abi::source::{ObserverFact, Source, VmsState};
use hvstats_abi::{Counter, CounterId, GroupKind, ObjectKind, Presentation, Unit};

/// The prefix of every metric name.
pub const PREFIX: &str = "hvstats";

/// Bytes in one page of the `Pages` unit.
const PAGE_BYTES: u64 = 4096;

/// 100 ns units in a second.
const TICKS_PER_SECOND: u64 = 10_000_000;

/// Whether a family accumulates or is a value at a moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    /// Only grows while its object lives (`_total` in the exposition).
    Counter,
    /// A value at the moment of the scrape.
    Gauge,
}

/// The base unit a family's values are in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BaseUnit {
    /// Seconds (times in 100 ns or ns are scaled).
    Seconds,
    /// Bytes (pages are scaled by 4096).
    Bytes,
}

impl BaseUnit {
    /// The unit's name as a metric name suffix.
    pub const fn suffix(self) -> &'static str {
        match self {
            BaseUnit::Seconds => "seconds",
            BaseUnit::Bytes => "bytes",
        }
    }
}

/// The intercept classes exported with an `intercept` label: those of the WHv Intercepts set,
/// each with its count and time ([`InterceptClass::WHV`]).
fn intercept_classes() -> impl Iterator<Item = (InterceptClass, CounterId, CounterId)> {
    InterceptClass::WHV.into_iter().filter_map(|c| Some((c, c.counter(), c.cost()?)))
}

/// One catalog counter inside a family.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Member {
    /// The catalog row.
    pub counter: &'static Counter,
    /// The label that tells it from the family's other members, and its value (`intercept` in
    /// the intercept families, `source` and `state` in [`labelled`] ones).
    pub label: Option<(&'static str, &'static str)>,
    /// A second label that refines the first, and its value (`reason` of the refused VMs in
    /// [`labelled`] ones).
    pub detail: Option<(&'static str, &'static str)>,
    /// The raw page value times this, divided by [`divisor`](Self::divisor), is in the family's
    /// base unit (4096 for pages in bytes).
    pub multiplier: u64,
    /// See [`multiplier`](Self::multiplier) (10,000,000 for 100 ns in seconds).
    pub divisor: u64,
}

impl Member {
    /// The raw page value in the family's base unit, correctly rounded (`12340` × 100 ns is
    /// `0.001234`, not `0.0012339999999999999`).
    pub fn value(&self, raw: u64) -> f64 {
        match raw.checked_mul(self.multiplier) {
            Some(product) => product as f64 / self.divisor as f64,
            None => raw as f64 * self.multiplier as f64 / self.divisor as f64,
        }
    }

    /// The value as an integer, when it is one and fits: counts and bytes stay exact beyond 2^53.
    pub fn exact(&self, raw: u64) -> Option<u64> {
        (self.divisor == 1).then(|| raw.checked_mul(self.multiplier)).flatten()
    }
}

/// One metric family.
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    /// The name without the prefix, unit and `_total`, e.g. `vp_hypercalls`.
    pub name: String,
    /// The help text (the catalog's description, or a sentence naming the classes).
    pub help: String,
    /// Counter or gauge.
    pub kind: MetricKind,
    /// The base unit, when the values have one.
    pub unit: Option<BaseUnit>,
    /// The object kind whose pages hold the members.
    pub object: ObjectKind,
    /// The counters, one per series of an object (several only in the intercept families).
    pub members: Vec<Member>,
}

impl Family {
    /// The full name as exposed: prefix, name, unit, and `_total` for counters
    /// (`hvstats_vp_intercept_seconds_total`).
    pub(crate) fn exposed_name(&self) -> String {
        let mut name = format!("{PREFIX}_{}", self.name);
        if let Some(unit) = self.unit {
            name.push('_');
            name.push_str(unit.suffix());
        }
        if self.kind == MetricKind::Counter {
            name.push_str("_total");
        }
        name
    }
}

/// The object kind's name in metric names.
pub const fn object_prefix(kind: ObjectKind) -> &'static str {
    match kind {
        ObjectKind::Hypervisor => "hypervisor",
        ObjectKind::LogicalProcessor => "lp",
        ObjectKind::Partition => "partition",
        ObjectKind::Vp => "vp",
    }
}

/// A catalog name as a metric name word: `CPUID instructions/sec` → `cpuid_instructions`,
/// `% C1 time` → `c1_time`, `Hypercalls cost` → `hypercalls_time` (a cost is a cumulative time).
pub(crate) fn snake_name(name: &str) -> String {
    let name = name.strip_suffix("/sec").unwrap_or(name);
    let mut out = String::with_capacity(name.len());
    for ch in name.chars() {
        if ch.is_ascii_alphanumeric() {
            out.push(ch.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('_') {
            out.push('_');
        }
    }
    while out.ends_with('_') {
        out.pop();
    }
    match out.strip_suffix("_cost") {
        Some(stem) => format!("{stem}_time"),
        None => out,
    }
}

/// A time or page unit's base unit, multiplier and divisor.
fn base_unit(unit: Unit) -> Option<(BaseUnit, u64, u64)> {
    match unit {
        Unit::Time100ns => Some((BaseUnit::Seconds, 1, TICKS_PER_SECOND)),
        Unit::Nanoseconds => Some((BaseUnit::Seconds, 1, 1_000_000_000)),
        Unit::Pages => Some((BaseUnit::Bytes, PAGE_BYTES, 1)),
        Unit::Count | Unit::Cycles => None,
    }
}

fn is_intercept_member(id: CounterId) -> bool {
    intercept_classes().any(|(_, count, time)| count == id || time == id)
}

/// The family of rows that say one thing of several subjects, and the labels that tell them
/// apart, for `counter`: (family name, help, label, refining label).
///
/// The refused VMs are exported by reason, one series per row of the refusal table
/// ([`hvstats_abi::refusal::Refusal`]); their sum, a row of its own on the page, is no series
/// (a `sum` over the family would count it twice).
///
/// ```
/// use hvstats_abi::catalog::hypervisor;
/// use hvstats_present::metrics::labelled;
/// let of = |id: hvstats_abi::CounterId| labelled(id.counter().unwrap()).map(|(f, _, l, d)| (f, l, d));
/// assert_eq!(
///     of(hypervisor::OBSERVER_VMS_REFUSED_NO_CAP_SYS_PTRACE),
///     Some(("observer_vms", ("state", "refused"), Some(("reason", "no_cap_sys_ptrace"))))
/// );
/// assert_eq!(of(hypervisor::OBSERVER_VMS_ATTACHED), Some(("observer_vms", ("state", "attached"), None)));
/// assert_eq!(of(hypervisor::OBSERVER_UP), None);
/// ```
pub fn labelled(counter: &Counter) -> Option<(&'static str, &'static str, Label, Option<Label>)> {
    const HELP: &str = "The VMs of other processes the observer found, by whether it observes them \
                        (attached) or not now (refused), and why not (reason: a row of the refusal \
                        table, one series each).";
    match counter.maintained.source()? {
        Source::Observer(ObserverFact::Vms(VmsState::Attached)) => {
            Some(("observer_vms", HELP, ("state", VmsState::Attached.label()), None))
        }
        Source::Observer(ObserverFact::Refused(reason)) => {
            let [state, reason] = reason.labels();
            Some(("observer_vms", HELP, state, Some(reason)))
        }
        _ => None,
    }
}

/// A label and its value.
pub type Label = (&'static str, &'static str);

/// True for a row that is the sum of a [`labelled`] family's members (the refused VMs of every
/// reason): no series of its own.
pub fn is_sum_of_members(counter: &Counter) -> bool {
    counter.maintained.source() == Some(Source::Observer(ObserverFact::Vms(VmsState::Refused)))
}

/// The catalog's description said in the family's base unit: its values are exported in seconds
/// or bytes, so a description that speaks of 100 ns units, nanoseconds or a number of pages would
/// contradict the series, and a cost (an average per event in the catalog) is exported as the
/// total time it accumulates.
pub fn help_in_unit(counter: &Counter, unit: Option<BaseUnit>) -> String {
    let mut help = counter.description.to_owned();
    match unit {
        Some(BaseUnit::Seconds) => {
            for raw in ["(in 100ns)", "(in 100 ns)", "(in nanoseconds)"] {
                help = help.replace(raw, "(in seconds)");
            }
            // A percentage of time is exported as the time it is a percentage of.
            if counter.presentation == Presentation::PercentTime {
                help = help.replacen("The percentage of time", "The time (in seconds)", 1);
            }
            if counter.presentation == Presentation::Cost {
                help = help.replacen("The average time", "The total time", 1);
                // What a cost is averaged over is its paired count's own family.
                if let Some((head, _)) = help.split_once(", per ") {
                    help = format!("{head}.");
                }
                // Time halted is no time per HLT.
                if let Some(count) = counter.paired_count().filter(|_| !counter.is_time_halted()) {
                    let per = family_of(count).exposed_name();
                    help.push_str(&format!(" Its rate over the rate of {per} is the average per event."));
                }
            }
            if !help.contains("(in seconds)") {
                help.push_str(" In seconds.");
            }
        }
        Some(BaseUnit::Bytes) => {
            let before = help.clone();
            help = help.replacen("number of pages", "size in bytes of the pages", 1);
            help = help.replacen("number of ", "size in bytes of the ", 1);
            if help == before {
                help.push_str(" In bytes (4096 per page).");
            }
        }
        None => {}
    }
    help
}

fn family_of(counter: &'static Counter) -> Family {
    let (unit, multiplier, divisor) = match base_unit(counter.unit) {
        Some((unit, multiplier, divisor)) => (Some(unit), multiplier, divisor),
        None => (None, 1, 1),
    };
    let kind = match counter.presentation {
        Presentation::Instant | Presentation::State => MetricKind::Gauge,
        Presentation::Rate
        | Presentation::CumulativeTime
        | Presentation::Cost
        | Presentation::PercentTime => MetricKind::Counter,
        // Left out of the one-value families (see `families`); its sum alone is a counter.
        Presentation::Histogram => MetricKind::Counter,
    };
    let mut word = snake_name(counter.name);
    // A cost is exported as its cumulative time: what it is "per" is the paired counter's own
    // family (`CPU wait time per dispatch` is `vp_cpu_wait_seconds_total`, beside
    // `vp_dispatches_total`).
    if counter.presentation == Presentation::Cost
        && let Some((stem, _)) = word.rsplit_once("_per_")
    {
        word = stem.to_owned();
    }
    // The unit goes at the end of the name, once: `GPA pages` in bytes is `gpa_bytes`.
    if let Some(unit) = unit {
        let redundant = match unit {
            BaseUnit::Seconds => "_time",
            BaseUnit::Bytes => "_pages",
        };
        if let Some(stem) = word.strip_suffix(redundant) {
            word = stem.to_owned();
        }
    }
    // hvstats' own rows of the hypervisor and partition pages name their subject (the
    // observer, the VM) themselves.
    let own_subject = counter.id.group == GroupKind::Hvstats
        && matches!(counter.id.kind, ObjectKind::Hypervisor | ObjectKind::Partition);
    let name = match own_subject {
        true => word,
        false => format!("{}_{word}", object_prefix(counter.id.kind)),
    };
    Family {
        name,
        help: help_in_unit(counter, unit),
        kind,
        unit,
        object: counter.id.kind,
        members: vec![Member { counter, label: None, detail: None, multiplier, divisor }],
    }
}

/// The families of rows that say one thing of several subjects ([`labelled`]), in catalog
/// order of their first member.
fn labelled_families(kind: ObjectKind) -> Vec<Family> {
    let mut out: Vec<Family> = Vec::new();
    for counter in CATALOG.iter().filter(|c| c.id.kind == kind && c.is_maintained_anywhere()) {
        let Some((name, help, label, detail)) = labelled(counter) else { continue };
        let member = Member { counter, label: Some(label), detail, multiplier: 1, divisor: 1 };
        match out.iter_mut().find(|f| f.name == name) {
            Some(family) => family.members.push(member),
            None => out.push(Family {
                name: name.to_owned(),
                help: help.to_owned(),
                kind: MetricKind::Gauge,
                unit: None,
                object: kind,
                members: vec![member],
            }),
        }
    }
    out
}

fn intercept_families() -> [Family; 2] {
    let member = |id: CounterId, label, divisor| {
        let counter = id.counter()?;
        let member =
            Member { counter, label: Some(("intercept", label)), detail: None, multiplier: 1, divisor };
        counter.is_maintained_anywhere().then_some(member)
    };
    [
        Family {
            name: "vp_intercepts".into(),
            help: "The total number of intercepts handled for the virtual processor, by class of the WHv \
                   Intercepts counter set (emulated instructions are not exits: several, or none, per exit)."
                .into(),
            kind: MetricKind::Counter,
            unit: None,
            object: ObjectKind::Vp,
            members: intercept_classes().filter_map(|(c, count, _)| member(count, c.label(), 1)).collect(),
        },
        Family {
            name: "vp_intercept".into(),
            help:
                "The total time (in seconds) spent handling intercepts of the virtual processor, by class \
                   of the WHv Intercepts counter set (classes whose time nobody records are absent); for hlt, \
                   the time the virtual processor spent halted, not handling time."
                    .into(),
            kind: MetricKind::Counter,
            unit: Some(BaseUnit::Seconds),
            object: ObjectKind::Vp,
            members: intercept_classes()
                .filter_map(|(c, _, time)| member(time, c.label(), TICKS_PER_SECOND))
                .collect(),
        },
    ]
}

/// Every family, in catalog order, the two intercept families first among the VP's.
///
/// Counters no source maintains (for our own partitions or for observed VMs) are left out; so are the intercept classes' own counters, which
/// live in the intercept families.
pub fn families() -> &'static [Family] {
    static FAMILIES: OnceLock<Vec<Family>> = OnceLock::new();
    FAMILIES.get_or_init(|| {
        let mut out: Vec<Family> = Vec::new();
        for kind in ObjectKind::ALL {
            if kind == ObjectKind::Vp {
                out.extend(intercept_families());
            }
            out.extend(
                CATALOG
                    .iter()
                    .filter(|c| {
                        c.id.kind == kind
                            && c.is_maintained_anywhere()
                            && !c.is_bookkeeping()
                            && !is_intercept_member(c.id)
                            && labelled(c).is_none()
                            && !is_sum_of_members(c)
                            // A histogram spans many slots: a family of its own, not one value.
                            && c.presentation != Presentation::Histogram
                    })
                    .map(family_of),
            );
            out.extend(labelled_families(kind));
        }
        out
    })
}

/// One family per maintained histogram row of the catalog (a Prometheus histogram in seconds),
/// in catalog order: `Hypercall time histogram` is `vp_hypercall_duration` (unit seconds).
pub(crate) fn histogram_families() -> &'static [Family] {
    static FAMILIES: OnceLock<Vec<Family>> = OnceLock::new();
    FAMILIES.get_or_init(|| {
        CATALOG
            .iter()
            .filter(|c| c.is_maintained_anywhere() && c.presentation == Presentation::Histogram)
            .map(|c| {
                let mut family = family_of(c);
                let word = snake_name(c.name);
                let word = word.strip_suffix("_histogram").unwrap_or(&word);
                let word = word.strip_suffix("_time").unwrap_or(word);
                family.name = format!("{}_{word}_duration", object_prefix(c.id.kind));
                family
            })
            .collect()
    })
}

#[cfg(test)]
/// The family (and member) exporting `id`, if it is exported.
pub(crate) fn family_of_counter(id: CounterId) -> Option<(&'static Family, &'static Member)> {
    families().iter().find_map(|f| f.members.iter().find(|m| m.counter.id == id).map(|m| (f, m)))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use hvstats_abi::catalog::{lp, partition};

    use super::*;
    use hvstats_abi::catalog::vp;

    #[test]
    fn names_come_from_the_catalog_in_base_units() {
        let name = |id| family_of_counter(id).unwrap().0.exposed_name();
        assert_eq!(name(vp::HYPERCALLS), "hvstats_vp_hypercalls_total");
        assert_eq!(name(vp::HYPERCALLS_COST), "hvstats_vp_hypercalls_seconds_total");
        assert_eq!(name(vp::HOST_PAGE_FAULTS), "hvstats_vp_host_page_faults_total");
        assert_eq!(name(vp::HOST_MAJOR_PAGE_FAULTS), "hvstats_vp_host_major_page_faults_total");
        assert_eq!(name(vp::TOTAL_RUN_TIME), "hvstats_vp_total_run_seconds_total");
        assert_eq!(name(vp::CPUID_INSTRUCTIONS), "hvstats_vp_intercepts_total");
        assert_eq!(name(vp::IO_INSTRUCTIONS_COST), "hvstats_vp_intercept_seconds_total");
        assert_eq!(name(partition::GPA_PAGES), "hvstats_partition_gpa_bytes");
        assert_eq!(name(partition::VIRTUAL_PROCESSORS), "hvstats_partition_virtual_processors");
        assert_eq!(name(lp::C1_TIME), "hvstats_lp_c1_seconds_total");
        assert_eq!(name(lp::GLOBAL_TIME), "hvstats_lp_global_seconds");
        // A cost "per" something is its cumulative time; the something has its own family.
        assert_eq!(name(vp::CPU_WAIT_TIME_PER_DISPATCH), "hvstats_vp_cpu_wait_seconds_total");
        assert_eq!(name(vp::DISPATCHES), "hvstats_vp_dispatches_total");
        // Every exit of a VP, whatever its class: what the intercept classes break down.
        assert_eq!(name(vp::EXITS), "hvstats_vp_exits_total");
    }

    #[test]
    fn scales_turn_raw_units_into_base_units() {
        let (_, m) = family_of_counter(vp::HYPERCALLS_COST).unwrap();
        assert_eq!(m.value(30_000_000), 3.0);
        assert_eq!(m.value(12_340), 0.001234);
        assert_eq!(m.exact(12_340), None);
        let (_, m) = family_of_counter(partition::GPA_PAGES).unwrap();
        assert_eq!(m.exact(3), Some(12_288));
        let (_, m) = family_of_counter(vp::HYPERCALLS).unwrap();
        assert_eq!(m.exact(u64::MAX), Some(u64::MAX));
    }

    #[test]
    fn unmaintained_counters_are_absent() {
        for c in CATALOG.iter().filter(|c| !c.is_maintained_anywhere()) {
            assert!(family_of_counter(c.id).is_none(), "{} is exported", c.name);
        }
        // Emulated instructions are counted, their time is not: a count member, no time member.
        let (f, m) = family_of_counter(vp::EMULATED_INSTRUCTIONS).unwrap();
        assert_eq!((f.name.as_str(), m.label), ("vp_intercepts", Some(("intercept", "emulated"))));
        assert!(family_of_counter(vp::EMULATED_INSTRUCTIONS_COST).is_none());
        // What only observed VMs have a source for is exported: KVM's kvm_hv tracepoints count
        // a Windows guest's synthetic interrupts and flushes; our own partitions declare them
        // unavailable, so they have no series.
        let name = |id| family_of_counter(id).map(|(f, _)| f.exposed_name());
        assert_eq!(name(vp::SYNTHETIC_INTERRUPTS).as_deref(), Some("hvstats_vp_synthetic_interrupts_total"));
        for id in [
            vp::SYNTHETIC_INTERRUPTS,
            vp::ADDRESS_SPACE_FLUSHES,
            vp::ADDRESS_DOMAIN_FLUSHES,
            vp::LOCAL_FLUSHED_GVA_RANGES,
            vp::GLOBAL_GVA_RANGE_FLUSHES,
        ] {
            let c = id.counter().unwrap();
            assert!(!c.maintained.is_maintained(), "{} is maintained for our own partitions", c.name);
            assert!(name(id).is_some(), "{} is not exported", c.name);
        }
    }

    #[test]
    fn every_maintained_counter_is_exported_once_under_a_unique_name() {
        // Histograms span many slots and are not one-value members.
        let maintained: Vec<_> = CATALOG
            .iter()
            .filter(|c| {
                c.is_maintained_anywhere()
                    && c.presentation != Presentation::Histogram
                    && !c.is_bookkeeping()
                    && !is_sum_of_members(c)
            })
            .collect();
        let members: usize = families().iter().map(|f| f.members.len()).sum();
        assert_eq!(members, maintained.len());
        let names: HashSet<String> = families().iter().map(Family::exposed_name).collect();
        assert_eq!(names.len(), families().len());
        for f in families() {
            let labels: HashSet<_> = f.members.iter().map(|m| (m.label, m.detail)).collect();
            assert_eq!(labels.len(), f.members.len(), "{} has two members with one label set", f.name);
            assert!(f.exposed_name().chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        }
    }

    #[test]
    fn help_texts_speak_the_exported_unit_and_bookkeeping_is_no_metric() {
        let all = families().iter().chain(histogram_families());
        for f in all {
            match f.unit {
                Some(BaseUnit::Seconds) => {
                    for raw in ["100ns", "100 ns", "nanosecond", "The average time", "percentage"] {
                        assert!(!f.help.contains(raw), "{}: {}", f.exposed_name(), f.help);
                    }
                    assert!(f.help.contains("seconds"), "{}: {}", f.exposed_name(), f.help);
                }
                Some(BaseUnit::Bytes) => {
                    assert!(!f.help.contains("number of"), "{}: {}", f.exposed_name(), f.help);
                    assert!(f.help.contains("bytes"), "{}: {}", f.exposed_name(), f.help);
                }
                None => {}
            }
        }
        let (f, _) = family_of_counter(vp::HYPERCALLS_COST).unwrap();
        assert_eq!(
            f.help,
            "The total time (in seconds) spent processing a hypercall. Its rate over the rate of \
             hvstats_vp_hypercalls_total is the average per event."
        );
        let (f, _) = family_of_counter(partition::GPA_PAGES).unwrap();
        assert!(f.help.starts_with("The size in bytes of the pages that are present"), "{}", f.help);
        assert!(family_of_counter(vp::SEQUENCE).is_none());
        assert!(!families().iter().any(|f| f.name.contains("sequence")));
    }

    #[test]
    fn every_class_of_the_whv_intercepts_set_is_exported_with_its_label() {
        let labels: Vec<&str> = intercept_classes().map(|(c, _, _)| c.label()).collect();
        assert_eq!(
            labels,
            [
                "invlpg",
                "control_register",
                "io",
                "hlt",
                "cpuid",
                "msr",
                "other",
                "pending_interrupt",
                "emulated",
                "debug_register",
                "page_fault"
            ]
        );
    }
}
