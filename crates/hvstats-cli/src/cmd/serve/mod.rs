//! `hvstats serve`: an HTTP exporter of every live instance for Prometheus, as glue: the flags,
//! the listening socket, the observer of `--observe-all` and the signals are here; the server
//! (HTTP, TLS, authentication, negotiation, compression, the answers) is
//! [`hvstats_serve`]'s.
//!
//! Who may read: by default `serve` listens on a Unix socket in the runtime directory that only
//! its owner (or `--socket-group`) may connect to, as only they may read the instances' pages;
//! on TCP, whoever reaches the address reads every counter unless `--web.config.file` asks for
//! basic authentication or client certificates.

pub(crate) mod collector_flags;
pub(crate) mod observe;

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use hvstats_present::live::Live;
use hvstats_serve::{Config, Exporter, Limits, Listener, Server, Web};

use self::collector_flags::CollectorFlags;
use self::observe::log;
use crate::signals;

/// The socket served when `--listen` is not given: this name in the runtime directory.
pub(crate) const DEFAULT_SOCKET: &str = "serve.sock";

/// VPs exported one by one per scrape when `--max-vps` is not given.
pub(crate) use hvstats_present::exposition::DEFAULT_MAX_VPS;

/// Where `serve` listens.
#[derive(Clone, Debug)]
pub(crate) enum Listen {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A Unix socket, created owner-only (or for `--socket-group`).
    Unix(PathBuf),
}

fn parse_listen(s: &str) -> Result<Listen, String> {
    let bad =
        |e: &dyn std::fmt::Display| format!("{s:?}: {e} (ADDR:PORT, :PORT for every address, or unix:PATH)");
    match s.strip_prefix("unix:") {
        Some("") => Err("unix: needs a path (unix:/run/hvstats/serve.sock)".to_owned()),
        Some(path) => Ok(Listen::Unix(PathBuf::from(path))),
        // node_exporter's form: every address, IPv6 and IPv4 (see `bind_tcp`).
        None if s.starts_with(':') => s[1..]
            .parse::<u16>()
            .map(|port| Listen::Tcp(SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port))))
            .map_err(|e| bad(&e)),
        None => s.parse().map(Listen::Tcp).map_err(|e| bad(&e)),
    }
}

/// A TCP listener on `addr`. The unspecified IPv6 address (`[::]`, and `:PORT`) is every
/// address, IPv4 ones included, whatever `net.ipv6.bindv6only` says; on a host without IPv6 it is
/// every IPv4 address.
fn bind_tcp(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType, sockopt};
    if !(addr.is_ipv6() && addr.ip().is_unspecified()) {
        return TcpListener::bind(addr);
    }
    let fd = match rustix::net::socket_with(
        AddressFamily::INET6,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::AFNOSUPPORT) => {
            return TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, addr.port()));
        }
        Err(e) => return Err(e.into()),
    };
    sockopt::set_ipv6_v6only(&fd, false)?;
    sockopt::set_socket_reuseaddr(&fd, true)?;
    rustix::net::bind(&fd, &addr)?;
    rustix::net::listen(&fd, 1024)?;
    Ok(TcpListener::from(fd))
}

/// Flags of `hvstats serve`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Where to listen: ADDR:PORT for TCP (a port of 0 picks a free one; the address is printed),
    /// :PORT or [::]:PORT for every address, IPv4 and IPv6, or unix:PATH for a Unix socket. Default: unix:RUNTIME_DIR/serve.sock, which only the
    /// runtime directory's owner (or --socket-group) may connect to. On TCP, whoever reaches the
    /// address reads every counter unless --web.config.file asks for authentication.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    listen: Option<Listen>,
    /// With a Unix socket: a group (name or id) whose members may connect too (mode 0660).
    #[arg(long, value_name = "GROUP")]
    socket_group: Option<String>,
    /// The Prometheus exporter toolkit's web configuration file (TLS, basic authentication with
    /// bcrypt hashes, headers), as node_exporter reads it; what `promtool check web-config`
    /// refuses (`rate_limit`, inline certificates) is refused.
    #[arg(long = "web.config.file", value_name = "FILE")]
    web_config_file: Option<PathBuf>,
    /// The runtime directory the instances are published under (default: $HVSTATS_RUNTIME_DIR,
    /// or /run/hvstats).
    #[arg(long, value_name = "DIR")]
    runtime_dir: Option<PathBuf>,
    /// VPs exported one by one per scrape; the VPs of partitions beyond it are exported as one
    /// sum per partition (`vp="all"`). Also the most VPs a snapshot shows.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_VPS)]
    max_vps: usize,
    /// Serve GET /api/v1/snapshot (every counter as JSON, at most --max-vps VPs); off by default.
    #[arg(long)]
    snapshot_api: bool,
    /// Bytes of large replies (`/metrics`, snapshots) in flight, each counted once however many
    /// connections send it; past it, the connections that have held theirs longest are closed.
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().max_reply_bytes,
          value_parser = parse_max_reply_bytes)]
    max_reply_bytes: usize,
    /// Connections kept at once; above the cap new ones are still taken in (up to five times
    /// the cap), and the one that holds the most and has done the least (never one that got a
    /// reply in the last minute, or sent a whole request, while another is left; of the address
    /// holding the most connections) is closed once its first second is over.
    #[arg(long, value_name = "N", default_value_t = Limits::default().max_connections,
          value_parser = parse_max_connections)]
    max_connections: usize,
    /// Also observe every KVM VM other processes run on this host (as `hvstats observe --all`),
    /// so this one exporter shows them all.
    #[arg(long)]
    observe_all: bool,
    /// With --observe-all: seconds between refreshes of the observed VMs' pages.
    #[arg(long, value_name = "SECS", default_value_t = 1.0, requires = "observe_all",
          value_parser = parse_observe_interval)]
    observe_interval: f64,
    /// With --observe-all: observe only the VMs this names (a pid, a UUID, or a regular
    /// expression on the VM's name; repeatable).
    #[arg(long = "vm", value_name = "PID|UUID|REGEX", requires = "observe_all",
          value_parser = crate::cmd::observe::parse_pattern)]
    vms: Vec<hvstats_observe::filter::VmPattern>,
    /// With --observe-all: leave out the VMs this names (repeatable; wins over --vm).
    #[arg(long = "exclude-vm", value_name = "PID|UUID|REGEX", requires = "observe_all",
          value_parser = crate::cmd::observe::parse_pattern)]
    exclude_vms: Vec<hvstats_observe::filter::VmPattern>,
    /// With --observe-all: use no QMP socket a QEMU's command line names.
    #[arg(long, requires = "observe_all")]
    no_qmp: bool,
    /// The collectors exported (see the collector table in the README).
    #[command(flatten)]
    collectors: CollectorFlags,
    /// An observer (`hvstats observe --all`, another service) is expected to publish under the
    /// runtime directory: while none does, export `hvstats_observer_up 0`. Without it, an
    /// observer is reported down only once one has published here and is gone without a clean
    /// stop.
    #[arg(long)]
    expect_observer: bool,
}

fn parse_max_connections(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=65_536).contains(&n) => Ok(n),
        _ => Err(format!("{s:?}: the cap is a number of connections from 1 to 65536")),
    }
}

fn parse_max_reply_bytes(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 << 20 => Ok(n),
        _ => Err(format!("{s:?}: the budget is a number of bytes, at least 1048576 (1 MiB)")),
    }
}

fn parse_observe_interval(s: &str) -> Result<f64, String> {
    crate::cmd::seconds_in(s, 0.01, 3600.0)
}

/// The group `name` (a name in /etc/group, or a number).
fn group_id(name: &str) -> anyhow::Result<u32> {
    if let Ok(gid) = name.parse() {
        return Ok(gid);
    }
    let groups = std::fs::read_to_string("/etc/group").context("cannot read /etc/group")?;
    groups
        .lines()
        .find_map(|l| {
            let mut fields = l.split(':');
            (fields.next()? == name).then(|| fields.nth(1)?.parse().ok())?
        })
        .with_context(|| format!("no group {name:?} in /etc/group"))
}

/// Binds the Unix socket `path`, owner-only or for `group` (the umask is narrowed around the
/// bind, so it is never reachable by others, even for an instant). A socket left at `path` by an
/// exporter that is gone is replaced; anything else there is refused.
fn bind_unix(path: &Path, group: Option<u32>) -> anyhow::Result<UnixListener> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    crate::output_file::check_dir(parent).with_context(|| format!("cannot listen on {}", path.display()))?;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() && m.uid() == rustix::process::geteuid().as_raw() => {
            match UnixStream::connect(path) {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    std::fs::remove_file(path)
                        .with_context(|| format!("cannot remove {}", path.display()))?;
                }
                _ => bail!("{} is in use by another exporter", path.display()),
            }
        }
        Ok(_) => bail!("{} exists and is not a socket of this user: refusing to replace it", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot examine {}", path.display())),
    }
    let mask = if group.is_some() { 0o117 } else { 0o177 };
    let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(mask));
    let bound = UnixListener::bind(path);
    rustix::process::umask(old);
    let listener = bound.with_context(|| format!("cannot listen on {}", path.display()))?;
    if let Some(gid) = group {
        std::os::unix::fs::lchown(path, None, Some(gid))
            .with_context(|| format!("cannot give {} to group {gid}", path.display()))?;
    }
    Ok(listener)
}

/// Removes the socket `path` on drop, if it is still the one bound.
struct BoundSocket {
    path: PathBuf,
    ino: u64,
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Runs `hvstats serve` until SIGINT, SIGTERM or SIGHUP.
pub(crate) fn run(args: Args) -> anyhow::Result<ExitCode> {
    // Before any thread starts (the password checks', the server's, the observer's): the signals
    // wait, pending, for the watcher of `signals::during`, and the stop it asks.
    signals::block().context("cannot block SIGINT, SIGTERM and SIGHUP")?;
    let live = Live::new(Some(crate::cmd::runtime_dir(args.runtime_dir.clone())?))
        .expecting_observer(args.expect_observer);
    let web = args.web_config_file.as_deref().map(Web::load).transpose()?;
    let Bound { listener, shown, tcp, socket: _socket } = listen(&args, &live, web.as_ref())?;
    if tcp && !web.as_ref().is_some_and(Web::authenticates) {
        log(&format!(
            "{shown}: no authentication (--web.config.file): every local user, and any peer that \
             reaches this address, can read every counter"
        ));
    }
    if let Some(web) = &web {
        log(&format!("web configuration: {}", web.summary()));
    }
    let dir = live.dir().to_owned();
    let limits = Limits {
        max_connections: args.max_connections,
        max_reply_bytes: args.max_reply_bytes,
        ..Limits::default()
    };
    let exporter = Exporter {
        live,
        max_vps: args.max_vps,
        snapshot_api: args.snapshot_api,
        collectors: args.collectors.selection,
    };
    let observing = observing(args, &dir)?;
    let server = Server::new(listener, Config { limits, web }, exporter).context("the HTTP server failed")?;
    let stop = server.stop_handle();
    let (served, signal) = signals::during(|_| serve(server, &dir, observing, &shown), |_| stop.stop())
        .context("cannot watch SIGINT, SIGTERM and SIGHUP")?;
    let observer = served?;
    if let Some(signal) = signal {
        log(&format!("{}: stopping", signal.name()));
    }
    if let Some(observer) = observer {
        observer.stop();
    }
    Ok(ExitCode::SUCCESS)
}

/// The socket `serve` listens on, as `--listen` (or its default) names it.
struct Bound {
    listener: Listener,
    /// The address, for the log and for whoever waits for `serving ADDRESS`.
    shown: String,
    /// True on TCP.
    tcp: bool,
    /// The Unix socket, removed when `serve` ends.
    socket: Option<BoundSocket>,
}

/// Binds the socket `args` names (the runtime directory's `serve.sock` by default).
fn listen(args: &Args, live: &Live, web: Option<&Web>) -> anyhow::Result<Bound> {
    let listen = args.listen.clone().unwrap_or_else(|| Listen::Unix(live.dir().join(DEFAULT_SOCKET)));
    match &listen {
        Listen::Tcp(addr) => {
            if args.socket_group.is_some() {
                bail!("--socket-group is for a Unix socket (--listen unix:PATH)");
            }
            let l = bind_tcp(*addr).with_context(|| format!("cannot listen on {addr}"))?;
            let addr = l.local_addr().context("the listening socket has no address")?;
            let scheme = if web.is_some_and(Web::serves_tls) { "https" } else { "http" };
            Ok(Bound {
                listener: Listener::Tcp(l),
                shown: format!("{scheme}://{addr}/metrics"),
                tcp: true,
                socket: None,
            })
        }
        Listen::Unix(path) => {
            if web.is_some() {
                bail!("--web.config.file is for TCP: a Unix socket is guarded by its mode");
            }
            let group = args.socket_group.as_deref().map(group_id).transpose()?;
            let l = bind_unix(path, group)?;
            let ino = std::fs::symlink_metadata(path).map(|m| m.ino()).unwrap_or(0);
            Ok(Bound {
                listener: Listener::Unix(l),
                shown: format!("unix:{} /metrics", path.display()),
                tcp: false,
                socket: Some(BoundSocket { path: path.clone(), ino }),
            })
        }
    }
}

/// How `--observe-all` observes, the runtime directory `dir` held for its observer; none without
/// it.
fn observing(args: Args, dir: &Path) -> anyhow::Result<Option<observe::Observing>> {
    if !args.observe_all {
        return Ok(None);
    }
    Ok(Some(observe::Observing {
        held: crate::observer_run::hold_runtime_dir(dir)?,
        interval: std::time::Duration::from_secs_f64(args.observe_interval),
        filter: hvstats_observe::filter::VmFilter { include: args.vms, exclude: args.exclude_vms },
        no_qmp: args.no_qmp,
    }))
}

/// Starts the observer (when `observing`), says the address (which tells a supervisor or a test
/// that the exporter is up), and serves until stopped; returns the observer, for the caller to
/// stop.
fn serve(
    server: Server,
    dir: &Path,
    observing: Option<observe::Observing>,
    shown: &str,
) -> anyhow::Result<Option<observe::Running>> {
    let observer = match observing {
        Some(how) => Some(observe::start(dir, how)?),
        None => None,
    };
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "serving {shown}")?;
    stdout.flush()?;
    drop(stdout);
    server.run();
    Ok(observer)
}
