"""The reference tracer of Unsloth (issue 33): runs Unsloth's own training step (unsloth and
unsloth_zoo 2026.10.9 from PyPI: `FastLlamaModel`'s patched Llama, its LoRA kernels' autograd
functions, `use_gradient_checkpointing="unsloth"`, its fused linear cross-entropy) on fake CUDA
tensors under PyTorch's FakeTensorMode, with no GPU, and records its memory with the MemTracker
of trace.py.

What is Unsloth's and what stands in for a GPU (said in every record, `stand_ins`):
- Unsloth's Python runs as released: every allocation its kernels' wrappers, autograd functions,
  checkpoint function and loss make (`torch.empty`, buffers, saved tensors) is traced.
- Triton kernel launches (`kernel[grid](...)`) return without running: they only write into
  tensors the Python made before the launch. bitsandbytes' C dequantize/GEMV calls likewise.
- xformers is not installed (its wheels are CUDA builds): its `memory_efficient_attention`
  is stood in for by an autograd function that keeps what its CUDA kernel keeps (q, k, v, the
  output and an fp32 log-sum-exp per head and token) and makes dq, dk, dv in backward.
- CUDA streams, events, devices and `mem_get_info` answer as an idle 80 GiB Ampere GPU would.
- The autograd engine needs a CUDA context for CUDA tensors; the graph is run node by node by
  the script validator's walker, as trace.py does for fake CUDA (`_engine_free_backward`).
- The fused loss's custom op (`unsloth_zoo::fused_linear_ce_v2`) has a fake kernel that only
  makes its outputs; the tracer runs its real body (`_ce_impl`) with its registered backward.
  Fake tensors hold no values: the count of labelled rows `nonzero` would find is given (every
  token but each sequence's last), packed rows' lengths are put in Unsloth's per-batch caches
  (it reads them on the host), and each fake storage answers its own `data_ptr()`.
- Packed rows take xformers' block-diagonal route (`UNSLOTH_SDPA_PACKED_SEGMENTS=0`): on sm 8.0+
  with torch 2.12+ Unsloth would take torch's varlen attention or SDPA per segment, which fake
  tensors run as the math kernel.
- Each configuration runs in a process of its own (Unsloth keeps buffers in module globals).
  `peak_where` names the op at the peak; its phase reads `forward` inside the walker's backward.

Usage (from the repository root, with the venv `scripts/reference/run trace-unsloth` builds):
    scripts/reference/run trace-unsloth   # -> fixtures/reference/trace/unsloth-v5.json
"""

import os

os.environ.setdefault("UNSLOTH_ALLOW_CPU", "1")
os.environ.setdefault("UNSLOTH_SKIP_TORCHVISION_CHECK", "1")
os.environ.setdefault("UNSLOTH_COMPILE_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Unsloth writes its compiled-module cache under the working directory unless told where.
os.environ.setdefault("UNSLOTH_COMPILE_LOCATION", os.path.join(
    os.environ.get("TMPDIR", "/tmp"), "vramplan_unsloth_compiled_cache"))

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

TOTAL_MEMORY = 80 << 30


class _Props:
    """What `torch.cuda.get_device_properties` answers for the fake GPU (an 80 GiB A100)."""

    name = "NVIDIA A100-SXM4-80GB"
    major, minor = 8, 0
    total_memory = TOTAL_MEMORY
    multi_processor_count = 108
    gcnArchName = ""
    L2_cache_size = 40 << 20
    warp_size = 32


class _Stream:
    cuda_stream = 0
    device_index = 0
    device = torch.device("cuda", 0)

    def __init__(self, *a, **k):
        pass

    def wait_stream(self, *a, **k):
        pass

    def wait_event(self, *a, **k):
        pass

    def record_event(self, *a, **k):
        return _Event()

    def synchronize(self):
        pass

    def query(self):
        return True

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


class _Device:
    """`torch.cuda.device(i)`: a context that selects nothing, with the index it was given."""

    def __init__(self, device=None):
        self.idx = getattr(device, "index", device) or 0

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


class _Event(_Stream):
    def record(self, *a, **k):
        pass

    def wait(self, *a, **k):
        pass


def fake_gpu():
    """`torch.cuda` answers as an idle 80 GiB Ampere GPU without a driver."""
    c = torch.cuda
    c.is_available = lambda: True
    c._lazy_init = lambda: None
    c.is_initialized = lambda: True
    c.device_count = lambda: 1
    c.current_device = lambda: 0
    c.set_device = lambda *a, **k: None
    c.get_device_properties = lambda *a, **k: _Props()
    c.get_device_capability = lambda *a, **k: (8, 0)
    c.get_device_name = lambda *a, **k: _Props.name
    c.is_bf16_supported = lambda *a, **k: True
    c.mem_get_info = lambda *a, **k: (TOTAL_MEMORY, TOTAL_MEMORY)
    c.synchronize = lambda *a, **k: None
    c.Stream = _Stream
    c.Event = _Event
    c.current_stream = lambda *a, **k: _Stream()
    c.default_stream = lambda *a, **k: _Stream()
    c.stream = lambda *a, **k: contextlib.nullcontext()
    c.device = _Device
    torch._C._cuda_getCurrentRawStream = lambda *a, **k: 0
    c.empty_cache = lambda: None
    c.memory_allocated = lambda *a, **k: 0
    c.memory_reserved = lambda *a, **k: 0
    c.max_memory_allocated = lambda *a, **k: 0
    c.max_memory_reserved = lambda *a, **k: 0
    c.get_rng_state = lambda *a, **k: torch.empty(16, dtype=torch.uint8, device="cpu")
    c.set_rng_state = lambda *a, **k: None
    c.manual_seed = lambda *a, **k: None
    c.manual_seed_all = lambda *a, **k: None
    torch._C._cuda_getDeviceCount = lambda: 1
    c.is_current_stream_capturing = lambda: False
    sys.modules["torch.cuda.graphs"].is_current_stream_capturing = lambda: False


fake_gpu()

# Unsloth's import links CUDA libraries when bitsandbytes' CUDA binding is missing and the user
# is root (`ldconfig`, unsloth/_gpu_init.py): a driverless tracer must not touch the system.
_system = os.system
os.system = lambda command: 0 if "ldconfig" in str(command) else _system(command)


# xformers stand-in. Its wheels are CUDA builds of a pinned torch; its memory-efficient attention
# (the kernel Unsloth's Llama runs without flash-attn) keeps q, k, v, the output and an fp32
# log-sum-exp per head and token for backward, which makes dq, dk, dv (and an fp32 delta per head
# and token): that, and nothing of its numerics, is what stands in for it.
class _MemoryEfficientAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty_like(q)
        heads_first = q.shape[:-3] + q.shape[-2:-1] + q.shape[-3:-2]  # [B, (G,) H, M]
        lse = torch.empty(heads_first, dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        delta = torch.empty_like(lse)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        del delta
        return dq, dk, dv


def _memory_efficient_attention(query, key, value, attn_bias=None, p=0.0, scale=None, **kwargs):
    return _MemoryEfficientAttention.apply(query, key, value)


class _AttnBias:
    def __init__(self, *a, **k):
        self.args = a

    @classmethod
    def from_seqlens(cls, *a, **k):
        return cls(*a)

    def make_local_attention(self, *a, **k):
        return self

    def to(self, *a, **k):
        return self


def install_xformers_stand_in():
    import types
    import importlib.machinery

    names = ["xformers", "xformers._cpp_lib", "xformers.ops", "xformers.ops.fmha", "xformers.ops.fmha.attn_bias",
             "xformers.attn_bias"]
    mods = {}
    for name in names:
        m = types.ModuleType(name)
        m.__spec__ = importlib.machinery.ModuleSpec(name, None)
        m.__path__ = []
        mods[name] = m
    bias = mods["xformers.ops.fmha.attn_bias"]
    for cls in ("BlockDiagonalCausalMask", "LowerTriangularMask", "BlockDiagonalMask",
                "BlockDiagonalCausalLocalAttentionMask", "LowerTriangularMaskWithTensorBias"):
        setattr(bias, cls, type(cls, (_AttnBias,), {}))
    mods["xformers.attn_bias"] = bias
    fmha = mods["xformers.ops.fmha"]
    fmha.attn_bias = bias
    fmha.memory_efficient_attention = _memory_efficient_attention
    ops = mods["xformers.ops"]
    ops.fmha = fmha
    ops.memory_efficient_attention = _memory_efficient_attention
    root = mods["xformers"]
    root.__version__ = "0.0.33"
    root.ops = ops
    root.attn_bias = bias
    root._cpp_lib = mods["xformers._cpp_lib"]
    mods["xformers._cpp_lib"]._register_extensions = lambda: {}
    sys.modules.update(mods)


install_xformers_stand_in()


def stub_kernel_launches():
    """Triton launches return at once: Unsloth's kernels only write into tensors its Python made
    before the launch, which is what is traced."""
    import triton.runtime.jit as jit

    jit.JITFunction.run = lambda self, *a, **k: None
    try:
        import triton.runtime.autotuner as autotuner

        autotuner.Autotuner.run = lambda self, *a, **k: None
        autotuner.Heuristics.run = lambda self, *a, **k: None
    except Exception:  # noqa: BLE001
        pass


import common  # noqa: E402
import trace as transformers_tracer  # noqa: E402  (scripts/reference/trace.py: its fake-CUDA helpers)
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode  # noqa: E402

transformers_tracer._fake_cuda()


# Fake tensors answer 0 for `data_ptr()`, which Unsloth compares: `patch_model_and_tokenizer`
# ties the head to the embedding when their pointers are equal (TinyLlama's untied head would be
# tied), and its NF4 plan caches by the weight's pointer. Each fake storage answers its own address.
def _data_ptr(self):
    return self.untyped_storage()._cdata + self.storage_offset() * self.element_size()


FakeTensor.data_ptr = _data_ptr
import unsloth  # noqa: E402
import unsloth_zoo  # noqa: E402
from unsloth.models.llama import FastLlamaModel  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# (model, batch, seq, packed sequences per row or None). QLoRA nf4 with double quantization, rank
# 16 on every linear, `use_gradient_checkpointing="unsloth"`, bf16, AdamW; two steps.
CONFIGS = [
    ("llama-3.2-1b", 1, 2048, None),
    ("llama-3.2-1b", 2, 4096, None),
    ("llama-3.2-1b", 1, 8192, 4),
    ("tinyllama-1.1b", 4, 1024, None),
    ("llama-3.2-3b", 1, 8192, None),
    ("llama-3.2-1b", 1, 16384, 8),
]


class _FusedLinearCE(torch.autograd.Function):
    """`unsloth_zoo::fused_linear_ce_v2` with its real body: the op's fake kernel (which FakeTensorMode
    would run) only makes its outputs. Forward is `_ce_impl` (through `_ce_checked`); backward is the
    op's registered one (`_ce_setup` / `_ce_backward`): the stored gradients scaled out of place."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, divisor, scaling, *rest):
        from unsloth_zoo.fused_losses import fused_linear

        out = fused_linear._OPS["ce_impl"](hidden, weight, bias, targets, divisor, scaling, *rest)
        loss, grad_h, grad_w, grad_b = out
        ctx.need = rest[7:10]
        ctx.save_for_backward(grad_h, grad_w, grad_b, scaling)
        ctx.mark_non_differentiable(grad_h, grad_w, grad_b)
        return out

    @staticmethod
    def backward(ctx, grad_loss, *_):
        grad_h, grad_w, grad_b, scaling = ctx.saved_tensors
        s = grad_loss.to(torch.float64) / scaling.to(torch.float64)
        need_h, need_w, need_b = ctx.need
        scale = torch.ops.unsloth_zoo.fused_linear_scale_rows
        out_h = scale(grad_h, s, grad_h.dtype) if need_h else None
        out_w = scale(grad_w, s, grad_w.dtype) if need_w else None
        out_b = scale(grad_b, s, grad_b.dtype) if need_b else None
        return (out_h, out_w, out_b) + (None,) * 15


# Labelled rows of the batch being traced: fake tensors hold no values, so the count `nonzero`
# would find is given (every token but the last of each sequence, whose next-token label is
# ignore_index after the shift).
LABELLED = [0]


def _keep_index(targets, mask, vocab_size, ignore_index):
    n = LABELLED[0]
    return torch.arange(n, device=targets.device), n


def _install_loss():
    from unsloth_zoo.fused_losses import fused_linear

    setattr(torch.ops.unsloth_zoo, fused_linear._CE_OP, _FusedLinearCE.apply)
    fused_linear._keep_index = _keep_index


def _nested_backward():
    """`torch.autograd.backward` inside a backward (Unsloth's checkpoint function recomputes a
    layer and runs its backward) through the same walker."""
    transformers_tracer._engine_free_backward()  # puts the walker on sys.path with its state
    import script_backward

    def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None, **kwargs):
        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        if isinstance(grad_tensors, torch.Tensor):
            grad_tensors = [grad_tensors]
        grads = list(grad_tensors) if grad_tensors is not None else [torch.ones_like(t) for t in tensors]
        script_backward.backward_graph(tensors, grads)
        # The leaves this backward reached that are not parameters (the checkpoint's detached layer
        # inputs): Unsloth reads their `.grad` and drops them. The walker leaves the recomputed
        # graph, and with it these leaves and their gradients, referenced from C++; the engine frees
        # them, so their `.grad` is let go once Unsloth has read it (`_checkpoint_backward`).
        stack, seen = [t.grad_fn for t in tensors if t.grad_fn is not None], set()
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if type(node).__name__ == "AccumulateGrad":
                if not isinstance(node.variable, torch.nn.Parameter):
                    READ_LEAVES.append(node.variable)
                continue
            stack.extend(child for child, _ in node.next_functions)

    torch.autograd.backward = backward
    from unsloth_zoo import gradient_checkpointing

    function = gradient_checkpointing.UnslothCheckpointFunction
    original = function.backward

    def _checkpoint_backward(ctx, *args):
        out = original(ctx, *args)
        while READ_LEAVES:
            READ_LEAVES.pop().grad = None
        return out

    function.backward = staticmethod(_checkpoint_backward)


READ_LEAVES = []


class _Tokenizer:
    """What `patch_model_and_tokenizer` and `get_peft_model` read of a tokenizer."""

    pad_token, pad_token_id, eos_token, eos_token_id = "<pad>", 0, "</s>", 1
    padding_side, model_max_length = "right", 131072

    def __init__(self, vocab):
        self.vocab = vocab

    def __len__(self):
        return self.vocab


def _as_from_pretrained(model, tokenizer, max_seq_length):
    """What `FastLlamaModel.from_pretrained` sets on the model after loading it (llama.py)."""
    import functools
    from transformers.trainer import Trainer

    model, tokenizer = FastLlamaModel.post_patch(model, tokenizer, correct_dtype=model.config.dtype)
    for module in model.modules():
        module.max_seq_length = max_seq_length
    inner = model
    while hasattr(inner, "model"):
        inner._saved_temp_tokenizer = tokenizer
        inner = inner.model
    inner._saved_temp_tokenizer = tokenizer
    for layer in model.model.layers:
        layer.self_attn.rotary_emb = model.model.rotary_emb
    model.for_training = functools.partial(FastLlamaModel.for_training, model)
    model.for_inference = functools.partial(FastLlamaModel.for_inference, model)
    # from_pretrained rewrites the Trainer's loop (checked by `patch_peft_model`); no Trainer runs here.
    if Trainer._inner_training_loop.__name__ != "_fast_inner_training_loop":
        original = Trainer._inner_training_loop

        def _fast_inner_training_loop(*a, **k):
            return original(*a, **k)

        Trainer._inner_training_loop = _fast_inner_training_loop
    return model, tokenizer


class CudaPeakTracker(transformers_tracer.PeakTracker):
    """trace.py's tracker, the peak taken over the GPU's memory alone (the offloaded checkpoints'
    pinned host buffers are on the CPU)."""

    def _pre_fw_hook(self, module, inputs):
        # Unsloth's checkpoint function recomputes a layer inside the walker's backward, which
        # MemTracker's per-module statistics take for a second iteration; only totals are read.
        try:
            super()._pre_fw_hook(module, inputs)
        except NotImplementedError:
            pass

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        res = super(transformers_tracer.PeakTracker, self).__torch_dispatch__(func, types, args, kwargs)
        total = sum(s.get("Total", 0) for d, s in self._curr_mem_snap.items() if d.type == "cuda")
        if total > self.peak_total:
            self.peak_total = total
            self.peak_where = self._where(func)
            self.peak_snapshot = {str(k.value if hasattr(k, "value") else k): int(v)
                                  for d, s in self._curr_mem_snap.items() if d.type == "cuda" for k, v in s.items()}
        return res


def _batch(config, vocab):
    batch, seq, packed = config["batch"], config["seq"], config.get("packed")
    LABELLED[0] = batch * seq - batch * (packed or 1)
    ids = torch.randint(0, vocab, (batch, seq), device="cuda")
    inputs = {"input_ids": ids, "labels": ids}
    if packed:
        # A padding-free packed row as Unsloth's collator makes it: the sequences side by side,
        # positions restarting at each, their lengths in `packed_seq_lengths`.
        length = seq // packed
        inputs["position_ids"] = torch.arange(length, device="cuda").repeat(packed).unsqueeze(0).expand(batch, -1)
        lengths = torch.full((batch * packed,), length, dtype=torch.int32, device="cuda")
        inputs["packed_seq_lengths"] = lengths
        # Unsloth reads the lengths on the host once a batch (`get_packed_info_from_kwargs`:
        # `lengths.tolist()`), which fake tensors cannot answer: its per-batch caches are given the
        # device tensors it would build and the host tuple it would read.
        from unsloth.utils import packing

        cu_seqlens = torch.arange(0, batch * seq + 1, length, dtype=torch.int32, device="cuda")
        host = (length,) * (batch * packed)
        for key in (torch.device("cuda"), torch.device("cuda", 0)):
            packing._PACKED_INFO_CACHE[key] = {"seq_lengths": lengths, "result": (lengths, cu_seqlens, length),
                                               "inference": False}
        packing._PACKED_HOST_LENGTHS_CACHE[lengths.device] = (lengths, cu_seqlens, host)
    return inputs


def trace(config):
    raw = common.load_raw_config(config["model"])
    hf_config, _ = common.make_config(raw)
    hf_config.use_cache = False
    dtype = DTYPES[config["dtype"]]
    FastLlamaModel.pre_patch()
    from transformers import LlamaForCausalLM

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with transformers_tracer.device_moves_skipped(), FakeTensorMode(allow_non_fake_inputs=True):
            with torch.device("cuda"):
                model = LlamaForCausalLM(hf_config)
                transformers_tracer._quantize_linears(model, dtype)
            transformers_tracer._to_fake_cuda(model)
            model.is_loaded_in_4bit = True
            model, tokenizer = _as_from_pretrained(model, _Tokenizer(hf_config.vocab_size), config["seq"])
            with torch.device("cuda"):
                model = FastLlamaModel.get_peft_model(
                    model, r=config["lora_rank"], target_modules=ALL_LINEAR, lora_alpha=config["lora_rank"],
                    lora_dropout=0, bias="none", use_gradient_checkpointing="unsloth")
            model.train()
            trainable = [p for p in model.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(trainable, lr=1e-4, fused=True)
            tracker = CudaPeakTracker()
            tracker.track_external(model, optimizer)
            saved_hooks, backward = transformers_tracer._engine_free_backward()
            with tracker:
                for step in range(2):
                    # The walker frees a node's saved tensors once it has run only where its
                    # pack hook saved them: the checkpoint function's recompute in backward too.
                    with saved_hooks:
                        loss = model(**_batch(config, hf_config.vocab_size)).loss
                        backward(loss)
                    del loss
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    if step == 0:
                        tracker.reset_mod_stats()
                end = {k: v for k, v in transformers_tracer._by_kind(
                    {d: s for d, s in tracker.get_tracker_snapshot("current").items() if d.type == "cuda"}).items()}
    finally:
        torch.set_default_dtype(previous)
    return {"peak_bytes": tracker.peak_total, "peak_by_kind": tracker.peak_snapshot,
            "peak_where": tracker.peak_where, "end_bytes": end.get("Total", 0)}


STAND_INS = ("triton kernel launches return without running (they write into tensors made before); "
             "xformers' memory_efficient_attention stood in for by an autograd function keeping q, k, v, "
             "the output and an fp32 log-sum-exp, making dq, dk, dv in backward; CUDA streams, events and "
             "device queries answer as an idle 80 GiB A100; the autograd graph run node by node "
             "(validate/harness/script_backward.py); the fused loss op's real body run in place of its fake kernel")


def configurations():
    out = []
    for model, batch, seq, packed in CONFIGS:
        c = {"model": model, "mode": "train", "finetune": "qlora", "ckpt": "unsloth", "batch": batch, "seq": seq,
             "dtype": "bf16", "lora_rank": 16, "lora_targets": "all-linear", "optimizer": "adamw_torch_fused"}
        if packed:
            c["packed"] = packed
            c["attention"] = "xformers block-diagonal (UNSLOTH_SDPA_PACKED_SEGMENTS=0)"
        out.append(c)
    return out


def versions():
    import importlib.metadata as md

    v = common.versions()
    for name in ("unsloth", "unsloth_zoo", "trl", "triton"):
        try:
            v[name] = md.version(name)
        except Exception:  # noqa: BLE001
            pass
    v["xformers"] = "stand-in (not installed)"
    return v


def _run_one(n):
    """Configuration `n` in this process: Unsloth keeps buffers in module globals (the checkpoint
    function's GPU buffers, the kernels' scratch), made under the fake mode of the run that made
    them, so each configuration runs in a process of its own."""
    stub_kernel_launches()
    _install_loss()
    _nested_backward()
    config = configurations()[n]
    record = common.traced_record(config, trace, limit=6, echo=False)
    return record


def main():
    import subprocess

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print records, write nothing")
    parser.add_argument("--only", type=int, help="trace only configuration N (from 0), in this process")
    args = parser.parse_args()
    if args.only is not None:
        print("RECORD " + json.dumps(_run_one(args.only)), flush=True)
        return
    records = []
    for n, config in enumerate(configurations()):
        env = dict(os.environ)
        if config.get("packed"):
            # Packed rows on sm 8.0+ with torch 2.12+ take torch's varlen attention or SDPA per
            # segment, which fake CUDA tensors run as the math kernel (scores per pair); the
            # tracer takes xformers' block-diagonal route instead (Unsloth's on older GPUs and
            # torches, and with UNSLOTH_SDPA_PACKED_SEGMENTS=0), which its stand-in keeps as its
            # CUDA kernel does.
            env["UNSLOTH_SDPA_PACKED_SEGMENTS"] = "0"
        run = subprocess.run([sys.executable, __file__, "--only", str(n)], capture_output=True, text=True, env=env)
        lines = [line for line in run.stdout.splitlines() if line.startswith("RECORD ")]
        record = json.loads(lines[-1][7:]) if lines else {**config, "error": run.stderr.strip()[-300:]}
        print(json.dumps(record), file=sys.stderr, flush=True)
        records.append(record)
    if args.print:
        return
    out = common.FIXTURES / "trace" / "unsloth-v5.json"
    common.write_json(out, {"versions": versions(), "stand_ins": STAND_INS, "records": records},
                      compact_lists=["records"])
    print(f"wrote {out} ({len(records)} records)", file=sys.stderr)


if __name__ == "__main__":
    main()
