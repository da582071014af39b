//! Trees in a kernel's exact format, written into a directory of one's own: what tests and
//! demonstrations read instead of a real `/sys/kernel/debug/mshv`.
//!
//! [`SyntheticTree`] writes single files in a dialect's format; [`kernel_tree`] writes a whole
//! tree as a kernel of that dialect lays it out and prints it, from the values of the stats pages
//! it would map (its SELF and PARENT pages, and which of the two a line shows), and says what
//! every file printed ([`KernelTree::printed`]).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use hvstats::unmapped::ObjectRef;
use hvstats_abi::ObjectKind;

use crate::dialect::Dialect;
use crate::tree::SELF_PARTITION_ID;

/// A tree under the system's temporary directory, removed on drop.
#[derive(Debug)]
pub struct SyntheticTree {
    root: PathBuf,
    dialect: Dialect,
}

impl SyntheticTree {
    /// A fresh, empty `hvstats-mshv-<name>-<pid>-<n>` directory whose files are printed as
    /// mainline Linux prints them.
    ///
    /// # Errors
    /// When the directory cannot be created.
    pub fn new(name: &str) -> std::io::Result<Self> {
        Self::in_dialect(name, Dialect::Mainline)
    }

    /// A fresh, empty directory whose files are printed in `dialect`.
    ///
    /// # Errors
    /// When the directory cannot be created.
    pub fn in_dialect(name: &str, dialect: Dialect) -> std::io::Result<Self> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let root = std::env::temp_dir().join(format!("hvstats-mshv-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root)?;
        Ok(Self { root, dialect })
    }

    /// The tree's root (what `--mshv` is given).
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// The dialect its files are printed in.
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// Writes the hypervisor's `stats`.
    ///
    /// # Errors
    /// When it cannot be written.
    pub fn hypervisor(&self, counters: &[(&str, u64)]) -> std::io::Result<()> {
        self.write(ObjectKind::Hypervisor, "", counters)
    }

    /// Writes `lp/<n>/stats`.
    ///
    /// # Errors
    /// When it cannot be written.
    pub fn lp(&self, n: u32, counters: &[(&str, u64)]) -> std::io::Result<()> {
        self.write(ObjectKind::LogicalProcessor, &format!("lp/{n}"), counters)
    }

    /// Writes `partition/<id>/stats` (`id` as the directory is named: decimal or `self`), and
    /// makes its `vp` directory as the kernel does.
    ///
    /// # Errors
    /// When it cannot be written.
    pub fn partition(&self, id: &str, counters: &[(&str, u64)]) -> std::io::Result<()> {
        std::fs::create_dir_all(self.root.join("partition").join(id).join("vp"))?;
        self.write(ObjectKind::Partition, &format!("partition/{id}"), counters)
    }

    /// Writes `partition/<id>/vp/<n>/stats`.
    ///
    /// # Errors
    /// When it cannot be written.
    pub fn vp(&self, id: &str, n: u32, counters: &[(&str, u64)]) -> std::io::Result<()> {
        self.write(ObjectKind::Vp, &format!("partition/{id}/vp/{n}"), counters)
    }

    /// Removes `partition/<id>` as `destroy_partition()` does.
    ///
    /// # Errors
    /// When it cannot be removed.
    pub fn remove_partition(&self, id: &str) -> std::io::Result<()> {
        std::fs::remove_dir_all(self.root.join("partition").join(id))
    }

    /// Writes `<dir>/stats` with one line per counter in the dialect's format, replacing the file
    /// at once (a reader never sees half of it).
    ///
    /// # Errors
    /// When it cannot be written.
    pub fn write(&self, kind: ObjectKind, dir: &str, counters: &[(&str, u64)]) -> std::io::Result<()> {
        let text: String = counters.iter().map(|(n, v)| self.dialect.line(kind, n, *v)).collect();
        self.write_raw(dir, text.as_bytes())
    }

    /// Writes `<dir>/stats` with exactly `bytes` (for malformed files), mode 0400 as the kernel
    /// makes it.
    ///
    /// # Errors
    /// When it cannot be written.
    pub fn write_raw(&self, dir: &str, bytes: &[u8]) -> std::io::Result<()> {
        let dir = self.root.join(dir);
        std::fs::create_dir_all(&dir)?;
        let tmp = dir.join(".stats.tmp");
        std::fs::write(&tmp, bytes)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o400))?;
        std::fs::rename(&tmp, dir.join("stats"))
    }
}

impl Drop for SyntheticTree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Every name of `kind`'s mainline x86_64 table with the value `value(id)`, in id order: a whole
/// file as mainline prints it.
pub fn full_file(kind: ObjectKind, value: impl Fn(u16) -> u64) -> Vec<(&'static str, u64)> {
    Dialect::Mainline.names(kind).iter().map(|&(id, name)| (name, value(id))).collect()
}

/// The VP file of the build whose table lacks `VpLoadAvg` and prints `VpRootDispatchThreadBlocked`
/// at 201 (ids shifted from 202 on), values by the id that build gives each name.
pub fn shifted_vp_file(value: impl Fn(u16) -> u64) -> Vec<(&'static str, u64)> {
    Dialect::Mainline
        .names(ObjectKind::Vp)
        .iter()
        .filter(|(_, name)| *name != "VpLoadAvg")
        .map(|&(id, name)| (name, value(if id > 201 { id - 1 } else { id })))
        .collect()
}

/// The host a kernel tree is written for: what the kernel finds at module init, and the
/// partitions VMMs created since.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// Linux is the root partition; else an L1VH (a partition that runs VMs of its own).
    pub root: bool,
    /// Logical processors: the hypervisor's `LogicalProcessors` counter, read once at init, which
    /// is how many `lp/<n>` directories the kernel makes (the hypervisor page prints it).
    pub lps: u32,
    /// This partition's id (`hv_current_partition_id`; an L1VH's is `HV_PARTITION_ID_SELF`).
    pub own_id: u64,
    /// This partition's VP indices (`hv_vp_index` of each online CPU).
    pub own_vps: Vec<u32>,
    /// Partitions VMMs created, with their VP indices.
    pub children: Vec<(u64, Vec<u32>)>,
    /// Whether the hypervisor grants PARENT pages; an older one refuses them, and the kernel then
    /// shows the SELF page for both.
    pub parent_pages: bool,
}

impl Host {
    /// A root partition of id 1 with `lps` LPs and as many VPs, and `children`.
    pub fn root(lps: u32, children: Vec<(u64, Vec<u32>)>) -> Self {
        Self { root: true, lps, own_id: 1, own_vps: (0..lps).collect(), children, parent_pages: true }
    }

    /// An L1VH with `vps` VPs of its own, and `children`.
    pub fn l1vh(vps: u32, children: Vec<(u64, Vec<u32>)>) -> Self {
        let own_vps = (0..vps).collect();
        Self { root: false, lps: 0, own_id: SELF_PARTITION_ID, own_vps, children, parent_pages: true }
    }
}

/// One of the two pages the kernel maps for a partition or a VP (the hypervisor and LPs have
/// SELF only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Area {
    /// `HV_STATS_AREA_SELF`: the partition's own view.
    Own,
    /// `HV_STATS_AREA_PARENT`: its parent's.
    Parent,
}

/// A tree written as a kernel prints it, and what each of its files printed (names as printed,
/// with their values), by object.
#[derive(Debug)]
pub struct KernelTree {
    /// The tree.
    pub tree: SyntheticTree,
    /// Each file's lines, by object, the L1VH's own partition as
    /// [`SELF_PARTITION_ID`].
    pub printed: BTreeMap<ObjectRef, Vec<(&'static str, u64)>>,
}

/// Writes the tree a kernel of `dialect` makes on `host`, whose stats pages hold
/// `pages(object, area, counter id)`: the objects it makes directories for (the hypervisor's and
/// LPs' files on a root partition, or on every host in the older revision of Microsoft's file;
/// `partition/self` for an L1VH's own partition where the kernel names it so; `vp/` under every
/// partition; Microsoft's write-only `hvdbg`), each file printing every name of the dialect's
/// list in its order and width, each partition's and VP's line showing the value the dialect
/// shows of its two pages.
///
/// # Errors
/// When a directory or file cannot be written.
pub fn kernel_tree(
    name: &str,
    dialect: Dialect,
    host: &Host,
    pages: impl Fn(ObjectRef, Area, u16) -> u64,
) -> std::io::Result<KernelTree> {
    let tree = SyntheticTree::in_dialect(name, dialect)?;
    let mut printed = BTreeMap::new();
    let mut file = |at: ObjectRef, dir: &str, two_pages: bool| -> std::io::Result<()> {
        let kind = kind_of(at);
        let lines: Vec<(&'static str, u64)> = dialect
            .names(kind)
            .iter()
            .map(|&(id, name)| {
                let own = match (at, id) {
                    (ObjectRef::Hypervisor, 1) => u64::from(host.lps),
                    _ => pages(at, Area::Own, id),
                };
                let value = match two_pages {
                    true => dialect.shown().value(own, pages(at, Area::Parent, id)),
                    false => dialect.shown().value(own, own),
                };
                (name, value)
            })
            .collect();
        tree.write(kind, dir, &lines)?;
        printed.insert(at, lines);
        Ok(())
    };
    if host.root || !dialect.global_files_on_root_only() {
        file(ObjectRef::Hypervisor, "", false)?;
        for n in 0..host.lps {
            file(ObjectRef::Lp(n), &format!("lp/{n}"), false)?;
        }
    }
    if host.root && dialect.has_hvdbg() {
        let hvdbg = tree.path().join("hvdbg");
        std::fs::write(&hvdbg, b"")?;
        std::fs::set_permissions(&hvdbg, std::fs::Permissions::from_mode(0o200))?;
    }
    let own = std::iter::once((host.own_id, &host.own_vps));
    for (id, vps) in own.chain(host.children.iter().map(|(id, vps)| (*id, vps))) {
        let named_self = !host.root && id == SELF_PARTITION_ID && dialect.prints_self();
        let dir = if named_self { "self".to_owned() } else { id.to_string() };
        // An L1VH cannot map its own PARENT area, and an older hypervisor refuses PARENT maps:
        // the kernel then shows the SELF page for both.
        let two_pages = host.parent_pages && !named_self;
        std::fs::create_dir_all(tree.path().join("partition").join(&dir).join("vp"))?;
        file(ObjectRef::Partition(id), &format!("partition/{dir}"), two_pages)?;
        for &n in vps {
            file(ObjectRef::Vp(id, n), &format!("partition/{dir}/vp/{n}"), two_pages)?;
        }
    }
    Ok(KernelTree { tree, printed })
}

/// The kind of object `at` is.
pub fn kind_of(at: ObjectRef) -> ObjectKind {
    match at {
        ObjectRef::Hypervisor => ObjectKind::Hypervisor,
        ObjectRef::Lp(_) => ObjectKind::LogicalProcessor,
        ObjectRef::Partition(_) => ObjectKind::Partition,
        ObjectRef::Vp(..) => ObjectKind::Vp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SELF holds `object + id` for odd ids, PARENT `object + id + 500` for ids divisible by 3.
    fn pages(at: ObjectRef, area: Area, id: u16) -> u64 {
        let object = match at {
            ObjectRef::Hypervisor => 1_000,
            ObjectRef::Lp(n) => 10_000 + u64::from(n) * 1_000,
            ObjectRef::Partition(_) => 100_000,
            ObjectRef::Vp(_, n) => 200_000 + u64::from(n) * 1_000,
        };
        let id = u64::from(id);
        match area {
            Area::Own if id % 2 == 1 => object + id,
            Area::Parent if id % 3 == 0 => object + id + 500,
            _ => 0,
        }
    }

    fn listing(root: &Path) -> Vec<String> {
        let mut out = Vec::new();
        let mut dirs = vec![root.to_owned()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                out.push(path.strip_prefix(root).unwrap().display().to_string());
                if path.is_dir() {
                    dirs.push(path);
                }
            }
        }
        out.sort();
        out
    }

    #[test]
    fn each_dialect_lays_out_its_tree_as_its_kernel_does() {
        let host = Host::root(2, vec![(7, vec![0])]);
        let layout = |d| listing(kernel_tree("layout", d, &host, pages).unwrap().tree.path());
        let common = [
            "lp",
            "lp/0",
            "lp/0/stats",
            "lp/1",
            "lp/1/stats",
            "partition",
            "partition/1",
            "partition/1/stats",
            "partition/1/vp",
            "partition/1/vp/0",
            "partition/1/vp/0/stats",
            "partition/1/vp/1",
            "partition/1/vp/1/stats",
            "partition/7",
            "partition/7/stats",
            "partition/7/vp",
            "partition/7/vp/0",
            "partition/7/vp/0/stats",
            "stats",
        ];
        assert_eq!(layout(Dialect::Mainline), common);
        let mut with_hvdbg = common.to_vec();
        with_hvdbg.insert(0, "hvdbg");
        assert_eq!(layout(Dialect::Microsoft), with_hvdbg);
        assert_eq!(layout(Dialect::MicrosoftSinglePage), common);
        let l1vh = Host::l1vh(1, vec![]);
        let layout = |d| listing(kernel_tree("l1vh", d, &l1vh, pages).unwrap().tree.path());
        let own = ["partition", "partition/self", "partition/self/stats", "partition/self/vp"];
        let own_vp = ["partition/self/vp/0", "partition/self/vp/0/stats"];
        assert_eq!(layout(Dialect::Mainline), [&own[..], &own_vp[..]].concat());
        assert_eq!(layout(Dialect::Microsoft), [&own[..], &own_vp[..]].concat());
    }

    #[test]
    fn each_dialect_prints_the_value_its_source_shows() {
        let host = Host::root(1, vec![]);
        let text = |d| {
            let k = kernel_tree("values", d, &host, pages).unwrap();
            std::fs::read_to_string(k.tree.path().join("partition/1/vp/0/stats")).unwrap()
        };
        // VP counter 9 (page invalidations): SELF 200009, PARENT 200509.
        assert!(text(Dialect::Mainline).contains("\nVpPageInvalidationsCount                   : 200509\n"));
        assert!(text(Dialect::Microsoft).contains("\nPageInvalidationsCount        : 200009\n"));
        assert!(
            text(Dialect::MicrosoftSinglePage)
                .contains("\nPageInvalidationsCount                   : 200009\n")
        );
        // Counter 12 (control register time): SELF 0, PARENT 200512.
        assert!(text(Dialect::Microsoft).contains("\nControlRegisterAccessesTime   : 200512\n"));
        assert!(
            text(Dialect::MicrosoftSinglePage).contains("\nControlRegisterAccessesTime              : 0\n")
        );
        // The hypervisor's LP count is the directories made.
        let k = kernel_tree("lps", Dialect::Microsoft, &host, pages).unwrap();
        assert!(
            std::fs::read_to_string(k.tree.path().join("stats"))
                .unwrap()
                .starts_with("LogicalProcessors        : 1\n")
        );
        // An L1VH's own partition shows SELF only.
        let k = kernel_tree("l1vh-values", Dialect::Mainline, &Host::l1vh(1, vec![]), pages).unwrap();
        let own = &k.printed[&ObjectRef::Vp(SELF_PARTITION_ID, 0)];
        assert!(
            own.contains(&("VpPageInvalidationsCount", 200009))
                && own.contains(&("VpControlRegisterAccessesTime", 0))
        );
    }
}
