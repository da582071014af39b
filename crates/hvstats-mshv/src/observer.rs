//! Observing the Microsoft Hypervisor where Linux is its root partition (`mshv_root`): its
//! debugfs tree ([`crate::tree`]) published as an instance whose hypervisor, LP, partition
//! and VP pages carry the hypervisor's own counters under the catalog's names, refreshed on every
//! [`MshvObserver::tick`].
//!
//! Partitions keep the hypervisor's ids (`self`, an L1VH's own partition, is
//! [`SELF_PARTITION_ID`]) and VPs its VP indices; they appear and vanish as their directories do.
//! Values are written by name through [`crate::names`], whichever kernel printed the tree; a
//! catalog counter no name gives is declared unavailable (readers show it as absent, never 0), and
//! names the catalog has no counter for are published beside the pages ([`hvstats::unmapped`]),
//! up to that file's cap. The tree is only ever read.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hvstats::index::InstanceDescription;
use hvstats::unmapped::{self, ObjectRef};
use hvstats::{Hypervisor, InstanceConfig, PartitionStats, SharedPage};
use hvstats_abi::{CounterId, ObjectKind};

use crate::dialect::Dialect;
use crate::names::{self, MAPPINGS, mapping};
use crate::stats_file::StatsFile;
use crate::tree::{self, PartitionKey, PartitionTree, SELF_PARTITION_ID, Tree, TreeError};

/// The most distinct problems, and the most distinct unmapped names, remembered (each is logged
/// once).
const MAX_REMEMBERED: usize = 4096;

/// The instance description of an mshv observer (`kind` "mshv").
pub fn description(root: &Path) -> InstanceDescription {
    InstanceDescription {
        kind: hvstats::index::MSHV_KIND.to_owned(),
        name: format!("hvstats observe --mshv {}", root.display()),
    }
}

/// The configuration of the instance to publish `tree` in: one LP object per `lp/<n>` directory
/// (a hypervisor reads its LP count once, at start), described as an mshv observer.
pub fn instance_config(root: &Path, tree: &Tree, runtime_dir: Option<PathBuf>) -> InstanceConfig {
    InstanceConfig {
        runtime_dir,
        logical_processors: Some(tree.lps.keys().copied().collect()),
        description: description(root),
        ..Default::default()
    }
}

/// Something that happened in one [`MshvObserver::tick`], for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MshvEvent {
    /// The tree is printed in this dialect (said when first known, and when it changes).
    Format(Dialect),
    /// A partition is published.
    Appeared {
        /// Its directory name.
        key: PartitionKey,
        /// Its VP indices.
        vps: Vec<u32>,
    },
    /// A partition's VPs changed; it is published again with these.
    VpsChanged {
        /// Its directory name.
        key: PartitionKey,
        /// Its VP indices now.
        vps: Vec<u32>,
    },
    /// A partition's directory is gone; so is its partition.
    Vanished {
        /// Its directory name.
        key: PartitionKey,
    },
    /// A name no table maps was seen for the first time (it is published as unmapped).
    Unmapped {
        /// The kind of file it was printed in.
        kind: ObjectKind,
        /// The name (canonical: [`names::canonical`]).
        name: String,
    },
    /// Something in the tree was skipped (logged once).
    Problem(String),
    /// The tree could not be read at all this time.
    Unreadable(String),
    /// A partition could not be published, or the unmapped values could not.
    Failed(String),
}

struct Published {
    vps: Vec<u32>,
    stats: Arc<PartitionStats>,
    unavailable: Vec<CounterId>,
}

/// Publishes the mshv tree under `root` into an instance, one refresh per tick.
pub struct MshvObserver {
    hv: Arc<Hypervisor>,
    root: PathBuf,
    partitions: BTreeMap<PartitionKey, Published>,
    dialect: Option<Dialect>,
    /// Problems and failures already logged.
    seen: BTreeSet<String>,
    /// Unmapped names already logged, by kind.
    named: HashMap<ObjectKind, HashSet<String>>,
    /// What was last declared unavailable for the hypervisor (`None`) and each LP.
    global_unavailable: BTreeMap<Option<u32>, Vec<CounterId>>,
}

impl std::fmt::Debug for MshvObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MshvObserver")
            .field("root", &self.root)
            .field("partitions", &self.partitions.len())
            .finish()
    }
}

impl MshvObserver {
    /// An observer of the tree under `root`, publishing into `hv` (made with [`instance_config`]).
    pub fn new(hv: Arc<Hypervisor>, root: PathBuf) -> Self {
        Self {
            hv,
            root,
            partitions: BTreeMap::new(),
            dialect: None,
            seen: BTreeSet::new(),
            named: HashMap::new(),
            global_unavailable: BTreeMap::new(),
        }
    }

    /// The tree's root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The partitions published now, with their VP indices.
    pub fn partitions(&self) -> impl Iterator<Item = (PartitionKey, &[u32])> {
        self.partitions.iter().map(|(k, p)| (*k, p.vps.as_slice()))
    }

    /// Reads the tree once and publishes what it holds.
    pub fn tick(&mut self) -> Vec<MshvEvent> {
        let mut events = Vec::new();
        match tree::read(&self.root) {
            Ok(tree) => events = self.apply(&tree),
            Err(e) => self.say(&mut events, hvstats::error_chain(&e), MshvEvent::Unreadable),
        }
        events
    }

    /// Publishes `tree`: partitions added, changed and removed, every value written.
    pub fn apply(&mut self, tree: &Tree) -> Vec<MshvEvent> {
        let mut events = Vec::new();
        if let Some(dialect) = tree.dialect().filter(|d| self.dialect != Some(*d)) {
            self.dialect = Some(dialect);
            events.push(MshvEvent::Format(dialect));
        }
        for p in &tree.problems {
            self.say(&mut events, p.to_string(), MshvEvent::Problem);
        }
        self.remove_vanished(tree, &mut events);
        // What the hypervisor's and the LPs' files lack is declared before any partition of this
        // reading appears: a reader that finds the partition never finds those counters as 0.
        self.declare_global(None, ObjectKind::Hypervisor, tree.hypervisor.as_ref());
        let lps: Vec<(u32, u32)> =
            self.hv.logical_processors().iter().map(|lp| (lp.index(), lp.cpu())).collect();
        for &(index, dir) in &lps {
            self.declare_global(Some(index), ObjectKind::LogicalProcessor, tree.lps.get(&dir));
        }
        let mut side = unmapped::Encoder::new();
        for (key, ptree) in &tree.partitions {
            if let Some(stats) = self.publish_partition(*key, ptree, &mut events) {
                self.write_partition(&stats, ptree, &mut side, &mut events);
            }
        }
        // The instance keeps its own counts as partitions come and go: the hypervisor's file,
        // written last, has the final word.
        if let Some(file) = &tree.hypervisor {
            let rest = write(ObjectKind::Hypervisor, self.hv.page(), file);
            self.side(&mut side, ObjectRef::Hypervisor, rest, &mut events);
        }
        let hv = Arc::clone(&self.hv);
        for (index, dir) in lps {
            let file = tree.lps.get(&dir);
            if let (Some(file), Some(lp)) = (file, hv.logical_processors().get(index as usize)) {
                let rest = write(ObjectKind::LogicalProcessor, lp.page(), file);
                self.side(&mut side, ObjectRef::Lp(index), rest, &mut events);
            }
        }
        self.publish_side(side, &mut events);
        events
    }

    /// Removes the partitions whose directories are gone from `tree`.
    fn remove_vanished(&mut self, tree: &Tree, events: &mut Vec<MshvEvent>) {
        let gone: Vec<PartitionKey> =
            self.partitions.keys().filter(|k| !tree.partitions.contains_key(k)).copied().collect();
        for key in gone {
            if let Some(p) = self.partitions.remove(&key) {
                self.hv.remove_partition(p.stats.id());
                events.push(MshvEvent::Vanished { key });
            }
        }
    }

    /// Partition `key` as published for `ptree`: created when new, created again when its VPs
    /// changed, with what its files lack declared; `None` when it cannot be published.
    fn publish_partition(
        &mut self,
        key: PartitionKey,
        ptree: &PartitionTree,
        events: &mut Vec<MshvEvent>,
    ) -> Option<Arc<PartitionStats>> {
        let vps: Vec<u32> = ptree.vps.keys().copied().collect();
        let changed = self.partitions.get(&key).is_some_and(|p| p.vps != vps);
        if changed && let Some(old) = self.partitions.remove(&key) {
            self.hv.remove_partition(old.stats.id());
        }
        let unavailable = unavailable(&ptree.stats, ptree.vps.values());
        if !self.partitions.contains_key(&key) {
            let name = format!("mshv:{key}");
            // Born with what its files lack declared: never shown as 0 in between.
            match self.hv.create_partition_declared(Some(key.id()), &vps, &name, &unavailable) {
                Ok(stats) => {
                    let published = Published { vps: vps.clone(), stats, unavailable: unavailable.clone() };
                    self.partitions.insert(key, published);
                    events.push(match changed {
                        true => MshvEvent::VpsChanged { key, vps },
                        false => MshvEvent::Appeared { key, vps },
                    });
                }
                Err(e) => {
                    self.say(events, format!("cannot publish partition {key}: {e}"), MshvEvent::Failed);
                    return None;
                }
            }
        }
        let published = self.partitions.get_mut(&key)?;
        if unavailable != published.unavailable {
            published.stats.set_unavailable(&unavailable);
            published.unavailable = unavailable;
        }
        Some(Arc::clone(&published.stats))
    }

    /// Writes a published partition's values and its VPs', the names without a counter to `side`.
    fn write_partition(
        &mut self,
        stats: &PartitionStats,
        ptree: &PartitionTree,
        side: &mut unmapped::Encoder,
        events: &mut Vec<MshvEvent>,
    ) {
        let id = stats.id();
        let rest = write(ObjectKind::Partition, stats.page(), &ptree.stats);
        self.side(side, ObjectRef::Partition(id), rest, events);
        for (n, page) in stats.vp_pages() {
            let Some(file) = ptree.vps.get(&n) else { continue };
            let rest = {
                let _merge = page.begin_publication();
                write(ObjectKind::Vp, page, file)
            };
            self.side(side, ObjectRef::Vp(id, n), rest, events);
        }
    }

    /// Publishes the values no catalog counter names beside the pages, up to the file's cap.
    fn publish_side(&mut self, side: unmapped::Encoder, events: &mut Vec<MshvEvent>) {
        let (text, complete) = side.finish();
        if !complete && self.remember("unmapped values past the cap") {
            events.push(MshvEvent::Failed(format!(
                "the unmapped values pass {} bytes: the rest are not published",
                unmapped::MAX_BYTES
            )));
        }
        if let Err(e) = self.hv.publish_unmapped(text.as_bytes()) {
            let text = format!("cannot publish the unmapped values: {}", hvstats::error_chain(&e));
            self.say(events, text, MshvEvent::Failed);
        }
    }

    /// Says `text` as the event `event` makes of it, the first time it is seen.
    fn say(&mut self, events: &mut Vec<MshvEvent>, text: String, event: fn(String) -> MshvEvent) {
        if self.remember(&text) {
            events.push(event(text));
        }
    }

    /// Adds `at`'s unmapped values to the side file, and says which names are new.
    fn side(
        &mut self,
        side: &mut unmapped::Encoder,
        at: ObjectRef,
        values: Vec<(&str, u64)>,
        events: &mut Vec<MshvEvent>,
    ) {
        let kind = kind_of(at);
        for (name, _) in &values {
            let known: usize = self.named.values().map(HashSet::len).sum();
            let named = self.named.entry(kind).or_default();
            if known < MAX_REMEMBERED && !named.contains(*name) {
                named.insert((*name).to_owned());
                events.push(MshvEvent::Unmapped { kind, name: (*name).to_owned() });
            }
        }
        side.object(at, values);
    }

    /// Declares the hypervisor's (`lp` `None`) or an LP's counters its file does not give.
    fn declare_global(&mut self, lp: Option<u32>, kind: ObjectKind, file: Option<&StatsFile>) {
        let given = file.map(|f| given(kind, f)).unwrap_or_default();
        let missing: Vec<CounterId> =
            hvstats_abi::catalog::counters_of(kind).map(|c| c.id).filter(|id| !given.contains(id)).collect();
        if self.global_unavailable.get(&lp) != Some(&missing) {
            self.hv.set_global_unavailable(lp, &missing);
            self.global_unavailable.insert(lp, missing);
        }
    }

    /// True the first time `text` is seen (while fewer than [`MAX_REMEMBERED`] are).
    fn remember(&mut self, text: &str) -> bool {
        self.seen.len() < MAX_REMEMBERED && self.seen.insert(text.to_owned())
    }
}

/// The kind of object `at` is.
fn kind_of(at: ObjectRef) -> ObjectKind {
    crate::synthetic::kind_of(at)
}

/// Writes the mapped values of `file`, a file of `kind`, into `page`; returns the others.
fn write<'a>(kind: ObjectKind, page: &SharedPage, file: &'a StatsFile) -> Vec<(&'a str, u64)> {
    let mut rest = Vec::new();
    for (name, value) in &file.counters {
        match mapping(kind, name) {
            Some(m) => page.set(m.counter, m.scale.apply(*value)),
            None => rest.push((name.as_ref(), *value)),
        }
    }
    rest
}

/// The catalog counters `file`, a file of `kind`, gives.
fn given(kind: ObjectKind, file: &StatsFile) -> HashSet<CounterId> {
    file.counters.iter().filter_map(|(name, _)| mapping(kind, name)).map(|m| m.counter).collect()
}

/// The partition and VP counters of a partition no file gives: the catalog's that no name maps,
/// and mapped ones missing from its file or from any of its VPs' (a build without them).
fn unavailable<'a>(partition: &StatsFile, vps: impl Iterator<Item = &'a StatsFile>) -> Vec<CounterId> {
    let mut out: Vec<CounterId> =
        names::never_given(ObjectKind::Partition).chain(names::never_given(ObjectKind::Vp)).collect();
    let partition = given(ObjectKind::Partition, partition);
    let mut files = 0usize;
    let mut by_vps: HashMap<CounterId, usize> = HashMap::new();
    for file in vps {
        files += 1;
        for counter in given(ObjectKind::Vp, file) {
            *by_vps.entry(counter).or_default() += 1;
        }
    }
    for m in MAPPINGS {
        let missing = match m.counter.kind {
            ObjectKind::Partition => !partition.contains(&m.counter),
            ObjectKind::Vp => files > 0 && by_vps.get(&m.counter) != Some(&files),
            _ => false,
        };
        if missing {
            out.push(m.counter);
        }
    }
    out
}

/// The names `tree` prints that no table maps, by the kind of file: what `--list-unknown` shows.
/// Each name is paired with whether a kernel hvstats knows prints it (a known counter the catalog
/// lacks) or not (a name of a build hvstats does not know).
pub fn unmapped_names(tree: &Tree) -> BTreeMap<ObjectKind, BTreeMap<String, bool>> {
    let mut out: BTreeMap<ObjectKind, BTreeMap<String, bool>> = BTreeMap::new();
    let mut add = |kind: ObjectKind, file: &StatsFile| {
        for (name, _) in &file.counters {
            if mapping(kind, name).is_none() {
                let known = names::canonical(kind, name).is_some();
                out.entry(kind).or_default().insert(name.to_string(), known);
            }
        }
    };
    if let Some(f) = &tree.hypervisor {
        add(ObjectKind::Hypervisor, f);
    }
    for f in tree.lps.values() {
        add(ObjectKind::LogicalProcessor, f);
    }
    for p in tree.partitions.values() {
        add(ObjectKind::Partition, &p.stats);
        for f in p.vps.values() {
            add(ObjectKind::Vp, f);
        }
    }
    out
}

/// Reads the tree once, for a first look (the LP count) or `--list-unknown`.
///
/// # Errors
/// When the root cannot be read.
pub fn read_tree(root: &Path) -> Result<Tree, TreeError> {
    tree::read(root)
}

/// The partition id of an L1VH's own partition (`partition/self`).
pub const SELF_ID: u64 = SELF_PARTITION_ID;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::{Area, Host, KernelTree, SyntheticTree, full_file, kernel_tree, shifted_vp_file};
    use hvstats_abi::catalog::{hypervisor as hvc, lp as lpc, partition as ptc, vp as vpc};

    /// Stats pages whose values tell objects, ids and areas apart, with zeros where a dialect's
    /// choice between SELF and PARENT shows: SELF holds values at odd ids, PARENT at ids divisible
    /// by 3.
    fn pages(at: ObjectRef, area: Area, id: u16) -> u64 {
        let object = match at {
            ObjectRef::Hypervisor => 1,
            ObjectRef::Lp(n) => 10 + u64::from(n),
            ObjectRef::Partition(p) => 100 + p % 100,
            ObjectRef::Vp(p, n) => 1_000 + (p % 100) * 100 + u64::from(n),
        } * 10_000;
        let id = u64::from(id);
        match area {
            Area::Own if id % 2 == 1 => object + id,
            Area::Parent if id % 3 == 0 => object + 5_000 + id,
            _ => 0,
        }
    }

    /// Checks that every object `k` printed is published with every mapped counter at exactly the
    /// value printed (scaled to the catalog's unit), and that every mapped counter was printed.
    fn assert_published_exactly(k: &KernelTree, o: &MshvObserver) {
        let lps = o.hv.logical_processors();
        for (at, lines) in &k.printed {
            let kind = kind_of(*at);
            let partition = |id| o.hv.partition(id).unwrap_or_else(|| panic!("{at}: not published"));
            let page = match *at {
                ObjectRef::Hypervisor => o.hv.page().snapshot(),
                ObjectRef::Lp(n) => lps[n as usize].page().snapshot(),
                ObjectRef::Partition(id) => partition(id).page().snapshot(),
                ObjectRef::Vp(id, n) => partition(id).vp_page(n).unwrap().snapshot(),
            };
            let mut mapped = 0;
            for (printed, value) in lines {
                let name = names::canonical(kind, printed).unwrap();
                if let Some(m) = mapping(kind, name) {
                    assert_eq!(page.data[m.counter.slot()], m.scale.apply(*value), "{at} {printed}");
                    mapped += 1;
                }
            }
            assert_eq!(mapped, MAPPINGS.iter().filter(|m| m.counter.kind == kind).count(), "{at}");
        }
    }

    #[test]
    fn every_dialect_root_and_l1vh_publishes_every_mapped_counter_exactly() {
        let hosts = [
            ("root", Host::root(2, vec![(5, vec![0, 3])])),
            ("l1vh", Host::l1vh(2, vec![(6, vec![0])])),
            ("no-parent", Host { parent_pages: false, ..Host::root(1, vec![(5, vec![0])]) }),
        ];
        for dialect in crate::dialect::Dialect::ALL {
            for (what, host) in &hosts {
                if !host.root && !dialect.prints_self() {
                    continue;
                }
                let k = kernel_tree(&format!("dialect-{what}"), dialect, host, pages).unwrap();
                let tree = read_tree(k.tree.path()).unwrap();
                assert!(tree.problems.is_empty(), "{dialect:?} {what}: {:?}", tree.problems);
                assert_eq!(tree.dialect(), Some(dialect), "{what}");
                let (o, events) = observe(&k.tree);
                assert!(events.contains(&MshvEvent::Format(dialect)), "{events:?}");
                assert_published_exactly(&k, &o);
                let expected = k.printed.keys().filter(|at| matches!(at, ObjectRef::Partition(_))).count();
                assert_eq!(o.partitions().count(), expected, "{dialect:?} {what}");
                // Unmapped names are logged once each, under the kind of the file that printed them.
                for event in &events {
                    if let MshvEvent::Unmapped { kind, name } = event {
                        assert_eq!(names::canonical(*kind, name), Some(name.as_str()), "{kind:?} {name}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_value_shown_is_the_one_the_dialect_prints() {
        // VP counter 9 (page invalidations: CPUID's neighbour) has SELF and PARENT values; 12 has
        // PARENT only; 19 (CPUID) SELF only.
        let host = Host::root(1, vec![(5, vec![0])]);
        let published = |dialect| {
            let k = kernel_tree("shown", dialect, &host, pages).unwrap();
            let (o, _) = observe(&k.tree);
            let vp = o.hv.partition(5).unwrap().vp_page(0).unwrap().snapshot();
            [vpc::PAGE_INVALIDATIONS, vpc::CONTROL_REGISTER_ACCESSES_COST, vpc::CPUID_INSTRUCTIONS]
                .map(|c| vp.data[c.slot()])
        };
        let vp = 1_000 * 10_000 + 5 * 100 * 10_000;
        assert_eq!(published(crate::dialect::Dialect::Mainline), [vp + 5_009, vp + 5_012, vp + 19]);
        assert_eq!(published(crate::dialect::Dialect::Microsoft), [vp + 9, vp + 5_012, vp + 19]);
        assert_eq!(published(crate::dialect::Dialect::MicrosoftSinglePage), [vp + 9, 0, vp + 19]);
    }

    /// A value that tells ids and objects apart: `object * 1000 + id`.
    fn val(object: u64) -> impl Fn(u16) -> u64 {
        move |id| object * 1000 + u64::from(id)
    }

    fn observe(t: &SyntheticTree) -> (MshvObserver, Vec<MshvEvent>) {
        let tree = read_tree(t.path()).unwrap();
        let hv = Hypervisor::with_config(instance_config(t.path(), &tree, None)).unwrap();
        let mut o = MshvObserver::new(hv, t.path().to_owned());
        let events = o.tick();
        (o, events)
    }

    fn full_tree(name: &str) -> SyntheticTree {
        let t = SyntheticTree::new(name).unwrap();
        t.hypervisor(&full_file(ObjectKind::Hypervisor, val(1))).unwrap();
        for n in 0..2 {
            t.lp(n, &full_file(ObjectKind::LogicalProcessor, val(10 + u64::from(n)))).unwrap();
        }
        t.partition("5", &full_file(ObjectKind::Partition, val(20))).unwrap();
        t.vp("5", 0, &full_file(ObjectKind::Vp, val(30))).unwrap();
        t.vp("5", 1, &full_file(ObjectKind::Vp, val(31))).unwrap();
        t
    }

    #[test]
    fn every_object_carries_the_files_values_under_the_catalogs_counters() {
        let t = full_tree("pub-full");
        let (o, events) = observe(&t);
        assert!(events.contains(&MshvEvent::Appeared { key: PartitionKey::Id(5), vps: vec![0, 1] }));
        let hv = &o.hv;
        assert_eq!(hv.page().get(hvc::PARTITIONS), 1002);
        assert_eq!(hv.page().get(hvc::MONITORED_NOTIFICATIONS), 1005);
        let lps = hv.logical_processors();
        assert_eq!(lps.len(), 2);
        assert_eq!(lps[1].page().get(lpc::GLOBAL_TIME), 11001);
        assert_eq!(lps[1].page().get(lpc::C3_TIME), 11018);
        // LpContextSwitchTime is in 100 ns; the catalog's "Context switch time" in ns.
        assert_eq!(lps[0].page().get(lpc::CONTEXT_SWITCH_TIME), 10012 * 100);
        let p = hv.partition(5).unwrap();
        assert_eq!(p.page().get(ptc::VIRTUAL_PROCESSORS), 20001);
        assert_eq!(p.page().get(ptc::VIRTUAL_TLB_PAGES), 20003);
        assert_eq!(p.page().get(ptc::RECOMMENDED_VIRTUAL_TLB_SIZE), 20009);
        let vp1 = p.vp_page(1).unwrap();
        assert_eq!(vp1.get(vpc::CPUID_INSTRUCTIONS), 31019);
        assert_eq!(vp1.get(vpc::CPUID_INSTRUCTIONS_COST), 31020);
        assert_eq!(vp1.get(vpc::HYPERCALLS), 31007);
        assert_eq!(vp1.get(vpc::VIRTUAL_PROCESSOR_HYPERCALLS), 31069);
        assert_eq!(vp1.get(vpc::DISPATCHES), 31074);
        assert_eq!(vp1.get(vpc::CPU_WAIT_TIME_PER_DISPATCH), 31075 * 100);
        assert_eq!(p.vp_page(0).unwrap().get(vpc::TOTAL_RUN_TIME), 30001);
        // The modern VP counters seed 001 never had are reported once each, and kept by name.
        let unmapped: Vec<_> = events.iter().filter(|e| matches!(e, MshvEvent::Unmapped { .. })).collect();
        let expected =
            [ObjectKind::Hypervisor, ObjectKind::LogicalProcessor, ObjectKind::Partition, ObjectKind::Vp]
                .iter()
                .map(|&k| {
                    crate::dialect::Dialect::Mainline.names(k).len()
                        - names::MAPPINGS.iter().filter(|m| m.counter.kind == k).count()
                })
                .sum::<usize>();
        assert_eq!(unmapped.len(), expected);
        assert!(events.contains(&MshvEvent::Unmapped {
            kind: ObjectKind::Vp,
            name: "VpWaitingForCpuTimeBucket12".into()
        }));
    }

    #[test]
    fn a_build_with_shifted_ids_gives_the_same_counters_by_name() {
        let t = SyntheticTree::new("pub-shifted").unwrap();
        t.partition("5", &full_file(ObjectKind::Partition, val(20))).unwrap();
        // The same values by name as the x86_64 build's, at other ids.
        let by_name = |n: &str| {
            crate::dialect::Dialect::Mainline
                .names(ObjectKind::Vp)
                .iter()
                .find(|(_, x)| *x == n)
                .map(|(id, _)| *id)
        };
        let mut file: Vec<(&str, u64)> = shifted_vp_file(|_| 0)
            .into_iter()
            .map(|(n, _)| (n, 30_000 + u64::from(by_name(n).unwrap())))
            .collect();
        assert!(file.iter().all(|(n, _)| *n != "VpLoadAvg"));
        // CBL-Mariner's enum names 201 VpUnused (no kernel prints it) and has ten placeholders
        // (its debugfs prints them).
        file.push(("VpUnused", 5));
        file.push(("VpPlaceholder10", 6));
        t.vp("5", 0, &file).unwrap();
        let (o, _) = observe(&t);
        let vp = o.hv.partition(5).unwrap().vp_page(0).unwrap().snapshot();
        let page = |c: CounterId| vp.data[c.slot()];
        assert_eq!(page(vpc::CPUID_INSTRUCTIONS), 30019);
        assert_eq!(page(vpc::CPU_WAIT_TIME_PER_DISPATCH), 30075 * 100);
        let unknown = unmapped_names(&read_tree(t.path()).unwrap());
        let vp_names = &unknown[&ObjectKind::Vp];
        assert_eq!(vp_names.get("VpUnused"), Some(&false));
        assert_eq!(vp_names.get("VpPlaceholder10"), Some(&true));
        assert_eq!(vp_names.get("VpRootDispatchThreadBlocked"), Some(&true));
        assert!(!vp_names.contains_key("VpCpuidInstructionsCount"));
    }

    #[test]
    fn an_l1vh_publishes_self_and_declares_the_missing_counters() {
        let t = SyntheticTree::new("pub-l1vh").unwrap();
        // No hypervisor or LP files; some counters of the partition and VP files missing.
        t.partition("self", &[("PtVirtualProcessors", 1), ("PtGpaPages", 0)]).unwrap();
        t.vp("self", 0, &[("VpTotalRunTime", 77), ("VpHypercallsCount", 3), ("VpVtl2RunTime", 9)]).unwrap();
        let (o, events) = observe(&t);
        assert!(events.contains(&MshvEvent::Appeared { key: PartitionKey::Myself, vps: vec![0] }));
        assert!(o.hv.logical_processors().is_empty());
        let p = o.hv.partition(SELF_ID).unwrap();
        assert_eq!(p.vp_page(0).unwrap().get(vpc::TOTAL_RUN_TIME), 77);
        let declared = &o.partitions[&PartitionKey::Myself].unavailable;
        assert!(declared.contains(&vpc::HYPERCALLS_COST) && declared.contains(&ptc::DEPOSITED_PAGES));
        assert!(!declared.contains(&vpc::HYPERCALLS) && !declared.contains(&ptc::GPA_PAGES));
        let hv_declared = &o.global_unavailable[&None];
        let every = hvstats_abi::catalog::counters_of(hvstats_abi::ObjectKind::Hypervisor).count();
        assert_eq!(hv_declared.len(), every, "no hypervisor file: every hypervisor counter is absent");
    }

    #[test]
    fn partitions_and_vps_follow_their_directories() {
        let t = full_tree("pub-churn");
        let (mut o, _) = observe(&t);
        t.partition("9", &[("PtVirtualProcessors", 0)]).unwrap();
        t.vp("5", 4, &[("VpCpuidInstructionsCount", 1)]).unwrap();
        let events = o.tick();
        assert!(events.contains(&MshvEvent::Appeared { key: PartitionKey::Id(9), vps: vec![] }));
        assert!(events.contains(&MshvEvent::VpsChanged { key: PartitionKey::Id(5), vps: vec![0, 1, 4] }));
        assert_eq!(o.hv.partition(5).unwrap().vp_page(4).unwrap().get(vpc::CPUID_INSTRUCTIONS), 1);
        t.remove_partition("5").unwrap();
        let events = o.tick();
        assert_eq!(events, [MshvEvent::Vanished { key: PartitionKey::Id(5) }]);
        assert!(o.hv.partition(5).is_none());
        assert_eq!(o.partitions().map(|(k, _)| k).collect::<Vec<_>>(), [PartitionKey::Id(9)]);
        // A tree gone entirely is reported once, and what was published stays as it was.
        std::fs::remove_dir_all(t.path()).unwrap();
        assert!(matches!(o.tick().as_slice(), [MshvEvent::Unreadable(_)]));
        assert!(o.tick().is_empty());
        assert!(o.hv.partition(9).is_some());
    }

    #[test]
    fn bad_lines_are_reported_once_and_good_ones_kept() {
        let t = SyntheticTree::new("pub-bad").unwrap();
        t.partition("2", &[("PtGpaPages", 8)]).unwrap();
        t.write_raw("partition/2/vp/0", b"VpCpuidInstructionsCount                   : 12\nVpHypercallsCount  : 99999999999999999999\nVpMsrAccessesCount : 4").unwrap();
        let (mut o, events) = observe(&t);
        let problems: Vec<_> = events.iter().filter(|e| matches!(e, MshvEvent::Problem(_))).collect();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(o.tick().iter().all(|e| !matches!(e, MshvEvent::Problem(_))));
        let vp = o.hv.partition(2).unwrap();
        assert_eq!(vp.vp_page(0).unwrap().get(vpc::CPUID_INSTRUCTIONS), 12);
        let declared = &o.partitions[&PartitionKey::Id(2)].unavailable;
        assert!(declared.contains(&vpc::HYPERCALLS) && declared.contains(&vpc::MSR_ACCESSES));
    }
}
