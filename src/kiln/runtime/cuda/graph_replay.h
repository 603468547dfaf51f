// CUDA graph replay: a program whose launches do not change between calls runs as one CUDA graph
// (cuGraphLaunch), so a call costs one launch of host time instead of one per step.
//
//   call 1, 2: execute() as usual; the second learns which tensor arguments stay at one address
//              (parameters, buffers, a KV cache) and which move (the token ids of each step)
//   call 3:    the launches captured on a side stream (nothing runs), then replayed
//   later:     copy each moving argument into the graph's own buffer, check the indices on the
//              host, point the launches that write (or read) a fresh result at new memory,
//              launch the graph, copy the other fresh results out into new memory
//
// A fresh result is pointed at new memory (rebound, cuGraphExecKernelNodeSetParams) when every
// node of the graph that holds its address is a launch of kiln's own kernels, holding it in a
// word the kernel registered as an address (register_address_words), and its block was the
// capture's for it alone. One that a cuBLAS or PyTorch kernel, a copy node or an eager step may
// touch is copied out of the graph's memory instead.
//
// Requires: a CUDA program that ran without a step needing the host (no interpreted step, no
// host copy; an eager_call step only where PyTorch joins the capture, options.eager_capture, and
// its function was registered without a capture refusal), with no metadata mutation, at least
// two launched steps (a multi-tensor launch counting its steps), and copies that cost little
// against the launches a replay saves (at most 2 MiB of moving arguments and copied fresh
// results per launch). An argument the program writes must keep its address (it is written in
// place; a moving one would need a copy back), and every index a kernel checks must be a view of an
// argument the program does not write (its check runs before the launch, on the caller's tensor).
// Anything else, or a capture the driver refuses, leaves the program running through execute()
// (refused() says why).
//
// Ensures: the same results, writes into the caller's memory and errors as execute(): a replay
// reads every argument's current contents, returns outputs in fresh memory (later replays never
// overwrite them) or views of the caller's own tensors, and raises an index out of range before
// anything runs. A stable argument found at another address runs that call without the graph
// and starts learning again.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/runtime/executor.h"

namespace kiln::cuda {

class GraphReplay {
 public:
  GraphReplay();
  ~GraphReplay();
  GraphReplay(const GraphReplay&) = delete;
  GraphReplay& operator=(const GraphReplay&) = delete;

  // execute(program, args, options), through the program's graph when it has (or can make) one.
  // KILN_CUDA_GRAPHS=0 turns graphs off.
  std::vector<RtValue> run(const CompiledProgram& program, const std::vector<RtValue>& args,
                           const ExecuteOptions& options);

  // Why the program never runs as a graph (empty while it may).
  const std::string& refused() const { return refused_; }

  struct Captured;  // a graph and what a replay needs (graph_replay.cpp)

 private:
  std::vector<RtValue> execute_and_learn(const CompiledProgram& program,
                                         const std::vector<RtValue>& args,
                                         const ExecuteOptions& options);
  std::unique_ptr<Captured> capture(const CompiledProgram& program,
                                    const std::vector<RtValue>& args,
                                    const ExecuteOptions& options);
  // nullopt when a stable argument is not where the graph has it, or when a tensor an index is
  // drawn from holds values out of range (refused_ then says so: the exact check decides).
  std::optional<std::vector<RtValue>> replay(Captured& c, const std::vector<RtValue>& args,
                                             const ExecuteOptions& options);

  std::unique_ptr<Captured> graph_;
  std::string refused_;
  std::vector<uint64_t> last_addresses_;  // each argument's storage address in the last call
  int eligible_runs_ = 0;                 // runs through execute() that a graph could replace
};

}  // namespace kiln::cuda
