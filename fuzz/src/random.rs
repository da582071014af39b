//! The reproducible input generator of the workspace tests that run the fuzz bodies on stable
//! Rust: splitmix64, dependency-free.

/// splitmix64.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Fewer than `max` random bytes.
    pub fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = (self.next() % max as u64) as usize;
        (0..n).map(|_| self.next() as u8).collect()
    }
}
