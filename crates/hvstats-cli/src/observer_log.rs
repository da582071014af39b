//! The log lines of the observers (`observe`, `serve --observe-all`): one line per event,
//! whatever a VM's name holds.

use hvstats_kvm::observe::ObserverEvent;
use hvstats_kvm::observe::vm::Departure;
use hvstats_mshv::observer::MshvEvent;
use hvstats_present::text::Escaped;

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
        ObserverEvent::Attached { pid, name, vmm, vcpus, partition, fds, threads, left_out, qmp_error } => {
            let mut s = format!(
                "attach pid {pid} ({}) \"{}\": {vcpus} vCPUs as partition {partition}, {fds} perf counters open",
                Escaped(vmm),
                Escaped(name)
            );
            if *left_out > 0 {
                s.push_str(&format!(
                    " on {threads} of {} threads ({left_out} left out: descriptor budget; a vCPU thread \
                     among them is counted once known)",
                    threads + left_out
                ));
            }
            if let Some(e) = qmp_error {
                s.push_str(&format!("; KVM statistics through QMP unavailable: {}", Escaped(&e.to_string())));
            }
            s
        }
        ObserverEvent::VcpusKnown { pid, threads, fds } => {
            format!("pid {pid}: vCPU threads {threads:?}; {fds} perf counters open (on those threads only)")
        }
        ObserverEvent::KvmExit { pid, state } => format!(
            "pid {pid}: kvm:kvm_exit {}",
            match state {
                hvstats_kvm::observe::KvmExitState::Fires => "fires: intercepts are counted by exit reason",
                hvstats_kvm::observe::KvmExitState::Silent => {
                    "does not fire on this host (no VMX/SVM exits): HLT, MWAIT, DR, other intercepts come only from QMP or are unavailable"
                }
                hvstats_kvm::observe::KvmExitState::NoHardwareVirtualization =>
                    "is not counted: KVM here is not VMX/SVM",
                hvstats_kvm::observe::KvmExitState::Undecided => "undecided",
            }
        ),
        // A VM's name is what its VMM's command line or QMP says: escaped, it cannot forge a line.
        ObserverEvent::Detached { pid, name, why } => format!(
            "detach pid {pid} \"{}\": {}",
            Escaped(name),
            match why {
                Departure::Exited => "the process exited",
                Departure::Exec => "the process exec'd a program: a VM it makes now is attached anew",
                Departure::PidReused => "the pid names another process now: its VM, if any, is attached anew",
            }
        ),
        ObserverEvent::NamedLike { pid, name, other, other_name } if name == other_name => format!(
            "pid {pid} \"{}\": the name of pid {other}'s VM, which keeps it; this one is told apart by its publisher and partition",
            Escaped(name)
        ),
        ObserverEvent::NamedLike { pid, name, other, other_name } => format!(
            "pid {pid} \"{}\": looks like the name of pid {other}'s VM \"{}\" (invisible or confusable characters)",
            Escaped(name),
            Escaped(other_name)
        ),
        ObserverEvent::DuplicateUuid { pid, uuid, other } => {
            format!("pid {pid}: UUID {uuid} is also pid {other}'s VM's: two VMs claim one identity")
        }
        ObserverEvent::ThreadRefused { pid, name, refusal } => format!(
            "pid {pid} \"{}\": thread {} named by {} for VP {} is not used: {}",
            Escaped(name),
            refusal.tid,
            refusal.by,
            refusal.vp,
            Escaped(&refusal.why)
        ),
        ObserverEvent::Deferred { pid, reason } => {
            format!("pid {pid} not observed for now (retried): {}", Escaped(reason))
        }
        ObserverEvent::Failed { pid, error } => format!("cannot observe pid {pid}: {}", Escaped(error)),
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
}
