// The functions eager_call steps run (ops.def: a torch op kiln has no lowering for, run by
// PyTorch in the middle of a program). The process that traced the program registers them (the
// Python front end, kiln._C); the interpreter and the executor call them by number. A trace that
// names a number nobody registered — a trace from another process, or kiln-opt — cannot run.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kiln/runtime/interpreter/rt_tensor.h"

namespace kiln {

// Takes the op's input tensors (CPU or device storages; their memory must only be read) and
// returns its results as fresh tensors.
using EagerFunction = std::function<std::vector<TensorHandle>(const std::vector<TensorHandle>&)>;

// A new number for `f` (never reused in the process). `capture_refusal`: why f's device work
// may not be recorded once into a CUDA graph and replayed (cuda/graph_replay.h), as "draws
// random numbers"; empty when it may (it draws no random numbers, reads nothing back to the
// host and depends on nothing but its inputs' contents).
int register_eager_function(EagerFunction f,
                            std::string capture_refusal = "has no rule for CUDA graph capture");
void unregister_eager_function(int id);
// Runs function `id`; a UserError when no function has that number.
std::vector<TensorHandle> call_eager_function(int id, const std::vector<TensorHandle>& inputs);
// Why function `id` may not be captured (empty: it may; a reason also when none has that number).
std::string eager_function_capture_refusal(int id);

}  // namespace kiln
