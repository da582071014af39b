//! A snapshot of every counter of one attached instance, as a root reader sees it at a moment.
//!
//! Each page is mapped through the root's map rules, copied, decoded by the catalog and
//! unmapped. A page the reader may not map (a global page when not the root user) or cannot
//! decode is reported as such, never as zeros.

use hvstats_abi::catalog::{Counter, counters_of};
use hvstats_abi::{ObjectKind, PageView, StatsPage};
use zerocopy::IntoBytes;

use crate::attach::RootReader;
use crate::rules::StatsObject;

/// The counters of one object, or why they could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjectReading {
    /// Every catalog counter of the object's kind with its value, in page order.
    Counters(Vec<(&'static Counter, u64)>),
    /// The page could not be mapped or decoded.
    Unreadable {
        /// True when the reason is file permissions (a global page read by a non-root user).
        permission_denied: bool,
        /// Why, for people.
        reason: String,
    },
}

impl ObjectReading {
    /// The value of the counter named `name`, if read.
    pub fn get(&self, name: &str) -> Option<u64> {
        match self {
            ObjectReading::Counters(values) => values.iter().find(|(c, _)| c.name == name).map(|(_, v)| *v),
            ObjectReading::Unreadable { .. } => None,
        }
    }
}

/// One VP.
#[derive(Clone, Debug)]
pub struct VpSnapshot {
    /// The VP index.
    pub index: u32,
    /// Its counters.
    pub reading: ObjectReading,
}

/// One partition and its VPs.
#[derive(Clone, Debug)]
pub struct PartitionSnapshot {
    /// The partition id.
    pub id: u64,
    /// True while active.
    pub active: bool,
    /// Its counters.
    pub reading: ObjectReading,
    /// Its VPs.
    pub vps: Vec<VpSnapshot>,
}

/// One logical processor.
#[derive(Clone, Debug)]
pub struct LpSnapshot {
    /// The LP index.
    pub index: u32,
    /// The host CPU.
    pub cpu: u32,
    /// Its counters.
    pub reading: ObjectReading,
}

/// Every counter of one instance.
#[derive(Clone, Debug)]
pub struct InstanceSnapshot {
    /// The instance directory's name.
    pub name: String,
    /// The owning process.
    pub pid: u32,
    /// The hypervisor object.
    pub hypervisor: ObjectReading,
    /// The LPs.
    pub lps: Vec<LpSnapshot>,
    /// The partitions.
    pub partitions: Vec<PartitionSnapshot>,
}

/// Decodes `page` as `kind` into every catalog counter of that kind.
pub fn decode(kind: ObjectKind, page: &StatsPage) -> ObjectReading {
    match PageView::read(page.as_bytes(), kind) {
        Ok(view) => ObjectReading::Counters(counters_of(kind).map(|c| (c, view.get(c.id))).collect()),
        Err(e) => {
            ObjectReading::Unreadable { permission_denied: false, reason: format!("malformed page: {e}") }
        }
    }
}

fn read(reader: &mut RootReader, object: StatsObject) -> ObjectReading {
    match reader.read(object) {
        Ok(page) => decode(object.kind(), &page),
        Err(e) => {
            ObjectReading::Unreadable { permission_denied: e.is_permission_denied(), reason: error_chain(&e) }
        }
    }
}

/// An error and all its sources on one line (`outer: cause: root cause`), as reports show it.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Reads every object of the reader's instance, as listed in its manifest.
pub fn take(reader: &mut RootReader) -> InstanceSnapshot {
    let manifest = reader.instance().manifest().clone();
    let hypervisor = read(reader, StatsObject::Hypervisor);
    let lps = manifest
        .logical_processors
        .iter()
        .map(|lp| LpSnapshot {
            index: lp.index,
            cpu: lp.cpu,
            reading: read(reader, StatsObject::LogicalProcessor(lp.index)),
        })
        .collect();
    let partitions = manifest
        .partitions
        .iter()
        .map(|p| PartitionSnapshot {
            id: p.id,
            active: p.active,
            reading: read(reader, StatsObject::Partition(p.id)),
            vps: (0..p.vp_count)
                .map(|index| VpSnapshot { index, reading: read(reader, StatsObject::Vp(p.id, index)) })
                .collect(),
        })
        .collect();
    InstanceSnapshot {
        name: reader.instance().name().to_string(),
        pid: manifest.pid,
        hypervisor,
        lps,
        partitions,
    }
}
