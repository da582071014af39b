//! KVM's statistics of a QEMU VM through its QMP socket (`query-stats`), and the VM's run state
//! (`query-status`): every vCPU and VM statistic the catalog keys, counted from the first reading
//! (the value then is taken off). QMP also says which thread runs each vCPU (`query-cpus-fast`)
//! and the VM's name (`query-name`), which the observer asks this source for.
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
//! What is asked is the least the counters need: the vCPU and VM statistics the catalog maps
//! (`query-stats` with their names), the run state, and the vCPU threads until they are known.
//! Before QEMU 8.1 every `query-stats` of the vCPUs interrupts each vCPU once (QEMU runs the read
//! on the vCPU's thread): one per vCPU per refresh, measured by `hvstats bench`.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hvstats::SharedPage;
use hvstats_abi::catalog::{self, Maintained, partition};
use hvstats_abi::counter_set::CounterSet;
use hvstats_abi::source::{KvmStat, Source};
use hvstats_abi::vm_state::VmState;
use hvstats_abi::{Counter, ObjectKind};
use serde_json::Value;

use super::vm_source::{PeerState, VcpuThread, VmAttach, VmSource, VmView};
use crate::observe::attach::ObserveError;
use crate::observe::qmp::{
    Cancel, KvmStatsReply, Qmp, QmpCpu, QmpError, StatValues, add_stats, parse_cpus, parse_status,
    stats_request,
};
use crate::observe::unix_sockets::UnixSockets;
use crate::sources::counter_source::{CounterSource, Gives, Object};

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
    /// Connected, not greeted yet (QEMU is stopped, or busy): the greeting is waited for until
    /// `deadline`, then looked for at each refresh without waiting.
    Greeting { qmp: Qmp, deadline: Instant },
    /// In command mode.
    Ready(Qmp),
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
    cancel: Cancel,
    session: Session,
    backoff: Duration,
    /// The questions out and not answered yet, and when they were put.
    asked: VecDeque<Question>,
    asked_at: Instant,
    /// True once this refresh's questions were put (by the observer, or by the first reading).
    round: bool,
    /// True once this refresh's answers were taken (or found missing).
    collected: bool,
    /// Why the session is down now; `None` while it answers.
    down: Option<String>,
    name: Option<String>,
    state: VmState,
    /// False once QEMU showed it has no KVM statistics (TCG, no `query-stats`).
    has_stats: bool,
    /// The statistics of the first reading, taken off every later one.
    baseline: Option<KvmStatsReply>,
    /// The last complete reading, and the one being gathered.
    now: Option<KvmStatsReply>,
    fresh: KvmStatsReply,
    cpus: Option<Vec<QmpCpu>>,
    /// Each VP's QOM path, by VP index, as the observer knew it at the last reading.
    qom_paths: BTreeMap<u32, String>,
}

/// Connects to the VM's QMP socket when it has one, and asks its name; a session that cannot
/// be had now is a source that is down, says why, and is tried again.
///
/// # Errors
/// Never: a failed QMP session is the source's own state.
pub fn open(at: &VmAttach<'_>) -> Result<Option<Box<dyn VmSource>>, ObserveError> {
    let Some(path) = at.qmp else { return Ok(None) };
    let mut me = QmpStats::new(path, at.options.cancel.clone());
    let now = Instant::now();
    me.connect(&UnixSockets::read_of([path]).unwrap_or_default(), now);
    if me.greet(now)
        && let Session::Ready(qmp) = &mut me.session
    {
        match qmp.query_name() {
            Ok(name) => me.name = name,
            Err(e) if e.is_command_error() => {}
            Err(e) => me.close(&e, now),
        }
    }
    Ok(Some(Box::new(me)))
}

impl QmpStats {
    fn new(path: &Path, cancel: Cancel) -> Self {
        Self {
            path: path.to_owned(),
            cancel,
            session: Session::Closed { retry_at: Instant::now() },
            backoff: FIRST_BACKOFF,
            asked: VecDeque::new(),
            asked_at: Instant::now(),
            round: false,
            collected: false,
            down: Some("not connected yet".to_owned()),
            name: None,
            state: VmState::Unknown,
            has_stats: true,
            baseline: None,
            now: None,
            fresh: KvmStatsReply::default(),
            cpus: None,
            qom_paths: BTreeMap::new(),
        }
    }

    /// Begins a connection, unless another client holds the socket.
    fn connect(&mut self, sockets: &UnixSockets, now: Instant) {
        if sockets.of(&self.path).accepted > 0 {
            self.close(&QmpError::Taken { path: self.path.clone() }, now);
            return;
        }
        match Qmp::begin(&self.path, QMP_TIMEOUT, self.cancel.clone()) {
            Ok(qmp) => self.session = Session::Greeting { qmp, deadline: now + QMP_TIMEOUT },
            Err(e) => self.close(&e, now),
        }
    }

    /// Notes why the session is down (the first reason of a spell is kept: it is what was said).
    fn failed(&mut self, e: &QmpError) {
        if self.down.is_none() || self.down.as_deref() == Some("not connected yet") {
            self.down = Some(hvstats::snapshot::error_chain(e));
        }
    }

    /// Drops the session after `e`; the next one is tried after the backoff, which doubles.
    fn close(&mut self, e: &QmpError, now: Instant) {
        self.failed(e);
        self.session = Session::Closed { retry_at: now + self.backoff };
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        self.asked.clear();
    }

    /// Puts this refresh's questions, in the order their answers will be taken.
    fn put_questions(qmp: &mut Qmp, wanted: &[Question]) -> Result<(), QmpError> {
        let requests: Vec<(&str, Option<Value>)> = wanted
            .iter()
            .map(|q| match q {
                Question::Status => ("query-status", None),
                Question::VcpuStats => ("query-stats", Some(stats_request("vcpu", vcpu_names()))),
                Question::VmStats => ("query-stats", Some(stats_request("vm", vm_names()))),
                Question::Cpus => ("query-cpus-fast", None),
            })
            .collect();
        // One write for all: QEMU answers them in order.
        qmp.send_all(&requests)
    }

    /// The questions of a refresh.
    fn questions(&self) -> Vec<Question> {
        let mut q = vec![Question::Status];
        if self.has_stats {
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
        if !self.round {
            self.ask(&UnixSockets::read_of([self.path.as_path()]).unwrap_or_default());
        }
    }

    /// Reads the greeting of a session that waits for it (until its deadline; a deadline passed
    /// looks once): true once the session is in command mode.
    fn greet(&mut self, now: Instant) -> bool {
        match std::mem::replace(&mut self.session, Session::Closed { retry_at: now }) {
            Session::Greeting { mut qmp, deadline } => match qmp.greet(deadline) {
                Ok(()) => {
                    self.session = Session::Ready(qmp);
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
        if self.collected {
            return;
        }
        self.collected = true;
        let now = Instant::now();
        let was_greeting = matches!(self.session, Session::Greeting { .. });
        if !self.greet(now) {
            return;
        }
        // Greeted just now: this refresh's questions were not put yet.
        let wanted = self.questions();
        if was_greeting && let Session::Ready(qmp) = &mut self.session {
            let put = Self::put_questions(qmp, &wanted);
            match put {
                Ok(()) => {
                    self.asked = wanted.into();
                    self.asked_at = now;
                    self.fresh = KvmStatsReply::default();
                }
                Err(e) => return self.close(&e, now),
            }
        }
        self.take_answers(now);
    }

    /// Takes the answers of the questions out, within the deadline that began when they were
    /// put (a deadline passed looks once, without waiting).
    fn take_answers(&mut self, now: Instant) {
        let deadline = self.asked_at + QMP_TIMEOUT;
        let mut answers = Vec::new();
        let mut failure = None;
        let Session::Ready(qmp) = &mut self.session else { return };
        while let Some(&question) = self.asked.front() {
            match qmp.receive(deadline) {
                Ok(answer) => {
                    self.asked.pop_front();
                    answers.push((question, Some(answer)));
                }
                // Refused: a QEMU without query-stats (before 7.1), or without a KVM provider.
                Err(QmpError::Command { .. }) => {
                    self.asked.pop_front();
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
        let reading = std::mem::take(&mut self.fresh);
        if self.has_stats {
            if reading.vm.is_empty() && reading.vcpus.is_empty() {
                self.has_stats = false;
            } else {
                self.baseline.get_or_insert_with(|| reading.clone());
                self.now = Some(reading);
            }
        }
    }

    /// Keeps one answer.
    fn take(&mut self, question: Question, answer: &Value) {
        match question {
            Question::Status => {
                self.state = parse_status(answer).map_or(VmState::Unknown, VmState::from_qemu)
            }
            Question::VcpuStats => add_stats(&mut self.fresh, "vcpu", answer),
            Question::VmStats => add_stats(&mut self.fresh, "vm", answer),
            Question::Cpus => self.cpus = parse_cpus(answer).ok(),
        }
    }

    /// True while the session answers.
    fn is_up(&self) -> bool {
        self.down.is_none() && matches!(self.session, Session::Ready(_))
    }

    /// The statistics of `object` now and at the first reading.
    fn values(&self, object: Object) -> Option<(&StatValues, &StatValues)> {
        let (now, then) = (self.now.as_ref()?, self.baseline.as_ref()?);
        match object {
            Object::Partition => Some((&now.vm, &then.vm)),
            Object::Vp(index) => {
                let q = self.qom_paths.get(&index)?;
                Some((now.vcpus.get(q)?, then.vcpus.get(q)?))
            }
        }
    }
}

/// The statistics the observed key of `counter` sums, for `kind`'s object.
fn stat_names(counter: &Counter, kind: ObjectKind) -> Option<&'static [&'static str]> {
    match (kind, catalog::observed(counter).and_then(Maintained::source)?) {
        (ObjectKind::Vp, Source::KvmStats(KvmStat::Vcpu(names))) => Some(names),
        (ObjectKind::Partition, Source::KvmStats(KvmStat::Vm(names))) => Some(names),
        _ => None,
    }
}

/// Every statistic the catalog's rows of `kind` sum, once each: what `query-stats` is asked for.
fn names_of(kind: ObjectKind) -> Vec<&'static str> {
    let mut names: Vec<&'static str> =
        catalog::counters_of(kind).filter_map(|c| stat_names(c, kind)).flatten().copied().collect();
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

/// A KVM statistic's count since the first reading: the sum over `names` of each one's growth,
/// `None` when QEMU reports none of them now.
fn since_first(names: &[&str], now: &StatValues, then: &StatValues) -> Option<u64> {
    let grown =
        names.iter().filter_map(|n| Some(now.get(*n)?.saturating_sub(then.get(*n).copied().unwrap_or(0))));
    grown.reduce(u64::saturating_add)
}

impl CounterSource for QmpStats {
    fn name(&self) -> &'static str {
        "qmp"
    }

    fn gives(&self) -> Gives {
        // The session's own state is always given; statistics while it answers, those QEMU
        // reported at the first reading (a statistic without a baseline is not given).
        let mut gives = Gives {
            partition: CounterSet::of(&[partition::VM_STATE, partition::VM_QMP_UP]),
            vp: CounterSet::EMPTY,
        };
        let Some(at) = self.baseline.as_ref().filter(|_| self.is_up()) else { return gives };
        let has = |kind: ObjectKind, names: &[&str]| match kind {
            ObjectKind::Partition => names.iter().any(|n| at.vm.contains_key(*n)),
            _ => names.iter().any(|n| at.vcpus.values().any(|v| v.contains_key(*n))),
        };
        let of =
            |kind| CounterSet::of_kind(kind, |c| stat_names(c, kind).is_some_and(|names| has(kind, names)));
        gives.partition = gives.partition.union(&of(ObjectKind::Partition));
        gives.vp = of(ObjectKind::Vp);
        gives
    }

    fn write(&self, object: Object, page: &SharedPage, only: &CounterSet) {
        if object == Object::Partition {
            let up = self.is_up();
            if only.contains(partition::VM_STATE) {
                page.set(partition::VM_STATE, if up { self.state } else { VmState::Unknown }.code());
            }
            if only.contains(partition::VM_QMP_UP) {
                page.set(partition::VM_QMP_UP, u64::from(up));
            }
        }
        let Some((now, then)) = self.values(object) else { return };
        let kind = match object {
            Object::Partition => ObjectKind::Partition,
            Object::Vp(_) => ObjectKind::Vp,
        };
        for counter in catalog::counters_of(kind).filter(|c| only.contains(c.id)) {
            if let Some(v) = stat_names(counter, kind).and_then(|names| since_first(names, now, then)) {
                page.set(counter.id, v);
            }
        }
    }

    fn unavailable(&self) -> Vec<String> {
        self.down.iter().cloned().collect()
    }
}

impl VmSource for QmpStats {
    fn ask(&mut self, sockets: &UnixSockets) {
        self.round = true;
        self.collected = false;
        let now = Instant::now();
        let use_ = sockets.of(&self.path);
        let wanted = self.questions();
        match &mut self.session {
            Session::Closed { retry_at } if now >= *retry_at => self.connect(sockets, now),
            Session::Closed { .. } => {}
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
            Session::Ready(qmp) => {
                // Questions still out (QEMU stopped or stalled): their answers are awaited.
                if self.asked.is_empty() {
                    match Self::put_questions(qmp, &wanted) {
                        Ok(()) => {
                            self.asked = wanted.into();
                            self.asked_at = now;
                            self.fresh = KvmStatsReply::default();
                        }
                        Err(e) => self.close(&e, now),
                    }
                }
            }
        }
    }

    fn read(&mut self, vm: &VmView<'_>) {
        self.qom_paths =
            vm.vcpus.iter().enumerate().filter_map(|(i, v)| Some((i as u32, v.qom_path.clone()?))).collect();
        self.collect();
        // The next refresh asks anew.
        self.round = false;
    }

    fn peer(&self) -> Option<PeerState> {
        Some(match &self.down {
            None if self.is_up() => PeerState::Up,
            None => PeerState::Down("not connected".to_owned()),
            Some(why) => PeerState::Down(why.clone()),
        })
    }

    fn vcpu_threads(&mut self) -> BTreeMap<u32, VcpuThread> {
        self.collect();
        self.cpus
            .iter()
            .flatten()
            .map(|c| (c.index, VcpuThread { tid: c.thread_id, qom_path: Some(c.qom_path.clone()) }))
            .collect()
    }

    fn vm_name(&mut self) -> Option<String> {
        self.name.clone()
    }

    fn error(&self) -> Option<&str> {
        self.down.as_deref()
    }

    fn fds(&self) -> usize {
        usize::from(!matches!(self.session, Session::Closed { .. }))
    }
}
