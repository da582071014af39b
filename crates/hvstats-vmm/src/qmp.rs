//! A small QMP client: the QEMU Machine Protocol over a Unix socket.
//!
//! KVM refuses its binary stats fd to any process but the VM's owner, but QEMU relays the same
//! statistics through QMP's `query-stats`, `query-cpus-fast` tells which thread runs which vCPU
//! and `query-status` whether the VM runs. The client speaks just enough QMP for that: the
//! greeting, `qmp_capabilities`, and commands with their replies (asynchronous events in between
//! are skipped). A session can be waited on without blocking: [`Qmp::begin`] connects and
//! [`Qmp::greet`] reads the greeting when it has come; [`Qmp::send`] puts a request out and
//! [`Qmp::receive`] takes its reply by a deadline, so an observer asks every VM at once and waits
//! for them all within one deadline, and a QEMU that is stopped costs no wait after the first.
//!
//! The peer is not trusted to be QEMU, or to be well: every exchange (the connect with its
//! greeting, each command with its reply) has one deadline for the whole of it, however the
//! bytes trickle in; a message is at most [`MAX_LINE`] bytes and never buffered beyond that; at
//! most [`MAX_EVENTS`] events and [`MAX_BLANK`] bytes of blank lines are skipped while waiting
//! for one message; and a [`Cancel`] set by another thread (a signal watcher) ends any wait
//! within [`CANCEL_POLL`]. A silence is named for what it is: another client holding the socket
//! (the kernel's table of Unix sockets shows its connection, see [`super::unix_sockets`]), QEMU's
//! process stopped, or QEMU running but not answering (a stall).

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use hvstats_host::os::check;

use crate::kvm_stats::StatValues;

use crate::cancel::{CANCEL_POLL, Cancel};

/// The longest QMP message accepted, newline included. A `query-stats` reply carries about
/// 1.5 KiB per vCPU, so this holds VMs of several hundred vCPUs; a longer message is refused
/// after at most this many bytes were buffered.
pub const MAX_LINE: usize = 1 << 20;

/// The most asynchronous events skipped while waiting for one reply (QEMU sends a handful at
/// most; a peer streaming events without end is dropped instead of keeping a CPU busy).
pub const MAX_EVENTS: usize = 256;

/// The most bytes of blank lines skipped while waiting for one message: QEMU sends none, so a
/// peer that streams them is dropped after this, not read for the whole deadline.
pub const MAX_BLANK: usize = 64 << 10;

/// Bytes read from the socket at a time.
const CHUNK: usize = 64 << 10;

/// What a QMP socket held by another client looks like to us, said once.
const TAKEN: &str =
    "the QMP socket is taken by another client: QEMU serves one at a time; tried again once it leaves";

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
    /// The VMM whose command line names the socket could not connect to it itself (a directory
    /// on the way it may not search, a socket it may not write): not connected.
    #[error("the QMP socket {path} its command line names is one the VMM could not connect to itself: {why}")]
    Unreachable {
        /// The socket, as its command line names it.
        path: String,
        /// Where and why the VMM could not reach it.
        why: String,
    },
    /// The socket accepts no more clients, or QEMU never greeted while another client holds a
    /// connection to it.
    #[error("cannot use QMP socket {path}: {TAKEN}")]
    Taken {
        /// The socket.
        path: PathBuf,
    },
    /// Nothing came by the deadline and no other client holds the socket: QEMU's process is
    /// stopped, or it runs and its monitor does not answer.
    #[error("QMP {what}: no answer within {after:?}: {why}")]
    Stalled {
        /// The exchange (`greeting`, or the command).
        what: String,
        /// The deadline the whole exchange had.
        after: Duration,
        /// What QEMU's process is doing.
        why: &'static str,
    },
    /// Reading or writing failed (QEMU exited).
    #[error("QMP I/O failed")]
    Io(#[source] io::Error),
    /// The peer sent part of a message and did not complete it within the deadline.
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

    /// True when the peer may still answer later: the exchange ran out of time with nothing
    /// wrong said (a stopped or stalled QEMU, a socket another client holds).
    pub fn is_silence(&self) -> bool {
        matches!(self, QmpError::Stalled { .. } | QmpError::Taken { .. })
    }
}

/// What a stopped QEMU's silence is said to be.
const STOPPED: &str = "QEMU's process is stopped (SIGSTOP or a debugger)";
/// What a running QEMU's silence is said to be.
const STALL: &str = "QEMU's process runs but its monitor does not answer (a stall)";

/// A QMP session: connected, greeted once [`greet`](Qmp::greet) succeeded, then in command mode.
#[derive(Debug)]
pub struct Qmp {
    stream: UnixStream,
    path: PathBuf,
    /// Bytes received and not yet taken as a message (at most [`MAX_LINE`] + [`CHUNK`]).
    pending: Vec<u8>,
    /// How far `pending` was searched for a newline.
    scanned: usize,
    timeout: Duration,
    cancel: Cancel,
    version: Value,
    greeted: bool,
    /// Requests sent and not answered yet, oldest first: their ids and commands.
    outstanding: VecDeque<(u64, String)>,
    next_id: u64,
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

/// The most buckets a histogram of a reply keeps (KVM's log2 histograms have 32).
const MAX_BUCKETS: usize = 64;

/// The KVM statistics of a VM: the VM's own and each vCPU's, by QOM path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvmStatsReply {
    /// The VM statistics (`target: vm`).
    pub vm: StatValues,
    /// The vCPU statistics (`target: vcpu`), by QOM path.
    pub vcpus: BTreeMap<String, StatValues>,
}

/// What `query-stats` is asked for: its target, and the statistics wanted (all when empty).
pub fn stats_request(target: &str, names: &[&str]) -> Value {
    let mut provider = json!({ "provider": "kvm" });
    if !names.is_empty() {
        provider["names"] = json!(names);
    }
    json!({ "target": target, "providers": [provider] })
}

impl Qmp {
    /// Connects to `path`, reads the greeting and enters command mode; each of the two
    /// exchanges (connect and greeting, `qmp_capabilities`) must finish within `timeout`.
    ///
    /// # Errors
    /// When the socket cannot be connected, is taken by another client, QEMU does not greet
    /// within `timeout` (stopped or stalled), or refuses `qmp_capabilities`.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Self, QmpError> {
        Self::connect_with(path, timeout, Cancel::new())
    }

    /// As [`connect`](Self::connect), with every wait of this session ended by `cancel`.
    ///
    /// # Errors
    /// As [`connect`](Self::connect), and [`QmpError::Cancelled`].
    pub fn connect_with(path: &Path, timeout: Duration, cancel: Cancel) -> Result<Self, QmpError> {
        let mut me = Self::begin(path, timeout, cancel)?;
        me.greet(Instant::now() + timeout)?;
        Ok(me)
    }

    /// Connects to `path` without waiting for anything: the session is greeted by
    /// [`greet`](Self::greet), at once or at a later call (a QEMU that is stopped greets once
    /// it runs again; one serving another client, once that client leaves).
    ///
    /// # Errors
    /// When the socket cannot be connected, or its backlog is full ([`QmpError::Taken`]).
    pub fn begin(path: &Path, timeout: Duration, cancel: Cancel) -> Result<Self, QmpError> {
        Self::begin_via(path, path, timeout, cancel)
    }

    /// As [`begin`](Self::begin), connecting through `via` (a `/proc/self/fd/N` of the socket
    /// `path` names, opened and checked before) while the session is said to be `path`'s.
    ///
    /// # Errors
    /// As [`begin`](Self::begin).
    pub fn begin_via(path: &Path, via: &Path, timeout: Duration, cancel: Cancel) -> Result<Self, QmpError> {
        let stream = connect_nonblocking(path, via)?;
        Ok(Self {
            stream,
            path: path.to_owned(),
            pending: Vec::new(),
            scanned: 0,
            timeout,
            cancel,
            version: Value::Null,
            greeted: false,
            outstanding: VecDeque::new(),
            next_id: 0,
        })
    }

    /// Reads the greeting, waiting until `deadline` at most (a deadline passed reads what has
    /// come), and enters command mode (`qmp_capabilities`, within the session's timeout). Once
    /// greeted, returns at once.
    ///
    /// # Errors
    /// [`QmpError::Taken`], [`QmpError::Stalled`] or [`QmpError::Timeout`] when no greeting
    /// came by `deadline` (the session may still be greeted later); any other error when the
    /// peer is not QMP or is gone.
    pub fn greet(&mut self, deadline: Instant) -> Result<(), QmpError> {
        if self.greeted {
            return Ok(());
        }
        let greeting = self.read_message("greeting", deadline)?;
        let Some(qmp) = greeting.get("QMP") else {
            return Err(QmpError::Protocol(format!("expected a greeting, got {}", clip(&greeting))));
        };
        self.version = qmp.get("version").cloned().unwrap_or(Value::Null);
        self.greeted = true;
        self.execute("qmp_capabilities", None)?;
        Ok(())
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The session's timeout: what each exchange is given.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// QEMU's version object from the greeting.
    pub fn version(&self) -> &Value {
        &self.version
    }

    /// The process listening on the socket (the kernel's record of who bound it), if the kernel
    /// says.
    pub fn peer_pid(&self) -> Option<i32> {
        crate::peer::credentials(self.stream.as_fd()).map(|c| c.pid)
    }

    /// The process listening on the socket now ([`crate::peer`]: its pidfd where the kernel
    /// gives one, so a listener that exited is never taken for a process given its pid since).
    /// `None` when the listener has exited or is not visible here.
    pub fn listener_pid(&self) -> Option<i32> {
        crate::peer::listener_pid(self.stream.as_fd())
    }

    /// Waits until the socket is readable (or writable, `write`) or `deadline`, in slices that
    /// look at the cancel flag; a deadline already passed still looks once.
    fn wait(&self, what: &str, deadline: Instant, write: bool) -> Result<(), QmpError> {
        let mut looked = false;
        loop {
            if self.cancel.is_cancelled() {
                return Err(QmpError::Cancelled { what: what.to_owned() });
            }
            let now = Instant::now();
            if now >= deadline && looked {
                return Err(self.silence(what));
            }
            let slice = deadline.saturating_duration_since(now).min(CANCEL_POLL);
            let events = if write { libc::POLLOUT } else { libc::POLLIN };
            let mut fd = libc::pollfd { fd: self.stream.as_raw_fd(), events, revents: 0 };
            // A slice under a millisecond waits one (not a busy loop); a deadline passed, none.
            let ms = match slice.is_zero() {
                true => 0,
                false => libc::c_int::try_from(slice.as_millis().max(1)).unwrap_or(libc::c_int::MAX),
            };
            // SAFETY: `fd` is one valid pollfd we own; the kernel writes only its `revents`.
            let polled = check(unsafe { libc::poll(&mut fd, 1, ms) });
            looked = true;
            match polled {
                Ok(ready) if ready > 0 => return Ok(()),
                Err(e) if e.kind() != io::ErrorKind::Interrupted => return Err(QmpError::Io(e)),
                Ok(_) | Err(_) => {}
            }
        }
    }

    /// What it means that nothing (or not all of a message) came for `what` by its deadline:
    /// part of a message is a peer that drips ([`QmpError::Timeout`]); nothing at all is another
    /// client holding the socket, or QEMU stopped or stalled.
    fn silence(&self, what: &str) -> QmpError {
        if !self.pending.is_empty() {
            return QmpError::Timeout { what: what.to_owned(), after: self.timeout };
        }
        if !self.greeted {
            // Our connection waits in the backlog while it is not accepted; a connection QEMU
            // accepted is another client's then (ours, had QEMU accepted it, is the only one).
            let table = super::unix_sockets::UnixSockets::read_of([self.path.as_path()]).unwrap_or_default();
            let use_ = table.of(&self.path);
            let others = if use_.waiting > 0 { use_.accepted } else { use_.accepted.saturating_sub(1) };
            if others > 0 {
                return QmpError::Taken { path: self.path.clone() };
            }
        }
        let stopped = self.peer_pid().is_some_and(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().is_some_and(|text| {
                hvstats_host::task_stat::StatLine::parse(&text)
                    .and_then(|s| s.state())
                    .is_some_and(|c| c == 'T' || c == 't')
            })
        });
        let why = if stopped { STOPPED } else { STALL };
        QmpError::Stalled { what: what.to_owned(), after: self.timeout, why }
    }

    /// The next message that is not blank, complete by `deadline`.
    fn read_message(&mut self, what: &str, deadline: Instant) -> Result<Value, QmpError> {
        let mut blank = 0usize;
        loop {
            // Every complete line buffered: blank ones are skipped in one pass and dropped at
            // once (a peer streaming newlines costs a scan, not a copy per line).
            let mut start = 0;
            while let Some(i) = self.pending[self.scanned..].iter().position(|b| *b == b'\n') {
                let end = self.scanned + i + 1;
                self.scanned = end;
                if !self.pending[start..end].iter().all(u8::is_ascii_whitespace) {
                    let parsed = serde_json::from_slice(&self.pending[start..end]);
                    self.pending.drain(..end);
                    self.scanned = 0;
                    return parsed.map_err(|e| QmpError::Protocol(e.to_string()));
                }
                blank += end - start;
                start = end;
                if blank > MAX_BLANK {
                    self.pending.drain(..start);
                    self.scanned = 0;
                    return Err(QmpError::Protocol(format!(
                        "{what}: the peer sent more than {} KiB of blank lines and no message (QEMU sends none)",
                        MAX_BLANK >> 10
                    )));
                }
            }
            self.pending.drain(..start);
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

    /// Puts `command` with `arguments` out without waiting for its reply (taken by
    /// [`receive`](Self::receive), replies coming in the order of the requests).
    ///
    /// # Errors
    /// When the session is not greeted yet, or the request cannot be written within the
    /// session's timeout (the peer reads nothing) or at all.
    pub fn send(&mut self, command: &str, arguments: Option<Value>) -> Result<(), QmpError> {
        self.send_all(&[(command, arguments)])
    }

    /// Puts every request of `requests` out at once, in one write, without waiting for their
    /// replies (as [`send`](Self::send) each).
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub fn send_all(&mut self, requests: &[(&str, Option<Value>)]) -> Result<(), QmpError> {
        let mut text = String::new();
        let mut ids = Vec::with_capacity(requests.len());
        for (command, arguments) in requests {
            if !self.greeted && *command != "qmp_capabilities" {
                return Err(QmpError::Protocol(format!("{command}: the session is not greeted yet")));
            }
            let id = self.next_id;
            self.next_id += 1;
            let mut request = json!({ "execute": command, "id": id });
            if let Some(a) = arguments {
                request["arguments"] = a.clone();
            }
            text.push_str(&request.to_string());
            text.push('\n');
            ids.push((id, (*command).to_owned()));
        }
        let what = requests.first().map_or("", |(c, _)| *c);
        self.write_all(what, text.as_bytes(), Instant::now() + self.timeout)?;
        self.outstanding.extend(ids);
        Ok(())
    }

    /// The reply to the oldest request not answered yet, by `deadline` (events in between are
    /// skipped). A reply that does not come in time stays awaited: a later call may take it.
    ///
    /// # Errors
    /// When nothing is awaited, the reply does not come by `deadline` ([`QmpError::Stalled`],
    /// [`QmpError::Timeout`]), the socket fails, the peer is not QMP or answers out of order, or
    /// QEMU answers with an error ([`QmpError::Command`]; the session goes on).
    pub fn receive(&mut self, deadline: Instant) -> Result<Value, QmpError> {
        let Some((id, command)) = self.outstanding.front().cloned() else {
            return Err(QmpError::Protocol("no request is awaiting a reply".into()));
        };
        let mut events = 0;
        loop {
            let reply = self.read_message(&command, deadline)?;
            if reply.get("return").is_none() && reply.get("error").is_none() {
                if reply.get("event").is_none() {
                    return Err(QmpError::Protocol(format!("unexpected message {}", clip(&reply))));
                }
                events += 1;
                if events > MAX_EVENTS {
                    return Err(QmpError::Protocol(format!(
                        "{command}: more than {MAX_EVENTS} events and no reply"
                    )));
                }
                continue;
            }
            // QEMU echoes a request's id; a reply without one is taken as in order.
            if reply.get("id").is_some_and(|got| got.as_u64() != Some(id)) {
                return Err(QmpError::Protocol(format!(
                    "{command}: a reply to another request {}",
                    clip(reply.get("id").unwrap_or(&Value::Null))
                )));
            }
            self.outstanding.pop_front();
            if let Some(r) = reply.get("return") {
                return Ok(r.clone());
            }
            let e = reply.get("error").unwrap_or(&Value::Null);
            let field = |k: &str| printable(e.get(k).and_then(Value::as_str).unwrap_or(""));
            return Err(QmpError::Command { command, class: field("class"), desc: field("desc") });
        }
    }

    /// Runs `command` with `arguments` and returns its `return` value; the whole exchange
    /// (request, skipped events, reply) has the session's timeout.
    ///
    /// # Errors
    /// When the socket fails, the exchange does not finish in time, the peer is not QMP, or
    /// QEMU answers with an error.
    pub fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value, QmpError> {
        if !self.outstanding.is_empty() {
            return Err(QmpError::Protocol(format!("{command}: an earlier request awaits its reply")));
        }
        self.send(command, arguments)?;
        self.receive(Instant::now() + self.timeout)
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
        parse_cpus(&self.execute("query-cpus-fast", None)?)
    }

    /// KVM's statistics of the VM and its vCPUs (every one QEMU has); `None` when QEMU has no
    /// KVM stats provider (TCG, or a KVM without binary stats) or no `query-stats` command.
    ///
    /// # Errors
    /// When the socket fails or QEMU answers another error.
    pub fn query_kvm_stats(&mut self) -> Result<Option<KvmStatsReply>, QmpError> {
        let mut reply = KvmStatsReply::default();
        for target in ["vm", "vcpu"] {
            let r = match self.execute("query-stats", Some(stats_request(target, &[]))) {
                Ok(r) => r,
                Err(QmpError::Command { class, .. }) if class == "CommandNotFound" => return Ok(None),
                Err(e) => return Err(e),
            };
            add_stats(&mut reply, target, &r);
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

/// The vCPUs of a `query-cpus-fast` reply.
///
/// # Errors
/// A reply of the wrong shape.
pub fn parse_cpus(r: &Value) -> Result<Vec<QmpCpu>, QmpError> {
    let list = r.as_array().ok_or_else(|| QmpError::Protocol("query-cpus-fast: not a list".into()))?;
    let mut cpus = Vec::with_capacity(list.len());
    for cpu in list {
        let index = cpu.get("cpu-index").and_then(Value::as_u64);
        let thread = cpu.get("thread-id").and_then(Value::as_i64);
        let qom = cpu.get("qom-path").and_then(Value::as_str);
        match (index, thread, qom) {
            (Some(i), Some(t), Some(q)) => cpus.push(QmpCpu {
                index: u32::try_from(i).map_err(|_| QmpError::Protocol("cpu-index out of range".into()))?,
                thread_id: i32::try_from(t)
                    .map_err(|_| QmpError::Protocol("thread-id out of range".into()))?,
                qom_path: q.to_owned(),
            }),
            _ => return Err(QmpError::Protocol(format!("query-cpus-fast: bad entry {}", clip(cpu)))),
        }
    }
    Ok(cpus)
}

/// Adds the `kvm` provider's statistics of a `query-stats` reply for `target` (`vm` or `vcpu`)
/// to `reply`.
pub fn add_stats(reply: &mut KvmStatsReply, target: &str, r: &Value) {
    for entry in r.as_array().map(Vec::as_slice).unwrap_or_default() {
        if entry.get("provider").and_then(Value::as_str) != Some("kvm") {
            continue;
        }
        let values = scalar_stats(entry.get("stats"));
        if target == "vm" {
            reply.vm.extend(values);
        } else if let Some(q) = entry.get("qom-path").and_then(Value::as_str) {
            reply.vcpus.entry(q.to_owned()).or_default().extend(values);
        }
    }
}

/// The run state of a `query-status` reply (QAPI `RunState`), as QEMU names it.
pub fn parse_status(r: &Value) -> Option<&str> {
    r.get("status").and_then(Value::as_str)
}

/// A non-blocking stream connected to `path` (through `via`) without waiting: a listener whose
/// backlog is full (QEMU serving another client) is [`QmpError::Taken`], not a connect that
/// blocks.
fn connect_nonblocking(path: &Path, via: &Path) -> Result<UnixStream, QmpError> {
    let failed = |source: io::Error| QmpError::Connect { path: path.to_owned(), source };
    let bytes = via.as_os_str().as_bytes();
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
    let raw = check(raw).map_err(failed)?;
    // SAFETY: `raw` is a descriptor socket just returned and nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let len = (std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    // SAFETY: `addr` is a valid sockaddr_un of at least `len` bytes; `fd` is our socket.
    let rc = unsafe { libc::connect(fd.as_raw_fd(), (&raw const addr).cast::<libc::sockaddr>(), len) };
    if let Err(e) = check(rc) {
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

/// The entries of a `stats` list (`[{ "name": .., "value": N }, ..]`): single values, and
/// histograms (`"value": [N, ..]`, at most [`MAX_BUCKETS`] buckets, every one a count); an entry
/// of any other shape is left out.
fn scalar_stats(stats: Option<&Value>) -> StatValues {
    let mut out = StatValues::default();
    for s in stats.and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default() {
        let Some(name) = s.get("name").and_then(Value::as_str) else { continue };
        match s.get("value") {
            Some(Value::Array(buckets)) if !buckets.is_empty() && buckets.len() <= MAX_BUCKETS => {
                let counts: Option<Vec<u64>> = buckets.iter().map(Value::as_u64).collect();
                if let Some(counts) = counts {
                    out.set_histogram(name, counts);
                }
            }
            Some(v) => {
                if let Some(value) = v.as_u64() {
                    out.set(name, value);
                }
            }
            None => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_values_and_histograms_are_kept_and_nothing_else() {
        let v = json!([
            {"name": "exits", "value": 12},
            {"name": "halt_wait_hist", "value": [1, 2, 3]},
            {"name": "bad", "value": -1},
            {"name": "bad_hist", "value": [1, -2]},
            {"name": "huge_hist", "value": vec![1; 65]},
            {"name": "empty_hist", "value": []},
            {"value": 3}
        ]);
        let s = scalar_stats(Some(&v));
        assert_eq!(s.len(), 2);
        assert_eq!(s.get("exits"), Some(&12));
        assert_eq!(s.histogram("halt_wait_hist"), Some(&[1, 2, 3][..]));
        assert_eq!(s.histogram("bad_hist"), None);
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
