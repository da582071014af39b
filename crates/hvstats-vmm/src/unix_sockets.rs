//! Who holds a Unix socket and who waits on it, from the kernel's tables (`/proc/PID/net/unix`).
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
//!
//! Those entries live in the network namespace of the client, not of the listener: the kernel
//! makes the server's end of a connection (first waiting in the backlog, then accepted) in the
//! namespace of the process that connects. A reader's table (`/proc/net/unix`) lists only its
//! own namespace's sockets, so an observer in a namespace of its own (its unit's
//! `PrivateNetwork=yes`) would see only its own connections and never a client that waits. So
//! the table read is every network namespace's that a process is in, each once (the distinct
//! `/proc/PID/ns/net`, read through that process's `/proc/PID/net/unix`), this process's own
//! included, merged. A namespace no process is in has no client to wait; a process whose
//! namespace cannot be told (it exited, or its links may not be read) is skipped.

use std::collections::{BTreeSet, HashMap};
use std::io::{self, BufRead, Read};
use std::path::{Path, PathBuf};

/// The most of one namespace's table read (a host with a hundred thousand sockets has ~15 MB
/// of it); entries past it are not seen. It is read a line at a time: what is kept is the
/// entries of the paths asked for.
pub const MAX_TABLE: u64 = 16 << 20;

/// The most network namespaces whose tables are read at one reading (a host of thousands of
/// containers); a client in a namespace past it is not seen.
pub const MAX_NAMESPACES: usize = 1024;

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
    /// Reads the tables of every network namespace a process is in, merged.
    ///
    /// # Errors
    /// When this process's own table cannot be read.
    pub fn read() -> io::Result<Self> {
        Self::read_merged(None)
    }

    /// Reads what the tables of every network namespace a process is in say of `paths` alone,
    /// merged (a host may have a hundred thousand sockets: the others are skipped without a
    /// copy).
    ///
    /// # Errors
    /// When this process's own table cannot be read.
    pub fn read_of<'a>(paths: impl IntoIterator<Item = &'a Path>) -> io::Result<Self> {
        let wanted: Vec<&str> = paths.into_iter().filter_map(Path::to_str).collect();
        Self::read_merged(Some(&wanted))
    }

    /// This process's own table, then each other namespace's once, merged.
    fn read_merged(only: Option<&[&str]>) -> io::Result<Self> {
        let mut me = Self::read_from(Path::new("/proc/self/net/unix"), only)?;
        for (table, namespace) in other_namespaces() {
            if let Ok(theirs) = read_in(&table, &namespace, only) {
                me.merge(theirs);
            }
        }
        Ok(me)
    }

    /// Reads the table at `path` (a fixture, or one namespace's), keeping the entries of `only`
    /// when given.
    ///
    /// # Errors
    /// When it cannot be read.
    pub fn read_from(path: &Path, only: Option<&[&str]>) -> io::Result<Self> {
        Self::read_lines(std::fs::File::open(path)?, only)
    }

    /// Reads a table from `file` a line at a time, [`MAX_TABLE`] bytes at most.
    fn read_lines(file: std::fs::File, only: Option<&[&str]>) -> io::Result<Self> {
        let mut me = Self::default();
        let mut reader = io::BufReader::new(file.take(MAX_TABLE));
        let mut line = Vec::new();
        // The header.
        reader.read_until(b'\n', &mut line)?;
        loop {
            line.clear();
            if reader.read_until(b'\n', &mut line)? == 0 {
                return Ok(me);
            }
            let text = String::from_utf8_lossy(&line);
            me.add_line(text.trim_end_matches('\n'), only);
        }
    }

    /// Parses the table's text: `Num RefCount Protocol Flags Type St Inode Path`, the path being
    /// the rest of the line after the seventh column (it may hold spaces).
    pub fn parse(text: &str) -> Self {
        Self::parse_of(text, None)
    }

    /// As [`parse`](Self::parse), keeping the entries of `only` when given.
    fn parse_of(text: &str, only: Option<&[&str]>) -> Self {
        let mut me = Self::default();
        for line in text.lines().skip(1) {
            me.add_line(line, only);
        }
        me
    }

    /// Counts one entry of a table (a line after its header).
    fn add_line(&mut self, line: &str, only: Option<&[&str]>) {
        if let Some(only) = only
            && !only.iter().any(|p| line.ends_with(p))
        {
            return;
        }
        let mut rest = line.trim_start();
        let mut columns = [""; 7];
        for column in &mut columns {
            let end = rest.find(' ').unwrap_or(rest.len());
            *column = &rest[..end];
            rest = rest[end..].trim_start();
        }
        if rest.is_empty() || only.is_some_and(|only| !only.contains(&rest)) {
            return;
        }
        let Ok(state) = u8::from_str_radix(columns[5], 16) else { return };
        let Ok(refs) = u32::from_str_radix(columns[1], 16) else { return };
        let entry = self.by_path.entry(rest.to_owned()).or_default();
        match state {
            CONNECTED if refs >= HELD_REFS => entry.accepted += 1,
            CONNECTING if refs >= HELD_REFS => entry.waiting += 1,
            _ => {}
        }
    }

    /// Adds another namespace's entries to these.
    fn merge(&mut self, other: Self) {
        for (path, use_) in other.by_path {
            let entry = self.by_path.entry(path).or_default();
            entry.accepted += use_.accepted;
            entry.waiting += use_.waiting;
        }
    }

    /// What the table says of `path` (nothing when no entry bears it).
    pub fn of(&self, path: &Path) -> PathUse {
        path.to_str().and_then(|p| self.by_path.get(p)).copied().unwrap_or_default()
    }
}

/// The network namespace `/proc/<pid>/ns/net` names (`net:[INODE]`), when it can be read.
fn namespace_of(pid: &str) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()
}

/// For each network namespace a process is in other than this process's own, once each (at
/// most [`MAX_NAMESPACES`]): the table of one process in it, and the namespace.
fn other_namespaces() -> Vec<(PathBuf, PathBuf)> {
    let mut seen = BTreeSet::new();
    if let Some(mine) = namespace_of("self") {
        seen.insert(mine);
    }
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut tables = Vec::new();
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit())) else { continue };
        let Some(namespace) = namespace_of(pid) else { continue };
        if seen.insert(namespace.clone()) {
            tables.push((PathBuf::from(format!("/proc/{pid}/net/unix")), namespace));
            if tables.len() == MAX_NAMESPACES {
                break;
            }
        }
    }
    tables
}

/// Reads `table` (`/proc/<pid>/net/unix`) if, once open, its process is still in `namespace`:
/// a pid that exited and was given to a process of another namespace meanwhile is not read as
/// the namespace it was in.
fn read_in(table: &Path, namespace: &Path, only: Option<&[&str]>) -> io::Result<UnixSockets> {
    let file = std::fs::File::open(table)?;
    let pid = table.parent().and_then(Path::parent).and_then(Path::file_name).and_then(|p| p.to_str());
    if pid.and_then(namespace_of).as_deref() != Some(namespace) {
        return Err(io::Error::other("the process left the namespace"));
    }
    UnixSockets::read_lines(file, only)
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

    /// A process of its own network namespace, connected to `path` (its connection waits in the
    /// backlog); killed and reaped on drop.
    struct ClientElsewhere(libc::pid_t);

    impl ClientElsewhere {
        fn connect(path: &Path) -> Self {
            use std::os::unix::ffi::OsStrExt;
            // Everything the child uses is made before the fork: it makes system calls only.
            // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
            let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
            addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
            for (dst, src) in addr.sun_path.iter_mut().zip(path.as_os_str().as_bytes()) {
                *dst = *src as libc::c_char;
            }
            let mut ready = [0 as libc::c_int; 2];
            // SAFETY: `ready` is two c_ints the kernel fills.
            assert_eq!(unsafe { libc::pipe(ready.as_mut_ptr()) }, 0);
            // SAFETY: the child makes async-signal-safe system calls only, then pauses or exits.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0);
            if pid == 0 {
                // SAFETY: system calls on values made before the fork; the child never returns.
                unsafe {
                    // The socket is made in the new namespace: a connection's ends are its.
                    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
                    let ok = libc::unshare(libc::CLONE_NEWNET) == 0 && {
                        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                        fd >= 0 && libc::connect(fd, (&raw const addr).cast(), len) == 0
                    };
                    libc::write(ready[1], [u8::from(ok)].as_ptr().cast(), 1);
                    loop {
                        libc::pause();
                    }
                }
            }
            let mut byte = [0u8; 1];
            // SAFETY: reads one byte into `byte`; the pipe is ours.
            let n = unsafe { libc::read(ready[0], byte.as_mut_ptr().cast(), 1) };
            // SAFETY: closing the pipe's two ends, which we own.
            unsafe { (libc::close(ready[0]), libc::close(ready[1])) };
            let me = Self(pid);
            assert!(n == 1 && byte[0] == 1, "the client of another namespace did not connect");
            me
        }
    }

    impl Drop for ClientElsewhere {
        fn drop(&mut self) {
            // SAFETY: our own child, killed and reaped.
            unsafe {
                libc::kill(self.0, libc::SIGKILL);
                libc::waitpid(self.0, std::ptr::null_mut(), 0);
            }
        }
    }

    #[test]
    fn a_client_waiting_from_another_network_namespace_is_seen() {
        // SAFETY: geteuid has no arguments and no memory effects.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("a_client_waiting_from_another_network_namespace_is_seen: needs root: skipped");
            return;
        }
        let dir = std::env::temp_dir().join(format!("hvstats-unix-ns-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        let path = dir.join("l.sock");
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let client = ClientElsewhere::connect(&path);
        // Its waiting connection is in its namespace's table, not in this one's.
        let own = UnixSockets::read_from(Path::new("/proc/self/net/unix"), None).unwrap();
        assert_eq!(own.of(&path), PathUse::default());
        let theirs = format!("/proc/{}/net/unix", client.0);
        assert_eq!(UnixSockets::read_from(Path::new(&theirs), None).unwrap().of(&path).waiting, 1);
        let merged = UnixSockets::read_of([path.as_path()]).unwrap();
        assert_eq!(merged.of(&path), PathUse { accepted: 0, waiting: 1 });
        // Accepted, it is held: counted once, from its namespace.
        let (_held, _) = listener.accept().unwrap();
        let merged = UnixSockets::read_of([path.as_path()]).unwrap();
        assert_eq!(merged.of(&path), PathUse { accepted: 1, waiting: 0 });
        drop(client);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
