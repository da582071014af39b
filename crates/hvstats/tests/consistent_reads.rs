//! Consistent reads of a VP page through a second mapping (as a root tool maps it) and through
//! the long-lived reader of a published instance while merges write it — by both of its paths,
//! the mapped arena and `pread` (another user's arena) — and histograms recorded by the page's
//! writer read back bucket by bucket.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use hvstats::attach::{Attach, AttachError, Instance};
use hvstats::reader::ReadPath;
use hvstats::rules::StatsObject;
use hvstats::snapshot::{ObjectReading, take_instance};
use hvstats::{Hypervisor, SharedPage};
use hvstats_abi::catalog::{Presentation, counters_of, vp};
use hvstats_abi::histogram::bucket_of;
use hvstats_abi::page::PageView;
use hvstats_abi::seqcount::SeqRead;
use hvstats_abi::{CounterId, ObjectKind};
use hvstats_testkit::TempDir;
use zerocopy::IntoBytes;

/// The VP counters a merge writes in this test: every one-slot counter but the sequence itself.
fn merged() -> Vec<CounterId> {
    counters_of(ObjectKind::Vp)
        .filter(|c| c.presentation != Presentation::Histogram && c.id != vp::SEQUENCE)
        .map(|c| c.id)
        .collect()
}

#[test]
fn a_reader_racing_merges_gets_every_counter_from_one_merge() {
    let page = Arc::new(SharedPage::anonymous(ObjectKind::Vp).unwrap());
    let reader = page.map_read_only().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (page, stop) = (Arc::clone(&page), Arc::clone(&stop));
        std::thread::spawn(move || {
            let ids = merged();
            let mut generation = 0u64;
            while !stop.load(Ordering::Relaxed) {
                generation += 1;
                {
                    let _merge = page.begin_merge().expect("a VP page has a sequence counter");
                    for &id in &ids {
                        page.set(id, generation);
                    }
                }
                // Merges come at a cadence (a source's refresh), not back to back: a writer that
                // reopens its window at once would leave a 4 KiB copy no moment to succeed.
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
            generation
        })
    };
    let ids = merged();
    let (mut consistent, mut torn) = (0u32, 0u32);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while consistent < 500 {
        assert!(
            std::time::Instant::now() < deadline,
            "only {consistent} consistent copies ({torn} torn) in 60 s"
        );
        match reader.consistent_snapshot(ObjectKind::Vp) {
            SeqRead::Consistent { value, sequence } => {
                let view = PageView::read(value.as_bytes(), ObjectKind::Vp).unwrap();
                let first = view.get(ids[0]);
                for &id in &ids {
                    assert_eq!(view.get(id), first, "{:?} is from another merge", id.counter().unwrap().name);
                }
                assert_eq!(first, sequence / 2);
                assert_eq!(view.get(vp::SEQUENCE), sequence);
                consistent += 1;
            }
            SeqRead::Torn { .. } => torn += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    let merges = writer.join().unwrap();
    eprintln!("{consistent} consistent copies, {torn} torn, {merges} merges");
    // Without merges under way every copy is consistent, and the writer's own copy agrees.
    let SeqRead::Consistent { value, .. } = page.consistent_snapshot() else {
        panic!("no merge is under way")
    };
    assert_eq!(PageView::read(value.as_bytes(), ObjectKind::Vp).unwrap().get(vp::HYPERCALLS), merges);
}

#[test]
fn pages_without_a_sequence_counter_copy_plainly() {
    let page = SharedPage::anonymous(ObjectKind::Partition).unwrap();
    assert!(page.begin_merge().is_none());
    assert!(page.consistent_snapshot().is_consistent());
}

#[test]
fn recorded_times_land_in_their_buckets_and_read_back_through_a_second_mapping() {
    let page = SharedPage::anonymous(ObjectKind::Vp).unwrap();
    // A known distribution: 90 exits of 800 ns, 9 of 20 µs, 1 of 3 ms.
    let times = [(800u64, 90u64), (20_000, 9), (3_000_000, 1)];
    for &(ns, n) in &times {
        for _ in 0..n {
            page.record_time(vp::IO_TIME_HISTOGRAM, ns);
        }
    }
    page.record_time(vp::MSR_TIME_HISTOGRAM, 5);
    let reader = page.map_read_only().unwrap();
    let copy = reader.consistent_snapshot(ObjectKind::Vp).into_value();
    let view = PageView::read(copy.as_bytes(), ObjectKind::Vp).unwrap();
    let h = view.histogram(vp::IO_TIME_HISTOGRAM).unwrap();
    assert_eq!(h.count(), 100);
    assert_eq!(h.sum_ns, 90 * 800 + 9 * 20_000 + 3_000_000);
    for (i, &b) in h.buckets.iter().enumerate() {
        let expected: u64 = times.iter().filter(|(ns, _)| bucket_of(*ns) == i).map(|(_, n)| n).sum();
        assert_eq!(b, expected, "bucket {i}");
    }
    assert_eq!((bucket_of(800), bucket_of(20_000), bucket_of(3_000_000)), (10, 15, 22));
    assert_eq!(h.quantile_upper_ns(0.5), Some(1023));
    assert_eq!(h.quantile_upper_ns(0.99), Some(32_767));
    // Histograms do not share slots: the MSR one holds its single exit, the others nothing.
    assert_eq!(view.histogram(vp::MSR_TIME_HISTOGRAM).unwrap().count(), 1);
    assert_eq!(view.histogram(vp::HYPERCALLS_TIME_HISTOGRAM).unwrap().count(), 0);
    assert_eq!(view.histogram(vp::HALT_POLL_FAIL_HISTOGRAM).unwrap().count(), 0);
}

/// The one instance under `dir`, its arenas reached by `path`; asserts the path taken.
fn attach(dir: &std::path::Path, path: ReadPath) -> Instance {
    let mut attach = Attach::with_read_path(dir, path);
    let changes = attach.refresh().unwrap();
    assert!(changes.problems.is_empty(), "{:?}", changes.problems);
    let instance = attach.into_instances().remove(0);
    // The test runs as the publisher's user (or root): left to choose, the reader maps.
    assert_eq!(instance.is_mapped(), path == ReadPath::MapWhenSafe, "{path:?}");
    instance
}

#[test]
fn the_long_lived_reader_gets_every_counter_of_a_vp_from_one_merge() {
    long_lived_reader_reads_one_merge(ReadPath::MapWhenSafe, "consistent-attach");
}

#[test]
fn the_long_lived_reader_by_pread_gets_every_counter_of_a_vp_from_one_merge() {
    long_lived_reader_reads_one_merge(ReadPath::Pread, "consistent-attach-pread");
}

fn long_lived_reader_reads_one_merge(path: ReadPath, name: &str) {
    let tmp = TempDir::new(name);
    let hv = Hypervisor::new_published(&tmp.0).unwrap();
    // A partition that declares no counter unavailable (ours declare the catalog's unmaintained
    // ones): every counter the writer merges is one the snapshot decodes.
    let part = hv.create_partition_declared(None, &[0], "", &[]).unwrap();
    let instance = attach(&tmp.0, path);
    let object = StatsObject::Vp(part.id(), 0);
    let ids = merged();
    let stop = AtomicBool::new(false);
    let (reads, torn, merges) = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let page = part.vp_page(0).unwrap();
            let mut generation = 0u64;
            while !stop.load(Ordering::Relaxed) {
                generation += 1;
                {
                    let _merge = page.begin_merge().expect("a VP page has a sequence counter");
                    for &id in &ids {
                        page.set(id, generation);
                    }
                }
                // Merges come at a cadence (a source's refresh), not back to back.
                for _ in 0..256 {
                    std::hint::spin_loop();
                }
            }
            generation
        });
        // Stops the writer however the reader ends, so a failed assertion cannot hang the scope.
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let stopper = Stop(&stop);
        let (mut reads, mut torn, mut last, mut seen) = (0u32, 0u32, 0u64, 0u32);
        // Enough reads, and enough of them from different merges, that they raced the writer.
        while reads < 1000 || seen < 50 {
            assert!(reads + torn < 1_000_000, "{reads} reads saw only {seen} merges");
            let copy = match instance.read(object) {
                Ok(copy) => copy,
                // Reported as torn, never handed out; counted, not checked.
                Err(AttachError::Torn(o)) if o == object => {
                    torn += 1;
                    continue;
                }
                Err(e) => panic!("the VP stays readable: {e}"),
            };
            let view = PageView::read(copy.as_bytes(), ObjectKind::Vp).unwrap();
            let first = view.get(ids[0]);
            for &id in &ids {
                assert_eq!(view.get(id), first, "{:?} is from another merge", id.counter().unwrap().name);
            }
            assert_eq!(view.get(vp::SEQUENCE), first * 2);
            assert!(first >= last, "merges go forward");
            seen += u32::from(first != last);
            last = first;
            reads += 1;
            // What snapshot, top and serve decode goes through the same copy.
            if reads % 100 == 0 {
                let snap = take_instance(&instance);
                if let ObjectReading::Counters(values) = &snap.partitions[0].vps[0].reading {
                    let merged: Vec<u64> =
                        values.iter().filter(|(c, _)| ids.contains(&c.id)).map(|&(_, v)| v).collect();
                    assert_eq!(merged.len(), ids.len());
                    assert!(merged.iter().all(|&v| v == merged[0]), "a snapshot mixes merges: {merged:?}");
                }
            }
        }
        drop(stopper);
        eprintln!("{seen} different merges read");
        (reads, torn, writer.join().unwrap())
    });
    assert!(merges > 0);
    eprintln!("{path:?}: {reads} consistent reads, {torn} torn, during {merges} merges");
    let copy = instance.read(object).unwrap();
    assert_eq!(PageView::read(copy.as_bytes(), ObjectKind::Vp).unwrap().get(ids[0]), merges);
}

#[test]
fn a_page_left_mid_merge_is_reported_torn_not_used() {
    page_left_mid_merge_is_torn(ReadPath::MapWhenSafe, "torn-attach");
}

#[test]
fn a_page_left_mid_merge_is_reported_torn_not_used_by_pread() {
    page_left_mid_merge_is_torn(ReadPath::Pread, "torn-attach-pread");
}

fn page_left_mid_merge_is_torn(path: ReadPath, name: &str) {
    let tmp = TempDir::new(name);
    let hv = Hypervisor::new_published(&tmp.0).unwrap();
    let part = hv.create_partition(1).unwrap();
    let instance = attach(&tmp.0, path);
    let object = StatsObject::Vp(part.id(), 0);
    let page = part.vp_page(0).unwrap();
    // A writer that stopped half-way through a merge: the sequence counter stays odd.
    let merge = page.begin_merge().unwrap();
    page.set(vp::HYPERCALLS, 5);
    assert!(matches!(instance.read(object), Err(AttachError::Torn(o)) if o == object));
    let snap = take_instance(&instance);
    match &snap.partitions[0].vps[0].reading {
        ObjectReading::Unreadable { permission_denied: false, reason } => {
            assert!(reason.contains("mid-update"), "{reason}")
        }
        other => panic!("a torn page is not decoded: {other:?}"),
    }
    // Pages without a sequence counter read as before.
    assert!(instance.read(StatsObject::Partition(part.id())).is_ok());
    drop(merge);
    let copy = instance.read(object).unwrap();
    assert_eq!(PageView::read(copy.as_bytes(), ObjectKind::Vp).unwrap().get(vp::HYPERCALLS), 5);
}
