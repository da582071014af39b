//! The HTTP side of `serve`: an HTTP/1.1 server that no client can stall, exhaust or kill.
//!
//! An exporter listens to peers it does not control (the README's fleet puts `--listen` off
//! loopback), so every resource a client can make it hold is bounded here, and only here:
//!
//! - connections: at most [`Limits::max_connections`] kept at once; above the cap, new
//!   connections are still taken in at once, up to [`Limits::hard_limit`] (five times the cap),
//!   so the listen backlog never fills with clients that connect and close (a full backlog makes
//!   the kernel drop handshakes, and reset a client whose handshake it dropped once it sends);
//!   while the cap is passed, the connection that holds the most and has done the least is closed
//!   as soon as its [`GRACE`] ends ([`Bounds::close_idlest`]: never one with a reply handed over
//!   in the last minute while another is left, nor one that has sent a whole request head while
//!   one that has not is left, first from the source address holding the most connections, idle
//!   before busy, silent before mid-handshake before served), so a connection above the cap
//!   that sends no whole request head within its grace is closed then. Only at the hard limit,
//!   with every connection within its grace or past its head, do new ones wait in the listen
//!   backlog. So clients holding the cap, or reconnecting as fast as they are closed, cannot
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
//!   connection sending it ([`Body::Shared`], counted once against [`Limits::max_reply_bytes`]);
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

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::body::{Body as HttpBody, Bytes, Frame, Incoming, SizeHint};
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

use crate::log;
use crate::web::{Refusal, Web};

/// What the server lets one client hold.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Connections kept at once; above it (up to [`Limits::hard_limit`]) new ones are taken in,
    /// and the one that has done least is closed as its grace ends (see
    /// [`Bounds::close_idlest`]).
    pub max_connections: usize,
    /// Bytes of a request's line and headers (hyper's read buffer; 8 KiB at least).
    pub max_head_bytes: usize,
    /// Headers of one request.
    pub max_headers: usize,
    /// Time to receive a request's head, and to wait for the next one on a kept-alive connection.
    pub header_read_timeout: Duration,
    /// Time from accepting a connection to its first request's head received in full (its TLS
    /// handshake included): a client still silent, or mid-handshake, by then is closed.
    pub first_request_timeout: Duration,
    /// Time a write (or a read) may wait without progress before the connection is closed.
    pub write_timeout: Duration,
    /// Time to read the instances and encode the answer; past it the reply is `503`.
    pub answer_timeout: Duration,
    /// A connection's whole life; then it is closed after the reply in flight.
    pub max_lifetime: Duration,
    /// Time replies in flight get to finish after SIGINT, SIGTERM or SIGHUP.
    pub shutdown_grace: Duration,
    /// Bytes of large replies in flight (each counted once, however many connections send it);
    /// a reply larger than this alone is still made, once every other is gone.
    pub max_reply_bytes: usize,
}

impl Limits {
    /// Connections open at once, the most: the cap and, above it, four times as many again,
    /// taken in at once to show whether they send a request (those that have not sent a whole
    /// request head are closed when their [`GRACE`] ends, while the cap is passed).
    pub(crate) fn hard_limit(&self) -> usize {
        self.max_connections.saturating_add(self.max_connections.saturating_mul(4))
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 64,
            max_head_bytes: 16 * 1024,
            max_headers: 64,
            header_read_timeout: Duration::from_secs(10),
            first_request_timeout: Duration::from_secs(3),
            write_timeout: Duration::from_secs(10),
            answer_timeout: Duration::from_secs(30),
            max_lifetime: Duration::from_secs(300),
            shutdown_grace: Duration::from_millis(500),
            max_reply_bytes: 128 << 20,
        }
    }
}

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

/// The body of a reply.
#[derive(Clone, Debug)]
pub(crate) enum Body {
    /// A short text, the connection's own.
    Small(Bytes),
    /// A large reply made once and sent by every connection that asked for it.
    Shared(SharedBody),
}

/// A large reply in chunks, counted against [`Limits::max_reply_bytes`] until the last
/// connection sending it lets go.
#[derive(Clone, Debug)]
pub(crate) struct SharedBody(Arc<Chunks>);

#[derive(Debug)]
struct Chunks {
    parts: Vec<Bytes>,
    len: usize,
    bounds: Arc<Bounds>,
}

impl Drop for Chunks {
    fn drop(&mut self) {
        self.bounds.bytes.fetch_sub(self.len, Ordering::Relaxed);
    }
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

/// A writer (of bytes, or of text) that keeps what it is given in chunks of at most
/// [`ChunkWriter::CHUNK`] bytes: a large reply costs its size, without the copies of a growing
/// buffer.
#[derive(Default)]
pub(crate) struct ChunkWriter {
    parts: Vec<Bytes>,
    current: Vec<u8>,
    len: usize,
}

impl ChunkWriter {
    /// The size of a chunk.
    pub(crate) const CHUNK: usize = 1 << 20;

    fn push(&mut self, mut bytes: &[u8]) {
        self.len += bytes.len();
        while !bytes.is_empty() {
            if self.current.capacity() == 0 {
                self.current.reserve_exact(Self::CHUNK);
            }
            let room = Self::CHUNK - self.current.len();
            let (now, later) = bytes.split_at(room.min(bytes.len()));
            self.current.extend_from_slice(now);
            bytes = later;
            if self.current.len() == Self::CHUNK {
                self.parts.push(Bytes::from(std::mem::take(&mut self.current)));
            }
        }
    }

    /// The reply, counted against `bounds`' budget of reply bytes.
    pub(crate) fn finish(mut self, bounds: &Arc<Bounds>) -> SharedBody {
        if !self.current.is_empty() {
            self.current.shrink_to_fit();
            self.parts.push(Bytes::from(std::mem::take(&mut self.current)));
        }
        bounds.bytes.fetch_add(self.len, Ordering::Relaxed);
        SharedBody(Arc::new(Chunks { parts: self.parts, len: self.len, bounds: Arc::clone(bounds) }))
    }
}

impl io::Write for ChunkWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.push(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl std::fmt::Write for ChunkWriter {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.push(s.as_bytes());
        Ok(())
    }
}

/// How far a connection has got, the least first: at the cap, of connections otherwise alike,
/// the one that has done the least is closed first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    /// Accepted; nothing received.
    Accepted,
    /// Sending: a TLS handshake or a request head under way.
    Talking,
    /// Its TLS handshake done.
    Secured,
    /// Has had a request answered.
    Served,
}

/// A reply handed over this recently marks its connection as a scraper's, closed at the cap
/// only when no other is left.
const RECENT: Duration = Duration::from_secs(60);

/// A connection accepted this recently is not closed by the cap: it has this long to send its
/// request (a TLS handshake and a request head over a network take a few round trips), so
/// clients reconnecting as fast as they are closed make the server close at most
/// [`Limits::hard_limit`] connections per grace, not one per connection they open, and a
/// scraper's connection among theirs gets its grace like every other.
const GRACE: Duration = Duration::from_secs(1);

/// What the cap can do to admit a new connection.
#[derive(Debug, PartialEq, Eq)]
enum Room {
    /// A connection was told to close.
    Closed,
    /// Every open connection is within its grace: the first grace ends then.
    WaitUntil(Instant),
    /// None is left to close (all are closing already).
    None,
}

/// The connections open now: what each is doing, and how to close it.
#[derive(Debug)]
struct Connection {
    close: Arc<Notify>,
    /// The address it comes from, as budgets count it (`None`: a Unix socket).
    source: Option<IpAddr>,
    /// Its socket, open while this entry is in the table (see [`Bounds::unread`]).
    socket: Option<RawFd>,
    stage: Stage,
    /// When it last had a successful reply handed over in full.
    answered_at: Option<Instant>,
    /// When it was accepted, or when its last request began.
    active_at: Instant,
    /// When it was accepted.
    accepted_at: Instant,
    /// True from a request's head until its reply is handed over.
    busy: bool,
    /// Requests it has made.
    requests: u64,
    /// When it took the large reply it is sending, if it is sending one.
    holding_since: Option<Instant>,
    closing: bool,
}

/// What the server shares between its connections and the answers: who is connected, and the
/// bytes of the large replies in flight.
#[derive(Debug)]
pub(crate) struct Bounds {
    limits: Limits,
    connections: Mutex<HashMap<u64, Connection>>,
    next: AtomicU64,
    bytes: AtomicUsize,
    /// When the budget of reply bytes last closed connections, said at most once a minute.
    room_said: Mutex<Option<Instant>>,
}

impl Bounds {
    /// The bounds of a server with `limits`.
    pub(crate) fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            connections: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            bytes: AtomicUsize::new(0),
            room_said: Mutex::new(None),
        })
    }

    /// The limits.
    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Connection>> {
        // Nothing half-done in the table can do harm: keep going after a panic elsewhere.
        self.connections.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a connection from `source` on `socket`, which must stay open until the entry
    /// is removed ([`Registered`]).
    fn add(&self, source: Option<IpAddr>, socket: Option<RawFd>) -> (u64, Arc<Notify>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let close = Arc::new(Notify::new());
        let connection = Connection {
            close: Arc::clone(&close),
            source: source.map(crate::auth::budgeted),
            socket,
            stage: Stage::Accepted,
            answered_at: None,
            active_at: Instant::now(),
            accepted_at: Instant::now(),
            busy: false,
            requests: 0,
            holding_since: None,
            closing: false,
        };
        self.table().insert(id, connection);
        (id, close)
    }

    fn with(&self, id: u64, f: impl FnOnce(&mut Connection)) {
        if let Some(c) = self.table().get_mut(&id) {
            f(c);
        }
    }

    /// Whether more connections are open, and not closing already, than the cap.
    fn over_cap(&self) -> bool {
        self.table().values().filter(|c| !c.closing).count() > self.limits.max_connections
    }

    /// Whether `c` has bytes its client sent waiting unread in the kernel (a request head that
    /// came while the server was busy elsewhere): it is not idle, whatever it has been seen to do.
    fn unread(c: &Connection) -> bool {
        let Some(fd) = c.socket else { return false };
        // SAFETY: the entry's socket is open while the entry is in the table: a connection's
        // task drops its stream and its entry ([`Registered`]) in one poll, on the one thread
        // that also runs this (the accept loop), so no other code sees the entry in between.
        let socket = unsafe { BorrowedFd::borrow_raw(fd) };
        rustix::io::ioctl_fionread(socket).is_ok_and(|n| n > 0)
    }

    /// Whether connection `id` has made a request (or is gone).
    fn asked(&self, id: u64) -> bool {
        self.table().get(&id).is_none_or(|c| c.requests > 0)
    }

    /// Closes the connection that holds the most and has done the least, in this order, where
    /// one accepted less than [`GRACE`] ago is waited for ([`Room::WaitUntil`]), never passed
    /// over for one that comes after it:
    ///
    /// - one that had a reply handed over in the last minute (a scraper's) only when no other
    ///   is left;
    /// - one that has sent a whole request head, or has bytes waiting unread, only when none that
    ///   has not is left (a connection silent, or stuck mid-handshake or mid-head, goes first);
    /// - of the source address holding the most connections (a client opening many pays for
    ///   them, not one with a single connection);
    /// - idle before waiting for an answer, and of those waiting, the one that has asked most (a
    ///   client asking again and again yields to one still waiting for its first answer);
    /// - of idle ones, the one that has got least far ([`Stage`]: silent, then mid-handshake or
    ///   mid-head, then done with TLS, then between requests), then the one inactive longest.
    fn close_idlest(&self) -> Room {
        self.close_idlest_at(Instant::now())
    }

    /// Above the cap, closes the connections that have done least as soon as their grace ends
    /// (one that has sent a whole request head only when none that has not is left, see
    /// [`Bounds::close_idlest`]), saying so in `log`; returns when the next grace that holds this
    /// up ends.
    fn enforce_cap(&self, log: &mut CapLog) -> Option<Instant> {
        while self.over_cap() {
            match self.close_idlest() {
                Room::Closed => log.closed(self.limits.max_connections),
                Room::WaitUntil(until) => return Some(until),
                Room::None => break,
            }
        }
        None
    }

    fn close_idlest_at(&self, now: Instant) -> Room {
        let mut table = self.table();
        let mut shares: HashMap<Option<IpAddr>, usize> = HashMap::new();
        for c in table.values().filter(|c| !c.closing) {
            *shares.entry(c.source).or_default() += 1;
        }
        let mut order: Vec<_> = table
            .iter()
            .filter(|(_, c)| !c.closing)
            .map(|(id, c)| {
                let recent = c.answered_at.is_some_and(|t| now.saturating_duration_since(t) < RECENT);
                let share = shares.get(&c.source).copied().unwrap_or(0);
                let asked = if c.busy { u64::MAX - c.requests } else { 0 };
                let headed = c.requests > 0 || Self::unread(c);
                ((recent, headed, std::cmp::Reverse(share), c.busy, asked, c.stage, c.active_at), *id)
            })
            .collect();
        order.sort_unstable();
        // In that order, the first connection past its grace is closed, unless one within its
        // grace comes before it: that one is waited for (a connection that has done more, or
        // asked and waits for its answer, is never closed for the sake of a newer one).
        let mut wait: Option<Instant> = None;
        for (_, id) in order {
            let Some(c) = table.get_mut(&id) else { continue };
            let grace_ends = c.accepted_at + GRACE;
            if now < grace_ends {
                wait = Some(wait.map_or(grace_ends, |w| w.min(grace_ends)));
                continue;
            }
            if let Some(until) = wait {
                return Room::WaitUntil(until);
            }
            c.closing = true;
            c.close.notify_one();
            return Room::Closed;
        }
        match wait {
            Some(until) => Room::WaitUntil(until),
            None => Room::None,
        }
    }

    /// Bytes of large replies in flight.
    pub(crate) fn reply_bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Makes room for a new large reply: while the replies in flight pass the budget, closes the
    /// connections that have held theirs longest, then waits (at most a second) for them to let
    /// go. Runs on a blocking thread, off the one that drives the connections.
    pub(crate) fn make_room(&self) {
        let limit = self.limits.max_reply_bytes;
        if self.reply_bytes() <= limit {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut closed = 0;
        // The older half of the holders at a time (a reply is shared: closing one connection
        // frees nothing while another still sends it), until the replies fit.
        while self.reply_bytes() > limit && Instant::now() < deadline {
            let mut holders: Vec<(Instant, u64)> = {
                let table = self.table();
                table
                    .iter()
                    .filter(|(_, c)| !c.closing)
                    .filter_map(|(id, c)| Some((c.holding_since?, *id)))
                    .collect()
            };
            if holders.is_empty() {
                break;
            }
            holders.sort();
            holders.truncate(holders.len().div_ceil(2));
            {
                let mut table = self.table();
                for (_, id) in &holders {
                    if let Some(c) = table.get_mut(id) {
                        c.closing = true;
                        c.close.notify_one();
                        closed += 1;
                    }
                }
            }
            let wait = Instant::now() + Duration::from_millis(200);
            while self.reply_bytes() > limit && Instant::now() < wait.min(deadline) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let mut said = self.room_said.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if said.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
            log(&format!(
                "replies in flight passed {limit} bytes: closed {closed} connection(s) that held \
                 theirs longest (said once a minute at most)"
            ));
            *said = Some(Instant::now());
        }
    }
}

/// Marks its connection idle again when the reply is handed over (or abandoned).
struct Hold {
    bounds: Arc<Bounds>,
    id: u64,
    /// The reply is a success (2xx).
    success: bool,
}

impl Hold {
    /// The reply was handed over in full.
    fn done(self) {
        if self.success {
            self.bounds.with(self.id, |c| c.answered_at = Some(Instant::now()));
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.bounds.with(self.id, |c| {
            c.busy = false;
            c.holding_since = None;
            c.active_at = Instant::now();
        });
    }
}

/// A connection's entry in [`Bounds`], removed when the connection ends.
struct Registered {
    bounds: Arc<Bounds>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.bounds.table().remove(&self.id);
    }
}

/// The body hyper writes: a small text, or a shared reply's chunks one at a time.
struct ReplyBody {
    body: Body,
    next: usize,
    hold: Option<Hold>,
}

impl HttpBody for ReplyBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        let chunk = match &mut this.body {
            Body::Small(bytes) if this.next == 0 && !bytes.is_empty() => Some(bytes.clone()),
            Body::Small(_) => None,
            Body::Shared(shared) => shared.0.parts.get(this.next).cloned(),
        };
        this.next += 1;
        if chunk.is_none()
            && let Some(hold) = this.hold.take()
        {
            hold.done();
        }
        Poll::Ready(chunk.map(|c| Ok(Frame::data(c))))
    }

    fn is_end_stream(&self) -> bool {
        match &self.body {
            Body::Small(bytes) => self.next > 0 || bytes.is_empty(),
            Body::Shared(shared) => self.next >= shared.0.parts.len(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        let len = match &self.body {
            Body::Small(bytes) => bytes.len(),
            Body::Shared(shared) => shared.0.len,
        };
        SizeHint::with_exact(len as u64)
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

/// Says once per run (a run ends after a minute without one) that the connection cap closed
/// connections to admit others, and how many.
struct CapLog {
    last: Option<Instant>,
    closed: u64,
}

impl CapLog {
    fn closed(&mut self, cap: usize) {
        self.closed += 1;
        let new_run = self.last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60));
        if new_run {
            log(&format!(
                "{cap} connections are open (the cap): closing the idlest to admit new ones \
                 (said once a minute at most; {} closed since the last time)",
                self.closed
            ));
            self.closed = 0;
        }
        self.last = Some(Instant::now());
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
    let limits = context.bounds.limits().clone();
    // Descriptors held at once: the cap, and the room above it where new connections are taken
    // in at once (the listen backlog never fills) to show whether they send a request.
    let slots = Arc::new(Semaphore::new(limits.hard_limit()));
    let (stop, stopping) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut backoff = Backoff::new();
    let mut cap_log = CapLog { last: None, closed: 0 };
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
        let registered = Registered { bounds: Arc::clone(&self.context.bounds), id: self.id };
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
                self.context.bounds.with(self.id, |c| c.stage = c.stage.max(Stage::Secured));
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

/// A client's stream that marks its connection [`Stage::Talking`] once the client has sent
/// something.
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
            bounds.with(this.id, |c| c.stage = c.stage.max(Stage::Talking));
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
    let limits = context.bounds.limits().clone();
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
    context.bounds.with(id, |c| {
        c.busy = true;
        c.requests += 1;
        c.stage = Stage::Served;
        c.active_at = Instant::now();
    });
    let mut hold = Hold { bounds: Arc::clone(&context.bounds), id, success: false };
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
        context.bounds.with(id, |c| c.holding_since = Some(Instant::now()));
    }
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    hold.success = status.is_success();
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
    let mut response = Response::new(ReplyBody { body: reply.body, next: 0, hold: Some(hold) });
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_closes_no_connection_within_its_grace_and_then_the_one_that_did_least() {
        let bounds = Bounds::new(Limits::default());
        let ip: IpAddr = [127, 0, 0, 1].into();
        let (scraper, _) = bounds.add(Some(ip), None);
        let (silent, _) = bounds.add(Some(ip), None);
        let (talking, _) = bounds.add(Some(ip), None);
        bounds.with(scraper, |c| c.stage = Stage::Talking);
        bounds.with(talking, |c| c.stage = Stage::Talking);
        let accepted = bounds.table().values().map(|c| c.accepted_at).min().unwrap();
        // Every one is within its grace: none is closed, and the first grace's end is said.
        assert_eq!(bounds.close_idlest_at(accepted), Room::WaitUntil(accepted + GRACE));
        assert!(bounds.table().values().all(|c| !c.closing));
        // Past it: the silent one first, then the one mid-head that is older.
        let later = accepted + GRACE * 2;
        assert_eq!(bounds.close_idlest_at(later), Room::Closed);
        assert!(bounds.table()[&silent].closing);
        bounds.with(scraper, |c| c.answered_at = Some(later));
        assert_eq!(bounds.close_idlest_at(later), Room::Closed);
        assert!(bounds.table()[&talking].closing, "the scraper that was answered is kept");
        // The scraper goes only when no other is left; then none is left to close.
        assert_eq!(bounds.close_idlest_at(later), Room::Closed);
        assert!(bounds.table()[&scraper].closing);
        assert_eq!(bounds.close_idlest_at(later), Room::None);
    }

    #[test]
    fn a_connection_that_sent_a_whole_request_head_is_closed_only_when_no_silent_one_is_left() {
        let bounds = Bounds::new(Limits { max_connections: 2, ..Limits::default() });
        let (many, few): (IpAddr, IpAddr) = ([127, 0, 0, 1].into(), [127, 0, 0, 2].into());
        // Three scrapers' connections from one address: one waiting for its answer, two idle
        // between requests (no reply handed over yet); one silent connection from another.
        let scrapers: Vec<u64> = (0..3).map(|_| bounds.add(Some(many), None).0).collect();
        for &id in &scrapers {
            bounds.with(id, |c| {
                c.stage = Stage::Served;
                c.requests = 1;
            });
        }
        bounds.with(scrapers[0], |c| c.busy = true);
        let (silent, _) = bounds.add(Some(few), None);
        assert!(bounds.over_cap());
        // The scrapers' graces are over when the silent one is accepted.
        let accepted = bounds.table()[&silent].accepted_at + GRACE * 2;
        bounds.with(silent, |c| c.accepted_at = accepted);
        // The silent one is within its grace: it is waited for, no scraper is closed for it.
        assert_eq!(bounds.close_idlest_at(accepted), Room::WaitUntil(accepted + GRACE));
        assert!(bounds.table().values().all(|c| !c.closing));
        // Past it: the silent one goes first, although its address holds fewer connections.
        let later = accepted + GRACE * 2;
        assert_eq!(bounds.close_idlest_at(later), Room::Closed);
        assert!(bounds.table()[&silent].closing);
        // Then scrapers: idle before the one waiting for its answer.
        assert_eq!(bounds.close_idlest_at(later), Room::Closed);
        assert!(!bounds.table()[&scrapers[0]].closing);
        assert!(!bounds.over_cap(), "two are left, the cap");
    }

    #[test]
    fn above_the_cap_new_connections_are_taken_in_up_to_the_hard_limit_and_closed_after_their_grace() {
        let limits = Limits { max_connections: 3, ..Limits::default() };
        assert_eq!(limits.hard_limit(), 15);
        let bounds = Bounds::new(limits);
        let ip: IpAddr = [127, 0, 0, 1].into();
        let ids: Vec<u64> = (0..5).map(|_| bounds.add(Some(ip), None).0).collect();
        // A client still sending its head, and one that has sent it whole.
        bounds.with(ids[3], |c| c.stage = Stage::Talking);
        bounds.with(ids[4], |c| {
            c.stage = Stage::Served;
            c.requests = 1;
        });
        let accepted = bounds.table().values().map(|c| c.accepted_at).min().unwrap();
        assert_eq!(bounds.close_idlest_at(accepted), Room::WaitUntil(accepted + GRACE));
        assert!(bounds.over_cap(), "none is closed within its grace");
        // When the graces end, silent ones are closed until the cap is met again.
        let later = accepted + GRACE * 2;
        while bounds.over_cap() {
            assert_eq!(bounds.close_idlest_at(later), Room::Closed);
        }
        let open: Vec<u64> = {
            let table = bounds.table();
            let mut open: Vec<u64> = table.iter().filter(|(_, c)| !c.closing).map(|(id, _)| *id).collect();
            open.sort_unstable();
            open
        };
        assert_eq!(open, vec![ids[2], ids[3], ids[4]], "the silent ones accepted first are closed");
    }

    #[test]
    fn a_connection_with_a_request_waiting_unread_is_closed_after_a_silent_one() {
        let bounds = Bounds::new(Limits::default());
        let ip: IpAddr = [127, 0, 0, 1].into();
        let (waiting_server, mut waiting_client) = std::os::unix::net::UnixStream::pair().unwrap();
        let (silent_server, _silent_client) = std::os::unix::net::UnixStream::pair().unwrap();
        // Accepted first, and its request came while the server was busy elsewhere.
        let (waiting, _) = bounds.add(Some(ip), Some(waiting_server.as_raw_fd()));
        let (silent, _) = bounds.add(Some(ip), Some(silent_server.as_raw_fd()));
        std::io::Write::write_all(&mut waiting_client, b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let later = bounds.table().values().map(|c| c.accepted_at).max().unwrap() + GRACE * 2;
        assert_eq!(bounds.close_idlest_at(later), Room::Closed);
        assert!(bounds.table()[&silent].closing);
        assert!(!bounds.table()[&waiting].closing);
        assert_eq!(bounds.close_idlest_at(later), Room::Closed);
        assert!(bounds.table()[&waiting].closing, "it goes when no other is left");
    }
}
