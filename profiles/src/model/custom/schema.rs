//! The custom-model YAML schema as serde types (documented for users in
//! `docs/custom-models.md`). Unknown keys are refused; numbers that must be positive are read as
//! signed integers with their location, so that `-2` gets a clear message at its line rather
//! than a type error.

use crate::DType;
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_saphyr::Spanned;
use std::fmt;
use std::marker::PhantomData;

/// A whole custom-model file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ModelFile {
    /// The model's name (default: the file's path).
    pub name: Option<String>,
    /// The root module's class (default `CustomModel`, or the extended model's).
    pub architecture: Option<String>,
    /// A HF `config.json` (relative to this file), a model folder, or a built-in model name.
    pub extend: Option<Spanned<String>>,
    /// Parameters' dtype (default fp32, or the extended model's).
    pub dtype: Option<DType>,
    pub hidden_size: Option<Spanned<i64>>,
    pub attention_heads: Option<Spanned<i64>>,
    pub kv_heads: Option<Spanned<i64>>,
    pub head_dim: Option<Spanned<i64>>,
    pub intermediate_size: Option<Spanned<i64>>,
    pub vocab_size: Option<Spanned<i64>>,
    pub max_positions: Option<Spanned<i64>>,
    pub norm: Option<NormName>,
    pub activation: Option<String>,
    pub gated_mlp: Option<bool>,
    /// Activation sizes of every block that does not give its own.
    pub activations: Option<ActivationsSpec>,
    /// Tensor path → the tensor path it shares storage with.
    pub ties: Option<Ordered<Spanned<String>>>,
    /// With `extend`: the extended model's head dropped (`none`) or replaced by a task head
    /// (`{task: sequence_classification, labels: 3}`); read by `head.rs`.
    pub head: Option<Spanned<serde_json::Value>>,
    /// The modules, in execution order.
    pub modules: Spanned<Vec<ModuleSpec>>,
}

/// One module (and, with `repeat`, a list of copies of it).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ModuleSpec {
    /// Its name, relative to the enclosing module (dots nest: `self_attn.q_proj`).
    pub name: Spanned<String>,
    pub class: Option<String>,
    /// A placement unit that is never split across devices (a transformer block).
    pub block: Option<bool>,
    /// Makes `name` a `ModuleList` of this many copies, `name.0` … `name.{N-1}`.
    pub repeat: Option<Spanned<i64>>,
    /// With `extend`: the block this module runs after.
    pub after: Option<Spanned<String>>,
    pub dtype: Option<DType>,
    pub linear: Option<LinearSpec>,
    pub embedding: Option<EmbeddingSpec>,
    pub norm: Option<NormSpec>,
    /// A parameter count, when the shapes are not known.
    pub params: Option<Spanned<i64>>,
    /// Parameters: name → shape.
    pub tensors: Option<Ordered<Spanned<Vec<i64>>>>,
    pub buffers: Option<Ordered<BufferSpec>>,
    /// Children, in execution order.
    pub modules: Option<Vec<ModuleSpec>>,
    pub activations: Option<ActivationsSpec>,
    /// Blocks only: `encoder` or `decoder` (default).
    pub stack: Option<StackName>,
    /// Blocks only: sliding-window attention span in tokens.
    pub attention_window: Option<Spanned<i64>>,
}

/// `nn.Linear(in, out, bias)`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LinearSpec {
    #[serde(rename = "in", alias = "in_features")]
    pub in_features: Spanned<i64>,
    #[serde(rename = "out", alias = "out_features")]
    pub out_features: Spanned<i64>,
    #[serde(default)]
    pub bias: bool,
}

/// `nn.Embedding(count, dim)`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EmbeddingSpec {
    pub count: Spanned<i64>,
    pub dim: Spanned<i64>,
}

/// A norm of width `dim` (`nn.LayerNorm` by default, with a bias unless `bias: false`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NormSpec {
    pub dim: Spanned<i64>,
    #[serde(default = "yes")]
    pub bias: bool,
}

fn yes() -> bool {
    true
}

/// A buffer: bytes in memory, no parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BufferSpec {
    pub shape: Spanned<Vec<i64>>,
    /// Default fp32.
    pub dtype: Option<DType>,
    /// Saved in checkpoints (default true).
    #[serde(default = "yes")]
    pub persistent: bool,
}

/// Activation memory of a module during a training step.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ActivationsSpec {
    pub per_token: Option<Spanned<SizeText>>,
    pub per_sample: Option<Spanned<SizeText>>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum NormName {
    LayerNorm,
    RmsNorm,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum StackName {
    Encoder,
    Decoder,
}

/// A size as written (`24KiB`, or a bare number that will be refused for lacking a unit).
#[derive(Debug, Clone)]
pub(super) struct SizeText(pub String);

impl<'de> Deserialize<'de> for SizeText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SizeVisitor;
        impl Visitor<'_> for SizeVisitor {
            type Value = SizeText;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size with a unit, such as `24KiB` or `1.5MiB`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<SizeText, E> {
                Ok(SizeText(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<SizeText, E> {
                Ok(SizeText(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<SizeText, E> {
                Ok(SizeText(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<SizeText, E> {
                Ok(SizeText(v.to_string()))
            }
        }
        deserializer.deserialize_any(SizeVisitor)
    }
}

/// A YAML mapping kept in the order written, each key with its location.
#[derive(Debug)]
pub(super) struct Ordered<V>(pub Vec<(Spanned<String>, V)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Ordered<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct OrderedVisitor<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for OrderedVisitor<V> {
            type Value = Ordered<V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a mapping of names")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered<V>, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<Spanned<String>, V>()? {
                    entries.push(entry);
                }
                Ok(Ordered(entries))
            }
        }
        deserializer.deserialize_map(OrderedVisitor(PhantomData))
    }
}
