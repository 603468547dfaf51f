// kiln's public C++ API: trace a C++ function written against kiln::Tensor into an eager trace,
// and run traces in the reference interpreter.
//
//   auto t = kiln::trace([](kiln::Tensor a) { a.tanh_(); return a * a * a * a; },
//                        {kiln::TensorSpec(kiln::f32, {5, 5})});
//   std::cout << kiln::print_trace(t);
//   auto outs = kiln::interpret(t, {kiln::make_tensor(kiln::f32, {5, 5}, values)});
//
// A Tensor is a handle with Python object semantics: copies of it are the same object, in-place
// ops return that object, and metadata mutations (transpose_, ...) change it for every copy.
// Every call records the caller's file:line.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <source_location>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "kiln/ir/builder.h"
#include "kiln/ir/parser.h"
#include "kiln/ir/printer.h"
#include "kiln/ir/trace.h"
#include "kiln/ir/verifier.h"
#include "kiln/runtime/interpreter/interpreter.h"
#include "kiln/support/error.h"

namespace kiln {

inline constexpr DType kbool = DType::kBool;
inline constexpr DType i32 = DType::kInt32;
inline constexpr DType i64 = DType::kInt64;
inline constexpr DType f16 = DType::kFloat16;
inline constexpr DType bf16 = DType::kBFloat16;
inline constexpr DType f32 = DType::kFloat32;
inline constexpr DType f64 = DType::kFloat64;

using Loc = std::source_location;

// The description of one input of a traced function.
struct TensorSpec {
  TensorSpec(DType dtype, Shape shape, Device device = Device::cpu())
      : dtype(dtype), shape(std::move(shape)), device(device) {}
  // Inputs with a non-default memory layout (strides in elements, storage offset).
  TensorSpec& strided(std::vector<int64_t> strides, int64_t offset = 0) {
    layout = Layout{std::move(strides), offset};
    return *this;
  }
  TensorSpec& named(std::string n) {
    name = std::move(n);
    return *this;
  }
  DType dtype;
  Shape shape;
  Device device;
  std::optional<Layout> layout;
  std::string name;  // empty: a, b, c, ... by position
};

class Tensor;

// A Python number: bool, int or float.
struct Number {
  Number(bool v, Loc loc = Loc::current()) : value(v), loc(loc) {}          // NOLINT
  Number(int v, Loc loc = Loc::current()) : value(int64_t{v}), loc(loc) {}  // NOLINT
  Number(int64_t v, Loc loc = Loc::current()) : value(v), loc(loc) {}       // NOLINT
  Number(double v, Loc loc = Loc::current()) : value(v), loc(loc) {}        // NOLINT
  Constant value;
  Loc loc;
};

// The right-hand side of an operator or a method argument that may be a tensor or a number.
// Its constructor records where the expression was written (operators cannot take a default
// source_location themselves).
struct TensorOrNumber {
  TensorOrNumber(const Tensor& t, Loc loc = Loc::current());                         // NOLINT
  TensorOrNumber(bool v, Loc loc = Loc::current()) : number(v), loc(loc) {}          // NOLINT
  TensorOrNumber(int v, Loc loc = Loc::current()) : number(int64_t{v}), loc(loc) {}  // NOLINT
  TensorOrNumber(int64_t v, Loc loc = Loc::current()) : number(v), loc(loc) {}       // NOLINT
  TensorOrNumber(double v, Loc loc = Loc::current()) : number(v), loc(loc) {}        // NOLINT
  std::shared_ptr<const Tensor> tensor;
  Constant number;
  Loc loc;
  Operand operand() const;
};

// Index keys, as libtorch spells them: x.index({0, Slice(1, None, 2), None, Ellipsis}).
struct NoneIndex {};
struct EllipsisIndex {};
inline constexpr NoneIndex None{};
inline constexpr EllipsisIndex Ellipsis{};
struct Slice {
  Slice(std::optional<int64_t> start = std::nullopt, std::optional<int64_t> stop = std::nullopt,
        std::optional<int64_t> step = std::nullopt)
      : item(IndexItem::slice(start, stop, step)) {}
  Slice(std::optional<int64_t> start, NoneIndex, std::optional<int64_t> step = std::nullopt)
      : item(IndexItem::slice(start, std::nullopt, step)) {}
  Slice(NoneIndex, std::optional<int64_t> stop, std::optional<int64_t> step = std::nullopt)
      : item(IndexItem::slice(std::nullopt, stop, step)) {}
  Slice(NoneIndex, NoneIndex, std::optional<int64_t> step = std::nullopt)
      : item(IndexItem::slice(std::nullopt, std::nullopt, step)) {}
  IndexItem item;
};
struct TensorIndex {
  TensorIndex(int v) : item(IndexItem::integer(v)) {}          // NOLINT
  TensorIndex(int64_t v) : item(IndexItem::integer(v)) {}      // NOLINT
  TensorIndex(Slice s) : item(s.item) {}                       // NOLINT
  TensorIndex(NoneIndex) : item(IndexItem::new_axis()) {}      // NOLINT
  TensorIndex(EllipsisIndex) : item(IndexItem::ellipsis()) {}  // NOLINT
  IndexItem item;
};

namespace detail {
struct Handle;
}

class Tensor {
 public:
  Tensor() = default;

  const TensorType& type() const;
  DType dtype() const { return type().dtype; }
  const Shape& shape() const { return type().shape; }
  int64_t dim() const { return type().rank(); }
  int64_t size(int64_t d) const;
  Value* value() const;  // the SSA value naming this handle now
  bool same_object(const Tensor& other) const { return handle_ == other.handle_; }

  // ---- elementwise (each with its in-place form, which returns this same object) ----
// clang-format off
#define KILN_API_UNARY(method, Id)               \
  Tensor method(Loc loc = Loc::current()) const; \
  Tensor method##_(Loc loc = Loc::current()) const;
#define KILN_API_BINARY(method, Id)                                           \
  Tensor method(const TensorOrNumber& other, Loc loc = Loc::current()) const; \
  Tensor method##_(const TensorOrNumber& other, Loc loc = Loc::current()) const;
#include "kiln/tensor_methods.def"
  // clang-format on
  Tensor gelu(std::string approximate = "none", Loc loc = Loc::current()) const;
  Tensor gelu_(std::string approximate = "none", Loc loc = Loc::current()) const;
  Tensor isnan(Loc loc = Loc::current()) const;

  Tensor add(const TensorOrNumber& other, Number alpha = 1, Loc loc = Loc::current()) const;
  Tensor add_(const TensorOrNumber& other, Number alpha = 1, Loc loc = Loc::current()) const;
  Tensor sub(const TensorOrNumber& other, Number alpha = 1, Loc loc = Loc::current()) const;
  Tensor sub_(const TensorOrNumber& other, Number alpha = 1, Loc loc = Loc::current()) const;
  Tensor div(const TensorOrNumber& other, std::optional<std::string> rounding_mode = std::nullopt,
             Loc loc = Loc::current()) const;
  Tensor div_(const TensorOrNumber& other, std::optional<std::string> rounding_mode = std::nullopt,
              Loc loc = Loc::current()) const;
  Tensor clamp(std::optional<TensorOrNumber> min, std::optional<TensorOrNumber> max = std::nullopt,
               Loc loc = Loc::current()) const;
  Tensor clamp_(std::optional<TensorOrNumber> min, std::optional<TensorOrNumber> max = std::nullopt,
                Loc loc = Loc::current()) const;
  Tensor lerp(const Tensor& end, const TensorOrNumber& weight, Loc loc = Loc::current()) const;
  Tensor lerp_(const Tensor& end, const TensorOrNumber& weight, Loc loc = Loc::current()) const;
  Tensor addcmul(const Tensor& t1, const Tensor& t2, Number value = 1,
                 Loc loc = Loc::current()) const;
  Tensor addcmul_(const Tensor& t1, const Tensor& t2, Number value = 1,
                  Loc loc = Loc::current()) const;
  Tensor addcdiv(const Tensor& t1, const Tensor& t2, Number value = 1,
                 Loc loc = Loc::current()) const;
  Tensor addcdiv_(const Tensor& t1, const Tensor& t2, Number value = 1,
                  Loc loc = Loc::current()) const;
  Tensor to(DType dtype, Loc loc = Loc::current()) const;

  // ---- other mutation ----
  Tensor fill_(const TensorOrNumber& value, Loc loc = Loc::current()) const;
  Tensor zero_(Loc loc = Loc::current()) const;
  Tensor copy_(const Tensor& src, Loc loc = Loc::current()) const;
  Tensor t_(Loc loc = Loc::current()) const;
  Tensor transpose_(int64_t dim0, int64_t dim1, Loc loc = Loc::current()) const;
  Tensor unsqueeze_(int64_t dim, Loc loc = Loc::current()) const;
  Tensor squeeze_(std::optional<IntList> dims = std::nullopt, Loc loc = Loc::current()) const;
  Tensor as_strided_(IntList size, IntList stride,
                     std::optional<int64_t> storage_offset = std::nullopt,
                     Loc loc = Loc::current()) const;
  // x[key] = value
  void index_put_(std::vector<TensorIndex> key, const TensorOrNumber& value,
                  Loc loc = Loc::current()) const;

  // ---- views ----
  Tensor view(IntList size, Loc loc = Loc::current()) const;
  Tensor reshape(IntList shape, Loc loc = Loc::current()) const;
  Tensor permute(IntList dims, Loc loc = Loc::current()) const;
  Tensor transpose(int64_t dim0, int64_t dim1, Loc loc = Loc::current()) const;
  Tensor t(Loc loc = Loc::current()) const;
  Tensor expand(IntList size, Loc loc = Loc::current()) const;
  Tensor unsqueeze(int64_t dim, Loc loc = Loc::current()) const;
  Tensor squeeze(std::optional<IntList> dims = std::nullopt, Loc loc = Loc::current()) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1, Loc loc = Loc::current()) const;
  Tensor unflatten(int64_t dim, IntList sizes, Loc loc = Loc::current()) const;
  Tensor slice(int64_t dim = 0, std::optional<int64_t> start = std::nullopt,
               std::optional<int64_t> end = std::nullopt, int64_t step = 1,
               Loc loc = Loc::current()) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length, Loc loc = Loc::current()) const;
  Tensor select(int64_t dim, int64_t index, Loc loc = Loc::current()) const;
  Tensor index(std::vector<TensorIndex> key, Loc loc = Loc::current()) const;
  Tensor operator[](TensorIndex i) const;  // x[i] (location: the last recorded call's)
  Tensor diagonal(int64_t offset = 0, int64_t dim1 = 0, int64_t dim2 = 1,
                  Loc loc = Loc::current()) const;
  Tensor as_strided(IntList size, IntList stride,
                    std::optional<int64_t> storage_offset = std::nullopt,
                    Loc loc = Loc::current()) const;
  std::vector<Tensor> split(int64_t split_size, int64_t dim = 0, Loc loc = Loc::current()) const;
  std::vector<Tensor> split(IntList split_sizes, int64_t dim = 0, Loc loc = Loc::current()) const;
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim = 0, Loc loc = Loc::current()) const;
  std::vector<Tensor> unbind(int64_t dim = 0, Loc loc = Loc::current()) const;
  Tensor detach(Loc loc = Loc::current()) const;
  Tensor alias(Loc loc = Loc::current()) const;
  Tensor clone(Loc loc = Loc::current()) const;  // as eager does it: empty_like + copy_

  // ---- reductions ----
  Tensor sum(std::optional<IntList> dim = std::nullopt, bool keepdim = false,
             std::optional<DType> dtype = std::nullopt, Loc loc = Loc::current()) const;
  Tensor prod(std::optional<int64_t> dim = std::nullopt, bool keepdim = false,
              std::optional<DType> dtype = std::nullopt, Loc loc = Loc::current()) const;
  Tensor mean(std::optional<IntList> dim = std::nullopt, bool keepdim = false,
              std::optional<DType> dtype = std::nullopt, Loc loc = Loc::current()) const;
  Tensor amax(IntList dim = {}, bool keepdim = false, Loc loc = Loc::current()) const;
  Tensor amin(IntList dim = {}, bool keepdim = false, Loc loc = Loc::current()) const;
  Tensor var(std::optional<IntList> dim = std::nullopt, Number correction = 1, bool keepdim = false,
             Loc loc = Loc::current()) const;
  Tensor std(std::optional<IntList> dim = std::nullopt, Number correction = 1, bool keepdim = false,
             Loc loc = Loc::current()) const;
  Tensor argmax(std::optional<int64_t> dim = std::nullopt, bool keepdim = false,
                Loc loc = Loc::current()) const;
  Tensor argmin(std::optional<int64_t> dim = std::nullopt, bool keepdim = false,
                Loc loc = Loc::current()) const;

  // ---- compositions ----
  Tensor softmax(int64_t dim, std::optional<DType> dtype = std::nullopt,
                 Loc loc = Loc::current()) const;
  Tensor log_softmax(int64_t dim, std::optional<DType> dtype = std::nullopt,
                     Loc loc = Loc::current()) const;
  Tensor matmul(const Tensor& other, Loc loc = Loc::current()) const;

  // Records an op on this handle. Public for the free functions below; not for users.
  explicit Tensor(std::shared_ptr<detail::Handle> handle) : handle_(std::move(handle)) {}
  const std::shared_ptr<detail::Handle>& handle() const {
    return handle_;
  }

 private:
  Tensor call(OpId op, std::vector<Operand> args, KeywordArgs kwargs, Loc loc) const;
  Tensor mutate(OpId op, std::vector<Operand> args, KeywordArgs kwargs, Loc loc) const;
  Tensor mutate_like(OpId op, std::vector<Operand> args, Loc loc) const;
  std::shared_ptr<detail::Handle> handle_;
};

// Operators: both operands may record the location (the right one through its conversion).
Tensor operator+(const Tensor& a, const TensorOrNumber& b);
Tensor operator-(const Tensor& a, const TensorOrNumber& b);
Tensor operator*(const Tensor& a, const TensorOrNumber& b);
Tensor operator/(const Tensor& a, const TensorOrNumber& b);
Tensor operator+(const Number& a, const Tensor& b);
Tensor operator-(const Number& a, const Tensor& b);
Tensor operator*(const Number& a, const Tensor& b);
Tensor operator/(const Number& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator<(const Tensor& a, const TensorOrNumber& b);
Tensor operator<=(const Tensor& a, const TensorOrNumber& b);
Tensor operator>(const Tensor& a, const TensorOrNumber& b);
Tensor operator>=(const Tensor& a, const TensorOrNumber& b);
Tensor operator==(const Tensor& a, const TensorOrNumber& b);
Tensor operator!=(const Tensor& a, const TensorOrNumber& b);
Tensor operator&(const Tensor& a, const TensorOrNumber& b);
Tensor operator|(const Tensor& a, const TensorOrNumber& b);
Tensor operator^(const Tensor& a, const TensorOrNumber& b);
Tensor operator~(const Tensor& a);
// a += b is add_ (the same object), as in Python.
Tensor& operator+=(Tensor& a, const TensorOrNumber& b);
Tensor& operator-=(Tensor& a, const TensorOrNumber& b);
Tensor& operator*=(Tensor& a, const TensorOrNumber& b);
Tensor& operator/=(Tensor& a, const TensorOrNumber& b);

// ---- free functions (torch.*, torch.nn.functional.*) ----
Tensor where(const Tensor& condition, const TensorOrNumber& self, const TensorOrNumber& other,
             Loc loc = Loc::current());
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0, Loc loc = Loc::current());
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0, Loc loc = Loc::current());
Tensor matmul(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor bmm(const Tensor& a, const Tensor& b, Loc loc = Loc::current());
Tensor linear(const Tensor& input, const Tensor& weight, std::optional<Tensor> bias = std::nullopt,
              Loc loc = Loc::current());
Tensor softmax(const Tensor& x, int64_t dim, std::optional<DType> dtype = std::nullopt,
               Loc loc = Loc::current());
Tensor log_softmax(const Tensor& x, int64_t dim, std::optional<DType> dtype = std::nullopt,
                   Loc loc = Loc::current());
Tensor layer_norm(const Tensor& x, IntList normalized_shape,
                  std::optional<Tensor> weight = std::nullopt,
                  std::optional<Tensor> bias = std::nullopt, double eps = 1e-5,
                  Loc loc = Loc::current());
Tensor rms_norm(const Tensor& x, IntList normalized_shape,
                std::optional<Tensor> weight = std::nullopt,
                std::optional<double> eps = std::nullopt, Loc loc = Loc::current());
Tensor full(IntList size, Number fill_value, std::optional<DType> dtype = std::nullopt,
            Device device = Device::cpu(), Loc loc = Loc::current());
Tensor zeros(IntList size, std::optional<DType> dtype = std::nullopt, Device device = Device::cpu(),
             Loc loc = Loc::current());
Tensor ones(IntList size, std::optional<DType> dtype = std::nullopt, Device device = Device::cpu(),
            Loc loc = Loc::current());
Tensor full_like(const Tensor& t, Number fill_value, std::optional<DType> dtype = std::nullopt,
                 Loc loc = Loc::current());
Tensor zeros_like(const Tensor& t, std::optional<DType> dtype = std::nullopt,
                  Loc loc = Loc::current());
Tensor ones_like(const Tensor& t, std::optional<DType> dtype = std::nullopt,
                 Loc loc = Loc::current());
Tensor empty_like(const Tensor& t, std::optional<DType> dtype = std::nullopt,
                  Loc loc = Loc::current());
Tensor arange(Number start, Number end, Number step = 1, std::optional<DType> dtype = std::nullopt,
              Device device = Device::cpu(), Loc loc = Loc::current());
Tensor fill(const Tensor& t, const TensorOrNumber& value, Loc loc = Loc::current());
Tensor slice_scatter(const Tensor& self, const Tensor& src, int64_t dim = 0,
                     std::optional<int64_t> start = std::nullopt,
                     std::optional<int64_t> end = std::nullopt, int64_t step = 1,
                     Loc loc = Loc::current());
Tensor select_scatter(const Tensor& self, const Tensor& src, int64_t dim, int64_t index,
                      Loc loc = Loc::current());
Tensor diagonal_scatter(const Tensor& self, const Tensor& src, int64_t offset = 0, int64_t dim1 = 0,
                        int64_t dim2 = 1, Loc loc = Loc::current());
Tensor as_strided_scatter(const Tensor& self, const Tensor& src, IntList size, IntList stride,
                          std::optional<int64_t> storage_offset = std::nullopt,
                          Loc loc = Loc::current());

// ---- real tensors for the interpreter ----
// An input of the given type (its layout, if any, is honoured) holding `values` in row-major order.
TensorHandle make_input(const TensorType& type, const std::vector<double>& values);
// An input of the given type with seeded random values (floats in [-1, 1), ints in [-5, 5]).
TensorHandle make_random_input(const TensorType& type, uint64_t seed);
// "cpu f32[2, 2] strides=(2, 1) offset=0 [[1, 2], [3, 4]]"
std::string tensor_str(const RtTensor& t);
std::string value_str(const RtValue& v);

// ---- tracing ----
namespace detail {
Trace trace_impl(const std::vector<TensorSpec>& specs,
                 const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& body);
template <class R>
std::vector<Tensor> flatten_result(R&& r) {
  using T = std::decay_t<R>;
  if constexpr (std::is_same_v<T, Tensor>) {
    return {r};
  } else if constexpr (std::is_same_v<T, std::vector<Tensor>>) {
    return r;
  } else {
    return std::apply([](auto&&... ts) { return std::vector<Tensor>{ts...}; }, r);
  }
}
template <class F, size_t... I>
std::vector<Tensor> invoke(F& fn, const std::vector<Tensor>& in, std::index_sequence<I...>) {
  if constexpr (std::is_void_v<decltype(fn(in[I]...))>) {
    fn(in[I]...);
    return {};
  } else {
    return flatten_result(fn(in[I]...));
  }
}
template <class F>
struct Arity : Arity<decltype(&F::operator())> {};
template <class C, class R, class... A>
struct Arity<R (C::*)(A...) const> : std::integral_constant<size_t, sizeof...(A)> {};
template <class C, class R, class... A>
struct Arity<R (C::*)(A...)> : std::integral_constant<size_t, sizeof...(A)> {};
template <class R, class... A>
struct Arity<R (*)(A...)> : std::integral_constant<size_t, sizeof...(A)> {};
}  // namespace detail

// Traces `fn` (taking one kiln::Tensor per spec and returning void, a Tensor, a tuple or a
// vector of Tensors) into an eager trace: every op with its source line, mutation kept as it is.
template <class F>
Trace trace(F fn, const std::vector<TensorSpec>& specs) {
  constexpr size_t n = detail::Arity<F>::value;
  KILN_CHECK(specs.size() == n) << "trace got " << specs.size() << " input specs for a function of "
                                << n << " tensors; give one TensorSpec per argument.";
  return detail::trace_impl(specs, [&](const std::vector<Tensor>& in) {
    return detail::invoke(fn, in, std::make_index_sequence<n>{});
  });
}

}  // namespace kiln
