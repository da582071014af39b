//! What an observer of another hypervisor publishes, as a reader in another process sees it:
//! partitions under that hypervisor's ids and sparse VP indices, hypervisor and LP counters
//! declared absent, and the side file of values the catalog has no place for.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

use hvstats::attach::Attach;
use hvstats::unmapped::{self, ObjectRef, Unmapped};
use hvstats::{Hypervisor, InstanceConfig};
use hvstats_abi::catalog::{hypervisor, lp, vp};

use hvstats_testkit::TempDir;

#[test]
fn partitions_keep_foreign_ids_and_absent_counters_read_as_absent() {
    let tmp = TempDir::new("foreign-publication");
    let hv = Hypervisor::with_config(InstanceConfig {
        runtime_dir: Some(tmp.path().to_owned()),
        logical_processors: Some(vec![0, 1]),
        ..Default::default()
    })
    .unwrap();
    let p = hv.create_partition_with_id(u64::MAX, &[0, 2, 5], "mshv:self").unwrap();
    p.vp_page(5).unwrap().set(vp::CPUID_INSTRUCTIONS, 42);
    assert!(p.vp_page(1).is_none());
    assert_eq!(p.vp_pages().map(|(n, _)| n).collect::<Vec<_>>(), [0, 2, 5]);
    let taken = hv.create_partition_with_id(u64::MAX, &[], "again").unwrap_err();
    assert_eq!(taken.kind(), std::io::ErrorKind::AlreadyExists);
    let unsorted = hv.create_partition_with_id(7, &[2, 1], "x").unwrap_err();
    assert_eq!(unsorted.kind(), std::io::ErrorKind::InvalidInput);
    hv.set_global_unavailable(None, &[hypervisor::TOTAL_PAGES, hypervisor::MONITORED_NOTIFICATIONS]);
    hv.set_global_unavailable(Some(1), &[lp::GLOBAL_TIME]);
    let mut values = Unmapped::new();
    values.insert(ObjectRef::Vp(u64::MAX, 5), vec![("VpVtl2RunTime".into(), 9)]);
    hv.publish_unmapped(unmapped::encode(&values).0.as_bytes()).unwrap();

    let mut attach = Attach::new(tmp.path());
    attach.refresh().unwrap();
    let snap = attach.instances_mut().next().unwrap().snapshot();
    let part = &snap.partitions[0];
    assert_eq!((part.id, part.name.as_str()), (u64::MAX, "mshv:self"));
    assert_eq!(part.vps.iter().map(|v| v.index).collect::<Vec<_>>(), [0, 2, 5]);
    assert_eq!(part.vps[2].reading.get("CPUID instructions/sec"), Some(42));
    assert_eq!(snap.hypervisor.get("Total pages"), None);
    assert_eq!(snap.hypervisor.get("Monitored notifications"), None);
    assert_eq!(snap.hypervisor.get("Partitions"), Some(1));
    assert_eq!(snap.lps[1].reading.get("Global time"), None);
    assert!(snap.lps[0].reading.get("Global time").is_some());
    assert_eq!(snap.unmapped, Some(values));

    // The side file goes with the instance.
    let files = || std::fs::read_dir(tmp.path().join("instances")).unwrap().count();
    assert_eq!(files(), 3);
    drop((p, snap, attach));
    drop(hv);
    assert_eq!(files(), 0);
}

#[test]
fn instances_without_a_side_file_have_no_unmapped_values() {
    let tmp = TempDir::new("foreign-publication-none");
    let hv = Hypervisor::new_published(tmp.path()).unwrap();
    let mut attach = Attach::new(tmp.path());
    attach.refresh().unwrap();
    assert_eq!(attach.instances_mut().next().unwrap().snapshot().unmapped, None);
    drop(hv);
}
