"""The reference tracer of the real runtime (issue 11): runs the real transformers (+ PEFT,
+ bitsandbytes) training step or inference prefill on the CPU under PyTorch's FakeTensorMode
(tensors without data, so full scale costs no memory) and records its memory with PyTorch's own
MemTracker (torch.distributed._tools.mem_tracker), which follows every storage from creation to
death, rounds each to the CUDA caching allocator's 512 bytes and sorts it into parameters,
buffers, gradients, activations, temporaries and optimizer states.

What runs, per configuration (CONFIGS below):
- the model is built from vramplan's built-in config (profiles/catalog/models), in the given
  dtype, with transformers' default attention (SDPA, or eager where the class does not support
  it: Gemma 2) and experts implementation;
- `full`: every parameter trains, `torch.optim.AdamW(fused=True)`, the HF Trainer's default
  optimizer with torch >= 2.8 (`TrainingArguments.optim = "adamw_torch_fused"`);
- `lora`: PEFT `get_peft_model` with `LoraConfig(r, target_modules)` (adapters in fp32, PEFT's
  `autocast_adapter_dtype=True`), the same optimizer over the adapters;
- `qlora`: every `nn.Linear` but the head replaced by a bitsandbytes `Linear4bit` (nf4, blocks
  of 64, double quantization, `compute_dtype` = the model dtype) holding packed weights, then
  PEFT's `prepare_model_for_kbit_training` (non-quantized parameters cast to fp32) and LoRA, as
  the HF Trainer / TRL path does;
- checkpointing: `gradient_checkpointing_enable(use_reentrant=False)`;
- training runs two steps (forward with labels, backward, optimizer step, `zero_grad`), so the
  second step sees the optimizer states; inference runs the prefill of a `generate` call
  (`use_cache=True`, a DynamicCache, `logits_to_keep=1`) under `torch.no_grad`.

Where CPU and CUDA kernels keep different tensors, the tracer runs the CPU kernel that keeps
what the CUDA one does: SDPA with attention dropout (CUDA's fused kernels apply it inside, the
CPU falls back to the math path) runs the CPU's fused kernel without dropout; dropout keeps a
boolean mask, as CUDA's kernel does (the CPU's keeps one in the input's dtype).
The causal-mask decision of transformers reads position values, which fake tensors do not
have: the tracer lets it decide as a real run without padding does (no mask, `is_causal`).

Recorded per configuration: the peak of live bytes, the bytes by kind at that moment, the phase
and the innermost module and op running then, and the bytes held once the step is over.

CPU kernels are not CUDA kernels; where they allocate differently, the comparison in
`sim/tests/tracer.rs` says so (it never copies these figures into the model).

Usage (from the repository root, with the venv `scripts/reference/run` builds):
    scripts/reference/run trace                      # all configurations -> fixtures/reference/trace/v5.json
    scripts/reference/.venv5/bin/python scripts/reference/trace.py --only llama-3.2-1b
"""

import argparse
import contextlib
import json
import sys

import common
import default_configs
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# transformers materialises the causal mask (and with it repeats K and V for grouped-query
# attention, `use_gqa_in_sdpa`) when it cannot read a position tensor's values, which is what
# `is_tracing` reports for a fake tensor. A real run reads them and passes `is_causal` with no
# mask instead (`_ignore_causal_mask_sdpa`); so does the tracer.
import transformers.masking_utils  # noqa: E402

transformers.masking_utils.is_tracing = lambda tensor=None: False
# The same reading of position values looks for packed sequences; a batch without them has none.
transformers.masking_utils.find_packed_sequence_indices = lambda position_ids: None

# CUDA's flash and memory-efficient SDPA kernels apply attention dropout inside the kernel and
# keep only its random state for backward; the CPU has no such kernel and falls back to the
# math path, which keeps the full fp32 attention matrix. The tracer runs the CPU's fused kernel
# without dropout instead, which keeps what the CUDA kernels keep.
_sdpa = torch.nn.functional.scaled_dot_product_attention


def _sdpa_as_cuda(*args, dropout_p=0.0, **kwargs):
    return _sdpa(*args, dropout_p=0.0, **kwargs)


torch.nn.functional.scaled_dot_product_attention = _sdpa_as_cuda


# CUDA's dropout kernel (`native_dropout`) keeps a 1-byte boolean mask; the CPU's keeps a mask
# in the input's dtype. The tracer's dropout keeps a boolean mask, as CUDA's does, and makes one
# output tensor, as CUDA's fused kernel does.
class _DropoutAsCuda(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        mask = torch.empty_like(x, dtype=torch.bool).bernoulli_(1.0 - p)
        ctx.save_for_backward(mask)
        ctx.scale = 1.0 / (1.0 - p)
        # One output, as CUDA's kernel writes it: `x * mask * scale` would hold a temporary of
        # the input's size beside it.
        return (x * mask).mul_(ctx.scale)

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return (grad * mask).mul_(ctx.scale), None


_dropout = torch.nn.functional.dropout


def _dropout_as_cuda(input, p=0.5, training=True, inplace=False):
    if not training or p == 0.0:
        return input
    return _DropoutAsCuda.apply(input, p)


torch.nn.functional.dropout = _dropout_as_cuda

# Families: Llama, Qwen2, Gemma 2, Phi, GPT-2, GPT-NeoX and an MoE (OLMoE).
FAMILIES = [
    ("llama-3.2-1b", ["q_proj", "v_proj"]),
    ("qwen2.5-0.5b", ["q_proj", "k_proj", "v_proj", "o_proj"]),
    ("gemma-2-2b", ["q_proj", "v_proj"]),
    ("phi-2", ["q_proj", "v_proj"]),
    ("gpt2", ["c_attn"]),
    ("pythia-410m", ["query_key_value"]),
    ("olmoe-1b-7b", ["q_proj", "v_proj"]),
]


def configurations():
    """The matrix: per family, full / LoRA / QLoRA with checkpointing off and on over three
    batch x sequence shapes, and inference prefill at two shapes."""
    out = []
    for model, targets in FAMILIES:
        def cfg(mode, finetune, ckpt, batch, seq):
            c = {"model": model, "mode": mode, "finetune": finetune, "ckpt": ckpt,
                 "batch": batch, "seq": seq, "dtype": "bf16"}
            if finetune in ("lora", "qlora"):
                c["lora_rank"] = 16
                c["lora_targets"] = targets
            return c
        out += [
            cfg("train", "full", False, 1, 512),
            cfg("train", "full", True, 2, 1024),
            cfg("train", "lora", False, 1, 512),
            cfg("train", "lora", True, 4, 256),
            cfg("train", "lora", False, 2, 1024),
            cfg("train", "qlora", True, 1, 512),
            cfg("train", "qlora", False, 4, 256),
            cfg("inference", "none", False, 1, 512),
            cfg("inference", "none", False, 4, 1024),
        ]
    # Held out: traced after the memory model was set beside the rows above, and not used to
    # shape it. Other dtypes, ranks and targets (the MLP's last linear, all linears), eager
    # attention.
    for model, dtype, finetune, rank, targets, attn, ckpt, batch, seq in [
        ("llama-3.2-1b", "fp16", "lora", 64, "all-linear", None, False, 2, 512),
        ("llama-3.2-1b", "bf16", "lora", 8, ["down_proj", "o_proj"], "eager", False, 1, 1024),
        ("qwen2.5-0.5b", "fp32", "full", None, None, None, True, 2, 512),
        ("qwen2.5-0.5b", "bf16", "qlora", 32, "all-linear", None, True, 2, 1024),
        ("pythia-410m", "fp16", "lora", 32, "all-linear", None, False, 4, 512),
        ("pythia-410m", "bf16", "full", None, None, "eager", False, 2, 512),
        ("phi-2", "bf16", "lora", 8, ["dense", "fc2"], None, True, 2, 512),
        ("gpt2", "fp32", "full", None, None, None, False, 8, 512),
        ("olmoe-1b-7b", "bf16", "lora", 8, ["q_proj", "k_proj", "v_proj", "o_proj"], None, True, 2, 512),
        ("gemma-2-2b", "bf16", "qlora", 16, "all-linear", None, False, 1, 1024),
        ("llama-3.2-1b", "fp16", "none", None, None, None, False, 8, 512),
        ("qwen2.5-0.5b", "bf16", "none", None, None, "eager", False, 2, 2048),
    ]:
        out.append(_held_out(model, dtype, finetune, rank, targets, attn, ckpt, batch, seq))
    # A second held-out set, traced after the first had exposed eager attention's fp32 softmax
    # (which was then modelled): new families (OPT, BLOOM, Qwen3, TinyLlama) and shapes.
    for model, dtype, finetune, rank, targets, attn, ckpt, batch, seq in [
        ("opt-1.3b", "bf16", "lora", 16, ["q_proj", "v_proj"], None, False, 1, 1024),
        ("bloom-560m", "bf16", "full", None, None, None, False, 1, 512),
        ("qwen3-0.6b", "bf16", "lora", 16, "all-linear", None, False, 2, 512),
        ("tinyllama-1.1b", "bf16", "qlora", 16, "all-linear", None, True, 2, 512),
        ("pythia-410m", "fp16", "lora", 16, ["query_key_value"], "eager", False, 2, 512),
        ("phi-2", "bf16", "full", None, None, "eager", False, 1, 512),
        ("llama-3.2-1b", "bf16", "none", None, None, "eager", False, 2, 1024),
        ("qwen3-0.6b", "bf16", "none", None, None, None, False, 4, 512),
        ("opt-1.3b", "fp16", "none", None, None, None, False, 2, 1024),
        ("bloom-560m", "bf16", "none", None, None, None, False, 2, 512),
    ]:
        out.append({**_held_out(model, dtype, finetune, rank, targets, attn, ckpt, batch, seq), "set": 2})
    # A third set, traced after prefill's working set was modelled from what transformers'
    # layers name at their widest op (seen on the first sets' families): families no earlier
    # row had (Falcon's parallel block with multi-query attention, Phi-1.5, Gemma's GeGLU,
    # Mistral, StarCoder's GPTBigCode, Qwen1.5-MoE's shared experts), other dtypes and shapes,
    # and checkpointed training, whose forward holds the same working set.
    for model, dtype, finetune, rank, targets, attn, ckpt, batch, seq in [
        ("falcon-7b", "bf16", "none", None, None, None, False, 2, 1024),
        ("phi-1.5", "fp16", "none", None, None, None, False, 4, 1024),
        ("gemma-2b", "bf16", "none", None, None, None, False, 2, 2048),
        ("mistral-7b", "bf16", "none", None, None, None, False, 1, 4096),
        ("starcoder", "bf16", "none", None, None, None, False, 1, 2048),
        ("qwen1.5-moe-a2.7b", "bf16", "none", None, None, None, False, 2, 1024),
        ("qwen2.5-1.5b", "fp32", "none", None, None, None, False, 2, 1024),
        ("pythia-1b", "bf16", "none", None, None, "eager", False, 2, 1024),
        ("llama-3.2-1b", "bf16", "full", None, None, None, True, 2, 2048),
        ("qwen3-1.7b", "bf16", "lora", 16, "all-linear", None, True, 4, 1024),
    ]:
        out.append({**_held_out(model, dtype, finetune, rank, targets, attn, ckpt, batch, seq), "set": 3})
    # XLNet with its task head, as the project's first incident fine-tuned it: xlnet-base-cased's
    # config as `XLNetForQuestionAnswering`, SQuAD features of 384 tokens, the HF Trainer with
    # `fp16=True` (fp32 weights, `torch.autocast("cuda", float16)` around the forward), batch 8,
    # the batch an earlier vramplan said fits a 16 GB T4 (33) and the largest it says fits now
    # (`whatif max-batch --hardware t4`: 34 in training, 307 in evaluation); training and the
    # evaluation forward (beam heads, `use_mems_eval`).
    for mode, batch in [("train", 8), ("train", 16), ("train", 33), ("train", 34), ("inference", 8),
                        ("inference", 64), ("inference", 307)]:
        out.append({"model": "xlnet-base-cased", "cls": "XLNetForQuestionAnswering", "mode": mode,
                    "finetune": "full" if mode == "train" else "none", "ckpt": False, "batch": batch,
                    "seq": 384, "dtype": "fp32", "autocast": "fp16", "task": "question_answering"})
    # Today's text decoders (issue 29): per family its smallest built-in, one LoRA training step
    # and one prefill, short enough to trace in a minute; sequences past Gemma 3's 512-token
    # window, so its sliding layers mask.
    for model, finetune, targets, batch, seq in TODAY_FAMILIES + DEFAULT_CONFIG_FAMILIES:
        c = {"model": model, "mode": "inference" if finetune == "none" else "train", "finetune": finetune,
             "ckpt": False, "batch": batch, "seq": seq, "dtype": "bf16"}
        if finetune == "lora":
            c["lora_rank"], c["lora_targets"] = 16, targets
        if model in default_configs.CONFIGS:
            c["config"] = default_configs.CONFIGS[model]
        out.append(c)
    return out


# (model, finetune, LoRA targets, batch, sequence) of today's text decoders.
TODAY_FAMILIES = [
    ("gemma-3-1b-it", "lora", ["q_proj", "v_proj"], 1, 1024),
    ("gemma-3-1b-it", "none", None, 2, 1024),
    ("granite-3.3-8b-instruct", "lora", ["q_proj", "v_proj"], 1, 512),
    ("granite-3.3-8b-instruct", "none", None, 1, 1024),
    ("smollm3-3b", "lora", ["q_proj", "v_proj"], 1, 512),
    ("smollm3-3b", "none", None, 1, 1024),
    # Falcon-H1: attention and a Mamba-2 mixer side by side in every layer; the mixer runs
    # transformers' torch path (no mamba_ssm / causal_conv1d kernels), chunks of 128 tokens.
    ("falcon-h1-0.5b-instruct", "lora", ["q_proj", "v_proj"], 1, 1024),
    ("falcon-h1-0.5b-instruct", "none", None, 2, 1024),
    # Traced after the mixer's model was set beside the two rows above: a full fine-tune and a
    # prefill whose lengths are not multiples of the chunk (padded chunks).
    ("falcon-h1-0.5b-instruct", "full", None, 2, 500),
    ("falcon-h1-0.5b-instruct", "none", None, 1, 3000),
    # Llama 4 Scout's text model at full size (FakeTensorMode holds no data): every layer a
    # mixture of 16 experts with a shared expert, which transformers' `Llama4TextMoe` runs on
    # every token (the router's scores weight each expert's copy of the input).
    ("llama-4-scout-text", "lora", ["q_proj", "v_proj"], 1, 512),
    ("llama-4-scout-text", "none", None, 1, 1024),
    # Traced after the experts' model was set beside the two rows above: a longer LoRA step, and
    # a prefill past the 8192-token chunk (the chunked layers mask by chunk and cache one chunk),
    # which then showed act(gate) live beside the experts' product (modelled after it).
    ("llama-4-scout-text", "lora", ["q_proj", "v_proj"], 2, 1024),
    ("llama-4-scout-text", "none", None, 1, 9000),
]

# Classes without a built-in (no published config.json found to embed), traced from transformers'
# own default config of the class (`Glm4Config()`: GLM-4-9B's shapes; `Cohere2Config()`: Command R
# 35B's), under the test-only names of scripts/reference/default_configs.py; each record carries
# the config it was built from (`config`).
DEFAULT_CONFIG_FAMILIES = [
    ("glm4-default-config", "lora", ["q_proj", "v_proj"], 1, 512),
    ("glm4-default-config", "none", None, 1, 1024),
    ("cohere2-default-config", "lora", ["q_proj", "v_proj"], 1, 512),
    ("cohere2-default-config", "none", None, 1, 1024),
    # Traced after the four rows above were compared: a longer GLM-4 LoRA step, and a Cohere 2
    # prefill past its 4096-token window (the sliding layers mask and cache one window).
    ("glm4-default-config", "lora", ["q_proj", "v_proj"], 2, 1024),
    ("cohere2-default-config", "none", None, 1, 5000),
]


def _held_out(model, dtype, finetune, rank, targets, attn, ckpt, batch, seq):
    """One held-out configuration."""
    c = {"model": model, "mode": "inference" if finetune == "none" else "train", "finetune": finetune,
         "ckpt": ckpt, "batch": batch, "seq": seq, "dtype": dtype, "held_out": True}
    if rank:
        c["lora_rank"] = rank
        c["lora_targets"] = targets
    if attn:
        c["attn"] = attn
    return c


def _linear4bit_like(linear, compute_dtype):
    """A bitsandbytes Linear4bit in place of `linear`, its weight packed as bitsandbytes stores
    it: uint8 [(out*in+1)//2, 1], absmax quantized to uint8 per 64-block with an fp32 absmax per
    256 blocks (double quantization). Built on the meta device (Params4bit cannot wrap a fake
    tensor), then given fake tensors."""
    import bitsandbytes as bnb
    from bitsandbytes.functional import QuantState

    out_f, in_f = linear.out_features, linear.in_features
    has_bias = linear.bias is not None
    with torch._subclasses.fake_tensor.unset_fake_temporarily():
        q = bnb.nn.Linear4bit(in_f, out_f, bias=False, compute_dtype=compute_dtype,
                              quant_type="nf4", device="meta")
    n = out_f * in_f
    blocks = (n + 63) // 64
    state2 = QuantState(absmax=torch.empty((blocks + 255) // 256, dtype=torch.float32),
                        code=torch.empty(256, dtype=torch.float32), blocksize=256,
                        quant_type="nf4", dtype=torch.float32)
    qs = QuantState(absmax=torch.empty(blocks, dtype=torch.uint8), shape=torch.Size([out_f, in_f]),
                    code=torch.empty(16, dtype=torch.float32), blocksize=64, quant_type="nf4",
                    dtype=compute_dtype, offset=torch.empty((), dtype=torch.float32), state2=state2)
    w = torch.nn.Parameter(torch.empty((n + 1) // 2, 1, dtype=torch.uint8), requires_grad=False)
    w.quant_state = qs
    w.bnb_quantized = True
    # What PEFT's `dispatch_bnb_4bit` reads off a Params4bit.
    w.compress_statistics, w.quant_type, w.quant_storage, w.blocksize = True, "nf4", torch.uint8, 64
    q._parameters["weight"] = w
    if has_bias:
        q._parameters["bias"] = torch.nn.Parameter(torch.empty(out_f, dtype=linear.bias.dtype))
    q.compute_type_is_set = True
    return q


def _quantize_linears(model, compute_dtype):
    """Every nn.Linear and GPT-2 Conv1D but the output head becomes a 4-bit Linear4bit, as
    transformers' `replace_with_bnb_linear` does (`llm_int8_skip_modules` defaults to the output
    embeddings; a Conv1D's [in, out] weight is quantized as the [out, in] linear it is)."""
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings()
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if child is head:
                continue
            if isinstance(child, torch.nn.Linear):
                setattr(module, child_name, _linear4bit_like(child, compute_dtype))
            elif isinstance(child, Conv1D):
                in_f, out_f = child.weight.shape
                linear = torch.nn.Linear(in_f, out_f, bias=child.bias is not None, device="meta")
                linear.bias = child.bias
                setattr(module, child_name, _linear4bit_like(linear, compute_dtype))


@contextlib.contextmanager
def device_moves_skipped():
    """PEFT moves new modules to the base layer's device with `.to(device)`, which swaps tensors
    and fails on fake parameters; everything is on one device already, so device-only moves are
    skipped (dtype changes still run) while this is entered."""
    from peft.tuners import tuners_utils

    tuners_utils.BaseTunerLayer._move_adapter_to_device_of_base_layer = lambda self, *a, **k: None
    original_to = torch.nn.Module.to

    def to(self, *args, **kwargs):
        if not kwargs and len(args) == 1 and isinstance(args[0], (torch.device, str)):
            return self
        return original_to(self, *args, **kwargs)

    torch.nn.Module.to = to
    try:
        yield
    finally:
        torch.nn.Module.to = original_to


def _peft(model, config):
    import peft

    lora = peft.LoraConfig(r=config["lora_rank"], lora_alpha=2 * config["lora_rank"],
                           target_modules=config["lora_targets"], lora_dropout=0.0,
                           task_type="CAUSAL_LM")
    with device_moves_skipped():
        return peft.get_peft_model(model, lora)


class PeakTracker(MemTracker):
    """MemTracker that also notes what ran when the peak was reached."""

    def __init__(self):
        super().__init__()
        self.peak_total = 0
        self.peak_where = {}

    def __enter__(self):
        # MemTracker hooks every parameter's gradient; frozen ones (LoRA's base) take no hook.
        class _NoHook:
            def remove(self):
                pass

        def guard(original):
            def hook(tensor, fn):
                return original(tensor, fn) if tensor.requires_grad else _NoHook()
            return hook

        self._hooks = (torch.Tensor.register_hook, torch.Tensor.register_post_accumulate_grad_hook)
        torch.Tensor.register_hook = guard(self._hooks[0])
        torch.Tensor.register_post_accumulate_grad_hook = guard(self._hooks[1])
        return super().__enter__()

    def __exit__(self, *args):
        try:
            return super().__exit__(*args)
        finally:
            torch.Tensor.register_hook, torch.Tensor.register_post_accumulate_grad_hook = self._hooks

    def _update_peak_stats(self, peak_state):
        # Only the step's peak: MemTracker's per-module peaks walk every tracked module after
        # every op, which makes a PEFT model with hundreds of modules take minutes.
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap["Total"]:
                self._peak_mem[dev] = snap["Total"]
                self._peak_mem_snap[dev] = dict(snap)

    def _where(self, func):
        parents = [p for p in self._mod_tracker.parents if p != "Global"]
        phase = "optimizer" if self._in_opt else ("backward" if self._mod_tracker.is_bw else "forward")
        return {"phase": phase, "module": parents[-1] if parents else "", "op": str(func)}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        res = super().__torch_dispatch__(func, types, args, kwargs)
        total = sum(s.get("Total", 0) for s in self._curr_mem_snap.values())
        if total > self.peak_total:
            self.peak_total = total
            self.peak_where = self._where(func)
        return res


def _by_kind(snapshot):
    out = {}
    for stats in snapshot.values():
        for kind, value in stats.items():
            label = kind if isinstance(kind, str) else kind.value
            out[label] = out.get(label, 0) + int(value)
    return out


_FAKE_CUDA = []


def _fake_cuda():
    """Fake CUDA tensors with no GPU, so that `torch.autocast("cuda")` runs CUDA's own autocast
    rules (which cast `layer_norm` and `softmax` to fp32, unlike the CPU's) and its cache of the
    fp16 copies of fp32 weights: `torch.cuda` answers as available without touching a driver,
    and the fake mode never initialises a device (as the script validator's harness does)."""
    if _FAKE_CUDA:
        return
    torch.cuda.is_available = lambda: True
    torch.cuda._lazy_init = lambda: None
    torch._C._ensureCUDADeviceGuardSet()
    torch._C._set_only_lift_cpu_tensors(True)
    FakeTensorMode.avoid_device_init = property(lambda self: True)
    _FAKE_CUDA.append(True)


def _engine_free_backward():
    """`loss.backward()` for fake CUDA tensors: PyTorch's autograd engine asks the CUDA runtime for
    each device's context, which a machine without a GPU lacks, so the graph is run node by node
    in the engine's order by the script validator's walker (validate/harness/script_backward.py,
    checked there against the engine), saved tensors released as each node runs. Its harness
    state is stood in for by the few fields the walker reads. Returns the saved-tensor hooks to
    run the forward under and the backward."""
    import types

    harness = str(common.REPO / "validate" / "harness")
    if harness not in sys.path:
        sys.path.insert(0, harness)

    class Run:
        in_backward, graph_tasks, graph_task, mismatch = False, 0, -1, None

        def enter_phase(self, phase):
            pass

        def note(self, text):
            pass

    sys.modules.setdefault("script_state", types.SimpleNamespace(
        RUN=Run(), MODULES=types.SimpleNamespace(current=lambda: ""), user_frame=lambda: None))
    import script_backward

    def backward(loss):
        script_backward.backward_graph([loss], [torch.ones_like(loss)])

    return torch.autograd.graph.saved_tensors_hooks(script_backward.pack, script_backward.unpack), backward


def _to_fake_cuda(model):
    """`model.to("cuda")` for a fake model: the parameters and buffers made on the CPU in spite of
    the default device (`torch.FloatTensor`, XLNet's raw projections) become fake CUDA tensors,
    each tied group one object as before."""
    made = {}
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, value in list(table.items()):
                if value is None or value.device.type == "cuda":
                    continue
                if id(value) not in made:
                    moved = torch.empty_like(value, device="cuda")
                    if isinstance(value, torch.nn.Parameter):
                        moved = torch.nn.Parameter(moved, requires_grad=value.requires_grad)
                    made[id(value)] = moved
                table[name] = made[id(value)]


def _inputs(config, vocab, device):
    """The batch the configuration feeds: token ids (the labels too for a causal LM); for
    question answering the Trainer's SQuAD features (attention mask, token types, start and end
    positions)."""
    batch, seq = config["batch"], config["seq"]
    ids = torch.randint(0, vocab, (batch, seq), device=device)
    if config.get("task") != "question_answering":
        return {"input_ids": ids, "labels": ids} if config["mode"] == "train" else {"input_ids": ids}
    out = {"input_ids": ids, "attention_mask": torch.ones(batch, seq, dtype=torch.long, device=device),
           "token_type_ids": torch.zeros(batch, seq, dtype=torch.long, device=device)}
    if config["mode"] == "train":
        out["start_positions"] = torch.randint(0, seq, (batch,), device=device)
        out["end_positions"] = torch.randint(0, seq, (batch,), device=device)
    return out


def trace(config):
    """Runs one configuration and returns what it recorded."""
    raw = config.get("config") or common.load_raw_config(config["model"])
    if config.get("cls"):
        raw = {**raw, "architectures": [config["cls"]]}
    autocast = DTYPES[config["autocast"]] if config.get("autocast") else None
    if autocast is not None:
        _fake_cuda()
    device = "cuda" if autocast is not None else "cpu"
    amp = (lambda: torch.autocast("cuda", dtype=autocast)) if autocast is not None else contextlib.nullcontext
    hf_config, _ = common.make_config(raw)
    hf_config.use_cache = config["mode"] == "inference"
    if config.get("attn"):
        hf_config._attn_implementation = config["attn"]
    cls = common.model_class(raw)
    dtype = DTYPES[config["dtype"]]
    train = config["mode"] == "train"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            with torch.device(device):
                model = cls(hf_config)
            if device == "cuda":
                _to_fake_cuda(model)
            if config["finetune"] == "qlora":
                import peft
                _quantize_linears(model, dtype)
                model.is_loaded_in_4bit = True
                model = peft.prepare_model_for_kbit_training(
                    model, use_gradient_checkpointing=config["ckpt"],
                    gradient_checkpointing_kwargs={"use_reentrant": False})
            elif config["ckpt"]:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            if config["finetune"] in ("lora", "qlora"):
                model = _peft(model, config)
            model.train(train)
            trainable = [p for p in model.parameters() if p.requires_grad]
            optimizer = torch.optim.AdamW(trainable, lr=1e-4, fused=True) if train else None
            tracker = PeakTracker()
            tracker.track_external(*[x for x in (model, optimizer) if x is not None])
            vocab = hf_config.get_text_config().vocab_size
            qa = config.get("task") == "question_answering"
            if device == "cuda":
                saved_hooks, backward = _engine_free_backward()
            else:
                saved_hooks, backward = contextlib.nullcontext(), lambda loss: loss.backward()
            with tracker:
                if train:
                    for step in range(2):
                        with amp(), saved_hooks:
                            loss = model(**_inputs(config, vocab, device)).loss
                        backward(loss)
                        del loss
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
                        if step == 0:
                            tracker.reset_mod_stats()
                else:
                    # A task head's evaluation is one forward; a causal LM's is generate()'s
                    # prefill.
                    kwargs = {} if qa else {"use_cache": True, "logits_to_keep": 1}
                    with torch.no_grad(), amp():
                        out = model(**_inputs(config, vocab, device), **kwargs)
                    del out
                steady = _by_kind(tracker.get_tracker_snapshot("current"))
            peak = _by_kind(tracker.get_tracker_snapshot("peak"))
            where = tracker.peak_where
    finally:
        torch.set_default_dtype(previous)
    return {"peak_bytes": peak["Total"], "peak_by_kind": peak, "peak_where": where,
            "end_bytes": steady["Total"]}


def _config_key(record):
    """What identifies a configuration in a record."""
    keys = ("model", "cls", "mode", "finetune", "ckpt", "batch", "seq", "dtype", "autocast", "lora_rank",
            "lora_targets", "attn", "set")
    return json.dumps({k: record[k] for k in keys if k in record}, sort_keys=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="trace only this built-in model's configurations")
    parser.add_argument("--print", action="store_true", help="print records, write nothing")
    parser.add_argument("--held-out", type=int, help="trace only the held-out configurations of this set (1, 2 or 3)")
    args = parser.parse_args()
    def selected(config):
        if args.only and config["model"] != args.only:
            return False
        return not args.held_out or (config.get("held_out") and config.get("set", 1) == args.held_out)

    records = []
    for config in configurations():
        if not selected(config):
            continue
        record = common.traced_record(config, trace, limit=3)
        records.append(record)
    if args.print:
        return
    out = common.FIXTURES / "trace" / f"{common.TAG}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    if (args.only or args.held_out) and out.exists():
        # Re-tracing one model or one set replaces its records and keeps the others, in matrix
        # order.
        kept = [r for r in json.loads(out.read_text())["records"] if not selected(r)]
        order = [_config_key(c) for c in configurations()]
        records = sorted(kept + records, key=lambda r: order.index(_config_key(r)))
    common.write_json(out, {"versions": common.versions(), "records": records}, compact_lists=["records"])
    print(f"wrote {out} ({len(records)} records)", file=sys.stderr)


if __name__ == "__main__":
    main()
