#include "kiln/analysis/alias_pattern.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "kiln/analysis/geometry.h"
#include "kiln/support/error.h"

namespace kiln {

// The pattern of a call whose tensor inputs are all distinct storages, each laid out as the
// trace's input type says (a strided input is a synthetic group of its own).
AliasPattern AliasPattern::distinct(const Trace& trace) {
  // Every tensor input in a storage of its own, laid out as its type says.
  std::vector<TensorDescription> args;
  uintptr_t next = 1;
  for (Value* in : trace.inputs()) {
    TensorDescription d;
    d.is_tensor = in->is_tensor();
    if (d.is_tensor) {
      const TensorType& t = in->tensor_type();
      d.storage = d.object = next++;
      d.dtype = t.dtype;
      d.element_size = dtype_size(t.dtype);
      d.geometry = t.layout ? Geometry{t.shape, t.layout->strides, t.layout->offset}
                            : Geometry{t.shape, contiguous_strides(t.shape), 0};
    }
    args.push_back(d);
  }
  return compute_alias_pattern(args);
}

namespace {

int64_t numel_of(const Geometry& g) {
  return shape_numel(g.sizes);
}

// The smallest and largest storage element a non-empty view reaches.
struct Extent {
  int64_t lo = 0;
  int64_t hi = 0;
};
Extent extent_of(const Geometry& g) {
  Extent e{g.offset, g.offset};
  for (size_t d = 0; d < g.sizes.size(); ++d) {
    int64_t span = (g.sizes[d] - 1) * g.strides[d];
    (span < 0 ? e.lo : e.hi) += span;
  }
  return e;
}

// Storage indices of every element of a view, sorted and without repeats.
std::vector<int64_t> sorted_elements(const Geometry& g) {
  std::vector<int64_t> out;
  int64_t n = numel_of(g);
  out.reserve(static_cast<size_t>(n));
  std::vector<int64_t> index(g.sizes.size(), 0);
  int64_t at = g.offset;
  for (int64_t k = 0; k < n; ++k) {
    out.push_back(at);
    for (size_t d = g.sizes.size(); d-- > 0;) {
      if (++index[d] < g.sizes[d]) {
        at += g.strides[d];
        break;
      }
      at -= g.strides[d] * (g.sizes[d] - 1);
      index[d] = 0;
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

bool may_overlap(const Geometry& a, const Geometry& b) {
  // Empty views address nothing.
  if (numel_of(a) == 0 || numel_of(b) == 0) return false;
  // Disjoint element intervals.
  Extent ea = extent_of(a), eb = extent_of(b);
  if (ea.hi < eb.lo || eb.hi < ea.lo) return false;
  // The stride lattice: every address of a view is its offset plus a multiple of g, the gcd of
  // the strides that move (dims of size > 1); views whose offsets differ modulo g never meet
  // (x[0::2] and x[1::2]).
  int64_t g = 0;
  for (const Geometry* v : {&a, &b}) {
    for (size_t d = 0; d < v->sizes.size(); ++d) {
      if (v->sizes[d] > 1 && v->strides[d] != 0) g = std::gcd(g, v->strides[d]);
    }
  }
  if (g == 0) return true;  // both are single addresses, and the intervals met: the same one
  if ((a.offset - b.offset) % g != 0) return false;
  // Small views: enumerate and intersect (exact).
  constexpr int64_t kEnumerationLimit = int64_t{1} << 16;
  if (numel_of(a) <= kEnumerationLimit && numel_of(b) <= kEnumerationLimit) {
    std::vector<int64_t> xa = sorted_elements(a), xb = sorted_elements(b);
    size_t i = 0, j = 0;
    while (i < xa.size() && j < xb.size()) {
      if (xa[i] == xb[j]) return true;
      if (xa[i] < xb[j])
        ++i;
      else
        ++j;
    }
    return false;
  }
  return true;  // unsure: overlapping is the safe answer (correct, only slower)
}

AliasPattern compute_alias_pattern(std::span<const TensorDescription> args) {
  const size_t n = args.size();
  AliasPattern p;
  p.inputs.resize(n);

  // Union-find over the arguments; duplicates join their original directly.
  std::vector<size_t> parent(n);
  std::iota(parent.begin(), parent.end(), 0);
  auto find = [&](size_t i) {
    while (parent[i] != i) {
      parent[i] = parent[parent[i]];
      i = parent[i];
    }
    return i;
  };

  std::map<uintptr_t, std::vector<size_t>> by_storage;  // distinct (non-duplicate) members
  for (size_t i = 0; i < n; ++i) {
    const TensorDescription& a = args[i];
    if (!a.is_tensor) continue;
    std::vector<size_t>& members = by_storage[a.storage];
    for (size_t j : members) {
      KILN_CHECK(args[j].dtype == a.dtype)
          << "inputs " << j << " and " << i << " share memory with different dtypes ("
          << dtype_name(args[j].dtype) << " and " << dtype_name(a.dtype)
          << "); kiln does not support that; pass copies (e.g. x.clone()) instead.";
    }
    auto same = std::find_if(members.begin(), members.end(), [&](size_t j) {
      // Unknown object identity (0) counts as the same object when the layout is the same.
      bool same_object = a.object == 0 || args[j].object == 0 || args[j].object == a.object;
      return same_object && args[j].geometry == a.geometry;
    });
    if (same != members.end()) {
      p.inputs[i].duplicate_of = static_cast<int>(*same);
      parent[i] = *same;
      continue;
    }
    for (size_t j : members) {
      if (may_overlap(args[j].geometry, a.geometry)) parent[find(i)] = find(j);
    }
    members.push_back(i);
  }
  // Groups of one storage whose extents interleave (x[0::2] and x[1::2]) share one base: a
  // group's base is its whole extent, and writing it back must not clobber the other's
  // elements. Disjoint extents (rows of a matrix) stay separate.
  for (auto& [storage, members] : by_storage) {
    bool changed = true;
    while (changed) {
      changed = false;
      std::map<size_t, Extent> extent;  // root -> extent of its members
      for (size_t m : members) {
        if (numel_of(args[m].geometry) == 0) continue;
        Extent e = extent_of(args[m].geometry);
        auto [it, fresh] = extent.emplace(find(m), e);
        if (!fresh) it->second = {std::min(it->second.lo, e.lo), std::max(it->second.hi, e.hi)};
      }
      for (auto a = extent.begin(); a != extent.end() && !changed; ++a) {
        for (auto b = std::next(a); b != extent.end(); ++b) {
          if (a->second.hi < b->second.lo || b->second.hi < a->second.lo) continue;
          parent[find(b->first)] = find(a->first);
          changed = true;
          break;
        }
      }
    }
  }

  // Groups are numbered in order of first appearance.
  std::map<size_t, int> group_of_root;
  std::vector<std::vector<size_t>> members_of_group;
  for (size_t i = 0; i < n; ++i) {
    if (!args[i].is_tensor) continue;
    size_t root = find(i);
    auto [it, fresh] = group_of_root.emplace(root, static_cast<int>(members_of_group.size()));
    if (fresh) {
      members_of_group.emplace_back();
      p.groups.push_back({args[i].dtype, 0, false});
    }
    p.inputs[i].group = it->second;
    if (p.inputs[i].duplicate_of < 0)
      members_of_group[static_cast<size_t>(it->second)].push_back(i);
  }

  for (size_t gi = 0; gi < members_of_group.size(); ++gi) {
    const std::vector<size_t>& members = members_of_group[gi];
    AliasPattern::Group& group = p.groups[gi];
    if (members.size() == 1 &&
        is_contiguous(args[members[0]].geometry.sizes, args[members[0]].geometry.strides)) {
      // Its own base: the input keeps its name and is addressed contiguously from its start.
      const Geometry& g = args[members[0]].geometry;
      group.synthetic = false;
      group.numel = numel_of(g);
      p.inputs[members[0]].geometry = Geometry{g.sizes, contiguous_strides(g.sizes), 0};
      continue;
    }
    // A synthetic 1-D base over the members' storage extent. Members are non-empty here: an
    // empty view overlaps nothing and is contiguous, so it is always a group of its own.
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
    for (size_t m : members) {
      Extent e = extent_of(args[m].geometry);
      lo = std::min(lo, e.lo);
      hi = std::max(hi, e.hi);
    }
    group.synthetic = true;
    group.numel = hi - lo + 1;
    for (size_t m : members) {
      const Geometry& g = args[m].geometry;
      p.inputs[m].geometry = Geometry{g.sizes, g.strides, g.offset - lo};
    }
  }
  for (size_t i = 0; i < n; ++i) {
    int d = p.inputs[i].duplicate_of;
    if (d >= 0) p.inputs[i].geometry = p.inputs[static_cast<size_t>(d)].geometry;
  }
  return p;
}

// ---- text form ------------------------------------------------------------------------------

namespace {

std::string ints_tuple(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  if (v.size() == 1) s += ",";
  return s + ")";
}

// The label of a synthetic group's base: baseN for group N, with '_' added while it would be
// mistaken for an input's name.
std::string base_label(const Trace& trace, size_t group) {
  std::string label = "base" + std::to_string(group);
  while (std::any_of(trace.inputs().begin(), trace.inputs().end(),
                     [&](const Value* v) { return v->name() == label; })) {
    label += "_";
  }
  return label;
}

}  // namespace

std::string AliasPattern::str(const Trace& trace) const {
  KILN_ASSERT(inputs.size() == trace.inputs().size())
      << "the alias pattern has " << inputs.size() << " inputs but the trace has "
      << trace.inputs().size();
  std::vector<std::string> parts;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Input& in = inputs[i];
    std::string s = trace.inputs()[i]->name() + ": ";
    if (in.group < 0) {
      s += "number";
    } else if (in.duplicate_of >= 0) {
      s += "same as " + trace.inputs()[static_cast<size_t>(in.duplicate_of)]->name();
    } else if (!groups.at(static_cast<size_t>(in.group)).synthetic) {
      s += "own";
    } else {
      s += base_label(trace, static_cast<size_t>(in.group)) + shape_str(in.geometry.sizes) +
           " strides=" + ints_tuple(in.geometry.strides) +
           " offset=" + std::to_string(in.geometry.offset);
    }
    parts.push_back(std::move(s));
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g].synthetic) continue;
    parts.push_back(base_label(trace, g) + ": " + std::string(dtype_name(groups[g].dtype)) + "[" +
                    std::to_string(groups[g].numel) + "]");
  }
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += "; ";
    out += parts[i];
  }
  return out;
}

namespace {

// A cursor over one entry's text; every failure names the entry.
class EntryReader {
 public:
  EntryReader(std::string_view text, std::string entry) : text_(text), entry_(std::move(entry)) {}

  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_])))
      ++pos_;
  }
  bool at_end() {
    skip_space();
    return pos_ == text_.size();
  }
  bool accept(std::string_view word) {
    skip_space();
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  void expect(std::string_view word) {
    KILN_CHECK(accept(word)) << "alias pattern: expected '" << word << "' at '" << rest()
                             << "' in entry '" << entry_ << "'; write it as kiln prints it.";
  }
  std::string identifier() {
    skip_space();
    size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_'))
      ++pos_;
    KILN_CHECK(pos_ > start) << "alias pattern: expected a name at '" << rest() << "' in entry '"
                             << entry_ << "'.";
    return std::string(text_.substr(start, pos_ - start));
  }
  int64_t integer() {
    skip_space();
    size_t start = pos_;
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_])))
      ++pos_;
    std::string digits(text_.substr(start, pos_ - start));
    KILN_CHECK(!digits.empty() && digits != "-" && digits.size() < 19)
        << "alias pattern: expected an integer at '" << text_.substr(start) << "' in entry '"
        << entry_ << "'.";
    return std::stoll(digits);
  }
  // "[2, 3]" or "(2, 3)" / "(2,)"; empty lists allowed.
  std::vector<int64_t> int_list(char open, char close) {
    expect(std::string(1, open));
    std::vector<int64_t> out;
    if (accept(std::string(1, close))) return out;
    while (true) {
      out.push_back(integer());
      if (accept(std::string(1, close))) return out;
      expect(",");
      if (accept(std::string(1, close))) return out;  // "(2,)"
    }
  }
  std::string rest() const { return std::string(text_.substr(pos_)); }
  const std::string& entry() const { return entry_; }

 private:
  std::string_view text_;
  std::string entry_;
  size_t pos_ = 0;
};

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b])))
    ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1])))
    --e;
  return std::string(s.substr(b, e - b));
}

}  // namespace

AliasPattern AliasPattern::parse(std::string_view text, const Trace& trace) {
  const auto& trace_inputs = trace.inputs();
  std::map<std::string, size_t> input_index;
  for (size_t i = 0; i < trace_inputs.size(); ++i)
    input_index[trace_inputs[i]->name()] = i;

  // Input entries by input; base declarations by label (in order of declaration).
  struct BaseRef {
    std::string label;
    Geometry geometry;
  };
  struct InputEntry {
    enum class Kind { kNumber, kOwn, kSame, kBase } kind = Kind::kOwn;
    std::string same_as;
    BaseRef base;
    std::string text;
  };
  struct BaseDecl {
    DType dtype = DType::kFloat32;
    int64_t numel = 0;
    std::string text;
  };
  std::vector<std::optional<InputEntry>> entries(trace_inputs.size());
  std::map<std::string, BaseDecl> bases;

  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(';', start);
    if (end == std::string_view::npos) end = text.size();
    std::string entry = trim(text.substr(start, end - start));
    start = end + 1;
    if (entry.empty()) {
      KILN_CHECK(end == text.size() && start > text.size())
          << "alias pattern: empty entry between ';'s in '" << text
          << "'; separate entries with one ';'.";
      continue;
    }
    EntryReader r(entry, entry);
    std::string name = r.identifier();
    r.expect(":");
    if (auto it = input_index.find(name); it != input_index.end()) {
      KILN_CHECK(!entries[it->second])
          << "alias pattern: input '" << name << "' is described twice; describe it once.";
      InputEntry e;
      e.text = entry;
      if (r.accept("number")) {
        e.kind = InputEntry::Kind::kNumber;
      } else if (r.accept("own")) {
        e.kind = InputEntry::Kind::kOwn;
      } else if (r.accept("same")) {
        r.expect("as");
        e.kind = InputEntry::Kind::kSame;
        e.same_as = r.identifier();
      } else {
        e.kind = InputEntry::Kind::kBase;
        e.base.label = r.identifier();
        e.base.geometry.sizes = r.int_list('[', ']');
        r.expect("strides");
        r.expect("=");
        e.base.geometry.strides = r.int_list('(', ')');
        r.expect("offset");
        r.expect("=");
        e.base.geometry.offset = r.integer();
      }
      KILN_CHECK(r.at_end()) << "alias pattern: unexpected '" << r.rest()
                             << "' at the end of entry '" << entry << "'.";
      entries[it->second] = std::move(e);
    } else {
      // A base declaration: "base0: f32[64]".
      std::string dtype_text = r.identifier();
      std::optional<DType> dtype = dtype_from_name(dtype_text);
      KILN_CHECK(dtype.has_value())
          << "alias pattern: '" << name << "' is not an input of " << trace.name << ", so '"
          << entry << "' must declare a base as 'name: dtype[numel]', but '" << dtype_text
          << "' is not a dtype.";
      std::vector<int64_t> numel = r.int_list('[', ']');
      KILN_CHECK(numel.size() == 1 && numel[0] >= 0)
          << "alias pattern: base '" << name
          << "' must have one non-negative element count, as in '" << name << ": f32[64]'.";
      KILN_CHECK(r.at_end()) << "alias pattern: unexpected '" << r.rest()
                             << "' at the end of entry '" << entry << "'.";
      KILN_CHECK(!bases.contains(name))
          << "alias pattern: base '" << name << "' is declared twice; declare it once.";
      bases[name] = BaseDecl{*dtype, numel[0], entry};
    }
  }

  AliasPattern p;
  p.inputs.resize(trace_inputs.size());
  std::map<std::string, int> group_of_base;
  for (size_t i = 0; i < trace_inputs.size(); ++i) {
    const Value* v = trace_inputs[i];
    KILN_CHECK(entries[i].has_value())
        << "alias pattern: input '" << v->name() << "' is not described; add '" << v->name()
        << ": own' (or how it aliases the other inputs).";
    const InputEntry& e = *entries[i];
    Input& in = p.inputs[i];
    if (e.kind == InputEntry::Kind::kNumber) {
      KILN_CHECK(!v->is_tensor()) << "alias pattern: input '" << v->name()
                                  << "' is a tensor, not a number; describe how it aliases.";
      continue;
    }
    KILN_CHECK(v->is_tensor()) << "alias pattern: input '" << v->name()
                               << "' is a number; describe it as '" << v->name() << ": number'.";
    const TensorType& t = v->tensor_type();
    switch (e.kind) {
      case InputEntry::Kind::kOwn:
        in.group = static_cast<int>(p.groups.size());
        in.geometry = Geometry{t.shape, contiguous_strides(t.shape), 0};
        p.groups.push_back({t.dtype, t.numel(), false});
        break;
      case InputEntry::Kind::kSame: {
        auto it = input_index.find(e.same_as);
        KILN_CHECK(it != input_index.end() && it->second < i)
            << "alias pattern: in '" << e.text << "', '" << e.same_as
            << "' must be an earlier input.";
        const Value* other = trace_inputs[it->second];
        const Input& orig = p.inputs[it->second];
        KILN_CHECK(other->is_tensor() && orig.duplicate_of < 0)
            << "alias pattern: in '" << e.text << "', '" << e.same_as
            << "' must be a tensor input that is not itself a duplicate; name the first one.";
        KILN_CHECK(other->tensor_type().dtype == t.dtype && other->tensor_type().shape == t.shape)
            << "alias pattern: '" << v->name() << "' (" << t.str()
            << ") cannot be the same tensor as '" << other->name() << "' ("
            << other->tensor_type().str() << ").";
        in.group = orig.group;
        in.geometry = orig.geometry;
        in.duplicate_of = static_cast<int>(it->second);
        break;
      }
      case InputEntry::Kind::kBase: {
        auto decl = bases.find(e.base.label);
        KILN_CHECK(decl != bases.end())
            << "alias pattern: '" << e.text << "' refers to base '" << e.base.label
            << "', which is not declared; add '" << e.base.label << ": " << dtype_name(t.dtype)
            << "[numel]'.";
        const Geometry& g = e.base.geometry;
        KILN_CHECK(g.sizes == t.shape)
            << "alias pattern: '" << e.text << "' gives sizes " << shape_str(g.sizes)
            << " but input '" << v->name() << "' has shape " << shape_str(t.shape) << ".";
        KILN_CHECK(g.strides.size() == g.sizes.size())
            << "alias pattern: '" << e.text << "' gives " << g.strides.size() << " strides for "
            << g.sizes.size() << " dims.";
        KILN_CHECK(decl->second.dtype == t.dtype)
            << "alias pattern: base '" << e.base.label << "' is " << dtype_name(decl->second.dtype)
            << " but input '" << v->name() << "' is " << dtype_name(t.dtype) << ".";
        if (shape_numel(g.sizes) > 0) {
          Extent x = extent_of(g);
          KILN_CHECK(x.lo >= 0 && x.hi < decl->second.numel)
              << "alias pattern: '" << e.text << "' reaches elements " << x.lo << ".." << x.hi
              << ", outside base '" << e.base.label << "' of " << decl->second.numel
              << " elements.";
        }
        auto [it, fresh] = group_of_base.emplace(e.base.label, static_cast<int>(p.groups.size()));
        if (fresh) p.groups.push_back({decl->second.dtype, decl->second.numel, true});
        in.group = it->second;
        in.geometry = g;
        break;
      }
      case InputEntry::Kind::kNumber:
        break;
    }
  }
  for (const auto& [label, decl] : bases) {
    KILN_CHECK(group_of_base.contains(label))
        << "alias pattern: base '" << label << "' is declared but no input is a view of it; "
        << "remove '" << decl.text << "'.";
  }
  return p;
}

}  // namespace kiln
