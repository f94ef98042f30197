"""The functions: one per command, keyword for flag. Each builds the command line the CLI would
take (`plan(model, hardware="t4x2", lora_rank=16)` is `vramplan plan MODEL --hardware t4x2
--lora-rank 16 --json`), and the native module parses it with the CLI's own parser and runs the
same library functions, with the GIL released; an in-memory model (a config or a module) takes
the place of MODEL. So every answer is the one `--json` gives, byte for byte."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from . import _vramplan as _native
from ._errors import BadInput, InternalError
from ._model import describe
from ._results import Check, Estimate, Inspection, Plan, Svg, Validation, WhatIf

__all__ = [
    "plan",
    "estimate",
    "check",
    "whatif",
    "validate",
    "validate_script",
    "inspect",
    "plot",
    "profiles",
    "run",
]

# `plan` and `whatif` stop after this many seconds unless given `time_limit=` (the command
# line's default, `DEFAULT_TIME_LIMIT_S` in api/src/plan.rs): the best answer found by then,
# with its gap, and exit code 4 where the limit cut it short.
DEFAULT_TIME_LIMIT_S = 60.0

# Flags whose value is a switch word rather than on/off: True and False are spelled out.
_SWITCH_WORDS = {"grad_ckpt": ("full", "off")}
# Flags given once per value (`--pin a=0 --pin b=1`); other lists are comma-joined.
_REPEATED = {"pin"}


def _flag_args(flags: Mapping[str, Any]) -> List[str]:
    """`lora_rank=16` → `--lora-rank 16`; True → the bare flag; False and None → nothing (a
    switch word where the flag takes one: `grad_ckpt=True` → `--grad-ckpt full`)."""
    out: List[str] = []
    for key, value in flags.items():
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if key in _SWITCH_WORDS and isinstance(value, bool):
            out += [flag, _SWITCH_WORDS[key][0] if value else _SWITCH_WORDS[key][1]]
        elif isinstance(value, bool):
            if value:
                out.append(flag)
        elif isinstance(value, (list, tuple)):
            if key in _REPEATED:
                for item in value:
                    out += [flag, str(item)]
            else:
                out += [flag, ",".join(str(v) for v in value)]
        elif isinstance(value, os.PathLike):
            out += [flag, os.fspath(value)]
        else:
            out += [flag, str(value)]
    return out


def run(argv: Sequence[str], model: Optional[Dict[str, Optional[str]]] = None) -> Tuple[int, str]:
    """Runs a command line (without the program name) through the native module: its exit code
    and what it printed. Bad input raises `BadInput`; a panic raises `InternalError`."""
    code, out, error = _native.call([str(a) for a in argv], model)
    if error is not None:
        kind = error.pop("kind", "input")
        if kind == "internal":
            raise InternalError(error.get("problem", "vramplan failed"))
        if error.get("origin") == "command line":
            # A flag the parser refused is a keyword here: `'--lora-rnak'` → `lora_rnak=`.
            for key in ("problem", "fix"):
                if error.get(key):
                    error[key] = _keywords(error[key])
            error["origin"] = "arguments"
        raise BadInput(**error)
    return code, out


def _keywords(text: str) -> str:
    """The command line's flags in `text` as this package's keywords (`'--lora-rank'` →
    `lora_rank=`)."""
    import re

    return re.sub(r"'--([a-z0-9-]+)'", lambda m: m.group(1).replace("-", "_") + "=", text)


def _json(
    before: List[str], model_argument: Any, after: List[str], flags: Mapping[str, Any]
) -> Tuple[int, Any, List[str], str]:
    """Runs `BEFORE MODEL AFTER flags --json` (`plan MODEL --hardware HW`, `whatif QUESTION
    MODEL`, `check MAP MODEL --hardware HW`); the exit code, the parsed JSON, the argv and the
    text."""
    spec, native = describe(model_argument)
    argv = before + [spec] + after + _flag_args(flags) + ["--json"]
    code, out = run(argv, native)
    try:
        return code, json.loads(out), argv, out
    except ValueError as e:  # pragma: no cover - the CLI's --json is always JSON
        raise InternalError(f"`{' '.join(argv)}` printed no JSON: {e}") from e


def _map_file(device_map: Union[Mapping[str, Any], str, os.PathLike]) -> Tuple[str, Optional[str]]:
    """A device map as a file the command line reads: a path as it is, a dict written to a
    temporary file (returned second, to be removed)."""
    if isinstance(device_map, (str, os.PathLike)):
        return os.fspath(device_map), None
    handle, path = tempfile.mkstemp(prefix="vramplan-map-", suffix=".json")
    with os.fdopen(handle, "w") as f:
        json.dump(dict(device_map), f)
    return path, path


def plan(model: Any, hardware: str, *, time_limit: float = DEFAULT_TIME_LIMIT_S, **flags: Any) -> Plan:
    """Places `model` on `hardware` for the workload the flags give (`vramplan plan`): an exact
    ILP, with accelerate's `device_map="auto"` beside it as the baseline. Keywords are the
    flags (`mode="train"`, `lora_rank=16`, `grad_ckpt=True`, `batch=2`, `seq=2048`,
    `quant="nf4"`, `target="accelerate-v4"`, `pin=["lm_head=0"]`, `time_limit=10`). Returns a
    `Plan` (`.fits`, `.device_map`, `.devices`, `.load_kwargs`, `.to_json()`); one that does
    not fit says so in `.fits` rather than raising. `time_limit` bounds the whole call (60 s by
    default)."""
    flags = {**flags, "time_limit": time_limit}
    code, data, argv, out = _json(["plan"], model, ["--hardware", hardware], flags)
    return Plan(data, code, argv, model, out)


def estimate(
    model: Any,
    hardware: str,
    device_map: Optional[Union[Mapping[str, Any], str, os.PathLike]] = None,
    **flags: Any,
) -> Estimate:
    """Simulates one step of the workload (`vramplan estimate`): per-device peaks and where the
    memory goes. `device_map` (a dict or a JSON file) places the model; without one, everything
    on GPU 0 (or one copy split evenly over the GPUs)."""
    removed = None
    if device_map is not None:
        path, removed = _map_file(device_map)
        flags = {**flags, "device_map": path}
    try:
        code, data, argv, out = _json(["estimate"], model, ["--hardware", hardware], flags)
    finally:
        if removed:
            os.unlink(removed)
    return Estimate(data, code, argv, model, out)


def check(device_map: Union[Mapping[str, Any], str, os.PathLike], model: Any, hardware: str, **flags: Any) -> Check:
    """Checks a device map (`vramplan check`): per-device memory and the device mismatches the
    target runtime would hit."""
    path, removed = _map_file(device_map)
    try:
        code, data, argv, out = _json(["check", path], model, ["--hardware", hardware], flags)
    finally:
        if removed:
            os.unlink(removed)
    return Check(data, code, argv, model, out)


def whatif(
    question: str,
    model: Any,
    hardware: Optional[str] = None,
    *,
    time_limit: float = DEFAULT_TIME_LIMIT_S,
    **flags: Any,
) -> WhatIf:
    """Capacity planning backwards (`vramplan whatif QUESTION`): `"max-batch"`, `"max-seq"`,
    `"max-concurrency"`, `"min-gpus"`, `"cheapest"`, `"best-precision"`, `"frontier"`,
    `"grid"`. `time_limit` bounds the whole call (60 s by default)."""
    flags = {**flags, "time_limit": time_limit}
    if hardware is not None:
        flags = {"hardware": hardware, **flags}
    code, data, argv, out = _json(["whatif", question], model, [], flags)
    return WhatIf(data, code, argv, model, out)


def validate(plan: Union[str, os.PathLike, Any], **flags: Any) -> Validation:
    """Runs a plan (a file from `plan -o`, or a model with `device_map=`) on a device after the
    static checks, and sets what it measured beside the prediction (`vramplan validate`)."""
    removed = None
    if isinstance(flags.get("device_map"), Mapping):
        path, removed = _map_file(flags["device_map"])
        flags = {**flags, "device_map": path}
    try:
        code, data, argv, out = _json(["validate"], plan, [], flags)
    finally:
        if removed:
            os.unlink(removed)
    return Validation(data, code, argv, plan, out)


def validate_script(
    script: Union[str, os.PathLike],
    hardware: str,
    args: Iterable[str] = (),
    **flags: Any,
) -> Validation:
    """Runs your own training or inference script, unmodified, on the profile's GPUs as fake
    CUDA devices (`vramplan validate --script`): device mismatches, out-of-memory, idle GPUs."""
    argv = ["validate", "--script", os.fspath(script), "--hardware", hardware] + _flag_args(flags) + ["--json"]
    extra = list(args)
    if extra:
        argv += ["--"] + extra
    code, out = run(argv)
    return Validation(json.loads(out), code, argv, None, out)


def inspect(model: Any, **flags: Any) -> Inspection:
    """Describes a model (`vramplan inspect`): parameters, bytes, modules, layer kinds."""
    code, data, argv, out = _json(["inspect"], model, [], flags)
    return Inspection(data, code, argv, model, out)


def plot(kind: str, model: Any, hardware: str, format: str = "svg", **flags: Any) -> Svg:
    """Draws a figure (`vramplan plot KIND`): `"breakdown"`, `"timeline"`, `"map"`, `"sweep"`,
    `"grid"`. Returns an `Svg` (shown inline in Jupyter; `.data` is the text), or PNG bytes
    for `format="png"`."""
    handle, path = tempfile.mkstemp(prefix="vramplan-plot-", suffix="." + format)
    os.close(handle)
    spec, native = describe(model)
    argv = ["plot", kind, spec, "--hardware", hardware, "-o", path] + _flag_args(flags)
    try:
        run(argv, native)
        with open(path, "rb") as f:
            data = f.read()
    finally:
        os.unlink(path)
    if format == "png":
        return data  # type: ignore[return-value]
    return Svg(data.decode("utf-8"))


def profiles() -> List[Dict[str, Any]]:
    """The built-in hardware profiles, as `vramplan profiles --json` lists them."""
    _, out = run(["profiles", "--json"])
    return json.loads(out)
