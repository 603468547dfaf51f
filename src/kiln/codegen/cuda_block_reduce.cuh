// Reductions over a CUDA thread block, for the row nests of generated CUDA kernels (embedded
// after shared_prelude.h, whose red_<op> they combine with).

namespace kiln::kernel {

// A value combined over the thread block of `Threads` threads (every thread passes its partial
// result and gets the block's): within each warp by shuffles, then across the warps through
// shared memory. The block's size is a constant so that the loop over the warps unrolls (a loop
// over blockDim.x / 32 warps cost the normalization of bf16 rows of 1024 about 40 instructions a
// row). Every thread of the block must call it; calls may follow each other (the first barrier
// keeps a call from overwriting what the previous one's threads still read).
#define KILN_BLOCK_REDUCE(op)                                                             \
  template <int Threads, class T>                                                         \
  inline T block_##op(T v) {                                                              \
    static_assert(Threads % 32 == 0 && Threads <= 1024, "whole warps");                   \
    __shared__ T partial[Threads / 32];                                                   \
    for (int offset = 16; offset > 0; offset >>= 1)                                       \
      v = red_##op(v, static_cast<T>(__shfl_xor_sync(0xffffffffu, v, offset)));           \
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;                           \
    __syncthreads();                                                                      \
    if (lane == 0) partial[warp] = v;                                                     \
    __syncthreads();                                                                      \
    v = partial[0];                                                                       \
    _Pragma("unroll") for (int w = 1; w < Threads / 32; ++w) v = red_##op(v, partial[w]); \
    return v;                                                                             \
  }
KILN_BLOCK_REDUCE(sum)
KILN_BLOCK_REDUCE(prod)
KILN_BLOCK_REDUCE(max)
KILN_BLOCK_REDUCE(min)
#undef KILN_BLOCK_REDUCE

// A value combined over the warp (a row nest with a warp per row): every lane passes its partial
// result and gets the warp's. Every lane of the warp must call it.
#define KILN_WARP_REDUCE(op)                                                    \
  template <class T>                                                            \
  inline T warp_##op(T v) {                                                     \
    for (int offset = 16; offset > 0; offset >>= 1)                             \
      v = red_##op(v, static_cast<T>(__shfl_xor_sync(0xffffffffu, v, offset))); \
    return v;                                                                   \
  }
KILN_WARP_REDUCE(sum)
KILN_WARP_REDUCE(prod)
KILN_WARP_REDUCE(max)
KILN_WARP_REDUCE(min)
#undef KILN_WARP_REDUCE

// A value combined over the `Lanes` threads of each element of a column nest's tile (a block of
// Tile x Lanes threads, thread lane * Tile + column): every thread passes its partial result and
// gets its element's, by a tree over the lanes in shared memory (the lanes of an element are
// Tile threads apart, not in one warp). Every thread of the block must call it; calls may follow
// each other (the first barrier keeps a call from overwriting what the previous one still reads).
#define KILN_COLUMN_REDUCE(op)                                                               \
  template <int Tile, int Lanes, class T>                                                    \
  inline T column_##op(T v) {                                                                \
    static_assert(Tile * Lanes <= 1024 && (Lanes & (Lanes - 1)) == 0, "a power of 2 lanes"); \
    __shared__ T partial[Tile * Lanes];                                                      \
    const int t = threadIdx.x;                                                               \
    __syncthreads();                                                                         \
    partial[t] = v;                                                                          \
    __syncthreads();                                                                         \
    _Pragma("unroll") for (int half = Lanes / 2; half > 0; half >>= 1) {                     \
      if (t < half * Tile) partial[t] = red_##op(partial[t], partial[t + half * Tile]);      \
      __syncthreads();                                                                       \
    }                                                                                        \
    return partial[t % Tile];                                                                \
  }
KILN_COLUMN_REDUCE(sum)
KILN_COLUMN_REDUCE(prod)
KILN_COLUMN_REDUCE(max)
KILN_COLUMN_REDUCE(min)
#undef KILN_COLUMN_REDUCE

}  // namespace kiln::kernel
