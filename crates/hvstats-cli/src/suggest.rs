//! "Did you mean" for a counter name a user typed, and the names the surfaces print accepted as
//! names.

use hvstats_abi::catalog::{Counter, counters_of};
use hvstats_present::present::shown_name;

/// The names a user may give for `c`: its catalog name, the name the surfaces show
/// (`HLT time halted`), and `snapshot`'s row names with and without an interval
/// (`Hypercalls (total)`).
fn labels_of(c: &'static Counter) -> [String; 4] {
    use crate::names::row_name;
    [c.name.to_owned(), shown_name(c).to_owned(), row_name(c, false), row_name(c, true)]
}

/// The counter of `kind` that `label` names: by its catalog name, or by a name `report`,
/// `snapshot` and `top` print for it ([`labels_of`]), case ignored.
pub(crate) fn counter_by_label(kind: hvstats_abi::ObjectKind, label: &str) -> Option<&'static Counter> {
    let label = label.trim();
    hvstats_abi::catalog::counter_by_name(kind, label)
        .or_else(|| counters_of(kind).find(|c| labels_of(c).iter().any(|l| l.eq_ignore_ascii_case(label))))
}

/// The names of `kind` nearest to `name` (catalog names, or the names the surfaces show), best
/// first, at most `n`: names holding every word of `name` (shortest first), then names spelled
/// alike. For "did you mean" in usage errors.
pub(crate) fn nearest_names(kind: hvstats_abi::ObjectKind, name: &str, n: usize) -> Vec<&'static str> {
    let wanted = name.to_lowercase();
    let words: Vec<&str> = wanted.split_whitespace().collect();
    let mut scored: Vec<(u8, usize, &'static str)> = counters_of(kind)
        .flat_map(|c| {
            let shown = shown_name(c);
            std::iter::once(c.name).chain((shown != c.name).then_some(shown))
        })
        .filter_map(|candidate| {
            let lower = candidate.to_lowercase();
            if !words.is_empty() && words.iter().all(|w| lower.contains(w)) {
                return Some((0, candidate.len(), candidate));
            }
            let similarity = strsim::normalized_damerau_levenshtein(&wanted, &lower);
            (similarity >= 0.6).then_some((1, ((1.0 - similarity) * 1000.0) as usize, candidate))
        })
        .collect();
    scored.sort();
    scored.into_iter().take(n).map(|(_, _, name)| name).collect()
}

/// "; did you mean …?" for `name`, or nothing when no name is near it.
pub(crate) fn did_you_mean(kind: hvstats_abi::ObjectKind, name: &str) -> String {
    let near = nearest_names(kind, name, 3);
    if near.is_empty() {
        return String::new();
    }
    let quoted: Vec<String> = near.iter().map(|n| format!("{n:?}")).collect();
    format!("; did you mean {}?", quoted.join(" or "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hvstats_abi::ObjectKind;
    use hvstats_abi::catalog::vp;

    #[test]
    fn the_names_the_surfaces_print_name_their_counters() {
        let halted = vp::HLT_INSTRUCTIONS_COST.counter().unwrap();
        for label in ["HLT time halted", "hlt time halted", "HLT time halted (total time)", halted.name] {
            assert_eq!(counter_by_label(ObjectKind::Vp, label).map(|c| c.id), Some(halted.id), "{label}");
        }
        let hypercalls = vp::HYPERCALLS.counter().unwrap();
        assert_eq!(counter_by_label(ObjectKind::Vp, "Hypercalls (total)").map(|c| c.id), Some(hypercalls.id));
        assert_eq!(counter_by_label(ObjectKind::Vp, "HLT time"), None);
        // A typo of a shown name is answered with it.
        assert_eq!(nearest_names(ObjectKind::Vp, "HLT time halt", 1), ["HLT time halted"]);
    }
}
