# tests/python and tests/models: the tests import the package from the source tree (an installed
# kiln is shadowed).
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

# kiln._C from this checkout's CMake build (cmake -DKILN_BUILD_PYTHON=ON -B build/py), unless
# $KILN_EXT_DIR names another; tests that need it skip when it is not there.
os.environ.setdefault(
    "KILN_EXT_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "py", "python", "kiln")
)

# Every traced program also checks kiln's own result-metadata rules (python/kiln/_metadata.py)
# against PyTorch's meta kernels.
os.environ.setdefault("KILN_CHECK_METADATA", "1")
# Every eager step checks that the op wrote into no argument kiln did not find written
# (python/kiln/_fallback.py): a lost write through any fallback path fails the test that ran it.
os.environ.setdefault("KILN_CHECK_FALLBACK_WRITES", "1")

# KILN_TEST_DEVICE=cuda runs the same tests on CUDA tensors: it becomes torch's default device, so
# every tensor the tests and the programs under test make (torch.arange, torch.ones, ...) is on
# it, as a user's would be. Tests of the C++ tool kiln-opt (the CPU reference) skip there.
import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("KILN_TEST_DEVICE"):
    torch.set_default_device(os.environ["KILN_TEST_DEVICE"])


# KILN_TEST_SHARD=i/n keeps every n-th test from the i-th (0 <= i < n), in collection order, so that
# n processes run the suite together (scripts/gpu_check.sh, KILN_PYTEST_JOBS: most of a CUDA test's
# time is NVRTC compiling on one core).
def pytest_collection_modifyitems(config, items):
    shard = os.environ.get("KILN_TEST_SHARD")
    if not shard:
        return
    try:
        index, count = (int(part) for part in shard.split("/"))
    except ValueError:
        raise ValueError(f"KILN_TEST_SHARD={shard!r}: expected i/n, as 0/4") from None
    if not 0 <= index < count:
        raise ValueError(f"KILN_TEST_SHARD={shard!r}: the shard index must be in [0, {count})")
    kept = [item for k, item in enumerate(items) if k % count == index]
    config.hook.pytest_deselected(items=[item for k, item in enumerate(items) if k % count != index])
    items[:] = kept


# Tests of torch.compile(backend="kiln") start and end with Dynamo's caches and kiln's list of
# backend graphs empty.
@pytest.fixture
def fresh_dynamo():
    import kiln

    torch._dynamo.reset()
    kiln.clear_backend_graphs()
    yield
    torch._dynamo.reset()
