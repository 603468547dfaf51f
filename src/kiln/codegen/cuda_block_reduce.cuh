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

// A value combined over each group of `Width` lanes of the warp (a row nest with a warp per row,
// or rows packed several to a warp): every lane passes its partial result and gets its group's.
// Every lane of the warp must call it.
#define KILN_WARP_REDUCE(op)                                                     \
  template <int Width = 32, class T>                                             \
  inline T warp_##op(T v) {                                                      \
    _Pragma("unroll") for (int offset = Width / 2; offset > 0; offset >>= 1) v = \
        red_##op(v, static_cast<T>(__shfl_xor_sync(0xffffffffu, v, offset)));    \
    return v;                                                                    \
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

// The grid barrier of a split row nest (KernelNest::split_rows), over the workspace's first two
// words: a count of the blocks arrived and a generation. The last block to arrive resets the
// count and moves the generation on; the others wait for it to move. Every block of the grid
// must call it, and the grid is launched cooperatively (all its blocks resident, or the launch
// fails), so no block waits for one that cannot run. The count is back at 0 after each barrier;
// the executor zeroes both words before the launch. A block's writes before the barrier are
// seen by every block after it (the fences around the arrival).
inline void grid_barrier(unsigned int* words) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned int* generation = words + 1;
    const unsigned int seen = *generation;  // before arriving: it cannot move until we do
    __threadfence();
    if (atomicAdd(words, 1u) == gridDim.x - 1) {
      atomicExch(words, 0u);
      __threadfence();
      atomicAdd(words + 1, 1u);
    } else {
      while (*generation == seen)
        __nanosleep(32);
    }
    __threadfence();
  }
  __syncthreads();
}

// A value combined over the blocks of one row of a split row nest: the block combines its
// threads' partial results, its first thread writes the block's into the row's slot `part` of
// combine `combine` (8 bytes a slot, after the barrier's 64 bytes), and after the grid barrier
// every block combines the row's `split` slots in the same order, so every block of the row
// gets the same value. Every thread of every block must call it.
#define KILN_GRID_REDUCE(op, first)                                                           \
  template <int Threads, class T, class I>                                                    \
  inline T grid_##op(T v, char* ws, int combine, I rows, I split, I row, I part) {            \
    v = block_##op<Threads>(v);                                                               \
    char* const slots = ws + 64 + 8 * ((static_cast<int64_t>(combine) * rows + row) * split); \
    auto slot = [&](I p) { return reinterpret_cast<volatile T*>(slots + 8 * p); };            \
    if (threadIdx.x == 0) *slot(part) = v;                                                    \
    grid_barrier(reinterpret_cast<unsigned int*>(ws));                                        \
    T r = first;                                                                              \
    for (I p = static_cast<I>(threadIdx.x); p < split; p += Threads)                          \
      r = red_##op(r, static_cast<T>(*slot(p)));                                              \
    return block_##op<Threads>(r);                                                            \
  }
KILN_GRID_REDUCE(sum, static_cast<T>(0))
KILN_GRID_REDUCE(prod, static_cast<T>(1))
KILN_GRID_REDUCE(max, static_cast<T>(*slot(0)))
KILN_GRID_REDUCE(min, static_cast<T>(*slot(0)))
#undef KILN_GRID_REDUCE

// A column nest's values combined over the blocks of one tile (a column nest split across
// blocks): the block combines its lanes (column_<op>), the first lane of each column writes the
// block's value into slot (part, column) of the tile's slots of combine `combine` (8 bytes a
// slot, after the barrier's 64 bytes), and after the grid barrier the lanes combine each
// column's `split` slots, each lane every Lanes-th part, then the lanes theirs: every block of
// the tile gets the same values. Every thread of every block must call it.
#define KILN_GRID_COLUMN_REDUCE(op, first)                                                  \
  template <int Tile, int Lanes, class T, class I>                                          \
  inline T grid_column_##op(T v, char* ws, int combine, I tiles, I split, I tile, I part) { \
    v = column_##op<Tile, Lanes>(v);                                                        \
    char* const slots =                                                                     \
        ws + 64 + 8 * ((static_cast<int64_t>(combine) * tiles + tile) * split * Tile);      \
    const int column = static_cast<int>(threadIdx.x) % Tile;                                \
    auto slot = [&](I p) {                                                                  \
      return reinterpret_cast<volatile T*>(slots + 8 * (p * Tile + column));                \
    };                                                                                      \
    if (static_cast<int>(threadIdx.x) < Tile) *slot(part) = v;                              \
    grid_barrier(reinterpret_cast<unsigned int*>(ws));                                      \
    T r = first;                                                                            \
    for (I p = static_cast<I>(threadIdx.x) / Tile; p < split; p += Lanes)                   \
      r = red_##op(r, static_cast<T>(*slot(p)));                                            \
    return column_##op<Tile, Lanes>(r);                                                     \
  }
KILN_GRID_COLUMN_REDUCE(sum, static_cast<T>(0))
KILN_GRID_COLUMN_REDUCE(prod, static_cast<T>(1))
KILN_GRID_COLUMN_REDUCE(max, static_cast<T>(*slot(0)))
KILN_GRID_COLUMN_REDUCE(min, static_cast<T>(*slot(0)))
#undef KILN_GRID_COLUMN_REDUCE

}  // namespace kiln::kernel
