"""Records what the real runtime does with planted device maps, on fake GPUs: for each case, the
shipped `torch` backend harness (validate/harness/run_plan.py, run with this venv's Python and
`fake_gpus`) builds a tiny model from its config under PyTorch's FakeTensorMode, places it with
the map through accelerate's `dispatch_model`, and runs a prefill or training steps; PyTorch's
own device rule, applied by the fake tensors, says whether an operation met two devices, and in
which module. Writes fixtures/reference/mismatches/v5.json, which `cargo test` reads: the
static check and the `cpu` backend must find the same mismatches (tests/tests/mismatches.rs).

Run by scripts/reference/run mismatches (no GPU needed).
"""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
HARNESS = os.path.join(ROOT, "validate", "harness", "run_plan.py")
OUT = os.path.join(ROOT, "fixtures", "reference", "mismatches", "v5.json")

# Tiny configs of the families the planted maps are about (fp32, so the fake run has no dtype
# question): a decoder with tied embeddings, an MoE, and XLNet.
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
         "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "tie_word_embeddings": True,
         "max_position_embeddings": 512, "torch_dtype": "float32"}
LLAMA_UNTIED = dict(LLAMA, tie_word_embeddings=False)
MIXTRAL = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 64,
           "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 256, "num_local_experts": 4,
           "num_experts_per_tok": 2, "tie_word_embeddings": False, "max_position_embeddings": 512,
           "torch_dtype": "float32"}
XLNET = {"architectures": ["XLNetLMHeadModel"], "model_type": "xlnet", "d_model": 64, "n_layer": 2,
         "n_head": 4, "d_inner": 128, "vocab_size": 256, "torch_dtype": "float32"}

LLAMA_TWO = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "model.norm": 1,
             "model.rotary_emb": 1, "lm_head": 1}
LLAMA_SAME = dict(LLAMA_TWO, lm_head=0)
LLAMA_EMBEDDING_ON_CPU = {"model.embed_tokens": "cpu", "model.layers": 0, "model.norm": 0,
                          "model.rotary_emb": 0, "lm_head": 0}
MIXTRAL_TWO = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "model.norm": 1,
               "model.rotary_emb": 1, "lm_head": 1}
MIXTRAL_EXPERTS_APART = {"model.embed_tokens": 0, "model.layers.0.self_attn": 0,
                         "model.layers.0.input_layernorm": 0,
                         "model.layers.0.post_attention_layernorm": 0, "model.layers.0.mlp.gate": 0,
                         "model.layers.0.mlp.experts": 1, "model.layers.1": 1, "model.norm": 1,
                         "model.rotary_emb": 1, "lm_head": 1}
XLNET_TWO = {"transformer.word_embedding": 0, "transformer.mask_emb": 0, "transformer.layer.0": 0,
             "transformer.layer.1": 1, "lm_loss": 0}
XLNET_TIED_SPLIT = dict(XLNET_TWO, lm_loss=1)

# A map listing one tensor, or one module, of a layer inside that layer's entry, on another
# device: the layer's hook moves a listed tensor back to the layer's GPU (`place_submodules`); a
# listed module keeps its own hook and device.
LLAMA_TENSOR_INSIDE_LAYER = dict(LLAMA_TWO, **{"model.layers.0.mlp.down_proj.weight": 1})
LLAMA_TENSOR_INSIDE_LAYER_ON_CPU = dict(LLAMA_TWO, **{"model.layers.0.mlp.down_proj.weight": "cpu"})
LLAMA_MODULE_INSIDE_LAYER = dict(LLAMA_TWO, **{"model.layers.0.mlp.down_proj": 1})
# Offloaded modules in a LoRA step, over two GPUs (so the HF Trainer would not move the model):
# a frozen embedding, and a layer holding adapted linears.
LLAMA_EMBEDDING_ON_CPU_TWO = dict(LLAMA_TWO, **{"model.embed_tokens": "cpu"})
LLAMA_LAYER_ON_CPU = dict(LLAMA_TWO, **{"model.layers.0": "cpu"})

# GPT-NeoX computes its rotary embedding before its first layer, and its `emb_dropout` holds no
# tensor: with the rotary module on the last GPU (where a map in definition order puts it), the
# runtime runs the dropout on the embeddings' GPU and hands the position embeddings to each layer.
NEOX = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
        "rotary_pct": 0.25, "max_position_embeddings": 512, "tie_word_embeddings": False,
        "torch_dtype": "float32"}
NEOX_ROTARY_LAST = {"gpt_neox.embed_in": 0, "gpt_neox.layers.0": 0, "gpt_neox.layers.1": 1,
                    "gpt_neox.final_layer_norm": 1, "gpt_neox.rotary_emb": 1, "lm_head": 1}
# The whole model on the CPU (the "GPU at 0 %" incident): one device, so no hooks.
ALL_ON_CPU = {"": "cpu"}
# A tied pair with one side on the CPU, and a module with buffers only on the CPU in training.
LLAMA_TIED_HEAD_ON_CPU = dict(LLAMA_SAME, lm_head="cpu")
LLAMA_ROTARY_ON_CPU = dict(LLAMA_TWO, **{"model.rotary_emb": "cpu", "lm_head": 1})

# BERT's masked-LM head with its transform on another GPU than its decoder and output bias (the
# decoder's bias is tied to the head's own `bias`), as vramplan plans it over two GPUs.
BERT = {"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
        "max_position_embeddings": 512, "torch_dtype": "float32"}
BERT_HEAD_SPLIT = {"bert.embeddings": 0, "bert.encoder.layer.0": 0, "bert.encoder.layer.1": 1,
                   "cls.predictions.bias": 0, "cls.predictions.transform.dense": 1,
                   "cls.predictions.transform.LayerNorm": 1, "cls.predictions.decoder": 0}

# LoRA's targets as vramplan resolves them (PEFT matches a full path exactly).
LORA_QV = {"rank": 4, "alpha": 8, "targets": [f"model.layers.{i}.self_attn.{p}" for i in range(2)
                                               for p in ("q_proj", "v_proj")]}
LORA_MIXTRAL = {"rank": 4, "alpha": 8, "targets": [f"model.layers.{i}.self_attn.{p}" for i in range(2)
                                                   for p in ("q_proj", "k_proj", "v_proj", "o_proj")]}

# name, config, map, modes, GPUs[, LoRA]
CASES = [
    ("llama-two-gpus", LLAMA, LLAMA_SAME, ["inference", "train"], 2),
    ("llama-tied-split", LLAMA, LLAMA_TWO, ["inference", "train"], 2),
    ("llama-untied-two-gpus", LLAMA_UNTIED, LLAMA_TWO, ["inference", "train"], 2),
    ("llama-embedding-on-cpu", LLAMA_UNTIED, LLAMA_EMBEDDING_ON_CPU, ["inference", "train"], 1),
    ("mixtral-two-gpus", MIXTRAL, MIXTRAL_TWO, ["inference", "train"], 2),
    ("mixtral-experts-apart", MIXTRAL, MIXTRAL_EXPERTS_APART, ["inference", "train"], 2),
    ("xlnet-two-gpus", XLNET, XLNET_TWO, ["inference", "train"], 2),
    ("xlnet-tied-split", XLNET, XLNET_TIED_SPLIT, ["inference"], 2),
    ("llama-tensor-inside-listed-layer", LLAMA_UNTIED, LLAMA_TENSOR_INSIDE_LAYER, ["inference", "train"], 2),
    ("llama-tensor-inside-listed-layer-on-cpu", LLAMA_UNTIED, LLAMA_TENSOR_INSIDE_LAYER_ON_CPU, ["train"], 2),
    ("llama-module-inside-listed-layer", LLAMA_UNTIED, LLAMA_MODULE_INSIDE_LAYER, ["inference"], 2),
    ("llama-lora-two-gpus", LLAMA_UNTIED, LLAMA_TWO, ["train"], 2, LORA_QV),
    ("llama-lora-tied-split", LLAMA, LLAMA_TWO, ["train"], 2, LORA_QV),
    ("llama-lora-embedding-on-cpu", LLAMA_UNTIED, LLAMA_EMBEDDING_ON_CPU_TWO, ["train"], 2, LORA_QV),
    ("llama-lora-layer-on-cpu", LLAMA_UNTIED, LLAMA_LAYER_ON_CPU, ["train"], 2, LORA_QV),
    ("mixtral-lora-experts-apart", MIXTRAL, MIXTRAL_EXPERTS_APART, ["train"], 2, LORA_MIXTRAL),
    ("neox-rotary-on-last-gpu", NEOX, NEOX_ROTARY_LAST, ["inference", "train"], 2),
    ("llama-all-on-cpu", LLAMA_UNTIED, ALL_ON_CPU, ["inference", "train"], 1),
    ("llama-tied-head-on-cpu", LLAMA, LLAMA_TIED_HEAD_ON_CPU, ["inference", "train"], 2),
    ("llama-untied-rotary-on-cpu", LLAMA_UNTIED, LLAMA_ROTARY_ON_CPU, ["train"], 2),
    ("bert-head-split", BERT, BERT_HEAD_SPLIT, ["inference", "train"], 2),
]


def run(request):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(request, f)
    try:
        out = subprocess.run([sys.executable, HARNESS, f.name], capture_output=True, text=True, timeout=600)
    finally:
        os.unlink(f.name)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"the harness printed nothing: {out.stderr[-2000:]}")
    return json.loads(lines[-1])


def main():
    records, versions = [], None
    for name, config, device_map, modes, gpus, *lora in CASES:
        lora = lora[0] if lora else None
        for mode in modes:
            reply = run({"config": config, "device_map": device_map, "mode": mode, "batch": 2, "seq": 16,
                         "dtype": "fp32", "lora": lora, "grad_checkpointing": False, "steps": 2,
                         "fake_gpus": gpus})
            versions = {**(versions or {}), **reply.pop("versions")}
            reply.pop("devices")
            print(f"{name} {mode}: {reply['outcome']} {reply['module']} {reply['mismatched']}", file=sys.stderr)
            # The map as [name, device] pairs: its order is part of it (the first GPU listed is
            # accelerate's main device), and a JSON object's order is lost by many readers.
            records.append({"name": name, "mode": mode, "gpus": gpus, "config": config,
                            "device_map": [[k, v] for k, v in device_map.items()], "batch": 2, "seq": 16,
                            "lora": lora, **reply})
    document = {
        "about": "What the real runtime does with planted device maps on fake GPUs (FakeTensorMode): "
                 "scripts/reference/mismatches.py through validate/harness/run_plan.py. Training runs "
                 "the forward with its loss (autograd cannot run a backward on fake CUDA devices).",
        "versions": versions,
        "records": records,
    }
    tmp = OUT + ".tmp"
    with open(tmp, "w") as f:
        json.dump(document, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, OUT)
    print(f"wrote {OUT}: {len(records)} records", file=sys.stderr)


if __name__ == "__main__":
    main()
