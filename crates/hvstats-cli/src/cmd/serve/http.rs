//! The HTTP side of `serve`: an HTTP/1.1 server that no client can stall, exhaust or kill.
//!
//! An exporter listens to peers it does not control (the README's fleet puts `--listen` off
//! loopback), so every resource a client can make it hold is bounded here, and only here:
//!
//! - connections: at most [`Limits::max_connections`] at once; one more is answered `503` and
//!   closed at once, never queued;
//! - the request head (request line and headers): at most [`Limits::max_head_bytes`], read within
//!   [`Limits::header_read_timeout`] (the same deadline closes a keep-alive connection that sends
//!   nothing more); a longer line is refused before it is buffered;
//! - request bodies: never read, so a declared length allocates nothing;
//! - writes: a reply that makes no progress for [`Limits::write_timeout`] (a client that does not
//!   read) closes its connection; a connection lives at most [`Limits::max_lifetime`];
//! - the answer itself (reading the instances) runs on a blocking thread, at most
//!   [`Limits::answer_timeout`], so the accept loop never waits for it;
//! - HTTP/2 and junk are answered with an error status by the HTTP/1 parser and closed: every
//!   connection is one task, and its descriptor is closed when the task ends;
//! - `accept` failing (EMFILE, ENFILE) is logged and retried with a backoff, never the end.
//!
//! SIGINT and SIGTERM stop the server: it stops accepting, lets replies in flight finish within
//! [`Limits::shutdown_grace`], and returns the signal.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::TcpListener as StdListener;
use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ACCEPT, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio_io_timeout::TimeoutStream;

use crate::signals::Signal;

/// What the server lets one client hold.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Connections served at once; more are answered `503` and closed.
    pub max_connections: usize,
    /// Bytes of a request's line and headers (hyper's read buffer; 8 KiB at least).
    pub max_head_bytes: usize,
    /// Headers of one request.
    pub max_headers: usize,
    /// Time to receive a request's head, and to wait for the next one on a kept-alive connection.
    pub header_read_timeout: Duration,
    /// Time a write (or a read) may wait without progress before the connection is closed.
    pub write_timeout: Duration,
    /// Time to read the instances and encode the answer; past it the reply is `503`.
    pub answer_timeout: Duration,
    /// A connection's whole life; then it is closed after the reply in flight.
    pub max_lifetime: Duration,
    /// Time replies in flight get to finish after SIGINT/SIGTERM.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 64,
            max_head_bytes: 16 * 1024,
            max_headers: 64,
            header_read_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
            answer_timeout: Duration::from_secs(30),
            max_lifetime: Duration::from_secs(300),
            shutdown_grace: Duration::from_millis(500),
        }
    }
}

/// What a request asks, as the answer needs it.
#[derive(Clone, Debug)]
pub struct Asked {
    /// The request method; only GET and HEAD get an answer other than 405.
    pub method: Method,
    /// The path, without query.
    pub path: String,
    /// Every `Accept` header, joined by commas.
    pub accept: String,
}

/// What one request gets.
#[derive(Debug)]
pub struct Reply {
    /// The HTTP status.
    pub status: u16,
    /// The value of the `Content-Type` header sent with `body`.
    pub content_type: &'static str,
    /// The body (left out for HEAD).
    pub body: String,
}

impl Reply {
    /// A plain-text reply.
    pub fn text(status: u16, body: impl Into<String>) -> Self {
        Self { status, content_type: "text/plain; charset=utf-8", body: body.into() }
    }
}

/// A line of `serve`'s log on standard error (see [`crate::output::log`]).
pub fn log(line: &str) {
    crate::output::log("serve", line);
}

/// Serves `listener` with `answer` (a blocking function, run off the accept loop) until SIGINT or
/// SIGTERM; returns the signal.
///
/// `start` runs once the signals are watched and before the first connection is accepted; what it
/// returns comes back with the signal, for the caller to stop.
///
/// # Errors
/// When the runtime cannot start, the listener cannot be handed to it, the signals cannot be
/// watched, or `start` fails. A failing `accept` is not an error: it is logged and retried.
pub fn serve<F, R>(
    listener: StdListener,
    limits: Limits,
    start: impl FnOnce() -> anyhow::Result<R>,
    answer: F,
) -> anyhow::Result<(Signal, R)>
where
    F: Fn(&Asked) -> Reply + Send + Sync + 'static,
{
    listener.set_nonblocking(true)?;
    // One thread accepts and drives every connection; the answers (which read every instance's
    // pages) run on at most two more, so a burst of scrapes cannot multiply threads.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(2)
        .thread_name("hvstats-serve")
        .build()?;
    // SIGINT and SIGTERM are caught from here on, before `start` begins anything that must be
    // stopped cleanly (the observer and its instance files).
    let stopped = {
        let _entered = runtime.enter();
        stop_signal()?
    };
    let started = start()?;
    let grace = limits.shutdown_grace;
    let result = runtime.block_on(accept_loop(listener, limits, Arc::new(answer), stopped));
    // Answers still reading past the grace are abandoned with the process.
    runtime.shutdown_timeout(grace);
    Ok((result?, started))
}

/// The first SIGINT or SIGTERM.
fn stop_signal() -> io::Result<impl Future<Output = Signal>> {
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => Signal::Interrupt,
            _ = terminate.recv() => Signal::Terminate,
        }
    })
}

/// Waits between failed `accept`s: 10 ms doubling to 1 s, reset by a success.
struct Backoff {
    next: Duration,
    failures: u64,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(10);
    const LAST: Duration = Duration::from_secs(1);

    fn new() -> Self {
        Self { next: Self::FIRST, failures: 0 }
    }

    /// The wait after one more failure (`e`), logging the first of a run and each one at the
    /// longest wait.
    fn failed(&mut self, e: &io::Error) -> Duration {
        let wait = self.next;
        self.failures += 1;
        if self.failures == 1 || wait == Self::LAST {
            log(&format!("cannot accept a connection: {e}; retrying in {} ms", wait.as_millis()));
        }
        self.next = (self.next * 2).min(Self::LAST);
        wait
    }

    fn succeeded(&mut self) {
        if self.failures > 0 {
            log(&format!("accepting connections again after {} failed attempts", self.failures));
        }
        *self = Self::new();
    }
}

/// Says at most once per 10 s that the connection cap refused someone.
struct RefusalLog {
    last: Option<Instant>,
    refused: u64,
}

impl RefusalLog {
    fn refused(&mut self, cap: usize) {
        self.refused += 1;
        if self.last.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            log(&format!(
                "{} connections are open (the cap): refused {} more since the last report",
                cap, self.refused
            ));
            self.last = Some(Instant::now());
            self.refused = 0;
        }
    }
}

async fn accept_loop<F>(
    listener: StdListener,
    limits: Limits,
    answer: Arc<F>,
    stopped: impl Future<Output = Signal>,
) -> io::Result<Signal>
where
    F: Fn(&Asked) -> Reply + Send + Sync + 'static,
{
    let listener = TcpListener::from_std(listener)?;
    let mut stopped = pin!(stopped);
    let limits = Arc::new(limits);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (stop, stopping) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut backoff = Backoff::new();
    let mut refusals = RefusalLog { last: None, refused: 0 };
    let signal = loop {
        // Finished connections leave their (empty) result behind until taken.
        while connections.try_join_next().is_some() {}
        let stream = tokio::select! {
            signal = &mut stopped => break signal,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    backoff.succeeded();
                    stream
                }
                Err(e) => {
                    let wait = backoff.failed(&e);
                    tokio::select! {
                        signal = &mut stopped => break signal,
                        () = tokio::time::sleep(wait) => continue,
                    }
                }
            },
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            refusals.refused(limits.max_connections);
            refuse(&stream);
            continue;
        };
        let (limits, answer, stopping) = (Arc::clone(&limits), Arc::clone(&answer), stopping.clone());
        connections.spawn(async move {
            connection(stream, limits, answer, stopping).await;
            drop(slot);
        });
    };
    let _ = stop.send(true);
    let drained = async { while connections.join_next().await.is_some() {} };
    let _ = tokio::time::timeout(limits.shutdown_grace, drained).await;
    Ok(signal)
}

/// Tells a connection past the cap why it is closed, without waiting for it to read.
fn refuse(stream: &TcpStream) {
    const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n\
        Content-Length: 21\r\nConnection: close\r\n\r\ntoo many connections\n";
    let _ = stream.try_write(BUSY);
}

/// Serves one connection within its limits; it is closed when this returns.
async fn connection<F>(
    stream: TcpStream,
    limits: Arc<Limits>,
    answer: Arc<F>,
    mut stopping: watch::Receiver<bool>,
) where
    F: Fn(&Asked) -> Reply + Send + Sync + 'static,
{
    let _ = stream.set_nodelay(true);
    let mut io = TimeoutStream::new(stream);
    // A read or write pending this long without progress ends the connection: a client that
    // stopped reading a large reply, or stopped sending a body nobody reads.
    io.set_read_timeout(Some(limits.header_read_timeout.max(limits.answer_timeout)));
    io.set_write_timeout(Some(limits.write_timeout));
    let service = {
        let limits = Arc::clone(&limits);
        service_fn(move |request| respond(request, Arc::clone(&answer), limits.answer_timeout))
    };
    let mut conn = pin!(
        http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout)
            .max_buf_size(limits.max_head_bytes.max(8192))
            .max_headers(limits.max_headers)
            .serve_connection(TokioIo::new(Box::pin(io)), service)
    );
    let lifetime = tokio::time::sleep(limits.max_lifetime);
    tokio::select! {
        // A client's errors (a malformed request, a timeout, a reset) are the client's: the
        // connection ends and the server goes on.
        _ = conn.as_mut() => return,
        _ = stopping.changed() => {}
        () = lifetime => {}
    }
    // Shutting down or too old: finish the reply in flight, then close, within a bound.
    conn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(limits.shutdown_grace.max(limits.write_timeout), conn).await;
}

/// The reply to one request. Its body is never read: dropping it tells hyper not to keep the
/// connection for another request unless the body was empty.
async fn respond<F>(
    request: Request<Incoming>,
    answer: Arc<F>,
    answer_timeout: Duration,
) -> Result<Response<Full<Bytes>>, Infallible>
where
    F: Fn(&Asked) -> Reply + Send + Sync + 'static,
{
    let accept = request
        .headers()
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",");
    let asked = Asked { method: request.method().clone(), path: request.uri().path().to_owned(), accept };
    drop(request);
    let reading = tokio::task::spawn_blocking(move || answer(&asked));
    let reply = match tokio::time::timeout(answer_timeout, reading).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(_)) => Reply::text(500, "the answer failed\n"),
        Err(_) => Reply::text(503, "reading the instances took too long\n"),
    };
    let mut response = Response::new(Full::new(Bytes::from(reply.body)));
    *response.status_mut() = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(reply.content_type));
    Ok(response)
}
