//! One module per subcommand: its flags and what it does.

pub(crate) mod bench;
pub(crate) mod catalog;
pub(crate) mod dump;
pub(crate) mod hwc;
pub(crate) mod install;
pub(crate) mod observe;
pub(crate) mod plot;
pub(crate) mod record;
pub(crate) mod report;
pub(crate) mod run;
pub(crate) mod serve;
pub(crate) mod snapshot;
pub(crate) mod top;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;

/// The runtime directory a command uses: `--runtime-dir` when given, else `$HVSTATS_RUNTIME_DIR`
/// when set, either of which must exist (a mistyped path is an error, not a new directory);
/// otherwise `/run/hvstats` (created on first use).
///
/// # Errors
/// When `--runtime-dir` or `$HVSTATS_RUNTIME_DIR` names something that is not an existing
/// directory.
pub(crate) fn runtime_dir(flag: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    use hvstats::runtime_dir::RUNTIME_DIR_ENV;
    let (dir, named_by, fix) = match (flag, std::env::var_os(RUNTIME_DIR_ENV).filter(|v| !v.is_empty())) {
        (Some(dir), _) => (dir, "--runtime-dir".to_owned(), "leave the flag out"),
        (None, Some(env)) => (PathBuf::from(env), format!("{RUNTIME_DIR_ENV}="), "unset the variable"),
        (None, None) => return Ok(hvstats::runtime_dir::runtime_dir()),
    };
    let sep = if named_by.ends_with('=') { "" } else { " " };
    if dir.is_dir() {
        Ok(dir)
    } else if dir.exists() {
        bail!("{named_by}{sep}{} is not a directory", dir.display())
    } else {
        bail!("{named_by}{sep}{} does not exist (create it, or {fix})", dir.display())
    }
}

/// How often a publisher merges its sources into the pages (`run`'s collector): counters move no
/// more often than this, so a shorter interval would show rates of 0 between refreshes.
pub(crate) fn publisher_cadence() -> Duration {
    hvstats_kvm::PartitionConfig::default().collect_interval
}

/// A year in seconds: the longest a recording or duration flag accepts.
pub(crate) const YEAR_SECONDS: f64 = 86_400.0 * 365.0;

/// Parses a number of seconds from `min` to `max` (both included) for a flag; the message states
/// the range. Every seconds flag goes through here (or [`parse_interval`], which adds why its
/// floor is what it is).
///
/// # Errors
/// A message stating the range when `s` is not a number in it.
pub(crate) fn seconds_in(s: &str, min: f64, max: f64) -> Result<f64, String> {
    let upper = if max == YEAR_SECONDS { "a year".to_owned() } else { format!("{max}") };
    match s.trim().parse::<f64>() {
        Ok(v) if (min..=max).contains(&v) => Ok(v),
        _ => Err(format!("{s:?}: a number of seconds from {min} up to {upper}")),
    }
}

/// Parses an interval in seconds for commands that read every page twice: at least the
/// publishers' refresh cadence ([`publisher_cadence`]), at most an hour.
///
/// # Errors
/// A message stating the real range when `s` is not a number in it.
pub(crate) fn parse_interval(s: &str) -> Result<f64, String> {
    interval_up_to(s, 3600.0)
}

/// As [`parse_interval`], up to `max` seconds.
///
/// # Errors
/// A message stating the real range (and why its floor is the refresh cadence) when `s` is not a
/// number in it.
pub(crate) fn interval_up_to(s: &str, max: f64) -> Result<f64, String> {
    let min = publisher_cadence().as_secs_f64();
    let upper = if max == YEAR_SECONDS { "a year".to_owned() } else { format!("{max} s") };
    match s.trim().parse::<f64>() {
        Ok(v) if (min..=max).contains(&v) => Ok(v),
        Ok(v) if v > 0.0 && v < min => Err(format!(
            "{s}: the interval must be at least {min} s, the publishers' refresh cadence (counters \
             move only that often), and at most {upper}"
        )),
        _ => Err(format!("{s:?}: the interval is a number of seconds, at least {min} and at most {upper}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interval_below_the_refresh_cadence_is_refused_with_the_real_range() {
        assert_eq!(parse_interval("1"), Ok(1.0));
        assert_eq!(parse_interval("0.1"), Ok(0.1));
        let e = parse_interval("0.01").unwrap_err();
        assert!(e.contains("at least 0.1 s, the publishers' refresh cadence"), "{e}");
        for bad in ["0", "-1", "3601", "NaN", "soon"] {
            let e = parse_interval(bad).unwrap_err();
            assert!(e.contains("at least 0.1 and at most 3600"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_runtime_dir_flag_must_name_an_existing_directory() {
        let missing = std::env::temp_dir().join(format!("hvstats-no-such-dir-{}", std::process::id()));
        let e = runtime_dir(Some(missing.clone())).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        assert!(!missing.exists());
        let e = runtime_dir(Some(PathBuf::from("/etc/hostname"))).unwrap_err();
        assert!(e.to_string().contains("is not a directory"), "{e}");
        assert_eq!(runtime_dir(Some(std::env::temp_dir())).unwrap(), std::env::temp_dir());
    }
}
