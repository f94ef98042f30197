"""The reference tracer of torchtune's LoRA / QLoRA recipe (issue 33): runs torchtune's own model
builders and the step of `recipes/lora_finetune_single_device.py` (torchtune from PyPI, pinned in
`scripts/reference/run`) on the CPU under PyTorch's FakeTensorMode, following every storage with
the tracer's `PeakTracker` (trace.py: PyTorch's MemTracker, each storage rounded to 512 bytes).

What runs, per configuration (CONFIGS below), as the recipe does it:
- the model: `torchtune.models.llama3_2.lora_llama3_2_1b` / `qlora_llama3_2_1b` (every linear
  but the tied output NF4 under QLoRA, torchao's `NF4Tensor`), built under
  `training.set_default_dtype(bf16)` (the recipe's `_setup_model`); adapters on q, v, output_proj
  and the MLP, rank 64, alpha 128, no dropout (the 1B_{lora,qlora}_single_device configs);
  `set_trainable_params` on the adapters; the building itself is traced apart (`init_peak_bytes`);
- activation checkpointing: `training.set_activation_checkpointing(model,
  auto_wrap_policy={TransformerSelfAttentionLayer})`, as the recipe calls it;
- the loss: `CEWithChunkedOutputLoss` (the configs' default since 0.3; `set_num_output_chunks`,
  the output projection run chunk by chunk) or `torch.nn.CrossEntropyLoss` on the model's fp32
  logits (`self.output(h).float()`), the recipe's `_loss_step` (labels shifted with an ignore
  column, `del logits` after the loss), `(loss * num_tokens).backward()`, `scale_grads`,
  `torch.optim.AdamW(model.parameters(), fused=True)` step, `zero_grad(set_to_none=True)`: two
  steps, so the second sees the optimizer states; no compile, no activation offload.

The step's peak is recorded with the bytes by kind and where it was reached; the init peak is
the largest live total while the model was built (torchao's quantization of each linear).

Usage: scripts/reference/run trace-torchtune  (writes fixtures/reference/trace/torchtune-v5.json)
"""

import argparse
import json
import sys
import time
import traceback

import common
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import trace as tracer  # the transformers tracer: PeakTracker, _by_kind, its CUDA-like kernels

CONFIGS = [
    # name, builder, activation checkpointing, loss, batch, seq
    ("qlora-chunked", "qlora", False, "chunked", 4, 512),
    ("qlora-chunked-ac", "qlora", True, "chunked", 4, 1024),
    ("lora-chunked", "lora", False, "chunked", 2, 1024),
    ("lora-chunked-ac", "lora", True, "chunked", 8, 512),
    ("qlora-ce", "qlora", False, "ce", 2, 512),
    ("lora-ce-ac", "lora", True, "ce", 4, 512),
]
RANK, ALPHA = 64, 128
ATTN_MODULES = ["q_proj", "v_proj", "output_proj"]


def _real_rope_scaling():
    """Llama 3.1's RoPE scaling branches on the frequencies' values (`apply_scaling`), which fake
    tensors do not have: it runs on real tensors (a buffer of head_dim / 2 values)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torchtune.models.llama3_1._position_embeddings import Llama3ScaledRoPE

    original = Llama3ScaledRoPE.apply_scaling
    if getattr(original, "_real", False):
        return

    def apply_scaling(self, freqs, *args, **kwargs):
        with unset_fake_temporarily():
            return original(self, torch.empty(freqs.shape, dtype=freqs.dtype).copy_(
                1.0 / (self.base ** (torch.arange(0, self.dim, 2)[: (self.dim // 2)].float() / self.dim))),
                *args, **kwargs)

    apply_scaling._real = True
    Llama3ScaledRoPE.apply_scaling = apply_scaling


def _assigning_nf4_linear():
    """`FrozenNF4Linear.__init__` swaps its bf16 weight for the NF4 one with
    `torch.utils.swap_tensors`, which refuses a tensor the tracer holds a weak reference to; the
    tracer's build assigns the NF4 parameter instead, which frees the bf16 weight at the same
    point (the end of `__init__`)."""
    from torchao.dtypes.nf4tensor import to_nf4
    from torchtune.modules.low_precision.nf4_linear import FrozenNF4Linear

    if getattr(FrozenNF4Linear.__init__, "_assigning", False):
        return

    def __init__(self, in_dim, out_dim, bias=False, device=None, dtype=None, **quantization_kwargs):
        torch.nn.Linear.__init__(self, in_dim, out_dim, bias=bias, device=device, dtype=dtype)
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        nf4_weight = to_nf4(self.weight, **quantization_kwargs)
        self.weight = torch.nn.Parameter(nf4_weight, requires_grad=False)

    __init__._assigning = True
    FrozenNF4Linear.__init__ = __init__


def _build(builder):
    from torchtune import training
    from torchtune.models.llama3_2 import lora_llama3_2_1b, qlora_llama3_2_1b

    fn = qlora_llama3_2_1b if builder == "qlora" else lora_llama3_2_1b
    with training.set_default_dtype(torch.bfloat16), torch.device("cpu"):
        return fn(lora_attn_modules=ATTN_MODULES, apply_lora_to_mlp=True, lora_rank=RANK,
                  lora_alpha=ALPHA, lora_dropout=0.0)


def trace(name, builder, ac, loss_kind, batch, seq):
    from torchtune import modules, training
    from torchtune.modules.loss import CEWithChunkedOutputLoss
    from torchtune.modules.peft import get_adapter_params, set_trainable_params

    _real_rope_scaling()
    _assigning_nf4_linear()
    with FakeTensorMode(allow_non_fake_inputs=True):
        init = tracer.PeakTracker()
        with init:
            model = _build(builder)
        init_peak = init.peak_total
        set_trainable_params(model, get_adapter_params(model))
        if ac:
            training.set_activation_checkpointing(
                model, auto_wrap_policy={modules.TransformerSelfAttentionLayer})
        if loss_kind == "chunked":
            loss_fn = CEWithChunkedOutputLoss()
            model.set_num_output_chunks(loss_fn.num_output_chunks)
        else:
            loss_fn = torch.nn.CrossEntropyLoss()
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01, fused=True)
        vocab = model.tok_embeddings.num_embeddings
        ignore = torch.full((batch, 1), loss_fn.ignore_index)
        tracker = tracer.PeakTracker()
        tracker.track_external(model, optimizer)
        with tracker:
            for step in range(2):
                tokens = torch.randint(0, vocab, (batch, seq))
                labels = torch.randint(0, vocab, (batch, seq))
                # The recipe's `_loss_step`.
                logits = model(tokens)
                labels = torch.hstack((labels[..., 1:], ignore))
                if not isinstance(logits, list):
                    labels = labels.reshape(-1)
                    logits = logits.reshape(-1, logits.size(-1))
                loss = loss_fn(logits, labels)
                del logits
                num_tokens = (labels != loss_fn.ignore_index).sum()
                current = loss * num_tokens
                current.backward()
                del loss, current
                training.scale_grads(model, 1 / num_tokens)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if step == 0:
                    tracker.reset_mod_stats()
            steady = tracer._by_kind(tracker.get_tracker_snapshot("current"))
        peak = tracer._by_kind(tracker.get_tracker_snapshot("peak"))
    return {"name": name, "builder": builder, "ac": ac, "loss": loss_kind, "batch": batch,
            "seq": seq, "lora_rank": RANK, "lora_alpha": ALPHA, "lora_attn_modules": ATTN_MODULES,
            "apply_lora_to_mlp": True, "model": "llama-3.2-1b", "dtype": "bf16",
            "peak_bytes": peak["Total"], "peak_by_kind": peak, "peak_where": tracker.peak_where,
            "end_bytes": steady["Total"], "init_peak_bytes": init_peak}


def versions():
    import torchao
    import torchtune

    return {**common.versions(), "torchtune": torchtune.__version__.split("+")[0],
            "torchao": torchao.__version__}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="trace only this configuration")
    parser.add_argument("--print", action="store_true", help="print records, write nothing")
    args = parser.parse_args()
    records = []
    for name, *rest in CONFIGS:
        if args.only and name != args.only:
            continue
        start = time.time()
        try:
            record = trace(name, *rest)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            record = {"name": name, "error": common.err_str(e)}
        record["seconds"] = round(time.time() - start, 1)
        print(json.dumps(record), file=sys.stderr, flush=True)
        records.append(record)
    if args.print:
        return
    out = common.FIXTURES / "trace" / "torchtune-v5.json"
    common.write_json(out, {"versions": versions(), "records": records}, compact_lists=["records"])
    print(f"wrote {out} ({len(records)} records)", file=sys.stderr)


if __name__ == "__main__":
    main()
