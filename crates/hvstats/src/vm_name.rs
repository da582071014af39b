//! VM names as others choose them: which characters cannot be seen, and which names look alike.
//!
//! A VMM's command line or QMP peer names its VM, and nothing stops it from naming it like
//! another: `prod​-db` (with a zero-width space) or `prоd-db` (with a Cyrillic `о`) reads as
//! `prod-db` on a dashboard. The surfaces show [`invisible`] characters escaped, and the observer
//! says when a VM's name [`looks_like`] another's.

/// True for characters that show nothing or reorder what follows: Unicode's default-ignorable
/// code points (zero-width spaces and joiners, the bidirectional marks, embeddings, overrides
/// and isolates, the Arabic letter mark, soft hyphens, variation selectors, tags, …) and the
/// line and paragraph separators.
pub fn invisible(c: char) -> bool {
    // Default_Ignorable_Code_Point (Unicode's DerivedCoreProperties.txt), and U+2028/U+2029.
    matches!(
        c,
        '\u{00ad}'
            | '\u{034f}'
            | '\u{061c}'
            | '\u{115f}'..='\u{1160}'
            | '\u{17b4}'..='\u{17b5}'
            | '\u{180b}'..='\u{180f}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{3164}'
            | '\u{fe00}'..='\u{fe0f}'
            | '\u{feff}'
            | '\u{ffa0}'
            | '\u{fff0}'..='\u{fff8}'
            | '\u{1bca0}'..='\u{1bca3}'
            | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0000}'..='\u{e0fff}'
    )
}

/// True when `a` and `b` differ but read alike: the same once invisible characters are dropped
/// and each character is taken as what it is confusable with (the skeleton of Unicode's
/// UTS #39, by `unicode-security`).
///
/// ```
/// use hvstats::vm_name::looks_like;
/// assert!(looks_like("prod-db", "prod\u{200b}-db"));
/// assert!(looks_like("prod-db", "pr\u{043e}d-db")); // Cyrillic о
/// assert!(!looks_like("prod-db", "prod-db"));
/// assert!(!looks_like("prod-db", "prod-db2"));
/// ```
pub fn looks_like(a: &str, b: &str) -> bool {
    a != b && skeleton(a) == skeleton(b)
}

/// What a name reads as: its visible characters, each as its confusable prototype.
fn skeleton(name: &str) -> String {
    let visible: String = name.chars().filter(|c| !invisible(*c)).collect();
    unicode_security::skeleton(&visible).collect()
}
