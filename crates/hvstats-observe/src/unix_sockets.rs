//! Who holds a Unix socket and who waits on it, from the kernel's table (`/proc/net/unix`).
//!
//! QEMU serves one QMP client at a time: a second client's connect lands in the listen backlog
//! and hears nothing. The kernel's table tells the cases apart without asking QEMU: a connection
//! QEMU accepted is a `CONNECTED` entry bearing the socket's path, a client still in the backlog
//! a `CONNECTING` entry bearing it (with no inode: nobody holds its file yet). An accepted
//! connection whose client has closed stays listed until QEMU closes its end (not while QEMU is
//! stopped); its reference count tells it apart: the client's end holds a reference to QEMU's
//! (3 in all while the client lives, 2 once it closed), and so with one waiting. So the observer can say "another client
//! holds the socket" only when one does (and "stalled" otherwise), leave a socket alone while
//! someone else uses it, and let go of one when another client waits for it.

use std::collections::HashMap;
use std::io::{self, Read};
use std::path::Path;

/// The most of `/proc/net/unix` read (a host with a hundred thousand sockets has ~15 MB of it);
/// entries past it are not seen.
pub const MAX_TABLE: u64 = 16 << 20;

/// `SS_CONNECTING` in the table's `St` column: a connection not accepted yet.
const CONNECTING: u8 = 2;
/// `SS_CONNECTED`: an accepted (server side) or connected (client side) socket.
const CONNECTED: u8 = 3;

/// References an accepted connection's end has while its client's end lives: its own file's,
/// the socket's, and the client's.
const HELD_REFS: u32 = 3;

/// What the table says of one path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathUse {
    /// Connections the listener accepted whose client still holds them (their server side
    /// bears its path).
    pub accepted: usize,
    /// Connections waiting in its backlog whose client still holds them.
    pub waiting: usize,
}

/// The Unix sockets of the host by path, as one reading of the kernel's table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnixSockets {
    by_path: HashMap<String, PathUse>,
}

impl UnixSockets {
    /// Reads the host's table.
    ///
    /// # Errors
    /// When `/proc/net/unix` cannot be read.
    pub fn read() -> io::Result<Self> {
        Self::read_from(Path::new("/proc/net/unix"), None)
    }

    /// Reads what the host's table says of `paths` alone (a host may have a hundred thousand
    /// sockets: the others are skipped without a copy).
    ///
    /// # Errors
    /// When `/proc/net/unix` cannot be read.
    pub(crate) fn read_of<'a>(paths: impl IntoIterator<Item = &'a Path>) -> io::Result<Self> {
        let wanted: Vec<&str> = paths.into_iter().filter_map(Path::to_str).collect();
        Self::read_from(Path::new("/proc/net/unix"), Some(&wanted))
    }

    /// Reads the table at `path` (a fixture, or the host's), keeping the entries of `only`
    /// when given.
    ///
    /// # Errors
    /// When it cannot be read.
    pub fn read_from(path: &Path, only: Option<&[&str]>) -> io::Result<Self> {
        let mut raw = Vec::new();
        std::fs::File::open(path)?.take(MAX_TABLE).read_to_end(&mut raw)?;
        Ok(Self::parse_of(&String::from_utf8_lossy(&raw), only))
    }

    /// Parses the table's text: `Num RefCount Protocol Flags Type St Inode Path`, the path being
    /// the rest of the line after the seventh column (it may hold spaces).
    pub fn parse(text: &str) -> Self {
        Self::parse_of(text, None)
    }

    /// As [`parse`](Self::parse), keeping the entries of `only` when given.
    fn parse_of(text: &str, only: Option<&[&str]>) -> Self {
        let mut by_path: HashMap<String, PathUse> = HashMap::new();
        for line in text.lines().skip(1) {
            if let Some(only) = only
                && !only.iter().any(|p| line.ends_with(p))
            {
                continue;
            }
            let mut rest = line.trim_start();
            let mut columns = [""; 7];
            for column in &mut columns {
                let end = rest.find(' ').unwrap_or(rest.len());
                *column = &rest[..end];
                rest = rest[end..].trim_start();
            }
            if rest.is_empty() || only.is_some_and(|only| !only.contains(&rest)) {
                continue;
            }
            let Ok(state) = u8::from_str_radix(columns[5], 16) else { continue };
            let Ok(refs) = u32::from_str_radix(columns[1], 16) else { continue };
            let entry = by_path.entry(rest.to_owned()).or_default();
            match state {
                CONNECTED if refs >= HELD_REFS => entry.accepted += 1,
                CONNECTING if refs >= HELD_REFS => entry.waiting += 1,
                _ => {}
            }
        }
        Self { by_path }
    }

    /// What the table says of `path` (nothing when no entry bears it).
    pub fn of(&self, path: &Path) -> PathUse {
        path.to_str().and_then(|p| self.by_path.get(p)).copied().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "Num       RefCount Protocol Flags    Type St Inode Path
000000007a0e96a8: 00000002 00000000 00010000 0001 01 225683 /tmp/q.sock
000000009e8e977a: 00000003 00000000 00000000 0001 02     0 /tmp/q.sock
0000000041312e4e: 00000003 00000000 00000000 0001 03 271519 /tmp/q.sock
0000000041312e4d: 00000002 00000000 00000000 0001 03 271518 /tmp/q.sock
0000000041312e4c: 00000002 00000000 00000000 0001 02     0 /tmp/q.sock
0000000041312e4f: 00000003 00000000 00000000 0001 03 271520
0000000041312e50: 00000003 00000000 00000000 0001 03 271521 /run/with space.sock
0000000041312e51: 00000002 00000000 00010000 0001 01 271522 @abstract
";

    #[test]
    fn accepted_and_waiting_clients_are_counted_by_path() {
        // Of the two accepted connections on q.sock, and of the two waiting, one's client closed
        // (2 references).
        let t = UnixSockets::parse(TABLE);
        assert_eq!(t.of(Path::new("/tmp/q.sock")), PathUse { accepted: 1, waiting: 1 });
        assert_eq!(t.of(Path::new("/run/with space.sock")), PathUse { accepted: 1, waiting: 0 });
        assert_eq!(t.of(Path::new("/nowhere")), PathUse::default());
        assert_eq!(UnixSockets::parse("header only\nbroken line\n"), UnixSockets::default());
        let only = UnixSockets::parse_of(TABLE, Some(&["/run/with space.sock"]));
        assert_eq!(only.of(Path::new("/run/with space.sock")).accepted, 1);
        assert_eq!(only.of(Path::new("/tmp/q.sock")), PathUse::default(), "not asked for");
    }

    #[test]
    fn the_hosts_table_shows_a_listener_this_test_made() {
        let dir = std::env::temp_dir().join(format!("hvstats-unix-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        let path = dir.join("l.sock");
        let _ = std::fs::remove_file(&path);
        let Ok(listener) = std::os::unix::net::UnixListener::bind(&path) else { return };
        let waiting = std::os::unix::net::UnixStream::connect(&path).map(Some).unwrap_or(None);
        let seen = UnixSockets::read().map(|t| t.of(&path)).unwrap_or_default();
        assert_eq!(seen, PathUse { accepted: 0, waiting: 1 });
        drop(listener);
        drop(waiting);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
