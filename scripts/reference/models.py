"""Records model facts for vramplan's built-in models, from the real transformers runtime.

For every profiles/catalog/models/<name>.json (the published config.json, `quantization_config`
stripped, its presence noted), this builds the class named in `architectures[0]` on the meta
device exactly the way `from_pretrained(..., dtype=torch.bfloat16)` of the installed
transformers creates it before reading weights (see common.build_like_from_pretrained: the
class's own `get_init_context`, `_get_dtype`), ties the weights as from_pretrained does after
loading, and writes fixtures/reference/models/<v5|v4>/<name>.json with:

  parameters      model.named_parameters() (remove_duplicate=True, definition order):
                  [name, shape, dtype]
  tied            accelerate.utils.find_tied_parameters(model) groups, each sorted, sorted
  tie_word_embeddings  {"config_json": the value in config.json (null: absent),
                  "config_object": what the config class made of it} (5.x T5Config always sets
                  True and keeps the json value only as scale_decoder_outputs)
  tied_weights_keys  5.x: model.all_tied_weights_keys {target: source}; 4.x: the
                  _tied_weights_keys class attribute
  buffers         [name, shape, dtype, persistent]; buffers made with torch.tensor(...)
                  take the default dtype during construction (observed, not corrected)
  no_split_modules   model._get_no_split_modules("auto") (what _get_device_map uses), sorted
  keep_in_fp32_modules / keep_in_fp32_modules_strict   the model's flags (from_pretrained
                  upcasts those to float32 when loading; `parameters` shows the dtype at
                  construction, before that upcast)
  module_sizes    accelerate.utils.compute_module_sizes(model, dtype=...) for bfloat16 and
                  float16, restricted to module names ("" included) with at most 3 dots
  parameter_count sum of numel over `parameters`
  error           set (and the rest absent) when the model fails to build

Usage: python models.py [name ...]   (no names: all 64)
"""

import sys
import time
import traceback

import common
from common import torch

import accelerate.utils as au


def facts(name, cls=None):
    """The facts of built-in `name` built as its own class, or as `cls` from the same config (a
    base model or task head: heads.py)."""
    raw = common.load_raw_config(name)
    if cls:
        raw = {**raw, "architectures": [cls]}
    out = {"model": name, "source": f"profiles/catalog/models/{name}.json",
           "versions": common.versions(), "class": raw["architectures"][0],
           "load_dtype": "bfloat16",
           "had_quantization_config": "quantization_config" in raw}
    if "quantization_config" in raw:
        out["quantization_config_stripped"] = raw["quantization_config"].get("quant_method", "?")
    try:
        built = common.build_like_from_pretrained(raw, torch.bfloat16, tie=True)
        model = built["model"]
        try:
            params = [[n, list(p.shape), common.dtype_name(p.dtype)]
                      for n, p in model.named_parameters(remove_duplicate=True)]
            tied = sorted(sorted(g) for g in au.find_tied_parameters(model))
            if common.TF_MAJOR >= 5:
                twk = dict(getattr(model, "all_tied_weights_keys", {}) or {})
            else:
                twk = getattr(model, "_tied_weights_keys", None)
            buffers = []
            for n, b in model.named_buffers(remove_duplicate=True):
                mod_name, _, leaf = n.rpartition(".")
                mod = model.get_submodule(mod_name) if mod_name else model
                buffers.append([n, list(b.shape), common.dtype_name(b.dtype),
                                leaf not in mod._non_persistent_buffers_set])
            module_names = {n for n, _ in model.named_modules()}
            sizes = {}
            for dt in (torch.bfloat16, torch.float16):
                ms = au.compute_module_sizes(model, dtype=dt)
                sizes[common.dtype_name(dt)] = {k: int(v) for k, v in ms.items()
                                                if k in module_names and k.count(".") <= 3}
            # What `_get_device_map` uses: the classes declared by every PreTrainedModel inside
            # the model (BertForMaskedLM declares none itself; its BertModel does).
            try:
                nsm = model._get_no_split_modules("auto")
            except Exception:  # noqa: BLE001 (a model that declares None refuses "auto")
                nsm = model._no_split_modules
            tie_obj = getattr(model.config, "tie_word_embeddings", None)
            out.update({
                "parameters": params,
                "tie_word_embeddings": {"config_json": raw.get("tie_word_embeddings"),
                                        "config_object": tie_obj},
                "tied": tied,
                "tied_weights_keys": twk,
                "buffers": buffers,
                "no_split_modules": sorted(nsm) if nsm else [],
                "keep_in_fp32_modules": sorted(model._keep_in_fp32_modules or []),
                "keep_in_fp32_modules_strict": sorted(getattr(model, "_keep_in_fp32_modules_strict", None) or []),
                "module_sizes": sizes,
                "parameter_count": int(sum(p.numel() for p in model.parameters())),
            })
        finally:
            built["restore"]()
    except Exception as e:  # noqa: BLE001
        out["error"] = common.err_str(e, 1000)
        out["traceback_tail"] = traceback.format_exc()[-1500:]
    return out


def main(argv):
    names = argv or common.model_names()
    outdir = common.FIXTURES / "models" / common.TAG
    for name in names:
        t0 = time.time()
        f = facts(name)
        f["seconds"] = round(time.time() - t0, 1)
        common.write_json(outdir / f"{name}.json", f, compact_lists={"parameters", "buffers", "module_sizes"})
        status = "ERROR " + f["error"][:200] if "error" in f else f"{len(f['parameters'])} params"
        print(f"[{common.TAG}] {name}: {status} ({f['seconds']}s)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
