//! Text from input files made safe for a terminal. A name in a hardware profile or a custom
//! model, a price table's currency, a module path or a message that quotes what a file holds can
//! carry control characters; printed raw, an escape sequence (`ESC [ 31 m`) recolours, moves the
//! cursor or rewrites the screen, and a bidirectional override reorders what is shown. Every
//! table cell and everything the command line prints goes through [`terminal_safe`], and so do
//! the files it writes as text (SVG, Markdown and HTML, where XML and HTML allow no control
//! characters).

use std::borrow::Cow;
use std::fmt::Write;

/// `text` with each control character other than newline and tab, and each bidirectional
/// override or isolate (U+202A–U+202E, U+2066–U+2069), written as an escape: `\x1b` below
/// U+0080, `\u{9b}` above. Text without any is returned as it is.
pub fn terminal_safe(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut safe = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if !needs_escape(c) {
            safe.push(c);
        } else if u32::from(c) < 0x80 {
            let _ = write!(safe, "\\x{:02x}", u32::from(c));
        } else {
            let _ = write!(safe, "\\u{{{:x}}}", u32::from(c));
        }
    }
    Cow::Owned(safe)
}

/// Whether `c` changes what a terminal shows other than as a glyph.
fn needs_escape(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped_and_the_rest_kept() {
        assert_eq!(terminal_safe("\u{1b}[31mUSD"), "\\x1b[31mUSD");
        assert_eq!(terminal_safe("a\rb\u{7f}\u{9b}2J\u{202e}"), "a\\x0db\\x7f\\u{9b}2J\\u{202e}");
        assert_eq!(terminal_safe("€ per GPU-hour\n\tH100 «SXM»"), "€ per GPU-hour\n\tH100 «SXM»");
        assert!(matches!(terminal_safe("plain"), Cow::Borrowed("plain")));
    }
}
