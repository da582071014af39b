//! Readings of every live instance, for the operator surfaces (`top`, `serve`, `record`).
//!
//! Each surface asks this one module for "every instance now" and gets snapshots; how they are
//! read stays here: one long-lived [`Attach`] that follows instances appearing and exiting and
//! keeps each instance's arena mapped between readings.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use hvstats::attach::{Attach, AttachError, Instance};
use hvstats::error_chain;
use hvstats::index::OBSERVER_KIND;
use hvstats::publish::InstanceName;
use hvstats::rules::StatsObject;
use hvstats::runtime_dir::RuntimeDirError;
use hvstats::snapshot::{InstanceSnapshot, PartitionSnapshot};
use hvstats_platform::shown::{Shown, decode};

/// Every live instance at one moment.
#[derive(Clone, Debug)]
pub struct Reading {
    /// When the reading was taken (after every page was read).
    pub at: Instant,
    /// The instances, in name order.
    pub instances: Vec<InstanceSnapshot>,
    /// What could not be read, one line each.
    pub problems: Vec<String>,
    /// The instances found in the runtime directory that could not be attached, by name.
    pub failed: Vec<String>,
    /// Observers (of other processes' VMs) this reader saw die, by instance name: their
    /// publisher let go of its instance without removing it. Kept until another observer
    /// publishes, so an observer that died is reported down rather than gone. While no observer
    /// publishes, also the one whose mark is left in the runtime directory
    /// ([`hvstats::observer_mark`]), or, when an observer is expected and none left a mark, an
    /// empty name (an observer down, name unknown).
    pub dead_observers: Vec<String>,
    /// The platform identities observers wrote of their VMs ([`hvstats::platform_file`]), by
    /// instance name, then partition id.
    pub platforms: BTreeMap<String, BTreeMap<u64, Shown>>,
}

impl Reading {
    /// A reading of `instances` taken now, with nothing that failed.
    pub fn of(instances: Vec<InstanceSnapshot>) -> Self {
        Self {
            at: Instant::now(),
            instances,
            problems: Vec::new(),
            failed: Vec::new(),
            dead_observers: Vec::new(),
            platforms: BTreeMap::new(),
        }
    }

    /// The platform identity of partition `id` of instance `instance`, when its observer wrote one.
    pub fn platform(&self, instance: &str, id: u64) -> Option<&Shown> {
        self.platforms.get(instance)?.get(&id)
    }

    /// The instance named `name`, if present.
    pub fn instance(&self, name: &str) -> Option<&InstanceSnapshot> {
        self.instances.iter().find(|i| i.name == name)
    }

    /// The partition `id` of instance `instance`, if present.
    pub fn partition(&self, instance: &str, id: u64) -> Option<&PartitionSnapshot> {
        self.instances.iter().find(|i| i.name == instance)?.partitions.iter().find(|p| p.id == id)
    }

    /// The number of VPs over every instance.
    pub fn vp_count(&self) -> usize {
        self.instances.iter().flat_map(|i| &i.partitions).map(|p| p.vps.len()).sum()
    }
}

/// The instance an attach problem is about, when it names one of its files.
fn instance_of(problem: &AttachError) -> Option<String> {
    let path = match problem {
        AttachError::Dir(RuntimeDirError::Io { path, .. })
        | AttachError::Arena { path, .. }
        | AttachError::Page { path, .. }
        | AttachError::Untrusted { path, .. } => path,
        _ => return None,
    };
    let stem = path.file_stem()?.to_str()?;
    InstanceName::parse(stem).map(|name| name.to_string())
}

/// What `/healthz` says: the verdict, what was found, and each problem on a line of its own.
pub fn health_text(healthy: bool, instances: usize, vps: usize, problems: &[String]) -> String {
    let verdict = if healthy { "ok" } else { "unhealthy: nothing could be read" };
    let mut out = format!("{verdict}: {instances} instances, {vps} VPs\n");
    for problem in problems {
        out.push_str("problem: ");
        out.push_str(problem);
        out.push('\n');
    }
    out
}

/// The reader of the runtime directory the surfaces show.
#[derive(Debug)]
pub struct Live {
    dir: PathBuf,
    attach: Mutex<Attach>,
    /// See [`Reading::dead_observers`].
    dead_observers: Mutex<BTreeSet<String>>,
    /// The health check's own attach, so a check never waits behind a whole reading.
    health: Mutex<Attach>,
    /// An observer is expected to publish here (see [`Live::expecting_observer`]).
    expect_observer: bool,
}

impl Live {
    /// A reader of the instances under `dir` (or the default runtime directory).
    pub fn new(dir: Option<PathBuf>) -> Self {
        let dir = dir.unwrap_or_else(hvstats::runtime_dir::runtime_dir);
        let attach = Mutex::new(Attach::new(&dir));
        let health = Mutex::new(Attach::new(&dir));
        Self { dir, attach, dead_observers: Mutex::new(BTreeSet::new()), health, expect_observer: false }
    }

    /// This reader, told that an observer is expected to publish under its directory: while none
    /// does and none left its mark, readings report one down under no name.
    #[must_use]
    pub fn expecting_observer(mut self, expected: bool) -> Self {
        self.expect_observer = expected;
        self
    }

    /// The runtime directory read: the one given, else the default.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reads every live instance now. Instances that appeared since the last reading are
    /// included, those that exited are not.
    ///
    /// # Errors
    /// When the runtime directory fails its checks or cannot be listed.
    pub fn read(&self) -> Result<Reading, AttachError> {
        // A reader that panicked mid-read left nothing half-done that matters: keep reading.
        let mut attach = self.attach.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let changes = self.refresh(&mut attach)?;
        let mut dead_observers: Vec<String> = self
            .dead_observers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .iter()
            .cloned()
            .collect();
        let mut problems: Vec<String> = changes.problems.iter().map(|p| error_chain(p)).collect();
        // No observer publishes, and none seen to die: the one that left its mark is down.
        if dead_observers.is_empty() && !attach.instances().any(|i| i.description().kind == OBSERVER_KIND) {
            match hvstats::observer_mark::read(&self.dir) {
                Ok(Some(name)) => dead_observers.push(name.to_string()),
                Ok(None) if self.expect_observer => dead_observers.push(String::new()),
                Ok(None) => {}
                Err(e) => {
                    problems.push(format!("the observer's mark: {}", error_chain(&e)));
                    if self.expect_observer {
                        dead_observers.push(String::new());
                    }
                }
            }
        }
        let mut failed: Vec<String> = changes.problems.iter().filter_map(instance_of).collect();
        failed.sort();
        failed.dedup();
        let instances: Vec<InstanceSnapshot> = attach.instances_mut().map(Instance::snapshot).collect();
        let platforms = read_platforms(&self.dir, &instances, &mut problems);
        Ok(Reading { at: Instant::now(), instances, problems, failed, dead_observers, platforms })
    }

    /// Whether something could be read now, and the text saying so ([`health_text`]), as
    /// `crate::exposition::health` says it of a whole reading, without reading every page: the
    /// runtime directory and each instance's index are read as for a reading, but of the pages
    /// only each instance's global ones, and where those cannot be read, its partitions' pages
    /// until one can. A host of many VPs is checked in the time of a few pages.
    pub fn health(&self) -> (bool, String) {
        let mut attach = self.health.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let changes = match self.refresh(&mut attach) {
            Ok(changes) => changes,
            Err(e) => return (false, health_text(false, 0, 0, &self.unreadable(&e).problems)),
        };
        let mut problems: Vec<String> = changes.problems.iter().map(|p| error_chain(p)).collect();
        let (mut instances, mut vps, mut readable) = (0, 0, false);
        let mut page = [0u64; hvstats_abi::page::PAGE_SLOTS];
        for instance in attach.instances_mut() {
            instance.refresh();
            instances += 1;
            vps += instance.partitions().iter().map(|p| p.vp_indices().len()).sum::<usize>();
            if readable {
                continue;
            }
            let global = match instance.global_unreadable() {
                Some((reason, _)) => Err(reason.to_owned()),
                None => instance.read_into(StatsObject::Hypervisor, &mut page).map_err(|e| error_chain(&e)),
            };
            readable = global.is_ok()
                || instance
                    .partitions()
                    .iter()
                    .any(|p| instance.read_into(StatsObject::Partition(p.id), &mut page).is_ok());
            if let (false, Err(reason)) = (readable, global) {
                problems.push(format!("{}: {reason}", instance.name()));
            }
        }
        let healthy = readable || problems.is_empty();
        (healthy, health_text(healthy, instances, vps, &problems))
    }

    /// Refreshes `attach` (the reading's or the health check's: either may be the first to see
    /// an instance die, and remove its files), noting the observers that died and forgetting
    /// them once another observer publishes.
    fn refresh(&self, attach: &mut Attach) -> Result<hvstats::attach::Changes, AttachError> {
        let is_observer = |i: &Instance| i.description().kind == OBSERVER_KIND;
        let observers: BTreeSet<InstanceName> =
            attach.instances().filter(|i| is_observer(i)).map(Instance::name).collect();
        let changes = attach.refresh()?;
        let mut dead = self.dead_observers.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if changes.added.iter().any(|n| attach.instance(*n).is_some_and(is_observer)) {
            dead.clear();
        }
        dead.extend(changes.died.iter().filter(|n| observers.contains(n)).map(InstanceName::to_string));
        Ok(changes)
    }

    /// A reading of nothing, saying why: the runtime directory itself could not be read.
    pub fn unreadable(&self, error: &AttachError) -> Reading {
        let problem = format!("cannot read {}: {}", self.dir.display(), error_chain(error));
        Reading {
            at: Instant::now(),
            instances: Vec::new(),
            problems: vec![problem],
            failed: Vec::new(),
            dead_observers: Vec::new(),
            platforms: BTreeMap::new(),
        }
    }

    /// A partition's name for people and labels: its own name, or `<instance>:<id>` when it has
    /// none.
    pub fn vm_name(instance: &str, partition: &PartitionSnapshot) -> String {
        if partition.name.is_empty() {
            format!("{instance}:{}", partition.id)
        } else {
            partition.name.clone()
        }
    }
}

/// The platform identities each observer among `instances` wrote beside its instance in `dir`;
/// a file that cannot be read or believed is a problem, and its VMs have none.
pub fn read_platforms(
    dir: &Path,
    instances: &[InstanceSnapshot],
    problems: &mut Vec<String>,
) -> BTreeMap<String, BTreeMap<u64, Shown>> {
    let mut platforms = BTreeMap::new();
    for instance in instances.iter().filter(|i| i.description.kind == OBSERVER_KIND) {
        let Some(name) = InstanceName::parse(&instance.name) else { continue };
        match platforms_of(dir, &name) {
            Ok(Some(vms)) => {
                platforms.insert(instance.name.clone(), vms);
            }
            Ok(None) => {}
            Err(problem) => problems.push(problem),
        }
    }
    platforms
}

/// The platform identities observer `name` wrote beside its instance in `dir`, by partition id
/// (`None` when it wrote none).
///
/// # Errors
/// When its file cannot be read or believed: the problem, said for a person.
pub fn platforms_of(dir: &Path, name: &InstanceName) -> Result<Option<BTreeMap<u64, Shown>>, String> {
    match hvstats::platform_file::read(dir, name) {
        Ok(text) => Ok(text.map(|t| decode(&t))),
        Err(e) => Err(format!("the platform identities of {name}: {}", error_chain(&e))),
    }
}
