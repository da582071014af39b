//! The run state of a VM, as a code a page can hold: whether its vCPUs run, are held, are gone
//! for good, or stopped on an error KVM could not get past.
//!
//! The catalog's "VM state" row (partition page, hvstats' own group) holds one of these codes;
//! readers show its [`label`](VmState::label), and an exporter a state set with one series per
//! state. A VMM says more states than these (QEMU's `query-status` has fifteen); they fold into
//! the five an operator acts on: is it running, held (paused, migrating, suspended), shut down,
//! broken, or is its state not known now.

/// The run state of a VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum VmState {
    /// Its state cannot be told now (the source that says it is down, or said something else).
    Unknown = 0,
    /// Its vCPUs run.
    Running = 1,
    /// Its vCPUs are held: paused, suspended, migrating, saving or restoring, stopped on a
    /// watchdog or an I/O error the VMM waits out.
    Paused = 2,
    /// It shut down (or its guest panicked): its vCPUs will not run until it is reset.
    Shutdown = 3,
    /// KVM could not run it further (an emulation failure, a failed VM entry): it is stuck.
    InternalError = 4,
}

impl VmState {
    /// Every state, in code order.
    pub const ALL: [VmState; 5] =
        [VmState::Unknown, VmState::Running, VmState::Paused, VmState::Shutdown, VmState::InternalError];

    /// The state's name, as tables, JSON and the `state` label say it.
    ///
    /// ```
    /// use hvstats_abi::vm_state::VmState;
    /// assert_eq!(VmState::InternalError.label(), "internal-error");
    /// assert_eq!(VmState::from_code(VmState::Paused.code()), VmState::Paused);
    /// assert_eq!(VmState::from_code(99), VmState::Unknown);
    /// ```
    pub const fn label(self) -> &'static str {
        match self {
            VmState::Unknown => "unknown",
            VmState::Running => "running",
            VmState::Paused => "paused",
            VmState::Shutdown => "shutdown",
            VmState::InternalError => "internal-error",
        }
    }

    /// The code a page holds.
    pub const fn code(self) -> u64 {
        self as u64
    }

    /// The state of a code read from a page; a code this build does not know is
    /// [`VmState::Unknown`].
    pub const fn from_code(code: u64) -> Self {
        match code {
            1 => VmState::Running,
            2 => VmState::Paused,
            3 => VmState::Shutdown,
            4 => VmState::InternalError,
            _ => VmState::Unknown,
        }
    }

    /// The state libvirt's `state.state` and `state.reason` name (`virDomainState`,
    /// `virDomainPausedReason`): a domain shutting down still runs; one paused because its guest
    /// crashed is shut down, as QEMU's `guest-panicked`. libvirt reports QEMU's internal error as
    /// a pause of unknown reason, so through libvirt that state reads as paused.
    ///
    /// ```
    /// use hvstats_abi::vm_state::VmState;
    /// assert_eq!(VmState::from_libvirt(1, 1), VmState::Running);
    /// assert_eq!(VmState::from_libvirt(3, 2), VmState::Paused);
    /// assert_eq!(VmState::from_libvirt(3, 9), VmState::Shutdown);
    /// assert_eq!(VmState::from_libvirt(5, 1), VmState::Shutdown);
    /// assert_eq!(VmState::from_libvirt(0, 0), VmState::Unknown);
    /// ```
    pub fn from_libvirt(state: i64, reason: i64) -> Self {
        /// `VIR_DOMAIN_PAUSED_CRASHED`.
        const PAUSED_CRASHED: i64 = 9;
        match (state, reason) {
            // RUNNING, BLOCKED (on a resource), SHUTDOWN (being shut down).
            (1 | 2 | 4, _) => VmState::Running,
            (3, PAUSED_CRASHED) => VmState::Shutdown,
            // PAUSED, PMSUSPENDED.
            (3 | 7, _) => VmState::Paused,
            // SHUTOFF, CRASHED.
            (5 | 6, _) => VmState::Shutdown,
            _ => VmState::Unknown,
        }
    }

    /// The state QEMU's `query-status` names (QAPI `RunState`): a state this build does not know
    /// is [`VmState::Unknown`].
    ///
    /// ```
    /// use hvstats_abi::vm_state::VmState;
    /// assert_eq!(VmState::from_qemu("running"), VmState::Running);
    /// assert_eq!(VmState::from_qemu("prelaunch"), VmState::Paused);
    /// assert_eq!(VmState::from_qemu("guest-panicked"), VmState::Shutdown);
    /// assert_eq!(VmState::from_qemu("internal-error"), VmState::InternalError);
    /// assert_eq!(VmState::from_qemu("weird"), VmState::Unknown);
    /// ```
    pub fn from_qemu(status: &str) -> Self {
        match status {
            "running" => VmState::Running,
            "debug" | "inmigrate" | "io-error" | "paused" | "postmigrate" | "prelaunch"
            | "finish-migrate" | "restore-vm" | "save-vm" | "suspended" | "watchdog" | "colo" => {
                VmState::Paused
            }
            "shutdown" | "guest-panicked" => VmState::Shutdown,
            "internal-error" => VmState::InternalError,
            _ => VmState::Unknown,
        }
    }
}
