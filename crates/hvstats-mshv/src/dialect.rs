//! The ways the kernels print the mshv debugfs tree. Mainline Linux and Microsoft's own kernel
//! tree (the one Azure and CBL-Mariner / Azure Linux hosts run) print the same counters
//! differently: names with or without their object prefix, other column widths, a different value
//! where the hypervisor maps two pages for one object, and, in an older revision of Microsoft's
//! file, one page per object and no L1VH directory.
//!
//! hvstats reads every dialect the same way ([`crate::stats_file`]: a name, any padding, `": "`, a
//! value; [`crate::names::canonical`] accepts a name with or without its prefix), so nothing here
//! is needed to read a tree. The dialects say exactly what each kernel prints, for writing trees
//! as it does ([`crate::synthetic`]), for telling a name some kernel prints from one none does,
//! and for saying which kernel printed a tree ([`Dialect::detect`]).

pub mod mainline;
pub mod microsoft;

use hvstats_abi::ObjectKind;

/// A kernel's way of printing the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dialect {
    /// Mainline Linux (7.0 and later): names with their object prefix (`VpCpuidInstructionsCount`)
    /// from id-indexed tables, printed in id order, widths 27/32/37/43; a partition's or VP's line
    /// shows the PARENT page's value unless it is 0, then the SELF page's.
    Mainline,
    /// Microsoft's kernel tree: names without their prefix (`CpuidInstructionsCount`) from
    /// hand-written lists, widths 25/29/30/30 (longer names unpadded); a partition's or VP's line
    /// shows the SELF page's value unless it is 0, then the PARENT page's; a write-only `hvdbg`
    /// file beside the hypervisor's `stats`.
    Microsoft,
    /// The older revision of Microsoft's file: the same lists and widths but 41 for VPs, one stats
    /// page per object (no SELF/PARENT pair), the hypervisor and LP files on every host, and no
    /// `partition/self`.
    MicrosoftSinglePage,
}

/// Which value a partition's or VP's line shows, where the kernel maps two pages for the object:
/// SELF (the partition's own view) and PARENT (its parent's, more privileged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shown {
    /// `parent ? parent : self`.
    ParentElseSelf,
    /// `self ? self : parent`.
    SelfElseParent,
    /// The one page mapped (the SELF area).
    SelfOnly,
}

impl Shown {
    /// The value printed for a counter whose SELF page holds `own` and PARENT page `parent`.
    pub const fn value(self, own: u64, parent: u64) -> u64 {
        match self {
            Shown::ParentElseSelf if parent != 0 => parent,
            Shown::SelfElseParent if own == 0 => parent,
            _ => own,
        }
    }
}

/// Where a dialect's text comes from: the file that prints it and the one that numbers the
/// counters, each at the commit read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Source {
    /// The repository (`owner/name` on GitHub).
    pub repository: &'static str,
    /// The file that prints the tree.
    pub printer: &'static str,
    /// Its commit.
    pub printer_commit: &'static str,
    /// The file that gives the counters their ids.
    pub ids: &'static str,
    /// Its commit.
    pub ids_commit: &'static str,
}

impl Dialect {
    /// Every dialect.
    pub const ALL: [Dialect; 3] = [Dialect::Mainline, Dialect::Microsoft, Dialect::MicrosoftSinglePage];

    /// A short description, for the log.
    pub const fn label(self) -> &'static str {
        match self {
            Dialect::Mainline => "mainline Linux's format",
            Dialect::Microsoft => "the format of Microsoft's kernel tree",
            Dialect::MicrosoftSinglePage => {
                "the format of the older revision of Microsoft's kernel tree (one page per object)"
            }
        }
    }

    /// The names a file of `kind` prints (x86_64), in the order it prints them, each with its
    /// counter id.
    pub const fn names(self, kind: ObjectKind) -> &'static [(u16, &'static str)] {
        match (self, kind) {
            (Dialect::Mainline, ObjectKind::Hypervisor) => mainline::HYPERVISOR,
            (Dialect::Mainline, ObjectKind::LogicalProcessor) => mainline::LOGICAL_PROCESSOR,
            (Dialect::Mainline, ObjectKind::Partition) => mainline::PARTITION,
            (Dialect::Mainline, ObjectKind::Vp) => mainline::VP,
            (_, ObjectKind::Hypervisor) => microsoft::HYPERVISOR,
            (_, ObjectKind::LogicalProcessor) => microsoft::LOGICAL_PROCESSOR,
            (_, ObjectKind::Partition) => microsoft::PARTITION,
            (_, ObjectKind::Vp) => microsoft::VP,
        }
    }

    /// The width `%-Ws` pads a name of `kind` to; a longer name is printed whole.
    pub const fn name_width(self, kind: ObjectKind) -> usize {
        match (self, kind) {
            (Dialect::Mainline, ObjectKind::Hypervisor) => 27,
            (Dialect::Mainline, ObjectKind::LogicalProcessor) => 32,
            (Dialect::Mainline, ObjectKind::Partition) => 37,
            (Dialect::Mainline, ObjectKind::Vp) => 43,
            (_, ObjectKind::Hypervisor) => 25,
            (_, ObjectKind::LogicalProcessor) => 29,
            (_, ObjectKind::Partition) => 30,
            (Dialect::Microsoft, ObjectKind::Vp) => 30,
            (Dialect::MicrosoftSinglePage, ObjectKind::Vp) => 41,
        }
    }

    /// Which value a partition's or VP's line shows (the hypervisor and LPs have one page).
    pub const fn shown(self) -> Shown {
        match self {
            Dialect::Mainline => Shown::ParentElseSelf,
            Dialect::Microsoft => Shown::SelfElseParent,
            Dialect::MicrosoftSinglePage => Shown::SelfOnly,
        }
    }

    /// True when an L1VH's own partition is `partition/self` (and its PARENT page is its SELF
    /// page: an L1VH cannot map its own parent area).
    pub const fn prints_self(self) -> bool {
        !matches!(self, Dialect::MicrosoftSinglePage)
    }

    /// True when the hypervisor's and the LPs' files exist only on the root partition.
    pub const fn global_files_on_root_only(self) -> bool {
        !matches!(self, Dialect::MicrosoftSinglePage)
    }

    /// True when the root partition's tree has a write-only `hvdbg` file at its top.
    pub const fn has_hvdbg(self) -> bool {
        matches!(self, Dialect::Microsoft)
    }

    /// The sources this dialect was read from.
    pub const fn source(self) -> Source {
        match self {
            Dialect::Mainline => Source {
                repository: "torvalds/linux",
                printer: "drivers/hv/mshv_debugfs.c",
                printer_commit: "69050f8d6d075dc01af7a5f2f550a8067510366f",
                ids: "drivers/hv/mshv_debugfs_counters.c",
                ids_commit: "d31558c077d8be422b65e97974017c030b4bd91a",
            },
            Dialect::Microsoft => Source {
                repository: "microsoft/CBL-Mariner-Linux-Kernel",
                printer: "drivers/hv/mshv_debugfs.c",
                printer_commit: "08f13b3e63dca73d0e4fb85a5d9393033edc83f7",
                ids: "include/hyperv/hvhdk.h",
                ids_commit: "011c53942fe202549f2fe8af910cb608cd743808",
            },
            Dialect::MicrosoftSinglePage => Source {
                repository: "microsoft/CBL-Mariner-Linux-Kernel",
                printer: "drivers/hv/mshv_debugfs.c",
                printer_commit: "63a919a7168ac8beabc99ad5ef9ed1f8d4ff3cd7",
                ids: "include/hyperv/hvhdk.h",
                ids_commit: "011c53942fe202549f2fe8af910cb608cd743808",
            },
        }
    }

    /// One line as the kernel prints it: `seq_printf(m, "%-Ws: %llu\n", name, value)`.
    pub fn line(self, kind: ObjectKind, name: &str, value: u64) -> String {
        format!("{name:<width$}: {value}\n", width = self.name_width(kind))
    }

    /// The dialect that prints names the way `seen` says (whether they carry their object prefix,
    /// and the width VP names were padded to, when a VP file was read): `None` when nothing known
    /// was read.
    pub fn detect(seen: &Seen) -> Option<Dialect> {
        match (seen.prefixed, seen.unprefixed) {
            (0, 0) => None,
            (p, u) if p >= u => Some(Dialect::Mainline),
            _ if seen.vp_width == Some(Dialect::MicrosoftSinglePage.name_width(ObjectKind::Vp)) => {
                Some(Dialect::MicrosoftSinglePage)
            }
            _ => Some(Dialect::Microsoft),
        }
    }
}

/// How the names of a tree were printed, gathered while reading it: enough to tell the dialects
/// apart ([`Dialect::detect`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// Known names printed with their object prefix.
    pub prefixed: usize,
    /// Known names printed without it.
    pub unprefixed: usize,
    /// The width the names of a VP file were padded to.
    pub vp_width: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::{canonical, prefix};

    fn stem(kind: ObjectKind, name: &str) -> String {
        name.strip_prefix(prefix(kind)).unwrap_or(name).to_owned()
    }

    #[test]
    fn microsofts_lists_are_mainlines_names_without_their_prefix_but_for_the_placeholders() {
        for kind in ObjectKind::ALL {
            let mainline = Dialect::Mainline.names(kind);
            for &(id, name) in Dialect::Microsoft.names(kind) {
                assert!(!name.starts_with(prefix(kind)), "{name} is printed without its prefix");
                let same_id = mainline.iter().find(|(i, _)| *i == id).map(|(_, n)| stem(kind, n));
                let placeholder = name.starts_with("Placeholder");
                assert!(same_id.as_deref() == Some(name) || placeholder, "{kind:?} {id} {name}");
            }
            let ids: Vec<u16> = Dialect::Microsoft.names(kind).iter().map(|(id, _)| *id).collect();
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "printed in id order");
        }
        let count = |d: Dialect, k| d.names(k).len();
        assert_eq!(ObjectKind::ALL.map(|k| count(Dialect::Microsoft, k)), [11, 51, 32, 199]);
        assert_eq!(ObjectKind::ALL.map(|k| count(Dialect::Mainline, k)), [11, 51, 45, 211]);
    }

    #[test]
    fn every_printed_name_of_every_dialect_has_a_canonical_name() {
        for dialect in Dialect::ALL {
            for kind in ObjectKind::ALL {
                for (_, name) in dialect.names(kind) {
                    let canonical = canonical(kind, name).unwrap_or_else(|| panic!("{dialect:?} {name}"));
                    assert_eq!(canonical, format!("{}{}", prefix(kind), stem(kind, name)));
                }
            }
        }
    }

    #[test]
    fn long_names_are_printed_whole_past_the_width() {
        let d = Dialect::Microsoft;
        assert_eq!(
            d.line(ObjectKind::Vp, "CpuidInstructionsCount", 7),
            "CpuidInstructionsCount        : 7\n"
        );
        let long = "FlushGuestPhysicalAddressSpaceHypercalls";
        assert_eq!(d.line(ObjectKind::Vp, long, 1), format!("{long}: 1\n"));
        let unpadded = d.names(ObjectKind::Vp).iter().filter(|(_, n)| n.len() > 30).count();
        assert_eq!(unpadded, 28, "28 VP names pass Microsoft's width of 30");
        assert!(
            Dialect::ALL.iter().filter(|d| **d != Dialect::Microsoft).all(|d| ObjectKind::ALL
                .iter()
                .all(|&k| d.names(k).iter().all(|(_, n)| n.len() < d.name_width(k)))),
            "every other width pads every name"
        );
    }

    #[test]
    fn each_dialect_shows_the_value_its_source_prints() {
        assert_eq!(Shown::ParentElseSelf.value(1, 2), 2);
        assert_eq!(Shown::ParentElseSelf.value(1, 0), 1);
        assert_eq!(Shown::SelfElseParent.value(1, 2), 1);
        assert_eq!(Shown::SelfElseParent.value(0, 2), 2);
        assert_eq!(Shown::SelfOnly.value(0, 2), 0);
    }

    #[test]
    fn the_dialect_is_told_from_how_names_were_printed() {
        let seen = |prefixed, unprefixed, vp_width| Seen { prefixed, unprefixed, vp_width };
        assert_eq!(Dialect::detect(&seen(0, 0, None)), None);
        assert_eq!(Dialect::detect(&seen(211, 0, Some(43))), Some(Dialect::Mainline));
        assert_eq!(Dialect::detect(&seen(0, 199, Some(30))), Some(Dialect::Microsoft));
        assert_eq!(Dialect::detect(&seen(0, 199, Some(41))), Some(Dialect::MicrosoftSinglePage));
        assert_eq!(Dialect::detect(&seen(0, 11, None)), Some(Dialect::Microsoft));
    }
}
