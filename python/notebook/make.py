"""Writes docs/python.ipynb, the walk-through of the Python package on the Kaggle T4×2 Pythia
LoRA case (estimate, plan, the map into `from_pretrained` on a tiny random checkpoint with the
same module tree, a what-if, a plot), and executes it, outputs kept. The package's tests
(python/tests/test_notebook.py) execute it again and compare the outputs of its checked cells.

Usage (in an environment with vramplan, torch, transformers, accelerate, nbformat, nbclient and
ipykernel installed): python python/notebook/make.py
"""

from __future__ import annotations

import pathlib

import nbformat
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "python.ipynb"

# (kind, source, checked): a checked code cell's text output must come out the same each run.
CELLS = [
    ("markdown", """# vramplan in a notebook: Pythia-1B LoRA on Kaggle's two T4s

A LoRA fine-tune of Pythia-1B (r 16, gradient checkpointing, batch 2 of 2,048 tokens) on Kaggle's
T4×2, planned before anything is loaded: where the memory goes, a device map for
`from_pretrained`, how far the batch can go, and a drawing for the docs. Every call is the
`vramplan` command's, keyword for flag (`lora_rank=16` is `--lora-rank 16`).""", False),
    ("code", """import vramplan

workload = dict(mode="train", lora_rank=16, grad_ckpt=True, batch=2, seq=2048)
vramplan.__version__""", False),
    ("markdown", """## Where the memory goes

`estimate` simulates one training step on the hardware profile; in a notebook it shows itself as
a table with its breakdown.""", False),
    ("code", """estimate = vramplan.estimate("pythia-1b", hardware="t4x2", **workload)
estimate""", False),
    ("code", """estimate.fits, [round(d["peak_reserved_bytes"] / 2**30, 2) for d in estimate.devices]""", True),
    ("markdown", """## A device map

`plan` places the layers on the two GPUs (an exact ILP), with accelerate's `device_map="auto"`
beside it as the baseline. `plan.device_map` goes straight into `from_pretrained`.""", False),
    ("code", """plan = vramplan.plan("pythia-1b", hardware="t4x2", **workload)
plan""", False),
    ("code", """plan.fits, len(plan.device_map), sorted(set(plan.device_map.values()))""", True),
    ("code", """list(plan.device_map.items())[:3], list(plan.device_map.items())[-2:]""", True),
    ("markdown", """## The map in `from_pretrained`

A tiny random checkpoint with Pythia-1B's module tree (its 16 layers, small widths) stands in for
the real one, which this walk-through does not download. On Kaggle you would pass
`device_map=plan.device_map` as it is; on a machine without GPUs, as here, the GPU indexes become
`"cpu"`.""", False),
    ("code", """import os, tempfile, warnings
os.environ["TQDM_DISABLE"] = "1"
warnings.simplefilter("ignore")
import torch, transformers
transformers.utils.logging.set_verbosity_error()

config = transformers.GPTNeoXConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                    num_hidden_layers=16, vocab_size=1000, rotary_pct=0.25,
                                    tie_word_embeddings=False)
folder = tempfile.mkdtemp()
transformers.GPTNeoXForCausalLM(config).save_pretrained(folder)

on_this_machine = {k: ("cpu" if isinstance(v, int) and not torch.cuda.is_available() else v)
                   for k, v in plan.device_map.items()}
model = transformers.AutoModelForCausalLM.from_pretrained(folder, device_map=on_this_machine,
                                                          **plan.load_kwargs)
logits = model(torch.tensor([[1, 2, 3]])).logits
tuple(logits.shape), sorted({str(p.device) for p in model.parameters()})""", True),
    ("markdown", """## What if

The largest batch that still fits the same step on T4×2:""", False),
    ("code", """answer = vramplan.whatif("max-batch", "pythia-1b", hardware="t4x2", mode="train",
                         lora_rank=16, grad_ckpt=True, seq=2048)
answer.quantity, answer.value, answer.fits""", True),
    ("markdown", """## A drawing for the docs

`plot` returns an SVG, shown inline (`.save("breakdown.svg")` writes it).""", False),
    ("code", """vramplan.plot("breakdown", "pythia-1b", hardware="t4x2", **workload)""", False),
]


def build() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for kind, source, checked in CELLS:
        if kind == "markdown":
            nb.cells.append(nbformat.v4.new_markdown_cell(source))
        else:
            cell = nbformat.v4.new_code_cell(source)
            if checked:
                cell.metadata["tags"] = ["checked"]
            nb.cells.append(cell)
    return nb


def main() -> None:
    nb = build()
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    OUT.write_text(nbformat.writes(nb))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
