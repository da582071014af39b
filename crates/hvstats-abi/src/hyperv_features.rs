//! The Hyper-V enlightenments a VMM gives a VM (QEMU's `hv-*` CPU properties), as one word: a
//! bit per feature, and [`KNOWN`] set when the VMM's word on them was read (so that "the VM has
//! none" is told from "nobody knows").
//!
//! A dashboard uses it to tell a VM without Hyper-V counters because its guest is not enlightened
//! from one whose enlightened guest makes no hypercalls.

/// Set when the features are known (the word of a VM whose VMM said nothing is 0).
pub const KNOWN: u64 = 1 << 63;

/// The features, by bit: QEMU's property names (`target/i386/cpu.c`, `hv-*`; QEMU also takes
/// them with `_` for `-`).
pub const FEATURES: [&str; 23] = [
    "hv-relaxed",
    "hv-vapic",
    "hv-time",
    "hv-crash",
    "hv-reset",
    "hv-vpindex",
    "hv-runtime",
    "hv-synic",
    "hv-stimer",
    "hv-frequencies",
    "hv-reenlightenment",
    "hv-tlbflush",
    "hv-evmcs",
    "hv-ipi",
    "hv-stimer-direct",
    "hv-avic",
    "hv-syndbg",
    "hv-msr-bitmap",
    "hv-xmm-input",
    "hv-tlbflush-ext",
    "hv-tlbflush-direct",
    "hv-spinlocks",
    "hv-passthrough",
];

/// The bit of feature `name` (`hv-relaxed` or `hv_relaxed`), if it is one.
pub fn bit(name: &str) -> Option<u64> {
    let dash = |b: u8| if b == b'_' { b'-' } else { b };
    let same = |f: &str| f.len() == name.len() && f.bytes().zip(name.bytes()).all(|(a, b)| a == dash(b));
    FEATURES.iter().position(|f| same(f)).map(|i| 1 << i)
}

/// The names of the features in `word`, in bit order; `None` when `word` is not [`KNOWN`].
pub fn names(word: u64) -> Option<impl Iterator<Item = &'static str>> {
    (word & KNOWN != 0)
        .then(|| FEATURES.iter().enumerate().filter(move |(i, _)| word & (1 << i) != 0).map(|(_, f)| *f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_round_trip_by_name() {
        assert!(FEATURES.len() < 63);
        let word = KNOWN | bit("hv_relaxed").unwrap() | bit("hv-synic").unwrap();
        let mut found = names(word).unwrap();
        assert_eq!((found.next(), found.next(), found.next()), (Some("hv-relaxed"), Some("hv-synic"), None));
        assert_eq!(names(KNOWN).unwrap().count(), 0);
        assert!(names(0).is_none());
        assert_eq!(bit("hv-vendor-id"), None);
    }
}
