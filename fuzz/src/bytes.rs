//! A fuzz input read one field at a time, shared by the targets that build structured requests
//! from raw bytes.

/// Bytes taken one field at a time (little-endian); zeros once they run out.
pub struct Bytes<'a>(pub &'a [u8]);

impl Bytes<'_> {
    /// The next byte, or 0.
    pub fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    /// The next two bytes as a size.
    pub fn u16(&mut self) -> usize {
        usize::from(self.u8()) | usize::from(self.u8()) << 8
    }

    /// The next four bytes.
    pub fn u32(&mut self) -> u32 {
        (0..4).fold(0, |v, i| v | u32::from(self.u8()) << (8 * i))
    }

    /// The next eight bytes.
    pub fn u64(&mut self) -> u64 {
        (0..8).fold(0, |v, i| v | u64::from(self.u8()) << (8 * i))
    }

    /// The next `n` bytes (fewer when fewer are left).
    pub fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }

    /// True once every byte was taken.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
