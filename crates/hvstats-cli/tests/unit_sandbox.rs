//! The observer as its shipped unit runs it (packaging/systemd/hvstats-observe.service), read
//! from that file: its capability bounding set, `NoNewPrivileges=`, its mounts (`ProtectSystem=`,
//! `ProtectHome=`, `PrivateTmp=`, `PrivateDevices=`, `ProtectKernelTunables=`) and
//! `PrivateNetwork=`, and its flags from /etc/default/hvstats (packaging/default/hvstats).
//! Where systemd is the service manager, `systemd-run` would apply them itself; here (and on any
//! host without it) `unshare` makes the mount and network namespaces, `setpriv` the
//! capabilities, and `strace` records every system call the observer makes, each of which must
//! be one `SystemCallFilter=` allows (as `systemd-analyze syscall-filter` expands its groups):
//! the seccomp filter is checked against what the observer did, not applied.
//!
//! Observed so, on a stock Debian libvirt host's terms: a libvirt domain whose QEMU runs as
//! `libvirt-qemu` (another user: its `/proc/PID/fd` needs CAP_DAC_READ_SEARCH) and a plain QEMU
//! whose QMP socket is under /tmp are both attached with their libvirt and QMP sources up. Without
//! CAP_DAC_READ_SEARCH the domain is counted as refused and the log says the fix; with a private
//! /tmp (what the unit no longer sets) the QMP socket is still reached, through the QEMU's root. In its own network namespace, it still lets a QMP client of the host's namespace
//! in within one refresh, and takes the session back once that client leaves.
//!
//! And on a KubeVirt node's terms: a VMI's QEMU in PID and mount namespaces of its own, run by
//! its pod's `libvirtd` in session mode as `nobody`, is read through that daemon (its statistics
//! and its namespace and name), and a daemon outside the pod is not believed for a VM placed in
//! another pod.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

mod common;

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    KilledOnDrop, TempDir, kvm_available, partition, snapshot_json, snapshot_until, source_up, total,
    unit_setting as setting, vm_info,
};
use hvstats_guest::bios::{BiosEnd, BiosProgram};
use hvstats_testkit::{CgroupDriver, Libvirtd, PodCgroup, libvirt_volume, spawn_qemu, wait_for_kvm_vcpus};
use hvstats_vmm::unix_sockets::{PathUse, UnixSockets};
use serde_json::Value;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

/// The one value of a yes/no or keyword setting (its last), `default` when not given.
fn one(unit: &str, key: &str, default: &str) -> String {
    setting(unit, key).pop().unwrap_or_else(|| default.to_owned())
}

/// The system calls a `SystemCallFilter=` allow list names, its groups expanded as systemd 252
/// expands them (`systemd-analyze syscall-filter`).
fn allowed_syscalls(filters: &[String]) -> BTreeSet<String> {
    fn expand(name: &str, into: &mut BTreeSet<String>, seen: &mut BTreeSet<String>) {
        if !name.starts_with('@') {
            into.insert(name.to_owned());
            return;
        }
        if !seen.insert(name.to_owned()) {
            return;
        }
        let out = Command::new("systemd-analyze").args(["syscall-filter", name]).output().unwrap();
        assert!(out.status.success(), "systemd-analyze syscall-filter {name}");
        for line in String::from_utf8_lossy(&out.stdout).lines().skip(1) {
            let item = line.trim();
            if item.is_empty() || item.starts_with('#') {
                continue;
            }
            expand(item, into, seen);
        }
    }
    let mut allowed = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for filter in filters {
        assert!(!filter.starts_with('~'), "the observer's filter is an allow list: {filter}");
        for name in filter.split_whitespace() {
            expand(name, &mut allowed, &mut seen);
        }
    }
    allowed
}

/// The flags /etc/default/hvstats gives `var`, split at spaces as systemd splits `$VAR`.
fn default_args(var: &str) -> Vec<String> {
    let text = std::fs::read_to_string(repo("packaging/default/hvstats")).unwrap();
    let line = text.lines().find_map(|l| l.strip_prefix(&format!("{var}="))).unwrap();
    line.trim_matches('"').split_whitespace().map(str::to_owned).collect()
}

/// Whether `path` lies where the sandbox may hide things: a private /tmp or /var/tmp, a home.
fn hidden_by_sandbox(path: &Path) -> bool {
    ["/tmp", "/var/tmp", "/home", "/root", "/run/user"].iter().any(|h| path.starts_with(h))
}

/// A directory outside /tmp (which a private /tmp would hide), removed on drop: under the
/// target directory, unless the checkout itself lies where the sandbox hides things (/tmp,
/// /var/tmp, a home), then under /run.
struct OutsideTmp(PathBuf);

impl OutsideTmp {
    fn new(name: &str) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let target = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let base = if hidden_by_sandbox(target) {
            PathBuf::from("/run/hvstats-tests")
        } else {
            target.to_path_buf()
        };
        let dir = base.join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        Self(dir)
    }
}

impl Drop for OutsideTmp {
    /// Removes the directory, and the in-kernel counts an observer whose runtime directory it
    /// was kept in bpffs: the unit is stopped while its VMs may run, which keeps them.
    fn drop(&mut self) {
        hvstats_host::bpf::keep::remove_tree(&hvstats_host::bpf::keep::identity_path(&self.0));
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How the observer is run: the unit's settings, with some overridden (to show what a setting
/// the unit does not have would do).
struct Sandbox {
    unit: String,
    /// Capabilities removed from the unit's bounding set (setpriv's names: `dac_read_search`).
    without: Vec<&'static str>,
    /// `PrivateTmp=` as the run has it.
    private_tmp: bool,
}

impl Sandbox {
    fn shipped() -> Self {
        let unit = std::fs::read_to_string(repo("packaging/systemd/hvstats-observe.service")).unwrap();
        let private_tmp = one(&unit, "PrivateTmp", "no") == "yes";
        Self { unit, without: Vec::new(), private_tmp }
    }

    /// The bounding set, as setpriv names it.
    fn capabilities(&self) -> Vec<String> {
        setting(&self.unit, "CapabilityBoundingSet")
            .iter()
            .flat_map(|v| v.split_whitespace())
            .map(|c| c.trim_start_matches("CAP_").to_lowercase())
            .filter(|c| !self.without.contains(&c.as_str()))
            .collect()
    }

    /// The shell script that sets the mounts up in a new mount namespace and execs the observer
    /// through setpriv (and strace, writing to `trace`).
    fn script(&self, runtime: &Path, trace: &Path, args: &[String]) -> String {
        let unit = &self.unit;
        let mut s = String::from("set -eu\n");
        // What systemd mounts at boot (sys-fs-bpf.mount), which the unit wants.
        s += "mountpoint -q /sys/fs/bpf || mount -t bpf -o mode=0700 bpf /sys/fs/bpf\n";
        // What ExecStartPre=+ runs with full privileges before the sandbox is made.
        for pre in setting(unit, "ExecStartPre") {
            let pre = pre.strip_prefix('+').expect("only full-privilege ExecStartPre= is reproduced");
            s += &format!("{pre}\n");
        }
        // Writable as the unit leaves them: its runtime directory, the trace beside it, and
        // ReadWritePaths= (a `-` one only where it exists).
        let mut writable: Vec<PathBuf> = vec![runtime.to_owned(), trace.parent().unwrap().to_owned()];
        for rw in setting(unit, "ReadWritePaths").iter().flat_map(|v| v.split_whitespace()) {
            let (optional, path) = rw.strip_prefix('-').map_or((false, rw), |p| (true, p));
            if !optional || Path::new(path).exists() {
                writable.push(PathBuf::from(path));
            }
        }
        for rw in &writable {
            s += &format!("mount --bind '{0}' '{0}'\n", rw.display());
        }
        let tunables = one(unit, "ProtectKernelTunables", "no") == "yes";
        let system = one(unit, "ProtectSystem", "no");
        assert_eq!(system, "strict", "the test reproduces ProtectSystem=strict only");
        // ProtectSystem=strict: every mount read-only but /dev, /proc and /sys (which
        // ProtectKernelTunables= makes read-only too, with /proc/sys), and the writable ones.
        let keep: Vec<String> = writable.iter().map(|p| p.display().to_string()).collect();
        s += &format!(
            "awk '{{print $5}}' /proc/self/mountinfo | while read -r mp; do\n\
               case \"$mp\" in {keep}) continue;; /dev|/dev/*|/proc|/proc/[0-9]*) continue;; esac\n\
               case \"$mp\" in /sys|/sys/*) [ {tunables} = 1 ] || continue;; esac\n\
               mount -o remount,bind,ro \"$mp\" 2>/dev/null || true\n\
             done\n\
             [ {tunables} = 1 ] && mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys\n\
             if touch /usr/hvstats-sandbox-probe 2>/dev/null; then echo 'the file system is writable' >&2; exit 97; fi\n",
            keep = keep.iter().map(|k| format!("'{k}'")).collect::<Vec<_>>().join("|"),
            tunables = u8::from(tunables),
        );
        match one(unit, "ProtectHome", "no").as_str() {
            "yes" => {
                s += "for d in /home /root /run/user; do [ -d $d ] && mount -t tmpfs -o mode=0755 tmpfs $d; done\n"
            }
            "tmpfs" => {
                s += "for d in /home /root; do [ -d $d ] && mount -t tmpfs -o mode=0755 tmpfs $d; done\n"
            }
            // read-only: made so with every other mount above.
            "read-only" | "no" => {}
            other => panic!("ProtectHome={other}"),
        }
        if self.private_tmp {
            s += "mount -t tmpfs -o mode=1777 tmpfs /tmp\nmount -t tmpfs -o mode=1777 tmpfs /var/tmp\n";
        }
        if one(unit, "PrivateDevices", "no") == "yes" {
            // A /dev of its own with the pseudo-devices only, as systemd makes it.
            s += "mount -t tmpfs -o mode=0755,nosuid tmpfs /dev\n\
                  mknod -m 666 /dev/null c 1 3; mknod -m 666 /dev/zero c 1 5; mknod -m 666 /dev/full c 1 7\n\
                  mknod -m 666 /dev/random c 1 8; mknod -m 666 /dev/urandom c 1 9; mknod -m 666 /dev/tty c 5 0\n\
                  mkdir /dev/shm /dev/pts; mount -t tmpfs -o mode=1777 tmpfs /dev/shm\n\
                  ln -s /proc/self/fd /dev/fd; ln -s /proc/self/fd/0 /dev/stdin\n\
                  ln -s /proc/self/fd/1 /dev/stdout; ln -s /proc/self/fd/2 /dev/stderr\n\
                  mount -o remount,ro /dev\n\
                  if [ -e /dev/kvm ]; then echo '/dev is not private' >&2; exit 97; fi\n";
        }
        let caps = self.capabilities();
        let bounding: String = caps.iter().map(|c| format!(",+{c}")).collect();
        let nnp = if one(unit, "NoNewPrivileges", "no") == "yes" { "--no-new-privs" } else { "" };
        let quoted: Vec<String> = args.iter().map(|a| format!("'{a}'")).collect();
        // The unit runs /usr/bin/hvstats; a build whose checkout the sandbox would hide is run
        // from a copy beside the trace.
        let mut exe = PathBuf::from(env!("CARGO_BIN_EXE_hvstats"));
        if hidden_by_sandbox(&exe) {
            let copy = trace.parent().unwrap().join("hvstats");
            if !copy.exists() {
                std::fs::copy(&exe, &copy).unwrap();
            }
            exe = copy;
        }
        s += &format!(
            "exec setpriv --bounding-set=-all{bounding} --inh-caps=-all --ambient-caps=-all {nnp} \
             strace -f -qq -o '{}' '{}' {}\n",
            trace.display(),
            exe.display(),
            quoted.join(" ")
        );
        s
    }

    /// Starts `hvstats observe --all` with the default file's flags and `extra`, publishing into
    /// `runtime`, its trace into `trace`; its log lines.
    fn start(&self, runtime: &Path, trace: &Path, extra: &[String], env: &[(&str, String)]) -> Observer {
        let exec = setting(&self.unit, "ExecStart").pop().unwrap();
        let mut args: Vec<String> = Vec::new();
        for word in exec.split_whitespace().skip(1) {
            match word {
                "$HVSTATS_OBSERVE_ARGS" => args.extend(default_args("HVSTATS_OBSERVE_ARGS")),
                w => args.push(w.to_owned()),
            }
        }
        assert_eq!(args[..2], ["observe", "--all"], "{exec}");
        args.extend(extra.iter().cloned());
        args.extend(["--runtime-dir".to_owned(), runtime.display().to_string()]);
        let network = if one(&self.unit, "PrivateNetwork", "no") == "yes" { "--net" } else { "--mount" };
        // A process group of its own: strace forks the observer, which a kill of strace alone
        // would leave running.
        let mut child = Command::new("unshare")
            .process_group(0)
            .args(["--mount", network, "--propagation", "private", "sh", "-c"])
            .arg(self.script(runtime, trace, &args))
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let group = child.id() as i32;
        Observer { group, _child: KilledOnDrop(child), lines, log: String::new() }
    }
}

/// A running sandboxed observer and what it logged.
struct Observer {
    /// Its process group: unshare, setpriv and strace (one process, exec after exec) and the
    /// observer strace forks.
    group: i32,
    _child: KilledOnDrop,
    lines: std::sync::mpsc::Receiver<String>,
    log: String,
}

impl Drop for Observer {
    fn drop(&mut self) {
        // SAFETY: kill has no memory effects; the group is the one this test made.
        unsafe { libc::kill(-self.group, libc::SIGKILL) };
    }
}

impl Observer {
    /// Reads its log until a line holds every one of `needles` (at most two minutes).
    fn wait_line(&mut self, needles: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if let Ok(line) = self.lines.recv_timeout(Duration::from_millis(200)) {
                self.log.push_str(&line);
                self.log.push('\n');
                if needles.iter().all(|n| line.contains(n)) {
                    return line;
                }
            }
        }
        panic!("no line with {needles:?} in two minutes:\n{}", self.log);
    }

    /// What it logged so far.
    fn log(&mut self) -> &str {
        while let Ok(line) = self.lines.try_recv() {
            self.log.push_str(&line);
            self.log.push('\n');
        }
        &self.log
    }
}

/// The observer's count of refused VMs, from its instance's hypervisor counters.
fn refused(snapshot: &Value) -> Option<u64> {
    let key = total("Observer VMs refused");
    snapshot["instances"].as_array()?.iter().find_map(|i| i["hypervisor"]["counters"][&key].as_u64())
}

/// The system calls of a `strace -f -qq -o` trace, by name.
fn traced_syscalls(trace: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(trace).unwrap();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        // "PID name(args…) = r", "PID <... name resumed>…", "PID +++ exited …", "PID --- SIG… ---".
        let rest = line.split_once(' ').map_or(line, |(_, r)| r).trim_start();
        let rest = rest.strip_prefix("<... ").unwrap_or(rest);
        let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        if !name.is_empty() && rest[name.len()..].starts_with(['(', ' ']) && !rest.starts_with("+++") {
            names.insert(name);
        }
    }
    names
}

/// True when the tools the sandbox takes are here; a failure under CI (which installs them).
fn tools_present(test: &str) -> bool {
    for tool in ["setpriv", "unshare", "strace", "systemd-analyze"] {
        if Command::new(tool).arg("--version").output().is_err() {
            assert!(std::env::var("CI").is_err(), "{tool} is missing (.ci/run installs it)");
            eprintln!("{test}: {tool} is missing: skipped");
            return false;
        }
    }
    true
}

#[test]
fn every_system_call_the_stats_fd_path_needs_is_allowed_by_the_observers_filter() {
    let unit = std::fs::read_to_string(repo("packaging/systemd/hvstats-observe.service")).unwrap();
    if Command::new("systemd-analyze").arg("--version").output().is_err() {
        assert!(std::env::var("CI").is_err(), "systemd-analyze is missing");
        return;
    }
    let allowed = allowed_syscalls(&setting(&unit, "SystemCallFilter"));
    // Copying a VMM's KVM statistics descriptors (QEMU 8.1 and later hold one per vCPU) and
    // reading them: list and read /proc/PID/fd, pidfd_open, pidfd_getfd, pread; counting: BPF
    // and perf events; QMP and libvirt: Unix sockets; telling VM objects apart (a forked twin, a
    // VM replaced in place): kcmp, and the size of /proc/PID/fd.
    for call in [
        "kcmp",
        "statx",
        "openat",
        "getdents64",
        "readlinkat",
        "pidfd_open",
        "pidfd_getfd",
        "pread64",
        "close",
        "ioctl",
        "bpf",
        "perf_event_open",
        "socket",
        "connect",
        "sendmsg",
        "recvmsg",
        "prlimit64",
    ] {
        assert!(allowed.contains(call), "SystemCallFilter= of the observer's unit refuses {call}");
    }
    // pidfd_getfd is named because systemd 252's @system-service lacks it: were it given by the
    // group, this would not need the unit's own list.
    let group = allowed_syscalls(&["@system-service".to_owned()]);
    assert!(!group.contains("pidfd_getfd") && group.contains("pidfd_open"));
}

#[test]
fn the_observer_under_its_units_sandbox_observes_a_libvirt_domain_of_another_user_and_a_qmp_socket_in_tmp() {
    let test = "the_observer_under_its_units_sandbox_observes_a_libvirt_domain_of_another_user_and_a_qmp_socket_in_tmp";
    if !kvm_available(test) || !tools_present(test) {
        return;
    }
    if Path::new("/run/systemd/system").exists() {
        // systemd-run --pipe --wait -p … would apply the unit's own settings, seccomp included;
        // this host's service manager is what the sandbox below stands in for.
        eprintln!("{test}: systemd runs here; the sandbox is still reproduced by hand");
    }
    let Some(libvirtd) = Libvirtd::start("unit-sandbox") else { return };
    let tag = std::process::id();
    let guest = BiosProgram { cpuid: 10, end: BiosEnd::Halt, ..BiosProgram::default() }.image().unwrap();

    // (a) A libvirt domain: its QEMU runs as libvirt-qemu (the daemon's qemu.conf says so).
    let lv = format!("sandbox-lv-{tag}");
    let domain = libvirtd.run_domain(&lv, "5b2e0c1d-3f4a-4b5c-8d6e-7f8091a2b3c4", &guest);
    let owner = std::fs::metadata(format!("/proc/{}", domain.pid)).unwrap();
    let libvirt_qemu = Command::new("id").args(["-u", "libvirt-qemu"]).output().unwrap();
    let uid: u32 = String::from_utf8_lossy(&libvirt_qemu.stdout).trim().parse().unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&owner), uid, "the domain's QEMU runs as libvirt-qemu");

    // (b) A plain QEMU whose QMP socket is under /tmp.
    let tmp = TempDir::new("unit-sandbox");
    assert!(tmp.path().starts_with("/tmp"), "{}", tmp.path().display());
    let plain = format!("sandbox-qmp-{tag}");
    let socket = tmp.path().join("qmp.sock");
    let Some(qemu) = spawn_qemu(
        Command::new("qemu-system-x86_64")
            .args(["-accel", "kvm", "-display", "none", "-nodefaults", "-m", "16"])
            .args(["-name", &format!("guest={plain},debug-threads=on")])
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", socket.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        test,
    ) else {
        return;
    };
    let qemu = KilledOnDrop(qemu);
    wait_for_kvm_vcpus(qemu.0.id() as i32, 1, Duration::from_secs(30));

    // Only these two (other tests' VMs run on this host too); libvirt through the test's daemon.
    let filter: Vec<String> =
        [domain.pid, qemu.0.id() as i32].iter().flat_map(|p| ["--vm".to_owned(), p.to_string()]).collect();
    let env = [("LIBVIRT_DEFAULT_URI", format!("qemu:///system?socket={}", libvirtd.socket_ro().display()))];

    // The unit as shipped: both observed, libvirt's and QMP's sources up, nothing refused.
    let sandbox = Sandbox::shipped();
    assert!(sandbox.capabilities().contains(&"dac_read_search".to_owned()));
    let run = OutsideTmp::new("unit-sandbox-run");
    let traces = OutsideTmp::new("unit-sandbox-trace");
    let trace = traces.0.join("observe.trace");
    let mut observer = sandbox.start(&run.0, &trace, &filter, &env);
    observer.wait_line(&["attach pid", &lv]);
    observer.wait_line(&["attach pid", &plain]);
    let snapshot = snapshot_until(&run.0, "both sources up", |s| {
        for vm in [&lv, &plain] {
            if let Some(p) = partition(s, vm) {
                eprintln!("{vm}: {}", p["sources"]);
            }
        }
        partition(s, &lv).and_then(|p| source_up(p, "libvirt")) == Some(true)
            && partition(s, &plain).and_then(|p| source_up(p, "qmp")) == Some(true)
    });
    assert_eq!(refused(&snapshot), Some(0), "{snapshot:#}");
    let log = observer.log().to_owned();
    assert!(!log.contains("refused pid"), "{log}");
    // Its in-kernel counts are kept in the one path of /sys the unit lets it write (said at the
    // end of its first refresh).
    assert!(log.contains("in-kernel counts: kept in /sys/fs/bpf/hvstats/"), "{log}");
    // The VMMs' threads are walked alone under the unit's capabilities, not among the host's.
    assert!(!log.contains("walked among every task of the host"), "{log}");
    drop(observer);

    // Every system call it made is one its unit's SystemCallFilter= allows.
    let used = traced_syscalls(&trace);
    eprintln!("observed as the unit runs it:\n{log}system calls made: {used:?}");
    assert!(used.contains("perf_event_open") || used.contains("bpf"), "{used:?}");
    assert!(used.contains("connect"), "QMP and libvirt: {used:?}");
    let allowed = allowed_syscalls(&setting(&sandbox.unit, "SystemCallFilter"));
    let refused_calls: Vec<&String> = used.iter().filter(|c| !allowed.contains(*c)).collect();
    // Allowed by systemd whatever the filter: execve of the unit's own binary, and exit paths.
    let always = ["execve", "exit", "exit_group", "rt_sigreturn"];
    let refused_calls: Vec<&&String> =
        refused_calls.iter().filter(|c| !always.contains(&c.as_str())).collect();
    assert!(refused_calls.is_empty(), "made but not in SystemCallFilter=: {refused_calls:?}");

    // Without CAP_DAC_READ_SEARCH: the domain of another user is refused, counted, and the log
    // says the fix once; the QEMU of root's own is still observed.
    let sandbox = Sandbox { without: vec!["dac_read_search"], ..Sandbox::shipped() };
    let run = OutsideTmp::new("unit-sandbox-run-nodac");
    let mut observer = sandbox.start(&run.0, &trace, &filter, &env);
    let line = observer.wait_line(&["refused pid", &domain.pid.to_string()]);
    assert!(line.contains("CAP_DAC_READ_SEARCH") && line.contains(&format!("uid {uid}")), "{line}");
    observer.wait_line(&["attach pid", &plain]);
    let snapshot = snapshot_until(&run.0, "one refused", |s| refused(s) == Some(1));
    assert!(partition(&snapshot, &lv).is_none(), "{snapshot:#}");
    std::thread::sleep(Duration::from_secs(3));
    let log = observer.log().to_owned();
    assert_eq!(log.matches(&format!("refused pid {}", domain.pid)).count(), 1, "said once:\n{log}");
    drop(observer);

    // With a private /tmp (PrivateTmp=yes, which the unit no longer sets): the QMP socket is not
    // seen here, but is reached through the VMM's root (as the VMM sees it): QMP is up, nothing
    // refused.
    let sandbox = Sandbox { private_tmp: true, ..Sandbox::shipped() };
    let run = OutsideTmp::new("unit-sandbox-run-privtmp");
    let mut observer = sandbox.start(&run.0, &trace, &filter, &env);
    observer.wait_line(&["attach pid", &plain]);
    let snapshot = snapshot_until(&run.0, "the QMP socket reached through the VMM's root", |s| {
        partition(s, &plain).and_then(|p| source_up(p, "qmp")) == Some(true)
    });
    assert_eq!(refused(&snapshot), Some(0), "{snapshot:#}");
    let log = observer.log().to_owned();
    assert!(!log.contains(&format!("refused pid {}", qemu.0.id())), "{log}");
}

#[test]
fn the_observer_under_its_units_sandbox_lets_a_waiting_qmp_client_in_and_takes_the_session_back() {
    let test = "the_observer_under_its_units_sandbox_lets_a_waiting_qmp_client_in_and_takes_the_session_back";
    if !kvm_available(test) || !tools_present(test) {
        return;
    }
    let sandbox = Sandbox::shipped();
    assert_eq!(one(&sandbox.unit, "PrivateNetwork", "no"), "yes", "the unit's own network namespace");
    // A plain QEMU in the host's network namespace, its QMP socket under /tmp.
    let tmp = TempDir::new("unit-sandbox-yield");
    let tag = format!("sandbox-yield-{}", std::process::id());
    let qemu = common::QemuGuest::start(tmp.path(), &tag);
    let pid = qemu.pid().to_string();
    let run = OutsideTmp::new("unit-sandbox-yield-run");
    let traces = OutsideTmp::new("unit-sandbox-yield-trace");
    let mut observer =
        sandbox.start(&run.0, &traces.0.join("observe.trace"), &["--vm".to_owned(), pid.clone()], &[]);
    observer.wait_line(&["attach pid", &tag]);
    let qmp_up = |s: &Value| partition(s, &tag).and_then(|p| source_up(p, "qmp")) == Some(true);
    snapshot_until(&run.0, "the QMP session up", qmp_up);
    // The observer's connection, accepted by QEMU, lies in the observer's namespace.
    let held = || UnixSockets::read().unwrap().of(&qemu.qmp);
    assert_eq!(held(), PathUse { accepted: 1, waiting: 0 });

    // An operator's tool connects from the host's namespace: QEMU greets it once the observer
    // lets go (a generous bound: the observer refreshes every second).
    let t = Instant::now();
    let mut tool = hvstats_vmm::qmp::Qmp::connect(&qemu.qmp, Duration::from_secs(60))
        .expect("the observer let go of the socket for the waiting client");
    let greeted = t.elapsed();
    eprintln!("{test}: the waiting client was greeted after {greeted:?}");
    assert!(tool.is_running().unwrap());
    let lost = observer.wait_line(&[&format!("pid {pid} \"{tag}\": qmp lost")]);
    assert!(lost.contains("another client waits for the QMP socket"), "{lost}");
    // Once the tool is gone, the observer takes the session back.
    drop(tool);
    observer.wait_line(&[&format!("pid {pid} \"{tag}\": qmp back after")]);
    snapshot_until(&run.0, "the QMP session up again", qmp_up);
    let t = Instant::now();
    while held() != (PathUse { accepted: 1, waiting: 0 }) {
        assert!(t.elapsed() < Duration::from_secs(60), "{:?}\n{}", held(), observer.log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The pod of the KubeVirt VMI below, and the pod a VM run by a daemon outside any pod is
/// placed in.
const VMI_POD: &str = "6f2b1c3e-4d5a-4b6c-8d7e-9f0a1b2c3d4e";
const OTHER_POD: &str = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";

/// Whether `pid` is in another PID and mount namespace than this test.
fn in_namespaces_of_its_own(pid: i32) -> bool {
    let ns = |p: String, which: &str| std::fs::read_link(format!("/proc/{p}/ns/{which}")).unwrap();
    ["pid", "mnt"].iter().all(|which| ns(pid.to_string(), which) != ns("self".to_owned(), which))
}

#[test]
fn the_observer_under_its_units_sandbox_reads_a_kubevirt_vm_through_its_pods_own_libvirt_and_no_daemon_outside_the_pod()
 {
    let test = "the_observer_under_its_units_sandbox_reads_a_kubevirt_vm_through_its_pods_own_libvirt_and_no_daemon_outside_the_pod";
    if !kvm_available(test) || !tools_present(test) {
        return;
    }
    let kubelet = OutsideTmp::new("kubelet");
    // The VMI's pod: its libvirtd in session mode as `nobody`, in the pod's cgroup (systemd's
    // driver's names), its runtime directory the pod's volume; its QEMU in the daemon's PID and
    // mount namespaces, passed its monitor as a descriptor.
    let pod = PodCgroup::new(CgroupDriver::Systemd, VMI_POD).expect("a cgroup hierarchy to place the pod in");
    let Some(launcher) =
        Libvirtd::start_session("kubevirt-pod", &libvirt_volume(&kubelet.0, VMI_POD), Some(pod.path()))
    else {
        return;
    };
    let busy = BiosProgram { end: BiosEnd::OutForever, ..BiosProgram::default() }.image().unwrap();
    let vmi = launcher.run_kubevirt_domain("default_testvm", "5a9fc181-957e-5c32-9e5a-2de5e9673531", &busy);
    assert!(in_namespaces_of_its_own(vmi.pid), "the VMI's QEMU in PID and mount namespaces of its own");
    let cmdline = std::fs::read_to_string(format!("/proc/{}/cmdline", vmi.pid)).unwrap();
    assert!(cmdline.contains("socket,id=charmonitor,fd="), "its monitor is a descriptor: {cmdline:?}");
    assert!(cmdline.contains("manufacturer=KubeVirt"), "{cmdline:?}");

    // The same daemon outside any pod, its VM placed in another pod's cgroup (as root only
    // can), its socket in that pod's volume: not that pod's libvirt.
    let other = PodCgroup::new(CgroupDriver::Systemd, OTHER_POD).unwrap();
    let Some(outsider) =
        Libvirtd::start_session("kubevirt-outside", &libvirt_volume(&kubelet.0, OTHER_POD), None)
    else {
        return;
    };
    let idle = BiosProgram { cpuid: 10, end: BiosEnd::Halt, ..BiosProgram::default() }.image().unwrap();
    let forged = outsider.run_kubevirt_domain("prod_db", "7d1e2f30-4152-4637-8899-aabbccddeeff", &idle);
    other.add(forged.pid);

    let filter: Vec<String> =
        [vmi.pid, forged.pid].iter().flat_map(|p| ["--vm".to_owned(), p.to_string()]).collect();
    let env = [("HVSTATS_KUBELET_ROOT", kubelet.0.display().to_string())];
    let sandbox = Sandbox::shipped();
    let run = OutsideTmp::new("unit-sandbox-run-kubevirt");
    let traces = OutsideTmp::new("unit-sandbox-trace-kubevirt");
    // Other VMs of this host fill the log (it says at most so many lines at once): what the
    // observer did is read from what it publishes.
    let observer = sandbox.start(&run.0, &traces.0.join("observe.trace"), &filter, &env);

    // The VMI: counted through its pod's libvirt (its vCPU's exits move), named by it.
    let exits =
        |s: &Value| partition(s, "default_testvm")?["vps"][0]["counters"][total("Exits/sec")].as_u64();
    let first = snapshot_until(&run.0, "the pod's libvirt up", |s| {
        partition(s, "default_testvm").and_then(|p| source_up(p, "libvirt")) == Some(true)
            && exits(s).is_some()
    });
    let before = exits(&first).unwrap();
    let moved = snapshot_until(&run.0, "the VMI's exits moving", |s| exits(s) > Some(before));
    let vm = partition(&moved, "default_testvm").unwrap();
    assert_eq!(source_up(vm, "qmp"), None, "no QMP source for a monitor libvirt holds: {}", vm["sources"]);
    let line = vm_info(&run.0, vmi.pid, |l| l.contains("identity_source=\"pod-libvirt+cgroup\""));
    for label in [
        "platform=\"kubevirt\"",
        "namespace=\"default\"",
        "name=\"testvm\"",
        &format!("pod_uid=\"{VMI_POD}\""),
    ] {
        assert!(line.contains(label), "{label} not in {line}");
    }
    eprintln!("{test}: {line}\nexits {before} -> {:?}", exits(&moved));

    // The VM of the daemon outside the pod: its libvirt refused, its identity the command
    // line's in the pod's cgroup, never the daemon's.
    let line = vm_info(&run.0, forged.pid, |l| l.contains("platform="));
    assert!(line.contains("identity_source=\"cgroup+command-line\"") && line.contains(OTHER_POD), "{line}");
    let snapshot = snapshot_json(&run.0);
    let p = partition(&snapshot, "prod_db").expect("the VM of the daemon outside the pod is observed");
    assert_eq!(source_up(p, "libvirt"), Some(false), "its libvirt refused: {}", p["sources"]);
    drop(observer);
}
