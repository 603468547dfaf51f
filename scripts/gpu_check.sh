#!/usr/bin/env bash
# The GPU checks, in one call on the GPU machine (it has nvcc, CMake, ninja and a GPU, no package
# registry): build, the `gpu` test label, the NVRTC codegen test, and the S1 benchmark. Logs go
# to $OUT (or ./gpu-logs). GoogleTest is built from KILN_GTEST_SOURCE when given.
#   KILN_GPU_PROGRAMS=N   random programs per seed in the GPU differential test (default 1000)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-logs}
mkdir -p "$out"
gtest=()
[[ -n "${KILN_GTEST_SOURCE:-}" ]] && gtest=(-DKILN_GTEST_SOURCE="$KILN_GTEST_SOURCE")
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release "${gtest[@]}" >"$out/configure.log" 2>&1 ||
  { tail -30 "$out/configure.log"; exit 1; }
cmake --build build/gpu -j "$(nproc)" >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-gpu-cache}
echo "== S1 benchmark"
./build/gpu/bench/kiln_bench_cuda_s1 2>&1 | tee "$out/bench.txt"
echo "== gpu tests"
ctest --test-dir build/gpu -L gpu --output-on-failure --timeout 900 >"$out/gpu_tests.log" 2>&1
status=$?
grep -E "tests passed|tests failed|Failed|Passed|\*\*\*|seed " "$out/gpu_tests.log" | tail -30
exit $status
