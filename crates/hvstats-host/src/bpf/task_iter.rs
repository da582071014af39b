//! Every thread of a process's scheduler and fault accounting, read from the kernel's own
//! `struct task_struct` in one walk: a BPF task iterator (a tracing program of `BPF_TRACE_ITER`
//! on `bpf_iter_task`, linked to one process with the iterator's `pid` filter) writes one
//! [`TaskSched`] record per thread of the process with `bpf_seq_write`, and reading the
//! iterator gives them all. Where `/proc/PID/task/TID/{schedstat,stat}` cost two opens, reads
//! and parses per thread, this costs a few system calls per process, whatever its threads.
//!
//! ```text
//! task = ctx->task; if !task: return 0          // the walk's last call
//! record = { task->pid, task->tgid, task->se.sum_exec_runtime, task->sched_info.run_delay,
//!            task->sched_info.pcount, task->se.nr_migrations, task->gtime,
//!            task->min_flt, task->maj_flt }
//! bpf_seq_write(ctx->meta->seq, &record, sizeof record)
//! ```
//!
//! The fields' offsets come from the running kernel's BTF ([`super::btf`]); the verifier checks
//! each load against the same BTF. The values are those `schedstat` (run, wait, dispatches),
//! `sched` (`se.nr_migrations`) and `stat` (guest time, faults) show, from the thread's start.

use std::io;

use super::btf::{Btf, BtfError, Member};
use super::insn::{Asm, AsmError, Cond, HELPER_SEQ_WRITE, R0, R1, R2, R3, R6, R7, R10, Size};
use super::sys::{LoadError, Program, TaskIterLink};

/// The fields of `struct task_struct` a record holds, in its order.
const FIELDS: [&str; 9] = [
    "pid",
    "tgid",
    "se.sum_exec_runtime",
    "sched_info.run_delay",
    "sched_info.pcount",
    "se.nr_migrations",
    "gtime",
    "min_flt",
    "maj_flt",
];

/// Bytes of a record: one `u64` per field.
const RECORD: usize = 8 * FIELDS.len();

/// The most threads of one process a walk reads (4.5 MiB of records): far past any VMM's vCPU
/// threads (KVM's limit is 4,096 vCPUs), so a process that makes threads without end costs the
/// reader no more. A VM with a vCPU thread past it is given none of these counters.
const MAX_THREADS: usize = 65_536;

/// One thread's accounting, as the kernel keeps it from the thread's start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskSched {
    /// The thread's id.
    pub tid: i32,
    /// Its process's id.
    pub tgid: i32,
    /// Time run on a CPU, ns (`schedstat`'s first field).
    pub run_ns: u64,
    /// Time runnable and waiting for a CPU, ns (`schedstat`'s second).
    pub wait_ns: u64,
    /// Times put on a CPU (`schedstat`'s third).
    pub dispatches: u64,
    /// Moves between CPUs (`sched`'s `se.nr_migrations`).
    pub migrations: u64,
    /// Time run in a guest, ns (`stat`'s guest time is this in clock ticks).
    pub guest_ns: u64,
    /// Faults that loaded no page from disk.
    pub minor_faults: u64,
    /// Faults that loaded a page from disk.
    pub major_faults: u64,
}

impl TaskSched {
    fn parse(record: &[u8]) -> Option<Self> {
        let at = |i: usize| -> Option<u64> {
            let w = record.get(8 * i..8 * i + 8)?;
            Some(u64::from_ne_bytes(w.try_into().ok()?))
        };
        Some(Self {
            tid: i32::try_from(at(0)?).ok()?,
            tgid: i32::try_from(at(1)?).ok()?,
            run_ns: at(2)?,
            wait_ns: at(3)?,
            dispatches: at(4)?,
            migrations: at(5)?,
            guest_ns: at(6)?,
            minor_faults: at(7)?,
            major_faults: at(8)?,
        })
    }
}

/// Why the task iterator cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum TaskIterError {
    /// The kernel's BTF lacks what the program reads.
    #[error(transparent)]
    Btf(#[from] BtfError),
    /// A field of a size a load cannot take.
    #[error("task_struct.{0} is {1} bytes")]
    Size(&'static str, u32),
    /// The program could not be assembled.
    #[error(transparent)]
    Asm(#[from] AsmError),
    /// The kernel refused it (no CAP_BPF and CAP_PERFMON, no task iterator, the verifier).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The kernel refused to link it to a process (no process filter before Linux 6.1).
    #[error("the task iterator cannot be linked to one process: {0}")]
    Link(io::Error),
    /// This process is in a PID namespace of its own: the kernel's thread ids are not its.
    #[error("this process's PID namespace is not the host's: the kernel's thread ids are not /proc's")]
    Namespace,
}

/// The loaded task iterator program, shared by every process's link.
#[derive(Debug)]
pub struct TaskIterProgram {
    program: Program,
}

impl TaskIterProgram {
    /// Finds the fields in the running kernel's BTF, assembles the program and loads it.
    ///
    /// # Errors
    /// What [`TaskIterError`] says.
    pub fn load() -> Result<Self, TaskIterError> {
        let btf = Btf::vmlinux()?;
        let iter_task = btf.func("bpf_iter_task")?;
        let mut fields = [Member { offset: 0, size: 0 }; FIELDS.len()];
        for (field, name) in fields.iter_mut().zip(FIELDS) {
            *field = btf.member("task_struct", name)?;
            if Size::of(field.size as usize).is_none() {
                return Err(TaskIterError::Size(name, field.size));
            }
        }
        drop(btf);
        let insns = assemble(&fields)?;
        Ok(Self { program: Program::load_task_iter(&insns, iter_task)? })
    }
}

/// The task iterator program this process shares between its VMs, loaded at the first call:
/// `None` where it cannot be (without CAP_BPF and CAP_PERFMON, a kernel before 6.1), said once
/// with why and what is read instead ([`take_fallback_note`]).
pub fn shared() -> Option<&'static TaskIterProgram> {
    static SHARED: std::sync::OnceLock<Option<TaskIterProgram>> = std::sync::OnceLock::new();
    SHARED
        .get_or_init(|| {
            // A process filter is tried on this process: kernels before 6.1 load the program
            // and refuse the filter; and a record names a thread as the kernel's first PID
            // namespace does, which must be this process's for its ids to be /proc's.
            let tried = TaskIterProgram::load().and_then(|program| {
                let me = std::process::id() as i32;
                let mut tasks = ProcessTasks::open(&program, me).map_err(TaskIterError::Link)?;
                let walked = tasks.read().map_err(TaskIterError::Link)?.any(|t| t.tid == me);
                walked.then_some(program).ok_or(TaskIterError::Namespace)
            });
            tried
                .map_err(|e| *FALLBACK.lock().unwrap_or_else(|e| e.into_inner()) = Some(fallback_said(&e)))
                .ok()
        })
        .as_ref()
}

/// That the task iterator could not be loaded, not said yet.
static FALLBACK: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// What [`shared`] found, to be said once: why the iterator could not be loaded, and what is
/// read instead (given with [`crate::counting::full_notes`]).
pub(crate) fn take_fallback_note() -> Option<String> {
    FALLBACK.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// What the observer does without the task iterator, and why: a refusal for want of
/// privilege names the capabilities (the missing one is said on a line of its own).
fn fallback_said(e: &TaskIterError) -> String {
    let why = match e {
        TaskIterError::Load(LoadError { source, .. }) if source.raw_os_error() == Some(libc::EPERM) => {
            "loading it needs CAP_BPF and CAP_PERFMON".to_string()
        }
        e => crate::error_chain::error_chain(e),
    };
    format!(
        "the kernel's task iterator cannot be loaded ({why}): each vCPU thread's run time, CPU wait, \
         dispatches, guest time and faults are read from its /proc files every refresh, and its \
         migrations counted by a perf counter from attach"
    )
}

/// The program for `fields` (their places in `struct task_struct`, in [`FIELDS`]' order).
fn assemble(fields: &[Member; FIELDS.len()]) -> Result<Vec<u64>, AsmError> {
    let base = -(RECORD as i16);
    let mut a = Asm::default();
    let out = a.label();
    a.mov(R6, R1);
    a.load(Size::Dw, R7, R6, 8); // ctx->task
    a.jump_imm(Cond::Eq, R7, 0, out);
    for (i, field) in fields.iter().enumerate() {
        let size = Size::of(field.size as usize).unwrap_or(Size::Dw);
        let offset = i16::try_from(field.offset).map_err(|_| AsmError::TooFar)?;
        a.load(size, R1, R7, offset);
        a.store(Size::Dw, R10, base + 8 * i as i16, R1);
    }
    a.load(Size::Dw, R1, R6, 0); // ctx->meta
    a.load(Size::Dw, R1, R1, 0); // meta->seq
    a.mov(R2, R10);
    a.add_imm(R2, i32::from(base));
    a.mov_imm(R3, RECORD as i32);
    a.call(HELPER_SEQ_WRITE);
    a.bind(out);
    a.mov_imm(R0, 0);
    a.exit();
    a.finish()
}

/// The task iterator linked to the threads of one process.
#[derive(Debug)]
pub struct ProcessTasks {
    link: TaskIterLink,
    buf: Vec<u8>,
}

impl ProcessTasks {
    /// Links `program` to the threads of process `pid` (as this process's PID namespace numbers
    /// it). One descriptor, held until this is dropped.
    ///
    /// # Errors
    /// What `bpf(BPF_LINK_CREATE)` returns (ESRCH: no such process; EINVAL: a kernel before 6.1,
    /// whose task iterator has no process filter).
    pub fn open(program: &TaskIterProgram, pid: i32) -> io::Result<Self> {
        Ok(Self { link: TaskIterLink::of_process(&program.program, pid)?, buf: Vec::new() })
    }

    /// Every thread of the process now, in one walk.
    ///
    /// # Errors
    /// What creating or reading the iterator returns.
    pub fn read(&mut self) -> io::Result<impl Iterator<Item = TaskSched> + '_> {
        self.link.walk(&mut self.buf, (MAX_THREADS * RECORD) as u64)?;
        Ok(self.buf.chunks_exact(RECORD).filter_map(TaskSched::parse))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_read_back_field_by_field() {
        let words: Vec<u8> = (1..=9u64).flat_map(u64::to_ne_bytes).collect();
        let t = TaskSched::parse(&words).unwrap();
        assert_eq!((t.tid, t.tgid, t.run_ns, t.major_faults), (1, 2, 3, 9));
        assert_eq!(TaskSched::parse(&words[..64]), None);
    }
}
