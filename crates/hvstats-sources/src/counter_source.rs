//! The seam every source of counters plugs into, for our own partitions and observed VMs alike.
//!
//! A [`CounterSource`] declares the counters it gives ([`Gives`], sets of catalog counters) and
//! writes them into a partition's or a VP's page from its last reading. How it reads depends on
//! whom it serves: a source of one of our VPs ([`VpSource`]) is opened on the VP's thread and read
//! on demand by the VP's merges; a source of an observed VM (`hvstats_observe::sources::VmSource`)
//! is read once per refresh for all of the VM's vCPUs. Whoever composes sources ([`Composition`])
//! decides from the declarations alone which source writes each counter (the first in its list
//! that gives it) and which counters no source gives (declared unavailable: readers show them
//! absent, never 0).
//!
//! A new source for our VPs is one file implementing [`VpSource`] and one line in the list of
//! [`super::open_all`]; one that reads a thread from outside its process serves observed vCPU
//! threads too, with one line in [`super::OBSERVED_THREAD_SOURCES`].

use std::fmt::Debug;
use std::os::fd::RawFd;
use std::path::Path;
use std::sync::Arc;

use hvstats::SharedPage;
use hvstats::whv::VpExtras;
use hvstats_abi::ObjectKind;
use hvstats_abi::counter_set::CounterSet;

use super::user_exits::UserExitCounts;

/// When a VP source is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// With the intercepts a guest can see change from one instruction to the next: every
    /// refresh, the VP thread's own at hypercalls included.
    Exits,
    /// With the thread's times, which change whenever it runs: full merges only.
    Times,
}

/// The object of a partition a source writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Object {
    /// The partition's own page.
    Partition,
    /// The page of the VP with this index.
    Vp(u32),
}

/// The counters a source gives now: for the partition's page, and for the page of every one of
/// its VPs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gives {
    /// Partition counters.
    pub partition: CounterSet,
    /// VP counters (the same for each VP of the partition).
    pub vp: CounterSet,
}

impl Gives {
    /// Nothing.
    pub const NOTHING: Gives = Gives { partition: CounterSet::EMPTY, vp: CounterSet::EMPTY };

    /// The VP counters of `vp`, no partition counter.
    pub fn vp(vp: CounterSet) -> Self {
        Self { partition: CounterSet::EMPTY, vp }
    }

    /// The counters of `object`'s kind.
    pub fn of(&self, object: Object) -> &CounterSet {
        match object {
            Object::Partition => &self.partition,
            Object::Vp(_) => &self.vp,
        }
    }

    /// What either gives.
    pub fn union(&self, other: &Gives) -> Gives {
        Gives { partition: self.partition.union(&other.partition), vp: self.vp.union(&other.vp) }
    }

    /// What this gives and `other` does not.
    pub fn difference(&self, other: &Gives) -> Gives {
        Gives { partition: self.partition.difference(&other.partition), vp: self.vp.difference(&other.vp) }
    }
}

/// One source of counters: what it gives, and how it writes them.
pub trait CounterSource: Send + Debug {
    /// Its name, as logs, `hvstats catalog` and the `source` label say it.
    fn name(&self) -> &'static str;

    /// The counters its readings give now.
    fn gives(&self) -> Gives;

    /// Writes the counters of `only` (a subset of what it gives) for `object` into `page`, from
    /// its last reading; a counter its last reading lacks is left as it is.
    fn write(&self, object: Object, page: &SharedPage, only: &CounterSet);

    /// Why some counters it is meant to give cannot be had on this host, said for a person
    /// (empty when all can).
    fn unavailable(&self) -> Vec<String> {
        Vec::new()
    }
}

/// A source of one of our VPs, opened on the VP's thread and read by its merges.
pub trait VpSource: CounterSource {
    /// When it is read.
    fn part(&self) -> Part;

    /// Takes a reading; one that fails keeps the last.
    fn read(&mut self);

    /// The VP thread is ending (called on it): take the last reading a later merge should keep.
    fn thread_exiting(&mut self) {}

    /// What the last reading tells the WHv API beyond the page.
    fn extras(&self, _extras: &mut VpExtras) {}

    /// The KVM statistic `name` of the vCPU, for cross-checks, when this source reads them.
    fn kvm_stat(&self, _name: &str) -> Option<u64> {
        None
    }
}

/// A list of sources in the order that decides which one writes a counter several give.
#[derive(Debug)]
pub struct Composition<S: ?Sized> {
    sources: Vec<Box<S>>,
    /// By source, the counters it writes: what it gives that no source before it gives.
    writes: Vec<Gives>,
    /// What some source gives.
    given: Gives,
}

impl<S: CounterSource + ?Sized> Composition<S> {
    /// The sources of `sources`, first first.
    pub fn new(sources: Vec<Box<S>>) -> Self {
        let mut me = Self { sources, writes: Vec::new(), given: Gives::NOTHING };
        me.decide();
        me
    }

    /// Decides again which source writes what, from what each gives now: call after readings
    /// that may change what a source gives.
    pub fn decide(&mut self) {
        let mut given = Gives::NOTHING;
        self.writes = self
            .sources
            .iter()
            .map(|s| {
                let gives = s.gives();
                let writes = gives.difference(&given);
                given = given.union(&gives);
                writes
            })
            .collect();
        self.given = given;
    }

    /// The sources, in order.
    pub fn sources(&self) -> &[Box<S>] {
        &self.sources
    }

    /// The sources, in order, to read.
    pub fn sources_mut(&mut self) -> impl Iterator<Item = &mut Box<S>> {
        self.sources.iter_mut()
    }

    /// What some source gives.
    pub fn given(&self) -> &Gives {
        &self.given
    }

    /// The counters the source at `index` in the list writes (nothing for a place past the list).
    pub fn writes(&self, index: usize) -> &Gives {
        self.writes.get(index).unwrap_or(&Gives::NOTHING)
    }

    /// The source that writes `counter` of `object`'s kind, if any.
    pub fn writer_of(&self, object: Object, counter: hvstats_abi::CounterId) -> Option<&S> {
        Some(&self.sources[self.writer_index(object, counter)?])
    }

    /// The place in the list of the source that writes `counter` of `object`'s kind, if any.
    pub fn writer_index(&self, object: Object, counter: hvstats_abi::CounterId) -> Option<usize> {
        self.writes.iter().position(|w| w.of(object).contains(counter))
    }

    /// Writes every counter of `object` from the source that gives it, into `page`; `keep`
    /// picks which sources write now (the others are not read at this moment).
    pub fn write(&self, object: Object, page: &SharedPage, keep: impl Fn(&S) -> bool) {
        for (source, writes) in self.sources.iter().zip(&self.writes) {
            let only = writes.of(object);
            if !only.is_empty() && keep(source) {
                source.write(object, page, only);
            }
        }
    }

    /// The counters of `relevant` that no source gives.
    pub fn missing(&self, relevant: &Gives) -> Gives {
        relevant.difference(&self.given)
    }
}

/// Where a VP's sources are opened: its thread, its vCPU, and the run loop's own counts (which
/// some sources add to or take off what the kernel counts).
#[derive(Clone, Debug)]
pub struct VpThread {
    /// The VP thread's id.
    pub tid: libc::pid_t,
    /// The vCPU's file descriptor.
    pub vcpu_fd: RawFd,
    /// The run loop's counts of the VP.
    pub user: Arc<UserExitCounts>,
}

/// An observed VM's vCPU thread: a thread of another process.
#[derive(Clone, Copy, Debug)]
pub struct ObservedThread<'a> {
    /// The procfs the process is seen under.
    pub procfs: &'a Path,
    /// The VMM's process id.
    pub pid: libc::pid_t,
    /// The vCPU thread's id.
    pub tid: libc::pid_t,
}

/// The VP counters the catalog's sources of `kinds` could give (what a VP lacks when none of its
/// sources gives them).
pub fn vp_counters_of(kinds: &[hvstats_abi::source::SourceKind]) -> CounterSet {
    CounterSet::of_kind(ObjectKind::Vp, |c| c.maintained.source().is_some_and(|s| kinds.contains(&s.kind())))
}

/// A source of one of our VP threads, read at each merge and once more as the thread ends; from
/// then on its last reading is kept (the thread's id may be reused): the [`VpSource`] of
/// [`crate::thread::ThreadSource`] and of the host's faults on the thread.
pub(crate) trait ReadUntilExit: CounterSource {
    /// Reads the thread now; a reading that fails keeps the last.
    fn read_thread(&mut self);

    /// Whether the thread ended (set once it did).
    fn gone(&mut self) -> &mut bool;
}

impl<T: ReadUntilExit> VpSource for T {
    fn part(&self) -> Part {
        Part::Times
    }

    fn read(&mut self) {
        if !*self.gone() {
            self.read_thread();
        }
    }

    fn thread_exiting(&mut self) {
        VpSource::read(self);
        *self.gone() = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hvstats_abi::catalog::vp;

    /// A source that gives `gives` and writes `value` into each counter it is told to.
    #[derive(Debug)]
    struct Fixed {
        name: &'static str,
        gives: CounterSet,
        value: u64,
    }

    impl CounterSource for Fixed {
        fn name(&self) -> &'static str {
            self.name
        }
        fn gives(&self) -> Gives {
            Gives::vp(self.gives)
        }
        fn write(&self, _object: Object, page: &SharedPage, only: &CounterSet) {
            only.ids().for_each(|id| page.set(id, self.value));
        }
    }

    #[test]
    fn the_first_source_that_gives_a_counter_writes_it_and_what_none_gives_is_missing() {
        let first = Fixed { name: "first", gives: CounterSet::of(&[vp::CPUID_INSTRUCTIONS]), value: 1 };
        let second = Fixed {
            name: "second",
            gives: CounterSet::of(&[vp::CPUID_INSTRUCTIONS, vp::HLT_INSTRUCTIONS]),
            value: 2,
        };
        let sources: Vec<Box<dyn CounterSource>> = vec![Box::new(first), Box::new(second)];
        let composition = Composition::new(sources);
        let page = SharedPage::anonymous(ObjectKind::Vp).unwrap();
        composition.write(Object::Vp(0), &page, |_| true);
        assert_eq!(page.get(vp::CPUID_INSTRUCTIONS), 1, "the first in the list wins");
        assert_eq!(page.get(vp::HLT_INSTRUCTIONS), 2);
        assert_eq!(
            composition.writer_of(Object::Vp(0), vp::HLT_INSTRUCTIONS).map(|s| s.name()),
            Some("second")
        );
        assert!(composition.writer_of(Object::Partition, vp::HLT_INSTRUCTIONS).is_none());
        let relevant = Gives::vp(CounterSet::of(&[vp::CPUID_INSTRUCTIONS, vp::IO_INSTRUCTIONS]));
        assert_eq!(composition.missing(&relevant).vp, CounterSet::of(&[vp::IO_INSTRUCTIONS]));
        // A source left out of a write (read at another moment) writes nothing, and takes no
        // counter from the others.
        let page = SharedPage::anonymous(ObjectKind::Vp).unwrap();
        composition.write(Object::Vp(0), &page, |s| s.name() == "second");
        assert_eq!(page.get(vp::CPUID_INSTRUCTIONS), 0);
        assert_eq!(page.get(vp::HLT_INSTRUCTIONS), 2);
        // What each source writes, as decided once, is what looking each counter's writer up
        // finds: a table built from either says the same.
        for (i, _) in composition.sources().iter().enumerate() {
            let found: Vec<_> = CounterSet::of_kind(ObjectKind::Vp, |_| true)
                .ids()
                .filter(|&id| composition.writer_index(Object::Vp(0), id) == Some(i))
                .collect();
            assert_eq!(composition.writes(i).vp.ids().collect::<Vec<_>>(), found, "source {i}");
        }
        assert_eq!(composition.writes(2), &Gives::NOTHING, "past the list");
    }
}
