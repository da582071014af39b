//! An error with its sources on one line, as every report of this crate and its users shows one.
//! Its own module, so the reader ([`crate::attach`]) and the snapshot built on it do not depend
//! on each other for it.

/// An error and all its sources on one line (`outer: cause: root cause`), as reports show it.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
