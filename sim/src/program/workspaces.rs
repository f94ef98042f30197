//! The BLAS library workspaces PyTorch allocates through its caching allocator on each GPU that
//! runs matmuls (cuBLAS per handle, cuBLASLt beside it), as torch 2.11 keeps them.

use crate::workload::{GradCheckpointing, Mode, Workload};
use vramplan_profiles::model::{ModelDescription, ModuleKind};

/// One cuBLAS handle's workspace, as torch 2.11 sizes it (`parseChosenWorkspaceSize` in
/// aten/src/ATen/cuda/CublasHandlePool.cpp) with `CUBLAS_WORKSPACE_CONFIG` unset: 32 MiB
/// (`4096 * 8 * 1024`) on compute capability 9 (Hopper), else `:4096:2:16:8` = 4096 KiB × 2 +
/// 16 KiB × 8 = 8,519,680 B. PyTorch PR #175344 (in 2.12) gives 32 MiB to 10 and 12 as well, and
/// 2.15's source to 9 to 12. `setWorkspaceForHandle` allocates it through the caching allocator
/// once per (handle, stream) at the handle's first matmul and keeps it.
pub fn cublas_workspace(compute_major: u32) -> u64 {
    if compute_major == 9 { 32 << 20 } else { 8_519_680 }
}

/// cuBLASLt's own workspace (`CUBLASLT_WORKSPACE_SIZE` unset: 1024 KiB, PyTorch PR #73439), kept
/// per (handle, stream) beside the cuBLAS one up to torch 2.11 (PR #156495; unified with it by
/// default only from PR #175879, after 2.11's branch cut). ATen runs cuBLASLt for `addmm` with a
/// 1-D bias, i.e. a `Linear` (or GPT-2's `Conv1D`) with a bias.
pub const CUBLASLT_WORKSPACE: u64 = 1 << 20;

/// The BLAS workspaces (each its own allocation) a GPU of compute capability `compute_major`
/// holds for `model` under `workload`: a cuBLAS workspace per thread that runs matmuls there
/// (handles are per thread and device, `DeviceThreadHandlePool`): the script's forward, and in
/// training the autograd engine's worker thread of the device, which runs its backward; plus
/// cuBLASLt's where a linear layer has a bias, on each thread that runs a biased forward: the
/// forward thread, and in training with recomputation (checkpointing, Unsloth's offloaded
/// checkpoints) the autograd thread too, which reruns the forward. Torch 2.15 allocates both per
/// operation instead (`TORCH_CUBLAS_WORKSPACE_CACHE` unset, PR #194311): not modelled here
/// (docs/memory-model.md).
pub fn blas_workspaces(model: &ModelDescription, compute_major: u32, workload: &Workload) -> Vec<u64> {
    BlasWorkspaces::of(model, workload).on(compute_major)
}

/// What [`blas_workspaces`] reads of the model and the workload, read once (the model's whole
/// module tree is walked for a biased linear layer), for GPUs of any compute capability.
#[derive(Debug, Clone, Copy)]
pub struct BlasWorkspaces {
    /// cuBLAS handles: the forward's thread, and autograd's in training.
    handles: usize,
    /// cuBLASLt workspaces: one per thread that runs a biased linear forward.
    lt: usize,
}

impl BlasWorkspaces {
    /// The handles and cuBLASLt workspaces of `model` under `workload`.
    pub fn of(model: &ModelDescription, workload: &Workload) -> BlasWorkspaces {
        let train = workload.mode == Mode::Train;
        let mut biased = false;
        model.root.visit(&mut |m| {
            biased |= m.kind == ModuleKind::Linear && m.tensors.iter().any(|t| t.name == "bias");
        });
        let recompute = train && workload.grad_checkpointing != GradCheckpointing::Off;
        BlasWorkspaces {
            handles: if train { 2 } else { 1 },
            lt: match (biased, recompute) {
                (false, _) => 0,
                (true, false) => 1,
                (true, true) => 2,
            },
        }
    }

    /// Each workspace's bytes on a GPU of compute capability `compute_major`.
    pub fn on(self, compute_major: u32) -> Vec<u64> {
        let mut sizes = vec![cublas_workspace(compute_major); self.handles];
        sizes.extend(std::iter::repeat_n(CUBLASLT_WORKSPACE, self.lt));
        sizes
    }

    /// Their sum on a GPU of compute capability `compute_major`.
    pub fn bytes_on(self, compute_major: u32) -> u64 {
        self.on(compute_major).iter().sum()
    }
}
