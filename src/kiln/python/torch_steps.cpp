#include "kiln/python/torch_steps.h"

#include <ATen/ATen.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <torch/csrc/autograd/python_variable.h>

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "kiln/python/aten_steps.h"
#include "kiln/python/torch_values.h"
#include "kiln/runtime/interpreter/eager_calls.h"
#include "kiln/runtime/library_step.h"
#include "kiln/support/error.h"

namespace nb = nanobind;

namespace kiln::pyext {

int register_eager(nb::callable callable, std::string capture_refusal) {
  // The registry may outlive the interpreter (it is destroyed with the process's statics): the
  // last reference is dropped only while Python still runs.
  std::shared_ptr<PyObject> held(callable.release().ptr(), [](PyObject* o) {
    if (!Py_IsInitialized()) return;
    nb::gil_scoped_acquire gil;
    Py_DECREF(o);
  });
  return register_eager_function(
      [held](const std::vector<TensorHandle>& inputs) {
        nb::gil_scoped_acquire gil;
        nb::handle fn(held.get());
        nb::list args;
        for (const TensorHandle& t : inputs)
          args.append(nb::steal(THPVariable_Wrap(torch_view(*t))));
        nb::object out = fn(args);
        std::vector<TensorHandle> results;
        for (nb::handle r : out) {
          if (!THPVariable_Check(r.ptr()))
            throw UnsupportedError(
                "kiln: an op run by PyTorch returned something other than tensors");
          results.push_back(kiln_view(THPVariable_Unpack(r.ptr())));
        }
        return results;
      },
      std::move(capture_refusal));
}

namespace {

// A constant operand as the Python value its printed form stands for (kiln._torch_steps parses
// and caches the text: None, 3, 2.5, torch.float32, [1, 2], "floor", (slice(1, None, None), 0)).
nb::object python_constant(const Constant& c) {
  if (is_none(c)) return nb::none();
  if (const auto* b = std::get_if<bool>(&c)) return nb::bool_(*b);
  if (const auto* i = std::get_if<int64_t>(&c)) return nb::int_(*i);
  if (const auto* d = std::get_if<double>(&c)) return nb::float_(*d);
  // Never released: a static nb::object would be destroyed after the interpreter at exit.
  static nb::handle constant =
      nb::object(nb::module_::import_("kiln._torch_steps").attr("constant")).release();
  return constant(constant_str(c));
}

// Runs a step's nodes in order through PyTorch, on the tensors where they are (device memory
// included): every step of a CUDA program stays on the device, and a CPU step runs ATen's
// kernels (a matrix product through its BLAS) instead of kiln's reference interpreter.
// A step that is one matrix product and the views around it (library_step.h; on the CPU no
// kernel lowers them) runs through ATen's C++ API, without Python: the Python step runner costs
// tens of microseconds a call. The product is fresh memory, never a view of an input (a step's
// values are SSA values).
TensorHandle aten_matrix_product(const Node& node, const std::vector<RtValue>& operands) {
  if (node.id() != OpId::kMatmul && node.id() != OpId::kBmm && node.id() != OpId::kLinear)
    return nullptr;
  std::vector<at::Tensor> args;
  for (const RtValue& v : operands)
    if (const auto* t = std::get_if<TensorHandle>(&v))
      args.push_back(torch_view(**t));  // else: no bias
  at::Tensor out;
  if (node.id() == OpId::kMatmul)
    out = at::matmul(args.at(0), args.at(1));
  else if (node.id() == OpId::kBmm)
    out = at::bmm(args.at(0), args.at(1));
  else
    out = at::linear(args.at(0), args.at(1),
                     args.size() > 2 ? std::optional<at::Tensor>(args[2]) : std::nullopt);
  for (const at::Tensor& a : args)
    if (out.numel() && a.numel() && out.storage().is_alias_of(a.storage())) out = out.clone();
  return kiln_view(out);
}

std::optional<std::vector<RtValue>> run_matrix_product(const Trace& body,
                                                       const std::vector<RtValue>& inputs) {
  // A reshape no view expresses copies through ATen (on the tensor's device and stream).
  TensorHandle out = run_library_body(body, inputs, aten_matrix_product, [](const RtTensor& t) {
    return kiln_view(torch_view(t).clone(at::MemoryFormat::Contiguous));
  });
  if (!out) return std::nullopt;
  return std::vector<RtValue>{out};
}

}  // namespace

std::vector<RtValue> run_step_with_torch(const Trace& body, const std::vector<RtValue>& inputs,
                                         bool indices_checked) {
  if (std::optional<std::vector<RtValue>> product = run_matrix_product(body, inputs))
    return *product;
  if (std::optional<std::vector<RtValue>> results =
          run_step_with_aten(body, inputs, indices_checked))
    return *results;
  nb::gil_scoped_acquire gil;
  static nb::handle run_node =
      nb::object(nb::module_::import_("kiln._torch_steps").attr("run_node")).release();
  static nb::handle detached =
      nb::object(nb::module_::import_("kiln._torch_steps").attr("detached")).release();
  std::unordered_map<const Value*, nb::object> env;
  auto python_value = [](const RtValue& v) -> nb::object {
    if (const auto* s = std::get_if<RtScalar>(&v))
      return std::visit([](auto x) { return nb::cast(x); }, *s);
    return nb::steal(THPVariable_Wrap(torch_view(*std::get<TensorHandle>(v))));
  };
  nb::list input_objects;
  for (size_t i = 0; i < inputs.size(); ++i) {
    env[body.inputs()[i]] = python_value(inputs[i]);
    input_objects.append(env[body.inputs()[i]]);
  }
  const std::vector<bool> in_place = writes_in_place(body);
  for (size_t n = 0; n < body.nodes().size(); ++n) {
    const auto& node = body.nodes()[n];
    nb::list args;
    nb::dict kwargs;
    for (size_t i = 0; i < node->operands.size(); ++i) {
      const Operand& o = node->operands[i];
      const Param& p = node->op->params.at(i);
      nb::object value;
      if (o.is_value()) {
        value = env.at(o.value());
      } else if (o.is_value_list()) {
        nb::list list;
        for (const Value* v : o.values())
          list.append(env.at(v));
        value = list;
      } else {
        value = python_constant(o.constant());
      }
      if (p.keyword_only)
        kwargs[p.name.c_str()] = value;
      else
        args.append(value);
    }
    nb::object out = run_node(node->op->name, args, kwargs, indices_checked, in_place[n]);
    if (node->outputs.size() == 1) {
      env[node->outputs[0]] = out;
    } else {
      nb::sequence outs = nb::borrow<nb::sequence>(out);
      for (size_t k = 0; k < node->outputs.size(); ++k)
        env[node->outputs[k]] = outs[k];
    }
  }
  // Results over memory of the inputs (a view op's output) are copied: the step's values are
  // SSA values, which later writes into the caller's memory must not change.
  nb::list outs;
  for (const Value* o : body.outputs())
    outs.append(env.at(o));
  nb::object results = detached(outs, input_objects);
  std::vector<RtValue> values;
  for (nb::handle r : results) {
    if (THPVariable_Check(r.ptr()))
      values.emplace_back(kiln_view(THPVariable_Unpack(r.ptr())));
    else if (PyBool_Check(r.ptr()))
      values.emplace_back(RtScalar(nb::cast<bool>(r)));
    else if (PyLong_Check(r.ptr()))
      values.emplace_back(RtScalar(nb::cast<int64_t>(r)));
    else
      values.emplace_back(RtScalar(nb::cast<double>(r)));
  }
  return values;
}

// A tensor of `dtype` with t's layout over the storage (no dispatcher call).

}  // namespace kiln::pyext
