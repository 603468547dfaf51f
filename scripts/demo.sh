#!/usr/bin/env bash
# Installs what is missing, builds kiln (release) and runs the demo: the seed programs traced
# with the C++ API, printed, and run in the reference interpreter; then the Python extension
# and examples/model_demo.py: kiln.jit on a function and torch.compile(backend="kiln") on a
# model, each checked against eager PyTorch (on the GPU when there is one).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
py=$("${KILN_PYTHON:-.venv/bin/python}" -c 'import sys; print(sys.executable)')
# (The release tree builds the Python extension too, as scripts/test.sh's does.)
cmake --preset release -DKILN_BUILD_PYTHON=ON -DPython_EXECUTABLE="$py" >/dev/null
cmake --build --preset release
./build/release/examples/seed_demo
KILN_EXT_DIR=$PWD/build/release/python/kiln PYTHONPATH=$PWD/python "$py" examples/model_demo.py
