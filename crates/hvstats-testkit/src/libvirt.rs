//! A libvirt daemon of the test's own, with one QEMU domain, for tests of libvirt's statistics.
//!
//! `libvirtd` runs as root in a mount namespace of its own (`unshare --mount`): a private `/run`
//! and its state, configuration and cache directories bound to a temporary directory, so it shares
//! nothing with the host's libvirt (never started through the service manager) or another test.
//! Its sockets live in the temporary directory, seen from outside the namespace too. QEMU runs as
//! libvirt's unprivileged user (no "high privileges" taint), given `/dev/kvm` by a node inside the
//! namespace; no security driver, cgroup or namespace of libvirt's own is used.
//!
//! Or, as a KubeVirt pod runs its own ([`Libvirtd::start_session`]): `libvirtd` run as `nobody`
//! (with the `kvm` group) is libvirt in session mode, in PID and mount namespaces of its own, its
//! runtime directory (`XDG_RUNTIME_DIR=/run`, so its socket is `/run/libvirt/libvirt-sock`) bound
//! to a directory the test chooses (a pod volume's), and placed in a cgroup the test chooses
//! before it starts, so that its QEMUs are there too.

// Test set-up: a failed step is the test's failure, reported by the panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::TempDir;

/// A running libvirtd of the test's own; stopped (its domain destroyed) on drop.
pub struct Libvirtd {
    dir: TempDir,
    /// The daemon: `unshare` execs the shell, which execs libvirtd; or, in a PID namespace of
    /// its own, `unshare` forks the shell that starts libvirtd and is the namespace's init,
    /// killed when `unshare` ends (`--kill-child`; libvirtd itself, changing its user, would
    /// lose that signal), which ends every process of the namespace.
    daemon: Option<Child>,
    /// Its read-write socket.
    socket: PathBuf,
    /// Its QEMU driver's URI path: `system` or `session`.
    mode: &'static str,
}

/// A domain the daemon runs.
pub struct LibvirtDomain {
    /// Its name.
    pub name: String,
    /// Its UUID.
    pub uuid: String,
    /// Its QEMU process.
    pub pid: i32,
}

fn write(path: &Path, text: &str) -> std::io::Result<()> {
    std::fs::write(path, text)
}

impl Libvirtd {
    /// Starts a daemon; `None` (printing why) when libvirtd is not installed outside CI.
    ///
    /// # Panics
    /// When it is installed but does not start (a test set-up failure).
    pub fn start(tag: &str) -> Option<Self> {
        if !installed() {
            return None;
        }
        let dir = TempDir::new(tag);
        let d = dir.path();
        // QEMU runs as libvirt-qemu: it must reach the firmware file under this directory.
        let open = |p: &Path| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        open(d);
        for sub in ["etc", "lib", "cache", "log", "sock"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
            open(&d.join(sub));
        }
        let s = d.display();
        write(
            &d.join("libvirtd.conf"),
            &format!(
                "unix_sock_dir = \"{s}/sock\"\nunix_sock_ro_perms = \"0777\"\nunix_sock_rw_perms = \"0700\"\n\
                 auth_unix_ro = \"none\"\nauth_unix_rw = \"none\"\nlisten_tls = 0\nlisten_tcp = 0\n\
                 log_outputs = \"3:file:{s}/libvirtd.log\"\n"
            ),
        )
        .unwrap();
        write(
            &d.join("etc/qemu.conf"),
            "user = \"libvirt-qemu\"\ngroup = \"kvm\"\ndynamic_ownership = 0\nremember_owner = 0\n\
             security_driver = \"none\"\nnamespaces = []\ncgroup_controllers = []\nstdio_handler = \"file\"\n",
        )
        .unwrap();
        let script = format!(
            "set -e\n\
             mount -t tmpfs tmpfs /run\n\
             mount --bind {s}/etc /etc/libvirt\n\
             mount --bind {s}/lib /var/lib/libvirt\n\
             if [ -d /var/cache/libvirt ]; then mount --bind {s}/cache /var/cache/libvirt; fi\n\
             if [ -d /var/log/libvirt ]; then mount --bind {s}/log /var/log/libvirt; fi\n\
             mkdir -p /run/hvstats-dev\n\
             mknod /run/hvstats-dev/kvm c 10 232\n\
             chown root:kvm /run/hvstats-dev/kvm\n\
             chmod 660 /run/hvstats-dev/kvm\n\
             mount --bind /run/hvstats-dev/kvm /dev/kvm\n\
             exec /usr/sbin/libvirtd --config {s}/libvirtd.conf --pid-file {s}/libvirtd.pid\n"
        );
        write(&d.join("start.sh"), &script).unwrap();
        let socket = d.join("sock/libvirt-sock");
        Some(Self::launch(dir, &["--mount"], socket, "system"))
    }

    /// Starts `libvirtd` in session mode as `nobody` (and the `kvm` group, given `/dev/kvm` by a
    /// node inside its mount namespace), in PID and mount namespaces of its own, with its
    /// runtime directory bound to `runtime` (which `nobody` must be able to write) and, when
    /// given, in the cgroup directory `cgroup` from before it starts; `None` (printing why)
    /// when libvirtd is not installed outside CI.
    ///
    /// # Panics
    /// When it is installed but does not start.
    pub fn start_session(tag: &str, runtime: &Path, cgroup: Option<&Path>) -> Option<Self> {
        if !installed() {
            return None;
        }
        let dir = TempDir::new(tag);
        let d = dir.path();
        for sub in ["home", "config/libvirt", "cache"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        let s = d.display();
        // Its socket writable by all (libvirt's unix_sock_rw_perms): the observer connects as
        // root without CAP_DAC_OVERRIDE. QEMU's output to a file, not through virtlogd.
        write(
            &d.join("config/libvirt/libvirtd.conf"),
            &format!("unix_sock_rw_perms = \"0777\"\nlog_outputs = \"3:file:{s}/libvirtd.log\"\n"),
        )
        .unwrap();
        write(&d.join("config/libvirt/qemu.conf"), "stdio_handler = \"file\"\n").unwrap();
        let chown = Command::new("chown").args(["-R", "nobody:nogroup"]).arg(d).status().unwrap();
        assert!(chown.success(), "chown {s}");
        let place = cgroup.map(|c| format!("echo $$ > '{}/cgroup.procs'\n", c.display())).unwrap_or_default();
        let script = format!(
            "set -e\n{place}\
             mount -t tmpfs tmpfs /run\n\
             mkdir -p /run/hvstats-dev /run/libvirt\n\
             mknod /run/hvstats-dev/kvm c 10 232\n\
             chown root:kvm /run/hvstats-dev/kvm\n\
             chmod 660 /run/hvstats-dev/kvm\n\
             mount --bind /run/hvstats-dev/kvm /dev/kvm\n\
             mount --bind '{}' /run/libvirt\n\
             env -i HOME={s}/home XDG_RUNTIME_DIR=/run XDG_CONFIG_HOME={s}/config XDG_CACHE_HOME={s}/cache \
             PATH=/usr/sbin:/usr/bin:/bin setpriv --reuid=nobody --regid=nogroup --groups=kvm \
             --inh-caps=-all --bounding-set=-all /usr/sbin/libvirtd &\n\
             wait\n",
            runtime.display()
        );
        write(&d.join("start.sh"), &script).unwrap();
        // virsh is given the socket through a link of a short path: a pod volume's is longer than
        // a socket address holds.
        std::os::unix::fs::symlink(runtime, d.join("run")).unwrap();
        let socket = d.join("run/libvirt-sock");
        Some(Self::launch(dir, &["--pid", "--fork", "--kill-child", "--mount"], socket, "session"))
    }

    /// Runs the daemon's `start.sh` under `unshare` with `namespaces`, and waits for `socket`.
    fn launch(dir: TempDir, namespaces: &[&str], socket: PathBuf, mode: &'static str) -> Self {
        let child = Command::new("unshare")
            .args(namespaces)
            .args(["--propagation", "private", "sh"])
            .arg(dir.path().join("start.sh"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let me = Self { dir, daemon: Some(child), socket, mode };
        let t = Instant::now();
        while !me.socket.exists() {
            assert!(t.elapsed() < Duration::from_secs(30), "libvirtd made no socket in 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        me
    }

    /// The read-write socket.
    pub fn socket(&self) -> PathBuf {
        self.socket.clone()
    }

    /// The read-only socket (of a system daemon: a session daemon has none).
    pub fn socket_ro(&self) -> PathBuf {
        self.dir.path().join("sock/libvirt-sock-ro")
    }

    /// libvirt's URI of this daemon (read-write).
    pub fn uri(&self) -> String {
        format!("qemu:///{}?socket={}", self.mode, self.socket.display())
    }

    /// Runs `virsh` against this daemon; its standard output.
    ///
    /// # Panics
    /// When virsh fails.
    pub fn virsh(&self, args: &[&str]) -> String {
        let out = Command::new("virsh").arg("-c").arg(self.uri()).args(args).output().unwrap();
        assert!(out.status.success(), "virsh {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Defines and starts a domain of one vCPU and 16 MiB running `bios` (a `-bios` image), and
    /// waits for its QEMU to hold its vCPU.
    ///
    /// # Panics
    /// When the domain does not start.
    pub fn run_domain(&self, name: &str, uuid: &str, bios: &[u8]) -> LibvirtDomain {
        self.start_domain(name, uuid, bios, false)
    }

    /// As [`Self::run_domain`]; `paused`, its vCPU made but not run until `virsh resume`.
    ///
    /// # Panics
    /// As [`Self::run_domain`].
    pub fn start_domain(&self, name: &str, uuid: &str, bios: &[u8], paused: bool) -> LibvirtDomain {
        self.define_and_start(name, uuid, bios, paused, ("", ""))
    }

    /// As [`Self::run_domain`], shaped as KubeVirt defines a VMI's domain: SMBIOS system
    /// information whose manufacturer and family are KubeVirt (`-smbios type=1,…` on QEMU's
    /// command line).
    ///
    /// # Panics
    /// As [`Self::run_domain`].
    pub fn run_kubevirt_domain(&self, name: &str, uuid: &str, bios: &[u8]) -> LibvirtDomain {
        let sysinfo = "<sysinfo type='smbios'><system><entry name='manufacturer'>KubeVirt</entry>\
            <entry name='product'>None</entry><entry name='family'>KubeVirt</entry></system></sysinfo>";
        self.define_and_start(name, uuid, bios, false, (sysinfo, "<smbios mode='sysinfo'/>"))
    }

    /// Defines and starts the domain, with `extra`'s elements in `<domain>` and in `<os>`.
    fn define_and_start(
        &self,
        name: &str,
        uuid: &str,
        bios: &[u8],
        paused: bool,
        extra: (&str, &str),
    ) -> LibvirtDomain {
        let d = self.dir.path();
        let bios_path = d.join(format!("{name}.bin"));
        std::fs::write(&bios_path, bios).unwrap();
        let xml = format!(
            "<domain type='kvm'><name>{name}</name><uuid>{uuid}</uuid><memory unit='MiB'>16</memory>{}\
             <vcpu>1</vcpu><os><type arch='x86_64' machine='pc'>hvm</type><loader type='rom'>{}</loader>{}</os>\
             <devices><emulator>/usr/bin/qemu-system-x86_64</emulator><controller type='usb' model='none'/>\
             <memballoon model='none'/></devices></domain>",
            extra.0,
            bios_path.display(),
            extra.1
        );
        let xml_path = d.join(format!("{name}.xml"));
        std::fs::write(&xml_path, xml).unwrap();
        self.virsh(&["define", xml_path.to_str().unwrap()]);
        match paused {
            true => self.virsh(&["start", "--paused", name]),
            false => self.virsh(&["start", name]),
        };
        let t = Instant::now();
        let pid = loop {
            if let Some(pid) = qemu_of(uuid) {
                break pid;
            }
            assert!(t.elapsed() < Duration::from_secs(30), "the domain's QEMU did not appear");
            std::thread::sleep(Duration::from_millis(50));
        };
        LibvirtDomain { name: name.to_owned(), uuid: uuid.to_owned(), pid }
    }

    /// `virsh domstats --vcpu --vm` of `name`, as field → value.
    pub fn domstats(&self, name: &str) -> std::collections::BTreeMap<String, String> {
        let out = self.virsh(&["-r", "domstats", "--vcpu", "--vm", name]);
        out.lines()
            .filter_map(|l| l.trim().split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }
}

/// True when libvirtd is installed; where not, outside CI, says so (the test is skipped).
fn installed() -> bool {
    if Path::new("/usr/sbin/libvirtd").exists() {
        return true;
    }
    assert!(std::env::var("CI").is_err(), "libvirtd is not installed; .ci/run installs it");
    eprintln!("libvirtd is not installed: skipped");
    false
}

/// The QEMU process given `-uuid uuid` that holds a KVM vCPU.
fn qemu_of(uuid: &str) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let named = args.windows(2).any(|w| w[0] == b"-uuid" && w[1] == uuid.as_bytes());
        (named && crate::kvm_vcpus(pid) > 0).then_some(pid)
    })
}

impl Drop for Libvirtd {
    fn drop(&mut self) {
        // Its domains first (libvirtd would leave their QEMUs running), then the daemon itself.
        let list = Command::new("virsh").arg("-c").arg(self.uri()).args(["list", "--name"]).output();
        if let Ok(out) = list {
            for name in String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.trim().is_empty()) {
                let _ =
                    Command::new("virsh").arg("-c").arg(self.uri()).args(["destroy", name.trim()]).output();
            }
        }
        if let Some(mut daemon) = self.daemon.take() {
            if self.mode == "session" {
                // `unshare` waits on; its end kills the namespace's init, and so every process
                // in the namespace.
                let _ = daemon.kill();
                let _ = daemon.wait();
                return;
            }
            // SAFETY: kill has no memory effects; the pid is the daemon this set-up started and
            // has not reaped yet.
            unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
            let t = Instant::now();
            while matches!(daemon.try_wait(), Ok(None)) && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = daemon.kill();
            let _ = daemon.wait();
        }
    }
}
