#include "kiln/runtime/interpreter/env.h"

#include <cmath>
#include <limits>

#include "kiln/support/error.h"

namespace kiln {

void Env::bind(const Value* v, RtValue value) {
  if (v->is_tensor()) {
    KILN_ASSERT(std::holds_alternative<TensorHandle>(value) && std::get<TensorHandle>(value))
        << "'" << v->name() << "' is a tensor but its reference implementation made a scalar";
    const RtTensor& t = *std::get<TensorHandle>(value);
    const TensorType& want = v->tensor_type();
    KILN_ASSERT(t.dtype() == want.dtype && t.sizes == want.shape && t.device() == want.device)
        << "the reference implementation made " << dtype_name(t.dtype()) << shape_str(t.sizes)
        << " on " << t.device().str() << " for '" << v->name() << "', but the type rule says "
        << want.str();
  } else {
    KILN_ASSERT(std::holds_alternative<RtScalar>(value))
        << "'" << v->name() << "' is a scalar but its reference implementation made a tensor";
  }
  values_[v] = std::move(value);
}

const RtValue& Env::at(const Value* v) const {
  auto it = values_.find(v);
  KILN_ASSERT(it != values_.end()) << "'" << v->name() << "' is used before it is defined";
  return it->second;
}

const TensorHandle& Env::tensor(const Value* v) const {
  const RtValue& r = at(v);
  KILN_ASSERT(std::holds_alternative<TensorHandle>(r)) << "'" << v->name() << "' is not a tensor";
  return std::get<TensorHandle>(r);
}

RtScalar Env::number(const Operand& o) const {
  if (o.is_value()) {
    const RtValue& r = at(o.value());
    KILN_ASSERT(std::holds_alternative<RtScalar>(r))
        << "'" << o.value()->name() << "' is not a number";
    return std::get<RtScalar>(r);
  }
  const Constant& c = o.constant();
  if (const bool* b = std::get_if<bool>(&c)) return *b;
  if (const int64_t* i = std::get_if<int64_t>(&c)) return *i;
  if (const double* d = std::get_if<double>(&c)) return *d;
  KILN_ASSERT(false) << "constant " << constant_str(c) << " is not a number";
  return false;
}

double scalar_to_double(const RtScalar& s) {
  return std::visit([](auto v) { return static_cast<double>(v); }, s);
}

int64_t scalar_to_int(const RtScalar& s) {
  if (const double* d = std::get_if<double>(&s)) {
    // Out of range (or NaN) is undefined in C++; x86 gives the minimum, as PyTorch sees it.
    return float_to_int<int64_t>(*d);
  }
  return std::visit([](auto v) { return static_cast<int64_t>(v); }, s);
}

void store_scalar(Storage& s, int64_t i, const RtScalar& v) {
  if (scalar_is_float(v))
    s.store_double(i, std::get<double>(v));
  else
    s.store_int(i, scalar_to_int(v));
}

}  // namespace kiln
