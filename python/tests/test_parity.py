"""The package against the command line: each function gives the JSON the Rust binary's `--json`
prints for the same input (run times aside), for every command."""

from __future__ import annotations

import json

import pytest

import vramplan
from conftest import run_binary, timeless, timeless_text

# (function call, the command line it stands for)
CASES = [
    (
        lambda: vramplan.plan("mixtral-8x7b", hardware="t4x2", mode="inference", quant="nf4", target="accelerate-v4"),
        ["plan", "mixtral-8x7b", "--hardware", "t4x2", "--mode", "inference", "--quant", "nf4", "--target", "accelerate-v4"],
    ),
    (
        lambda: vramplan.plan("pythia-1b", hardware="t4x2", mode="train", lora_rank=16, grad_ckpt=True, batch=2, seq=2048),
        ["plan", "pythia-1b", "--hardware", "t4x2", "--mode", "train", "--lora-rank", "16", "--grad-ckpt", "full", "--batch", "2", "--seq", "2048"],
    ),
    (
        lambda: vramplan.plan("llama-2-70b", hardware="a100-40gb-x4", mode="inference", pin=["lm_head=3"], time_limit=30),
        ["plan", "llama-2-70b", "--hardware", "a100-40gb-x4", "--mode", "inference", "--pin", "lm_head=3", "--time-limit", "30"],
    ),
    (
        lambda: vramplan.plan("qwen2.5-7b", hardware="rtx4090+rtx3090", mode="inference", target="llama.cpp", engine="llama.cpp", quant="q4_k_m"),
        ["plan", "qwen2.5-7b", "--hardware", "rtx4090+rtx3090", "--mode", "inference", "--target", "llama.cpp", "--engine", "llama.cpp", "--quant", "q4_k_m"],
    ),
    (
        lambda: vramplan.estimate("llama-3.1-8b", hardware="a100-80gb", mode="train", lora_rank=16, quant="nf4", batch=4, seq=1024),
        ["estimate", "llama-3.1-8b", "--hardware", "a100-80gb", "--mode", "train", "--lora-rank", "16", "--quant", "nf4", "--batch", "4", "--seq", "1024"],
    ),
    (
        lambda: vramplan.estimate("qwen2.5-vl-7b-instruct", hardware="h100-80gb", mode="inference", images=2, image_size="1024x768", seq=512),
        ["estimate", "qwen2.5-vl-7b-instruct", "--hardware", "h100-80gb", "--mode", "inference", "--images", "2", "--image-size", "1024x768", "--seq", "512"],
    ),
    (
        lambda: vramplan.whatif("max-batch", "llama-3.1-8b", hardware="a100-80gb", mode="train", lora_rank=16, seq=2048),
        ["whatif", "max-batch", "llama-3.1-8b", "--hardware", "a100-80gb", "--mode", "train", "--lora-rank", "16", "--seq", "2048"],
    ),
    (
        lambda: vramplan.whatif("min-gpus", "llama-3.3-70b", hardware="h100-80gb", mode="inference", seq=4096),
        ["whatif", "min-gpus", "llama-3.3-70b", "--hardware", "h100-80gb", "--mode", "inference", "--seq", "4096"],
    ),
    (
        lambda: vramplan.inspect("gemma-2-9b"),
        ["inspect", "gemma-2-9b"],
    ),
    (
        lambda: vramplan.check({"": 0}, "pythia-410m", hardware="t4", mode="inference"),
        None,  # the binary reads the same map from a file (below)
    ),
]


@pytest.mark.parametrize("index", range(len(CASES)))
def test_each_function_gives_the_commands_json(index, tmp_path):
    call, argv = CASES[index]
    result = call()
    if argv is None:
        path = tmp_path / "map.json"
        path.write_text(json.dumps({"": 0}))
        argv = ["check", str(path), "pythia-410m", "--hardware", "t4", "--mode", "inference"]
    code, out = run_binary([*argv, "--json"])
    assert result.exit_code == code, (argv, code)
    assert timeless_text(result.to_json()) == timeless_text(out), argv
    if '"seconds"' not in out:
        # No run time in it: byte for byte.
        assert result.to_json() == out, argv


def test_plan_device_map_is_the_commands_map_in_its_order():
    plan = vramplan.plan("mixtral-8x7b", hardware="t4x2", mode="inference", quant="nf4", target="accelerate-v4")
    _, out = run_binary(
        ["plan", "mixtral-8x7b", "--hardware", "t4x2", "--mode", "inference", "--quant", "nf4", "--target", "accelerate-v4", "--json"]
    )
    expected = json.loads(out)["device_map"]
    assert list(plan.device_map.items()) == list(expected.items())
    assert plan.fits and plan.devices and timeless(plan.data) == timeless(json.loads(out))


def test_profiles_list_the_commands_profiles():
    _, out = run_binary(["profiles", "--json"])
    assert vramplan.profiles() == json.loads(out)


def test_plot_gives_the_commands_drawing(tmp_path):
    drawn = vramplan.plot("breakdown", "pythia-1b", hardware="t4x2", mode="train", lora_rank=16, batch=2, seq=2048)
    path = tmp_path / "b.svg"
    code, _ = run_binary(
        ["plot", "breakdown", "pythia-1b", "--hardware", "t4x2", "--mode", "train", "--lora-rank", "16", "--batch", "2", "--seq", "2048", "-o", str(path)]
    )
    assert code == 0
    assert drawn.data == path.read_text()


def test_validate_gives_the_commands_json(tmp_path):
    plan_file = tmp_path / "plan.yaml"
    code, _ = run_binary(["plan", "pythia-410m", "--hardware", "t4x2", "--mode", "inference", "-o", str(plan_file)])
    assert code == 0
    result = vramplan.validate(str(plan_file), backend="cpu")
    code, out = run_binary(["validate", str(plan_file), "--backend", "cpu", "--json"])
    assert result.exit_code == code
    assert timeless_text(result.to_json()) == timeless_text(out)
