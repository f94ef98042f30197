"""The `vramplan` command the wheel installs: the Rust command line itself, run in this
process, so a Python user has the CLI with no Rust toolchain."""

from __future__ import annotations

import sys

from . import _vramplan as _native


def main() -> None:
    """Runs `vramplan ARGS…` and exits with its code."""
    sys.stdout.flush()
    sys.exit(_native.main(["vramplan", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
