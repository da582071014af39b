//! The sources that read a vCPU thread from outside its process (its schedstat and guest time,
//! the host's page faults on it: [`OBSERVED_THREAD_SOURCES`]), opened on each vCPU thread as the
//! observer finds it and composed as one source of the VM. A counter is given only when every
//! vCPU's thread has a source that gives it. They count what the kernel keeps for the thread from
//! its start ([`Origin::ThreadStart`]): a new observer continues them, and a VP whose thread is
//! replaced (a VMM that made a new thread for it) counts from the new thread's start.

use std::collections::BTreeMap;

use hvstats::SharedPage;
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::vm_sources::Origin;

use super::vm_source::{Learned, VmAttach, VmSource, VmView};
use crate::attach::ObserveError;
use hvstats_sources::OBSERVED_THREAD_SOURCES;
use hvstats_sources::counter_source::{CounterSource, Gives, Object, ObservedThread, VpSource};

/// The thread sources of each vCPU, by VP index, and the thread they were opened on.
#[derive(Debug)]
pub struct Threads {
    vcpus: usize,
    opened: BTreeMap<u32, (i32, Vec<Box<dyn VpSource>>)>,
}

/// The thread sources of a VM's vCPUs (opened as each thread is found).
///
/// # Errors
/// Never.
pub fn open(at: &VmAttach<'_>) -> Result<Option<Box<dyn VmSource>>, ObserveError> {
    Ok(Some(Box::new(Threads { vcpus: at.fds.vcpus.len(), opened: BTreeMap::new() })))
}

impl CounterSource for Threads {
    fn name(&self) -> &'static str {
        "thread"
    }

    fn gives(&self) -> Gives {
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
