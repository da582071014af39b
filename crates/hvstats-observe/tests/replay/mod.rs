//! What the replay tests share: the `kvm_exit`/`kvm_entry` formats, this host's format files,
//! and records laid out as a format says.

// Each test file uses what it needs of this module.
#![allow(dead_code)]

use std::path::Path;

use hvstats_host::bpf::filter::{self, Fields};

/// `kvm:kvm_exit` as Linux 6.18 prints its format, with `requests` (the `print fmt` line is left
/// out: nothing reads it).
pub const KVM_EXIT: &str = "name: kvm_exit\nID: 103\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n\
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n\
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\
\n\
\tfield:unsigned int exit_reason;\toffset:8;\tsize:4;\tsigned:0;\n\
\tfield:unsigned long guest_rip;\toffset:16;\tsize:8;\tsigned:0;\n\
\tfield:u32 isa;\toffset:24;\tsize:4;\tsigned:0;\n\
\tfield:u64 info1;\toffset:32;\tsize:8;\tsigned:0;\n\
\tfield:u64 info2;\toffset:40;\tsize:8;\tsigned:0;\n\
\tfield:u32 intr_info;\toffset:48;\tsize:4;\tsigned:0;\n\
\tfield:u32 error_code;\toffset:52;\tsize:4;\tsigned:0;\n\
\tfield:unsigned int vcpu_id;\toffset:56;\tsize:4;\tsigned:0;\n\
\tfield:u64 requests;\toffset:64;\tsize:8;\tsigned:0;\n\n";

/// `kvm:kvm_entry` (6.18).
pub const KVM_ENTRY: &str = "name: kvm_entry\nID: 115\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n\
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n\
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\
\n\
\tfield:unsigned int vcpu_id;\toffset:8;\tsize:4;\tsigned:0;\n\
\tfield:unsigned long rip;\toffset:16;\tsize:8;\tsigned:0;\n\
\tfield:bool immediate_exit;\toffset:24;\tsize:1;\tsigned:0;\n\
\tfield:u32 intr_info;\toffset:28;\tsize:4;\tsigned:0;\n\
\tfield:u32 error_code;\toffset:32;\tsize:4;\tsigned:0;\n\n";

/// This host's format file of `kvm:NAME`, when it has one.
pub fn host_format(name: &str) -> Option<String> {
    std::fs::read_to_string(Path::new("/sys/kernel/tracing/events/kvm").join(name).join("format")).ok()
}

/// The calling thread's id.
pub fn gettid() -> i32 {
    // SAFETY: gettid has no arguments and no memory effects.
    unsafe { libc::syscall(libc::SYS_gettid) as i32 }
}

/// A record of a tracepoint, laid out as its format says.
pub struct RecordFormat {
    pub id: u64,
    pub fields: Fields,
    pub size: usize,
}

impl RecordFormat {
    pub fn parse(text: &str) -> Self {
        let id =
            text.lines().find_map(|l| l.strip_prefix("ID: ")).and_then(|v| v.trim().parse().ok()).unwrap();
        let fields = filter::parse_format(text);
        let end = fields.values().map(|f| usize::from(f.offset) + usize::from(f.size)).max().unwrap();
        Self { id, fields, size: end.div_ceil(8) * 8 }
    }

    /// The record with `values` (every other field 0), as the kernel writes it for a firing on
    /// thread `tid`; a field the format lacks is a failure of the test.
    pub fn record(&self, tid: i32, values: &[(&str, u64)]) -> Vec<u8> {
        self.write(tid, values, |name| panic!("the format has no field {name}"))
    }

    /// As [`record`](Self::record), leaving out a value of a field the release does not have
    /// (the kernel has nowhere to write it).
    pub fn record_present(&self, tid: i32, values: &[(&str, u64)]) -> Vec<u8> {
        self.write(tid, values, |_| {})
    }

    fn write(&self, tid: i32, values: &[(&str, u64)], missing: impl Fn(&str)) -> Vec<u8> {
        let mut r = vec![0u8; self.size];
        let mut put = |name: &str, v: u64| {
            let Some(f) = self.fields.get(name) else { return missing(name) };
            let at = usize::from(f.offset);
            r[at..at + usize::from(f.size)].copy_from_slice(&v.to_le_bytes()[..usize::from(f.size)]);
        };
        put("common_type", self.id);
        put("common_pid", tid as u32 as u64);
        for &(name, v) in values {
            put(name, v);
        }
        r
    }
}
