"""The exceptions vramplan raises: bad input (with the file, the key or line, and the fix), and
an internal error (a bug in vramplan: the message says what to report). A plan or an estimate
that does not fit is not an exception: its result says so (`.fits` is False)."""

from __future__ import annotations

from typing import Optional

__all__ = ["VramplanError", "BadInput", "InternalError"]


class VramplanError(Exception):
    """Base class of every exception vramplan raises."""


class BadInput(VramplanError, ValueError):
    """The input cannot be used: which input (`origin`: a file, a flag, a model), where in it
    (`key` or `line`), what is wrong (`problem`) and how to fix it (`fix`). The command line
    exits with code 2 for the same input."""

    def __init__(
        self,
        problem: str,
        origin: str = "",
        key: Optional[str] = None,
        line: Optional[int] = None,
        fix: Optional[str] = None,
    ) -> None:
        self.problem = problem
        self.origin = origin
        self.key = key
        self.line = line
        self.fix = fix
        where = origin
        if key:
            where += f": key `{key}`"
        elif line:
            where += f": line {line}"
        text = f"{where}: {problem}" if where else problem
        if fix:
            text += f"\n  fix: {fix}"
        super().__init__(text)


class InternalError(VramplanError, RuntimeError):
    """vramplan failed where it should not have (a panic caught at the boundary). Please report
    it with the call that raised it."""
