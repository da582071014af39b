//! Guest RAM: one anonymous mapping the VM sees at GPA 0.
//!
//! The host writes into guest RAM while VPs run (the hypercall page when a guest enables it,
//! hypercall output) and reads from it (hypercall input), concurrently with the guest's own
//! accesses. Every host access therefore goes through atomic byte cells, never through a plain
//! `&[u8]` or `copy_nonoverlapping`: a racing guest can change what the host reads or see a
//! write half done, as it could on hardware, but no host access is a data race.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::error::Error;
use hvstats_host::os as sys;

/// Guest RAM, mapped in this process and registered with KVM by the [`crate::gpa_map::GpaMap`].
#[derive(Debug)]
pub struct GuestRam {
    ptr: NonNull<u8>,
    size: u64,
}

// SAFETY: the mapping lives as long as the value and is not tied to a thread; every host access
// to it is an atomic byte access (see `cells`), so sharing it between threads (and with the
// guest) is sound.
unsafe impl Send for GuestRam {}
// SAFETY: as above: `&GuestRam` only ever gives atomic access to the bytes.
unsafe impl Sync for GuestRam {}

impl GuestRam {
    /// Maps `size` bytes (a multiple of 4 KiB) of zeroed anonymous memory.
    ///
    /// # Errors
    /// When the size is not page-aligned or mmap fails.
    pub fn new(size: u64) -> Result<Self, Error> {
        if size == 0 || !size.is_multiple_of(4096) {
            return Err(Error::MemorySize { bytes: size });
        }
        // SAFETY: anonymous private mapping at an address the kernel picks; checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        let ptr = sys::check_map(ptr).map_err(|source| Error::MapGuestRam { bytes: size, source })?;
        Ok(Self { ptr, size })
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Host address of GPA 0.
    pub fn host_address(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// The bytes at `gpa..gpa + len` as atomic cells, when they lie inside RAM.
    fn cells(&self, what: &'static str, gpa: u64, len: usize) -> Result<&[AtomicU8], Error> {
        match gpa.checked_add(len as u64) {
            Some(end) if end <= self.size => {
                // SAFETY: the range lies inside our mapping, which lives as long as `self`;
                // AtomicU8 has the size and alignment of u8, and the host never accesses guest RAM
                // other than through these cells, so the guest's concurrent accesses (outside the
                // Rust memory model) race with nothing but atomics.
                Ok(unsafe {
                    std::slice::from_raw_parts(self.ptr.as_ptr().add(gpa as usize).cast::<AtomicU8>(), len)
                })
            }
            _ => Err(Error::OutOfRam { what, gpa, len: len as u64, size: self.size }),
        }
    }

    /// Copies `bytes` to `gpa` (byte by byte; a guest running on another VP may see part of it).
    ///
    /// # Errors
    /// When the range is not inside RAM.
    pub fn write(&self, what: &'static str, gpa: u64, bytes: &[u8]) -> Result<(), Error> {
        for (cell, &b) in self.cells(what, gpa, bytes.len())?.iter().zip(bytes) {
            cell.store(b, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Copies `out.len()` bytes from `gpa` (a racing guest write only changes the bytes copied).
    ///
    /// # Errors
    /// When the range is not inside RAM.
    pub fn read(&self, gpa: u64, out: &mut [u8]) -> Result<(), Error> {
        let cells = self.cells("read", gpa, out.len())?;
        for (b, cell) in out.iter_mut().zip(cells) {
            *b = cell.load(Ordering::Relaxed);
        }
        Ok(())
    }

    /// Writes a little-endian u64 at `gpa`.
    ///
    /// # Errors
    /// When the range is not inside RAM.
    pub(crate) fn write_u64(&self, gpa: u64, value: u64) -> Result<(), Error> {
        self.write("table entry", gpa, &value.to_le_bytes())
    }
}

impl Drop for GuestRam {
    fn drop(&mut self) {
        // SAFETY: our mapping of `size` bytes, unmapped once; KVM's slot goes with the VM fd first
        // (the VM is dropped before the RAM in `GuestSpace`). A failure leaves nothing to undo.
        let _ = sys::check(unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.size as usize) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_read_back_and_ranges_outside_ram_are_refused() {
        let ram = GuestRam::new(2 * 4096).unwrap();
        ram.write("test", 4090, &[1, 2, 3, 4, 5, 6]).unwrap();
        let mut out = [0u8; 8];
        ram.read(4089, &mut out).unwrap();
        assert_eq!(out, [0, 1, 2, 3, 4, 5, 6, 0]);
        ram.write_u64(8, 0x1122_3344_5566_7788).unwrap();
        ram.read(8, &mut out).unwrap();
        assert_eq!(u64::from_le_bytes(out), 0x1122_3344_5566_7788);
        let err = ram.write("hypercall output", 8190, &[0; 4]).unwrap_err();
        assert!(matches!(err, Error::OutOfRam { what: "hypercall output", gpa: 8190, len: 4, size: 8192 }));
        assert!(ram.read(u64::MAX - 1, &mut out).is_err(), "an overflowing range is outside RAM");
        assert!(matches!(GuestRam::new(4095), Err(Error::MemorySize { bytes: 4095 })));
    }
}
