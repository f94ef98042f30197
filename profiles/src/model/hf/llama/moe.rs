//! The mixture-of-experts MLPs of the Llama-style decoders, in both transformers layouts.
//!
//! transformers 4.x and the checkpoints keep one module per expert
//! (`block_sparse_moe.experts.3.w1`, `mlp.experts.3.gate_proj`) and an `nn.Linear` router `gate`;
//! 5.x fuses each layer's experts into `mlp.experts.gate_up_proj` `[E, 2I, H]` and
//! `mlp.experts.down_proj` `[E, H, I]` (`MixtralExperts` and the classes derived from it) with a
//! `…TopKRouter` `gate`. gpt-oss has fused experts (`[E, H, 2I]` plus biases) and a biased
//! `router` in both. Expert modules are `ModuleKind::Experts` either way, which the summary's
//! active-parameter count relies on.

use crate::InputError;
use crate::model::hf::HfConfig;
use crate::model::{Builder, Module, ModuleKind, Naming};

/// Which MoE block a family uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MoeStyle {
    /// `MixtralSparseMoeBlock`: 4.x `block_sparse_moe` with `w1`/`w2`/`w3` experts.
    Mixtral,
    /// `Qwen2MoeSparseMoeBlock`: routed experts plus a gated `shared_expert`.
    Qwen2Moe,
    /// `Qwen3MoeSparseMoeBlock`.
    Qwen3Moe,
    /// `OlmoeSparseMoeBlock`.
    Olmoe,
    /// `GptOssMLP`: `router` with bias, fused experts with biases.
    GptOss,
}

impl MoeStyle {
    fn prefix(self) -> &'static str {
        match self {
            MoeStyle::Mixtral => "Mixtral",
            MoeStyle::Qwen2Moe => "Qwen2Moe",
            MoeStyle::Qwen3Moe => "Qwen3Moe",
            MoeStyle::Olmoe => "Olmoe",
            MoeStyle::GptOss => "GptOss",
        }
    }

    /// The config's `intermediate_size` is the width of one expert (there is no dense MLP).
    pub(super) fn intermediate_is_expert_size(self) -> bool {
        matches!(self, MoeStyle::Mixtral | MoeStyle::Olmoe | MoeStyle::GptOss)
    }
}

/// The sizes of one MoE layer.
#[derive(Debug, Clone, Copy)]
pub(super) struct MoeShape {
    pub(super) experts: u32,
    pub(super) top_k: u32,
    pub(super) expert_intermediate: u64,
    /// Width of the shared expert (Qwen2-MoE), 0 when there is none.
    pub(super) shared_intermediate: u64,
}

/// Reads the MoE sizes and which layers are sparse (the rest have a dense MLP), with
/// transformers' defaults for absent keys.
pub(super) fn read_shape(
    config: &HfConfig,
    style: MoeStyle,
    layers: u64,
) -> Result<(MoeShape, Vec<bool>), InputError> {
    let count = layers as usize;
    let expert_count = |keys: &[&str], default: u64, zero_allowed: bool| -> Result<u32, InputError> {
        let value =
            if zero_allowed { config.uint_or(keys, default)? } else { config.positive_or(keys, default)? };
        u32::try_from(value).map_err(|_| {
            InputError::new(config.origin(), format!("{value} experts is more than any model has"))
                .at_key(keys[0])
        })
    };
    let top_k_keys = ["num_experts_per_tok", "experts_per_token"];
    let (shape, sparse) = match style {
        MoeStyle::Mixtral | MoeStyle::Olmoe | MoeStyle::GptOss => {
            let (experts_key, experts_default, top_k_default) = match style {
                MoeStyle::Mixtral => ("num_local_experts", 8, 2),
                MoeStyle::Olmoe => ("num_experts", 64, 8),
                _ => ("num_local_experts", 128, 4),
            };
            let shape = MoeShape {
                experts: expert_count(&[experts_key], experts_default, false)?,
                top_k: expert_count(&top_k_keys, top_k_default, false)?,
                expert_intermediate: config.positive(&["intermediate_size"])?,
                shared_intermediate: 0,
            };
            (shape, vec![true; count])
        }
        MoeStyle::Qwen2Moe | MoeStyle::Qwen3Moe => {
            let qwen2 = style == MoeStyle::Qwen2Moe;
            let experts = expert_count(&["num_experts"], if qwen2 { 60 } else { 128 }, true)?;
            let shape = MoeShape {
                experts,
                top_k: expert_count(&top_k_keys, if qwen2 { 4 } else { 8 }, false)?,
                expert_intermediate: config
                    .positive_or(&["moe_intermediate_size"], if qwen2 { 1408 } else { 768 })?,
                shared_intermediate: if qwen2 {
                    config.uint_or(&["shared_expert_intermediate_size"], 5632)?
                } else {
                    0
                },
            };
            let step = config.positive_or(&["decoder_sparse_step"], 1)? as usize;
            let dense_only = config.uint_list(&["mlp_only_layers"])?.unwrap_or_default();
            let sparse = (0..count)
                .map(|i| !dense_only.contains(&(i as u64)) && experts > 0 && (i + 1) % step == 0)
                .collect();
            (shape, sparse)
        }
    };
    Ok((shape, sparse))
}

/// The MoE MLP of the layer at `layer`, named and laid out as `naming` says.
pub(super) fn sparse_block(
    b: &Builder,
    style: MoeStyle,
    naming: Naming,
    layer: &str,
    hidden: u64,
    shape: &MoeShape,
) -> Module {
    let prefix = style.prefix();
    let experts = u64::from(shape.experts);
    let inter = shape.expert_intermediate;
    if style == MoeStyle::GptOss {
        // Fused in every transformers version that has gpt-oss.
        let mlp = b.container(layer, "mlp", "GptOssMLP");
        let p = mlp.path.clone();
        return mlp
            .with_child(b.router(&p, "router", "GptOssTopKRouter", hidden, shape.experts, true))
            .with_child(b.fused_experts(
                &p,
                "experts",
                "GptOssExperts",
                shape.experts,
                &[
                    ("gate_up_proj", &[experts, hidden, 2 * inter]),
                    ("gate_up_proj_bias", &[experts, 2 * inter]),
                    ("down_proj", &[experts, inter, hidden]),
                    ("down_proj_bias", &[experts, hidden]),
                ],
            ));
    }
    let name = if style == MoeStyle::Mixtral && naming == Naming::V4 { "block_sparse_moe" } else { "mlp" };
    let block = b.container(layer, name, &format!("{prefix}SparseMoeBlock"));
    let p = block.path.clone();
    let block = match naming {
        Naming::V4 => {
            let expert_class = if style == MoeStyle::Mixtral {
                "MixtralBlockSparseTop2MLP".to_string()
            } else {
                format!("{prefix}MLP")
            };
            let projections: [(&str, u64, u64); 3] = if style == MoeStyle::Mixtral {
                // MixtralBlockSparseTop2MLP: w1 (gate), w2 (down), w3 (up), in that order.
                [("w1", hidden, inter), ("w2", inter, hidden), ("w3", hidden, inter)]
            } else {
                [("gate_proj", hidden, inter), ("up_proj", hidden, inter), ("down_proj", inter, hidden)]
            };
            let make = |_: u32, path: &str| {
                Module::new(path, expert_class.as_str(), ModuleKind::Container).with_children(
                    projections
                        .iter()
                        .map(|(name, input, output)| b.linear(path, name, *input, *output, false)),
                )
            };
            block
                .with_child(b.router(&p, "gate", "Linear", hidden, shape.experts, false))
                .with_child(b.expert_list(&p, "experts", shape.experts, make))
        }
        Naming::V5 => {
            let router = b.router(&p, "gate", &format!("{prefix}TopKRouter"), hidden, shape.experts, false);
            let fused = b.fused_experts(
                &p,
                "experts",
                &format!("{prefix}Experts"),
                shape.experts,
                &[("gate_up_proj", &[experts, 2 * inter, hidden]), ("down_proj", &[experts, hidden, inter])],
            );
            // `Qwen3MoeSparseMoeBlock` creates its experts before its router; the others after.
            if style == MoeStyle::Qwen3Moe {
                block.with_child(fused).with_child(router)
            } else {
                block.with_child(router).with_child(fused)
            }
        }
    };
    if style == MoeStyle::Qwen2Moe {
        return block
            .with_child(super::gated_mlp(
                b,
                &p,
                "shared_expert",
                "Qwen2MoeMLP",
                hidden,
                shape.shared_intermediate,
                false,
            ))
            .with_child(b.linear(&p, "shared_expert_gate", hidden, 1, false));
    }
    block
}
