//! A small QMP client: the QEMU Machine Protocol over a Unix socket.
//!
//! KVM refuses its binary stats fd to any process but the VM's owner, but QEMU relays the same
//! statistics through QMP's `query-stats`, and `query-cpus-fast` tells which thread runs which
//! vCPU. The client speaks just enough QMP for that: the greeting, `qmp_capabilities`, one
//! command at a time with its reply (asynchronous events in between are skipped).
//!
//! The peer is not trusted to be QEMU, or to be well: every exchange (the connect with its
//! greeting, each command with its reply) has one deadline for the whole of it, however the
//! bytes trickle in; a message is at most [`MAX_LINE`] bytes and never buffered beyond that; at
//! most [`MAX_EVENTS`] events are skipped while waiting for one reply; and a [`Cancel`] set by
//! another thread (a signal watcher) ends any wait within [`CANCEL_POLL`].

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The longest QMP message accepted, newline included. A `query-stats` reply carries about
/// 1.5 KiB per vCPU, so this holds VMs of several hundred vCPUs; a longer message is refused
/// after at most this many bytes were buffered.
pub const MAX_LINE: usize = 1 << 20;

/// The most asynchronous events skipped while waiting for one reply (QEMU sends a handful at
/// most; a peer streaming events without end is dropped instead of keeping a CPU busy).
pub const MAX_EVENTS: usize = 256;

/// How often a wait looks at its [`Cancel`].
pub const CANCEL_POLL: Duration = Duration::from_millis(100);

/// Bytes read from the socket at a time.
const CHUNK: usize = 64 << 10;

/// What a QMP socket held by another client looks like to us, said once.
const TAKEN: &str = "the QMP socket is taken by another client (libvirt?): QEMU serves one at a time";

/// A flag another thread sets to end every QMP wait now (a signal asked the observer to stop).
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// A flag not set yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the flag: waits in progress end within [`CANCEL_POLL`], later ones at once.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// True once [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// A QMP failure.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    /// The socket could not be connected.
    #[error("cannot connect to QMP socket {path}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The socket accepts no more clients, or QEMU never greeted: another client holds it.
    #[error("cannot use QMP socket {path}: {TAKEN}")]
    Taken {
        /// The socket.
        path: PathBuf,
    },
    /// Reading or writing failed (QEMU exited).
    #[error("QMP I/O failed")]
    Io(#[source] io::Error),
    /// The peer did not complete the exchange within its deadline.
    #[error("QMP {what}: no complete answer within {after:?}")]
    Timeout {
        /// The exchange (`greeting`, or the command).
        what: String,
        /// The deadline the whole exchange had.
        after: Duration,
    },
    /// The wait was cancelled (the observer is stopping).
    #[error("QMP {what}: cancelled")]
    Cancelled {
        /// The exchange.
        what: String,
    },
    /// QEMU sent something that is not QMP.
    #[error("QMP protocol error: {0}")]
    Protocol(String),
    /// QEMU answered the command with an error.
    #[error("QMP command {command} failed: {class}: {desc}")]
    Command {
        /// The command.
        command: String,
        /// QMP's error class.
        class: String,
        /// QMP's description.
        desc: String,
    },
}

impl QmpError {
    /// True when the session can go on after this error (QEMU refused one command); after any
    /// other error the stream is out of step or gone, and the session must be dropped.
    pub fn is_command_error(&self) -> bool {
        matches!(self, QmpError::Command { .. })
    }
}

/// A connected QMP session in command mode.
#[derive(Debug)]
pub struct Qmp {
    stream: UnixStream,
    /// Bytes received and not yet taken as a message (at most [`MAX_LINE`] + [`CHUNK`]).
    pending: Vec<u8>,
    /// How far `pending` was searched for a newline.
    scanned: usize,
    timeout: Duration,
    cancel: Cancel,
    version: Value,
}

/// One vCPU as `query-cpus-fast` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QmpCpu {
    /// QEMU's cpu index (the `N` of `CPU N/KVM`).
    pub index: u32,
    /// The thread that runs it.
    pub thread_id: i32,
    /// Its QOM path (the key of its `query-stats` entry).
    pub qom_path: String,
}

/// KVM statistics by name, as `query-stats` gives them (scalar values only).
pub type StatValues = BTreeMap<String, u64>;

/// The KVM statistics of a VM: the VM's own and each vCPU's, by QOM path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvmStatsReply {
    /// The VM statistics (`target: vm`).
    pub vm: StatValues,
    /// The vCPU statistics (`target: vcpu`), by QOM path.
    pub vcpus: BTreeMap<String, StatValues>,
}

impl Qmp {
    /// Connects to `path`, reads the greeting and enters command mode; each of the three
    /// exchanges (connect and greeting, `qmp_capabilities`) must finish within `timeout`.
    ///
    /// # Errors
    /// When the socket cannot be connected, is taken by another client, QEMU does not greet
    /// within `timeout`, or refuses `qmp_capabilities`.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Self, QmpError> {
        Self::connect_with(path, timeout, Cancel::new())
    }

    /// As [`connect`](Self::connect), with every wait of this session ended by `cancel`.
    ///
    /// # Errors
    /// As [`connect`](Self::connect), and [`QmpError::Cancelled`].
    pub fn connect_with(path: &Path, timeout: Duration, cancel: Cancel) -> Result<Self, QmpError> {
        let stream = connect_nonblocking(path)?;
        let mut me = Self { stream, pending: Vec::new(), scanned: 0, timeout, cancel, version: Value::Null };
        let deadline = Instant::now() + timeout;
        let greeting = match me.read_message("greeting", deadline) {
            // QEMU greets the moment it accepts a client; one that accepts none (it serves
            // another) leaves us in the listen backlog, unanswered.
            Err(QmpError::Timeout { .. }) if me.pending.is_empty() => {
                return Err(QmpError::Taken { path: path.to_owned() });
            }
            other => other?,
        };
        let Some(qmp) = greeting.get("QMP") else {
            return Err(QmpError::Protocol(format!("expected a greeting, got {}", clip(&greeting))));
        };
        me.version = qmp.get("version").cloned().unwrap_or(Value::Null);
        me.execute("qmp_capabilities", None)?;
        Ok(me)
    }

    /// QEMU's version object from the greeting.
    pub fn version(&self) -> &Value {
        &self.version
    }

    /// Waits until the socket is readable (or writable, `write`) or `deadline`, in slices that
    /// look at the cancel flag.
    fn wait(&self, what: &str, deadline: Instant, write: bool) -> Result<(), QmpError> {
        loop {
            if self.cancel.is_cancelled() {
                return Err(QmpError::Cancelled { what: what.to_owned() });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(QmpError::Timeout { what: what.to_owned(), after: self.timeout });
            }
            let slice = (deadline - now).min(CANCEL_POLL);
            let events = if write { libc::POLLOUT } else { libc::POLLIN };
            let mut fd = libc::pollfd { fd: self.stream.as_raw_fd(), events, revents: 0 };
            let ms = libc::c_int::try_from(slice.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
            // SAFETY: `fd` is one valid pollfd we own; the kernel writes only its `revents`.
            let rc = unsafe { libc::poll(&mut fd, 1, ms) };
            if rc > 0 {
                return Ok(());
            }
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(QmpError::Io(e));
                }
            }
        }
    }

    /// The next message that is not blank, complete by `deadline`.
    fn read_message(&mut self, what: &str, deadline: Instant) -> Result<Value, QmpError> {
        loop {
            if let Some(i) = self.pending[self.scanned..].iter().position(|b| *b == b'\n') {
                let end = self.scanned + i + 1;
                let line: Vec<u8> = self.pending.drain(..end).collect();
                self.scanned = 0;
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return serde_json::from_slice(&line).map_err(|e| QmpError::Protocol(e.to_string()));
            }
            self.scanned = self.pending.len();
            if self.pending.len() >= MAX_LINE {
                return Err(QmpError::Protocol(format!("{what}: a message longer than {MAX_LINE} bytes")));
            }
            self.wait(what, deadline, false)?;
            let mut chunk = [0u8; CHUNK];
            let room = (MAX_LINE - self.pending.len()).min(CHUNK);
            match self.stream.read(&mut chunk[..room]) {
                Ok(0) => {
                    return Err(QmpError::Io(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "QEMU closed the socket",
                    )));
                }
                Ok(n) => self.pending.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
                Err(e) => return Err(QmpError::Io(e)),
            }
        }
    }

    fn write_all(&mut self, what: &str, mut bytes: &[u8], deadline: Instant) -> Result<(), QmpError> {
        while !bytes.is_empty() {
            match self.stream.write(bytes) {
                Ok(0) => return Err(QmpError::Io(io::ErrorKind::WriteZero.into())),
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.wait(what, deadline, true)?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(QmpError::Io(e)),
            }
        }
        Ok(())
    }

    /// Runs `command` with `arguments` and returns its `return` value; the whole exchange
    /// (request, skipped events, reply) has the session's timeout.
    ///
    /// # Errors
    /// When the socket fails, the exchange does not finish in time, the peer is not QMP, or
    /// QEMU answers with an error.
    pub fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value, QmpError> {
        let deadline = Instant::now() + self.timeout;
        let mut request = json!({ "execute": command });
        if let Some(a) = arguments {
            request["arguments"] = a;
        }
        let mut text = request.to_string();
        text.push('\n');
        self.write_all(command, text.as_bytes(), deadline)?;
        let mut events = 0;
        loop {
            let reply = self.read_message(command, deadline)?;
            if let Some(r) = reply.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = reply.get("error") {
                let field = |k: &str| printable(e.get(k).and_then(Value::as_str).unwrap_or(""));
                return Err(QmpError::Command {
                    command: command.to_owned(),
                    class: field("class"),
                    desc: field("desc"),
                });
            }
            if reply.get("event").is_none() {
                return Err(QmpError::Protocol(format!("unexpected message {}", clip(&reply))));
            }
            events += 1;
            if events > MAX_EVENTS {
                return Err(QmpError::Protocol(format!(
                    "{command}: more than {MAX_EVENTS} events and no reply"
                )));
            }
        }
    }

    /// The VM's name (`-name guest=…`), if it has one.
    ///
    /// # Errors
    /// As [`execute`](Self::execute).
    pub fn query_name(&mut self) -> Result<Option<String>, QmpError> {
        let r = self.execute("query-name", None)?;
        Ok(r.get("name").and_then(Value::as_str).map(str::to_owned))
    }

    /// The VM's UUID (`-uuid`) as QEMU holds it; `None` when it was given none (QEMU says the
    /// nil UUID) or says something else than a UUID.
    ///
    /// # Errors
    /// As [`execute`](Self::execute).
    pub fn query_uuid(&mut self) -> Result<Option<hvstats::vmm::VmUuid>, QmpError> {
        let r = self.execute("query-uuid", None)?;
        Ok(r.get("UUID").and_then(Value::as_str).and_then(hvstats::vmm::VmUuid::parse))
    }

    /// The vCPUs and their threads.
    ///
    /// # Errors
    /// As [`execute`](Self::execute), or a reply of the wrong shape.
    pub fn query_cpus(&mut self) -> Result<Vec<QmpCpu>, QmpError> {
        let r = self.execute("query-cpus-fast", None)?;
        let list = r.as_array().ok_or_else(|| QmpError::Protocol("query-cpus-fast: not a list".into()))?;
        let mut cpus = Vec::with_capacity(list.len());
        for cpu in list {
            let index = cpu.get("cpu-index").and_then(Value::as_u64);
            let thread = cpu.get("thread-id").and_then(Value::as_i64);
            let qom = cpu.get("qom-path").and_then(Value::as_str);
            match (index, thread, qom) {
                (Some(i), Some(t), Some(q)) => cpus.push(QmpCpu {
                    index: u32::try_from(i)
                        .map_err(|_| QmpError::Protocol("cpu-index out of range".into()))?,
                    thread_id: i32::try_from(t)
                        .map_err(|_| QmpError::Protocol("thread-id out of range".into()))?,
                    qom_path: q.to_owned(),
                }),
                _ => {
                    return Err(QmpError::Protocol(format!("query-cpus-fast: bad entry {}", clip(cpu))));
                }
            }
        }
        Ok(cpus)
    }

    /// KVM's statistics of the VM and its vCPUs; `None` when QEMU has no KVM stats provider
    /// (TCG, or a KVM without binary stats) or no `query-stats` command.
    ///
    /// # Errors
    /// When the socket fails or QEMU answers another error.
    pub fn query_kvm_stats(&mut self) -> Result<Option<KvmStatsReply>, QmpError> {
        let mut reply = KvmStatsReply::default();
        for target in ["vm", "vcpu"] {
            let r = match self.execute("query-stats", Some(json!({ "target": target }))) {
                Ok(r) => r,
                Err(QmpError::Command { class, .. }) if class == "CommandNotFound" => return Ok(None),
                Err(e) => return Err(e),
            };
            for entry in r.as_array().map(Vec::as_slice).unwrap_or_default() {
                if entry.get("provider").and_then(Value::as_str) != Some("kvm") {
                    continue;
                }
                let values = scalar_stats(entry.get("stats"));
                if target == "vm" {
                    reply.vm.extend(values);
                } else if let Some(q) = entry.get("qom-path").and_then(Value::as_str) {
                    reply.vcpus.insert(q.to_owned(), values);
                }
            }
        }
        Ok((!reply.vm.is_empty() || !reply.vcpus.is_empty()).then_some(reply))
    }

    /// Resumes a paused VM.
    ///
    /// # Errors
    /// As [`execute`](Self::execute).
    pub fn cont(&mut self) -> Result<(), QmpError> {
        self.execute("cont", None).map(drop)
    }

    /// Whether the VM is running (`query-status`).
    ///
    /// # Errors
    /// As [`execute`](Self::execute).
    pub fn is_running(&mut self) -> Result<bool, QmpError> {
        let r = self.execute("query-status", None)?;
        Ok(r.get("running").and_then(Value::as_bool).unwrap_or(false))
    }
}

/// A non-blocking stream connected to `path` without waiting: a listener whose backlog is full
/// (QEMU serving another client) is [`QmpError::Taken`], not a connect that blocks.
fn connect_nonblocking(path: &Path) -> Result<UnixStream, QmpError> {
    let failed = |source: io::Error| QmpError::Connect { path: path.to_owned(), source };
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid (empty) value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(failed(io::Error::new(io::ErrorKind::InvalidInput, "not a usable socket path")));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: socket has no memory arguments; the result is checked before use.
    let raw = unsafe {
        libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0)
    };
    if raw < 0 {
        return Err(failed(io::Error::last_os_error()));
    }
    // SAFETY: `raw` is a descriptor socket just returned and nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    // SAFETY: `addr` is a valid sockaddr_un of at least `len` bytes; `fd` is our socket.
    let rc = unsafe { libc::connect(fd.as_raw_fd(), (&raw const addr).cast::<libc::sockaddr>(), len) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EAGAIN) => QmpError::Taken { path: path.to_owned() },
            _ => failed(e),
        });
    }
    Ok(UnixStream::from(fd))
}

/// A message for an error text: at most 200 characters of it.
fn clip(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

/// A peer's text for an error message: at most 200 characters, control characters escaped, so
/// it cannot break or forge a log line.
fn printable(s: &str) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i == 200 {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The scalar entries of a `stats` list (`[{ "name": .., "value": N }, ..]`); histograms skipped.
fn scalar_stats(stats: Option<&Value>) -> StatValues {
    let mut out = StatValues::new();
    for s in stats.and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default() {
        if let (Some(name), Some(value)) =
            (s.get("name").and_then(Value::as_str), s.get("value").and_then(Value::as_u64))
        {
            out.insert(name.to_owned(), value);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_scalar_stats_are_kept() {
        let v = json!([
            {"name": "exits", "value": 12},
            {"name": "halt_wait_hist", "value": [1, 2, 3]},
            {"name": "bad", "value": -1},
            {"value": 3}
        ]);
        let s = scalar_stats(Some(&v));
        assert_eq!(s.len(), 1);
        assert_eq!(s["exits"], 12);
        assert!(scalar_stats(None).is_empty());
    }

    #[test]
    fn a_peers_error_text_is_one_clipped_line() {
        assert_eq!(printable("no such\ncommand\u{1b}[2J"), "no such\\ncommand\\u{1b}[2J");
        assert_eq!(printable(&"d".repeat(500)).chars().count(), 201);
        assert_eq!(printable("plain — text"), "plain — text");
    }

    #[test]
    fn long_messages_are_clipped_in_error_texts() {
        let v = json!("x".repeat(1000));
        assert_eq!(clip(&v).chars().count(), 201);
        assert_eq!(clip(&json!(1)), "1");
    }
}
