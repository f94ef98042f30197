"""Records model facts for classes vramplan builds but has no published config.json for: each
class built from transformers' own default config (`Glm4Config()`, `Cohere2Config()`: every key
the config class's default, only `architectures` and `model_type` given), exactly as models.py
builds a built-in (same fields, same meta-device construction). These are the classes' defaults,
not a published checkpoint (4.57's `Glm4Config` docstring says its defaults are like
THUDM/GLM-4-9B-0414, 5.24's names zai-org/GLM-OCR; both `Cohere2Config`s name
CohereForAI/c4ai-command-r-v01, a Command R 35B, not Command R7B); no published config.json of
either class was found to embed.

Writes fixtures/reference/models/<v5|v4>/<name>.json with the config under `config_json`.

Usage: python default_configs.py [name ...]   (no names: all)
"""

import sys
import time

import common
import models

# name -> the config.json transformers' defaults stand for
CONFIGS = {
    "glm4-default-config": {"architectures": ["Glm4ForCausalLM"], "model_type": "glm4"},
    "cohere2-default-config": {"architectures": ["Cohere2ForCausalLM"], "model_type": "cohere2"},
}


def facts(name, cls=None):
    """models.facts of default config `name`, built as its own class or as `cls` (a base model or
    task head: heads.py), with the config under `config_json`."""
    raw = CONFIGS[name]
    original = common.load_raw_config
    common.load_raw_config = lambda _name: dict(raw)
    try:
        f = models.facts(name, cls)
    finally:
        common.load_raw_config = original
    f["source"] = "transformers' default config of the class (scripts/reference/default_configs.py)"
    f["config_json"] = raw
    return f


def main(argv):
    names = argv or list(CONFIGS)
    outdir = common.FIXTURES / "models" / common.TAG
    for name in names:
        t0 = time.time()
        f = facts(name)
        f["seconds"] = round(time.time() - t0, 1)
        common.write_json(outdir / f"{name}.json", f, compact_lists={"parameters", "buffers", "module_sizes"})
        status = "ERROR " + f["error"][:200] if "error" in f else f"{len(f['parameters'])} params"
        print(f"[{common.TAG}] {name}: {status} ({f['seconds']}s)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
