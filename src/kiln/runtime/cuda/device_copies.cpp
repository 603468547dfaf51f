// The device copies of kiln's CUDA runtime (cuda_copy_into, cuda_copy_elements, cuda_clone,
// cuda_copy_single_elements): one module of copy kernels, compiled once per device, and the choice
// among them from the copy's collapsed layout:
//   rows of one dtype whose rows and pitches are whole vectors   kiln_vector_rows (16-byte moves)
//   other rows of one dtype, up to 2 dims, long rows              kiln_row_copy
//   anything else (a transpose, a dtype conversion)               kiln_strided_copy
#include <algorithm>
#include <cstddef>
#include <map>
#include <mutex>

#include "kiln/analysis/geometry.h"
#include "kiln/codegen/kernel.h"
#include "kiln/runtime/cuda/cuda_kernels.h"
#include "kiln/runtime/cuda/kernel_modules.h"
#include "kiln/runtime/interpreter/layout.h"
#include "kiln/support/error.h"

namespace kiln::cuda {

namespace {

constexpr int kMaxCopyRank = 16;
// The largest index the copy kernels' 32-bit arithmetic (`narrow`) reaches.
constexpr int64_t kNarrow = (int64_t{1} << 31) - 1;

const char* copy_kernel_source() {
  return R"KILN(
namespace kiln_copy {
using namespace kiln;
using namespace kiln::kernel;
// dtype codes: kiln's DType order (bool, i32, i64, f16, bf16, f32, f64).
struct Args {
  const void* src;
  void* dst;
  int64_t numel;
  int64_t rank;
  int64_t src_dtype;
  int64_t dst_dtype;
  int64_t src_offset;
  int64_t dst_offset;
  int64_t narrow;  // every index fits in 31 bits
  int64_t sizes[16];
  int64_t src_strides[16];
  int64_t dst_strides[16];
};
inline bool floating(int64_t d) { return d >= 3; }
inline double load_f(const void* p, int64_t d, int64_t i) {
  switch (d) {
    case 3: return ld_f16(p, i);
    case 4: return ld_bf16(p, i);
    case 5: return ld_f32(p, i);
    default: return ld_f64(p, i);
  }
}
inline int64_t load_i(const void* p, int64_t d, int64_t i) {
  switch (d) {
    case 0: return ld_bool(p, i);
    case 1: return ld_i32(p, i);
    default: return ld_i64(p, i);
  }
}
inline void store_f(void* p, int64_t d, int64_t i, double v) {
  switch (d) {
    case 0: st_bool(p, i, f_bool(v)); break;
    case 1: st_i32(p, i, f_i32(v)); break;
    case 2: st_i64(p, i, f_i64(v)); break;
    case 3: st_f16(p, i, f_f16(v)); break;
    case 4: st_bf16(p, i, f_bf16(v)); break;
    case 5: st_f32(p, i, f_f32(v)); break;
    default: st_f64(p, i, v); break;
  }
}
inline void store_i(void* p, int64_t d, int64_t i, int64_t v) {
  switch (d) {
    case 0: st_bool(p, i, i_bool(v)); break;
    case 1: st_i32(p, i, i_i32(v)); break;
    case 2: st_i64(p, i, v); break;
    case 3: st_f16(p, i, i_f16(v)); break;
    case 4: st_bf16(p, i, i_bf16(v)); break;
    case 5: st_f32(p, i, i_f32(v)); break;
    default: st_f64(p, i, i_f64(v)); break;
  }
}
__device__ __forceinline__ void copy_element(const Args& a, int64_t si, int64_t di) {
  if (a.src_dtype == a.dst_dtype) {  // the bytes, unchanged
    switch (a.src_dtype) {
      case 0: static_cast<uint8_t*>(a.dst)[di] = static_cast<const uint8_t*>(a.src)[si]; break;
      case 1:
      case 5: static_cast<uint32_t*>(a.dst)[di] = static_cast<const uint32_t*>(a.src)[si]; break;
      case 3:
      case 4: static_cast<uint16_t*>(a.dst)[di] = static_cast<const uint16_t*>(a.src)[si]; break;
      default: static_cast<uint64_t*>(a.dst)[di] = static_cast<const uint64_t*>(a.src)[si]; break;
    }
  } else if (floating(a.src_dtype)) {
    store_f(a.dst, a.dst_dtype, di, load_f(a.src, a.src_dtype, si));
  } else {
    store_i(a.dst, a.dst_dtype, di, load_i(a.src, a.src_dtype, si));
  }
}
// An element's place in src and dst from its linear index: in 32-bit arithmetic when every index
// fits (`narrow`; a 64-bit division per dim made a copy of 2^25 floats compute bound), else 64.
extern "C" __global__ void kiln_strided_copy(const Args a) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t lin = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; lin < a.numel;
       lin += step) {
    if (a.narrow) {
      uint32_t rest = static_cast<uint32_t>(lin);
      uint32_t si = static_cast<uint32_t>(a.src_offset), di = static_cast<uint32_t>(a.dst_offset);
      for (int d = static_cast<int>(a.rank) - 1; d >= 0; --d) {
        const uint32_t size = static_cast<uint32_t>(a.sizes[d]);
        const uint32_t i = rest % size;
        rest /= size;
        si += i * static_cast<uint32_t>(a.src_strides[d]);
        di += i * static_cast<uint32_t>(a.dst_strides[d]);
      }
      copy_element(a, si, di);
      continue;
    }
    int64_t rest = lin, si = a.src_offset, di = a.dst_offset;
    for (int64_t d = a.rank - 1; d >= 0; --d) {
      const int64_t i = rest % a.sizes[d];
      rest /= a.sizes[d];
      si += i * a.src_strides[d];
      di += i * a.dst_strides[d];
    }
    copy_element(a, si, di);
  }
}
// A copy of rows of one dtype: unit stride within a row on both sides, one pitch between rows on
// each (a padded matrix, a slice of columns). No index arithmetic per element: a block copies
// 8 x blockDim.x elements of each row it visits, all loads before the stores.
struct RowArgs {
  const void* src;
  void* dst;
  int64_t rows;
  int64_t cols;
  int64_t src_pitch;
  int64_t dst_pitch;
  int64_t src_offset;
  int64_t dst_offset;
  int64_t element_bytes;
};
template <class T>
__device__ __forceinline__ void copy_rows(const RowArgs& a) {
  const T* src = static_cast<const T*>(a.src) + a.src_offset;
  T* dst = static_cast<T*>(a.dst) + a.dst_offset;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * (blockDim.x * 8) + threadIdx.x;
  for (int64_t row = blockIdx.y; row < a.rows; row += gridDim.y) {
    const T* s = src + row * a.src_pitch;
    T* d = dst + row * a.dst_pitch;
    T v[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int64_t c = first + static_cast<int64_t>(k) * blockDim.x;
      if (c < a.cols) v[k] = s[c];
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int64_t c = first + static_cast<int64_t>(k) * blockDim.x;
      if (c < a.cols) d[c] = v[k];
    }
  }
}
extern "C" __global__ void kiln_row_copy(const RowArgs a) {
  switch (a.element_bytes) {
    case 1: copy_rows<uint8_t>(a); break;
    case 2: copy_rows<uint16_t>(a); break;
    case 4: copy_rows<uint32_t>(a); break;
    default: copy_rows<uint64_t>(a); break;
  }
}
// Rows of one dtype moved a vector at a time (V: 16, 8, 4, 2 or 1 bytes): each row is a whole
// number of vectors at unit stride on both sides, and the rows are spread over up to 15 dims of
// any strides (a multiple of the vector's size; 0: a row read again), so a copy that only moves
// rows (heads transposed back into [tokens, heads x dim], a key's heads repeated for grouped
// attention) costs one load and one store of 16 bytes per thread, the row's place found once per
// vector. src and dst point at the first elements; pitches are in vectors.
struct VectorRowArgs {
  const void* src;
  void* dst;
  int64_t vectors;      // in all
  int64_t row_vectors;  // in a row
  int64_t outer_rank;
  int64_t narrow;  // every vector index fits in 31 bits
  int64_t vector_bytes;
  int64_t sizes[15];
  int64_t src_pitches[15];
  int64_t dst_pitches[15];
};
template <class V, class I>
__device__ __forceinline__ void copy_vector_rows(const VectorRowArgs& a) {
  const V* src = static_cast<const V*>(a.src);
  V* dst = static_cast<V*>(a.dst);
  const I step = static_cast<I>(gridDim.x) * blockDim.x;
  const I vectors = static_cast<I>(a.vectors), row_vectors = static_cast<I>(a.row_vectors);
  for (I v = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors; v += step) {
    I row = v / row_vectors;
    const I column = v - row * row_vectors;
    I si = column, di = column;
    for (int d = static_cast<int>(a.outer_rank) - 1; d >= 0; --d) {
      const I size = static_cast<I>(a.sizes[d]);
      const I i = row % size;
      row /= size;
      si += i * static_cast<I>(a.src_pitches[d]);
      di += i * static_cast<I>(a.dst_pitches[d]);
    }
    dst[di] = src[si];
  }
}
template <class V>
__device__ __forceinline__ void copy_vector_rows(const VectorRowArgs& a) {
  if (a.narrow)
    copy_vector_rows<V, uint32_t>(a);
  else
    copy_vector_rows<V, int64_t>(a);
}
extern "C" __global__ void kiln_vector_rows(const VectorRowArgs a) {
  switch (a.vector_bytes) {
    case 16: copy_vector_rows<uint4>(a); break;
    case 8: copy_vector_rows<uint2>(a); break;
    case 4: copy_vector_rows<uint32_t>(a); break;
    case 2: copy_vector_rows<uint16_t>(a); break;
    default: copy_vector_rows<uint8_t>(a); break;
  }
}
// Single elements of one byte size each, from anywhere to anywhere, in one launch: a thread an
// element. (A multi-tensor group's 0-d results, AdamW's step counts: one launch, not one copy
// per parameter.)
struct ElementCopies {
  int64_t count;
  uint64_t src[kMaxElementCopies];
  uint64_t dst[kMaxElementCopies];
  int64_t bytes[kMaxElementCopies];
};
extern "C" __global__ void kiln_element_copies(const ElementCopies a) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.count) return;
  const void* s = reinterpret_cast<const void*>(a.src[i]);
  void* d = reinterpret_cast<void*>(a.dst[i]);
  switch (a.bytes[i]) {
    case 1: *static_cast<uint8_t*>(d) = *static_cast<const uint8_t*>(s); break;
    case 2: *static_cast<uint16_t*>(d) = *static_cast<const uint16_t*>(s); break;
    case 4: *static_cast<uint32_t*>(d) = *static_cast<const uint32_t*>(s); break;
    default: *static_cast<uint64_t*>(d) = *static_cast<const uint64_t*>(s); break;
  }
}
}  // namespace kiln_copy
)KILN";
}

}  // namespace

std::string copy_module_source() {
  return std::string(codegen::cuda_kernel_prelude()) + "#define kMaxElementCopies " +
         std::to_string(kMaxElementCopies) + "\n" + copy_kernel_source();
}

namespace {

struct CopyArgs {
  uint64_t src, dst;
  int64_t numel, rank, src_dtype, dst_dtype, src_offset, dst_offset, narrow;
  int64_t sizes[kMaxCopyRank], src_strides[kMaxCopyRank], dst_strides[kMaxCopyRank];
};

struct ElementCopyArgs {
  int64_t count;
  uint64_t src[kMaxElementCopies], dst[kMaxElementCopies];
  int64_t bytes[kMaxElementCopies];
};

struct RowCopyArgs {
  uint64_t src, dst;
  int64_t rows, cols, src_pitch, dst_pitch, src_offset, dst_offset, element_bytes;
};

struct VectorRowCopyArgs {
  uint64_t src, dst;
  int64_t vectors, row_vectors, outer_rank, narrow, vector_bytes;
  int64_t sizes[kMaxCopyRank - 1], src_pitches[kMaxCopyRank - 1], dst_pitches[kMaxCopyRank - 1];
};

// The words of each copy kernel's arguments that hold device addresses (the src and dst
// fields, as the structs above lay them out).
std::vector<int> copy_address_words(const std::string& name) {
  static_assert(offsetof(CopyArgs, dst) == 8 && offsetof(RowCopyArgs, dst) == 8 &&
                offsetof(VectorRowCopyArgs, dst) == 8 && offsetof(ElementCopyArgs, src) == 8 &&
                offsetof(ElementCopyArgs, dst) == 8 * (1 + kMaxElementCopies));
  if (name != "kiln_element_copies") return {0, 1};
  std::vector<int> words;
  for (int w = 1; w <= 2 * static_cast<int>(kMaxElementCopies); ++w)
    words.push_back(w);
  return words;
}

// kiln_strided_copy, kiln_row_copy, ..., loaded once per device.
Function copy_function(int device, const std::string& name) {
  static std::mutex mutex;
  static std::map<std::pair<int, std::string>, Function> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = loaded.find({device, name});
  if (it != loaded.end()) return it->second;
  std::vector<ModuleRequest> requests(1);
  requests[0].source = copy_module_source();
  get_modules(requests, device);
  Function f = get_function(requests[0].module, name);
  loaded[{device, name}] = f;
  register_address_words(f, copy_address_words(name));
  return f;
}

// A copy's dims with those of size 1 dropped and neighbours merged where both sides step across
// them uniformly: a padded matrix's corner is [rows, cols], a contiguous tensor one dim.
struct CopyDims {
  std::vector<int64_t> sizes, src_strides, dst_strides;
};
CopyDims collapsed(const Shape& sizes, const Strides& src, const Strides& dst) {
  CopyDims c;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;
    if (!c.sizes.empty() && c.src_strides.back() == src[d] * sizes[d] &&
        c.dst_strides.back() == dst[d] * sizes[d]) {
      c.sizes.back() *= sizes[d];
      c.src_strides.back() = src[d];
      c.dst_strides.back() = dst[d];
      continue;
    }
    c.sizes.push_back(sizes[d]);
    c.src_strides.push_back(src[d]);
    c.dst_strides.push_back(dst[d]);
  }
  return c;
}

// The copy as rows of whole vectors (kiln_vector_rows) when both sides are rows of one dtype at
// unit stride whose length, pitches and first elements are multiples of a vector of at least
// 4 bytes; false otherwise. The widest such vector, up to 16 bytes.
bool launch_vector_rows(const RtTensor& dst, const RtTensor& src, const CopyDims& c,
                        Stream stream) {
  const size_t rank = c.sizes.size();
  if (src.dtype() != dst.dtype() || rank == 0 || rank > kMaxCopyRank || c.src_strides.back() != 1 ||
      c.dst_strides.back() != 1)
    return false;
  const int64_t element = dtype_size(src.dtype());
  const uint64_t src_first = src.storage->device_data + static_cast<uint64_t>(src.offset * element);
  const uint64_t dst_first = dst.storage->device_data + static_cast<uint64_t>(dst.offset * element);
  auto fits = [&](int64_t bytes) {
    auto whole = [&](int64_t elements) { return elements * element % bytes == 0; };
    if (src_first % static_cast<uint64_t>(bytes) || dst_first % static_cast<uint64_t>(bytes) ||
        !whole(c.sizes.back()))
      return false;
    for (size_t d = 0; d + 1 < rank; ++d)
      if (!whole(c.src_strides[d]) || !whole(c.dst_strides[d])) return false;
    return true;
  };
  int64_t bytes = 16;
  while (bytes > element && !fits(bytes))
    bytes /= 2;
  if (bytes < 4 || bytes <= element || !fits(bytes)) return false;
  const int64_t per_vector = bytes / element;
  VectorRowCopyArgs a{};
  a.src = src_first;
  a.dst = dst_first;
  a.vector_bytes = bytes;
  a.row_vectors = c.sizes.back() / per_vector;
  a.outer_rank = static_cast<int64_t>(rank) - 1;
  int64_t rows = 1, src_last = a.row_vectors, dst_last = a.row_vectors;  // past the last vectors
  for (size_t d = 0; d + 1 < rank; ++d) {
    a.sizes[d] = c.sizes[d];
    a.src_pitches[d] = c.src_strides[d] / per_vector;
    a.dst_pitches[d] = c.dst_strides[d] / per_vector;
    rows *= c.sizes[d];
    src_last += (c.sizes[d] - 1) * a.src_pitches[d];
    dst_last += (c.sizes[d] - 1) * a.dst_pitches[d];
  }
  a.vectors = rows * a.row_vectors;
  a.narrow = a.vectors < kNarrow && src_last < kNarrow && dst_last < kNarrow;
  const int device = dst.device().index;
  launch(copy_function(device, "kiln_vector_rows"), grid_for(a.vectors, device), kBlock, &a,
         sizeof a, stream);
  return true;
}

// Rows long enough that a block per 8 x 256 elements of a row keeps its threads busy.
constexpr int64_t kRowCopyMinCols = 256;

// The copy as rows (kiln_row_copy) when both sides are rows of one dtype; false otherwise.
bool launch_row_copy(const RtTensor& dst, const RtTensor& src, const CopyDims& c, Stream stream) {
  const size_t rank = c.sizes.size();
  if (src.dtype() != dst.dtype() || rank == 0 || rank > 2 || c.src_strides.back() != 1 ||
      c.dst_strides.back() != 1 || c.sizes.back() < kRowCopyMinCols)
    return false;
  RowCopyArgs a{};
  a.src = src.storage->device_data;
  a.dst = dst.storage->device_data;
  a.rows = rank == 2 ? c.sizes[0] : 1;
  a.cols = c.sizes.back();
  a.src_pitch = rank == 2 ? c.src_strides[0] : 0;
  a.dst_pitch = rank == 2 ? c.dst_strides[0] : 0;
  a.src_offset = src.offset;
  a.dst_offset = dst.offset;
  a.element_bytes = dtype_size(src.dtype());
  const int64_t per_block = int64_t{kBlock} * 8;
  const auto x = static_cast<unsigned>((a.cols + per_block - 1) / per_block);
  const auto y = static_cast<unsigned>(std::min<int64_t>(a.rows, 65535));
  const int device = dst.device().index;
  launch_2d(copy_function(device, "kiln_row_copy"), x, y, kBlock, &a, sizeof a, stream);
  return true;
}

// Launches the copy of src's elements (broadcast to dst's shape) into dst's.
void launch_copy(const RtTensor& dst, const RtTensor& src, Stream stream) {
  int64_t numel = dst.numel();
  if (numel == 0) return;
  const CopyDims c = collapsed(dst.sizes, broadcast_strides(src, dst.sizes), dst.strides);
  if (launch_vector_rows(dst, src, c, stream) || launch_row_copy(dst, src, c, stream)) return;
  KILN_ASSERT(c.sizes.size() <= kMaxCopyRank) << "a copy of a tensor of rank " << dst.rank();
  CopyArgs a{};
  a.src = src.storage->device_data;
  a.dst = dst.storage->device_data;
  a.numel = numel;
  a.rank = static_cast<int64_t>(c.sizes.size());
  a.src_dtype = static_cast<int64_t>(src.dtype());
  a.dst_dtype = static_cast<int64_t>(dst.dtype());
  a.src_offset = src.offset;
  a.dst_offset = dst.offset;
  int64_t src_last = src.offset, dst_last = dst.offset;  // the largest index each side reaches
  for (size_t d = 0; d < c.sizes.size(); ++d) {
    a.sizes[d] = c.sizes[d];
    a.src_strides[d] = c.src_strides[d];
    a.dst_strides[d] = c.dst_strides[d];
    src_last += (c.sizes[d] - 1) * c.src_strides[d];
    dst_last += (c.sizes[d] - 1) * c.dst_strides[d];
  }
  a.narrow = numel < kNarrow && src_last < kNarrow && dst_last < kNarrow;
  int device = dst.device().index;
  launch(copy_function(device, "kiln_strided_copy"), grid_for(numel, device), kBlock, &a, sizeof a,
         stream);
}

}  // namespace

void cuda_copy_into(RtTensor& dst, const RtTensor& src, Stream stream) {
  if (&dst == &src) return;
  if (dst.storage == src.storage && dst.offset == src.offset && dst.strides == src.strides &&
      dst.sizes == src.sizes)
    return;  // copy_impl's "views of the same data" exit
  KILN_ASSERT(dst.storage->on_device() && src.storage->on_device() && dst.device() == src.device())
      << "cuda_copy_into between devices";
  check_no_internal_overlap(dst);
  check_no_partial_overlap(dst, src);
  if (dst.storage == src.storage) {
    // The source is read whole before anything is written.
    TensorHandle staged = cuda_clone(src, stream);
    launch_copy(dst, *staged, stream);
    return;
  }
  launch_copy(dst, src, stream);
}

void cuda_copy_elements(RtTensor& dst, const RtTensor& src, Stream stream) {
  launch_copy(dst, src, stream);
}

void cuda_copy_single_elements(std::span<const ElementCopy> copies, int device, Stream stream) {
  for (size_t from = 0; from < copies.size(); from += kMaxElementCopies) {
    ElementCopyArgs a{};
    a.count = static_cast<int64_t>(std::min<size_t>(copies.size() - from, kMaxElementCopies));
    for (int64_t i = 0; i < a.count; ++i) {
      const ElementCopy& c = copies[from + static_cast<size_t>(i)];
      KILN_ASSERT(c.bytes == 1 || c.bytes == 2 || c.bytes == 4 || c.bytes == 8)
          << "an element copy of " << c.bytes << " bytes";
      a.src[i] = c.src;
      a.dst[i] = c.dst;
      a.bytes[i] = c.bytes;
    }
    launch(copy_function(device, "kiln_element_copies"), 1, kBlock, &a, sizeof a, stream);
  }
}

TensorHandle cuda_clone(const RtTensor& t, Stream stream, Allocator* allocator) {
  TensorHandle out = cuda_strided(t.dtype(), t.sizes, contiguous_strides(t.sizes), 0, t.numel(),
                                  t.device(), false, allocator, stream);
  launch_copy(*out, t, stream);
  return out;
}

}  // namespace kiln::cuda
