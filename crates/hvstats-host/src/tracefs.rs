//! tracefs: where it is (mounting it when needed), and each event's id and format.
//!
//! The one place hvstats finds tracefs, for every user of tracepoints: the perf counters of our
//! own VPs and the observer's per-thread counters (in hvstats-kvm) and the in-kernel programs
//! ([`crate::bpf::Engine`]). tracefs is
//! looked for at `/sys/kernel/tracing`, then under debugfs; when it is absent it is mounted at
//! `/sys/kernel/tracing` (that needs root). When that is impossible every tracepoint is
//! unavailable, and the reason is kept, never guessed.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::os as sys;

/// Where tracefs is found, in order.
const ROOTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Why tracefs, and with it every tracepoint, is unavailable.
#[derive(Debug, thiserror::Error)]
pub enum TracefsError {
    /// It is not mounted, and mounting it failed (mounting needs root).
    #[error("tracefs is not mounted and mounting it at /sys/kernel/tracing failed")]
    Mount(#[source] io::Error),
    /// It is mounted, but this process may not read it (tracefs is root's, mode 0700).
    #[error("tracefs is mounted but not readable: {} (its tracepoints need root)", path.display())]
    Unreadable {
        /// Its events directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// It is mounted but lists no events.
    #[error("tracefs has no events")]
    NoEvents,
}

/// Why one event cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum EventError {
    /// tracefs is unavailable.
    #[error(transparent)]
    Tracefs(&'static TracefsError),
    /// The system or event name could leave the events directory.
    #[error("bad tracepoint name {system}:{name}")]
    BadName {
        /// The system.
        system: String,
        /// The event.
        name: String,
    },
    /// The event is not there (its system is not loaded), or its file cannot be read.
    #[error("tracepoint {system}:{name}: {}", path.display())]
    Read {
        /// The system.
        system: String,
        /// The event.
        name: String,
        /// The file.
        path: PathBuf,
        /// The read error.
        #[source]
        source: io::Error,
    },
    /// The event's id file does not hold a number.
    #[error("{}: not a number", path.display())]
    IdFormat {
        /// The id file.
        path: PathBuf,
    },
}

/// Where tracefs is, mounting it when needed (found once per process).
///
/// # Errors
/// Why it is unavailable.
pub fn root() -> Result<&'static Path, &'static TracefsError> {
    static ROOT: OnceLock<Result<PathBuf, TracefsError>> = OnceLock::new();
    ROOT.get_or_init(find_or_mount).as_ref().map(PathBuf::as_path)
}

fn find() -> Option<PathBuf> {
    ROOTS.into_iter().map(PathBuf::from).find(|root| root.join("events").is_dir())
}

fn find_or_mount() -> Result<PathBuf, TracefsError> {
    if let Some(root) = find() {
        return Ok(root);
    }
    // Mounted where this process may not look (not root): said as such, not taken for absent.
    for root in ROOTS {
        let path = Path::new(root).join("events");
        if let Err(source) = std::fs::metadata(&path)
            && matches!(source.raw_os_error(), Some(libc::EACCES | libc::EPERM))
        {
            return Err(TracefsError::Unreadable { path, source });
        }
    }
    // SAFETY: all arguments are NUL-terminated literals; a null data pointer is allowed.
    let r = unsafe {
        libc::mount(
            c"tracefs".as_ptr(),
            c"/sys/kernel/tracing".as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    sys::check(r).map_err(TracefsError::Mount)?;
    find().ok_or(TracefsError::NoEvents)
}

/// The id of event `system:name` (its perf `config` as a tracepoint).
///
/// # Errors
/// When tracefs is unavailable, the name is unsafe, or the id cannot be read.
pub fn event_id(system: &str, name: &str) -> Result<u64, EventError> {
    event_id_at(root().map_err(EventError::Tracefs)?, system, name)
}

/// The id of event `system:name` in the tracefs at `root`.
///
/// # Errors
/// When the name is unsafe or the id cannot be read.
pub(crate) fn event_id_at(root: &Path, system: &str, name: &str) -> Result<u64, EventError> {
    let path = event_file(root, system, name, "id")?;
    let text = read(system, name, &path)?;
    text.trim().parse().map_err(|_| EventError::IdFormat { path })
}

/// The `format` file of event `system:name` in the tracefs at `root` (its record's fields).
///
/// # Errors
/// When the name is unsafe or the file cannot be read.
pub(crate) fn event_format_at(root: &Path, system: &str, name: &str) -> Result<String, EventError> {
    let path = event_file(root, system, name, "format")?;
    read(system, name, &path)
}

fn event_file(root: &Path, system: &str, name: &str, file: &str) -> Result<PathBuf, EventError> {
    if [system, name].iter().any(|s| s.is_empty() || s.contains('/') || s.contains("..")) {
        return Err(EventError::BadName { system: system.to_owned(), name: name.to_owned() });
    }
    Ok(root.join("events").join(system).join(name).join(file))
}

fn read(system: &str, name: &str, path: &Path) -> Result<String, EventError> {
    std::fs::read_to_string(path).map_err(|source| EventError::Read {
        system: system.to_owned(),
        name: name.to_owned(),
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_leave_the_events_directory_are_refused() {
        let root = Path::new("/nonexistent");
        for (system, name) in [("..", "x"), ("kvm", "../../etc"), ("", "kvm_exit"), ("kvm", "a/b")] {
            assert!(
                matches!(event_id_at(root, system, name), Err(EventError::BadName { .. })),
                "{system}:{name}"
            );
        }
        assert!(matches!(event_id_at(root, "kvm", "kvm_exit"), Err(EventError::Read { .. })));
    }

    #[test]
    fn ids_and_formats_are_read_from_the_events_directory() {
        let dir = std::env::temp_dir().join(format!("hvstats-tracefs-{}", std::process::id()));
        let event = dir.join("events/sys/ev");
        std::fs::create_dir_all(&event).unwrap();
        std::fs::write(event.join("id"), "1234\n").unwrap();
        std::fs::write(event.join("format"), "name: ev\n").unwrap();
        std::fs::create_dir_all(dir.join("events/sys/bad")).unwrap();
        std::fs::write(dir.join("events/sys/bad/id"), "twelve\n").unwrap();
        assert_eq!(event_id_at(&dir, "sys", "ev").unwrap(), 1234);
        assert_eq!(event_format_at(&dir, "sys", "ev").unwrap(), "name: ev\n");
        assert!(matches!(event_id_at(&dir, "sys", "bad"), Err(EventError::IdFormat { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
