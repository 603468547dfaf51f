#include "kiln/runtime/cuda/cublas.h"

#include <dlfcn.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "kiln/runtime/cuda/cublas_lt.h"
#include "kiln/runtime/cuda/cuda_kernels.h"
#include "kiln/runtime/cuda/dynamic_library.h"
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

const Cublas& cublas() {
  static const Cublas lib = [] {
    Cublas c;
    c.handle = open_first({"libcublas.so.13", "libcublas.so.12", "libcublas.so",
                           "/usr/local/cuda/lib64/libcublas.so.13"});
    if (!c.handle) {
      c.why_not = "cuBLAS (libcublas.so.13 or .12) was not found";
      return c;
    }
    if (!(bind_symbol(c.handle, "cublasCreate_v2", &c.Create) &&
          bind_symbol(c.handle, "cublasSetStream_v2", &c.SetStream) &&
          bind_symbol(c.handle, "cublasGetStatusString", &c.StatusString) &&
          bind_symbol(c.handle, "cublasGemmStridedBatchedEx", &c.GemmStridedBatchedEx))) {
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

struct CublasHandles;
Handle handle_for(int device) {
  return handle_per_device<CublasHandles, Handle>(device, [] {
    Handle h = nullptr;
    check(cublas().Create(&h), "cublasCreate");
    return h;
  });
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

int64_t round_up(int64_t x, int64_t multiple) {
  return (x + multiple - 1) / multiple * multiple;
}

// ---- tensor-core alignment
// -----------------------------------------------------------------------
//
// Tensor cores read 16-bit operands 16 bytes at a time. When a matrix's unit-stride dim, its
// leading dim or its address is not a multiple of 16 bytes, cuBLAS falls back to kernels that
// read an element at a time: GPT-2's vocabulary of 50257 makes the LM head's [8192, 768] x
// [768, 50257] take 6 ms on an H200 instead of about 1 (bench/train.py --profile, 2026-12-02).
// Such a product runs aligned instead, as Inductor's pad_mm does: every dim that is some matrix's
// unit-stride dim is rounded up to 16 bytes, the operands that are not aligned are copied into
// buffers whose padding is zero (zeros along k add nothing to a sum), and the padded result's
// [n, m] corner is copied out, or, where every reader takes any strides (any_layout), is the
// result as it lies. That pays when the product does many flops per byte the copies
// move (an unaligned product runs at about a fifth of the aligned rate, a copy at the device's
// bandwidth); a decode step's [1, 768] x [768, 50257] is memory-bound and runs as it is.
constexpr int64_t kTensorCoreBytes = 16;
constexpr int64_t kFlopsPerCopiedByte = 64;

// C[batches, n, m] = A[batches, n, k] B[batches, k, m] as cuBLAS runs it: `aligned`, in the padded
// dims n_p, k_p, m_p, or as the operands are.
struct GemmPlan {
  int64_t n = 0, k = 0, m = 0, batches = 1;
  int64_t n_p = 0, k_p = 0, m_p = 0;
  bool aligned = false;
  int64_t copy_bytes = 0;  // what the alignment copies move
  bool result_padded() const { return n_p != n || m_p != m; }
};

// Whether cuBLAS reads `t` in place as `o` (a [rows, cols] matrix) at tensor-core speed.
bool tensor_core_aligned(const GemmOperand& o, const RtTensor& t, int64_t rows, int64_t cols) {
  const int64_t unit = kTensorCoreBytes / dtype_size(t.dtype());
  const int64_t unit_dim = o.op == kOpN ? cols : rows;
  const auto address = reinterpret_cast<uintptr_t>(element_at(t, o.offset));
  return unit_dim % unit == 0 && o.ld % unit == 0 && o.batch_stride % unit == 0 &&
         address % kTensorCoreBytes == 0;
}

// Whether `t`, read as `o` (a [rows, cols] matrix), is read in place as its [rows_p, cols_p]
// padding by the zeros its storage holds after each row (Storage::row_length): its unit-stride
// dim is whole rows of the storage from their first element, the zeros extend it to the padded
// extent, its other dim is not padded, and the padded matrix is aligned for tensor cores. (A
// loss's gradient [8192, 50257] laid out so by the kernel that computes it is the product's
// operand as it is, instead of a 1.6 GB copy.)
bool reads_zero_padded(const GemmOperand& o, const RtTensor& t, int64_t rows, int64_t cols,
                       int64_t rows_p, int64_t cols_p) {
  const Storage& s = *t.storage;
  if (s.row_pitch == 0 || o.ld != s.row_pitch) return false;
  const bool by_rows = o.op == kOpN;
  const int64_t unit_dim = by_rows ? cols : rows, unit_p = by_rows ? cols_p : rows_p;
  const int64_t other = by_rows ? rows : cols, other_p = by_rows ? rows_p : cols_p;
  return unit_dim == s.row_length && unit_p <= s.row_pitch && other == other_p &&
         o.offset % s.row_pitch == 0 && o.batch_stride % s.row_pitch == 0 &&
         tensor_core_aligned(o, t, rows_p, cols_p);
}

bool broadcast_over_batches(const std::optional<GemmOperand>& o, int64_t batches) {
  return o && batches > 1 && o->batch_stride == 0;
}

// The plan of a product of 16-bit operands read as `ia` and `ib` (nullopt: copied): aligned
// when an operand or the result is not and aligning pays.
GemmPlan plan_gemm(GemmPlan p, int type, const RtTensor& a, const RtTensor& b,
                   const std::optional<GemmOperand>& ia, const std::optional<GemmOperand>& ib) {
  p.n_p = p.n, p.k_p = p.k, p.m_p = p.m;
  if (type != kR16F && type != kR16BF) return p;
  const int64_t el = dtype_size(a.dtype()), unit = kTensorCoreBytes / el;
  const bool a_fits = ia && tensor_core_aligned(*ia, a, p.n, p.k);
  const bool b_fits = ib && tensor_core_aligned(*ib, b, p.k, p.m);
  const bool c_fits = p.m % unit == 0 && (p.batches == 1 || p.n * p.m % unit == 0);
  if (a_fits && b_fits && c_fits) return p;
  // The unit-stride dims: A's k (op N, and a copy) or n (op T), B's m or k, C's m.
  const bool a_t = ia && ia->op == kOpT, b_t = ib && ib->op == kOpT;
  GemmPlan q = p;
  q.aligned = true;
  q.n_p = a_t ? round_up(p.n, unit) : p.n;
  q.k_p = !a_t || b_t ? round_up(p.k, unit) : p.k;
  q.m_p = round_up(p.m, unit);
  auto copy_bytes = [&](bool in_place, bool broadcast, int64_t rows, int64_t cols) {
    return in_place ? 0 : 2 * (broadcast ? 1 : p.batches) * rows * cols * el;
  };
  const bool a_in_place = (a_fits && q.n_p == p.n && q.k_p == p.k) ||
                          (ia && reads_zero_padded(*ia, a, p.n, p.k, q.n_p, q.k_p));
  const bool b_in_place = (b_fits && q.k_p == p.k && q.m_p == p.m) ||
                          (ib && reads_zero_padded(*ib, b, p.k, p.m, q.k_p, q.m_p));
  q.copy_bytes = copy_bytes(a_in_place, broadcast_over_batches(ia, p.batches), q.n_p, q.k_p) +
                 copy_bytes(b_in_place, broadcast_over_batches(ib, p.batches), q.k_p, q.m_p) +
                 (q.result_padded() ? 2 * p.batches * p.n * p.m * el : 0);
  const int64_t flops = 2 * p.batches * p.n * p.m * p.k;
  return flops >= kFlopsPerCopiedByte * q.copy_bytes ? q : p;
}

// The stride between rows when g's batch dims and rows step evenly, as the rows of one matrix do
// (a [b, s, k] activation, contiguous or a slice of columns of one), over more than one batch;
// dims of size 1 step any way.
std::optional<int64_t> even_row_stride(const Geometry& g) {
  const size_t r = g.sizes.size();
  if (r < 3 || shape_numel(g.sizes) == 0 ||
      shape_numel(Shape(g.sizes.begin(), g.sizes.end() - 2)) < 2)
    return std::nullopt;
  std::optional<int64_t> row_stride, next;  // next: what the next outer dim's stride must be
  for (size_t d = r - 1; d-- > 0;) {
    if (g.sizes[d] == 1) continue;
    if (next && g.strides[d] != *next) return std::nullopt;
    if (!row_stride) row_stride = g.strides[d];
    next = g.strides[d] * g.sizes[d];
  }
  return row_stride;
}

// The matrices of `g` ([batches..., rows, cols], expanded) copied into a buffer of `rows_p` x
// `cols_p` matrices whose padding is zero, stored as cuBLAS reads them: transposed (op T: each
// [cols_p, rows_p] in memory) when `transposed`; one matrix when every batch reads the same one.
std::pair<GemmOperand, TensorHandle> padded_copy(const RtTensor& t, Geometry g, bool transposed,
                                                 bool broadcast, int64_t rows_p, int64_t cols_p,
                                                 Allocator* allocator, Stream stream) {
  const auto r = static_cast<int64_t>(g.sizes.size());
  if (transposed) g = transpose_geometry(g, r - 2, r - 1);
  const int64_t outer = transposed ? cols_p : rows_p, inner = transposed ? rows_p : cols_p;
  const int64_t real_outer = g.sizes[r - 2], real_inner = g.sizes[r - 1];
  if (broadcast)
    g = Geometry{{real_outer, real_inner}, {g.strides[r - 2], g.strides[r - 1]}, g.offset};
  // The copy's destination: g's dims over the buffer, the matrices row-major.
  Strides strides(g.sizes.size());
  int64_t stride = 1;
  for (size_t d = g.sizes.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= d == g.sizes.size() - 1 ? inner : d == g.sizes.size() - 2 ? outer : g.sizes[d];
  }
  const int64_t copies = stride / (outer * inner);
  TensorHandle buffer =
      cuda_strided(t.dtype(), {copies, outer, inner}, {outer * inner, inner, 1}, 0,
                   copies * outer * inner, t.device(), false, allocator, stream);
  const auto el = static_cast<size_t>(dtype_size(t.dtype()));
  const DevicePtr base = buffer->storage->device_data;
  const int device = t.device().index;
  // Zero the padding: right of every row, then below every matrix.
  fill_zero_2d(base + real_inner * el, inner * el, (inner - real_inner) * el, copies * outer,
               device, stream);
  fill_zero_2d(base + real_outer * inner * el, outer * inner * el,
               (outer - real_outer) * inner * el, copies, device, stream);
  RtTensor source = t;
  set_geometry(source, g);
  RtTensor destination = *buffer;
  set_geometry(destination, Geometry{g.sizes, strides, 0});
  cuda_copy_elements(destination, source, stream);
  return {GemmOperand{transposed ? kOpT : kOpN, inner, copies > 1 ? outer * inner : 0, 0}, buffer};
}

// input @ weight.T + bias with the bias added in cuBLASLt's epilogue (cublas_lt.h), when the
// input's batches are rows of one matrix (linear's [B, L, k] input, contiguous) and the bias is
// one unit-stride row: the product is then one [B * L, k] x [k, m] matrix. False: run it plainly.
bool run_linear_with_bias_epilogue(const RtTensor& a, const RtTensor& w, const RtTensor& bias,
                                   const GemmOperand& ia, const GemmOperand& iw,
                                   const GemmPlan& plan, const RtTensor& out, Allocator* allocator,
                                   Stream stream) {
  const bool rows_of_one_matrix =
      plan.batches == 1 || (ia.op == kOpN && ia.batch_stride == plan.n * ia.ld);
  const bool weight_shared = plan.batches == 1 || iw.batch_stride == 0;
  if (!rows_of_one_matrix || !weight_shared || bias.dtype() != a.dtype() ||
      bias.sizes.size() != 1 || bias.sizes[0] != plan.m || (plan.m > 1 && bias.strides[0] != 1))
    return false;
  // Only where every matrix and the bias are 16-byte aligned (the layouts of models' linears).
  // In 16-bit dtypes the epilogue and the beta = 1 product round differently where the product
  // and the bias nearly cancel (one rounding of the product), and eager's addmm picks between
  // them by layout too: on the H200 (2026-12-03) kiln's epilogue on unaligned [36, 37] x [37, 21]
  // bf16 operands and its plain product with a bias at an odd address each differed from eager
  // by that rounding in 1-2% of the results; aligned, the epilogue matched eager's.
  const int64_t el = dtype_size(a.dtype());
  auto aligned = [&](const void* p) {
    return reinterpret_cast<uintptr_t>(p) % kTensorCoreBytes == 0;
  };
  if ((iw.ld * el) % kTensorCoreBytes != 0 || (ia.ld * el) % kTensorCoreBytes != 0 ||
      (plan.m * el) % kTensorCoreBytes != 0 || !aligned(element_at(w, iw.offset)) ||
      !aligned(element_at(a, ia.offset)) || !aligned(element_at(bias, bias.offset)) ||
      !aligned(reinterpret_cast<const void*>(out.storage->device_data)))
    return false;
  BiasProduct p;
  p.data_type = a.dtype() == DType::kFloat32   ? kR32F
                : a.dtype() == DType::kFloat16 ? kR16F
                                               : kR16BF;
  // Row-major C[rows, m] = A[rows, k] W^T[k, m] is column-major C^T = (W^T)^T A^T, as cublas
  // reads it below: the weight's operand first.
  p.op_a = iw.op, p.op_b = ia.op;
  p.m = plan.m, p.n = plan.batches * plan.n, p.k = plan.k;
  p.a = element_at(w, iw.offset), p.lda = iw.ld;
  p.b = element_at(a, ia.offset), p.ldb = ia.ld;
  p.bias = element_at(bias, bias.offset);
  p.c = reinterpret_cast<void*>(out.storage->device_data), p.ldc = plan.m;
  return run_bias_product(p, out.device(), allocator, stream);
}

}  // namespace

bool cublas_available(std::string* why) {
  const Cublas& c = cublas();
  if (!c.handle && why) *why = c.why_not;
  return c.handle != nullptr;
}

TensorHandle run_matrix_product(const Node& node, const std::vector<RtValue>& inputs,
                                Allocator* allocator, Stream stream, ProductAlignment* alignment,
                                bool any_layout) {
  const OpId id = node.id();
  if (!is_matrix_product(id)) return nullptr;
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
  // One matrix B for every batch, over rows of A that follow each other evenly: one product of
  // all the rows ([b, s, k] activations into a linear: b x s rows), not b products of s rows.
  // cuBLAS picks its kernel for the whole problem: GPT-2's LM head at 32 x 128 tokens took
  // 0.96 ms as 32 products and 0.45 as one on the H100.
  const std::optional<int64_t> row_stride =
      shape_numel(batch_b) == 1 ? even_row_stride(ga) : std::nullopt;
  const bool batches_folded = row_stride.has_value();
  if (batches_folded) {
    const size_t r = ga.sizes.size();
    ga = Geometry{{shape_numel(ga.sizes) / ga.sizes[r - 1], ga.sizes[r - 1]},
                  {*row_stride, ga.strides[r - 1]},
                  ga.offset};
    const size_t rb = gb.sizes.size();
    gb = Geometry{
        {gb.sizes[rb - 2], gb.sizes[rb - 1]}, {gb.strides[rb - 2], gb.strides[rb - 1]}, gb.offset};
    batch.clear();
  }
  GemmPlan plan;
  plan.n = ga.sizes[ga.sizes.size() - 2], plan.k = ga.sizes.back(), plan.m = gb.sizes.back();
  plan.batches = shape_numel(batch);
  const int64_t n = plan.n, k = plan.k, m = plan.m, batches = plan.batches;
  auto expand_to = [&](const Geometry& g, int64_t rows, int64_t cols) {
    IntList sizes(batch.begin(), batch.end());
    sizes.push_back(rows);
    sizes.push_back(cols);
    return expand_geometry(g, sizes);
  };
  const int64_t limit = int64_t{1} << 31;
  const Geometry ea = expand_to(ga, n, k), eb = expand_to(gb, k, m);
  const std::optional<GemmOperand> ia = in_place_operand(ea), ib = in_place_operand(eb);
  plan = plan_gemm(plan, type, a, b, ia, ib);
  if (plan.n_p >= limit || plan.k_p >= limit || plan.m_p >= limit || batches >= limit)
    return nullptr;
  const int device = out_type.device.index;
  // A padded result its readers take with any strides is the padded buffer's [n, m] corner itself.
  const bool corner_is_result = plan.result_padded() && any_layout && a.rank() >= 2 &&
                                b.rank() >= 2 && out_type.numel() > 0 && k > 0;
  TensorHandle out =
      corner_is_result
          ? nullptr
          : cuda_strided(out_type.dtype, out_type.shape, contiguous_strides(out_type.shape), 0,
                         out_type.numel(), out_type.device, false, allocator, stream);
  if (out && out->numel() == 0) return out;
  // The result cuBLAS writes: `out`, or a padded buffer whose [n, m] corner is copied into it.
  TensorHandle c = out;
  if (plan.result_padded())
    c = cuda_strided(out_type.dtype, {batches, plan.n_p, plan.m_p},
                     {plan.n_p * plan.m_p, plan.m_p, 1}, 0, batches * plan.n_p * plan.m_p,
                     out_type.device, false, allocator, stream);
  RtTensor corner = *c;
  corner.sizes = {batches, n, m};
  corner.strides = {plan.n_p * plan.m_p, plan.m_p, 1};
  bool bias =
      id == OpId::kLinear && inputs.size() > 2 && std::holds_alternative<TensorHandle>(inputs[2]);
  if (bias && type != kR64F && !plan.aligned && ia && ib &&
      run_linear_with_bias_epilogue(a, b, *std::get<TensorHandle>(inputs[2]), *ia, *ib, plan, *out,
                                    allocator, stream))
    return out;
  // beta = 1 over the broadcast bias (linear), else 0 over whatever the buffer holds.
  if (bias) {
    const RtTensor& bt = *std::get<TensorHandle>(inputs[2]);
    cuda_copy_elements(corner, bt, stream);
  } else if (k == 0) {
    fill_zero(out->storage->device_data,
              static_cast<size_t>(out->numel() * dtype_size(out->dtype())), device, stream);
  }
  if (k == 0) return out;
  // Each operand in place where cuBLAS can read it so (and, aligned, at tensor-core speed),
  // else as a copy: contiguous, or padded and aligned.
  TensorHandle copies[2];
  auto operand = [&](int which, const RtTensor& t, const Geometry& g,
                     const std::optional<GemmOperand>& o, int64_t rows_p, int64_t cols_p) {
    const int64_t rows = g.sizes[g.sizes.size() - 2], cols = g.sizes.back();
    const bool same_dims = rows_p == rows && cols_p == cols;
    if (o && (!plan.aligned || (same_dims && tensor_core_aligned(*o, t, rows, cols))))
      return std::pair{*o, element_at(t, o->offset)};
    if (o && plan.aligned && reads_zero_padded(*o, t, rows, cols, rows_p, cols_p))
      return std::pair{*o, element_at(t, o->offset)};
    if (plan.aligned) {
      auto [po, buffer] = padded_copy(t, g, o && o->op == kOpT, broadcast_over_batches(o, batches),
                                      rows_p, cols_p, allocator, stream);
      copies[which] = buffer;
      return std::pair{po, element_at(*buffer, 0)};
    }
    copies[which] = contiguous_copy(t, g, allocator, stream);
    GemmOperand plain{kOpN, cols, batches > 1 ? rows * cols : 0, 0};
    return std::pair{plain, element_at(*copies[which], 0)};
  };
  auto [oa, pa] = operand(0, a, ea, ia, plan.n_p, plan.k_p);
  auto [ob, pb] = operand(1, b, eb, ib, plan.k_p, plan.m_p);
  Handle h = handle_for(device);
  use_device(device);
  check(cublas().SetStream(h, stream), "cublasSetStream");
  float alpha_f = 1, beta_f = bias ? 1.0f : 0.0f;
  double alpha_d = 1, beta_d = bias ? 1.0 : 0.0;
  bool f64 = type == kR64F;
  // Row-major C[n, m] = A[n, k] B[k, m] is column-major C^T = B^T A^T: a row-major operand is
  // its column-major transpose as stored (op N), a column-major one needs op T.
  check(cublas().GemmStridedBatchedEx(
            h, ob.op, oa.op, static_cast<int>(plan.m_p), static_cast<int>(plan.n_p),
            static_cast<int>(plan.k_p), f64 ? static_cast<const void*>(&alpha_d) : &alpha_f, pb,
            type, static_cast<int>(ob.ld), ob.batch_stride, pa, type, static_cast<int>(oa.ld),
            oa.batch_stride, f64 ? static_cast<const void*>(&beta_d) : &beta_f,
            reinterpret_cast<void*>(c->storage->device_data), type, static_cast<int>(plan.m_p),
            plan.n_p * plan.m_p, static_cast<int>(batches), f64 ? kCompute64F : kCompute32F,
            kGemmDefault),
        "cublasGemmStridedBatchedEx");
  int64_t copied = plan.aligned ? plan.copy_bytes : 0;
  if (corner_is_result) {
    // Batch dims + [n, m] over the padded matrices, in order.
    // (Batches folded into one matrix's rows: n_p padded all of them, a batch is n rows of it.)
    Strides strides(out_type.shape.size());
    int64_t stride = 1;
    for (size_t d = strides.size(); d-- > 0;) {
      strides[d] = stride;
      stride *= d + 1 == strides.size()                      ? plan.m_p
                : d + 2 == strides.size() && !batches_folded ? plan.n_p
                                                             : out_type.shape[d];
    }
    if (alignment)
      *alignment = {plan.aligned, copied - 2 * batches * n * m * dtype_size(a.dtype())};
    return make_view(c, out_type.shape, strides, 0);
  }
  if (plan.result_padded()) {
    RtTensor result = *out;
    result.sizes = {batches, n, m};
    result.strides = {n * m, m, 1};
    cuda_copy_elements(result, corner, stream);
  }
  if (alignment) *alignment = {plan.aligned, copied};
  return out;
}

}  // namespace kiln::cuda
