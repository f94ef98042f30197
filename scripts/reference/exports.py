"""Parses every runnable export vramplan writes (`plan -o FILE --format vllm|sglang|deepspeed|
fsdp|torchrun`) with the real tool's own parser, installed from PyPI:

- `vllm serve` lines: vLLM's `make_arg_parser(FlexibleArgumentParser())` (the parser `vllm serve`
  builds), then `AsyncEngineArgs.from_cli_args` on what it parsed;
- SGLang's `python -m sglang.launch_server` lines: `ServerArgs.add_cli_args` on an argparse parser;
- DeepSpeed config JSON: `deepspeed.runtime.config.DeepSpeedConfig` (stage, offload, batch sizes,
  bf16/fp16 as DeepSpeed reads them);
- accelerate FSDP config YAML: `accelerate.commands.config.config_args.load_config_from_file`
  (refuses unknown keys), then `accelerate launch`'s own validation and environment
  (`_validate_launch_command`, `prepare_multi_gpu_env`) for each launch line;
- `accelerate launch` lines: `accelerate.commands.launch.launch_command_parser`;
- `torchrun` lines: `torch.distributed.run.get_args_parser`;
- every script: `bash -n` (the shell's own parser).

vLLM and SGLang pin torch builds of their own, so they (and the few pure-Python modules their
argument code imports) are installed without dependencies into scripts/reference/.venv5-engines,
put on sys.path here; torch, accelerate and DeepSpeed are .venv5's own.

Each plan also names, by hand, what its export must say once parsed (`expect`: the tool's own
attribute names and values, from the plan's flags: e.g. a 70B on 2 nodes of 8 GPUs with
`--parallel tp=16` is vLLM's tensor parallel 8 x pipeline parallel 2); a parsed value that
differs is a failed verdict.

Writes fixtures/reference/exports/v5.json: per plan the arguments, every file the export wrote
(text), and per file and line the tool, whether it accepted it, and the values it parsed.
`tests/tests/exports.rs` regenerates the exports, holds them equal to the recorded ones and
every verdict to accepted.

Run by scripts/reference/run exports (no GPU).
"""

import argparse
import contextlib
import io
import json
import os
import shlex
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENGINES = HERE / ".venv5-engines"
sys.path.insert(0, str(ENGINES))
# vLLM's config classes infer the device at construction; on this GPU-less machine, its CPU platform.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import common  # noqa: E402

VRAMPLAN = os.environ.get("VRAMPLAN", str(common.REPO / "target" / "debug" / "vramplan"))
OUT = common.FIXTURES / "exports" / f"{common.TAG}.json"
ADDR = "10.0.0.1"  # what the user puts in MASTER_ADDR, for the parsers
CHECKPOINT = "an-org/a-checkpoint-quantized-AWQ-or-GPTQ"  # what the user puts in CHECKPOINT

INF = ["--mode", "inference", "--engine", "vllm"]
TRAIN = ["--mode", "train", "--dtype", "bf16", "--grad-ckpt", "full"]
H8N4 = ["--hardware", "h100-80gb-x8-n4"]
H8N2 = ["--hardware", "h100-80gb-x8-n2"]

# (name, file, vramplan plan arguments, expected parsed values per tool)
PLANS = [
    ("vllm-8b-1gpu", "serve.sh",
     ["llama-3.1-8b", "--hardware", "h100-80gb", *INF, "--gpu-memory-utilization", "0.85", "--seq", "8192",
      "--batch", "4"],
     {"vllm": {"model_tag": "meta-llama/Llama-3.1-8B", "tensor_parallel_size": 1, "pipeline_parallel_size": 1,
               "max_model_len": 8192, "gpu_memory_utilization": 0.85, "max_num_seqs": 4, "dtype": "auto",
               "kv_cache_dtype": "auto"}}),
    ("vllm-70b-fp8-tp4", "serve.sh",
     ["llama-3.1-70b", "--hardware", "h100-80gb-x8", *INF, "--parallel", "tp=4", "--quant", "fp8", "--seq", "8192",
      "--batch", "8", "--format", "vllm"],
     {"vllm": {"tensor_parallel_size": 4, "quantization": "fp8", "max_num_seqs": 8}}),
    ("vllm-7b-awq-fp8kv", "serve.sh",
     ["mistral-7b", "--hardware", "l40s", *INF, "--gpu-memory-utilization", "0.85", "--quant", "awq", "--kv-dtype",
      "fp8", "--seq", "8192", "--batch", "4"],
     {"vllm": {"model_tag": CHECKPOINT, "quantization": "awq", "kv_cache_dtype": "fp8_e4m3", "max_model_len": 8192}}),
    ("vllm-70b-2-nodes", "serve.sh",
     ["llama-3.1-70b", *H8N2, *INF, "--parallel", "tp=8,pp=2", "--seq", "32768", "--batch", "16"],
     {"vllm": {"tensor_parallel_size": 8, "pipeline_parallel_size": 2, "max_model_len": 32768, "nnodes": 2,
               "master_addr": ADDR}}),
    ("vllm-mixtral-dp2-ep", "serve.sh",
     ["mixtral-8x7b", "--hardware", "h100-80gb-x8", *INF, "--parallel", "tp=4", "--data-parallel-size", "2",
      "--enable-expert-parallel", "--seq", "8192", "--batch", "16"],
     {"vllm": {"tensor_parallel_size": 4, "data_parallel_size": 2, "enable_expert_parallel": True}}),
    ("sglang-8b-1gpu", "sglang.sh",
     ["llama-3.1-8b", "--hardware", "h100-80gb", *INF, "--gpu-memory-utilization", "0.8", "--seq", "8192",
      "--batch", "4", "--format", "sglang"],
     {"sglang": {"model_path": "meta-llama/Llama-3.1-8B", "tp_size": 1, "dp_size": 1, "context_length": 8192,
                 "mem_fraction_static": 0.8, "max_running_requests": 4}}),
    ("sglang-70b-tp8", "sglang.sh",
     ["llama-3.1-70b", "--hardware", "h100-80gb-x8", *INF, "--parallel", "tp=8", "--batch", "32", "--format",
      "sglang"],
     {"sglang": {"tp_size": 8, "dp_size": 1, "max_running_requests": 32}}),
    ("sglang-8b-gptq-tp2-dp2", "sglang.sh",
     ["llama-3.1-8b", "--hardware", "a100-80gb-x4", *INF, "--parallel", "tp=2", "--quant", "gptq", "--format",
      "sglang"],
     {"sglang": {"model_path": CHECKPOINT, "tp_size": 2, "dp_size": 2, "quantization": "gptq"}}),
    ("sglang-70b-4-nodes-fp8kv", "sglang.sh",
     ["llama-3.1-70b", *H8N4, *INF, "--parallel", "tp=8", "--kv-dtype", "fp8", "--format", "sglang"],
     {"sglang": {"tp_size": 8, "dp_size": 4, "nnodes": 4, "kv_cache_dtype": "fp8_e4m3"}}),
    ("deepspeed-8b-zero3", "ds_config.json",
     ["llama-3.1-8b", "--hardware", "h100-80gb-x8", *TRAIN, "--parallel", "zero3", "--batch", "2", "--seq", "2048",
      "--grad-accum", "8", "--format", "deepspeed"],
     {"deepspeed": {"zero_optimization_stage": 3, "train_micro_batch_size_per_gpu": 2,
                    "gradient_accumulation_steps": 8, "bf16": True, "fp16": False, "offload_optimizer": None,
                    "offload_param": None},
      "torchrun": {"nnodes": "1", "nproc_per_node": "8"}}),
    ("deepspeed-70b-zero3-offload-4-nodes", "ds_config.json",
     ["llama-3.1-70b", *H8N4, *TRAIN, "--parallel", "zero3", "--offload-optimizer", "--offload-params", "--batch",
      "1", "--seq", "4096", "--format", "deepspeed"],
     {"deepspeed": {"zero_optimization_stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu", "bf16": True},
      "torchrun": {"nnodes": "4", "nproc_per_node": "8", "rdzv_backend": "c10d", "rdzv_endpoint": f"{ADDR}:29500"}}),
    ("deepspeed-1b-zero1-fp16", "ds_config.json",
     ["llama-3.2-1b", "--hardware", "a100-40gb-x4", "--mode", "train", "--parallel", "zero1", "--batch", "2",
      "--seq", "1024", "--autocast", "fp16", "--grad-ckpt", "full", "--format", "deepspeed"],
     {"deepspeed": {"zero_optimization_stage": 1, "fp16": True, "bf16": False},
      "torchrun": {"nproc_per_node": "4"}}),
    ("deepspeed-3b-zero2-offload", "ds_config.json",
     ["llama-3.2-3b", "--hardware", "a100-80gb-x4", *TRAIN, "--parallel", "zero2", "--offload-optimizer",
      "--batch", "2", "--seq", "2048", "--format", "deepspeed"],
     {"deepspeed": {"zero_optimization_stage": 2, "offload_optimizer": "cpu", "offload_param": None}}),
    ("fsdp-8b-full-shard", "fsdp_config.yaml",
     ["llama-3.1-8b", "--hardware", "h100-80gb-x8", *TRAIN, "--parallel", "fsdp", "--batch", "2", "--seq", "2048",
      "--format", "fsdp"],
     {"accelerate-config": {"distributed_type": "FSDP", "num_processes": 8, "num_machines": 1,
                            "mixed_precision": "bf16", "fsdp_sharding_strategy": "FULL_SHARD",
                            "fsdp_offload_params": False}}),
    ("fsdp-70b-offload-4-nodes", "fsdp_config.yaml",
     ["llama-3.1-70b", *H8N4, *TRAIN, "--parallel", "fsdp", "--offload-params", "--offload-optimizer", "--batch",
      "1", "--seq", "4096", "--format", "fsdp"],
     {"accelerate-config": {"num_processes": 32, "num_machines": 4, "fsdp_offload_params": True},
      "accelerate-launch": {"num_machines": 4, "num_processes": 32, "main_process_ip": ADDR,
                            "main_process_port": 29500}}),
    ("fsdp-3b-shard-grad-op", "fsdp_config.yaml",
     ["llama-3.2-3b", "--hardware", "a100-80gb-x4", "--mode", "train", "--parallel", "zero2", "--batch", "2",
      "--seq", "2048", "--autocast", "bf16", "--grad-ckpt", "full", "--format", "fsdp"],
     {"accelerate-config": {"fsdp_sharding_strategy": "SHARD_GRAD_OP", "num_processes": 4}}),
    ("torchrun-ddp-1-node", "train.sh",
     ["llama-3.2-1b", "--hardware", "a100-80gb-x4", "--mode", "train", "--dtype", "bf16", "--parallel", "ddp",
      "--batch", "4", "--seq", "2048"],
     {"torchrun": {"nnodes": "1", "nproc_per_node": "4", "training_script": "train.py"}}),
    ("torchrun-ddp-4-nodes", "train.sh",
     ["llama-3.2-1b", *H8N4, *TRAIN, "--parallel", "ddp", "--batch", "8", "--seq", "2048", "--format", "torchrun"],
     {"torchrun": {"nnodes": "4", "nproc_per_node": "8", "rdzv_endpoint": f"{ADDR}:29500", "rdzv_id": "vramplan"}}),
]


def command_lines(script):
    """The commands of a script vramplan wrote: the one line, or each node's line of the case."""
    lines = []
    for line in script.splitlines():
        s = line.strip()
        if not s or s.startswith(("#", ":", "set ", "case ", "esac", "*)")):
            continue
        if ") " in s and s.split(")", 1)[0].isdigit():
            s = s.split(") ", 1)[1]
        if s.endswith(";;"):
            s = s[:-2].rstrip()
        lines.append(s)
    return lines


def words(line):
    """The line's words as the shell passes them, MASTER_ADDR and CHECKPOINT filled in (the
    pre-quantized checkpoint a user names for `--quant awq|gptq`, as `${CHECKPOINT:?...}`)."""
    out = []
    for w in shlex.split(line):
        if w.startswith("${CHECKPOINT:?") and w.endswith("}"):
            w = CHECKPOINT
        out.append(w.replace("$MASTER_ADDR", ADDR))
    return out


def parse_vllm(argv):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    assert argv[:2] == ["vllm", "serve"], argv
    import typing
    from vllm.config.cache import CacheConfig
    from vllm.config.model import ModelDType
    from vllm.config.parallel import ParallelConfig
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[2:])
    # What `vllm serve` does with its positional model (ServeSubcommand.cmd).
    if ns.model_tag is not None:
        ns.model = ns.model_tag
    # Offline, EngineArgs swaps a Hub id for its local snapshot, which this machine has none of;
    # the id is kept as given (nothing here reads the checkpoint).
    import huggingface_hub.constants
    offline, huggingface_hub.constants.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE, False
    try:
        engine = AsyncEngineArgs.from_cli_args(ns)
    finally:
        huggingface_hub.constants.HF_HUB_OFFLINE = offline
    # The values the parser leaves to the configs: each checked by the class that holds it.
    CacheConfig(cache_dtype=engine.kv_cache_dtype, gpu_memory_utilization=engine.gpu_memory_utilization)
    ParallelConfig(tensor_parallel_size=engine.tensor_parallel_size,
                   pipeline_parallel_size=engine.pipeline_parallel_size,
                   data_parallel_size=engine.data_parallel_size,
                   enable_expert_parallel=engine.enable_expert_parallel)
    if engine.quantization is not None and engine.quantization not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization {engine.quantization!r} is not one of vLLM's {QUANTIZATION_METHODS}")
    if engine.dtype not in typing.get_args(ModelDType):
        raise ValueError(f"dtype {engine.dtype!r} is not one of {typing.get_args(ModelDType)}")
    keys = ["model_tag", "tensor_parallel_size", "pipeline_parallel_size", "dtype", "quantization", "max_model_len",
            "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype", "nnodes",
            "node_rank", "master_addr", "headless", "data_parallel_size", "enable_expert_parallel"]
    parsed = {k: getattr(ns, k) for k in keys}
    parsed["engine_args_model"] = engine.model
    return parsed


def parse_sglang(argv):
    from sglang.srt.server_args import ServerArgs
    assert argv[:3] == ["python", "-m", "sglang.launch_server"], argv
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(argv[3:])
    server = ServerArgs.from_cli_args(ns)  # what launch_server builds from them
    keys = ["model_path", "tp_size", "dp_size", "dtype", "context_length", "max_running_requests",
            "mem_fraction_static", "quantization", "kv_cache_dtype", "nnodes", "node_rank", "dist_init_addr"]
    return {k: getattr(server, k) for k in keys}


def parse_torchrun(argv):
    from torch.distributed.run import get_args_parser
    assert argv[0] == "torchrun", argv
    ns = get_args_parser().parse_args(argv[1:])
    keys = ["nnodes", "nproc_per_node", "node_rank", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "training_script",
            "training_script_args"]
    return {k: getattr(ns, k) for k in keys}


def parse_deepspeed(path):
    from deepspeed.runtime.config import DeepSpeedConfig
    c = DeepSpeedConfig(str(path))
    off = lambda o: None if o is None else str(o.device.value if hasattr(o.device, "value") else o.device)  # noqa: E731
    return {"zero_optimization_stage": c.zero_optimization_stage,
            "train_micro_batch_size_per_gpu": c.train_micro_batch_size_per_gpu,
            "gradient_accumulation_steps": c.gradient_accumulation_steps,
            "bf16": bool(c.bfloat16_config.enabled), "fp16": bool(c.float16_config.enabled),
            "offload_optimizer": off(c.zero_config.offload_optimizer),
            "offload_param": off(c.zero_config.offload_param)}


def parse_accelerate_config(path):
    from accelerate.commands.config.config_args import load_config_from_file
    c = load_config_from_file(str(path))
    parsed = {"class": type(c).__name__, "distributed_type": str(c.distributed_type.value),
              "num_processes": c.num_processes, "num_machines": c.num_machines,
              "mixed_precision": str(c.mixed_precision)}
    parsed.update({k: v for k, v in c.fsdp_config.items()})
    return parsed


def parse_accelerate_launch(argv, folder):
    """`accelerate launch`'s parser, then its validation and the environment it gives the ranks
    (where the FSDP settings become FSDP_* variables)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser, prepare_multi_gpu_env
    assert argv[:2] == ["accelerate", "launch"], argv
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        args = launch_command_parser().parse_args(argv[2:])
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            args, defaults, mp = _validate_launch_command(args)
            env = prepare_multi_gpu_env(args)
    finally:
        os.chdir(cwd)
    keys = ["config_file", "machine_rank", "main_process_ip", "main_process_port", "num_machines", "num_processes",
            "use_fsdp", "training_script"]
    parsed = {k: getattr(args, k, None) for k in keys}
    parsed["env"] = {k: v for k, v in sorted(env.items()) if k.startswith(("FSDP_", "ACCELERATE_MIXED"))}
    return parsed


def expected_ok(expect, parsed):
    wrong = {k: {"expected": v, "parsed": parsed.get(k)} for k, v in expect.items() if parsed.get(k) != v}
    return wrong


def verdict(tool, fn, expect, where):
    try:
        parsed = fn()
    except SystemExit as e:
        return {"tool": tool, "where": where, "accepted": False, "error": f"parser exited {e.code}"}
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        return {"tool": tool, "where": where, "accepted": False, "error": common.err_str(e)}
    parsed = json.loads(json.dumps(parsed, default=str))
    wrong = expected_ok(expect or {}, parsed)
    return {"tool": tool, "where": where, "accepted": not wrong, "parsed": parsed, **({"wrong": wrong} if wrong else {})}


def check(name, file, args, expect):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run = subprocess.run([VRAMPLAN, "plan", *args, "-o", file], cwd=tmp, capture_output=True, text=True)
        if run.returncode != 0:
            return {"name": name, "args": args, "file": file, "error": f"vramplan exited {run.returncode}: "
                    f"{run.stderr[-500:] or run.stdout[-500:]}"}
        files = {p.name: p.read_text() for p in sorted(tmp.iterdir())}
        verdicts = []
        for fname, text in files.items():
            path = tmp / fname
            if fname.endswith(".sh"):
                sh = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
                verdicts.append({"tool": "bash -n", "where": fname, "accepted": sh.returncode == 0,
                                 **({"error": sh.stderr} if sh.returncode else {})})
                for i, line in enumerate(command_lines(text)):
                    argv = words(line)
                    where = f"{fname} line {i}"
                    if argv[0] == "vllm":
                        verdicts.append(verdict("vllm", lambda: parse_vllm(argv), expect.get("vllm"), where))
                    elif argv[0] == "python":
                        e = dict(expect.get("sglang", {}))
                        if "nnodes" in e:
                            e["node_rank"] = i
                        verdicts.append(verdict("sglang", lambda: parse_sglang(argv), e, where))
                    elif argv[0] == "torchrun":
                        e = dict(expect.get("torchrun", {}))
                        if e.get("nnodes", "1") != "1":
                            e["node_rank"] = i
                        verdicts.append(verdict("torchrun", lambda: parse_torchrun(argv), e, where))
                    elif argv[0] == "accelerate":
                        e = dict(expect.get("accelerate-launch", {}))
                        if "num_machines" in e:
                            e["machine_rank"] = i
                        verdicts.append(verdict("accelerate launch", lambda: parse_accelerate_launch(argv, tmp), e,
                                                where))
                    else:
                        verdicts.append({"tool": "?", "where": where, "accepted": False,
                                         "error": f"no parser for `{argv[0]}`"})
            elif fname.endswith(".json"):
                verdicts.append(verdict("deepspeed", lambda: parse_deepspeed(path), expect.get("deepspeed"), fname))
            elif fname.endswith(".yaml"):
                verdicts.append(verdict("accelerate config", lambda: parse_accelerate_config(path),
                                        expect.get("accelerate-config"), fname))
        return {"name": name, "args": args, "file": file, "files": files, "verdicts": verdicts}


# Each tool refuses a broken export: one changed value in a real one, so a verdict can fail.
CONTROLS = [
    ("vllm", "vllm-70b-fp8-tp4", "serve.sh", "--kv-cache-dtype auto", "--kv-cache-dtype fp9"),
    ("vllm", "vllm-70b-fp8-tp4", "serve.sh", "--quantization fp8", "--quantization fp9"),
    ("sglang", "sglang-70b-tp8", "sglang.sh", "--tp-size 8", "--tp-size eight"),
    ("sglang", "sglang-70b-tp8", "sglang.sh", "--kv-cache-dtype auto", "--kv-cache-dtype fp9"),
    ("deepspeed", "deepspeed-8b-zero3", "ds_config.json", '"stage": 3', '"stage": 4'),
    ("accelerate config", "fsdp-8b-full-shard", "fsdp_config.yaml", "num_machines: 1", "num_machine: 1"),
    ("torchrun", "torchrun-ddp-1-node", "train.sh", "--nproc-per-node 4", "--nproc-per-gpu 4"),
    ("bash -n", "torchrun-ddp-4-nodes", "train.sh", " ;;\n  *)", "\n  *)"),
]


def control(records, tool, name, fname, old, new):
    rec = next(r for r in records if r["name"] == name)
    text = rec["files"][fname]
    assert old in text, (name, fname, old)
    broken = text.replace(old, new, 1)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / fname
        path.write_text(broken)
        if tool == "bash -n":
            ok = subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
            v = {"accepted": ok}
        elif tool == "deepspeed":
            v = verdict(tool, lambda: parse_deepspeed(path), None, fname)
        elif tool == "accelerate config":
            v = verdict(tool, lambda: parse_accelerate_config(path), None, fname)
        else:
            line = command_lines(broken)[0]
            fn = {"vllm": parse_vllm, "sglang": parse_sglang, "torchrun": parse_torchrun}[tool]
            with contextlib.redirect_stderr(io.StringIO()):
                v = verdict(tool, lambda: fn(words(line)), None, fname)
        error = v.get("error", "").replace(str(path), fname)
    return {"tool": tool, "from": name, "file": fname, "changed": [old, new], "refused": not v["accepted"],
            **({"error": error} if error else {})}


def versions():
    out = common.versions()
    for mod in ("deepspeed", "vllm", "sglang"):
        try:
            from importlib.metadata import version
            out[mod] = version(mod)
        except Exception as e:  # noqa: BLE001
            out[mod] = f"unavailable: {e}"
    return out


def main():
    records = [check(*plan) for plan in PLANS]
    controls = [control(records, *c) for c in CONTROLS]
    n = sum(len(r.get("verdicts", [])) for r in records)
    bad = [(r["name"], v) for r in records for v in r.get("verdicts", []) if not v["accepted"]]
    failed = [r["name"] for r in records if "error" in r]
    common.write_fixture(OUT, {
        "about": "Every runnable export of `vramplan plan -o` for these plans, as written, and what the real tools' "
                 "parsers made of it (scripts/reference/exports.py).",
        "versions": versions(),
        "sources": {
            "vllm": "PyPI wheel vllm (version above), installed --no-deps into scripts/reference/.venv5-engines; "
                    "vllm/entrypoints/common/cli_args.py make_arg_parser, vllm/engine/arg_utils.py",
            "sglang": "PyPI wheel sglang (version above), installed --no-deps into scripts/reference/.venv5-engines; "
                      "sglang/srt/server_args.py ServerArgs.add_cli_args",
        },
        "records": records,
        "controls": controls,
    })
    print(f"{len(records)} plans, {n} verdicts, {len(bad)} refused, {len(failed)} plans not written")
    for name, v in bad:
        print("REFUSED", name, v.get("where"), v.get("error") or v.get("wrong"))
    for c in controls:
        if not c["refused"]:
            print("CONTROL ACCEPTED", c)
    for name in failed:
        print("NOT WRITTEN", name, next(r["error"] for r in records if r["name"] == name))


if __name__ == "__main__":
    main()
