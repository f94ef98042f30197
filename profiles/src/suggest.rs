//! "Did you mean" for names a user mistyped: the edit distance between two names, the close
//! candidates it picks, and the lists written the way messages print them.
//!
//! Every crate that suggests a name uses these, so that a slip is judged and worded alike for
//! hardware, models, workload flags and device maps.

/// Levenshtein distance over characters: the fewest single-character insertions, deletions and
/// substitutions that turn `a` into `b`.
pub fn edit_distance(a: &str, b: &str) -> usize {
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
/// distance (at least 1, at most 3), nearest first, ties in candidate order, without repeats.
pub fn closest<'a>(
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
pub fn ticked<S: AsRef<str>>(names: &[S]) -> String {
    names.iter().map(|n| format!("`{}`", n.as_ref())).collect::<Vec<_>>().join(", ")
}

/// "`a`, `b` or `c`" (each name in backticks).
pub fn ticked_or<S: AsRef<str>>(names: &[S]) -> String {
    let ticked: Vec<String> = names.iter().map(|n| format!("`{}`", n.as_ref())).collect();
    or_list(&ticked)
}

/// "a, b or c" (the items as they are).
pub fn or_list<S: AsRef<str>>(items: &[S]) -> String {
    match items.split_last() {
        Some((last, rest)) if !rest.is_empty() => {
            let rest: Vec<&str> = rest.iter().map(AsRef::as_ref).collect();
            format!("{} or {}", rest.join(", "), last.as_ref())
        }
        Some((last, _)) => last.as_ref().to_string(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_single_character_edits() {
        assert_eq!(edit_distance("t4", "t4"), 0);
        assert_eq!(edit_distance("rtx409", "rtx4090"), 1);
        assert_eq!(edit_distance("a100-80g", "a100-80gb"), 1);
        assert_eq!(edit_distance("h100", "h200"), 1);
        assert_eq!(edit_distance("layer", "layers"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
    }

    #[test]
    fn closest_keeps_near_names_in_order() {
        let names = ["adamw", "adamw8bit", "sgd", "adafactor"];
        assert_eq!(closest("adamv", names, 3), vec!["adamw"]);
        assert_eq!(closest("zzzzzz", names, 3), Vec::<&str>::new());
    }

    #[test]
    fn lists_read_as_messages_print_them() {
        assert_eq!(ticked(&["a", "b"]), "`a`, `b`");
        assert_eq!(ticked_or(&["a", "b", "c"]), "`a`, `b` or `c`");
        assert_eq!(ticked_or(&["a"]), "`a`");
        assert_eq!(or_list(&["GPU 0".to_string(), "GPU 1".to_string()]), "GPU 0 or GPU 1");
        assert_eq!(or_list::<&str>(&[]), "");
    }
}
