//! Publication and attach: an instance published under a runtime directory is found and read by a
//! root reader through the very pages the writer updates; dead instances are removed.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use hvstats::attach::{self, AttachError, RootReader};
use hvstats::publish::{self, MANIFEST_FILE};
use hvstats::rules::StatsObject;
use hvstats::{Hypervisor, InstanceConfig};
use hvstats_abi::catalog::{hypervisor, partition, vp};
use hvstats_abi::page::PageView;
use hvstats_abi::{HvStatus, ObjectKind, StatsAreaType, StatsObjectIdentity, StatsObjectType};
use zerocopy::IntoBytes;

/// A fresh directory under the target's temporary area, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("hvstats-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn published(dir: &Path) -> std::sync::Arc<Hypervisor> {
    Hypervisor::with_config(InstanceConfig {
        runtime_dir: Some(dir.to_owned()),
        logical_processors: Some(vec![0, 1]),
        ..Default::default()
    })
    .unwrap()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn a_reader_sees_the_writers_counters_change_through_the_same_pages() {
    let tmp = TempDir::new("round-trip");
    let hv = published(&tmp.0);
    let part = hv.create_partition(2).unwrap();
    part.set_ram_pages(64);

    let found = attach::discover(&tmp.0).unwrap();
    assert_eq!(found.instances.len(), 1);
    let instance = found.instances[0].clone();
    assert_eq!(instance.pid(), std::process::id());
    assert_eq!(instance.manifest().partitions.len(), 1);
    assert_eq!(instance.manifest().partitions[0].id, part.id());
    assert_eq!(instance.manifest().partitions[0].vp_count, 2);
    assert_eq!(instance.manifest().logical_processors.len(), 2);

    let mut reader = RootReader::new(instance);
    let vp1 = StatsObjectIdentity::vp(part.id(), 1, StatsAreaType::PARENT);
    let page = reader.map_stats_page(StatsObjectType::VP, vp1).unwrap();
    assert_eq!(page.slot(vp::CPUID_INSTRUCTIONS.slot()), 0);
    // The writer updates its page; the reader's existing mapping shows each value, no message sent.
    for n in [1, 77, 1_000_000] {
        part.vp_page(1).unwrap().set(vp::CPUID_INSTRUCTIONS, n);
        assert_eq!(page.slot(vp::CPUID_INSTRUCTIONS.slot()), n);
    }
    let copy = page.snapshot();
    let view = PageView::read(copy.as_bytes(), ObjectKind::Vp).unwrap();
    assert_eq!(view.get(vp::CPUID_INSTRUCTIONS), 1_000_000);

    let hv_page = reader.read(StatsObject::Hypervisor).unwrap();
    let view = PageView::read(hv_page.as_bytes(), ObjectKind::Hypervisor).unwrap();
    assert_eq!(view.get(hypervisor::LOGICAL_PROCESSORS), 2);
    assert_eq!(view.get(hypervisor::PARTITIONS), 1);
    assert_eq!(view.get(hypervisor::VIRTUAL_PROCESSORS), 2);
    assert_eq!(view.get(hypervisor::TOTAL_PAGES), 1 + 2 + 3 + 64);
    let p = reader.read(StatsObject::Partition(part.id())).unwrap();
    assert_eq!(PageView::read(p.as_bytes(), ObjectKind::Partition).unwrap().get(partition::GPA_PAGES), 64);
    let lp = reader.read(StatsObject::LogicalProcessor(1)).unwrap();
    assert!(PageView::read(lp.as_bytes(), ObjectKind::LogicalProcessor).is_ok());
}

#[test]
fn global_pages_are_root_only_and_partition_pages_world_readable() {
    let tmp = TempDir::new("modes");
    let hv = published(&tmp.0);
    let part = hv.create_partition(1).unwrap();
    let dir = hv.published_dir().unwrap().to_owned();
    assert_eq!(mode(&publish::page_path(&dir, StatsObject::Hypervisor)), 0o600);
    assert_eq!(mode(&publish::page_path(&dir, StatsObject::LogicalProcessor(0))), 0o600);
    assert_eq!(mode(&publish::page_path(&dir, StatsObject::Partition(part.id()))), 0o644);
    assert_eq!(mode(&publish::page_path(&dir, StatsObject::Vp(part.id(), 0))), 0o644);
}

#[test]
fn the_manifest_follows_partitions_and_their_state_and_the_owner_removes_its_directory() {
    let tmp = TempDir::new("manifest");
    let hv = published(&tmp.0);
    let dir = hv.published_dir().unwrap().to_owned();
    let a = hv.create_partition(1).unwrap();
    let b = hv.create_partition(3).unwrap();
    let ids =
        |dir: &Path| publish::read_manifest(dir).unwrap().partitions.iter().map(|p| p.id).collect::<Vec<_>>();
    assert_eq!(ids(&dir), vec![a.id(), b.id()]);
    b.set_active(false);
    assert!(!publish::read_manifest(&dir).unwrap().partitions[1].active);

    let mut reader = RootReader::new(attach::discover(&tmp.0).unwrap().instances.remove(0));
    let b_vp = StatsObjectIdentity::vp(b.id(), 0, StatsAreaType::PARENT);
    let refused = reader.map_stats_page(StatsObjectType::VP, b_vp).map(|_| ()).unwrap_err();
    assert!(matches!(refused, AttachError::Refused(HvStatus::INVALID_PARTITION_STATE)), "{refused:?}");

    hv.remove_partition(a.id());
    assert_eq!(ids(&dir), vec![b.id()]);
    assert!(!publish::page_path(&dir, StatsObject::Partition(a.id())).exists());
    reader.instance_mut().refresh().unwrap();
    let a_page = StatsObjectIdentity::partition(a.id(), StatsAreaType::SELF);
    let refused = reader.map_stats_page(StatsObjectType::PARTITION, a_page).map(|_| ()).unwrap_err();
    assert!(matches!(refused, AttachError::Refused(HvStatus::INVALID_PARTITION_ID)), "{refused:?}");

    drop((a, b));
    drop(hv);
    assert!(!dir.exists());
    assert!(attach::discover(&tmp.0).unwrap().instances.is_empty());
}

#[test]
fn an_attached_root_follows_the_map_rules() {
    let tmp = TempDir::new("root-rules");
    let hv = published(&tmp.0);
    let part = hv.create_partition(2).unwrap();
    let mut reader = RootReader::new(attach::discover(&tmp.0).unwrap().instances.remove(0));
    let status = |r: Result<(), AttachError>| match r {
        Ok(()) => HvStatus::SUCCESS,
        Err(AttachError::Refused(s)) => s,
        Err(e) => panic!("{e}"),
    };
    let mut map = |t, id| status(reader.map_stats_page(t, id).map(|_| ()));
    let hv_id = StatsObjectIdentity::hypervisor(StatsAreaType::SELF);
    assert_eq!(map(StatsObjectType::HYPERVISOR, hv_id), HvStatus::SUCCESS);
    assert_eq!(map(StatsObjectType::HYPERVISOR, hv_id), HvStatus::OPERATION_DENIED);
    let parent = StatsObjectIdentity::partition(part.id(), StatsAreaType::PARENT);
    assert_eq!(map(StatsObjectType::PARTITION, parent), HvStatus::SUCCESS);
    let lp = StatsObjectIdentity::logical_processor(2, StatsAreaType::SELF);
    assert_eq!(map(StatsObjectType::LOGICAL_PROCESSOR, lp), HvStatus::INVALID_LP_INDEX);
    let vp = StatsObjectIdentity::vp(part.id(), 2, StatsAreaType::SELF);
    assert_eq!(map(StatsObjectType::VP, vp), HvStatus::INVALID_VP_INDEX);
    let internal = StatsObjectIdentity::hypervisor(StatsAreaType::INTERNAL);
    assert_eq!(map(StatsObjectType::HYPERVISOR, internal), HvStatus::INVALID_PARAMETER);
    reader.set_quota(2);
    let lp0 = StatsObjectIdentity::logical_processor(0, StatsAreaType::SELF);
    assert_eq!(
        status(reader.map_stats_page(StatsObjectType::LOGICAL_PROCESSOR, lp0).map(|_| ())),
        HvStatus::INSUFFICIENT_MEMORY
    );
    assert_eq!(status(reader.unmap_stats_page(StatsObjectType::HYPERVISOR, hv_id)), HvStatus::SUCCESS);
    assert_eq!(
        status(reader.unmap_stats_page(StatsObjectType::HYPERVISOR, hv_id)),
        HvStatus::INVALID_PARAMETER
    );
}

/// Run as a child process by the test below: publishes an instance, says where, and waits.
#[test]
#[ignore = "a child process of a_killed_publisher_is_found_dead_and_removed"]
fn child_publisher() {
    let Some(dir) = std::env::var_os("HVSTATS_TEST_PUBLISH_DIR") else { return };
    let hv = published(Path::new(&dir));
    let part = hv.create_partition(1).unwrap();
    part.vp_page(0).unwrap().set(vp::HYPERCALLS, 5);
    println!("\npublished-at={}", hv.published_dir().unwrap().display());
    std::thread::sleep(std::time::Duration::from_secs(60));
}

/// Kills the child if the test fails before it does.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_killed_publisher_is_found_dead_and_removed() {
    let tmp = TempDir::new("killed");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_publisher", "--ignored", "--nocapture", "--test-threads=1"])
        .env("HVSTATS_TEST_PUBLISH_DIR", &tmp.0)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut child = KillOnDrop(child);
    let dir = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|line| line.split_once("published-at=").map(|(_, dir)| PathBuf::from(dir)))
        .expect("the child publishes");
    assert!(dir.join(MANIFEST_FILE).exists());
    let live = attach::discover(&tmp.0).unwrap();
    assert_eq!(live.instances.len(), 1);
    assert_eq!(live.instances[0].pid(), child.0.id());

    // SIGKILL: the child cannot clean up. Not reaped yet, it lingers as a zombie: dead all the same.
    child.0.kill().unwrap();
    let stat = format!("/proc/{}/stat", child.0.id());
    let zombie = (0..500).any(|_| {
        let state = std::fs::read_to_string(&stat).unwrap_or_default();
        let zombie = state.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        if !zombie {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        zombie
    });
    assert!(zombie, "the killed child becomes a zombie until reaped");
    assert!(dir.exists(), "a killed owner leaves its directory behind");

    let found = attach::discover(&tmp.0).unwrap();
    assert!(found.instances.is_empty(), "a dead instance is never shown as live");
    assert_eq!(found.removed_dead, vec![dir.clone()]);
    assert!(!dir.exists());
    child.0.wait().unwrap();
}

#[test]
fn a_new_publisher_removes_dead_instances_and_stale_staging_directories() {
    let tmp = TempDir::new("stale");
    let instances = publish::instances_dir(&tmp.0);
    // A process that cannot be alive: pid 0 is never a user process.
    let dead = instances.join("0-1-0");
    let staging = instances.join(".0-1-1.staging");
    for d in [&dead, &staging] {
        std::fs::create_dir_all(d.join("lp")).unwrap();
        std::fs::write(d.join(MANIFEST_FILE), b"{}").unwrap();
    }
    let unrelated = instances.join("notes");
    std::fs::create_dir_all(&unrelated).unwrap();
    let hv = published(&tmp.0);
    assert!(!dead.exists());
    assert!(!staging.exists());
    assert!(unrelated.exists(), "only instance directories are touched");
    assert_eq!(attach::discover(&tmp.0).unwrap().instances.len(), 1);
    drop(hv);
}

#[test]
fn no_runtime_directory_means_no_instances() {
    let tmp = TempDir::new("empty");
    let found = attach::discover(&tmp.0.join("missing")).unwrap();
    assert!(found.instances.is_empty() && found.problems.is_empty());
}
