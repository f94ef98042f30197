"""Bad input raises `BadInput` with the fix; a plan that does not fit is a result, not an
exception; nothing panics across the boundary."""

from __future__ import annotations

import pytest

import vramplan


def test_a_bad_hardware_name_raises_bad_input_with_the_fix():
    with pytest.raises(vramplan.BadInput) as raised:
        vramplan.plan("pythia-1b", hardware="t5x9")
    error = raised.value
    assert error.origin == "t5x9" and "hardware profile" in error.problem
    assert error.fix and "t4" in error.fix
    assert isinstance(error, ValueError)


def test_a_bad_flag_value_raises_bad_input():
    with pytest.raises(vramplan.BadInput):
        vramplan.estimate("pythia-1b", hardware="t4", batch=0)


def test_an_unknown_keyword_raises_bad_input():
    with pytest.raises(vramplan.BadInput) as raised:
        vramplan.plan("pythia-1b", hardware="t4", lora_rnak=16)
    assert "lora_rnak=" in raised.value.problem
    assert "lora_rank=" in (raised.value.fix or "")


def test_a_plan_that_does_not_fit_is_a_result():
    plan = vramplan.plan("llama-3.1-405b", hardware="t4", mode="inference", no_offload=True)
    assert plan.fits is False
    assert plan.exit_code == 1
    assert plan.data["verdict"] != "fits"


def test_a_model_of_no_known_kind_raises_bad_input():
    with pytest.raises(vramplan.BadInput):
        vramplan.inspect(3.14)
