//! Why an observer does not observe a VM it found: one table, whose rows give a stable
//! snake_case label (the `reason` label of `hvstats_observer_vms{state="refused"}`), a sentence
//! saying what stands in the way, and the fix.
//!
//! Every place that refuses a VM names one of these; the observer counts the VMs it refuses by
//! reason on its instance's hypervisor page, one catalog row each ([`Refusal::row`]), so an alert
//! tells "the unit lacks a capability" from "a VM over a budget". Adding a reason is a row here
//! and its row in the catalog (at the index [`Refusal::row`] gives; a test holds the two together).

macro_rules! refusals {
    ($( $(#[$doc:meta])* $code:literal $variant:ident $label:literal, $sentence:literal, $fix:literal; )*) => {
        /// Why a VM the observer found is not observed now.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Refusal {
            $( $(#[$doc])* $variant, )*
        }

        impl Refusal {
            /// Every reason, in the order of their rows.
            pub const ALL: &'static [Refusal] = &[$(Refusal::$variant),*];

            /// Its position in [`Refusal::ALL`], which places its row.
            pub const fn code(self) -> u16 {
                match self { $(Refusal::$variant => $code,)* }
            }

            /// Its stable snake_case label (the metrics' `reason`).
            pub const fn label(self) -> &'static str {
                match self { $(Refusal::$variant => $label,)* }
            }

            /// What stands between the observer and the VM, said of the VM.
            pub const fn sentence(self) -> &'static str {
                match self { $(Refusal::$variant => $sentence,)* }
            }

            /// What lets the VM in.
            pub const fn fix(self) -> &'static str {
                match self { $(Refusal::$variant => $fix,)* }
            }
        }
    };
}

refusals! {
    /// The VMM's `/proc/PID/fd` may not be listed: another user's, and no CAP_DAC_READ_SEARCH.
    0 NoCapDacReadSearch "no_cap_dac_read_search",
        "its /proc/PID/fd (another user's, mode 0500) may not be listed without CAP_DAC_READ_SEARCH",
        "give the observer CAP_DAC_READ_SEARCH (CapabilityBoundingSet= of hvstats-observe.service has it)";
    /// The links of the VMM's `/proc/PID/fd` may not be read: the ptrace access check, and no
    /// CAP_SYS_PTRACE.
    1 NoCapSysPtrace "no_cap_sys_ptrace",
        "its descriptors (which are its VM and vCPUs) may not be read without CAP_SYS_PTRACE (a ptrace access check)",
        "give the observer CAP_SYS_PTRACE (CapabilityBoundingSet= of hvstats-observe.service has it)";
    /// Its descriptors were refused to an observer holding both capabilities (a VMM in another
    /// user namespace, a security module).
    2 Unreadable "unreadable",
        "its descriptors may not be read, though the observer holds CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE",
        "see which security module or user namespace stands between them (the log names the error)";
    /// Its QMP socket lies in its mount namespace and not in the observer's.
    3 QmpSocketHidden "qmp_socket_hidden",
        "its QMP socket is in its mount namespace and not in the observer's",
        "let the observer see the socket's directory (PrivateTmp=no, ProtectHome=read-only in hvstats-observe.service)";
    /// The descriptors its vCPU threads need are more than the open file limit leaves.
    4 DescriptorBudget "descriptor_budget",
        "the descriptors its vCPU threads need are more than the open file limit leaves",
        "raise LimitNOFILE= of hvstats-observe.service, or let the observer count in the kernel (CAP_BPF)";
    /// This process ran out of descriptors or memory while reading it (tried again each tick).
    5 Shortage "shortage",
        "the observer ran out of descriptors or memory reading it (tried again each tick)",
        "raise LimitNOFILE= or MemoryMax= of hvstats-observe.service";
    /// Another observer holds its claim.
    6 ClaimedElsewhere "claimed_elsewhere",
        "another observer publishes it",
        "read it from that observer's instance; this one takes it over should that one stop";
    /// It could not be observed for another reason (the log says which).
    7 Failed "failed",
        "it could not be observed",
        "see the log line that names it";
    /// It holds several distinct KVM VM objects, and which one its vCPU threads run cannot be
    /// told (a VMM replacing its VM, or one running two).
    8 SeveralVms "several_vms",
        "it holds several distinct KVM VMs and which one its vCPU threads run cannot be told",
        "none while it holds them; it is observed again once it holds one";
}

impl Refusal {
    /// The labels of its series in `hvstats_observer_vms`.
    pub const fn labels(self) -> [(&'static str, &'static str); 2] {
        [("state", "refused"), ("reason", self.label())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_has_its_row_in_the_catalog_and_its_position_as_its_code() {
        use crate::source::{ObserverFact, Source};
        for (i, r) in Refusal::ALL.iter().enumerate() {
            assert_eq!(usize::from(r.code()), i, "{r:?}");
            let row = r.row().counter().unwrap_or_else(|| panic!("{r:?} has no catalog row"));
            assert_eq!(row.maintained.source(), Some(Source::Observer(ObserverFact::Refused(*r))), "{r:?}");
            let label = r.label();
            assert!(label.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'), "{label}");
        }
    }
}
