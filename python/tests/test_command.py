"""The `vramplan` command the wheel installs: the Rust command line run by the package, with no
Rust toolchain needed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from conftest import run_binary, timeless_text


def installed_command() -> str:
    """The `vramplan` script of the environment running the tests."""
    script = os.path.join(os.path.dirname(sys.executable), "vramplan")
    assert os.path.exists(script), f"no {script}: the wheel installs the command"
    return script


def test_the_installed_command_plans_as_the_binary():
    argv = ["plan", "pythia-1b", "--hardware", "t4x2", "--mode", "train", "--lora-rank", "16", "--json"]
    done = subprocess.run([installed_command(), *argv], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    _, out = run_binary(argv)
    assert timeless_text(done.stdout) == timeless_text(out)


def test_the_installed_command_reports_bad_input_with_exit_2():
    done = subprocess.run([installed_command(), "plan", "pythia-1b", "--hardware", "t5x9"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "fix:" in done.stderr


def test_no_rust_toolchain_is_needed():
    # scripts/python-test runs these tests with a PATH that has no cargo or rustc.
    if os.environ.get("VRAMPLAN_NO_TOOLCHAIN_CHECK"):
        return
    if shutil.which("cargo") is None:
        done = subprocess.run([installed_command(), "--version"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout.startswith("vramplan")
