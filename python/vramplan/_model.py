"""What a `model` argument can be, and how it reaches the planner: a built-in name, a path or a
Hub id pass as they are; a config `dict` or a `transformers.PretrainedConfig` as its
`config.json` text; a `torch.nn.Module` (on `meta` or real) as the listing of its tensors (names,
shapes, dtypes, tied parameters once, buffers) with its config where it has one, so that any
model the user can instantiate is described exactly, as accelerate does."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional, Tuple

__all__ = ["ModelInput", "model_input"]

# torch dtype name → safetensors dtype name (safetensors' own table).
_SAFETENSORS = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e8m0fnu": "F8_E8M0",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
    "complex64": "C64",
}

# The token that stands for an in-memory model on the command line the binding parses.
PLACEHOLDER = "<python object>"


class ModelInput:
    """A model as the native module takes it: `spec` (what the command line takes), or an
    in-memory `config` (config.json text) and/or `listing` (a safetensors header's JSON)."""

    def __init__(
        self,
        spec: Optional[str] = None,
        config: Optional[str] = None,
        listing: Optional[str] = None,
        origin: str = "",
    ) -> None:
        self.spec = spec
        self.config = config
        self.listing = listing
        self.origin = origin

    def argument(self) -> str:
        """The MODEL argument of the command line."""
        return self.spec if self.spec is not None else PLACEHOLDER

    def native(self) -> Optional[Dict[str, Optional[str]]]:
        """What the native module takes beside the command line (None for a spec)."""
        if self.spec is not None:
            return None
        return {"config": self.config, "listing": self.listing, "origin": self.origin}


def _config_text(config: Any) -> Optional[str]:
    """A `PretrainedConfig`'s or a dict's `config.json` text, every key written out."""
    if isinstance(config, dict):
        return json.dumps(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        # `to_dict()` keeps every key (`to_json_string()` drops those at their defaults).
        return json.dumps(to_dict(), default=str)
    return None


def _listing(module: Any) -> str:
    """The module's tensors as a safetensors header over virtual data: parameters (a tied one
    once, as `named_parameters()` gives them) and buffers, which `__metadata__` names with their
    persistence."""
    header: Dict[str, Any] = {}
    offset = 0
    persistent: Dict[str, bool] = {}
    for prefix, sub in module.named_modules():
        for name in getattr(sub, "_buffers", {}):
            full = f"{prefix}.{name}" if prefix else name
            persistent[full] = name not in getattr(sub, "_non_persistent_buffers_set", set())
    tensors = list(module.named_parameters()) + list(module.named_buffers())
    for name, tensor in tensors:
        if name in header:
            continue
        dtype = str(tensor.dtype).replace("torch.", "")
        code = _SAFETENSORS.get(dtype)
        if code is None:
            from ._errors import BadInput

            raise BadInput(
                f"tensor `{name}` is {tensor.dtype}, which vramplan does not size",
                origin=type(module).__name__,
                fix="give the model in one of torch's float, integer or bool dtypes",
            )
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": code, "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    buffers = {name: persistent.get(name, True) for name, _ in module.named_buffers()}
    header["__metadata__"] = {"buffers": json.dumps(buffers)}
    return json.dumps(header)


def model_input(model: Any) -> ModelInput:
    """Reads a `model` argument: a name, path or Hub id (`str` or `os.PathLike`), a config
    (`dict` or `PretrainedConfig`), or a `torch.nn.Module`."""
    if isinstance(model, (str, os.PathLike)):
        return ModelInput(spec=os.fspath(model))
    if isinstance(model, dict) or hasattr(model, "to_dict") and not hasattr(model, "named_parameters"):
        config = _config_text(model)
        origin = "config dict" if isinstance(model, dict) else type(model).__name__
        return ModelInput(config=config, origin=origin)
    if hasattr(model, "named_parameters") and hasattr(model, "named_buffers"):
        config = getattr(model, "config", None)
        text = _config_text(config) if config is not None else None
        if text is not None:
            as_dict: Dict[str, Any] = json.loads(text)
            # A model built with `from_config` has no `architectures` yet: it is its own class.
            if not as_dict.get("architectures"):
                as_dict["architectures"] = [type(model).__name__]
                text = json.dumps(as_dict)
        return ModelInput(config=text, listing=_listing(model), origin=type(model).__name__)
    from ._errors import BadInput

    raise BadInput(
        f"a {type(model).__name__} is not a model vramplan can read",
        origin="model",
        fix="give a built-in name, a path, a Hub id, a config dict, a transformers PretrainedConfig "
        "or a torch.nn.Module",
    )


def describe(model: Any) -> Tuple[str, Optional[Dict[str, Optional[str]]]]:
    """The command line's MODEL argument for `model` and what the native module takes beside."""
    found = model_input(model)
    return found.argument(), found.native()
