#!/usr/bin/env bash
# Installs what is missing, builds kiln (release) and runs the demo: the seed programs traced
# with the C++ API, printed, and run in the reference interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release
./build/release/examples/seed_demo
