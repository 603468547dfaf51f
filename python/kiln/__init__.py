"""kiln: a tensor-program JIT compiler for PyTorch functions.

`kiln.trace(fn, *args)` runs `fn` on proxy tensors and returns the program as kiln trace text,
which the C++ tools (`kiln-opt`) read. `kiln.jit(fn)` traces, compiles and runs `fn` through the
C++ extension `kiln._C` (CPU so far); `kiln.HAVE_EXTENSION` says whether it is built. Where the
package is imported from the source tree, $KILN_EXT_DIR names a directory holding the built
`_C` module (a CMake build's `<build>/python/kiln`). `torch.compile(model, backend="kiln")`
(or `backend=kiln.backend`) compiles each graph Dynamo captures with kiln (kiln._backend).
"""

import os as _os

if _os.environ.get("KILN_EXT_DIR"):
    __path__.append(_os.environ["KILN_EXT_DIR"])  # noqa: F821 (the package's search path)

from ._errors import KilnError, SourceLocation, TraceError, UnsupportedError
from ._tracer import Proxy, TracedProgram, trace, trace_program
from . import _lowering  # noqa: F401  (registers the op rules before the first trace)
from . import _lowering_views  # noqa: F401  (views, splits, the constant pad)
from . import _lowering_creation  # noqa: F401  (factories)
from . import _lowering_nn  # noqa: F401  (softmax, the norms, dropout)
from . import _lowering_index  # noqa: F401  (index reads and writes; replaces getitem/setitem)
from . import _lowering_foreach  # noqa: F401  (foreach ops, as their per-tensor ops)
from ._jit import JitFunction, jit, kernel_cache_stats, last_stats, last_traces
from ._jit import _C
from ._module import JitModule
from ._backend import backend, backend_graphs, clear_backend_graphs

HAVE_EXTENSION = _C is not None
# An index out of range in a kernel's index (an IndexError and a RuntimeError, as eager's are).
IndexOutOfRangeError = _C.IndexOutOfRangeError if _C is not None else IndexError

__all__ = [
    "HAVE_EXTENSION",
    "IndexOutOfRangeError",
    "backend",
    "backend_graphs",
    "clear_backend_graphs",
    "JitFunction",
    "JitModule",
    "jit",
    "kernel_cache_stats",
    "last_stats",
    "last_traces",
    "KilnError",
    "Proxy",
    "SourceLocation",
    "TraceError",
    "TracedProgram",
    "UnsupportedError",
    "trace",
    "trace_program",
]
