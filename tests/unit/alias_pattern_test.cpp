// Alias patterns (DESIGN.md 2.3): which call arguments share memory, the overlap test, and the
// text form. The CASES.md aliasing programs (A1-A4) appear here as the patterns of their calls.
#include "kiln/analysis/alias_pattern.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "kiln/ir/builder.h"
#include "kiln/support/error.h"

namespace kiln {
namespace {

constexpr uintptr_t kStorageX = 0x1000;
constexpr uintptr_t kStorageY = 0x2000;

TensorDescription view(uintptr_t storage, Shape sizes, Strides strides, int64_t offset,
                       DType dtype = DType::kFloat32) {
  TensorDescription d;
  d.storage = storage;
  d.dtype = dtype;
  d.element_size = dtype_size(dtype);
  d.geometry = Geometry{std::move(sizes), std::move(strides), offset};
  return d;
}

TensorDescription contiguous(uintptr_t storage, Shape sizes, int64_t offset = 0,
                             DType dtype = DType::kFloat32) {
  Strides s = contiguous_strides(sizes);
  return view(storage, std::move(sizes), std::move(s), offset, dtype);
}

TensorDescription number() {
  TensorDescription d;
  d.is_tensor = false;
  return d;
}

Geometry geo(Shape sizes, Strides strides, int64_t offset) {
  return Geometry{std::move(sizes), std::move(strides), offset};
}

// A trace whose inputs have the described types, named a, b, c, ...
Trace trace_for(const std::vector<TensorDescription>& args) {
  Trace t;
  Builder b(t);
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name(1, static_cast<char>('a' + i));
    if (!args[i].is_tensor) {
      b.add_input(name, ScalarType{ScalarKind::kFloat});
      continue;
    }
    const Geometry& g = args[i].geometry;
    b.add_input(name,
                TensorType{args[i].dtype, g.sizes, Device::cpu(), Layout{g.strides, g.offset}});
  }
  return t;
}

// The pattern of `args`, after checking that its text form reads back to it.
AliasPattern pattern_of(const std::vector<TensorDescription>& args) {
  AliasPattern p = compute_alias_pattern(args);
  EXPECT_EQ(p.inputs.size(), args.size());
  Trace t = trace_for(args);
  std::string text = p.str(t);
  AliasPattern back = AliasPattern::parse(text, t);
  EXPECT_EQ(back, p) << text;
  EXPECT_EQ(back.str(t), text);
  return p;
}

std::string text_of(const std::vector<TensorDescription>& args) {
  return compute_alias_pattern(args).str(trace_for(args));
}

// ---- CASES.md: aliased inputs ----

TEST(AliasPattern, A1_TheSameTensorTwice) {
  auto x = contiguous(kStorageX, {3});
  AliasPattern p = pattern_of({x, x});
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_FALSE(p.groups[0].synthetic);
  EXPECT_EQ(p.groups[0].numel, 3);
  EXPECT_EQ(p.inputs[0].group, 0);
  EXPECT_EQ(p.inputs[0].duplicate_of, -1);
  EXPECT_EQ(p.inputs[1].group, 0);
  EXPECT_EQ(p.inputs[1].duplicate_of, 0);
  EXPECT_EQ(p.inputs[1].geometry, p.inputs[0].geometry);
  EXPECT_EQ(text_of({x, x}), "a: own; b: same as a");
}

TEST(AliasPattern, A2_DisjointSlicesAreSeparateGroups) {
  // x = ar(4, 4); x[0:2] and x[2:4]
  auto a = view(kStorageX, {2, 4}, {4, 1}, 0);
  auto b = view(kStorageX, {2, 4}, {4, 1}, 8);
  EXPECT_FALSE(may_overlap(a.geometry, b.geometry));
  AliasPattern p = pattern_of({a, b});
  ASSERT_EQ(p.groups.size(), 2u);
  EXPECT_FALSE(p.groups[0].synthetic);
  EXPECT_FALSE(p.groups[1].synthetic);
  EXPECT_EQ(p.inputs[0].group, 0);
  EXPECT_EQ(p.inputs[1].group, 1);
  // Each is its own base, addressed from its own start.
  EXPECT_EQ(p.inputs[1].geometry, geo({2, 4}, {4, 1}, 0));
  EXPECT_EQ(text_of({a, b}), "a: own; b: own");
}

TEST(AliasPattern, A3_OverlappingAsStridedViewsShareASyntheticBase) {
  // base = ones(64); a = as_strided((4, 4), (9, 1), 0), b = as_strided((4, 4), (9, 1), 24):
  // element 27 is a[3][0] and b[0][3].
  auto a = view(kStorageX, {4, 4}, {9, 1}, 0);
  auto b = view(kStorageX, {4, 4}, {9, 1}, 24);
  EXPECT_TRUE(may_overlap(a.geometry, b.geometry));
  AliasPattern p = pattern_of({a, b});
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_TRUE(p.groups[0].synthetic);
  EXPECT_EQ(p.groups[0].numel, 55);  // elements 0 .. 24 + 27 + 3
  EXPECT_EQ(p.inputs[0].geometry, geo({4, 4}, {9, 1}, 0));
  EXPECT_EQ(p.inputs[1].geometry, geo({4, 4}, {9, 1}, 24));
  EXPECT_EQ(text_of({a, b}),
            "a: base0[4, 4] strides=(9, 1) offset=0; b: base0[4, 4] strides=(9, 1) offset=24; "
            "base0: f32[55]");
  // a's rows are elements 0..3, 9..12, 18..21 and 27..30. From offset 25 or 28, b's first row
  // still meets a's last; from 31 on it starts after a ends.
  EXPECT_TRUE(may_overlap(a.geometry, geo({4, 4}, {9, 1}, 25)));
  EXPECT_TRUE(may_overlap(a.geometry, geo({4, 4}, {9, 1}, 28)));
  EXPECT_FALSE(may_overlap(a.geometry, geo({4, 4}, {9, 1}, 31)));
  // Interleaved rows: rows 4..7, 13..16 and 22..25 sit in a's gaps.
  EXPECT_FALSE(may_overlap(a.geometry, geo({3, 4}, {9, 1}, 4)));
}

TEST(AliasPattern, A4_ATensorAndItsTranspose) {
  auto a = contiguous(kStorageX, {2, 2});
  auto at = view(kStorageX, {2, 2}, {1, 2}, 0);
  AliasPattern p = pattern_of({a, at});
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_TRUE(p.groups[0].synthetic);
  EXPECT_EQ(p.groups[0].numel, 4);
  EXPECT_EQ(p.inputs[0].duplicate_of, -1);
  EXPECT_EQ(p.inputs[1].duplicate_of, -1) << "equal element counts are not the same tensor";
  EXPECT_EQ(p.inputs[0].geometry, geo({2, 2}, {2, 1}, 0));
  EXPECT_EQ(p.inputs[1].geometry, geo({2, 2}, {1, 2}, 0));
}

// ---- other shapes of aliasing ----

TEST(AliasPattern, AViewTogetherWithItsBase) {
  auto x = contiguous(kStorageX, {4, 4});
  auto row = view(kStorageX, {4}, {1}, 0);  // x[0]
  AliasPattern p = pattern_of({x, row});
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_TRUE(p.groups[0].synthetic);
  EXPECT_EQ(p.groups[0].numel, 16);
  EXPECT_EQ(p.inputs[0].geometry, geo({4, 4}, {4, 1}, 0));
  EXPECT_EQ(p.inputs[1].geometry, geo({4}, {1}, 0));
  // The base's extent starts where the earliest member starts: x[1:] with x[2].
  AliasPattern q = pattern_of({view(kStorageX, {3, 4}, {4, 1}, 4), view(kStorageX, {4}, {1}, 8)});
  EXPECT_EQ(q.groups[0].numel, 12);
  EXPECT_EQ(q.inputs[0].geometry.offset, 0);
  EXPECT_EQ(q.inputs[1].geometry.offset, 4);
}

TEST(AliasPattern, InterleavedStepSlicesAreDisjointButShareABase) {
  // x[0::2] and x[1::2] of x = arange(8): the stride lattice separates them.
  auto even = view(kStorageX, {4}, {2}, 0);
  auto odd = view(kStorageX, {4}, {2}, 1);
  EXPECT_FALSE(may_overlap(even.geometry, odd.geometry));
  // Their extents (0..6 and 1..7) interleave, so they are views of one base: a base of either
  // alone would hold the other's elements, and writing it back would clobber them.
  AliasPattern p = pattern_of({even, odd});
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_TRUE(p.groups[0].synthetic);
  EXPECT_EQ(p.groups[0].numel, 8);
  EXPECT_EQ(p.inputs[0].geometry, geo({4}, {2}, 0));
  EXPECT_EQ(p.inputs[1].geometry, geo({4}, {2}, 1));
  EXPECT_EQ(p.inputs[1].duplicate_of, -1);
  // x[0::2] and x[2::2] do share elements.
  EXPECT_TRUE(may_overlap(even.geometry, view(kStorageX, {3}, {2}, 2).geometry));
  // A strided view alone is a synthetic base of its own, from its first element to its last.
  AliasPattern q = pattern_of({odd});
  EXPECT_TRUE(q.groups[0].synthetic);
  EXPECT_EQ(q.groups[0].numel, 7);
  EXPECT_EQ(q.inputs[0].geometry, geo({4}, {2}, 0));
}

TEST(AliasPattern, RowsOfAMatrixAreDisjoint) {
  auto r0 = view(kStorageX, {4}, {1}, 0);
  auto r1 = view(kStorageX, {4}, {1}, 4);
  auto r3 = view(kStorageX, {4}, {1}, 12);
  EXPECT_FALSE(may_overlap(r0.geometry, r1.geometry));
  AliasPattern p = pattern_of({r0, r1, r3});
  ASSERT_EQ(p.groups.size(), 3u);
  for (const auto& g : p.groups) {
    EXPECT_FALSE(g.synthetic);
    EXPECT_EQ(g.numel, 4);
  }
}

TEST(AliasPattern, ColumnsOfAMatrixAreDisjointButShareABase) {
  // x of shape (3, 4): x[:, 0], x[:, 1] and the column block x[:, 2:4].
  auto c0 = view(kStorageX, {3}, {4}, 0);
  auto c1 = view(kStorageX, {3}, {4}, 1);
  auto c23 = view(kStorageX, {3, 2}, {4, 1}, 2);
  EXPECT_FALSE(may_overlap(c0.geometry, c1.geometry));
  EXPECT_FALSE(may_overlap(c0.geometry, c23.geometry));
  EXPECT_FALSE(may_overlap(c1.geometry, c23.geometry));
  // Their extents interleave: one base over x's 12 elements.
  AliasPattern p = pattern_of({c0, c1, c23});
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_EQ(p.groups[0].numel, 12);
  EXPECT_EQ(p.inputs[2].geometry, geo({3, 2}, {4, 1}, 2));
  // A row crosses every column.
  EXPECT_TRUE(may_overlap(c1.geometry, view(kStorageX, {4}, {1}, 4).geometry));
}

TEST(AliasPattern, BigViewsGetTheUnsureAnswer) {
  // 300 x 300 blocks of a 1000-wide matrix: columns 0..299 and 500..799 never meet, but the
  // intervals overlap, the lattice (gcd 1) cannot separate them and they are too big to
  // enumerate: the answer is "may overlap".
  auto left = view(kStorageX, {300, 300}, {1000, 1}, 0);
  auto right = view(kStorageX, {300, 300}, {1000, 1}, 500);
  EXPECT_TRUE(may_overlap(left.geometry, right.geometry));
  AliasPattern p = pattern_of({left, right});
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_TRUE(p.groups[0].synthetic);
  EXPECT_EQ(p.groups[0].numel, 299 * 1000 + 799 + 1);
  // The same shapes scaled down are small enough to enumerate: exactly disjoint.
  EXPECT_FALSE(may_overlap(geo({30, 30}, {100, 1}, 0), geo({30, 30}, {100, 1}, 50)));
  // Big but separated by the lattice or by their intervals: still exact.
  EXPECT_FALSE(may_overlap(geo({100000}, {2}, 0), geo({100000}, {2}, 1)));
  EXPECT_FALSE(may_overlap(geo({100000}, {1}, 0), geo({100000}, {1}, 100000)));
}

TEST(AliasPattern, ATransposedSingleInputIsASyntheticGroupOfOne) {
  auto xt = view(kStorageX, {3, 2}, {1, 3}, 0);  // x.t() of x: (2, 3)
  AliasPattern p = pattern_of({xt});
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_TRUE(p.groups[0].synthetic);
  EXPECT_EQ(p.groups[0].numel, 6);
  EXPECT_EQ(p.inputs[0].geometry, geo({3, 2}, {1, 3}, 0));
  EXPECT_EQ(text_of({xt}), "a: base0[3, 2] strides=(1, 3) offset=0; base0: f32[6]");
}

TEST(AliasPattern, AContiguousViewWithAnOffsetIsItsOwnBase) {
  // x[1] of x: (3, 4), passed alone; size-1 dims may carry any stride (c10's is_contiguous).
  AliasPattern p = pattern_of({view(kStorageX, {1, 4}, {99, 1}, 4)});
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_FALSE(p.groups[0].synthetic);
  EXPECT_EQ(p.groups[0].numel, 4);
  EXPECT_EQ(p.inputs[0].geometry, geo({1, 4}, {4, 1}, 0));
}

TEST(AliasPattern, AnExpandedInputIsSynthetic) {
  // x.expand(3, 4) of x: (4,): every row is the same four elements.
  AliasPattern p = pattern_of({view(kStorageX, {3, 4}, {0, 1}, 2)});
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_TRUE(p.groups[0].synthetic);
  EXPECT_EQ(p.groups[0].numel, 4);
  EXPECT_EQ(p.inputs[0].geometry, geo({3, 4}, {0, 1}, 0));
}

TEST(AliasPattern, NumbersHaveNoGroupAndGroupsFollowFirstAppearance) {
  auto p0 = contiguous(kStorageX, {4, 4});
  auto q = contiguous(kStorageY, {2});
  auto r = view(kStorageX, {4}, {4}, 1);  // a column of p0
  AliasPattern p = pattern_of({number(), p0, q, number(), r});
  ASSERT_EQ(p.groups.size(), 2u);
  EXPECT_EQ(p.inputs[0].group, -1);
  EXPECT_EQ(p.inputs[3].group, -1);
  EXPECT_EQ(p.inputs[1].group, 0);
  EXPECT_EQ(p.inputs[2].group, 1);
  EXPECT_EQ(p.inputs[4].group, 0);
  EXPECT_TRUE(p.groups[0].synthetic);
  EXPECT_FALSE(p.groups[1].synthetic);
  EXPECT_EQ(text_of({number(), p0, q, number(), r}),
            "a: number; b: base0[4, 4] strides=(4, 1) offset=0; c: own; d: number; "
            "e: base0[4] strides=(4,) offset=1; base0: f32[16]");
}

TEST(AliasPattern, OverlapIsTransitive) {
  // x[0:3] overlaps x[2:5], which overlaps x[4:7]; x[0:3] and x[4:7] do not meet, but all three
  // must be views of one base.
  auto a = view(kStorageX, {3}, {1}, 0);
  auto b = view(kStorageX, {3}, {1}, 2);
  auto c = view(kStorageX, {3}, {1}, 4);
  EXPECT_FALSE(may_overlap(a.geometry, c.geometry));
  AliasPattern p = pattern_of({a, c, b});
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_EQ(p.groups[0].numel, 7);
  EXPECT_EQ(p.inputs[1].geometry.offset, 4);
  EXPECT_EQ(p.inputs[2].geometry.offset, 2);
}

TEST(AliasPattern, DuplicatesOfAStridedView) {
  auto s = view(kStorageX, {3}, {2}, 1);
  auto other = view(kStorageX, {2}, {1}, 2);
  AliasPattern p = pattern_of({s, other, s});
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_EQ(p.inputs[2].duplicate_of, 0);
  EXPECT_EQ(p.inputs[2].geometry, p.inputs[0].geometry);
  EXPECT_EQ(p.groups[0].numel, 5);  // elements 1 .. 5
}

TEST(AliasPattern, EmptyViewsNeverOverlap) {
  auto empty = view(kStorageX, {0, 4}, {4, 1}, 0);
  auto full = contiguous(kStorageX, {4, 4});
  EXPECT_FALSE(may_overlap(empty.geometry, full.geometry));
  EXPECT_FALSE(may_overlap(empty.geometry, empty.geometry));
  AliasPattern p = pattern_of({empty, full});
  EXPECT_EQ(p.groups.size(), 2u);
  EXPECT_FALSE(p.groups[0].synthetic);
  EXPECT_EQ(p.groups[0].numel, 0);
}

TEST(AliasPattern, SingleElementsAndBroadcastViews) {
  EXPECT_TRUE(may_overlap(geo({}, {}, 3), geo({}, {}, 3)));
  EXPECT_FALSE(may_overlap(geo({}, {}, 3), geo({}, {}, 4)));
  EXPECT_TRUE(may_overlap(geo({5}, {0}, 3), geo({1}, {7}, 3)));
  EXPECT_TRUE(may_overlap(geo({4}, {1}, 0), geo({3, 2}, {0, 1}, 2)));
  EXPECT_FALSE(may_overlap(geo({4}, {1}, 0), geo({3, 2}, {0, 1}, 4)));
}

TEST(AliasPattern, SameStorageWithDifferentDtypesIsAUserError) {
  auto a = contiguous(kStorageX, {4}, 0, DType::kFloat32);
  auto b = contiguous(kStorageX, {4}, 4, DType::kInt32);
  try {
    compute_alias_pattern(std::vector<TensorDescription>{a, b});
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("share memory with different dtypes"), std::string::npos)
        << e.what();
  }
  // Different storages may have any dtypes.
  EXPECT_NO_THROW(compute_alias_pattern(
      std::vector<TensorDescription>{a, contiguous(kStorageY, {4}, 0, DType::kInt32)}));
}

TEST(AliasPattern, DistinctIsAllOwnGroups) {
  auto args = std::vector<TensorDescription>{contiguous(kStorageX, {2, 3}), number(),
                                             contiguous(kStorageY, {4})};
  Trace t = trace_for(args);
  AliasPattern p = AliasPattern::distinct(t);
  EXPECT_EQ(p, compute_alias_pattern(args));
  EXPECT_EQ(p.str(t), "a: own; b: number; c: own");
  EXPECT_EQ(AliasPattern::parse(p.str(t), t), p);
}

TEST(AliasPattern, EqualViewsThatAreTwoObjectsAreNotDuplicates) {
  // x[0:2] taken twice: the same memory and layout, but two tensor objects, so a metadata
  // mutation (t_) of one leaves the other as it was. Unknown identity (0) counts as the same.
  auto a = view(kStorageX, {2, 3}, {3, 1}, 0);
  auto b = a;
  a.object = 0x10;
  b.object = 0x20;
  AliasPattern p = pattern_of({a, b});
  ASSERT_EQ(p.groups.size(), 1u);
  EXPECT_TRUE(p.groups[0].synthetic);
  EXPECT_EQ(p.groups[0].numel, 6);
  EXPECT_EQ(p.inputs[1].duplicate_of, -1);
  EXPECT_EQ(p.inputs[1].geometry, p.inputs[0].geometry);
  EXPECT_EQ(text_of({a, b}),
            "a: base0[2, 3] strides=(3, 1) offset=0; b: base0[2, 3] strides=(3, 1) offset=0; "
            "base0: f32[6]");
  // The same object twice is one input.
  b.object = a.object;
  EXPECT_EQ(pattern_of({a, b}).inputs[1].duplicate_of, 0);
}

TEST(AliasPattern, DistinctFollowsTheInputLayouts) {
  Trace t;
  Builder b(t);
  b.add_input("x", TensorType{DType::kFloat32, {2, 3}, Device::cpu(), Layout{{1, 2}, 0}});
  b.add_input("y", TensorType{DType::kInt64, {4}, Device::cpu(), Layout{{1}, 8}});
  b.add_input("z", TensorType{DType::kFloat32, {2}, Device::cpu(), std::nullopt});
  AliasPattern p = AliasPattern::distinct(t);
  EXPECT_EQ(p.str(t), "x: base0[2, 3] strides=(1, 2) offset=0; y: own; z: own; base0: f32[6]");
  EXPECT_EQ(AliasPattern::parse(p.str(t), t), p);
}

TEST(AliasPattern, TextRoundTripsAndToleratesSpacing) {
  std::vector<TensorDescription> args = {view(kStorageX, {4, 4}, {9, 1}, 0),
                                         view(kStorageX, {4, 4}, {9, 1}, 24), number(),
                                         view(kStorageX, {4}, {1}, 7)};
  Trace t = trace_for(args);
  AliasPattern p = compute_alias_pattern(args);
  EXPECT_EQ(AliasPattern::parse(
                "  base0 : f32[55];a:base0[4,4] strides=( 9 ,1 ) offset = 0 ; "
                "b: base0[4, 4] strides=(9, 1) offset=24; c: number; d: base0[4] strides=(1) "
                "offset=7;",
                t),
            p);
}

TEST(AliasPattern, BaseLabelsAvoidInputNames) {
  // An input called base0 does not clash with the label of group 0's base.
  Trace t;
  Builder b(t);
  b.add_input("base0", TensorType{DType::kFloat32, {3, 2}, Device::cpu(), Layout{{1, 3}, 0}});
  AliasPattern p =
      compute_alias_pattern(std::vector<TensorDescription>{view(kStorageX, {3, 2}, {1, 3}, 0)});
  std::string text = p.str(t);
  EXPECT_EQ(text, "base0: base0_[3, 2] strides=(1, 3) offset=0; base0_: f32[6]");
  EXPECT_EQ(AliasPattern::parse(text, t), p);
}

// Random small views of one storage: may_overlap is exact against brute force, and the pattern
// puts every overlapping pair in one group, reads back from its text and keeps members inside
// their base.
TEST(AliasPattern, RandomViewsAgainstBruteForce) {
  std::mt19937_64 rng(1234);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  auto random_view = [&] {
    Shape sizes;
    Strides strides;
    int64_t rank = pick(0, 3);
    for (int64_t d = 0; d < rank; ++d) {
      sizes.push_back(pick(0, 4) == 0 ? pick(0, 1) : pick(1, 4));
      strides.push_back(pick(0, 9));
    }
    return view(kStorageX, sizes, strides, pick(0, 20));
  };
  auto elements = [](const Geometry& g) {
    std::set<int64_t> out;
    int64_t n = shape_numel(g.sizes);
    for (int64_t k = 0; k < n; ++k) {
      int64_t at = g.offset, rest = k;
      for (size_t d = g.sizes.size(); d-- > 0;) {
        at += (rest % g.sizes[d]) * g.strides[d];
        rest /= g.sizes[d];
      }
      out.insert(at);
    }
    return out;
  };
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<TensorDescription> args;
    int64_t n = pick(1, 4);
    for (int64_t i = 0; i < n; ++i)
      args.push_back(pick(0, 5) == 0 && i > 0 ? args[static_cast<size_t>(pick(0, i - 1))]
                                              : random_view());
    for (size_t i = 0; i < args.size(); ++i) {
      for (size_t j = 0; j < args.size(); ++j) {
        std::set<int64_t> a = elements(args[i].geometry), b = elements(args[j].geometry);
        bool meet = std::any_of(a.begin(), a.end(), [&](int64_t x) { return b.contains(x); });
        ASSERT_EQ(may_overlap(args[i].geometry, args[j].geometry), meet) << iter;
      }
    }
    AliasPattern p = pattern_of(args);
    for (size_t i = 0; i < args.size(); ++i) {
      const auto& in = p.inputs[i];
      const auto& group = p.groups[static_cast<size_t>(in.group)];
      EXPECT_EQ(in.geometry.sizes, args[i].geometry.sizes);
      for (int64_t e : elements(in.geometry)) {
        EXPECT_GE(e, 0);
        EXPECT_LT(e, group.numel);
      }
      for (size_t j = 0; j < i; ++j) {
        // Inputs in different groups have disjoint extents: no base holds another's elements.
        if (in.group != p.inputs[j].group && shape_numel(args[i].geometry.sizes) > 0 &&
            shape_numel(args[j].geometry.sizes) > 0) {
          std::set<int64_t> ei = elements(args[i].geometry), ej = elements(args[j].geometry);
          EXPECT_TRUE(*ei.rbegin() < *ej.begin() || *ej.rbegin() < *ei.begin()) << iter;
        }
        if (may_overlap(args[i].geometry, args[j].geometry)) {
          EXPECT_EQ(in.group, p.inputs[j].group) << iter;
          // Relative placement within the base is the storage's.
          EXPECT_EQ(in.geometry.offset - p.inputs[j].geometry.offset,
                    args[i].geometry.offset - args[j].geometry.offset);
        }
      }
    }
  }
}

void expect_parse_error(const std::vector<TensorDescription>& args, const std::string& text,
                        const std::string& fragment) {
  Trace t = trace_for(args);
  try {
    AliasPattern::parse(text, t);
    ADD_FAILURE() << "expected a UserError for '" << text << "'";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "for '" << text << "': " << e.what();
  }
}

TEST(AliasPattern, ParseErrorsSayWhatIsWrong) {
  std::vector<TensorDescription> two = {contiguous(kStorageX, {4}), contiguous(kStorageY, {4})};
  std::vector<TensorDescription> with_number = {contiguous(kStorageX, {4}), number()};
  expect_parse_error(two, "a: own", "input 'b' is not described");
  expect_parse_error(two, "a: own; a: own; b: own", "input 'a' is described twice");
  expect_parse_error(two, "a: own; b: base0[4] strides=(1,) offset=0",
                     "base 'base0', which is not declared");
  expect_parse_error(two, "a: own; b: base0[4] strides=(1,) offset=0; base0: f99[4]",
                     "'f99' is not a dtype");
  expect_parse_error(two, "a: own; b: base0[4] strides=(1,) offset=2; base0: f32[4]",
                     "outside base 'base0'");
  expect_parse_error(two, "a: own; b: base0[2] strides=(1,) offset=0; base0: f32[4]",
                     "gives sizes [2] but input 'b' has shape [4]");
  expect_parse_error(two, "a: own; b: base0[4] strides=(1, 1) offset=0; base0: f32[4]",
                     "gives 2 strides for 1 dims");
  expect_parse_error(two, "a: own; b: base0[4] strides=(1,) offset=0; base0: i64[4]",
                     "base 'base0' is i64 but input 'b' is f32");
  expect_parse_error(two, "a: own; b: own; base7: f32[4]", "no input is a view of it");
  expect_parse_error(two, "a: same as b; b: own", "must be an earlier input");
  expect_parse_error(two, "a: own; b: own; base0: f32[4]; base0: f32[4]", "declared twice");
  expect_parse_error(two, "a: number; b: own", "is a tensor, not a number");
  expect_parse_error(with_number, "a: own; b: own", "is a number");
  expect_parse_error(two, "a: own;; b: own", "empty entry");
  expect_parse_error(two, "a own; b: own", "expected ':'");
  expect_parse_error(two, "a: own please; b: own", "unexpected 'please'");
  expect_parse_error(two, "a: own; b: base0[4] strides=(x) offset=0; base0: f32[4]",
                     "expected an integer");
  expect_parse_error(two, "a: own; b: base0[4] strides=(1,) offset=0; base0: f32[4, 4]",
                     "one non-negative element count");
  expect_parse_error({contiguous(kStorageX, {4}), contiguous(kStorageY, {5})},
                     "a: own; b: same as a", "cannot be the same tensor as 'a'");
}

}  // namespace
}  // namespace kiln
