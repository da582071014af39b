//! Values an instance keeps by name beside its pages: those of counters the catalog has no place
//! for. The mshv observer (`hvstats-mshv`) publishes the Microsoft Hypervisor's ~150 VP counters
//! seed 001 never had (CPU wait buckets, forwarded intercepts, nested-virtualization emulation,
//! VTL dispatch …) and names of builds hvstats does not know this way, so readers can show them by
//! name. The format lives here, with the readers, so a reader needs nothing of the importer.
//!
//! The pages hold the catalog's counters at fixed places; these have no place there, and no fixed
//! set, so they travel as text in the instance's side file `<instance>.unmapped`
//! ([`crate::publish::UNMAPPED_SUFFIX`]), replaced whole each interval:
//!
//! ```text
//! hvstats-unmapped 1
//! @<object>
//! <name>\t<value>
//! …
//! ```
//!
//! each object's values under its `@` line, where `<object>` is `hypervisor`, `lp/<n>`,
//! `partition/<id>` or `partition/<id>/vp/<n>`, with the ids the pages are published under. A reader believes the file as it believes the arena
//! (same owner, locked by the publisher), reads at most [`MAX_BYTES`] of it, and skips lines it
//! cannot parse.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;

use crate::attach::{AttachError, Instance};
use crate::publish::UNMAPPED_SUFFIX;
use crate::runtime_dir::{self, Dir, Use};

/// The first line of the file.
pub const MAGIC_LINE: &str = "hvstats-unmapped 1";
/// The longest name kept (longer lines are skipped).
pub const MAX_NAME_BYTES: usize = 64;
/// The most bytes written or read: 16 MiB, about 3,000 VPs of ~145 names each (about 5 KiB a VP,
/// measured); past it the rest are not published, and the observer says so once.
pub const MAX_BYTES: usize = 16 << 20;

/// The object a value belongs to, with its published ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectRef {
    /// The hypervisor object (`hypervisor` in the file).
    Hypervisor,
    /// LP `n`.
    Lp(u32),
    /// Partition `id`.
    Partition(u64),
    /// VP `n` of partition `id`.
    Vp(u64, u32),
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ObjectRef::Hypervisor => f.write_str("hypervisor"),
            ObjectRef::Lp(n) => write!(f, "lp/{n}"),
            ObjectRef::Partition(id) => write!(f, "partition/{id}"),
            ObjectRef::Vp(id, n) => write!(f, "partition/{id}/vp/{n}"),
        }
    }
}

impl ObjectRef {
    /// Parses the [`Display`](fmt::Display) form.
    pub fn parse(s: &str) -> Option<Self> {
        let parts: Vec<&str> = s.split('/').collect();
        let num = |t: &str| t.parse::<u64>().ok().filter(|n| n.to_string() == t);
        match parts.as_slice() {
            ["hypervisor"] => Some(ObjectRef::Hypervisor),
            ["lp", n] => Some(ObjectRef::Lp(u32::try_from(num(n)?).ok()?)),
            ["partition", id] => Some(ObjectRef::Partition(num(id)?)),
            ["partition", id, "vp", n] => Some(ObjectRef::Vp(num(id)?, u32::try_from(num(n)?).ok()?)),
            _ => None,
        }
    }
}

/// Unmapped values by object, each a list of (name, value) in file order.
pub type Unmapped = BTreeMap<ObjectRef, Vec<(String, u64)>>;

/// The file's text, stopping before [`MAX_BYTES`] (whole lines only). Returns the text and
/// whether every value fitted.
pub fn encode(values: &Unmapped) -> (String, bool) {
    let mut encoder = Encoder::new();
    for (object, counters) in values {
        encoder.object(*object, counters.iter().map(|(n, v)| (n.as_str(), *v)));
    }
    encoder.finish()
}

/// The file's text written object by object, so a writer need not gather every value first;
/// nothing is added past [`MAX_BYTES`].
#[derive(Debug)]
pub struct Encoder {
    text: String,
    complete: bool,
}

impl Default for Encoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Encoder {
    /// An empty file: its first line only.
    pub fn new() -> Self {
        Self { text: format!("{MAGIC_LINE}\n"), complete: true }
    }

    /// Adds `at`'s values (an object with none adds nothing).
    pub fn object<'a>(&mut self, at: ObjectRef, values: impl IntoIterator<Item = (&'a str, u64)>) {
        use std::fmt::Write;
        let mut values = values.into_iter().peekable();
        if values.peek().is_none() || !self.complete {
            return;
        }
        let head = format!("@{at}\n");
        if self.text.len() + head.len() > MAX_BYTES {
            self.complete = false;
            return;
        }
        self.text.push_str(&head);
        for (name, value) in values {
            let before = self.text.len();
            let _ = writeln!(self.text, "{name}\t{value}");
            if self.text.len() > MAX_BYTES {
                self.text.truncate(before);
                self.complete = false;
                return;
            }
        }
    }

    /// The text, and whether every value fitted.
    pub fn finish(self) -> (String, bool) {
        (self.text, self.complete)
    }
}

/// Parses the file's bytes (at most [`MAX_BYTES`]); `None` when it is not such a file. Lines that
/// do not parse are skipped.
pub fn decode(bytes: &[u8]) -> Option<Unmapped> {
    let bytes = &bytes[..bytes.len().min(MAX_BYTES)];
    let text = String::from_utf8_lossy(bytes);
    let mut lines = text.split('\n');
    if lines.next()? != MAGIC_LINE {
        return None;
    }
    let mut values = Unmapped::new();
    // The object of the lines that follow (`None` after an `@` line that does not parse: its
    // values are skipped with it).
    let mut object = None;
    for line in lines {
        if let Some(o) = line.strip_prefix('@') {
            object = ObjectRef::parse(o);
            continue;
        }
        let Some(at) = object else { continue };
        let Some((name, value)) = line.split_once('\t') else { continue };
        let Ok(value) = value.parse::<u64>() else { continue };
        if name.is_empty() || name.len() > MAX_NAME_BYTES {
            continue;
        }
        values.entry(at).or_default().push((name.to_owned(), value));
    }
    Some(values)
}

/// Reads `instance`'s side file: `Ok(None)` when it publishes none (it is no mshv observer).
///
/// # Errors
/// When the file exists but cannot be opened or is not believed.
pub fn read(instance: &Instance) -> Result<Option<Unmapped>, AttachError> {
    let Some(dir_path) = instance.path().parent() else { return Ok(None) };
    let dir = Dir::open(dir_path, Use::Read)?;
    let name = format!("{}{UNMAPPED_SUFFIX}", instance.name());
    let dir_owner = runtime_dir::fstat(dir.fd()).map(|st| st.st_uid).unwrap_or_else(|_| runtime_dir::euid());
    // The publisher replaces the file each interval and then lets go of the old one's lock: a
    // file opened just before a replacement is found unlocked. Such a file, no longer under the
    // name, is opened again (a few times: the publisher replaces it every interval, not faster).
    let mut tries = 0;
    let file = loop {
        let file = match dir.open_file(&name, false) {
            Ok(f) => f,
            Err(e) if e.io_kind() == Some(std::io::ErrorKind::NotFound) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        match crate::trust::verify(&file, instance.pid(), dir_owner) {
            Ok(()) => break file,
            Err(_) if tries < 3 && replaced(&dir, &name, &file) => tries += 1,
            Err(why) => return Err(AttachError::Untrusted { path: dir_path.join(&name), why }),
        }
    };
    let mut bytes = Vec::new();
    file.take(MAX_BYTES as u64)
        .read_to_end(&mut bytes)
        .map_err(|source| AttachError::Page { path: dir_path.join(&name), source })?;
    Ok(decode(&bytes))
}

/// True when `name` in `dir` is no longer the file `file` (it was replaced or removed since).
fn replaced(dir: &Dir, name: &str, file: &std::fs::File) -> bool {
    use std::os::fd::AsFd;
    let Ok(opened) = runtime_dir::fstat(file.as_fd()) else { return false };
    match dir.open_file(name, false) {
        Ok(now) => runtime_dir::fstat(now.as_fd())
            .is_ok_and(|now| (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino)),
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_junk_lines_are_skipped() {
        let mut values = Unmapped::new();
        values.insert(ObjectRef::Hypervisor, vec![("HvSubsumedPages".into(), 3)]);
        values.insert(ObjectRef::Vp(u64::MAX, 2), vec![("VpVtl1DispatchCount".into(), u64::MAX)]);
        values.insert(ObjectRef::Lp(7), vec![("LpRootVpIndex".into(), 7), ("LpPlaceholder1".into(), 0)]);
        let (text, complete) = encode(&values);
        assert!(complete);
        assert!(
            text.contains(
                "@partition/18446744073709551615/vp/2\nVpVtl1DispatchCount\t18446744073709551615\n"
            )
        );
        assert_eq!(decode(text.as_bytes()), Some(values.clone()));
        // An object that does not parse takes its values with it; bad value lines are skipped.
        let junk = format!("{text}@lp/x\nA\t1\n@lp/7\nB\t-1\nB\nB\t1\textra\n\t2\n@hypervisor\nC 3");
        assert_eq!(decode(junk.as_bytes()), Some(values));
        assert_eq!(decode(b"not it\n"), None);
        assert_eq!(decode(b""), None);
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_decode_without_panicking(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048)) {
            let mut with_magic = format!("{MAGIC_LINE}\n").into_bytes();
            with_magic.extend_from_slice(&bytes);
            let values = decode(&with_magic).unwrap();
            proptest::prop_assert!(values.values().flatten().all(|(n, _)| !n.is_empty()));
            let _ = decode(&bytes);
        }
    }

    #[test]
    fn encoding_stops_at_the_cap_on_a_whole_line() {
        let mut values = Unmapped::new();
        let many: Vec<(String, u64)> =
            (0..MAX_BYTES / 10).map(|i| (format!("VpName{i}"), i as u64)).collect();
        values.insert(ObjectRef::Vp(1, 0), many);
        let (text, complete) = encode(&values);
        assert!(!complete && text.len() <= MAX_BYTES && text.ends_with('\n'));
    }
}
