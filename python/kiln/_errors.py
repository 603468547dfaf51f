"""kiln's Python exceptions and the user's source location they name."""

from __future__ import annotations

import dataclasses
import linecache
import os
import sys

import torch


class KilnError(Exception):
    """Base class of the errors kiln raises about a user's program."""


class UnsupportedError(KilnError):
    """The program calls a torch op (or uses an argument form) kiln cannot compile.

    `op` names the torch function as the user wrote it (`torch.cumsum`, `torch.Tensor.cumsum`,
    `torch.nn.functional.hardtanh`), `location` is the user's line that called it.
    """

    def __init__(self, message: str, op: str | None = None, location: SourceLocation | None = None):
        super().__init__(message)
        self.op = op
        self.location = location


class TraceError(KilnError):
    """The program needs something that does not exist while tracing, most often the value of a
    tensor (Python control flow on tensor data). `location` is the user's line that needs it."""

    def __init__(self, message: str, location: SourceLocation | None = None):
        super().__init__(message)
        self.location = location


@dataclasses.dataclass(frozen=True)
class SourceLocation:
    filename: str
    lineno: int
    text: str  # the source line, stripped ("" when the file cannot be read)

    def short(self) -> str:
        """`file.py:7`, as trace comments write it."""
        return f"{os.path.basename(self.filename)}:{self.lineno}"

    def describe(self) -> str:
        """`path/to/file.py:7 (`y = x.cumsum(0)`)`, for error messages."""
        return f"{self.filename}:{self.lineno}" + (f" (`{self.text}`)" if self.text else "")


# Frames inside these folders are kiln's or torch's own: the user's line is the first frame
# outside both (torch.nn.functional and torch/_tensor.py wrappers sit between the user and the
# tracer for calls such as F.relu(x, inplace=True) or `2 - x`).
_KILN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def user_location() -> SourceLocation | None:
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        path = os.path.abspath(filename) if not filename.startswith("<") else filename
        if not path.startswith(_KILN_DIR) and not path.startswith(_TORCH_DIR):
            lineno = frame.f_lineno
            text = linecache.getline(filename, lineno).strip()
            return SourceLocation(filename, lineno, text)
        frame = frame.f_back
    return None
