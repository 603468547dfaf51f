// Printer and parser: every op in the table prints, parses back and prints identically; the
// printed statement has the expected argument form; malformed text gives file:line:col errors.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "kiln/kiln.h"

namespace kiln {
namespace {

// Inputs every sample may use.
constexpr const char* kHeader =
    "# Constructed by trace (0.00 ms)\n"
    "def computation(x, y, i, m, bm, s, v, n, j):\n"
    "  # x: \"cpu f32[2, 3]\"\n"
    "  # y: \"cpu f32[2, 3]\"\n"
    "  # i: \"cpu i64[2, 3]\"\n"
    "  # m: \"cpu bool[2, 3]\"\n"
    "  # bm: \"cpu f32[2, 3, 3]\"\n"
    "  # s: \"cpu f32[3, 3]\"\n"
    "  # v: \"cpu f32[3]\"\n"
    "  # n: \"float\"\n"
    "  # j: \"cpu i64[3]\"\n";

// One call per op, written as kiln prints it (defaults left out). The in-place form of an
// elementwise op uses its functional op's sample. Adding an op to ops.def without a sample here
// fails EveryOpHasASample.
const std::map<std::string, std::string>& samples() {
  static const std::map<std::string, std::string> s = {
      {"abs", "ltorch.abs(x)"},
      {"neg", "ltorch.neg(x)"},
      {"exp", "ltorch.exp(x)"},
      {"exp2", "ltorch.exp2(x)"},
      {"expm1", "ltorch.expm1(x)"},
      {"log", "ltorch.log(x)"},
      {"log1p", "ltorch.log1p(x)"},
      {"log2", "ltorch.log2(x)"},
      {"sqrt", "ltorch.sqrt(x)"},
      {"rsqrt", "ltorch.rsqrt(x)"},
      {"sin", "ltorch.sin(x)"},
      {"cos", "ltorch.cos(x)"},
      {"tan", "ltorch.tan(x)"},
      {"tanh", "ltorch.tanh(x)"},
      {"asin", "ltorch.asin(x)"},
      {"acos", "ltorch.acos(x)"},
      {"atan", "ltorch.atan(x)"},
      {"sinh", "ltorch.sinh(x)"},
      {"cosh", "ltorch.cosh(x)"},
      {"sigmoid", "ltorch.sigmoid(x)"},
      {"relu", "ltorch.relu(x)"},
      {"gelu", "ltorch.gelu(x, approximate=\"tanh\")"},
      {"silu", "ltorch.silu(x)"},
      {"erf", "ltorch.erf(x)"},
      {"reciprocal", "ltorch.reciprocal(x)"},
      {"floor", "ltorch.floor(x)"},
      {"ceil", "ltorch.ceil(x)"},
      {"round", "ltorch.round(x)"},
      {"trunc", "ltorch.trunc(x)"},
      {"sign", "ltorch.sign(x)"},
      {"square", "ltorch.square(x)"},
      {"logical_not", "ltorch.logical_not(m)"},
      {"bitwise_not", "ltorch.bitwise_not(i)"},
      {"isnan", "ltorch.isnan(x)"},
      {"add", "ltorch.add(x, y, alpha=2)"},
      {"sub", "ltorch.sub(x, n)"},
      {"mul", "ltorch.mul(x, 0.5)"},
      {"div", "ltorch.div(x, y, rounding_mode=\"floor\")"},
      {"pow", "ltorch.pow(x, 2)"},
      {"remainder", "ltorch.remainder(x, 3)"},
      {"fmod", "ltorch.fmod(x, -1.5)"},
      {"maximum", "ltorch.maximum(x, y)"},
      {"minimum", "ltorch.minimum(x, y)"},
      {"atan2", "ltorch.atan2(x, y)"},
      {"eq", "ltorch.eq(x, y)"},
      {"ne", "ltorch.ne(x, 1)"},
      {"lt", "ltorch.lt(x, y)"},
      {"le", "ltorch.le(x, y)"},
      {"gt", "ltorch.gt(x, 0.0)"},
      {"ge", "ltorch.ge(x, y)"},
      {"logical_and", "ltorch.logical_and(m, x)"},
      {"logical_or", "ltorch.logical_or(x, m)"},
      {"logical_xor", "ltorch.logical_xor(m, m)"},
      {"bitwise_and", "ltorch.bitwise_and(i, 6)"},
      {"bitwise_or", "ltorch.bitwise_or(i, i)"},
      {"bitwise_xor", "ltorch.bitwise_xor(i, True)"},
      {"copy", "ltorch.copy(x, y)"},
      {"where", "ltorch.where(m, x, float('inf'))"},
      {"clamp", "ltorch.clamp(x, None, 1.0)"},
      {"lerp", "ltorch.lerp(x, y, 0.25)"},
      {"addcmul", "ltorch.addcmul(x, x, y, value=-2)"},
      {"addcdiv", "ltorch.addcdiv(x, x, y, value=0.5)"},
      {"to", "ltorch.to(x, torch.bfloat16)"},
      {"full", "ltorch.full([2, 2], 1.5, device=\"cuda:1\")"},
      {"zeros", "ltorch.zeros([4], dtype=torch.int32)"},
      {"ones", "ltorch.ones([2, 1])"},
      {"full_like", "ltorch.full_like(x, 7)"},
      {"zeros_like", "ltorch.zeros_like(x, dtype=torch.float64)"},
      {"ones_like", "ltorch.ones_like(i)"},
      {"empty_like", "ltorch.empty_like(x)"},
      {"arange", "ltorch.arange(0, 10, 3)"},
      {"fill", "ltorch.fill(x, -float('inf'))"},
      {"sum", "ltorch.sum(x, [1], True, dtype=torch.float64)"},
      {"prod", "ltorch.prod(i, 0)"},
      {"mean", "ltorch.mean(x)"},
      {"amax", "ltorch.amax(x, [-1])"},
      {"amin", "ltorch.amin(bm, [0, 2], True)"},
      {"var", "ltorch.var(x, [1], correction=0)"},
      {"std", "ltorch.std(x, keepdim=True)"},
      {"argmax", "ltorch.argmax(x, 1)"},
      {"argmin", "ltorch.argmin(x)"},
      {"view", "ltorch.view(x, [3, -1])"},
      {"reshape", "ltorch.reshape(x, [6])"},
      {"permute", "ltorch.permute(bm, [2, 0, 1])"},
      {"transpose", "ltorch.transpose(x, 0, 1)"},
      {"t", "ltorch.t(x)"},
      {"expand", "ltorch.expand(v, [2, 3])"},
      {"unsqueeze", "ltorch.unsqueeze(x, -1)"},
      {"squeeze", "ltorch.squeeze(x, [0])"},
      {"flatten", "ltorch.flatten(bm, 1)"},
      {"unflatten", "ltorch.unflatten(v, 0, [1, 3])"},
      {"slice", "ltorch.slice(x, 1, 0, None, 2)"},
      {"narrow", "ltorch.narrow(x, 1, 1, 2)"},
      {"select", "ltorch.select(x, 0, -1)"},
      {"getitem", "ltorch.getitem(bm, (0, ..., None, slice(None, None, 2)))"},
      {"diagonal", "ltorch.diagonal(s, 1)"},
      {"as_strided", "ltorch.as_strided(x, [2, 2], [1, 2], 1)"},
      {"split", "ltorch.split(x, [1, 2], 1)"},
      {"chunk", "ltorch.chunk(x, 2)"},
      {"unbind", "ltorch.unbind(x, 1)"},
      {"detach", "ltorch.detach(x)"},
      {"alias", "ltorch.alias(x)"},
      {"view_dtype", "ltorch.view_dtype(x, torch.int32)"},
      {"bitcast", "ltorch.bitcast(i, torch.float64)"},
      {"slice_scatter", "ltorch.slice_scatter(x, y, 1)"},
      {"wrap_index", "ltorch.wrap_index(j, 4)"},
      {"index_select", "ltorch.index_select(x, 1, j)"},
      {"gather", "ltorch.gather(x, 1, i)"},
      {"index_copy", "ltorch.index_copy(x, 1, j, y)"},
      {"index_add", "ltorch.index_add(x, 1, j, y, alpha=2)"},
      {"scatter", "ltorch.scatter(x, 1, i, x, reduce=\"amax\", include_self=False)"},
      {"select_scatter", "ltorch.select_scatter(s, v, 1, 0)"},
      {"diagonal_scatter", "ltorch.diagonal_scatter(s, v)"},
      {"as_strided_scatter", "ltorch.as_strided_scatter(s, x, [2, 3], [3, 1])"},
      {"fill_", "ltorch.fill_(x, 2)"},
      {"zero_", "ltorch.zero_(x)"},
      {"copy_", "ltorch.copy_(x, i)"},
      {"setitem_", "ltorch.setitem_(x, (slice(None, None, None), slice(1, 3, None)), 0.0)"},
      {"t_", "ltorch.t_(x)"},
      {"transpose_", "ltorch.transpose_(bm, 0, 2)"},
      {"unsqueeze_", "ltorch.unsqueeze_(x, 0)"},
      {"squeeze_", "ltorch.squeeze_(x)"},
      {"as_strided_", "ltorch.as_strided_(x, [3], [2])"},
      {"cat", "ltorch.cat([x, y], 1)"},
      {"stack", "ltorch.stack([x, y, x])"},
      {"matmul", "ltorch.matmul(x, s)"},
      {"bmm", "ltorch.bmm(bm, bm)"},
      {"linear", "ltorch.linear(x, s, v)"},
      {"eager_call",
       "ltorch.eager_call(3, [x, v], \"cpu f32[2, 3] strides=(3, 1) offset=0; cpu i64[3] "
       "strides=(1,) offset=0\")"},
      {"softmax", "ltorch.softmax(x, -1)"},
      {"log_softmax", "ltorch.log_softmax(x, 0, torch.float64)"},
      {"layer_norm", "ltorch.layer_norm(x, [3], v, v)"},
      {"rms_norm", "ltorch.rms_norm(x, [3], v, 1e-06)"},
  };
  return s;
}

std::string sample_for(const OpInfo& op) {
  auto it = samples().find(op.name);
  if (it != samples().end()) return it->second;
  if (op.is_inplace_elementwise()) {
    std::string functional = samples().at(op_info(op.functional_form).name);
    std::string prefix = "ltorch." + op_info(op.functional_form).name + "(";
    return "ltorch." + op.name + "(" + functional.substr(prefix.size());
  }
  return "";
}

TEST(PrinterParser, EveryOpHasASample) {
  for (const OpInfo& op : all_ops())
    EXPECT_FALSE(sample_for(op).empty()) << op.name;
}

// Builds `call` through the parser (with fresh output names), prints, parses the print and
// prints again: the two prints must be identical, and the statement must read as written.
TEST(PrinterParser, EveryOpRoundTrips) {
  for (const OpInfo& op : all_ops()) {
    std::string call = sample_for(op);
    SCOPED_TRACE(op.name + ": " + call);
    // First read the call without outputs to learn how many it defines.
    std::string outputs;
    {
      // Parse a trace that only calls the op for its effect, then count the node's outputs.
      std::string text = std::string(kHeader) + "  " + call + "\n  return {\"output\": ()}\n";
      size_t n = 0;
      try {
        Trace p = parse_trace(text);
        n = p.nodes().back()->outputs.size();
      } catch (const UserError& e) {
        // The parser insists that a statement names every output: the message says how many.
        std::string msg = e.what();
        size_t at = msg.find("defines ");
        ASSERT_NE(at, std::string::npos) << msg;
        n = std::stoul(msg.substr(at + 8));
      }
      for (size_t k = 0; k < n; ++k)
        outputs += (k ? ", r" : "r") + std::to_string(k);
    }
    std::string stmt = outputs.empty() ? call : outputs + " = " + call;
    std::string text = std::string(kHeader) + "  " + stmt + "\n  return {\"output\": ()}\n";
    Trace first = parse_trace(text, "sample.trace");
    verify_trace(first);
    ASSERT_FALSE(first.nodes().empty());
    EXPECT_EQ(print_statement(*first.nodes().back()), stmt);
    EXPECT_EQ(first.nodes().back()->op->name, op.name);
    std::string printed = print_trace(first);
    Trace second = parse_trace(printed, "printed.trace");
    EXPECT_EQ(print_trace(second), printed);
  }
}

TEST(PrinterParser, TracedProgramRoundTripsWithLocationsAndSubsymbols) {
  Trace t = trace(
      [](Tensor x, Tensor w) {
        Tensor y = x - x.mean(IntList{-1}, true);
        y.mul_(w);
        y.index_put_({Slice(), Slice(0, 2)}, 0.0);
        return std::make_tuple(softmax(y, -1), y.transpose(0, 1), layer_norm(x, {4}));
      },
      {TensorSpec(f32, {3, 4}), TensorSpec(bf16, {4}).strided({2}, 1)});
  std::string printed = print_trace(t);
  EXPECT_NE(printed.find("printer_parser_test.cpp:"), std::string::npos) << printed;
  EXPECT_NE(printed.find("    # "), std::string::npos) << "subsymbols are printed: " << printed;
  EXPECT_NE(printed.find("# b: \"cpu bf16[4] strides=(2,) offset=1\""), std::string::npos)
      << printed;
  Trace again = parse_trace(printed, "again.trace");
  EXPECT_EQ(print_trace(again), printed);
  verify_trace(again);
}

std::string parse_error(const std::string& text) {
  try {
    parse_trace(text, "bad.trace");
  } catch (const ParseError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not a ParseError: ") + e.what();
  }
  return "no error";
}

TEST(PrinterParser, MalformedTextGivesFileLineColumn) {
  std::string head = "def computation(a):\n  # a: \"cpu f32[4]\"\n";
  EXPECT_EQ(parse_error(head + "  t0 = ltorch.nosuchop(a)\n  return {\"output\": (t0,)}\n"),
            "bad.trace:3:8: error: unknown op 'ltorch.nosuchop'");
  EXPECT_EQ(parse_error(head + "  t0 = ltorch.exp(b)\n  return {\"output\": (t0,)}\n"),
            "bad.trace:3:19: error: 'b' is not defined before this use");
  EXPECT_EQ(parse_error(head + "  t0 = ltorch.exp(a\n  return {\"output\": (t0,)}\n"),
            "bad.trace:3:20: error: expected ')'");
  EXPECT_EQ(parse_error(head + "  t0 = ltorch.exp(a)\n"),
            "bad.trace:3:1: error: the trace has no 'return {\"output\": (...)}' line");
  EXPECT_EQ(parse_error("def computation(a):\n  t0 = ltorch.exp(a)\n"),
            "bad.trace:1:1: error: input 'a' has no type comment (# a: \"cpu f32[4]\")");
  EXPECT_EQ(
      parse_error("def computation(a, a):\n  # a: \"cpu f32[4]\"\n  return {\"output\": ()}\n"),
      "bad.trace:1:1: error: kiln: the name 'a' is defined twice; give every value its own "
      "name.");
  EXPECT_EQ(parse_error("def computation(a):\n  # a: \"cpu f99[4]\"\n"),
            "bad.trace:2:9: error: malformed type 'cpu f99[4]'");
  // A type error inside a statement names the op and the fix, at the statement's line.
  std::string shapes = parse_error(
      "def computation(a, b):\n  # a: \"cpu f32[4]\"\n  # b: \"cpu f32[3]\"\n"
      "  t0 = ltorch.add(a, b)\n  return {\"output\": (t0,)}\n");
  EXPECT_NE(shapes.find("bad.trace:4:3: error: kiln: add: shapes [4] and [3] do not broadcast"),
            std::string::npos)
      << shapes;
  // A declared type that disagrees with the op's type rule.
  std::string declared = parse_error(head +
                                     "  t0 = ltorch.exp(a)  # t0: \"cpu f64[4]\"\n"
                                     "  return {\"output\": (t0,)}\n");
  EXPECT_NE(declared.find("bad.trace:3:"), std::string::npos) << declared;
  EXPECT_NE(declared.find("declared \"cpu f64[4]\" but ltorch.exp gives \"cpu f32[4]\""),
            std::string::npos)
      << declared;
  // Subsymbols that are not the op's decomposition.
  std::string subs = parse_error(head +
                                 "  t1 = ltorch.softmax(a, 0)\n    # t1 = ltorch.exp(a)\n"
                                 "  return {\"output\": (t1,)}\n");
  EXPECT_NE(subs.find("bad.trace:3:"), std::string::npos) << subs;
  EXPECT_EQ(
      parse_error(head +
                  "  t0 = ltorch.exp(a)\n  t0 = ltorch.exp(a)\n  return {\"output\": (t0,)}\n"),
      "bad.trace:4:3: error: 't0' is defined twice; give every value its own name");
  EXPECT_EQ(
      parse_error(head + "  t0 = ltorch.sum(a, [0], keepdim=1)\n  return {\"output\": (t0,)}\n")
          .substr(0, 30),
      "bad.trace:3:3: error: kiln: su");
}

}  // namespace
}  // namespace kiln
