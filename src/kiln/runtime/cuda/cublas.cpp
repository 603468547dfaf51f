#include "kiln/runtime/cuda/cublas.h"

#include <dlfcn.h>

#include <map>
#include <mutex>

#include "kiln/runtime/cuda/cuda_kernels.h"
#include "kiln/runtime/interpreter/layout.h"
#include "kiln/runtime/interpreter/view_geometry.h"
#include "kiln/support/error.h"

namespace kiln::cuda {

namespace {

// The slice of cublas_api.h and library_types.h kiln uses.
using Handle = void*;
using Status = int;
constexpr int kOpN = 0;                                      // CUBLAS_OP_N
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
  TensorHandle ac = contiguous_copy(a, expand_to(ga, n, k), allocator, stream);
  TensorHandle bc = contiguous_copy(b, expand_to(gb, k, m), allocator, stream);
  Handle h = handle_for(device);
  use_device(device);
  check(cublas().SetStream(h, stream), "cublasSetStream");
  float alpha_f = 1, beta_f = bias ? 1.0f : 0.0f;
  double alpha_d = 1, beta_d = bias ? 1.0 : 0.0;
  bool f64 = type == kR64F;
  // Row-major C[n, m] = A[n, k] B[k, m] is column-major C^T = B^T A^T.
  check(cublas().GemmStridedBatchedEx(
            h, kOpN, kOpN, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
            f64 ? static_cast<const void*>(&alpha_d) : &alpha_f,
            reinterpret_cast<const void*>(bc->storage->device_data), type, static_cast<int>(m),
            k * m, reinterpret_cast<const void*>(ac->storage->device_data), type,
            static_cast<int>(k), n * k, f64 ? static_cast<const void*>(&beta_d) : &beta_f,
            reinterpret_cast<void*>(out->storage->device_data), type, static_cast<int>(m), n * m,
            static_cast<int>(batches), f64 ? kCompute64F : kCompute32F, kGemmDefault),
        "cublasGemmStridedBatchedEx");
  return out;
}

}  // namespace kiln::cuda
