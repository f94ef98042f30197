//! The cases of the hostile-input property test (`hostile_inputs.rs`): the seeded generator,
//! the input kinds with the valid files each mutation starts from (written by the command line
//! itself or kept in the repository), the command lines that read each kind, the flag values, and
//! the drawing of one case. The mutations themselves are in `mutate.rs`.

mod mutate;

use mutate::{Made, mutate_gguf, mutate_shard, mutate_text};
use std::path::{Path, PathBuf};
use vramplan_tests::vramplan;

/// SplitMix64 (Steele, Lea and Flood 2014): a small, well-mixed generator, enough to draw cases.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// One of `items`.
    pub(crate) fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// True one time in `n`.
    pub(crate) fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
}

/// The kinds of input file, each with the command lines that read it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Kind {
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

pub(crate) const KINDS: [Kind; 12] = [
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
    pub(crate) fn json(self) -> bool {
        matches!(self, Kind::DeviceMap | Kind::Measured | Kind::ExpertLoad | Kind::Config)
    }

    pub(crate) fn yaml(self) -> bool {
        matches!(self, Kind::Hardware | Kind::Workload | Kind::Plan | Kind::Prices | Kind::Custom)
    }

    /// The file's name, its extension as the command line expects it.
    pub(crate) fn file_name(self) -> &'static str {
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
pub(crate) struct Bases {
    pub(crate) hardware: String,
    pub(crate) workload: String,
    pub(crate) device_map: String,
    pub(crate) plan: String,
    pub(crate) measured: String,
    pub(crate) prices: String,
    pub(crate) expert_load: String,
    pub(crate) custom: String,
    pub(crate) config: String,
    /// The safetensors header (JSON) of a small Llama-shaped checkpoint without a config.
    pub(crate) header: String,
    pub(crate) gguf: Vec<u8>,
}

/// A small Llama-shaped safetensors header: 2 layers of width 16, a vocabulary of 64, fp16.
pub(crate) fn safetensors_header() -> String {
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
pub(crate) fn safetensors_file(header: &[u8], data: usize) -> Vec<u8> {
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header);
    file.resize(file.len() + data, 0);
    file
}

/// The data bytes the base header's offsets cover.
pub(crate) fn base_data_len(header: &str) -> usize {
    let value: serde_json::Value = serde_json::from_str(header).unwrap();
    value.as_object().unwrap().values().filter_map(|t| t["data_offsets"][1].as_u64()).max().unwrap_or(0)
        as usize
}

pub(crate) fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

impl Bases {
    /// Writes the plan and device map with the command line itself, and reads the rest from
    /// the repository.
    pub(crate) fn new(dir: &Path) -> Bases {
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

    pub(crate) fn text(&self, kind: Kind) -> &str {
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
pub(crate) fn command(kind: Kind, path: &str, dir: &Path, rng: &mut Rng) -> Vec<String> {
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
pub(crate) struct Case {
    pub(crate) args: Vec<String>,
    pub(crate) what: String,
    pub(crate) refused: bool,
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

/// Draws case `index` and writes its files under `dir`.
pub(crate) fn draw(index: u64, seed: u64, bases: &Bases, dir: &Path) -> Case {
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
