//! KVM's binary statistics of every descriptor a reader holds, copied in the kernel in one pass
//! a refresh, into an array the reader maps: where a `pread` of each descriptor costs a system
//! call, a descriptor lookup and a checked copy to user memory (5,000 and more a refresh on a
//! host of 1,000 VMs), one run of this program copies them all.
//!
//! A statistics descriptor's data block is its object's statistics structure, byte for byte:
//! `kvm_stats_read` copies from `&vcpu->stat` (`struct kvm_vcpu_stat`) or `&kvm->stat`
//! (`struct kvm_vm_stat`), and the file's `private_data` is that vCPU or VM. So the program
//! follows the reader's own descriptor to its file, the file to its object, and copies the
//! structure, as large as the running kernel's BTF says it is. A descriptor whose data block is
//! not that size (a kernel that lays the two apart) is not taken: it is `pread` as before.
//!
//! A task iterator program, linked to this process alone, runs once for its main thread:
//!
//! ```text
//! state.run += 1
//! for i in state.first..state.end:                            // bpf_iter_num
//!     blocks[i].run = 0
//!     (fd, kind, stat) = slots[i]; if kind == 0: continue
//!     if stat == 0:                                           // the slot's first run
//!         file = current->files->fdt->fd[fd]; object = file->private_data
//!         stat = slots[i].stat = object + offset of kind's stat
//!     blocks[i].words = copy of *stat, its size
//!     blocks[i].run = state.run                               // only when the copy worked
//! ```
//!
//! A slot keeps where its object's statistics are once a run found them: the reader's
//! descriptor holds its file, and the file its vCPU or VM (KVM frees a vCPU with its VM, and a
//! VM once no file holds it), so the object stays where it is for as long as the slot lists the
//! descriptor. Each later run copies from there, without following the descriptor again. The
//! reader writes a slot whole, that address cleared, whenever it lists or clears it.
//!
//! Each refresh runs it over every slot; a slot listed is copied at once by a run of it alone,
//! so a VM's first reading needs no `pread` either. A block is taken only when it is of the
//! last run over every slot or a later one ([`StatsCopy::is_fresh`]): a slot whose copy failed
//! is read by `pread` instead. The reader's descriptor must stay open while its slot lists it: a
//! slot is cleared before its descriptor is closed ([`CopySlot`] is dropped first), and a
//! cleared slot is not given again before the next run has cleared its block.

use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::btf::{Btf, Member};
use super::insn::{
    Asm, AsmError, Cond, HELPER_GET_CURRENT_TASK, HELPER_PROBE_READ_KERNEL, R0, R1, R2, R3, R6, R7, R8, R9,
    R10, Size,
};
use super::listed_tasks::{Kfuncs, for_each_number, lookup, main_thread_state, probe_read};
use super::sys::{ArrayMap, Program, TaskIterLink};
use super::task_iter::{TaskIterError, TaskLayout, file_at};

/// Whose statistics a descriptor gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatsOf {
    /// A vCPU's (`anon_inode:kvm-vcpu-stats:N`).
    Vcpu,
    /// A VM's (`anon_inode:kvm-vm-stats`).
    Vm,
}

impl StatsOf {
    /// The slot's kind word (0 is an empty slot).
    fn word(self) -> u32 {
        match self {
            Self::Vcpu => 1,
            Self::Vm => 2,
        }
    }
}

/// Where the statistics are, in the running kernel's structures.
#[derive(Clone, Copy, Debug)]
struct StatsLayout {
    /// `file.private_data`.
    private_data: Member,
    /// `kvm_vcpu.stat`, its offset and the size of `struct kvm_vcpu_stat`.
    vcpu: Member,
    /// `kvm.stat`, its offset and the size of `struct kvm_vm_stat`.
    vm: Member,
}

impl StatsLayout {
    fn of(btf: &Btf) -> Result<Self, TaskIterError> {
        Ok(Self {
            private_data: btf.member("file", "private_data")?,
            vcpu: btf.member("kvm_vcpu", "stat")?,
            vm: btf.member("kvm", "stat")?,
        })
    }

    fn of_kind(&self, of: StatsOf) -> Member {
        match of {
            StatsOf::Vcpu => self.vcpu,
            StatsOf::Vm => self.vm,
        }
    }

    /// The bytes of a block: the run it is of, and the larger structure.
    fn block(&self) -> usize {
        8 + (self.vcpu.size.max(self.vm.size) as usize).next_multiple_of(8)
    }
}

/// The state's words: runs made (the program's), and the slots to walk, from `FIRST` to before
/// `END` (the reader's).
const RUN: usize = 0;
const FIRST: usize = 1;
const END: usize = 2;
const STATE_BYTES: usize = 24;
/// A slot: the descriptor (u32), whose statistics it gives (u32, [`StatsOf::word`]), and where
/// they are in the kernel (u64, 0 until a run found them).
const SLOT_BYTES: usize = 16;

/// The first room for descriptors: 200 VMs of 4 vCPUs. Grown by a quarter as needed (the
/// blocks are mapped whole: the room is memory of this process).
const FIRST_SLOTS: u32 = 1024;
/// The most descriptors copied: past them, the rest are `pread`.
pub const MAX_SLOTS: u32 = 1 << 17;

/// The copy of the statistics of the descriptors listed in its slots.
#[derive(Debug)]
pub struct StatsCopy {
    layout: StatsLayout,
    task: TaskLayout,
    link: TaskIterLink,
    state: ArrayMap,
    slots: ArrayMap,
    blocks: ArrayMap,
    /// What each slot lists: a descriptor of this process, and whose statistics it gives.
    listed: Vec<Option<(i32, StatsOf)>>,
    /// Slots free to give, and slots cleared since the last run (given after it).
    free: Vec<u32>,
    cleared: Vec<u32>,
    /// The last run over every slot, as the program numbered it (0: none yet; `u64::MAX`: the
    /// last failed). A block is of this run or a later one-slot run when fresh.
    run: u64,
    buf: Vec<u8>,
    _program: Program,
}

impl StatsCopy {
    /// The copy assembled for the running kernel, with room for a thousand descriptors (grown
    /// as needed).
    ///
    /// # Errors
    /// Where the kernel's BTF lacks KVM's structures (KVM a module without its own BTF, in
    /// `/sys/kernel/btf/kvm`), or the kernel
    /// lacks the functions or mapped arrays it needs, or refuses it.
    pub fn open() -> Result<Self, TaskIterError> {
        let task = super::task_iter::shared().ok_or(TaskIterError::Unsupported("task iterator"))?.layout;
        let layout = StatsLayout::of(&Btf::with_module("kvm")?)?;
        Self::with_room(task, layout, FIRST_SLOTS)
    }

    fn with_room(task: TaskLayout, layout: StatsLayout, room: u32) -> Result<Self, TaskIterError> {
        let kfuncs = Kfuncs::of_kernel().ok_or(TaskIterError::Unsupported("bpf_iter_num_new"))?;
        let path = task.path.ok_or(TaskIterError::Unsupported("a path from a task to its files"))?;
        let state = ArrayMap::create_mapped(STATE_BYTES, 1).map_err(TaskIterError::Link)?;
        let slots = ArrayMap::create(SLOT_BYTES, room, false).map_err(TaskIterError::Link)?;
        let blocks = ArrayMap::create_mapped(layout.block(), room).map_err(TaskIterError::Link)?;
        if !state.is_mapped() || !blocks.is_mapped() {
            return Err(TaskIterError::Unsupported("BPF_F_MMAPABLE"));
        }
        let maps = Maps { state: state.raw_fd(), slots: slots.raw_fd(), blocks: blocks.raw_fd() };
        let insns = assemble(&task, &layout, &path, &kfuncs, maps)?;
        let program = Program::load_task_iter(&insns, task.iter_task)?;
        let link =
            TaskIterLink::of_process(&program, std::process::id() as i32).map_err(TaskIterError::Link)?;
        Ok(Self {
            layout,
            task,
            link,
            state,
            slots,
            blocks,
            listed: Vec::new(),
            free: Vec::new(),
            cleared: Vec::new(),
            run: 0,
            buf: Vec::new(),
            _program: program,
        })
    }

    /// Lists descriptor `fd` (this process's, KVM's statistics of `of`, a data block of
    /// `data_bytes`) for the runs to copy; `None` where its block is not the kernel's structure
    /// (it is then read as before) or there is no more room.
    ///
    /// # Errors
    /// What writing the slot, or making room for it, returns.
    pub fn add(&mut self, fd: BorrowedFd<'_>, of: StatsOf, data_bytes: usize) -> io::Result<Option<u32>> {
        if data_bytes != self.layout.of_kind(of).size as usize {
            return Ok(None);
        }
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None if self.listed.len() < MAX_SLOTS as usize => {
                self.listed.push(None);
                self.listed.len() as u32 - 1
            }
            None => return Ok(None),
        };
        if slot >= self.slots.entries()
            && let Err(e) = self.grow(slot + 1)
        {
            self.free.push(slot);
            return Err(e);
        }
        let listed = (fd.as_raw_fd(), of);
        if let Err(e) = self.write_slot(slot, Some(listed)) {
            self.free.push(slot);
            return Err(e);
        }
        self.listed[slot as usize] = Some(listed);
        // Copied at once, so its first reading needs no `pread` (where this fails, it is read
        // so until the next run).
        if self.write_range(slot..slot + 1).is_ok() {
            let _ = self.link.walk(&mut self.buf, 1);
        }
        self.write_range(0..self.listed.len() as u32)?;
        Ok(Some(slot))
    }

    /// Clears `slot`: its descriptor may be closed once this returns.
    pub fn remove(&mut self, slot: u32) {
        let Some(listed) = self.listed.get_mut(slot as usize) else { return };
        // Where the kernel's slot cannot be cleared, the slot is never given again: the program
        // copies whatever its number names into a block nobody takes.
        if listed.take().is_some() && self.write_slot(slot, None).is_ok() {
            self.cleared.push(slot);
        }
    }

    /// Copies every listed descriptor's statistics, once.
    ///
    /// # Errors
    /// What running the program returns: no block is of this run then.
    pub fn run(&mut self) -> io::Result<()> {
        self.free.append(&mut self.cleared);
        // Until it is known to have run, no block is fresh.
        self.run = u64::MAX;
        self.link.walk(&mut self.buf, 1)?;
        self.run = self.state.mapped_word(0, RUN).unwrap_or(u64::MAX);
        Ok(())
    }

    /// Copies words `words` of `slot`'s statistics, as the last run read them, into `out` (as
    /// long as `words`); false where the last run did not copy them (`pread` them then).
    pub fn copy(&self, slot: u32, words: Range<usize>, out: &mut [u64]) -> bool {
        self.words(slot).and_then(|data| data.get(words)).is_some_and(|data| {
            out.copy_from_slice(data);
            true
        })
    }

    /// True when the last run copied `slot`'s statistics (or a run of it alone since: the
    /// program clears a block's run before it copies into it).
    pub fn is_fresh(&self, slot: u32) -> bool {
        let listed = self.listed.get(slot as usize).is_some_and(Option::is_some);
        listed && self.blocks.mapped_word(slot, 0).is_some_and(|run| run != 0 && run >= self.run)
    }

    /// `slot`'s statistics as the last run copied them (its data block's words), where it did.
    pub fn words(&self, slot: u32) -> Option<&[u64]> {
        let (_, of) = self.listed.get(slot as usize).copied().flatten()?;
        let words = self.layout.of_kind(of).size as usize / 8;
        // While `self` is borrowed no run writes the blocks: a run takes `&mut self`.
        self.is_fresh(slot).then(|| self.blocks.mapped_words(slot, 1..1 + words)).flatten()
    }

    /// Slots listed now.
    pub fn listed(&self) -> usize {
        self.listed.iter().flatten().count()
    }

    fn write_slot(&self, slot: u32, listed: Option<(i32, StatsOf)>) -> io::Result<()> {
        let (fd, kind) = listed.map_or((0, 0), |(fd, of)| (fd as u32, of.word()));
        let mut value = [0u8; SLOT_BYTES];
        value[..4].copy_from_slice(&fd.to_ne_bytes());
        value[4..8].copy_from_slice(&kind.to_ne_bytes());
        self.slots.write(slot, &value)
    }

    /// Writes the slots a run walks, keeping the program's count of runs.
    fn write_range(&self, slots: Range<u32>) -> io::Result<()> {
        let words = [(FIRST, u64::from(slots.start)), (END, u64::from(slots.end))];
        if words.iter().all(|&(word, v)| self.state.mapped_word(0, word) == Some(v)) {
            return Ok(());
        }
        let mut state = [0u8; STATE_BYTES];
        let run = self.state.mapped_word(0, RUN).unwrap_or(0);
        for (word, v) in [(RUN, run)].into_iter().chain(words) {
            state[8 * word..8 * word + 8].copy_from_slice(&v.to_ne_bytes());
        }
        self.state.write(0, &state)
    }

    /// Makes the copy anew with room for `needed` slots (a quarter more at a time), listing what
    /// it lists now.
    fn grow(&mut self, needed: u32) -> io::Result<()> {
        let mut room = self.slots.entries().max(4);
        while room < needed {
            room = room.saturating_add(room / 4).min(MAX_SLOTS);
        }
        let mut grown = Self::with_room(self.task, self.layout, room).map_err(io::Error::other)?;
        for (slot, listed) in self.listed.iter().enumerate() {
            if let Some(listed) = listed {
                grown.write_slot(slot as u32, Some(*listed))?;
            }
        }
        grown.write_range(0..self.listed.len() as u32)?;
        grown.listed = std::mem::take(&mut self.listed);
        grown.free = std::mem::take(&mut self.free);
        grown.cleared = std::mem::take(&mut self.cleared);
        *self = grown;
        Ok(())
    }
}

/// The copy this process shares between its VMs, made at the first call: `None` where it
/// cannot be, said once with why (with the counting notes).
pub fn shared() -> Option<&'static Mutex<StatsCopy>> {
    static SHARED: OnceLock<Option<Mutex<StatsCopy>>> = OnceLock::new();
    SHARED
        .get_or_init(|| match StatsCopy::open() {
            Ok(copy) => Some(Mutex::new(copy)),
            Err(why) => {
                *NOTE.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!(
                    "KVM's statistics descriptors are read one system call each, not copied in \
                     the kernel in one pass: {}",
                    crate::error_chain::error_chain(&why)
                ));
                None
            }
        })
        .as_ref()
}

fn lock(copy: &Mutex<StatsCopy>) -> MutexGuard<'_, StatsCopy> {
    copy.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs the shared copy, where there is one and it lists a descriptor.
///
/// # Errors
/// What [`StatsCopy::run`] returns.
pub fn run_shared() -> io::Result<()> {
    let Some(copy) = SHARED_MADE.get().and_then(|_| shared()) else { return Ok(()) };
    let mut copy = lock(copy);
    if copy.listed.is_empty() { Ok(()) } else { copy.run() }
}

/// Set once a slot was first asked for: no copy is made before a descriptor needs it.
static SHARED_MADE: OnceLock<()> = OnceLock::new();

/// Why the copy is not had, not said yet.
static NOTE: Mutex<Option<String>> = Mutex::new(None);

/// What [`shared`] has to say, once (given with [`crate::counting::full_notes`]).
pub(crate) fn take_note() -> Option<String> {
    NOTE.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// A descriptor listed in the shared copy, cleared when dropped: drop it before the descriptor.
#[derive(Debug)]
pub struct CopySlot(u32);

impl CopySlot {
    /// Lists `fd` in the shared copy (see [`StatsCopy::add`]); `None` where it is not.
    pub fn add(fd: BorrowedFd<'_>, of: StatsOf, data_bytes: usize) -> Option<Self> {
        SHARED_MADE.get_or_init(|| ());
        let copy = shared()?;
        lock(copy).add(fd, of, data_bytes).ok().flatten().map(Self)
    }

    /// True when the last run copied this descriptor's statistics.
    pub fn is_fresh(&self) -> bool {
        shared().is_some_and(|copy| lock(copy).is_fresh(self.0))
    }

    /// What `read` makes of the data block's words as the last run copied them; `None` where
    /// it did not copy them.
    pub fn with_words<R>(&self, read: impl FnOnce(&[u64]) -> R) -> Option<R> {
        let copy = lock(shared()?);
        let words = copy.words(self.0)?;
        TAKEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some(read(words))
    }
}

/// Readings taken from the shared copy, this process's life long.
static TAKEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many readings were taken from the shared copy (not `pread`), this process's life long.
pub fn taken() -> u64 {
    TAKEN.load(std::sync::atomic::Ordering::Relaxed)
}

impl Drop for CopySlot {
    fn drop(&mut self) {
        if let Some(copy) = shared() {
            lock(copy).remove(self.0);
        }
    }
}

/// The maps the program names.
#[derive(Clone, Copy)]
struct Maps {
    state: i32,
    slots: i32,
    blocks: i32,
}

/// Stack slots: the loop's iterator, the key, a read's landing slot, the file, the statistics'
/// address, the block, the slot.
const NUM: i16 = -8;
const KEY: i16 = -16;
const TMP: i16 = -24;
const FILE: i16 = -32;
const STAT: i16 = -40;
const BLOCK: i16 = -48;
const SLOT: i16 = -56;

/// The program (see the module's text).
fn assemble(
    task: &TaskLayout,
    layout: &StatsLayout,
    path: &[Member; 4],
    kfuncs: &Kfuncs,
    maps: Maps,
) -> Result<Vec<u64>, TaskIterError> {
    let mut a = Asm::default();
    let out = a.label();
    // Once a run: for this process's main thread.
    main_thread_state(&mut a, task, maps.state, KEY, out)?;
    a.load(Size::Dw, R1, R6, 8 * RUN as i16);
    a.add_imm(R1, 1);
    a.store(Size::Dw, R6, 8 * RUN as i16, R1);
    a.load(Size::W, R2, R6, 8 * FIRST as i16);
    a.load(Size::W, R3, R6, 8 * END as i16);
    for_each_number(a, kfuncs, NUM, out, |a, next| copy_slot(a, layout, path, maps, next))
}

/// The copy of the slot whose number is in r1, the state in r6: where its object's statistics
/// are (found once, through its descriptor's file), copied into its block, marked with the
/// state's run; jumps to `next` where any of these is not had.
fn copy_slot(
    a: &mut Asm,
    layout: &StatsLayout,
    path: &[Member; 4],
    maps: Maps,
    next: super::insn::Label,
) -> Result<(), TaskIterError> {
    let found = a.label();
    // Its block is no run's until the copy into it is done.
    lookup(a, maps.blocks, KEY, Some(R1));
    a.jump_imm(Cond::Eq, R0, 0, next);
    a.store_imm(Size::Dw, R0, 0, 0);
    a.store(Size::Dw, R10, BLOCK, R0);
    a.load(Size::W, R1, R10, KEY);
    lookup(a, maps.slots, KEY, Some(R1));
    a.jump_imm(Cond::Eq, R0, 0, next);
    a.load(Size::W, R9, R0, 4); // whose
    a.jump_imm(Cond::Eq, R9, 0, next);
    a.load(Size::Dw, R3, R0, 8); // where, once found
    a.store(Size::Dw, R10, STAT, R3);
    a.jump_imm(Cond::Ne, R3, 0, found);
    a.store(Size::Dw, R10, SLOT, R0);
    a.load(Size::W, R8, R0, 0); // the descriptor
    find_stat(a, layout, path, next)?;
    a.load(Size::Dw, R0, R10, SLOT);
    a.load(Size::Dw, R3, R10, STAT);
    a.store(Size::Dw, R0, 8, R3);
    a.bind(found);
    a.load(Size::Dw, R8, R10, BLOCK);
    copy_block(a, layout, next)?;
    a.load(Size::Dw, R1, R6, 8 * RUN as i16);
    a.store(Size::Dw, R8, 0, R1);
    Ok(())
}

/// Finds where the statistics of the object of descriptor r8 (of the kind in r9) are, through
/// this task's descriptor table and the file's object, into [`STAT`]; jumps to `next` where
/// any of these is not had.
fn find_stat(
    a: &mut Asm,
    layout: &StatsLayout,
    path: &[Member; 4],
    next: super::insn::Label,
) -> Result<(), TaskIterError> {
    let vm = a.label();
    a.call(HELPER_GET_CURRENT_TASK);
    a.mov(R7, R0);
    file_at(a, R7, R8, path, TMP, FILE, next)?;
    a.load(Size::Dw, R3, R10, FILE);
    a.jump_imm(Cond::Eq, R3, 0, next);
    probe_read(a, TMP, 8, R3, offset(layout.private_data)?);
    a.jump_imm(Cond::Ne, R0, 0, next);
    a.load(Size::Dw, R3, R10, TMP);
    a.jump_imm(Cond::Eq, R3, 0, next);
    a.add_imm(R3, offset(layout.vm)?);
    a.jump_imm(Cond::Ne, R9, StatsOf::Vcpu.word() as i32, vm);
    a.add_imm(R3, offset(layout.vcpu)? - offset(layout.vm)?);
    a.bind(vm);
    a.store(Size::Dw, R10, STAT, R3);
    Ok(())
}

/// Copies the statistics at [`STAT`] (of the kind in r9) into the block in r8, after its run
/// word; jumps to `failed` when the read fails.
fn copy_block(a: &mut Asm, layout: &StatsLayout, failed: super::insn::Label) -> Result<(), TaskIterError> {
    let (vm, read) = (a.label(), a.label());
    let size = |m: Member| i32::try_from(m.size).map_err(|_| AsmError::TooFar);
    a.load(Size::Dw, R3, R10, STAT);
    a.jump_imm(Cond::Ne, R9, StatsOf::Vcpu.word() as i32, vm);
    a.mov_imm(R2, size(layout.vcpu)?);
    a.ja(read);
    a.bind(vm);
    a.mov_imm(R2, size(layout.vm)?);
    a.bind(read);
    a.mov(R1, R8);
    a.add_imm(R1, 8);
    a.call(HELPER_PROBE_READ_KERNEL);
    a.jump_imm(Cond::Ne, R0, 0, failed);
    Ok(())
}

fn offset(m: Member) -> Result<i32, AsmError> {
    i32::try_from(m.offset).map_err(|_| AsmError::TooFar)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    use std::os::unix::fs::FileExt;

    #[test]
    fn kvms_statistics_are_found_in_its_modules_type_information_where_kvm_is_a_module() {
        // KVM's structures as a module declares them, in its split type information on top of
        // the kernel's: the module's own come first (this kernel, built with KVM, has its own of
        // the same names), and `file` is the kernel's.
        let source = r#"
            #include <stdio.h>
            #include <stddef.h>
            struct kvm_vcpu_stat { unsigned long long halt_wait_hist[32]; unsigned long long exits; };
            struct kvm_vm_stat { unsigned long long remote_tlb_flush; unsigned long long pages_4k; };
            struct kvm_vcpu { struct kvm *kvm; int cpu; char pad[1500]; struct kvm_vcpu_stat stat; };
            struct kvm { unsigned long long id; char pad[2500]; struct kvm_vm_stat stat; };
            struct kvm_vcpu v; struct kvm k;
            int main(void) {
                printf("%zu %zu %zu %zu\n", offsetof(struct kvm_vcpu, stat), sizeof(struct kvm_vcpu_stat),
                       offsetof(struct kvm, stat), sizeof(struct kvm_vm_stat));
                return 0;
            }
        "#;
        let test = "kvms_statistics_are_found_in_its_modules_type_information_where_kvm_is_a_module";
        let Some((split, printed)) = super::super::btf::split_of_c(test, source) else { return };
        let want: Vec<u32> = printed.split_whitespace().map(|n| n.parse().unwrap()).collect();
        let layout = StatsLayout::of(&split).unwrap();
        assert_eq!(layout.vcpu, Member { offset: want[0], size: want[1] });
        assert_eq!(layout.vm, Member { offset: want[2], size: want[3] });
        let kernel = Btf::vmlinux().unwrap();
        assert_eq!(layout.private_data, kernel.member("file", "private_data").unwrap());
        if let Ok(built_in) = StatsLayout::of(&kernel) {
            assert_ne!(built_in.vcpu, layout.vcpu, "the module's, not the kernel's of the same name");
        }
    }

    /// `KVM_CREATE_VM`, `KVM_CREATE_VCPU`, `KVM_GET_STATS_FD`.
    const CREATE_VM: libc::c_ulong = 0xAE01;
    const CREATE_VCPU: libc::c_ulong = 0xAE41;
    const GET_STATS_FD: libc::c_ulong = 0xAECE;

    fn ioctl(fd: &impl AsRawFd, request: libc::c_ulong, arg: libc::c_ulong) -> OwnedFd {
        // SAFETY: KVM's ioctls that take an integer (or nothing) and return a new descriptor.
        let r = unsafe { libc::ioctl(fd.as_raw_fd(), request, arg) };
        assert!(r >= 0, "ioctl {request:#x}: {}", io::Error::last_os_error());
        // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
        unsafe { OwnedFd::from_raw_fd(r) }
    }

    /// A VM and its vCPU 0, where `/dev/kvm` can be opened.
    fn vm() -> Option<(OwnedFd, OwnedFd)> {
        let kvm = match File::options().read(true).write(true).open("/dev/kvm") {
            Ok(kvm) => kvm,
            Err(e) => {
                assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "/dev/kvm: {e}");
                return None;
            }
        };
        let vm = ioctl(&kvm, CREATE_VM, 0);
        let vcpu = ioctl(&vm, CREATE_VCPU, 0);
        Some((vm, vcpu))
    }

    /// A statistics descriptor's data block, read with one `pread`: where it is, and its words
    /// (from its header and descriptors, `struct kvm_stats_header` and `kvm_stats_desc`).
    fn pread(stats: &File) -> Vec<u64> {
        let word = |b: &[u8], at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().unwrap()) as usize;
        let mut header = [0u8; 24];
        stats.read_exact_at(&mut header, 0).unwrap();
        let (name_size, descs, desc_at, data_at) =
            (word(&header, 4), word(&header, 8), word(&header, 16), word(&header, 20));
        let desc_size = 16 + name_size;
        let mut table = vec![0u8; descs * desc_size];
        stats.read_exact_at(&mut table, desc_at as u64).unwrap();
        let bytes = table
            .chunks_exact(desc_size)
            .map(|d| word(d, 8) + 8 * usize::from(u16::from_ne_bytes([d[6], d[7]])))
            .max()
            .unwrap();
        let mut data = vec![0u8; bytes];
        stats.read_exact_at(&mut data, data_at as u64).unwrap();
        data.chunks_exact(8).map(|w| u64::from_ne_bytes(w.try_into().unwrap())).collect()
    }

    /// The copy, where this host has what it needs (`HVSTATS_REQUIRE_KVM` hosts must).
    fn copy() -> Option<StatsCopy> {
        match StatsCopy::open() {
            Ok(copy) => Some(copy),
            Err(why) => {
                let why = crate::error_chain::error_chain(&why);
                assert!(std::env::var_os("HVSTATS_REQUIRE_KVM").is_none(), "no copy: {why}");
                None
            }
        }
    }

    #[test]
    fn every_listed_descriptor_is_copied_as_its_pread_reads_it_past_its_first_room() {
        let Some((vm, vcpu)) = vm() else { return };
        let Some(copy) = copy() else { return };
        // Room for 2: the third descriptor listed makes the copy anew, with room for 4.
        let mut copy = StatsCopy::with_room(copy.task, copy.layout, 2).unwrap();
        let files: Vec<(File, StatsOf)> = (0..3)
            .map(|_| (File::from(ioctl(&vm, GET_STATS_FD, 0)), StatsOf::Vm))
            .chain([(File::from(ioctl(&vcpu, GET_STATS_FD, 0)), StatsOf::Vcpu)])
            .collect();
        let mut slots = Vec::new();
        for (file, of) in &files {
            let bytes = 8 * pread(file).len();
            slots.push(copy.add(file.as_fd(), *of, bytes).unwrap().expect("the kernel's structure"));
        }
        assert_eq!(copy.slots.entries(), 4, "grown");
        assert_eq!(copy.listed(), 4);
        // Each is copied when listed (the copy made anew copies those it held at its next run),
        // and by every run after.
        let mut out = Vec::new();
        let mut first = Vec::new();
        for ((file, of), slot) in files.iter().zip(&slots) {
            let want = pread(file);
            out.resize(want.len(), u64::MAX);
            first.push(copy.copy(*slot, 0..want.len(), &mut out).then(|| out.clone()));
            assert!(first.last().unwrap().as_ref().is_none_or(|got| *got == want), "{of:?}");
        }
        assert!(first[2..].iter().all(Option::is_some), "listed after the copy was made anew");
        assert!(first[..2].iter().all(Option::is_none), "copied into the old copy's blocks");
        copy.run().unwrap();
        for ((file, of), slot) in files.iter().zip(&slots) {
            let want = pread(file);
            out.resize(want.len(), u64::MAX);
            assert!(copy.copy(*slot, 0..want.len(), &mut out), "{of:?}");
            assert_eq!(out, want, "{of:?}");
            // A part of it is those words alone.
            let mut part = vec![u64::MAX; 3];
            assert!(copy.copy(*slot, 2..5, &mut part));
            assert_eq!(part, want[2..5]);
        }
        // The vCPU's own layout: its block is a vCPU's statistics structure, not a VM's.
        assert_ne!(pread(&files[3].0).len(), pread(&files[0].0).len());
        // A slot cleared is not copied again, nor given again before the next run.
        copy.remove(slots[0]);
        let again = copy.add(files[0].0.as_fd(), StatsOf::Vm, 8 * pread(&files[0].0).len()).unwrap().unwrap();
        assert_ne!(again, slots[0], "a slot cleared waits for the next run");
        copy.remove(again);
        copy.run().unwrap();
        out.resize(pread(&files[0].0).len(), 0);
        assert!(!copy.copy(slots[0], 0..out.len(), &mut out), "cleared");
        assert!(copy.copy(slots[1], 0..out.len(), &mut out));
        assert_eq!(copy.listed(), 3);
        // A slot given again copies its new descriptor's object, not the one whose statistics
        // it found for the descriptor it listed before.
        let vcpu_stats = File::from(ioctl(&vcpu, GET_STATS_FD, 0));
        let want = pread(&vcpu_stats);
        let reused = copy.add(vcpu_stats.as_fd(), StatsOf::Vcpu, 8 * want.len()).unwrap().unwrap();
        assert!([slots[0], again].contains(&reused), "{reused}");
        for _ in 0..2 {
            out.resize(want.len(), u64::MAX);
            assert!(copy.copy(reused, 0..want.len(), &mut out));
            assert_eq!(out, want);
            copy.run().unwrap();
        }
    }

    #[test]
    fn a_block_not_of_the_kernels_structures_size_is_not_taken() {
        let Some((vm, _vcpu)) = vm() else { return };
        let Some(mut copy) = copy() else { return };
        let stats = File::from(ioctl(&vm, GET_STATS_FD, 0));
        let bytes = 8 * pread(&stats).len();
        assert_eq!(copy.add(stats.as_fd(), StatsOf::Vm, bytes + 8).unwrap(), None);
        assert_eq!(copy.add(stats.as_fd(), StatsOf::Vcpu, bytes).unwrap(), None, "a VM's is not a vCPU's");
        assert_eq!(copy.listed(), 0);
    }
}
