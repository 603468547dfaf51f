#!/usr/bin/env bash
# Installs what building and testing kiln needs, when it is missing: a C++20 compiler, CMake,
# Ninja, GoogleTest, FileCheck (llvm-14-tools), clang-format, and lit (from PyPI, into .venv).
# Safe to run again: it installs nothing that is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

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
  echo "setup: installing lit into .venv"
  python3 -m venv .venv
  .venv/bin/pip install -q lit==18.1.8
fi
