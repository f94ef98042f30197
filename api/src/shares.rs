//! Shares as the flags write them: `--headroom`, `--gap` (`10%`, or `0.1` as a share below 1).

use crate::InputError;

/// `--headroom`: `10%` (an explicit percentage) or `0.1` (a share below 1) → 0.1, from 0 to
/// 90 %.
pub fn parse_headroom(text: &str) -> Result<f64, InputError> {
    parse_share("--headroom", text, 0.9, "of memory")
}

/// `--gap`: the solver's tolerance, as `--headroom` is written, from 0 to 50 %.
pub(crate) fn parse_gap(text: &str) -> Result<f64, InputError> {
    parse_share("--gap", text, 0.5, "of the best plan")
}

/// `10%` (an explicit percentage) or `0.1` (a share below 1) → 0.1, from 0 to `max`, for
/// `flag`. A bare number of 1 or more is refused: `2` could mean 2 % or 200 %, and one
/// spelling has one meaning.
fn parse_share(flag: &str, text: &str, max: f64, of: &str) -> Result<f64, InputError> {
    let range = format!("keep from 0 to {:.0} %, e.g. `{flag} 10%` or `{flag} 0.1`", max * 100.0);
    let bad = |what: &str| InputError::new(flag, format!("`{text}` {what}")).with_fix(range.clone());
    let trimmed = text.trim();
    let (number, percent) = match trimmed.strip_suffix('%') {
        Some(n) => (n.trim(), true),
        None => (trimmed, false),
    };
    let not_a_share = format!("is not a share {of}");
    let value: f64 = number.parse().map_err(|_| bad(&not_a_share))?;
    if !value.is_finite() {
        return Err(bad(&not_a_share));
    }
    if !percent && value >= 1.0 {
        return Err(InputError::new(
            flag,
            format!("`{text}` is ambiguous: a bare number is a share {of} below 1, a percentage needs `%`"),
        )
        .with_fix(format!("write `{number}%` for {number} percent, or `{}` as a share", value / 100.0)));
    }
    let share = if percent { value / 100.0 } else { value };
    if !(0.0..=max).contains(&share) {
        return Err(bad(&format!("is outside 0 to {:.0} % {of}", max * 100.0)));
    }
    Ok(share)
}
