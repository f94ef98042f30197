//! Hostile inputs (issue 32, "Must show"): a seeded property test that writes random malformed
//! files of every input kind (hardware YAML, workload YAML, device map, plan file, `--measured`,
//! `--prices`, `--expert-load`, a custom model, a model folder's `config.json` and safetensors
//! shard, a GGUF file) and random flag values, and runs each case through the real binary as a
//! process of its own (under a 4 GB address-space cap, killed after 15 s).
//!
//! The malformed files start from valid ones (written by the command line itself or kept in the
//! repository) and are truncated, emptied, given a duplicated key, a value of the wrong type, a
//! huge or negative number, a deeply nested value, a very long string, control characters,
//! flipped bytes or garbage, or replaced by a FIFO or a folder. Every case must end within the
//! limit, without a panic, with an exit code of 0 to 4, an exit 2 carrying an `error:` line and
//! its `fix:`, and no raw escape character on the terminal. Where the docs say an input is refused
//! (a FIFO or folder, `docs/limits.md`; a truncated or nested-past-the-parser JSON document; a
//! YAML key given twice, `docs/workloads.md`; an expert-load layer or a safetensors tensor given
//! twice; a flag past its documented bound), the case must be refused with exit 2.
//!
//! `VRAMPLAN_HOSTILE_CASES` sets the number of cases (default 300, a minute or two on two
//! cores) and `VRAMPLAN_HOSTILE_SEED` the seed; `ten_thousand_hostile_cases` (ignored by
//! default) runs 10,000. Case `i` draws from its own generator seeded with `seed + i`, so a failing
//! case is replayed alone with `VRAMPLAN_HOSTILE_SEED=seed+i VRAMPLAN_HOSTILE_CASES=1`.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use vramplan_tests::{Output, vramplan, vramplan_within};

/// The address-space cap of every case, in KiB (`ulimit -v`): 4 GB.
const CAP_KIB: u64 = 4_000_000;

/// The most one case may take.
const LIMIT: Duration = Duration::from_secs(15);

/// The seed when `VRAMPLAN_HOSTILE_SEED` is not set.
const DEFAULT_SEED: u64 = 0x5EED_0032;

/// SplitMix64 (Steele, Lea and Flood 2014): a small, well-mixed generator, enough to draw cases.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// One of `items`.
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// True one time in `n`.
    fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
}

/// The kinds of input file, each with the command lines that read it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Hardware,
    Workload,
    DeviceMap,
    Plan,
    Measured,
    Prices,
    ExpertLoad,
    Custom,
    Config,
    Shard,
    Gguf,
    /// Valid files, random flag values.
    Flags,
}

const KINDS: [Kind; 12] = [
    Kind::Hardware,
    Kind::Workload,
    Kind::DeviceMap,
    Kind::Plan,
    Kind::Measured,
    Kind::Prices,
    Kind::ExpertLoad,
    Kind::Custom,
    Kind::Config,
    Kind::Shard,
    Kind::Gguf,
    Kind::Flags,
];

impl Kind {
    /// Whether the file is JSON (else YAML, or binary for the shard and GGUF).
    fn json(self) -> bool {
        matches!(self, Kind::DeviceMap | Kind::Measured | Kind::ExpertLoad | Kind::Config)
    }

    fn yaml(self) -> bool {
        matches!(self, Kind::Hardware | Kind::Workload | Kind::Plan | Kind::Prices | Kind::Custom)
    }

    /// The file's name, its extension as the command line expects it.
    fn file_name(self) -> &'static str {
        match self {
            Kind::Hardware => "hw.yaml",
            Kind::Workload => "w.yaml",
            Kind::DeviceMap => "map.json",
            Kind::Plan => "plan.yaml",
            Kind::Measured => "run.json",
            Kind::Prices => "prices.yaml",
            Kind::ExpertLoad => "load.json",
            Kind::Custom => "custom.yaml",
            Kind::Config => "config.json",
            Kind::Shard => "model.safetensors",
            Kind::Gguf => "tiny.gguf",
            Kind::Flags => "unused",
        }
    }
}

/// The valid files every mutation starts from.
struct Bases {
    hardware: String,
    workload: String,
    device_map: String,
    plan: String,
    measured: String,
    prices: String,
    expert_load: String,
    custom: String,
    config: String,
    /// The safetensors header (JSON) of a small Llama-shaped checkpoint without a config.
    header: String,
    gguf: Vec<u8>,
}

/// A small Llama-shaped safetensors header: 2 layers of width 16, a vocabulary of 64, fp16.
fn safetensors_header() -> String {
    let mut tensors: Vec<(String, Vec<u64>)> = vec![("model.embed_tokens.weight".into(), vec![64, 16])];
    for layer in 0..2 {
        let p = format!("model.layers.{layer}");
        for proj in ["q_proj", "k_proj", "v_proj", "o_proj"] {
            tensors.push((format!("{p}.self_attn.{proj}.weight"), vec![16, 16]));
        }
        tensors.push((format!("{p}.mlp.gate_proj.weight"), vec![32, 16]));
        tensors.push((format!("{p}.mlp.up_proj.weight"), vec![32, 16]));
        tensors.push((format!("{p}.mlp.down_proj.weight"), vec![16, 32]));
        tensors.push((format!("{p}.input_layernorm.weight"), vec![16]));
        tensors.push((format!("{p}.post_attention_layernorm.weight"), vec![16]));
    }
    tensors.push(("model.norm.weight".into(), vec![16]));
    tensors.push(("lm_head.weight".into(), vec![64, 16]));
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut offset = 0u64;
    for (name, shape) in tensors {
        let bytes = 2 * shape.iter().product::<u64>();
        header.insert(
            name,
            serde_json::json!({"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    serde_json::to_string(&header).unwrap()
}

/// A safetensors file around `header`: its length, the header, and zeros for the data its
/// offsets name (as many as the base's, whatever the header now says).
fn safetensors_file(header: &[u8], data: usize) -> Vec<u8> {
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header);
    file.resize(file.len() + data, 0);
    file
}

/// The data bytes the base header's offsets cover.
fn base_data_len(header: &str) -> usize {
    let value: serde_json::Value = serde_json::from_str(header).unwrap();
    value.as_object().unwrap().values().filter_map(|t| t["data_offsets"][1].as_u64()).max().unwrap_or(0)
        as usize
}

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

impl Bases {
    /// Writes the plan and device map with the command line itself, and reads the rest from
    /// the repository.
    fn new(dir: &Path) -> Bases {
        let hardware = vramplan(&["profiles", "show", "2xt4"]);
        assert_eq!(hardware.code, 0, "{}", hardware.stderr);
        let plan_path = dir.join("base-plan.yaml").display().to_string();
        let map_path = dir.join("base-map.json").display().to_string();
        for path in [&plan_path, &map_path] {
            let out = vramplan(&["plan", "gpt2", "--hardware", "2xt4", "-o", path]);
            assert_eq!(out.code, 0, "{}", out.stderr);
        }
        let mut loads = serde_json::Map::new();
        for layer in 0..32u64 {
            let list: Vec<u64> = (0..8).map(|e| 100 + 10 * e + layer).collect();
            loads.insert(format!("model.layers.{layer}.mlp.experts"), serde_json::json!(list));
        }
        let device = |id: u32| {
            format!(
                r#"{{"device": {id}, "name": "Tesla T4", "allocated_bytes": 300000000, "reserved_bytes": 350000000,
                "driver_used_bytes": 800000000, "driver_used_before_bytes": 300000000, "peak_event": "x"}}"#
            )
        };
        let measured = format!(
            r#"{{"findings": [], "ok": true, "run": {{"backend": "cuda", "outcome": {{"kind": "completed"}},
            "samples": [], "placed": {{}}, "devices": [{}, {}]}}}}"#,
            device(0),
            device(1)
        );
        let read = |path: &str| std::fs::read_to_string(repo(path)).unwrap();
        Bases {
            hardware: hardware.stdout,
            workload: read("docs/examples/qlora.yaml"),
            device_map: std::fs::read_to_string(&map_path).unwrap(),
            plan: std::fs::read_to_string(&plan_path).unwrap(),
            measured,
            prices: read("profiles/catalog/hardware/prices.yaml"),
            expert_load: serde_json::to_string_pretty(&loads).unwrap(),
            custom: read("docs/examples/timeseries-transformer.yaml"),
            config: read("profiles/catalog/models/llama-3.2-1b.json"),
            header: safetensors_header(),
            gguf: std::fs::read(repo("fixtures/reference/gguf/tiny-llama-q4_k_m.gguf")).unwrap(),
        }
    }

    fn text(&self, kind: Kind) -> &str {
        match kind {
            Kind::Hardware => &self.hardware,
            Kind::Workload => &self.workload,
            Kind::DeviceMap => &self.device_map,
            Kind::Plan => &self.plan,
            Kind::Measured => &self.measured,
            Kind::Prices => &self.prices,
            Kind::ExpertLoad => &self.expert_load,
            Kind::Custom => &self.custom,
            Kind::Config => &self.config,
            Kind::Shard => &self.header,
            Kind::Gguf | Kind::Flags => "",
        }
    }
}

/// The command line that reads `kind`'s file at `path` (`dir` for its outputs).
fn command(kind: Kind, path: &str, dir: &Path, rng: &mut Rng) -> Vec<String> {
    let svg = dir.join("out.svg").display().to_string();
    let report = dir.join("report.md").display().to_string();
    let folder = dir.join("model").display().to_string();
    let list: Vec<&str> = match kind {
        Kind::Hardware => match rng.below(3) {
            0 => vec!["estimate", "gpt2", "--hardware", path],
            1 => vec!["plan", "gpt2", "--hardware", path],
            _ => vec!["profiles", "show", path],
        },
        Kind::Workload => match rng.below(2) {
            0 => vec!["estimate", "llama-3.2-1b", "--hardware", "2xt4", "--workload", path],
            _ => vec!["plan", "llama-3.2-1b", "--hardware", "2xt4", "--workload", path],
        },
        Kind::DeviceMap => match rng.below(2) {
            0 => vec!["check", path, "gpt2", "--hardware", "2xt4"],
            _ => vec!["estimate", "gpt2", "--hardware", "2xt4", "--device-map", path],
        },
        Kind::Plan => match rng.below(3) {
            0 => vec!["estimate", "gpt2", "--hardware", "2xt4", "--plan", path],
            1 => vec!["plot", "breakdown", "gpt2", "--hardware", "2xt4", "--plan", path, "-o", &svg],
            _ => vec!["report", "gpt2", "--hardware", "2xt4", "--plan", path, "-o", &report],
        },
        Kind::Measured => {
            vec!["plot", "breakdown", "gpt2", "--hardware", "2xt4", "--measured", path, "-o", &svg]
        }
        Kind::Prices => vec!["whatif", "cheapest", "gpt2", "--hardware", "t4,l4", "--prices", path],
        Kind::ExpertLoad => vec![
            "plan",
            "mixtral-8x7b",
            "--hardware",
            "a100-80gb-x4",
            "--target",
            "expert-parallel",
            "--expert-load",
            path,
        ],
        Kind::Custom => match rng.below(2) {
            0 => vec!["inspect", path],
            _ => vec!["estimate", path, "--hardware", "2xt4", "--mode", "train"],
        },
        Kind::Config | Kind::Shard => match rng.below(2) {
            0 => vec!["inspect", &folder],
            _ => vec!["estimate", &folder, "--hardware", "2xt4", "--seq", "128"],
        },
        Kind::Gguf => vec!["inspect", path],
        Kind::Flags => unreachable!("flag cases build their own command"),
    };
    list.into_iter().map(String::from).collect()
}

/// One drawn case: the command line, what was done, and whether the docs say it is refused.
struct Case {
    args: Vec<String>,
    what: String,
    refused: bool,
}

/// A flag, the commands that take it, and its values, each with whether the docs refuse it
/// (`docs/limits.md`, `docs/workloads.md`, the flag's `--help`).
type FlagValues = (&'static str, bool, &'static [(&'static str, bool)]);

/// `(flag, plan only, values)`.
const FLAGS: &[FlagValues] = &[
    (
        "--batch",
        false,
        &[
            ("1", false),
            ("8", false),
            ("1048576", false),
            ("1048577", true),
            ("-1", true),
            ("18446744073709551615", true),
            ("1e3", true),
            ("abc", true),
            ("", true),
        ],
    ),
    (
        "--seq",
        false,
        &[
            ("1", false),
            ("128", false),
            ("1024", false),
            ("16777216", false),
            ("16777217", true),
            ("-5", true),
            ("99999999999999999999", true),
            ("x", true),
        ],
    ),
    ("--mode", false, &[("train", false), ("inference", false), ("eval", true)]),
    (
        "--quant",
        false,
        &[
            ("none", false),
            ("nf4", false),
            ("int8", false),
            ("Q4_K_M", false),
            ("Q99_K", true),
            ("nf5", true),
        ],
    ),
    (
        "--parallel",
        false,
        &[
            ("single", false),
            ("ddp", false),
            ("zero3", false),
            ("tp=2", false),
            ("tp=2,pp=2", false),
            ("tp=0", true),
            ("zero9", true),
            ("tp=18446744073709551616", true),
        ],
    ),
    (
        "--engine",
        false,
        &[
            ("transformers", false),
            ("vllm", false),
            ("sglang", false),
            ("llama.cpp", false),
            ("tensorrt", true),
        ],
    ),
    (
        "--gpu-memory-utilization",
        false,
        &[("0.9", false), ("1", false), ("0", true), ("1.5", true), ("-0.1", true), ("NaN", true)],
    ),
    ("--kv-dtype", false, &[("fp8", false), ("bf16", false), ("int3", true)]),
    ("--grad-accum", false, &[("1", false), ("4", false), ("1048577", true), ("-2", true)]),
    (
        "--headroom",
        true,
        &[
            ("0", false),
            ("10%", false),
            ("0.1", false),
            ("90%", false),
            ("91%", true),
            ("2", true),
            ("-1%", true),
            ("NaN", true),
            ("inf", true),
            ("1e308", true),
        ],
    ),
    (
        "--pin",
        true,
        &[
            ("lm_head=0", false),
            ("lm_head=1", false),
            ("transformer.h.0-3=cpu", false),
            ("lm_head=99", true),
            ("nope=0", true),
            ("=0", true),
            ("lm_head=", true),
            ("transformer.h.0-99999999999999999999=0", true),
        ],
    ),
    ("--time-limit", true, &[("1", false), ("60", false), ("-1", true), ("NaN", true)]),
    ("--gap", true, &[("1%", false), ("0", false), ("0.5", false), ("-1", true), ("NaN", true)]),
];

/// Valid files, one to four random flags.
fn flag_case(rng: &mut Rng) -> Case {
    let plan = rng.one_in(2);
    let mut args: Vec<String> =
        [if plan { "plan" } else { "estimate" }, "gpt2", "--hardware", "2xt4"].map(String::from).to_vec();
    let mut refused = false;
    let mut used = Vec::new();
    for _ in 0..1 + rng.below(4) {
        let (flag, plan_only, values) = *rng.pick(FLAGS);
        if (plan_only && !plan) || used.contains(&flag) {
            continue;
        }
        used.push(flag);
        let (value, bad) = *rng.pick(values);
        refused |= bad;
        args.push(flag.to_string());
        args.push(value.to_string());
    }
    Case { what: format!("flags {}", args[4..].join(" ")), args, refused }
}

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
enum Made {
    Bytes(Vec<u8>, String, bool),
    Fifo,
    Folder,
}

/// A random malformed file of a text kind.
fn mutate_text(kind: Kind, base: &str, rng: &mut Rng) -> Made {
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
            let text = if json && rng.one_in(2) {
                json_rename(base, rng, &with)
            } else if json {
                json_replace(base, rng, &with)
            } else {
                yaml_replace(base, rng, &with)
            };
            (text, format!("string of {len}"), false)
        }
        7 => {
            let with = control(rng, json);
            let text = if json && rng.one_in(2) {
                json_rename(base, rng, &with)
            } else if json {
                json_replace(base, rng, &with)
            } else {
                yaml_replace(base, rng, &with)
            };
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
fn mutate_gguf(base: &[u8], rng: &mut Rng) -> Made {
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
fn mutate_shard(header: &str, rng: &mut Rng) -> Made {
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

/// Draws case `index` and writes its files under `dir`.
fn draw(index: u64, seed: u64, bases: &Bases, dir: &Path) -> Case {
    let mut rng = Rng(seed.wrapping_add(index));
    let kind = *rng.pick(&KINDS);
    if kind == Kind::Flags {
        return flag_case(&mut rng);
    }
    let made = match kind {
        Kind::Gguf => mutate_gguf(&bases.gguf, &mut rng),
        Kind::Shard => mutate_shard(&bases.header, &mut rng),
        _ => mutate_text(kind, bases.text(kind), &mut rng),
    };
    let holder =
        if matches!(kind, Kind::Config | Kind::Shard) { dir.join("model") } else { dir.to_path_buf() };
    std::fs::create_dir_all(&holder).unwrap();
    let path = holder.join(kind.file_name());
    let (what, refused) = match made {
        Made::Bytes(bytes, what, refused) => {
            std::fs::write(&path, bytes).unwrap();
            (what, refused)
        }
        Made::Fifo => {
            let status = std::process::Command::new("mkfifo").arg(&path).status().expect("run mkfifo");
            assert!(status.success());
            ("FIFO".into(), true)
        }
        Made::Folder => {
            std::fs::create_dir(&path).unwrap();
            ("folder".into(), true)
        }
    };
    let args = command(kind, &path.display().to_string(), dir, &mut rng);
    Case { args, what: format!("{kind:?}: {what}"), refused }
}

/// `vramplan ARGS…` under the address-space cap, killed after [`LIMIT`].
fn run_capped(args: &[String]) -> Option<Output> {
    let mut line: Vec<String> = vec![
        "-c".into(),
        format!("ulimit -v {CAP_KIB} && exec \"$0\" \"$@\""),
        env!("CARGO_BIN_EXE_vramplan-under-test").into(),
    ];
    line.extend(args.iter().cloned());
    vramplan_within("sh", &line, LIMIT)
}

/// The counts over a run.
#[derive(Default, Debug)]
struct Tally {
    cases: usize,
    by_code: [usize; 5],
    panics: usize,
    hangs: usize,
    other_codes: usize,
    exit_2_without_fix: usize,
    refused_cases: usize,
    exit_0_on_refused: usize,
    not_refused: usize,
    raw_escapes: usize,
    failing: usize,
    failures: Vec<String>,
    /// The longest case, and which.
    slowest: (Duration, u64),
}

/// Checks one case's outcome, counting it in `tally`.
fn judge(case: &Case, index: u64, seed: u64, out: Option<Output>, tally: &mut Tally) {
    tally.cases += 1;
    tally.refused_cases += case.refused as usize;
    let replay = format!(
        "case {index} (seed {}) {}: vramplan {}",
        seed.wrapping_add(index),
        case.what,
        case.args.join(" ")
    );
    let fail = |tally: &mut Tally, problem: String| {
        tally.failing += 1;
        if tally.failures.len() < 200 {
            tally.failures.push(format!("{replay}\n  {problem}"));
        }
    };
    let Some(out) = out else {
        tally.hangs += 1;
        return fail(tally, format!("still running after {LIMIT:?}"));
    };
    let tail = |s: &str| s.chars().rev().take(600).collect::<Vec<_>>().into_iter().rev().collect::<String>();
    if out.code == 101 || out.stderr.contains("panicked") {
        tally.panics += 1;
        return fail(tally, format!("panicked (exit {}):\n{}", out.code, tail(&out.stderr)));
    }
    if !(0..=4).contains(&out.code) {
        tally.other_codes += 1;
        return fail(
            tally,
            format!("exit {} (killed by a signal when -1):\n{}", out.code, tail(&out.stderr)),
        );
    }
    tally.by_code[out.code as usize] += 1;
    // A usage error clap finds (an unknown flag, a value that does not parse) ends with its own
    // pointer to the fix, `try '--help'`; the rest with a `fix:` line.
    let fix = out.stderr.contains("fix:") || out.stderr.contains("For more information, try '--help'");
    if out.code == 2 && !(out.stderr.contains("error:") && fix) {
        tally.exit_2_without_fix += 1;
        fail(tally, format!("exit 2 without `error:` and `fix:`:\n{}", tail(&out.stderr)));
    }
    if out.stdout.contains('\x1b') || out.stderr.contains('\x1b') {
        tally.raw_escapes += 1;
        fail(tally, "a raw escape character reached the terminal".into());
    }
    if case.refused && out.code != 2 {
        if out.code == 0 {
            tally.exit_0_on_refused += 1;
        } else {
            tally.not_refused += 1;
        }
        fail(tally, format!("the docs refuse this input, but exit {}:\n{}", out.code, tail(&out.stderr)));
    }
}

/// Runs `cases` cases from `seed` over a few worker threads, and returns the tally.
fn run_cases(cases: u64, seed: u64) -> (Tally, Duration) {
    let root = tempfile::tempdir().unwrap();
    let bases = Bases::new(root.path());
    let next = AtomicUsize::new(0);
    let tally = Mutex::new(Tally::default());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, 4);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed) as u64;
                    if index >= cases {
                        break;
                    }
                    let dir = root.path().join(format!("case-{index}"));
                    std::fs::create_dir_all(&dir).unwrap();
                    let case = draw(index, seed, &bases, &dir);
                    let started = Instant::now();
                    let out = run_capped(&case.args);
                    let took = started.elapsed();
                    let _ = std::fs::remove_dir_all(&dir);
                    let mut tally = tally.lock().unwrap();
                    tally.slowest = tally.slowest.max((took, index));
                    judge(&case, index, seed, out, &mut tally);
                }
            });
        }
    });
    (tally.into_inner().unwrap(), started.elapsed())
}

/// Runs the cases and asserts none failed, printing the counts.
fn assert_hostile_cases_hold(cases: u64) {
    let seed =
        std::env::var("VRAMPLAN_HOSTILE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(DEFAULT_SEED);
    let (tally, took) = run_cases(cases, seed);
    println!(
        "hostile inputs: {} cases from seed {seed} in {:.1} s: exit 0/1/2/3/4 {:?}; {} panics, {} hangs, \
         {} other exit codes, {} exits 2 without a fix, {} raw escapes; {} inputs the docs refuse: \
         {} exits 0, {} other exits; slowest case {} in {:.2} s",
        tally.cases,
        took.as_secs_f64(),
        tally.by_code,
        tally.panics,
        tally.hangs,
        tally.other_codes,
        tally.exit_2_without_fix,
        tally.raw_escapes,
        tally.refused_cases,
        tally.exit_0_on_refused,
        tally.not_refused,
        tally.slowest.1,
        tally.slowest.0.as_secs_f64(),
    );
    assert_eq!(tally.cases as u64, cases);
    assert!(
        tally.failures.is_empty(),
        "{} failing cases (first 200):\n{}",
        tally.failing,
        tally.failures.join("\n")
    );
    // The mix reaches every outcome: refusals, and cases that still plan.
    assert!(tally.by_code[2] > 0 && (cases < 100 || tally.by_code[0] > 0), "{:?}", tally.by_code);
}

/// The cases `VRAMPLAN_HOSTILE_CASES` asks for, 300 by default.
#[test]
fn hostile_inputs_end_without_panic_and_refuse_what_the_docs_refuse() {
    let cases = std::env::var("VRAMPLAN_HOSTILE_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    assert_hostile_cases_hold(cases);
}

/// The issue's seeded run of 10,000 cases (`cargo test -p vramplan-tests --test hostile_inputs
/// -- --ignored`).
#[test]
#[ignore = "10,000 cases: run on demand"]
fn ten_thousand_hostile_cases() {
    assert_hostile_cases_hold(10_000);
}

/// Every base file is accepted as it is (exit 0), so each mutation starts from a valid input and
/// what it breaks is the mutation's.
#[test]
fn the_unmutated_bases_are_accepted() {
    let root = tempfile::tempdir().unwrap();
    let bases = Bases::new(root.path());
    let mut rng = Rng(1);
    for kind in KINDS.into_iter().filter(|k| *k != Kind::Flags) {
        for _ in 0..2 {
            let dir = root.path().join(format!("{kind:?}"));
            let _ = std::fs::remove_dir_all(&dir);
            let holder =
                if matches!(kind, Kind::Config | Kind::Shard) { dir.join("model") } else { dir.clone() };
            std::fs::create_dir_all(&holder).unwrap();
            let path = holder.join(kind.file_name());
            let bytes = match kind {
                Kind::Gguf => bases.gguf.clone(),
                Kind::Shard => safetensors_file(bases.header.as_bytes(), base_data_len(&bases.header)),
                _ => bases.text(kind).as_bytes().to_vec(),
            };
            std::fs::write(&path, bytes).unwrap();
            let args = command(kind, &path.display().to_string(), &dir, &mut rng);
            let out = run_capped(&args).unwrap_or_else(|| panic!("{kind:?}: still running"));
            assert_eq!(out.code, 0, "{kind:?}: vramplan {}\n{}", args.join(" "), out.stderr);
        }
    }
}

/// The generator is SplitMix64: its first outputs from seed 0 are the published ones (the
/// reference implementation's `next()` from `x = 0`).
#[test]
fn the_generator_is_splitmix64() {
    let mut rng = Rng(0);
    assert_eq!(rng.next(), 0xE220_A839_7B1D_CDAF);
    assert_eq!(rng.next(), 0x6E78_9E6A_A1B9_65F4);
}

/// Regression (found by the cases above): a `config.json` that is not JSON, not an object or
/// holds a value of the wrong type, a safetensors header entry that is malformed and an index
/// that is not an object were refused with exit 2 but without a fix.
#[test]
fn malformed_model_files_are_refused_with_a_fix() {
    let dir = tempfile::tempdir().unwrap();
    let config = std::fs::read_to_string(repo("profiles/catalog/models/llama-3.2-1b.json")).unwrap();
    let typed = config.replacen("\"tie_word_embeddings\": true", "\"tie_word_embeddings\": 1.5", 1);
    assert_ne!(typed, config, "the base config names tie_word_embeddings");
    for (name, text, says) in [
        ("empty", String::new(), "malformed JSON"),
        ("list", "[1]".to_string(), "expected a JSON object"),
        ("huge", config.replacen("\"hidden_size\": 2048", "\"hidden_size\": 1e400", 1), "malformed JSON"),
        ("typed", typed, "tie_word_embeddings"),
    ] {
        let folder = dir.path().join(name);
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("config.json"), text).unwrap();
        let out = vramplan(&["inspect", &folder.display().to_string()]);
        vramplan_tests::assert_refused(&out, &["config.json", says]);
    }
    let header = safetensors_header().replacen("\"shape\":[16]", "\"shape\":[-1]", 1);
    let folder = dir.path().join("shard");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join("model.safetensors"),
        safetensors_file(header.as_bytes(), base_data_len(&header)),
    )
    .unwrap();
    let out = vramplan(&["inspect", &folder.display().to_string()]);
    vramplan_tests::assert_refused(&out, &["model.safetensors", "`shape` must be a list"]);
    let folder = dir.path().join("index");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(folder.join("config.json"), &config).unwrap();
    std::fs::write(folder.join("model.safetensors.index.json"), "[]").unwrap();
    let out = vramplan(&["inspect", &folder.display().to_string()]);
    vramplan_tests::assert_refused(&out, &["model.safetensors.index.json", "expected a JSON object"]);
}

/// Regression (found by the 10,000-case run): a custom model's size that is not positive
/// (`intermediate_size: 0`, or -2⁶³) was refused with its line but without a fix.
#[test]
fn a_custom_size_that_is_not_positive_is_refused_with_a_fix() {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::read_to_string(repo("docs/examples/timeseries-transformer.yaml")).unwrap();
    for value in ["0", "-9223372036854775808"] {
        let text = base.replacen("intermediate_size: 512", &format!("intermediate_size: {value}"), 1);
        assert_ne!(text, base, "the example names intermediate_size");
        let path = vramplan_tests::write(dir.path(), "custom.yaml", text);
        let out = vramplan(&["inspect", &path]);
        vramplan_tests::assert_refused(
            &out,
            &["custom.yaml:", "`intermediate_size` must be a positive integer"],
        );
    }
}
