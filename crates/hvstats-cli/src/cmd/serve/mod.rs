//! `hvstats serve`: an HTTP exporter of every live instance for Prometheus.
//!
//! `GET /metrics` reads every instance once and answers in the OpenMetrics text format
//! ([`exposition`]) to clients that accept it (Prometheus does), in the classic Prometheus text
//! format to the others (curl, `promtool check metrics`); `GET /api/v1/snapshot` answers the JSON of `hvstats snapshot --json`;
//! `GET /healthz` says what it could read and what not, with 503 when nothing could be read. Where
//! one host is not enough, each host runs `serve` and Prometheus aggregates: the exporter keeps no
//! state between scrapes. The HTTP server ([`http`]) bounds what any client can make it hold.

use hvstats_present::exposition;
pub mod http;
pub mod observe;

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use hyper::Method;
use serde_json::json;

use self::http::{Asked, Limits, Reply};

use hvstats_present::live::{Live, Reading};

/// The address served when `--listen` is not given: loopback only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9966";

/// VPs exported one by one per scrape when `--max-vps` is not given.
pub const DEFAULT_MAX_VPS: usize = 4096;

/// Flags of `hvstats serve`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The address to listen on (a port of 0 picks a free one; the address is printed).
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// The runtime directory the instances are published under (default: $HVSTATS_RUNTIME_DIR,
    /// or /run/hvstats).
    #[arg(long, value_name = "DIR")]
    runtime_dir: Option<PathBuf>,
    /// VPs exported one by one per scrape; the VPs of partitions beyond it are exported as one
    /// sum per partition (`vp="all"`).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_VPS)]
    max_vps: usize,
    /// Connections served at once; more are answered 503 and closed at once.
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
    vms: Vec<hvstats_kvm::observe::filter::VmPattern>,
    /// With --observe-all: leave out the VMs this names (repeatable; wins over --vm).
    #[arg(long = "exclude-vm", value_name = "PID|UUID|REGEX", requires = "observe_all",
          value_parser = crate::cmd::observe::parse_pattern)]
    exclude_vms: Vec<hvstats_kvm::observe::filter::VmPattern>,
    /// With --observe-all: use no QMP socket a QEMU's command line names.
    #[arg(long, requires = "observe_all")]
    no_qmp: bool,
}

fn parse_max_connections(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=65_536).contains(&n) => Ok(n),
        _ => Err(format!("{s:?}: the cap is a number of connections from 1 to 65536")),
    }
}

fn parse_observe_interval(s: &str) -> Result<f64, String> {
    crate::cmd::seconds_in(s, 0.01, 3600.0)
}

/// Answers `asked` from a fresh reading of `live`; `/metrics` in OpenMetrics when its `Accept`
/// asks for it, else in the classic text format.
fn answer(live: &Live, max_vps: usize, asked: &Asked) -> Reply {
    if !matches!(asked.method, Method::GET | Method::HEAD) {
        return Reply::text(405, "only GET and HEAD\n");
    }
    // A runtime directory that cannot be read is a reading of nothing with one problem: /metrics
    // still answers (the error is a metric), /healthz says unhealthy.
    let read = || {
        let started = std::time::Instant::now();
        let reading = live.read().unwrap_or_else(|e| live.unreadable(&e));
        (reading, started.elapsed())
    };
    let result = match asked.path.as_str() {
        "/metrics" => {
            let (reading, took) = read();
            exposition::Exposition::new(reading, max_vps)
                .read_in(took)
                .encode()
                .map(|body| match exposition::accepts_openmetrics(&asked.accept) {
                    true => Reply { status: 200, content_type: exposition::CONTENT_TYPE, body },
                    false => Reply {
                        status: 200,
                        content_type: exposition::CLASSIC_CONTENT_TYPE,
                        body: exposition::to_classic(&body),
                    },
                })
                .map_err(|_| Reply::text(500, "encoding failed\n"))
        }
        "/api/v1/snapshot" => {
            let (reading, _) = read();
            match exposition::nothing_read(&reading) {
                false => {
                    Ok(Reply { status: 200, content_type: "application/json", body: snapshot_body(&reading) })
                }
                true => Err(Reply::text(503, exposition::health(&reading).1)),
            }
        }
        "/healthz" => {
            let (healthy, text) = exposition::health(&read().0);
            Ok(Reply::text(if healthy { 200 } else { 503 }, text))
        }
        "/" => Ok(Reply::text(200, "hvstats exporter: /metrics /api/v1/snapshot /healthz\n")),
        _ => Err(Reply::text(404, "not found: try /metrics\n")),
    };
    result.unwrap_or_else(|reply| reply)
}

fn snapshot_body(reading: &Reading) -> String {
    let instances: Vec<_> =
        reading.instances.iter().map(hvstats_present::snapshot_json::snapshot_json).collect();
    let mut body = json!({ "instances": instances }).to_string();
    body.push('\n');
    body
}

/// Runs `hvstats serve` until SIGINT or SIGTERM.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let live = Arc::new(Live::new(Some(crate::cmd::runtime_dir(args.runtime_dir)?)));
    let listener =
        TcpListener::bind(args.listen).with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr().context("the listening socket has no address")?;
    let limits = Limits { max_connections: args.max_connections, ..Limits::default() };
    let max_vps = args.max_vps;
    let observing = args.observe_all.then(|| observe::Observing {
        interval: std::time::Duration::from_secs_f64(args.observe_interval),
        filter: hvstats_kvm::observe::filter::VmFilter { include: args.vms, exclude: args.exclude_vms },
        no_qmp: args.no_qmp,
    });
    let dir = live.dir().to_owned();
    // Once SIGINT and SIGTERM are watched: the observer, then the address (which tells a
    // supervisor or a test that the exporter is up).
    let start = move || -> anyhow::Result<Option<observe::Running>> {
        let observer = match observing {
            Some(how) => Some(observe::start(&dir, how)?),
            None => None,
        };
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "serving http://{addr}/metrics")?;
        stdout.flush()?;
        Ok(observer)
    };
    let (signal, observer) = http::serve(listener, limits, start, move |asked| answer(&live, max_vps, asked))
        .context("the HTTP server failed")?;
    http::log(&format!("{}: stopping", signal.name()));
    if let Some(observer) = observer {
        observer.stop();
    }
    Ok(ExitCode::SUCCESS)
}
