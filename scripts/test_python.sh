#!/usr/bin/env bash
# Installs the Python packages that are missing (scripts/setup.sh --python), builds the extension
# kiln._C and kiln-opt in build/py (Release, no C++ tests, so GoogleTest is not needed; or in
# KILN_PYTHON_BUILD_DIR, a build tree configured with KILN_BUILD_PYTHON=ON), and runs
# the Python tests tests/python and the model zoo tests/models on the CPU with them. scripts/test.sh calls it.
#   KILN_PYTHON=/path/to/python   test with that interpreter instead of .venv/bin/python
#   KILN_RANDOM_PROGRAMS=N        random programs per random-program test (here 500 unless set)
# Extra arguments go to pytest (e.g. -k jit, --durations=15).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --python
py=$("${KILN_PYTHON:-.venv/bin/python}" -c 'import sys; print(sys.executable)')

start=$SECONDS
build=${KILN_PYTHON_BUILD_DIR:-build/py}
echo "== python extension build (kiln._C and kiln-opt in $build)"
if [ -z "${KILN_PYTHON_BUILD_DIR:-}" ]; then
  cmake -S . -B build/py -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_PYTHON=ON \
    -DPython_EXECUTABLE="$py" >/dev/null
fi
cmake --build "$build" -j 2 --target _C kiln-opt
echo "== python extension build took $((SECONDS - start)) s"

# The tests skip what they cannot run (kiln._C not built, kiln-opt not found); here both must be
# there, so a broken build fails instead of passing with skips.
export KILN_EXT_DIR=$PWD/$build/python/kiln
export KILN_OPT=$PWD/$build/tools/kiln-opt/kiln-opt
export KILN_CACHE_DIR=$PWD/build/kernel-cache # as for ctest: not the user's ~/.cache/kiln
export KILN_RANDOM_PROGRAMS=${KILN_RANDOM_PROGRAMS:-500}
[ -x "$KILN_OPT" ] || { echo "test_python: no kiln-opt at $KILN_OPT" >&2; exit 1; }
PYTHONPATH=$PWD/python "$py" -c '
import os, sys, torch, kiln
assert kiln.HAVE_EXTENSION, "kiln._C does not import from " + os.environ["KILN_EXT_DIR"]
pin = "" if torch.__version__.startswith("2.11.") else " (python/requirements.txt pins 2.11.0)"
print(f"python {sys.version.split()[0]} ({sys.executable}), torch {torch.__version__}{pin}")'

start=$SECONDS
echo "== python tests (KILN_RANDOM_PROGRAMS=$KILN_RANDOM_PROGRAMS)"
"$py" -m pytest -q -rs tests/python tests/models "$@"
echo "== python tests took $((SECONDS - start)) s"
