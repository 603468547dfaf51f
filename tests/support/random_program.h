// Random eager programs and the differential check of kiln against the reference interpreter
// (DESIGN.md 6): programs mixing in-place ops, views, metadata mutations and aliased inputs, run
// once in the interpreter (the oracle) and once through compile + execute, each on its own deep
// copy of the inputs, with outputs, input contents, input layouts, output identity and errors
// compared. Failing programs are shrunk before they are reported.
//
// A program is kept as a *recipe* (buffers, inputs as views of them, steps over tensor handles)
// and materialized into a Trace plus real inputs, so that the shrinker can drop steps and inputs
// and rebuild: a step whose operands no longer exist, or that the type rules now reject, is left
// out.
//
// Used by tests/unit/differential_test.cpp and tests/fuzz_main.cpp (the kiln_fuzz tool).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/analysis/alias_pattern.h"
#include "kiln/ir/trace.h"
#include "kiln/runtime/interpreter/rt_tensor.h"

namespace kiln::fuzz {

// ---- recipes ----------------------------------------------------------------------------------

// A tensor handle (a Python tensor object) of the program: an input's, or one a step made.
struct HandleRef {
  int id = -1;
  bool operator==(const HandleRef&) const = default;
};
using StepArg = std::variant<Constant, HandleRef, std::vector<HandleRef>>;

// One call of an op. An op that returns its first argument's object (in-place and metadata
// mutations, setitem) moves that handle forward; any other op makes new handles, `results`.
struct Step {
  OpId op = OpId::kAlias;
  std::vector<StepArg> args;
  std::vector<std::pair<std::string, StepArg>> kwargs;
  std::vector<int> results;
  int line = 0;  // the source line the trace records ("gen:<line>"), stable under shrinking
};

// Memory that one or more inputs view, as a flat array of values.
struct BufferRecipe {
  DType dtype = DType::kFloat32;
  std::vector<double> values;
};

struct InputRecipe {
  int handle = 0;  // the handle id steps use for this input
  bool is_number = false;
  double number = 0;
  int buffer = -1;
  Geometry geometry;        // the input as a view of its buffer
  int same_object_as = -1;  // handle id of an earlier input that is this very tensor object
  std::string how;          // how it was made, for reports ("buf0[1:3]", "same object as a")
};

struct Recipe {
  std::vector<BufferRecipe> buffers;
  std::vector<InputRecipe> inputs;
  std::vector<Step> steps;
  std::vector<int> returns;  // handle ids
  std::string scenario;      // the inputs' alias scenario in words
};

struct RandomProgram {
  uint64_t seed = 0;
  Recipe recipe;  // only the steps and returns that materialized
  Trace trace;    // the eager trace
  std::vector<RtValue> inputs;
  AliasPattern pattern;  // of `inputs`
};

// A program of 3-30 ops over 1-4 inputs (see random_program.cpp for the op kinds and alias
// scenarios). Deterministic in `seed`.
RandomProgram generate_program(uint64_t seed);

// The name of a program's input i in traces and reports: a, b, ..., z, a1, b1, ...
std::string letter_name(size_t i);

// Builds the trace and the inputs of a recipe, dropping the steps that cannot be built.
RandomProgram materialize(const Recipe& recipe, uint64_t seed = 0);

// The seed of program `index` of a run started with `seed`.
uint64_t program_seed(uint64_t seed, uint64_t index);

// ---- the differential check -------------------------------------------------------------------

// The system under test: runs a trace on the caller's inputs (which it may mutate).
using Runner = std::function<std::vector<RtValue>(const Trace&, const AliasPattern&,
                                                  const std::vector<RtValue>&)>;
Runner kiln_runner();         // execute(compile(trace, pattern), inputs)
Runner interpreter_runner();  // the oracle itself: checks the generator and the harness

struct CheckOptions {
  Runner runner;  // empty: kiln_runner()
  // Also require outputs to be the same objects / share memory among themselves exactly when
  // the interpreter's do (eager parity for fresh outputs; DESIGN.md only promises it for inputs).
  bool outputs_among_themselves = false;
  // Compare the strides of size-0 and size-1 dims (and the layout of empty tensors) too. They
  // address nothing, so by default only the strides of dims with two or more elements count.
  bool exact_strides = false;
  // Multiplies the floating tolerances (1e-5 relative for float32, ...). The CUDA runs use more:
  // their kernels compute float32 in float32, as PyTorch's do, while the oracle computes each op
  // in double, and an ill-conditioned program (fmod, then rsqrt of a near-zero result) can
  // magnify one op's last-bit difference.
  double tolerance_scale = 1;
  // Run each check in a child process, so that a crash (or a hang past `timeout_seconds`) of
  // the system under test is reported as a failure instead of ending the test process.
  bool isolate = false;
  unsigned timeout_seconds = 60;
};

enum class Outcome {
  kAgreed,       // neither raised; outputs, inputs and identities agree
  kBothRaised,   // eager raises a UserError, and so did kiln
  kUnsupported,  // kiln raised UnsupportedError (loud, never wrong: not a failure)
  kFailed,
};
struct CheckResult {
  Outcome outcome = Outcome::kAgreed;
  // kFailed: "<category>: <what differs>" (categories: raise, oracle-internal, kiln-internal,
  // kiln-crash, outputs, output-layout, output-values, output-identity, input-contents,
  // input-layout, input-storage); kBothRaised / kUnsupported: kiln's error message.
  std::string detail;
};
CheckResult check(const Trace& trace, const std::vector<RtValue>& inputs,
                  const CheckOptions& options = {});

// nullopt unless the check fails; else its "<category>: <what differs>".
std::optional<std::string> check_trace(const Trace& trace, const std::vector<RtValue>& inputs,
                                       const CheckOptions& options = {});
std::optional<std::string> check_program(const RandomProgram& program,
                                         const CheckOptions& options = {});
std::string failure_category(const std::string& failure);

// Copies of the inputs over new storages, keeping which inputs share a storage and which are the
// same object.
std::vector<RtValue> deep_copy(const std::vector<RtValue>& inputs);
// The alias pattern of a call: the executor's alias_pattern_of.
AliasPattern pattern_of_inputs(const std::vector<RtValue>& inputs);

// ---- shrinking and reports --------------------------------------------------------------------

struct Shrunk {
  RandomProgram program;
  std::string failure;
  int checks = 0;  // programs tried while shrinking
};
// Drops returns, steps and inputs while the program still fails in the same category.
Shrunk shrink(const RandomProgram& program, const std::string& failure,
              const CheckOptions& options = {});

// The printed trace, the alias pattern, the scenario and the input values (storages included).
std::string describe(const RandomProgram& program);

struct FuzzSummary {
  int programs = 0;
  int agreed = 0;       // neither raised, everything equal
  int both_raised = 0;  // eager raises, and so did kiln
  int unsupported = 0;  // kiln raised UnsupportedError
  int failed = 0;
  std::vector<std::string> reports;            // shrunk failures, up to max_reports
  std::map<std::string, int> op_counts;        // top-level ops of the generated traces
  std::map<std::string, int> scenario_counts;  // alias scenarios
  std::map<std::string, int> unsupported_ops;  // the ops kiln's UnsupportedErrors name
  double seconds = 0;
  std::string str() const;  // a short summary
};
// Generates and checks `count` programs from `seed`; shrinks and reports up to `max_reports`
// failures. `progress`, if given, sees the summary so far every 1000 programs.
FuzzSummary run_fuzz(uint64_t seed, int count, const CheckOptions& options = {},
                     int max_reports = 5,
                     const std::function<void(const FuzzSummary&)>& progress = {});

}  // namespace kiln::fuzz
