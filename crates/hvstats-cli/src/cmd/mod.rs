//! One module per subcommand: its flags and what it does.

pub mod bench;
pub mod catalog;
pub mod dump;
pub mod hwc;
pub mod run;
pub mod snapshot;

use std::path::PathBuf;

use anyhow::bail;

/// The runtime directory a command uses: `--runtime-dir` when given, which must then exist (a
/// mistyped path is an error, not a new directory), otherwise `$HVSTATS_RUNTIME_DIR` or
/// `/run/hvstats` (created on first use).
///
/// # Errors
/// When `--runtime-dir` names something that is not an existing directory.
pub fn runtime_dir(flag: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    match flag {
        Some(dir) if dir.is_dir() => Ok(dir),
        Some(dir) if dir.exists() => bail!("--runtime-dir {} is not a directory", dir.display()),
        Some(dir) => {
            bail!("--runtime-dir {} does not exist (create it, or leave the flag out)", dir.display())
        }
        None => Ok(hvstats::runtime_dir::runtime_dir()),
    }
}
