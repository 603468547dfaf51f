// The execution plan: the functional trace cut into steps (fusion regions, opaque ops, writeback
// copies), in the order they run. `fuse` makes the regions, `place_writebacks` decides where
// each writeback happens and orders the steps.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/ir/trace.h"

namespace kiln {

struct Step {
  enum class Kind { kFusion, kOpaque, kCopy };
  Kind kind = Kind::kFusion;
  std::string name;  // kilnFusion0, ...
  // kFusion / kOpaque: the region as a trace of its own. Its inputs correspond to `inputs`, its
  // outputs to `outputs` (values of the functional trace).
  Trace body;
  std::vector<Value*> inputs;
  std::vector<Value*> outputs;
  // A writeback may replace only part of its input: the value goes into this window of it (views
  // applied in order), the rest of which keeps its contents (a writeback of
  // slice_scatter(input, value, ...), select_scatter or as_strided_scatter, as `x[:, :512] = v`
  // and `x[2] = v` make). An empty window: the whole input.
  struct Window {
    enum class Kind { kSlice, kSelect, kAsStrided };
    Kind kind = Kind::kSlice;
    int64_t dim = 0;                      // slice, select: normalized to [0, rank)
    int64_t start = 0;                    // slice, select: the first index (normalized)
    std::optional<int64_t> offset;        // as_strided: its storage offset (none: the input's)
    int64_t length = 0;                   // slice
    int64_t step = 1;                     // slice
    std::vector<int64_t> sizes, strides;  // as_strided: the first window only (storage-level)
    bool operator==(const Window&) const = default;
  };
  // A writeback this step performs: `value` goes into `target` (a functional-trace input), or
  // into its `window`. For kCopy the value was computed by an earlier step into a temporary; for
  // kFusion the region stores it itself (when the executor finds it may, else it copies it after
  // the step).
  struct Writeback {
    Value* target = nullptr;
    Value* value = nullptr;
    std::vector<Window> window;
  };
  std::vector<Writeback> writebacks;
  // kFusion: per output, the order of its dims in memory, outermost first, where it is not
  // row-major (empty: row-major). The executor allocates the output so and the kernel iterates
  // in that order (place_layouts.h: a channels-last activation a convolution reads).
  std::vector<std::vector<int>> output_orders;
  // kOpaque (an eager_call): per input, the dim order eager handed it in where that was a dense
  // permutation other than row-major (empty: as it is). The executor copies an input not so laid
  // out (place_layouts.h).
  std::vector<std::vector<int>> input_orders;
};

// Whether a step reads its inputs through their storage (as_strided, a bitcast, a dtype view):
// they must keep eager's row-major layout.
bool reads_through_storage(const Step& step);

// Consecutive fusion steps [first, first + count) that may run as one multi-tensor kernel
// (group_multi_tensor.h): the same elementwise computation over tensors of different sizes, none
// reading or writing what another writes (an optimizer's update of each parameter).
struct MultiTensorGroup {
  size_t first = 0;
  size_t count = 0;
};

struct ExecutionPlan {
  std::vector<Step> steps;
  std::vector<MultiTensorGroup> multi_tensor_groups;  // disjoint, in step order
};

// The elements a group's kernel computes: each step's own (the shape of its results of rank 1
// or more; 1 where all are 0-d).
int64_t group_elements(const ExecutionPlan& plan, const MultiTensorGroup& group);

// The plan as Python-like text: each step a call `(outs) = kilnFusionN(ins)` with its nodes as
// comments beneath and the writebacks it performs.
std::string print_plan(const Trace& functional, const ExecutionPlan& plan);

}  // namespace kiln
