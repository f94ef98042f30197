//! Dotted tensor names: splitting a name into its module and tensor, ordering names the way
//! people number layers (`layers.2` before `layers.10`), and summarising long name lists as
//! patterns (`model.layers.N.self_attn.rotary_emb.inv_freq ×32`) so notes stay short.

use std::cmp::Ordering;
use std::collections::BTreeMap;

/// Tensor names that contain a dot: bitsandbytes stores a 4-bit weight's quantization state
/// under the weight's own name.
const DOTTED_TENSORS: &[&str] = &[
    "weight.absmax",
    "weight.quant_map",
    "weight.nested_absmax",
    "weight.nested_quant_map",
    "weight.quant_state.bitsandbytes__nf4",
    "weight.quant_state.bitsandbytes__fp4",
];

/// Splits a full tensor name into its module path and tensor name
/// (`a.b.weight.absmax` → (`a.b`, `weight.absmax`)); a bare name belongs to the root.
pub(crate) fn split(full: &str) -> (&str, &str) {
    for dotted in DOTTED_TENSORS {
        if let Some(module) = full.strip_suffix(dotted).and_then(|m| m.strip_suffix('.')) {
            return (module, &full[module.len() + 1..]);
        }
        if full == *dotted {
            return ("", full);
        }
    }
    full.rsplit_once('.').unwrap_or(("", full))
}

/// True for a path component that is a list index (`17`).
pub(crate) fn is_index(component: &str) -> bool {
    !component.is_empty() && component.bytes().all(|b| b.is_ascii_digit())
}

/// Orders dotted names component by component, numbers numerically.
pub(crate) fn natural_cmp(a: &str, b: &str) -> Ordering {
    let mut left = a.split('.');
    let mut right = b.split('.');
    loop {
        match (left.next(), right.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) => {
                let order = if is_index(x) && is_index(y) {
                    x.len().cmp(&y.len()).then_with(|| x.cmp(y))
                } else {
                    x.cmp(y)
                };
                if order != Ordering::Equal {
                    return order;
                }
            }
        }
    }
}

/// The name with every list index replaced by `N`.
pub(crate) fn pattern(name: &str) -> String {
    name.split('.').map(|c| if is_index(c) { "N" } else { c }).collect::<Vec<_>>().join(".")
}

/// `names` as at most `limit` patterns with counts, largest first, then "… and K more".
pub(crate) fn summarize<'a>(names: impl Iterator<Item = &'a str>, limit: usize) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for name in names {
        *counts.entry(pattern(name)).or_default() += 1;
    }
    let mut groups: Vec<(String, usize)> = counts.into_iter().collect();
    groups.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let shown: Vec<String> = groups
        .iter()
        .take(limit)
        .map(|(p, n)| if *n == 1 { format!("`{p}`") } else { format!("`{p}` ×{n}") })
        .collect();
    let mut text = shown.join(", ");
    if groups.len() > limit {
        let rest: usize = groups[limit..].iter().map(|(_, n)| n).sum();
        text.push_str(&format!(" … and {rest} more"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_bitsandbytes_state_with_its_weight() {
        assert_eq!(split("m.l.0.q.weight.absmax"), ("m.l.0.q", "weight.absmax"));
        assert_eq!(
            split("m.l.0.q.weight.quant_state.bitsandbytes__nf4"),
            ("m.l.0.q", "weight.quant_state.bitsandbytes__nf4")
        );
        assert_eq!(split("m.l.0.q.weight"), ("m.l.0.q", "weight"));
        assert_eq!(split("weight"), ("", "weight"));
    }

    #[test]
    fn numbers_sort_numerically_and_summaries_group_patterns() {
        let mut v = vec!["a.10.w", "a.2.w", "a.1.w", "b"];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(v, ["a.1.w", "a.2.w", "a.10.w", "b"]);
        assert_eq!(summarize(v.iter().copied(), 1), "`a.N.w` ×3 … and 1 more");
    }
}
