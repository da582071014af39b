//! A sequence counter in a stats page, for reading many counters from one moment.
//!
//! Counters the kernel keeps reach a VP page in merges that write dozens of values. A reader that
//! copies the page while a merge is under way can see half of it: an exit count from after the
//! merge beside its cost from before. hvstats' own group therefore holds a sequence counter that
//! every merge makes odd before its first store and even after its last ([`SeqWrite`]); a reader
//! copies what it needs between two loads of the counter and retries when they differ or are odd
//! ([`read`]). Writers pay two plain stores per merge and nothing per exit; a reader never blocks
//! a writer and gives up after a bounded number of tries or a bounded wait ([`read_while`]), so a
//! writer that died half-way cannot hang it.
//!
//! Writers of one page must be serialized (the VP page's merges already are, by a lock); the
//! sequence counter orders them against readers, not against each other.

use core::sync::atomic::{AtomicU64, Ordering, fence};

/// An open write: the sequence counter is odd until this is dropped.
#[must_use = "the write ends when this is dropped"]
#[derive(Debug)]
pub struct SeqWrite<'a> {
    seq: &'a AtomicU64,
    odd: u64,
}

impl<'a> SeqWrite<'a> {
    /// Makes `seq` odd: readers that started before will retry. Stores that follow are ordered
    /// after it for any reader that sees them.
    pub fn begin(seq: &'a AtomicU64) -> Self {
        let now = seq.load(Ordering::Relaxed);
        // Odd already only when an earlier write never ended; step past it to a new odd value.
        let odd = if now & 1 == 0 { now.wrapping_add(1) } else { now.wrapping_add(2) };
        seq.store(odd, Ordering::Relaxed);
        fence(Ordering::Release);
        Self { seq, odd }
    }
}

impl Drop for SeqWrite<'_> {
    fn drop(&mut self) {
        self.seq.store(self.odd.wrapping_add(1), Ordering::Release);
    }
}

/// What a [`read`] got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeqRead<T> {
    /// A copy from one moment: no write was under way while it was taken.
    Consistent {
        /// The copy.
        value: T,
        /// The (even) sequence number it was taken at.
        sequence: u64,
    },
    /// Every try overlapped a write (or a writer stopped half-way): the last copy, which may mix
    /// values from before and after a write.
    Torn {
        /// The last copy.
        value: T,
        /// How many copies were taken.
        tries: u32,
    },
}

impl<T> SeqRead<T> {
    /// The copy, consistent or not.
    pub fn into_value(self) -> T {
        match self {
            SeqRead::Consistent { value, .. } | SeqRead::Torn { value, .. } => value,
        }
    }

    /// True for a copy from one moment.
    pub fn is_consistent(&self) -> bool {
        matches!(self, SeqRead::Consistent { .. })
    }
}

/// Takes a copy with `copy` (relaxed loads of the values guarded by `seq`) between two loads of
/// `seq`, retrying up to `tries` times (at least once) until no write overlapped it.
pub fn read<T>(seq: &AtomicU64, tries: u32, copy: impl FnMut() -> T) -> SeqRead<T> {
    let mut left = tries.max(1);
    read_while(
        seq,
        || {
            left -= 1;
            core::hint::spin_loop();
            left > 0
        },
        copy,
    )
}

/// As [`read`], retrying for as long as `again` (called between tries, and free to wait) says
/// so: a reader with a clock waits out a writer preempted half-way instead of counting spins.
pub fn read_while<T>(
    seq: &AtomicU64,
    mut again: impl FnMut() -> bool,
    mut copy: impl FnMut() -> T,
) -> SeqRead<T> {
    let mut n = 0u32;
    loop {
        n = n.saturating_add(1);
        let before = seq.load(Ordering::Acquire);
        let value = copy();
        fence(Ordering::Acquire);
        let after = seq.load(Ordering::Relaxed);
        if before == after && before & 1 == 0 {
            return SeqRead::Consistent { value, sequence: before };
        }
        if !again() {
            return SeqRead::Torn { value, tries: n };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_makes_the_counter_odd_then_even() {
        let seq = AtomicU64::new(0);
        {
            let _w = SeqWrite::begin(&seq);
            assert_eq!(seq.load(Ordering::Relaxed), 1);
        }
        assert_eq!(seq.load(Ordering::Relaxed), 2);
        // A write that never ended (its writer died) leaves it odd; the next write steps past.
        seq.store(5, Ordering::Relaxed);
        drop(SeqWrite::begin(&seq));
        assert_eq!(seq.load(Ordering::Relaxed), 8);
    }

    #[test]
    fn a_read_outside_writes_is_consistent_and_inside_one_is_torn_after_its_tries() {
        let seq = AtomicU64::new(4);
        assert_eq!(read(&seq, 3, || 42), SeqRead::Consistent { value: 42, sequence: 4 });
        let w = SeqWrite::begin(&seq);
        let mut copies = 0;
        let r = read(&seq, 3, || {
            copies += 1;
            7
        });
        assert_eq!(r, SeqRead::Torn { value: 7, tries: 3 });
        assert_eq!(copies, 3);
        drop(w);
        assert!(read(&seq, 0, || ()).is_consistent());
    }

    #[test]
    fn a_write_during_the_copy_forces_a_retry() {
        let seq = AtomicU64::new(0);
        let mut first = true;
        let r = read(&seq, 10, || {
            if first {
                first = false;
                drop(SeqWrite::begin(&seq));
                return "during";
            }
            "after"
        });
        assert_eq!(r, SeqRead::Consistent { value: "after", sequence: 2 });
    }
}
