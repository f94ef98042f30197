"""The cuBLAS and cuBLASLt workspaces PyTorch allocates through its caching allocator for the
matmuls of a fake run, as the torch that would run the script does (CUDA builds; read from
aten/src/ATen/cuda/CublasHandlePool.cpp and the pull requests that changed it):

- Size of the cuBLAS workspace (`parseChosenWorkspaceSize`): `CUBLAS_WORKSPACE_CONFIG` where set,
  every `:SIZE:COUNT` in it adding SIZE KiB x COUNT (a value with none gives the default); else
  32 MiB (`4096 * 8 * 1024`) on the GPUs the source names, and `:4096:2:16:8` = 4096 KiB x 2 +
  16 KiB x 8 = 8,519,680 B on the others. 32 MiB on compute capability 9 (Hopper) only up to
  torch 2.11; 9, 10 and 12 from PR #175344 (merged 2026-02-19, at 2.11's branch cut, so first
  in 2.12); 9 to 12 in 2.15's source.
- Size of the cuBLASLt workspace (`parseCUDABlasLtWorkspaceSize`): `CUBLASLT_WORKSPACE_SIZE`
  KiB, default 1024 KiB (PR #73439).
- Lifetime up to torch 2.14 (and with `TORCH_CUBLAS_WORKSPACE_CACHE=1` from 2.15): cached.
  `getCurrentCUDABlasHandle` reserves the calling thread's handle of the current device
  (`DeviceThreadHandlePool`, one handle per thread and device) and `setWorkspaceForHandle`
  allocates one workspace per (handle, stream) at its first use, never freed; cuBLASLt keeps its
  own per (handle, stream) (PR #156495), unless unified with cuBLAS's: up to 2.11 only with
  `TORCH_CUBLASLT_UNIFIED_WORKSPACE=1` (the default-on unification, PR #175879, merged
  2026-03-02 after 2.11's branch cut; PR #183923 describes the cuBLASLt allocation before it as
  1 MiB); from 2.12 unified unless that variable is 0, and in 2.15 only when caching is on
  (`unified_cublas_and_lt_workspaces`).
- Lifetime from torch 2.15 (PR #194311, "Always eagerly allocate cuBLAS(Lt) workspaces";
  `isCUDABlasWorkspaceCachingEnabled` is false unless `TORCH_CUBLAS_WORKSPACE_CACHE=1`): each
  operation allocates its workspace after its output and frees it when it returns
  (`getCurrentCUDABlasHandleWithWorkspace`), cuBLASLt's of its own (not unified) size.
- Which thread: the script's own for the forward, and the autograd engine's worker thread of
  the device for every backward (the engine runs a CUDA device's backward there), so a
  training step holds two cached cuBLAS workspaces per GPU, one a forward-only run. The fake
  run's backward runs on the script's thread (`script_backward.py`); it is keyed as the
  engine's. One stream per thread is assumed (a script's side streams are fake).
- Which operations: the matmuls ATen runs with cuBLAS (`mm`, `addmm`, `bmm`, `baddbmm`, `addbmm`,
  `mv`, `addmv`, `dot`, `vdot`); `addmm` with a 1-D bias the width of the output (a `Linear`
  with bias) and `_addmm_activation` run cuBLASLt's `gemm_and_bias`, `_scaled_mm` and `_int_mm`
  cuBLASLt only. cuBLASLt's handle is the cuBLAS handle of the thread. Where
  `getCurrentCUDABlasLtHandle` returns `getCurrentCUDABlasHandle()` set up (its workspace
  allocated, as the source read before the `setup=false` argument), an operation of either
  kind allocates the thread's cuBLAS workspace; the sources read from 2.12 on take the handle
  without it. Which of the two 2.11 does is not read from its source (not at hand): taken as
  the former, which the H200's runs agree with (a program whose only matmuls are biased
  `Linear`s held 33 MiB, not 1).

`VRAMPLAN_SCRIPT_TORCH` (e.g. `2.11.0`) names the torch whose rule the run follows where it is
not the torch running the harness (a measurement made with another torch, compared)."""

import os
import re
import threading

import torch

from script_state import GPUS, MEMORY, RUN

CUBLAS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "_addmm_activation"}
CUBLASLT_ONLY = {"_scaled_mm", "_int_mm"}
LT_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def torch_version():
    """(major, minor) of the torch whose rule applies."""
    named = os.environ.get("VRAMPLAN_SCRIPT_TORCH")
    text = named or torch.__version__
    found = re.match(r"(\d+)\.(\d+)", text.strip())
    if found is None and named:
        # The command line refuses it first (exit 2); a harness run another way stops here.
        raise SystemExit(f"VRAMPLAN_SCRIPT_TORCH={named!r} is not a torch version (MAJOR.MINOR)")
    return (int(found.group(1)), int(found.group(2))) if found else (2, 15)


def env_flag(name):
    """`c10::utils::check_env`: True for 1, False for 0, None where unset (or anything else)."""
    value = os.environ.get(name)
    return {"1": True, "0": False}.get(value.strip() if value is not None else None)


def cublas_bytes(major, version):
    """The cuBLAS workspace of a GPU of compute capability `major` (`parseChosenWorkspaceSize`)."""
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    if config is not None:
        pairs = re.findall(r":([0-9]+):([0-9]+)", config)
        if pairs:
            return sum(int(size) * 1024 * int(count) for size, count in pairs)
    large = {9} if version < (2, 12) else {9, 10, 12} if version < (2, 15) else {9, 10, 11, 12}
    return 4096 * 8 * 1024 if major in large else 4096 * 1024 * 2 + 16 * 1024 * 8


def cublaslt_bytes():
    """The cuBLASLt workspace when it is not the cuBLAS one (`parseCUDABlasLtWorkspaceSize`)."""
    value = os.environ.get("CUBLASLT_WORKSPACE_SIZE")
    try:
        return max(0, int(value)) * 1024 if value is not None else 1024 * 1024
    except ValueError:
        return 1024 * 1024


class Rule:
    """The torch's rule, read once (as ATen reads its variables once)."""

    def __init__(self):
        version = torch_version()
        self.version = version
        self.cached = version < (2, 15) or env_flag("TORCH_CUBLAS_WORKSPACE_CACHE") is True
        unified = env_flag("TORCH_CUBLASLT_UNIFIED_WORKSPACE")
        if version < (2, 12):
            self.unified = unified is True
        else:
            self.unified = self.cached and unified is not False
        self.sets_up_for_lt = version < (2, 12)


RULE = None
HELD = set()   # (device, thread, kind) whose cached workspace exists


def blas_kind(func, args, kwargs):
    """"cublas", "lt" or None: which library `func` runs on fake CUDA tensors."""
    name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else ""
    if name in CUBLASLT_ONLY:
        return "lt"
    if name not in CUBLAS:
        return None
    if name == "_addmm_activation" or (name == "addmm" and bias_epilogue(args, kwargs)):
        return "lt"
    return "cublas"


def bias_epilogue(args, kwargs):
    """Whether `addmm(self, mat1, mat2)` is cuBLASLt's `gemm_and_bias`: a 1-D contiguous bias the
    width of the output, a float type, both matrices larger than one row and column, beta 1."""
    if len(args) < 3:
        return False
    bias, mat1, mat2 = args[0], args[1], args[2]
    if not all(isinstance(t, torch.Tensor) for t in (bias, mat1, mat2)) or kwargs.get("beta", 1) != 1:
        return False
    return (bias.dim() == 1 and mat2.dim() == 2 and mat1.dim() == 2 and bias.shape[0] == mat2.shape[1]
            and bias.is_contiguous() and mat1.dtype in LT_DTYPES
            and min(mat1.shape) > 1 and min(mat2.shape) > 1)


def charge(func, args, kwargs, outputs):
    """Charges the workspaces `func` (just run, its outputs tracked) allocates on its device."""
    global RULE
    kind = blas_kind(func, args, kwargs)
    if kind is None:
        return
    device = next((t.device.index or 0 for t in outputs
                   if isinstance(t, torch.Tensor) and t.device.type == "cuda"), None)
    if device is None or device >= len(GPUS):
        return
    if RULE is None:
        RULE = Rule()
    cublas = cublas_bytes(GPUS[device]["capability"][0], RULE.version)
    if not RULE.cached:
        size = cublaslt_bytes() if kind == "lt" else cublas
        if size:
            MEMORY.freed(device, MEMORY.allocate(device, size, workspace=True), size, workspace=True)
        return
    thread = "autograd" if RUN.in_backward else threading.get_ident()
    kinds = ["cublas"] if kind == "cublas" or RULE.sets_up_for_lt else []
    if kind == "lt" and not RULE.unified:
        kinds.append("lt")
    elif kind == "lt" and "cublas" not in kinds:
        kinds.append("cublas")   # unified: cuBLASLt's first use makes the (handle, stream) one
    for k in kinds:
        size = cublas if k == "cublas" else cublaslt_bytes()
        if (device, thread, k) not in HELD and size:
            MEMORY.allocate(device, size, workspace=True)
            HELD.add((device, thread, k))
