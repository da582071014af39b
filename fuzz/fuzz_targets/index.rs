//! Fuzzes the arena index parser (header, entries) and the arena reader.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("hvstats-fuzz-index-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    hvstats_fuzz::index::check(data, dir());
});
