//! The on-disk (in-memory) format of an arena file: its header, its chunks, and the index entry
//! that describes each page, shared by the writer ([`crate::arena`]) and readers
//! ([`crate::attach`]).
//!
//! ```text
//! offset 0          header page: magic, format, geometry, chunk count, layout sequence,
//!                   owner pid, creation time, role, the last refresh and its period, the
//!                   instance's description
//! 4096 + c × CHUNK  chunk c: CHUNK_SLOTS index entries (ENTRY_BYTES each, INDEX_PAGES pages),
//!                   then CHUNK_SLOTS stats pages; slot s = c × CHUNK_SLOTS + i owns entry i and
//!                   page i of chunk c
//! ```
//!
//! Every word is a little-endian u64 accessed as an atomic. An entry is guarded by its own
//! sequence word (a seqlock: odd while the writer changes it), and a page is believed only if the
//! entry's sequence is the same, and even, before and after the copy: so a reader never sees a
//! torn entry, and never takes the page of a reused slot for the old object (the generation
//! changes when a slot gets a new object). The header's layout sequence changes whenever any
//! entry does, so a reader notices additions, removals and state changes with one load.
//!
//! Nothing here is trusted by a reader: [`Header::decode`] and [`Entry::decode`] check every
//! field and the reader takes sizes from the file itself.

use std::sync::atomic::{AtomicU64, Ordering, fence};

use hvstats_abi::page::PAGE_SLOTS;
use hvstats_abi::{ObjectKind, PAGE_SIZE};

use crate::patience::Patience;

/// `HVSTARN1`: the first word of every arena file.
pub const MAGIC: u64 = u64::from_le_bytes(*b"HVSTARN1");
/// The format this build writes and reads. Format 2: an unavailable-counter bitmap has a bit per
/// counter (its position among its kind's counters), not per page slot.
pub const FORMAT: u64 = 2;
/// Objects per chunk.
pub const CHUNK_SLOTS: usize = 64;
/// Bytes per index entry.
pub const ENTRY_BYTES: usize = 256;
/// Words per index entry.
pub const ENTRY_WORDS: usize = ENTRY_BYTES / 8;
/// Pages of index at the start of each chunk.
pub const INDEX_PAGES: usize = CHUNK_SLOTS * ENTRY_BYTES / PAGE_SIZE;
/// Bytes per chunk: its index, then its pages.
pub const CHUNK_BYTES: usize = (INDEX_PAGES + CHUNK_SLOTS) * PAGE_SIZE;
/// Bytes of the arena header before the first chunk: one page.
pub const HEADER_BYTES: usize = PAGE_SIZE;
/// Longest description kind, in bytes.
pub const KIND_BYTES: usize = 64;
/// Longest description name, in bytes.
pub const NAME_BYTES: usize = 192;
/// Longest partition name or stop reason, in bytes.
pub const TEXT_BYTES: usize = 64;
/// Counters of one kind that can be declared unavailable: the first this many in catalog order.
pub const UNAVAILABLE_COUNTERS: usize = 256;
/// The words of a partition entry's own bitmap that hold bits: the partition page has 8 counters,
/// so the upper two words carry the VM's UUID instead (readers of the bitmap alone never look at
/// bits past the kind's counters).
pub const PARTITION_BITMAP_WORDS: usize = 2;
const _: () = {
    let (mut rows, mut i) = (0, 0);
    while i < hvstats_abi::CATALOG.len() {
        if hvstats_abi::CATALOG[i].id.kind as u8 == ObjectKind::Partition as u8 {
            rows += 1;
        }
        i += 1;
    }
    assert!(rows <= PARTITION_BITMAP_WORDS * 64, "a partition counter's bit would fall on the UUID");
};

/// The words of a partition entry's VP bitmap that hold bits: the VP page has fewer than 192
/// counters, so the last word carries the VM's Hyper-V enlightenments instead.
pub const VP_BITMAP_WORDS: usize = 3;
const _: () = {
    let (mut rows, mut i) = (0, 0);
    while i < hvstats_abi::CATALOG.len() {
        if hvstats_abi::CATALOG[i].id.kind as u8 == ObjectKind::Vp as u8 {
            rows += 1;
        }
        i += 1;
    }
    assert!(rows <= VP_BITMAP_WORDS * 64, "a VP counter's bit would fall on the enlightenments");
};

/// Header words.
pub(crate) mod hw {
    pub const MAGIC: usize = 0;
    pub const FORMAT: usize = 1;
    pub const CHUNK_SLOTS: usize = 2;
    pub const ENTRY_BYTES: usize = 3;
    pub const CHUNKS: usize = 4;
    pub const LAYOUT_SEQ: usize = 5;
    pub const PID: usize = 6;
    pub const CREATED_MS: usize = 7;
    pub const ROLE: usize = 8;
    /// When the publisher last refreshed its counters, in µs since the Unix epoch (0: never).
    pub const REFRESHED_US: usize = 9;
    /// How long before that it had refreshed them, in µs (0: not twice yet): the cadence at which
    /// its counters move, which a reader's interval must not undercut.
    pub const REFRESH_PERIOD_US: usize = 10;
    /// Byte offset of the description's kind, then its name.
    pub const KIND_OFFSET: usize = 512;
    pub const NAME_OFFSET: usize = KIND_OFFSET + super::KIND_BYTES;
}

/// Entry words.
pub(crate) mod ew {
    pub const SEQ: usize = 0;
    pub const GENERATION: usize = 1;
    pub const KIND: usize = 2;
    pub const STATE: usize = 3;
    pub const ID: usize = 4;
    pub const INDEX: usize = 5;
    pub const VP_COUNT: usize = 6;
    pub const VMM: usize = 7;
    pub const UNAVAILABLE_PARTITION: usize = 8;
    /// Partition entries: the VM's UUID, two words inside the partition bitmap's upper half (bits
    /// 128..256, which no partition counter has: see [`super::PARTITION_BITMAP_WORDS`]).
    pub const UUID: usize = 10;
    pub const UNAVAILABLE_VP: usize = 12;
    /// Partition entries: the VM's Hyper-V enlightenments (`hvstats_abi::hyperv_features`), the
    /// VP bitmap's last word (see [`super::VP_BITMAP_WORDS`]).
    pub const HYPERV: usize = 15;
    pub const NAME: usize = 16;
    pub const REASON: usize = 24;
}

/// Byte offset of slot `slot`'s index entry.
pub const fn entry_offset(slot: usize) -> usize {
    HEADER_BYTES + (slot / CHUNK_SLOTS) * CHUNK_BYTES + (slot % CHUNK_SLOTS) * ENTRY_BYTES
}

/// Byte offset of slot `slot`'s stats page.
pub const fn page_offset(slot: usize) -> usize {
    HEADER_BYTES + (slot / CHUNK_SLOTS) * CHUNK_BYTES + (INDEX_PAGES + slot % CHUNK_SLOTS) * PAGE_SIZE
}

/// Bytes of an arena of `chunks` chunks.
pub const fn file_bytes(chunks: usize) -> usize {
    HEADER_BYTES + chunks * CHUNK_BYTES
}

/// Which objects an arena file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Partitions and VPs (mode 0600, or 0640 with a reader group).
    Partitions,
    /// The hypervisor and LPs (always 0600: global pages are the root's).
    Global,
}

impl Role {
    fn code(self) -> u64 {
        match self {
            Role::Partitions => 1,
            Role::Global => 2,
        }
    }
}

/// The description kind of an observer of other processes' VMs: its instance's hypervisor page
/// carries the observer's health (the catalog's rows of [`hvstats_abi::source::Source::Observer`]),
/// which every other instance declares unavailable.
pub const OBSERVER_KIND: &str = "observer";

/// The description kind of an importer of the Microsoft Hypervisor's own statistics (mshv):
/// every count it publishes is taken at its refreshes.
pub const MSHV_KIND: &str = "mshv";

/// What a process says about itself when it publishes an instance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InstanceDescription {
    /// What publishes it, e.g. `hvstats run` or `observer` (at most [`KIND_BYTES`] bytes).
    pub kind: String,
    /// A free name (at most [`NAME_BYTES`] bytes).
    pub name: String,
}

impl InstanceDescription {
    /// True for a publisher of partitions it runs itself (not an observer of other processes'
    /// VMs, nor an importer): its VPs' run loops write the exits they handle into the pages as
    /// they happen, so those counts are as of the moment they are read, not of a refresh.
    pub fn runs_its_partitions(&self) -> bool {
        self.kind != OBSERVER_KIND && self.kind != MSHV_KIND
    }
}

/// An arena header as a reader found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Chunks the writer has made (the reader also bounds it by the file's size).
    pub chunks: u64,
    /// The layout sequence: changes with every index change (odd while one is under way).
    pub layout_seq: u64,
    /// The owning process, as its own PID namespace numbers it.
    pub pid: u64,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// Which objects it holds.
    pub role: Role,
    /// The publisher's description.
    pub description: InstanceDescription,
}

/// Why an arena header or entry was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    /// Not an arena file.
    #[error("not an hvstats arena (bad magic)")]
    Magic,
    /// Another format.
    #[error("arena format {0} (this build reads {FORMAT})")]
    Format(u64),
    /// Another geometry.
    #[error("arena geometry {slots} slots × {bytes} bytes (this build reads {CHUNK_SLOTS} × {ENTRY_BYTES})")]
    Geometry {
        /// Slots per chunk found.
        slots: u64,
        /// Entry bytes found.
        bytes: u64,
    },
    /// An unknown role.
    #[error("unknown arena role {0}")]
    Role(u64),
    /// The file is shorter than a header.
    #[error("arena shorter than its header ({0} bytes)")]
    Short(usize),
}

impl Header {
    /// Decodes a header from its first [`HEADER_BYTES`] bytes.
    ///
    /// # Errors
    /// When any field is not one this build writes.
    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        if bytes.len() < HEADER_BYTES {
            return Err(FormatError::Short(bytes.len()));
        }
        let word = |i: usize| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        if word(hw::MAGIC) != MAGIC {
            return Err(FormatError::Magic);
        }
        if word(hw::FORMAT) != FORMAT {
            return Err(FormatError::Format(word(hw::FORMAT)));
        }
        if word(hw::CHUNK_SLOTS) != CHUNK_SLOTS as u64 || word(hw::ENTRY_BYTES) != ENTRY_BYTES as u64 {
            return Err(FormatError::Geometry { slots: word(hw::CHUNK_SLOTS), bytes: word(hw::ENTRY_BYTES) });
        }
        let role = match word(hw::ROLE) {
            1 => Role::Partitions,
            2 => Role::Global,
            other => return Err(FormatError::Role(other)),
        };
        Ok(Self {
            chunks: word(hw::CHUNKS),
            layout_seq: word(hw::LAYOUT_SEQ),
            pid: word(hw::PID),
            created_unix_ms: word(hw::CREATED_MS),
            role,
            description: InstanceDescription {
                kind: text(&bytes[hw::KIND_OFFSET..hw::KIND_OFFSET + KIND_BYTES]),
                name: text(&bytes[hw::NAME_OFFSET..hw::NAME_OFFSET + NAME_BYTES]),
            },
        })
    }

    /// The header words of a new arena (the description goes in by [`encode_text`]).
    pub(crate) fn initial_words(role: Role, pid: u64, created_unix_ms: u64) -> [(usize, u64); 9] {
        [
            (hw::MAGIC, MAGIC),
            (hw::FORMAT, FORMAT),
            (hw::CHUNK_SLOTS, CHUNK_SLOTS as u64),
            (hw::ENTRY_BYTES, ENTRY_BYTES as u64),
            (hw::CHUNKS, 0),
            (hw::LAYOUT_SEQ, 0),
            (hw::PID, pid),
            (hw::CREATED_MS, created_unix_ms),
            (hw::ROLE, role.code()),
        ]
    }
}

/// What an index entry says an object's state is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjectState {
    /// Counting.
    Active,
    /// Stopped (a partition whose VPs faulted or that was stopped): its pages hold final values.
    Stopped {
        /// Why, for people.
        reason: String,
    },
}

/// One live index entry as a reader found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Changes each time the slot gets a new object.
    pub generation: u64,
    /// Hypervisor, LP, partition or VP: what `id` and `index` mean.
    pub kind: ObjectKind,
    /// Active, or stopped with a reason.
    pub state: ObjectState,
    /// Partition id (partition, VP), LP index (LP), 0 (hypervisor).
    pub id: u64,
    /// VP index (VP), host CPU (LP), 0 otherwise.
    pub index: u32,
    /// VPs the partition was created with (partition entries; a number someone wrote: a reader
    /// counts the VP entries it finds instead).
    pub vp_count: u64,
    /// Partition entries: the slots of partition counters no source maintains, as a bitmap.
    /// Hypervisor and LP entries: the slots of their own counters no source maintains.
    pub unavailable_partition: [u64; 4],
    /// Partition entries: the slots of VP counters no source maintains, as a bitmap.
    pub unavailable_vp: [u64; 4],
    /// Partition entries: the partition's name.
    pub name: String,
    /// Partition entries of an observer: the VMM process running the VM.
    pub vmm: Option<crate::vmm::VmmProcess>,
    /// Partition entries of an observer: the VM's UUID, when its VMM has one.
    pub uuid: Option<crate::vmm::VmUuid>,
    /// The VM's Hyper-V enlightenments (`hvstats_abi::hyperv_features`; 0: not known).
    pub hyperv_enlightenments: u64,
}

/// Entry states.
pub(crate) mod state {
    pub const FREE: u64 = 0;
    pub const ACTIVE: u64 = 1;
    pub const STOPPED: u64 = 2;
}

/// The code of an object kind in an entry (0 is a free slot).
pub(crate) fn kind_code(kind: ObjectKind) -> u64 {
    kind as u64 + 1
}

fn kind_of(code: u64) -> Option<ObjectKind> {
    ObjectKind::ALL.get(usize::try_from(code.checked_sub(1)?).ok()?).copied()
}

impl Entry {
    /// Decodes a stable copy of an entry's words: `None` for a free slot.
    ///
    /// # Errors
    /// When the kind or state is unknown.
    pub fn decode(words: &[u64; ENTRY_WORDS]) -> Result<Option<Self>, FormatError> {
        let st = words[ew::STATE];
        if st == state::FREE || words[ew::KIND] == 0 {
            return Ok(None);
        }
        let kind = kind_of(words[ew::KIND]).ok_or(FormatError::Role(words[ew::KIND]))?;
        let bytes =
            |from: usize| -> Vec<u8> { words[from..from + 8].iter().flat_map(|w| w.to_le_bytes()).collect() };
        let state = match st {
            state::ACTIVE => ObjectState::Active,
            state::STOPPED => ObjectState::Stopped { reason: text(&bytes(ew::REASON)) },
            other => return Err(FormatError::Role(other)),
        };
        let four = |from: usize| [words[from], words[from + 1], words[from + 2], words[from + 3]];
        Ok(Some(Self {
            generation: words[ew::GENERATION],
            kind,
            state,
            id: words[ew::ID],
            index: words[ew::INDEX] as u32,
            vp_count: words[ew::VP_COUNT],
            unavailable_partition: if kind == ObjectKind::Partition {
                [words[ew::UNAVAILABLE_PARTITION], words[ew::UNAVAILABLE_PARTITION + 1], 0, 0]
            } else {
                four(ew::UNAVAILABLE_PARTITION)
            },
            unavailable_vp: {
                let mut vp = four(ew::UNAVAILABLE_VP);
                vp[VP_BITMAP_WORDS..].fill(0);
                vp
            },
            hyperv_enlightenments: if kind == ObjectKind::Partition { words[ew::HYPERV] } else { 0 },
            name: if kind == ObjectKind::Partition { text(&bytes(ew::NAME)) } else { String::new() },
            vmm: if kind == ObjectKind::Partition {
                crate::vmm::VmmProcess::from_word(words[ew::VMM])
            } else {
                None
            },
            uuid: if kind == ObjectKind::Partition {
                crate::vmm::VmUuid::from_words([words[ew::UUID], words[ew::UUID + 1]])
            } else {
                None
            },
        }))
    }
}

/// The bit of an unavailable-counter bitmap that stands for the counter at page slot `slot` of a
/// `kind` page: the counter's position among the kind's counters in catalog order. (A bit per
/// slot ran out: a histogram spans 33 slots, and the VP page's last ones start past slot 256.)
pub fn unavailable_bit(kind: ObjectKind, slot: usize) -> Option<usize> {
    // Readers ask this for every counter of every object they decode: a table indexed by kind and
    // slot, built once, not a map to hash into.
    use std::sync::OnceLock;
    const NONE: u16 = u16::MAX;
    static BITS: OnceLock<Vec<[u16; PAGE_SLOTS]>> = OnceLock::new();
    let bits = BITS.get_or_init(|| {
        ObjectKind::ALL
            .iter()
            .map(|&k| {
                let mut bits = [NONE; PAGE_SLOTS];
                for (bit, c) in hvstats_abi::catalog::counters_of(k).enumerate() {
                    if let (Some(at), Ok(bit)) = (bits.get_mut(c.id.slot()), u16::try_from(bit)) {
                        *at = bit;
                    }
                }
                bits
            })
            .collect()
    });
    let bit = *bits.get(kind as usize)?.get(slot)?;
    (bit != NONE).then_some(usize::from(bit)).filter(|&bit| bit < UNAVAILABLE_COUNTERS)
}

/// True when the counter at page slot `slot` of a `kind` page is set in an unavailable-counter
/// bitmap.
pub fn is_unavailable(bitmap: &[u64; 4], kind: ObjectKind, slot: usize) -> bool {
    unavailable_bit(kind, slot).is_some_and(|bit| bitmap[bit / 64] & (1 << (bit % 64)) != 0)
}

/// Text stored NUL-padded: up to the first NUL, invalid UTF-8 replaced.
fn text(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// `s` as NUL-padded words, cut at a character boundary to fit `words` words.
pub(crate) fn encode_text(s: &str, words: usize) -> Vec<u64> {
    let max = words * 8;
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let mut bytes = s.as_bytes()[..end].to_vec();
    bytes.resize(max, 0);
    bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect()
}

/// Reads an entry's words as the writer left them, consistent (the sequence even and unchanged
/// across the copy); `None` when the writer kept changing it for as long as `patience` waits.
pub(crate) fn read_entry(
    entry: &[AtomicU64; ENTRY_WORDS],
    mut patience: Patience<'_>,
) -> Option<[u64; ENTRY_WORDS]> {
    loop {
        let before = entry[ew::SEQ].load(Ordering::Acquire);
        if before.is_multiple_of(2) {
            let mut words = [0u64; ENTRY_WORDS];
            for (w, a) in words.iter_mut().zip(entry.iter()) {
                *w = a.load(Ordering::Relaxed);
            }
            fence(Ordering::Acquire);
            if entry[ew::SEQ].load(Ordering::Relaxed) == before {
                patience.succeeded();
                return Some(words);
            }
        }
        if !patience.wait() {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_keeps_pages_aligned_and_overhead_small() {
        assert_eq!(CHUNK_SLOTS * ENTRY_BYTES % PAGE_SIZE, 0);
        for slot in [0, 1, 63, 64, 65, 4095, 70_000] {
            assert_eq!(page_offset(slot) % PAGE_SIZE, 0);
            assert!(entry_offset(slot) < page_offset(slot));
        }
        assert!(page_offset(63) + PAGE_SIZE <= file_bytes(1));
        assert_eq!(page_offset(64), file_bytes(1) + INDEX_PAGES * PAGE_SIZE);
        // Bytes per object on tmpfs: its page plus its share of the index.
        let per_object = CHUNK_BYTES as f64 / CHUNK_SLOTS as f64;
        assert!(per_object <= 1.1 * PAGE_SIZE as f64, "{per_object}");
    }

    #[test]
    fn text_is_cut_at_a_character_boundary_and_read_back() {
        let words = encode_text("ééé", 1);
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(text(&bytes), "ééé");
        let words = encode_text("ééééé", 1);
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(text(&bytes), "éééé");
    }

    #[test]
    fn junk_headers_and_entries_are_refused_not_trusted() {
        assert_eq!(Header::decode(&[0; 10]), Err(FormatError::Short(10)));
        assert_eq!(Header::decode(&[0; HEADER_BYTES]), Err(FormatError::Magic));
        let mut words = [0u64; ENTRY_WORDS];
        words[ew::KIND] = 99;
        words[ew::STATE] = state::ACTIVE;
        assert!(Entry::decode(&words).is_err());
        words[ew::KIND] = kind_code(ObjectKind::Vp);
        words[ew::STATE] = 7;
        assert!(Entry::decode(&words).is_err());
        words[ew::STATE] = state::FREE;
        assert_eq!(Entry::decode(&words), Ok(None));
    }
}
