//! What the kernel keeps of each vCPU thread from its start: run time, hypervisor time, CPU
//! wait, dispatches, migrations and the host's page faults on it ([`Origin::ThreadStart`]): a new
//! observer continues them, and a VP whose thread is replaced (a VMM that made a new thread for
//! it) counts from the new thread's start. A counter is given only when every vCPU's thread
//! gives it.
//!
//! Where the kernel's task iterator loads (`hvstats_host::bpf::task_iter`, CAP_BPF and
//! CAP_PERFMON), the source is `thread-iter`: its records are those of the observer's one walk of
//! the host's threads a tick ([`crate::task_walk`]), no descriptor and no read of its own,
//! whatever its vCPUs, and the migrations too (from the thread's start, so the thread clock's
//! perf counters are not opened). Elsewhere it is `thread`: the
//! sources that read a vCPU thread's `/proc` files ([`OBSERVED_THREAD_SOURCES`]), opened on
//! each vCPU thread as the observer finds it, each read every refresh, and the migrations are the
//! thread clock's ([`super::thread_clock`]); the fallback is said once.

use std::collections::BTreeMap;

use hvstats::SharedPage;
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::vm_sources::Origin;

use super::vm_source::{Learned, VmAttach, VmSource, VmView};
use crate::attach::ObserveError;
use hvstats_sources::OBSERVED_THREAD_SOURCES;
use hvstats_sources::counter_source::{CounterSource, Gives, Object, ObservedThread, VpSource};
use hvstats_sources::thread::IteratedThread;

/// The thread sources of each vCPU, by VP index, and the thread they were opened on; or each
/// vCPU thread's last record of the observer's walk.
#[derive(Debug)]
pub struct Threads {
    vcpus: usize,
    opened: BTreeMap<u32, (i32, Vec<Box<dyn VpSource>>)>,
    iterated: Option<BTreeMap<u32, IteratedThread>>,
}

/// True when the vCPU threads of a VM seen through `procfs` are read by the kernel's task
/// iterator: the host's own `/proc` (the iterator numbers threads as this process sees them) and
/// an iterator loaded.
pub fn iterated(procfs: &crate::discovery::Procfs) -> bool {
    crate::task_walk::program(procfs).is_some()
}

/// The thread sources of a VM's vCPUs: the records of the observer's walk, or the `/proc`
/// sources of each vCPU thread, opened as each thread is found.
///
/// # Errors
/// Never.
pub fn open(at: &VmAttach<'_>) -> Result<Option<Box<dyn VmSource>>, ObserveError> {
    let iterated = iterated(at.procfs).then(BTreeMap::new);
    Ok(Some(Box::new(Threads { vcpus: at.fds.vcpus.len(), opened: BTreeMap::new(), iterated })))
}

impl Threads {
    /// Each vCPU thread's record in this refresh's walk (a thread gone keeps its last). A refresh
    /// without the tick's walk of the host (it failed, was cut short at its bound, or could not
    /// be opened) walks this VMM's threads on their own, so the values never stand still.
    fn walk(&mut self, vm: &VmView<'_>) {
        let Some(records) = self.iterated.as_mut() else { return };
        let own;
        let tasks = match vm.tasks {
            Some(tasks) => tasks,
            None => {
                own = crate::task_walk::of_process(vm.procfs, vm.pid);
                match own.as_deref().and_then(|tasks| crate::task_walk::VmmTasks::of(vm.pid, tasks)) {
                    Some(tasks) => tasks,
                    None => return,
                }
            }
        };
        for (index, tid) in vm.threads() {
            if let Some(task) = tasks.thread(tid) {
                records.insert(index, IteratedThread(task.sched));
            }
        }
    }
}

impl CounterSource for Threads {
    fn name(&self) -> &'static str {
        if self.iterated.is_some() { "thread-iter" } else { "thread" }
    }

    fn gives(&self) -> Gives {
        if let Some(records) = &self.iterated {
            let all = records.len() >= self.vcpus && self.vcpus > 0;
            return records.values().next().filter(|_| all).map_or(Gives::NOTHING, CounterSource::gives);
        }
        if self.opened.len() < self.vcpus {
            return Gives::NOTHING;
        }
        let mut common: Option<CounterSet> = None;
        for (_, sources) in self.opened.values() {
            let vp = sources.iter().fold(CounterSet::EMPTY, |all, s| all.union(&s.gives().vp));
            common = Some(match common {
                Some(c) => c.intersection(&vp),
                None => vp,
            });
        }
        Gives::vp(common.unwrap_or_default())
    }

    fn write(&self, object: Object, page: &SharedPage, only: &CounterSet) {
        let Object::Vp(index) = object else { return };
        if let Some(records) = &self.iterated {
            if let Some(record) = records.get(&index) {
                record.write(object, page, only);
            }
            return;
        }
        let Some((_, sources)) = self.opened.get(&index) else { return };
        for source in sources {
            let mine = source.gives().vp;
            source.write(object, page, &only.intersection(&mine));
        }
    }
}

impl VmSource for Threads {
    fn origin(&self) -> Origin {
        Origin::ThreadStart
    }

    fn read(&mut self, vm: &VmView<'_>) -> Learned {
        if self.iterated.is_some() {
            self.walk(vm);
            return Learned::holding(0);
        }
        for (index, tid) in vm.threads() {
            let fresh = self.opened.get(&index).is_none_or(|(was, _)| *was != tid);
            if fresh {
                let thread = ObservedThread { procfs: vm.procfs.root(), pid: vm.pid, tid };
                let sources = OBSERVED_THREAD_SOURCES.iter().filter_map(|open| open(thread)).collect();
                self.opened.insert(index, (tid, sources));
            }
        }
        for (_, sources) in self.opened.values_mut() {
            sources.iter_mut().for_each(|s| s.read());
        }
        Learned::holding(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::Procfs;
    use crate::sources::vm_source::Vcpu;

    #[test]
    fn without_the_hosts_walk_a_refresh_walks_the_vmms_own_threads() {
        let procfs = Procfs::host();
        if !iterated(&procfs) {
            let why = hvstats_host::counting::full_notes().join("; ");
            assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "no task iterator: {why}");
            return;
        }
        // SAFETY: gettid takes no arguments and touches no memory.
        let tid = unsafe { libc::gettid() };
        let vcpus = [Vcpu { vcpu_id: 0, tid: Some(tid), qom_path: None }];
        let view = VmView { procfs: &procfs, pid: std::process::id() as i32, vcpus: &vcpus, tasks: None };
        let mut threads = Threads { vcpus: 1, opened: BTreeMap::new(), iterated: Some(BTreeMap::new()) };
        threads.read(&view);
        let iterated = threads.iterated.as_ref().unwrap();
        let record = iterated.get(&0).expect("the thread's record, from a walk of this process");
        assert_eq!((record.0.tid, record.0.tgid), (tid, view.pid));
        assert!(!threads.gives().vp.is_empty(), "its counters are given");
        let ran = record.0.run_ns;
        // Work, then read again until the run time moved (the kernel adds to it at its ticks):
        // each refresh walked anew, none keeping the first record.
        let start = std::time::Instant::now();
        loop {
            let spin = std::time::Instant::now();
            while spin.elapsed() < std::time::Duration::from_millis(20) {
                std::hint::black_box(spin.elapsed());
            }
            threads.read(&view);
            if threads.iterated.as_ref().unwrap()[&0].0.run_ns > ran {
                break;
            }
            assert!(start.elapsed() < std::time::Duration::from_secs(30), "the run time never moved");
        }
    }
}
