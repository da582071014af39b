//! `hvstats serve`: an HTTP exporter of every live instance for Prometheus.
//!
//! `GET /metrics` reads every instance once and answers in the OpenMetrics text format
//! ([`exposition`]) to clients that accept it (Prometheus does), in the classic Prometheus text
//! format to the others (curl, `promtool check metrics`); `GET /api/v1/snapshot` answers the JSON of `hvstats snapshot --json`;
//! `GET /healthz` says the exporter is up and what it could not read. Where one host is not
//! enough, each host runs `serve` and Prometheus aggregates: the exporter keeps no state between
//! scrapes.

pub mod bench;
pub mod exposition;
pub mod observe;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use serde_json::json;
use tiny_http::{Header, Method, Request, Response, Server};

use crate::cmd::live::{Live, Reading};

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
    /// Also observe every KVM VM other processes run on this host (as `hvstats observe --all`),
    /// so this one exporter shows them all.
    #[arg(long)]
    observe_all: bool,
    /// With --observe-all: seconds between refreshes of the observed VMs' pages.
    #[arg(long, value_name = "SECS", default_value_t = 1.0, requires = "observe_all",
          value_parser = parse_observe_interval)]
    observe_interval: f64,
}

fn parse_observe_interval(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.01..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?}: the interval is a number of seconds from 0.01 to 3600")),
    }
}

/// What one request gets.
struct Reply {
    status: u16,
    content_type: &'static str,
    body: String,
}

impl Reply {
    fn text(status: u16, body: impl Into<String>) -> Self {
        Self { status, content_type: "text/plain; charset=utf-8", body: body.into() }
    }
}

/// Answers `method path` from a fresh reading of `live`; `/metrics` in OpenMetrics when `accept`
/// asks for it, else in the classic text format.
fn answer(live: &Live, max_vps: usize, method: &Method, url: &str, accept: &str) -> Reply {
    if !matches!(method, Method::Get | Method::Head) {
        return Reply::text(405, "only GET and HEAD\n");
    }
    let path = url.split(['?', '#']).next().unwrap_or(url);
    let read = || {
        live.read().map_err(|e| Reply::text(503, format!("cannot read {}: {e:#}\n", live.dir().display())))
    };
    let result = match path {
        "/metrics" => read().and_then(|reading| {
            exposition::Exposition::new(reading, max_vps)
                .encode()
                .map(|body| match exposition::accepts_openmetrics(accept) {
                    true => Reply { status: 200, content_type: exposition::CONTENT_TYPE, body },
                    false => Reply {
                        status: 200,
                        content_type: exposition::CLASSIC_CONTENT_TYPE,
                        body: exposition::to_classic(&body),
                    },
                })
                .map_err(|_| Reply::text(500, "encoding failed\n"))
        }),
        "/api/v1/snapshot" => read().map(|reading| Reply {
            status: 200,
            content_type: "application/json",
            body: snapshot_body(&reading),
        }),
        "/healthz" => read().map(|reading| Reply::text(200, exposition::health(&reading))),
        "/" => Ok(Reply::text(200, "hvstats exporter: /metrics /api/v1/snapshot /healthz\n")),
        _ => Err(Reply::text(404, "not found: try /metrics\n")),
    };
    result.unwrap_or_else(|reply| reply)
}

fn snapshot_body(reading: &Reading) -> String {
    let instances: Vec<_> = reading.instances.iter().map(crate::cmd::snapshot::snapshot_json).collect();
    let mut body = json!({ "instances": instances }).to_string();
    body.push('\n');
    body
}

fn respond(live: &Live, max_vps: usize, request: Request) {
    let accept = request
        .headers()
        .iter()
        .filter(|h| h.field.equiv("Accept"))
        .map(|h| h.value.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let reply = answer(live, max_vps, request.method(), request.url(), &accept);
    let mut response = Response::from_string(reply.body).with_status_code(reply.status);
    // Our content types are static ASCII, which tiny_http always accepts.
    if let Ok(header) = Header::from_bytes("Content-Type", reply.content_type) {
        response = response.with_header(header);
    }
    // A client that went away is its own business; the exporter serves the next one.
    let _ = request.respond(response);
}

/// Runs `hvstats serve` until killed.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let live = Live::new(Some(crate::cmd::runtime_dir(args.runtime_dir)?));
    // Before any thread starts: SIGINT/SIGTERM wait for the watcher below.
    crate::signals::block().context("cannot block SIGINT/SIGTERM")?;
    let observer = match args.observe_all {
        true => Some(observe::start(live.dir(), std::time::Duration::from_secs_f64(args.observe_interval))?),
        false => None,
    };
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || observe::stop_on_signal(observer))
        .context("starting the signal watcher")?;
    let server =
        Server::http(args.listen).map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.listen))?;
    let addr = server.server_addr().to_ip().context("the server has no IP address")?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "serving http://{addr}/metrics")?;
    stdout.flush()?;
    drop(stdout);
    for request in server.incoming_requests() {
        respond(&live, args.max_vps, request);
    }
    Ok(ExitCode::SUCCESS)
}
