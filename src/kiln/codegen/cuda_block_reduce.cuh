// Reductions over a CUDA thread block, for the row nests of generated CUDA kernels (embedded
// after shared_prelude.h, whose red_<op> they combine with).

namespace kiln::kernel {

// A value combined over the thread block of `Threads` threads (every thread passes its partial
// result and gets the block's): within each warp by shuffles, then across the warps through
// shared memory. The block's size is a constant so that the loop over the warps unrolls (a loop
// over blockDim.x / 32 warps cost the normalization of bf16 rows of 1024 about 40 instructions a
// row). Every thread of the block must call it; calls may follow each other (the first barrier
// keeps a call from overwriting what the previous one's threads still read).
#define KILN_BLOCK_REDUCE(op)                                                   \
  template <int Threads, class T>                                               \
  inline T block_##op(T v) {                                                    \
    static_assert(Threads % 32 == 0 && Threads <= 1024, "whole warps");         \
    __shared__ T partial[Threads / 32];                                         \
    for (int offset = 16; offset > 0; offset >>= 1)                             \
      v = red_##op(v, static_cast<T>(__shfl_xor_sync(0xffffffffu, v, offset))); \
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;                 \
    __syncthreads();                                                            \
    if (lane == 0) partial[warp] = v;                                           \
    __syncthreads();                                                            \
    v = partial[0];                                                             \
    _Pragma("unroll") for (int w = 1; w < Threads / 32; ++w)                    \
      v = red_##op(v, partial[w]);                                              \
    return v;                                                                   \
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

}  // namespace kiln::kernel
