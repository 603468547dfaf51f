#!/usr/bin/env bash
# Installs what is missing, checks formatting, then builds and runs every test: the C++ tests in
# the release build, the Python tests (scripts/test_python.sh: kiln._C and tests/python with
# torch on the CPU), and the C++ tests again in the debug build with AddressSanitizer and
# UndefinedBehaviorSanitizer. Each phase prints how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
./scripts/setup.sh
echo "== setup took $((SECONDS - start)) s"

echo "== format check (clang-format)"
files=$(git ls-files '*.h' '*.cpp' 2>/dev/null || find include src tools tests examples -name '*.h' -o -name '*.cpp')
clang-format --dry-run --Werror $files

for preset in release debug; do
  start=$SECONDS
  echo "== $preset build"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset"
  echo "== $preset build took $((SECONDS - start)) s"
  start=$SECONDS
  echo "== $preset tests"
  ctest --preset "$preset" -j 2
  echo "== $preset tests took $((SECONDS - start)) s"
  if [ "$preset" = release ]; then
    ./scripts/test_python.sh
  fi
done
echo "== all tests passed"
