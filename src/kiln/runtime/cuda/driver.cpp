#include "kiln/runtime/cuda/driver.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "kiln/runtime/cuda/dynamic_library.h"
#include "kiln/support/call_profile.h"
#include "kiln/support/error.h"

namespace kiln::cuda {

namespace {

// The slice of cuda.h kiln uses; the _v2 names are the ones cuda.h maps the plain names to.
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUevent = void*;
constexpr int kAttributeMultiprocessors = 16;  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
constexpr int kAttributeCapabilityMajor = 75;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kAttributeCapabilityMinor = 76;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
constexpr CUresult kErrorNoDevice = 100;       // CUDA_ERROR_NO_DEVICE

// CUDA_KERNEL_NODE_PARAMS_v2, CUDA_MEMCPY3D_v2 and CUDA_MEMSET_NODE_PARAMS, as cuda.h lays them.
struct KernelNodeParams {
  Function func;
  unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes;
  void** kernel_params;
  void** extra;
  void* kern;
  void* ctx;
};
struct Memcpy3D {
  size_t src_x, src_y, src_z, src_lod;
  int src_type;
  const void* src_host;
  DevicePtr src_device;
  void* src_array;
  void* reserved0;
  size_t src_pitch, src_height;
  size_t dst_x, dst_y, dst_z, dst_lod;
  int dst_type;
  void* dst_host;
  DevicePtr dst_device;
  void* dst_array;
  void* reserved1;
  size_t dst_pitch, dst_height;
  size_t width, height, depth;
};
struct MemsetParams {
  DevicePtr dst;
  size_t pitch;
  unsigned value, element_size;
  size_t width, height;
};
constexpr int kNodeKernel = 0, kNodeMemcpy = 1, kNodeMemset = 2, kNodeEmpty = 5, kNodeWaitEvent = 6,
              kNodeRecordEvent = 7, kNodeMemAlloc = 10,
              kNodeMemFree = 11;                      // CUgraphNodeType
constexpr int kMemoryDevice = 2, kMemoryUnified = 4;  // CUmemorytype

struct Driver {
  void* handle = nullptr;
  std::string why_not;
  CUresult (*Init)(unsigned) = nullptr;
  CUresult (*GetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*GetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*DeviceGetCount)(int*) = nullptr;
  CUresult (*DeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*DeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*DeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*CtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*CtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*CtxSynchronize)() = nullptr;
  CUresult (*MemAlloc)(DevicePtr*, size_t) = nullptr;
  CUresult (*MemFree)(DevicePtr) = nullptr;
  CUresult (*MemcpyHtoD)(DevicePtr, const void*, size_t) = nullptr;
  CUresult (*MemcpyDtoH)(void*, DevicePtr, size_t) = nullptr;
  CUresult (*MemcpyDtoDAsync)(DevicePtr, DevicePtr, size_t, Stream) = nullptr;
  CUresult (*MemsetD8Async)(DevicePtr, unsigned char, size_t, Stream) = nullptr;
  CUresult (*MemsetD2D8Async)(DevicePtr, size_t, unsigned char, size_t, size_t, Stream) = nullptr;
  CUresult (*ModuleLoadData)(Module*, const void*) = nullptr;
  CUresult (*ModuleGetFunction)(Function*, Module, const char*) = nullptr;
  CUresult (*LaunchKernel)(Function, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, Stream, void**, void**) = nullptr;
  CUresult (*LaunchCooperativeKernel)(Function, unsigned, unsigned, unsigned, unsigned, unsigned,
                                      unsigned, unsigned, Stream, void**) = nullptr;
  CUresult (*OccupancyMaxActiveBlocksPerMultiprocessor)(int*, Function, int, size_t) = nullptr;
  CUresult (*EventCreate)(CUevent*, unsigned) = nullptr;
  CUresult (*EventRecord)(CUevent, Stream) = nullptr;
  CUresult (*EventSynchronize)(CUevent) = nullptr;
  CUresult (*EventElapsedTime)(float*, CUevent, CUevent) = nullptr;
  CUresult (*EventDestroy)(CUevent) = nullptr;
  CUresult (*StreamCreate)(Stream*, unsigned) = nullptr;
  CUresult (*StreamWaitEvent)(Stream, CUevent, unsigned) = nullptr;
  CUresult (*StreamBeginCapture)(Stream, int) = nullptr;
  CUresult (*StreamEndCapture)(Stream, Graph*) = nullptr;
  CUresult (*GraphInstantiate)(GraphExec*, Graph, unsigned long long) = nullptr;
  CUresult (*GraphLaunch)(GraphExec, Stream) = nullptr;
  CUresult (*GraphExecDestroy)(GraphExec) = nullptr;
  CUresult (*GraphDestroy)(Graph) = nullptr;
  // Reading a captured graph back and rebinding its launches (graph_contents); null where the
  // driver lacks them (cuFuncGetParamInfo came with CUDA 12.4), and then nothing is rebound.
  CUresult (*GraphGetNodes)(Graph, void**, size_t*) = nullptr;
  CUresult (*GraphNodeGetType)(void*, int*) = nullptr;
  CUresult (*GraphKernelNodeGetParams)(void*, KernelNodeParams*) = nullptr;
  CUresult (*GraphExecKernelNodeSetParams)(GraphExec, void*, const KernelNodeParams*) = nullptr;
  CUresult (*GraphMemcpyNodeGetParams)(void*, Memcpy3D*) = nullptr;
  CUresult (*GraphMemsetNodeGetParams)(void*, MemsetParams*) = nullptr;
  CUresult (*FuncGetParamInfo)(Function, size_t, size_t*, size_t*) = nullptr;
  CUresult (*KernelGetFunction)(Function*, void*) = nullptr;
};

std::string error_text(const Driver& d, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.GetErrorName) d.GetErrorName(r, &name);
  if (d.GetErrorString) d.GetErrorString(r, &text);
  return std::string(name ? name : "CUDA error " + std::to_string(r)) + (text ? ": " : "") +
         (text ? text : "");
}

const Driver& driver() {
  static const Driver lib = [] {
    Driver d;
    d.handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!d.handle) {
      d.why_not = "the CUDA driver (libcuda.so.1) is not installed on this machine";
      return d;
    }
    bool ok = bind_symbol(d.handle, "cuInit", &d.Init) &&
              bind_symbol(d.handle, "cuGetErrorName", &d.GetErrorName) &&
              bind_symbol(d.handle, "cuGetErrorString", &d.GetErrorString) &&
              bind_symbol(d.handle, "cuDeviceGetCount", &d.DeviceGetCount) &&
              bind_symbol(d.handle, "cuDeviceGet", &d.DeviceGet) &&
              bind_symbol(d.handle, "cuDeviceGetAttribute", &d.DeviceGetAttribute) &&
              bind_symbol(d.handle, "cuDeviceGetName", &d.DeviceGetName) &&
              bind_symbol(d.handle, "cuDevicePrimaryCtxRetain", &d.DevicePrimaryCtxRetain) &&
              bind_symbol(d.handle, "cuCtxSetCurrent", &d.CtxSetCurrent) &&
              bind_symbol(d.handle, "cuCtxGetCurrent", &d.CtxGetCurrent) &&
              bind_symbol(d.handle, "cuCtxSynchronize", &d.CtxSynchronize) &&
              bind_symbol(d.handle, "cuMemAlloc_v2", &d.MemAlloc) &&
              bind_symbol(d.handle, "cuMemFree_v2", &d.MemFree) &&
              bind_symbol(d.handle, "cuMemcpyHtoD_v2", &d.MemcpyHtoD) &&
              bind_symbol(d.handle, "cuMemcpyDtoH_v2", &d.MemcpyDtoH) &&
              bind_symbol(d.handle, "cuMemcpyDtoDAsync_v2", &d.MemcpyDtoDAsync) &&
              bind_symbol(d.handle, "cuMemsetD8Async", &d.MemsetD8Async) &&
              bind_symbol(d.handle, "cuMemsetD2D8Async", &d.MemsetD2D8Async) &&
              bind_symbol(d.handle, "cuModuleLoadData", &d.ModuleLoadData) &&
              bind_symbol(d.handle, "cuModuleGetFunction", &d.ModuleGetFunction) &&
              bind_symbol(d.handle, "cuLaunchKernel", &d.LaunchKernel) &&
              bind_symbol(d.handle, "cuLaunchCooperativeKernel", &d.LaunchCooperativeKernel) &&
              bind_symbol(d.handle, "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                          &d.OccupancyMaxActiveBlocksPerMultiprocessor) &&
              bind_symbol(d.handle, "cuEventCreate", &d.EventCreate) &&
              bind_symbol(d.handle, "cuEventRecord", &d.EventRecord) &&
              bind_symbol(d.handle, "cuEventSynchronize", &d.EventSynchronize) &&
              bind_symbol(d.handle, "cuEventElapsedTime", &d.EventElapsedTime) &&
              bind_symbol(d.handle, "cuEventDestroy_v2", &d.EventDestroy) &&
              bind_symbol(d.handle, "cuStreamCreate", &d.StreamCreate) &&
              bind_symbol(d.handle, "cuStreamWaitEvent", &d.StreamWaitEvent) &&
              bind_symbol(d.handle, "cuStreamBeginCapture_v2", &d.StreamBeginCapture) &&
              bind_symbol(d.handle, "cuStreamEndCapture", &d.StreamEndCapture) &&
              bind_symbol(d.handle, "cuGraphInstantiateWithFlags", &d.GraphInstantiate) &&
              bind_symbol(d.handle, "cuGraphLaunch", &d.GraphLaunch) &&
              bind_symbol(d.handle, "cuGraphExecDestroy", &d.GraphExecDestroy) &&
              bind_symbol(d.handle, "cuGraphDestroy", &d.GraphDestroy);
    bool readable =
        bind_symbol(d.handle, "cuGraphGetNodes", &d.GraphGetNodes) &&
        bind_symbol(d.handle, "cuGraphNodeGetType", &d.GraphNodeGetType) &&
        bind_symbol(d.handle, "cuGraphKernelNodeGetParams_v2", &d.GraphKernelNodeGetParams) &&
        bind_symbol(d.handle, "cuGraphExecKernelNodeSetParams_v2",
                    &d.GraphExecKernelNodeSetParams) &&
        bind_symbol(d.handle, "cuGraphMemcpyNodeGetParams", &d.GraphMemcpyNodeGetParams) &&
        bind_symbol(d.handle, "cuGraphMemsetNodeGetParams", &d.GraphMemsetNodeGetParams) &&
        bind_symbol(d.handle, "cuFuncGetParamInfo", &d.FuncGetParamInfo) &&
        bind_symbol(d.handle, "cuKernelGetFunction", &d.KernelGetFunction);
    if (!readable) d.GraphGetNodes = nullptr;
    if (!ok) {
      d.why_not = "the CUDA driver on this machine lacks functions kiln needs (too old)";
      d.handle = nullptr;
      return d;
    }
    CUresult r = d.Init(0);
    if (r != 0) {
      d.why_not = r == kErrorNoDevice
                      ? "there is no CUDA device on this machine"
                      : "the CUDA driver did not start (cuInit: " + error_text(d, r) + ")";
      d.handle = nullptr;
      return d;
    }
    int count = 0;
    if (d.DeviceGetCount(&count) != 0 || count == 0) {
      d.why_not = "there is no CUDA device on this machine";
      d.handle = nullptr;
    }
    return d;
  }();
  return lib;
}

const Driver& loaded() {
  const Driver& d = driver();
  KILN_CHECK(d.handle) << "CUDA tensors need a CUDA device, but " << d.why_not
                       << "; run on the CPU (device=\"cpu\") instead.";
  return d;
}

// Every driver call goes through here: a failure is an internal error naming the call.
void check(CUresult r, const char* call) {
  if (r == 0) return;
  KILN_ASSERT(false) << call << " failed: " << error_text(driver(), r);
}

// Set while this thread captures a CUDA graph (CaptureScope): nothing runs then, so a host read
// would see memory the captured work has not written, and kiln's own memory would be freed
// under the graph.
thread_local bool capturing = false;

void refuse_while_capturing(const char* what) {
  if (capturing)
    throw CaptureRefused(std::string(what) + " while a CUDA graph is captured (it needs the host)");
}

struct Contexts {
  std::mutex mutex;
  std::map<int, CUcontext> by_device;
  std::map<int, DeviceInfo> info;
};
Contexts& contexts() {
  static Contexts c;
  return c;
}

}  // namespace

bool cuda_available(std::string* why) {
  const Driver& d = driver();
  if (!d.handle && why) *why = d.why_not;
  return d.handle != nullptr;
}

int device_count() {
  const Driver& d = driver();
  if (!d.handle) return 0;
  int count = 0;
  check(d.DeviceGetCount(&count), "cuDeviceGetCount");
  return count;
}

void use_device(int index) {
  const Driver& d = loaded();
  Contexts& c = contexts();
  CUcontext ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.by_device.find(index);
    if (it == c.by_device.end()) {
      KILN_CHECK(index >= 0 && index < device_count())
          << "there is no CUDA device " << index << " (this machine has " << device_count() << ").";
      CUdevice dev = 0;
      check(d.DeviceGet(&dev, index), "cuDeviceGet");
      check(d.DevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
      c.by_device[index] = ctx;
    } else {
      ctx = it->second;
    }
  }
  // Every call of a kernel comes here: reading the thread's current context is cheaper than
  // setting it (PyTorch makes the same primary context current, so it usually is already).
  CUcontext current = nullptr;
  check(d.CtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current != ctx) check(d.CtxSetCurrent(ctx), "cuCtxSetCurrent");
}

const DeviceInfo& device_info(int index) {
  const Driver& d = loaded();
  use_device(index);
  Contexts& c = contexts();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.info.find(index);
  if (it != c.info.end()) return it->second;
  CUdevice dev = 0;
  check(d.DeviceGet(&dev, index), "cuDeviceGet");
  int major = 0, minor = 0, sms = 0;
  check(d.DeviceGetAttribute(&major, kAttributeCapabilityMajor, dev), "cuDeviceGetAttribute");
  check(d.DeviceGetAttribute(&minor, kAttributeCapabilityMinor, dev), "cuDeviceGetAttribute");
  check(d.DeviceGetAttribute(&sms, kAttributeMultiprocessors, dev), "cuDeviceGetAttribute");
  char name[256] = {};
  check(d.DeviceGetName(name, sizeof name, dev), "cuDeviceGetName");
  DeviceInfo info{major * 10 + minor, sms, name};
  return c.info.emplace(index, info).first->second;
}

DeviceMemory::~DeviceMemory() {
  if (!ptr) return;
  const Driver& d = driver();
  if (!d.handle) return;
  use_device(device);
  d.MemFree(ptr);  // a failure here cannot be reported from a destructor
}

std::shared_ptr<DeviceMemory> allocate(int device, size_t bytes) {
  refuse_while_capturing("kiln's own device memory");
  return allocate_for_graph(device, bytes);
}

std::shared_ptr<DeviceMemory> allocate_for_graph(int device, size_t bytes) {
  const Driver& d = loaded();
  use_device(device);
  auto m = std::make_shared<DeviceMemory>();
  m->device = device;
  m->bytes = bytes;
  if (bytes > 0) check(d.MemAlloc(&m->ptr, bytes), "cuMemAlloc");
  return m;
}

void copy_to_device(DevicePtr dst, const void* src, size_t bytes, int device) {
  if (bytes == 0) return;
  refuse_while_capturing("a copy to the device");
  const Driver& d = loaded();
  use_device(device);
  check(d.MemcpyHtoD(dst, src, bytes), "cuMemcpyHtoD");
}

void copy_to_host(void* dst, DevicePtr src, size_t bytes, int device) {
  if (bytes == 0) return;
  refuse_while_capturing("a copy to the host");
  const Driver& d = loaded();
  use_device(device);
  check(d.MemcpyDtoH(dst, src, bytes), "cuMemcpyDtoH");
}

void copy_on_device(DevicePtr dst, DevicePtr src, size_t bytes, int device, Stream stream) {
  if (bytes == 0) return;
  const Driver& d = loaded();
  use_device(device);
  check(d.MemcpyDtoDAsync(dst, src, bytes, stream), "cuMemcpyDtoDAsync");
}

void fill_zero(DevicePtr dst, size_t bytes, int device, Stream stream) {
  if (bytes == 0) return;
  const Driver& d = loaded();
  use_device(device);
  check(d.MemsetD8Async(dst, 0, bytes, stream), "cuMemsetD8Async");
}

void fill_zero_2d(DevicePtr dst, size_t pitch, size_t width, size_t height, int device,
                  Stream stream) {
  if (width == 0 || height == 0) return;
  const Driver& d = loaded();
  use_device(device);
  check(d.MemsetD2D8Async(dst, pitch, 0, width, height, stream), "cuMemsetD2D8Async");
}

void synchronize(int device) {
  refuse_while_capturing("a synchronization");
  const Driver& d = loaded();
  use_device(device);
  check(d.CtxSynchronize(), "cuCtxSynchronize");
}

Module load_module(const std::string& cubin, int device) {
  const Driver& d = loaded();
  use_device(device);
  Module m = nullptr;
  check(d.ModuleLoadData(&m, cubin.data()), "cuModuleLoadData");
  return m;
}

Function get_function(Module module, const std::string& name) {
  const Driver& d = loaded();
  Function f = nullptr;
  check(d.ModuleGetFunction(&f, module, name.c_str()), "cuModuleGetFunction");
  return f;
}

void launch(Function f, unsigned grid, unsigned block, const void* param, size_t param_bytes,
            Stream stream) {
  const Driver& d = loaded();
  (void)param_bytes;  // the kernel's parameter type fixes the size
  void* params[] = {const_cast<void*>(param)};
  call_profile::Scope timed(call_profile::Phase::kLaunch);
  check(d.LaunchKernel(f, grid, 1, 1, block, 1, 1, 0, stream, params, nullptr), "cuLaunchKernel");
}

void launch_cooperative(Function f, unsigned grid, unsigned block, const void* param,
                        Stream stream) {
  const Driver& d = loaded();
  void* params[] = {const_cast<void*>(param)};
  call_profile::Scope timed(call_profile::Phase::kLaunch);
  CUresult r = d.LaunchCooperativeKernel(f, grid, 1, 1, block, 1, 1, 0, stream, params);
  // A capture the driver cannot take a cooperative launch into leaves the program without a
  // graph (graph_replay.h), not failed.
  if (r != 0 && capturing)
    throw CaptureRefused("a cooperative launch in a capture: " + error_text(d, r));
  check(r, "cuLaunchCooperativeKernel");
}

int resident_blocks(Function f, unsigned block, int device) {
  static std::mutex mutex;
  static std::map<Function, int> per_function;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = per_function.find(f);
  if (it != per_function.end()) return it->second;
  const Driver& d = loaded();
  use_device(device);
  int per_sm = 0;
  check(d.OccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, f, static_cast<int>(block), 0),
        "cuOccupancyMaxActiveBlocksPerMultiprocessor");
  return per_function[f] = per_sm * device_info(device).multiprocessors;
}

void launch_2d(Function f, unsigned grid_x, unsigned grid_y, unsigned block, const void* param,
               size_t param_bytes, Stream stream) {
  const Driver& d = loaded();
  (void)param_bytes;
  void* params[] = {const_cast<void*>(param)};
  call_profile::Scope timed(call_profile::Phase::kLaunch);
  check(d.LaunchKernel(f, grid_x, grid_y, 1, block, 1, 1, 0, stream, params, nullptr),
        "cuLaunchKernel");
}

// ---- CUDA graphs
// --------------------------------------------------------------------------

Stream capture_stream(int device) {
  static std::mutex mutex;
  static std::map<int, Stream> streams;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = streams.find(device);
  if (it != streams.end()) return it->second;
  const Driver& d = loaded();
  use_device(device);
  Stream s = nullptr;
  check(d.StreamCreate(&s, 0), "cuStreamCreate");  // 0: blocking (ordered with the legacy stream)
  return streams[device] = s;
}

CaptureScope::CaptureScope(Stream stream, int device) : stream_(stream), device_(device) {
  KILN_ASSERT(!capturing) << "a CUDA graph capture inside another";
  const Driver& d = loaded();
  use_device(device);
  constexpr int kRelaxed = 2;  // CU_STREAM_CAPTURE_MODE_RELAXED: allocation may call cudaMalloc
  check(d.StreamBeginCapture(stream, kRelaxed), "cuStreamBeginCapture");
  capturing = true;
}

CaptureScope::~CaptureScope() {
  if (!capturing) return;
  capturing = false;
  Graph g = nullptr;
  if (driver().StreamEndCapture(stream_, &g) == 0 && g) driver().GraphDestroy(g);
}

namespace {

std::mutex address_words_mutex;
std::map<Function, std::vector<int>>& address_words_of() {
  static std::map<Function, std::vector<int>> registered;
  return registered;
}

// A kernel node's parameters as 8-byte words: each parameter copied in at its offset, or the one
// buffer of a launch that passed them so (CU_LAUNCH_PARAM_BUFFER_POINTER). False where the
// driver does not say where they lie.
bool kernel_node_words(const Driver& d, const KernelNodeParams& p, std::vector<uint64_t>& words) {
  std::vector<unsigned char> bytes;
  if (p.kernel_params) {
    for (size_t i = 0;; ++i) {
      size_t offset = 0, size = 0;
      if (d.FuncGetParamInfo(p.func, i, &offset, &size) != 0) break;  // past the last parameter
      if (bytes.size() < offset + size) bytes.resize(offset + size, 0);
      std::memcpy(bytes.data() + offset, p.kernel_params[i], size);
    }
  } else if (p.extra) {
    constexpr uintptr_t kEnd = 0, kBufferPointer = 1, kBufferSize = 2;  // CU_LAUNCH_PARAM_*
    const void* buffer = nullptr;
    size_t size = 0;
    for (void** e = p.extra; reinterpret_cast<uintptr_t>(e[0]) != kEnd; e += 2) {
      if (reinterpret_cast<uintptr_t>(e[0]) == kBufferPointer)
        buffer = e[1];
      else if (reinterpret_cast<uintptr_t>(e[0]) == kBufferSize)
        size = *static_cast<size_t*>(e[1]);
      else
        return false;
    }
    if (!buffer && size) return false;
    bytes.assign(static_cast<const unsigned char*>(buffer),
                 static_cast<const unsigned char*>(buffer) + size);
  }
  words.assign((bytes.size() + 7) / 8, 0);
  std::memcpy(words.data(), bytes.data(), bytes.size());
  return true;
}

// The device span [first, end) one side of a copy touches: Depth layers of Height rows of
// WidthInBytes bytes, rows `pitch` bytes apart and layers `pitch * height`, from (x, y, z).
std::pair<DevicePtr, DevicePtr> copy_side(DevicePtr base, size_t x, size_t y, size_t z,
                                          size_t pitch, size_t height, const Memcpy3D& c) {
  const DevicePtr first = base + x + y * pitch + z * pitch * height;
  const size_t rows = std::max<size_t>(c.height, 1), layers = std::max<size_t>(c.depth, 1);
  return {first, first + (layers - 1) * pitch * height + (rows - 1) * pitch + c.width};
}

// Nodes that read and write no memory kiln holds. (An allocation node's memory is the graph's
// own, apart from every block kiln holds: a cuBLAS workspace allocated and freed in the capture.)
bool touches_no_memory(int node_type) {
  return node_type == kNodeEmpty || node_type == kNodeWaitEvent || node_type == kNodeRecordEvent ||
         node_type == kNodeMemAlloc || node_type == kNodeMemFree;
}

GraphContents graph_contents(const Driver& d, Graph g) {
  GraphContents contents;
  if (!d.GraphGetNodes) {
    contents.opaque = "the CUDA driver cannot read a graph's launches back (before CUDA 12.4)";
    return contents;
  }
  size_t count = 0;
  check(d.GraphGetNodes(g, nullptr, &count), "cuGraphGetNodes");
  std::vector<void*> nodes(count);
  check(d.GraphGetNodes(g, nodes.data(), &count), "cuGraphGetNodes");
  for (void* node : nodes) {
    int type = -1;
    check(d.GraphNodeGetType(node, &type), "cuGraphNodeGetType");
    if (type == kNodeKernel) {
      KernelNodeParams p{};
      check(d.GraphKernelNodeGetParams(node, &p), "cuGraphKernelNodeGetParams");
      // A library's kernel (CUkernel) launched in the context: its function there.
      if (!p.func && p.kern) check(d.KernelGetFunction(&p.func, p.kern), "cuKernelGetFunction");
      if (!p.func) {
        contents.opaque = "a kernel launch the driver does not name";
        continue;
      }
      GraphKernelNode k;
      k.node = node;
      k.function = p.func;
      k.grid[0] = p.grid_x, k.grid[1] = p.grid_y, k.grid[2] = p.grid_z;
      k.block[0] = p.block_x, k.block[1] = p.block_y, k.block[2] = p.block_z;
      k.shared_bytes = p.shared_bytes;
      if (!kernel_node_words(d, p, k.words)) {
        contents.opaque = "a kernel launch whose parameters the driver does not lay out";
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(address_words_mutex);
        auto it = address_words_of().find(p.func);
        if (it != address_words_of().end()) k.address_words = it->second;
      }
      contents.kernels.push_back(std::move(k));
    } else if (type == kNodeMemcpy) {
      Memcpy3D c{};
      check(d.GraphMemcpyNodeGetParams(node, &c), "cuGraphMemcpyNodeGetParams");
      if (c.src_type == kMemoryDevice || c.src_type == kMemoryUnified)
        contents.copied_spans.push_back(
            copy_side(c.src_device, c.src_x, c.src_y, c.src_z, c.src_pitch, c.src_height, c));
      if (c.dst_type == kMemoryDevice || c.dst_type == kMemoryUnified)
        contents.copied_spans.push_back(
            copy_side(c.dst_device, c.dst_x, c.dst_y, c.dst_z, c.dst_pitch, c.dst_height, c));
    } else if (type == kNodeMemset) {
      MemsetParams m{};
      check(d.GraphMemsetNodeGetParams(node, &m), "cuGraphMemsetNodeGetParams");
      contents.copied_spans.emplace_back(
          m.dst, m.dst + (std::max<size_t>(m.height, 1) - 1) * m.pitch + m.width * m.element_size);
    } else if (!touches_no_memory(type)) {
      contents.opaque = "a graph node of type " + std::to_string(type) + " (not a launch or copy)";
    }
  }
  return contents;
}

}  // namespace

void register_address_words(Function f, std::vector<int> words) {
  std::lock_guard<std::mutex> lock(address_words_mutex);
  address_words_of()[f] = std::move(words);
}

CapturedGraph CaptureScope::finish() {
  KILN_ASSERT(capturing) << "a CUDA graph capture finished twice";
  capturing = false;
  const Driver& d = loaded();
  use_device(device_);
  CapturedGraph captured;
  CUresult r = d.StreamEndCapture(stream_, &captured.graph);
  if (r != 0 || !captured.graph) throw CaptureRefused("the capture failed: " + error_text(d, r));
  r = d.GraphInstantiate(&captured.exec, captured.graph, 0);
  if (r != 0) {
    d.GraphDestroy(captured.graph);
    throw CaptureRefused("the graph did not instantiate: " + error_text(d, r));
  }
  try {
    captured.contents = graph_contents(d, captured.graph);
  } catch (...) {
    destroy_graph(captured);
    throw;
  }
  return captured;
}

void set_kernel_node_words(GraphExec exec, const GraphKernelNode& node,
                           const std::vector<uint64_t>& words) {
  const Driver& d = loaded();
  KILN_ASSERT(node.words.size() == words.size()) << "a graph launch rebound with other parameters";
  // One parameter block: kiln's kernels take their arguments as one.
  void* params[] = {const_cast<uint64_t*>(words.data())};
  KernelNodeParams p{node.function, node.grid[0],  node.grid[1],  node.grid[2],
                     node.block[0], node.block[1], node.block[2], node.shared_bytes,
                     params,        nullptr,       nullptr,       nullptr};
  check(d.GraphExecKernelNodeSetParams(exec, node.node, &p), "cuGraphExecKernelNodeSetParams");
}

void launch_graph(GraphExec exec, int device, Stream stream) {
  const Driver& d = loaded();
  use_device(device);
  call_profile::Scope timed(call_profile::Phase::kLaunch);
  check(d.GraphLaunch(exec, stream), "cuGraphLaunch");
}

void destroy_graph(CapturedGraph& g) {
  if (driver().handle) {
    if (g.exec) driver().GraphExecDestroy(g.exec);
    if (g.graph) driver().GraphDestroy(g.graph);
  }
  g.exec = nullptr;
  g.graph = nullptr;
}

StreamEvent::StreamEvent(int device) : device_(device) {
  const Driver& d = loaded();
  use_device(device);
  check(d.EventCreate(&event_, 0), "cuEventCreate");
}

StreamEvent::~StreamEvent() {
  if (event_ && driver().handle) driver().EventDestroy(event_);
}

void StreamEvent::record(Stream stream) {
  use_device(device_);
  check(loaded().EventRecord(event_, stream), "cuEventRecord");
}

void StreamEvent::make_wait(Stream stream) {
  use_device(device_);
  check(loaded().StreamWaitEvent(stream, event_, 0), "cuStreamWaitEvent");
}

void StreamEvent::synchronize() {
  use_device(device_);
  check(loaded().EventSynchronize(event_), "cuEventSynchronize");
}

EventTimer::EventTimer(int device) : device_(device) {
  const Driver& d = loaded();
  use_device(device);
  check(d.EventCreate(&begin_, 0), "cuEventCreate");
  check(d.EventCreate(&end_, 0), "cuEventCreate");
}

EventTimer::~EventTimer() {
  const Driver& d = driver();
  if (!d.handle) return;
  d.EventDestroy(begin_);
  d.EventDestroy(end_);
}

void EventTimer::start(Stream stream) {
  use_device(device_);
  check(loaded().EventRecord(begin_, stream), "cuEventRecord");
}

float EventTimer::stop_ms(Stream stream) {
  const Driver& d = loaded();
  use_device(device_);
  check(d.EventRecord(end_, stream), "cuEventRecord");
  check(d.EventSynchronize(end_), "cuEventSynchronize");
  float ms = 0;
  check(d.EventElapsedTime(&ms, begin_, end_), "cuEventElapsedTime");
  return ms;
}

}  // namespace kiln::cuda
