//! Collectors: the metric families of `/metrics` in named groups an operator turns on and off,
//! as node_exporter's are (`--collector.NAME`, `--no-collector.NAME`, `collect[]=NAME`).
//!
//! A fleet's Prometheus pays for every series a host exports, so the default set carries what
//! the shipped rules, alerts and dashboard read and no more: the essential VP counters, each VM's
//! state and vCPU count, the observer's and the exporter's health. Everything else is one flag
//! away. [`COLLECTORS`] declares every collector once (its name, whether it is on by default,
//! what it holds); [`collector_of`] says which collector a family of [`crate::metrics`] belongs
//! to, and [`ESSENTIAL_VP`] and [`VM_FAMILIES`] name the families the default VP and VM collectors
//! hold.

use std::fmt;

use hvstats_abi::ObjectKind;

use crate::metrics::Family;

/// A named group of metric families.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Collector {
    /// The essential VP counters the mixin reads ([`ESSENTIAL_VP`]).
    Vp,
    /// Every other VP counter, and the intercept time per VP rather than per VM.
    VpDetail,
    /// Each VM's state, liveness, identity, vCPU count and sources.
    Vm,
    /// Every VP's histograms (classic buckets on the text formats, native histograms on
    /// protobuf).
    Histograms,
    /// The histograms of each VM, its VPs summed: the cheaper classic choice.
    HistogramsVm,
    /// The host's logical processors.
    Lp,
    /// The hypervisor page of each publisher (besides the observer's health).
    Hypervisor,
    /// Every other partition counter.
    Partition,
    /// The observer's health: up, last refresh, VMs attached and refused, QMP sessions.
    Observer,
    /// The exporter's own: build, read errors, scrape time, instances up.
    Exporter,
    /// The Microsoft Hypervisor's values the catalog has no counter for (`observe --mshv`).
    Mshv,
    /// Each counter and histogram series' `_created`: when it began counting.
    Created,
}

/// One collector as the flags, the scrape parameters and the documentation show it.
#[derive(Clone, Copy, Debug)]
pub struct CollectorInfo {
    /// The collector.
    pub collector: Collector,
    /// Its name in flags and scrape parameters.
    pub name: &'static str,
    /// On unless turned off.
    pub default: bool,
    /// What it holds.
    pub help: &'static str,
}

/// Every collector, in the order the documentation lists them.
pub const COLLECTORS: [CollectorInfo; 12] = [
    CollectorInfo {
        collector: Collector::Vp,
        name: "vp",
        default: true,
        help: "the essential VP counters: run time, CPU wait, dispatches, exits, hypercalls, \
               intercepts by class (their time per VM), host page faults",
    },
    CollectorInfo {
        collector: Collector::VpDetail,
        name: "vp-detail",
        default: false,
        help: "every other VP counter (APIC, hypercall classes, messages, interrupts, migrations, \
               nested faults, …), and the intercept time per VP",
    },
    CollectorInfo {
        collector: Collector::Vm,
        name: "vm",
        default: true,
        help: "each VM's up, info, state, vCPU count and sources",
    },
    CollectorInfo {
        collector: Collector::Histograms,
        name: "histograms",
        default: false,
        help: "every VP's time histograms: classic buckets on the text formats, native histograms \
               when the scraper negotiates protobuf",
    },
    CollectorInfo {
        collector: Collector::HistogramsVm,
        name: "histograms-vm",
        default: false,
        help: "the time histograms of each VM (its VPs summed, vp=\"all\"), when histograms is off",
    },
    CollectorInfo {
        collector: Collector::Lp,
        name: "lp",
        default: false,
        help: "the host's logical processors: run time, idle states, interrupts",
    },
    CollectorInfo {
        collector: Collector::Hypervisor,
        name: "hypervisor",
        default: false,
        help: "each publisher's hypervisor page: partitions, VPs, pages",
    },
    CollectorInfo {
        collector: Collector::Partition,
        name: "partition",
        default: false,
        help: "every other partition counter (memory, devices, …)",
    },
    CollectorInfo {
        collector: Collector::Observer,
        name: "observer",
        default: true,
        help: "the observer's health: up, last refresh, VMs attached and refused, QMP sessions",
    },
    CollectorInfo {
        collector: Collector::Exporter,
        name: "exporter",
        default: true,
        help: "the exporter's own: build, read errors, scrape duration, instances up",
    },
    CollectorInfo {
        collector: Collector::Mshv,
        name: "mshv",
        default: false,
        help: "the Microsoft Hypervisor's values the catalog has no counter for (observe --mshv)",
    },
    CollectorInfo {
        collector: Collector::Created,
        name: "created",
        default: false,
        help: "each VM counter's and histogram's _created (OpenMetrics; created_timestamp on \
               protobuf): when it began counting, so a reset says itself. A Prometheus that does \
               not read _created stores each as a series of its own",
    },
];

/// The VP families of [`Collector::Vp`], by exposed name: what the shipped rules, alerts and
/// dashboard read of a VP.
pub const ESSENTIAL_VP: [&str; 9] = [
    "hvstats_vp_total_run_seconds_total",
    "hvstats_vp_cpu_wait_seconds_total",
    "hvstats_vp_dispatches_total",
    "hvstats_vp_exits_total",
    "hvstats_vp_hypercalls_total",
    "hvstats_vp_intercepts_total",
    "hvstats_vp_intercept_seconds_total",
    "hvstats_vp_host_page_faults_total",
    "hvstats_vp_host_major_page_faults_total",
];

/// The family of [`Collector::Vp`] exported per VM (its VPs summed, `vp="all"`) unless
/// [`Collector::VpDetail`] is on: the mixin reads its handling times by VM. Its time halted
/// stays per VP (the mixin's time halted per vCPU), never summed.
pub const PER_VM_UNLESS_DETAIL: &str = "hvstats_vp_intercept_seconds_total";

/// The partition-page families of [`Collector::Vm`], by exposed name (the exporter's `vm_up`,
/// `vm_info` and `vm_source_up` are the VM collector's too).
pub const VM_FAMILIES: [&str; 2] = ["hvstats_vm_state", "hvstats_partition_virtual_processors"];

/// The families the exposition makes of its own rather than of a catalog row, by exposed name,
/// and their collectors.
pub const OWN_FAMILIES: [(&str, Collector); 11] = [
    ("hvstats_build_info", Collector::Exporter),
    ("hvstats_read_errors", Collector::Exporter),
    ("hvstats_scrape_duration_seconds", Collector::Exporter),
    ("hvstats_instance_up", Collector::Exporter),
    ("hvstats_vm_up", Collector::Vm),
    ("hvstats_vm_info", Collector::Vm),
    ("hvstats_vm_source_up", Collector::Vm),
    ("hvstats_vm_counting_since_seconds", Collector::Vm),
    ("hvstats_mshv_instance_info", Collector::Mshv),
    ("hvstats_mshv_value", Collector::Mshv),
    ("hvstats_mshv_values_omitted", Collector::Mshv),
];

/// Every family `/metrics` can carry, by the name its series have (`_total` for counters; a
/// histogram's base name, its series adding `_bucket`, `_sum` and `_count`), with its collector
/// and whether it is a histogram.
pub fn exported_families() -> Vec<(String, Collector, bool)> {
    let mut out: Vec<(String, Collector, bool)> =
        OWN_FAMILIES.iter().map(|(name, c)| ((*name).to_owned(), *c, false)).collect();
    out.extend(crate::metrics::families().iter().map(|f| (f.exposed_name(), collector_of(f), false)));
    out.extend(crate::metrics::histogram_families().iter().map(|f| {
        (crate::sink::full_name(&f.name, Some(crate::metrics::BaseUnit::Seconds)), collector_of(f), true)
    }));
    out
}

/// The collectors that export the series named `series` (a histogram's `_bucket` series only
/// with [`Collector::Histograms`] or [`Collector::HistogramsVm`]; its `_sum` and `_count` too);
/// empty when no family has it.
pub fn collectors_of_series(series: &str) -> Vec<Collector> {
    let mut out = Vec::new();
    for (name, collector, histogram) in exported_families() {
        let base = match histogram {
            true => ["_bucket", "_sum", "_count", ""].iter().find_map(|s| series.strip_suffix(s)),
            false => Some(series),
        };
        if base == Some(name.as_str()) {
            if histogram {
                out.extend([Collector::Histograms, Collector::HistogramsVm]);
            } else {
                out.push(collector);
            }
        }
    }
    out
}

impl Collector {
    fn bit(self) -> u16 {
        1 << (self as u16)
    }

    /// The collector's entry in [`COLLECTORS`].
    pub fn info(self) -> &'static CollectorInfo {
        // Every collector has its entry (a test says so); the first is a safe fallback.
        COLLECTORS.iter().find(|c| c.collector == self).unwrap_or(&COLLECTORS[0])
    }

    /// The collector named `name`.
    ///
    /// # Errors
    /// An unknown name, said with the names there are.
    pub fn named(name: &str) -> Result<Self, UnknownCollector> {
        COLLECTORS
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.collector)
            .ok_or_else(|| UnknownCollector(name.into()))
    }
}

/// A collector name that is none of [`COLLECTORS`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown collector {0:?} (collectors: {names})", names = names())]
pub struct UnknownCollector(pub String);

/// The collectors' names, comma-separated.
pub fn names() -> String {
    COLLECTORS.iter().map(|c| c.name).collect::<Vec<_>>().join(", ")
}

/// A set of collectors.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Selection(u16);

impl Selection {
    /// No collector.
    pub const NONE: Self = Self(0);

    /// The collectors on by default.
    pub fn defaults() -> Self {
        COLLECTORS.iter().filter(|c| c.default).fold(Self::NONE, |s, c| s.with(c.collector))
    }

    /// Every collector.
    pub fn all() -> Self {
        COLLECTORS.iter().fold(Self::NONE, |s, c| s.with(c.collector))
    }

    /// The set with `c` in it.
    #[must_use]
    pub fn with(self, c: Collector) -> Self {
        Self(self.0 | c.bit())
    }

    /// The set without `c`.
    #[must_use]
    pub fn without(self, c: Collector) -> Self {
        Self(self.0 & !c.bit())
    }

    /// Whether `c` is in the set.
    pub fn has(self, c: Collector) -> bool {
        self.0 & c.bit() != 0
    }

    /// The collectors in both sets.
    #[must_use]
    pub fn and(self, other: Self) -> Self {
        Self(self.0 & other.0)
    }

    /// The collectors in the set, in [`COLLECTORS`] order.
    pub fn iter(self) -> impl Iterator<Item = Collector> {
        COLLECTORS.iter().map(|c| c.collector).filter(move |c| self.has(*c))
    }

    /// Whether `family` is exported under this set.
    pub fn exports(self, family: &Family) -> bool {
        self.has(collector_of(family))
    }
}

impl fmt::Debug for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter().map(|c| c.info().name)).finish()
    }
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(|c| c.info().name).collect();
        f.write_str(&names.join(","))
    }
}

/// The collector a family of [`crate::metrics::families`] or
/// [`crate::metrics::histogram_families`] belongs to.
pub fn collector_of(family: &Family) -> Collector {
    let name = family.exposed_name();
    if family.members.iter().any(|m| m.counter.presentation == hvstats_abi::Presentation::Histogram) {
        return Collector::Histograms;
    }
    match family.object {
        ObjectKind::Vp if ESSENTIAL_VP.contains(&name.as_str()) => Collector::Vp,
        ObjectKind::Vp => Collector::VpDetail,
        ObjectKind::Partition if VM_FAMILIES.contains(&name.as_str()) => Collector::Vm,
        ObjectKind::Partition => Collector::Partition,
        ObjectKind::LogicalProcessor => Collector::Lp,
        ObjectKind::Hypervisor if name.starts_with("hvstats_observer_") => Collector::Observer,
        ObjectKind::Hypervisor => Collector::Hypervisor,
    }
}

/// Why a scrape's `collect[]`/`exclude[]` parameters cannot be served.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectionError {
    /// A name that is no collector.
    #[error(transparent)]
    Unknown(#[from] UnknownCollector),
    /// A collector the exporter was not started with.
    #[error("collector {0:?} is not enabled on this exporter (serve --collector.{0})")]
    NotEnabled(String),
    /// More parameters than a scrape may have.
    #[error("too many collect[]/exclude[] parameters (at most {MAX_PARAMS})")]
    TooMany,
    /// A parameter that cannot be read.
    #[error("the query is not a form of collect[] and exclude[] parameters: {0}")]
    Malformed(String),
}

/// The most `collect[]` and `exclude[]` parameters a scrape may have.
pub const MAX_PARAMS: usize = 32;

/// The collectors a scrape asks for with `query` (the URL's query, percent-encoded):
/// `collect[]=NAME` keeps only the named collectors of `enabled`, `exclude[]=NAME` leaves them
/// out; other parameters are ignored, as Prometheus' `params` may hold others.
///
/// ```
/// use hvstats_present::collectors::{Collector, Selection, selection_of};
/// let enabled = Selection::defaults().with(Collector::Lp);
/// let asked = selection_of("collect%5B%5D=vp&collect[]=lp", enabled).unwrap();
/// assert_eq!(asked, Selection::NONE.with(Collector::Vp).with(Collector::Lp));
/// assert!(selection_of("collect[]=histograms", enabled).is_err());
/// ```
///
/// # Errors
/// An unknown collector, one not enabled, more than [`MAX_PARAMS`] parameters, or a parameter
/// that is not UTF-8 once decoded.
pub fn selection_of(query: &str, enabled: Selection) -> Result<Selection, SelectionError> {
    let mut collect = Selection::NONE;
    let mut exclude = Selection::NONE;
    let mut any_collect = false;
    let mut count = 0;
    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        let keep = match key.as_ref() {
            "collect[]" => true,
            "exclude[]" => false,
            _ => continue,
        };
        count += 1;
        if count > MAX_PARAMS {
            return Err(SelectionError::TooMany);
        }
        if value.contains('\u{fffd}') {
            return Err(SelectionError::Malformed(format!("{key}={value}")));
        }
        let c = Collector::named(&value)?;
        if !enabled.has(c) {
            return Err(SelectionError::NotEnabled(value.into_owned()));
        }
        if keep {
            any_collect = true;
            collect = collect.with(c);
        } else {
            exclude = exclude.with(c);
        }
    }
    let base = if any_collect { collect } else { enabled };
    Ok(Selection(base.0 & !exclude.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{families, histogram_families};

    #[test]
    fn every_collector_is_in_the_table_once_and_every_family_has_one() {
        let all = [
            Collector::Vp,
            Collector::VpDetail,
            Collector::Vm,
            Collector::Histograms,
            Collector::HistogramsVm,
            Collector::Lp,
            Collector::Hypervisor,
            Collector::Partition,
            Collector::Observer,
            Collector::Exporter,
            Collector::Mshv,
            Collector::Created,
        ];
        for c in all {
            assert_eq!(COLLECTORS.iter().filter(|i| i.collector == c).count(), 1, "{c:?}");
            assert_eq!(Collector::named(c.info().name), Ok(c));
        }
        // The named families exist.
        let names: Vec<String> = families().iter().map(|f| f.exposed_name()).collect();
        for name in ESSENTIAL_VP.iter().chain(&VM_FAMILIES) {
            assert!(names.iter().any(|n| n == name), "{name} is no family");
        }
        for f in families() {
            assert_ne!(collector_of(f), Collector::Histograms, "{}", f.name);
        }
        for f in histogram_families() {
            assert_eq!(collector_of(f), Collector::Histograms, "{}", f.name);
        }
        let err = Collector::named("nope").unwrap_err().to_string();
        assert!(err.contains("\"nope\"") && err.contains("vp-detail") && err.contains("histograms"), "{err}");
    }

    #[test]
    fn scrape_parameters_narrow_the_enabled_set() {
        let enabled = Selection::defaults();
        assert_eq!(selection_of("", enabled), Ok(enabled));
        assert_eq!(selection_of("collect[]=vp", enabled), Ok(Selection::NONE.with(Collector::Vp)));
        assert_eq!(
            selection_of("exclude%5B%5D=exporter&other=1", enabled),
            Ok(enabled.without(Collector::Exporter))
        );
        assert_eq!(
            selection_of("collect[]=vp&collect[]=vm&exclude[]=vm", enabled),
            Ok(Selection::NONE.with(Collector::Vp))
        );
        assert!(matches!(selection_of("collect[]=bogus", enabled), Err(SelectionError::Unknown(_))));
        assert_eq!(selection_of("collect[]=lp", enabled), Err(SelectionError::NotEnabled("lp".into())));
        let many = vec!["exclude[]=vp"; MAX_PARAMS + 1].join("&");
        assert_eq!(selection_of(&many, enabled), Err(SelectionError::TooMany));
        assert!(selection_of("collect[]=%FF", enabled).is_err());
    }
}
