//! In-kernel counting of tracepoints on chosen threads: one program per tracepoint, one row of
//! counters per thread.
//!
//! An [`Engine`] is made for a list of columns (a tracepoint, narrowed by a filter or not). It
//! loads one program per distinct tracepoint, attached for the life of the engine, and two maps:
//! the thread table (thread id → process id and slot) and the rows (slot → one `u64` per column).
//! Counting a thread is one map write ([`Engine::add_thread`]); reading it is one map read. The
//! cost a firing pays is one program, however many columns it
//! classifies into and however many threads are counted — the reason this exists: a perf
//! counter per (thread, column) is evaluated on every firing, so the cost grows with each one.
//!
//! An engine holds as many threads as its rows: [`rows_for_host`] sizes it for the host (at least
//! [`MIN_ROWS`], at most [`MAX_ROWS`], within the process's memory limit). A row is one thread's,
//! not one per CPU (only the thread's own programs add to it, one at a time), so a row costs the
//! same on any number of CPUs. Past its rows, [`Engine::add_thread`] says [`EngineError::Full`],
//! and the caller counts the thread otherwise.
//!
//! An engine may also time spans ([`SpanColumn`], [`Engine::with_spans`]): from a firing of one
//! tracepoint, classified by its filter, to the next firing of another on the same thread, each
//! span's nanoseconds added to its column — `kvm_exit` by exit reason until `kvm_entry` is the
//! time KVM spends in the kernel on each class of exit. The programs stay one per tracepoint.
//!
//! An engine may also be a rehearsal ([`Engine::rehearsal`]): the same programs, made from formats
//! given as text and attached nowhere, each run by the kernel on a record of the caller's making
//! ([`Engine::fire`], `BPF_PROG_TEST_RUN`) as a firing of its tracepoint on the calling thread
//! would run it. A tracepoint that never fires on this host (`kvm_exit` without VMX or SVM) is
//! tested so through the very program the observer attaches to it.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::filter::Fields;
use super::filter::{self, FilterError, Pred};
use super::keep::{self, Owner};
use super::program::{self, Carried, Carry, Column, Latch, Spans};
use super::raw;
use super::sys::{ArrayMap, Attachment, Attachments, LoadError, Program};
use crate::tracefs::{self, EventError};

/// One column: a tracepoint, narrowed by an ftrace filter when given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TracepointColumn {
    /// The tracepoint's system (`kvm`).
    pub system: String,
    /// The event (`kvm_userspace_exit`).
    pub name: String,
    /// An ftrace filter (`reason == 2`).
    pub filter: Option<String>,
}

/// A span column: the nanoseconds from each firing of `start` (that its filter admits) to the
/// next firing of `end` on the same thread, summed. Spans of one engine are exclusive: a thread
/// has one open span at most, and a start while one is open restarts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpanColumn {
    /// The tracepoint that opens the span, narrowed by its filter (`kvm:kvm_exit`,
    /// `exit_reason == 10`).
    pub start: TracepointColumn,
    /// The tracepoint's system that closes it (`kvm`).
    pub end_system: String,
    /// The tracepoint that closes it (`kvm_entry`).
    pub end_name: String,
}

/// A carried column: each firing of `counted` (that its filter admits) adds what the thread's
/// last firing of `from` left: the value of its `weight` field (or 1) when `from`'s filter admitted
/// it, else 0. So a record that does not say what its work was (`kvm_hv_flush_tlb` names no
/// hypercall code nor rep count) is counted by the record before it on the same thread
/// (`kvm_hv_hypercall`'s `code` and `rep_cnt`). Counted in the kernel only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CarriedColumn {
    /// The tracepoint whose firings add, narrowed by its filter (`kvm:kvm_hv_flush_tlb`,
    /// `flags & 2`).
    pub counted: TracepointColumn,
    /// The tracepoint whose last firing on the thread says what is added, narrowed by its filter
    /// (`kvm:kvm_hv_hypercall`, `code == 0x3 || code == 0x14`).
    pub from: TracepointColumn,
    /// The field of `from`'s record added (`rep_cnt`); `None`: one.
    pub weight: Option<String>,
}

/// The columns of an engine's rows: counting columns, then spans, then carried columns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineLayout {
    /// Counting columns.
    pub counted: Vec<TracepointColumn>,
    /// Span columns.
    pub spans: Vec<SpanColumn>,
    /// Carried columns.
    pub carried: Vec<CarriedColumn>,
    /// Threads counted at most (rows); `None`: as many as this host is sized for
    /// ([`rows_for_host`]).
    pub rows: Option<u32>,
}

/// Why an engine, or one of its tracepoints, cannot count in the kernel.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A map could not be created (no CAP_BPF, a locked-down kernel, no memory).
    #[error("cannot create a BPF map")]
    Map(#[source] io::Error),
    /// A tracepoint's format or id cannot be read.
    #[error("tracepoint {tracepoint}")]
    Format {
        /// `system:name`.
        tracepoint: String,
        /// The read error.
        #[source]
        source: EventError,
    },
    /// A filter is outside what the program can evaluate.
    #[error("filter {filter:?} on {tracepoint}")]
    Filter {
        /// `system:name`.
        tracepoint: String,
        /// The filter.
        filter: String,
        /// Why.
        #[source]
        source: FilterError,
    },
    /// The program could not be assembled.
    #[error("cannot assemble the program of {0}")]
    Assemble(String),
    /// The kernel refused the program.
    #[error("loading the program of {tracepoint}")]
    Load {
        /// `system:name`.
        tracepoint: String,
        /// The refusal.
        #[source]
        source: LoadError,
    },
    /// The program could not be attached.
    #[error("attaching the program of {tracepoint}")]
    Attach {
        /// `system:name`.
        tracepoint: String,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
    /// Every slot is taken.
    #[error("all {0} slots of the in-kernel counters are in use")]
    Full(u32),
    /// A rehearsal was given no format for a tracepoint of its columns.
    #[error("no format for tracepoint {0}")]
    NoFormat(String),
    /// A tracepoint has no program to fire: the engine is not a rehearsal, or does not count it.
    #[error("tracepoint {0} has no rehearsed program")]
    NotRehearsed(String),
    /// The kernel did not run the program.
    #[error("running the program of {tracepoint}")]
    Run {
        /// `system:name`.
        tracepoint: String,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
}

/// What a tracepoint's program reads as its context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Context {
    /// The tracepoint's record, laid out as its tracefs format says (a tracepoint program).
    Record,
    /// The tracepoint's arguments, one `u64` each (a raw tracepoint program).
    Arguments,
}

/// A tracepoint: (system, name).
type Tracepoint = (String, String);

/// Where an engine's programs run.
#[derive(Debug)]
enum Programs {
    /// Attached to the kernel's tracepoints, for the life of the engine (dropping them detaches).
    Attached { _attachments: Attachments },
    /// Attached nowhere: run on records given to [`Engine::fire`].
    Rehearsal(BTreeMap<Tracepoint, (Program, Context)>),
}

/// What [`Engine::claim`] found for a thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Its kept row, adopted.
    Adopted(Slot),
    /// No kept row of it (or a row of another thread or process under its id, dropped).
    Nothing,
    /// A kept row of the same thread when it ran another VM object (or one not told): dropped,
    /// its counts not this VM's.
    OtherVm,
}

/// A counted thread's place in the rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Slot(u32);

/// The programs, maps and slots of one column list.
#[derive(Debug)]
pub struct Engine {
    store: Store,
    programs: Programs,
    /// Where the maps and links are pinned, when they are kept beyond this process.
    kept: Option<Kept>,
}

/// An engine but its programs: the maps its programs write and the slots they count in, made
/// by [`Engine::build`].
#[derive(Debug)]
struct Store {
    /// Rows: threads counted at most.
    capacity: u32,
    columns: usize,
    /// Why each column is not counted in the kernel (its tracepoint could not be), if so.
    refused: Vec<Option<String>>,
    threads: ArrayMap,
    table: ThreadTable,
    rows: ArrayMap,
    /// Per slot and lane, the open span (time, column + 1), when the engine has span columns.
    pending: Option<ArrayMap>,
    /// Lanes of open spans (one per tracepoint that closes spans).
    lanes: usize,
    /// Per slot, one `u64` per carried column, when the engine has any.
    latches: Option<ArrayMap>,
    /// Carried columns.
    carried: usize,
    free: Mutex<Slots>,
}

/// An engine's pins: its directory, and the owner of each row.
#[derive(Debug)]
struct Kept {
    dir: std::path::PathBuf,
    owners: ArrayMap,
}

/// What a kept engine's maker found: how many rows it adopted, how many it dropped, and why.
#[derive(Debug, Default)]
pub struct Adoption {
    /// Rows adopted: threads still alive, counted by the programs while no observer ran.
    pub adopted: usize,
    /// What was dropped, and why (a process gone, another version of the programs).
    pub notes: Vec<String>,
}

#[derive(Debug)]
struct Slots {
    free: Vec<u32>,
    /// Threads [`Engine::add_thread`] found no free row for.
    turned_away: usize,
    /// Slot of each thread counted, and how many counted it ([`Engine::add_thread`] calls not yet
    /// matched by [`Engine::remove_thread`]).
    used: BTreeMap<u32, (u32, usize)>,
    /// Rows a kept engine adopted and no one has claimed yet, by thread id: slot and owner.
    adopted: BTreeMap<u32, (u32, Owner)>,
    /// By slot in use, since when its row counts (µs since the epoch), when the engine is kept.
    since: BTreeMap<u32, u64>,
    /// The thread id of the adopted row last asked whether its thread is gone.
    asked_to: u32,
}

/// Adopted rows an observer's refresh asks whether their thread is gone
/// ([`Engine::drop_some_gone`]): 4,096 rows (1,000 VMs of 4 vCPUs, left out by a filter) are
/// all asked within 16 refreshes.
const ADOPTED_CHECKED: usize = 256;

/// Columns an engine counts at most (a row's offsets must fit the instructions' 16 bits).
pub const MAX_COLUMNS: usize = 1024;

/// Rows (counted threads) an engine sized for its host holds at least: a host of 1,000 VMs of
/// 4 vCPUs each has every vCPU thread counted in the kernel.
pub const MIN_ROWS: u32 = 4096;

/// Rows an engine sized for its host holds per possible CPU, above [`MIN_ROWS`]: 16 vCPU
/// threads per hardware thread is beyond the overcommit of any host that runs its vCPUs.
pub const ROWS_PER_CPU: u32 = 16;

/// Rows an engine sized for its host holds at most (the documented ceiling): 65,536 threads.
pub const MAX_ROWS: u32 = 1 << 16;

/// The share of the observer's memory limit (its cgroup's `memory.max`, or the host's memory)
/// an engine sized for its host may take for its maps: one eighth.
const MEMORY_SHARE: u64 = 8;

/// Rows an engine of `layout` holds on this host: [`ROWS_PER_CPU`] per possible CPU, or twice
/// the threads the host runs now where that is more (a host already running more vCPU threads
/// than its CPUs' share has each of them counted, and room for as many again), at least
/// [`MIN_ROWS`] and at most [`MAX_ROWS`], and no more than an eighth of this process's memory
/// limit holds (the rows are not per CPU, so a row costs the same on a host of 768 CPUs as on
/// one of 2: its columns, open spans, carried values, owner and thread entry).
pub fn rows_for_host(layout: &EngineLayout) -> u32 {
    let cpus = super::sys::possible_cpus().unwrap_or(1) as u32;
    rows_wanted(cpus, host_threads().unwrap_or(0), rows_affordable(layout))
}

/// The most rows engines of `layout` hold together on this host, those grown beside a full
/// one included: [`MAX_ROWS`], and no more than an eighth of this process's memory limit holds.
pub fn rows_allowed(layout: &EngineLayout) -> u32 {
    MAX_ROWS.min(u32::try_from(rows_affordable(layout)).unwrap_or(u32::MAX))
}

/// Rows of `layout` an eighth of this process's memory limit holds.
fn rows_affordable(layout: &EngineLayout) -> u64 {
    super::limits::memory_bytes().map_or(u64::MAX, |limit| limit / MEMORY_SHARE) / layout.row_bytes().max(1)
}

/// Rows for a host of `cpus` possible CPUs running `threads` threads, where `afford` rows fit
/// the memory allowed (see [`rows_for_host`]).
fn rows_wanted(cpus: u32, threads: u32, afford: u64) -> u32 {
    let wanted = cpus.saturating_mul(ROWS_PER_CPU).max(threads.saturating_mul(2)).clamp(MIN_ROWS, MAX_ROWS);
    wanted.min(u32::try_from(afford).unwrap_or(u32::MAX)).max(1)
}

/// The threads the host runs now (every task, the kernel's own too): the number after the
/// slash in the fourth field of `/proc/loadavg`.
fn host_threads() -> Option<u32> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    text.split_whitespace().nth(3)?.split_once('/')?.1.parse().ok()
}

/// The largest `pid_max` whose thread table is an array indexed by thread id (8 bytes a thread
/// id: 512 KiB); above it, a hash of the counted threads (a lookup costs a hash, not an index).
pub const ARRAY_PID_MAX: u32 = 1 << 16;

/// How the programs find a thread's slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadTable {
    /// An array indexed by thread id (`pid_max` entries).
    Array,
    /// A hash keyed by thread id (one entry per row).
    Hash,
}

impl ThreadTable {
    /// The table for this host: an array where `pid_max` is at most [`ARRAY_PID_MAX`], else a
    /// hash.
    pub fn for_host() -> Self {
        if pid_max() <= ARRAY_PID_MAX { ThreadTable::Array } else { ThreadTable::Hash }
    }
}

impl Engine {
    /// Loads and attaches the programs of `columns`, tracepoints read from tracefs at `tracefs`.
    /// A tracepoint whose program cannot be made is not counted here (see
    /// [`refused`](Self::refused)); the others are.
    ///
    /// # Errors
    /// When the maps cannot be created (BPF not permitted) or no tracepoint can be counted.
    pub fn new(tracefs: &Path, columns: &[TracepointColumn]) -> Result<Self, EngineError> {
        Self::with_table(tracefs, columns, ThreadTable::for_host())
    }

    /// As [`new`](Self::new), with the thread table `table`.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_table(
        tracefs: &Path,
        columns: &[TracepointColumn],
        table: ThreadTable,
    ) -> Result<Self, EngineError> {
        Self::with_spans(tracefs, columns, &[], table)
    }

    /// As [`with_table`](Self::with_table), with span columns after the counting ones: column
    /// `columns.len() + i` of a row is the nanoseconds of `spans[i]`.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_spans(
        tracefs: &Path,
        counted: &[TracepointColumn],
        spans: &[SpanColumn],
        table: ThreadTable,
    ) -> Result<Self, EngineError> {
        let layout =
            EngineLayout { counted: counted.to_vec(), spans: spans.to_vec(), ..EngineLayout::default() };
        Self::of_layout(tracefs, &layout, table)
    }

    /// As [`with_spans`](Self::with_spans), with carried columns after the spans: column
    /// `counted + spans + i` of a row is `layout.carried[i]`'s sum.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn of_layout(tracefs: &Path, layout: &EngineLayout, table: ThreadTable) -> Result<Self, EngineError> {
        let (parts, attachments) = Self::build(layout, table, |system, name, roles, columns, maps| {
            attach_one(tracefs, system, name, roles, columns, maps, false)
        })?;
        Ok(parts.into_engine(Programs::Attached {
            _attachments: attachments.into_iter().map(|(_, a)| a).collect(),
        }))
    }

    /// As [`of_layout`](Self::of_layout), with the maps and links kept in bpffs in `identity`
    /// ([`keep::identity_dir`]): the kept engine of the same layout found there is adopted (its
    /// programs went on counting; [`claim`](Self::claim) takes a thread's row back), kept engines
    /// of another layout or version are dropped, and a new one is pinned there otherwise. Where
    /// pinning fails, the engine counts without keeping; the [`Adoption`]'s notes say what was
    /// dropped and why.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn kept(
        tracefs: &Path,
        layout: &EngineLayout,
        table: ThreadTable,
        identity: &Path,
    ) -> Result<(Self, Adoption), EngineError> {
        let dir = Self::kept_dir(layout, table, identity, 0);
        let mut adoption = Adoption::default();
        let dropped = keep::drop_other_layouts(identity, &dir);
        if dropped > 0 {
            adoption.notes.push(format!(
                "dropped the counts kept in {} by {dropped} other version or layout of the programs",
                identity.display()
            ));
        }
        Self::kept_at(tracefs, layout, table, dir, adoption)
    }

    /// The `n`th engine grown beside the kept engine of `layout` in `identity` (from 1: an engine
    /// of the same programs and columns, made when the rows of those before it were all in use),
    /// kept beside it: the one an earlier process kept there is adopted, else a new one is
    /// pinned. [`kept`](Self::kept) keeps the engines grown beside the one it makes or adopts.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn kept_grown(
        tracefs: &Path,
        layout: &EngineLayout,
        table: ThreadTable,
        identity: &Path,
        n: u32,
    ) -> Result<(Self, Adoption), EngineError> {
        Self::kept_at(tracefs, layout, table, Self::kept_dir(layout, table, identity, n), Adoption::default())
    }

    /// True when an earlier process kept an `n`th engine grown beside the kept engine of
    /// `layout` in `identity` (see [`kept_grown`](Self::kept_grown)).
    pub fn is_kept_grown(layout: &EngineLayout, table: ThreadTable, identity: &Path, n: u32) -> bool {
        Self::kept_dir(layout, table, identity, n).is_dir()
    }

    /// Where the kept engine of `layout` is kept in `identity` (`n` 0), or the `n`th grown
    /// beside it.
    fn kept_dir(layout: &EngineLayout, table: ThreadTable, identity: &Path, n: u32) -> PathBuf {
        // The rows are not in the name: kept rows are adopted whatever this host's size now.
        let name = format!("{:?} {:?} {:?} {table:?}", layout.counted, layout.spans, layout.carried);
        let dir = keep::layout_dir(identity, &name);
        match n {
            0 => dir,
            n => keep::grown_dir(&dir, n),
        }
    }

    /// The engine kept in `dir`, adopted, or a new one pinned there.
    fn kept_at(
        tracefs: &Path,
        layout: &EngineLayout,
        table: ThreadTable,
        dir: PathBuf,
        mut adoption: Adoption,
    ) -> Result<(Self, Adoption), EngineError> {
        if dir.is_dir() {
            match Self::adopt(layout, table, &dir) {
                Ok(engine) => {
                    let gone = engine.drop_gone();
                    adoption.adopted = engine.unclaimed();
                    if gone > 0 {
                        adoption.notes.push(format!(
                            "dropped the kept counts of {gone} thread(s) gone while no observer ran"
                        ));
                    }
                    return Ok((engine, adoption));
                }
                Err(why) => {
                    adoption.notes.push(format!("dropped the counts kept in {}: {why}", dir.display()));
                    keep::remove_tree(&dir);
                }
            }
        }
        let (parts, attachments) = Self::build(layout, table, |system, name, roles, columns, maps| {
            attach_one(tracefs, system, name, roles, columns, maps, true)
        })?;
        let kept = match pin(&parts, &attachments, &dir) {
            Ok(owners) => Some(Kept { dir, owners }),
            Err(e) => {
                keep::remove_tree(&dir);
                adoption.notes.push(format!(
                    "counts are not kept beyond this process: pinning in {} failed: {e}",
                    dir.display()
                ));
                None
            }
        };
        let mut engine = parts.into_engine(Programs::Attached {
            _attachments: attachments.into_iter().map(|(_, a)| a).collect(),
        });
        engine.kept = kept;
        Ok((engine, adoption))
    }

    /// The kept engine pinned in `dir`: its maps, opened and checked against the layout's, and
    /// its rows' owners; a tracepoint whose link is not there is not counted.
    fn adopt(layout: &EngineLayout, table: ThreadTable, dir: &Path) -> Result<Self, String> {
        // The kept engine's rows, whatever this host would size a new one at: its counts go on.
        let kept_rows =
            ArrayMap::open_pinned(&dir.join("owners")).map_err(|e| format!("owners: {e}"))?.entries();
        let layout = &EngineLayout { rows: Some(kept_rows), ..layout.clone() };
        let (mut parts, _) = Self::build(layout, table, |system, name, _, _, _| {
            if dir.join(format!("link:{system}:{name}")).exists() {
                Ok(())
            } else {
                Err(EngineError::Attach {
                    tracepoint: format!("{system}:{name}"),
                    source: io::Error::new(io::ErrorKind::NotFound, "no program of it is kept"),
                })
            }
        })
        .map_err(|e| error_text(&e))?;
        let open =
            |map: &ArrayMap, name: &str| map.pinned_like(&dir.join(name)).map_err(|e| format!("{name}: {e}"));
        parts.threads = open(&parts.threads, "threads")?;
        parts.rows = open(&parts.rows, "rows")?;
        if let Some(pending) = &parts.pending {
            parts.pending = Some(open(pending, "pending")?);
        }
        if let Some(latches) = &parts.latches {
            parts.latches = Some(open(latches, "latches")?);
        }
        let owners = open(&keep::owners_map(kept_rows).map_err(|e| e.to_string())?, "owners")?;
        for slot in 0..kept_rows {
            if let Some(owner) = owners.read(slot).ok().and_then(|v| Owner::decode(&v)) {
                parts
                    .free
                    .get_mut()
                    .unwrap_or_else(|e| e.into_inner())
                    .adopted
                    .insert(owner.tid, (slot, owner));
            }
        }
        let slots = parts.free.get_mut().unwrap_or_else(|e| e.into_inner());
        let taken: std::collections::BTreeSet<u32> = slots.adopted.values().map(|&(s, _)| s).collect();
        slots.free.retain(|s| !taken.contains(s));
        let mut engine = parts.into_engine(Programs::Attached { _attachments: Attachments::default() });
        engine.kept = Some(Kept { dir: dir.to_owned(), owners });
        Ok(engine)
    }

    /// An engine whose programs are attached nowhere: made as [`with_spans`](Self::with_spans)
    /// would make them, from the formats `format(system, name)` gives (as tracefs prints them),
    /// and run on records of the caller's making by [`fire`](Self::fire). A tracepoint without a
    /// format, or whose program the kernel refuses, is not counted (see
    /// [`refused`](Self::refused)).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn rehearsal(
        format: &dyn Fn(&str, &str) -> Option<String>,
        counted: &[TracepointColumn],
        spans: &[SpanColumn],
        table: ThreadTable,
    ) -> Result<Self, EngineError> {
        let layout =
            EngineLayout { counted: counted.to_vec(), spans: spans.to_vec(), ..EngineLayout::default() };
        Self::rehearse(format, &layout, table)
    }

    /// As [`rehearsal`](Self::rehearsal), for every column of `layout` (carried ones too).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn rehearse(
        format: &dyn Fn(&str, &str) -> Option<String>,
        layout: &EngineLayout,
        table: ThreadTable,
    ) -> Result<Self, EngineError> {
        let (parts, programs) = Self::build(layout, table, |system, name, roles, columns, maps| {
            rehearse_one(format, system, name, roles, columns, maps)
        })?;
        Ok(parts.into_engine(Programs::Rehearsal(programs.into_iter().collect())))
    }

    /// The maps of `layout`'s columns, and a program for each tracepoint, made by `place`.
    fn build<P>(
        layout: &EngineLayout,
        table: ThreadTable,
        mut place: impl FnMut(&str, &str, &Roles, &[TracepointColumn], &Maps<'_>) -> Result<P, EngineError>,
    ) -> Result<(Store, Vec<(Tracepoint, P)>), EngineError> {
        let EngineLayout { counted, spans, carried, .. } = layout;
        let width = counted.len() + spans.len() + carried.len();
        if width > MAX_COLUMNS {
            return Err(EngineError::Assemble(format!("{width} columns (at most {MAX_COLUMNS})")));
        }
        let lanes = Lanes::of(spans);
        let columns = layout.columns();
        let rows = layout.rows.unwrap_or_else(|| rows_for_host(layout));
        let store = Store::create(&columns, &lanes, carried.len(), table, rows)?;
        let first_carried = counted.len() + spans.len();
        let maps = Maps {
            threads: &store.threads,
            rows: &store.rows,
            pending: store.pending.as_ref(),
            latches: store.latches.as_ref(),
            carried,
            first_carried,
            width,
        };
        let mut refused = vec![None; columns.len()];
        let mut placed = Vec::new();
        let mut first_error = None;
        for ((system, name), roles) in layout.roles(&lanes) {
            match place(system, name, &roles, &columns, &maps) {
                Ok(p) => placed.push(((system.to_owned(), name.to_owned()), p)),
                Err(e) => {
                    layout.refuse(&mut refused, (system, name), &roles, &error_text(&e));
                    first_error.get_or_insert(e);
                }
            }
        }
        if placed.is_empty()
            && let Some(e) = first_error
        {
            return Err(e);
        }
        Ok((Store { refused, ..store }, placed))
    }

    /// Runs the program of `system:name` once on this thread, with `context` as what it reads
    /// ([`context`](Self::context): the record, laid out as its format says, or the arguments),
    /// as a firing of the tracepoint on this thread would; returns what the program returned.
    ///
    /// # Errors
    /// When the engine is not a rehearsal or has no program for the tracepoint, or the kernel does
    /// not run it (a context longer than 96 bytes, or shorter than what the program reads).
    pub fn fire(&self, system: &str, name: &str, context: &[u8]) -> Result<u32, EngineError> {
        let tracepoint = format!("{system}:{name}");
        let Programs::Rehearsal(programs) = &self.programs else {
            return Err(EngineError::NotRehearsed(tracepoint));
        };
        let Some((program, _)) = programs.get(&(system.to_owned(), name.to_owned())) else {
            return Err(EngineError::NotRehearsed(tracepoint));
        };
        program.test_run(context).map_err(|source| EngineError::Run { tracepoint, source })
    }

    /// What the rehearsed program of `system:name` reads, if the engine rehearses one.
    pub fn context(&self, system: &str, name: &str) -> Option<Context> {
        match &self.programs {
            Programs::Rehearsal(programs) => {
                programs.get(&(system.to_owned(), name.to_owned())).map(|(_, c)| *c)
            }
            Programs::Attached { .. } => None,
        }
    }

    /// The span column open on `slot`'s thread (its index in the row), if one is.
    ///
    /// # Errors
    /// When the pending map cannot be read.
    pub fn open_span(&self, slot: Slot) -> io::Result<Option<usize>> {
        Ok(self.open_spans(slot)?.into_iter().flatten().next())
    }

    /// By lane (one per tracepoint that closes spans, in the order the span columns name them),
    /// the span column open on `slot`'s thread, if one is.
    ///
    /// # Errors
    /// When the pending map cannot be read.
    pub fn open_spans(&self, slot: Slot) -> io::Result<Vec<Option<usize>>> {
        let Some(pending) = &self.store.pending else { return Ok(Vec::new()) };
        let entry = pending.read(slot.0)?;
        Ok((0..self.store.lanes)
            .map(|lane| {
                let mut column = [0u8; 8];
                column.copy_from_slice(&entry[16 * lane + 8..16 * lane + 16]);
                let column = u64::from_ne_bytes(column);
                usize::try_from(column).ok().and_then(|c| c.checked_sub(1))
            })
            .collect())
    }

    /// Why column `i` is not counted in the kernel, if it is not.
    pub fn refused(&self, i: usize) -> Option<&str> {
        self.store.refused.get(i).and_then(|r| r.as_deref())
    }

    /// Starts counting thread `tid` of process `pid`. A thread already counted keeps its row
    /// (two lists of the same events in one process may count the same thread): the caller
    /// takes the row's value now as its start ([`read`](Self::read) at once).
    ///
    /// # Errors
    /// When every slot is in use or the maps cannot be written.
    pub fn add_thread(&self, pid: i32, tid: i32) -> Result<Slot, EngineError> {
        self.add_thread_in(pid, tid, 0)
    }

    /// As [`add_thread`](Self::add_thread), the thread running the VM object `vm` (a kept row
    /// says so, for [`claim`](Self::claim) to adopt it only for the same VM).
    ///
    /// # Errors
    /// As [`add_thread`](Self::add_thread).
    pub fn add_thread_in(&self, pid: i32, tid: i32, vm: keep::VmToken) -> Result<Slot, EngineError> {
        let mut slots = self.store.free.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((slot, refs)) = slots.used.get_mut(&(tid as u32)) {
            *refs += 1;
            return Ok(Slot(*slot));
        }
        let Some(slot) = slots.free.pop() else {
            slots.turned_away += 1;
            return Err(EngineError::Full(self.store.capacity));
        };
        let zero = vec![0u8; 8 * self.store.columns.max(1)];
        let entry = (u64::from(pid as u32) << 32) | u64::from(slot + 1);
        // No span left open, nor value carried, by the slot's previous thread may count on this one.
        let closed = match &self.store.pending {
            Some(pending) => pending.write(slot, &vec![0u8; 16 * self.store.lanes]),
            None => Ok(()),
        };
        let cleared = closed.and_then(|()| match &self.store.latches {
            Some(latches) => latches.write(slot, &vec![0u8; 8 * self.store.carried]),
            None => Ok(()),
        });
        let owner =
            self.kept.as_ref().map(|_| Owner::now(pid, tid, vm).unwrap_or_else(|| Owner::unknown(pid, tid)));
        let owned = cleared.and_then(|()| match (&self.kept, &owner) {
            (Some(kept), Some(owner)) => kept.owners.write(slot, &owner.encode()),
            _ => Ok(()),
        });
        let written = owned
            .and_then(|()| self.store.rows.write(slot, &zero))
            .and_then(|()| self.store.threads.write(tid as u32, &entry.to_ne_bytes()));
        if let Err(e) = written {
            slots.free.push(slot);
            return Err(EngineError::Map(e));
        }
        slots.used.insert(tid as u32, (slot, 1));
        if let Some(owner) = owner {
            slots.since.insert(slot, owner.since_us);
        }
        Ok(Slot(slot))
    }

    /// Stops counting thread `tid` for one of those that added it; once none counts it, its
    /// slot is free for another.
    pub fn remove_thread(&self, tid: i32) {
        let mut slots = self.store.free.lock().unwrap_or_else(|e| e.into_inner());
        let Some((slot, refs)) = slots.used.get_mut(&(tid as u32)) else { return };
        *refs -= 1;
        if *refs > 0 {
            return;
        }
        if self.kept.is_some() && keep::LEAVING.load(std::sync::atomic::Ordering::Relaxed) {
            // The process is ending and its counts stay kept for the next observer.
            return;
        }
        let slot = *slot;
        slots.used.remove(&(tid as u32));
        slots.since.remove(&slot);
        self.release(&mut slots, tid, slot);
    }

    /// Stops counting `tid` in `slot` and frees the slot (its owner cleared, when kept).
    fn release(&self, slots: &mut Slots, tid: i32, slot: u32) {
        // The thread's entry goes first, so no program adds to the row once it is reused; a
        // slot whose entry cannot be cleared is never reused.
        let cleared = match self.store.table {
            ThreadTable::Array => self.store.threads.write(tid as u32, &0u64.to_ne_bytes()),
            ThreadTable::Hash => self
                .store
                .threads
                .delete(tid as u32)
                .or_else(|e| if e.raw_os_error() == Some(libc::ENOENT) { Ok(()) } else { Err(e) }),
        };
        if let Some(kept) = &self.kept {
            let _ = kept.owners.write(slot, &[0u8; keep::OWNER_SIZE]);
        }
        if cleared.is_ok() {
            slots.free.insert(0, slot);
        }
    }

    /// Takes the adopted row of thread `tid` of `pid` when it is that same thread still, running
    /// the same VM object `vm` (the caller then counts from the row's whole count, and
    /// [`kept_since`](Self::kept_since) says since when); an adopted row of another thread or
    /// process under that id, or of the same thread when it ran another VM (or either VM is
    /// unknown: 0), is dropped.
    pub fn claim(&self, pid: i32, tid: i32, vm: keep::VmToken) -> Claim {
        let mut slots = self.store.free.lock().unwrap_or_else(|e| e.into_inner());
        let Some((slot, owner)) = slots.adopted.remove(&(tid as u32)) else { return Claim::Nothing };
        let same_thread =
            owner.pid == pid as u32 && owner.is_alive() && !slots.used.contains_key(&(tid as u32));
        if same_thread && vm != 0 && owner.vm == vm {
            slots.used.insert(tid as u32, (slot, 1));
            slots.since.insert(slot, owner.since_us);
            return Claim::Adopted(Slot(slot));
        }
        self.release(&mut slots, tid, slot);
        if same_thread { Claim::OtherVm } else { Claim::Nothing }
    }

    /// Since when `slot`'s row counts (µs since the epoch), when the engine is kept.
    pub fn kept_since(&self, slot: Slot) -> Option<u64> {
        self.kept.as_ref()?;
        self.store.free.lock().unwrap_or_else(|e| e.into_inner()).since.get(&slot.0).copied()
    }

    /// Drops the adopted rows no one claimed whose thread is gone; returns how many.
    pub fn drop_gone(&self) -> usize {
        self.drop_gone_among(usize::MAX)
    }

    /// As [`drop_gone`](Self::drop_gone), asking of at most [`ADOPTED_CHECKED`] rows, those
    /// after the last asked of (by thread id, round the table): what an observer calls each
    /// refresh. Rows adopted for VMs it does not observe (left out by its filter) can stay
    /// unclaimed for their VMs' lives, and each is three reads of `/proc`: a thread gone is
    /// then dropped within a few refreshes, at a cost that does not grow with them.
    pub fn drop_some_gone(&self) -> usize {
        self.drop_gone_among(ADOPTED_CHECKED)
    }

    /// Drops the adopted rows whose thread is gone among the `most` after the last asked of.
    fn drop_gone_among(&self, most: usize) -> usize {
        let mut slots = self.store.free.lock().unwrap_or_else(|e| e.into_inner());
        let after = slots.asked_to;
        let mut processes = keep::Processes::default();
        let (mut gone, mut last): (Vec<(u32, u32)>, _) = (Vec::new(), after);
        let round = slots.adopted.range(after.saturating_add(1)..).chain(slots.adopted.range(..=after));
        for (&tid, (slot, owner)) in round.take(most) {
            last = tid;
            if !owner.is_alive_in(&mut processes) {
                gone.push((tid, *slot));
            }
        }
        slots.asked_to = last;
        for &(tid, slot) in &gone {
            slots.adopted.remove(&tid);
            self.release(&mut slots, tid as i32, slot);
        }
        gone.len()
    }

    /// Threads it counts at most (its rows).
    pub fn capacity(&self) -> u32 {
        self.store.capacity
    }

    /// Rows free now: threads it can count beyond those it counts.
    pub fn rows_free(&self) -> usize {
        self.store.free.lock().unwrap_or_else(|e| e.into_inner()).free.len()
    }

    /// Threads it found no free row for, since it was made (each said by
    /// [`EngineError::Full`]).
    pub fn turned_away(&self) -> usize {
        self.store.free.lock().unwrap_or_else(|e| e.into_inner()).turned_away
    }

    /// Rows adopted and not claimed yet.
    pub fn unclaimed(&self) -> usize {
        self.store.free.lock().unwrap_or_else(|e| e.into_inner()).adopted.len()
    }

    /// Where the engine's maps and links are pinned, when they are kept.
    pub fn kept_in(&self) -> Option<&Path> {
        self.kept.as_ref().map(|k| k.dir.as_path())
    }

    /// The counts of `slot`, by column.
    ///
    /// # Errors
    /// When the map cannot be read.
    pub fn read(&self, slot: Slot) -> io::Result<Vec<u64>> {
        self.store.rows.sum_u64(slot.0, self.store.columns)
    }

    /// As [`read`](Self::read) into `row` (one value per column), through `scratch`: buffers
    /// kept between reads make a read allocate nothing.
    ///
    /// # Errors
    /// As [`read`](Self::read).
    pub fn read_into(&self, slot: Slot, scratch: &mut Vec<u8>, row: &mut Vec<u64>) -> io::Result<()> {
        row.resize(self.store.columns, 0);
        self.store.rows.sum_u64_into(slot.0, scratch, row)
    }
}

/// One lane of open spans per tracepoint that closes spans, in order of appearance.
struct Lanes<'a>(Vec<(&'a str, &'a str)>);

impl<'a> Lanes<'a> {
    fn of(spans: &'a [SpanColumn]) -> Self {
        let mut lanes = Vec::new();
        for s in spans {
            let end = (s.end_system.as_str(), s.end_name.as_str());
            if !lanes.contains(&end) {
                lanes.push(end);
            }
        }
        Lanes(lanes)
    }

    /// The lane of the tracepoint that closes `span`.
    fn of_span(&self, span: &SpanColumn) -> u16 {
        let end = (span.end_system.as_str(), span.end_name.as_str());
        self.0.iter().position(|l| *l == end).unwrap_or(0) as u16
    }
}

impl EngineLayout {
    /// Bytes of kernel memory one row of this layout takes: its columns, open spans (16 bytes a
    /// lane) and carried values, its owner when kept, and its thread's hash entry (with the
    /// hash's own overhead, taken as 64 bytes).
    pub fn row_bytes(&self) -> u64 {
        let lanes = Lanes::of(&self.spans).0.len();
        let columns = self.counted.len() + self.spans.len() + self.carried.len();
        (8 * columns.max(1) + 16 * lanes + 8 * self.carried.len() + keep::OWNER_SIZE + 8 + 64) as u64
    }

    /// Every column's tracepoint in row order: counted, span starts, carried.
    fn columns(&self) -> Vec<TracepointColumn> {
        self.counted
            .iter()
            .cloned()
            .chain(self.spans.iter().map(|s| s.start.clone()))
            .chain(self.carried.iter().map(|c| c.counted.clone()))
            .collect()
    }

    /// What the program of each tracepoint does.
    fn roles<'a>(&'a self, lanes: &Lanes<'_>) -> BTreeMap<(&'a str, &'a str), Roles> {
        let mut by_tracepoint: BTreeMap<(&str, &str), Roles> = BTreeMap::new();
        let tracepoint = |c: &'a TracepointColumn| (c.system.as_str(), c.name.as_str());
        for (i, c) in self.counted.iter().enumerate() {
            by_tracepoint.entry(tracepoint(c)).or_default().counts.push(i);
        }
        for (i, s) in self.spans.iter().enumerate() {
            let start = (self.counted.len() + i, lanes.of_span(s));
            by_tracepoint.entry(tracepoint(&s.start)).or_default().starts.push(start);
        }
        for (k, c) in self.carried.iter().enumerate() {
            by_tracepoint.entry(tracepoint(&c.counted)).or_default().adds.push(k);
        }
        for s in &self.spans {
            let lane = lanes.of_span(s);
            let ends =
                &mut by_tracepoint.entry((s.end_system.as_str(), s.end_name.as_str())).or_default().ends;
            if !ends.contains(&lane) {
                ends.push(lane);
            }
        }
        for (k, c) in self.carried.iter().enumerate() {
            by_tracepoint.entry(tracepoint(&c.from)).or_default().sets.push(k);
        }
        by_tracepoint
    }

    /// Marks in `refused` every column the program of `tracepoint` (with `roles`) was needed for,
    /// with `why` it could not be made.
    fn refuse(&self, refused: &mut [Option<String>], tracepoint: (&str, &str), roles: &Roles, why: &str) {
        let first_carried = self.counted.len() + self.spans.len();
        let starts = roles.starts.iter().map(|&(i, _)| i);
        let adds = roles.adds.iter().map(|&k| first_carried + k);
        // A carried column whose record before cannot be seen is not counted either.
        let sets = roles.sets.iter().map(|&k| first_carried + k);
        for i in roles.counts.iter().copied().chain(starts).chain(adds).chain(sets) {
            refused[i] = Some(why.to_owned());
        }
        // A span whose end cannot be seen never closes: it is not counted either.
        if !roles.ends.is_empty() {
            for (i, s) in self.spans.iter().enumerate() {
                if (s.end_system.as_str(), s.end_name.as_str()) == tracepoint {
                    refused[self.counted.len() + i] = Some(why.to_owned());
                }
            }
        }
    }
}

/// Pins a new engine's maps and links in `dir`, the owners map last (a directory without it is a
/// pinning cut short, never adopted); returns the owners map.
fn pin(parts: &Store, attachments: &[(Tracepoint, Attachment)], dir: &Path) -> io::Result<ArrayMap> {
    let at = |name: &str, r: io::Result<()>| {
        r.map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.join(name).display())))
    };
    keep::private_dir(dir)?;
    at("threads", parts.threads.pin(&dir.join("threads")))?;
    at("rows", parts.rows.pin(&dir.join("rows")))?;
    if let Some(pending) = &parts.pending {
        at("pending", pending.pin(&dir.join("pending")))?;
    }
    if let Some(latches) = &parts.latches {
        at("latches", latches.pin(&dir.join("latches")))?;
    }
    for ((system, name), attachment) in attachments {
        let link = format!("link:{system}:{name}");
        at(&link, attachment.pin(&dir.join(&link)))?;
    }
    let owners = keep::owners_map(parts.capacity)?;
    at("owners", owners.pin(&dir.join("owners")))?;
    Ok(owners)
}

impl Drop for Engine {
    fn drop(&mut self) {
        // A kept engine that counts no one is not kept: its programs would run for nothing.
        let slots = self.store.free.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(kept) = &self.kept
            && slots.used.is_empty()
            && slots.adopted.is_empty()
        {
            keep::remove_tree(&kept.dir);
        }
    }
}

fn error_text(e: &EngineError) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

impl Store {
    /// The maps of `columns` (`carried` of them carried, spans closed in `lanes`), every row free.
    fn create(
        columns: &[TracepointColumn],
        lanes: &Lanes<'_>,
        carried: usize,
        table: ThreadTable,
        capacity: u32,
    ) -> Result<Self, EngineError> {
        let spans = !lanes.0.is_empty();
        let pending = spans
            .then(|| ArrayMap::create(16 * lanes.0.len(), capacity, false))
            .transpose()
            .map_err(EngineError::Map)?;
        let latches = (carried > 0)
            .then(|| ArrayMap::create(8 * carried, capacity, false))
            .transpose()
            .map_err(EngineError::Map)?;
        let threads = match table {
            ThreadTable::Array => ArrayMap::create(8, pid_max(), false),
            ThreadTable::Hash => ArrayMap::create_hash(8, capacity),
        }
        .map_err(EngineError::Map)?;
        // One row per thread, not per CPU: a thread runs on one CPU at a time, and a program runs
        // to completion on its CPU, so only that thread's programs add to its row, one at a time.
        // Mapped into this process: every row is read each refresh, as loads, not one bpf(2) each.
        let rows = ArrayMap::create_mapped(8 * columns.len().max(1), capacity).map_err(EngineError::Map)?;
        let free = Slots {
            free: (0..capacity).rev().collect(),
            turned_away: 0,
            used: BTreeMap::new(),
            adopted: BTreeMap::new(),
            since: BTreeMap::new(),
            asked_to: 0,
        };
        Ok(Store {
            capacity,
            columns: columns.len(),
            refused: vec![None; columns.len()],
            threads,
            table,
            rows,
            pending,
            lanes: lanes.0.len(),
            latches,
            carried,
            free: Mutex::new(free),
        })
    }

    fn into_engine(self, programs: Programs) -> Engine {
        Engine { store: self, programs, kept: None }
    }
}

/// What the program of one tracepoint does: the counting columns and span columns (with their
/// lanes) it classifies into, the lanes whose spans it closes, the carried columns it adds to and
/// those whose latch it sets (by index among the carried columns).
#[derive(Debug, Default)]
struct Roles {
    counts: Vec<usize>,
    starts: Vec<(usize, u16)>,
    ends: Vec<u16>,
    adds: Vec<usize>,
    sets: Vec<usize>,
}

/// The maps every program of an engine uses, and the carried columns.
struct Maps<'a> {
    threads: &'a ArrayMap,
    rows: &'a ArrayMap,
    pending: Option<&'a ArrayMap>,
    latches: Option<&'a ArrayMap>,
    carried: &'a [CarriedColumn],
    first_carried: usize,
    width: usize,
}

/// A program's columns, compiled for its record (or arguments).
struct ProgramColumns {
    counts: Vec<Column>,
    starts: Vec<(Column, u16)>,
    adds: Vec<Carried>,
    sets: Vec<Latch>,
}

impl Maps<'_> {
    fn assemble(&self, p: ProgramColumns, ends: &[u16]) -> Result<Vec<u64>, ()> {
        let spans = self.pending.map(|pending| Spans {
            pending: pending.raw_fd(),
            width: self.width as u16,
            ends: ends.to_vec(),
            starts: p.starts,
        });
        let carry = self.latches.map(|l| Carry { latches: l.raw_fd(), sets: p.sets, adds: p.adds });
        program::assemble_with_spans(
            self.threads.raw_fd(),
            self.rows.raw_fd(),
            &p.counts,
            spans.as_ref(),
            carry.as_ref(),
        )
        .map_err(drop)
    }

    /// Compiles the columns of `roles` against `fields`.
    fn compile(
        &self,
        tracepoint: &str,
        fields: &Fields,
        roles: &Roles,
        columns: &[TracepointColumn],
    ) -> Result<ProgramColumns, EngineError> {
        let counts = program_columns(tracepoint, fields, &roles.counts, columns)?;
        let start_columns: Vec<usize> = roles.starts.iter().map(|&(i, _)| i).collect();
        let starts = program_columns(tracepoint, fields, &start_columns, columns)?
            .into_iter()
            .zip(roles.starts.iter().map(|&(_, lane)| lane))
            .collect();
        let add_columns: Vec<usize> = roles.adds.iter().map(|&k| self.first_carried + k).collect();
        let adds = program_columns(tracepoint, fields, &add_columns, columns)?
            .into_iter()
            .zip(&roles.adds)
            .map(|(column, &k)| Carried { column, latch: k as u16 })
            .collect();
        let mut sets = Vec::with_capacity(roles.sets.len());
        for &k in &roles.sets {
            let from = &self.carried[k].from;
            let pred = parse(tracepoint, fields, from.filter.as_deref())?;
            let weight = match &self.carried[k].weight {
                Some(name) => Some(*fields.get(name).ok_or_else(|| EngineError::Filter {
                    tracepoint: tracepoint.to_owned(),
                    filter: name.clone(),
                    source: FilterError::UnknownField(name.clone()),
                })?),
                None => None,
            };
            sets.push(Latch { index: k as u16, pred, weight });
        }
        Ok(ProgramColumns { counts, starts, adds, sets })
    }
}

fn attach_one(
    root: &Path,
    system: &str,
    name: &str,
    roles: &Roles,
    columns: &[TracepointColumn],
    maps: &Maps<'_>,
    link: bool,
) -> Result<Attachment, EngineError> {
    let tracepoint = format!("{system}:{name}");
    let format = tracefs::event_format_at(root, system, name)
        .map_err(|source| EngineError::Format { tracepoint: tracepoint.clone(), source })?;
    let id = tracefs::event_id_at(root, system, name)
        .map_err(|source| EngineError::Format { tracepoint: tracepoint.clone(), source })?;
    let fields = filter::parse_format(&format);
    // A raw tracepoint first: it runs before the kernel makes the record, which is most of
    // what a classic tracepoint program costs a firing.
    if let Some(insns) = raw_program(system, name, &fields, roles, columns, maps)
        && let Ok(prog) = Program::load_raw_tracepoint(&insns)
        && let Ok(attached) = Attachment::raw_tracepoint(name, &prog)
    {
        return Ok(attached);
    }
    let insns = record_program(&tracepoint, &fields, roles, columns, maps)?;
    let prog = Program::load_tracepoint(&insns)
        .map_err(|source| EngineError::Load { tracepoint: tracepoint.clone(), source })?;
    // A link where one is asked for (it can be pinned; Linux 5.15 on), else the event itself.
    let attached = if link {
        Attachment::tracepoint_link(id, &prog).or_else(|_| Attachment::tracepoint(id, &prog))
    } else {
        Attachment::tracepoint(id, &prog)
    };
    attached.map_err(|source| EngineError::Attach { tracepoint, source })
}

/// The program [`attach_one`] would attach to `system:name`, loaded to be run on a context of our
/// making: the raw tracepoint program where that one loads, else the record program. The kernel
/// test-runs raw tracepoint programs only (not tracepoint programs), so the record program runs
/// as one: the same instructions, reading the record we give where a firing gives its record.
fn rehearse_one(
    format: &dyn Fn(&str, &str) -> Option<String>,
    system: &str,
    name: &str,
    roles: &Roles,
    columns: &[TracepointColumn],
    maps: &Maps<'_>,
) -> Result<(Program, Context), EngineError> {
    let tracepoint = format!("{system}:{name}");
    let text = format(system, name).ok_or_else(|| EngineError::NoFormat(tracepoint.clone()))?;
    let fields = filter::parse_format(&text);
    if let Some(insns) = raw_program(system, name, &fields, roles, columns, maps)
        && let Ok(prog) = Program::load_raw_tracepoint(&insns)
    {
        return Ok((prog, Context::Arguments));
    }
    let insns = record_program(&tracepoint, &fields, roles, columns, maps)?;
    let prog =
        Program::load_raw_tracepoint(&insns).map_err(|source| EngineError::Load { tracepoint, source })?;
    Ok((prog, Context::Record))
}

/// The raw tracepoint program of `system:name` (its context: the arguments), when the filters of
/// its columns can be evaluated on its arguments (a latch that carries a field needs the record).
fn raw_program(
    system: &str,
    name: &str,
    record: &Fields,
    roles: &Roles,
    columns: &[TracepointColumn],
    maps: &Maps<'_>,
) -> Option<Vec<u64>> {
    if roles.sets.iter().any(|&k| maps.carried[k].weight.is_some()) {
        return None;
    }
    let filters: Vec<Option<&str>> = roles
        .counts
        .iter()
        .chain(roles.starts.iter().map(|(i, _)| i))
        .map(|&i| columns[i].filter.as_deref())
        .chain(roles.adds.iter().map(|&k| columns[maps.first_carried + k].filter.as_deref()))
        .chain(roles.sets.iter().map(|&k| maps.carried[k].from.filter.as_deref()))
        .collect();
    let tracepoint = format!("{system}:{name}");
    let fields = raw::fields(system, name, record, &filters)?;
    let compiled = maps.compile(&tracepoint, &fields, roles, columns).ok()?;
    maps.assemble(compiled, &roles.ends).ok()
}

/// The tracepoint program of `tracepoint` (its context: the record, with `fields`).
fn record_program(
    tracepoint: &str,
    fields: &Fields,
    roles: &Roles,
    columns: &[TracepointColumn],
    maps: &Maps<'_>,
) -> Result<Vec<u64>, EngineError> {
    let compiled = maps.compile(tracepoint, fields, roles, columns)?;
    maps.assemble(compiled, &roles.ends).map_err(|()| EngineError::Assemble(tracepoint.to_owned()))
}

/// The predicate of `filter` on `fields` (`None`: every firing).
fn parse(tracepoint: &str, fields: &Fields, filter: Option<&str>) -> Result<Option<Pred>, EngineError> {
    filter
        .map(|f| {
            filter::parse_filter(f, fields).map_err(|source| EngineError::Filter {
                tracepoint: tracepoint.to_owned(),
                filter: f.to_owned(),
                source,
            })
        })
        .transpose()
}

fn program_columns(
    tracepoint: &str,
    fields: &filter::Fields,
    indices: &[usize],
    columns: &[TracepointColumn],
) -> Result<Vec<Column>, EngineError> {
    let mut program_columns = Vec::with_capacity(indices.len());
    for &i in indices {
        let pred: Option<Pred> = match &columns[i].filter {
            Some(f) => Some(filter::parse_filter(f, fields).map_err(|source| EngineError::Filter {
                tracepoint: tracepoint.to_owned(),
                filter: f.clone(),
                source,
            })?),
            None => None,
        };
        let index = u16::try_from(i).map_err(|_| EngineError::Assemble(tracepoint.to_owned()))?;
        program_columns.push(Column { index, pred });
    }
    Ok(program_columns)
}

/// The kernel's `pid_max` (thread ids are below it), at most 4 Mi.
fn pid_max() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
        .unwrap_or(1 << 22)
        .clamp(1024, 1 << 22)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refresh_asks_a_bounded_share_of_the_adopted_rows_round_the_table_and_drops_the_gone() {
        let column =
            |name: &str| TracepointColumn { system: "syscalls".into(), name: name.into(), filter: None };
        let layout = EngineLayout { counted: vec![column("sys_enter_getppid")], ..EngineLayout::default() };
        let engine =
            match Engine::of_layout(Path::new("/sys/kernel/tracing"), &layout, ThreadTable::for_host()) {
                Ok(engine) => engine,
                Err(e) => {
                    let why = crate::error_chain::error_chain(&e);
                    assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "no engine: {why}");
                    eprintln!("skipped: {why}");
                    return;
                }
            };
        // SAFETY: getpid and gettid have no preconditions.
        let (me, tid) = unsafe { (libc::getpid(), libc::gettid()) };
        // Rows adopted for 300 threads that are gone (low ids, of no thread of this process), and
        // for this thread, which lives.
        let gone = ADOPTED_CHECKED + 44;
        {
            let mut slots = engine.store.free.lock().unwrap();
            let alive = Owner::now(me, tid, 0).unwrap();
            let ids = (2..).filter(|&t| t != tid).take(gone);
            for (i, owner) in ids.map(|t| Owner::unknown(me, t)).chain([alive]).enumerate() {
                let slot = slots.free.pop().unwrap();
                slots.adopted.insert(owner.tid, (slot, owner));
                assert_eq!(slots.adopted.len(), i + 1);
            }
        }
        let free = engine.rows_free();
        // At most ADOPTED_CHECKED a call, on from where the last stopped, round the table.
        let first = engine.drop_some_gone();
        let second = engine.drop_some_gone();
        match tid as usize > gone + 2 {
            true => assert_eq!((first, second), (ADOPTED_CHECKED, gone - ADOPTED_CHECKED)),
            // This thread's row among the first asked.
            false => assert_eq!((first, second), (ADOPTED_CHECKED - 1, gone - ADOPTED_CHECKED + 1)),
        }
        assert_eq!(engine.drop_some_gone(), 0, "the living thread's row stays");
        assert_eq!((engine.unclaimed(), engine.rows_free()), (1, free + gone), "the rows are free again");
        assert_eq!(
            engine.store.free.lock().unwrap().adopted.keys().copied().collect::<Vec<_>>(),
            [tid as u32]
        );
    }

    #[test]
    fn rows_follow_the_cpus_or_the_threads_the_host_runs_whichever_asks_more_within_the_bounds() {
        let any = u64::MAX;
        // A small host running little: the least.
        assert_eq!(rows_wanted(2, 700, any), MIN_ROWS);
        // Many CPUs: their share.
        assert_eq!(rows_wanted(768, 700, any), 768 * ROWS_PER_CPU);
        // A small host already running 4,256 vCPU threads among its 7,586: each, and as many again.
        assert_eq!(rows_wanted(2, 7_586, any), 15_172);
        // Never past the ceiling, nor past what the memory allowed holds.
        assert_eq!(rows_wanted(2, 1_000_000, any), MAX_ROWS);
        assert_eq!(rows_wanted(2, 7_586, 5_000), 5_000);
        assert_eq!(rows_wanted(2, 7_586, 0), 1);
    }

    #[test]
    fn the_host_threads_are_read_from_loadavg() {
        let ours = std::fs::read_dir("/proc/self/task").unwrap().count() as u32;
        let threads = host_threads().expect("/proc/loadavg names the host's threads");
        assert!(threads >= ours, "the host's {threads} threads, this process's {ours}");
    }
}
