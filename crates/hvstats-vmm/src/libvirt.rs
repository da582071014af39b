//! A read-only client of libvirt's remote protocol, for its bulk domain statistics.
//!
//! libvirt's daemons (`libvirtd`, or `virtqemud`) answer its RPC protocol (XDR records over a unix
//! socket) on a read-only socket. This client speaks just what statistics need: authentication
//! when the socket asks for it (none, or polkit), `CONNECT_OPEN` read-only, `DOMAIN_LOOKUP_BY_UUID`,
//! `CONNECT_GET_ALL_DOMAIN_STATS` (`virConnectGetAllDomainStats`, what `virsh domstats` calls) and
//! `DOMAIN_GET_METADATA` (`virDomainGetMetadata`, for OpenStack Nova's identity of the domain).
//! A read-only connection cannot change or taint a domain. Linking libvirt itself would make it a
//! dependency of every host; speaking the protocol costs nothing where libvirt is absent.
//!
//! Nothing the daemon sends is trusted: every length is bounded, every read checked, and a reply
//! that does not parse is an error, never a panic. [`Libvirt::connect`] sends nothing to a socket
//! whose listener is not root (the kernel's record, `SO_PEERCRED`): libvirt's system daemons run
//! as root, and a socket another user serves ([`LibvirtError::Foreign`]) is not libvirt's system
//! daemon, wherever it is. [`Libvirt::connect_any`] speaks to a daemon of any user (a session
//! daemon, as a KubeVirt pod runs its own), and leaves binding that daemon to a VMM to its caller,
//! which knows what the daemon must be ([`Libvirt::daemon`], [`Libvirt::daemon_uid`]).

use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The remote program and its version.
const PROGRAM: u32 = 0x2000_8086;
const VERSION: u32 = 1;
/// Procedures used.
const PROC_CONNECT_OPEN: i32 = 1;
const PROC_DOMAIN_LOOKUP_BY_UUID: i32 = 24;
const PROC_DOMAIN_GET_METADATA: i32 = 265;
const PROC_AUTH_LIST: i32 = 66;
const PROC_AUTH_POLKIT: i32 = 70;
const PROC_CONNECT_GET_ALL_DOMAIN_STATS: i32 = 344;
/// `virConnectFlags`: read-only.
const CONNECT_RO: u32 = 1;
/// `virDomainMetadataType`: an element of the application's namespace.
const METADATA_ELEMENT: u32 = 2;
/// `VIR_ERR_NO_DOMAIN_METADATA`: the domain has no such metadata.
const ERR_NO_DOMAIN_METADATA: i32 = 80;
/// Authentication types.
const AUTH_NONE: i32 = 0;
const AUTH_POLKIT: i32 = 2;
/// Message types and statuses.
const CALL: u32 = 0;
const REPLY: u32 = 1;
const STATUS_OK: u32 = 0;
/// The largest message accepted (libvirt's own limit is 32 MiB; statistics of one domain are a
/// few KiB).
const MAX_MESSAGE: usize = 4 << 20;
/// The longest string or list accepted.
const MAX_ITEMS: usize = 1 << 16;

/// `virDomainStatsTypes`: the vCPU group (per-vCPU times and KVM's statistics) and the VM group
/// (KVM's VM statistics).
pub const STATS_VCPU: u32 = 8;
/// See [`STATS_VCPU`].
pub const STATS_VM: u32 = 1024;
/// The state group: `state.state` and `state.reason`.
pub const STATS_STATE: u32 = 1;

/// The read-only sockets libvirt's daemons listen on, in the order tried: the monolithic
/// daemon's, then the modular QEMU daemon's.
pub const SOCKETS: [&str; 2] = ["/run/libvirt/libvirt-sock-ro", "/run/libvirt/virtqemud-sock-ro"];

/// An error talking to libvirt.
#[derive(Debug, thiserror::Error)]
pub enum LibvirtError {
    /// The socket could not be reached or the exchange broke.
    #[error("libvirt at {path}")]
    Io {
        /// The socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The daemon did not answer within the deadline (it waits for the domain's QEMU, which may
    /// be stopped or stalled, or is busy).
    #[error("libvirt at {} did not answer within {:.1} s", path.display(), after.as_secs_f64())]
    Timeout {
        /// The socket.
        path: PathBuf,
        /// The deadline.
        after: Duration,
    },
    /// The daemon answered with an error.
    #[error("libvirt refused the request: {message} (code {code})")]
    Refused {
        /// libvirt's error code (`virErrorNumber`; 42 is "no domain").
        code: i32,
        /// Its message.
        message: String,
    },
    /// The reply was not what the protocol says.
    #[error("libvirt sent a malformed reply: {0}")]
    Malformed(&'static str),
    /// The socket's listener is not root: not libvirt's system daemon, whatever the path says.
    #[error("the socket {} is served by {who}, not by libvirt's daemon (root)", path.display())]
    Foreign {
        /// The socket.
        path: PathBuf,
        /// Its listener, as the kernel records it.
        who: String,
    },
    /// The socket asks for an authentication this client does not speak.
    #[error("libvirt's socket asks for authentication type {0} (only none and polkit are spoken)")]
    Auth(i32),
}

impl LibvirtError {
    /// True for "no such domain" (`VIR_ERR_NO_DOMAIN`).
    pub fn is_no_domain(&self) -> bool {
        matches!(self, LibvirtError::Refused { code: 42, .. })
    }
}

/// A value of a typed parameter.
#[derive(Clone, Debug, PartialEq)]
pub enum TypedValue {
    /// A signed or unsigned integer of any width.
    Int(i128),
    /// A double.
    Double(f64),
    /// A boolean.
    Bool(bool),
    /// A string.
    Text(String),
}

/// A domain as libvirt names it on the wire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Domain {
    /// Its name.
    pub name: String,
    /// Its UUID.
    pub uuid: [u8; 16],
    /// Its id while running (-1 otherwise).
    pub id: i32,
}

/// A read-only connection to libvirt.
#[derive(Debug)]
pub struct Libvirt {
    stream: UnixStream,
    path: PathBuf,
    serial: u32,
    /// The deadline of each exchange.
    timeout: Duration,
    /// The daemon listening on the socket, as the kernel recorded it at connect.
    daemon: i32,
    /// The user it runs as.
    daemon_uid: u32,
}

impl LibvirtError {
    /// An error of the exchange with the socket at `path`: a deadline of `timeout` passed, or
    /// another failure.
    fn io(path: &Path, timeout: Duration, source: io::Error) -> Self {
        match source.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                LibvirtError::Timeout { path: path.to_owned(), after: timeout }
            }
            _ => LibvirtError::Io { path: path.to_owned(), source },
        }
    }
}

impl Libvirt {
    /// Connects to the read-only socket `path`, authenticates if it asks, and opens the QEMU
    /// driver read-only; every exchange has `timeout`. Nothing is sent unless root listens on
    /// the socket.
    ///
    /// # Errors
    /// When the socket cannot be reached, is served by a process that is not root
    /// ([`LibvirtError::Foreign`]), asks for an unknown authentication, or refuses.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Self, LibvirtError> {
        Self::open(path, timeout, true)
    }

    /// Connects to the socket `path` of a daemon of any user, and opens its QEMU driver
    /// read-only: `qemu:///system` of a root daemon, `qemu:///session` of another user's (a
    /// session daemon has one socket, read-write, on which the connection is opened read-only).
    /// The caller decides whether that daemon is to be believed, by who it is
    /// ([`Self::daemon`], [`Self::daemon_uid`]), before it uses anything it says.
    ///
    /// # Errors
    /// As [`Self::connect`], but for a listener that is not root.
    pub fn connect_any(path: &Path, timeout: Duration) -> Result<Self, LibvirtError> {
        Self::open(path, timeout, false)
    }

    /// Connects to `path`; a listener that is not root is [`LibvirtError::Foreign`] when
    /// `root_only`.
    fn open(path: &Path, timeout: Duration, root_only: bool) -> Result<Self, LibvirtError> {
        let io = |source| LibvirtError::io(path, timeout, source);
        let stream = connect_unix(path).map_err(io)?;
        let foreign = |who: String| LibvirtError::Foreign { path: path.to_owned(), who };
        let (daemon, daemon_uid) = match crate::peer::credentials(stream.as_fd()) {
            Some(cred) if cred.uid == 0 || !root_only => {
                let pid = crate::peer::listener_pid(stream.as_fd())
                    .ok_or_else(|| foreign("a process that has exited or is not visible here".to_owned()))?;
                (pid, cred.uid)
            }
            Some(cred) => return Err(foreign(format!("pid {} of uid {}", cred.pid, cred.uid))),
            None => return Err(foreign("a listener the kernel does not name".to_owned())),
        };
        stream.set_read_timeout(Some(timeout)).map_err(io)?;
        stream.set_write_timeout(Some(timeout)).map_err(io)?;
        let mut me = Self { stream, path: path.to_owned(), serial: 0, timeout, daemon, daemon_uid };
        me.authenticate()?;
        let uri = if daemon_uid == 0 { "qemu:///system" } else { "qemu:///session" };
        let mut args = Vec::new();
        put_optional_string(&mut args, Some(uri));
        put_u32(&mut args, CONNECT_RO);
        me.call(PROC_CONNECT_OPEN, &args)?;
        Ok(me)
    }

    /// Authenticates as the socket asks: with none, or polkit.
    fn authenticate(&mut self) -> Result<(), LibvirtError> {
        let auth = self.call(PROC_AUTH_LIST, &[])?;
        let mut r = Xdr::new(&auth);
        let n = r.len()?;
        let mut types = Vec::with_capacity(n);
        for _ in 0..n {
            types.push(r.i32()?);
        }
        if !types.is_empty() && !types.contains(&AUTH_NONE) {
            if types.contains(&AUTH_POLKIT) {
                self.call(PROC_AUTH_POLKIT, &[])?;
            } else {
                return Err(LibvirtError::Auth(types[0]));
            }
        }
        Ok(())
    }

    /// The user the daemon listening on the socket runs as (root for a system daemon).
    pub fn daemon_uid(&self) -> u32 {
        self.daemon_uid
    }

    /// The daemon listening on the socket (its pid now, as the kernel recorded it at connect).
    pub fn daemon(&self) -> i32 {
        self.daemon
    }

    /// The domain with `uuid`.
    ///
    /// # Errors
    /// When libvirt has no such domain ([`LibvirtError::is_no_domain`]) or the exchange fails.
    pub fn lookup_by_uuid(&mut self, uuid: [u8; 16]) -> Result<Domain, LibvirtError> {
        let reply = self.call(PROC_DOMAIN_LOOKUP_BY_UUID, &uuid)?;
        Xdr::new(&reply).domain()
    }

    /// The statistics of the groups `stats` of `domain`, as `virConnectGetAllDomainStats`
    /// returns them: (field, value) pairs, e.g. `vcpu.0.halt_exits.sum`.
    ///
    /// # Errors
    /// When the exchange fails or the reply does not parse.
    pub fn domain_stats(
        &mut self,
        domain: &Domain,
        stats: u32,
    ) -> Result<Vec<(String, TypedValue)>, LibvirtError> {
        let mut args = Vec::new();
        put_u32(&mut args, 1);
        put_domain(&mut args, domain);
        put_u32(&mut args, stats);
        put_u32(&mut args, 0);
        let reply = self.call(PROC_CONNECT_GET_ALL_DOMAIN_STATS, &args)?;
        let mut r = Xdr::new(&reply);
        let records = r.len()?;
        let mut out = Vec::new();
        for _ in 0..records {
            let dom = r.domain()?;
            let params = r.len()?;
            for _ in 0..params {
                let field = r.string()?;
                let value = r.typed_value()?;
                if dom.uuid == domain.uuid {
                    out.push((field, value));
                }
            }
        }
        Ok(out)
    }

    /// The element of `domain`'s metadata in namespace `uri` (`virDomainGetMetadata`, of the
    /// running domain), `None` when it has none.
    ///
    /// # Errors
    /// When the exchange fails or the reply does not parse.
    pub fn domain_metadata(&mut self, domain: &Domain, uri: &str) -> Result<Option<String>, LibvirtError> {
        let mut args = Vec::new();
        put_domain(&mut args, domain);
        put_u32(&mut args, METADATA_ELEMENT);
        put_optional_string(&mut args, Some(uri));
        put_u32(&mut args, 0);
        match self.call(PROC_DOMAIN_GET_METADATA, &args) {
            Ok(reply) => Xdr::new(&reply).string().map(Some),
            Err(LibvirtError::Refused { code: ERR_NO_DOMAIN_METADATA, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One call: sends `args` for `procedure`, returns the reply's payload.
    fn call(&mut self, procedure: i32, args: &[u8]) -> Result<Vec<u8>, LibvirtError> {
        self.serial = self.serial.wrapping_add(1);
        let mut msg = Vec::with_capacity(28 + args.len());
        put_u32(&mut msg, (28 + args.len()) as u32);
        for w in [PROGRAM, VERSION, procedure as u32, CALL, self.serial, STATUS_OK] {
            put_u32(&mut msg, w);
        }
        msg.extend_from_slice(args);
        let io = |source| LibvirtError::io(&self.path, self.timeout, source);
        self.stream.write_all(&msg).map_err(io)?;
        // Replies to our calls come in order; anything else (events) is not asked for.
        loop {
            let mut len = [0u8; 4];
            self.stream.read_exact(&mut len).map_err(io)?;
            let len = u32::from_be_bytes(len) as usize;
            if !(28..=MAX_MESSAGE).contains(&len) {
                return Err(LibvirtError::Malformed("message length"));
            }
            let mut body = vec![0u8; len - 4];
            self.stream.read_exact(&mut body).map_err(io)?;
            let mut r = Xdr::new(&body);
            let (prog, _vers, proc_, kind, serial, status) =
                (r.u32()?, r.u32()?, r.i32()?, r.u32()?, r.u32()?, r.u32()?);
            if prog != PROGRAM || kind != REPLY || serial != self.serial || proc_ != procedure {
                continue;
            }
            let payload = body[24..].to_vec();
            if status != STATUS_OK {
                let mut r = Xdr::new(&payload);
                let code = r.i32()?;
                let _domain = r.i32()?;
                let message = r.optional_string()?.unwrap_or_default();
                return Err(LibvirtError::Refused { code, message });
            }
            return Ok(payload);
        }
    }
}

/// The longest path a Unix socket address holds (`sun_path`, less its terminating NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Connects to the Unix socket at `path`, however long: one longer than a socket address holds
/// (a kubelet's pod volume is deeper than that) is reached through its directory, opened first
/// (`O_PATH`), as `/proc/self/fd/N/NAME`.
fn connect_unix(path: &Path) -> io::Result<UnixStream> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else { return UnixStream::connect(path) };
    if path.as_os_str().len() <= MAX_SOCKET_PATH {
        return UnixStream::connect(path);
    }
    let dir =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH | libc::O_DIRECTORY).open(dir)?;
    UnixStream::connect(Path::new(&format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name))
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_be_bytes());
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    put_u32(out, s.len() as u32);
    out.extend_from_slice(s.as_bytes());
    out.resize(out.len().next_multiple_of(4), 0);
}

fn put_optional_string(out: &mut Vec<u8>, s: Option<&str>) {
    put_u32(out, u32::from(s.is_some()));
    if let Some(s) = s {
        put_string(out, s);
    }
}

fn put_domain(out: &mut Vec<u8>, d: &Domain) {
    put_string(out, &d.name);
    out.extend_from_slice(&d.uuid);
    put_u32(out, d.id as u32);
}

/// A reader of XDR-encoded data that checks every length.
struct Xdr<'a> {
    data: &'a [u8],
}

impl<'a> Xdr<'a> {
    fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], LibvirtError> {
        if n > self.data.len() {
            return Err(LibvirtError::Malformed("short reply"));
        }
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, LibvirtError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn i32(&mut self) -> Result<i32, LibvirtError> {
        Ok(self.u32()? as i32)
    }

    fn u64(&mut self) -> Result<u64, LibvirtError> {
        Ok(u64::from(self.u32()?) << 32 | u64::from(self.u32()?))
    }

    fn len(&mut self) -> Result<usize, LibvirtError> {
        let n = self.u32()? as usize;
        if n > MAX_ITEMS { Err(LibvirtError::Malformed("list or string too long")) } else { Ok(n) }
    }

    fn string(&mut self) -> Result<String, LibvirtError> {
        let n = self.len()?;
        let bytes = self.take(n)?;
        self.take(n.next_multiple_of(4) - n)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    fn optional_string(&mut self) -> Result<Option<String>, LibvirtError> {
        match self.u32()? {
            0 => Ok(None),
            _ => Ok(Some(self.string()?)),
        }
    }

    fn domain(&mut self) -> Result<Domain, LibvirtError> {
        let name = self.string()?;
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(self.take(16)?);
        Ok(Domain { name, uuid, id: self.i32()? })
    }

    /// A `remote_typed_param_value`: the type, then the value of that type.
    fn typed_value(&mut self) -> Result<TypedValue, LibvirtError> {
        Ok(match self.i32()? {
            1 => TypedValue::Int(i128::from(self.i32()?)),
            2 => TypedValue::Int(i128::from(self.u32()?)),
            3 => TypedValue::Int(i128::from(self.u64()? as i64)),
            4 => TypedValue::Int(i128::from(self.u64()?)),
            5 => TypedValue::Double(f64::from_bits(self.u64()?)),
            6 => TypedValue::Bool(self.i32()? != 0),
            7 => TypedValue::Text(self.string()?),
            _ => return Err(LibvirtError::Malformed("unknown typed parameter type")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_parameters_parse_and_a_lying_length_is_an_error() {
        let mut data = Vec::new();
        put_string(&mut data, "vcpu.0.halt_exits.sum");
        put_u32(&mut data, 4);
        put_u32(&mut data, 1);
        put_u32(&mut data, 7);
        put_string(&mut data, "vcpu.0.guest_mode.cur");
        put_u32(&mut data, 6);
        put_u32(&mut data, 0);
        let mut r = Xdr::new(&data);
        assert_eq!(r.string().unwrap(), "vcpu.0.halt_exits.sum");
        assert_eq!(r.typed_value().unwrap(), TypedValue::Int((1 << 32) + 7));
        assert_eq!(r.string().unwrap(), "vcpu.0.guest_mode.cur");
        assert_eq!(r.typed_value().unwrap(), TypedValue::Bool(false));
        assert!(matches!(r.u32(), Err(LibvirtError::Malformed(_))));
        let mut lying = Vec::new();
        put_u32(&mut lying, 1000);
        assert!(Xdr::new(&lying).string().is_err());
        put_u32(&mut lying, u32::MAX);
        assert!(Xdr::new(&lying[4..]).len().is_err());
        let mut bad_type = Vec::new();
        put_u32(&mut bad_type, 99);
        assert!(Xdr::new(&bad_type).typed_value().is_err());
    }
}
