//! The mshv debugfs tree, read once: `stats` (the hypervisor), `lp/<n>/stats`,
//! `partition/<id>/stats` and `partition/<id>/vp/<n>/stats`, where `<id>` is a decimal partition
//! id or `self` (an L1VH's own partition).
//!
//! The tree changes under the reader: partitions and their VPs come and go with the VMs, so a
//! directory that vanishes between the listing and the open is skipped, not an error. Only the
//! root itself missing or unreadable is. Nothing is ever created or written.
//!
//! Below the root the tree is read as untrusted: every directory and file is opened relative to
//! its parent's descriptor without following a link (a link is skipped, with why), files
//! read-only, non-blocking and at most [`MAX_FILE_BYTES`] far. A directory entry counts against a
//! cap ([`MAX_LPS`], [`MAX_PARTITIONS`], [`MAX_VPS`]) only once it is what the kernel names there
//! (a decimal index or id, or `self`, and a directory), so entries of other names cannot push real
//! objects out; of the valid ones the lowest are read, `self` first. A listing looks at most
//! [`MAX_SCANNED`] entries, a walk reads at most [`MAX_FILES`] files, and the problems it reports
//! are bounded ([`MAX_PROBLEMS`], and a few per directory or file) as are the names no known
//! kernel prints ([`crate::stats_file::UnknownNames`]).

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use hvstats_abi::ObjectKind;
use rustix::fs::{Dir, FileType, Mode, OFlags};

use crate::dialect::{Dialect, Seen};
use crate::stats_file::{self, MAX_FILE_BYTES, StatsFile, UnknownNames};

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
/// The most entries of one directory looked at (the kernel makes at most a few thousand).
pub const MAX_SCANNED: usize = 1 << 20;
/// The most problems one walk reports; past them, one line says how many more there were.
pub const MAX_PROBLEMS: usize = 256;
/// The most entries of one directory, or lines of one file, reported one by one.
const MAX_PROBLEMS_PER_PLACE: usize = 4;
/// The partition id of `self`: `HV_PARTITION_ID_SELF`, `(u64)-1`.
pub const SELF_PARTITION_ID: u64 = u64::MAX;
/// Why an entry of `partition/` is not read.
const NOT_A_PARTITION: &str = "not a partition id (decimal, or self)";

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

/// A partition directory's name: `self` or a decimal id. `self` orders first, so a cap on
/// partitions never drops it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PartitionKey {
    /// `partition/self` (an L1VH's own partition).
    Myself,
    /// `partition/<id>`.
    Id(u64),
}

impl PartitionKey {
    /// Parses a directory name (`0042` is not a name the kernel prints, so it is refused).
    pub fn parse(name: &str) -> Option<Self> {
        if name == "self" {
            return Some(PartitionKey::Myself);
        }
        decimal(name).map(PartitionKey::Id)
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

/// `name` as the kernel prints a number (`%u`, `%llu`): decimal digits, no leading zero.
fn decimal(name: &str) -> Option<u64> {
    let id: u64 = name.parse().ok()?;
    (id.to_string() == name).then_some(id)
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
    /// What was skipped: unreadable files, links, names that are not the kernel's, bad lines.
    pub problems: Vec<Problem>,
}

impl Tree {
    /// The dialect the tree is printed in, from how its names were printed (`None` when it holds
    /// no name a known kernel prints).
    pub fn dialect(&self) -> Option<Dialect> {
        let mut seen = Seen::default();
        let files =
            self.hypervisor.iter().chain(self.lps.values()).chain(
                self.partitions.values().flat_map(|p| std::iter::once(&p.stats).chain(p.vps.values())),
            );
        for file in files {
            seen.prefixed += file.seen.prefixed;
            seen.unprefixed += file.seen.unprefixed;
            seen.vp_width = seen.vp_width.max(file.seen.vp_width);
        }
        Dialect::detect(&seen)
    }
}

/// Reads the tree under `root`.
///
/// # Errors
/// [`TreeError::Root`] when `root` cannot be opened as a directory (missing, not readable, not a
/// directory); everything below it that cannot be read is skipped and reported in
/// [`Tree::problems`].
pub fn read(root: &Path) -> Result<Tree, TreeError> {
    read_at_most(root, MAX_FILES)
}

/// [`read`], reading at most `max_files` files.
fn read_at_most(root: &Path, max_files: usize) -> Result<Tree, TreeError> {
    let root_error = |source: io::Error| TreeError::Root { path: root.to_owned(), source };
    // The root is the operator's: a link there is followed, as any path they give. Below it,
    // nothing is.
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let root_fd = rustix::fs::open(root, flags, Mode::empty()).map_err(|e| root_error(e.into()))?;
    let mut walk =
        Walk { files: max_files + 1, problems: Vec::new(), more_problems: 0, unknown: UnknownNames::new() };
    let mut tree = Tree { hypervisor: walk.stats(&root_fd, root, ObjectKind::Hypervisor), ..Tree::default() };
    tree.lps = walk.numbered(&root_fd, &root.join("lp"), MAX_LPS, ObjectKind::LogicalProcessor);
    let path = root.join("partition");
    if let Some(dir) = walk.subdir(&root_fd, &path) {
        let mut keys = walk
            .entries(&dir, &path, MAX_PARTITIONS, |name| PartitionKey::parse(name).ok_or(NOT_A_PARTITION));
        // The kernel names HV_PARTITION_ID_SELF `self` where it knows the partition is an L1VH's
        // own; a directory of that id in decimal beside `self` cannot be the kernel's, and must
        // not stand in for it.
        let has_self = keys.first().is_some_and(|(key, _)| *key == PartitionKey::Myself);
        let decimal_self = keys.last().is_some_and(|(key, _)| *key == PartitionKey::Id(SELF_PARTITION_ID));
        if has_self
            && decimal_self
            && let Some((_, name)) = keys.pop()
        {
            walk.problem(&path.join(name), "the id of `self`, beside `self`: refused".to_owned());
        }
        for (key, name) in keys {
            let pdir_path = path.join(&name);
            // Gone between the listing and now: the partition was destroyed. Not a problem.
            let Some(pdir) = walk.subdir(&dir, &pdir_path) else { continue };
            let Some(stats) = walk.stats(&pdir, &pdir_path, ObjectKind::Partition) else { continue };
            let vps = walk.numbered(&pdir, &pdir_path.join("vp"), MAX_VPS, ObjectKind::Vp);
            tree.partitions.insert(key, PartitionTree { stats, vps });
        }
    }
    if walk.unknown.dropped() > 0 {
        walk.problem(
            root,
            format!(
                "names no known kernel prints: only the first {} of them, and {} of their values in \
                 all, are kept",
                stats_file::MAX_UNKNOWN_NAMES,
                stats_file::MAX_UNKNOWN_VALUES
            ),
        );
    }
    if walk.more_problems > 0 {
        let what = format!("{} more problems in this reading, not listed", walk.more_problems);
        walk.problems.push(Problem { path: root.to_owned(), what });
    }
    tree.problems = walk.problems;
    Ok(tree)
}

/// One walk's budgets and findings.
struct Walk {
    /// Files that may still be read, plus one (the one that says the budget is spent).
    files: usize,
    problems: Vec<Problem>,
    /// Problems past [`MAX_PROBLEMS`], counted.
    more_problems: usize,
    unknown: UnknownNames,
}

impl Walk {
    fn problem(&mut self, path: &Path, what: String) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(Problem { path: path.to_owned(), what });
        } else {
            self.more_problems += 1;
        }
    }

    /// `<dir>/<n>/stats` for every decimal `<n>`, the lowest `max` of them.
    fn numbered(
        &mut self,
        parent: &OwnedFd,
        path: &Path,
        max: usize,
        kind: ObjectKind,
    ) -> BTreeMap<u32, StatsFile> {
        let mut found = BTreeMap::new();
        let Some(dir) = self.subdir(parent, path) else { return found };
        let indices = self.entries(&dir, path, max, |name| {
            decimal(name).and_then(|n| u32::try_from(n).ok()).ok_or("not an index")
        });
        for (index, name) in indices {
            let object = path.join(&name);
            let Some(odir) = self.subdir(&dir, &object) else { continue };
            if let Some(stats) = self.stats(&odir, &object, kind) {
                found.insert(index, stats);
            }
        }
        found
    }

    /// The subdirectories of `dir` whose names `accept` takes, by key: the lowest `max` of them.
    /// Entries of other names, and links or files in their place, are reported (a few by name)
    /// and take no place under the cap. A directory gone since it was opened has none.
    fn entries<K: Ord>(
        &mut self,
        dir: &OwnedFd,
        path: &Path,
        max: usize,
        accept: impl Fn(&str) -> Result<K, &'static str>,
    ) -> Vec<(K, String)> {
        match self.list(dir, path, max, accept) {
            Ok(valid) => valid.into_iter().collect(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                self.problem(path, format!("cannot list: {e}"));
                Vec::new()
            }
        }
    }

    /// [`Walk::entries`], or why `dir` could not be listed.
    fn list<K: Ord>(
        &mut self,
        dir: &OwnedFd,
        path: &Path,
        max: usize,
        accept: impl Fn(&str) -> Result<K, &'static str>,
    ) -> io::Result<BTreeMap<K, String>> {
        let mut reader = Dir::read_from(dir)?;
        let mut kept = BTreeMap::new();
        let (mut refused, mut past_cap, mut scanned) = (0usize, 0usize, 0usize);
        while let Some(entry) = reader.read() {
            let entry = entry?;
            let bytes = entry.file_name().to_bytes();
            if bytes == b"." || bytes == b".." {
                continue;
            }
            scanned += 1;
            if scanned > MAX_SCANNED {
                self.problem(path, format!("more than {MAX_SCANNED} entries: the rest are not looked at"));
                break;
            }
            let name = std::str::from_utf8(bytes).map_err(|_| "not UTF-8");
            let valid = match (name.and_then(&accept), entry.file_type()) {
                (Err(why), _) => Err(why),
                (Ok(_), FileType::Symlink) => Err("a link: not followed"),
                // Unknown: a file system without types in its listing; the open checks.
                (Ok(key), FileType::Directory | FileType::Unknown) => Ok(key),
                (Ok(_), _) => Err("not a directory"),
            };
            match (valid, name) {
                (Ok(key), Ok(name)) => {
                    kept.insert(key, name.to_owned());
                    if kept.len() > max {
                        kept.pop_last();
                        past_cap += 1;
                    }
                }
                (Err(why), _) | (Ok(_), Err(why)) => {
                    refused += 1;
                    if refused <= MAX_PROBLEMS_PER_PLACE {
                        self.problem(&path.join(lossy(entry.file_name())), why.to_owned());
                    }
                }
            }
        }
        if refused > MAX_PROBLEMS_PER_PLACE {
            let more = refused - MAX_PROBLEMS_PER_PLACE;
            self.problem(path, format!("{more} more entries skipped: not what the kernel makes here"));
        }
        if past_cap > 0 {
            self.problem(path, format!("{past_cap} more entries past the first {max}: not read"));
        }
        Ok(kept)
    }

    /// Opens the directory `path` (its last component, under `parent`) without following a link:
    /// `None` when it is not there (silently) or is not a directory (reported).
    fn subdir(&mut self, parent: &OwnedFd, path: &Path) -> Option<OwnedFd> {
        let name = path.file_name()?;
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        match rustix::fs::openat(parent, name, flags, Mode::empty()) {
            Ok(fd) => Some(fd),
            Err(rustix::io::Errno::NOENT) => None,
            Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                self.problem(path, "a link or not a directory: not followed".to_owned());
                None
            }
            Err(e) => {
                self.problem(path, format!("cannot open: {}", io::Error::from(e)));
                None
            }
        }
    }

    /// Reads and parses `<dir>/stats`, a file of `kind`; `None` when it does not exist (any
    /// more), or cannot be read (reported).
    fn stats(&mut self, dir: &OwnedFd, dir_path: &Path, kind: ObjectKind) -> Option<StatsFile> {
        let path = dir_path.join("stats");
        // One left: the budget is spent; say so once, at the first file not read.
        match self.files {
            0 => return None,
            1 => {
                self.files = 0;
                let what = "the walk's file budget is spent: neither this file nor the rest is read";
                self.problem(&path, what.to_owned());
                return None;
            }
            _ => self.files -= 1,
        }
        let mut bytes = Vec::new();
        let read = open_file(dir).and_then(|f| f.take(MAX_FILE_BYTES as u64 + 1).read_to_end(&mut bytes));
        match read {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Err(e) => {
                self.problem(&path, format!("cannot read: {e}"));
                return None;
            }
        }
        let file = stats_file::parse(kind, &bytes, &mut self.unknown);
        if file.capped {
            self.problem(&path, format!("longer than {MAX_FILE_BYTES} bytes: the rest is not read"));
        }
        for s in file.skipped.iter().take(MAX_PROBLEMS_PER_PLACE) {
            self.problem(&path, format!("line {} skipped: {}", s.line, s.reason));
        }
        if let Some(more) = file.skipped.len().checked_sub(MAX_PROBLEMS_PER_PLACE).filter(|n| *n > 0) {
            self.problem(&path, format!("{more} more lines skipped"));
        }
        Some(file)
    }
}

/// Opens `<dir>/stats` read-only, without following a link or waiting on a FIFO; refuses
/// anything but a regular file.
fn open_file(dir: &OwnedFd) -> io::Result<File> {
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let file = File::from(rustix::fs::openat(dir.as_fd(), "stats", flags, Mode::empty())?);
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
    }
    Ok(file)
}

/// A directory entry's name for a message.
fn lossy(name: &CStr) -> String {
    String::from_utf8_lossy(name.to_bytes()).into_owned()
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
        assert_eq!(keys, [PartitionKey::Myself, PartitionKey::Id(1)]);
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
        let fifo = t.path().join("lp/1/stats");
        rustix::fs::mknodat(rustix::fs::CWD, &fifo, FileType::Fifo, Mode::from_raw_mode(0o600), 0).unwrap();
        let tree = read(t.path()).unwrap();
        assert!(tree.lps.is_empty());
        assert_eq!(tree.partitions.len(), 1);
        let text: Vec<String> = tree.problems.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 4, "{text:?}");
        assert!(
            text.iter().any(|p| p.ends_with("partition/0042: not a partition id (decimal, or self)")),
            "{text:?}"
        );
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
        assert_eq!(PartitionKey::parse("18446744073709551615"), Some(PartitionKey::Id(u64::MAX)));
    }

    #[test]
    fn no_link_below_the_root_is_followed() {
        let elsewhere = SyntheticTree::new("tree-elsewhere").unwrap();
        elsewhere.lp(0, &[("LpGlobalTime", 666)]).unwrap();
        elsewhere.partition("9", &[("PtGpaPages", 666)]).unwrap();
        elsewhere.vp("9", 0, &[("VpTotalRunTime", 666)]).unwrap();
        let t = SyntheticTree::new("tree-links").unwrap();
        t.lp(1, &[("LpGlobalTime", 1)]).unwrap();
        t.partition("2", &[("PtGpaPages", 2)]).unwrap();
        let link = |target: &Path, at: &str| std::os::unix::fs::symlink(target, t.path().join(at)).unwrap();
        // An LP, a partition and a VP directory that are links, and whole `vp` and `lp` levels.
        link(&elsewhere.path().join("lp/0"), "lp/0");
        link(&elsewhere.path().join("partition/9"), "partition/9");
        link(&elsewhere.path().join("partition/9/vp/0"), "partition/2/vp/0");
        let tree = read(t.path()).unwrap();
        assert_eq!(tree.lps.keys().copied().collect::<Vec<_>>(), [1]);
        assert_eq!(tree.partitions.keys().copied().collect::<Vec<_>>(), [PartitionKey::Id(2)]);
        assert!(tree.partitions[&PartitionKey::Id(2)].vps.is_empty());
        let text: Vec<String> = tree.problems.iter().map(ToString::to_string).collect();
        for at in ["lp/0", "partition/9", "partition/2/vp/0"] {
            assert!(
                text.iter().any(|p| p.ends_with(&format!("{at}: a link: not followed"))),
                "{at}: {text:?}"
            );
        }
        let levels = SyntheticTree::new("tree-link-levels").unwrap();
        std::os::unix::fs::symlink(elsewhere.path().join("lp"), levels.path().join("lp")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path().join("partition"), levels.path().join("partition"))
            .unwrap();
        let tree = read(levels.path()).unwrap();
        assert!(tree.lps.is_empty() && tree.partitions.is_empty());
        let text: Vec<String> = tree.problems.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 2, "{text:?}");
        assert!(text.iter().all(|p| p.ends_with("a link or not a directory: not followed")), "{text:?}");
    }

    #[test]
    fn no_numbered_directory_stands_in_for_self() {
        let t = SyntheticTree::new("tree-self").unwrap();
        t.partition("self", &[("PtGpaPages", 1)]).unwrap();
        t.partition("18446744073709551615", &[("PtGpaPages", 666)]).unwrap();
        let tree = read(t.path()).unwrap();
        assert_eq!(tree.partitions.keys().copied().collect::<Vec<_>>(), [PartitionKey::Myself]);
        assert_eq!(tree.partitions[&PartitionKey::Myself].stats.get("PtGpaPages"), Some(1));
        assert_eq!(tree.problems.len(), 1, "{:?}", tree.problems);
        assert!(
            tree.problems[0]
                .to_string()
                .ends_with("18446744073709551615: the id of `self`, beside `self`: refused")
        );
        // Without `self` (a kernel that prints every id in decimal), that id is a partition.
        t.remove_partition("self").unwrap();
        let tree = read(t.path()).unwrap();
        assert_eq!(tree.partitions.keys().copied().collect::<Vec<_>>(), [PartitionKey::Id(u64::MAX)]);
        assert!(tree.problems.is_empty(), "{:?}", tree.problems);
    }

    #[test]
    fn entries_the_kernel_does_not_make_take_no_place_under_the_caps() {
        let t = SyntheticTree::new("tree-caps").unwrap();
        // More junk than the cap, sorting before the real partitions, and files where
        // directories belong.
        for n in 0..MAX_PARTITIONS + 10 {
            std::fs::create_dir_all(t.path().join(format!("partition/0{n}"))).unwrap();
        }
        std::fs::write(t.path().join("partition/5"), b"").unwrap();
        t.partition("7", &[("PtGpaPages", 7)]).unwrap();
        t.partition("self", &[("PtGpaPages", 1)]).unwrap();
        let tree = read(t.path()).unwrap();
        let keys: Vec<_> = tree.partitions.keys().copied().collect();
        assert_eq!(keys, [PartitionKey::Myself, PartitionKey::Id(7)]);
        // A few are named, then counted; bounded either way.
        let text: Vec<String> = tree.problems.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), MAX_PROBLEMS_PER_PLACE + 1, "{text:?}");
        assert!(text.last().unwrap().contains(&format!("{} more entries skipped", MAX_PARTITIONS + 11 - 4)));
    }

    #[test]
    fn of_valid_entries_past_a_cap_the_lowest_are_read_and_the_rest_counted() {
        let t = SyntheticTree::new("tree-cap").unwrap();
        t.partition("self", &[("PtGpaPages", 1)]).unwrap();
        for id in (1..=MAX_PARTITIONS as u64 + 2).rev() {
            std::fs::create_dir_all(t.path().join(format!("partition/{id}"))).unwrap();
        }
        t.partition("3", &[("PtGpaPages", 3)]).unwrap();
        t.partition(&(MAX_PARTITIONS as u64 + 2).to_string(), &[("PtGpaPages", 9)]).unwrap();
        let tree = read(t.path()).unwrap();
        // `self` first, then ids 1..4095: the highest are left out.
        assert_eq!(
            tree.partitions.keys().copied().collect::<Vec<_>>(),
            [PartitionKey::Myself, PartitionKey::Id(3)]
        );
        let text: Vec<String> = tree.problems.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 1, "{text:?}");
        assert!(
            text[0]
                .ends_with(&format!("partition: 3 more entries past the first {MAX_PARTITIONS}: not read"))
        );
    }

    #[test]
    fn problems_are_bounded_however_bad_the_tree() {
        let t = SyntheticTree::new("tree-problems").unwrap();
        let bad: String = (0..500).map(|i| format!("bad line {i}\n")).collect();
        for n in 0..100 {
            t.write_raw(&format!("lp/{n}"), bad.as_bytes()).unwrap();
        }
        let tree = read(t.path()).unwrap();
        assert_eq!(tree.lps.len(), 100);
        assert_eq!(tree.problems.len(), MAX_PROBLEMS + 1);
        let last = tree.problems.last().unwrap().to_string();
        assert!(
            last.ends_with(&format!("{} more problems in this reading, not listed", 100 * 5 - MAX_PROBLEMS)),
            "{last}"
        );
    }
}
