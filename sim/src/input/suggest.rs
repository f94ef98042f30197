//! Close names for "did you mean" fixes: edit distance over characters, and lists written the
//! way messages print them.

/// Levenshtein distance over characters.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = Vec::with_capacity(b.len() + 1);
        current.push(i + 1);
        for (j, cb) in b.iter().enumerate() {
            let substitute =
                previous.get(j).copied().unwrap_or(usize::MAX).saturating_add(usize::from(ca != *cb));
            let delete = previous.get(j + 1).copied().unwrap_or(usize::MAX).saturating_add(1);
            let insert = current.get(j).copied().unwrap_or(usize::MAX).saturating_add(1);
            current.push(substitute.min(delete).min(insert));
        }
        previous = current;
    }
    previous.last().copied().unwrap_or(0)
}

/// Up to `limit` candidates close to `wanted`: those within a third of its length in edit
/// distance (at least 1, at most 3), nearest first, ties in candidate order.
pub(crate) fn closest<'a>(
    wanted: &str,
    candidates: impl IntoIterator<Item = &'a str>,
    limit: usize,
) -> Vec<&'a str> {
    let budget = (wanted.chars().count() / 3).clamp(1, 3);
    let mut near: Vec<(usize, usize, &'a str)> = candidates
        .into_iter()
        .enumerate()
        .map(|(order, c)| (edit_distance(wanted, c), order, c))
        .filter(|(d, _, _)| *d <= budget)
        .collect();
    near.sort_unstable();
    let mut out: Vec<&'a str> = Vec::new();
    for (_, _, name) in near {
        if !out.contains(&name) {
            out.push(name);
        }
        if out.len() == limit {
            break;
        }
    }
    out
}

/// "`a`, `b`, `c`" (each name in backticks, comma-separated).
pub(crate) fn ticked(names: &[&str]) -> String {
    names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

/// "`a` or `b`".
pub(crate) fn ticked_or(names: &[&str]) -> String {
    let ticked: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match ticked.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => ticked.join(""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_counts_single_character_edits() {
        assert_eq!(edit_distance("layer", "layers"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
    }

    #[test]
    fn closest_keeps_near_names_in_order() {
        let names = ["adamw", "adamw8bit", "sgd", "adafactor"];
        assert_eq!(closest("adamv", names, 3), vec!["adamw"]);
        assert_eq!(closest("zzzzzz", names, 3), Vec::<&str>::new());
        assert_eq!(ticked_or(&["a", "b", "c"]), "`a`, `b` or `c`");
    }
}
