//! An error with its sources on one line, as every report of hvstats shows one: the host readers',
//! the authority's and the surfaces'.

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
