//! Trees in the kernel's exact format, written into a directory of one's own: what tests and
//! demonstrations read instead of a real `/sys/kernel/debug/mshv`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use hvstats_abi::ObjectKind;

use super::reference;

/// A tree under the system's temporary directory, removed on drop.
#[derive(Debug)]
pub struct SyntheticTree {
    root: PathBuf,
}

impl SyntheticTree {
    /// A fresh, empty `hvstats-mshv-<name>-<pid>-<n>` directory.
    ///
    /// # Errors
    /// When the directory cannot be created.
    pub fn new(name: &str) -> std::io::Result<Self> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let root = std::env::temp_dir().join(format!("hvstats-mshv-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root)?;
        Ok(Self { root })
    }

    /// The tree's root (what `--mshv` is given).
    pub fn path(&self) -> &Path {
        &self.root
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

    /// Writes `partition/<id>/stats` (`id` as the directory is named: decimal or `self`).
    ///
    /// # Errors
    /// When it cannot be written.
    pub fn partition(&self, id: &str, counters: &[(&str, u64)]) -> std::io::Result<()> {
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

    /// Writes `<dir>/stats` with one line per counter in the kernel's format, replacing the file
    /// at once (a reader never sees half of it).
    ///
    /// # Errors
    /// When it cannot be written.
    pub fn write(&self, kind: ObjectKind, dir: &str, counters: &[(&str, u64)]) -> std::io::Result<()> {
        let text: String = counters.iter().map(|(n, v)| reference::line(kind, n, *v)).collect();
        self.write_raw(dir, text.as_bytes())
    }

    /// Writes `<dir>/stats` with exactly `bytes` (for malformed files).
    ///
    /// # Errors
    /// When it cannot be written.
    pub fn write_raw(&self, dir: &str, bytes: &[u8]) -> std::io::Result<()> {
        let dir = self.root.join(dir);
        std::fs::create_dir_all(&dir)?;
        let tmp = dir.join(".stats.tmp");
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, dir.join("stats"))
    }
}

impl Drop for SyntheticTree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Every name of `kind`'s x86_64 table with the value `value(id)`, in id order: a whole file as
/// the kernel prints it.
pub fn full_file(kind: ObjectKind, value: impl Fn(u16) -> u64) -> Vec<(&'static str, u64)> {
    reference::names(kind).iter().map(|&(id, name)| (name, value(id))).collect()
}

/// The VP file of the build whose table lacks `VpLoadAvg` and prints `VpRootDispatchThreadBlocked`
/// at 201 (ids shifted from 202 on), values by the id that build gives each name.
pub fn shifted_vp_file(value: impl Fn(u16) -> u64) -> Vec<(&'static str, u64)> {
    reference::names(ObjectKind::Vp)
        .iter()
        .filter(|(_, name)| *name != "VpLoadAvg")
        .map(|&(id, name)| (name, value(if id > 201 { id - 1 } else { id })))
        .collect()
}
