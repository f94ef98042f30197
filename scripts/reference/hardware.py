"""Resolves a vramplan hardware name (built-in profile such as `t4x2`, `rtx4090-x4`, or a short
form such as `2xa100-40gb`) into what the simulated machine reports: per-GPU free bytes
(vramplan's usable memory: nvidia-smi total - driver_reserve - context_reserve, what
torch.cuda.mem_get_info returns in a fresh PyTorch process) and available host RAM (the
profile's host RAM, else 64 GiB). Records nothing by itself.

Source: `$VRAMPLAN profiles show <hw>` (the resolved profile, YAML, exact reserves) when the
binary exists, else profiles/catalog/hardware/*.yaml with the same arithmetic.
"""

import os
import re
import subprocess
from pathlib import Path

import yaml

from common import REPO

HW_DIR = REPO / "profiles" / "catalog" / "hardware"
GIB = 1 << 30
DEFAULT_CPU = 64 * GIB
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}


def parse_bytes(s):
    if isinstance(s, (int, float)):
        return int(s)
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", str(s))
    return int(round(float(m.group(1)) * _UNITS[m.group(2).upper()]))


def _catalog():
    return yaml.safe_load((HW_DIR / "gpus.yaml").read_text())


def _gpu_usable(key, overrides=None):
    cat = _catalog()
    g = dict(cat["gpus"][key])
    g.update(overrides or {})
    gen = None
    for gname, gv in cat["generations"].items():
        ccs = gv.get("compute_capabilities", [])
        if str(g.get("compute_capability", "")) in ccs or g.get("generation") == gname:
            gen = gv
    gen = gen or {}
    driver = parse_bytes(g.get("driver_reserve", gen.get("driver_reserve")))
    context = parse_bytes(g.get("context_reserve", gen.get("context_reserve")))
    return parse_bytes(g["memory"]) - driver - context


def _from_yaml(hw):
    path = HW_DIR / f"{hw}.yaml"
    if path.exists():
        prof = yaml.safe_load(path.read_text())
        free = []
        for d in prof["devices"]:
            over = {k: v for k, v in d.items() if k not in ("gpu", "count")}
            free += [_gpu_usable(d["gpu"], over)] * int(d.get("count", 1))
        ram = (prof.get("host") or {}).get("ram")
        return free, parse_bytes(ram) if ram else DEFAULT_CPU
    m = re.fullmatch(r"(\d+)x(.+)", hw)
    if m:
        return [_gpu_usable(m.group(2))] * int(m.group(1)), DEFAULT_CPU
    return [_gpu_usable(hw)], DEFAULT_CPU


def _from_binary(hw):
    """`vramplan profiles show <hw>` prints the resolved profile as YAML with every device's
    memory, driver_reserve and context_reserve spelled out (and host ram when known)."""
    exe = os.environ.get("VRAMPLAN", str(REPO / "target" / "debug" / "vramplan"))
    if not Path(exe).exists():
        return None
    try:
        out = subprocess.run([exe, "profiles", "show", hw], capture_output=True, text=True,
                             timeout=60, check=True).stdout
        prof = yaml.safe_load(out)
        free = []
        for d in prof["devices"]:
            usable = (parse_bytes(d["memory"]) - parse_bytes(d["driver_reserve"])
                      - parse_bytes(d["context_reserve"]))
            free += [usable] * int(d.get("count", 1))
        ram = (prof.get("host") or {}).get("ram")
        return free, (parse_bytes(ram) if ram else DEFAULT_CPU)
    except Exception:  # noqa: BLE001
        return None


def resolve(hw):
    got = _from_binary(hw)
    if got is not None:
        free, cpu = got
        res = {"gpus_free_bytes": free, "cpu_available_bytes": cpu, "source": "vramplan profiles show"}
        yfree, ycpu = _from_yaml(hw)
        if (yfree, ycpu) != (free, cpu):
            res["catalog_yaml_disagrees"] = {"gpus_free_bytes": yfree, "cpu_available_bytes": ycpu}
        return res
    free, cpu = _from_yaml(hw)
    return {"gpus_free_bytes": free, "cpu_available_bytes": cpu, "source": "catalog yaml"}


if __name__ == "__main__":
    import sys
    for h in sys.argv[1:]:
        print(h, resolve(h))
