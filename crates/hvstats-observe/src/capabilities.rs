//! The capabilities the observer uses, what each one's absence costs, and which it holds.
//!
//! Read once at start from the effective set in `/proc/self/status` (`CapEff`): each capability of
//! `NEEDED` that is missing is said in one line naming it, the sources and VMs it costs and the
//! unit line that gives it ([`Needed::line`]); the VMs it hides are counted as refused with its
//! reason (`Capabilities::refusal_of_unreadable`). The list is the unit's
//! `CapabilityBoundingSet=` (packaging/systemd/hvstats-observe.service), and what the code does with
//! each: nothing else is asked for (the open file limit is raised to the hard limit only, which
//! takes no CAP_SYS_RESOURCE).

use hvstats_abi::refusal::Refusal;

/// `CAP_DAC_READ_SEARCH`.
pub(crate) const DAC_READ_SEARCH: u32 = 2;
/// `CAP_SYS_PTRACE`.
pub(crate) const SYS_PTRACE: u32 = 19;
/// `CAP_SYS_ADMIN`, which the kernel takes for CAP_PERFMON and CAP_BPF too.
pub(crate) const SYS_ADMIN: u32 = 21;
/// `CAP_PERFMON`.
pub const PERFMON: u32 = 38;
/// `CAP_BPF`.
pub const BPF: u32 = 39;

/// A capability the observer uses.
#[derive(Debug)]
pub struct Needed {
    /// Its name, as the unit writes it.
    pub name: &'static str,
    /// Its bit in the capability sets.
    pub bit: u32,
    /// Another capability the kernel takes in its place (CAP_SYS_ADMIN for CAP_PERFMON and CAP_BPF).
    pub or: Option<u32>,
    /// What its absence costs: which sources, which VMs.
    pub costs: &'static str,
    /// The reason the VMs it hides are refused with, when it hides any.
    pub hides: Option<Refusal>,
}

/// The unit line that gives the observer its capabilities.
pub(crate) const UNIT_LINE: &str = "CapabilityBoundingSet=CAP_DAC_READ_SEARCH CAP_SYS_PTRACE CAP_PERFMON CAP_BPF \
                             (hvstats-observe.service)";

/// Every capability the observer uses.
pub(crate) const NEEDED: &[Needed] = &[
    Needed {
        name: "CAP_DAC_READ_SEARCH",
        bit: DAC_READ_SEARCH,
        or: None,
        costs: "the /proc/PID/fd of a VMM of another user (libvirt's QEMU runs as libvirt-qemu) cannot be \
                listed: its VM is not observed and counted as refused (reason no_cap_dac_read_search)",
        hides: Some(Refusal::NoCapDacReadSearch),
    },
    Needed {
        name: "CAP_SYS_PTRACE",
        bit: SYS_PTRACE,
        or: None,
        costs: "the descriptors of a VMM of another user cannot be read: its VM is not observed and counted \
                as refused (reason no_cap_sys_ptrace); nor can any VMM's KVM statistics descriptors be \
                copied (source stats-fd down)",
        hides: Some(Refusal::NoCapSysPtrace),
    },
    Needed {
        name: "CAP_PERFMON",
        bit: PERFMON,
        or: Some(SYS_ADMIN),
        costs: "no VM's vCPU threads can be counted: sources tracepoints and thread-clock are down for every \
                VM (exits by class, run time, migrations come only from KVM's statistics, libvirt or QMP); \
                VMs are observed with their other sources",
        hides: None,
    },
    Needed {
        name: "CAP_BPF",
        bit: BPF,
        or: Some(SYS_ADMIN),
        costs: "tracepoints cannot be counted in the kernel: each vCPU thread holds a perf counter per \
                tracepoint instead (more descriptors, a higher cost to the guest, fewer VMs within the \
                open file limit), and the vCPU threads' accounting is read from two /proc files a thread \
                each refresh, their migrations by a perf counter a thread",
        hides: None,
    },
];

impl Needed {
    /// The one line that says it is missing: its name, what that costs, and the unit line that
    /// gives it.
    pub fn line(&self) -> String {
        format!("{} is missing: {}; {UNIT_LINE} gives it", self.name, self.costs)
    }
}

/// The capabilities this process holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    effective: u64,
}

impl Capabilities {
    /// This process's effective set; every capability when it cannot be read (an unknown set
    /// is not taken for a missing one).
    pub fn of_this_process() -> Self {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        Self::from_status(&status).unwrap_or(Self { effective: u64::MAX })
    }

    /// The effective set a `/proc/PID/status` text gives (`CapEff:`, hexadecimal).
    pub(crate) fn from_status(status: &str) -> Option<Self> {
        let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
        u64::from_str_radix(hex, 16).ok().map(|effective| Self { effective })
    }

    /// True when `bit` is in the set.
    pub(crate) fn has(&self, bit: u32) -> bool {
        bit < 64 && self.effective & (1 << bit) != 0
    }

    /// The capabilities of `NEEDED` this process lacks (neither it nor what the kernel takes in
    /// its place).
    pub fn missing(&self) -> impl Iterator<Item = &'static Needed> + '_ {
        NEEDED.iter().filter(|n| !self.has(n.bit) && !n.or.is_some_and(|o| self.has(o)))
    }

    /// Why a VMM whose descriptors were refused is not observed: its `fd` directory could not be
    /// listed (`listing`) or its links not read, each for want of the capability that lets it,
    /// or despite both.
    pub(crate) fn refusal_of_unreadable(&self, listing: bool) -> Refusal {
        match (listing, self.has(DAC_READ_SEARCH), self.has(SYS_PTRACE)) {
            (true, false, _) => Refusal::NoCapDacReadSearch,
            (_, _, false) => Refusal::NoCapSysPtrace,
            _ => Refusal::Unreadable,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_effective_set_is_read_from_status_and_each_missing_capability_is_one_line() {
        // The unit's bounding set less CAP_SYS_PTRACE: DAC_READ_SEARCH, PERFMON, BPF.
        let status = "Name:\thvstats\nCapInh:\t0000000000000000\nCapEff:\t000000c000000004\n";
        let caps = Capabilities::from_status(status).unwrap();
        let missing: Vec<&str> = caps.missing().map(|n| n.name).collect();
        assert_eq!(missing, ["CAP_SYS_PTRACE"]);
        let line = caps.missing().next().unwrap().line();
        assert!(line.starts_with("CAP_SYS_PTRACE is missing: ") && line.contains("CapabilityBoundingSet="));
        assert_eq!(caps.refusal_of_unreadable(false), Refusal::NoCapSysPtrace);
        // CAP_SYS_ADMIN stands for CAP_PERFMON and CAP_BPF, as the kernel takes it.
        let admin = Capabilities::from_status("CapEff:\t0000000000280004\n").unwrap();
        assert_eq!(admin.missing().count(), 0);
        assert_eq!(admin.refusal_of_unreadable(true), Refusal::Unreadable);
        let none = Capabilities::from_status("CapEff:\t0000000000000000\n").unwrap();
        assert_eq!(none.missing().count(), NEEDED.len());
        assert_eq!(none.refusal_of_unreadable(true), Refusal::NoCapDacReadSearch);
        assert!(Capabilities::from_status("Name:\tx\n").is_none());
    }
}
