//! The observed VMMs' threads, read once a tick for all of them: one walk of the observed
//! processes' threads in the kernel ([`hvstats_host::bpf::listed_tasks::ListedTasks`]), or where
//! the kernel lacks what that needs (before Linux 6.7), of the host's every task by the kernel's
//! task iterator ([`hvstats_host::bpf::task_iter::HostTasks`]), of which the records of the
//! observed processes are kept. They are sorted, and each VM is handed its own ([`VmmTasks`]): who
//! its process is (start time, `exec()`s, exiting), its number of threads, each thread's start
//! time and its scheduler and fault accounting. No `/proc` file of a VMM is read for these
//! while the walk is had.
//!
//! The walk is had on the host's own `/proc` where the iterator loads ([`program`]); elsewhere
//! every VM reads `/proc` as it did before the walk (said once, by the iterator's fallback note).
//! For a tick whose walk failed or was cut short (or an observer whose walk could not be opened),
//! each VM reads its VMM's identity from `/proc` and walks its VMM's threads on their own
//! ([`of_process`]), so its counters keep moving.

use std::collections::BTreeSet;

use hvstats_host::bpf::listed_tasks::ObservedTasks;
use hvstats_host::bpf::task_iter::{self, ProcessTasks, Task, TaskIterProgram};

use crate::discovery::Procfs;

/// The task iterator that walks the threads of the VMMs seen through `procfs`: on the host's own
/// `/proc` (the iterator numbers threads as this process sees them), where it loads.
pub(crate) fn program(procfs: &Procfs) -> Option<&'static TaskIterProgram> {
    (procfs.root() == std::path::Path::new("/proc")).then(task_iter::shared).flatten()
}

/// The walk of the observed processes' threads and what the last one gave of them.
#[derive(Debug)]
pub(crate) struct TaskWalk {
    walker: ObservedTasks,
    /// The observed processes' threads, by process and then thread id.
    tasks: Vec<Task>,
    /// By process, where its threads are in `tasks`: a thousand processes' thousands of
    /// threads are searched through this small table, not the records.
    processes: Vec<(i32, std::ops::Range<u32>)>,
    /// False until a walk succeeded, and after one that failed or was cut.
    usable: bool,
}

impl TaskWalk {
    /// The walk of the host seen through `procfs`, where the task iterator is had for it.
    pub(crate) fn open(procfs: &Procfs) -> Option<Self> {
        let program = program(procfs)?;
        let walker = ObservedTasks::open(program).ok()?;
        Some(Self { walker, tasks: Vec::new(), processes: Vec::new(), usable: false })
    }

    /// Walks the host's tasks once, keeping those of the processes in `observed`.
    pub(crate) fn walk(&mut self, observed: &BTreeSet<i32>) {
        self.tasks.clear();
        let filter = self.walker.gives_others();
        self.usable = match self.walker.walk(observed) {
            Ok(walked) => {
                let observed = |t: &Task| !filter || observed.contains(&t.sched.tgid);
                self.tasks.extend(walked.tasks().filter(observed));
                walked.complete()
            }
            Err(_) => false,
        };
        // The walk of listed processes gives them in order, each one's threads as it made them:
        // sorted already, but where thread ids wrapped around.
        if !self.tasks.is_sorted_by_key(|t| (t.sched.tgid, t.sched.tid)) {
            self.tasks.sort_unstable_by_key(|t| (t.sched.tgid, t.sched.tid));
        }
        self.processes.clear();
        for (i, t) in self.tasks.iter().enumerate() {
            match self.processes.last_mut() {
                Some((tgid, range)) if *tgid == t.sched.tgid => range.end = i as u32 + 1,
                _ => self.processes.push((t.sched.tgid, i as u32..i as u32 + 1)),
            }
        }
    }

    /// Process `pid`'s threads in the last walk; `None` where the walk cannot tell them (it
    /// failed or was cut, or does not hold the process: it left, which `/proc` says).
    pub(crate) fn of(&self, pid: i32) -> Option<VmmTasks<'_>> {
        if !self.usable {
            return None;
        }
        let at = self.processes.binary_search_by_key(&pid, |(tgid, _)| *tgid).ok()?;
        let range = self.processes[at].1.clone();
        VmmTasks::of(pid, &self.tasks[range.start as usize..range.end as usize])
    }
}

/// Process `pid`'s threads walked now on their own (the iterator linked to it alone), sorted by
/// thread id: what attaching a VM starts from.
pub(crate) fn of_process(procfs: &Procfs, pid: i32) -> Option<Vec<Task>> {
    let program = program(procfs)?;
    let mut process = ProcessTasks::open(program, pid).ok()?;
    let walked = process.tasks().ok()?;
    if !walked.complete() {
        return None;
    }
    let mut tasks: Vec<Task> = walked.tasks().filter(|t| t.sched.tgid == pid).collect();
    tasks.sort_unstable_by_key(|t| t.sched.tid);
    Some(tasks)
}

/// One VMM's threads in a walk, its main thread among them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct VmmTasks<'a> {
    /// Sorted by thread id.
    tasks: &'a [Task],
    leader: &'a Task,
}

impl<'a> VmmTasks<'a> {
    /// Process `pid`'s threads among `tasks` (all of its, sorted by thread id), when its main
    /// thread is one.
    pub(crate) fn of(pid: i32, tasks: &'a [Task]) -> Option<Self> {
        let leader = tasks.binary_search_by_key(&pid, |t| t.sched.tid).ok()?;
        Some(Self { tasks, leader: &tasks[leader] })
    }

    /// The process's main thread: its start time and `exec()`s are the process's.
    pub(crate) fn leader(&self) -> &'a Task {
        self.leader
    }

    /// Thread `tid`, while it is one of the process's.
    pub(crate) fn thread(&self, tid: i32) -> Option<&'a Task> {
        let at = self.tasks.binary_search_by_key(&tid, |t| t.sched.tid).ok()?;
        self.tasks.get(at)
    }

    /// The process's threads.
    pub(crate) fn threads(&self) -> &'a [Task] {
        self.tasks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command, Stdio};

    /// A process of one thread, asleep.
    fn sleeper() -> Child {
        Command::new("sleep").arg("30").stdin(Stdio::null()).spawn().unwrap()
    }

    #[test]
    fn one_walk_gives_each_observed_process_its_own_threads_and_keeps_no_other() {
        let Some(walk) = TaskWalk::open(&Procfs::host()) else {
            let why = hvstats_host::counting::full_notes().join("; ");
            assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "no task iterator: {why}");
            return;
        };
        if std::env::var_os("HVSTATS_REQUIRE_KVM").is_some() {
            assert!(
                matches!(walk.walker, ObservedTasks::Listed(_)),
                "this kernel walks the listed processes alone"
            );
        }
        // The host's walk too, which kernels before 6.7 have.
        let host = task_iter::HostTasks::open(program(&Procfs::host()).unwrap()).unwrap();
        for walk in
            [walk, TaskWalk { walker: ObservedTasks::Host(host), ..TaskWalk::open(&Procfs::host()).unwrap() }]
        {
            walks_each_observed_process_alone(walk);
        }
    }

    fn walks_each_observed_process_alone(mut walk: TaskWalk) {
        let me = std::process::id() as i32;
        let (mut first, mut second, mut other) = (sleeper(), sleeper(), sleeper());
        let observed: BTreeSet<i32> = [me, first.id() as i32, second.id() as i32].into();
        walk.walk(&observed);
        assert!(walk.tasks.iter().all(|t| observed.contains(&t.sched.tgid)), "only the observed are kept");
        let mine = walk.of(me).unwrap();
        let listed = std::fs::read_dir("/proc/self/task").unwrap().count();
        assert!(mine.threads().len() >= 2 && mine.threads().iter().all(|t| t.sched.tgid == me));
        assert!(
            mine.threads().len().abs_diff(listed) <= 2,
            "{} threads, /proc lists {listed}",
            mine.threads().len()
        );
        for child in [&first, &second] {
            let pid = child.id() as i32;
            let tasks = walk.of(pid).unwrap();
            assert_eq!((tasks.leader().sched.tid, tasks.threads().len()), (pid, 1));
            assert_eq!(tasks.leader().start_ticks(), Procfs::host().start_time(pid).unwrap());
        }
        assert!(walk.of(other.id() as i32).is_none(), "a process not observed is not kept");
        for child in [&mut first, &mut second, &mut other] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
}
