//! Basic authentication that costs only the client who fails it.
//!
//! A bcrypt comparison is slow on purpose (tens of milliseconds at cost 10, four times that at
//! 12), so who waits for whose comparisons decides whether wrong passwords can lock a scraper
//! out. Here:
//!
//! - comparisons run on a pool of [`WORKERS`] threads of their own, never on the threads that
//!   read the instances;
//! - the pool takes its next comparison from the source addresses in turn (an IPv6 address by its
//!   /64), each with at most [`PER_ADDRESS`] comparisons queued or running; past that a request is
//!   refused at once (429), so an address's failures cost its own time, and a scraper from
//!   another address waits for at most one comparison per address ahead of it;
//! - credentials that matched are remembered by a keyed digest (HMAC-SHA256 under a key drawn at
//!   start, compared in constant time; up to [`REMEMBERED`] of them), so a remembered client never
//!   waits for bcrypt again;
//! - a request whose credentials are already being compared waits for that comparison instead of
//!   queueing another, and a comparison finishes (and a match is remembered) even when every
//!   client waiting for it has gone: a scraper that timed out once is admitted on its next try.
//!
//! An unknown user is compared with a known user's hash all the same, so the time of a refusal
//! does not tell which users exist.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::problem::{Because, Problem, refuse};
use base64::Engine;
use ring::hmac;
use subtle::ConstantTimeEq;
use tokio::sync::watch;

/// Threads comparing bcrypt hashes.
const WORKERS: usize = 2;

/// Comparisons one source address may have queued or running.
const PER_ADDRESS: usize = 4;

/// Credentials that matched, remembered so a scraper costs one bcrypt comparison.
const REMEMBERED: usize = 64;

/// The keyed digest of a user and password.
type Digest = [u8; 32];

/// What [`Auth::check`] decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The user and password match.
    Admitted,
    /// No credentials, or wrong ones.
    Refused,
    /// The source address already has [`PER_ADDRESS`] comparisons queued or running.
    Busy,
}

/// A comparison to make.
struct Job {
    digest: Digest,
    password: String,
    hash: String,
    known: bool,
    source: IpAddr,
}

/// The comparisons queued, running and done.
#[derive(Default)]
struct Queue {
    /// Queued comparisons, by source.
    jobs: HashMap<IpAddr, VecDeque<Job>>,
    /// Sources with queued comparisons, in the order they get their next turn.
    turns: VecDeque<IpAddr>,
    /// Comparisons queued or running, by source.
    pending: HashMap<IpAddr, usize>,
    /// Comparisons queued or running, by credentials: the result, once known, for every request
    /// waiting for it.
    checking: HashMap<Digest, watch::Sender<Option<bool>>>,
    /// Digests of credentials that matched.
    remembered: Vec<Digest>,
}

impl Queue {
    fn remembers(&self, digest: &Digest) -> bool {
        // Every entry is compared, each in constant time: the time tells nothing of which.
        let found = self.remembered.iter().fold(subtle::Choice::from(0), |found, d| found | d.ct_eq(digest));
        bool::from(found)
    }

    fn next(&mut self) -> Option<Job> {
        let source = self.turns.pop_front()?;
        let queued = self.jobs.get_mut(&source)?;
        let job = queued.pop_front();
        if queued.is_empty() {
            self.jobs.remove(&source);
        } else {
            self.turns.push_back(source);
        }
        job
    }

    fn done(&mut self, job: &Job, matched: bool) {
        if let Some(n) = self.pending.get_mut(&job.source) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.pending.remove(&job.source);
            }
        }
        if matched && !self.remembers(&job.digest) {
            if self.remembered.len() >= REMEMBERED {
                self.remembered.clear();
            }
            self.remembered.push(job.digest);
        }
        if let Some(result) = self.checking.remove(&job.digest) {
            result.send_replace(Some(matched));
        }
    }
}

struct Inner {
    key: hmac::Key,
    users: HashMap<String, String>,
    /// A hash compared with for an unknown user (one of the real ones: the same cost).
    decoy: String,
    queue: Mutex<Queue>,
    queued: Condvar,
}

impl Inner {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        // Nothing half-done in the queue can do harm: keep going after a panic elsewhere.
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A worker: takes the next comparison, makes it, says the result; forever.
    fn work(&self) {
        loop {
            let job = {
                let mut queue = self.queue();
                loop {
                    if let Some(job) = queue.next() {
                        break job;
                    }
                    queue = self.queued.wait(queue).unwrap_or_else(|poisoned| poisoned.into_inner());
                }
            };
            let matched = bcrypt::verify(&job.password, &job.hash).unwrap_or(false) && job.known;
            self.queue().done(&job, matched);
        }
    }
}

/// Basic authentication against bcrypt hashes (see the module documentation).
pub(crate) struct Auth {
    inner: Arc<Inner>,
}

impl Auth {
    /// Checks `users` (user → bcrypt hash) and starts the comparing threads.
    ///
    /// # Errors
    /// When a hash is not a bcrypt hash, no key can be drawn, or a thread cannot start.
    pub(crate) fn new(users: &BTreeMap<String, String>) -> Result<Self, Problem> {
        for (user, hash) in users {
            if hash.parse::<bcrypt::HashParts>().is_err() {
                refuse!("the password of user {user:?} is not a bcrypt hash");
            }
        }
        let decoy = users.values().next().cloned().unwrap_or_default();
        let key = hmac::Key::generate(hmac::HMAC_SHA256, &ring::rand::SystemRandom::new())
            .map_err(|_| Problem::new("cannot draw a key to remember credentials by"))?;
        let inner = Arc::new(Inner {
            key,
            users: users.clone().into_iter().collect(),
            decoy,
            queue: Mutex::new(Queue::default()),
            queued: Condvar::new(),
        });
        for n in 0..WORKERS {
            let inner = Arc::clone(&inner);
            std::thread::Builder::new()
                .name(format!("hvstats-bcrypt-{n}"))
                .spawn(move || inner.work())
                .because("cannot start a password-checking thread")?;
        }
        Ok(Self { inner })
    }

    /// The number of users.
    pub(crate) fn users(&self) -> usize {
        self.inner.users.len()
    }

    /// Whether `authorization` (an `Authorization` header) names a user and their password, for
    /// a request from `source`.
    pub(crate) async fn check(&self, authorization: Option<&str>, source: Option<IpAddr>) -> Verdict {
        let Some((user, password)) = authorization.and_then(credentials) else { return Verdict::Refused };
        let digest = self.digest(&user, &password);
        let source = source.map_or(IpAddr::from([0u8; 4]), budgeted);
        let mut result = {
            let mut queue = self.inner.queue();
            if queue.remembers(&digest) {
                return Verdict::Admitted;
            }
            match queue.checking.get(&digest) {
                Some(checking) => checking.subscribe(),
                None => {
                    let pending = queue.pending.entry(source).or_insert(0);
                    if *pending >= PER_ADDRESS {
                        return Verdict::Busy;
                    }
                    *pending += 1;
                    let known = self.inner.users.get(&user);
                    let job = Job {
                        digest,
                        password,
                        hash: known.unwrap_or(&self.inner.decoy).clone(),
                        known: known.is_some(),
                        source,
                    };
                    let queued = queue.jobs.entry(source).or_default();
                    queued.push_back(job);
                    if queued.len() == 1 {
                        queue.turns.push_back(source);
                    }
                    let (result, waiting) = watch::channel(None);
                    queue.checking.insert(digest, result);
                    self.inner.queued.notify_one();
                    waiting
                }
            }
        };
        match result.wait_for(Option::is_some).await.map(|r| *r) {
            Ok(Some(true)) => Verdict::Admitted,
            _ => Verdict::Refused,
        }
    }

    fn digest(&self, user: &str, password: &str) -> Digest {
        let mut context = hmac::Context::with_key(&self.inner.key);
        context.update(&(user.len() as u64).to_le_bytes());
        context.update(user.as_bytes());
        context.update(password.as_bytes());
        let mut digest = [0u8; 32];
        digest.copy_from_slice(context.sign().as_ref());
        digest
    }
}

/// The address a source is budgeted as: an IPv4 address itself, an IPv6 address by its /64 (one
/// host's usual share), an IPv4-mapped IPv6 address as IPv4.
pub(crate) fn budgeted(source: IpAddr) -> IpAddr {
    match source {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

/// The user and password of a `Basic` authorization.
fn credentials(header: &str) -> Option<(String, String)> {
    let (scheme, encoded) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_read_as_the_toolkit_writes_them() {
        assert_eq!(credentials("Basic YWxpY2U6cGE6c3M="), Some(("alice".into(), "pa:ss".into())));
        assert_eq!(credentials("Bearer x"), None);
    }

    #[test]
    fn sources_are_budgeted_by_ipv4_address_and_ipv6_64() {
        let v6 = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(budgeted(v6("2001:db8::1")), budgeted(v6("2001:db8::ffff:1")));
        assert_ne!(budgeted(v6("2001:db8::1")), budgeted(v6("2001:db8:0:1::1")));
        assert_eq!(budgeted(v6("::ffff:10.0.0.1")), v6("10.0.0.1"));
    }

    #[tokio::test]
    async fn a_match_is_remembered_and_a_busy_source_is_refused_at_once() {
        let users = BTreeMap::from([("u".to_owned(), bcrypt::hash("p", 4).unwrap())]);
        let auth = Auth::new(&users).unwrap();
        let basic =
            |p: &str| format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("u:{p}")));
        let here = Some(IpAddr::from([127, 0, 0, 1]));
        assert_eq!(auth.check(Some(&basic("wrong")), here).await, Verdict::Refused);
        assert_eq!(auth.check(Some(&basic("p")), here).await, Verdict::Admitted);
        assert!(auth.inner.queue().remembers(&auth.digest("u", "p")));
        assert!(!auth.inner.queue().remembers(&auth.digest("u", "wrong")));
        // A source with its budget used up is refused without a comparison.
        auth.inner.queue().pending.insert(IpAddr::from([10, 0, 0, 1]), PER_ADDRESS);
        assert_eq!(auth.check(Some(&basic("x")), Some(IpAddr::from([10, 0, 0, 1]))).await, Verdict::Busy);
        // Remembered credentials are admitted all the same.
        assert_eq!(auth.check(Some(&basic("p")), Some(IpAddr::from([10, 0, 0, 1]))).await, Verdict::Admitted);
    }

    #[tokio::test]
    async fn a_check_under_way_is_shared_and_kept_when_its_client_gives_up() {
        let users = BTreeMap::from([("u".to_owned(), bcrypt::hash("p", 6).unwrap())]);
        let auth = Auth::new(&users).unwrap();
        let basic = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("u:p"));
        // The first client gives up at once, its check queued (or, when a worker was quicker
        // than this thread, already admitted by it).
        let gave_up = tokio::time::timeout(
            std::time::Duration::ZERO,
            auth.check(Some(&basic), Some(IpAddr::from([10, 0, 0, 2]))),
        )
        .await;
        assert!(gave_up.is_err() || gave_up == Ok(Verdict::Admitted), "{gave_up:?}");
        // A client whose address may start no check of its own asks the same: it is admitted by
        // that check (still under way, or done and remembered), never refused as busy.
        let full = IpAddr::from([10, 0, 0, 1]);
        auth.inner.queue().pending.insert(full, PER_ADDRESS);
        assert_eq!(auth.check(Some(&basic), Some(full)).await, Verdict::Admitted);
        assert!(auth.inner.queue().remembers(&auth.digest("u", "p")));
    }
}
