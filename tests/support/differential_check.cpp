// The differential check of a program (random_program.h): the interpreter and the system under
// test run the same trace on deep copies of the inputs, then outputs, the inputs' memory and
// layout, which outputs are which inputs, and errors are compared; a value disagreement is
// weighed against the program's conditioning (interpret_with_rounding_moved). Failing programs
// are shrunk and described for a report. The generator is random_program.cpp.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <set>
#include <sstream>

#include "kiln/ir/printer.h"
#include "kiln/kiln.h"
#include "kiln/passes/pipeline.h"
#include "kiln/runtime/cpu/cpu_kernels.h"
#include "kiln/runtime/executor.h"
#include "kiln/runtime/interpreter/interpreter.h"
#include "kiln/support/error.h"
#include "support/random_program.h"

namespace kiln::fuzz {

// ---- the differential check -------------------------------------------------------------------

std::vector<RtValue> deep_copy(const std::vector<RtValue>& inputs) {
  std::map<const Storage*, std::shared_ptr<Storage>> storages;
  std::map<const RtTensor*, TensorHandle> tensors;
  std::vector<RtValue> out;
  for (const RtValue& v : inputs) {
    const auto* t = std::get_if<TensorHandle>(&v);
    if (!t || !*t) {
      out.push_back(v);
      continue;
    }
    TensorHandle& copy = tensors[t->get()];
    if (!copy) {
      std::shared_ptr<Storage>& s = storages[(*t)->storage.get()];
      if (!s) s = std::make_shared<Storage>(*(*t)->storage);
      copy = std::make_shared<RtTensor>(**t);
      copy->storage = s;
    }
    out.emplace_back(copy);
  }
  return out;
}

AliasPattern pattern_of_inputs(const std::vector<RtValue>& inputs) {
  return alias_pattern_of(inputs);
}

Runner kiln_runner() {
  return [](const Trace& trace, const AliasPattern& pattern, const std::vector<RtValue>& inputs) {
    return execute(compile(trace, pattern), inputs);
  };
}

Runner interpreter_runner() {
  return [](const Trace& trace, const AliasPattern&, const std::vector<RtValue>& inputs) {
    return interpret(trace, inputs);
  };
}

std::string failure_category(const std::string& failure) {
  return failure.substr(0, failure.find(':'));
}

namespace {

// The condition check of a value disagreement (check_in_process): values moved by kPerturbedUlps
// units in the last place as they are defined, and an element's slack kConditionSlack times how
// far it moved.
constexpr double kPerturbedUlps = 8;
constexpr double kConditionSlack = 2;

struct Run {
  bool raised = false;
  std::string error;
  std::vector<RtValue> inputs;
  std::vector<std::shared_ptr<Storage>> storages;  // each input's storage before the run
  std::vector<RtValue> outputs;
};

Run prepare(const std::vector<RtValue>& inputs) {
  Run r;
  r.inputs = deep_copy(inputs);
  for (const RtValue& v : r.inputs) {
    const auto* t = std::get_if<TensorHandle>(&v);
    r.storages.push_back(t ? (*t)->storage : nullptr);
  }
  return r;
}

const RtTensor* tensor_of(const RtValue& v) {
  const auto* t = std::get_if<TensorHandle>(&v);
  return t ? t->get() : nullptr;
}

std::string number_str(double v) {
  std::ostringstream s;
  s.precision(9);
  s << v;
  return s.str();
}

// Whether two elements of dtype `dtype` agree: exact for integers and bools, within the dtype's
// tolerance for floats (NaN equals NaN, infinities must match).
bool elements_agree(const Storage& a, int64_t ia, const Storage& b, int64_t ib, DType dtype,
                    double scale, std::string* shown, double slack = 0) {
  if (!is_floating(dtype)) {
    int64_t x = a.load_int(ia), y = b.load_int(ib);
    if (x == y) return true;
    *shown = std::to_string(x) + " vs " + std::to_string(y);
    return false;
  }
  double x = a.load_double(ia), y = b.load_double(ib);
  bool ok;
  if (std::isnan(x) || std::isnan(y)) {
    ok = std::isnan(x) && std::isnan(y);
  } else if (std::isinf(x) || std::isinf(y)) {
    ok = x == y;
  } else {
    double tol = scale * (dtype == DType::kFloat64   ? 1e-7
                          : dtype == DType::kFloat32 ? 1e-5
                          : dtype == DType::kFloat16 ? 2e-3
                                                     : 2e-2);  // bf16
    ok = std::fabs(x - y) <= tol * (1.0 + std::max(std::fabs(x), std::fabs(y))) + slack;
  }
  if (!ok) *shown = number_str(x) + " vs " + number_str(y);
  return ok;
}

std::string ints_str(const std::vector<int64_t>& v) {
  return shape_str(v);
}

class Comparison {
 public:
  // `perturbed`: the interpreter's run with its rounding moved (interpret_with_rounding_moved);
  // an element may then differ by kConditionSlack times what it moved there, besides the
  // tolerance.
  Comparison(const Trace& trace, const Run& a, const Run& b, bool exact_strides,
             double tolerance_scale, const Run* perturbed = nullptr)
      : trace_(trace),
        a_(a),
        b_(b),
        exact_strides_(exact_strides),
        tolerance_scale_(tolerance_scale),
        perturbed_(perturbed) {}

  // Whether every problem found is a value out of tolerance (not a layout, identity or count).
  bool only_values_differ() const {
    return !problems_.empty() && std::all_of(problems_.begin(), problems_.end(), [](const auto& p) {
      return p.first == "output-values" || p.first == "input-contents";
    });
  }

  // Whether two tensors are laid out alike: the same sizes, and the same strides on the dims
  // that have two or more elements (on every dim with exact_strides), and the same offset when
  // `offset` is set; empty tensors address nothing.
  bool same_layout(const RtTensor& x, const RtTensor& y, bool offset) const {
    if (x.sizes != y.sizes) return false;
    if (exact_strides_) return x.strides == y.strides && (!offset || x.offset == y.offset);
    if (x.numel() == 0) return true;
    for (size_t d = 0; d < x.sizes.size(); ++d)
      if (x.sizes[d] > 1 && x.strides[d] != y.strides[d]) return false;
    return !offset || x.offset == y.offset;
  }

  std::optional<std::string> result() const {
    if (problems_.empty()) return std::nullopt;
    std::string out = problems_[0].first + ": ";
    for (size_t i = 0; i < problems_.size() && i < 6; ++i)
      out += (i ? "; " : "") + problems_[i].second;
    if (problems_.size() > 6) out += "; (" + std::to_string(problems_.size() - 6) + " more)";
    return out;
  }

  void add(const std::string& category, const std::string& what) {
    problems_.emplace_back(category, what);
  }

  std::string input_name(size_t j) const { return "input " + trace_.inputs()[j]->name(); }
  std::string output_name(size_t i) const {
    return "output " + std::to_string(i) + " (" + trace_.outputs()[i]->name() + ")";
  }

  void compare_inputs() {
    std::set<const Storage*> seen;
    for (size_t j = 0; j < a_.inputs.size(); ++j) {
      const RtTensor* x = tensor_of(a_.inputs[j]);
      const RtTensor* y = tensor_of(b_.inputs[j]);
      if (!x) continue;
      if (y->storage != b_.storages[j]) {
        add("input-storage", input_name(j) +
                                 "'s storage was replaced; kiln must write into the "
                                 "caller's memory");
        continue;
      }
      if (!same_layout(*x, *y, /*offset=*/true)) {
        add("input-layout", input_name(j) + " is sizes=" + ints_str(x->sizes) + " strides=" +
                                ints_str(x->strides) + " offset=" + std::to_string(x->offset) +
                                " after the interpreter but sizes=" + ints_str(y->sizes) +
                                " strides=" + ints_str(y->strides) +
                                " offset=" + std::to_string(y->offset) + " after kiln");
      }
      if (!seen.insert(x->storage.get()).second) continue;
      const Storage& s = *x->storage;
      const Storage& t = *y->storage;
      const RtTensor* p = perturbed_ ? tensor_of(perturbed_->inputs[j]) : nullptr;
      if (p && p->storage->numel() != s.numel()) p = nullptr;  // no slack
      for (int64_t e = 0; e < s.numel(); ++e) {
        std::string shown;
        const double slack = p ? moved(s, e, *p->storage, e) : 0.0;
        if (!elements_agree(s, e, t, e, s.dtype, tolerance_scale_, &shown, slack)) {
          add("input-contents", "the memory of " + input_name(j) + " differs at storage element " +
                                    std::to_string(e) + ": interpreter vs kiln " + shown);
          break;
        }
      }
    }
  }

  void compare_outputs(bool among_themselves) {
    if (a_.outputs.size() != b_.outputs.size()) {
      add("outputs", "the interpreter returned " + std::to_string(a_.outputs.size()) +
                         " values, kiln " + std::to_string(b_.outputs.size()));
      return;
    }
    for (size_t i = 0; i < a_.outputs.size(); ++i) {
      const RtTensor* x = tensor_of(a_.outputs[i]);
      const RtTensor* y = tensor_of(b_.outputs[i]);
      if (!x || !y) {
        if (x || y) add("outputs", output_name(i) + " is a tensor in one run and not the other");
        continue;
      }
      if (x->dtype() != y->dtype() || !same_layout(*x, *y, /*offset=*/false)) {
        add("output-layout", output_name(i) + " is " + std::string(dtype_name(x->dtype())) +
                                 ints_str(x->sizes) + " strides=" + ints_str(x->strides) +
                                 " in the interpreter but " + std::string(dtype_name(y->dtype())) +
                                 ints_str(y->sizes) + " strides=" + ints_str(y->strides) +
                                 " in kiln");
      }
      if (x->dtype() == y->dtype() && x->sizes == y->sizes) {
        std::vector<int64_t> ix = x->element_indices(), iy = y->element_indices();
        const RtTensor* p = perturbed_ ? tensor_of(perturbed_->outputs.at(i)) : nullptr;
        if (p && (p->dtype() != x->dtype() || p->sizes != x->sizes)) p = nullptr;  // no slack
        std::vector<int64_t> ip = p ? p->element_indices() : std::vector<int64_t>{};
        for (size_t e = 0; e < ix.size(); ++e) {
          std::string shown;
          const double slack = p ? moved(*x->storage, ix[e], *p->storage, ip[e]) : 0.0;
          if (!elements_agree(*x->storage, ix[e], *y->storage, iy[e], x->dtype(), tolerance_scale_,
                              &shown, slack)) {
            add("output-values", output_name(i) + " differs at element " + std::to_string(e) +
                                     " (row-major): interpreter vs kiln " + shown);
            break;
          }
        }
      }
      for (size_t j = 0; j < a_.inputs.size(); ++j) {
        const RtTensor* in_a = tensor_of(a_.inputs[j]);
        const RtTensor* in_b = tensor_of(b_.inputs[j]);
        if (!in_a) continue;
        bool same_a = x == in_a, same_b = y == in_b;
        if (same_a != same_b) {
          add("output-identity", output_name(i) + (same_a ? " is " : " is not ") + input_name(j) +
                                     "'s object in the interpreter but" +
                                     (same_b ? " is" : " is not") + " in kiln");
        }
        bool share_a = x->storage == a_.storages[j], share_b = y->storage == b_.storages[j];
        if (share_a != share_b) {
          add("output-identity", output_name(i) + (share_a ? " shares " : " does not share ") +
                                     "memory with " + input_name(j) + " in the interpreter but" +
                                     (share_b ? " does" : " does not") + " in kiln");
        } else if (share_a && x->offset != y->offset && x->numel() > 0) {
          add("output-layout", output_name(i) + ", a view of " + input_name(j) +
                                   "'s memory, has offset " + std::to_string(x->offset) +
                                   " in the interpreter but " + std::to_string(y->offset) +
                                   " in kiln");
        }
      }
      if (!among_themselves) continue;
      for (size_t k = 0; k < i; ++k) {
        const RtTensor* xk = tensor_of(a_.outputs[k]);
        const RtTensor* yk = tensor_of(b_.outputs[k]);
        if (!xk || !yk) continue;
        if ((x == xk) != (y == yk)) {
          add("output-identity", output_name(i) + " and " + output_name(k) +
                                     ((x == xk) ? " are" : " are not") +
                                     " one object in the interpreter but" +
                                     ((y == yk) ? " are" : " are not") + " in kiln");
        }
        if ((x->storage == xk->storage) != (y->storage == yk->storage)) {
          add("output-identity", output_name(i) + " and " + output_name(k) +
                                     ((x->storage == xk->storage) ? " share" : " do not share") +
                                     " memory in the interpreter but" +
                                     ((y->storage == yk->storage) ? " do" : " do not") +
                                     " in kiln");
        }
      }
    }
  }

 private:
  // kConditionSlack times how far an element of the reference moved in the perturbed run (0
  // where it is not a finite float in both).
  static double moved(const Storage& reference, int64_t at, const Storage& perturbed,
                      int64_t perturbed_at) {
    if (!is_floating(reference.dtype) || perturbed.dtype != reference.dtype) return 0;
    const double x = reference.load_double(at), y = perturbed.load_double(perturbed_at);
    if (!std::isfinite(x) || !std::isfinite(y)) return 0;
    return kConditionSlack * std::fabs(x - y);
  }

  const Trace& trace_;
  const Run& a_;
  const Run& b_;
  bool exact_strides_;
  double tolerance_scale_;
  const Run* perturbed_;
  std::vector<std::pair<std::string, std::string>> problems_;
};

// The interpreter's run with rounding moved: each floating input, and each floating result of
// an elementwise op or a reduction, moved by kPerturbedUlps units in the last place of its dtype
// as it is defined, up or down by a fixed pseudo-random sign per element (rounding errors add up
// as a random walk, which a uniform scaling would not show in a sum that cancels). How far an
// output moves then is how far rounding at each step can move it: kiln's kernels round as the
// interpreter does, elementwise, but sum in another order and precision (kernel.h).
std::vector<RtValue> interpret_with_rounding_moved(const Trace& trace,
                                                   const std::vector<RtValue>& inputs) {
  auto move = [](const Value* v, const RtValue& value) {
    const auto* t = std::get_if<TensorHandle>(&value);
    if (!t || !is_floating((*t)->dtype())) return;
    const Node* producer = v->producer();
    if (producer && producer->op->kind != OpKind::kElementwise &&
        producer->op->kind != OpKind::kReduction)
      return;
    Storage& s = *(*t)->storage;
    if (s.on_device()) return;
    const int mantissa = s.dtype == DType::kFloat64   ? 52
                         : s.dtype == DType::kFloat32 ? 23
                         : s.dtype == DType::kFloat16 ? 10
                                                      : 7;
    const double step = std::ldexp(kPerturbedUlps, -mantissa);
    const std::vector<int64_t> at = (*t)->element_indices();
    for (size_t e = 0; e < at.size(); ++e) {
      const uint64_t h =
          (static_cast<uint64_t>(v->id()) * 0x100000001B3ULL + e + 1) * 0x9E3779B97F4A7C15ULL;
      const double sign = (h >> 63) ? 1.0 : -1.0;
      s.store_double(at[e], s.load_double(at[e]) * (1.0 + sign * step));
    }
  };
  return interpret_observed(trace, inputs, move);
}

CheckResult failed(std::string detail) {
  return CheckResult{Outcome::kFailed, std::move(detail)};
}

CheckResult check_in_process(const Trace& trace, const std::vector<RtValue>& inputs,
                             const CheckOptions& options) {
  Run a = prepare(inputs);
  try {
    a.outputs = interpret(trace, a.inputs);
  } catch (const UserError& e) {
    a.raised = true;
    a.error = e.what();
  } catch (const std::exception& e) {
    return failed(std::string("oracle-internal: the interpreter failed: ") + e.what());
  }

  Run b = prepare(inputs);
  bool unsupported = false;
  try {
    AliasPattern pattern = pattern_of_inputs(b.inputs);
    Runner runner = options.runner ? options.runner : kiln_runner();
    b.outputs = runner(trace, pattern, b.inputs);
  } catch (const UnsupportedError& e) {
    b.raised = unsupported = true;
    b.error = e.what();
  } catch (const UserError& e) {
    b.raised = true;
    b.error = e.what();
  } catch (const InternalError& e) {
    return failed(std::string("kiln-internal: ") + e.what());
  } catch (const std::exception& e) {
    return failed(std::string("kiln-crash: ") + e.what());
  }

  // Unsupported is loud, never wrong (DESIGN.md 1): not a disagreement.
  if (unsupported && !a.raised) return CheckResult{Outcome::kUnsupported, b.error};
  if (a.raised != b.raised) {
    return failed(std::string("raise: the interpreter ") +
                  (a.raised ? "raised \"" + a.error + "\"" : "did not raise") + " but kiln " +
                  (b.raised ? "raised \"" + b.error + "\"" : "did not"));
  }
  // Side effects before an error are not compared.
  if (a.raised) return CheckResult{Outcome::kBothRaised, b.error};
  // Outputs, then the inputs' memory; with `moved`, each element's slack from it.
  auto compare = [&](const Run* moved) {
    Comparison c(trace, a, b, options.exact_strides, options.tolerance_scale, moved);
    c.compare_outputs(options.outputs_among_themselves);
    c.compare_inputs();
    return c;
  };
  const Comparison plain = compare(nullptr);
  if (!plain.only_values_differ()) {
    if (auto f = plain.result()) return failed(*f);
    return CheckResult{};
  }
  // Values out of tolerance may be rounding that the program amplifies: a float32 sum of 180
  // elements, rounded differently by a kernel's float chunks and the interpreter's double sum
  // (3 ulp, as eager's own sums differ), then sinh of it (about 43) gave 1.1e-5 where the
  // tolerance is 1e-5 (fresh seed 5099400936352163564). The interpreter runs again with its
  // rounding moved, and each element may then also differ by what its value moved.
  Run moved = prepare(inputs);
  try {
    moved.outputs = interpret_with_rounding_moved(trace, moved.inputs);
  } catch (const std::exception&) {
    return failed(*plain.result());
  }
  if (moved.outputs.size() != a.outputs.size()) return failed(*plain.result());
  if (auto f = compare(&moved).result()) return failed(*f);
  return CheckResult{};
}

// Runs the check in a child process and reads its result from a pipe: a crash or a hang of the
// system under test becomes a failure of this program only.
CheckResult check_isolated(const Trace& trace, const std::vector<RtValue>& inputs,
                           const CheckOptions& options) {
  int fds[2];
  if (pipe(fds) != 0) return check_in_process(trace, inputs, options);
  std::cout.flush();
  std::cerr.flush();
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return check_in_process(trace, inputs, options);
  }
  if (pid == 0) {
    close(fds[0]);
    alarm(options.timeout_seconds);
    CheckResult r = check_in_process(trace, inputs, options);
    std::string message(1, static_cast<char>('0' + static_cast<int>(r.outcome)));
    message += r.detail;
    const char* data = message.data();
    size_t left = message.size();
    while (left > 0) {
      ssize_t n = write(fds[1], data, left);
      if (n <= 0) break;
      data += n;
      left -= static_cast<size_t>(n);
    }
    close(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  std::string message;
  char buffer[4096];
  while (true) {
    ssize_t n = read(fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    message.append(buffer, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    if (sig == SIGALRM) {
      return failed("kiln-crash: the check did not finish within " +
                    std::to_string(options.timeout_seconds) + " s");
    }
    return failed("kiln-crash: the check was killed by signal " + std::to_string(sig) + " (" +
                  strsignal(sig) + ")");
  }
  if (message.empty()) {
    return failed("kiln-crash: the check exited with status " +
                  std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                  " without a result");
  }
  return CheckResult{static_cast<Outcome>(message[0] - '0'), message.substr(1)};
}

}  // namespace

CheckResult check(const Trace& trace, const std::vector<RtValue>& inputs,
                  const CheckOptions& options) {
  return options.isolate ? check_isolated(trace, inputs, options)
                         : check_in_process(trace, inputs, options);
}

std::optional<std::string> check_trace(const Trace& trace, const std::vector<RtValue>& inputs,
                                       const CheckOptions& options) {
  CheckResult r = check(trace, inputs, options);
  if (r.outcome != Outcome::kFailed) return std::nullopt;
  return r.detail;
}

std::optional<std::string> check_program(const RandomProgram& program,
                                         const CheckOptions& options) {
  return check_trace(program.trace, program.inputs, options);
}

// ---- shrinking --------------------------------------------------------------------------------

Shrunk shrink(const RandomProgram& program, const std::string& failure,
              const CheckOptions& options) {
  Shrunk best{materialize(program.recipe, program.seed), failure, 0};
  const std::string category = failure_category(failure);
  auto attempt = [&](const Recipe& candidate) {
    ++best.checks;
    RandomProgram q = materialize(candidate, program.seed);
    std::optional<std::string> f = check_program(q, options);
    if (!f || failure_category(*f) != category) return false;
    best.program = std::move(q);
    best.failure = *f;
    return true;
  };
  constexpr int kMaxChecks = 4000;
  bool progress = true;
  while (progress && best.checks < kMaxChecks) {
    progress = false;
    // Whole tails first, then single steps from the last to the first.
    for (size_t cut = best.program.recipe.steps.size() / 2; cut >= 1 && best.checks < kMaxChecks;
         cut /= 2) {
      Recipe c = best.program.recipe;
      c.steps.resize(c.steps.size() - cut);
      if (attempt(c)) progress = true;
    }
    for (size_t k = best.program.recipe.steps.size(); k-- > 0 && best.checks < kMaxChecks;) {
      if (k >= best.program.recipe.steps.size()) continue;
      Recipe c = best.program.recipe;
      c.steps.erase(c.steps.begin() + static_cast<ptrdiff_t>(k));
      if (attempt(c)) progress = true;
    }
    for (size_t k = best.program.recipe.returns.size(); k-- > 0 && best.checks < kMaxChecks;) {
      if (k >= best.program.recipe.returns.size()) continue;
      Recipe c = best.program.recipe;
      c.returns.erase(c.returns.begin() + static_cast<ptrdiff_t>(k));
      if (attempt(c)) progress = true;
    }
    for (size_t k = best.program.recipe.inputs.size(); k-- > 0 && best.checks < kMaxChecks;) {
      if (k >= best.program.recipe.inputs.size() || best.program.recipe.inputs.size() == 1)
        continue;
      Recipe c = best.program.recipe;
      int gone = c.inputs[k].handle;
      c.inputs.erase(c.inputs.begin() + static_cast<ptrdiff_t>(k));
      for (InputRecipe& in : c.inputs)
        if (in.same_object_as == gone) in.same_object_as = -1;
      if (attempt(c)) progress = true;
    }
  }
  return best;
}

// ---- reports ----------------------------------------------------------------------------------

std::string describe(const RandomProgram& program) {
  std::ostringstream out;
  const Recipe& r = program.recipe;
  out << "program seed " << program.seed << "; inputs: " << r.scenario << "\n";
  out << print_trace(program.trace);
  out << "alias pattern: " << program.pattern.str(program.trace) << "\n";
  out << "inputs:\n";
  std::set<int> buffers;
  for (size_t k = 0; k < r.inputs.size(); ++k) {
    const InputRecipe& in = r.inputs[k];
    out << "  " << letter_name(k) << " = ";
    if (in.is_number) {
      out << float_str(in.number) << "\n";
      continue;
    }
    buffers.insert(in.buffer);
    out << in.how;
    if (in.same_object_as >= 0) {
      for (size_t j = 0; j < k; ++j)
        if (r.inputs[j].handle == in.same_object_as)
          out << " (the same object as " << letter_name(j) << ")";
    }
    out << ": sizes=" << shape_str(in.geometry.sizes)
        << " strides=" << shape_str(in.geometry.strides) << " offset=" << in.geometry.offset;
    if (k < program.inputs.size()) out << "\n      " << value_str(program.inputs[k]);
    out << "\n";
  }
  for (int b : buffers) {
    const BufferRecipe& buf = r.buffers.at(static_cast<size_t>(b));
    out << "  buf" << b << ": " << dtype_name(buf.dtype) << "[" << buf.values.size() << "] = [";
    for (size_t i = 0; i < buf.values.size(); ++i)
      out << (i ? ", " : "")
          << (is_floating(buf.dtype) ? float_str(buf.values[i])
                                     : std::to_string(static_cast<int64_t>(buf.values[i])));
    out << "]\n";
  }
  return out.str();
}

std::string FuzzSummary::str() const {
  std::ostringstream out;
  out << programs << " programs in " << number_str(seconds) << " s";
  if (programs) out << " (" << number_str(1000 * seconds / programs) << " ms each)";
  out << ": " << agreed << " agreed, " << both_raised << " raised in both, " << unsupported
      << " unsupported by kiln, " << failed << " failed; " << op_counts.size()
      << " op kinds\n  scenarios:";
  for (const auto& [tag, n] : scenario_counts)
    out << " " << tag << "=" << n;
  if (!unsupported_ops.empty()) {
    out << "\n  unsupported:";
    for (const auto& [op, n] : unsupported_ops)
      out << " " << op << "=" << n;
  }
  out << "\n  ops:";
  for (const auto& [op, n] : op_counts)
    out << " " << op << "=" << n;
  out << "\n";
  return out.str();
}

FuzzSummary run_fuzz(uint64_t seed, int count, const CheckOptions& options, int max_reports,
                     const std::function<void(const FuzzSummary&)>& progress) {
  FuzzSummary s;
  auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // With compiled CPU kernels, one compiler run per program would dominate the run (and a child
  // process per check cannot share what it compiles in memory): the kernels of the next chunk of
  // programs are compiled together first, in this process, and the children inherit them.
  const bool warm = !options.runner && cpu::cpu_kernels_enabled();
  constexpr int kWarmChunk = 400;
  for (int i = 0; i < count; ++i) {
    if (progress && i > 0 && i % 1000 == 0) {
      s.seconds = elapsed();
      progress(s);
    }
    if (warm && i % kWarmChunk == 0) {
      std::vector<CompiledProgram> compiled;
      for (int j = i; j < std::min(count, i + kWarmChunk); ++j) {
        RandomProgram p = generate_program(program_seed(seed, static_cast<uint64_t>(j)));
        try {
          compiled.push_back(compile(p.trace, pattern_of_inputs(p.inputs)));
        } catch (const std::exception&) {
          // The check reports it.
        }
      }
      std::vector<const ExecutionPlan*> plans;
      for (const CompiledProgram& c : compiled)
        plans.push_back(&c.plan);
      try {
        cpu::warm_cpu_kernels(plans);
      } catch (const std::exception&) {
        // A kernel that does not compile fails its program's check, with the message.
      }
    }
    uint64_t ps = program_seed(seed, static_cast<uint64_t>(i));
    RandomProgram p = generate_program(ps);
    ++s.programs;
    for (const auto& node : p.trace.nodes())
      ++s.op_counts[node->op->name];
    std::string tags = p.recipe.scenario;
    for (size_t pos = 0; pos < tags.size();) {
      size_t end = tags.find(", ", pos);
      if (end == std::string::npos) end = tags.size();
      ++s.scenario_counts[tags.substr(pos, end - pos)];
      pos = end + 2;
    }
    CheckResult r = check(p.trace, p.inputs, options);
    if (r.outcome == Outcome::kAgreed) ++s.agreed;
    if (r.outcome == Outcome::kBothRaised) ++s.both_raised;
    if (r.outcome == Outcome::kUnsupported) {
      ++s.unsupported;
      // "kiln: <op> at <file:line>: not supported by kiln: ..."
      std::string op = r.detail.substr(0, r.detail.find(" at "));
      if (op.rfind("kiln: ", 0) == 0) op = op.substr(6);
      ++s.unsupported_ops[op];
    }
    if (r.outcome != Outcome::kFailed) continue;
    const std::string* f = &r.detail;
    ++s.failed;
    if (static_cast<int>(s.reports.size()) >= max_reports) continue;
    Shrunk small = shrink(p, *f, options);
    s.reports.push_back("program " + std::to_string(i) + " (seed " + std::to_string(ps) +
                        ") failed: " + *f + "\nshrunk (" + std::to_string(small.checks) +
                        " checks) to: " + small.failure + "\n" + describe(small.program));
  }
  s.seconds = elapsed();
  return s;
}

}  // namespace kiln::fuzz
