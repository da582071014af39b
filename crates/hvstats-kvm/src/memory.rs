//! Guest RAM: one anonymous mapping the VM sees at GPA 0.

use std::ptr::NonNull;

use crate::error::Error;

/// Guest RAM, mapped in this process and registered with KVM by the [`crate::gpa_map::GpaMap`].
#[derive(Debug)]
pub struct GuestRam {
    ptr: NonNull<u8>,
    size: u64,
}

// SAFETY: the mapping lives as long as the value; the host only writes it before VPs run, and
// concurrent guest access is the guest's business (it is plain memory to us).
unsafe impl Send for GuestRam {}
// SAFETY: as above.
unsafe impl Sync for GuestRam {}

impl GuestRam {
    /// Maps `size` bytes (a multiple of 4 KiB) of zeroed anonymous memory.
    ///
    /// # Errors
    /// When the size is not page-aligned or mmap fails.
    pub fn new(size: u64) -> Result<Self, Error> {
        if size == 0 || size % 4096 != 0 {
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
        if ptr == libc::MAP_FAILED {
            return Err(Error::Host { op: "mmap of guest RAM", source: std::io::Error::last_os_error() });
        }
        let ptr = NonNull::new(ptr.cast()).ok_or_else(|| Error::Host {
            op: "mmap of guest RAM",
            source: std::io::Error::other("mmap returned a null mapping"),
        })?;
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

    fn check(&self, what: &'static str, gpa: u64, len: usize) -> Result<(), Error> {
        match gpa.checked_add(len as u64) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(Error::OutOfRam { what, gpa, len: len as u64, size: self.size }),
        }
    }

    /// Copies `bytes` to `gpa`.
    ///
    /// # Errors
    /// When the range is not inside RAM.
    pub fn write(&self, what: &'static str, gpa: u64, bytes: &[u8]) -> Result<(), Error> {
        self.check(what, gpa, bytes.len())?;
        // SAFETY: the range was checked to lie inside our mapping; `bytes` cannot overlap it (it is
        // host memory we did not hand out).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.as_ptr().add(gpa as usize), bytes.len())
        };
        Ok(())
    }

    /// Copies `out.len()` bytes from `gpa`.
    ///
    /// # Errors
    /// When the range is not inside RAM.
    pub fn read(&self, gpa: u64, out: &mut [u8]) -> Result<(), Error> {
        self.check("read", gpa, out.len())?;
        // SAFETY: range checked; a racing guest write only changes the bytes we copy.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(gpa as usize), out.as_mut_ptr(), out.len())
        };
        Ok(())
    }

    /// Writes a little-endian u64 at `gpa`.
    ///
    /// # Errors
    /// When the range is not inside RAM.
    pub fn write_u64(&self, gpa: u64, value: u64) -> Result<(), Error> {
        self.write("table entry", gpa, &value.to_le_bytes())
    }
}

impl Drop for GuestRam {
    fn drop(&mut self) {
        // SAFETY: our mapping of `size` bytes; KVM's slot is removed with the VM fd first (the VM
        // is dropped before the RAM in `Partition`).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.size as usize) };
    }
}
