//! The types of a counter: its identity (object kind, group, index), unit, presentation and
//! source. The table of every counter is [`crate::catalog`]; where a counter's value sits in its
//! page is [`crate::page`].

use crate::group::GroupType;
use crate::object::ObjectKind;
use crate::source::Source;

/// The group a counter lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupKind {
    /// The architectural group (`*A_ID` = 2): never changes format.
    Architectural,
    /// The release-specific group (`*V_ID` = 3).
    Release,
    /// hvstats' own group ([`GroupType::HVSTATS`]): the sequence counter and histograms.
    Hvstats,
}

impl GroupKind {
    /// Every group, in page order.
    pub const ALL: [GroupKind; 3] = [GroupKind::Architectural, GroupKind::Release, GroupKind::Hvstats];

    /// The group type written in the header.
    pub const fn group_type(self) -> GroupType {
        match self {
            GroupKind::Architectural => GroupType::ARCHITECTURAL,
            GroupKind::Release => GroupType::RELEASE,
            GroupKind::Hvstats => GroupType::HVSTATS,
        }
    }

    /// The known group kind of a group type.
    pub const fn from_group_type(t: GroupType) -> Option<Self> {
        match t {
            GroupType::ARCHITECTURAL => Some(GroupKind::Architectural),
            GroupType::RELEASE => Some(GroupKind::Release),
            GroupType::HVSTATS => Some(GroupKind::Hvstats),
            _ => None,
        }
    }

    /// Short name: `architectural`, `release` or `hvstats`.
    pub const fn name(self) -> &'static str {
        match self {
            GroupKind::Architectural => "architectural",
            GroupKind::Release => "release",
            GroupKind::Hvstats => "hvstats",
        }
    }
}

/// What one raw 64-bit value measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// A number of events or objects.
    Count,
    /// Time in 100 ns units.
    Time100ns,
    /// Time in nanoseconds.
    Nanoseconds,
    /// Processor cycles.
    Cycles,
    /// 4 KiB pages.
    Pages,
}

impl Unit {
    /// Short name for tables and JSON.
    pub const fn name(self) -> &'static str {
        match self {
            Unit::Count => "count",
            Unit::Time100ns => "100ns",
            Unit::Nanoseconds => "ns",
            Unit::Cycles => "cycles",
            Unit::Pages => "pages",
        }
    }
}

/// How a reader presents a raw value (the perfmon counter type).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Presentation {
    /// A cumulative count shown as a rate per second (perfmon's bulk count, "/sec").
    Rate,
    /// A cumulative time, shown as a total.
    CumulativeTime,
    /// A cumulative time averaged over its paired count, the counter just before it in the same
    /// group ("cost", shown in nanoseconds).
    Cost,
    /// A cumulative time shown as a percentage of elapsed time (perfmon's 100 ns timer, "%").
    PercentTime,
    /// An instantaneous value.
    Instant,
    /// A log2 histogram of times ([`crate::histogram`]): the row's value is the sum of the times,
    /// followed by the bucket counts, [`HISTOGRAM_SLOTS`] slots in all.
    Histogram,
    /// A state at the moment: a code of [`crate::vm_state::VmState`], shown by its name (an
    /// exporter's state set: one series per state, 1 for the current one).
    State,
}

impl Presentation {
    /// Short name for tables and JSON.
    pub const fn name(self) -> &'static str {
        match self {
            Presentation::Rate => "rate",
            Presentation::CumulativeTime => "cumulative-time",
            Presentation::Cost => "cost",
            Presentation::PercentTime => "percent-time",
            Presentation::Instant => "instant",
            Presentation::Histogram => "histogram",
            Presentation::State => "state",
        }
    }
}

/// Whether the KVM backend maintains a counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Maintained {
    /// Maintained from this source; the note says how.
    By(Source, &'static str),
    /// Not maintained on KVM: the counter stays at its place and reads 0. The note says why.
    No(&'static str),
}

impl Maintained {
    /// True when the counter has a source.
    pub const fn is_maintained(self) -> bool {
        matches!(self, Maintained::By(..))
    }

    /// The source, when the counter has one.
    pub const fn source(self) -> Option<Source> {
        match self {
            Maintained::By(source, _) => Some(source),
            Maintained::No(_) => None,
        }
    }

    /// The note: how it is maintained, or why it is not.
    pub const fn note(self) -> &'static str {
        match self {
            Maintained::By(_, note) | Maintained::No(note) => note,
        }
    }
}

/// Identifies one counter: object kind, group, and index within the group (1-based; index 0 is the
/// group header).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterId {
    /// The object kind whose page holds the counter.
    pub kind: ObjectKind,
    /// The group within the page.
    pub group: GroupKind,
    /// The index within the group, as numbered in seed 001.
    pub index: u16,
}

/// One row of the catalog.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counter {
    /// Where the counter lives.
    pub id: CounterId,
    /// The seed's name, e.g. `CPUID instructions/sec`. Also the JSON key.
    pub name: &'static str,
    /// What the raw value measures.
    pub unit: Unit,
    /// How a reader presents it.
    pub presentation: Presentation,
    /// Who maintains it on KVM, or why nobody does.
    pub maintained: Maintained,
    /// How the observer maintains it for VMs hvstats did not start, where that is not the rule
    /// of [`crate::catalog::observed`] applied to `maintained`.
    pub observed_by: Option<Maintained>,
    /// The seed's description (the help text).
    pub description: &'static str,
}
