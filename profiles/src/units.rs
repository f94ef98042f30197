//! Byte sizes: parsing with explicit units and printing in binary units.
//!
//! Convention (DESIGN.md): `16GB` is 16·10⁹ bytes, `16GiB` and `15360MiB` are powers of two. A
//! bare number is refused where a size is expected, because "16" could mean bytes, GB or GiB.

/// Parses a size with a unit: `B`, `kB`/`KB`, `MB`, `GB`, `TB` (powers of 10) or `KiB`, `MiB`,
/// `GiB`, `TiB` (powers of 2). Decimals are allowed (`1.5GiB`); the result is rounded to a byte.
/// The error says what was expected.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+' || c == '_'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let number = number.replace('_', "");
    let unit = unit.trim();
    if number.is_empty() {
        return Err(format!("expected a size such as `15360MiB` or `16GB`, found `{text}`"));
    }
    let value: f64 = number
        .parse()
        .map_err(|_| format!("expected a number before the unit, found `{number}` in `{text}`"))?;
    if value < 0.0 || !value.is_finite() {
        return Err(format!("a size cannot be negative: `{text}`"));
    }
    let scale: f64 = match unit {
        "" => {
            return Err(format!(
                "`{text}` has no unit; write e.g. `{number}MiB`, `{number}GiB` or `{number}GB`"
            ));
        }
        "B" => 1.0,
        "kB" | "KB" | "k" => 1e3,
        "MB" | "M" => 1e6,
        "GB" | "G" => 1e9,
        "TB" | "T" => 1e12,
        "KiB" | "Ki" => 1024.0,
        "MiB" | "Mi" => 1024.0 * 1024.0,
        "GiB" | "Gi" => 1024.0 * 1024.0 * 1024.0,
        "TiB" | "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "unknown unit `{other}` in `{text}`; use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB"
            ));
        }
    };
    let bytes = (value * scale).round();
    if bytes > u64::MAX as f64 {
        return Err(format!("`{text}` is too large"));
    }
    Ok(bytes as u64)
}

/// Prints a byte count in binary units with two decimals (`15.00 GiB`, `512 B`).
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

/// Prints a size exactly, in the largest binary unit that divides it (`15360MiB` → `15GiB`,
/// `16106127360` → `15GiB`), for files that must load back to the same byte count.
pub fn format_bytes_exact(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (name, size) in UNITS {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{}{name}", bytes / size);
        }
    }
    format!("{bytes}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_and_binary_units_follow_the_convention() {
        assert_eq!(parse_bytes("16GB"), Ok(16_000_000_000));
        assert_eq!(parse_bytes("16GiB"), Ok(17_179_869_184));
        assert_eq!(parse_bytes("15360MiB"), Ok(15_360 * 1_048_576));
        assert_eq!(parse_bytes("1.5 GiB"), Ok(1_610_612_736));
        assert_eq!(parse_bytes("512B"), Ok(512));
    }

    #[test]
    fn unitless_negative_and_unknown_are_refused_with_the_fix() {
        assert!(parse_bytes("16").unwrap_err().contains("no unit"));
        assert!(parse_bytes("-4GiB").unwrap_err().contains("negative"));
        assert!(parse_bytes("4 gigs").unwrap_err().contains("unknown unit"));
        assert!(parse_bytes("GiB").is_err());
    }

    #[test]
    fn printing_uses_binary_units() {
        assert_eq!(format_bytes(15_360 * 1_048_576), "15.00 GiB");
        assert_eq!(format_bytes(1000), "1000 B");
        assert_eq!(format_bytes_exact(15_360 * 1_048_576), "15GiB");
        assert_eq!(format_bytes_exact(24_564 * 1_048_576), "24564MiB");
        assert_eq!(format_bytes_exact(1000), "1000B");
    }
}
