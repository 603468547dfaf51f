// The seed S1 (`a.tanh_(); return a * a * a * a`) at 2^26 float32 elements on CUDA device 0,
// against the memory-bandwidth floor: the fused kernel reads a once and writes a and the result
// once (one read, two writes), so its floor is 3 * 4 * 2^26 bytes at the device-to-device copy
// bandwidth measured here (a 1 GiB cuMemcpyDtoD, counting bytes read plus bytes written).
//
// Prints the medians of `--reps` timed runs (after warm-up), each timed with CUDA events:
//   copy   the copy bandwidth (GB/s) and the floor for S1 (ms)
//   kernel the S1 kernel alone (the plan's launch, no host work)
//   call   a whole execute() call (host work + launch), for comparison
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/passes/pipeline.h"
#include "kiln/runtime/cuda/cuda_kernels.h"
#include "kiln/runtime/cuda/driver.h"
#include "kiln/runtime/executor.h"

using namespace kiln;

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  int reps = 50;
  int64_t n = int64_t{1} << 26;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--log2n") && i + 1 < argc) n = int64_t{1} << std::atoi(argv[++i]);
  }
  std::string why;
  if (!cuda::cuda_available(&why)) {
    std::printf("no GPU: %s\n", why.c_str());
    return 0;
  }
  const cuda::DeviceInfo& info = cuda::device_info(0);
  std::printf("device: %s (sm_%d, %d SMs)\n", info.name.c_str(), info.compute_capability,
              info.multiprocessors);

  // Copy bandwidth: 1 GiB device to device.
  const size_t copy_bytes = size_t{1} << 30;
  auto src = cuda::allocate(0, copy_bytes), dst = cuda::allocate(0, copy_bytes);
  cuda::fill_zero(src->ptr, copy_bytes, 0, nullptr);
  cuda::EventTimer timer(0);
  std::vector<double> copy_ms;
  for (int r = 0; r < reps + 5; ++r) {
    timer.start();
    cuda::copy_on_device(dst->ptr, src->ptr, copy_bytes, 0, nullptr);
    double ms = timer.stop_ms();
    if (r >= 5) copy_ms.push_back(ms);
  }
  double bandwidth = 2.0 * static_cast<double>(copy_bytes) / (median(copy_ms) * 1e-3);  // B/s
  double floor_ms = 3.0 * 4.0 * static_cast<double>(n) / bandwidth * 1e3;
  std::printf("copy: %.1f GB/s (read + write), median of %d; S1 floor at %lld elements: %.4f ms\n",
              bandwidth / 1e9, reps, static_cast<long long>(n), floor_ms);

  // S1 on the device.
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    values[static_cast<size_t>(i)] = static_cast<double>(i % 1000) / 500.0 - 1.0;
  TensorHandle host = make_tensor(DType::kFloat32, {n}, values);
  TensorHandle a = cuda::to_device(*host, Device::cuda(0));
  Trace t = trace(
      [](Tensor x) {
        x.tanh_();
        return x * x * x * x;
      },
      {TensorSpec(DType::kFloat32, {n}, Device::cuda(0))});
  CompiledProgram program = compile(t, alias_pattern_of({a}));
  cuda::CudaPlanKernels kernels = cuda::prepare_cuda_kernels(program.plan, 0);
  size_t step = 0;
  while (step < kernels.steps.size() && !kernels.steps[step])
    ++step;
  if (step == kernels.steps.size()) {
    std::printf("S1 did not lower to a CUDA kernel\n");
    return 1;
  }
  const cuda::CudaStepKernel& k = *kernels.steps[step];
  std::printf("S1: %zu plan step(s); kernel nests: %zu, vector width %d\n",
              program.plan.steps.size(), k.kernel.nests.size(), k.kernel.nests[0].vector_width);
  // The kernel alone, storing every output into a buffer of its own (the same bytes as storing
  // the writeback into a itself).
  std::vector<TensorHandle> outs;
  for (const codegen::KernelOutput& o : k.kernel.outputs)
    outs.push_back(cuda::cuda_strided(o.dtype, o.shape, contiguous_strides(o.shape), 0,
                                      shape_numel(o.shape), Device::cuda(0), false));
  std::printf("S1 kernel outputs: %zu\n", outs.size());
  std::vector<double> kernel_ms;
  for (int r = 0; r < reps + 5; ++r) {
    timer.start();
    cuda::run_cuda_kernel(k, {a}, outs);
    double ms = timer.stop_ms();
    if (r >= 5) kernel_ms.push_back(ms);
  }
  // Whole calls.
  std::vector<double> call_ms;
  for (int r = 0; r < reps + 5; ++r) {
    timer.start();
    std::vector<RtValue> result = execute(program, {a});
    double ms = timer.stop_ms();
    if (r >= 5) call_ms.push_back(ms);
  }
  double km = median(kernel_ms);
  std::printf(
      "kernel: %.4f ms median (%.1f GB/s effective, %.1f%% of the copy bandwidth; "
      "%.2fx the floor)\n",
      km, 12.0 * static_cast<double>(n) / (km * 1e-3) / 1e9, 100.0 * floor_ms / km, km / floor_ms);
  std::printf("call: %.4f ms median (execute(), host work included)\n", median(call_ms));

  // A row statistic: softmax over the rows of a [4096, 4096] float32 tensor, one kernel that
  // reads each row for its max, again for its sum, again for the outputs (from cache when a row
  // fits) and writes once. The floor is one read and one write of the tensor.
  {
    const int64_t rows = 4096, cols = 4096;
    std::vector<double> v(static_cast<size_t>(rows * cols));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<double>(i % 977) / 100.0 - 4.0;
    TensorHandle x =
        cuda::to_device(*make_tensor(DType::kFloat32, {rows, cols}, v), Device::cuda(0));
    Trace st = trace([](Tensor t) { return softmax(t, -1); },
                     {TensorSpec(DType::kFloat32, {rows, cols}, Device::cuda(0))});
    CompiledProgram sp = compile(st, alias_pattern_of({x}));
    cuda::CudaPlanKernels sk = cuda::prepare_cuda_kernels(sp.plan, 0);
    size_t s = 0;
    while (s < sk.steps.size() && !sk.steps[s])
      ++s;
    if (s == sk.steps.size()) {
      std::printf("softmax did not lower to a CUDA kernel\n");
      return 1;
    }
    const cuda::CudaStepKernel& kk = *sk.steps[s];
    std::vector<TensorHandle> so;
    for (const codegen::KernelOutput& o : kk.kernel.outputs)
      so.push_back(cuda::cuda_strided(o.dtype, o.shape, contiguous_strides(o.shape), 0,
                                      shape_numel(o.shape), Device::cuda(0), false));
    std::vector<double> ms;
    for (int r = 0; r < reps + 5; ++r) {
      timer.start();
      cuda::run_cuda_kernel(kk, {x}, so);
      double t = timer.stop_ms();
      if (r >= 5) ms.push_back(t);
    }
    double floor = 2.0 * 4.0 * static_cast<double>(rows * cols) / bandwidth * 1e3;
    double m = median(ms);
    std::printf(
        "softmax [%lld, %lld] f32: %zu plan step(s), row nest: %s; kernel %.4f ms median, "
        "floor %.4f ms (%.2fx)\n",
        static_cast<long long>(rows), static_cast<long long>(cols), sp.plan.steps.size(),
        kk.kernel.nests[0].rows > 0 ? "yes" : "no", m, floor, m / floor);
  }
  return 0;
}
