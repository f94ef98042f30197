"""Records the base models and task heads of every family vramplan builds, from the real
transformers runtime: for one built-in config per family (profiles/catalog/models; for a family
without one, transformers' default config of default_configs.py, recorded under `config_json`), every
`{Family}Model` / `{Family}For{Task}` class transformers defines (transformers 5.24 and 4.57
define the same ones) is built from that config as models.py builds a built-in (on the meta
device as `from_pretrained(..., dtype=torch.bfloat16)` makes it, ties as after loading), and
written to fixtures/reference/heads/<v5|v4>/<class>.json in models.py's format (4.x: not the
families in V5_ONLY), `model` naming the built-in config. profiles/tests/reference.rs compares
them as it compares the built-ins.

Usage: python heads.py [class ...]   (no classes: all)
"""

import importlib
import sys
import time

import common
import default_configs
import models

# One built-in config per family, and the family's module in transformers.models.
FAMILIES = [
    ("Llama", "llama", "llama-3.2-1b"), ("Mistral", "mistral", "mistral-7b"),
    ("Mixtral", "mixtral", "mixtral-8x7b"), ("Qwen2", "qwen2", "qwen2.5-0.5b"),
    ("Qwen2Moe", "qwen2_moe", "qwen1.5-moe-a2.7b"), ("Qwen3", "qwen3", "qwen3-0.6b"),
    ("Qwen3Moe", "qwen3_moe", "qwen3-30b-a3b"), ("Gemma", "gemma", "gemma-2b"),
    ("Gemma2", "gemma2", "gemma-2-2b"), ("Phi3", "phi3", "phi-3-mini"),
    ("GptOss", "gpt_oss", "gpt-oss-20b"), ("Olmoe", "olmoe", "olmoe-1b-7b"),
    ("Gemma3Text", "gemma3", "gemma-3-1b-it"), ("Granite", "granite", "granite-3.3-8b-instruct"),
    ("SmolLM3", "smollm3", "smollm3-3b"), ("Llama4Text", "llama4", "llama-4-scout-text"),
    ("FalconH1", "falcon_h1", "falcon-h1-0.5b-instruct"),
    # No built-in: transformers' default config (default_configs.py).
    ("Glm4", "glm4", "glm4-default-config"), ("Cohere2", "cohere2", "cohere2-default-config"),
    ("DeepseekV2", "deepseek_v2", "deepseek-v2-lite"), ("DeepseekV3", "deepseek_v3", "deepseek-v3"),
    ("Phi", "phi", "phi-2"), ("GPT2", "gpt2", "gpt2"), ("GPTBigCode", "gpt_bigcode", "starcoder"),
    ("GPTNeoX", "gpt_neox", "pythia-410m"), ("Falcon", "falcon", "falcon-7b"),
    ("Bloom", "bloom", "bloom-560m"), ("OPT", "opt", "opt-1.3b"), ("Bert", "bert", "bert-base-uncased"),
    ("XLNet", "xlnet", "xlnet-base-cased"), ("T5", "t5", "t5-base"),
    # The vision-language families: their base models hold the tower, the projector and the
    # language model at the root; Gemma 3's classifier scores the text model's hidden states.
    ("Qwen2_5_VL", "qwen2_5_vl", "qwen2.5-vl-7b-instruct"), ("Gemma3", "gemma3", "gemma-3-4b-it"),
    ("Qwen3VL", "qwen3_vl", "qwen3-vl-8b-instruct"), ("Mistral3", "mistral3", "mistral-small-3.1-24b-instruct"),
    ("Phi4Multimodal", "phi4_multimodal", "phi-4-multimodal-instruct"),
]
# Families recorded in 5.x only: their 4.x trees list every routed expert (3.5 MB a class for
# DeepSeek-V3), which the built-ins' own 4.x fixtures check already on the same importer.
V5_ONLY = {"DeepseekV3", "Qwen3Moe"}
TASKS = ["Model", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering",
         "ForQuestionAnsweringSimple", "EncoderModel"]


def classes():
    """(class, built-in config) for every class transformers defines of each family."""
    out = []
    for prefix, module, config in FAMILIES:
        if common.TAG == "v4" and prefix in V5_ONLY:
            continue
        modeling = importlib.import_module(f"transformers.models.{module}.modeling_{module}")
        out += [(prefix + t, config) for t in TASKS if hasattr(modeling, prefix + t)]
    return out


def main(argv):
    outdir = common.FIXTURES / "heads" / common.TAG
    for cls, name in classes():
        if argv and cls not in argv:
            continue
        t0 = time.time()
        f = default_configs.facts(name, cls) if name in default_configs.CONFIGS else models.facts(name, cls)
        f["seconds"] = round(time.time() - t0, 1)
        common.write_json(outdir / f"{cls}.json", f, compact_lists={"parameters", "buffers", "module_sizes"})
        status = "ERROR " + f["error"][:200] if "error" in f else f"{len(f['parameters'])} params"
        print(f"[{common.TAG}] {cls} ({name}): {status} ({f['seconds']}s)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
