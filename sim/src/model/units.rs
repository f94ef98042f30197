//! Placement units and what each holds between steps: weights as stored on the GPU (with the
//! workload's quantization applied to linear layers), trainable parameters (all, or LoRA
//! adapters), their gradients and optimizer states. A unit is a block (a decoder layer, never
//! split) or a module outside the blocks that holds tensors (embeddings, final norm, head).

use super::precision::Precision;
use crate::placement::covers;
use crate::workload::{Finetune, Mode, Optimizer, Parallelism, Quant, Trainer, Workload};
use vramplan_profiles::DType;
use vramplan_profiles::model::{ModelDescription, Module, ModuleKind, StackKind, TensorKind, join};

/// What a unit is, for the step program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnitKind {
    /// The block at this index of `facts.layers`.
    Block(usize),
    Embedding,
    /// The output projection to the vocabulary (its logits feed the loss).
    Head,
    Other,
}

/// One placement unit.
#[derive(Debug, Clone)]
pub(crate) struct Unit {
    pub path: String,
    /// The `device_map` keys that place it, a set of disjoint prefixes (transformers 5.x leaves
    /// a parent's weights on the meta device when its own key sits beside its children's): the
    /// module's path, or for a parent's own tensors their full names; then the modules whose
    /// tensors are all tied to this unit's (T5's `encoder.embed_tokens`), which load with it.
    /// The first key finds the unit in a placement.
    pub keys: Vec<String>,
    pub kind: UnitKind,
    /// Bytes of each weight tensor as held (quantized, cast), in order: the allocations of load.
    pub weight_tensors: Vec<u64>,
    /// For each of `weight_tensors`, the full name of the tensor whose device it takes: its own
    /// (`model.layers.0.mlp.down_proj.weight`, a buffer's too), or for a LoRA adapter its base
    /// layer's weight (PEFT puts each adapter on the device of the layer it wraps). A device map
    /// may place every one apart (`Resolved` reads them with accelerate's rule).
    pub placed_by: Vec<String>,
    /// Trainable tensors' element counts (full fine-tune: the unit's parameters; LoRA: A and B
    /// of each adapter).
    pub trainable_tensors: Vec<TrainableTensor>,
    /// Parameters of the unit's linear layers that autocast copies to half precision.
    pub autocast_params: u64,
    /// Parameters of the largest quantized linear (dequantized transiently in forward).
    pub largest_quantized_linear: u64,
    /// Bytes of `weight_tensors` that are bitsandbytes' quantization state (absmax, nested
    /// absmax): no parameters, so FSDP neither flattens nor shards them (`fsdp.rs`).
    pub quant_constants: u64,
    /// A rotary embedding outside the blocks: the model's forward computes it from the positions
    /// before its first layer (`position_embeddings = self.rotary_emb(...)`), beside the hidden
    /// states, which do not pass through it.
    pub side: bool,
}

/// A trainable tensor: its element count, its 2-D shape where it has one (Adafactor factors it),
/// and which of its unit's `weight_tensors` it is (its gradient and optimizer states live on that
/// tensor's device).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TrainableTensor {
    pub numel: u64,
    pub rows_cols: Option<(u64, u64)>,
    pub weight: usize,
}

impl Unit {
    pub(crate) fn weight_bytes(&self) -> u64 {
        self.weight_tensors.iter().sum()
    }

    pub(crate) fn trainable_params(&self) -> u64 {
        self.trainable_tensors.iter().map(|t| t.numel).sum()
    }
}

/// The dtype of trainable tensors, their gradients and (for torch optimizers) their states.
pub(crate) fn trainable_dtype(workload: &Workload, precision: &Precision) -> DType {
    match (&workload.finetune, workload.trainer) {
        // PEFT creates adapters in fp32 when the base is half (`autocast_adapter_dtype=True`,
        // the default since PEFT 0.12); torchtune builds them in the model's dtype.
        // Unsloth upcasts every `lora_A`/`lora_B` to fp32 (`prepare_model_for_training`).
        // fsdp_qlora's `get_peft_model` is PEFT's, with the same default.
        (Finetune::Lora { .. }, Trainer::Transformers | Trainer::Unsloth | Trainer::FsdpQlora) => DType::F32,
        _ => precision.weights,
    }
}

/// Optimizer-state bytes for the given trainable tensors of dtype `dtype`.
fn optimizer_bytes(optimizer: Optimizer, tensors: &[TrainableTensor], dtype: DType) -> u64 {
    let bytes = dtype.bits() / 8;
    tensors
        .iter()
        .map(|t| match optimizer {
            // torch.optim.AdamW: exp_avg and exp_avg_sq in the parameter's dtype.
            Optimizer::Adamw => 2 * bytes * t.numel,
            // bitsandbytes' 32-bit Adam keeps both states in fp32 whatever the parameter's dtype
            // (`Optimizer2State.init_state`: `optim_bits == 32` → `torch.float32`).
            Optimizer::PagedAdamw => 2 * 4 * t.numel,
            // bitsandbytes 8-bit Adam: two uint8 states plus an fp32 absmax per 2048-value block;
            // tensors under 4096 values keep 32-bit states (`min_8bit_size=4096`).
            Optimizer::Adamw8bit | Optimizer::PagedAdamw8bit => {
                if t.numel < 4096 {
                    8 * t.numel
                } else {
                    2 * t.numel + 2 * 4 * t.numel.div_ceil(2048)
                }
            }
            Optimizer::Sgd => 0,
            Optimizer::SgdMomentum => bytes * t.numel,
            // Adafactor (transformers): fp32 row and column second-moment factors for matrices,
            // a full fp32 second moment for vectors; no first moment (beta1=None).
            Optimizer::Adafactor => match t.rows_cols {
                Some((rows, cols)) => 4 * (rows + cols),
                None => 4 * t.numel,
            },
        })
        .sum()
}

/// Bytes of the optimizer states a paged bitsandbytes optimizer keeps in CUDA managed memory,
/// outside PyTorch's allocator: `get_state_buffer` pages the two state buffers of every tensor
/// of at least 10⁵ values (`F.get_paged`, `cudaMallocManaged`); smaller tensors' states and the
/// 8-bit absmax blocks are ordinary tensors. Part of [`optimizer_state_bytes`].
pub(crate) fn paged_state_bytes(optimizer: Optimizer, tensors: &[TrainableTensor]) -> u64 {
    let per_value = match optimizer {
        Optimizer::PagedAdamw8bit => 2,
        Optimizer::PagedAdamw => 2 * 4,
        _ => return 0,
    };
    tensors.iter().filter(|t| t.numel >= 100_000).map(|t| per_value * t.numel).sum()
}

/// Optimizer-state bytes of `tensors` (of dtype `dtype`) under the workload's optimizer,
/// including DeepSpeed's fp32 master weights: with ZeRO, half-precision training keeps an fp32
/// copy of the trainable weights and the optimizer's states on it in fp32 (ZeRO §3.1: K = 12
/// bytes per parameter for Adam).
pub(crate) fn optimizer_state_bytes(workload: &Workload, tensors: &[TrainableTensor], dtype: DType) -> u64 {
    let deepspeed_master = matches!(workload.parallelism, Parallelism::Zero { .. }) && dtype.bits() < 32;
    if deepspeed_master {
        let params: u64 = tensors.iter().map(|t| t.numel).sum();
        4 * params + optimizer_bytes(workload.optimizer, tensors, DType::F32)
    } else {
        optimizer_bytes(workload.optimizer, tensors, dtype)
    }
}

/// Bytes of a linear weight of `out × in` stored under `quant`, its bias excluded.
fn quantized_linear_bytes(quant: &Quant, out: u64, inp: u64, half_bytes: u64) -> Option<u64> {
    let params = out * inp;
    Some(match quant {
        Quant::None | Quant::Gguf { .. } => return None,
        // LLM.int8: int8 weight and an fp32 scale per output row (`SCB`).
        Quant::Int8 => params + 4 * out,
        // bitsandbytes 4-bit: two values per byte, an fp32 absmax per 64-value block; double
        // quantization stores the absmax as uint8 with an fp32 scale per 256 blocks (QLoRA §3).
        Quant::Nf4 { .. } | Quant::Fp4 { .. } => params.div_ceil(2) + bnb4_constant_bytes(quant, params),
        // GPTQ/AWQ: `bits`-bit values packed in int32, an fp16 scale and a packed zero per group
        // and output; GPTQ also keeps an int32 `g_idx` per input.
        Quant::Gptq { bits, group_size } | Quant::Awq { bits, group_size } => {
            let bits = u64::from(*bits);
            let groups = inp.div_ceil(u64::from((*group_size).max(1)));
            let packed = (params * bits).div_ceil(8);
            let scales = half_bytes * groups * out;
            let zeros = (groups * out * bits).div_ceil(8);
            let g_idx = if matches!(quant, Quant::Gptq { .. }) { 4 * inp } else { 0 };
            packed + scales + zeros + g_idx
        }
        // Block fp8: one byte per value and an fp32 scale per block×block tile.
        Quant::Fp8 { block } => {
            let block = u64::from((*block).max(1));
            params + 4 * out.div_ceil(block) * inp.div_ceil(block)
        }
    })
}

/// Bytes of the quantization state bitsandbytes keeps beside a 4-bit weight of `params` values:
/// an fp32 absmax per 64-value block, or with double quantization a uint8 absmax per block and
/// an fp32 scale per 256 blocks (QLoRA §3); 0 for other quantizations.
fn bnb4_constant_bytes(quant: &Quant, params: u64) -> u64 {
    match quant {
        Quant::Nf4 { double_quant } | Quant::Fp4 { double_quant } => {
            let blocks = params.div_ceil(64);
            if *double_quant { blocks + 4 * blocks.div_ceil(256) } else { 4 * blocks }
        }
        _ => 0,
    }
}

/// The placement units of `model` in execution order, with what each holds under `workload`.
/// `lora_targets` are the module paths LoRA wraps (empty for a full fine-tune).
pub(crate) fn units(
    model: &ModelDescription,
    workload: &Workload,
    precision: &Precision,
    lora_targets: &[String],
) -> Vec<Unit> {
    let mut out = Vec::new();
    let mut aliases = Vec::new();
    let head_path = head_path(model);
    collect(
        model,
        &model.root,
        workload,
        precision,
        lora_targets,
        head_path.as_deref(),
        &mut out,
        &mut aliases,
    );
    // A module whose tensors are all tied to another unit's loads on that unit's device.
    for (alias, target) in aliases {
        if let Some(unit) = out.iter_mut().find(|u| u.keys.iter().any(|k| covers(k, &target))) {
            unit.keys.push(alias);
        }
    }
    // A vision tower defined after the language model's layers (Phi-4 multimodal's, under
    // `model.embed_tokens_extend`, which `Phi4MultimodalModel.forward` runs on the input
    // embeddings before its first layer) runs before them: its units, and those of the module
    // holding it with its projections (`VisionFacts::runs_first`), move ahead of the first
    // language block.
    let runs_first = model.facts.vision.as_ref().and_then(|v| v.runs_first.as_deref());
    let language = |u: &Unit| matches!(u.kind, UnitKind::Block(layer) if model.facts.layers[layer].stack != StackKind::Vision);
    if let Some(first) = out.iter().position(language) {
        let (mut moved, mut i) = (0, first);
        while i < out.len() {
            let path = out[i].path.as_str();
            let beside = runs_first.is_some_and(|first| covers(first, path));
            if super::vision::in_tower(model, path) || beside {
                let unit = out.remove(i);
                out.insert(first + moved, unit);
                moved += 1;
            }
            i += 1;
        }
    }
    // Units in the order the forward runs them, not the order the modules are defined in: a
    // rotary embedding defined after the final norm (Llama, GPT-NeoX) runs before the first
    // layer.
    if let Some(first_block) = out.iter().position(|u| matches!(u.kind, UnitKind::Block(_))) {
        let mut i = first_block + 1;
        let mut at = first_block;
        while i < out.len() {
            if out[i].side {
                let unit = out.remove(i);
                out.insert(at, unit);
                at += 1;
            }
            i += 1;
        }
    }
    out
}

/// The module producing vocabulary logits: the last linear outside the blocks whose weight has
/// the vocabulary as its rows (the engines' LM head too).
pub(crate) fn head_path(model: &ModelDescription) -> Option<String> {
    let vocab = model.facts.vocab_size;
    let mut found = None;
    model.root.visit(&mut |m| {
        let in_block = || {
            model
                .facts
                .layers
                .iter()
                .any(|l| m.path.strip_prefix(&l.path).is_some_and(|rest| rest.starts_with('.')))
        };
        if m.kind == ModuleKind::Linear
            && m.tensors.iter().any(|t| t.name == "weight" && t.shape.first() == Some(&vocab))
            && !in_block()
        {
            found = Some(m.path.clone());
        }
    });
    found
}

#[allow(clippy::too_many_arguments)]
fn collect(
    model: &ModelDescription,
    module: &Module,
    workload: &Workload,
    precision: &Precision,
    lora_targets: &[String],
    head: Option<&str>,
    out: &mut Vec<Unit>,
    aliases: &mut Vec<(String, String)>,
) {
    let is_block = module.kind == ModuleKind::Block;
    if is_block || module.children.is_empty() {
        let kind = if is_block {
            let index = model.facts.layers.iter().position(|l| l.path == module.path);
            index.map(UnitKind::Block).unwrap_or(UnitKind::Other)
        } else if Some(module.path.as_str()) == head {
            UnitKind::Head
        } else if module.kind == ModuleKind::Embedding {
            UnitKind::Embedding
        } else {
            UnitKind::Other
        };
        let mut unit = describe(module, kind, workload, precision, lora_targets, head);
        unit.side =
            !is_block && kind == UnitKind::Other && module.tensors.iter().any(|t| t.name == "inv_freq");
        if !unit.weight_tensors.is_empty() || kind == UnitKind::Head {
            out.push(unit);
        } else if let Some(target) = module.tensors.iter().find_map(|t| t.tied_to.clone()) {
            aliases.push((module.path.clone(), target));
        }
        return;
    }
    if module.tensors.iter().any(|t| t.tied_to.is_none()) {
        let own = Module { children: Vec::new(), ..module.clone() };
        let mut unit = describe(&own, UnitKind::Other, workload, precision, lora_targets, head);
        unit.keys = module.tensors.iter().map(|t| join(&module.path, &t.name)).collect();
        out.push(unit);
    }
    for child in &module.children {
        collect(model, child, workload, precision, lora_targets, head, out, aliases);
    }
}

fn describe(
    module: &Module,
    kind: UnitKind,
    workload: &Workload,
    precision: &Precision,
    lora_targets: &[String],
    head: Option<&str>,
) -> Unit {
    let half_bytes = precision.weights.bits() / 8;
    let training = workload.mode == Mode::Train;
    let lora = matches!(workload.finetune, Finetune::Lora { .. });
    let kbit_training = training
        && lora
        && workload.trainer == Trainer::Transformers
        && !matches!(workload.quant, Quant::None | Quant::Gguf { .. });
    let rank = match &workload.finetune {
        Finetune::Lora { rank, .. } => *rank,
        Finetune::Full => 0,
    };
    let adapter_dtype = trainable_dtype(workload, precision);
    let mut unit = Unit {
        path: module.path.clone(),
        keys: vec![module.path.clone()],
        kind,
        weight_tensors: Vec::new(),
        placed_by: Vec::new(),
        trainable_tensors: Vec::new(),
        autocast_params: 0,
        largest_quantized_linear: 0,
        quant_constants: 0,
        side: false,
    };
    // bitsandbytes replaces `nn.Linear` modules only: transformers 5.x's fused experts (3-D
    // `nn.Parameter`s) stay at the load dtype under `load_in_4bit`/`load_in_8bit`, where 4.x's
    // listed experts, each an `nn.Linear`, are quantized.
    let bitsandbytes = matches!(workload.quant, Quant::Int8 | Quant::Nf4 { .. } | Quant::Fp4 { .. });
    module.visit(&mut |m| {
        let quantizable = match m.kind {
            ModuleKind::Linear => true,
            ModuleKind::Experts { .. } => !bitsandbytes,
            _ => false,
        } && (Some(m.path.as_str()) != head || super::litgpt::quantizes_head(workload));
        // LitGPT's `GPT` ties nothing: a tied tensor is one of its own there (`litgpt.rs`).
        let untied = super::litgpt::runs(workload);
        for tensor in m.tensors.iter().filter(|t| t.tied_to.is_none() || untied) {
            let numel = tensor.numel();
            let is_float_param = tensor.kind == TensorKind::Parameter && tensor.dtype.is_float();
            let (out_dim, in_dim) = match tensor.shape.as_slice() {
                [.., o, i] => (*o, *i),
                [n] => (*n, 1),
                _ => (numel, 1),
            };
            // A checkpoint's own quantized weights (fp8, MXFP4 blocks, packed words) are held as
            // stored: the workload's quantization applies to floating-point weights only.
            let prequantized = tensor.dtype.bits() < 16;
            let quantized = if is_float_param && !prequantized && quantizable && tensor.shape.len() >= 2 {
                let experts: u64 = tensor.shape.iter().rev().skip(2).product();
                quantized_linear_bytes(&workload.quant, out_dim, in_dim, half_bytes).map(|b| b * experts)
            } else {
                None
            };
            let bytes = match quantized {
                Some(b) => {
                    // A fused experts tensor is dequantized one expert at a time.
                    let experts: u64 = tensor.shape.iter().rev().skip(2).product();
                    unit.largest_quantized_linear = unit.largest_quantized_linear.max(numel / experts.max(1));
                    unit.quant_constants +=
                        bnb4_constant_bytes(&workload.quant, numel / experts.max(1)) * experts;
                    b + crate::model::torchtune::nf4_factor_storage(workload, numel, half_bytes)
                }
                // PEFT's `prepare_model_for_kbit_training` casts every unquantized half-precision
                // parameter (embeddings, norms, head) to fp32 before k-bit LoRA training.
                None if is_float_param && kbit_training => DType::F32.bytes_for(numel),
                // Parameters and buffers made in the default dtype take the load dtype; those of
                // a fixed dtype (XLNet's `torch.FloatTensor`s, rotary `inv_freq`) keep theirs.
                None if tensor.takes_load_dtype() => precision.weights.bytes_for(numel),
                None => tensor.bytes(),
            };
            unit.weight_tensors.push(bytes);
            unit.placed_by.push(join(&m.path, &tensor.name));
            let weight = unit.weight_tensors.len() - 1;
            // Autocast casts what its fp16 list's ops take: linears' weights, and XLNet's raw
            // projections, which `torch.einsum` takes (`XLNetRelativeAttention`).
            let xlnet_projection = m.class == "XLNetRelativeAttention"
                && ["q", "k", "v", "o", "r"].contains(&tensor.name.as_str());
            if is_float_param
                && precision.autocast
                && ((m.kind == ModuleKind::Linear && tensor.name == "weight") || xlnet_projection)
            {
                unit.autocast_params += numel;
            }
            if training && !lora && is_float_param && quantized.is_none() {
                let rows_cols = (tensor.shape.len() == 2).then_some((out_dim, in_dim));
                unit.trainable_tensors.push(TrainableTensor { numel, rows_cols, weight });
            }
        }
        if training
            && lora
            && m.kind == ModuleKind::Linear
            && lora_targets.contains(&m.path)
            && let Some(w) = m.tensors.iter().find(|t| t.name == "weight")
        {
            {
                let (out_dim, in_dim) = match w.shape.as_slice() {
                    [o, i] if m.class == "Conv1D" => (*i, *o),
                    [o, i] => (*o, *i),
                    _ => (0, 0),
                };
                // lora_A [rank, in] and lora_B [out, rank]: weights like any other, trainable.
                for (rows, cols) in [(rank, in_dim), (out_dim, rank)] {
                    unit.weight_tensors.push(adapter_dtype.bytes_for(rows * cols));
                    unit.placed_by.push(join(&m.path, "weight"));
                    let weight = unit.weight_tensors.len() - 1;
                    unit.trainable_tensors.push(TrainableTensor {
                        numel: rows * cols,
                        rows_cols: Some((rows, cols)),
                        weight,
                    });
                }
            }
        }
    });
    unit
}
