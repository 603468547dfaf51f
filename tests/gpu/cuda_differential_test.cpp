// The differential suite on CUDA (CTest label `gpu`; every test skips itself where there is no
// GPU): the CASES.md programs and random programs run through compile + execute on the device,
// against the reference interpreter on the host (cuda_runner.h brings every effect back). Also:
// float16/bfloat16, sizes that are not multiples of the vector width, non-contiguous inputs,
// a tensor above 2^31 elements (64-bit indexing), and the kernel cache across processes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <random>

#include "kiln/kiln.h"
#include "kiln/passes/pipeline.h"
#include "kiln/runtime/cuda/cublas.h"
#include "kiln/runtime/cuda/cuda_kernels.h"
#include "kiln/runtime/cuda/driver.h"
#include "kiln/runtime/executor.h"
#include "support/case_inputs.h"
#include "support/cases.h"
#include "support/cuda_runner.h"
#include "support/random_program.h"

namespace kiln {
namespace {

#define KILN_REQUIRE_GPU()                                \
  do {                                                    \
    std::string why;                                      \
    if (!cuda::cuda_available(&why)) GTEST_SKIP() << why; \
  } while (0)

fuzz::CheckOptions on_cuda() {
  fuzz::CheckOptions o;
  o.runner = test::cuda_runner(0);
  o.tolerance_scale = 16;  // float32 math on the GPU against the oracle's double (random_program.h)
  return o;
}

int env_count(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

TEST(CudaDifferential, CasesProgramsAgreeWithTheInterpreter) {
  KILN_REQUIRE_GPU();
  test::for_each_case(
      [&](const std::string& name, const Trace& t, const std::vector<RtValue>& inputs) {
        if (auto failure = fuzz::check_trace(t, inputs, on_cuda()))
          ADD_FAILURE() << "CASES " << name << ": " << *failure;
      });
}

// KILN_GPU_PROGRAMS (default 1000) random programs from a fixed seed, then from a fresh one.
TEST(CudaDifferential, RandomProgramsAgreeWithTheInterpreter) {
  KILN_REQUIRE_GPU();
  int count = env_count("KILN_GPU_PROGRAMS", 1000);
  for (uint64_t seed : {uint64_t{20261129}, uint64_t{std::random_device{}()}}) {
    fuzz::FuzzSummary s = fuzz::run_fuzz(seed, count, on_cuda());
    EXPECT_EQ(s.failed, 0) << s.str() << " (seed " << seed << ")";
    for (const std::string& r : s.reports)
      ADD_FAILURE() << r;
    std::cout << "seed " << seed << ": " << s.str() << "\n";
  }
}

// Programs over half and bfloat16 tensors, in sizes around the vector width, contiguous and not.
TEST(CudaDifferential, HalfAndBfloat16AtAwkwardSizesAndLayouts) {
  KILN_REQUIRE_GPU();
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    for (int64_t n : {1, 3, 7, 8, 9, 15, 17, 33, 1000, 4099}) {
      for (bool transposed : {false, true}) {
        std::vector<double> values(static_cast<size_t>(2 * n));
        for (size_t i = 0; i < values.size(); ++i)
          values[i] = static_cast<double>(i % 97) / 13.0 - 3.0;
        TensorHandle x = make_tensor(dtype, {2, n}, values);
        TensorHandle input = transposed ? make_view(x, {n, 2}, {1, n}, 0) : x;
        std::vector<RtValue> in = {input};
        Trace t = trace(
            [](Tensor a) {
              a.mul_(2).add_(1);
              Tensor b = a.sigmoid() * a;
              a.sub_(b);
              return b;
            },
            {test::spec_of(input)});
        if (auto failure = fuzz::check_trace(t, in, on_cuda()))
          ADD_FAILURE() << dtype_name(dtype) << " n=" << n << " transposed=" << transposed << ": "
                        << *failure;
      }
    }
  }
}

// Reductions at sizes where the block and warp paths matter: row statistics (softmax, a layer
// norm, var, argmax) as row nests, an outer-dimension sum, and a full sum.
TEST(CudaDifferential, ReductionsAtRealSizes) {
  KILN_REQUIRE_GPU();
  auto values = [](int64_t n) {
    std::vector<double> v(static_cast<size_t>(n));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<double>((i * 7919) % 1009) / 97.0 - 5.0;
    return v;
  };
  struct Program {
    std::string name;
    std::function<std::vector<Tensor>(Tensor, Tensor)> fn;
  };
  std::vector<Program> programs = {
      {"softmax", [](Tensor x, Tensor) { return std::vector<Tensor>{softmax(x, -1)}; }},
      {"layer norm in place",
       [](Tensor x, Tensor w) {
         Tensor mean = x.mean({{-1}}, true);
         Tensor centered = x - mean;
         x.copy_(centered / (centered.var({{-1}}, 0, true) + 1e-5).sqrt() * w);
         return std::vector<Tensor>{x.amax({-1})};
       }},
      {"argmax and std",
       [](Tensor x, Tensor) {
         return std::vector<Tensor>{x.argmax(1), x.std({{1}})};
       }},
      {"outer sum", [](Tensor x, Tensor) { return std::vector<Tensor>{x.sum({{0}})}; }},
      {"full sum",
       [](Tensor x, Tensor) {
         return std::vector<Tensor>{x.sum(), x.exp().mean()};
       }},
  };
  for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
    for (Shape shape : {Shape{37, 1000}, Shape{3, 4099}, Shape{513, 31}}) {
      for (const Program& p : programs) {
        TensorHandle x = make_tensor(dtype, shape, values(shape_numel(shape)));
        TensorHandle w = make_tensor(dtype, {shape[1]}, values(shape[1]));
        std::vector<RtValue> in = {x, w};
        Trace t = trace(
            [&](Tensor a, Tensor b) {
              std::vector<Tensor> outs = p.fn(a, b);
              return outs;
            },
            {test::spec_of(x), test::spec_of(w)});
        if (auto failure = fuzz::check_trace(t, in, on_cuda()))
          ADD_FAILURE() << p.name << " " << dtype_name(dtype) << shape_str(shape) << ": "
                        << *failure;
      }
    }
  }
}

// Matrix products run through cuBLAS (a library step), in every floating dtype, with transposed,
// broadcast-batch and 1-D operands, and a fused epilogue after them.
TEST(CudaDifferential, MatrixProductsRunThroughCublas) {
  KILN_REQUIRE_GPU();
  std::string why;
  if (!cuda::cublas_available(&why)) GTEST_SKIP() << why;
  auto values = [](int64_t n) {
    std::vector<double> v(static_cast<size_t>(n));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<double>((i * 37) % 17) / 8.0 - 1.0;
    return v;
  };
  struct Case {
    std::string name;
    Shape a, b;
    std::function<Tensor(Tensor, Tensor)> fn;
  };
  std::vector<Case> cases = {
      {"matmul 2-D", {5, 7}, {7, 3}, [](Tensor a, Tensor b) { return matmul(a, b).relu(); }},
      {"matmul of a transpose",
       {7, 5},
       {7, 3},
       [](Tensor a, Tensor b) { return matmul(a.t(), b) * 2; }},
      {"vector times matrix", {7}, {7, 3}, [](Tensor a, Tensor b) { return matmul(a, b); }},
      {"matrix times vector", {3, 7}, {7}, [](Tensor a, Tensor b) { return matmul(a, b); }},
      {"broadcast batches",
       {2, 1, 4, 6},
       {3, 6, 5},
       [](Tensor a, Tensor b) { return matmul(a, b); }},
      {"bmm", {3, 4, 6}, {3, 6, 2}, [](Tensor a, Tensor b) { return bmm(a, b); }},
      // Operands cuBLAS reads in place: transposed (op T), one matrix broadcast over the batch
      // (batch stride 0), a column slice (leading dimension above the width), batches
      // interleaved with rows (one batch stride, not rows * cols).
      {"bmm of transposes",
       {3, 6, 4},
       {3, 2, 6},
       [](Tensor a, Tensor b) { return bmm(a.transpose(1, 2), b.transpose(1, 2)); }},
      {"a matrix broadcast over batches",
       {2, 3, 4, 6},
       {6, 5},
       [](Tensor a, Tensor b) { return matmul(a, b); }},
      {"a column slice",
       {4, 9},
       {5, 3},
       [](Tensor a, Tensor b) { return matmul(a.narrow(1, 2, 5), b); }},
      // One library step with the views around the product (library_step.h): GPT-2's Conv1D
      // reshapes, and a reshape of a transpose that copies on the device.
      {"linear through reshapes",
       {2, 3, 6},
       {5, 6},
       [](Tensor a, Tensor w) {
         return linear(a.reshape({6, 6}), w).reshape({2, 3, 5}) * 2;
       }},
      {"a reshape that copies",
       {2, 3, 6},
       {5, 6},
       [](Tensor a, Tensor w) {
         return matmul(a.transpose(0, 1).reshape({6, 6}), w.t());
       }},
      {"batches interleaved with rows",
       {4, 3, 6},
       {3, 6, 2},
       [](Tensor a, Tensor b) { return matmul(a.transpose(0, 1), b); }},
      {"linear with bias",
       {4, 6},
       {5, 6},
       [](Tensor a, Tensor w) { return linear(a, w, w.select(1, 0)); }},
      // Batches of rows into one matrix: one product of all the rows (cublas.cpp), also over a
      // column slice, with rows of one, and through the bias epilogue.
      {"linear over batches of rows",
       {2, 3, 6},
       {5, 6},
       [](Tensor a, Tensor w) { return linear(a, w); }},
      {"linear over a column slice of batches of rows",
       {2, 3, 9},
       {5, 6},
       [](Tensor a, Tensor w) { return linear(a.narrow(2, 1, 6), w); }},
      {"batches of one row", {4, 1, 6}, {6, 5}, [](Tensor a, Tensor b) { return matmul(a, b); }},
      {"linear with bias over batches of rows",
       {2, 4, 8},
       {8, 8},
       [](Tensor a, Tensor w) { return linear(a, w, w.select(1, 0)); }},
  };
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    for (const Case& c : cases) {
      TensorHandle a = make_tensor(dtype, c.a, values(shape_numel(c.a)));
      TensorHandle b = make_tensor(dtype, c.b, values(shape_numel(c.b)));
      std::vector<RtValue> in = {a, b};
      Trace t = trace([&](Tensor x, Tensor y) { return c.fn(x, y); },
                      {test::spec_of(a), test::spec_of(b)});
      if (auto failure = fuzz::check_trace(t, in, on_cuda()))
        ADD_FAILURE() << c.name << " " << dtype_name(dtype) << ": " << *failure;
      // It ran in cuBLAS, not in the interpreter.
      std::vector<RtValue> dev = {cuda::to_device(*a, Device::cuda(0)),
                                  cuda::to_device(*b, Device::cuda(0))};
      ExecutionStats stats;
      execute(compile(test::on_device(t, Device::cuda(0)), alias_pattern_of(dev)), dev, &stats);
      EXPECT_EQ(stats.library_steps, 1) << c.name << " " << dtype_name(dtype);
      EXPECT_EQ(stats.interpreted_steps, 0) << c.name << " " << dtype_name(dtype);
    }
  }
}

// 16-bit products whose operands or result are not aligned for tensor cores run padded when the
// product does enough work per copied byte (cublas.cpp, "tensor-core alignment"): each padded
// dim and each operand layout, against the interpreter; a decode-sized product runs as it is.
TEST(CudaDifferential, UnalignedHalfProductsRunPaddedForTensorCores) {
  KILN_REQUIRE_GPU();
  std::string why;
  if (!cuda::cublas_available(&why)) GTEST_SKIP() << why;
  auto values = [](int64_t n) {
    std::vector<double> v(static_cast<size_t>(n));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<double>((i * 37) % 17) / 16.0 - 0.5;
    return v;
  };
  struct Case {
    std::string name;
    Shape a, b;
    std::function<Tensor(Tensor, Tensor)> fn;
    bool padded;
  };
  auto product = [](Tensor a, Tensor b) { return matmul(a, b); };
  std::vector<Case> cases = {
      {"unaligned result columns (m)", {384, 392}, {392, 201}, product, true},
      {"unaligned reduction (k)", {384, 201}, {201, 392}, product, true},
      {"unaligned rows of a transposed operand (n)",
       {392, 201},
       {392, 384},
       [](Tensor a, Tensor b) { return matmul(a.t(), b); },
       true},
      {"linear with bias over unaligned features",
       {384, 392},
       {201, 392},
       [](Tensor a, Tensor w) { return linear(a, w, w.select(1, 0)); },
       true},
      {"bmm with unaligned columns",
       {3, 296, 296},
       {3, 296, 257},
       [](Tensor a, Tensor b) { return bmm(a, b); },
       true},
      {"a matrix broadcast over unaligned batches", {3, 296, 296}, {296, 257}, product, true},
      // Batches of rows into one weight are one product of all the rows (cublas.cpp), here
      // padded, its result's corner read by a kernel in place (batch stride rows x padded m).
      {"an LM head over batches of tokens",
       {4, 96, 392},
       {201, 392},
       [](Tensor a, Tensor w) { return linear(a, w) * 2; },
       true},
      {"an operand at an unaligned address",
       {384, 393},
       {392, 384},
       [](Tensor a, Tensor b) { return matmul(a.narrow(1, 1, 392), b); },
       true},
      {"a decode step (memory-bound)", {1, 392}, {392, 201}, product, false},
  };
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    for (const Case& c : cases) {
      const std::string name = c.name + " " + std::string(dtype_name(dtype));
      TensorHandle a = make_tensor(dtype, c.a, values(shape_numel(c.a)));
      TensorHandle b = make_tensor(dtype, c.b, values(shape_numel(c.b)));
      std::vector<RtValue> in = {a, b};
      Trace t = trace([&](Tensor x, Tensor y) { return c.fn(x, y); },
                      {test::spec_of(a), test::spec_of(b)});
      if (auto failure = fuzz::check_trace(t, in, on_cuda()))
        ADD_FAILURE() << name << ": " << *failure;
      std::vector<RtValue> dev = {cuda::to_device(*a, Device::cuda(0)),
                                  cuda::to_device(*b, Device::cuda(0))};
      ExecutionStats stats;
      execute(compile(test::on_device(t, Device::cuda(0)), alias_pattern_of(dev)), dev, &stats);
      EXPECT_EQ(stats.library_steps, 1) << name;
      // float32 products do not use tensor cores (no TF32, as PyTorch's default).
      EXPECT_EQ(stats.aligned_products, c.padded && dtype != DType::kFloat32 ? 1 : 0) << name;
    }
  }
}

// The device copy every clone, writeback through a temporary and padded product runs
// (cuda_copy_elements): rows of whole vectors through kiln_vector_rows, other rows of one dtype
// through kiln_row_copy, anything else through the strided copy. Every element of the destination's
// storage is checked: the view's against the source, the rest untouched (-7).
TEST(CudaDifferential, DeviceCopiesOfRowsAndOfAnyLayout) {
  KILN_REQUIRE_GPU();
  struct Layout {
    Shape sizes;
    Strides strides;
    int64_t offset, storage;
  };
  struct Case {
    std::string name;
    Layout src, dst;
    DType dst_dtype;  // kBool: the source's
  };
  const std::vector<Case> cases = {
      {"a column slice into a contiguous matrix",
       {{300, 517}, {600, 1}, 3, 300 * 600},
       {{300, 517}, {517, 1}, 0, 300 * 517},
       DType::kBool},
      {"a matrix into a padded one",
       {{300, 517}, {517, 1}, 0, 300 * 517},
       {{300, 517}, {520, 1}, 0, 300 * 520},
       DType::kBool},
      {"one row broadcast over rows",
       {{517}, {1}, 2, 600},
       {{300, 517}, {517, 1}, 0, 300 * 517},
       DType::kBool},
      {"a contiguous run", {{5000}, {1}, 1, 5001}, {{5000}, {1}, 4, 5004}, DType::kBool},
      {"batches of padded rows (they collapse into rows)",
       {{4, 70, 300}, {70 * 301, 301, 1}, 0, 4 * 70 * 301},
       {{4, 70, 300}, {70 * 304, 304, 1}, 0, 4 * 70 * 304},
       DType::kBool},
      {"a transpose (not rows)",
       {{517, 300}, {1, 517}, 0, 300 * 517},
       {{517, 300}, {300, 1}, 0, 300 * 517},
       DType::kBool},
      {"heads transposed back into rows (rows of 64 over 3 dims)",
       {{4, 16, 8, 64}, {8 * 16 * 64, 64, 16 * 64, 1}, 0, 4 * 16 * 8 * 64},
       {{4, 16, 8, 64}, {16 * 8 * 64, 8 * 64, 64, 1}, 0, 4 * 16 * 8 * 64},
       DType::kBool},
      {"a key's heads repeated (a dim of stride 0 between rows)",
       {{3, 2, 4, 96}, {2 * 96, 96, 0, 1}, 0, 3 * 2 * 96},
       {{3, 2, 4, 96}, {2 * 4 * 96, 4 * 96, 96, 1}, 0, 3 * 2 * 4 * 96},
       DType::kBool},
      {"rows of 48 at an offset of 2 and pitches of 50 (narrower vectors)",
       {{3, 5, 48}, {5 * 50, 50, 1}, 2, 3 * 5 * 50 + 2},
       {{3, 5, 48}, {5 * 48, 48, 1}, 4, 3 * 5 * 48 + 4},
       DType::kBool},
      {"rows with a dtype conversion",
       {{300, 517}, {600, 1}, 3, 300 * 600},
       {{300, 517}, {517, 1}, 0, 300 * 517},
       DType::kFloat64},
  };
  for (DType dtype : {DType::kBool, DType::kFloat16, DType::kFloat32, DType::kInt64}) {
    for (const Case& c : cases) {
      const std::string name = c.name + " " + std::string(dtype_name(dtype));
      const DType dst_dtype = c.dst_dtype == DType::kBool ? dtype : c.dst_dtype;
      TensorHandle src =
          make_strided(dtype, c.src.sizes, c.src.strides, c.src.offset, c.src.storage);
      for (int64_t i = 0; i < c.src.storage; ++i)
        src->storage->store_double(
            i, dtype == DType::kBool ? i % 3 == 0 : static_cast<double>(i % 1000));
      TensorHandle dst =
          make_strided(dst_dtype, c.dst.sizes, c.dst.strides, c.dst.offset, c.dst.storage);
      for (int64_t i = 0; i < c.dst.storage; ++i)
        dst->storage->store_double(i, dtype == DType::kBool ? 0 : -7);
      TensorHandle src_d = cuda::to_device(*src, Device::cuda(0));
      TensorHandle dst_d = cuda::to_device(*dst, Device::cuda(0));
      cuda::cuda_copy_elements(*dst_d, *src_d);
      TensorHandle got = cuda::to_host(*dst_d);
      std::vector<int64_t> from = element_indices(
          c.dst.sizes, broadcast_strides(c.src.sizes, c.src.strides, c.dst.sizes), c.src.offset);
      std::vector<int64_t> to = element_indices(c.dst.sizes, c.dst.strides, c.dst.offset);
      std::vector<double> want(static_cast<size_t>(c.dst.storage), dtype == DType::kBool ? 0 : -7);
      for (size_t e = 0; e < to.size(); ++e)
        want[static_cast<size_t>(to[e])] = src->storage->load_double(from[e]);
      int64_t wrong = 0;
      for (int64_t i = 0; i < c.dst.storage; ++i)
        wrong += got->storage->load_double(i) != want[static_cast<size_t>(i)];
      EXPECT_EQ(wrong, 0) << name;
    }
  }
}

// One tensor above 2^31 elements: x.mul_(2); return x + 1 over 2^31 + 7 float16 values, checked
// element by element (every value is exact in float16).
TEST(CudaDifferential, ATensorAboveTwoToTheThirtyOneElements) {
  KILN_REQUIRE_GPU();
  const int64_t n = (int64_t{1} << 31) + 7;
  TensorHandle host = make_strided(DType::kFloat16, {n}, {1}, 0, n);
  auto* h = reinterpret_cast<uint16_t*>(host->storage->bytes.data());
  for (int64_t i = 0; i < n; ++i)
    h[i] = float_to_half(static_cast<float>(i % 1000));
  TensorHandle x = cuda::to_device(*host, Device::cuda(0));
  Trace t = trace(
      [](Tensor a) {
        a.mul_(2);
        return a + 1;
      },
      {TensorSpec(DType::kFloat16, {n}, Device::cuda(0))});
  CompiledProgram p = compile(t, alias_pattern_of({x}));
  ExecutionStats stats;
  std::vector<RtValue> out = execute(p, {x}, &stats);
  EXPECT_EQ(stats.kernel_steps, 1);
  EXPECT_EQ(stats.writebacks_in_kernel, 1);
  TensorHandle x_after = cuda::to_host(*x);
  TensorHandle y = cuda::to_host(*std::get<TensorHandle>(out.at(0)));
  const auto* xa = reinterpret_cast<const uint16_t*>(x_after->storage->bytes.data());
  const auto* ya = reinterpret_cast<const uint16_t*>(y->storage->bytes.data());
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    float v = static_cast<float>(i % 1000) * 2;
    wrong += half_to_float(xa[i]) != v || half_to_float(ya[i]) != v + 1;
  }
  EXPECT_EQ(wrong, 0);
}

// One program on the device, for the cache test's child processes: prints what the CUDA kernel
// cache did. Skips unless KILN_GPU_CACHE_CHILD is set.
TEST(CudaKernelCacheChild, RunsOneProgramAndReportsTheCache) {
  if (!std::getenv("KILN_GPU_CACHE_CHILD")) GTEST_SKIP() << "run by ASecondProcess...";
  KILN_REQUIRE_GPU();
  TensorHandle host = test::ar({64, 33});
  TensorHandle x = cuda::to_device(*host, Device::cuda(0));
  Trace t = trace(
      [](Tensor a) {
        a.tanh_();
        return a * a * a * a;
      },
      {TensorSpec(DType::kFloat32, {64, 33}, Device::cuda(0))});
  execute(compile(t, alias_pattern_of({x})), {x});
  cuda::synchronize(0);
  cuda::CudaCacheStats s = cuda::cuda_cache_stats();
  std::cout << "KILN_CACHE compiled=" << s.compiled << " disk_hits=" << s.disk_hits << "\n";
}

// The second process over a warm cache folder compiles nothing: this binary runs the test above
// in two child processes over one new cache folder and reads their counts.
TEST(CudaKernelCache, ASecondProcessWithAWarmCacheCompilesNothing) {
  KILN_REQUIRE_GPU();
  char folder[] = "/tmp/kiln-cuda-cache-XXXXXX";
  ASSERT_NE(mkdtemp(folder), nullptr);
  auto child = [&] {
    std::string command = "KILN_GPU_CACHE_CHILD=1 KILN_CACHE_DIR=" + std::string(folder) + " " +
                          "/proc/" + std::to_string(getpid()) +
                          "/exe --gtest_filter=CudaKernelCacheChild.* 2>&1";
    FILE* pipe = popen(command.c_str(), "r");
    std::string out;
    char buf[512];
    while (pipe && fgets(buf, sizeof buf, pipe))
      out += buf;
    if (pipe) pclose(pipe);
    return out;
  };
  auto count = [](const std::string& out, const std::string& key) {
    size_t at = out.find(key + "=");
    return at == std::string::npos ? -1 : std::atoi(out.c_str() + at + key.size() + 1);
  };
  std::string first = child();
  std::string second = child();
  EXPECT_GT(count(first, "compiled"), 0) << first;
  EXPECT_EQ(count(second, "compiled"), 0) << second;
  EXPECT_GT(count(second, "disk_hits"), 0) << second;
  std::filesystem::remove_all(folder);
}

}  // namespace
}  // namespace kiln
