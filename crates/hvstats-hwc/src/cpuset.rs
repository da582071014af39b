//! Sets of Linux CPU numbers, and their meeting point with Windows processor groups.
//!
//! Windows names a processor by (group, bit) with 64 processors per group; hvstats maps group `g`
//! bit `b` onto Linux CPU `64 * g + b`. Sets print and parse in the kernel's cpulist form
//! (`0-3,8,10-11`), which is also how the allocation table stores them.

use std::collections::BTreeSet;
use std::fmt;

use hvstats_abi::hal::GroupAffinity;

use super::pmu::MAX_PROCESSORS;

/// Processors per processor group.
pub const GROUP_SIZE: u32 = 64;

/// A set of Linux CPU numbers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CpuSet {
    /// One bit per CPU, 64 CPUs (one processor group) per word.
    words: Vec<u64>,
}

/// A cpulist that cannot be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("bad CPU list {text:?}: {reason}")]
pub struct CpuListError {
    /// The cpulist text as given (e.g. `0-3,8`).
    pub text: String,
    /// What is wrong with it.
    pub reason: String,
}

impl CpuSet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// CPUs `0..n`.
    pub fn first(n: u32) -> Self {
        let mut s = Self::new();
        for cpu in 0..n {
            s.insert(cpu);
        }
        s
    }

    /// Adds `cpu`.
    pub fn insert(&mut self, cpu: u32) {
        let word = (cpu / GROUP_SIZE) as usize;
        if self.words.len() <= word {
            self.words.resize(word + 1, 0);
        }
        self.words[word] |= 1 << (cpu % GROUP_SIZE);
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: u32) -> bool {
        self.words.get((cpu / GROUP_SIZE) as usize).is_some_and(|w| w & (1 << (cpu % GROUP_SIZE)) != 0)
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// The number of CPUs in the set.
    pub fn len(&self) -> u32 {
        self.words.iter().map(|w| w.count_ones()).sum()
    }

    /// Whether the two sets share a CPU.
    pub fn intersects(&self, other: &Self) -> bool {
        self.words.iter().zip(&other.words).any(|(a, b)| a & b != 0)
    }

    /// Whether every CPU of `other` is in this set.
    pub(crate) fn is_superset(&self, other: &Self) -> bool {
        other.words.iter().enumerate().all(|(i, &b)| b & !self.words.get(i).copied().unwrap_or(0) == 0)
    }

    /// The CPUs in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| {
            (0..GROUP_SIZE).filter(move |b| w & (1 << b) != 0).map(move |b| i as u32 * GROUP_SIZE + b)
        })
    }

    /// The highest CPU, if any.
    pub fn max(&self) -> Option<u32> {
        self.iter().last()
    }

    /// The set as `GROUP_AFFINITY` entries, one per nonempty group.
    pub fn to_group_affinities(&self) -> Vec<GroupAffinity> {
        self.words
            .iter()
            .enumerate()
            .filter(|(_, w)| **w != 0)
            .map(|(g, &w)| GroupAffinity::new(g as u16, w))
            .collect()
    }

    /// Parses a cpulist (`0-3,8`); at most `limit` is accepted as a CPU number, to bound memory.
    ///
    /// # Errors
    /// On empty text, bad numbers, inverted ranges or numbers above `limit`.
    pub fn parse(text: &str, limit: u32) -> Result<Self, CpuListError> {
        let bad = |reason: String| CpuListError { text: text.to_owned(), reason };
        let mut set = Self::new();
        if text.trim().is_empty() {
            return Err(bad("empty".into()));
        }
        let num = |s: &str| -> Result<u32, CpuListError> {
            let n: u32 = s.trim().parse().map_err(|_| bad(format!("{s:?} is not a CPU number")))?;
            if n > limit {
                return Err(bad(format!("CPU {n} is above {limit}")));
            }
            Ok(n)
        };
        for item in text.split(',') {
            let (a, b) = match item.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => {
                    let n = num(item)?;
                    (n, n)
                }
            };
            if a > b {
                return Err(bad(format!("range {a}-{b} is inverted")));
            }
            for cpu in a..=b {
                set.insert(cpu);
            }
        }
        Ok(set)
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<T: IntoIterator<Item = u32>>(iter: T) -> Self {
        let mut s = Self::new();
        for cpu in iter {
            s.insert(cpu);
        }
        s
    }
}

impl fmt::Display for CpuSet {
    /// The kernel's cpulist form; `-` for the empty set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cpus: BTreeSet<u32> = self.iter().collect();
        if cpus.is_empty() {
            return f.write_str("-");
        }
        let mut first = true;
        let mut iter = cpus.iter().copied().peekable();
        while let Some(start) = iter.next() {
            let mut end = start;
            while iter.peek() == Some(&(end + 1)) {
                end = iter.next().unwrap_or(end);
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end { write!(f, "{start}")? } else { write!(f, "{start}-{end}")? }
        }
        Ok(())
    }
}

impl serde::Serialize for CpuSet {
    /// As a cpulist string.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for CpuSet {
    /// From a cpulist string; CPU numbers are bounded by [`MAX_PROCESSORS`].
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text, MAX_PROCESSORS - 1).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulist_round_trips() {
        let s = CpuSet::parse("0-3,8,63-65,127", 1000).unwrap();
        assert_eq!(s.to_string(), "0-3,8,63-65,127");
        assert_eq!(s.len(), 9);
        assert!(s.contains(64) && !s.contains(66));
        assert_eq!(s.max(), Some(127));
        assert_eq!(
            s.to_group_affinities(),
            vec![GroupAffinity::new(0, 0b1_0000_1111 | 1 << 63), GroupAffinity::new(1, 0b11 | 1 << 63)]
        );
        assert_eq!(CpuSet::new().to_string(), "-");
    }

    #[test]
    fn cpulist_rejects_bad_text() {
        for text in ["", "a", "3-1", "1,,2", "5000", "-1"] {
            assert!(CpuSet::parse(text, 1000).is_err(), "{text:?}");
        }
    }

    #[test]
    fn set_relations() {
        let a: CpuSet = [1, 70].into_iter().collect();
        let b: CpuSet = [70].into_iter().collect();
        let c: CpuSet = [2].into_iter().collect();
        assert!(a.intersects(&b) && !a.intersects(&c));
        assert!(a.is_superset(&b) && !b.is_superset(&a) && !a.is_superset(&c));
    }
}
