//! Finding KVM VMs in other processes, their vCPUs, and the threads that run them.
//!
//! A process holding a KVM VM has file descriptors whose links read `anon_inode:kvm-vm` and
//! `anon_inode:kvm-vcpu:N`. Which of its threads runs vCPU N is told by KVM's debugfs
//! (`kvm/<pid>-<vmfd>/vcpuN/pid`, valid from the vCPU's first `KVM_RUN`, 0 before) or by the
//! names VMMs give their vCPU threads (QEMU with `debug-threads=on`: `CPU N/KVM`; Firecracker
//! `fc_vcpu N`; cloud-hypervisor `vcpuN`; crosvm `crosvm_vcpuN`; kvmtool `kvm-vcpu-N`).
//!
//! Every path is taken relative to a procfs root and a debugfs root, so the logic is tested on
//! fixture trees as well as on the host's `/proc`.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// The most of a command line read (`/proc/PID/cmdline`); the rest is ignored.
pub const MAX_CMDLINE: u64 = 1 << 20;

use std::os::unix::fs::MetadataExt;

use hvstats::vmm::VmUuid;
pub use hvstats::vmm::Vmm;
use hvstats_host::os::check;
use hvstats_host::task_stat::{StatLine, thread_path};

use super::qemu_args;
use hvstats_host::exit_watch::ExitWatch;

/// The vCPU index a thread name stands for, for every VMM's naming (exact parse: `CPU 1/KVM` is
/// vCPU 1, never 10). QEMU names vCPU threads `CPU N/<accelerator>` (`KVM`, `TCG`, …).
pub fn vcpu_index_from_thread_name(comm: &str) -> Option<u32> {
    let comm = comm.trim_end_matches('\n');
    let number = |s: &str| -> Option<u32> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0')) {
            return None;
        }
        s.parse().ok()
    };
    if let Some(rest) = comm.strip_prefix("CPU ") {
        let (n, accel) = rest.split_once('/')?;
        return if accel.is_empty() { None } else { number(n) };
    }
    for prefix in ["fc_vcpu ", "crosvm_vcpu", "kvm-vcpu-", "vcpu"] {
        if let Some(n) = comm.strip_prefix(prefix) {
            return number(n);
        }
    }
    None
}

/// The KVM file descriptors of one process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvmFds {
    /// Descriptor numbers of `anon_inode:kvm-vm`, ascending.
    pub vms: Vec<u32>,
    /// vCPU id → descriptor number of `anon_inode:kvm-vcpu:N`.
    pub vcpus: BTreeMap<u32, u32>,
}

impl KvmFds {
    /// True when the process holds a VM.
    pub fn has_vm(&self) -> bool {
        !self.vms.is_empty()
    }
}

/// A thread of a process and its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadInfo {
    /// Its thread id.
    pub tid: i32,
    /// Its name (`comm`), without the newline.
    pub comm: String,
}

/// Fields of `/proc/<pid>/stat` an `exec()` sets anew: where the program's code, data, heap,
/// arguments and environment were placed (26–28 and 45–51; randomized on every exec, and
/// different for another program).
const EXEC_MARKS: [usize; 10] = [26, 27, 28, 45, 46, 47, 48, 49, 50, 51];
/// The field of `stat` giving the process's number of threads.
const NUM_THREADS: usize = 20;

/// What tells a process, and the program it runs, from every other for the life of the host: a
/// pid reused by another process has another start time; a process that `exec()`s another
/// program (or itself again) keeps its pid and start time and gets new marks. A VM is observed as
/// long as its process's identity holds; a change is the old VM leaving and a new one coming.
///
/// The marks (fields of `stat` and the executable's device and inode) are readable where this
/// process may trace the other (its owner, or root); elsewhere the kernel hides them and only
/// the start time tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessIdentity {
    /// The start time, in clock ticks after boot.
    pub start_time: u64,
    /// The marks of the program it runs now.
    pub exec: [u64; 12],
}

impl ProcessIdentity {
    /// True when every mark reads 0: the process's memory is gone (it is exiting), or the
    /// kernel hides its marks from this process.
    pub fn is_exiting(&self) -> bool {
        self.exec.iter().all(|m| *m == 0)
    }
}

/// A procfs tree (the host's `/proc`, or a fixture) and a debugfs tree.
#[derive(Clone, Debug)]
pub struct Procfs {
    root: PathBuf,
    debugfs: Option<PathBuf>,
    /// True when `root` is a procfs, whose `fd` directories give their number of descriptors as
    /// their size (Linux 6.2 on); a fixture's do not.
    counts_fds: bool,
    /// True when its pids are this process's own (the host's `/proc`, or a fixture made of this
    /// host's processes): a pidfd opened on one of them names the process the tree shows.
    own_pids: bool,
}

impl Procfs {
    /// The host's `/proc`, with debugfs at `/sys/kernel/debug` (mounted there when it is not and
    /// this process may mount it).
    pub fn host() -> Self {
        let root = PathBuf::from("/proc");
        Self { counts_fds: is_procfs(&root), root, debugfs: host_debugfs(), own_pids: true }
    }

    /// A procfs tree at `root` and a debugfs tree at `debugfs` (fixtures).
    pub fn at(root: impl Into<PathBuf>, debugfs: Option<PathBuf>) -> Self {
        let root = root.into();
        let own_pids = root == Path::new("/proc");
        Self { counts_fds: is_procfs(&root), root, debugfs, own_pids }
    }

    /// The same tree, taken to show this host's processes by their own pids (a fixture made of
    /// processes it started): their exits are then watched by pidfd, as the host's are.
    pub fn with_own_pids(self) -> Self {
        Self { own_pids: true, ..self }
    }

    /// A watch of the exit of process `pid`, whose start time was read as `start_time`: where
    /// this tree's pids are this process's own and a pidfd can be had, and the process still
    /// starts then once it is opened (not another process given the pid meanwhile).
    pub(crate) fn exit_watch(&self, pid: i32, start_time: u64) -> Option<ExitWatch> {
        if !self.own_pids {
            return None;
        }
        let watch = ExitWatch::new(pid)?;
        (self.start_time(pid).ok()? == start_time).then_some(watch)
    }

    /// The procfs root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The debugfs tree, when there is one.
    pub(crate) fn debugfs(&self) -> Option<&Path> {
        self.debugfs.as_deref()
    }

    /// Every process id in the tree, ascending.
    ///
    /// # Errors
    /// When the root cannot be listed.
    pub fn pids(&self) -> io::Result<Vec<i32>> {
        numeric_entries(&self.root)
    }

    /// The KVM file descriptors of `pid`.
    ///
    /// # Errors
    /// When its `fd` directory cannot be listed (the process is gone, or not ours to see).
    pub fn kvm_fds(&self, pid: i32) -> io::Result<KvmFds> {
        self.kvm_fds_read(pid).map(|(fds, _)| fds)
    }

    /// The KVM file descriptors of `pid`, and how many descriptors were read to find them.
    ///
    /// # Errors
    /// As [`kvm_fds`](Self::kvm_fds).
    pub(crate) fn kvm_fds_read(&self, pid: i32) -> io::Result<(KvmFds, u64)> {
        kvm_fds_in(&self.fd_dir(pid)?)
    }

    /// True when the `fd` directory of `pid` can be listed by this process (its links may still
    /// be refused it).
    pub(crate) fn fd_listable(&self, pid: i32) -> bool {
        fs::read_dir(self.root.join(pid.to_string()).join("fd")).is_ok()
    }

    /// The number of descriptors `pid` holds, from the size of its `fd` directory, without
    /// listing it; `None` where the size does not tell (a fixture, a kernel before 6.2).
    ///
    /// # Errors
    /// When the directory cannot be looked at (the process is gone).
    pub(crate) fn fd_count(&self, pid: i32) -> io::Result<Option<u64>> {
        let size = fs::metadata(self.root.join(pid.to_string()).join("fd"))?.len();
        Ok((self.counts_fds && size > 0).then_some(size))
    }

    /// The `fd` directory of `pid`, held open (`O_PATH`): its number of descriptors is then read
    /// with [`Procfs::fd_count_of`] without a walk of the path each time. The directory stays
    /// the process's it was opened for (procfs ties it to that process, not to its pid).
    ///
    /// # Errors
    /// When the directory cannot be opened (the process is gone, out of descriptors).
    pub fn fd_dir(&self, pid: i32) -> io::Result<fs::File> {
        use std::os::unix::fs::OpenOptionsExt;
        fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(self.root.join(pid.to_string()).join("fd"))
    }

    /// The number of descriptors of the process whose `fd` directory `dir` is (see
    /// [`Procfs::fd_dir`]), as [`Procfs::fd_count`] tells it.
    ///
    /// # Errors
    /// When the directory cannot be looked at (the process is gone).
    pub(crate) fn fd_count_of(&self, dir: &fs::File) -> io::Result<Option<u64>> {
        let size = dir.metadata()?.len();
        Ok((self.counts_fds && size > 0).then_some(size))
    }

    /// KVM's directory in the debugfs tree, where there is a debugfs tree.
    pub(crate) fn debugfs_kvm_dir(&self) -> Option<PathBuf> {
        Some(self.debugfs.as_ref()?.join("kvm"))
    }

    /// The threads KVM's debugfs names as having made a VM: one directory per VM, `kvm/<id>-<vm
    /// fd>`, where `id` is the thread that made the VM; by directory name. `None` without a
    /// debugfs whose `kvm` directory can be listed.
    pub(crate) fn debugfs_vm_threads(&self) -> Option<BTreeMap<std::ffi::OsString, i32>> {
        let entries = fs::read_dir(self.debugfs_kvm_dir()?).ok()?;
        let thread = |name: &str| name.split_once('-')?.0.parse::<i32>().ok().filter(|p| *p > 0);
        Some(
            entries
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name();
                    let tid = name.to_str().and_then(thread)?;
                    Some((name, tid))
                })
                .collect(),
        )
    }

    /// The process (thread group) of thread `tid`, from its `status`.
    pub(crate) fn thread_group(&self, tid: i32) -> Option<i32> {
        let status = fs::read_to_string(self.root.join(tid.to_string()).join("status")).ok()?;
        status.lines().find_map(|l| l.strip_prefix("Tgid:"))?.trim().parse().ok()
    }

    /// Every process in the tree that holds a KVM VM, with its descriptors.
    ///
    /// # Errors
    /// When the root cannot be listed.
    pub fn kvm_processes(&self) -> io::Result<Vec<(i32, KvmFds)>> {
        self.kvm_processes_but(&|_| false)
    }

    /// As [`kvm_processes`](Self::kvm_processes), leaving out the processes `known` takes
    /// without reading their descriptors (VMs already observed: reading every descriptor of
    /// every VMM at every refresh is most of what finding VMs costs).
    ///
    /// # Errors
    /// When the root cannot be listed.
    pub(crate) fn kvm_processes_but(&self, known: &dyn Fn(i32) -> bool) -> io::Result<Vec<(i32, KvmFds)>> {
        let mut found = Vec::new();
        for pid in self.pids()? {
            if known(pid) {
                continue;
            }
            // Processes come and go, and some are not ours to see: skip those.
            if let Ok(fds) = self.kvm_fds(pid)
                && fds.has_vm()
            {
                found.push((pid, fds));
            }
        }
        Ok(found)
    }

    /// The threads of `pid` with their names, by thread id.
    ///
    /// # Errors
    /// When its `task` directory cannot be listed.
    pub fn threads(&self, pid: i32) -> io::Result<Vec<ThreadInfo>> {
        let dir = self.root.join(pid.to_string()).join("task");
        let mut threads = Vec::new();
        for tid in numeric_entries(&dir)? {
            let comm = fs::read_to_string(dir.join(tid.to_string()).join("comm")).unwrap_or_default();
            threads.push(ThreadInfo { tid, comm: comm.trim_end_matches('\n').to_owned() });
        }
        Ok(threads)
    }

    /// The command line of `pid`, split at NULs.
    ///
    /// # Errors
    /// When it cannot be read.
    pub fn cmdline(&self, pid: i32) -> io::Result<Vec<String>> {
        // The process chooses its command line, up to a quarter of its stack limit: read no more
        // than a VMM's needs (libvirt's QEMU command lines are tens of KiB).
        let mut raw = Vec::new();
        fs::File::open(self.root.join(pid.to_string()).join("cmdline"))?
            .take(MAX_CMDLINE)
            .read_to_end(&mut raw)?;
        Ok(raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect())
    }

    /// The user id that owns `pid` (its `/proc/PID` directory); `None` when it cannot be told.
    pub fn owner(&self, pid: i32) -> Option<u32> {
        fs::metadata(self.root.join(pid.to_string())).ok().map(|m| m.uid())
    }

    /// The VM's identity on the platform that runs it ([`hvstats_platform`]), from the VMM's
    /// command line, its owner, its cgroup and, for Proxmox VE, the VM's configuration file:
    /// `Some(None)` for a VMM no platform is read from, `None` for a process that cannot be read
    /// (all of those but the configuration file).
    pub fn platform_identity(&self, pid: i32) -> Option<Option<hvstats_platform::Identity>> {
        use hvstats_platform::{Process, of_process, proxmox};
        let args = self.cmdline(pid).ok()?;
        let uid = self.owner(pid)?;
        let cgroup = self.read_cgroup(pid).ok()?;
        let process = Process { args: &args, uid, cgroup: &cgroup };
        Some(of_process(&process, |vmid| proxmox::read_config(Path::new(proxmox::CONFIG_DIR), vmid)))
    }

    /// The text of `pid`'s `/proc/PID/cgroup` (a page at most: one line per hierarchy); empty
    /// when it cannot be read.
    pub fn cgroup(&self, pid: i32) -> String {
        self.read_cgroup(pid).unwrap_or_default()
    }

    /// The text of `pid`'s `/proc/PID/cgroup`, a page at most.
    fn read_cgroup(&self, pid: i32) -> io::Result<String> {
        let mut cgroup = String::new();
        let file = fs::File::open(self.root.join(pid.to_string()).join("cgroup"))?;
        file.take(4096).read_to_string(&mut cgroup)?;
        Ok(cgroup)
    }

    /// True when `pid` runs a VMM hvstats knows by its program (its command line's first word):
    /// what tells a process that may hold a VM when its descriptors cannot be read.
    pub fn runs_vmm(&self, pid: i32) -> bool {
        let Ok(args) = self.cmdline(pid) else { return false };
        args.first().is_some_and(|a| Vmm::from_program(a) != Vmm::Other)
    }

    /// Where `path`, as process `pid` sees it, is not seen by this process: it is not here, but is
    /// in `pid`'s mount namespace (`/proc/PID/root`): a private `/tmp` or a hidden `/home` (systemd's
    /// `PrivateTmp=`, `ProtectHome=`) stands between them.
    pub fn hidden_from_here(&self, pid: i32, path: &Path) -> bool {
        let Ok(relative) = path.strip_prefix("/") else { return false };
        !path.exists() && self.root.join(pid.to_string()).join("root").join(relative).exists()
    }

    /// The name (`comm`) of `pid`.
    ///
    /// # Errors
    /// When it cannot be read.
    pub fn comm(&self, pid: i32) -> io::Result<String> {
        let comm = fs::read_to_string(self.root.join(pid.to_string()).join("comm"))?;
        Ok(comm.trim_end_matches('\n').to_owned())
    }

    /// True while `pid` exists and is not a zombie; false once it is gone.
    ///
    /// # Errors
    /// When its status cannot be read for another reason than its absence (out of descriptors,
    /// out of memory): that says nothing of the process, and must not be taken for its exit.
    pub fn is_alive(&self, pid: i32) -> io::Result<bool> {
        match fs::read_to_string(self.root.join(pid.to_string()).join("status")) {
            Ok(status) => {
                Ok(!status.lines().any(|l| l.starts_with("State:") && (l.contains('Z') || l.contains('X'))))
            }
            Err(e) if is_gone(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// vCPU id → thread id from KVM's debugfs for the VM with descriptor `vm_fd` of `pid`; a vCPU
    /// that has not run yet (pid 0) is left out. Empty without debugfs.
    pub fn debugfs_vcpu_threads(&self, pid: i32, vm_fd: u32) -> BTreeMap<u32, i32> {
        let mut found = BTreeMap::new();
        let Some(debugfs) = &self.debugfs else { return found };
        let dir = debugfs.join("kvm").join(format!("{pid}-{vm_fd}"));
        let Ok(entries) = fs::read_dir(&dir) else { return found };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_prefix("vcpu")).and_then(|n| n.parse().ok())
            else {
                continue;
            };
            let Ok(text) = fs::read_to_string(entry.path().join("pid")) else { continue };
            if let Ok(tid) = text.trim().parse::<i32>()
                && tid > 0
            {
                found.insert(id, tid);
            }
        }
        found
    }

    /// vCPU index → thread id from thread names (see [`vcpu_index_from_thread_name`]).
    ///
    /// # Errors
    /// When the threads cannot be listed.
    pub fn named_vcpu_threads(&self, pid: i32) -> io::Result<BTreeMap<u32, i32>> {
        let mut found = BTreeMap::new();
        for t in self.threads(pid)? {
            if let Some(n) = vcpu_index_from_thread_name(&t.comm) {
                found.entry(n).or_insert(t.tid);
            }
        }
        Ok(found)
    }

    /// The VMM of `pid` and the VM's name: the VMM's own name for it (QEMU `-name guest=N`,
    /// Firecracker `--id`, crosvm and kvmtool `--name`, Cloud Hypervisor's `--api-socket`), else the command and a digest of its
    /// command line (`qemu-system-x86-1a2b3c4d`): the same for a VMM started again the same way,
    /// so series keep their labels across restarts, and never a pid.
    pub fn identify(&self, pid: i32) -> (Vmm, String) {
        let args = self.cmdline(pid).unwrap_or_default();
        let comm = self.comm(pid).unwrap_or_else(|_| "unknown".to_owned());
        let vmm = args.first().map_or(Vmm::Other, |a| Vmm::from_program(a));
        let named = match vmm {
            Vmm::Qemu => qemu_args::name(args.get(1..).unwrap_or_default()),
            Vmm::Firecracker => option_value(&args, "--id"),
            Vmm::Crosvm | Vmm::Kvmtool => option_value(&args, "--name"),
            // Its API socket's name (Kata's sandbox id under Kata).
            Vmm::CloudHypervisor => {
                let process = hvstats_platform::Process { args: &args, uid: 0, cgroup: "" };
                hvstats_platform::microvm::identity(&process)
                    .and_then(|i| i.claimed_name().map(str::to_owned))
            }
            Vmm::Other => None,
        };
        (
            vmm,
            named
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| format!("{comm}-{:08x}", command_digest(&args))),
        )
    }

    /// The QMP sockets a QEMU's command line names, in its order: `-qmp unix:PATH,server…`, and
    /// `-chardev socket,id=ID,path=PATH,server…` with `-mon chardev=ID,mode=control`; a relative
    /// path is taken from QEMU's working directory. Left out: sockets QEMU connects out to (no
    /// `server`), TCP sockets, descriptors passed in (libvirt's `fd=`: libvirt holds those), and
    /// `-qmp-pretty` or `pretty=on` monitors, whose messages span lines. Empty for other VMMs and
    /// a process that cannot be read.
    pub(crate) fn qmp_sockets(&self, pid: i32) -> Vec<PathBuf> {
        let Ok(args) = self.cmdline(pid) else { return Vec::new() };
        if args.first().map(|a| Vmm::from_program(a)) != Some(Vmm::Qemu) {
            return Vec::new();
        }
        let server = |opts: &[(String, String)]| {
            opts.iter().any(|(k, v)| k == "server" && matches!(v.as_str(), "" | "on" | "yes" | "true"))
        };
        let mut chardevs: BTreeMap<String, PathBuf> = BTreeMap::new();
        let mut monitors: Vec<(usize, String)> = Vec::new();
        let mut found: Vec<(usize, PathBuf)> = Vec::new();
        // Options and their values as QEMU reads them: a value that looks like an option is not one.
        for (at, (option, value)) in
            qemu_args::options(args.get(1..).unwrap_or_default()).into_iter().enumerate()
        {
            if !matches!(option, "qmp" | "chardev" | "mon") {
                continue;
            }
            let Some(value) = value else { continue };
            let opts = qemu_opts(value);
            match option {
                "qmp" => {
                    let Some((first, _)) = opts.first() else { continue };
                    if let Some(path) = first.strip_prefix("unix:")
                        && server(&opts[1..])
                    {
                        found.push((at, PathBuf::from(path)));
                    }
                }
                "chardev" => {
                    let get = |key: &str| opts.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
                    if opts.first().map(|(k, _)| k.as_str()) == Some("socket")
                        && server(&opts)
                        && let (Some(id), Some(path)) = (get("id"), get("path"))
                    {
                        chardevs.insert(id, PathBuf::from(path));
                    }
                }
                _ => monitors.extend(control_monitor(&opts).map(|id| (at, id))),
            }
        }
        found.extend(monitors.into_iter().filter_map(|(at, id)| Some((at, chardevs.get(&id)?.clone()))));
        found.sort_by_key(|(at, _)| *at);
        let cwd = || fs::read_link(self.root.join(pid.to_string()).join("cwd")).ok();
        found
            .into_iter()
            .filter_map(|(_, p)| match p.is_absolute() {
                true => Some(p),
                false => cwd().map(|d| d.join(p)),
            })
            .collect()
    }

    /// The VM's Hyper-V enlightenments as its VMM was given them: the `hv-*` properties of QEMU's
    /// last `-cpu` (a word of `hvstats_abi::hyperv_features`, its `KNOWN` bit set); `None` for
    /// other VMMs and for a process that cannot be read.
    pub fn hyperv_enlightenments(&self, pid: i32) -> Option<u64> {
        let args = self.cmdline(pid).ok()?;
        match args.first().map(|a| Vmm::from_program(a))? {
            Vmm::Qemu => Some(qemu_args::hyperv_features(args.get(1..).unwrap_or_default())),
            _ => None,
        }
    }

    /// The VM's UUID as its VMM was given it: QEMU's last `-uuid` (libvirt always passes one).
    /// `None` for other VMMs, for no or a malformed value, and for a process that cannot be read.
    pub fn vm_uuid(&self, pid: i32) -> Option<VmUuid> {
        let args = self.cmdline(pid).ok()?;
        match args.first().map(|a| Vmm::from_program(a))? {
            Vmm::Qemu => VmUuid::parse(qemu_args::uuid(args.get(1..).unwrap_or_default())?),
            _ => None,
        }
    }

    /// The start time of `pid` (clock ticks after boot): with its pid, what names one process for
    /// the life of the host.
    ///
    /// # Errors
    /// When its `stat` cannot be read or parsed.
    pub fn start_time(&self, pid: i32) -> io::Result<u64> {
        let text = fs::read_to_string(self.root.join(pid.to_string()).join("stat"))?;
        StatLine::parse(&text).and_then(|s| s.start_time()).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, format!("malformed stat of process {pid}"))
        })
    }

    /// Who `pid` is now: its start time and the marks of the program it runs (see
    /// [`ProcessIdentity`]).
    ///
    /// # Errors
    /// When its `stat` cannot be read or parsed (the process is gone: see [`is_gone`]).
    pub fn identity(&self, pid: i32) -> io::Result<ProcessIdentity> {
        self.identity_and_threads(pid).map(|(identity, _)| identity)
    }

    /// Who `pid` is now ([`identity`](Self::identity)) and its number of threads (`stat`'s
    /// `num_threads`, `None` where it cannot be told), from one reading.
    ///
    /// # Errors
    /// As [`identity`](Self::identity).
    pub(crate) fn identity_and_threads(&self, pid: i32) -> io::Result<(ProcessIdentity, Option<u64>)> {
        let dir = self.root.join(pid.to_string());
        let text = fs::read_to_string(dir.join("stat"))?;
        let malformed =
            || io::Error::new(io::ErrorKind::InvalidData, format!("malformed stat of process {pid}"));
        let stat = StatLine::parse(&text).ok_or_else(malformed)?;
        let start_time = stat.start_time().ok_or_else(malformed)?;
        let mut exec = [0u64; EXEC_MARKS.len() + 2];
        for (mark, field) in exec.iter_mut().zip(EXEC_MARKS) {
            *mark = stat.number(field).unwrap_or(0);
        }
        // The executable itself, where this process may see it (as its owner or root).
        if let Ok(exe) = fs::metadata(dir.join("exe")) {
            exec[EXEC_MARKS.len()] = exe.dev();
            exec[EXEC_MARKS.len() + 1] = exe.ino();
        }
        Ok((ProcessIdentity { start_time, exec }, stat.number(NUM_THREADS)))
    }

    /// The start time of thread `tid` while it is a task of process `pid`: `/proc/<pid>/task/<tid>`
    /// exists only for a thread of `pid`'s thread group (the kernel looks the thread up in the
    /// group), so a thread id of another process, or of a thread that exited, is `NotFound`.
    ///
    /// # Errors
    /// When the thread is not a task of `pid` now, or its `stat` cannot be read or parsed.
    pub(crate) fn task_start_time(&self, pid: i32, tid: i32) -> io::Result<u64> {
        if tid <= 0 {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("{tid} is not a thread id")));
        }
        let text = fs::read_to_string(thread_path(&self.root, pid, tid))?;
        StatLine::parse(&text).and_then(|s| s.start_time()).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, format!("malformed stat of thread {tid}"))
        })
    }
}

/// The value of `option` in `args` (`-o V`, `-o=V`, `--o V`, `--o=V`).
fn option_value(args: &[String], option: &str) -> Option<String> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == option {
            return it.next().cloned();
        }
        if let Some(v) = a.strip_prefix(option).and_then(|r| r.strip_prefix('=')) {
            return Some(v.to_owned());
        }
    }
    None
}

/// A QEMU option value as `key=value` pairs, in order (a bare `key` has an empty value: the
/// implied first key, or a flag such as `server`; `nowait` is `wait=off`).
fn qemu_opts(value: &str) -> Vec<(String, String)> {
    qemu_args::parts(value)
        .into_iter()
        .map(|part| match part.split_once('=') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None if part == "nowait" => ("wait".to_owned(), "off".to_owned()),
            None => (part, String::new()),
        })
        .collect()
}

/// The chardev a QEMU `-mon` option makes a control monitor of (`mode=control`, not pretty).
fn control_monitor(opts: &[(String, String)]) -> Option<String> {
    let get = |key: &str| opts.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    let chardev =
        get("chardev").or_else(|| opts.first().filter(|(_, v)| v.is_empty()).map(|(k, _)| k.as_str()));
    let pretty = matches!(get("pretty"), Some("" | "on" | "yes" | "true"));
    (get("mode") == Some("control") && !pretty).then_some(chardev?.to_owned())
}

/// True when a failed `/proc/PID/…` access means the process is gone (no such file, or the
/// kernel's "no such process" for one that exited during the access).
pub fn is_gone(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

/// True when a `/proc/PID/…` access was refused for want of a permission (`EACCES`, `EPERM`): the
/// process is there, this one may not look (the reason it is refused for names the fix: [`crate::refusal::Refusal::fix`]).
pub fn is_refusal(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM))
}

/// The message of a failed read of `pid`'s descriptors: the process is gone, the read was refused
/// (with who owns the process: the fix is its refusal's, [`crate::refusal::Refusal::fix`]), or
/// another error.
pub fn read_error(procfs: &Procfs, pid: i32, e: &io::Error) -> String {
    if is_gone(e) {
        return format!("no process {pid}");
    }
    if is_refusal(e) {
        let owner = procfs.owner(pid).map(|uid| format!(" (a process of uid {uid})")).unwrap_or_default();
        return format!("cannot read the descriptors of process {pid}{owner}: {e}");
    }
    format!("cannot read process {pid}: {e}")
}

/// True when an access failed for want of a resource of this process or host (descriptors,
/// memory): it says nothing of the process read, and may succeed later.
pub fn is_shortage(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EAGAIN))
}

/// The numeric entries of a directory, ascending.
fn numeric_entries(dir: &Path) -> io::Result<Vec<i32>> {
    let mut out: Vec<i32> = fs::read_dir(dir)?
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
        .collect();
    out.sort_unstable();
    Ok(out)
}

/// The KVM file descriptors of the process whose `fd` directory `dir` is ([`Procfs::fd_dir`]),
/// and how many descriptors were read to find them: its entries listed and their links read
/// relative to it, no path walked from the root for each.
///
/// # Errors
/// When the directory cannot be listed (the process is gone, or not ours to see), or a link
/// is refused.
pub fn kvm_fds_in(dir: &fs::File) -> io::Result<(KvmFds, u64)> {
    use rustix::fs::{Dir, Mode, OFlags, openat, readlinkat};
    let listing = openat(dir, c".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    let mut listed: Vec<(u32, std::ffi::CString)> = Vec::new();
    for entry in Dir::read_from(&listing)? {
        let entry = entry?;
        let name = entry.file_name();
        if let Some(fd) = name.to_str().ok().and_then(|n| n.parse::<u32>().ok()) {
            listed.push((fd, name.to_owned()));
        }
    }
    let mut fds = KvmFds::default();
    let read = listed.len() as u64;
    let mut target = Vec::new();
    for (fd, name) in listed {
        // A descriptor closed between the listing and the readlink is simply not there; a
        // link this process may not read (the ptrace access check) hides them all.
        target = match readlinkat(dir, name.as_c_str(), std::mem::take(&mut target)) {
            Ok(target) => target.into_bytes(),
            Err(e) if is_refusal(&e.into()) => return Err(e.into()),
            Err(_) => continue,
        };
        if target == b"anon_inode:kvm-vm" {
            fds.vms.push(fd);
        } else if let Some(id) = target.strip_prefix(b"anon_inode:kvm-vcpu:")
            && let Some(id) = std::str::from_utf8(id).ok().and_then(|id| id.parse().ok())
        {
            fds.vcpus.insert(id, fd);
        }
        target.clear();
    }
    fds.vms.sort_unstable();
    Ok((fds, read))
}

/// True when `root` is a procfs mount.
fn is_procfs(root: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(root.as_os_str().as_bytes()) else { return false };
    // SAFETY: an all-zero statfs is a valid value of the plain C struct the kernel fills.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `fs` a valid statfs the kernel writes into.
    check(unsafe { libc::statfs(path.as_ptr(), &mut fs) }).is_ok() && fs.f_type == libc::PROC_SUPER_MAGIC
}

/// A 32-bit FNV-1a digest of a command line, its arguments each ended by a NUL as the kernel
/// keeps them.
fn command_digest(args: &[String]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in args.iter().flat_map(|a| a.bytes().chain([0])) {
        hash = (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193);
    }
    hash
}

/// KVM's debugfs directory, mounting debugfs at `/sys/kernel/debug` when nothing is mounted
/// there (as root; once per process); `None` when there is none.
fn host_debugfs() -> Option<PathBuf> {
    static MOUNTED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    let root = Path::new("/sys/kernel/debug");
    if !root.join("kvm").is_dir() {
        MOUNTED.get_or_init(|| {
            let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
            if mounts.lines().any(|l| l.split_whitespace().nth(1) == Some("/sys/kernel/debug")) {
                return;
            }
            // A mount refused (no CAP_SYS_ADMIN, a read-only /sys) leaves no debugfs: told below
            // by its absence, as on a host without one.
            // SAFETY: all arguments are NUL-terminated literals; a null data pointer is allowed.
            let _refused = check(unsafe {
                libc::mount(
                    c"debugfs".as_ptr(),
                    c"/sys/kernel/debug".as_ptr(),
                    c"debugfs".as_ptr(),
                    0,
                    std::ptr::null(),
                )
            });
        });
    }
    root.join("kvm").is_dir().then(|| root.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_fd_directory_counts_the_descriptors_as_its_path_does_and_follows_them() {
        use std::io::Write;
        use std::process::{Command, Stdio};
        // A shell that says it is ready (its start-up, which opens and closes files, done), opens
        // three more descriptors once told to (at numbers it finds free: it may have inherited
        // some of this test process's), then waits.
        let mut child = Command::new("bash")
            .args([
                "-c",
                "echo ready; read x; exec {a}</dev/null {b}</dev/null {c}</dev/null; echo opened; read y",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("sh");
        let pid = child.id() as i32;
        let mut out = io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert_eq!(line.trim(), "ready");
        let procfs = Procfs::host();
        let dir = procfs.fd_dir(pid).expect("the child's fd directory");
        let before = procfs.fd_count(pid).unwrap();
        assert_eq!(procfs.fd_count_of(&dir).unwrap(), before);
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "go").unwrap();
        line.clear();
        io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert_eq!(line.trim(), "opened");
        let after = procfs.fd_count_of(&dir).unwrap();
        assert_eq!(after, procfs.fd_count(pid).unwrap());
        // Where the kernel tells the number (6.2 on), it moved by the three opened.
        if let Some(before) = before {
            assert_eq!(after, Some(before + 3));
        }
        drop(stdin);
        let _ = child.wait();
    }

    #[test]
    fn thread_names_of_every_vmm_give_the_vcpu_index() {
        let cases = [
            ("CPU 0/KVM", Some(0)),
            ("CPU 1/KVM", Some(1)),
            ("CPU 10/KVM", Some(10)),
            ("CPU 3/TCG", Some(3)),
            ("fc_vcpu 0", Some(0)),
            ("fc_vcpu 12", Some(12)),
            ("vcpu0", Some(0)),
            ("vcpu7", Some(7)),
            ("crosvm_vcpu2", Some(2)),
            ("kvm-vcpu-5", Some(5)),
            ("qemu-system-x86", None),
            ("fc_api", None),
            ("call_rcu", None),
            ("kvm-nx-lpage-re", None),
            ("CPU 1", None),
            ("CPU x/KVM", None),
            ("vcpu", None),
            ("vcpu01", None),
            ("vcpu-1", None),
        ];
        for (name, want) in cases {
            assert_eq!(vcpu_index_from_thread_name(name), want, "{name:?}");
        }
    }

    #[test]
    fn qmp_sockets_are_the_server_sockets_of_control_monitors() {
        let tmp = std::env::temp_dir().join(format!("hvstats-qmp-args-{}", std::process::id()));
        let proc_root = tmp.join("proc");
        let pid = 42;
        let dir = proc_root.join(pid.to_string());
        fs::create_dir_all(&dir).unwrap();
        let args = [
            "/usr/bin/qemu-system-x86_64",
            "-qmp",
            "unix:/run/a.sock,server=on,wait=off",
            "-qmp",
            "unix:/run/client.sock",
            "--qmp",
            "unix:rel.sock,server,nowait",
            "-qmp-pretty",
            "unix:/run/pretty.sock,server",
            "-chardev",
            "socket,id=mon0,path=/run/b,,x.sock,server=on,wait=off",
            "-mon",
            "chardev=mon0,mode=control",
            "-chardev",
            "socket,id=hmp,path=/run/hmp.sock,server=on",
            "-mon",
            "hmp,mode=readline",
            "-chardev",
            "socket,id=charmonitor,fd=23,server=on,wait=off",
            "-mon",
            "chardev=charmonitor,id=monitor,mode=control",
            "-qmp",
            "tcp:127.0.0.1:4444,server=on",
        ];
        fs::write(dir.join("cmdline"), args.join("\0")).unwrap();
        std::os::unix::fs::symlink("/var/lib/vm", dir.join("cwd")).unwrap();
        let procfs = Procfs::at(&proc_root, None);
        assert_eq!(
            procfs.qmp_sockets(pid),
            [
                PathBuf::from("/run/a.sock"),
                PathBuf::from("/var/lib/vm/rel.sock"),
                PathBuf::from("/run/b,x.sock")
            ]
        );
        fs::write(dir.join("cmdline"), "firecracker\0-qmp\0unix:/run/a.sock,server").unwrap();
        assert!(procfs.qmp_sockets(pid).is_empty(), "only QEMU's command line means QMP");
        let _ = fs::remove_dir_all(&tmp);
    }

    #[test]
    fn programs_tell_the_vmm() {
        assert_eq!(Vmm::from_program("/usr/bin/qemu-system-x86_64"), Vmm::Qemu);
        // Proxmox VE's QEMU.
        assert_eq!(Vmm::from_program("/usr/bin/kvm"), Vmm::Qemu);
        assert_eq!(Vmm::from_program("firecracker"), Vmm::Firecracker);
        assert_eq!(Vmm::from_program("/opt/cloud-hypervisor"), Vmm::CloudHypervisor);
        assert_eq!(Vmm::from_program("crosvm"), Vmm::Crosvm);
        assert_eq!(Vmm::from_program("lkvm"), Vmm::Kvmtool);
        assert_eq!(Vmm::from_program("bash"), Vmm::Other);
    }
}
