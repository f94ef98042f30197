"""Type stubs of the native module (Rust, PyO3). Use the functions of `vramplan` instead."""

from typing import Dict, List, Optional, Tuple

__version__: str

def call(
    argv: List[str], model: Optional[Dict[str, Optional[str]]]
) -> Tuple[int, str, Optional[Dict[str, object]]]:
    """Runs a command line (no program name) with the CLI's parser and library, the GIL
    released; an in-memory model (`config`, `listing`, `origin`) stands for MODEL. Returns the
    exit code, what it printed, and for bad input the error's `problem`, `origin`, `key`,
    `line` and `fix` (with `kind` "internal" for a caught panic)."""

def main(argv: List[str]) -> int:
    """The `vramplan` command: runs `argv` (program name first), printing to this process's
    stdout and stderr; returns the exit code."""
