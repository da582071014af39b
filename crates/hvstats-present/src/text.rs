//! Names that others choose, made safe to print.
//!
//! A VM's name comes from its VMM's command line or QMP, a hardware counter holder's from a table
//! file; either can hold a newline (which forges a line of a report or a log) or an escape
//! sequence (which clears or retitles the terminal), or characters that show nothing (a zero-width
//! space makes `prod​-db` read as `prod-db`). Every surface that prints such a name to a terminal,
//! a log or a metric label prints it through [`Escaped`]: control characters, backslashes and the
//! characters that cannot be seen or reorder text ([`hvstats::vm_name::invisible`]: zero-width
//! spaces and joiners, bidirectional marks and overrides, …) come out as Rust escapes (`\n`,
//! `\u{1b}`, `\u{200b}`, `\\`), everything else as it is. JSON output keeps names exact.

use std::fmt;

/// Displays a name with control and reordering characters escaped (see the module documentation).
///
/// ```
/// use hvstats_present::text::Escaped;
/// assert_eq!(Escaped("guest\n\x1b[2J").to_string(), r"guest\n\u{1b}[2J");
/// assert_eq!(Escaped("web-01 (ü)").to_string(), "web-01 (ü)");
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Escaped<'a>(pub &'a str);

/// True for characters shown escaped.
fn needs_escape(c: char) -> bool {
    c.is_control() || c == '\\' || hvstats::vm_name::invisible(c)
}

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.0.chars().any(needs_escape) {
            // Padding and alignment as for a plain string.
            return f.pad(self.0);
        }
        let mut escaped = String::with_capacity(self.0.len() + 8);
        for c in self.0.chars() {
            if needs_escape(c) {
                match c {
                    '\n' | '\r' | '\t' | '\\' | '\0' => escaped.extend(c.escape_debug()),
                    _ => escaped.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
                }
            } else {
                escaped.push(c);
            }
        }
        f.pad(&escaped)
    }
}

/// The characters of a name a log line shows; a longer name is cut there (see [`LoggedName`]).
pub const LOGGED_NAME_CHARS: usize = 64;

/// Displays a name as a log line says it: [`Escaped`], and cut after [`LOGGED_NAME_CHARS`]
/// characters with its length in bytes, so a name of any length (one tenant's was 10,000
/// characters) makes a line of bounded length. Every log line that names a VM takes it through
/// this; reports and JSON keep names whole.
///
/// ```
/// use hvstats_present::text::LoggedName;
/// assert_eq!(LoggedName("web-01").to_string(), "web-01");
/// let long = "x".repeat(1000);
/// assert_eq!(LoggedName(&long).to_string(), format!("{}…(1000 bytes)", "x".repeat(64)));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct LoggedName<'a>(pub &'a str);

impl fmt::Display for LoggedName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.char_indices().nth(LOGGED_NAME_CHARS) {
            None => write!(f, "{}", Escaped(self.0)),
            Some((cut, _)) => write!(f, "{}…({} bytes)", Escaped(&self.0[..cut]), self.0.len()),
        }
    }
}

/// Displays a log line on one line: its control characters come out as Rust escapes (`\n`,
/// `\u{1b}`), nothing else changes. Names a line quotes went through [`Escaped`] already, so
/// their backslashes are not escaped twice; a line that failed to escape a name still cannot
/// forge a second line or drive a terminal.
///
/// ```
/// use hvstats_present::text::{Escaped, OneLine};
/// let line = format!("attach \"{}\"", Escaped("web\n"));
/// assert_eq!(OneLine(&line).to_string(), r#"attach "web\n""#);
/// assert_eq!(OneLine("a\nforged\x1b[2J é").to_string(), r"a\nforged\u{1b}[2J é");
/// ```
#[derive(Clone, Copy, Debug)]
pub struct OneLine<'a>(pub &'a str);

impl fmt::Display for OneLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                fmt::Write::write_char(f, c)?;
            }
        }
        Ok(())
    }
}

/// `name` with control and reordering characters escaped, as an owned string.
pub fn escaped(name: &str) -> String {
    Escaped(name).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newlines_escapes_and_overrides_cannot_reach_a_terminal() {
        let hostile = "dup\nhvstats: forged line\r\x1b[2J\x07\u{202e}cod.exe\\n\u{85}";
        let shown = escaped(hostile);
        assert_eq!(shown, r"dup\nhvstats: forged line\r\u{1b}[2J\u{7}\u{202e}cod.exe\\n\u{85}");
        assert!(shown.chars().all(|c| !c.is_control() && !needs_escape(c) || c == '\\'), "{shown:?}");
        assert_eq!(format!("{:<8}|", Escaped("vm")), "vm      |");
        assert_eq!(format!("{:>6}|", Escaped("a\nb")), "  a\\nb|");
        assert_eq!(escaped("Ünïcödé names stay"), "Ünïcödé names stay");
        // Characters that show nothing cannot make one name pass for another.
        assert_eq!(escaped("prod\u{200b}-db\u{feff}\u{2066}"), r"prod\u{200b}-db\u{feff}\u{2066}");
    }
}
