//! The arena index parser (header and entries) and the arena reader, checked on arbitrary bytes.
//!
//! This function is the body of the `index` fuzz target and of the workspace test that feeds it
//! random bytes and mutated real arenas. `Header::decode` and `Entry::decode` must return a value
//! or a [`FormatError`], never panic; an arena file holding the bytes must open or be refused, and
//! once open every slot the reader shows must yield an entry, a free slot or "changed", and every
//! live entry's page a copy or "changed": within bounds, whatever the header claims.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use hvstats::index::{ENTRY_WORDS, Entry, FormatError, HEADER_BYTES, Header};
use hvstats::reader::ArenaReader;
use hvstats_abi::page::PAGE_SLOTS;

/// What the parser made of the bytes, for callers that count outcomes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The header decoded.
    pub header: bool,
    /// The arena file opened.
    pub opened: bool,
    /// Live entries found.
    pub entries: usize,
    /// Pages copied.
    pub pages: usize,
}

/// Parses `data` as a header, as entries, and as a whole arena file written at `dir/arena`, and
/// checks the contract (module documentation).
pub fn check(data: &[u8], dir: &Path) -> Outcome {
    let mut outcome = Outcome::default();
    match Header::decode(data) {
        Ok(h) => {
            assert!(data.len() >= HEADER_BYTES);
            outcome.header = true;
            assert!(h.description.name.len() <= hvstats::index::NAME_BYTES);
        }
        Err(FormatError::Short(n)) => assert_eq!(n, data.len()),
        Err(_) => assert!(data.len() >= HEADER_BYTES),
    }
    for chunk in data.chunks_exact(ENTRY_WORDS * 8).take(64) {
        let mut words = [0u64; ENTRY_WORDS];
        for (w, b) in words.iter_mut().zip(chunk.chunks_exact(8)) {
            *w = u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        }
        let _ = Entry::decode(&words);
    }
    let path = dir.join("arena");
    std::fs::write(&path, data).expect("write the arena under test");
    let Ok(file) = File::open(&path) else { return outcome };
    let Ok(mut reader) = ArenaReader::open(file) else { return outcome };
    outcome.opened = true;
    let _ = reader.grow();
    let slots = reader.slots();
    let needed = hvstats::index::file_bytes(slots / hvstats::index::CHUNK_SLOTS);
    assert!(needed <= data.len(), "{slots} slots need {needed} bytes; the file has {}", data.len());
    let mut page = [0u64; PAGE_SLOTS];
    for slot in 0..slots {
        let Ok(words) = reader.entry_words(slot) else { continue };
        if let Ok(Some(entry)) = Entry::decode(&words) {
            outcome.entries += 1;
            if reader.read_page(slot, entry.generation, &mut page).is_ok() {
                outcome.pages += 1;
            }
        }
    }
    outcome
}

/// The files of a real published instance with one partition of two VPs (the partitions arena
/// and the global arena), made once per process, for seeds and mutation.
pub fn sample() -> &'static (Vec<u8>, Vec<u8>) {
    static SAMPLE: OnceLock<(Vec<u8>, Vec<u8>)> = OnceLock::new();
    SAMPLE.get_or_init(|| {
        let dir: PathBuf = std::env::temp_dir().join(format!("hvstats-fuzz-sample-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a runtime directory");
        let hv = hvstats::Hypervisor::new_published(&dir).expect("a published instance");
        let partition = hv.create_partition(2).expect("a partition");
        let instances = dir.join(hvstats::publish::INSTANCES_DIR);
        let mut arena = Vec::new();
        let mut global = Vec::new();
        for entry in std::fs::read_dir(&instances).expect("the instances directory").flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(hvstats::publish::ARENA_SUFFIX) {
                arena = std::fs::read(entry.path()).expect("the arena");
            } else if name.ends_with(hvstats::publish::GLOBAL_SUFFIX) {
                global = std::fs::read(entry.path()).expect("the global arena");
            }
        }
        drop(partition);
        drop(hv);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(!arena.is_empty() && !global.is_empty(), "the sample instance has both arenas");
        (arena, global)
    })
}
