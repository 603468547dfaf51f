// First-seen numbers of pointers (a call's storages and tensor objects, in leaf order): the first
// distinct pointer is 0, the next 1, and so on. An open-addressing table whose slots are kept
// from call to call, so that numbering a call's leaves allocates nothing: a hash map's node per
// leaf cost a malloc and a free each, and an optimizer's call has hundreds of leaves.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace kiln::pyext {

class FirstSeenNumbers {
 public:
  // Forgets every pointer; room for `expected` distinct ones at most half the table full.
  void reset(size_t expected) {
    size_t capacity = 32;
    int bits = 5;
    while (capacity < 2 * expected) {
      capacity *= 2;
      ++bits;
    }
    shift_ = 64 - bits;
    if (slots_.size() < capacity) slots_.resize(capacity);
    // The slots in use are cleared, not the whole table (a large call once leaves it large).
    for (size_t i : used_)
      slots_[i].first = nullptr;
    used_.clear();
    mask_ = capacity - 1;
  }
  // The number of `p` (not null): its first-seen position among the distinct pointers.
  int64_t operator()(const void* p) {
    // Fibonacci hashing: the product's high bits depend on all of the pointer's (its low bits
    // are zeros for aligned memory).
    size_t i = (reinterpret_cast<uint64_t>(p) * 0x9e3779b97f4a7c15ULL) >> shift_;
    while (slots_[i].first && slots_[i].first != p)
      i = (i + 1) & mask_;
    if (!slots_[i].first) {
      slots_[i] = {p, static_cast<int64_t>(used_.size())};
      used_.push_back(i);
    }
    return slots_[i].second;
  }
  size_t distinct() const { return used_.size(); }

 private:
  std::vector<std::pair<const void*, int64_t>> slots_;
  std::vector<size_t> used_;  // the slots in use, in first-seen order
  size_t mask_ = 0;
  int shift_ = 59;
};

}  // namespace kiln::pyext
