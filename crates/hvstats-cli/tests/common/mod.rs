//! Set-up shared by the command's integration tests.

#![allow(dead_code)]

use std::path::Path;

#[allow(unused_imports, reason = "not every test file uses each of them")]
pub use hvstats_testkit::{TempDir, kvm_available};

/// The value of the sample line `series` (name and labels, exactly) in an exposition.
pub fn sample(text: &str, series: &str) -> Option<String> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ').map(str::to_owned))
}

/// A process's private resident memory (its heap: not the pages it maps), in KiB.
pub fn rss_anon_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// An instance this test process publishes under `dir` (logical processor 0 only), with the rest
/// of its configuration from `config`.
pub fn publish_with(dir: &Path, config: hvstats::InstanceConfig) -> std::sync::Arc<hvstats::Hypervisor> {
    hvstats::Hypervisor::with_config(hvstats::InstanceConfig {
        runtime_dir: Some(dir.to_path_buf()),
        logical_processors: Some(vec![0]),
        ..config
    })
    .unwrap()
}

/// An instance this test process publishes under `dir` (logical processor 0 only).
pub fn publish(dir: &Path) -> std::sync::Arc<hvstats::Hypervisor> {
    publish_with(dir, hvstats::InstanceConfig::default())
}

/// An instance published under `dir` (as [`publish`]) holding one partition of `vps` VPs.
pub fn publish_partition(
    dir: &Path,
    vps: u32,
) -> (std::sync::Arc<hvstats::Hypervisor>, std::sync::Arc<hvstats::PartitionStats>) {
    let hv = publish(dir);
    let part = hv.create_partition(vps).unwrap();
    (hv, part)
}

/// A KVM VM with one vCPU held by this test process (what a VMM holds), closed on drop.
pub fn hold_a_vm() -> hvstats_testkit::IdleVcpu {
    hvstats_testkit::IdleVcpu::new().expect("a VM with one vCPU")
}

/// Overwrites VP `n`'s page in `hv`'s arena with the page an older hypervisor writes: both TLFS
/// groups at 1.0 (the release group's 63 counters of seed 001, none appended), no hvstats group,
/// `values` at their places.
pub fn write_1_0_vp_page(
    hv: &hvstats::Hypervisor,
    part: &hvstats::PartitionStats,
    n: u32,
    values: &[(hvstats_abi::CounterId, u64)],
) {
    use hvstats_abi::group::GroupVersion;
    use hvstats_abi::{GroupKind, PageLayout};
    use std::os::unix::fs::FileExt;
    let v1_0 = [(GroupKind::Architectural, GroupVersion::V1_0), (GroupKind::Release, GroupVersion::V1_0)];
    let layout = PageLayout::written_at(hvstats_abi::ObjectKind::Vp, &v1_0);
    let mut page = layout.page();
    for &(id, v) in values {
        page.data[layout.slot_of(id).unwrap()] = v;
    }
    let arena = std::fs::OpenOptions::new().write(true).open(hv.published_path().unwrap()).unwrap();
    let bytes: Vec<u8> = page.data.iter().flat_map(|w| w.to_le_bytes()).collect();
    arena.write_all_at(&bytes, part.vp_page(n).unwrap().file_offset()).unwrap();
}

/// `hvstats snapshot --json` over `runtime`, which must succeed (status 0), or find nothing
/// published yet (status 4, an empty document).
pub fn snapshot_json(runtime: &Path) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["snapshot", "--json", "--runtime-dir"])
        .arg(runtime)
        .output()
        .unwrap();
    let nothing_published = out.status.code() == Some(4);
    assert!(
        out.status.success() || nothing_published,
        "{}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The partition named `name` in a snapshot.
pub fn partition<'a>(snapshot: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    snapshot["instances"]
        .as_array()?
        .iter()
        .find_map(|i| i["partitions"].as_array()?.iter().find(|p| p["name"].as_str() == Some(name)))
}

/// Whether the source `source` of partition `p` is up (`None`: the VM has no such source).
pub fn source_up(p: &serde_json::Value, source: &str) -> Option<bool> {
    p["sources"].as_array()?.iter().find(|s| s["name"] == source).and_then(|s| s["up"].as_bool())
}

/// Takes a snapshot of `run` until `done` holds (at most two minutes); the last one.
pub fn snapshot_until(
    run: &Path,
    what: &str,
    mut done: impl FnMut(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let t = std::time::Instant::now();
    loop {
        let s = snapshot_json(run);
        if done(&s) {
            return s;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(120),
            "{what}: not reached in two minutes:\n{s:#}"
        );
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// Starts `hvstats serve` over `dir` on a free loopback port with `flags`; it and its address.
pub fn serve(dir: &std::path::Path, flags: &[&str]) -> (KilledOnDrop, std::net::SocketAddr) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["serve", "--listen", "127.0.0.1:0", "--runtime-dir"])
        .arg(dir)
        .args(flags)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let addr = serving_addr(&mut child);
    (KilledOnDrop(child), addr)
}

/// The address `hvstats serve` (started with its standard output piped) listens on: its first
/// line, "serving http://ADDR/metrics".
pub fn serving_addr(child: &mut std::process::Child) -> std::net::SocketAddr {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("serving http://").and_then(|s| s.strip_suffix("/metrics"));
    addr.unwrap_or_else(|| panic!("unexpected first line {line:?}")).parse().unwrap()
}

/// The whole reply (head and body) to `GET path` over HTTP/1.0, read until `serve` closes.
pub fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
}

/// The flags that turn on every collector `serve` leaves off by default (VP histograms one by
/// one).
pub const EVERY_COLLECTOR: [&str; 6] = [
    "--collector.vp-detail",
    "--collector.histograms",
    "--collector.lp",
    "--collector.hypervisor",
    "--collector.partition",
    "--collector.mshv",
];

/// One `GET /metrics` from a `hvstats serve` started over `runtime` for it (and stopped after),
/// every collector on.
pub fn scrape(runtime: &Path) -> String {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(EVERY_COLLECTOR)
        .arg("--runtime-dir")
        .arg(runtime)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let addr = serving_addr(&mut child);
    let _serve = KilledOnDrop(child);
    http_get(addr, "/metrics")
}

/// The `hvstats_vm_info` line of the VM of VMM `pid`, once `until` holds of it (30 s at most).
pub fn vm_info(runtime: &std::path::Path, pid: i32, until: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let text = scrape(runtime);
        let line = text
            .lines()
            .find(|l| l.starts_with("hvstats_vm_info{") && l.contains(&format!("vmm_pid=\"{pid}\"")))
            .map(str::to_owned);
        match line {
            Some(line) if until(&line) => return line,
            _ if std::time::Instant::now() > deadline => {
                panic!("no vm_info of pid {pid} as awaited: {line:?}\n{text}")
            }
            _ => std::thread::sleep(std::time::Duration::from_millis(200)),
        }
    }
}

/// A child process killed and reaped when dropped (a failed assertion included).
pub struct KilledOnDrop(pub std::process::Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a plain HTTP/1.0 `GET /metrics` to `addr` gets before the server closes (or 10 s pass):
/// for a TLS port, no HTTP answer.
pub fn http_get_raw(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let _ = stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n");
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    String::from_utf8_lossy(&reply).into_owned()
}

/// The path of a Prometheus tool (`prometheus` or `promtool`, Debian's package `prometheus`), or
/// `None`: skipped, unless `HVSTATS_REQUIRE_PROMETHEUS=1` (CI installs it), where it fails.
pub fn prometheus_tool(name: &str, test: &str) -> Option<&'static str> {
    let path: &'static str = match name {
        "promtool" => "/usr/bin/promtool",
        _ => "/usr/bin/prometheus",
    };
    if Path::new(path).exists() {
        return Some(path);
    }
    let msg = format!("{test}: {path} is missing (Debian package prometheus)");
    assert!(std::env::var("HVSTATS_REQUIRE_PROMETHEUS").as_deref() != Ok("1"), "{msg}");
    eprintln!("{msg}: skipped");
    None
}

/// Starts the Prometheus server `prometheus` with the configuration `config` (YAML), its data and
/// configuration file under `work`, on a free loopback port; it and the address of its web API.
pub fn start_prometheus(prometheus: &str, config: &str, work: &Path) -> (KilledOnDrop, std::net::SocketAddr) {
    start_prometheus_with(prometheus, config, work, &[])
}

/// [`start_prometheus`] with more flags (`--enable-feature=native-histograms`).
pub fn start_prometheus_with(
    prometheus: &str,
    config: &str,
    work: &Path,
    flags: &[&str],
) -> (KilledOnDrop, std::net::SocketAddr) {
    spawn_prometheus(
        prometheus,
        config,
        &format!("--storage.tsdb.path={}", work.join("data").display()),
        work,
        flags,
    )
}

/// Starts `prometheus` in agent mode (`--enable-feature=agent`: it scrapes and remote-writes,
/// and neither stores nor queries) with the configuration `config`, its write-ahead log under
/// `work`; it and the address it listens on.
pub fn start_prometheus_agent(
    prometheus: &str,
    config: &str,
    work: &Path,
) -> (KilledOnDrop, std::net::SocketAddr) {
    let storage = format!("--storage.agent.path={}", work.join("agent").display());
    spawn_prometheus(prometheus, config, &storage, work, &["--enable-feature=agent"])
}

/// `prometheus` with `config` written under `work`, its storage flag `storage`, and `flags`, on a
/// free loopback port.
fn spawn_prometheus(
    prometheus: &str,
    config: &str,
    storage: &str,
    work: &Path,
    flags: &[&str],
) -> (KilledOnDrop, std::net::SocketAddr) {
    let file = work.join("prometheus.yml");
    std::fs::write(&file, config).unwrap();
    let web = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    let child = std::process::Command::new(prometheus)
        .arg(format!("--config.file={}", file.display()))
        .arg(storage)
        .arg(format!("--web.listen-address={web}"))
        .args(flags)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    (KilledOnDrop(child), web)
}

/// A loopback port nobody listens on now.
///
/// The port is below the kernel's ephemeral range (32768 and up), where the outgoing connections
/// of everything else on the host take their local ports: a port the kernel handed out as free
/// could be some client's by the time a server binds it. It is free on every address when chosen.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let (low, span) = (10_000u16, 22_000u16);
    let start = (std::process::id() % u32::from(span)) as u16;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = low + (start.wrapping_add(n.wrapping_mul(7919))) % span;
        let free = |host: &str| std::net::TcpListener::bind((host, port)).is_ok();
        let ipv6 = std::net::TcpListener::bind(("::1", 0)).is_ok();
        if free("0.0.0.0") && (!ipv6 || free("::")) {
            return port;
        }
    }
    panic!("no free port below the ephemeral range")
}

/// `s` percent-encoded for a URL's query string.
pub fn url_encoded(s: &str) -> String {
    s.bytes()
        .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

/// The JSON key of the catalog counter named `name` (of any kind: a name several kinds share has
/// one key) when the value is a total, as snapshots, `run --json` and `dump --json` give it.
pub fn total(name: &str) -> String {
    json_key(name, hvstats_present::json_keys::Held::Total)
}

/// As [`total`], for a delta over an interval (`top --once --json`, `report --json`).
pub fn delta(name: &str) -> String {
    json_key(name, hvstats_present::json_keys::Held::Delta)
}

/// As [`total`], for a value presented over an interval (a rate, a percentage, an average).
pub fn presented(name: &str) -> String {
    json_key(name, hvstats_present::json_keys::Held::Presented)
}

fn json_key(name: &str, held: hvstats_present::json_keys::Held) -> String {
    let counter =
        hvstats_abi::CATALOG.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no counter {name:?}"));
    hvstats_present::json_keys::key(counter, held)
}

/// A stand-in VMM: this test binary run again as `qemu-system-x86_64 … <args>` (its command line
/// is what an observer reads), holding a KVM VM with one vCPU, whose vCPU thread is named
/// `thread_name`, until its standard input closes. A line `exec ARG…` on its standard input makes
/// it `exec()` itself in place with those arguments (same pid, same start time, a new VM). The
/// test file must run [`fake_vmm_body`] from an ignored test named `fake_vmm`.
pub struct FakeVmm {
    pub child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

/// The environment variable that makes a test binary a [`FakeVmm`]; its value names the vCPU
/// thread.
const FAKE_VMM: &str = "HVSTATS_TEST_FAKE_VMM";

/// The environment variable naming the [`FakeVmm`]'s process (`comm`), when set.
pub const FAKE_VMM_COMM: &str = "HVSTATS_TEST_FAKE_VMM_COMM";

/// The environment variable giving the [`FakeVmm`]'s number of vCPUs (1 when unset), each with a
/// thread named `CPU N/KVM` when more than one.
pub const FAKE_VMM_VCPUS: &str = "HVSTATS_TEST_FAKE_VMM_VCPUS";

/// The environment variable that makes a [`FakeVmm`] (run by root) run its vCPU, leaving the
/// guest by an `out` every 10 ms, instead of holding an idle one: its exits then move.
pub const FAKE_VMM_PACED: &str = "HVSTATS_TEST_FAKE_VMM_PACED";

/// The environment variable naming the descriptor of `/dev/kvm` a [`FakeVmm`] run as `nobody`
/// makes its VM on (opened for it before it became `nobody`).
const FAKE_VMM_KVM_FD: &str = "HVSTATS_TEST_FAKE_VMM_KVM_FD";

/// The descriptor number [`as_nobody`] gives `/dev/kvm` in the child.
const KVM_FD_IN_CHILD: i32 = 200;

/// Makes `command` (a [`FakeVmm`]'s) run as `nobody` (uid and gid 65534, no groups), with a
/// descriptor of `/dev/kvm` opened for it first: `nobody` may not open `/dev/kvm` itself here.
pub fn as_nobody(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    command.env(FAKE_VMM_KVM_FD, KVM_FD_IN_CHILD.to_string());
    // SAFETY: between fork and exec only async-signal-safe calls are made (open, dup2, close,
    // setgroups, setgid, setuid), on no memory but a static path.
    unsafe {
        command.pre_exec(|| {
            let fd = libc::open(c"/dev/kvm".as_ptr(), libc::O_RDWR);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Opened without close-on-exec: if it is at its number already it stays there.
            if fd != KVM_FD_IN_CHILD {
                if libc::dup2(fd, KVM_FD_IN_CHILD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
            }
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(65534) != 0
                || libc::setuid(65534) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

impl FakeVmm {
    /// Starts one with `args` as its QEMU arguments and waits until it holds its VM.
    pub fn spawn(args: &[&str], thread_name: &str) -> Self {
        Self::spawn_with(args, thread_name, |_| {})
    }

    /// As [`spawn`](Self::spawn), with `adjust` applied to the command first.
    pub fn spawn_with(
        args: &[&str],
        thread_name: &str,
        adjust: impl FnOnce(&mut std::process::Command),
    ) -> Self {
        use std::os::unix::process::CommandExt;
        use std::process::{Command, Stdio};
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .arg0("qemu-system-x86_64")
            .args(fake_vmm_prefix())
            .args(args)
            .env(FAKE_VMM, thread_name)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        adjust(&mut command);
        let mut child = command.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut me = Self { child, stdin, stdout };
        me.wait_ready();
        me
    }

    /// Its pid.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Makes it `exec()` itself with `args` as its new QEMU arguments, and waits until the new
    /// program holds its VM.
    pub fn exec(&mut self, args: &[&str]) {
        use std::io::Write;
        writeln!(self.stdin, "exec {}", args.join(" ")).unwrap();
        self.wait_ready();
    }

    /// The thread id of its vCPU thread, once it holds its VM.
    fn wait_ready(&mut self) -> i32 {
        use std::io::BufRead;
        let mut line = String::new();
        loop {
            line.clear();
            assert!(self.stdout.read_line(&mut line).unwrap() > 0, "the stand-in VMM ended");
            if let Some(tid) = line.trim().strip_prefix("fake vmm ready: vcpu thread ") {
                return tid.parse().unwrap();
            }
        }
    }

    /// Kills it and reaps it now.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for FakeVmm {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The test harness's arguments that run only `fake_vmm`; QEMU-style arguments follow `--`. Read
/// as QEMU reads a command line, each option here takes the next argument as its value, so the
/// arguments after `--` are QEMU's own.
fn fake_vmm_prefix() -> [&'static str; 4] {
    ["--exact", "fake_vmm", "--ignored", "--"]
}

/// The body of a paced [`FakeVmm`] ([`FAKE_VMM_PACED`]): its vCPU threads, named `thread_name`
/// (`<thread_name> N` past one), run a guest that leaves it by an `out` every 10 ms; it says its
/// first vCPU thread and then waits for its end.
fn paced_vmm_body(thread_name: &str, vcpus: u64) -> ! {
    use std::io::Write;
    let name = |i: u64| if vcpus == 1 { thread_name.to_owned() } else { format!("{thread_name} {i}") };
    let _vm = hvstats_testkit::PacedVm::start_named(vcpus, std::time::Duration::from_millis(10), name)
        .expect("a running VM");
    // Each thread names itself once it runs: wait for the first's name (a minute at most).
    let first = name(0);
    let named = || {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .find(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == first))
            .map(|t| t.file_name().to_string_lossy().into_owned())
    };
    let since = std::time::Instant::now();
    let tid = loop {
        match named() {
            Some(tid) => break tid,
            None if since.elapsed() > std::time::Duration::from_secs(60) => panic!("no vCPU thread {first}"),
            None => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    };
    let mut out = std::io::stdout();
    writeln!(out, "fake vmm ready: vcpu thread {tid}").unwrap();
    out.flush().unwrap();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
    std::process::exit(0);
}

/// The body of a [`FakeVmm`]: nothing unless this process was started as one.
pub fn fake_vmm_body() {
    use std::io::{BufRead, Write};
    use std::os::unix::process::CommandExt;
    let Some(thread_name) = std::env::var_os(FAKE_VMM) else { return };
    if let Some(comm) = std::env::var_os(FAKE_VMM_COMM) {
        std::fs::write("/proc/self/comm", comm.as_encoded_bytes()).unwrap();
    }
    let vcpus: u64 = std::env::var(FAKE_VMM_VCPUS).ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let kvm = std::env::var(FAKE_VMM_KVM_FD).ok().and_then(|v| v.parse::<i32>().ok()).map(|fd| {
        use std::os::fd::FromRawFd;
        // SAFETY: the descriptor was opened for this process (`as_nobody`) and nothing else owns it.
        unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
    });
    if std::env::var_os(FAKE_VMM_PACED).is_some() {
        paced_vmm_body(&thread_name.to_string_lossy(), vcpus);
    }
    let _vm = hvstats_testkit::IdleVm::new(kvm, vcpus).expect("a VM");
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    for i in 0..vcpus {
        let name = match vcpus {
            1 => thread_name.to_string_lossy().into_owned(),
            _ => format!("CPU {i}/KVM"),
        };
        let tid_tx = tid_tx.clone();
        std::thread::Builder::new()
            .name(name)
            .stack_size(64 * 1024)
            .spawn(move || {
                // SAFETY: gettid has no arguments and no memory effects.
                let _ = tid_tx.send(unsafe { libc::syscall(libc::SYS_gettid) } as i32);
                loop {
                    std::thread::park();
                }
            })
            .unwrap();
    }
    let tid = tid_rx.recv().unwrap();
    for _ in 1..vcpus {
        tid_rx.recv().unwrap();
    }
    let mut out = std::io::stdout();
    writeln!(out, "fake vmm ready: vcpu thread {tid}").unwrap();
    out.flush().unwrap();
    for line in std::io::stdin().lock().lines().map_while(Result::ok) {
        if let Some(args) = line.strip_prefix("exec ") {
            let error = std::process::Command::new("/proc/self/exe")
                .arg0("qemu-system-x86_64")
                .args(fake_vmm_prefix())
                .args(args.split(' '))
                .exec();
            panic!("exec: {error}");
        }
    }
    std::process::exit(0);
}

/// A child killed and reaped on drop, with its output lines.
pub struct Running {
    pub child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    /// Every line read so far (a line waited for later may have come first).
    seen: std::cell::RefCell<Vec<String>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    /// Starts `hvstats ARGS --runtime-dir DIR`.
    pub fn start(args: &[&str], dir: &Path) -> Self {
        Self::start_with(args, dir, &[])
    }

    /// As [`Running::start`], with `env` added to its environment.
    pub fn start_with(args: &[&str], dir: &Path, env: &[(&str, &str)]) -> Self {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_hvstats"));
        command.args(args).envs(env.iter().copied()).arg("--runtime-dir").arg(dir);
        Self::spawn(command)
    }

    /// Starts `command` (`hvstats`, or a program that runs it, as `setpriv`).
    pub fn spawn(mut command: std::process::Command) -> Self {
        let mut child = command
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Standard output (serve's address) and error (the log), as lines of one stream.
        let (tx, lines) = std::sync::mpsc::channel();
        let out: Box<dyn std::io::Read + Send> = Box::new(child.stdout.take().unwrap());
        let err: Box<dyn std::io::Read + Send> = Box::new(child.stderr.take().unwrap());
        for stream in [out, err] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in std::io::BufRead::lines(std::io::BufReader::new(stream)).map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Self { child, lines, seen: Default::default() }
    }

    pub fn wait_line(&self, needle: &str) -> String {
        if let Some(line) = self.seen.borrow_mut().iter_mut().find(|l| l.contains(needle)) {
            // Taken: the next wait for the same text needs a new line.
            return std::mem::take(line);
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(line) => self.seen.borrow_mut().push(line),
                Err(e) => panic!("no line containing {needle:?}: {e}"),
            }
        }
    }

    /// The body `serve` answers for `path`.
    pub fn get(&self, path: &str) -> String {
        let reply = http_get(self.serving(), path);
        reply.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or(reply)
    }

    /// The address `serve` says it serves on.
    pub fn serving(&self) -> std::net::SocketAddr {
        let line = self.wait_line("serving http://");
        let addr = line.split("http://").nth(1).unwrap().split('/').next().unwrap().parse().unwrap();
        self.seen.borrow_mut().push(line);
        addr
    }

    /// `/metrics` in the OpenMetrics text, as Prometheus asks for it (with `_created`).
    pub fn openmetrics(&self) -> String {
        use std::io::{Read, Write};
        let addr = self.serving();
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
        write!(
            stream,
            "GET /metrics HTTP/1.0\r\nHost: {addr}\r\nAccept: application/openmetrics-text;version=1.0.0\r\n\r\n"
        )
        .unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        reply.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or(reply)
    }

    /// [`Running::openmetrics`] every 100 ms until `done` holds (at most `limit`); the last.
    pub fn openmetrics_until(
        &self,
        limit: std::time::Duration,
        mut done: impl FnMut(&str) -> bool,
    ) -> String {
        let t = std::time::Instant::now();
        loop {
            let m = self.openmetrics();
            if done(&m) {
                return m;
            }
            assert!(t.elapsed() < limit, "not reached in {limit:?}:\n{m}");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// Sends SIGTERM and waits (at most 5 s) for the process to end; its status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.end_with(libc::SIGTERM)
    }

    /// Sends `signal` and waits (at most 5 s) for the process to end; its status.
    pub fn end_with(&mut self, signal: libc::c_int) -> std::process::ExitStatus {
        // SAFETY: kill has no memory effects; the pid is our child's.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
        let t = std::time::Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(t.elapsed() < std::time::Duration::from_secs(5), "no exit 5 s after signal {signal}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Running {
    /// Scrapes `/metrics` every 100 ms until `done` holds (at most `limit`); the last scrape.
    pub fn metrics_until(&self, limit: std::time::Duration, mut done: impl FnMut(&str) -> bool) -> String {
        let t = std::time::Instant::now();
        loop {
            let m = self.get("/metrics");
            if done(&m) {
                return m;
            }
            assert!(t.elapsed() < limit, "not reached in {limit:?}:\n{m}");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// The lines said so far (and now) that contain `needle`.
    pub fn lines_with(&self, needle: &str) -> Vec<String> {
        let mut seen = self.seen.borrow_mut();
        seen.extend(self.lines.try_iter());
        seen.iter().filter(|l| l.contains(needle)).cloned().collect()
    }
}

/// A QEMU guest under KVM (SeaBIOS with no disk: it halts on a timer and touches ports now and
/// then) named `tag`, its QMP socket `<dir>/<tag>.sock` on its command line; killed on drop.
pub struct QemuGuest {
    pub child: std::process::Child,
    pub qmp: std::path::PathBuf,
}

impl QemuGuest {
    /// Starts it and waits (30 s at most) until its QMP socket and a vCPU are there.
    pub fn start(dir: &Path, tag: &str) -> Self {
        let qmp = dir.join(format!("{tag}.sock"));
        let child = std::process::Command::new("qemu-system-x86_64")
            .args(["-accel", "kvm", "-display", "none", "-nodefaults", "-m", "32"])
            .args(["-name", &format!("guest={tag},debug-threads=on")])
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp.display()))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("qemu-system-x86_64 starts (.ci/run installs it)");
        let me = Self { child, qmp };
        let t = std::time::Instant::now();
        while !me.qmp.exists() || hvstats_testkit::kvm_vcpus(me.pid()) < 1 {
            assert!(t.elapsed() < std::time::Duration::from_secs(30), "QEMU made no vCPU in 30 s");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        me
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for QemuGuest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The counter series of an exposition whose labels hold `vm="<vm>"`, by name (without `_total`
/// or `_created`) and labels: their `_total` value and their `_created`, when there is one.
pub fn counter_series(text: &str, vm: &str) -> std::collections::BTreeMap<String, (f64, Option<f64>)> {
    let label = format!("vm=\"{vm}\"");
    let mut out: std::collections::BTreeMap<String, (f64, Option<f64>)> = Default::default();
    for line in text.lines().filter(|l| !l.starts_with('#') && l.contains(&label)) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let Ok(value) = value.parse::<f64>() else { continue };
        let Some((name, labels)) = series.split_once('{') else { continue };
        if let Some(base) = name.strip_suffix("_total") {
            out.entry(format!("{base}{{{labels}")).or_insert((0.0, None)).0 = value;
        } else if let Some(base) = name.strip_suffix("_created") {
            out.entry(format!("{base}{{{labels}")).or_insert((f64::NAN, None)).1 = Some(value);
        }
    }
    out
}

/// `hvstats ARGS` on a host with no runtime directory yet: in a mount namespace of its own whose
/// `/run` is an empty tmpfs (so `/run/hvstats` does not exist), without `$HVSTATS_RUNTIME_DIR`.
/// `None` (the test skips) when this user may not make one (not root).
pub fn hvstats_without_runtime_dir(args: &[&str]) -> Option<std::process::Output> {
    if !rustix::process::geteuid().is_root() {
        eprintln!("not root: cannot hide /run in a mount namespace; skipped");
        return None;
    }
    let out = std::process::Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mount -t tmpfs tmpfs /run && exec \"$0\" \"$@\"",
        ])
        .arg(env!("CARGO_BIN_EXE_hvstats"))
        .args(args)
        .env_remove(hvstats::runtime_dir::RUNTIME_DIR_ENV)
        .output()
        .unwrap();
    Some(out)
}

/// Every value a systemd unit's text gives `key`, in order: a key given again adds to it
/// (SystemCallFilter=, CapabilityBoundingSet=), an empty value resets it, as systemd reads them.
pub fn unit_setting(unit: &str, key: &str) -> Vec<String> {
    let mut values = Vec::new();
    for line in unit.lines().map(str::trim).filter(|l| !l.starts_with('#')) {
        if let Some(v) = line.strip_prefix(key).and_then(|r| r.strip_prefix('=')) {
            match v.trim() {
                "" => values.clear(),
                v => values.push(v.to_owned()),
            }
        }
    }
    values
}

/// The capabilities of the host's observer (`CAP_BPF`, …) as `packaging/capabilities` lists them:
/// the one list its systemd unit and the Kubernetes DaemonSet grant.
pub fn observer_capabilities() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/capabilities");
    let list = std::fs::read_to_string(&path).expect("packaging/capabilities is there");
    list.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// A QEMU VM of `vcpus` vCPUs (SeaBIOS on one, then idle) named `name` with UUID `uuid` and a QMP
/// socket under `work`, and `hvstats observe` publishing it under `dir`; `None` without KVM or
/// QEMU (skipped, unless required: `test` names the test that says so).
pub fn observed_qemu(
    dir: &std::path::Path,
    work: &std::path::Path,
    (name, uuid, vcpus): (&str, &str, u32),
    test: &str,
) -> Option<(KilledOnDrop, KilledOnDrop)> {
    use std::process::{Command, Stdio};
    let qemu = KilledOnDrop(hvstats_testkit::spawn_qemu(
        Command::new("qemu-system-x86_64")
            .args(["-accel", "kvm", "-display", "none", "-nodefaults", "-m", "16", "-smp"])
            .arg(vcpus.to_string())
            .args(["-name", &format!("guest={name}"), "-uuid", uuid, "-qmp"])
            .arg(format!("unix:{},server=on,wait=off", work.join("qmp.sock").display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        test,
    )?);
    hvstats_testkit::wait_for_kvm_vcpus(
        qemu.0.id() as i32,
        vcpus as usize,
        std::time::Duration::from_secs(30),
    );
    let observer = Command::new(env!("CARGO_BIN_EXE_hvstats"))
        .args(["observe", "--pid", &qemu.0.id().to_string(), "--runtime-dir"])
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Some((qemu, KilledOnDrop(observer)))
}
