//! Consistent reads of a VP page through a second mapping (as a root tool maps it) while merges
//! write it, and histograms recorded by the page's writer read back bucket by bucket.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use hvstats::SharedPage;
use hvstats_abi::catalog::{Presentation, counters_of, vp};
use hvstats_abi::histogram::bucket_of;
use hvstats_abi::page::PageView;
use hvstats_abi::seqcount::SeqRead;
use hvstats_abi::{CounterId, ObjectKind};
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
                let _merge = page.begin_merge().expect("a VP page has a sequence counter");
                for &id in &ids {
                    page.set(id, generation);
                }
            }
            generation
        })
    };
    let ids = merged();
    let (mut consistent, mut torn) = (0u32, 0u32);
    while consistent < 500 {
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
