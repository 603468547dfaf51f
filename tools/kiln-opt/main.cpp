// kiln-opt: text trace in, passes, text trace out (as mlir-opt does for MLIR).
//
//   kiln-opt seed.trace                       parse, verify and print
//   kiln-opt seed.trace --passes=verify,print run the named passes in order
//   kiln-opt seed.trace --run [--seed=N] [--input=a=1,2,3,4]
//                                             run in the reference interpreter and print the
//                                             outputs and the inputs after the call
//   kiln-opt - ...                            read the trace from standard input
//
// Exit status: 0 on success, 1 on a user error (malformed trace, bad input, an error eager
// PyTorch would raise), 2 on an internal error.
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include "kiln/kiln.h"

namespace {

struct Options {
  std::string file;
  std::vector<std::string> passes;
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
  if (o.passes.empty() && !o.run) o.passes = {"verify", "print"};
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

void run_trace(const kiln::Trace& trace, const Options& o) {
  std::vector<kiln::RtValue> inputs;
  uint64_t seed = o.seed;
  for (kiln::Value* in : trace.inputs()) {
    if (!in->is_tensor()) {
      auto it = o.inputs.find(in->name());
      KILN_CHECK(it != o.inputs.end() && it->second.size() == 1)
          << "the scalar input '" << in->name() << "' needs a value; pass --input=" << in->name()
          << "=<number>.";
      double v = it->second[0];
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
    auto it = o.inputs.find(in->name());
    if (it != o.inputs.end())
      inputs.emplace_back(kiln::make_input(in->tensor_type(), it->second));
    else
      inputs.emplace_back(kiln::make_random_input(in->tensor_type(), seed++));
  }
  for (const auto& [name, values] : o.inputs) {
    bool known = false;
    for (kiln::Value* in : trace.inputs())
      known = known || in->name() == name;
    KILN_CHECK(known) << "--input names '" << name << "', which is not an input of the trace.";
  }
  std::cout << "# inputs before the call\n";
  for (size_t i = 0; i < inputs.size(); ++i)
    std::cout << trace.inputs()[i]->name() << " = " << kiln::value_str(inputs[i]) << "\n";
  std::vector<kiln::RtValue> outputs = kiln::interpret(trace, inputs);
  std::cout << "# outputs\n";
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::cout << trace.outputs()[i]->name() << " = " << kiln::value_str(outputs[i]);
    // Say which outputs are the caller's own input objects.
    if (auto* h = std::get_if<kiln::TensorHandle>(&outputs[i])) {
      for (size_t j = 0; j < inputs.size(); ++j) {
        auto* in = std::get_if<kiln::TensorHandle>(&inputs[j]);
        if (in && *in == *h) std::cout << "  # is input " << trace.inputs()[j]->name();
      }
    }
    std::cout << "\n";
  }
  std::cout << "# inputs after the call\n";
  for (size_t i = 0; i < inputs.size(); ++i)
    std::cout << trace.inputs()[i]->name() << " = " << kiln::value_str(inputs[i]) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse_args(argc, argv);
  try {
    kiln::Trace trace = kiln::parse_trace(read_input(o.file), o.file == "-" ? "<stdin>" : o.file);
    for (const std::string& pass : o.passes) {
      if (pass == "verify") {
        kiln::verify_trace(trace);
      } else if (pass == "print") {
        std::cout << kiln::print_trace(trace);
      } else {
        std::cerr << "kiln-opt: error: unknown pass '" << pass << "' (known: verify, print)\n";
        return 1;
      }
    }
    if (o.run) run_trace(trace, o);
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
