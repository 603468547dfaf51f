// The storage analysis against its oracle, the reference interpreter: every trace here is both
// analyzed and run, and for every tensor value (subsymbol values included) the analysis must give
// the sizes, strides and offset the interpreter's tensor had when the value was defined, the same
// storage exactly when the interpreter's tensors share a Storage object (with its element count
// and dtype), the same tensor object exactly when the interpreter's values are one handle, and
// each input object's layout after the call. The layout errors eager raises must come out of the
// analysis word for word as the interpreter raises them.
#include "kiln/analysis/storage_analysis.h"

#include <gtest/gtest.h>

#include <map>
#include <unordered_map>

#include "kiln/kiln.h"
#include "kiln/runtime/interpreter/view_geometry.h"

namespace kiln {
namespace {

// ---- the differential harness -------------------------------------------------------------------

// What the interpreter made for one value, at the moment the value was defined.
struct Seen {
  TensorHandle handle;  // kept alive, so that object and storage addresses stay unique
  std::shared_ptr<Storage> storage;
  Geometry geometry;
};

// The pattern of a call, computed the simple way for tests: one group per Storage object (the
// whole storage is the group's base, so offsets agree with the interpreter's), the same handle
// twice is a duplicate.
AliasPattern pattern_of(const std::vector<RtValue>& inputs) {
  AliasPattern p;
  std::map<const Storage*, int> group_of;
  std::vector<int> members;
  for (size_t i = 0; i < inputs.size(); ++i) {
    AliasPattern::Input entry;
    if (const TensorHandle* t = std::get_if<TensorHandle>(&inputs[i])) {
      const Storage* s = (*t)->storage.get();
      if (!group_of.contains(s)) {
        group_of[s] = static_cast<int>(p.groups.size());
        p.groups.push_back({(*t)->dtype(), (*t)->storage->numel(), false});
        members.push_back(0);
      }
      entry.group = group_of[s];
      entry.geometry = geometry_of(**t);
      for (size_t j = 0; j < i; ++j) {
        const TensorHandle* u = std::get_if<TensorHandle>(&inputs[j]);
        if (u && u->get() == t->get()) {
          entry.duplicate_of = static_cast<int>(j);
          break;
        }
      }
      if (entry.duplicate_of < 0) ++members[static_cast<size_t>(entry.group)];
    }
    p.inputs.push_back(entry);
  }
  for (const AliasPattern::Input& in : p.inputs) {
    if (in.group < 0) continue;
    AliasPattern::Group& g = p.groups[static_cast<size_t>(in.group)];
    g.synthetic = members[static_cast<size_t>(in.group)] > 1 || in.geometry.offset != 0 ||
                  !is_contiguous(in.geometry.sizes, in.geometry.strides) ||
                  shape_numel(in.geometry.sizes) != g.numel;
  }
  return p;
}

void collect(const Node& node, std::vector<const Value*>& out) {
  for (const auto& sub : node.subsymbols)
    collect(*sub, out);
  for (const Value* v : node.outputs) {
    if (std::find(out.begin(), out.end(), v) == out.end()) out.push_back(v);
  }
}

// Every tensor value of the trace: inputs, node outputs and subsymbol outputs.
std::vector<const Value*> tensor_values(const Trace& trace) {
  std::vector<const Value*> all(trace.inputs().begin(), trace.inputs().end());
  for (const auto& node : trace.nodes())
    collect(*node, all);
  std::erase_if(all, [](const Value* v) { return !v->is_tensor(); });
  return all;
}

std::string geometry_str(const Geometry& g) {
  return shape_str(g.sizes) + " strides=" + shape_str(g.strides) +
         " offset=" + std::to_string(g.offset);
}

// Runs the trace in the interpreter and the analysis, and compares them value by value.
void expect_matches_interpreter(const Trace& trace, const std::vector<RtValue>& inputs,
                                const AliasPattern& pattern) {
  SCOPED_TRACE(print_trace(trace));
  StorageAnalysis sa = analyze_storage(trace, pattern);
  std::unordered_map<const Value*, Seen> seen;
  interpret_observed(trace, inputs, [&](const Value* v, const RtValue& r) {
    if (const TensorHandle* t = std::get_if<TensorHandle>(&r))
      seen[v] = Seen{*t, (*t)->storage, geometry_of(**t)};
  });

  std::map<int, const Storage*> runtime_storage;  // analysis storage id -> interpreter storage
  std::map<const Storage*, int> analysis_storage;
  std::map<int, const RtTensor*> runtime_object;  // analysis handle -> interpreter object
  std::map<const RtTensor*, int> analysis_object;
  for (const Value* v : tensor_values(trace)) {
    ASSERT_TRUE(seen.contains(v)) << "the interpreter never defined " << v->name();
    ASSERT_TRUE(sa.has(v)) << "the analysis never placed " << v->name();
    const Seen& s = seen.at(v);
    EXPECT_EQ(sa.geometry_of(v), s.geometry)
        << v->name() << ": the analysis says " << geometry_str(sa.geometry_of(v))
        << ", the interpreter made " << geometry_str(s.geometry);

    int id = sa.storage_of(v);
    auto [r, fresh_id] = runtime_storage.emplace(id, s.storage.get());
    EXPECT_EQ(r->second, s.storage.get())
        << v->name() << " is in storage " << id << " but the interpreter put it elsewhere";
    auto [a, fresh_storage] = analysis_storage.emplace(s.storage.get(), id);
    EXPECT_EQ(a->second, id) << v->name() << " shares a storage with an earlier value in the "
                             << "interpreter, but not in the analysis";
    if (fresh_id) {
      const StorageInfo& info = sa.storage(id);
      EXPECT_EQ(info.numel, s.storage->numel()) << "elements of " << v->name() << "'s storage";
      EXPECT_EQ(info.dtype, s.storage->dtype) << "dtype of " << v->name() << "'s storage";
      bool is_input_group = static_cast<size_t>(id) < pattern.groups.size();
      EXPECT_EQ(info.input_group, is_input_group ? id : -1) << v->name();
    }

    int h = sa.handle_of(v);
    auto [ro, fresh_handle] = runtime_object.emplace(h, s.handle.get());
    EXPECT_EQ(ro->second, s.handle.get())
        << v->name() << " names object " << h << " but the interpreter's value is another object";
    auto [ao, fresh_object] = analysis_object.emplace(s.handle.get(), h);
    EXPECT_EQ(ao->second, h) << v->name() << " is an earlier value's object in the interpreter, "
                             << "but not in the analysis";
  }
  // The caller's tensors after the call (metadata mutations change them).
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value* v = trace.inputs()[i];
    if (!v->is_tensor()) continue;
    const RtTensor& t = *std::get<TensorHandle>(inputs[i]);
    EXPECT_EQ(sa.final_placement(sa.handle_of(v)).geometry, geometry_of(t))
        << "input " << v->name() << " after the call";
    EXPECT_EQ(sa.final_placement(sa.handle_of(v)).storage, pattern.inputs[i].group);
  }
}

std::vector<RtValue> random_inputs(const Trace& trace, uint64_t seed = 1) {
  std::vector<RtValue> inputs;
  for (const Value* v : trace.inputs())
    inputs.push_back(make_random_input(v->tensor_type(), seed++));
  return inputs;
}

void expect_matches_interpreter(const Trace& trace) {
  std::vector<RtValue> inputs = random_inputs(trace);
  AliasPattern pattern = pattern_of(inputs);
  expect_matches_interpreter(trace, inputs, pattern);
}

// Runs `fn` and returns the UserError's message ("" if none was raised).
template <class Fn>
std::string user_error_of(Fn fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// The interpreter and the analysis raise the same UserError, naming the op and this file's line.
void expect_same_error(const Trace& trace, const std::vector<RtValue>& inputs,
                       const AliasPattern& pattern, const std::string& text,
                       const std::string& op) {
  SCOPED_TRACE(print_trace(trace));
  std::string from_analysis = user_error_of([&] { analyze_storage(trace, pattern); });
  std::string from_interpreter = user_error_of([&] { interpret(trace, inputs); });
  EXPECT_NE(from_analysis.find(text), std::string::npos) << "analysis: " << from_analysis;
  EXPECT_NE(from_analysis.find(op + " at storage_analysis_test.cpp:"), std::string::npos)
      << from_analysis;
  EXPECT_EQ(from_analysis, from_interpreter);
}

void expect_same_error(const Trace& trace, const std::string& text, const std::string& op) {
  std::vector<RtValue> inputs = random_inputs(trace);
  expect_same_error(trace, inputs, pattern_of(inputs), text, op);
}

// ---- input layouts ------------------------------------------------------------------------------

// f32[2, 3, 4] in the layouts a caller may pass.
std::vector<TensorSpec> layouts_234() {
  return {
      TensorSpec(f32, {2, 3, 4}),                         // contiguous
      TensorSpec(f32, {2, 3, 4}).strided({1, 2, 6}),      // permute of a [4, 3, 2] tensor
      TensorSpec(f32, {2, 3, 4}).strided({16, 5, 1}, 3),  // a padded slice of a bigger buffer
      TensorSpec(f32, {2, 3, 4}).strided({0, 4, 1}),      // expanded along dim 0
      TensorSpec(f32, {2, 3, 4}).strided({12, 1, 3}, 1),  // transposed inner dims, offset
      TensorSpec(f32, {2, 3, 4}).strided({24, 8, 2}),     // every other element
  };
}

// f32[4, 4] layouts that may be written (no internal overlap).
std::vector<TensorSpec> writable_44() {
  return {
      TensorSpec(f32, {4, 4}),
      TensorSpec(f32, {4, 4}).strided({1, 4}),
      TensorSpec(f32, {4, 4}).strided({6, 1}, 2),
      TensorSpec(f32, {4, 4}).strided({1, 8}, 1),
  };
}

// ---- views --------------------------------------------------------------------------------------

TEST(StorageAnalysis, EveryViewOpOverEveryLayout) {
  auto views = [](Tensor a) {
    std::vector<Tensor> out;
    out.push_back(a.reshape({6, 4}));  // a view or a copy, by layout
    out.push_back(a.reshape({-1}));
    out.push_back(a.reshape({4, 1, 6}));
    out.push_back(a.permute({2, 0, 1}));
    out.push_back(a.transpose(0, 2));
    out.push_back(a.select(1, -1).t());
    out.push_back(a.unsqueeze(1).expand({2, 5, 3, 4}));
    out.push_back(a.unsqueeze(-1).squeeze());
    out.push_back(a.narrow(2, -3, 2).unsqueeze(0).squeeze(IntList{0}));
    out.push_back(a.flatten(0, 1));  // a view or a copy, by layout
    out.push_back(a.flatten(1, 1));  // the same object
    out.push_back(a.flatten());
    out.push_back(a.unflatten(2, {2, 2}));
    out.push_back(a.slice(2, 1, std::nullopt, 2));
    out.push_back(a.slice(0, -1));
    out.push_back(a.slice(1, 5, 7));  // empty
    out.push_back(a.diagonal(1, 1, 2));
    out.push_back(a.diagonal(-1, 2, 1));
    out.push_back(a.diagonal(5, 1, 2));  // empty: keeps the offset
    out.push_back(a.as_strided({2, 2}, {1, 4}));
    out.push_back(a.as_strided({3}, {2}, 1));
    for (const Tensor& t : a.split(3, 2))
      out.push_back(t);
    for (const Tensor& t : a.split(IntList{1, 2}, 1))
      out.push_back(t);
    for (const Tensor& t : a.chunk(3, 2))
      out.push_back(t);
    for (const Tensor& t : a.unbind(1))
      out.push_back(t);
    out.push_back(a.detach());
    out.push_back(a.alias());
    out.push_back(a.index({0, Slice(None, None, 2), None, Ellipsis}));
    out.push_back(a.index({Ellipsis, 1}));
    out.push_back(a.index({}));
    out.push_back(a[1]);
    out.push_back(a.select(0, 1).t().reshape({12}));
    out.push_back(a.select(2, 0).t().flatten());
    return out;
  };
  for (const TensorSpec& spec : layouts_234())
    expect_matches_interpreter(trace(views, {spec}));
}

TEST(StorageAnalysis, ViewsOfScalarsAndEmptyTensors) {
  expect_matches_interpreter(trace(
      [](Tensor a) {
        return std::vector<Tensor>{a.flatten(),   a.unsqueeze(0), a.reshape({1, 1}),
                                   a.expand({3}), a.view({1}),    a.squeeze(),
                                   a.t()};
      },
      {TensorSpec(f32, {})}));
  expect_matches_interpreter(trace(
      [](Tensor a) {
        return std::vector<Tensor>{a.reshape({3, 0}), a.flatten(),        a.t(),
                                   a.view({0}),       a.unsqueeze(1),     a + 1,
                                   a.sum(IntList{0}), a.t().reshape({-1})};
      },
      {TensorSpec(f32, {0, 3})}));
}

TEST(StorageAnalysis, ViewsOfViews) {
  for (const TensorSpec& spec : writable_44()) {
    expect_matches_interpreter(trace(
        [](Tensor a) {
          Tensor v = a.t().narrow(0, 1, 2).unsqueeze(1).expand({2, 3, 4});
          Tensor w = v.select(1, 0).diagonal().as_strided({2}, {3}, 2);
          Tensor x = a.view({2, 2, 4}).permute({2, 1, 0}).reshape({8, 2});
          return std::make_tuple(v, w, x, x.reshape({16}), v.reshape({24}));
        },
        {spec}));
  }
}

// ---- in-place ops -------------------------------------------------------------------------------

TEST(StorageAnalysis, InPlaceThroughViews) {
  for (const TensorSpec& spec : writable_44()) {
    expect_matches_interpreter(trace(
        [](Tensor a, Tensor b) {
          a.select(0, 1).add_(b);
          a.t().narrow(0, 1, 2).mul_(2);
          a.diagonal().copy_(b);
          a.index_put_({Slice(0, 2), 3}, 7.0);
          a.index_put_({3}, b);
          a.index_put_({Ellipsis, Slice(None, None, 2)}, b.narrow(0, 0, 2));
          Tensor v = a.reshape({2, 8});
          v.sub_(1);
          a.unsqueeze(0).expand({2, 4, 4}).fill_(0.5);  // fill_ never checks overlap
          b.zero_();
          a.copy_(a);                                      // onto itself: nothing happens
          a.expand({2, 4, 4}).copy_(a.expand({2, 4, 4}));  // the same memory: nothing happens
          a.as_strided({2, 2}, {1, 1}).add_(1);            // self-overlap PyTorch allows
          a.addcmul_(b, b.unsqueeze(1), 2);
          a.clamp_(b, 1.0);
          return std::make_tuple(a, v, a * 2, b);
        },
        {spec, TensorSpec(f32, {4})}));
  }
}

TEST(StorageAnalysis, InPlaceConvertsAndKeepsTheObject) {
  expect_matches_interpreter(trace(
      [](Tensor a, Tensor b) {
        Tensor c = a.to(f64);
        c.add_(b);  // f64 += i64
        a.mul_(b.to(f32));
        Tensor d = a.to(f32);  // the same object
        d.div_(2);
        return std::make_tuple(a, c, d);
      },
      {TensorSpec(f32, {3, 2}).strided({1, 3}), TensorSpec(i64, {3, 2})}));
}

// ---- metadata mutations -------------------------------------------------------------------------

TEST(StorageAnalysis, MetadataMutationsChangeTheObject) {
  expect_matches_interpreter(trace(
      [](Tensor a, Tensor b) {
        a.t_();  // a: [3, 2]
        a.add_(1);
        Tensor c = a + b;
        b.squeeze_();            // [3]
        b.unsqueeze_(0);         // [1, 3]
        b.transpose_(0, 1);      // [3, 1]
        b.squeeze_(IntList{1});  // [3]
        Tensor d = b * 2;
        Tensor e = a.clone();
        e.as_strided_({2, 2}, {1, 2}, 1);
        e.mul_(3);
        Tensor v = a.narrow(0, 0, 2);
        v.t_();
        v.add_(1);
        Tensor f = v.reshape({4});  // a copy: v is transposed
        return std::make_tuple(a, b, c, d, e, v, f);
      },
      {TensorSpec(f32, {2, 3}), TensorSpec(f32, {3, 1})}));
}

// The interpreter changes the tensor object, so every name of it sees the new layout: `to` to
// the same dtype and flatten(d, d) return the object itself, and a duplicate input is one object.
TEST(StorageAnalysis, EveryNameOfAnObjectSeesItsMetadataMutation) {
  expect_matches_interpreter(trace(
      [](Tensor a) {
        Tensor same = a.to(f32);
        same.t_();
        Tensor r = a + 0;  // `a` names the transposed object
        Tensor g = a.flatten(1, 1);
        g.transpose_(0, 1);
        return std::make_tuple(r, a * 1, g);
      },
      {TensorSpec(f32, {3, 3})}));

  // The same tensor passed twice.
  Trace t = trace(
      [](Tensor a, Tensor b) {
        a.t_();
        return b + 1;
      },
      {TensorSpec(f32, {3, 3}), TensorSpec(f32, {3, 3})});
  TensorHandle x = make_random_input(t.inputs()[0]->tensor_type(), 3);
  std::vector<RtValue> inputs{x, x};
  AliasPattern pattern;
  pattern.groups = {{f32, 9, false}};
  pattern.inputs = {{0, Geometry{{3, 3}, {3, 1}, 0}, -1}, {0, Geometry{{3, 3}, {3, 1}, 0}, 0}};
  EXPECT_EQ(pattern, pattern_of(inputs));
  expect_matches_interpreter(t, inputs, pattern);

  // A printed trace may read a name after its object was mutated.
  Trace parsed = parse_trace(R"(def computation(a):
  # a: "cpu f32[3, 3]"
  t0 = ltorch.add_(a, 1)
  t1 = ltorch.transpose_(t0, 0, 1)
  t2 = ltorch.mul(a, 2)
  t3 = ltorch.t_(a)
  t4 = ltorch.add(t0, t2)
  return {"output": (t4,)}
)");
  expect_matches_interpreter(parsed);
}

// ---- elementwise layouts ------------------------------------------------------------------------

TEST(StorageAnalysis, ElementwiseOutputsFollowTensorIterator) {
  std::vector<TensorSpec> layouts = {
      TensorSpec(f32, {3, 4}),
      TensorSpec(f32, {3, 4}).strided({1, 3}),
      TensorSpec(f32, {3, 4}).strided({8, 2}, 1),
      TensorSpec(f32, {3, 4}).strided({0, 1}),
      TensorSpec(f32, {3, 4}).strided({1, 0}),
  };
  auto body = [](Tensor a, Tensor b, Tensor c) {
    std::vector<Tensor> out;
    out.push_back(a + b);
    out.push_back(b + a);
    out.push_back(a * c);
    out.push_back(a.t() + c.t());
    out.push_back(a + 1);
    out.push_back(2 * a);
    out.push_back(a.clamp(0.0, 0.5));  // bounds are kernel parameters
    out.push_back(a.clamp(c));
    out.push_back(a.pow(2));
    out.push_back(a.pow(a.t().t()));
    out.push_back(a.lerp(a.t().t(), 0.3));
    out.push_back(where(a > 0, a, c));
    out.push_back(where(a > 0, 1.0, a.t().t()));
    out.push_back(a.to(f64));
    out.push_back(a.to(f32));
    out.push_back(a.to(i32) + 1);
    out.push_back(a.exp());
    out.push_back(-a);
    out.push_back(~(a > 0));
    out.push_back(a.unsqueeze(0).expand({2, 3, 4}) + b);
    out.push_back(a.t().unsqueeze(0) + a.t());
    out.push_back(a.permute({1, 0}).unsqueeze(2) * c.unsqueeze(0));
    out.push_back(a.addcmul(b, c, 0.5));
    out.push_back(a.isnan());
    return out;
  };
  for (const TensorSpec& spec : layouts) {
    for (const TensorSpec& other : {TensorSpec(f32, {4}), TensorSpec(f32, {4}).strided({2})}) {
      expect_matches_interpreter(trace(body, {spec, other, TensorSpec(f32, {3, 1})}));
    }
  }
}

// Size-1 dims may carry any stride: the same-shape fast path copies a layout that the general
// path would not, so which operands count (numbers as 0-dim operands or as kernel parameters)
// shows in the result.
TEST(StorageAnalysis, ElementwiseOverSizeOneDims) {
  for (const TensorSpec& spec :
       {TensorSpec(f32, {1, 3}).strided({1, 1}), TensorSpec(f32, {3, 1}).strided({1, 1}),
        TensorSpec(f32, {1, 3, 1}).strided({1, 1, 5}),
        TensorSpec(f32, {2, 1, 3}).strided({1, 7, 2})}) {
    expect_matches_interpreter(trace(
        [](Tensor a) {
          return std::vector<Tensor>{
              a.exp(),   a + 1,          a.clamp(0.0, 0.5), a.clamp(0.0),   a.pow(2),
              a.pow(a),  a.lerp(a, 0.5), a.lerp(a, a),      a * a,          where(a > 0, a, 0.0),
              a.to(f64), zeros_like(a),  a.clone(),         a.reshape({-1})};
        },
        {spec}));
  }
}

// ---- allocating ops -----------------------------------------------------------------------------

TEST(StorageAnalysis, ScattersPreserveTheInputsLayout) {
  std::vector<TensorSpec> layouts = writable_44();
  layouts.push_back(TensorSpec(f32, {4, 4}).strided({0, 1}));  // cloned contiguously
  layouts.push_back(TensorSpec(f32, {4, 4}).strided({1, 1}));  // self-overlapping, kept
  for (const TensorSpec& spec : layouts) {
    expect_matches_interpreter(trace(
        [](Tensor a, Tensor b) {
          Tensor s = slice_scatter(a, b.unsqueeze(0).expand({2, 4}), 0, 1, 3);
          Tensor t = select_scatter(a, b, 1, 2);
          Tensor d = diagonal_scatter(a, b);
          Tensor e = as_strided_scatter(a, b, {4}, {1}, 2);
          Tensor f = slice_scatter(a.t(), b.unsqueeze(1), 1, 0, 4, 4);
          Tensor g = select_scatter(a.unsqueeze(0).expand({2, 4, 4}), a, 0, 1);
          // A scatter copies its input's whole storage, not just the elements the view reaches.
          Tensor h = select_scatter(a.narrow(1, 1, 2), b.narrow(0, 0, 2), 0, 1);
          return std::make_tuple(s, t, d, e, f, g, s.t().reshape({16}), h);
        },
        {spec, TensorSpec(f32, {4})}));
  }
}

TEST(StorageAnalysis, ReductionsCreationJoinsAndProducts) {
  for (const TensorSpec& spec : layouts_234()) {
    expect_matches_interpreter(trace(
        [](Tensor a) {
          std::vector<Tensor> out;
          out.push_back(a.sum());
          out.push_back(a.sum(IntList{1}, true));
          out.push_back(a.mean(IntList{0, 2}));
          out.push_back(a.amax({-1}));
          out.push_back(a.amin({0}, true));
          out.push_back(a.argmax(1));
          out.push_back(a.argmin());
          out.push_back(a.var(IntList{2}));
          out.push_back(a.std(std::nullopt, 0));
          out.push_back(a.prod(0, false, f64));
          out.push_back(full({2, 3}, 1.5));
          out.push_back(zeros({4}, i64));
          out.push_back(ones({2, 1}));
          out.push_back(arange(0, 5));
          out.push_back(full_like(a, 2));
          out.push_back(zeros_like(a));
          out.push_back(ones_like(a.transpose(0, 2), i32));
          out.push_back(empty_like(a, f64));
          out.push_back(fill(a, 3.0));
          out.push_back(fill(a, a.sum()));
          out.push_back(a.clone());
          out.push_back(cat({a, a.clone()}, 1));
          out.push_back(cat({a, a}, -1));
          out.push_back(stack({a, a}, 1));
          out.push_back(matmul(a, a.transpose(1, 2)));
          return out;
        },
        {spec}));
  }
}

TEST(StorageAnalysis, MatrixProducts) {
  expect_matches_interpreter(trace(
      [](Tensor a, Tensor b, Tensor w, Tensor bias) {
        return std::vector<Tensor>{matmul(a, b.t()),
                                   matmul(a.t(), a),
                                   a.matmul(w.t()),
                                   matmul(a.select(0, 1), w.t()),
                                   matmul(w, a.select(0, 0)),
                                   bmm(a.unsqueeze(0), w.t().unsqueeze(0)),
                                   linear(a, w),
                                   linear(a.t().t(), w, bias)};
      },
      {TensorSpec(f32, {2, 3}).strided({1, 2}), TensorSpec(f32, {2, 3}),
       TensorSpec(f32, {4, 3}).strided({1, 4}), TensorSpec(f32, {4}).strided({3}, 1)}));
}

TEST(StorageAnalysis, DecompositionsRunThroughTheirSubsymbols) {
  for (const TensorSpec& spec :
       {TensorSpec(f32, {3, 4}), TensorSpec(f32, {3, 4}).strided({1, 3}),
        TensorSpec(f16, {3, 4}).strided({1, 3}), TensorSpec(bf16, {3, 4}).strided({8, 2})}) {
    expect_matches_interpreter(trace(
        [](Tensor x, Tensor w, Tensor b) {
          return std::vector<Tensor>{softmax(x, -1),
                                     log_softmax(x, 0, f64),
                                     x.softmax(0),
                                     layer_norm(x, {4}),
                                     layer_norm(x.to(f32), {4}, w, b),
                                     rms_norm(x, {4}),
                                     rms_norm(x.to(f32), {3, 4}, w.unsqueeze(0).expand({3, 4})),
                                     x.index({Slice(1), None, -1})};
        },
        {spec, TensorSpec(f32, {4}), TensorSpec(f32, {4}).strided({2})}));
  }
}

// ---- aliased inputs -----------------------------------------------------------------------------

TEST(StorageAnalysis, OverlappingInputsShareTheirGroupsStorage) {
  Trace t = trace(
      [](Tensor a, Tensor b) {
        a.add_(1);  // strides (9, 1) over 4 rows: not dense, so no partial-overlap check
        b.mul_(2);
        Tensor s = a + b;
        a.t_();
        b.select(0, 0).copy_(a.select(1, 0));
        return std::make_tuple(a, s, b.diagonal(), b.reshape({16}));
      },
      {TensorSpec(f32, {4, 4}).strided({9, 1}, 0), TensorSpec(f32, {4, 4}).strided({9, 1}, 24)});
  TensorHandle base = make_tensor(f32, {64}, std::vector<double>(64, 0.25));
  std::vector<RtValue> inputs{make_view(base, {4, 4}, {9, 1}, 0),
                              make_view(base, {4, 4}, {9, 1}, 24)};
  AliasPattern pattern;
  pattern.groups = {{f32, 64, true}};
  pattern.inputs = {{0, Geometry{{4, 4}, {9, 1}, 0}, -1}, {0, Geometry{{4, 4}, {9, 1}, 24}, -1}};
  EXPECT_EQ(pattern, pattern_of(inputs));
  expect_matches_interpreter(t, inputs, pattern);
}

TEST(StorageAnalysis, DenseViewsOfOneStorage) {
  Trace t = trace(
      [](Tensor a, Tensor b, Tensor n) {
        a.add_(b);  // disjoint halves: allowed
        b.view({4}).mul_(n);
        return std::make_tuple(a, b.t());
      },
      {TensorSpec(f32, {2, 2}).strided({2, 1}, 0), TensorSpec(f32, {2, 2}).strided({2, 1}, 4),
       TensorSpec(f32, {4})});
  TensorHandle base = make_tensor(f32, {8}, std::vector<double>(8, 1.0));
  std::vector<RtValue> inputs{make_view(base, {2, 2}, {2, 1}, 0),
                              make_view(base, {2, 2}, {2, 1}, 4),
                              make_tensor(f32, {4}, {1, 2, 3, 4})};
  AliasPattern pattern;
  pattern.groups = {{f32, 8, true}, {f32, 4, false}};
  pattern.inputs = {{0, Geometry{{2, 2}, {2, 1}, 0}, -1},
                    {0, Geometry{{2, 2}, {2, 1}, 4}, -1},
                    {1, Geometry{{4}, {1}, 0}, -1}};
  EXPECT_EQ(pattern, pattern_of(inputs));
  expect_matches_interpreter(t, inputs, pattern);

  // Overlapping halves: eager raises for the partial overlap, and so does the analysis.
  Trace u = trace(
      [](Tensor a, Tensor b) {
        Tensor s = a * 2;
        a.add_(b);
        return s;
      },
      {TensorSpec(f32, {2, 2}).strided({2, 1}, 0), TensorSpec(f32, {2, 2}).strided({2, 1}, 2)});
  std::vector<RtValue> overlapping{make_view(base, {2, 2}, {2, 1}, 0),
                                   make_view(base, {2, 2}, {2, 1}, 2)};
  expect_same_error(u, overlapping, pattern_of(overlapping), "some elements of the input tensor",
                    "add_");
}

// ---- errors -------------------------------------------------------------------------------------

TEST(StorageAnalysis, ViewOfATransposedTensorRaises) {
  expect_same_error(trace([](Tensor a) { return a.t().view({12}); }, {TensorSpec(f32, {3, 4})}),
                    "view size is not compatible with input tensor's size and stride", "view");
  expect_same_error(trace(
                        [](Tensor a) {
                          return a.view({2, 12});
                        },
                        {TensorSpec(f32, {2, 3, 4}).strided({16, 5, 1}, 3)}),
                    "Use .reshape(...) instead.", "view");
  expect_same_error(trace(
                        [](Tensor a) {
                          return a.permute({1, 0, 2}).unflatten(0, {1, 3}).view({6, 4});
                        },
                        {TensorSpec(f32, {2, 3, 4})}),
                    "view size is not compatible", "view");
}

TEST(StorageAnalysis, WritesIntoOverlappingMemoryRaise) {
  const std::string internal = "more than one element of the written-to tensor refers to a single";
  const std::string partial = "some elements of the input tensor and the written-to tensor";
  expect_same_error(trace(
                        [](Tensor a) {
                          a.unsqueeze(0).expand({3, 4}).add_(1);
                        },
                        {TensorSpec(f32, {4})}),
                    internal, "add_");
  expect_same_error(trace(
                        [](Tensor a, Tensor b) {
                          a.expand({3, 4}).copy_(b);
                        },
                        {TensorSpec(f32, {4}), TensorSpec(f32, {3, 4})}),
                    internal, "copy_");
  expect_same_error(trace([](Tensor a) { a.add_(1); }, {TensorSpec(f32, {3, 4}).strided({0, 1})}),
                    internal, "add_");
  // x[..., 0] = b on an expanded x: the write is setitem_'s copy_ subsymbol.
  expect_same_error(trace(
                        [](Tensor a, Tensor b) {
                          a.expand({2, 4}).index_put_({Ellipsis, 0}, b);
                        },
                        {TensorSpec(f32, {4}), TensorSpec(f32, {2})}),
                    internal, "copy_");
  expect_same_error(
      trace([](Tensor a) { a.narrow(0, 0, 3).add_(a.narrow(0, 1, 3)); }, {TensorSpec(f32, {4})}),
      partial, "add_");
  expect_same_error(
      trace([](Tensor a) { a.narrow(0, 0, 3).copy_(a.narrow(0, 1, 3)); }, {TensorSpec(f32, {4})}),
      partial, "copy_");
  expect_same_error(trace([](Tensor a) { a.add_(a.t()); }, {TensorSpec(f32, {3, 3})}), partial,
                    "add_");
  expect_same_error(trace([](Tensor a, Tensor b) { return as_strided_scatter(a, b, {4}, {0}); },
                          {TensorSpec(f32, {4, 4}), TensorSpec(f32, {4})}),
                    internal, "as_strided_scatter");
}

TEST(StorageAnalysis, AsStridedOutsideAnInputIsUnsupported) {
  // Eager may allow these when the caller's storage is larger than the input; kiln cannot see
  // that memory, so it says so instead of guessing.
  std::vector<Trace> traces;
  traces.push_back(trace([](Tensor a) { return a.as_strided({4}, {2}); }, {TensorSpec(f32, {4})}));
  traces.push_back(trace([](Tensor a) { a.as_strided_({3}, {1}, 2); }, {TensorSpec(f32, {4})}));
  for (const Trace& t : traces) {
    try {
      analyze_storage(t, AliasPattern::distinct(t));
      ADD_FAILURE() << "expected an UnsupportedError";
    } catch (const UnsupportedError& e) {
      EXPECT_NE(
          std::string(e.what()).find("not supported by kiln: this view reaches memory outside"),
          std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(" at storage_analysis_test.cpp:"), std::string::npos);
    }
  }
}

TEST(StorageAnalysis, AsStridedOutsideTheStorageRaises) {
  expect_same_error(trace(
                        [](Tensor a) {
                          return (a + 1).as_strided({2, 2}, {3, 3});
                        },
                        {TensorSpec(f32, {5})}),
                    "out of bounds", "as_strided");
  expect_same_error(trace([](Tensor a, Tensor b) { return as_strided_scatter(a, b, {4}, {4}, 4); },
                          {TensorSpec(f32, {4, 4}), TensorSpec(f32, {4})}),
                    "out of bounds", "as_strided_scatter");
}

TEST(StorageAnalysis, PatternMustFitTheTrace) {
  Trace t = trace([](Tensor a) { return a + 1; }, {TensorSpec(f32, {2, 2})});
  AliasPattern wrong;
  wrong.groups = {{f32, 4, false}};
  wrong.inputs = {{0, Geometry{{4}, {1}, 0}, -1}};
  EXPECT_THROW(analyze_storage(t, wrong), UserError);
  wrong.inputs = {{0, Geometry{{2, 2}, {3, 1}, 0}, -1}};  // reaches element 4 of 4
  EXPECT_THROW(analyze_storage(t, wrong), UserError);
  EXPECT_THROW(analyze_storage(t, AliasPattern{}), UserError);
  // The default pattern: every input its own contiguous storage.
  StorageAnalysis sa = analyze_storage(t, AliasPattern::distinct(t));
  EXPECT_EQ(sa.num_storages(), 2u);
  EXPECT_EQ(sa.storage(0).input_group, 0);
  EXPECT_EQ(sa.storage(1).input_group, -1);
  EXPECT_EQ(sa.storage_of(t.outputs()[0]), 1);
}

}  // namespace
}  // namespace kiln
