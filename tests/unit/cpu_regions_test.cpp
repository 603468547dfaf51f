// CPU kernels against the reference interpreter, bit for bit: one fusion region per family of
// views, scatters, creation ops and elementwise dtype rules, run as a kernel on strided and
// f16/bf16 inputs of sizes that are not multiples of 8 (DESIGN.md 3; codegen/kernel.h states the
// agreement: elementwise exactly, float64 transcendentals within libmvec's ulps, reductions
// within float rounding).
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "kiln/ir/parser.h"
#include "kiln/kiln.h"
#include "kiln/passes/fuse.h"
#include "kiln/runtime/cpu/cpu_kernels.h"
#include "kiln/runtime/cpu/kernel_cache.h"
#include "kiln/runtime/interpreter/interpreter.h"
#include "support/bitwise.h"

namespace kiln {
namespace {

using test::differs;

// ---- inputs and comparison ----------------------------------------------------------------

// A tensor over a larger storage with a permuted, padded layout (dims in reverse order in memory,
// one element of padding per dim, offset 3) and random values; every storage element is set.
TensorHandle strided_input(DType dtype, const Shape& shape, uint64_t seed) {
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    strides[d] = stride;
    stride *= shape[d] + 1;
  }
  int64_t offset = 3;
  int64_t numel = offset + required_storage_numel(shape, strides, 0) + 2;
  TensorHandle t = make_strided(dtype, shape, strides, offset, numel);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> real(-3.0, 3.0);
  std::uniform_int_distribution<int64_t> integer(-20, 20);
  for (int64_t i = 0; i < numel; ++i) {
    if (dtype == DType::kBool)
      t->storage->store_int(i, integer(rng) > 0);
    else if (is_floating(dtype))
      t->storage->store_double(i, i % 11 == 5 ? 0.0 : real(rng));
    else
      t->storage->store_int(i, integer(rng));
  }
  return t;
}

// ---- regions against the interpreter ------------------------------------------------------

struct RegionCase {
  std::string name;
  std::string text;  // a functional trace that fuses into one region
};

std::vector<RegionCase> region_cases() {
  return {
      // views
      {"slice", R"(def f(x):
  # x: "cpu f16[9, 7]"
  t0 = ltorch.slice(x, 1, 1, 6, 2)
  t1 = ltorch.slice(x, 0, -4, None, 3)
  t2 = ltorch.mul(t0, 2.5)
  t3 = ltorch.neg(t1)
  return {"output": (t2, t3)}
)"},
      {"select_narrow", R"(def f(x):
  # x: "cpu bf16[5, 6, 3]"
  t0 = ltorch.select(x, 1, -2)
  t1 = ltorch.narrow(x, 1, 2, 3)
  t2 = ltorch.exp(t0)
  t3 = ltorch.select(t1, 2, 1)
  t4 = ltorch.add(t3, t3)
  return {"output": (t2, t4)}
)"},
      {"permute_transpose_t", R"(def f(x, y):
  # x: "cpu f32[3, 5, 7]"
  # y: "cpu f16[7, 5]"
  t0 = ltorch.permute(x, [2, 1, 0])
  t1 = ltorch.transpose(t0, 0, 2)
  t2 = ltorch.t(y)
  t3 = ltorch.mul(t1, t2)
  t4 = ltorch.sin(t0)
  return {"output": (t3, t4)}
)"},
      {"expand_unsqueeze_squeeze", R"(def f(x, y):
  # x: "cpu f16[5, 1, 3]"
  # y: "cpu f32[5, 3]"
  t0 = ltorch.expand(x, [2, 5, 4, 3])
  t1 = ltorch.squeeze(x, [1])
  t2 = ltorch.unsqueeze(t1, 1)
  t3 = ltorch.add(t0, t2)
  t4 = ltorch.sub(y, t1)
  return {"output": (t3, t4)}
)"},
      {"reshape_view_flatten_unflatten", R"(def f(x):
  # x: "cpu f32[6, 5]"
  t0 = ltorch.reshape(x, [3, 10])
  t1 = ltorch.reshape(x, [30])
  t2 = ltorch.view(t1, [3, 10])
  t3 = ltorch.add(t0, t2)
  t4 = ltorch.flatten(x)
  t5 = ltorch.unflatten(t4, 0, [5, 2, 3])
  t6 = ltorch.exp(t5)
  return {"output": (t3, t6)}
)"},
      {"reshape_of_computed", R"(def f(x):
  # x: "cpu bf16[4, 6]"
  t0 = ltorch.tanh(x)
  t1 = ltorch.reshape(t0, [3, 2, 4])
  t2 = ltorch.transpose(t1, 0, 2)
  t3 = ltorch.mul(t2, 3)
  return {"output": (t3,)}
)"},
      {"diagonal", R"(def f(x):
  # x: "cpu f32[5, 7, 3]"
  t0 = ltorch.diagonal(x, 1, 0, 1)
  t1 = ltorch.diagonal(x, -2, 1, 0)
  t2 = ltorch.exp(t0)
  t3 = ltorch.cos(t1)
  return {"output": (t2, t3)}
)"},
      {"split_chunk_unbind", R"(def f(x):
  # x: "cpu f16[7, 3]"
  t0, t1, t2 = ltorch.split(x, 3)
  t3, t4 = ltorch.chunk(x, 2, 1)
  t5, t6, t7 = ltorch.unbind(x, 1)
  t8 = ltorch.add(t0, t1)
  t9 = ltorch.mul(t4, t3)
  t10 = ltorch.sub(t5, t7)
  t11 = ltorch.abs(t2)
  return {"output": (t8, t9, t10, t11)}
)"},
      {"alias_detach", R"(def f(x):
  # x: "cpu f32[5, 3]"
  t0 = ltorch.alias(x)
  t1 = ltorch.detach(t0)
  t2 = ltorch.sqrt(t1)
  return {"output": (t2,)}
)"},
      {"as_strided_of_input", R"(def f(x):
  # x: "cpu f32[29]"
  t0 = ltorch.as_strided(x, [3, 5], [7, 1], 2)
  t1 = ltorch.as_strided(x, [4], [3])
  t2 = ltorch.mul(t0, 2)
  t3 = ltorch.exp(t1)
  return {"output": (t2, t3)}
)"},
      // scatters
      {"slice_scatter", R"(def f(x, y):
  # x: "cpu f16[9, 7]"
  # y: "cpu f16[9, 3]"
  t0 = ltorch.exp(y)
  t1 = ltorch.slice_scatter(x, t0, 1, 1, 6, 2)
  t2 = ltorch.mul(t1, 2)
  return {"output": (t2,)}
)"},
      {"select_scatter", R"(def f(x, y):
  # x: "cpu bf16[5, 6]"
  # y: "cpu bf16[5]"
  t0 = ltorch.select_scatter(x, y, 1, -2)
  t1 = ltorch.neg(t0)
  return {"output": (t1,)}
)"},
      {"diagonal_scatter", R"(def f(x, y):
  # x: "cpu f32[5, 7]"
  # y: "cpu f32[4]"
  t0 = ltorch.diagonal_scatter(x, y, -1, 0, 1)
  t1 = ltorch.sin(t0)
  return {"output": (t1,)}
)"},
      {"as_strided_scatter", R"(def f(x, y):
  # x: "cpu f32[27]"
  # y: "cpu f32[3, 4]"
  t0 = ltorch.exp(x)
  t1 = ltorch.as_strided_scatter(t0, y, [3, 4], [8, 2], 1)
  t2 = ltorch.as_strided(t1, [5], [5], 0)
  t3 = ltorch.neg(t2)
  return {"output": (t1, t3)}
)"},
      // creation
      {"full_zeros_ones", R"(def f(x):
  # x: "cpu bf16[5, 3]"
  t0 = ltorch.full([5, 3], 1.3, dtype=torch.bfloat16)
  t1 = ltorch.zeros([5, 3], dtype=torch.int32)
  t2 = ltorch.ones([3], dtype=torch.float16)
  t3 = ltorch.add(x, t0)
  t4 = ltorch.add(t3, t1)
  t5 = ltorch.mul(t4, t2)
  return {"output": (t5,)}
)"},
      {"like_and_fill", R"(def f(x, s):
  # x: "cpu f16[5, 3]"
  # s: "cpu f32[]"
  t0 = ltorch.full_like(x, 2.7)
  t1 = ltorch.zeros_like(x, dtype=torch.int64)
  t2 = ltorch.ones_like(x)
  t3 = ltorch.empty_like(x)
  t4 = ltorch.fill(x, s)
  t5 = ltorch.fill(x, 7)
  t6 = ltorch.add(t0, t1)
  t7 = ltorch.add(t6, t2)
  t8 = ltorch.add(t7, t3)
  t9 = ltorch.mul(t8, t4)
  t10 = ltorch.sub(t9, t5)
  return {"output": (t10,)}
)"},
      {"arange", R"(def f(x):
  # x: "cpu f32[13]"
  t0 = ltorch.arange(1.5, 8, 0.5)
  t1 = ltorch.arange(-3, 23, 2, dtype=torch.int64)
  t2 = ltorch.add(x, t0)
  t3 = ltorch.mul(t2, t1)
  return {"output": (t3,)}
)"},
      // elementwise dtype rules, casts, numbers
      {"mixed_dtypes", R"(def f(a, b, c, d):
  # a: "cpu f16[5, 7]"
  # b: "cpu bf16[7]"
  # c: "cpu i32[5, 1]"
  # d: "cpu bool[5, 7]"
  t0 = ltorch.add(a, b)
  t1 = ltorch.mul(t0, c)
  t2 = ltorch.where(d, t1, a)
  t3 = ltorch.gt(t2, 0.5)
  t4 = ltorch.logical_and(t3, d)
  t5 = ltorch.clamp(c, -3)
  t6 = ltorch.bitwise_xor(t5, 5)
  return {"output": (t2, t4, t6)}
)"},
      {"casts", R"(def f(a, b):
  # a: "cpu f32[3, 5]"
  # b: "cpu i64[3, 5]"
  t0 = ltorch.mul(a, 1000)
  t1 = ltorch.to(t0, torch.float16)
  t2 = ltorch.to(t0, torch.int32)
  t3 = ltorch.to(b, torch.bfloat16)
  t4 = ltorch.to(t1, torch.bool)
  t5 = ltorch.to(b, torch.float64)
  t6 = ltorch.add(t3, t5)
  return {"output": (t1, t2, t4, t6)}
)"},
      {"number_inputs", R"(def f(x, s, n):
  # x: "cpu f32[7, 5]"
  # s: "float"
  # n: "int"
  t0 = ltorch.add(x, s, alpha=n)
  t1 = ltorch.lerp(x, t0, s)
  t2 = ltorch.addcmul(t1, x, t0, value=s)
  t3 = ltorch.full([7, 5], n, dtype=torch.float16)
  t4 = ltorch.sub(t2, t3)
  return {"output": (t4,)}
)"},
      {"integers", R"(def f(a, b):
  # a: "cpu i64[6, 7]"
  # b: "cpu i32[7]"
  t0 = ltorch.mul(a, b)
  t1 = ltorch.sub(t0, 9, alpha=2)
  t2 = ltorch.abs(t1)
  t3 = ltorch.maximum(t2, a)
  t4 = ltorch.div(t3, 4)
  t5 = ltorch.sign(t1)
  return {"output": (t3, t4, t5)}
)"},
      {"float_math", R"(def f(a, b):
  # a: "cpu f32[6, 5]"
  # b: "cpu f64[5]"
  t0 = ltorch.div(a, b, rounding_mode="floor")
  t1 = ltorch.remainder(a, b)
  t2 = ltorch.gelu(a, approximate="tanh")
  t3 = ltorch.atan2(t0, t1)
  t4 = ltorch.pow(t2, 2)
  t5 = ltorch.log(a)
  return {"output": (t3, t4, t5)}
)"},
      // sigmoid and silu of float32 and bfloat16 compute in float (scalar_math.h) in both; the
      // float result feeds a float64 op, where a last-bit difference would show (random program
      // seed 6643555124090024363's did). Of float64 they are libm's exp in the interpreter and
      // libmvec's in a kernel, within a few double ulp of each other, as every float64
      // transcendental is.
      {"sigmoid_silu", R"(def f(a, b, c):
  # a: "cpu f32[37, 65]"
  # b: "cpu bf16[37, 65]"
  # c: "cpu f64[65]"
  t0 = ltorch.sigmoid(a)
  t1 = ltorch.silu(a)
  t2 = ltorch.sub(t1, c)
  t3 = ltorch.sigmoid(b)
  t4 = ltorch.silu(b)
  return {"output": (t0, t2, t3, t4)}
)"},
      // erf and GELU of float32 and bfloat16 compute in float (erf_f32) in both; the float
      // results feed a float64 op, where a last-bit difference would show.
      {"erf_gelu", R"(def f(a, b, c):
  # a: "cpu f32[37, 65]"
  # b: "cpu bf16[37, 65]"
  # c: "cpu f64[65]"
  t0 = ltorch.erf(a)
  t1 = ltorch.gelu(a)
  t2 = ltorch.sub(t1, c)
  t3 = ltorch.gelu(b, approximate="tanh")
  t4 = ltorch.erf(b)
  t5 = ltorch.sub(t0, c)
  return {"output": (t5, t2, t3, t4)}
)"},
      {"large_parallel", R"(def f(x, y):
  # x: "cpu f32[301, 257]"
  # y: "cpu bf16[257]"
  t0 = ltorch.mul(x, y)
  t1 = ltorch.tanh(t0)
  return {"output": (t1,)}
)"},
  };
}

// Inputs for a trace: strided random tensors, and fixed numbers.
std::vector<RtValue> inputs_for(const Trace& t, uint64_t seed) {
  std::vector<RtValue> in;
  for (size_t i = 0; i < t.inputs().size(); ++i) {
    const Value* v = t.inputs()[i];
    if (v->is_tensor()) {
      in.emplace_back(strided_input(v->tensor_type().dtype, v->tensor_type().shape, seed + i));
      continue;
    }
    switch (v->scalar_type().kind) {
      case ScalarKind::kFloat:
        in.emplace_back(RtScalar(-1.75));
        break;
      case ScalarKind::kInt:
        in.emplace_back(RtScalar(int64_t{3}));
        break;
      case ScalarKind::kBool:
        in.emplace_back(RtScalar(true));
        break;
    }
  }
  return in;
}

void PrintTo(const RegionCase& c, std::ostream* os) {
  *os << c.name;
}

// Runs step's kernel on the values the interpreter gave its inputs (`seen`) and expects every
// output to be the interpreter's, bit for bit.
void expect_kernel_agrees(const Step& step, const cpu::StepKernel& k,
                          const std::map<const Value*, RtValue>& seen, const std::string& label) {
  std::vector<RtValue> inputs;
  for (const Value* v : step.inputs)
    inputs.push_back(seen.at(v));
  std::vector<TensorHandle> outputs;
  for (const codegen::KernelOutput& o : k.kernel.outputs)
    outputs.push_back(empty_strided(o.dtype, o.shape, contiguous_strides(o.shape)));
  ASSERT_TRUE(cpu::run_cpu_kernel(k, inputs, outputs));
  for (size_t j = 0; j < outputs.size(); ++j) {
    auto d = differs(*std::get<TensorHandle>(seen.at(step.outputs[j])), *outputs[j]);
    EXPECT_FALSE(d.has_value()) << label << " " << step.outputs[j]->name() << ": " << *d << "\n"
                                << k.kernel.source;
  }
}

class Regions : public ::testing::TestWithParam<RegionCase> {
 public:
  // Every case's kernels compiled at once: one compiler run instead of one per case.
  static void SetUpTestSuite() {
    std::vector<std::pair<Trace, ExecutionPlan>> kept;
    for (const RegionCase& c : region_cases()) {
      try {
        Trace t = parse_trace(c.text, c.name);
        ExecutionPlan p = fuse(t);
        kept.emplace_back(std::move(t), std::move(p));
      } catch (const std::exception&) {
        // The case's test reports it.
      }
    }
    std::vector<const ExecutionPlan*> plans;
    for (const auto& [t, p] : kept)
      plans.push_back(&p);
    cpu::warm_cpu_kernels(plans);
  }
};

// Every fusion region of the case (fuse may cut independent chains apart) lowers, and its kernel
// computes what the interpreter computes for the region's values.
TEST_P(Regions, KernelAgreesWithTheInterpreter) {
  const RegionCase& c = GetParam();
  Trace t = parse_trace(c.text, c.name);
  ExecutionPlan plan = fuse(t);
  cpu::PlanKernels kernels = cpu::prepare_cpu_kernels(plan);
  for (uint64_t seed : {1, 2}) {
    std::map<const Value*, RtValue> seen;
    interpret_observed(t, inputs_for(t, seed * 100),
                       [&](const Value* v, const RtValue& r) { seen[v] = r; });
    for (size_t s = 0; s < plan.steps.size(); ++s) {
      const Step& step = plan.steps[s];
      ASSERT_EQ(step.kind, Step::Kind::kFusion);
      ASSERT_TRUE(kernels.steps[s].has_value()) << kernels.why_not[s];
      expect_kernel_agrees(step, *kernels.steps[s], seen, c.name);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CpuBackend, Regions, ::testing::ValuesIn(region_cases()),
                         [](const auto& info) { return info.param.name; });

// A nest reads its outermost extent at run time (codegen Kernel::extents), so a region at row
// counts its schedules treat alike has one source, one compiled kernel, and that kernel computes
// what the interpreter does at each count. (Rows of 24 with a row max, an exp and a bf16 scale;
// rows of 8 made from [R, 3, 8] by a reshape, so the nest's extent is 3R; a column max and a
// column mean over the R rows, whose passes read R at run time too.)
TEST(CpuBackend, RowCountsOfASizeClassShareOneKernel) {
  const std::string text = R"(def f(x, w, y, z):
  # x: "cpu f32[R, 24]"
  # w: "cpu bf16[24]"
  # y: "cpu f32[R, 3, 8]"
  # z: "cpu f64[R, 6]"
  t0 = ltorch.amax(x, [1], True)
  t1 = ltorch.sub(x, t0)
  t2 = ltorch.exp(t1)
  t3 = ltorch.mul(t2, w)
  t4 = ltorch.reshape(y, [-1, 8])
  t5 = ltorch.tanh(t4)
  t6 = ltorch.add(t5, 0.5)
  t7 = ltorch.amax(x, [0])
  t8 = ltorch.mean(z, [0])
  return {"output": (t3, t6, t7, t8)}
)";
  cpu::KernelCacheOptions options = cpu::default_kernel_cache_options();
  options.cache_dir = "";  // this cache's own compiles only
  cpu::KernelCache cache(options);
  std::vector<std::string> first_sources;
  for (int64_t rows : {5, 9, 37}) {
    std::string program = text;
    for (size_t at; (at = program.find("[R,")) != std::string::npos;)
      program.replace(at, 3, "[" + std::to_string(rows) + ",");
    Trace t = parse_trace(program, "rows");
    ExecutionPlan plan = fuse(t);
    cpu::PlanKernels kernels = cpu::prepare_cpu_kernels(plan, cache);
    std::map<const Value*, RtValue> seen;
    interpret_observed(t, inputs_for(t, 100 + static_cast<uint64_t>(rows)),
                       [&](const Value* v, const RtValue& r) { seen[v] = r; });
    std::vector<std::string> sources;
    for (size_t s = 0; s < plan.steps.size(); ++s) {
      const Step& step = plan.steps[s];
      ASSERT_TRUE(kernels.steps[s].has_value()) << kernels.why_not[s];
      const cpu::StepKernel& k = *kernels.steps[s];
      sources.push_back(k.kernel.source);
      EXPECT_FALSE(k.kernel.extents.empty()) << k.kernel.source;
      expect_kernel_agrees(step, k, seen, std::to_string(rows) + " rows");
    }
    if (first_sources.empty()) first_sources = sources;
    EXPECT_EQ(sources, first_sources) << rows << " rows";
  }
  EXPECT_EQ(cache.stats().kernels_compiled, static_cast<int>(first_sources.size()));
  EXPECT_GE(first_sources.size(), 1u);
}

}  // namespace
}  // namespace kiln
