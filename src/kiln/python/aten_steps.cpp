#include "kiln/python/aten_steps.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <functional>
#include <unordered_map>
#include <unordered_set>
#include <variant>

#include "kiln/python/torch_values.h"
#include "kiln/support/error.h"

namespace kiln::pyext {

namespace {

// A value of the step while it runs: a tensor or a number.
using AtValue = std::variant<at::Tensor, at::Scalar>;

// The step's values and the node's operands read from them.
class Operands {
 public:
  Operands(std::unordered_map<const Value*, AtValue>& env, const Node& node)
      : env_(env), node_(node) {}

  const at::Tensor& tensor(std::string_view name) const {
    return std::get<at::Tensor>(env_.at(node_.arg(name).value()));
  }
  // A tensor or a number operand (`other` of add: TS).
  AtValue value(std::string_view name) const {
    const Operand& o = node_.arg(name);
    if (o.is_value()) return env_.at(o.value());
    return number(o.constant());
  }
  at::Scalar scalar(std::string_view name) const {
    const Operand& o = node_.arg(name);
    if (o.is_value()) return std::get<at::Scalar>(env_.at(o.value()));
    return std::get<at::Scalar>(number(o.constant()));
  }
  int64_t integer(std::string_view name) const { return node_.arg(name).as_int(); }
  std::optional<int64_t> optional_integer(std::string_view name) const {
    return node_.arg(name).as_optional_int();
  }
  const IntList& ints(std::string_view name) const { return node_.arg(name).as_ints(); }
  std::vector<at::Tensor> tensors(std::string_view name) const {
    std::vector<at::Tensor> out;
    for (const Value* v : node_.arg(name).values())
      out.push_back(std::get<at::Tensor>(env_.at(v)));
    return out;
  }
  // The options of the node's (only) result: a creation's dtype and device (kiln's type rules
  // chose them as torch's defaults would).
  at::TensorOptions result_options() const {
    const TensorType& t = node_.outputs.at(0)->tensor_type();
    const at::Device device =
        t.device.kind == Device::Kind::kCuda
            ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(t.device.index))
            : at::Device(at::kCPU);
    return at::TensorOptions().dtype(torch_dtype(t.dtype)).device(device);
  }
  const Shape& result_shape() const { return node_.outputs.at(0)->tensor_type().shape; }

 private:
  static AtValue number(const Constant& c) {
    if (const auto* b = std::get_if<bool>(&c)) return at::Scalar(*b);
    if (const auto* i = std::get_if<int64_t>(&c)) return at::Scalar(*i);
    return at::Scalar(std::get<double>(c));
  }
  std::unordered_map<const Value*, AtValue>& env_;
  const Node& node_;
};

using OpRun = std::function<at::Tensor(const Operands&, bool in_place)>;

// zeros, ones, full and their _like forms: the result's shape and options, filled with `value`
// (full's fill_value where none).
OpRun filled(std::optional<int64_t> value) {
  return [value](const Operands& a, bool) {
    return at::full(a.result_shape(), value ? at::Scalar(*value) : a.scalar("fill_value"),
                    a.result_options());
  };
}

// A binary op whose `other` is a tensor or a number: f(operands, self, other) with other an
// at::Tensor or an at::Scalar (ATen overloads each op on both).
template <class F>
OpRun binary(F f) {
  return [f](const Operands& a, bool) {
    return std::visit([&](const auto& other) { return f(a, a.tensor("self"), other); },
                      a.value("other"));
  };
}

// The ops this runner takes, each as its ATen function (kiln's ops are torch's, with torch's
// signatures: src/kiln/ir/ops.def).
const std::unordered_map<OpId, OpRun>& aten_ops() {
  static const std::unordered_map<OpId, OpRun> ops = {
      {OpId::kZeros, filled(0)},
      {OpId::kZerosLike, filled(0)},
      {OpId::kOnes, filled(1)},
      {OpId::kOnesLike, filled(1)},
      {OpId::kFull, filled(std::nullopt)},
      {OpId::kFullLike, filled(std::nullopt)},
      {OpId::kArange,
       [](const Operands& a, bool) {
         return at::arange(a.scalar("start"), a.scalar("end"), a.scalar("step"),
                           a.result_options());
       }},
      {OpId::kAdd, binary([](const Operands& a, const at::Tensor& x, const auto& y) {
         return at::add(x, y, a.scalar("alpha"));
       })},
      {OpId::kSub, binary([](const Operands& a, const at::Tensor& x, const auto& y) {
         return at::sub(x, y, a.scalar("alpha"));
       })},
      {OpId::kMul,
       binary([](const Operands&, const at::Tensor& x, const auto& y) { return at::mul(x, y); })},
      {OpId::kReshape,
       [](const Operands& a, bool) { return at::reshape(a.tensor("self"), a.ints("shape")); }},
      {OpId::kView, [](const Operands& a, bool) { return a.tensor("self").view(a.ints("size")); }},
      {OpId::kPermute,
       [](const Operands& a, bool) { return at::permute(a.tensor("self"), a.ints("dims")); }},
      {OpId::kTranspose,
       [](const Operands& a, bool) {
         return at::transpose(a.tensor("self"), a.integer("dim0"), a.integer("dim1"));
       }},
      {OpId::kT, [](const Operands& a, bool) { return at::t(a.tensor("self")); }},
      {OpId::kExpand,
       [](const Operands& a, bool) { return a.tensor("self").expand(a.ints("size")); }},
      {OpId::kUnsqueeze,
       [](const Operands& a, bool) { return at::unsqueeze(a.tensor("self"), a.integer("dim")); }},
      {OpId::kSlice,
       [](const Operands& a, bool) {
         return at::slice(a.tensor("self"), a.integer("dim"), a.optional_integer("start"),
                          a.optional_integer("end"), a.integer("step"));
       }},
      {OpId::kSelect,
       [](const Operands& a, bool) {
         return at::select(a.tensor("self"), a.integer("dim"), a.integer("index"));
       }},
      {OpId::kCat,
       [](const Operands& a, bool) { return at::cat(a.tensors("tensors"), a.integer("dim")); }},
      {OpId::kIndexSelect,
       [](const Operands& a, bool) {
         return at::index_select(a.tensor("self"), a.integer("dim"), a.tensor("index"));
       }},
      {OpId::kIndexAdd,
       [](const Operands& a, bool in_place) {
         at::Tensor self = a.tensor("self");
         const at::Scalar alpha = a.scalar("alpha");
         if (in_place)
           return self.index_add_(a.integer("dim"), a.tensor("index"), a.tensor("source"), alpha);
         return at::index_add(self, a.integer("dim"), a.tensor("index"), a.tensor("source"), alpha);
       }},
      {OpId::kIndexCopy,
       [](const Operands& a, bool in_place) {
         at::Tensor self = a.tensor("self");
         if (in_place)
           return self.index_copy_(a.integer("dim"), a.tensor("index"), a.tensor("source"));
         return at::index_copy(self, a.integer("dim"), a.tensor("index"), a.tensor("source"));
       }},
  };
  return ops;
}

bool index_op(OpId id) {
  return id == OpId::kIndexSelect || id == OpId::kIndexAdd || id == OpId::kIndexCopy;
}

bool on_cuda(const RtValue& v) {
  const auto* t = std::get_if<TensorHandle>(&v);
  return t && (*t)->device().kind == Device::Kind::kCuda;
}

}  // namespace

std::vector<bool> writes_in_place(const Trace& body) {
  std::unordered_map<const Value*, int> uses;
  for (const auto& node : body.nodes())
    node->for_each_value_operand([&uses](const Value* v) { ++uses[v]; });
  for (const Value* o : body.outputs())
    ++uses[o];
  auto index_write = [](OpId id) {
    return id == OpId::kIndexAdd || id == OpId::kIndexCopy || id == OpId::kScatter;
  };
  std::vector<bool> in_place;
  in_place.reserve(body.nodes().size());
  for (const auto& node : body.nodes()) {
    const Value* self = node->operands.empty() || !node->operands[0].is_value()
                            ? nullptr
                            : node->operands[0].value();
    const Node* maker = self ? self->producer() : nullptr;
    in_place.push_back(index_write(node->id()) && maker &&
                       (maker->op->kind == OpKind::kCreation || index_write(maker->id())) &&
                       uses[self] == 1);
  }
  return in_place;
}

std::optional<std::vector<RtValue>> run_step_with_aten(const Trace& body,
                                                       const std::vector<RtValue>& inputs,
                                                       bool indices_checked) {
  const auto& ops = aten_ops();
  const bool cuda = std::any_of(inputs.begin(), inputs.end(), on_cuda) ||
                    std::any_of(body.nodes().begin(), body.nodes().end(), [](const auto& n) {
                      return !n->outputs.empty() && n->outputs[0]->is_tensor() &&
                             n->outputs[0]->tensor_type().device.kind == Device::Kind::kCuda;
                    });
  for (const Value* o : body.outputs())
    if (!o->is_tensor()) return std::nullopt;
  for (const auto& node : body.nodes()) {
    if (!ops.contains(node->id()) || !node->subsymbols.empty() || node->outputs.size() != 1)
      return std::nullopt;
    if (cuda && index_op(node->id()) && !indices_checked) return std::nullopt;
  }
  std::unordered_map<const Value*, AtValue> env;
  std::unordered_set<const void*> input_memory;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (const auto* s = std::get_if<RtScalar>(&inputs[i])) {
      env[body.inputs()[i]] = std::visit([](auto x) { return at::Scalar(x); }, *s);
      continue;
    }
    at::Tensor t = torch_view(*std::get<TensorHandle>(inputs[i]));
    if (t.storage().nbytes()) input_memory.insert(t.storage().data());
    env[body.inputs()[i]] = std::move(t);
  }
  const std::vector<bool> in_place = writes_in_place(body);
  try {
    c10::AutoGradMode no_grad(false);  // the step's values are values, never autograd's
    for (size_t n = 0; n < body.nodes().size(); ++n) {
      const Node& node = *body.nodes()[n];
      env[node.outputs[0]] = ops.at(node.id())(Operands(env, node), in_place[n]);
    }
  } catch (const c10::IndexError& e) {
    throw IndexOutOfRange(e.what_without_backtrace());
  } catch (const c10::Error&) {
    return std::nullopt;  // the Python runner raises eager's own error
  }
  std::vector<RtValue> results;
  for (const Value* o : body.outputs()) {
    const at::Tensor& t = std::get<at::Tensor>(env.at(o));
    // (a step's results are values: later writes into the caller's memory must not change them)
    const bool over_input = t.storage().nbytes() && input_memory.contains(t.storage().data());
    results.emplace_back(kiln_view(over_input ? t.clone(at::MemoryFormat::Preserve) : t));
  }
  return results;
}

}  // namespace kiln::pyext
