//! A small QMP client: the QEMU Machine Protocol over a Unix socket.
//!
//! KVM refuses its binary stats fd to any process but the VM's owner, but QEMU relays the same
//! statistics through QMP's `query-stats`, and `query-cpus-fast` tells which thread runs which
//! vCPU. The client speaks just enough QMP for that: the greeting, `qmp_capabilities`, one
//! command at a time with its reply (asynchronous events in between are skipped), and a timeout
//! on every read so a stuck QEMU cannot hang the observer.

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

/// The longest QMP line accepted (a `query-stats` reply of a large VM is well below this).
const MAX_LINE: usize = 16 << 20;

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
    /// Reading or writing failed (QEMU exited, or timed out).
    #[error("QMP I/O failed")]
    Io(#[source] io::Error),
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

/// A connected QMP session in command mode.
#[derive(Debug)]
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
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
    /// Connects to `path`, reads the greeting and enters command mode.
    ///
    /// # Errors
    /// When the socket cannot be connected, QEMU does not greet within `timeout`, or refuses
    /// `qmp_capabilities`.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Self, QmpError> {
        let stream = UnixStream::connect(path)
            .map_err(|source| QmpError::Connect { path: path.to_owned(), source })?;
        stream.set_read_timeout(Some(timeout)).map_err(QmpError::Io)?;
        stream.set_write_timeout(Some(timeout)).map_err(QmpError::Io)?;
        let writer = stream.try_clone().map_err(QmpError::Io)?;
        let mut me = Self { reader: BufReader::new(stream), writer, version: Value::Null };
        let greeting = me.read_message()?;
        let Some(qmp) = greeting.get("QMP") else {
            return Err(QmpError::Protocol(format!("expected a greeting, got {greeting}")));
        };
        me.version = qmp.get("version").cloned().unwrap_or(Value::Null);
        me.execute("qmp_capabilities", None)?;
        Ok(me)
    }

    /// QEMU's version object from the greeting.
    pub fn version(&self) -> &Value {
        &self.version
    }

    fn read_message(&mut self) -> Result<Value, QmpError> {
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = Read::take(&mut self.reader, MAX_LINE as u64)
                .read_until(b'\n', &mut line)
                .map_err(QmpError::Io)?;
            if n == 0 {
                return Err(QmpError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "QEMU closed the socket",
                )));
            }
            if !line.ends_with(b"\n") {
                return Err(QmpError::Protocol(format!("a message longer than {MAX_LINE} bytes")));
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            return serde_json::from_slice(&line).map_err(|e| QmpError::Protocol(e.to_string()));
        }
    }

    /// Runs `command` with `arguments` and returns its `return` value.
    ///
    /// # Errors
    /// When the socket fails, or QEMU answers with an error.
    pub fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value, QmpError> {
        let mut request = json!({ "execute": command });
        if let Some(a) = arguments {
            request["arguments"] = a;
        }
        let mut text = request.to_string();
        text.push('\n');
        self.writer.write_all(text.as_bytes()).map_err(QmpError::Io)?;
        loop {
            let reply = self.read_message()?;
            if let Some(r) = reply.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = reply.get("error") {
                let field = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
                return Err(QmpError::Command {
                    command: command.to_owned(),
                    class: field("class"),
                    desc: field("desc"),
                });
            }
            if reply.get("event").is_none() {
                return Err(QmpError::Protocol(format!("unexpected message {reply}")));
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
                _ => return Err(QmpError::Protocol(format!("query-cpus-fast: bad entry {cpu}"))),
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
}
