//! Whether a VMM could connect to the Unix socket its command line names, decided before the
//! observer connects to it, and the socket opened so that what was checked is what is connected.
//!
//! The observer runs as root with `CAP_DAC_READ_SEARCH`: it can walk directories the VMM cannot,
//! so a VMM's command line must not lead it to a socket the VMM could not reach itself (a root
//! daemon's socket in a 0700 directory acts on the accept of a root peer as it pleases). The
//! kernel's own decision cannot be asked for another process's credentials from inside the
//! unit's sandbox (no `setuid`, no `AF_NETLINK`), so it is made again here, by the same rules:
//! the path is walked as the VMM sees it, from its root (`/proc/PID/root`), one component at a
//! time with `openat(O_PATH | O_NOFOLLOW)`; each directory looked in must be searchable by the
//! VMM's file-system user and groups (`/proc/PID/status`: the `fs` ids and `Groups:`), and the
//! socket writable by them; a symbolic link is read and its target walked the same way (at most
//! [`MAX_LINKS`] of them). The VMM's `CAP_DAC_OVERRIDE` and `CAP_DAC_READ_SEARCH` count as they
//! do for the kernel, but only for a VMM in this process's user namespace (in another, they
//! apply only to files its namespace maps, which is not worked out here: they are not counted).
//! A directory or socket with a POSIX ACL (`system.posix_acl_access`) is allowed by its owner
//! bits to its owner and refused to anyone else: its ACL is not evaluated. The socket is then
//! connected through `/proc/self/fd/N` of the descriptor that was checked, so a rename or a link
//! swapped in after the check changes nothing. What is trusted: the kernel's `/proc/PID/status`
//! and `/proc/PID/root` of the VMM, and `fstat` of each object walked; nothing the VMM writes.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

use hvstats_host::os::{check, check_long};

/// The most symbolic links followed in one walk (the kernel's `MAXSYMLINKS`).
pub const MAX_LINKS: usize = 40;

/// `CAP_DAC_OVERRIDE`'s bit in `CapEff`.
const CAP_DAC_OVERRIDE: u64 = 1 << 1;
/// `CAP_DAC_READ_SEARCH`'s bit in `CapEff`.
const CAP_DAC_READ_SEARCH: u64 = 1 << 2;

/// Search permission on a directory, as the mode's bits say it.
const SEARCH: u32 = 0o1;
/// Write permission.
const WRITE: u32 = 0o2;

/// Why a socket was not opened.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// The VMM could not reach the socket itself.
    #[error("{0}")]
    Denied(String),
    /// The walk failed (no such file, not a socket, the VMM gone): nothing was decided.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// The credentials the kernel checks a process's file accesses with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Credentials {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
    /// Its effective capabilities that bypass file permissions, where they count.
    dac_override: bool,
    dac_read_search: bool,
}

impl Credentials {
    /// The credentials of process `pid` now.
    ///
    /// # Errors
    /// When its status cannot be read or says no ids.
    pub(crate) fn of(pid: i32) -> io::Result<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let own_namespace = std::fs::read_link(format!("/proc/{pid}/ns/user")).ok()
            == std::fs::read_link("/proc/self/ns/user").ok();
        Self::parse(&status, own_namespace)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("/proc/{pid}/status: no ids")))
    }

    /// Reads a `/proc/PID/status`: the file-system ids (the fourth of `Uid:` and `Gid:`), the
    /// supplementary groups, and, when `capabilities_count`, the effective capabilities.
    fn parse(status: &str, capabilities_count: bool) -> Option<Self> {
        let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
        let fs_id = |name: &str| field(name)?.split_whitespace().nth(3)?.parse::<u32>().ok();
        let groups = field("Groups:")?.split_whitespace().filter_map(|g| g.parse().ok()).collect();
        let caps = match capabilities_count {
            true => u64::from_str_radix(field("CapEff:")?, 16).ok()?,
            false => 0,
        };
        Some(Self {
            uid: fs_id("Uid:")?,
            gid: fs_id("Gid:")?,
            groups,
            dac_override: caps & CAP_DAC_OVERRIDE != 0,
            dac_read_search: caps & CAP_DAC_READ_SEARCH != 0,
        })
    }

    /// True when these credentials have `want` (search or write) on the object `st` describes,
    /// by its mode; `Err` with why not.
    fn may(&self, st: &libc::stat, has_acl: bool, want: u32) -> Result<(), String> {
        let dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        if self.dac_override || (dir && want == SEARCH && self.dac_read_search) {
            return Ok(());
        }
        let (bits, class) = if self.uid == st.st_uid {
            ((st.st_mode >> 6) & 7, "owner")
        } else if has_acl {
            return Err(format!(
                "it has an ACL, which is not evaluated here, and uid {} does not own it",
                self.uid
            ));
        } else if self.gid == st.st_gid || self.groups.contains(&st.st_gid) {
            ((st.st_mode >> 3) & 7, "group")
        } else {
            (st.st_mode & 7, "others")
        };
        if bits & want == want {
            return Ok(());
        }
        let what = if want == SEARCH { "search" } else { "write" };
        Err(format!(
            "uid {} gid {} may not {what} it (mode {:o}, owner {}:{}, as {class})",
            self.uid,
            self.gid,
            st.st_mode & 0o7777,
            st.st_uid,
            st.st_gid
        ))
    }
}

/// Opens the Unix socket at `path` (absolute) as process `pid` reaches it: from its root, every
/// directory searchable and the socket writable by its credentials now. The descriptor is an
/// `O_PATH` one: connect through [`connect_path`] of it.
///
/// # Errors
/// [`AccessError::Denied`] when the VMM could not reach it, with where and why;
/// [`AccessError::Io`] when the walk fails otherwise.
pub(crate) fn open_as(pid: i32, path: &Path) -> Result<OwnedFd, AccessError> {
    let who = Credentials::of(pid)?;
    let root = open_path(None, Path::new(&format!("/proc/{pid}/root")).as_os_str(), libc::O_DIRECTORY)?;
    walk(&root, path, &who)
}

/// The path that connects to the socket `fd` was opened on, whatever its name now.
pub(crate) fn connect_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Walks `path` from `root` as `who`, one component at a time (see the module's text).
fn walk(root: &OwnedFd, path: &Path, who: &Credentials) -> Result<OwnedFd, AccessError> {
    let mut pending: Vec<OsString> = components(path).into_iter().rev().collect();
    // The directories walked below the root, the last the one looked in next.
    let mut dirs: Vec<(OwnedFd, PathBuf)> = Vec::new();
    let mut links = 0;
    while let Some(name) = pending.pop() {
        let (here, at) = dirs.last().map_or((root, Path::new("/")), |(fd, at)| (fd, at.as_path()));
        may(here, at, who, SEARCH)?;
        if name == ".." {
            dirs.pop();
            continue;
        }
        let fd = open_path(Some(here), &name, libc::O_NOFOLLOW)?;
        let st = fstat(&fd)?;
        let at = at.join(&name);
        match st.st_mode & libc::S_IFMT {
            libc::S_IFLNK => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(io::Error::from_raw_os_error(libc::ELOOP).into());
                }
                let target = read_link(&fd)?;
                if target.is_absolute() {
                    dirs.clear();
                }
                pending.extend(components(&target).into_iter().rev());
            }
            libc::S_IFDIR => dirs.push((fd, at)),
            _ if !pending.is_empty() => return Err(io::Error::from_raw_os_error(libc::ENOTDIR).into()),
            libc::S_IFSOCK => {
                may(&fd, &at, who, WRITE)?;
                return Ok(fd);
            }
            _ => return Err(io::Error::from_raw_os_error(libc::ENOTSOCK).into()),
        }
    }
    // The path ended at a directory.
    Err(io::Error::from_raw_os_error(libc::ENOTSOCK).into())
}

/// The names of `path`'s components, `..` kept, `/` and `.` dropped.
fn components(path: &Path) -> Vec<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// Whether `who` may `want` the object `fd` is open on (at `at`, for the message).
fn may(fd: &OwnedFd, at: &Path, who: &Credentials, want: u32) -> Result<(), AccessError> {
    let st = fstat(fd)?;
    who.may(&st, has_acl(fd)?, want)
        .map_err(|why| AccessError::Denied(format!("{}: {why}", at.to_string_lossy().escape_debug())))
}

/// Opens `name` relative to `dir` (or as an absolute path) with `O_PATH` and `flags`.
fn open_path(dir: Option<&OwnedFd>, name: &OsStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    let name = CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let dirfd = dir.map_or(libc::AT_FDCWD, AsRawFd::as_raw_fd);
    // SAFETY: `name` is a NUL-terminated string we own; `dirfd` is a descriptor we hold open or
    // AT_FDCWD; the result is checked before use.
    let raw = check(unsafe { libc::openat(dirfd, name.as_ptr(), libc::O_PATH | libc::O_CLOEXEC | flags) })?;
    // SAFETY: `raw` is a descriptor openat just returned and nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// The `stat` of the object `fd` is open on.
fn fstat(fd: &OwnedFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data; all zeroes is a valid value, overwritten by the kernel.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid stat the kernel writes; `fd` is held open for the call.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// The target of the symbolic link `fd` is open on (`O_PATH | O_NOFOLLOW`).
fn read_link(fd: &OwnedFd) -> io::Result<PathBuf> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: `buf` has `buf.len()` writable bytes; the empty path names `fd` itself.
    let n = check_long(unsafe {
        libc::readlinkat(fd.as_raw_fd(), c"".as_ptr(), buf.as_mut_ptr().cast(), buf.len())
    } as libc::c_long)?;
    buf.truncate(n as usize);
    Ok(PathBuf::from(OsString::from_vec(buf)))
}

/// Whether the object `fd` is open on has a POSIX access ACL.
fn has_acl(fd: &OwnedFd) -> io::Result<bool> {
    let path = CString::new(connect_path(fd).into_os_string().into_vec())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: both strings are NUL-terminated and ours; a null buffer of size 0 asks the size.
    let n = unsafe {
        libc::getxattr(path.as_ptr(), c"system.posix_acl_access".as_ptr(), std::ptr::null_mut(), 0)
    };
    match check_long(n as libc::c_long) {
        Ok(n) => Ok(n > 0),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENODATA | libc::EOPNOTSUPP)) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    const NOBODY: &str = "Name:\tqemu\nUid:\t65534\t65534\t65534\t65534\nGid:\t65534\t65534\t65534\t65534\n\
                          Groups:\t \nCapEff:\t0000000000000000\n";

    #[test]
    fn the_file_system_ids_groups_and_capabilities_are_read_from_the_status() {
        let status = "Uid:\t0\t1000\t0\t1001\nGid:\t5\t6\t7\t8\nGroups:\t10 20 \nCapEff:\t0000000000000004\n";
        let c = Credentials::parse(status, true).unwrap();
        assert_eq!((c.uid, c.gid, c.groups.as_slice()), (1001, 8, &[10, 20][..]));
        assert!(!c.dac_override && c.dac_read_search);
        // In another user namespace its capabilities do not count here.
        assert!(!Credentials::parse(status, false).unwrap().dac_read_search);
        assert_eq!(Credentials::parse("Uid:\t1\n", true), None);
        assert!(Credentials::parse(NOBODY, true).unwrap().groups.is_empty());
    }

    /// `dir` made afresh with `mode`.
    fn fresh(dir: &Path, mode: u32) {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Gives `dir` the access ACL `u::rwx,u:UID:---,g::r-x,m::r-x,o::r-x`; false where the file
    /// system has none.
    fn set_acl_denying(dir: &Path, uid: u32) -> bool {
        let mut acl = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in
            [(1u16, 7u16, u32::MAX), (2, 0, uid), (4, 5, u32::MAX), (0x10, 5, u32::MAX), (0x20, 5, u32::MAX)]
        {
            acl.extend(tag.to_le_bytes());
            acl.extend(perm.to_le_bytes());
            acl.extend(id.to_le_bytes());
        }
        let path = CString::new(dir.as_os_str().as_bytes()).unwrap();
        // SAFETY: NUL-terminated strings and a buffer of `acl.len()` bytes, all ours.
        let rc = unsafe {
            libc::setxattr(
                path.as_ptr(),
                c"system.posix_acl_access".as_ptr(),
                acl.as_ptr().cast(),
                acl.len(),
                0,
            )
        };
        rc == 0
    }

    #[test]
    fn a_socket_is_reached_only_through_directories_the_process_may_search() {
        // SAFETY: geteuid has no arguments and no memory effects.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!(
                "a_socket_is_reached_only_through_directories_the_process_may_search: needs root: skipped"
            );
            return;
        }
        let base = std::env::temp_dir().join(format!("hvstats-reach-{}", std::process::id()));
        fresh(&base, 0o755);
        let (open, closed) = (base.join("open"), base.join("closed"));
        fresh(&open, 0o755);
        fresh(&closed, 0o700);
        let sock = closed.join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let mine = open.join("m.sock");
        let _other = std::os::unix::net::UnixListener::bind(&mine).unwrap();
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o777)).unwrap();
        let root = open_path(None, OsStr::new("/"), libc::O_DIRECTORY).unwrap();
        let nobody = Credentials::parse(NOBODY, true).unwrap();
        let root_without_caps =
            Credentials { uid: 0, gid: 0, groups: Vec::new(), dac_override: false, dac_read_search: false };
        let denied = |r: Result<OwnedFd, AccessError>| match r {
            Err(AccessError::Denied(why)) => why,
            other => panic!("{other:?}"),
        };
        let why = denied(walk(&root, &sock, &nobody));
        assert!(why.contains("closed: uid 65534 gid 65534 may not search it (mode 700"), "{why}");
        // Its owner may, with no capability.
        assert!(walk(&root, &sock, &root_without_caps).is_ok());
        // Through a link, or `..`, the directory is still on the way.
        std::os::unix::fs::symlink(&closed, open.join("link")).unwrap();
        denied(walk(&root, &open.join("link/s.sock"), &nobody));
        denied(walk(&root, &open.join("../closed/s.sock"), &nobody));
        // A socket nobody may write, in a directory it may search, is refused too.
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o755)).unwrap();
        let why = denied(walk(&root, &mine, &nobody));
        assert!(why.contains("may not write it"), "{why}");
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(walk(&root, &mine, &nobody).is_ok());
        assert!(walk(&root, &open.join("../open/./m.sock"), &nobody).is_ok());
        // A loop of links ends.
        std::os::unix::fs::symlink("loop", open.join("loop")).unwrap();
        match walk(&root, &open.join("loop"), &nobody) {
            Err(AccessError::Io(e)) => assert_eq!(e.raw_os_error(), Some(libc::ELOOP)),
            other => panic!("{other:?}"),
        }
        // A directory whose ACL denies nobody what its mode's other bits grant: refused.
        let acl = base.join("acl");
        fresh(&acl, 0o755);
        if set_acl_denying(&acl, 65534) {
            std::fs::rename(&mine, acl.join("m.sock")).unwrap();
            let why = denied(walk(&root, &acl.join("m.sock"), &nobody));
            assert!(why.contains("it has an ACL, which is not evaluated here"), "{why}");
            assert!(walk(&root, &acl.join("m.sock"), &root_without_caps).is_ok(), "its owner");
            std::fs::rename(acl.join("m.sock"), &mine).unwrap();
        } else {
            eprintln!("no POSIX ACL on {}: the ACL case is not tried", acl.display());
        }
        // The descriptor checked connects.
        let fd = walk(&root, &mine, &nobody).unwrap();
        assert!(std::os::unix::net::UnixStream::connect(connect_path(&fd)).is_ok());
        let _ = std::fs::remove_dir_all(&base);
    }
}
