// Random eager programs (random_program.h); their differential check, shrinking and reports are
// differential_check.cpp.
//
// What the generator makes:
//  * inputs (1-4): fresh contiguous tensors of rank 0-3 (f32 mostly; f64, i64, bool, bf16),
//    strided inputs (transposed, step-sliced, offset, diagonal or expanded views of a private
//    buffer, as_strided windows), a Python number, and inputs that alias each other: more than
//    half of the programs with two or more inputs start with one of the CASES.md pairs (the same
//    object twice, an equal view that is another object, a view with its base, disjoint slices,
//    interleaved step slices, two rows, two columns, overlapping slices, a transposed alias,
//    overlapping as_strided windows), and later inputs may alias earlier ones in the same ways
//    or as random views of their buffer;
//  * 3-30 ops drawn from: unary, binary and ternary elementwise ops (with broadcasting and type
//    promotion, numbers and tensors as operands), their in-place forms on inputs, intermediates
//    and views of both, reductions (sum, mean, amax, amin, prod, var, std with dims/keepdim),
//    views (slice with steps, select, narrow, transpose, permute, t, diagonal, reshape, view,
//    flatten, unflatten, unsqueeze, squeeze, expand, getitem, alias, detach, split, chunk,
//    unbind, as_strided), fill_, zero_, copy_, clone, setitem with a tensor or a number, the
//    metadata mutations transpose_, t_, unsqueeze_ and squeeze_ on inputs and intermediates,
//    cat, stack, softmax, log_softmax, layer_norm, rms_norm, creation ops, casts and matmul;
//  * returns: fresh tensors, inputs, views of inputs (sometimes none, sometimes one twice).
// Ops the type rules reject are retried with other operands. Writes go into expanded views only
// rarely (eager raises for most of them, as in H3). Programs whose eager run raises are kept
// about a third of the time (kiln must raise too). Left out on purpose: integer division by a
// tensor or by zero (eager raises even in dead code, which no dead-code-removing compiler can
// match), `to` a tensor's own dtype and `flatten` of a single dim (they return the same object,
// which the trace cannot express: a later metadata mutation would desynchronize it), and
// metadata mutations of an input passed twice as the same object (for the same reason).
#include "support/random_program.h"

#include "kiln/analysis/geometry.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <set>

#include "kiln/ir/builder.h"
#include "kiln/ir/printer.h"
#include "kiln/ir/type_rules.h"
#include "kiln/kiln.h"
#include "kiln/runtime/interpreter/interpreter.h"
#include "kiln/support/error.h"

namespace kiln::fuzz {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(splitmix64(seed)) {}
  // Uniform in [lo, hi].
  int64_t uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(engine_);
  }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(engine_) < p; }
  size_t index(size_t n) { return static_cast<size_t>(uniform(0, static_cast<int64_t>(n) - 1)); }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[index(v.size())];
  }
  size_t weighted(const std::vector<double>& weights) {
    double total = 0;
    for (double w : weights)
      total += w;
    double x = std::uniform_real_distribution<double>(0, total)(engine_);
    for (size_t i = 0; i < weights.size(); ++i) {
      if (x < weights[i]) return i;
      x -= weights[i];
    }
    return weights.size() - 1;
  }
  double value(DType dtype) {
    if (dtype == DType::kBool) return static_cast<double>(uniform(0, 1));
    if (is_integral(dtype, false)) return static_cast<double>(uniform(-5, 5));
    return static_cast<double>(uniform(-1000, 999)) / 1000.0;  // short, readable values
  }

 private:
  std::mt19937_64 engine_;
};

// ---- geometry of input views ------------------------------------------------------------------

Geometry contiguous_geometry(const Shape& shape, int64_t offset = 0) {
  return Geometry{shape, contiguous_strides(shape), offset};
}

int64_t numel_of(const Geometry& g) {
  return shape_numel(g.sizes);
}

std::set<int64_t> elements_of(const Geometry& g) {
  std::set<int64_t> out;
  int64_t n = numel_of(g);
  for (int64_t k = 0; k < n; ++k) {
    int64_t at = g.offset, rest = k;
    for (size_t d = g.sizes.size(); d-- > 0;) {
      at += (rest % g.sizes[d]) * g.strides[d];
      rest /= g.sizes[d];
    }
    out.insert(at);
  }
  return out;
}

// x[start:end:step] along `dim`, with 0 <= start < end <= size.
Geometry slice_of(Geometry g, size_t dim, int64_t start, int64_t end, int64_t step) {
  g.offset += start * g.strides[dim];
  g.sizes[dim] = (end - start + step - 1) / step;
  g.strides[dim] *= step;
  return g;
}

struct SliceInfo {
  size_t dim = 0;
  int64_t start = 0, end = 0, step = 1;
};

std::string slice_str(const SliceInfo& s, size_t rank) {
  std::string out = "[";
  for (size_t d = 0; d < s.dim; ++d)
    out += ":, ";
  out += std::to_string(s.start) + ":" + std::to_string(s.end);
  if (s.step != 1) out += ":" + std::to_string(s.step);
  (void)rank;
  return out + "]";
}

// ---- replaying steps through the builder ------------------------------------------------------

enum class Applied { kApplied, kMissing, kRejected };

class Replayer {
 public:
  Replayer() : trace_(std::make_unique<Trace>()), builder_(*trace_) {}

  void add_input(int handle, const std::string& name, Type type) {
    live_[handle] = builder_.add_input(name, std::move(type));
  }

  Value* value(int handle) const {
    auto it = live_.find(handle);
    return it == live_.end() ? nullptr : it->second;
  }
  const std::map<int, Value*>& live() const { return live_; }

  // Builds one step. kMissing: an operand's handle does not exist (nothing was built);
  // kRejected: the builder raised a UserError (the trace may hold unused values).
  Applied apply(const Step& step, size_t* num_outputs = nullptr) {
    std::vector<Operand> args;
    KeywordArgs kwargs;
    for (const StepArg& a : step.args) {
      Operand o;
      if (!resolve(a, &o)) return Applied::kMissing;
      args.push_back(std::move(o));
    }
    for (const auto& [name, a] : step.kwargs) {
      Operand o;
      if (!resolve(a, &o)) return Applied::kMissing;
      kwargs.emplace_back(name, std::move(o));
    }
    const OpInfo& info = op_info(step.op);
    std::vector<Value*> outs;
    try {
      outs = builder_.call(step.op, std::move(args), std::move(kwargs),
                           SourceLoc{"gen", step.line, ""});
    } catch (const UserError&) {
      return Applied::kRejected;
    }
    if (info.is_mutation()) {
      if (!outs.empty()) live_[std::get<HandleRef>(step.args.at(0)).id] = outs[0];
    } else {
      for (size_t i = 0; i < std::min(outs.size(), step.results.size()); ++i)
        live_[step.results[i]] = outs[i];
    }
    if (num_outputs) *num_outputs = outs.size();
    return Applied::kApplied;
  }

  void set_outputs(std::vector<Value*> outs) { builder_.set_outputs(std::move(outs)); }
  Trace take() { return std::move(*trace_); }

 private:
  bool resolve(const StepArg& a, Operand* out) const {
    if (const auto* c = std::get_if<Constant>(&a)) {
      *out = Operand(*c);
      return true;
    }
    if (const auto* h = std::get_if<HandleRef>(&a)) {
      Value* v = value(h->id);
      if (!v) return false;
      *out = Operand(v);
      return true;
    }
    std::vector<Value*> vs;
    for (const HandleRef& h : std::get<std::vector<HandleRef>>(a)) {
      Value* v = value(h.id);
      if (!v) return false;
      vs.push_back(v);
    }
    *out = Operand(std::move(vs));
    return true;
  }

  std::unique_ptr<Trace> trace_;
  Builder builder_;
  std::map<int, Value*> live_;
};

Type input_type(const InputRecipe& in, const Recipe& r) {
  if (in.is_number) return ScalarType{ScalarKind::kFloat};
  const Geometry& g = in.geometry;
  return TensorType{r.buffers.at(static_cast<size_t>(in.buffer)).dtype, g.sizes, Device::cpu(),
                    Layout{g.strides, g.offset}};
}

// ---- the generator ----------------------------------------------------------------------------

Constant C(int64_t v) {
  return Constant(v);
}
Constant none() {
  return Constant(NoneValue{});
}

struct Meta {
  bool is_number = false;
  bool is_input = false;     // a program input's own object
  bool on_input = false;     // shares memory with an input (a view of one), as far as we know
  bool overlapping = false;  // may have internal overlap: writes into it raise in eager
  bool fixed = false;        // another handle may be this very object: no metadata mutations
  int made_at = 0;           // the step count when it was made
};

// How a buffer is laid out for making views of it.
struct BufferInfo {
  Shape shape;  // the buffer read as a contiguous tensor of this shape
  std::vector<size_t> members;
};

enum class Move {
  kUnary,
  kUnaryInplace,
  kBinary,
  kBinaryInplace,
  kTernary,
  kTernaryInplace,
  kReduction,
  kView,
  kSplit,
  kFill,
  kCopy,
  kClone,
  kSetitem,
  kMetadata,
  kCat,
  kSoftmax,
  kCreation,
  kCast,
  kMatmul,
  kNorm,
  kAsStrided,
  kIndex,
  kCount
};

constexpr double kMoveWeights[] = {10, 11, 12, 12, 4, 3, 6, 16, 2, 3, 4,
                                   2,  7,  5,  3,  2, 3, 2, 1,  1, 1, 3};
static_assert(std::size(kMoveWeights) == static_cast<size_t>(Move::kCount));
constexpr size_t kMaxSteps = 30;  // a program's steps, at most (generate_program's contract)

const std::vector<OpId>& unary_ops() {
  static const std::vector<OpId> ops = {
      OpId::kAbs,  OpId::kNeg,        OpId::kExp,        OpId::kSin,   OpId::kCos,
      OpId::kTanh, OpId::kSigmoid,    OpId::kRelu,       OpId::kSilu,  OpId::kErf,
      OpId::kAtan, OpId::kSquare,     OpId::kSqrt,       OpId::kLog1p, OpId::kReciprocal,
      OpId::kGelu, OpId::kExpm1,      OpId::kFloor,      OpId::kRound, OpId::kSign,
      OpId::kLog,  OpId::kLogicalNot, OpId::kBitwiseNot, OpId::kIsnan, OpId::kRsqrt,
      OpId::kAsin, OpId::kSinh,       OpId::kTrunc,      OpId::kCeil};
  return ops;
}

const std::vector<OpId>& binary_ops() {
  static const std::vector<OpId> ops = {
      OpId::kAdd,        OpId::kAdd,       OpId::kAdd,        OpId::kMul,       OpId::kMul,
      OpId::kMul,        OpId::kSub,       OpId::kSub,        OpId::kDiv,       OpId::kDiv,
      OpId::kMaximum,    OpId::kMinimum,   OpId::kPow,        OpId::kAtan2,     OpId::kRemainder,
      OpId::kFmod,       OpId::kEq,        OpId::kNe,         OpId::kLt,        OpId::kLe,
      OpId::kGt,         OpId::kGe,        OpId::kLogicalAnd, OpId::kLogicalOr, OpId::kLogicalXor,
      OpId::kBitwiseAnd, OpId::kBitwiseOr, OpId::kBitwiseXor};
  return ops;
}

bool takes_number(OpId op) {
  const OpInfo& info = op_info(op);
  return info.params.size() > 1 && info.params[1].kind == ParamKind::kTensorOrScalar;
}

class Generator {
 public:
  explicit Generator(uint64_t seed) : rng_(seed) {}

  Recipe generate() {
    make_inputs();
    make_steps();
    choose_returns();
    return std::move(r_);
  }

 private:
  // ---- inputs ----

  DType random_dtype() {
    static const std::vector<DType> dtypes = {DType::kFloat32, DType::kFloat64, DType::kInt64,
                                              DType::kBool, DType::kBFloat16};
    return dtypes[rng_.weighted({70, 8, 10, 5, 7})];
  }

  Shape random_shape(int64_t max_rank, int64_t min_size, int64_t max_size) {
    Shape s;
    int64_t rank = rng_.uniform(0, max_rank);
    for (int64_t d = 0; d < rank; ++d)
      s.push_back(rng_.chance(0.2) ? 1 : rng_.uniform(min_size, max_size));
    if (rng_.chance(0.01) && !s.empty()) s[rng_.index(s.size())] = 0;
    return s;
  }

  size_t new_buffer(DType dtype, const Shape& shape) {
    BufferRecipe b;
    b.dtype = dtype;
    for (int64_t i = 0; i < shape_numel(shape); ++i)
      b.values.push_back(rng_.value(dtype));
    r_.buffers.push_back(std::move(b));
    buffer_info_.push_back(BufferInfo{shape, {}});
    return r_.buffers.size() - 1;
  }

  // A random chain of one or two view steps of a contiguous tensor of shape `shape`.
  Geometry random_view(const Shape& shape, std::string* how, std::optional<SliceInfo>* first,
                       bool slice_first = false) {
    Geometry g = contiguous_geometry(shape);
    int steps = static_cast<int>(rng_.uniform(1, 2));
    for (int k = 0; k < steps; ++k) {
      size_t rank = g.sizes.size();
      size_t choice = rng_.weighted({5, 2, 2, 1, 1, 0.4, 1});
      if (k == 0 && slice_first) choice = 0;
      if (rank == 0) choice = 4;
      switch (choice) {
        case 0: {  // slice with a step
          size_t d = rng_.index(rank);
          int64_t size = g.sizes[d];
          if (size == 0) break;
          // Mostly slices of two or more elements, so that partners can partially overlap.
          bool long_slice = size >= 3 && rng_.chance(0.7);
          int64_t start = rng_.uniform(0, long_slice ? size - 2 : size - 1);
          int64_t end = rng_.uniform(start + (long_slice ? 2 : 1), size);
          int64_t step = rng_.pick(std::vector<int64_t>{1, 1, 2, 3});
          if (k == 0 && first) *first = SliceInfo{d, start, end, step};
          g = slice_of(g, d, start, end, step);
          *how += slice_str(SliceInfo{d, start, end, step}, rank);
          break;
        }
        case 1: {  // select
          if (rank < 2) break;
          size_t d = rng_.index(rank);
          if (g.sizes[d] == 0) break;
          int64_t i = rng_.uniform(0, g.sizes[d] - 1);
          g.offset += i * g.strides[d];
          g.sizes.erase(g.sizes.begin() + static_cast<ptrdiff_t>(d));
          g.strides.erase(g.strides.begin() + static_cast<ptrdiff_t>(d));
          *how += ".select(" + std::to_string(d) + ", " + std::to_string(i) + ")";
          break;
        }
        case 2: {  // transpose
          if (rank < 2) break;
          size_t d0 = rng_.index(rank), d1 = rng_.index(rank);
          if (d0 == d1) d1 = (d0 + 1) % rank;
          std::swap(g.sizes[d0], g.sizes[d1]);
          std::swap(g.strides[d0], g.strides[d1]);
          *how += ".transpose(" + std::to_string(d0) + ", " + std::to_string(d1) + ")";
          break;
        }
        case 3: {  // diagonal of the first two dims
          if (rank < 2) break;
          int64_t len = std::min(g.sizes[0], g.sizes[1]);
          int64_t stride = g.strides[0] + g.strides[1];
          g.sizes.erase(g.sizes.begin(), g.sizes.begin() + 2);
          g.strides.erase(g.strides.begin(), g.strides.begin() + 2);
          g.sizes.push_back(len);
          g.strides.push_back(stride);
          *how += ".diagonal()";
          break;
        }
        case 4: {  // unsqueeze
          size_t d = rng_.index(rank + 1);
          int64_t stride = d < rank ? g.sizes[d] * g.strides[d] : 1;
          g.sizes.insert(g.sizes.begin() + static_cast<ptrdiff_t>(d), 1);
          g.strides.insert(g.strides.begin() + static_cast<ptrdiff_t>(d), stride);
          *how += ".unsqueeze(" + std::to_string(d) + ")";
          break;
        }
        case 5: {  // expand a new leading dim: internal overlap, writes raise
          g.sizes.insert(g.sizes.begin(), 2);
          g.strides.insert(g.strides.begin(), 0);
          *how += ".expand(2, ...)";
          break;
        }
        default:
          *how += "";  // the whole tensor
          break;
      }
    }
    return g;
  }

  // An as_strided window inside a buffer of n elements (may overlap itself when strides are
  // small: as A3 does).
  std::optional<Geometry> random_window(int64_t n, std::string* how) {
    for (int tries = 0; tries < 10; ++tries) {
      Geometry g;
      int64_t rank = rng_.uniform(1, 2);
      int64_t reach = 0;
      for (int64_t d = 0; d < rank; ++d) {
        g.sizes.push_back(rng_.uniform(1, 4));
        g.strides.push_back(rng_.uniform(1, 6));
        reach += (g.sizes.back() - 1) * g.strides.back();
      }
      if (reach >= n) continue;
      g.offset = rng_.uniform(0, n - 1 - reach);
      *how = ".as_strided(" + shape_str(g.sizes) + ", " + shape_str(g.strides) + ", " +
             std::to_string(g.offset) + ")";
      return g;
    }
    return std::nullopt;
  }

  void add_input(InputRecipe in, Meta meta) {
    in.handle = static_cast<int>(r_.inputs.size());
    meta.is_input = !in.is_number;
    meta.on_input = !in.is_number;
    meta.is_number = in.is_number;
    meta_[in.handle] = meta;
    if (!in.is_number)
      buffer_info_[static_cast<size_t>(in.buffer)].members.push_back(r_.inputs.size());
    r_.inputs.push_back(std::move(in));
  }

  // Two inputs over one fresh buffer in one of the aliasing shapes CASES.md names (A1-A4) and
  // their relatives: the same object, an equal view, a view with its base, disjoint slices,
  // interleaved step slices, rows, columns, overlapping slices, a transposed alias and
  // overlapping as_strided windows.
  void make_pair() {
    DType dtype = random_dtype();
    Shape shape;
    int64_t rank = rng_.uniform(1, 3);
    for (int64_t d = 0; d < rank; ++d)
      shape.push_back(rng_.uniform(d == 0 ? 3 : 2, 5));
    int buffer = static_cast<int>(new_buffer(dtype, shape));
    std::string buf = "buf" + std::to_string(buffer);
    Geometry whole = contiguous_geometry(shape);
    InputRecipe a, b;
    a.buffer = b.buffer = buffer;
    std::optional<SliceInfo> sa, sb;
    Meta ma, mb;
    auto slice_pair = [&](SliceInfo x, SliceInfo y) {
      a.geometry = slice_of(whole, x.dim, x.start, x.end, x.step);
      b.geometry = slice_of(whole, y.dim, y.start, y.end, y.step);
      a.how = buf + slice_str(x, shape.size());
      b.how = buf + slice_str(y, shape.size());
      sa = x;
      sb = y;
    };
    size_t d = rng_.index(shape.size());
    int64_t size = shape[d];
    switch (rng_.weighted({2, 1, 2, 2, 2, 1, 1, 2, 2, 2})) {
      case 0:  // A1: the same object twice
        a.geometry = b.geometry = whole;
        a.how = buf;
        b.how = buf;
        b.same_object_as = 0;
        ma.fixed = mb.fixed = true;
        break;
      case 1:  // an equal view that is another object
        a.geometry = b.geometry = whole;
        a.how = buf;
        b.how = buf + " again (another object)";
        break;
      case 2: {  // a view with its base, in either order
        std::string how;
        std::optional<SliceInfo> first;
        a.geometry = whole;
        a.how = buf;
        b.geometry = random_view(shape, &how, &first);
        b.how = buf + how;
        sb = first;
        if (rng_.chance(0.5)) {
          std::swap(a, b);
          std::swap(sa, sb);
        }
        break;
      }
      case 3: {  // A2: disjoint slices
        int64_t k = rng_.uniform(1, size - 1);
        slice_pair({d, 0, k, 1}, {d, k, size, 1});
        break;
      }
      case 4:  // interleaved step slices: x[0::2] and x[1::2]
        slice_pair({d, 0, size, 2}, {d, 1, size, 2});
        break;
      case 5:    // two rows
      case 6: {  // two columns
        size_t dim = rng_.chance(0.5) || shape.size() < 2 ? 0 : 1;
        int64_t i = rng_.uniform(0, shape[dim] - 1);
        int64_t j = (i + rng_.uniform(1, shape[dim] - 1)) % shape[dim];
        auto select = [&](int64_t idx) {
          Geometry g = whole;
          g.offset += idx * g.strides[dim];
          g.sizes.erase(g.sizes.begin() + static_cast<ptrdiff_t>(dim));
          g.strides.erase(g.strides.begin() + static_cast<ptrdiff_t>(dim));
          return g;
        };
        a.geometry = select(i);
        b.geometry = select(j);
        a.how = buf + ".select(" + std::to_string(dim) + ", " + std::to_string(i) + ")";
        b.how = buf + ".select(" + std::to_string(dim) + ", " + std::to_string(j) + ")";
        break;
      }
      case 7: {  // overlapping slices: x[s:e] and x[s+1:e+1]
        int64_t s = rng_.uniform(0, size - 3 >= 0 ? size - 3 : 0);
        int64_t e = std::min(size - 1, s + rng_.uniform(2, 3));
        slice_pair({d, s, e, 1}, {d, s + 1, e + 1, 1});
        break;
      }
      case 8: {  // A4: a and its transpose
        a.geometry = b.geometry = whole;
        size_t r = shape.size();
        if (r >= 2) {
          std::swap(b.geometry.sizes[r - 1], b.geometry.sizes[r - 2]);
          std::swap(b.geometry.strides[r - 1], b.geometry.strides[r - 2]);
        }
        a.how = buf;
        b.how = buf + ".mT";
        break;
      }
      default: {  // A3: overlapping as_strided windows
        int64_t n = shape_numel(shape);
        int64_t cols = rng_.uniform(1, 3), rows = rng_.uniform(1, 3);
        int64_t row_stride = rng_.uniform(cols, cols + 3);
        int64_t reach = (rows - 1) * row_stride + cols;
        if (reach >= n) {
          rows = 1;
          cols = std::min<int64_t>(cols, n - 1);
          reach = cols;
        }
        for (InputRecipe* in : {&a, &b}) {
          in->geometry = Geometry{{rows, cols}, {row_stride, 1}, rng_.uniform(0, n - reach)};
          in->how = buf + ".as_strided(" + shape_str(in->geometry.sizes) + ", " +
                    shape_str(in->geometry.strides) + ", " + std::to_string(in->geometry.offset) +
                    ")";
        }
        break;
      }
    }
    add_input(std::move(a), ma);
    slices_.push_back(sa);
    add_input(std::move(b), mb);
    slices_.push_back(sb);
  }

  void make_inputs() {
    int64_t n = static_cast<int64_t>(rng_.weighted({25, 40, 20, 15})) + 1;
    bool have_number = false;
    std::vector<std::optional<SliceInfo>>& slices = slices_;
    int64_t i = 0;
    if (n >= 2 && rng_.chance(0.55)) {
      make_pair();
      i = 2;
    }
    for (; i < n; ++i) {
      std::vector<size_t> tensors;
      for (size_t k = 0; k < r_.inputs.size(); ++k)
        if (!r_.inputs[k].is_number) tensors.push_back(k);
      InputRecipe in;
      std::optional<SliceInfo> slice;
      if (i > 0 && !have_number && rng_.chance(0.08)) {
        in.is_number = true;
        in.number = static_cast<double>(rng_.uniform(-20, 20)) / 8.0;
        in.how = "a Python float";
        have_number = true;
        add_input(std::move(in), {});
        slices.push_back(std::nullopt);
        continue;
      }
      if (!tensors.empty() && rng_.chance(0.5)) {
        // Alias an earlier input: the same object, an equal view, the whole buffer, the disjoint
        // or the shifted (overlapping) partner of a slice, a transposed alias, a random view or
        // an as_strided window of its buffer.
        size_t kind = rng_.weighted({15, 8, 14, 14, 12, 8, 20, 8});
        std::vector<size_t> sliced;
        for (size_t k : tensors)
          if (slices[k]) sliced.push_back(k);
        if ((kind == 3 || kind == 4) && sliced.empty()) kind = 6;
        size_t j = (kind == 3 || kind == 4) ? rng_.pick(sliced) : rng_.pick(tensors);
        const InputRecipe& other = r_.inputs[j];
        in.buffer = other.buffer;
        const Shape& base_shape = buffer_info_[static_cast<size_t>(other.buffer)].shape;
        int64_t buffer_numel =
            static_cast<int64_t>(r_.buffers[static_cast<size_t>(other.buffer)].values.size());
        Meta meta;
        switch (kind) {
          case 0:  // the very same object
            in.geometry = other.geometry;
            in.same_object_as = other.handle;
            in.how = other.how;
            meta.fixed = true;
            meta_[other.handle].fixed = true;
            break;
          case 1:  // an equal view that is another object
            in.geometry = other.geometry;
            in.how = other.how + " again (another object)";
            break;
          case 2:  // the whole buffer: a base of the other input
            in.geometry = contiguous_geometry(base_shape);
            in.how = "buf" + std::to_string(other.buffer) + " (the whole buffer)";
            break;
          case 3:
          case 4: {  // disjoint (3) or shifted, overlapping (4) partner of a slice
            const std::optional<SliceInfo>& s = slices[j];
            Geometry whole = contiguous_geometry(base_shape);
            int64_t size = base_shape[s->dim];
            SliceInfo p = *s;
            if (kind == 3) {
              if (s->step > 1 && s->start + 1 < s->end) {
                p.start = s->start + 1;  // interleaved: x[0::2] and x[1::2]
              } else if (s->end < size) {
                p.start = s->end;  // the rows after
                p.end = size;
              } else if (s->start > 0) {
                p.start = 0;
                p.end = s->start;
              }
            } else {
              // Shifted by one step of the slice: they share all but one element (when the slice
              // has two or more).
              if (s->end + s->step <= size) {
                p.start = s->start + s->step;
                p.end = s->end + s->step;
              } else if (s->start >= s->step) {
                p.start = s->start - s->step;
                p.end = s->end - s->step;
              } else {
                p.start = std::min(s->start + s->step, size - 1);
              }
            }
            in.geometry = slice_of(whole, p.dim, p.start, p.end, p.step);
            in.how = "buf" + std::to_string(other.buffer) + slice_str(p, base_shape.size());
            slice = p;
            break;
          }
          case 5: {  // a transposed alias of the other input
            in.geometry = other.geometry;
            size_t rank = in.geometry.sizes.size();
            if (rank >= 2) {
              std::swap(in.geometry.sizes[rank - 1], in.geometry.sizes[rank - 2]);
              std::swap(in.geometry.strides[rank - 1], in.geometry.strides[rank - 2]);
            }
            in.how = other.how + ".mT";
            break;
          }
          case 6: {  // a random view of the same buffer
            std::string how;
            in.geometry = random_view(base_shape, &how, &slice);
            in.how = "buf" + std::to_string(other.buffer) + how;
            break;
          }
          default: {  // an as_strided window of the same buffer
            std::string how;
            auto g = random_window(buffer_numel, &how);
            if (g) {
              in.geometry = *g;
            } else {
              in.geometry = contiguous_geometry(base_shape);
            }
            in.how = "buf" + std::to_string(other.buffer) + how;
            break;
          }
        }
        for (size_t d = 0; d < in.geometry.sizes.size(); ++d)
          meta.overlapping =
              meta.overlapping || (in.geometry.sizes[d] > 1 && in.geometry.strides[d] == 0);
        add_input(std::move(in), meta);
        slices.push_back(slice);
        continue;
      }
      // A new buffer.
      DType dtype = random_dtype();
      Meta meta;
      if (rng_.chance(0.55)) {
        Shape shape = random_shape(3, 1, 4);
        in.buffer = static_cast<int>(new_buffer(dtype, shape));
        in.geometry = contiguous_geometry(shape);
        in.how = "buf" + std::to_string(in.buffer) + " (a fresh tensor)";
      } else {
        Shape shape = random_shape(3, 2, 5);
        if (shape.empty()) shape = {static_cast<int64_t>(rng_.uniform(2, 6))};
        in.buffer = static_cast<int>(new_buffer(dtype, shape));
        std::string how;
        if (rng_.chance(0.15)) {
          auto g = random_window(shape_numel(shape), &how);
          in.geometry = g ? *g : contiguous_geometry(shape);
        } else {
          in.geometry = random_view(shape, &how, &slice, rng_.chance(0.6));
        }
        in.how = "buf" + std::to_string(in.buffer) + how;
      }
      for (size_t d = 0; d < in.geometry.sizes.size(); ++d)
        meta.overlapping =
            meta.overlapping || (in.geometry.sizes[d] > 1 && in.geometry.strides[d] == 0);
      add_input(std::move(in), meta);
      slices.push_back(slice);
    }
    next_id_ = static_cast<int>(r_.inputs.size());
    for (const InputRecipe& in : r_.inputs)
      rep_.add_input(in.handle, letter_name(static_cast<size_t>(in.handle)), input_type(in, r_));
  }

  // ---- handles ----

  const TensorType& type_of(int h) const { return rep_.value(h)->tensor_type(); }
  const Shape& shape_of(int h) const { return type_of(h).shape; }
  int64_t rank_of(int h) const { return type_of(h).rank(); }
  DType dtype_of(int h) const { return type_of(h).dtype; }

  template <class Pred>
  std::vector<int> tensors(Pred pred) const {
    std::vector<int> out;
    for (const auto& [id, v] : rep_.live()) {
      if (v->is_tensor() && pred(id)) out.push_back(id);
    }
    return out;
  }
  std::vector<int> all_tensors() const {
    return tensors([](int) { return true; });
  }

  // A handle, recent ones more likely.
  int pick_recent(const std::vector<int>& hs) {
    std::vector<double> w;
    int now = static_cast<int>(r_.steps.size());
    for (int h : hs)
      w.push_back(meta_[h].made_at >= now - 3 ? 3.0 : 1.0);
    return hs[rng_.weighted(w)];
  }

  // A handle for an operand: any tensor.
  std::optional<int> pick_any() {
    std::vector<int> hs = all_tensors();
    if (hs.empty()) return std::nullopt;
    return pick_recent(hs);
  }

  // A target for a write: inputs and views of inputs often, and rarely one with internal overlap
  // (eager raises).
  std::optional<int> pick_target() {
    bool allow_overlap = rng_.chance(0.04);
    auto ok = [&](int h) { return allow_overlap || !meta_[h].overlapping; };
    size_t kind = rng_.weighted({45, 25, 30});
    std::vector<int> hs;
    if (kind == 0) hs = tensors([&](int h) { return meta_[h].is_input && ok(h); });
    if (kind == 1)
      hs = tensors([&](int h) { return meta_[h].on_input && !meta_[h].is_input && ok(h); });
    if (hs.empty()) hs = tensors(ok);
    if (hs.empty()) return std::nullopt;
    return pick_recent(hs);
  }

  std::optional<int> number_input() const {
    for (const InputRecipe& in : r_.inputs)
      if (in.is_number) return in.handle;
    return std::nullopt;
  }

  StepArg random_number() {
    if (auto s = number_input(); s && rng_.chance(0.3)) return HandleRef{*s};
    switch (rng_.weighted({4, 5, 1})) {
      case 0:
        return C(rng_.uniform(-3, 3));
      case 1:
        return Constant(
            rng_.pick(std::vector<double>{0.5, -1.5, 2.0, 0.25, -0.75, 3.0, 0.125, -2.5}));
      default:
        return Constant(rng_.chance(0.5));
    }
  }

  // Handles whose shape broadcasts with `shape` (to exactly `shape` when `exact`).
  std::vector<int> broadcast_partners(const Shape& shape, bool exact) {
    return tensors([&](int h) {
      try {
        Shape b = broadcast_shapes(shape, shape_of(h));
        return !exact || b == shape;
      } catch (const UserError&) {
        return false;
      }
    });
  }

  StepArg tensor_or_number(const Shape& shape, bool exact, double p_number) {
    if (rng_.chance(p_number)) return random_number();
    std::vector<int> hs = broadcast_partners(shape, exact);
    if (hs.empty()) return random_number();
    return HandleRef{pick_recent(hs)};
  }

  int64_t random_dim(int64_t rank, bool negative_ok = true) {
    if (rank == 0) return rng_.chance(0.5) ? 0 : -1;
    int64_t d = rng_.uniform(0, rank - 1);
    if (negative_ok && rng_.chance(0.25)) d -= rank;
    return d;
  }

  // A random __getitem__ key for a shape.
  IndexKey random_key(const Shape& shape) {
    IndexKey key;
    size_t dims = shape.size();
    size_t used = rng_.index(dims + 1);
    bool ellipsis = false;
    if (rng_.chance(0.1) && used < dims) {
      key.push_back(IndexItem::ellipsis());
      ellipsis = true;
    }
    size_t start_dim = ellipsis ? dims - used : 0;
    for (size_t k = 0; k < used; ++k) {
      int64_t size = shape[start_dim + k];
      if (rng_.chance(0.1)) key.push_back(IndexItem::new_axis());
      if (size > 0 && rng_.chance(0.3)) {
        int64_t i = rng_.uniform(0, size - 1);
        if (rng_.chance(0.2)) i -= size;
        key.push_back(IndexItem::integer(i));
      } else {
        std::optional<int64_t> a, b, s;
        if (rng_.chance(0.6)) a = rng_.uniform(-size, size);
        if (rng_.chance(0.6)) b = rng_.uniform(-size, size);
        if (rng_.chance(0.5)) s = rng_.pick(std::vector<int64_t>{1, 2, 3});
        key.push_back(IndexItem::slice(a, b, s));
      }
    }
    if (key.empty() && rng_.chance(0.3)) key.push_back(IndexItem::new_axis());
    return key;
  }

  // A random factorization of n into up to 3 dims (maybe with a -1).
  IntList random_reshape(int64_t n) {
    IntList dims;
    int64_t rest = n;
    int64_t rank = rng_.uniform(1, 3);
    for (int64_t k = 0; k + 1 < rank; ++k) {
      std::vector<int64_t> divisors;
      for (int64_t d = 1; d <= std::max<int64_t>(rest, 1); ++d)
        if (rest == 0 || rest % d == 0) divisors.push_back(d);
      int64_t d = rng_.pick(divisors);
      dims.push_back(d);
      rest = d == 0 ? 0 : rest / std::max<int64_t>(d, 1);
    }
    dims.push_back(rest);
    if (n > 0 && rng_.chance(0.3)) dims[rng_.index(dims.size())] = -1;
    return dims;
  }

  // ---- steps ----

  // Builds `s`; on success records it and gives its results `meta`.
  bool emit(Step s, Meta meta, int max_results = 1) {
    s.line = static_cast<int>(r_.steps.size()) + 1;
    const OpInfo& info = op_info(s.op);
    if (!info.is_mutation()) {
      for (int k = 0; k < max_results; ++k)
        s.results.push_back(next_id_ + k);
    }
    size_t n = 0;
    if (rep_.apply(s, &n) != Applied::kApplied) return false;
    if (!info.is_mutation()) {
      s.results.resize(std::min(n, s.results.size()));
      next_id_ += static_cast<int>(s.results.size());
      meta.made_at = static_cast<int>(r_.steps.size()) + 1;
      for (int id : s.results)
        meta_[id] = meta;
    }
    r_.steps.push_back(std::move(s));
    return true;
  }

  Step step(OpId op, std::vector<StepArg> args,
            std::vector<std::pair<std::string, StepArg>> kwargs = {}) {
    Step s;
    s.op = op;
    s.args = std::move(args);
    s.kwargs = std::move(kwargs);
    return s;
  }

  Meta fresh() const { return Meta{}; }
  Meta view_meta(int h) const {
    Meta m;
    const Meta& src = meta_.at(h);
    m.on_input = src.on_input;
    m.overlapping = src.overlapping;
    return m;
  }

  bool move_unary(bool inplace) {
    auto h = inplace ? pick_target() : pick_any();
    if (!h) return false;
    OpId op = rng_.pick(unary_ops());
    if (inplace) {
      if (!op_info(op).has_inplace_form) return false;
      op = inplace_form(op);
    }
    std::vector<std::pair<std::string, StepArg>> kwargs;
    if (op == OpId::kGelu || op == OpId::kGelu_)
      kwargs.emplace_back("approximate", Constant(std::string(rng_.chance(0.5) ? "tanh" : "none")));
    return emit(step(op, {HandleRef{*h}}, kwargs), fresh());
  }

  bool move_binary(bool inplace) {
    auto h = inplace ? pick_target() : pick_any();
    if (!h) return false;
    OpId op = rng_.pick(binary_ops());
    StepArg other = tensor_or_number(shape_of(*h), inplace, takes_number(op) ? 0.35 : 0.0);
    if (std::holds_alternative<Constant>(other) && !takes_number(op)) return false;
    std::vector<std::pair<std::string, StepArg>> kwargs;
    if ((op == OpId::kAdd || op == OpId::kSub) && rng_.chance(0.2))
      kwargs.emplace_back("alpha", rng_.chance(0.5) ? StepArg(C(2)) : StepArg(Constant(-0.5)));
    bool rounding = op == OpId::kDiv && rng_.chance(0.2);
    if (rounding) {
      kwargs.emplace_back("rounding_mode",
                          Constant(std::string(rng_.chance(0.5) ? "floor" : "trunc")));
    }
    // Integer division by zero raises in eager even when the result is never used, which a
    // compiler that removes dead code cannot match without computing it: divide integers by
    // nonzero numbers only.
    bool divides = op == OpId::kRemainder || op == OpId::kFmod || rounding;
    if (divides && !is_floating(dtype_of(*h))) {
      const auto* ref = std::get_if<HandleRef>(&other);
      const auto* c = std::get_if<Constant>(&other);
      bool integral_tensor =
          ref && rep_.value(ref->id)->is_tensor() && !is_floating(dtype_of(ref->id));
      bool integral_number = c && !std::holds_alternative<double>(*c);
      if (integral_tensor || integral_number)
        other = C(rng_.pick(std::vector<int64_t>{-3, -2, 2, 3}));
    }
    if (inplace) op = inplace_form(op);
    return emit(step(op, {HandleRef{*h}, other}, kwargs), fresh());
  }

  bool move_ternary(bool inplace) {
    auto h = inplace ? pick_target() : pick_any();
    if (!h) return false;
    const Shape& shape = shape_of(*h);
    size_t which = rng_.weighted({inplace ? 0.0 : 3.0, 3, 2, 2, 1});
    OpId op;
    std::vector<StepArg> args;
    std::vector<std::pair<std::string, StepArg>> kwargs;
    switch (which) {
      case 0: {  // where(cond, self, other)
        std::vector<int> conds = tensors([&](int c) {
          if (dtype_of(c) != DType::kBool) return false;
          try {
            broadcast_shapes(shape, shape_of(c));
            return true;
          } catch (const UserError&) {
            return false;
          }
        });
        if (conds.empty()) return false;
        op = OpId::kWhere;
        args = {HandleRef{rng_.pick(conds)}, HandleRef{*h}, tensor_or_number(shape, false, 0.5)};
        break;
      }
      case 1: {  // clamp(self, min, max)
        op = OpId::kClamp;
        auto bound = [&](double lo, double hi) -> StepArg {
          if (rng_.chance(0.2)) return tensor_or_number(shape, inplace, 0.0);
          return Constant(static_cast<double>(rng_.uniform(static_cast<int64_t>(lo * 4),
                                                           static_cast<int64_t>(hi * 4))) /
                          4.0);
        };
        size_t form = rng_.index(3);
        args = {HandleRef{*h}, form == 1 ? StepArg(none()) : bound(-1, 0),
                form == 2 ? StepArg(none()) : bound(0, 1)};
        break;
      }
      case 2:  // lerp(self, end, weight)
        op = OpId::kLerp;
        args = {HandleRef{*h}, tensor_or_number(shape, inplace, 0.0),
                rng_.chance(0.7) ? StepArg(Constant(0.25)) : tensor_or_number(shape, inplace, 0.0)};
        if (std::holds_alternative<Constant>(args[1])) return false;
        break;
      case 3:  // addcmul(self, t1, t2, value=)
      default:
        op = which == 3 ? OpId::kAddcmul : OpId::kAddcdiv;
        args = {HandleRef{*h}, tensor_or_number(shape, inplace, 0.0),
                tensor_or_number(shape, inplace, 0.0)};
        if (std::holds_alternative<Constant>(args[1]) || std::holds_alternative<Constant>(args[2]))
          return false;
        if (rng_.chance(0.5)) kwargs.emplace_back("value", Constant(0.5));
        break;
    }
    if (inplace) op = inplace_form(op);
    return emit(step(op, args, kwargs), fresh());
  }

  StepArg random_dims(int64_t rank, bool allow_none) {
    if (allow_none && rng_.chance(0.3)) return none();
    IntList dims;
    for (int64_t d = 0; d < rank; ++d)
      if (rng_.chance(0.5)) dims.push_back(rng_.chance(0.2) ? d - rank : d);
    if (dims.empty() && rank > 0 && rng_.chance(0.7)) dims.push_back(rng_.uniform(0, rank - 1));
    return Constant(dims);
  }

  bool move_reduction() {
    auto h = pick_any();
    if (!h) return false;
    int64_t rank = rank_of(*h);
    bool keepdim = rng_.chance(0.4);
    switch (rng_.weighted({3, 2, 2, 1, 1, 1, 1})) {
      case 0: {
        std::vector<std::pair<std::string, StepArg>> kw;
        if (rng_.chance(0.1)) kw.emplace_back("dtype", Constant(DType::kFloat64));
        return emit(step(OpId::kSum, {HandleRef{*h}, random_dims(rank, true), keepdim}, kw),
                    fresh());
      }
      case 1:
        return emit(step(OpId::kMean, {HandleRef{*h}, random_dims(rank, true), keepdim}), fresh());
      case 2:
        return emit(step(OpId::kAmax, {HandleRef{*h}, random_dims(rank, false), keepdim}), fresh());
      case 3:
        return emit(step(OpId::kAmin, {HandleRef{*h}, random_dims(rank, false), keepdim}), fresh());
      case 4:
        return emit(
            step(OpId::kProd,
                 {HandleRef{*h}, rng_.chance(0.3) ? StepArg(none()) : StepArg(C(random_dim(rank))),
                  keepdim}),
            fresh());
      default:
        return emit(step(rng_.chance(0.5) ? OpId::kVar : OpId::kStd,
                         {HandleRef{*h}, random_dims(rank, true)},
                         {{"correction", C(rng_.uniform(0, 1))}, {"keepdim", Constant(keepdim)}}),
                    fresh());
    }
  }

  bool move_view() {
    std::optional<int> h;
    if (rng_.chance(0.5)) {
      std::vector<int> hs = tensors([&](int x) { return meta_[x].on_input; });
      if (!hs.empty()) h = pick_recent(hs);
    }
    if (!h) h = pick_any();
    if (!h) return false;
    const Shape shape = shape_of(*h);
    int64_t rank = static_cast<int64_t>(shape.size());
    Meta m = view_meta(*h);
    HandleRef self{*h};
    switch (rng_.weighted({4, 3, 1, 2, 1, 1, 1, 2, 2, 1, 1, 2, 1, 2, 3, 1, 0.5})) {
      case 0: {  // slice
        int64_t d = random_dim(rank);
        int64_t size = rank == 0 ? 1 : shape[static_cast<size_t>(d < 0 ? d + rank : d)];
        StepArg start = rng_.chance(0.3) ? StepArg(none()) : StepArg(C(rng_.uniform(-size, size)));
        StepArg end =
            rng_.chance(0.3) ? StepArg(none()) : StepArg(C(rng_.uniform(-size, size + 1)));
        return emit(step(OpId::kSlice,
                         {self, C(d), start, end, C(rng_.pick(std::vector<int64_t>{1, 1, 2, 3}))}),
                    m);
      }
      case 1: {  // select
        if (rank == 0) return false;
        int64_t d = random_dim(rank);
        int64_t size = shape[static_cast<size_t>(d < 0 ? d + rank : d)];
        if (size == 0) return false;
        return emit(step(OpId::kSelect, {self, C(d), C(rng_.uniform(-size, size - 1))}), m);
      }
      case 2: {  // narrow
        if (rank == 0) return false;
        int64_t d = random_dim(rank);
        int64_t size = shape[static_cast<size_t>(d < 0 ? d + rank : d)];
        int64_t start = rng_.uniform(0, size);
        return emit(step(OpId::kNarrow, {self, C(d), C(start), C(rng_.uniform(0, size - start))}),
                    m);
      }
      case 3:  // transpose
        return emit(step(OpId::kTranspose, {self, C(random_dim(rank)), C(random_dim(rank))}), m);
      case 4: {  // permute
        IntList perm(static_cast<size_t>(rank));
        for (int64_t i = 0; i < rank; ++i)
          perm[static_cast<size_t>(i)] = i;
        for (size_t i = perm.size(); i > 1; --i)
          std::swap(perm[i - 1], perm[rng_.index(i)]);
        return emit(step(OpId::kPermute, {self, Constant(perm)}), m);
      }
      case 5:
        return emit(step(OpId::kT, {self}), m);
      case 6:  // diagonal
        return emit(step(OpId::kDiagonal,
                         {self, C(rng_.uniform(-1, 1)), C(random_dim(rank)), C(random_dim(rank))}),
                    m);
      case 7:
        return emit(step(OpId::kReshape, {self, Constant(random_reshape(shape_numel(shape)))}), m);
      case 8:
        return emit(step(OpId::kView, {self, Constant(random_reshape(shape_numel(shape)))}), m);
      case 9: {  // flatten of at least two dims (flatten of one dim returns the same object)
        if (rank < 2) return false;
        int64_t s = rng_.uniform(0, rank - 2);
        int64_t e = rng_.uniform(s + 1, rank - 1);
        return emit(step(OpId::kFlatten, {self, C(s), C(rng_.chance(0.3) ? e - rank : e)}), m);
      }
      case 10: {  // unflatten
        if (rank == 0) return false;
        int64_t d = random_dim(rank);
        int64_t size = shape[static_cast<size_t>(d < 0 ? d + rank : d)];
        return emit(step(OpId::kUnflatten, {self, C(d), Constant(random_reshape(size))}), m);
      }
      case 11:
        return emit(step(OpId::kUnsqueeze, {self, C(rng_.uniform(-rank - 1, rank))}), m);
      case 12: {  // squeeze
        StepArg dims =
            rng_.chance(0.4) ? StepArg(none()) : StepArg(Constant(IntList{random_dim(rank)}));
        return emit(step(OpId::kSqueeze, {self, dims}), m);
      }
      case 13: {  // expand: size-1 dims grow, maybe a new leading dim (reads only, mostly)
        IntList sizes;
        bool grew = false;
        if (rng_.chance(0.3)) {
          sizes.push_back(rng_.uniform(2, 3));
          grew = true;
        }
        for (int64_t s : shape) {
          if (s == 1 && rng_.chance(0.6)) {
            sizes.push_back(rng_.uniform(2, 3));
            grew = true;
          } else {
            sizes.push_back(rng_.chance(0.5) ? -1 : s);
          }
        }
        m.overlapping = m.overlapping || grew;
        return emit(step(OpId::kExpand, {self, Constant(sizes)}), m);
      }
      case 14:
        return emit(step(OpId::kGetitem, {self, Constant(random_key(shape))}), m);
      case 15:
        return emit(step(OpId::kAlias, {self}), m);
      default:
        return emit(step(OpId::kDetach, {self}), m);
    }
  }

  bool move_split() {
    auto h = pick_any();
    if (!h) return false;
    int64_t rank = rank_of(*h);
    if (rank == 0) return false;
    Meta m = view_meta(*h);
    int64_t d = random_dim(rank);
    int64_t size = shape_of(*h)[static_cast<size_t>(d < 0 ? d + rank : d)];
    switch (rng_.index(3)) {
      case 0:
        return emit(step(OpId::kSplit,
                         {HandleRef{*h}, C(rng_.uniform(1, std::max<int64_t>(size, 1))), C(d)}),
                    m, 8);
      case 1:
        return emit(step(OpId::kChunk, {HandleRef{*h}, C(rng_.uniform(1, 3)), C(d)}), m, 8);
      default:
        if (size > 6) return false;
        return emit(step(OpId::kUnbind, {HandleRef{*h}, C(d)}), m, 8);
    }
  }

  bool move_fill() {
    auto h = pick_target();
    if (!h) return false;
    if (rng_.chance(0.25)) return emit(step(OpId::kZero_, {HandleRef{*h}}), fresh());
    StepArg value = random_number();
    if (rng_.chance(0.2)) {
      std::vector<int> scalars = tensors([&](int x) { return rank_of(x) == 0; });
      if (!scalars.empty()) value = HandleRef{rng_.pick(scalars)};
    }
    return emit(step(OpId::kFill_, {HandleRef{*h}, value}), fresh());
  }

  bool move_copy() {
    auto h = pick_target();
    if (!h) return false;
    std::vector<int> srcs = broadcast_partners(shape_of(*h), true);
    if (srcs.empty()) return false;
    return emit(step(OpId::kCopy_, {HandleRef{*h}, HandleRef{pick_recent(srcs)}}), fresh());
  }

  bool move_clone() {
    auto h = pick_any();
    if (!h) return false;
    if (!emit(step(OpId::kEmptyLike, {HandleRef{*h}}), fresh())) return false;
    int copy = r_.steps.back().results.at(0);
    return emit(step(OpId::kCopy_, {HandleRef{copy}, HandleRef{*h}}), fresh());
  }

  bool move_setitem() {
    auto h = pick_target();
    if (!h) return false;
    IndexKey key = random_key(shape_of(*h));
    Shape view;
    try {
      lower_index_key(shape_of(*h), key, &view);
    } catch (const UserError&) {
      return false;
    }
    StepArg value = rng_.chance(0.4) ? random_number() : tensor_or_number(view, true, 0.0);
    return emit(step(OpId::kSetitem_, {HandleRef{*h}, Constant(key), value}), fresh());
  }

  bool move_metadata() {
    std::vector<int> hs = tensors([&](int x) { return !meta_[x].fixed; });
    if (hs.empty()) return false;
    // Inputs half of the time: the caller must see the new sizes and strides.
    std::vector<int> inputs = tensors([&](int x) { return !meta_[x].fixed && meta_[x].is_input; });
    int h = (!inputs.empty() && rng_.chance(0.5)) ? rng_.pick(inputs) : pick_recent(hs);
    int64_t rank = rank_of(h);
    switch (rng_.weighted({3, 2, 2, 2})) {
      case 0:
        return emit(
            step(OpId::kTranspose_, {HandleRef{h}, C(random_dim(rank)), C(random_dim(rank))}),
            fresh());
      case 1:
        return emit(step(OpId::kT_, {HandleRef{h}}), fresh());
      case 2:
        return emit(step(OpId::kUnsqueeze_, {HandleRef{h}, C(rng_.uniform(-rank - 1, rank))}),
                    fresh());
      default: {
        StepArg dims =
            rng_.chance(0.4) ? StepArg(none()) : StepArg(Constant(IntList{random_dim(rank)}));
        return emit(step(OpId::kSqueeze_, {HandleRef{h}, dims}), fresh());
      }
    }
  }

  bool move_cat() {
    auto h = pick_any();
    if (!h) return false;
    const Shape shape = shape_of(*h);
    int64_t rank = static_cast<int64_t>(shape.size());
    bool stack = rng_.chance(0.25);
    int64_t d = stack ? rng_.uniform(-rank - 1, rank) : random_dim(rank);
    size_t wd = static_cast<size_t>(d < 0 ? d + rank : d);
    std::vector<int> partners = tensors([&](int x) {
      const Shape& s = shape_of(x);
      if (s.size() != shape.size()) return false;
      for (size_t i = 0; i < s.size(); ++i)
        if (s[i] != shape[i] && (stack || i != wd)) return false;
      return true;
    });
    std::vector<HandleRef> list = {HandleRef{*h}};
    int64_t more = rng_.uniform(1, 2);
    for (int64_t k = 0; k < more; ++k)
      list.push_back(HandleRef{partners.empty() ? *h : rng_.pick(partners)});
    return emit(step(stack ? OpId::kStack : OpId::kCat, {list, C(d)}), fresh());
  }

  // index_select / index_copy / index_add along a dim, with an index made by arange: a run of
  // positions, or all of them reversed (index ops, ops.def), written back in place half the time
  // (x.index_copy_(...) as the tracer records it: the functional op, then copy_).
  bool move_index() {
    if (r_.steps.size() + 8 > kMaxSteps) return false;  // it makes up to 8
    auto h = pick_any();
    if (!h || rank_of(*h) == 0) return false;
    const Shape shape = shape_of(*h);
    int64_t d = random_dim(rank_of(*h));
    int64_t n = shape[static_cast<size_t>(d < 0 ? d + rank_of(*h) : d)];
    if (n == 0) return false;
    std::vector<std::pair<std::string, StepArg>> kw = {{"dtype", Constant(DType::kInt64)}};
    bool reversed = rng_.chance(0.4);
    int64_t start = reversed ? n - 1 : rng_.uniform(0, n - 1);
    int64_t end = reversed ? -1 : rng_.uniform(start + 1, n);
    // A third of the time the positions count from the end (-n..-1), through wrap_index.
    bool from_end = rng_.chance(0.3);
    int64_t shift = from_end ? n : 0;
    if (!emit(step(OpId::kArange, {C(start - shift), C(end - shift), C(reversed ? -1 : 1)}, kw),
              fresh()))
      return false;
    int index = r_.steps.back().results.at(0);
    if (from_end) {
      if (!emit(step(OpId::kWrapIndex, {HandleRef{index}, C(n)}), fresh())) return false;
      index = r_.steps.back().results.at(0);
    }
    if (!emit(step(OpId::kIndexSelect, {HandleRef{*h}, C(d), HandleRef{index}}), fresh()))
      return false;
    if (rng_.chance(0.4)) return true;
    // The selected rows, changed, written back at the same positions.
    int rows = r_.steps.back().results.at(0);
    if (!emit(step(OpId::kNeg, {HandleRef{rows}}), fresh())) return false;
    int source = r_.steps.back().results.at(0);
    if (rng_.chance(0.35)) return scatter_rows(*h, d, index, rows, source);
    bool add = rng_.chance(0.5);
    std::vector<std::pair<std::string, StepArg>> alpha;
    if (add && rng_.chance(0.5)) alpha.emplace_back("alpha", C(2));
    if (!emit(step(add ? OpId::kIndexAdd : OpId::kIndexCopy,
                   {HandleRef{*h}, C(d), HandleRef{index}, HandleRef{source}}, alpha),
              fresh()))
      return false;
    if (rng_.chance(0.5)) return true;
    int written = r_.steps.back().results.at(0);
    return emit(step(OpId::kCopy_, {HandleRef{*h}, HandleRef{written}}), fresh());
  }

  // The same write as a scatter: the index viewed along d and expanded to the rows' shape, and
  // a random reduction (none for bool) with or without self.
  bool scatter_rows(int h, int64_t d, int index, int rows, int source) {
    const Shape rows_shape = shape_of(rows);
    IntList along(rows_shape.size(), 1);
    size_t wd = static_cast<size_t>(d < 0 ? d + static_cast<int64_t>(rows_shape.size()) : d);
    along[wd] = rows_shape[wd];
    if (!emit(step(OpId::kView, {HandleRef{index}, Constant(along)}), fresh())) return false;
    int viewed = r_.steps.back().results.at(0);
    IntList full(rows_shape.begin(), rows_shape.end());
    if (!emit(step(OpId::kExpand, {HandleRef{viewed}, Constant(full)}), fresh())) return false;
    int expanded = r_.steps.back().results.at(0);
    std::vector<std::pair<std::string, StepArg>> kw;
    static const char* const kReductions[] = {"sum", "prod", "mean", "amax", "amin"};
    if (dtype_of(h) != DType::kBool && rng_.chance(0.7)) {
      kw.emplace_back("reduce", Constant(std::string(kReductions[rng_.uniform(0, 4)])));
      if (rng_.chance(0.4)) kw.emplace_back("include_self", Constant(false));
    }
    if (!emit(
            step(OpId::kScatter, {HandleRef{h}, C(d), HandleRef{expanded}, HandleRef{source}}, kw),
            fresh()))
      return false;
    if (rng_.chance(0.5)) return true;
    int written = r_.steps.back().results.at(0);
    return emit(step(OpId::kCopy_, {HandleRef{h}, HandleRef{written}}), fresh());
  }

  bool move_softmax() {
    auto h = pick_any();
    if (!h) return false;
    std::vector<StepArg> args = {HandleRef{*h}, C(random_dim(rank_of(*h)))};
    if (rng_.chance(0.15)) args.push_back(Constant(DType::kFloat64));
    return emit(step(rng_.chance(0.7) ? OpId::kSoftmax : OpId::kLogSoftmax, args), fresh());
  }

  bool move_creation() {
    auto h = pick_any();
    if (!h) return false;
    const Shape& shape = shape_of(*h);
    switch (rng_.index(6)) {
      case 0:
        return emit(step(OpId::kZerosLike, {HandleRef{*h}}), fresh());
      case 1:
        return emit(step(OpId::kOnesLike, {HandleRef{*h}},
                         {{"dtype", rng_.chance(0.3) ? StepArg(Constant(DType::kFloat32))
                                                     : StepArg(none())}}),
                    fresh());
      case 2:
        return emit(step(OpId::kFullLike, {HandleRef{*h}, random_number()}), fresh());
      case 3: {  // full(shape) of a trailing part of a handle's shape: a broadcast partner
        Shape tail(shape.begin() + static_cast<ptrdiff_t>(rng_.index(shape.size() + 1)),
                   shape.end());
        return emit(
            step(OpId::kFull, {Constant(IntList(tail.begin(), tail.end())), random_number()}),
            fresh());
      }
      case 4: {  // arange(n) along the last dim
        int64_t n = shape.empty() ? 1 : shape.back();
        std::vector<std::pair<std::string, StepArg>> kw;
        if (rng_.chance(0.5)) kw.emplace_back("dtype", Constant(DType::kFloat32));
        return emit(step(OpId::kArange, {C(0), C(n), C(1)}, kw), fresh());
      }
      default:
        return emit(step(rng_.chance(0.5) ? OpId::kZeros : OpId::kOnes,
                         {Constant(IntList(shape.begin(), shape.end()))}),
                    fresh());
    }
  }

  bool move_cast() {
    auto h = pick_any();
    if (!h) return false;
    DType d = random_dtype();
    if (d == dtype_of(*h)) return false;  // to() of the same dtype returns the same object
    return emit(step(OpId::kTo, {HandleRef{*h}, Constant(d)}), fresh());
  }

  bool move_matmul() {
    std::vector<int> as = tensors(
        [&](int x) { return is_floating(dtype_of(x)) && rank_of(x) >= 1 && rank_of(x) <= 2; });
    if (as.empty()) return false;
    int a = pick_recent(as);
    int64_t k = shape_of(a).back();
    std::vector<int> bs = tensors([&](int x) {
      const Shape& s = shape_of(x);
      if (!is_floating(dtype_of(x)) || s.empty() || s.size() > 2) return false;
      return (s.size() == 1 ? s[0] : s[0]) == k;
    });
    if (bs.empty()) return false;
    return emit(step(OpId::kMatmul, {HandleRef{a}, HandleRef{rng_.pick(bs)}}), fresh());
  }

  bool move_norm() {
    auto h = pick_any();
    if (!h || rank_of(*h) == 0) return false;
    IntList ns = {shape_of(*h).back()};
    if (rng_.chance(0.5))
      return emit(step(OpId::kLayerNorm, {HandleRef{*h}, Constant(ns)}), fresh());
    return emit(step(OpId::kRmsNorm, {HandleRef{*h}, Constant(ns)}), fresh());
  }

  bool move_as_strided() {
    auto h = pick_any();
    if (!h) return false;
    int64_t n = std::max<int64_t>(type_of(*h).numel(), 1);
    IntList sizes, strides;
    int64_t rank = rng_.uniform(1, 2);
    for (int64_t d = 0; d < rank; ++d) {
      sizes.push_back(rng_.uniform(1, 3));
      strides.push_back(rng_.uniform(0, 2));
    }
    StepArg offset = rng_.chance(0.5) ? StepArg(none()) : StepArg(C(rng_.uniform(0, n - 1)));
    Meta m = view_meta(*h);
    m.overlapping = true;  // as_strided views may overlap themselves
    return emit(step(OpId::kAsStrided, {HandleRef{*h}, Constant(sizes), Constant(strides), offset}),
                m);
  }

  bool try_move(Move move) {
    switch (move) {
      case Move::kUnary:
        return move_unary(false);
      case Move::kUnaryInplace:
        return move_unary(true);
      case Move::kBinary:
        return move_binary(false);
      case Move::kBinaryInplace:
        return move_binary(true);
      case Move::kTernary:
        return move_ternary(false);
      case Move::kTernaryInplace:
        return move_ternary(true);
      case Move::kReduction:
        return move_reduction();
      case Move::kView:
        return move_view();
      case Move::kSplit:
        return move_split();
      case Move::kFill:
        return move_fill();
      case Move::kCopy:
        return move_copy();
      case Move::kClone:  // two steps
        return r_.steps.size() + 2 <= kMaxSteps && move_clone();
      case Move::kSetitem:
        return move_setitem();
      case Move::kMetadata:
        return move_metadata();
      case Move::kCat:
        return move_cat();
      case Move::kSoftmax:
        return move_softmax();
      case Move::kCreation:
        return move_creation();
      case Move::kCast:
        return move_cast();
      case Move::kMatmul:
        return move_matmul();
      case Move::kNorm:
        return move_norm();
      case Move::kAsStrided:
        return move_as_strided();
      case Move::kIndex:
        return move_index();
      case Move::kCount:
        break;
    }
    return false;
  }

  void make_steps() {
    size_t target = static_cast<size_t>(rng_.uniform(3, static_cast<int64_t>(kMaxSteps)));
    std::vector<double> weights(std::begin(kMoveWeights), std::end(kMoveWeights));
    for (int attempts = 0; r_.steps.size() < target && attempts < 40 * static_cast<int>(target);
         ++attempts)
      try_move(static_cast<Move>(rng_.weighted(weights)));
  }

  void choose_returns() {
    size_t count = rng_.weighted({1, 4, 3, 2});
    for (size_t k = 0; k < count; ++k) {
      std::vector<int> hs;
      size_t kind = rng_.weighted({25, 20, 55});
      if (kind == 0) hs = tensors([&](int x) { return meta_[x].is_input; });
      if (kind == 1) hs = tensors([&](int x) { return meta_[x].on_input && !meta_[x].is_input; });
      if (hs.empty()) hs = all_tensors();
      if (hs.empty()) return;
      int h = pick_recent(hs);
      bool seen = std::find(r_.returns.begin(), r_.returns.end(), h) != r_.returns.end();
      if (!seen || rng_.chance(0.1)) r_.returns.push_back(h);
    }
  }

  Rng rng_;
  Recipe r_;
  Replayer rep_;
  std::map<int, Meta> meta_;
  std::vector<BufferInfo> buffer_info_;
  std::vector<std::optional<SliceInfo>> slices_;  // per input: the slice it was made with
  int next_id_ = 0;
};

// The alias scenario of a recipe's inputs, as tags.
std::string scenario_of(const Recipe& r) {
  std::set<std::string> tags;
  bool shared = false;
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    const InputRecipe& a = r.inputs[i];
    if (a.is_number) {
      tags.insert("number");
      continue;
    }
    if (!is_contiguous(a.geometry.sizes, a.geometry.strides)) tags.insert("strided");
    for (size_t j = 0; j < i; ++j) {
      const InputRecipe& b = r.inputs[j];
      if (b.is_number || b.buffer != a.buffer) continue;
      shared = true;
      if (a.same_object_as == b.handle) {
        tags.insert("same-object");
        continue;
      }
      if (a.geometry == b.geometry) {
        tags.insert("equal-views");
        continue;
      }
      std::set<int64_t> ea = elements_of(a.geometry), eb = elements_of(b.geometry);
      bool a_in_b = std::includes(eb.begin(), eb.end(), ea.begin(), ea.end());
      bool b_in_a = std::includes(ea.begin(), ea.end(), eb.begin(), eb.end());
      if (a_in_b && b_in_a) {
        Shape sa = a.geometry.sizes, sb = b.geometry.sizes;
        std::sort(sa.begin(), sa.end());
        std::sort(sb.begin(), sb.end());
        tags.insert(sa == sb ? "transposed-alias" : "same-elements");
      } else if (a_in_b || b_in_a) {
        tags.insert("view+base");
      } else if (may_overlap(a.geometry, b.geometry)) {
        tags.insert("overlapping");
      } else {
        tags.insert("disjoint");
      }
    }
  }
  if (!shared) tags.insert("distinct");
  std::string out;
  for (const std::string& t : tags)
    out += (out.empty() ? "" : ", ") + t;
  return out;
}

}  // namespace

uint64_t program_seed(uint64_t seed, uint64_t index) {
  return splitmix64(seed ^ splitmix64(index + 0x1234567));
}

RandomProgram materialize(const Recipe& recipe, uint64_t seed) {
  std::set<size_t> excluded;
  while (true) {
    Replayer rep;
    for (size_t k = 0; k < recipe.inputs.size(); ++k)
      rep.add_input(recipe.inputs[k].handle, letter_name(k), input_type(recipe.inputs[k], recipe));
    std::vector<size_t> applied;
    bool restart = false;
    for (size_t k = 0; k < recipe.steps.size(); ++k) {
      if (excluded.contains(k)) continue;
      Applied a = rep.apply(recipe.steps[k]);
      if (a == Applied::kApplied) applied.push_back(k);
      if (a == Applied::kRejected) {
        // Rebuild without it: a rejected decomposition may have left unused values behind.
        excluded.insert(k);
        restart = true;
        break;
      }
    }
    if (restart) continue;

    RandomProgram p;
    p.seed = seed;
    p.recipe.buffers = recipe.buffers;
    p.recipe.inputs = recipe.inputs;
    for (size_t k : applied)
      p.recipe.steps.push_back(recipe.steps[k]);
    std::vector<Value*> outs;
    for (int h : recipe.returns) {
      if (Value* v = rep.value(h); v && v->is_tensor()) {
        outs.push_back(v);
        p.recipe.returns.push_back(h);
      }
    }
    rep.set_outputs(outs);
    p.trace = rep.take();
    p.recipe.scenario = scenario_of(p.recipe);

    std::vector<TensorHandle> buffers;
    for (const BufferRecipe& b : recipe.buffers)
      buffers.push_back(make_tensor(b.dtype, {static_cast<int64_t>(b.values.size())}, b.values));
    std::map<int, TensorHandle> by_handle;
    for (const InputRecipe& in : recipe.inputs) {
      if (in.is_number) {
        p.inputs.emplace_back(RtScalar(in.number));
        continue;
      }
      TensorHandle t;
      if (auto it = by_handle.find(in.same_object_as);
          in.same_object_as >= 0 && it != by_handle.end())
        t = it->second;
      else
        t = make_view(buffers.at(static_cast<size_t>(in.buffer)), in.geometry.sizes,
                      in.geometry.strides, in.geometry.offset);
      by_handle[in.handle] = t;
      p.inputs.emplace_back(t);
    }
    p.pattern = pattern_of_inputs(p.inputs);
    return p;
  }
}

std::string letter_name(size_t i) {
  std::string name(1, static_cast<char>('a' + i % 26));
  if (i >= 26) name += std::to_string(i / 26);
  return name;
}

RandomProgram generate_program(uint64_t seed) {
  Rng keep(seed ^ 0x5eed);
  for (uint64_t attempt = 0;; ++attempt) {
    Generator g(splitmix64(seed + attempt * 0x9e3779b97f4a7c15ULL));
    RandomProgram p = materialize(g.generate(), seed);
    if (attempt >= 3) return p;
    bool raises = false;
    try {
      interpret(p.trace, deep_copy(p.inputs));
    } catch (const UserError&) {
      raises = true;
    } catch (const std::exception&) {
      return p;  // an oracle failure: report it
    }
    if (!raises || keep.chance(0.35)) return p;
  }
}

}  // namespace kiln::fuzz
