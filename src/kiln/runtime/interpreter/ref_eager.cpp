// eager_call: the op's registered function (eager_calls.h), and the registry itself.
#include <map>
#include <mutex>

#include "kiln/runtime/interpreter/eager_calls.h"
#include "kiln/runtime/interpreter/env.h"
#include "kiln/runtime/interpreter/reference_ops.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {
struct Registered {
  EagerFunction function;
  std::string capture_refusal;
};
struct Registry {
  std::mutex mutex;
  std::map<int, Registered> functions;
  int next = 1;
};
Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

int register_eager_function(EagerFunction f, std::string capture_refusal) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  int id = r.next++;
  r.functions[id] = Registered{std::move(f), std::move(capture_refusal)};
  return id;
}

std::string eager_function_capture_refusal(int id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.functions.find(id);
  return it == r.functions.end() ? "is not registered" : it->second.capture_refusal;
}

void unregister_eager_function(int id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.functions.erase(id);
}

std::vector<TensorHandle> call_eager_function(int id, const std::vector<TensorHandle>& inputs) {
  EagerFunction f;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.functions.find(id);
    if (it == r.functions.end())
      throw UserError("eager_call " + std::to_string(id) +
                      ": no function with this number is registered in this process. An "
                      "eager_call runs a torch op through the Python process that traced it "
                      "(kiln.jit); kiln-opt and other processes cannot run it.");
    f = it->second.function;
  }
  return f(inputs);  // outside the lock: the function may run kiln programs itself
}

void ref_EagerCall(Env& env, const Node& node) {
  std::vector<TensorHandle> inputs;
  for (const Value* v : node.arg(1).values())
    inputs.push_back(env.tensor(v));
  std::vector<TensorHandle> results =
      call_eager_function(static_cast<int>(node.arg(0).as_int()), inputs);
  KILN_CHECK(results.size() == node.outputs.size())
      << "eager_call: the op returned " << results.size() << " tensors where tracing saw "
      << node.outputs.size();
  for (size_t k = 0; k < results.size(); ++k) {
    const TensorType& want = node.outputs[k]->tensor_type();
    const RtTensor& got = *results[k];
    if (got.dtype() != want.dtype || got.sizes != want.shape || got.device() != want.device)
      throw UserError("eager_call: result " + std::to_string(k) + " is " +
                      std::string(dtype_name(got.dtype())) + shape_str(got.sizes) + " on " +
                      got.device().str() + ", but tracing on meta tensors saw " + want.str() +
                      "; the op's result depends on more than its inputs' shapes and dtypes.");
    env.bind(node.outputs[k], results[k]);
  }
}

}  // namespace kiln
