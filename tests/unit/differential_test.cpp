// Differential tests (DESIGN.md 6): kiln (compile + execute) against the reference interpreter on
// random programs and on the CASES.md programs, comparing outputs, every input's memory and
// layout afterwards, which outputs are (views of) which inputs, and errors. The harness itself
// is tested against the interpreter and against runners with planted faults.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>

#include "kiln/ir/parser.h"
#include "kiln/ir/verifier.h"
#include "kiln/kiln.h"
#include "kiln/passes/pipeline.h"
#include "kiln/runtime/executor.h"
#include "support/case_inputs.h"
#include "support/cases.h"
#include "support/random_program.h"

namespace kiln {
namespace {

using test::ar;
using test::spec_of;

using fuzz::CheckOptions;
using fuzz::FuzzSummary;

// kiln runs in a child process per program: a crash is one failing program, not the end of the
// test binary.
CheckOptions isolated() {
  CheckOptions o;
  o.isolate = true;
  return o;
}

void expect_no_failures(const FuzzSummary& s, const std::string& rerun) {
  EXPECT_EQ(s.failed, 0) << s.str() << rerun;
  for (const std::string& r : s.reports)
    ADD_FAILURE() << r;
}

// ---- random programs through kiln ----

// KILN_FIXED_SEED_PROGRAMS sets how many (2000 unless set). The debug preset's tests run 500:
// under the sanitizers a program costs about 5 times as much, and the release tests run all 2000.
int fixed_seed_count() {
  const char* v = std::getenv("KILN_FIXED_SEED_PROGRAMS");
  return v ? std::atoi(v) : 2000;
}

TEST(Differential, ProgramsFromAFixedSeed) {
  const int count = fixed_seed_count();
  ASSERT_GT(count, 0) << "KILN_FIXED_SEED_PROGRAMS is not a positive number of programs";
  FuzzSummary s = fuzz::run_fuzz(20240601, count, isolated());
  expect_no_failures(s, "rerun: kiln_fuzz --count " + std::to_string(count) + " --seed 20240601");
  RecordProperty("summary", s.str());
}

TEST(Differential, FiveHundredProgramsFromAFreshSeed) {
  uint64_t seed = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  FuzzSummary s = fuzz::run_fuzz(seed, 500, isolated());
  expect_no_failures(s, "seed " + std::to_string(seed) + "; rerun: kiln_fuzz --count 500 --seed " +
                            std::to_string(seed));
}

// Programs fresh seeds found failing, kept as they were found. The first six: a step that only
// views the caller's argument (an output t[0, 1:] of t = a's old contents) made its view where a
// writeback later changed it, instead of detaching it (a wrong value without an error). The
// seventh: a CPU sum of float32 into float64 summed chunks in float (1.5e-6 off). The eighth: a
// CUDA flat nest's vector variant stored a 0-d result of the region, loading an input away from
// its element (an internal error). The ninth: a float32 sum 3 ulp off the interpreter's, which
// sinh amplified past the tolerance (the harness's condition check, random_program.cpp).
TEST(Differential, ProgramsFreshSeedsFound) {
  for (uint64_t seed : {17550475236644050234ULL, 5783614687145628658ULL, 2827893254684656319ULL,
                        1439158585686429972ULL, 9023676027367222091ULL, 12878847206511408602ULL,
                        17577510282633209152ULL, 14565168512233157365ULL, 1635894633087019929ULL}) {
    SCOPED_TRACE("kiln_fuzz --program " + std::to_string(seed));
    std::optional<std::string> failure =
        fuzz::check_program(fuzz::generate_program(seed), isolated());
    EXPECT_FALSE(failure) << *failure;
  }
}

// ---- the CASES.md programs through kiln ----

std::vector<TensorSpec> specs_of(const std::vector<RtValue>& inputs) {
  std::vector<TensorSpec> specs;
  for (const RtValue& v : inputs)
    specs.push_back(spec_of(std::get<TensorHandle>(v)));
  return specs;
}

void expect_agreement(const Trace& t, const std::vector<RtValue>& inputs,
                      const CheckOptions& options = {}) {
  if (auto failure = fuzz::check_trace(t, inputs, options)) {
    ADD_FAILURE() << *failure << "\n"
                  << print_trace(t) << "alias pattern: " << fuzz::pattern_of_inputs(inputs).str(t);
  }
}

// Each CASES.md program with the call CASES.md gives it, checked with `options`.
void run_cases(const CheckOptions& options) {
  test::for_each_case(
      [&](const std::string& name, const Trace& t, const std::vector<RtValue>& inputs) {
        SCOPED_TRACE("CASES " + name);
        expect_agreement(t, inputs, options);
      });
}

TEST(Differential, CasesProgramsAgreeWithTheInterpreter) {
  run_cases(isolated());
}

// ---- the harness, checked against the interpreter itself and against planted faults ----

CheckOptions self_check() {
  CheckOptions o;
  o.runner = fuzz::interpreter_runner();
  o.outputs_among_themselves = true;
  return o;
}

TEST(DifferentialHarness, CasesAgreeWithTheInterpreterItself) {
  run_cases(self_check());
}

TEST(DifferentialHarness, GeneratedProgramsAreValidAndVaried) {
  FuzzSummary s = fuzz::run_fuzz(99, 2000, self_check());
  expect_no_failures(s, "");
  EXPECT_GE(s.op_counts.size(), 60u) << s.str();
  // Every kind of move shows up.
  for (const char* op :
       {"add",     "mul_",      "where",      "clamp_",     "addcmul",    "sum",      "mean",
        "amax",    "slice",     "select",     "transpose",  "permute",    "diagonal", "reshape",
        "view",    "unsqueeze", "squeeze",    "expand",     "getitem",    "split",    "fill_",
        "copy_",   "setitem_",  "transpose_", "t_",         "unsqueeze_", "squeeze_", "cat",
        "softmax", "to",        "matmul",     "as_strided", "empty_like", "full",     "unbind"}) {
    EXPECT_GT(s.op_counts[op], 0) << op << "\n" << s.str();
  }
  for (const char* tag : {"distinct", "same-object", "equal-views", "view+base", "disjoint",
                          "overlapping", "transposed-alias", "strided", "number"}) {
    EXPECT_GT(s.scenario_counts[tag], 20) << tag << "\n" << s.str();
  }
  // Some programs raise in eager (partial overlap, writes into expanded memory, ...), most do not.
  EXPECT_GT(s.both_raised, 40) << s.str();
  EXPECT_LT(s.both_raised, 400) << s.str();
}

TEST(DifferentialHarness, ProgramsAreDeterministicVerifiedAndRoundTripThroughText) {
  for (uint64_t i = 0; i < 300; ++i) {
    uint64_t seed = fuzz::program_seed(5, i);
    fuzz::RandomProgram p = fuzz::generate_program(seed);
    fuzz::RandomProgram q = fuzz::generate_program(seed);
    std::string printed = print_trace(p.trace);
    ASSERT_EQ(printed, print_trace(q.trace)) << seed;
    EXPECT_EQ(p.pattern, q.pattern);
    EXPECT_GE(p.trace.nodes().size(), 1u) << printed;
    EXPECT_LE(p.recipe.steps.size(), 30u) << printed;
    EXPECT_GE(p.recipe.inputs.size(), 1u);
    EXPECT_LE(p.recipe.inputs.size(), 4u);
    EXPECT_TRUE(verify_trace_problems(p.trace).empty()) << printed;
    EXPECT_EQ(print_trace(parse_trace(printed)), printed);
    EXPECT_EQ(AliasPattern::parse(p.pattern.str(p.trace), p.trace), p.pattern)
        << p.pattern.str(p.trace);
    // Materializing the program's own recipe gives the same program.
    EXPECT_EQ(print_trace(fuzz::materialize(p.recipe, seed).trace), printed);
  }
}

TEST(DifferentialHarness, DeepCopiesKeepTheAliasingStructure) {
  TensorHandle base = make_tensor(f32, {6}, {1, 2, 3, 4, 5, 6});
  TensorHandle a = make_view(base, {2}, {2}, 0);
  TensorHandle b = make_view(base, {3}, {1}, 3);
  std::vector<RtValue> in = {a, RtScalar(2.5), b, a, make_tensor(f32, {1}, {7})};
  std::vector<RtValue> out = fuzz::deep_copy(in);
  auto h = [&](size_t i) { return std::get<TensorHandle>(out[i]); };
  EXPECT_NE(h(0), a);
  EXPECT_NE(h(0)->storage, base->storage);
  EXPECT_EQ(h(0), h(3)) << "the same object stays one object";
  EXPECT_EQ(h(0)->storage, h(2)->storage) << "views of one storage stay views of one storage";
  EXPECT_NE(h(0)->storage, h(4)->storage);
  EXPECT_EQ(h(2)->offset, 3);
  EXPECT_EQ(to_vector(*h(2)), std::vector<double>({4, 5, 6}));
  EXPECT_EQ(std::get<double>(std::get<RtScalar>(out[1])), 2.5);
  EXPECT_EQ(fuzz::pattern_of_inputs(out), fuzz::pattern_of_inputs(in));
}

// A runner that computes everything on private copies: the caller's tensors never change and
// outputs are never the caller's objects.
fuzz::Runner forgetful_runner() {
  return [](const Trace& t, const AliasPattern&, const std::vector<RtValue>& in) {
    return interpret(t, fuzz::deep_copy(in));
  };
}

TEST(DifferentialHarness, LostWritesAreFoundAndShrunk) {
  CheckOptions o;
  o.runner = forgetful_runner();
  FuzzSummary s = fuzz::run_fuzz(7, 200, o, /*max_reports=*/3);
  EXPECT_GT(s.failed, 50) << s.str();
  ASSERT_FALSE(s.reports.empty());
  // A shrunk report is a small program: find one that writes an input.
  for (uint64_t i = 0;; ++i) {
    ASSERT_LT(i, 200u) << "no program lost a write";
    fuzz::RandomProgram p = fuzz::generate_program(fuzz::program_seed(7, i));
    auto failure = fuzz::check_program(p, o);
    if (!failure || fuzz::failure_category(*failure) != "input-contents") continue;
    fuzz::Shrunk small = fuzz::shrink(p, *failure, o);
    EXPECT_EQ(fuzz::failure_category(small.failure), "input-contents");
    EXPECT_LE(small.program.trace.nodes().size(), 2u) << fuzz::describe(small.program);
    EXPECT_LE(small.program.trace.nodes().size(), p.trace.nodes().size());
    std::string report = fuzz::describe(small.program);
    EXPECT_NE(report.find("def computation("), std::string::npos) << report;
    EXPECT_NE(report.find("alias pattern: "), std::string::npos) << report;
    EXPECT_NE(report.find("buf0"), std::string::npos) << report;
    break;
  }
}

TEST(DifferentialHarness, WrongOutputIdentityIsFound) {
  // V2: y is a view of the caller's x. A runner on copies returns a y of its own.
  std::vector<RtValue> in = {ar({4, 2})};
  Trace t = trace(
      [](Tensor x) {
        Tensor y = x.view({8});
        return y;
      },
      specs_of(in));
  CheckOptions o;
  o.runner = forgetful_runner();
  auto failure = fuzz::check_trace(t, in, o);
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(fuzz::failure_category(*failure), "output-identity") << *failure;
}

TEST(DifferentialHarness, MissingErrorsAndValueErrorsAreFound) {
  std::vector<RtValue> in = {make_tensor(f32, {4}, {0, 0, 0, 0})};
  Trace h3 = trace([](Tensor x) { x.expand({2, 4}).add_(1); }, specs_of(in));
  CheckOptions quiet;
  quiet.runner = [](const Trace&, const AliasPattern&, const std::vector<RtValue>&) {
    return std::vector<RtValue>{};
  };
  auto failure = fuzz::check_trace(h3, in, quiet);
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(fuzz::failure_category(*failure), "raise") << *failure;

  Trace s1 = trace([](Tensor a) { return a * 2; }, specs_of(in));
  CheckOptions off_by_a_bit;
  off_by_a_bit.runner = [](const Trace& t, const AliasPattern&, const std::vector<RtValue>& x) {
    std::vector<RtValue> outs = interpret(t, x);
    TensorHandle o = std::get<TensorHandle>(outs[0]);
    o->storage->store_double(2, o->storage->load_double(2) + 1e-3);
    return outs;
  };
  failure = fuzz::check_trace(s1, in, off_by_a_bit);
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(fuzz::failure_category(*failure), "output-values") << *failure;
  EXPECT_NE(failure->find("element 2"), std::string::npos) << *failure;

  CheckOptions within_tolerance;
  within_tolerance.runner = [](const Trace& t, const AliasPattern&, const std::vector<RtValue>& x) {
    std::vector<RtValue> outs = interpret(t, x);
    TensorHandle o = std::get<TensorHandle>(outs[0]);
    o->storage->store_double(2,
                             std::nextafter(static_cast<float>(o->storage->load_double(2)), 1.f));
    return outs;
  };
  EXPECT_EQ(fuzz::check_trace(s1, in, within_tolerance), std::nullopt);
}

// A disagreement the program's conditioning explains passes: a float32 sum 3 ulp off (a CPU
// kernel sums in float chunks, the interpreter in double), which sinh of about 43 amplifies past
// the tolerance (fresh seed 5099400936352163564). A real error at a well-conditioned element of
// the same program is still found.
TEST(DifferentialHarness, AmplifiedRoundingPassesAndRealErrorsAreStillFound) {
  std::vector<RtValue> in = {make_tensor(f32, {4}, {10, 11, 12, 10.5})};
  Trace t = trace([](Tensor a) { return std::make_tuple(a.sum(IntList{0}).sinh(), a * 2); },
                  specs_of(in));
  auto sum_off_by_3_ulp = [](const Trace& tr, const AliasPattern&, const std::vector<RtValue>& x) {
    std::vector<RtValue> outs = interpret(tr, x);
    float sum = 43.5f;
    for (int i = 0; i < 3; ++i)
      sum = std::nextafter(sum, 100.f);
    std::get<TensorHandle>(outs[0])->storage->store_double(0, std::sinh(double{sum}));
    return outs;
  };
  CheckOptions amplified;
  amplified.runner = sum_off_by_3_ulp;
  EXPECT_EQ(fuzz::check_trace(t, in, amplified), std::nullopt);

  CheckOptions also_wrong;
  also_wrong.runner = [&](const Trace& tr, const AliasPattern& p, const std::vector<RtValue>& x) {
    std::vector<RtValue> outs = sum_off_by_3_ulp(tr, p, x);
    TensorHandle o = std::get<TensorHandle>(outs[1]);
    o->storage->store_double(2, o->storage->load_double(2) + 1e-3);
    return outs;
  };
  auto failure = fuzz::check_trace(t, in, also_wrong);
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(fuzz::failure_category(*failure), "output-values") << *failure;
  EXPECT_NE(failure->find("output 1"), std::string::npos) << *failure;
  EXPECT_EQ(failure->find("output 0"), std::string::npos) << *failure;
}

}  // namespace
}  // namespace kiln
