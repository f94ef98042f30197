"""`model` as a config dict, a `PretrainedConfig` and a `torch.nn.Module`: described as the
built-in of the same config is. The module cases run on transformers' own meta-device models
where torch and transformers are installed; without them, on an object that lists what
transformers built (`fixtures/reference/models/v5`: its `named_parameters()` and
`named_buffers()`)."""

from __future__ import annotations

import json

import pytest

import vramplan
from conftest import ROOT, fixture

FAMILIES = ["qwen2.5-0.5b", "pythia-410m", "gpt2", "mixtral-8x7b", "gemma-2-2b"]


def owns(unit: str, tensor: str) -> bool:
    """Whether placement unit `unit` holds tensor `tensor` (the unit `""` holds the root's own)."""
    if unit == "":
        return "." not in tensor
    return tensor == unit or tensor.startswith(unit + ".")


def builtin_config(name: str) -> dict:
    return json.loads((ROOT / "profiles" / "catalog" / "models" / f"{name}.json").read_text())


def test_a_config_dict_is_the_builtin():
    by_name = vramplan.plan("qwen2.5-0.5b", hardware="t4x2", mode="inference")
    by_dict = vramplan.plan(builtin_config("qwen2.5-0.5b"), hardware="t4x2", mode="inference")
    assert by_dict.device_map == by_name.device_map
    assert by_dict.data["peak_bytes"] == by_name.data["peak_bytes"]


class _Tensor:
    """What `_listing` reads of a tensor: dtype, shape, numel, element size."""

    SIZES = {"bfloat16": 2, "float16": 2, "float32": 4, "int64": 8, "bool": 1}

    def __init__(self, shape, dtype):
        self.shape = tuple(shape)
        self.dtype = f"torch.{dtype}"
        self._size = self.SIZES[dtype]

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def element_size(self):
        return self._size


class _Config:
    def __init__(self, data):
        self._data = data

    def to_dict(self):
        return dict(self._data)


class ListedModule:
    """A stand-in for transformers' meta-device model of built-in `name`: the parameters and
    buffers transformers 5.24 built (the reference fixture), and the config."""

    def __init__(self, name, with_config=True):
        data = json.loads(fixture("reference", "models", "v5", f"{name}.json").read_text())
        self._parameters = [(n, _Tensor(s, d)) for n, s, d in data["parameters"]]
        self._buffers = [(n, _Tensor(s, d)) for n, s, d, _ in data["buffers"]]
        self._persistent = {n: p for n, _, _, p in data["buffers"]}
        if with_config:
            config = builtin_config(name)
            config["torch_dtype"] = "bfloat16"
            self.config = _Config(config)

    def named_parameters(self):
        return iter(self._parameters)

    def named_buffers(self):
        return iter(self._buffers)

    def named_modules(self):
        # Every buffer's owner, with `_non_persistent_buffers_set` as torch keeps it.
        owners = {}
        for name, tensor in self._buffers:
            prefix, _, leaf = name.rpartition(".")
            owner = owners.setdefault(prefix, type("M", (), {"_buffers": {}, "_non_persistent_buffers_set": set()})())
            owner._buffers[leaf] = tensor
            if not self._persistent[name]:
                owner._non_persistent_buffers_set.add(leaf)
        return iter(owners.items())


@pytest.mark.parametrize("name", FAMILIES)
def test_a_listed_module_plans_as_the_builtin(name):
    module = ListedModule(name)
    by_module = vramplan.plan(module, hardware="t4x2", mode="inference", dtype="bf16")
    by_name = vramplan.plan(name, hardware="t4x2", mode="inference", dtype="bf16")
    assert by_module.device_map == by_name.device_map, name


def test_a_module_of_an_unknown_class_keeps_its_weights_exactly():
    module = ListedModule("pythia-410m", with_config=False)
    described = vramplan.inspect(module)
    data = json.loads(fixture("reference", "models", "v5", "pythia-410m.json").read_text())
    assert described.params == data["parameter_count"]
    listed = sum(t.numel() * t.element_size() for _, t in module.named_parameters())
    buffers = sum(t.numel() * t.element_size() for _, t in module.named_buffers())
    assert described.data["bytes"] == listed + buffers
    # Per device, the weights the plan holds are the listed tensors of the units it places
    # there, each allocation rounded up to the CUDA caching allocator's 512-byte blocks.
    plan = vramplan.plan(module, hardware="t4x2", mode="inference")
    tensors = list(module.named_parameters()) + list(module.named_buffers())
    for device in plan.devices:
        mine = [t for name, t in tensors if any(owns(u, name) for u in device["units"])]
        exact = sum(t.numel() * t.element_size() for t in mine)
        rounded = sum(-(-t.numel() * t.element_size() // 512) * 512 for t in mine)
        held = device["estimate"]["components"]["weights"]
        assert exact <= held <= rounded, (device["name"], exact, held, rounded)


@pytest.mark.torch
@pytest.mark.parametrize("name", FAMILIES)
def test_transformers_meta_model_plans_as_the_builtin(name):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    config = transformers.AutoConfig.for_model(**{k: v for k, v in builtin_config(name).items() if k != "architectures" and k != "model_type"}, model_type=builtin_config(name)["model_type"])
    config.architectures = builtin_config(name)["architectures"]
    with torch.device("meta"):
        module = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    by_module = vramplan.plan(module, hardware="t4x2", mode="inference")
    by_name = vramplan.plan(name, hardware="t4x2", mode="inference", dtype="bf16")
    assert by_module.device_map == by_name.device_map, name


@pytest.mark.torch
def test_a_custom_torch_module_keeps_its_weights_exactly():
    torch = pytest.importorskip("torch")

    class Block(torch.nn.Module):
        def __init__(self, width):
            super().__init__()
            self.ln = torch.nn.LayerNorm(width)
            self.attn = torch.nn.Linear(width, 3 * width)
            self.proj = torch.nn.Linear(width, width)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))

    class TinyGPT(torch.nn.Module):
        """A nanoGPT-like model no library knows: an embedding, repeated blocks, a norm, a head."""

        def __init__(self, vocab=5000, width=256, depth=6):
            super().__init__()
            self.wte = torch.nn.Embedding(vocab, width)
            self.h = torch.nn.ModuleList(Block(width) for _ in range(depth))
            self.ln_f = torch.nn.LayerNorm(width)
            self.lm_head = torch.nn.Linear(width, vocab, bias=False)
            self.register_buffer("mask", torch.ones(64, 64, dtype=torch.bool), persistent=False)

    with torch.device("meta"):
        net = TinyGPT().to(torch.bfloat16)
    described = vramplan.inspect(net)
    assert described.params == sum(p.numel() for p in net.parameters())
    exact = sum(t.numel() * t.element_size() for t in list(net.parameters()) + list(net.buffers()))
    assert described.data["bytes"] == exact
    plan = vramplan.plan(net, hardware="t4x2", mode="inference")
    tensors = list(net.named_parameters()) + list(net.named_buffers())
    placed = 0
    for device in plan.devices:
        mine = [t for name, t in tensors if any(owns(u, name) for u in device["units"])]
        held = device["estimate"]["components"]["weights"]
        exact_here = sum(t.numel() * t.element_size() for t in mine)
        rounded = sum(-(-t.numel() * t.element_size() // 512) * 512 for t in mine)
        assert exact_here <= held <= rounded, device["name"]
        placed += len(mine)
    assert placed == len(tensors)


@pytest.mark.torch
def test_a_module_with_nothing_to_read_a_layer_from_is_refused_with_a_fix():
    torch = pytest.importorskip("torch")
    with torch.device("meta"):
        net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    with pytest.raises(vramplan.BadInput) as raised:
        vramplan.plan(net, hardware="t4")
    assert raised.value.fix
