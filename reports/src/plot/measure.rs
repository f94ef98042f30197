//! Text measured in the embedded font, so that figures lay their words out in pixels rather
//! than characters: a text's width (plotters' own measure, [`width`]), a text cut or wrapped to
//! a width ([`fit`], [`wrap`]), the title's lines ([`title_lines`]), labels along an axis kept
//! apart ([`Spaced`]) and labels beside a bar spread so that none overlaps ([`spread`]).

use super::font;
use ab_glyph::{Font, ScaleFont};

/// The width in pixels of `words` at `size` pixels, as plotters lays it out (the font's
/// advances and kerning, summed and truncated: `TextStyle::layout_box`).
pub(crate) fn width(words: &str, size: u32) -> i32 {
    let font = font().as_scaled(size as f32);
    let mut pixels = 0f32;
    let mut previous = None;
    for c in words.chars() {
        let id = font.glyph_id(c);
        pixels += font.h_advance(id);
        if let Some(p) = previous {
            pixels += font.kern(p, id);
        }
        previous = Some(id);
    }
    pixels as i32
}

/// The height in pixels a line of text at `size` inks: plotters' layout height (the top of
/// the capitals to the baseline) and the font's descent below it.
pub(crate) fn height(size: u32) -> i32 {
    let descent = -font().as_scaled(size as f32).descent();
    (f64::from(size) / 1.24) as i32 + descent.ceil() as i32
}

/// `words`, cut with an ellipsis where it is wider than `room` pixels at `size`.
pub(crate) fn fit(words: &str, size: u32, room: i32) -> String {
    if width(words, size) <= room {
        return words.to_string();
    }
    let chars: Vec<char> = words.chars().collect();
    // The longest prefix that fits with the ellipsis (widths grow with the prefix).
    let (mut low, mut high) = (0, chars.len());
    while low < high {
        let mid = (low + high).div_ceil(2);
        let candidate: String = chars[..mid].iter().collect::<String>() + "…";
        if width(&candidate, size) <= room { low = mid } else { high = mid - 1 }
    }
    let kept: String = chars[..low].iter().collect();
    kept.trim_end().to_string() + "…"
}

/// `words` broken at spaces into lines at most `room` pixels wide at `size`, at most `lines`
/// of them: a word wider than a line is cut, and the last line is cut with an ellipsis where
/// words are left over. A `·` separator stays at the end of its line, not the start of the
/// next, and a line breaks after one rather than mid-phrase where that leaves it at least
/// three fifths full.
pub(crate) fn wrap(words: &str, size: u32, room: i32, lines: usize) -> Vec<String> {
    if lines == 0 {
        return Vec::new();
    }
    let mut tokens: Vec<String> = Vec::new();
    for word in words.split(' ').filter(|w| !w.is_empty()) {
        match tokens.last_mut() {
            Some(last) if word == "·" => *last += " ·",
            _ => tokens.push(word.to_string()),
        }
    }
    let mut out: Vec<String> = Vec::new();
    let mut current: Vec<String> = Vec::new();
    let mut k = 0;
    while k < tokens.len() {
        let token = &tokens[k];
        let joined = [current.join(" "), token.clone()].join(if current.is_empty() { "" } else { " " });
        if width(&joined, size) <= room {
            current.push(token.clone());
            k += 1;
            continue;
        }
        if current.is_empty() {
            // A word wider than a line: cut.
            current.push(fit(token, size, room));
            k += 1;
            continue;
        }
        if out.len() + 1 >= lines {
            // The last line: the rest of the words, cut.
            out.push(fit(&format!("{} {}", current.join(" "), tokens[k..].join(" ")), size, room));
            return out;
        }
        let separator = (0..current.len() - 1)
            .rev()
            .find(|&j| current[j].ends_with('·') && width(&current[..=j].join(" "), size) * 5 >= room * 3);
        let carried = separator.map_or_else(Vec::new, |j| current.split_off(j + 1));
        out.push(current.join(" "));
        current = carried;
    }
    if !current.is_empty() {
        out.push(current.join(" "));
    }
    out
}

/// Pixels of the title's text and of a line of it.
pub(crate) const TITLE_SIZE: u32 = 17;
const TITLE_LINE: i32 = 22;
/// The title's left margin, and what it leaves at the right.
pub(crate) const TITLE_LEFT: i32 = 16;

/// The title's lines in a figure `figure_width` pixels wide: one where it fits, else broken
/// at its spaces (its `·` separators ending lines) into at most three.
pub(crate) fn title_lines(words: &str, figure_width: u32) -> Vec<String> {
    wrap(words, TITLE_SIZE, figure_width as i32 - 2 * TITLE_LEFT, 3)
}

/// Pixels from the top of a figure to where its body starts: 40 for a title of one line, 22
/// more for each further line.
pub(crate) fn title_height(words: &str, figure_width: u32) -> u32 {
    let lines = title_lines(words, figure_width).len().max(1) as i32;
    (40 + TITLE_LINE * (lines - 1)) as u32
}

/// The title's line `k` starts this many pixels from the top.
pub(crate) fn title_line_top(k: usize) -> i32 {
    10 + TITLE_LINE * k as i32
}

/// Labels along one axis (x spans in pixels), each placed only where it keeps `gap` pixels
/// from every one placed before it: the first placed wins.
#[derive(Default)]
pub(crate) struct Spaced {
    taken: Vec<(i32, i32)>,
}

impl Spaced {
    /// Places `left..right` where it keeps `gap` from the others; whether it was placed.
    pub(crate) fn place(&mut self, (left, right): (i32, i32), gap: i32) -> bool {
        if self.taken.iter().any(|&(l, r)| left < r + gap && l < right + gap) {
            return false;
        }
        self.taken.push((left, right));
        true
    }
}

/// Positions for labels `pitch` pixels tall wanting to sit at `wanted` (pixel rows, in any
/// order), moved as little as it takes so that no two are closer than `pitch` and all lie in
/// `low..=high`; `None` where they cannot all fit.
pub(crate) fn spread(wanted: &[i32], pitch: i32, (low, high): (i32, i32)) -> Option<Vec<i32>> {
    let n = wanted.len() as i32;
    if n == 0 {
        return Some(Vec::new());
    }
    if pitch * (n - 1) > high - low {
        return None;
    }
    let mut order: Vec<usize> = (0..wanted.len()).collect();
    order.sort_by_key(|&i| (wanted[i], i));
    // Top down, each at least a pitch below the one above; then bottom up, each at least a
    // pitch above the one below and inside the range; then top down again inside the range.
    let mut at: Vec<i32> = order.iter().map(|&i| wanted[i].clamp(low, high)).collect();
    for k in 1..at.len() {
        at[k] = at[k].max(at[k - 1] + pitch);
    }
    let last = at.len() - 1;
    at[last] = at[last].min(high);
    for k in (0..last).rev() {
        at[k] = at[k].min(at[k + 1] - pitch);
    }
    at[0] = at[0].max(low);
    for k in 1..at.len() {
        at[k] = at[k].max(at[k - 1] + pitch);
    }
    let mut placed = vec![0; wanted.len()];
    for (k, &i) in order.iter().enumerate() {
        placed[i] = at[k];
    }
    Some(placed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_are_plotters_own_and_cut_text_fits() {
        super::super::register_embedded_font().unwrap();
        for (words, size) in [("GPU 0 · NVIDIA H100 80GB HBM3", 12), ("layers 0–15", 10), ("AVA Wi1l", 17)]
        {
            let style = super::super::text(size);
            let ((x0, _), (x1, _)) = plotters_backend::BackendTextStyle::layout_box(&style, words).unwrap();
            assert_eq!(width(words, size), x1 - x0, "{words}");
        }
        let cut = fit("a long hardware profile name, longer than the room", 12, 120);
        assert!(cut.ends_with('…') && width(&cut, 12) <= 120, "{cut}");
        assert_eq!(fit("short", 12, 120), "short");
    }

    #[test]
    fn wrapping_keeps_separators_at_line_ends_and_cuts_the_last_line() {
        let lines = wrap("grid · a-model on a-profile · train, all parameters, batch 4 × 2048", 17, 260, 3);
        assert!(lines.len() >= 2 && lines.iter().all(|l| width(l, 17) <= 260), "{lines:?}");
        assert!(lines.iter().all(|l| !l.starts_with('·')), "{lines:?}");
        // The break after a separator, not inside the phrase that follows it.
        let at_separator = wrap("device map · a-model on a-long-profile-name · train, LoRA r16", 17, 420, 3);
        assert_eq!(at_separator[0], "device map · a-model on a-long-profile-name ·", "{at_separator:?}");
        let few = wrap("one two three four five six seven eight nine ten eleven twelve", 17, 100, 2);
        assert_eq!(few.len(), 2);
        assert!(few[1].ends_with('…'), "{few:?}");
        assert!(wrap("anything", 17, 100, 0).is_empty());
    }

    #[test]
    fn spread_labels_keep_their_pitch_inside_the_range() {
        let at = spread(&[100, 102, 104, 300], 12, (0, 400)).unwrap();
        let mut sorted = at.clone();
        sorted.sort();
        assert!(sorted.windows(2).all(|w| w[1] - w[0] >= 12), "{at:?}");
        assert_eq!(at[3], 300, "a label with room stays where it wants to be");
        let crowded = spread(&[395, 398, 399], 12, (0, 400)).unwrap();
        assert!(crowded.iter().all(|&y| y <= 400), "{crowded:?}");
        assert!(spread(&[0, 0, 0], 12, (0, 20)).is_none());
    }
}
