//! Fake `/proc` and debugfs trees for the observer's discovery.

#![allow(dead_code)]
// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

#[allow(unused_imports, reason = "not every test file uses each of them")]
pub use hvstats_testkit::{TempDir, kvm_available};

/// One fake process in a fake procfs.
pub struct FakeProcess {
    dir: PathBuf,
}

impl FakeProcess {
    /// Creates `/proc/<pid>` with a command line, a name and a live status.
    pub fn new(proc_root: &Path, pid: i32, cmdline: &[&str], comm: &str) -> Self {
        let dir = proc_root.join(pid.to_string());
        fs::create_dir_all(dir.join("fd")).unwrap();
        fs::create_dir_all(dir.join("task")).unwrap();
        let mut raw = Vec::new();
        for a in cmdline {
            raw.extend_from_slice(a.as_bytes());
            raw.push(0);
        }
        fs::write(dir.join("cmdline"), raw).unwrap();
        fs::write(dir.join("comm"), format!("{comm}\n")).unwrap();
        let me = Self { dir };
        me.set_state('S');
        me.set_start_time(pid, comm, 1000);
        me
    }

    /// `stat` of the process with start time `ticks` (field 22); every other field 0.
    pub fn set_start_time(&self, pid: i32, comm: &str, ticks: u64) {
        let mut fields: Vec<String> = (3..=52).map(|_| "0".to_owned()).collect();
        fields[0] = "S".to_owned();
        fields[22 - 3] = ticks.to_string();
        fs::write(self.dir.join("stat"), format!("{pid} ({comm}) {}\n", fields.join(" "))).unwrap();
    }

    pub fn set_state(&self, state: char) {
        fs::write(self.dir.join("status"), format!("Name:\tx\nState:\t{state} (x)\n")).unwrap();
    }

    /// `fd/<n> -> target` (a dangling link, as `anon_inode:` links are).
    pub fn fd(&self, n: u32, target: &str) -> &Self {
        symlink(target, self.dir.join("fd").join(n.to_string())).unwrap();
        self
    }

    /// `task/<tid>/comm` and a `stat` with guest time `guest_ticks` (field 43).
    pub fn thread(&self, tid: i32, comm: &str, guest_ticks: u64) -> &Self {
        let t = self.dir.join("task").join(tid.to_string());
        fs::create_dir_all(&t).unwrap();
        fs::write(t.join("comm"), format!("{comm}\n")).unwrap();
        self.set_guest_ticks(tid, comm, guest_ticks);
        self
    }

    /// `task/<tid>/schedstat`: the real one of this process's thread `tid` (a link to it).
    pub fn real_schedstat(&self, tid: i32) -> &Self {
        let real = format!("/proc/{}/task/{tid}/schedstat", std::process::id());
        symlink(real, self.dir.join("task").join(tid.to_string()).join("schedstat")).unwrap();
        self
    }

    pub fn set_guest_ticks(&self, tid: i32, comm: &str, guest_ticks: u64) {
        // Fields 3..=52 after "(comm)"; field 43 is guest time.
        let mut fields: Vec<String> = (3..=52).map(|_| "0".to_owned()).collect();
        fields[0] = "S".to_owned();
        fields[43 - 3] = guest_ticks.to_string();
        let stat = format!("{tid} ({comm}) {}\n", fields.join(" "));
        fs::write(self.dir.join("task").join(tid.to_string()).join("stat"), stat).unwrap();
    }
}

/// `kvm/<pid>-<vmfd>/vcpu<N>/pid` in a fake debugfs.
pub fn debugfs_vcpu(debugfs: &Path, pid: i32, vm_fd: u32, vcpu: u32, tid: i32) {
    let d = debugfs.join("kvm").join(format!("{pid}-{vm_fd}")).join(format!("vcpu{vcpu}"));
    fs::create_dir_all(&d).unwrap();
    fs::write(d.join("pid"), format!("{tid}\n")).unwrap();
}

/// A QEMU child (paused, with a QMP socket), killed on drop.
pub struct Qemu {
    pub child: std::process::Child,
    pub qmp: PathBuf,
}

impl Qemu {
    /// Starts `qemu-system-x86_64 -accel <accel> -S` with a QMP socket `<dir>/<tag>.sock` and
    /// `extra` arguments; `None` (printing why) when QEMU is not installed outside CI.
    pub fn start(dir: &Path, tag: &str, accel: &str, extra: &[&str]) -> Option<Self> {
        use std::process::{Command, Stdio};
        use std::time::{Duration, Instant};
        let qmp = dir.join(format!("{tag}.sock"));
        let child = hvstats_testkit::spawn_qemu(
            Command::new("qemu-system-x86_64")
                .args(["-accel", accel, "-S", "-display", "none", "-nodefaults", "-m", "16"])
                .arg("-qmp")
                .arg(format!("unix:{},server=on,wait=off", qmp.display()))
                .args(extra)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
            tag,
        )?;
        let mut me = Self { child, qmp };
        let t = Instant::now();
        while !me.qmp.exists() {
            if let Ok(Some(status)) = me.child.try_wait() {
                panic!("QEMU exited at start: {status}");
            }
            assert!(t.elapsed() < Duration::from_secs(30), "QEMU did not create its QMP socket");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(me)
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// A QMP session on the control socket. QEMU creates the socket file before it listens on
    /// it: a refused connection is tried again for up to 10 s.
    pub fn connect(&self) -> hvstats_vmm::qmp::Qmp {
        use std::time::{Duration, Instant};
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match hvstats_vmm::qmp::Qmp::connect(&self.qmp, Duration::from_secs(5)) {
                Ok(q) => return q,
                Err(e) if Instant::now() < deadline && format!("{e:?}").contains("ConnectionRefused") => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("QMP connects: {e:?}"),
            }
        }
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A VM of `kvm` whose memory is the `size` bytes at `mem` (slot 0, at guest address 0), with
/// one vCPU in real mode ready to run the code at 0x1000, and the vCPU's statistics descriptor.
pub fn real_mode_vm(
    kvm: &kvm_ioctls::Kvm,
    mem: *mut libc::c_void,
    size: usize,
) -> (kvm_ioctls::VmFd, kvm_ioctls::VcpuFd, hvstats_sources::kvm_stats::KvmStats) {
    let vm = kvm.create_vm().unwrap();
    let region = kvm_bindings::kvm_userspace_memory_region {
        slot: 0,
        flags: 0,
        guest_phys_addr: 0,
        memory_size: size as u64,
        userspace_addr: mem as u64,
    };
    // SAFETY: the caller's region is a live mapping of this process that outlives the VM.
    unsafe { vm.set_user_memory_region(region).unwrap() };
    let vcpu = vm.create_vcpu(0).unwrap();
    let stats = hvstats_sources::kvm_stats::open_for(&vcpu).unwrap();
    let mut sregs = vcpu.get_sregs().unwrap();
    sregs.cs.base = 0;
    sregs.cs.selector = 0;
    vcpu.set_sregs(&sregs).unwrap();
    let mut regs = vcpu.get_regs().unwrap();
    regs.rip = 0x1000;
    regs.rflags = 2;
    vcpu.set_regs(&regs).unwrap();
    (vm, vcpu, stats)
}

/// True when the kernel's task iterator loads here; else `test` is skipped, saying why (a
/// failure where `HVSTATS_REQUIRE_KVM` is set: the iterator is then required).
pub fn task_iterator_available(test: &str) -> bool {
    if hvstats_host::bpf::task_iter::shared().is_some() {
        return true;
    }
    let why = hvstats_host::counting::full_notes().join("; ");
    assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "{test}: {why}");
    eprintln!("{test}: skipped: {why}");
    false
}
