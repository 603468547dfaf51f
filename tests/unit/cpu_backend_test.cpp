// The CPU backend (DESIGN.md 3): fusion regions lowered to C++ kernels (codegen/kernel.h),
// compiled and cached (runtime/cpu/kernel_cache.h), and run by the executor.
//  * the seeds compile to one kernel that stores the writeback itself, with hand-computed values
//    (each region against the interpreter: cpu_regions_test.cpp);
//  * the kernel prelude's conversions are the interpreter's storage conversions;
//  * regions that are not lowered say why, and the executor interprets them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <random>

#include "kiln/codegen/cpu_prelude.h"
#include "kiln/codegen/kernel.h"
#include "kiln/codegen/shared_prelude.h"
#include "kiln/ir/parser.h"
#include "kiln/ir/scalar_math.h"
#include "kiln/kiln.h"
#include "kiln/passes/fuse.h"
#include "kiln/passes/pipeline.h"
#include "kiln/runtime/cpu/cpu_kernels.h"
#include "kiln/runtime/cpu/kernel_cache.h"
#include "kiln/runtime/executor.h"
#include "kiln/runtime/interpreter/interpreter.h"
#include "support/bitwise.h"
#include "support/case_inputs.h"

namespace kiln {
namespace {

using test::ar;
using test::differs;
using test::spec_of;

// Sets an environment variable for one scope.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) old = v;
    setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old)
      setenv(name.c_str(), old->c_str(), 1);
    else
      unsetenv(name.c_str());
  }
};

// ---- the seeds through compile + execute ---------------------------------------------------

float f32(double v) {
  return static_cast<float>(v);
}

// The caller's memory crosses in borrowed (as the Python front end passes PyTorch's), and the
// outputs come from the caller's allocator: S1 runs on memory kiln does not own.
TEST(CpuBackend, BorrowedInputsAndOutputsFromTheGivenAllocator) {
  ScopedEnv on("KILN_CPU_KERNELS", "1");
  struct Counting : Allocator {
    int blocks = 0;
    Block allocate(Device, size_t bytes) override {
      ++blocks;
      std::shared_ptr<std::byte[]> memory(new std::byte[bytes + 1]);
      return Block{memory.get(), 0, memory};
    }
  } allocator;
  std::vector<float> caller(25);
  for (size_t i = 0; i < caller.size(); ++i)
    caller[i] = static_cast<float>(i) / 10.0f - 1.0f;
  auto storage = std::make_shared<Storage>();
  storage->dtype = DType::kFloat32;
  storage->borrowed = reinterpret_cast<std::byte*>(caller.data());
  storage->borrowed_numel = 25;
  auto a = std::make_shared<RtTensor>(RtTensor{storage, {5, 5}, {5, 1}, 0});
  Trace t = trace(
      [](Tensor x) {
        x.tanh_();
        return x * x * x * x;
      },
      {spec_of(a)});
  std::vector<float> before = caller;
  ExecutionStats stats;
  ExecuteOptions options;
  options.allocator = &allocator;
  options.stats = &stats;
  std::vector<RtValue> out = execute(compile(t, alias_pattern_of({RtValue(a)})), {a}, options);
  EXPECT_EQ(stats.writebacks_in_kernel, 1);
  EXPECT_GE(allocator.blocks, 1);
  const RtTensor& result = *std::get<TensorHandle>(out.at(0));
  EXPECT_NE(result.storage->borrowed, nullptr);  // the allocator's memory
  std::vector<double> got = to_vector(result);
  for (size_t i = 0; i < caller.size(); ++i) {
    float th = math::tanh_f32(static_cast<float>(before[i]));  // the interpreter's float tanh
    EXPECT_EQ(caller[i], th) << i;  // written into the caller's own memory
    EXPECT_EQ(got[i], ((th * th) * th) * th) << i;
  }
}

TEST(CpuBackend, SeedS1IsOneKernelThatWritesBackItself) {
  ScopedEnv on("KILN_CPU_KERNELS", "1");
  TensorHandle a = ar({5, 5});
  std::vector<float> a0;
  for (double v : to_vector(*a))
    a0.push_back(f32(v));
  Trace t = trace(
      [](Tensor x) {
        x.tanh_();
        return x * x * x * x;
      },
      {spec_of(a)});
  CompiledProgram program = compile(t, alias_pattern_of({RtValue(a)}));
  cpu::PlanKernels kernels = cpu::prepare_cpu_kernels(program.plan);
  ASSERT_EQ(program.plan.steps.size(), 1u);
  ASSERT_TRUE(kernels.steps[0].has_value()) << kernels.why_not[0];

  const std::byte* storage = a->storage->bytes.data();
  ExecutionStats stats;
  std::vector<RtValue> out = execute(program, {RtValue(a)}, &stats);
  EXPECT_EQ(stats.kernel_steps, 1);
  EXPECT_EQ(stats.interpreted_steps, 0);
  EXPECT_EQ(stats.writebacks_in_kernel, 1);
  EXPECT_EQ(stats.writebacks_copied, 0);
  EXPECT_EQ(a->storage->bytes.data(), storage);  // the caller's own memory
  std::vector<double> got = to_vector(*std::get<TensorHandle>(out.at(0)));
  std::vector<double> now = to_vector(*a);
  for (size_t i = 0; i < a0.size(); ++i) {
    float th = math::tanh_f32(static_cast<float>(a0[i]));
    EXPECT_EQ(now[i], th) << i;
    EXPECT_EQ(got[i], ((th * th) * th) * th) << i;
  }
}

TEST(CpuBackend, SeedS2IsOneKernelThatWritesBackItself) {
  ScopedEnv on("KILN_CPU_KERNELS", "1");
  TensorHandle x = ar({5, 5});
  std::vector<float> x0;
  for (double v : to_vector(*x))
    x0.push_back(f32(v));
  Trace t = trace(
      [](Tensor v) {
        v.exp_();
        v.sin_();
        return v.cos();
      },
      {spec_of(x)});
  CompiledProgram program = compile(t, alias_pattern_of({RtValue(x)}));
  ASSERT_EQ(program.plan.steps.size(), 1u);
  ExecutionStats stats;
  std::vector<RtValue> out = execute(program, {RtValue(x)}, &stats);
  EXPECT_EQ(stats.kernel_steps, 1);
  EXPECT_EQ(stats.writebacks_in_kernel, 1);
  EXPECT_EQ(stats.writebacks_copied, 0);
  std::vector<double> got = to_vector(*std::get<TensorHandle>(out.at(0)));
  std::vector<double> now = to_vector(*x);
  for (size_t i = 0; i < x0.size(); ++i) {
    // exp is kiln's float exp (scalar_math_test.cpp checks it against the rounded exact one).
    float s = f32(std::sin(static_cast<double>(kiln::math::exp_f32(x0[i]))));
    EXPECT_EQ(now[i], s) << i;
    EXPECT_EQ(got[i], f32(std::cos(static_cast<double>(s)))) << i;
  }
}

TEST(CpuBackend, KilnCpuKernelsZeroInterpretsEveryStep) {
  ScopedEnv off("KILN_CPU_KERNELS", "0");
  TensorHandle a = ar({5, 5});
  Trace t = trace(
      [](Tensor x) {
        x.tanh_();
        return x * x * x * x;
      },
      {spec_of(a)});
  ExecutionStats stats;
  execute(compile(t, alias_pattern_of({RtValue(a)})), {RtValue(a)}, &stats);
  EXPECT_EQ(stats.kernel_steps, 0);
  EXPECT_EQ(stats.interpreted_steps, 1);
  EXPECT_EQ(stats.writebacks_copied, 1);
}

// A writeback the same-index rule does not allow in the kernel is copied after it, and the
// caller still sees eager's result.
TEST(CpuBackend, ShiftedWriteIsCopiedAfterTheKernel) {
  ScopedEnv on("KILN_CPU_KERNELS", "1");
  TensorHandle x = ar({9});
  TensorHandle y = clone(*x);
  Trace t = trace(
      [](Tensor v) {
        v.slice(0, 1).add_(v.slice(0, 0, 8) * 2);
        return v.exp();
      },
      {spec_of(x)});
  std::vector<RtValue> expected = interpret(t, {RtValue(y)});
  ExecutionStats stats;
  std::vector<RtValue> out =
      execute(compile(t, alias_pattern_of({RtValue(x)})), {RtValue(x)}, &stats);
  EXPECT_GE(stats.kernel_steps, 1);
  EXPECT_EQ(stats.writebacks_in_kernel + stats.writebacks_copied, 1);
  EXPECT_FALSE(differs(*x, *y).has_value());
  EXPECT_FALSE(differs(*std::get<TensorHandle>(out[0]), *std::get<TensorHandle>(expected[0])));
}

// A write into part of an input (x[:, :2] = ...), or into all of it after a reduction over its
// rows (x -= x.mean(-1)): the region that computes the value stores it into x itself where its
// loads of x are row-local (kernel.h) and x addresses them as the destination does; otherwise the
// executor copies the value after the kernel. Either way the caller sees the interpreter's
// result, and no region rewrites all of x for a write into part of it.
TEST(CpuBackend, RowLocalWritesStoreInTheKernelOnlyWhereTheyMay) {
  ScopedEnv on("KILN_CPU_KERNELS", "1");
  struct Case {
    const char* name;
    std::function<void(Tensor)> program;
    bool in_kernel;
  };
  std::vector<Case> cases = {
      // the row's max and sum passes read x[i0, :2] before the row stores; the last loop at the
      // element it stores
      {"softmax of the slice it replaces",
       [](Tensor x) { x.slice(1, 0, 2).copy_(x.slice(1, 0, 2).softmax(-1)); }, true},
      // the same loads, stored 6 columns away: x and the window address elements differently
      {"softmax into another slice",
       [](Tensor x) { x.slice(1, 6, 8).copy_(x.slice(1, 0, 2).softmax(-1)); }, false},
      // the passes read other rows than the one stored
      {"softmax of other rows",
       [](Tensor x) { x.slice(0, 0, 2).copy_(x.slice(0, 2, 4).softmax(-1)); }, false},
      // the last loop reads x two columns away from the element it stores
      {"shifted in the last loop",
       [](Tensor x) {
         x.slice(1, 0, 2).copy_(x.slice(1, 2, 4) - x.slice(1, 0, 4).amax({-1}, true));
       },
       false},
      {"x -= x.mean(-1)", [](Tensor x) { x.sub_(x.mean(IntList{-1}, true)); }, true},
      {"x = softmax(x * 2)", [](Tensor x) { x.copy_((x * 2).softmax(-1)); }, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TensorHandle x = ar({4, 8});
    TensorHandle y = clone(*x);
    Trace t = trace([&](Tensor v) { c.program(v); }, {spec_of(x)});
    interpret(t, {RtValue(y)});
    CompiledProgram program = compile(t, alias_pattern_of({RtValue(x)}));
    std::string printed = print_plan(program.execution, program.plan);
    EXPECT_EQ(printed.find("slice_scatter"), std::string::npos) << printed;
    ExecutionStats stats;
    execute(program, {RtValue(x)}, &stats);
    EXPECT_EQ(stats.interpreted_steps, 0);
    EXPECT_EQ(stats.writebacks_in_kernel, c.in_kernel ? 1 : 0) << printed;
    EXPECT_EQ(stats.writebacks_copied, c.in_kernel ? 0 : 1) << printed;
    EXPECT_FALSE(differs(*x, *y).has_value());
  }
}

// ---- the prelude's conversions are the storages' ------------------------------------------

TEST(CpuBackend, PreludeConversionsMatchTheInterpreterStorages) {
  std::vector<double> values = {
      0.0,    -0.0,    1.0,          -2.5,     0.1,       65504.0,      65520.0,
      1e-8,   -1e-30,  3e38,         -3.5e38,  1e300,     2147483648.0, -2147483649.0,
      9.3e18, -9.3e18, std::nan(""), INFINITY, -INFINITY, 1.0009765625, 1.00390625};
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> real(-1e6, 1e6);
  for (int i = 0; i < 2000; ++i)
    values.push_back(real(rng) * std::pow(10.0, static_cast<double>(i % 20) - 12));
  for (DType d : {DType::kBool, DType::kInt32, DType::kInt64, DType::kFloat16, DType::kBFloat16,
                  DType::kFloat32, DType::kFloat64}) {
    Storage s;
    s.dtype = d;
    s.bytes.resize(static_cast<size_t>(dtype_size(d)));
    for (double v : values) {
      s.store_double(0, v);
      double want = is_floating(d) ? s.load_double(0) : static_cast<double>(s.load_int(0));
      double got = 0;
      switch (d) {
        case DType::kBool:
          got = static_cast<double>(kernel::f_bool(v));
          break;
        case DType::kInt32:
          got = static_cast<double>(kernel::f_i32(v));
          break;
        case DType::kInt64:
          got = static_cast<double>(kernel::f_i64(v));
          break;
        case DType::kFloat16:
          got = kernel::f_f16(v);
          break;
        case DType::kBFloat16:
          got = kernel::f_bf16(v);
          break;
        case DType::kFloat32:
          got = kernel::f_f32(v);
          break;
        case DType::kFloat64:
          got = kernel::f_f64(v);
          break;
      }
      EXPECT_TRUE((std::isnan(want) && std::isnan(got)) || want == got)
          << dtype_name(d) << " " << v << ": " << want << " vs " << got;
      if (is_floating(d)) {
        EXPECT_TRUE(round_to_dtype(v, d) == got || std::isnan(got)) << dtype_name(d) << " " << v;
      }
      auto iv = float_to_int<int64_t>(v);
      s.store_int(0, iv);
      want = is_floating(d) ? s.load_double(0) : static_cast<double>(s.load_int(0));
      switch (d) {
        case DType::kBool:
          got = static_cast<double>(kernel::i_bool(iv));
          break;
        case DType::kInt32:
          got = static_cast<double>(kernel::i_i32(iv));
          break;
        case DType::kInt64:
          got = static_cast<double>(kernel::i_i64(iv));
          break;
        case DType::kFloat16:
          got = kernel::i_f16(iv);
          break;
        case DType::kBFloat16:
          got = kernel::i_bf16(iv);
          break;
        case DType::kFloat32:
          got = kernel::i_f32(iv);
          break;
        case DType::kFloat64:
          got = kernel::i_f64(iv);
          break;
      }
      EXPECT_EQ(want, got) << dtype_name(d) << " int " << iv;
    }
  }
}

// ---- what is not lowered ------------------------------------------------------------------

std::string why_not(const std::string& text) {
  Trace t = parse_trace(text);
  ExecutionPlan plan = fuse(t);
  std::string why;
  for (const Step& step : plan.steps) {
    codegen::KernelLowering l = codegen::lower_kernel(step, codegen::Target::kCpu);
    if (!l.kernel) why += l.why_not + "; ";
  }
  return why;
}

TEST(CpuBackend, UnsupportedRegionsSayWhy) {
  EXPECT_NE(why_not(R"(def f(x):
  # x: "cpu f32[4, 0]"
  t0 = ltorch.exp(x)
  t1 = ltorch.sum(t0, [1])
  return {"output": (t1,)}
)")
                .find("sum: a reduction over no elements"),
            std::string::npos);
  EXPECT_NE(why_not(R"(def f(x, y):
  # x: "cpu f32[0, 5]"
  # y: "cpu f32[0, 5]"
  t0 = ltorch.cat([x, y])
  t1 = ltorch.exp(t0)
  return {"output": (t1,)}
)")
                .find("a join of empty tensors"),
            std::string::npos);
  EXPECT_NE(why_not(R"(def f(x, y):
  # x: "cpu i64[4, 5]"
  # y: "cpu i64[5]"
  t0 = ltorch.remainder(x, y)
  return {"output": (t0,)}
)")
                .find("integer remainder can raise"),
            std::string::npos);
  EXPECT_NE(why_not(R"(def f(x, y):
  # x: "cpu f32[4, 5]"
  # y: "cpu f32[5, 3]"
  t0 = ltorch.matmul(x, y)
  return {"output": (t0,)}
)")
                .find("not a fusion region"),
            std::string::npos);
  EXPECT_NE(why_not(R"(def f(x, y):
  # x: "cpu f32[10]"
  # y: "cpu f32[2, 2]"
  t0 = ltorch.exp(x)
  t1 = ltorch.as_strided_scatter(t0, y, [2, 2], [1, 1])
  return {"output": (t1,)}
)")
                .find("as_strided_scatter: a window that repeats elements"),
            std::string::npos);
}

// The executor interprets what is not lowered, and the program still agrees with eager.
TEST(CpuBackend, TheExecutorInterpretsWhatIsNotLowered) {
  ScopedEnv on("KILN_CPU_KERNELS", "1");
  TensorHandle x = ar({4, 5});
  TensorHandle y = clone(*x);
  Trace t = trace(
      [](Tensor v) {
        v.exp_();
        // (an integer remainder can raise: no kernel computes it)
        Tensor k = (v * 4).to(DType::kInt64);
        return v.softmax(1) * 2 + k.remainder(k + 3);
      },
      {spec_of(x)});
  std::vector<RtValue> expected = interpret(t, {RtValue(y)});
  ExecutionStats stats;
  std::vector<RtValue> out =
      execute(compile(t, alias_pattern_of({RtValue(x)})), {RtValue(x)}, &stats);
  EXPECT_GE(stats.interpreted_steps, 1);
  EXPECT_FALSE(differs(*x, *y).has_value());
  EXPECT_FALSE(differs(*std::get<TensorHandle>(out[0]), *std::get<TensorHandle>(expected[0])));
}

}  // namespace
}  // namespace kiln
