//! The runtime-directory reader (discovery, attach, snapshot) over generated directory trees.
//!
//! This function is the body of the `runtime_tree` fuzz target and of the workspace test that runs
//! it on random byte strings. The bytes become a runtime directory: instance directories named for
//! this (live) process or for dead ones, staging directories, stray names; manifests that are
//! valid, nearly valid or garbage; page files of every length, directories or links in their
//! place. Then everything a reader does runs over it: `attach::discover`, and a full
//! `snapshot::take` of each instance found. Nothing may panic, and every reader must end.
//!
//! [`Hostility`] says how hostile the trees may be: FIFOs in place of files, and counts in the
//! manifest that would make a reader that trusts them allocate without bound, are what the
//! runtime-directory hardening must withstand; the workspace test leaves them out until it does.

use std::path::Path;

use hvstats::attach::{RootReader, discover};
use hvstats::publish::{InstanceName, MANIFEST_FORMAT, process_start_time};
use hvstats::snapshot::{self, ObjectReading};
use hvstats_abi::ObjectKind;
use hvstats_abi::page::StatsPage;
use zerocopy::IntoBytes;

/// What the generated trees may contain.
#[derive(Clone, Copy, Debug)]
pub struct Hostility {
    /// FIFOs in place of manifests and page files.
    pub fifos: bool,
    /// The largest `vp_count` a manifest may claim.
    pub max_vp_count: u32,
}

impl Hostility {
    /// Everything: FIFOs, and any `vp_count`.
    pub const FULL: Self = Self { fifos: true, max_vp_count: u32::MAX };
    /// No FIFOs, and `vp_count` up to 64.
    pub const TAME: Self = Self { fifos: false, max_vp_count: 64 };
}

/// Bytes taken one field at a time; zeros once they run out.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn u32(&mut self) -> u32 {
        (0..4).fold(0, |v, i| v | u32::from(self.u8()) << (8 * i))
    }

    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn mkfifo(path: &Path) {
    if let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) {
        // SAFETY: c is a valid NUL-terminated path.
        unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    }
}

/// A page file at `path`: a valid page of `kind` (a few bytes perhaps changed), bytes of a chosen
/// length, a directory, a link, or a FIFO.
fn file(b: &mut Bytes<'_>, path: &Path, kind: ObjectKind, hostility: Hostility) {
    if let Some(parent) = path.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    match b.u8() % 10 {
        0 => {
            let _ = std::fs::create_dir_all(path);
        }
        1 => {
            let _ = std::os::unix::fs::symlink("/etc/hostname", path);
        }
        2 if hostility.fifos => mkfifo(path),
        n => {
            let mut bytes = StatsPage::new(kind).as_bytes().to_vec();
            match n {
                3 => bytes.clear(),
                4 => bytes.truncate(4095),
                5 => bytes.resize(8192, 0),
                6 | 7 => {
                    let changes = usize::from(b.u8() % 8);
                    for _ in 0..changes {
                        let at = (usize::from(b.u8()) << 4 | usize::from(b.u8() % 16)) % bytes.len();
                        bytes[at] = b.u8();
                    }
                }
                _ => {}
            }
            let _ = std::fs::write(path, bytes);
        }
    }
}

fn manifest(b: &mut Bytes<'_>, pid: u32, start_time: u64, hostility: Hostility) -> Vec<u8> {
    if b.u8() % 6 == 0 {
        let n = usize::from(b.u8());
        return b.take(n).to_vec();
    }
    let lps: Vec<String> =
        (0..b.u8() % 5).map(|i| format!(r#"{{"index":{i},"cpu":{}}}"#, b.u8() % 4)).collect();
    let partitions: Vec<String> = (0..b.u8() % 4)
        .map(|_| {
            let vp_count = match b.u8() % 4 {
                0 => b.u32(),
                _ => u32::from(b.u8() % 5),
            }
            .min(hostility.max_vp_count);
            format!(r#"{{"id":{},"vp_count":{vp_count},"active":{}}}"#, b.u8() % 4, b.u8() % 2 == 0)
        })
        .collect();
    let format = if b.u8() % 8 == 0 { MANIFEST_FORMAT + 1 } else { MANIFEST_FORMAT };
    format!(
        r#"{{"format":{format},"pid":{pid},"start_time":{start_time},"created_unix_ms":1,"logical_processors":[{}],"partitions":[{}]}}"#,
        lps.join(","),
        partitions.join(",")
    )
    .into_bytes()
}

/// Builds the tree `data` describes under `runtime_dir` (which must be empty) and runs every
/// reader over it. Returns how many objects were read.
pub fn check(data: &[u8], runtime_dir: &Path, hostility: Hostility) -> usize {
    let pid = std::process::id();
    let start_time = process_start_time(pid).expect("this process's start time");
    let instances = runtime_dir.join("instances");
    std::fs::create_dir_all(&instances).expect("the instances directory");
    let mut b = Bytes(data);
    for seq in 0..4u32 {
        if b.is_empty() {
            break;
        }
        let name = match b.u8() % 6 {
            0 => format!(".{}.staging", InstanceName { pid, start_time, seq }),
            1 => format!("{}", InstanceName { pid, start_time: start_time + 1, seq }),
            2 => "not-an-instance".to_owned(),
            _ => format!("{}", InstanceName { pid, start_time, seq }),
        };
        let dir = instances.join(name);
        let _ = std::fs::create_dir_all(&dir);
        if b.u8() % 8 == 0 && hostility.fifos {
            mkfifo(&dir.join("manifest.json"));
        } else {
            let _ = std::fs::write(dir.join("manifest.json"), manifest(&mut b, pid, start_time, hostility));
        }
        file(&mut b, &dir.join("hypervisor.page"), ObjectKind::Hypervisor, hostility);
        for n in 0..b.u8() % 3 {
            file(&mut b, &dir.join("lp").join(format!("{n}.page")), ObjectKind::LogicalProcessor, hostility);
        }
        for id in 0..b.u8() % 3 {
            let p = dir.join("partition").join(id.to_string());
            file(&mut b, &p.join("partition.page"), ObjectKind::Partition, hostility);
            for n in 0..b.u8() % 3 {
                file(&mut b, &p.join("vp").join(format!("{n}.page")), ObjectKind::Vp, hostility);
            }
        }
    }
    let Ok(found) = discover(runtime_dir) else { return 0 };
    let mut read = 0;
    let ok = |r: &ObjectReading| usize::from(matches!(r, ObjectReading::Counters(_)));
    for instance in found.instances {
        let mut reader = RootReader::new(instance);
        let shot = snapshot::take(&mut reader);
        read += ok(&shot.hypervisor);
        read += shot.lps.iter().map(|lp| ok(&lp.reading)).sum::<usize>();
        for p in &shot.partitions {
            read += ok(&p.reading);
            read += p.vps.iter().map(|vp| ok(&vp.reading)).sum::<usize>();
        }
    }
    read
}
