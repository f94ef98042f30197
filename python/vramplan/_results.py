"""What the functions return: each result holds the JSON the command's `--json` prints (`.data`,
`.to_json()`), the command's exit code, and names for what users reach for (`Plan.device_map`,
`.fits`, `.devices`, `.load_kwargs`). In Jupyter a plan or an estimate shows itself as a table
of its devices with its drawing (inline SVG)."""

from __future__ import annotations

import html
import json
from typing import Any, Dict, List, Optional, Sequence

from ._errors import BadInput

__all__ = ["Result", "Plan", "Estimate", "Check", "WhatIf", "Validation", "Inspection", "Svg"]


def _bytes(n: Optional[float]) -> str:
    """Bytes in binary units, as the command line prints them."""
    if n is None:
        return "—"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"


class Svg:
    """An SVG drawing: `.data` is its text; Jupyter shows it inline."""

    def __init__(self, data: str) -> None:
        self.data = data

    def _repr_svg_(self) -> str:
        return self.data

    def save(self, path: str) -> None:
        """Writes the drawing to `path`."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.data)


class Result:
    """A command's answer: `.data` (the `--json` output, parsed), `.exit_code` (the command
    line's: 0 yes, 1 a proven no, 4 no answer in the time given) and `.argv` (the command line it
    ran, without the program name)."""

    def __init__(self, data: Any, exit_code: int, argv: Sequence[str], model: Any, raw: Optional[str] = None) -> None:
        self.data = data
        self.exit_code = exit_code
        self.argv = list(argv)
        self._model = model
        self._raw = raw

    def to_json(self) -> str:
        """The JSON the command line's `--json` prints for the same input, byte for byte."""
        return self._raw if self._raw is not None else json.dumps(self.data, indent=2)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of `vramplan {' '.join(self.argv[:2])}`: exit {self.exit_code}>"

    def _drawing(self, kind: str) -> str:
        """The inline SVG of `plot KIND` for the same model and flags, or nothing where it
        cannot be drawn."""
        from ._api import run

        if self._model is None or len(self.argv) < 2:
            return ""
        try:
            import tempfile, os  # noqa: E401

            from ._model import describe

            spec, native = describe(self._model)
            flags = [a for a in self.argv[2:] if a != "--json"]
            flags = _without(flags, ("--device-map", "-o", "--output", "--format"))
            handle, path = tempfile.mkstemp(suffix=".svg")
            os.close(handle)
            try:
                run(["plot", kind, spec, "-o", path] + flags, native)
                with open(path, encoding="utf-8") as f:
                    return f.read()
            finally:
                os.unlink(path)
        except Exception:  # noqa: BLE001 - a table without its drawing is still the answer
            return ""


def _without(args: List[str], flags: Sequence[str]) -> List[str]:
    """`args` less each of `flags` and its value."""
    out: List[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in flags:
            skip = True
            continue
        out.append(a)
    return out


def _device_table(rows: List[List[str]], head: List[str], caption: str) -> str:
    cells = "".join(f"<th style='text-align:right;padding:2px 10px'>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td style='text-align:right;padding:2px 10px'>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><caption>{html.escape(caption)}</caption><tr>{cells}</tr>{body}</table>"


class Plan(Result):
    """`vramplan plan`'s answer."""

    @property
    def fits(self) -> bool:
        """Whether the plan fits every device (the command line exits 0)."""
        return self.data.get("verdict") == "fits"

    @property
    def device_map(self) -> Dict[str, Any]:
        """The accelerate device map, in the plan's order: `from_pretrained(device_map=...)`
        takes it as it is (GPU indexes, `"cpu"`, `"disk"`)."""
        return dict(self.data.get("device_map") or {})

    @property
    def devices(self) -> List[Dict[str, Any]]:
        """Per device: what it holds and the figures `--json` has (the estimate's peaks and
        components, the limit, the share used)."""
        return list(self.data.get("devices") or [])

    @property
    def baseline(self) -> Optional["Plan"]:
        """accelerate's `device_map="auto"` for the same input, as a plan."""
        base = self.data.get("baseline")
        return Plan(base, 0 if base and base.get("verdict") == "fits" else 1, self.argv, self._model) if base else None

    @property
    def loaded_by(self) -> Optional[Dict[str, str]]:
        """Where a program other than transformers loads the model (`trainer="torchtune"`,
        `"unsloth"`, `"litgpt"`, `"fsdp-qlora"`; AutoAWQ under `awq_fused`): `{"program": ...,
        "reason": ...}`, and `.load_kwargs` raises; `None` where transformers loads it."""
        return self.data.get("loaded_by")

    @property
    def load_kwargs(self) -> Dict[str, Any]:
        """The other `from_pretrained` arguments that load the map as it is: `dtype`, a
        `quantization_config` (bitsandbytes; fp8 onto GPUs), `offload_folder` where a module is
        on disk. For
        AWQ and GPTQ they load a checkpoint quantized that way, not the model's own repository
        (`.data["load_kwargs"]["prequantized"]` names the method). Raises `ValueError` where
        another program loads the model (`.loaded_by`): `BadInput` (a `VramplanError` and a
        `ValueError`) with `origin` `--trainer` or `--awq-fused`. torch and transformers are
        imported only when this is read."""
        loaded_by = self.loaded_by
        if loaded_by:
            program = loaded_by["program"]
            flag = "--awq-fused" if program == "AutoAWQ" else "--trainer"
            raise BadInput(
                problem=f"{program} loads this model, not transformers' from_pretrained: {loaded_by['reason']}",
                origin=flag,
                key=flag.lstrip("-").replace("-", "_"),
                fix=f"load it with {program}'s own loader (see .loaded_by), or plan for transformers without {flag}",
            )
        spec = self.data.get("load_kwargs") or {}
        out: Dict[str, Any] = {}
        if spec.get("dtype"):
            import torch

            out["dtype"] = getattr(torch, spec["dtype"])
        quant = spec.get("quantization_config")
        if quant:
            import transformers

            out["quantization_config"] = getattr(transformers, quant["class"])(**quant["kwargs"])
        if spec.get("offload_folder"):
            out["offload_folder"] = spec["offload_folder"]
        return out

    def _repr_html_(self) -> str:
        rows = []
        for d in self.devices:
            e = d.get("estimate") or {}
            c = e.get("components") or {}
            rows.append(
                [
                    str(d.get("name", d.get("device"))),
                    str(len(d.get("units") or [])),
                    _bytes(c.get("weights")),
                    _bytes(c.get("activations")),
                    _bytes(c.get("kv_cache")),
                    _bytes(e.get("peak_reserved_bytes")),
                    _bytes(d.get("limit_bytes")),
                    f"{100 * d['utilisation']:.1f}%" if d.get("utilisation") is not None else "—",
                ]
            )
        head = ["device", "modules", "weights", "activations", "KV cache", "peak reserved", "limit", "used"]
        caption = f"plan for {self.data.get('target', '')}: {self.data.get('verdict', '')}"
        return _device_table(rows, head, caption) + self._drawing("plan")


class Estimate(Result):
    """`vramplan estimate`'s answer."""

    @property
    def fits(self) -> bool:
        """Whether the step fits every device."""
        return bool(self.data.get("fits"))

    @property
    def devices(self) -> List[Dict[str, Any]]:
        """Per device: peaks (allocated, reserved, nvidia-smi's used), where the peak is, and
        the components at the peak."""
        return list(self.data.get("devices") or [])

    @property
    def peak_bytes(self) -> int:
        """The largest peak over the devices, in bytes."""
        return int(self.data.get("peak_bytes") or 0)

    def _repr_html_(self) -> str:
        rows = []
        for e in self.devices:
            c = e.get("components") or {}
            rows.append(
                [
                    f"GPU {e.get('id')} ({e.get('name')})",
                    _bytes(c.get("weights")),
                    _bytes(c.get("activations")),
                    _bytes(c.get("kv_cache")),
                    _bytes(e.get("peak_allocated_bytes")),
                    _bytes(e.get("peak_reserved_bytes")),
                    _bytes(e.get("usable_bytes")),
                    "fits" if e.get("fits") else "OOM",
                ]
            )
        head = ["device", "weights", "activations", "KV cache", "peak allocated", "peak reserved", "usable", ""]
        caption = "estimate: fits" if self.fits else "estimate: does not fit"
        return _device_table(rows, head, caption) + self._drawing("breakdown")


class Check(Result):
    """`vramplan check`'s answer."""

    @property
    def ok(self) -> bool:
        """Whether the map fits and the runtime hits no device mismatch (exit 0)."""
        return self.exit_code == 0


class WhatIf(Result):
    """`vramplan whatif`'s answer: for `max-batch`, `max-seq`, `max-concurrency` and `min-gpus`,
    `.quantity` and `.value` (None where nothing fits); the other questions' answers are in
    `.data` as `--json` gives them."""

    @property
    def quantity(self) -> Optional[str]:
        """What the question asked for (`batch`, `seq`, …)."""
        return self.data.get("quantity") if isinstance(self.data, dict) else None

    @property
    def value(self) -> Any:
        """The answer (the largest batch that fits, …), or None."""
        return self.data.get("value") if isinstance(self.data, dict) else None

    @property
    def fits(self) -> bool:
        """Whether the answer's configuration fits."""
        fit = self.data.get("fit") if isinstance(self.data, dict) else None
        return bool(fit and fit.get("fits"))


class Validation(Result):
    """`vramplan validate`'s answer (or `validate --script`'s)."""

    @property
    def ok(self) -> bool:
        """Whether the run completed as predicted (exit 0)."""
        return self.exit_code == 0


class Inspection(Result):
    """`vramplan inspect`'s answer."""

    @property
    def params(self) -> int:
        """Parameters, tied ones once."""
        return int(self.data.get("params") or 0)
