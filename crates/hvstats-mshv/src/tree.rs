//! The mshv debugfs tree, read once: `stats` (the hypervisor), `lp/<n>/stats`,
//! `partition/<id>/stats` and `partition/<id>/vp/<n>/stats`, where `<id>` is a decimal partition
//! id or `self` (an L1VH's own partition).
//!
//! The tree changes under the reader: partitions and their VPs come and go with the VMs, so a
//! directory that vanishes between the listing and the open is skipped, not an error. Only the
//! root itself missing or unreadable is. Nothing is ever created or written; every file is opened
//! read-only, non-blocking and without following a link, and read at most
//! [`super::stats_file::MAX_FILE_BYTES`] far. Counts are bounded too
//! ([`MAX_LPS`], [`MAX_PARTITIONS`], [`MAX_VPS`], and [`MAX_FILES`] in all).

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::stats_file::{self, MAX_FILE_BYTES, StatsFile};

/// Where Linux puts the tree.
pub const DEFAULT_ROOT: &str = "/sys/kernel/debug/mshv";
/// The most LP directories read.
pub const MAX_LPS: usize = 8192;
/// The most partition directories read.
pub const MAX_PARTITIONS: usize = 4096;
/// The most VP directories read per partition.
pub const MAX_VPS: usize = 4096;
/// The most `stats` files read in one walk (every object of a host of 16,000 VPs).
pub const MAX_FILES: usize = 16_384;
/// The partition id of `self`: `HV_PARTITION_ID_SELF`, `(u64)-1`.
pub const SELF_PARTITION_ID: u64 = u64::MAX;

/// An error reading the tree as a whole.
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    /// The root directory cannot be listed (missing, not root, debugfs not mounted, no mshv_root).
    #[error("cannot read the mshv debugfs tree {}", path.display())]
    Root {
        /// The root that was asked for (normally [`DEFAULT_ROOT`]).
        path: PathBuf,
        /// Why listing it failed (`NotFound`, `PermissionDenied`, …).
        #[source]
        source: io::Error,
    },
}

/// A partition directory's name: a decimal id or `self`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PartitionKey {
    /// `partition/<id>`.
    Id(u64),
    /// `partition/self` (an L1VH's own partition).
    Myself,
}

impl PartitionKey {
    /// Parses a directory name (`0042` is not a name the kernel prints, so it is refused).
    pub fn parse(name: &str) -> Option<Self> {
        if name == "self" {
            return Some(PartitionKey::Myself);
        }
        let id: u64 = name.parse().ok()?;
        (id.to_string() == name).then_some(PartitionKey::Id(id))
    }

    /// The partition id: the number, or [`SELF_PARTITION_ID`].
    pub fn id(self) -> u64 {
        match self {
            PartitionKey::Id(id) => id,
            PartitionKey::Myself => SELF_PARTITION_ID,
        }
    }
}

impl fmt::Display for PartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PartitionKey::Id(id) => write!(f, "{id}"),
            PartitionKey::Myself => f.write_str("self"),
        }
    }
}

/// One partition directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartitionTree {
    /// Its `stats` file.
    pub stats: StatsFile,
    /// Its VPs' files, by VP index.
    pub vps: BTreeMap<u32, StatsFile>,
}

/// Something in the tree that was skipped, with why (for the log; never fatal).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The path concerned.
    pub path: PathBuf,
    /// What was wrong.
    pub what: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.what)
    }
}

/// The whole tree as read at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tree {
    /// The hypervisor's file (absent on an L1VH).
    pub hypervisor: Option<StatsFile>,
    /// The LPs' files, by LP index (none on an L1VH).
    pub lps: BTreeMap<u32, StatsFile>,
    /// The `partition/<id>` and `partition/self` directories, by key.
    pub partitions: BTreeMap<PartitionKey, PartitionTree>,
    /// What was skipped: unreadable files, names that are not the kernel's, bad lines.
    pub problems: Vec<Problem>,
}

/// Reads the tree under `root`.
///
/// # Errors
/// [`TreeError::Root`] when `root` cannot be listed; everything below it that cannot be read is
/// skipped and reported in [`Tree::problems`].
pub fn read(root: &Path) -> Result<Tree, TreeError> {
    read_at_most(root, MAX_FILES)
}

/// [`read`], reading at most `max_files` files.
fn read_at_most(root: &Path, max_files: usize) -> Result<Tree, TreeError> {
    let entries = list(root).map_err(|source| TreeError::Root { path: root.to_owned(), source })?;
    let mut tree = Tree::default();
    let mut files = max_files + 1;
    let has = |name: &str| entries.iter().any(|e| e == name);
    if has("stats") {
        tree.hypervisor = read_stats(&root.join("stats"), &mut files, &mut tree.problems);
    }
    if has("lp") {
        tree.lps = read_numbered(&root.join("lp"), MAX_LPS, &mut files, &mut tree.problems);
    }
    if has("partition") {
        let dir = root.join("partition");
        for name in sub_list(&dir, MAX_PARTITIONS, &mut tree.problems) {
            let Some(key) = PartitionKey::parse(&name) else {
                tree.problems.push(Problem { path: dir.join(&name), what: "not a partition id".into() });
                continue;
            };
            let pdir = dir.join(&name);
            // Gone between the listing and now: the partition was destroyed. Not a problem.
            let Some(stats) = read_stats(&pdir.join("stats"), &mut files, &mut tree.problems) else {
                continue;
            };
            let vps = read_numbered(&pdir.join("vp"), MAX_VPS, &mut files, &mut tree.problems);
            tree.partitions.insert(key, PartitionTree { stats, vps });
        }
    }
    Ok(tree)
}

/// `<dir>/<n>/stats` for every decimal `<n>`.
fn read_numbered(
    dir: &Path,
    max: usize,
    files: &mut usize,
    problems: &mut Vec<Problem>,
) -> BTreeMap<u32, StatsFile> {
    let mut found = BTreeMap::new();
    for name in sub_list(dir, max, problems) {
        let index = name.parse::<u32>().ok().filter(|n| n.to_string() == name);
        let Some(index) = index else {
            problems.push(Problem { path: dir.join(&name), what: "not an index".into() });
            continue;
        };
        if let Some(stats) = read_stats(&dir.join(&name).join("stats"), files, problems) {
            found.insert(index, stats);
        }
    }
    found
}

/// The names in `dir`, at most `max` (a directory that vanished is empty, silently).
fn sub_list(dir: &Path, max: usize, problems: &mut Vec<Problem>) -> Vec<String> {
    match list(dir) {
        Ok(mut names) => {
            if names.len() > max {
                problems.push(Problem {
                    path: dir.to_owned(),
                    what: format!("{} entries: only the first {max} are read", names.len()),
                });
                names.sort();
                names.truncate(max);
            }
            names
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            problems.push(Problem { path: dir.to_owned(), what: format!("cannot list: {e}") });
            Vec::new()
        }
    }
}

/// The names in `dir` (names that are not UTF-8 are not the kernel's, and are left out). Listing
/// stops a little past the largest bound, so a directory of millions costs no more.
fn list(dir: &Path) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if let Ok(name) = entry.file_name().into_string() {
            names.push(name);
        }
        if names.len() > MAX_LPS + 1 {
            break;
        }
    }
    Ok(names)
}

/// Reads and parses one `stats` file; `None` when it does not exist (any more), or cannot be read
/// (reported).
fn read_stats(path: &Path, files: &mut usize, problems: &mut Vec<Problem>) -> Option<StatsFile> {
    // One left: the budget is spent; say so once, at the first file not read.
    match *files {
        0 => return None,
        1 => {
            *files = 0;
            let what = "the walk's file budget is spent: neither this file nor the rest is read".to_owned();
            problems.push(Problem { path: path.to_owned(), what });
            return None;
        }
        _ => *files -= 1,
    }
    let mut bytes = Vec::new();
    let read = open(path).and_then(|f| f.take(MAX_FILE_BYTES as u64 + 1).read_to_end(&mut bytes));
    match read {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => {
            problems.push(Problem { path: path.to_owned(), what: format!("cannot read: {e}") });
            return None;
        }
    }
    let file = stats_file::parse(&bytes);
    if file.capped {
        problems.push(Problem {
            path: path.to_owned(),
            what: format!("longer than {MAX_FILE_BYTES} bytes: the rest is not read"),
        });
    }
    for s in &file.skipped {
        problems
            .push(Problem { path: path.to_owned(), what: format!("line {} skipped: {}", s.line, s.reason) });
    }
    Some(file)
}

/// Opens read-only, without following a link or waiting on a FIFO; refuses anything but a regular
/// file.
fn open(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::SyntheticTree;
    use hvstats_abi::ObjectKind;

    #[test]
    fn every_object_of_the_tree_is_read() {
        let t = SyntheticTree::new("tree-all").unwrap();
        t.hypervisor(&[("HvPartitions", 2)]).unwrap();
        t.lp(0, &[("LpGlobalTime", 10)]).unwrap();
        t.lp(1, &[("LpGlobalTime", 11)]).unwrap();
        t.partition("1", &[("PtVirtualProcessors", 2)]).unwrap();
        t.vp("1", 0, &[("VpCpuidInstructionsCount", 5)]).unwrap();
        t.vp("1", 1, &[("VpCpuidInstructionsCount", 6)]).unwrap();
        t.partition("self", &[("PtVirtualProcessors", 0)]).unwrap();
        let tree = read(t.path()).unwrap();
        assert_eq!(tree.hypervisor.as_ref().and_then(|f| f.get("HvPartitions")), Some(2));
        assert_eq!(tree.lps.keys().copied().collect::<Vec<_>>(), [0, 1]);
        assert_eq!(tree.lps[&1].get("LpGlobalTime"), Some(11));
        let keys: Vec<_> = tree.partitions.keys().copied().collect();
        assert_eq!(keys, [PartitionKey::Id(1), PartitionKey::Myself]);
        assert_eq!(tree.partitions[&PartitionKey::Id(1)].vps[&1].get("VpCpuidInstructionsCount"), Some(6));
        assert!(tree.problems.is_empty(), "{:?}", tree.problems);
    }

    #[test]
    fn a_missing_root_is_an_error_and_missing_parts_are_not() {
        let t = SyntheticTree::new("tree-missing").unwrap();
        let err = read(&t.path().join("nope")).unwrap_err();
        assert!(err.to_string().contains("nope"));
        // An L1VH: no hypervisor or LP files, only its own partition.
        t.partition("self", &[("PtVirtualProcessors", 1)]).unwrap();
        t.vp("self", 0, &[("VpTotalRunTime", 1)]).unwrap();
        // A partition whose directory is there but whose stats file is gone (destroyed mid-read).
        std::fs::create_dir_all(t.path().join("partition/7/vp/0")).unwrap();
        let tree = read(t.path()).unwrap();
        assert!(tree.hypervisor.is_none() && tree.lps.is_empty());
        assert_eq!(tree.partitions.keys().copied().collect::<Vec<_>>(), [PartitionKey::Myself]);
        assert!(tree.problems.is_empty(), "{:?}", tree.problems);
    }

    #[test]
    fn foreign_names_links_and_fifos_are_skipped_with_a_reason() {
        let t = SyntheticTree::new("tree-junk").unwrap();
        t.partition("3", &[("PtVirtualProcessors", 1)]).unwrap();
        std::fs::create_dir_all(t.path().join("partition/0042")).unwrap();
        std::fs::create_dir_all(t.path().join("lp/x")).unwrap();
        std::fs::create_dir_all(t.path().join("lp/0")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", t.path().join("lp/0/stats")).unwrap();
        std::fs::create_dir_all(t.path().join("lp/1")).unwrap();
        let fifo = std::ffi::CString::new(t.path().join("lp/1/stats").into_os_string().into_encoded_bytes())
            .unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let tree = read(t.path()).unwrap();
        assert!(tree.lps.is_empty());
        assert_eq!(tree.partitions.len(), 1);
        let text: Vec<String> = tree.problems.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 4, "{text:?}");
        assert!(text.iter().any(|p| p.ends_with("partition/0042: not a partition id")), "{text:?}");
        assert!(text.iter().any(|p| p.ends_with("lp/x: not an index")), "{text:?}");
        assert!(text.iter().any(|p| p.contains("lp/0/stats: cannot read")), "{text:?}");
        assert!(text.iter().any(|p| p.contains("lp/1/stats: cannot read")), "{text:?}");
        let _ = ObjectKind::Vp;
    }

    #[test]
    fn a_walk_reads_at_most_its_budget_and_says_so_once() {
        let t = SyntheticTree::new("tree-budget").unwrap();
        t.hypervisor(&[("HvPartitions", 1)]).unwrap();
        for n in 0..5 {
            t.lp(n, &[("LpGlobalTime", 1)]).unwrap();
        }
        let tree = read_at_most(t.path(), 3).unwrap();
        assert!(tree.hypervisor.is_some());
        assert_eq!(tree.lps.len(), 2);
        assert_eq!(tree.problems.len(), 1, "{:?}", tree.problems);
        assert!(tree.problems[0].what.contains("budget is spent"));
    }

    #[test]
    fn keys_parse_as_the_kernel_names_them() {
        assert_eq!(PartitionKey::parse("5"), Some(PartitionKey::Id(5)));
        assert_eq!(PartitionKey::parse("self"), Some(PartitionKey::Myself));
        assert_eq!(PartitionKey::parse("05"), None);
        assert_eq!(PartitionKey::parse("-1"), None);
        assert_eq!(PartitionKey::parse("18446744073709551616"), None);
        assert_eq!(PartitionKey::Myself.id(), u64::MAX);
    }
}
