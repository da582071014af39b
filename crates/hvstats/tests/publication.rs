//! Publication and attach: an instance published under a runtime directory is found and read by a
//! long-lived reader through the very pages the writer updates; dead instances are removed;
//! stopped partitions stay readable; counters no source gives read as unknown.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use hvstats::attach::{self, Attach, AttachError, RootReader};
use hvstats::index::ObjectState;
use hvstats::publish::{self, InstanceName};
use hvstats::rules::StatsObject;
use hvstats::{Hypervisor, InstanceConfig, InstanceDescription, PageAccess};
use hvstats_abi::catalog::{hypervisor, partition, vp};
use hvstats_abi::page::PageView;
use hvstats_abi::{HvError, HvStatus, ObjectKind, StatsAreaType, StatsObjectIdentity, StatsObjectType};
use zerocopy::IntoBytes;

use hvstats_testkit::TempDir;

fn published(dir: &Path) -> std::sync::Arc<Hypervisor> {
    Hypervisor::with_config(InstanceConfig {
        runtime_dir: Some(dir.to_owned()),
        logical_processors: Some(vec![0, 1]),
        description: InstanceDescription { kind: "test".into(), name: "publication".into() },
        ..Default::default()
    })
    .unwrap()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn files(hv: &Hypervisor, dir: &Path) -> (PathBuf, PathBuf) {
    let name = hv.published_name().unwrap();
    let instances = publish::instances_dir(dir);
    (instances.join(name.arena_file()), instances.join(name.global_file()))
}

#[test]
fn a_reader_sees_the_writers_counters_change_through_the_same_pages() {
    let tmp = TempDir::new("round-trip");
    let hv = published(&tmp.0);
    let part = hv.create_partition(2).unwrap();
    part.set_ram_pages(64);

    let mut found = attach::discover(&tmp.0).unwrap();
    assert!(found.problems.is_empty(), "{:?}", found.problems);
    assert_eq!(found.instances.len(), 1);
    let instance = found.instances.remove(0);
    assert_eq!(instance.pid(), u64::from(std::process::id()));
    assert!(instance.is_mapped() && instance.is_live());
    assert_eq!(instance.description().kind, "test");
    assert_eq!(instance.description().name, "publication");
    assert_eq!(instance.partitions().len(), 1);
    assert_eq!(instance.partitions()[0].id, part.id());
    assert_eq!(instance.partitions()[0].vp_indices(), &[0, 1]);
    assert_eq!(instance.logical_processors().len(), 2);

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
    // The long-lived read path copies the same bytes.
    let v = reader.instance().read(StatsObject::Vp(part.id(), 1)).unwrap();
    assert_eq!(v.data[vp::CPUID_INSTRUCTIONS.slot()], 1_000_000);
}

#[test]
fn pages_are_owner_only_by_default_and_a_named_group_may_read_partition_pages() {
    let tmp = TempDir::new("modes");
    // SAFETY: umask only changes this process's file creation mask; modes must not depend on it.
    let old = unsafe { libc::umask(0) };
    let hv = published(&tmp.0);
    let grouped = Hypervisor::with_config(InstanceConfig {
        runtime_dir: Some(tmp.0.clone()),
        logical_processors: Some(vec![0]),
        page_access: PageAccess { group: Some(65534) },
        ..Default::default()
    })
    .unwrap();
    // SAFETY: restores the mask.
    unsafe { libc::umask(old) };
    let (arena, global) = files(&hv, &tmp.0);
    assert_eq!(mode(&arena), 0o600);
    assert_eq!(mode(&global), 0o600);
    assert_eq!(mode(&publish::instances_dir(&tmp.0)), 0o755);
    let (arena, global) = files(&grouped, &tmp.0);
    assert_eq!(mode(&arena), 0o640);
    assert_eq!(std::fs::metadata(&arena).unwrap().gid(), 65534);
    assert_eq!(mode(&global), 0o600, "global pages stay the owner's");
}

#[test]
fn the_index_follows_partitions_their_names_and_states_and_the_owner_removes_its_files() {
    let tmp = TempDir::new("index");
    let hv = published(&tmp.0);
    let (arena, global) = files(&hv, &tmp.0);
    let a = hv.create_partition_named(1, "web-1").unwrap();
    let b = hv.create_partition(3).unwrap();
    let mut attach = Attach::new(&tmp.0);
    let changes = attach.refresh().unwrap();
    assert_eq!(changes.added, vec![hv.published_name().unwrap()]);
    let ids = |attach: &Attach| {
        attach.instances().next().unwrap().partitions().iter().map(|p| p.id).collect::<Vec<_>>()
    };
    assert_eq!(ids(&attach), vec![a.id(), b.id()]);
    assert_eq!(attach.instances().next().unwrap().partitions()[0].name, "web-1");

    // Nothing changed: the refresh notices it with a load, and reports no layout change.
    assert!(attach.refresh().unwrap().layout_changed.is_empty());
    b.stop("VP 2 faulted: triple fault");
    let changes = attach.refresh().unwrap();
    assert_eq!(changes.layout_changed.len(), 1);
    let instance = attach.instances().next().unwrap();
    let pb = instance.partition(b.id()).unwrap();
    assert_eq!(pb.state, ObjectState::Stopped { reason: "VP 2 faulted: triple fault".into() });

    // A stopped partition: guests and map requests are refused, but the root keeps reading it.
    b.vp_page(2).unwrap().set(vp::HYPERCALLS, 31);
    let mut reader = RootReader::new(attach::discover(&tmp.0).unwrap().instances.remove(0));
    let b_vp = StatsObjectIdentity::vp(b.id(), 2, StatsAreaType::PARENT);
    let refused = reader.map_stats_page(StatsObjectType::VP, b_vp).map(|_| ()).unwrap_err();
    assert!(matches!(refused, AttachError::Refused(HvError::INVALID_PARTITION_STATE)), "{refused:?}");
    assert_eq!(reader.read(StatsObject::Vp(b.id(), 2)).unwrap().data[vp::HYPERCALLS.slot()], 31);
    let snap = reader.instance_mut().snapshot();
    let sb = snap.partitions.iter().find(|p| p.id == b.id()).unwrap();
    assert_eq!(sb.stopped.as_deref(), Some("VP 2 faulted: triple fault"));
    assert_eq!(sb.vps[2].reading.get("Hypercalls/sec"), Some(31));

    hv.remove_partition(a.id());
    attach.refresh().unwrap();
    assert_eq!(ids(&attach), vec![b.id()]);
    let instance = attach.instances().next().unwrap();
    assert!(matches!(
        instance.read(StatsObject::Partition(a.id())),
        Err(AttachError::NotFound(StatsObject::Partition(_)))
    ));

    drop((a, b));
    drop(hv);
    assert!(!arena.exists() && !global.exists());
    let changes = attach.refresh().unwrap();
    assert_eq!(changes.removed.len(), 1);
    assert_eq!(attach.instances().count(), 0);
}

#[test]
fn counters_declared_unavailable_read_as_unknown_never_zero() {
    let tmp = TempDir::new("unavailable");
    let hv = published(&tmp.0);
    let p = hv.create_partition(1).unwrap();
    p.set_unavailable(&[vp::HYPERCALLS, partition::GPA_PAGES]);
    let mut attach = Attach::new(&tmp.0);
    attach.refresh().unwrap();
    let snap = attach.instances_mut().next().unwrap().snapshot();
    let part = &snap.partitions[0];
    assert_eq!(part.reading.get("GPA pages"), None);
    assert_eq!(part.vps[0].reading.get("Hypercalls/sec"), None);
    assert_eq!(part.vps[0].reading.get("CPUID instructions/sec"), Some(0));
    let info = attach.instances().next().unwrap().partitions()[0].clone();
    assert!(info.is_unavailable(ObjectKind::Vp, vp::HYPERCALLS.slot()));
    assert!(!info.is_unavailable(ObjectKind::Vp, vp::CPUID_INSTRUCTIONS.slot()));
}

#[test]
fn a_partition_created_declared_is_never_seen_with_its_unavailable_counters_as_zero() {
    let tmp = TempDir::new("declared");
    let hv = published(&tmp.0);
    let p = hv
        .create_partition_declared(Some(7), &[0, 2], "declared", &[vp::HYPERCALLS, partition::GPA_PAGES])
        .unwrap();
    // The first reader to find it sees the declaration, with nothing set after creation.
    let mut attach = Attach::new(&tmp.0);
    attach.refresh().unwrap();
    let snap = attach.instances_mut().next().unwrap().snapshot();
    let part = &snap.partitions[0];
    assert_eq!((part.id, part.name.as_str()), (7, "declared"));
    assert_eq!(part.reading.get("GPA pages"), None);
    assert_eq!(part.vps[1].reading.get("Hypercalls/sec"), None);
    assert_eq!(part.vps[1].reading.get("CPUID instructions/sec"), Some(0));
    assert!(hv.create_partition_declared(None, &[1, 0], "", &[]).is_err(), "VP indices must ascend");
    drop(p);
}

#[test]
fn a_vms_uuid_and_its_unavailable_counters_share_the_entry_without_touching_each_other() {
    let tmp = TempDir::new("uuid");
    let hv = published(&tmp.0);
    // A UUID is an observed VM's: a partition published for another VMM, which declares its own
    // gaps (our own partitions always lack the observed-only counters).
    let p = hv.create_partition_declared(None, &[0], "", &[]).unwrap();
    let uuid = hvstats::vmm::VmUuid::parse("ffffffff-ffff-ffff-ffff-ffffffffffff").unwrap();
    p.set_uuid(uuid);
    // Every partition counter unavailable, then none: the UUID stays as it was.
    let every: Vec<_> = hvstats_abi::catalog::counters_of(ObjectKind::Partition).map(|c| c.id).collect();
    for declared in [every.clone(), Vec::new()] {
        p.set_unavailable(&declared);
        let mut attach = Attach::new(&tmp.0);
        attach.refresh().unwrap();
        let info = attach.instances().next().unwrap().partitions()[0].clone();
        assert_eq!(info.uuid, Some(uuid));
        // And the UUID's all-ones words read as no counter's bit.
        for c in hvstats_abi::catalog::counters_of(ObjectKind::Partition) {
            assert_eq!(
                info.is_unavailable(ObjectKind::Partition, c.id.slot()),
                !declared.is_empty(),
                "{}",
                c.name
            );
        }
        let snap = attach.instances_mut().next().unwrap().snapshot();
        assert_eq!(
            snap.partitions[0].uuid.map(|u| u.to_string()).as_deref(),
            Some("ffffffff-ffff-ffff-ffff-ffffffffffff")
        );
    }
    // A partition given none has none.
    let q = hv.create_partition(1).unwrap();
    let mut attach = Attach::new(&tmp.0);
    attach.refresh().unwrap();
    let infos = attach.instances().next().unwrap().partitions().to_vec();
    assert_eq!(infos.iter().find(|i| i.id == q.id()).unwrap().uuid, None);
}

#[test]
fn a_vms_hyperv_enlightenments_and_its_unavailable_vp_counters_share_the_entry_without_touching_each_other() {
    let tmp = TempDir::new("hyperv");
    let hv = published(&tmp.0);
    let p = hv.create_partition_declared(None, &[0], "", &[]).unwrap();
    let word = u64::MAX;
    p.set_hyperv_enlightenments(word);
    let every: Vec<_> = hvstats_abi::catalog::counters_of(ObjectKind::Vp).map(|c| c.id).collect();
    for declared in [every.clone(), Vec::new()] {
        p.set_unavailable(&declared);
        let mut attach = Attach::new(&tmp.0);
        attach.refresh().unwrap();
        let info = attach.instances().next().unwrap().partitions()[0].clone();
        assert_eq!(info.hyperv_enlightenments, word);
        // The all-ones word reads as no VP counter's bit.
        for c in hvstats_abi::catalog::counters_of(ObjectKind::Vp) {
            assert_eq!(info.is_unavailable(ObjectKind::Vp, c.id.slot()), !declared.is_empty(), "{}", c.name);
        }
        let snap = attach.instances_mut().next().unwrap().snapshot();
        assert_eq!(snap.partitions[0].hyperv_enlightenments, word);
    }
    // A partition given none has none known.
    let q = hv.create_partition(1).unwrap();
    let mut attach = Attach::new(&tmp.0);
    attach.refresh().unwrap();
    let infos = attach.instances().next().unwrap().partitions().to_vec();
    assert_eq!(infos.iter().find(|i| i.id == q.id()).unwrap().hyperv_enlightenments, 0);
}

#[test]
fn every_counter_can_be_declared_unavailable_the_last_histograms_of_the_vp_page_too() {
    // The halt-poll histograms start past page slot 256, where a bitmap of slots ran out: they
    // were published as available zeros.
    let tmp = TempDir::new("unavailable-histograms");
    let hv = published(&tmp.0);
    let p = hv.create_partition(1).unwrap();
    let last = [vp::HALT_POLL_SUCCESS_HISTOGRAM, vp::HALT_POLL_FAIL_HISTOGRAM];
    assert!(last.iter().all(|c| c.slot() > 256));
    p.set_unavailable(&last);
    let mut attach = Attach::new(&tmp.0);
    attach.refresh().unwrap();
    let snap = attach.instances_mut().next().unwrap().snapshot();
    let names: Vec<&str> = snap.partitions[0].vps[0].histograms.iter().map(|(c, _)| c.name).collect();
    assert!(names.contains(&"Halt wait histogram"), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("Halt poll")), "{names:?}");
    let every: Vec<_> = hvstats_abi::CATALOG.iter().filter(|c| c.id.kind != ObjectKind::Hypervisor).collect();
    assert!(every.iter().all(|c| hvstats::index::unavailable_bit(c.id.kind, c.id.slot()).is_some()));
}

#[test]
fn an_attached_root_follows_the_map_rules() {
    let tmp = TempDir::new("root-rules");
    let hv = published(&tmp.0);
    let part = hv.create_partition(2).unwrap();
    let mut reader = RootReader::new(attach::discover(&tmp.0).unwrap().instances.remove(0));
    let status = |r: Result<(), AttachError>| match r {
        Ok(()) => HvStatus::SUCCESS,
        Err(AttachError::Refused(e)) => e.status(),
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

/// Run as a child process by the tests below: publishes an instance, says where, and waits.
#[test]
#[ignore = "a child process of the liveness tests"]
fn child_publisher() {
    let Some(dir) = std::env::var_os("HVSTATS_TEST_PUBLISH_DIR") else { return };
    let hv = published(Path::new(&dir));
    let part = hv.create_partition(1).unwrap();
    let value = std::env::var("HVSTATS_TEST_VALUE").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    part.vp_page(0).unwrap().set(vp::HYPERCALLS, value);
    println!("\npublished-at={}", hv.published_path().unwrap().display());
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

fn spawn_publisher(dir: &Path, value: u64, wrapper: &[&str]) -> (KillOnDrop, PathBuf) {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match wrapper.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    let mut child = cmd
        .args(["--exact", "child_publisher", "--ignored", "--nocapture", "--test-threads=1"])
        .env("HVSTATS_TEST_PUBLISH_DIR", dir)
        .env("HVSTATS_TEST_VALUE", value.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let child = KillOnDrop(child);
    let path = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|line| line.split_once("published-at=").map(|(_, p)| PathBuf::from(p)))
        .expect("the child publishes");
    (child, path)
}

fn vp0_hypercalls(attach: &Attach) -> Vec<u64> {
    attach
        .instances()
        .map(|i| {
            let p = &i.partitions()[0];
            i.read(StatsObject::Vp(p.id, 0)).unwrap().data[vp::HYPERCALLS.slot()]
        })
        .collect()
}

#[test]
fn a_killed_publisher_is_found_dead_and_a_reader_follows_its_restart() {
    let tmp = TempDir::new("killed");
    let (mut child, path) = spawn_publisher(&tmp.0, 5, &[]);
    assert!(path.exists());
    let mut attach = Attach::new(&tmp.0);
    attach.refresh().unwrap();
    assert_eq!(vp0_hypercalls(&attach), vec![5]);
    // A reader may also keep an instance on its own, past its owner's death.
    let kept = attach::discover(&tmp.0).unwrap().instances.remove(0);
    let kept_vp = StatsObject::Vp(kept.partitions()[0].id, 0);

    // SIGKILL: the child cannot clean up; its lock goes with it, even before it is reaped.
    child.0.kill().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let changes = loop {
        let changes = attach.refresh().unwrap();
        if !changes.removed.is_empty() || std::time::Instant::now() > deadline {
            break changes;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert_eq!(changes.removed.len(), 1, "a dead instance is never shown as live");
    assert!(changes.removed_dead.contains(&path), "{:?}", changes.removed_dead);
    assert!(!path.exists());
    assert_eq!(attach.instances().count(), 0);
    child.0.wait().unwrap();
    // The kept mapping still reads the final values, and says its owner is gone.
    assert!(!kept.is_live());
    assert_eq!(kept.read(kept_vp).unwrap().data[vp::HYPERCALLS.slot()], 5);

    // The same reader, kept, finds the publisher's next life.
    let (_child, path) = spawn_publisher(&tmp.0, 6, &[]);
    let changes = attach.refresh().unwrap();
    assert_eq!(changes.added.len(), 1);
    assert_eq!(vp0_hypercalls(&attach), vec![6]);
    assert!(path.exists());
}

#[test]
fn a_publisher_in_another_pid_namespace_is_not_taken_for_dead() {
    let unshare = Path::new("/usr/bin/unshare");
    // Creating a PID namespace needs CAP_SYS_ADMIN.
    let can = unshare.exists()
        && Command::new(unshare).args(["--pid", "--fork", "true"]).status().is_ok_and(|s| s.success());
    if !can {
        eprintln!("skipped: `unshare --pid --fork` is not available here");
        return;
    }
    let tmp = TempDir::new("pidns");
    let (_child, path) = spawn_publisher(&tmp.0, 9, &["/usr/bin/unshare", "--pid", "--fork"]);
    let name = InstanceName::parse(
        path.file_name().unwrap().to_str().unwrap().strip_suffix(publish::ARENA_SUFFIX).unwrap(),
    )
    .unwrap();
    // Its pid is its namespace's (1, or close): meaningless here. The lock says it lives.
    assert!(name.pid < 10, "{name}");
    for _ in 0..3 {
        let mut attach = Attach::new(&tmp.0);
        let changes = attach.refresh().unwrap();
        assert!(changes.removed_dead.is_empty(), "{:?}", changes.removed_dead);
        assert_eq!(vp0_hypercalls(&attach), vec![9]);
    }
    assert!(path.exists());
}

#[test]
fn a_new_publisher_removes_dead_files_and_leaves_others_alone() {
    let tmp = TempDir::new("stale");
    let instances = publish::instances_dir(&tmp.0);
    std::fs::create_dir_all(&instances).unwrap();
    std::fs::set_permissions(&instances, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Files nobody holds a lock on: dead.
    let dead = instances.join("1-1-0.arena");
    let staging = instances.join(".1-1-1.global.tmp");
    for f in [&dead, &staging] {
        std::fs::write(f, b"junk").unwrap();
    }
    // A temporary file is its maker's for a minute (created, then locked); this one is older.
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(120);
    std::fs::File::options().write(true).open(&staging).unwrap().set_modified(old).unwrap();
    let fresh = instances.join(".1-1-2.arena.tmp");
    std::fs::write(&fresh, b"being made").unwrap();
    let unrelated = instances.join("notes");
    std::fs::write(&unrelated, b"keep").unwrap();
    let hv = published(&tmp.0);
    assert!(!dead.exists());
    assert!(!staging.exists());
    assert!(unrelated.exists(), "only instance files are touched");
    assert!(fresh.exists(), "a file being made is left to its maker");
    assert_eq!(attach::discover(&tmp.0).unwrap().instances.len(), 1);
    drop(hv);
}

#[test]
fn no_runtime_directory_means_no_instances() {
    let tmp = TempDir::new("empty");
    let found = attach::discover(&tmp.0.join("missing")).unwrap();
    assert!(found.instances.is_empty() && found.problems.is_empty());
}

#[test]
fn our_partitions_keep_their_run_state_and_observed_ones_say_theirs() {
    use hvstats_abi::vm_state::VmState;
    let tmp = TempDir::new("own-state");
    let hv = published(&tmp.0);
    let own = hv.create_partition(1).unwrap();
    let other = hv.create_partition_declared(None, &[0], "observed", &[]).unwrap();
    own.set_unavailable(&[vp::HYPERCALLS]);
    let read = || {
        let mut attach = Attach::new(&tmp.0);
        attach.refresh().unwrap();
        attach.instances_mut().next().unwrap().snapshot()
    };
    let snap = read();
    let of = |id: u64| snap.partitions.iter().find(|p| p.id == id).unwrap().reading.clone();
    assert_eq!(of(own.id()).get("VM state"), Some(VmState::Running.code()));
    // What the catalog maintains for no partition of ours stays declared through a later
    // declaration: absent, never a 0; what it maintains is there.
    let vp0 = |id: u64| snap.partitions.iter().find(|p| p.id == id).unwrap().vps[0].reading.clone();
    assert_eq!(vp0(own.id()).get("Synthetic interrupts/sec"), None);
    assert_eq!(vp0(own.id()).get("Local flushed GVA ranges/sec"), None);
    assert_eq!(vp0(own.id()).get("Hypercalls/sec"), None);
    assert_eq!(vp0(own.id()).get("CPUID instructions/sec"), Some(0));
    // A partition published for another VMM declares its own.
    assert_eq!(vp0(other.id()).get("Synthetic interrupts/sec"), Some(0));
    // A partition published for another VMM is what its publisher writes and declares.
    assert_eq!(of(other.id()).get("VM state"), Some(VmState::Unknown.code()));
    own.stop("done");
    let snap = read();
    let state = snap.partitions.iter().find(|p| p.id == own.id()).unwrap().reading.get("VM state");
    assert_eq!(state, Some(VmState::Shutdown.code()));
    // The observer's health is on an observer's hypervisor page only.
    assert_eq!(snap.hypervisor.get("Observer up"), None);
    assert!(snap.hypervisor.get("Partitions").is_some());
}

#[test]
fn an_observers_hypervisor_page_carries_its_health_and_keeps_it_through_declarations() {
    let tmp = TempDir::new("observer-health");
    let description = hvstats::index::InstanceDescription {
        kind: hvstats::index::OBSERVER_KIND.to_owned(),
        name: "test observer".to_owned(),
    };
    let config = hvstats::InstanceConfig {
        runtime_dir: Some(tmp.0.clone()),
        logical_processors: Some(vec![0]),
        description,
        ..Default::default()
    };
    let observer = hvstats::Hypervisor::with_config(config).unwrap();
    observer.page().set(hvstats_abi::catalog::hypervisor::OBSERVER_VMS_ATTACHED, 3);
    let plain = published(&tmp.0);
    // A declaration on the other instance's hypervisor page keeps the observer rows absent.
    plain.set_global_unavailable(None, &[hvstats_abi::catalog::hypervisor::MONITORED_NOTIFICATIONS]);
    let mut attach = Attach::new(&tmp.0);
    attach.refresh().unwrap();
    for instance in attach.instances_mut() {
        let snap = instance.snapshot();
        let attached = snap.hypervisor.get("Observer VMs attached");
        match snap.description.kind.as_str() {
            hvstats::index::OBSERVER_KIND => assert_eq!(attached, Some(3)),
            _ => {
                assert_eq!(attached, None);
                assert_eq!(snap.hypervisor.get("Monitored notifications"), None);
            }
        }
    }
}
