//! The linear modules LoRA wraps, matched as PEFT matches `target_modules` given as a list: a
//! target names a module whose path equals it or ends with `.` and the target (`q_proj` matches
//! `model.layers.0.self_attn.q_proj`, `self_attn.q_proj` too); `all-linear` is every linear
//! layer but the output head. No targets means PEFT's default for the architecture
//! (`TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING` in peft/utils/constants.py).

use crate::workload::{Finetune, Workload};
use std::collections::BTreeSet;
use vramplan_profiles::InputError;
use vramplan_profiles::model::{ModelDescription, Module, ModuleKind};
use vramplan_profiles::suggest::{closest, ticked, ticked_or};

/// The target that means every linear layer except the output head.
pub(crate) const ALL_LINEAR: &str = "all-linear";

/// The paths of the linear modules the workload's LoRA adapters wrap, in module order; empty
/// for a full fine-tune. Fails for a target that matches no module, or matches a module that
/// is not a linear layer (PEFT refuses those), naming the linear layers the model has.
pub fn lora_target_modules(workload: &Workload, model: &ModelDescription) -> Result<Vec<String>, InputError> {
    let Finetune::Lora { targets, .. } = &workload.finetune else { return Ok(Vec::new()) };
    let targets: Vec<String> = if targets.is_empty() {
        default_targets(&model.facts.model_type)
            .ok_or_else(|| no_default_targets(model))?
            .iter()
            .map(|t| t.to_string())
            .collect()
    } else {
        targets.clone()
    };
    let heads = output_heads(model);
    let mut wanted: BTreeSet<&str> = BTreeSet::new();
    for target in &targets {
        let target = target.trim();
        if target == ALL_LINEAR {
            let mut found = false;
            model.root.visit(&mut |m| {
                if is_linear(m) && !heads.contains(m.path.as_str()) {
                    wanted.insert(&m.path);
                    found = true;
                }
            });
            if !found {
                return Err(target_error(model, target, "matches no linear layer of the model"));
            }
            continue;
        }
        let mut matched: Vec<&Module> = Vec::new();
        model.root.visit(&mut |m| {
            if !m.path.is_empty() && matches_target(&m.path, target) {
                matched.push(m);
            }
        });
        if matched.is_empty() {
            return Err(target_error(model, target, "matches no module of the model"));
        }
        if let Some(other) = matched.iter().find(|m| !is_linear(m)) {
            let problem = format!(
                "matches `{}` ({}), which is not a linear layer: LoRA adapters wrap nn.Linear modules",
                other.path, other.class
            );
            return Err(target_error(model, target, &problem));
        }
        wanted.extend(matched.iter().map(|m| m.path.as_str()));
    }
    let mut out = Vec::with_capacity(wanted.len());
    model.root.visit(&mut |m| {
        if wanted.contains(m.path.as_str()) {
            out.push(m.path.clone());
        }
    });
    Ok(out)
}

/// PEFT's rule for a list of target names: the module path equals the target or ends with
/// `.target`.
pub(crate) fn matches_target(path: &str, target: &str) -> bool {
    !target.is_empty()
        && (path == target
            || (path.len() > target.len()
                && path.ends_with(target)
                && path.as_bytes().get(path.len() - target.len() - 1) == Some(&b'.')))
}

/// `nn.Linear` and its quantized and Conv1D forms, and routers that are plain `nn.Linear`
/// (Mixtral's `block_sparse_moe.gate`), which PEFT wraps like any linear layer.
fn is_linear(module: &Module) -> bool {
    match module.kind {
        ModuleKind::Linear => true,
        ModuleKind::Router => module.class == "Linear",
        _ => false,
    }
}

/// The output head(s): linear layers outside every transformer block that map to the
/// vocabulary (`lm_head`, GPT-NeoX's `embed_out`, BERT's `cls.predictions.decoder`); what
/// `get_output_embeddings()` returns and `all-linear` leaves out.
fn output_heads(model: &ModelDescription) -> BTreeSet<&str> {
    let blocks: Vec<&str> = model.facts.layers.iter().map(|l| l.path.as_str()).collect();
    let vocab = model.facts.vocab_size;
    let mut heads = BTreeSet::new();
    model.root.visit(&mut |m| {
        if m.kind != ModuleKind::Linear {
            return;
        }
        let out_features =
            m.tensors.iter().find(|t| t.name == "weight").and_then(|t| match m.class.as_str() {
                // GPT-2's Conv1D stores its weight [in, out].
                "Conv1D" => t.shape.last().copied(),
                _ => t.shape.first().copied(),
            });
        let named = matches!(m.name(), "lm_head" | "embed_out");
        // A head lies outside the blocks; that test comes last, as it walks every block.
        if (named || (vocab > 0 && out_features == Some(vocab))) && !blocks.iter().any(|b| within(b, &m.path))
        {
            heads.insert(m.path.as_str());
        }
    });
    heads
}

/// True if `path` is `ancestor` or below it.
fn within(ancestor: &str, path: &str) -> bool {
    path.strip_prefix(ancestor).is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// The last path component of every linear layer, once each, in module order
/// (`q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head`).
pub(crate) fn linear_names(model: &ModelDescription) -> Vec<&str> {
    let mut names: Vec<&str> = Vec::new();
    model.root.visit(&mut |m| {
        if is_linear(m) && !names.contains(&m.name()) {
            names.push(m.name());
        }
    });
    names
}

fn target_error(model: &ModelDescription, target: &str, problem: &str) -> InputError {
    let names = linear_names(model);
    let close = closest(target, names.iter().copied(), 3);
    let mut fix = String::new();
    if !close.is_empty() {
        fix += &format!("did you mean {}? ", ticked_or(&close));
    }
    fix += &format!(
        "the linear layers of {} are {}; name some of them (`--lora-targets q_proj,v_proj`) or use `{ALL_LINEAR}`",
        model.name,
        ticked(&names)
    );
    InputError::new("LoRA targets", format!("`{target}` {problem}")).at_key("finetune.targets").with_fix(fix)
}

fn no_default_targets(model: &ModelDescription) -> InputError {
    InputError::new(
        "LoRA targets",
        format!(
            "no targets given, and PEFT has no default targets for model type `{}`",
            model.facts.model_type
        ),
    )
    .at_key("finetune.targets")
    .with_fix(format!(
        "name the layers to adapt with `--lora-targets` (the linear layers are {}) or use `{ALL_LINEAR}`",
        ticked(&linear_names(model))
    ))
}

/// PEFT's default LoRA targets by `model_type` (peft/utils/constants.py,
/// `TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`), for the architectures vramplan imports.
fn default_targets(model_type: &str) -> Option<&'static [&'static str]> {
    Some(match model_type {
        "t5" | "mt5" => &["q", "v"],
        "gpt2" | "gpt_bigcode" => &["c_attn"],
        "bloom" | "gpt_neox" | "falcon" | "RefinedWeb" | "RefinedWebModel" => &["query_key_value"],
        "bert" | "roberta" | "xlm-roberta" | "electra" => &["query", "value"],
        "phi" => &["q_proj", "v_proj", "fc1", "fc2"],
        "phi3" => &["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
        "llama" | "mistral" | "mixtral" | "opt" | "gptj" | "gpt_neo" | "bart" | "stablelm" | "gemma"
        | "gemma2" | "qwen2" | "qwen2_moe" | "qwen3" | "qwen3_moe" => &["q_proj", "v_proj"],
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::matches_target;

    #[test]
    fn targets_match_whole_path_components() {
        assert!(matches_target("model.layers.0.self_attn.q_proj", "q_proj"));
        assert!(matches_target("model.layers.0.self_attn.q_proj", "self_attn.q_proj"));
        assert!(matches_target("lm_head", "lm_head"));
        assert!(!matches_target("model.layers.0.self_attn.xq_proj", "q_proj"));
        assert!(!matches_target("model.layers.0.self_attn.q_proj", "proj"));
        assert!(!matches_target("model.layers.0.self_attn.q_proj", ""));
    }
}
