//! Where the Llama-style decoders attend and rotate: each layer's sliding window (from
//! `sliding_window`, `use_sliding_window`, `layer_types`, `max_window_layers` or a pattern, as
//! each family's config class reads them) and the width the rotary embedding rotates.

use super::{Family, WindowRule};
use crate::InputError;
use crate::model::Naming;
use crate::model::hf::HfConfig;
use serde_json::Value;

/// The sliding window of each layer (`None`: full attention).
pub(super) fn attention_windows(
    config: &HfConfig,
    rule: WindowRule,
    naming: Naming,
    layers: u64,
) -> Result<Vec<Option<u64>>, InputError> {
    let count = layers as usize;
    // `sliding_window` with `default` when the key is absent (null disables the window).
    let window_or = |default: Option<u64>| -> Result<Option<u64>, InputError> {
        match config.object().get("sliding_window") {
            None => Ok(default),
            Some(_) => config.opt_positive(&["sliding_window"]),
        }
    };
    // Qwen: the window exists only when `use_sliding_window` is true.
    let qwen_window = || -> Result<Option<u64>, InputError> {
        let enabled = config.bool_or(&["use_sliding_window"], false)?;
        Ok(if enabled { window_or(Some(4096))? } else { None })
    };
    let from_types = |window: Option<u64>| windows_by_layer_type(config, count, "sliding_attention", window);
    let max_window_layers = || -> Result<usize, InputError> {
        Ok(usize::try_from(config.uint_or(&["max_window_layers"], 28)?).unwrap_or(usize::MAX))
    };
    Ok(match rule {
        WindowRule::None => vec![None; count],
        WindowRule::EveryLayer(default) => vec![window_or(default)?; count],
        WindowRule::QwenEveryLayer => vec![qwen_window()?; count],
        WindowRule::Qwen2Moe if naming == Naming::V5 => {
            let window = qwen_window()?;
            match from_types(window)? {
                Some(windows) => windows,
                None => {
                    let below = max_window_layers()?;
                    (0..count).map(|i| window.filter(|_| i % 2 == 0 && i < below)).collect()
                }
            }
        }
        WindowRule::Qwen | WindowRule::Qwen2Moe => {
            let window = qwen_window()?;
            let types = if rule == WindowRule::Qwen { from_types(window)? } else { None };
            match types {
                Some(windows) => windows,
                None => {
                    let first = max_window_layers()?;
                    (0..count).map(|i| window.filter(|_| i >= first)).collect()
                }
            }
        }
        WindowRule::Alternating(default) => {
            let window = window_or(Some(default))?;
            match from_types(window)? {
                Some(windows) => windows,
                None => (0..count).map(|i| window.filter(|_| i % 2 == 0)).collect(),
            }
        }
        WindowRule::Pattern(default) => {
            let window = window_or(Some(default))?;
            match from_types(window)? {
                Some(windows) => windows,
                None => pattern_sliding(config, count)?.into_iter().map(|s| window.filter(|_| s)).collect(),
            }
        }
        WindowRule::NoRopeLayers => {
            let enabled = config.bool_or(&["use_sliding_window"], false)?;
            let window = if enabled { window_or(None)? } else { None };
            match from_types(window)? {
                Some(windows) => windows,
                None => {
                    rope_layers(config, count)?.into_iter().map(|rope| window.filter(|_| !rope)).collect()
                }
            }
        }
    })
}

/// Which layers are sliding-attention layers by type, whatever the window: `layer_types` when
/// given, else Gemma 3's `sliding_window_pattern` (6 when absent; `Gemma3TextConfig`: layer `i`
/// is sliding unless `(i + 1) % pattern == 0`).
pub(super) fn sliding_layer_types(config: &HfConfig, count: usize) -> Result<Vec<bool>, InputError> {
    match config.string_list(&["layer_types"])? {
        // `attention_windows` has checked the entries.
        Some(types) => Ok(types.iter().map(|t| t == "sliding_attention").collect()),
        None => pattern_sliding(config, count),
    }
}

fn pattern_sliding(config: &HfConfig, count: usize) -> Result<Vec<bool>, InputError> {
    let pattern = config.positive_or(&["sliding_window_pattern"], 6)? as usize;
    Ok((0..count).map(|i| !(i + 1).is_multiple_of(pattern)).collect())
}

/// SmolLM3: whether each layer applies the rotary embedding: `no_rope_layers` (1: it does) when
/// given, else all but every `no_rope_layer_interval`-th layer (4 when absent).
pub(super) fn rope_layers(config: &HfConfig, count: usize) -> Result<Vec<bool>, InputError> {
    if let Some(flags) = config.uint_list(&["no_rope_layers"])? {
        if flags.len() != count {
            return Err(InputError::new(
                config.origin(),
                format!("expected one entry per layer ({count}), found {}", flags.len()),
            )
            .at_key("no_rope_layers")
            .with_fix("give `no_rope_layers` exactly `num_hidden_layers` entries (1: the layer rotates)"));
        }
        return Ok(flags.iter().map(|f| *f != 0).collect());
    }
    let interval = config.positive_or(&["no_rope_layer_interval"], 4)? as usize;
    Ok((0..count).map(|i| !(i + 1).is_multiple_of(interval)).collect())
}

/// The width the rotary embedding rotates (`inv_freq` holds half as many values, rounded up as
/// `torch.arange(0, dim, 2)` does): `head_dim`, scaled by `partial_rotary_factor` where the
/// transformers version applies it.
pub(super) fn rotary_dim(
    config: &HfConfig,
    family: &Family,
    naming: Naming,
    head_dim: u64,
) -> Result<u64, InputError> {
    let rope = match config.get(&["rope_parameters", "rope_scaling"]) {
        Some((_, Value::Object(settings))) => Some(settings),
        _ => None,
    };
    let rope_type = rope
        .and_then(|settings| settings.get("rope_type").or_else(|| settings.get("type")))
        .and_then(Value::as_str)
        .unwrap_or(family.rope_type_default);
    // 5.x also reads the factor inside `rope_parameters`; 4.x only the top-level key.
    let nested =
        rope.filter(|_| naming == Naming::V5).and_then(|settings| settings.get("partial_rotary_factor"));
    let factor = match config.float_opt(&["partial_rotary_factor"])? {
        Some(factor) => factor,
        None => nested.and_then(Value::as_f64).unwrap_or(1.0),
    };
    let applied = naming == Naming::V4 || family.partial_rotary_in_default_rope || rope_type != "default";
    let dim = if applied { (head_dim as f64 * factor) as u64 } else { head_dim };
    Ok(dim.div_ceil(2) * 2)
}

/// Each layer's attention span by `layer_types`, where the config lists them: `window` for a
/// layer of type `windowed` (`sliding_attention`, Llama 4's `chunked_attention`), `None` for
/// `full_attention`; `None` without the list. Refuses a list of another length than the layers,
/// or another type, with the key.
pub(in crate::model::hf) fn windows_by_layer_type(
    config: &HfConfig,
    count: usize,
    windowed: &str,
    window: Option<u64>,
) -> Result<Option<Vec<Option<u64>>>, InputError> {
    let Some(types) = config.string_list(&["layer_types"])? else { return Ok(None) };
    if types.len() != count {
        return Err(InputError::new(
            config.origin(),
            format!("expected one entry per layer ({count}), found {}", types.len()),
        )
        .at_key("layer_types")
        .with_fix("give `layer_types` exactly `num_hidden_layers` entries"));
    }
    types
        .iter()
        .map(|t| match t.as_str() {
            kind if kind == windowed => Ok(window),
            "full_attention" => Ok(None),
            other => Err(InputError::new(
                config.origin(),
                format!("expected \"{windowed}\" or \"full_attention\", found \"{other}\""),
            )
            .at_key("layer_types")),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}
