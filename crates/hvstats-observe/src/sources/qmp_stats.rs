//! KVM's statistics of a QEMU VM through its QMP socket (`query-stats`), and the VM's run state
//! (`query-status`): every vCPU and VM statistic the catalog keys, mapped by [`kvm_stat_map`]:
//! KVM's own whole-life values, counted from the vCPU's creation. QMP also says which thread runs
//! each vCPU (`query-cpus-fast`) and the VM's name and UUID (`query-name`, `query-uuid`: what QEMU
//! itself holds, whatever its command line seems to say), which the observer asks this source
//! for.
//!
//! The session heals. Each refresh the questions go out for every VM at once
//! ([`VmSource::ask`]) and the answers are taken within one deadline from then; a QEMU that does
//! not answer in time (stopped, stalled) makes the source down (its counters unavailable, never
//! stale) and is looked at again each refresh without waiting, so its counters resume at the
//! first refresh after it answers. A session that fails (QEMU closed it, the peer is not QMP) is
//! tried again after a backoff that doubles from [`FIRST_BACKOFF`] to [`MAX_BACKOFF`]. The
//! socket is shared politely: no connection is made while another client holds it, and the
//! session is let go when another client waits for it (QEMU serves one client at a time).
//!
//! A socket the observer found (on the VMM's command line) is connected only if the VMM could
//! connect to it itself ([`crate::socket_access`]: decided before the connect, which goes through
//! the descriptor checked); one it could not reach is refused for good, said once. It is the
//! VMM's only if the VMM listens
//! on it: any process may name another QEMU's socket on its own command line. So the session's
//! listener (the kernel's record, [`Qmp::listener_pid`]) must be the VMM itself; a socket
//! another process serves is refused as soon as it is connected, before a word is exchanged,
//! said once ([`VmSource::refused`]), and never connected again for that VM. A socket the
//! operator gave (`--qmp`) is taken as given.
//!
//! What is asked is the least the counters need: the run state; the vCPU and VM statistics the
//! catalog maps (`query-stats` with their names), only while no source before this one in the
//! VM's list gives them (the VMM's own descriptors, libvirt); and the vCPU threads until they are
//! known. Before QEMU 8.1 every `query-stats` of the vCPUs interrupts each vCPU once (QEMU runs
//! the read on the vCPU's thread): one per vCPU per refresh, measured by `hvstats bench`.
//!
//! The session (`Session`) and each refresh's round (`Round`) are two small machines:
//!
//! ```text
//!   Closed ──retry time, socket free──► Greeting ──greeted──► Ready ──questions──► Ready (asked)
//!    ▲  │                                 │   ▲ silent: looked      │ ▲                │
//!    │  └─ VMM may not reach it, or ─► Refused (for good)   └───┘ for each refresh │ └─answers─┘
//!    │     another process serves it                                                │
//!    └───────── failed, another client holds or waits for it (backoff doubles) ◄────┘
//!
//!   Between { current } ──ask──► Asked { shadowed } ──collect──► Collected { current } ──read──► Between
//! ```
//!
//! `current` says that the reading of KVM's statistics was taken at this refresh (only such a
//! reading is given); `shadowed` that a source before this one gives every statistic this one
//! last gave, so they are not asked for.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hvstats::SharedPage;
use hvstats_abi::ObjectKind;
use hvstats_abi::catalog::partition;
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::vm_sources::Origin;
use hvstats_abi::vm_state::VmState;
use serde_json::Value;

use super::kvm_stat_map;
use super::vm_source::{Learned, Named, Peer, PeerKind, PeerState, VcpuThread, VmAttach, VmSource, VmView};
use crate::attach::ObserveError;
use hvstats_sources::counter_source::{CounterSource, Gives, Object};
use hvstats_vmm::cancel::Cancel;
use hvstats_vmm::qmp::{
    KvmStatsReply, Qmp, QmpCpu, QmpError, add_stats, parse_cpus, parse_status, stats_request,
};
use hvstats_vmm::unix_sockets::UnixSockets;

/// The deadline of one QMP exchange (the connect and greeting, or one refresh's questions and
/// their answers).
pub const QMP_TIMEOUT: Duration = Duration::from_secs(2);

/// The wait before a failed QMP session is tried again, doubled after each failure.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// The longest wait before a failed QMP session is tried again.
pub const MAX_BACKOFF: Duration = Duration::from_secs(32);

/// The session with QEMU.
#[derive(Debug)]
enum Session {
    /// No connection: the next one is tried at `retry_at`.
    Closed { retry_at: Instant },
    /// The socket is refused for good, for this reason (said once): the VMM could not reach it,
    /// or another process serves it.
    Refused(String),
    /// Connected, not greeted yet (QEMU is stopped, or busy): the greeting is waited for until
    /// `deadline`, then looked for at each refresh without waiting.
    Greeting { qmp: Qmp, deadline: Instant },
    /// In command mode.
    Ready(Live),
}

/// A session in command mode and the questions it has out.
#[derive(Debug)]
struct Live {
    qmp: Qmp,
    /// The questions out and not answered yet, in the order the answers come.
    asked: VecDeque<Question>,
    /// When they were put.
    asked_at: Instant,
    /// The reading their answers gather.
    fresh: KvmStatsReply,
}

impl Live {
    /// Greeted: no question out.
    fn new(qmp: Qmp) -> Self {
        Self { qmp, asked: VecDeque::new(), asked_at: Instant::now(), fresh: KvmStatsReply::default() }
    }

    /// Puts `wanted`, in the order their answers will be taken, at `now`, in one write (QEMU
    /// answers them in order).
    fn put(&mut self, wanted: Vec<Question>, now: Instant) -> Result<(), QmpError> {
        let requests: Vec<(&str, Option<Value>)> = wanted
            .iter()
            .map(|q| match q {
                Question::Status => ("query-status", None),
                Question::VcpuStats => ("query-stats", Some(stats_request("vcpu", vcpu_names()))),
                Question::VmStats => ("query-stats", Some(stats_request("vm", vm_names()))),
                Question::Cpus => ("query-cpus-fast", None),
            })
            .collect();
        self.qmp.send_all(&requests)?;
        self.asked = wanted.into();
        self.asked_at = now;
        self.fresh = KvmStatsReply::default();
        Ok(())
    }
}

/// Where one refresh of the session stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Round {
    /// This refresh's questions are not put yet; `current` while the last refresh's reading was
    /// taken at that refresh (it stands until the questions go out).
    Between { current: bool },
    /// This refresh's questions are put; `shadowed` when a source before this one gives every
    /// statistic this one last gave (they are not asked for).
    Asked { shadowed: bool },
    /// This refresh's answers were taken (or found missing); `current` once they made a
    /// complete reading.
    Collected { current: bool },
}

impl Round {
    /// `Between`, `Asked`, `Collected` → `Asked`: the questions of a refresh go out.
    fn ask(&mut self, shadowed: bool) {
        *self = Round::Asked { shadowed };
    }

    /// `Asked` → `Collected`: the answers are taken now; whether the statistics were shadowed.
    /// `None` when they were taken already (or nothing was asked).
    fn collect(&mut self) -> Option<bool> {
        let Round::Asked { shadowed } = *self else { return None };
        *self = Round::Collected { current: false };
        Some(shadowed)
    }

    /// `Collected` → `Collected { current }`: the answers made a complete reading.
    fn took_reading(&mut self) {
        if matches!(self, Round::Collected { .. }) {
            *self = Round::Collected { current: true };
        }
    }

    /// → `Between`: the refresh was read; the next one asks anew.
    fn end(&mut self) {
        *self = Round::Between { current: self.is_current() };
    }

    /// True while the questions of this refresh were put.
    fn is_open(self) -> bool {
        !matches!(self, Round::Between { .. })
    }

    /// True while the reading was taken at this refresh.
    fn is_current(self) -> bool {
        matches!(self, Round::Between { current: true } | Round::Collected { current: true })
    }
}

/// A question of one refresh, in the order the answers come.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Question {
    Status,
    VcpuStats,
    VmStats,
    Cpus,
}

/// A VM's QMP session and what it last said.
#[derive(Debug)]
pub struct QmpStats {
    path: PathBuf,
    /// The VMM that must listen on the socket, when the observer found it (not given).
    server: Option<i32>,
    cancel: Cancel,
    session: Session,
    /// Where this refresh stands (its questions put by the observer, or by the first reading).
    round: Round,
    backoff: Duration,
    /// Why the session is down now; `None` while it answers.
    down: Option<String>,
    name: Option<String>,
    uuid: Option<hvstats::vmm::VmUuid>,
    state: VmState,
    /// False once QEMU showed it has no KVM statistics (TCG, no `query-stats`).
    has_stats: bool,
    /// The last complete reading of the statistics (given while the round says it is current).
    now: Option<KvmStatsReply>,
    cpus: Option<Vec<QmpCpu>>,
    /// Each VP's QOM path, by VP index, as the observer knew it at the last reading.
    qom_paths: BTreeMap<u32, String>,
}

/// Connects to the VM's QMP socket when it has one, and asks its name and UUID; a session that cannot
/// be had now is a source that is down, says why, and is tried again.
///
/// # Errors
/// Never: a failed QMP session is the source's own state.
pub fn open(at: &VmAttach<'_>) -> Result<Option<Box<dyn VmSource>>, ObserveError> {
    let Some(path) = at.qmp else { return Ok(None) };
    let mut me = QmpStats::new(path, at.options.cancel.clone());
    me.server = at.options.qmp.is_none().then_some(at.pid);
    let now = Instant::now();
    me.connect(&UnixSockets::read_of([path]).unwrap_or_default(), now);
    if me.greet(now)
        && let Session::Ready(Live { qmp, .. }) = &mut me.session
    {
        // A command QEMU refuses leaves the session up; a session out of step does not.
        let name = qmp.query_name();
        let uuid = match &name {
            Err(e) if !e.is_command_error() => Ok(None),
            _ => qmp.query_uuid(),
        };
        let failed = [name.map(|n| me.name = n).err(), uuid.map(|u| me.uuid = u).err()];
        if let Some(e) = failed.into_iter().flatten().find(|e| !e.is_command_error()) {
            me.close(&e, now);
        }
    }
    Ok(Some(Box::new(me)))
}

impl QmpStats {
    fn new(path: &Path, cancel: Cancel) -> Self {
        Self {
            path: path.to_owned(),
            server: None,
            cancel,
            session: Session::Closed { retry_at: Instant::now() },
            round: Round::Between { current: false },
            backoff: FIRST_BACKOFF,
            down: Some("not connected yet".to_owned()),
            name: None,
            uuid: None,
            state: VmState::Unknown,
            has_stats: true,
            now: None,
            cpus: None,
            qom_paths: BTreeMap::new(),
        }
    }

    /// Begins a connection, unless another client holds the socket or it was refused; a socket
    /// the VMM must serve is refused, for good, when another process listens on it.
    fn connect(&mut self, sockets: &UnixSockets, now: Instant) {
        if matches!(self.session, Session::Refused(_)) {
            return;
        }
        if sockets.of(&self.path).accepted > 0 {
            self.close(&QmpError::Taken { path: self.path.clone() }, now);
            return;
        }
        let begun = match self.server {
            Some(vmm) => self.begin_as(vmm),
            None => Some(Qmp::begin(&self.path, QMP_TIMEOUT, self.cancel.clone())),
        };
        let Some(begun) = begun else { return };
        match begun {
            Ok(qmp) => match self.server {
                Some(vmm) if qmp.listener_pid() != Some(vmm) => {
                    let listener = match qmp.listener_pid() {
                        Some(pid) => format!("pid {pid}"),
                        None => "a process that has exited or is not visible here".to_owned(),
                    };
                    let why = format!(
                        "the QMP socket {} its command line names is served by {listener}, not by the VMM",
                        printable_path(&self.path)
                    );
                    self.refuse(why);
                }
                _ => self.session = Session::Greeting { qmp, deadline: now + QMP_TIMEOUT },
            },
            Err(e) => self.close(&e, now),
        }
    }

    /// Begins a connection to the socket the command line of `vmm` names, only when `vmm` could
    /// connect to it itself ([`crate::socket_access`]), through the descriptor checked; a socket
    /// it could not reach is refused for good (`None`), before any connect.
    fn begin_as(&mut self, vmm: i32) -> Option<Result<Qmp, QmpError>> {
        match crate::socket_access::open_as(vmm, &self.path) {
            Ok(socket) => {
                let via = crate::socket_access::connect_path(&socket);
                Some(Qmp::begin_via(&self.path, &via, QMP_TIMEOUT, self.cancel.clone()))
            }
            Err(crate::socket_access::AccessError::Denied(why)) => {
                self.refuse(QmpError::Unreachable { path: printable_path(&self.path), why }.to_string());
                None
            }
            Err(crate::socket_access::AccessError::Io(source)) => {
                Some(Err(QmpError::Connect { path: self.path.clone(), source }))
            }
        }
    }

    /// Any state → `Refused`: the socket is refused for good, for `why`.
    fn refuse(&mut self, why: String) {
        self.down = Some(why.clone());
        self.session = Session::Refused(why);
    }

    /// Notes why the session is down (the first reason of a spell is kept: it is what was said).
    fn failed(&mut self, e: &QmpError) {
        if self.down.is_none() || self.down.as_deref() == Some("not connected yet") {
            self.down = Some(hvstats_host::error_chain::error_chain(e));
        }
    }

    /// Drops the session after `e`; the next one is tried after the backoff, which doubles.
    fn close(&mut self, e: &QmpError, now: Instant) {
        self.failed(e);
        self.session = Session::Closed { retry_at: now + self.backoff };
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    /// The questions of a refresh, the statistics left out when `shadowed`.
    fn questions(&self, shadowed: bool) -> Vec<Question> {
        let mut q = vec![Question::Status];
        if self.has_stats && !shadowed {
            q.push(Question::VcpuStats);
            if !vm_names().is_empty() {
                q.push(Question::VmStats);
            }
        }
        if self.cpus.as_ref().is_none_or(Vec::is_empty) {
            q.push(Question::Cpus);
        }
        q
    }

    /// Asks when the observer did not (the reading at attach).
    fn ensure_asked(&mut self) {
        if !self.round.is_open() {
            self.ask(&UnixSockets::read_of([self.path.as_path()]).unwrap_or_default(), &Gives::NOTHING);
        }
    }

    /// Reads the greeting of a session that waits for it (until its deadline; a deadline passed
    /// looks once): true once the session is in command mode.
    fn greet(&mut self, now: Instant) -> bool {
        match std::mem::replace(&mut self.session, Session::Closed { retry_at: now }) {
            Session::Greeting { mut qmp, deadline } => match qmp.greet(deadline) {
                Ok(()) => {
                    self.session = Session::Ready(Live::new(qmp));
                    true
                }
                // Stopped or stalled: looked for again at each refresh, without waiting.
                Err(e) if e.is_silence() && !matches!(e, QmpError::Taken { .. }) => {
                    self.failed(&e);
                    self.session = Session::Greeting { qmp, deadline: now };
                    false
                }
                // Another client's (let it be, try again later), or not QMP, or gone.
                Err(e) => {
                    self.close(&e, now);
                    false
                }
            },
            other => {
                let ready = matches!(other, Session::Ready(_));
                self.session = other;
                ready
            }
        }
    }

    /// Takes this refresh's answers (once per refresh).
    fn collect(&mut self) {
        self.ensure_asked();
        let Some(shadowed) = self.round.collect() else { return };
        let now = Instant::now();
        let was_greeting = matches!(self.session, Session::Greeting { .. });
        if !self.greet(now) {
            return;
        }
        // Greeted just now: this refresh's questions were not put yet.
        let wanted = self.questions(shadowed);
        if was_greeting
            && let Session::Ready(live) = &mut self.session
            && let Err(e) = live.put(wanted, now)
        {
            return self.close(&e, now);
        }
        self.take_answers(now, shadowed);
    }

    /// Takes the answers of the questions out, within the deadline that began when they were
    /// put (a deadline passed looks once, without waiting).
    fn take_answers(&mut self, now: Instant, shadowed: bool) {
        let mut answers = Vec::new();
        let mut failure = None;
        let Session::Ready(live) = &mut self.session else { return };
        let deadline = live.asked_at + QMP_TIMEOUT;
        while let Some(&question) = live.asked.front() {
            match live.qmp.receive(deadline) {
                Ok(answer) => {
                    live.asked.pop_front();
                    answers.push((question, Some(answer)));
                }
                // Refused: a QEMU without query-stats (before 7.1), or without a KVM provider.
                Err(QmpError::Command { .. }) => {
                    live.asked.pop_front();
                    answers.push((question, None));
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        for (question, answer) in answers {
            match answer {
                Some(answer) => self.take(question, &answer),
                None if matches!(question, Question::VcpuStats | Question::VmStats) => self.has_stats = false,
                None => {}
            }
        }
        match failure {
            // Stopped or stalled: the answers are awaited at the next refreshes.
            Some(e) if e.is_silence() => return self.failed(&e),
            Some(e) => return self.close(&e, now),
            None => {}
        }
        // Every answer came: the session answers.
        self.down = None;
        self.backoff = FIRST_BACKOFF;
        let reading = match &mut self.session {
            Session::Ready(live) => std::mem::take(&mut live.fresh),
            _ => KvmStatsReply::default(),
        };
        if self.has_stats && !shadowed {
            if reading.vm.is_empty() && reading.vcpus.is_empty() {
                self.has_stats = false;
            } else {
                self.now = Some(reading);
                self.round.took_reading();
            }
        }
    }

    /// Keeps one answer.
    fn take(&mut self, question: Question, answer: &Value) {
        match question {
            Question::Status => {
                self.state = parse_status(answer).map_or(VmState::Unknown, VmState::from_qemu)
            }
            Question::VcpuStats | Question::VmStats => {
                let Session::Ready(live) = &mut self.session else { return };
                let target = if question == Question::VcpuStats { "vcpu" } else { "vm" };
                add_stats(&mut live.fresh, target, answer);
            }
            Question::Cpus => self.cpus = parse_cpus(answer).ok(),
        }
    }

    /// True while the session answers.
    fn is_up(&self) -> bool {
        self.down.is_none() && matches!(self.session, Session::Ready(_))
    }

    /// What this refresh's reading learned: whether the session answers, why not, the VM's
    /// run state, and the socket it holds.
    fn learned(&self) -> Learned {
        let state = match &self.down {
            None if self.is_up() => PeerState::Up,
            None => PeerState::Down("not connected".to_owned()),
            Some(why) => PeerState::Down(why.clone()),
        };
        let refused = match &self.session {
            Session::Refused(why) => Some(why.clone()),
            _ => None,
        };
        Learned {
            peer: Some(Peer { kind: PeerKind::Monitor, state }),
            error: self.down.clone(),
            refused,
            fds: usize::from(!matches!(self.session, Session::Closed { .. } | Session::Refused(_))),
            counting: None,
            vm_state: Some(if self.is_up() { self.state } else { VmState::Unknown }),
            platform: None,
        }
    }
}

/// Every statistic the catalog's counters of `kind` read, once each: what `query-stats` is asked
/// for (the halt histograms' buckets with their sums).
fn names_of(kind: ObjectKind) -> Vec<&'static str> {
    let mut names: Vec<&'static str> =
        kvm_stat_map::kvm_stat_counters(kind).flat_map(|(_, names)| names.iter().copied()).collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// The vCPU statistics the catalog maps.
fn vcpu_names() -> &'static [&'static str] {
    static NAMES: OnceLock<Vec<&'static str>> = OnceLock::new();
    NAMES.get_or_init(|| names_of(ObjectKind::Vp))
}

/// The VM statistics the catalog maps.
fn vm_names() -> &'static [&'static str] {
    static NAMES: OnceLock<Vec<&'static str>> = OnceLock::new();
    NAMES.get_or_init(|| names_of(ObjectKind::Partition))
}

/// The counters a reading of KVM's statistics through QMP gives: the VM's, and those every
/// vCPU's statistics give.
fn given_by(reading: &KvmStatsReply) -> Gives {
    Gives {
        partition: kvm_stat_map::given_by(ObjectKind::Partition, &reading.vm),
        vp: kvm_stat_map::given_by_all(ObjectKind::Vp, reading.vcpus.values()),
    }
}

impl CounterSource for QmpStats {
    fn name(&self) -> &'static str {
        "qmp"
    }

    fn gives(&self) -> Gives {
        // The session's own state is always given; KVM's statistics (whole-life values, mapped
        // as every source of them maps them) while it answers, from a reading of this refresh.
        let mut gives = Gives { partition: CounterSet::of(&[partition::VM_STATE]), vp: CounterSet::EMPTY };
        if let Some(now) = self.now.as_ref().filter(|_| self.is_up() && self.round.is_current()) {
            gives = gives.union(&given_by(now));
        }
        gives
    }

    fn write(&self, object: Object, page: &SharedPage, only: &CounterSet) {
        if object == Object::Partition && only.contains(partition::VM_STATE) {
            let state = if self.is_up() { self.state } else { VmState::Unknown };
            page.set(partition::VM_STATE, state.code());
        }
        let Some(now) = self.now.as_ref().filter(|_| self.round.is_current()) else { return };
        match object {
            Object::Partition => kvm_stat_map::write(ObjectKind::Partition, page, only, &now.vm),
            Object::Vp(index) => {
                let Some(values) = self.qom_paths.get(&index).and_then(|q| now.vcpus.get(q)) else { return };
                kvm_stat_map::write(ObjectKind::Vp, page, only, values);
            }
        }
    }

    fn unavailable(&self) -> Vec<String> {
        self.down.iter().cloned().collect()
    }
}

impl VmSource for QmpStats {
    fn asks(&self) -> bool {
        true
    }

    fn ask(&mut self, sockets: &UnixSockets, given_before: &Gives) {
        // KVM's statistics are asked for only while no source before this one gives all that
        // this one's last reading gave.
        let shadowed = self.now.as_ref().is_some_and(|now| {
            let mine = given_by(now);
            mine.partition.difference(&given_before.partition).is_empty()
                && mine.vp.difference(&given_before.vp).is_empty()
        });
        self.round.ask(shadowed);
        let now = Instant::now();
        let use_ = sockets.of(&self.path);
        let wanted = self.questions(shadowed);
        match &mut self.session {
            Session::Closed { retry_at } if now >= *retry_at => self.connect(sockets, now),
            Session::Closed { .. } | Session::Refused(_) => {}
            // Queued behind a client QEMU serves: let it be.
            Session::Greeting { .. } if use_.accepted > 0 && use_.waiting > 0 => {
                self.close(&QmpError::Taken { path: self.path.clone() }, now);
            }
            Session::Greeting { .. } => {}
            // Another client waits for the socket this session holds: let go.
            Session::Ready(_) if use_.waiting > 0 => {
                let e = QmpError::Protocol(
                    "another client waits for the QMP socket: let go, and tried again once nobody holds it"
                        .into(),
                );
                self.down = None;
                self.close(&e, now);
            }
            // Questions still out (QEMU stopped or stalled): their answers are awaited.
            Session::Ready(live) if !live.asked.is_empty() => {}
            Session::Ready(live) => {
                if let Err(e) = live.put(wanted, now) {
                    self.close(&e, now);
                }
            }
        }
    }

    fn socket_in_use(&self, now: Instant) -> Option<&Path> {
        let due = match &self.session {
            Session::Closed { retry_at } => now >= *retry_at,
            Session::Refused(_) => false,
            Session::Greeting { .. } | Session::Ready(_) => true,
        };
        due.then_some(self.path.as_path())
    }

    fn named(&mut self) -> Named {
        self.collect();
        let threads = self
            .cpus
            .iter()
            .flatten()
            .map(|c| (c.index, VcpuThread { tid: c.thread_id, qom_path: Some(c.qom_path.clone()) }))
            .collect();
        Named { threads, vm_name: self.name.clone(), vm_uuid: self.uuid }
    }

    fn read(&mut self, vm: &VmView<'_>) -> Learned {
        self.qom_paths =
            vm.vcpus.iter().enumerate().filter_map(|(i, v)| Some((i as u32, v.qom_path.clone()?))).collect();
        self.collect();
        // A vCPU whose thread the observer could not take (QEMU named one that is not its task,
        // or that exited) is asked about again.
        if !vm.all_known() {
            self.cpus = None;
        }
        // The next refresh asks anew.
        self.round.end();
        self.learned()
    }

    fn origin(&self) -> Origin {
        Origin::VcpuCreation
    }
}

/// A socket's path as one line of a log: its control characters escaped.
fn printable_path(path: &Path) -> String {
    path.to_string_lossy().escape_debug().to_string()
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixListener;
    use std::sync::mpsc;

    use hvstats_abi::catalog::vp;

    use super::*;

    /// A QMP peer on `path` answering as a running QEMU with KVM would; each request's command
    /// (with its target for `query-stats`) is sent on the channel.
    fn peer(path: &Path) -> mpsc::Receiver<String> {
        let listener = UnixListener::bind(path).unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut out = stream.try_clone().unwrap();
            writeln!(out, r#"{{"QMP": {{"version": {{}}, "capabilities": []}}}}"#).unwrap();
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let req: Value = serde_json::from_str(&line).unwrap();
                let command = req["execute"].as_str().unwrap_or_default().to_owned();
                let target = req["arguments"]["target"].as_str().unwrap_or_default().to_owned();
                let answer = match (command.as_str(), target.as_str()) {
                    ("query-status", _) => serde_json::json!({"status": "running", "running": true}),
                    ("query-stats", "vcpu") => serde_json::json!([{"provider": "kvm", "qom-path": "/cpu0",
                        "stats": [{"name": "halt_exits", "value": 5}]}]),
                    ("query-stats", _) => serde_json::json!([{"provider": "kvm",
                        "stats": [{"name": "remote_tlb_flush", "value": 1}]}]),
                    ("query-cpus-fast", _) => {
                        serde_json::json!([{"cpu-index": 0, "thread-id": 1, "qom-path": "/cpu0"}])
                    }
                    _ => serde_json::json!({}),
                };
                let _ = tx.send(format!("{command} {target}").trim().to_owned());
                writeln!(out, "{}", serde_json::json!({"return": answer, "id": req["id"]})).unwrap();
            }
        });
        rx
    }

    #[test]
    fn kvm_statistics_are_asked_only_while_no_source_before_gives_them() {
        let dir = std::env::temp_dir().join(format!("hvstats-qmp-shadow-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("qmp.sock");
        let asked = peer(&path);
        let mut qmp = QmpStats::new(&path, Cancel::new());
        qmp.connect(&UnixSockets::default(), Instant::now());
        let round = |qmp: &mut QmpStats, before: &Gives| {
            qmp.ask(&UnixSockets::default(), before);
            qmp.collect();
            qmp.round.end();
            let mut said: Vec<String> = asked.try_iter().collect();
            said.retain(|c| c != "qmp_capabilities");
            said
        };
        // Nothing before it: the run state, both statistics, and the vCPUs.
        let said = round(&mut qmp, &Gives::NOTHING);
        assert_eq!(said, ["query-status", "query-stats vcpu", "query-stats vm", "query-cpus-fast"]);
        let gives = qmp.gives();
        assert!(gives.vp.contains(vp::HLT_INSTRUCTIONS) && gives.partition.contains(partition::VM_STATE));
        // A source before it gives all it gave: the statistics are not asked, nor given.
        let said = round(&mut qmp, &gives);
        assert_eq!(said, ["query-status"]);
        assert!(!qmp.gives().vp.contains(vp::HLT_INSTRUCTIONS));
        assert!(qmp.gives().partition.contains(partition::VM_STATE));
        let peer = qmp.learned().peer.map(|p| (p.kind, p.state));
        assert_eq!(peer, Some((PeerKind::Monitor, PeerState::Up)));
        // That source stops giving them: asked again at once.
        let said = round(&mut qmp, &Gives::NOTHING);
        assert_eq!(said, ["query-status", "query-stats vcpu", "query-stats vm"]);
        assert!(qmp.gives().vp.contains(vp::HLT_INSTRUCTIONS));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
