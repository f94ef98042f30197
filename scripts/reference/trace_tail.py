"""The reference tracer (trace.py) on three classes of issue 33 that run under the default trainer
(transformers 5.x): long prompts on Qwen3 (and Qwen2.5 beside them), full fine-tunes at large
batch, and AWQ / GPTQ checkpoints in inference. Writes
fixtures/reference/trace/transformers-tail-v5.json; `sim/tests/tracer_tail.rs` compares it with
the estimate.

Each configuration runs trace.py's `trace` (FakeTensorMode + MemTracker, the CPU kernels that keep
what CUDA's do: see trace.py's docstring) unchanged, except the AWQ / GPTQ rows, whose kernels need
CUDA and so are emulated here (`QuantLinearLike`):

- the module holds what transformers 5.24 builds for the checkpoint (`integrations/awq.py`
  `replace_with_awq_linear`, gptqmodel's `QuantLinear` layouts): AWQ `qweight` int32
  `[in, out/8]`, `qzeros` int32 `[in/g, out/8]`, `scales` fp16 `[in/g, out]`; GPTQ `qweight`
  int32 `[in/8, out]`, `qzeros` int32 `[in/g, out/8]`, `scales` fp16 `[in/g, out]`, `g_idx`
  int32 `[in]`; every `nn.Linear` but `lm_head`;
- its forward does what the dequantizing kernels do on a GPU: above 1,024 tokens
  (gptqmodel `gemm_awq.py` `FULL_DEQUANT_MATMUL_THRESHOLD = x.shape[0] * x.shape[1] > 1024`, the
  same test as AutoAWQ's `WQLinear_GEMM`) the whole weight is dequantized to an fp16 `[in, out]`
  temporary and multiplied; at or below it the fused GEMM writes only the output. The emulation
  allocates those tensors (empty: FakeTensorMode holds no data), so the tracer sees the same
  storages live at the same moments. Whether the chosen CUDA kernel is this one (AWQ GEMM) or
  Marlin (no whole-weight temporary) is a fact of the GPU and the installed kernels, not of the
  trace: the fixture says which it emulates.

Usage: scripts/reference/.venv5/bin/python scripts/reference/trace_tail.py [--print] [--only CLASS]
"""

import argparse
import json
import sys

import common
import torch
import trace as tracer

# (model, batch, prompt) of long prompts: Qwen3 (q/k RMSNorms on per-head states, SDPA with
# grouped K/V) and Qwen2.5 (no q/k norms) at the same lengths, prefill of generate().
LONG_PROMPTS = [
    ("qwen3-0.6b", 1, 16384),
    ("qwen3-0.6b", 1, 32768),
    ("qwen3-0.6b", 2, 16384),
    ("qwen3-1.7b", 1, 32768),
    ("qwen3-4b", 1, 30720),
    ("qwen3-8b", 1, 32768),
    ("qwen3-1.7b", 2, 14336),
    ("qwen2.5-1.5b", 1, 32768),
    ("qwen2.5-7b", 1, 30720),
]

# (model, batch, sequence, checkpointing, dtype) of full fine-tunes at large batch (the logits
# and the loss dominate: `ForCausalLMLoss` upcasts them to fp32).
FULL_FT = [
    ("qwen2.5-0.5b", 32, 512, False, "bf16"),
    ("qwen2.5-0.5b", 64, 512, True, "bf16"),
    ("llama-3.2-1b", 32, 512, True, "bf16"),
    ("qwen3-0.6b", 32, 512, True, "bf16"),
    ("gpt2", 32, 512, False, "bf16"),
    ("gpt2", 64, 512, False, "fp32"),
]

# (model, batch, sequence, autocast dtype) of full fine-tunes under the HF Trainer's mixed
# precision (`fp16=True` / `bf16=True`: fp32 weights, the forward under `torch.autocast`).
FULL_FT_AUTOCAST = [
    ("gpt2", 8, 512, "fp16"),
    ("gpt2", 32, 512, "fp16"),
    ("qwen2.5-0.5b", 16, 512, "bf16"),
    ("llama-3.2-1b", 8, 512, "bf16"),
]

# (model, method, batch, prompt) of pre-quantized checkpoints in prefill (fp16, as the AWQ and
# GPTQ quantizers load them).
QUANTIZED = [
    ("qwen2.5-1.5b", "awq", 1, 6144),
    ("qwen2.5-7b", "awq", 1, 14336),
    ("qwen2.5-7b", "awq", 8, 2048),
    ("qwen3-8b", "awq", 4, 4096),
    ("qwen2.5-7b", "gptq", 1, 14336),
    ("qwen3-4b", "gptq", 2, 8192),
    ("qwen2.5-3b", "awq", 1, 512),
]


# Under autocast the tracer runs fake CUDA tensors (trace.py `_fake_cuda`), and there SDPA's
# dispatcher refuses the fused kernels (they ask the device, which a machine without a GPU does not
# have) and takes the math fallback, which materialises the scores: what CUDA does only where flash
# and memory-efficient refuse. A CUDA GPU runs a half-precision SDPA without a mask on the flash
# kernel, grouped K/V heads included (`enable_gqa`: "works with FlashAttention, cuDNN attention, and
# the math kernel on CUDA tensors", torch 2.15's docstring), which keeps q,
# k, v, its output and the log-sum-exp; so does the tracer here, by calling that kernel's op (whose
# fake implementation and autograd formula are the real ones). Dropout is applied inside the CUDA
# kernel (trace.py's `_sdpa_as_cuda` drops it; the kernel's random state is a few bytes).
_sdpa_cpu_or_math = torch.nn.functional.scaled_dot_product_attention


def _sdpa_flash_on_cuda(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                        enable_gqa=False):
    if query.device.type == "cuda" and torch.is_autocast_enabled("cuda"):
        # SDPA is on autocast's lower-precision list: its inputs are cast first (copies of the
        # fp32 rotated q and k), as the dispatcher's autocast kernel does before the CUDA choice.
        half = torch.get_autocast_dtype("cuda")
        query, key, value = (x.to(half) if x.is_floating_point() else x for x in (query, key, value))
    flash = (query.device.type == "cuda" and attn_mask is None and query.dtype in (torch.float16, torch.bfloat16)
             and (key.shape[-3] == query.shape[-3] or (enable_gqa and query.shape[-3] % key.shape[-3] == 0))
             and query.shape[-1] <= 256)
    if not flash:
        return _sdpa_cpu_or_math(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                 is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    return torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, 0.0, is_causal, scale=scale)[0]


torch.nn.functional.scaled_dot_product_attention = _sdpa_flash_on_cuda
# `torch.autocast("cuda", dtype=torch.bfloat16)` asks the device whether it supports bf16; the GPUs
# planned for (Ampere and later) do.
torch.cuda.is_bf16_supported = lambda including_emulation=True: True


def configurations():
    """Every configuration of the three classes, with its class (`tail`)."""
    out = []
    for model, batch, seq in LONG_PROMPTS:
        out.append({"model": model, "mode": "inference", "finetune": "none", "ckpt": False, "batch": batch,
                    "seq": seq, "dtype": "bf16", "tail": "qwen3-long-prompt"})
    # Qwen3-0.6B's shapes with a narrow MLP (a test-only config: its own `config` record), so that
    # the attention half, where `q_norm` upcasts the per-head q to fp32, is the layer's widest.
    narrow = {**common.load_raw_config("qwen3-0.6b"), "intermediate_size": 1024}
    for batch, seq in [(1, 16384), (2, 8192)]:
        out.append({"model": "qwen3-0.6b-narrow-mlp", "config": narrow, "mode": "inference", "finetune": "none",
                    "ckpt": False, "batch": batch, "seq": seq, "dtype": "bf16", "tail": "qwen3-long-prompt"})
    for model, batch, seq, ckpt, dtype in FULL_FT:
        out.append({"model": model, "mode": "train", "finetune": "full", "ckpt": ckpt, "batch": batch,
                    "seq": seq, "dtype": dtype, "tail": "full-ft-large-batch"})
    for model, batch, seq, autocast in FULL_FT_AUTOCAST:
        out.append({"model": model, "mode": "train", "finetune": "full", "ckpt": False, "batch": batch,
                    "seq": seq, "dtype": "fp32", "autocast": autocast, "tail": "full-ft-large-batch"})
    for model, method, batch, seq in QUANTIZED:
        out.append({"model": model, "mode": "inference", "finetune": "none", "ckpt": False, "batch": batch,
                    "seq": seq, "dtype": "fp16", "quant": method, "group_size": 128, "tail": "awq-gptq",
                    "kernel": "dequantize the whole weight above 1024 tokens (AWQ GEMM)"})
    return out


class QuantLinearLike(torch.nn.Module):
    """An AWQ or GPTQ linear as transformers 5.24 (gptqmodel) holds it, computing as the
    dequantizing GEMM kernel allocates (module docstring)."""

    def __init__(self, linear, method, group_size):
        super().__init__()
        inp, out = linear.in_features, linear.out_features
        groups = -(-inp // group_size)
        self.in_features, self.out_features = inp, out
        if method == "awq":
            self.register_buffer("qweight", torch.empty(inp, out // 8, dtype=torch.int32))
        else:
            self.register_buffer("qweight", torch.empty(inp // 8, out, dtype=torch.int32))
            self.register_buffer("g_idx", torch.empty(inp, dtype=torch.int32))
        self.register_buffer("qzeros", torch.empty(groups, out // 8, dtype=torch.int32))
        self.register_buffer("scales", torch.empty(groups, out, dtype=torch.float16))
        self.bias = None if linear.bias is None else torch.nn.Parameter(
            torch.empty(out, dtype=torch.float16), requires_grad=False)

    def forward(self, x):
        tokens = x.numel() // x.shape[-1]
        if tokens > 1024:
            weight = torch.empty(self.in_features, self.out_features, dtype=torch.float16, device=x.device)
            y = torch.matmul(x, weight)
            del weight
        else:
            y = torch.empty(*x.shape[:-1], self.out_features, dtype=x.dtype, device=x.device)
        return y + self.bias if self.bias is not None else y


def _quantize(model, method, group_size):
    """Every nn.Linear but the output head becomes a QuantLinearLike (transformers'
    `get_modules_to_not_convert` keeps the output embeddings)."""
    head = model.get_output_embeddings()
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if child is not head and isinstance(child, torch.nn.Linear):
                setattr(module, name, QuantLinearLike(child, method, group_size))


def trace(config):
    """trace.py's trace, with the model's linears quantized where the configuration asks."""
    if "quant" not in config:
        return tracer.trace(config)
    original = tracer.common.model_class

    def quantized_class(raw):
        cls = original(raw)

        class Quantized(cls):
            def __init__(self, hf_config):
                super().__init__(hf_config)
                _quantize(self, config["quant"], config["group_size"])

        Quantized.__name__ = cls.__name__
        return Quantized

    tracer.common.model_class = quantized_class
    try:
        return tracer.trace(config)
    finally:
        tracer.common.model_class = original


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print records, write nothing")
    parser.add_argument("--only", help="trace only this class (qwen3-long-prompt, full-ft-large-batch, awq-gptq)")
    args = parser.parse_args()
    records = []
    for config in configurations():
        if args.only and config["tail"] != args.only:
            continue
        record = common.traced_record(config, trace, limit=3)
        records.append(record)
    if args.print:
        return
    out = common.FIXTURES / "trace" / f"transformers-tail-{common.TAG}.json"
    if args.only and out.exists():
        kept = [r for r in json.loads(out.read_text())["records"] if r["tail"] != args.only]
        records = kept + records
    common.write_json(out, {"versions": common.versions(), "records": records}, compact_lists=["records"])
    print(f"wrote {out} ({len(records)} records)", file=sys.stderr)


if __name__ == "__main__":
    main()
