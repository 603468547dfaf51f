// CPU nests in tiles, for an operand read transposed.
// Part of the kernel emitter (kernel_emitter.h).
#include "kiln/codegen/kernel_emitter.h"

namespace kiln::codegen::detail {

// Whether a CPU nest without reductions runs its last two dims in tiles (cpu_tiled_loops): an
// input is read transposed (its index's last entry is not the nest's last loop variable, which
// indexes another dim: y.t() in x.add_(y.t())), both dims hold a few tiles, and the code between
// the two loops has no loop of its own.
bool KernelEmitter::tiles_fit(const Shape& shape, const NestBody& body) const {
  const size_t n = shape.size();
  if (n < 2 || shape[n - 1] < 2 * kCpuTile || shape[n - 2] < 2 * kCpuTile) return false;
  if (body.levels[n - 1].find("for (") != std::string::npos) return false;
  for (const std::set<std::string>& keys : loads_)
    for (const std::string& key : keys)
      if (read_transposed(key, n)) return true;
  return false;
}

// A CPU nest's loops with its last two dims in tiles of kCpuTile x kCpuTile, for an input read
// transposed: a row of the nest reads down a column of it, one element a cache line and a page
// every few elements (x.add_(y.t()) of 2048 x 2048 floats took 12.3 ms on 2 cores, as eager
// did); a tile's columns stay in L1 while its rows are stored.
//   omp parallel for collapse(2)
//   for (t0 = 0; t0 < 2048; t0 += 16) for (t1 = 0; t1 < 2048; t1 += 16)
//     for (i0 = t0; i0 < min(t0 + 16, 2048); ++i0) for (i1 = t1; ...) { ... }
std::string KernelEmitter::cpu_tiled_loops(const Shape& shape, const NestBody& body,
                                           const TeamWork& work) const {
  const size_t n = shape.size();
  bool outer_code = false;  // code between the outer loops: the tile loops cannot collapse
  for (size_t d = 1; d + 1 < n; ++d)
    outer_code = outer_code || !body.levels[d].empty();
  std::string out;
  if (parallel_worth(work.iterations))
    out += (outer_code ? "#pragma omp parallel for"
                       : "#pragma omp parallel for collapse(" + std::to_string(n) + ")") +
           team_clause(work) + "\n";
  size_t depth = 0;
  auto open = [&](const std::string& line, const std::string& code) {
    out += std::string(2 + 2 * depth, ' ') + "  " + line + "\n";
    ++depth;
    out += indented(code, static_cast<int>(depth) + 2);
  };
  for (size_t d = 0; d + 2 < n; ++d) {
    std::string i = "i" + std::to_string(d);
    open("for (int64_t " + i + " = 0; " + i + " < " + extent_text(shape, d) + "; ++" + i + ") {",
         body.levels[d + 1]);
  }
  const std::string tile = std::to_string(kCpuTile);
  for (size_t d = n - 2; d < n; ++d) {
    std::string t = "t" + std::to_string(d);
    open("for (int64_t " + t + " = 0; " + t + " < " + extent_text(shape, d) + "; " + t +
             " += " + tile + ") {",
         "");
  }
  for (size_t d = n - 2; d < n; ++d) {
    std::string i = "i" + std::to_string(d), t = "t" + std::to_string(d);
    std::string size = extent_text(shape, d);
    open("for (int64_t " + i + " = " + t + "; " + i + " < (" + t + " + " + tile + " < " + size +
             " ? " + t + " + " + tile + " : " + size + "); ++" + i + ") {",
         body.levels[d + 1]);
  }
  out += indented(body.stores, static_cast<int>(depth) + 2);
  while (depth-- > 0)
    out += std::string(2 + 2 * depth, ' ') + "  }\n";
  return out;
}

}  // namespace kiln::codegen::detail
