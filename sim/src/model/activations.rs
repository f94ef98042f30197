//! What a block keeps for backward, tensor by tensor, from the ops transformers' forward runs
//! (autograd saves an op's inputs or outputs as its backward needs them), and the transient
//! workspace at the block's own forward and backward peaks.
//!
//! Per token, with `c` the compute dtype's bytes, `h` hidden, `a` heads, `k` KV heads, `d` head
//! dim, `I` the MLP width and `s` the attended span. An op keeps an operand only for the
//! gradient of another that requires one (autograd's formulas), so a frozen base (LoRA, QLoRA)
//! keeps less than a full fine-tune; `docs/memory-model.md` has the table. In short:
//! - a norm feeding a linear keeps its fp32 input, and over a trainable base its normalised
//!   value and output (which the linear keeps); LayerNorm keeps its input;
//! - transformers' SDPA and flash keep q and k as rotated, v, K/V heads unrepeated, their
//!   output (the output projection's input is a view of it) and a log-sum-exp; eager attention
//!   keeps the rotated q and k, `repeat_kv`'s copies, the softmax (fp32 in Llama-style models
//!   and under autocast) and its half copy, and the output projection's contiguous input over a
//!   trainable base: the `5·a·s/h` term of Korthikanti et al. 2022. torchtune's own attention,
//!   untraced, keeps the raw and rotated q and k, `rotate_half` and expanded K and V;
//! - a gated MLP keeps gate, up, act(gate), and their product over a trainable base; a plain
//!   MLP its first projection's output and what the activation keeps (`gelu_new` four tensors);
//! - MoE layers keep the router softmax (fp32) and, per routed copy, the expert's MLP tensors,
//!   and over a trainable base the gathered input and the weighted output;
//! - PEFT's LoRA adapters keep their fp32 input copies and `lora_A`'s output; Unsloth's kernels
//!   keep their own list (`unsloth_saved`).
//!
//! `torch.compile` fuses pointwise chains: norms keep their input, rotary keeps only its
//! results, and a gated MLP keeps gate and up.

use super::declared::Declarations;
use super::precision::Precision;
use crate::workload::{AttentionImpl, Finetune, GradCheckpointing, Mode, Trainer, Workload};
use vramplan_profiles::model::vision::VisionFacts;
use vramplan_profiles::model::{
    AttentionKind, LayerFacts, ModelDescription, ModuleKind, NormKind, StackKind,
};

/// Activation memory of one block for a given number of tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct BlockActivations {
    /// Tensors kept for backward, bytes each.
    pub saved: Vec<u64>,
    /// Bytes live only during the block's forward, on top of `saved`.
    pub forward_transient: u64,
    /// Bytes live at once during the block's forward when it keeps nothing (inference, or a
    /// checkpointed block): its working set.
    pub working_set: Vec<u64>,
    /// Bytes live only during the block's backward, on top of what it frees.
    pub backward_transient: u64,
    /// The block's input (the residual stream), kept when the block is checkpointed.
    pub input: u64,
}

/// Families whose training configs use dropout by default (attention, hidden, or both).
fn trains_with_dropout(model_type: &str) -> bool {
    matches!(model_type, "bert" | "gpt2" | "gpt_bigcode" | "opt" | "t5" | "xlnet")
}

/// True if the model applies rotary position embeddings: it holds an `inv_freq` buffer.
pub(crate) fn uses_rotary(model: &ModelDescription) -> bool {
    let mut found = false;
    model.root.visit(&mut |m| found |= m.tensors.iter().any(|t| t.name == "inv_freq"));
    found
}

/// The attention transformers runs: SDPA is asked for by default, and families whose classes
/// do not support it (`_supports_sdpa = False`: Gemma 2, for its logit softcapping, and
/// gpt-oss, for its attention sinks, in transformers 5.x) fall back to eager attention
/// (`PreTrainedModel.get_correct_attn_implementation`).
pub(crate) fn attention_used(model: &ModelDescription, workload: &Workload) -> AttentionImpl {
    if let Some(fused) = super::awq_fused::attention(workload) {
        return fused; // AutoAWQ's fused attention (`awq_fused.rs`)
    }
    match (workload.attention, model.facts.model_type.as_str()) {
        (AttentionImpl::Sdpa, "gemma2" | "gpt_oss") => AttentionImpl::Eager,
        (attention, _) => attention,
    }
}

/// Per token, what a decoder layer keeps for backward under Unsloth's kernels, its base frozen
/// (unsloth/kernels and unsloth_zoo, 2026.8): `Fast_RMS_Layernorm` keeps its input and an fp32
/// inverse RMS per token; `LoRA_QKV` keeps its input (the norm's output), not q, k or v; RoPE
/// rotates q and k in place; the attention kernel (xformers' `memory_efficient_attention`, the
/// default install on GPUs without flash-attn) keeps q, k and v with grouped K/V heads
/// expanded to every head, its output and an fp32 log-sum-exp per head; `LoRA_W` (the output
/// projection) keeps its input, a view of that output; `LoRA_MLP` keeps its input, gate and up
/// (`e`, `g`), not their product.
fn unsloth_saved(sh: &Shape, c: u64) -> Vec<u64> {
    let (h, a, d) = (sh.hidden, sh.heads, sh.head_dim);
    vec![
        c * h,               // input norm's input
        4,                   // its inverse RMS
        c * h,               // LoRA_QKV's input
        c * a * d,           // q
        c * a * d,           // k, expanded
        c * a * d,           // v, expanded
        c * a * d,           // attention output
        4 * a,               // log-sum-exp
        c * h,               // post-attention norm's input
        4,                   // its inverse RMS
        c * h,               // LoRA_MLP's input
        c * sh.intermediate, // e (gate)
        c * sh.intermediate, // g (up)
    ]
}

/// Whether the model soft-caps its attention scores and its output logits, `tanh(x / cap) ·
/// cap`: Gemma 2 (`attn_logit_softcapping`, `final_logit_softcapping` in its configs). Keyed on
/// the family; the config's two values are not in the model facts.
pub(crate) fn soft_caps_logits(model: &ModelDescription) -> bool {
    model.facts.model_type == "gemma2"
}

/// Whether eager attention's softmax is fp32 whatever the scores' dtype, as the eager function
/// asks (`softmax(..., dtype=torch.float32)`): Llama-style models, GPT-NeoX, Phi, OPT, BLOOM,
/// GPTBigCode (`upcast_masked_softmax`); GPT-2, Falcon, BERT and XLNet take it in the scores'
/// dtype.
fn fp32_softmax(model: &ModelDescription, sh: &Shape) -> bool {
    sh.rms || matches!(model.facts.model_type.as_str(), "gpt_neox" | "phi" | "opt" | "bloom" | "gpt_bigcode")
}

/// How many tensors of its input's size the activation function `name` (transformers'
/// `ACT2FN` key) keeps for backward.
fn activation_keeps(name: &str) -> u64 {
    match name {
        // NewGELUActivation: x (for pow and 0.5·x), tanh, 1 + tanh, 0.5·x.
        "gelu_new" => 4,
        _ => 1,
    }
}

/// Per-token sizes of one block's shape.
pub(super) struct Shape {
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    /// Width of the MLP each token passes through (dense intermediate, or routed experts').
    pub intermediate: u64,
    pub gated: bool,
    rms: bool,
    rotary: bool,
    dropout: bool,
    /// MoE: experts, top-k (the copies of each token the experts run: every expert's where
    /// [`Shape::moe_weights_input`]), shared intermediate.
    pub moe: Option<(u64, u64, u64)>,
    /// The router's scores weight each expert's input, not its output, and every expert runs on
    /// every token ([`moe_runs_every_expert`]).
    pub moe_weights_input: bool,
    cross_attention: bool,
    /// q and k pass through their own RMSNorm (`q_norm`, `k_norm`: OLMoE, Qwen3).
    pub qk_norm: bool,
    /// Linears that each read the attention's input apart (`q_proj`, `k_proj`, `v_proj`: 3; a
    /// fused `qkv_proj` or `c_attn`: 1), and the dense MLP's (`gate_proj`, `up_proj`: 2). Under
    /// autocast each casts the fp32 input to half on its own and keeps its copy.
    readers: (u64, u64),
    /// Norms of the block past the two before attention and MLP: Gemma 2's sandwich norms on
    /// the attention's and the MLP's outputs (`post_attention_layernorm`,
    /// `post_feedforward_layernorm`).
    extra_norms: u64,
    /// Attention scores are soft-capped ([`soft_caps_logits`]): the tanh keeps its output per
    /// score.
    softcap: bool,
}

fn shape(model: &ModelDescription, layer: usize, training: bool, rotary: bool) -> Shape {
    let f = &model.facts;
    let facts = f.layers.get(layer);
    if let (Some(vision), Some(LayerFacts { stack: StackKind::Vision, .. })) = (&f.vision, facts) {
        return vision_shape(vision);
    }
    let moe_layer = facts.is_some_and(|l| l.moe);
    let block = facts.and_then(|l| model.root.find(&l.path));
    let every_expert = moe_runs_every_expert(&f.model_type);
    let (intermediate, moe) = match (&f.moe, moe_layer) {
        (Some(m), true) => {
            let copies = if every_expert { m.experts } else { m.top_k };
            (
                m.expert_intermediate_size,
                Some((u64::from(m.experts), u64::from(copies), m.shared_intermediate_size)),
            )
        }
        _ => (f.intermediate_size, None),
    };
    let (heads, head_dim) = match &f.attention {
        AttentionKind::MultiLatent { qk_nope_head_dim, qk_rope_head_dim, .. } => {
            (f.num_attention_heads, qk_nope_head_dim + qk_rope_head_dim)
        }
        AttentionKind::Standard => (f.num_attention_heads, f.head_dim),
    };
    Shape {
        hidden: f.hidden_size,
        heads,
        kv_heads: if matches!(f.attention, AttentionKind::MultiLatent { .. }) {
            heads
        } else {
            f.num_kv_heads
        },
        head_dim,
        intermediate,
        gated: f.gated_mlp,
        rms: f.norm == NormKind::RmsNorm,
        rotary,
        dropout: training && trains_with_dropout(&f.model_type),
        moe,
        moe_weights_input: every_expert && moe.is_some(),
        cross_attention: facts.is_some_and(|l| l.cross_attention),
        extra_norms: block.map_or(0, |block| {
            let norms = block.children.iter().filter(|m| m.kind == ModuleKind::Norm).count() as u64;
            norms.saturating_sub(2)
        }),
        softcap: soft_caps_logits(model),
        qk_norm: block.is_some_and(|block| {
            let mut found = false;
            block.visit(&mut |m| found |= m.kind == ModuleKind::Norm && m.name() == "q_norm");
            found
        }),
        readers: block.map_or((1, 1), input_readers),
    }
}

/// How many linears of a block read its attention's input apart, and how many its dense MLP's:
/// transformers' separate `q_proj`, `k_proj`, `v_proj` and `gate_proj`, `up_proj` (fused projections
/// and experts count as one reader).
fn input_readers(block: &vramplan_profiles::model::Module) -> (u64, u64) {
    let (mut attention, mut mlp) = (0u64, 0u64);
    block.visit(&mut |m| {
        if m.kind == ModuleKind::Linear {
            match m.name() {
                "q_proj" | "k_proj" | "v_proj" => attention += 1,
                "gate_proj" | "up_proj" if !m.path.contains(".experts.") => mlp += 1,
                _ => {}
            }
        }
    });
    (attention.clamp(1, 3), mlp.clamp(1, 2))
}

/// Whether a family's MoE block runs every expert on every token: Llama 4's `Llama4TextMoe`
/// (transformers 5.24 and 4.57, `modeling_llama4.py`) repeats the tokens once per expert
/// (`hidden_states.repeat(num_experts, 1)`), multiplies each copy by its expert's router score
/// (the top-k scores through a sigmoid, the others `sigmoid(-inf)` = 0) and runs the experts as one
/// batched matmul over all copies (`Llama4TextExperts`: `torch.bmm`), so each expert's MLP holds
/// every token, and the scores weight the experts' input rather than their output. The
/// vision-language `Llama4ForConditionalGeneration` (`llama4`) runs the same text model.
fn moe_runs_every_expert(model_type: &str) -> bool {
    matches!(model_type, "llama4_text" | "llama4")
}

/// A vision tower's block, as [`VisionFacts`] describes it: Qwen2.5-VL's `Qwen2_5_VLVisionBlock`
/// (RMSNorms, a fused `qkv` with 2-D rotary embeddings on q and k, a gated MLP) or SigLIP's
/// `SiglipEncoderLayer` (LayerNorms with a bias, q/k/v/out projections with biases, no rotary,
/// a plain `fc1`/`fc2` MLP); full multi-head attention (every head its own K and V), no dropout.
fn vision_shape(vision: &VisionFacts) -> Shape {
    Shape {
        hidden: vision.hidden_size,
        heads: vision.num_heads,
        kv_heads: vision.num_heads,
        head_dim: vision.head_dim(),
        intermediate: vision.intermediate_size,
        gated: vision.gated_mlp,
        rms: vision.rms_norm,
        rotary: vision.rotary,
        dropout: false,
        moe: None,
        moe_weights_input: false,
        cross_attention: false,
        qk_norm: false,
        readers: (1, 1),
        extra_norms: 0,
        softcap: false,
    }
}

/// The activation model of one model under one workload: traits of the whole model worked out
/// once, then [`ActivationModel::block`] per block.
pub(crate) struct ActivationModel<'a> {
    model: &'a ModelDescription,
    workload: &'a Workload,
    precision: Precision,
    rotary: bool,
    /// The attention transformers runs for this model ([`attention_used`]).
    attention: AttentionImpl,
    /// Per block of `facts.layers`, what does not depend on the batch or the sequence length,
    /// worked out once (a sweep asks for every block at many shapes).
    blocks: Vec<BlockModel>,
}

/// One block as [`ActivationModel::block`] reads it at every shape.
struct BlockModel {
    shape: Shape,
    kept: Kept,
    /// Per token, what its LoRA adapters keep ([`lora_saved`]; nothing in inference or under
    /// Unsloth, whose kernels keep their own).
    lora: Vec<u64>,
    /// What a custom model declares for it (`declared.rs`).
    declarations: Option<Declarations>,
}

/// What a block keeps for backward by the memory model's lists, whatever the shape: bytes per
/// token, and bytes per element of its attention scores (batch · heads · sequence · span).
struct Kept {
    per_token: Vec<u64>,
    per_score: Vec<u64>,
}

/// A linear layer LoRA wraps, as its block's activations see it.
#[derive(Debug, Clone)]
pub(crate) struct LoraSite {
    /// Path of the linear layer.
    pub(crate) path: String,
    /// Its input width.
    pub(crate) inputs: u64,
    /// The module holding it (`model.layers.3.self_attn`): the wrapped layers of one parent
    /// that are not its last read the same input.
    pub(crate) parent: String,
    /// The last linear of its parent (the attention's output or the MLP's down projection).
    pub(crate) last: bool,
}

/// The linear layers `targets` names, with their input widths and places.
fn lora_sites(model: &ModelDescription, targets: &[String]) -> Vec<LoraSite> {
    let mut sites = Vec::new();
    model.root.visit(&mut |parent| {
        let linears: Vec<_> = parent
            .children
            .iter()
            .filter(|c| c.tensors.iter().any(|t| t.name == "weight" && t.shape.len() == 2))
            .collect();
        for (i, child) in linears.iter().enumerate() {
            if targets.iter().any(|t| t == &child.path) {
                let weight = child.tensors.iter().find(|t| t.name == "weight").expect("filtered");
                // nn.Linear is [out, in]; GPT-2's Conv1D is [in, out] (`c_` layers).
                let inputs = if child.class == "Conv1D" { weight.shape[0] } else { weight.shape[1] };
                sites.push(LoraSite {
                    path: child.path.clone(),
                    inputs,
                    parent: parent.path.clone(),
                    last: i + 1 == linears.len() && linears.len() > 1,
                });
            }
        }
    });
    sites
}

impl<'a> ActivationModel<'a> {
    /// The model of `model` under `workload`, whose LoRA adapters wrap `lora_targets`
    /// (`closed_form::lora_targets`).
    pub(crate) fn new(
        model: &'a ModelDescription,
        workload: &'a Workload,
        precision: Precision,
        lora_targets: &[String],
    ) -> Self {
        let lora = lora_sites(model, lora_targets);
        let attention = attention_used(model, workload);
        let (training, rotary) = (workload.mode == Mode::Train, uses_rotary(model));
        let mut m = ActivationModel { model, workload, precision, rotary, attention, blocks: Vec::new() };
        m.blocks = (0..model.facts.layers.len())
            .map(|layer| {
                let prefix = format!("{}.", model.facts.layers[layer].path);
                let sites: Vec<LoraSite> =
                    lora.iter().filter(|s| s.path.starts_with(prefix.as_str())).cloned().collect();
                // Unsloth's fused LoRA kernels keep only their inputs, already in its list.
                let lora = if training && super::litgpt::runs(workload) {
                    let f = &model.facts;
                    let (q, kv) = (f.num_attention_heads * f.head_dim, f.num_kv_heads * f.head_dim);
                    super::litgpt::lora_saved(&sites, workload, &precision, q, kv)
                } else if training && workload.trainer != Trainer::Unsloth {
                    lora_saved(&sites, workload, &precision, attention)
                } else {
                    Vec::new()
                };
                let shape = shape(model, layer, training, rotary);
                let kept = kept(&m, &shape);
                BlockModel { shape, kept, lora, declarations: super::declared::block(model, layer) }
            })
            .collect();
        m
    }

    /// Activations of block `layer` for `batch` sequences of `seq` tokens (training keeps
    /// tensors for backward; inference keeps none, only its transient peak).
    ///
    /// A vision tower's block runs on the workload's images instead: the patches of every image
    /// (`batch × images`), attending within its windows; with no trainable tensor in the tower
    /// and none before it (LoRA on the language model), autograd saves nothing there.
    pub(crate) fn block(&self, layer: usize, batch: u64, seq: u64) -> BlockActivations {
        if self.model.facts.layers.get(layer).is_some_and(|l| l.stack == StackKind::Vision) {
            let Some((sequences, span)) = self
                .workload
                .images
                .as_ref()
                .and_then(|images| super::vision::sequences(self.model, layer, batch, images))
            else {
                return BlockActivations::default();
            };
            let mut activations =
                formula(self, layer, sequences, span, self.blocks.get(layer).map_or(&[], |b| &b.lora));
            let frozen = self.blocks.get(layer).is_some_and(|b| b.lora.is_empty()) && self.vision_frozen();
            if frozen {
                // Without autograd a checkpointed block keeps no input either.
                activations.saved.clear();
                activations.input = 0;
            }
            self.add_block_mask(layer, batch, frozen, &mut activations);
            return activations;
        }
        let block = self.blocks.get(layer);
        // A custom model's declared sizes replace the formula for the block (`declared.rs`).
        if let Some(declarations) = block.and_then(|b| b.declarations.as_ref()) {
            let declared = declarations.at(self.model, self.workload, &self.precision, batch, seq);
            return declared.or_formula(|| formula(self, layer, batch, seq, &[]));
        }
        formula(self, layer, batch, seq, block.map_or(&[], |b| &b.lora))
    }
}

impl ActivationModel<'_> {
    /// A packed tower's block mask (`model/vision.rs`, `block_mask_bytes`) in vision block
    /// `layer`: live through every block's forward; kept for backward by the first block (its
    /// SDPA, or its checkpoint's arguments) when the tower runs with autograd.
    fn add_block_mask(&self, layer: usize, batch: u64, frozen: bool, activations: &mut BlockActivations) {
        let c = self.precision.compute_bytes();
        let mask = super::vision::block_mask_bytes(self.model, batch, self.workload.images.as_ref(), c);
        if mask == 0 {
            return;
        }
        activations.working_set.push(mask);
        let first = self.model.facts.layers.iter().position(|l| l.stack == StackKind::Vision) == Some(layer);
        if first && !frozen && self.workload.mode == crate::workload::Mode::Train {
            activations.saved.push(mask);
            activations.input = activations.input.saturating_add(mask);
        } else {
            activations.forward_transient = activations.forward_transient.saturating_add(mask);
        }
    }

    /// Whether nothing in the vision tower trains: a LoRA or QLoRA fine-tune whose adapters
    /// wrap none of its modules (PEFT's default targets name the language model's projections).
    fn vision_frozen(&self) -> bool {
        matches!(self.workload.finetune, Finetune::Lora { .. })
            && !super::vision::input_hooked(self.model, self.workload)
            && self
                .blocks
                .iter()
                .zip(&self.model.facts.layers)
                .all(|(b, l)| l.stack != StackKind::Vision || b.lora.is_empty())
    }

    /// Whether the model runs transformers' decoder forward, whose locals the prefill follows
    /// ([`Self::prefill_held`], the hidden states handed from layer to layer); a custom model's
    /// declarations say what its modules hold instead.
    pub(crate) fn runs_transformers_forward(&self) -> bool {
        let mut declares = false;
        self.model.root.visit(&mut |m| declares |= m.activations.is_some());
        !declares
    }

    /// What a transformers model's forward holds across all its layers in a prefill of `batch`
    /// sequences of `prompt` tokens: its input embeddings (`inputs_embeds`, named until the
    /// forward returns, and the first layer's input), and for eager attention each causal mask
    /// it builds (`batch × 1 × q × kv` in the model's dtype; one more for sliding-window
    /// layers).
    pub(crate) fn prefill_held(&self, batch: u64, prompt: u64) -> Vec<u64> {
        if self.model.facts.model_type == "xlnet" {
            return super::xlnet::held_in_prefill(&self.precision, batch, prompt);
        }
        let c = self.precision.compute_bytes();
        let tokens = batch.saturating_mul(prompt);
        let mut held = vec![c.saturating_mul(self.model.facts.hidden_size).saturating_mul(tokens)];
        let images = self.workload.images.as_ref();
        let image_embeds = super::vision::image_embeds_bytes(self.model, batch, images, c);
        if image_embeds > 0 {
            held.push(image_embeds);
        }
        if self.attention == AttentionImpl::Eager {
            let layers = &self.model.facts.layers;
            let windowed = layers.iter().filter(|l| l.attention_window.is_some()).count();
            let kinds = usize::from(windowed > 0) + usize::from(windowed < layers.len());
            held.extend(vec![c.saturating_mul(tokens).saturating_mul(prompt); kinds]);
        }
        held
    }
}

/// Per token, what the LoRA adapters of one block keep for backward (PEFT's `lora.Linear`):
/// `lora_A` keeps its input, which PEFT first casts to the adapter's dtype
/// (`_cast_input_dtype`): a copy of its own when that differs from the activations' (fp32
/// adapters on a half model), else the layer's input itself, which a frozen base keeps for no
/// one else except the attention's output (SDPA keeps it); `lora_B` keeps `lora_A`'s output.
fn lora_saved(
    sites: &[LoraSite],
    workload: &Workload,
    precision: &Precision,
    attention: AttentionImpl,
) -> Vec<u64> {
    let Finetune::Lora { rank, .. } = &workload.finetune else { return Vec::new() };
    let adapter = super::units::trainable_dtype(workload, precision).bits() / 8;
    let c = precision.compute_bytes();
    let mut saved = Vec::new();
    let mut shared: Vec<&str> = Vec::new();
    for site in sites {
        saved.push(adapter * rank);
        if adapter != c {
            saved.push(adapter * site.inputs);
        } else if site.last {
            // SDPA and flash keep the attention's output, of which this is a view; eager
            // attention's contiguous copy, and the MLP's product, are kept only by this.
            let attention_output = site.parent.to_ascii_lowercase().contains("att");
            if !attention_output || attention == AttentionImpl::Eager {
                saved.push(c * site.inputs);
            }
        } else if !shared.contains(&site.parent.as_str()) {
            shared.push(&site.parent);
            saved.push(c * site.inputs);
        }
    }
    saved
}

/// The memory model's figures for block `layer`, from the lists in the module documentation,
/// with `lora` (bytes per token its LoRA adapters keep, [`lora_saved`]) kept as well.
fn formula(m: &ActivationModel, layer: usize, batch: u64, seq: u64, lora: &[u64]) -> BlockActivations {
    let (model, workload, precision, attention) = (m.model, m.workload, &m.precision, m.attention);
    if model.facts.model_type == "xlnet" && workload.trainer == Trainer::Transformers {
        // XLNet's relative attention is einsums, not SDPA or eager attention (`xlnet.rs`).
        return super::xlnet::block(model, workload, precision, layer, batch, seq);
    }
    let training = workload.mode == Mode::Train;
    let computed;
    let (sh, kept) = match m.blocks.get(layer) {
        Some(block) => (&block.shape, &block.kept),
        None => {
            let sh = shape(model, layer, training, m.rotary);
            computed = (kept(m, &sh), sh);
            (&computed.1, &computed.0)
        }
    };
    let tokens = batch * seq;
    let c = precision.compute_bytes();
    // The residual stream: fp32 under autocast (fp32 embeddings plus half outputs promote).
    let residual = if precision.autocast { 4 } else { c };
    let (h, a, d) = (sh.hidden, sh.heads, sh.head_dim);
    let span = match model.facts.layers.get(layer).and_then(|l| l.attention_window) {
        Some(w) if attention != AttentionImpl::Eager => w.min(seq),
        _ => seq,
    };

    // Transients: eager attention materialises raw, scaled and masked scores before softmax;
    // the MLP's backward holds gradients of its widest tensors.
    // Saturating: with sdpa or flash the scores are never formed, and may not fit in u64.
    let scores = batch.saturating_mul(a).saturating_mul(seq).saturating_mul(span);
    let eager = attention == AttentionImpl::Eager;
    let forward_transient =
        if eager { 2 * c * scores } else { 0 } + residual * h * tokens + c * sh.intermediate * tokens;
    // With nothing kept (inference, a checkpointed block's forward): what the layer's frames
    // hold at its widest op (`working_set.rs`), besides its input, which the program holds.
    let working_set = super::working_set::working_set(
        sh,
        &super::working_set::Forward {
            compute: precision.compute,
            residual,
            // AutoAWQ's fused softmax reads the scores' fp32 copy, as autocast's does (`awq_fused.rs`).
            autocast: precision.autocast || super::awq_fused::softmax_copies_input(workload),
            attention,
            fp32_softmax: fp32_softmax(model, sh)
                || precision.autocast
                || super::awq_fused::softmax_copies_input(workload),
            activation: &model.facts.activation,
            keeps_attention_output: super::working_set::keeps_attention_output(&model.facts.model_type),
            tokens,
            scores,
        },
    );
    let backward_transient = if workload.trainer == Trainer::Unsloth && training {
        // Unsloth's kernels hold their own (`model/unsloth.rs`).
        super::unsloth::backward_transient_per_token(sh, c) * tokens
    } else {
        if eager { 2 * 4 * scores } else { 3 * c * a * d * tokens }.max(3 * c * sh.intermediate * tokens)
            + 2 * residual * h * tokens
    };

    let mut saved: Vec<u64> = Vec::new();
    if training {
        // Selective recomputation drops the attention-score tensors (Korthikanti et al. §4.2).
        let selective = workload.grad_checkpointing == GradCheckpointing::Selective && eager;
        let per_score = if selective { &[][..] } else { &kept.per_score[..] };
        saved.reserve_exact(kept.per_token.len() + per_score.len() + lora.len());
        saved.extend(kept.per_token.iter().map(|b| b * tokens));
        saved.extend(per_score.iter().map(|b| b * batch * a * seq * span));
    }
    saved.extend(lora.iter().map(|b| b * tokens));
    let mut acts = BlockActivations {
        saved,
        forward_transient,
        working_set,
        backward_transient,
        input: residual * h * tokens,
    };
    if let Some(ssm) = model.facts.layers.get(layer).and_then(|l| l.ssm.as_ref()) {
        // A state-space mixer beside the attention (`ssm.rs`).
        let trainable = !matches!(workload.finetune, Finetune::Lora { .. });
        if training {
            acts.saved.extend(super::ssm::saved(ssm, h, precision, trainable, batch, seq));
        }
        let mixer = super::ssm::working_set(ssm, h, precision, batch, seq);
        let total = |v: &[u64]| v.iter().fold(0u64, |s, x| s.saturating_add(*x));
        if total(&mixer) > total(&acts.working_set) {
            acts.working_set = mixer;
        }
    }
    acts
}

/// What block shape `sh` keeps for backward, per token and per score, from the lists in the
/// module documentation.
fn kept(m: &ActivationModel, sh: &Shape) -> Kept {
    let (model, workload, precision, attention) = (m.model, m.workload, &m.precision, m.attention);
    let training = workload.mode == Mode::Train;
    let c = precision.compute_bytes();
    let up = precision.upcast_bytes();
    // The residual stream: fp32 under autocast (fp32 embeddings plus half outputs promote).
    let residual = if precision.autocast { 4 } else { c };
    let compile = workload.switches.compile;
    let (h, a, k, d) = (sh.hidden, sh.heads, sh.kv_heads, sh.head_dim);
    let mut per_token: Vec<u64> = Vec::new();
    let mut per_score: Vec<u64> = Vec::new();
    if workload.trainer == Trainer::Unsloth {
        per_token = unsloth_saved(sh, c);
    }
    // LoRA trains adapters over a frozen base: an op keeps an operand only for the gradient
    // of another that requires one (autograd saves `x` of `x @ W` for `W`'s gradient), so
    // frozen weights keep neither their inputs nor a norm's normalised value.
    let frozen = training && matches!(workload.finetune, Finetune::Lora { .. });
    let norm_then_linear = |out: &mut Vec<u64>, readers: u64| {
        if precision.autocast && !frozen && !compile {
            // Autocast caches the half cast of a leaf only (the weights, `cached_cast`): each
            // further linear reading the norm's fp32 output casts it again and keeps its copy.
            out.extend(std::iter::repeat_n(c * h, readers.saturating_sub(1) as usize));
        }
        if frozen {
            // RMSNorm keeps its fp32 input (`pow`, `mul` by the rsqrt), LayerNorm its input.
            out.push(if sh.rms { 4 * h } else { residual * h });
        } else if compile {
            out.extend([residual * h, c * h]);
        } else if sh.rms {
            // fp32 upcast (the residual itself when already fp32), normalised value, output.
            // LitGPT's `RMSNorm` multiplies the weight in fp32 (`x_normed * weight.float()`),
            // keeping the normalised value in fp32 (`model/litgpt.rs`).
            let normalised = if super::litgpt::runs(workload) { 4 } else { up };
            out.extend([4 * h, normalised * h, c * h]);
        } else {
            // LayerNorm keeps its input; its output (or the linear's half cast of it) feeds on.
            out.extend([residual * h, c * h]);
        }
    };

    // The lists of transformers' and torchtune's modules (Unsloth's kernels keep their own).
    if workload.trainer != Trainer::Unsloth {
        // Attention.
        norm_then_linear(&mut per_token, sh.readers.0);
        let attention_sublayers = if sh.cross_attention { 2 } else { 1 };
        for _ in 0..attention_sublayers {
            let (q, kv) = (a * d, k * d);
            if sh.qk_norm {
                // Each RMSNorm keeps its fp32 input, and its normalised value for its weight's
                // gradient unless the base is frozen.
                per_token.extend([4 * q, 4 * kv]);
                if !frozen {
                    per_token.extend([c * q, c * kv]);
                }
            }
            if attention != AttentionImpl::Eager && super::litgpt::runs(workload) {
                per_token.extend(super::litgpt::attention_saved(c, q, kv, k < a, a));
                continue;
            }
            if attention != AttentionImpl::Eager && workload.trainer.runs_transformers_modules() {
                // transformers' SDPA and flash keep q, k (rotated: `q * cos + rotate_half(q) * sin` keeps only
                // the constant cos and sin for q's gradient) and v as they receive them, grouped
                // K/V heads unrepeated (`use_gqa_in_sdpa` with no mask; flash natively), then
                // their output, of which the output projection's input is a view (the kernels
                // write it sequence-major), and a log-sum-exp per head and token.
                per_token.extend([c * q, c * kv, c * kv, c * q, 4 * a]);
                if sh.dropout {
                    per_token.push(h); // residual dropout mask
                }
                continue;
            }
            if attention != AttentionImpl::Eager && workload.trainer == Trainer::Torchtune {
                // torchtune's `MultiHeadAttention` (0.6.1, traced: sim/tests/tracer_torchtune.rs):
                // its RoPE multiplies fp32 pairs by the constant cache and keeps nothing; SDPA
                // keeps q as rotated, K and V expanded to every head (`expand(...).flatten(1,
                // 2)` copies them), its output (which `transpose(1, 2).contiguous()` leaves in
                // place: the kernel writes it sequence-major, and the output projection's input
                // is that tensor) and a log-sum-exp per head and token.
                let kv_kept = if k < a { q } else { kv };
                per_token.extend([c * q, c * kv_kept, c * kv_kept, c * q, 4 * a]);
                if sh.dropout {
                    per_token.push(h); // residual dropout mask
                }
                continue;
            }
            let traced = workload.trainer.runs_transformers_modules() && !compile;
            if traced {
                // transformers' eager attention: the score matmul keeps q and k as rotated (the
                // raw ones and `rotate_half` are not kept: cos and sin are constants), the
                // product with v keeps v; grouped K/V heads are kept as `repeat_kv`'s copies.
                let kv_kept = if k < a { q } else { kv };
                per_token.extend([c * q, c * kv_kept, c * kv_kept]);
            } else {
                if !(compile && sh.rotary) {
                    per_token.extend([c * q, c * kv]);
                }
                per_token.push(c * kv); // v
                if sh.rotary {
                    if compile {
                        per_token.extend([c * q, c * kv]);
                    } else {
                        per_token.extend([c * q, c * kv, c * q, c * kv]); // rotate_half and rotated q, k
                    }
                }
                if k < a {
                    per_token.extend([c * q, c * q]); // repeat_kv of k and v
                }
            }
            if attention == AttentionImpl::Eager {
                // The softmax is fp32 under autocast and where the eager function asks for it.
                let softmax = if fp32_softmax(model, sh) || precision.autocast { 4 } else { c };
                if sh.softcap {
                    per_score.push(c); // tanh of the scaled scores
                }
                per_score.push(softmax);
                if sh.dropout {
                    per_score.extend([1, if precision.autocast { c } else { softmax }]);
                } else if softmax != c {
                    per_score.push(c);
                }
                // The product with v is not saved; only its contiguous copy (below) is.
            } else {
                per_token.extend([c * q, 4 * a]); // SDPA's output and log-sum-exp
            }
            if !(traced && frozen) {
                per_token.push(c * q); // o_proj input (contiguous copy), for its weight's gradient
            }
            if sh.dropout {
                per_token.push(h); // residual dropout mask
            }
        }

        // MLP.
        if super::litgpt::norms_share_input(model, workload) {
            // The two norms of LitGPT's parallel block read one input, kept once.
            if !frozen {
                per_token.push(c * h);
            }
        } else {
            norm_then_linear(&mut per_token, if sh.moe.is_some() { 1 } else { sh.readers.1 });
        }
        // What the activation function keeps, in tensors of the MLP's width: its input for a
        // native kernel (`F.silu`, `F.gelu`, tanh-approximate included); transformers'
        // `NewGELUActivation` (`gelu_new`) is composed in Python, `0.5·x·(1 + tanh(√(2/π)·(x +
        // 0.044715·x³)))`, and keeps x, the tanh, 1 + tanh and 0.5·x.
        // LitGPT's own MLPs call the native `F.gelu` (`approximate="tanh"` for Phi's
        // `gelu_new`) and `F.silu` (`model/litgpt.rs`).
        let native = compile || super::litgpt::runs(workload);
        let act_keeps = if native { 1 } else { activation_keeps(&model.facts.activation) };
        let mlp = |width: u64, out: &mut Vec<u64>| {
            if frozen {
                // Gate, up and act(gate) (kept by their product); a plain MLP's first output (kept
                // by the activation). The product, the down projection's input, only for its LoRA.
                if sh.gated {
                    out.extend(vec![c * width; act_keeps as usize + 2]);
                } else {
                    out.extend(vec![c * width; act_keeps as usize]);
                }
            } else if sh.gated {
                if compile {
                    out.extend([c * width, c * width])
                } else {
                    out.extend(vec![c * width; act_keeps as usize + 3])
                }
            } else if act_keeps == 4 {
                // `gelu_new` keeps x for `pow`, the tanh, 1 + tanh and 0.5·x, and the second
                // projection keeps its input. Autocast runs `pow` in fp32 (CUDA's fp32 cast list),
                // so x is kept as its fp32 copy and the chain after it is fp32 by promotion (x +
                // 0.044715·x³, the tanh, 1 + tanh, the product); 0.5·x stays half, and the
                // projection keeps its half cast of the fp32 product. Traced on GPT-2 under fp16
                // autocast (`sim/tests/tracer_tail.rs`).
                out.extend([up * width, up * width, up * width, c * width, c * width]);
            } else {
                // The activation's keeps, and its output (the second projection's input).
                out.extend(vec![c * width; act_keeps as usize + 1]);
            }
        };
        match sh.moe {
            Some((experts, top_k, shared)) => {
                per_token.push(4 * experts); // router softmax in fp32
                for _ in 0..top_k {
                    // The gathered input is kept for the experts' weight gradient, the
                    // expert's output for the routing weights' (the router's) gradient: over a
                    // frozen base, neither. Where the scores weight the input (Llama 4), the
                    // product keeps the copied input for the scores' gradient even over a frozen
                    // base (the router's input requires one), and the experts' matmul keeps the
                    // weighted input for its weight's gradient.
                    if !frozen || sh.moe_weights_input {
                        per_token.push(c * h); // gathered (Llama 4: copied) input
                    }
                    mlp(sh.intermediate, &mut per_token);
                    if !frozen {
                        per_token.push(c * h); // expert output, weighted (Llama 4: weighted input)
                    }
                }
                if shared > 0 {
                    mlp(shared, &mut per_token);
                }
            }
            None => mlp(sh.intermediate, &mut per_token),
        }
        if sh.dropout {
            per_token.push(h);
        }
        for _ in 0..sh.extra_norms {
            // A norm on a sublayer's output feeds the residual add, no linear: its fp32 input,
            // and its normalised value for its weight's gradient unless frozen.
            per_token.push(if sh.rms { 4 * h } else { residual * h });
            if !frozen {
                per_token.push(if sh.rms { 4 * h } else { c * h });
            }
        }
    }

    Kept { per_token, per_score }
}
