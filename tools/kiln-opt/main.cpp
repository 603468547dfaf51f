// kiln-opt: text trace in, passes, text trace out (as mlir-opt does for MLIR).
//
//   kiln-opt seed.trace                       parse, verify and print
//   kiln-opt seed.trace --passes=verify,print run the named passes in order
//   kiln-opt seed.trace --run [--seed=N] [--input=a=1,2,3,4]
//                                             run in the reference interpreter and print the
//                                             outputs and the inputs after the call
//   kiln-opt seed.trace --pipeline            run the whole pipeline, print the final trace
//   kiln-opt seed.trace --passes=functionalize,cse
//                                             run the pipeline up to the last pass named
//   kiln-opt seed.trace --pipeline --history  print the trace after every pass
//   kiln-opt seed.trace --pipeline --run      execute the compiled program (regions in the
//                                             reference interpreter) and print the results
//   --alias="a: base0[4] strides=(1,) offset=0; b: ...; base0: f32[8]"
//                                             compile for inputs that share memory this way
//   kiln-opt seed.trace --pipeline --kernels  print the source of every fusion region's kernel,
//                                             then of every multi-tensor group's, for the
//                                             device the trace's types name (declare the
//                                             inputs "cuda:0 f32[...]" for CUDA source)
//   kiln-opt seed.trace --grad=x,w            differentiate with respect to inputs x and w: print
//                                             the forward trace with its saved values and the
//                                             backward trace (or why kiln refuses)
//   kiln-opt - ...                            read the trace from standard input
//
// Exit status: 0 on success, 1 on a user error (malformed trace, bad input, an error eager
// PyTorch would raise), 2 on an internal error.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "kiln/codegen/kernel.h"
#include "kiln/kiln.h"
#include "kiln/passes/pipeline.h"
#include "kiln/runtime/executor.h"

namespace {

struct Options {
  std::string file;
  std::vector<std::string> passes;
  bool pipeline = false;
  bool history = false;
  bool kernels = false;
  std::string alias;
  std::vector<std::string> grad;
  bool run = false;
  uint64_t seed = 0;
  std::map<std::string, std::vector<double>> inputs;
};

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "kiln-opt: error: " << msg << "\n"
            << "usage: kiln-opt <file.trace | -> [--passes=verify,print] [--run] [--seed=N] "
               "[--input=name=v1,v2,...]\n";
  std::exit(1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.starts_with("--passes=")) {
      o.passes = split(a.substr(9), ',');
    } else if (a == "--run") {
      o.run = true;
    } else if (a == "--pipeline") {
      o.pipeline = true;
    } else if (a == "--history") {
      o.history = true;
    } else if (a == "--kernels") {
      o.kernels = true;
    } else if (a.starts_with("--grad=")) {
      o.grad = split(a.substr(7), ',');
    } else if (a.starts_with("--alias=")) {
      o.alias = a.substr(8);
    } else if (a.starts_with("--seed=")) {
      try {
        o.seed = std::stoull(a.substr(7));
      } catch (...) {
        usage_error("--seed needs a non-negative integer, got '" + a.substr(7) + "'");
      }
    } else if (a.starts_with("--input=")) {
      std::string spec = a.substr(8);
      size_t eq = spec.find('=');
      if (eq == std::string::npos) usage_error("--input needs name=v1,v2,..., got '" + spec + "'");
      std::vector<double> values;
      for (const std::string& v : split(spec.substr(eq + 1), ',')) {
        try {
          values.push_back(std::stod(v));
        } catch (...) {
          usage_error("'" + v + "' in --input is not a number");
        }
      }
      o.inputs[spec.substr(0, eq)] = values;
    } else if (a == "--help" || a == "-h") {
      usage_error("help requested");
    } else if (a.starts_with("--")) {
      usage_error("unknown option '" + a + "'");
    } else if (o.file.empty()) {
      o.file = a;
    } else {
      usage_error("more than one input file ('" + o.file + "' and '" + a + "')");
    }
  }
  if (o.file.empty()) usage_error("no input file");
  if (o.kernels && !o.pipeline) usage_error("--kernels needs --pipeline");
  if (o.passes.empty() && !o.run && !o.pipeline && o.grad.empty()) o.passes = {"verify", "print"};
  return o;
}

std::string read_input(const std::string& file) {
  std::stringstream ss;
  if (file == "-") {
    ss << std::cin.rdbuf();
  } else {
    std::ifstream in(file);
    if (!in) throw kiln::UserError("kiln-opt: error: cannot open '" + file + "'");
    ss << in.rdbuf();
  }
  return ss.str();
}

// Inputs for `trace`: numbers from --input, tensors from --input or seeded random values, laid
// out in memory as the alias pattern says (inputs of one group are views of one storage).
std::vector<kiln::RtValue> make_inputs(const kiln::Trace& trace, const kiln::AliasPattern& pattern,
                                       const Options& o) {
  for (const auto& [name, values] : o.inputs) {
    bool known = false;
    for (kiln::Value* in : trace.inputs())
      known = known || in->name() == name;
    KILN_CHECK(known) << "--input names '" << name << "', which is not an input of the trace.";
  }
  // A group's storage starts early enough that each member sits at the offset its type's
  // layout names (the offsets in the pattern are relative to the group's first element).
  std::vector<int64_t> pad(pattern.groups.size(), 0);
  for (size_t j = 0; j < trace.inputs().size(); ++j) {
    const kiln::AliasPattern::Input& entry = pattern.inputs[j];
    if (entry.group < 0 || !trace.inputs()[j]->tensor_type().layout) continue;
    int64_t want = trace.inputs()[j]->tensor_type().layout->offset - entry.geometry.offset;
    pad[static_cast<size_t>(entry.group)] = std::max(pad[static_cast<size_t>(entry.group)], want);
  }
  std::vector<kiln::TensorHandle> bases(pattern.groups.size());
  for (size_t g = 0; g < pattern.groups.size(); ++g) {
    const kiln::AliasPattern::Group& group = pattern.groups[g];
    kiln::TensorType flat{group.dtype, {group.numel + pad[g]}, kiln::Device::cpu(), std::nullopt};
    bases[g] = kiln::make_random_input(flat, o.seed + g);
  }
  std::vector<kiln::RtValue> inputs;
  for (size_t j = 0; j < trace.inputs().size(); ++j) {
    kiln::Value* in = trace.inputs()[j];
    auto given = o.inputs.find(in->name());
    if (!in->is_tensor()) {
      KILN_CHECK(given != o.inputs.end() && given->second.size() == 1)
          << "the scalar input '" << in->name() << "' needs a value; pass --input=" << in->name()
          << "=<number>.";
      double v = given->second[0];
      switch (in->scalar_type().kind) {
        case kiln::ScalarKind::kBool:
          inputs.emplace_back(kiln::RtScalar(v != 0));
          break;
        case kiln::ScalarKind::kInt:
          inputs.emplace_back(kiln::RtScalar(static_cast<int64_t>(v)));
          break;
        case kiln::ScalarKind::kFloat:
          inputs.emplace_back(kiln::RtScalar(v));
          break;
      }
      continue;
    }
    const kiln::AliasPattern::Input& entry = pattern.inputs[j];
    const kiln::TensorType& type = in->tensor_type();
    kiln::TensorHandle t;
    if (entry.duplicate_of >= 0) {
      t = std::get<kiln::TensorHandle>(inputs[static_cast<size_t>(entry.duplicate_of)]);
    } else if (!pattern.groups[static_cast<size_t>(entry.group)].synthetic) {
      // Its own storage, laid out as the trace's type says (strides and offset included).
      t = given != o.inputs.end() ? kiln::make_input(type, given->second)
                                  : kiln::make_random_input(type, o.seed + 100 + j);
    } else {
      const kiln::Geometry& g = entry.geometry;
      t = kiln::make_view(bases[static_cast<size_t>(entry.group)], g.sizes, g.strides,
                          g.offset + pad[static_cast<size_t>(entry.group)]);
      if (given != o.inputs.end()) {
        kiln::TensorHandle values = kiln::make_tensor(type.dtype, type.shape, given->second);
        kiln::copy_into(*t, *values);
      }
    }
    inputs.emplace_back(t);
  }
  return inputs;
}

void print_values(const char* title, const kiln::Trace& trace,
                  const std::vector<kiln::RtValue>& inputs) {
  std::cout << title << "\n";
  for (size_t i = 0; i < inputs.size(); ++i)
    std::cout << trace.inputs()[i]->name() << " = " << kiln::value_str(inputs[i]) << "\n";
}

void run_program(const kiln::Trace& trace, const kiln::CompiledProgram* compiled,
                 const kiln::AliasPattern& pattern, const Options& o) {
  std::vector<kiln::RtValue> inputs = make_inputs(trace, pattern, o);
  print_values("# inputs before the call", trace, inputs);
  std::vector<kiln::RtValue> outputs =
      compiled ? kiln::execute(*compiled, inputs) : kiln::interpret(trace, inputs);
  std::cout << "# outputs\n";
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::cout << "output " << i << " = " << kiln::value_str(outputs[i]);
    // Say which outputs are the caller's own input objects, or views of their memory.
    if (auto* h = std::get_if<kiln::TensorHandle>(&outputs[i])) {
      for (size_t j = 0; j < inputs.size(); ++j) {
        auto* in = std::get_if<kiln::TensorHandle>(&inputs[j]);
        if (!in) continue;
        if (*in == *h)
          std::cout << "  # is input " << trace.inputs()[j]->name();
        else if ((*in)->storage == (*h)->storage)
          std::cout << "  # shares memory with input " << trace.inputs()[j]->name();
      }
    }
    std::cout << "\n";
  }
  print_values("# inputs after the call", trace, inputs);
}

// Each fusion region's kernel source for its device, or why it has none (it is then interpreted).
void print_kernels(const kiln::CompiledProgram& compiled) {
  for (size_t s = 0; s < compiled.plan.steps.size(); ++s) {
    const kiln::Step& step = compiled.plan.steps[s];
    if (step.kind != kiln::Step::Kind::kFusion) continue;
    kiln::Device device = kiln::Device::cpu();
    for (kiln::Value* v : step.outputs)
      if (v->is_tensor()) device = v->tensor_type().device;
    kiln::codegen::KernelLowering lowered = kiln::codegen::lower_kernel(
        step, device.kind == kiln::Device::Kind::kCuda ? kiln::codegen::Target::kCuda
                                                       : kiln::codegen::Target::kCpu);
    std::cout << "// ==== " << step.name << " (" << device.str() << ")\n";
    if (lowered.kernel)
      std::cout << lowered.kernel->source;
    else
      std::cout << "// no kernel: " << lowered.why_not << "\n";
  }
  for (const kiln::MultiTensorGroup& group : compiled.plan.multi_tensor_groups) {
    const kiln::Step& first = compiled.plan.steps[group.first];
    const kiln::Device device = first.outputs.at(0)->tensor_type().device;
    kiln::codegen::MultiTensorLowering lowered = kiln::codegen::lower_multi_tensor(
        first, device.kind == kiln::Device::Kind::kCuda ? kiln::codegen::Target::kCuda
                                                        : kiln::codegen::Target::kCpu);
    std::cout << "// ==== multi-tensor group of " << group.count << " steps from " << first.name
              << " (" << device.str() << ")\n";
    if (lowered.kernel)
      std::cout << lowered.kernel->source;
    else
      std::cout << "// no kernel: " << lowered.why_not << "\n";
  }
}

// --grad: the forward after differentiate and the backward, or why kiln refuses.
void print_gradient(const kiln::Trace& trace, const kiln::AliasPattern& pattern,
                    const std::vector<std::string>& names) {
  std::vector<bool> requires_grad;
  for (kiln::Value* v : trace.inputs())
    requires_grad.push_back(std::find(names.begin(), names.end(), v->name()) != names.end());
  for (const std::string& name : names)
    if (!trace.find_value(name)) usage_error("--grad names '" + name + "', which is not an input");
  kiln::CompiledProgram compiled = kiln::compile(trace, pattern, "", &requires_grad);
  const kiln::GradientProgram& g = *compiled.gradient;
  if (!g.refused.empty()) {
    std::cout << "// refused: " << g.refused << "\n";
    return;
  }
  for (const kiln::PassRecord& r : compiled.history)
    if (r.pass == "differentiate" || r.pass == "backward") std::cout << r.printed << "\n";
  auto list = [](const std::vector<int>& v) {
    std::string s;
    for (int i : v)
      s += (s.empty() ? "" : ", ") + std::to_string(i);
    return "[" + s + "]";
  };
  std::cout << "// differentiable results " << list(g.differentiable_results) << ", saved results "
            << list(g.saved_results) << ", gradients of inputs " << list(g.grad_inputs) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse_args(argc, argv);
  try {
    kiln::Trace trace = kiln::parse_trace(read_input(o.file), o.file == "-" ? "<stdin>" : o.file);
    kiln::AliasPattern pattern = o.alias.empty() ? kiln::AliasPattern::distinct(trace)
                                                 : kiln::AliasPattern::parse(o.alias, trace);
    // verify and print act on the eager trace; the pipeline's passes run in pipeline order up to
    // the last one named.
    std::string stop_after;
    for (const std::string& pass : o.passes) {
      const auto& known = kiln::pipeline_passes();
      if (std::find(known.begin(), known.end(), pass) != known.end()) {
        stop_after = pass;
      } else if (pass == "verify") {
        kiln::verify_trace(trace);
      } else if (pass == "print") {
        std::cout << kiln::print_trace(trace);
      } else {
        std::string names = "verify, print";
        for (const std::string& k : known)
          names += ", " + k;
        std::cerr << "kiln-opt: error: unknown pass '" << pass << "' (known: " << names << ")\n";
        return 1;
      }
    }
    if (!o.grad.empty()) {
      print_gradient(trace, pattern, o.grad);
      return 0;
    }
    std::optional<kiln::CompiledProgram> compiled;
    if (o.pipeline || !stop_after.empty()) {
      compiled = kiln::compile(trace, pattern, o.pipeline ? "" : stop_after);
      if (o.history) {
        for (const kiln::PassRecord& r : compiled->history)
          std::cout << r.printed << "\n";
      } else {
        std::cout << compiled->history.back().printed;
      }
      if (o.kernels) print_kernels(*compiled);
    }
    if (o.run) run_program(trace, compiled ? &*compiled : nullptr, pattern, o);
  } catch (const kiln::UserError& e) {
    std::cerr << e.what() << "\n";
    return 1;
  } catch (const kiln::InternalError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "kiln-opt: internal error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
