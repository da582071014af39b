//! The page faults the host takes on a VP thread: proc(5) `minflt` and `majflt` of the thread's
//! `stat` line. KVM maps guest memory into the guest on the vCPU thread, so a guest page touched
//! for the first time, reclaimed or swapped out is a fault of that thread (a major one when it
//! waited for the disk); the VMM's own faults on the thread count too.
//!
//! Our VP's counts start when the source is opened, as its thread begins running its guest
//! ([`open_source`]). An observed VM's vCPU thread's count from the thread's start, as the kernel
//! keeps them (so a new observer continues them): they come from the same `stat` line the
//! observed thread's times are read from, once a refresh (`ObservedSched` of the thread source).

use std::io;
use std::path::Path;

use hvstats::SharedPage;
use hvstats_abi::catalog::{maintained_by, maintained_count};
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::source::{HostFault, Source, SourceKind};
use hvstats_abi::{Counter, ObjectKind};
use hvstats_host::task_stat::{self, STAT_MAX, StatFile, StatLine};

use super::counter_source::ReadUntilExit;
use super::counter_source::{CounterSource, Gives, Object, VpSource, VpThread};

/// The VP counters the catalog keys to the thread's faults.
pub(super) const FROM_HOST_FAULTS: [&Counter; maintained_count(ObjectKind::Vp, SourceKind::HostFaults)] =
    maintained_by(ObjectKind::Vp, SourceKind::HostFaults);

/// A thread's fault counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Faults that loaded no page from disk.
    pub minor: u64,
    /// Faults that loaded a page from disk.
    pub major: u64,
}

impl Faults {
    /// The counts of a `stat` line; `None` when it lacks them.
    pub fn of(stat: &StatLine<'_>) -> Option<Self> {
        Some(Self { minor: stat.minor_faults()?, major: stat.major_faults()? })
    }

    /// The faults taken since `earlier`.
    pub fn since(self, earlier: Self) -> Self {
        Self {
            minor: self.minor.saturating_sub(earlier.minor),
            major: self.major.saturating_sub(earlier.major),
        }
    }
}

/// Writes `faults` into the counters the catalog keys to them.
pub fn write_host_faults(page: &SharedPage, only: &CounterSet, faults: Faults) {
    for counter in FROM_HOST_FAULTS.iter().filter(|c| only.contains(c.id)) {
        let value = match counter.maintained.source() {
            Some(Source::HostFaults(HostFault::All)) => faults.minor.saturating_add(faults.major),
            Some(Source::HostFaults(HostFault::Major)) => faults.major,
            _ => continue,
        };
        page.set(counter.id, value);
    }
}

/// A VP thread's `stat` line and the counts it had when opened.
#[derive(Debug)]
pub struct HostFaultSource {
    /// The thread's `stat`, kept open and re-read (one `pread` per reading).
    stat: StatFile,
    at_open: Faults,
    /// The faults since open, as last read.
    last: Faults,
    /// The thread ended: its last reading is kept (its tid may be reused).
    gone: bool,
}

impl HostFaultSource {
    /// Takes the counts of the `stat` line `stat` now as the start.
    ///
    /// # Errors
    /// When the line cannot be read or holds no fault counts.
    fn open(stat: StatFile) -> io::Result<Self> {
        let at_open = read_faults(&stat)?;
        Ok(Self { stat, at_open, last: Faults::default(), gone: false })
    }
}

impl ReadUntilExit for HostFaultSource {
    fn read_thread(&mut self) {
        if let Ok(now) = read_faults(&self.stat) {
            self.last = now.since(self.at_open);
        }
    }

    fn gone(&mut self) -> &mut bool {
        &mut self.gone
    }
}

impl CounterSource for HostFaultSource {
    fn name(&self) -> &'static str {
        "thread"
    }

    fn gives(&self) -> Gives {
        Gives::vp(CounterSet::of(&FROM_HOST_FAULTS.map(|c| c.id)))
    }

    fn write(&self, _object: Object, page: &SharedPage, only: &CounterSet) {
        write_host_faults(page, only, self.last);
    }
}

/// The faults of our VP thread `vp.tid`, from now on. A thread whose `stat` cannot be read has
/// no such source.
pub(super) fn open_source(vp: &VpThread) -> Option<Box<dyn VpSource>> {
    let path = task_stat::thread_path(Path::new("/proc"), std::process::id() as i32, vp.tid);
    Some(Box::new(HostFaultSource::open(StatFile::open(&path).ok()?).ok()?))
}

/// The fault counts of the `stat` line `file` holds now.
fn read_faults(file: &StatFile) -> io::Result<Faults> {
    let mut buf = [0u8; STAT_MAX];
    Faults::of(&file.read(&mut buf)?)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "stat without fault counts"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hvstats_abi::catalog::vp;

    #[test]
    fn faults_are_fields_10_and_12_and_count_from_the_opening() {
        let mut fields: Vec<String> = (3..=52).map(|i| i.to_string()).collect();
        fields[task_stat::MIN_FLT - 3] = "1000".into();
        fields[task_stat::MAJ_FLT - 3] = "7".into();
        let line = format!("9 (vcpu) x) {}", fields.join(" "));
        let faults = Faults::of(&StatLine::parse(&line).unwrap()).unwrap();
        assert_eq!(faults, Faults { minor: 1000, major: 7 });
        assert_eq!(faults.since(Faults { minor: 990, major: 7 }), Faults { minor: 10, major: 0 });
        assert_eq!(Faults::of(&StatLine::parse("1 (x) S 2").unwrap()), None);
    }

    #[test]
    fn a_thread_touching_fresh_memory_is_counted_its_faults() {
        const PAGES: usize = 64;
        let thread =
            VpThread { tid: super::super::thread_time::gettid(), vcpu_fd: -1, user: Default::default() };
        let Some(mut source) = open_source(&thread) else {
            panic!("this thread's stat is readable");
        };
        let page = SharedPage::anonymous(ObjectKind::Vp).unwrap();
        // Fresh anonymous memory, never touched: each page written is one minor fault.
        let len = PAGES * 4096;
        // SAFETY: a new private anonymous mapping; nothing else refers to it.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(at, libc::MAP_FAILED);
        // SAFETY: the range was just mapped, is ours and holds no huge pages (advised so).
        unsafe {
            libc::madvise(at, len, libc::MADV_NOHUGEPAGE);
            for i in 0..PAGES {
                std::ptr::write_volatile(at.cast::<u8>().add(i * 4096), 1);
            }
        }
        source.read();
        source.write(Object::Vp(0), &page, &source.gives().vp);
        // SAFETY: the mapping made above, no longer used.
        unsafe { libc::munmap(at, len) };
        let all = page.get(vp::HOST_PAGE_FAULTS);
        assert!((PAGES as u64..PAGES as u64 + 16).contains(&all), "{all} faults for {PAGES} pages touched");
        assert!(page.get(vp::HOST_MAJOR_PAGE_FAULTS) <= all);
    }
}
