//! The mutations of the hostile-input property test: each turns a valid file of one kind into a
//! malformed one (cut short, emptied, a key twice, a value of the wrong type, a huge or negative
//! number, deep nesting, a long string, control characters, flipped bits, garbage, an alias bomb,
//! a FIFO or a folder) and says whether the docs refuse the result.

use super::{Kind, Rng, base_data_len, safetensors_file};

/// Raw replacements for a value, by what they break.
const WRONG_TYPES_YAML: &[&str] =
    &["[1, 2]", "{a: 1}", "\"text\"", "true", "null", "~", "\"\"", "3.5", "!!binary aGVsbG8=", "*nowhere"];
const WRONG_TYPES_JSON: &[&str] =
    &["[1, 2]", "{\"a\": 1}", "\"text\"", "true", "null", "\"\"", "3.5", "{}", "[]"];
const HUGE: &[&str] = &[
    "18446744073709551615",
    "18446744073709551616",
    "340282366920938463463374607431768211456",
    "4294967296",
    "1e308",
    "-1e308",
    "1e400",
    "-1",
    "-9223372036854775808",
    "0",
    "-0.0",
];
const HUGE_YAML: &[&str] =
    &[".nan", ".inf", "-.inf", "99999999999999999999PiB", "1e30GB", "-5GiB", "0x7fffffffffffffff"];

/// A value nested `depth` lists deep.
fn nested(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

/// A quoted string with control characters: escaped (`\e`, `\u001b`) or raw.
fn control(rng: &mut Rng, json: bool) -> String {
    let raw = ["\x1b[2J\x1b[31mred", "bell\x07", "nul\0byte", "cr\rback", "del\x7f", "\u{9b}31m"];
    let escaped_json = ["\\u001b[2J\\u001b[31mred", "bell\\u0007", "nul\\u0000", "\\u009b31m"];
    let escaped_yaml = ["\\e[2J\\e[31mred", "bell\\a", "nul\\0", "\\x9b31m"];
    if rng.one_in(2) {
        format!("\"{}\"", rng.pick(&raw))
    } else if json {
        format!("\"{}\"", rng.pick(&escaped_json))
    } else {
        format!("\"{}\"", rng.pick(&escaped_yaml))
    }
}

/// The YAML lines `key: value` whose value can be replaced: `(line, byte where the value starts)`.
fn yaml_values(text: &str) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let body = line.trim_start().trim_start_matches("- ");
        if body.starts_with('#') {
            continue;
        }
        let Some(colon) = body.find(": ") else { continue };
        let key = &body[..colon];
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') {
            continue;
        }
        let value = body[colon + 2..].trim();
        if value.is_empty() || value.starts_with('#') {
            continue;
        }
        found.push((i, line.len() - body.len() + colon + 2));
    }
    found
}

/// `text` with the value of one random `key: value` line replaced by `with`.
fn yaml_replace(text: &str, rng: &mut Rng, with: &str) -> String {
    let spots = yaml_values(text);
    if spots.is_empty() {
        return format!("{text}\nvalue: {with}\n");
    }
    let (line, at) = *rng.pick(&spots);
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    lines[line] = format!("{}{with}", &lines[line][..at]);
    lines.join("\n") + "\n"
}

/// `text` with one top-level key's line (`key:` and what follows on the line) given again at the
/// end: a mapping key twice.
fn yaml_duplicate(text: &str, rng: &mut Rng) -> Option<String> {
    let tops: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with([' ', '#', '-', '\t']) && l.contains(':') && !l.trim().is_empty())
        .collect();
    if tops.is_empty() {
        return None;
    }
    let line = rng.pick(&tops);
    Some(format!("{}\n{line}\n", text.trim_end()))
}

/// An exponential blow-up of YAML aliases ("billion laughs") under unknown top-level keys.
fn yaml_alias_bomb(text: &str, rng: &mut Rng) -> String {
    let levels = 4 + rng.below(8);
    let mut bomb =
        String::from("lol0: &a0 [\"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\"]\n");
    for i in 1..levels {
        let refs = vec![format!("*a{}", i - 1); 8].join(", ");
        bomb.push_str(&format!("lol{i}: &a{i} [{refs}]\n"));
    }
    format!("{bomb}{text}")
}

/// Every path (JSON pointer) of `value`'s nodes below the root.
fn json_paths(value: &serde_json::Value, at: String, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, child) in map {
                let path = format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"));
                out.push(path.clone());
                json_paths(child, path, out);
            }
        }
        serde_json::Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                let path = format!("{at}/{i}");
                out.push(path.clone());
                json_paths(child, path, out);
            }
        }
        _ => {}
    }
}

/// `text` (JSON) with one random node replaced by the raw text `with`.
fn json_replace(text: &str, rng: &mut Rng, with: &str) -> String {
    const MARK: &str = "@@hostile@@";
    let mut value: serde_json::Value = serde_json::from_str(text).unwrap();
    let mut paths = Vec::new();
    json_paths(&value, String::new(), &mut paths);
    if paths.is_empty() {
        return with.to_string();
    }
    let path = rng.pick(&paths).clone();
    *value.pointer_mut(&path).unwrap() = serde_json::Value::String(MARK.into());
    serde_json::to_string_pretty(&value).unwrap().replacen(&format!("\"{MARK}\""), with, 1)
}

/// `text` (a JSON object) with one random key renamed to `key` (a JSON string, quoted).
fn json_rename(text: &str, rng: &mut Rng, key: &str) -> String {
    let value: serde_json::Value = serde_json::from_str(text).unwrap();
    let map = value.as_object().unwrap();
    let victim = rng.below(map.len().max(1));
    let entries: Vec<String> = map
        .iter()
        .enumerate()
        .map(|(i, (k, v))| {
            let name = if i == victim { key.to_string() } else { serde_json::to_string(k).unwrap() };
            format!("{name}: {}", serde_json::to_string(v).unwrap())
        })
        .collect();
    format!("{{{}}}", entries.join(",\n"))
}

/// `text` (a JSON object) with one top-level entry written twice.
fn json_duplicate(text: &str, rng: &mut Rng) -> String {
    let value: serde_json::Value = serde_json::from_str(text).unwrap();
    let mut entries: Vec<String> = value
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| format!("{}: {}", serde_json::to_string(k).unwrap(), serde_json::to_string(v).unwrap()))
        .collect();
    let copy = entries[rng.below(entries.len())].clone();
    let at = rng.below(entries.len() + 1);
    entries.insert(at, copy);
    format!("{{{}}}", entries.join(",\n"))
}

/// The largest char boundary of `text` at or below `at`.
fn floor_boundary(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// What a mutation made: the file's bytes (or a FIFO or folder), what it was, whether refused.
pub(crate) enum Made {
    Bytes(Vec<u8>, String, bool),
    Fifo,
    Folder,
}

/// A random malformed file of a text kind.
pub(crate) fn mutate_text(kind: Kind, base: &str, rng: &mut Rng) -> Made {
    let json = kind.json() || kind == Kind::Shard;
    let yaml = kind.yaml();
    // The docs refuse a key twice in every YAML file (the parser refuses it), in an expert-load
    // file (docs/workloads.md) and in a safetensors header.
    let duplicate_refused = yaml || matches!(kind, Kind::ExpertLoad | Kind::Shard);
    let (text, what, refused): (String, String, bool) = match rng.below(12) {
        0 => {
            let trimmed = base.trim_end();
            let at = floor_boundary(trimmed, rng.below(trimmed.len()));
            // A JSON document cut short is never whole: its outermost bracket is not closed.
            (trimmed[..at].to_string(), format!("truncated at {at}"), json)
        }
        1 => (String::new(), "empty".into(), json || kind == Kind::Custom),
        2 => {
            if json {
                (json_duplicate(base, rng), "duplicated key".into(), duplicate_refused)
            } else {
                match yaml_duplicate(base, rng) {
                    Some(text) => (text, "duplicated key".into(), duplicate_refused),
                    None => (base.to_string(), "unchanged".into(), false),
                }
            }
        }
        3 => {
            let with = if json { *rng.pick(WRONG_TYPES_JSON) } else { *rng.pick(WRONG_TYPES_YAML) };
            let text = if json { json_replace(base, rng, with) } else { yaml_replace(base, rng, with) };
            (text, format!("wrong type {with}"), false)
        }
        4 => {
            let with = if yaml && rng.one_in(3) { *rng.pick(HUGE_YAML) } else { *rng.pick(HUGE) };
            let text = if json { json_replace(base, rng, with) } else { yaml_replace(base, rng, with) };
            (text, format!("number {with}"), false)
        }
        5 => {
            let depth = [200, 1_000, 10_000, 100_000][rng.below(4)];
            let with = nested(depth);
            let text = if json { json_replace(base, rng, &with) } else { yaml_replace(base, rng, &with) };
            // serde_json refuses a document nested past 128 levels.
            (text, format!("nested {depth} deep"), json)
        }
        6 => {
            let len = [1_000, 70_000, 300_000][rng.below(3)];
            let with = format!("\"{}\"", "a".repeat(len));
            let text = rename_or_replace(base, rng, &with, json);
            (text, format!("string of {len}"), false)
        }
        7 => {
            let with = control(rng, json);
            let text = rename_or_replace(base, rng, &with, json);
            (text, format!("control characters {with:?}"), false)
        }
        8 => {
            let mut bytes = base.as_bytes().to_vec();
            let flips = 1 + rng.below(8);
            for _ in 0..flips {
                let at = rng.below(bytes.len());
                bytes[at] ^= 1 << rng.below(8);
            }
            return Made::Bytes(bytes, format!("{flips} bits flipped"), false);
        }
        9 => {
            // Not UTF-8 from the first byte: no JSON, YAML or GGUF reads it.
            let mut bytes = vec![0xFF, 0xFE];
            for _ in 0..rng.below(4096) {
                bytes.push(rng.next() as u8);
            }
            return Made::Bytes(bytes, "garbage".into(), true);
        }
        10 => {
            if yaml {
                (
                    yaml_alias_bomb(base, rng),
                    "alias bomb".into(),
                    matches!(kind, Kind::Hardware | Kind::Workload),
                )
            } else {
                let with = if rng.one_in(2) { "NaN" } else { "Infinity" };
                (json_replace(base, rng, with), format!("bare {with}"), true)
            }
        }
        _ => return if rng.one_in(2) { Made::Fifo } else { Made::Folder },
    };
    Made::Bytes(text.into_bytes(), what, refused)
}

/// A random malformed GGUF file: cut short, bits flipped, a count or length made huge.
pub(crate) fn mutate_gguf(base: &[u8], rng: &mut Rng) -> Made {
    let mut bytes = base.to_vec();
    match rng.below(5) {
        0 => {
            let within = if rng.one_in(2) { 4096 } else { bytes.len() };
            let at = rng.below(within);
            bytes.truncate(at);
            // Cut within the first 24 bytes (magic, version, the two counts) it is no GGUF.
            Made::Bytes(bytes, format!("truncated at {at}"), at < 24)
        }
        1 => {
            let flips = 1 + rng.below(8);
            for _ in 0..flips {
                let at = rng.below(4096.min(bytes.len()));
                bytes[at] ^= 1 << rng.below(8);
            }
            Made::Bytes(bytes, format!("{flips} bits flipped"), false)
        }
        2 => {
            // The tensor count (offset 8) or the metadata count (offset 16) past what the file
            // can hold.
            let at = *rng.pick(&[8usize, 16]);
            let value = *rng.pick(&[u64::MAX, 1 << 63, 1 << 40]);
            bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
            Made::Bytes(bytes, format!("count at {at} = {value}"), true)
        }
        3 => {
            let at = 24 + 8 * rng.below(500);
            let value = *rng.pick(&[u64::MAX, 1 << 62, 0xFFFF_FFFF]);
            bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
            Made::Bytes(bytes, format!("u64 at {at} = {value}"), false)
        }
        _ => {
            if rng.one_in(2) {
                Made::Fifo
            } else {
                Made::Bytes(Vec::new(), "empty".into(), true)
            }
        }
    }
}

/// A random malformed safetensors file: a malformed header, or a wrong length before it.
pub(crate) fn mutate_shard(header: &str, rng: &mut Rng) -> Made {
    let data = base_data_len(header);
    if rng.one_in(4) {
        let mut file = safetensors_file(header.as_bytes(), data);
        return match rng.below(4) {
            0 => {
                let value = *rng.pick(&[u64::MAX, 1 << 40, file.len() as u64, 0]);
                file[..8].copy_from_slice(&value.to_le_bytes());
                Made::Bytes(file, format!("header length {value}"), true)
            }
            1 => {
                let at = rng.below(8 + header.len());
                file.truncate(at);
                Made::Bytes(file, format!("file cut at {at}"), true)
            }
            2 => Made::Bytes(Vec::new(), "empty".into(), true),
            _ => Made::Fifo,
        };
    }
    match mutate_text(Kind::Shard, header, rng) {
        Made::Bytes(text, what, refused) => {
            // Garbage and empty headers stay refused inside a well-formed length prefix.
            Made::Bytes(safetensors_file(&text, data), format!("header {what}"), refused)
        }
        other => other,
    }
}

/// `with` written in place of a key (JSON only, half the time) or of a value of `base`.
fn rename_or_replace(base: &str, rng: &mut Rng, with: &str, json: bool) -> String {
    if json && rng.one_in(2) {
        json_rename(base, rng, with)
    } else if json {
        json_replace(base, rng, with)
    } else {
        yaml_replace(base, rng, with)
    }
}
