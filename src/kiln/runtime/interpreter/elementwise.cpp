// Every elementwise op of ops.def, functional and in place, from the table's own math
// expressions. The operands are converted to the op's compute dtype (elementwise_typing), the
// math runs in double for floating compute dtypes and in int64 otherwise, and the result is
// converted to the output dtype when stored. This file is compiled with -fwrapv: PyTorch's
// integer arithmetic wraps.
#include "kiln/ir/elementwise_params.h"

#include <array>
#include <optional>
#include <unordered_map>

#include "kiln/ir/scalar_math.h"
#include "kiln/ir/type_rules.h"
#include "kiln/runtime/interpreter/layout.h"
#include "kiln/runtime/interpreter/reference_ops.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {

using FloatFn = double (*)(const double* v, const ElementwiseParams& p);
using IntFn = int64_t (*)(const int64_t* v, const ElementwiseParams& p);

int64_t no_int_path(const char* op) {
  KILN_ASSERT(false) << op << " has no integer math; its dtype rule should have promoted the "
                     << "operands to a floating dtype";
  return 0;
}
int64_t no_float_path(const char* op) {
  KILN_ASSERT(false) << op << " has no floating-point math; its dtype rule should have rejected "
                     << "floating operands";
  return 0;
}

// One float and one int function per elementwise row, the row's expressions inlined. `op_name`
// lets KILN_NO_INT / KILN_NO_FLOAT say which op reached a path that does not exist.
#define KILN_NO_INT no_int_path(op_name)
#define KILN_NO_FLOAT no_float_path(op_name)
#define KILN_EW_FUNCTIONS(Id, name, unpack, fexpr, iexpr)          \
  double float_##Id(const double* v, const ElementwiseParams& p) { \
    [[maybe_unused]] const char* op_name = name;                   \
    using K [[maybe_unused]] = double;                             \
    [[maybe_unused]] double unpack;                                \
    return static_cast<double>(fexpr);                             \
  }                                                                \
  int64_t int_##Id(const int64_t* v, const ElementwiseParams& p) { \
    [[maybe_unused]] const char* op_name = name;                   \
    [[maybe_unused]] int64_t unpack;                               \
    return static_cast<int64_t>(iexpr);                            \
  }
#define KILN_UNARY(Id, name, rule, inplace, fexpr, iexpr) \
  KILN_EW_FUNCTIONS(Id, name, a = v[0], fexpr, iexpr)
#define KILN_BINARY(Id, name, sig, rule, inplace, fexpr, iexpr) \
  KILN_EW_FUNCTIONS(Id, name, a = v[0] KILN_COMMA b = v[1], fexpr, iexpr)
#define KILN_TERNARY(Id, name, sig, rule, inplace, fexpr, iexpr) \
  KILN_EW_FUNCTIONS(Id, name, a = v[0] KILN_COMMA b = v[1] KILN_COMMA c = v[2], fexpr, iexpr)
#define KILN_COMMA ,
#include "kiln/ir/ops.def"
#undef KILN_EW_FUNCTIONS
#undef KILN_COMMA

struct Kernel {
  FloatFn f;
  IntFn i;
};

const Kernel& kernel_for(OpId id) {
  static const std::unordered_map<OpId, Kernel> table = {
#define KILN_UNARY(Id, name, rule, inplace, fexpr, iexpr) {OpId::k##Id, {&float_##Id, &int_##Id}},
#define KILN_BINARY(Id, name, sig, rule, inplace, fexpr, iexpr) \
  {OpId::k##Id, {&float_##Id, &int_##Id}},
#define KILN_TERNARY(Id, name, sig, rule, inplace, fexpr, iexpr) \
  {OpId::k##Id, {&float_##Id, &int_##Id}},
#include "kiln/ir/ops.def"
  };
  auto it = table.find(id);
  KILN_ASSERT(it != table.end()) << op_info(id).name << " is not elementwise";
  return it->second;
}

ElementwiseParams make_params(const Env& env, const Node& node, DType compute, bool cuda) {
  const OpInfo& op = *node.op;
  ElementwiseParams p;
  p.bool_compute = compute == DType::kBool;
  p.single_precision = is_floating(compute) && compute != DType::kFloat64;
  if (int i = op.param_index("alpha"); i >= 0) {
    RtScalar alpha = env.number(node.arg(static_cast<size_t>(i)));
    // PyTorch's alpha_check.
    KILN_CHECK(!scalar_is_bool(alpha) || compute == DType::kBool)
        << "Boolean alpha only supported for Boolean results.";
    KILN_CHECK(is_floating(compute) || !scalar_is_float(alpha))
        << "For integral input tensors, argument alpha must not be a floating point number.";
    // in the dtype eager's kernel takes a number of the op in (number_operand_dtype): float for
    // float32, bf16 for a CPU bf16 add
    p.alpha = is_floating(compute)
                  ? round_to_dtype(scalar_to_double(alpha),
                                   number_operand_dtype(op.functional_form, compute, cuda))
                  : scalar_to_double(alpha);
    p.alpha_i = scalar_to_int(alpha);
  }
  if (int i = op.param_index("value"); i >= 0 && op.arity == 3) {
    RtScalar value = env.number(node.arg(static_cast<size_t>(i)));
    // float for float32, float16 and bfloat16 math, as eager's addcmul and addcdiv take it
    p.value = p.single_precision ? round_to_dtype(scalar_to_double(value), DType::kFloat32)
                                 : scalar_to_double(value);
    p.value_i = scalar_to_int(value);
  }
  if (int i = op.param_index("rounding_mode"); i >= 0) {
    const Operand& mode = node.arg(static_cast<size_t>(i));
    p.rounding = mode.is_none() ? 0 : mode.as_string() == "trunc" ? 1 : 2;
  }
  if (int i = op.param_index("approximate"); i >= 0) {
    const std::string& a = node.arg(static_cast<size_t>(i)).as_string();
    KILN_CHECK(a == "none" || a == "tanh")
        << "approximate argument must be either none or tanh, got '" << a << "'.";
    p.approximate_tanh = a == "tanh";
  }
  if (op.dtype_rule == DTypeRule::kClamp) {
    p.has_b = !node.arg(1).is_none();
    p.has_c = !node.arg(2).is_none();
  }
  return p;
}

// Python numbers that ATen passes to the kernel as parameters instead of wrapping them as 0-dim
// operands of the TensorIterator: clamp's bounds, pow's scalar exponent, lerp's scalar weight.
// They do not take part in choosing the output's layout.
bool number_is_kernel_parameter(OpId id) {
  return id == OpId::kClamp || id == OpId::kPow || id == OpId::kLerp;
}

// One operand's values over the iteration shape, already converted to the compute dtype: one
// value per element, or a single value for a number, converted to `number_dtype`
// (number_operand_dtype: a bf16 product takes its number in float, as eager does).
template <class T>
std::vector<T> operand_values(const Env& env, const Operand& o, const Shape& shape, DType compute,
                              DType number_dtype, bool convert) {
  auto to_compute = [&](T v) {
    if (!convert) return v;
    if constexpr (std::is_same_v<T, double>)
      return round_to_dtype(v, compute);
    else
      return cast_int_to_dtype(v, compute);
  };
  std::vector<T> out;
  if (o.is_value() && o.value()->is_tensor()) {
    const RtTensor& t = *env.tensor(o);
    std::vector<int64_t> idx = element_indices(shape, broadcast_strides(t, shape), t.offset);
    out.reserve(idx.size());
    for (int64_t i : idx) {
      if constexpr (std::is_same_v<T, double>)
        out.push_back(to_compute(t.storage->load_double(i)));
      else
        out.push_back(to_compute(t.storage->load_int(i)));
    }
  } else {
    RtScalar s = env.number(o);
    if constexpr (std::is_same_v<T, double>)
      out.push_back(convert ? round_to_dtype(scalar_to_double(s), number_dtype)
                            : scalar_to_double(s));
    else
      out.push_back(to_compute(scalar_to_int(s)));
  }
  return out;
}

bool is_number(const Operand& o) {
  return !(o.is_value() && o.value()->is_tensor()) && !o.is_none();
}

// Whether the op divides by a number as eager's CUDA kernel does: a product with the number's
// reciprocal (cuda_divides_by_reciprocal).
bool divides_by_reciprocal(const Node& node, const ElementwiseTyping& typing, int rounding) {
  return typing.device.kind == Device::Kind::kCuda && is_floating(typing.compute) &&
         cuda_divides_by_reciprocal(node.op->functional_form, rounding) && is_number(node.arg(1));
}

// That reciprocal: of the number as a double, held in the math type (float, or double for
// float64).
double reciprocal_in(double s, DType compute) {
  return round_to_dtype(1.0 / s, compute == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32);
}

template <class T, class Fn>
std::vector<T> compute(const Env& env, const Node& node, const ElementwiseTyping& typing, Fn fn,
                       const ElementwiseParams& p) {
  const OpInfo& op = *node.op;
  const DType number_dtype = number_operand_dtype(op.functional_form, typing.compute,
                                                  typing.device.kind == Device::Kind::kCuda);
  int64_t n = shape_numel(typing.shape);
  std::array<std::vector<T>, 3> values;
  for (int i = 0; i < op.arity; ++i) {
    const Operand& o = node.arg(static_cast<size_t>(i));
    if (o.is_none()) {
      values[static_cast<size_t>(i)] = {T{}};  // an absent clamp bound, never read
      continue;
    }
    // where's condition is a bool mask, not an operand of the promotion.
    bool convert = !(op.dtype_rule == DTypeRule::kWhere && i == 0);
    values[static_cast<size_t>(i)] =
        operand_values<T>(env, o, typing.shape, typing.compute, number_dtype, convert);
  }
  if constexpr (std::is_same_v<T, double>) {
    if (divides_by_reciprocal(node, typing, p.rounding)) {
      const double r = reciprocal_in(scalar_to_double(env.number(node.arg(1))), typing.compute);
      std::vector<T> product(static_cast<size_t>(n));
      for (int64_t k = 0; k < n; ++k)
        product[static_cast<size_t>(k)] =
            values[0].size() == 1 ? values[0][0] * r : values[0][static_cast<size_t>(k)] * r;
      return product;
    }
  }
  std::vector<T> out(static_cast<size_t>(n));
  std::array<T, 3> args{};
  for (int64_t k = 0; k < n; ++k) {
    for (int i = 0; i < op.arity; ++i) {
      const std::vector<T>& v = values[static_cast<size_t>(i)];
      args[static_cast<size_t>(i)] = v.size() == 1 ? v[0] : v[static_cast<size_t>(k)];
    }
    out[static_cast<size_t>(k)] = fn(args.data(), p);
  }
  // A float number in bf16 or f16 math: eager's float result, rounded to the dtype from there.
  if constexpr (std::is_same_v<T, double>)
    if (number_dtype != typing.compute)
      for (T& v : out)
        v = round_to_dtype(v, number_dtype);
  return out;
}

// The tensor a functional elementwise op returns, laid out as eager would allocate it.
TensorHandle allocate_output(const Env& env, const Node& node, const ElementwiseTyping& typing) {
  const OpInfo& op = *node.op;
  if (op.id == OpId::kTo) {
    // Tensor.to copies with memory_format=preserve_format (_to_copy), like empty_like.
    return empty_strided(typing.out, typing.shape, strides_like(*env.tensor(node.arg(0))),
                         typing.device);
  }
  std::vector<const RtTensor*> inputs;
  for (int i = 0; i < op.arity; ++i) {
    const Operand& o = node.arg(static_cast<size_t>(i));
    if (o.is_none()) continue;
    if (o.is_value() && o.value()->is_tensor())
      inputs.push_back(env.tensor(o).get());
    else if (!number_is_kernel_parameter(op.functional_form))
      inputs.push_back(nullptr);
  }
  return empty_strided(typing.out, typing.shape, elementwise_output_strides(typing.shape, inputs),
                       typing.device);
}

}  // namespace

void run_elementwise(Env& env, const Node& node) {
  const OpInfo& op = *node.op;
  const OpId fid = op.functional_form;
  ElementwiseTyping typing = elementwise_typing(op, node.operands);
  const bool floating = is_floating(typing.compute);

  // Tensor.to(dtype) of a tensor that already has that dtype returns the tensor itself.
  if (fid == OpId::kTo && typing.out == env.tensor(node.arg(0))->dtype()) {
    env.bind(node.outputs[0], env.tensor(node.arg(0)));
    return;
  }
  // pow.Tensor_Scalar rejects a negative integer exponent; a tensor exponent does not.
  if (fid == OpId::kPow && !floating &&
      !(node.arg(1).is_value() && node.arg(1).value()->is_tensor())) {
    KILN_CHECK(scalar_to_int(env.number(node.arg(1))) >= 0)
        << "Integers to negative integer powers are not allowed.";
  }

  TensorHandle out;
  if (op.is_inplace_elementwise()) {
    // TensorIterator's memory-overlap checks, before anything is written.
    out = env.tensor(node.arg(0));
    check_no_internal_overlap(*out);
    for (int i = 1; i < op.arity; ++i) {
      const Operand& o = node.arg(static_cast<size_t>(i));
      if (o.is_value() && o.value()->is_tensor()) check_no_partial_overlap(*out, *env.tensor(o));
    }
  }

  ElementwiseParams p =
      make_params(env, node, typing.compute, typing.device.kind == Device::Kind::kCuda);
  const Kernel& kernel = kernel_for(fid);
  // Every value is computed before any is stored: an in-place op may read what it overwrites.
  std::vector<double> fvalues;
  std::vector<int64_t> ivalues;
  if (floating)
    fvalues = compute<double>(env, node, typing, kernel.f, p);
  else
    ivalues = compute<int64_t>(env, node, typing, kernel.i, p);

  if (!out) out = allocate_output(env, node, typing);
  std::vector<int64_t> idx = out->element_indices();
  Storage& storage = *out->storage;
  for (size_t k = 0; k < idx.size(); ++k) {
    if (floating)
      storage.store_double(idx[k], fvalues[k]);
    else
      storage.store_int(idx[k], ivalues[k]);
  }
  env.bind(node.outputs[0], out);
}

}  // namespace kiln
