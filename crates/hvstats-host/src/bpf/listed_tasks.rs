//! The threads of the processes an observer lists, walked in the kernel in one pass that visits
//! them and no other task: where the host's walk ([`super::task_iter::HostTasks`]) visits every
//! task of the host (looking each up by its id, taking and dropping a reference, and numbering
//! it in the reader's namespace) and the reader keeps those of the processes it observes, this
//! follows each listed process's own list of threads. Its cost grows with the threads observed,
//! not with the host's tasks; and its records are read from memory, not copied out by `read`.
//!
//! A task iterator program, linked to this process alone, runs once for its main thread:
//!
//! ```text
//! state = { walked = 0, listed = N (the reader's) }
//! for i in 0..state.listed:                                   // bpf_iter_num
//!     process = bpf_task_from_pid(pids[i]); if !process: continue
//!     for thread in threads of process:                       // bpf_iter_task, PROC_THREADS
//!         record = what the host's walk writes of thread (held-file check too)
//!         if records[state.walked] exists: records[state.walked] = record
//!         state.walked += 1
//!     bpf_task_release(process)
//! ```
//!
//! `pids` is an array the reader writes where its list changed; `records` and `state` are arrays
//! the reader maps. The room for processes and records starts small. A walk that found more
//! threads than its room is cut; the walk is then made anew (its program with it) with room for
//! all it found, and more, and walked again at once. Only one cut again (threads made between
//! the two) says so ([`Walked::complete`]).

use std::collections::BTreeSet;
use std::io;

use super::btf::Btf;
use super::insn::{
    Asm, AsmError, Cond, HELPER_MAP_LOOKUP_ELEM, HELPER_PROBE_READ_KERNEL, R0, R1, R2, R3, R6, R7, R10, Size,
};
use super::sys::{ArrayMap, Program, TaskIterLink};
use super::task_iter::{
    FIELDS, HELD, HostTasks, MAX_THREADS, RECORD, TaskIterError, TaskIterProgram, TaskLayout, Walked,
    check_held, load_record,
};

/// `BPF_TASK_ITER_PROC_THREADS`: the open-coded task iterator walks one process's threads.
const PROC_THREADS: i32 = 2;

/// The state's words: threads walked (records written, while there is room), and processes
/// listed (the reader's).
const WALKED: usize = 0;
const LISTED: usize = 1;
const STATE_BYTES: usize = 16;

/// The byte offset of state word `word`.
const fn at(word: usize) -> i16 {
    8 * word as i16
}

/// The first room for processes and for records: a few hundred VMs' threads.
const FIRST_PROCESSES: u32 = 256;
const FIRST_RECORDS: u32 = 4096;

/// The threads a process is given room for before a walk found how many it has: a VMM's main
/// thread, a few vCPUs' and its workers.
const THREADS_PER_PROCESS: u64 = 8;

/// The kernel functions the walk calls, by their ids in the kernel's BTF (Linux 6.7 and later
/// have them all).
#[derive(Clone, Copy, Debug)]
pub(super) struct Kfuncs {
    pub(super) num_new: u32,
    pub(super) num_next: u32,
    pub(super) num_destroy: u32,
    task_new: u32,
    task_next: u32,
    task_destroy: u32,
    from_pid: u32,
    release: u32,
}

impl Kfuncs {
    /// The functions, where the running kernel has every one (its BTF read once a process).
    pub(super) fn of_kernel() -> Option<Self> {
        static FOUND: std::sync::OnceLock<Option<Kfuncs>> = std::sync::OnceLock::new();
        *FOUND.get_or_init(|| Self::find(&Btf::vmlinux().ok()?))
    }

    /// The functions, where `btf` has every one.
    fn find(btf: &Btf) -> Option<Self> {
        let f = |name: &str| btf.func(name).ok();
        Some(Self {
            num_new: f("bpf_iter_num_new")?,
            num_next: f("bpf_iter_num_next")?,
            num_destroy: f("bpf_iter_num_destroy")?,
            task_new: f("bpf_iter_task_new")?,
            task_next: f("bpf_iter_task_next")?,
            task_destroy: f("bpf_iter_task_destroy")?,
            from_pid: f("bpf_task_from_pid")?,
            release: f("bpf_task_release")?,
        })
    }
}

/// The walk of the listed processes' threads: its program, linked to this process, and the
/// maps it reads and writes.
#[derive(Debug)]
pub struct ListedTasks {
    source: &'static TaskIterProgram,
    link: TaskIterLink,
    state: ArrayMap,
    pids: ArrayMap,
    records: ArrayMap,
    /// The processes `pids` lists now, in its order.
    listed: Vec<i32>,
    /// The last walk's records, copied out of `records`.
    buf: Vec<u8>,
    /// The threads the last walk found: the next has room for them, and more.
    found: u64,
    /// The program, kept while the link lives.
    _program: Program,
}

impl ListedTasks {
    /// The walk assembled on `source`'s layout (and its watched files' map), with room for a
    /// few hundred processes.
    ///
    /// # Errors
    /// Where the kernel lacks the functions or the mapped arrays it needs, or refuses it.
    pub fn open(source: &'static TaskIterProgram) -> Result<Self, TaskIterError> {
        Self::with_room(source, FIRST_PROCESSES, FIRST_RECORDS)
    }

    fn with_room(
        source: &'static TaskIterProgram,
        processes: u32,
        records: u32,
    ) -> Result<Self, TaskIterError> {
        let layout = source.layout;
        let kfuncs = Kfuncs::of_kernel().ok_or(TaskIterError::Unsupported("bpf_iter_task_new"))?;
        let state = ArrayMap::create_mapped(STATE_BYTES, 1).map_err(TaskIterError::Link)?;
        let pids = ArrayMap::create(4, processes, false).map_err(TaskIterError::Link)?;
        let out = ArrayMap::create_mapped(RECORD, records).map_err(TaskIterError::Link)?;
        if !state.is_mapped() || !out.is_mapped() {
            return Err(TaskIterError::Unsupported("BPF_F_MMAPABLE"));
        }
        let maps = Maps { state: state.raw_fd(), pids: pids.raw_fd(), records: out.raw_fd() };
        let held = source.held_map().zip(layout.path);
        let insns = assemble(&layout, &kfuncs, maps, held)?;
        let program = Program::load_task_iter(&insns, layout.iter_task)?;
        let link =
            TaskIterLink::of_process(&program, std::process::id() as i32).map_err(TaskIterError::Link)?;
        Ok(Self {
            source,
            link,
            state,
            pids,
            records: out,
            listed: Vec::new(),
            buf: Vec::new(),
            found: 0,
            _program: program,
        })
    }

    /// Walks the threads of the processes in `processes` (as the host's PID namespace numbers
    /// them), once. A process that is gone has none.
    ///
    /// # Errors
    /// What writing the list, or running the walk, returns.
    pub fn walk(&mut self, processes: &BTreeSet<i32>) -> io::Result<Walked<'_>> {
        let mut complete = self.walk_once(processes)?;
        // Cut for want of room for the threads it found: made again at once with room for them,
        // so the walk that grows leaves no VM to `/proc` for a tick. (Threads made meanwhile may
        // cut it again: the next walk grows further.)
        let records = self.records.entries();
        if !complete && self.found > u64::from(records) && records < MAX_THREADS as u32 {
            complete = self.walk_once(processes)?;
        }
        Ok(Walked::of(&self.buf, !complete))
    }

    /// Walks the threads of `processes` once, into `buf`: whether it walked them all.
    fn walk_once(&mut self, processes: &BTreeSet<i32>) -> io::Result<bool> {
        self.make_room(processes.len())?;
        // Those past the room are not walked: the walk is cut.
        let unlisted = processes.len().saturating_sub(self.pids.entries() as usize);
        self.list(processes.iter().take(self.pids.entries() as usize))?;
        self.link.walk(&mut self.buf, 1)?;
        self.found = self.state.mapped_word(0, WALKED).unwrap_or(u64::MAX);
        let cut = self.found > u64::from(self.records.entries());
        let written = self.found.min(u64::from(self.records.entries())) as u32;
        if !self.records.copy_mapped(written, &mut self.buf) {
            return Err(io::ErrorKind::Unsupported.into());
        }
        Ok(!cut && unlisted == 0)
    }

    /// Makes the walk anew with room for `processes` processes, and for their threads: a
    /// quarter more than the last walk found, and when the processes outgrew their room,
    /// [`THREADS_PER_PROCESS`] each (up to [`MAX_THREADS`]).
    fn make_room(&mut self, processes: usize) -> io::Result<()> {
        let (mut p, mut r) = (self.pids.entries(), self.records.entries());
        // Each process has a thread: past MAX_THREADS processes, the walk is cut anyway.
        while (p as usize) < processes.min(MAX_THREADS) {
            p = p.saturating_mul(2).min(MAX_THREADS as u32);
        }
        // Made anew for more processes: room for their threads too, before a walk tells them.
        let guess = match p == self.pids.entries() {
            true => 0,
            false => THREADS_PER_PROCESS.saturating_mul(processes as u64),
        };
        let wanted = self.found.saturating_add(self.found / 4).max(guess).min(MAX_THREADS as u64) as u32;
        while r < wanted {
            r = r.saturating_mul(2).min(MAX_THREADS as u32);
        }
        if (p, r) != (self.pids.entries(), self.records.entries()) {
            *self = Self::with_room(self.source, p, r).map_err(io::Error::other)?;
        }
        Ok(())
    }

    /// Writes `processes` into the list, where it changed.
    fn list<'p>(&mut self, processes: impl Iterator<Item = &'p i32>) -> io::Result<()> {
        let mut count = 0;
        for (i, &pid) in processes.enumerate() {
            count += 1;
            if self.listed.get(i) != Some(&pid) {
                self.pids.write(i as u32, &pid.to_ne_bytes())?;
                match self.listed.get_mut(i) {
                    Some(at) => *at = pid,
                    None => self.listed.push(pid),
                }
            }
        }
        self.listed.truncate(count);
        let listed = self.listed.len() as u64;
        if self.state.mapped_word(0, LISTED) != Some(listed) {
            let mut state = [0u8; STATE_BYTES];
            state[8 * LISTED..8 * LISTED + 8].copy_from_slice(&listed.to_ne_bytes());
            self.state.write(0, &state)?;
        }
        Ok(())
    }
}

/// The walk of the threads of the processes a reader observes: theirs alone where the kernel
/// has what [`ListedTasks`] needs, else the host's every task (said once, [`say_host_walk`]).
#[derive(Debug)]
pub enum ObservedTasks {
    /// Their own threads, and no other task.
    Listed(ListedTasks),
    /// Every task of the host: the reader keeps the records of its processes.
    Host(HostTasks),
}

impl ObservedTasks {
    /// The walk of the listed processes' threads on `program`'s layout, or of the host's every
    /// task where that cannot be had.
    ///
    /// # Errors
    /// What linking the host's walk returns, where it is the one had.
    pub fn open(program: &'static TaskIterProgram) -> io::Result<Self> {
        Ok(match ListedTasks::open(program) {
            Ok(listed) => Self::Listed(listed),
            Err(why) => {
                say_host_walk(&why);
                Self::Host(HostTasks::open(program)?)
            }
        })
    }

    /// True when a walk gives the records of other processes than those listed too.
    pub fn gives_others(&self) -> bool {
        matches!(self, Self::Host(_))
    }

    /// Walks the threads of `processes` once (see [`gives_others`](Self::gives_others)).
    ///
    /// # Errors
    /// What running the walk returns.
    pub fn walk(&mut self, processes: &BTreeSet<i32>) -> io::Result<Walked<'_>> {
        match self {
            Self::Listed(listed) => listed.walk(processes),
            Self::Host(host) => host.walk(),
        }
    }
}

/// That the observer walks the host's every task, the walk of the listed processes not being had,
/// not said yet.
static HOST_WALK: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Has it said once ([`take_note`]) that a reader walks the host's every task for its processes'
/// threads, because [`ListedTasks::open`] failed with `why`: the same records, at a cost that
/// follows the host's tasks, not the observed threads.
pub fn say_host_walk(why: &TaskIterError) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    *HOST_WALK.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!(
        "the observed VMMs' threads are walked among every task of the host, at a cost that \
         follows the host's tasks, not the observed threads: the walk of the observed processes' \
         own threads cannot be had ({})",
        crate::error_chain::error_chain(why)
    ));
}

/// What [`say_host_walk`] has to say, once (given with [`crate::counting::full_notes`]).
pub(crate) fn take_note() -> Option<String> {
    HOST_WALK.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// The maps the program names.
#[derive(Clone, Copy)]
struct Maps {
    state: i32,
    pids: i32,
    records: i32,
}

/// Stack slots below the record and the held-file check's own four.
const ITER: i16 = -(RECORD as i16) - 56;
const NUM: i16 = ITER - 8;
const PROCESS: i16 = NUM - 8;
const KEY: i16 = PROCESS - 8;

/// The program (see the module's text).
fn assemble(
    layout: &TaskLayout,
    kfuncs: &Kfuncs,
    maps: Maps,
    held: Option<(i32, [super::btf::Member; 4])>,
) -> Result<Vec<u64>, TaskIterError> {
    let mut a = Asm::default();
    let out = a.label();
    // Once a walk: for this process's main thread.
    main_thread_state(&mut a, layout, maps.state, KEY, out)?;
    a.store_imm(Size::Dw, R6, at(WALKED), 0);
    a.mov_imm(R2, 0);
    a.load(Size::W, R3, R6, at(LISTED));
    for_each_number(a, kfuncs, NUM, out, |a, next| {
        lookup(a, maps.pids, KEY, Some(R1));
        a.jump_imm(Cond::Eq, R0, 0, next);
        a.load(Size::W, R1, R0, 0);
        a.call_kfunc(kfuncs.from_pid);
        a.jump_imm(Cond::Eq, R0, 0, next);
        a.store(Size::Dw, R10, PROCESS, R0);
        stack_ptr(a, R1, ITER);
        a.mov(R2, R0);
        a.mov_imm(R3, PROC_THREADS);
        a.call_kfunc(kfuncs.task_new);
        threads(a, layout, kfuncs, maps.records, held.as_ref())?;
        stack_ptr(a, R1, ITER);
        a.call_kfunc(kfuncs.task_destroy);
        a.load(Size::Dw, R1, R10, PROCESS);
        a.call_kfunc(kfuncs.release);
        Ok(())
    })
}

/// The rest of a program that runs `body` for each number from r2 to before r3 (in r1 at
/// its start; the kernel's open-coded number iterator, at the stack slot `num`), `body`
/// jumping to the label it is given to go on to the next, then ends there and at `out`.
pub(super) fn for_each_number(
    mut a: Asm,
    kfuncs: &Kfuncs,
    num: i16,
    out: super::insn::Label,
    body: impl FnOnce(&mut Asm, super::insn::Label) -> Result<(), TaskIterError>,
) -> Result<Vec<u64>, TaskIterError> {
    let (next, done) = (a.label(), a.label());
    stack_ptr(&mut a, R1, num);
    a.call_kfunc(kfuncs.num_new);
    a.bind(next);
    stack_ptr(&mut a, R1, num);
    a.call_kfunc(kfuncs.num_next);
    a.jump_imm(Cond::Eq, R0, 0, done);
    a.load(Size::W, R1, R0, 0);
    body(&mut a, next)?;
    a.ja(next);
    a.bind(done);
    stack_ptr(&mut a, R1, num);
    a.call_kfunc(kfuncs.num_destroy);
    a.bind(out);
    a.mov_imm(R0, 0);
    a.exit();
    Ok(a.finish()?)
}

/// The walk of one process's threads, its task iterator at [`ITER`] and the state in r6: each
/// thread's record written at the state's count of threads walked, while the records have room
/// for it, and counted.
fn threads(
    a: &mut Asm,
    layout: &TaskLayout,
    kfuncs: &Kfuncs,
    records: i32,
    held: Option<&(i32, [super::btf::Member; 4])>,
) -> Result<(), TaskIterError> {
    let base = -(RECORD as i16);
    let (next, done, write, counted) = (a.label(), a.label(), a.label(), a.label());
    a.bind(next);
    stack_ptr(a, R1, ITER);
    a.call_kfunc(kfuncs.task_next);
    a.jump_imm(Cond::Eq, R0, 0, done);
    a.mov(R7, R0);
    load_record(a, &layout.fields, base)?;
    if let Some((map, path)) = held {
        check_held(a, base, *map, path, write)?;
    }
    a.bind(write);
    a.load(Size::Dw, R1, R6, at(WALKED));
    lookup(a, records, KEY, Some(R1));
    a.jump_imm(Cond::Eq, R0, 0, counted);
    for i in 0..=HELD as i16 {
        a.load(Size::Dw, R1, R10, base + 8 * i);
        a.store(Size::Dw, R0, 8 * i, R1);
    }
    a.bind(counted);
    a.load(Size::Dw, R1, R6, at(WALKED));
    a.add_imm(R1, 1);
    a.store(Size::Dw, R6, at(WALKED), R1);
    a.ja(next);
    a.bind(done);
    Ok(())
}

/// The start of a program that runs once a run of its task iterator linked to this process:
/// for the process's main thread (`ctx->task` in r7) alone, with the state (key 0 of
/// `state`, looked up through the stack slot `key`) in r6; anything else jumps to `out`.
pub(super) fn main_thread_state(
    a: &mut Asm,
    layout: &TaskLayout,
    state: i32,
    key: i16,
    out: super::insn::Label,
) -> Result<(), TaskIterError> {
    let field = |name: &str| -> Result<i16, TaskIterError> {
        let at = FIELDS.iter().position(|f| *f == name).unwrap_or(0);
        Ok(i16::try_from(layout.fields[at].offset).map_err(|_| AsmError::TooFar)?)
    };
    a.load(Size::Dw, R7, R1, 8); // ctx->task
    a.jump_imm(Cond::Eq, R7, 0, out);
    a.load(Size::W, R1, R7, field("pid")?);
    a.load(Size::W, R2, R7, field("tgid")?);
    a.jump_reg(Cond::Ne, R1, R2, out);
    lookup(a, state, key, None);
    a.jump_imm(Cond::Eq, R0, 0, out);
    a.mov(R6, R0);
    Ok(())
}

/// `dst = r10 + at`.
pub(super) fn stack_ptr(a: &mut Asm, dst: super::insn::Reg, at: i16) {
    a.mov(dst, R10);
    a.add_imm(dst, i32::from(at));
}

/// `r0 = bpf_probe_read_kernel(r10 + into, bytes, src + off)`.
pub(super) fn probe_read(a: &mut Asm, into: i16, bytes: i32, src: super::insn::Reg, off: i32) {
    a.mov(R3, src);
    a.add_imm(R3, off);
    stack_ptr(a, R1, into);
    a.mov_imm(R2, bytes);
    a.call(HELPER_PROBE_READ_KERNEL);
}

/// `r0 = bpf_map_lookup_elem(map, &key)`, the key (a `u32`) from `key_reg`, or 0, stored at the
/// stack slot `slot` first.
pub(super) fn lookup(a: &mut Asm, map: i32, slot: i16, key_reg: Option<super::insn::Reg>) {
    match key_reg {
        Some(reg) => a.store(Size::W, R10, slot, reg),
        None => a.store_imm(Size::W, R10, slot, 0),
    }
    a.ld_map_fd(R1, map);
    stack_ptr(a, R2, slot);
    a.call(HELPER_MAP_LOOKUP_ELEM);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bpf::task_iter::{HostTasks, Task, shared};
    use std::process::{Child, Command, Stdio};

    /// A process of one thread, asleep.
    fn sleeper() -> Child {
        Command::new("sleep").arg("30").stdin(Stdio::null()).spawn().unwrap()
    }

    /// The walk, where this host has what it needs (`HVSTATS_REQUIRE_KVM` hosts must).
    fn listed() -> Option<ListedTasks> {
        let walk = shared()
            .ok_or_else(|| "no task iterator".to_string())
            .and_then(|p| ListedTasks::open(p).map_err(|e| crate::error_chain::error_chain(&e)));
        match walk {
            Ok(walk) => Some(walk),
            Err(why) => {
                assert!(
                    std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(),
                    "no walk of listed processes: {why}"
                );
                None
            }
        }
    }

    fn sorted(tasks: impl Iterator<Item = Task>) -> Vec<Task> {
        let mut tasks: Vec<Task> = tasks.collect();
        tasks.sort_unstable_by_key(|t| (t.sched.tgid, t.sched.tid));
        tasks
    }

    #[test]
    fn the_listed_processes_threads_are_those_the_hosts_walk_gives_and_no_other() {
        let Some(mut walk) = listed() else { return };
        let me = std::process::id() as i32;
        let (mut first, mut second, mut other) = (sleeper(), sleeper(), sleeper());
        // Threads of this process that come and go would differ between the two walks.
        let pids = [me, first.id() as i32, second.id() as i32];
        let listed: BTreeSet<i32> = pids.into_iter().chain([i32::MAX - 1]).collect();
        let mine = sorted(walk.walk(&listed).unwrap().tasks());
        assert!(walk.walk(&listed).unwrap().complete());
        let mut host = HostTasks::open(shared().unwrap()).unwrap();
        let hosts = sorted(host.walk().unwrap().tasks().filter(|t| listed.contains(&t.sched.tgid)));
        let ids = |tasks: &[Task]| -> Vec<(i32, i32, u64, u64)> {
            tasks.iter().map(|t| (t.sched.tgid, t.sched.tid, t.start_ns, t.exec_id)).collect()
        };
        let children: Vec<_> = ids(&mine).into_iter().filter(|t| t.0 != me).collect();
        assert_eq!(children, ids(&hosts).into_iter().filter(|t| t.0 != me).collect::<Vec<_>>());
        assert_eq!(children.iter().map(|t| t.0).collect::<Vec<_>>(), pids[1..].to_vec(), "one thread each");
        let own = mine.iter().filter(|t| t.sched.tgid == me).count();
        assert!(own >= 2, "this process's threads: {own}");
        assert!(
            !mine.iter().any(|t| t.sched.tgid == other.id() as i32),
            "a process not listed is not walked"
        );
        // A thread's accounting only grows between the two walks.
        for (a, b) in mine.iter().zip(&hosts).filter(|(a, _)| a.sched.tgid != me) {
            assert!(
                a.sched.run_ns <= b.sched.run_ns && a.sched.dispatches <= b.sched.dispatches,
                "{a:?} {b:?}"
            );
        }
        // A list that shrinks walks only what it names now.
        let one: BTreeSet<i32> = [first.id() as i32].into();
        let tids: Vec<i32> = walk.walk(&one).unwrap().tasks().map(|t| t.sched.tid).collect();
        assert_eq!(tids, vec![first.id() as i32]);
        for child in [&mut first, &mut second, &mut other] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    #[test]
    fn walking_the_hosts_every_task_instead_is_said_once_with_why() {
        say_host_walk(&TaskIterError::Unsupported("bpf_iter_task_new"));
        say_host_walk(&TaskIterError::Unsupported("BPF_F_MMAPABLE"));
        let note = crate::counting::full_notes().join("\n");
        assert!(note.contains("walked among every task of the host"), "{note}");
        assert!(note.contains("(the kernel has no bpf_iter_task_new)"), "{note}");
        assert!(!note.contains("BPF_F_MMAPABLE"), "said once: {note}");
        assert!(crate::counting::full_notes().iter().all(|n| !n.contains("every task of the host")));
    }

    #[test]
    fn a_walk_past_its_room_is_cut_and_made_again_at_once_with_room_for_every_thread() {
        let Some(mut walk) = listed() else { return };
        let mut children: Vec<Child> = (0..3).map(|_| sleeper()).collect();
        // Room for fewer records than threads: 3 sleepers' and this process's several.
        walk = ListedTasks::with_room(walk.source, 4, 2).unwrap();
        let listed: BTreeSet<i32> =
            children.iter().map(|c| c.id() as i32).chain([std::process::id() as i32]).collect();
        // Walked once, it is cut: 4 processes' threads in room for 2.
        assert!(!walk.walk_once(&listed).unwrap(), "4 processes' threads in room for 2");
        assert_eq!(Walked::of(&walk.buf, true).tasks().count(), 2, "the records there was room for");
        let found = walk.found;
        assert!(found >= 5, "3 sleepers and this process's threads: {found}");
        // A walk that finds itself cut is made again with room for all it found, before it
        // returns.
        walk = ListedTasks::with_room(walk.source, 4, 2).unwrap();
        let whole = walk.walk(&listed).unwrap();
        assert!(whole.complete());
        let walked: BTreeSet<i32> = whole.tasks().map(|t| t.sched.tgid).collect();
        assert_eq!(walked, listed);
        assert!(walk.pids.entries() >= 4 && u64::from(walk.records.entries()) >= found);
        for child in &mut children {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
}
