#include "kiln/runtime/cuda/graph_rebinding.h"

#include <algorithm>
#include <map>

namespace kiln::cuda {

namespace {

// The (node, word) pairs whose values lie in [first, end); nullopt when one of them is not a
// word its kernel registered as an address.
std::optional<std::vector<std::pair<size_t, int>>> words_into(const GraphContents& graph,
                                                              uint64_t first, uint64_t end) {
  std::vector<std::pair<size_t, int>> found;
  for (size_t n = 0; n < graph.kernels.size(); ++n) {
    const GraphKernelNode& k = graph.kernels[n];
    for (size_t w = 0; w < k.words.size(); ++w) {
      if (k.words[w] < first || k.words[w] >= end) continue;
      if (std::ranges::find(k.address_words, static_cast<int>(w)) == k.address_words.end())
        return std::nullopt;
      found.emplace_back(n, static_cast<int>(w));
    }
  }
  return found;
}

}  // namespace

Rebinding choose_rebound_results(const GraphContents& graph, const std::vector<FreshBlock>& fresh,
                                 const std::vector<std::pair<uint64_t, uint64_t>>& foreign_spans) {
  Rebinding r;
  r.rebound.assign(fresh.size(), false);
  if (!graph.opaque.empty()) {
    r.why_copied = graph.opaque;
    return r;
  }
  auto copied_because = [&r](const char* why) {
    if (r.why_copied.empty()) r.why_copied = why;
  };
  std::map<size_t, std::vector<std::pair<int, int>>> words_of_node;
  for (size_t f = 0; f < fresh.size(); ++f) {
    if (!fresh[f].sole_block_bytes) {
      copied_because("memory the capture handed out more than once, or not kiln's");
      continue;
    }
    const uint64_t first = fresh[f].first, end = first + *fresh[f].sole_block_bytes;
    auto overlaps = [first, end](const std::pair<uint64_t, uint64_t>& span) {
      return span.first < end && first < span.second;
    };
    if (std::ranges::any_of(graph.copied_spans, overlaps)) {
      copied_because("memory a copy or fill node touches");
      continue;
    }
    if (std::ranges::any_of(foreign_spans, overlaps)) {
      copied_because("memory a library call or a step PyTorch runs reads or writes");
      continue;
    }
    std::optional<std::vector<std::pair<size_t, int>>> found = words_into(graph, first, end);
    if (!found) {
      copied_because("memory a kernel kiln did not make holds");
      continue;
    }
    r.rebound[f] = true;
    for (auto [n, w] : *found)
      words_of_node[n].emplace_back(w, static_cast<int>(f));
  }
  r.node_words.assign(words_of_node.begin(), words_of_node.end());
  return r;
}

}  // namespace kiln::cuda
