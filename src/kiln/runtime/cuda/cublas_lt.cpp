#include "kiln/runtime/cuda/cublas_lt.h"

#include <dlfcn.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>

#include "kiln/runtime/cuda/cuda_kernels.h"
#include "kiln/runtime/cuda/dynamic_library.h"
#include "kiln/support/error.h"

namespace kiln::cuda {

namespace {

// The slice of cublasLt.h kiln uses (its opaque types as pointers, its enums as their values).
using Status = int;
using Handle = void*;
using Desc = void*;
using Layout = void*;
using Preference = void*;
struct Algo {
  uint64_t data[8];
};
struct HeuristicResult {  // cublasLtMatmulHeuristicResult_t
  Algo algo;
  size_t workspace_size;
  Status state;
  float waves_count;
  int reserved[4];
};
constexpr int kCompute32F = 68;  // CUBLAS_COMPUTE_32F
constexpr int kR32F = 0;         // CUDA_R_32F: the scale type of every supported dtype
constexpr int kDescTransA = 3, kDescTransB = 4, kDescEpilogue = 7, kDescBiasPointer = 8;
constexpr uint32_t kEpilogueBias = 4;  // CUBLASLT_EPILOGUE_BIAS
constexpr int kPrefMaxWorkspace = 1;
constexpr int kPrefAlignmentA = 5, kPrefAlignmentB = 6, kPrefAlignmentC = 7, kPrefAlignmentD = 8;
// What ATen gives cuBLAS on Hopper: large tiles and split-k want room.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

struct CublasLt {
  void* handle = nullptr;
  Status (*Create)(Handle*) = nullptr;
  Status (*DescCreate)(Desc*, int, int) = nullptr;
  Status (*DescSet)(Desc, int, const void*, size_t) = nullptr;
  Status (*DescDestroy)(Desc) = nullptr;
  Status (*LayoutCreate)(Layout*, int, uint64_t, uint64_t, int64_t) = nullptr;
  Status (*LayoutDestroy)(Layout) = nullptr;
  Status (*PrefCreate)(Preference*) = nullptr;
  Status (*PrefSet)(Preference, int, const void*, size_t) = nullptr;
  Status (*PrefDestroy)(Preference) = nullptr;
  Status (*Heuristic)(Handle, Desc, Layout, Layout, Layout, Layout, Preference, int,
                      HeuristicResult*, int*) = nullptr;
  Status (*Matmul)(Handle, Desc, const void*, const void*, Layout, const void*, Layout, const void*,
                   const void*, Layout, void*, Layout, const Algo*, void*, size_t,
                   Stream) = nullptr;
  const char* (*StatusString)(Status) = nullptr;
};

const CublasLt& cublas_lt() {
  static const CublasLt lib = [] {
    CublasLt c;
    c.handle = open_first({"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so",
                           "/usr/local/cuda/lib64/libcublasLt.so.13"});
    if (!c.handle) return c;
    if (!(bind_symbol(c.handle, "cublasLtCreate", &c.Create) &&
          bind_symbol(c.handle, "cublasLtMatmulDescCreate", &c.DescCreate) &&
          bind_symbol(c.handle, "cublasLtMatmulDescSetAttribute", &c.DescSet) &&
          bind_symbol(c.handle, "cublasLtMatmulDescDestroy", &c.DescDestroy) &&
          bind_symbol(c.handle, "cublasLtMatrixLayoutCreate", &c.LayoutCreate) &&
          bind_symbol(c.handle, "cublasLtMatrixLayoutDestroy", &c.LayoutDestroy) &&
          bind_symbol(c.handle, "cublasLtMatmulPreferenceCreate", &c.PrefCreate) &&
          bind_symbol(c.handle, "cublasLtMatmulPreferenceSetAttribute", &c.PrefSet) &&
          bind_symbol(c.handle, "cublasLtMatmulPreferenceDestroy", &c.PrefDestroy) &&
          bind_symbol(c.handle, "cublasLtMatmulAlgoGetHeuristic", &c.Heuristic) &&
          bind_symbol(c.handle, "cublasLtMatmul", &c.Matmul) &&
          bind_symbol(c.handle, "cublasLtGetStatusString", &c.StatusString)))
      c.handle = nullptr;
    return c;
  }();
  return lib;
}

void check(Status s, const char* call) {
  KILN_ASSERT(s == 0) << call << " failed: " << cublas_lt().StatusString(s);
}

struct CublasLtHandles;
Handle handle_for(int device) {
  return handle_per_device<CublasLtHandles, Handle>(device, [] {
    Handle h = nullptr;
    check(cublas_lt().Create(&h), "cublasLtCreate");
    return h;
  });
}

// The largest power of two up to 256 that divides the address: what the chosen algorithm may
// assume of each matrix (cuBLASLt assumes 256 unless told).
uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0)
    alignment /= 2;
  return alignment;
}

// The descriptors of one call, destroyed with it.
struct Descriptors {
  Desc desc = nullptr;
  std::array<Layout, 3> layouts{};  // A, B, C (C is also D)
  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() {
    const CublasLt& lt = cublas_lt();
    for (Layout l : layouts)
      if (l) lt.LayoutDestroy(l);
    if (desc) lt.DescDestroy(desc);
  }
};

void describe(const BiasProduct& p, Descriptors& d) {
  const CublasLt& lt = cublas_lt();
  check(lt.DescCreate(&d.desc, kCompute32F, kR32F), "cublasLtMatmulDescCreate");
  const int32_t op_a = p.op_a, op_b = p.op_b;
  check(lt.DescSet(d.desc, kDescTransA, &op_a, sizeof op_a), "cublasLtMatmulDescSetAttribute");
  check(lt.DescSet(d.desc, kDescTransB, &op_b, sizeof op_b), "cublasLtMatmulDescSetAttribute");
  check(lt.DescSet(d.desc, kDescEpilogue, &kEpilogueBias, sizeof kEpilogueBias),
        "cublasLtMatmulDescSetAttribute");
  const void* bias = p.bias;
  check(lt.DescSet(d.desc, kDescBiasPointer, &bias, sizeof bias), "cublasLtMatmulDescSetAttribute");
  // Layouts as stored: an operand read transposed is stored with its dims swapped.
  const bool a_t = p.op_a != 0, b_t = p.op_b != 0;
  auto layout = [&](Layout* l, int64_t rows, int64_t cols, int64_t ld) {
    check(lt.LayoutCreate(l, p.data_type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols),
                          ld),
          "cublasLtMatrixLayoutCreate");
  };
  layout(&d.layouts[0], a_t ? p.k : p.m, a_t ? p.m : p.k, p.lda);
  layout(&d.layouts[1], b_t ? p.n : p.k, b_t ? p.k : p.n, p.ldb);
  layout(&d.layouts[2], p.m, p.n, p.ldc);
}

// The algorithm cuBLASLt's heuristic picks for a shape and its operands' alignments, found once.
using Key = std::tuple<int, int, int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       uint32_t, uint32_t, uint32_t, uint32_t>;

std::optional<HeuristicResult> algorithm_for(const BiasProduct& p, int device, Handle h,
                                             const Descriptors& d) {
  static std::mutex mutex;
  static std::map<Key, std::optional<HeuristicResult>> found;
  const uint32_t align_a = alignment_of(p.a), align_b = alignment_of(p.b),
                 align_c = alignment_of(p.c), align_bias = alignment_of(p.bias);
  const Key key{device, p.data_type, p.op_a, p.op_b,  p.m,     p.n,     p.k,
                p.lda,  p.ldb,       p.ldc,  align_a, align_b, align_c, align_bias};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = found.find(key);
  if (it != found.end()) return it->second;
  const CublasLt& lt = cublas_lt();
  Preference pref = nullptr;
  check(lt.PrefCreate(&pref), "cublasLtMatmulPreferenceCreate");
  std::unique_ptr<void, void (*)(void*)> owned(pref, [](void* q) { cublas_lt().PrefDestroy(q); });
  const uint64_t workspace = kWorkspaceBytes;
  check(lt.PrefSet(pref, kPrefMaxWorkspace, &workspace, sizeof workspace),
        "cublasLtMatmulPreferenceSetAttribute");
  for (auto [attribute, alignment] : {std::pair{kPrefAlignmentA, align_a},
                                      {kPrefAlignmentB, align_b},
                                      {kPrefAlignmentC, align_c},
                                      {kPrefAlignmentD, align_c}})
    check(lt.PrefSet(pref, attribute, &alignment, sizeof alignment),
          "cublasLtMatmulPreferenceSetAttribute");
  HeuristicResult result{};
  int count = 0;
  const Status s = lt.Heuristic(h, d.desc, d.layouts[0], d.layouts[1], d.layouts[2], d.layouts[2],
                                pref, 1, &result, &count);
  std::optional<HeuristicResult> chosen;
  if (s == 0 && count > 0 && result.state == 0) chosen = result;
  found.emplace(key, chosen);
  return chosen;
}

}  // namespace

bool run_bias_product(const BiasProduct& p, Device device, Allocator* allocator, Stream stream) {
  if (!cublas_lt().handle || p.m <= 0 || p.n <= 0 || p.k <= 0) return false;
  const int64_t limit = int64_t{1} << 31;
  if (p.m >= limit || p.n >= limit || p.k >= limit) return false;
  use_device(device.index);
  Handle h = handle_for(device.index);
  Descriptors d;
  describe(p, d);
  const std::optional<HeuristicResult> algorithm = algorithm_for(p, device.index, h, d);
  if (!algorithm) return false;
  // The workspace, stream-ordered like every temporary of the step (freed as the call returns,
  // reused only by work queued after this product).
  TensorHandle workspace;
  void* workspace_ptr = nullptr;
  if (algorithm->workspace_size > 0) {
    const auto words = static_cast<int64_t>((algorithm->workspace_size + 3) / 4);
    workspace =
        cuda_strided(DType::kFloat32, {words}, {1}, 0, words, device, false, allocator, stream);
    workspace_ptr = reinterpret_cast<void*>(workspace->storage->device_data);
  }
  const float alpha = 1, beta = 0;
  check(cublas_lt().Matmul(h, d.desc, &alpha, p.a, d.layouts[0], p.b, d.layouts[1], &beta, p.c,
                           d.layouts[2], p.c, d.layouts[2], &algorithm->algo, workspace_ptr,
                           algorithm->workspace_size, stream),
        "cublasLtMatmul");
  return true;
}

}  // namespace kiln::cuda
