// Scatter nests: an index write stored in place visits only the positions it writes.
// Part of the kernel emitter (kernel_emitter.h).
//
// A region whose one output is `index_copy(self, dim, index, source)`, written back into the
// tensor `self` was read from (a KV cache's `cache.index_copy_(2, pos, k)`), changes only the
// slices the index names. Lowered as a gather, each output element scans the index for its own
// coordinate, and the kernel reads and writes the whole cache to change one position (a decode
// step's 16 x 256 x 128 cache for one token, bench/NOTES.md). The scatter nest runs over the
// source instead, with the indexed dim taken out and the index's positions walked in order
// inside an iteration, and stores each source slice at its position:
//   t1 = index_copy(c, 2, pos, k), c [1, 16, 256, 128], k [1, 16, 1, 128], pos [1]
//   -> for (i1 < 16) for (i3 < 128) for (ik < 1) { ix = pos[ik]; st(out0, [0, i1, ix, i3],
//                                                      k[0, i1, ik, i3]); }
// The positions are walked in order in one iteration, so a repeated position keeps the last
// slice, as the gather does.
//
// The elements it does not store must hold self's values: the output's KernelOutput::base names
// self's input, and the executor either runs the kernel on self's own memory (the writeback
// stored in place) or fills the output from self first (store_in_caller.h: base_fill).
#include "kiln/codegen/kernel_emitter.h"

namespace kiln::codegen::detail {

// Whether the region is one index write that fits a scatter nest (see the file's comment), and
// its parts: the only output an index_copy of a region input read by nothing else, written back
// into that input's tensor, with fewer than half of the dim's positions written (more, and the
// gather over the whole output does about the same work in one pass that needs no fill).
std::optional<ScatterStore> KernelEmitter::scatter_store() const {
  if (body_.outputs().size() != 1 || step_.outputs.size() != 1) return std::nullopt;
  const Value* out = body_.outputs()[0];
  const Node* write = out->producer();
  if (!write || write->id() != OpId::kIndexCopy) return std::nullopt;
  const Value* self = write->input(0);
  const Value* index = write->input(2);
  const Value* source = write->input(3);
  auto base = input_index_.find(self);
  if (base == input_index_.end()) return std::nullopt;
  const TensorType& st = self->tensor_type();
  if (st.rank() == 0 || source->tensor_type().rank() != st.rank()) return std::nullopt;
  const auto dim = static_cast<size_t>(wrap_dim(write->arg(1).as_int(), st.rank()));
  const int64_t count = index->tensor_type().numel();
  if (count == 0 || count * 2 > st.shape[dim] || st.numel() == 0) return std::nullopt;
  // Nothing else reads self (its old elements would be gone from an in-place output) or the
  // write's result (it is computed nowhere but in the stores).
  for (const auto& n : body_.nodes()) {
    bool other_use = false;
    n->for_each_value_operand([&](const Value* v) {
      other_use = other_use || v == out || (v == self && n.get() != write);
    });
    if (other_use) return std::nullopt;
  }
  const bool written_into_self =
      std::any_of(step_.writebacks.begin(), step_.writebacks.end(), [&](const Step::Writeback& wb) {
        return wb.value == step_.outputs[0] && wb.target == step_.inputs.at(base->second) &&
               wb.window.empty();
      });
  if (!written_into_self) return std::nullopt;
  Shape nest = st.shape;
  nest[dim] = 1;
  return ScatterStore{write, dim, base->second, nest};
}

// The scatter nest's body: the index's positions walked in order at the innermost level, each
// storing its source slice's element; no stores after the body.
NestBody KernelEmitter::emit_scatter_body(const ScatterStore& scatter, Kernel& k, NestMode mode) {
  const Node& write = *scatter.write;
  const Value* index = write.input(2);
  const Value* source = write.input(3);
  const int64_t size = write.input(0)->tensor_type().shape[scatter.dim];
  const int64_t count = index->tensor_type().numel();
  const DType out = k.outputs[0].dtype;
  begin_body(scatter.nest, k, mode, nullptr);
  nest_is_last_ = true;
  k.outputs[0].in_last_nest = true;
  k.outputs[0].base = static_cast<int>(scatter.base);
  check_index_values(write, index, size, scatter.dim);
  const Index at = loop_index(scatter.nest);
  const int depth = static_cast<int>(scatter.nest.size());
  const std::string pk = fresh("ik");
  const int level = static_cast<int>(levels_.size());
  levels_.emplace_back();
  level_of_[pk] = level;
  const IndexExpr kx = IndexExpr::bounded(pk, 0, count - 1);
  Index from = at;
  from[scatter.dim] = kx;
  Index to = at;
  to[scatter.dim] =
      clamped_position(eval(index, index->tensor_type().rank() == 0 ? Index{} : Index{kx}), size);
  Val v = eval(source, from);
  emit(level, "st_" + suffix(out) + "(out0, " + output_address(0, to).text + ", " +
                  copy_convert(v, out) + ");");
  std::string walk = close_level(level);
  emit(depth,
       "for (int64_t " + pk + " = 0; " + pk + " < " + std::to_string(count) + "; ++" + pk + ") {");
  levels_.at(static_cast<size_t>(depth)) += indented(walk, 1);
  emit(depth, "}");
  return NestBody{levels_, "", "", column_block_text(false), ""};
}

// What the executor may assume of the inputs' loads: none is at the element an iteration
// stores (the stores land at the index's positions), so an input sharing memory with the
// output is stored into in place only where it is disjoint from it (store_in_caller.cpp).
void KernelEmitter::record_scatter_loads(const Shape& nest, Kernel& k) {
  record_last_nest_loads(nest, k);
  for (KernelInput& in : k.inputs)
    if (in.last_nest_loads != KernelInput::Loads::kNone)
      in.last_nest_loads = KernelInput::Loads::kOther;
}

std::string KernelEmitter::scatter_schedule(const ScatterStore& scatter) const {
  const int64_t count = scatter.write->input(2)->tensor_type().numel();
  return "scatter of " + scatter.write->op->name + "'s source along dim " +
         std::to_string(scatter.dim) + ", " + std::to_string(count) +
         (count == 1 ? " position" : " positions") + " in order";
}

std::string KernelEmitter::cpu_scatter_nest(const ScatterStore& scatter, Kernel& k) {
  NestBody body = emit_scatter_body(scatter, k, NestMode::kCpuLoops);
  record_scatter_loads(scatter.nest, k);
  // Each iteration stores one element per position: the threads share the iterations when the
  // stores are many (the positions stay in order inside an iteration, for repeated ones).
  const int64_t stores = shape_numel(scatter.nest) * scatter.write->input(2)->tensor_type().numel();
  return "  {  // last nest over " + shape_str(scatter.nest) +
         " (schedule: " + scatter_schedule(scatter) + ")\n" + indented(body.levels[0], 2) +
         cpu_loops(scatter.nest, body, TeamWork::of_nest(stores)) + "  }\n";
}

std::string KernelEmitter::cuda_scatter_nest(const ScatterStore& scatter, Kernel& k,
                                             std::string* entries) {
  NestBody body = emit_scatter_body(scatter, k, NestMode::kFlat);
  record_scatter_loads(scatter.nest, k);
  KernelNest nest;
  nest.shape = scatter.nest;
  nest.numel = shape_numel(scatter.nest);
  const std::string name = "nest0";
  std::string src = "// schedule: " + scatter_schedule(scatter) + "\n";
  src += "template <class I>\n__device__ __forceinline__ void " + name +
         "_scalar(const Args& a) {\n" + cuda_decls(k);
  src += "  const I n = static_cast<I>(" + std::to_string(nest.numel) + "LL);\n";
  src += "  const I step = static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);\n";
  src +=
      "  for (I lin = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + "
      "static_cast<I>(threadIdx.x); lin < n; lin += step) {\n";
  src += decompose(scatter.nest, "    ") + indented(body.flat(), 2) + "  }\n}\n";
  *entries += cuda_entries(0, 's', kCudaBlock, name + "_scalar");
  k.nests.push_back(std::move(nest));
  return src;
}

}  // namespace kiln::codegen::detail
