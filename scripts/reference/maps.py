"""Records the device_map that `from_pretrained(..., device_map="auto")` really produces, with
no max_memory, on simulated GPU machines, for the installed transformers (5.x or 4.x).

What runs is transformers' own code, on the meta model built the way from_pretrained builds it
(common.build_like_from_pretrained: get_hf_quantizer -> _get_dtype -> get_init_context ->
cls(config) -> [4.x: tie_weights] -> hf_quantizer.preprocess_model, i.e. bitsandbytes'
replace_with_bnb_linear on meta), then:
  5.x: transformers.integrations.accelerate._get_device_map(model, "auto", None, hf_quantizer)
       (get_balanced_memory -> hf_quantizer.adjust_max_memory -> infer_auto_device_map, all
       transformers' own copies; the model is untied at that point, ties come from
       model.all_tied_weights_keys)
  4.x: transformers.modeling_utils._get_device_map(model, "auto", None, hf_quantizer, dtype,
       keep_in_fp32_regex) (accelerate's get_balanced_memory + infer_auto_device_map)
nf4: BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
     bnb_4bit_compute_dtype=<case dtype>) through transformers' real Bnb4BitHfQuantizer.

Patched (see common.simulated_gpus, active during the build and the map): torch.cuda.is_available,
device_count, mem_get_info (free = the case's gpus_free_bytes), get_device_properties,
memory_reserved/memory_allocated (0), current_device; psutil.virtual_memory().available
(= cpu_available_bytes); torch.tensor(device=<cuda index>) is created on meta instead;
transformers.integrations(.bitsandbytes).validate_bnb_backend_availability is a no-op (it needs
bitsandbytes' CUDA kernels). The quantizer's own check that rejects cpu/disk in the map for
4-bit without llm_int8_enable_fp32_cpu_offload is NOT bypassed: from_pretrained raises it after
computing the map; the map (captured from infer_auto_device_map) is recorded with that error in
"validate_error".

Simulated free bytes per GPU = the hardware profile's per-GPU memory as vramplan models it
(nvidia-smi total - driver_reserve - context_reserve), read from
`target/debug/vramplan profiles show <hw>` when the binary exists, else from
profiles/catalog/hardware/*.yaml with the same arithmetic ("free_source" says which).
CPU available = the profile's host RAM if it has one, else 64 GiB.

Writes fixtures/reference/maps/<v5|v4>.json: {"versions": ..., "cases": [...]}; each case:
  model, hardware, dtype, quant, gpus_free_bytes, cpu_available_bytes,
  max_memory_used (the max_memory infer_auto_device_map was finally given),
  device_map ([[module, device], ...] in dict order), validate_error, error.
"""

import functools
import sys
import time
import traceback

import common
from common import torch
import hardware

# (model, hardware, dtype, quant). Add cases here; the same list runs in v4 and v5.
CASES = [
    ("llama-3-8b", "t4", "float16", "none"),
    ("llama-3-8b", "t4x2", "float16", "none"),
    ("llama-3-8b", "rtx4090", "bfloat16", "none"),
    ("llama-3-8b", "t4", "float16", "nf4"),
    ("llama-3-70b", "h100-80gb-x8", "bfloat16", "none"),
    ("llama-3.1-405b", "h100-80gb-x8", "bfloat16", "none"),
    ("llama-3.2-1b", "t4x2", "float16", "none"),
    ("codellama-34b", "2xa100-40gb", "float16", "nf4"),
    ("mistral-7b", "rtx4090-x4", "float16", "nf4"),
    ("gemma-2-9b", "t4x2", "float16", "none"),
    ("gemma-2-9b", "rtx4090", "bfloat16", "none"),
    ("gemma-2-27b", "2xa100-40gb", "bfloat16", "none"),
    ("qwen2.5-7b", "t4", "float16", "none"),
    ("qwen2.5-7b", "t4x2", "float16", "nf4"),
    ("qwen2.5-0.5b", "t4x2", "float16", "none"),
    ("qwen2.5-72b", "a100-80gb-x4", "bfloat16", "nf4"),
    ("qwen3-8b", "rtx4090", "bfloat16", "none"),
    ("qwen3-30b-a3b", "2xa100-40gb", "bfloat16", "none"),
    ("qwen3-30b-a3b", "rtx4090-x4", "bfloat16", "nf4"),
    ("qwen1.5-moe-a2.7b", "t4x2", "float16", "none"),
    ("mixtral-8x7b", "a100-80gb-x4", "bfloat16", "none"),
    ("mixtral-8x7b", "rtx4090", "float16", "none"),
    ("mixtral-8x7b", "t4x2", "float16", "nf4"),
    ("mixtral-8x7b", "rtx4090-x4", "float16", "nf4"),
    ("deepseek-v2-lite", "rtx4090", "bfloat16", "none"),
    ("deepseek-v2-lite", "t4x2", "float16", "nf4"),
    ("deepseek-v3", "h100-80gb-x8", "bfloat16", "none"),
    ("olmoe-1b-7b", "t4", "float16", "none"),
    ("gpt-oss-20b", "rtx4090", "bfloat16", "none"),
    ("phi-2", "t4", "float16", "none"),
    ("phi-2", "t4x2", "float16", "none"),
    ("phi-3-mini", "t4", "float16", "nf4"),
    ("pythia-2.8b", "t4", "float16", "none"),
    ("pythia-2.8b", "t4x2", "float16", "none"),
    ("gpt2", "t4x2", "float16", "none"),
    ("starcoder", "t4x2", "float16", "nf4"),
    ("opt-6.7b", "t4", "float16", "none"),
    ("opt-6.7b", "t4x2", "float16", "nf4"),
    ("falcon-7b", "t4x2", "float16", "none"),
    ("bloom-7b1", "rtx4090", "bfloat16", "none"),
    ("t5-base", "t4", "float16", "none"),
    ("t5-base", "t4x2", "float16", "none"),
    ("t0-3b", "t4x2", "float16", "none"),
    ("bert-base-uncased", "t4", "float16", "none"),
    ("bert-base-uncased", "t4x2", "float16", "none"),
    ("xlnet-base-cased", "t4x2", "float16", "none"),
]


def _capture_target():
    if common.TF_MAJOR >= 5:
        import transformers.integrations.accelerate as mod
    else:
        import transformers.modeling_utils as mod
    return mod


def run_case(model_name, hw, dtype_name, quant):
    raw = common.load_raw_config(model_name)
    hwinfo = hardware.resolve(hw)
    free, cpu = hwinfo["gpus_free_bytes"], hwinfo["cpu_available_bytes"]
    case = {"model": model_name, "hardware": hw, "dtype": dtype_name, "quant": quant,
            "gpus_free_bytes": free, "cpu_available_bytes": cpu,
            "free_source": hwinfo["source"]}
    if "quantization_config" in raw:
        case["note"] = f"config's quantization_config ({raw['quantization_config'].get('quant_method')}) stripped"
    dtype = getattr(torch, dtype_name)
    qc = None
    if quant == "nf4":
        from transformers import BitsAndBytesConfig
        qc = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype)
    mod = _capture_target()
    captured = {}
    real_infer = mod.infer_auto_device_map

    # `functools.wraps` keeps the real signature: 4.57's `_get_device_map` passes
    # `special_dtypes` only when `inspect.signature(infer_auto_device_map)` lists it.
    @functools.wraps(real_infer)
    def infer(model, *a, **k):
        mm = k.get("max_memory")
        captured["max_memory"] = {str(kk): int(vv) for kk, vv in (mm or {}).items()}
        dm = real_infer(model, *a, **k)
        captured["device_map"] = [[kk, vv if isinstance(vv, (int, str)) else str(vv)] for kk, vv in dm.items()]
        return dm

    built = None
    with common.simulated_gpus(free, cpu):
        mod.infer_auto_device_map = infer
        try:
            built = common.build_like_from_pretrained(raw, dtype, quantization_config=qc, device_map="auto")
            if common.TF_MAJOR >= 5:
                mod._get_device_map(built["model"], built["device_map"], None, built["hf_quantizer"])
            else:
                mod._get_device_map(built["model"], built["device_map"], None, built["hf_quantizer"],
                                    built["dtype"], built["keep_in_fp32_regex"])
            case["validate_error"] = None
            case["error"] = None
        except Exception as e:  # noqa: BLE001
            if "device_map" in captured:
                case["validate_error"] = common.err_str(e)
                case["error"] = None
            else:
                case["validate_error"] = None
                case["error"] = common.err_str(e, 1000)
                case["traceback_tail"] = traceback.format_exc()[-1500:]
        finally:
            mod.infer_auto_device_map = real_infer
            if built is not None:
                built["restore"]()
    case["max_memory_used"] = captured.get("max_memory")
    case["device_map"] = captured.get("device_map")
    return case


def main(argv):
    only = set(argv)
    cases = []
    t_all = time.time()
    for c in CASES:
        if only and c[0] not in only:
            continue
        t0 = time.time()
        r = run_case(*c)
        r["seconds"] = round(time.time() - t0, 1)
        cases.append(r)
        devs = sorted({str(v) for _, v in (r["device_map"] or [])})
        print(f"[{common.TAG}] {c}: {len(r['device_map'] or [])} entries on {devs}"
              f"{' VALIDATE: ' + r['validate_error'][:80] if r['validate_error'] else ''}"
              f"{' ERROR: ' + r['error'][:200] if r['error'] else ''} ({r['seconds']}s)", flush=True)
    out = {"versions": common.versions(),
           "what": "device_map='auto' without max_memory, simulated GPUs; see scripts/reference/maps.py",
           "seconds": round(time.time() - t_all, 1),
           "cases": cases}
    path = common.FIXTURES / "maps" / f"{common.TAG}.json"
    if only:
        path = path.with_name(f"{common.TAG}.partial.json")
    common.write_json(path, out, compact_lists={"cases"})
    print("wrote", path)


if __name__ == "__main__":
    main(sys.argv[1:])
