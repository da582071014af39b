//! The runtime-directory reader (discovery, attach, snapshot) over generated directory trees.
//!
//! This function is the body of the `runtime_tree` fuzz target and of the workspace test that runs
//! it on random byte strings. The bytes become an instances directory: arenas named for this
//! process or garbage names, live (their publisher's lock held) or dead; each a real arena with
//! bytes changed, truncated or extended, raw bytes, an empty file, a directory or a link in its
//! place, with or without its global arena. Then everything a reader does runs over it:
//! `attach::discover`, and a snapshot of every instance found. Nothing may panic and every reader
//! must end; an instance found is live.
//!
//! [`Hostility`] says how hostile the trees may be: FIFOs in place of arenas are left out of the
//! workspace test (`HVSTATS_FUZZ_HOSTILE=1` puts them in the fuzz target's trees).

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use hvstats::attach::discover;
use hvstats::publish::{ARENA_SUFFIX, GLOBAL_SUFFIX, INSTANCES_DIR, InstanceName, lock, process_start_time};
use hvstats::snapshot::ObjectReading;

use crate::index::sample;

use crate::bytes::Bytes;

/// What the generated trees may contain.
#[derive(Clone, Copy, Debug)]
pub struct Hostility {
    /// FIFOs in place of arenas.
    pub fifos: bool,
}

impl Hostility {
    /// Everything, FIFOs included.
    pub const FULL: Self = Self { fifos: true };
    /// No FIFOs.
    pub const TAME: Self = Self { fifos: false };
}

fn mkfifo(path: &Path) {
    if let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) {
        // SAFETY: c is a valid NUL-terminated path.
        unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    }
}

/// An arena file at `path` made from `template`, as the bytes say.
fn arena(b: &mut Bytes<'_>, path: &Path, template: &[u8], hostility: Hostility) {
    if std::fs::symlink_metadata(path).is_ok() {
        // Never write through what is already there (a FIFO would block the writer).
        return;
    }
    match b.u8() % 12 {
        0 => {
            let _ = std::fs::create_dir(path);
        }
        1 => {
            let _ = std::os::unix::fs::symlink("/etc/hostname", path);
        }
        2 if hostility.fifos => mkfifo(path),
        3 => {
            let _ = std::fs::write(path, b"");
        }
        4 => {
            let n = b.u16();
            let _ = std::fs::write(path, b.take(n));
        }
        n => {
            let mut bytes = template.to_vec();
            match n {
                5 => bytes.truncate(b.u16() * 64),
                6 => bytes.resize(bytes.len() + b.u16() * 64, 0),
                _ => {}
            }
            let changes = b.u8() % 16;
            for _ in 0..changes {
                if bytes.is_empty() {
                    break;
                }
                // Mostly the header and the first index pages, where the structure is.
                let at =
                    if b.u8().is_multiple_of(4) { b.u16() * 64 + b.u16() } else { b.u16() } % bytes.len();
                bytes[at] = b.u8();
            }
            let _ = std::fs::write(path, bytes);
        }
    }
}

/// Builds the tree `data` describes under `runtime_dir` (which must be empty) and runs every
/// reader over it. Returns how many objects were read.
pub fn check(data: &[u8], runtime_dir: &Path, hostility: Hostility) -> usize {
    let (template_arena, template_global) = sample();
    let pid = std::process::id();
    let start_time = process_start_time(pid).expect("this process's start time");
    let instances = runtime_dir.join(INSTANCES_DIR);
    std::fs::DirBuilder::new()
        .mode(0o755)
        .recursive(true)
        .create(&instances)
        .expect("the instances directory");
    let mut b = Bytes(data);
    let mut locks: Vec<File> = Vec::new();
    for seq in 0..4u32 {
        if b.is_empty() {
            break;
        }
        let name = match b.u8() % 8 {
            0 => format!("garbage{seq}"),
            1 => format!("{}", InstanceName { pid: pid + 1, start_time, seq }),
            _ => format!("{}", InstanceName { pid, start_time, seq }),
        };
        let arena_path = instances.join(format!("{name}{ARENA_SUFFIX}"));
        arena(&mut b, &arena_path, template_arena, hostility);
        if b.u8() % 4 != 0 {
            arena(&mut b, &instances.join(format!("{name}{GLOBAL_SUFFIX}")), template_global, hostility);
        }
        // Live: this process holds the publisher's lock, on a regular file only (opening a FIFO
        // would wait for a writer).
        let regular = std::fs::symlink_metadata(&arena_path).is_ok_and(|m| m.file_type().is_file());
        if regular
            && b.u8() % 4 != 0
            && let Ok(f) = File::open(&arena_path)
            && lock(f.as_fd()).is_ok()
        {
            locks.push(f);
        }
    }
    let Ok(found) = discover(runtime_dir) else { return 0 };
    let mut read = 0;
    let ok = |r: &ObjectReading| usize::from(matches!(r, ObjectReading::Counters(_)));
    for mut instance in found.instances {
        assert!(instance.is_live(), "a dead instance was believed");
        let shot = instance.snapshot();
        read += ok(&shot.hypervisor);
        read += shot.lps.iter().map(|lp| ok(&lp.reading)).sum::<usize>();
        for p in &shot.partitions {
            read += ok(&p.reading);
            read += p.vps.iter().map(|vp| ok(&vp.reading)).sum::<usize>();
        }
    }
    drop(locks);
    read
}
