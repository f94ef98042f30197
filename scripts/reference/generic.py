"""Records model folders of architectures vramplan has no importer for, as a generic model reads
them: for Cohere 2 and GLM-4 (transformers' own modeling code, `Cohere2ForCausalLM` and
`Glm4ForCausalLM`), a tiny config from the class's defaults with small sizes, the model built
in bfloat16 and saved with `save_pretrained` (config.json as transformers writes it, and
model.safetensors by safetensors' own writer, tied tensors left out as transformers leaves
them; the file is kept up to the end of its header, the data's length recorded, so the test
restores it as a sparse file), then transformers' tree of that model beside them (transformers.json: parameters
`[name, shape, dtype]` in definition order, tied ones once; tied groups; buffers `[name, shape,
dtype, persistent]`; `data_bytes`: the data section's length; versions). Written to fixtures/reference/generic/<model_type>/;
profiles/tests/generic.rs builds each folder generically and compares its tree with
transformers.json.

Usage: python generic.py
"""

import shutil
import tempfile

import common
from common import torch

import accelerate.utils as au
import transformers

# Small sizes, each layout's own keys kept at the class defaults otherwise.
SIZES = {"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 1024}
LAYOUTS = [
    # Cohere 2: sliding-window layers three in four (`layer_types`), LayerNorm without bias,
    # parallel attention and MLP from one norm, the head tied to the embedding.
    ("Cohere2ForCausalLM", transformers.Cohere2Config, {"sliding_window": 128}),
    # GLM-4: q/k/v with bias, a fused gate_up_proj, sandwich norms, partial rotary, untied head.
    ("Glm4ForCausalLM", transformers.Glm4Config, {"pad_token_id": 0}),
]


def record(cls_name, config_cls, extra):
    config = config_cls(**SIZES, **extra)
    config.architectures = [cls_name]
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(config).to(torch.bfloat16)
    outdir = common.FIXTURES / "generic" / config.model_type
    outdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        shutil.copy(f"{tmp}/config.json", outdir / "config.json")
        data = open(f"{tmp}/model.safetensors", "rb").read()
        end = 8 + int.from_bytes(data[:8], "little")
        (outdir / "model.safetensors.header").write_bytes(data[:end])
        data_bytes = len(data) - end
    params = [[n, list(p.shape), common.dtype_name(p.dtype)] for n, p in model.named_parameters()]
    buffers = []
    for n, b in model.named_buffers():
        mod_name, _, leaf = n.rpartition(".")
        mod = model.get_submodule(mod_name) if mod_name else model
        buffers.append([n, list(b.shape), common.dtype_name(b.dtype), leaf not in mod._non_persistent_buffers_set])
    facts = {"class": cls_name, "versions": common.versions(), "parameters": params,
             "tied": sorted(sorted(g) for g in au.find_tied_parameters(model)), "buffers": buffers, "data_bytes": data_bytes}
    common.write_json(outdir / "transformers.json", facts, compact_lists={"parameters", "buffers"})
    print(f"{cls_name}: {len(params)} parameters, {len(buffers)} buffers -> {outdir}")


if __name__ == "__main__":
    for layout in LAYOUTS:
        record(*layout)
