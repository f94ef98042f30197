//! A config's `quantization_config`, applied to the built tree as the weights are really loaded.
//!
//! `quant_method: "fp8"` (DeepSeek-V3/R1, the FP8 releases of Qwen3 and others) is what
//! transformers' fine-grained FP8 integration loads, reproduced name for name:
//!
//! - Every `nn.Linear` not skipped becomes an `FP8Linear`: its weight is float8 e4m3 (whatever the
//!   config's `fmt` says: transformers always allocates e4m3) followed, after any bias, by a
//!   `weight_scale_inv` of block scales shaped `[ceil(out / block_out), ceil(in / block_in)]`, a
//!   scalar `[]` without `weight_block_size`. 4.x also converts the `nn.Linear` routers of its
//!   MoE blocks (`mlp.gate` of Mixtral, Qwen-MoE, OLMoE); 5.x's routers are not linear layers.
//! - 5.x replaces every module whose path ends in `.experts` (fused experts) by `FP8Experts`:
//!   `gate_up_proj`, `gate_up_proj_scale_inv` `[E, max(ceil(2I / block_out), 2), ceil(H /
//!   block_in)]`, `down_proj`, `down_proj_scale_inv` `[E, ceil(H / block_out), ceil(I /
//!   block_in)]` (`[E, 2, 1]` and `[E, 1, 1]` without blocks). 4.x's per-expert modules are plain
//!   linear layers.
//! - `scale_fmt: "ue8m0"` (5.x) keeps the scales as float8 e8m0 bytes, otherwise fp32.
//! - `activation_scheme: "static"` adds a scalar fp32 `activation_scale` per linear layer and
//!   `gate_up_proj_activation_scale` / `down_proj_activation_scale` `[E]` per fused experts (5.x);
//!   4.x refuses static activations, so nothing is added there and a note says so.
//! - Skipped: when `modules_to_not_convert` (5.x also reads `ignored_layers`) is absent or null,
//!   the output embedding `lm_head`; when it is given, exactly its entries (so `lm_head` is
//!   converted unless listed). 5.x matches an entry as a regular expression from the start of
//!   the path up to a module boundary (`model.layers.1` skips `model.layers.1.mlp`, not
//!   `model.layers.10`; `model.layers.*.self_attn` skips every attention), or as a suffix of the
//!   path; 4.x skips any path that contains the entry as a substring.
//!
//! Logical parameter counts do not change; bytes do. 5.x renames entries written in checkpoint
//! names (Mixtral's `block_sparse_moe`) before matching, and can convert embeddings
//! (`modules_to_convert`) and pack DeepSeek-V4-style fp4 experts; none of that is modelled.
//! Other quantization methods are not modelled from a config alone: a note says so, and the
//! safetensors headers describe such checkpoints exactly.

use crate::model::hf::HfConfig;
use crate::model::{ModelDescription, Module, ModuleKind, Naming, Tensor, TensorKind};
use crate::{DType, InputError};
use serde_json::Value;
use std::collections::HashSet;

/// How a quantized tensor is stored.
struct Fp8Scheme {
    naming: Naming,
    /// `[block_out, block_in]`; `None` for one scale per tensor.
    block: Option<[u64; 2]>,
    scale_dtype: DType,
    /// Static activation scales (5.x only; 4.x refuses the scheme).
    static_activations: bool,
    /// Entries of the skip list, as the config gives them.
    skip: Vec<String>,
}

impl Fp8Scheme {
    fn skips(&self, path: &str) -> bool {
        self.skip.iter().any(|entry| match self.naming {
            Naming::V4 => path.contains(entry.as_str()),
            Naming::V5 => path.ends_with(entry.as_str()) || pattern::matches_at_module_boundary(entry, path),
        })
    }
}

/// Applies the config's `quantization_config`, if any, to `model` and notes what was done.
pub(in crate::model::hf) fn apply_quantization(
    config: &HfConfig,
    model: &mut ModelDescription,
) -> Result<(), InputError> {
    let Some((key, value)) = config.get(&["quantization_config"]) else { return Ok(()) };
    let Value::Object(settings) = value else {
        return Err(InputError::new(config.origin(), "expected an object of quantization settings")
            .at_key(key)
            .with_fix("remove `quantization_config` or give it as transformers writes it"));
    };
    let method = settings.get("quant_method").and_then(Value::as_str).unwrap_or("unknown");
    if method != "fp8" {
        model.notes.push(format!(
            "`quantization_config` method `{method}` is not modelled from a config alone: weights are \
             described unquantized in {}; give the checkpoint's safetensors files for the stored layout",
            model.dtype.name()
        ));
        return Ok(());
    }
    let scheme = read_fp8(config, settings, model.naming)?;
    let mut converted = 0usize;
    model.root.visit_mut(&mut |module| {
        if !scheme.skips(&module.path) {
            converted += quantize_module(module, &scheme);
        }
    });
    let blocks = match scheme.block {
        Some([rows, cols]) => format!("{rows}×{cols} block scales"),
        None => "one scale per tensor".to_string(),
    };
    let skipped = if scheme.skip.is_empty() { "nothing".to_string() } else { scheme.skip.join(", ") };
    model.notes.push(format!(
        "`quantization_config` fp8: {converted} weight tensors stored as fp8_e4m3 with {blocks} \
         (`*_scale_inv`, {}); not converted: {skipped}, norms, embeddings{} (as transformers' \
         fine-grained FP8 loads them); parameter counts are unaffected",
        scheme.scale_dtype.name(),
        if scheme.naming == Naming::V5 { ", routers" } else { "" },
    ));
    if scheme.naming == Naming::V4
        && settings.get("activation_scheme").and_then(Value::as_str) == Some("static")
    {
        model.notes.push(
            "`activation_scheme` \"static\": transformers 4.x refuses to load it (5.x adds an \
             `activation_scale` per quantized weight); no activation scales are described"
                .to_string(),
        );
    }
    Ok(())
}

fn read_fp8(
    config: &HfConfig,
    settings: &serde_json::Map<String, Value>,
    naming: Naming,
) -> Result<Fp8Scheme, InputError> {
    let bad = |key: &str, expected: &str| {
        InputError::new(config.origin(), format!("expected {expected}"))
            .at_key(format!("quantization_config.{key}"))
            .with_fix("give the value transformers writes for fine-grained FP8 (e.g. [128, 128])")
    };
    let block = match settings.get("weight_block_size") {
        None => Some([128, 128]),
        Some(Value::Null) => None,
        Some(Value::Array(items)) => {
            let sizes: Vec<u64> = items.iter().filter_map(Value::as_u64).filter(|v| *v > 0).collect();
            match sizes.as_slice() {
                [rows, cols] if items.len() == 2 => Some([*rows, *cols]),
                _ => return Err(bad("weight_block_size", "two positive integers")),
            }
        }
        Some(_) => return Err(bad("weight_block_size", "a list of two positive integers")),
    };
    let static_activations = match settings.get("activation_scheme") {
        None | Some(Value::Null) => false,
        Some(Value::String(scheme)) if scheme == "dynamic" => false,
        Some(Value::String(scheme)) if scheme == "static" => naming == Naming::V5,
        Some(_) => return Err(bad("activation_scheme", "\"dynamic\" or \"static\"")),
    };
    let scale_dtype = match settings.get("scale_fmt") {
        None | Some(Value::Null) => DType::F32,
        Some(Value::String(format)) if format == "float" => DType::F32,
        // 4.x does not know the key and allocates fp32 scales.
        Some(Value::String(format)) if format == "ue8m0" => {
            if naming == Naming::V5 {
                DType::F8E8M0
            } else {
                DType::F32
            }
        }
        Some(_) => return Err(bad("scale_fmt", "\"float\" or \"ue8m0\"")),
    };
    let mut list_keys = vec!["modules_to_not_convert"];
    if naming == Naming::V5 {
        list_keys.push("ignored_layers");
    }
    let given = list_keys.iter().find_map(|key| match settings.get(*key) {
        None | Some(Value::Null) => None,
        Some(value) => Some((*key, value)),
    });
    let skip = match given {
        // transformers' default: keep the output embedding in full precision.
        None => vec!["lm_head".to_string()],
        Some((_, Value::Array(items))) => {
            let mut skip: Vec<String> = Vec::with_capacity(items.len());
            for item in items {
                match item.as_str() {
                    Some(name) if !skip.iter().any(|k| k == name) => skip.push(name.to_string()),
                    Some(_) => {}
                    None => return Err(bad(given.map_or("", |(key, _)| key), "a list of module names")),
                }
            }
            skip
        }
        Some((key, _)) => return Err(bad(key, "a list of module names")),
    };
    Ok(Fp8Scheme { naming, block, scale_dtype, static_activations, skip })
}

/// Converts the quantizable weights held directly by `module`; returns how many.
fn quantize_module(module: &mut Module, scheme: &Fp8Scheme) -> usize {
    let is_linear = match module.kind {
        ModuleKind::Linear => true,
        // 4.x routers that are plain `nn.Linear` layers.
        ModuleKind::Router => module.class == "Linear",
        _ => false,
    };
    if is_linear {
        let Some(weight) = module.tensors.iter_mut().find(|t| t.name == "weight" && t.shape.len() == 2)
        else {
            return 0;
        };
        weight.dtype = DType::F8E4M3;
        let (out_features, in_features) = match weight.shape.as_slice() {
            [rows, cols] => (*rows, *cols),
            _ => (1, 1),
        };
        let shape = match scheme.block {
            Some([block_out, block_in]) => {
                vec![out_features.div_ceil(block_out), in_features.div_ceil(block_in)]
            }
            None => Vec::new(),
        };
        module.tensors.push(constant("weight_scale_inv", shape, scheme.scale_dtype));
        if scheme.static_activations {
            module.tensors.push(constant("activation_scale", Vec::new(), DType::F32));
        }
        module.class = "FP8Linear".to_string();
        return 1;
    }
    let fused = matches!(module.kind, ModuleKind::Experts { .. })
        && scheme.naming == Naming::V5
        && module.path.ends_with(".experts")
        && module.tensors.iter().any(|t| t.shape.len() == 3);
    if !fused {
        return 0;
    }
    let mut tensors = Vec::with_capacity(module.tensors.len() * 2);
    let mut activation_scales = Vec::new();
    let mut converted = 0;
    for mut tensor in std::mem::take(&mut module.tensors) {
        let projection = tensor.shape.len() == 3 && !tensor.name.ends_with("_bias");
        if !projection {
            tensors.push(tensor);
            continue;
        }
        tensor.dtype = DType::F8E4M3;
        let (experts, rows, cols) = match tensor.shape.as_slice() {
            [experts, rows, cols] => (*experts, *rows, *cols),
            _ => (1, 1, 1),
        };
        // The fused gate/up scales keep room for both halves.
        let min_rows = if tensor.name == "gate_up_proj" { 2 } else { 1 };
        let (scale_rows, scale_cols) = match scheme.block {
            Some([block_out, block_in]) => (rows.div_ceil(block_out), cols.div_ceil(block_in)),
            None => (1, 1),
        };
        let scale = vec![experts, scale_rows.max(min_rows), scale_cols];
        let name = tensor.name.clone();
        tensors.push(tensor);
        tensors.push(constant(&format!("{name}_scale_inv"), scale, scheme.scale_dtype));
        if scheme.static_activations {
            activation_scales.push(constant(&format!("{name}_activation_scale"), vec![experts], DType::F32));
        }
        converted += 1;
    }
    tensors.extend(activation_scales);
    module.tensors = tensors;
    module.class = "FP8Experts".to_string();
    converted
}

fn constant(name: &str, shape: Vec<u64>, dtype: DType) -> Tensor {
    Tensor { kind: TensorKind::QuantConstant, ..Tensor::parameter(name, &shape, dtype) }
}

/// The part of Python's `re` that skip-list entries use, for 5.x's `should_convert_module`.
mod pattern {
    use super::HashSet;

    /// What one position of a pattern accepts.
    enum Class {
        Any,
        Literal(char),
        Digit,
        Word,
        Space,
        Set { negated: bool, ranges: Vec<(char, char)> },
    }

    impl Class {
        fn accepts(&self, c: char) -> bool {
            match self {
                Class::Any => c != '\n',
                Class::Literal(l) => *l == c,
                Class::Digit => c.is_ascii_digit(),
                Class::Word => c.is_alphanumeric() || c == '_',
                Class::Space => c.is_whitespace(),
                Class::Set { negated, ranges } => {
                    ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&c)) != *negated
                }
            }
        }
    }

    /// A class repeated `min..=max` times (`max` `None`: unbounded).
    struct Atom {
        class: Class,
        min: usize,
        max: Option<usize>,
    }

    /// Whether `pattern`, as `re.match` reads it, matches `path` from its start up to a module
    /// boundary (the end, a `.` next, or just after a `.`). Patterns using syntax beyond
    /// classes, sets, escapes, `* + ?` and top-level `|` are matched as literal text.
    pub(super) fn matches_at_module_boundary(pattern: &str, path: &str) -> bool {
        const SYNTAX: &[char] = &['.', '*', '+', '?', '|', '\\', '[', ']', '(', ')', '{', '}', '^', '$'];
        if !pattern.contains(SYNTAX) {
            // Plain text, the common case (`lm_head`): a prefix ending at a module boundary.
            return path.strip_prefix(pattern).is_some_and(|rest| rest.is_empty() || rest.starts_with('.'));
        }
        let text: Vec<char> = path.chars().collect();
        let boundary = |end: usize| {
            end == text.len() || text.get(end) == Some(&'.') || (end > 0 && text.get(end - 1) == Some(&'.'))
        };
        let alternatives = parse(pattern).unwrap_or_else(|| vec![literal(pattern)]);
        alternatives.iter().any(|(atoms, anchored_end)| {
            let mut ends = Vec::new();
            let mut seen = HashSet::new();
            match_ends(atoms, 0, &text, &mut seen, &mut ends);
            ends.into_iter().any(|end| boundary(end) && (!anchored_end || end == text.len()))
        })
    }

    fn literal(pattern: &str) -> (Vec<Atom>, bool) {
        (pattern.chars().map(|c| Atom { class: Class::Literal(c), min: 1, max: Some(1) }).collect(), false)
    }

    /// Every position where a match of `atoms[index..]` starting at `pos` can end.
    fn match_ends(
        atoms: &[Atom],
        pos: usize,
        text: &[char],
        seen: &mut HashSet<(usize, usize)>,
        ends: &mut Vec<usize>,
    ) {
        if !seen.insert((atoms.len(), pos)) {
            return;
        }
        let Some((atom, rest)) = atoms.split_first() else {
            ends.push(pos);
            return;
        };
        let mut at = pos;
        let mut count = 0;
        loop {
            if count >= atom.min {
                match_ends(rest, at, text, seen, ends);
            }
            if atom.max.is_some_and(|max| count >= max) {
                break;
            }
            match text.get(at) {
                Some(c) if atom.class.accepts(*c) => {
                    at += 1;
                    count += 1;
                }
                _ => break,
            }
        }
    }

    /// The alternatives of `pattern`, each with whether it ends in `$`; `None` for syntax this
    /// reader does not know.
    fn parse(pattern: &str) -> Option<Vec<(Vec<Atom>, bool)>> {
        let chars: Vec<char> = pattern.chars().collect();
        let mut alternatives = Vec::new();
        let mut atoms: Vec<Atom> = Vec::new();
        let mut anchored_end = false;
        let mut i = 0;
        while let Some(&c) = chars.get(i) {
            i += 1;
            if anchored_end && c != '|' {
                return None;
            }
            let class = match c {
                '|' => {
                    alternatives.push((std::mem::take(&mut atoms), anchored_end));
                    anchored_end = false;
                    continue;
                }
                '^' if atoms.is_empty() => continue,
                '$' => {
                    anchored_end = true;
                    continue;
                }
                '*' | '+' | '?' => {
                    let atom = atoms.last_mut()?;
                    if atom.min != 1 || atom.max != Some(1) {
                        return None;
                    }
                    (atom.min, atom.max) = match c {
                        '*' => (0, None),
                        '+' => (1, None),
                        _ => (0, Some(1)),
                    };
                    continue;
                }
                '.' => Class::Any,
                '\\' => {
                    let escaped = *chars.get(i)?;
                    i += 1;
                    escape(escaped)?
                }
                '[' => {
                    let (set, next) = parse_set(&chars, i)?;
                    i = next;
                    set
                }
                '(' | ')' | '{' | '}' | ']' => return None,
                other => Class::Literal(other),
            };
            atoms.push(Atom { class, min: 1, max: Some(1) });
        }
        alternatives.push((atoms, anchored_end));
        Some(alternatives)
    }

    fn escape(c: char) -> Option<Class> {
        Some(match c {
            'd' => Class::Digit,
            'w' => Class::Word,
            's' => Class::Space,
            c if c.is_ascii_alphanumeric() => return None,
            c => Class::Literal(c),
        })
    }

    /// A `[...]` set whose body starts at `start`; returns it and the index after `]`.
    fn parse_set(chars: &[char], start: usize) -> Option<(Class, usize)> {
        let mut i = start;
        let negated = chars.get(i) == Some(&'^');
        if negated {
            i += 1;
        }
        let mut ranges = Vec::new();
        let mut first = true;
        loop {
            let c = *chars.get(i)?;
            i += 1;
            if c == ']' && !first {
                return Some((Class::Set { negated, ranges }, i));
            }
            first = false;
            let low = if c == '\\' {
                let escaped = *chars.get(i)?;
                i += 1;
                match escaped {
                    'd' => {
                        ranges.push(('0', '9'));
                        continue;
                    }
                    c if c.is_ascii_alphanumeric() => return None,
                    c => c,
                }
            } else {
                c
            };
            if chars.get(i) == Some(&'-') && chars.get(i + 1).is_some_and(|c| *c != ']') {
                let high = *chars.get(i + 1)?;
                if high == '\\' || high < low {
                    return None;
                }
                ranges.push((low, high));
                i += 2;
            } else {
                ranges.push((low, low));
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::matches_at_module_boundary as skips;

        #[test]
        fn entries_match_from_the_start_up_to_a_module_boundary() {
            assert!(skips("model.layers.1", "model.layers.1"));
            assert!(skips("model.layers.1", "model.layers.1.mlp.gate_proj"));
            assert!(!skips("model.layers.1", "model.layers.10.mlp"));
            assert!(skips("model.layers.*.self_attn", "model.layers.7.self_attn.q_proj"));
            assert!(!skips("model.layers.*.self_attn", "model.layers.7.mlp.down_proj"));
            assert!(!skips("mlp.gate", "model.layers.0.mlp.gate_proj"), "not anchored at the start");
            assert!(skips(r"model\.layers\.[0-2]\.mlp", "model.layers.2.mlp.up_proj"));
            assert!(!skips(r"model\.layers\.[0-2]\.mlp", "model.layers.3.mlp.up_proj"));
            assert!(skips(r"model.layers.\d+.mlp$", "model.layers.12.mlp"));
            assert!(!skips(r"model.layers.\d+.mlp$", "model.layers.12.mlp.up_proj"));
            assert!(skips("lm_head|model.embed_tokens", "model.embed_tokens"));
            // Unknown syntax is matched literally.
            assert!(skips("model.(layers)", "model.(layers).0"));
            assert!(!skips("model.(layers)", "model.layers.0"));
        }
    }
}
