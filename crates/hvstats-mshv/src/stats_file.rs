//! One `stats` file of the mshv debugfs tree: lines of `%-Ws: %llu`, a name padded to a width
//! and its raw 64-bit value in decimal.
//!
//! The file is the kernel's, but it is read as untrusted text: a line the kernel could not have
//! printed (too long, no `: `, a name that is not an identifier, a value that is not a u64, a
//! name printed twice) and a last line cut before its newline (a read racing the writer, or a
//! truncated copy) are skipped, each with its reason; nothing panics and nothing grows past
//! [`MAX_FILE_BYTES`] (a file is read at most that far) and [`MAX_LINES`].

use std::fmt;

/// The most bytes of one file that are read: a VP file of 212 counters is about 14 KiB.
pub const MAX_FILE_BYTES: usize = 64 * 1024;
/// The longest line the kernel can print: a name padded to 43 (longer names are not truncated,
/// so allow a newer build's up to 64), `": "`, 20 digits.
pub const MAX_LINE_BYTES: usize = 64 + 2 + 20;
/// The longest name kept (what the side file of unmapped values accepts).
pub const MAX_NAME_BYTES: usize = hvstats::unmapped::MAX_NAME_BYTES;
/// The most lines of one file considered (the VP table has 212 entries; ids fit a 4 KiB page).
pub const MAX_LINES: usize = 512;

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
    /// Each name with its value.
    pub counters: Vec<(String, u64)>,
    /// Lines that were not counters.
    pub skipped: Vec<Skipped>,
    /// True when the file was longer than [`MAX_FILE_BYTES`] and only that much was parsed.
    pub capped: bool,
}

impl StatsFile {
    /// The value printed for `name`.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.counters.iter().find(|(n, _)| n == name).map(|&(_, v)| v)
    }
}

/// Parses the bytes of one file (at most [`MAX_FILE_BYTES`] of them are looked at).
pub fn parse(bytes: &[u8]) -> StatsFile {
    let mut file = StatsFile::default();
    let bytes = if bytes.len() > MAX_FILE_BYTES {
        file.capped = true;
        &bytes[..MAX_FILE_BYTES]
    } else {
        bytes
    };
    let mut seen = std::collections::HashSet::new();
    let mut rest = bytes;
    let mut number = 0;
    while !rest.is_empty() {
        number += 1;
        let (line, complete) = match rest.iter().position(|&b| b == b'\n') {
            Some(end) => {
                let line = &rest[..end];
                rest = &rest[end + 1..];
                (line, true)
            }
            None => (std::mem::take(&mut rest), false),
        };
        let skip = |reason| Skipped { line: number, reason };
        if number > MAX_LINES {
            file.skipped.push(skip(SkipReason::TooManyLines));
            break;
        }
        if line.len() > MAX_LINE_BYTES {
            file.skipped.push(skip(SkipReason::TooLong(line.len())));
            continue;
        }
        // A capped file's last line is cut by us, not by the writer: the same reason holds.
        if !complete {
            file.skipped.push(skip(SkipReason::Truncated));
            continue;
        }
        match parse_line(line) {
            Ok((name, value)) => {
                if seen.insert(name.to_owned()) {
                    file.counters.push((name.to_owned(), value));
                } else {
                    file.skipped.push(skip(SkipReason::Duplicate));
                }
            }
            Err(reason) => file.skipped.push(skip(reason)),
        }
    }
    file
}

/// One complete line, without its newline.
fn parse_line(line: &[u8]) -> Result<(&str, u64), SkipReason> {
    let line = std::str::from_utf8(line).map_err(|_| SkipReason::NotUtf8)?;
    let (name, value) = line.split_once(": ").ok_or(SkipReason::NoSeparator)?;
    let name = name.trim_end_matches(' ');
    let identifier = name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if name.is_empty() || name.len() > MAX_NAME_BYTES || !identifier {
        return Err(SkipReason::BadName);
    }
    let digits = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
    match value.parse::<u64>() {
        Ok(v) if digits => Ok((name, v)),
        _ => Err(SkipReason::BadValue(value.chars().take(24).collect())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::line;
    use hvstats_abi::ObjectKind;

    #[test]
    fn the_kernel_format_parses_at_every_width() {
        let mut text = String::new();
        text += &line(ObjectKind::Vp, "VpCpuidInstructionsCount", 7);
        text += &line(ObjectKind::Vp, "VpFlushGuestPhysicalAddressSpaceHypercalls", u64::MAX);
        text += &line(ObjectKind::Hypervisor, "HvNonEssentialPagesForDump", 0);
        assert!(text.starts_with("VpCpuidInstructionsCount                   : 7\n"));
        let file = parse(text.as_bytes());
        assert_eq!(
            file.counters,
            [
                ("VpCpuidInstructionsCount".to_owned(), 7),
                ("VpFlushGuestPhysicalAddressSpaceHypercalls".to_owned(), u64::MAX),
                ("HvNonEssentialPagesForDump".to_owned(), 0),
            ]
        );
        assert!(file.skipped.is_empty() && !file.capped);
    }

    #[test]
    fn bad_lines_are_skipped_with_their_reason() {
        let long = format!("{}: 1\n", "X".repeat(100));
        let text = format!(
            "LpGlobalTime   : 5\n{long}garbage\nLp Bad : 1\nLpA : 18446744073709551616\nLpB : -1\n\
             LpC : 12abc\nLpGlobalTime   : 6\nLpTotalRunTime : 12"
        );
        let mut bytes = text.into_bytes();
        // A byte that is not UTF-8 in the name of its own line.
        bytes.splice(0..0, b"Lp\xfeX : 1\n".iter().copied());
        let file = parse(&bytes);
        assert_eq!(file.counters, [("LpGlobalTime".to_owned(), 5)]);
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
                (9, SkipReason::Duplicate),
                (10, SkipReason::Truncated),
            ]
        );
        assert!(file.skipped.iter().all(|s| !s.reason.to_string().is_empty()));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_parse_within_the_bounds(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..4096)) {
            let file = parse(&bytes);
            proptest::prop_assert!(file.counters.len() + file.skipped.len() <= MAX_LINES + 1);
            proptest::prop_assert!(file.counters.iter().all(|(n, _)| !n.is_empty() && n.len() <= MAX_NAME_BYTES));
        }

        #[test]
        fn kernel_lines_read_back_exactly(
            entries in proptest::collection::btree_map("[A-Za-z][A-Za-z0-9]{0,41}", proptest::prelude::any::<u64>(), 0..64)
        ) {
            let text: String = entries.iter().map(|(n, v)| line(ObjectKind::Vp, n, *v)).collect();
            let file = parse(text.as_bytes());
            proptest::prop_assert!(file.skipped.is_empty());
            let back: std::collections::BTreeMap<String, u64> = file.counters.into_iter().collect();
            proptest::prop_assert_eq!(back, entries);
        }
    }

    #[test]
    fn a_huge_file_is_read_only_up_to_its_cap() {
        let one = line(ObjectKind::Vp, "VpX", 1);
        let text = one.repeat(MAX_FILE_BYTES / one.len() + 10);
        let file = parse(text.as_bytes());
        assert!(file.capped);
        assert_eq!(file.counters.len(), 1, "every other line repeats the name");
        assert!(file.skipped.len() <= MAX_LINES);
        assert_eq!(file.skipped.last().map(|s| &s.reason), Some(&SkipReason::TooManyLines));
    }
}
