//! GGUF sizes: the ggml tensor types with their block layouts, the llama.cpp file types
//! (`Q4_K_M`, `Q8_0`, …) and the type `llama-quantize` gives each tensor of a model.
//!
//! Block layouts are ggml's (`vramplan_profiles::GgmlType`, one table with the GGUF reader).
//! The per-tensor rules follow `llama_tensor_get_type` in llama.cpp's `src/llama-quant.cpp`, without an importance matrix and without `--pure`, for the file types
//! listed in [`FileType`]; the i-quants (`IQ2_XS`, …) are not modelled. Tensors are read from
//! the HF description and mapped onto llama.cpp's categories (token embedding, output, attention
//! Q/K/V/QKV/KV_B/output, FFN gate/up/down); the converter (`convert_hf_to_gguf.py`) writes 1-D
//! tensors (norms, biases) and the MoE router (`ffn_gate_inp`) in F32, and position embeddings
//! are never quantized.

use serde::Serialize;
pub use vramplan_profiles::GgmlType;
use vramplan_profiles::model::{ModelDescription, Module, ModuleKind, Tensor, TensorKind};
use vramplan_profiles::{DType, InputError};

/// The type `llama-quantize` falls back to when a row is not a multiple of the block size
/// (`tensor_type_fallback`): k-quants to the legacy 32-weight types.
fn fallback(ty: GgmlType) -> GgmlType {
    match ty {
        GgmlType::Q2_K | GgmlType::Q3_K => GgmlType::Q4_0,
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        other => other,
    }
}

/// A llama.cpp file type (`llama_ftype`), as `llama-quantize` names them.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum FileType {
    /// The types a GGUF file already holds, tensor by tensor (a model read from a `.gguf`
    /// file): nothing is requantized.
    Stored,
    /// `LLAMA_FTYPE_ALL_F32`: every quantizable tensor in F32.
    F32,
    /// `LLAMA_FTYPE_MOSTLY_F16`: every quantizable tensor in F16.
    F16,
    /// `LLAMA_FTYPE_MOSTLY_BF16`: every quantizable tensor in BF16.
    BF16,
    /// `LLAMA_FTYPE_MOSTLY_Q4_0`: Q4_0, with the output head in Q6_K.
    Q4_0,
    /// `LLAMA_FTYPE_MOSTLY_Q4_1`: Q4_1, with the output head in Q6_K.
    Q4_1,
    /// `LLAMA_FTYPE_MOSTLY_Q5_0`: Q5_0, with the output head in Q6_K.
    Q5_0,
    /// `LLAMA_FTYPE_MOSTLY_Q5_1`: Q5_1, with the output head in Q6_K.
    Q5_1,
    /// `LLAMA_FTYPE_MOSTLY_Q8_0`: Q8_0 throughout, the output head included.
    Q8_0,
    /// `LLAMA_FTYPE_MOSTLY_Q2_K`: Q2_K, with `attn_v` in Q4_K (Q3_K below 4 query heads per KV
    /// head) and `ffn_down` and `attn_output` in Q3_K.
    Q2_K,
    /// `LLAMA_FTYPE_MOSTLY_Q2_K_S`: the smaller Q2_K mix: Q2_K, with `attn_v` in Q4_K at 4 or more
    /// query heads per KV head and `ffn_down` of the first eighth of the layers in Q4_K.
    Q2_K_S,
    /// `LLAMA_FTYPE_MOSTLY_Q3_K_S`: Q3_K nearly throughout, the output head in Q6_K.
    Q3_K_S,
    /// `LLAMA_FTYPE_MOSTLY_Q3_K_M`: Q3_K, with the first two `attn_v` in Q5_K and the rest in Q4_K,
    /// `ffn_down` in Q4_K (Q5_K in the first sixteenth of the layers) and `attn_output` in Q4_K.
    Q3_K_M,
    /// `LLAMA_FTYPE_MOSTLY_Q3_K_L`: Q3_K, with `attn_v`, `ffn_down` and `attn_output` in Q5_K.
    Q3_K_L,
    /// `LLAMA_FTYPE_MOSTLY_Q4_K_S`: Q4_K, with the first four `attn_v` and the `ffn_down` of the
    /// first eighth of the layers in Q5_K.
    Q4_K_S,
    /// `LLAMA_FTYPE_MOSTLY_Q4_K_M`: Q4_K, with `attn_v` and `ffn_down` in Q6_K in the layers
    /// [`use_more_bits`] picks (about half).
    Q4_K_M,
    /// `LLAMA_FTYPE_MOSTLY_Q5_K_S`: Q5_K nearly throughout, the output head in Q6_K.
    Q5_K_S,
    /// `LLAMA_FTYPE_MOSTLY_Q5_K_M`: Q5_K, with `attn_v` and `ffn_down` in Q6_K in the layers
    /// [`use_more_bits`] picks (about half).
    Q5_K_M,
    /// `LLAMA_FTYPE_MOSTLY_Q6_K`: Q6_K throughout.
    Q6_K,
}

/// Every file type with its name, for parsing and error messages.
const FILE_TYPES: &[(&str, FileType)] = &[
    ("F32", FileType::F32),
    ("F16", FileType::F16),
    ("BF16", FileType::BF16),
    ("Q4_0", FileType::Q4_0),
    ("Q4_1", FileType::Q4_1),
    ("Q5_0", FileType::Q5_0),
    ("Q5_1", FileType::Q5_1),
    ("Q8_0", FileType::Q8_0),
    ("Q2_K", FileType::Q2_K),
    ("Q2_K_S", FileType::Q2_K_S),
    ("Q3_K_S", FileType::Q3_K_S),
    ("Q3_K_M", FileType::Q3_K_M),
    ("Q3_K_L", FileType::Q3_K_L),
    ("Q4_K_S", FileType::Q4_K_S),
    ("Q4_K_M", FileType::Q4_K_M),
    ("Q5_K_S", FileType::Q5_K_S),
    ("Q5_K_M", FileType::Q5_K_M),
    ("Q6_K", FileType::Q6_K),
];

impl FileType {
    /// Parses `Q4_K_M`, `q4_k_m`, `Q4_K` (llama-quantize's alias for Q4_K_M; `Q3_K` and `Q5_K`
    /// likewise mean the `_M` mixes), `fp16`/`bf16`/`fp32`.
    pub fn parse(text: &str) -> Result<FileType, InputError> {
        let upper = text.trim().to_ascii_uppercase().replace('-', "_");
        let alias = match upper.as_str() {
            "Q3_K" => "Q3_K_M",
            "Q4_K" => "Q4_K_M",
            "Q5_K" => "Q5_K_M",
            "FP16" => "F16",
            "FP32" => "F32",
            other => other,
        };
        FILE_TYPES.iter().find(|(name, _)| *name == alias).map(|(_, t)| *t).ok_or_else(|| {
            let names: Vec<&str> = FILE_TYPES.iter().map(|(name, _)| *name).collect();
            InputError::new("workload", format!("`{text}` is not a GGUF file type vramplan knows"))
                .at_key("quant.quant_type")
                .with_fix(format!("use one of {}", names.join(", ")))
        })
    }

    /// The name `llama-quantize` takes (`Q4_K_M`).
    pub fn name(self) -> &'static str {
        if self == FileType::Stored {
            return "as stored";
        }
        FILE_TYPES.iter().find(|(_, t)| *t == self).map_or("?", |(name, _)| *name)
    }

    /// The type of every quantizable tensor no rule singles out
    /// (`llama_ftype_get_default_type`).
    pub fn default_type(self) -> GgmlType {
        match self {
            FileType::F32 => GgmlType::F32,
            FileType::F16 | FileType::Stored => GgmlType::F16,
            FileType::BF16 => GgmlType::BF16,
            FileType::Q4_0 => GgmlType::Q4_0,
            FileType::Q4_1 => GgmlType::Q4_1,
            FileType::Q5_0 => GgmlType::Q5_0,
            FileType::Q5_1 => GgmlType::Q5_1,
            FileType::Q8_0 => GgmlType::Q8_0,
            FileType::Q2_K | FileType::Q2_K_S => GgmlType::Q2_K,
            FileType::Q3_K_S | FileType::Q3_K_M | FileType::Q3_K_L => GgmlType::Q3_K,
            FileType::Q4_K_S | FileType::Q4_K_M => GgmlType::Q4_K,
            FileType::Q5_K_S | FileType::Q5_K_M => GgmlType::Q5_K,
            FileType::Q6_K => GgmlType::Q6_K,
        }
    }
}

/// What a tensor is to `llama-quantize` (its `tensor_category`), plus the tensors it never
/// quantizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// `token_embd`: the input token embedding (an embedding with `vocab_size` rows).
    TokenEmbedding,
    /// `output`: the LM head (`lm_head`, GPT-NeoX's `embed_out`).
    Output,
    /// `attn_q`: the query projection (`q_proj`, `query`).
    AttnQ,
    /// `attn_k`: the key projection (`k_proj`, `key`).
    AttnK,
    /// `attn_v`: the value projection (`v_proj`, `value`), which most k-quant mixes give more bits.
    AttnV,
    /// `attn_qkv`: a fused query/key/value projection (`qkv_proj`, `query_key_value`, GPT-2's
    /// `c_attn`), treated like `attn_v`.
    AttnQkv,
    /// MLA's `kv_b_proj` (`attn_kv_b`), treated like `attn_v`.
    AttnKvB,
    /// `attn_output`: attention's output projection (`o_proj`, `out_proj`, and `c_proj` / `dense`
    /// under attention).
    AttnOutput,
    /// `ffn_gate` (`ffn_gate_exps` for experts): the MLP's gate projection (`gate_proj`, `w1`, the
    /// gate half of a fused `gate_up_proj`).
    FfnGate,
    /// `ffn_up` (`ffn_up_exps` for experts): the MLP's up projection (`up_proj`, `w3`, `fc1`, …).
    FfnUp,
    /// `ffn_down` (`ffn_down_exps` for experts): the MLP's down projection (`down_proj`, `w2`,
    /// `fc2`, …), which most k-quant mixes give more bits.
    FfnDown,
    /// Quantized with the default type (MLA's `q_a_proj`, `kv_a_proj_with_mqa`, `q_b_proj`, …).
    Other,
    /// Kept as written by the converter: norms, biases, routers, position embeddings.
    Kept,
}

/// One GGUF tensor with its type and size.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GgufTensor {
    /// The HF tensor it comes from (`model.layers.3.self_attn.v_proj.weight`); a fused
    /// `experts.gate_up_proj` gives two GGUF tensors (gate and up) with the same path.
    pub path: String,
    /// The llama.cpp category that decides its type.
    pub role: Role,
    /// The decoder block it belongs to, by position.
    pub layer: Option<u64>,
    /// The type `llama-quantize` writes it in, after the fallback for rows that are not whole blocks.
    pub ggml_type: GgmlType,
    /// Elements per row (ggml's `ne[0]`, the input features of a linear).
    pub row_elements: u64,
    /// Rows (ggml's `ne[1]` and any further dimensions, such as the experts of a fused tensor).
    pub rows: u64,
    /// Bytes in the file (`rows × row_bytes`).
    pub bytes: u64,
}

/// What the rules need to know about the model (`llama_hparams` and `llm_arch`).
struct Rules {
    file_type: FileType,
    layers: u64,
    experts: u64,
    /// Query heads per KV head (`n_gqa`).
    gqa: u64,
    falcon: bool,
    /// LLaMA with 80 layers: llama.cpp's `LLM_TYPE_70B`.
    seventy_b: bool,
    tied_embeddings: bool,
    /// `attn_v`-like tensors in the model (`n_attention_wv`).
    attention_wv: u64,
}

/// Every tensor of `model` as `llama-quantize` writes it for `file_type`, in model order.
///
/// Fails for descriptions holding GPTQ/AWQ-packed weights: GGUF files are made from a float
/// checkpoint.
///
/// A model read from a GGUF file ([`FileType::Stored`]) is given as the file holds it.
pub fn quantize(model: &ModelDescription, file_type: FileType) -> Result<Vec<GgufTensor>, InputError> {
    if file_type == FileType::Stored {
        return Ok(stored(model));
    }
    let mut plain: Vec<(String, Role, Option<u64>, &Tensor, &Module)> = Vec::new();
    let mut packed = None;
    let layer_of = |path: &str| -> Option<u64> {
        model
            .facts
            .layers
            .iter()
            .position(|l| path.starts_with(&l.path) && path.as_bytes().get(l.path.len()) == Some(&b'.'))
            .map(|i| i as u64)
    };
    model.root.visit(&mut |module| {
        for tensor in &module.tensors {
            match tensor.kind {
                TensorKind::PackedParameter { .. } => packed = Some(module.path.clone()),
                // GGUF holds dequantized weights; scales and buffers are not tensors there.
                TensorKind::QuantConstant | TensorKind::Buffer { .. } => {}
                TensorKind::Parameter if tensor.tied_to.is_some() => {}
                TensorKind::Parameter => {
                    let path = join(&module.path, &tensor.name);
                    plain.push((
                        path.clone(),
                        role_of(model, module, tensor),
                        layer_of(&path),
                        tensor,
                        module,
                    ));
                }
            }
        }
    });
    if let Some(path) = packed {
        return Err(InputError::new(
            &model.name,
            format!("`{path}` holds GPTQ/AWQ-packed weights; GGUF files are made from a float checkpoint"),
        )
        .with_fix("describe the unquantized model (its config.json) and set the GGUF type in the workload"));
    }
    let facts = &model.facts;
    let rules = Rules {
        file_type,
        layers: facts.layers.len() as u64,
        experts: facts.moe.as_ref().map_or(0, |m| u64::from(m.experts)),
        gqa: facts.num_attention_heads / facts.num_kv_heads.max(1),
        falcon: facts.model_type == "falcon",
        seventy_b: facts.model_type == "llama" && facts.layers.len() == 80,
        tied_embeddings: !plain.iter().any(|(_, role, ..)| *role == Role::Output),
        attention_wv: plain.iter().filter(|(_, role, ..)| is_attn_v(*role)).count() as u64,
    };
    let mut attention_wv_seen = 0u64;
    let mut out = Vec::with_capacity(plain.len());
    for (path, role, layer, tensor, module) in plain {
        let row_elements = row_elements(module, tensor);
        let rows = tensor.numel() / row_elements.max(1);
        // A fused `[E, 2I, H]` gate/up tensor is two GGUF tensors, `ffn_gate_exps` and
        // `ffn_up_exps`, each half the rows.
        let parts: Vec<(Role, u64)> = if role == Role::FfnGate && tensor.name.contains("gate_up") {
            vec![(Role::FfnGate, rows / 2), (Role::FfnUp, rows - rows / 2)]
        } else {
            vec![(role, rows)]
        };
        for (part_role, part_rows) in parts {
            let ggml_type = if part_role == Role::Kept || effective_dims(tensor) < 2 {
                kept_type(tensor)
            } else {
                let wanted =
                    rules.tensor_type(part_role, layer.unwrap_or(0), row_elements, attention_wv_seen);
                fit_row(wanted, row_elements)
            };
            if is_attn_v(part_role) {
                attention_wv_seen += 1;
            }
            let bytes = ggml_type.row_bytes(row_elements).saturating_mul(part_rows);
            out.push(GgufTensor {
                path: path.clone(),
                role: part_role,
                layer,
                ggml_type,
                row_elements,
                rows: part_rows,
                bytes,
            });
        }
    }
    Ok(out)
}

fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() { name.to_string() } else { format!("{parent}.{name}") }
}

/// Dimensions larger than one (`ggml_n_dims`): a `[1, H]` gate is a vector to ggml.
fn effective_dims(tensor: &Tensor) -> usize {
    tensor.shape.iter().filter(|&&d| d > 1).count()
}

fn is_attn_v(role: Role) -> bool {
    matches!(role, Role::AttnV | Role::AttnQkv | Role::AttnKvB)
}

/// Elements per row: the input features. `nn.Linear` and fused expert tensors keep them last;
/// GPT-2's `Conv1D` stores `[in, out]` and the converter transposes it.
fn row_elements(module: &Module, tensor: &Tensor) -> u64 {
    let dims = &tensor.shape;
    let value = if module.class == "Conv1D" && dims.len() == 2 { dims.first() } else { dims.last() };
    value.copied().unwrap_or(1).max(1)
}

/// The type of a tensor `llama-quantize` leaves alone: 1-D tensors (norms, biases), routers and
/// position embeddings are F32 as the converter writes them; other 2-D tensors (expert biases)
/// F16, the converter's default output type.
fn kept_type(tensor: &Tensor) -> GgmlType {
    if effective_dims(tensor) < 2 || tensor.name == "weight" { GgmlType::F32 } else { GgmlType::F16 }
}

/// The type actually written: the wanted one, or its fallback when a row does not hold whole
/// blocks, or F16 when even that does not fit (`tensor_type_fallback`).
fn fit_row(wanted: GgmlType, row_elements: u64) -> GgmlType {
    if row_elements.is_multiple_of(wanted.block_size()) {
        return wanted;
    }
    let fallback = fallback(wanted);
    if row_elements.is_multiple_of(fallback.block_size()) { fallback } else { GgmlType::F16 }
}

/// Linear names and the category llama.cpp gives their GGUF tensors.
const LINEAR_ROLES: &[(&[&str], Role)] = &[
    (&["q_proj", "query"], Role::AttnQ),
    (&["k_proj", "key"], Role::AttnK),
    (&["v_proj", "value"], Role::AttnV),
    (&["qkv_proj", "query_key_value", "c_attn", "Wqkv", "wqkv"], Role::AttnQkv),
    (&["kv_b_proj"], Role::AttnKvB),
    (&["o_proj", "out_proj", "wo"], Role::AttnOutput),
    (&["gate_proj", "w1"], Role::FfnGate),
    (&["up_proj", "w3", "fc1", "c_fc", "fc_in", "dense_h_to_4h"], Role::FfnUp),
    (&["down_proj", "w2", "fc2", "fc_out", "dense_4h_to_h"], Role::FfnDown),
];

fn role_of(model: &ModelDescription, module: &Module, tensor: &Tensor) -> Role {
    let name = module.name();
    let bias = tensor.name == "bias" || tensor.name.ends_with("_bias");
    match module.kind {
        ModuleKind::Embedding => {
            if tensor.shape.first() == Some(&model.facts.vocab_size) {
                Role::TokenEmbedding
            } else {
                Role::Kept
            }
        }
        ModuleKind::Experts { .. } if bias => Role::Kept,
        ModuleKind::Experts { .. } => {
            if tensor.name.contains("gate_up") {
                Role::FfnGate
            } else if tensor.name.contains("down") {
                Role::FfnDown
            } else {
                Role::Other
            }
        }
        ModuleKind::Linear if bias => Role::Kept,
        ModuleKind::Linear => {
            let parent = module.path.rsplit_once('.').map_or("", |(p, _)| p);
            let in_attention = parent.contains("attn") || parent.contains("attention");
            if matches!(name, "lm_head" | "embed_out") {
                Role::Output
            } else if matches!(name, "c_proj" | "dense") {
                // GPT-2 and GPT-NeoX-style names are shared by attention and MLP.
                if in_attention { Role::AttnOutput } else { Role::FfnDown }
            } else {
                LINEAR_ROLES.iter().find(|(names, _)| names.contains(&name)).map_or(Role::Other, |(_, r)| *r)
            }
        }
        ModuleKind::Norm
        | ModuleKind::Router
        | ModuleKind::Container
        | ModuleKind::Block
        | ModuleKind::Other => {
            if module.kind == ModuleKind::Container && tensor.shape.len() >= 2 {
                Role::Other
            } else {
                Role::Kept
            }
        }
    }
}

/// llama.cpp's tensor names (`llm_tensor` in `llama-arch.cpp`) and their roles.
const GGUF_ROLES: &[(&str, Role)] = &[
    ("token_embd", Role::TokenEmbedding),
    ("output", Role::Output),
    ("attn_q", Role::AttnQ),
    ("attn_k", Role::AttnK),
    ("attn_v", Role::AttnV),
    ("attn_qkv", Role::AttnQkv),
    ("attn_kv_b", Role::AttnKvB),
    ("attn_output", Role::AttnOutput),
    ("ffn_gate", Role::FfnGate),
    ("ffn_gate_exps", Role::FfnGate),
    ("ffn_up", Role::FfnUp),
    ("ffn_up_exps", Role::FfnUp),
    ("ffn_down", Role::FfnDown),
    ("ffn_down_exps", Role::FfnDown),
];

/// Every tensor of a model read from a GGUF file, with the type and bytes it has there.
fn stored(model: &ModelDescription) -> Vec<GgufTensor> {
    let mut out = Vec::new();
    let layers: Vec<&str> = model.facts.layers.iter().map(|l| l.path.as_str()).collect();
    model.root.visit(&mut |module| {
        for tensor in &module.tensors {
            let path = join(&module.path, &tensor.name);
            let layer = layers
                .iter()
                .position(|l| path.strip_prefix(l).is_some_and(|rest| rest.starts_with('.')))
                .map(|i| i as u64);
            let role = if tensor.name == "weight" {
                GGUF_ROLES.iter().find(|(name, _)| *name == module.name()).map_or(Role::Other, |(_, r)| *r)
            } else {
                Role::Kept
            };
            let role = if role == Role::Other && effective_dims(tensor) < 2 { Role::Kept } else { role };
            let ggml_type = match tensor.dtype {
                DType::Ggml(ty) => ty,
                DType::F32 => GgmlType::F32,
                DType::BF16 => GgmlType::BF16,
                DType::F64 => GgmlType::F64,
                DType::I8 => GgmlType::I8,
                DType::I16 => GgmlType::I16,
                DType::I32 => GgmlType::I32,
                DType::I64 => GgmlType::I64,
                _ => GgmlType::F16,
            };
            let row_elements = tensor.shape.last().copied().unwrap_or(1).max(1);
            out.push(GgufTensor {
                path,
                role,
                layer,
                ggml_type,
                row_elements,
                rows: tensor.numel() / row_elements,
                bytes: tensor.bytes(),
            });
        }
    });
    out
}

/// `use_more_bits` of llama-quant.cpp: the first and last eighth of the layers and every third
/// layer in between.
pub fn use_more_bits(layer: u64, layers: u64) -> bool {
    let eighth = layers / 8;
    layer < eighth || layer >= 7 * layers / 8 || (layer - eighth) % 3 == 2
}

impl Rules {
    /// `llama_tensor_get_type_impl` for the non-i-quant file types. `layer` is the block of an
    /// FFN tensor; `wv_index` counts the `attn_v`-like tensors before this one.
    fn tensor_type(&self, role: Role, layer: u64, row_elements: u64, wv_index: u64) -> GgmlType {
        use FileType as F;
        use GgmlType as G;
        let default = self.file_type.default_type();
        if !default.is_quantized() {
            return default;
        }
        let ft = self.file_type;
        let n = self.layers;
        let eight_experts = self.experts == 8;
        match role {
            Role::Output | Role::TokenEmbedding if role == Role::Output || self.tied_embeddings => {
                if self.falcon || !row_elements.is_multiple_of(default.block_size()) {
                    G::Q8_0
                } else if default != G::Q8_0 {
                    G::Q6_K
                } else {
                    default
                }
            }
            Role::AttnV | Role::AttnQkv | Role::AttnKvB => {
                let mut t = match ft {
                    F::Q2_K => {
                        if self.gqa >= 4 {
                            G::Q4_K
                        } else {
                            G::Q3_K
                        }
                    }
                    F::Q2_K_S if self.gqa >= 4 => G::Q4_K,
                    F::Q3_K_M => {
                        if wv_index < 2 {
                            G::Q5_K
                        } else {
                            G::Q4_K
                        }
                    }
                    F::Q3_K_L => G::Q5_K,
                    F::Q4_K_M | F::Q5_K_M if use_more_bits(wv_index, self.attention_wv) => G::Q6_K,
                    F::Q4_K_S if wv_index < 4 => G::Q5_K,
                    _ => default,
                };
                if self.seventy_b && matches!(t, G::Q3_K | G::Q4_K) {
                    t = G::Q5_K;
                }
                if eight_experts {
                    t = G::Q8_0;
                }
                t
            }
            Role::AttnK if eight_experts => G::Q8_0,
            Role::FfnDown => match ft {
                F::Q2_K => G::Q3_K,
                F::Q2_K_S if layer < n / 8 => G::Q4_K,
                F::Q3_K_M => {
                    if layer < n / 16 {
                        G::Q5_K
                    } else if !self.falcon || use_more_bits(layer, n) {
                        G::Q4_K
                    } else {
                        G::Q3_K
                    }
                }
                F::Q3_K_L => {
                    if self.falcon {
                        G::Q4_K
                    } else {
                        G::Q5_K
                    }
                }
                F::Q4_K_M if self.falcon => {
                    if layer < n / 16 {
                        G::Q6_K
                    } else if use_more_bits(layer, n) {
                        G::Q5_K
                    } else {
                        G::Q4_K
                    }
                }
                F::Q4_K_M | F::Q5_K_M if use_more_bits(layer, n) => G::Q6_K,
                F::Q4_K_S if !self.falcon && layer < n / 8 => G::Q5_K,
                _ => default,
            },
            Role::AttnOutput => {
                if self.falcon {
                    if ft == F::Q3_K_L { G::Q4_K } else { default }
                } else if eight_experts {
                    match ft {
                        F::Q2_K | F::Q3_K_S | F::Q3_K_M | F::Q4_K_S | F::Q4_K_M => G::Q5_K,
                        _ => default,
                    }
                } else {
                    match ft {
                        F::Q2_K => G::Q3_K,
                        F::Q3_K_M => G::Q4_K,
                        F::Q3_K_L => G::Q5_K,
                        _ => default,
                    }
                }
            }
            _ => default,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_layouts_give_the_published_bits_per_weight() {
        // ggml k-quants PR #1684: Q2_K 2.625, Q3_K 3.4375, Q4_K 4.5, Q5_K 5.5, Q6_K 6.5625 bpw.
        assert_eq!(GgmlType::Q2_K.bits_per_weight(), 2.625);
        assert_eq!(GgmlType::Q3_K.bits_per_weight(), 3.4375);
        assert_eq!(GgmlType::Q4_K.bits_per_weight(), 4.5);
        assert_eq!(GgmlType::Q5_K.bits_per_weight(), 5.5);
        assert_eq!(GgmlType::Q6_K.bits_per_weight(), 6.5625);
        assert_eq!(GgmlType::Q8_0.bits_per_weight(), 8.5);
        assert_eq!(GgmlType::Q4_0.bits_per_weight(), 4.5);
        assert_eq!(GgmlType::Q5_1.bits_per_weight(), 6.0);
    }

    #[test]
    fn more_bits_go_to_half_of_32_layers() {
        let chosen: Vec<u64> = (0..32).filter(|&i| use_more_bits(i, 32)).collect();
        assert_eq!(chosen, [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]);
    }

    #[test]
    fn file_types_parse_with_aliases_and_reject_unknown_ones() {
        assert_eq!(FileType::parse("q4_k_m").ok(), Some(FileType::Q4_K_M));
        assert_eq!(FileType::parse("Q4_K").ok(), Some(FileType::Q4_K_M));
        assert_eq!(FileType::parse("fp16").ok(), Some(FileType::F16));
        let err = FileType::parse("IQ2_XS").err();
        assert!(err.is_some_and(|e| e.fix.is_some_and(|f| f.contains("Q4_K_M"))));
    }

    #[test]
    fn rows_that_are_not_whole_k_blocks_fall_back() {
        // DeepSeek-V2-Lite's expert down projections have 1408 inputs: 5.5 blocks of 256.
        assert_eq!(fit_row(GgmlType::Q4_K, 1408), GgmlType::Q5_0);
        assert_eq!(fit_row(GgmlType::Q6_K, 1408), GgmlType::Q8_0);
        assert_eq!(fit_row(GgmlType::Q4_K, 100), GgmlType::F16);
        assert_eq!(fit_row(GgmlType::Q4_K, 4096), GgmlType::Q4_K);
    }
}
