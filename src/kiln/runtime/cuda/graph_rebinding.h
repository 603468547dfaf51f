// Which fresh results of a captured CUDA graph a replay gives new memory instead of copying
// them out of the graph's own (graph_replay.h), and the launch words that then change.
//
//   capture:  y = kernel_a(x) -> block B (the result's), z = cublas(x) -> block C
//   replay:   kernel_a's output word B -> B' (new memory of the caller's allocator); C copied out
//
// Requires: the graph's contents as the driver read them back (driver.h: graph_contents), each
// fresh result's first address and, when the capture's allocator handed its block out once (to
// it alone, for the whole capture), that block's bytes; the storages library calls and eager
// steps read or wrote during the capture, [first, end).
//
// Ensures: a result is rebound only when no copy or fill node, no library call or eager step
// touches its block, and every kernel word whose value lies in the block is one its kernel
// registered as an address (a kernel kiln did not make, or a word that only looks like an
// address, keeps the result copied). A block handed out twice would move the launches of its
// earlier tensor too, so it is copied. Contents with an opaque node rebind nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/runtime/cuda/driver.h"

namespace kiln::cuda {

struct FreshBlock {
  uint64_t first = 0;
  std::optional<size_t> sole_block_bytes;  // nullopt: handed out more than once, or not kiln's
};

struct Rebinding {
  std::vector<bool> rebound;  // per fresh result
  // Per kernel node (its entry in GraphContents::kernels) that holds a rebound result: the words
  // to change, each with the result whose block it points into.
  std::vector<std::pair<size_t, std::vector<std::pair<int, int>>>> node_words;
  std::string why_copied;  // why the first result not rebound is copied
};

Rebinding choose_rebound_results(const GraphContents& graph, const std::vector<FreshBlock>& fresh,
                                 const std::vector<std::pair<uint64_t, uint64_t>>& foreign_spans);

}  // namespace kiln::cuda
