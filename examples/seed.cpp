// The demo: trace the seed programs of ../shared/CASES.md with the C++ API, print their eager
// traces, run them in the reference interpreter, compile them (functionalize, fuse, place the
// writebacks: one region each), run the compiled program, and check both against values
// computed here directly with <cmath>.
#include <cmath>
#include <iostream>

#include "kiln/kiln.h"
#include "kiln/passes/pipeline.h"
#include "kiln/runtime/executor.h"

namespace {

bool close(double a, double b) {
  return std::fabs(a - b) <= 1e-5 + 1e-5 * std::fabs(b);
}

// Runs `trace` on a 5x5 input, checks the output and the input after the call.
bool run_seed(const char* title, const kiln::Trace& trace, double (*output)(double),
              double (*input_after)(double)) {
  std::cout << "=== " << title << " ===\n" << kiln::print_trace(trace);
  kiln::TensorHandle a = kiln::make_random_input(trace.inputs()[0]->tensor_type(), 7);
  std::vector<double> before = kiln::to_vector(*a);
  std::vector<kiln::RtValue> outs = kiln::interpret(trace, {a});
  std::vector<double> out = kiln::to_vector(*std::get<kiln::TensorHandle>(outs[0]));
  std::vector<double> after = kiln::to_vector(*a);
  bool ok = true;
  for (size_t i = 0; i < before.size(); ++i) {
    ok = ok && close(out[i], output(before[i])) && close(after[i], input_after(before[i]));
  }
  std::cout << "input before: " << kiln::tensor_str(*kiln::make_input(a->type(), before)) << "\n"
            << "input after:  " << kiln::tensor_str(*a) << "\n"
            << "output:       " << kiln::value_str(outs[0]) << "\n"
            << (ok ? "interpreter: matches eager semantics (output and the mutated input)\n\n"
                   : "interpreter: MISMATCH against the expected values\n\n");

  // The same program compiled: mutation removed, one fused region that stores into `a` itself.
  kiln::TensorHandle b = kiln::make_input(a->type(), before);
  kiln::CompiledProgram program = kiln::compile(trace, kiln::alias_pattern_of({b}));
  std::cout << program.history.back().printed;
  std::vector<kiln::RtValue> compiled_outs = kiln::execute(program, {b});
  std::vector<double> c_out = kiln::to_vector(*std::get<kiln::TensorHandle>(compiled_outs[0]));
  std::vector<double> c_after = kiln::to_vector(*b);
  bool compiled_ok = program.stats.fusion_regions == 1;
  for (size_t i = 0; i < before.size(); ++i) {
    compiled_ok = compiled_ok && close(c_out[i], output(before[i])) &&
                  close(c_after[i], input_after(before[i]));
  }
  std::cout << "regions: " << program.stats.fusion_regions
            << ", writebacks in a kernel: " << program.stats.writebacks_in_kernel
            << ", through a temporary: " << program.stats.writebacks_with_temporary << "\n"
            << (compiled_ok ? "compiled: one region, matches eager semantics\n\n"
                            : "compiled: MISMATCH\n\n");
  return ok && compiled_ok;
}

}  // namespace

int main() {
  try {
    // S1: a.tanh_(); return a * a * a * a
    kiln::Trace s1 = kiln::trace(
        [](kiln::Tensor a) {
          a.tanh_();
          return a * a * a * a;
        },
        {kiln::TensorSpec(kiln::f32, {5, 5})});
    kiln::verify_trace(s1);
    // S2: x.exp_(); x.sin_(); return x.cos()
    kiln::Trace s2 = kiln::trace(
        [](kiln::Tensor x) {
          x.exp_();
          x.sin_();
          return x.cos();
        },
        {kiln::TensorSpec(kiln::f32, {5, 5}).named("x")});
    kiln::verify_trace(s2);
    bool ok = run_seed(
        "S1: a.tanh_(); return a * a * a * a", s1,
        [](double x) { return std::pow(std::tanh(x), 4); }, [](double x) { return std::tanh(x); });
    ok = run_seed(
             "S2: x.exp_(); x.sin_(); return x.cos()", s2,
             [](double x) { return std::cos(std::sin(std::exp(x))); },
             [](double x) { return std::sin(std::exp(x)); }) &&
         ok;
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
