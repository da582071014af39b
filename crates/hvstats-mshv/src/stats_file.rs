//! One `stats` file of the mshv debugfs tree: lines of `%-Ws: %llu`, a name padded to a width
//! and its raw 64-bit value in decimal. Every kernel prints this shape; the width, and whether a
//! name carries its object prefix, differ ([`crate::dialect`]), so neither is taken for granted:
//! each name is kept under its canonical name ([`crate::names::canonical`]).
//!
//! The file is the kernel's, but it is read as untrusted text: a line the kernel could not have
//! printed (too long, no `: `, a name that is not an identifier, a value that is not a u64, a
//! name printed twice) and a last line cut before its newline (a read racing the writer, or a
//! truncated copy) are skipped, each with its reason; nothing panics and nothing grows past
//! [`MAX_FILE_BYTES`] (a file is read at most that far) and [`MAX_LINES`]. Names no kernel
//! hvstats knows prints are kept only up to a budget per reading of the tree
//! ([`UnknownNames`]), so a tree of made-up names cannot grow the reader.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use hvstats_abi::ObjectKind;

use crate::dialect::Seen;
use crate::names::canonical;

/// The most bytes of one file that are read: a VP file of 212 counters is about 14 KiB.
pub const MAX_FILE_BYTES: usize = 64 * 1024;
/// The longest line a kernel can print: a name padded to at most 43 (longer names are printed
/// whole, so allow a newer build's up to 64), `": "`, 20 digits.
pub const MAX_LINE_BYTES: usize = 64 + 2 + 20;
/// The longest name kept (what the side file of unmapped values accepts).
pub const MAX_NAME_BYTES: usize = hvstats::unmapped::MAX_NAME_BYTES;
/// The most lines of one file considered (the VP table has 212 entries; ids fit a 4 KiB page).
pub const MAX_LINES: usize = 512;
/// The most distinct names no known kernel prints that one reading of a tree keeps: a newer
/// hypervisor build adds a few; a tree of thousands is not a kernel's.
pub const MAX_UNKNOWN_NAMES: usize = 64;
/// The most values of such names one reading keeps (16 for each of 1,024 objects).
pub const MAX_UNKNOWN_VALUES: usize = 16_384;

/// A counter's name as kept: canonical, borrowed from the tables for every name a known kernel
/// prints, owned only for the few others ([`UnknownNames`]).
pub type Name = Cow<'static, str>;

/// The names no known kernel prints, across one reading of a tree: the first
/// [`MAX_UNKNOWN_NAMES`] distinct ones are kept, with at most [`MAX_UNKNOWN_VALUES`] values in
/// all; the rest are counted, not kept.
#[derive(Debug, Default)]
pub struct UnknownNames {
    names: HashSet<String>,
    values: usize,
    dropped: usize,
}

impl UnknownNames {
    /// A fresh budget, for one reading.
    pub fn new() -> Self {
        Self::default()
    }

    /// True when a value of `name` may be kept (and counts it).
    fn admit(&mut self, name: &str) -> bool {
        let known = self.names.contains(name);
        let room = known || self.names.len() < MAX_UNKNOWN_NAMES;
        if !room || self.values >= MAX_UNKNOWN_VALUES {
            self.dropped += 1;
            return false;
        }
        if !known {
            self.names.insert(name.to_owned());
        }
        self.values += 1;
        true
    }

    /// The values not kept, for want of room.
    pub fn dropped(&self) -> usize {
        self.dropped
    }
}

/// Why a line was skipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// Longer than any line the kernel prints.
    TooLong(usize),
    /// The last line has no newline: cut mid-way.
    Truncated,
    /// Not UTF-8.
    NotUtf8,
    /// No `": "` separating a name from a value.
    NoSeparator,
    /// The name is empty, too long, or not an identifier.
    BadName,
    /// The value is not a decimal u64 (an absurd value: out of range, signed, not a number).
    BadValue(String),
    /// The name was already printed earlier in the file.
    Duplicate,
    /// Past [`MAX_LINES`] lines.
    TooManyLines,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::TooLong(n) => write!(f, "{n} bytes, longer than the kernel prints a line"),
            SkipReason::Truncated => write!(f, "the last line ends without a newline (cut mid-way)"),
            SkipReason::NotUtf8 => write!(f, "not UTF-8"),
            SkipReason::NoSeparator => write!(f, "no \": \" between a name and a value"),
            SkipReason::BadName => {
                write!(f, "the name is not an identifier of at most {MAX_NAME_BYTES} bytes")
            }
            SkipReason::BadValue(v) => write!(f, "the value {v:?} is not a 64-bit unsigned decimal"),
            SkipReason::Duplicate => write!(f, "the name was printed earlier in the file"),
            SkipReason::TooManyLines => write!(f, "past the first {MAX_LINES} lines"),
        }
    }
}

/// A skipped line: its 1-based number and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// The line number.
    pub line: usize,
    /// Why it was skipped.
    pub reason: SkipReason,
}

/// The counters of one file, in file order, and the lines skipped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatsFile {
    /// Each name (canonical) with its value.
    pub counters: Vec<(Name, u64)>,
    /// Lines that were not counters.
    pub skipped: Vec<Skipped>,
    /// True when the file was longer than [`MAX_FILE_BYTES`] and only that much was parsed.
    pub capped: bool,
    /// How its known names were printed (with or without their prefix, padded to what width).
    pub seen: Seen,
}

impl StatsFile {
    /// The value printed for `name`.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.counters.iter().find(|(n, _)| n == name).map(|&(_, v)| v)
    }
}

/// Parses the bytes of a file of `kind` (at most [`MAX_FILE_BYTES`] of them are looked at); names
/// no known kernel prints take from `unknown`'s budget.
pub fn parse(kind: ObjectKind, bytes: &[u8], unknown: &mut UnknownNames) -> StatsFile {
    let mut file = StatsFile::default();
    let bytes = if bytes.len() > MAX_FILE_BYTES {
        file.capped = true;
        &bytes[..MAX_FILE_BYTES]
    } else {
        bytes
    };
    let mut names = HashSet::new();
    for (number, line, complete) in numbered_lines(bytes) {
        let skip = |reason| Skipped { line: number, reason };
        if number > MAX_LINES {
            file.skipped.push(skip(SkipReason::TooManyLines));
            break;
        }
        let added = parse_line(line, complete).and_then(|parsed| file.add(kind, parsed, &mut names, unknown));
        if let Err(reason) = added {
            file.skipped.push(skip(reason));
        }
    }
    file
}

impl StatsFile {
    /// Adds the counter a line printed (name, value, padding) under its canonical name, noting
    /// how a known name was printed; a name no known kernel prints takes from `unknown`'s budget
    /// (past it, the line is dropped, not skipped).
    fn add(
        &mut self,
        kind: ObjectKind,
        (printed, value, padded_to): (&str, u64, Option<usize>),
        names: &mut HashSet<Name>,
        unknown: &mut UnknownNames,
    ) -> Result<(), SkipReason> {
        let name: Name = match canonical(kind, printed) {
            Some(name) => {
                if name == printed {
                    self.seen.prefixed += 1;
                } else {
                    self.seen.unprefixed += 1;
                }
                Cow::Borrowed(name)
            }
            None => Cow::Owned(printed.to_owned()),
        };
        if !names.insert(name.clone()) {
            return Err(SkipReason::Duplicate);
        }
        if matches!(name, Cow::Owned(_)) && !unknown.admit(&name) {
            return Ok(());
        }
        if let (ObjectKind::Vp, Some(width)) = (kind, padded_to) {
            self.seen.vp_width = Some(self.seen.vp_width.map_or(width, |w| w.max(width)));
        }
        self.counters.push((name, value));
        Ok(())
    }
}

/// The lines of `bytes`, numbered from 1, each without its newline and with whether one ended it.
fn numbered_lines(bytes: &[u8]) -> impl Iterator<Item = (usize, &[u8], bool)> {
    let mut rest = bytes;
    let lines = std::iter::from_fn(move || match rest.iter().position(|&b| b == b'\n') {
        _ if rest.is_empty() => None,
        Some(end) => {
            let line = &rest[..end];
            rest = &rest[end + 1..];
            Some((line, true))
        }
        None => Some((std::mem::take(&mut rest), false)),
    });
    (1..).zip(lines).map(|(number, (line, complete))| (number, line, complete))
}

/// One line, without its newline (`complete` when one ended it): the name, the value, and the
/// width the name was padded to (`None` when it was not padded).
fn parse_line(line: &[u8], complete: bool) -> Result<(&str, u64, Option<usize>), SkipReason> {
    if line.len() > MAX_LINE_BYTES {
        return Err(SkipReason::TooLong(line.len()));
    }
    // A capped file's last line is cut by us, not by the writer: the same reason holds.
    if !complete {
        return Err(SkipReason::Truncated);
    }
    let line = std::str::from_utf8(line).map_err(|_| SkipReason::NotUtf8)?;
    let (field, value) = line.split_once(": ").ok_or(SkipReason::NoSeparator)?;
    let name = field.trim_end_matches(' ');
    let padded_to = (name.len() < field.len()).then_some(field.len());
    let identifier = name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if name.is_empty() || name.len() > MAX_NAME_BYTES || !identifier {
        return Err(SkipReason::BadName);
    }
    let digits = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
    match value.parse::<u64>() {
        Ok(v) if digits => Ok((name, v, padded_to)),
        _ => Err(SkipReason::BadValue(value.chars().take(24).collect())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::Dialect;

    fn parse_vp(bytes: &[u8]) -> StatsFile {
        parse(ObjectKind::Vp, bytes, &mut UnknownNames::new())
    }

    fn names(file: &StatsFile) -> Vec<(&str, u64)> {
        file.counters.iter().map(|(n, v)| (n.as_ref(), *v)).collect()
    }

    #[test]
    fn every_dialects_lines_parse_at_every_width_under_one_name() {
        for dialect in Dialect::ALL {
            let text: String = [
                dialect.line(ObjectKind::Vp, dialect.names(ObjectKind::Vp)[17].1, 7),
                dialect.line(ObjectKind::Vp, dialect.names(ObjectKind::Vp)[142].1, u64::MAX),
            ]
            .concat();
            let file = parse_vp(text.as_bytes());
            assert_eq!(
                names(&file),
                [("VpCpuidInstructionsCount", 7), ("VpFlushGuestPhysicalAddressSpaceHypercalls", u64::MAX)],
                "{dialect:?}: {text}"
            );
            assert!(file.skipped.is_empty() && !file.capped);
            let width = dialect.name_width(ObjectKind::Vp);
            assert_eq!(file.seen.vp_width, Some(width), "{dialect:?}");
            assert_eq!(Dialect::detect(&file.seen), Some(dialect));
        }
        let hv = Dialect::Mainline.line(ObjectKind::Hypervisor, "HvNonEssentialPagesForDump", 0);
        let file = parse(ObjectKind::Hypervisor, hv.as_bytes(), &mut UnknownNames::new());
        assert_eq!(names(&file), [("HvNonEssentialPagesForDump", 0)]);
        assert_eq!(file.seen.vp_width, None, "only a VP file's width tells the dialects apart");
    }

    #[test]
    fn bad_lines_are_skipped_with_their_reason() {
        let long = format!("{}: 1\n", "X".repeat(100));
        let text = format!(
            "LpGlobalTime   : 5\n{long}garbage\nLp Bad : 1\nLpA : 18446744073709551616\nLpB : -1\n\
             LpC : 12abc\nGlobalTime   : 6\nLpTotalRunTime : 12"
        );
        let mut bytes = text.into_bytes();
        // A byte that is not UTF-8 in the name of its own line.
        bytes.splice(0..0, b"Lp\xfeX : 1\n".iter().copied());
        let file = parse(ObjectKind::LogicalProcessor, &bytes, &mut UnknownNames::new());
        assert_eq!(names(&file), [("LpGlobalTime", 5)]);
        let reasons: Vec<_> = file.skipped.iter().map(|s| (s.line, s.reason.clone())).collect();
        assert_eq!(
            reasons,
            [
                (1, SkipReason::NotUtf8),
                (3, SkipReason::TooLong(103)),
                (4, SkipReason::NoSeparator),
                (5, SkipReason::BadName),
                (6, SkipReason::BadValue("18446744073709551616".into())),
                (7, SkipReason::BadValue("-1".into())),
                (8, SkipReason::BadValue("12abc".into())),
                // The same counter without its prefix is the same name.
                (9, SkipReason::Duplicate),
                (10, SkipReason::Truncated),
            ]
        );
        assert!(file.skipped.iter().all(|s| !s.reason.to_string().is_empty()));
    }

    #[test]
    fn names_no_kernel_prints_are_kept_within_one_readings_budget() {
        let mut unknown = UnknownNames::new();
        let file_of = |names: std::ops::Range<usize>| -> String {
            names.map(|i| Dialect::Mainline.line(ObjectKind::Vp, &format!("VpNew{i}"), i as u64)).collect()
        };
        // The first file brings more new names than are kept; the known one is always kept.
        let text =
            format!("{}{}", file_of(0..100), Dialect::Mainline.line(ObjectKind::Vp, "VpTotalRunTime", 9));
        let first = parse(ObjectKind::Vp, text.as_bytes(), &mut unknown);
        assert_eq!(first.counters.len(), MAX_UNKNOWN_NAMES + 1);
        assert_eq!(first.counters.last().map(|(n, v)| (n.as_ref(), *v)), Some(("VpTotalRunTime", 9)));
        assert_eq!(unknown.dropped(), 100 - MAX_UNKNOWN_NAMES);
        // Later files keep values of the names already kept, until the values' budget is spent.
        let mut kept = first.counters.len() - 1;
        while kept < MAX_UNKNOWN_VALUES {
            kept += parse(ObjectKind::Vp, file_of(0..100).as_bytes(), &mut unknown).counters.len();
        }
        assert_eq!(kept, MAX_UNKNOWN_VALUES);
        assert!(parse(ObjectKind::Vp, file_of(0..100).as_bytes(), &mut unknown).counters.is_empty());
        let known = Dialect::Microsoft.line(ObjectKind::Vp, "Placeholder10", 3);
        assert_eq!(parse(ObjectKind::Vp, known.as_bytes(), &mut unknown).counters.len(), 1);
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_parse_within_the_bounds(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..4096)) {
            let file = parse_vp(&bytes);
            proptest::prop_assert!(file.counters.len() + file.skipped.len() <= MAX_LINES + 1);
            proptest::prop_assert!(file.counters.iter().all(|(n, _)| !n.is_empty() && n.len() <= MAX_NAME_BYTES));
        }

        #[test]
        fn kernel_lines_read_back_exactly(
            entries in proptest::collection::btree_map("[A-Za-z][A-Za-z0-9]{0,41}", proptest::prelude::any::<u64>(), 0..64)
        ) {
            let text: String = entries.iter().map(|(n, v)| Dialect::Mainline.line(ObjectKind::Vp, n, *v)).collect();
            let file = parse_vp(text.as_bytes());
            proptest::prop_assert!(file.skipped.iter().all(|s| s.reason == SkipReason::Duplicate));
            let back: std::collections::BTreeMap<String, u64> =
                file.counters.into_iter().map(|(n, v)| (n.into_owned(), v)).collect();
            // A name and the same counter without its prefix are one name: the first printed wins.
            let mut expected = std::collections::BTreeMap::new();
            for (n, v) in &entries {
                let name = canonical(ObjectKind::Vp, n).map_or_else(|| n.clone(), str::to_owned);
                expected.entry(name).or_insert(*v);
            }
            proptest::prop_assert_eq!(back, expected);
        }
    }

    #[test]
    fn a_huge_file_is_read_only_up_to_its_cap() {
        let one = Dialect::Mainline.line(ObjectKind::Vp, "VpX", 1);
        let text = one.repeat(MAX_FILE_BYTES / one.len() + 10);
        let file = parse_vp(text.as_bytes());
        assert!(file.capped);
        assert_eq!(file.counters.len(), 1, "every other line repeats the name");
        assert!(file.skipped.len() <= MAX_LINES);
        assert_eq!(file.skipped.last().map(|s| &s.reason), Some(&SkipReason::TooManyLines));
    }
}
