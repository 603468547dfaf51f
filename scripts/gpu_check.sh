#!/usr/bin/env bash
# The GPU checks, in one call on the GPU machine (it has nvcc, CMake, ninja, Python with torch,
# nanobind and pytest, a GPU, and no package registry): build, then the phases named in
# KILN_GPU_PHASES (default "cpp python"; also "bench" and "models"). Logs go to $OUT (or ./gpu-logs).
#   (The cpp and python phases add their outcome to $OUT/summary.log: failures, their messages, a
#   crash's stack: the device tool brings back few files, and that one is read first.)
#   cpp:    the `gpu` CTest label (GoogleTest built from KILN_GTEST_SOURCE when given) and the S1
#           benchmark; KILN_GPU_PROGRAMS=N random programs per seed (default 1000)
#   python: the extension kiln._C, tests/python and tests/models on CUDA tensors (KILN_TEST_DEVICE=cuda) and on
#           the CPU, and examples/seed.py; KILN_RANDOM_PROGRAMS=N (default 1000),
#           KILN_GRADIENT_PROGRAMS=N random gradient programs (default 1000: on a cold kernel
#           cache their CUDA kernels take one shard about 4 minutes),
#           KILN_PYTEST_JOBS=N processes (default 1), KILN_PYTEST_ARGS (as "-k softmax")
#   bench:  bench/bench.py (kiln, eager and torch.compile side by side), JSON into $OUT
#   models: bench/models.py (the model zoo and decode, side by side; KILN_MODELS_ARGS adds
#           arguments, as "--models gpt2,decoder --dtypes bfloat16"), JSON into $OUT
#   KILN_PYTHON: the Python that has torch (default python3); KILN_CMAKE_ARGS: more CMake options
#   (as "-DCMAKE_CXX_FLAGS=-g", for a native backtrace under cuda-gdb)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-logs}
phases=${KILN_GPU_PHASES:-cpp python}
python=${KILN_PYTHON:-python3}
mkdir -p "$out"
options=(-DCMAKE_BUILD_TYPE=Release)
[[ -n "${KILN_GTEST_SOURCE:-}" ]] && options+=(-DKILN_GTEST_SOURCE="$KILN_GTEST_SOURCE")
read -r -a extra <<<"${KILN_CMAKE_ARGS:-}"
options+=("${extra[@]}")
if [[ " $phases " == *" cpp "* ]]; then options+=(-DKILN_BUILD_TESTS=ON); else options+=(-DKILN_BUILD_TESTS=OFF); fi
[[ " $phases " == *" python "* || " $phases " == *" bench "* || " $phases " == *" models "* ]] &&
  options+=(-DKILN_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v "$python")")
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
cmake -S . -B build/gpu -G Ninja "${options[@]}" >"$out/configure.log" 2>&1 ||
  { tail -30 "$out/configure.log"; exit 1; }
# Only what the phases run (the unit tests, which CI runs, would double the build's device time).
targets=()
[[ " $phases " == *" cpp "* ]] && targets+=(kiln_gpu_tests kiln_bench_cuda_s1)
[[ " $phases " == *" python "* ]] && targets+=(_C kiln-opt)
[[ " $phases " == *" bench "* || " $phases " == *" models "* ]] && targets+=(_C)
cmake --build build/gpu -j "$(nproc)" --target "${targets[@]}" >"$out/build.log" 2>&1 ||
  { tail -40 "$out/build.log"; exit 1; }
export KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-gpu-cache}
status=0
if [[ " $phases " == *" cpp "* ]]; then
  echo "== S1 benchmark"
  ./build/gpu/bench/kiln_bench_cuda_s1 2>&1 | tee "$out/bench.txt"
  echo "== gpu tests"
  ctest --test-dir build/gpu -L gpu --output-on-failure --timeout 900 >"$out/gpu_tests.log" 2>&1 ||
    status=1
  grep -E "tests passed|tests failed|Failed|Passed|\*\*\*|seed " "$out/gpu_tests.log" | tail -30 |
    tee -a "$out/summary.log"
fi
if [[ " $phases " == *" python "* ]]; then
  export KILN_EXT_DIR=$PWD/build/gpu/python/kiln KILN_OPT=$PWD/build/gpu/tools/kiln-opt/kiln-opt
  export KILN_RANDOM_PROGRAMS=${KILN_RANDOM_PROGRAMS:-1000}
  "$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" |
    tee "$out/torch.txt"
  # KILN_PYTEST_JOBS processes share the suite (conftest.py, KILN_TEST_SHARD), each with its own
  # log, then joined into one per device (the device tool brings back at most 8 files: 14 shard
  # logs lost most of them, a segfault's test among them); KILN_PYTEST_ARGS adds pytest
  # arguments (a -k selection, say).
  jobs=${KILN_PYTEST_JOBS:-1}
  shard_logs=$(mktemp -d)
  for device in ${KILN_PYTEST_DEVICES:-cuda cpu}; do
    echo "== tests/python and tests/models on $device ($jobs processes)"
    pids=()
    for ((shard = 0; shard < jobs; shard++)); do
      log="$out/pytest_$device.log"
      ((jobs > 1)) && log="$shard_logs/pytest_${device}_$shard.log"
      KILN_TEST_SHARD=$shard/$jobs KILN_TEST_DEVICE=$device "$python" -X faulthandler -m pytest -q \
        -p no:cacheprovider tests/python tests/models --durations=5 ${KILN_PYTEST_ARGS:-} >"$log" 2>&1 &
      pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || status=1; done
    for ((shard = 0; shard < jobs; shard++)); do
      log="$out/pytest_$device.log"
      ((jobs > 1)) && log="$shard_logs/pytest_${device}_$shard.log"
      # The summary (what the device tool surely brings back): failures with their first E lines,
      # and a crash's stack from the faulthandler.
      {
        echo "== $device shard $shard/$jobs: $(tail -1 "$log")"
        grep -E "^(FAILED|ERROR)" "$log" | head -20
        grep -E "^E  " "$log" | head -12
        grep -A14 "Fatal Python error" "$log" | grep -v "site-packages" | head -16
      } | tee -a "$out/summary.log"
      if ((jobs > 1)); then
        echo "==== shard $shard/$jobs" >>"$out/pytest_$device.log"
        cat "$log" >>"$out/pytest_$device.log"
      fi
    done
  done
  rm -rf "$shard_logs"
  echo "== examples/seed.py"
  PYTHONPATH=python "$python" examples/seed.py >"$out/seed.log" 2>&1 || status=1
  grep -E "device:|us/call|stats|match|Error" "$out/seed.log"
fi
if [[ " $phases " == *" bench "* ]]; then
  echo "== bench/bench.py"
  KILN_EXT_DIR=$PWD/build/gpu/python/kiln PYTHONPATH=python "$python" bench/bench.py \
    --json "$out/bench.json" ${KILN_BENCH_ARGS:-} 2>&1 | tee "$out/bench_py.log" | tail -40
fi
if [[ " $phases " == *" models "* ]]; then
  echo "== bench/models.py"
  KILN_EXT_DIR=$PWD/build/gpu/python/kiln PYTHONPATH=python "$python" bench/models.py \
    --json "$out/models.json" ${KILN_MODELS_ARGS:-} 2>&1 | tee "$out/models.log" | tail -60
fi
exit $status
