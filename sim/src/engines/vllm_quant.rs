//! vLLM's quantizations other than bitsandbytes ([`super::vllm_bnb`]): the weights vLLM 0.19
//! holds after `process_weights_after_loading`, for `--quant fp8|awq|gptq` and for a checkpoint's
//! own `quantization_config`, and the combinations vLLM refuses. Sources: the vLLM 0.19.0 wheel
//! (`vllm/model_executor/layers/quantization/`, `vllm/model_executor/kernels/linear/`,
//! `vllm/config/model.py`, `vllm/config/vllm.py`).
//!
//! - **fp8 from a floating-point checkpoint** (`--quantization fp8`, `Fp8OnlineLinearMethod` in
//!   `fp8.py`): every `LinearBase` and `FusedMoE` not in `ignored_layers` is created on the meta
//!   device, materialized in the model dtype as its shard loads, then quantized per tensor
//!   (`ops.scaled_fp8_quant(weight, scale=None)`): an fp8 e4m3 weight and one fp32 scale per
//!   vLLM layer (`qkv_proj` and `gate_up_proj` are fused: one scale for transformers' `q_proj`,
//!   `k_proj`, `v_proj`; per expert for `FusedMoE`, `Fp8OnlineMoEMethod`). The vocab-parallel embedding, `lm_head`, norms and routers stay in the model dtype.
//!   Below compute capability 8.9 the FP8 Marlin kernel takes over
//!   (`MarlinFP8ScaledMMLinearKernel`, `prepare_fp8_layer_for_marlin`): the weight is repacked
//!   (same bytes) and the scale becomes one value per output channel in the model dtype.
//!   Block-wise scales are for fp8 checkpoints only (`Fp8Config`: "The block-wise quantization
//!   only supports fp8-serialized checkpoint for now"), so `--group-size` plays no part.
//! - **fp8 checkpoints** (`quant_method: fp8`, block scales `weight_scale_inv`): held as stored
//!   from 8.9; below, FP8 Marlin turns the block scales into group scales
//!   `[in / block_in, out]` in the model dtype (and a per-tensor scale into `[1, out]`).
//! - **GPTQ and AWQ** (`gptq_marlin`, `awq_marlin`, chosen when `--quantization` is left out and
//!   the checkpoint qualifies: `is_gptq_marlin_compatible` needs `sym`, 4 or 8 bits, groups of
//!   −1, 32, 64 or 128). The kernel is picked per layer by `choose_mp_linear_kernel`
//!   (`kernels/linear/__init__.py`): Machete on compute capability 9.0 (groups −1, 64, 128;
//!   input features a multiple of 64, output features of 128), else Marlin from 7.5.
//!   - Marlin (`MarlinLinearKernel.process_weights_after_loading`): `qweight` repacked
//!     (`gptq_marlin_repack`, same bytes), scales permuted (same bytes); GPTQ's `qzeros` replaced
//!     by an empty tensor (symmetric), AWQ's converted to Marlin zero points (same bytes);
//!     `g_idx` emptied unless `desc_act`, which keeps it sorted with an int32
//!     `g_idx_sort_indices` beside it.
//!   - Machete (`MacheteLinearKernel`): `qweight` prepacked (same bytes), scales as loaded, GPTQ's
//!     `qzeros` and `g_idx` left as loaded; AWQ's zero points pre-multiplied by the scales into
//!     a `[groups, out]` tensor in the activation dtype (`transform_w_zp`).
//!   - Both allocate a workspace of one int32 per SM (`marlin_make_workspace_new`: 528 B on an
//!     H100), not counted.
//!   - Otherwise (asymmetric GPTQ, other widths or groups, below 7.5) the plain kernels: GPTQ's
//!     ExLlama keeps the stored layout but empties `g_idx` unless `desc_act`
//!     (`GPTQLinearMethod.process_weights_after_loading`); AWQ's GEMM kernel the stored layout.
//!     8-bit GPTQ on Ampere may take AllSpark, sized here as Marlin.
//!   - `--quant gptq|awq` on a floating-point model is sized as that model's GPTQ (AWQ)
//!     checkpoint (transformers' `GPTQConfig` defaults: symmetric, no act-order; every linear of
//!     the blocks for GPTQ, every linear but `lm_head` for AWQ), served as vLLM serves it when
//!     `--quantization` is left out. vLLM has no online GPTQ or AWQ.
//! - **compressed-tensors**: the stored layout, with the 8-bit schemes' weight scales in fp32
//!   (`CompressedTensorsW8A8Fp8` through `create_fp8_scale_parameter`, `CompressedTensorsW8A8Int8`:
//!   `torch.empty((sum(output_partition_sizes), 1), dtype=torch.float32)`) where the checkpoint
//!   stores them in the model dtype. Below 8.9 the fp8 scheme falls back to W8A16 FP8 Marlin
//!   (not modelled apart: the scales differ by two bytes an output row).
//! - **GGUF** (`--quant Q4_K_M` and the other llama.cpp types, `gguf.py`: `GGUFLinearMethod`,
//!   `GGUFEmbeddingMethod`, `GGUFMoEMethod`): each tensor the file stores in a quantized ggml
//!   type is held as its raw blocks (the file's bytes, [`super::gguf::quantize`]): linears,
//!   experts, the token embedding and the output head alike; tensors stored as F32/F16/BF16
//!   (norms, biases, routers) are ordinary parameters in the model dtype (`UNQUANTIZED_TYPES`).
//! - **MXFP4, bitsandbytes checkpoints**: the stored layout (MXFP4's Marlin padding is not
//!   modelled, docs/memory-model.md).
//! - **Load peak**: a transient the loading adds over the weights: online fp8 materializes one
//!   layer's shard in the model dtype before quantizing it; Marlin and Machete write the repacked
//!   `qweight` beside the loaded one (FP8 Marlin also its int32 packing). The largest single
//!   layer's transient, on top of the weights, is [`Held::load_transient_bytes`].
//!
//! Refusals (vLLM's own): a `--quant` that names another method than the checkpoint's
//! `quantization_config` (`ModelConfig._verify_quantization`); a GPU below the method's
//! `get_min_capability` (`VllmConfig._get_quantization_config`: fp8, AWQ, compressed-tensors
//! 7.5; GPTQ and GGUF 6.0; MXFP4 8.0); a `--dtype` the method's kernels do not take
//! (`get_supported_act_dtypes`: fp8 and the Marlin kernels take fp16 and bf16, never fp32).

use super::gguf::{self, FileType};
use super::vllm_bnb;
use crate::workload::Quant;
use std::collections::HashMap;
use vramplan_profiles::hardware::{ComputeCapability, Device};
use vramplan_profiles::model::quantization::{Method, Quantization, converted};
use vramplan_profiles::model::{ModelDescription, Module, ModuleKind, Tensor, TensorKind, join};
use vramplan_profiles::{DType, InputError};

/// Which kernel holds a quantized linear's weights on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// The stored layout: fp8 with fp32 scales (CUTLASS, from 8.9), GPTQ's ExLlama and AWQ's
    /// GEMM kernels, compressed-tensors, MXFP4.
    Stored,
    /// fp8 quantized on load, per tensor (8.9 and later).
    OnlineFp8,
    /// FP8 Marlin, weight-only (7.5 to 8.9), for an online or a stored fp8 weight.
    Fp8Marlin,
    /// GPTQ/AWQ Marlin (7.5 and later but 9.0).
    Marlin,
    /// GPTQ/AWQ Machete (9.0).
    Machete,
}

impl Kernel {
    /// vLLM's name for the kernel, as its log says it.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Stored => "stored layout",
            Kernel::OnlineFp8 => "fp8 (quantized on load, per tensor)",
            Kernel::Fp8Marlin => "FP8 Marlin (weight-only)",
            Kernel::Marlin => "MarlinLinearKernel",
            Kernel::Machete => "MacheteLinearKernel",
        }
    }
}

/// The model as vLLM holds it under a quantization.
#[derive(Debug, Clone)]
pub struct Held {
    /// The description of the weights held.
    pub model: ModelDescription,
    /// The kernel that sets the layout.
    pub kernel: Kernel,
    /// The largest transient one layer's processing adds over the weights while loading, on
    /// the whole model (divide by the tensor-parallel size for a rank).
    pub load_transient_bytes: u64,
    /// What was done, for notes.
    pub note: String,
}

const fn cc(major: u32, minor: u32) -> ComputeCapability {
    ComputeCapability { major, minor }
}

/// vLLM's `--quantization` name for a workload's `quant`; `None` for plain weights.
fn flag_name(quant: &Quant) -> Option<&'static str> {
    match quant {
        Quant::None => None,
        Quant::Fp8 { .. } => Some("fp8"),
        Quant::Gptq { .. } => Some("gptq"),
        Quant::Awq { .. } => Some("awq"),
        Quant::Nf4 { .. } | Quant::Fp4 { .. } | Quant::Int8 => Some("bitsandbytes"),
        Quant::Gguf { .. } => Some("gguf"),
    }
}

/// The `quant_method` of a checkpoint's `quantization_config` as vLLM compares it.
fn checkpoint_name(quantization: &Quantization) -> String {
    match &quantization.method {
        Method::Fp8 { .. } => "fp8".into(),
        Method::Mxfp4 { .. } => "mxfp4".into(),
        Method::Gptq { .. } => "gptq".into(),
        Method::Awq { .. } => "awq".into(),
        Method::Bitsandbytes4 { .. } | Method::Bitsandbytes8 => "bitsandbytes".into(),
        Method::CompressedTensors { .. } => "compressed-tensors".into(),
        Method::Other { name } => name.clone(),
    }
}

/// `get_min_capability` of vLLM 0.19's config class for `method`.
fn min_capability(method: &str) -> Option<ComputeCapability> {
    match method {
        "fp8" | "awq" | "compressed-tensors" => Some(cc(7, 5)),
        "gptq" | "gguf" => Some(cc(6, 0)),
        "mxfp4" => Some(cc(8, 0)),
        "bitsandbytes" => Some(cc(7, 0)),
        _ => None,
    }
}

/// The settings vLLM refuses for `model` under `quant` on `device` with activations in
/// `act_dtype`: a `--quant` that contradicts the checkpoint, a GPU below the method's minimum,
/// a dtype the method's kernels do not take.
pub fn check(
    model: &ModelDescription,
    quant: &Quant,
    device: &Device,
    act_dtype: DType,
) -> Result<(), InputError> {
    let flag = flag_name(quant);
    let stored = model.quantization.as_ref().map(checkpoint_name);
    if let (Some(flag), Some(stored)) = (flag, stored.as_deref())
        && flag != stored
    {
        return Err(InputError::new(
            "--quant",
            format!(
                "vLLM refuses it: \"Quantization method specified in the model config ({stored}) does not \
                 match the quantization method specified in the `quantization` argument ({flag})\""
            ),
        )
        .with_fix(format!(
            "leave `--quant` out: vLLM reads the checkpoint's own `quantization_config` ({stored}); a \
             {flag} model needs a {flag} checkpoint"
        )));
    }
    let Some(method) = stored.as_deref().or(flag) else { return Ok(()) };
    let capability = device.compute_capability;
    if let Some(needs) = min_capability(method)
        && capability < needs
    {
        return Err(InputError::new(
            "--hardware",
            format!(
                "vLLM refuses it: \"The quantization method {method} is not supported for the current GPU. \
                 Minimum capability: {}{}. Current capability: {}{}.\" ({})",
                needs.major, needs.minor, capability.major, capability.minor, device.name
            ),
        )
        .with_fix(format!(
            "use a GPU of compute capability {needs} or later, or plain weights (`--quant none`)"
        )));
    }
    let half_only = matches!(method, "fp8" | "awq" | "gptq");
    if half_only && !matches!(act_dtype, DType::BF16 | DType::F16) {
        return Err(InputError::new(
            "--dtype",
            format!(
                "vLLM refuses it: {} is not supported for quantization method {method} (its kernels take \
                 float16 and bfloat16)",
                act_dtype.name()
            ),
        )
        .with_fix("use `--dtype bf16` or `--dtype fp16`"));
    }
    Ok(())
}

/// `model` as vLLM holds it under `quant` (a flag) or its own `quantization_config` on `device`,
/// with activations in `act_dtype`; `None` when neither applies (plain weights, or
/// bitsandbytes, which [`super::vllm_bnb`] sizes). [`check`] first. A GGUF type that does not
/// parse, or a GGUF of packed weights, is an [`InputError`].
pub fn held(
    model: &ModelDescription,
    quant: &Quant,
    device: &Device,
    act_dtype: DType,
) -> Result<Option<Held>, InputError> {
    let capability = device.compute_capability;
    let fp8_native = capability >= cc(8, 9);
    let checkpoint = match (&model.quantization, quant) {
        (Some(q), _) => q.clone(),
        (None, Quant::Fp8 { .. }) => return Ok(Some(online_fp8(model, fp8_native, act_dtype))),
        (None, Quant::Gguf { quant_type }) => return gguf_blocks(model, quant_type).map(Some),
        (None, Quant::Gptq { bits, group_size }) => Quantization {
            method: Method::Gptq {
                bits: *bits,
                group_size: group_of(*group_size),
                sym: true,
                desc_act: false,
            },
            skip: None,
        },
        (None, Quant::Awq { bits, group_size }) => Quantization {
            method: Method::Awq { bits: *bits, group_size: group_of(*group_size), zero_point: true },
            skip: None,
        },
        (None, _) => return Ok(None),
    };
    let mut stored = converted(model, &checkpoint);
    Ok(Some(match checkpoint.method {
        Method::Gptq { bits, group_size, sym, desc_act } => {
            let marlin_ok =
                sym && matches!(bits, 4 | 8) && marlin_group(group_size) && capability >= cc(7, 5);
            packed_experts(&mut stored, bits, group_size, false, act_dtype);
            if !marlin_ok {
                return Ok(Some(exllama(stored, desc_act)));
            }
            let kernel = mp_kernel(capability, group_size);
            packed_int(stored, kernel, Zeros::Gptq { desc_act }, act_dtype)
        }
        Method::Awq { bits, group_size, .. } if bits == 4 && marlin_group(group_size) => {
            packed_experts(&mut stored, bits, group_size, true, act_dtype);
            let kernel = mp_kernel(capability, group_size);
            packed_int(stored, kernel, Zeros::Awq, act_dtype)
        }
        Method::Fp8 { .. } if !fp8_native => fp8_marlin_scales(stored, act_dtype),
        Method::CompressedTensors { .. } => compressed_scales(stored),
        _ => unchanged(stored, "the checkpoint's stored layout"),
    }))
}

/// `model` from a GGUF file of `quant_type` as vLLM holds it: each tensor the file quantizes
/// replaced by its blocks (uint8, `[rows…, row bytes]`, the output dimension kept so that tensor
/// parallelism splits it as vLLM does), the float ones left in the model dtype.
fn gguf_blocks(model: &ModelDescription, quant_type: &str) -> Result<Held, InputError> {
    let file_type = FileType::parse(quant_type)?;
    let mut blocks: HashMap<String, u64> = HashMap::new();
    for tensor in gguf::quantize(model, file_type)?.into_iter().filter(|t| t.ggml_type.is_quantized()) {
        *blocks.entry(tensor.path).or_default() += tensor.bytes;
    }
    let mut out = model.clone();
    let mut largest = 0u64;
    out.root.visit_mut(&mut |module| {
        let path = module.path.clone();
        for tensor in &mut module.tensors {
            let Some(&bytes) = blocks.get(&join(&path, &tensor.name)) else { continue };
            let Some((&inputs, rows)) = tensor.shape.split_last() else { continue };
            let rows = rows.to_vec();
            let row_count: u64 = rows.iter().product::<u64>().max(1);
            let row_bytes = bytes.div_ceil(row_count);
            let per_element = u32::try_from(inputs.div_ceil(row_bytes.max(1))).unwrap_or(u32::MAX).max(1);
            tensor.shape = rows.into_iter().chain([row_bytes]).collect();
            tensor.dtype = DType::U8;
            tensor.kind = TensorKind::PackedParameter { per_element };
            tensor.follows_load_dtype = false;
            largest = largest.max(bytes);
        }
    });
    let note = format!(
        "the {} GGUF file's quantized tensors held as their ggml blocks (embedding and output included)",
        file_type.name()
    );
    Ok(Held { model: out, kernel: Kernel::Stored, load_transient_bytes: 0, note })
}

/// A GPTQ checkpoint under the ExLlama kernel (`GPTQLinearMethod.process_weights_after_loading`):
/// as stored, but `g_idx` emptied unless `desc_act` (then sorted in place).
fn exllama(mut model: ModelDescription, desc_act: bool) -> Held {
    if !desc_act {
        model.root.visit_mut(&mut |module| {
            if module.tensors.iter().any(|t| t.name == "qweight") {
                module.tensors.retain(|t| t.name != "g_idx");
            }
        });
    }
    unchanged(model, "GPTQ under the ExLlama kernel (not Marlin-compatible): the stored layout")
}

/// A `--group-size` as a `quantization_config` group (`None` for one group a row).
fn group_of(size: u32) -> Option<u64> {
    if size == 0 { None } else { Some(u64::from(size)) }
}

/// Group sizes the Marlin kernels take (`MARLIN_SUPPORTED_GROUP_SIZES`: −1, 32, 64, 128).
fn marlin_group(group: Option<u64>) -> bool {
    matches!(group, None | Some(32 | 64 | 128))
}

/// The mixed-precision kernel `choose_mp_linear_kernel` picks: Machete on 9.0 with groups of −1,
/// 64 or 128, else Marlin. (Shapes Machete cannot take fall back per layer; see [`packed_int`].)
fn mp_kernel(capability: ComputeCapability, group: Option<u64>) -> Kernel {
    let machete_group = matches!(group, None | Some(64 | 128));
    if capability == cc(9, 0) && machete_group { Kernel::Machete } else { Kernel::Marlin }
}

fn unchanged(model: ModelDescription, what: &str) -> Held {
    Held { model, kernel: Kernel::Stored, load_transient_bytes: 0, note: what.to_string() }
}

/// A compressed-tensors checkpoint: the 8-bit schemes' `weight_scale` in fp32, as vLLM creates it.
fn compressed_scales(mut model: ModelDescription) -> Held {
    model.root.visit_mut(&mut |module| {
        let eight_bit =
            module.tensors.iter().any(|t| t.name == "weight" && matches!(t.dtype, DType::F8E4M3 | DType::I8));
        if eight_bit {
            for tensor in module.tensors.iter_mut().filter(|t| t.name == "weight_scale") {
                tensor.dtype = DType::F32;
            }
        }
    });
    unchanged(model, "the compressed-tensors layout, 8-bit weight scales in fp32")
}

/// The float matrices vLLM's fp8 method quantizes: the weights of every linear and experts
/// module but the output head (the bitsandbytes loader's set, [`vllm_bnb::quantizable`]).
fn online_fp8(model: &ModelDescription, native: bool, act_dtype: DType) -> Held {
    let mut out = model.clone();
    let head = crate::model::units::head_path(model);
    let act = act_dtype.bytes_for(1).max(1);
    let mut layers: HashMap<String, u64> = HashMap::new();
    out.root.visit_mut(&mut |module| {
        if !vllm_bnb::quantizable(module.kind) || Some(module.path.as_str()) == head.as_deref() {
            return;
        }
        let (layer, fused_tail) = fused_layer(&module.path);
        let mut scales = Vec::new();
        let mut float_bytes = 0u64;
        for tensor in module.tensors.iter_mut().filter(|t| vllm_bnb::is_weight(t)) {
            float_bytes += tensor.numel() * act;
            // One scale per layer (per expert for stacked experts), which a fused layer's first
            // projection carries; Marlin: one per output row.
            let leading: u64 = tensor.shape.iter().rev().skip(2).product();
            let rows = tensor.shape[tensor.shape.len() - 2];
            if !native {
                scales.push(Tensor::constant(&format!("{}_scale", tensor.name), &[leading, rows], act_dtype));
            } else if !fused_tail {
                scales.push(Tensor::constant(&format!("{}_scale", tensor.name), &[leading], DType::F32));
            }
            tensor.dtype = DType::F8E4M3;
            tensor.follows_load_dtype = false;
        }
        // Online quantization materializes vLLM's (fused) layer in the model dtype; Marlin then
        // packs the fp8 weight to int32 and repacks it (two more copies of the fp8 bytes).
        let marlin = if native { 0 } else { 2 * float_bytes / act };
        *layers.entry(layer).or_default() += float_bytes + marlin;
        module.tensors.extend(scales);
    });
    let transient = layers.values().copied().max().unwrap_or(0);
    let kernel = if native { Kernel::OnlineFp8 } else { Kernel::Fp8Marlin };
    let note = format!(
        "the linear and expert weights are quantized to fp8 on load; embeddings, lm_head and norms stay in {}",
        act_dtype.name()
    );
    Held { model: out, kernel, load_transient_bytes: transient, note }
}

/// The vLLM layer a transformers module belongs to, and whether it is a later part of a fused
/// one: `QKVParallelLinear` takes `q_proj`, `k_proj`, `v_proj`; `MergedColumnParallelLinear`
/// `gate_proj` and `up_proj` (Mixtral's experts: `w1` and `w3`).
fn fused_layer(path: &str) -> (String, bool) {
    let (parent, name) = path.rsplit_once('.').unwrap_or(("", path));
    match name {
        "q_proj" => (format!("{parent}.qkv_proj"), false),
        "k_proj" | "v_proj" => (format!("{parent}.qkv_proj"), true),
        "gate_proj" => (format!("{parent}.gate_up_proj"), false),
        "up_proj" => (format!("{parent}.gate_up_proj"), true),
        "w1" => (format!("{parent}.w13"), false),
        "w3" => (format!("{parent}.w13"), true),
        _ => (path.to_string(), false),
    }
}

/// What becomes of a packed-integer checkpoint's zero points.
#[derive(Debug, Clone, Copy)]
enum Zeros {
    /// GPTQ (symmetric): no zero points used; `g_idx` kept only with act-order.
    Gptq { desc_act: bool },
    /// AWQ: zero points used.
    Awq,
}

/// A GPTQ/AWQ checkpoint's linears after `kernel`'s `process_weights_after_loading`.
fn packed_int(mut model: ModelDescription, kernel: Kernel, zeros: Zeros, act_dtype: DType) -> Held {
    let mut layers: HashMap<String, u64> = HashMap::new();
    model.root.visit_mut(&mut |module| {
        if !module.tensors.iter().any(|t| t.name == "qweight") {
            return;
        }
        let dims = packed_dims(module);
        // Machete needs in % 64 and out % 128; a layer it cannot take goes to Marlin.
        let kernel = match (kernel, dims) {
            (Kernel::Machete, Some((out, inp))) if inp % 64 != 0 || out % 128 != 0 => Kernel::Marlin,
            (kernel, _) => kernel,
        };
        let qweight = module.tensors.iter().find(|t| t.name == "qweight").map_or(0, Tensor::bytes);
        *layers.entry(fused_layer(&module.path).0).or_default() += qweight;
        match (kernel, zeros) {
            (Kernel::Marlin, Zeros::Gptq { desc_act }) => {
                module.tensors.retain(|t| t.name != "qzeros");
                if desc_act {
                    if let Some(g_idx) = module.tensors.iter().find(|t| t.name == "g_idx") {
                        let sort = Tensor::constant("g_idx_sort_indices", &g_idx.shape.clone(), DType::I32);
                        module.tensors.push(sort);
                    }
                } else {
                    module.tensors.retain(|t| t.name != "g_idx");
                }
            }
            (Kernel::Machete, Zeros::Awq) => {
                let scales = module.tensors.iter().find(|t| t.name == "scales").map(|t| t.shape.clone());
                if let (Some(shape), Some(zeros)) =
                    (scales, module.tensors.iter_mut().find(|t| t.name == "qzeros"))
                {
                    *zeros = Tensor::constant("qzeros", &shape, act_dtype);
                }
            }
            _ => {}
        }
    });
    let what = match zeros {
        Zeros::Gptq { .. } => "GPTQ",
        Zeros::Awq => "AWQ",
    };
    let note = format!("the {what} weights repacked for the kernel");
    let transient = layers.values().copied().max().unwrap_or(0);
    Held { model, kernel, load_transient_bytes: transient, note }
}

/// The stacked experts of a mixture of experts under vLLM's AWQ and GPTQ MoE methods
/// (`AWQMarlinMoEMethod.create_weights`, `GPTQMarlinMoEMethod.create_weights`, vLLM 0.19
/// `model_executor/layers/quantization/awq_marlin.py`, `gptq_marlin.py`): `w13_qweight` and
/// `w2_qweight` hold `bits` per weight packed in int32 words, `w13_scales`/`w2_scales` one scale
/// in the model dtype per `group` inputs of each output (per output where the group is the whole
/// input), and AWQ's `qzeros` one zero point per scale packed like the weights; GPTQ's
/// symmetric Marlin path keeps no zero points. transformers' conversion leaves fused experts in
/// the float layout (it replaces `nn.Linear` modules only), so they are packed here; the bytes do
/// not depend on which of the two matrix dimensions is the input.
fn packed_experts(
    model: &mut ModelDescription,
    bits: u32,
    group: Option<u64>,
    zeros: bool,
    act_dtype: DType,
) {
    let packed = if bits <= 4 { DType::I4 } else { DType::I8 };
    model.root.visit_mut(&mut |module| {
        if !matches!(module.kind, ModuleKind::Experts { .. }) {
            return;
        }
        let mut constants = Vec::new();
        for tensor in module.tensors.iter_mut().filter(|t| vllm_bnb::is_weight(t) && t.shape.len() == 3) {
            let (experts, rows, cols) = (tensor.shape[0], tensor.shape[1], tensor.shape[2]);
            let inputs = rows.min(cols).max(1);
            let per_expert = rows * cols / group.unwrap_or(inputs).clamp(1, inputs);
            constants.push(Tensor::constant(
                &format!("{}_scales", tensor.name),
                &[experts, per_expert],
                act_dtype,
            ));
            if zeros {
                constants.push(Tensor::constant(
                    &format!("{}_qzeros", tensor.name),
                    &[experts, per_expert],
                    packed,
                ));
            }
            tensor.dtype = packed;
            tensor.follows_load_dtype = false;
        }
        module.tensors.extend(constants);
    });
}

/// `(out, in)` of a packed linear, from its `scales` `[groups, out]` and its logical parameters.
fn packed_dims(module: &Module) -> Option<(u64, u64)> {
    let out = *module.tensors.iter().find(|t| t.name == "scales")?.shape.last()?;
    let params: u64 = module
        .tensors
        .iter()
        .filter(|t| matches!(t.kind, TensorKind::PackedParameter { .. }))
        .map(Tensor::params)
        .sum();
    (out > 0).then(|| (out, params / out))
}

/// A stored fp8 checkpoint under FP8 Marlin: each linear's `weight_scale_inv` (block) or
/// `weight_scale` (tensor) becomes group scales `[in / block_in, out]` (`[1, out]` per tensor)
/// in the model dtype.
fn fp8_marlin_scales(mut model: ModelDescription, act_dtype: DType) -> Held {
    let block_in = match model.quantization.as_ref().map(|q| &q.method) {
        Some(Method::Fp8 { block: Some([_, cols]), .. }) => Some(*cols),
        _ => None,
    };
    let mut layers: HashMap<String, u64> = HashMap::new();
    model.root.visit_mut(&mut |module| {
        let Some(weight) = module.tensors.iter().find(|t| t.name == "weight" && t.dtype == DType::F8E4M3)
        else {
            return;
        };
        let [out, inp] = weight.shape[..] else { return };
        *layers.entry(fused_layer(&module.path).0).or_default() += 2 * weight.bytes();
        let groups = block_in.map_or(1, |b| inp.div_ceil(b.max(1)));
        for tensor in module.tensors.iter_mut() {
            if tensor.name == "weight_scale_inv" || tensor.name == "weight_scale" {
                *tensor = Tensor::constant(&tensor.name.clone(), &[groups, out], act_dtype);
            }
        }
    });
    let note = format!(
        "below compute capability 8.9, the fp8 checkpoint's scales per group in {}",
        act_dtype.name()
    );
    let transient = layers.values().copied().max().unwrap_or(0);
    Held { model, kernel: Kernel::Fp8Marlin, load_transient_bytes: transient, note }
}
