// The random program generator of random_program.cpp, shared by its files: the recipe's random
// source (Rng), the replay of steps through the builder (Replayer), and the Generator, whose
// inputs are random_inputs.cpp and whose steps are random_steps.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kiln/analysis/geometry.h"
#include "kiln/ir/builder.h"
#include "kiln/ir/printer.h"
#include "kiln/ir/type_rules.h"
#include "kiln/kiln.h"
#include "kiln/runtime/interpreter/interpreter.h"
#include "kiln/support/error.h"
#include "support/random_program.h"

namespace kiln::fuzz::generator {

inline uint64_t splitmix64(uint64_t x) {
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

inline Geometry contiguous_geometry(const Shape& shape, int64_t offset = 0) {
  return Geometry{shape, contiguous_strides(shape), offset};
}

inline int64_t numel_of(const Geometry& g) {
  return shape_numel(g.sizes);
}

inline std::set<int64_t> elements_of(const Geometry& g) {
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
inline Geometry slice_of(Geometry g, size_t dim, int64_t start, int64_t end, int64_t step) {
  g.offset += start * g.strides[dim];
  g.sizes[dim] = (end - start + step - 1) / step;
  g.strides[dim] *= step;
  return g;
}

struct SliceInfo {
  size_t dim = 0;
  int64_t start = 0, end = 0, step = 1;
};

inline std::string slice_str(const SliceInfo& s, size_t rank) {
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

inline Type input_type(const InputRecipe& in, const Recipe& r) {
  if (in.is_number) return ScalarType{ScalarKind::kFloat};
  const Geometry& g = in.geometry;
  return TensorType{r.buffers.at(static_cast<size_t>(in.buffer)).dtype, g.sizes, Device::cpu(),
                    Layout{g.strides, g.offset}};
}

// ---- the generator ----------------------------------------------------------------------------

inline Constant C(int64_t v) {
  return Constant(v);
}
inline Constant none() {
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

inline const std::vector<OpId>& unary_ops() {
  static const std::vector<OpId> ops = {
      OpId::kAbs,  OpId::kNeg,        OpId::kExp,        OpId::kSin,   OpId::kCos,
      OpId::kTanh, OpId::kSigmoid,    OpId::kRelu,       OpId::kSilu,  OpId::kErf,
      OpId::kAtan, OpId::kSquare,     OpId::kSqrt,       OpId::kLog1p, OpId::kReciprocal,
      OpId::kGelu, OpId::kExpm1,      OpId::kFloor,      OpId::kRound, OpId::kSign,
      OpId::kLog,  OpId::kLogicalNot, OpId::kBitwiseNot, OpId::kIsnan, OpId::kRsqrt,
      OpId::kAsin, OpId::kSinh,       OpId::kTrunc,      OpId::kCeil};
  return ops;
}

inline const std::vector<OpId>& binary_ops() {
  static const std::vector<OpId> ops = {
      OpId::kAdd,        OpId::kAdd,       OpId::kAdd,        OpId::kMul,       OpId::kMul,
      OpId::kMul,        OpId::kSub,       OpId::kSub,        OpId::kDiv,       OpId::kDiv,
      OpId::kMaximum,    OpId::kMinimum,   OpId::kPow,        OpId::kAtan2,     OpId::kRemainder,
      OpId::kFmod,       OpId::kEq,        OpId::kNe,         OpId::kLt,        OpId::kLe,
      OpId::kGt,         OpId::kGe,        OpId::kLogicalAnd, OpId::kLogicalOr, OpId::kLogicalXor,
      OpId::kBitwiseAnd, OpId::kBitwiseOr, OpId::kBitwiseXor};
  return ops;
}

inline bool takes_number(OpId op) {
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

  DType random_dtype();
  Shape random_shape(int64_t max_rank, int64_t min_size, int64_t max_size);
  size_t new_buffer(DType dtype, const Shape& shape);

  // A random chain of one or two view steps of a contiguous tensor of shape `shape`.
  Geometry random_view(const Shape& shape, std::string* how, std::optional<SliceInfo>* first,
                       bool slice_first = false);

  // An as_strided window inside a buffer of n elements (may overlap itself when strides are
  // small: as A3 does).
  std::optional<Geometry> random_window(int64_t n, std::string* how);
  void add_input(InputRecipe in, Meta meta);

  // Two inputs over one fresh buffer in one of the aliasing shapes CASES.md names (A1-A4) and
  // their relatives: the same object, an equal view, a view with its base, disjoint slices,
  // interleaved step slices, rows, columns, overlapping slices, a transposed alias and
  // overlapping as_strided windows.
  void make_pair();
  void make_inputs();

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
  int pick_recent(const std::vector<int>& hs);

  // A handle for an operand: any tensor.
  std::optional<int> pick_any();

  // A target for a write: inputs and views of inputs often, and rarely one with internal overlap
  // (eager raises).
  std::optional<int> pick_target();
  std::optional<int> number_input() const;
  StepArg random_number();

  // Handles whose shape broadcasts with `shape` (to exactly `shape` when `exact`).
  std::vector<int> broadcast_partners(const Shape& shape, bool exact);
  StepArg tensor_or_number(const Shape& shape, bool exact, double p_number);
  int64_t random_dim(int64_t rank, bool negative_ok = true);

  // A random __getitem__ key for a shape.
  IndexKey random_key(const Shape& shape);

  // A random factorization of n into up to 3 dims (maybe with a -1).
  IntList random_reshape(int64_t n);

  // ---- steps ----

  // Builds `s`; on success records it and gives its results `meta`.
  bool emit(Step s, Meta meta, int max_results = 1);
  Step step(OpId op, std::vector<StepArg> args,
            std::vector<std::pair<std::string, StepArg>> kwargs = {});

  Meta fresh() const { return Meta{}; }
  Meta view_meta(int h) const;
  bool move_unary(bool inplace);
  bool move_binary(bool inplace);
  bool move_ternary(bool inplace);
  StepArg random_dims(int64_t rank, bool allow_none);
  bool move_reduction();
  bool move_view();
  bool move_split();
  bool move_fill();
  bool move_copy();
  bool move_clone();
  bool move_setitem();
  bool move_metadata();
  bool move_cat();

  // index_select / index_copy / index_add along a dim, with an index made by arange: a run of
  // positions, or all of them reversed (index ops, ops.def), written back in place half the time
  // (x.index_copy_(...) as the tracer records it: the functional op, then copy_).
  bool move_index();

  // The same write as a scatter: the index viewed along d and expanded to the rows' shape, and
  // a random reduction (none for bool) with or without self.
  bool scatter_rows(int h, int64_t d, int index, int rows, int source);
  bool move_softmax();
  bool move_creation();
  bool move_cast();
  bool move_matmul();
  bool move_norm();
  bool move_as_strided();
  bool try_move(Move move);
  void make_steps();
  void choose_returns();
  Rng rng_;
  Recipe r_;
  Replayer rep_;
  std::map<int, Meta> meta_;
  std::vector<BufferInfo> buffer_info_;
  std::vector<std::optional<SliceInfo>> slices_;  // per input: the slice it was made with
  int next_id_ = 0;
};

}  // namespace kiln::fuzz::generator
