"""The reference tracer of LitGPT's fine-tuning step (issue 33): builds LitGPT's own model
(`litgpt.model.GPT`, or `litgpt.lora.GPT` for LoRA) at full scale under PyTorch's
FakeTensorMode and runs one step as `litgpt/finetune/full.py` and `litgpt/finetune/lora.py`
(LitGPT 0.5.13) run it, following every storage with the MemTracker of `trace.py` (its
`PeakTracker`, its CUDA-like SDPA and dropout): the records go to
fixtures/reference/trace/litgpt-v5.json for `sim/tests/tracer_litgpt.rs`.

What runs, as LitGPT's scripts and Lightning Fabric do on one GPU:
- Fabric's `bf16-true` precision (LitGPT's default, `get_default_supported_precision`): the model
  is built under `fabric.init_module()` with bf16 as the default dtype (`_DtypeContextManager`),
  so every parameter, LoRA's adapters included, is bf16, and the forward runs under the same
  default dtype (`forward_context`);
- LoRA: `litgpt.lora.GPT` with the script's defaults (r=8, alpha=16, dropout 0.05, query and
  value in the fused `qkv`), `mark_only_lora_as_trainable`;
- QLoRA (`--quantize bnb.nf4`): Fabric's `BitsandbytesPrecision("nf4", bf16)` replaces every
  `nn.Linear`, the head's included (LitGPT passes no `ignore_modules`), by a 4-bit linear without
  double quantization (`_NF4Linear`: an fp32 absmax per block of 64); the script then swaps
  `transformer.wte` for a bitsandbytes `StableEmbedding` (built after the optimizer, so its
  weight and LayerNorm train but are never stepped nor zeroed) and steps the adapters with
  `bnb.optim.PagedAdamW` (32-bit states; tensors under 1e5 elements are ordinary torch tensors,
  which every LoRA tensor here is; stood in for by fp32 states updated in place);
- the optimizer otherwise is `torch.optim.AdamW` with its defaults (`instantiate_torch_optimizer`
  passes no `fused`), which on CUDA is the foreach implementation: the tracer asks for it;
- the step: `model.max_seq_length` set to the batch's length (`fit`), then
  `model(input_ids, lm_head_chunk_size=128)` and `chunked_cross_entropy` over the list of logit
  chunks (LoRA), or `model(input_ids)` and `chunked_cross_entropy(logits[..., :-1, :], ...)` in
  chunks of 128 rows (full), `backward`, `optimizer.step()`, `optimizer.zero_grad()`; two steps,
  so the second sees the optimizer states; the loop's `logits`, `loss` and batch stay named
  until the next step's assignments replace them, as in the scripts' `fit`.

Usage (the venv `scripts/reference/run trace-litgpt` builds):
    scripts/reference/run trace-litgpt
    scripts/reference/.venv-litgpt/bin/python scripts/reference/trace_litgpt.py --print --only pythia-1b
"""

import argparse
import importlib.metadata
import sys

import common
import torch
import trace as reference  # noqa: F401  (its SDPA and dropout as CUDA runs them, its tracker)
from torch._subclasses.fake_tensor import FakeTensorMode


import lightning
from litgpt.config import Config
from litgpt.utils import chunked_cross_entropy

# (vramplan's built-in name, LitGPT's name, finetune, batch, sequence): two GELU-MLP families
# (Pythia, Phi-2: GptNeoxMLP, parallel residual, partial rotary) and Llama's SwiGLU
# (LLaMAMLP, grouped-query attention, and a head LitGPT keeps untied).
CONFIGS = [
    ("pythia-1b", "pythia-1b", "full", 1, 512),
    ("pythia-1b", "pythia-1b", "lora", 2, 1024),
    ("pythia-1b", "pythia-1b", "qlora", 1, 1024),
    ("phi-2", "phi-2", "lora", 1, 512),
    ("phi-2", "phi-2", "qlora", 2, 512),
    ("llama-3.2-1b", "Llama-3.2-1B", "full", 1, 512),
    ("llama-3.2-1b", "Llama-3.2-1B", "lora", 1, 1024),
    ("llama-3.2-1b", "Llama-3.2-1B", "qlora", 2, 512),
    ("llama-3.2-1b", "Llama-3.2-1B", "lora", 4, 256),
    # Traced after the rows above were compared: the shapes of LitGPT's published config-hub
    # runs of TinyLlama (tiny-llama/{full,lora,qlora}.yaml: micro-batch 4 or 8, at most 512
    # tokens), their LoRA on every linear and the head (`lora_*: true`).
    ("tinyllama-1.1b", "tiny-llama-1.1b", "full", 4, 512),
    ("tinyllama-1.1b", "tiny-llama-1.1b", "lora-hub", 8, 512),
    ("tinyllama-1.1b", "tiny-llama-1.1b", "qlora-hub", 8, 512),
    # And Phi-2's (phi-2/{lora,qlora}.yaml: micro-batch 4), traced after the three above.
    ("phi-2", "phi-2", "lora-hub", 4, 512),
    ("phi-2", "phi-2", "qlora-hub", 4, 512),
]
LORA = {"lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.05, "lora_query": True, "lora_key": False,
        "lora_value": True, "lora_projection": False, "lora_mlp": False, "lora_head": False}
# The config hub's LoRA files switch every `lora_*` on.
LORA_HUB = {**LORA, "lora_key": True, "lora_projection": True, "lora_mlp": True, "lora_head": True}


def _nf4_linear_like(linear, compute_dtype):
    """Fabric's `_NF4Linear` in place of `linear`: bitsandbytes' Linear4bit, weight packed uint8
    [(out*in+1)//2, 1], an fp32 absmax per block of 64 (no double quantization). Built on the
    meta device (Params4bit cannot wrap a fake tensor), then given fake tensors."""
    import bitsandbytes as bnb
    from bitsandbytes.functional import QuantState

    out_f, in_f = linear.out_features, linear.in_features
    with torch._subclasses.fake_tensor.unset_fake_temporarily():
        q = bnb.nn.Linear4bit(in_f, out_f, bias=False, compute_dtype=compute_dtype, quant_type="nf4",
                              compress_statistics=False, device="meta")
    n = out_f * in_f
    qs = QuantState(absmax=torch.empty((n + 63) // 64, dtype=torch.float32), shape=torch.Size([out_f, in_f]),
                    code=torch.empty(16, dtype=torch.float32), blocksize=64, quant_type="nf4",
                    dtype=compute_dtype)
    w = torch.nn.Parameter(torch.empty((n + 1) // 2, 1, dtype=torch.uint8), requires_grad=False)
    w.quant_state = qs
    w.bnb_quantized = True
    w.compress_statistics, w.quant_type, w.quant_storage, w.blocksize = False, "nf4", torch.uint8, 64
    q._parameters["weight"] = w
    if linear.bias is not None:
        q._parameters["bias"] = torch.nn.Parameter(linear.bias.detach(), requires_grad=False)
    q.compute_type_is_set = True
    return q


def _quantize(module, compute_dtype):
    """Fabric's `_convert_layers` with no `ignore_modules`: every nn.Linear, the head's too."""
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            setattr(module, name, _nf4_linear_like(child, compute_dtype))
        else:
            _quantize(child, compute_dtype)


class _PagedAdamWLike(torch.optim.Optimizer):
    """bitsandbytes' PagedAdamW (32-bit) for tensors under 1e5 elements: two fp32 states made with
    `torch.zeros_like` at the first step, updated in place by one fused kernel (no temporaries)."""

    def __init__(self, params):
        super().__init__(params, {"lr": 1e-3})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["state1"] = torch.zeros_like(p, dtype=torch.float32)
                    state["state2"] = torch.zeros_like(p, dtype=torch.float32)
                state["state1"].add_(p.grad)
                state["state2"].addcmul_(p.grad, p.grad)
                p.add_(state["state1"], alpha=-1e-3)


def trace(config):
    """Runs one configuration and returns what it recorded."""
    name, finetune, batch, seq = config["litgpt_name"], config["finetune"], config["batch"], config["seq"]
    lora = LORA_HUB if config.get("lora_targets") == "all" else LORA
    dtype = torch.bfloat16
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # Fabric's bf16-true: init_module and forward_context
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            if finetune == "full":
                from litgpt.model import GPT
                model = GPT(Config.from_name(name))
            else:
                from litgpt.lora import GPT, mark_only_lora_as_trainable
                from litgpt.lora import Config as LoraConfig
                model = GPT(LoraConfig.from_name(name, **lora))
                mark_only_lora_as_trainable(model)
            if finetune == "qlora":
                _quantize(model, dtype)
                from bitsandbytes.nn import StableEmbedding
                optimizer = _PagedAdamWLike(list(model.parameters()))
                old = model.transformer.wte
                with torch.device("meta"):
                    wte = StableEmbedding(old.num_embeddings, old.embedding_dim)
                wte.weight = torch.nn.Parameter(torch.empty_like(old.weight, dtype=dtype))
                wte.norm.weight = torch.nn.Parameter(torch.empty(old.embedding_dim, dtype=dtype))
                wte.norm.bias = torch.nn.Parameter(torch.empty(old.embedding_dim, dtype=dtype))
                model.transformer.wte = wte
            else:
                optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
            model.train()
            model.max_seq_length = seq  # fit(): the longest sample, here the batch's length
            tracker = reference.PeakTracker()
            # Tensors held outside the model's parameters and buffers, which MemTracker only sees
            # when told: each 4-bit weight's quantization state (absmax, code), and under QLoRA
            # the replaced embedding, which the script's `old_embedding` keeps to its end.
            held = []
            if finetune == "qlora":
                held.append(old.weight)
                for m in model.modules():
                    state = getattr(getattr(m, "weight", None), "quant_state", None)
                    if state is not None:
                        held += [state.absmax, state.code]
            tracker.track_external(model, optimizer, *held)
            vocab = model.config.padded_vocab_size
            with tracker:
                for step in range(2):
                    input_ids = torch.randint(0, vocab, (batch, seq))
                    targets = torch.randint(0, vocab, (batch, seq))
                    if finetune == "full":
                        logits = model(input_ids)
                        loss = chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])
                    else:
                        logits = model(input_ids, lm_head_chunk_size=128)
                        logits[-1] = logits[-1][..., :-1, :]
                        loss = chunked_cross_entropy(logits, targets[..., 1:])
                    # `logits`, `loss` and the batch stay named until the next step
                    # replaces them, as in the scripts' loops.
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad()
                    if step == 0:
                        tracker.reset_mod_stats()
                steady = reference._by_kind(tracker.get_tracker_snapshot("current"))
            peak = reference._by_kind(tracker.get_tracker_snapshot("peak"))
            where = tracker.peak_where
    finally:
        torch.set_default_dtype(previous)
    return {"peak_bytes": peak["Total"], "peak_by_kind": peak, "peak_where": where, "end_bytes": steady["Total"]}


def configurations():
    """The records' configurations, in the fixture's order."""
    out = []
    for model, litgpt_name, finetune, batch, seq in CONFIGS:
        hub = finetune.endswith("-hub")
        finetune = finetune.removesuffix("-hub")
        c = {"model": model, "litgpt_name": litgpt_name, "mode": "train", "finetune": finetune, "ckpt": False,
             "batch": batch, "seq": seq, "dtype": "bf16", "precision": "bf16-true"}
        if finetune != "full":
            c.update({"lora_rank": LORA["lora_r"], "lora_alpha": LORA["lora_alpha"],
                      "lora_dropout": LORA["lora_dropout"], "lora_targets": "all" if hub else ["query", "value"]})
        if finetune == "qlora":
            c["quantize"] = "bnb.nf4"
        out.append(c)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="trace only this built-in model's configurations")
    parser.add_argument("--print", action="store_true", help="print records, write nothing")
    args = parser.parse_args()
    records = []
    for config in configurations():
        if args.only and config["model"] != args.only:
            continue
        record = common.traced_record(config, trace, limit=6)
        records.append(record)
    if args.print:
        return
    versions = {**common.versions(), "litgpt": importlib.metadata.version("litgpt"), "lightning": lightning.__version__}
    out = common.FIXTURES / "trace" / f"litgpt-{common.TAG}.json"
    common.write_json(out, {"versions": versions, "records": records}, compact_lists=["records"])
    print(f"wrote {out} ({len(records)} records)", file=sys.stderr)


if __name__ == "__main__":
    main()
