#include "kiln/ir/constant.h"

#include <charconv>
#include <cmath>

#include "kiln/support/error.h"

namespace kiln {

std::string float_str(double value) {
  if (std::isnan(value)) return "float('nan')";
  if (std::isinf(value)) return value > 0 ? "float('inf')" : "-float('inf')";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  KILN_ASSERT(ec == std::errc()) << "to_chars failed";
  std::string s(buf, end);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

namespace {
std::string opt_str(const std::optional<int64_t>& v) {
  return v ? std::to_string(*v) : std::string("None");
}
}  // namespace

std::string constant_str(const Constant& c) {
  struct Printer {
    std::string operator()(const NoneValue&) const { return "None"; }
    std::string operator()(bool b) const { return b ? "True" : "False"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const { return float_str(d); }
    std::string operator()(DType d) const { return std::string(dtype_torch_name(d)); }
    std::string operator()(const IntList& l) const {
      std::string s = "[";
      for (size_t i = 0; i < l.size(); ++i)
        s += (i ? ", " : "") + std::to_string(l[i]);
      return s + "]";
    }
    std::string operator()(const std::string& s) const {
      std::string out = "\"";
      for (char ch : s) {
        if (ch == '"' || ch == '\\') out += '\\';
        out += ch;
      }
      return out + "\"";
    }
    std::string operator()(const Device& d) const { return "\"" + d.str() + "\""; }
    std::string operator()(const IndexKey& key) const {
      std::string s = "(";
      for (size_t i = 0; i < key.size(); ++i) {
        if (i) s += ", ";
        const IndexItem& it = key[i];
        switch (it.kind) {
          case IndexItem::Kind::kInt:
            s += std::to_string(it.index);
            break;
          case IndexItem::Kind::kSlice:
            s += "slice(" + opt_str(it.start) + ", " + opt_str(it.stop) + ", " + opt_str(it.step) +
                 ")";
            break;
          case IndexItem::Kind::kNone:
            s += "None";
            break;
          case IndexItem::Kind::kEllipsis:
            s += "...";
            break;
        }
      }
      if (key.size() == 1) s += ",";
      return s + ")";
    }
  };
  return std::visit(Printer{}, c);
}

bool is_number(const Constant& c) {
  return std::holds_alternative<bool>(c) || std::holds_alternative<int64_t>(c) ||
         std::holds_alternative<double>(c);
}

double number_as_double(const Constant& c) {
  if (auto* b = std::get_if<bool>(&c)) return *b ? 1.0 : 0.0;
  if (auto* i = std::get_if<int64_t>(&c)) return static_cast<double>(*i);
  if (auto* d = std::get_if<double>(&c)) return *d;
  KILN_ASSERT(false) << "constant " << constant_str(c) << " is not a number";
  return 0;
}

}  // namespace kiln
