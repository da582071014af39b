//! A minimal `perf_event_open(2)` wrapper: counting events on one thread, alone or in a group.
//!
//! Shared by the KVM backend's counter sources (tracepoints, software events) and the hardware
//! counter allocator's guest-only PMU counters.
//!
//! Only counting is needed (no sampling, no ring buffer), so this is a file descriptor whose
//! `read` gives the count. Events opened into a group ([`PerfCounter::open_in_group`]) are read
//! together with one `read` of any of them ([`PerfCounter::read_group`]): one system call (and,
//! from another thread, one cross-CPU call) for the whole group instead of one per event.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `PERF_TYPE_HARDWARE`.
pub const TYPE_HARDWARE: u32 = 0;
/// `PERF_TYPE_SOFTWARE`.
pub const TYPE_SOFTWARE: u32 = 1;
/// `PERF_TYPE_TRACEPOINT`.
pub const TYPE_TRACEPOINT: u32 = 2;

/// `PERF_COUNT_SW_TASK_CLOCK`: CPU time of the thread, in nanoseconds.
pub const SW_TASK_CLOCK: u64 = 1;
/// `PERF_COUNT_SW_CPU_MIGRATIONS`: moves of the thread between CPUs.
pub const SW_CPU_MIGRATIONS: u64 = 4;

/// `PERF_COUNT_HW_CPU_CYCLES`.
pub const HW_CPU_CYCLES: u64 = 0;
/// `PERF_COUNT_HW_INSTRUCTIONS`.
pub const HW_INSTRUCTIONS: u64 = 1;
/// `perf_event_attr` flag bit `exclude_host`: count only while a guest runs.
pub const EXCLUDE_HOST: u64 = 1 << 19;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
/// `PERF_EVENT_IOC_SET_FILTER` = `_IOW('$', 6, char *)`.
const PERF_EVENT_IOC_SET_FILTER: libc::c_ulong = 0x4008_2406;
/// `PERF_EVENT_IOC_ID` = `_IOR('$', 7, u64 *)`.
const PERF_EVENT_IOC_ID: libc::c_ulong = 0x8008_2407;
/// `PERF_FORMAT_ID | PERF_FORMAT_GROUP`: a read gives `{ nr, { value, id }[nr] }`.
const GROUP_READ_FORMAT: u64 = (1 << 2) | (1 << 3);

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
        Self::open_with(type_, config, tid, 0, -1)
    }

    /// Opens event (`type_`, `config`) counting on thread `tid` (any CPU), enabled at once, as a
    /// member of `leader`'s group, or as the leader of a new group when `leader` is `None`. Group
    /// events are read with [`read_group`](Self::read_group). A group is scheduled as a unit,
    /// which is harmless for software and tracepoint events (they are always schedulable).
    ///
    /// # Errors
    /// What `perf_event_open` returns (as [`open`](Self::open); EINVAL when `leader` cannot take
    /// this event).
    pub fn open_in_group(
        type_: u32,
        config: u64,
        tid: libc::pid_t,
        leader: Option<&PerfCounter>,
    ) -> io::Result<Self> {
        let group_fd = leader.map_or(-1, |l| l.fd.as_raw_fd());
        Self::open_with(type_, config, tid, GROUP_READ_FORMAT, group_fd)
    }

    /// Opens event (`type_`, `config`) counting on thread `tid` only while it runs a guest
    /// (`exclude_host`).
    ///
    /// # Errors
    /// What `perf_event_open` returns (ENOENT for a hardware event on a machine without a PMU).
    pub fn open_guest_only(type_: u32, config: u64, tid: libc::pid_t) -> io::Result<Self> {
        Self::open_attr(type_, config, tid, 0, EXCLUDE_HOST, -1)
    }

    fn open_with(
        type_: u32,
        config: u64,
        tid: libc::pid_t,
        read_format: u64,
        group_fd: libc::c_int,
    ) -> io::Result<Self> {
        Self::open_attr(type_, config, tid, read_format, 0, group_fd)
    }

    fn open_attr(
        type_: u32,
        config: u64,
        tid: libc::pid_t,
        read_format: u64,
        flags: u64,
        group_fd: libc::c_int,
    ) -> io::Result<Self> {
        let attr = PerfEventAttr {
            type_,
            size: size_of::<PerfEventAttr>() as u32,
            config,
            read_format,
            flags,
            ..Default::default()
        };
        // SAFETY: `attr` is a valid perf_event_attr of the size it declares, alive for the call;
        // the kernel only reads it. We check the result before using it as an fd.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                &attr as *const PerfEventAttr,
                tid,
                -1 as libc::c_int,
                group_fd,
                PERF_FLAG_FD_CLOEXEC,
            )
        };
        let fd = crate::os::check_long(fd)?;
        // SAFETY: the kernel just returned this fd to us and nothing else owns it.
        Ok(Self { fd: unsafe { OwnedFd::from_raw_fd(fd as i32) } })
    }

    /// Sets an ftrace filter on a tracepoint event (e.g. `reg == 128`).
    ///
    /// # Errors
    /// EINVAL when the kernel rejects the expression.
    pub(crate) fn set_filter(&self, filter: &str) -> io::Result<()> {
        let c = std::ffi::CString::new(filter).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: our fd is a perf event; the argument is a NUL-terminated string alive for the call.
        crate::os::check(unsafe { libc::ioctl(self.fd.as_raw_fd(), PERF_EVENT_IOC_SET_FILTER, c.as_ptr()) })
            .map(drop)
    }

    /// The kernel's id of this event (it tags the event's value in a group read).
    ///
    /// # Errors
    /// When the ioctl fails.
    pub fn id(&self) -> io::Result<u64> {
        let mut id = 0u64;
        // SAFETY: our fd is a perf event; the kernel writes one u64 into `id`, which we own.
        crate::os::check(unsafe {
            libc::ioctl(self.fd.as_raw_fd(), PERF_EVENT_IOC_ID, &mut id as *mut u64)
        })?;
        Ok(id)
    }

    /// Reads every event of this event's group at once into `buf` as `{ nr, { value, id }[nr] }`
    /// and returns the words written (`1 + 2 * nr`). Only for events opened with
    /// [`open_in_group`](Self::open_in_group).
    ///
    /// # Errors
    /// When the read fails (ENOSPC: `buf` is too small for the group).
    pub fn read_group(&self, buf: &mut [u64]) -> io::Result<usize> {
        self.read_words(buf)
    }

    /// One `read` of the event into `buf`, retried when interrupted; the words written.
    fn read_words(&self, buf: &mut [u64]) -> io::Result<usize> {
        loop {
            // SAFETY: the kernel writes at most `size_of_val(buf)` bytes into `buf`, which we own
            // for the call; the fd is a perf event.
            let n = unsafe {
                libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), std::mem::size_of_val(buf))
            };
            match crate::os::check_long(n as libc::c_long) {
                Ok(n) if n >= 8 && n % 8 == 0 => return Ok(n as usize / 8),
                Ok(_) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The count so far (of an event opened alone, with [`open`](Self::open)).
    ///
    /// # Errors
    /// When the read fails or is short.
    pub fn read(&self) -> io::Result<u64> {
        let mut value = [0u64; 1];
        self.read_words(&mut value)?;
        Ok(value[0])
    }
}
