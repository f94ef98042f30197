"""Load tests of the accelerate device_maps that vramplan exports, with the real transformers.

For each case in CASES (vramplan `plan` arguments): runs `$VRAMPLAN plan ... -o <tmp>/map.json`
(default binary target/debug/vramplan), reads the exported device_map, builds a TINY random
model with the same module tree as the built-in model (profiles/catalog/models/<name>.json
with hidden/intermediate/head sizes and vocab shrunk, see tiny_overrides: the SAME number of
layers and experts and the same tie settings, so every module name is identical), saves it
with save_pretrained (safetensors) to a temp folder, then
    from_pretrained(folder, device_map=<map with GPU indices remapped to "cpu">,
                    offload_folder=<tmp>, dtype=<the case's dtype>)
("cpu" and "disk" are kept as they are) and runs one forward pass on CPU (decoders:
input_ids; T5: input_ids + decoder_input_ids; BERT masked LM / XLNet: input_ids).

Writes fixtures/reference/loads/<v5|v4>.json: {"versions", "cases": [...]}, each case:
  args            the vramplan arguments (after the binary)
  naming          "v5" (default target) or "v4" (--target accelerate-v4; run in the 4.x venv)
  plan_exit, plan_error   vramplan's exit code and stderr tail when it wrote no map
  device_map      [[key, device], ...] as exported (before the remap)
  loaded, forward true|false
  error           "<exception type>: <message>" (first 300 chars) of the first failure, or null
  meta_params_left  parameters still on the meta device after loading, except those under a
                  module the map sends to "disk" (accelerate keeps disk-offloaded weights on meta
                  and loads them in its hooks; those are counted in meta_params_on_disk)
  tied_split_in_original_map  tied parameter groups of the loaded model that the exported map
                  (before the remap) puts on different devices: [[param, device], ...] per group
  warnings        transformers/accelerate logger warnings and Python warnings raised while
                  loading (first 5, 300 chars each)
Cases whose naming differs from the running transformers major version are skipped, so
`python loads.py` in .venv5 writes v5.json and in .venv4 writes v4.json.

Usage: python loads.py [substring ...]   (only cases whose args contain one of them; written to
<tag>.partial.json)
"""

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

import common
from common import torch

VRAMPLAN = os.environ.get("VRAMPLAN", str(common.REPO / "target" / "debug" / "vramplan"))

INF = ["--mode", "inference"]
TRAIN = ["--mode", "train"]

# (naming, vramplan plan arguments). Readable on purpose: add cases here.
CASES = [
    # a vision-language model with its images (issue 29): tower and language model placed apart
    ("v5", ["plan", "qwen2.5-vl-7b-instruct", "--hardware", "t4x2", *INF, "--dtype", "fp16", "--seq", "1024",
            "--images", "2", "--image-size", "1024x1024"]),
    ("v5", ["plan", "gemma-3-4b-it", "--hardware", "t4x2", *INF, "--dtype", "fp16", "--seq", "1024",
            "--images", "2", "--image-size", "896x896", "--batch", "8"]),
    ("v5", ["plan", "qwen3-vl-8b-instruct", "--hardware", "t4x2", *INF, "--dtype", "fp16", "--seq", "1024",
            "--images", "2", "--image-size", "1024x1024"]),
    ("v5", ["plan", "mistral-small-3.1-24b-instruct", "--hardware", "l40s-x4", *INF, "--dtype", "bf16", "--seq", "1024",
            "--images", "2", "--image-size", "1540x1540"]),
    # llama
    ("v5", ["plan", "llama-3-8b", "--hardware", "t4x2", *INF, "--dtype", "fp16", "--seq", "2048"]),
    ("v5", ["plan", "llama-3-8b", "--hardware", "t4", *INF, "--dtype", "fp16", "--seq", "2048"]),
    ("v5", ["plan", "llama-3.2-1b", "--hardware", "rtx4090", *TRAIN, "--dtype", "bf16", "--seq", "1024"]),
    ("v5", ["plan", "tinyllama-1.1b", "--hardware", "2xt4", *TRAIN, "--dtype", "fp16", "--seq", "512"]),
    ("v5", ["plan", "llama-3-70b", "--hardware", "a100-80gb-x4", *INF, "--dtype", "bf16", "--seq", "4096"]),
    # mistral / mixtral
    ("v5", ["plan", "mistral-7b", "--hardware", "rtx4090", *INF, "--dtype", "bf16", "--seq", "4096"]),
    ("v5", ["plan", "mistral-7b", "--hardware", "t4", *INF, "--dtype", "fp16", "--seq", "2048"]),
    ("v5", ["plan", "mixtral-8x7b", "--hardware", "a100-80gb-x4", *INF, "--dtype", "bf16", "--seq", "4096"]),
    ("v5", ["plan", "mixtral-8x7b", "--hardware", "rtx4090", *INF, "--dtype", "fp16", "--seq", "2048"]),
    # qwen2 / qwen2-moe / qwen3 / qwen3-moe
    ("v5", ["plan", "qwen2.5-7b", "--hardware", "t4x2", *INF, "--dtype", "fp16", "--seq", "2048"]),
    ("v5", ["plan", "qwen2.5-0.5b", "--hardware", "t4", *TRAIN, "--dtype", "fp16", "--seq", "1024"]),
    ("v5", ["plan", "qwen1.5-moe-a2.7b", "--hardware", "t4x2", *INF, "--dtype", "fp16", "--seq", "2048"]),
    ("v5", ["plan", "qwen1.5-moe-a2.7b", "--hardware", "rtx4090", *TRAIN, "--dtype", "bf16", "--seq", "512"]),
    ("v5", ["plan", "qwen3-8b", "--hardware", "rtx4090", *INF, "--dtype", "bf16", "--seq", "4096"]),
    ("v5", ["plan", "qwen3-0.6b", "--hardware", "t4", *TRAIN, "--dtype", "fp16", "--seq", "1024"]),
    ("v5", ["plan", "qwen3-30b-a3b", "--hardware", "2xa100-40gb", *INF, "--dtype", "bf16", "--seq", "4096"]),
    ("v5", ["plan", "qwen3-30b-a3b", "--hardware", "rtx4090", *INF, "--dtype", "bf16", "--seq", "2048"]),
    # deepseek-v2 / v3
    ("v5", ["plan", "deepseek-v2-lite", "--hardware", "rtx4090-x4", *INF, "--dtype", "bf16", "--seq", "4096"]),
    ("v5", ["plan", "deepseek-v2-lite", "--hardware", "t4", *INF, "--dtype", "fp16", "--seq", "2048"]),
    ("v5", ["plan", "deepseek-v3", "--hardware", "h100-80gb-x8", *INF, "--dtype", "bf16", "--seq", "4096"]),
    # gpt-neox
    ("v5", ["plan", "pythia-410m", "--hardware", "t4", *INF, "--dtype", "fp16", "--seq", "2048"]),
    ("v5", ["plan", "pythia-2.8b", "--hardware", "2xt4", *INF, "--dtype", "fp16", "--seq", "2048"]),
    ("v5", ["plan", "pythia-1b", "--hardware", "t4", *TRAIN, "--dtype", "fp16", "--seq", "1024"]),
    # gpt2 / gpt-bigcode
    ("v5", ["plan", "gpt2", "--hardware", "t4", *INF, "--dtype", "fp16", "--seq", "1024"]),
    ("v5", ["plan", "gpt2", "--hardware", "2xt4", *TRAIN, "--dtype", "fp16", "--seq", "1024"]),
    ("v5", ["plan", "starcoder", "--hardware", "t4x2", *INF, "--dtype", "fp16", "--seq", "2048"]),
    ("v5", ["plan", "octocoder", "--hardware", "a100-80gb", *INF, "--dtype", "bf16", "--seq", "4096"]),
    # phi / phi-3
    ("v5", ["plan", "phi-2", "--hardware", "t4", *INF, "--dtype", "fp16", "--seq", "2048"]),
    ("v5", ["plan", "phi-1.5", "--hardware", "t4", *TRAIN, "--dtype", "fp16", "--seq", "1024"]),
    ("v5", ["plan", "phi-3-mini", "--hardware", "t4", *INF, "--dtype", "fp16", "--seq", "4096"]),
    # gemma / gemma2
    ("v5", ["plan", "gemma-2b", "--hardware", "t4", *INF, "--dtype", "fp16", "--seq", "2048"]),
    ("v5", ["plan", "gemma-2-9b", "--hardware", "t4x2", *INF, "--dtype", "fp16", "--seq", "2048"]),
    ("v5", ["plan", "gemma-2-2b", "--hardware", "rtx4090", *TRAIN, "--dtype", "bf16", "--seq", "1024"]),
    # falcon / opt / bloom
    ("v5", ["plan", "falcon-7b", "--hardware", "t4x2", *INF, "--dtype", "fp16", "--seq", "2048"]),
    ("v5", ["plan", "falcon-7b", "--hardware", "t4", *INF, "--dtype", "fp16", "--seq", "2048"]),
    ("v5", ["plan", "opt-6.7b", "--hardware", "t4", *INF, "--dtype", "fp16", "--seq", "2048"]),
    ("v5", ["plan", "opt-1.3b", "--hardware", "t4", *TRAIN, "--dtype", "fp16", "--seq", "1024"]),
    ("v5", ["plan", "bloom-7b1", "--hardware", "t4x2", *INF, "--dtype", "fp16", "--seq", "2048"]),
    ("v5", ["plan", "bloom-560m", "--hardware", "t4", *TRAIN, "--dtype", "fp16", "--seq", "1024"]),
    # gpt-oss / olmoe
    ("v5", ["plan", "gpt-oss-20b", "--hardware", "rtx4090", *INF, "--dtype", "bf16", "--seq", "4096"]),
    ("v5", ["plan", "gpt-oss-20b", "--hardware", "a100-80gb", *INF, "--dtype", "bf16", "--seq", "4096"]),
    ("v5", ["plan", "olmoe-1b-7b", "--hardware", "t4x2", *INF, "--dtype", "fp16", "--seq", "2048"]),
    ("v5", ["plan", "olmoe-1b-7b", "--hardware", "t4", *INF, "--dtype", "fp16", "--seq", "2048"]),
    # t5 / bert / xlnet
    ("v5", ["plan", "t5-base", "--hardware", "t4", *INF, "--dtype", "fp16", "--seq", "512"]),
    ("v5", ["plan", "t5-base", "--hardware", "2xt4", *TRAIN, "--dtype", "fp32", "--seq", "512"]),
    ("v5", ["plan", "t0-3b", "--hardware", "t4", *INF, "--dtype", "fp16", "--seq", "512"]),
    ("v5", ["plan", "bert-base-uncased", "--hardware", "2xt4", *INF, "--dtype", "fp16", "--seq", "512"]),
    ("v5", ["plan", "bert-base-uncased", "--hardware", "t4", *TRAIN, "--dtype", "fp32", "--seq", "512"]),
    ("v5", ["plan", "bert-large-uncased", "--hardware", "t4", *INF, "--dtype", "fp16", "--seq", "512"]),
    # XLNet keeps 109 `torch.FloatTensor` parameters in float32 whatever the dtype, so its forward
    # fails in fp16/bf16 with any map ("expected scalar type Float but found Half"): fp32 here.
    ("v5", ["plan", "xlnet-base-cased", "--hardware", "2xt4", *INF, "--dtype", "fp32", "--seq", "512"]),
    ("v5", ["plan", "xlnet-base-cased", "--hardware", "t4", *TRAIN, "--dtype", "fp32", "--seq", "512"]),
    # more splits and offloads
    ("v5", ["plan", "mistral-7b", "--hardware", "2xt4", *INF, "--dtype", "fp16", "--seq", "2048"]),
    ("v5", ["plan", "gpt-oss-20b", "--hardware", "2xrtx4090", *INF, "--dtype", "bf16", "--seq", "4096"]),
    ("v5", ["plan", "gpt-oss-20b", "--hardware", "t4x2", *INF, "--dtype", "fp16", "--seq", "2048"]),
    ("v5", ["plan", "gemma-2-2b", "--hardware", "a100-80gb", *TRAIN, "--dtype", "bf16", "--seq", "1024"]),
    ("v5", ["plan", "gemma-2-27b", "--hardware", "2xa100-40gb", *INF, "--dtype", "bf16", "--seq", "4096"]),
    ("v5", ["plan", "qwen3-235b-a22b", "--hardware", "h100-80gb-x8", *INF, "--dtype", "bf16", "--seq", "4096"]),
    ("v5", ["plan", "mixtral-8x22b", "--hardware", "a100-80gb-x4", *INF, "--dtype", "bf16", "--seq", "4096"]),
    ("v5", ["plan", "t0-3b", "--hardware", "2xt4", *INF, "--dtype", "fp16", "--seq", "512"]),
    ("v5", ["plan", "phi-2", "--hardware", "2xt4", *TRAIN, "--dtype", "fp16", "--seq", "512"]),
    ("v5", ["plan", "bloom-7b1", "--hardware", "t4", *INF, "--dtype", "fp16", "--seq", "2048"]),
    ("v5", ["plan", "olmoe-1b-7b", "--hardware", "a100-80gb", *TRAIN, "--dtype", "bf16", "--seq", "1024"]),
    ("v5", ["plan", "deepseek-v2-lite", "--hardware", "a100-80gb-x4", *TRAIN, "--dtype", "bf16", "--seq", "1024"]),
    # transformers 4.x names (--target accelerate-v4), run in .venv4
    ("v4", ["plan", "llama-3-8b", "--hardware", "t4", *INF, "--dtype", "fp16", "--seq", "2048", "--target", "accelerate-v4"]),
    ("v4", ["plan", "mixtral-8x7b", "--hardware", "rtx4090", *INF, "--dtype", "fp16", "--seq", "2048", "--target", "accelerate-v4"]),
    ("v4", ["plan", "qwen3-30b-a3b", "--hardware", "2xa100-40gb", *INF, "--dtype", "bf16", "--seq", "4096", "--target", "accelerate-v4"]),
    ("v4", ["plan", "deepseek-v2-lite", "--hardware", "t4", *INF, "--dtype", "fp16", "--seq", "2048", "--target", "accelerate-v4"]),
    ("v4", ["plan", "pythia-410m", "--hardware", "t4", *INF, "--dtype", "fp16", "--seq", "2048", "--target", "accelerate-v4"]),
    ("v4", ["plan", "gpt2", "--hardware", "2xt4", *TRAIN, "--dtype", "fp16", "--seq", "1024", "--target", "accelerate-v4"]),
    ("v4", ["plan", "t5-base", "--hardware", "t4", *INF, "--dtype", "fp16", "--seq", "512", "--target", "accelerate-v4"]),
    ("v4", ["plan", "bert-base-uncased", "--hardware", "2xt4", *INF, "--dtype", "fp16", "--seq", "512", "--target", "accelerate-v4"]),
    ("v4", ["plan", "xlnet-base-cased", "--hardware", "2xt4", *INF, "--dtype", "fp32", "--seq", "512", "--target", "accelerate-v4"]),
    ("v4", ["plan", "starcoder", "--hardware", "t4x2", *INF, "--dtype", "fp16", "--seq", "2048", "--target", "accelerate-v4"]),
    ("v4", ["plan", "falcon-7b", "--hardware", "t4", *INF, "--dtype", "fp16", "--seq", "2048", "--target", "accelerate-v4"]),
    ("v4", ["plan", "t0-3b", "--hardware", "2xt4", *INF, "--dtype", "fp16", "--seq", "512", "--target", "accelerate-v4"]),
    ("v4", ["plan", "gemma-2-9b", "--hardware", "t4x2", *INF, "--dtype", "fp16", "--seq", "2048", "--target", "accelerate-v4"]),
]

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}

H, HEADS, HD, FF, MOE_FF, VOCAB = 64, 4, 16, 128, 32, 320


def tiny_overrides(raw):
    """Config overrides that shrink every width but keep the module tree (layer and expert
    counts, tie settings, MQA/GQA/MHA shape of the attention) identical."""
    o = {}
    nh = raw.get("num_attention_heads", raw.get("n_head", raw.get("num_heads")))
    for k in ("hidden_size", "n_embd", "n_embed", "d_model"):
        if k in raw:
            o[k] = H
    for k in ("num_attention_heads", "n_head", "num_heads"):
        if k in raw:
            o[k] = HEADS
    for k in ("num_key_value_heads", "num_kv_heads"):
        if raw.get(k) is not None:
            kv = raw[k]
            o[k] = HEADS if kv == nh else (1 if kv == 1 else 2)
    if raw.get("head_dim") is not None:
        o["head_dim"] = HD
    for k in ("d_kv", "d_head"):
        if k in raw:
            o[k] = HD
    for k in ("intermediate_size", "ffn_dim", "d_ff", "d_inner"):
        if raw.get(k) is not None:
            o[k] = FF
    if raw.get("n_inner") is not None:
        o["n_inner"] = FF
    for k in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        if raw.get(k) is not None:
            o[k] = MOE_FF
    if raw.get("q_lora_rank") is not None:
        o["q_lora_rank"] = 32
    if raw.get("kv_lora_rank") is not None:
        o["kv_lora_rank"] = 32
    if raw.get("qk_rope_head_dim") is not None:
        o["qk_rope_head_dim"] = 8
    if raw.get("qk_nope_head_dim") is not None:
        o["qk_nope_head_dim"] = 16
    if raw.get("v_head_dim") is not None:
        o["v_head_dim"] = 16
    if raw.get("word_embed_proj_dim") is not None:
        o["word_embed_proj_dim"] = H if raw["word_embed_proj_dim"] == raw.get("hidden_size") else 32
    if "vocab_size" in raw:
        o["vocab_size"] = VOCAB
    # A vision-language model's tower: its widths shrunk the same way, its depth kept; the
    # multimodal rotary sections sized to the tiny head (half of HD in all).
    vision = raw.get("vision_config")
    if isinstance(vision, dict):
        v = dict(vision)
        for k, value in (("hidden_size", H), ("embed_dim", H), ("num_heads", HEADS),
                         ("num_attention_heads", HEADS), ("intermediate_size", FF), ("out_hidden_size", H)):
            if k in v:
                v[k] = value
        o["vision_config"] = v
    # A language model nested in `text_config` (Gemma 3) with no sizes at the top: shrunk alike.
    if isinstance(raw.get("text_config"), dict) and "hidden_size" not in raw:
        o["text_config"] = {**raw["text_config"], **tiny_overrides(raw["text_config"])}
    if isinstance(raw.get("rope_scaling"), dict) and raw["rope_scaling"].get("mrope_section"):
        o["rope_scaling"] = {**raw["rope_scaling"], "mrope_section": [2, 3, 3]}
    for k, v in raw.items():
        if k.endswith("_token_id") and isinstance(v, int) and v >= VOCAB:
            o[k] = 1
        if k.endswith("_token_id") and isinstance(v, list):
            o[k] = [x if x < VOCAB else 1 for x in v]
    return o


def save_tiny(raw, folder):
    """Saves a tiny random checkpoint of `raw`'s architecture and module tree to `folder`."""
    config, _ = common.make_config(raw, **tiny_overrides(raw))
    torch.manual_seed(0)
    common.model_class(raw)(config).save_pretrained(folder)


def make_inputs(raw):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, VOCAB, (1, 8), generator=g)
    kw = {"input_ids": ids}
    if raw["model_type"] == "t5":
        kw["decoder_input_ids"] = torch.randint(2, VOCAB, (1, 4), generator=g)
    return kw


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.msgs = []

    def emit(self, record):
        if len(self.msgs) < 5:
            self.msgs.append(record.getMessage()[:300])


def run_vramplan(args, out_path):
    cmd = [VRAMPLAN, *args, "-o", str(out_path)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return None, "timeout after 600 s"
    if p.returncode != 0 or not out_path.exists():
        return p.returncode, (p.stderr or p.stdout)[-600:]
    return p.returncode, None


def under_disk(name, disk_keys):
    return any(k == "" or name == k or name.startswith(k + ".") for k in disk_keys)


def _device_of(param, device_map):
    name = param
    while True:
        if name in device_map:
            return device_map[name]
        if name == "":
            return None
        name = name.rpartition(".")[0]


def tied_split(model, device_map):
    """Tied parameter groups of the loaded model whose members the ORIGINAL (un-remapped) map
    puts on different devices (the remap to cpu hides those from the load itself)."""
    from accelerate.utils import find_tied_parameters
    out = []
    try:
        groups = find_tied_parameters(model)
    except Exception:  # noqa: BLE001
        return None
    for g in groups:
        devs = {n: _device_of(n, device_map) for n in g}
        if len({str(v) for v in devs.values()}) > 1:
            out.append(sorted([n, d] for n, d in devs.items()))
    return sorted(out)


def run_case(naming, args):
    from pathlib import Path
    name = args[1]
    raw = common.load_raw_config(name)
    dtype_flag = args[args.index("--dtype") + 1] if "--dtype" in args else "fp32"
    dtype = DTYPES.get(dtype_flag, torch.float32)
    case = {"args": args, "naming": naming, "device_map": None, "loaded": False, "forward": False,
            "error": None, "meta_params_left": None}
    tmp = Path(tempfile.mkdtemp(prefix="vramplan-load-"))
    try:
        rc, perr = run_vramplan(args, tmp / "map.json")
        case["plan_exit"] = rc
        if perr is not None:
            case["plan_error"] = perr
            case["error"] = "vramplan plan wrote no map: " + perr[-250:]
            return case
        dm = json.loads((tmp / "map.json").read_text(), object_pairs_hook=list)
        case["device_map"] = [[k, v] for k, v in dm]
        remapped = {k: ("cpu" if isinstance(v, int) or (isinstance(v, str) and v not in ("cpu", "disk")) else v)
                    for k, v in dm}
        disk_keys = [k for k, v in remapped.items() if v == "disk"]

        config, _ = common.make_config(raw, **tiny_overrides(raw))
        cls = common.model_class(raw)
        torch.manual_seed(0)
        tiny = cls(config)
        tiny = tiny.to(dtype)
        folder = tmp / "tiny"
        tiny.save_pretrained(folder)
        del tiny
        cap = _Capture()
        loggers = [logging.getLogger("transformers"), logging.getLogger("accelerate")]
        for lg in loggers:
            lg.addHandler(cap)
        try:
            kw = {"device_map": remapped, "offload_folder": str(tmp / "offload")}
            kw[common.dtype_kw()] = dtype
            with warnings.catch_warnings(record=True) as pyw:
                warnings.simplefilter("always")
                try:
                    model = cls.from_pretrained(folder, **kw)
                finally:
                    for w in pyw:
                        if len(cap.msgs) < 5:
                            cap.msgs.append(f"{w.category.__name__}: {w.message}"[:300])
            case["loaded"] = True
        except Exception as e:  # noqa: BLE001
            case["error"] = common.err_str(e)
            case["traceback_tail"] = traceback.format_exc()[-1200:]
            return case
        finally:
            for lg in loggers:
                lg.removeHandler(cap)
            case["warnings"] = cap.msgs
        case["tied_split_in_original_map"] = tied_split(model, dict(dm))
        meta = [n for n, p in model.named_parameters() if p.device.type == "meta"]
        case["meta_params_left"] = [n for n in meta if not under_disk(n, disk_keys)]
        case["meta_params_on_disk"] = len(meta) - len(case["meta_params_left"])
        try:
            with torch.no_grad():
                model(**make_inputs(raw))
            case["forward"] = True
        except Exception as e:  # noqa: BLE001
            case["error"] = common.err_str(e)
            case["traceback_tail"] = traceback.format_exc()[-1200:]
        return case
    except Exception as e:  # noqa: BLE001
        case["error"] = case["error"] or common.err_str(e)
        case["traceback_tail"] = traceback.format_exc()[-1200:]
        return case
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv):
    cases = []
    t_all = time.time()
    for naming, args in CASES:
        if naming != common.TAG:
            continue
        if argv and not any(s in " ".join(args) for s in argv):
            continue
        t0 = time.time()
        r = run_case(naming, args)
        r["seconds"] = round(time.time() - t0, 1)
        cases.append(r)
        print(f"[{common.TAG}] {' '.join(args)}: loaded={r['loaded']} forward={r['forward']} "
              f"meta_left={len(r['meta_params_left'] or [])} "
              f"err={(r['error'] or '')[:160]} ({r['seconds']}s)", flush=True)
    try:
        rev = subprocess.run(["git", "-C", str(common.REPO), "rev-parse", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
    except Exception:  # noqa: BLE001
        rev = None
    try:
        mtime = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(os.path.getmtime(VRAMPLAN)))
    except OSError:
        mtime = None
    out = {"versions": common.versions(), "vramplan": VRAMPLAN, "vramplan_mtime": mtime, "repo_head": rev,
           "what": "vramplan plan -o map.json, tiny same-tree model, from_pretrained(device_map=map with GPUs->cpu); see scripts/reference/loads.py",
           "seconds": round(time.time() - t_all, 1), "cases": cases}
    path = common.FIXTURES / "loads" / f"{common.TAG}.json"
    if argv:
        path = path.with_name(f"{common.TAG}.partial.json")
    common.write_json(path, out, compact_lists={"cases"})
    print("wrote", path)


if __name__ == "__main__":
    main(sys.argv[1:])
