//! Fuzzes the runtime-directory reader (discovery, attach, snapshot) over generated trees.
//!
//! With `HVSTATS_FUZZ_HOSTILE=1` the trees hold FIFOs and unbounded VP counts as well.

#![no_main]

use std::sync::atomic::{AtomicU64, Ordering};

use hvstats_fuzz::runtime_tree::{Hostility, check};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    static N: AtomicU64 = AtomicU64::new(0);
    let hostility =
        if std::env::var("HVSTATS_FUZZ_HOSTILE").as_deref() == Ok("1") { Hostility::FULL } else { Hostility::TAME };
    let dir = std::env::temp_dir()
        .join(format!("hvstats-fuzz-tree-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
    std::fs::create_dir_all(&dir).expect("a runtime directory");
    check(data, &dir, hostility);
    let _ = std::fs::remove_dir_all(&dir);
});
