//! `docs/hyperv-hypercalls.md`, rendered from the hypercall table and the sources it was checked
//! against, so that the page cannot say what the code does not.
//!
//! The page's prose is written by hand; the part between its `<!-- hypercall table: begin -->` and
//! `<!-- hypercall table: end -->` markers is [`write_markdown`]'s output, and a test fails when the
//! two differ (`HVSTATS_UPDATE_DOCS=1` rewrites it).

use core::fmt::{self, Write};

use crate::catalog::{CATALOG, CounterId, hypercall_class_counter};
use crate::hypercall::{
    HYPERCALLS, HypercallEffect, HypercallRow, KVM_EXTENDED_CALLS, KernelRelease, KvmEmulation, KvmPath,
};

/// A kernel tree the table was checked against: the release, where it was read, and the git
/// blob ids of the two files (`git rev-parse <tag>:arch/x86/kvm/hyperv.c` in any Linux clone
/// gives the same id for the same text).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelTree {
    /// The release series.
    pub release: KernelRelease,
    /// The exact stable release read.
    pub version: &'static str,
    /// The GitHub repository holding an import of that release.
    pub repository: &'static str,
    /// The commit of that repository that is the release as imported.
    pub commit: &'static str,
    /// The blob id of `arch/x86/kvm/hyperv.c`.
    pub hyperv_c: &'static str,
    /// The blob id of `arch/x86/kvm/trace.h`.
    pub trace_h: &'static str,
}

/// The trees read, one per checked release.
pub const CHECKED_KERNELS: [KernelTree; 4] = [
    KernelTree {
        release: KernelRelease::V5_15,
        version: "5.15.85",
        repository: "Tptogiar/linux-5.15.85",
        commit: "08a9b74216b61a1a62b96207e8b51d54d6d378bb",
        hyperv_c: "762b43f0d919423fa803822f985c0be127a8bd7f",
        trace_h: "c41506ed8c7dd300f2ddeac12b0bff3f375beda7",
    },
    KernelTree {
        release: KernelRelease::V6_1,
        version: "6.1.20",
        repository: "c1336658570/linux-6.1.20",
        commit: "bba118ae072307cd5527c908808d598b3e3d1f70",
        hyperv_c: "0adf4a437e85f6f7e67b7b281ebc2484b680ee2f",
        trace_h: "bc25589ad588676974770919234b67f9ce198c43",
    },
    KernelTree {
        release: KernelRelease::V6_6,
        version: "6.6.87",
        repository: "Yunbaby8/linux-6.6.87-lab",
        commit: "12bdb17085816306b04a108658e92a86c737c24b",
        hyperv_c: "bd3fbd5be5da6ec89b4d52b0da69daa2c04a36e2",
        trace_h: "b82e6ed4f024174658114321d85a60529a3df119",
    },
    KernelTree {
        release: KernelRelease::V6_12,
        version: "6.12.19",
        repository: "wishday/linux-6.12.y",
        commit: "aa44b5f5b26d11089d84c65d2ae176df6fdff6dd",
        hyperv_c: "44c88537448c74121044a9f36fb2eba3ce15fb9d",
        trace_h: "d3aeffd6ae75365950f10fd2fd070cff80627fb0",
    },
];

/// A document the table's names and classes were checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpecSource {
    /// The GitHub repository.
    pub repository: &'static str,
    /// The commit read.
    pub commit: &'static str,
    /// The path in the repository (a directory for the TLFS pages).
    pub path: &'static str,
}

/// The TLFS pages: a row's `tlfs` is a page under this directory; the chapter a call is
/// documented in gives its class.
pub const TLFS: SpecSource = SpecSource {
    repository: "MicrosoftDocs/Virtualization-Documentation",
    commit: "77e0742a8029cf3b5a96c84dfab2ce7ba623286c",
    path: "virtualization/hyper-v-on-windows/tlfs/",
};

/// Microsoft's own header of the call codes, grouped by topic, for the codes the TLFS pages do
/// not document (the SynDbg calls, the logical processor run time).
pub const CALL_CODE_HEADER: SpecSource = SpecSource {
    repository: "microsoft/mu_msvm",
    commit: "4c2870420babdb58938bd5e1a27c9b0a82c2ca79",
    path: "MsvmPkg/Include/Hv/HvGuestHypercall.h",
};

/// The counter's seed 001 name.
fn counter_name(id: CounterId) -> &'static str {
    CATALOG.iter().find(|c| c.id == id).map_or("?", |c| c.name)
}

/// "5.15–6.12": the checked releases from `since` on.
fn releases(since: KernelRelease) -> (&'static str, &'static str) {
    let last = KernelRelease::ALL[KernelRelease::ALL.len() - 1];
    (since.name(), last.name())
}

fn write_kvm(w: &mut impl Write, kvm: Option<KvmEmulation>) -> fmt::Result {
    let Some(k) = kvm else { return w.write_str("no (`INVALID_HYPERCALL_CODE`)") };
    let path = match k.path {
        KvmPath::Kernel => "kernel",
        KvmPath::Vmm => "VMM (`KVM_EXIT_HYPERV_HCALL`)",
        KvmPath::EventfdOrVmm => "kernel (eventfd), else VMM (`KVM_EXIT_HYPERV_HCALL`)",
        KvmPath::SynDbgVmm => "VMM (`KVM_EXIT_HYPERV_HCALL`) when SynDbg uses hypercalls",
    };
    let (first, last) = releases(k.since);
    write!(w, "{path}; {first}–{last}")
}

fn write_effect(w: &mut impl Write, row: &HypercallRow) -> fmt::Result {
    let all = crate::hypercall::flush_flags::ALL_VIRTUAL_ADDRESS_SPACES;
    let flush = |flags| row.effect.flush(flags, 1).map_or("?", |(id, _)| counter_name(id));
    match row.effect {
        HypercallEffect::ClassOnly => return Ok(()),
        HypercallEffect::AddressSpaceFlush => {
            write!(w, "1 {} (1 {} with `HV_FLUSH_ALL_VIRTUAL_ADDRESS_SPACES`)", flush(0), flush(all))?
        }
        HypercallEffect::GvaRangeFlush => write!(
            w,
            "`rep_cnt` {} (`rep_cnt` {} with `HV_FLUSH_ALL_VIRTUAL_ADDRESS_SPACES`)",
            flush(0),
            flush(all)
        )?,
        HypercallEffect::SyntheticIpi => w.write_str("no counter of its own")?,
    }
    match row.record {
        Some(tp) => write!(w, "; `kvm:{tp}`"),
        None => Ok(()),
    }
}

fn write_row(w: &mut impl Write, row: &HypercallRow) -> fmt::Result {
    let counter = hypercall_class_counter(row.class).map_or("?", counter_name);
    write!(w, "| {:#06X} | {} | {} | ", row.code.0, row.name, counter)?;
    write_effect(w, row)?;
    w.write_str(" | ")?;
    write_kvm(w, row.kvm)?;
    writeln!(w, " | {} |", row.tlfs)
}

/// Writes the generated part of `docs/hyperv-hypercalls.md`: one row per code of the table, the
/// extended calls KVM forwards by range, and the sources checked.
///
/// # Errors
///
/// Only those of `w`.
pub fn write_markdown(w: &mut impl Write) -> fmt::Result {
    w.write_str(
        "| Code | TLFS name | Counted in | Also feeds | KVM handles it (checked releases) | TLFS page |\n",
    )?;
    w.write_str("|---|---|---|---|---|---|\n")?;
    for row in HYPERCALLS {
        write_row(w, row)?;
    }
    let (first, last, ext) = KVM_EXTENDED_CALLS;
    let other = hypercall_class_counter(crate::hypercall::HypercallClass::Other).map_or("?", counter_name);
    write!(w, "| {:#06X}–{:#06X} | any other extended call | {other} | | ", first.0, last.0)?;
    write_kvm(w, Some(ext))?;
    w.write_str(" | hypercall-interface.md (Extended Hypercall Interface) |\n")?;
    writeln!(w, "| any other code | | {other} | | no (`INVALID_HYPERCALL_CODE`) | |")?;
    w.write_str("\nChecked against:\n\n")?;
    for k in &CHECKED_KERNELS {
        writeln!(
            w,
            "- Linux {} (`{}` at {}): `arch/x86/kvm/hyperv.c` blob `{}`, `arch/x86/kvm/trace.h` blob `{}`",
            k.version, k.repository, k.commit, k.hyperv_c, k.trace_h
        )?;
    }
    for s in [TLFS, CALL_CODE_HEADER] {
        writeln!(w, "- `{}` at {}: `{}`", s.repository, s.commit, s.path)?;
    }
    Ok(())
}
