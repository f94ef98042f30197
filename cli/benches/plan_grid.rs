//! A benchmark grid of `vramplan plan` (issue 15): some 800 plan cases built by loops over the
//! catalog's dense, MoE and MLA models, every target, inference and training, 1 to 256 GPUs
//! (heterogeneous mixes too), offload, pins, `--min-devices`, `--expert-load` (with skewed loads
//! of a measured shape, `skewed-load`), cases that do not fit and cases under `--time-limit`.
//! Not a test: `cargo test` does not run it.
//!
//! Run it with `cargo bench -p vramplan --bench plan_grid` (release), optionally followed by
//! `-- --filter SUBSTRING --limit N --cap SECONDS --top N --list --verbose`.
//!
//! The parent runs each case in a child process, one at a time so that timings do not compete,
//! each under a wall-clock cap (`--cap`, 30 s by default; past it the child is killed and the case
//! recorded as `timeout`). The child (this binary again, with `--case N`) calls the command line
//! in process, `vramplan::run(["vramplan", "plan", …, "--json"])`, times that call, reads its own
//! peak resident memory (`VmHWM` in `/proc/self/status`) and prints one JSON line with the exit
//! code, the seconds, the peak and the plan's `verdict`, `solver.status`, gap and rounds. Exit 1
//! (does not fit) and 4 (no answer) are outcomes; exit 2 (bad input) or a crash is a fault of the
//! case list, and makes the bench exit 1.
//!
//! The parent writes every case's line to `target/plan-grid.jsonl`, the per-expert loads of the
//! `--expert-load` cases to `target/plan-grid-loads/` (a small LCG, deterministic), and a Markdown
//! summary to stdout: percentiles of time and memory, rounds, gaps, the slowest cases with their
//! command lines, outcomes by verdict.
//!
//! Run without `--bench` (as `cargo test --all-targets` does) it only checks the case list.

use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use vramplan_profiles::model::{self, ImportOptions, Naming};

/// Dense models: decoder-only, encoder-decoder (T5) and encoder-only (BERT).
const DENSE: [&str; 14] = [
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "qwen2.5-72b",
    "gemma-2-27b",
    "mistral-7b",
    "phi-2",
    "t5-base",
    "bert-large-uncased",
    "pythia-2.8b",
    "qwen2.5-0.5b",
];

/// Mixture-of-experts models (DeepSeek's with multi-head latent attention).
const MOE: [&str; 8] = [
    "mixtral-8x7b",
    "mixtral-8x22b",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
    "olmoe-1b-7b",
    "gpt-oss-120b",
    "deepseek-v3",
    "deepseek-v2-lite",
];

/// The llama.cpp target's workload flags: a GGUF quantization needs the llama.cpp engine.
const LLAMA_CPP: &str = "--target llama.cpp --engine llama.cpp --quant Q4_K_M";

/// The per-case wall-clock cap by default, in seconds.
const DEFAULT_CAP_S: f64 = 30.0;

/// One plan to run: a short label and the arguments after `vramplan plan` (without `--json`).
struct Case {
    label: String,
    args: Vec<String>,
    /// The expert loads this case reads (`--expert-load`), written before it runs.
    load: Option<LoadFile>,
}

/// A file of per-expert loads: `{"model.layers.3.mlp.experts": [...], ...}`.
#[derive(Clone)]
struct LoadFile {
    model: &'static str,
    seed: u64,
    path: PathBuf,
}

/// Builds the case list; the same list in the parent and in every child.
struct Grid {
    cases: Vec<Case>,
    loads_dir: PathBuf,
}

impl Grid {
    fn add(&mut self, label: String, args: &str) {
        self.cases.push(Case { label, args: split(args), load: None });
    }

    fn add_with_load(&mut self, label: String, args: &str, model: &'static str, seed: u64) {
        let path = self.loads_dir.join(format!("{model}-s{seed}.json"));
        let mut args = split(args);
        args.push("--expert-load".into());
        args.push(path.display().to_string());
        self.cases.push(Case { label, args, load: Some(LoadFile { model, seed, path }) });
    }
}

fn split(args: &str) -> Vec<String> {
    args.split_whitespace().map(str::to_string).collect()
}

fn is_moe(model: &str) -> bool {
    MOE.contains(&model)
}

/// The targets a model's plan can be made for: expert-parallel only for MoE models, llama.cpp
/// for every model but gpt-oss (its checkpoint is already packed; a GGUF is made from floats)
/// and BERT (llama.cpp's default context of 2,048 tokens is past its 512 learned positions,
/// refused as the runtime's `IndexError`).
fn targets(model: &str) -> Vec<(&'static str, &'static str)> {
    let mut out = vec![
        ("accelerate", "--target accelerate"),
        ("accelerate-v4", "--target accelerate-v4"),
        ("pipeline", "--target pipeline"),
    ];
    if !model.starts_with("gpt-oss") && !model.starts_with("bert") {
        out.push(("llama.cpp", LLAMA_CPP));
    }
    if is_moe(model) {
        out.push(("expert-parallel", "--target expert-parallel"));
    }
    out
}

/// The whole grid, in a fixed order.
fn cases(loads_dir: &Path) -> Vec<Case> {
    let mut g = Grid { cases: Vec::new(), loads_dir: loads_dir.to_path_buf() };
    let all: Vec<&'static str> = DENSE.iter().chain(MOE.iter()).copied().collect();

    // Inference: every model, every target, small to mid-size and heterogeneous hardware.
    for model in &all {
        for (tname, targs) in targets(model) {
            for hw in ["2xt4", "rtx4090+rtx3090", "a100-80gb+2xt4", "8xh100-80gb"] {
                // transformers 4.x loads DeepSeek-V3's fp8 checkpoint on Hopper GPUs only.
                let hw = match (*model, tname, hw) {
                    ("deepseek-v3", "accelerate-v4", "2xt4") => "2xh100-80gb",
                    ("deepseek-v3", "accelerate-v4", "rtx4090+rtx3090") => "h200+h100-80gb",
                    ("deepseek-v3", "accelerate-v4", "a100-80gb+2xt4") => "4xh200",
                    _ => hw,
                };
                g.add(format!("inf/{model}/{tname}/{hw}"), &format!("{model} --hardware {hw} {targs}"));
            }
        }
    }

    // Scale: 16 to 256 GPUs.
    let scale: [(&str, &[&str]); 7] = [
        ("llama-3.1-405b", &["--target accelerate", "--target pipeline"]),
        ("llama-2-70b", &["--target accelerate", "--target pipeline"]),
        ("deepseek-v3", &["--target accelerate", "--target expert-parallel", "--target pipeline"]),
        ("qwen3-235b-a22b", &["--target accelerate", "--target expert-parallel"]),
        ("mixtral-8x22b", &["--target expert-parallel"]),
        ("gpt-oss-120b", &["--target expert-parallel"]),
        ("qwen2.5-72b", &["--target accelerate-v4"]),
    ];
    for (model, tlist) in scale {
        for targs in tlist {
            for hw in ["16xh100-80gb", "32xa100-40gb", "64xh100-80gb", "128xa100-80gb", "256xh100-80gb"] {
                let tname = targs.trim_start_matches("--target ");
                g.add(format!("scale/{model}/{tname}/{hw}"), &format!("{model} --hardware {hw} {targs}"));
            }
        }
    }
    for hw in ["16xa100-40gb", "32xt4"] {
        g.add(
            format!("scale/llama-3.1-405b/llama.cpp/{hw}"),
            &format!("llama-3.1-405b --hardware {hw} {LLAMA_CPP}"),
        );
    }

    // Training: QLoRA, LoRA, full fine-tunes.
    let train_models = [
        "llama-2-7b",
        "llama-3.1-8b",
        "llama-2-70b",
        "mistral-7b",
        "gemma-2-27b",
        "phi-2",
        "t5-base",
        "bert-large-uncased",
        "mixtral-8x7b",
        "qwen3-30b-a3b",
        "olmoe-1b-7b",
        "deepseek-v2-lite",
    ];
    let modes = [
        ("qlora", "--mode train --lora-rank 16 --quant nf4"),
        ("lora-bf16", "--mode train --lora-rank 16 --dtype bf16 --grad-ckpt full"),
        ("full-bf16", "--mode train --dtype bf16"),
        (
            "full-fp16-ckpt",
            "--mode train --dtype fp16 --grad-ckpt full --optimizer adamw8bit --batch 4 --seq 2048",
        ),
    ];
    for model in train_models {
        // PEFT has no default LoRA targets for these model types.
        let lora_targets = if matches!(model, "olmoe-1b-7b" | "deepseek-v2-lite") {
            " --lora-targets all-linear"
        } else {
            ""
        };
        for (mname, margs) in modes {
            let margs = if margs.contains("--lora-rank") {
                format!("{margs}{lora_targets}")
            } else {
                margs.to_string()
            };
            // BERT learned 512 positions: a longer sequence is refused as the runtime's error.
            let margs =
                if model.starts_with("bert") { margs.replace("--seq 2048", "--seq 512") } else { margs };
            for hw in ["2xt4", "8xa100-80gb"] {
                g.add(
                    format!("train/{model}/{mname}/accelerate/{hw}"),
                    &format!("{model} --hardware {hw} {margs}"),
                );
            }
            let (tname, targs) = if is_moe(model) {
                ("expert-parallel", "--target expert-parallel")
            } else {
                ("pipeline", "--target pipeline")
            };
            g.add(
                format!("train/{model}/{mname}/{tname}/4xa100-40gb"),
                &format!("{model} --hardware 4xa100-40gb {margs} {targs}"),
            );
        }
    }
    for hw in ["8xh100-80gb", "32xh100-80gb"] {
        g.add(
            format!("train/llama-3.1-405b/qlora/accelerate/{hw}"),
            &format!("llama-3.1-405b --hardware {hw} --mode train --lora-rank 16 --quant nf4"),
        );
        g.add(
            format!("train/deepseek-v3/qlora/expert-parallel/{hw}"),
            &format!(
                "deepseek-v3 --hardware {hw} --mode train --lora-rank 16 --lora-targets all-linear --quant nf4 --target expert-parallel"
            ),
        );
    }

    // Offload: models bigger than the GPUs.
    for n in 1..=8 {
        let hw = if n == 1 { "t4".to_string() } else { format!("{n}xt4") };
        for (tname, targs) in [
            ("accelerate", "--target accelerate"),
            ("accelerate-v4", "--target accelerate-v4"),
            ("llama.cpp", "--target llama.cpp --engine llama.cpp --quant Q8_0"),
        ] {
            g.add(
                format!("offload/llama-2-70b-fp16/{tname}/{hw}"),
                &format!("llama-2-70b --hardware {hw} --dtype fp16 {targs}"),
            );
        }
        let hw = if n == 1 { "a100-80gb".to_string() } else { format!("{n}xa100-80gb") };
        g.add(format!("offload/llama-3.1-405b/accelerate/{hw}"), &format!("llama-3.1-405b --hardware {hw}"));
    }
    for n in 1..=4 {
        let hw = if n == 1 { "rtx4090".to_string() } else { format!("{n}xrtx4090") };
        g.add(format!("offload/mixtral-8x22b/accelerate/{hw}"), &format!("mixtral-8x22b --hardware {hw}"));
        g.add(
            format!("offload/mixtral-8x7b/llama.cpp/{hw}"),
            &format!("mixtral-8x7b --hardware {hw} {LLAMA_CPP}"),
        );
    }

    // Pins.
    for model in ["llama-2-7b", "llama-3.1-8b", "mistral-7b"] {
        for hw in ["t4", "2xt4", "rtx4090+rtx3090"] {
            let gpus = if hw == "t4" { 1 } else { 2 };
            let mut pins: Vec<(&str, String)> = vec![
                ("tail-cpu", "--pin model.layers.28-31=cpu".into()),
                ("first-cpu", "--pin model.layers.0=cpu".into()),
                ("lm_head-0-nf4", "--pin lm_head=0 --quant nf4".into()),
                ("tail-cpu-v4", "--pin model.layers.28-31=cpu --target accelerate-v4".into()),
                ("blk0-cpu", format!("--pin blk.0=cpu {LLAMA_CPP}")),
                ("blk0-3-cpu", format!("--pin blk.0-3=cpu {LLAMA_CPP}")),
            ];
            if gpus == 2 {
                pins.push(("lm_head-last", "--pin lm_head=1".into()));
                pins.push(("split-16", "--pin model.layers.0=0 --pin model.layers.16=1".into()));
                pins.push(("pipeline-split", "--pin model.layers.20=1 --target pipeline --quant nf4".into()));
            }
            for (pname, pargs) in pins {
                g.add(format!("pin/{model}/{pname}/{hw}"), &format!("{model} --hardware {hw} {pargs}"));
            }
        }
    }
    g.add(
        "pin/mixtral-8x7b/ep-layer0/8xa100-40gb".into(),
        "mixtral-8x7b --hardware 8xa100-40gb --target expert-parallel --pin model.layers.0=0",
    );

    // Fewest GPUs.
    for model in ["llama-2-7b", "llama-2-70b", "mixtral-8x7b"] {
        for hw in ["2xt4", "4xt4", "8xt4", "16xa100-40gb"] {
            g.add(
                format!("min-devices/{model}/accelerate/{hw}"),
                &format!("{model} --hardware {hw} --min-devices"),
            );
        }
        g.add(
            format!("min-devices/{model}/pipeline/8xa100-40gb"),
            &format!("{model} --hardware 8xa100-40gb --target pipeline --min-devices"),
        );
    }
    for model in ["llama-3.1-8b", "llama-2-70b"] {
        for hw in ["24xt4", "32xh100-80gb"] {
            g.add(
                format!("min-devices/{model}/accelerate/{hw}"),
                &format!("{model} --hardware {hw} --min-devices"),
            );
        }
    }
    g.add(
        "min-devices/qwen3-30b-a3b/expert-parallel/8xt4".into(),
        "qwen3-30b-a3b --hardware 8xt4 --target expert-parallel --min-devices",
    );

    // Expert loads: three seeds (flat, skewed, a few hot experts) on two machines per model.
    let load_hw: [(&'static str, [&str; 2]); 8] = [
        ("mixtral-8x7b", ["4xa100-40gb", "2xh100-80gb"]),
        ("mixtral-8x22b", ["8xh100-80gb", "16xa100-40gb"]),
        ("qwen3-30b-a3b", ["8xt4", "2xa100-40gb"]),
        ("qwen3-235b-a22b", ["8xh100-80gb", "16xa100-40gb"]),
        ("olmoe-1b-7b", ["2xt4", "4xt4"]),
        ("gpt-oss-120b", ["2xa100-40gb", "4xl4"]),
        ("deepseek-v3", ["32xh100-80gb", "64xa100-40gb"]),
        ("deepseek-v2-lite", ["4xt4", "2xrtx4090"]),
    ];
    for (model, hws) in load_hw {
        for hw in hws {
            for seed in 1..=3 {
                g.add_with_load(
                    format!("expert-load/{model}/s{seed}/{hw}"),
                    &format!("{model} --hardware {hw} --target expert-parallel"),
                    model,
                    seed,
                );
            }
        }
    }
    // Skewed loads of a measured shape (issue 32): per layer a lognormal (seed 4) or a Zipf over
    // a permutation of the experts (seed 5), the hot experts different in every layer, for the
    // large MoE models over 8 to 128 GPUs. DeepSeek-V3's 671 GB of fp8 weights need H200s on 8.
    for model in ["mixtral-8x22b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b"] {
        for gpus in [8, 16, 32, 64, 128] {
            let kind = if model == "deepseek-v3" && gpus == 8 { "h200" } else { "h100-80gb" };
            let hw = format!("{gpus}x{kind}");
            for (shape, seed) in [("lognormal", 4), ("zipf", 5)] {
                g.add_with_load(
                    format!("skewed-load/{model}/{shape}/{hw}"),
                    &format!("{model} --hardware {hw} --target expert-parallel"),
                    model,
                    seed,
                );
            }
        }
    }
    g.add_with_load(
        "expert-load/mixtral-8x7b/qlora/s2/2xt4".into(),
        "mixtral-8x7b --hardware 2xt4 --target expert-parallel --mode train --lora-rank 16 --quant nf4",
        "mixtral-8x7b",
        2,
    );

    // Long contexts and big batches, most of which do not fit (the remedies search).
    for model in
        ["llama-2-7b", "llama-3.1-8b", "llama-2-70b", "llama-3.1-405b", "mixtral-8x7b", "qwen2.5-72b"]
    {
        for (wname, wargs) in
            [("seq32k-b8", "--seq 32768 --batch 8"), ("seq128k-b4", "--seq 131072 --batch 4")]
        {
            for hw in ["2xt4", "16xh100-80gb"] {
                g.add(format!("big/{model}/{wname}/{hw}"), &format!("{model} --hardware {hw} {wargs}"));
            }
        }
    }
    for (model, hw, extra) in [
        ("llama-2-70b", "2xt4", "--dtype fp16 --no-offload"),
        ("llama-2-70b", "4xt4", "--dtype fp16 --no-offload"),
        ("mixtral-8x22b", "2xt4", "--no-offload"),
        ("deepseek-v3", "8xh100-80gb", "--target expert-parallel"),
        ("deepseek-v3", "8xh100-80gb", "--target pipeline"),
        ("qwen2.5-72b", "8xa100-80gb", "--mode train --dtype bf16"),
        ("llama-3.1-405b", "8xh100-80gb", "--mode train --dtype bf16 --target pipeline"),
        ("llama-2-70b", "8xt4", "--dtype fp16 --target pipeline"),
        ("qwen3-235b-a22b", "4xa100-80gb", "--target expert-parallel"),
        ("gemma-2-27b", "t4", "--no-offload --quant int8"),
    ] {
        g.add(
            format!("nofit/{model}/{hw}/{}", extra.replace(' ', "")),
            &format!("{model} --hardware {hw} {extra}"),
        );
    }

    // Precision: bitsandbytes, GPTQ/AWQ, fp8 on accelerate; GGUF types on llama.cpp; vLLM.
    for model in ["llama-2-7b", "llama-3.1-8b", "llama-2-70b", "mixtral-8x7b", "qwen2.5-72b", "qwen3-30b-a3b"]
    {
        for quant in ["int8", "nf4", "fp4 --double-quant", "gptq", "awq", "fp8"] {
            let qname = quant.split_whitespace().next().unwrap_or(quant);
            g.add(format!("quant/{model}/{qname}/2xt4"), &format!("{model} --hardware 2xt4 --quant {quant}"));
        }
    }
    for model in ["llama-2-70b", "mixtral-8x7b", "llama-3.1-8b", "qwen3-30b-a3b"] {
        for gguf in ["Q2_K", "Q3_K_M", "Q5_K_M", "Q6_K", "Q8_0"] {
            g.add(
                format!("gguf/{model}/{gguf}/rtx4090+rtx3090"),
                &format!(
                    "{model} --hardware rtx4090+rtx3090 --target llama.cpp --engine llama.cpp --quant {gguf}"
                ),
            );
        }
    }
    for model in ["llama-2-7b", "llama-3.1-8b", "mixtral-8x7b", "qwen2.5-72b"] {
        for hw in ["2xt4", "8xh100-80gb"] {
            g.add(format!("vllm/{model}/{hw}"), &format!("{model} --hardware {hw} --engine vllm"));
        }
    }

    // Heterogeneous machines.
    for model in ["llama-2-70b", "mixtral-8x7b", "llama-3.1-8b", "qwen3-30b-a3b"] {
        let alt = if is_moe(model) { "--target expert-parallel" } else { "--target pipeline" };
        for hw in ["h200+2xa100-40gb", "2xa100-80gb+4xt4", "rtx4090+2xrtx3090+t4", "h100-80gb+l40s+a10g+l4"] {
            g.add(format!("hetero/{model}/accelerate/{hw}"), &format!("{model} --hardware {hw}"));
            let tname = alt.trim_start_matches("--target ");
            g.add(format!("hetero/{model}/{tname}/{hw}"), &format!("{model} --hardware {hw} {alt}"));
        }
    }

    // Time limits: hard cases bounded.
    for limit in ["1", "5"] {
        for (name, args) in [
            ("mixtral-llama.cpp-8xt4", format!("mixtral-8x7b --hardware 8xt4 {LLAMA_CPP}")),
            (
                "405b-seq128k-b4-16xh100",
                "llama-3.1-405b --hardware 16xh100-80gb --seq 131072 --batch 4".into(),
            ),
            ("min-devices-70b-32xh100", "llama-2-70b --hardware 32xh100-80gb --min-devices".into()),
            ("deepseek-v3-ep-64xh100", "deepseek-v3 --hardware 64xh100-80gb --target expert-parallel".into()),
            (
                "qwen3-235b-ep-256xh100",
                "qwen3-235b-a22b --hardware 256xh100-80gb --target expert-parallel".into(),
            ),
            ("llama-2-70b-fp16-8xt4", "llama-2-70b --hardware 8xt4 --dtype fp16".into()),
        ] {
            g.add(format!("time-limit-{limit}/{name}"), &format!("{args} --time-limit {limit}"));
        }
    }

    g.cases
}

/// A deterministic 64-bit LCG (Knuth's MMIX constants).
struct Lcg(u64);

impl Lcg {
    fn new(seed: u64) -> Self {
        let mut lcg = Lcg(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x2545_F491_4F6C_DD1D);
        lcg.next_unit();
        lcg
    }

    /// A number in [0, 1).
    fn next_unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Tokens routed to each of `experts` experts of one layer: seed 1 nearly flat, seed 2 skewed
/// (a power law), seed 3 a few hot experts over a flat floor; seeds 4 and 5 the shapes routers
/// are measured to take ([`skewed_loads`]).
fn expert_loads(experts: u32, seed: u64, layer: usize, rng: &mut Lcg) -> Vec<u64> {
    if seed >= 4 {
        return skewed_loads(experts, seed == 5, rng);
    }
    let hot = 1 + (layer % 3) as u32;
    (0..experts)
        .map(|e| {
            let u = rng.next_unit();
            let tokens = match seed {
                1 => 900.0 + 200.0 * u,
                2 => 50.0 + 20_000.0 * u.powi(4),
                _ => {
                    if (e + layer as u32 * 7) % experts < hot {
                        40_000.0 + 10_000.0 * u
                    } else {
                        100.0 + 400.0 * u
                    }
                }
            };
            tokens.round() as u64
        })
        .collect()
}

/// One layer's tokens per expert with the skew measured routers show (a few experts take a
/// large share, which ones differs from layer to layer): a lognormal of σ = 1 per expert
/// (`zipf` false), or Zipf's law of exponent 1.2 over a random order of the experts (`zipf`
/// true, the k-th hottest taking a share ∝ k^−1.2); 100,000 routed tokens a layer
/// spread in those proportions.
fn skewed_loads(experts: u32, zipf: bool, rng: &mut Lcg) -> Vec<u64> {
    let n = experts as usize;
    let weights: Vec<f64> = if zipf {
        // A Fisher–Yates shuffle gives each expert its rank in this layer.
        let mut rank: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            let j = ((rng.next_unit() * (i + 1) as f64) as usize).min(i);
            rank.swap(i, j);
        }
        rank.iter().map(|&r| ((r + 1) as f64).powf(-1.2)).collect()
    } else {
        (0..n)
            .map(|_| {
                // Box–Muller: a standard normal from two uniforms.
                let (u, v) = (rng.next_unit().max(1e-12), rng.next_unit());
                ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()).exp()
            })
            .collect()
    };
    let total: f64 = weights.iter().sum();
    weights.iter().map(|w| (100_000.0 * w / total).round() as u64).collect()
}

/// Writes a case's expert-load file: one entry per MoE layer, keyed by its experts module.
fn write_loads(load: &LoadFile) -> Result<(), String> {
    let description = model::load(load.model, ImportOptions { naming: Naming::V5 })
        .map_err(|e| format!("{}: {e:?}", load.model))?;
    let experts = description
        .facts
        .moe
        .as_ref()
        .map(|m| m.experts)
        .ok_or_else(|| format!("{} has no experts", load.model))?;
    let mut rng = Lcg::new(load.seed);
    let mut map = BTreeMap::new();
    for (index, layer) in description.facts.layers.iter().enumerate().filter(|(_, l)| l.moe) {
        let key = vramplan_solver::build::experts_module(&description, &layer.path)
            .map_or_else(|| layer.path.clone(), |m| m.path.clone());
        map.insert(key, expert_loads(experts, load.seed, index, &mut rng));
    }
    if let Some(dir) = load.path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let text = serde_json::to_string(&map).map_err(|e| e.to_string())?;
    std::fs::write(&load.path, text).map_err(|e| format!("{}: {e}", load.path.display()))
}

/// The workspace's `target/` folder: this binary is `target/release/deps/plan_grid-HASH`.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().ok();
    let deps = exe.as_deref().and_then(Path::parent);
    match deps {
        Some(deps) if deps.file_name().is_some_and(|n| n == "deps") => {
            deps.parent().and_then(Path::parent).map_or_else(fallback_target, Path::to_path_buf)
        }
        _ => fallback_target(),
    }
}

fn fallback_target() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("target")
}

/// The command line a shell can paste.
fn command_line(args: &[String]) -> String {
    let mut line = String::from("vramplan plan");
    for arg in args {
        line.push(' ');
        let plain = arg.chars().all(|c| c.is_ascii_alphanumeric() || "_./=+:,-".contains(c));
        if plain {
            line.push_str(arg);
        } else {
            line.push('\'');
            line.push_str(&arg.replace('\'', r"'\''"));
            line.push('\'');
        }
    }
    line.push_str(" --json");
    line
}

/// Peak resident memory of this process, in bytes (`VmHWM`).
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.trim_start_matches("VmHWM:").trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

/// The largest proven gap of the plan: the largest among `solver.stages[].gap` where the
/// solver reports stages, else `solver.gap`.
fn plan_gap(solver: &Value) -> Option<f64> {
    if let Some(stages) = solver.get("stages").and_then(Value::as_array) {
        let gaps: Vec<f64> = stages.iter().filter_map(|s| s.get("gap").and_then(Value::as_f64)).collect();
        if !gaps.is_empty() {
            return Some(gaps.into_iter().fold(f64::NEG_INFINITY, f64::max));
        }
    }
    solver.get("gap").and_then(Value::as_f64)
}

fn outcome_of(exit: i32) -> &'static str {
    match exit {
        0 => "ok",
        1 => "negative",
        2 => "bad_input",
        4 => "no_answer",
        _ => "error",
    }
}

/// The child: runs case `index` in process and prints its JSON line.
fn run_child(index: usize) -> i32 {
    let target = target_dir();
    let all = cases(&target.join("plan-grid-loads"));
    let Some(case) = all.get(index) else {
        eprintln!("no case {index}: the grid has {}", all.len());
        return 2;
    };
    if let Some(load) = &case.load
        && !load.path.exists()
        && let Err(e) = write_loads(load)
    {
        eprintln!("writing the expert loads: {e}");
        return 2;
    }
    let mut argv: Vec<String> = vec!["vramplan".into(), "plan".into()];
    argv.extend(case.args.iter().cloned());
    argv.push("--json".into());
    let mut out: Vec<u8> = Vec::new();
    let mut err: Vec<u8> = Vec::new();
    let start = Instant::now();
    let exit = vramplan::run(argv, &mut out, &mut err);
    let seconds = start.elapsed().as_secs_f64();
    let peak = peak_rss_bytes();
    let plan: Value = serde_json::from_slice(&out).unwrap_or(Value::Null);
    let solver = &plan["solver"];
    let error = String::from_utf8_lossy(&err).lines().next().unwrap_or("").to_string();
    let line = json!({
        "id": index,
        "label": case.label,
        "command": command_line(&case.args),
        "args": case.args,
        "exit": exit,
        "outcome": outcome_of(exit),
        "seconds": seconds,
        "peak_rss_bytes": peak,
        "verdict": plan.get("verdict"),
        "status": solver.get("status"),
        "gap": plan_gap(solver),
        "solver_gap": solver.get("gap"),
        "stages": solver.get("stages"),
        "rounds": solver.get("rounds"),
        "solver_seconds": solver.get("seconds"),
        "error": if exit == 0 { Value::Null } else { Value::String(error) },
    });
    println!("{line}");
    0
}

/// Options of the parent run.
struct Options {
    filter: Option<String>,
    limit: Option<usize>,
    cap: Duration,
    top: usize,
    list: bool,
    verbose: bool,
}

/// Runs one case in a child process under the cap; its JSON line, or one the parent writes for
/// a timeout or a crash.
fn run_case(exe: &Path, index: usize, case: &Case, cap: Duration) -> Value {
    let base = |outcome: &str, seconds: f64, error: String| {
        json!({
            "id": index,
            "label": case.label,
            "command": command_line(&case.args),
            "args": case.args,
            "exit": Value::Null,
            "outcome": outcome,
            "seconds": seconds,
            "wall_seconds": seconds,
            "peak_rss_bytes": Value::Null,
            "verdict": Value::Null,
            "status": Value::Null,
            "gap": Value::Null,
            "rounds": Value::Null,
            "error": error,
        })
    };
    let start = Instant::now();
    let child = Command::new(exe)
        .arg("--case")
        .arg(index.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => return base("crash", 0.0, format!("spawn: {e}")),
    };
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut stderr = child.stderr.take().expect("piped stderr");
    let out_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if start.elapsed() >= cap => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(_) => break None,
        }
    };
    let wall = start.elapsed().as_secs_f64();
    let out = out_reader.join().unwrap_or_default();
    let err = err_reader.join().unwrap_or_default();
    let Some(status) = status else {
        return base("timeout", wall, format!("killed after {:.0} s", cap.as_secs_f64()));
    };
    let parsed = out.lines().rev().find_map(|l| serde_json::from_str::<Value>(l).ok());
    match parsed {
        Some(mut line) if status.success() => {
            line["wall_seconds"] = json!(wall);
            line
        }
        _ => {
            let tail: String = err
                .lines()
                .rev()
                .take(3)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join(" | ");
            base("crash", wall, format!("{status}: {tail}"))
        }
    }
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The largest of `values`, `None` when there are none.
fn largest(values: impl Iterator<Item = f64>) -> Option<f64> {
    values.reduce(f64::max)
}

fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1024.0 * 1024.0))
}

fn fmt_gap(gap: Option<f64>) -> String {
    match gap {
        Some(g) => format!("{:.3} %", g * 100.0),
        None => "–".into(),
    }
}

fn text<'a>(record: &'a Value, key: &str) -> &'a str {
    record.get(key).and_then(Value::as_str).unwrap_or("–")
}

/// The Markdown summary of all records.
fn summary(records: &[Value], cap: Duration, top: usize, jsonl: &Path) -> String {
    let mut md = String::new();
    let n = records.len();
    let seconds = |r: &Value| r["seconds"].as_f64().unwrap_or(0.0);
    let mut times: Vec<f64> = records.iter().map(seconds).collect();
    times.sort_by(f64::total_cmp);
    let mut peaks: Vec<f64> = records.iter().filter_map(|r| r["peak_rss_bytes"].as_f64()).collect();
    peaks.sort_by(f64::total_cmp);
    let mut outcomes: BTreeMap<&str, usize> = BTreeMap::new();
    let mut verdicts: BTreeMap<String, usize> = BTreeMap::new();
    let mut rounds: BTreeMap<String, usize> = BTreeMap::new();
    for r in records {
        *outcomes.entry(text(r, "outcome")).or_default() += 1;
        let verdict = match text(r, "outcome") {
            "timeout" | "crash" | "bad_input" => format!("({})", text(r, "outcome")),
            _ => text(r, "verdict").to_string(),
        };
        *verdicts.entry(verdict).or_default() += 1;
        let round = r["rounds"].as_u64().map_or_else(|| "–".to_string(), |x| x.to_string());
        *rounds.entry(round).or_default() += 1;
    }
    let gaps: Vec<(f64, &Value)> = records.iter().filter_map(|r| r["gap"].as_f64().map(|g| (g, r))).collect();
    let max_gap = largest(gaps.iter().map(|(g, _)| *g));
    let over_gap = gaps.iter().filter(|(g, _)| *g > 0.01).count();
    let over_1s = times.iter().filter(|t| **t > 1.0).count();
    let timeouts = outcomes.get("timeout").copied().unwrap_or(0);

    md.push_str("# plan grid\n\n");
    md.push_str(&format!(
        "{n} cases, one child process each, one at a time, capped at {:.0} s (a timeout counts as the cap). \
         Time is the in-process `vramplan::run` call; memory the child's peak RSS (`VmHWM`). \
         All records: `{}`.\n\n",
        cap.as_secs_f64(),
        jsonl.display()
    ));
    md.push_str("| | p50 | p95 | max |\n|---|---|---|---|\n");
    md.push_str(&format!(
        "| time | {:.3} s | {:.3} s | {:.3} s |\n",
        percentile(&times, 0.5),
        percentile(&times, 0.95),
        times.last().copied().unwrap_or(f64::NAN)
    ));
    md.push_str(&format!(
        "| peak RSS | {} | {} | {} |\n\n",
        mib(percentile(&peaks, 0.5)),
        mib(percentile(&peaks, 0.95)),
        mib(peaks.last().copied().unwrap_or(f64::NAN))
    ));
    md.push_str(&format!(
        "- over 1 s: {over_1s} (of which {timeouts} timed out)\n- total time: {:.1} s\n",
        times.iter().sum::<f64>()
    ));
    md.push_str(&format!("- max gap: {} ; cases with gap > 1 %: {over_gap}\n", fmt_gap(max_gap)));
    md.push_str(&format!(
        "- outcomes: {}\n",
        outcomes.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
    ));
    md.push_str(&format!(
        "- verdicts: {}\n",
        verdicts.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
    ));
    let mut round_keys: Vec<(&String, &usize)> = rounds.iter().collect();
    round_keys.sort_by_key(|(k, _)| k.parse::<u64>().unwrap_or(u64::MAX));
    md.push_str(&format!(
        "- refinement rounds: {}\n\n",
        round_keys.iter().map(|(k, v)| format!("{k}: {v}")).collect::<Vec<_>>().join(", ")
    ));

    // Each family of cases (the label's first part: offload, pins, --min-devices, loads, …).
    let mut families: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    for r in records {
        let family = text(r, "label").split('/').next().unwrap_or("–");
        families.entry(family).or_default().push(r);
    }
    md.push_str("## By family\n\n| family | cases | p50 | p95 | max | over 1 s | max gap |\n|---|---|---|---|---|---|---|\n");
    for (family, members) in &families {
        let mut t: Vec<f64> = members.iter().map(|r| seconds(r)).collect();
        t.sort_by(f64::total_cmp);
        let gap = largest(members.iter().filter_map(|r| r["gap"].as_f64()));
        md.push_str(&format!(
            "| {family} | {} | {:.3} s | {:.3} s | {:.3} s | {} | {} |\n",
            members.len(),
            percentile(&t, 0.5),
            percentile(&t, 0.95),
            t.last().copied().unwrap_or(f64::NAN),
            t.iter().filter(|x| **x > 1.0).count(),
            fmt_gap(gap)
        ));
    }
    md.push('\n');

    let row = |r: &Value| {
        format!(
            "| {} | {:.3} | {} | {} | {} | {} | {} | `{}` |\n",
            r["id"],
            seconds(r),
            text(r, "outcome"),
            text(r, "verdict"),
            text(r, "status"),
            fmt_gap(r["gap"].as_f64()),
            r["rounds"].as_u64().map_or_else(|| "–".to_string(), |x| x.to_string()),
            text(r, "command")
        )
    };
    let header = "| id | s | outcome | verdict | status | gap | rounds | command |\n|---|---|---|---|---|---|---|---|\n";
    let mut slow: Vec<&Value> = records.iter().collect();
    slow.sort_by(|a, b| seconds(b).total_cmp(&seconds(a)));
    md.push_str(&format!("## The {} slowest\n\n{header}", top.min(n)));
    for r in slow.iter().take(top) {
        md.push_str(&row(r));
    }
    let mut wide: Vec<&(f64, &Value)> = gaps.iter().filter(|(g, _)| *g > 0.01).collect();
    if !wide.is_empty() {
        wide.sort_by(|a, b| b.0.total_cmp(&a.0));
        md.push_str(&format!("\n## Gap over 1 % ({})\n\n{header}", wide.len()));
        for (_, r) in wide.iter().take(top) {
            md.push_str(&row(r));
        }
    }
    let failures: Vec<&Value> =
        records.iter().filter(|r| matches!(text(r, "outcome"), "bad_input" | "crash" | "error")).collect();
    if !failures.is_empty() {
        md.push_str(&format!("\n## Faults of the case list ({})\n\n", failures.len()));
        for r in failures {
            md.push_str(&format!(
                "- {} `{}`: {}\n",
                text(r, "outcome"),
                text(r, "command"),
                text(r, "error")
            ));
        }
    }
    md
}

/// The parent: runs the selected cases and reports.
fn run_parent(options: &Options) -> i32 {
    let target = target_dir();
    let all = cases(&target.join("plan-grid-loads"));
    let selected: Vec<(usize, &Case)> = all
        .iter()
        .enumerate()
        .filter(|(_, c)| {
            options
                .filter
                .as_ref()
                .is_none_or(|f| c.label.contains(f.as_str()) || c.args.join(" ").contains(f.as_str()))
        })
        .take(options.limit.unwrap_or(usize::MAX))
        .collect();
    if options.list {
        for (i, c) in &selected {
            println!("{i}\t{}\t{}", c.label, command_line(&c.args));
        }
        return 0;
    }
    let loads: BTreeMap<PathBuf, LoadFile> =
        selected.iter().filter_map(|(_, c)| c.load.clone()).map(|l| (l.path.clone(), l)).collect();
    for load in loads.values() {
        if let Err(e) = write_loads(load) {
            eprintln!("writing the expert loads: {e}");
            return 1;
        }
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("current_exe: {e}");
            return 1;
        }
    };
    let jsonl = target.join("plan-grid.jsonl");
    let mut file = match std::fs::File::create(&jsonl) {
        Ok(f) => std::io::BufWriter::new(f),
        Err(e) => {
            eprintln!("{}: {e}", jsonl.display());
            return 1;
        }
    };
    eprintln!("plan grid: {} of {} cases, cap {:.0} s", selected.len(), all.len(), options.cap.as_secs_f64());
    let started = Instant::now();
    let mut records = Vec::with_capacity(selected.len());
    for (done, (index, case)) in selected.iter().enumerate() {
        let record = run_case(&exe, *index, case, options.cap);
        let secs = record["seconds"].as_f64().unwrap_or(0.0);
        let outcome = text(&record, "outcome").to_string();
        if options.verbose
            || secs > 1.0
            || matches!(outcome.as_str(), "bad_input" | "crash" | "error" | "timeout")
        {
            eprintln!(
                "[{}/{}] {:>7.3} s {:<9} {} {}",
                done + 1,
                selected.len(),
                secs,
                outcome,
                case.label,
                if outcome == "ok" || outcome == "negative" || outcome == "no_answer" {
                    String::new()
                } else {
                    text(&record, "error").to_string()
                }
            );
        } else if (done + 1) % 50 == 0 {
            eprintln!("[{}/{}] {:.0} s elapsed", done + 1, selected.len(), started.elapsed().as_secs_f64());
        }
        let _ = writeln!(file, "{record}");
        let _ = file.flush();
        records.push(record);
    }
    drop(file);
    print!("{}", summary(&records, options.cap, options.top, &jsonl));
    let faults =
        records.iter().filter(|r| matches!(text(r, "outcome"), "bad_input" | "crash" | "error")).count();
    if faults > 0 {
        eprintln!("{faults} case(s) failed: bad input or a crash (see the summary)");
        return 1;
    }
    0
}

/// Without `--bench` (`cargo test --all-targets` runs bench binaries that way): check the
/// list only.
fn check_list() -> i32 {
    let all = cases(&target_dir().join("plan-grid-loads"));
    let labels: BTreeSet<&str> = all.iter().map(|c| c.label.as_str()).collect();
    if all.len() < 500 || labels.len() != all.len() {
        eprintln!(
            "plan grid: {} cases, {} distinct labels (want ≥ 500, all distinct)",
            all.len(),
            labels.len()
        );
        return 1;
    }
    println!("plan grid: {} cases (run them with `cargo bench -p vramplan --bench plan_grid`)", all.len());
    0
}

/// Stops on a flag without its value.
fn bad(flag: &str) -> ! {
    eprintln!("plan_grid: {flag} needs a value");
    std::process::exit(2)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut case = None;
    let mut bench = false;
    let mut options = Options {
        filter: None,
        limit: None,
        cap: Duration::from_secs_f64(DEFAULT_CAP_S),
        top: 10,
        list: false,
        verbose: false,
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--case" => {
                case =
                    Some(args.next().and_then(|v| v.parse::<usize>().ok()).unwrap_or_else(|| bad("--case N")))
            }
            "--filter" => {
                options.filter = Some(args.next().unwrap_or_else(|| bad("--filter SUBSTRING")));
                bench = true;
            }
            "--limit" => {
                options.limit =
                    Some(args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| bad("--limit N")));
                bench = true;
            }
            "--cap" => {
                let cap: f64 = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|c: &f64| *c > 0.0)
                    .unwrap_or_else(|| bad("--cap SECONDS"));
                options.cap = Duration::from_secs_f64(cap);
                bench = true;
            }
            "--top" => {
                options.top = args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| bad("--top N"))
            }
            "--list" => {
                options.list = true;
                bench = true;
            }
            "--verbose" => options.verbose = true,
            "--bench" => bench = true,
            // What cargo or a test harness passes besides (`--nocapture`, filters): ignored.
            _ => {}
        }
    }
    let code = match case {
        Some(index) => run_child(index),
        None if bench => run_parent(&options),
        None => check_list(),
    };
    std::process::exit(code);
}
