"""What a call from Python adds to the same work in Rust: `vramplan.plan(...)` (the keywords
turned into a command line, the call across PyO3 with the GIL released, the JSON parsed into a
`Plan`) against `run_captured` of the same command line timed inside Rust. The issue's target:
no more than 2 ms at the median.

Usage: python python/bench/plan_overhead.py [REPEAT]   (the package installed)
"""

from __future__ import annotations

import statistics
import sys
import time

import vramplan
from vramplan import _vramplan as native

CASES = [
    ("pythia-1b LoRA on t4x2", dict(model="pythia-1b", hardware="t4x2", mode="train", lora_rank=16, grad_ckpt=True, batch=2, seq=2048)),
    ("mixtral-8x7b nf4 on t4x2", dict(model="mixtral-8x7b", hardware="t4x2", mode="inference", quant="nf4", target="accelerate-v4")),
]


def main() -> None:
    repeat = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    for name, kwargs in CASES:
        kwargs = dict(kwargs)
        model, hardware = kwargs.pop("model"), kwargs.pop("hardware")
        first = vramplan.plan(model, hardware, **kwargs)  # warm: built-ins parsed, caches filled
        argv = first.argv
        python = []
        for _ in range(repeat):
            start = time.perf_counter()
            vramplan.plan(model, hardware, **kwargs)
            python.append(time.perf_counter() - start)
        rust = native._rust_seconds(argv, repeat)
        p, r = statistics.median(python), statistics.median(rust)
        print(f"{name}: Python {p * 1e3:.2f} ms, Rust {r * 1e3:.2f} ms, overhead {(p - r) * 1e3:+.2f} ms (median of {repeat})")


if __name__ == "__main__":
    main()
