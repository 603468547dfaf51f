// The C++ tracing API (include/kiln/kiln.h): every call becomes one node of the eager trace
// being built by kiln::trace on this thread.
#include <chrono>

#include "kiln/ir/type_rules.h"
#include "kiln/kiln.h"
#include "kiln/support/error.h"

namespace kiln {

namespace detail {

// A traced tensor object: the SSA value that names it now. In-place ops and metadata mutations
// move `value` forward; every copy of the kiln::Tensor shares this Handle.
struct Handle {
  Value* value;
};

namespace {
thread_local Builder* current_builder = nullptr;

Builder& builder() {
  KILN_CHECK(current_builder != nullptr)
      << "a kiln::Tensor op was called outside kiln::trace; call it inside the traced function.";
  return *current_builder;
}

SourceLoc to_loc(const Loc& loc) {
  std::string file = loc.file_name();
  size_t slash = file.rfind('/');
  if (slash != std::string::npos) file = file.substr(slash + 1);
  return SourceLoc{file, static_cast<int>(loc.line()), ""};
}

Tensor wrap(Value* v) {
  return Tensor(std::make_shared<Handle>(Handle{v}));
}

std::vector<Tensor> wrap_all(const std::vector<Value*>& vs) {
  std::vector<Tensor> out;
  for (Value* v : vs)
    out.push_back(wrap(v));
  return out;
}

Tensor call_free(OpId op, std::vector<Operand> args, KeywordArgs kwargs, const Loc& loc) {
  return wrap(builder().call1(op, std::move(args), std::move(kwargs), to_loc(loc)));
}

Operand opt_tensor(const std::optional<Tensor>& t) {
  return t ? Operand(t->value()) : Operand(Constant(NoneValue{}));
}
Operand opt_int(const std::optional<int64_t>& v) {
  return v ? Operand(Constant(*v)) : Operand(Constant(NoneValue{}));
}
Operand opt_ints(const std::optional<IntList>& v) {
  return v ? Operand(Constant(*v)) : Operand(Constant(NoneValue{}));
}
Operand opt_dtype(const std::optional<DType>& v) {
  return v ? Operand(Constant(*v)) : Operand(Constant(NoneValue{}));
}
Operand opt_operand(const std::optional<TensorOrNumber>& v) {
  return v ? v->operand() : Operand(Constant(NoneValue{}));
}
Operand index_key(const std::vector<TensorIndex>& key) {
  IndexKey k;
  for (const TensorIndex& i : key)
    k.push_back(i.item);
  return Operand(Constant(k));
}
std::vector<Value*> values_of(const std::vector<Tensor>& ts) {
  std::vector<Value*> vs;
  for (const Tensor& t : ts)
    vs.push_back(t.value());
  return vs;
}
}  // namespace

Trace trace_impl(const std::vector<TensorSpec>& specs,
                 const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& body) {
  auto start = std::chrono::steady_clock::now();
  Trace trace;
  Builder b(trace);
  KILN_CHECK(current_builder == nullptr)
      << "kiln::trace was called inside a traced function; trace one function at a time.";
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& s = specs[i];
    std::string name = s.name.empty() ? std::string(1, static_cast<char>('a' + i % 26)) +
                                            (i >= 26 ? std::to_string(i / 26) : "")
                                      : s.name;
    TensorType t{s.dtype, s.shape, s.device, s.layout};
    if (s.layout) {
      KILN_CHECK(s.layout->strides.size() == s.shape.size())
          << "input '" << name << "' has " << s.layout->strides.size() << " strides for "
          << s.shape.size() << " dims; give one stride per dim.";
    }
    inputs.push_back(wrap(b.add_input(name, t)));
  }
  current_builder = &b;
  std::vector<Tensor> outs;
  try {
    outs = body(inputs);
  } catch (...) {
    current_builder = nullptr;
    throw;
  }
  current_builder = nullptr;
  b.set_outputs(values_of(outs));
  trace.constructed_by = "trace";
  trace.construction_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return trace;
}

}  // namespace detail

using detail::builder;
using detail::call_free;
using detail::opt_dtype;
using detail::opt_int;
using detail::opt_ints;
using detail::opt_operand;
using detail::opt_tensor;
using detail::to_loc;
using detail::wrap;

TensorOrNumber::TensorOrNumber(const Tensor& t, Loc loc)
    : tensor(std::make_shared<const Tensor>(t)), loc(loc) {}

Operand TensorOrNumber::operand() const {
  return tensor ? Operand(tensor->value()) : Operand(number);
}

const TensorType& Tensor::type() const {
  return value()->tensor_type();
}

int64_t Tensor::size(int64_t d) const {
  return shape()[static_cast<size_t>(wrap_dim(d, dim()))];
}

Value* Tensor::value() const {
  KILN_CHECK(handle_ != nullptr) << "this kiln::Tensor is empty (default-constructed); assign a "
                                    "traced tensor to it first.";
  return handle_->value;
}

Tensor Tensor::call(OpId op, std::vector<Operand> args, KeywordArgs kwargs, Loc loc) const {
  args.insert(args.begin(), Operand(value()));
  return call_free(op, std::move(args), std::move(kwargs), loc);
}

// An op that returns this very object: the handle now names the op's output.
Tensor Tensor::mutate_like(OpId op, std::vector<Operand> args, Loc loc) const {
  args.insert(args.begin(), Operand(value()));
  handle_->value = builder().call1(op, std::move(args), {}, to_loc(loc));
  return *this;
}

// In-place data and metadata mutations return this same object, now named by the op's output.
Tensor Tensor::mutate(OpId op, std::vector<Operand> args, KeywordArgs kwargs, Loc loc) const {
  args.insert(args.begin(), Operand(value()));
  auto outs = builder().call(op, std::move(args), std::move(kwargs), to_loc(loc));
  if (!outs.empty()) handle_->value = outs[0];
  return *this;
}

// clang-format off
#define KILN_API_UNARY(method, Id)              \
  Tensor Tensor::method(Loc loc) const {        \
    return call(OpId::k##Id, {}, {}, loc);      \
  }                                             \
  Tensor Tensor::method##_(Loc loc) const {     \
    return mutate(OpId::k##Id##_, {}, {}, loc); \
  }
#include "kiln/tensor_methods.def"
// clang-format on

Tensor Tensor::gelu(std::string approximate, Loc loc) const {
  return call(OpId::kGelu, {}, {{"approximate", Constant(approximate)}}, loc);
}
Tensor Tensor::gelu_(std::string approximate, Loc loc) const {
  return mutate(OpId::kGelu_, {}, {{"approximate", Constant(approximate)}}, loc);
}
Tensor Tensor::isnan(Loc loc) const {
  return call(OpId::kIsnan, {}, {}, loc);
}

// clang-format off
#define KILN_API_BINARY(method, Id)                                      \
  Tensor Tensor::method(const TensorOrNumber& other, Loc loc) const {    \
    return call(OpId::k##Id, {other.operand()}, {}, loc);                \
  }                                                                      \
  Tensor Tensor::method##_(const TensorOrNumber& other, Loc loc) const { \
    return mutate(OpId::k##Id##_, {other.operand()}, {}, loc);           \
  }
#include "kiln/tensor_methods.def"
// clang-format on

Tensor Tensor::add(const TensorOrNumber& other, Number alpha, Loc loc) const {
  return call(OpId::kAdd, {other.operand()}, {{"alpha", alpha.value}}, loc);
}
Tensor Tensor::add_(const TensorOrNumber& other, Number alpha, Loc loc) const {
  return mutate(OpId::kAdd_, {other.operand()}, {{"alpha", alpha.value}}, loc);
}
Tensor Tensor::sub(const TensorOrNumber& other, Number alpha, Loc loc) const {
  return call(OpId::kSub, {other.operand()}, {{"alpha", alpha.value}}, loc);
}
Tensor Tensor::sub_(const TensorOrNumber& other, Number alpha, Loc loc) const {
  return mutate(OpId::kSub_, {other.operand()}, {{"alpha", alpha.value}}, loc);
}
namespace {
Operand rounding(const std::optional<std::string>& mode) {
  return mode ? Operand(Constant(*mode)) : Operand(Constant(NoneValue{}));
}
}  // namespace
Tensor Tensor::div(const TensorOrNumber& other, std::optional<std::string> mode, Loc loc) const {
  return call(OpId::kDiv, {other.operand()}, {{"rounding_mode", rounding(mode)}}, loc);
}
Tensor Tensor::div_(const TensorOrNumber& other, std::optional<std::string> mode, Loc loc) const {
  return mutate(OpId::kDiv_, {other.operand()}, {{"rounding_mode", rounding(mode)}}, loc);
}
Tensor Tensor::clamp(std::optional<TensorOrNumber> min, std::optional<TensorOrNumber> max,
                     Loc loc) const {
  return call(OpId::kClamp, {opt_operand(min), opt_operand(max)}, {}, loc);
}
Tensor Tensor::clamp_(std::optional<TensorOrNumber> min, std::optional<TensorOrNumber> max,
                      Loc loc) const {
  return mutate(OpId::kClamp_, {opt_operand(min), opt_operand(max)}, {}, loc);
}
Tensor Tensor::lerp(const Tensor& end, const TensorOrNumber& weight, Loc loc) const {
  return call(OpId::kLerp, {end.value(), weight.operand()}, {}, loc);
}
Tensor Tensor::lerp_(const Tensor& end, const TensorOrNumber& weight, Loc loc) const {
  return mutate(OpId::kLerp_, {end.value(), weight.operand()}, {}, loc);
}
Tensor Tensor::addcmul(const Tensor& t1, const Tensor& t2, Number value, Loc loc) const {
  return call(OpId::kAddcmul, {t1.value(), t2.value()}, {{"value", value.value}}, loc);
}
Tensor Tensor::addcmul_(const Tensor& t1, const Tensor& t2, Number value, Loc loc) const {
  return mutate(OpId::kAddcmul_, {t1.value(), t2.value()}, {{"value", value.value}}, loc);
}
Tensor Tensor::addcdiv(const Tensor& t1, const Tensor& t2, Number value, Loc loc) const {
  return call(OpId::kAddcdiv, {t1.value(), t2.value()}, {{"value", value.value}}, loc);
}
Tensor Tensor::addcdiv_(const Tensor& t1, const Tensor& t2, Number value, Loc loc) const {
  return mutate(OpId::kAddcdiv_, {t1.value(), t2.value()}, {{"value", value.value}}, loc);
}
// to() of the tensor's own dtype and flatten() of a single dim return the tensor object itself
// in eager: the handle moves to the op's output, as for an in-place op, so that a later metadata
// mutation through either name is seen by both.
Tensor Tensor::to(DType dtype, Loc loc) const {
  if (dtype == this->dtype()) return mutate_like(OpId::kTo, {Constant(dtype)}, loc);
  return call(OpId::kTo, {Constant(dtype)}, {}, loc);
}

Tensor Tensor::fill_(const TensorOrNumber& value, Loc loc) const {
  return mutate(OpId::kFill_, {value.operand()}, {}, loc);
}
Tensor Tensor::zero_(Loc loc) const {
  return mutate(OpId::kZero_, {}, {}, loc);
}
Tensor Tensor::copy_(const Tensor& src, Loc loc) const {
  return mutate(OpId::kCopy_, {src.value()}, {}, loc);
}
Tensor Tensor::t_(Loc loc) const {
  return mutate(OpId::kT_, {}, {}, loc);
}
Tensor Tensor::transpose_(int64_t d0, int64_t d1, Loc loc) const {
  return mutate(OpId::kTranspose_, {d0, d1}, {}, loc);
}
Tensor Tensor::unsqueeze_(int64_t d, Loc loc) const {
  return mutate(OpId::kUnsqueeze_, {d}, {}, loc);
}
Tensor Tensor::squeeze_(std::optional<IntList> dims, Loc loc) const {
  return mutate(OpId::kSqueeze_, {opt_ints(dims)}, {}, loc);
}
Tensor Tensor::as_strided_(IntList size, IntList stride, std::optional<int64_t> off,
                           Loc loc) const {
  return mutate(OpId::kAsStrided_, {Constant(size), Constant(stride), opt_int(off)}, {}, loc);
}
void Tensor::index_put_(std::vector<TensorIndex> key, const TensorOrNumber& value, Loc loc) const {
  mutate(OpId::kSetitem_, {detail::index_key(key), value.operand()}, {}, loc);
}

Tensor Tensor::view(IntList size, Loc loc) const {
  return call(OpId::kView, {Constant(size)}, {}, loc);
}
Tensor Tensor::reshape(IntList shape, Loc loc) const {
  return call(OpId::kReshape, {Constant(shape)}, {}, loc);
}
Tensor Tensor::permute(IntList dims, Loc loc) const {
  return call(OpId::kPermute, {Constant(dims)}, {}, loc);
}
Tensor Tensor::transpose(int64_t d0, int64_t d1, Loc loc) const {
  return call(OpId::kTranspose, {d0, d1}, {}, loc);
}
Tensor Tensor::t(Loc loc) const {
  return call(OpId::kT, {}, {}, loc);
}
Tensor Tensor::expand(IntList size, Loc loc) const {
  return call(OpId::kExpand, {Constant(size)}, {}, loc);
}
Tensor Tensor::unsqueeze(int64_t d, Loc loc) const {
  return call(OpId::kUnsqueeze, {d}, {}, loc);
}
Tensor Tensor::squeeze(std::optional<IntList> dims, Loc loc) const {
  return call(OpId::kSqueeze, {opt_ints(dims)}, {}, loc);
}
Tensor Tensor::flatten(int64_t s, int64_t e, Loc loc) const {
  if (dim() > 0 && wrap_dim(s, dim()) == wrap_dim(e, dim()))
    return mutate_like(OpId::kFlatten, {s, e}, loc);
  return call(OpId::kFlatten, {s, e}, {}, loc);
}
Tensor Tensor::unflatten(int64_t d, IntList sizes, Loc loc) const {
  return call(OpId::kUnflatten, {d, Constant(sizes)}, {}, loc);
}
Tensor Tensor::slice(int64_t d, std::optional<int64_t> start, std::optional<int64_t> end,
                     int64_t step, Loc loc) const {
  return call(OpId::kSlice, {d, opt_int(start), opt_int(end), step}, {}, loc);
}
Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length, Loc loc) const {
  return call(OpId::kNarrow, {d, start, length}, {}, loc);
}
Tensor Tensor::select(int64_t d, int64_t index, Loc loc) const {
  return call(OpId::kSelect, {d, index}, {}, loc);
}
Tensor Tensor::index(std::vector<TensorIndex> key, Loc loc) const {
  return call(OpId::kGetitem, {detail::index_key(key)}, {}, loc);
}
Tensor Tensor::operator[](TensorIndex i) const {
  return index({i}, Loc::current());
}
Tensor Tensor::diagonal(int64_t off, int64_t d1, int64_t d2, Loc loc) const {
  return call(OpId::kDiagonal, {off, d1, d2}, {}, loc);
}
Tensor Tensor::as_strided(IntList size, IntList stride, std::optional<int64_t> off, Loc loc) const {
  return call(OpId::kAsStrided, {Constant(size), Constant(stride), opt_int(off)}, {}, loc);
}
std::vector<Tensor> Tensor::split(int64_t split_size, int64_t d, Loc loc) const {
  return detail::wrap_all(builder().call(OpId::kSplit, {value(), split_size, d}, {}, to_loc(loc)));
}
std::vector<Tensor> Tensor::split(IntList sizes, int64_t d, Loc loc) const {
  return detail::wrap_all(
      builder().call(OpId::kSplit, {value(), Constant(sizes), d}, {}, to_loc(loc)));
}
std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t d, Loc loc) const {
  return detail::wrap_all(builder().call(OpId::kChunk, {value(), chunks, d}, {}, to_loc(loc)));
}
std::vector<Tensor> Tensor::unbind(int64_t d, Loc loc) const {
  return detail::wrap_all(builder().call(OpId::kUnbind, {value(), d}, {}, to_loc(loc)));
}
Tensor Tensor::detach(Loc loc) const {
  return call(OpId::kDetach, {}, {}, loc);
}
Tensor Tensor::alias(Loc loc) const {
  return call(OpId::kAlias, {}, {}, loc);
}
Tensor Tensor::clone(Loc loc) const {
  Tensor fresh = call(OpId::kEmptyLike, {}, {}, loc);
  return fresh.copy_(*this, loc);
}

Tensor Tensor::sum(std::optional<IntList> d, bool keepdim, std::optional<DType> dtype,
                   Loc loc) const {
  return call(OpId::kSum, {opt_ints(d), keepdim}, {{"dtype", opt_dtype(dtype)}}, loc);
}
Tensor Tensor::prod(std::optional<int64_t> d, bool keepdim, std::optional<DType> dtype,
                    Loc loc) const {
  return call(OpId::kProd, {opt_int(d), keepdim}, {{"dtype", opt_dtype(dtype)}}, loc);
}
Tensor Tensor::mean(std::optional<IntList> d, bool keepdim, std::optional<DType> dtype,
                    Loc loc) const {
  return call(OpId::kMean, {opt_ints(d), keepdim}, {{"dtype", opt_dtype(dtype)}}, loc);
}
Tensor Tensor::amax(IntList d, bool keepdim, Loc loc) const {
  return call(OpId::kAmax, {Constant(d), keepdim}, {}, loc);
}
Tensor Tensor::amin(IntList d, bool keepdim, Loc loc) const {
  return call(OpId::kAmin, {Constant(d), keepdim}, {}, loc);
}
Tensor Tensor::var(std::optional<IntList> d, Number correction, bool keepdim, Loc loc) const {
  return call(OpId::kVar, {opt_ints(d)}, {{"correction", correction.value}, {"keepdim", keepdim}},
              loc);
}
Tensor Tensor::std(std::optional<IntList> d, Number correction, bool keepdim, Loc loc) const {
  return call(OpId::kStd, {opt_ints(d)}, {{"correction", correction.value}, {"keepdim", keepdim}},
              loc);
}
Tensor Tensor::argmax(std::optional<int64_t> d, bool keepdim, Loc loc) const {
  return call(OpId::kArgmax, {opt_int(d), keepdim}, {}, loc);
}
Tensor Tensor::argmin(std::optional<int64_t> d, bool keepdim, Loc loc) const {
  return call(OpId::kArgmin, {opt_int(d), keepdim}, {}, loc);
}
Tensor Tensor::softmax(int64_t d, std::optional<DType> dtype, Loc loc) const {
  return call(OpId::kSoftmax, {d, opt_dtype(dtype)}, {}, loc);
}
Tensor Tensor::log_softmax(int64_t d, std::optional<DType> dtype, Loc loc) const {
  return call(OpId::kLogSoftmax, {d, opt_dtype(dtype)}, {}, loc);
}
Tensor Tensor::matmul(const Tensor& other, Loc loc) const {
  return call(OpId::kMatmul, {other.value()}, {}, loc);
}

// ---- operators ----
namespace {
Tensor binary(OpId op, const Tensor& a, const TensorOrNumber& b) {
  return call_free(op, {a.value(), b.operand()}, {}, b.loc);
}
// number / tensor (Python's __rtruediv__): the number becomes a tensor of the dtype the
// promotion of (tensor, number) gives, so that 2.5 / int_tensor keeps its 0.5.
Tensor reversed(OpId op, const Number& a, const Tensor& b) {
  std::vector<Operand> pair = {Operand(b.value()), Operand(a.value)};
  Tensor full = call_free(OpId::kFullLike, {b.value(), Operand(a.value)},
                          {{"dtype", Constant(result_type(pair))}}, a.loc);
  return call_free(op, {full.value(), b.value()}, {}, a.loc);
}
}  // namespace

Tensor operator+(const Tensor& a, const TensorOrNumber& b) {
  return binary(OpId::kAdd, a, b);
}
Tensor operator-(const Tensor& a, const TensorOrNumber& b) {
  return binary(OpId::kSub, a, b);
}
Tensor operator*(const Tensor& a, const TensorOrNumber& b) {
  return binary(OpId::kMul, a, b);
}
Tensor operator/(const Tensor& a, const TensorOrNumber& b) {
  return binary(OpId::kDiv, a, b);
}
Tensor operator+(const Number& a, const Tensor& b) {
  return call_free(OpId::kAdd, {b.value(), Operand(a.value)}, {}, a.loc);
}
Tensor operator*(const Number& a, const Tensor& b) {
  return call_free(OpId::kMul, {b.value(), Operand(a.value)}, {}, a.loc);
}
Tensor operator-(const Number& a, const Tensor& b) {
  // Python: a - b == (-b) + a, keeping b's dtype as torch.rsub does.
  Tensor neg = call_free(OpId::kNeg, {b.value()}, {}, a.loc);
  return call_free(OpId::kAdd, {neg.value(), Operand(a.value)}, {}, a.loc);
}
Tensor operator/(const Number& a, const Tensor& b) {
  return reversed(OpId::kDiv, a, b);
}
Tensor operator-(const Tensor& a) {
  return a.neg();
}
Tensor operator<(const Tensor& a, const TensorOrNumber& b) {
  return binary(OpId::kLt, a, b);
}
Tensor operator<=(const Tensor& a, const TensorOrNumber& b) {
  return binary(OpId::kLe, a, b);
}
Tensor operator>(const Tensor& a, const TensorOrNumber& b) {
  return binary(OpId::kGt, a, b);
}
Tensor operator>=(const Tensor& a, const TensorOrNumber& b) {
  return binary(OpId::kGe, a, b);
}
Tensor operator==(const Tensor& a, const TensorOrNumber& b) {
  return binary(OpId::kEq, a, b);
}
Tensor operator!=(const Tensor& a, const TensorOrNumber& b) {
  return binary(OpId::kNe, a, b);
}
Tensor operator&(const Tensor& a, const TensorOrNumber& b) {
  return binary(OpId::kBitwiseAnd, a, b);
}
Tensor operator|(const Tensor& a, const TensorOrNumber& b) {
  return binary(OpId::kBitwiseOr, a, b);
}
Tensor operator^(const Tensor& a, const TensorOrNumber& b) {
  return binary(OpId::kBitwiseXor, a, b);
}
Tensor operator~(const Tensor& a) {
  return a.bitwise_not();
}
Tensor& operator+=(Tensor& a, const TensorOrNumber& b) {
  a.add_(b, 1, b.loc);
  return a;
}
Tensor& operator-=(Tensor& a, const TensorOrNumber& b) {
  a.sub_(b, 1, b.loc);
  return a;
}
Tensor& operator*=(Tensor& a, const TensorOrNumber& b) {
  a.mul_(b, b.loc);
  return a;
}
Tensor& operator/=(Tensor& a, const TensorOrNumber& b) {
  a.div_(b, std::nullopt, b.loc);
  return a;
}

// ---- free functions ----
Tensor where(const Tensor& c, const TensorOrNumber& a, const TensorOrNumber& b, Loc loc) {
  return call_free(OpId::kWhere, {c.value(), a.operand(), b.operand()}, {}, loc);
}
Tensor cat(const std::vector<Tensor>& ts, int64_t d, Loc loc) {
  return call_free(OpId::kCat, {detail::values_of(ts), d}, {}, loc);
}
Tensor stack(const std::vector<Tensor>& ts, int64_t d, Loc loc) {
  return call_free(OpId::kStack, {detail::values_of(ts), d}, {}, loc);
}
Tensor matmul(const Tensor& a, const Tensor& b, Loc loc) {
  return call_free(OpId::kMatmul, {a.value(), b.value()}, {}, loc);
}
Tensor bmm(const Tensor& a, const Tensor& b, Loc loc) {
  return call_free(OpId::kBmm, {a.value(), b.value()}, {}, loc);
}
Tensor linear(const Tensor& x, const Tensor& w, std::optional<Tensor> bias, Loc loc) {
  return call_free(OpId::kLinear, {x.value(), w.value(), opt_tensor(bias)}, {}, loc);
}
Tensor softmax(const Tensor& x, int64_t d, std::optional<DType> dtype, Loc loc) {
  return x.softmax(d, dtype, loc);
}
Tensor log_softmax(const Tensor& x, int64_t d, std::optional<DType> dtype, Loc loc) {
  return x.log_softmax(d, dtype, loc);
}
Tensor layer_norm(const Tensor& x, IntList ns, std::optional<Tensor> w, std::optional<Tensor> b,
                  double eps, Loc loc) {
  return call_free(OpId::kLayerNorm, {x.value(), Constant(ns), opt_tensor(w), opt_tensor(b), eps},
                   {}, loc);
}
Tensor rms_norm(const Tensor& x, IntList ns, std::optional<Tensor> w, std::optional<double> eps,
                Loc loc) {
  Operand e = eps ? Operand(*eps) : Operand(Constant(NoneValue{}));
  return call_free(OpId::kRmsNorm, {x.value(), Constant(ns), opt_tensor(w), e}, {}, loc);
}
Tensor full(IntList size, Number v, std::optional<DType> dtype, Device device, Loc loc) {
  return call_free(OpId::kFull, {Constant(size), Operand(v.value)},
                   {{"dtype", opt_dtype(dtype)}, {"device", Constant(device)}}, loc);
}
Tensor zeros(IntList size, std::optional<DType> dtype, Device device, Loc loc) {
  return call_free(OpId::kZeros, {Constant(size)},
                   {{"dtype", opt_dtype(dtype)}, {"device", Constant(device)}}, loc);
}
Tensor ones(IntList size, std::optional<DType> dtype, Device device, Loc loc) {
  return call_free(OpId::kOnes, {Constant(size)},
                   {{"dtype", opt_dtype(dtype)}, {"device", Constant(device)}}, loc);
}
Tensor full_like(const Tensor& t, Number v, std::optional<DType> dtype, Loc loc) {
  return call_free(OpId::kFullLike, {t.value(), Operand(v.value)}, {{"dtype", opt_dtype(dtype)}},
                   loc);
}
Tensor zeros_like(const Tensor& t, std::optional<DType> dtype, Loc loc) {
  return call_free(OpId::kZerosLike, {t.value()}, {{"dtype", opt_dtype(dtype)}}, loc);
}
Tensor ones_like(const Tensor& t, std::optional<DType> dtype, Loc loc) {
  return call_free(OpId::kOnesLike, {t.value()}, {{"dtype", opt_dtype(dtype)}}, loc);
}
Tensor empty_like(const Tensor& t, std::optional<DType> dtype, Loc loc) {
  return call_free(OpId::kEmptyLike, {t.value()}, {{"dtype", opt_dtype(dtype)}}, loc);
}
Tensor arange(Number start, Number end, Number step, std::optional<DType> dtype, Device device,
              Loc loc) {
  return call_free(OpId::kArange, {Operand(start.value), Operand(end.value), Operand(step.value)},
                   {{"dtype", opt_dtype(dtype)}, {"device", Constant(device)}}, loc);
}
Tensor fill(const Tensor& t, const TensorOrNumber& v, Loc loc) {
  return call_free(OpId::kFill, {t.value(), v.operand()}, {}, loc);
}
Tensor slice_scatter(const Tensor& self, const Tensor& src, int64_t d, std::optional<int64_t> start,
                     std::optional<int64_t> end, int64_t step, Loc loc) {
  return call_free(OpId::kSliceScatter,
                   {self.value(), src.value(), d, opt_int(start), opt_int(end), step}, {}, loc);
}
Tensor select_scatter(const Tensor& self, const Tensor& src, int64_t d, int64_t index, Loc loc) {
  return call_free(OpId::kSelectScatter, {self.value(), src.value(), d, index}, {}, loc);
}
Tensor diagonal_scatter(const Tensor& self, const Tensor& src, int64_t off, int64_t d1, int64_t d2,
                        Loc loc) {
  return call_free(OpId::kDiagonalScatter, {self.value(), src.value(), off, d1, d2}, {}, loc);
}
Tensor as_strided_scatter(const Tensor& self, const Tensor& src, IntList size, IntList stride,
                          std::optional<int64_t> off, Loc loc) {
  return call_free(OpId::kAsStridedScatter,
                   {self.value(), src.value(), Constant(size), Constant(stride), opt_int(off)}, {},
                   loc);
}

}  // namespace kiln
