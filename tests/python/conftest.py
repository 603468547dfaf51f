# The tests import the package from the source tree (an installed kiln is shadowed).
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

# kiln._C from this checkout's CMake build (cmake -DKILN_BUILD_PYTHON=ON -B build/py), unless
# $KILN_EXT_DIR names another; tests that need it skip when it is not there.
os.environ.setdefault(
    "KILN_EXT_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "py", "python", "kiln")
)

# Every traced program also checks kiln's own result-metadata rules (python/kiln/_metadata.py)
# against PyTorch's meta kernels.
os.environ.setdefault("KILN_CHECK_METADATA", "1")

# KILN_TEST_DEVICE=cuda runs the same tests on CUDA tensors: it becomes torch's default device, so
# every tensor the tests and the programs under test make (torch.arange, torch.ones, ...) is on
# it, as a user's would be. Tests of the C++ tool kiln-opt (the CPU reference) skip there.
import torch  # noqa: E402

if os.environ.get("KILN_TEST_DEVICE"):
    torch.set_default_device(os.environ["KILN_TEST_DEVICE"])
