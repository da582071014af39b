//! A minimal `perf_event_open(2)` wrapper: one counting event on one thread.
//!
//! Only counting is needed (no sampling, no ring buffer), so this is a file descriptor whose
//! `read` gives the count.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `PERF_TYPE_SOFTWARE`.
pub const TYPE_SOFTWARE: u32 = 1;
/// `PERF_TYPE_TRACEPOINT`.
pub const TYPE_TRACEPOINT: u32 = 2;

const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
/// `PERF_EVENT_IOC_SET_FILTER` = `_IOW('$', 6, char *)`.
const PERF_EVENT_IOC_SET_FILTER: libc::c_ulong = 0x4008_2406;

/// `struct perf_event_attr` up to `config3` (PERF_ATTR_SIZE_VER8, 136 bytes).
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved2: u16,
    aux_sample_size: u32,
    reserved3: u32,
    sig_data: u64,
    config3: u64,
}

const _: () = assert!(size_of::<PerfEventAttr>() == 136);

/// One counting perf event attached to one thread.
#[derive(Debug)]
pub struct PerfCounter {
    fd: OwnedFd,
}

impl PerfCounter {
    /// Opens event (`type_`, `config`) counting on thread `tid` (any CPU), enabled at once.
    ///
    /// # Errors
    /// What `perf_event_open` returns (ENOENT for an event the machine lacks, EACCES without
    /// privilege).
    pub fn open(type_: u32, config: u64, tid: libc::pid_t) -> io::Result<Self> {
        let attr =
            PerfEventAttr { type_, size: size_of::<PerfEventAttr>() as u32, config, ..Default::default() };
        // SAFETY: `attr` is a valid perf_event_attr of the size it declares, alive for the call;
        // the kernel only reads it. We check the result before using it as an fd.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                &attr as *const PerfEventAttr,
                tid,
                -1 as libc::c_int,
                -1 as libc::c_int,
                PERF_FLAG_FD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned this fd to us and nothing else owns it.
        Ok(Self { fd: unsafe { OwnedFd::from_raw_fd(fd as i32) } })
    }

    /// Sets an ftrace filter on a tracepoint event (e.g. `reg == 128`).
    ///
    /// # Errors
    /// EINVAL when the kernel rejects the expression.
    pub fn set_filter(&self, filter: &str) -> io::Result<()> {
        let c = std::ffi::CString::new(filter).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: our fd is a perf event; the argument is a NUL-terminated string alive for the call.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), PERF_EVENT_IOC_SET_FILTER, c.as_ptr()) };
        if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }

    /// The count so far.
    ///
    /// # Errors
    /// When the read fails or is short.
    pub fn read(&self) -> io::Result<u64> {
        let mut value = 0u64;
        // SAFETY: we read at most 8 bytes into a u64 we own; the fd is a perf event.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), (&mut value as *mut u64).cast(), 8) };
        if n != 8 {
            return Err(if n < 0 {
                io::Error::last_os_error()
            } else {
                io::Error::from(io::ErrorKind::UnexpectedEof)
            });
        }
        Ok(value)
    }
}
