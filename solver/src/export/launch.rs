//! Runnable exports of a plan: the command lines and config files that launch it on the engine
//! it was sized for (`plan -o FILE --format F`).
//!
//! - `vllm`: a shell script with `vllm serve MODEL` and the plan's flags (tensor × pipeline
//!   parallel sizes, dtype, quantization, `--max-model-len`, `--gpu-memory-utilization`,
//!   `--max-num-seqs`, `--max-num-batched-tokens`, `--kv-cache-dtype`).
//! - `sglang`: a shell script with `python -m sglang.launch_server` (`--model-path`, `--tp-size`,
//!   `--dp-size`, `--context-length`, `--mem-fraction-static`, `--quantization`,
//!   `--kv-cache-dtype`), one line per node of a multi-node profile.
//! - `deepspeed`: a DeepSpeed config JSON (ZeRO stage, offload, micro-batch, accumulation,
//!   bf16/fp16) with a sibling script of `torchrun` lines that pass it to the training script.
//! - `fsdp`: an accelerate config YAML (`distributed_type: FSDP`) with a sibling script of
//!   `accelerate launch` lines.
//! - `torchrun`: a shell script of `torchrun` lines for DDP, one per node.
//!
//! The training exports launch the HF Trainer (or TRL, or a script on `Accelerator()`): a
//! workload under another `--trainer` (torchtune, Unsloth, LitGPT, fsdp_qlora), which runs its
//! own program with its own wrapping and launcher, is refused at the key `trainer`.
//!
//! Every script opens with comments saying what it assumes (the engine version its flags were
//! checked against, the environment), and multi-node scripts pick their line by `NODE_RANK`
//! with `MASTER_ADDR` as the rendezvous placeholder the user fills in.

use super::Export;
use vramplan_profiles::{DType, InputError};
use vramplan_sim::workload::{Engine, Mode, Parallelism, Quant, Trainer, Workload};

/// The vLLM version whose flags the `vllm` export was checked against.
pub const VLLM_VERSION: &str = "0.33.0";
/// The SGLang version whose flags the `sglang` export was checked against.
pub const SGLANG_VERSION: &str = "0.5.23";
/// The DeepSpeed version that parsed the `deepspeed` export.
pub const DEEPSPEED_VERSION: &str = "0.19.8";
/// The accelerate version that loaded the `fsdp` export.
pub const ACCELERATE_VERSION: &str = "1.15";
/// The rendezvous port the multi-node lines use on node 0.
const PORT: u32 = 29500;

/// What a runnable export needs beside the plan: the model's source, the hardware's shape and
/// the workload.
#[derive(Debug, Clone)]
pub struct Launch<'a> {
    /// The model as `vllm serve` / `from_pretrained` takes it (a Hub repository or a folder);
    /// `None` for a custom model, written as the placeholder `MODEL`.
    pub source: Option<String>,
    /// The method of a checkpoint already quantized (`AWQ (4-bit, group size 128)`) that the
    /// engine must serve in place of `source`, whose weights are not quantized
    /// (`whatif::prequantized`); `None` where `source` is served as it is.
    pub prequantized: Option<String>,
    /// The GPUs of each node of the profile, in node order.
    pub gpus_per_node: Vec<u32>,
    /// The workload the plan was made for.
    pub workload: &'a Workload,
}

impl Launch<'_> {
    fn model(&self) -> String {
        self.source.clone().unwrap_or_else(|| "MODEL".into())
    }
    fn total_gpus(&self) -> u32 {
        self.gpus_per_node.iter().sum()
    }
    fn nodes(&self) -> u32 {
        self.gpus_per_node.len() as u32
    }
    /// GPUs per node, the same on every node (torchrun's `--nproc-per-node` is one number).
    fn per_node(&self, format: &str) -> Result<u32, InputError> {
        let first = self.gpus_per_node.first().copied().unwrap_or(1);
        if self.gpus_per_node.iter().any(|g| *g != first) {
            return Err(InputError::new(
                "--format",
                format!("the {format} launch lines need the same number of GPUs on every node"),
            )
            .with_fix("use a hardware profile whose nodes have equal GPU counts"));
        }
        Ok(first)
    }
}

/// A command line being built: the program, then `flag value` pairs.
struct Line(String);

impl Line {
    fn new(program: &str) -> Line {
        Line(program.to_string())
    }
    fn arg(&mut self, flag: &str, value: impl ToString) -> &mut Line {
        self.0 += &format!(" {flag} {}", shell_word(&value.to_string()));
        self
    }
    fn word(&mut self, word: &str) -> &mut Line {
        self.0 += &format!(" {}", shell_word(word));
        self
    }
}

/// `word` quoted for a POSIX shell where it needs quoting; `$NAME` placeholders stay expandable.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./:=,+@".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else if word.contains('$') {
        format!("\"{}\"", word.replace('"', "\\\""))
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// A script: the header comments, then the lines (one per node, chosen by `NODE_RANK`, where
/// there are several).
fn script(assumes: &[String], lines: &[String]) -> String {
    let mut text = String::from("#!/usr/bin/env bash\n# Written by vramplan plan -o.\n");
    for line in assumes {
        text += &format!("# {line}\n");
    }
    text += "set -euo pipefail\n";
    if let [line] = lines {
        text += line;
        text += "\n";
    } else {
        text += ": \"${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}\"\n";
        text += "case \"${NODE_RANK:?set NODE_RANK to the index of this node, from 0}\" in\n";
        for (rank, line) in lines.iter().enumerate() {
            text += &format!("  {rank}) {line} ;;\n");
        }
        text += &format!("  *) echo \"NODE_RANK must be 0 to {}\" >&2; exit 2 ;;\nesac\n", lines.len() - 1);
    }
    text
}

fn refuse(format: &str, why: impl Into<String>, fix: impl Into<String>) -> InputError {
    InputError::new("--format", format!("no {format} export for this plan: {}", why.into())).with_fix(fix)
}

/// Refuses a training export for a workload under a trainer other than the HF Trainer/TRL: the
/// files launch the HF Trainer's script (its `--deepspeed CONFIG`, accelerate's FSDP plugin with
/// `TRANSFORMER_BASED_WRAP` and `use_orig_params`, DDP under torchrun), not the program the
/// estimate modelled (fsdp_qlora's `train.py` wraps with `use_orig_params=False`, for one).
fn hf_trainer_only(w: &Workload, format: &str) -> Result<(), InputError> {
    if w.trainer == Trainer::Transformers {
        return Ok(());
    }
    let trainer = vramplan_sim::input::trainer_word(w.trainer);
    Err(refuse(
        format,
        format!(
            "the {format} export writes launch files for the HF Trainer/TRL; `--trainer {trainer}` runs its own program"
        ),
        format!(
            "launch {trainer} with its own launcher at the batch and length vramplan sized, or plan with `--trainer transformers`"
        ),
    )
    .at_key("trainer"))
}

/// The engine's `kind` as the workload file writes it (`vllm`, `sglang`, …), and its fields.
pub(crate) fn engine_kind(workload: &Workload) -> (String, serde_json::Value) {
    let value = serde_json::to_value(&workload.engine).unwrap_or_default();
    let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("transformers").to_string();
    (kind, value)
}

/// The dtype flag both serving engines read (`auto` keeps the checkpoint's).
fn serving_dtype(workload: &Workload, format: &str) -> Result<&'static str, InputError> {
    Ok(match workload.weight_dtype {
        None => "auto",
        Some(DType::BF16) => "bfloat16",
        Some(DType::F16) => "float16",
        Some(DType::F32) => "float32",
        Some(other) => {
            return Err(refuse(
                format,
                format!("weights held in {} are not a dtype the engine computes in", other.name()),
                "use --dtype bf16, fp16 or fp32 and a --quant for lower-precision weights",
            ));
        }
    })
}

/// The `--quantization` method vLLM and SGLang name for `quant` (`None`: weights as stored, or
/// a quantization they do not take by that flag): the one mapping the exports and `whatif`'s
/// `vllm serve` lines share.
pub(crate) fn quantization_flag(quant: &Quant) -> Option<&'static str> {
    match quant {
        Quant::Fp8 { .. } => Some("fp8"),
        Quant::Awq { .. } => Some("awq"),
        Quant::Gptq { .. } => Some("gptq"),
        Quant::Int8 | Quant::Nf4 { .. } => Some("bitsandbytes"),
        _ => None,
    }
}

/// The `--kv-cache-dtype` value for an fp8 KV cache (`None` for any other: the engines' `auto`).
pub(crate) fn fp8_kv_cache_flag(kv: Option<DType>) -> Option<&'static str> {
    match kv {
        Some(DType::F8E4M3) => Some("fp8_e4m3"),
        Some(DType::F8E5M2) => Some("fp8_e5m2"),
        _ => None,
    }
}

/// The `--quantization` method both serving engines name for the workload's quantization.
fn serving_quantization(workload: &Workload, format: &str) -> Result<Option<&'static str>, InputError> {
    Ok(match &workload.quant {
        Quant::None => None,
        quant if quantization_flag(quant).is_some() => quantization_flag(quant),
        other => {
            return Err(refuse(
                format,
                format!("the workload's quantization {other:?} is not one vramplan writes for the engine"),
                "use --quant fp8, awq, gptq, int8 or nf4, or serve with llama.cpp (`--engine llama.cpp`)",
            ));
        }
    })
}

/// The model word of a serving command: the model's own source, or under a pre-quantized method
/// the checkpoint the user names (`whatif::checkpoint_word`).
fn serving_model(launch: &Launch) -> String {
    match &launch.prequantized {
        Some(method) => crate::whatif::checkpoint_word(launch.source.as_deref(), method),
        None => launch.model(),
    }
}

/// What the model must be for a quantization the engine reads from the checkpoint.
fn checkpoint_note(launch: &Launch) -> Option<String> {
    launch.prequantized.as_ref().map(|method| {
        format!(
            "The model must be a checkpoint already quantized with {method} (its config.json's quantization_config), not the model's own repository: set CHECKPOINT to it (the command stops, saying so, while CHECKPOINT is unset); fp8 and bitsandbytes quantize a plain checkpoint as it loads."
        )
    })
}

/// The `--kv-cache-dtype` both serving engines read.
fn serving_kv_dtype(workload: &Workload, format: &str) -> Result<&'static str, InputError> {
    if let Some(flag) = fp8_kv_cache_flag(workload.kv_dtype) {
        return Ok(flag);
    }
    Ok(match workload.kv_dtype {
        None => "auto",
        Some(d) if Some(d) == workload.weight_dtype => "auto",
        Some(other) => {
            return Err(refuse(
                format,
                format!(
                    "a {} KV cache beside other weights is not one the engine's flag names",
                    other.name()
                ),
                "leave --kv-dtype out (the compute dtype) or use fp8_e4m3 / fp8_e5m2",
            ));
        }
    })
}

/// The tensor-parallel size of a serving plan; a device map over several GPUs has none.
fn serving_tp(plan_gpus: usize, workload: &Workload, format: &str) -> Result<u32, InputError> {
    match workload.parallelism {
        Parallelism::Tensor { size, .. } => Ok(size.max(1)),
        Parallelism::Single if plan_gpus <= 1 => Ok(1),
        Parallelism::Single => Err(refuse(
            format,
            format!(
                "the plan splits one copy of the model over {plan_gpus} GPUs by a device map, which the engine does not read"
            ),
            format!("plan with tensor parallelism: `--parallel tp={plan_gpus}`"),
        )),
        _ => Err(refuse(
            format,
            "data parallelism (DDP, ZeRO, FSDP) is a training layout",
            "plan the serving workload with `--parallel tp=N` or `--parallel single`",
        )),
    }
}

fn serving_only(workload: &Workload, format: &str) -> Result<(), InputError> {
    if workload.mode == Mode::Train {
        let fix = "plan with `--mode inference`, or write a training launch: `--format deepspeed`, `fsdp` or `torchrun`";
        return Err(refuse(format, "the workload trains, and the engine serves", fix));
    }
    Ok(())
}

/// How many of the profile's nodes, taken in order, hold `ranks` GPUs (at least 1).
fn nodes_holding(gpus_per_node: &[u32], ranks: u32) -> u32 {
    let mut left = ranks;
    let mut nodes = 0;
    for gpus in gpus_per_node {
        if left == 0 {
            break;
        }
        left = left.saturating_sub(*gpus);
        nodes += 1;
    }
    nodes.max(1)
}

/// `vllm serve`: from a plan made under `--engine vllm`.
pub fn vllm(launch: &Launch, plan_gpus: usize) -> Result<Export, InputError> {
    let w = launch.workload;
    serving_only(w, "vllm")?;
    let Engine::Vllm { gpu_memory_utilization, max_num_batched_tokens } = w.engine else {
        return Err(refuse(
            "vllm",
            format!("the plan was sized for the {} engine, not vLLM's paged KV cache", engine_kind(w).0),
            "plan again with `--engine vllm`",
        ));
    };
    let tp = serving_tp(plan_gpus, w, "vllm")?;
    let pp = w.pipeline_parallel_size();
    // The ranks fill the profile's nodes in order; each node runs `vllm serve` with its share
    // (vLLM's multiprocessing backend across nodes: `--nnodes`, `--node-rank`, `--headless` on
    // all but node 0).
    let dp = w.data_parallel_size();
    let world = tp * pp * dp;
    let nodes = nodes_holding(&launch.gpus_per_node, world);
    // vLLM runs `world / nnodes` ranks on each node and refuses a world size `--nnodes` does not
    // divide (`EngineArgs`: "`--nnodes` must evenly divide the total world size").
    let per_node = world / nodes;
    if nodes > 1 && !world.is_multiple_of(nodes) {
        return Err(refuse(
            "vllm",
            format!(
                "its {world} ranks take {nodes} nodes, and vLLM's `--nnodes {nodes}` must divide the world size"
            ),
            format!("choose tp × pp × dp as a multiple of {nodes}"),
        ));
    }
    let mut line = Line::new("vllm serve");
    line.word(&serving_model(launch));
    line.arg("--tensor-parallel-size", tp).arg("--pipeline-parallel-size", pp);
    if dp > 1 {
        line.arg("--data-parallel-size", dp);
    }
    if w.vllm.enable_expert_parallel {
        line.word("--enable-expert-parallel");
    }
    if nodes > 1 {
        line.arg("--nnodes", nodes).arg("--master-addr", "$MASTER_ADDR");
    }
    line.arg("--dtype", serving_dtype(w, "vllm")?);
    if let Some(q) = serving_quantization(w, "vllm")? {
        line.arg("--quantization", q);
    }
    let o = &w.vllm;
    if o.max_model_len_auto {
        line.arg("--max-model-len", "auto");
    } else {
        line.arg("--max-model-len", w.seq);
    }
    line.arg("--gpu-memory-utilization", gpu_memory_utilization)
        .arg("--max-num-seqs", w.batch.max(1))
        .arg("--max-num-batched-tokens", max_num_batched_tokens)
        .arg("--kv-cache-dtype", serving_kv_dtype(w, "vllm")?);
    if o.enforce_eager {
        line.word("--enforce-eager");
    }
    if o.max_loras > 0 {
        line.word("--enable-lora");
        line.arg("--max-loras", o.max_loras)
            .arg("--max-lora-rank", vramplan_sim::engines::vllm_extras::lora_rank(o));
    }
    if let Some(bytes) = o.kv_cache_memory_bytes {
        line.arg("--kv-cache-memory-bytes", bytes);
    }
    if let Some(spec) = &o.speculative {
        let mut config = serde_json::json!({
            "method": spec.method,
            "num_speculative_tokens": spec.num_speculative_tokens,
        });
        if let Some(model) = &spec.model {
            config["model"] = serde_json::Value::from(model.as_str());
        }
        line.arg("--speculative-config", config.to_string());
    }
    let mut assumes = vec![
        format!(
            "Assumes vLLM {VLLM_VERSION} (flags checked against its `vllm serve` parser), CUDA GPUs as the plan's profile, the model reachable by vllm (Hub or local folder)."
        ),
        format!("Sized by vramplan for {} concurrent sequences of {} tokens.", w.batch.max(1), w.seq),
    ];
    if let Some(note) = checkpoint_note(launch) {
        assumes.push(note);
    }
    if let Some(spec) =
        w.vllm.speculative.as_ref().filter(|s| matches!(s.method.as_str(), "eagle" | "eagle3"))
    {
        assumes.push(format!(
            "Speculative decoding with an {} head sized as one decoder layer of the model's shapes: add the head's checkpoint to --speculative-config (`\"model\": \"…\"`), which vLLM needs.",
            spec.method.to_ascii_uppercase()
        ));
    }
    if nodes > 1 {
        assumes.push(format!(
            "Multi-node: {world} ranks (tensor parallel {tp} × pipeline parallel {pp} × data parallel {dp}) over {nodes} nodes, {per_node} on each, with vLLM's multiprocessing backend; run this on every node with NODE_RANK set and MASTER_ADDR the address of node 0, which serves the API (the others run headless)."
        ));
    }
    let lines: Vec<String> = (0..nodes)
        .map(|rank| {
            let mut node = Line(line.0.clone());
            if nodes > 1 {
                node.arg("--node-rank", rank);
                if rank > 0 {
                    node.word("--headless");
                }
            }
            node.0
        })
        .collect();
    Ok(Export { text: script(&assumes, &lines), launch: None, commands: lines })
}

/// `python -m sglang.launch_server`: from a serving plan made under `--engine sglang` (its
/// `--mem-fraction-static`, `--max-total-tokens`, `--dp-size`, `--ep-size`), or under
/// `--engine vllm`, whose sizing then stands in (the header says which).
pub fn sglang(launch: &Launch, plan_gpus: usize) -> Result<Export, InputError> {
    let w = launch.workload;
    serving_only(w, "sglang")?;
    let (kind, fields) = engine_kind(w);
    let (engine_dp, ep, max_total_tokens) = match w.engine {
        Engine::Sglang { dp_size, ep_size, max_total_tokens, .. } => (dp_size, ep_size, max_total_tokens),
        _ => (None, None, None),
    };
    let fraction = match kind.as_str() {
        "sglang" => fields.get("mem_fraction_static").and_then(serde_json::Value::as_f64),
        "vllm" => fields.get("gpu_memory_utilization").and_then(serde_json::Value::as_f64),
        _ => {
            return Err(refuse(
                "sglang",
                format!("the plan was sized for the {kind} engine, not a paged KV cache"),
                "plan again with `--engine vllm` (or `--engine sglang`)",
            ));
        }
    };
    let tp = serving_tp(plan_gpus, w, "sglang")?;
    if w.pipeline_parallel_size() > 1 {
        return Err(refuse(
            "sglang",
            "the plan was sized for vLLM's pipeline stages, which vramplan does not size under SGLang",
            "write it for vLLM (`--format vllm`), or plan tensor parallel only (`--parallel tp=N`)",
        ));
    }
    let total = launch.total_gpus().max(1);
    let dp = engine_dp.unwrap_or(total / tp).max(1);
    let nodes = launch.nodes().max(1);
    let mut lines = Vec::new();
    for rank in 0..nodes {
        let mut line = Line::new("python -m sglang.launch_server");
        line.arg("--model-path", serving_model(launch))
            .arg("--tp-size", tp)
            .arg("--dp-size", dp)
            .arg("--dtype", serving_dtype(w, "sglang")?)
            .arg("--context-length", w.seq)
            .arg("--max-running-requests", w.batch.max(1));
        if let Some(f) = fraction {
            line.arg("--mem-fraction-static", f);
        }
        if let Some(tokens) = max_total_tokens {
            line.arg("--max-total-tokens", tokens);
        }
        if let Some(ep) = ep.filter(|&e| e > 1) {
            line.arg("--ep-size", ep);
        }
        if let Some(q) = serving_quantization(w, "sglang")? {
            line.arg("--quantization", q);
        }
        line.arg("--kv-cache-dtype", serving_kv_dtype(w, "sglang")?);
        if nodes > 1 {
            line.arg("--nnodes", nodes)
                .arg("--node-rank", rank)
                .arg("--dist-init-addr", "$MASTER_ADDR:50000");
        }
        lines.push(line.0);
    }
    let mut assumes = vec![
        format!(
            "Assumes SGLang {SGLANG_VERSION} (flags checked against its ServerArgs parser), CUDA GPUs as the plan's profile."
        ),
        format!(
            "{dp} replica(s) of tensor parallel {tp} over {total} GPU(s), each sized by vramplan for {} sequences of {} tokens.",
            w.batch.max(1),
            w.seq
        ),
    ];
    if let Some(note) = checkpoint_note(launch) {
        assumes.push(note);
    }
    if kind == "sglang" && fraction.is_none() {
        assumes.push(
            "--mem-fraction-static left out: SGLang's default for the GPU's size, the one vramplan sized the token pool with.".into(),
        );
    }
    if kind == "vllm" {
        assumes.push(
            "Sized under vLLM's accounting: --mem-fraction-static is the plan's --gpu-memory-utilization (SGLang's share for weights and KV; leave it out for SGLang's default by GPU size).".into(),
        );
    }
    Ok(Export { text: script(&assumes, &lines), launch: None, commands: lines })
}

/// The ZeRO stage and offloads of a training plan, refused for other layouts.
fn zero(w: &Workload, format: &str) -> Result<(u8, bool, bool), InputError> {
    if w.mode != Mode::Train {
        return Err(refuse(
            format,
            "the workload serves (inference); the export launches training",
            format!(
                "plan with `--mode train`, or write `--format vllm` / `sglang` for serving{}",
                if format == "deepspeed" {
                    " (DeepSpeed's pipeline partition is `--format pipeline`)"
                } else {
                    ""
                }
            ),
        ));
    }
    match w.parallelism {
        Parallelism::Zero { stage, offload_optimizer, offload_params } => {
            Ok((stage, offload_optimizer, offload_params))
        }
        _ => Err(refuse(
            format,
            "the plan is not sharded data parallel",
            "plan with `--parallel zero1`, `zero2`, `zero3` or `fsdp` (or write `--format torchrun` for DDP; DeepSpeed's \
             pipeline partition is `--format pipeline`)",
        )),
    }
}

/// The mixed precision a training workload runs in: `bf16`, `fp16` or none.
fn precision(w: &Workload) -> Option<&'static str> {
    match w.autocast.or(w.weight_dtype) {
        Some(DType::BF16) => Some("bf16"),
        Some(DType::F16) => Some("fp16"),
        _ => None,
    }
}

/// torchrun's lines, one per node, running `script` with `args`.
fn torchrun_lines(launch: &Launch, format: &str, script_args: &[&str]) -> Result<Vec<String>, InputError> {
    let per_node = launch.per_node(format)?;
    let nodes = launch.nodes().max(1);
    Ok((0..nodes)
        .map(|rank| {
            let mut line = Line::new("torchrun");
            line.arg("--nnodes", nodes).arg("--nproc-per-node", per_node);
            if nodes > 1 {
                line.arg("--node-rank", rank)
                    .arg("--rdzv-backend", "c10d")
                    .arg("--rdzv-endpoint", format!("$MASTER_ADDR:{PORT}"))
                    .arg("--rdzv-id", "vramplan");
            }
            line.word("train.py");
            for a in script_args {
                line.word(a);
            }
            line.0
        })
        .collect())
}

fn training_assumes(launch: &Launch, what: &str, script: &str) -> Vec<String> {
    let w = launch.workload;
    let mut assumes = vec![
        format!("{what}, CUDA GPUs as the plan's profile, the same script and model on every node."),
        format!("train.py is your training script ({script})."),
        format!(
            "Sized by vramplan for micro-batch {} x {} tokens per GPU, {} accumulation step(s), {} GPU(s).",
            w.batch,
            w.seq,
            w.grad_accum.max(1),
            launch.total_gpus()
        ),
    ];
    if launch.nodes() > 1 {
        assumes.push(format!(
            "Multi-node: run this on every node with NODE_RANK set (0 to {}) and MASTER_ADDR the address of node 0, whose port {PORT} the others reach.",
            launch.nodes() - 1
        ));
    }
    assumes
}

/// The DeepSpeed config JSON, with its `torchrun` lines as the sibling script. `file` is the
/// name the config is written as, which the lines pass to `--deepspeed`.
pub fn deepspeed(launch: &Launch, file: &str) -> Result<Export, InputError> {
    let w = launch.workload;
    let (stage, offload_optimizer, offload_params) = zero(w, "deepspeed")?;
    hf_trainer_only(w, "deepspeed")?;
    let mut zero_cfg = serde_json::json!({ "stage": stage });
    if offload_optimizer {
        zero_cfg["offload_optimizer"] = serde_json::json!({"device": "cpu", "pin_memory": true});
    }
    if offload_params {
        zero_cfg["offload_param"] = serde_json::json!({"device": "cpu", "pin_memory": true});
    }
    let precision = precision(w);
    let config = serde_json::json!({
        "train_micro_batch_size_per_gpu": w.batch.max(1),
        "gradient_accumulation_steps": w.grad_accum.max(1),
        "bf16": {"enabled": precision == Some("bf16")},
        "fp16": {"enabled": precision == Some("fp16")},
        "zero_optimization": zero_cfg,
    });
    let lines = torchrun_lines(launch, "deepspeed", &["--deepspeed", file])?;
    let assumes = training_assumes(
        launch,
        &format!(
            "Assumes DeepSpeed {DEEPSPEED_VERSION} (the config parsed by its DeepSpeedConfig) and torch's torchrun"
        ),
        "an HF Trainer script takes `--deepspeed CONFIG`; the Trainer fills the config's `auto` values and the optimizer",
    );
    Ok(Export {
        text: serde_json::to_string_pretty(&config).unwrap_or_default() + "\n",
        launch: Some(script(&assumes, &lines)),
        commands: lines,
    })
}

/// The accelerate FSDP config YAML, with its `accelerate launch` lines as the sibling script.
/// `file` is the name the config is written as, which the lines pass to `--config_file`.
pub fn fsdp(launch: &Launch, file: &str) -> Result<Export, InputError> {
    let w = launch.workload;
    let (stage, offload_optimizer, offload_params) = zero(w, "fsdp")?;
    hf_trainer_only(w, "fsdp")?;
    let strategy = match stage {
        3 => "FULL_SHARD",
        2 => "SHARD_GRAD_OP",
        _ => {
            return Err(refuse(
                "fsdp",
                "FSDP has no stage that shards only the optimizer states (ZeRO-1)",
                "write `--format deepspeed`, or plan with `--parallel zero2` or `fsdp`",
            ));
        }
    };
    if offload_optimizer && !offload_params {
        return Err(refuse(
            "fsdp",
            "FSDP offloads the optimizer only together with the parameters (`CPUOffload(offload_params=True)`)",
            "write `--format deepspeed`, or add `--offload-params`",
        ));
    }
    let per_node = launch.per_node("fsdp")?;
    let nodes = launch.nodes().max(1);
    let mixed = precision(w).unwrap_or("no");
    let mut yaml = String::new();
    yaml += "# Written by vramplan plan -o: an accelerate config for FSDP.\n";
    yaml += &format!(
        "# Assumes accelerate {ACCELERATE_VERSION} (loaded by its config loader) and torch's FSDP v1; launch with the sibling .sh.\n"
    );
    yaml += "compute_environment: LOCAL_MACHINE\ndebug: false\ndistributed_type: FSDP\ndowncast_bf16: 'no'\n";
    yaml += "fsdp_config:\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_backward_prefetch: BACKWARD_PRE\n";
    yaml += "  fsdp_cpu_ram_efficient_loading: true\n  fsdp_forward_prefetch: false\n";
    yaml += &format!("  fsdp_offload_params: {offload_params}\n  fsdp_sharding_strategy: {strategy}\n");
    yaml += "  fsdp_state_dict_type: SHARDED_STATE_DICT\n  fsdp_sync_module_states: true\n  fsdp_use_orig_params: true\n  fsdp_version: 1\n";
    yaml +=
        &format!("gpu_ids: all\nmachine_rank: 0\nmain_training_function: main\nmixed_precision: '{mixed}'\n");
    yaml += &format!("num_machines: {nodes}\nnum_processes: {}\n", per_node * nodes);
    yaml += "rdzv_backend: static\nsame_network: true\ntpu_env: []\ntpu_use_cluster: false\ntpu_use_sudo: false\nuse_cpu: false\n";
    let lines: Vec<String> = (0..nodes)
        .map(|rank| {
            let mut line = Line::new("accelerate launch");
            line.arg("--config_file", file);
            if nodes > 1 {
                line.arg("--machine_rank", rank)
                    .arg("--main_process_ip", "$MASTER_ADDR")
                    .arg("--main_process_port", PORT);
            }
            line.word("train.py");
            line.0
        })
        .collect();
    let assumes = training_assumes(
        launch,
        &format!("Assumes accelerate {ACCELERATE_VERSION} with the FSDP config beside this script"),
        "one that runs under `accelerate launch`: an HF Trainer script, or one built on `Accelerator()`",
    );
    Ok(Export { text: yaml, launch: Some(script(&assumes, &lines)), commands: lines })
}

/// `torchrun` lines for DDP, one per node.
pub fn torchrun(launch: &Launch) -> Result<Export, InputError> {
    let w = launch.workload;
    if w.mode != Mode::Train || w.parallelism != Parallelism::Ddp {
        let why =
            if w.mode != Mode::Train { "the workload serves (inference)" } else { "the plan is not DDP" };
        return Err(refuse(
            "torchrun",
            why,
            "plan with `--mode train --parallel ddp`; for ZeRO or FSDP write `--format deepspeed` or `fsdp`, which carry their own launch lines",
        ));
    }
    hf_trainer_only(w, "torchrun")?;
    let lines = torchrun_lines(launch, "torchrun", &[])?;
    let assumes = training_assumes(
        launch,
        "Assumes torch's torchrun (torch >= 2.1) and DDP",
        "an HF Trainer script, or one that wraps the model in `DistributedDataParallel` on its LOCAL_RANK",
    );
    Ok(Export { text: script(&assumes, &lines), launch: None, commands: lines })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_words_are_quoted_where_needed() {
        assert_eq!(shell_word("meta-llama/Llama-3.1-8B"), "meta-llama/Llama-3.1-8B");
        assert_eq!(shell_word("$MASTER_ADDR:29500"), "\"$MASTER_ADDR:29500\"");
        assert_eq!(shell_word("my model"), "'my model'");
    }

    #[test]
    fn a_training_workload_has_no_vllm_line() {
        let w = Workload { mode: Mode::Train, engine: Engine::VLLM_DEFAULT, ..Workload::default() };
        let launch = Launch { source: None, prequantized: None, gpus_per_node: vec![1], workload: &w };
        let err = vllm(&launch, 1).unwrap_err();
        assert!(err.to_string().contains("trains"), "{err}");
    }
}
