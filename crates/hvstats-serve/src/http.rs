//! The HTTP side of `serve`: an HTTP/1.1 server that no client can stall, exhaust or kill.
//!
//! An exporter listens to peers it does not control (the README's fleet puts `--listen` off
//! loopback), so every resource a client can make it hold is bounded here and in the table of
//! connections (`crate::bounds`), and only there:
//!
//! - connections: at most [`Limits::max_connections`] kept at once; above the cap, new
//!   connections are still taken in at once, up to [`Limits::hard_limit`] (five times the cap),
//!   so the listen backlog never fills with clients that connect and close (a full backlog makes
//!   the kernel drop handshakes, and reset a client whose handshake it dropped once it sends);
//!   while the cap is passed, the connection that holds the most and has done the least is closed
//!   as soon as its grace (a second) ends ([`Bounds::close_idlest`]: never one with a reply
//!   handed over in the last minute while another is left, nor one that has sent a whole request
//!   head while one that has not is left, first from the source address holding the most
//!   connections, idle before busy, silent before mid-handshake before served), so a connection
//!   above the cap that sends no whole request head within its grace is closed then. Only at the
//!   hard limit, with every connection within its grace or past its head, do new ones wait in the
//!   listen backlog. So clients holding the cap, or reconnecting as fast as they are closed, cannot
//!   push out a scraper, from another address or from the scraper's own: each connection a
//!   scraper opens is taken in at once and has its grace to send its request; the cap is logged
//!   once per run of such closes, not per connection;
//! - a new connection's TLS handshake and first request head: within
//!   [`Limits::first_request_timeout`] of its accept, together;
//! - the request head (request line and headers): at most [`Limits::max_head_bytes`], arriving in
//!   full within [`Limits::header_read_timeout`] (the same deadline closes a keep-alive connection
//!   that sends nothing more); a longer line is refused before it is buffered;
//! - request bodies: never read, so a declared length allocates nothing;
//! - requests on one connection: one at a time (pipelined ones wait their turn in hyper's
//!   bounded read buffer), each answered from a reading begun after it arrived, so a connection
//!   gets at most one answer per reading however fast it asks;
//! - the bytes of replies in flight: a large reply is made once per reading and shared by every
//!   connection sending it ([`crate::body::Body::Shared`], counted once against
//!   [`Limits::max_reply_bytes`]);
//!   past that budget, the connections that have held their reply longest are closed before a
//!   new one is made;
//! - writes: a reply that makes no progress for [`Limits::write_timeout`] (a client that does not
//!   read) closes its connection; a connection lives at most [`Limits::max_lifetime`];
//! - HTTP/2 and junk are answered with an error status by the HTTP/1 parser and closed: every
//!   connection is one task, and its descriptor is closed when the task ends;
//! - `accept` failing (EMFILE, ENFILE) is logged and retried with a backoff, never the end.
//!
//! Who may ask ([`crate::web`]): TLS and basic authentication are checked here, before any
//! answer is made.
//!
//! A [`crate::Stop`] stops the server: it stops accepting, lets replies in flight finish within
//! [`Limits::shutdown_grace`], and returns without waiting for readings under way.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::{Bytes, Incoming};
use hyper::header::{
    ACCEPT, ACCEPT_ENCODING, AUTHORIZATION, CONTENT_ENCODING, CONTENT_TYPE, HeaderName, HeaderValue, VARY,
    WWW_AUTHENTICATE,
};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio_io_timeout::TimeoutStream;

use crate::body::{Body, ReplyBody};
use crate::bounds::{Bounds, CapLog, Hold, Limits, Registered};
use crate::log;
use crate::web::{Refusal, Web};

/// What a request asks, as the answer needs it.
#[derive(Clone, Debug)]
pub(crate) struct Asked {
    /// The request method; only GET and HEAD get an answer other than 405.
    pub method: Method,
    /// The path, without query.
    pub path: String,
    /// Every `Accept` header, joined by commas.
    pub accept: String,
    /// Every `Accept-Encoding` header, joined by commas.
    pub accept_encoding: String,
    /// The query, percent-encoded (empty without one).
    pub query: String,
}

/// What one request gets.
#[derive(Debug)]
pub(crate) struct Reply {
    /// The HTTP status.
    pub status: u16,
    /// The value of the `Content-Type` header sent with `body`.
    pub content_type: &'static str,
    /// The body (left out for HEAD).
    pub body: Body,
    /// The `Content-Encoding` of `body`, when it is compressed.
    pub encoding: Option<&'static str>,
    /// The request headers the body was chosen by (`Vary`), when any was.
    pub vary: Option<&'static str>,
}

impl Reply {
    /// A plain-text reply.
    pub(crate) fn text(status: u16, body: impl Into<String>) -> Self {
        let body: String = body.into();
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            body: Body::Small(Bytes::from(body)),
            encoding: None,
            vary: None,
        }
    }
}

/// The answer to one request, made off the thread that drives the connections.
pub(crate) type Answer = Pin<Box<dyn Future<Output = Reply> + Send>>;

/// What the server answers with.
pub(crate) type Handler = Arc<dyn Fn(Asked) -> Answer + Send + Sync>;

/// A bound listening socket.
pub enum Listener {
    /// TCP (plain, or TLS per the web configuration).
    Tcp(std::net::TcpListener),
    /// A Unix socket.
    Unix(std::os::unix::net::UnixListener),
}

/// A listener handed to the runtime.
pub(crate) enum Accepting {
    Tcp(TcpListener),
    Unix(UnixListener),
}

enum Accepted {
    Tcp(TcpStream, IpAddr),
    Unix(UnixStream),
}

impl Accepting {
    /// `listener`, made non-blocking and handed to the runtime entered.
    pub(crate) fn from_std(listener: Listener) -> io::Result<Self> {
        Ok(match listener {
            Listener::Tcp(l) => {
                l.set_nonblocking(true)?;
                Accepting::Tcp(TcpListener::from_std(l)?)
            }
            Listener::Unix(l) => {
                l.set_nonblocking(true)?;
                Accepting::Unix(UnixListener::from_std(l)?)
            }
        })
    }

    async fn accept(&self) -> io::Result<Accepted> {
        match self {
            Accepting::Tcp(l) => l.accept().await.map(|(s, peer)| Accepted::Tcp(s, peer.ip())),
            Accepting::Unix(l) => l.accept().await.map(|(s, _)| Accepted::Unix(s)),
        }
    }
}

impl Accepted {
    /// The address the connection comes from (none on a Unix socket).
    fn peer(&self) -> Option<IpAddr> {
        match self {
            Accepted::Tcp(_, peer) => Some(*peer),
            Accepted::Unix(_) => None,
        }
    }

    fn socket(&self) -> RawFd {
        match self {
            Accepted::Tcp(s, _) => s.as_raw_fd(),
            Accepted::Unix(s) => s.as_raw_fd(),
        }
    }
}

/// What every connection needs.
pub(crate) struct Shared {
    /// Who is connected, and the bytes of the replies in flight.
    pub(crate) bounds: Arc<Bounds>,
    /// What the server answers with.
    pub(crate) handler: Handler,
    /// TLS and basic authentication, when configured.
    pub(crate) web: Option<Arc<Web>>,
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

/// Accepts connections on `listener` and serves each on a task of its own until `stopped`; then
/// lets the replies in flight finish within [`Limits::shutdown_grace`].
pub(crate) async fn accept_loop(
    listener: Accepting,
    context: Arc<Shared>,
    stopped: impl Future<Output = ()>,
) {
    let mut stopped = pin!(stopped);
    let limits: Limits = context.bounds.limits().clone();
    // Descriptors held at once: the cap, and the room above it where new connections are taken
    // in at once (the listen backlog never fills) to show whether they send a request.
    let slots = Arc::new(Semaphore::new(limits.hard_limit()));
    let (stop, stopping) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut backoff = Backoff::new();
    let mut cap_log = CapLog::default();
    loop {
        // Finished connections leave their (empty) result behind until taken.
        while connections.try_join_next().is_some() {}
        let recheck = context.bounds.enforce_cap(&mut cap_log);
        let next = tokio::select! {
            () = &mut stopped => break,
            next = next_connection(&listener, &slots, &mut backoff, recheck) => next,
        };
        let Some((stream, slot)) = next else { continue };
        let (id, close) = context.bounds.add(stream.peer(), Some(stream.socket()));
        let task = Task {
            context: Arc::clone(&context),
            id,
            close,
            // The TLS handshake and the first request's head, together, have a deadline of
            // their own.
            first: Instant::now() + limits.first_request_timeout,
            stopping: stopping.clone(),
        };
        connections.spawn(task.run(stream, slot));
    }
    let _ = stop.send(true);
    let drained = async { while connections.join_next().await.is_some() {} };
    let _ = tokio::time::timeout(limits.shutdown_grace, drained).await;
}

/// The next connection, with the descriptor slot it holds; `None` when the next grace ended
/// first (`recheck`: the cap looks again) or `accept` failed (then after its backoff). At the hard
/// limit, new connections wait in the listen backlog until one closed (by the cap, a deadline or
/// its client) gives its slot back, or a grace ends.
async fn next_connection(
    listener: &Accepting,
    slots: &Arc<Semaphore>,
    backoff: &mut Backoff,
    recheck: Option<Instant>,
) -> Option<(Accepted, OwnedSemaphorePermit)> {
    let slot = tokio::select! {
        slot = Arc::clone(slots).acquire_owned() => slot.ok()?,
        () = sleep_until_some(recheck) => return None,
    };
    let accepted = tokio::select! {
        accepted = listener.accept() => accepted,
        () = sleep_until_some(recheck) => return None,
    };
    match accepted {
        Ok(stream) => {
            backoff.succeeded();
            Some((stream, slot))
        }
        Err(e) => {
            drop(slot);
            tokio::time::sleep(backoff.failed(&e)).await;
            None
        }
    }
}

/// One accepted connection: what its task needs beside its stream.
struct Task {
    context: Arc<Shared>,
    id: u64,
    /// Told when the cap or the reply budget closes the connection.
    close: Arc<Notify>,
    /// When its TLS handshake and first request head must be done.
    first: Instant,
    stopping: watch::Receiver<bool>,
}

impl Task {
    /// Serves the connection; its entry in the table and its slot go when it ends.
    async fn run(self, stream: Accepted, slot: OwnedSemaphorePermit) {
        let registered = Registered::new(Arc::clone(&self.context.bounds), self.id);
        match stream {
            Accepted::Tcp(s, peer) => self.tcp(s, peer).await,
            Accepted::Unix(s) => {
                let fd = s.as_raw_fd();
                let s = Heard::new(s, Arc::clone(&self.context.bounds), self.id);
                connection(s, fd, None, self).await;
            }
        }
        drop(registered);
        drop(slot);
    }

    /// A TCP connection: its TLS handshake first when the web configuration asks for TLS (within
    /// the first request's deadline, and ended at once when the cap closes it).
    async fn tcp(self, s: TcpStream, peer: IpAddr) {
        let _ = s.set_nodelay(true);
        let fd = s.as_raw_fd();
        let s = Heard::new(s, Arc::clone(&self.context.bounds), self.id);
        let Some(tls) = self.context.web.as_ref().and_then(|w| w.tls()).cloned() else {
            return connection(s, fd, Some(peer), self).await;
        };
        let close = Arc::clone(&self.close);
        let handshake = tokio::time::timeout_at(self.first.into(), tls.accept(s));
        tokio::select! {
            done = handshake => if let Ok(Ok(s)) = done {
                self.context.bounds.secured(self.id);
                connection(s, fd, Some(peer), self).await;
            },
            () = close.notified() => {}
        }
    }
}

/// Sleeps until `at`, or for ever without it.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// A client's stream that marks its connection as talking ([`Bounds::heard`]) once the client
/// has sent something.
struct Heard<S> {
    inner: S,
    bounds: Option<Arc<Bounds>>,
    id: u64,
}

impl<S> Heard<S> {
    fn new(inner: S, bounds: Arc<Bounds>, id: u64) -> Self {
        Self { inner, bounds: Some(bounds), id }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Heard<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before
            && let Some(bounds) = this.bounds.take()
        {
            bounds.heard(this.id);
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Heard<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Serves one connection (`stream`, its socket `fd`, from `peer`) within its limits; it is
/// closed when this returns.
async fn connection<I>(stream: I, fd: RawFd, peer: Option<IpAddr>, task: Task)
where
    I: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let Task { context, id, close, first, mut stopping } = task;
    let limits: Limits = context.bounds.limits().clone();
    let mut io = TimeoutStream::new(stream);
    // A read or write pending this long without progress ends the connection: a client that
    // stopped reading a large reply, or stopped sending a body nobody reads.
    io.set_read_timeout(Some(limits.header_read_timeout.max(limits.answer_timeout)));
    io.set_write_timeout(Some(limits.write_timeout));
    let service = {
        let context = Arc::clone(&context);
        service_fn(move |request| respond(request, Arc::clone(&context), peer, id))
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
    // A connection that has not sent its first request head by `first` is closed.
    let first_request = async {
        tokio::time::sleep_until(first.into()).await;
        if context.bounds.asked(id) {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        () = first_request => return,
        // A client's errors (a malformed request, a timeout, a reset) are the client's: the
        // connection ends and the server goes on.
        _ = conn.as_mut() => return,
        // Closed to make room (the cap, or the budget of reply bytes): at once, the reply's
        // bytes still queued in the kernel dropped with it (a reset, not a close that would
        // deliver them first).
        () = close.notified() => {
            // SAFETY: `fd` is the socket `conn` owns, open until `conn` is dropped below.
            let socket = unsafe { BorrowedFd::borrow_raw(fd) };
            let _ = rustix::net::sockopt::set_socket_linger(socket, Some(Duration::ZERO));
            return;
        }
        _ = stopping.changed() => {}
        () = lifetime => {}
    }
    // Shutting down or too old: finish the reply in flight, then close, within a bound.
    conn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(limits.shutdown_grace.max(limits.write_timeout), conn).await;
}

/// The reply to one request. Its body is never read: dropping it tells hyper not to keep the
/// connection for another request unless the body was empty.
async fn respond(
    request: Request<Incoming>,
    context: Arc<Shared>,
    peer: Option<IpAddr>,
    id: u64,
) -> Result<Response<ReplyBody>, Infallible> {
    let mut hold = context.bounds.request_began(id);
    let (asked, authorization) = asked_of(request);
    let admitted = match &context.web {
        Some(web) => web.admit(authorization.as_deref(), peer).await,
        None => Ok(()),
    };
    let (reply, challenge) = match admitted {
        Ok(()) => (answered(&context, asked).await, false),
        Err(refusal) => (Reply::text(refusal.status(), refusal.text()), refusal == Refusal::Unauthorized),
    };
    if matches!(reply.body, Body::Shared(_)) {
        hold.holds_shared_reply();
    }
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    hold.succeeds(status.is_success());
    Ok(response(status, reply, hold, challenge, context.web.as_deref()))
}

/// What `request` asks, and its `Authorization` header; the request (its body unread) goes here.
fn asked_of(request: Request<Incoming>) -> (Asked, Option<String>) {
    let header =
        |name| request.headers().get_all(name).iter().filter_map(|v| v.to_str().ok()).collect::<Vec<_>>();
    let asked = Asked {
        method: request.method().clone(),
        path: request.uri().path().to_owned(),
        accept: header(ACCEPT).join(","),
        accept_encoding: header(ACCEPT_ENCODING).join(","),
        query: request.uri().query().unwrap_or_default().to_owned(),
    };
    let authorization = header(AUTHORIZATION).first().map(|s| (*s).to_owned());
    (asked, authorization)
}

/// The handler's reply to `asked`, or 503 when it takes longer than [`Limits::answer_timeout`].
async fn answered(context: &Shared, asked: Asked) -> Reply {
    match tokio::time::timeout(context.bounds.limits().answer_timeout, (context.handler)(asked)).await {
        Ok(reply) => reply,
        Err(_) => Reply::text(503, "reading the instances took too long\n"),
    }
}

/// The response that sends `reply` with `status`: its headers, a basic-authentication challenge
/// when `challenge`, the web configuration's headers; `hold` goes when its body is handed over.
fn response(
    status: StatusCode,
    reply: Reply,
    hold: Hold,
    challenge: bool,
    web: Option<&Web>,
) -> Response<ReplyBody> {
    let mut response = Response::new(ReplyBody::new(reply.body, hold));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(reply.content_type));
    if let Some(encoding) = reply.encoding {
        headers.insert(CONTENT_ENCODING, HeaderValue::from_static(encoding));
    }
    if let Some(vary) = reply.vary {
        headers.insert(VARY, HeaderValue::from_static(vary));
    }
    if challenge {
        headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Basic"));
    }
    for (name, value) in web.map(Web::headers).unwrap_or_default() {
        if let (Ok(name), Ok(value)) =
            (HeaderName::try_from(name.as_str()), HeaderValue::try_from(value.as_str()))
        {
            headers.insert(name, value);
        }
    }
    response
}
