"""Records where the real runtime puts every byte of a model under one placement written four
ways, for one built-in model of every architecture vramplan builds, in this venv's transformers
naming (5.x or 4.x). The four ways of the same placement (the first half of the blocks, and what
comes before them, on GPU 0; the rest on GPU 1):

- `layers`: each block whole, and each module outside the blocks;
- `submodules`: each block by its children, and each module outside the blocks by its children;
- `tensors`: every parameter and buffer by its full name (tied names too);
- `split`: `layers`, with the last block of GPU 0 split by its children between the two GPUs.

How: the shipped `torch` backend harness (validate/harness/run_plan.py) builds the model from its
config under PyTorch's FakeTensorMode with fake `cuda:0` and `cuda:1` (no memory, no GPU), puts
every tensor where the map's longest matching key says (what `from_pretrained` does), ties the
weights, and runs accelerate's real `dispatch_model`; then the bytes of every parameter and buffer
per device, each storage once (`placed`). Models are cut to 4 blocks (per stack) and built in
fp32, so the record is about placement, not dtypes (the `models/` fixtures hold those).

Writes fixtures/reference/granularity/{v5,v4}.json; `tests/tests/granularity.rs` estimates each
map with vramplan and compares its bytes loaded per GPU. Run by
`scripts/reference/run granularity` (no GPU needed).
"""

import copy
import os
import sys

import common
from common import FIXTURES, TAG, load_raw_config, versions

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "validate", "harness"))
import run_plan  # noqa: E402
import accelerate  # noqa: E402
import torch  # noqa: E402
import warnings  # noqa: E402

# accelerate warns of every key naming a tensor, not a module: such keys are the point here.
warnings.filterwarnings("ignore", message="The following device_map keys do not match")

OUT = FIXTURES / "granularity" / f"{TAG}.json"
BLOCKS = 4

# One built-in of each architecture.
MODELS = ["llama-3.2-1b", "mistral-7b", "mixtral-8x7b", "qwen2.5-0.5b", "qwen1.5-moe-a2.7b",
          "qwen3-0.6b", "qwen3-30b-a3b", "deepseek-v2-lite", "deepseek-v3", "pythia-410m", "gpt2",
          "starcoder", "phi-1.5", "phi-3-mini", "gemma-2b", "gemma-2-2b", "falcon-7b", "opt-1.3b",
          "bloom-560m", "gpt-oss-20b", "olmoe-1b-7b", "t5-base", "bert-base-uncased",
          "xlnet-base-cased"]
LAYER_KEYS = ["num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers", "n_layers"]


def cut(raw):
    """The config with BLOCKS blocks per stack (lists sized by the layer count cut alike), in fp32."""
    cfg = copy.deepcopy(raw)
    counts = {cfg[k] for k in LAYER_KEYS if isinstance(cfg.get(k), int)}
    for k in LAYER_KEYS:
        if isinstance(cfg.get(k), int):
            cfg[k] = min(cfg[k], BLOCKS)
    for k, v in list(cfg.items()):
        if isinstance(v, list) and len(v) in counts and len(v) > BLOCKS:
            cfg[k] = v[:BLOCKS]
    # DeepSeek: keep one MoE block after the dense ones.
    if isinstance(cfg.get("first_k_dense_replace"), int):
        cfg["first_k_dense_replace"] = min(cfg["first_k_dense_replace"], BLOCKS - 1)
    cfg["torch_dtype"] = "float32"
    cfg.pop("dtype", None)
    cfg.pop("quantization_config", None)
    return cfg


def holds_tensors(module):
    return any(True for _ in module.parameters()) or any(True for _ in module.buffers())


def own_tensors(module, path):
    names = [n for n, _ in module.named_parameters(recurse=False, remove_duplicate=False)]
    names += [n for n, _ in module.named_buffers(recurse=False, remove_duplicate=False)]
    return [f"{path}.{n}" if path else n for n in names]


def blocks_of(model):
    # transformers 4.x asks the model (`_get_no_split_modules`); 5.x's `_get_device_map` reads the
    # class attribute of every module, which `_no_split_modules` of the model lists.
    getter = getattr(model, "_get_no_split_modules", None)
    no_split = set(getter("auto") if getter else model._no_split_modules or [])
    blocks = [name for name, m in model.named_modules() if type(m).__name__ in no_split and name]
    if blocks:
        return blocks
    # A model that declares none (XLNet): the layers of its largest ModuleList.
    lists = [(len(m), name) for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList)]
    _, name = max(lists)
    return [f"{name}.{child}" for child, _ in model.get_submodule(name).named_children()]


def ways(model):
    """The four maps, as [key, GPU] pairs in model order."""
    blocks = blocks_of(model)
    half = set(blocks[: (len(blocks) + 1) // 2])
    split_block = blocks[(len(blocks) + 1) // 2 - 1]

    def device_of_block(name):
        return 0 if name in half else 1

    # What comes before the first block goes to GPU 0, what comes after the last to GPU 1;
    # in between (T5's encoder final norm) the device of the block before it.
    order = [name for name, _ in model.named_modules()]
    position = {name: i for i, name in enumerate(order)}
    first_block, last_half = position[blocks[0]], max(position[b] for b in half)

    def device_outside(name):
        p = position.get(name)
        if p is None:  # a tensor: its module's
            return device_outside(name.rsplit(".", 1)[0])
        return 0 if p <= last_half or p < first_block else 1

    def contains_block(name):
        return any(b == name or b.startswith(name + ".") or name == "" for b in blocks)

    def walk(module, path, block_depth, outside_depth):
        """Keys for `module` at `path`: blocks whole (block_depth 0) or by their children (1);
        modules outside the blocks whole (outside_depth 0) or by their children (1)."""
        if path in blocks:
            dev = device_of_block(path)
            if block_depth == 0:
                return [[path, dev]]
            keys = [[t, dev] for t in own_tensors(module, path)]
            for name, child in module.named_children():
                if holds_tensors(child):
                    keys.append([f"{path}.{name}", dev])
            return keys
        if not contains_block(path):
            if outside_depth == 0 or not any(True for _ in module.named_children()):
                return [[path, device_outside(path)]] if holds_tensors(module) else []
            keys = [[t, device_outside(path)] for t in own_tensors(module, path)]
            for name, child in module.named_children():
                if holds_tensors(child):
                    child_path = f"{path}.{name}"
                    keys.append([child_path, device_outside(child_path)])
            return keys
        keys = [[t, device_outside(t)] for t in own_tensors(module, path)]
        for name, child in module.named_children():
            keys += walk(child, f"{path}.{name}" if path else name, block_depth, outside_depth)
        return keys

    layers = walk(model, "", 0, 0)
    submodules = walk(model, "", 1, 1)

    def tensor_device(name):
        for b in blocks:
            if name.startswith(b + "."):
                return device_of_block(b)
        return device_outside(name)

    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    names += [n for n, _ in model.named_buffers(remove_duplicate=False)]
    tensors = [[n, tensor_device(n)] for n in names]

    # The split: the last block of GPU 0 by its children, the first half of them on GPU 0.
    split = []
    for key, dev in layers:
        if key != split_block:
            split.append([key, dev])
            continue
        module = model.get_submodule(key)
        children = [n for n, c in module.named_children() if holds_tensors(c)]
        own = own_tensors(module, key)
        split += [[t, 0] for t in own]
        cut_at = (len(children) + 1) // 2
        split += [[f"{key}.{c}", 0 if i < cut_at else 1] for i, c in enumerate(children)]
    return {"layers": layers, "submodules": submodules, "tensors": tensors, "split": split}


def placed_by_runtime(raw, device_map):
    request = {"config": raw, "device_map": dict(device_map), "dtype": "fp32", "fake_gpus": 2}
    with run_plan.fake_devices():
        model, _ = run_plan.build(request)
        model = accelerate.dispatch_model(model, device_map=dict(device_map))
        return run_plan.placed(model)


def main():
    records = []
    for name in MODELS:
        raw = cut(load_raw_config(name))
        config, _ = run_plan.make_config(raw)
        with torch.device("meta"):
            meta = run_plan.model_class(raw)(config)
        maps = ways(meta)
        for way, device_map in maps.items():
            try:
                placed = placed_by_runtime(raw, device_map)
                error = None
            except Exception as e:  # noqa: BLE001
                placed, error = None, f"{type(e).__name__}: {e}"[:500]
            print(f"{name} {way}: {len(device_map)} keys, {placed or error}", file=sys.stderr)
            records.append({"model": name, "way": way, "config": raw, "device_map": device_map,
                            "placed": placed, "error": error})
    document = {
        "about": "One placement written four ways per architecture, and the bytes the real runtime "
                 "places on each device (FakeTensorMode; from_pretrained's longest-prefix rule, then "
                 "accelerate.dispatch_model): scripts/reference/granularity.py.",
        "versions": versions(),
        "records": records,
    }
    common.write_fixture(OUT, document)
    print(f"wrote {OUT}: {len(records)} records", file=sys.stderr)


if __name__ == "__main__":
    main()
