//! What a client can make the server hold, bounded: the connections open (the cap and whom it
//! closes, see [`Bounds::close_idlest`]), and the bytes of the large replies in flight (see
//! [`Bounds::make_room`]). The HTTP side ([`crate::http`]) tells the table what each connection
//! does; the answers ([`crate::answers`]) make room before they make a large reply.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::log;

/// What the server lets one client hold.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Connections kept at once; above it (up to five times as many) new ones are taken in, and
    /// the one that has done least is closed as its grace (a second) ends.
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
    pub(crate) fn add(&self, source: Option<IpAddr>, socket: Option<RawFd>) -> (u64, Arc<Notify>) {
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

    /// Connection `id`'s client has sent something: a TLS handshake or a request head is under
    /// way.
    pub(crate) fn heard(&self, id: u64) {
        self.with(id, |c| c.stage = c.stage.max(Stage::Talking));
    }

    /// Connection `id`'s TLS handshake is done.
    pub(crate) fn secured(&self, id: u64) {
        self.with(id, |c| c.stage = c.stage.max(Stage::Secured));
    }

    /// Connection `id` has sent a whole request head: it is busy until the returned hold goes.
    pub(crate) fn request_began(self: &Arc<Self>, id: u64) -> Hold {
        self.with(id, |c| {
            c.busy = true;
            c.requests += 1;
            c.stage = Stage::Served;
            c.active_at = Instant::now();
        });
        Hold { bounds: Arc::clone(self), id, success: false }
    }

    /// A large reply of `len` bytes is made: counted until [`Bounds::reply_gone`].
    pub(crate) fn reply_made(&self, len: usize) {
        self.bytes.fetch_add(len, Ordering::Relaxed);
    }

    /// A large reply of `len` bytes is gone: no connection sends it any more.
    pub(crate) fn reply_gone(&self, len: usize) {
        self.bytes.fetch_sub(len, Ordering::Relaxed);
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
    pub(crate) fn asked(&self, id: u64) -> bool {
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
    pub(crate) fn enforce_cap(&self, log: &mut CapLog) -> Option<Instant> {
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

/// A request in flight on its connection ([`Bounds::request_began`]): marks the connection idle
/// again when the reply is handed over (or abandoned).
pub(crate) struct Hold {
    bounds: Arc<Bounds>,
    id: u64,
    /// The reply is a success (2xx).
    success: bool,
}

impl Hold {
    /// The reply is a success (2xx): once handed over in full, it marks its connection a
    /// scraper's.
    pub(crate) fn succeeds(&mut self, success: bool) {
        self.success = success;
    }

    /// The reply is a large one, shared: the connection holds it until this hold goes.
    pub(crate) fn holds_shared_reply(&self) {
        self.bounds.with(self.id, |c| c.holding_since = Some(Instant::now()));
    }

    /// The reply was handed over in full.
    pub(crate) fn done(self) {
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
pub(crate) struct Registered {
    bounds: Arc<Bounds>,
    id: u64,
}

impl Registered {
    /// The entry `id` of `bounds`, until this goes.
    pub(crate) fn new(bounds: Arc<Bounds>, id: u64) -> Self {
        Self { bounds, id }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.bounds.table().remove(&self.id);
    }
}

/// Says once per run (a run ends after a minute without one) that the connection cap closed
/// connections to admit others, and how many.
#[derive(Default)]
pub(crate) struct CapLog {
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

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

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
