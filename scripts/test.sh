#!/usr/bin/env bash
# Installs what is missing, checks formatting, then builds and runs every test twice: in the
# release build and in the debug build with AddressSanitizer and UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh

echo "== format check (clang-format)"
files=$(git ls-files '*.h' '*.cpp' 2>/dev/null || find include src tools tests examples -name '*.h' -o -name '*.cpp')
clang-format --dry-run --Werror $files

for preset in release debug; do
  echo "== $preset build"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset"
  echo "== $preset tests"
  ctest --preset "$preset" -j 2
done
echo "== all tests passed"
