//! What to type to run an answer: the arguments of the runtime the workload runs on, as data
//! (`vramplan-reports` lays them out as a command line or Python keywords).
//!
//! - transformers / TRL: `TrainingArguments` / `SFTConfig` (`per_device_train_batch_size`,
//!   `gradient_accumulation_steps` chosen to keep the question's effective batch, `max_length`,
//!   `gradient_checkpointing`, `bf16`/`fp16`, `optim`), `from_pretrained` (`dtype`,
//!   `quantization_config`, `attn_implementation`, `device_map` where the answer's map was
//!   solved), PEFT's `LoraConfig`; for inference, the batch and `max_length` of `generate`.
//! - vLLM: `vllm serve` flags (`--max-model-len`, `--gpu-memory-utilization`,
//!   `--tensor-parallel-size`, `--kv-cache-dtype`, `--quantization`, `--max-num-seqs`).
//! - llama.cpp: `llama-server` flags (`-c`, `-ngl`, `-ub`, `-fa`, `-ctk`/`-ctv`, `-np`).

use super::Fit;
use serde::Serialize;
use vramplan_profiles::DType;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::ModelDescription;
use vramplan_sim::workload::{
    AttentionImpl, Engine, Finetune, GradCheckpointing, Mode, Optimizer, Parallelism, Quant, Workload,
};

/// The arguments of one program or call, in order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunFlags {
    /// Where they go: `SFTConfig`, `from_pretrained`, `LoraConfig`, `generate`, `vllm serve`,
    /// `llama-server`.
    pub call: &'static str,
    /// `call` is a program run from a shell (its arguments are flags), not a Python call (its
    /// arguments are keywords).
    pub command_line: bool,
    /// `(name, value)`: a flag and its value for command lines (`--max-model-len`, `8192`; a
    /// positional argument or a switch has an empty value), a keyword and its Python literal for
    /// calls (`per_device_train_batch_size`, `4`).
    pub args: Vec<(String, String)>,
    /// The device map of the answer, for `from_pretrained(device_map=...)`.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "super::optional_map")]
    pub device_map: Option<Vec<(String, vramplan_sim::placement::Target)>>,
}

impl RunFlags {
    fn new(call: &'static str) -> RunFlags {
        RunFlags { call, command_line: false, args: Vec::new(), device_map: None }
    }

    fn command(program: &'static str) -> RunFlags {
        RunFlags { command_line: true, ..RunFlags::new(program) }
    }

    fn arg(&mut self, name: &str, value: impl ToString) {
        self.args.push((name.to_string(), value.to_string()));
    }

    /// Sets `name` to `value`, in place where it is already there, else at the end.
    pub fn set(&mut self, name: &str, value: String) {
        match self.args.iter_mut().find(|(n, _)| n == name) {
            Some(arg) => arg.1 = value,
            None => self.args.push((name.to_string(), value)),
        }
    }
}

/// The arguments that run `answer` (a workload derived from `question`, whose effective batch it
/// keeps) on `hardware`; `fit` is the answer's probe.
pub fn run_flags(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    question: &Workload,
    answer: &Workload,
    fit: &Fit,
) -> Vec<RunFlags> {
    match answer.engine {
        Engine::Transformers => transformers(model, question, answer, fit),
        Engine::Vllm { gpu_memory_utilization, .. } => vec![vllm(answer, gpu_memory_utilization)],
        Engine::LlamaCpp { n_ctx, n_ubatch } => vec![llamacpp(model, hardware, answer, n_ctx, n_ubatch)],
    }
}

fn transformers(
    model: &ModelDescription,
    question: &Workload,
    answer: &Workload,
    fit: &Fit,
) -> Vec<RunFlags> {
    let mut load = RunFlags::new("from_pretrained");
    load.arg("dtype", format!("torch.{}", answer.weight_dtype.unwrap_or(model.dtype).torch_name()));
    if let Some(config) = quantization_config(&answer.quant, false) {
        load.arg("quantization_config", config);
    }
    let attention = match answer.attention {
        AttentionImpl::Eager => "\"eager\"",
        AttentionImpl::Sdpa => "\"sdpa\"",
        AttentionImpl::Flash => "\"flash_attention_2\"",
    };
    load.arg("attn_implementation", attention);
    if let Some(map) = &fit.device_map {
        load.arg("device_map", "json.load(open(\"device_map.json\"))");
        load.device_map = Some(map.clone());
    } else {
        load.arg("device_map", "\"cuda:0\"");
    }
    let mut out = vec![load];
    if let Finetune::Lora { rank, alpha, targets } = &answer.finetune {
        let mut lora = RunFlags::new("LoraConfig");
        lora.arg("r", rank);
        lora.arg("lora_alpha", alpha);
        if !targets.is_empty() {
            let quoted: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
            lora.arg("target_modules", format!("[{}]", quoted.join(", ")));
        }
        out.push(lora);
    }
    match answer.mode {
        Mode::Train => {
            let mut args = RunFlags::new("SFTConfig");
            args.arg("per_device_train_batch_size", answer.batch);
            let effective = question.batch.saturating_mul(question.grad_accum.max(1));
            args.arg("gradient_accumulation_steps", effective.div_ceil(answer.batch.max(1)).max(1));
            args.arg("max_length", answer.seq);
            if answer.grad_checkpointing != GradCheckpointing::Off {
                args.arg("gradient_checkpointing", "True");
            }
            match answer.autocast {
                Some(DType::BF16) => args.arg("bf16", "True"),
                Some(DType::F16) => args.arg("fp16", "True"),
                _ => {}
            }
            args.arg("optim", optim(answer.optimizer));
            out.push(args);
        }
        Mode::Inference => {
            let mut generate = RunFlags::new("generate");
            generate.arg("batch_size", answer.batch);
            generate.arg("max_length", answer.seq);
            out.push(generate);
        }
    }
    out
}

/// transformers' `quantization_config` for `quant` as a Python literal (`BitsAndBytesConfig`,
/// or `FineGrainedFP8Config` for fp8); `cpu_offload` adds bitsandbytes' switch for modules kept
/// on the CPU (`llm_int8_enable_fp32_cpu_offload`). `None` for weights loaded as stored.
pub fn quantization_config(quant: &Quant, cpu_offload: bool) -> Option<String> {
    let offload = if cpu_offload { ", llm_int8_enable_fp32_cpu_offload=True" } else { "" };
    Some(match quant {
        Quant::Int8 => format!("BitsAndBytesConfig(load_in_8bit=True{offload})"),
        Quant::Nf4 { double_quant } | Quant::Fp4 { double_quant } => {
            let kind = if matches!(quant, Quant::Nf4 { .. }) { "nf4" } else { "fp4" };
            let double = if *double_quant { ", bnb_4bit_use_double_quant=True" } else { "" };
            format!("BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=\"{kind}\"{double}{offload})")
        }
        Quant::Fp8 { block } => format!("FineGrainedFP8Config(weight_block_size=({block}, {block}))"),
        _ => return None,
    })
}

/// The Trainer's `optim` name for the optimizer.
fn optim(optimizer: Optimizer) -> &'static str {
    match optimizer {
        Optimizer::Adamw => "\"adamw_torch\"",
        Optimizer::Adamw8bit => "\"adamw_bnb_8bit\"",
        Optimizer::PagedAdamw8bit => "\"paged_adamw_8bit\"",
        Optimizer::PagedAdamw => "\"paged_adamw_32bit\"",
        Optimizer::Sgd | Optimizer::SgdMomentum => "\"sgd\"",
        Optimizer::Adafactor => "\"adafactor\"",
    }
}

fn vllm(answer: &Workload, gpu_memory_utilization: f64) -> RunFlags {
    let mut serve = RunFlags::command("vllm serve");
    serve.arg("MODEL", "");
    serve.arg("--max-model-len", answer.seq);
    serve.arg("--gpu-memory-utilization", gpu_memory_utilization);
    if let Parallelism::Tensor { size } = answer.parallelism {
        serve.arg("--tensor-parallel-size", size);
    }
    if let Some(dtype) = answer.weight_dtype {
        serve.arg("--dtype", dtype.torch_name());
    }
    match answer.quant {
        Quant::Fp8 { .. } => serve.arg("--quantization", "fp8"),
        Quant::Nf4 { .. } | Quant::Int8 => serve.arg("--quantization", "bitsandbytes"),
        _ => {}
    }
    if let Some(kv) = answer.kv_dtype
        && matches!(kv, DType::F8E4M3 | DType::F8E5M2)
    {
        serve.arg("--kv-cache-dtype", if kv == DType::F8E4M3 { "fp8_e4m3" } else { "fp8_e5m2" });
    }
    serve
}

fn llamacpp(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    answer: &Workload,
    n_ctx: u64,
    n_ubatch: u64,
) -> RunFlags {
    let mut server = RunFlags::command("llama-server");
    let file_type = match &answer.quant {
        Quant::Gguf { quant_type } => quant_type.clone(),
        _ => match answer.weight_dtype.unwrap_or(model.dtype) {
            DType::F32 => "F32".into(),
            DType::BF16 => "BF16".into(),
            _ => "F16".into(),
        },
    };
    server.arg("-m", format!("{}-{file_type}.gguf", model.name));
    server.arg("-c", if n_ctx == 0 { answer.seq } else { n_ctx });
    // Every layer and the output layer on the GPUs, split by llama.cpp's default over all of them.
    server.arg("-ngl", model.facts.layers.len() + 1);
    if hardware.devices.len() > 1 {
        server.arg("--split-mode", "layer");
    }
    if n_ubatch != Engine::LLAMACPP_UBATCH {
        server.arg("-ub", n_ubatch);
    }
    if answer.attention == AttentionImpl::Flash {
        server.arg("-fa", "on");
    }
    if let Some(kv) = answer.kv_dtype {
        let name = match kv {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            _ => "f16",
        };
        server.arg("-ctk", name);
        server.arg("-ctv", name);
    }
    server
}
