//! The exporter's server: an HTTP/1.1 server of every live hvstats instance for Prometheus, that
//! no client it does not control can stall, exhaust or kill.
//!
//! `GET /metrics` reads every instance once and answers with the families of the collectors
//! enabled (a scrape's `collect[]=` and `exclude[]=` narrow them), in the format the scraper
//! negotiates (`negotiate`): Prometheus' protobuf with native histograms, the OpenMetrics
//! text, or the classic Prometheus text for the others (curl, `promtool check metrics`), gzipped
//! when the scraper accepts it (`compress`); `GET /healthz` says what it could read and what
//! not, with 503 when nothing could be read; with the snapshot API on, `GET /api/v1/snapshot`
//! answers the JSON of `hvstats snapshot --json` for at most `max_vps` VPs (`routes`).
//! Readings are shared by the requests that wait for them (`answers`); the HTTP side (`http`)
//! bounds what any client can make the server hold; who may ask is the web configuration's
//! (`web`, `auth`).
//!
//! One entry point: a [`Server`] made of a bound [`Listener`], a [`Config`] (limits, the web
//! configuration) and an [`Exporter`] (what is read and how it is exported), run until its
//! [`Stop`] is used. Choosing the address, binding it, and deciding when to stop (signals) are the
//! caller's.

mod answers;
mod auth;
mod body;
mod bounds;
mod compress;
mod http;
mod negotiate;
mod problem;
mod routes;
mod web;

use std::io;
use std::sync::Arc;

use hvstats_present::collectors::Selection;
use hvstats_present::live::Live;
use tokio::sync::watch;

pub use bounds::Limits;
pub use http::Listener;
pub use web::{Web, WebConfigError};

/// What the server exports: the instances under a runtime directory, and how.
pub struct Exporter {
    /// The instances read at each scrape.
    pub live: Live,
    /// VPs exported one by one per scrape (beyond it, one sum per partition); also the most VPs
    /// a snapshot shows.
    pub max_vps: usize,
    /// Whether `GET /api/v1/snapshot` is served.
    pub snapshot_api: bool,
    /// The collectors exported (a scrape's `collect[]` narrows them further).
    pub collectors: Selection,
}

/// What bounds the server and who may ask it.
#[derive(Default)]
pub struct Config {
    /// What the server lets its clients hold.
    pub limits: Limits,
    /// TLS and basic authentication, from the web configuration file; none: plain HTTP to anyone
    /// who reaches the listener.
    pub web: Option<Web>,
}

/// Why the server cannot run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The runtime that drives the connections could not start.
    #[error("cannot start the HTTP server's runtime")]
    Runtime(#[source] io::Error),
    /// The listening socket could not be made non-blocking or handed to the runtime.
    #[error("cannot serve the listening socket")]
    Listener(#[source] io::Error),
}

/// Ends a [`Server::run`]: it stops accepting, lets replies in flight finish within
/// [`Limits::shutdown_grace`], and returns. Cheap to clone; usable from any thread, before or
/// during the run.
#[derive(Clone, Debug)]
pub struct Stop(Arc<watch::Sender<bool>>);

impl Stop {
    /// Asks the server to stop (again: nothing more).
    pub fn stop(&self) {
        self.0.send_replace(true);
    }

    /// Waits until [`Stop::stop`] is called.
    async fn stopped(&self) {
        let mut asked = self.0.subscribe();
        // The sender is ours: the wait ends only when a stop is asked.
        let _ = asked.wait_for(|stop| *stop).await;
    }
}

/// The exporter's server, its listener taken in and its runtime started; [`Server::run`] serves.
pub struct Server {
    runtime: tokio::runtime::Runtime,
    listening: http::Accepting,
    shared: Arc<http::Shared>,
    stop: Stop,
}

impl Server {
    /// A server of `exporter` on `listener`, within `config`.
    ///
    /// # Errors
    /// When the runtime cannot start or the listener cannot be handed to it.
    pub fn new(listener: Listener, config: Config, exporter: Exporter) -> Result<Self, Error> {
        // One thread accepts and drives every connection; readings and encodings run on at most
        // four more (password checks on two of their own), so a burst of requests cannot
        // multiply threads.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(4)
            .thread_name("hvstats-serve")
            .build()
            .map_err(Error::Runtime)?;
        let listening = {
            let _entered = runtime.enter();
            http::Accepting::from_std(listener).map_err(Error::Listener)?
        };
        let bounds = bounds::Bounds::new(config.limits);
        let handler = routes::handler(exporter, Arc::clone(&bounds));
        let shared = Arc::new(http::Shared { bounds, handler, web: config.web.map(Arc::new) });
        Ok(Self { runtime, listening, shared, stop: Stop(Arc::new(watch::channel(false).0)) })
    }

    /// The handle that ends [`Server::run`].
    pub fn stop_handle(&self) -> Stop {
        self.stop.clone()
    }

    /// Serves on the calling thread until [`Stop::stop`]. A failing `accept` (EMFILE, ENFILE) is
    /// logged and retried, never the end. Readings and answers still under way when it returns
    /// are abandoned: the grace for replies in flight is already spent.
    pub fn run(self) {
        let Self { runtime, listening, shared, stop } = self;
        runtime.block_on(http::accept_loop(listening, shared, stop.stopped()));
        runtime.shutdown_background();
    }
}

/// A line of the server's log on standard error: `hvstats serve: LINE`, its control characters
/// escaped ([`hvstats_present::text::OneLine`]) so no client's text can forge a line. A closed
/// standard error is ignored.
pub(crate) fn log(line: &str) {
    use std::io::Write;
    let mut err = io::stderr().lock();
    let _ = writeln!(err, "hvstats serve: {}", hvstats_present::text::OneLine(line));
}
