//! Where a raw tracepoint program finds the fields the filters name: the tracepoint's arguments
//! (`TP_PROTO`), one `u64` each in the program's context, instead of the record's layout.
//!
//! tracefs describes records, not arguments, so the arguments of the tracepoints whose fields
//! the observer filters on are listed here, and used only when the record's fields of the same
//! names are there with the sizes listed (a kernel whose tracepoint changed falls back to the
//! classic program). A tracepoint counted without a filter needs no field, so any tracepoint can
//! be counted raw.

use super::filter::{Field, Fields};

/// A tracepoint's filtered-on fields as arguments: (field, argument index, size in bytes).
type Arguments = &'static [(&'static str, u16, u8)];

/// (system, tracepoint, arguments) of the tracepoints filtered on.
const ARGUMENTS: &[(&str, &str, Arguments)] = &[
    // TP_PROTO(__u32 reason, int errno)
    ("kvm", "kvm_userspace_exit", &[("reason", 0, 4), ("errno", 1, 4)]),
    // TP_PROTO(int type, int len, u64 gpa, void *val)
    ("kvm", "kvm_mmio", &[("type", 0, 4), ("len", 1, 4), ("gpa", 2, 8)]),
    // TP_PROTO(__u32 icr_low, __u32 dest_id)
    ("kvm", "kvm_apic_ipi", &[("icr_low", 0, 4), ("dest_id", 1, 4)]),
    // TP_PROTO(unsigned write, u32 ecx, u64 data, bool exception)
    ("kvm", "kvm_msr", &[("write", 0, 4), ("ecx", 1, 4), ("data", 2, 8)]),
    // TP_PROTO(unsigned int rw, unsigned int reg, u64 val)
    ("kvm", "kvm_apic", &[("rw", 0, 4), ("reg", 1, 4), ("val", 2, 8)]),
];

/// The fields of `system:name` as a raw tracepoint program reads them, when the `filters` can be
/// evaluated there: none needs a field, or the tracepoint's arguments are known and match its
/// record's fields (`record`).
pub fn fields(system: &str, name: &str, record: &Fields, filters: &[Option<&str>]) -> Option<Fields> {
    if filters.iter().all(Option::is_none) {
        return Some(Fields::new());
    }
    let (_, _, args) = ARGUMENTS.iter().find(|(s, n, _)| *s == system && *n == name)?;
    let mut fields = Fields::new();
    for &(field, arg, size) in *args {
        let in_record = record.get(field)?;
        if in_record.size != size {
            return None;
        }
        // Little-endian: the low bytes of the argument's u64 are the value.
        fields.insert(field.to_owned(), Field { offset: 8 * arg, size, signed: in_record.signed });
    }
    cfg!(target_endian = "little").then_some(fields)
}

#[cfg(test)]
mod tests {
    use super::super::filter::parse_format;
    use super::*;

    const USERSPACE_EXIT: &str = "format:\n\tfield:__u32 reason;\toffset:8;\tsize:4;\tsigned:0;\n\tfield:int errno;\toffset:12;\tsize:4;\tsigned:1;\n";

    #[test]
    fn arguments_replace_record_offsets_only_where_the_record_agrees() {
        let record = parse_format(USERSPACE_EXIT);
        let raw = fields("kvm", "kvm_userspace_exit", &record, &[Some("reason == 2")]).unwrap();
        assert_eq!(raw["reason"], Field { offset: 0, size: 4, signed: false });
        assert_eq!(raw["errno"], Field { offset: 8, size: 4, signed: true });
        // Unfiltered: any tracepoint.
        assert_eq!(fields("kvm", "kvm_pio", &Fields::new(), &[None, None]), Some(Fields::new()));
        // Filtered, arguments unknown (kvm_exit's reason is not an argument): the classic program.
        assert_eq!(fields("kvm", "kvm_exit", &record, &[Some("exit_reason == 10")]), None);
        // A record that changed: the classic program.
        let changed = parse_format("format:\n\tfield:__u64 reason;\toffset:8;\tsize:8;\tsigned:0;\n");
        assert_eq!(fields("kvm", "kvm_userspace_exit", &changed, &[Some("reason == 2")]), None);
    }
}
