// What each Value of one trace is during one run, in a slot per Value (a Value's id is its index
// in its trace: Builder numbers them densely). The executor binds every input, step output and
// writeback value of a call here; a std::map cost a node allocation per value, which for an
// optimizer step over 50 parameters was a third of the call's host time (bench/NOTES.md,
// session 25).
#pragma once

#include <vector>

#include "kiln/ir/trace.h"
#include "kiln/runtime/interpreter/rt_tensor.h"
#include "kiln/support/error.h"

namespace kiln {

class ValueSlots {
 public:
  explicit ValueSlots(const Trace& trace) : slots_(trace.num_values()) {}

  bool contains(const Value* v) const {
    auto i = static_cast<size_t>(v->id());
    return i < slots_.size() && slots_[i].value == v;
  }
  const RtValue& at(const Value* v) const {
    KILN_ASSERT(contains(v)) << "the executor read %" << v->name() << " before binding it";
    return slots_[static_cast<size_t>(v->id())].bound;
  }
  // Binds `v` (or rebinds it) and returns its slot.
  RtValue& operator[](const Value* v) {
    auto i = static_cast<size_t>(v->id());
    KILN_ASSERT(i < slots_.size() && (slots_[i].value == nullptr || slots_[i].value == v))
        << "%" << v->name() << " is not a value of the trace the executor runs";
    slots_[i].value = v;
    return slots_[i].bound;
  }

 private:
  struct Slot {
    const Value* value = nullptr;  // the Value bound here (nullptr: none yet)
    RtValue bound;
  };
  std::vector<Slot> slots_;
};

}  // namespace kiln
