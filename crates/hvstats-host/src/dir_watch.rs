//! A directory watched for names made or removed in it (`inotify(7)`), so that a listing of it is
//! taken again only when one was: KVM's debugfs directory holds one entry per VM of the host, and
//! listing it at every tick costs the observer more than anything else it does once a tick.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::os as sys;

/// What a change of the directory's names raises: a name made, removed or moved in or out.
const CHANGES: u32 = libc::IN_CREATE | libc::IN_DELETE | libc::IN_MOVED_FROM | libc::IN_MOVED_TO;
/// What ends a watch: the directory removed or moved, its file system unmounted, the watch
/// removed, or events lost to a full queue. A watch that ended is made again.
const ENDS: u32 =
    libc::IN_DELETE_SELF | libc::IN_MOVE_SELF | libc::IN_UNMOUNT | libc::IN_IGNORED | libc::IN_Q_OVERFLOW;
/// Bytes of an event before its name (`struct inotify_event`).
const HEADER: usize = std::mem::size_of::<libc::inotify_event>();
/// Reads of the queue a call makes at most: a queue still not empty after them is taken as a
/// change, and what is left of it is read at the next call (which then says a change again).
const READS: usize = 16;

/// A watch of one directory's names.
#[derive(Debug)]
pub struct DirWatch {
    fd: OwnedFd,
    buf: Vec<u8>,
}

/// What a watch saw since it was last asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// No name was made, removed or moved.
    Quiet,
    /// A name was made, removed or moved.
    Changed,
    /// The watch ended (see [`ENDS`]): the directory must be listed, and a new watch made.
    Ended,
}

impl DirWatch {
    /// Watches `dir`. Made before a listing, so that no change after the listing is missed.
    ///
    /// # Errors
    /// What `inotify_init1(2)` or `inotify_add_watch(2)` returns (EMFILE: the user's instances
    /// are spent; EACCES: `dir` may not be read; ENOTDIR).
    pub fn new(dir: &Path) -> io::Result<Self> {
        let path = CString::new(dir.as_os_str().as_bytes())?;
        // SAFETY: inotify_init1 takes flags only and returns a new descriptor or -1.
        let raw = sys::check(unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) })?;
        // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: `fd` is an inotify instance we hold and `path` a NUL-terminated string that
        // outlives the call; the call reads the path and returns a watch number or -1.
        sys::check(unsafe {
            libc::inotify_add_watch(fd.as_raw_fd(), path.as_ptr(), CHANGES | libc::IN_ONLYDIR)
        })?;
        Ok(Self { fd, buf: vec![0; 4096] })
    }

    /// True when events wait to be read ([`take`](Self::take) would not say `Quiet`), or that
    /// cannot be told; without reading them.
    pub fn pending(&self) -> bool {
        let mut bytes: libc::c_int = 0;
        // SAFETY: FIONREAD writes the bytes waiting into the int we pass, and nothing else.
        let asked = unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::FIONREAD, &mut bytes) };
        asked != 0 || bytes != 0
    }

    /// What happened to the directory's names since the last call (or since the watch was made),
    /// the events read off the queue.
    pub fn take(&mut self) -> Seen {
        let mut seen = Seen::Quiet;
        for _ in 0..READS {
            // SAFETY: reads at most `buf.len()` bytes into `buf`, which we own for the call.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), self.buf.as_mut_ptr().cast(), self.buf.len()) };
            let n = match sys::check_long(n as libc::c_long) {
                Ok(n) => n as usize,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return seen,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return Seen::Ended,
            };
            if n == 0 {
                return Seen::Ended;
            }
            if events(&self.buf[..n]).any(|mask| mask & ENDS != 0) {
                return Seen::Ended;
            }
            seen = Seen::Changed;
        }
        // The queue still holds events: a change, and the rest is read at the next call.
        Seen::Changed
    }
}

/// The masks of the events in `bytes`, as one read gave them (whole events only).
fn events(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        let header = bytes.get(at..at + HEADER)?;
        let word = |i: usize| u32::from_ne_bytes([header[i], header[i + 1], header[i + 2], header[i + 3]]);
        // struct inotify_event { int wd; uint32_t mask; uint32_t cookie; uint32_t len; char name[]; }
        let (mask, len) = (word(4), word(12) as usize);
        at += HEADER + len;
        Some(mask)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of this test's own, removed at the end.
    struct TempDir(std::path::PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("hvstats-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn names_made_and_removed_are_seen_once_and_the_directory_removed_ends_the_watch() {
        let dir = TempDir::new("dir-watch-names");
        let kvm = dir.path().join("kvm");
        std::fs::create_dir(&kvm).unwrap();
        let mut watch = DirWatch::new(&kvm).unwrap();
        assert_eq!(watch.take(), Seen::Quiet, "nothing happened yet");
        assert!(!watch.pending());
        std::fs::create_dir(kvm.join("123-11")).unwrap();
        assert!(watch.pending() && watch.pending(), "told without reading");
        assert_eq!(watch.take(), Seen::Changed);
        assert!(!watch.pending());
        assert_eq!(watch.take(), Seen::Quiet, "a change is said once");
        std::fs::write(kvm.join("123-11").join("vcpu0"), "").unwrap();
        assert_eq!(watch.take(), Seen::Quiet, "what happens in an entry is not a change of names");
        std::fs::write(kvm.join("file"), "").unwrap();
        std::fs::rename(kvm.join("file"), kvm.join("moved")).unwrap();
        std::fs::remove_file(kvm.join("moved")).unwrap();
        assert_eq!(watch.take(), Seen::Changed);
        // Many more events than one read holds: each call says a change until the queue is empty.
        for i in 0..2_000 {
            std::fs::create_dir(kvm.join(format!("{i}-{i}"))).unwrap();
        }
        let mut calls = 0;
        while watch.take() == Seen::Changed {
            calls += 1;
        }
        assert!(calls >= 1, "2,000 entries made are a change");
        std::fs::remove_dir_all(&kvm).unwrap();
        assert_eq!(watch.take(), Seen::Ended, "the directory removed ends the watch");
    }

    #[test]
    fn a_directory_that_is_not_there_or_not_one_cannot_be_watched() {
        let dir = TempDir::new("dir-watch-absent");
        assert!(DirWatch::new(&dir.path().join("absent")).is_err());
        std::fs::write(dir.path().join("file"), "").unwrap();
        assert!(DirWatch::new(&dir.path().join("file")).is_err(), "IN_ONLYDIR");
    }

    #[test]
    fn events_are_read_back_with_their_names_passed_over() {
        let event = |mask: u32, name: &[u8]| {
            let len = name.len().next_multiple_of(4) as u32;
            let mut b = Vec::new();
            for w in [1u32, mask, 0, len] {
                b.extend(w.to_ne_bytes());
            }
            b.extend(name);
            b.resize(HEADER + len as usize, 0);
            b
        };
        let mut bytes = event(libc::IN_CREATE, b"123-45");
        bytes.extend(event(libc::IN_IGNORED, b""));
        bytes.extend(&[0; HEADER - 1]);
        assert_eq!(
            events(&bytes).collect::<Vec<_>>(),
            [libc::IN_CREATE, libc::IN_IGNORED],
            "a cut event is none"
        );
    }
}
