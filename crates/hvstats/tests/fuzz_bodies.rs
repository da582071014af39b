//! The bodies of the hvstats fuzz targets (`fuzz/src/`), run on reproducible random inputs with
//! stable Rust: the hypercall dispatcher over fake guest memory, the arena index parser and reader, and the runtime-directory reader over generated trees. The same functions are
//! what libFuzzer drives (`fuzz/README.md`); here each runs a bounded number of inputs, and a run
//! that never reaches the interesting outcomes fails.
//!
//! A small deterministic generator (splitmix64) keeps the run reproducible and dependency-free.
//! The HAL resource-list requests' body runs in `hvstats-hwc`'s tests, beside the allocator.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test set-up: a failure there is the test failing"
)]

#[allow(dead_code, reason = "the HAL request body, which runs in hvstats-hwc, reads the fields these do not")]
#[path = "../../../fuzz/src/bytes.rs"]
mod bytes;
#[path = "../../../fuzz/src/hypercall_dispatch.rs"]
mod hypercall_dispatch;
#[path = "../../../fuzz/src/index.rs"]
mod index;
#[path = "../../../fuzz/src/random.rs"]
mod random;
#[path = "../../../fuzz/src/runtime_tree.rs"]
mod runtime_tree;

use std::path::PathBuf;

use random::Rng;

/// A fresh directory under the system temp dir, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(what: &str, n: usize) -> Self {
        let dir = std::env::temp_dir().join(format!("hvstats-fuzz-body-{what}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn hypercall_dispatch_keeps_its_contract_on_random_call_sequences() {
    let mut rng = Rng(0x4879_7065_7243_616c);
    let mut successes = 0;
    for _ in 0..3_000 {
        successes += hypercall_dispatch::check(&rng.bytes(600));
    }
    assert!(successes > 1_000, "the generator rarely reaches a successful call ({successes})");
}

#[test]
fn the_index_parser_and_arena_reader_keep_their_contract_on_random_and_mutated_arenas() {
    let dir = Dir::new("index", 0);
    let mut rng = Rng(0x496e_6465_7841_726e);
    let (arena, global) = index::sample();
    let whole = index::check(arena, &dir.0);
    assert!(whole.opened && whole.entries >= 3 && whole.pages == whole.entries, "{whole:?}");
    assert!(index::check(global, &dir.0).opened);
    let (mut opened, mut entries) = (0, 0);
    for i in 0..600 {
        let bytes = if i % 5 == 0 {
            rng.bytes(9000)
        } else {
            let mut m = if i % 2 == 0 { arena.clone() } else { global.clone() };
            match rng.next() % 4 {
                0 => m.truncate((rng.next() % m.len() as u64) as usize),
                1 => m.resize(m.len() + (rng.next() % 300_000) as usize, 0),
                _ => {}
            }
            for _ in 0..=rng.next() % 8 {
                if m.is_empty() {
                    break;
                }
                // The header and the first chunk's index, where the structure is.
                let at = (rng.next() % (m.len() as u64).min(4096 + 16384)) as usize;
                m[at] = rng.next() as u8;
            }
            m
        };
        let o = index::check(&bytes, &dir.0);
        opened += usize::from(o.opened);
        entries += o.entries;
    }
    assert!(
        opened > 100 && entries > 100,
        "mutations rarely stay readable ({opened} opened, {entries} entries)"
    );
    // The fuzz target's input form: edits of the real arenas.
    let mut edited_entries = 0;
    for _ in 0..300 {
        edited_entries += index::check_edited(&rng.bytes(200), &dir.0).entries;
    }
    assert!(edited_entries > 100, "edits rarely leave entries readable ({edited_entries})");
}

#[test]
fn the_runtime_directory_reader_ends_without_panicking_on_generated_trees() {
    let mut rng = Rng(0x5275_6e74_696d_6544);
    let mut read = 0;
    for i in 0..150 {
        let dir = Dir::new("tree", i);
        read += runtime_tree::check(&rng.bytes(400), &dir.0, runtime_tree::Hostility::TAME);
    }
    assert!(read > 50, "the generator rarely builds a readable instance ({read})");
}

/// FIFOs in place of arenas.
#[test]
fn the_runtime_directory_reader_withstands_fifos() {
    let mut rng = Rng(0x486f_7374_696c_6521);
    for i in 0..150 {
        let dir = Dir::new("hostile-tree", i);
        runtime_tree::check(&rng.bytes(400), &dir.0, runtime_tree::Hostility::FULL);
    }
}
