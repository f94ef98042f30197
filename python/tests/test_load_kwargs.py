"""`Plan.load_kwargs` and `Plan.loaded_by` on the binary's own `plan --json`: under another
program than transformers (`--trainer torchtune`) no `from_pretrained` arguments are given
(`load_kwargs` raises, naming the program), where the HF Trainer's plan of the same map gives
them."""

from __future__ import annotations

import json

import pytest

from conftest import run_binary
from vramplan._errors import BadInput, VramplanError
from vramplan._results import Plan

ARGS = ["plan", "llama-3.2-1b", "--hardware", "2xt4", "--mode", "train", "--lora-rank", "8", "--seq", "512", "--dtype", "fp16", "--json"]


def plan_of(argv):
    code, out = run_binary(argv)
    return Plan(json.loads(out), code, argv, None)


def test_another_trainer_gives_no_load_kwargs():
    plan = plan_of([*ARGS, "--trainer", "torchtune"])
    assert plan.data["load_kwargs"] is None
    assert plan.loaded_by["program"] == "torchtune"
    with pytest.raises(BadInput, match="torchtune loads this model") as raised:
        plan.load_kwargs
    assert isinstance(raised.value, VramplanError) and isinstance(raised.value, ValueError)
    assert raised.value.origin == "--trainer" and raised.value.fix


def test_the_hf_trainer_gives_load_kwargs():
    plan = plan_of(ARGS)
    assert plan.loaded_by is None
    assert "dtype" in plan.data["load_kwargs"]
