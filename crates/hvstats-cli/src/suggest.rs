//! "Did you mean" for a counter name a user typed.

/// The catalog names of `kind` nearest to `name`, best first, at most `n`: names holding every
/// word of `name` (shortest first), then names spelled alike. For "did you mean" in usage errors.
pub(crate) fn nearest_names(kind: hvstats_abi::ObjectKind, name: &str, n: usize) -> Vec<&'static str> {
    let wanted = name.to_lowercase();
    let words: Vec<&str> = wanted.split_whitespace().collect();
    let mut scored: Vec<(u8, usize, &'static str)> = hvstats_abi::catalog::counters_of(kind)
        .filter_map(|c| {
            let lower = c.name.to_lowercase();
            if !words.is_empty() && words.iter().all(|w| lower.contains(w)) {
                return Some((0, c.name.len(), c.name));
            }
            let similarity = strsim::normalized_damerau_levenshtein(&wanted, &lower);
            (similarity >= 0.6).then_some((1, ((1.0 - similarity) * 1000.0) as usize, c.name))
        })
        .collect();
    scored.sort();
    scored.into_iter().take(n).map(|(_, _, name)| name).collect()
}

/// "; did you mean …?" for `name`, or nothing when no catalog name is near it.
pub(crate) fn did_you_mean(kind: hvstats_abi::ObjectKind, name: &str) -> String {
    let near = nearest_names(kind, name, 3);
    if near.is_empty() {
        return String::new();
    }
    let quoted: Vec<String> = near.iter().map(|n| format!("{n:?}")).collect();
    format!("; did you mean {}?", quoted.join(" or "))
}
