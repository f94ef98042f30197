//! A parsed HF `config.json` with typed getters whose errors name the file and key, say what was
//! expected and what was found. Keys with several historical spellings (`n_embd`,
//! `hidden_size`, `d_model`) are looked up as a list, first present wins.

use crate::{DType, InputError};
use serde_json::{Map, Value};

/// The bounds on what a config may give, by kind of key (docs/limits.md gives the largest real
/// value of each): with every size within its bound, the byte arithmetic of a model cannot
/// overflow `u64` (the largest product, a fused expert tensor of every layer in float32, is
/// 2¹² · 2¹⁹ · 2¹⁶ · 2¹⁰ · 4 = 2⁵⁹ bytes).
struct Bound {
    keys: &'static [&'static str],
    max: u64,
    what: &'static str,
}

const BOUNDS: &[Bound] = &[
    // Llama-3.1-405B has 126 layers, DeepSeek-V3 61: 1,024 is eight times the largest.
    Bound {
        keys: &[
            "num_hidden_layers",
            "n_layer",
            "num_layers",
            "num_decoder_layers",
            "max_window_layers",
            "first_k_dense_replace",
            "num_nextn_predict_layers",
            "moe_layer_freq",
            "decoder_sparse_step",
            "mlp_only_layers",
        ],
        max: 1 << 10,
        what: "layers",
    },
    // Hidden sizes: 16,384 (Llama-3.1-405B), 18,432 (PaLM-540B).
    Bound {
        keys: &[
            "hidden_size",
            "n_embd",
            "n_embed",
            "d_model",
            "word_embed_proj_dim",
            "head_dim",
            "d_kv",
            "d_head",
            "v_head_dim",
            "qk_rope_head_dim",
            "qk_nope_head_dim",
            "kv_lora_rank",
            "q_lora_rank",
        ],
        max: 1 << 16,
        what: "a hidden or head width",
    },
    // Feed-forward widths: 53,248 (Llama-3.1-405B), 73,728 (PaLM-540B).
    Bound {
        keys: &[
            "intermediate_size",
            "n_inner",
            "ffn_dim",
            "d_ff",
            "d_inner",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
            "ffn_hidden_size",
        ],
        max: 1 << 18,
        what: "a feed-forward width",
    },
    // Heads: 128 (Llama-3.1-405B, DeepSeek-V3).
    Bound {
        keys: &[
            "num_attention_heads",
            "num_key_value_heads",
            "n_head",
            "num_heads",
            "num_ln_in_parallel_attn",
        ],
        max: 1 << 12,
        what: "attention heads",
    },
    // Routed experts: 256 (DeepSeek-V3), 384 (Kimi K2), 512 (Qwen3-Next).
    Bound {
        keys: &[
            "num_experts",
            "num_local_experts",
            "n_routed_experts",
            "n_shared_experts",
            "num_experts_per_tok",
            "experts_per_token",
        ],
        max: 1 << 12,
        what: "experts",
    },
];

/// Everything else (vocabularies: 256,000 for Gemma; positions: 10,485,760 for Llama-4 Scout;
/// token ids, buckets, windows): 2²⁴ = 16,777,216.
const MAX_OTHER: u64 = 1 << 24;

/// The bound on `key` and what it counts.
fn bound(key: &str) -> (u64, &'static str) {
    BOUNDS.iter().find(|b| b.keys.contains(&key)).map_or((MAX_OTHER, "a size or count"), |b| (b.max, b.what))
}

/// A `config.json` object and the name of the file it came from.
#[derive(Debug, Clone)]
pub struct HfConfig {
    origin: String,
    object: Map<String, Value>,
}

/// A JSON value as an error message names it (`` `4` ``, `the string "x"`, `a list`).
pub(crate) fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("`{b}`"),
        Value::Number(n) => format!("`{n}`"),
        Value::String(s) => format!("the string \"{s}\""),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
    }
}

impl HfConfig {
    /// Parses JSON text; syntax errors carry line and column.
    pub fn parse(text: &str, origin: &str) -> Result<HfConfig, InputError> {
        const FIX: &str = "a config.json is one JSON object, as transformers' `save_pretrained` writes it: \
                           correct the file, or download it again";
        let value: Value =
            serde_json::from_str(text).map_err(|e| InputError::json(origin, &e).with_fix(FIX))?;
        match value {
            Value::Object(object) => Ok(HfConfig { origin: origin.to_string(), object }),
            other => Err(InputError::new(
                origin,
                format!("expected a JSON object (a HF config.json), found {}", describe(&other)),
            )
            .with_fix(FIX)),
        }
    }

    /// Wraps an already parsed object.
    pub fn from_object(object: Map<String, Value>, origin: &str) -> HfConfig {
        HfConfig { origin: origin.to_string(), object }
    }

    /// Where the config came from (a file path, a built-in model's name): the origin of every
    /// error about it, and the imported model's name.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The raw JSON object, for keys whose mere presence matters (`head_dim`,
    /// `num_key_value_heads`: null and absent differ).
    pub fn object(&self) -> &Map<String, Value> {
        &self.object
    }

    /// The value of the first of `keys` present and not null.
    pub fn get<'k>(&self, keys: &[&'k str]) -> Option<(&'k str, &Value)> {
        keys.iter().find_map(|k| match self.object.get(*k) {
            None | Some(Value::Null) => None,
            Some(v) => Some((*k, v)),
        })
    }

    /// An error at `key`, with the fix that holds for every wrong value of a config key (a
    /// caller with a more precise one replaces it with [`InputError::with_fix`]).
    fn error(&self, key: &str, problem: String) -> InputError {
        InputError::new(&self.origin, problem).at_key(key).with_fix(format!(
            "write `{key}` as transformers' config class takes it (the checkpoint's published config.json has it)"
        ))
    }

    fn missing(&self, keys: &[&str], what: &str) -> InputError {
        let names = keys.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(" or ");
        InputError::new(&self.origin, format!("missing {names}: expected {what}"))
            .at_key(keys[0])
            .with_fix(format!("add \"{}\" to the config", keys[0]))
    }

    fn integer(&self, key: &str, value: &Value, what: &str) -> Result<u64, InputError> {
        let v = self.plain_integer(key, value, what)?;
        let (max, counts) = bound(key);
        if v > max {
            return Err(self
                .error(
                    key,
                    format!(
                        "{v} is implausibly large: past the bound of {max} for {counts} (docs/limits.md)"
                    ),
                )
                .with_fix(format!("give `{key}` at most {max}; the largest real models are far below it")));
        }
        Ok(v)
    }

    fn plain_integer(&self, key: &str, value: &Value, what: &str) -> Result<u64, InputError> {
        match value {
            Value::Number(n) => {
                if let Some(v) = n.as_u64() {
                    return Ok(v);
                }
                if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0) {
                    return Ok(f as u64);
                }
                Err(self.error(key, format!("expected {what}, found {}", describe(value))))
            }
            _ => Err(self.error(key, format!("expected {what}, found {}", describe(value)))),
        }
    }

    /// A required integer > 0 (layers, hidden size, heads, vocabulary).
    pub fn positive(&self, keys: &[&str]) -> Result<u64, InputError> {
        self.opt_positive(keys)?.ok_or_else(|| self.missing(keys, "a positive integer"))
    }

    /// An optional integer that must be > 0 where given.
    pub fn opt_positive(&self, keys: &[&str]) -> Result<Option<u64>, InputError> {
        let Some((key, value)) = self.get(keys) else { return Ok(None) };
        let v = self.integer(key, value, "a positive integer")?;
        if v == 0 {
            return Err(self
                .error(key, "expected a positive integer, found `0`".into())
                .with_fix(format!("`{key}` must be at least 1")));
        }
        Ok(Some(v))
    }

    /// An integer > 0 with a default when absent.
    pub fn positive_or(&self, keys: &[&str], default: u64) -> Result<u64, InputError> {
        Ok(self.opt_positive(keys)?.unwrap_or(default))
    }

    /// An integer ≥ 0 with a default when absent (counts that may be zero: shared experts,
    /// first dense layers).
    pub fn uint_or(&self, keys: &[&str], default: u64) -> Result<u64, InputError> {
        match self.get(keys) {
            None => Ok(default),
            Some((key, value)) => self.integer(key, value, "a non-negative integer"),
        }
    }

    /// A boolean (`tie_word_embeddings`, `attention_bias`) with a default when absent or null;
    /// anything but `true` or `false` is refused with the key.
    pub fn bool_or(&self, keys: &[&str], default: bool) -> Result<bool, InputError> {
        match self.get(keys) {
            None => Ok(default),
            Some((_, Value::Bool(b))) => Ok(*b),
            Some((key, v)) => Err(self.error(key, format!("expected true or false, found {}", describe(v)))),
        }
    }

    /// An optional number (`partial_rotary_factor`, `rotary_pct`); `None` when absent or null, refused
    /// with the key when not a number.
    pub fn float_opt(&self, keys: &[&str]) -> Result<Option<f64>, InputError> {
        match self.get(keys) {
            None => Ok(None),
            Some((_, Value::Number(n))) => Ok(n.as_f64()),
            Some((key, v)) => Err(self.error(key, format!("expected a number, found {}", describe(v)))),
        }
    }

    /// An optional string (`hidden_act`, `torch_dtype`); `None` when absent or null, refused with
    /// the key when not a string.
    pub fn string_opt(&self, keys: &[&str]) -> Result<Option<String>, InputError> {
        match self.get(keys) {
            None => Ok(None),
            Some((_, Value::String(s))) => Ok(Some(s.clone())),
            Some((key, v)) => Err(self.error(key, format!("expected a string, found {}", describe(v)))),
        }
    }

    /// A list of non-negative integers (`mlp_only_layers`).
    pub fn uint_list(&self, keys: &[&str]) -> Result<Option<Vec<u64>>, InputError> {
        match self.get(keys) {
            None => Ok(None),
            Some((key, Value::Array(items))) => items
                .iter()
                .map(|v| self.integer(key, v, "a list of non-negative integers"))
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some((key, v)) => {
                Err(self.error(key, format!("expected a list of integers, found {}", describe(v))))
            }
        }
    }

    /// A list of strings (`layer_types`).
    pub fn string_list(&self, keys: &[&str]) -> Result<Option<Vec<String>>, InputError> {
        match self.get(keys) {
            None => Ok(None),
            Some((key, Value::Array(items))) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    other => {
                        Err(self.error(key, format!("expected a list of strings, found {}", describe(other))))
                    }
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some((key, v)) => {
                Err(self.error(key, format!("expected a list of strings, found {}", describe(v))))
            }
        }
    }

    /// The per-head width: the explicit key when present, else `hidden / heads`, which must
    /// divide exactly.
    pub fn head_dim(
        &self,
        explicit: &[&str],
        hidden: u64,
        heads: u64,
        heads_key: &str,
    ) -> Result<u64, InputError> {
        if let Some(dim) = self.opt_positive(explicit)? {
            return Ok(dim);
        }
        if !hidden.is_multiple_of(heads) {
            return Err(self
                .error(heads_key, format!("{heads} attention heads do not divide the hidden size {hidden}"))
                .with_fix("the hidden size must be a multiple of the head count (or give `head_dim`)"));
        }
        Ok(hidden / heads)
    }

    /// Key/value heads (`num_key_value_heads`): `absent` when the key is missing, one per
    /// attention head when it is `null` (the config classes' `__post_init__`), and refused unless
    /// they divide the `heads` attention heads, as grouped-query attention needs.
    pub fn kv_heads(&self, heads: u64, absent: u64) -> Result<u64, InputError> {
        let kv_heads = match self.object().get("num_key_value_heads") {
            None => absent,
            Some(Value::Null) => heads,
            Some(_) => self.positive(&["num_key_value_heads"])?,
        };
        if !heads.is_multiple_of(kv_heads) {
            return Err(self
                .error(
                    "num_key_value_heads",
                    format!("{kv_heads} key/value heads do not divide {heads} attention heads"),
                )
                .with_fix(
                    "grouped-query attention needs the head count to be a multiple of the key/value heads",
                ));
        }
        Ok(kv_heads)
    }

    /// The parameters' dtype: `torch_dtype` (4.x) or `dtype` (5.x); float32 when absent, as
    /// transformers assumes.
    pub fn dtype(&self) -> Result<DType, InputError> {
        match self.string_opt(&["torch_dtype", "dtype"])? {
            None => Ok(DType::F32),
            Some(name) => DType::parse(&name).ok_or_else(|| {
                self.error("torch_dtype", format!("unknown dtype \"{name}\""))
                    .with_fix(format!("use one of {}", DType::SPELLINGS))
            }),
        }
    }

    /// The top-level class: `architectures[0]`, or derived from `model_type` when the list is
    /// absent. Old Falcon configs (`RWForCausalLM`, `RefinedWeb*`) map to `FalconForCausalLM`.
    pub fn architecture(&self) -> Result<String, InputError> {
        let named = match self.get(&["architectures"]) {
            Some((_, Value::Array(items))) => match items.first() {
                Some(Value::String(s)) => Some(s.clone()),
                Some(other) => {
                    return Err(self.error(
                        "architectures",
                        format!("expected a list of class names, found {}", describe(other)),
                    ));
                }
                None => None,
            },
            Some((key, other)) => {
                return Err(
                    self.error(key, format!("expected a list of class names, found {}", describe(other)))
                );
            }
            None => None,
        };
        let model_type = self.string_opt(&["model_type"])?;
        let arch = match (named, model_type.as_deref()) {
            (Some(name), _) => name,
            (None, Some(t)) => match class_for_model_type(t) {
                Some(class) => class.to_string(),
                None => t.to_string(),
            },
            (None, None) => {
                return Err(self.missing(&["architectures", "model_type"], "the model's class"));
            }
        };
        Ok(match arch.as_str() {
            "RWForCausalLM" | "RefinedWebModel" | "RefinedWeb" => "FalconForCausalLM".to_string(),
            _ => arch,
        })
    }
}

fn class_for_model_type(model_type: &str) -> Option<&'static str> {
    Some(match model_type {
        "llama" => "LlamaForCausalLM",
        "mistral" => "MistralForCausalLM",
        "mixtral" => "MixtralForCausalLM",
        "qwen2" => "Qwen2ForCausalLM",
        "qwen2_moe" => "Qwen2MoeForCausalLM",
        "qwen3" => "Qwen3ForCausalLM",
        "qwen3_moe" => "Qwen3MoeForCausalLM",
        "deepseek_v2" => "DeepseekV2ForCausalLM",
        "deepseek_v3" => "DeepseekV3ForCausalLM",
        "gpt_neox" => "GPTNeoXForCausalLM",
        "gpt2" => "GPT2LMHeadModel",
        "phi" => "PhiForCausalLM",
        "phi3" => "Phi3ForCausalLM",
        "gemma" => "GemmaForCausalLM",
        "gemma2" => "Gemma2ForCausalLM",
        "falcon" | "RefinedWeb" | "RefinedWebModel" => "FalconForCausalLM",
        "opt" => "OPTForCausalLM",
        "bloom" => "BloomForCausalLM",
        "gpt_bigcode" => "GPTBigCodeForCausalLM",
        "gpt_oss" => "GptOssForCausalLM",
        "olmoe" => "OlmoeForCausalLM",
        "t5" => "T5ForConditionalGeneration",
        "bert" => "BertForMaskedLM",
        "xlnet" => "XLNetLMHeadModel",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_key_and_what_was_found() {
        let c = HfConfig::parse(r#"{"num_hidden_layers": 0, "hidden_size": "big"}"#, "c.json").unwrap();
        let e = c.positive(&["num_hidden_layers"]).unwrap_err().to_string();
        assert!(e.contains("num_hidden_layers") && e.contains("found `0`"), "{e}");
        let e = c.positive(&["hidden_size"]).unwrap_err().to_string();
        assert!(e.contains("the string \"big\""), "{e}");
        let e = c.positive(&["vocab_size"]).unwrap_err().to_string();
        assert!(e.contains("missing `vocab_size`"), "{e}");
    }

    #[test]
    fn head_dim_must_divide() {
        let c = HfConfig::parse("{}", "c.json").unwrap();
        assert_eq!(c.head_dim(&["head_dim"], 4096, 32, "num_attention_heads").unwrap(), 128);
        let e = c.head_dim(&["head_dim"], 4096, 30, "num_attention_heads").unwrap_err().to_string();
        assert!(e.contains("do not divide"), "{e}");
    }

    #[test]
    fn syntax_errors_carry_line_and_column() {
        let e = HfConfig::parse("{\n  \"a\": 1,\n  \"b\" 2\n}", "c.json").unwrap_err();
        assert_eq!(e.location, Some(crate::Location::LineColumn { line: 3, column: 7 }));
    }

    #[test]
    fn old_falcon_keys_map_to_falcon() {
        let c = HfConfig::parse(r#"{"architectures": ["RWForCausalLM"]}"#, "c.json").unwrap();
        assert_eq!(c.architecture().unwrap(), "FalconForCausalLM");
        let c = HfConfig::parse(r#"{"model_type": "RefinedWebModel"}"#, "c.json").unwrap();
        assert_eq!(c.architecture().unwrap(), "FalconForCausalLM");
    }
}
