//! Fuzzes `HalAllocateHardwareCounters` requests and frees against one allocation table.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

fn runtime_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("hvstats-fuzz-hal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a runtime directory");
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    hvstats_fuzz::hal_request::check(data, runtime_dir());
});
