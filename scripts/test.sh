#!/usr/bin/env bash
# Installs what is missing, checks formatting, then builds and runs every test: the C++ tests in
# the release build, the Python tests (scripts/test_python.sh: kiln._C, built in the release
# tree, and tests/python with torch on the CPU), and the C++ tests again in the debug build with AddressSanitizer and
# UndefinedBehaviorSanitizer. Each phase prints how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
./scripts/setup.sh
echo "== setup took $((SECONDS - start)) s"

echo "== format check (clang-format)"
files=$(git ls-files '*.h' '*.cpp' 2>/dev/null || find include src tools tests examples -name '*.h' -o -name '*.cpp')
clang-format --dry-run --Werror $files

# The release build also builds kiln._C and kiln-opt for the Python tests (its libraries
# position-independent), which a build of their own in build/py took 4.6 minutes of CI's 50 for.
py=$("${KILN_PYTHON:-.venv/bin/python}" -c 'import sys; print(sys.executable)')
for preset in release debug; do
  start=$SECONDS
  echo "== $preset build"
  if [ "$preset" = release ]; then
    cmake --preset release -DKILN_BUILD_PYTHON=ON -DPython_EXECUTABLE="$py" >/dev/null
  else
    cmake --preset "$preset" >/dev/null
  fi
  cmake --build --preset "$preset"
  echo "== $preset build took $((SECONDS - start)) s"
  start=$SECONDS
  echo "== $preset tests"
  ctest --preset "$preset" -j 2
  echo "== $preset tests took $((SECONDS - start)) s"
  if [ "$preset" = release ]; then
    KILN_PYTHON_BUILD_DIR=build/release ./scripts/test_python.sh
  fi
done
echo "== all tests passed"
