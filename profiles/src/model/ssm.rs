//! The state-space (Mamba-2) mixer of a hybrid block: the sizes that set its weights, its
//! per-sequence state and what its forward keeps.
//!
//! A block with an SSM mixer carries [`SsmFacts`] in its [`super::LayerFacts::ssm`]; a block
//! without one (`None`) is an attention block. Falcon-H1 (`FalconH1Mixer`,
//! transformers' `models/falcon_h1/modeling_falcon_h1.py`) runs the mixer beside attention in
//! every block, so its blocks have both.

use serde::Serialize;

/// A Mamba-2 mixer's sizes, named as transformers' `FalconH1Mixer` names them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SsmFacts {
    /// The mixer's inner width (`intermediate_size`: `mamba_d_ssm`, else `mamba_expand ×
    /// hidden_size`); `heads × head_dim`.
    pub inner: u64,
    /// SSM heads (`mamba_n_heads`).
    pub heads: u64,
    /// Width of one SSM head (`mamba_d_head`).
    pub head_dim: u64,
    /// Groups sharing B and C (`mamba_n_groups`).
    pub groups: u64,
    /// The state size per head channel (`mamba_d_state`).
    pub state_size: u64,
    /// The causal convolution's kernel (`mamba_d_conv`).
    pub conv_kernel: u64,
    /// Tokens per chunk of the chunked scan (`mamba_chunk_size`).
    pub chunk_size: u64,
    /// The gated RMSNorm after the scan (`mamba_rms_norm`); otherwise `y * silu(gate)`.
    pub gated_norm: bool,
}

impl SsmFacts {
    /// Channels of the causal convolution: x, B and C (`conv_dim = intermediate_size + 2 ×
    /// n_groups × d_state`).
    pub fn conv_dim(&self) -> u64 {
        self.inner + 2 * self.groups * self.state_size
    }

    /// Width of `in_proj`'s output: the gate, the convolution's channels and one `dt` per head
    /// (`projection_size = intermediate_size + conv_dim + num_heads`).
    pub fn projection(&self) -> u64 {
        self.inner + self.conv_dim() + self.heads
    }
}
