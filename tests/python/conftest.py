# The tests import the package from the source tree (an installed kiln is shadowed).
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

# kiln._C from this checkout's CMake build (cmake -DKILN_BUILD_PYTHON=ON -B build/py), unless
# $KILN_EXT_DIR names another; tests that need it skip when it is not there.
os.environ.setdefault(
    "KILN_EXT_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "py", "python", "kiln")
)
