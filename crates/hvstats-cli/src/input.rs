//! Reading the files a user names (a page to `dump`, an image to `run`): only regular files, and
//! never more than the command accepts.
//!
//! `fs::read` follows whatever the path is: `/dev/zero` grows without end, a FIFO with no writer
//! blocks forever. Here the file is opened non-blocking (so a FIFO cannot hang the open), checked
//! to be a regular file, and read up to one byte past the limit, so an oversized file is refused
//! after reading a bounded amount.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use anyhow::{Context, bail};

/// What a path is, in words, for an error message.
fn kind_of(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Opens `path` for reading if it is a regular file.
///
/// # Errors
/// When it cannot be opened, or is a directory, FIFO, device or socket.
pub(crate) fn open_regular(path: &Path) -> anyhow::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let meta = file.metadata().with_context(|| format!("cannot examine {}", path.display()))?;
    if !meta.file_type().is_file() {
        bail!("{} is {}, not a regular file", path.display(), kind_of(meta.file_type()));
    }
    Ok(file)
}

/// The first `max + 1` bytes at most of the regular file `path` (so a caller sees that a file is
/// too long without reading all of it).
///
/// # Errors
/// When it is not a regular file or cannot be read.
pub(crate) fn read_prefix(path: &Path, max: u64) -> anyhow::Result<Vec<u8>> {
    let file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok(bytes)
}

/// The contents of the regular file `path`, at most `max` bytes (`what` names it in errors,
/// e.g. "an image").
///
/// # Errors
/// When it is not a regular file, cannot be read, or holds more than `max` bytes.
pub(crate) fn read_regular(path: &Path, max: u64, what: &str) -> anyhow::Result<Vec<u8>> {
    let bytes = read_prefix(path, max)?;
    if bytes.len() as u64 > max {
        bail!("{} is larger than {what} can be ({max} bytes at most)", path.display());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_directories_are_refused_by_name() {
        let e = read_regular(Path::new("/dev/zero"), 4096, "a stats page").unwrap_err();
        assert!(e.to_string().contains("a character device"), "{e:#}");
        let e = read_regular(Path::new("/"), 4096, "a stats page").unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e:#}");
    }

    #[test]
    fn a_file_over_the_limit_is_refused_and_one_at_it_read() {
        let dir = std::env::temp_dir().join(format!("hvstats-input-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, [7u8; 10]).unwrap();
        assert_eq!(read_regular(&path, 10, "x").unwrap(), vec![7u8; 10]);
        let e = read_regular(&path, 9, "an image").unwrap_err();
        assert!(e.to_string().contains("larger than an image can be (9 bytes at most)"), "{e:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
