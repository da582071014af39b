//! A tracepoint's fields (from its tracefs `format` file) and the ftrace filter expressions
//! hvstats writes (`reason == 2`, `gpa >= 0xfee00000 && type != 0`, `(icr_low & 262144) && …`),
//! parsed into a predicate a program can evaluate.
//!
//! The grammar is the part of ftrace's that hvstats uses: `||`, `&&`, `!`, parentheses, and a
//! field compared with a number by `==`, `!=`, `<`, `<=`, `>`, `>=`, or tested with `&`.

use std::collections::BTreeMap;

/// One field of a tracepoint record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    /// Its offset in the record (the program's context).
    pub offset: u16,
    /// Its size in bytes (1, 2, 4 or 8).
    pub size: u8,
    /// Whether it is compared as signed.
    pub signed: bool,
}

/// The fields of a tracepoint, by name.
pub type Fields = BTreeMap<String, Field>;

/// Parses a tracefs `format` file: every `field:<type> <name>; offset:N; size:N; signed:N;` line.
/// Array fields (`name[N]`) are skipped: they cannot be compared with a number.
pub fn parse_format(text: &str) -> Fields {
    let mut fields = Fields::new();
    for line in text.lines() {
        let mut parts = line.trim().split(';').map(str::trim);
        let Some(decl) = parts.next().and_then(|p| p.strip_prefix("field:")) else { continue };
        let Some(name) = decl.rsplit(' ').next().filter(|n| !n.contains('[')) else { continue };
        let value = |key: &str| {
            parts.clone().find_map(|p| p.strip_prefix(key)).and_then(|v| v.trim().parse::<u32>().ok())
        };
        let (Some(offset), Some(size), Some(signed)) = (value("offset:"), value("size:"), value("signed:"))
        else {
            continue;
        };
        let (Ok(offset), Ok(size)) = (u16::try_from(offset), u8::try_from(size)) else { continue };
        if matches!(size, 1 | 2 | 4 | 8) && offset % u16::from(size) == 0 {
            fields.insert(name.to_owned(), Field { offset, size, signed: signed != 0 });
        }
    }
    fields
}

/// A comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `==`.
    Eq,
    /// `!=`.
    Ne,
    /// `<`.
    Lt,
    /// `<=`.
    Le,
    /// `>`.
    Gt,
    /// `>=`.
    Ge,
    /// `&` (true when any bit is set).
    And,
}

/// A predicate over one record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pred {
    /// `field op value`.
    Cmp(Field, Op, u64),
    /// Both.
    All(Box<Pred>, Box<Pred>),
    /// Either.
    Any(Box<Pred>, Box<Pred>),
    /// Not.
    Not(Box<Pred>),
}

/// Why a filter cannot be turned into a predicate.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FilterError {
    /// A name that is not a field of the tracepoint.
    #[error("{0:?} is not a field of the tracepoint")]
    UnknownField(String),
    /// Anything else the grammar does not take.
    #[error("cannot parse the filter at {0:?}")]
    Syntax(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Ident(String),
    Number(u64),
    Op(Op),
    AndAnd,
    OrOr,
    Bang,
    Open,
    Close,
}

fn tokens(text: &str) -> Result<Vec<Token>, FilterError> {
    let mut out = Vec::new();
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let two = b.get(i..i + 2).unwrap_or(&[]);
        let (token, len) = match c {
            b' ' | b'\t' | b'\n' => {
                i += 1;
                continue;
            }
            b'(' => (Token::Open, 1),
            b')' => (Token::Close, 1),
            _ if two == b"&&" => (Token::AndAnd, 2),
            _ if two == b"||" => (Token::OrOr, 2),
            _ if two == b"==" => (Token::Op(Op::Eq), 2),
            _ if two == b"!=" => (Token::Op(Op::Ne), 2),
            _ if two == b"<=" => (Token::Op(Op::Le), 2),
            _ if two == b">=" => (Token::Op(Op::Ge), 2),
            b'<' => (Token::Op(Op::Lt), 1),
            b'>' => (Token::Op(Op::Gt), 1),
            b'&' => (Token::Op(Op::And), 1),
            b'!' => (Token::Bang, 1),
            b'0'..=b'9' => {
                let end = b[i..].iter().position(|c| !c.is_ascii_alphanumeric()).map_or(b.len(), |n| i + n);
                let word = &text[i..end];
                let n = match word.strip_prefix("0x").or_else(|| word.strip_prefix("0X")) {
                    Some(hex) => u64::from_str_radix(hex, 16),
                    None => word.parse(),
                }
                .map_err(|_| FilterError::Syntax(word.to_owned()))?;
                (Token::Number(n), end - i)
            }
            _ if c.is_ascii_alphabetic() || c == b'_' => {
                let end = b[i..]
                    .iter()
                    .position(|c| !(c.is_ascii_alphanumeric() || *c == b'_'))
                    .map_or(b.len(), |n| i + n);
                (Token::Ident(text[i..end].to_owned()), end - i)
            }
            _ => return Err(FilterError::Syntax(text[i..].chars().take(16).collect())),
        };
        out.push(token);
        i += len;
    }
    Ok(out)
}

struct Parser<'a> {
    tokens: Vec<Token>,
    at: usize,
    fields: &'a Fields,
    depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }
    fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.at).cloned();
        self.at += 1;
        t
    }
    fn error(&self) -> FilterError {
        FilterError::Syntax(format!("token {}", self.at))
    }
    fn or(&mut self) -> Result<Pred, FilterError> {
        let mut left = self.and()?;
        while self.peek() == Some(&Token::OrOr) {
            self.at += 1;
            left = Pred::Any(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }
    fn and(&mut self) -> Result<Pred, FilterError> {
        let mut left = self.unary()?;
        while self.peek() == Some(&Token::AndAnd) {
            self.at += 1;
            left = Pred::All(Box::new(left), Box::new(self.unary()?));
        }
        Ok(left)
    }
    fn unary(&mut self) -> Result<Pred, FilterError> {
        // Nesting is bounded: a hostile or mistaken filter cannot exhaust the stack.
        self.depth += 1;
        if self.depth > 64 {
            return Err(self.error());
        }
        let p = match self.next() {
            Some(Token::Bang) => Pred::Not(Box::new(self.unary()?)),
            Some(Token::Open) => {
                let inner = self.or()?;
                if self.next() != Some(Token::Close) {
                    return Err(self.error());
                }
                inner
            }
            Some(Token::Ident(name)) => {
                let field = *self.fields.get(&name).ok_or(FilterError::UnknownField(name))?;
                match (self.next(), self.next()) {
                    (Some(Token::Op(op)), Some(Token::Number(n))) => Pred::Cmp(field, op, n),
                    _ => return Err(self.error()),
                }
            }
            _ => return Err(self.error()),
        };
        self.depth -= 1;
        Ok(p)
    }
}

/// Parses `filter` against `fields`.
///
/// # Errors
/// An unknown field, or text outside the grammar.
pub fn parse_filter(filter: &str, fields: &Fields) -> Result<Pred, FilterError> {
    let mut p = Parser { tokens: tokens(filter)?, at: 0, fields, depth: 0 };
    let pred = p.or()?;
    if p.at != p.tokens.len() {
        return Err(p.error());
    }
    Ok(pred)
}

impl Pred {
    /// Evaluates the predicate on a record (what the program does in the kernel; for tests).
    pub fn eval(&self, record: &[u8]) -> bool {
        match self {
            Pred::Cmp(f, op, v) => {
                let signed = f.signed && op.orders();
                let Some(a) = read_field(record, *f, signed) else { return false };
                let b = if signed { *v } else { f.truncate(*v) };
                match op {
                    Op::Eq => a == b,
                    Op::Ne => a != b,
                    Op::And => a & b != 0,
                    Op::Lt if signed => (a as i64) < b as i64,
                    Op::Le if signed => (a as i64) <= b as i64,
                    Op::Gt if signed => (a as i64) > b as i64,
                    Op::Ge if signed => (a as i64) >= b as i64,
                    Op::Lt => a < b,
                    Op::Le => a <= b,
                    Op::Gt => a > b,
                    Op::Ge => a >= b,
                }
            }
            Pred::All(a, b) => a.eval(record) && b.eval(record),
            Pred::Any(a, b) => a.eval(record) || b.eval(record),
            Pred::Not(a) => !a.eval(record),
        }
    }
}

impl Op {
    /// True for the orderings (`<`, `<=`, `>`, `>=`), which compare a signed field as signed;
    /// equality and bit tests compare the field's bits with the number cut to the field's size,
    /// as C compares an `int` field with a constant.
    pub fn orders(self) -> bool {
        matches!(self, Op::Lt | Op::Le | Op::Gt | Op::Ge)
    }
}

impl Field {
    /// `v` cut to the field's size.
    pub fn truncate(self, v: u64) -> u64 {
        if self.size >= 8 { v } else { v & ((1u64 << (8 * u32::from(self.size))) - 1) }
    }
}

/// A field's value in `record`, sign-extended when `signed`.
pub(crate) fn read_field(record: &[u8], f: Field, signed: bool) -> Option<u64> {
    let at = usize::from(f.offset);
    let bytes = record.get(at..at + usize::from(f.size))?;
    let mut w = [0u8; 8];
    w[..bytes.len()].copy_from_slice(bytes);
    let v = u64::from_le_bytes(w);
    let bits = 8 * u32::from(f.size);
    Some(if signed && bits < 64 { (((v << (64 - bits)) as i64) >> (64 - bits)) as u64 } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MMIO: &str = "name: kvm_mmio\nID: 40\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\tfield:u32 type;\toffset:8;\tsize:4;\tsigned:0;\n\tfield:u32 len;\toffset:12;\tsize:4;\tsigned:0;\n\tfield:u64 gpa;\toffset:16;\tsize:8;\tsigned:0;\n\tfield:char comm[16];\toffset:24;\tsize:16;\tsigned:0;\n";

    fn record(ty: u32, gpa: u64) -> Vec<u8> {
        let mut r = vec![0u8; 32];
        r[8..12].copy_from_slice(&ty.to_le_bytes());
        r[16..24].copy_from_slice(&gpa.to_le_bytes());
        r
    }

    #[test]
    fn the_format_file_gives_offsets_sizes_and_signedness() {
        let f = parse_format(MMIO);
        assert_eq!(f["gpa"], Field { offset: 16, size: 8, signed: false });
        assert_eq!(f["common_pid"], Field { offset: 4, size: 4, signed: true });
        assert!(!f.contains_key("comm"), "arrays are not comparable");
    }

    #[test]
    fn the_observers_filters_parse_and_evaluate_as_ftrace_would() {
        let f = parse_format(MMIO);
        let apic = parse_filter("gpa >= 0xfee00000 && gpa < 0xfee01000 && type != 0", &f).unwrap();
        assert!(apic.eval(&record(1, 0xfee000b0)));
        assert!(!apic.eval(&record(0, 0xfee000b0)));
        assert!(!apic.eval(&record(2, 0xfee01000)));
        let eoi = parse_filter("gpa == 0xfee000b0 && type == 2", &f).unwrap();
        assert!(eoi.eval(&record(2, 0xfee000b0)) && !eoi.eval(&record(1, 0xfee000b0)));
        let bits = parse_filter("(type & 4) && !(type & 8)", &f).unwrap();
        assert!(bits.eval(&record(4, 0)) && !bits.eval(&record(12, 0)) && !bits.eval(&record(0, 0)));
        let pid = parse_filter("common_pid == 0x80000b0e && common_pid < 0", &f).unwrap();
        let mut r = record(0, 0);
        r[4..8].copy_from_slice(&0x8000_0b0eu32.to_le_bytes());
        assert!(pid.eval(&r), "an int field equals the constant's low bits and orders as negative");
        let or = parse_filter("type == 29 || type == 30", &f).unwrap();
        assert!(or.eval(&record(30, 0)) && !or.eval(&record(31, 0)));
    }

    #[test]
    fn what_the_grammar_does_not_take_is_an_error_not_a_guess() {
        let f = parse_format(MMIO);
        assert_eq!(parse_filter("nope == 1", &f), Err(FilterError::UnknownField("nope".into())));
        assert!(parse_filter("type ==", &f).is_err());
        assert!(parse_filter("type == 1 )", &f).is_err());
        assert!(parse_filter("comm ~ \"x\"", &f).is_err());
        assert!(parse_filter(&"(".repeat(10_000), &f).is_err());
    }
}
