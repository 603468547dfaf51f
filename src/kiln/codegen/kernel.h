// The kernel emitter (DESIGN.md 3): lowers one fusion step of an execution plan into the source
// of one kernel, C++ for the CPU or CUDA C++ for NVRTC, and describes how to call it.
//
// A kernel is a few loop nests, one per distinct output shape. Each nest iterates over its
// output's elements and evaluates every output of that shape at the iteration's index as one
// expression over indexed loads of the step's inputs: view ops remap the index (index_map.h),
// elementwise ops are ops.def's own expressions (as text), scatters are index conditions and
// creation ops are constants or index expressions. A value is never materialized inside the
// kernel; a value read at two different indices is computed twice. Every value of an iteration is
// computed before the iteration stores anything, and the nest that holds the step's writebacks
// runs last, so a store into an input (a writeback done in the kernel, DESIGN.md 4) happens after
// every read of the old contents the kernel makes elsewhere and, under the same-index rule, after
// its own iteration's reads.
//
// CPU kernels follow the reference interpreter exactly: floating math in double with each op's
// result rounded to its dtype (f16/bf16 with round-to-nearest-even, through dtype_convert.h;
// an op that is one correctly rounded operation, as a product, computes in float for a float32,
// f16 or bf16 result, which rounds to the same value, and so does exp, which is scalar_math.h's
// float exp_f32 in both), integer math in int64 with the
// interpreter's conversions. Reductions are the exception: their order differs (vector lanes,
// cores), and a sum of floats adds chunks of 1024 elements summed in float into its double
// accumulator (cpu_float_chunks), so a sum agrees with the interpreter's within float rounding,
// not bit for bit. A nest is a loop nest, parallel with OpenMP when it is large.
//
// CUDA kernels compute as PyTorch's CUDA kernels do: float32, float16 and bfloat16 math in float
// (each op's result still rounded to its dtype), float64 in double, integers in int64. Each nest
// is its own __global__ entry (the nests run in order on one stream), a grid-stride loop over the
// nest's elements in two index widths (32-bit when every address fits, else 64-bit). A nest whose
// inputs are all read at the iteration's own element gets a vectorized variant too: each thread
// does `vector_width` consecutive elements with one 16-byte (or narrower) load per input and one
// store per output; the executor picks it when those tensors are contiguous and aligned.
//
// Not lowered (the executor interprets the step instead; `why_not` says why): reductions,
// cat/stack, opaque ops, as_strided and as_strided_scatter except of an input or of a 1-D value
// that is a whole storage (as functionalize makes them) with a window that does not repeat
// elements, integer div/remainder/fmod/pow (they can raise), arguments the interpreter would
// reject, tensors on another device than the target's.
//
// Requires: a kFusion step whose body is a verified functional trace.
// Tests: tests/unit/cpu_backend_test.cpp, tests/unit/cuda_codegen_test.cpp, tests/gpu/.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/analysis/geometry.h"
#include "kiln/analysis/integer_range.h"
#include "kiln/passes/plan.h"

namespace kiln::codegen {

enum class Target { kCpu, kCuda };

// The CPU kernel function is
//   extern "C" void NAME(void* const* ins, const int64_t* in_meta, const double* sd,
//                        const int64_t* si, void* const* outs, const int64_t* out_meta);
// ins[k]: the start of step input k's storage (not of its first element); in_meta from
// in_meta[meta]: its storage offset, then one stride per dim (elements). sd[k] / si[k]: step input
// k as a double / an int64 when it is a number. outs[k], out_meta: the same for step output k's
// buffer, then the kernel's extents (Kernel::extents). Every stride and offset is read at run
// time, and so is the outermost extent of each nest; the other sizes are compiled in.
using CpuKernelFn = void (*)(void* const* ins, const int64_t* in_meta, const double* sd,
                             const int64_t* si, void* const* outs, const int64_t* out_meta);

// A storage region an input is read through with as_strided (its storage, not its elements):
// the executor checks it is inside the storage before running the kernel.
struct StorageWindow {
  Shape sizes;
  Strides strides;
  std::optional<int64_t> offset;  // none: the input's own storage offset
};

struct KernelInput {
  bool is_tensor = false;
  int meta = -1;  // where its offset and strides start in in_meta (tensors)
  // How the last loop nest reads it: not at all, only at exactly the element the iteration
  // stores into a same-shaped output (the same-index rule's "identity"), at that element except
  // for loads inside a scatter's src (whose values are used only where the scatter's condition
  // holds; place_writebacks' same-index rule decides those), row-local, or otherwise.
  //
  // Row-local: an input of the nest's rank read at the iteration's own index, or by a row's pass
  // (a reduction over the last dim) at any element of the iteration's row. Every such pass ends
  // before the row stores anything (a CUDA row nest's barrier or a warp's shuffles; a CPU row's
  // passes run before its last loop in the same thread), so a store into the input through its own
  // strides and offset never reaches an element some iteration still has to read:
  //   x[:, :512] = softmax(x[:, :512], -1)   loads x[i0, rl] (the max and sum passes) and x[i0, i1]
  //                                          stores x[i0, i1]
  enum class Loads { kNone, kIdentity, kIdentityOrGuarded, kRowLocal, kOther };
  Loads last_nest_loads = Loads::kNone;
  std::vector<StorageWindow> windows;
  // Indexed as a storage (by as_strided_scatter, or as_strided of a value computed from it): the
  // executor runs the kernel only when the input is 1-D, dense from offset 0 and its storage's
  // only content.
  bool whole_storage = false;
};

struct KernelOutput {
  DType dtype = DType::kFloat32;
  Shape shape;
  int meta = -1;              // where its offset and strides start in out_meta
  bool in_last_nest = false;  // stored by the last nest (where an in-kernel writeback can be)
  // The input whose values the elements the kernel does not store must hold (a scatter nest's
  // self, schedule_scatter.cpp): the executor runs the kernel on that input's own memory, or
  // fills the output from it first. -1: the kernel stores every element.
  int base = -1;
};

// A CUDA kernel's loop nest: its entries are <symbol>_n<index>_s32 / _s64 (scalar) and, when
// vector_width > 1, _v32 / _v64 (vectorized), each taking one parameter, the kernel's argument
// block (cuda_args below).
struct KernelNest {
  Shape shape;
  int64_t numel = 0;
  int64_t rows = 0;  // a nest with a row statistic: its number of rows (no vector variant); 0: none
  int rows_per_block = 1;   // a row nest's rows run by one block at once: 1, or a warp per row
  int block_threads = 256;  // threads per block (a row nest's block per row may have fewer)
  int vector_width = 0;     // elements per thread of the vectorized variant; 0: none
  // The order the nest walks its dims in, outermost first (Step::output_orders); empty:
  // row-major. Its vector variant's tensors must be dense in that order.
  std::vector<int> order;
  std::vector<int> vector_inputs;   // inputs it loads as vectors: contiguous and aligned
  std::vector<int> vector_outputs;  // outputs it stores as vectors (every output of the nest)
  // The entries of the broadcast tables each block fills before its loop (a pointwise nest's,
  // codegen cuda_tables): the grid is kept to blocks that each run enough elements to pay for it.
  int64_t table_entries = 0;
  // A row nest whose rows are split across blocks (too few rows to fill the device): the grid is
  // rows x split blocks, split chosen at launch (at most max_split, and the grid at most what
  // the device holds resident), launched cooperatively; the blocks of a row meet at a grid
  // barrier in each of the row's `grid_combines` statistics, through the kernel's workspace
  // (split_workspace_bytes). A column nest split across blocks is one too, its rows its tiles
  // and a block's partial results one per column of its tile (slots_per_block).
  bool split_rows = false;
  int grid_combines = 0;
  int64_t max_split = 1;
  int64_t slots_per_block = 1;
};

// The workspace a split nest of `blocks` blocks needs: the grid barrier's two counters (64
// bytes, zeroed before the launch), then 8 bytes per partial result: slots_per_block of them per
// block and combine.
inline int64_t split_workspace_bytes(const KernelNest& nest, int64_t blocks) {
  return 64 + 8 * int64_t{nest.grid_combines} * blocks * nest.slots_per_block;
}

// An input a kernel uses as an index (index_select, gather, index_copy, index_add, scatter): the
// executor checks its values are in [0, size) before the kernel runs, so a kernel never reads or
// writes out of bounds and an error leaves every tensor untouched. `op` names the op and the
// user's line.
struct IndexCheck {
  int input = 0;
  int64_t size = 0;
  int64_t dim = 0;
  std::string op;
  bool negative = false;  // values in [-size, size) (a wrap_index of the input), else [0, size)
  // The index is a view of the input: the elements to check, as positions in the input's
  // row-major order (a slice of it, an expand of it, ...). None: all of the input.
  std::optional<Geometry> view;
  // Trace inputs whose elements include every value of the index (analysis/integer_range.h's
  // drawn_from), when the index is computed from them: checking all of their elements before
  // the program runs suffices (a CUDA graph's replay does; where that check fails the program
  // runs without the graph and this check decides). Empty: none known.
  std::vector<DrawnInput> drawn_from;
  // Values the check lets pass as never selected (a check of a whole drawn input: its
  // DrawnInput::never_selected).
  std::vector<int64_t> never_selected = {};
};

struct Kernel {
  Target target = Target::kCpu;
  std::vector<IndexCheck> index_checks;
  // The function(s), named by the macro KILN_KERNEL_NAME (the module source defines it).
  std::string source;
  std::vector<KernelInput> inputs;    // one per step input
  std::vector<KernelOutput> outputs;  // one per step output
  int64_t in_meta_size = 0;
  int64_t out_meta_size = 0;      // the outputs' layouts, then `extents`
  std::vector<KernelNest> nests;  // CUDA: in launch order
  // Sizes the kernel reads at run time (e0, e1, ... in its source), not as text: the outermost
  // extent of its nests, and the counts made of it (a flat loop's elements, a team's work). A
  // kernel's source keys the kernel caches, so one source, compiled once, serves a region at
  // every row count its schedules treat alike (a size class):
  //   nest over [e0, 256]: for (i0 = 0; i0 < e0; ++i0) ...   (e0 = 48, 56, 4096, ...)
  // The executor passes them in out_meta after the outputs' layouts, from `extents_meta` on.
  std::vector<int64_t> extents;
  int64_t extents_meta = 0;
};

// A CUDA kernel's argument block, in 8-byte words: ins[ni], outs[no], in_meta[mi], out_meta[mo],
// sd[ni], si[ni] (each array at least one word long), ws (the workspace of split row nests, or
// null), passed by value as the entries' parameter.
struct CudaArgsLayout {
  int64_t ins = 0, outs = 0, in_meta = 0, out_meta = 0, sd = 0, si = 0, ws = 0;  // word offsets
  int64_t words = 0;
};
CudaArgsLayout cuda_args_layout(const Kernel& kernel);

struct KernelLowering {
  std::optional<Kernel> kernel;
  std::string why_not;  // when there is no kernel: the op and the reason
};

KernelLowering lower_kernel(const Step& step, Target target);

// A multi-tensor kernel (schedule_multi_tensor.cpp): the computation of one step of a
// MultiTensorGroup (plan.h), run over all of the group's steps ("members") in one call, each
// member's tensors dense (contiguous, any storage offset) and of the member's own size, or 0-d
// (an input every element reads: input_is_scalar).
//
// CPU: a CpuKernelFn whose arrays hold every member's arguments, member after member: ins[m * NI +
// i] the address of member m's input i's first element (null for a number), sd / si[m * NI + i]
// a number input, outs[m * NO + j] the address of its output j's first element; in_meta[0] the
// number of members, in_meta[1 + m] member m's elements. out_meta is not read.
//
// CUDA: one entry, <symbol>_mt, over at most `members_per_launch` members (its argument block,
// multi_tensor_args_layout, is passed by value and stays within 4 KB); a launch has one block per
// `block_elements` elements of each member, block b finding its member among first_block.
struct MultiTensorKernel {
  Target target = Target::kCpu;
  std::string source;                  // named by KILN_KERNEL_NAME, as a Kernel's
  std::vector<bool> input_is_tensor;   // per member input
  std::vector<bool> input_is_scalar;   // a 0-d tensor: every element reads its one element
  std::vector<DType> input_dtypes;     // per member input (a number's: unused)
  std::vector<DType> output_dtypes;    // per member output
  std::vector<bool> output_is_scalar;  // a 0-d result: stored once, by the member's first element
  int64_t members_per_launch = 0;      // CUDA
  int64_t block_elements = 0;          // CUDA
};

// A CUDA multi-tensor kernel's argument block, in 8-byte words: ins[K * NI], outs[K * NO],
// sd[K * NI], si[K * NI] (one word each when the members have no number inputs), numel[K],
// first_block[K + 1], members, for K = members_per_launch.
struct MultiTensorArgsLayout {
  int64_t ins = 0, outs = 0, sd = 0, si = 0, numel = 0, first_block = 0, members = 0;
  int64_t words = 0;
};
MultiTensorArgsLayout multi_tensor_args_layout(const MultiTensorKernel& kernel);

// A member's elements: its results' of rank 1 or more, 1 where every result is 0-d (each output
// buffer one per member output, in kernel order).
template <class Buffers>
int64_t multi_tensor_member_numel(const MultiTensorKernel& kernel, const Buffers& outputs) {
  for (size_t j = 0; j < kernel.output_is_scalar.size(); ++j)
    if (!kernel.output_is_scalar[j]) return outputs[j]->numel();
  return 1;
}

struct MultiTensorLowering {
  std::optional<MultiTensorKernel> kernel;
  std::string why_not;
};

// The CPU runs a group as one kernel only from this many elements in all, where the kernel shares
// them among the cores (kParallelIterations); below, each step's own kernel, serial either way,
// is a little faster (its sizes compiled in). On this project's 2-core VM (2026-12-05, bench.py's
// SGD over 50 parameters / AdamW over 10, float32, us a call, the group's kernel against step by
// step): just under 2^16 elements in all 51.6 / 45.0 against 49.1 / 43.9; 2^18 67.1 / 78.1
// against 74.6 / 111.0; just under 2^20 130.4 / 272.1 against 150.6 / 330.5; 2^22 529.5 / 1090.5
// against 521.7 / 1094.2. (On CUDA a launch costs microseconds of its own: a group is always one
// kernel.)
constexpr int64_t kCpuMultiTensorElements = int64_t{1} << 16;

// The kernel for the group whose first step is `member` (any of its steps gives the same source).
MultiTensorLowering lower_multi_tensor(const Step& member, Target target);

// One translation unit with several kernels: the target's prelude, then each kernel's source
// under its own symbol name.
std::string module_source(Target target,
                          const std::vector<std::pair<std::string, const std::string*>>& kernels);

// The embedded preludes (generated at build time from the headers by embed_prelude.cmake):
// cpu_prelude.h and the kiln headers it names; cuda_prelude.h, then elementwise_params.h and
// scalar_math.h without their standard includes.
const char* cpu_kernel_prelude();
const char* cuda_kernel_prelude();

}  // namespace kiln::codegen
