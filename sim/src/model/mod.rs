//! The PyTorch-on-CUDA memory model: what each placement unit holds (weights, gradients,
//! optimizer states), what each block keeps for backward, and the precision rules that decide
//! the dtypes. Every constant is written where it is used, with its source, and in
//! `docs/memory-model.md`.

pub(crate) mod activations;
pub(crate) mod awq_fused;
pub(crate) mod declared;
pub(crate) mod head;
pub(crate) mod litgpt;
pub(crate) mod precision;
pub(crate) mod ssm;
pub(crate) mod torchtune;
pub(crate) mod units;
pub(crate) mod unsloth;
pub(crate) mod vision;
mod working_set;
pub(crate) mod xlnet;
