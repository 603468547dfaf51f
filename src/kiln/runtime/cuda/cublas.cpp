#include "kiln/runtime/cuda/cublas.h"

#include <dlfcn.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "kiln/runtime/cuda/cuda_kernels.h"
#include "kiln/runtime/interpreter/layout.h"
#include "kiln/runtime/interpreter/view_geometry.h"
#include "kiln/support/error.h"

namespace kiln::cuda {

namespace {

// The slice of cublas_api.h and library_types.h kiln uses.
using Handle = void*;
using Status = int;
constexpr int kOpN = 0, kOpT = 1;                            // CUBLAS_OP_N, CUBLAS_OP_T
constexpr int kGemmDefault = -1;                             // CUBLAS_GEMM_DEFAULT
constexpr int kCompute32F = 68;                              // CUBLAS_COMPUTE_32F
constexpr int kCompute64F = 70;                              // CUBLAS_COMPUTE_64F
constexpr int kR32F = 0, kR64F = 1, kR16F = 2, kR16BF = 14;  // cudaDataType

struct Cublas {
  void* handle = nullptr;
  std::string why_not;
  Status (*Create)(Handle*) = nullptr;
  Status (*SetStream)(Handle, Stream) = nullptr;
  const char* (*StatusString)(Status) = nullptr;
  Status (*GemmStridedBatchedEx)(Handle, int, int, int, int, int, const void*, const void*, int,
                                 int, long long, const void*, int, int, long long, const void*,
                                 void*, int, int, long long, int, int, int) = nullptr;
};

template <class F>
bool bind(void* handle, const char* name, F** fn) {
  *fn = reinterpret_cast<F*>(dlsym(handle, name));
  return *fn != nullptr;
}

const Cublas& cublas() {
  static const Cublas lib = [] {
    Cublas c;
    for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so",
                             "/usr/local/cuda/lib64/libcublas.so.13"}) {
      c.handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (c.handle) break;
    }
    if (!c.handle) {
      c.why_not = "cuBLAS (libcublas.so.13 or .12) was not found";
      return c;
    }
    if (!(bind(c.handle, "cublasCreate_v2", &c.Create) &&
          bind(c.handle, "cublasSetStream_v2", &c.SetStream) &&
          bind(c.handle, "cublasGetStatusString", &c.StatusString) &&
          bind(c.handle, "cublasGemmStridedBatchedEx", &c.GemmStridedBatchedEx))) {
      c.why_not = "the cuBLAS found lacks cublasGemmStridedBatchedEx";
      c.handle = nullptr;
    }
    return c;
  }();
  return lib;
}

void check(Status s, const char* call) {
  KILN_ASSERT(s == 0) << call << " failed: " << cublas().StatusString(s);
}

Handle handle_for(int device) {
  static std::mutex mutex;
  static std::map<int, Handle> handles;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  use_device(device);
  Handle h = nullptr;
  check(cublas().Create(&h), "cublasCreate");
  handles[device] = h;
  return h;
}

// `t` viewed with `g`, copied into a new contiguous tensor (broadcast dims materialized).
TensorHandle contiguous_copy(const RtTensor& t, const Geometry& g, Allocator* allocator,
                             Stream stream) {
  RtTensor view = t;
  view.sizes = g.sizes;
  view.strides = g.strides;
  view.offset = g.offset;
  TensorHandle out = cuda_strided(t.dtype(), g.sizes, contiguous_strides(g.sizes), 0,
                                  shape_numel(g.sizes), t.device(), false, allocator, stream);
  cuda_copy_elements(*out, view, stream);
  return out;
}

// One operand as cuBLAS reads it: a row-major [rows, cols] matrix per batch (op N) or its
// transpose stored column-major (op T), `ld` apart, batches `batch_stride` apart (0: one matrix
// broadcast over the batch), starting `offset` elements into the storage.
struct GemmOperand {
  int op = kOpN;
  int64_t ld = 0, batch_stride = 0, offset = 0;
};

// How cuBLAS reads `g` (batch dims, then [rows, cols]) in place, if it can: the matrix dims
// have unit stride in one of them, and the batch dims collapse into one stride. A transposed
// weight (linear's input @ weight.T) and an expanded operand are then read without a copy.
std::optional<GemmOperand> in_place_operand(const Geometry& g) {
  const size_t r = g.sizes.size();
  const int64_t rows = g.sizes[r - 2], cols = g.sizes[r - 1];
  const int64_t sr = g.strides[r - 2], sc = g.strides[r - 1];
  GemmOperand o;
  o.offset = g.offset;
  if ((sc == 1 || cols == 1) && (rows == 1 || sr >= cols)) {
    o.ld = rows == 1 ? cols : sr;
  } else if ((sr == 1 || rows == 1) && (cols == 1 || sc >= rows)) {
    o.op = kOpT;
    o.ld = cols == 1 ? rows : sc;
  } else {
    return std::nullopt;
  }
  o.ld = std::max<int64_t>(o.ld, 1);
  if (o.ld >= (int64_t{1} << 31)) return std::nullopt;  // cuBLAS takes an int
  // Batch dims, outermost first: each stride must be the next one's times its size.
  std::optional<int64_t> inner;  // the stride of the innermost batch dim of size > 1
  int64_t span = 0;              // elements that dim and those inside it cover
  for (size_t d = r - 2; d-- > 0;) {
    if (g.sizes[d] == 1) continue;
    if (!inner) {
      inner = g.strides[d];
      span = g.strides[d] * g.sizes[d];
    } else if (g.strides[d] == span) {
      span *= g.sizes[d];
    } else {
      return std::nullopt;
    }
  }
  o.batch_stride = inner.value_or(0);
  return o;
}

const void* element_at(const RtTensor& t, int64_t offset) {
  return reinterpret_cast<const char*>(t.storage->device_data) + offset * dtype_size(t.dtype());
}

}  // namespace

bool cublas_available(std::string* why) {
  const Cublas& c = cublas();
  if (!c.handle && why) *why = c.why_not;
  return c.handle != nullptr;
}

TensorHandle run_matrix_product(const Node& node, const std::vector<RtValue>& inputs,
                                Allocator* allocator, Stream stream) {
  const OpId id = node.id();
  if (id != OpId::kMatmul && id != OpId::kBmm && id != OpId::kLinear) return nullptr;
  const TensorType& out_type = node.outputs[0]->tensor_type();
  int type = 0;
  switch (out_type.dtype) {
    case DType::kFloat32:
      type = kR32F;
      break;
    case DType::kFloat64:
      type = kR64F;
      break;
    case DType::kFloat16:
      type = kR16F;
      break;
    case DType::kBFloat16:
      type = kR16BF;
      break;
    default:
      return nullptr;  // integral products: the interpreter
  }
  if (!cublas_available()) return nullptr;
  const RtTensor& a = *std::get<TensorHandle>(inputs.at(0));
  const RtTensor& b = *std::get<TensorHandle>(inputs.at(1));
  if (a.dtype() != out_type.dtype || b.dtype() != out_type.dtype) return nullptr;
  Geometry ga = geometry_of(a), gb = geometry_of(b);
  if (id == OpId::kLinear) gb = t_geometry(gb);  // input @ weight.T
  if (ga.sizes.size() == 1) ga = unsqueeze_geometry(ga, 0);
  if (gb.sizes.size() == 1) gb = unsqueeze_geometry(gb, 1);
  Shape batch_a(ga.sizes.begin(), ga.sizes.end() - 2),
      batch_b(gb.sizes.begin(), gb.sizes.end() - 2);
  Shape batch = broadcast_shapes(batch_a, batch_b);
  const int64_t n = ga.sizes[ga.sizes.size() - 2], k = ga.sizes.back(), m = gb.sizes.back();
  auto expand_to = [&](const Geometry& g, int64_t rows, int64_t cols) {
    IntList sizes(batch.begin(), batch.end());
    sizes.push_back(rows);
    sizes.push_back(cols);
    return expand_geometry(g, sizes);
  };
  const int64_t batches = shape_numel(batch);
  const int64_t limit = int64_t{1} << 31;
  if (n >= limit || k >= limit || m >= limit || batches >= limit) return nullptr;
  const int device = out_type.device.index;
  TensorHandle out =
      cuda_strided(out_type.dtype, out_type.shape, contiguous_strides(out_type.shape), 0,
                   out_type.numel(), out_type.device, false, allocator, stream);
  if (out->numel() == 0) return out;
  // beta = 1 over the broadcast bias (linear), else 0 over whatever the buffer holds.
  bool bias =
      id == OpId::kLinear && inputs.size() > 2 && std::holds_alternative<TensorHandle>(inputs[2]);
  if (bias) {
    const RtTensor& bt = *std::get<TensorHandle>(inputs[2]);
    cuda_copy_elements(*out, bt, stream);
  } else if (k == 0) {
    fill_zero(out->storage->device_data,
              static_cast<size_t>(out->numel() * dtype_size(out->dtype())), device, stream);
  }
  if (k == 0) return out;
  // Each operand in place where cuBLAS can read it so, else as a contiguous copy.
  TensorHandle copies[2];
  auto operand = [&](int which, const RtTensor& t, const Geometry& g) {
    if (std::optional<GemmOperand> o = in_place_operand(g))
      return std::pair{*o, element_at(t, o->offset)};
    copies[which] = contiguous_copy(t, g, allocator, stream);
    const int64_t rows = g.sizes[g.sizes.size() - 2], cols = g.sizes.back();
    GemmOperand o{kOpN, cols, batches > 1 ? rows * cols : 0, 0};
    return std::pair{o, element_at(*copies[which], 0)};
  };
  auto [oa, pa] = operand(0, a, expand_to(ga, n, k));
  auto [ob, pb] = operand(1, b, expand_to(gb, k, m));
  Handle h = handle_for(device);
  use_device(device);
  check(cublas().SetStream(h, stream), "cublasSetStream");
  float alpha_f = 1, beta_f = bias ? 1.0f : 0.0f;
  double alpha_d = 1, beta_d = bias ? 1.0 : 0.0;
  bool f64 = type == kR64F;
  // Row-major C[n, m] = A[n, k] B[k, m] is column-major C^T = B^T A^T: a row-major operand is
  // its column-major transpose as stored (op N), a column-major one needs op T.
  check(cublas().GemmStridedBatchedEx(
            h, ob.op, oa.op, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
            f64 ? static_cast<const void*>(&alpha_d) : &alpha_f, pb, type, static_cast<int>(ob.ld),
            ob.batch_stride, pa, type, static_cast<int>(oa.ld), oa.batch_stride,
            f64 ? static_cast<const void*>(&beta_d) : &beta_f,
            reinterpret_cast<void*>(out->storage->device_data), type, static_cast<int>(m), n * m,
            static_cast<int>(batches), f64 ? kCompute64F : kCompute32F, kGemmDefault),
        "cublasGemmStridedBatchedEx");
  return out;
}

}  // namespace kiln::cuda
