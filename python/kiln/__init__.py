"""kiln: a tensor-program JIT compiler for PyTorch functions.

This package holds the Python front end. So far it has the tracer: `kiln.trace(fn, *args)`
runs `fn` on proxy tensors and returns the program as kiln trace text, which the C++ tools
(`kiln-opt`) read. `kiln.jit`, which compiles and runs the trace, comes with the C++ extension.
"""

from ._errors import KilnError, SourceLocation, TraceError, UnsupportedError
from ._tracer import Proxy, TracedProgram, trace, trace_program
from . import _lowering  # noqa: F401  (registers the op rules before the first trace)

__all__ = [
    "KilnError",
    "Proxy",
    "SourceLocation",
    "TraceError",
    "TracedProgram",
    "UnsupportedError",
    "trace",
    "trace_program",
]
