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
//! - another program (`--trainer` torchtune, Unsloth, LitGPT or fsdp_qlora; AutoAWQ's fused
//!   runtime under `--awq-fused`): comments only, naming the settings in that program's own
//!   terms. Their command lines and calls were never run against the programs themselves, so
//!   none is printed as code (`tests/tests/run_snippets_trainers.rs`).
//! - a pre-quantized method (`--quant awq`, `gptq`; fp8 into a map with host entries): the
//!   `from_pretrained` call as a comment with `CHECKPOINT` in place of the model's repository,
//!   whose weights are not quantized, after a `# checkpoint:` comment saying what to give there;
//!   `vllm serve` and SGLang's `launch_server` with `"${CHECKPOINT:?…}"`, the checkpoint the
//!   user names in the shell (`tests/tests/run_snippets_prequantized.rs`).

use super::Fit;
use super::loading::{checkpoint_note, on_host, prequantized, prequantized_command, quantization_config};
use serde::Serialize;
use vramplan_profiles::DType;
use vramplan_profiles::hardware::HardwareProfile;
use vramplan_profiles::model::ModelDescription;
use vramplan_sim::workload::{
    AttentionImpl, Engine, Finetune, GradCheckpointing, Mode, Optimizer, Parallelism, Quant, Trainer,
    Workload,
};

/// The arguments of one program or call, in order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunFlags {
    /// What it calls: a program (`vllm serve`, `llama-server`, `torchrun`) or a Python callable
    /// (`LlamaForCausalLM.from_pretrained`, `LoraConfig`, `SFTConfig`); a Python comment
    /// (`#`) for what is said, not run.
    pub call: String,
    /// `call` is a program run from a shell (its arguments are flags), not a Python call (its
    /// arguments are keywords).
    pub command_line: bool,
    /// The Python name the call's result is bound to (`model`, `peft_config`, `args`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub assign: Option<&'static str>,
    /// Positional arguments, before the keywords (the model's repository).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub positional: Vec<String>,
    /// `(name, value)`: a flag and its value for command lines (`--max-model-len`, `8192`; a
    /// positional argument or a switch has an empty value), a keyword and its Python literal for
    /// calls (`per_device_train_batch_size`, `4`).
    pub args: Vec<(String, String)>,
    /// What the Python call needs imported: `(module, name)` (`("transformers",
    /// "LlamaForCausalLM")`; a plain `import torch` is `("torch", "")`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub imports: Vec<(String, String)>,
    /// The device map of the answer, for `from_pretrained(device_map=...)`.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "super::optional_map")]
    pub device_map: Option<Vec<(String, vramplan_sim::placement::Target)>>,
}

impl RunFlags {
    pub(super) fn new(call: impl Into<String>) -> RunFlags {
        RunFlags {
            call: call.into(),
            command_line: false,
            assign: None,
            positional: Vec::new(),
            args: Vec::new(),
            imports: Vec::new(),
            device_map: None,
        }
    }

    pub(super) fn command(program: &'static str) -> RunFlags {
        RunFlags { command_line: true, ..RunFlags::new(program) }
    }

    pub(super) fn arg(&mut self, name: &str, value: impl ToString) {
        self.args.push((name.to_string(), value.to_string()));
    }

    pub(super) fn import(&mut self, module: &str, name: &str) {
        let import = (module.to_string(), name.to_string());
        if !self.imports.contains(&import) {
            self.imports.push(import);
        }
    }

    /// Sets `name` to `value`, in place where it is already there, else at the end; a comment
    /// (`#`) takes no arguments.
    pub fn set(&mut self, name: &str, value: String) {
        if self.call == "#" {
            return;
        }
        match self.args.iter_mut().find(|(n, _)| n == name) {
            Some(arg) => arg.1 = value,
            None => self.args.push((name.to_string(), value)),
        }
    }
}

/// What `from_pretrained` is given for the model: its Hub repository for a built-in, the
/// folder of a `config.json` or model folder, and nothing for a custom model, which has no
/// transformers class to load it with.
pub fn pretrained_source(model: &ModelDescription) -> Option<String> {
    use vramplan_profiles::model::catalog;
    // A generic model's class is not one transformers has (`model_type` `generic`): it loads
    // with the code that defines it, as a custom model does.
    if model.custom || model.facts.model_type == "generic" {
        return None;
    }
    if let Some((_, repo)) = catalog::builtin_entries().into_iter().find(|(name, _)| *name == model.name) {
        return Some(repo.to_string());
    }
    let path = std::path::Path::new(&model.name);
    let extension = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    match extension.as_deref() {
        Some("yaml" | "yml") => None,
        Some("json") => Some(
            path.parent()
                .filter(|p| !p.as_os_str().is_empty())
                .map_or_else(|| ".".to_string(), |p| p.display().to_string()),
        ),
        _ => Some(model.name.clone()),
    }
}

/// What a model's class trains as: a causal LM (TRL's `SFTConfig`, PEFT's `CAUSAL_LM`), an
/// encoder-decoder (`SEQ_2_SEQ_LM`), or another head (the Trainer's `TrainingArguments`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    CausalLm,
    Seq2Seq,
    Other,
}

fn kind(model: &ModelDescription) -> Kind {
    let a = model.architecture.as_str();
    if a.ends_with("ForCausalLM") || (a.ends_with("LMHeadModel") && a != "XLNetLMHeadModel") {
        Kind::CausalLm
    } else if a.ends_with("ForConditionalGeneration") && model.facts.model_type == "t5" {
        Kind::Seq2Seq
    } else {
        Kind::Other
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
        Engine::Transformers => match own_program(model, hardware, question, answer) {
            Some(note) => vec![note],
            None => transformers(model, hardware, question, answer, fit),
        },
        Engine::Vllm { gpu_memory_utilization, .. } => {
            vec![prequantized_command(model, answer, vllm(model, answer, gpu_memory_utilization))]
        }
        Engine::Sglang { .. } => vec![prequantized_command(model, answer, sglang(model, answer))],
        Engine::LlamaCpp { n_ctx, n_ubatch } => vec![llamacpp(model, hardware, answer, n_ctx, n_ubatch)],
    }
}

/// Where `answer` runs under a program of its own rather than transformers/TRL (a `--trainer`
/// other than `transformers`, or AutoAWQ's fused runtime under `--awq-fused`), one comment
/// saying what to set there in that program's terms, and that vramplan prints no code for it:
/// the transformers/TRL lines would run another program than the one the estimate models, and
/// that program's own lines were never run here. `None` for transformers/TRL.
fn own_program(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    question: &Workload,
    answer: &Workload,
) -> Option<RunFlags> {
    let (per_device, steps) = accumulation(question, answer);
    let seq = answer.seq.saturating_add(answer.image_tokens(model));
    let (program, settings) = match (answer.awq_fused, answer.trainer, answer.mode) {
        (Some(max_seq_len), _, Mode::Inference) => (
            "AutoAWQ".to_string(),
            format!(
                "AutoAWQForCausalLM.from_quantized(..., fuse_layers=True, max_seq_len={max_seq_len}, batch_size={b}) \
                 (AutoAWQ 0.2; max_new_tokens={max_seq_len} in 0.1), then up to {b} sequences of up to {seq} tokens \
                 at a time",
                b = answer.batch
            ),
        ),
        (_, Trainer::Transformers, _) => return None,
        (_, trainer, Mode::Inference) => (
            vramplan_sim::input::trainer_word(trainer).to_string(),
            format!("up to {} sequences of up to {seq} tokens at a time", answer.batch),
        ),
        (_, Trainer::Torchtune, Mode::Train) => (
            "torchtune".to_string(),
            format!(
                "batch_size={per_device}, gradient_accumulation_steps={steps}, tokenizer.max_seq_len={seq} \
                 in your recipe's config"
            ),
        ),
        (_, Trainer::Unsloth, Mode::Train) => (
            "Unsloth".to_string(),
            format!(
                "FastLanguageModel.from_pretrained(..., max_seq_length={seq}), then TRL's \
                 SFTConfig(per_device_train_batch_size={per_device}, gradient_accumulation_steps={steps}, \
                 max_length={seq})"
            ),
        ),
        (_, Trainer::Litgpt, Mode::Train) => {
            // LitGPT accumulates global_batch_size / devices / micro_batch_size steps.
            let ranks = match answer.parallelism {
                Parallelism::Ddp | Parallelism::Zero { .. } => hardware.devices.len().max(1) as u64,
                _ => 1,
            };
            (
                "LitGPT".to_string(),
                format!(
                    "litgpt finetune ... --train.micro_batch_size {per_device} --train.global_batch_size {} \
                     --train.max_seq_length {seq}",
                    per_device.saturating_mul(steps).saturating_mul(ranks)
                ),
            )
        }
        (_, Trainer::FsdpQlora, Mode::Train) => (
            "fsdp_qlora".to_string(),
            format!(
                "train.py ... --batch_size {per_device} --gradient_accumulation_steps {steps} \
                 --context_length {seq}"
            ),
        ),
    };
    let mut note = RunFlags::new("#");
    note.arg(&format!("{program} run"), settings);
    note.arg(
        "not printed as code",
        format!(
            "vramplan prints runnable code for transformers/TRL, vLLM, SGLang and llama.cpp only; \
             set these in {program}'s own launch"
        ),
    );
    if answer.mode == Mode::Train
        && let Some(batch) = effective_batch_note(question, answer)
    {
        note.arg("effective batch", batch);
    }
    Some(note)
}

fn transformers(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    question: &Workload,
    answer: &Workload,
    fit: &Fit,
) -> Vec<RunFlags> {
    let kind = kind(model);
    let data_parallel = matches!(answer.parallelism, Parallelism::Ddp | Parallelism::Zero { .. });
    let mut out = Vec::new();
    if data_parallel && answer.mode == Mode::Train {
        // One process per GPU, each loading the model whole on its own.
        let mut launch = RunFlags::command("torchrun");
        launch.arg("--nproc-per-node", hardware.devices.len().max(1));
        launch.arg("train.py", "");
        out.push(launch);
    }
    match pretrained_source(model) {
        Some(source) => {
            let mut load = RunFlags::new(format!("{}.from_pretrained", model.architecture));
            load.assign = Some("model");
            load.import("transformers", &model.architecture);
            load.positional.push(format!("{source:?}"));
            load.import("torch", "");
            load.arg("dtype", format!("torch.{}", answer.weight_dtype.unwrap_or(model.dtype).torch_name()));
            if let Some(config) = quantization_config(&answer.quant, false) {
                let class = config.split('(').next().unwrap_or_default().to_string();
                load.import("transformers", &class);
                load.arg("quantization_config", config);
            }
            // SDPA is what transformers picks where a class supports it and eager where it does
            // not (Gemma 2, XLNet), while naming it for such a class raises: only another choice
            // is written.
            match answer.attention {
                AttentionImpl::Eager => load.arg("attn_implementation", "\"eager\""),
                AttentionImpl::Flash => load.arg("attn_implementation", "\"flash_attention_2\""),
                AttentionImpl::Sdpa => {}
            }
            if data_parallel {
                load.import("os", "");
                load.arg("device_map", "{\"\": int(os.environ[\"LOCAL_RANK\"])}");
            } else if let Some(map) = &fit.device_map {
                load.import("json", "");
                load.arg("device_map", "json.load(open(\"device_map.json\"))");
                load.device_map = Some(map.clone());
            } else {
                load.arg("device_map", "\"cuda:0\"");
            }
            // AWQ and GPTQ weights come from a checkpoint quantized that way: the model's own
            // repository would load unquantized weights, so the call is a comment naming it.
            let host = fit.device_map.as_deref().is_some_and(on_host);
            match prequantized(model, &answer.quant, host) {
                Some(method) => {
                    let map_note = load.device_map.is_some();
                    out.push(checkpoint_note(load, &source, &method));
                    if map_note {
                        let mut note = RunFlags::new("#");
                        note.arg(
                            "device_map.json",
                            "write it with `vramplan plan` and the same flags, `-o device_map.json`",
                        );
                        out.push(note);
                    }
                }
                None => out.push(load),
            }
        }
        None => {
            let mut note = RunFlags::new("#");
            if model.facts.model_type == "generic" {
                note.arg(
                    "a generic model",
                    format!(
                        "`{}` is not a transformers class: load it with the code that defines it \
                         (`trust_remote_code=True` where its repository ships that code) and move it to the GPU",
                        model.architecture
                    ),
                );
            } else {
                note.arg(
                    "a custom model",
                    "build it with your own class and move it to the GPU; no transformers class loads it",
                );
            }
            out.push(note);
        }
    }
    if let Finetune::Lora { rank, alpha, targets } = &answer.finetune {
        let mut lora = RunFlags::new("LoraConfig");
        lora.assign = Some("peft_config");
        lora.import("peft", "LoraConfig");
        lora.arg("r", rank);
        lora.arg("lora_alpha", alpha);
        match targets.as_slice() {
            [] => {}
            // PEFT takes the keyword `all-linear` as a string only: the list `["all-linear"]`
            // names a module called `all-linear` and raises `NoMatchingPeftModuleError`.
            [all] if all == "all-linear" => lora.arg("target_modules", "\"all-linear\""),
            targets => {
                let quoted: Vec<String> = targets.iter().map(|t| format!("{t:?}")).collect();
                lora.arg("target_modules", format!("[{}]", quoted.join(", ")));
            }
        }
        match kind {
            Kind::CausalLm => lora.arg("task_type", "\"CAUSAL_LM\""),
            Kind::Seq2Seq => lora.arg("task_type", "\"SEQ_2_SEQ_LM\""),
            Kind::Other => {}
        }
        out.push(lora);
    }
    match answer.mode {
        Mode::Train => {
            // TRL's `SFTConfig` for a causal LM (it takes the sequence length); the Trainer's
            // `TrainingArguments` for any other head, whose inputs the tokenizer cuts.
            let mut args = if kind == Kind::CausalLm {
                let mut args = RunFlags::new("SFTConfig");
                args.import("trl", "SFTConfig");
                args
            } else {
                let mut args = RunFlags::new("TrainingArguments");
                args.import("transformers", "TrainingArguments");
                args
            };
            args.assign = Some("args");
            let (per_device, steps) = accumulation(question, answer);
            args.arg("output_dir", "\"out\"");
            args.arg("per_device_train_batch_size", per_device);
            args.arg("gradient_accumulation_steps", steps);
            if kind == Kind::CausalLm {
                args.arg("max_length", answer.seq);
            }
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
            let mut notes = RunFlags::new("#");
            if let Some(images) = images_note(model, answer) {
                notes.arg("sequences", images);
            } else if kind != Kind::CausalLm {
                notes.arg("sequences", format!("tokenize to max_length={}, truncation=True", answer.seq));
            }
            if let Some(note) = effective_batch_note(question, answer) {
                notes.arg("effective batch", note);
            }
            if !notes.args.is_empty() {
                out.push(notes);
            }
        }
        Mode::Inference => {
            let mut generate = RunFlags::new("#");
            if let Some(images) = images_note(model, answer) {
                generate.arg("prompts", images);
            }
            generate.arg(
                "generate",
                format!(
                    "up to {} sequences of up to {} tokens at a time (max_length={})",
                    answer.batch,
                    answer.seq.saturating_add(answer.image_tokens(model)),
                    answer.seq.saturating_add(answer.image_tokens(model))
                ),
            );
            out.push(generate);
        }
    }
    out
}

/// How to run `answer.batch` sequences per device (the most that fit) at the question's effective
/// batch (per device × accumulation): `(per device, accumulation steps)`. Where the effective
/// batch is at most what fits, all of it per device; else the largest divisor of it that fits,
/// unless that wastes more than half of what fits (a prime effective batch), where what fits is
/// used and the effective batch rounds up.
pub fn accumulation(question: &Workload, answer: &Workload) -> (u64, u64) {
    let effective = question.batch.saturating_mul(question.grad_accum.max(1)).max(1);
    let fits = answer.batch.max(1);
    if effective <= fits {
        return (effective, 1);
    }
    let divisor = (1..=fits).rev().find(|d| effective.is_multiple_of(*d)).unwrap_or(1);
    if 2 * divisor >= fits { (divisor, effective / divisor) } else { (fits, effective.div_ceil(fits)) }
}

/// What the training lines' batch does to the question's effective batch, where a reader needs
/// telling: not kept (a prime effective batch), kept with room for more per device, or kept by
/// a divisor under what fits.
fn effective_batch_note(question: &Workload, answer: &Workload) -> Option<String> {
    let (per_device, steps) = accumulation(question, answer);
    let asked = question.batch.saturating_mul(question.grad_accum.max(1)).max(1);
    if !keeps_effective_batch(question, answer) {
        Some(format!(
            "{} ({per_device} per device × {steps} steps), not the {asked} asked for: its divisors that \
             fit waste more than half of the {} that do",
            per_device.saturating_mul(steps),
            answer.batch
        ))
    } else if per_device < answer.batch && steps == 1 {
        Some(format!("{asked} as asked; up to {} per device fit, for a larger effective batch", answer.batch))
    } else if per_device < answer.batch {
        Some(format!(
            "{asked} as asked: {per_device} per device, the largest divisor of it within the {} that fit",
            answer.batch
        ))
    } else {
        None
    }
}

/// Whether [`accumulation`] keeps the question's effective batch exactly.
pub fn keeps_effective_batch(question: &Workload, answer: &Workload) -> bool {
    let (per_device, steps) = accumulation(question, answer);
    per_device.saturating_mul(steps) == question.batch.saturating_mul(question.grad_accum.max(1)).max(1)
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

fn vllm(model: &ModelDescription, answer: &Workload, gpu_memory_utilization: f64) -> RunFlags {
    let mut serve = RunFlags::command("vllm serve");
    serve.arg(&pretrained_source(model).unwrap_or_else(|| "MODEL".into()), "");
    serve.arg("--max-model-len", answer.seq);
    serve.arg("--gpu-memory-utilization", gpu_memory_utilization);
    if let Parallelism::Tensor { size, pipeline } = answer.parallelism {
        serve.arg("--tensor-parallel-size", size);
        if pipeline > 1 {
            serve.arg("--pipeline-parallel-size", pipeline);
        }
    }
    if let Some(dtype) = answer.weight_dtype {
        serve.arg("--dtype", dtype.torch_name());
    }
    // fp8 and bitsandbytes quantize a plain checkpoint as vLLM loads it; AWQ and GPTQ name a
    // checkpoint quantized that way, which vLLM reads from its config.
    if let Some(method) = crate::export::launch::quantization_flag(&answer.quant)
        .filter(|_| matches!(answer.quant, Quant::Fp8 { .. } | Quant::Nf4 { .. } | Quant::Int8))
    {
        serve.arg("--quantization", method);
    }
    if let Some(kv) = crate::export::launch::fp8_kv_cache_flag(answer.kv_dtype) {
        serve.arg("--kv-cache-dtype", kv);
    }
    serve
}

/// SGLang's `launch_server` line: the context (`--context-length`), the engine's settings as
/// given (a fraction left out is SGLang's default by GPU size), the parallel sizes.
fn sglang(model: &ModelDescription, answer: &Workload) -> RunFlags {
    let mut serve = RunFlags::command("python -m sglang.launch_server");
    serve.arg("--model-path", pretrained_source(model).unwrap_or_else(|| "MODEL".into()));
    serve.arg("--context-length", answer.seq);
    if let Engine::Sglang { mem_fraction_static, max_total_tokens, dp_size, ep_size } = answer.engine {
        if let Some(fraction) = mem_fraction_static {
            serve.arg("--mem-fraction-static", fraction);
        }
        if let Some(tokens) = max_total_tokens {
            serve.arg("--max-total-tokens", tokens);
        }
        if let Parallelism::Tensor { size, .. } = answer.parallelism {
            serve.arg("--tp-size", size);
        }
        if let Some(dp) = dp_size.filter(|&d| d > 1) {
            serve.arg("--dp-size", dp);
        }
        if let Some(ep) = ep_size.filter(|&e| e > 1) {
            serve.arg("--ep-size", ep);
        }
    }
    if let Some(dtype) = answer.weight_dtype {
        serve.arg("--dtype", dtype.torch_name());
    }
    // As for vLLM: fp8 and bitsandbytes quantize a plain checkpoint as SGLang loads it.
    if let Some(method) = crate::export::launch::quantization_flag(&answer.quant)
        .filter(|_| matches!(answer.quant, Quant::Fp8 { .. } | Quant::Nf4 { .. } | Quant::Int8))
    {
        serve.arg("--quantization", method);
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
    match vramplan_profiles::model::gguf::launch_files(&model.name) {
        Some((file, projector)) if vramplan_profiles::model::gguf::is_gguf_model(model) => {
            server.arg("-m", file.display());
            if let Some(projector) = projector {
                server.arg("--mmproj", projector.display());
            }
        }
        // A Hub repository's GGUF (`org/name:Q4_K_M`): llama.cpp fetches it itself, with its
        // projector, from the same spelling.
        None if vramplan_profiles::model::gguf::is_gguf_model(model) => server.arg("-hf", &model.name),
        _ => server.arg("-m", format!("{}-{file_type}.gguf", model.name)),
    }
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

/// What a vision-language sample holds, for the notes: its text tokens, its images as the model's
/// processor counts them, and the sequence they make together.
fn images_note(model: &ModelDescription, answer: &Workload) -> Option<String> {
    let images = answer.images.as_ref()?;
    let vision = model.facts.vision.as_ref()?;
    let image = vision.image_tokens(images.width, images.height)?;
    Some(format!(
        "{} text tokens and {} image(s) of {}x{} (resized to {}x{}: {} tokens each) per sample, {} tokens in all",
        answer.seq,
        images.per_sample,
        images.width,
        images.height,
        image.resized.1,
        image.resized.0,
        image.tokens,
        answer.seq.saturating_add(answer.image_tokens(model))
    ))
}
