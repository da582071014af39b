//! Which of a process's descriptors are KVM VMs, found in the kernel: where reading them from
//! `/proc/PID/fd` costs a `readlink` of every descriptor the process holds (the kernel makes and
//! drops an inode and a dentry for each, a few µs apiece), one run of a task-file iterator
//! linked to the process looks at each of its open files and gives the descriptors whose file
//! is a VM, in a few system calls whatever the number of descriptors.
//!
//! A VM's file is told by its operations (`file->f_op`): KVM gives every VM file the same
//! `kvm_vm_fops`, and nothing else has them. The program takes them from a VM file this process
//! holds (its descriptor in the state map), so no address of the kernel's is known here, and a
//! KVM module loaded anew (other operations) is compared with its own:
//!
//! ```text
//! file = ctx->file; if !file: return 0                        // the walk's last call
//! if !state.ops:                                              // the run's first file
//!     ours = current->files->fdt->fd[state.own_fd]; if !ours: return 0
//!     state.ops = ours->f_op
//! if file->f_op == state.ops:
//!     bpf_seq_write(ctx->meta->seq, &(u64)ctx->fd, 8)
//! ```
//!
//! The iterator (`bpf_iter_task_file`, its process filter since Linux 6.1) visits each file of
//! the process once (threads that share their leader's table are skipped), under the RCU read
//! lock, with the files' references held. What it gives is a moment's reading, as
//! `/proc/PID/fd` is: a caller compares each descriptor with its own VM by `kcmp(2)`.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::{Mutex, OnceLock};

use super::btf::Member;
use super::insn::{
    Asm, AsmError, Cond, HELPER_GET_CURRENT_TASK, HELPER_SEQ_WRITE, R0, R1, R2, R3, R6, R7, R8, R9, R10, Size,
};
use super::listed_tasks::{lookup, probe_read, stack_ptr};
use super::sys::{ArrayMap, Program, TaskIterLink};
use super::task_iter::{TaskIterError, file_at};

/// The most VM descriptors a reading gives (8 bytes each): past them it is not taken, and the
/// caller reads `/proc` instead.
const MAX_VMS: u64 = 4096;

/// `struct bpf_iter__task_file`: the seq_file's meta, the task, the descriptor, the file.
const CTX_META: i16 = 0;
const CTX_FD: i16 = 16;
const CTX_FILE: i16 = 24;

/// The state: this process's descriptor of its VM (u32, then 4 bytes unused), and the
/// operations of its file (u64), 0 until the run's first file found them.
const STATE_BYTES: usize = 16;
const STATE_OPS: i16 = 8;

/// The program's stack: the map key, a read's landing slot, the two files, the descriptor.
const KEY: i16 = -8;
const TMP: i16 = -16;
const THEIRS: i16 = -24;
const OURS: i16 = -32;
const FD: i16 = -40;

/// The program, loaded, with its state (this process's descriptor of a VM to compare with).
#[derive(Debug)]
pub struct VmFiles {
    program: Program,
    state: ArrayMap,
    buf: Vec<u8>,
}

impl VmFiles {
    /// Assembles the program for the running kernel and loads it.
    ///
    /// # Errors
    /// Where the kernel lacks the task-file iterator or the members it reads, or refuses it.
    fn load() -> Result<Self, TaskIterError> {
        let task = super::task_iter::shared().ok_or(TaskIterError::Unsupported("task iterator"))?.layout;
        let path = task.path.ok_or(TaskIterError::Unsupported("a path from a task to its files"))?;
        let (iter, f_op) = task.task_files.ok_or(TaskIterError::Unsupported("task-file iterator"))?;
        let state = ArrayMap::create(STATE_BYTES, 1, false).map_err(TaskIterError::Link)?;
        let insns = assemble(&path, f_op, state.raw_fd())?;
        let program = Program::load_task_iter(&insns, iter)?;
        Ok(Self { program, state, buf: Vec::new() })
    }

    /// The descriptors of process `pid` whose file is a KVM VM, as `ours` (this process's
    /// descriptor of a VM) is, ascending.
    ///
    /// # Errors
    /// What linking, running or reading the iterator returns, and `InvalidData` where it gives
    /// more than [`MAX_VMS`]. A process gone gives none, or an error (`ESRCH`).
    pub fn of_process(&mut self, pid: i32, ours: BorrowedFd<'_>) -> io::Result<Vec<u32>> {
        let own = u32::try_from(ours.as_raw_fd()).map_err(|_| io::ErrorKind::InvalidInput)?;
        // The operations are found anew by this run: none kept from the last.
        let mut state = [0u8; STATE_BYTES];
        state[..4].copy_from_slice(&own.to_ne_bytes());
        self.state.write(0, &state)?;
        let link = TaskIterLink::of_process(&self.program, pid)?;
        link.walk(&mut self.buf, 8 * (MAX_VMS + 1))?;
        if self.buf.len() as u64 > 8 * MAX_VMS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("more than {MAX_VMS} VM descriptors"),
            ));
        }
        let mut fds: Vec<u32> = self
            .buf
            .chunks_exact(8)
            .filter_map(|b| u32::try_from(u64::from_ne_bytes(b.try_into().unwrap_or_default())).ok())
            .collect();
        fds.sort_unstable();
        if !fds.is_empty() {
            FOUND.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(fds)
    }
}

/// Readings of the program that found a VM, this process's life long.
static FOUND: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many readings of a process's descriptors by the program found a VM, this process's life
/// long.
pub fn found() -> u64 {
    FOUND.load(std::sync::atomic::Ordering::Relaxed)
}

/// The program this process shares, loaded at the first call; `None` where it cannot be (the
/// caller reads `/proc` then, as before).
pub fn shared() -> Option<&'static Mutex<VmFiles>> {
    static SHARED: OnceLock<Option<Mutex<VmFiles>>> = OnceLock::new();
    SHARED.get_or_init(|| VmFiles::load().ok().map(Mutex::new)).as_ref()
}

/// The descriptors of process `pid` whose file is a KVM VM, as `ours` is (see
/// [`VmFiles::of_process`]); `None` where the kernel cannot tell.
pub fn vm_fds(pid: i32, ours: BorrowedFd<'_>) -> Option<io::Result<Vec<u32>>> {
    let shared = shared()?;
    Some(shared.lock().unwrap_or_else(|e| e.into_inner()).of_process(pid, ours))
}

/// The program (see the module's text), with `path` from a task to its files, and `f_op`, the
/// operations' place in `struct file`.
fn assemble(path: &[Member; 4], f_op: Member, state: i32) -> Result<Vec<u64>, AsmError> {
    let f_op = i32::try_from(f_op.offset).map_err(|_| AsmError::TooFar)?;
    let mut a = Asm::default();
    let out = a.label();
    a.mov(R6, R1);
    a.load(Size::Dw, R1, R6, CTX_FILE);
    a.jump_imm(Cond::Eq, R1, 0, out);
    // Their file's operations, read as the iterator holds it.
    probe_read(&mut a, THEIRS, 8, R1, f_op);
    a.jump_imm(Cond::Ne, R0, 0, out);
    a.load(Size::W, R1, R6, CTX_FD);
    a.store(Size::Dw, R10, FD, R1);
    // Ours: this process's VM's operations, found by the run's first file through the
    // descriptor the state names, and kept in the state for the run's others.
    let compare = a.label();
    lookup(&mut a, state, KEY, None);
    a.jump_imm(Cond::Eq, R0, 0, out);
    a.mov(R8, R0);
    a.load(Size::Dw, R1, R8, STATE_OPS);
    a.store(Size::Dw, R10, OURS, R1);
    a.jump_imm(Cond::Ne, R1, 0, compare);
    a.load(Size::W, R9, R8, 0);
    a.call(HELPER_GET_CURRENT_TASK);
    a.mov(R7, R0);
    file_at(&mut a, R7, R9, path, TMP, OURS, out)?;
    a.load(Size::Dw, R1, R10, OURS);
    a.jump_imm(Cond::Eq, R1, 0, out);
    probe_read(&mut a, OURS, 8, R1, f_op);
    a.jump_imm(Cond::Ne, R0, 0, out);
    a.load(Size::Dw, R1, R10, OURS);
    a.store(Size::Dw, R8, STATE_OPS, R1);
    a.bind(compare);
    a.load(Size::Dw, R1, R10, THEIRS);
    a.load(Size::Dw, R2, R10, OURS);
    a.jump_imm(Cond::Eq, R1, 0, out);
    a.jump_reg(Cond::Ne, R1, R2, out);
    a.load(Size::Dw, R1, R6, CTX_META);
    a.load(Size::Dw, R1, R1, 0); // meta->seq
    stack_ptr(&mut a, R2, FD);
    a.mov_imm(R3, 8);
    a.call(HELPER_SEQ_WRITE);
    a.bind(out);
    a.mov_imm(R0, 0);
    a.exit();
    a.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    use std::process::{Command, Stdio};

    /// `KVM_CREATE_VM`, `KVM_CREATE_VCPU`.
    const CREATE_VM: libc::c_ulong = 0xAE01;
    const CREATE_VCPU: libc::c_ulong = 0xAE41;

    fn ioctl(fd: &impl AsRawFd, request: libc::c_ulong, arg: libc::c_ulong) -> OwnedFd {
        // SAFETY: a KVM ioctl that takes an integer argument and returns a new descriptor.
        let r = unsafe { libc::ioctl(fd.as_raw_fd(), request, arg) };
        assert!(r >= 0, "ioctl {request:#x}: {}", io::Error::last_os_error());
        // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
        unsafe { OwnedFd::from_raw_fd(r) }
    }

    #[test]
    fn the_descriptors_of_a_processs_vms_are_found_and_no_other() {
        let kvm = match std::fs::File::options().read(true).write(true).open("/dev/kvm") {
            Ok(kvm) => kvm,
            Err(e) => {
                assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "/dev/kvm: {e}");
                return;
            }
        };
        let Some(shared) = shared() else {
            assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "no task-file iterator");
            return;
        };
        let (vm, other) = (ioctl(&kvm, CREATE_VM, 0), ioctl(&kvm, CREATE_VM, 0));
        let vcpu = ioctl(&vm, CREATE_VCPU, 0);
        // SAFETY: eventfd takes two integers and returns a new descriptor or -1.
        let event = unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, libc::EFD_CLOEXEC)) };
        let fd = |f: &OwnedFd| f.as_raw_fd() as u32;
        let me = std::process::id() as i32;
        let found = shared.lock().unwrap().of_process(me, vm.as_fd()).unwrap();
        // Other tests of this process may hold VMs of their own meanwhile: these are found too.
        assert!(found.contains(&fd(&vm)) && found.contains(&fd(&other)), "{found:?}");
        for not in [fd(&vcpu), fd(&event), kvm.as_raw_fd() as u32] {
            assert!(!found.contains(&not), "descriptor {not} is no VM: {found:?}");
        }
        assert!(found.is_sorted());

        // Another process: a child given the VM at descriptor 7, and one holding none.
        let mut holder = Command::new("sh");
        holder.args(["-c", "exec sleep 30"]).stdin(Stdio::null());
        let raw = vm.as_raw_fd();
        // SAFETY: between fork and exec only dup2 or fcntl, which are async-signal-safe, are called.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut holder, move || {
                // The VM may be at 7 already (as other tests' descriptors come and go): dup2 onto
                // itself leaves its close-on-exec flag set, so the flag is cleared instead.
                let done = match raw {
                    7 => libc::fcntl(7, libc::F_SETFD, 0),
                    _ => libc::dup2(raw, 7),
                };
                if done < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
            });
        }
        let mut holder = holder.spawn().unwrap();
        let mut none = Command::new("sleep").arg("30").stdin(Stdio::null()).spawn().unwrap();
        // A child holds a copy of this process's descriptors until its `exec` closes them,
        // which may be after `spawn` returns: until then it holds those VMs too.
        exec_done(holder.id(), 1);
        exec_done(none.id(), 0);
        let mut files = shared.lock().unwrap();
        assert_eq!(files.of_process(holder.id() as i32, vm.as_fd()).unwrap(), [7]);
        assert_eq!(files.of_process(none.id() as i32, vm.as_fd()).unwrap(), Vec::<u32>::new());
        // Compared with this process's VM whatever descriptor it is at: the other one's too.
        assert_eq!(files.of_process(holder.id() as i32, other.as_fd()).unwrap(), [7]);
        // A descriptor of ours that is no VM finds nothing of the kind.
        assert_eq!(files.of_process(holder.id() as i32, event.as_fd()).unwrap(), Vec::<u32>::new());
        for child in [&mut holder, &mut none] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
        // A process gone holds none.
        assert!(files.of_process(holder.id() as i32, vm.as_fd()).is_ok_and(|fds| fds.is_empty()));
    }

    /// Waits until process `pid` holds `vms` descriptors `/proc` names as KVM VMs: its `exec`
    /// closed what it had of this process's.
    fn exec_done(pid: u32, vms: usize) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let held = std::fs::read_dir(format!("/proc/{pid}/fd"))
                .unwrap()
                .flatten()
                .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:kvm-vm"))
                .count();
            if held == vms {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "pid {pid} holds {held} VMs, not {vms}");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}
