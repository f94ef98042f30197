"""Records what transformers' own `from_pretrained` does with maps whose keys overlap: a parent
listed beside its own children, on one device (the transformers 5.x rule of `vramplan check`
called `overlapping-entries`, which said the parent's weights stay on the meta device). For each
case: a tiny random checkpoint with the built-in's module tree (loads.py's `tiny_overrides`),
saved with `save_pretrained`, loaded with the map (every device `cpu`, so no GPU is needed and
the device rule plays no part), then one forward pass. Writes fixtures/reference/nested/<tag>.json;
`tests/tests/nested_maps.rs` holds `check` to it.

Run by scripts/reference/run nested (no GPU needed).
"""

import shutil
import tempfile
import traceback
from pathlib import Path

import common
from common import torch
from loads import make_inputs, save_tiny

OUT = common.FIXTURES / "nested" / f"{common.TAG}.json"

# (name, built-in, map): every map covers the whole model, with a parent listed beside a child.
CASES = [
    ("xlnet-parent-beside-layer", "xlnet-base-cased",
     {"transformer": "cpu", "transformer.layer.0": "cpu", "lm_loss": "cpu"}),
    ("starcoder-parent-beside-layer", "starcoder",
     {"transformer": "cpu", "transformer.h.0": "cpu", "lm_head": "cpu"}),
    ("llama-model-beside-layer", "llama-3.2-1b",
     {"model": "cpu", "model.layers.0": "cpu", "lm_head": "cpu"}),
    ("llama-layer-beside-module", "llama-3.2-1b",
     {"model.embed_tokens": "cpu", "model.layers": "cpu", "model.layers.0.mlp": "cpu", "model.norm": "cpu",
      "model.rotary_emb": "cpu", "lm_head": "cpu"}),
    ("llama-layer-beside-tensor", "llama-3.2-1b",
     {"model.embed_tokens": "cpu", "model.layers": "cpu", "model.layers.0.mlp.down_proj.weight": "cpu",
      "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}),
    ("gpt2-root-beside-module", "gpt2", {"": "cpu", "transformer.h.0": "cpu"}),
]


def run(name, model, device_map):
    raw = common.load_raw_config(model)
    case = {"name": name, "model": model, "device_map": [[k, v] for k, v in device_map.items()],
            "loaded": False, "forward": False, "meta_params_left": None, "error": None}
    tmp = Path(tempfile.mkdtemp(prefix="vramplan-nested-"))
    try:
        save_tiny(raw, tmp / "tiny")
        loaded = common.model_class(raw).from_pretrained(tmp / "tiny", device_map=device_map)
        case["loaded"] = True
        case["meta_params_left"] = [n for n, p in loaded.named_parameters() if p.device.type == "meta"]
        with torch.no_grad():
            loaded(**make_inputs(raw))
        case["forward"] = True
    except Exception as e:  # noqa: BLE001
        case["error"] = common.err_str(e)
        case["traceback_tail"] = traceback.format_exc()[-1200:]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return case


def main():
    records = []
    for name, model, device_map in CASES:
        record = run(name, model, device_map)
        print(f"{name}: loaded={record['loaded']} forward={record['forward']} "
              f"meta_left={record['meta_params_left']} err={record['error']}", flush=True)
        records.append(record)
    document = {"about": "from_pretrained with maps whose keys overlap (a parent beside its children), "
                         "every device cpu: scripts/reference/nested.py", "versions": common.versions(),
                "records": records}
    common.write_fixture(OUT, document)


if __name__ == "__main__":
    main()
