#include "kiln/ir/parser.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <type_traits>
#include <vector>

#include "kiln/ir/builder.h"
#include "kiln/ir/printer.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {

struct Line {
  int number = 0;         // 1-based
  std::string_view text;  // without the newline
};

class ParseFailure {
 public:
  int col;
  std::string msg;
};

// A cursor over one line: every read reports its column on failure.
class Cursor {
 public:
  Cursor(std::string_view text, int start_col) : text_(text), pos_(0), base_col_(start_col) {}

  [[noreturn]] void fail(const std::string& msg) const {
    throw ParseFailure{base_col_ + static_cast<int>(pos_), msg};
  }
  void skip_spaces() {
    while (pos_ < text_.size() && text_[pos_] == ' ')
      ++pos_;
  }
  bool at_end() {
    skip_spaces();
    return pos_ >= text_.size();
  }
  char peek() {
    skip_spaces();
    return pos_ < text_.size() ? text_[pos_] : '\0';
  }
  bool accept(std::string_view s) {
    skip_spaces();
    if (text_.substr(pos_).starts_with(s)) {
      pos_ += s.size();
      return true;
    }
    return false;
  }
  void expect(std::string_view s) {
    if (!accept(s)) fail("expected '" + std::string(s) + "'");
  }
  // An identifier, dots allowed inside ("ltorch.add", "torch.float32").
  std::string identifier() {
    skip_spaces();
    size_t start = pos_;
    while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) ||
                                   text_[pos_] == '_' || (text_[pos_] == '.' && pos_ > start)))
      ++pos_;
    if (pos_ == start || std::isdigit(static_cast<unsigned char>(text_[start]))) {
      pos_ = start;
      fail("expected a name");
    }
    return std::string(text_.substr(start, pos_ - start));
  }
  bool at_identifier() {
    char c = peek();
    return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
  }
  std::string string_literal() {
    skip_spaces();
    if (pos_ >= text_.size() || (text_[pos_] != '"' && text_[pos_] != '\''))
      fail("expected a string");
    char quote = text_[pos_++];
    std::string out;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] == '\\' && pos_ + 1 < text_.size()) ++pos_;
      out += text_[pos_++];
    }
    if (pos_ >= text_.size()) fail("unterminated string");
    ++pos_;
    return out;
  }
  // An int or float literal (with an optional leading '-').
  Constant number() {
    skip_spaces();
    size_t start = pos_;
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    bool is_float = false;
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (std::isdigit(static_cast<unsigned char>(c))) {
        ++pos_;
      } else if (c == '.' || c == 'e' || c == 'E' ||
                 ((c == '-' || c == '+') && (text_[pos_ - 1] == 'e' || text_[pos_ - 1] == 'E'))) {
        is_float = true;
        ++pos_;
      } else {
        break;
      }
    }
    std::string_view lit = text_.substr(start, pos_ - start);
    if (lit.empty() || lit == "-") {
      pos_ = start;
      fail("expected a number");
    }
    if (is_float) {
      double d = 0;
      auto [p, ec] = std::from_chars(lit.data(), lit.data() + lit.size(), d);
      if (ec != std::errc() || p != lit.data() + lit.size()) {
        pos_ = start;
        fail("malformed number '" + std::string(lit) + "'");
      }
      return d;
    }
    int64_t i = 0;
    auto [p, ec] = std::from_chars(lit.data(), lit.data() + lit.size(), i);
    if (ec != std::errc() || p != lit.data() + lit.size()) {
      pos_ = start;
      fail("malformed or out-of-range integer '" + std::string(lit) + "'");
    }
    return i;
  }
  bool at_number() {
    char c = peek();
    if (std::isdigit(static_cast<unsigned char>(c))) return true;
    return c == '-' && pos_ + 1 < text_.size() &&
           std::isdigit(static_cast<unsigned char>(text_[pos_ + 1]));
  }
  size_t pos() const { return pos_; }
  void set_pos(size_t pos) { pos_ = pos; }
  std::string_view rest() const { return text_.substr(pos_); }

 private:
  std::string_view text_;
  size_t pos_;
  int base_col_;
};

// One parsed statement, before it is built.
struct Statement {
  std::vector<std::string> outputs;
  std::string op;
  int op_col = 0;
  std::vector<Operand> args;
  KeywordArgs kwargs;
  std::string comment;  // text after "  # "
};

class TraceParser {
 public:
  TraceParser(std::string_view text, std::string filename) : filename_(std::move(filename)) {
    size_t start = 0;
    int number = 1;
    while (start <= text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string_view::npos) end = text.size();
      std::string_view line = text.substr(start, end - start);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (end == text.size() && line.empty() && !lines_.empty()) break;  // final newline
      lines_.push_back({number++, line});
      if (end == text.size()) break;
      start = end + 1;
    }
  }

  // `# <name> in [lo, hi]` for an input <name>: its known range; nullopt for another comment.
  std::optional<std::pair<std::string, std::pair<int64_t, int64_t>>> parse_input_range(
      const Line& line, std::string_view t, const std::vector<std::string>& input_names) {
    const size_t in = t.find(" in [");
    if (in == std::string_view::npos) return std::nullopt;
    std::string name(t.substr(2, in - 2));
    if (std::find(input_names.begin(), input_names.end(), name) == input_names.end())
      return std::nullopt;
    std::string_view rest = t.substr(in + 5);
    int64_t lo = 0, hi = 0;
    auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), lo);
    const std::string_view sep = ", ";
    bool ok = ec == std::errc() && std::string_view(p, rest.data() + rest.size()).starts_with(sep);
    if (ok) {
      auto [q, ec2] = std::from_chars(p + sep.size(), rest.data() + rest.size(), hi);
      ok = ec2 == std::errc() && std::string_view(q, rest.data() + rest.size()) == "]" && lo <= hi;
    }
    if (!ok)
      error_at(line, static_cast<int>(indent(line.text) + in + 5),
               "expected '# " + name + " in [<lo>, <hi>]' with integers lo <= hi");
    return std::pair{name, std::pair{lo, hi}};
  }

  Trace parse() {
    Trace trace;
    Builder b(trace);
    // Comments before the def are free text (lit RUN lines, notes), except the header
    // "# Constructed by <pass> (<ms> ms)".
    size_t i = skip_blank(0);
    while (i < lines_.size() && lines_[i].text.starts_with("#")) {
      if (lines_[i].text.starts_with("# Constructed by ")) parse_header(lines_[i], trace);
      i = skip_blank(i + 1);
    }
    if (i >= lines_.size()) error_at(lines_.back(), 1, "expected 'def <name>(<inputs>):'");
    std::vector<std::string> input_names = parse_def(lines_[i], trace);
    i = skip_blank(i + 1);
    // One type comment per input, in order; after it, optionally `# <name> in [lo, hi]` (the
    // input's known range, Value::known_range).
    std::map<std::string, Type> input_types;
    std::map<std::string, std::pair<int64_t, int64_t>> input_ranges;
    while (i < lines_.size()) {
      std::string_view t = trim(lines_[i].text);
      if (!t.starts_with("# ")) break;
      if (auto range = parse_input_range(lines_[i], t, input_names)) {
        input_ranges[range->first] = range->second;
        i = skip_blank(i + 1);
        continue;
      }
      auto colon = t.find(": \"");
      if (colon == std::string_view::npos) break;
      std::string name(t.substr(2, colon - 2));
      if (std::find(input_names.begin(), input_names.end(), name) == input_names.end()) break;
      std::string_view type_text = t.substr(colon + 3);
      if (!type_text.ends_with('"'))
        error_at(lines_[i], 1, "expected a closing '\"' after the type");
      Type type;
      if (!parse_type(type_text.substr(0, type_text.size() - 1), &type))
        error_at(lines_[i], static_cast<int>(indent(lines_[i].text) + colon + 4),
                 "malformed type '" + std::string(type_text.substr(0, type_text.size() - 1)) + "'");
      input_types[name] = type;
      i = skip_blank(i + 1);
    }
    for (const std::string& name : input_names) {
      auto it = input_types.find(name);
      if (it == input_types.end())
        error_at(lines_[def_line_], 1,
                 "input '" + name + "' has no type comment (# " + name + ": \"cpu f32[4]\")");
      values_[name] = on_line(lines_[def_line_], 1, [&] { return b.add_input(name, it->second); });
      if (auto r = input_ranges.find(name); r != input_ranges.end())
        values_[name]->set_known_range(r->second);
    }
    // Fresh names (a decomposition's temporaries) must not take a name the file defines later.
    for (size_t k = i; k < lines_.size(); ++k) {
      std::string_view t = trim(lines_[k].text);
      if (t.starts_with("# ")) t.remove_prefix(2);
      size_t eq = t.find(" = ltorch.");
      if (eq == std::string_view::npos) continue;
      std::string_view names = t.substr(0, eq);
      while (!names.empty()) {
        size_t comma = names.find(',');
        b.reserve_name(std::string(trim(names.substr(0, comma))));
        if (comma == std::string_view::npos) break;
        names.remove_prefix(comma + 1);
      }
    }
    // Statements until the return.
    bool returned = false;
    while (i < lines_.size()) {
      const Line& line = lines_[i];
      std::string_view t = trim(line.text);
      if (t.empty() || (t.starts_with("#") && (returned || indent(line.text) <= 2))) {
        ++i;  // a comment of its own (after the return: free text such as lit CHECK lines)
        continue;
      }
      if (t.starts_with("#"))
        error_at(line, static_cast<int>(indent(line.text)) + 1,
                 "a subsymbol comment must follow the statement it belongs to");
      if (returned)
        error_at(line, static_cast<int>(indent(line.text)) + 1, "unexpected text after the return");
      if (t.starts_with("return")) {
        parse_return(line, b);
        returned = true;
        ++i;
        continue;
      }
      // Subsymbol lines: deeper indentation, "# <statement>".
      size_t j = i + 1;
      std::vector<const Line*> subs;
      while (j < lines_.size() && indent(lines_[j].text) > indent(line.text) &&
             trim(lines_[j].text).starts_with("# ")) {
        subs.push_back(&lines_[j]);
        ++j;
      }
      build_statement(line, subs, b);
      i = j;
    }
    if (!returned) error_at(lines_.back(), 1, "the trace has no 'return {\"output\": (...)}' line");
    return trace;
  }

 private:
  static std::string_view trim(std::string_view s) {
    while (!s.empty() && s.front() == ' ')
      s.remove_prefix(1);
    while (!s.empty() && s.back() == ' ')
      s.remove_suffix(1);
    return s;
  }
  static size_t indent(std::string_view s) {
    size_t n = 0;
    while (n < s.size() && s[n] == ' ')
      ++n;
    return n;
  }
  size_t skip_blank(size_t i) const {
    while (i < lines_.size() && trim(lines_[i].text).empty())
      ++i;
    return i;
  }

  [[noreturn]] void error_at(const Line& line, int col, const std::string& msg) const {
    throw ParseError(filename_ + ":" + std::to_string(line.number) + ":" + std::to_string(col) +
                     ": error: " + msg);
  }

  template <class F>
  std::invoke_result_t<F> on_line(const Line& line, int start_col, F&& f) {
    try {
      return f();
    } catch (const ParseFailure& e) {
      error_at(line, e.col, e.msg);
    } catch (const ParseError&) {
      throw;
    } catch (const UserError& e) {
      error_at(line, start_col, e.what());
    }
  }

  void parse_header(const Line& line, Trace& trace) {
    on_line(line, 1, [&] {
      Cursor c(line.text, 1);
      c.expect("# Constructed by ");
      trace.constructed_by = c.identifier();
      c.expect("(");
      Constant ms = c.number();
      trace.construction_ms = number_as_double(ms);
      c.expect("ms");
      c.expect(")");
      if (!c.at_end()) c.fail("unexpected text after the header");
      return 0;
    });
  }

  std::vector<std::string> parse_def(const Line& line, Trace& trace) {
    def_line_ = static_cast<size_t>(&line - lines_.data());
    return on_line(line, 1, [&] {
      Cursor c(line.text, 1);
      if (!c.accept("def ")) c.fail("expected 'def <name>(<inputs>):'");
      trace.name = c.identifier();
      c.expect("(");
      std::vector<std::string> names;
      if (!c.accept(")")) {
        do {
          names.push_back(c.identifier());
        } while (c.accept(","));
        c.expect(")");
      }
      c.expect(":");
      if (!c.at_end()) c.fail("unexpected text after ':'");
      return names;
    });
  }

  // Reads a value's name; an unknown name is reported at its first character.
  Value* value_ref(Cursor& c) {
    c.skip_spaces();
    size_t start = c.pos();
    std::string name = c.identifier();
    auto it = values_.find(name);
    if (it == values_.end()) {
      c.set_pos(start);
      c.fail("'" + name + "' is not defined before this use");
    }
    return it->second;
  }

  IndexItem index_item(Cursor& c) {
    if (c.accept("...")) return IndexItem::ellipsis();
    if (c.accept("None")) return IndexItem::new_axis();
    if (c.accept("slice(")) {
      std::optional<int64_t> parts[3];
      for (int k = 0; k < 3; ++k) {
        if (k) c.expect(",");
        if (!c.accept("None")) {
          Constant n = c.number();
          if (!std::holds_alternative<int64_t>(n)) c.fail("slice bounds must be ints or None");
          parts[k] = std::get<int64_t>(n);
        }
      }
      c.expect(")");
      return IndexItem::slice(parts[0], parts[1], parts[2]);
    }
    Constant n = c.number();
    if (!std::holds_alternative<int64_t>(n))
      c.fail("an index must be an int, a slice, None or ...");
    return IndexItem::integer(std::get<int64_t>(n));
  }

  Operand argument(Cursor& c) {
    if (c.peek() == '(') {  // an index key
      c.expect("(");
      IndexKey key;
      if (!c.accept(")")) {
        do {
          if (c.peek() == ')') break;  // trailing comma
          key.push_back(index_item(c));
        } while (c.accept(","));
        c.expect(")");
      }
      return Operand(Constant(key));
    }
    if (c.peek() == '[') {
      c.expect("[");
      std::vector<Value*> values;
      IntList ints;
      if (!c.accept("]")) {
        do {
          if (c.at_number()) {
            if (!values.empty()) c.fail("a list mixes values and numbers");
            Constant n = c.number();
            if (!std::holds_alternative<int64_t>(n)) c.fail("a list of numbers must hold ints");
            ints.push_back(std::get<int64_t>(n));
          } else {
            if (!ints.empty()) c.fail("a list mixes values and numbers");
            values.push_back(value_ref(c));
          }
        } while (c.accept(","));
        c.expect("]");
      }
      if (!values.empty()) return Operand(values);
      return Operand(Constant(ints));
    }
    if (c.peek() == '"' || c.peek() == '\'') return Operand(Constant(c.string_literal()));
    if (c.accept("-float(")) return Operand(Constant(-special_float(c)));
    if (c.accept("float(")) return Operand(Constant(special_float(c)));
    if (c.at_number()) return Operand(c.number());
    size_t start = c.pos();
    std::string name = c.identifier();
    if (name == "None") return Operand(Constant(NoneValue{}));
    if (name == "True") return Operand(Constant(true));
    if (name == "False") return Operand(Constant(false));
    if (name.starts_with("torch.")) {
      auto d = dtype_from_name(name);
      if (!d) {
        c.set_pos(start);
        c.fail("unknown dtype '" + name + "'");
      }
      return Operand(Constant(*d));
    }
    c.set_pos(start);
    return Operand(value_ref(c));
  }

  double special_float(Cursor& c) {
    std::string s = c.string_literal();
    c.expect(")");
    if (s == "inf") return INFINITY;
    if (s == "nan") return NAN;
    c.fail("expected float('inf') or float('nan')");
  }

  // "a, b = ltorch.op": the output names (if any) and the op's name.
  Statement statement_head(Cursor& c) {
    Statement st;
    c.skip_spaces();
    if (!c.rest().starts_with("ltorch.")) {
      do {
        st.outputs.push_back(c.identifier());
      } while (c.accept(","));
      c.expect("=");
    }
    c.skip_spaces();
    st.op_col = static_cast<int>(c.pos());
    std::string callee = c.identifier();
    if (!callee.starts_with("ltorch.")) c.fail("expected an op call 'ltorch.<op>(...)'");
    st.op = callee.substr(7);
    return st;
  }

  Statement statement(Cursor& c) {
    Statement st = statement_head(c);
    c.expect("(");
    bool keywords = false;
    if (!c.accept(")")) {
      do {
        // name=value?
        std::string_view r = c.rest();
        size_t k = 0;
        while (k < r.size() && r[k] == ' ')
          ++k;
        size_t n = k;
        while (n < r.size() && (std::isalnum(static_cast<unsigned char>(r[n])) || r[n] == '_'))
          ++n;
        if (n > k && n < r.size() && r[n] == '=' && (n + 1 >= r.size() || r[n + 1] != '=')) {
          std::string key = c.identifier();
          c.expect("=");
          st.kwargs.emplace_back(key, argument(c));
          keywords = true;
        } else {
          if (keywords) c.fail("positional argument follows keyword argument");
          st.args.push_back(argument(c));
        }
      } while (c.accept(","));
      c.expect(")");
    }
    c.skip_spaces();
    if (c.accept("#")) {
      c.skip_spaces();
      st.comment = std::string(c.rest());
    } else if (!c.at_end()) {
      c.fail("unexpected text after the call");
    }
    return st;
  }

  // The comment of a statement: `t0: "cpu f32[4]", t1: "..."  file.py:3  source text`.
  void check_comment(const Line& line, const Statement& st, const std::vector<Value*>& outs,
                     SourceLoc* loc) {
    std::string_view rest = st.comment;
    int col = static_cast<int>(line.text.find('#')) + 3;
    if (!outs.empty() && !rest.empty()) {
      for (size_t k = 0; k < outs.size(); ++k) {
        std::string prefix = (k ? ", " : "") + outs[k]->name() + ": \"";
        if (!rest.starts_with(prefix)) {
          if (k == 0 && rest.find(": \"") == std::string_view::npos) break;  // no types written
          error_at(line, col, "expected the type of '" + outs[k]->name() + "' here");
        }
        rest.remove_prefix(prefix.size());
        size_t close = rest.find('"');
        if (close == std::string_view::npos) error_at(line, col, "unterminated type string");
        Type declared;
        std::string_view text = rest.substr(0, close);
        if (!parse_type(text, &declared))
          error_at(line, col, "malformed type '" + std::string(text) + "'");
        if (!(declared == outs[k]->type()))
          error_at(line, col,
                   "'" + outs[k]->name() + "' is declared \"" + std::string(text) +
                       "\" but ltorch." + st.op + " gives \"" + type_str(outs[k]->type()) + "\"");
        rest.remove_prefix(close + 1);
      }
    }
    if (!loc) return;
    rest = trim(rest);
    if (rest.empty()) return;
    size_t sep = rest.find("  ");
    std::string_view where = rest.substr(0, sep);
    size_t colon = where.rfind(':');
    int number = 0;
    if (colon == std::string_view::npos ||
        std::from_chars(where.data() + colon + 1, where.data() + where.size(), number).ptr !=
            where.data() + where.size())
      error_at(line, col,
               "expected a source location 'file:line' in the comment, got '" + std::string(where) +
                   "'");
    loc->file = std::string(where.substr(0, colon));
    loc->line = number;
    if (sep != std::string_view::npos) loc->text = std::string(trim(rest.substr(sep)));
  }

  void build_statement(const Line& line, const std::vector<const Line*>& subs, Builder& b) {
    int col = static_cast<int>(indent(line.text)) + 1;
    Statement st = on_line(line, col, [&] {
      Cursor c(line.text, 1);
      return statement(c);
    });
    const OpInfo* op = find_op(st.op);
    if (!op) error_at(line, st.op_col + 1, "unknown op 'ltorch." + st.op + "'");
    // The subsymbols' statements, parsed only for the names they define.
    std::vector<std::string> sub_names;
    std::vector<std::string> sub_texts;
    for (const Line* s : subs) {
      Statement sub = on_line(*s, static_cast<int>(indent(s->text)) + 3, [&] {
        Cursor c(trim(s->text).substr(2), static_cast<int>(indent(s->text)) + 3);
        // Subsymbols may use values only they define: read only the names they define.
        return statement_head(c);
      });
      sub_names.insert(sub_names.end(), sub.outputs.begin(), sub.outputs.end());
    }
    for (const std::string& name : st.outputs) {
      if (values_.contains(name))
        error_at(line, col, "'" + name + "' is defined twice; give every value its own name");
    }
    std::vector<Value*> outs = on_line(line, col, [&] {
      return b.call_named(op->id, st.args, st.kwargs, {}, st.outputs, sub_names);
    });
    SourceLoc loc;
    check_comment(line, st, outs, &loc);
    Node* node = b.trace().nodes().back().get();
    node->loc = loc;
    std::function<void(Node&)> share_loc = [&](Node& n) {  // subsymbols share the parent's location
      for (auto& s : n.subsymbols) {
        s->loc = loc;
        share_loc(*s);
      }
    };
    share_loc(*node);
    // The subsymbols written in the file must be exactly the decomposition kiln makes.
    if (subs.size() != node->subsymbols.size() && !subs.empty())
      error_at(line, col,
               "ltorch." + st.op + " decomposes into " + std::to_string(node->subsymbols.size()) +
                   " subsymbols but " + std::to_string(subs.size()) + " are written under it");
    for (size_t k = 0; k < subs.size(); ++k) {
      std::string written(trim(trim(subs[k]->text).substr(2)));
      size_t hash = written.find("  #");
      if (hash != std::string::npos) written = written.substr(0, hash);
      std::string made = print_statement(*node->subsymbols[k]);
      if (trim(written) != made)
        error_at(*subs[k], static_cast<int>(indent(subs[k]->text)) + 3,
                 "this subsymbol does not match the decomposition of ltorch." + st.op +
                     ", which gives '" + made + "'");
    }
    for (Value* v : outs)
      values_[v->name()] = v;
  }

  void parse_return(const Line& line, Builder& b) {
    on_line(line, static_cast<int>(indent(line.text)) + 1, [&] {
      Cursor c(line.text, 1);
      c.expect("return");
      c.expect("{");
      c.expect("\"output\"");
      c.expect(":");
      c.expect("(");
      std::vector<Value*> outs;
      if (!c.accept(")")) {
        do {
          if (c.peek() == ')') break;
          outs.push_back(value_ref(c));
        } while (c.accept(","));
        c.expect(")");
      }
      if (c.accept(",")) {
        c.expect("\"writebacks\"");
        c.expect(":");
        c.expect("{");
        if (!c.accept("}")) {
          do {
            Value* target = value_ref(c);
            const auto& inputs = b.trace().inputs();
            if (std::find(inputs.begin(), inputs.end(), target) == inputs.end())
              c.fail("a writeback target must be an input, '" + target->name() + "' is not");
            c.expect(":");
            Value* value = value_ref(c);
            b.trace().writebacks.emplace_back(target, value);
          } while (c.accept(","));
          c.expect("}");
        }
      }
      c.expect("}");
      if (!c.at_end()) c.fail("unexpected text after the return");
      b.set_outputs(outs);
      return 0;
    });
  }

  std::string filename_;
  std::vector<Line> lines_;
  std::map<std::string, Value*> values_;
  size_t def_line_ = 0;
};

}  // namespace

bool parse_type(std::string_view text, Type* type) {
  if (text == "float") return *type = ScalarType{ScalarKind::kFloat}, true;
  if (text == "int") return *type = ScalarType{ScalarKind::kInt}, true;
  if (text == "bool") return *type = ScalarType{ScalarKind::kBool}, true;
  try {
    Cursor c(text, 1);
    c.skip_spaces();
    size_t space = text.find(' ');
    if (space == std::string_view::npos) return false;
    auto device = Device::parse(text.substr(0, space));
    if (!device) return false;
    Cursor d(text.substr(space + 1), 1);
    std::string dname = d.identifier();
    auto dtype = dtype_from_name(dname);
    if (!dtype) return false;
    TensorType t;
    t.device = *device;
    t.dtype = *dtype;
    d.expect("[");
    if (!d.accept("]")) {
      do {
        Constant n = d.number();
        if (!std::holds_alternative<int64_t>(n) || std::get<int64_t>(n) < 0) return false;
        t.shape.push_back(std::get<int64_t>(n));
      } while (d.accept(","));
      d.expect("]");
    }
    if (d.accept("strides=(")) {
      Layout layout;
      if (!d.accept(")")) {
        do {
          if (d.peek() == ')') break;
          Constant n = d.number();
          if (!std::holds_alternative<int64_t>(n)) return false;
          layout.strides.push_back(std::get<int64_t>(n));
        } while (d.accept(","));
        d.expect(")");
      }
      d.expect("offset=");
      Constant off = d.number();
      if (!std::holds_alternative<int64_t>(off)) return false;
      layout.offset = std::get<int64_t>(off);
      if (layout.strides.size() != t.shape.size()) return false;
      t.layout = layout;
    }
    if (!d.at_end()) return false;
    *type = t;
    return true;
  } catch (const ParseFailure&) {
    return false;
  }
}

Trace parse_trace(std::string_view text, const std::string& filename) {
  TraceParser parser(text, filename);
  return parser.parse();
}

}  // namespace kiln
