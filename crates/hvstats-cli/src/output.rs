//! Every byte the command prints goes through here, so no write can panic and every command treats
//! a closed or full output the same way.
//!
//! `println!` panics when standard output is a closed pipe (`hvstats run | head -1`) or a full
//! device (`> /dev/full`). Here a closed standard output means the reader has what it wanted: the
//! command stops printing, and finishes with the exit status it would have had. Any other write
//! error (a full disk, an I/O error) is returned, and the command ends with
//! [`ExitStatus::RuntimeError`] and a message on standard error. Messages to standard error never
//! fail: when even standard error is gone there is nobody left to tell.
//!
//! The exit statuses of every command are defined here too ([`ExitStatus`]), so they stay
//! distinct and documented in one place.

use std::fmt;
use std::io::{self, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;

/// The exit statuses of `hvstats`, the same for every command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum ExitStatus {
    /// Everything asked for was done.
    Success = 0,
    /// Something could not be done: a file, the runtime directory, KVM, a refused allocation, a
    /// full output device.
    RuntimeError = 1,
    /// The command line is wrong (unknown flag, value out of range); nothing was done.
    Usage = 2,
    /// `run`: the partition ran, but a VP faulted or did not stop in time.
    GuestFault = 3,
    /// `snapshot`, `top --once`: no observer or partition publishes under the runtime directory,
    /// so there was nothing to read (told apart from 1, something that could not be read).
    NothingPublished = 4,
    /// `run`: stopped by SIGHUP (its terminal went away) after printing what was counted
    /// (128 + 1).
    HungUp = 129,
    /// `run`: stopped by SIGINT (Ctrl-C) after printing what was counted (128 + 2).
    Interrupted = 130,
    /// `run`: stopped by SIGTERM after printing what was counted (128 + 15).
    Terminated = 143,
}

impl ExitStatus {
    /// Every status, in order.
    pub(crate) const ALL: [ExitStatus; 8] = [
        Self::Success,
        Self::RuntimeError,
        Self::Usage,
        Self::GuestFault,
        Self::NothingPublished,
        Self::HungUp,
        Self::Interrupted,
        Self::Terminated,
    ];

    /// What the status means, as the man pages say it.
    pub(crate) fn meaning(self) -> &'static str {
        match self {
            Self::Success => "Everything asked for was done.",
            Self::RuntimeError => {
                "Something could not be done (a file, the runtime directory, KVM, a refused allocation, a full output device; for observe, a --pid process that could not be observed); the message on standard error says what."
            }
            Self::Usage => {
                "The command line is wrong (unknown flag, value out of range, no target); nothing was done."
            }
            Self::GuestFault => "run: the partition ran, but a VP faulted or did not stop in time.",
            Self::NothingPublished => {
                "snapshot, top --once: no observer or partition publishes under the runtime directory (nothing is observed or run yet): nothing was read, and the message says how to start one. A script tells this apart from 1, something that could not be read."
            }
            Self::HungUp => "run: stopped by SIGHUP after printing what was counted.",
            Self::Interrupted => "run: stopped by SIGINT (Ctrl-C) after printing what was counted.",
            Self::Terminated => "run: stopped by SIGTERM after printing what was counted.",
        }
    }

    /// True when a command's page (`hvstats-run`, …; `hvstats` for the whole) lists the status:
    /// the signal and guest statuses are `run`'s alone.
    pub(crate) fn applies_to(self, page: &str) -> bool {
        match self {
            Self::Success | Self::RuntimeError | Self::Usage => true,
            Self::NothingPublished => matches!(page, "hvstats" | "hvstats-snapshot" | "hvstats-top"),
            _ => matches!(page, "hvstats" | "hvstats-run"),
        }
    }
}

impl From<ExitStatus> for ExitCode {
    fn from(s: ExitStatus) -> Self {
        ExitCode::from(s as u8)
    }
}

/// A write to standard output failed for a reason other than a closed reader.
#[derive(Debug, thiserror::Error)]
#[error("cannot write to standard output")]
pub(crate) struct OutputError(#[source] pub io::Error);

/// Set once standard output turned out to be closed; later output is dropped.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes what `write` produces to `out` and flushes it. A broken pipe marks the output closed
/// (in `closed`) and is not an error; every later call writes nothing.
///
/// # Errors
/// Any other write or flush error.
pub(crate) fn write_to<W: Write>(
    out: &mut W,
    closed: &AtomicBool,
    write: impl FnOnce(&mut W) -> io::Result<()>,
) -> Result<(), OutputError> {
    if closed.load(Ordering::Relaxed) {
        return Ok(());
    }
    match write(out).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
            closed.store(true, Ordering::Relaxed);
            Ok(())
        }
        Err(e) => Err(OutputError(e)),
    }
}

/// Writes to standard output through `write` (see the module documentation).
///
/// # Errors
/// A write error other than a closed reader.
pub(crate) fn with_stdout(
    write: impl FnOnce(&mut io::StdoutLock<'static>) -> io::Result<()>,
) -> Result<(), OutputError> {
    write_to(&mut io::stdout().lock(), &STDOUT_CLOSED, write)
}

/// Prints `text` as it is.
///
/// # Errors
/// A write error other than a closed reader.
pub(crate) fn print(text: &str) -> Result<(), OutputError> {
    with_stdout(|out| out.write_all(text.as_bytes()))
}

/// Prints formatted text (the `out!` macro's body).
///
/// # Errors
/// A write error other than a closed reader.
pub(crate) fn print_fmt(args: fmt::Arguments<'_>) -> Result<(), OutputError> {
    with_stdout(|out| out.write_fmt(args))
}

/// Prints `value` as JSON and a newline, indented when `pretty`.
///
/// # Errors
/// A write error other than a closed reader.
pub(crate) fn print_json(value: &impl Serialize, pretty: bool) -> Result<(), OutputError> {
    with_stdout(|out| {
        // Standard output flushes at every newline: buffered here, a large document is written
        // in large pieces, not one system call per line.
        let mut out = io::BufWriter::with_capacity(64 << 10, out);
        let r = if pretty {
            serde_json::to_writer_pretty(&mut out, value)
        } else {
            serde_json::to_writer(&mut out, value)
        };
        r.map_err(io::Error::from)?;
        out.write_all(b"\n")?;
        out.flush()
    })
}

/// Writes a line to standard error; never fails and never panics.
pub(crate) fn note_fmt(args: fmt::Arguments<'_>) {
    let mut err = io::stderr().lock();
    let _ = err.write_fmt(args).and_then(|()| err.write_all(b"\n"));
}

/// One event of `command`'s log on standard error, on one line: control characters in `line` (a
/// VM name may hold a newline or a terminal escape) come out escaped
/// ([`hvstats_present::text::OneLine`]), so no text can forge a line or drive the terminal. A closed
/// standard error is ignored.
pub(crate) fn log(command: &str, line: &str) {
    note_fmt(format_args!("hvstats {command}: {}", hvstats_present::text::OneLine(line)));
}

/// `println!` that cannot panic: `out!("...", ..)?` (see [`print_fmt`]).
macro_rules! out {
    () => { $crate::output::print("\n") };
    ($($arg:tt)*) => { $crate::output::print_fmt(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `eprintln!` that cannot panic, prefixed with `hvstats: `.
macro_rules! note {
    ($($arg:tt)*) => { $crate::output::note_fmt(format_args!("hvstats: {}", format_args!($($arg)*))) };
}

pub(crate) use {note, out};

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that fails every write with `kind` after accepting `room` bytes.
    struct Failing {
        room: usize,
        kind: io::ErrorKind,
        written: Vec<u8>,
    }

    impl Write for Failing {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.room == 0 {
                return Err(io::Error::from(self.kind));
            }
            let n = buf.len().min(self.room);
            self.room -= n;
            self.written.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_reader_ends_output_quietly_and_for_good() {
        let closed = AtomicBool::new(false);
        let mut w = Failing { room: 4, kind: io::ErrorKind::BrokenPipe, written: Vec::new() };
        assert!(write_to(&mut w, &closed, |w| w.write_all(b"partition 1\n")).is_ok());
        assert!(closed.load(Ordering::Relaxed));
        assert_eq!(w.written, b"part");
        w.room = 100;
        assert!(write_to(&mut w, &closed, |w| w.write_all(b"more")).is_ok());
        assert_eq!(w.written, b"part", "nothing is written after the reader went away");
    }

    #[test]
    fn a_full_device_is_an_error_naming_the_cause() {
        let closed = AtomicBool::new(false);
        let mut w = Failing { room: 0, kind: io::ErrorKind::StorageFull, written: Vec::new() };
        let e = write_to(&mut w, &closed, |w| w.write_all(b"x")).unwrap_err();
        assert_eq!(e.0.kind(), io::ErrorKind::StorageFull);
        assert!(e.to_string().starts_with("cannot write to standard output"), "{e}");
        assert!(!closed.load(Ordering::Relaxed));
    }

    #[test]
    fn exit_statuses_are_distinct() {
        let all = [
            ExitStatus::Success,
            ExitStatus::RuntimeError,
            ExitStatus::Usage,
            ExitStatus::GuestFault,
            ExitStatus::Interrupted,
            ExitStatus::Terminated,
        ];
        let codes: std::collections::BTreeSet<u8> = all.iter().map(|&s| s as u8).collect();
        assert_eq!(codes.len(), all.len());
    }
}
