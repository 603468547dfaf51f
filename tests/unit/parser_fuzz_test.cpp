// The parser on damaged input: thousands of deterministic random edits of valid traces must each
// either parse into a well-formed trace that round-trips, or raise a UserError with a
// `file:line:col: error:` message — never crash, hang or raise anything else. Run under ASan and
// UBSan in the debug build.
#include <gtest/gtest.h>

#include <random>

#include "kiln/kiln.h"

namespace kiln {
namespace {

std::string sample_trace() {
  Trace t = trace(
      [](Tensor x, Tensor w) {
        Tensor y = x - x.mean(IntList{-1}, true);
        y.mul_(w);
        y.index_put_({Slice(), Slice(0, 2)}, 0.0);
        Tensor s = softmax(y, -1);
        std::vector<Tensor> parts = s.split(2, 1);
        x.transpose_(0, 1);
        return std::make_tuple(parts[1], x, y.to(bf16).sum(IntList{0}));
      },
      {TensorSpec(f32, {3, 4}), TensorSpec(f32, {4}).strided({2}, 1)});
  return print_trace(t);
}

std::string mutate(std::string text, std::mt19937_64& rng) {
  static const std::string alphabet = "()[],=:#\"' .-_0123456789aetx\n";
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % std::max<size_t>(n, 1)); };
  int edits = 1 + static_cast<int>(rng() % 3);
  for (int e = 0; e < edits && !text.empty(); ++e) {
    size_t at = pick(text.size());
    switch (rng() % 6) {
      case 0:
        text.erase(at, 1 + pick(8));
        break;
      case 1:
        text.insert(at, 1, alphabet[pick(alphabet.size())]);
        break;
      case 2:
        text[at] = alphabet[pick(alphabet.size())];
        break;
      case 3:
        text.resize(at);
        break;
      case 4: {  // duplicate a line
        size_t start = text.rfind('\n', at);
        start = start == std::string::npos ? 0 : start + 1;
        size_t end = text.find('\n', at);
        if (end == std::string::npos) end = text.size();
        text.insert(start, text.substr(start, end - start) + "\n");
        break;
      }
      default: {  // replace a digit run with a large number
        size_t d = text.find_first_of("0123456789", at);
        if (d != std::string::npos) text.replace(d, 1, "99999999999999999999");
        break;
      }
    }
  }
  return text;
}

TEST(ParserFuzz, DamagedTracesParseOrFailCleanly) {
  const std::string original = sample_trace();
  std::mt19937_64 rng(20261129);
  int parsed = 0, rejected = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string text = mutate(original, rng);
    try {
      Trace t = parse_trace(text, "fuzz.trace");
      verify_trace(t);
      std::string printed = print_trace(t);
      EXPECT_EQ(print_trace(parse_trace(printed, "again.trace")), printed) << text;
      ++parsed;
    } catch (const ParseError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("fuzz.trace:", 0), 0u) << e.what();
      EXPECT_NE(std::string(e.what()).find(": error: "), std::string::npos) << e.what();
      ++rejected;
    } catch (const UserError& e) {
      ADD_FAILURE() << "a UserError that is not a ParseError: " << e.what() << "\n" << text;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "unexpected " << e.what() << "\n" << text;
    }
  }
  // Both outcomes occur: the edits are neither all harmless nor all fatal.
  EXPECT_GT(parsed, 50);
  EXPECT_GT(rejected, 1000);
}

}  // namespace
}  // namespace kiln
