//! Counting a list of events on threads: the one engine behind every tracepoint count of
//! hvstats, for our own VPs' threads and an observed VMM's alike.
//!
//! An [`EventList`] resolves event specs ([`EventSpec`]: tracepoints with ftrace filters, perf
//! software events, spans from one tracepoint to another) against tracefs once. Tracepoints are
//! counted in the kernel where BPF is permitted ([`Method::InKernel`]): one program per
//! tracepoint, shared by every list of the same events in this process, classifies each firing by
//! the events' filters and adds to the firing thread's row ([`crate::bpf`]); a firing then costs
//! one program, not one perf counter per event. Where BPF is not permitted or not asked for, or a
//! tracepoint's program cannot be made, its events are perf counters on each thread
//! ([`Method::Perf`]), each thread's in one perf group so that one `read` gives them all.
//! Software events (task clock, migrations) are always perf counters. [`ThreadEvents`] is one
//! thread's counters of a list.
//!
//! The engine holds as many threads as it has rows ([`crate::bpf::rows_for_host`]); past them,
//! another engine of as many rows grows beside it (kept beside it where it is kept), while the
//! engines hold the rows allowed ([`crate::bpf::rows_allowed`]), and each growth is said
//! ([`full_notes`]). A thread past what may grow has its tracepoints counted by perf counters,
//! and that is said once, with the numbers.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use crate::bpf::{
    CarriedColumn, Claim, Engine, EngineError, EngineLayout, Slot, SpanColumn, ThreadTable, TracepointColumn,
    VmToken,
};
use crate::perf_event::{TYPE_SOFTWARE, TYPE_TRACEPOINT};
use crate::perf_group::{EventAttr, MemberError, PerfGroup};
use crate::tracefs::{self, EventError, TracefsError};

/// One event to count on each thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventSpec {
    /// A tracepoint `system:name`, narrowed by an ftrace filter when given.
    Tracepoint {
        /// The tracepoint's system (`kvm`, `syscalls`).
        system: String,
        /// The event name (`kvm_cpuid`).
        name: String,
        /// An ftrace filter expression (`reason == 2`).
        filter: Option<String>,
    },
    /// A perf software event (`PERF_COUNT_SW_*`).
    Software(u64),
    /// The nanoseconds from each firing of tracepoint `start` that `filter` admits to the next
    /// firing of `end` on the same thread, summed: counted in the kernel only (perf has no such
    /// event), so where the kernel does not count it, it is not counted.
    Span {
        /// The tracepoints' system (`kvm`).
        system: String,
        /// The tracepoint that opens a span (`kvm_exit`).
        start: String,
        /// An ftrace filter on `start` (`exit_reason == 10`).
        filter: Option<String>,
        /// The tracepoint that closes it (`kvm_entry`).
        end: String,
    },
    /// The firings of tracepoint `name` that `filter` admits, each adding what the thread's last
    /// firing of `from` left: the value of its field `weight` (one when `None`) when `from_filter`
    /// admitted it, else nothing. Counted in the kernel only, as a span.
    Carried {
        /// The tracepoints' system (`kvm`).
        system: String,
        /// The tracepoint counted (`kvm_hv_flush_tlb`).
        name: String,
        /// An ftrace filter on it (`flags & 2`).
        filter: Option<String>,
        /// The tracepoint before it on the thread (`kvm_hv_hypercall`).
        from: String,
        /// An ftrace filter on `from` (`code == 3 || code == 20`).
        from_filter: Option<String>,
        /// The field of `from` added (`rep_cnt`).
        weight: Option<String>,
    },
}

impl EventSpec {
    /// A tracepoint without a filter.
    pub fn tracepoint(system: &str, name: &str) -> Self {
        EventSpec::Tracepoint { system: system.to_owned(), name: name.to_owned(), filter: None }
    }

    /// A span from `start` (narrowed by `filter`) to `end`, tracepoints of `system`.
    pub fn span(system: &str, start: &str, filter: Option<&str>, end: &str) -> Self {
        EventSpec::Span {
            system: system.to_owned(),
            start: start.to_owned(),
            filter: filter.map(str::to_owned),
            end: end.to_owned(),
        }
    }

    /// The firings of `name` that `filter` admits, adding the `weight` field (or one) of the
    /// thread's last firing of `from` when `from_filter` admitted it; tracepoints of `system`.
    pub fn carried(
        system: &str,
        (name, filter): (&str, Option<&str>),
        (from, from_filter): (&str, Option<&str>),
        weight: Option<&str>,
    ) -> Self {
        EventSpec::Carried {
            system: system.to_owned(),
            name: name.to_owned(),
            filter: filter.map(str::to_owned),
            from: from.to_owned(),
            from_filter: from_filter.map(str::to_owned),
            weight: weight.map(str::to_owned),
        }
    }

    /// True for the events only the kernel counts (spans and carried counts).
    pub fn in_kernel_only(&self) -> bool {
        matches!(self, EventSpec::Span { .. } | EventSpec::Carried { .. })
    }

    /// A tracepoint with a filter.
    pub fn filtered(system: &str, name: &str, filter: &str) -> Self {
        EventSpec::Tracepoint {
            system: system.to_owned(),
            name: name.to_owned(),
            filter: Some(filter.to_owned()),
        }
    }
}

/// How tracepoint events are counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// One BPF program per tracepoint, counting per thread into one row each.
    InKernel,
    /// A perf counter per (thread, event).
    Perf,
}

/// Why tracepoints are not counted in the kernel.
#[derive(Clone, Debug, thiserror::Error)]
pub enum InKernelError {
    /// Perf counters were asked for.
    #[error("perf counters were asked for")]
    PerfAsked,
    /// tracefs is unavailable.
    #[error(transparent)]
    Tracefs(&'static TracefsError),
    /// The list has no tracepoint.
    #[error("no tracepoint to count")]
    NoTracepoint,
    /// The programs or maps could not be made.
    #[error(transparent)]
    Engine(Arc<EngineError>),
}

/// One event spec resolved to perf's (type, config), or why it cannot be.
type Resolution = Result<(u32, u64), Arc<EventError>>;

/// Event specs resolved to perf (type, config) once, with the reason for any that cannot be,
/// and the in-kernel counting of their tracepoints where it is possible.
#[derive(Clone, Debug)]
pub struct EventList {
    /// Shared by the list's clones and by every list made alike while one lives ([`LISTS`]): a
    /// list is made once and never changed, so a thousand VMs hold one.
    inner: Arc<ListInner>,
}

#[derive(Debug)]
struct ListInner {
    specs: Box<[EventSpec]>,
    resolved: Box<[Resolution]>,
    /// The in-kernel counting, or why there is none.
    engine: Result<Arc<Tally>, InKernelError>,
    /// By event: its column in the engine, when the engine counts it.
    columns: Box<[Option<usize>]>,
    /// How it was asked for: the method, where it is kept, the engine's rows asked.
    asked: ListAsked,
}

type ListAsked = (Method, Option<PathBuf>, Option<u32>);

/// Lists alive in this process, by how they were asked for (and their specs): a list made alike
/// while one lives is that one. Held weakly, so the last VM gone drops its list, and with it the
/// engine (whose drop removes what it kept).
static LISTS: Mutex<Vec<Weak<ListInner>>> = Mutex::new(Vec::new());

/// Tallies alive in this process, by the specs they count and where they are kept: lists of the
/// same events (every VM observed) share one, so a firing runs one program per tracepoint
/// whatever the number of VMs.
type EngineKey = (Vec<EventSpec>, Option<PathBuf>, Option<u32>);
static ENGINES: Mutex<Vec<(EngineKey, Weak<Tally>)>> = Mutex::new(Vec::new());

/// A list's in-kernel counting: the engine made for its events, and the engines grown beside
/// it once the rows of those before were all in use (the same programs and columns, as many
/// rows again each, kept beside it where it is kept), while the rows allowed
/// ([`crate::bpf::rows_allowed`]) hold them. A thread gets a row in the first with one free;
/// a thread with a row is counted exactly whichever engine holds it. It is the first engine for
/// all else (its columns, what it refused, where it is kept).
#[derive(Debug)]
struct Tally {
    first: Arc<Engine>,
    grown: Mutex<Vec<Arc<Engine>>>,
    /// How another is made (tracefs, the layout, where it is kept); `None` where the rows were
    /// asked for (`HVSTATS_ENGINE_ROWS`, [`EventList::with_rows`]): no engine grows then.
    grow: Option<(PathBuf, EngineLayout, Option<PathBuf>)>,
    /// The rows the engines may hold together.
    allowed: u32,
    /// Why an engine could not grow, once one could not: none is tried again.
    grow_failed: Mutex<Option<String>>,
    /// That a thread found no row and no engine could grow, said already.
    said_full: std::sync::atomic::AtomicBool,
}

impl std::ops::Deref for Tally {
    type Target = Engine;

    fn deref(&self) -> &Engine {
        &self.first
    }
}

/// The rows of `engines` together.
fn rows_of(engines: &[Arc<Engine>]) -> u32 {
    engines.iter().map(|e| e.capacity()).sum()
}

impl Tally {
    /// Every engine, the first first.
    fn engines(&self) -> Vec<Arc<Engine>> {
        let grown = self.grown.lock().unwrap_or_else(|e| e.into_inner());
        std::iter::once(&self.first).chain(grown.iter()).cloned().collect()
    }

    /// The rows of every engine.
    fn rows(&self) -> u32 {
        rows_of(&self.engines())
    }

    /// Threads it can count beyond those it counts: rows free, and those engines grown would
    /// hold.
    fn rows_free(&self) -> usize {
        let engines = self.engines();
        let free: usize = engines.iter().map(|e| e.rows_free()).sum();
        let growable = match self.grow {
            Some(_) => self.allowed.saturating_sub(rows_of(&engines)) as usize,
            None => 0,
        };
        free + growable
    }

    /// The row kept for thread `tid` of `pid` running `vm` in any engine.
    fn claim(&self, pid: i32, tid: i32, vm: VmToken) -> (Option<(Arc<Engine>, Slot)>, bool) {
        let mut other_vm = false;
        for engine in self.engines() {
            match engine.claim(pid, tid, vm) {
                Claim::Adopted(slot) => return (Some((engine, slot)), other_vm),
                Claim::OtherVm => other_vm = true,
                Claim::Nothing => {}
            }
        }
        (None, other_vm)
    }

    /// A row for thread `tid` of `pid`, in the first engine with one free, or in an engine grown
    /// for it.
    ///
    /// # Errors
    /// [`EngineError::Full`] when every engine is full and no other may grow (or it could not be
    /// made); a map write's error.
    fn add_thread_in(&self, pid: i32, tid: i32, vm: VmToken) -> Result<(Arc<Engine>, Slot), EngineError> {
        let mut grown = self.grown.lock().unwrap_or_else(|e| e.into_inner());
        for engine in std::iter::once(&self.first).chain(grown.iter()) {
            match engine.add_thread_in(pid, tid, vm) {
                Ok(slot) => return Ok((Arc::clone(engine), slot)),
                Err(EngineError::Full(_)) => continue,
                Err(e) => return Err(e),
            }
        }
        let full = || EngineError::Full(self.first.capacity());
        let Some((tracefs, layout, keep_in)) = &self.grow else { return Err(full()) };
        let mut failed = self.grow_failed.lock().unwrap_or_else(|e| e.into_inner());
        if failed.is_some() {
            return Err(full());
        }
        let rows = self.first.capacity() + rows_of(&grown);
        let more = self.first.capacity().min(self.allowed.saturating_sub(rows));
        if more == 0 {
            return Err(full());
        }
        let layout = EngineLayout { rows: Some(more), ..layout.clone() };
        let n = grown.len() as u32 + 1;
        let engine = match keep_in {
            Some(identity) => Engine::kept_grown(tracefs, &layout, ThreadTable::for_host(), identity, n).map(
                |(engine, adoption)| {
                    KEPT_NOTES.lock().unwrap_or_else(|e| e.into_inner()).extend(adoption.notes);
                    engine
                },
            ),
            None => Engine::of_layout(tracefs, &layout, ThreadTable::for_host()),
        };
        let engine = match engine {
            Ok(engine) => Arc::new(engine),
            Err(e) => {
                *failed = Some(crate::error_chain::error_chain(&e));
                return Err(full());
            }
        };
        grown.push(Arc::clone(&engine));
        FULL_NOTES.lock().unwrap_or_else(|e| e.into_inner()).push(format!(
            "the in-kernel counting engine's {rows} rows are all in use: another of {more} rows counts \
             thread {tid} of process {pid} and those after it in the kernel ({} rows in all, {} at most \
             here)",
            rows + more,
            self.allowed
        ));
        let slot = engine.add_thread_in(pid, tid, vm)?;
        Ok((engine, slot))
    }

    /// Drops adopted rows of threads gone in every engine, a few a call
    /// ([`Engine::drop_some_gone`]); returns how many.
    fn drop_some_gone(&self) -> usize {
        self.engines().iter().map(|e| e.drop_some_gone()).sum()
    }
}

/// That an engine's rows were all in use when a thread came, not said yet.
static FULL_NOTES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// What adopting or dropping kept counts found, not said yet.
static KEPT_NOTES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Kept rows dropped because their thread runs another VM object now, by process: not said yet.
static OTHER_VM: Mutex<std::collections::BTreeMap<i32, usize>> =
    Mutex::new(std::collections::BTreeMap::new());

/// The directory in bpffs where in-kernel counts are kept for the runtime directory `runtime`
/// (made, and bpffs mounted, when needed): lists made with it ([`EventList::kept_in`]) keep
/// their counts beyond this process, and a later process keeping its counts there adopts them
/// ([`crate::bpf::keep`]). An observer asks for it once at start, and calls
/// [`leave_kept_counts`] when it ends.
///
/// # Errors
/// When bpffs cannot be mounted or its directory is not this user's alone.
pub fn keep_counts_in(runtime: &Path) -> std::io::Result<PathBuf> {
    crate::bpf::keep::identity_dir(runtime)
}

/// Leaves the kept counts of this process counting for the next one: called by a process that
/// is ending while the threads it counts go on.
pub fn leave_kept_counts() {
    crate::bpf::keep::leave();
}

/// What adopting or dropping kept counts found since the last call, to be said once (one line
/// per process whose rows were dropped because it runs another VM now).
pub fn kept_notes() -> Vec<String> {
    let mut notes = std::mem::take(&mut *KEPT_NOTES.lock().unwrap_or_else(|e| e.into_inner()));
    let other_vm = std::mem::take(&mut *OTHER_VM.lock().unwrap_or_else(|e| e.into_inner()));
    notes.extend(other_vm.into_iter().map(|(pid, rows)| {
        format!(
            "dropped the kept counts of {rows} thread(s) of process {pid}: it runs another KVM VM object \
             than when they were kept (its counts begin anew)"
        )
    }));
    notes
}

/// What the engines found past their rows since the last call, to be said once: the first thread
/// of each engine counted by perf counters for want of a row, with the numbers; that the
/// threads' accounting is read from `/proc` because the task iterator could not be loaded; and
/// that they are walked among the host's every task, where their own walk cannot be had.
pub fn full_notes() -> Vec<String> {
    let mut notes = std::mem::take(&mut *FULL_NOTES.lock().unwrap_or_else(|e| e.into_inner()));
    notes.extend(crate::bpf::task_iter::take_fallback_note());
    notes.extend(crate::bpf::listed_tasks::take_note());
    notes.extend(crate::bpf::stats_copy::take_note());
    notes
}

/// The rows `HVSTATS_ENGINE_ROWS` asks engines to hold instead of what the host is sized for
/// (a smaller bound on the observer's kernel memory, or a test of what happens past them).
pub const ROWS_VARIABLE: &str = "HVSTATS_ENGINE_ROWS";

fn rows_asked() -> Option<u32> {
    std::env::var(ROWS_VARIABLE).ok()?.trim().parse().ok().filter(|&rows| rows > 0)
}

/// Says once per tally that `tid` of `pid` found no row: its tracepoints are `perf` perf
/// counters instead.
fn note_full(tally: &Tally, pid: i32, tid: i32, perf: usize) {
    if tally.said_full.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let failed = tally.grow_failed.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let why = match (&tally.grow, failed) {
        (Some(_), Some(failed)) => format!("and no engine could grow beside them ({failed})"),
        (Some(_), None) => format!(
            "and no engine may grow beside them: engines hold {} rows together at most here ({} at \
             most, within an eighth of the memory limit; the first sized at start: {} per CPU or \
             twice the host's threads then, at least {})",
            tally.allowed,
            crate::bpf::MAX_ROWS,
            crate::bpf::ROWS_PER_CPU,
            crate::bpf::MIN_ROWS,
        ),
        (None, _) => format!("({ROWS_VARIABLE} or the list asked for that many, and no more)"),
    };
    FULL_NOTES.lock().unwrap_or_else(|e| e.into_inner()).push(format!(
        "the in-kernel counting engine's {} rows are all in use {why}: thread {tid} of process {pid}, \
         and every thread past them, is counted by {perf} perf counters a thread instead",
        tally.rows(),
    ));
}

/// Drops adopted rows of threads gone in every live engine (kept counts of VMs that ended
/// before anyone claimed them), a few each call: called each refresh, a row is asked of within a
/// few; returns how many.
pub fn drop_gone_kept() -> usize {
    let engines = ENGINES.lock().unwrap_or_else(|e| e.into_inner());
    engines.iter().filter_map(|(_, t)| t.upgrade()).map(|t| Tally::drop_some_gone(&t)).sum()
}

fn shared_engine(
    root: &Path,
    specs: &[EventSpec],
    keep_in: Option<&Path>,
    rows: Option<u32>,
) -> Result<Arc<Tally>, InKernelError> {
    let rows = rows.or_else(rows_asked);
    let mut engines = ENGINES.lock().unwrap_or_else(|e| e.into_inner());
    engines.retain(|(_, t)| t.strong_count() > 0);
    let key = (specs.to_vec(), keep_in.map(Path::to_owned), rows);
    if let Some(t) = engines.iter().find(|(k, _)| *k == key).and_then(|(_, t)| t.upgrade()) {
        return Ok(t);
    }
    let layout = EngineLayout { rows, ..engine_layout(specs) };
    if layout.counted.is_empty() && layout.spans.is_empty() && layout.carried.is_empty() {
        return Err(InKernelError::NoTracepoint);
    }
    let table = ThreadTable::for_host();
    let (engine, grown) = match keep_in {
        Some(identity) => kept_engines(root, &layout, table, identity)?,
        None => (
            Engine::of_layout(root, &layout, table).map_err(|e| InKernelError::Engine(Arc::new(e)))?,
            Vec::new(),
        ),
    };
    let tally = Arc::new(Tally {
        allowed: crate::bpf::rows_allowed(&layout).max(engine.capacity()),
        first: Arc::new(engine),
        grown: Mutex::new(grown),
        grow: rows.is_none().then(|| (root.to_owned(), layout.clone(), keep_in.map(Path::to_owned))),
        said_full: std::sync::atomic::AtomicBool::new(false),
        grow_failed: Mutex::new(None),
    });
    engines.push((key, Arc::downgrade(&tally)));
    Ok(tally)
}

/// The kept engine of `layout` in `identity`, adopted or made, and the engines an earlier
/// process grew beside it, adopted: what they adopted and dropped is said once.
fn kept_engines(
    root: &Path,
    layout: &EngineLayout,
    table: ThreadTable,
    identity: &Path,
) -> Result<(Engine, Vec<Arc<Engine>>), InKernelError> {
    let (engine, adoption) =
        Engine::kept(root, layout, table, identity).map_err(|e| InKernelError::Engine(Arc::new(e)))?;
    let (mut adopted, mut notes) = (adoption.adopted, adoption.notes);
    // The engines grown beside it that an earlier process kept: their rows go on too.
    let mut grown = Vec::new();
    let mut n = 1;
    while Engine::is_kept_grown(layout, table, identity, n) {
        match Engine::kept_grown(root, layout, table, identity, n) {
            Ok((engine, adoption)) => {
                adopted += adoption.adopted;
                notes.extend(adoption.notes);
                grown.push(Arc::new(engine));
            }
            Err(e) => {
                notes.push(format!(
                    "dropped the engine grown beside it: {}",
                    crate::error_chain::error_chain(&e)
                ));
                break;
            }
        }
        n += 1;
    }
    let mut said = KEPT_NOTES.lock().unwrap_or_else(|e| e.into_inner());
    if adopted > 0 {
        said.push(format!(
            "adopted the in-kernel counts of {adopted} thread(s) kept in {} while no observer ran",
            identity.display()
        ));
    }
    said.extend(notes);
    Ok((engine, grown))
}

/// The engine columns of `specs`: their tracepoints, their spans and their carried counts
/// (software events have none). A list's engine is made of these, and so is a rehearsal of it
/// ([`Engine::rehearse`]).
pub fn engine_layout(specs: &[EventSpec]) -> EngineLayout {
    let column = |system: &str, name: &str, filter: &Option<String>| TracepointColumn {
        system: system.to_owned(),
        name: name.to_owned(),
        filter: filter.clone(),
    };
    let mut layout = EngineLayout::default();
    for spec in specs {
        match spec {
            EventSpec::Tracepoint { system, name, filter } => {
                layout.counted.push(column(system, name, filter))
            }
            EventSpec::Span { system, start, filter, end } => layout.spans.push(SpanColumn {
                start: column(system, start, filter),
                end_system: system.clone(),
                end_name: end.clone(),
            }),
            EventSpec::Carried { system, name, filter, from, from_filter, weight } => {
                layout.carried.push(CarriedColumn {
                    counted: column(system, name, filter),
                    from: column(system, from, from_filter),
                    weight: weight.clone(),
                });
            }
            EventSpec::Software(_) => {}
        }
    }
    layout
}

/// Each spec's column in the engine: tracepoints in order, then spans, then carried counts (as
/// [`Engine::of_layout`] lays out a row); `None` for software events.
pub fn engine_columns(specs: &[EventSpec]) -> Vec<Option<usize>> {
    let count = |f: fn(&EventSpec) -> bool| specs.iter().filter(|s| f(s)).count();
    let tracepoints = count(|s| matches!(s, EventSpec::Tracepoint { .. }));
    let spans = count(|s| matches!(s, EventSpec::Span { .. }));
    let (mut next_tracepoint, mut next_span, mut next_carried) = (0, tracepoints, tracepoints + spans);
    specs
        .iter()
        .map(|spec| {
            let next = match spec {
                EventSpec::Tracepoint { .. } => &mut next_tracepoint,
                EventSpec::Span { .. } => &mut next_span,
                EventSpec::Carried { .. } => &mut next_carried,
                EventSpec::Software(_) => return None,
            };
            *next += 1;
            Some(*next - 1)
        })
        .collect()
}

impl EventList {
    /// Resolves `specs` against tracefs (mounted when needed, as root), counting tracepoints in
    /// the kernel where that is permitted.
    pub fn new(specs: Vec<EventSpec>) -> Self {
        Self::with_method(specs, Method::InKernel)
    }

    /// As [`new`](Self::new), counting tracepoints by `method` where possible (perf counters are
    /// always possible where the events are).
    pub fn with_method(specs: Vec<EventSpec>, method: Method) -> Self {
        Self::made(specs, method, None, None)
    }

    /// As [`new`](Self::new), the engine holding `rows` threads at most (not as many as the host
    /// is sized for): the threads past them are counted by perf counters.
    pub fn with_rows(specs: Vec<EventSpec>, rows: u32) -> Self {
        Self::made(specs, Method::InKernel, None, Some(rows))
    }

    /// As [`new`](Self::new), with the in-kernel counts kept beyond this process in `identity`
    /// ([`keep_counts_in`]): rows an earlier process kept there are adopted by the threads they
    /// count ([`ThreadEvents::kept_since`] says since when).
    pub fn kept_in(specs: Vec<EventSpec>, identity: &Path) -> Self {
        Self::made(specs, Method::InKernel, Some(identity), None)
    }

    fn made(specs: Vec<EventSpec>, method: Method, keep_in: Option<&Path>, rows: Option<u32>) -> Self {
        let asked: ListAsked = (method, keep_in.map(Path::to_owned), rows.or_else(rows_asked));
        let alike = |l: &ListInner| l.asked == asked && *l.specs == *specs;
        let live = LISTS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .find(|l| alike(l));
        if let Some(inner) = live {
            return Self { inner };
        }
        let inner = Arc::new(ListInner::resolved(specs.into(), asked));
        let mut lists = LISTS.lock().unwrap_or_else(|e| e.into_inner());
        lists.retain(|l| l.strong_count() > 0);
        lists.push(Arc::downgrade(&inner));
        Self { inner }
    }

    /// How tracepoint events are counted: in the kernel when at least one is.
    pub fn method(&self) -> Method {
        if self.inner.columns.iter().any(Option::is_some) { Method::InKernel } else { Method::Perf }
    }

    /// The method, said for a log or a description: which, and why not in the kernel when not,
    /// or which tracepoints stay perf counters.
    pub fn method_description(&self) -> String {
        match (&self.inner.engine, self.method()) {
            (Err(why), _) => format!(
                "perf counters per thread (in-kernel counting unavailable: {})",
                crate::error_chain::error_chain(why)
            ),
            (Ok(_), Method::Perf) => {
                "perf counters per thread (no tracepoint could be counted in the kernel)".into()
            }
            (Ok(t), Method::InKernel) => {
                let refused: Vec<String> = self
                    .inner
                    .specs
                    .iter()
                    .enumerate()
                    .filter(|(i, spec)| {
                        !matches!(spec, EventSpec::Software(_))
                            && self.inner.resolved[*i].is_ok()
                            && self.inner.columns[*i].is_none()
                    })
                    .filter_map(|(i, _)| self.column_refusal(t, i))
                    .collect();
                let kept = t.kept_in().map(|d| format!(", kept in {}", d.display())).unwrap_or_default();
                if refused.is_empty() {
                    format!("in-kernel (one eBPF program per tracepoint{kept})")
                } else {
                    format!(
                        "in-kernel (one eBPF program per tracepoint{kept}), except: {}",
                        refused.join("; ")
                    )
                }
            }
        }
    }

    fn column_refusal(&self, engine: &Engine, event: usize) -> Option<String> {
        let column = engine_columns(&self.inner.specs).get(event).copied().flatten()?;
        engine.refused(column).map(str::to_owned)
    }

    /// True when the in-kernel counts are kept beyond this process ([`keep_counts_in`]).
    pub fn is_kept(&self) -> bool {
        self.inner.engine.as_ref().is_ok_and(|t| t.kept_in().is_some())
    }

    /// True when event `i` is counted in the kernel.
    pub fn in_kernel(&self, i: usize) -> bool {
        self.inner.columns.get(i).is_some_and(Option::is_some)
    }

    /// Perf counters each counted thread holds: the events not counted in the kernel (spans
    /// and carried counts are counted there or not at all).
    pub fn perf_events_per_thread(&self) -> usize {
        (0..self.len())
            .filter(|&i| self.inner.resolved[i].is_ok() && !self.in_kernel(i) && !self.is_span(i))
            .count()
    }

    /// Perf counters a thread holds when the engine has no row for it: every event but the spans
    /// and carried counts (counted in the kernel or not at all).
    pub fn perf_events_without_row(&self) -> usize {
        (0..self.len()).filter(|&i| self.inner.resolved[i].is_ok() && !self.is_span(i)).count()
    }

    /// The engine's rows and how many are free now, when tracepoints are counted in the kernel.
    pub fn engine_rows(&self) -> Option<(u32, usize)> {
        let tally = self.inner.engine.as_ref().ok().filter(|_| self.method() == Method::InKernel)?;
        Some((tally.rows(), tally.rows_free()))
    }

    fn is_span(&self, i: usize) -> bool {
        self.inner.specs.get(i).is_some_and(EventSpec::in_kernel_only)
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        self.inner.specs.len()
    }

    /// True when there are no events.
    pub fn is_empty(&self) -> bool {
        self.inner.specs.is_empty()
    }

    /// Why event `i` cannot be counted at all (unknown tracepoint, no tracefs), if so.
    pub fn unavailable(&self, i: usize) -> Option<&EventError> {
        self.inner.resolved.get(i).and_then(|r| r.as_ref().err()).map(|e| &**e)
    }

    /// The specs.
    pub fn specs(&self) -> &[EventSpec] {
        &self.inner.specs
    }
}

impl ListInner {
    /// Resolves `specs` against tracefs and finds (or makes) the engine counting them as `asked`.
    fn resolved(specs: Box<[EventSpec]>, asked: ListAsked) -> Self {
        let root = tracefs::root();
        let resolved: Box<[Resolution]> = specs
            .iter()
            .map(|spec| match spec {
                EventSpec::Software(config) => Ok((TYPE_SOFTWARE, *config)),
                EventSpec::Tracepoint { system, name, .. }
                | EventSpec::Span { system, start: name, .. }
                | EventSpec::Carried { system, name, .. } => {
                    tracefs::event_id(system, name).map(|id| (TYPE_TRACEPOINT, id)).map_err(Arc::new)
                }
            })
            .collect();
        let engine = match (asked.0, root) {
            (Method::Perf, _) => Err(InKernelError::PerfAsked),
            (Method::InKernel, Err(e)) => Err(InKernelError::Tracefs(e)),
            (Method::InKernel, Ok(root)) => shared_engine(root, &specs, asked.1.as_deref(), asked.2),
        };
        let columns = engine_columns(&specs)
            .into_iter()
            .enumerate()
            .map(|(i, column)| {
                let column = column?;
                let counted =
                    resolved[i].is_ok() && engine.as_ref().is_ok_and(|t| t.refused(column).is_none());
                counted.then_some(column)
            })
            .collect();
        Self { specs, resolved, engine, columns, asked }
    }
}

/// The counters of one thread: its row in the in-kernel engine, and perf counters (one group
/// where possible) for the events the engine does not count. It keeps only what differs from
/// one thread to another; what a read goes through is this process's thread's ([`READ_BUFFERS`]).
#[derive(Debug)]
pub struct ThreadEvents {
    /// The perf counters, by event index (empty where the engine counts the event).
    group: PerfGroup,
    /// The thread's row in the engine, when it has one, and the row's value when this list
    /// began counting the thread (another list of the same events may count it too; empty for
    /// a row that was all zeros, as a new thread's is).
    slot: Option<EngineRow>,
    /// Since when the row counts, when the engine keeps it ([`Engine::kept_since`]), asked once:
    /// a row's start does not change while a list holds it.
    kept_since: Option<u64>,
    /// The thread's counts at its last successful read (kept once it is gone).
    last: Box<[Option<u64>]>,
    /// The events perf refused on this thread, and why (those asked for only): most often none.
    refused: Box<[(usize, MemberError)]>,
}

/// A thread's row in an engine: the engine, the row, the thread, and the row's starting value.
type EngineRow = (Arc<Engine>, Slot, i32, Box<[u64]>);

/// What reads go through, kept per calling thread so that a read allocates nothing and every
/// counted thread shares them: the engine row of the last read and the buffer it is read
/// through, and the perf counters' reading.
struct ReadBuffers {
    scratch: Vec<u8>,
    row: Vec<u64>,
    perf: Vec<Option<u64>>,
}

thread_local! {
    static READ_BUFFERS: std::cell::RefCell<ReadBuffers> =
        const { std::cell::RefCell::new(ReadBuffers { scratch: Vec::new(), row: Vec::new(), perf: Vec::new() }) };
}

impl Drop for ThreadEvents {
    fn drop(&mut self) {
        if let Some((engine, _, tid, _)) = self.slot.take() {
            engine.remove_thread(tid);
        }
    }
}

impl ThreadEvents {
    /// Opens the counters of `events` on thread `tid` of process `pid`: its row in the list's
    /// in-kernel engine where it counts, perf counters for the rest. An event that does not open
    /// on this thread is not counted on it ([`is_open`](Self::is_open) says so, and
    /// [`refused`](Self::refused) why).
    pub fn open(pid: i32, tid: i32, events: &EventList) -> Self {
        Self::open_in(pid, tid, 0, events)
    }

    /// As [`open`](Self::open), the thread running the VM object `vm`: a row kept by an earlier
    /// observer is adopted only for the same thread running the same VM (see [`VmToken`]).
    pub fn open_in(pid: i32, tid: i32, vm: VmToken, events: &EventList) -> Self {
        let slot =
            events.inner.engine.as_ref().ok().filter(|_| events.method() == Method::InKernel).and_then(|t| {
                // A row kept by an earlier observer for this very thread and VM: its whole count is ours.
                let (adopted, other_vm) = t.claim(pid, tid, vm);
                if let Some((engine, slot)) = adopted {
                    return Some((engine, slot, tid, Box::default()));
                }
                if other_vm {
                    *OTHER_VM.lock().unwrap_or_else(|e| e.into_inner()).entry(pid).or_default() += 1;
                }
                // Every engine full and none may grow (or a failed map write): this thread's
                // tracepoints are perf counters.
                let (engine, slot) = match t.add_thread_in(pid, tid, vm) {
                    Ok(row) => row,
                    Err(EngineError::Full(_)) => {
                        note_full(t, pid, tid, events.perf_events_without_row());
                        return None;
                    }
                    Err(_) => return None,
                };
                match engine.read(slot) {
                    Ok(start) => Some((engine, slot, tid, starting_row(start))),
                    Err(_) => {
                        engine.remove_thread(tid);
                        None
                    }
                }
            });
        let in_engine = slot.is_some();
        let attrs = events.inner.specs.iter().enumerate().map(|(i, spec)| {
            let (type_, config) = *events.inner.resolved[i].as_ref().ok()?;
            if in_engine && events.in_kernel(i) {
                return None;
            }
            let filter = match spec {
                EventSpec::Tracepoint { filter, .. } => filter.as_deref(),
                EventSpec::Software(_) => None,
                // A span or a carried count has no perf counter: without the kernel's it is
                // not counted.
                EventSpec::Span { .. } | EventSpec::Carried { .. } => return None,
            };
            Some(EventAttr { type_, config, filter })
        });
        // An event that does not open on this thread is not counted on it (see `is_open`).
        let (group, opened) = PerfGroup::open(tid, attrs);
        let refused = opened
            .into_iter()
            .enumerate()
            .filter_map(|(i, o)| o.err().filter(|e| !matches!(e, MemberError::NotAsked)).map(|e| (i, e)))
            .collect();
        let last = vec![None; group.len()].into();
        let kept_since = slot.as_ref().and_then(|(engine, slot, _, _)| engine.kept_since(*slot));
        let mut me = Self { group, slot, kept_since, last, refused };
        // The first read sizes (and touches) the buffers every later read reuses.
        me.read(events);
        me
    }

    /// Since when its in-kernel counts count (µs since the epoch), when they are kept beyond
    /// this process (an adopted row: since an earlier observer began counting the thread).
    pub fn kept_since(&self) -> Option<u64> {
        self.kept_since
    }

    /// True when its tracepoints are counted in the engine's row for it (false: by perf counters,
    /// or not at all).
    pub fn in_engine(&self) -> bool {
        self.slot.is_some()
    }

    /// Perf descriptors it holds.
    pub fn fds(&self) -> usize {
        self.group.fds()
    }

    /// True when event `i` is counted for this thread (in the kernel or by a perf counter).
    pub fn is_open(&self, events: &EventList, i: usize) -> bool {
        self.group.is_open(i) || (self.slot.is_some() && events.in_kernel(i))
    }

    /// Why event `i` is not counted on this thread when perf refused it.
    pub fn refused(&self, events: &EventList, i: usize) -> Option<&MemberError> {
        if self.is_open(events, i) {
            return None;
        }
        self.refused.iter().find(|(at, _)| *at == i).map(|(_, e)| e)
    }

    /// Its counts at its last read ([`read`](Self::read)), by event (`None`: not counted).
    pub fn last(&self) -> &[Option<u64>] {
        &self.last
    }

    /// Reads every counter: by event, its count since the thread was opened (`None`: not
    /// counted). A counter that cannot be read now keeps its last count.
    pub fn read(&mut self, events: &EventList) -> &[Option<u64>] {
        READ_BUFFERS.with_borrow_mut(|buffers| {
            self.read_engine(events, &mut buffers.scratch, &mut buffers.row);
            if self.group.fds() > 0 {
                buffers.perf.resize(self.last.len(), None);
                self.group.read_into(&mut buffers.perf);
                for (last, value) in self.last.iter_mut().zip(&buffers.perf) {
                    if value.is_some() {
                        *last = *value;
                    }
                }
            }
        });
        &self.last
    }

    /// Reads its row in the engine, when it has one, into `last` (through `scratch` and `row`).
    fn read_engine(&mut self, events: &EventList, scratch: &mut Vec<u8>, row: &mut Vec<u64>) {
        let Some((engine, slot, _, start)) = &self.slot else { return };
        if engine.read_into(*slot, scratch, row).is_err() {
            return;
        }
        for (i, last) in self.last.iter_mut().enumerate() {
            if let Some(&Some(column)) = events.inner.columns.get(i)
                && let Some(now) = row.get(column)
            {
                // An adopted row starts empty: its count is its whole count.
                *last = Some(now.wrapping_sub(start.get(column).copied().unwrap_or(0)));
            }
        }
    }
}

/// The value of a row when a list began counting its thread, kept only when it is not all zeros.
fn starting_row(row: Vec<u64>) -> Box<[u64]> {
    if row.iter().all(|&v| v == 0) { Box::default() } else { row.into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_asked_alike_share_one_while_one_lives_and_none_outlives_its_last_holder() {
        let specs = || vec![EventSpec::tracepoint("syscalls", "sys_enter_getppid")];
        let (a, b) = (EventList::with_rows(specs(), 3), EventList::with_rows(specs(), 3));
        assert!(Arc::ptr_eq(&a.inner, &b.inner), "one list for both");
        let other = EventList::with_rows(specs(), 5);
        assert!(!Arc::ptr_eq(&a.inner, &other.inner), "a list asked otherwise is its own");
        let engine = a.inner.engine.as_ref().ok().map(Arc::downgrade);
        let list = Arc::downgrade(&a.inner);
        drop((a, b));
        assert!(list.upgrade().is_none(), "the registry holds lists weakly");
        assert!(engine.is_none_or(|e| e.upgrade().is_none()), "the engine goes with the last list");
    }
}
