//! What the hardware counter tests share: a private runtime directory and the configured PMU.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use hvstats_hwc::{Allocator, PmuShape};

/// A runtime directory removed when dropped.
pub struct TempRuntime(PathBuf);

impl TempRuntime {
    /// A fresh directory named after `what`.
    pub fn new(what: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("hvstats-{what}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempRuntime {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// 6 general-purpose + 3 fixed counters on each of 128 processors.
pub fn pmu_6_3_128() -> PmuShape {
    PmuShape::uniform(128, 6, 3).unwrap()
}

/// An allocator on `rt` with the 6 + 3 x 128 PMU.
pub fn allocator(rt: &TempRuntime) -> Allocator {
    Allocator::open(rt.path(), pmu_6_3_128()).unwrap()
}

/// One thing held on one processor, for the reference model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    /// The whole PMU.
    Whole,
    /// A counter.
    Counter(u32),
    /// The overflow interrupt.
    Overflow,
    /// The event buffer.
    EventBuffer,
    /// An identification tag.
    Tag(u32),
}

/// The keys a resource set holds on each of its processors.
pub fn keys(r: &hvstats_hwc::ResourceSet) -> Vec<Key> {
    if r.exclusive {
        return vec![Key::Whole];
    }
    let mut k: Vec<Key> = r.counter_indices().map(Key::Counter).collect();
    if r.overflow {
        k.push(Key::Overflow);
    }
    if r.event_buffer {
        k.push(Key::EventBuffer);
    }
    k.extend(r.tags.iter().map(|&t| Key::Tag(t)));
    k
}

/// A reference model of who holds what: per processor, the keys held and by which handle.
#[derive(Default)]
pub struct Model {
    held: std::collections::HashMap<u32, Vec<(Key, u64)>>,
    handles: std::collections::HashMap<u64, Vec<u32>>,
}

impl Model {
    /// Whether `keys` on `cpus` can be granted: nothing there when the whole PMU is asked for,
    /// nothing of the whole PMU held there, and no key held twice.
    pub fn can_grant(&self, cpus: &[u32], keys: &[Key]) -> bool {
        cpus.iter().all(|cpu| {
            let held = self.held.get(cpu).map(Vec::as_slice).unwrap_or(&[]);
            if keys.contains(&Key::Whole) {
                return held.is_empty();
            }
            held.iter().all(|(k, _)| *k != Key::Whole && !keys.contains(k))
        })
    }

    /// Records a grant; `Err` describes the double allocation when it cannot be granted.
    pub fn grant(&mut self, handle: u64, cpus: &[u32], keys: &[Key]) -> Result<(), String> {
        if !self.can_grant(cpus, keys) {
            return Err(format!("handle {handle}: {keys:?} on {cpus:?} is already held: {:?}", self.held));
        }
        if self.handles.insert(handle, cpus.to_vec()).is_some() {
            return Err(format!("handle {handle} granted twice"));
        }
        for &cpu in cpus {
            self.held.entry(cpu).or_default().extend(keys.iter().map(|&k| (k, handle)));
        }
        Ok(())
    }

    /// Releases `handle`; false when it is not held.
    pub fn release(&mut self, handle: u64) -> bool {
        let Some(cpus) = self.handles.remove(&handle) else { return false };
        for cpu in cpus {
            if let Some(v) = self.held.get_mut(&cpu) {
                v.retain(|(_, h)| *h != handle);
            }
        }
        true
    }

    /// The handles held.
    pub fn handles(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.handles.keys().copied().collect();
        v.sort_unstable();
        v
    }
}
