//! The counting program of one tracepoint: find the firing thread's slot, then add one to each
//! column whose predicate the record satisfies, in the slot's row of an array.
//!
//! ```text
//! tid, tgid = bpf_get_current_pid_tgid()
//! entry = threads[tid]                  // array map: (tgid << 32) | (slot + 1), or 0
//! if !entry || entry >> 32 != tgid: return 0
//! row = rows[slot]                      // array: one u64 per column
//! for each column: if predicate(record): row[column] += 1
//! return 1
//! ```
//!
//! A classic tracepoint program's 0 would stop the firing from reaching *every* perf event on
//! the tracepoint, other tools' counters too (`perf_trace_run_bpf_submit`): it returns 1, and
//! the firing goes on to perf events as if no program were there.
//!
//! A program may also time *spans* on the firing thread: a span column opens when its predicate
//! holds on the span's start tracepoint (the time and the column are kept in the thread's entry
//! of a pending array) and closes on the next firing of its end tracepoint, which adds the time
//! between them to the column. So `kvm_exit` classified by exit reason, closed by `kvm_entry`,
//! gives the time KVM spent on each class of exit, with one program per tracepoint as before:
//!
//! ```text
//! if this tracepoint ends spans: p = pending[slot]; if p.column: row[p.column - 1] += now - p.at; p.column = 0
//! (the counting columns, as above)
//! for each span column starting here: if predicate(record): pending[slot] = (now, column + 1); break
//! ```
//!
//! Every firing of the tracepoint runs the program once, whatever the number of columns and
//! observed threads: two array lookups (which the verifier inlines), then a few compares per
//! column. The row needs no atomic add: only the thread's own programs add to it, and a thread
//! runs on one CPU at a time, where a program runs to completion.

use super::filter::{Field, Op, Pred};
use super::insn::{
    Asm, AsmError, Cond, HELPER_GET_CURRENT_PID_TGID, HELPER_KTIME_GET_NS, HELPER_MAP_LOOKUP_ELEM, Label, R0,
    R1, R2, R3, R4, R5, R6, R7, R8, R9, R10, Size,
};

/// One counted column of a program: its index in the row, and what a record must satisfy
/// (`None`: every firing).
#[derive(Clone, Debug)]
pub struct Column {
    /// Index of the `u64` in the row.
    pub index: u16,
    /// The predicate.
    pub pred: Option<Pred>,
}

/// The span part of a program: where open spans are kept, and what this tracepoint does to them.
///
/// Spans are kept in lanes, one per tracepoint that closes spans: a thread has one open span per
/// lane at most (`kvm_exit` → `kvm_entry` in one, `kvm_hv_hypercall` → `kvm_hv_hypercall_done`
/// in another, so that a hypercall inside an exit does not end the exit's span).
#[derive(Clone, Debug)]
pub struct Spans {
    /// The fd of the pending array: per slot and lane, the `u64` time a span opened and its
    /// column + 1.
    pub pending: i32,
    /// The row's width in columns: a pending column at or past it is ignored.
    pub width: u16,
    /// The lanes whose open span this tracepoint closes.
    pub ends: Vec<u16>,
    /// The span columns this tracepoint opens, each in its lane; per lane, first match wins.
    pub starts: Vec<(Column, u16)>,
}

impl Spans {
    fn is_empty(&self) -> bool {
        self.ends.is_empty() && self.starts.is_empty()
    }
}

/// The carried part of a program: values one tracepoint leaves on the thread (its *latches*) for
/// the next firing of another to add to its columns.
#[derive(Clone, Debug, Default)]
pub struct Carry {
    /// The fd of the latch array: per slot, one `u64` per latch.
    pub latches: i32,
    /// The latches this tracepoint sets: each to its weight (a field of the record, or 1) when
    /// its predicate holds, else to 0.
    pub sets: Vec<Latch>,
    /// The columns this tracepoint adds a latch to, when their predicate holds.
    pub adds: Vec<Carried>,
}

/// A latch a tracepoint sets.
#[derive(Clone, Debug)]
pub struct Latch {
    /// The latch's index in the slot's latches.
    pub index: u16,
    /// What the record must satisfy (`None`: every firing).
    pub pred: Option<Pred>,
    /// The field whose value is carried (`None`: 1).
    pub weight: Option<Field>,
}

/// A column that adds a latch's value.
#[derive(Clone, Debug)]
pub struct Carried {
    /// The column (index of the `u64` in the row) and what the record must satisfy.
    pub column: Column,
    /// The latch added.
    pub latch: u16,
}

impl Carry {
    fn is_empty(&self) -> bool {
        self.sets.is_empty() && self.adds.is_empty()
    }
}

/// Assembles the program for `columns`, with the thread table and the rows at map fds
/// `threads` and `rows`.
///
/// # Errors
/// When a jump would be too far (a predicate of thousands of terms).
pub fn assemble(threads: i32, rows: i32, columns: &[Column]) -> Result<Vec<u64>, AsmError> {
    assemble_with_spans(threads, rows, columns, None, None)
}

/// As [`assemble`], also closing and opening spans as `spans` says, and adding and setting
/// latches as `carry` says.
///
/// # Errors
/// As [`assemble`].
pub(crate) fn assemble_with_spans(
    threads: i32,
    rows: i32,
    columns: &[Column],
    spans: Option<&Spans>,
    carry: Option<&Carry>,
) -> Result<Vec<u64>, AsmError> {
    let spans = spans.filter(|s| !s.is_empty());
    let carry = carry.filter(|c| !c.is_empty());
    let mut a = Asm::default();
    let out = a.label();
    a.mov(R6, R1);
    a.call(HELPER_GET_CURRENT_PID_TGID);
    a.store(Size::W, R10, -4, R0); // key: the thread id (low half)
    a.mov(R8, R0);
    a.rsh_imm(R8, 32); // the process id
    a.ld_map_fd(R1, threads);
    a.mov(R2, R10);
    a.add_imm(R2, -4);
    a.call(HELPER_MAP_LOOKUP_ELEM);
    a.jump_imm(Cond::Eq, R0, 0, out);
    a.load(Size::Dw, R1, R0, 0);
    a.mov(R2, R1);
    a.rsh_imm(R2, 32);
    a.jump_reg(Cond::Ne, R2, R8, out); // a reused thread id of another process
    a.mov32(R1, R1);
    a.jump_imm(Cond::Eq, R1, 0, out);
    a.add_imm(R1, -1);
    a.store(Size::W, R10, -8, R1);
    a.ld_map_fd(R1, rows);
    a.mov(R2, R10);
    a.add_imm(R2, -8);
    a.call(HELPER_MAP_LOOKUP_ELEM);
    a.jump_imm(Cond::Eq, R0, 0, out);
    a.mov(R9, R0);
    if let Some(spans) = spans {
        // r7: the thread's pending span (the slot is still at r10 - 8).
        a.ld_map_fd(R1, spans.pending);
        a.mov(R2, R10);
        a.add_imm(R2, -8);
        a.call(HELPER_MAP_LOOKUP_ELEM);
        a.jump_imm(Cond::Eq, R0, 0, out);
        a.mov(R7, R0);
        for &lane in &spans.ends {
            close_span(&mut a, spans.width, lane);
        }
    }
    if let Some(carry) = carry {
        // r8: the thread's latches (the process id it held is no longer needed).
        a.ld_map_fd(R1, carry.latches);
        a.mov(R2, R10);
        a.add_imm(R2, -8);
        a.call(HELPER_MAP_LOOKUP_ELEM);
        a.jump_imm(Cond::Eq, R0, 0, out);
        a.mov(R8, R0);
    }
    for column in columns {
        let (hit, skip) = (a.label(), a.label());
        if let Some(pred) = &column.pred {
            predicate(&mut a, pred, hit, skip);
        }
        a.bind(hit);
        let off = 8 * column.index as i16;
        a.load(Size::Dw, R1, R9, off);
        a.add_imm(R1, 1);
        a.store(Size::Dw, R9, off, R1);
        a.bind(skip);
    }
    if let Some(carry) = carry {
        for add in &carry.adds {
            let (hit, skip) = (a.label(), a.label());
            if let Some(pred) = &add.column.pred {
                predicate(&mut a, pred, hit, skip);
            }
            a.bind(hit);
            let off = 8 * add.column.index as i16;
            a.load(Size::Dw, R1, R8, 8 * add.latch as i16);
            a.load(Size::Dw, R2, R9, off);
            a.add(R2, R1);
            a.store(Size::Dw, R9, off, R2);
            a.bind(skip);
        }
        for latch in &carry.sets {
            let (hit, skip, store) = (a.label(), a.label(), a.label());
            if let Some(pred) = &latch.pred {
                predicate(&mut a, pred, hit, skip);
            }
            a.bind(hit);
            match latch.weight {
                Some(field) => {
                    let size = Size::of(usize::from(field.size)).unwrap_or(Size::Dw);
                    a.load(size, R1, R6, field.offset as i16);
                }
                None => a.mov_imm(R1, 1),
            }
            a.ja(store);
            a.bind(skip);
            a.mov_imm(R1, 0);
            a.bind(store);
            a.store(Size::Dw, R8, 8 * latch.index as i16, R1);
        }
    }
    if let Some(spans) = spans {
        let mut lanes: Vec<u16> = spans.starts.iter().map(|&(_, lane)| lane).collect();
        lanes.dedup();
        for lane in lanes {
            let opened = a.label();
            let base = 16 * lane as i16;
            for (column, _) in spans.starts.iter().filter(|(_, l)| *l == lane) {
                let (hit, skip) = (a.label(), a.label());
                if let Some(pred) = &column.pred {
                    predicate(&mut a, pred, hit, skip);
                }
                a.bind(hit);
                a.call(HELPER_KTIME_GET_NS);
                a.store(Size::Dw, R7, base, R0);
                a.mov_imm(R1, i32::from(column.index) + 1);
                a.store(Size::Dw, R7, base + 8, R1);
                a.ja(opened);
                a.bind(skip);
            }
            a.bind(opened);
        }
    }
    a.bind(out);
    a.mov_imm(R0, 1);
    a.exit();
    a.finish()
}

/// Adds the time since the thread's open span of `lane` began (r7: its pending entry) to the
/// span's column of the row at r9, and closes it.
fn close_span(a: &mut Asm, width: u16, lane: u16) {
    let done = a.label();
    let base = 16 * lane as i16;
    a.load(Size::Dw, R1, R7, base + 8);
    a.jump_imm(Cond::Eq, R1, 0, done);
    a.call(HELPER_KTIME_GET_NS);
    a.load(Size::Dw, R1, R7, base + 8);
    a.load(Size::Dw, R2, R7, base);
    a.store_imm(Size::Dw, R7, base + 8, 0);
    a.sub(R0, R2);
    a.add_imm(R1, -1);
    // Bounded for the verifier (and against a pending entry of another engine's width).
    a.jump_imm(Cond::Ge, R1, i32::from(width), done);
    a.lsh_imm(R1, 3);
    a.mov(R4, R9);
    a.add(R4, R1);
    a.load(Size::Dw, R5, R4, 0);
    a.add(R5, R0);
    a.store(Size::Dw, R4, 0, R5);
    a.bind(done);
}

/// Jumps to `yes` when `pred` holds for the record at r6, else to `no`.
fn predicate(a: &mut Asm, pred: &Pred, yes: Label, no: Label) {
    match pred {
        Pred::Cmp(field, op, value) => compare(a, *field, *op, *value, yes, no),
        Pred::All(x, y) => {
            let mid = a.label();
            predicate(a, x, mid, no);
            a.bind(mid);
            predicate(a, y, yes, no);
        }
        Pred::Any(x, y) => {
            let mid = a.label();
            predicate(a, x, yes, mid);
            a.bind(mid);
            predicate(a, y, yes, no);
        }
        Pred::Not(x) => predicate(a, x, no, yes),
    }
}

fn compare(a: &mut Asm, field: Field, op: Op, value: u64, yes: Label, no: Label) {
    let signed = field.signed && op.orders();
    let size = Size::of(usize::from(field.size)).unwrap_or(Size::Dw);
    a.load(size, R2, R6, field.offset as i16);
    let value = if signed {
        let shift = 64 - 8 * i32::from(field.size);
        if shift > 0 {
            a.lsh_imm(R2, shift);
            a.arsh_imm(R2, shift);
        }
        value
    } else {
        field.truncate(value)
    };
    let cond = match (op, signed) {
        (Op::Eq, _) => Cond::Eq,
        (Op::Ne, _) => Cond::Ne,
        (Op::And, _) => Cond::Set,
        (Op::Lt, false) => Cond::Lt,
        (Op::Le, false) => Cond::Le,
        (Op::Gt, false) => Cond::Gt,
        (Op::Ge, false) => Cond::Ge,
        (Op::Lt, true) => Cond::Slt,
        (Op::Le, true) => Cond::Sle,
        (Op::Gt, true) => Cond::Sgt,
        (Op::Ge, true) => Cond::Sge,
    };
    // An immediate is sign-extended to 64 bits: only values it keeps exact go inline.
    match i32::try_from(value as i64) {
        Ok(imm) if imm as i64 as u64 == value => a.jump_imm(cond, R2, imm, yes),
        _ => {
            a.ld_imm64(R3, value);
            a.jump_reg(cond, R2, R3, yes);
        }
    }
    a.ja(no);
}
