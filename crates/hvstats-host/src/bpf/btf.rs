//! Where the running kernel keeps what a BPF program reads, from its own type information
//! (`/sys/kernel/btf/vmlinux`, the BTF format of Documentation/bpf/btf.rst): the id of a
//! function (what a tracing program attaches to) and the offset and size of a member of a struct,
//! nested members (`se.sum_exec_runtime`) included. Nothing is assumed of a kernel's layout.
//!
//! A reader of its own rather than a BTF crate's: `btf-rs` 2.0 and `btfparse` 1.3 read every type
//! of the kernel's BTF into maps and names (243 ms and 41 MB at their peak, and 338 ms and 62 MB,
//! measured on Linux 6.18 for the observer, whose unit's memory is bounded; `btf-rs` is also
//! LGPL), where the few answers needed here take one walk over the type section and an index of
//! where each type starts (4 bytes a type), freed once the answers are had.

use std::io;

/// The kernel's type information.
pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

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

/// The type section and strings of one BTF blob, with where each type starts.
pub struct Btf {
    data: Vec<u8>,
    types: std::ops::Range<usize>,
    strings: std::ops::Range<usize>,
    /// By type id - 1, the offset of its `struct btf_type` in `data`.
    starts: Vec<u32>,
}

impl Btf {
    /// Reads the running kernel's type information.
    ///
    /// # Errors
    /// When it cannot be read or is malformed.
    pub fn vmlinux() -> Result<Self, BtfError> {
        Self::parse(std::fs::read(VMLINUX)?)
    }

    /// Parses a BTF blob (the host's byte order).
    ///
    /// # Errors
    /// When it is malformed.
    pub fn parse(data: Vec<u8>) -> Result<Self, BtfError> {
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
        let mut me = Self { data, types, strings, starts: Vec::new() };
        me.index()?;
        Ok(me)
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
        let start = self.strings.start + name_off as usize;
        let tail = self.data.get(start..self.strings.end).unwrap_or_default();
        &tail[..tail.iter().position(|b| *b == 0).unwrap_or(tail.len())]
    }

    /// `(name_off, info, size_or_type)` of type `id` (from 1), and where it starts.
    fn header(&self, id: u32) -> Result<(u32, u32, u32, usize), BtfError> {
        let at =
            *self.starts.get((id as usize).wrapping_sub(1)).ok_or(BtfError::Malformed("a bad type id"))?;
        let at = at as usize;
        Ok((word(&self.data, at)?, word(&self.data, at + 4)?, word(&self.data, at + 8)?, at))
    }

    /// The id of the type of kind `want` named `name`.
    fn id_of(&self, want: u32, name: &str) -> Result<u32, BtfError> {
        (1..=self.starts.len() as u32)
            .find(|&id| {
                self.header(id)
                    .is_ok_and(|(n, info, _, _)| kind(info) == want && self.name(n) == name.as_bytes())
            })
            .ok_or_else(|| BtfError::Missing(name.to_string()))
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
            let (_, info, ty, _) = self.header(id)?;
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
        let (_, info, _, at) = self.header(id)?;
        if !matches!(kind(info), KIND_STRUCT | KIND_UNION) {
            return Ok(None);
        }
        let bitfields = info >> 31 == 1;
        for i in 0..(info & 0xffff) as usize {
            let m = at + 12 + 12 * i;
            let (n, ty, raw) = (word(&self.data, m)?, word(&self.data, m + 4)?, word(&self.data, m + 8)?);
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
        let (_, info, size, _) = self.header(self.resolved(id)?)?;
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
}
