//! Where live hvstats instances and the shared hardware counter table are published.
//!
//! `HVSTATS_RUNTIME_DIR` when set, otherwise `/run/hvstats`. Library code takes the directory as an
//! argument; only the command line resolves the default.

use std::path::PathBuf;

/// The environment variable naming the runtime directory.
pub const RUNTIME_DIR_ENV: &str = "HVSTATS_RUNTIME_DIR";

/// The runtime directory when the environment does not name one.
pub const DEFAULT_RUNTIME_DIR: &str = "/run/hvstats";

/// The runtime directory: `$HVSTATS_RUNTIME_DIR`, or `/run/hvstats`.
pub fn runtime_dir() -> PathBuf {
    std::env::var_os(RUNTIME_DIR_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_RUNTIME_DIR))
}
