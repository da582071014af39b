//! The log lines of the observers (`observe`, `serve --observe-all`): one line per event,
//! whatever a VM's name holds, and how often a line of one kind about one VM may be said
//! ([`LogLimiter`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hvstats_mshv::observer::MshvEvent;
use hvstats_observe::ObserverEvent;
use hvstats_observe::vm::Departure;
use hvstats_present::text::{Escaped, LoggedName};

/// The log line of an event of the mshv observer.
pub(crate) fn describe_mshv(event: &MshvEvent) -> String {
    let vps = |v: &[u32]| match v.len() {
        0..=FEW_IDS => format!("VPs {}", id_list("VPs", v)),
        _ => id_list("VPs", v),
    };
    match event {
        MshvEvent::Format(dialect) => format!("mshv: the tree is printed in {}", dialect.label()),
        MshvEvent::Appeared { key, vps: v } => format!("mshv partition {key}: {}", vps(v)),
        MshvEvent::VpsChanged { key, vps: v } => format!("mshv partition {key}: now {}", vps(v)),
        MshvEvent::Vanished { key } => format!("mshv partition {key}: gone"),
        MshvEvent::Unmapped { kind, name } => {
            format!("mshv: {} counter {name} has no catalog counter: published by name", kind.short_name())
        }
        MshvEvent::Problem(p) => format!("mshv: skipped {p}"),
        MshvEvent::Unreadable(e) | MshvEvent::Failed(e) => format!("mshv: {e}"),
    }
}

/// The log line of `event`, one line whatever it carries: a VM's name (which its VMM's command
/// line or QMP peer chose) is quoted with its control characters escaped, so it cannot forge or
/// break lines; a list of threads is said as its number and ranges beyond a few ([`id_list`]).
pub(crate) fn describe(event: &ObserverEvent) -> String {
    use ObserverEvent as E;
    match event {
        E::Attached { .. } => attached(event),
        E::Detached { .. } | E::Excluded { .. } | E::VcpusKnown { .. } | E::SharesVm { .. } => vm_line(event),
        E::NamedLike { .. } | E::DuplicateUuid { .. } => identity_line(event),
        E::SourceDown { .. } | E::SourceUp { .. } | E::SourceRefused { .. } | E::ThreadRefused { .. } => {
            source_line(event)
        }
        E::Deferred { .. } | E::Refused { .. } | E::Failed { .. } => refusal_line(event),
        E::KvmExit { .. } | E::CapabilityMissing(_) | E::Kept(_) | E::PastEngineRows(_) => host_line(event),
    }
}

/// A VM attached: its vCPUs, partition, counters, the threads left out and its QMP.
fn attached(event: &ObserverEvent) -> String {
    let ObserverEvent::Attached { pid, name, vmm, vcpus, partition, fds, threads, left_out, qmp, qmp_error } =
        event
    else {
        return format!("{event:?}");
    };
    let mut s = format!(
        "attach pid {pid} ({}) \"{}\": {vcpus} vCPUs as partition {partition}, {fds} descriptors open for its counters",
        Escaped(vmm),
        LoggedName(name)
    );
    if *left_out > 0 {
        s.push_str(&format!(
            " on {threads} of {} threads ({left_out} left out: descriptor budget; a vCPU thread \
             among them is counted once known)",
            threads + left_out
        ));
    }
    if let Some(path) = qmp {
        s.push_str(&format!("; QMP {}", Escaped(&path.display().to_string())));
    }
    if let Some(e) = qmp_error {
        s.push_str(&format!(
            ": KVM statistics and run state through QMP unavailable for now ({}); retried",
            Escaped(&e.to_string())
        ));
    }
    s
}

/// A VM's life after attach: left out, its vCPU threads known, gone, or another's.
fn vm_line(event: &ObserverEvent) -> String {
    match event {
        ObserverEvent::Excluded { pid, name } => {
            format!("pid {pid} \"{}\": not observed: --vm/--exclude-vm leave it out", LoggedName(name))
        }
        ObserverEvent::VcpusKnown { pid, threads, fds } => format!(
            "pid {pid}: vCPU threads {}; {fds} descriptors open for its counters (counting on those threads only)",
            id_list("threads", threads)
        ),
        // A VM's name is what its VMM's command line or QMP says: escaped, it cannot forge a line.
        ObserverEvent::Detached { pid, name, why } => {
            format!("detach pid {pid} \"{}\": {}", LoggedName(name), departure(*why))
        }
        ObserverEvent::SharesVm { pid, with } => format!(
            "pid {pid}: holds the KVM VM of pid {with} (the same VM object, by an inherited or passed \
             descriptor): not a second VM, not published"
        ),
        other => format!("{other:?}"),
    }
}

fn departure(why: Departure) -> &'static str {
    match why {
        Departure::Exited => "the process exited",
        Departure::Exec => "the process exec'd a program: a VM it makes now is attached anew",
        Departure::PidReused => "the pid names another process now: its VM, if any, is attached anew",
        Departure::VmChanged => {
            "the KVM VM object it was attached with is no longer its only VM (closed, made anew, \
             or another beside it): a VM it runs now is a new VM, attached anew with a new origin"
        }
    }
}

/// A VM named, or identified, as another.
fn identity_line(event: &ObserverEvent) -> String {
    match event {
        ObserverEvent::NamedLike { pid, name, other, other_name } if name == other_name => format!(
            "pid {pid} \"{}\": the name of pid {other}'s VM, which keeps it; this one is told apart by a #N suffix on /metrics",
            LoggedName(name)
        ),
        ObserverEvent::NamedLike { pid, name, other, other_name } => format!(
            "pid {pid} \"{}\": looks like the name of pid {other}'s VM \"{}\" (invisible or confusable characters)",
            LoggedName(name),
            LoggedName(other_name)
        ),
        ObserverEvent::DuplicateUuid { pid, uuid, other } => {
            format!("pid {pid}: UUID {uuid} is also pid {other}'s VM's: two VMs claim one identity")
        }
        other => format!("{other:?}"),
    }
}

/// A source of a VM lost, back, or refusing what the VMM offered.
fn source_line(event: &ObserverEvent) -> String {
    match event {
        ObserverEvent::SourceDown { pid, name, source, why } => format!(
            "pid {pid} \"{}\": {source} lost: {}; its counters are unavailable until it answers again",
            LoggedName(name),
            Escaped(why)
        ),
        ObserverEvent::SourceUp { pid, name, source, after } => {
            format!("pid {pid} \"{}\": {source} back after {:.1} s", LoggedName(name), after.as_secs_f64())
        }
        ObserverEvent::SourceRefused { pid, name, source, why } => format!(
            "pid {pid} \"{}\": {source} refused: {}; its counters come from the VM's other sources",
            Escaped(name),
            Escaped(why)
        ),
        ObserverEvent::ThreadRefused { pid, name, refusal } => format!(
            "pid {pid} \"{}\": thread {} named by {} for VP {} is not used: {}",
            LoggedName(name),
            refusal.tid,
            refusal.by,
            refusal.vp,
            Escaped(&refusal.why)
        ),
        other => format!("{other:?}"),
    }
}

/// A VM not observed, with its reason (the table's label, sentence and fix).
fn refusal_line(event: &ObserverEvent) -> String {
    match event {
        ObserverEvent::Deferred { pid, reason, why } => format!(
            "pid {pid} not observed for now (retried; counted as refused, reason {}): {}",
            reason.label(),
            Escaped(why)
        ),
        ObserverEvent::Refused { pid, name, reason, why } => format!(
            "refused pid {pid} \"{}\" (reason {}): {}: {}; fix: {}",
            LoggedName(name),
            reason.label(),
            reason.sentence(),
            Escaped(why),
            reason.fix()
        ),
        ObserverEvent::Failed { pid, reason, error } => format!(
            "cannot observe pid {pid}: {} (counted as refused, reason {}; fix: {})",
            Escaped(error),
            reason.label(),
            reason.fix()
        ),
        other => format!("{other:?}"),
    }
}

/// A fact of the host (said once per observer, see [`LogLimiter`]): no VM is named.
fn host_line(event: &ObserverEvent) -> String {
    use hvstats_observe::KvmExitState;
    match event {
        ObserverEvent::KvmExit { state, .. } => format!(
            "kvm:kvm_exit {}",
            match state {
                KvmExitState::Fires => "fires: intercepts are counted by exit reason",
                KvmExitState::Silent => {
                    "does not fire on this host (no VMX/SVM exits): HLT, MWAIT, DR, other intercepts come only from QMP or are unavailable"
                }
                KvmExitState::NoHardwareVirtualization => "is not counted: KVM here is not VMX/SVM",
                KvmExitState::Undecided => "undecided",
            }
        ),
        ObserverEvent::CapabilityMissing(needed) => needed.line(),
        ObserverEvent::Kept(note) => format!("in-kernel counts: {}", Escaped(note)),
        ObserverEvent::PastEngineRows(note) => format!("in-kernel counting: {}", Escaped(note)),
        other => format!("{other:?}"),
    }
}

/// Ids for a log line (threads, VPs), one line however many: every id while there are at most
/// [`FEW_IDS`], else their number and ranges (`400 threads: 1000-1399`), the first [`FEW_IDS`]
/// ranges and how many more.
pub(crate) fn id_list<T: Copy + Ord + Into<i64>>(what: &str, ids: &[T]) -> String {
    let mut sorted: Vec<i64> = ids.iter().map(|&id| id.into()).collect();
    sorted.sort_unstable();
    if sorted.len() <= FEW_IDS {
        return format!("{sorted:?}");
    }
    let mut ranges: Vec<(i64, i64)> = Vec::new();
    for id in sorted.iter().copied() {
        match ranges.last_mut() {
            Some((_, end)) if id == *end + 1 => *end = id,
            _ => ranges.push((id, id)),
        }
    }
    let shown: Vec<String> = ranges
        .iter()
        .take(FEW_IDS)
        .map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") })
        .collect();
    let more = match ranges.len().saturating_sub(FEW_IDS) {
        0 => String::new(),
        n => format!(" and {n} more ranges"),
    };
    format!("{} {what}: {}{more}", sorted.len(), shown.join(", "))
}

/// Ids a log line lists one by one; beyond, it says their number and ranges.
const FEW_IDS: usize = 8;

/// How long a line of one kind about one VM is not said again: what is held back meanwhile is
/// counted and said with the next one.
pub(crate) const LOG_WINDOW: Duration = Duration::from_secs(60);

/// Keeps the log of a fleet readable: a line of one kind about one VM (a deferral, a failure, a
/// source lost or back) is said at most once per [`LOG_WINDOW`]; a fact of the host (whether
/// `kvm:kvm_exit` fires), once per observer. Attaching and detaching are said every time: each
/// happens once per process (the log's budget, [`crate::log_budget`], bounds them all).
#[derive(Debug, Default)]
pub(crate) struct LogLimiter {
    /// By (pid, kind): when its line was last said, and how many were held back since.
    said: HashMap<(i32, &'static str), (Instant, u32)>,
    /// The facts of the host said already.
    host_facts: std::collections::HashSet<String>,
}

impl LogLimiter {
    /// The line of `event`, unless one of its kind about its VM was said within the window;
    /// it ends with how many were held back before it.
    pub(crate) fn line(&mut self, event: &ObserverEvent, now: Instant) -> Option<String> {
        let key = match event {
            ObserverEvent::Deferred { pid, .. } => Some((*pid, "deferred")),
            ObserverEvent::Failed { pid, .. } => Some((*pid, "failed")),
            ObserverEvent::SourceDown { pid, .. } => Some((*pid, "source down")),
            ObserverEvent::SourceUp { pid, .. } => Some((*pid, "source up")),
            ObserverEvent::Excluded { pid, .. } => Some((*pid, "excluded")),
            ObserverEvent::KvmExit { .. } => {
                let line = describe(event);
                return self.host_facts.insert(line.clone()).then_some(line);
            }
            _ => None,
        };
        let Some(key) = key else { return Some(describe(event)) };
        self.said.retain(|_, (at, held)| now.duration_since(*at) < LOG_WINDOW || *held > 0);
        match self.said.get_mut(&key) {
            Some((at, held)) if now.duration_since(*at) < LOG_WINDOW => {
                *held += 1;
                None
            }
            Some((at, held)) => {
                let line = format!("{} ({} more like it held back)", describe(event), *held);
                *at = now;
                *held = 0;
                Some(line)
            }
            None => {
                self.said.insert(key, (now, 0));
                Some(describe(event))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vm_name_cannot_forge_a_log_line() {
        let event = ObserverEvent::Detached {
            pid: 7,
            name: "dup\nhvstats observe: attach pid 1\u{1b}[2J".into(),
            why: Departure::Exited,
        };
        let line = describe(&event);
        assert_eq!(line, r#"detach pid 7 "dup\nhvstats observe: attach pid 1\u{1b}[2J": the process exited"#);
        assert!(!line.contains('\n') && !line.contains('\u{1b}'));
    }

    #[test]
    fn a_vm_name_of_any_length_makes_a_line_of_bounded_length() {
        let name = "n".repeat(10_075);
        for event in [
            ObserverEvent::Excluded { pid: 7, name: name.clone() },
            ObserverEvent::Detached { pid: 7, name: name.clone(), why: Departure::Exited },
            ObserverEvent::Refused {
                pid: 7,
                name: name.clone(),
                reason: hvstats_observe::refusal::Refusal::Unreadable,
                why: "denied".into(),
            },
        ] {
            let line = describe(&event);
            assert!(line.len() < 400, "{line}");
            assert!(line.contains(&format!("\"{}…(10075 bytes)\"", "n".repeat(64))), "{line}");
        }
    }

    #[test]
    fn a_deferral_repeated_every_two_seconds_is_said_once_a_minute_with_the_count() {
        let mut limiter = LogLimiter::default();
        let start = Instant::now();
        let deferred = |pid| ObserverEvent::Deferred {
            pid,
            reason: hvstats_observe::refusal::Refusal::ClaimedElsewhere,
            why: "already observed by pid 9".into(),
        };
        let mut said = Vec::new();
        // 240 deferrals over nine minutes, as an observer left to another once logged them.
        for n in 0..240u64 {
            let at = start + Duration::from_millis(n * 2250);
            said.extend(limiter.line(&deferred(7), at));
        }
        assert_eq!(said.len(), 9, "{said:?}");
        assert!(said[1].ends_with("(26 more like it held back)"), "{}", said[1]);
        // Another VM, or another kind about the same VM, is its own line.
        assert!(limiter.line(&deferred(8), start).is_some());
        let lost =
            ObserverEvent::SourceDown { pid: 7, name: "vm".into(), source: "qmp", why: "stopped".into() };
        assert!(limiter.line(&lost, start).is_some());
        let back = ObserverEvent::SourceUp {
            pid: 7,
            name: "vm".into(),
            source: "qmp",
            after: Duration::from_secs(10),
        };
        assert_eq!(limiter.line(&back, start).as_deref(), Some("pid 7 \"vm\": qmp back after 10.0 s"));
    }

    #[test]
    fn many_ids_are_said_as_their_number_and_ranges() {
        assert_eq!(id_list("threads", &[12, 10, 11]), "[10, 11, 12]");
        let many: Vec<i32> = (1000..1400).collect();
        assert_eq!(id_list("threads", &many), "400 threads: 1000-1399");
        let scattered: Vec<i32> = (0..20).map(|i| i * 10).collect();
        assert_eq!(
            id_list("threads", &scattered),
            "20 threads: 0, 10, 20, 30, 40, 50, 60, 70 and 12 more ranges"
        );
        let vps: Vec<u32> = (0..1024).collect();
        assert_eq!(
            describe_mshv(&MshvEvent::Appeared { key: hvstats_mshv::tree::PartitionKey::Id(4), vps }),
            "mshv partition 4: 1024 VPs: 0-1023"
        );
        let vps = vec![0, 1];
        assert_eq!(
            describe_mshv(&MshvEvent::VpsChanged { key: hvstats_mshv::tree::PartitionKey::Id(4), vps }),
            "mshv partition 4: now VPs [0, 1]"
        );
    }

    #[test]
    fn a_vcpu_thread_list_of_a_1024_vcpu_vm_makes_a_short_line() {
        let threads: Vec<i32> = (5000..6024).rev().chain([9000, 9002]).collect();
        let line = describe(&ObserverEvent::VcpusKnown { pid: 7, threads, fds: 1026 });
        assert_eq!(
            line,
            "pid 7: vCPU threads 1026 threads: 5000-6023, 9000, 9002; 1026 descriptors open for its counters (counting on those threads only)"
        );
    }

    #[test]
    fn past_the_engines_rows_is_one_line_of_its_own() {
        let note = "the in-kernel counting engine's 4096 rows are all in use".to_owned();
        assert_eq!(
            describe(&ObserverEvent::PastEngineRows(note.clone())),
            format!("in-kernel counting: {note}")
        );
    }
}
