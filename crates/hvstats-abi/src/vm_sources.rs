//! Which source gave each counter of an observed VM, as the VM's partition page carries it.
//!
//! An observer composes several sources for a VM (KVM's tracepoints, the VMM's KVM statistics
//! descriptors, libvirt, QMP, the vCPU threads' files), and the first in its list that gives a
//! counter writes it. Readers in other processes see only the arena, so the partition page says
//! it: rows of hvstats' own group name each source the VM has (up to [`MAX_SOURCES`]), whether it
//! gives counters now, and from when it counts ([`Origin`]); and, 4 bits per counter, which
//! source writes each partition and VP counter. [`SourceTable`] encodes and decodes those rows.
//! A page whose rows are all 0 (our own partitions, an older observer) has no table.

use crate::catalog::{self, CounterId, partition};
use crate::object::ObjectKind;

/// Sources one VM can name: one per row triple of the partition page, as many as a 4-bit source
/// number names (the observer checks at build time that its list of sources fits).
pub const MAX_SOURCES: usize = SOURCE_ROWS.len();
/// Longest source name, in bytes.
pub const NAME_BYTES: usize = 16;

/// The three rows of each source: name, name continued, state. Sources 1 to 6 are hvstats 1.0 of
/// the partition page, 7 to 15 hvstats 1.2: a page of an older observer has no rows for them,
/// and its table decodes with those sources absent.
const SOURCE_ROWS: [[CounterId; 3]; 15] = [
    [partition::SOURCE_1_NAME, partition::SOURCE_1_NAME_2, partition::SOURCE_1_STATE],
    [partition::SOURCE_2_NAME, partition::SOURCE_2_NAME_2, partition::SOURCE_2_STATE],
    [partition::SOURCE_3_NAME, partition::SOURCE_3_NAME_2, partition::SOURCE_3_STATE],
    [partition::SOURCE_4_NAME, partition::SOURCE_4_NAME_2, partition::SOURCE_4_STATE],
    [partition::SOURCE_5_NAME, partition::SOURCE_5_NAME_2, partition::SOURCE_5_STATE],
    [partition::SOURCE_6_NAME, partition::SOURCE_6_NAME_2, partition::SOURCE_6_STATE],
    [partition::SOURCE_7_NAME, partition::SOURCE_7_NAME_2, partition::SOURCE_7_STATE],
    [partition::SOURCE_8_NAME, partition::SOURCE_8_NAME_2, partition::SOURCE_8_STATE],
    [partition::SOURCE_9_NAME, partition::SOURCE_9_NAME_2, partition::SOURCE_9_STATE],
    [partition::SOURCE_10_NAME, partition::SOURCE_10_NAME_2, partition::SOURCE_10_STATE],
    [partition::SOURCE_11_NAME, partition::SOURCE_11_NAME_2, partition::SOURCE_11_STATE],
    [partition::SOURCE_12_NAME, partition::SOURCE_12_NAME_2, partition::SOURCE_12_STATE],
    [partition::SOURCE_13_NAME, partition::SOURCE_13_NAME_2, partition::SOURCE_13_STATE],
    [partition::SOURCE_14_NAME, partition::SOURCE_14_NAME_2, partition::SOURCE_14_STATE],
    [partition::SOURCE_15_NAME, partition::SOURCE_15_NAME_2, partition::SOURCE_15_STATE],
];
/// The rows holding which source writes each partition counter.
const PARTITION_WRITER_ROWS: [CounterId; 3] =
    [partition::PARTITION_WRITERS_1, partition::PARTITION_WRITERS_2, partition::PARTITION_WRITERS_3];
/// The rows holding which source writes each VP counter.
const VP_WRITER_ROWS: [CounterId; 8] = [
    partition::VP_WRITERS_1,
    partition::VP_WRITERS_2,
    partition::VP_WRITERS_3,
    partition::VP_WRITERS_4,
    partition::VP_WRITERS_5,
    partition::VP_WRITERS_6,
    partition::VP_WRITERS_7,
    partition::VP_WRITERS_8,
];
/// Counters per writer row (4 bits each).
const PER_ROW: usize = 16;

/// From when a source's counters count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Origin {
    /// Since the observer attached to the VM (or found the vCPU's thread): what it counts itself.
    Attach,
    /// Since KVM created the vCPU (or the VM): KVM's own statistics, whole-life values.
    VcpuCreation,
    /// Since the first observer attached to the VM: counts the kernel keeps for the VM across
    /// observers (pinned in-kernel counts), which a restarted observer continues.
    Kept,
    /// Since the vCPU's thread started: what the kernel keeps for a thread its whole life (its
    /// run time, CPU wait, dispatches, faults), which survive a new observer. Its time is the
    /// VM's start: a vCPU thread starts after its process, and counted nothing before.
    ThreadStart,
}

impl Origin {
    /// The name surfaces show (`attach`, `vcpu-creation`, `kept`, `thread-start`).
    pub const fn name(self) -> &'static str {
        match self {
            Origin::Attach => "attach",
            Origin::VcpuCreation => "vcpu-creation",
            Origin::Kept => "kept",
            Origin::ThreadStart => "thread-start",
        }
    }

    const fn code(self) -> u64 {
        match self {
            Origin::Attach => 1,
            Origin::VcpuCreation => 2,
            Origin::Kept => 3,
            Origin::ThreadStart => 4,
        }
    }

    const fn from_code(code: u64) -> Option<Self> {
        match code {
            1 => Some(Origin::Attach),
            2 => Some(Origin::VcpuCreation),
            3 => Some(Origin::Kept),
            4 => Some(Origin::ThreadStart),
            _ => None,
        }
    }
}

/// One source of an observed VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceEntry {
    name: [u8; NAME_BYTES],
    /// True while it gives counters (a source whose peer failed, or that gives nothing on this
    /// host, is there but not up).
    pub up: bool,
    /// From when its counters count.
    pub origin: Origin,
}

impl SourceEntry {
    /// A source called `name` (cut to [`NAME_BYTES`] bytes at a character boundary).
    pub fn new(name: &str, up: bool, origin: Origin) -> Self {
        let mut end = name.len().min(NAME_BYTES);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        let mut bytes = [0; NAME_BYTES];
        bytes[..end].copy_from_slice(&name.as_bytes()[..end]);
        Self { name: bytes, up, origin }
    }

    /// Its name (up to the first NUL; a name that is not UTF-8 reads as `?`).
    pub fn name(&self) -> &str {
        let end = self.name.iter().position(|&b| b == 0).unwrap_or(NAME_BYTES);
        core::str::from_utf8(&self.name[..end]).unwrap_or("?")
    }

    const STATE_THERE: u64 = 1;
    const STATE_UP: u64 = 2;

    fn state_word(&self) -> u64 {
        Self::STATE_THERE | if self.up { Self::STATE_UP } else { 0 } | self.origin.code() << 8
    }
}

/// The sources of an observed VM and which of them writes each of its counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceTable {
    sources: [Option<SourceEntry>; MAX_SOURCES],
    /// By partition counter position, the source's number (1-based), 0 for none.
    partition: [u8; PARTITION_WRITER_ROWS.len() * PER_ROW],
    /// By VP counter position, the same.
    vp: [u8; VP_WRITER_ROWS.len() * PER_ROW],
}

impl Default for SourceTable {
    fn default() -> Self {
        Self {
            sources: [None; MAX_SOURCES],
            partition: [0; PARTITION_WRITER_ROWS.len() * PER_ROW],
            vp: [0; VP_WRITER_ROWS.len() * PER_ROW],
        }
    }
}

/// The position of `id` among its kind's counters, in catalog order.
fn position(id: CounterId) -> Option<usize> {
    catalog::position_in_kind(id)
}

impl SourceTable {
    /// Adds a source; returns its number for [`set_writer`](Self::set_writer), `None` when the
    /// table is full.
    pub fn push(&mut self, source: SourceEntry) -> Option<u8> {
        let free = self.sources.iter().position(Option::is_none)?;
        self.sources[free] = Some(source);
        u8::try_from(free + 1).ok()
    }

    /// Records that source `number` writes `counter` (a partition or VP counter); anything else
    /// is ignored.
    pub fn set_writer(&mut self, counter: CounterId, number: u8) {
        let Some(at) = position(counter) else { return };
        let slot = match counter.kind {
            ObjectKind::Partition => self.partition.get_mut(at),
            ObjectKind::Vp => self.vp.get_mut(at),
            _ => None,
        };
        if let Some(slot) = slot {
            *slot = number;
        }
    }

    /// The sources, in the order that decides which writes a counter several give.
    pub fn sources(&self) -> impl Iterator<Item = &SourceEntry> {
        self.sources.iter().flatten()
    }

    /// The source that writes `counter`, if any.
    pub fn writer(&self, counter: CounterId) -> Option<&SourceEntry> {
        let at = position(counter)?;
        let number = match counter.kind {
            ObjectKind::Partition => *self.partition.get(at)?,
            ObjectKind::Vp => *self.vp.get(at)?,
            _ => return None,
        };
        self.sources.get(usize::from(number).checked_sub(1)?)?.as_ref()
    }

    /// The table as the values of its rows of the partition page.
    pub fn rows(&self) -> impl Iterator<Item = (CounterId, u64)> + '_ {
        let sources = SOURCE_ROWS.iter().zip(&self.sources).flat_map(|(rows, source)| {
            let words = match source {
                Some(s) => {
                    let (lo, hi) = s.name.split_at(8);
                    [word(lo), word(hi), s.state_word()]
                }
                None => [0; 3],
            };
            rows.iter().copied().zip(words)
        });
        sources.chain(packed(&PARTITION_WRITER_ROWS, self.partition)).chain(packed(&VP_WRITER_ROWS, self.vp))
    }

    /// Reads the table from a partition page's rows (`value` gives a row's value, `None` when the
    /// page does not carry it); `None` when the page names no source.
    pub fn decode(value: impl Fn(CounterId) -> Option<u64>) -> Option<Self> {
        let mut table = Self::default();
        for (rows, source) in SOURCE_ROWS.iter().zip(table.sources.iter_mut()) {
            let state = value(rows[2]).unwrap_or(0);
            if state & SourceEntry::STATE_THERE == 0 {
                continue;
            }
            let mut name = [0u8; NAME_BYTES];
            name[..8].copy_from_slice(&value(rows[0]).unwrap_or(0).to_le_bytes());
            name[8..].copy_from_slice(&value(rows[1]).unwrap_or(0).to_le_bytes());
            *source = Some(SourceEntry {
                name,
                up: state & SourceEntry::STATE_UP != 0,
                origin: Origin::from_code((state >> 8) & 0xFF).unwrap_or(Origin::Attach),
            });
        }
        if table.sources.iter().all(Option::is_none) {
            return None;
        }
        let unpack = |rows: &[CounterId], out: &mut [u8]| {
            for (&row, chunk) in rows.iter().zip(out.chunks_mut(PER_ROW)) {
                let w = value(row).unwrap_or(0);
                for (i, n) in chunk.iter_mut().enumerate() {
                    *n = ((w >> (4 * i)) & 0xF) as u8;
                }
            }
        };
        unpack(&PARTITION_WRITER_ROWS, &mut table.partition);
        unpack(&VP_WRITER_ROWS, &mut table.vp);
        Some(table)
    }
}

/// From when a partition's counters count, as its page says: when its publisher created the page
/// (an observer: attached to the VM), when the VM's process started, and when the counts the
/// kernel keeps for the VM across observers began, each in microseconds since the Unix epoch. A
/// counter whose writer counts from the vCPU's creation counts from the VM's start, and one whose
/// writer's counts are kept from when they began (the first observer's attach), both outliving
/// an observer; any other from the page's creation, which a new publisher (an observer
/// restarted, a VM attached again) begins anew: that is how a reader tells a reset from a quiet
/// VM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CountOrigins {
    /// When the page was created, in µs since the epoch (`None`: a page of an older publisher).
    pub counting_since_us: Option<u64>,
    /// When the VM's process started, in µs since the epoch (`None`: not an observed VM, or
    /// unknown).
    pub vm_started_us: Option<u64>,
    /// When the counts kept in the kernel across observers began, in µs since the epoch
    /// (`None`: none are kept, or a page of an older publisher).
    pub kept_since_us: Option<u64>,
}

impl CountOrigins {
    /// Reads them from a partition page's rows (`value` as in [`SourceTable::decode`]); a 0 or a
    /// row the page does not carry is unknown.
    pub fn decode(value: impl Fn(CounterId) -> Option<u64>) -> Self {
        let known = |id| value(id).filter(|&v| v != 0);
        Self {
            counting_since_us: known(partition::COUNTING_SINCE),
            vm_started_us: known(partition::VM_STARTED),
            kept_since_us: known(partition::KEPT_SINCE),
        }
    }

    /// When `counter` (a partition or VP counter) began counting, in µs since the epoch, given
    /// the VM's source table: the VM's start for a counter a source counting from the vCPU's
    /// creation writes, the kept counts' beginning for one a source keeping its counts writes
    /// (the page's creation when the page does not say it), else the page's creation; `None`
    /// when the page does not say.
    pub fn of(&self, counter: CounterId, table: Option<&SourceTable>) -> Option<u64> {
        self.of_origin(table.and_then(|t| t.writer(counter)).map_or(Origin::Attach, |s| s.origin))
    }

    /// When the counters of `source` began counting, in µs since the epoch.
    pub fn of_source(&self, source: &SourceEntry) -> Option<u64> {
        self.of_origin(source.origin)
    }

    /// When counters of `origin` began counting, in µs since the epoch.
    fn of_origin(&self, origin: Origin) -> Option<u64> {
        match origin {
            Origin::VcpuCreation | Origin::ThreadStart => self.vm_started_us,
            Origin::Kept => self.kept_since_us.or(self.counting_since_us),
            Origin::Attach => self.counting_since_us,
        }
    }
}

/// Eight bytes as a little-endian word.
fn word(bytes: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(w)
}

/// The writer rows holding `numbers` (4 bits a counter).
fn packed<const N: usize>(
    rows: &'static [CounterId],
    numbers: [u8; N],
) -> impl Iterator<Item = (CounterId, u64)> {
    rows.iter().enumerate().map(move |(r, &row)| {
        let chunk = numbers.get(r * PER_ROW..(r + 1) * PER_ROW).unwrap_or(&[]);
        (row, chunk.iter().enumerate().fold(0u64, |w, (i, &n)| w | u64::from(n & 0xF) << (4 * i)))
    })
}

const _: () = {
    // Every partition and VP counter a source can write has a place in the writer rows (the
    // page's own bookkeeping, such as the source rows themselves, is written by no source).
    let (mut partitions, mut vps, mut i) = (0, 0, 0);
    while i < catalog::CATALOG.len() {
        let counter = &catalog::CATALOG[i];
        let bookkeeping = counter.is_bookkeeping();
        match counter.id.kind {
            ObjectKind::Partition => {
                assert!(bookkeeping || partitions < PARTITION_WRITER_ROWS.len() * PER_ROW);
                partitions += 1;
            }
            ObjectKind::Vp => {
                assert!(bookkeeping || vps < VP_WRITER_ROWS.len() * PER_ROW);
                vps += 1;
            }
            _ => {}
        }
        i += 1;
    }
    assert!(MAX_SOURCES < 16, "a source's number must fit 4 bits");
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::vp;

    #[test]
    fn a_table_round_trips_through_its_rows() {
        let mut table = SourceTable::default();
        let events = table.push(SourceEntry::new("tracepoints", true, Origin::Attach)).unwrap();
        let libvirt = table.push(SourceEntry::new("libvirt", false, Origin::VcpuCreation)).unwrap();
        table.set_writer(vp::CPUID_INSTRUCTIONS, events);
        table.set_writer(vp::HLT_INSTRUCTIONS, libvirt);
        table.set_writer(vp::HOST_MAJOR_PAGE_FAULTS, events);
        table.set_writer(partition::VIRTUAL_TLB_FLUSH_ENTRIES, libvirt);
        let mut page = [0u64; 64];
        let slot = |id: CounterId| id.index as usize;
        for (id, w) in table.rows() {
            page[slot(id)] = w;
        }
        let back = SourceTable::decode(|id| page.get(slot(id)).copied()).unwrap();
        assert_eq!(back, table);
        assert_eq!(back.writer(vp::HLT_INSTRUCTIONS).map(|s| (s.name(), s.up)), Some(("libvirt", false)));
        assert_eq!(back.writer(vp::HOST_MAJOR_PAGE_FAULTS).map(|s| s.origin), Some(Origin::Attach));
        assert_eq!(back.writer(partition::VIRTUAL_TLB_FLUSH_ENTRIES).map(|s| s.name()), Some("libvirt"));
        assert!(back.writer(vp::IO_INSTRUCTIONS).is_none());
        let names: [&str; 2] = [back.sources().next().unwrap().name(), back.sources().nth(1).unwrap().name()];
        assert_eq!(names, ["tracepoints", "libvirt"]);
        assert!(SourceTable::decode(|_| Some(0)).is_none(), "a page naming no source has no table");
    }

    #[test]
    fn a_page_without_the_rows_of_sources_7_to_15_decodes_with_the_sources_it_names() {
        let mut table = SourceTable::default();
        let names = ["stats-fd", "libvirt", "qmp", "tracepoints", "thread", "sixth"];
        let mut number = 0;
        for name in names {
            number = table.push(SourceEntry::new(name, true, Origin::Attach)).unwrap();
        }
        table.set_writer(vp::HLT_INSTRUCTIONS, number);
        let mut page = [0u64; 64];
        for (id, w) in table.rows() {
            page[id.index as usize] = w;
        }
        // An observer of hvstats 1.1 wrote rows up to the VM's state, and none after it.
        let older = |id: CounterId| (id.index <= partition::VM_STATE.index).then(|| page[id.index as usize]);
        let back = SourceTable::decode(older).unwrap();
        assert!(back.sources().map(SourceEntry::name).eq(names));
        assert_eq!(back.writer(vp::HLT_INSTRUCTIONS).map(|s| s.name()), Some("sixth"));
        assert_eq!(back, table);
    }

    #[test]
    fn the_fifteenth_source_round_trips_and_writes_counters() {
        let mut table = SourceTable::default();
        let names = [
            "s1",
            "s2",
            "s3",
            "s4",
            "s5",
            "s6",
            "s7",
            "s8",
            "s9",
            "s10",
            "s11",
            "s12",
            "s13",
            "s14",
            "source-15",
        ];
        assert_eq!(names.len(), MAX_SOURCES);
        let mut last = 0;
        for (n, name) in names.iter().enumerate() {
            last = table.push(SourceEntry::new(name, n % 2 == 1, Origin::Attach)).unwrap();
        }
        assert_eq!(usize::from(last), MAX_SOURCES);
        table.set_writer(vp::CPUID_INSTRUCTIONS, last);
        table.set_writer(partition::VM_STATE, last);
        let mut page = [0u64; 64];
        for (id, w) in table.rows() {
            page[id.index as usize] = w;
        }
        let back = SourceTable::decode(|id| page.get(id.index as usize).copied()).unwrap();
        assert_eq!(back, table);
        let fifteenth = back.writer(vp::CPUID_INSTRUCTIONS).unwrap();
        assert_eq!((fifteenth.name(), fifteenth.up), ("source-15", false));
        assert_eq!(back.writer(partition::VM_STATE).map(|s| s.name()), Some("source-15"));
    }

    #[test]
    fn a_long_name_is_cut_and_a_full_table_takes_no_more() {
        let mut table = SourceTable::default();
        let long = SourceEntry::new("a-name-longer-than-sixteen", true, Origin::Attach);
        assert_eq!(long.name(), "a-name-longer-th");
        for _ in 0..MAX_SOURCES {
            assert!(table.push(long).is_some());
        }
        assert!(table.push(long).is_none());
    }

    #[test]
    fn a_counter_counts_from_its_writers_origin() {
        let mut table = SourceTable::default();
        let events = table.push(SourceEntry::new("tracepoints", true, Origin::Attach)).unwrap();
        let qmp = table.push(SourceEntry::new("qmp", true, Origin::VcpuCreation)).unwrap();
        let thread = table.push(SourceEntry::new("thread", true, Origin::ThreadStart)).unwrap();
        table.set_writer(vp::IO_INSTRUCTIONS, events);
        table.set_writer(vp::HLT_INSTRUCTIONS, qmp);
        table.set_writer(vp::DISPATCHES, thread);
        let mut page = [0u64; 64];
        page[partition::COUNTING_SINCE.index as usize] = 2_000;
        page[partition::VM_STARTED.index as usize] = 1_000;
        let origins = CountOrigins::decode(|id| page.get(id.index as usize).copied());
        assert_eq!(origins.of(vp::IO_INSTRUCTIONS, Some(&table)), Some(2_000));
        assert_eq!(origins.of(vp::HLT_INSTRUCTIONS, Some(&table)), Some(1_000));
        assert_eq!(origins.of(vp::DISPATCHES, Some(&table)), Some(1_000), "a thread starts with its VM");
        let back = SourceTable::decode(|id| Some(table.rows().find(|(r, _)| *r == id).map_or(0, |(_, v)| v)));
        assert_eq!(back.and_then(|t| t.writer(vp::DISPATCHES).map(|s| s.origin)), Some(Origin::ThreadStart));
        assert_eq!(
            origins.of(vp::CPUID_INSTRUCTIONS, Some(&table)),
            Some(2_000),
            "no writer: the page's creation"
        );
        assert_eq!(origins.of(vp::HLT_INSTRUCTIONS, None), Some(2_000));
        let older = CountOrigins::decode(|id| (id.index < 31).then_some(5));
        assert_eq!(older, CountOrigins::default(), "a page of an older minor says nothing");
    }

    #[test]
    fn a_kept_origin_round_trips_through_its_source_row() {
        let mut table = SourceTable::default();
        let kept = table.push(SourceEntry::new("tracepoints", true, Origin::Kept)).unwrap();
        table.push(SourceEntry::new("thread-clock", true, Origin::Attach)).unwrap();
        table.set_writer(vp::IO_INSTRUCTIONS, kept);
        let mut page = [0u64; 64];
        for (id, w) in table.rows() {
            page[id.index as usize] = w;
        }
        assert_eq!(page[partition::SOURCE_1_STATE.index as usize] >> 8, 3, "kept is code 3");
        let back = SourceTable::decode(|id| page.get(id.index as usize).copied()).unwrap();
        assert_eq!(back, table);
        assert_eq!(
            back.writer(vp::IO_INSTRUCTIONS).map(|s| (s.name(), s.origin)),
            Some(("tracepoints", Origin::Kept))
        );
        assert_eq!(Origin::Kept.name(), "kept");
        // A code this build does not know reads as counting from attach, the origin that claims
        // the least.
        page[partition::SOURCE_1_STATE.index as usize] = 0x5_03;
        let unknown = SourceTable::decode(|id| page.get(id.index as usize).copied()).unwrap();
        assert_eq!(unknown.writer(vp::IO_INSTRUCTIONS).map(|s| s.origin), Some(Origin::Attach));
    }

    #[test]
    fn a_kept_counter_counts_from_when_its_counts_began_else_from_the_page() {
        let mut table = SourceTable::default();
        let kept = table.push(SourceEntry::new("tracepoints", true, Origin::Kept)).unwrap();
        let clock = table.push(SourceEntry::new("thread-clock", true, Origin::Attach)).unwrap();
        let qmp = table.push(SourceEntry::new("qmp", true, Origin::VcpuCreation)).unwrap();
        table.set_writer(vp::IO_INSTRUCTIONS, kept);
        table.set_writer(vp::TOTAL_RUN_TIME, clock);
        table.set_writer(vp::HLT_INSTRUCTIONS, qmp);
        let mut page = [0u64; 64];
        page[partition::COUNTING_SINCE.index as usize] = 3_000;
        page[partition::VM_STARTED.index as usize] = 1_000;
        page[partition::KEPT_SINCE.index as usize] = 2_000;
        let origins = CountOrigins::decode(|id| page.get(id.index as usize).copied());
        assert_eq!(origins.kept_since_us, Some(2_000));
        assert_eq!(origins.of(vp::IO_INSTRUCTIONS, Some(&table)), Some(2_000));
        assert_eq!(origins.of(vp::TOTAL_RUN_TIME, Some(&table)), Some(3_000));
        assert_eq!(origins.of(vp::HLT_INSTRUCTIONS, Some(&table)), Some(1_000));
        assert!(table.sources().map(|s| origins.of_source(s)).eq([Some(2_000), Some(3_000), Some(1_000)]));
        // No time kept (0, or a page of hvstats 1.3 without the row): the page's creation, never
        // an origin older than the counts can prove.
        page[partition::KEPT_SINCE.index as usize] = 0;
        let unknown = CountOrigins::decode(|id| page.get(id.index as usize).copied());
        assert_eq!(unknown.kept_since_us, None);
        assert_eq!(unknown.of(vp::IO_INSTRUCTIONS, Some(&table)), Some(3_000));
        let older = CountOrigins::decode(|id| {
            (id.index < partition::KEPT_SINCE.index).then(|| page[id.index as usize])
        });
        assert_eq!(older.of_source(table.sources().next().unwrap()), Some(3_000));
    }
}
