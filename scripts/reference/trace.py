"""A first reference tracer of the real runtime (issue 11): runs the real transformers training
step on the CPU under PyTorch's FakeTensorMode (tensors without data, so full scale costs no
memory) and records its memory with PyTorch's own MemTracker
(torch.distributed._tools.mem_tracker), which follows every storage from creation to death and
sorts it into parameters, buffers, gradients, activations, temporaries and optimizer states.

A start, not yet a fixture generator: no LoRA or bitsandbytes, one optimizer (AdamW), and only
the step's peak. The optimizer runs with CUDA's default implementation (`foreach=True`), not
the CPU's (`foreach=False`): the two allocate different temporaries at the step.

Usage (from the repository root, with the venv `scripts/reference/run` builds):
    scripts/reference/.venv5/bin/python scripts/reference/trace.py llama-3.2-1b --batch 1 --seq 512
prints one JSON object: the library versions, the configuration and the peak in bytes by kind.
"""

import argparse
import json
import sys
import time

import common  # noqa: F401  (offline settings, config loading)
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def trace(name, batch, seq, dtype, steps=2):
    """The peak of `steps` full fine-tuning steps (forward, loss, backward, AdamW, zero_grad
    with set_to_none) of built-in model `name`, in bytes by kind."""
    raw = common.load_raw_config(name)
    config, _ = common.make_config(raw)
    config._attn_implementation = "sdpa"
    cls = common.model_class(raw)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            model = cls(config)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
            tracker = MemTracker()
            tracker.track_external(model, optimizer)
            with tracker:
                for step in range(steps):
                    ids = torch.randint(0, config.vocab_size, (batch, seq))
                    model(input_ids=ids, labels=ids).loss.backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    if step + 1 < steps:
                        # MemTracker keeps per-module statistics of one iteration only.
                        tracker.reset_mod_stats()
            peak = tracker.get_tracker_snapshot("peak")
    finally:
        torch.set_default_dtype(previous)
    by_kind = {}
    for stats in peak.values():
        for kind, value in stats.items():
            label = kind if isinstance(kind, str) else kind.value
            by_kind[label] = by_kind.get(label, 0) + int(value)
    return by_kind


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a vramplan built-in model name")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    args = parser.parse_args()
    start = time.time()
    peak = trace(args.model, args.batch, args.seq, DTYPES[args.dtype])
    json.dump(
        {
            "versions": common.versions(),
            "model": args.model,
            "mode": "train",
            "finetune": "full",
            "optimizer": "adamw (foreach)",
            "batch": args.batch,
            "seq": args.seq,
            "dtype": args.dtype,
            "peak_bytes": peak,
            "seconds": round(time.time() - start, 1),
        },
        sys.stdout,
    )
    print()


if __name__ == "__main__":
    main()
