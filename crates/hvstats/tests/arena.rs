//! The arena under load: partitions added and removed by the thousand while readers read (no
//! reader ever gets a page of the wrong object, no torn index entry), and an instance of 65,536
//! VPs published and read with bounded memory.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use hvstats::attach::{Attach, AttachError};
use hvstats::index::{self, Entry};
use hvstats::publish;
use hvstats::reader::ArenaReader;
use hvstats::rules::StatsObject;
use hvstats::snapshot::{self, ObjectReading};
use hvstats::{Hypervisor, InstanceConfig};
use hvstats_abi::catalog::vp;
use hvstats_abi::{ObjectKind, PAGE_SIZE};

use hvstats_testkit::TempDir;

fn published(dir: &std::path::Path) -> Arc<Hypervisor> {
    Hypervisor::with_config(InstanceConfig {
        runtime_dir: Some(dir.to_owned()),
        logical_processors: Some(vec![0]),
        ..Default::default()
    })
    .unwrap()
}

/// The signature a churned VP page carries: which partition and VP it belongs to.
fn signature(id: u64, vp: u32) -> u64 {
    id * 1000 + u64::from(vp) + 1
}

#[test]
fn churn_with_readers_never_shows_a_page_of_the_wrong_object_nor_a_torn_entry() {
    let tmp = TempDir::new("churn");
    let hv = published(&tmp.0);
    let arena_path = publish::instances_dir(&tmp.0).join(hv.published_name().unwrap().arena_file());
    let done = Arc::new(AtomicBool::new(false));
    let checked = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (dir, done, checked) = (tmp.0.clone(), done.clone(), checked.clone());
            let arena_path = arena_path.clone();
            std::thread::spawn(move || {
                let mut attach = Attach::new(&dir);
                let mut raw = ArenaReader::open(std::fs::File::open(&arena_path).unwrap()).unwrap();
                let mut max_generation = 0;
                while !done.load(Ordering::Relaxed) {
                    attach.refresh().unwrap();
                    let Some(instance) = attach.instances().next() else { continue };
                    for p in instance.partitions() {
                        for &n in p.vp_indices() {
                            match instance.read(StatsObject::Vp(p.id, n)) {
                                Ok(page) => {
                                    // A fresh page reads 0 until its writer signs it; any other
                                    // value is another object's page.
                                    let sig = page.data[vp::HYPERCALLS.slot()];
                                    assert!(
                                        sig == 0 || sig == signature(p.id, n),
                                        "VP {}/{n} read {sig}",
                                        p.id
                                    );
                                    let view = snapshot::decode(ObjectKind::Vp, &page);
                                    assert!(matches!(view, ObjectReading::Counters(_)), "{view:?}");
                                    checked.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(AttachError::Changed(_)) => {}
                                Err(e) => panic!("{e}"),
                            }
                        }
                    }
                    // Every entry, read raw, decodes: never a torn mix of two objects.
                    raw.grow().unwrap();
                    for slot in 0..raw.slots() {
                        let Ok(words) = raw.entry_words(slot) else { continue };
                        let entry = Entry::decode(&words).expect("an entry is whole");
                        if let Some(Entry { kind: ObjectKind::Vp, id, index, generation, .. }) = entry {
                            assert!(id > 0 && index < 3, "VP entry {id}/{index}");
                            max_generation = max_generation.max(generation);
                        }
                    }
                }
                max_generation
            })
        })
        .collect();

    // The writer churns at least 3,000 partitions, and on until the readers have checked enough
    // pages, however fast either side runs on this host; the deadline only guards against a hang.
    let mut live = std::collections::VecDeque::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    let mut round = 0u32;
    while round < 3000 || checked.load(Ordering::Relaxed) <= 1000 {
        assert!(
            std::time::Instant::now() < deadline,
            "readers checked only {} pages while 300 s of churn went by",
            checked.load(Ordering::Relaxed)
        );
        let vps = 1 + round % 3;
        let p = hv.create_partition(vps).unwrap();
        for n in 0..vps {
            p.vp_page(n).unwrap().set(vp::HYPERCALLS, signature(p.id(), n));
        }
        live.push_back(p);
        if live.len() > 40 {
            let old = live.pop_front().unwrap();
            hv.remove_partition(old.id());
        }
        round += 1;
    }
    done.store(true, Ordering::Relaxed);
    let generations: Vec<u64> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    assert!(generations.iter().any(|&g| g > 1), "slots were reused under the readers: {generations:?}");
    // Thousands of partitions came and went; the arena only holds the ones alive at a time.
    let held = std::fs::metadata(&arena_path).unwrap().len() as usize;
    assert!(held <= index::file_bytes(4), "{held} bytes");
}

fn skip_scale() -> bool {
    if std::env::var_os("HVSTATS_SKIP_SCALE").is_some_and(|v| v == "1") {
        eprintln!("skipped: HVSTATS_SKIP_SCALE=1");
        return true;
    }
    false
}

/// Private memory (the heap), not the shared arena pages both mappings touch.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("RssAnon:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn sixty_five_thousand_vps_publish_and_are_read_with_bounded_memory() {
    if skip_scale() {
        return;
    }
    let tmp = TempDir::new("scale");
    let hv = published(&tmp.0);
    let parts: Vec<_> = (0..4096).map(|_| hv.create_partition(16).unwrap()).collect();
    for p in &parts {
        for n in 0..16 {
            p.vp_page(n).unwrap().set(vp::HYPERCALLS, signature(p.id(), n));
        }
    }
    let arena_path = publish::instances_dir(&tmp.0).join(hv.published_name().unwrap().arena_file());
    let meta = std::fs::metadata(&arena_path).unwrap();
    let per_object = (meta.blocks() * 512) as f64 / (4096.0 * 17.0);
    assert!(per_object <= 1.1 * PAGE_SIZE as f64, "{per_object} bytes of storage per object");

    let mut attach = Attach::new(&tmp.0);
    attach.refresh().unwrap();
    let instance = attach.instances().next().unwrap();
    assert_eq!(instance.partitions().len(), 4096);
    let before = rss_kib();
    let mut vps = 0;
    for p in instance.partitions() {
        let snap = snapshot::take_partition(instance, p).unwrap();
        for v in &snap.vps {
            assert_eq!(v.reading.get("Hypercalls/sec"), Some(signature(p.id, v.index)));
            vps += 1;
        }
    }
    assert_eq!(vps, 65_536);
    let grown = rss_kib().saturating_sub(before);
    assert!(grown < 64 * 1024, "streaming 65,536 VPs grew the reader by {grown} KiB");
}

#[test]
fn a_snapshot_into_an_earlier_one_reads_what_a_fresh_one_reads_whatever_that_held() {
    let tmp = TempDir::new("into");
    let hv = published(&tmp.0);
    let parts: Vec<_> =
        [3, 1, 2, 4].iter().map(|&vps| hv.create_partition_named(vps, "p").unwrap()).collect();
    let mut attach = Attach::new(&tmp.0);
    attach.refresh().unwrap();
    let instance = attach.instances_mut().next().unwrap();
    // What the earlier snapshot holds: four partitions, one VP unreadable, one partition's
    // reading unreadable, histograms empty or not.
    let mut reused = instance.snapshot();
    reused.partitions[0].vps[1].reading =
        ObjectReading::Unreadable { permission_denied: false, reason: "earlier".into() };
    reused.partitions[2].reading =
        ObjectReading::Unreadable { permission_denied: true, reason: "earlier".into() };
    reused.partitions[3].vps[0].histograms.clear();

    // Then the host changes: a partition goes, one comes with more VPs, one stops, values move.
    hv.remove_partition(parts[1].id());
    let added = hv.create_partition_named(5, "added").unwrap();
    parts[3].stop("stopped on purpose");
    for (n, page) in parts[0].vp_pages().chain(added.vp_pages()) {
        page.set(vp::HYPERCALLS, 100 + u64::from(n));
        page.record_time(vp::IO_TIME_HISTOGRAM, 1000 * u64::from(n + 1));
    }
    instance.snapshot_into(&mut reused);
    let fresh = instance.snapshot();
    assert_eq!(format!("{reused:?}"), format!("{fresh:?}"), "the same values, field by field");
    let shape: Vec<(usize, bool)> = reused.partitions.iter().map(|p| (p.vps.len(), p.active)).collect();
    assert_eq!(shape, [(3, true), (2, true), (4, false), (5, true)]);
    let last = &reused.partitions[3];
    assert_eq!((last.name.as_str(), last.vps[4].reading.get("Hypercalls/sec")), ("added", Some(104)));
    let io = last.vps[4].histograms.iter().find(|(c, _)| c.id == vp::IO_TIME_HISTOGRAM).unwrap().1;
    assert_eq!((io.sum_ns, io.count()), (5000, 1));
    assert!(
        reused
            .partitions
            .iter()
            .flat_map(|p| &p.vps)
            .all(|v| matches!(v.reading, ObjectReading::Counters(_)))
    );
    assert!(matches!(reused.partitions[2].reading, ObjectReading::Counters(_)), "read again");
}
