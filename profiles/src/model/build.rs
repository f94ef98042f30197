//! Constructors for the modules every architecture is made of, so importers describe structure
//! and not tensor bookkeeping. Shapes follow PyTorch: `nn.Linear(in, out)` has weight `[out, in]`.

use super::Naming;
use super::tree::{Module, ModuleKind, Tensor, join};
use crate::DType;

/// Builds modules whose parameters have one dtype (the checkpoint's), in one naming scheme.
#[derive(Debug, Clone, Copy)]
pub struct Builder {
    /// The dtype every parameter it makes is stored in.
    pub dtype: DType,
    /// The transformers version whose module names and buffers it follows (5.x adds
    /// `original_inv_freq` to rotary embeddings).
    pub naming: Naming,
}

impl Builder {
    /// A builder making parameters of `dtype`, named in `naming`.
    pub fn new(dtype: DType, naming: Naming) -> Builder {
        Builder { dtype, naming }
    }

    /// `nn.Linear(in_features, out_features, bias)` at `parent.name`.
    pub fn linear(
        &self,
        parent: &str,
        name: &str,
        in_features: u64,
        out_features: u64,
        bias: bool,
    ) -> Module {
        let mut m = Module::new(join(parent, name), "Linear", ModuleKind::Linear)
            .with_tensor(Tensor::parameter("weight", &[out_features, in_features], self.dtype));
        if bias {
            m = m.with_tensor(Tensor::parameter("bias", &[out_features], self.dtype));
        }
        m
    }

    /// GPT-2's `Conv1D(nf, nx)`: a linear layer whose weight is stored `[in, out]`.
    pub fn conv1d(&self, parent: &str, name: &str, in_features: u64, out_features: u64) -> Module {
        Module::new(join(parent, name), "Conv1D", ModuleKind::Linear)
            .with_tensor(Tensor::parameter("weight", &[in_features, out_features], self.dtype))
            .with_tensor(Tensor::parameter("bias", &[out_features], self.dtype))
    }

    /// `nn.Embedding(count, dim)`.
    pub fn embedding(&self, parent: &str, name: &str, count: u64, dim: u64) -> Module {
        Module::new(join(parent, name), "Embedding", ModuleKind::Embedding).with_tensor(Tensor::parameter(
            "weight",
            &[count, dim],
            self.dtype,
        ))
    }

    /// A norm of width `dim` with class `class` (`LlamaRMSNorm`, `LayerNorm`); LayerNorm-style
    /// norms have a bias.
    pub fn norm(&self, parent: &str, name: &str, class: &str, dim: u64, bias: bool) -> Module {
        let mut m = Module::new(join(parent, name), class, ModuleKind::Norm).with_tensor(Tensor::parameter(
            "weight",
            &[dim],
            self.dtype,
        ));
        if bias {
            m = m.with_tensor(Tensor::parameter("bias", &[dim], self.dtype));
        }
        m
    }

    /// An `nn.Dropout`: no tensors, but a module transformers lists in a device map once its
    /// parent is split, so a map names it.
    pub fn dropout(&self, parent: &str, name: &str) -> Module {
        Module::new(join(parent, name), "Dropout", ModuleKind::Other)
    }

    /// A module holding other modules.
    pub fn container(&self, parent: &str, name: &str, class: &str) -> Module {
        Module::new(join(parent, name), class, ModuleKind::Container)
    }

    /// A transformer block (never split across devices).
    pub fn block(&self, parent: &str, name: &str, class: &str) -> Module {
        Module::new(join(parent, name), class, ModuleKind::Block)
    }

    /// An `nn.ModuleList` holding `items` (their paths must already be `parent.name.N`).
    pub fn module_list(&self, parent: &str, name: &str, items: Vec<Module>) -> Module {
        Module::new(join(parent, name), "ModuleList", ModuleKind::Container).with_children(items)
    }

    /// A rotary embedding module: its `inv_freq` is a non-persistent fp32 buffer of
    /// `rotary_dim / 2` values (transformers computes it in float32 whatever the model dtype);
    /// 5.x keeps a copy, `original_inv_freq`, for dynamic rope scaling.
    pub fn rotary(&self, parent: &str, name: &str, class: &str, rotary_dim: u64) -> Module {
        let frequencies = [rotary_dim / 2];
        let mut m = Module::new(join(parent, name), class, ModuleKind::Other).with_tensor(Tensor::buffer(
            "inv_freq",
            &frequencies,
            DType::F32,
            false,
        ));
        if self.naming == Naming::V5 {
            m = m.with_tensor(Tensor::buffer("original_inv_freq", &frequencies, DType::F32, false));
        }
        m
    }

    /// Fused routed experts (transformers 5.x): one module holding 3-D tensors whose first
    /// dimension is the expert count.
    pub fn fused_experts(
        &self,
        parent: &str,
        name: &str,
        class: &str,
        count: u32,
        tensors: &[(&str, &[u64])],
    ) -> Module {
        let mut m = Module::new(join(parent, name), class, ModuleKind::Experts { count });
        for (tensor_name, shape) in tensors {
            m = m.with_tensor(Tensor::parameter(tensor_name, shape, self.dtype));
        }
        m
    }

    /// Routed experts as a list of per-expert modules (transformers 4.x): `make(i, path)` builds
    /// expert `i` at `path`.
    pub fn expert_list(
        &self,
        parent: &str,
        name: &str,
        count: u32,
        make: impl Fn(u32, &str) -> Module,
    ) -> Module {
        let path = join(parent, name);
        let experts = (0..count).map(|i| make(i, &join(&path, &i.to_string()))).collect::<Vec<_>>();
        Module::new(path, "ModuleList", ModuleKind::Experts { count }).with_children(experts)
    }

    /// An MoE router with a `[experts, hidden]` weight (and an optional bias).
    pub fn router(
        &self,
        parent: &str,
        name: &str,
        class: &str,
        hidden: u64,
        experts: u32,
        bias: bool,
    ) -> Module {
        let experts = u64::from(experts);
        let mut m = Module::new(join(parent, name), class, ModuleKind::Router)
            .with_tensor(Tensor::parameter("weight", &[experts, hidden], self.dtype));
        if bias {
            m = m.with_tensor(Tensor::parameter("bias", &[experts], self.dtype));
        }
        m
    }
}
