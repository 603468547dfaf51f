#include "kiln/ir/op.h"

#include <charconv>
#include <unordered_map>

#include "kiln/ir/trace.h"
#include "kiln/support/error.h"

namespace kiln {

// Type rules live in type_rules.cpp.
#define KILN_OP(Id, name, kind, sig, rule, outputs, alias) \
  std::vector<TensorType> rule(const OpInfo&, std::span<const Operand>);
#include "kiln/ir/ops.def"
std::vector<TensorType> infer_elementwise(const OpInfo&, std::span<const Operand>);

bool keeps_row_major_order(OpId id) {
  switch (id) {
    case OpId::kReshape:
    case OpId::kView:
    case OpId::kFlatten:
    case OpId::kUnflatten:
    case OpId::kSqueeze:
    case OpId::kUnsqueeze:
      return true;
    default:
      return false;
  }
}

std::string_view op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kElementwise:
      return "elementwise";
    case OpKind::kReduction:
      return "reduction";
    case OpKind::kView:
      return "view";
    case OpKind::kScatter:
      return "scatter";
    case OpKind::kMutation:
      return "mutation";
    case OpKind::kCreation:
      return "creation";
    case OpKind::kJoin:
      return "join";
    case OpKind::kOpaque:
      return "opaque";
    case OpKind::kComposite:
      return "composite";
    case OpKind::kIndex:
      return "index";
  }
  return "?";
}

namespace {

// Reads the few literal forms defaults use: None True False ints floats "strings" [ints].
Constant parse_default(std::string_view text) {
  if (text == "None") return NoneValue{};
  if (text == "True") return true;
  if (text == "False") return false;
  if (text.starts_with('"')) return std::string(text.substr(1, text.size() - 2));
  if (text.starts_with('[')) {
    IntList list;
    std::string_view body = text.substr(1, text.size() - 2);
    while (!body.empty()) {
      size_t comma = body.find(',');
      std::string_view item = body.substr(0, comma);
      while (!item.empty() && item.front() == ' ')
        item.remove_prefix(1);
      int64_t v = 0;
      std::from_chars(item.data(), item.data() + item.size(), v);
      list.push_back(v);
      if (comma == std::string_view::npos) break;
      body.remove_prefix(comma + 1);
    }
    return list;
  }
  if (text.find_first_of(".e") != std::string_view::npos) {
    return std::stod(std::string(text));
  }
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  KILN_ASSERT(ec == std::errc() && ptr == text.data() + text.size()) << "bad default " << text;
  return v;
}

ParamKind parse_kind(std::string_view k) {
  static const std::unordered_map<std::string_view, ParamKind> kinds = {
      {"T", ParamKind::kTensor},    {"TS", ParamKind::kTensorOrScalar},
      {"S", ParamKind::kScalar},    {"int", ParamKind::kInt},
      {"ints", ParamKind::kInts},   {"int|ints", ParamKind::kIntOrInts},
      {"bool", ParamKind::kBool},   {"dtype", ParamKind::kDType},
      {"str", ParamKind::kString},  {"device", ParamKind::kDevice},
      {"index", ParamKind::kIndex}, {"Ts", ParamKind::kTensorList},
  };
  auto it = kinds.find(k);
  KILN_ASSERT(it != kinds.end()) << "unknown parameter kind '" << k << "' in ops.def";
  return it->second;
}

// "self:T, other:TS, *, alpha:S=1" -> params. Only ever parses ops.def's own text.
std::vector<Param> parse_signature(std::string_view sig) {
  std::vector<Param> params;
  bool keyword_only = false;
  while (!sig.empty()) {
    size_t comma = sig.find(", ");
    // A default may be a list "[1, 2]": do not split inside brackets.
    size_t bracket = sig.find('[');
    if (bracket != std::string_view::npos && bracket < comma) {
      comma = sig.find(']', bracket) + 1;
      if (comma >= sig.size()) comma = std::string_view::npos;  // the list ends the signature
    }
    std::string_view item = sig.substr(0, comma);
    sig = comma == std::string_view::npos ? std::string_view() : sig.substr(comma + 2);
    if (item == "*") {
      keyword_only = true;
      continue;
    }
    Param p;
    size_t colon = item.find(':');
    p.name = std::string(item.substr(0, colon));
    std::string_view rest = item.substr(colon + 1);
    size_t eq = rest.find('=');
    std::string_view kind = rest.substr(0, eq);
    if (kind.ends_with('?')) {
      p.optional = true;
      kind.remove_suffix(1);
    }
    p.kind = parse_kind(kind);
    p.keyword_only = keyword_only;
    if (eq != std::string_view::npos) {
      p.has_default = true;
      p.default_value = parse_default(rest.substr(eq + 1));
    }
    params.push_back(std::move(p));
  }
  return params;
}

struct Registry {
  std::vector<OpInfo> ops;
  std::unordered_map<std::string, OpId> by_name;

  void add_elementwise(OpId id, const char* name, std::string sig, DTypeRule rule, int arity,
                       bool inplace) {
    std::vector<Param> params = parse_signature(sig);
    if (rule == DTypeRule::kCast) {
      params.push_back(Param{"dtype", ParamKind::kDType, false, false, false, NoneValue{}});
    }
    if (id == OpId::kGelu) {
      params.push_back(
          Param{"approximate", ParamKind::kString, false, true, true, std::string("none")});
    }
    // `to` returns its input object itself when the dtype does not change, as eager does.
    AliasKind alias = rule == DTypeRule::kCast ? AliasKind::kMaybeViewOf0 : AliasKind::kNone;
    OpInfo f{id, name,   OpKind::kElementwise, params, &infer_elementwise, 1, alias, rule, arity,
             id, inplace};
    add(std::move(f));
    if (inplace) {
      OpId in_id = static_cast<OpId>(static_cast<int>(id) + 1);
      OpInfo m{in_id,
               std::string(name) + "_",
               OpKind::kMutation,
               params,
               &infer_elementwise,
               1,
               AliasKind::kMutates0,
               rule,
               arity,
               id,
               false};
      add(std::move(m));
    }
  }
  void add(OpInfo info) {
    KILN_ASSERT(static_cast<size_t>(info.id) == ops.size())
        << "op table out of order at " << info.name;
    by_name.emplace(info.name, info.id);
    ops.push_back(std::move(info));
  }

  Registry() {
#define KILN_UNARY(Id, name, rule, inplace, f, i) \
  add_elementwise(OpId::k##Id, name, "self:T", DTypeRule::rule, 1, inplace);
#define KILN_BINARY(Id, name, sig, rule, inplace, f, i) \
  add_elementwise(OpId::k##Id, name, sig, DTypeRule::rule, 2, inplace);
#define KILN_TERNARY(Id, name, sig, rule, inplace, f, i) \
  add_elementwise(OpId::k##Id, name, sig, DTypeRule::rule, 3, inplace);
#define KILN_OP(Id, name, kind, sig, rule, outputs, alias)                          \
  add(OpInfo{OpId::k##Id, name, OpKind::kind, parse_signature(sig), &rule, outputs, \
             AliasKind::alias, DTypeRule::kNotElementwise, 0, OpId::k##Id, false});
#define KILN_COMPOSITE(Id, name, sig, rule, layout)                                 \
  add(OpInfo{OpId::k##Id, name, OpKind::kComposite, parse_signature(sig), &rule, 1, \
             AliasKind::kNone, DTypeRule::kNotElementwise, 0, OpId::k##Id, false,   \
             ResultLayout::layout});
#include "kiln/ir/ops.def"
  }
};

const Registry& registry() {
  static const Registry r;
  return r;
}

}  // namespace

int OpInfo::param_index(std::string_view param_name) const {
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].name == param_name) return static_cast<int>(i);
  }
  return -1;
}

const OpInfo& op_info(OpId id) {
  const auto& ops = registry().ops;
  KILN_ASSERT(static_cast<size_t>(id) < ops.size()) << "bad op id " << static_cast<int>(id);
  return ops[static_cast<size_t>(id)];
}

const OpInfo* find_op(std::string_view name) {
  const auto& r = registry();
  auto it = r.by_name.find(std::string(name));
  if (it == r.by_name.end() || name.empty()) return nullptr;
  return &r.ops[static_cast<size_t>(it->second)];
}

std::span<const OpInfo> all_ops() {
  return registry().ops;
}

OpId inplace_form(OpId id) {
  const OpInfo& info = op_info(id);
  KILN_ASSERT(info.has_inplace_form) << info.name << " has no in-place form";
  return static_cast<OpId>(static_cast<int>(id) + 1);
}

}  // namespace kiln
