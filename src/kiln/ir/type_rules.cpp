// The type rule of every op in ops.def: output shapes and dtypes exactly as PyTorch computes
// them, and a UserError (naming the op, the source line and the fix) where PyTorch would raise.
#include "kiln/ir/type_rules.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kiln/ir/parser.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {

using Args = std::span<const Operand>;

const TensorType& tensor(Args args, size_t i) {
  return args[i].value()->tensor_type();
}

TensorType make(DType dtype, Shape shape, Device device) {
  return TensorType{dtype, std::move(shape), device, std::nullopt};
}

TensorType like(const TensorType& t) {
  return make(t.dtype, t.shape, t.device);
}

// PyTorch's combine_categories: how a higher-priority group's dtype combines with a lower one's.
std::optional<DType> combine(std::optional<DType> higher, std::optional<DType> lower) {
  if (!higher) return lower;
  if (!lower) return higher;
  if (is_floating(*higher)) return higher;
  if (*higher == DType::kBool || is_floating(*lower)) return promote_types(*higher, *lower);
  return higher;
}

std::optional<DType> promote_opt(std::optional<DType> acc, DType d) {
  return acc ? promote_types(*acc, d) : d;
}

std::string dtype_list(std::span<const Operand> args) {
  std::string s;
  for (const Operand& a : args) {
    if (!a.is_value()) continue;
    if (!s.empty()) s += ", ";
    s += a.value()->is_tensor() ? std::string(dtype_name(a.value()->tensor_type().dtype))
                                : a.value()->scalar_type().str();
  }
  return s;
}

}  // namespace

std::vector<EagerResult> parse_eager_results(const std::string& text) {
  std::vector<EagerResult> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(';', at);
    if (end == std::string::npos) end = text.size();
    std::string entry = text.substr(at, end - at);
    at = end + 1;
    entry.erase(0, entry.find_first_not_of(' '));
    Type type;
    KILN_CHECK(parse_type(entry, &type) && std::holds_alternative<TensorType>(type) &&
               std::get<TensorType>(type).layout.has_value())
        << "'" << entry
        << "' is not a result type with its layout (cpu f32[3, 4] strides=(4, 1) offset=0)";
    TensorType t = std::get<TensorType>(type);
    std::vector<int64_t> strides = t.layout->strides;
    t.layout.reset();
    out.push_back(EagerResult{std::move(t), std::move(strides)});
  }
  return out;
}

DType result_type(std::span<const Operand> operands) {
  std::optional<DType> dim_result, zero_result, wrapped_result;
  for (const Operand& op : operands) {
    if (op.is_value() && op.value()->is_tensor()) {
      const TensorType& t = op.value()->tensor_type();
      if (t.rank() > 0)
        dim_result = promote_opt(dim_result, t.dtype);
      else
        zero_result = promote_opt(zero_result, t.dtype);
    } else if (op.is_value()) {
      wrapped_result = promote_opt(wrapped_result, op.value()->scalar_type().default_dtype());
    } else if (op.is_constant() && is_number(op.constant())) {
      const Constant& c = op.constant();
      DType d = std::holds_alternative<bool>(c)      ? DType::kBool
                : std::holds_alternative<int64_t>(c) ? DType::kInt64
                                                     : kDefaultFloat;
      wrapped_result = promote_opt(wrapped_result, d);
    }
  }
  auto r = combine(dim_result, combine(zero_result, wrapped_result));
  KILN_ASSERT(r.has_value()) << "result_type of no operands";
  return *r;
}

namespace {
// Argument checks eager makes beyond dtypes: alpha's kind, gelu's approximation, integer powers.
void check_elementwise_arguments(const OpInfo& op, Args args, const ElementwiseTyping& r) {
  int alpha_i = op.param_index("alpha");
  if (alpha_i >= 0 && args[static_cast<size_t>(alpha_i)].is_constant()) {
    const Constant& alpha = args[static_cast<size_t>(alpha_i)].constant();
    KILN_CHECK(r.common == DType::kBool || !std::holds_alternative<bool>(alpha))
        << "Boolean alpha only supported for Boolean results; pass a number.";
    KILN_CHECK(r.common != DType::kBool || std::holds_alternative<bool>(alpha) ||
               number_as_double(alpha) == 1.0)
        << "Boolean alpha only supported for Boolean results; convert the tensors first.";
    KILN_CHECK(!is_integral(r.common, true) || !std::holds_alternative<double>(alpha))
        << "for integral input tensors, argument alpha must not be a floating point number; "
           "pass an int alpha or convert the tensors to floating point.";
  }
  if (op.functional_form == OpId::kGelu) {
    const std::string& a = args[static_cast<size_t>(op.param_index("approximate"))].as_string();
    KILN_CHECK(a == "none" || a == "tanh")
        << "gelu approximate must be 'none' or 'tanh', got '" << a << "'.";
  }
  if (op.functional_form == OpId::kPow && is_integral(r.out, true) && args[1].is_constant()) {
    const Constant& e = args[1].constant();
    KILN_CHECK(!std::holds_alternative<int64_t>(e) || std::get<int64_t>(e) >= 0)
        << "Integers to negative integer powers are not allowed; convert the base to floating "
           "point first.";
  }
}
}  // namespace

ElementwiseTyping elementwise_typing(const OpInfo& op, Args args) {
  // The operands: the first `arity` parameters. where's condition does not take part in
  // promotion; clamp's None bounds are absent.
  std::vector<Operand> promoted;
  Shape shape;
  std::optional<Device> device;
  bool first_shape = true;
  for (int i = 0; i < op.arity; ++i) {
    const Operand& a = args[static_cast<size_t>(i)];
    if (a.is_none()) continue;
    if (!(op.dtype_rule == DTypeRule::kWhere && i == 0)) promoted.push_back(a);
    if (a.is_value() && a.value()->is_tensor()) {
      const TensorType& t = a.value()->tensor_type();
      shape = first_shape ? t.shape : broadcast_shapes(shape, t.shape);
      first_shape = false;
      if (t.rank() > 0 || !device) {
        if (device && t.rank() > 0 && *device != t.device) {
          KILN_CHECK(false) << "expected all tensors to be on the same device, but found "
                            << device->str() << " and " << t.device.str()
                            << "; move them to one device with .to(device).";
        }
        if (t.rank() > 0 || !device) device = t.device;
      }
    }
  }
  ElementwiseTyping r;
  r.common = result_type(promoted);
  r.shape = shape;
  r.device = device.value_or(Device::cpu());
  const std::string& name = op_info(op.functional_form).name;
  auto floatify = [](DType d) { return is_floating(d) ? d : kDefaultFloat; };
  switch (op.dtype_rule) {
    case DTypeRule::kUnarySame:
      KILN_CHECK(r.common != DType::kBool)
          << name << " does not support bool tensors (got " << dtype_list(args)
          << "); convert with .to(torch.int64) or .float() first.";
      r.out = r.common;
      break;
    case DTypeRule::kUnarySameOrBool:
    case DTypeRule::kArith:
      r.out = r.common;
      break;
    case DTypeRule::kArithNoBool:
      KILN_CHECK(r.common != DType::kBool)
          << "subtraction of two bool tensors is not supported; use logical_xor() instead.";
      r.out = r.common;
      break;
    case DTypeRule::kUnaryFloat:
    case DTypeRule::kBinaryFloat:
      r.out = floatify(r.common);
      break;
    case DTypeRule::kUnaryFloatOnly:
    case DTypeRule::kFloatOnly:
      KILN_CHECK(is_floating(r.common)) << name << " needs floating-point tensors, but got "
                                        << dtype_list(args) << "; convert with .float() first.";
      r.out = r.common;
      break;
    case DTypeRule::kUnaryToBool:
    case DTypeRule::kCompare:
    case DTypeRule::kLogical:
      r.out = DType::kBool;
      break;
    case DTypeRule::kUnaryIntegral:
    case DTypeRule::kBitwise:
      KILN_CHECK(is_integral(r.common, true))
          << name << " needs integer or bool tensors, but got " << dtype_list(args)
          << "; convert with .to(torch.int64) first.";
      r.out = r.common;
      break;
    case DTypeRule::kDiv: {
      const Operand& mode = args[static_cast<size_t>(op.param_index("rounding_mode"))];
      if (mode.is_none()) {
        r.out = floatify(r.common);
      } else {
        const std::string& m = mode.as_string();
        KILN_CHECK(m == "trunc" || m == "floor")
            << "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '" << m
            << "'.";
        r.out = r.common;
      }
      break;
    }
    case DTypeRule::kWhere:
      KILN_CHECK(tensor(args, 0).dtype == DType::kBool)
          << "where expected a bool condition, but got " << dtype_name(tensor(args, 0).dtype)
          << "; compare first (x > 0) or convert with .bool().";
      r.out = r.common;
      break;
    case DTypeRule::kClamp:
      KILN_CHECK(!args[1].is_none() || !args[2].is_none())
          << "clamp needs at least one of 'min' or 'max'; pass a bound.";
      r.out = r.common;
      break;
    case DTypeRule::kCast:
      r.out = args[1].as_dtype();
      break;
    case DTypeRule::kNotElementwise:
      KILN_ASSERT(false) << name << " is not elementwise";
  }
  check_elementwise_arguments(op, args, r);
  bool compare = op.dtype_rule == DTypeRule::kCompare || op.dtype_rule == DTypeRule::kLogical ||
                 op.dtype_rule == DTypeRule::kUnaryToBool;
  r.compute = compare ? r.common : r.out;
  if (op.dtype_rule == DTypeRule::kCast) r.compute = tensor(args, 0).dtype;
  return r;
}

std::vector<TensorType> infer_elementwise(const OpInfo& op, Args args) {
  ElementwiseTyping t = elementwise_typing(op, args);
  if (!op.is_inplace_elementwise()) return {make(t.out, t.shape, t.device)};
  const TensorType& self = tensor(args, 0);
  KILN_CHECK(t.shape == self.shape)
      << "output with shape " << shape_str(self.shape) << " doesn't match the broadcast shape "
      << shape_str(t.shape) << "; an in-place op cannot grow its target, use the out-of-place "
      << op_info(op.functional_form).name << " instead.";
  KILN_CHECK(can_cast(t.out, self.dtype))
      << "result type " << dtype_name(t.out) << " can't be cast to the desired output type "
      << dtype_name(self.dtype) << "; use the out-of-place " << op_info(op.functional_form).name
      << " or convert the target to " << dtype_name(t.out) << " first.";
  return {like(self)};
}

// ---- creation ---------------------------------------------------------------------------------

namespace {
void check_sizes(const IntList& size) {
  for (int64_t s : size)
    KILN_CHECK(s >= 0) << "negative dimension " << s << " in size " << shape_str(size)
                       << "; sizes must be >= 0.";
}
DType number_dtype(const Operand& v) {
  if (v.is_value()) {
    if (v.value()->is_tensor()) return v.value()->tensor_type().dtype;
    return v.value()->scalar_type().default_dtype();
  }
  const Constant& c = v.constant();
  if (std::holds_alternative<bool>(c)) return DType::kBool;
  if (std::holds_alternative<int64_t>(c)) return DType::kInt64;
  return kDefaultFloat;
}
}  // namespace

std::vector<TensorType> infer_full(const OpInfo&, Args args) {
  check_sizes(args[0].as_ints());
  DType d = args[2].as_optional_dtype().value_or(number_dtype(args[1]));
  return {make(d, args[0].as_ints(), args[3].as_device())};
}

std::vector<TensorType> infer_zeros_ones(const OpInfo&, Args args) {
  check_sizes(args[0].as_ints());
  return {make(args[1].as_optional_dtype().value_or(kDefaultFloat), args[0].as_ints(),
               args[2].as_device())};
}

std::vector<TensorType> infer_like(const OpInfo& op, Args args) {
  const TensorType& self = tensor(args, 0);
  const Operand& dtype = args[static_cast<size_t>(op.param_index("dtype"))];
  return {make(dtype.as_optional_dtype().value_or(self.dtype), self.shape, self.device)};
}

std::vector<TensorType> infer_arange(const OpInfo&, Args args) {
  for (int i = 0; i < 3; ++i) {
    KILN_CHECK(args[static_cast<size_t>(i)].is_constant())
        << "arange needs its start, end and step as numbers known at trace time, but '"
        << args[static_cast<size_t>(i)].value()->name()
        << "' is an input; pass a Python number instead.";
  }
  double start = number_as_double(args[0].constant());
  double end = number_as_double(args[1].constant());
  double step = number_as_double(args[2].constant());
  KILN_CHECK(step != 0) << "arange step must be nonzero; pass a nonzero step.";
  KILN_CHECK((step > 0 && end >= start) || (step < 0 && end <= start))
      << "upper bound and larger bound inconsistent with step sign (start " << start << ", end "
      << end << ", step " << step << "); flip the step or the bounds.";
  bool any_float = false;
  for (int i = 0; i < 3; ++i)
    any_float =
        any_float || std::holds_alternative<double>(args[static_cast<size_t>(i)].constant());
  DType d = args[3].as_optional_dtype().value_or(any_float ? kDefaultFloat : DType::kInt64);
  auto n = static_cast<int64_t>(std::ceil((end - start) / step));
  return {make(d, {n}, args[4].as_device())};
}

std::vector<TensorType> infer_fill(const OpInfo& op, Args args) {
  const Operand& v = args[1];
  if (v.is_value() && v.value()->is_tensor()) {
    KILN_CHECK(v.value()->tensor_type().rank() == 0)
        << op.name << " only supports a 0-dimensional value tensor, but got one with shape "
        << shape_str(v.value()->tensor_type().shape) << "; use copy_ to write a whole tensor.";
  }
  return {like(tensor(args, 0))};
}

std::vector<TensorType> infer_fill_(const OpInfo& op, Args args) {
  return infer_fill(op, args);
}

// ---- reductions -------------------------------------------------------------------------------

std::vector<int64_t> reduction_dims(const std::optional<IntList>& dims, int64_t rank) {
  std::vector<int64_t> out;
  if (!dims || dims->empty()) {
    for (int64_t i = 0; i < rank; ++i)
      out.push_back(i);
    return out;
  }
  for (int64_t d : *dims) {
    int64_t w = wrap_dim(d, rank);
    KILN_CHECK(std::find(out.begin(), out.end(), w) == out.end())
        << "dim " << w << " appears multiple times in the list of dims; list each dim once.";
    out.push_back(w);
  }
  std::sort(out.begin(), out.end());
  if (rank == 0) out.clear();
  return out;
}

std::vector<TensorType> infer_reduction(const OpInfo& op, Args args) {
  const TensorType& self = tensor(args, 0);
  std::optional<IntList> dims = args[1].as_optional_ints();
  bool keepdim = args[static_cast<size_t>(op.param_index("keepdim"))].as_bool();
  std::vector<int64_t> reduced = reduction_dims(dims, self.rank());
  bool all = !dims || dims->empty();
  DType out = self.dtype;
  int dtype_i = op.param_index("dtype");
  std::optional<DType> requested =
      dtype_i >= 0 ? args[static_cast<size_t>(dtype_i)].as_optional_dtype() : std::nullopt;
  switch (op.id) {
    case OpId::kSum:
    case OpId::kProd:
      out = requested.value_or(is_integral(self.dtype, true) ? DType::kInt64 : self.dtype);
      break;
    case OpId::kMean:
      out = requested.value_or(self.dtype);
      KILN_CHECK(is_floating(out))
          << "mean could not infer an output dtype: the input dtype must be floating point, got "
          << dtype_name(self.dtype) << "; pass dtype=torch.float32 or convert with .float().";
      break;
    case OpId::kVar:
    case OpId::kStd:
      KILN_CHECK(is_floating(self.dtype))
          << op.name << " needs a floating-point input, got " << dtype_name(self.dtype)
          << "; convert with .float() first.";
      break;
    case OpId::kArgmax:
    case OpId::kArgmin:
      out = DType::kInt64;
      break;
    default:
      break;
  }
  if (op.id == OpId::kAmax || op.id == OpId::kAmin || op.id == OpId::kArgmax ||
      op.id == OpId::kArgmin) {
    for (int64_t d : reduced) {
      KILN_CHECK(self.shape[static_cast<size_t>(d)] != 0)
          << op.name << " cannot reduce over a dimension of size 0 (dim " << d
          << "); it has no identity.";
    }
    if (all) KILN_CHECK(self.numel() != 0) << op.name << " of an empty tensor has no identity.";
  }
  Shape shape;
  for (int64_t i = 0; i < self.rank(); ++i) {
    bool r = std::find(reduced.begin(), reduced.end(), i) != reduced.end();
    if (!r)
      shape.push_back(self.shape[static_cast<size_t>(i)]);
    else if (keepdim)
      shape.push_back(1);
  }
  return {make(out, shape, self.device)};
}

// ---- views ------------------------------------------------------------------------------------

Shape infer_view_size(const IntList& size, int64_t numel) {
  Shape shape(size.begin(), size.end());
  int64_t infer_at = -1, known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      KILN_CHECK(infer_at < 0) << "only one dimension can be inferred (-1) in shape "
                               << shape_str(size) << "; give the other sizes explicitly.";
      infer_at = static_cast<int64_t>(i);
    } else {
      KILN_CHECK(shape[i] >= 0) << "invalid shape dimension " << shape[i] << " in "
                                << shape_str(size) << "; sizes must be >= 0 or -1.";
      known *= shape[i];
    }
  }
  if (infer_at >= 0) {
    KILN_CHECK(known != 0 && numel % known == 0)
        << "shape '" << shape_str(size) << "' is invalid for input of size " << numel
        << "; the sizes must multiply to " << numel << ".";
    shape[static_cast<size_t>(infer_at)] = numel / known;
  } else {
    KILN_CHECK(known == numel) << "shape '" << shape_str(size) << "' is invalid for input of size "
                               << numel << "; the sizes must multiply to " << numel << ".";
  }
  return shape;
}

std::vector<TensorType> infer_view(const OpInfo&, Args args) {
  const TensorType& self = tensor(args, 0);
  return {make(self.dtype, infer_view_size(args[1].as_ints(), self.numel()), self.device)};
}

std::vector<TensorType> infer_permute(const OpInfo&, Args args) {
  const TensorType& self = tensor(args, 0);
  const IntList& dims = args[1].as_ints();
  KILN_CHECK(static_cast<int64_t>(dims.size()) == self.rank())
      << "the number of dims in " << shape_str(dims) << " doesn't match the tensor's rank "
      << self.rank() << "; list every dim once.";
  std::vector<bool> seen(dims.size(), false);
  Shape shape;
  for (int64_t d : dims) {
    int64_t w = wrap_dim(d, self.rank());
    KILN_CHECK(!seen[static_cast<size_t>(w)])
        << "repeated dim " << w << " in permute " << shape_str(dims) << "; list every dim once.";
    seen[static_cast<size_t>(w)] = true;
    shape.push_back(self.shape[static_cast<size_t>(w)]);
  }
  return {make(self.dtype, shape, self.device)};
}

std::vector<TensorType> infer_transpose(const OpInfo&, Args args) {
  const TensorType& self = tensor(args, 0);
  Shape shape = self.shape;
  if (self.rank() == 0) {
    wrap_dim(args[1].as_int(), 0);
    wrap_dim(args[2].as_int(), 0);
    return {like(self)};
  }
  int64_t a = wrap_dim(args[1].as_int(), self.rank());
  int64_t b = wrap_dim(args[2].as_int(), self.rank());
  std::swap(shape[static_cast<size_t>(a)], shape[static_cast<size_t>(b)]);
  return {make(self.dtype, shape, self.device)};
}

std::vector<TensorType> infer_t(const OpInfo& op, Args args) {
  const TensorType& self = tensor(args, 0);
  KILN_CHECK(self.rank() <= 2) << op.name << " expects a tensor with <= 2 dimensions, but it has "
                               << self.rank() << "; use transpose(dim0, dim1) or permute.";
  Shape shape = self.shape;
  std::reverse(shape.begin(), shape.end());
  return {make(self.dtype, shape, self.device)};
}

std::vector<TensorType> infer_expand(const OpInfo&, Args args) {
  const TensorType& self = tensor(args, 0);
  const IntList& size = args[1].as_ints();
  KILN_CHECK(static_cast<int64_t>(size.size()) >= self.rank())
      << "the number of sizes provided (" << size.size()
      << ") must be greater or equal to the number of dimensions in the tensor (" << self.rank()
      << ").";
  Shape shape(size.size());
  size_t lead = size.size() - self.shape.size();
  for (size_t i = 0; i < size.size(); ++i) {
    if (i < lead) {
      KILN_CHECK(size[i] >= 0) << "the expanded size " << size[i]
                               << " is not allowed in a leading, non-existing dimension " << i
                               << "; give a size >= 0.";
      shape[i] = size[i];
      continue;
    }
    int64_t have = self.shape[i - lead];
    int64_t want = size[i] == -1 ? have : size[i];
    KILN_CHECK(have == want || have == 1)
        << "the expanded size of the tensor (" << want << ") must match the existing size (" << have
        << ") at non-singleton dimension " << i << "; only size-1 dims can expand.";
    shape[i] = want;
  }
  return {make(self.dtype, shape, self.device)};
}

std::vector<TensorType> infer_unsqueeze(const OpInfo&, Args args) {
  const TensorType& self = tensor(args, 0);
  int64_t d = wrap_dim(args[1].as_int(), self.rank() + 1);
  Shape shape = self.shape;
  shape.insert(shape.begin() + d, 1);
  return {make(self.dtype, shape, self.device)};
}

std::vector<TensorType> infer_squeeze(const OpInfo&, Args args) {
  const TensorType& self = tensor(args, 0);
  std::optional<IntList> dims = args[1].as_optional_ints();
  std::vector<bool> drop(self.shape.size(), false);
  if (!dims) {
    for (size_t i = 0; i < self.shape.size(); ++i)
      drop[i] = self.shape[i] == 1;
  } else {
    for (int64_t d : *dims) {
      int64_t w = wrap_dim(d, self.rank());
      if (self.rank() > 0) drop[static_cast<size_t>(w)] = self.shape[static_cast<size_t>(w)] == 1;
    }
  }
  Shape shape;
  for (size_t i = 0; i < self.shape.size(); ++i)
    if (!drop[i]) shape.push_back(self.shape[i]);
  return {make(self.dtype, shape, self.device)};
}

std::vector<TensorType> infer_flatten(const OpInfo&, Args args) {
  const TensorType& self = tensor(args, 0);
  if (self.rank() == 0) {
    wrap_dim(args[1].as_int(), 0);
    wrap_dim(args[2].as_int(), 0);
    return {make(self.dtype, {1}, self.device)};
  }
  int64_t s = wrap_dim(args[1].as_int(), self.rank());
  int64_t e = wrap_dim(args[2].as_int(), self.rank());
  KILN_CHECK(s <= e) << "flatten() has invalid args: start_dim (" << s
                     << ") cannot come after end_dim (" << e << ").";
  Shape shape(self.shape.begin(), self.shape.begin() + s);
  int64_t n = 1;
  for (int64_t i = s; i <= e; ++i)
    n *= self.shape[static_cast<size_t>(i)];
  shape.push_back(n);
  shape.insert(shape.end(), self.shape.begin() + e + 1, self.shape.end());
  return {make(self.dtype, shape, self.device)};
}

std::vector<TensorType> infer_unflatten(const OpInfo&, Args args) {
  const TensorType& self = tensor(args, 0);
  int64_t d = wrap_dim(args[1].as_int(), self.rank());
  KILN_CHECK(!args[2].as_ints().empty()) << "unflatten needs a non-empty list of sizes.";
  Shape inner = infer_view_size(args[2].as_ints(), self.shape[static_cast<size_t>(d)]);
  Shape shape(self.shape.begin(), self.shape.begin() + d);
  shape.insert(shape.end(), inner.begin(), inner.end());
  shape.insert(shape.end(), self.shape.begin() + d + 1, self.shape.end());
  return {make(self.dtype, shape, self.device)};
}

void normalize_slice(int64_t size, std::optional<int64_t> start, std::optional<int64_t> end,
                     int64_t* out_start, int64_t* out_end) {
  int64_t s = start.value_or(0), e = end.value_or(size);
  if (s < 0) s += size;
  if (e < 0) e += size;
  s = std::clamp<int64_t>(s, 0, size);
  e = std::clamp<int64_t>(e, 0, size);
  if (e < s) e = s;
  *out_start = s;
  *out_end = e;
}

int64_t slice_length(int64_t start, int64_t end, int64_t step) {
  return end > start ? (end - start + step - 1) / step : 0;
}

namespace {
Shape sliced_shape(const TensorType& self, Args args) {
  KILN_CHECK(self.rank() > 0) << "slice() cannot be applied to a 0-dim tensor.";
  int64_t d = wrap_dim(args[1].as_int(), self.rank());
  int64_t step = args[4].as_int();
  KILN_CHECK(step > 0) << "slice step must be positive, got " << step
                       << "; flip the tensor with torch.flip instead of a negative step.";
  int64_t s, e;
  normalize_slice(self.shape[static_cast<size_t>(d)], args[2].as_optional_int(),
                  args[3].as_optional_int(), &s, &e);
  Shape shape = self.shape;
  shape[static_cast<size_t>(d)] = slice_length(s, e, step);
  return shape;
}

Shape selected_shape(const TensorType& self, int64_t dim, int64_t index) {
  KILN_CHECK(self.rank() > 0) << "select() cannot be applied to a 0-dim tensor.";
  int64_t d = wrap_dim(dim, self.rank());
  int64_t size = self.shape[static_cast<size_t>(d)];
  KILN_CHECK(index >= -size && index < size)
      << "index " << index << " is out of range for dimension " << d << " with size " << size
      << "; use an index in [" << -size << ", " << size - 1 << "].";
  Shape shape = self.shape;
  shape.erase(shape.begin() + d);
  return shape;
}

Shape diagonal_shape(const TensorType& self, int64_t offset, int64_t dim1, int64_t dim2) {
  int64_t d1 = wrap_dim(dim1, self.rank()), d2 = wrap_dim(dim2, self.rank());
  KILN_CHECK(d1 != d2) << "diagonal dimensions cannot be identical (" << dim1 << ", " << dim2
                       << "); pass two different dims.";
  int64_t len = diagonal_length(self.shape, offset, d1, d2);
  Shape shape;
  for (int64_t i = 0; i < self.rank(); ++i)
    if (i != d1 && i != d2) shape.push_back(self.shape[static_cast<size_t>(i)]);
  shape.push_back(len);
  return shape;
}

void check_as_strided(const IntList& size, const IntList& stride, std::optional<int64_t> offset) {
  KILN_CHECK(size.size() == stride.size())
      << "mismatch in length of strides and shape (" << stride.size() << " strides for "
      << size.size() << " sizes); give one stride per size.";
  check_sizes(size);
  for (int64_t s : stride)
    KILN_CHECK(s >= 0) << "negative strides are not supported (got " << s << ").";
  if (offset) KILN_CHECK(*offset >= 0) << "storage_offset must be >= 0, got " << *offset << ".";
}

void check_same_shape(const std::string& what, const Shape& expected, const TensorType& src) {
  KILN_CHECK(src.shape == expected)
      << "expected src to have a size equal to the " << what << " of self " << shape_str(expected)
      << ", but got " << shape_str(src.shape) << "; make src that shape.";
}
}  // namespace

std::vector<TensorType> infer_slice(const OpInfo&, Args args) {
  const TensorType& self = tensor(args, 0);
  return {make(self.dtype, sliced_shape(self, args), self.device)};
}

std::vector<TensorType> infer_narrow(const OpInfo&, Args args) {
  const TensorType& self = tensor(args, 0);
  KILN_CHECK(self.rank() > 0) << "narrow() cannot be applied to a 0-dim tensor.";
  int64_t d = wrap_dim(args[1].as_int(), self.rank());
  int64_t size = self.shape[static_cast<size_t>(d)];
  int64_t start = args[2].as_int(), length = args[3].as_int();
  KILN_CHECK(start >= -size && start <= size)
      << "start (" << start << ") is out of range for dimension " << d << " of size " << size
      << ".";
  if (start < 0) start += size;
  KILN_CHECK(length >= 0 && start + length <= size)
      << "start (" << start << ") + length (" << length << ") exceeds dimension size (" << size
      << ").";
  Shape shape = self.shape;
  shape[static_cast<size_t>(d)] = length;
  return {make(self.dtype, shape, self.device)};
}

std::vector<TensorType> infer_select(const OpInfo&, Args args) {
  const TensorType& self = tensor(args, 0);
  return {make(self.dtype, selected_shape(self, args[1].as_int(), args[2].as_int()), self.device)};
}

std::vector<IndexStep> lower_index_key(const Shape& shape, const IndexKey& key, Shape* result) {
  int64_t consumed = 0, ellipses = 0;
  for (const IndexItem& it : key) {
    if (it.kind == IndexItem::Kind::kInt || it.kind == IndexItem::Kind::kSlice) ++consumed;
    if (it.kind == IndexItem::Kind::kEllipsis) ++ellipses;
  }
  KILN_CHECK(ellipses <= 1) << "an index can only have a single ellipsis ('...').";
  auto rank = static_cast<int64_t>(shape.size());
  KILN_CHECK(consumed <= rank) << "too many indices for tensor of dimension " << rank << " ("
                               << consumed << " given); index at most " << rank << " dims.";
  std::vector<IndexStep> steps;
  Shape cur = shape;
  int64_t dim = 0;  // position in the current (partially indexed) shape
  for (const IndexItem& it : key) {
    switch (it.kind) {
      case IndexItem::Kind::kInt: {
        int64_t size = cur[static_cast<size_t>(dim)];
        KILN_CHECK(it.index >= -size && it.index < size)
            << "index " << it.index << " is out of bounds for dimension " << dim << " with size "
            << size << "; use an index in [" << -size << ", " << size - 1 << "].";
        int64_t idx = it.index < 0 ? it.index + size : it.index;
        steps.push_back({OpId::kSelect, dim, idx, 0, 1});
        cur.erase(cur.begin() + dim);
        break;
      }
      case IndexItem::Kind::kSlice: {
        int64_t step = it.step.value_or(1);
        KILN_CHECK(step > 0) << "slice step must be positive, got " << step
                             << "; flip the tensor with torch.flip instead of a negative step.";
        int64_t s, e;
        normalize_slice(cur[static_cast<size_t>(dim)], it.start, it.stop, &s, &e);
        steps.push_back({OpId::kSlice, dim, s, e, step});
        cur[static_cast<size_t>(dim)] = slice_length(s, e, step);
        ++dim;
        break;
      }
      case IndexItem::Kind::kNone:
        steps.push_back({OpId::kUnsqueeze, dim, 0, 0, 1});
        cur.insert(cur.begin() + dim, 1);
        ++dim;
        break;
      case IndexItem::Kind::kEllipsis:
        dim += rank - consumed;
        break;
    }
  }
  if (result) *result = cur;
  return steps;
}

std::vector<TensorType> infer_getitem(const OpInfo&, Args args) {
  const TensorType& self = tensor(args, 0);
  Shape shape;
  lower_index_key(self.shape, args[1].as_index(), &shape);
  return {make(self.dtype, shape, self.device)};
}

int64_t diagonal_length(const Shape& shape, int64_t offset, int64_t d1, int64_t d2) {
  int64_t s1 = shape[static_cast<size_t>(d1)], s2 = shape[static_cast<size_t>(d2)];
  int64_t len = offset >= 0 ? std::min(s1, s2 - offset) : std::min(s1 + offset, s2);
  return std::max<int64_t>(len, 0);
}

std::vector<TensorType> infer_diagonal(const OpInfo&, Args args) {
  const TensorType& self = tensor(args, 0);
  return {make(self.dtype,
               diagonal_shape(self, args[1].as_int(), args[2].as_int(), args[3].as_int()),
               self.device)};
}

std::vector<TensorType> infer_as_strided(const OpInfo&, Args args) {
  const TensorType& self = tensor(args, 0);
  check_as_strided(args[1].as_ints(), args[2].as_ints(), args[3].as_optional_int());
  return {make(self.dtype, args[1].as_ints(), self.device)};
}

std::vector<int64_t> split_sizes(int64_t dim_size, const Operand& split_size) {
  std::vector<int64_t> sizes;
  if (split_size.is_constant() && std::holds_alternative<int64_t>(split_size.constant())) {
    int64_t s = split_size.as_int();
    KILN_CHECK(s > 0 || (s == 0 && dim_size == 0))
        << "split expects split_size be positive, but got split_size=" << s << ".";
    if (dim_size == 0) return {0};
    for (int64_t start = 0; start < dim_size; start += s)
      sizes.push_back(std::min(s, dim_size - start));
    return sizes;
  }
  sizes = split_size.as_ints();
  int64_t total = 0;
  for (int64_t s : sizes) {
    KILN_CHECK(s >= 0) << "split_with_sizes expects non-negative sizes, got " << s << ".";
    total += s;
  }
  KILN_CHECK(total == dim_size) << "split_with_sizes expects split_sizes to sum exactly to "
                                << dim_size << " (the size of the split dim), but got "
                                << shape_str(sizes) << ".";
  return sizes;
}

std::vector<int64_t> chunk_sizes(int64_t dim_size, int64_t chunks) {
  KILN_CHECK(chunks > 0) << "chunk expects `chunks` to be greater than 0, got: " << chunks << ".";
  int64_t each = (dim_size + chunks - 1) / chunks;
  return split_sizes(dim_size, Operand(std::max<int64_t>(each, dim_size == 0 ? 0 : 1)));
}

namespace {
std::vector<TensorType> split_along(const TensorType& self, int64_t dim,
                                    const std::vector<int64_t>& sizes) {
  std::vector<TensorType> out;
  for (int64_t s : sizes) {
    Shape shape = self.shape;
    shape[static_cast<size_t>(dim)] = s;
    out.push_back(make(self.dtype, shape, self.device));
  }
  return out;
}
}  // namespace

std::vector<TensorType> infer_split(const OpInfo&, Args args) {
  const TensorType& self = tensor(args, 0);
  KILN_CHECK(self.rank() > 0) << "split expects at least a 1-dimensional tensor.";
  int64_t d = wrap_dim(args[2].as_int(), self.rank());
  return split_along(self, d, split_sizes(self.shape[static_cast<size_t>(d)], args[1]));
}

std::vector<TensorType> infer_chunk(const OpInfo&, Args args) {
  const TensorType& self = tensor(args, 0);
  KILN_CHECK(self.rank() > 0) << "chunk expects at least a 1-dimensional tensor.";
  int64_t d = wrap_dim(args[2].as_int(), self.rank());
  return split_along(self, d, chunk_sizes(self.shape[static_cast<size_t>(d)], args[1].as_int()));
}

std::vector<TensorType> infer_unbind(const OpInfo&, Args args) {
  const TensorType& self = tensor(args, 0);
  KILN_CHECK(self.rank() > 0) << "unbind cannot be applied to a 0-dim tensor.";
  int64_t d = wrap_dim(args[1].as_int(), self.rank());
  Shape shape = self.shape;
  shape.erase(shape.begin() + d);
  return std::vector<TensorType>(static_cast<size_t>(self.shape[static_cast<size_t>(d)]),
                                 make(self.dtype, shape, self.device));
}

std::vector<TensorType> infer_identity(const OpInfo&, Args args) {
  return {like(tensor(args, 0))};
}

// view_dtype and bitcast: the same shape in another dtype. Eager also reinterprets between element
// sizes (the last dim grows or shrinks); kiln keeps to equal sizes, where every element stays one
// element and no layout changes.
std::vector<TensorType> infer_view_dtype(const OpInfo&, Args args) {
  const TensorType& self = tensor(args, 0);
  DType to = args[1].as_dtype();
  KILN_UNSUPPORTED(dtype_size(to) == dtype_size(self.dtype))
      << "viewing a " << dtype_torch_name(self.dtype) << " tensor as " << dtype_torch_name(to)
      << " changes the element size (" << dtype_size(self.dtype) << " to " << dtype_size(to)
      << " bytes); view it outside the compiled function.";
  return {make(to, self.shape, self.device)};
}

// ---- scatters ---------------------------------------------------------------------------------

namespace {
void check_scatter_src(const OpInfo& op, const TensorType& self, const TensorType& src) {
  KILN_CHECK(src.dtype == self.dtype)
      << op.name << " expects src to have self's dtype " << dtype_name(self.dtype) << ", got "
      << dtype_name(src.dtype) << "; convert src with .to().";
  KILN_CHECK(src.device == self.device)
      << op.name << " expects src on " << self.device.str() << ", got " << src.device.str() << ".";
}
}  // namespace

std::vector<TensorType> infer_slice_scatter(const OpInfo& op, Args args) {
  const TensorType& self = tensor(args, 0);
  const TensorType& src = tensor(args, 1);
  check_scatter_src(op, self, src);
  std::vector<Operand> view_args = {args[0], args[2], args[3], args[4], args[5]};
  check_same_shape("slice", sliced_shape(self, view_args), src);
  return {like(self)};
}

std::vector<TensorType> infer_select_scatter(const OpInfo& op, Args args) {
  const TensorType& self = tensor(args, 0);
  const TensorType& src = tensor(args, 1);
  check_scatter_src(op, self, src);
  check_same_shape("selection", selected_shape(self, args[2].as_int(), args[3].as_int()), src);
  return {like(self)};
}

std::vector<TensorType> infer_diagonal_scatter(const OpInfo& op, Args args) {
  const TensorType& self = tensor(args, 0);
  const TensorType& src = tensor(args, 1);
  check_scatter_src(op, self, src);
  check_same_shape("diagonal",
                   diagonal_shape(self, args[2].as_int(), args[3].as_int(), args[4].as_int()), src);
  return {like(self)};
}

std::vector<TensorType> infer_as_strided_scatter(const OpInfo& op, Args args) {
  const TensorType& self = tensor(args, 0);
  const TensorType& src = tensor(args, 1);
  check_scatter_src(op, self, src);
  check_as_strided(args[2].as_ints(), args[3].as_ints(), args[4].as_optional_int());
  check_same_shape("strided view", args[2].as_ints(), src);
  return {like(self)};
}

// ---- mutation ---------------------------------------------------------------------------------

std::vector<TensorType> infer_copy_(const OpInfo&, Args args) {
  const TensorType& self = tensor(args, 0);
  const TensorType& src = tensor(args, 1);
  Shape b = broadcast_shapes(self.shape, src.shape);
  KILN_CHECK(b == self.shape) << "the source of shape " << shape_str(src.shape)
                              << " cannot be broadcast to the target's shape "
                              << shape_str(self.shape) << "; make the shapes match.";
  return {like(self)};
}

std::vector<TensorType> infer_setitem_(const OpInfo&, Args args) {
  const TensorType& self = tensor(args, 0);
  Shape view;
  lower_index_key(self.shape, args[1].as_index(), &view);
  const Operand& value = args[2];
  if (value.is_value() && value.value()->is_tensor()) {
    // Eager drops the value's leading size-1 dims first (x[..., 1] = v with v of shape [1, 3]).
    const TensorType& v = value.value()->tensor_type();
    Shape stripped = v.shape;
    while (!stripped.empty() && stripped.front() == 1)
      stripped.erase(stripped.begin());
    KILN_CHECK(broadcast_shapes(view, stripped) == view)
        << "cannot assign a value of shape " << shape_str(v.shape)
        << " to the indexed region of shape " << shape_str(view)
        << "; make the value broadcastable to it.";
  }
  return {};
}

// ---- joins and opaque ops ---------------------------------------------------------------------

std::vector<TensorType> infer_cat(const OpInfo& op, Args args) {
  const auto& ts = args[0].values();
  KILN_CHECK(!ts.empty()) << op.name << " expects a non-empty list of tensors.";
  const TensorType& first = ts[0]->tensor_type();
  KILN_CHECK(first.rank() > 0) << "zero-dimensional tensor (at position 0) cannot be concatenated.";
  int64_t d = wrap_dim(args[1].as_int(), first.rank());
  Shape shape = first.shape;
  DType dtype = first.dtype;
  shape[static_cast<size_t>(d)] = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    const TensorType& t = ts[i]->tensor_type();
    KILN_CHECK(t.rank() == first.rank())
        << "tensors must have the same number of dimensions: got " << first.rank() << " and "
        << t.rank() << " (at position " << i << ").";
    for (int64_t j = 0; j < t.rank(); ++j) {
      if (j == d) continue;
      KILN_CHECK(t.shape[static_cast<size_t>(j)] == first.shape[static_cast<size_t>(j)])
          << "sizes of tensors must match except in dimension " << d << ": expected size "
          << first.shape[static_cast<size_t>(j)] << " but got " << t.shape[static_cast<size_t>(j)]
          << " for tensor number " << i << " in the list.";
    }
    KILN_CHECK(t.device == first.device) << "expected all tensors to be on the same device.";
    shape[static_cast<size_t>(d)] += t.shape[static_cast<size_t>(d)];
    dtype = promote_types(dtype, t.dtype);
  }
  return {make(dtype, shape, first.device)};
}

std::vector<TensorType> infer_stack(const OpInfo& op, Args args) {
  const auto& ts = args[0].values();
  KILN_CHECK(!ts.empty()) << op.name << " expects a non-empty list of tensors.";
  const TensorType& first = ts[0]->tensor_type();
  int64_t d = wrap_dim(args[1].as_int(), first.rank() + 1);
  DType dtype = first.dtype;
  for (size_t i = 0; i < ts.size(); ++i) {
    const TensorType& t = ts[i]->tensor_type();
    KILN_CHECK(t.shape == first.shape)
        << "stack expects each tensor to be equal size, but got " << shape_str(first.shape)
        << " at entry 0 and " << shape_str(t.shape) << " at entry " << i << ".";
    dtype = promote_types(dtype, t.dtype);
  }
  Shape shape = first.shape;
  shape.insert(shape.begin() + d, static_cast<int64_t>(ts.size()));
  return {make(dtype, shape, first.device)};
}

namespace {
void check_matmul_operands(const OpInfo& op, const TensorType& a, const TensorType& b) {
  KILN_CHECK(a.dtype == b.dtype) << op.name
                                 << " expects both operands to have the same dtype, but got "
                                 << dtype_name(a.dtype) << " and " << dtype_name(b.dtype)
                                 << "; convert one with .to().";
  KILN_CHECK(a.device == b.device) << op.name << " expects both operands on one device.";
  KILN_CHECK(a.dtype != DType::kBool) << op.name << " does not support bool tensors.";
}
}  // namespace

std::vector<TensorType> infer_matmul(const OpInfo& op, Args args) {
  const TensorType& a = tensor(args, 0);
  const TensorType& b = tensor(args, 1);
  check_matmul_operands(op, a, b);
  KILN_CHECK(a.rank() >= 1 && b.rank() >= 1)
      << "both arguments to matmul need to be at least 1D, but they are " << a.rank() << "D and "
      << b.rank() << "D.";
  int64_t k_a = a.shape.back();
  int64_t k_b = b.rank() == 1 ? b.shape[0] : b.shape[b.shape.size() - 2];
  KILN_CHECK(k_a == k_b) << "mat1 and mat2 shapes cannot be multiplied (" << shape_str(a.shape)
                         << " and " << shape_str(b.shape) << "); the inner sizes must agree.";
  Shape batch_a(a.shape.begin(), a.shape.end() - std::min<int64_t>(a.rank(), 2));
  Shape batch_b(b.shape.begin(), b.shape.end() - std::min<int64_t>(b.rank(), 2));
  Shape shape = broadcast_shapes(batch_a, batch_b);
  if (a.rank() >= 2) shape.push_back(a.shape[a.shape.size() - 2]);
  if (b.rank() >= 2) shape.push_back(b.shape.back());
  return {make(a.dtype, shape, a.device)};
}

std::vector<TensorType> infer_eager_call(const OpInfo&, Args args) {
  std::vector<TensorType> out;
  for (const EagerResult& r : parse_eager_results(args[2].as_string()))
    out.push_back(r.type);
  return out;
}

std::vector<TensorType> infer_bmm(const OpInfo& op, Args args) {
  const TensorType& a = tensor(args, 0);
  const TensorType& b = tensor(args, 1);
  check_matmul_operands(op, a, b);
  KILN_CHECK(a.rank() == 3 && b.rank() == 3)
      << "bmm expects 3D tensors, but got " << a.rank() << "D and " << b.rank() << "D.";
  KILN_CHECK(a.shape[0] == b.shape[0] && a.shape[2] == b.shape[1])
      << "bmm got incompatible shapes " << shape_str(a.shape) << " and " << shape_str(b.shape)
      << "; expected [b, n, m] and [b, m, p].";
  return {make(a.dtype, {a.shape[0], a.shape[1], b.shape[2]}, a.device)};
}

std::vector<TensorType> infer_linear(const OpInfo& op, Args args) {
  const TensorType& x = tensor(args, 0);
  const TensorType& w = tensor(args, 1);
  check_matmul_operands(op, x, w);
  KILN_CHECK(w.rank() == 2 && x.rank() >= 1 && x.shape.back() == w.shape[1])
      << "linear got input " << shape_str(x.shape) << " and weight " << shape_str(w.shape)
      << "; expected input [..., in] and weight [out, in].";
  Shape shape = x.shape;
  shape.back() = w.shape[0];
  if (!args[2].is_none()) {
    const TensorType& bias = tensor(args, 2);
    KILN_CHECK(broadcast_shapes(shape, bias.shape) == shape)
        << "linear bias of shape " << shape_str(bias.shape) << " does not match the output "
        << shape_str(shape) << ".";
    KILN_CHECK(bias.dtype == x.dtype) << "linear bias must have the input's dtype.";
  }
  return {make(x.dtype, shape, x.device)};
}

// ---- decomposed ops ---------------------------------------------------------------------------

std::vector<TensorType> infer_softmax(const OpInfo& op, Args args) {
  const TensorType& self = tensor(args, 0);
  wrap_dim(args[1].as_int(), self.rank());
  DType d = args[2].as_optional_dtype().value_or(self.dtype);
  KILN_CHECK(is_floating(d)) << op.name << " needs a floating-point input, got " << dtype_name(d)
                             << "; pass dtype=torch.float32.";
  return {make(d, self.shape, self.device)};
}

std::vector<TensorType> infer_norm(const OpInfo& op, Args args) {
  const TensorType& x = tensor(args, 0);
  const IntList& ns = args[1].as_ints();
  KILN_CHECK(is_floating(x.dtype))
      << op.name << " needs a floating-point input, got " << dtype_name(x.dtype) << ".";
  KILN_CHECK(static_cast<int64_t>(ns.size()) <= x.rank() &&
             std::equal(ns.begin(), ns.end(), x.shape.end() - static_cast<int64_t>(ns.size())))
      << "given normalized_shape=" << shape_str(ns) << ", expected input with shape [*, "
      << shape_str(ns).substr(1) << ", but got input of size " << shape_str(x.shape) << ".";
  for (const char* p : {"weight", "bias"}) {
    int i = op.param_index(p);
    if (i < 0 || args[static_cast<size_t>(i)].is_none()) continue;
    const TensorType& t = tensor(args, static_cast<size_t>(i));
    KILN_CHECK(t.shape == Shape(ns.begin(), ns.end()))
        << "expected " << p << " to be of the normalized shape " << shape_str(ns) << ", but got "
        << shape_str(t.shape) << ".";
  }
  return {like(x)};
}

}  // namespace kiln

namespace kiln {

DType number_operand_dtype(OpId functional, DType compute, bool cuda) {
  if (compute != DType::kFloat16 && compute != DType::kBFloat16) return compute;
  const bool in_math_type = functional == OpId::kMul || functional == OpId::kDiv ||
                            (cuda && (functional == OpId::kAdd || functional == OpId::kSub));
  return in_math_type ? DType::kFloat32 : compute;
}

bool cuda_divides_by_reciprocal(OpId functional, int rounding_mode) {
  return functional == OpId::kDiv && rounding_mode == 0;
}

}  // namespace kiln
