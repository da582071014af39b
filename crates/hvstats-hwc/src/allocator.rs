//! `HalAllocateHardwareCounters` and `HalFreeHardwareCounters` over the shared table.
//!
//! Every operation takes the table lock, drops the records of holders whose process has exited,
//! decides, and writes the table back before releasing the lock; so what one process is granted is
//! visible to every other before they can decide, and nothing is handed out twice. Arguments are
//! validated before the table is read ([`super::request`]).

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

use hvstats_abi::hal::{GroupAffinity, NtStatus, PhysicalCounterResourceList};
use serde::Serialize;

use super::cpuset::CpuSet;
use super::holder::Holder;
use super::pmu::{PmuError, PmuShape};
use super::request::{Request, ResourceSet};
use super::table::{LockedTable, Record, TableData, TableError, TableFile};

/// The handle of an allocation (`*CounterSetHandle`); never 0, unique on the host while the
/// table exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct CounterSetHandle(u64);

impl CounterSetHandle {
    /// A handle from its number (for handles passed between processes or typed by an operator).
    pub const fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The handle's number.
    pub const fn raw(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for CounterSetHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// How long an allocation lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifetime {
    /// Until freed or until the allocating process exits, whichever comes first.
    Process,
    /// Until freed, by any process (an operator's allocation).
    UntilFreed,
}

/// Why an allocation or free did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum HwcError {
    /// Seed 002's answer to a request it refuses as malformed or unsupported.
    #[error("{0}")]
    Status(NtStatus),
    /// `STATUS_INSUFFICIENT_RESOURCES`, and why: which resource is held by which process, or that
    /// there is no PMU.
    #[error("{status}: {0}", status = NtStatus::INSUFFICIENT_RESOURCES)]
    Refused(Refusal),
    /// The shared table cannot be used.
    #[error(transparent)]
    Table(#[from] TableError),
}

impl HwcError {
    /// The `NTSTATUS` a HAL caller sees: the status itself, or `STATUS_INSUFFICIENT_RESOURCES` when
    /// the request conflicts, needs a PMU there is not, or the table cannot be used (nothing can
    /// be granted or released until it can).
    pub fn status(&self) -> NtStatus {
        match self {
            Self::Status(s) => *s,
            Self::Refused(_) | Self::Table(_) => NtStatus::INSUFFICIENT_RESOURCES,
        }
    }
}

/// Why a well-formed request could not be granted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The request names counters, the overflow interrupt or the event buffer, and the machine has
    /// no PMU.
    NoPmu {
        /// Why there is none (the PMU shape's reason).
        reason: PmuError,
    },
    /// An allocation already holds some of what was asked, on some of the processors asked for.
    Held {
        /// What the two have in common.
        resources: ResourceSet,
        /// On which processors.
        cpus: CpuSet,
        /// The holder's allocation.
        handle: CounterSetHandle,
        /// Who holds it.
        holder: Holder,
    },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoPmu { reason } => write!(f, "no PMU: {reason}"),
            Self::Held { resources, cpus, handle, holder } => {
                let lifetime = if holder.persistent { ", until freed" } else { "" };
                write!(
                    f,
                    "{resources} on CPUs {cpus} held by handle {handle} (process {} pid {}{lifetime})",
                    holder.name, holder.pid
                )
            }
        }
    }
}

/// An allocation as the table shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Allocation {
    /// The allocation's number in the table; never reused while the table exists.
    pub handle: CounterSetHandle,
    /// The process that holds it (pid and start time, so a reused pid is not mistaken for it).
    pub holder: Holder,
    /// The CPUs it holds counters on.
    pub cpus: CpuSet,
    /// What is held on each of them.
    pub resources: ResourceSet,
}

impl From<Record> for Allocation {
    fn from(r: Record) -> Self {
        Self { handle: CounterSetHandle(r.handle), holder: r.holder, cpus: r.cpus, resources: r.resources }
    }
}

/// The hardware counter allocator of one runtime directory, shared with every process using it.
#[derive(Clone, Debug)]
pub struct Allocator {
    table: TableFile,
    pmu: PmuShape,
    audit_log: Option<PathBuf>,
}

#[derive(Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum AuditEntry<'a> {
    Grant { seq: u64, handle: u64, pid: u32, cpus: &'a CpuSet, resources: &'a ResourceSet },
    Release { seq: u64, handle: u64, pid: u32, why: &'static str },
}

impl Allocator {
    /// The allocator whose table lives under `runtime_dir`, for a PMU of shape `pmu`.
    ///
    /// Every process sharing the directory must use the same shape.
    ///
    /// # Errors
    /// When `<runtime_dir>/hwc` cannot be created.
    pub fn open(runtime_dir: &Path, pmu: PmuShape) -> Result<Self, TableError> {
        Ok(Self { table: TableFile::open(runtime_dir)?, pmu, audit_log: None })
    }

    /// Also appends one JSON line per grant and release to `path`, written under the table lock,
    /// so the order of the lines is the order in which the table changed. (A line is written just
    /// before the table; should writing the table then fail, the operation fails and the line
    /// describes a change that did not happen.)
    pub fn with_audit_log(mut self, path: impl Into<PathBuf>) -> Self {
        self.audit_log = Some(path.into());
        self
    }

    /// Waits at most `timeout` for another process to release the table lock (default 10 s)
    /// before an operation fails with [`TableError::Io`].
    pub fn with_lock_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.table.set_lock_timeout(timeout);
        self
    }

    /// The PMU shape the allocator decides against.
    pub fn pmu(&self) -> &PmuShape {
        &self.pmu
    }

    /// The table's data file.
    pub fn table_path(&self) -> PathBuf {
        self.table.path()
    }

    /// `HalAllocateHardwareCounters`, held until freed or until this process exits.
    ///
    /// `affinity`: `None` = every processor; group `g` bit `b` is Linux CPU `64 * g + b`.
    /// `resources`: `None` = exclusive use of the whole PMU on those processors.
    ///
    /// # Errors
    /// `STATUS_INVALID_PARAMETER`, `STATUS_NOT_SUPPORTED` or `STATUS_INSUFFICIENT_RESOURCES` as
    /// described in [`super::request`]; `STATUS_INSUFFICIENT_RESOURCES` also when the table cannot
    /// be used (see [`Allocator::try_allocate`] for the reason).
    pub fn allocate(
        &self,
        affinity: Option<&[GroupAffinity]>,
        resources: Option<&PhysicalCounterResourceList<'_>>,
    ) -> Result<CounterSetHandle, NtStatus> {
        self.try_allocate(affinity, resources, Lifetime::Process).map_err(|e| e.status())
    }

    /// [`Allocator::allocate`] with a chosen lifetime and the table's errors kept.
    ///
    /// # Errors
    /// [`HwcError::Status`] with seed 002's status, or [`HwcError::Table`].
    pub fn try_allocate(
        &self,
        affinity: Option<&[GroupAffinity]>,
        resources: Option<&PhysicalCounterResourceList<'_>>,
        lifetime: Lifetime,
    ) -> Result<CounterSetHandle, HwcError> {
        let request = self.validate(affinity, resources)?;
        let holder = Holder::current(lifetime == Lifetime::UntilFreed).map_err(TableError::Identity)?;
        let locked = self.table.lock()?;
        let mut data = locked.read()?;
        let mut audit = Vec::new();
        reap(&mut data, &mut audit);
        let ours = self.pmu.fingerprint();
        if let Some(table) = data.pmu.as_ref().filter(|t| **t != ours && !data.records.is_empty()) {
            let e = TableError::ShapeMismatch { table: table.clone(), ours };
            if !audit.is_empty() {
                self.commit(&locked, &data, &audit)?;
            }
            return Err(e.into());
        }
        let result = self.grant(&mut data, &mut audit, request, holder);
        if !audit.is_empty() {
            self.commit(&locked, &data, &audit)?;
        }
        result
    }

    /// Seed 002's argument checks, with "no hardware" told as the PMU's absence and its reason.
    fn validate(
        &self,
        affinity: Option<&[GroupAffinity]>,
        resources: Option<&PhysicalCounterResourceList<'_>>,
    ) -> Result<Request, HwcError> {
        Request::validate(affinity, resources, &self.pmu).map_err(|s| match self.pmu.absent_reason() {
            Some(reason) if s == NtStatus::INSUFFICIENT_RESOURCES => {
                HwcError::Refused(Refusal::NoPmu { reason: reason.clone() })
            }
            _ => HwcError::Status(s),
        })
    }

    /// Grants `request` to `holder` in the locked table's `data` (with its audit line), or says
    /// who holds what it conflicts with, or that the handles are exhausted.
    fn grant(
        &self,
        data: &mut TableData,
        audit: &mut Vec<String>,
        request: Request,
        holder: Holder,
    ) -> Result<CounterSetHandle, HwcError> {
        let conflict = data
            .records
            .iter()
            .find(|r| r.cpus.intersects(&request.cpus) && r.resources.conflicts_with(&request.resources));
        if let Some(r) = conflict {
            return Err(HwcError::Refused(Refusal::Held {
                resources: request.resources.shared_with(&r.resources),
                cpus: r.cpus.iter().filter(|&c| request.cpus.contains(c)).collect(),
                handle: CounterSetHandle(r.handle),
                holder: r.holder.clone(),
            }));
        }
        if data.next_handle == u64::MAX {
            // Handles are never reused while the table exists; the last one is never given out, so
            // `next_handle` stays above every handle granted.
            return Err(HwcError::Table(TableError::HandlesExhausted { path: self.table.path() }));
        }
        let handle = data.next_handle;
        data.next_handle += 1;
        data.generation = data.generation.wrapping_add(1);
        let entry = AuditEntry::Grant {
            seq: data.generation,
            handle,
            pid: holder.pid,
            cpus: &request.cpus,
            resources: &request.resources,
        };
        audit.push(serde_json::to_string(&entry).unwrap_or_default());
        data.records.push(Record { handle, holder, cpus: request.cpus, resources: request.resources });
        data.pmu = Some(self.pmu.fingerprint());
        Ok(CounterSetHandle(handle))
    }

    /// `HalFreeHardwareCounters`: `STATUS_SUCCESS`, or `STATUS_INVALID_PARAMETER` for a handle that
    /// is not held (unknown, already freed, or released because its process exited).
    /// `STATUS_INSUFFICIENT_RESOURCES` when the table cannot be used ([`Allocator::try_free`]).
    pub fn free(&self, handle: CounterSetHandle) -> NtStatus {
        match self.try_free(handle) {
            Ok(()) => NtStatus::SUCCESS,
            Err(e) => e.status(),
        }
    }

    /// [`Allocator::free`] with the table's errors kept. Any process may free any handle.
    ///
    /// # Errors
    /// [`HwcError::Status`] (`STATUS_INVALID_PARAMETER`) or [`HwcError::Table`].
    pub fn try_free(&self, handle: CounterSetHandle) -> Result<(), HwcError> {
        let locked = self.table.lock()?;
        let mut data = locked.read()?;
        let mut audit = Vec::new();
        reap(&mut data, &mut audit);
        let result = match data.records.iter().position(|r| r.handle == handle.0) {
            None => Err(HwcError::Status(NtStatus::INVALID_PARAMETER)),
            Some(i) => {
                data.records.remove(i);
                data.generation = data.generation.wrapping_add(1);
                let entry = AuditEntry::Release {
                    seq: data.generation,
                    handle: handle.0,
                    pid: std::process::id(),
                    why: "freed",
                };
                audit.push(serde_json::to_string(&entry).unwrap_or_default());
                Ok(())
            }
        };
        if !audit.is_empty() {
            self.commit(&locked, &data, &audit)?;
        }
        result
    }

    /// The allocations held now, by handle (holders that exited are released first).
    ///
    /// # Errors
    /// When the table cannot be used.
    pub fn allocations(&self) -> Result<Vec<Allocation>, TableError> {
        let locked = self.table.lock()?;
        let mut data = locked.read()?;
        let mut audit = Vec::new();
        reap(&mut data, &mut audit);
        if !audit.is_empty() {
            self.commit(&locked, &data, &audit)?;
        }
        let mut all: Vec<Allocation> = data.records.into_iter().map(Allocation::from).collect();
        all.sort_by_key(|a| a.handle);
        Ok(all)
    }

    /// The allocation `handle`, if it is held.
    ///
    /// # Errors
    /// When the table cannot be used.
    pub fn allocation(&self, handle: CounterSetHandle) -> Result<Option<Allocation>, TableError> {
        Ok(self.allocations()?.into_iter().find(|a| a.handle == handle))
    }

    fn commit(&self, locked: &LockedTable<'_>, data: &TableData, audit: &[String]) -> Result<(), TableError> {
        if let Some(path) = &self.audit_log {
            let io_err = |action| move |source| TableError::Io { action, path: path.clone(), source };
            let mut f = OpenOptions::new().create(true).append(true).open(path).map_err(io_err("open"))?;
            let mut text = audit.join("\n");
            text.push('\n');
            f.write_all(text.as_bytes()).map_err(io_err("append to"))?;
        }
        locked.write(data)
    }
}

/// Drops the records of holders that no longer hold, noting each release for the audit log.
fn reap(data: &mut TableData, audit: &mut Vec<String>) {
    let (live, dead): (Vec<Record>, Vec<Record>) =
        std::mem::take(&mut data.records).into_iter().partition(|r| r.holder.is_alive());
    data.records = live;
    for r in dead {
        data.generation = data.generation.wrapping_add(1);
        let entry = AuditEntry::Release {
            seq: data.generation,
            handle: r.handle,
            pid: r.holder.pid,
            why: "holder exited",
        };
        audit.push(serde_json::to_string(&entry).unwrap_or_default());
    }
}
