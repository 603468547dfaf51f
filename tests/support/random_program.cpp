// Random eager programs (random_program.h): the generator's handles, moves and returns, and a
// recipe's materialization; the generator's inputs are random_inputs.cpp, its steps
// random_steps.cpp (random_generator.h declares it). Their differential check, shrinking and
// reports are differential_check.cpp.
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

#include "support/random_generator.h"

namespace kiln::fuzz {

namespace generator {

int Generator::pick_recent(const std::vector<int>& hs) {
  std::vector<double> w;
  int now = static_cast<int>(r_.steps.size());
  for (int h : hs)
    w.push_back(meta_[h].made_at >= now - 3 ? 3.0 : 1.0);
  return hs[rng_.weighted(w)];
}

std::optional<int> Generator::pick_any() {
  std::vector<int> hs = all_tensors();
  if (hs.empty()) return std::nullopt;
  return pick_recent(hs);
}

std::optional<int> Generator::pick_target() {
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

std::optional<int> Generator::number_input() const {
  for (const InputRecipe& in : r_.inputs)
    if (in.is_number) return in.handle;
  return std::nullopt;
}

StepArg Generator::random_number() {
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

std::vector<int> Generator::broadcast_partners(const Shape& shape, bool exact) {
  return tensors([&](int h) {
    try {
      Shape b = broadcast_shapes(shape, shape_of(h));
      return !exact || b == shape;
    } catch (const UserError&) {
      return false;
    }
  });
}

StepArg Generator::tensor_or_number(const Shape& shape, bool exact, double p_number) {
  if (rng_.chance(p_number)) return random_number();
  std::vector<int> hs = broadcast_partners(shape, exact);
  if (hs.empty()) return random_number();
  return HandleRef{pick_recent(hs)};
}

int64_t Generator::random_dim(int64_t rank, bool negative_ok) {
  if (rank == 0) return rng_.chance(0.5) ? 0 : -1;
  int64_t d = rng_.uniform(0, rank - 1);
  if (negative_ok && rng_.chance(0.25)) d -= rank;
  return d;
}

IndexKey Generator::random_key(const Shape& shape) {
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

IntList Generator::random_reshape(int64_t n) {
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

}  // namespace generator

namespace {

using namespace generator;

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
