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
import contextlib
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
    # A small step, where a layer's dequantization in backward sets the peak.
    ("qlora-chunked-ac-small", "qlora", True, "chunked", 1, 256),
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


@contextlib.contextmanager
def _nf4_ops_seen_by(tracker):
    """An `NF4Tensor` op (torchao's `NF4_OPS_TABLE`: `linear_nf4`'s dequantization, torchtune's
    `clone` and `copy_`) runs inside the tensor subclass's `__torch_dispatch__`, where the
    tracker's dispatch mode is off: the tensors it makes in between would go unseen. Each
    implementation runs here with the tracker pushed back on the mode stack."""
    import torchao.dtypes.nf4tensor as nf4
    from torch.utils._python_dispatch import TorchDispatchMode

    saved = dict(nf4.NF4_OPS_TABLE)

    def seen(impl):
        def run(func, args, kwargs):
            TorchDispatchMode.__enter__(tracker)
            try:
                return impl(func, args, kwargs)
            finally:
                TorchDispatchMode.__exit__(tracker, None, None, None)
        return run

    nf4.NF4_OPS_TABLE.update({op: seen(impl) for op, impl in saved.items()})
    try:
        yield
    finally:
        nf4.NF4_OPS_TABLE.clear()
        nf4.NF4_OPS_TABLE.update(saved)


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
        with init, _nf4_ops_seen_by(init):
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
        with tracker, _nf4_ops_seen_by(tracker):
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


# torchtune 0.1 (torchao 0.1): the QLoRA tutorial's recipe, Llama-2-7B (`llama2/7B_{qlora,lora}_single_device`
# at pytorch/torchtune 0914d5cfb, lora_dropout 0 here), where the peak may be set while the model is
# built and loaded.
CONFIGS_0_1 = [
    # name, builder, attention modules, MLP, activation checkpointing, batch, seq
    ("v0.1-qlora-ac", "qlora", ["q_proj", "v_proj", "k_proj", "output_proj"], True, True, 2, 512),
    ("v0.1-qlora", "qlora", ["q_proj", "v_proj", "k_proj", "output_proj"], True, False, 1, 512),
    ("v0.1-lora-ac", "lora", ["q_proj", "v_proj"], False, True, 2, 512),
]


def trace_0_1(name, builder, attn_modules, mlp, ac, batch, seq):
    """torchtune 0.1.1's `lora_finetune_single_device`: `_setup_model` (built under
    `utils.set_default_dtype(bf16)`; `load_state_dict` copies each checkpoint tensor, loaded on
    the CPU, into its parameter: an NF4 one through torchtune's `inplace_copy`, which moves it to
    the device and quantizes it there; the loop below does that per parameter, as
    `load_state_dict`'s `param.copy_(input_param)` does), then the training loop's step (fp32
    logits sliced `[..., :-1, :].contiguous()`, transposed, `nn.CrossEntropyLoss`, the logits
    held through backward, `torch.optim.AdamW`, two steps). The init peak covers building and
    loading."""
    from torchtune import modules, utils
    from torchtune.models.llama2 import lora_llama2_7b, qlora_llama2_7b
    from torchtune.modules.peft.peft_utils import get_adapter_params, set_trainable_params

    fn = qlora_llama2_7b if builder == "qlora" else lora_llama2_7b
    with FakeTensorMode(allow_non_fake_inputs=True):
        init = tracer.PeakTracker()
        with init, _nf4_ops_seen_by(init):
            with utils.set_default_dtype(torch.bfloat16), torch.device("cpu"):
                model = fn(lora_attn_modules=attn_modules, apply_lora_to_mlp=mlp, lora_rank=8,
                           lora_alpha=16, lora_dropout=0.0)
            adapters = set(get_adapter_params(model).values())
            with torch.no_grad():
                for p in model.parameters():
                    if p not in adapters:
                        p.copy_(torch.empty(p.shape, dtype=torch.bfloat16))
        init_peak = init.peak_total
        set_trainable_params(model, get_adapter_params(model))
        if ac:
            utils.set_activation_checkpointing(model, auto_wrap_policy={modules.TransformerDecoderLayer})
        loss_fn = torch.nn.CrossEntropyLoss()
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01, foreach=True)
        vocab = model.tok_embeddings.num_embeddings
        tracker = tracer.PeakTracker()
        tracker.track_external(model, optimizer)
        with tracker, _nf4_ops_seen_by(tracker):
            for step in range(2):
                input_ids = torch.randint(0, vocab, (batch, seq))
                labels = torch.randint(0, vocab, (batch, seq))
                logits = model(input_ids)
                logits = logits[..., :-1, :].contiguous()
                labels = labels[..., 1:].contiguous()
                logits = logits.transpose(1, 2)
                loss = loss_fn(logits, labels)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                del logits, loss
                if step == 0:
                    tracker.reset_mod_stats()
            steady = tracer._by_kind(tracker.get_tracker_snapshot("current"))
        peak = tracer._by_kind(tracker.get_tracker_snapshot("peak"))
    return {"name": name, "builder": builder, "ac": ac, "loss": "ce", "batch": batch, "seq": seq,
            "lora_rank": 8, "lora_alpha": 16, "lora_attn_modules": attn_modules,
            "apply_lora_to_mlp": mlp, "model": "llama-2-7b", "dtype": "bf16",
            "peak_bytes": peak["Total"], "peak_by_kind": peak, "peak_where": tracker.peak_where,
            "end_bytes": steady["Total"], "init_peak_bytes": init_peak, "init_peak_where": init.peak_where}


def versions():
    from importlib.metadata import version

    return {**common.versions(), "torchtune": version("torchtune").split("+")[0],
            "torchao": version("torchao")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="trace only this configuration")
    parser.add_argument("--print", action="store_true", help="print records, write nothing")
    args = parser.parse_args()
    import torchtune

    old = torchtune.__version__.startswith("0.1.")
    runs = [(trace_0_1, c) for c in CONFIGS_0_1] if old else [(trace, c) for c in CONFIGS]
    records = []
    for run, (name, *rest) in runs:
        if args.only and name != args.only:
            continue
        start = time.time()
        try:
            record = {**run(name, *rest), "versions": versions()}
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            record = {"name": name, "error": common.err_str(e)}
        record["seconds"] = round(time.time() - start, 1)
        print(json.dumps(record), file=sys.stderr, flush=True)
        records.append(record)
    if args.print:
        return
    out = common.FIXTURES / "trace" / "torchtune-v5.json"
    # Each torchtune version's run replaces its own records and keeps the other version's.
    ran = {r["name"] for r in records}
    kept = [r for r in json.loads(out.read_text())["records"] if r["name"] not in ran] if out.exists() else []
    if not args.only:
        kept = [r for r in kept if r.get("versions", {}).get("torchtune") != versions()["torchtune"]]
    records = sorted(kept + records, key=lambda r: (r["name"].startswith("v0.1"), r["name"]))
    common.write_json(out, {"records": records}, compact_lists=["records"])
    print(f"wrote {out} ({len(records)} records)", file=sys.stderr)


if __name__ == "__main__":
    main()
