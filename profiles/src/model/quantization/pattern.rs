//! The part of Python's `re` that skip lists and targets of quantization configs use, for
//! transformers 5.x's `should_convert_module` and compressed-tensors' `re:` targets.

use std::collections::HashSet;

/// What one position of a pattern accepts.
enum Class {
    Any,
    Literal(char),
    Digit,
    Word,
    Space,
    Set { negated: bool, ranges: Vec<(char, char)> },
}

impl Class {
    fn accepts(&self, c: char) -> bool {
        match self {
            Class::Any => c != '\n',
            Class::Literal(l) => *l == c,
            Class::Digit => c.is_ascii_digit(),
            Class::Word => c.is_alphanumeric() || c == '_',
            Class::Space => c.is_whitespace(),
            Class::Set { negated, ranges } => {
                ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&c)) != *negated
            }
        }
    }
}

/// A class repeated `min..=max` times (`max` `None`: unbounded).
struct Atom {
    class: Class,
    min: usize,
    max: Option<usize>,
}

/// Whether `pattern`, as `re.match` reads it, matches `path` from its start up to a module
/// boundary (the end, a `.` next, or just after a `.`). Patterns using syntax beyond
/// classes, sets, escapes, `* + ?` and top-level `|` are matched as literal text.
pub(super) fn matches_at_module_boundary(pattern: &str, path: &str) -> bool {
    const SYNTAX: &[char] = &['.', '*', '+', '?', '|', '\\', '[', ']', '(', ')', '{', '}', '^', '$'];
    if !pattern.contains(SYNTAX) {
        // Plain text, the common case (`lm_head`): a prefix ending at a module boundary.
        return path.strip_prefix(pattern).is_some_and(|rest| rest.is_empty() || rest.starts_with('.'));
    }
    let text: Vec<char> = path.chars().collect();
    let boundary = |end: usize| {
        end == text.len() || text.get(end) == Some(&'.') || (end > 0 && text.get(end - 1) == Some(&'.'))
    };
    matches_where(pattern, &text, boundary)
}

/// Whether `pattern` matches `path` from its start, ending anywhere: Python's
/// `re.match(pattern, path)`, as compressed-tensors reads a `re:` target.
pub(super) fn matches_prefix(pattern: &str, path: &str) -> bool {
    let text: Vec<char> = path.chars().collect();
    matches_where(pattern, &text, |_| true)
}

/// Whether some match of `pattern` from the start of `text` ends where `accept` allows (and at
/// the end of `text` for an alternative ending in `$`).
fn matches_where(pattern: &str, text: &[char], accept: impl Fn(usize) -> bool) -> bool {
    let alternatives = parse(pattern).unwrap_or_else(|| vec![literal(pattern)]);
    alternatives.iter().any(|(atoms, anchored_end)| {
        let mut ends = Vec::new();
        let mut seen = HashSet::new();
        match_ends(atoms, 0, text, &mut seen, &mut ends);
        ends.into_iter().any(|end| accept(end) && (!anchored_end || end == text.len()))
    })
}

fn literal(pattern: &str) -> (Vec<Atom>, bool) {
    (pattern.chars().map(|c| Atom { class: Class::Literal(c), min: 1, max: Some(1) }).collect(), false)
}

/// Every position where a match of `atoms[index..]` starting at `pos` can end.
fn match_ends(
    atoms: &[Atom],
    pos: usize,
    text: &[char],
    seen: &mut HashSet<(usize, usize)>,
    ends: &mut Vec<usize>,
) {
    if !seen.insert((atoms.len(), pos)) {
        return;
    }
    let Some((atom, rest)) = atoms.split_first() else {
        ends.push(pos);
        return;
    };
    let mut at = pos;
    let mut count = 0;
    loop {
        if count >= atom.min {
            match_ends(rest, at, text, seen, ends);
        }
        if atom.max.is_some_and(|max| count >= max) {
            break;
        }
        match text.get(at) {
            Some(c) if atom.class.accepts(*c) => {
                at += 1;
                count += 1;
            }
            _ => break,
        }
    }
}

/// The alternatives of `pattern`, each with whether it ends in `$`; `None` for syntax this
/// reader does not know.
fn parse(pattern: &str) -> Option<Vec<(Vec<Atom>, bool)>> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut alternatives = Vec::new();
    let mut atoms: Vec<Atom> = Vec::new();
    let mut anchored_end = false;
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        i += 1;
        if anchored_end && c != '|' {
            return None;
        }
        let class = match c {
            '|' => {
                alternatives.push((std::mem::take(&mut atoms), anchored_end));
                anchored_end = false;
                continue;
            }
            '^' if atoms.is_empty() => continue,
            '$' => {
                anchored_end = true;
                continue;
            }
            '*' | '+' | '?' => {
                let atom = atoms.last_mut()?;
                if atom.min != 1 || atom.max != Some(1) {
                    return None;
                }
                (atom.min, atom.max) = match c {
                    '*' => (0, None),
                    '+' => (1, None),
                    _ => (0, Some(1)),
                };
                continue;
            }
            '.' => Class::Any,
            '\\' => {
                let escaped = *chars.get(i)?;
                i += 1;
                escape(escaped)?
            }
            '[' => {
                let (set, next) = parse_set(&chars, i)?;
                i = next;
                set
            }
            '(' | ')' | '{' | '}' | ']' => return None,
            other => Class::Literal(other),
        };
        atoms.push(Atom { class, min: 1, max: Some(1) });
    }
    alternatives.push((atoms, anchored_end));
    Some(alternatives)
}

fn escape(c: char) -> Option<Class> {
    Some(match c {
        'd' => Class::Digit,
        'w' => Class::Word,
        's' => Class::Space,
        c if c.is_ascii_alphanumeric() => return None,
        c => Class::Literal(c),
    })
}

/// A `[...]` set whose body starts at `start`; returns it and the index after `]`.
fn parse_set(chars: &[char], start: usize) -> Option<(Class, usize)> {
    let mut i = start;
    let negated = chars.get(i) == Some(&'^');
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    let mut first = true;
    loop {
        let c = *chars.get(i)?;
        i += 1;
        if c == ']' && !first {
            return Some((Class::Set { negated, ranges }, i));
        }
        first = false;
        let low = if c == '\\' {
            let escaped = *chars.get(i)?;
            i += 1;
            match escaped {
                'd' => {
                    ranges.push(('0', '9'));
                    continue;
                }
                c if c.is_ascii_alphanumeric() => return None,
                c => c,
            }
        } else {
            c
        };
        if chars.get(i) == Some(&'-') && chars.get(i + 1).is_some_and(|c| *c != ']') {
            let high = *chars.get(i + 1)?;
            if high == '\\' || high < low {
                return None;
            }
            ranges.push((low, high));
            i += 2;
        } else {
            ranges.push((low, low));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::matches_at_module_boundary as skips;

    #[test]
    fn entries_match_from_the_start_up_to_a_module_boundary() {
        assert!(skips("model.layers.1", "model.layers.1"));
        assert!(skips("model.layers.1", "model.layers.1.mlp.gate_proj"));
        assert!(!skips("model.layers.1", "model.layers.10.mlp"));
        assert!(skips("model.layers.*.self_attn", "model.layers.7.self_attn.q_proj"));
        assert!(!skips("model.layers.*.self_attn", "model.layers.7.mlp.down_proj"));
        assert!(!skips("mlp.gate", "model.layers.0.mlp.gate_proj"), "not anchored at the start");
        assert!(skips(r"model\.layers\.[0-2]\.mlp", "model.layers.2.mlp.up_proj"));
        assert!(!skips(r"model\.layers\.[0-2]\.mlp", "model.layers.3.mlp.up_proj"));
        assert!(skips(r"model.layers.\d+.mlp$", "model.layers.12.mlp"));
        assert!(!skips(r"model.layers.\d+.mlp$", "model.layers.12.mlp.up_proj"));
        assert!(skips("lm_head|model.embed_tokens", "model.embed_tokens"));
        // Unknown syntax is matched literally.
        assert!(skips("model.(layers)", "model.(layers).0"));
        assert!(!skips("model.(layers)", "model.layers.0"));
    }

    #[test]
    fn prefix_matches_end_anywhere() {
        use super::matches_prefix;
        assert!(matches_prefix(r".*mlp\.gate$", "model.layers.3.mlp.gate"));
        assert!(!matches_prefix(r".*mlp\.gate$", "model.layers.3.mlp.gate_proj"));
        assert!(matches_prefix("model.layers.1", "model.layers.10"));
    }
}
