// graph_rebinding (runtime/cuda/graph_rebinding.h): which fresh results of a captured graph a
// replay points at new memory, on graph contents written by hand (no device needed).
#include "kiln/runtime/cuda/graph_rebinding.h"

#include <gtest/gtest.h>

namespace kiln::cuda {
namespace {

constexpr uint64_t kBlock = 0x7f0000001000, kBytes = 4096;  // a fresh result's block
constexpr uint64_t kOther = 0x7f0000100000;                 // another allocation

// A launch of a kernel of kiln's: its words, and which of them are addresses.
GraphKernelNode kiln_launch(std::vector<uint64_t> words, std::vector<int> address_words) {
  GraphKernelNode k;
  k.words = std::move(words);
  k.address_words = std::move(address_words);
  return k;
}

std::vector<FreshBlock> one_result() {
  return {{kBlock, kBytes}};
}

TEST(GraphRebinding, AResultOnlyKilnsLaunchesHoldIsRebound) {
  GraphContents g;
  // writer: [in, out, offset, stride]; reader: [in, out, ...]; a third launch never touches it.
  g.kernels.push_back(kiln_launch({kOther, kBlock, 0, 1}, {0, 1}));
  g.kernels.push_back(kiln_launch({kBlock, kOther + 64, 3, 1}, {0, 1}));
  g.kernels.push_back(kiln_launch({kOther, kOther + 64, 0, 1}, {0, 1}));
  Rebinding r = choose_rebound_results(g, one_result(), {});
  ASSERT_EQ(r.rebound, std::vector<bool>{true});
  ASSERT_EQ(r.node_words.size(), 2u);
  EXPECT_EQ(r.node_words[0].first, 0u);
  EXPECT_EQ(r.node_words[0].second, (std::vector<std::pair<int, int>>{{1, 0}}));
  EXPECT_EQ(r.node_words[1].first, 1u);
  EXPECT_EQ(r.node_words[1].second, (std::vector<std::pair<int, int>>{{0, 0}}));
  EXPECT_TRUE(r.why_copied.empty());
}

TEST(GraphRebinding, AnAddressInsideTheBlockIsMovedWithIt) {
  GraphContents g;  // a copy kernel's src and dst are the first elements' addresses
  g.kernels.push_back(kiln_launch({kOther + 8, kBlock + 256, 100}, {0, 1}));
  Rebinding r = choose_rebound_results(g, one_result(), {});
  ASSERT_EQ(r.rebound, std::vector<bool>{true});
  EXPECT_EQ(r.node_words.at(0).second, (std::vector<std::pair<int, int>>{{1, 0}}));
}

TEST(GraphRebinding, AWordInTheBlockThatIsNotARegisteredAddressKeepsTheResultCopied) {
  // A kernel kiln did not make (cuBLAS's): nothing registered.
  GraphContents foreign;
  foreign.kernels.push_back(kiln_launch({kBlock, kOther}, {0}));
  foreign.kernels.push_back(kiln_launch({kOther, kBlock + 8, 7}, {}));
  Rebinding r = choose_rebound_results(foreign, one_result(), {});
  EXPECT_EQ(r.rebound, std::vector<bool>{false});
  EXPECT_TRUE(r.node_words.empty());
  EXPECT_NE(r.why_copied.find("did not make"), std::string::npos) << r.why_copied;
  // A number of kiln's kernel (a stride, a scalar's bits) that happens to lie in the block.
  GraphContents number;
  number.kernels.push_back(kiln_launch({kOther, kBlock, kBlock + 16}, {0, 1}));
  EXPECT_EQ(choose_rebound_results(number, one_result(), {}).rebound, std::vector<bool>{false});
}

TEST(GraphRebinding, ABlockHandedOutTwiceOrNotKilnsIsCopied) {
  GraphContents g;
  g.kernels.push_back(kiln_launch({kOther, kBlock}, {0, 1}));
  Rebinding r = choose_rebound_results(g, {{kBlock, std::nullopt}}, {});
  EXPECT_EQ(r.rebound, std::vector<bool>{false});
  EXPECT_NE(r.why_copied.find("more than once"), std::string::npos) << r.why_copied;
}

TEST(GraphRebinding, CopyNodesAndForeignStepsThatTouchTheBlockKeepItCopied) {
  GraphContents g;
  g.kernels.push_back(kiln_launch({kOther, kBlock}, {0, 1}));
  g.copied_spans.push_back({kBlock + kBytes - 4, kBlock + kBytes + 64});  // its last 4 bytes
  EXPECT_EQ(choose_rebound_results(g, one_result(), {}).rebound, std::vector<bool>{false});
  // Spans that end where the block starts or start where it ends do not touch it.
  g.copied_spans = {{kBlock - 64, kBlock}, {kBlock + kBytes, kBlock + kBytes + 8}};
  EXPECT_EQ(choose_rebound_results(g, one_result(), {}).rebound, std::vector<bool>{true});
  // A storage an eager step or a library call read: its kernels may hold the address where
  // kiln cannot see it (a TMA descriptor).
  Rebinding r = choose_rebound_results(g, one_result(), {{kBlock, kBlock + 16}});
  EXPECT_EQ(r.rebound, std::vector<bool>{false});
  EXPECT_NE(r.why_copied.find("library call"), std::string::npos) << r.why_copied;
}

TEST(GraphRebinding, AnOpaqueNodeRebindsNothing) {
  GraphContents g;
  g.kernels.push_back(kiln_launch({kOther, kBlock}, {0, 1}));
  g.opaque = "a graph node of type 4 (not a launch or copy)";
  Rebinding r = choose_rebound_results(g, one_result(), {});
  EXPECT_EQ(r.rebound, std::vector<bool>{false});
  EXPECT_EQ(r.why_copied, g.opaque);
}

TEST(GraphRebinding, TwoResultsOfOneLaunchShareItsEntryAndAWordPastTheBlockIsNotIn) {
  constexpr uint64_t kSecond = kBlock + 2 * kBytes;
  GraphContents g;
  // words: in, out 0, out 1, and the first block's end (one past: not in it)
  g.kernels.push_back(kiln_launch({kOther, kBlock, kSecond, kBlock + kBytes}, {0, 1, 2}));
  Rebinding r = choose_rebound_results(g, {{kBlock, kBytes}, {kSecond, kBytes}}, {});
  ASSERT_EQ(r.rebound, (std::vector<bool>{true, true}));
  ASSERT_EQ(r.node_words.size(), 1u);
  EXPECT_EQ(r.node_words[0].second, (std::vector<std::pair<int, int>>{{1, 0}, {2, 1}}));
}

}  // namespace
}  // namespace kiln::cuda
