// Reductions over a CUDA thread block, for the row nests of generated CUDA kernels (embedded
// after shared_prelude.h, whose red_<op> they combine with).

namespace kiln::kernel {

// A value combined over the thread block (every thread passes its partial result and gets the
// block's): within each warp by shuffles, then across the warps through shared memory. Every
// thread of the block must call it; calls may follow each other (the first barrier keeps a call
// from overwriting what the previous one's threads still read).
#define KILN_BLOCK_REDUCE(op)                                                   \
  template <class T>                                                            \
  inline T block_##op(T v) {                                                    \
    __shared__ T partial[32];                                                   \
    for (int offset = 16; offset > 0; offset >>= 1)                             \
      v = red_##op(v, static_cast<T>(__shfl_xor_sync(0xffffffffu, v, offset))); \
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;                 \
    const int warps = (blockDim.x + 31) >> 5;                                   \
    __syncthreads();                                                            \
    if (lane == 0) partial[warp] = v;                                           \
    __syncthreads();                                                            \
    v = partial[0];                                                             \
    for (int w = 1; w < warps; ++w)                                             \
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
