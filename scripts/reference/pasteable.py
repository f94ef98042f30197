"""Runs every line vramplan prints for a user to paste, with the real libraries: for each case
of CASES (vramplan arguments), runs `$VRAMPLAN ...` (default target/debug/vramplan), takes the
lines it prints to paste (the Python block of `whatif`'s "to run it", `plan -o`'s loading
call, and the shell commands), and runs them:

- the Python lines as one script, in a folder holding the map `plan -o` wrote (GPU indices
  remapped to `cpu`, as loads.py does), with the model's repository replaced by a tiny random
  checkpoint of the same architecture and module tree (loads.py's `tiny_overrides`) and
  `"cuda:0"` and a torchrun process's own GPU by `"cpu"`, and bf16 reported available to the
  Trainer's arguments (they refuse `bf16=True` where no GPU has it); then, where the script
  made a model and a `LoraConfig`, PEFT's `get_peft_model` on them (what the Trainer does with
  them: a target that matches nothing raises there). Nothing is trained.
- the shell commands through their own argument parser where it installs from PyPI
  (`torchrun`: `torch.distributed.run.get_args_parser`); `vllm serve` and `llama-server` are
  recorded as not checked (vLLM's wheel pins a torch build of its own, so it is left out of the
  reference venv; llama.cpp's server is not on PyPI).

Writes fixtures/reference/pasteable/v5.json: per case the arguments, the lines as printed, and
what running them did. `tests/tests/pasteable.rs` holds the CLI's lines to the recorded ones
(so a changed line must be recorded, and so run, again) and every recorded run to success.

Run by scripts/reference/run pasteable (needs the .venv5 with trl; no GPU).
"""

import json
import os
import re
import shutil
import subprocess
import tempfile
import traceback
from pathlib import Path

import common
from loads import save_tiny

VRAMPLAN = os.environ.get("VRAMPLAN", str(common.REPO / "target" / "debug" / "vramplan"))
OUT = common.FIXTURES / "pasteable" / f"{common.TAG}.json"
CUSTOM = "docs/examples/xlnet-memory-mixture.yaml"  # from the repository's root, where vramplan runs
MAP = "@MAP@"  # the -o path; the folder the Python lines run in

TRAIN = ["--mode", "train"]
INF = ["--mode", "inference"]
CASES = [
    ("lora-all-linear", ["whatif", "max-batch", "llama-3.2-3b", "--hardware", "rtx4090", *TRAIN, "--lora-rank", "16",
                         "--lora-targets", "all-linear", "--seq", "1024"]),
    ("qlora", ["whatif", "max-batch", "llama-3-8b", "--hardware", "t4", *TRAIN, "--lora-rank", "16", "--quant", "nf4",
               "--double-quant", "--dtype", "fp16", "--autocast", "fp16", "--grad-ckpt", "full", "--seq", "1024"]),
    ("lora-int8", ["whatif", "max-batch", "phi-2", "--hardware", "t4", *TRAIN, "--lora-rank", "16", "--quant", "int8",
                   "--seq", "512"]),
    ("lora-named-targets", ["whatif", "max-batch", "olmoe-1b-7b", "--hardware", "a100-80gb", *TRAIN, "--lora-rank",
                            "16", "--lora-targets", "q_proj,v_proj", "--seq", "1024"]),
    ("full-fp32-autocast", ["whatif", "max-batch", "qwen2.5-0.5b", "--hardware", "t4", *TRAIN, "--dtype", "fp32",
                            "--autocast", "fp16", "--seq", "512", "--batch", "4", "--grad-accum", "8"]),
    ("full-bf16-8bit-adam", ["whatif", "max-batch", "qwen3-0.6b", "--hardware", "h100-80gb", *TRAIN, "--optimizer",
                             "adamw8bit", "--grad-ckpt", "full", "--seq", "2048"]),
    ("max-seq-lora", ["whatif", "max-seq", "mistral-7b", "--hardware", "a100-80gb", *TRAIN, "--lora-rank", "16",
                      "--grad-ckpt", "full"]),
    ("encoder", ["whatif", "max-batch", "bert-base-uncased", "--hardware", "t4", *TRAIN, "--seq", "512", "--batch", "8",
                 "--grad-accum", "12"]),
    ("seq2seq-lora", ["whatif", "max-batch", "t5-base", "--hardware", "t4", *TRAIN, "--lora-rank", "8", "--seq",
                      "512"]),
    ("xlnet", ["whatif", "max-seq", "xlnet-base-cased", "--hardware", "t4", *TRAIN, "--dtype", "fp32"]),
    ("custom-model", ["whatif", "max-batch", CUSTOM, "--hardware", "t4", *TRAIN, "--seq", "512"]),
    ("ddp", ["whatif", "max-batch", "llama-3.2-1b", "--hardware", "4xa10g", *TRAIN, "--parallel", "ddp", "--seq",
             "1024"]),
    ("inference", ["whatif", "max-batch", "gemma-2-2b", "--hardware", "l4", *INF, "--seq", "4096"]),
    ("inference-int8", ["whatif", "max-batch", "falcon-7b", "--hardware", "a100-40gb", *INF, "--quant", "int8"]),
    ("vllm", ["whatif", "max-concurrency", "llama-3-8b", "--hardware", "a100-80gb", "--engine", "vllm"]),
    ("llama.cpp", ["whatif", "max-seq", "llama-3-8b", "--hardware", "rtx4090", "--engine", "llama.cpp", "--quant",
                   "Q4_K_M"]),
    ("vision-language-lora", ["whatif", "max-batch", "qwen2.5-vl-7b-instruct", "--hardware", "a100-80gb", *TRAIN,
                              "--lora-rank", "16", "--lora-targets", "q_proj,v_proj", "--seq", "512", "--images",
                              "2", "--image-size", "448x448"]),
    ("vision-language-plan", ["plan", "qwen2.5-vl-7b-instruct", "--hardware", "t4x2", *INF, "--dtype", "fp16",
                              "--seq", "1024", "--images", "2", "--image-size", "1024x1024", "-o", MAP]),
    ("plan-qlora-offload", ["plan", "mixtral-8x7b", "--hardware", "t4x2", *INF, "--quant", "nf4", "--double-quant",
                            "--dtype", "fp16", "--seq", "1024", "-o", MAP]),
    ("plan-two-gpus", ["plan", "llama-3-70b", "--hardware", "a100-80gb-x4", *INF, "--dtype", "bf16", "-o", MAP]),
    ("plan-disk", ["plan", "llama-3-8b", "--hardware", "t4", *INF, "--dtype", "fp16", "-o", MAP]),
    ("plan-train", ["plan", "tinyllama-1.1b", "--hardware", "2xt4", *TRAIN, "--dtype", "fp16", "--seq", "512", "-o",
                    MAP]),
    ("plan-encoder", ["plan", "bert-large-uncased", "--hardware", "2xt4", *INF, "--seq", "512", "-o", MAP]),
    ("plan-custom", ["plan", CUSTOM, "--hardware", "2xt4", *TRAIN, "--seq", "512", "-o", MAP]),
]

CODE = re.compile(r"^  (import |from \S+ import |model = |peft_config = |args = |# |vllm serve |llama-server |torchrun )")


def pasteable(stdout):
    return [line[2:] for line in stdout.splitlines() if CODE.match(line)]


def remap(path):
    pairs = json.loads(Path(path).read_text(), object_pairs_hook=list)
    remapped = {k: ("cpu" if isinstance(v, int) else v) for k, v in pairs}
    Path(path).write_text(json.dumps(remapped))


def tiny_checkpoint(model, folder):
    save_tiny(common.load_raw_config(model), folder)


# Each built-in's Hub repository and its short name, as docs/models.md lists them.
SOURCES = {}
for _row in (common.REPO / "docs" / "models.md").read_text().splitlines():
    _found = re.match(r"\| `([^`]+)` \| \[([^\]]+)\]", _row)
    if _found:
        SOURCES[_found.group(2)] = _found.group(1)


def run_python(lines, folder):
    """Runs the Python `lines` in `folder`; returns None or the error."""
    script = "\n".join(lines)
    for repo, name in SOURCES.items():
        if f'"{repo}"' in script:
            tiny = folder / "tiny"
            if not tiny.exists():
                tiny_checkpoint(name, tiny)
            script = script.replace(f'"{repo}"', f'"{tiny}"')
    # A torchrun process's own GPU, and the first GPU: the CPU here.
    script = script.replace('"cuda:0"', '"cpu"').replace('int(os.environ["LOCAL_RANK"])', '"cpu"')
    namespace = {}
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        compile(script, "<pasted>", "exec")
        if "dispatch_model(model" in script:
            return None  # the user's own model instance: compiled and imported only
        # The Trainer's arguments refuse bf16 where no GPU has it: a GPU with bf16 here.
        import transformers.training_args as training_args
        training_args.is_torch_bf16_gpu_available = lambda: True
        exec(script, namespace)  # noqa: S102
        if "model" in namespace and "peft_config" in namespace:
            import peft
            peft.get_peft_model(namespace["model"], namespace["peft_config"])
        return None
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"[:600] + "\n" + traceback.format_exc()[-800:]
    finally:
        os.chdir(cwd)


def check_shell(line):
    program = line.split()[0]
    if program == "torchrun":
        from torch.distributed.run import get_args_parser
        try:
            get_args_parser().parse_args(line.split()[1:])
            return "parsed", None
        except SystemExit as e:
            return "parsed", f"torchrun's parser exited {e.code}"
    if program == "vllm":
        return "not checked: vLLM is not in the reference venv (its wheel pins a torch build of its own)", None
    return "not checked: llama.cpp's server is not on PyPI", None


def main():
    records = []
    for name, args in CASES:
        folder = Path(tempfile.mkdtemp(prefix="vramplan-paste-"))
        try:
            argv = [a.replace(MAP, str(folder / "device_map.json")) for a in args]
            done = subprocess.run([VRAMPLAN, *argv], capture_output=True, text=True, timeout=600, cwd=common.REPO)
            lines = [line.replace(f"{folder}/", "") for line in pasteable(done.stdout)]
            if (folder / "device_map.json").exists():
                remap(folder / "device_map.json")
            shell = [line for line in lines if line.split()[0] in ("vllm", "llama-server", "torchrun")]
            python = [line for line in lines if line not in shell]
            record = {"name": name, "args": args, "exit": done.returncode, "lines": lines, "python": None,
                      "shell": []}
            if python:
                error = run_python(python, folder)
                record["python"] = {"ran": error is None, "error": error}
            for line in shell:
                how, error = check_shell(line)
                record["shell"].append({"line": line, "checked": how, "error": error})
            ok = (record["python"] or {}).get("ran", True) and all(s["error"] is None for s in record["shell"])
            print(f"{name}: exit {done.returncode}, {len(lines)} lines, {'ok' if ok else 'FAILED'}", flush=True)
            if not ok:
                print("\n".join(lines), (record["python"] or {}).get("error"), record["shell"], sep="\n")
            records.append(record)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    document = {"about": "Every line vramplan printed to paste, run with the real libraries: "
                         "scripts/reference/pasteable.py", "versions": {**common.versions(),
                                                                         "trl": __import__("trl").__version__},
                "records": records}
    common.write_fixture(OUT, document)


if __name__ == "__main__":
    main()
