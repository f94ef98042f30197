"""Shared helpers for the reference scripts (models.py, maps.py, loads.py).

Nothing here records anything by itself: it loads vramplan's built-in model configs
(profiles/catalog/models/<name>.json, the published config.json files), builds the
transformers model they name on the meta device, and reports the library versions.
No network: HF_HUB_OFFLINE=1 is forced; nothing is downloaded from any hub.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

import copy
import json
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODELS_DIR = REPO / "profiles" / "catalog" / "models"
FIXTURES = REPO / "fixtures" / "reference"

import torch  # noqa: E402
import transformers  # noqa: E402

TF_MAJOR = int(transformers.__version__.split(".")[0])
TAG = "v5" if TF_MAJOR >= 5 else "v4"


def versions():
    out = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__}
    for mod in ("accelerate", "bitsandbytes", "peft", "safetensors"):
        try:
            m = __import__(mod)
            out[mod] = getattr(m, "__version__", "?")
        except Exception as e:  # noqa: BLE001
            out[mod] = f"unavailable: {type(e).__name__}: {e}"[:200]
    return out


def model_names():
    # A vision-language model's `NAME.preprocessor_config.json` sits beside its config.json.
    return sorted(p.stem for p in MODELS_DIR.glob("*.json") if not p.stem.endswith(".preprocessor_config"))


def load_raw_config(name):
    return json.loads((MODELS_DIR / f"{name}.json").read_text())


# The model-building code vramplan's `validate --backend torch` harness ships with, shared so
# that the reference fixtures and the validator build the same models from the same configs.
sys.path.insert(0, str(REPO / "validate" / "harness"))
from run_plan import make_config, model_class  # noqa: E402,F401


def dtype_kw():
    """transformers 5.x and 4.56+ take `dtype`; older 4.x `torch_dtype`."""
    import inspect
    from transformers import PreTrainedModel
    sig = inspect.signature(PreTrainedModel._from_config)
    return "dtype" if "dtype" in sig.parameters or TF_MAJOR >= 5 else "torch_dtype"


def build_meta(raw, dtype=torch.bfloat16, config=None):
    """Build the architectures[0] class from its config on the meta device, with `dtype` as the
    default dtype during construction (what from_pretrained(dtype=...) does), then tie weights
    as from_pretrained does."""
    if config is None:
        config, _ = make_config(raw)
    cls = model_class(raw)
    with torch.device("meta"):
        model = cls._from_config(config, **{dtype_kw(): dtype})
    try:
        model.tie_weights()
    except Exception:  # noqa: BLE001
        pass
    model.eval()
    return model


def dtype_name(dt):
    return str(dt).replace("torch.", "")


def write_json(path, obj, compact_lists=None):
    """Write JSON with one element per line for the top-level lists named in compact_lists."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    compact_lists = set(compact_lists or ())
    parts = []
    for k, v in obj.items():
        key = json.dumps(k)
        if k in compact_lists and isinstance(v, list):
            if not v:
                parts.append(f"{key}: []")
            else:
                inner = ",\n  ".join(json.dumps(x, separators=(",", ":")) for x in v)
                parts.append(f"{key}: [\n  {inner}\n ]")
        elif k in compact_lists and isinstance(v, dict):
            inner = ",\n  ".join(f"{json.dumps(kk)}: {json.dumps(vv, separators=(',', ':'))}"
                                 for kk, vv in v.items())
            parts.append(f"{key}: {{\n  {inner}\n }}")
        else:
            parts.append(f"{key}: {json.dumps(v, separators=(',', ':'))}")
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("{\n " + ",\n ".join(parts) + "\n}\n")
    tmp.replace(path)


def traced_record(config, trace, limit=3, echo=True):
    """`trace(config)` merged into the configuration, or the error it raised (its traceback to
    stderr), with the seconds it took; echoed to stderr as one JSON line unless `echo` is off.
    Every tracer script records its configurations through this."""
    import time
    import traceback

    start = time.time()
    try:
        record = {**config, **trace(config)}
    except Exception as e:  # noqa: BLE001
        traceback.print_exc(limit=limit)
        record = {**config, "error": err_str(e)}
    record["seconds"] = round(time.time() - start, 1)
    if echo:
        print(json.dumps(record, default=str), file=sys.stderr, flush=True)
    return record


def err_str(e, n=300):
    return f"{type(e).__name__}: {e}"[:n]


# ---------------------------------------------------------------------------------------------
# Building the model the way from_pretrained does (before any weight is read)
# ---------------------------------------------------------------------------------------------

def build_like_from_pretrained(raw, dtype, quantization_config=None, device_map="auto",
                               tie=None, config=None):
    """Replicates from_pretrained's model construction on the meta device for the installed
    transformers, up to (not including) `_get_device_map`:

    5.x: get_hf_quantizer (if a quantization_config is given) -> _get_dtype -> the model's own
         get_init_context(dtype, is_quantized, ...) (meta device, local default dtype,
         no_tie_weights) -> cls(config) -> hf_quantizer.preprocess_model(...) inside it.
         The model is NOT tied at that point (5.x ties after loading); tie=True ties it afterwards.
    4.x: get_hf_quantizer -> _get_dtype (sets torch's default dtype, restored by the caller via
         the returned `restore` callable) -> get_init_context (no_init_weights + accelerate's
         init_empty_weights: parameters on meta, buffers on CPU) -> cls(config) -> tie_weights()
         -> keep_in_fp32 regex -> hf_quantizer.preprocess_model(...).

    Returns dict(model, hf_quantizer, dtype, device_map, keep_in_fp32_regex, restore).
    """
    import transformers.modeling_utils as mu
    from transformers.utils.generic import ContextManagers
    if config is None:
        config, _ = make_config(raw)
    cls = model_class(raw)
    out = {"hf_quantizer": None, "keep_in_fp32_regex": None, "restore": lambda: None}
    if TF_MAJOR >= 5:
        from transformers.quantizers.auto import get_hf_quantizer
        hf_quantizer = None
        if quantization_config is not None:
            hf_quantizer, config, device_map = get_hf_quantizer(
                config, quantization_config, device_map, True, {})
        config, dtype = mu._get_dtype(dtype, None, config, None, None, True, hf_quantizer)
        ctx = cls.get_init_context(dtype, hf_quantizer is not None, False, False)
        config = copy.deepcopy(config)
        with ContextManagers(ctx):
            model = cls(config)
            if hf_quantizer is not None:
                hf_quantizer.preprocess_model(model=model, dtype=dtype, device_map=device_map,
                                              checkpoint_files=None, use_kernels=False)
        if tie:
            model.tie_weights()
        out.update(model=model, hf_quantizer=hf_quantizer, dtype=dtype, device_map=device_map)
        return out
    # ---- 4.x
    import re
    from transformers.quantizers.auto import get_hf_quantizer
    hf_quantizer = None
    if quantization_config is not None:
        hf_quantizer, config, dtype, device_map = get_hf_quantizer(
            config, quantization_config, dtype, False, False, device_map, True, {})
    config, dtype, dtype_orig = mu._get_dtype(cls, dtype, None, config, None, None, True)
    out["restore"] = (lambda: torch.set_default_dtype(dtype_orig)) if dtype_orig is not None else (lambda: None)
    ctx = cls.get_init_context(hf_quantizer is not None, False)
    config = copy.deepcopy(config)
    with ContextManagers(ctx):
        model = cls(config)
    model.tie_weights()
    config = model.config
    keep = []
    if model._keep_in_fp32_modules is not None and (
            dtype == torch.float16 or getattr(hf_quantizer, "use_keep_in_fp32_modules", False)):
        keep.extend(model._keep_in_fp32_modules)
    if model._keep_in_fp32_modules_strict is not None and dtype in (torch.float16, torch.bfloat16):
        keep.extend(model._keep_in_fp32_modules_strict)
    regex = re.compile("|".join([rf"((^|\.){m}($|\.))" for m in keep])) if keep else None
    if hf_quantizer is not None:
        hf_quantizer.preprocess_model(model=model, device_map=device_map,
                                      keep_in_fp32_modules=model._keep_in_fp32_modules,
                                      config=config, use_kernels=False)
        config._pre_quantization_dtype = dtype
    out.update(model=model, hf_quantizer=hf_quantizer, dtype=dtype, device_map=device_map,
               keep_in_fp32_regex=regex)
    return out


# ---------------------------------------------------------------------------------------------
# Simulated GPUs
# ---------------------------------------------------------------------------------------------

class _Props:
    def __init__(self, i, total):
        self.name = f"Simulated GPU {i}"
        self.total_memory = total
        self.is_integrated = False
        self.major, self.minor = 8, 0
        self.multi_processor_count = 100


class simulated_gpus:
    """Context manager: makes torch/accelerate/psutil report `len(free)` CUDA GPUs with
    free[i] free bytes each and `cpu_available` bytes of available host RAM.

    Patched (restored on exit): torch.cuda.is_available -> True, torch.cuda.device_count -> N,
    torch.cuda.mem_get_info(i) -> (free[i], free[i]), torch.cuda.get_device_properties(i) ->
    an object with total_memory=free[i], is_integrated=False, torch.cuda.memory_reserved /
    memory_allocated -> 0, torch.cuda.current_device -> 0, psutil.virtual_memory().available ->
    cpu_available, and torch.tensor(..., device=<int or 'cuda...'>) -> created on 'meta'
    (accelerate's get_max_memory touches each device with torch.tensor([0], device=i)).
    Also: transformers.integrations.bitsandbytes.validate_bnb_backend_availability -> no-op
    (it needs a real CUDA build of bitsandbytes' kernels); nothing else of the quantizer's
    validation is bypassed.
    """

    def __init__(self, free, cpu_available):
        self.free = [int(x) for x in free]
        self.cpu = int(cpu_available)
        self._saved = []

    def _patch(self, obj, name, val):
        self._saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, val)

    def __enter__(self):
        import psutil
        free, cpu = self.free, self.cpu
        real_tensor = torch.tensor
        real_vm = psutil.virtual_memory

        def idx(i):
            if i is None:
                return 0
            if isinstance(i, torch.device):
                return i.index or 0
            if isinstance(i, str):
                return int(i.split(":")[1]) if ":" in i else 0
            return int(i)

        def tensor(*a, **k):
            d = k.get("device")
            if isinstance(d, int) or (isinstance(d, str) and d.startswith("cuda")) or (
                    isinstance(d, torch.device) and d.type == "cuda"):
                k["device"] = "meta"
            return real_tensor(*a, **k)

        class VM:
            def __init__(self):
                r = real_vm()
                self.total = max(r.total, cpu)
                self.available = cpu
                self.percent = r.percent
                self.used = r.used
                self.free = cpu

        self._patch(torch.cuda, "is_available", lambda: True)
        self._patch(torch.cuda, "device_count", lambda: len(free))
        self._patch(torch.cuda, "mem_get_info", lambda i=None: (free[idx(i)], free[idx(i)]))
        self._patch(torch.cuda, "get_device_properties", lambda i=None: _Props(idx(i), free[idx(i)]))
        self._patch(torch.cuda, "memory_reserved", lambda i=None: 0)
        self._patch(torch.cuda, "memory_allocated", lambda i=None: 0)
        self._patch(torch.cuda, "current_device", lambda: 0)
        self._patch(torch, "tensor", tensor)
        self._patch(psutil, "virtual_memory", VM)
        try:
            import transformers.integrations.bitsandbytes as tib
            self._patch(tib, "validate_bnb_backend_availability", lambda *a, **k: True)
            import transformers.integrations as ti
            if hasattr(ti, "validate_bnb_backend_availability"):
                self._patch(ti, "validate_bnb_backend_availability", lambda *a, **k: True)
        except Exception:  # noqa: BLE001
            pass
        return self

    def __exit__(self, *exc):
        for obj, name, val in reversed(self._saved):
            setattr(obj, name, val)
        self._saved = []
        return False


def write_fixture(path, document):
    """Writes `document` as indented JSON to `path`, atomically (a temporary file renamed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = str(path) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(document, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
