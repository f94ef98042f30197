//! The serving engines' own flags over a workload: vLLM's (`--enforce-eager`, `--enable-lora`,
//! `--max-loras`, `--max-lora-rank`, `--kv-cache-memory-bytes`, `--max-model-len N|auto`,
//! `--speculative-config`, `--data-parallel-size`, `--enable-expert-parallel`), the readings they share (a speculative config's JSON, vLLM's
//! human-readable integers), and the refusal of an engine's flag under another engine. The
//! flags themselves are declared with the others in `flags.rs`.

use super::flags::WorkloadFlags;
use crate::workload::{Engine, Speculative, Workload};
use vramplan_profiles::InputError;

impl WorkloadFlags {
    /// vLLM's serving flags (`--enforce-eager`, `--enable-lora`, `--max-loras`,
    /// `--max-lora-rank`, `--kv-cache-memory-bytes`, `--max-model-len`) over the workload's
    /// `vllm` options; refused under another engine.
    pub(super) fn apply_vllm_options(&self, w: &mut Workload) -> Result<(), InputError> {
        let given = [
            ("--enforce-eager", self.enforce_eager),
            ("--enable-lora", self.enable_lora),
            ("--max-loras", self.max_loras.is_some()),
            ("--max-lora-rank", self.max_lora_rank.is_some()),
            ("--kv-cache-memory-bytes", self.kv_cache_memory_bytes.is_some()),
            ("--max-model-len", self.max_model_len.is_some()),
            ("--speculative-config", self.speculative_config.is_some()),
            ("--data-parallel-size", self.data_parallel_size.is_some()),
            ("--enable-expert-parallel", self.enable_expert_parallel),
        ];
        if !matches!(w.engine, Engine::Vllm { .. }) {
            return engine_flag_unused(&given, "vllm");
        }
        let o = &mut w.vllm;
        o.enforce_eager |= self.enforce_eager;
        if let Some(n) = self.max_loras {
            if n == 0 {
                return Err(InputError::new("--max-loras", "0 adapter slots")
                    .with_fix("use 1 or more (vLLM's default is 1), or leave LoRA out"));
            }
            o.max_loras = n;
        } else if self.enable_lora && o.max_loras == 0 {
            o.max_loras = 1;
        }
        if let Some(rank) = self.max_lora_rank {
            if o.max_loras == 0 {
                return Err(InputError::new("--max-lora-rank", "a LoRA rank without LoRA serving")
                    .with_fix("add --enable-lora (or --max-loras N)"));
            }
            o.max_lora_rank = rank;
        }
        if let Some(text) = &self.kv_cache_memory_bytes {
            o.kv_cache_memory_bytes = Some(parse_human_int("--kv-cache-memory-bytes", text)?);
        }
        if let Some(text) = &self.speculative_config {
            o.speculative = Some(parse_speculative(text)?);
        }
        if let Some(dp) = self.data_parallel_size {
            if dp == 0 {
                return Err(InputError::new("--data-parallel-size", "0 replicas")
                    .with_fix("use 1 or more (vLLM's default is 1)"));
            }
            o.data_parallel_size = Some(dp);
        }
        o.enable_expert_parallel |= self.enable_expert_parallel;
        if let Some(text) = &self.max_model_len {
            let lower = text.trim().to_ascii_lowercase();
            if lower == "auto" || lower == "-1" {
                o.max_model_len_auto = true;
            } else {
                w.seq = parse_human_int("--max-model-len", text)?;
                w.vllm.max_model_len_auto = false;
            }
        }
        Ok(())
    }
}

/// vLLM's `--speculative-config` JSON: `method` (default `draft_model` when a `model` is named),
/// `num_speculative_tokens`, `model`; other keys are refused.
pub(super) fn parse_speculative(text: &str) -> Result<Speculative, InputError> {
    let flag = "--speculative-config";
    let fix = r#"give JSON such as `{"method": "eagle", "num_speculative_tokens": 3}` or `{"model": "llama-3.2-1b-instruct", "num_speculative_tokens": 5}`"#;
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| InputError::new(flag, format!("not JSON: {e}")).with_fix(fix))?;
    let Some(object) = value.as_object() else {
        return Err(InputError::new(flag, "not a JSON object").with_fix(fix));
    };
    if let Some(key) =
        object.keys().find(|k| !["method", "model", "num_speculative_tokens"].contains(&k.as_str()))
    {
        return Err(InputError::new(flag, format!("`{key}` is not modelled"))
            .with_fix("give `method`, `model` and `num_speculative_tokens` only"));
    }
    let model = object.get("model").and_then(serde_json::Value::as_str).map(str::to_string);
    let method = match object.get("method").and_then(serde_json::Value::as_str) {
        Some(method) => method.to_string(),
        None if model.is_some() => "draft_model".to_string(),
        None => return Err(InputError::new(flag, "no `method` and no draft `model`").with_fix(fix)),
    };
    let Some(tokens) = object.get("num_speculative_tokens").and_then(serde_json::Value::as_u64) else {
        return Err(InputError::new(flag, "`num_speculative_tokens` is missing or not a count").with_fix(fix));
    };
    Ok(Speculative { method, num_speculative_tokens: tokens, model })
}

/// A count as vLLM's `human_readable_int` reads it: digits with an optional suffix, lowercase
/// `k`, `m`, `g`, `t` decimal (10³…) and uppercase `K`, `M`, `G`, `T` binary (2¹⁰…); `Ki`,
/// `Mi`, `Gi`, `Ti` are read as binary too.
pub(super) fn parse_human_int(flag: &str, text: &str) -> Result<u64, InputError> {
    let t = text.trim();
    let t = t.strip_suffix('i').map_or(t.to_string(), str::to_ascii_uppercase);
    let (digits, multiplier) = match t.char_indices().last() {
        Some((at, c)) if "kmgt".contains(c) => {
            (&t[..at], 1000u64.pow(1 + "kmgt".find(c).unwrap_or(0) as u32))
        }
        Some((at, c)) if "KMGT".contains(c) => (&t[..at], 1u64 << (10 * (1 + "KMGT".find(c).unwrap_or(0)))),
        _ => (t.as_str(), 1),
    };
    let count = digits.trim().parse::<u64>().ok().and_then(|n| n.checked_mul(multiplier)).filter(|&n| n > 0);
    count.ok_or_else(|| {
        InputError::new(flag, format!("`{text}` is not a positive count"))
            .with_fix("give digits with an optional suffix: `8G` or `8Gi` (2³⁰), `8g` (10⁹), `8589934592`")
    })
}

/// Refuses an engine setting given for another engine.
pub(super) fn engine_flag_unused(flags: &[(&str, bool)], engine: &str) -> Result<(), InputError> {
    match flags.iter().find(|(_, given)| *given) {
        Some((flag, _)) => {
            Err(InputError::new(*flag, format!("this is a {engine} setting, and the engine is not {engine}"))
                .with_fix(format!("add `--engine {engine}`, or leave {flag} out")))
        }
        None => Ok(()),
    }
}
