//! The ftrace filters on `kvm:kvm_exit` made from the exit tables ([`crate::exit_reason`]): the
//! exits of an intercept class ([`class_filter`]), and those of a class that are added to the
//! count of its counter's tracepoint ([`added_filter`]). The observer's in-kernel programs are
//! assembled from these filters, and the perf counters it falls back on are narrowed by them, so
//! both count exactly the rows of the tables.
//!
//! A VMX row matches its basic reason bare and with each combination of the kept flags (bus lock,
//! enclave mode), behind one test of those bits; a row without a condition leaves out the exits a
//! row of another class with a condition takes; an architecture's filters never share an exit.

use core::fmt;

use crate::exit_reason::{
    Condition, Counted, ExitReasonRow, ISA_SVM, ISA_VMX, InterceptClass, SVM, VMX, VMX_FLAG_SETS,
    VMX_KEPT_FLAGS, table,
};

/// An ftrace filter on `kvm_exit` that no record satisfies (`exit_reason` is unsigned): the
/// filter of a class an architecture has no exit of, so that the class keeps its place in a list.
pub const NO_EXIT: &str = "exit_reason < 0";

/// Which rows a filter selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pick {
    /// Every row of a class.
    Class(InterceptClass),
    /// The rows of a class whose exits are added to a tracepoint's count.
    Added(InterceptClass),
}

impl Pick {
    fn takes(self, row: &ExitReasonRow) -> bool {
        match self {
            Pick::Class(c) => row.class == c,
            Pick::Added(c) => row.class == c && row.counted == Counted::Added,
        }
    }
}

/// An ftrace filter on `kvm_exit` selecting the exits of some rows (see [`class_filter`] and
/// [`added_filter`]); its text is its [`Display`](fmt::Display).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitFilter {
    /// The architecture, or `None` for both (each tested on `isa`).
    isa: Option<u32>,
    pick: Pick,
}

/// The filter on `kvm_exit` that matches the exits of `class` on a host of `isa` (VMX basic
/// reasons with or without the bus-lock and enclave flags), `None` when the architecture has no
/// exit of the class, or for Other (every exit no class takes).
pub fn class_filter(isa: u32, class: InterceptClass) -> Option<ExitFilter> {
    let pick = Pick::Class(class);
    let rows = table(isa)?;
    (class != InterceptClass::Other && rows.iter().any(|r| pick.takes(r)))
        .then_some(ExitFilter { isa: Some(isa), pick })
}

/// The filter on `kvm_exit` that matches, on either architecture, the exits of `class` that are
/// [`Counted::Added`] to the count of the class counter's tracepoint; `None` when there is none.
pub fn added_filter(class: InterceptClass) -> Option<ExitFilter> {
    let pick = Pick::Added(class);
    [VMX, SVM].iter().any(|rows| rows.iter().any(|r| pick.takes(r))).then_some(ExitFilter { isa: None, pick })
}

impl fmt::Display for ExitFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.isa {
            Some(isa) => write_isa(f, isa, self.pick),
            None => {
                let mut sep = Separator::new(" || ");
                for isa in [ISA_VMX, ISA_SVM] {
                    let Some(rows) = table(isa) else { continue };
                    if rows.iter().any(|r| self.pick.takes(r)) {
                        sep.write(f)?;
                        write!(f, "(isa == {isa} && (")?;
                        write_isa(f, isa, self.pick)?;
                        write!(f, "))")?;
                    }
                }
                Ok(())
            }
        }
    }
}

/// Writes `text` between items, not before the first.
struct Separator {
    text: &'static str,
    first: bool,
}

impl Separator {
    const fn new(text: &'static str) -> Self {
        Self { text, first: true }
    }

    fn write(&mut self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !core::mem::replace(&mut self.first, false) {
            f.write_str(self.text)?;
        }
        Ok(())
    }
}

/// The rows `pick` takes on `isa`: the exits without flags, then (VMX) behind one test of the
/// flag bits, the same exits with each combination of the kept flags.
fn write_isa(f: &mut fmt::Formatter<'_>, isa: u32, pick: Pick) -> fmt::Result {
    let Some(rows) = table(isa) else { return Ok(()) };
    let mut sep = Separator::new(" || ");
    for r in rows.iter().filter(|r| pick.takes(r)) {
        sep.write(f)?;
        write_row(f, isa, rows, r, 0)?;
    }
    if isa == ISA_VMX {
        write!(f, " || ((exit_reason & {VMX_KEPT_FLAGS:#x}) && (")?;
        let mut sep = Separator::new(" || ");
        for flags in VMX_FLAG_SETS {
            for r in rows.iter().filter(|r| pick.takes(r)) {
                sep.write(f)?;
                write_row(f, isa, rows, r, flags)?;
            }
        }
        write!(f, "))")?;
    }
    Ok(())
}

/// One row's exits with `flags`: the reason (or range), its condition, and — for a row without
/// one — not the exits a row of another class with a condition takes.
fn write_row(
    f: &mut fmt::Formatter<'_>,
    isa: u32,
    rows: &[ExitReasonRow],
    r: &ExitReasonRow,
    flags: u32,
) -> fmt::Result {
    let flags = u64::from(flags);
    let number = |f: &mut fmt::Formatter<'_>, n: u64| {
        if isa == ISA_VMX && flags == 0 { write!(f, "{n}") } else { write!(f, "{n:#x}") }
    };
    // The exits a row of another class with a condition takes from this one.
    let taken = |o: &&ExitReasonRow| {
        r.when.is_none() && o.when.is_some() && o.class != r.class && r.contains(o.first)
    };
    let wrap = r.when.is_some() || rows.iter().any(|o| taken(&o));
    if wrap {
        f.write_str("(")?;
    }
    if r.first == r.last {
        f.write_str("exit_reason == ")?;
        number(f, r.first | flags)?;
    } else {
        f.write_str("(exit_reason >= ")?;
        number(f, r.first | flags)?;
        f.write_str(" && exit_reason <= ")?;
        number(f, r.last | flags)?;
        f.write_str(")")?;
    }
    if let Some(c) = r.when {
        f.write_str(" && (")?;
        write_condition(f, &c)?;
        f.write_str(")")?;
    }
    for o in rows.iter().filter(taken) {
        f.write_str(" && !(exit_reason == ")?;
        number(f, o.first | flags)?;
        if let Some(c) = o.when {
            f.write_str(" && (")?;
            write_condition(f, &c)?;
            f.write_str(")")?;
        }
        f.write_str(")")?;
    }
    if wrap {
        f.write_str(")")?;
    }
    Ok(())
}

fn write_condition(f: &mut fmt::Formatter<'_>, c: &Condition) -> fmt::Result {
    let mut sep = Separator::new(" || ");
    for v in c.values {
        sep.write(f)?;
        write!(f, "{} == {v:#x}", c.field.name())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::string::ToString;

    use super::*;
    use InterceptClass as C;

    #[test]
    fn filters_name_every_row_with_the_flags_and_the_exclusions() {
        let text = |isa, class| class_filter(isa, class).unwrap().to_string();
        assert_eq!(
            text(ISA_VMX, C::Cpuid),
            "exit_reason == 10 || ((exit_reason & 0xc000000) && \
             (exit_reason == 0x400000a || exit_reason == 0x800000a || exit_reason == 0xc00000a))"
        );
        assert_eq!(
            text(ISA_VMX, C::PageFault),
            "(exit_reason == 0 && (intr_info == 0x80000b0e || intr_info == 0x80001b0e)) || ((exit_reason & 0xc000000) && \
             ((exit_reason == 0x4000000 && (intr_info == 0x80000b0e || intr_info == 0x80001b0e)) || \
             (exit_reason == 0x8000000 && (intr_info == 0x80000b0e || intr_info == 0x80001b0e)) || \
             (exit_reason == 0xc000000 && (intr_info == 0x80000b0e || intr_info == 0x80001b0e))))"
        );
        assert!(text(ISA_VMX, C::ApicAccess).starts_with(
            "(exit_reason == 44 && !(exit_reason == 44 && (info1 == 0x10b0))) || exit_reason == 56 || (("
        ));
        assert_eq!(
            text(ISA_SVM, C::DebugRegister),
            "(exit_reason >= 0x20 && exit_reason <= 0x2f) || (exit_reason >= 0x30 && exit_reason <= 0x3f)"
        );
        assert_eq!(text(ISA_SVM, C::ApicEoi), "(exit_reason == 0x402 && (info1 == 0x1000000b0))");
        assert!(class_filter(ISA_SVM, C::ApicTpr).is_none());
        assert!(class_filter(ISA_VMX, C::Other).is_none());
        let added = |class| added_filter(class).map(|f| f.to_string());
        assert_eq!(
            added(C::ApicTpr).as_deref(),
            Some(
                "(isa == 1 && (exit_reason == 43 || ((exit_reason & 0xc000000) && \
                 (exit_reason == 0x400002b || exit_reason == 0x800002b || exit_reason == 0xc00002b))))"
            )
        );
        assert_eq!(added(C::Msr).as_deref(), Some("(isa == 2 && (exit_reason == 0x8f))"));
        assert!(
            added(C::ApicEoi)
                .is_some_and(|f| f.starts_with("(isa == 1 && (") && f.contains(") || (isa == 2 && ("))
        );
        assert_eq!(added(C::Cpuid), None);
    }
}
