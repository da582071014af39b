//! Where the running kernel keeps what a BPF program reads, from its own type information
//! (`/sys/kernel/btf/vmlinux`, the BTF format of Documentation/bpf/btf.rst): the id of a
//! function (what a tracing program attaches to) and the offset and size of a member of a struct,
//! nested members (`se.sum_exec_runtime`) included. Nothing is assumed of a kernel's layout.
//!
//! A module's structures are in its own blob (`/sys/kernel/btf/kvm` where KVM is a module), split
//! BTF on top of the kernel's ([`Btf::with_module`]): its type ids follow the kernel's last, its
//! members name the kernel's types by the kernel's ids, and a name offset past the kernel's
//! strings is one of its own.
//!
//! A reader of its own rather than a BTF crate's: `btf-rs` 2.0 and `btfparse` 1.3 read every type
//! of the kernel's BTF into maps and names (243 ms and 41 MB at their peak, and 338 ms and 62 MB,
//! measured on Linux 6.18 for the observer, whose unit's memory is bounded; `btf-rs` is also
//! LGPL), where the few answers needed here take one walk over the type section and an index of
//! where each type starts (4 bytes a type), freed once the answers are had.

use std::io;

/// The kernel's type information.
pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";
/// Where the kernel puts each loaded module's type information, by the module's name.
const MODULES: &str = "/sys/kernel/btf";

const MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_TYPE_TAG: u32 = 18;

/// A member's place in its outermost struct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    /// Bytes from the start of the struct.
    pub offset: u32,
    /// Bytes of the member's type.
    pub size: u32,
}

/// Why the type information does not answer.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    /// It cannot be read.
    #[error("cannot read the kernel's type information: {0}")]
    Io(#[from] io::Error),
    /// It is not BTF, or is cut short.
    #[error("the kernel's type information is malformed ({0})")]
    Malformed(&'static str),
    /// A name it does not have.
    #[error("the kernel has no {0}")]
    Missing(String),
    /// A member that is a bitfield, or not byte-aligned.
    #[error("{0} is a bitfield")]
    Bitfield(String),
}

/// The type section and strings of one BTF blob, with where each type starts, and the blob it
/// is split from, if any.
pub struct Btf {
    data: Vec<u8>,
    types: std::ops::Range<usize>,
    strings: std::ops::Range<usize>,
    /// By type id - `first_id`, the offset of its `struct btf_type` in `data`.
    starts: Vec<u32>,
    /// The blob this one is split from (the kernel's, for a module's): its types and strings
    /// come first.
    base: Option<Box<Btf>>,
    /// The id of this blob's first type: 1, or the one after its base's last.
    first_id: u32,
    /// The name offset of this blob's first string: 0, or its base's strings' length.
    first_name: u32,
}

impl Btf {
    /// Reads the running kernel's type information.
    ///
    /// # Errors
    /// When it cannot be read or is malformed.
    pub fn vmlinux() -> Result<Self, BtfError> {
        Self::parse(std::fs::read(VMLINUX)?)
    }

    /// The running kernel's type information, with that of `module` on top where it is a loaded
    /// module (`/sys/kernel/btf/<module>`); the kernel's alone where it is built in (or has no
    /// BTF of its own: its names are then missing, said when asked for).
    ///
    /// # Errors
    /// When either cannot be read or is malformed.
    pub fn with_module(module: &str) -> Result<Self, BtfError> {
        let vmlinux = Self::vmlinux()?;
        match std::fs::read(std::path::Path::new(MODULES).join(module)) {
            Ok(data) => Self::parse_split(data, vmlinux),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(vmlinux),
            Err(e) => Err(e.into()),
        }
    }

    /// Parses a BTF blob (the host's byte order).
    ///
    /// # Errors
    /// When it is malformed.
    pub fn parse(data: Vec<u8>) -> Result<Self, BtfError> {
        Self::parse_on(data, None)
    }

    /// Parses a BTF blob split from `base` (a module's, on top of the kernel's): names and
    /// types of either are found in the one returned.
    ///
    /// # Errors
    /// When it is malformed.
    pub fn parse_split(data: Vec<u8>, base: Btf) -> Result<Self, BtfError> {
        Self::parse_on(data, Some(Box::new(base)))
    }

    fn parse_on(data: Vec<u8>, base: Option<Box<Btf>>) -> Result<Self, BtfError> {
        let u32_at = |off: usize| -> Result<u32, BtfError> { word(&data, off) };
        let magic = data.get(..2).map(|m| u16::from_ne_bytes([m[0], m[1]]));
        if magic != Some(MAGIC) {
            return Err(BtfError::Malformed("no BTF magic"));
        }
        let header = u32_at(4)? as usize;
        let (type_off, type_len) = (u32_at(8)? as usize, u32_at(12)? as usize);
        let (str_off, str_len) = (u32_at(16)? as usize, u32_at(20)? as usize);
        let types = header + type_off..header + type_off + type_len;
        let strings = header + str_off..header + str_off + str_len;
        if types.end > data.len() || strings.end > data.len() {
            return Err(BtfError::Malformed("a section past the end"));
        }
        let (first_id, first_name) = match &base {
            Some(base) => (base.end_id(), base.end_name()),
            None => (1, 0),
        };
        let mut me = Self { data, types, strings, starts: Vec::new(), base, first_id, first_name };
        me.index()?;
        Ok(me)
    }

    /// The id after this blob's last type.
    fn end_id(&self) -> u32 {
        self.first_id.saturating_add(u32::try_from(self.starts.len()).unwrap_or(u32::MAX))
    }

    /// The name offset after this blob's last string.
    fn end_name(&self) -> u32 {
        self.first_name.saturating_add(u32::try_from(self.strings.len()).unwrap_or(u32::MAX))
    }

    /// Records where each type starts.
    fn index(&mut self) -> Result<(), BtfError> {
        let mut at = self.types.start;
        while at < self.types.end {
            self.starts.push(u32::try_from(at).map_err(|_| BtfError::Malformed("too large"))?);
            let info = word(&self.data, at + 4)?;
            let vlen = (info & 0xffff) as usize;
            let extra = match kind(info) {
                1 | 14 | 17 => 4,             // int, var, decl tag
                3 => 12,                      // array
                4 | 5 | 15 | 19 => 12 * vlen, // struct, union, datasec, enum64
                6 | 13 => 8 * vlen,           // enum, func proto
                0 | 2 | 7..=12 | 16 | 18 => 0,
                _ => return Err(BtfError::Malformed("a type of unknown kind")),
            };
            at += 12 + extra;
        }
        Ok(())
    }

    fn name(&self, name_off: u32) -> &[u8] {
        let Some(own) = name_off.checked_sub(self.first_name) else {
            return self.base.as_ref().map_or(&[][..], |base| base.name(name_off));
        };
        let start = self.strings.start + own as usize;
        let tail = self.data.get(start..self.strings.end).unwrap_or_default();
        &tail[..tail.iter().position(|b| *b == 0).unwrap_or(tail.len())]
    }

    /// `(name_off, info, size_or_type)` of type `id` (from 1), the blob that holds it, and
    /// where it starts there.
    fn header(&self, id: u32) -> Result<(u32, u32, u32, &[u8], usize), BtfError> {
        let Some(own) = id.checked_sub(self.first_id) else {
            return self.base.as_ref().ok_or(BtfError::Malformed("a bad type id"))?.header(id);
        };
        let at = *self.starts.get(own as usize).ok_or(BtfError::Malformed("a bad type id"))? as usize;
        let data = &self.data[..];
        Ok((word(data, at)?, word(data, at + 4)?, word(data, at + 8)?, data, at))
    }

    /// The id of the type of kind `want` named `name`: this blob's own first (a module's
    /// structure before one of the kernel's of the same name), then its base's.
    fn id_of(&self, want: u32, name: &str) -> Result<u32, BtfError> {
        let own = (self.first_id..self.end_id()).find(|&id| {
            self.header(id).is_ok_and(|(n, info, ..)| kind(info) == want && self.name(n) == name.as_bytes())
        });
        match (own, &self.base) {
            (Some(id), _) => Ok(id),
            (None, Some(base)) => base.id_of(want, name),
            (None, None) => Err(BtfError::Missing(name.to_string())),
        }
    }

    /// The id of function `name` (what a tracing program names to attach to it).
    ///
    /// # Errors
    /// When the kernel has no such function.
    pub fn func(&self, name: &str) -> Result<u32, BtfError> {
        self.id_of(KIND_FUNC, name)
    }

    /// The offset and size of member `path` (names joined by dots) of struct `ty`.
    ///
    /// # Errors
    /// When the struct or a member is missing, or the member is a bitfield.
    pub fn member(&self, ty: &str, path: &str) -> Result<Member, BtfError> {
        let mut id = self.id_of(KIND_STRUCT, ty)?;
        let mut offset = 0u32;
        for part in path.split('.') {
            let (bits, member_type) = self
                .find_member(self.resolved(id)?, part)?
                .ok_or_else(|| BtfError::Missing(format!("{ty}.{path}")))?;
            if bits % 8 != 0 {
                return Err(BtfError::Bitfield(format!("{ty}.{path}")));
            }
            offset += bits / 8;
            id = member_type;
        }
        Ok(Member { offset, size: self.size_of(id)? })
    }

    /// Type `id` without its typedefs and qualifiers.
    fn resolved(&self, mut id: u32) -> Result<u32, BtfError> {
        for _ in 0..32 {
            let (_, info, ty, ..) = self.header(id)?;
            match kind(info) {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => id = ty,
                _ => return Ok(id),
            }
        }
        Err(BtfError::Malformed("a loop of typedefs"))
    }

    /// The bit offset and type of member `name` of struct or union `id`, looking into its
    /// anonymous members too.
    fn find_member(&self, id: u32, name: &str) -> Result<Option<(u32, u32)>, BtfError> {
        let (_, info, _, data, at) = self.header(id)?;
        if !matches!(kind(info), KIND_STRUCT | KIND_UNION) {
            return Ok(None);
        }
        let bitfields = info >> 31 == 1;
        for i in 0..(info & 0xffff) as usize {
            let m = at + 12 + 12 * i;
            let (n, ty, raw) = (word(data, m)?, word(data, m + 4)?, word(data, m + 8)?);
            let (bits, width) = if bitfields { (raw & 0xff_ffff, raw >> 24) } else { (raw, 0) };
            if width != 0 && self.name(n) == name.as_bytes() {
                return Err(BtfError::Bitfield(name.to_string()));
            }
            if self.name(n) == name.as_bytes() {
                return Ok(Some((bits, ty)));
            }
            if n == 0
                && let Some((inner, t)) = self.find_member(self.resolved(ty)?, name)?
            {
                return Ok(Some((bits + inner, t)));
            }
        }
        Ok(None)
    }

    /// Bytes of type `id` (an int, a struct or union, or what a typedef names).
    fn size_of(&self, id: u32) -> Result<u32, BtfError> {
        let (_, info, size, ..) = self.header(self.resolved(id)?)?;
        match kind(info) {
            KIND_INT | KIND_STRUCT | KIND_UNION | 6 | 19 => Ok(size),
            // A pointer of the kernel's, which is of this process's width.
            KIND_PTR => Ok(std::mem::size_of::<usize>() as u32),
            _ => Err(BtfError::Malformed("a member of no fixed size")),
        }
    }
}

fn kind(info: u32) -> u32 {
    (info >> 24) & 0x1f
}

fn word(data: &[u8], off: usize) -> Result<u32, BtfError> {
    let b = data.get(off..off + 4).ok_or(BtfError::Malformed("cut short"))?;
    Ok(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

/// A module's split type information made by the real tools from C `source` (gcc's DWARF, then
/// `pahole --btf_encode_detached --btf_base` on the running kernel's), parsed on the kernel's;
/// with what the program built from `source` prints (its `main`'s output). `None` where the
/// kernel has no BTF or `pahole` is missing (Debian's package dwarves), unless
/// `HVSTATS_REQUIRE_PAHOLE` asks for it.
#[cfg(test)]
pub(crate) fn split_of_c(test: &str, source: &str) -> Option<(Btf, String)> {
    use std::process::Command;
    let required = std::env::var_os("HVSTATS_REQUIRE_PAHOLE").is_some();
    let Ok(vmlinux) = Btf::vmlinux() else {
        assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "no {VMLINUX}");
        return None;
    };
    if Command::new("pahole").arg("--version").output().is_err() {
        assert!(!required, "{test}: pahole is missing (Debian package dwarves)");
        eprintln!("{test}: skipped: pahole is missing (Debian package dwarves)");
        return None;
    }
    let dir = std::env::temp_dir().join(format!("hvstats-btf-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("m.c"), source).unwrap();
    let run = |program: &str, args: &[&str]| {
        let out = Command::new(program).args(args).current_dir(&dir).output().unwrap();
        assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    run("gcc", &["-g", "-O0", "-c", "m.c", "-o", "m.o"]);
    run("gcc", &["m.o", "-o", "m"]);
    run("pahole", &["--btf_encode_detached=m.btf", &format!("--btf_base={VMLINUX}"), "m.o"]);
    let printed = run("./m", &[]);
    let split = Btf::parse_split(std::fs::read(dir.join("m.btf")).unwrap(), vmlinux).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    Some((split, printed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_running_kernels_task_struct_is_found_with_its_nested_members() {
        let Ok(btf) = Btf::vmlinux() else {
            assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "no {VMLINUX}");
            return;
        };
        assert!(btf.func("bpf_iter_task").unwrap() > 0);
        let pid = btf.member("task_struct", "pid").unwrap();
        let tgid = btf.member("task_struct", "tgid").unwrap();
        assert_eq!((pid.size, tgid.size), (4, 4));
        assert_eq!(tgid.offset, pid.offset + 4, "pid_t pid; pid_t tgid; side by side");
        let se = btf.member("task_struct", "se").unwrap();
        let runtime = btf.member("task_struct", "se.sum_exec_runtime").unwrap();
        let inner = btf.member("sched_entity", "sum_exec_runtime").unwrap();
        assert_eq!(runtime.offset, se.offset + inner.offset);
        assert_eq!(runtime.size, 8);
        assert!(btf.member("task_struct", "se.no_such_member").is_err());
        // A pointer, `__rcu`-tagged or not, is of the kernel's width.
        assert_eq!(btf.member("task_struct", "files").unwrap().size, 8);
        assert_eq!(btf.member("files_struct", "fdt").unwrap().size, 8);
        assert_eq!(btf.member("fdtable", "max_fds").unwrap().size, 4);
        assert!(btf.func("no_such_function_here").is_err());
    }

    #[test]
    fn a_blob_without_the_magic_is_refused() {
        assert!(matches!(Btf::parse(vec![0; 64]), Err(BtfError::Malformed(_))));
        assert!(matches!(Btf::parse(vec![]), Err(BtfError::Malformed(_))));
    }

    #[test]
    fn a_modules_split_type_information_is_read_on_top_of_the_kernels() {
        // A struct only the module has, with a member named as nothing in the kernel is (a string
        // of the module's own), members of the kernel's own types (a pointer, a u64) and of the
        // module's, nested.
        let source = r#"
            #include <stdio.h>
            #include <stddef.h>
            struct hvstats_mod_inner { unsigned long long hvstats_split_only_count; int tail; };
            struct hvstats_mod_outer {
                struct task_struct *owner;
                char pad[1000];
                struct hvstats_mod_inner inner;
                unsigned long long after;
            };
            struct hvstats_mod_outer outer;
            int main(void) {
                printf("%zu %zu %zu %zu\n", offsetof(struct hvstats_mod_outer, inner),
                       offsetof(struct hvstats_mod_outer, inner.hvstats_split_only_count),
                       offsetof(struct hvstats_mod_outer, after), sizeof(struct hvstats_mod_inner));
                return 0;
            }
        "#;
        let test = "a_modules_split_type_information_is_read_on_top_of_the_kernels";
        let Some((split, printed)) = split_of_c(test, source) else { return };
        let want: Vec<u32> = printed.split_whitespace().map(|n| n.parse().unwrap()).collect();
        let vmlinux = Btf::vmlinux().unwrap();
        assert_eq!(split.first_id, vmlinux.end_id(), "the module's ids follow the kernel's last");
        assert_eq!(split.first_name, vmlinux.end_name());
        assert!(split.strings.len() > 1, "the member's name is a string of the module's own");
        let member = |path: &str| split.member("hvstats_mod_outer", path).unwrap();
        assert_eq!(member("inner"), Member { offset: want[0], size: want[3] });
        assert_eq!(member("inner.hvstats_split_only_count"), Member { offset: want[1], size: 8 });
        assert_eq!(member("after"), Member { offset: want[2], size: 8 });
        assert_eq!(member("owner"), Member { offset: 0, size: 8 });
        // The kernel's types and functions are still found through it, as in the kernel's own.
        assert_eq!(
            split.member("task_struct", "pid").unwrap(),
            vmlinux.member("task_struct", "pid").unwrap()
        );
        assert_eq!(split.func("bpf_iter_task").unwrap(), vmlinux.func("bpf_iter_task").unwrap());
        assert!(matches!(split.member("hvstats_mod_outer", "no_such"), Err(BtfError::Missing(_))));
        assert!(vmlinux.member("hvstats_mod_outer", "after").is_err(), "the kernel has no such struct");
    }

    #[test]
    fn a_module_without_type_information_leaves_the_kernels() {
        let Ok(vmlinux) = Btf::vmlinux() else { return };
        let btf = Btf::with_module("hvstats-no-such-module").unwrap();
        assert_eq!((btf.first_id, btf.end_id()), (1, vmlinux.end_id()));
        assert!(matches!(Btf::parse_split(vec![0; 64], vmlinux), Err(BtfError::Malformed(_))));
    }
}
