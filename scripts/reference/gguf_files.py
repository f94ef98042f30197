"""Writes tiny GGUF files with the real `gguf` package (llama.cpp's gguf-py, from PyPI) and records
what gguf's own reader says of them, so that `profiles/tests/gguf.rs` checks vramplan's GGUF
reader against an independent implementation.

Files written under fixtures/reference/gguf/:
  tiny-llama-q4_k_m.gguf   a 2-layer Llama-style model, hidden 256, with real tensor types as a
                           Q4_K_M file mixes them: Q4_K, Q6_K, Q8_0, F16 and F32 (norms); Q8_0
                           data quantized by gguf.quants from random weights, k-quant blocks
                           random bytes in gguf's layout (gguf-py cannot quantize k-quants)
  tiny-moe-q8_0.gguf       a 2-layer MoE model (4 experts of width 64, `ffn_*_exps` 3-D tensors), Q8_0
  tiny-split-0000K-of-00003.gguf  the first model written in three parts (GGUFWriter's
                           split_max_tensors), as llama-gguf-split lays them
  mmproj-tiny.gguf         a CLIP projector (`general.architecture = clip`, `v.blk.N`)
and expected.json with gguf's GGML_QUANT_SIZES (every type's number, block size and bytes a
block), and, for every file: the metadata vramplan reads, every tensor's name, its
shape in ggml order, its type name and `n_bytes` as gguf.GGUFReader reports them, and the
versions.

Usage: scripts/reference/.venv5/bin/python scripts/reference/gguf_files.py
(needs `pip install gguf numpy` in that venv; writes deterministically from a fixed seed)
"""

import json
import os
import sys
from importlib.metadata import version

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "reference", "gguf")
rng = np.random.default_rng(0)

HIDDEN, FFN, HEADS, KV_HEADS, VOCAB, LAYERS, CTX = 256, 256, 8, 2, 256, 2, 2048


def tensor(shape_torch, qtype):
    """Random weights of `shape_torch` (PyTorch order), quantized to `qtype` by gguf itself."""
    data = rng.standard_normal(shape_torch, dtype=np.float32) * 0.02
    if qtype == T.F32:
        return data, None
    if qtype == T.F16:
        return data.astype(np.float16), None
    try:
        return gguf.quants.quantize(data, qtype), qtype
    except NotImplementedError:
        # gguf-py quantizes the legacy types (Q8_0, Q4_0, …) but not the k-quants: their blocks
        # are filled with random bytes in gguf's own byte layout for the type (the header, the
        # sizes and the reader's view are what is recorded; the values are never read).
        byte_shape = gguf.quants.quant_shape_to_byte_shape(shape_torch, qtype)
        return rng.integers(0, 256, size=byte_shape, dtype=np.uint8), qtype


def llama_metadata(w, arch="llama"):
    w.add_context_length(CTX)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"t{i}".encode() for i in range(VOCAB)])


def add(w, name, shape, qtype):
    data, raw = tensor(shape, qtype)
    if raw is None:
        w.add_tensor(name, data)
    else:
        w.add_tensor(name, data, raw_dtype=raw)


def llama_tensors(w, types):
    add(w, "token_embd.weight", (VOCAB, HIDDEN), types["embd"])
    for i in range(LAYERS):
        p = f"blk.{i}."
        add(w, p + "attn_norm.weight", (HIDDEN,), T.F32)
        add(w, p + "attn_q.weight", (HIDDEN, HIDDEN), types["q"])
        add(w, p + "attn_k.weight", (KV_HEADS * HIDDEN // HEADS, HIDDEN), types["q"])
        add(w, p + "attn_v.weight", (KV_HEADS * HIDDEN // HEADS, HIDDEN), types["v"])
        add(w, p + "attn_output.weight", (HIDDEN, HIDDEN), types["q"])
        add(w, p + "ffn_norm.weight", (HIDDEN,), T.F32)
        add(w, p + "ffn_gate.weight", (FFN, HIDDEN), types["q"])
        add(w, p + "ffn_up.weight", (FFN, HIDDEN), types["q"])
        add(w, p + "ffn_down.weight", (HIDDEN, FFN), types["down"])
    add(w, "output_norm.weight", (HIDDEN,), T.F32)
    add(w, "output.weight", (VOCAB, HIDDEN), types["out"])


Q4_K_M = {"embd": T.Q4_K, "q": T.Q4_K, "v": T.Q6_K, "down": T.Q8_0, "out": T.F16}


def write_llama(path, **split):
    w = gguf.GGUFWriter(path, "llama", **split)
    w.add_name("tiny-llama")
    llama_metadata(w)
    llama_tensors(w, Q4_K_M)
    finish(w)


def write_moe(path):
    experts, used, expert_ffn = 4, 2, 64
    w = gguf.GGUFWriter(path, "qwen3moe")
    w.add_name("tiny-moe")
    llama_metadata(w)
    w.add_expert_count(experts)
    w.add_expert_used_count(used)
    w.add_expert_feed_forward_length(expert_ffn)
    add(w, "token_embd.weight", (VOCAB, HIDDEN), T.Q8_0)
    for i in range(LAYERS):
        p = f"blk.{i}."
        add(w, p + "attn_norm.weight", (HIDDEN,), T.F32)
        add(w, p + "attn_q.weight", (HIDDEN, HIDDEN), T.Q8_0)
        add(w, p + "attn_k.weight", (KV_HEADS * HIDDEN // HEADS, HIDDEN), T.Q8_0)
        add(w, p + "attn_v.weight", (KV_HEADS * HIDDEN // HEADS, HIDDEN), T.Q8_0)
        add(w, p + "attn_output.weight", (HIDDEN, HIDDEN), T.Q8_0)
        add(w, p + "ffn_norm.weight", (HIDDEN,), T.F32)
        add(w, p + "ffn_gate_inp.weight", (experts, HIDDEN), T.F32)
        add(w, p + "ffn_gate_exps.weight", (experts, expert_ffn, HIDDEN), T.Q8_0)
        add(w, p + "ffn_up_exps.weight", (experts, expert_ffn, HIDDEN), T.Q8_0)
        add(w, p + "ffn_down_exps.weight", (experts, HIDDEN, expert_ffn), T.Q8_0)
    add(w, "output_norm.weight", (HIDDEN,), T.F32)
    finish(w)


def write_mmproj(path):
    width, patch, layers = 64, 14, 2
    w = gguf.GGUFWriter(path, "clip")
    w.add_name("tiny-mmproj")
    w.add_uint32("clip.vision.embedding_length", width)
    w.add_uint32("clip.vision.block_count", layers)
    w.add_uint32("clip.vision.image_size", 224)
    w.add_uint32("clip.vision.patch_size", patch)
    w.add_uint32("clip.vision.attention.head_count", 4)
    w.add_uint32("clip.vision.feed_forward_length", 4 * width)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    add(w, "v.patch_embd.weight", (width, 3, patch, patch), T.F16)
    add(w, "v.position_embd.weight", (257, width), T.F16)
    for i in range(layers):
        p = f"v.blk.{i}."
        for n in ("attn_q", "attn_k", "attn_v", "attn_out"):
            add(w, p + n + ".weight", (width, width), T.F16)
            add(w, p + n + ".bias", (width,), T.F32)
        add(w, p + "ln1.weight", (width,), T.F32)
        add(w, p + "ffn_up.weight", (4 * width, width), T.F16)
        add(w, p + "ffn_down.weight", (width, 4 * width), T.F16)
    add(w, "mm.0.weight", (HIDDEN, width), T.F16)
    add(w, "mm.2.weight", (HIDDEN, HIDDEN), T.F16)
    finish(w)


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def record(path):
    r = gguf.GGUFReader(path)
    meta = {}
    for field in r.fields.values():
        if field.name.startswith("tokenizer.ggml.tokens"):
            meta[field.name] = {"array_len": len(field.data)}
            continue
        try:
            meta[field.name] = field.contents()
        except Exception:  # noqa: BLE001  (fields gguf cannot render as a value)
            continue
    return {
        "file_bytes": os.path.getsize(path),
        "metadata": meta,
        "tensors": [
            {
                "name": t.name,
                "ggml_dims": [int(d) for d in t.shape],
                "type": t.tensor_type.name,
                "n_bytes": int(t.n_bytes),
            }
            for t in r.tensors
        ],
    }


def main():
    os.makedirs(OUT, exist_ok=True)
    for name in os.listdir(OUT):
        if name.endswith(".gguf"):
            os.remove(os.path.join(OUT, name))
    write_llama(os.path.join(OUT, "tiny-llama-q4_k_m.gguf"))
    write_moe(os.path.join(OUT, "tiny-moe-q8_0.gguf"))
    write_llama(os.path.join(OUT, "tiny-split.gguf"), split_max_tensors=8)
    write_mmproj(os.path.join(OUT, "mmproj-tiny.gguf"))
    files = sorted(n for n in os.listdir(OUT) if n.endswith(".gguf"))
    expected = {
        "versions": {"gguf": version("gguf"), "numpy": np.__version__, "python": sys.version.split()[0]},
        "files": {n: record(os.path.join(OUT, n)) for n in files},
        "ggml_quant_sizes": {
            t.name: {"id": int(t), "block_size": b, "type_size": s} for t, (b, s) in gguf.GGML_QUANT_SIZES.items()
        },
    }
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")
    print("\n".join(f"{n}: {os.path.getsize(os.path.join(OUT, n))} bytes" for n in files))


if __name__ == "__main__":
    main()
