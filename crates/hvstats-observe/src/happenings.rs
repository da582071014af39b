//! What the observer says happened in a tick: attaches, departures, peers going down and up,
//! refusals. The attach/detach log is written from these.

use std::path::PathBuf;
use std::time::Duration;

use super::refusal::Refusal;
use super::sources::KvmExitState;
use super::vm::{Departure, ThreadRefusal};

/// Something that happened in one [`crate::Observer::tick`], for the attach/detach log.
#[derive(Debug)]
pub enum ObserverEvent {
    /// A VM is now observed.
    Attached {
        /// The VMM process.
        pid: i32,
        /// The VM's name.
        name: String,
        /// The VMM.
        vmm: &'static str,
        /// Its vCPUs.
        vcpus: u32,
        /// The partition id it is published as.
        partition: u64,
        /// Perf descriptors held at attach (every thread; fewer once the vCPUs are known).
        fds: usize,
        /// Threads of the process counted at attach.
        threads: usize,
        /// Threads left out by the descriptor budget (counted should they turn out to run a vCPU).
        left_out: usize,
        /// The QMP socket used, when the VM has one.
        qmp: Option<PathBuf>,
        /// Why KVM's statistics through QMP are unavailable for now, when its session failed.
        qmp_error: Option<String>,
    },
    /// A source's peer stopped answering: the counters it gives are unavailable until it is
    /// back (it is retried).
    SourceDown {
        /// The VMM process.
        pid: i32,
        /// The VM's name.
        name: String,
        /// The source (`qmp`).
        source: &'static str,
        /// Why.
        why: String,
    },
    /// A source's peer answers again (or for the first time since attach).
    SourceUp {
        /// The VMM process.
        pid: i32,
        /// The VM's name.
        name: String,
        /// The source (`qmp`).
        source: &'static str,
        /// How long it was down.
        after: Duration,
    },
    /// A VM the filter (`--vm`, `--exclude-vm`) leaves out; said once per process.
    Excluded {
        /// The VMM process.
        pid: i32,
        /// The VM's name.
        name: String,
    },
    /// The vCPU threads of a VM are all known; counters on other threads are closed.
    VcpusKnown {
        /// The VMM process.
        pid: i32,
        /// Thread of each VP.
        threads: Vec<i32>,
        /// Perf descriptors held now.
        fds: usize,
    },
    /// Whether `kvm_exit` fires was decided for a VM.
    KvmExit {
        /// The VMM process.
        pid: i32,
        /// What was decided.
        state: KvmExitState,
    },
    /// What keeping the in-kernel counts beyond this observer found: counts adopted from an
    /// earlier observer, kept counts dropped and why, or why nothing is kept.
    Kept(String),
    /// The in-kernel counting engine's rows are all in use: the threads past them are counted by
    /// perf counters, at perf's cost (said once, with the numbers; each VM so counted names its
    /// source `tracepoints-perf`).
    PastEngineRows(String),
    /// A VM is no longer observed: its process exited, `exec()`ed, or its pid names another
    /// process now.
    Detached {
        /// The VMM process.
        pid: i32,
        /// The VM's name.
        name: String,
        /// Why.
        why: Departure,
    },
    /// A VM just attached is named as, or like, a VM observed already (a lookalike differs only
    /// by characters that show nothing or by confusable letters; see
    /// [`hvstats::vm_name::looks_like`]).
    NamedLike {
        /// The VMM process of the VM just attached.
        pid: i32,
        /// Its name.
        name: String,
        /// The VMM process of the VM observed already.
        other: i32,
        /// That VM's name.
        other_name: String,
    },
    /// A VM just attached has the UUID of a VM observed already.
    DuplicateUuid {
        /// The VMM process of the VM just attached.
        pid: i32,
        /// The UUID.
        uuid: hvstats::vmm::VmUuid,
        /// The VMM process of the VM observed already.
        other: i32,
    },
    /// A source refused what the VMM offered it (a descriptor or a socket that is not what it
    /// was listed as); said once, when the VM is attached. The counters come from the VM's other
    /// sources.
    SourceRefused {
        /// The VMM process.
        pid: i32,
        /// The VM's name.
        name: String,
        /// The source (`stats-fd`, `qmp`).
        source: &'static str,
        /// What was refused, and why.
        why: String,
    },
    /// A thread id a source named for one of a VM's vCPUs is not used (said once per thread).
    ThreadRefused {
        /// The VMM process.
        pid: i32,
        /// The VM's name.
        name: String,
        /// The thread, who named it and why it was refused.
        refusal: ThreadRefusal,
    },
    /// A process cannot be attached or refreshed now (another observer holds it, descriptors
    /// or memory of this process ran out); it is tried again at the next tick (said once until
    /// that changes). Counted as refused, for its reason, while it lasts.
    Deferred {
        /// The process.
        pid: i32,
        /// The reason it is counted as refused for.
        reason: Refusal,
        /// Why, in full.
        why: String,
    },
    /// A process that may hold a VM is not observed because this process may not read it (its
    /// `/proc/PID/fd`), or a VM's QMP socket is not seen from this process's mount namespace;
    /// said once per process, with what would let it in. Counted as refused while it lasts.
    Refused {
        /// The process.
        pid: i32,
        /// Its VM's name (as its command line gives it).
        name: String,
        /// The reason it is counted as refused for (its sentence and fix are the table's).
        reason: Refusal,
        /// What was refused (the error, the socket).
        why: String,
    },
    /// A process holds the very KVM VM object of a VM observed already (a descriptor it inherited
    /// by `fork()`, or was passed): not a second VM, and not published; said once. It is a
    /// candidate again once that VM's process lets go of it.
    SharesVm {
        /// The process.
        pid: i32,
        /// The VMM process whose VM it holds.
        with: i32,
    },
    /// A process could not be observed.
    Failed {
        /// The process.
        pid: i32,
        /// The reason it is counted as refused for while it lives.
        reason: Refusal,
        /// Why.
        error: String,
    },
    /// A capability the observer uses is missing (said once, at start): what that costs, and
    /// the unit line that gives it.
    CapabilityMissing(&'static crate::capabilities::Needed),
}
