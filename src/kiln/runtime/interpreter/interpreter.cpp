#include "kiln/runtime/interpreter/interpreter.h"

#include "kiln/runtime/interpreter/layout.h"
#include "kiln/runtime/interpreter/reference_ops.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {

// Ops recorded with their decomposition always carry subsymbols, and run through them.
void run_through_subsymbols(const Node& node) {
  KILN_ASSERT(false) << node.op->name << " has no reference implementation of its own; it runs "
                     << "through its subsymbols, but this node has none";
}

}  // namespace

void ref_Getitem(Env&, const Node& node) {
  run_through_subsymbols(node);
}
void ref_Setitem_(Env&, const Node& node) {
  run_through_subsymbols(node);
}
void ref_Softmax(Env&, const Node& node) {
  run_through_subsymbols(node);
}
void ref_LogSoftmax(Env&, const Node& node) {
  run_through_subsymbols(node);
}
void ref_LayerNorm(Env&, const Node& node) {
  run_through_subsymbols(node);
}
void ref_RmsNorm(Env&, const Node& node) {
  run_through_subsymbols(node);
}

RefFn reference_fn(OpId id) {
  static const std::vector<RefFn> table = [] {
    std::vector<RefFn> t(all_ops().size(), nullptr);
    for (const OpInfo& op : all_ops()) {
      if (op.dtype_rule != DTypeRule::kNotElementwise)
        t[static_cast<size_t>(op.id)] = &run_elementwise;
    }
#define KILN_OP(Id, name, kind, sig, rule, outputs, alias) \
  t[static_cast<size_t>(OpId::k##Id)] = &ref_##Id;
#include "kiln/ir/ops.def"
    return t;
  }();
  RefFn fn = table.at(static_cast<size_t>(id));
  KILN_ASSERT(fn != nullptr) << op_info(id).name << " has no reference implementation";
  return fn;
}

namespace {

void run_node(Env& env, const Node& node, const ValueObserver* observer) {
  ScopedErrorContext context(node.op->name, node.loc.str());
  // A decomposed op is exactly its subsymbols: they read this node's operands and define its
  // outputs themselves.
  if (!node.subsymbols.empty()) {
    for (const auto& sub : node.subsymbols)
      run_node(env, *sub, observer);
    // ... laid out as ATen lays out its result, where that is not as its subsymbols do.
    const RtTensor& in = *env.tensor(node.arg(0));
    if (auto strides = decomposed_result_strides(node.id(), in.sizes, in.strides)) {
      const TensorHandle& result = env.tensor(node.outputs[0]);
      if (result->strides != *strides) {
        TensorHandle laid_out =
            empty_strided(result->dtype(), result->sizes, *strides, result->storage->device);
        copy_into(*laid_out, *result);
        env.bind(node.outputs[0], laid_out);
        if (observer) (*observer)(node.outputs[0], env.at(node.outputs[0]));
      }
    }
    return;
  }
  reference_fn(node.id())(env, node);
  if (observer) {
    for (const Value* v : node.outputs)
      (*observer)(v, env.at(v));
  }
}

const char* kind_name(const RtValue& v) {
  if (std::holds_alternative<TensorHandle>(v)) return "a tensor";
  return std::visit(
      [](auto x) -> const char* {
        using T = decltype(x);
        if constexpr (std::is_same_v<T, bool>)
          return "a bool";
        else if constexpr (std::is_same_v<T, int64_t>)
          return "an int";
        else
          return "a float";
      },
      std::get<RtScalar>(v));
}

void check_input(size_t i, const Value* v, const RtValue& given) {
  std::string what = "input " + std::to_string(i) + " ('" + v->name() + "')";
  if (!v->is_tensor()) {
    const ScalarType& want = v->scalar_type();
    bool ok = std::holds_alternative<RtScalar>(given);
    if (ok) {
      const RtScalar& s = std::get<RtScalar>(given);
      ok = (want.kind == ScalarKind::kBool && std::holds_alternative<bool>(s)) ||
           (want.kind == ScalarKind::kInt && std::holds_alternative<int64_t>(s)) ||
           (want.kind == ScalarKind::kFloat && std::holds_alternative<double>(s));
    }
    KILN_CHECK(ok) << what << " must be " << (want.kind == ScalarKind::kInt ? "an " : "a ")
                   << want.str() << ", but got " << kind_name(given)
                   << "; pass a value of the type the trace was made for.";
    return;
  }
  const TensorType& want = v->tensor_type();
  KILN_CHECK(std::holds_alternative<TensorHandle>(given) && std::get<TensorHandle>(given))
      << what << " must be a tensor " << want.str() << ", but got " << kind_name(given)
      << "; pass a tensor.";
  const RtTensor& t = *std::get<TensorHandle>(given);
  KILN_CHECK(t.storage && t.sizes.size() == t.strides.size())
      << what << " is malformed: it has no storage or its strides do not match its sizes.";
  TensorType got = t.type();
  bool ok = got.dtype == want.dtype && got.shape == want.shape && got.device == want.device &&
            (!want.layout || got.layout == want.layout);
  KILN_CHECK(ok) << what << " must be " << want.str() << ", but got " << got.str()
                 << "; pass a tensor of that dtype, shape, device"
                 << (want.layout ? " and layout" : "") << ", or trace the program again.";
  KILN_CHECK(t.offset >= 0 &&
             required_storage_numel(t.sizes, t.strides, t.offset) <= t.storage->numel())
      << what << " reaches past the end of its storage (" << t.storage->numel() << " elements).";
}

std::vector<RtValue> run(const Trace& trace, const std::vector<RtValue>& inputs,
                         const ValueObserver* observer) {
  ScopedErrorContext context("interpret", "");
  KILN_CHECK(inputs.size() == trace.inputs().size())
      << trace.name << " takes " << trace.inputs().size() << " inputs but " << inputs.size()
      << " were given; pass one value per input.";
  Env env;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_input(i, trace.inputs()[i], inputs[i]);
    env.bind(trace.inputs()[i], inputs[i]);  // the caller's own handles: mutations reach them
    if (observer) (*observer)(trace.inputs()[i], inputs[i]);
  }
  for (const auto& node : trace.nodes())
    run_node(env, *node, observer);
  std::vector<RtValue> results;
  for (const Value* v : trace.outputs())
    results.push_back(env.at(v));
  return results;
}

}  // namespace

std::vector<RtValue> interpret(const Trace& trace, const std::vector<RtValue>& inputs) {
  return run(trace, inputs, nullptr);
}

std::vector<RtValue> interpret_observed(const Trace& trace, const std::vector<RtValue>& inputs,
                                        const ValueObserver& observer) {
  return run(trace, inputs, &observer);
}

}  // namespace kiln
