#include "kiln/runtime/cuda/cuda_kernels.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "kiln/analysis/geometry.h"
#include "kiln/runtime/cache_files.h"
#include "kiln/runtime/cuda/kernel_modules.h"
#include "kiln/runtime/cuda/nvrtc.h"
#include "kiln/runtime/interpreter/env.h"
#include "kiln/runtime/interpreter/layout.h"
#include "kiln/runtime/kernel_inputs.h"
#include "kiln/support/call_profile.h"
#include "kiln/support/dump.h"
#include "kiln/support/error.h"

namespace kiln::cuda {

namespace fs = std::filesystem;

namespace {

// ---- the module cache ---------------------------------------------------------------------------

struct ModuleCache {
  std::mutex mutex;
  std::map<std::string, Module> loaded;  // by "<device>:<key>"
  CudaCacheStats stats;
  std::string dir = default_cache_dir();
  bool dir_ok = false;
  ModuleCache() {
    if (dir.empty()) return;
    std::error_code ec;
    fs::create_directories(dir, ec);
    dir_ok = !ec;
  }
};
ModuleCache& module_cache() {
  static ModuleCache c;
  return c;
}

int compile_jobs() {
  const char* v = std::getenv("KILN_COMPILE_JOBS");
  int jobs = v && *v ? std::atoi(v) : static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, jobs);
}

}  // namespace

void get_modules(std::vector<ModuleRequest>& requests, int device) {
  ModuleCache& cache = module_cache();
  int arch = device_info(device).compute_capability;
  std::string identity =
      "nvrtc " + nvrtc_version() + " sm_" + std::to_string(arch) + " " + kNvrtcMathOption + "\n";
  std::vector<size_t> missing;
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    for (size_t i = 0; i < requests.size(); ++i) {
      ModuleRequest& r = requests[i];
      r.key = content_hash(identity + r.source);
      auto it = cache.loaded.find(std::to_string(device) + ":" + r.key);
      if (it != cache.loaded.end()) {
        r.module = it->second;
        ++cache.stats.memory_hits;
      } else {
        missing.push_back(i);
      }
    }
  }
  // From disk, or compiled; a cubin is verified before it is loaded.
  std::vector<std::string> cubins(requests.size());
  std::vector<size_t> to_compile;
  for (size_t i : missing) {
    if (cache.dir_ok) {
      fs::path path = fs::path(cache.dir) / ("cu-" + requests[i].key + ".cubin");
      if (std::optional<std::string> file = read_file(path)) {
        if (std::optional<std::string_view> payload = verified_payload(*file)) {
          cubins[i] = std::string(*payload);
          std::lock_guard<std::mutex> lock(cache.mutex);
          ++cache.stats.disk_hits;
          continue;
        }
        std::lock_guard<std::mutex> lock(cache.mutex);
        ++cache.stats.corrupt_files;
      }
    }
    to_compile.push_back(i);
  }
  std::atomic<size_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto worker = [&] {
    for (size_t k = next++; k < to_compile.size(); k = next++) {
      size_t i = to_compile[k];
      try {
        NvrtcOutput out = nvrtc_compile(requests[i].source, arch, "kiln_" + requests[i].key);
        cubins[i] = std::move(out.cubin);
        if (cache.dir_ok)
          write_atomically(fs::path(cache.dir) / ("cu-" + requests[i].key + ".cubin"),
                           cubins[i] + checksum_trailer(cubins[i]));
      } catch (...) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
      }
    }
  };
  int jobs = std::min<int>(compile_jobs(), static_cast<int>(to_compile.size()));
  std::vector<std::thread> threads;
  for (int t = 1; t < jobs; ++t)
    threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads)
    t.join();
  if (failure) std::rethrow_exception(failure);
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.stats.compiled += static_cast<int>(to_compile.size());
  for (size_t i : missing) {
    std::string slot = std::to_string(device) + ":" + requests[i].key;
    auto it = cache.loaded.find(slot);
    if (it == cache.loaded.end())
      it = cache.loaded.emplace(slot, load_module(cubins[i], device)).first;
    requests[i].module = it->second;
  }
}

namespace {

std::string symbol_for(const std::string& source) {
  return "kiln_cuda_" + content_hash(source).substr(0, 20);
}

}  // namespace

// One thread per unit of work (an element, or a vector of them), not a grid-stride loop over a
// grid of a few blocks per multiprocessor: measured on the H200 (bench/NOTES.md), S1 at 2^26 f32
// ran at 1.02x its byte floor with a thread per vector and 1.09x with 16 blocks per
// multiprocessor, and a plain copy kernel at 1.00x against 1.06x. The kernels keep their
// grid-stride loops, for a grid at the hardware's limit.
unsigned grid_for(int64_t work, [[maybe_unused]] int device) {
  int64_t blocks = (work + kBlock - 1) / kBlock;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, int64_t{0x7fffffff}));
}

namespace {

// A nest whose blocks each fill broadcast tables first (KernelNest::table_entries) runs
// kTableAmortization elements a block per table entry, in a grid-stride loop, where that leaves
// the device at least one full wave of resident blocks: a batch norm's per-channel scale over a
// channels-last [128, 2048, 7, 7] activation would otherwise be computed by each of its 6,272
// blocks, as often as once an element.
constexpr int64_t kTableAmortization = 8;

unsigned grid_paying_for_tables(const codegen::KernelNest& nest, unsigned grid, Function f,
                                int device) {
  const int64_t paying = (nest.numel + kTableAmortization * nest.table_entries - 1) /
                         (kTableAmortization * nest.table_entries);
  const int64_t wave = resident_blocks(f, static_cast<unsigned>(nest.block_threads), device);
  return static_cast<unsigned>(std::min<int64_t>(grid, std::max(paying, wave)));
}

void* host_data(const RtTensor& t) {
  return t.storage->numel() == 0 ? nullptr : t.storage->data();
}

// Whether `t` holds the nest's elements in order at unit stride (its shape may differ from the
// nest's by dims of 1: a per-row result [R] in a nest over [R, 1]).
bool contiguous_over(const RtTensor& t, const Shape& shape) {
  if (t.numel() != shape_numel(shape)) return false;
  Shape own, nest;
  std::copy_if(t.sizes.begin(), t.sizes.end(), std::back_inserter(own),
               [](int64_t n) { return n != 1; });
  std::copy_if(shape.begin(), shape.end(), std::back_inserter(nest),
               [](int64_t n) { return n != 1; });
  return own == nest && dense(t);
}

// Whether t is dense with its dims in memory in `order` (outermost first) and nest's shape: a
// vector variant of a nest walking that order reads and writes it at consecutive positions.
bool walked_densely(const RtTensor& t, const Shape& shape, const std::vector<int>& order) {
  if (order.empty()) return contiguous_over(t, shape);
  return t.sizes == shape && dense_in_order(t, order);
}

bool aligned(const RtTensor& t, int width) {
  int64_t bytes = dtype_size(t.dtype()) * width;
  uint64_t address =
      t.storage->device_data + static_cast<uint64_t>(t.offset * dtype_size(t.dtype()));
  return address % static_cast<uint64_t>(bytes) == 0;
}

}  // namespace

CudaCacheStats cuda_cache_stats() {
  ModuleCache& c = module_cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.stats;
}

CompiledModule compile_cuda_kernel(const codegen::Kernel& kernel, int arch) {
  return compile_cuda_source(kernel.source, arch);
}

CompiledModule compile_cuda_source(const std::string& kernel_source, int arch) {
  std::string symbol = symbol_for(kernel_source);
  std::string source = codegen::module_source(codegen::Target::kCuda, {{symbol, &kernel_source}});
  NvrtcOutput out = nvrtc_compile(source, arch, symbol);
  return CompiledModule{std::move(out.cubin), std::move(out.log)};
}

namespace {

// The words of a step kernel's argument block that hold storage addresses (graph replays may
// point them elsewhere): every input's and output's, and the workspace's.
std::vector<int> address_words(const codegen::Kernel& kernel) {
  const codegen::CudaArgsLayout layout = codegen::cuda_args_layout(kernel);
  std::vector<int> words;
  for (size_t i = 0; i < kernel.inputs.size(); ++i)
    words.push_back(static_cast<int>(layout.ins + static_cast<int64_t>(i)));
  for (size_t j = 0; j < kernel.outputs.size(); ++j)
    words.push_back(static_cast<int>(layout.outs + static_cast<int64_t>(j)));
  words.push_back(static_cast<int>(layout.ws));
  return words;
}

}  // namespace

CudaPlanKernels prepare_cuda_kernels(const ExecutionPlan& plan, int device) {
  CudaPlanKernels pk;
  pk.steps.resize(plan.steps.size());
  pk.why_not.resize(plan.steps.size());
  std::vector<size_t> at;
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const Step& step = plan.steps[s];
    if (step.kind != Step::Kind::kFusion) continue;
    codegen::KernelLowering lowered = codegen::lower_kernel(step, codegen::Target::kCuda);
    if (!lowered.kernel) {
      pk.why_not[s] = lowered.why_not;
      dump("kernels", "step" + std::to_string(s) + "-not-lowered.txt", lowered.why_not + "\n");
      continue;
    }
    // Named by its symbol too, so that a profiler's kernel name finds its source.
    dump("kernels", "step" + std::to_string(s) + "-" + symbol_for(lowered.kernel->source) + ".cu",
         lowered.kernel->source);
    pk.steps[s] = CudaStepKernel{std::move(*lowered.kernel), {}, device};
    at.push_back(s);
  }
  // The groups whose steps all have kernels (a step's own is the fallback).
  pk.groups.resize(plan.multi_tensor_groups.size());
  std::vector<size_t> groups_at;
  for (size_t g = 0; g < plan.multi_tensor_groups.size(); ++g) {
    const MultiTensorGroup& group = plan.multi_tensor_groups[g];
    bool all = true;
    for (size_t s = group.first; s < group.first + group.count; ++s)
      all = all && pk.steps[s].has_value();
    if (!all) continue;
    codegen::MultiTensorLowering lowered =
        codegen::lower_multi_tensor(plan.steps[group.first], codegen::Target::kCuda);
    if (!lowered.kernel) {
      dump("kernels", "group" + std::to_string(g) + "-not-lowered.txt", lowered.why_not + "\n");
      continue;
    }
    pk.groups[g] = CudaMultiTensorKernel{std::move(*lowered.kernel), nullptr, device};
    groups_at.push_back(g);
  }
  if (at.empty() && groups_at.empty()) return pk;
  std::vector<ModuleRequest> requests(at.size() + groups_at.size());
  std::vector<std::string> symbols(requests.size());
  for (size_t i = 0; i < at.size(); ++i) {
    const codegen::Kernel& k = pk.steps[at[i]]->kernel;
    symbols[i] = symbol_for(k.source);
    requests[i].source = codegen::module_source(codegen::Target::kCuda, {{symbols[i], &k.source}});
  }
  for (size_t i = 0; i < groups_at.size(); ++i) {
    const std::string& source = pk.groups[groups_at[i]]->kernel.source;
    const size_t r = at.size() + i;
    symbols[r] = symbol_for(source);
    dump("kernels", "group" + std::to_string(groups_at[i]) + "-" + symbols[r] + ".cu", source);
    requests[r].source = codegen::module_source(codegen::Target::kCuda, {{symbols[r], &source}});
  }
  get_modules(requests, device);
  for (size_t i = 0; i < at.size(); ++i) {
    CudaStepKernel& k = *pk.steps[at[i]];
    for (size_t n = 0; n < k.kernel.nests.size(); ++n) {
      std::string base = symbols[i] + "_n" + std::to_string(n) + "_";
      NestEntries e;
      e.scalar32 = get_function(requests[i].module, base + "s32");
      e.scalar64 = get_function(requests[i].module, base + "s64");
      if (k.kernel.nests[n].vector_width > 1) {
        e.vector32 = get_function(requests[i].module, base + "v32");
        e.vector64 = get_function(requests[i].module, base + "v64");
      }
      k.nests.push_back(e);
      for (Function f : {e.scalar32, e.scalar64, e.vector32, e.vector64})
        if (f) register_address_words(f, address_words(k.kernel));
    }
  }
  for (size_t i = 0; i < groups_at.size(); ++i) {
    const size_t r = at.size() + i;
    pk.groups[groups_at[i]]->entry = get_function(requests[r].module, symbols[r] + "_mt");
  }
  return pk;
}

bool run_cuda_kernel(const CudaStepKernel& k, const std::vector<RtValue>& inputs,
                     const std::vector<TensorHandle>& outputs, Stream stream,
                     Allocator* allocator) {
  call_profile::Scope timed(call_profile::Phase::kKernel);
  const codegen::Kernel& kernel = k.kernel;
  KILN_ASSERT(inputs.size() == kernel.inputs.size() && outputs.size() == kernel.outputs.size())
      << "a CUDA kernel called with " << inputs.size() << " inputs and " << outputs.size()
      << " outputs";
  codegen::CudaArgsLayout layout = codegen::cuda_args_layout(kernel);
  std::vector<uint64_t> words(static_cast<size_t>(layout.words), 0);
  auto word = [&](int64_t at) -> uint64_t& { return words[static_cast<size_t>(at)]; };
  int64_t in_meta = 0, out_meta = 0;
  bool fits_32 = true;
  auto note_storage = [&](const RtTensor& t) {
    if (t.storage->numel() >= (int64_t{1} << 31) - 1) fits_32 = false;
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (kernel.inputs[i].is_tensor) {
      const RtTensor& t = *std::get<TensorHandle>(inputs[i]);
      KILN_ASSERT(t.storage->on_device()) << "a CUDA kernel input is not on the device";
      if (!kernel_can_read(kernel.inputs[i], t)) return false;
      note_storage(t);
      word(layout.ins + static_cast<int64_t>(i)) = t.storage->device_data;
      word(layout.in_meta + in_meta++) = static_cast<uint64_t>(t.offset);
      for (int64_t st : t.strides)
        word(layout.in_meta + in_meta++) = static_cast<uint64_t>(st);
    } else {
      const RtScalar& s = std::get<RtScalar>(inputs[i]);
      double d = scalar_to_double(s);
      int64_t v = scalar_to_int(s);
      std::memcpy(&word(layout.sd + static_cast<int64_t>(i)), &d, 8);
      word(layout.si + static_cast<int64_t>(i)) = static_cast<uint64_t>(v);
    }
  }
  for (size_t j = 0; j < outputs.size(); ++j) {
    const RtTensor& t = *outputs[j];
    KILN_ASSERT(t.storage->on_device() && t.dtype() == kernel.outputs[j].dtype &&
                t.sizes == kernel.outputs[j].shape)
        << "a CUDA kernel output buffer of the wrong type";
    note_storage(t);
    word(layout.outs + static_cast<int64_t>(j)) = t.storage->device_data;
    word(layout.out_meta + out_meta++) = static_cast<uint64_t>(t.offset);
    for (int64_t st : t.strides)
      word(layout.out_meta + out_meta++) = static_cast<uint64_t>(st);
  }
  KILN_ASSERT(out_meta == kernel.extents_meta) << "kernel output layout";
  for (int64_t extent : kernel.extents)
    word(layout.out_meta + out_meta++) = static_cast<uint64_t>(extent);
  use_device(k.device);
  // Split row nests: their grids (rows x split, within what the device holds resident) and one
  // zeroed workspace the nests share (each leaves its barrier's count at 0). A device too small
  // to hold a row's blocks at once runs the step without the kernel.
  std::vector<unsigned> split_grid(kernel.nests.size(), 0);
  int64_t workspace = 0;
  for (size_t n = 0; n < kernel.nests.size(); ++n) {
    const codegen::KernelNest& nest = kernel.nests[n];
    if (!nest.split_rows || nest.numel == 0) continue;
    const int resident =
        std::min(resident_blocks(k.nests[n].scalar32, nest.block_threads, k.device),
                 resident_blocks(k.nests[n].scalar64, nest.block_threads, k.device));
    const int64_t split = std::min<int64_t>(resident / nest.rows, nest.max_split);
    if (split < 1) return false;
    split_grid[n] = static_cast<unsigned>(nest.rows * split);
    workspace = std::max(workspace, codegen::split_workspace_bytes(nest, split_grid[n]));
  }
  TensorHandle workspace_memory;
  if (workspace > 0) {
    workspace_memory =
        cuda_strided(DType::kInt64, {(workspace + 7) / 8}, {1}, 0, (workspace + 7) / 8,
                     Device::cuda(k.device), /*zero=*/true, allocator, stream);
    word(layout.ws) = workspace_memory->storage->device_data;
  }
  for (size_t n = 0; n < kernel.nests.size(); ++n) {
    const codegen::KernelNest& nest = kernel.nests[n];
    if (nest.numel == 0) continue;
    if (nest.split_rows) {
      const unsigned grid = split_grid[n];
      // (each thread's positions step by split x threads x up to 8 lanes)
      bool narrow =
          fits_32 && nest.numel + int64_t{grid} * nest.block_threads * 8 < (int64_t{1} << 31) - 1;
      launch_cooperative(narrow ? k.nests[n].scalar32 : k.nests[n].scalar64, grid,
                         static_cast<unsigned>(nest.block_threads), words.data(), stream);
      continue;
    }
    bool vector = k.nests[n].vector32 != nullptr;
    for (int i : nest.vector_inputs) {
      const RtTensor& t = *std::get<TensorHandle>(inputs[static_cast<size_t>(i)]);
      vector = vector && walked_densely(t, nest.shape, nest.order) && aligned(t, nest.vector_width);
    }
    for (int j : nest.vector_outputs) {
      const RtTensor& t = *outputs[static_cast<size_t>(j)];
      vector = vector && walked_densely(t, nest.shape, nest.order) && aligned(t, nest.vector_width);
    }
    int64_t per_thread = vector ? nest.vector_width : 1;
    // A row nest runs a block or a warp per row (its loop strides over rows by the grid).
    int64_t row_blocks = (nest.rows + nest.rows_per_block - 1) / nest.rows_per_block;
    const int block = nest.block_threads;
    unsigned grid = nest.rows > 0 ? grid_for(row_blocks * kBlock, k.device)
                                  : grid_for((nest.numel + per_thread - 1) / per_thread, k.device);
    const NestEntries& e = k.nests[n];
    if (nest.table_entries > 0) grid = grid_paying_for_tables(nest, grid, e.scalar32, k.device);
    int64_t threads = int64_t{grid} * block * per_thread;
    bool narrow = fits_32 && nest.numel + threads < (int64_t{1} << 31) - 1;
    Function f = vector ? (narrow ? e.vector32 : e.vector64) : (narrow ? e.scalar32 : e.scalar64);
    launch(f, grid, static_cast<unsigned>(block), words.data(), words.size() * 8, stream);
  }
  return true;
}

// ---- device tensors
// ------------------------------------------------------------------------------

TensorHandle cuda_strided(DType dtype, const Shape& shape, const std::vector<int64_t>& strides,
                          int64_t offset, int64_t storage_numel, Device device, bool zero,
                          Allocator* allocator, Stream stream) {
  KILN_ASSERT(device.kind == Device::Kind::kCuda) << "cuda_strided for " << device.str();
  if (!allocator || zero) use_device(device.index);  // (PyTorch's allocator sets its own device)
  auto storage = std::make_shared<Storage>();
  storage->dtype = dtype;
  storage->device = device;
  size_t bytes = static_cast<size_t>(storage_numel * dtype_size(dtype));
  if (allocator) {
    Allocator::Block block = allocator->allocate(device, bytes);
    KILN_ASSERT(block.owner) << "an allocator returned a block without an owner";
    storage->device_data = block.device;
    storage->device_owner = block.owner;
    storage->from_allocator = true;
  } else {
    std::shared_ptr<DeviceMemory> memory = allocate(device.index, bytes);
    storage->device_data = memory->ptr;
    storage->device_owner = memory;
  }
  if (zero) fill_zero(storage->device_data, bytes, device.index, stream);
  storage->device_numel = storage_numel;
  return tensor_over(std::move(storage), shape, strides, offset);
}

TensorHandle to_device(const RtTensor& host, Device device) {
  KILN_ASSERT(!host.storage->on_device()) << "to_device of a device tensor";
  int64_t numel = host.storage->numel();
  TensorHandle t =
      cuda_strided(host.dtype(), host.sizes, host.strides, host.offset, numel, device, false);
  copy_to_device(t->storage->device_data, host_data(host),
                 static_cast<size_t>(numel * dtype_size(host.dtype())), device.index);
  return t;
}

TensorHandle to_host(const RtTensor& d) {
  KILN_ASSERT(d.storage->on_device()) << "to_host of a host tensor";
  int64_t numel = d.storage->numel();
  TensorHandle t = make_strided(d.dtype(), {numel}, {1}, 0, numel);
  t->storage->device = d.device();  // a host copy, labelled with its device
  synchronize(d.device().index);
  copy_to_host(host_data(*t), d.storage->device_data,
               static_cast<size_t>(numel * dtype_size(d.dtype())), d.device().index);
  t->sizes = d.sizes;
  t->strides = d.strides;
  t->offset = d.offset;
  return t;
}

TensorHandle elements_to_host(const RtTensor& d) {
  KILN_ASSERT(d.storage->on_device()) << "elements_to_host of a host tensor";
  int64_t first = d.offset, last = d.offset;
  for (size_t k = 0; k < d.sizes.size(); ++k)
    if (d.sizes[k] > 0) last += (d.sizes[k] - 1) * d.strides[k];
  const int64_t span = d.numel() == 0 ? 0 : last - first + 1;
  TensorHandle t = make_strided(d.dtype(), d.sizes, d.strides, d.offset - first, span);
  t->storage->device = d.device();  // a host copy, labelled with its device
  synchronize(d.device().index);
  const int64_t el = dtype_size(d.dtype());
  copy_to_host(host_data(*t), d.storage->device_data + static_cast<uint64_t>(first * el),
               static_cast<size_t>(span * el), d.device().index);
  return t;
}

}  // namespace kiln::cuda
