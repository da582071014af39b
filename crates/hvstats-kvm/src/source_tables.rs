//! The catalog against the backend's sources, without KVM.
//!
//! Each source's writer is driven with nonzero readings of everything it reads, on a fresh page;
//! the counters it wrote must be exactly the ones the catalog marks as maintained by that source.
//! Together the sources must cover every VP counter the catalog marks maintained, and none may
//! write a counter marked "no". A source unplugged from the backend (a table entry dropped, a
//! writer that stops writing) or a catalog row that claims a source the backend does not read
//! fails here. The run under KVM (`tests/catalog_sources.rs`) checks the same through a workload.

use std::collections::BTreeSet;
use std::io::Write;
use std::os::fd::FromRawFd;

use hvstats::SharedPage;
use hvstats_abi::catalog::counters_of;
use hvstats_abi::hypercall::HypercallClass;
use hvstats_abi::source::{SourceKind, Tracepoint};
use hvstats_abi::{CATALOG, ObjectKind};

use crate::accounting::{ExitAccounting, UserExit};
use crate::enlightenment::count_hypercall_class;
use hvstats_abi::counter_set::CounterSet;
use hvstats_host::sched::SchedStat;
use hvstats_sources::host_faults::{Faults, write_host_faults};
use hvstats_sources::kvm_stats::KvmStats;
use hvstats_sources::thread::write_thread_counts;
use hvstats_sources::thread_time::ThreadTimes;
use hvstats_sources::tracepoint::{Corrections, Keys, TracepointCounts, write_tracepoint_counts};
use hvstats_sources::user_exits::UserExitCounts;
use hvstats_sources::vcpu_stats::{VcpuStats, kvm_stat_names};

/// Every VP counter: a writer given it writes everything it can.
fn all() -> CounterSet {
    CounterSet::of_kind(ObjectKind::Vp, |_| true)
}

/// The VP counters `write` leaves nonzero on a fresh page.
fn written_by(write: impl FnOnce(&SharedPage)) -> BTreeSet<&'static str> {
    let page = SharedPage::anonymous(ObjectKind::Vp).unwrap();
    write(&page);
    counters_of(ObjectKind::Vp).filter(|c| page.get(c.id) != 0).map(|c| c.name).collect()
}

/// The VP counters the catalog says `kind` maintains.
fn catalog_says(kind: SourceKind) -> BTreeSet<&'static str> {
    counters_of(ObjectKind::Vp)
        .filter(|c| c.maintained.source().is_some_and(|s| s.kind() == kind))
        .map(|c| c.name)
        .collect()
}

#[test]
fn the_run_loop_writes_exactly_its_catalog_counters() {
    let user = UserExitCounts::default();
    let written = written_by(|page| {
        let mut acct = ExitAccounting::new(true);
        acct.begin_hypercall(page, &user);
        for class in [UserExit::Io, UserExit::Hypercall, UserExit::Msr, UserExit::Mmio, UserExit::Other] {
            // A billion ticks is far above 100 ns on any clock.
            acct.record(page, &user, class, 1 << 30);
        }
    });
    // Failed hypercalls are the Hyper-V handler's to count (hyperv_guest tests it), by status.
    let mut expected = catalog_says(SourceKind::RunLoop);
    expected.remove(hvstats_abi::source::RunLoopCount::FailedHypercalls.counter().counter().unwrap().name);
    assert_eq!(written, expected);
}

#[test]
fn tracepoint_readings_write_exactly_their_catalog_counters() {
    let counts: TracepointCounts = [Some(1000); Tracepoint::ALL.len()];
    let corrections = Corrections { user_msr: 1, hypercalls: 1 };
    let written = written_by(|page| {
        write_tracepoint_counts(page, &all(), Keys::Own, |tp| counts[tp.index()], corrections)
    });
    assert_eq!(written, catalog_says(SourceKind::Tracepoint));
    // Every tracepoint the backend opens feeds a counter, but the exception count of the WHv API
    // and the parts added to another's counter (x2APIC accesses, exits the tracepoint misses).
    let feeding: BTreeSet<usize> = CATALOG
        .iter()
        .filter_map(|c| match c.maintained.source() {
            Some(hvstats_abi::Source::Tracepoint(tp)) => Some(tp.index()),
            _ => None,
        })
        .collect();
    let opened: BTreeSet<usize> = Tracepoint::ALL
        .iter()
        .filter(|&&tp| tp.counted_for_partitions())
        .filter(|&&tp| {
            tp != Tracepoint::InjException && !Tracepoint::ALL.iter().any(|t| t.added().contains(&tp))
        })
        .map(|tp| tp.index())
        .collect();
    assert_eq!(feeding, opened);
}

/// A KVM binary stats file (the kernel's layout) with `names`, each a cumulative time in
/// nanoseconds (unit seconds, exponent -9) holding `value`.
fn fake_stats_file(names: &[&str], value: u64) -> std::fs::File {
    const NAME_SIZE: usize = 48;
    let (header, desc_fixed) = (24usize, 16usize);
    let id_offset = header;
    let desc_offset = id_offset + NAME_SIZE;
    let data_offset = desc_offset + names.len() * (desc_fixed + NAME_SIZE);
    let mut bytes = Vec::new();
    for word in [0, NAME_SIZE, names.len(), id_offset, desc_offset, data_offset] {
        bytes.extend_from_slice(&(word as u32).to_le_bytes());
    }
    let mut id = b"kvm-test/vcpu-0".to_vec();
    id.resize(NAME_SIZE, 0);
    bytes.extend_from_slice(&id);
    for (i, name) in names.iter().enumerate() {
        bytes.extend_from_slice(&0x20u32.to_le_bytes()); // cumulative, seconds, base 10
        bytes.extend_from_slice(&(-9i16).to_le_bytes());
        bytes.extend_from_slice(&1u16.to_le_bytes());
        bytes.extend_from_slice(&((i * 8) as u32).to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        let mut n = name.as_bytes().to_vec();
        n.resize(NAME_SIZE, 0);
        bytes.extend_from_slice(&n);
    }
    for _ in names {
        bytes.extend_from_slice(&value.to_le_bytes());
    }
    // SAFETY: a literal name and no flags; the result is checked before it is owned.
    let fd = hvstats_host::os::check(unsafe { libc::memfd_create(c"kvm-stats".as_ptr(), 0) }).unwrap();
    // SAFETY: the kernel just gave us this fd; nothing else owns it.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    file.write_all(&bytes).unwrap();
    file
}

#[test]
fn kvm_statistics_write_exactly_their_catalog_counters() {
    let names: BTreeSet<&str> = counters_of(ObjectKind::Vp).flat_map(kvm_stat_names).copied().collect();
    let names: Vec<&str> = names.into_iter().collect();
    let stats = KvmStats::parse(fake_stats_file(&names, 1_000_000)).unwrap();
    let mut vcpu = VcpuStats::new(stats);
    vcpu.read();
    assert_eq!(
        vcpu.given().ids().count(),
        catalog_says(SourceKind::KvmStats).len(),
        "every statistic is there"
    );
    let written = written_by(|page| vcpu.write(page, &vcpu.given()));
    assert_eq!(written, catalog_says(SourceKind::KvmStats));
}

#[test]
fn thread_times_and_migrations_write_exactly_their_catalog_counters() {
    let times = ThreadTimes { total_100ns: 30, guest_100ns: 10 };
    let sched = SchedStat { run_ns: 3000, wait_ns: 700, dispatches: 4 };
    let written = written_by(|page| write_thread_counts(page, &all(), Some(times), Some(sched), Some(2)));
    let mut expected = catalog_says(SourceKind::ThreadTime);
    expected.extend(catalog_says(SourceKind::PerfSoftware));
    assert_eq!(written, expected);
}

#[test]
fn host_faults_write_exactly_their_catalog_counters() {
    let written = written_by(|page| write_host_faults(page, &all(), Faults { minor: 5, major: 2 }));
    assert_eq!(written, catalog_says(SourceKind::HostFaults));
}

#[test]
fn every_hypercall_class_is_counted_where_the_catalog_says() {
    for class in HypercallClass::ALL {
        let written = written_by(|page| count_hypercall_class(page, class));
        assert_eq!(written.len(), 1, "{class:?} has exactly one counter");
    }
    let written = written_by(|page| HypercallClass::ALL.iter().for_each(|&c| count_hypercall_class(page, c)));
    assert_eq!(written, catalog_says(SourceKind::Hypercall));
}

#[test]
fn the_backend_sources_cover_every_maintained_vp_counter() {
    let covered: BTreeSet<&str> = [
        // The sequence counter: every merge of the sources below writes it.
        SourceKind::Authority,
        SourceKind::RunLoop,
        SourceKind::Tracepoint,
        SourceKind::KvmStats,
        SourceKind::ThreadTime,
        SourceKind::PerfSoftware,
        SourceKind::HostFaults,
        SourceKind::Hypercall,
    ]
    .into_iter()
    .flat_map(catalog_says)
    .collect();
    let maintained: BTreeSet<&str> =
        counters_of(ObjectKind::Vp).filter(|c| c.maintained.is_maintained()).map(|c| c.name).collect();
    assert_eq!(covered, maintained, "a VP counter maintained by a source the backend has no writer for");
}
