//! Every thread's scheduler and fault accounting, and who it is, read from the kernel's own
//! `struct task_struct` in one walk: a BPF task iterator (a tracing program of `BPF_TRACE_ITER`
//! on `bpf_iter_task`) writes one [`Task`] record per thread with `bpf_seq_write`, and reading
//! the iterator gives them all. Linked to one process (the iterator's `pid` filter,
//! [`ProcessTasks`]) it walks that process's threads; linked to none ([`HostTasks`]) it walks
//! every user thread of the host once, which is what an observer of many VMMs reads each refresh:
//! one walk, a few system calls, for all of them. Where `/proc/PID/task/TID/{schedstat,stat}`
//! cost two opens, reads and parses per thread, and `/proc/PID/stat` and `/proc/PID/exe` a few
//! more per process, this costs a few system calls whatever the threads.
//!
//! ```text
//! task = ctx->task; if !task: return 0          // the walk's last call
//! if task->flags & PF_KTHREAD: return 0         // the kernel's own threads are no VMM's
//! record = { task->pid, task->tgid, task->se.sum_exec_runtime, task->sched_info.run_delay,
//!            task->sched_info.pcount, task->se.nr_migrations, task->gtime,
//!            task->min_flt, task->maj_flt, task->start_boottime, task->self_exec_id,
//!            task->flags, task->exit_state }
//! record.held = 0
//! if task->pid == task->tgid && (w = held_files[task->tgid]):     // a VMM whose VM is watched
//!     mine = file_at(task, w.vmm_fd); ours = file_at(current, w.own_fd)
//!     record.held = mine && mine == ours ? 1 : 2                   // kcmp(KCMP_FILE)'s answer
//! bpf_seq_write(ctx->meta->seq, &record, sizeof record)
//! ```
//!
//! `file_at(t, n)` is `t->files->fdt->fd[n]` for `n < fdt->max_fds`, read with
//! `bpf_probe_read_kernel` under the RCU read lock the walk holds: so the walk answers, for every
//! VMM an observer watches, whether it holds the VM the observer holds a copy of, where a
//! `kcmp(2)` per VMM a refresh asked it before. A process whose entry cannot be put in the map
//! (it is full) is asked by `kcmp` still; a kernel that refuses the check gets the program
//! without it.
//!
//! The fields' offsets come from the running kernel's BTF ([`super::btf`]); the verifier checks
//! each load against the same BTF. The values are those `schedstat` (run, wait, dispatches),
//! `sched` (`se.nr_migrations`) and `stat` (guest time, faults, start time) show, from the
//! thread's start; `self_exec_id` is what `exec()` counts up (a process that execs another
//! program, or itself again, keeps its pid and start time and gets the next one).

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Mutex;

use super::btf::{Btf, BtfError, Member};
use super::insn::{
    Asm, AsmError, Cond, HELPER_GET_CURRENT_TASK, HELPER_MAP_LOOKUP_ELEM, HELPER_PROBE_READ_KERNEL,
    HELPER_SEQ_WRITE, Label, R0, R1, R2, R3, R6, R7, R8, R9, R10, Reg, Size,
};
use super::sys::{ArrayMap, LoadError, Program, TaskIterLink};

/// The fields of `struct task_struct` a record holds, in its order.
pub(super) const FIELDS: [&str; 13] = [
    "pid",
    "tgid",
    "se.sum_exec_runtime",
    "sched_info.run_delay",
    "sched_info.pcount",
    "se.nr_migrations",
    "gtime",
    "min_flt",
    "maj_flt",
    "start_boottime",
    "self_exec_id",
    "flags",
    "exit_state",
];

/// Where `flags` is in [`FIELDS`].
const FLAGS: usize = 11;
/// `task_struct.flags`: a thread of the kernel's own.
const PF_KTHREAD: u32 = 0x0020_0000;
/// `task_struct.flags`: the thread is exiting.
const PF_EXITING: u64 = 0x0000_0004;

/// Where the answer of the held-file check is in a record, after [`FIELDS`]: 0 not asked, else
/// the process's descriptor << 32 | ours << 2 | 1 when it holds the file watched at it, 2 when
/// not (a descriptor is below 2^30, Linux's most).
pub(super) const HELD: usize = FIELDS.len();

/// Bytes of a record: one `u64` per field, and the held-file answer.
pub(super) const RECORD: usize = 8 * (FIELDS.len() + 1);

/// The members from a task to its descriptors' files: `task->files->fdt`, then the table's
/// size and array (`fdt->max_fds`, `fdt->fd`).
const FD_PATH: [(&str, &str); 4] =
    [("task_struct", "files"), ("files_struct", "fdt"), ("fdtable", "max_fds"), ("fdtable", "fd")];

/// Processes whose held file a walk checks at most (the map's keys): past them, `kcmp(2)`.
const WATCHED: u32 = 16_384;

/// The most threads a walk reads (6.5 MiB of records, of one process or of the whole host):
/// far past any VMM's vCPU threads (KVM's limit is 4,096 vCPUs) and past the user threads of a
/// host of 1,000 VMs, so a process that makes threads without end costs the reader no more. A
/// walk cut there is said so ([`Walked::complete`]); its reader does not take a thread missing
/// from it as gone.
pub(super) const MAX_THREADS: usize = 65_536;

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

/// One thread as a walk gives it: its accounting, and who it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Task {
    /// Its scheduler and fault accounting.
    pub sched: TaskSched,
    /// When it started, ns on the boot-time clock (`task->start_boottime`).
    pub start_ns: u64,
    /// Its process's `exec()`s (`task->self_exec_id`): the next one after each.
    pub exec_id: u64,
    /// True once it is exiting (`PF_EXITING`) or exited (`exit_state`, a zombie).
    pub exiting: bool,
    /// For the main thread of a process whose file is watched ([`TaskIterProgram::watch_file`]):
    /// whether the process held that file at its descriptor during the walk. `None` when not
    /// asked.
    pub held: Option<HeldFile>,
}

/// What a walk found of a process's file watched ([`TaskIterProgram::watch_file`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeldFile {
    /// The process's descriptor compared.
    pub fd: u32,
    /// This process's descriptor of the file watched.
    pub ours: i32,
    /// True when the process held, at `fd`, the very file `ours` is (`kcmp(KCMP_FILE)` says 0).
    pub held: bool,
}

impl Task {
    fn parse(record: &[u8]) -> Option<Self> {
        let at = |i: usize| -> Option<u64> {
            let w = record.get(8 * i..8 * i + 8)?;
            Some(u64::from_ne_bytes(w.try_into().ok()?))
        };
        let sched = TaskSched {
            tid: i32::try_from(at(0)?).ok()?,
            tgid: i32::try_from(at(1)?).ok()?,
            run_ns: at(2)?,
            wait_ns: at(3)?,
            dispatches: at(4)?,
            migrations: at(5)?,
            guest_ns: at(6)?,
            minor_faults: at(7)?,
            major_faults: at(8)?,
        };
        let exiting = at(FLAGS)? & PF_EXITING != 0 || at(12)? != 0;
        let held = match at(HELD)? {
            0 => None,
            word => Some(HeldFile {
                fd: (word >> 32) as u32,
                ours: (word as u32 >> 2) as i32,
                held: word & 3 == 1,
            }),
        };
        Some(Self { sched, start_ns: at(9)?, exec_id: at(10)?, exiting, held })
    }

    /// Its start time as `/proc/PID/stat`'s field 22 gives it: clock ticks after boot (the
    /// kernel's `nsec_to_clock_t`, an exact division).
    pub fn start_ticks(&self) -> u64 {
        self.start_ns / (1_000_000_000 / crate::task_stat::ticks_per_second())
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
    /// The kernel lacks what a walk needs (the function or flag named).
    #[error("the kernel has no {0}")]
    Unsupported(&'static str),
    /// This process is in a PID namespace of its own: the kernel's thread ids are not its.
    #[error("this process's PID namespace is not the host's: the kernel's thread ids are not /proc's")]
    Namespace,
}

/// The loaded task iterator program, shared by every process's link.
#[derive(Debug)]
pub struct TaskIterProgram {
    program: Program,
    /// The files watched, where the program checks them.
    held: Option<HeldFiles>,
    /// Where the record's fields are in `struct task_struct`, and the path to a task's files:
    /// what a walk of listed processes assembles its program from.
    pub(super) layout: TaskLayout,
}

/// Where a record's fields are in the running kernel's `struct task_struct` ([`FIELDS`]), and
/// the members from a task to its files ([`FD_PATH`], where the kernel has them as expected).
#[derive(Clone, Copy, Debug)]
pub(super) struct TaskLayout {
    /// The BTF id of `bpf_iter_task`, what a task iterator program attaches to.
    pub(super) iter_task: u32,
    pub(super) fields: [Member; FIELDS.len()],
    pub(super) path: Option<[Member; 4]>,
    /// The BTF id of `bpf_iter_task_file`, and `file.f_op`: what a task-file iterator program
    /// attaches to and reads ([`super::vm_files`]), where the kernel has them.
    pub(super) task_files: Option<(u32, Member)>,
}

/// The files a walk checks its processes hold: by process, the descriptor it holds the file at
/// and this process's own descriptor of the same file.
#[derive(Debug)]
struct HeldFiles {
    map: ArrayMap,
    /// What the map holds, by process: its descriptor, and ours.
    watched: Mutex<BTreeMap<i32, (u32, i32)>>,
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
        let path: Option<[Member; 4]> = FD_PATH
            .iter()
            .map(|(ty, member)| btf.member(ty, member).ok())
            .collect::<Option<Vec<_>>>()
            .and_then(|m| m.try_into().ok())
            .filter(|m: &[Member; 4]| [8, 8, 4, 8] == m.map(|m| m.size));
        let task_files = btf.func("bpf_iter_task_file").ok().zip(btf.member("file", "f_op").ok());
        let layout = TaskLayout { iter_task, fields, path, task_files };
        drop(btf);
        // With the held-file check where the kernel takes it, else without.
        let held = path.zip(ArrayMap::create_hash(8, WATCHED).ok());
        if let Some((path, map)) = held {
            let checked = assemble(&fields, Some((map.raw_fd(), &path)))
                .map_err(TaskIterError::from)
                .and_then(|insns| Ok(Program::load_task_iter(&insns, iter_task)?));
            if let Ok(program) = checked {
                let held = HeldFiles { map, watched: Mutex::new(BTreeMap::new()) };
                return Ok(Self { program, held: Some(held), layout });
            }
        }
        let insns = assemble(&fields, None)?;
        let layout = TaskLayout { path: None, ..layout };
        Ok(Self { program: Program::load_task_iter(&insns, iter_task)?, held: None, layout })
    }

    /// The map of the files watched, where the walks check them: by process, its descriptor
    /// and ours.
    pub(super) fn held_map(&self) -> Option<i32> {
        self.held.as_ref().map(|h| h.map.raw_fd())
    }

    /// Has each walk check whether process `pid` holds, at its descriptor `fd`, the file `ours`
    /// is this process's descriptor of (what `kcmp(KCMP_FILE)` tells): its main thread's
    /// [`Task::held`] says, naming the descriptors compared. False where it cannot (the program
    /// has no check, or the map is full): ask `kcmp` then. One watch per process: a later one
    /// replaces it.
    pub fn watch_file(&self, pid: i32, fd: u32, ours: BorrowedFd<'_>) -> bool {
        let Some(held) = &self.held else { return false };
        let own = ours.as_raw_fd();
        let mut value = [0u8; 8];
        value[..4].copy_from_slice(&fd.to_ne_bytes());
        value[4..].copy_from_slice(&(own as u32).to_ne_bytes());
        let mut watched = held.watched.lock().unwrap_or_else(|e| e.into_inner());
        if held.map.write(pid as u32, &value).is_err() {
            return false;
        }
        watched.insert(pid, (fd, own));
        true
    }

    /// Stops the check of process `pid`'s file, when the watch is the one of `fd` and `ours`
    /// (a later watch of the process stays).
    pub fn unwatch_file(&self, pid: i32, fd: u32, ours: BorrowedFd<'_>) {
        let Some(held) = &self.held else { return };
        let mut watched = held.watched.lock().unwrap_or_else(|e| e.into_inner());
        if watched.get(&pid) == Some(&(fd, ours.as_raw_fd())) {
            watched.remove(&pid);
            let _ = held.map.delete(pid as u32);
        }
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
            // The host's walk must give this process as /proc numbers it too.
            let tried = TaskIterProgram::load().and_then(|program| {
                let me = std::process::id() as i32;
                let mut tasks = ProcessTasks::open(&program, me).map_err(TaskIterError::Link)?;
                let walked = tasks.read().map_err(TaskIterError::Link)?.any(|t| t.tid == me);
                let mut host = HostTasks::open(&program).map_err(TaskIterError::Link)?;
                let hosted = host.walk().map_err(TaskIterError::Link)?.tasks().any(|t| t.sched.tid == me);
                (walked && hosted).then_some(program).ok_or(TaskIterError::Namespace)
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
        "the kernel's task iterator cannot be loaded ({why}): each VMM's identity and each vCPU \
         thread's start, run time, CPU wait, dispatches, guest time and faults are read from their \
         /proc files every refresh, and the threads' migrations counted by a perf counter from attach"
    )
}

/// The program for `fields` (their places in `struct task_struct`, in [`FIELDS`]' order), and,
/// with `held` (the map of files watched and [`FD_PATH`]'s members), the held-file check.
fn assemble(
    fields: &[Member; FIELDS.len()],
    held: Option<(i32, &[Member; 4])>,
) -> Result<Vec<u64>, AsmError> {
    let base = -(RECORD as i16);
    let mut a = Asm::default();
    let out = a.label();
    let write = a.label();
    a.mov(R6, R1);
    a.load(Size::Dw, R7, R6, 8); // ctx->task
    a.jump_imm(Cond::Eq, R7, 0, out);
    // flags & PF_KTHREAD, without a bitwise and: its bit shifted to the top, then to the bottom.
    let flags = fields[FLAGS];
    a.load(
        Size::of(flags.size as usize).unwrap_or(Size::W),
        R1,
        R7,
        i16::try_from(flags.offset).map_err(|_| AsmError::TooFar)?,
    );
    a.lsh_imm(R1, 63 - PF_KTHREAD.trailing_zeros() as i32);
    a.rsh_imm(R1, 63);
    a.jump_imm(Cond::Ne, R1, 0, out);
    load_record(&mut a, fields, base)?;
    if let Some((map, path)) = held {
        check_held(&mut a, base, map, path, write)?;
    }
    a.bind(write);
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

/// Loads the fields of the task in r7 into the record at `base` on the stack, its held-file
/// answer 0 (not asked).
pub(super) fn load_record(a: &mut Asm, fields: &[Member; FIELDS.len()], base: i16) -> Result<(), AsmError> {
    for (i, field) in fields.iter().enumerate() {
        let size = Size::of(field.size as usize).unwrap_or(Size::Dw);
        let offset = i16::try_from(field.offset).map_err(|_| AsmError::TooFar)?;
        a.load(size, R1, R7, offset);
        a.store(Size::Dw, R10, base + 8 * i as i16, R1);
    }
    a.store_imm(Size::Dw, R10, base + 8 * HELD as i16, 0);
    Ok(())
}

/// The held-file check of the record at `base` (its pid and tgid written), with the task in r7:
/// jumps to `done` with the answer in the record's [`HELD`] slot.
pub(super) fn check_held(
    a: &mut Asm,
    base: i16,
    map: i32,
    path: &[Member; 4],
    done: Label,
) -> Result<(), AsmError> {
    // Below the record: the map key, a read's landing slot, the two files.
    let (key, tmp, mine, ours) = (base - 8, base - 16, base - 24, base - 32);
    let held = base + 8 * HELD as i16;
    // The main thread only, of a process in the map.
    a.load(Size::Dw, R1, R10, base);
    a.load(Size::Dw, R2, R10, base + 8);
    a.jump_reg(Cond::Ne, R1, R2, done);
    a.store(Size::W, R10, key, R2);
    a.ld_map_fd(R1, map);
    a.mov(R2, R10);
    a.add_imm(R2, i32::from(key));
    a.call(HELPER_MAP_LOOKUP_ELEM);
    a.jump_imm(Cond::Eq, R0, 0, done);
    a.load(Size::W, R8, R0, 0); // its descriptor
    a.load(Size::W, R9, R0, 4); // ours
    // The answer names what it compared: its descriptor << 32 | ours << 2 | 2 (not held).
    a.mov(R1, R8);
    a.lsh_imm(R1, 32);
    a.mov(R2, R9);
    a.lsh_imm(R2, 2);
    a.add(R1, R2);
    a.add_imm(R1, 2);
    a.store(Size::Dw, R10, held, R1);
    file_at(a, R7, R8, path, tmp, mine, done)?;
    a.call(HELPER_GET_CURRENT_TASK);
    a.mov(R7, R0);
    file_at(a, R7, R9, path, tmp, ours, done)?;
    a.load(Size::Dw, R1, R10, mine);
    a.load(Size::Dw, R2, R10, ours);
    a.jump_imm(Cond::Eq, R1, 0, done);
    a.jump_reg(Cond::Ne, R1, R2, done);
    a.load(Size::Dw, R1, R10, held);
    a.add_imm(R1, -1); // 1: held
    a.store(Size::Dw, R10, held, R1);
    Ok(())
}

/// `task->files->fdt->fd[fd]` (`task` and `fd` in callee-saved registers) into the stack slot
/// `into`, through the slot `tmp`; jumps to `fail` when a read fails, a pointer is null, or
/// `fd` is past the table.
pub(super) fn file_at(
    a: &mut Asm,
    task: Reg,
    fd: Reg,
    path: &[Member; 4],
    tmp: i16,
    into: i16,
    fail: Label,
) -> Result<(), AsmError> {
    let offset = |m: Member| i32::try_from(m.offset).map_err(|_| AsmError::TooFar);
    let [files, fdt, max_fds, array] = *path;
    // tmp = *(src + off), 8 bytes (or 4, zero-extended), failing on a fault or, with
    // `nonnull`, a null pointer read.
    let read = |a: &mut Asm, src: Reg, off: i32, bytes: i32, nonnull: bool| {
        a.store_imm(Size::Dw, R10, tmp, 0);
        a.mov(R3, src);
        a.add_imm(R3, off);
        a.mov(R1, R10);
        a.add_imm(R1, i32::from(tmp));
        a.mov_imm(R2, bytes);
        a.call(HELPER_PROBE_READ_KERNEL);
        a.jump_imm(Cond::Ne, R0, 0, fail);
        a.load(Size::Dw, R3, R10, tmp);
        if nonnull {
            a.jump_imm(Cond::Eq, R3, 0, fail);
        }
    };
    read(a, task, offset(files)?, 8, true);
    read(a, R3, offset(fdt)?, 8, true);
    a.store(Size::Dw, R10, into, R3); // the table, for a moment
    read(a, R3, offset(max_fds)?, 4, false);
    a.jump_reg(Cond::Ge, fd, R3, fail);
    a.load(Size::Dw, R3, R10, into);
    read(a, R3, offset(array)?, 8, true);
    a.mov(R1, fd);
    a.lsh_imm(R1, 3);
    a.add(R3, R1);
    read(a, R3, 0, 8, false);
    a.store(Size::Dw, R10, into, R3);
    Ok(())
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
        Ok(self.tasks()?.tasks().map(|t| t.sched))
    }

    /// Every thread of the process now, and who each is, in one walk.
    ///
    /// # Errors
    /// What creating or reading the iterator returns.
    pub fn tasks(&mut self) -> io::Result<Walked<'_>> {
        walk(&self.link, &mut self.buf)
    }
}

/// The task iterator linked to every task of the host: each walk gives every user thread of every
/// process (the kernel's own threads are passed over in the kernel). The kernel visits every
/// task whichever filter a link has, and one of process would need one link and walk per
/// process; this walks once for all, and a reader keeps the records of the processes it
/// observes. One descriptor.
#[derive(Debug)]
pub struct HostTasks {
    link: TaskIterLink,
    buf: Vec<u8>,
}

impl HostTasks {
    /// Links `program` to every task of the host.
    ///
    /// # Errors
    /// What `bpf(BPF_LINK_CREATE)` returns.
    pub fn open(program: &TaskIterProgram) -> io::Result<Self> {
        Ok(Self { link: TaskIterLink::of_host(&program.program)?, buf: Vec::new() })
    }

    /// Every user thread of the host now, in one walk.
    ///
    /// # Errors
    /// What creating or reading the iterator returns.
    pub fn walk(&mut self) -> io::Result<Walked<'_>> {
        walk(&self.link, &mut self.buf)
    }
}

/// What one walk gave.
#[derive(Clone, Copy, Debug)]
pub struct Walked<'a> {
    records: &'a [u8],
    /// True when the walk was cut short (its room for records was full).
    cut: bool,
}

impl<'a> Walked<'a> {
    /// The threads walked, in the kernel's order.
    pub fn tasks(self) -> impl Iterator<Item = Task> + 'a {
        self.records.chunks_exact(RECORD).filter_map(Task::parse)
    }

    /// False when the walk was cut (at [`MAX_THREADS`], or where its room was full): a thread
    /// missing from it may live.
    pub fn complete(self) -> bool {
        !self.cut && self.records.len() < MAX_THREADS * RECORD
    }

    /// The records `records` hold (whole ones; [`RECORD`] bytes each), `cut` when the walk that
    /// wrote them was cut short.
    pub(super) fn of(records: &'a [u8], cut: bool) -> Self {
        Self { records, cut }
    }
}

/// Runs `link`'s walk into `buf`, at most [`MAX_THREADS`] records.
fn walk<'a>(link: &TaskIterLink, buf: &'a mut Vec<u8>) -> io::Result<Walked<'a>> {
    link.walk(buf, (MAX_THREADS * RECORD) as u64)?;
    Ok(Walked { records: buf, cut: false })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_read_back_field_by_field() {
        let mut words: Vec<u64> = (1..=13u64).chain([0]).collect();
        let t = Task::parse(&words.iter().flat_map(|w| w.to_ne_bytes()).collect::<Vec<u8>>()).unwrap();
        assert_eq!((t.sched.tid, t.sched.tgid, t.sched.run_ns, t.sched.major_faults), (1, 2, 3, 9));
        assert_eq!((t.start_ns, t.exec_id, t.exiting, t.held), (10, 11, true, None), "exit_state 13");
        for (answer, held) in [(1, true), (2, false)] {
            words[HELD] = (7 << 32) | ((1 << 30) - 1) << 2 | answer;
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
            assert_eq!(
                Task::parse(&bytes).unwrap().held,
                Some(HeldFile { fd: 7, ours: (1 << 30) - 1, held })
            );
        }
        words[HELD] = 0;
        (words[FLAGS], words[12]) = (PF_EXITING ^ 0xff, 0);
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        assert!(!Task::parse(&bytes).unwrap().exiting, "neither PF_EXITING nor exit_state");
        assert_eq!(Task::parse(&bytes[..RECORD - 8]), None);
    }
}
