#!/usr/bin/env bash
# Installs what building and testing kiln needs, when it is missing: a C++20 compiler, CMake,
# Ninja, GoogleTest, FileCheck (llvm-14-tools), clang-format (Debian packages), lit (PyPI, into
# .venv), and the Python packages of python/requirements.txt (PyPI: torch, nanobind, pytest, ...).
# Safe to run again: it installs nothing that is already there.
#
#   scripts/setup.sh            everything
#   scripts/setup.sh --python   only the Python packages (what scripts/test_python.sh needs)
#
# The Python packages go into .venv/ (created with python3 -m venv), or, with
# KILN_PYTHON=/path/to/python, into that interpreter's environment. A package counts as there
# when that interpreter can import it, whatever its version, so an interpreter that has them all
# needs no package registry. With KILN_PYTHON, only what the Python tests need (torch, nanobind,
# pytest, and transformers and torchvision for the model zoo) is installed when missing; the
# others are reported.
set -euo pipefail
cd "$(dirname "$0")/.."

python_only=0
[ "${1:-}" = "--python" ] && python_only=1

if [ $python_only -eq 0 ]; then
  need_apt=()
  command -v g++ >/dev/null || need_apt+=(g++)
  command -v cmake >/dev/null || need_apt+=(cmake)
  command -v ninja >/dev/null || need_apt+=(ninja-build)
  command -v clang-format >/dev/null || need_apt+=(clang-format)
  [ -x /usr/lib/llvm-14/bin/FileCheck ] || command -v FileCheck >/dev/null || need_apt+=(llvm-14-tools)
  [ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev googletest)
  if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then need_apt+=(python3-venv); fi

  if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing ${need_apt[*]}"
    sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need_apt[@]}" >/dev/null
  fi

  if [ ! -x .venv/bin/lit ]; then
    lit_pin=$(grep -E '^lit==' python/requirements.txt)
    echo "setup: installing $lit_pin into .venv"
    [ -x .venv/bin/python ] || python3 -m venv .venv
    .venv/bin/pip install -q --no-cache-dir "$lit_pin"
  fi
fi

if [ -n "${KILN_PYTHON:-}" ]; then
  py=$KILN_PYTHON
else
  [ -x .venv/bin/python ] || python3 -m venv .venv
  py=.venv/bin/python
fi
# The requirements (less lit, which ctest takes from .venv/bin) that $py cannot import.
missing=$("$py" - python/requirements.txt <<'PY'
import importlib.util, re, sys
for line in open(sys.argv[1]):
    req = line.split("#")[0].strip()
    name = re.split(r"[=<>!~;\[ ]", req)[0]
    if req and name != "lit" and importlib.util.find_spec(name.lower().replace("-", "_")) is None:
        print(req)
PY
)
if [ -n "$missing" ] && [ -n "${KILN_PYTHON:-}" ]; then
  optional=$(grep -vE '^(torch|nanobind|pytest|transformers|torchvision)==' <<<"$missing" || true)
  [ -z "$optional" ] || echo "setup: $py cannot import" $optional "(not needed by the tests; not installed)"
  missing=$(grep -E '^(torch|nanobind|pytest|transformers|torchvision)==' <<<"$missing" || true)
fi
if [ -n "$missing" ]; then
  echo "setup: installing" $missing "into $("$py" -c 'import sys; print(sys.prefix)')"
  # No pip cache: torch and its CUDA packages are about 2.5 GB of wheels, held in a temporary
  # folder while they install into about 4.6 GB; say so before pip fails half way.
  if grep -q '^torch==' <<<"$missing"; then
    prefix=$("$py" -c 'import sys; print(sys.prefix)')
    for dir in "$prefix" "${TMPDIR:-/tmp}"; do
      free_gb=$(df -Pk "$dir" | awk 'NR==2 {print int($4 / 1048576)}')
      if [ "$free_gb" -lt 8 ]; then
        echo "setup: warning: $dir has ${free_gb} GB free; installing torch with its CUDA" \
          "packages takes about 7.5 GB while it runs (free some space, or set KILN_PYTHON to" \
          "an interpreter that has torch)" >&2
      fi
    done
  fi
  "$py" -m pip install -q --no-cache-dir $missing
fi
