// The CUDA driver API, loaded with dlopen (libcuda.so.1) so that kiln builds and runs on
// machines without a GPU or driver: CUDA tensors then raise a clear UserError while the CPU path
// keeps working. Every call's status is checked and a failure names the call.
//
// One context per device (the device's primary context, the one the CUDA runtime and PyTorch
// use), made current on the calling thread before each use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln::cuda {

using DevicePtr = uint64_t;  // CUdeviceptr
using Stream = void*;        // CUstream; nullptr is the legacy default stream
using Function = void*;      // CUfunction
using Module = void*;        // CUmodule
using Graph = void*;         // CUgraph
using GraphExec = void*;     // CUgraphExec

// Whether a CUDA device can be used; when not, `why` says why (no driver, no device, ...).
bool cuda_available(std::string* why = nullptr);
int device_count();

struct DeviceInfo {
  int compute_capability = 0;  // 90 for sm_90
  int multiprocessors = 0;
  std::string name;
};
// Raises a UserError naming the device when there is no usable CUDA device `index`.
const DeviceInfo& device_info(int index);

// Makes the device's primary context current on this thread.
void use_device(int index);

// Device memory, freed when the last owner lets go.
struct DeviceMemory {
  DevicePtr ptr = 0;
  size_t bytes = 0;
  int device = 0;
  ~DeviceMemory();
};
std::shared_ptr<DeviceMemory> allocate(int device, size_t bytes);
// The same, allowed while a graph is captured: for memory the graph keeps for its life.
std::shared_ptr<DeviceMemory> allocate_for_graph(int device, size_t bytes);

void copy_to_device(DevicePtr dst, const void* src, size_t bytes, int device);
void copy_to_host(void* dst, DevicePtr src, size_t bytes, int device);
void copy_on_device(DevicePtr dst, DevicePtr src, size_t bytes, int device, Stream stream);
void fill_zero(DevicePtr dst, size_t bytes, int device, Stream stream);
// Zeroes `height` rows of `width` bytes, `pitch` bytes apart, from `dst`.
void fill_zero_2d(DevicePtr dst, size_t pitch, size_t width, size_t height, int device,
                  Stream stream);
void synchronize(int device);

Module load_module(const std::string& cubin, int device);
Function get_function(Module module, const std::string& name);
// Launches with one parameter: the `param_bytes` bytes at `param` (an argument block).
void launch(Function f, unsigned grid, unsigned block, const void* param, size_t param_bytes,
            Stream stream);
// A cooperative launch (cuLaunchCooperativeKernel): every block of the grid is resident at once,
// or the launch fails, so the blocks may wait for each other (a split row nest's grid barrier).
void launch_cooperative(Function f, unsigned grid, unsigned block, const void* param,
                        Stream stream);
// The most blocks of `block` threads of `f` the device holds resident at once (its occupancy
// times its multiprocessors): the largest grid launch_cooperative takes.
int resident_blocks(Function f, unsigned block, int device);
// The same over a grid of grid_x x grid_y blocks.
void launch_2d(Function f, unsigned grid_x, unsigned grid_y, unsigned block, const void* param,
               size_t param_bytes, Stream stream);

// ---- CUDA graphs (graph_replay.h)

// A capture could not be made: something in it needs the host (a synchronization, a copy to or
// from the host, kiln's own memory, a step PyTorch runs), or the driver refused it. The program
// then runs without a graph; nothing was run.
struct CaptureRefused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The stream kiln captures on for a device (one, made on first use; blocking, so that any work
// queued on the legacy default stream during a capture fails it instead of escaping it).
Stream capture_stream(int device);

// The words (8 bytes each, from the start of its one parameter, the argument block) in which a
// kernel of kiln's receives device addresses. kiln's kernels register theirs when loaded, so that
// a graph replay may point a captured launch at other memory (graph_replay.h); a kernel without
// them (cuBLAS's, PyTorch's) is never pointed elsewhere.
void register_address_words(Function f, std::vector<int> words);

// A kernel launch of a captured graph, as the driver holds it.
struct GraphKernelNode {
  void* node = nullptr;  // CUgraphNode of the graph the executable graph was made from
  Function function = nullptr;
  unsigned grid[3] = {1, 1, 1}, block[3] = {1, 1, 1}, shared_bytes = 0;
  // Its parameters' bytes in 8-byte words (each parameter at its offset, the last padded).
  std::vector<uint64_t> words;
  std::vector<int> address_words;  // as registered; empty for a kernel kiln did not make
};

// What the nodes of a captured graph read and write, read back from the graph.
struct GraphContents {
  std::vector<GraphKernelNode> kernels;
  // The device memory copies and fills touch: [first, end) spans, each covering its node's.
  std::vector<std::pair<DevicePtr, DevicePtr>> copied_spans;
  // Not empty: a node whose memory kiln cannot tell (a host function, a child graph, ...), or a
  // driver too old to tell it; then no launch of the graph is pointed elsewhere.
  std::string opaque;
};

struct CapturedGraph {
  Graph graph = nullptr;  // kept: its nodes name the launches of exec
  GraphExec exec = nullptr;
  GraphContents contents;
};

// Captures the work queued on `stream` (relaxed mode) until finish(), which returns the
// instantiated graph. While a scope lives, this thread's synchronize, copy_to_host,
// copy_to_device and allocate raise CaptureRefused. A scope destroyed unfinished discards the
// capture.
class CaptureScope {
 public:
  CaptureScope(Stream stream, int device);
  ~CaptureScope();
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;
  CapturedGraph finish();

 private:
  Stream stream_;
  int device_;
};

// Later launches of `exec` run `node`'s kernel with the parameter words `words` (a launch queued
// before is not changed).
void set_kernel_node_words(GraphExec exec, const GraphKernelNode& node,
                           const std::vector<uint64_t>& words);
void launch_graph(GraphExec exec, int device, Stream stream);
void destroy_graph(CapturedGraph& g);

// An event that orders one stream's later work after another's (and lets the host wait).
class StreamEvent {
 public:
  explicit StreamEvent(int device);
  ~StreamEvent();
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;
  void record(Stream stream);
  void make_wait(Stream stream);  // `stream`'s later work waits for the recorded point
  void synchronize();

 private:
  int device_;
  void* event_ = nullptr;
};

// Device time between two points of a stream, for benchmarks.
class EventTimer {
 public:
  explicit EventTimer(int device);
  ~EventTimer();
  void start(Stream stream = nullptr);
  float stop_ms(Stream stream = nullptr);  // synchronizes

 private:
  int device_;
  void* begin_ = nullptr;
  void* end_ = nullptr;
};

}  // namespace kiln::cuda
