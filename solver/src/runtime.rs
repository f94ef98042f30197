//! The runtimes a plan is made for (`--target`): each decides what can be placed on its own,
//! which module names it uses, and whether layers must stay in pipeline order.

use serde::Serialize;
use vramplan_profiles::InputError;
use vramplan_profiles::model::Naming;

/// A target runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Runtime {
    /// accelerate / transformers 5.x `device_map` (fused MoE experts `mlp.experts`).
    #[serde(rename = "accelerate")]
    Accelerate,
    /// accelerate / transformers 4.x `device_map` (`block_sparse_moe.experts.E.w1`).
    #[serde(rename = "accelerate-v4")]
    AccelerateV4,
    /// llama.cpp: `blk.N` layers, MoE expert tensors placeable on their own (`-ot`).
    #[serde(rename = "llama.cpp")]
    LlamaCpp,
    /// Engines that dispatch tokens to experts across GPUs: every expert is its own unit.
    #[serde(rename = "expert-parallel")]
    ExpertParallel,
    /// DeepSpeed / torch pipeline stages: contiguous layer ranges, one per GPU.
    #[serde(rename = "pipeline")]
    Pipeline,
}

impl Runtime {
    /// Every runtime, in the order help texts list them.
    pub const ALL: [Runtime; 5] = [
        Runtime::Accelerate,
        Runtime::AccelerateV4,
        Runtime::LlamaCpp,
        Runtime::ExpertParallel,
        Runtime::Pipeline,
    ];

    /// The `--target` spelling.
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Accelerate => "accelerate",
            Runtime::AccelerateV4 => "accelerate-v4",
            Runtime::LlamaCpp => "llama.cpp",
            Runtime::ExpertParallel => "expert-parallel",
            Runtime::Pipeline => "pipeline",
        }
    }

    /// Reads a `--target` value (`llamacpp` and `llama-cpp` are accepted for `llama.cpp`).
    pub fn parse(text: &str) -> Result<Runtime, InputError> {
        let t = text.trim().to_ascii_lowercase();
        let runtime = match t.as_str() {
            "llamacpp" | "llama-cpp" => Some(Runtime::LlamaCpp),
            "accelerate-4" | "accelerate4" | "v4" => Some(Runtime::AccelerateV4),
            _ => Runtime::ALL.into_iter().find(|r| r.name() == t),
        };
        runtime.ok_or_else(|| {
            let names: Vec<&str> = Runtime::ALL.iter().map(|r| r.name()).collect();
            InputError::new("--target", format!("unknown target `{text}`"))
                .with_fix(format!("use one of {}", names.join(", ")))
        })
    }

    /// The module naming the runtime's names follow.
    pub fn naming(self) -> Naming {
        match self {
            Runtime::AccelerateV4 => Naming::V4,
            _ => Naming::V5,
        }
    }
}
