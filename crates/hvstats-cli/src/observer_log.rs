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
    let vps = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    match event {
        MshvEvent::Format(dialect) => format!("mshv: the tree is printed in {}", dialect.label()),
        MshvEvent::Appeared { key, vps: v } => format!("mshv partition {key}: VPs [{}]", vps(v)),
        MshvEvent::VpsChanged { key, vps: v } => format!("mshv partition {key}: VPs now [{}]", vps(v)),
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
/// break lines.
pub(crate) fn describe(event: &ObserverEvent) -> String {
    match event {
        ObserverEvent::Attached {
            pid,
            name,
            vmm,
            vcpus,
            partition,
            fds,
            threads,
            left_out,
            qmp,
            qmp_error,
        } => {
            let mut s = format!(
                "attach pid {pid} ({}) \"{}\": {vcpus} vCPUs as partition {partition}, {fds} perf counters open",
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
        ObserverEvent::SourceDown { pid, name, source, why } => format!(
            "pid {pid} \"{}\": {source} lost: {}; its counters are unavailable until it answers again",
            LoggedName(name),
            Escaped(why)
        ),
        ObserverEvent::SourceUp { pid, name, source, after } => {
            format!("pid {pid} \"{}\": {source} back after {:.1} s", LoggedName(name), after.as_secs_f64())
        }
        ObserverEvent::Excluded { pid, name } => {
            format!("pid {pid} \"{}\": not observed: --vm/--exclude-vm leave it out", LoggedName(name))
        }
        ObserverEvent::VcpusKnown { pid, threads, fds } => format!(
            "pid {pid}: vCPU threads {}; {fds} perf counters open (on those threads only)",
            crate::log_budget::thread_ids(threads)
        ),
        // A fact of the host, said once per observer (see `LogLimiter`): no VM is named.
        ObserverEvent::KvmExit { state, .. } => format!(
            "kvm:kvm_exit {}",
            match state {
                hvstats_observe::KvmExitState::Fires => "fires: intercepts are counted by exit reason",
                hvstats_observe::KvmExitState::Silent => {
                    "does not fire on this host (no VMX/SVM exits): HLT, MWAIT, DR, other intercepts come only from QMP or are unavailable"
                }
                hvstats_observe::KvmExitState::NoHardwareVirtualization =>
                    "is not counted: KVM here is not VMX/SVM",
                hvstats_observe::KvmExitState::Undecided => "undecided",
            }
        ),
        // A VM's name is what its VMM's command line or QMP says: escaped, it cannot forge a line.
        ObserverEvent::Detached { pid, name, why } => format!(
            "detach pid {pid} \"{}\": {}",
            LoggedName(name),
            match why {
                Departure::Exited => "the process exited",
                Departure::Exec => "the process exec'd a program: a VM it makes now is attached anew",
                Departure::PidReused => "the pid names another process now: its VM, if any, is attached anew",
                Departure::VmChanged => {
                    "the KVM VM object it was attached with is no longer its only VM (closed, made anew, \
                     or another beside it): a VM it runs now is a new VM, attached anew with a new origin"
                }
            }
        ),
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
        ObserverEvent::SharesVm { pid, with } => format!(
            "pid {pid}: holds the KVM VM of pid {with} (the same VM object, by an inherited or passed \
             descriptor): not a second VM, not published"
        ),
        ObserverEvent::CapabilityMissing(needed) => needed.line(),
        ObserverEvent::Kept(note) => format!("in-kernel counts: {}", Escaped(note)),
        ObserverEvent::PastEngineRows(note) => format!("in-kernel counting: {}", Escaped(note)),
    }
}

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
}
