"""What the tests share: the repository root (for fixtures), the command-line binary built by
cargo (the independent side of the parity tests: `VRAMPLAN_BIN`, else target/release or
target/debug), and JSON without its run times."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
from typing import Any, List, Tuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def cli_binary() -> str:
    """The Rust binary `cargo build` made, which these tests hold the package against."""
    given = os.environ.get("VRAMPLAN_BIN")
    if given:
        return given
    # The newest of the two builds, so a stale one is never the reference.
    built = [ROOT / "target" / profile / "vramplan" for profile in ("release", "debug")]
    built = [path for path in built if path.exists()]
    if built:
        return str(max(built, key=lambda path: path.stat().st_mtime))
    pytest.skip("no vramplan binary built by cargo (set VRAMPLAN_BIN)")
    raise AssertionError  # unreachable


def run_binary(argv: List[str]) -> Tuple[int, str]:
    """The binary's exit code and stdout for `argv` (no program name)."""
    done = subprocess.run([cli_binary(), *argv], capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout


def timeless(value: Any) -> Any:
    """`value` with every solver run time (`seconds`) removed: the one field that differs
    between two runs of the same plan."""
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items() if k != "seconds"}
    if isinstance(value, list):
        return [timeless(v) for v in value]
    return value


def timeless_text(text: str) -> str:
    """A JSON text re-serialised without its run times, for byte comparisons."""
    return json.dumps(timeless(json.loads(text)), indent=2)


def fixture(*parts: str) -> pathlib.Path:
    return ROOT.joinpath("fixtures", *parts)


def has_command(name: str) -> bool:
    return shutil.which(name) is not None
