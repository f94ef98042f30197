//! The module tree: modules with PyTorch paths, each owning its tensors and child modules.

use crate::DType;
use serde::Serialize;

/// What a module is, as far as memory planning cares. The PyTorch class is in [`Module::class`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum ModuleKind {
    /// Holds other modules (the model, `model.layers`, an attention or MLP block).
    Container,
    /// A transformer block: the unit accelerate never splits (`_no_split_modules`).
    Block,
    /// `nn.Linear` and its quantized forms: what bitsandbytes quantizes and LoRA targets.
    Linear,
    /// `nn.Embedding` (token, position or token-type embeddings).
    Embedding,
    /// A normalization layer (`LayerNorm`, `LlamaRMSNorm`, ...).
    Norm,
    /// The routed experts of one MoE layer, fused into 3-D tensors (5.x) or as children (4.x).
    Experts {
        /// Routed experts in this layer (config.json's `num_local_experts`, `num_experts` or
        /// `n_routed_experts`).
        count: u32,
    },
    /// An MoE router (gate).
    Router,
    /// A module holding only buffers (rotary embeddings) or otherwise unclassified weights.
    Other,
}

/// What a tensor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorKind {
    /// A parameter: every element is one parameter.
    Parameter,
    /// A quantized parameter packed into wider words (GPTQ/AWQ `qweight` int32 holds 8 4-bit
    /// values): each element holds `per_element` parameters.
    PackedParameter {
        /// Parameters packed into one stored element (8 4-bit values in an int32).
        per_element: u32,
    },
    /// Quantization constants (scales, zeros, absmax, `weight_scale_inv`): bytes, no parameters.
    QuantConstant,
    /// A buffer: bytes in memory, no parameters. Persistent buffers are saved in checkpoints.
    Buffer {
        /// Saved in the state dict and checkpoints (`register_buffer(..., persistent=True)`);
        /// non-persistent buffers (rotary `inv_freq`) are rebuilt at load.
        persistent: bool,
    },
}

/// One tensor.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tensor {
    /// The name inside its module (`weight`, `bias`, `gate_up_proj`, `inv_freq`).
    pub name: String,
    /// The stored shape.
    pub shape: Vec<u64>,
    /// The element type it is held in (as the safetensors header gives it, for a checkpoint).
    pub dtype: DType,
    /// Parameter, packed quantized parameter, quantization constant or buffer.
    pub kind: TensorKind,
    /// The full path of the tensor this one shares storage with (tied embeddings).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tied_to: Option<String>,
    /// The tensor is created in PyTorch's default dtype, which transformers sets to the load
    /// dtype while it builds the model, so it is held in the dtype the model is loaded in and
    /// recast with it ([`crate::model::ModelDescription::cast`]). True for parameters and for
    /// buffers made with `torch.tensor(x)` / `torch.zeros(n)`; false for tensors of a fixed
    /// dtype: rotary `inv_freq` (computed in float32), int64 position ids, bool masks, and
    /// parameters made with `torch.FloatTensor` (XLNet), which stay float32 when loaded.
    pub follows_load_dtype: bool,
}

/// The floating-point parameter a quantized weight (GPTQ `qweight`, an fp8 `weight`, MXFP4
/// `*_blocks`) stands for: its name in the unquantized module (`weight`, `gate_up_proj`) and its
/// shape there, which dequantization restores
/// ([`crate::model::ModelDescription::dequantized`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FloatForm {
    /// The parameter's name in the unquantized module.
    pub name: String,
    /// Its shape there (`[out, in]` for `nn.Linear`).
    pub shape: Vec<u64>,
}

impl Tensor {
    /// A parameter (`nn.Parameter`) that follows the load dtype, untied.
    pub fn parameter(name: &str, shape: &[u64], dtype: DType) -> Tensor {
        Tensor {
            name: name.to_string(),
            shape: shape.to_vec(),
            dtype,
            kind: TensorKind::Parameter,
            tied_to: None,
            follows_load_dtype: true,
        }
    }

    /// A quantization constant (scales, zeros, absmax): bytes, no parameters, never recast.
    pub fn constant(name: &str, shape: &[u64], dtype: DType) -> Tensor {
        Tensor {
            kind: TensorKind::QuantConstant,
            follows_load_dtype: false,
            ..Tensor::parameter(name, shape, dtype)
        }
    }

    /// A parameter of a fixed dtype, whatever the model is loaded in (`torch.FloatTensor`).
    pub fn fixed_parameter(name: &str, shape: &[u64], dtype: DType) -> Tensor {
        Tensor { follows_load_dtype: false, ..Tensor::parameter(name, shape, dtype) }
    }

    /// A buffer of a fixed dtype, whatever the model is loaded in.
    pub fn buffer(name: &str, shape: &[u64], dtype: DType, persistent: bool) -> Tensor {
        Tensor {
            kind: TensorKind::Buffer { persistent },
            follows_load_dtype: false,
            ..Tensor::parameter(name, shape, dtype)
        }
    }

    /// A buffer created in the default dtype, so held in the load dtype `load_dtype` (see
    /// [`Tensor::follows_load_dtype`]).
    pub fn load_dtype_buffer(name: &str, shape: &[u64], load_dtype: DType, persistent: bool) -> Tensor {
        Tensor { follows_load_dtype: true, ..Tensor::buffer(name, shape, load_dtype, persistent) }
    }

    /// Whether `from_pretrained(dtype=...)` gives this tensor the load dtype: a floating-point
    /// parameter or buffer made in the default dtype. Quantization constants, packed weights,
    /// weights stored quantized (fp8) and fixed-dtype tensors keep their own: transformers casts
    /// loaded floating-point values to the load dtype except float8 ones
    /// (`modeling_utils._load_state_dict_into_meta_model`: "We convert floating dtypes to the
    /// `dtype` passed except for float8_e4m3fn type"), and quantizers allocate their weights in
    /// the stored type.
    pub fn takes_load_dtype(&self) -> bool {
        matches!(self.kind, TensorKind::Parameter | TensorKind::Buffer { .. })
            && self.follows_load_dtype
            && self.dtype.is_float()
            && self.dtype.bits() >= 16
    }

    /// Elements stored.
    pub fn numel(&self) -> u64 {
        self.shape.iter().fold(1u64, |n, &d| n.saturating_mul(d))
    }

    /// Logical parameters (0 for buffers and quantization constants).
    pub fn params(&self) -> u64 {
        match self.kind {
            TensorKind::Parameter => self.numel(),
            TensorKind::PackedParameter { per_element } => {
                self.numel().saturating_mul(u64::from(per_element))
            }
            TensorKind::QuantConstant | TensorKind::Buffer { .. } => 0,
        }
    }

    /// Bytes stored.
    pub fn bytes(&self) -> u64 {
        self.dtype.bytes_for(self.numel())
    }
}

/// A module: its path, class, kind, own tensors and children.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Module {
    /// The full dotted path (`model.layers.0.self_attn`); the root's is empty.
    pub path: String,
    /// The PyTorch class name (`Linear`, `LlamaDecoderLayer`).
    pub class: String,
    /// What the module is for memory planning (block, linear, experts, ...).
    pub kind: ModuleKind,
    /// The module's own parameters, quantization constants and buffers, not its children's.
    pub tensors: Vec<Tensor>,
    /// Its submodules, in registration order.
    pub children: Vec<Module>,
    /// For a module a quantizer replaced (`FP8Linear`, `Mxfp4GptOssExperts`): the class it
    /// replaced, which dequantization restores. `None` otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub float_class: Option<String>,
    /// The activation sizes a custom model declares for this module (its `activations:` in the
    /// YAML, or the file's default for a block), which the memory model uses in place of its
    /// transformer formula; `None` otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activations: Option<super::custom::ActivationSizes>,
}

/// Joins a parent path and a child name (`join("", "model") == "model"`).
pub fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() { name.to_string() } else { format!("{parent}.{name}") }
}

impl Module {
    /// A module at `path` of PyTorch class `class`, with no tensors or children yet.
    pub fn new(path: impl Into<String>, class: impl Into<String>, kind: ModuleKind) -> Module {
        Module {
            path: path.into(),
            class: class.into(),
            kind,
            tensors: Vec::new(),
            children: Vec::new(),
            float_class: None,
            activations: None,
        }
    }

    /// The last component of the path (`q_proj`, `17`).
    pub fn name(&self) -> &str {
        self.path.rsplit('.').next().unwrap_or("")
    }

    /// The same module with `tensor` added to its own tensors.
    pub fn with_tensor(mut self, tensor: Tensor) -> Module {
        self.tensors.push(tensor);
        self
    }

    /// The same module with `child` added as its last submodule.
    pub fn with_child(mut self, child: Module) -> Module {
        self.children.push(child);
        self
    }

    /// The same module with `children` added, in order, after its submodules.
    pub fn with_children(mut self, children: impl IntoIterator<Item = Module>) -> Module {
        self.children.extend(children);
        self
    }

    /// Logical parameters in this module and below, tied tensors excluded.
    pub fn params(&self) -> u64 {
        let own = self.tensors.iter().filter(|t| t.tied_to.is_none()).map(Tensor::params);
        own.chain(self.children.iter().map(Module::params)).fold(0, u64::saturating_add)
    }

    /// Bytes in this module and below, tied tensors excluded.
    pub fn bytes(&self) -> u64 {
        let own = self.tensors.iter().filter(|t| t.tied_to.is_none()).map(Tensor::bytes);
        own.chain(self.children.iter().map(Module::bytes)).fold(0, u64::saturating_add)
    }

    /// Bytes of buffers in this module and below.
    pub fn buffer_bytes(&self) -> u64 {
        let own = self
            .tensors
            .iter()
            .filter(|t| matches!(t.kind, TensorKind::Buffer { .. }))
            .map(Tensor::bytes)
            .fold(0, u64::saturating_add);
        self.children.iter().map(Module::buffer_bytes).fold(own, u64::saturating_add)
    }

    /// Calls `f` on this module and every descendant, parents first.
    pub fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Module)) {
        f(self);
        for child in &self.children {
            child.visit(f);
        }
    }

    /// Calls `f` on this module and every descendant, parents first, mutably.
    pub fn visit_mut(&mut self, f: &mut dyn FnMut(&mut Module)) {
        f(self);
        for child in &mut self.children {
            child.visit_mut(f);
        }
    }

    /// The module at `path` in this subtree.
    pub fn find(&self, path: &str) -> Option<&Module> {
        if self.path == path {
            return Some(self);
        }
        self.children.iter().find(|c| is_prefix(&c.path, path)).and_then(|c| c.find(path))
    }

    /// The module at `path` in this subtree, mutably.
    pub fn find_mut(&mut self, path: &str) -> Option<&mut Module> {
        if self.path == path {
            return Some(self);
        }
        self.children.iter_mut().find(|c| is_prefix(&c.path, path)).and_then(|c| c.find_mut(path))
    }

    /// The tensor at a full path (`model.norm.weight`).
    pub fn tensor(&self, path: &str) -> Option<&Tensor> {
        let (module, name) = split_tensor_path(path);
        self.find(module)?.tensors.iter().find(|t| t.name == name)
    }

    /// The tensor at a full path, mutably.
    pub fn tensor_mut(&mut self, path: &str) -> Option<&mut Tensor> {
        let (module, name) = split_tensor_path(path);
        self.find_mut(module)?.tensors.iter_mut().find(|t| t.name == name)
    }
}

/// Splits `a.b.weight` into (`a.b`, `weight`); a bare name belongs to the root.
pub fn split_tensor_path(path: &str) -> (&str, &str) {
    path.rsplit_once('.').unwrap_or(("", path))
}

/// True if `prefix` is `path` or a dotted ancestor of it.
fn is_prefix(prefix: &str, path: &str) -> bool {
    prefix.is_empty()
        || (path.starts_with(prefix) && (path.len() == prefix.len() || path.as_bytes()[prefix.len()] == b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Module {
        Module::new("", "Tiny", ModuleKind::Container)
            .with_child(
                Module::new("embed", "Embedding", ModuleKind::Embedding).with_tensor(Tensor::parameter(
                    "weight",
                    &[10, 4],
                    DType::F32,
                )),
            )
            .with_child(
                Module::new("layers", "ModuleList", ModuleKind::Container).with_child(
                    Module::new("layers.1", "Block", ModuleKind::Block)
                        .with_tensor(Tensor::parameter("weight", &[4, 4], DType::F32))
                        .with_tensor(Tensor::buffer("inv_freq", &[2], DType::F32, false)),
                ),
            )
            .with_child(Module::new("layers10", "Linear", ModuleKind::Linear).with_tensor(Tensor {
                tied_to: Some("embed.weight".into()),
                ..Tensor::parameter("weight", &[10, 4], DType::F32)
            }))
    }

    #[test]
    fn sums_skip_tied_tensors_and_buffers_have_no_params() {
        let m = tiny();
        assert_eq!(m.params(), 40 + 16);
        assert_eq!(m.bytes(), (40 + 16 + 2) * 4);
        assert_eq!(m.buffer_bytes(), 8);
    }

    #[test]
    fn lookups_respect_dot_boundaries() {
        let m = tiny();
        assert_eq!(m.find("layers.1").map(|m| m.class.as_str()), Some("Block"));
        assert_eq!(m.find("layers10").map(|m| m.class.as_str()), Some("Linear"));
        assert!(m.tensor("layers.1.inv_freq").is_some());
        assert!(m.tensor("layers.1.bias").is_none());
        assert!(m.find("layers.10").is_none());
    }
}
