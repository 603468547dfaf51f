// The interpreter's environment: what each trace Value currently is at run time. Several Values
// may map to one TensorHandle (an in-place op's output is its target's handle), exactly as
// several names can refer to one Python tensor object.
#pragma once

#include <unordered_map>

#include "kiln/ir/trace.h"
#include "kiln/runtime/interpreter/rt_tensor.h"

namespace kiln {

class Env {
 public:
  // Defines `v`. A tensor must have the dtype, shape and device the trace recorded for `v`;
  // anything else is a disagreement between a reference function and a type rule (a kiln bug).
  void bind(const Value* v, RtValue value);
  const RtValue& at(const Value* v) const;
  const TensorHandle& tensor(const Value* v) const;
  const TensorHandle& tensor(const Operand& o) const { return tensor(o.value()); }
  // A number argument: a scalar input or a number literal.
  RtScalar number(const Operand& o) const;

 private:
  std::unordered_map<const Value*, RtValue> values_;
};

double scalar_to_double(const RtScalar& s);
int64_t scalar_to_int(const RtScalar& s);  // a float truncates toward zero
inline bool scalar_is_float(const RtScalar& s) {
  return std::holds_alternative<double>(s);
}
inline bool scalar_is_bool(const RtScalar& s) {
  return std::holds_alternative<bool>(s);
}

// Stores a Python number into element `i` of a storage with PyTorch's conversion (ints keep all
// 64 bits).
void store_scalar(Storage& s, int64_t i, const RtScalar& v);

}  // namespace kiln
